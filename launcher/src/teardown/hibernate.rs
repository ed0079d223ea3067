//! Teardown's part of hibernation (`config::hibernate`). A snapshot is two
//! things to teardown:
//! * the complete one (`STATE/NAME/.vmwarden-hibernate` with root's record
//!   `STATE/.hibernated-NAME.json`): the user's data, like a volume.
//!   Cleanup and reap keep it and say so; verify-clean reports it (a pass);
//!   `purge` deletes it as part of the state dir minus the keep set, with
//!   no list of its own, removes the record ([`purge_record`]), and
//!   takes the VM off the record of the VMs the host's shutdown
//!   hibernated once the snapshot is gone ([`purge_at_shutdown`]);
//! * one being written (`.vmwarden-hibernate.new`): never a snapshot
//!   anyone may restore. A capture killed half way leaves it; once the
//!   instance whose intent record names it is dead, cleanup deletes it
//!   ([`cleanup`]), and verify-clean fails while one is there and no
//!   instance runs ([`verify_check`]). So does a complete one root has no
//!   record of (a hibernate killed between the rename and the record, or
//!   what a cold boot's discard could not delete): no start would restore
//!   it. Cleanup deletes it, and once it is gone takes the VM off the
//!   shutdown's record, as the discard would have.

use std::ffi::OsString;
use std::path::Path;

use crate::config::hibernate::{SNAPSHOT_DIR, SNAPSHOT_NEW};
use crate::config::names::VmName;
use crate::config::paths::Roots;
use crate::host::dirs;
use crate::host::ownership::{self, Failed, Kept, Outcome};
use crate::instance::at_shutdown;
use crate::instance::hibernated::{self, Manifest};
use crate::instance::intent::Intent;

/// Cleanup of a dead instance: delete the half-written snapshot the
/// record names (only that exact name in this VM's state dir, reached
/// without a symlink, deleted without following one), and report the
/// complete one kept.
pub fn cleanup(roots: &Roots, name: &VmName, intent: Option<&Intent>) -> Outcome {
    let mut out = Outcome::default();
    let Some((path, temp, _)) = intent.and_then(Intent::snapshot) else {
        return out;
    };
    let own = roots.state_dir(name);
    if temp != own.join(SNAPSHOT_NEW) || path != own.join(SNAPSHOT_DIR) {
        out.kept.push(Kept {
            path: temp.to_path_buf(),
            reason: "recorded snapshot is not one vmwarden names; not deleted".into(),
        });
        return out;
    }
    let dir = match dirs::open_dir(&own) {
        Ok(d) => d,
        Err(e) if e.is_not_found() => return out,
        Err(e) => {
            out.failed.push(Failed {
                path: own,
                reason: e.to_string(),
            });
            return out;
        }
    };
    if ownership::exists_at(&dir, std::ffi::OsStr::new(SNAPSHOT_NEW)) {
        out.merge(ownership::delete_entries(
            &dir,
            &[OsString::from(SNAPSHOT_NEW)],
            ownership::test_skip_delete().as_deref(),
        ));
    }
    let recorded = Manifest::read_at(&roots.state_root, name)
        .map(|m| m.is_some())
        .unwrap_or(true);
    if ownership::exists_at(&dir, std::ffi::OsStr::new(SNAPSHOT_DIR)) && !recorded {
        // Renamed but never recorded (a hibernate killed in between), or
        // its record removed by a restore killed before deleting it, or
        // by a cold boot's discard that could not delete all of it: no
        // start restores it, so it is not kept.
        out.merge(ownership::delete_entries(
            &dir,
            &[OsString::from(SNAPSHOT_DIR)],
            ownership::test_skip_delete().as_deref(),
        ));
        out.merge(forget_once_gone(roots, name, &dir));
    } else if ownership::exists_at(&dir, std::ffi::OsStr::new(SNAPSHOT_DIR)) {
        out.kept.push(Kept {
            path: path.to_path_buf(),
            reason: "hibernation snapshot: complete and the user's; the next start restores it, only `vmwarden purge` deletes it".into(),
        });
    }
    out
}

/// Cleanup, once it finished deleting a snapshot root has no record of:
/// the VM taken off the record of the VMs the host's shutdown hibernated
/// ([`at_shutdown::forget`]), as the discard that started the deletion
/// would have, only when the snapshot is verified gone from `dir` (a
/// deletion that failed keeps the name). A record that cannot be updated
/// is a failure naming its path: the cleanup is not clean, and the next
/// one does not retry (nothing is left to delete): `vmwarden purge` does.
fn forget_once_gone(roots: &Roots, name: &VmName, dir: &dirs::Dir) -> Outcome {
    let mut out = Outcome::default();
    if ownership::exists_at(dir, std::ffi::OsStr::new(SNAPSHOT_DIR)) {
        return out;
    }
    if let Err(e) = at_shutdown::forget(roots, name) {
        out.failed.push(Failed {
            path: at_shutdown::path(roots),
            reason: e.to_string(),
        });
    }
    out
}

/// `purge`: the record goes with the snapshot (the snapshot itself is in
/// the state dir, which purge empties minus the keep set). When the keep
/// set keeps the snapshot, the record stays too.
pub fn purge_record(roots: &Roots, name: &VmName, kept: &[String]) -> Outcome {
    let mut out = Outcome::default();
    if kept.iter().any(|k| k == SNAPSHOT_DIR) {
        return out;
    }
    let Ok(Some(root)) = dirs::open_dir_if_exists(&roots.state_root) else {
        return out;
    };
    let path = root.path.join(hibernated::record_name(name));
    if !ownership::exists_at(&root, path.file_name().unwrap_or_default()) {
        return out;
    }
    match hibernated::remove(&root, name) {
        Ok(()) => out.deleted.push(path),
        Err(e) => out.failed.push(Failed {
            path,
            reason: e.to_string(),
        }),
    }
    out
}

/// `purge`, once the snapshot is gone: the VM taken off root's record of
/// the VMs the host's shutdown hibernated ([`at_shutdown::forget`]), so
/// that a later hibernation by hand does not have the next boot start
/// it. A snapshot still there (kept by the keep set, or a deletion that
/// failed, reported as such) keeps its name there. A record that cannot
/// be updated is a failure naming its path: the purge is not ok and
/// retires nothing, and a purge run again takes the name off.
pub fn purge_at_shutdown(roots: &Roots, name: &VmName, kept: &[String]) -> Outcome {
    let mut out = Outcome::default();
    if kept.iter().any(|k| k == SNAPSHOT_DIR) {
        return out;
    }
    let gone = match dirs::open_dir(&roots.state_dir(name)) {
        Ok(d) => !ownership::exists_at(&d, std::ffi::OsStr::new(SNAPSHOT_DIR)),
        Err(e) => e.is_not_found(),
    };
    if gone {
        if let Err(e) = at_shutdown::forget(roots, name) {
            out.failed.push(Failed {
                path: at_shutdown::path(roots),
                reason: e.to_string(),
            });
        }
    }
    out
}

/// What `status` shows of a hibernated VM: the snapshot's size (bytes) and
/// when it was made (unix seconds), from root's record.
pub fn hibernated(roots: &Roots, name: &VmName) -> Option<(u64, u64)> {
    let m = Manifest::read_at(&roots.state_root, name).ok()??;
    Some((m.snapshot.size(), m.created_unix))
}

/// verify-clean's `no-half-written-snapshot`: no `.vmwarden-hibernate.new`
/// in the VM's state dir unless an instance runs (it may be capturing).
pub fn verify_check(roots: &Roots, name: &VmName, running: bool) -> (bool, String) {
    let new = roots.state_dir(name).join(SNAPSHOT_NEW);
    let there = exists(&new);
    let complete = exists(&roots.state_dir(name).join(SNAPSHOT_DIR));
    let recorded = Manifest::read_at(&roots.state_root, name)
        .map(|m| m.is_some())
        .unwrap_or(true);
    let actual = match (there, complete) {
        (false, false) => "none".to_string(),
        (false, true) if recorded || running => {
            format!("none (a complete snapshot is kept: {SNAPSHOT_DIR})")
        }
        (false, true) => format!("{SNAPSHOT_DIR} without root's record (no start restores it)"),
        (true, _) if running => "one being written by the running instance".to_string(),
        (true, _) => format!("{} (half written, no instance running)", new.display()),
    };
    (running || (!there && (recorded || !complete)), actual)
}

fn exists(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}
