//! The broker of a share the guest owns: setgid directories, and never a
//! set-group-ID file.
//!
//! The guest's `chmod g+s` must work on its directories (journald's
//! `/var/log/journal` is 2755, and what is made in it takes its group), and
//! no regular file on the host may carry a set-id bit. virtiofsd makes
//! both kinds of change the same way (`fchmodat(proc_self_fd, "N", …)`),
//! so no filter on its arguments can tell them apart. Its filter
//! ([`crate::launch::seccomp::notify`]) hands every set-group-ID `chmod`
//! to this process instead, which:
//!
//! * reads what the call names: the fd (`pidfd_getfd`) and, for the
//!   path-taking calls, the path (`process_vm_readv`, at most `PATH_MAX`
//!   bytes), then checks the notification is still pending
//!   (`SECCOMP_IOCTL_NOTIF_ID_VALID`), so the pid it read from was the
//!   caller's;
//! * opens the target itself with `O_DIRECTORY` (`O_NOFOLLOW` for
//!   `AT_SYMLINK_NOFOLLOW`), relative to that fd, in virtiofsd's mount
//!   namespace (rooted in the share): a file is refused (EPERM) by the
//!   open itself, so whatever the caller's memory or fd table says by
//!   the time of the change, the change is made on the directory it
//!   opened;
//! * makes the change there (`fchmod`) and answers with its result. A
//!   set-user-ID bit is refused (EPERM), as it is by the filter.
//!
//! It is virtiofsd's peer: forked by the launcher once virtiofsd has
//! `exec`'d and been rooted in its share, it joins virtiofsd's mount and
//! user namespaces (as root, before anything else), becomes that
//! namespace's root with the four capabilities of [`BROKER_CAPS`] (there
//! only: no process outside that namespace is within their reach), sets
//! `no_new_privs` and the death signal, and keeps only the listener,
//! virtiofsd's pidfd and the lease. Its filters: every helper's (as
//! [`crate::launch::seccomp::Role::Broker`]: no process, and
//! `process_vm_readv` and `pidfd_getfd` allowed), then an allowlist of
//! the calls its loop makes, any other killing it
//! (`seccomp::notify::broker_allowlist`): no socket, no `exec`, no file
//! but the share's (the only file system its mount namespace has). It has
//! no Landlock domain: Landlock lets a process in a domain read another's
//! memory only if the other is in a domain below its own, and virtiofsd's
//! is its own; the allowlist confines it more narrowly than a domain
//! would. It parses nothing the guest sends: only what virtiofsd's filter
//! stopped. When virtiofsd is gone the listener hangs up and it
//! exits; if it is gone first, virtiofsd's set-group-ID calls fail
//! (ENOSYS), which is the closed way to fail.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::time::Instant;

use caps::Capability;
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sched::CloneFlags;
use nix::sys::signal::Signal;
use nix::sys::stat::Mode;
use nix::sys::wait::waitpid;
use nix::unistd::{ForkResult, Pid};

/// The broker's capabilities, in virtiofsd's user namespace only: open
/// any directory there (`DAC_READ_SEARCH`), change the mode of one it does
/// not own (`FOWNER`) and keep its set-group-ID bit whatever its group
/// (`FSETID`), read virtiofsd's memory and fds (`SYS_PTRACE`: virtiofsd is
/// not dumpable once its threads have taken a guest's ids, and only this
/// capability in its namespace then lets another process read it).
pub const BROKER_CAPS: &[Capability] = &[
    Capability::CAP_DAC_READ_SEARCH,
    Capability::CAP_FOWNER,
    Capability::CAP_FSETID,
    Capability::CAP_SYS_PTRACE,
];
use super::{owned, wait_started, Context, Helper, HelperError};
use crate::launch::{sandbox, seccomp};

/// `PATH_MAX`: the longest path a call may name.
const PATH_MAX: usize = 4096;
const PAGE: u64 = 4096;

/// Start the broker of virtiofsd `v` (see the module docs); `listener` is
/// the fd of virtiofsd's filter. Returns its pid once it is ready.
pub(super) fn start(
    h: &Helper,
    v: Pid,
    listener: OwnedFd,
    ctx: &Context<'_>,
    t0: Instant,
) -> Result<Pid, HelperError> {
    let setup = |detail: String| HelperError::Setup {
        helper: broker_name(h),
        binary: h.binary.clone(),
        detail,
    };
    let mut progs = seccomp::programs_as(seccomp::Taps::Inherited, seccomp::Role::Broker)
        .map_err(|e| setup(e.to_string()))?;
    progs.push(seccomp::notify::broker_allowlist().map_err(|e| setup(e.to_string()))?);
    let (status_r, status_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
        .map_err(|e| setup(format!("pipe2: {e}")))?;
    let open_ns = |what: &str| {
        nix::fcntl::open(
            &*format!("/proc/{v}/ns/{what}"),
            OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| setup(format!("open /proc/{v}/ns/{what}: {e}")))
    };
    let (mnt, user) = (open_ns("mnt")?, open_ns("user")?);
    let pidfd = pidfd_open(v).map_err(|e| setup(format!("pidfd_open({v}): {e}")))?;
    let parent = nix::unistd::getpid();
    ctx.sys
        .assert_single_threaded()
        .map_err(|e| setup(e.to_string()))?;
    // SAFETY: the launcher is single-threaded (checked just above), so the
    // child is a complete copy; it runs only the launcher's own code and
    // `_exit`s.
    match unsafe { nix::unistd::fork() }.map_err(|e| setup(format!("fork: {e}")))? {
        ForkResult::Child => {
            drop(status_r);
            let lease = ctx.lease.inherit_across_exec().ok();
            let err = match child(ctx, parent, &mnt, &user, &progs, || {
                let keep = [
                    listener.as_raw_fd(),
                    pidfd.as_raw_fd(),
                    status_w.as_raw_fd(),
                    lease.unwrap_or(-1),
                ];
                sandbox::close_all_but(&keep)
            }) {
                Ok(()) => {
                    drop(status_w);
                    serve(&listener, &pidfd);
                    // SAFETY: _exit ends this forked child at once.
                    unsafe { libc::_exit(0) }
                }
                Err(e) => e,
            };
            let _ = nix::unistd::write(&status_w, err.as_bytes());
            // SAFETY: _exit ends this forked child at once, without running
            // the parent's atexit handlers or flushing its buffers twice.
            unsafe { libc::_exit(127) }
        }
        ForkResult::Parent { child } => {
            drop(status_w);
            drop(listener);
            if let Err(e) = wait_started(h, child, status_r, t0) {
                let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
                let _ = waitpid(child, None);
                // Its errors name it as the share's virtiofsd's broker.
                return Err(match e {
                    HelperError::Setup { detail, binary, .. } => HelperError::Setup {
                        helper: broker_name(h),
                        binary,
                        detail,
                    },
                    HelperError::Timeout {
                        binary, what, secs, ..
                    } => HelperError::Timeout {
                        helper: broker_name(h),
                        binary,
                        what,
                        secs,
                    },
                    e => e,
                });
            }
            Ok(child)
        }
    }
}

fn broker_name(h: &Helper) -> String {
    format!("{} (its broker)", h.name())
}

/// The child's way into virtiofsd's namespaces and its own confinement.
fn child(
    ctx: &Context<'_>,
    parent: Pid,
    mnt: &OwnedFd,
    user: &OwnedFd,
    progs: &[seccompiler::BpfProgram],
    close: impl FnOnce() -> Result<(), String>,
) -> Result<(), String> {
    nix::sched::setns(mnt, CloneFlags::CLONE_NEWNS).map_err(|e| format!("setns(mnt): {e}"))?;
    nix::sched::setns(user, CloneFlags::CLONE_NEWUSER).map_err(|e| format!("setns(user): {e}"))?;
    close()?;
    owned::become_root_keeping(ctx.sys, BROKER_CAPS)?;
    nix::sys::prctl::set_pdeathsig(Some(Signal::SIGKILL))
        .map_err(|e| format!("prctl(PR_SET_PDEATHSIG): {e}"))?;
    if nix::unistd::getppid() != parent {
        return Err("the launcher died while the broker was starting".into());
    }
    // SAFETY: prctl(PR_SET_NAME) reads a NUL-terminated name of at most
    // 16 bytes; the literal is both.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"vmwarden-broker".as_ptr(), 0, 0, 0) };
    seccomp::apply(ctx.sys, progs).map_err(|e| e.to_string())?;
    Ok(())
}

fn pidfd_open(pid: Pid) -> Result<OwnedFd, Errno> {
    // SAFETY: pidfd_open takes a pid and flags; the result is checked.
    let fd = Errno::result(unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) })?;
    let fd = i32::try_from(fd).map_err(|_| Errno::EBADF)?;
    // SAFETY: a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Answer notifications until virtiofsd is gone.
fn serve(listener: &OwnedFd, pidfd: &OwnedFd) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    loop {
        let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(Errno::EINTR) => continue,
            Err(_) => return,
        }
        let rev = fds[0].revents().unwrap_or(PollFlags::empty());
        if rev.intersects(PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL) {
            return;
        }
        // SAFETY: an all-zero seccomp_notif is what RECV requires.
        let mut n: libc::seccomp_notif = unsafe { std::mem::zeroed() };
        // SAFETY: the ioctl writes one seccomp_notif into `n`, which is
        // that struct and lives across the call.
        let rc = unsafe {
            libc::ioctl(
                listener.as_raw_fd(),
                libc::SECCOMP_IOCTL_NOTIF_RECV,
                &raw mut n,
            )
        };
        match Errno::result(rc) {
            Ok(_) => {}
            Err(Errno::EINTR | Errno::ENOENT) => continue,
            Err(_) => return,
        }
        let error = match decide(&n, listener, pidfd) {
            Ok(()) => 0,
            Err(Errno::UnknownErrno) => continue, // no longer pending
            Err(e) => -(e as i32),
        };
        let resp = libc::seccomp_notif_resp {
            id: n.id,
            val: 0,
            error,
            flags: 0,
        };
        // SAFETY: the ioctl reads one seccomp_notif_resp, alive across it.
        let _ = unsafe {
            libc::ioctl(
                listener.as_raw_fd(),
                libc::SECCOMP_IOCTL_NOTIF_SEND,
                &raw const resp,
            )
        };
    }
}

/// The notification's call, made by the broker if it may be: `Ok` or the
/// errno to answer; `UnknownErrno` when it is no longer pending.
fn decide(n: &libc::seccomp_notif, listener: &OwnedFd, pidfd: &OwnedFd) -> Result<(), Errno> {
    let nr = i64::from(n.data.nr);
    let a = n.data.args;
    #[cfg(target_arch = "x86_64")]
    let chmod = nr == libc::SYS_chmod;
    #[cfg(not(target_arch = "x86_64"))]
    let chmod = false;
    // (fd or dirfd, path, mode, flags) of the call.
    let (fd, path, mode, flags) = if chmod {
        (None, Some(a[0]), a[1], 0)
    } else if nr == libc::SYS_fchmod {
        (Some(a[0]), None, a[1], libc::AT_EMPTY_PATH as u64)
    } else if nr == libc::SYS_fchmodat {
        (Some(a[0]), Some(a[1]), a[2], 0)
    } else if nr == seccomp::SYS_FCHMODAT2 {
        (Some(a[0]), Some(a[1]), a[2], a[3])
    } else {
        return Err(Errno::ENOSYS);
    };
    let mode = (mode & 0o7777) as u32;
    if u64::from(mode) & seccomp::S_ISUID != 0 {
        return Err(Errno::EPERM);
    }
    let path = match path {
        Some(addr) => read_path(n.pid, addr)?,
        None => CString::default(),
    };
    // The pid read from was the caller's, and still is: it is pending.
    // SAFETY: the ioctl reads one u64, alive across the call.
    let rc = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_ID_VALID,
            &raw const n.id,
        )
    };
    if rc != 0 {
        return Err(Errno::UnknownErrno);
    }
    let base: Option<OwnedFd> = match fd {
        Some(f) if (f as i32) == libc::AT_FDCWD && !path.is_empty() => None,
        Some(f) => Some(getfd(pidfd, f as i32)?),
        None => None,
    };
    let nofollow = flags & libc::AT_SYMLINK_NOFOLLOW as u64 != 0;
    let empty = flags & libc::AT_EMPTY_PATH as u64 != 0;
    let dir = if path.is_empty() {
        // fchmod(fd) or AT_EMPTY_PATH: the fd itself.
        let Some(b) = base.as_ref() else {
            return Err(Errno::ENOENT);
        };
        if !empty {
            return Err(Errno::ENOENT);
        }
        let fl = nix::fcntl::fcntl(b, nix::fcntl::FcntlArg::F_GETFL)?;
        if OFlag::from_bits_truncate(fl).contains(OFlag::O_PATH) && nr == libc::SYS_fchmod {
            return Err(Errno::EBADF);
        }
        reopen_dir(b, c".", false)?
    } else {
        match &base {
            Some(b) => reopen_dir(b, &path, nofollow)?,
            None => {
                let cwd = nix::fcntl::open(".", OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty())?;
                reopen_dir(&cwd, &path, nofollow)?
            }
        }
    };
    nix::sys::stat::fchmod(&dir, Mode::from_bits_truncate(mode))
}

/// `path` under `base`, opened as a directory: EPERM for anything else
/// (a set-group-ID bit is for directories only).
fn reopen_dir(base: &OwnedFd, path: &std::ffi::CStr, nofollow: bool) -> Result<OwnedFd, Errno> {
    let mut fl = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    if nofollow {
        fl |= OFlag::O_NOFOLLOW;
    }
    match nix::fcntl::openat(base, path, fl, Mode::empty()) {
        Ok(fd) => Ok(fd),
        Err(Errno::ENOTDIR | Errno::ELOOP) => Err(Errno::EPERM),
        Err(e) => Err(e),
    }
}

/// A copy of fd `fd` of the process behind `pidfd`.
fn getfd(pidfd: &OwnedFd, fd: i32) -> Result<OwnedFd, Errno> {
    // SAFETY: pidfd_getfd takes a pidfd, an fd number and flags; the
    // result is checked.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    let r = i32::try_from(Errno::result(r)?).map_err(|_| Errno::EBADF)?;
    // SAFETY: a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

/// The NUL-terminated string at `addr` in task `tid`'s memory, read a
/// page at a time (a string may end right before an unmapped page).
fn read_path(tid: u32, addr: u64) -> Result<CString, Errno> {
    let pid = Pid::from_raw(i32::try_from(tid).map_err(|_| Errno::ESRCH)?);
    let mut out: Vec<u8> = Vec::new();
    let mut at = addr;
    while out.len() < PATH_MAX {
        let chunk = usize::try_from(PAGE - at % PAGE)
            .unwrap_or(1)
            .min(PATH_MAX - out.len());
        let mut buf = vec![0u8; chunk];
        let remote = nix::sys::uio::RemoteIoVec {
            base: usize::try_from(at).map_err(|_| Errno::EFAULT)?,
            len: chunk,
        };
        let n = nix::sys::uio::process_vm_readv(
            pid,
            &mut [std::io::IoSliceMut::new(&mut buf)],
            &[remote],
        )?;
        if n == 0 {
            return Err(Errno::EFAULT);
        }
        if let Some(end) = buf[..n].iter().position(|b| *b == 0) {
            out.extend_from_slice(&buf[..end]);
            return CString::new(out).map_err(|_| Errno::EINVAL);
        }
        out.extend_from_slice(&buf[..n]);
        at += n as u64;
    }
    Err(Errno::ENAMETOOLONG)
}
