//! `reap --apply`'s unmount of a stray credential tmpfs in another mount
//! namespace: only in the namespace the scan reported, and only the mount
//! the scan reported.
//!
//! The scan names a namespace (`mnt:[INODE]`) and a process in it. By
//! the time reap applies, that process may have left and its pid been
//! reused by a process in another namespace (the host's own, or a live
//! VM's), where the same path may hold another mount. So the namespace is
//! opened through the pid, and the open file, not the pid, is checked: an
//! nsfs file of the scan's inode and, where the scan has it, its id (the
//! kernel hands a freed namespace's inode number to the next one made;
//! the id is never reused), or nothing is entered. A forked child
//! enters it (the caller's namespace never changes) and, before it
//! unmounts, asks the kernel what is mounted at the path now
//! (`statx(STATX_MNT_ID_UNIQUE)`, `statmount(2)`: Linux 6.8): a tmpfs with
//! the credential source, mounted exactly there, with the scan's unique
//! mount id (which also proves the namespace: a mount is in one) and
//! mountinfo id when the scan has them. Anything else is kept and reported.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::wait::WaitStatus;
use nix::unistd::Pid;

use crate::host::mountinfo::Mount;
use crate::host::ns_mounts;

/// The child's exit codes (anything else: it died otherwise).
const EXIT_UNMOUNTED: i32 = 0;
const EXIT_SETNS: i32 = 1;
const EXIT_UMOUNT: i32 = 2;
const EXIT_NOT_THE_MOUNT: i32 = 3;
const EXIT_CANNOT_STATE: i32 = 4;

/// How long reap waits for the child that checks and unmounts one mount.
/// Its system calls look the path up in another namespace, where a file
/// system that never answers (a hung FUSE daemon, an unreachable network
/// file system) would hold it forever; past this it is killed and the
/// mount reported (the other mounts go on). Ten seconds: a lookup on a
/// healthy host takes microseconds, a slow one under load milliseconds.
pub(crate) const UNMOUNT_WAIT: Duration = Duration::from_secs(10);

/// How long reap waits, after `SIGKILL`, for the child to end: a child in
/// an uninterruptible sleep (`D`, not `TASK_KILLABLE`) cannot end until
/// the sleep does, so it is left (see [`NsUnmountError::TimedOut`]).
const KILL_GRACE: Duration = Duration::from_secs(1);

/// Why a credential tmpfs in another namespace was not unmounted.
#[derive(Debug, thiserror::Error)]
pub enum NsUnmountError {
    #[error("{target}: the scan's mount namespace {ns:?} is not `mnt:[INODE]`; nothing unmounted")]
    BadNamespace { target: PathBuf, ns: String },
    #[error("open mount namespace of pid {pid} ({path}): {source}; nothing unmounted")]
    OpenNamespace {
        pid: u32,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    StatNamespace {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    /// The pid the scan named is now in another namespace: its holder
    /// left (the pid may be reused). Ambiguity keeps.
    #[error("{target}: pid {pid} is now in mount namespace {found}, not in {expected} where the scan found the tmpfs: the holder left (its pid may be reused); nothing unmounted")]
    HolderLeft {
        target: PathBuf,
        pid: u32,
        expected: String,
        found: String,
    },
    /// The pid the scan named is in a namespace with the scan's inode
    /// number but another id: the scan's namespace was freed and a new one
    /// (a relaunch's, say) was handed its number.
    #[error("{target}: pid {pid} is in mount namespace {ns} with id {found_id}, not the scan's namespace {ns} with id {scan_id}: the holder left, its namespace was freed and its inode number handed out again; nothing unmounted")]
    NamespaceReplaced {
        target: PathBuf,
        pid: u32,
        ns: String,
        scan_id: u64,
        found_id: u64,
    },
    #[error("fork (or the pipe for its errno): {0}")]
    Fork(#[source] Errno),
    #[error(
        "{target}: cannot enter mount namespace {ns} of pid {pid}: {errno}; nothing unmounted"
    )]
    Enter {
        target: PathBuf,
        pid: u32,
        ns: String,
        #[source]
        errno: Errno,
    },
    /// What is mounted at the path in the scan's namespace now is not the
    /// credential tmpfs the scan reported.
    #[error("{target} in mount namespace {ns} (pid {pid}) is no longer the mount the scan reported (a tmpfs with source {mount_source}{id}){found}: not unmounted")]
    NotTheMount {
        target: PathBuf,
        pid: u32,
        ns: String,
        mount_source: String,
        id: String,
        /// What is there instead, when the child could tell.
        found: String,
    },
    #[error("{target} in mount namespace {ns} (pid {pid}): the kernel cannot state what is mounted there (openat2, statx and statmount, Linux 6.8): {errno}, so it cannot be told to be the credential tmpfs: not unmounted")]
    CannotState {
        target: PathBuf,
        pid: u32,
        ns: String,
        #[source]
        errno: Errno,
    },
    #[error("umount2 {target} in mount namespace {ns} (pid {pid}), the mount the scan reported: {errno}")]
    UmountFailed {
        target: PathBuf,
        pid: u32,
        ns: String,
        #[source]
        errno: Errno,
    },
    /// The child did not end within `wait` ([`UNMOUNT_WAIT`]): a lookup
    /// in the path never answered. It was sent `SIGKILL`; a process with
    /// `SIGKILL` pending makes no further system call, so, unless it was
    /// inside `umount2` itself, nothing was unmounted. `reaped` false: it
    /// had not ended [`KILL_GRACE`] later (an uninterruptible sleep); it is
    /// left to end when the sleep does, and init (or the service
    /// manager, a subreaper) reaps it once reap has exited.
    #[error("{target} in mount namespace {ns} (pid {pid}): the child checking and unmounting it did not end within {wait:?} (a lookup in the path that never answers: a hung FUSE or network file system?); sent SIGKILL to it (pid {child}), {}; not unmounted unless it hung in umount2 itself (run reap again to see)", if *reaped { "and it ended" } else { "but it has not ended (an uninterruptible sleep): it is left to end when the sleep does, making no further system call" })]
    TimedOut {
        target: PathBuf,
        pid: u32,
        ns: String,
        /// The child's pid.
        child: i32,
        wait: Duration,
        reaped: bool,
    },
    /// The wait for the child could not be bounded (no pidfd): it was
    /// killed rather than waited for without bound.
    #[error("{target} in mount namespace {ns} (pid {pid}): cannot bound the wait for the child unmounting it (pidfd_open of pid {child}: {errno}); sent SIGKILL to it: it may or may not have unmounted it (run reap again to see)")]
    Unbounded {
        target: PathBuf,
        pid: u32,
        ns: String,
        child: i32,
        #[source]
        errno: Errno,
    },
    /// The child ended otherwise than with one of its exit codes.
    #[error("the child unmounting {target} in mount namespace {ns} (pid {pid}) ended with {status:?}; it may or may not have unmounted it")]
    Unmount {
        target: PathBuf,
        pid: u32,
        ns: String,
        status: Result<WaitStatus, Errno>,
    },
}

/// Unmount `m`, the credential tmpfs the scan found in mount namespace
/// `ns` (`mnt:[INODE]`) through process `pid`, inside that namespace (in a
/// child, so the caller's namespace never changes); only when the
/// namespace `pid` is in now is `ns`, and the mount at `m.mount_point`
/// there is still `m`.
///
/// The wait for the child is bounded ([`UNMOUNT_WAIT`]; past it,
/// [`NsUnmountError::TimedOut`]).
///
/// No pidfd of `pid`: the check is on the namespace's open file, which pins the
/// namespace whatever the pid names later, and it is that file the child
/// enters. A pidfd would tell only that the process behind the pid did not
/// change after it was opened, not that it is the scan's.
pub(crate) fn in_namespace(pid: u32, ns: &str, m: &Mount) -> Result<(), NsUnmountError> {
    use nix::unistd::{fork, ForkResult};
    #[cfg(test)]
    tests::MEANWHILE.with(|f| f.borrow().as_ref().map(|f| f(m)));
    let target = m.mount_point.clone();
    let expected_ino: u64 = ns
        .strip_prefix("mnt:[")
        .and_then(|s| s.strip_suffix(']'))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| NsUnmountError::BadNamespace {
            target: target.clone(),
            ns: ns.to_string(),
        })?;
    let path = PathBuf::from(format!("/proc/{pid}/ns/mnt"));
    let file = std::fs::File::open(&path).map_err(|source| NsUnmountError::OpenNamespace {
        pid,
        path: path.clone(),
        source,
    })?;
    let stat_err = |source| NsUnmountError::StatNamespace {
        path: path.clone(),
        source,
    };
    let st = nix::sys::stat::fstat(&file).map_err(stat_err)?;
    let fs = nix::sys::statfs::fstatfs(&file).map_err(stat_err)?;
    let is_nsfs = fs.filesystem_type() == nix::sys::statfs::NSFS_MAGIC;
    if !is_nsfs || st.st_ino != expected_ino {
        return Err(NsUnmountError::HolderLeft {
            target,
            pid,
            expected: ns.to_string(),
            found: if is_nsfs {
                format!("mnt:[{}]", st.st_ino)
            } else {
                format!("(not a namespace: {} is no nsfs file)", path.display())
            },
        });
    }
    // The inode number is handed out again as soon as a namespace is
    // freed: the id (never reused) tells the scan's, where the scan has it.
    if m.ns_id != 0 {
        let found_id = ns_mounts::id_of(&file).map_err(stat_err)?;
        if found_id != m.ns_id {
            return Err(NsUnmountError::NamespaceReplaced {
                target,
                pid,
                ns: ns.to_string(),
                scan_id: m.ns_id,
                found_id,
            });
        }
    }
    // Everything the child needs is made here: it only makes system calls.
    let Ok(target_c) = CString::new(target.as_os_str().as_bytes()) else {
        return Err(NsUnmountError::CannotState {
            target,
            pid,
            ns: ns.to_string(),
            errno: Errno::EINVAL,
        });
    };
    let split = (target.parent(), target.file_name());
    let (Some(dir), Some(name)) = split else {
        return Err(NsUnmountError::CannotState {
            target,
            pid,
            ns: ns.to_string(),
            errno: Errno::EINVAL,
        });
    };
    let (Ok(dir), Ok(name)) = (
        CString::new(dir.as_os_str().as_bytes()),
        CString::new(name.as_bytes()),
    ) else {
        return Err(NsUnmountError::CannotState {
            target,
            pid,
            ns: ns.to_string(),
            errno: Errno::EINVAL,
        });
    };
    let want = Want {
        target: target_c,
        dir,
        name,
        source: m.source.as_bytes().to_vec(),
        old_id: m.mount_id,
        unique_id: m.unique_id,
    };
    let mut buf = vec![0u64; (HEADER + 4096) / 8];
    // The child's errno, for the error text.
    let (err_r, err_w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(NsUnmountError::Fork)?;
    #[cfg(test)]
    let between = tests::Between::take();
    // SAFETY: the child allocates nothing and takes no lock (sound even
    // beside other threads, as in the unit tests; reap itself is
    // single-threaded): it only makes system calls (setns, openat2,
    // fchdir, statx, statmount, umount2; read and write in tests) on
    // memory made before the fork, compares bytes at offsets inside that
    // memory (no panic), and calls _exit.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            let none = Errno::UnknownErrno;
            let (code, errno) = match nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNS)
            {
                Err(e) => (EXIT_SETNS, e),
                Ok(()) => match enter_dir(&want).and_then(|()| is_wanted_mount(&want, &mut buf)) {
                    // A symlink or nothing where the path's directories
                    // were: not the mount.
                    Err(e @ (Errno::ELOOP | Errno::ENOENT | Errno::ENOTDIR)) => {
                        (EXIT_NOT_THE_MOUNT, e)
                    }
                    Err(e) => (EXIT_CANNOT_STATE, e),
                    Ok(false) => (EXIT_NOT_THE_MOUNT, none),
                    Ok(true) => {
                        #[cfg(test)]
                        if let Some(b) = &between {
                            b.child_waits();
                        }
                        // The name in the directory the child is in, the
                        // one checked: what the path's directories became
                        // since (renamed, a symlink) is not looked up again.
                        // SAFETY: `want.name` is NUL-terminated and lives
                        // for the call.
                        let rc = unsafe {
                            libc::umount2(
                                want.name.as_ptr(),
                                libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW,
                            )
                        };
                        if rc == 0 {
                            (EXIT_UNMOUNTED, none)
                        } else {
                            (EXIT_UMOUNT, Errno::last())
                        }
                    }
                },
            };
            let word = (errno as i32).to_ne_bytes();
            // SAFETY: writes the 4 bytes of `word` into the pipe made
            // before the fork (async-signal-safe; a short write only loses
            // the error text).
            unsafe { libc::write(err_w.as_raw_fd(), word.as_ptr().cast(), word.len()) };
            // SAFETY: _exit ends the child without running parent state's destructors.
            unsafe { libc::_exit(code) }
        }
        Ok(ForkResult::Parent { child }) => {
            let ns = ns.to_string();
            #[cfg(test)]
            if let Some(b) = between {
                b.parent_runs();
            }
            drop(err_w);
            #[cfg(test)]
            let wait = tests::WAIT
                .with(std::cell::Cell::get)
                .unwrap_or(UNMOUNT_WAIT);
            #[cfg(not(test))]
            let wait = UNMOUNT_WAIT;
            let status = match wait_bounded(child, wait) {
                Waited::Ended(status) => status,
                Waited::Killed { reaped } => {
                    return Err(NsUnmountError::TimedOut {
                        target,
                        pid,
                        ns,
                        child: child.as_raw(),
                        wait,
                        reaped,
                    })
                }
                Waited::NoPidfd(errno) => {
                    return Err(NsUnmountError::Unbounded {
                        target,
                        pid,
                        ns,
                        child: child.as_raw(),
                        errno,
                    })
                }
            };
            let mut word = [0u8; 4];
            let errno = match nix::unistd::read(&err_r, &mut word) {
                Ok(4) => Errno::from_raw(i32::from_ne_bytes(word)),
                _ => Errno::UnknownErrno,
            };
            match status {
                Ok(WaitStatus::Exited(_, EXIT_UNMOUNTED)) => Ok(()),
                Ok(WaitStatus::Exited(_, EXIT_SETNS)) => Err(NsUnmountError::Enter {
                    target,
                    pid,
                    ns,
                    errno,
                }),
                Ok(WaitStatus::Exited(_, EXIT_NOT_THE_MOUNT)) => Err(NsUnmountError::NotTheMount {
                    target,
                    pid,
                    ns,
                    mount_source: m.source.clone(),
                    id: match (m.unique_id, m.mount_id) {
                        (0, 0) => String::new(),
                        (0, old) => format!(", mountinfo id {old}"),
                        (id, old) => format!(", unique mount id {id}, mountinfo id {old}"),
                    },
                    found: match errno {
                        Errno::ELOOP => ": a symlink is in the path now".into(),
                        Errno::ENOENT | Errno::ENOTDIR => ": nothing is at the path now".into(),
                        _ => ": another mount is at the path now".into(),
                    },
                }),
                Ok(WaitStatus::Exited(_, EXIT_CANNOT_STATE)) => Err(NsUnmountError::CannotState {
                    target,
                    pid,
                    ns,
                    errno,
                }),
                Ok(WaitStatus::Exited(_, EXIT_UMOUNT)) => Err(NsUnmountError::UmountFailed {
                    target,
                    pid,
                    ns,
                    errno,
                }),
                status => Err(NsUnmountError::Unmount {
                    target,
                    pid,
                    ns,
                    status,
                }),
            }
        }
        Err(e) => Err(NsUnmountError::Fork(e)),
    }
}

/// How [`wait_bounded`] ended.
enum Waited {
    /// The child ended (reaped): its status.
    Ended(Result<WaitStatus, Errno>),
    /// It did not end in time and was sent `SIGKILL`; `reaped`: it ended
    /// within [`KILL_GRACE`] and was reaped.
    Killed { reaped: bool },
    /// No pidfd to bound the wait with: sent `SIGKILL`, not waited for.
    NoPidfd(Errno),
}

/// Wait for `child` (a child of this process, not reaped yet, so its pid
/// names it alone) to end, at most `wait`: poll on its pidfd (readable
/// once it has ended), then reap it; past `wait`, `SIGKILL` and at most
/// [`KILL_GRACE`] more. Never waits without bound.
fn wait_bounded(child: Pid, wait: Duration) -> Waited {
    use nix::sys::wait::{waitpid, WaitPidFlag};
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1;
    // no memory is passed.
    let rc = unsafe { libc::syscall(libc::SYS_pidfd_open, child.as_raw(), 0) };
    let Ok(fd) = std::os::fd::RawFd::try_from(rc) else {
        return Waited::NoPidfd(Errno::EOVERFLOW);
    };
    if fd < 0 {
        let e = Errno::last();
        // Killed rather than waited for without bound; its zombie is
        // reaped by init once reap has exited.
        let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
        return Waited::NoPidfd(e);
    }
    // SAFETY: `fd` was just returned by pidfd_open and nothing else owns it.
    let pidfd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    let reap = || match waitpid(child, Some(WaitPidFlag::WNOHANG)) {
        // Not ended after all (cannot be: the pidfd was readable).
        Ok(WaitStatus::StillAlive) => None,
        status => Some(status),
    };
    if ended_within(&pidfd, wait) {
        if let Some(status) = reap() {
            return Waited::Ended(status);
        }
    }
    #[cfg(test)]
    tests::AT_TIMEOUT.with(|h| h.borrow().as_ref().map(|f| f(child)));
    // SAFETY: pidfd_send_signal takes the pidfd, a signal, a null siginfo
    // and flags 0; no memory is passed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    };
    if rc != 0 {
        // Still a child of ours, not reaped: the pid is its own.
        let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
    }
    let status = if ended_within(&pidfd, KILL_GRACE) {
        reap()
    } else {
        None
    };
    match status {
        // It ended on its own between the bound and the kill (`SIGKILL`
        // cannot be caught, so an exit is the child's own): what it did is
        // what its status says (it may have unmounted the tmpfs).
        Some(s @ Ok(WaitStatus::Exited(..))) => Waited::Ended(s),
        s => Waited::Killed {
            reaped: s.is_some(),
        },
    }
}

/// Did the process behind `pidfd` end within `wait` (the pidfd polls
/// readable)? An interrupted poll goes on with the time left.
fn ended_within(pidfd: &std::os::fd::OwnedFd, wait: Duration) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let end = Instant::now() + wait;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        let ms = u16::try_from(left.as_nanos().div_ceil(1_000_000)).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(n) if n > 0 => return true,
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => return false,
        }
        if Instant::now() >= end {
            return false;
        }
    }
}

/// What the child looks for at its path, made before the fork.
struct Want {
    target: CString,
    /// `target`'s directory and its last component.
    dir: CString,
    name: CString,
    source: Vec<u8>,
    /// mountinfo's id of the scan's mount (`statmount`'s `mnt_id_old`);
    /// 0: the scan read none.
    old_id: u64,
    /// The kernel's unique id of the scan's mount (never reused, and a
    /// mount is in one namespace only: it also proves the namespace);
    /// 0: the kernel did not state it (before Linux 6.8, or no
    /// enumeration of the namespaces: the `/proc` walk).
    unique_id: u64,
}

use crate::host::statmount_abi::{
    MntIdReq, FS_TYPE, HEADER, MNT_BASIC, MNT_POINT, OFF_FS_TYPE, OFF_MASK, OFF_MNT_ID_OLD,
    OFF_MNT_POINT, OFF_SB_SOURCE, SB_SOURCE, SYS_STATMOUNT,
};

const ASK: u64 = MNT_BASIC | MNT_POINT | FS_TYPE | SB_SOURCE;

/// `struct open_how` (include/uapi/linux/openat2.h).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// Make `want.dir`, resolved in the caller's mount namespace with no
/// symlink followed, the working directory: `want.name` is then looked up
/// in that directory alone, by the check and by the unmount. Allocates
/// nothing.
fn enter_dir(want: &Want) -> Result<(), Errno> {
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: libc::RESOLVE_NO_SYMLINKS,
    };
    // SAFETY: `want.dir` is NUL-terminated and `how` is a valid open_how
    // of the size passed; both live for the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            want.dir.as_ptr(),
            &raw const how,
            size_of::<OpenHow>(),
        )
    };
    let Ok(fd) = libc::c_int::try_from(fd) else {
        return Err(Errno::EOVERFLOW);
    };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: `fd` was just opened here and is closed here.
    let rc = unsafe { libc::fchdir(fd) };
    let e = Errno::last();
    // SAFETY: as above; nothing else holds `fd`.
    unsafe { libc::close(fd) };
    if rc != 0 {
        return Err(e);
    }
    Ok(())
}

/// Is the topmost mount at `want.target`, in the caller's mount namespace,
/// a tmpfs mounted exactly there with the source (and, when known, the
/// unique id and the mountinfo id) the scan reported? Allocates nothing: `buf` is the
/// statmount buffer. An error: the kernel cannot state it.
fn is_wanted_mount(want: &Want, buf: &mut [u64]) -> Result<bool, Errno> {
    // SAFETY: an all-zero statx is a valid value for the kernel to fill.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // `want.name` in the working directory ([`enter_dir`]).
    // SAFETY: `want.name` is NUL-terminated and `stx` is valid for writing.
    let rc = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            want.name.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW | libc::AT_NO_AUTOMOUNT,
            libc::STATX_MNT_ID_UNIQUE,
            &raw mut stx,
        )
    };
    if rc != 0 {
        return match Errno::last() {
            // Nothing there any more: not the mount.
            Errno::ENOENT | Errno::ENOTDIR => Ok(false),
            e => Err(e),
        };
    }
    if stx.stx_mask & libc::STATX_MNT_ID_UNIQUE == 0 {
        return Err(Errno::ENOSYS);
    }
    if want.unique_id != 0 && stx.stx_mnt_id != want.unique_id {
        return Ok(false);
    }
    // The caller's own namespace: the one the child entered.
    let req = MntIdReq::own_ns(stx.stx_mnt_id, ASK);
    let len = size_of_val(buf);
    // SAFETY: `req` is a valid mnt_id_req of the size it states; the
    // kernel writes at most `len` bytes into `buf`, which owns them.
    let rc = unsafe { libc::syscall(SYS_STATMOUNT, &raw const req, buf.as_mut_ptr(), len, 0u32) };
    if rc != 0 {
        return Err(Errno::last());
    }
    // SAFETY: the bytes of `buf` (u8 needs no alignment), borrowed no
    // longer than `buf` is.
    let b = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), len) };
    let u32_at = |off: usize| u32::from_ne_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]]);
    let u64_at = |off: usize| u64::from(u32_at(off)) | (u64::from(u32_at(off + 4)) << 32);
    if u64_at(OFF_MASK) & ASK != ASK {
        return Err(Errno::ENOSYS);
    }
    let str_at = |off: usize| -> Result<&[u8], Errno> {
        let start = HEADER + u32_at(off) as usize;
        let rest = b.get(start..).ok_or(Errno::EOVERFLOW)?;
        let end = rest.iter().position(|c| *c == 0).ok_or(Errno::EOVERFLOW)?;
        Ok(&rest[..end])
    };
    Ok(str_at(OFF_MNT_POINT)? == want.target.as_bytes()
        && str_at(OFF_FS_TYPE)? == b"tmpfs"
        && str_at(OFF_SB_SOURCE)? == want.source.as_slice()
        && (want.old_id == 0 || u64::from(u32_at(OFF_MNT_ID_OLD)) == want.old_id))
}

#[cfg(test)]
mod tests;
