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
//! holds, one recursive `mount_setattr` each, over the mounts it carried
//! too (read-only, `nosuid`, and `nodev` but for a device node), the
//! tmpfs remounted read-only, `pivot_root`, the old root detached.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

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

mod resolve;
mod tree;

use resolve::{resolve, HostPaths};
use tree::Tree;

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
/// tree's own rule binds it whole; nor is a symlink inside a tree a rule
/// grants writing to (the VM's to plant): a rule that followed one is left
/// out. A path the host lacks is left out (a
/// built-in one is optional; a spec path is refused by Landlock, naming
/// its field).
pub fn plan(rules: &[Rule], own: &[PathBuf], mount_points: &[PathBuf]) -> Plan {
    let mut host = HostPaths::default();
    plan_with(rules, own, mount_points, |path, links| {
        resolve(path, &mut host, links)
    })
}

/// [`plan`], each rule's path resolved by `resolve` (the tests compare
/// [`resolve`] with a reference).
fn plan_with(
    rules: &[Rule],
    own: &[PathBuf],
    mount_points: &[PathBuf],
    mut resolve: impl FnMut(&Path, &mut Vec<(PathBuf, PathBuf)>) -> Option<PathBuf>,
) -> Plan {
    let mut links: Vec<(PathBuf, PathBuf)> = Vec::new();
    // Each rule's real path, whether it needs writing, and where the
    // symlinks its resolution followed lie.
    let mut resolved: Vec<(PathBuf, bool, Vec<PathBuf>)> = Vec::new();
    for r in rules {
        if r.path == Path::new("/proc") || mount_points.contains(&r.path) {
            continue;
        }
        let write = matches!(r.grant, Grant::Write | Grant::Socket | Grant::Lock);
        let inside_own = own.iter().any(|t| r.path.starts_with(t) && r.path != *t);
        let before = links.len();
        let real = if inside_own || own.contains(&r.path) {
            Some(r.path.clone())
        } else {
            resolve(&r.path, &mut links)
        };
        if let Some(path) = real {
            let met = links[before..].iter().map(|(at, _)| at.clone()).collect();
            resolved.push((path, write, met));
        }
    }
    // A symlink inside a tree the VM may write (a rule granting writing,
    // or one of its own trees) is the VM's to have planted: a rule that
    // followed one is left out (the tree's bind holds the link itself),
    // else its target, a host socket or a directory of them, would be
    // bound for the VM to connect to.
    // The VM's own trees as named and as the host resolves them (a rule
    // may reach one by another name).
    let own_real: Vec<PathBuf> = own
        .iter()
        .filter_map(|t| resolve(t, &mut Vec::new()))
        .collect();
    let writable: Vec<PathBuf> = resolved
        .iter()
        .filter(|(_, write, _)| *write)
        .map(|(path, _, _)| path.clone())
        .chain(own.iter().cloned())
        .chain(own_real)
        .collect();
    let mut wanted: Vec<Need> = Vec::new();
    for (path, write, met) in resolved {
        let planted = met.iter().any(|at| {
            writable.iter().any(|w| at.starts_with(w) && at != w) || others_may_have_made(at)
        });
        if planted {
            continue;
        }
        match wanted.iter_mut().find(|n| n.path == path) {
            Some(n) => n.write |= write,
            None => wanted.push(Need { path, write }),
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

/// Whether the symlink at `at` is one anyone but root could have made or
/// swapped: not root's, or in a directory that is not root's or that
/// group or others may write (sticky aside: there only the link's owner
/// may replace it). The VM's own trees and the trees its rules grant
/// writing are not the only places a principal writes: another VM's
/// writable share (a socket there granted to this VM) and this VM's own
/// tree by a host bind mount's other name are too; a rule that followed
/// such a link is left out like one through a link in its own tree.
fn others_may_have_made(at: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let roots = |p: &Path| std::fs::symlink_metadata(p).ok().filter(|m| m.uid() == 0);
    let dir = at.parent().and_then(roots);
    let closed = dir.is_some_and(|m| m.mode() & 0o022 == 0 || m.mode() & 0o1000 != 0);
    roots(at).is_none() || !closed
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
    let mut tree = Tree::open(at)?;
    // `/proc` for the VM's procfs; `/tmp`, empty and read-only, where
    // passt mounts the empty root of its own sandbox.
    let made = ["/proc", "/dev", "/tmp"].map(PathBuf::from);
    for d in made.iter().chain(&plan.mount_points) {
        tree.dir(d)?;
    }
    for (n, (fd, kind)) in plan.binds.iter().zip(sources) {
        let target = inside(&n.path);
        if let Some(parent) = n.path.parent() {
            tree.dir(parent)?;
        }
        tree.mount_point(&n.path, kind == SFlag::S_IFDIR)?;
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
        remount(sys, &tree, &n.path, &fd, !n.write, device)?;
    }
    let mut links: Vec<(PathBuf, PathBuf)> = plan.links.clone();
    if let Some(fd) = journal {
        links.push((
            PathBuf::from(JOURNAL_SOCKET),
            PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())),
        ));
    }
    for (location, target) in &links {
        if let Some(parent) = location.parent() {
            tree.dir(parent)?;
        }
        tree.symlink(location, target)?;
    }
    sandbox::remount_read_only(sys, at)?;
    sys.pivot_root(at)
        .sys("pivot_root into the VM's root", at)?;
    Ok(())
}

/// `MOUNT_ATTR_RDONLY`, `MOUNT_ATTR_NOSUID`, `MOUNT_ATTR_NODEV`
/// (linux/mount.h).
const ATTR_RDONLY: u64 = 0x1;
const ATTR_NOSUID: u64 = 0x2;
const ATTR_NODEV: u64 = 0x4;

/// Read-only (`ro`) or not, `nosuid`, and `nodev` unless the mount is a
/// device node's: the bind at `target` and every mount it carried
/// (`MS_REC`: a file system mounted inside a bound tree), one
/// `mount_setattr` with `AT_RECURSIVE` (a remount is the top mount's
/// alone: a mount inside a tree granted reading kept the host's `rw`,
/// set-uid and devices). Each keeps its other flags. A device node's
/// mount is never made read-only: that changes nothing of what reads and
/// writes it. The bind is named by a descriptor ([`Tree::open_mounted`])
/// that must be of `source`'s own file, so a symlink or a rename in a host
/// tree on the way since the bind fails the launch, never setting the
/// flags on another mount while this one keeps the host's.
fn remount(
    sys: &dyn Syscall,
    tree: &Tree<'_>,
    path: &Path,
    source: &OwnedFd,
    ro: bool,
    device: bool,
) -> Result<()> {
    let target = tree.shown(path);
    let mut set = ATTR_NOSUID;
    if ro && !device {
        set |= ATTR_RDONLY;
    }
    if !device {
        set |= ATTR_NODEV;
    }
    let bound = tree.open_mounted(path)?;
    sys.mount_setattr_recursive(bound.as_fd(), source.as_fd(), &target, set)
        .sys("remount in the VM's root", &target)?;
    Ok(())
}

#[cfg(test)]
mod tests;
