//! The host's shutdown and its next boot, as `libvirt-guests` does it with
//! managed save: `vmwarden hibernate-all` (the `ExecStop=` of
//! `vmwarden-hibernate-on-shutdown.service`) hibernates every running VM
//! whose spec allows it, one after another, each within its deadline, and
//! stops normally the one it could not hibernate; `vmwarden
//! start-hibernated` (that unit's `ExecStart=`, at boot) starts the units
//! of the VMs it put down, which restore them.
//!
//! The VMs put down are named in root's record
//! `STATE_ROOT/.hibernated-at-shutdown.json` ([`crate::instance::at_shutdown`],
//! written durably after each VM): a VM hibernated by hand stays down
//! until it is started, as it would without the option. The boot reads the
//! record once and removes it; a name whose snapshot is gone by then is
//! skipped (whatever deletes the snapshot, a restore, a cold boot's
//! discard or `purge`, also takes the VM off the record).

use std::time::{Duration, Instant};

use crate::config::names::VmName;
use crate::config::paths::Roots;
use crate::config::spec::HypervisorKind;
use crate::host::dirs::{self, DirError};
use crate::host::machined;
use crate::instance::at_shutdown::{self, AtShutdown, RecordError};
use crate::instance::hibernated::{needs_boot_id, Manifest, ManifestError};
use crate::instance::intent::Intent;
use crate::instance::liveness::Probe;

use super::hibernate::{hibernate_with, HibernateError};
use super::{stop, ControlError, StoppedBy};

/// How long the normal stop of a VM that could not be hibernated may take
/// (the template's `vmwarden stop` default).
pub const STOP_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum AtShutdownError {
    /// Root's record of the VMs put down.
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error(transparent)]
    Dir(#[from] DirError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
}

/// What became of one VM at the host's shutdown.
#[derive(Debug)]
pub enum Outcome {
    /// Put down to disk; named in the record.
    Hibernated { bytes: u64, ms: u128 },
    /// Put down to disk, its snapshot kept, but not named in the record
    /// (`why`: the record's lock or file refused, say). The next boot's
    /// `start-hibernated` does not start it; a start of its unit restores
    /// it from the snapshot as from any (`restore-checked` reads the
    /// VM's own snapshot record, not this one), so a unit the boot starts
    /// anyway (enabled) restores it, and one that is not stays down until
    /// started. The other VMs go on.
    NotRecorded {
        bytes: u64,
        ms: u128,
        why: RecordError,
    },
    /// Not running: nothing to do.
    NotRunning,
    /// Its spec does not allow hibernation: left to its unit's stop.
    NotAllowed,
    /// Its hypervisor's snapshot is bound to this boot of the host (it
    /// would be refused after the reboot): left to its unit's stop.
    BootBound(HypervisorKind),
    /// Hibernation failed or passed the deadline (`why`); stopped normally.
    Stopped { why: String, by: StoppedBy },
    /// Hibernation failed (`why`) and so did the normal stop (`stop`): its
    /// own unit's stop, which follows at a shutdown, is what is left.
    Failed { why: String, stop: String },
}

/// Hibernate every VM of `names` that runs and whose spec allows it, one
/// after another, each within `deadline`; stop normally each that fails or
/// passes it (logged). The VMs put down are added to the record durably,
/// one by one, so a shutdown cut short keeps what was done; one that
/// cannot be added is [`Outcome::NotRecorded`], and the rest go on (once
/// the record's lock was held past its whole wait, the rest try it once,
/// without waiting again).
pub fn hibernate_all(
    roots: &Roots,
    names: &[VmName],
    deadline: Duration,
) -> Result<Vec<(VmName, Outcome)>, AtShutdownError> {
    // A record that cannot be read fails before any VM goes down.
    AtShutdown::read(roots)?;
    let mut out = Vec::new();
    let probe = Probe::single();
    // How long adding a VM to the record waits for the record's lock. Once
    // a holder kept it for a whole wait (a stuck process), the VMs after
    // that one try it once, without waiting: each waiting its own 30 s
    // held the shutdown N × 30 s (the unit's stop has no timeout), the
    // VMs still running meanwhile. They are still hibernated; each one not
    // recorded is reported so, naming the holder.
    let mut record_wait = at_shutdown::LOCK_WAIT;
    for name in names {
        if probe.probe(roots, name).is_dead() {
            out.push((name.clone(), Outcome::NotRunning));
            continue;
        }
        // A snapshot bound to this boot (cloud-hypervisor's, firecracker's)
        // would only be refused after the reboot: such a VM stops normally.
        let kind = dirs::open_dir(&roots.runtime_dir(name))
            .ok()
            .and_then(|d| Intent::read(&d).ok().flatten())
            .and_then(|i| i.hypervisor);
        if let Some(kind) = kind.filter(|k| needs_boot_id(*k)) {
            out.push((name.clone(), Outcome::BootBound(kind)));
            continue;
        }
        let t0 = Instant::now();
        let outcome = match hibernate_with(roots, name, deadline, false, false) {
            Ok(h) => {
                let ms = t0.elapsed().as_millis();
                match at_shutdown::add_within(roots, name, record_wait) {
                    Ok(()) => {
                        tracing::info!(vm = %name, bytes = h.bytes, "hibernated for the host's shutdown");
                        Outcome::Hibernated { bytes: h.bytes, ms }
                    }
                    // Down, its snapshot kept: recorded or not, it stays
                    // so, and the rest still go down.
                    Err(why) => {
                        if matches!(why, RecordError::LockBusy { .. }) {
                            record_wait = Duration::ZERO;
                        }
                        tracing::warn!(vm = %name, bytes = h.bytes, error = %why, "hibernated for the host's shutdown, but not recorded: the next boot does not start it");
                        Outcome::NotRecorded {
                            bytes: h.bytes,
                            ms,
                            why,
                        }
                    }
                }
            }
            Err(HibernateError::NotAllowed { .. } | HibernateError::ConfiguredForbids { .. }) => {
                Outcome::NotAllowed
            }
            Err(HibernateError::NotRunning(_)) => Outcome::NotRunning,
            Err(e) => {
                let why = e.to_string();
                tracing::warn!(vm = %name, error = %why, "not hibernated within {} s; stopping it normally", deadline.as_secs());
                match stop(roots, name, STOP_TIMEOUT) {
                    Ok(by) => Outcome::Stopped { why, by },
                    Err(e) => {
                        let stop = match &e {
                            ControlError::UnderUnit { .. }
                            | ControlError::RebootsUnderUnit { .. } => {
                                format!("{e}; its own unit stops it")
                            }
                            _ => e.to_string(),
                        };
                        tracing::warn!(vm = %name, error = %stop, "the normal stop failed too");
                        Outcome::Failed { why, stop }
                    }
                }
            }
        };
        out.push((name.clone(), outcome));
    }
    Ok(out)
}

/// At boot: ask systemd to start `PREFIX@NAME.service` for each VM the
/// record names whose snapshot is still recorded, then remove the record.
/// Each VM: `Ok(job)`, `Err(why)`, or skipped (`None`: no snapshot left).
#[allow(clippy::type_complexity)]
pub fn start_hibernated(
    roots: &Roots,
    prefix: &str,
) -> Result<Vec<(VmName, Option<Result<String, String>>)>, AtShutdownError> {
    // Held to the removal: a unit started below that takes its VM off
    // the record waits, then finds none (and writes none back).
    let _held = at_shutdown::lock(roots)?;
    let record = AtShutdown::read(roots)?;
    let mut out = Vec::new();
    if record.vms.is_empty() {
        AtShutdown::remove(roots)?;
        return Ok(out);
    }
    let root = dirs::open_dir(&roots.state_root)?;
    for name in record.vms {
        if Manifest::read(&root, &name)?.is_none() {
            tracing::info!(vm = %name, "hibernated at the last shutdown, but its snapshot is no longer recorded; not started");
            out.push((name, None));
            continue;
        }
        let r = machined::start_vm_unit(prefix, &name).map_err(|e| e.to_string());
        match &r {
            Ok(job) => {
                tracing::info!(vm = %name, job = %job, "hibernated at the last shutdown: its unit is started, and restores it")
            }
            Err(e) => {
                tracing::warn!(vm = %name, error = %e, "hibernated at the last shutdown: its unit could not be started")
            }
        }
        out.push((name, Some(r)));
    }
    AtShutdown::remove(roots)?;
    Ok(out)
}
