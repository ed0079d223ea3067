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
//! `VMWARDEN_FAULT_AFTER=hibernate:WHERE`, WHERE one of [`KILL_POINTS`].

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
use crate::host::dirs::{self, Dir, DirError};
use crate::host::ownership;
use crate::host::sys::SysError;
use crate::hypervisor::hibernate::{for_kind, CaptureError, Hibernator};
use crate::identity::principal::Principal;
use crate::instance::hibernated::{self, Identities, Manifest, ManifestError};
use crate::instance::intent::Intent;
use crate::instance::launched;
use crate::instance::liveness::Probe;

/// Where `VMWARDEN_FAULT_AFTER=hibernate:WHERE` kills `vmwarden
/// hibernate`: after the directory is made, once the capture started,
/// once complete, once renamed, once recorded.
pub const KILL_POINTS: &[&str] = &["made", "started", "captured", "renamed", "recorded"];

#[derive(Debug, thiserror::Error)]
pub enum HibernateError {
    #[error("VM {0} is not running; nothing to hibernate")]
    NotRunning(String),
    #[error("VM {name}: field `hibernate.allowed` of the spec it runs is not true; a snapshot puts the guest's memory, credentials included, on disk, so hibernation is refused unless the spec allows it")]
    NotAllowed { name: String },
    #[error("VM {name}: {path} exists: a capture is in progress or was killed; stop the VM (cleanup deletes it) before hibernating again")]
    InProgress { name: String, path: PathBuf },
    #[error("VM {name}: the capture failed ({cause}); the VM was resumed and the partial snapshot {partial} deleted")]
    Capture {
        name: String,
        partial: PathBuf,
        cause: CaptureError,
    },
    #[error("VM {name}: the capture failed ({cause}), and then: {then}")]
    CaptureThen {
        name: String,
        cause: CaptureError,
        then: String,
    },
    #[error("VM {name}: {cause}")]
    Hypervisor { name: String, cause: CaptureError },
    #[error(transparent)]
    Dir(#[from] DirError),
    #[error("as the principal: {0}")]
    Principal(String),
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

/// What `vmwarden hibernate` prints.
#[derive(Debug, Clone, Serialize)]
pub struct Hibernated {
    pub name: String,
    pub snapshot: PathBuf,
    pub bytes: u64,
    pub capture_ms: u128,
}

fn fault(at: &str) {
    #[cfg(feature = "fault-injection")]
    if std::env::var("VMWARDEN_FAULT_AFTER").ok().as_deref() == Some(&format!("hibernate:{at}")) {
        tracing::warn!(at = %at, "fault injection: SIGKILL inside hibernate");
        let _ = nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGKILL);
    }
    #[cfg(not(feature = "fault-injection"))]
    let _ = at;
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
    let made =
        crate::launch::root::as_principal(principal, || -> Result<Vec<OwnedFd>, SysError> {
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
            let mut fds = Vec::new();
            for f in h.precreated() {
                fds.push(
                    nix::fcntl::openat(
                        dir.as_fd(),
                        *f,
                        OFlag::O_WRONLY
                            | OFlag::O_CREAT
                            | OFlag::O_EXCL
                            | OFlag::O_NOFOLLOW
                            | OFlag::O_CLOEXEC,
                        Mode::from_bits_truncate(0o600),
                    )
                    .map_err(sys("create", new_path.join(f)))?,
                );
            }
            Ok(fds)
        })
        .map_err(|e| HibernateError::Principal(e.to_string()))?;
    Ok(made?)
}

fn delete(state_dir: &Dir, entry: &str) -> ownership::Outcome {
    ownership::delete_entries(state_dir, &[OsString::from(entry)], None)
}

/// Hibernate VM `name` within `timeout` (the capture's).
pub fn hibernate(
    roots: &Roots,
    name: &VmName,
    timeout: Duration,
    keep_after_restore: bool,
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
        .and_then(|b| crate::config::spec::Spec::parse(&roots.launched_spec_path(name), b).ok());
    let (Some(spec), Some(bytes)) = (spec, bytes) else {
        return Err(HibernateError::NotAllowed { name: n });
    };
    // The record of the instance must name the snapshot (written at its
    // launch), or a kill mid-capture would leave what nobody looks for.
    if !hibernate::allowed(&spec) || intent.snapshot().is_none() {
        return Err(HibernateError::NotAllowed { name: n });
    }
    let h = for_kind(spec.hypervisor.kind).map_err(|cause| HibernateError::Hypervisor {
        name: n.clone(),
        cause,
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
    let control = crate::control::control_socket(roots, name, spec.hypervisor.kind);
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
                cause,
            },
            (r, f) => HibernateError::CaptureThen {
                name: n,
                cause,
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
    hibernated::remove(&root, name)?;
    if ownership::exists_at(&state_dir, OsStr::new(SNAPSHOT_DIR)) {
        if let Some(f) = delete(&state_dir, SNAPSHOT_DIR).failed.first() {
            return Err(HibernateError::Sys(SysError {
                op: "delete the previous snapshot",
                path: f.path.clone(),
                errno: Errno::EEXIST,
            }));
        }
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
    h.quit(&control, Duration::from_secs(10))
        .map_err(|e| HibernateError::Quit {
            name: n.clone(),
            path: final_path.clone(),
            cause: e.to_string(),
        })?;
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
    let kind = intent
        .hypervisor
        .unwrap_or(crate::config::spec::HypervisorKind::Qemu);
    let n = name.to_string();
    let h = for_kind(kind).map_err(|cause| HibernateError::Hypervisor {
        name: n.clone(),
        cause,
    })?;
    let control = crate::control::control_socket(roots, name, kind);
    let end = Instant::now() + timeout;
    loop {
        match h.restored_from(&control, snapshot, Duration::from_secs(5)) {
            Ok(true) => break,
            Ok(false) if Instant::now() < end => std::thread::sleep(Duration::from_millis(50)),
            Ok(false) => {
                return Err(HibernateError::Hypervisor {
                    name: n,
                    cause: CaptureError::Timeout(timeout),
                })
            }
            Err(cause) => return Err(HibernateError::Hypervisor { name: n, cause }),
        }
    }
    let root = dirs::open_dir(&roots.state_root)?;
    let keep = Manifest::read(&root, name)?.is_some_and(|m| m.keep_after_restore);
    if !keep {
        hibernated::remove(&root, name)?;
        let state_dir = dirs::open_dir(&roots.state_dir(name))?;
        if let Some(f) = delete(&state_dir, SNAPSHOT_DIR).failed.first() {
            return Err(HibernateError::Sys(SysError {
                op: "delete the restored snapshot",
                path: f.path.clone(),
                errno: Errno::EIO,
            }));
        }
        tracing::info!(vm = %name, "restored; the snapshot is consumed");
    }
    Ok(true)
}
