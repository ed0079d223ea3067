//! The VM's own root: after the masks, the launcher `pivot_root`s the VM's
//! mount namespace into a fresh tmpfs that holds only what the hypervisor
//! and its helpers are granted, each bound from the host at its own path,
//! as the jailer's chroot does for firecracker. What they are granted is
//! read from the one list there is: the paths of their Landlock rules
//! (`launch::landlock`, each helper's [`Helper::root_rules`]), bound
//! read-only unless the rule grants writing.
//!
//! Why: Landlock does not mediate `connect(2)` to a socket's path, so in
//! the host's file system tree a compromised hypervisor or helper could
//! connect to every world-connectable Unix socket of the host (the D-Bus
//! system bus, nscd, journald's native socket). In this root there is no
//! host socket to name. Abstract sockets are outside any file system: each
//! domain of the VM's scopes them (`Scope::AbstractUnixSocket`, Landlock
//! ABI 6, see `launch::landlock::apply`).
//!
//! The launcher itself logs to journald's socket by its path until its
//! `execve`: that path, in this root, is a symlink to `/proc/self/fd/N`,
//! an `O_PATH` descriptor of the host's socket that the launcher holds and
//! its `execve` closes (connecting through it reaches the socket it was
//! opened on). In the hypervisor, and in every helper (which keep only the
//! descriptors they are handed), the link dangles.
//!
//! The mounts: one tmpfs (stacked over the masked runtime root, its mount
//! point), one bind per path of the list that no other path of it already
//! holds, one remount each (read-only, `nosuid`, and `nodev` but for a
//! device node), the tmpfs remounted read-only, `pivot_root`, the old root
//! detached.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::mount::MsFlags;
use nix::sys::stat::{Mode, SFlag};

use crate::config::spec::Spec;
use crate::host::mountinfo;
use crate::host::sys::SysContext;
use crate::identity::principal::Principal;
use crate::launch::helpers::Helper;
use crate::launch::landlock::{self, Grant, Rule};
use crate::launch::sandbox::{self, SandboxError};
use crate::launch::syscall::Syscall;

type Result<T, E = SandboxError> = std::result::Result<T, E>;

/// journald's native socket, which the launcher's log lines go to.
pub const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

/// Symlinks followed while one path is resolved before `ELOOP`.
const MAX_LINKS: usize = 40;

/// One path the VM's root holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    /// Its path on the host, with no symlink on the way.
    pub path: PathBuf,
    /// Bound read-write (a rule grants writing, or sockets).
    pub write: bool,
}

/// What the VM's root holds: the host paths to bind (parents first, none
/// inside another of them that already grants as much) and the symlinks on
/// the way to them (location, target), as the host has them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Plan {
    pub binds: Vec<Need>,
    pub links: Vec<(PathBuf, PathBuf)>,
    /// Empty directories, where the launch mounts later (the credential
    /// tmpfs).
    pub mount_points: Vec<PathBuf>,
}

/// Every Landlock rule of the VM: the hypervisor's
/// ([`landlock::policy`]) and each of its `helpers`' ([`Helper::root_rules`]);
/// `vm_trees` are the state and control dirs.
pub fn rules(spec: &Spec, helpers: &[Helper], vm_trees: &[PathBuf; 2], creds: &Path) -> Vec<Rule> {
    let [state, control] = vm_trees;
    let mut rules = landlock::policy(spec, state, control, creds).rules;
    for h in helpers {
        rules.extend(h.root_rules(control, vm_trees));
    }
    rules
}

/// The plan for `rules` (every Landlock rule of the hypervisor and its
/// helpers); a rule on one of `mount_points` makes an empty directory
/// there instead of a bind. `/proc` is not bound (a private procfs is mounted there at
/// `proc`); a rule path inside one of `own` (the VM's own trees, which the
/// principal can write and so plant symlinks in) is never resolved: the
/// tree's own rule binds it whole. A path the host lacks is left out (a
/// built-in one is optional; a spec path is refused by Landlock, naming
/// its field).
pub fn plan(rules: &[Rule], own: &[PathBuf], mount_points: &[PathBuf]) -> Plan {
    let mut wanted: Vec<Need> = Vec::new();
    let mut links: Vec<(PathBuf, PathBuf)> = Vec::new();
    for r in rules {
        if r.path == Path::new("/proc") || mount_points.contains(&r.path) {
            continue;
        }
        let write = matches!(r.grant, Grant::Write | Grant::Socket | Grant::Lock);
        let inside_own = own.iter().any(|t| r.path.starts_with(t) && r.path != *t);
        let real = if inside_own || own.contains(&r.path) {
            Some(r.path.clone())
        } else {
            resolve(&r.path, &mut links)
        };
        if let Some(path) = real {
            match wanted.iter_mut().find(|n| n.path == path) {
                Some(n) => n.write |= write,
                None => wanted.push(Need { path, write }),
            }
        }
    }
    // Parents first: a path's components sort before its children's.
    wanted.sort_by(|a, b| a.path.cmp(&b.path));
    let mut binds: Vec<Need> = Vec::new();
    for n in wanted {
        let held = binds
            .iter()
            .any(|b| n.path.starts_with(&b.path) && (b.write || !n.write));
        if !held {
            binds.push(n);
        }
    }
    links.retain(|(at, _)| !binds.iter().any(|b| at.starts_with(&b.path)));
    links.sort();
    links.dedup();
    Plan {
        binds,
        links,
        mount_points: mount_points.to_vec(),
    }
}

/// Resolve `path` on the host component by component, as the kernel would,
/// recording every symlink met (its location, with no symlink before it,
/// and its target); the real path, or `None` when the host lacks it.
fn resolve(path: &Path, links: &mut Vec<(PathBuf, PathBuf)>) -> Option<PathBuf> {
    let mut cur = PathBuf::from("/");
    let mut hops = 0;
    // Pending components, last first; a symlink's target's go on top.
    let mut pending: Vec<std::ffi::OsString> = path
        .components()
        .rev()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect();
    while let Some(name) = pending.pop() {
        if name == ".." {
            cur.pop();
            continue;
        }
        let next = cur.join(&name);
        let md = std::fs::symlink_metadata(&next).ok()?;
        if md.file_type().is_symlink() {
            hops += 1;
            if hops > MAX_LINKS {
                return None;
            }
            let target = std::fs::read_link(&next).ok()?;
            links.push((next, target.clone()));
            if target.is_absolute() {
                cur = PathBuf::from("/");
            }
            for c in target.components().rev() {
                match c {
                    Component::Normal(n) => pending.push(n.to_os_string()),
                    Component::ParentDir => pending.push("..".into()),
                    _ => {}
                }
            }
        } else {
            cur = next;
        }
    }
    Some(cur)
}

/// An `O_PATH` descriptor of journald's socket (close-on-exec), when the
/// host has one: what the launcher's log lines reach it through once the
/// VM's root is entered.
pub fn open_journal() -> Option<OwnedFd> {
    nix::fcntl::open(
        JOURNAL_SOCKET,
        OFlag::O_PATH | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .ok()
}

/// What [`enter`] binds: each of the plan's paths, opened `O_PATH`, and
/// its file type.
pub type Sources = Vec<(OwnedFd, SFlag)>;

/// The plan's paths opened to be bound: before the tmpfs hides what is
/// under the runtime root (the VM's runtime dir is), and with the
/// principal's file-system ids (see [`as_principal`]).
pub fn open_sources(plan: &Plan) -> Result<Sources> {
    let mut sources = Vec::with_capacity(plan.binds.len());
    for n in &plan.binds {
        let fd = nix::fcntl::open(
            &n.path,
            OFlag::O_PATH | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
            Mode::empty(),
        )
        .sys("open to bind into the VM's root", &n.path)?;
        let st = nix::sys::stat::fstat(&fd).sys("fstat", &n.path)?;
        let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
        sources.push((fd, kind));
    }
    Ok(sources)
}

/// Run `f` (the plan and [`open_sources`]) with the principal's
/// file-system uid and gid and the hypervisor's supplementary groups, then
/// root's back. Root binds a path at its own place in the VM's root, whose
/// directories everyone may search: resolved and opened with root's
/// rights, a path the principal could not reach on the host (a symlink of
/// its own, in a directory of its own where a disk may be, leading into a
/// directory only root may search) would be bound for it to open. With the
/// principal's ids the walk stops where the principal's own would. A
/// no-op when the launcher already runs as the principal's uid (the unit
/// tests). One thread: `setfsuid` is the thread's, `setgroups` the
/// process's.
pub fn as_principal<T>(p: &Principal, f: impl FnOnce() -> T) -> Result<T> {
    use nix::unistd::{getgroups, setfsgid, setfsuid, setgroups, Gid, Uid};
    let at = Path::new("/proc/self/status");
    if nix::unistd::geteuid().as_raw() == p.uid {
        return Ok(f());
    }
    let (uid, gid) = (Uid::from_raw(p.uid), Gid::from_raw(p.gid));
    let root_groups = getgroups().sys("getgroups", at)?;
    let groups: Vec<Gid> = p.groups.iter().map(|g| Gid::from_raw(*g)).collect();
    setgroups(&groups).sys("setgroups to the principal's", at)?;
    // setfsgid and setfsuid return the previous id whether or not they
    // changed it: a second call says what is in force.
    let root_gid = setfsgid(gid);
    let root_uid = setfsuid(uid);
    let switched = setfsgid(gid) == gid && setfsuid(uid) == uid;
    let out = switched.then(f);
    setfsuid(root_uid);
    setfsgid(root_gid);
    let back = setfsuid(root_uid) == root_uid && setfsgid(root_gid) == root_gid;
    setgroups(&root_groups).sys("setgroups back to root's", at)?;
    if !back {
        return Err(Errno::EPERM).sys("setfsuid back to root's", at)?;
    }
    match out {
        Some(out) => Ok(out),
        None => Err(Errno::EPERM).sys("setfsuid to the principal's", at)?,
    }
}

/// The process's umask for as long as it lives, then the one before.
struct UmaskGuard(Mode);

impl UmaskGuard {
    fn set(mask: Mode) -> UmaskGuard {
        UmaskGuard(nix::sys::stat::umask(mask))
    }
}

impl Drop for UmaskGuard {
    fn drop(&mut self) {
        nix::sys::stat::umask(self.0);
    }
}

/// Build the VM's root on a tmpfs mounted at `at` (the masked runtime
/// root: any directory of this namespace would do) from `sources` (the
/// plan's paths, [`open_sources`]) and `pivot_root` into it. `journal`:
/// see [`open_journal`].
pub fn enter(
    sys: &dyn Syscall,
    at: &Path,
    plan: &Plan,
    sources: Sources,
    journal: Option<&OwnedFd>,
) -> Result<()> {
    sys.mount(
        Some(mountinfo::MASK_SOURCE),
        at,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=0755,size=256k,nr_inodes=1024"),
    )
    .sys("mount the VM's root tmpfs", at)?;
    // Every directory made here must be searchable by the principal (the
    // bound trees keep their own modes), whatever umask the launcher
    // inherited: the unit's `UMask=0077` made them root's 0700, so the
    // principal reached nothing below a made directory (`/nix`, `/usr`).
    let _umask = UmaskGuard::set(Mode::from_bits_truncate(0o022));
    let inside = |p: &Path| at.join(p.strip_prefix("/").unwrap_or(p));
    let io = |e: std::io::Error| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO));
    // `/proc` for the VM's procfs; `/tmp`, empty and read-only, where
    // passt mounts the empty root of its own sandbox.
    let made = ["/proc", "/dev", "/tmp"].map(PathBuf::from);
    for d in made.iter().chain(&plan.mount_points) {
        std::fs::create_dir_all(inside(d))
            .map_err(io)
            .sys("mkdir in the VM's root", inside(d))?;
    }
    for (n, (fd, kind)) in plan.binds.iter().zip(sources) {
        let target = inside(&n.path);
        let parent = target.parent().unwrap_or(at);
        std::fs::create_dir_all(parent)
            .map_err(io)
            .sys("mkdir in the VM's root", parent)?;
        if kind == SFlag::S_IFDIR {
            std::fs::create_dir(&target).or_else(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => Ok(()),
                _ => Err(e),
            })
        } else {
            std::fs::File::create(&target).map(drop)
        }
        .map_err(io)
        .sys("make a mount point in the VM's root", &target)?;
        let source = format!("/proc/self/fd/{}", fd.as_raw_fd());
        sys.mount(
            Some(source.as_str()),
            &target,
            None,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None,
        )
        .sys("bind into the VM's root", &n.path)?;
        let device = kind == SFlag::S_IFCHR || kind == SFlag::S_IFBLK;
        remount(sys, &target, !n.write, device)?;
    }
    let mut links: Vec<(PathBuf, PathBuf)> = plan.links.clone();
    if let Some(fd) = journal {
        links.push((
            PathBuf::from(JOURNAL_SOCKET),
            PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())),
        ));
    }
    for (location, target) in &links {
        let here = inside(location);
        if let Some(parent) = here.parent() {
            std::fs::create_dir_all(parent)
                .map_err(io)
                .sys("mkdir in the VM's root", parent)?;
        }
        match std::os::unix::fs::symlink(target, &here) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io(e)).sys("symlink in the VM's root", &here)?,
        }
    }
    sandbox::remount_read_only(sys, at)?;
    sys.pivot_root(at)
        .sys("pivot_root into the VM's root", at)?;
    Ok(())
}

/// Read-only (`ro`) or not, `nosuid`, and `nodev` unless the mount is a
/// device node's, keeping the per-mount flags the kernel states; no call
/// when the bind has them already (it keeps its source mount's: the VM's
/// own directories come from the masks' `nosuid,nodev` binds, devices
/// from a `nosuid` `/dev`). A device node's mount is never made
/// read-only: that changes nothing of what reads and writes it.
fn remount(sys: &dyn Syscall, target: &Path, ro: bool, device: bool) -> Result<()> {
    use nix::sys::statvfs::{statvfs, FsFlags};
    let have = statvfs(target).sys("statvfs", target)?.flags();
    let ro = ro && !device;
    if have.contains(FsFlags::ST_NOSUID)
        && (!ro || have.contains(FsFlags::ST_RDONLY))
        && (device || have.contains(FsFlags::ST_NODEV))
    {
        return Ok(());
    }
    let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_NOSUID;
    if ro || have.contains(FsFlags::ST_RDONLY) {
        flags |= MsFlags::MS_RDONLY;
    }
    if !device {
        flags |= MsFlags::MS_NODEV;
    }
    for (st, ms) in [
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
    ] {
        if have.contains(st) {
            flags |= ms;
        }
    }
    sys.mount(None, target, None, flags, None)
        .sys("remount in the VM's root", target)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(path: &str, grant: Grant) -> Rule {
        Rule {
            path: PathBuf::from(path),
            grant,
            field: None,
        }
    }

    #[test]
    fn the_plan_binds_each_real_path_once_and_keeps_the_symlinks_on_the_way() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("usr/bin")).unwrap();
        std::fs::write(d.join("usr/bin/hv"), "").unwrap();
        std::os::unix::fs::symlink("usr/bin", d.join("bin")).unwrap();
        std::fs::create_dir_all(d.join("state/web")).unwrap();
        // Planted by the VM: never followed.
        std::os::unix::fs::symlink("/etc", d.join("state/web/disk")).unwrap();
        let p = |s: &str| d.join(s).to_string_lossy().into_owned();
        let got = plan(
            &[
                rule(&p("bin/hv"), Grant::Exec),
                rule(&p("usr"), Grant::Exec),
                rule(&p("state/web"), Grant::Write),
                rule(&p("state/web/disk"), Grant::Write),
                rule(&p("nowhere"), Grant::Read),
                rule("/proc", Grant::Exec),
            ],
            &[d.join("state/web")],
            &[],
        );
        assert_eq!(
            got.binds,
            [
                Need {
                    path: d.join("state/web"),
                    write: true
                },
                Need {
                    path: d.join("usr"),
                    write: false
                },
            ]
        );
        assert_eq!(got.links, [(d.join("bin"), PathBuf::from("usr/bin"))]);
    }

    #[test]
    fn a_path_that_needs_writing_inside_a_read_only_one_is_bound_again() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("a/b")).unwrap();
        let p = |s: &str| d.join(s).to_string_lossy().into_owned();
        let got = plan(
            &[rule(&p("a/b"), Grant::Write), rule(&p("a"), Grant::Read)],
            &[],
            &[],
        );
        let paths: Vec<(PathBuf, bool)> =
            got.binds.into_iter().map(|n| (n.path, n.write)).collect();
        assert_eq!(paths, [(d.join("a"), false), (d.join("a/b"), true)]);
    }
}
