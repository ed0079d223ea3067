//! The wait for a [`Root::OwnSandbox`](super::Root::OwnSandbox) helper
//! (passt): started in the VM's mount namespace with the launcher's
//! sandbox, it makes one of its own before it serves anything (a user
//! namespace, a mount namespace whose root is an empty read-only tmpfs,
//! then its own seccomp filter). The hypervisor, and so the guest, must
//! not exist before it has: the launcher polls `/proc/PID/status` until the
//! helper runs under more seccomp filters than it was started with (its
//! `Seccomp_filters`, Linux 5.9 or later), then
//! checks that its root (`/proc/PID/root`) is no longer the VM's and is
//! empty. Its exit first, or a root that is still the VM's, fails the
//! launch naming it.

use std::path::Path;
use std::time::Instant;

use nix::unistd::Pid;

use crate::host::sys::read_path;

use super::{poll_while_alive, timeout, Ended, Helper, HelperError};

/// Wait until `pid` (helper `h`, started under `ours` seccomp programs)
/// has sandboxed itself, and check that it has.
pub(super) fn wait(h: &Helper, pid: Pid, ours: usize, t0: Instant) -> Result<(), HelperError> {
    // The helper inherited the launcher's filters (a supervisor's, such as
    // systemd's) and got `ours` on top.
    let started = filters(Path::new("/proc/self/status")).ok_or_else(|| {
        not_sandboxed(
            h,
            "/proc/self/status has no Seccomp_filters (Linux 5.9 or later has)".into(),
        )
    })? + ours;
    let status = format!("/proc/{pid}/status");
    let sandboxed = || filters(Path::new(&status)).is_some_and(|n| n > started);
    match poll_while_alive(pid, t0, sandboxed) {
        Ok(()) => {}
        Err(Ended::Exited(st)) => {
            return Err(HelperError::ExitedBefore {
                helper: h.name(),
                binary: h.binary.clone(),
                what: "it had sandboxed itself",
                status: format!("{st:?}"),
            })
        }
        Err(Ended::WaitFailed(e)) => return Err(not_sandboxed(h, format!("waitpid: {e}"))),
        Err(Ended::TimedOut) => return Err(timeout(h, "did not sandbox itself".into())),
    }
    let root = format!("/proc/{pid}/root");
    let id = |p: &str| nix::sys::stat::stat(p).map(|st| (st.st_dev, st.st_ino));
    let theirs = id(&root).map_err(|e| not_sandboxed(h, format!("stat {root}: {e}")))?;
    let vms = id("/").map_err(|e| not_sandboxed(h, format!("stat /: {e}")))?;
    if theirs == vms {
        return Err(not_sandboxed(
            h,
            format!("its root ({root}) is still the VM's"),
        ));
    }
    let entries = std::fs::read_dir(&root)
        .map_err(|e| not_sandboxed(h, format!("read {root}: {e}")))?
        .count();
    if entries != 0 {
        return Err(not_sandboxed(
            h,
            format!("its root ({root}) is not empty ({entries} entries)"),
        ));
    }
    Ok(())
}

/// `Seccomp_filters:` of a `/proc/PID/status`.
fn filters(status: &Path) -> Option<usize> {
    let bytes = read_path(status, 4096, 16 * 1024).ok()?;
    String::from_utf8_lossy(&bytes)
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp_filters:"))
        .and_then(|v| v.trim().parse().ok())
}

fn not_sandboxed(h: &Helper, detail: String) -> HelperError {
    HelperError::NotSandboxed {
        helper: h.name(),
        binary: h.binary.clone(),
        detail,
    }
}
