//! Each hypervisor's own way to capture a paused VM into a snapshot
//! directory and to start from one: the per-hypervisor part of
//! hibernation ([`Hibernator`], one value per kind from [`for_kind`]).
//! Everything around it (the directory, its names, the intent record, the
//! manifest, the match check, teardown) is the same for every kind and
//! lives elsewhere (`control::hibernate`, `launch::restore`,
//! `instance::hibernated`, `teardown::hibernate`).
//!
//! Root never writes snapshot data: the directory and any file root hands
//! over ([`Hibernator::precreated`]) are made by root with the principal's
//! file-system ids (0700, 0600, `O_EXCL`), and the hypervisor, in its
//! sandbox, writes the bytes.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::thread::sleep;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::config::hibernate::QEMU_MEMORY_FILE;
use crate::config::spec::HypervisorKind;
use crate::config::text::excerpt;
use crate::hypervisor::api::ApiError;
use crate::hypervisor::qmp::{Qmp, QmpError};
// The slots cloud-hypervisor and firecracker fill (`hibernate_chfc`).
use crate::config::paths::Roots;
use crate::config::spec::Spec;
use crate::host::dirs::Dir;

/// Why a capture, a resume or a restore's check failed.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error(transparent)]
    Qmp(#[from] QmpError),
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The hypervisor said the capture failed.
    #[error("the capture failed: {0}")]
    Failed(String),
    #[error("the capture did not complete within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Unsupported(&'static str),
}

/// One hypervisor's snapshot mechanism.
pub trait Hibernator: Sync {
    /// Files root makes empty (the principal's, 0600) in the directory
    /// being written and hands to [`Hibernator::capture`] opened for
    /// writing; empty when the hypervisor makes its own files there.
    fn precreated(&self) -> &'static [&'static str];
    /// Pause the VM and write the snapshot into `dir` (the same path
    /// inside the VM's sandbox, where the state dir is bound at its own
    /// path); `files` are [`Hibernator::precreated`]'s, in order. Returns
    /// once the capture is complete. `started` is called once the
    /// hypervisor is writing (a kill point for the tests).
    fn capture(
        &self,
        control: &Path,
        dir: &Path,
        files: &[OwnedFd],
        timeout: Duration,
        started: &dyn Fn(),
    ) -> Result<(), CaptureError>;
    /// Run the VM again after a failed capture.
    fn resume(&self, control: &Path, timeout: Duration) -> Result<(), CaptureError>;
    /// End the hypervisor after a complete capture (the VM stays paused).
    fn quit(&self, control: &Path, timeout: Duration) -> Result<(), CaptureError>;
    /// The command line of a start from the snapshot in `dir`: the boot's
    /// `argv` changed; `fds` are the snapshot's files (by name) opened
    /// read-only by root and inherited.
    fn restore_argv(&self, argv: Vec<String>, dir: &Path, fds: &[(String, i32)]) -> Vec<String>;
    /// After a start from a snapshot: `Ok(true)` once the restored VM
    /// runs (then the snapshot is consumed), `Ok(false)` while it loads.
    fn restored(&self, control: &Path, timeout: Duration) -> Result<bool, CaptureError>;
    /// After a start from a snapshot: `Ok(true)` once the snapshot is
    /// loaded and no longer needed, before the guest runs where the
    /// hypervisor holds it paused, so that the snapshot is consumed before
    /// the guest runs a single instruction: a kill in between never leaves
    /// a snapshot of a guest that ran. `snapshot`: its directory (a
    /// hypervisor that loads it through its API does so here). Default:
    /// [`Hibernator::restored_from`].
    fn loaded(
        &self,
        control: &Path,
        snapshot: &Path,
        timeout: Duration,
    ) -> Result<bool, CaptureError> {
        self.restored_from(control, snapshot, timeout)
    }
    /// Run the guest [`Hibernator::loaded`] reported loaded (once its
    /// snapshot is consumed). Default: nothing (`restored` ran it).
    fn run_loaded(&self, _control: &Path, _timeout: Duration) -> Result<(), CaptureError> {
        Ok(())
    }
    /// [`Hibernator::restored`] given the snapshot's directory too
    /// (firecracker loads it through its API here).
    fn restored_from(
        &self,
        control: &Path,
        _snapshot: &Path,
        timeout: Duration,
    ) -> Result<bool, CaptureError> {
        self.restored(control, timeout)
    }
    /// What of the snapshot itself differs from what this start would
    /// run, beyond root's record (the device paths a hypervisor restores
    /// from its snapshot unchecked), each naming its field.
    fn mismatches(&self, _spec: &Spec, _roots: &Roots, _snapshot: &Dir) -> Vec<String> {
        Vec::new()
    }
}

/// The kind's mechanism, or why it has none.
pub fn for_kind(kind: HypervisorKind) -> Result<&'static dyn Hibernator, CaptureError> {
    match kind {
        HypervisorKind::Qemu => Ok(&QemuHibernator),
        HypervisorKind::CloudHypervisor => Ok(&super::hibernate_chfc::ChHibernator),
        HypervisorKind::Firecracker => Ok(&super::hibernate_chfc::FcHibernator),
    }
}

/// QEMU: migration to an fd (7.2 has no `file:` URI), `-incoming fd:N`.
#[derive(Debug)]
pub struct QemuHibernator;

/// `VMWARDEN_FAULT_AFTER=hibernate:slow` (builds with `fault-injection`):
/// QEMU's migration is capped at 64 KiB/s, so that the
/// capture of any guest outlasts a short `--timeout` and takes the
/// timeout's path for real (QEMU's migration cancelled, the guest resumed)
/// whatever the host's speed.
pub const SLOW: &str = "slow";
/// 64 KiB/s: a guest's zero pages alone (a few bytes each) take seconds.
#[cfg(feature = "fault-injection")]
const SLOW_BYTES_PER_S: i64 = 64 * 1024;

/// Whether `VMWARDEN_FAULT_AFTER` is `hibernate:AT`: hibernation's kill
/// points and faults, read in one place. Always false in a build without
/// `fault-injection`.
pub fn fault_asked(at: &str) -> bool {
    #[cfg(feature = "fault-injection")]
    return std::env::var("VMWARDEN_FAULT_AFTER").ok().as_deref()
        == Some(&format!("hibernate:{at}"));
    #[cfg(not(feature = "fault-injection"))]
    {
        let _ = at;
        false
    }
}

/// The migration's cap: none worth the name on a local file (a stopped VM
/// needs one pass), unless the [`SLOW`] fault is asked for.
fn max_bandwidth() -> i64 {
    #[cfg(feature = "fault-injection")]
    if fault_asked(SLOW) {
        tracing::warn!(
            bytes_per_s = SLOW_BYTES_PER_S,
            "fault injection: QEMU's capture slowed"
        );
        return SLOW_BYTES_PER_S;
    }
    i64::MAX / 2
}

/// The name QEMU keeps the snapshot's fd under (`getfd`).
const QEMU_FDNAME: &str = "vmwarden-hibernate";
const POLL: Duration = Duration::from_millis(50);

impl Hibernator for QemuHibernator {
    fn precreated(&self) -> &'static [&'static str] {
        &[QEMU_MEMORY_FILE]
    }

    fn capture(
        &self,
        control: &Path,
        _dir: &Path,
        files: &[OwnedFd],
        timeout: Duration,
        started: &dyn Fn(),
    ) -> Result<(), CaptureError> {
        let end = Instant::now() + timeout;
        let Some(file) = files.first() else {
            return Err(CaptureError::Failed(
                "no file to write the snapshot to".into(),
            ));
        };
        let mut q = Qmp::connect(control, timeout)?;
        q.execute("stop", None)?;
        q.execute(
            "migrate-set-parameters",
            Some(json!({ "max-bandwidth": max_bandwidth() })),
        )?;
        q.getfd(QEMU_FDNAME, file.as_fd())?;
        q.execute(
            "migrate",
            Some(json!({ "uri": format!("fd:{QEMU_FDNAME}") })),
        )?;
        started();
        loop {
            let v = q.execute("query-migrate", None)?;
            match v.get("status").and_then(Value::as_str).unwrap_or("") {
                "completed" => return Ok(()),
                s @ ("failed" | "cancelled") => {
                    let why = v
                        .get("error-desc")
                        .and_then(Value::as_str)
                        .unwrap_or(s)
                        .to_string();
                    return Err(CaptureError::Failed(excerpt(&why, 200)));
                }
                _ => {}
            }
            if Instant::now() >= end {
                let _ = q.execute("migrate_cancel", None);
                return Err(CaptureError::Timeout(timeout));
            }
            sleep(POLL);
        }
    }

    fn resume(&self, control: &Path, timeout: Duration) -> Result<(), CaptureError> {
        let mut q = Qmp::connect(control, timeout)?;
        let _ = q.execute("migrate_cancel", None);
        // A migration that failed or was cancelled has given the disks
        // back (QEMU reactivates them before the state leaves
        // "cancelling"); `cont` runs the guest.
        let end = Instant::now() + timeout;
        loop {
            let v = q.execute("query-migrate", None)?;
            let s = v.get("status").and_then(Value::as_str).unwrap_or("none");
            if !matches!(s, "cancelling" | "active" | "setup" | "device") || Instant::now() >= end {
                break;
            }
            sleep(POLL);
        }
        q.execute("cont", None)?;
        Ok(())
    }

    fn quit(&self, control: &Path, timeout: Duration) -> Result<(), CaptureError> {
        Qmp::connect(control, timeout)?.execute("quit", None)?;
        Ok(())
    }

    fn restore_argv(
        &self,
        mut argv: Vec<String>,
        _dir: &Path,
        fds: &[(String, i32)],
    ) -> Vec<String> {
        if let Some((_, fd)) = fds.iter().find(|(n, _)| n == QEMU_MEMORY_FILE) {
            argv.extend(["-incoming".to_string(), format!("fd:{fd}")]);
        }
        argv
    }

    fn restored(&self, control: &Path, timeout: Duration) -> Result<bool, CaptureError> {
        if !self.loaded(control, Path::new(""), timeout)? {
            return Ok(false);
        }
        self.run_loaded(control, timeout)?;
        Ok(true)
    }

    fn loaded(
        &self,
        control: &Path,
        _snapshot: &Path,
        timeout: Duration,
    ) -> Result<bool, CaptureError> {
        let mut q = Qmp::connect(control, timeout)?;
        match q.status()?.as_str() {
            "running" => Ok(true),
            // The capture paused the guest first, and QEMU keeps the
            // source's run state: once the stream is loaded, run it.
            "paused" => {
                let v = q.execute("query-migrate", None)?;
                match v.get("status").and_then(Value::as_str) {
                    Some("completed") => Ok(true),
                    Some("failed") => Err(CaptureError::Failed(
                        "QEMU could not load the snapshot".into(),
                    )),
                    _ => Ok(false),
                }
            }
            _ => Ok(false),
        }
    }

    fn run_loaded(&self, control: &Path, timeout: Duration) -> Result<(), CaptureError> {
        let mut q = Qmp::connect(control, timeout)?;
        if q.status()? == "paused" {
            q.execute("cont", None)?;
        }
        Ok(())
    }
}
