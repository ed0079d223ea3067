//! sysfs and device nodes the openat way: a directory opened once, each
//! attribute opened under it by one name (never a path with a `/` from the
//! spec), each write one `write(2)` as the kernel wants it.

use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, readlinkat, OFlag, AT_FDCWD};
use nix::sys::stat::{fstat, FileStat, Mode, SFlag};

use crate::host::sys::{read_fd_to_end, ReadEnd, SysContext, SysError};

/// A sysfs directory, opened (`O_PATH|O_DIRECTORY`), and where it is.
#[derive(Debug)]
pub struct SysDir {
    pub fd: OwnedFd,
    pub path: PathBuf,
}

/// Open `path` as a directory (its last component may be a sysfs link).
/// `Ok(None)`: it does not exist.
pub fn open_dir(path: &Path) -> Result<Option<SysDir>, SysError> {
    open_dir_at(None, path)
}

/// Open `name` under `parent` as a directory (one component).
pub fn open_sub(parent: &SysDir, name: &str) -> Result<Option<SysDir>, SysError> {
    open_dir_at(Some(parent), Path::new(name))
}

fn open_dir_at(parent: Option<&SysDir>, name: &Path) -> Result<Option<SysDir>, SysError> {
    let path = parent.map_or(name.to_path_buf(), |p| p.path.join(name));
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let r = match parent {
        Some(p) => openat(p.fd.as_fd(), name, flags, Mode::empty()),
        None => openat(AT_FDCWD, name, flags, Mode::empty()),
    };
    match r {
        Ok(fd) => Ok(Some(SysDir { fd, path })),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(e).sys("open", path),
    }
}

/// Read attribute `name` of `dir`, trimmed. `Ok(None)`: no such attribute.
pub fn read_attr(dir: &SysDir, name: &str) -> Result<Option<String>, SysError> {
    let path = dir.path.join(name);
    let fd = match openat(
        dir.fd.as_fd(),
        name,
        OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(e).sys("open", path),
    };
    let mut buf = Vec::new();
    read_fd_to_end(fd.as_fd(), &mut buf, 256, 4096, ReadEnd::Eof).sys("read", &path)?;
    Ok(Some(String::from_utf8_lossy(&buf).trim().to_string()))
}

/// Write `value` to attribute `name` of `dir` in one `write(2)`.
pub fn write_attr(dir: &SysDir, name: &str, value: &str) -> Result<(), SysError> {
    let path = dir.path.join(name);
    let fd = openat(
        dir.fd.as_fd(),
        name,
        OFlag::O_WRONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
        Mode::empty(),
    )
    .sys("open", &path)?;
    let n = nix::unistd::write(&fd, value.as_bytes()).sys("write", &path)?;
    if n != value.len() {
        return Err(Errno::EIO).sys("short write", path);
    }
    Ok(())
}

/// The last component of the link `name` of `dir` (a driver's or an IOMMU
/// group's name). `Ok(None)`: no such link.
pub fn link_name(dir: &SysDir, name: &str) -> Result<Option<String>, SysError> {
    match readlinkat(dir.fd.as_fd(), name) {
        Ok(target) => Ok(Path::new(&target)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(e).sys("readlink", dir.path.join(name)),
    }
}

/// The entries of directory `path` (sysfs: no `.`/`..` kept), sorted.
pub fn entries(path: &Path) -> Result<Vec<String>, SysError> {
    let rd = std::fs::read_dir(path).map_err(|e| SysError {
        op: "readdir",
        path: path.to_path_buf(),
        errno: Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
    })?;
    let mut out: Vec<String> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    Ok(out)
}

/// A device node, opened `O_PATH|O_NOFOLLOW` (opening a VFIO group for
/// real would claim it), and its status.
#[derive(Debug)]
pub struct Node {
    pub fd: OwnedFd,
    pub path: PathBuf,
    pub stat: FileStat,
}

/// Open the character device `path`. `Ok(None)`: it does not exist; a
/// file that is not a character device is an error.
pub fn open_node(path: &Path) -> Result<Option<Node>, SysError> {
    let fd = match openat(
        AT_FDCWD,
        path,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(e).sys("open", path),
    };
    let stat = fstat(&fd).sys("fstat", path)?;
    if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFCHR {
        return Err(Errno::ENODEV).sys("not a character device", path);
    }
    Ok(Some(Node {
        fd,
        path: path.to_path_buf(),
        stat,
    }))
}

impl Node {
    /// Give the node to `uid:gid` with `mode`, through the open fd (never
    /// the path again): `fchownat(AT_EMPTY_PATH)`, then `chmod` of the
    /// fd's `/proc/self/fd` link, which names this inode and no other.
    pub fn set_owner(&self, uid: u32, gid: u32, mode: u32) -> Result<(), SysError> {
        nix::unistd::fchownat(
            self.fd.as_fd(),
            "",
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
            nix::fcntl::AtFlags::AT_EMPTY_PATH,
        )
        .sys("fchownat", &self.path)?;
        let link = format!("/proc/self/fd/{}", self.fd.as_raw_fd());
        nix::sys::stat::fchmodat(
            AT_FDCWD,
            OsStr::from_bytes(link.as_bytes()),
            Mode::from_bits_truncate(mode),
            nix::sys::stat::FchmodatFlags::FollowSymlink,
        )
        .sys("chmod", &self.path)
    }

    pub fn owner(&self) -> (u32, u32, u32) {
        (
            self.stat.st_uid,
            self.stat.st_gid,
            self.stat.st_mode & 0o7777,
        )
    }
}

/// The processes that hold `node`'s device open: every `/proc/PID/fd/*`
/// that is a character device with the node's device numbers, whatever
/// path it was opened by. A path says nothing of what an fd reaches: a
/// second node made with mknod, a bind mount under another name, the
/// node of an unplugged USB device (`… (deleted)`) reach the same device
/// by other paths, and a file anybody makes at `/tmp/…/vfio/7` has the
/// same tail as a group's node but reaches nothing. The fd is looked at
/// with `statx(AT_STATX_DONT_SYNC)` through its `/proc` link, which never
/// opens the file and takes a FUSE or NFS file's attributes from the
/// kernel's cache without asking its server, so a hung one cannot stall
/// the scan. An `O_PATH` fd reaches no device and holds nothing
/// (`path_only`). `/proc/PID/fd` is the thread-group leader's fd table
/// only: a thread with a table of its own (`unshare(CLONE_FILES)`, a
/// `clone` without `CLONE_FILES`, or live threads under an exited leader)
/// is looked at through `/proc/PID/task/TID/fd` (`own_tables`).
/// Processes whose fds cannot be read are counted as holders (with the
/// reason), so an unreadable one never passes for none.
///
/// A scan that saw something move under it is done again, up to
/// [`RESCANS`] times [`RESCAN_PAUSE`] apart: an fd on the device that was
/// gone, or named another file, by the time its flags were read (udev's
/// short `O_PATH` look at a node at each of its events; or a holder that
/// passed the fd on to a child and exited, or moved it to another
/// number), or a process that ended while it was looked at (it may have
/// handed its fds to a child the listing did not have; looked at again
/// once, [`ENDED_RESCANS`], since on a busy host nearly every look sees
/// one). The first look that finds a holder is the answer, and a process
/// whose fds on the device moved in every look is a holder. What the
/// scans cannot see is named in the threat model: an fd in flight in a
/// unix socket, a file only a mapping or an io_uring holds, and a holder
/// that hands its fd on faster than a scan walks `/proc` may pass every
/// look.
pub fn holders(node: &Node) -> Vec<(u32, Option<String>)> {
    let mut scan = scan_holders(node.stat.st_rdev);
    // The processes whose fds on the device moved in every look so far.
    let mut always_moving = scan.moving.clone();
    let mut ended_looks = 0;
    for _ in 0..RESCANS {
        // A look that found a holder is the answer (a holder that hands
        // its fd to a child and exits is found by some looks, not all).
        if !scan.held.is_empty() {
            return scan.held;
        }
        if scan.moving.is_empty() {
            // Only processes that ended: the host's churn, nearly every
            // look on a busy host; looked at again once.
            if !scan.ended || ended_looks == ENDED_RESCANS {
                break;
            }
            ended_looks += 1;
        }
        std::thread::sleep(RESCAN_PAUSE);
        scan = scan_holders(node.stat.st_rdev);
        always_moving.retain(|pid| scan.moving.contains(pid));
    }
    if !scan.moving.is_empty() {
        scan.held.extend(always_moving.into_iter().map(|pid| {
            (
                pid,
                Some("its fds on the device kept changing while they were looked at".to_string()),
            )
        }));
    }
    scan.held
}

/// How many times [`holders`] looks again at a scan that saw an fd on the
/// device move.
pub const RESCANS: usize = 5;
/// How many of those a scan that saw only processes end gets.
pub const ENDED_RESCANS: usize = 1;
/// The pause before each look again.
pub const RESCAN_PAUSE: std::time::Duration = std::time::Duration::from_millis(5);

/// One pass over `/proc`.
struct Scan {
    /// Holders, and processes whose fds could not be read.
    held: Vec<(u32, Option<String>)>,
    /// Processes with an fd on the device that moved while looked at.
    moving: Vec<u32>,
    /// Whether a process ended while it was looked at.
    ended: bool,
}

fn scan_holders(rdev: libc::dev_t) -> Scan {
    let mut scan = Scan {
        held: Vec::new(),
        moving: Vec::new(),
        ended: false,
    };
    let Ok(procs) = std::fs::read_dir("/proc") else {
        scan.held.push((0, Some("cannot read /proc".into())));
        return scan;
    };
    for p in procs.filter_map(|e| e.ok()) {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        let leader = Path::new("/proc").join(pid.to_string());
        let mut tables = vec![leader.clone()];
        match own_tables(pid, &leader) {
            Ok(more) => tables.extend(more),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                scan.ended = true;
                continue;
            }
            Err(e) => {
                scan.held
                    .push((pid, Some(format!("threads unreadable: {e}"))));
                continue;
            }
        }
        // Every table is looked at until one holds the device or cannot
        // be read; one that moved or ended leaves the others to look at.
        for task in &tables {
            match holds(task, rdev) {
                Ok(Look::Free) => continue,
                Ok(Look::Moving) => {
                    if !scan.moving.contains(&pid) {
                        scan.moving.push(pid);
                    }
                    continue;
                }
                // Gone meanwhile (the process, or one of its threads).
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    scan.ended = true;
                    continue;
                }
                Ok(Look::Holds) => scan.held.push((pid, None)),
                Err(e) => scan.held.push((pid, Some(format!("fds unreadable: {e}")))),
            }
            break;
        }
    }
    scan
}

/// What one look at an fd table found.
enum Look {
    /// A non-`O_PATH` fd on the device, the same file before and after
    /// its flags were read.
    Holds,
    /// No fd on the device.
    Free,
    /// An fd on the device, gone or another file by the time its flags
    /// were read, and none that holds it.
    Moving,
}

/// What the fd table of `task` (`/proc/PID` or `/proc/PID/task/TID`) has
/// on the character device numbered `rdev`. An fd is looked at three
/// times: its link, its flags, its link again; only an fd that is the
/// device at both looks at its link, and not `O_PATH`, holds it.
fn holds(task: &Path, rdev: libc::dev_t) -> std::io::Result<Look> {
    let mut look = Look::Free;
    for fd in std::fs::read_dir(task.join("fd"))?.filter_map(|e| e.ok()) {
        let link = fd.path();
        if char_device_of(&link) != Some(rdev) {
            continue;
        }
        match path_only(&task.join("fdinfo").join(fd.file_name())) {
            Ok(true) => continue,
            // Closed since, or the task gone.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                look = Look::Moving;
                continue;
            }
            // Flags unreadable otherwise: not known to be O_PATH.
            Ok(false) | Err(_) => {}
        }
        if char_device_of(&link) == Some(rdev) {
            return Ok(Look::Holds);
        }
        look = Look::Moving;
    }
    Ok(look)
}

/// The threads of process `pid` (`leader`: `/proc/PID`) whose fd table is
/// not the leader's, as their `/proc/PID/task/TID` directories: each
/// thread is compared with the leader by `kcmp(KCMP_FILES)`, and one that
/// cannot be compared is looked at too.
fn own_tables(pid: u32, leader: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(leader.join("task"))?.filter_map(|e| e.ok()) {
        let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if tid != pid && !same_files(pid, tid) {
            out.push(t.path());
        }
    }
    Ok(out)
}

/// `KCMP_FILES` (include/uapi/linux/kcmp.h).
const KCMP_FILES: libc::c_long = 2;

/// Whether tasks `a` and `b` share one fd table (`kcmp(KCMP_FILES)` is 0;
/// any error, a task gone or no kcmp in this kernel, is "not known the
/// same", so the caller looks).
fn same_files(a: u32, b: u32) -> bool {
    // SAFETY: kcmp takes two pids, a type and two integers; no pointer
    // is passed and nothing of this process is written.
    let r = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            libc::c_long::from(a),
            libc::c_long::from(b),
            KCMP_FILES,
            libc::c_long::from(0u8),
            libc::c_long::from(0u8),
        )
    };
    r == 0
}

/// Whether the fd whose fdinfo is `info` (`/proc/…/fdinfo/N`) is an
/// `O_PATH` one (its `flags:`): it names the node but reaches no device
/// (no read, write or ioctl), as a launcher's own look at the node does;
/// another launch checking the device meanwhile must not take it for a
/// holder. Flags that cannot be parsed are not `O_PATH`; an fdinfo that
/// cannot be read is the caller's to judge ([`holds`]).
fn path_only(info: &Path) -> std::io::Result<bool> {
    Ok(std::fs::read_to_string(info)?
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|f| u64::from_str_radix(f.trim(), 8).ok())
        .is_some_and(|f| f & O_PATH_FLAG != 0))
}

/// `O_PATH` as fdinfo's `flags:` shows it (x86_64, aarch64: 010000000).
const O_PATH_FLAG: u64 = 0o10_000_000;

/// The device numbers of the character device that the fd link `link`
/// (`/proc/PID/fd/N`) names, from the kernel's cached attributes; `None`
/// for anything else, or an fd closed meanwhile.
fn char_device_of(link: &Path) -> Option<libc::dev_t> {
    let path = std::ffi::CString::new(link.as_os_str().as_bytes()).ok()?;
    // SAFETY: an all-zero `statx` is a valid value of this plain C struct.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string that outlives the call and
    // `stx` is a live, writable `statx` the kernel fills; no flag makes
    // the kernel keep either pointer.
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::AT_STATX_DONT_SYNC,
            libc::STATX_TYPE,
            std::ptr::addr_of_mut!(stx),
        )
    };
    if r != 0 || u32::from(stx.stx_mode) & libc::S_IFMT != libc::S_IFCHR {
        return None;
    }
    Some(libc::makedev(stx.stx_rdev_major, stx.stx_rdev_minor))
}
