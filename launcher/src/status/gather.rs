//! Deciding what `status` shows: one [`VmStatus`] per VM, from the host.
//!
//! Liveness, pid and the control socket's answer come from
//! `control::status` (the one liveness probe every tool asks); the rest is
//! read: the intent record (start time, the launched spec copy), the
//! configured spec, the principal registry, and with `--all` the state dir
//! (counted), `reap`'s dry run and `purge`'s plan. Nothing is changed,
//! except that reap's dry run takes each stopped VM's lease for the moment
//! it lists that VM's processes, as `vmwarden reap` does.

use std::collections::BTreeSet;

use crate::config::names::VmName;
use crate::config::paths::Roots;
use crate::config::rawpath::show;
use crate::config::spec::{Spec, SpecError};
use crate::control;
use crate::host::dirs;
use crate::host::ownership;
use crate::identity::principal::resolve_ids;
use crate::identity::registry::{self, Record};
use crate::instance::intent::Intent;
use crate::instance::liveness::Probe;
use crate::instance::{known_vms, launched};
use crate::teardown::{hibernate, purge, reap};

use super::{
    HibernatedInfo, Leftovers, PrincipalInfo, PurgeInfo, ReapItem, Registration, ShareSourceFate,
    SpecState, State, StateDirInfo, VmStatus,
};

/// The configured spec as `status` sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Configured {
    /// No `CONFIG_DIR/NAME.json`.
    Missing,
    /// It exists but cannot be read (or is too large).
    Unreadable,
    /// Its bytes, and whether they parse as a spec.
    Read { bytes: Vec<u8>, parses: bool },
}

impl Configured {
    pub fn read(roots: &Roots, name: &VmName) -> Configured {
        let path = roots.spec_path(name);
        match Spec::read_bytes(&path) {
            Ok(bytes) => Configured::Read {
                parses: Spec::parse(&path, &bytes).is_ok(),
                bytes,
            },
            Err(SpecError::Read { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                Configured::Missing
            }
            Err(_) => Configured::Unreadable,
        }
    }
}

/// The SPEC column. `live` is true for a running or ambiguous instance;
/// `launched` the bytes of its launched copy (when its record names one
/// that can be read). Bytes are compared, not meanings: the spec a
/// rebuild writes is byte-for-byte the same when nothing changed.
pub fn spec_state(live: bool, launched: Option<&[u8]>, configured: &Configured) -> SpecState {
    match (live, launched, configured) {
        (true, None, _) => SpecState::Unknown,
        (true, Some(_), Configured::Missing) => SpecState::Removed,
        (true, Some(_), Configured::Unreadable) => SpecState::Invalid,
        (true, Some(copy), Configured::Read { bytes, parses }) => {
            if copy == bytes.as_slice() {
                SpecState::Current
            } else if *parses {
                SpecState::Outdated
            } else {
                SpecState::Invalid
            }
        }
        (false, _, Configured::Missing) => SpecState::None,
        (false, _, Configured::Unreadable) => SpecState::Invalid,
        (false, _, Configured::Read { parses, .. }) => {
            if *parses {
                SpecState::Configured
            } else {
                SpecState::Invalid
            }
        }
    }
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn user_of(uid: u32) -> Option<String> {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|u| u.name)
}

/// This VM's record in the registry: the one for `uid` when it names this
/// VM; without a uid, the active one for this VM, else its latest tombstone.
fn registration_of<'a>(reg: &'a [Record], name: &VmName, uid: Option<u32>) -> Option<&'a Record> {
    match uid {
        Some(u) => reg.iter().find(|r| r.uid == u && r.vm == *name),
        None => {
            let mine = reg.iter().filter(|r| r.vm == *name);
            mine.clone()
                .find(|r| r.state == registry::State::Active)
                .or_else(|| mine.max_by_key(|r| r.retired_unix.unwrap_or(0)))
        }
    }
}

fn principal(
    roots: &Roots,
    name: &VmName,
    intent: Option<&Intent>,
    reg: &[Record],
) -> Option<PrincipalInfo> {
    let (uid, gid, user) = match intent {
        Some(i) => (
            Some(i.principal.uid),
            Some(i.principal.gid),
            i.principal.user.clone(),
        ),
        None => match launched::effective_spec(roots, name, None)
            .and_then(|(s, _)| resolve_ids(&s).ok())
        {
            Some((u, g, user)) => (Some(u), Some(g), user),
            None => (None, None, None),
        },
    };
    let rec = registration_of(reg, name, uid);
    let uid = uid.or(rec.map(|r| r.uid))?;
    Some(PrincipalInfo {
        uid,
        gid,
        user: user.or_else(|| user_of(uid)),
        registration: rec.map(|r| match r.state {
            registry::State::Active => Registration::Active,
            registry::State::Retired => Registration::Retired,
        }),
    })
}

/// The status of VM `name` (without `--all`'s leftovers).
pub fn one(roots: &Roots, name: &VmName, reg: &[Record], now: u64) -> VmStatus {
    one_with(&Probe::single(), roots, name, reg, now)
}

/// [`one`] with a caller's prober (many VMs share one `/proc` scan).
fn one_with(probe: &Probe, roots: &Roots, name: &VmName, reg: &[Record], now: u64) -> VmStatus {
    let st = control::status_with(probe, roots, name);
    one_of(st, roots, name, reg, now)
}

/// The record of VM `name` from `st`, its control socket's answers.
fn one_of(st: control::Status, roots: &Roots, name: &VmName, reg: &[Record], now: u64) -> VmStatus {
    let rundir = dirs::open_dir(&roots.runtime_dir(name)).ok();
    let intent = rundir.as_ref().and_then(|d| Intent::read(d).ok().flatten());
    let state = match st.state {
        "running" => State::Running,
        "ambiguous" => State::Ambiguous,
        _ => State::Stopped,
    };
    let live = state != State::Stopped;
    let principal = principal(roots, name, intent.as_ref(), reg);
    let state = match (&principal, state) {
        (
            Some(PrincipalInfo {
                registration: Some(Registration::Retired),
                ..
            }),
            State::Stopped,
        ) => State::Retired,
        (_, s) => s,
    };
    let hibernated = hibernate::hibernated(roots, name).map(|(bytes, t)| HibernatedInfo {
        bytes,
        created_unix: t,
        age_seconds: now.saturating_sub(t),
    });
    let state = match (state, &hibernated) {
        (State::Stopped, Some(_)) => State::Hibernated,
        (s, _) => s,
    };
    let copy = match (&rundir, &intent) {
        (Some(d), Some(i)) => launched::copy_bytes(d, i).ok().flatten(),
        _ => None,
    };
    let configured = Configured::read(roots, name);
    let spec = spec_state(live, copy.as_deref(), &configured);
    let started = intent.as_ref().map(|i| i.created_unix).filter(|_| live);
    let hypervisor = intent.as_ref().and_then(|i| i.hypervisor).or_else(|| {
        launched::effective_spec(roots, name, intent.as_ref()).map(|(s, _)| s.hypervisor.kind)
    });
    VmStatus {
        name: name.to_string(),
        state,
        liveness: st.liveness,
        pid: st.pid.filter(|_| live),
        principal,
        started_unix: started,
        uptime_seconds: started.map(|t| now.saturating_sub(t)),
        spec,
        spec_path: roots.spec_path(name),
        configured: configured != Configured::Missing,
        launched_spec: intent
            .as_ref()
            .and_then(|i| i.launched_spec().map(|(p, _)| p.to_path_buf())),
        hypervisor,
        control: st.qmp_status.or(st.api_state).filter(|_| live),
        balloon_mib: st.balloon_mib.filter(|_| live),
        instance_id: intent.map(|i| i.instance_id),
        leftovers: None,
        hibernated,
    }
}

/// Every VM `status` shows by default: configured, or with a runtime dir.
pub fn default_names(roots: &Roots) -> Vec<VmName> {
    known_vms(roots)
}

/// With `--all`, also every VM with a state dir or a principal
/// registration (only names are read in the state root).
pub fn all_names(roots: &Roots, reg: &[Record]) -> Vec<VmName> {
    let mut names: BTreeSet<VmName> = default_names(roots).into_iter().collect();
    if let Ok(rd) = std::fs::read_dir(&roots.state_root) {
        for e in rd.flatten() {
            if let Some(n) = e.file_name().to_str().and_then(|n| VmName::parse(n).ok()) {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    names.insert(n);
                }
            }
        }
    }
    names.extend(reg.iter().map(|r| r.vm.clone()));
    names.into_iter().collect()
}

/// Does vmwarden know VM `name` at all: a spec, a runtime dir, a state dir
/// or a registration?
pub fn is_known(roots: &Roots, name: &VmName, reg: &[Record]) -> bool {
    roots.spec_path(name).exists()
        || roots.runtime_dir(name).is_dir()
        || roots.state_dir(name).is_dir()
        || reg.iter().any(|r| r.vm == *name)
}

fn reap_items(report: &reap::Report, name: &VmName) -> Vec<ReapItem> {
    let kind = |i: &reap::Item| {
        serde_json::to_value(&i.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    };
    let orphans = report.orphans.iter().map(|i| {
        let action = if i.kind == reap::Kind::Process {
            "kill"
        } else {
            "delete"
        };
        (action, i)
    });
    let kept = report.kept.iter().map(|i| ("keep", i));
    orphans
        .chain(kept)
        .filter(|(_, i)| i.vm.as_ref() == Some(name))
        .map(|(action, i)| ReapItem {
            action: action.to_string(),
            kind: kind(i),
            path: i.path.clone(),
            reason: i.reason.clone(),
        })
        .collect()
}

fn leftovers(roots: &Roots, name: &VmName, reaped: &reap::Report) -> Leftovers {
    let state_dir = dirs::open_dir(&roots.state_dir(name))
        .ok()
        .map(|d| StateDirInfo {
            entries: ownership::entries(&d).map(|e| e.len()).unwrap_or(0),
            path: d.path.clone(),
        });
    let command = format!("vmwarden purge {name}");
    // A VM with no state dir may still hold an id range (a launch refused
    // or killed between `lease-taken` and `state-dir`): purge's own plan
    // says what it would retire; only without one is there nothing to do.
    let purge = match (&state_dir, purge::plan(roots, name, false)) {
        (_, Ok(plan)) => PurgeInfo {
            command,
            delete: plan.delete,
            retire_uid: plan.retire_uid,
            retire_range: plan.retire_range,
            refused: None,
            share_sources: plan
                .share_sources
                .iter()
                .map(|f| ShareSourceFate {
                    path: f.path.clone(),
                    action: f.action.to_string(),
                    reason: f.reason.clone(),
                })
                .collect(),
        },
        (None, Err(_)) => PurgeInfo {
            command,
            delete: Vec::new(),
            retire_uid: None,
            retire_range: None,
            refused: Some(format!(
                "there is no state dir {}",
                show(&roots.state_dir(name))
            )),
            share_sources: Vec::new(),
        },
        (Some(_), Err(e)) => PurgeInfo {
            command,
            delete: Vec::new(),
            retire_uid: None,
            retire_range: None,
            refused: Some(e.to_string()),
            share_sources: Vec::new(),
        },
    };
    Leftovers {
        state_dir,
        reap: reap_items(reaped, name),
        purge,
    }
}

/// What `status [--all] [NAME…]` shows, and the NAMEs vmwarden does not know.
#[derive(Debug)]
pub struct Gathered {
    pub records: Vec<VmStatus>,
    pub unknown: Vec<VmName>,
}

/// The records for `names` (none given: every VM shown by default, or
/// with `all` every VM that left anything); with `all`, each with what it
/// left and what reap and purge would do.
pub fn gather(roots: &Roots, names: &[VmName], all: bool) -> Gathered {
    let reg = registry::all(roots).map(|l| l.records).unwrap_or_default();
    let (names, unknown): (Vec<VmName>, Vec<VmName>) = if names.is_empty() {
        let n = if all {
            all_names(roots, &reg)
        } else {
            default_names(roots)
        };
        (n, Vec::new())
    } else {
        names
            .iter()
            .cloned()
            .partition(|n| is_known(roots, n, &reg))
    };
    let now = now_unix();
    // One /proc scan for all of them, if any needs one.
    let probe = Probe::shared();
    // Every running VM's control socket asked at once.
    let mut records: Vec<VmStatus> = control::statuses_with(&probe, roots, &names)
        .into_iter()
        .zip(&names)
        .map(|(st, n)| one_of(st, roots, n, &reg, now))
        .collect();
    if all && !records.is_empty() {
        let reaped = reap::reap(roots, false, false);
        for (r, n) in records.iter_mut().zip(&names) {
            r.leftovers = Some(leftovers(roots, n, &reaped));
        }
    }
    Gathered { records, unknown }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(bytes: &[u8]) -> Configured {
        Configured::Read {
            bytes: bytes.to_vec(),
            parses: true,
        }
    }

    #[test]
    fn running_instances_compare_their_launched_copy_byte_for_byte() {
        assert_eq!(
            spec_state(true, Some(b"A"), &read(b"A")),
            SpecState::Current
        );
        assert_eq!(
            spec_state(true, Some(b"A"), &read(b"A ")),
            SpecState::Outdated
        );
        assert_eq!(
            spec_state(true, Some(b"A"), &Configured::Missing),
            SpecState::Removed
        );
        assert_eq!(
            spec_state(
                true,
                Some(b"A"),
                &Configured::Read {
                    bytes: b"{".to_vec(),
                    parses: false
                }
            ),
            SpecState::Invalid
        );
        assert_eq!(spec_state(true, None, &read(b"A")), SpecState::Unknown);
    }

    #[test]
    fn stopped_vms_say_whether_a_spec_is_configured() {
        // A leftover copy of a dead instance says nothing about the next start.
        assert_eq!(
            spec_state(false, Some(b"A"), &read(b"B")),
            SpecState::Configured
        );
        assert_eq!(
            spec_state(false, None, &Configured::Missing),
            SpecState::None
        );
        assert_eq!(
            spec_state(false, None, &Configured::Unreadable),
            SpecState::Invalid
        );
    }

    fn rec(uid: u32, vm: &str, state: registry::State, retired: Option<u64>) -> Record {
        Record {
            uid,
            vm: VmName::parse(vm).unwrap(),
            generation: 1,
            state,
            retired_unix: retired,
        }
    }

    #[test]
    fn a_vm_registration_is_its_own_uid_or_its_latest() {
        let reg = vec![
            rec(1, "a", registry::State::Retired, Some(10)),
            rec(2, "a", registry::State::Retired, Some(20)),
            rec(3, "b", registry::State::Active, None),
        ];
        let a = VmName::parse("a").unwrap();
        assert_eq!(registration_of(&reg, &a, None).map(|r| r.uid), Some(2));
        assert_eq!(registration_of(&reg, &a, Some(1)).map(|r| r.uid), Some(1));
        // uid 3 is b's: not a's registration.
        assert!(registration_of(&reg, &a, Some(3)).is_none());
    }
}
