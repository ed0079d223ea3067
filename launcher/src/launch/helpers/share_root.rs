//! Each virtiofsd gets a mount namespace of its own whose root is its
//! share, so that no lookup a guest sends can leave the share whatever
//! virtiofsd does (it runs with `--sandbox=none`, and its own guard,
//! `openat2(RESOLVE_IN_ROOT)`, is probed at start and silently replaced
//! by plain `openat` where the probe fails — under systemd's
//! `RestrictSUIDSGID=` every `openat2` answers ENOSYS). The child, still
//! root, unshares a mount namespace, makes every mount a slave, binds the
//! share onto itself (`nosuid`, `nodev`, read-only for a read-only share)
//! and starts virtiofsd there with the share as its working directory and
//! `--shared-dir=/`. virtiofsd opens `/proc/self/fd` (and `.`) when it
//! starts, so the switch of root comes after that, as virtiofsd's own
//! namespace sandbox orders it: once the launcher sees the share among its
//! fds, a short-lived child of the launcher (root) joins that namespace,
//! `pivot_root`s into the share and detaches the old root. `pivot_root`
//! moves the root of every process of the namespace — virtiofsd's — to the
//! share; the launcher then checks `/proc/PID/root` is the share before it
//! goes on. The guest's first FUSE request comes after that (the
//! hypervisor does not exist yet). In that namespace nothing but the share
//! exists: not `control/` (the hypervisor's QMP socket), not the host.
//!
//! Nor the VM's procfs, through the one descriptor virtiofsd keeps from
//! before the switch: `/proc/self/fd`, which it needs to reopen its own
//! fds. The child binds `/proc/self/fd` onto itself before it execs (the
//! same process: `self` is virtiofsd), so that descriptor is the root of
//! a mount of its own; `pivot_root`'s detach of the old root disconnects
//! that mount with the rest, and `..` at the root of a disconnected mount
//! stays where it is. Without the bind, `..` from it walked up inside the
//! procfs mount to `/proc/net/unix` and `/proc/sys` (virtiofsd's own
//! namespace sandbox makes the same bind for the same reason). The only
//! entries left behind that descriptor are virtiofsd's own fds.

use std::path::{Path, PathBuf};
use std::time::Instant;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{ForkResult, Pid};

use crate::host::sys::{SysContext, SysError};
use crate::launch::sandbox;
use crate::launch::syscall::Syscall;

use super::{poll_while_alive, timeout, Ended, Helper, HelperError};

/// The helper child's own mount namespace (as root, before the drop): every
/// mount a slave (nothing made here reaches the VM's namespace or the
/// host), and the share bound onto itself, `nosuid` and `nodev`, read-only
/// for a read-only share: the mount that becomes its root.
pub(super) fn share_namespace(
    sys: &dyn Syscall,
    share: &Path,
    read_only: bool,
) -> Result<(), SysError> {
    use nix::mount::MsFlags;
    use nix::sched::CloneFlags;
    sys.unshare(CloneFlags::CLONE_NEWNS)
        .sys("unshare(CLONE_NEWNS) for the helper", share)?;
    sys.mount(
        None,
        Path::new("/"),
        None,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None,
    )
    .sys("mount --make-rslave", "/")?;
    sys.mount(
        Some(&*share.to_string_lossy()),
        share,
        None,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None,
    )
    .sys("bind the share onto itself", share)?;
    let ro = if read_only {
        MsFlags::MS_RDONLY
    } else {
        MsFlags::empty()
    };
    sandbox::remount_nosuid(sys, share, ro).map_err(|e| SysError {
        op: "remount the share nosuid,nodev",
        path: share.to_path_buf(),
        errno: match e {
            sandbox::SandboxError::Sys(s) => s.errno,
            _ => Errno::EINVAL,
        },
    })?;
    // The fd directory virtiofsd opens at start, made the root of a mount
    // of its own (see the module docs): `..` from it cannot leave it once
    // the old root is detached.
    sys.mount(
        Some(PROC_SELF_FD),
        Path::new(PROC_SELF_FD),
        None,
        MsFlags::MS_BIND,
        None,
    )
    .sys("bind /proc/self/fd onto itself", PROC_SELF_FD)?;
    Ok(())
}

/// What virtiofsd opens to reopen its own fds (`PassthroughFs::new`).
const PROC_SELF_FD: &str = "/proc/self/fd";

/// Make the share virtiofsd's root (see the module docs): wait until it
/// has opened its working directory (the share: by then it holds
/// `/proc/self/fd` too), then `pivot_root` its namespace into the share
/// from a child of the launcher, and check `/proc/PID/root` is the share.
pub(super) fn confine_to_share(
    h: &Helper,
    pid: Pid,
    share: &Path,
    t0: Instant,
) -> Result<(), HelperError> {
    let fail = |detail: String| HelperError::Confine {
        helper: h.name(),
        binary: h.binary.clone(),
        share: share.to_path_buf(),
        detail,
    };
    let want = nix::sys::stat::stat(share).map_err(|e| fail(format!("stat: {e}")))?;
    let same = |st: &nix::sys::stat::FileStat| (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino);
    let fds = PathBuf::from(format!("/proc/{pid}/fd"));
    let opened = || {
        std::fs::read_dir(&fds).ok().is_some_and(|rd| {
            rd.flatten()
                .any(|e| nix::sys::stat::stat(&e.path()).is_ok_and(|st| same(&st)))
        })
    };
    match poll_while_alive(pid, t0, opened) {
        Ok(()) => {}
        Err(Ended::Exited(status)) => {
            return Err(HelperError::Exited {
                helper: h.name(),
                binary: h.binary.clone(),
                socket: h.socket().map(Path::to_path_buf).unwrap_or_default(),
                status: format!("{status:?}"),
            })
        }
        Err(Ended::WaitFailed(e)) => return Err(fail(format!("waitpid: {e}"))),
        Err(Ended::TimedOut) => return Err(timeout(h, "did not open its share".into())),
    }
    pivot_in(pid, share).map_err(fail)?;
    let root = nix::sys::stat::stat(&*format!("/proc/{pid}/root"))
        .map_err(|e| fail(format!("stat /proc/{pid}/root: {e}")))?;
    if !same(&root) {
        return Err(fail(format!(
            "after pivot_root its root (/proc/{pid}/root) is not the share"
        )));
    }
    Ok(())
}

/// In a child of the launcher (root): join `pid`'s mount namespace,
/// `pivot_root` into `share` (a mount there: the helper bound it) and
/// detach the old root. Every process of that namespace whose root was
/// the old one now has the share.
fn pivot_in(pid: Pid, share: &Path) -> Result<(), String> {
    use nix::mount::{umount2, MntFlags};
    let ns = nix::fcntl::open(
        &*format!("/proc/{pid}/ns/mnt"),
        OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("open /proc/{pid}/ns/mnt: {e}"))?;
    let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("pipe2: {e}"))?;
    // SAFETY: the launcher is single-threaded (the helper's start checked
    // it and nothing since started a thread), so the child is a complete
    // copy; it runs only the calls below and `_exit`s.
    match unsafe { nix::unistd::fork() }.map_err(|e| format!("fork: {e}"))? {
        ForkResult::Child => {
            drop(r);
            let run = || -> Result<(), String> {
                nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNS)
                    .map_err(|e| format!("setns: {e}"))?;
                nix::unistd::chdir(share).map_err(|e| format!("chdir: {e}"))?;
                nix::unistd::pivot_root(".", ".").map_err(|e| format!("pivot_root: {e}"))?;
                umount2(".", MntFlags::MNT_DETACH)
                    .map_err(|e| format!("umount the old root: {e}"))?;
                nix::unistd::chdir("/").map_err(|e| format!("chdir /: {e}"))?;
                Ok(())
            };
            let code = match run() {
                Ok(()) => 0,
                Err(msg) => {
                    let _ = nix::unistd::write(&w, msg.as_bytes());
                    1
                }
            };
            // SAFETY: _exit ends this forked child at once, without running
            // the parent's atexit handlers or flushing its buffers twice.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => {
            drop(w);
            let mut msg = Vec::new();
            let mut buf = [0u8; 512];
            loop {
                match nix::unistd::read(&r, &mut buf) {
                    Ok(0) => break,
                    Ok(n) => msg.extend_from_slice(&buf[..n]),
                    Err(Errno::EINTR) => {}
                    Err(e) => return Err(format!("read: {e}")),
                }
            }
            let status = waitpid(child, None).map_err(|e| format!("waitpid: {e}"))?;
            match (status, msg.is_empty()) {
                (WaitStatus::Exited(_, 0), true) => Ok(()),
                (_, false) => Err(String::from_utf8_lossy(&msg).into_owned()),
                (status, true) => Err(format!("the pivot child ended {status:?}")),
            }
        }
    }
}
