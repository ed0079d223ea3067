//! `vmwarden balloon NAME SIZE` and the BALLOON of `status`: the
//! virtio-balloon of a running VM, through its control socket, under the
//! same per-attempt bound as `stop` ([`ATTEMPT`]).

use std::time::{Duration, Instant};

use super::{control_socket, kind_of, ControlError, Result, ATTEMPT};
use crate::config::names::VmName;
use crate::config::paths::Roots;
use crate::config::spec::{HypervisorKind, MIN_MEMORY_MIB};
use crate::host::dirs;
use crate::hypervisor::api;
use crate::hypervisor::qmp::Qmp;
use crate::instance::intent::Intent;
use crate::instance::launched::{effective_spec, effective_spec_of};
use crate::instance::liveness::{Probe, Verdict};

pub(super) const MIB: u64 = 1024 * 1024;

/// What the launched spec says of VM `name`'s balloon: its memory and
/// whether it has one. `None` when no spec can be read.
pub(super) fn balloon_of(
    roots: &Roots,
    name: &VmName,
    intent: Option<&Intent>,
) -> Option<(u64, bool, u64)> {
    effective_spec(roots, name, intent)
        .map(|(s, _)| (s.memory_mib, s.balloon.is_some(), s.max_balloon_mib()))
}

/// Set VM `name`'s balloon to `size_mib` (MiB taken from the guest, as
/// microvm.nix's `initialBalloonMem`), through its control socket within
/// [`ATTEMPT`], as `stop`'s every attempt: QMP `balloon` (whose value is
/// the guest's memory that remains) for QEMU, `PUT /api/v1/vm.resize
/// {"desired_balloon"}` for cloud-hypervisor. The guest inflates or
/// deflates towards it in its own time; `status` shows where it is.
pub fn set_balloon(roots: &Roots, name: &VmName, size_mib: u64) -> Result<()> {
    let verdict = Probe::single().probe(roots, name);
    if !matches!(verdict, Verdict::Live(_)) {
        return Err(ControlError::BalloonNotRunning {
            name: name.to_string(),
            reason: verdict.reason(),
        });
    }
    let intent = dirs::open_dir(&roots.runtime_dir(name))
        .ok()
        .and_then(|d| Intent::read(&d).ok().flatten());
    let (memory_mib, has, max_mib) = match balloon_of(roots, name, intent.as_ref()) {
        Some((m, true, max)) => (m, true, max),
        _ => (0, false, 0),
    };
    if !has {
        return Err(ControlError::NoBalloon {
            name: name.to_string(),
        });
    }
    if size_mib > max_mib {
        return Err(ControlError::BalloonTooLarge {
            name: name.to_string(),
            size_mib,
            memory_mib,
            max_mib,
            min: MIN_MEMORY_MIB,
        });
    }
    let kind = intent
        .as_ref()
        .and_then(|i| i.hypervisor)
        .unwrap_or_else(|| kind_of(roots, name));
    let sock = control_socket(roots, name, kind);
    match kind {
        HypervisorKind::Qemu => {
            let value = (memory_mib - size_mib) * MIB;
            Qmp::connect(&sock, ATTEMPT)?
                .execute("balloon", Some(serde_json::json!({ "value": value })))?;
        }
        _ => {
            let body = serde_json::json!({ "desired_balloon": size_mib * MIB }).to_string();
            api::expect_ok(&sock, "PUT", "/api/v1/vm.resize", Some(&body), ATTEMPT)?;
        }
    }
    tracing::info!(vm = %name, balloon_mib = size_mib, "balloon target set");
    Ok(())
}

/// The balloon's current size in MiB, as the guest has acknowledged it:
/// QMP `query-balloon`'s `actual` (the guest's memory that remains) for
/// QEMU, `vm.info`'s `memory_actual_size` for cloud-hypervisor; each
/// subtracted from the guest's `memory_mib`.
pub fn balloon_mib(
    roots: &Roots,
    name: &VmName,
    kind: HypervisorKind,
    memory_mib: u64,
    t: Duration,
) -> Result<u64> {
    let sock = control_socket(roots, name, kind);
    let (remains, what) = match kind {
        HypervisorKind::Qemu => {
            let deadline = Instant::now() + t;
            let mut q = Qmp::connect(&sock, t)?;
            let left = deadline.saturating_duration_since(Instant::now());
            let v = q.execute_within("query-balloon", None, left)?;
            (v.get("actual").and_then(|a| a.as_u64()), "`actual`")
        }
        _ => {
            let r = api::expect_ok(&sock, "GET", "/api/v1/vm.info", None, t)?;
            let v: serde_json::Value = serde_json::from_str(&r.body).unwrap_or_default();
            (
                v.get("memory_actual_size").and_then(|a| a.as_u64()),
                "`memory_actual_size`",
            )
        }
    };
    let remains = remains.ok_or_else(|| ControlError::BalloonAnswer {
        name: name.to_string(),
        sock: sock.clone(),
        what,
    })?;
    Ok(memory_mib.saturating_sub(remains / MIB))
}

/// QEMU has no boot-time balloon size (microvm.nix refuses
/// `initialBalloonMem` for it): `wait-ready` sets `balloon.initial_mib`
/// through QMP once the control socket answers. cloud-hypervisor takes it
/// on its command line (`--balloon size=`).
pub fn apply_initial(roots: &Roots, name: &VmName, kind: HypervisorKind) -> Result<()> {
    if kind != HypervisorKind::Qemu {
        return Ok(());
    }
    let Some((spec, _)) = effective_spec_of(roots, name) else {
        return Ok(());
    };
    let Some(b) = spec.balloon.as_ref().filter(|b| b.initial_mib > 0) else {
        return Ok(());
    };
    let value = (spec.memory_mib - b.initial_mib.min(spec.max_balloon_mib())) * MIB;
    let sock = control_socket(roots, name, kind);
    Qmp::connect(&sock, ATTEMPT)?
        .execute("balloon", Some(serde_json::json!({ "value": value })))?;
    tracing::info!(vm = %name, balloon_mib = b.initial_mib, "initial balloon set");
    Ok(())
}
