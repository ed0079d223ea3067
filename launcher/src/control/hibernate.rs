//! `vmwarden hibernate NAME [--timeout S] [--keep-after-restore]`: pause,
//! capture, stop; and the consumption of a snapshot once a restore runs
//! ([`consume_if_restored`], from `wait-ready`).
//!
//! Atomic for the operator: the snapshot is written under
//! `.vmwarden-hibernate.new` (named in the instance's intent record since
//! its launch), made by root with the principal's file-system ids (so
//! root's capabilities do not apply and the principal owns it: 0700, its
//! files 0600, `O_EXCL`), written by the hypervisor in its sandbox, and
//! renamed to `.vmwarden-hibernate` only once complete. Then root's record
//! `STATE/.hibernated-NAME.json` is written, then the hypervisor ends. A
//! failed capture resumes the VM and deletes the partial snapshot.
//!
//! Kill points (builds with `fault-injection`):
//! `VMWARDEN_FAULT_AFTER=hibernate:WHERE`, WHERE one of [`KILL_POINTS`];
//! and [`UNWRITABLE`], which makes QEMU's capture fail for real.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{renameat2, OFlag, RenameFlags};
use nix::sys::stat::Mode;
use serde::Serialize;

use crate::config::hibernate::{self, SNAPSHOT_DIR, SNAPSHOT_NEW};
use crate::config::names::VmName;
use crate::config::paths::Roots;
use crate::config::spec::{DiskSpec, HypervisorKind, Spec};
use crate::control::control_socket;
use crate::host::dirs::{self, Dir, DirError};
use crate::host::ownership;
use crate::host::sys::SysError;
use crate::host::{cgroup, machined};
use crate::hypervisor::hibernate::{fault_asked, for_kind, CaptureError, Hibernator};
use crate::identity::principal::Principal;
use crate::instance::at_shutdown;
use crate::instance::hibernated::{self, Identities, Manifest, ManifestError};
use crate::instance::intent::Intent;
use crate::instance::launched;
use crate::instance::liveness::{self, Probe};
use crate::launch::root::as_principal;

/// Where `VMWARDEN_FAULT_AFTER=hibernate:WHERE` kills `vmwarden
/// hibernate`: after the directory is made, once the capture started,
/// once complete, once renamed, once recorded.
pub const KILL_POINTS: &[&str] = &["made", "started", "captured", "renamed", "recorded"];

/// Where `VMWARDEN_FAULT_AFTER=hibernate:running` kills `wait-ready` of a
/// restored VM: once its guest runs again.
pub const RESTORE_KILL_POINT: &str = "running";

#[derive(Debug, thiserror::Error)]
pub enum HibernateError {
    #[error("VM {0} is not running; nothing to hibernate")]
    NotRunning(String),
    #[error("VM {name}: field `hibernate.allowed` of the spec it runs is not true; a snapshot puts the guest's memory, credentials included, on disk, so hibernation is refused unless the spec allows it")]
    NotAllowed { name: String },
    #[error("VM {name}: field `hibernate.allowed` of its configured spec is not true (the running instance was launched when it was): hibernation is refused; restart the VM to run the spec as configured")]
    ConfiguredForbids { name: String },
    #[error("VM {name}: --keep-after-restore: field `disks[{index}]` ({path}) is a writable block device, whose writes move no identity the launch can check, so a second restore over what the guest wrote since could not be refused; hibernate without --keep-after-restore")]
    KeepBlind {
        name: String,
        index: usize,
        path: PathBuf,
    },
    #[error("VM {name}: {path} exists: a capture is in progress or was killed; stop the VM (cleanup deletes it) before hibernating again")]
    InProgress { name: String, path: PathBuf },
    #[error("VM {name}: the capture failed ({cause}); the VM was resumed and the partial snapshot {partial} deleted")]
    Capture {
        name: String,
        partial: PathBuf,
        cause: Box<CaptureError>,
    },
    #[error("VM {name}: the capture failed ({cause}), and then: {then}")]
    CaptureThen {
        name: String,
        cause: Box<CaptureError>,
        then: String,
    },
    #[error("VM {name}: {cause}")]
    Hypervisor {
        name: String,
        cause: Box<CaptureError>,
    },
    #[error(transparent)]
    Dir(#[from] DirError),
    #[error("as the principal: {0}")]
    Principal(String),
    #[error(transparent)]
    AtShutdown(Box<super::at_shutdown::AtShutdownError>),
    #[error("{0}")]
    Sys(#[from] SysError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("VM {name}: the snapshot {path} is complete and recorded, but the hypervisor did not end: {cause}")]
    Quit {
        name: String,
        path: PathBuf,
        cause: String,
    },
}

/// `VMWARDEN_FAULT_AFTER=hibernate:unwritable` (builds with
/// `fault-injection`): the files root makes for the capture are handed
/// over read-only (QEMU's) and the directory the hypervisor writes in is
/// made read-only to the principal (cloud-hypervisor's, firecracker's), so
/// that the hypervisor's own capture fails on its first write whatever the
/// host's speed (a short `--timeout` does not: a paused guest's memory can
/// be written before the first poll).
pub const UNWRITABLE: &str = "unwritable";

/// Whether the [`UNWRITABLE`] fault is asked for (never without
/// `fault-injection`).
fn unwritable_fault() -> bool {
    let asked = fault_asked(UNWRITABLE);
    if asked {
        tracing::warn!(
            "fault injection: the snapshot's directory and files are handed over read-only"
        );
    }
    asked
}

/// What `vmwarden hibernate` prints.
#[derive(Debug, Clone, Serialize)]
pub struct Hibernated {
    pub name: String,
    pub snapshot: PathBuf,
    pub bytes: u64,
    pub capture_ms: u128,
}

fn fault(at: &str) {
    if fault_asked(at) {
        tracing::warn!(at = %at, "fault injection: SIGKILL inside hibernate");
        let _ = nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGKILL);
    }
}

fn sys(op: &'static str, path: PathBuf) -> impl FnOnce(Errno) -> SysError {
    move |errno| SysError { op, path, errno }
}

/// Make `.vmwarden-hibernate.new` and the files root hands the
/// hypervisor, with the principal's file-system ids.
fn make_new(
    state_dir: &Dir,
    principal: &Principal,
    h: &dyn Hibernator,
) -> Result<Vec<OwnedFd>, HibernateError> {
    let new_path = state_dir.path.join(SNAPSHOT_NEW);
    let made = as_principal(principal, || -> Result<Vec<OwnedFd>, SysError> {
        nix::sys::stat::mkdirat(
            state_dir.fd.as_fd(),
            SNAPSHOT_NEW,
            Mode::from_bits_truncate(0o700),
        )
        .map_err(sys("mkdir", new_path.clone()))?;
        let dir = nix::fcntl::openat(
            state_dir.fd.as_fd(),
            SNAPSHOT_NEW,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(sys("open", new_path.clone()))?;
        let unwritable = unwritable_fault();
        let access = if unwritable {
            OFlag::O_RDONLY
        } else {
            OFlag::O_WRONLY
        };
        let mut fds = Vec::new();
        for f in h.precreated() {
            fds.push(
                nix::fcntl::openat(
                    dir.as_fd(),
                    *f,
                    access | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::from_bits_truncate(0o600),
                )
                .map_err(sys("create", new_path.join(f)))?,
            );
        }
        if unwritable {
            nix::sys::stat::fchmod(dir.as_fd(), Mode::from_bits_truncate(0o500))
                .map_err(sys("chmod", new_path.clone()))?;
        }
        Ok(fds)
    })
    .map_err(|e| HibernateError::Principal(e.to_string()))?;
    Ok(made?)
}

fn delete(state_dir: &Dir, entry: &str) -> ownership::Outcome {
    ownership::delete_entries(state_dir, &[OsString::from(entry)], None)
}

/// Whether the spec configured for `name` now exists and does not allow
/// hibernation (or cannot be read: refusing is the safe side). No
/// configured spec (a VM launched from another path) leaves the decision
/// to the spec it runs.
fn configured_forbids(roots: &Roots, name: &VmName) -> bool {
    let path = roots.spec_path(name);
    if std::fs::symlink_metadata(&path).is_err() {
        return false;
    }
    !Spec::read(&path).is_ok_and(|s| hibernate::allowed(&s))
}

/// The writable disks that are block devices (index, path): a write to
/// one moves neither the node's `mtime` nor its `ctime`, so the disk
/// identities a restore checks cannot tell that the guest wrote to it.
pub fn blind_disks(disks: &[DiskSpec]) -> Vec<(usize, PathBuf)> {
    disks
        .iter()
        .enumerate()
        .filter(|(_, d)| !d.read_only)
        .filter(|(_, d)| {
            nix::sys::stat::stat(&d.path).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFBLK)
        })
        .map(|(i, d)| (i, d.path.clone()))
        .collect()
}

/// Hibernate VM `name` within `timeout` (the capture's).
pub fn hibernate(
    roots: &Roots,
    name: &VmName,
    timeout: Duration,
    keep_after_restore: bool,
) -> Result<Hibernated, HibernateError> {
    hibernate_with(roots, name, timeout, keep_after_restore, true)
}

/// [`hibernate()`]; with `stop_unit`, a VM a systemd unit runs is ended
/// through a stop job of that unit once the capture is recorded (its
/// `ExecStop=`, `vmwarden stop`, sees the capture and ends the hypervisor
/// at once): however the hypervisor then dies, a crash on its way out
/// included, the unit's `Restart=` no longer applies, which would restore
/// the snapshot at once. Without (`hibernate-all` at a shutdown, where the
/// unit's stop job is already queued behind the caller's own), the
/// hypervisor is told to end directly.
pub fn hibernate_with(
    roots: &Roots,
    name: &VmName,
    timeout: Duration,
    keep_after_restore: bool,
    stop_unit: bool,
) -> Result<Hibernated, HibernateError> {
    let n = name.to_string();
    if Probe::single().probe(roots, name).is_dead() {
        return Err(HibernateError::NotRunning(n));
    }
    let rundir = dirs::open_dir(&roots.runtime_dir(name))?;
    let intent = Intent::read(&rundir)
        .ok()
        .flatten()
        .ok_or_else(|| HibernateError::NotRunning(n.clone()))?;
    let bytes = launched::copy_bytes(&rundir, &intent)?;
    let spec = bytes
        .as_deref()
        .and_then(|b| Spec::parse(&roots.launched_spec_path(name), b).ok());
    let (Some(spec), Some(bytes)) = (spec, bytes) else {
        return Err(HibernateError::NotAllowed { name: n });
    };
    // The record of the instance must name the snapshot (written at its
    // launch), or a kill mid-capture would leave what nobody looks for.
    if !hibernate::allowed(&spec) || intent.snapshot().is_none() {
        return Err(HibernateError::NotAllowed { name: n });
    }
    // The spec as configured now must allow it too: an operator who set
    // `hibernate.allowed = false` since the launch (a rebuild that did not
    // restart the VM) does not want its memory written to disk, by hand
    // or by `hibernate-all` at the host's shutdown.
    if configured_forbids(roots, name) {
        return Err(HibernateError::ConfiguredForbids { name: n });
    }
    let h = for_kind(spec.hypervisor.kind).map_err(|cause| HibernateError::Hypervisor {
        name: n.clone(),
        cause: Box::new(cause),
    })?;
    let principal = Principal {
        uid: intent.principal.uid,
        gid: intent.principal.gid,
        user: intent.principal.user.clone(),
        groups: Vec::new(),
    };
    let state_dir = dirs::open_dir(&roots.state_dir(name))?;
    let new_path = state_dir.path.join(SNAPSHOT_NEW);
    if ownership::exists_at(&state_dir, OsStr::new(SNAPSHOT_NEW)) {
        return Err(HibernateError::InProgress {
            name: n,
            path: new_path,
        });
    }
    if keep_after_restore {
        if let Some((index, path)) = blind_disks(&spec.disks).into_iter().next() {
            return Err(HibernateError::KeepBlind {
                name: n,
                index,
                path,
            });
        }
    }
    // An instance started from a snapshot that no wait-ready has consumed
    // yet: consume it first (as wait-ready does), since a capture that
    // fails resumes the guest, which must never run while its snapshot is
    // still there to be restored again.
    consume_if_restored(roots, name, &intent, timeout)?;
    let control = control_socket(roots, name, spec.hypervisor.kind);
    let files = make_new(&state_dir, &principal, h)?;
    fault("made");
    let started = Instant::now();
    let captured = h.capture(&control, &new_path, &files, timeout, &|| fault("started"));
    drop(files);
    if let Err(cause) = captured {
        let resumed = h.resume(&control, Duration::from_secs(10));
        let removed = delete(&state_dir, SNAPSHOT_NEW);
        return Err(match (resumed, removed.failed.first()) {
            (Ok(()), None) => HibernateError::Capture {
                name: n,
                partial: new_path,
                cause: Box::new(cause),
            },
            (r, f) => HibernateError::CaptureThen {
                name: n,
                cause: Box::new(cause),
                then: format!(
                    "resume: {}; deleting the partial snapshot: {}",
                    r.map_or_else(|e| e.to_string(), |()| "done".into()),
                    f.map_or_else(
                        || "done".into(),
                        |f| format!("{}: {}", f.path.display(), f.reason)
                    )
                ),
            },
        });
    }
    let capture_ms = started.elapsed().as_millis();
    fault("captured");
    // A previous snapshot (kept after its restore) is replaced.
    let root = dirs::open_dir(&roots.state_root)?;
    let previous = hibernated::remove_with_snapshot(&root, name, &state_dir)?;
    if let Some(f) = previous.and_then(|o| o.failed.into_iter().next()) {
        return Err(HibernateError::Sys(SysError {
            op: "delete the previous snapshot",
            path: f.path,
            errno: Errno::EEXIST,
        }));
    }
    renameat2(
        state_dir.fd.as_fd(),
        SNAPSHOT_NEW,
        state_dir.fd.as_fd(),
        SNAPSHOT_DIR,
        RenameFlags::RENAME_NOREPLACE,
    )
    .map_err(sys("rename", new_path.clone()))?;
    fault("renamed");
    let final_path = state_dir.path.join(SNAPSHOT_DIR);
    let (snapshot, _) = hibernated::snapshot_now(&state_dir, SNAPSHOT_DIR, principal.uid)
        .ok_or_else(|| SysError {
            op: "check the snapshot (the principal's 0700, files 0600)",
            path: final_path.clone(),
            errno: Errno::EPERM,
        })?;
    let manifest = Manifest {
        version: 1,
        vm: n.clone(),
        hypervisor: spec.hypervisor.kind,
        uid: principal.uid,
        identities: Identities::now(&spec, &bytes),
        snapshot,
        created_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        keep_after_restore,
    };
    manifest.write(&root, name)?;
    fault("recorded");
    let unit = if stop_unit {
        liveness::recorded_cgroup(&intent)
            .and_then(|cg| cgroup::managing_unit_elsewhere(cg, name.as_str()))
    } else {
        None
    };
    let stopping = unit.as_deref().and_then(|u| u.split_once('@')).is_some_and(|(prefix, _)| {
        match machined::stop_vm_unit(prefix, name) {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(vm = %name, error = %e, "the unit's stop job could not be queued; ending the hypervisor directly");
                false
            }
        }
    });
    // The unit's ExecStop= ends it; the direct end is the fallback.
    if !stopping || !wait_dead(roots, name, Duration::from_secs(30)) {
        h.quit(&control, Duration::from_secs(10))
            .map_err(|e| HibernateError::Quit {
                name: n.clone(),
                path: final_path.clone(),
                cause: e.to_string(),
            })?;
    }
    let end = Instant::now() + Duration::from_secs(10);
    while !Probe::single().probe(roots, name).is_dead() {
        if Instant::now() >= end {
            return Err(HibernateError::Quit {
                name: n,
                path: final_path,
                cause: "still running 10 s after quit".into(),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    tracing::info!(vm = %name, snapshot = %final_path.display(), bytes = manifest.snapshot.size(), ms = capture_ms, "hibernated");
    Ok(Hibernated {
        name: n,
        snapshot: final_path,
        bytes: manifest.snapshot.size(),
        capture_ms,
    })
}

/// For `wait-ready`: when this instance was restored from the snapshot,
/// wait until the restored VM runs, then consume the snapshot (delete it
/// and root's record) unless it was captured with `--keep-after-restore`.
/// `Ok(false)`: not a restore.
pub fn consume_if_restored(
    roots: &Roots,
    name: &VmName,
    intent: &Intent,
    timeout: Duration,
) -> Result<bool, HibernateError> {
    let Some((snapshot, _, true)) = intent.snapshot() else {
        return Ok(false);
    };
    let kind = intent.hypervisor.unwrap_or(HypervisorKind::Qemu);
    let n = name.to_string();
    let h = for_kind(kind).map_err(|cause| HibernateError::Hypervisor {
        name: n.clone(),
        cause: Box::new(cause),
    })?;
    let control = control_socket(roots, name, kind);
    let end = Instant::now() + timeout;
    loop {
        match h.loaded(&control, snapshot, Duration::from_secs(5)) {
            Ok(true) => break,
            Ok(false) if Instant::now() < end => std::thread::sleep(Duration::from_millis(50)),
            Ok(false) => {
                return Err(HibernateError::Hypervisor {
                    name: n,
                    cause: Box::new(CaptureError::Timeout(timeout)),
                })
            }
            Err(cause) => {
                return Err(HibernateError::Hypervisor {
                    name: n,
                    cause: Box::new(cause),
                })
            }
        }
    }
    tracing::info!(vm = %name, step = %"restore-loaded", "the snapshot is loaded, the guest paused");
    let root = dirs::open_dir(&roots.state_root)?;
    let keep = Manifest::read(&root, name)?.is_some_and(|m| m.keep_after_restore);
    if !keep {
        let state_dir = dirs::open_dir(&roots.state_dir(name))?;
        // Already consumed by an earlier wait-ready: nothing to delete.
        let consumed = hibernated::remove_with_snapshot(&root, name, &state_dir)?;
        if let Some(f) = consumed.and_then(|o| o.failed.into_iter().next()) {
            return Err(HibernateError::Sys(SysError {
                op: "delete the restored snapshot",
                path: f.path,
                errno: Errno::EIO,
            }));
        }
        // Restored: no longer one the host's shutdown put down.
        at_shutdown::forget(roots, name)
            .map_err(|e| HibernateError::AtShutdown(Box::new(e.into())))?;
        tracing::info!(vm = %name, "restored; the snapshot is consumed");
    }
    // Only now does the guest run: a kill before this line leaves it
    // paused (the next wait-ready runs it), never a snapshot of a guest
    // that ran, which the next start would restore a second time.
    h.run_loaded(&control, Duration::from_secs(5))
        .map_err(|cause| HibernateError::Hypervisor {
            name: n.clone(),
            cause: Box::new(cause),
        })?;
    tracing::info!(vm = %name, step = %"restore-resumed", "the restored guest runs");
    fault(RESTORE_KILL_POINT);
    Ok(true)
}

/// Wait until the instance of `name` is dead, at most `d`.
fn wait_dead(roots: &Roots, name: &VmName, d: Duration) -> bool {
    let end = Instant::now() + d;
    loop {
        if Probe::single().probe(roots, name).is_dead() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// For `vmwarden stop`: whether this instance was hibernated (root's
/// record of a capture made during its life is there): then the stop
/// ends the hypervisor at once, without asking a paused guest to power
/// off. `Ok(true)` once ended.
pub fn end_hibernated(
    roots: &Roots,
    name: &VmName,
    intent: &Intent,
    timeout: Duration,
) -> Result<bool, CaptureError> {
    let Ok(Some(m)) = Manifest::read_at(&roots.state_root, name) else {
        return Ok(false);
    };
    if m.created_unix < intent.created_unix || intent.snapshot().is_none() {
        return Ok(false);
    }
    let kind = intent.hypervisor.unwrap_or(HypervisorKind::Qemu);
    let h = for_kind(kind)?;
    h.quit(&control_socket(roots, name, kind), timeout)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writable block-device disk is blind to the guest's writes (a
    /// kept snapshot could be restored again over them); a read-only one
    /// and a regular file are not.
    #[test]
    fn a_writable_block_device_disk_is_blind_to_writes() {
        assert!(nix::unistd::geteuid().is_root(), "this test needs root");
        let t = tempfile::tempdir().unwrap();
        let blk = t.path().join("blk");
        nix::sys::stat::mknod(
            &blk,
            nix::sys::stat::SFlag::S_IFBLK,
            Mode::from_bits_truncate(0o600),
            nix::sys::stat::makedev(7, 0),
        )
        .unwrap();
        let file = t.path().join("disk.img");
        std::fs::write(&file, b"disk").unwrap();
        let disk = |p: &std::path::Path, ro: bool| -> DiskSpec {
            serde_json::from_value(serde_json::json!({ "path": p, "read_only": ro })).unwrap()
        };
        let disks = [disk(&file, false), disk(&blk, true), disk(&blk, false)];
        assert_eq!(blind_disks(&disks), vec![(2, blk)]);
    }
}
