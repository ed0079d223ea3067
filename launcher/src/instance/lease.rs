//! The instance lease: `RUNTIME/NAME/instance.lock`, an exclusive `flock`
//! taken by the launcher and inherited through `execve`, so the hypervisor
//! holds it for exactly as long as it lives. Held ⇒ live.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;

use nix::errno::Errno;
use nix::fcntl::{fcntl, openat, FcntlArg, FdFlag, Flock, FlockArg, OFlag};
use nix::sys::stat::{fchmod, fstat, fstatat, FileStat, Mode, SFlag};

use crate::config::paths::LEASE_FILE;
use crate::host::dirs::Dir;
use crate::host::sys::{SysContext, SysError};

/// A lease file that is refused, or a lock call that failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("{path}: refused: is a symlink")]
    Symlink { path: PathBuf },
    #[error("{path}: refused: is not a regular file")]
    NotARegularFile { path: PathBuf },
    #[error("{path}: refused: is owned by uid {uid}, expected root")]
    NotRootOwned { path: PathBuf, uid: u32 },
    #[error("{path}: refused: kept changing while the lease was being taken")]
    Unstable { path: PathBuf },
    #[error(transparent)]
    Sys(#[from] SysError),
}

impl LeaseError {
    /// A lease file refused (`EX_CONFIG`).
    pub fn is_refusal(&self) -> bool {
        !matches!(self, LeaseError::Sys(_))
    }
}

type Result<T, E = LeaseError> = std::result::Result<T, E>;

/// A held lease. Dropping it releases the lock (error paths); `execve`
/// hands it to the hypervisor (see [`Lease::inherit_across_exec`]).
#[derive(Debug)]
pub struct Lease {
    lock: Flock<File>,
    pub path: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// No lease file.
    Absent,
    /// The file exists and nobody holds the lock.
    Free,
    /// Somebody (the hypervisor, or a launcher mid-way) holds it.
    Held,
}

/// Refuse anything but a root-owned regular file, tighten its mode; returns
/// its stat.
fn check_lock_file(path: &PathBuf, file: &File) -> Result<FileStat> {
    let st = fstat(file.as_fd()).sys("fstat", path)?;
    if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFREG {
        return Err(LeaseError::NotARegularFile { path: path.clone() });
    }
    if st.st_uid != 0 {
        return Err(LeaseError::NotRootOwned {
            path: path.clone(),
            uid: st.st_uid,
        });
    }
    if st.st_mode & 0o7777 != 0o600 {
        fchmod(file.as_fd(), Mode::from_bits_truncate(0o600)).sys("fchmod", path)?;
    }
    Ok(st)
}

/// `LOCK_EX|LOCK_NB`, retried briefly: read-only probes ([`state`]) hold a
/// shared lock for microseconds, and must not make a launch or a cleanup
/// think the VM is running.
fn lock_exclusive_retrying(mut file: File) -> std::result::Result<Flock<File>, Errno> {
    for _ in 0..20 {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => return Ok(l),
            Err((f, Errno::EWOULDBLOCK)) => {
                file = f;
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Err((_, e)) => return Err(e),
        }
    }
    Err(Errno::EWOULDBLOCK)
}

impl Lease {
    /// Take the lease, or `Ok(None)` when it is held elsewhere. After the lock
    /// the path is re-checked to still name the locked inode, so a concurrent
    /// unlink and re-create cannot give two holders two different files.
    pub fn acquire(rundir: &Dir) -> Result<Option<Lease>> {
        let path = rundir.path.join(LEASE_FILE);
        for _ in 0..8 {
            let fd = match openat(
                rundir.fd.as_fd(),
                LEASE_FILE,
                // Read-only: the hypervisor inherits this fd and must not be
                // able to write to a root-owned file on /run. Non-blocking:
                // a FIFO planted here is refused below, not waited on.
                OFlag::O_RDONLY
                    | OFlag::O_CREAT
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_NONBLOCK
                    | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o600),
            ) {
                Err(Errno::ELOOP) => return Err(LeaseError::Symlink { path }),
                r => r.sys("open lease", &path)?,
            };
            let file = File::from(fd);
            // The locked inode: an open fd's inode never changes, so the
            // stat taken before the lock names it.
            let held = check_lock_file(&path, &file)?;
            let lock = match lock_exclusive_retrying(file) {
                Ok(l) => l,
                Err(Errno::EWOULDBLOCK) => return Ok(None),
                Err(e) => return Err(e).sys("flock", &path).map_err(Into::into),
            };
            match fstatat(
                rundir.fd.as_fd(),
                LEASE_FILE,
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            ) {
                Ok(now) if now.st_dev == held.st_dev && now.st_ino == held.st_ino => {
                    return Ok(Some(Lease { lock, path }))
                }
                // Replaced or removed under us: try again on the new file.
                Ok(_) | Err(Errno::ENOENT) => continue,
                Err(e) => return Err(e).sys("fstatat", &path).map_err(Into::into),
            }
        }
        Err(LeaseError::Unstable { path })
    }

    /// A lease on `path` without [`Lease::acquire`]'s root-owner check:
    /// the launch's unit tests run without root.
    #[cfg(test)]
    pub(crate) fn acquire_unchecked_for_tests(path: PathBuf) -> Lease {
        let file = File::create(&path).expect("create lease file");
        let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock).expect("flock");
        Lease { lock, path }
    }

    /// Clear close-on-exec so the hypervisor inherits the lock.
    pub fn inherit_across_exec(&self) -> Result<i32> {
        let fd = self.lock.as_raw_fd();
        fcntl(self.lock.as_fd(), FcntlArg::F_SETFD(FdFlag::empty()))
            .sys("fcntl F_SETFD", &self.path)?;
        Ok(fd)
    }

    pub fn raw_fd(&self) -> i32 {
        self.lock.as_raw_fd()
    }
}

/// Probe the lease without taking it for longer than the probe.
pub fn state(rundir: &Dir) -> Result<LeaseState> {
    let path = rundir.path.join(LEASE_FILE);
    let fd = match openat(
        rundir.fd.as_fd(),
        LEASE_FILE,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        Mode::empty(),
    ) {
        Err(Errno::ENOENT) => return Ok(LeaseState::Absent),
        Err(Errno::ELOOP) => return Err(LeaseError::Symlink { path }),
        r => r.sys("open lease", &path)?,
    };
    let file = File::from(fd);
    match Flock::lock(file, FlockArg::LockSharedNonblock) {
        Ok(_unlocked_on_drop) => Ok(LeaseState::Free),
        Err((_, Errno::EWOULDBLOCK)) => Ok(LeaseState::Held),
        Err((_, e)) => Err(e).sys("flock", &path).map_err(Into::into),
    }
}

/// Take the lease for a teardown: the same exclusive lock the launcher takes,
/// so no launch can start while cleanup deletes. `Ok(None)` when held.
pub fn acquire_for_teardown(rundir: &Dir) -> Result<Option<Lease>> {
    Lease::acquire(rundir)
}
