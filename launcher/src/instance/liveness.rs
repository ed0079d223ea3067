//! One liveness probe for everyone: the launcher's double-start check,
//! cleanup, reap and purge all call [`probe`]. Any ambiguity keeps.

use std::path::Path;
use std::time::Duration;

use crate::config::names::VmName;
use crate::config::paths::{Roots, LEASE_FILE};
use crate::host::procs::{processes_of_uid, unit_cgroup_pids};
use crate::host::{dirs, peer};
use crate::hypervisor::api;
use crate::identity::principal::{self, PrincipalError};
use crate::instance::intent::Intent;
use crate::instance::launched::effective_spec;
use crate::instance::lease::{self, LeaseState};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Live(String),
    Dead,
    Ambiguous(String),
}

impl Verdict {
    pub fn is_dead(&self) -> bool {
        matches!(self, Verdict::Dead)
    }
    /// What was found, without the verdict: the reason for `Live` and
    /// `Ambiguous`, "dead" for `Dead`.
    pub fn detail(&self) -> &str {
        match self {
            Verdict::Live(r) | Verdict::Ambiguous(r) => r,
            Verdict::Dead => "dead",
        }
    }
    pub fn reason(&self) -> String {
        match self {
            Verdict::Live(r) => format!("live: {r}"),
            Verdict::Dead => "dead".into(),
            Verdict::Ambiguous(r) => format!("ambiguous: {r}"),
        }
    }
}

/// Does something answer with a QMP greeting on the control socket?
/// (cloud-hypervisor's and firecracker's API socket: [`crate::hypervisor::api::answers`].)
pub fn control_socket_answers(sock: &Path) -> bool {
    use std::io::Read;
    // Only a peer running as the control dir's owner counts (a VM could
    // point its socket at another VM's through a symlink).
    let Ok(mut s) = peer::connect(sock, Duration::from_millis(500)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut buf = [0u8; 64];
    matches!(s.read(&mut buf), Ok(n) if n > 0 && buf[..n].starts_with(b"{\"QMP\""))
}

/// The VM's uid cannot be known: its spec names a principal that does not
/// resolve (and no intent record says which uid it ran as).
#[derive(Debug, thiserror::Error)]
#[error("cannot resolve the principal of {name}: {source}")]
pub struct UnknownUid {
    pub name: String,
    #[source]
    pub source: PrincipalError,
}

/// The uid whose processes count as the VM's: from the intent record, else
/// from the spec (the launched copy the record names, else the configured
/// one).
pub fn vm_uid(
    roots: &Roots,
    name: &VmName,
    intent: Option<&Intent>,
) -> Result<Option<u32>, UnknownUid> {
    if let Some(i) = intent {
        return Ok(Some(i.principal.uid));
    }
    match effective_spec(roots, name, intent) {
        Some((spec, _)) => principal::resolve_ids(&spec)
            .map(|(u, _, _)| Some(u))
            .map_err(|source| UnknownUid {
                name: name.to_string(),
                source,
            }),
        None => Ok(None),
    }
}

/// Everything but the lease, for a caller that holds the lease itself
/// (the launcher after taking it, cleanup under its own lock).
pub fn probe_with_lease_held(roots: &Roots, name: &VmName, uid: u32) -> Verdict {
    let pids = processes_of_uid(uid);
    if !pids.is_empty() {
        return Verdict::Ambiguous(format!(
            "processes {pids:?} run as the VM's uid {uid} without holding its lease (see `vmwarden reap --kill`)"
        ));
    }
    if control_socket_answers(&roots.qmp_socket(name)) {
        return Verdict::Live(format!("{} answers QMP", roots.qmp_socket(name).display()));
    }
    if api::answers(&roots.api_socket(name)) {
        return Verdict::Live(format!(
            "{} answers HTTP (cloud-hypervisor/firecracker API)",
            roots.api_socket(name).display()
        ));
    }
    if let Some(p) = unit_cgroup_pids(name) {
        if !p.is_empty() {
            return Verdict::Ambiguous(format!("the unit's cgroup still holds pids {p:?}"));
        }
    }
    Verdict::Dead
}

/// Is VM `name` running? Lease, processes of its uid, the control socket and
/// the unit's cgroup; anything unclear is `Ambiguous`.
pub fn probe(roots: &Roots, name: &VmName) -> Verdict {
    let rundir = match dirs::open_dir(&roots.runtime_dir(name)) {
        Ok(d) => Some(d),
        Err(e) if e.is_not_found() => None,
        Err(e) => return Verdict::Ambiguous(format!("cannot open its runtime dir: {e}")),
    };
    let mut intent = None;
    if let Some(d) = &rundir {
        match lease::state(d) {
            Ok(LeaseState::Held) => {
                return Verdict::Live(format!(
                    "lease {} is held",
                    d.path.join(LEASE_FILE).display()
                ))
            }
            Ok(_) => {}
            Err(e) => return Verdict::Ambiguous(format!("cannot probe the lease: {e}")),
        }
        match Intent::read(d) {
            Ok(i) => intent = i,
            Err(e) => return Verdict::Ambiguous(format!("{e}")),
        }
    }
    match vm_uid(roots, name, intent.as_ref()) {
        Ok(Some(uid)) => probe_with_lease_held(roots, name, uid),
        Ok(None) => {
            if control_socket_answers(&roots.qmp_socket(name)) {
                Verdict::Live("the control socket answers QMP".into())
            } else if api::answers(&roots.api_socket(name)) {
                Verdict::Live("the API socket answers HTTP".into())
            } else {
                Verdict::Dead
            }
        }
        Err(e) => Verdict::Ambiguous(e.to_string()),
    }
}
