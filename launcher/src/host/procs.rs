//! The /proc and cgroup scans: which tasks run as a uid, which pids a unit's
//! cgroup holds. Only facts about the host; verdicts are `instance::liveness`.

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::config::names::VmName;

/// SIGKILL process `pid`. A pid that `kill(2)` would read as a process group
/// or as "every process" (0, or one past `i32::MAX`) is refused with EINVAL.
pub fn sigkill(pid: u32) -> nix::Result<()> {
    match i32::try_from(pid) {
        Ok(p) if p > 0 => kill(Pid::from_raw(p), Signal::SIGKILL),
        _ => Err(Errno::EINVAL),
    }
}

/// Pids of live (non-zombie) processes whose real, effective, saved or fs
/// uid is `uid`.
pub fn processes_of_uid(uid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        // Every thread counts: a process whose main thread has exited shows
        // as a zombie in /proc/PID/status while its other threads run on.
        let tasks: Vec<String> = match std::fs::read_dir(format!("/proc/{pid}/task")) {
            Ok(rd) => rd
                .flatten()
                .map(|t| {
                    format!(
                        "/proc/{pid}/task/{}/status",
                        t.file_name().to_string_lossy()
                    )
                })
                .collect(),
            Err(_) => vec![format!("/proc/{pid}/status")],
        };
        if tasks.iter().any(|p| task_runs_as(p, uid)) {
            out.push(pid);
        }
    }
    out.sort_unstable();
    out
}

/// A live (non-zombie) task whose real, effective, saved or fs uid is `uid`.
/// A zombie holds nothing (its fds, lease included, are closed); it only
/// waits for its parent to reap it.
fn task_runs_as(status_path: &str, uid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(status_path) else {
        return false;
    };
    let zombie = status
        .lines()
        .find_map(|l| l.strip_prefix("State:"))
        .map(|st| matches!(st.trim_start().chars().next(), Some('Z' | 'X')))
        .unwrap_or(false);
    !zombie
        && status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .map(|ids| ids.split_whitespace().any(|x| x.parse::<u32>() == Ok(uid)))
            .unwrap_or(false)
}

/// Pids in the unit's cgroup other than the caller (ExecStopPost runs inside
/// it), when the unit's cgroup is known.
pub fn unit_cgroup_pids(name: &VmName) -> Option<Vec<u32>> {
    let p = format!(
        "/sys/fs/cgroup/system.slice/system-microvm.slice/microvm@{name}.service/cgroup.procs"
    );
    let text = std::fs::read_to_string(p).ok()?;
    let me = std::process::id();
    Some(
        text.lines()
            .filter_map(|l| l.trim().parse::<u32>().ok())
            .filter(|p| *p != me)
            .collect(),
    )
}

/// Is `pid` a live (non-zombie) process? A pid that cannot be read counts as
/// gone.
pub fn is_alive(pid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("State:"))
        .is_some_and(|st| !matches!(st.trim_start().chars().next(), Some('Z' | 'X')))
}
