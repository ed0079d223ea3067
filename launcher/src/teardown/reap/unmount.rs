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
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use nix::errno::Errno;
use nix::sys::wait::WaitStatus;

use crate::host::mountinfo::Mount;
use crate::host::ns_mounts;

/// The child's exit codes (anything else: it died otherwise).
const EXIT_UNMOUNTED: i32 = 0;
const EXIT_SETNS: i32 = 1;
const EXIT_UMOUNT: i32 = 2;
const EXIT_NOT_THE_MOUNT: i32 = 3;
const EXIT_CANNOT_STATE: i32 = 4;

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
/// No pidfd: the check is on the namespace's open file, which pins the
/// namespace whatever the pid names later, and it is that file the child
/// enters. A pidfd would tell only that the process behind the pid did not
/// change after it was opened, not that it is the scan's.
pub(crate) fn in_namespace(pid: u32, ns: &str, m: &Mount) -> Result<(), NsUnmountError> {
    use nix::sys::wait::waitpid;
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
            let status = waitpid(child, None);
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
