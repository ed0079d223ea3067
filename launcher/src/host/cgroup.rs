//! cgroup v2 facts: which cgroup the caller is in, whether a cgroup still
//! exists and which processes it holds, and how to signal them. Knows
//! nothing of VMs; `instance::liveness` turns these facts into verdicts.
//!
//! A cgroup is a handle only root holds: a process cannot leave it, and
//! everything it forks starts inside it. So a cgroup that held nothing but
//! the launcher when the launcher started (a unit's cgroup at `ExecStart=`,
//! a `systemd-run --scope`) holds, for as long as it exists, exactly the
//! VM and whatever the VM started — found in O(1), however busy the host.

use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag, AT_FDCWD};
use nix::sys::stat::{fstat, Mode};
use serde::{Deserialize, Serialize};

use crate::host::procs;
use crate::host::sys::{read_fd_to_end, ReadEnd};

/// Where the unified (v2) hierarchy is mounted: `/sys/fs/cgroup` on a pure
/// v2 host (every current systemd), `/sys/fs/cgroup/unified` on a hybrid one.
const MOUNT_CANDIDATES: &[&str] = &["/sys/fs/cgroup", "/sys/fs/cgroup/unified"];

/// A cgroup as recorded at launch: its directory and its id (the inode of
/// that directory, which the kernel never gives to another cgroup in the
/// same boot), so a new cgroup made later at the same path is not mistaken
/// for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cgroup {
    pub path: PathBuf,
    pub id: u64,
}

/// What a cgroup holds now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Occupancy {
    /// The recorded cgroup no longer exists (removed, or another cgroup now
    /// has its path): nothing that ran in it runs any more.
    Gone,
    /// It exists and holds no process but the ignored ones.
    Empty,
    /// Processes other than the ignored ones (pids, sorted), or a populated
    /// child cgroup (`child` names it; its pids are not listed).
    Held {
        pids: Vec<u32>,
        child: Option<String>,
    },
}

const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// Read `dir/name` (a small kernel file) into `buf`, replacing its content.
fn read_at(dir: impl AsFd, name: &str, buf: &mut Vec<u8>) -> Result<(), Errno> {
    let fd = openat(
        dir.as_fd(),
        name,
        OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    read_all(&fd, buf)
}

fn read_all(fd: &OwnedFd, buf: &mut Vec<u8>) -> Result<(), Errno> {
    // kernfs files may come in pieces: read to the end (no dup, no statx:
    // one read for a file that fits 4 KiB, then the one that returns 0).
    read_fd_to_end(fd.as_fd(), buf, 4096, usize::MAX, ReadEnd::Eof)
}

/// The v2 hierarchy's mount point, if there is one.
pub fn mount_point() -> Option<&'static Path> {
    MOUNT_CANDIDATES.iter().map(Path::new).find(|p| {
        nix::sys::statfs::statfs(*p)
            .map(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
            .unwrap_or(false)
    })
}

/// The caller's v2 cgroup as `/proc/self/cgroup` names it (`0::PATH`),
/// relative to the hierarchy's root. `None` without a v2 hierarchy or when
/// the cgroup was removed under the caller.
pub fn own_path() -> Option<String> {
    let mut buf = Vec::new();
    let fd = openat(
        AT_FDCWD,
        "/proc/self/cgroup",
        OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    read_all(&fd, &mut buf).ok()?;
    let text = std::str::from_utf8(&buf).ok()?;
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    (path.starts_with('/') && !path.ends_with(" (deleted)")).then(|| path.to_string())
}

/// The pids listed in `cgroup.procs` (thread-group ids; a process whose
/// leader has exited but whose other threads run on is still listed).
fn parse_pids(bytes: &[u8]) -> Vec<u32> {
    let mut out: Vec<u32> = bytes
        .split(|b| *b == b'\n')
        .filter_map(|l| std::str::from_utf8(l).ok()?.trim().parse().ok())
        .collect();
    out.sort_unstable();
    out
}

/// What systemd tells a process it started for a unit, read from the
/// launcher's environment before it is cleared: the unit's invocation id
/// (`$INVOCATION_ID`, 32 hex digits, new for every start of the unit; the
/// same id is the `trusted.invocation_id` attribute of the unit's cgroup)
/// and the pid systemd executed (`$SYSTEMD_EXEC_PID`, systemd 248 and
/// later: equal to the caller's own pid only in the process systemd
/// started, not in anything that process forked). Both are inherited by
/// children, and `trusted.*` attributes only a process with
/// `CAP_SYS_ADMIN` can set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Invocation {
    pub id: Option<String>,
    pub exec_pid: Option<u32>,
}

impl Invocation {
    /// From the environment variables as `get` reads them.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Invocation {
        Invocation {
            id: get("INVOCATION_ID"),
            exec_pid: get("SYSTEMD_EXEC_PID").and_then(|p| p.trim().parse().ok()),
        }
    }
}

/// The extended attribute systemd sets on a unit's cgroup.
const INVOCATION_XATTR: &std::ffi::CStr = c"trusted.invocation_id";

/// Why a cgroup named after the VM's unit is not taken as the unit that
/// started this launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotTheUnit {
    /// No `$INVOCATION_ID` (not started by systemd), or not 32 hex digits.
    NoInvocationId,
    /// `$SYSTEMD_EXEC_PID` is not the launcher's pid: a process the unit
    /// started forked it (a shell in a unit's cgroup, say), or systemd did
    /// not say.
    NotExecutedBySystemd(Option<u32>),
    /// The cgroup has no `trusted.invocation_id`, or another one.
    OtherInvocation(Option<String>),
}

impl std::fmt::Display for NotTheUnit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotTheUnit::NoInvocationId => {
                write!(f, "the launcher has no $INVOCATION_ID of systemd's")
            }
            NotTheUnit::NotExecutedBySystemd(p) => write!(
                f,
                "systemd did not start the launcher itself ($SYSTEMD_EXEC_PID {})",
                p.map_or_else(|| "unset".to_string(), |p| p.to_string())
            ),
            NotTheUnit::OtherInvocation(x) => write!(
                f,
                "the cgroup's trusted.invocation_id is {}, not the launcher's $INVOCATION_ID",
                x.as_deref().unwrap_or("unset")
            ),
        }
    }
}

/// 32 hex digits (systemd's `sd_id128_to_string`), lower case.
fn invocation_id(s: &str) -> Option<String> {
    let s = s.trim();
    (s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit())).then(|| s.to_ascii_lowercase())
}

/// The cgroup directory `dir`'s `trusted.invocation_id`, if it has one.
fn cgroup_invocation_id(dir: &OwnedFd) -> Option<String> {
    let mut buf = [0u8; 64];
    // SAFETY: fgetxattr(2) on an fd we own, a NUL-terminated name, and a
    // buffer of the length given; it writes at most that many bytes.
    let n = unsafe {
        libc::fgetxattr(
            dir.as_raw_fd(),
            INVOCATION_XATTR.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    let n = usize::try_from(n).ok()?;
    std::str::from_utf8(buf.get(..n)?)
        .ok()
        .and_then(invocation_id)
}

/// Whether the unit that started this launch is the one whose cgroup
/// `dir` is: systemd executed the launcher itself (`$SYSTEMD_EXEC_PID` is
/// its pid) with the invocation id the cgroup carries.
fn started_by_unit_of(dir: &OwnedFd, inv: &Invocation, me: u32) -> Result<(), NotTheUnit> {
    let id = inv
        .id
        .as_deref()
        .and_then(invocation_id)
        .ok_or(NotTheUnit::NoInvocationId)?;
    if inv.exec_pid != Some(me) {
        return Err(NotTheUnit::NotExecutedBySystemd(inv.exec_pid));
    }
    match cgroup_invocation_id(dir) {
        Some(on_cgroup) if on_cgroup == id => Ok(()),
        other => Err(NotTheUnit::OtherInvocation(other)),
    }
}

/// Why the caller's cgroup stands for one VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dedicated {
    /// It holds the caller and nobody else.
    Alone,
    /// It is the cgroup of the unit that started the caller.
    StartedByItsUnit,
}

impl std::fmt::Display for Dedicated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Dedicated::Alone => "it held only the launcher",
            Dedicated::StartedByItsUnit => "the unit that started this launch",
        })
    }
}

/// Why the caller's cgroup cannot stand for one VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotDedicated {
    /// No cgroup v2 hierarchy on this host.
    NoHierarchy,
    /// The caller is in the hierarchy's root cgroup.
    Root,
    /// The cgroup holds other processes too (a login session, a shell's
    /// scope): it cannot tell the VM's processes from theirs.
    Shared(Vec<u32>),
    /// The cgroup is named after the VM's unit and holds other processes,
    /// but it is not the unit that started this launch (`getty@tty1.service`
    /// for a VM named `tty1`).
    OtherUnit(Vec<u32>, NotTheUnit),
    /// The cgroup directory could not be opened or read.
    Unreadable(PathBuf, Errno),
}

impl std::fmt::Display for NotDedicated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotDedicated::NoHierarchy => write!(f, "no cgroup v2 hierarchy"),
            NotDedicated::Root => write!(f, "the launcher runs in the root cgroup"),
            NotDedicated::Shared(p) => {
                write!(f, "the launcher's cgroup also holds pids {p:?}")
            }
            NotDedicated::OtherUnit(p, why) => write!(
                f,
                "the launcher's cgroup also holds pids {p:?} and is named after the VM's unit, but {why}"
            ),
            NotDedicated::Unreadable(p, e) => write!(f, "{}: {e}", p.display()),
        }
    }
}

/// The caller's cgroup, when it stands for the VM named `unit_instance`
/// that the caller is about to become, so that everything in it later is
/// the VM's: it holds the caller and nobody else, or it is the cgroup of
/// the VM's own unit, where systemd puts nothing but that unit's
/// processes — at `ExecStart=` the unit's `ExecStartPost=` (`wait-ready`)
/// may already run beside the launcher. The VM's own unit is the one that
/// started this launch: its cgroup is named `PREFIX@NAME.service` (as
/// every vmwarden unit template names it), systemd executed the launcher
/// itself, and the cgroup's `trusted.invocation_id` is the launcher's
/// `$INVOCATION_ID` ([`Invocation`]). A name alone is not enough:
/// `getty@tty1.service` is named like the unit of a VM called `tty1`.
pub fn own_dedicated(
    unit_instance: &str,
    inv: &Invocation,
) -> Result<(Cgroup, Dedicated), NotDedicated> {
    let mount = mount_point().ok_or(NotDedicated::NoHierarchy)?;
    let rel = own_path().ok_or(NotDedicated::NoHierarchy)?;
    let rel = rel.trim_start_matches('/');
    if rel.is_empty() {
        return Err(NotDedicated::Root);
    }
    let path = mount.join(rel);
    let unreadable = |e| NotDedicated::Unreadable(path.clone(), e);
    let dir = openat(AT_FDCWD, &path, DIR_FLAGS, Mode::empty()).map_err(unreadable)?;
    let id = fstat(dir.as_fd()).map_err(unreadable)?.st_ino;
    let mut buf = Vec::new();
    read_at(&dir, "cgroup.procs", &mut buf).map_err(unreadable)?;
    let me = std::process::id();
    let pids = parse_pids(&buf);
    if pids == [me] {
        return Ok((Cgroup { path, id }, Dedicated::Alone));
    }
    let others: Vec<u32> = pids.into_iter().filter(|p| *p != me).collect();
    if !is_unit_cgroup_of(&path, unit_instance) {
        return Err(NotDedicated::Shared(others));
    }
    started_by_unit_of(&dir, inv, me).map_err(|why| NotDedicated::OtherUnit(others, why))?;
    Ok((Cgroup { path, id }, Dedicated::StartedByItsUnit))
}

/// Whether the cgroup directory `path` is a templated unit's for the
/// instance `name`: its last component `PREFIX@NAME.service`, with a
/// non-empty prefix.
fn is_unit_cgroup_of(path: &Path, name: &str) -> bool {
    path.file_name()
        .and_then(|f| f.to_str())
        .and_then(|f| f.strip_suffix(".service"))
        .and_then(|f| f.rsplit_once('@'))
        .is_some_and(|(prefix, instance)| !prefix.is_empty() && instance == name)
}

/// What `cg` holds now, not counting the caller and its ancestors (a tool
/// run from the unit itself — `ExecStop=`, `ExecStopPost=` — lives in the
/// cgroup it asks about).
pub fn occupancy(cg: &Cgroup) -> Result<Occupancy, Errno> {
    let dir = match openat(AT_FDCWD, &cg.path, DIR_FLAGS, Mode::empty()) {
        Ok(d) => d,
        Err(Errno::ENOENT | Errno::ENOTDIR) => return Ok(Occupancy::Gone),
        Err(e) => return Err(e),
    };
    if fstat(dir.as_fd())?.st_ino != cg.id {
        return Ok(Occupancy::Gone);
    }
    let mut buf = Vec::new();
    match read_at(&dir, "cgroup.procs", &mut buf) {
        // Removed between the open and the read.
        Err(Errno::ENOENT | Errno::ENODEV) => return Ok(Occupancy::Gone),
        r => r?,
    }
    let mut pids = parse_pids(&buf);
    if !pids.is_empty() {
        let me = std::process::id();
        pids.retain(|p| *p != me);
        if !pids.is_empty() {
            let mine = procs::ancestors();
            pids.retain(|p| !mine.contains(p));
        }
    }
    if !pids.is_empty() {
        return Ok(Occupancy::Held { pids, child: None });
    }
    // cgroup.procs lists only this cgroup's own members: a child cgroup
    // (made by root or a delegate) can hold more.
    if let Some(child) = populated_child(&dir, &mut buf)? {
        return Ok(Occupancy::Held {
            pids: Vec::new(),
            child: Some(child),
        });
    }
    Ok(Occupancy::Empty)
}

/// The name of a populated child cgroup of `dir`, if any.
fn populated_child(dir: &OwnedFd, buf: &mut Vec<u8>) -> Result<Option<String>, Errno> {
    // Child cgroups are the only directories in a cgroup directory.
    let dup = nix::unistd::dup(dir)?;
    let mut d = nix::dir::Dir::from_fd(dup)?;
    for e in d.iter() {
        let e = e?;
        let name = e.file_name().to_bytes();
        if name == b"." || name == b".." || e.file_type() != Some(nix::dir::Type::Directory) {
            continue;
        }
        let name = OsStr::from_bytes(name).to_string_lossy().into_owned();
        let child = match openat(dir.as_fd(), name.as_str(), DIR_FLAGS, Mode::empty()) {
            Ok(c) => c,
            Err(Errno::ENOENT) => continue,
            Err(e) => return Err(e),
        };
        match read_at(&child, "cgroup.events", buf) {
            Ok(()) => {}
            Err(Errno::ENOENT | Errno::ENODEV) => continue,
            Err(e) => return Err(e),
        }
        let populated = std::str::from_utf8(buf)
            .ok()
            .and_then(|t| t.lines().find_map(|l| l.strip_prefix("populated ")))
            .map(|v| v.trim() != "0")
            // Unparsable: assume populated (ambiguity keeps).
            .unwrap_or(true);
        if populated {
            return Ok(Some(name));
        }
    }
    Ok(None)
}

/// SIGKILL every process `cg` holds (not the caller or its ancestors), each
/// through a pidfd opened while the pid is still listed in the cgroup, so a
/// recycled pid is never signalled. Returns the pids signalled.
pub fn kill_all(cg: &Cgroup) -> Result<Vec<u32>, Errno> {
    let Occupancy::Held { pids, .. } = occupancy(cg)? else {
        return Ok(Vec::new());
    };
    let mut killed = Vec::new();
    for pid in pids {
        let Some(fd) = pidfd_open(pid) else { continue };
        // Still in the cgroup now that the pidfd pins the process?
        let still = matches!(occupancy(cg), Ok(Occupancy::Held { pids: ref now, .. }) if now.contains(&pid));
        if still && pidfd_kill(&fd) {
            killed.push(pid);
        }
    }
    Ok(killed)
}

/// `pidfd_open(pid, 0)`: a handle on the process that has `pid` now.
pub fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).ok().filter(|p| *p > 0)?;
    // SAFETY: pidfd_open(2) takes a pid and flags, no pointers.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = i32::try_from(fd).ok().filter(|f| *f >= 0)?;
    // SAFETY: a non-negative return of pidfd_open is a new fd nobody else
    // owns; OwnedFd takes it over.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// SIGKILL through a pidfd; false when the process is already gone.
pub fn pidfd_kill(fd: &OwnedFd) -> bool {
    // SAFETY: a plain syscall on an fd we own, no siginfo.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        ) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_units_cgroup_is_named_after_its_instance() {
        let yes = |p: &str, n: &str| is_unit_cgroup_of(Path::new(p), n);
        assert!(yes(
            "/sys/fs/cgroup/machine.slice/microvm@web.service",
            "web"
        ));
        assert!(yes(
            "/sys/fs/cgroup/system.slice/vmwarden@web.service",
            "web"
        ));
        assert!(!yes(
            "/sys/fs/cgroup/system.slice/vmwarden@web.service",
            "db"
        ));
        assert!(!yes("/sys/fs/cgroup/system.slice/@web.service", "web"));
        assert!(!yes("/sys/fs/cgroup/system.slice/web.service", "web"));
        assert!(!yes(
            "/sys/fs/cgroup/user.slice/user@web.service/init.scope",
            "web"
        ));
        assert!(!yes(
            "/sys/fs/cgroup/system.slice/vmwarden@web.scope",
            "web"
        ));
    }

    #[test]
    fn the_invocation_is_read_from_systemds_variables() {
        let vars = |k: &str| match k {
            "INVOCATION_ID" => Some("6B1F2A9C0D3E4F5A8B7C6D5E4F3A2B1C".to_string()),
            "SYSTEMD_EXEC_PID" => Some("4242".to_string()),
            _ => None,
        };
        let inv = Invocation::from_env(vars);
        assert_eq!(inv.exec_pid, Some(4242));
        assert_eq!(
            inv.id.as_deref().and_then(invocation_id).as_deref(),
            Some("6b1f2a9c0d3e4f5a8b7c6d5e4f3a2b1c")
        );
        assert_eq!(Invocation::from_env(|_| None), Invocation::default());
        for bad in [
            "",
            "6b1f",
            "6b1f2a9c0d3e4f5a8b7c6d5e4f3a2b1z",
            "6b1f2a9c-0d3e-4f5a-8b7c-6d5e4f3a2b1c",
        ] {
            assert_eq!(invocation_id(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_unit_named_cgroup_without_the_launchs_invocation_is_not_its_unit() {
        // A directory that is no cgroup carries no trusted.invocation_id.
        let dir = openat(AT_FDCWD, "/", DIR_FLAGS, Mode::empty()).unwrap();
        let me = std::process::id();
        let id = Some("6b1f2a9c0d3e4f5a8b7c6d5e4f3a2b1c".to_string());
        let inv = |id: Option<String>, exec_pid| Invocation { id, exec_pid };
        assert_eq!(
            started_by_unit_of(&dir, &inv(None, Some(me)), me),
            Err(NotTheUnit::NoInvocationId)
        );
        assert_eq!(
            started_by_unit_of(&dir, &inv(id.clone(), Some(1)), me),
            Err(NotTheUnit::NotExecutedBySystemd(Some(1)))
        );
        assert_eq!(
            started_by_unit_of(&dir, &inv(id, Some(me)), me),
            Err(NotTheUnit::OtherInvocation(None))
        );
    }

    #[test]
    fn parses_cgroup_procs() {
        assert_eq!(parse_pids(b"12\n3\n\n7\n"), vec![3, 7, 12]);
        assert!(parse_pids(b"").is_empty());
    }

    #[test]
    fn the_record_rejects_unknown_fields() {
        let ok: Cgroup = serde_json::from_str(r#"{"path":"/sys/fs/cgroup/a","id":7}"#).unwrap();
        assert_eq!(ok.id, 7);
        serde_json::from_str::<Cgroup>(r#"{"path":"/a","id":7,"x":1}"#).unwrap_err();
    }
}
