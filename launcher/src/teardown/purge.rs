//! `vmwarden purge NAME [--keep-identity]`: delete a stopped VM's persistent
//! state. The plan is `E(state dir) \ K`, where K is empty, or with
//! `--keep-identity` the identity set (`identity/` plus `keep_on_purge`).
//! The state dir itself stays. Without `--keep-identity` the principal is
//! retired (a tombstone in the registry), failing closed.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use serde::Serialize;

use crate::config::names::VmName;
use crate::config::paths::Roots;
use crate::config::rawpath;
use crate::host::dirs::{self, Dir, DirError};
use crate::host::ownership::{self, Outcome};
use crate::host::sys::{SysContext, SysError};
use crate::identity::registry::{self, IdRange, RangeRecord, Record};
use crate::identity::{principal, ranges};
use crate::instance::launched::effective_spec_of;
use crate::instance::lease::LeaseError;
use crate::instance::liveness::{self, Verdict};
use crate::teardown::hibernate;
use crate::teardown::lease_as_a_launch;
use crate::teardown::made_sources::{self, SourceFate};

/// A purge refused (the VM is not dead), or one that cannot start.
#[derive(Debug, thiserror::Error)]
pub enum PurgeError {
    #[error("{path}: refused: VM {name} is {}; stop it first", .verdict.reason())]
    NotStopped {
        path: PathBuf,
        name: String,
        verdict: Verdict,
    },
    #[error("{path}: refused: VM {name} started while purge was confirming; nothing deleted")]
    StartedMeanwhile { path: PathBuf, name: String },
    /// The re-check under the lease found it live or ambiguous.
    #[error("{path}: refused: VM {name} is not dead ({}); nothing deleted", .verdict.detail())]
    NotDead {
        path: PathBuf,
        name: String,
        verdict: Verdict,
    },
    #[error(transparent)]
    Dir(#[from] DirError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error(transparent)]
    Sys(#[from] SysError),
    /// The registry (the VM's id range) cannot be read.
    #[error(transparent)]
    Registry(#[from] registry::RegistryError),
}

impl PurgeError {
    /// A purge refused (`EX_CONFIG`).
    pub fn is_refusal(&self) -> bool {
        match self {
            PurgeError::NotStopped { .. }
            | PurgeError::StartedMeanwhile { .. }
            | PurgeError::NotDead { .. } => true,
            PurgeError::Dir(e) => e.is_refusal(),
            PurgeError::Lease(e) => e.is_refusal(),
            PurgeError::Sys(_) => false,
            PurgeError::Registry(e) => e.is_refusal(),
        }
    }
}

type Result<T, E = PurgeError> = std::result::Result<T, E>;

/// What a user must type, on a terminal, to confirm.
pub const CONFIRM_PHRASE: &str = "DELETE-EVERYTHING";
pub const IDENTITY_DIR: &str = "identity";

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Plan {
    #[serde(serialize_with = "rawpath::path")]
    pub state_dir: PathBuf,
    pub keep: Vec<String>,
    #[serde(serialize_with = "rawpath::paths")]
    pub delete: Vec<PathBuf>,
    /// The VM's principal uid, when it can be determined (re-checked for
    /// liveness under the lease before anything is deleted).
    pub principal_uid: Option<u32>,
    pub retire_uid: Option<u32>,
    /// The VM's own id range (what its guest owns on writable virtiofs
    /// shares), retired with the principal: never handed out again.
    pub retire_range: Option<IdRange>,
    /// Share sources the guest owns outside the state dir: purge leaves
    /// them, and their files keep the range's ids.
    #[serde(serialize_with = "rawpath::paths")]
    pub outside: Vec<PathBuf>,
    /// A range record of this VM that cannot be used, named: purge leaves
    /// it (its ids stay unusable) and deletes the rest.
    pub range_problem: Option<String>,
    /// Share sources outside the state dir: deleted when vmwarden made
    /// them (`teardown::made_sources`), kept otherwise, each with why.
    pub share_sources: Vec<SourceFate>,
}

/// The keep set K: nothing, or `identity` plus the spec's `keep_on_purge`.
pub fn keep_set(keep_identity: bool, keep_on_purge: &[String]) -> Vec<String> {
    if !keep_identity {
        return Vec::new();
    }
    let mut k = vec![IDENTITY_DIR.to_string()];
    k.extend(keep_on_purge.iter().cloned());
    k.sort();
    k.dedup();
    k
}

/// `E(dir) \ K` where K may hold nested paths (`a/b` keeps `a/b`, and `a`
/// itself is descended into rather than deleted). Names are compared and
/// kept as raw bytes: a name that is not UTF-8 is planned like any other.
pub fn plan_entries(dir: &Dir, keep: &[String]) -> Result<Vec<PathBuf>> {
    let names = ownership::entries(dir).sys("read directory", &dir.path)?;
    let mut out = Vec::new();
    for n in names {
        let nb = n.as_bytes();
        if keep.iter().any(|k| k.as_bytes() == nb) {
            continue;
        }
        let nested: Vec<String> = keep
            .iter()
            .filter_map(|k| {
                let (first, rest) = k.split_once('/')?;
                (first.as_bytes() == nb).then(|| rest.to_string())
            })
            .collect();
        if nested.is_empty() {
            out.push(dir.path.join(&n));
            continue;
        }
        // A kept path below a non-directory keeps the entry (ambiguity keeps).
        if let Ok(Some(sub)) = dirs::open_existing(dir, &n) {
            out.extend(plan_entries(&sub, &nested)?);
        }
    }
    Ok(out)
}

/// `keep_on_purge` and the principal's uid from the spec to believe: the
/// launched copy while the instance's record exists, else the configured
/// spec; without either, `identity` alone and no uid.
fn spec_keep_and_uid(roots: &Roots, name: &VmName) -> (Vec<String>, Option<u32>) {
    match effective_spec_of(roots, name) {
        Some((s, _)) => (s.keep_on_purge.clone(), principal::uid_of(&s).ok()),
        None => (vec![IDENTITY_DIR.to_string()], None),
    }
}

/// The uid to retire: the spec's, else the registry's record for this VM,
/// else the state dir's owner.
fn principal_uid(
    roots: &Roots,
    name: &VmName,
    spec_uid: Option<u32>,
    state_dir: &Dir,
) -> Option<u32> {
    spec_uid
        .or_else(|| {
            registry::all(roots)
                .ok()?
                .records
                .into_iter()
                .find(|r| &r.vm == name)
                .map(|r| r.uid)
        })
        .or_else(|| state_dir.stat().ok().map(|s| s.st_uid).filter(|u| *u != 0))
}

pub fn plan(roots: &Roots, name: &VmName, keep_identity: bool) -> Result<Plan> {
    let verdict = liveness::probe(roots, name);
    if !verdict.is_dead() {
        return Err(PurgeError::NotStopped {
            path: roots.state_dir(name),
            name: name.to_string(),
            verdict,
        });
    }
    let state_dir = match dirs::open_dir(&roots.state_dir(name)) {
        Ok(d) => d,
        Err(e) if e.is_not_found() => match registry::range_of(roots, name)? {
            Some(range) => return Ok(plan_without_state_dir(roots, name, keep_identity, range)),
            None => return Err(e.into()),
        },
        Err(e) => return Err(e.into()),
    };
    let (kop, spec_uid) = spec_keep_and_uid(roots, name);
    let keep = keep_set(keep_identity, &kop);
    let delete = plan_entries(&state_dir, &keep)?;
    let uid = principal_uid(roots, name, spec_uid, &state_dir);
    let retire_uid = if keep_identity { None } else { uid };
    // The range belongs to the identity set: kept with it, retired with
    // the principal otherwise.
    // A range record of this VM that cannot be used stays as it is (its
    // ids unusable), named in the plan; the rest of the purge goes on.
    let (range, range_problem) = match registry::range_of(roots, name) {
        Ok(r) => (r, None),
        Err(e @ registry::RegistryError::Range(ranges::RangeError::BadRecord { .. })) => {
            (None, Some(e.to_string()))
        }
        Err(e) => return Err(e.into()),
    };
    let spec = effective_spec_of(roots, name).map(|(s, _)| s);
    let share_sources = made_sources::plan(roots, name, spec.as_ref(), uid, range);
    let deleted = |p: &PathBuf| {
        share_sources
            .iter()
            .any(|f| &f.path == p && f.action == "delete")
    };
    let outside = spec
        .map(|s| {
            s.shares
                .iter()
                .filter(|sh| sh.guest_owned() && !sh.source.starts_with(&state_dir.path))
                .map(|sh| sh.source.clone())
                .filter(|p| !deleted(p))
                .collect()
        })
        .unwrap_or_default();
    Ok(Plan {
        state_dir: state_dir.path.clone(),
        keep,
        delete,
        principal_uid: uid,
        retire_uid,
        retire_range: if keep_identity { None } else { range },
        outside: if range.is_some() { outside } else { Vec::new() },
        range_problem,
        share_sources,
    })
}

/// The plan for VM `name` with no state dir (nor, maybe, a state root)
/// but an active id range `range`: a launch killed, or refused, after it
/// took the range at `lease-taken` (before the intent record,
/// `launch::lock_order`) and before it made the state dir. Nothing to
/// delete; the range is retired as any (`ranges::retire`: recyclable when
/// its shares lay in the state dir), and a registration with it if the
/// launch got that far.
fn plan_without_state_dir(
    roots: &Roots,
    name: &VmName,
    keep_identity: bool,
    range: IdRange,
) -> Plan {
    let registered = registry::all(roots).ok().and_then(|b| {
        b.records
            .into_iter()
            .find(|r| &r.vm == name && r.state == registry::State::Active)
            .map(|r| r.uid)
    });
    let spec = effective_spec_of(roots, name).map(|(s, _)| s);
    let spec_uid = spec.as_ref().and_then(|s| principal::uid_of(s).ok());
    let outside = spec
        .map(|s| {
            s.shares
                .iter()
                .filter(|sh| sh.guest_owned())
                .map(|sh| sh.source.clone())
                .collect()
        })
        .unwrap_or_default();
    Plan {
        state_dir: roots.state_dir(name),
        keep: keep_set(keep_identity, &[]),
        delete: Vec::new(),
        // Re-checked for liveness under the lease all the same.
        principal_uid: spec_uid.or(registered),
        retire_uid: registered.filter(|_| !keep_identity),
        retire_range: (!keep_identity).then_some(range),
        outside,
        range_problem: None,
        share_sources: Vec::new(),
    }
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Report {
    pub plan: Plan,
    pub outcome: Outcome,
    pub retired: Option<Record>,
    /// The id ranges retired (tombstones).
    pub retired_ranges: Vec<RangeRecord>,
    /// Why the principal (or its range) was not retired when it should
    /// have been.
    pub retire_error: Option<String>,
}

impl Report {
    /// Everything deleted, and whatever was to be retired retired.
    pub fn ok(&self) -> bool {
        self.outcome.failed.is_empty()
            && self.retire_error.is_none()
            && (self.plan.retire_uid.is_none() || self.retired.is_some())
            && (self.plan.retire_range.is_none() || !self.retired_ranges.is_empty())
    }
}

/// Carry out `plan` under the VM's lease (no launch can start meanwhile).
pub fn execute(roots: &Roots, name: &VmName, plan: Plan) -> Result<Report> {
    // Hold the launcher's lease for the whole deletion, creating the runtime
    // dir and lease file if needed (exactly as a launch would), so no launch
    // can start between the confirmation and the last unlink.
    let Some(_lease) = lease_as_a_launch::<PurgeError>(roots, name)? else {
        return Err(PurgeError::StartedMeanwhile {
            path: plan.state_dir.clone(),
            name: name.to_string(),
        });
    };
    // Re-check under the lease, whatever the plan retires.
    let recheck = match plan.principal_uid {
        // The uid's processes anywhere, not just an instance's cgroup: the
        // principal is about to be retired.
        Some(uid) => liveness::probe_with_lease_held(roots, name, uid, None),
        None => Verdict::Dead,
    };
    if !recheck.is_dead() {
        return Err(PurgeError::NotDead {
            path: plan.state_dir.clone(),
            name: name.to_string(),
            verdict: recheck,
        });
    }
    let mut outcome = Outcome::default();
    // Group by parent dir so each deletion is an openat under its parent,
    // by the entry's raw name (never a lossy or UTF-8-filtered string).
    let mut by_parent: std::collections::BTreeMap<PathBuf, Vec<OsString>> = Default::default();
    for p in &plan.delete {
        match (p.parent(), p.file_name()) {
            (Some(parent), Some(n)) if parent.starts_with(&plan.state_dir) => by_parent
                .entry(parent.to_path_buf())
                .or_default()
                .push(n.to_os_string()),
            _ => outcome.failed.push(ownership::Failed {
                path: p.clone(),
                reason: format!(
                    "not an entry inside the state dir {}; not deleted",
                    plan.state_dir.display()
                ),
            }),
        }
    }
    for (parent, names) in by_parent {
        match dirs::open_dir(&parent) {
            Ok(d) => outcome.merge(ownership::delete_entries(&d, &names, None)),
            Err(e) => outcome.failed.push(ownership::Failed {
                path: parent.clone(),
                reason: e.to_string(),
            }),
        }
    }
    // Verify: enumerate again. Whatever is still there and not kept is a
    // failure, whatever the deletions reported; the principal is retired
    // only when nothing is left.
    // No state dir (`plan_without_state_dir`, or none left): nothing left.
    let left = dirs::open_dir_if_exists(&plan.state_dir)
        .map_err(PurgeError::from)
        .and_then(|d| d.map_or(Ok(Vec::new()), |d| plan_entries(&d, &plan.keep)));
    match left {
        Ok(left) => {
            for p in left {
                if !outcome.failed.iter().any(|f| f.path == p) {
                    outcome.failed.push(ownership::Failed {
                        path: p,
                        reason: "still present after purge".into(),
                    });
                }
            }
        }
        Err(e) => outcome.failed.push(ownership::Failed {
            path: plan.state_dir.clone(),
            reason: format!("cannot re-enumerate after deleting: {e}"),
        }),
    }
    // The share sources vmwarden made, each checked again.
    outcome.merge(made_sources::execute(roots, name, &plan.share_sources));
    // Root's record of a hibernation snapshot goes with the snapshot.
    outcome.merge(hibernate::purge_record(roots, name, &plan.keep));
    // And, once it is gone, the VM's name in the shutdown's record.
    outcome.merge(hibernate::purge_at_shutdown(roots, name, &plan.keep));
    // Retirement fails closed, but what was deleted is still reported.
    let (retired, mut retire_error) = match (plan.retire_uid, outcome.failed.is_empty()) {
        (Some(uid), true) => match registry::retire(roots, name, uid) {
            Ok(r) => (Some(r), None),
            Err(e) => (None, Some(e.to_string())),
        },
        (Some(_), false) => (None, Some("not retired: some deletions failed".to_string())),
        (None, _) => (None, None),
    };
    // The range likewise, and only then: fails closed too.
    let mut retired_ranges = Vec::new();
    if plan.retire_range.is_some() {
        if outcome.failed.is_empty() && retire_error.is_none() {
            match ranges::retire(roots, name, &plan.state_dir) {
                Ok(r) => retired_ranges = r,
                Err(e) => retire_error = Some(format!("id range: {e}")),
            }
        } else if retire_error.is_none() {
            retire_error = Some("id range not retired: some deletions failed".to_string());
        }
    }
    Ok(Report {
        plan,
        outcome,
        retired,
        retired_ranges,
        retire_error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_set_without_identity_is_empty() {
        assert!(keep_set(false, &["identity".into(), "keys".into()]).is_empty());
    }

    #[test]
    fn keep_set_with_identity_adds_keep_on_purge() {
        assert_eq!(
            keep_set(true, &["keys/host".into()]),
            vec!["identity".to_string(), "keys/host".to_string()]
        );
    }
}
