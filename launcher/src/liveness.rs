//! One liveness probe for everyone: the launcher's double-start check,
//! cleanup, reap and purge all call [`probe`]. Any ambiguity keeps.

use std::path::Path;
use std::time::Duration;

use crate::dirs;
use crate::intent::Intent;
use crate::lease::{self, LeaseState};
use crate::paths::Roots;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Live(String),
    Dead,
    Ambiguous(String),
}

impl Verdict {
    pub fn is_dead(&self) -> bool {
        matches!(self, Verdict::Dead)
    }
    pub fn reason(&self) -> String {
        match self {
            Verdict::Live(r) => format!("live: {r}"),
            Verdict::Dead => "dead".into(),
            Verdict::Ambiguous(r) => format!("ambiguous: {r}"),
        }
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

/// Does something answer with a QMP greeting on the control socket?
/// (cloud-hypervisor's and firecracker's API socket: [`crate::api::answers`].)
pub fn control_socket_answers(sock: &Path) -> bool {
    use std::io::Read;
    // Only a peer running as the control dir's owner counts (a VM could
    // point its socket at another VM's through a symlink).
    let Ok(mut s) = crate::peer::connect(sock, Duration::from_millis(500)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut buf = [0u8; 64];
    matches!(s.read(&mut buf), Ok(n) if n > 0 && buf[..n].starts_with(b"{\"QMP\""))
}

/// Pids in the unit's cgroup other than the caller (ExecStopPost runs inside
/// it), when the unit's cgroup is known.
pub fn unit_cgroup_pids(name: &str) -> Option<Vec<u32>> {
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

/// The uid whose processes count as the VM's: from the intent record, else
/// from the spec. `Err` carries the reason it cannot be known.
pub fn vm_uid(roots: &Roots, name: &str, intent: Option<&Intent>) -> Result<Option<u32>, String> {
    if let Some(i) = intent {
        return Ok(Some(i.principal.uid));
    }
    match crate::spec::Spec::read(&roots.spec_path(name)) {
        Ok(spec) => crate::principal::resolve_ids(&spec)
            .map(|(u, _, _)| Some(u))
            .map_err(|e| format!("cannot resolve the principal of {name}: {e}")),
        Err(_) => Ok(None),
    }
}

/// Everything but the lease, for a caller that holds the lease itself
/// (the launcher after taking it, cleanup under its own lock).
pub fn probe_with_lease_held(roots: &Roots, name: &str, uid: u32) -> Verdict {
    let pids = processes_of_uid(uid);
    if !pids.is_empty() {
        return Verdict::Ambiguous(format!(
            "processes {pids:?} run as the VM's uid {uid} without holding its lease (see `vmwarden reap --kill`)"
        ));
    }
    if control_socket_answers(&roots.qmp_socket(name)) {
        return Verdict::Live(format!("{} answers QMP", roots.qmp_socket(name).display()));
    }
    if crate::api::answers(&roots.api_socket(name)) {
        return Verdict::Live(format!(
            "{} answers HTTP (cloud-hypervisor/firecracker API)",
            roots.api_socket(name).display()
        ));
    }
    if let Some(p) = unit_cgroup_pids(name) {
        if !p.is_empty() {
            return Verdict::Ambiguous(format!("the unit's cgroup still holds pids {p:?}"));
        }
    }
    Verdict::Dead
}

/// Is VM `name` running? Lease, processes of its uid, the control socket and
/// the unit's cgroup; anything unclear is `Ambiguous`.
pub fn probe(roots: &Roots, name: &str) -> Verdict {
    let rundir = match dirs::open_dir(&roots.runtime_dir(name)) {
        Ok(d) => Some(d),
        Err(crate::error::Error::Sys {
            errno: nix::errno::Errno::ENOENT,
            ..
        }) => None,
        Err(e) => return Verdict::Ambiguous(format!("cannot open its runtime dir: {e}")),
    };
    let mut intent = None;
    if let Some(d) = &rundir {
        match lease::state(d) {
            Ok(LeaseState::Held) => {
                return Verdict::Live(format!(
                    "lease {} is held",
                    d.path.join(crate::paths::LEASE_FILE).display()
                ))
            }
            Ok(_) => {}
            Err(e) => return Verdict::Ambiguous(format!("cannot probe the lease: {e}")),
        }
        match Intent::read(d) {
            Ok(i) => intent = i,
            Err(e) => return Verdict::Ambiguous(format!("{e}")),
        }
    }
    match vm_uid(roots, name, intent.as_ref()) {
        Ok(Some(uid)) => probe_with_lease_held(roots, name, uid),
        Ok(None) => {
            if control_socket_answers(&roots.qmp_socket(name)) {
                Verdict::Live("the control socket answers QMP".into())
            } else if crate::api::answers(&roots.api_socket(name)) {
                Verdict::Live("the API socket answers HTTP".into())
            } else {
                Verdict::Dead
            }
        }
        Err(reason) => Verdict::Ambiguous(reason),
    }
}
