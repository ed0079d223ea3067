//! Talking to a running VM through its control socket: `wait-ready`,
//! `stop` (graceful power-down, then quit, then SIGKILL) and `status`.

use std::thread::sleep;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::dirs;
use crate::error::{Error, Result};
use crate::intent::Intent;
use crate::lease::{self, LeaseState};
use crate::liveness::{self, Verdict};
use crate::paths::Roots;
use crate::qmp::Qmp;

const POLL: Duration = Duration::from_millis(50);

fn lease_held(roots: &Roots, name: &str) -> bool {
    dirs::open_dir(&roots.runtime_dir(name))
        .ok()
        .and_then(|d| lease::state(&d).ok())
        == Some(LeaseState::Held)
}

/// Return once the control socket answers QMP, or fail when the instance
/// dies or `timeout` passes.
pub fn wait_ready(roots: &Roots, name: &str, timeout: Duration) -> Result<String> {
    let sock = roots.qmp_socket(name);
    let end = Instant::now() + timeout;
    let mut last = String::from("no attempt yet");
    while Instant::now() < end {
        match Qmp::connect(&sock, Duration::from_secs(2)).and_then(|mut q| q.status()) {
            Ok(status) => return Ok(status),
            Err(e) => last = e.to_string(),
        }
        if !lease_held(roots, name) {
            // Give a launch that is still between steps a moment, then judge.
            sleep(POLL);
            if !lease_held(roots, name) {
                return Err(Error::Other(format!(
                    "VM {name} is not running (its lease is not held); last error: {last}"
                )));
            }
        }
        sleep(POLL);
    }
    Err(Error::Other(format!(
        "VM {name}: control socket {} did not answer within {:?}: {last}",
        sock.display(),
        timeout
    )))
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum StoppedBy {
    /// It was not running.
    NotRunning,
    /// The guest powered off after the ACPI power button.
    Powerdown,
    /// QMP `quit`.
    Quit,
    /// SIGKILL of the hypervisor, the last resort.
    Sigkill,
}

fn wait_gone(roots: &Roots, name: &str, uid: Option<u32>, d: Duration) -> bool {
    let end = Instant::now() + d;
    loop {
        let gone = !lease_held(roots, name)
            && uid
                .map(|u| liveness::processes_of_uid(u).is_empty())
                .unwrap_or(true);
        if gone {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        sleep(POLL);
    }
}

/// Stop VM `name`: `system_powerdown` and wait up to `timeout`; then `quit`
/// and wait a little; then SIGKILL the hypervisor (the intent record's pid,
/// only while it still runs as the VM's uid).
pub fn stop(roots: &Roots, name: &str, timeout: Duration) -> Result<StoppedBy> {
    let rundir = match dirs::open_dir(&roots.runtime_dir(name)) {
        Ok(d) => d,
        Err(_) => return Ok(StoppedBy::NotRunning),
    };
    let intent = Intent::read(&rundir).ok().flatten();
    let uid = intent.as_ref().map(|i| i.principal.uid);
    if !lease_held(roots, name) {
        return Ok(StoppedBy::NotRunning);
    }
    let sock = roots.qmp_socket(name);
    if let Ok(mut q) = Qmp::connect(&sock, Duration::from_secs(2)) {
        if q.execute("system_powerdown", None).is_ok() && wait_gone(roots, name, uid, timeout) {
            return Ok(StoppedBy::Powerdown);
        }
    }
    if let Ok(mut q) = Qmp::connect(&sock, Duration::from_secs(2)) {
        let _ = q.execute("quit", None);
        if wait_gone(roots, name, uid, Duration::from_secs(5)) {
            return Ok(StoppedBy::Quit);
        }
    }
    if let (Some(i), Some(uid)) = (&intent, uid) {
        if liveness::processes_of_uid(uid).contains(&i.pid) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i.pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            if wait_gone(roots, name, Some(uid), Duration::from_secs(5)) {
                return Ok(StoppedBy::Sigkill);
            }
        }
    }
    if wait_gone(roots, name, uid, Duration::from_millis(100)) {
        return Ok(StoppedBy::Quit);
    }
    Err(Error::Other(format!(
        "VM {name} is still running after power-down, quit and SIGKILL: {}",
        liveness::probe(roots, name).reason()
    )))
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Status {
    pub name: String,
    pub configured: bool,
    pub liveness: String,
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qmp_status: Option<String>,
}

/// Every VM that is configured or has a runtime dir, sorted by name.
pub fn known_vms(roots: &Roots) -> Vec<String> {
    let mut names: Vec<String> = crate::principal::configured_specs(roots)
        .into_iter()
        .map(|(n, _, _)| n)
        .collect();
    if let Ok(rd) = std::fs::read_dir(&roots.runtime_root) {
        for e in rd.flatten() {
            if let Some(n) = e.file_name().to_str() {
                if crate::spec::valid_name(n) && e.file_type().map(|t| t.is_dir()).unwrap_or(false)
                {
                    names.push(n.to_string());
                }
            }
        }
    }
    names.sort();
    names.dedup();
    names
}

pub fn status(roots: &Roots, name: &str) -> Status {
    let verdict = liveness::probe(roots, name);
    let intent = dirs::open_dir(&roots.runtime_dir(name))
        .ok()
        .and_then(|d| Intent::read(&d).ok().flatten());
    let qmp_status = match &verdict {
        Verdict::Live(_) => Qmp::connect(&roots.qmp_socket(name), Duration::from_secs(1))
            .and_then(|mut q| q.status())
            .ok(),
        _ => None,
    };
    Status {
        name: name.to_string(),
        configured: roots.spec_path(name).exists(),
        state: match verdict {
            Verdict::Live(_) => "running",
            Verdict::Dead => "stopped",
            Verdict::Ambiguous(_) => "ambiguous",
        },
        liveness: verdict.reason(),
        pid: intent.as_ref().map(|i| i.pid),
        uid: intent.as_ref().map(|i| i.principal.uid),
        instance_id: intent.map(|i| i.instance_id),
        qmp_status,
    }
}
