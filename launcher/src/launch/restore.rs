//! Restore instead of boot (`restore-checked`, right after
//! `principal-resolved`; nothing is created yet, so a refusal leaves the
//! host as it was): when root's record `STATE/.hibernated-NAME.json` names
//! a complete snapshot, every identity it holds is compared with what this
//! launch would run (`instance::hibernated`). All equal: the snapshot's
//! files are opened read-only by root (not following a symlink, checked to
//! be the captured inodes, the principal's 0600) and handed to the
//! hypervisor as fds ([`Restore`]). A difference: refused naming it (exit
//! 78), the snapshot kept; or, with `hibernate.on_mismatch = "cold-boot"`,
//! logged, the snapshot discarded once the lease is held ([`discard`]),
//! and booted cold. Under the lease the decision is taken again when it
//! chose a restore or root's record changed since ([`again`]): another
//! instance may have run in between.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use crate::config::hibernate::{self, OnMismatch, SNAPSHOT_DIR, SNAPSHOT_NEW};
use crate::config::names::VmName;
use crate::config::paths::Roots;
use crate::config::spec::Spec;
use crate::host::dirs::{self, DirError};
use crate::host::sys::SysError;
use crate::hypervisor::hibernate::for_kind;
use crate::identity::principal::Principal;
use crate::instance::at_shutdown;
use crate::instance::hibernated::{self, Identities, Manifest, ManifestError};
use crate::instance::intent::Resource;

/// Why a restore is refused.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The snapshot does not match what this launch would run.
    #[error("VM {name}: the hibernation snapshot {snapshot} does not match what would run: {}; field `hibernate.on_mismatch` is \"refuse\": the snapshot is kept (`vmwarden purge {name}` deletes it, or set it to \"cold-boot\")", .differences.join("; "))]
    Mismatch {
        name: String,
        snapshot: PathBuf,
        differences: Vec<String>,
    },
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Dir(DirError),
    /// What a cold boot could not delete of the stale snapshot.
    #[error("{path}: the stale hibernation snapshot could not be discarded: {reason}; root's record of it is removed, so no start restores what is left, and the cleanup after the next instance deletes it once nothing keeps it")]
    Discard { path: PathBuf, reason: String },
    /// The stale snapshot is gone, but the VM could not be taken off the
    /// record of the VMs the host's shutdown hibernated ([`discard`]).
    #[error("VM {name}: the start is refused: its stale hibernation snapshot is discarded, but {source}, which may still name the VM (the next start boots cold; the next boot's `vmwarden start-hibernated` skips a VM without a snapshot)")]
    AtShutdown {
        name: String,
        #[source]
        source: Box<at_shutdown::RecordError>,
    },
    #[error("{0}")]
    Open(#[from] SysError),
}

impl RestoreError {
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            RestoreError::Mismatch { .. } | RestoreError::Manifest(_)
        )
    }
}

/// A snapshot to restore: its record and its files, opened by root, in
/// the record's order.
#[derive(Debug)]
pub struct Restore {
    pub manifest: Manifest,
    pub files: Vec<(String, OwnedFd)>,
}

impl Restore {
    /// The fd of the snapshot file `name`.
    pub fn file(&self, name: &str) -> Option<&OwnedFd> {
        self.files.iter().find(|(n, _)| n == name).map(|(_, f)| f)
    }
}

/// What a start does: restore, or boot (with a stale snapshot to discard
/// under the lease, [`discard`]).
#[derive(Debug)]
pub struct Decision {
    pub restore: Option<Restore>,
    pub stale: bool,
    /// Root's record as this decision read it ([`again`]).
    seen: Option<Manifest>,
}

impl Decision {
    fn boot(stale: bool, seen: Option<Manifest>) -> Decision {
        Decision {
            restore: None,
            stale,
            seen,
        }
    }
}

/// Decide: restore, or boot.
pub fn decide(
    spec: &Spec,
    spec_bytes: &[u8],
    roots: &Roots,
    principal: &Principal,
) -> Result<Decision, RestoreError> {
    let Some(manifest) = Manifest::read_at(&roots.state_root, &spec.name)? else {
        return Ok(Decision::boot(false, None));
    };
    let seen = Some(manifest.clone());
    let state_dir = roots.state_dir(&spec.name);
    let snapshot = state_dir.join(SNAPSHOT_DIR);
    let opened = dirs::open_dir_if_exists(&state_dir)
        .ok()
        .flatten()
        .and_then(|d| hibernated::snapshot_now(&d, SNAPSHOT_DIR, principal.uid));
    let mut differences = manifest.mismatches(
        &Identities::now(spec, spec_bytes),
        opened.as_ref().map(|(id, _)| id),
    );
    if let (Some((_, dir)), Ok(h)) = (&opened, for_kind(spec.hypervisor.kind)) {
        differences.extend(h.mismatches(spec, roots, dir));
    }
    if !hibernate::allowed(spec) {
        differences.push("hibernate.allowed: the spec no longer allows hibernation".into());
    }
    if manifest.uid != principal.uid {
        differences.push("principal: the snapshot is another principal's".into());
    }
    if !differences.is_empty() {
        let on = spec.hibernate.map(|h| h.on_mismatch).unwrap_or_default();
        if on == OnMismatch::ColdBoot {
            tracing::warn!(
                snapshot = %snapshot.display(),
                differences = %differences.join("; "),
                "hibernate.on_mismatch = \"cold-boot\": booting cold; the snapshot is discarded (a guest that has run from its disks makes it stale)"
            );
            return Ok(Decision::boot(true, seen));
        }
        return Err(RestoreError::Mismatch {
            name: spec.name.to_string(),
            snapshot,
            differences,
        });
    }
    let Some((_, dir)) = opened else {
        return Ok(Decision::boot(false, seen));
    };
    let mut files = Vec::new();
    for f in &manifest.snapshot.files {
        files.push((
            f.name.clone(),
            hibernated::open_snapshot_file(&dir, f, principal.uid)?,
        ));
    }
    tracing::info!(
        step = %"restore-checked",
        snapshot = %snapshot.display(),
        bytes = manifest.snapshot.size(),
        "restoring from the hibernation snapshot"
    );
    Ok(Decision {
        restore: Some(Restore { manifest, files }),
        stale: false,
        seen,
    })
}

/// The decision `d`, taken before the VM's lease, checked under it: another
/// instance may have run in between and hibernated (a record where there
/// was none), restored and consumed the snapshot, or written to the disks
/// a restore compares. A decision to restore, or one whose record has
/// changed since, is taken again now that no instance can change either;
/// otherwise `d` stands. Booting cold beside a snapshot recorded meanwhile
/// would leave it stale, and restoring one another instance has run past
/// would put old RAM over newer disks.
pub fn again(
    d: Decision,
    spec: &Spec,
    spec_bytes: &[u8],
    roots: &Roots,
    principal: &Principal,
) -> Result<Decision, RestoreError> {
    if d.restore.is_none() && Manifest::read_at(&roots.state_root, &spec.name)? == d.seen {
        return Ok(d);
    }
    drop(d);
    decide(spec, spec_bytes, roots, principal)
}

/// Discard the snapshot a cold boot makes stale: once the guest has run
/// from its disks, the RAM the snapshot holds no longer matches them, and
/// restoring it later (the difference gone, say a spec put back) would
/// corrupt them; libvirt's `start --force-boot` drops its managed save
/// for the same reason. Root's record goes first, so no start restores a
/// half-deleted snapshot; then the snapshot, by the teardown's own
/// deletion (`openat`, never following a link). Anything it cannot delete
/// refuses the start, naming the path: a RAM image is never left behind
/// silently. Called under the VM's lease (a launch that loses the lease
/// to a running instance discards nothing), never for a probe (it boots
/// no guest, so nothing goes stale).
///
/// Once the snapshot is gone, the VM is taken off the record of the VMs
/// the host's shutdown hibernated ([`at_shutdown::forget`]): it no longer
/// has the snapshot that record is about, and a later hibernation by hand
/// must not have the next boot start it. A record that cannot be updated
/// (unreadable, unparsable, unwritable) refuses the start too, naming its
/// path, although the snapshot is already gone: the start is refused
/// before anything is made, as a discard that left a file refuses it, and
/// a refused start is what the unit's state shows, where a line in a
/// running VM's journal is missed. The harm it reports is bounded (the
/// next start, having nothing to discard, boots cold; the next boot skips
/// a VM without a snapshot unless it was hibernated by hand meanwhile), so
/// the refusal is to be seen, not to protect the guest.
pub fn discard(roots: &Roots, name: &VmName) -> Result<(), RestoreError> {
    let root = dirs::open_dir(&roots.state_root).map_err(RestoreError::Dir)?;
    match dirs::open_dir_if_exists(&roots.state_dir(name)).map_err(RestoreError::Dir)? {
        None => hibernated::remove(&root, name)?,
        Some(state_dir) => {
            if let Some(out) = hibernated::remove_with_snapshot(&root, name, &state_dir)? {
                let left = out
                    .failed
                    .into_iter()
                    .map(|f| (f.path, f.reason))
                    .chain(out.kept.into_iter().map(|k| (k.path, k.reason)))
                    .next();
                if let Some((path, reason)) = left {
                    return Err(RestoreError::Discard { path, reason });
                }
            }
        }
    }
    at_shutdown::forget(roots, name).map_err(|source| RestoreError::AtShutdown {
        name: name.to_string(),
        source: Box::new(source),
    })
}

/// The intent record's entry for the snapshot of a VM that may hibernate.
pub fn record(spec: &Spec, state_dir: &Path, restoring: bool) -> Option<Resource> {
    hibernate::allowed(spec).then(|| Resource::Snapshot {
        path: state_dir.join(SNAPSHOT_DIR),
        temp: state_dir.join(SNAPSHOT_NEW),
        restoring,
    })
}

/// The boot's `argv` changed to start from `restore` (the hypervisor's
/// [`crate::hypervisor::hibernate::Hibernator::restore_argv`]); unchanged
/// for a boot or a probe.
pub fn argv(
    spec: &Spec,
    argv: Vec<String>,
    restore: Option<&Restore>,
    probe: bool,
    state_dir: &Path,
) -> Vec<String> {
    use std::os::fd::AsRawFd;
    let (Some(r), false) = (restore, probe) else {
        return argv;
    };
    let Ok(h) = for_kind(spec.hypervisor.kind) else {
        return argv;
    };
    let fds: Vec<(String, i32)> = r
        .files
        .iter()
        .map(|(n, f)| (n.clone(), f.as_raw_fd()))
        .collect();
    h.restore_argv(argv, &state_dir.join(SNAPSHOT_DIR), &fds)
}
