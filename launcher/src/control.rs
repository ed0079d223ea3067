//! Talking to a running VM through its control socket: `wait-ready`,
//! `stop` (graceful power-down, then quit, then SIGKILL) and `status`.

use std::path::PathBuf;
use std::thread::sleep;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::config::names::VmName;
use crate::config::paths::Roots;
use crate::config::reboot::REBOOT_SIGNAL;
use crate::config::spec::HypervisorKind;
use crate::host::procs;
use crate::host::{cgroup, dirs};
use crate::hypervisor::api::{self, ApiError};
use crate::hypervisor::qmp::{Qmp, QmpError};
use crate::instance::intent::{Intent, Resource};
use crate::instance::launched::effective_spec;
use crate::instance::lease::{self, LeaseState};
use crate::instance::liveness::{self, Probe, Verdict};
use crate::launch::helpers::HelperKind;

// -- The host's own tools: `vmwarden balloon` and `vmwarden console`. --
pub mod ask_all;
pub mod at_shutdown;
pub mod balloon;
pub mod console;
pub mod hibernate;

use balloon::{balloon_mib, balloon_of};

const POLL: Duration = Duration::from_millis(50);
/// What one attempt of `wait-ready` or `stop` may take on the control
/// socket (connect, greeting, one command): a VM that answers slowly, never
/// or endlessly costs this, not more.
pub const ATTEMPT: Duration = Duration::from_secs(2);
/// The same for `status`, per VM.
pub const STATUS_ATTEMPT: Duration = Duration::from_secs(1);
/// How long `wait-ready` without the launcher's pid lets a free lease be
/// "not taken yet" before it calls the launch failed.
const START_GRACE: Duration = Duration::from_secs(1);

/// A VM that does not answer, or does not stop.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error(transparent)]
    Qmp(#[from] QmpError),
    #[error(transparent)]
    Hibernate(#[from] Box<hibernate::HibernateError>),
    #[error(transparent)]
    AtShutdown(#[from] Box<at_shutdown::AtShutdownError>),
    #[error(transparent)]
    Api(#[from] ApiError),
    /// `last` is the last attempt's error (none when there was no attempt).
    #[error("VM {name} is not running (its lease is not held); last error: {}", attempt_text(.last))]
    NotRunning {
        name: String,
        #[source]
        last: Option<Box<ControlError>>,
    },
    #[error("VM {name}: control socket {sock} did not answer within {timeout:?}: {}", attempt_text(.last))]
    NotReady {
        name: String,
        sock: PathBuf,
        timeout: Duration,
        #[source]
        last: Option<Box<ControlError>>,
    },
    #[error("VM {name} is still running after power-down, quit and SIGKILL: {}", .verdict.reason())]
    StillRunning { name: String, verdict: Verdict },
    // -- The host's own tools: the balloon. --
    #[error("VM {name} is not running ({reason}); a balloon is set on a running VM")]
    BalloonNotRunning { name: String, reason: String },
    #[error("VM {name} has no balloon: its launched spec has no `balloon` (microvm.nix `balloon = true`); set it and restart the VM")]
    NoBalloon { name: String },
    #[error("VM {name}: a balloon of {size_mib} MiB leaves the guest less than {min} MiB of its {memory_mib} MiB; at most {max_mib} MiB")]
    BalloonTooLarge {
        name: String,
        size_mib: u64,
        memory_mib: u64,
        max_mib: u64,
        min: u64,
    },
    #[error("VM {name}: the control socket {sock} answered the balloon query without {what}")]
    BalloonAnswer {
        name: String,
        sock: PathBuf,
        what: &'static str,
    },
    /// `stop` run by hand for a firecracker VM that a systemd unit runs:
    /// its guest answers the Ctrl-Alt-Del with a reboot, firecracker then
    /// ends with status 0, and the unit starts a firecracker VM again after
    /// such an exit (it cannot tell it from a reboot inside the guest).
    #[error("VM {name} runs under {unit}, which starts a firecracker VM again when firecracker ends by itself, and firecracker ends when its guest answers the stop's Ctrl-Alt-Del with a reboot: stop it with `systemctl stop {unit}` (its ExecStop= runs `vmwarden stop {name}` inside the unit, which systemd does not restart); nothing was sent to the VM")]
    UnderUnit { name: String, unit: String },
    /// `stop` run by hand for a cloud-hypervisor VM with a virtiofs share
    /// that a systemd unit runs: a guest that answers the power button
    /// with a reboot has its hypervisor ended by reboot-watch's signal,
    /// which the unit's `RestartForceExitStatus=` starts again
    /// (`config::reboot`).
    #[error("VM {name} runs under {unit}, which starts this cloud-hypervisor VM again when it reboots (its reboot-watch ends cloud-hypervisor with {signal}, which the unit restarts), and its guest may answer the stop's power button with a reboot: stop it with `systemctl stop {unit}` (its ExecStop= runs `vmwarden stop {name}` inside the unit, which systemd does not restart); nothing was sent to the VM")]
    RebootsUnderUnit {
        name: String,
        unit: String,
        signal: &'static str,
    },
}

impl ControlError {
    /// The attempt ran out of time (rather than being refused or cut off
    /// for what the peer sent).
    fn is_timeout(&self) -> bool {
        use crate::host::peer::PeerError;
        matches!(
            self,
            ControlError::Qmp(QmpError::Peer {
                source: PeerError::TimedOut,
                ..
            }) | ControlError::Api(ApiError::Timeout { .. })
        )
    }
}

fn attempt_text(last: &Option<Box<ControlError>>) -> String {
    match last {
        Some(e) => e.to_string(),
        None => "no attempt yet".into(),
    }
}

type Result<T, E = ControlError> = std::result::Result<T, E>;

fn lease_held(roots: &Roots, name: &VmName) -> bool {
    dirs::open_dir(&roots.runtime_dir(name))
        .ok()
        .and_then(|d| lease::state(&d).ok())
        == Some(LeaseState::Held)
}

/// The hypervisor kind of VM `name`: from its intent record, else the
/// spec it was launched from (else the configured spec), else QEMU.
pub fn kind_of(roots: &Roots, name: &VmName) -> HypervisorKind {
    let intent = dirs::open_dir(&roots.runtime_dir(name))
        .ok()
        .and_then(|d| Intent::read(&d).ok().flatten());
    intent
        .as_ref()
        .and_then(|i| i.hypervisor)
        .or_else(|| effective_spec(roots, name, intent.as_ref()).map(|(s, _)| s.hypervisor.kind))
        .unwrap_or(HypervisorKind::Qemu)
}

/// The control socket `wait-ready`, `stop` and `status` talk to.
pub fn control_socket(roots: &Roots, name: &VmName, kind: HypervisorKind) -> PathBuf {
    match kind {
        HypervisorKind::Qemu => roots.qmp_socket(name),
        _ => roots.api_socket(name),
    }
}

/// The run state through the control socket: QMP `query-status` for QEMU
/// ("running"), the API's `state` for cloud-hypervisor / firecracker
/// ("Running").
pub fn run_state(
    roots: &Roots,
    name: &VmName,
    kind: HypervisorKind,
    t: Duration,
) -> Result<String> {
    let sock = control_socket(roots, name, kind);
    Ok(match kind {
        HypervisorKind::Qemu => Qmp::status_within(&sock, t)?,
        _ => api::vm_state(&sock, kind, t)?,
    })
}

/// Return once the control socket answers (QMP, or the HTTP API), or fail
/// when the instance dies or `timeout` passes.
///
/// `launcher` is the pid of a launch still in progress (systemd's `$MAINPID`
/// for `ExecStartPost=`): while it lives, a lease not yet taken means "still
/// starting" (the launcher checks the spec, the principal and every file it
/// trusts before it takes the lease, which takes a while on a slow host);
/// once it is gone, a free lease means the launch failed. Without it, a free
/// lease gets `START_GRACE`, then fails.
pub fn wait_ready(
    roots: &Roots,
    name: &VmName,
    timeout: Duration,
    launcher: Option<u32>,
) -> Result<String> {
    let kind = kind_of(roots, name);
    let sock = control_socket(roots, name, kind);
    let end = Instant::now() + timeout;
    let mut last = None;
    while Instant::now() < end {
        // No attempt outlives the caller's timeout.
        let t = ATTEMPT.min(end.saturating_duration_since(Instant::now()));
        match run_state(roots, name, kind, t) {
            Ok(status) => {
                // A restored VM: running once loaded; then its snapshot is consumed.
                if let Some(i) = dirs::open_dir(&roots.runtime_dir(name))
                    .ok()
                    .and_then(|d| Intent::read(&d).ok().flatten())
                {
                    let left = end.saturating_duration_since(Instant::now());
                    hibernate::consume_if_restored(roots, name, &i, left).map_err(Box::new)?;
                }
                balloon::apply_initial(roots, name, kind)?;
                return Ok(status);
            }
            // An attempt cut short by the end of the timeout says less
            // than the full one before it (what the peer sent).
            Err(e) if t < ATTEMPT && e.is_timeout() && last.is_some() => {}
            Err(e) => last = Some(Box::new(e)),
        }
        if !lease_held(roots, name) && !launcher.is_some_and(procs::is_alive) {
            // Give a launch that is still between steps a moment, then judge.
            sleep(START_GRACE);
            if !lease_held(roots, name) {
                return Err(ControlError::NotRunning {
                    name: name.to_string(),
                    last,
                });
            }
        }
        sleep(POLL);
    }
    Err(ControlError::NotReady {
        name: name.to_string(),
        sock,
        timeout,
        last,
    })
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum StoppedBy {
    /// It was not running.
    NotRunning,
    /// The guest powered off after the ACPI power button (QMP
    /// `system_powerdown`, cloud-hypervisor `vm.power-button`, firecracker
    /// `SendCtrlAltDel`).
    Powerdown,
    /// QMP `quit`, or cloud-hypervisor `vm.shutdown` + `vmm.shutdown`.
    Quit,
    /// SIGKILL of the hypervisor, the last resort.
    Sigkill,
}

/// Wait until the probe says dead (lease free, nothing of the instance
/// left in its cgroup or under its uid, no control socket answering).
fn wait_gone(probe: &Probe, roots: &Roots, name: &VmName, d: Duration) -> bool {
    let end = Instant::now() + d;
    loop {
        if probe.probe(roots, name).is_dead() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        sleep(POLL);
    }
}

/// SIGKILL everything of the instance, through root-held handles: the
/// recorded cgroup (every process in it), else each process of the VM's
/// uid through a pidfd taken while it still runs as that uid (a recycled
/// pid is never signalled). Returns the pids signalled.
fn kill_instance(intent: Option<&Intent>, uid: Option<u32>) -> Vec<u32> {
    if let Some(cg) = intent.and_then(liveness::recorded_cgroup) {
        return cgroup::kill_all(cg).unwrap_or_default();
    }
    let Some(uid) = uid else {
        return Vec::new();
    };
    let mut killed = Vec::new();
    for pid in procs::tasks_of_uid(uid).pids {
        let Some(fd) = cgroup::pidfd_open(pid) else {
            continue;
        };
        if procs::process_runs_as(pid, uid) && cgroup::pidfd_kill(&fd) {
            killed.push(pid);
        }
    }
    killed
}

/// Stop VM `name`: the power button and wait up to `timeout`; then quit
/// and wait a little; then SIGKILL everything of the instance (its cgroup,
/// else the processes of its uid). "Running" is what [`liveness`] says, not
/// the lease alone: a VM that released its inherited lease but runs on is
/// stopped (and killed if it will not stop), not reported as not running.
/// Per kind:
/// * QEMU: QMP `system_powerdown`, then `quit`;
/// * cloud-hypervisor: `PUT /api/v1/vm.power-button`, then `PUT
///   /api/v1/vm.shutdown` and `PUT /api/v1/vmm.shutdown`;
/// * firecracker: `PUT /actions {"action_type":"SendCtrlAltDel"}` (x86: the
///   guest reboots, which ends firecracker), then nothing but SIGKILL.
///   Refused ([`ControlError::UnderUnit`]) when a systemd unit runs the VM
///   and this is not that unit's `ExecStop=`: the unit would restart it.
///   So is cloud-hypervisor with reboot-watch ([`ControlError::RebootsUnderUnit`]).
pub fn stop(roots: &Roots, name: &VmName, timeout: Duration) -> Result<StoppedBy> {
    let probe = Probe::single();
    let verdict = probe.probe(roots, name);
    if verdict.is_dead() {
        return Ok(StoppedBy::NotRunning);
    }
    let intent = dirs::open_dir(&roots.runtime_dir(name))
        .ok()
        .and_then(|d| Intent::read(&d).ok().flatten());
    // Hibernated (its snapshot complete and recorded): the hypervisor is
    // ended at once; its guest is paused and would never power off.
    if let Some(i) = intent.as_ref() {
        match hibernate::end_hibernated(roots, name, i, Duration::from_secs(10)) {
            Ok(true) if wait_gone(&probe, roots, name, timeout) => return Ok(StoppedBy::Quit),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(vm = %name, error = %e, "ending the hibernated VM failed; stopping it as usual")
            }
        }
    }
    let uid = liveness::vm_uid(roots, name, intent.as_ref())
        .ok()
        .flatten();
    let kind = intent
        .as_ref()
        .and_then(|i| i.hypervisor)
        .unwrap_or_else(|| kind_of(roots, name));
    // firecracker, or cloud-hypervisor with reboot-watch, under a unit,
    // asked by hand (not from the unit's ExecStop=): the unit would start
    // the VM again (see UnderUnit, RebootsUnderUnit).
    let watched =
        kind == HypervisorKind::CloudHypervisor && intent.as_ref().is_some_and(has_reboot_watch);
    if kind == HypervisorKind::Firecracker || watched {
        let unit = intent
            .as_ref()
            .and_then(liveness::recorded_cgroup)
            .and_then(|cg| cgroup::managing_unit_elsewhere(cg, name.as_str()));
        if let Some(unit) = unit {
            let name = name.to_string();
            return Err(if watched {
                ControlError::RebootsUnderUnit {
                    name,
                    unit,
                    signal: REBOOT_SIGNAL,
                }
            } else {
                ControlError::UnderUnit { name, unit }
            });
        }
    }
    tracing::info!(vm = %name, verdict = %verdict.reason(), "stopping");
    let sock = control_socket(roots, name, kind);
    let t = ATTEMPT;
    let put = |uri: &str, body: Option<&str>| api::expect_ok(&sock, "PUT", uri, body, t);
    let pressed = match kind {
        HypervisorKind::Qemu => Qmp::connect(&sock, t)
            .and_then(|mut q| q.execute("system_powerdown", None))
            .is_ok(),
        HypervisorKind::CloudHypervisor => put("/api/v1/vm.power-button", None).is_ok(),
        HypervisorKind::Firecracker => {
            put("/actions", Some(r#"{"action_type":"SendCtrlAltDel"}"#)).is_ok()
        }
    };
    if pressed && wait_gone(&probe, roots, name, timeout) {
        return Ok(StoppedBy::Powerdown);
    }
    let quit = match kind {
        HypervisorKind::Qemu => Qmp::connect(&sock, t)
            .and_then(|mut q| q.execute("quit", None))
            .is_ok(),
        HypervisorKind::CloudHypervisor => {
            let vm = put("/api/v1/vm.shutdown", None).is_ok();
            put("/api/v1/vmm.shutdown", None).is_ok() || vm
        }
        // firecracker has no API call that ends the process.
        HypervisorKind::Firecracker => false,
    };
    if quit && wait_gone(&probe, roots, name, Duration::from_secs(5)) {
        return Ok(StoppedBy::Quit);
    }
    let killed = kill_instance(intent.as_ref(), uid);
    if wait_gone(&probe, roots, name, Duration::from_secs(5)) {
        return Ok(if killed.is_empty() {
            StoppedBy::Quit
        } else {
            StoppedBy::Sigkill
        });
    }
    Err(ControlError::StillRunning {
        name: name.to_string(),
        verdict: probe.probe(roots, name),
    })
}

/// Whether the instance `intent` records runs reboot-watch, which ends
/// its hypervisor when the guest reboots (`config::reboot`).
fn has_reboot_watch(intent: &Intent) -> bool {
    intent
        .resources
        .iter()
        .any(|r| matches!(r, Resource::Helper { helper, .. } if helper == HelperKind::RebootWatch.as_str()))
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
    pub hypervisor: HypervisorKind,
    /// cloud-hypervisor / firecracker: the API's `state`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_state: Option<String>,
    /// The balloon's current size (MiB), while running with one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balloon_mib: Option<u64>,
}

/// The status of VM `name`, judged by [`liveness`] (never the lease alone).
pub fn status(roots: &Roots, name: &VmName) -> Status {
    status_with(&Probe::single(), roots, name)
}

/// [`status`] with a caller's prober: `vmwarden status` of every VM shares
/// one (one `/proc` scan, when any VM needs one).
pub fn status_with(probe: &Probe, roots: &Roots, name: &VmName) -> Status {
    one_status(roots, name, known(probe, roots, name), None)
}

/// What [`statuses_with`] learns of a VM before asking its control socket.
struct Known {
    verdict: Verdict,
    intent: Option<Intent>,
    kind: HypervisorKind,
    /// The launched spec's memory, when it has a balloon.
    balloon: Option<u64>,
}

fn known(probe: &Probe, roots: &Roots, name: &VmName) -> Known {
    let verdict = probe.probe(roots, name);
    let intent = dirs::open_dir(&roots.runtime_dir(name))
        .ok()
        .and_then(|d| Intent::read(&d).ok().flatten());
    let kind = intent
        .as_ref()
        .and_then(|i| i.hypervisor)
        .unwrap_or_else(|| kind_of(roots, name));
    let balloon = match verdict {
        Verdict::Live(_) => balloon_of(roots, name, intent.as_ref())
            .filter(|(_, has, _)| *has)
            .map(|(mem, _, _)| mem),
        _ => None,
    };
    Known {
        verdict,
        intent,
        kind,
        balloon,
    }
}

/// [`status_with`] of every VM of `names`, in order: the running QEMUs'
/// QMP sockets are asked all at once ([`ask_all`], one thread, each under
/// [`STATUS_ATTEMPT`] as alone); cloud-hypervisor's and firecracker's
/// APIs one after another.
pub fn statuses_with(probe: &Probe, roots: &Roots, names: &[VmName]) -> Vec<Status> {
    let known: Vec<Known> = names.iter().map(|n| known(probe, roots, n)).collect();
    let qmp: Vec<(usize, ask_all::Ask)> = known
        .iter()
        .zip(names)
        .enumerate()
        .filter(|(_, (k, _))| {
            matches!(k.verdict, Verdict::Live(_)) && k.kind == HypervisorKind::Qemu
        })
        .map(|(i, (k, name))| {
            (
                i,
                ask_all::Ask {
                    sock: control_socket(roots, name, k.kind),
                    balloon: k.balloon.is_some(),
                },
            )
        })
        .collect();
    let asks: Vec<ask_all::Ask> = qmp.iter().map(|(_, a)| a.clone()).collect();
    let mut answers: Vec<Option<ask_all::Answer>> = (0..names.len()).map(|_| None).collect();
    for ((i, _), a) in qmp.iter().zip(ask_all::ask_all(&asks, STATUS_ATTEMPT)) {
        answers[*i] = Some(a);
    }
    known
        .into_iter()
        .zip(names)
        .zip(answers)
        .map(|((k, name), answer)| one_status(roots, name, k, answer))
        .collect()
}

/// One VM's [`Status`]: QEMU's from its multiplexed `answer`, the API
/// kinds' asked here.
fn one_status(roots: &Roots, name: &VmName, k: Known, answer: Option<ask_all::Answer>) -> Status {
    let Known {
        verdict,
        intent,
        kind,
        balloon,
    } = k;
    let (run_state, balloon) = match (&verdict, answer) {
        (Verdict::Live(_), Some(a)) => {
            let b = match (&a.status, balloon, a.actual) {
                (Some(_), Some(mem), Some(actual)) => {
                    Some(mem.saturating_sub(actual / balloon::MIB))
                }
                _ => None,
            };
            (a.status, b)
        }
        (Verdict::Live(_), None) => {
            let run_state = run_state(roots, name, kind, STATUS_ATTEMPT).ok();
            let b = match (&run_state, balloon) {
                (Some(_), Some(mem)) => balloon_mib(roots, name, kind, mem, STATUS_ATTEMPT).ok(),
                _ => None,
            };
            (run_state, b)
        }
        _ => (None, None),
    };
    let (qmp_status, api_state) = match kind {
        HypervisorKind::Qemu => (run_state, None),
        _ => (None, run_state),
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
        hypervisor: kind,
        api_state,
        balloon_mib: balloon,
    }
}
