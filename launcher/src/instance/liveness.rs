//! One liveness probe for everyone: the launcher's double-start check,
//! cleanup, reap, purge, `stop` and `status` all call [`Probe`]. Any
//! ambiguity keeps.
//!
//! The signals, in order: the lease (held ⇒ live); then the instance's
//! processes — from the cgroup the launch recorded when there is one (a
//! root-held handle the VM cannot leave: O(1), whatever the host runs),
//! else from a `/proc` scan for the VM's uid; then the control socket.

use std::path::Path;
use std::time::Duration;

use crate::config::names::VmName;
use crate::config::paths::{Roots, LEASE_FILE};
use crate::config::spec::Spec;
use crate::host::cgroup::{self, Cgroup, Occupancy};
use crate::host::procs::{self, Scanner, UidFilter, UidTasks, Wants};
use crate::host::{dirs, peer};
use crate::hypervisor::api;
use crate::identity::principal::{self, PrincipalError};
use crate::instance::intent::{self, Intent};
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

/// Where the probe looks for the instance's processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// The recorded cgroup when the intent record has one (same boot),
    /// else `/proc`. What every tool uses.
    Recorded,
    /// `/proc` only, ignoring a recorded cgroup (the fallback, exposed so
    /// tests can show both paths agree).
    Procs,
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
    let spec = effective_spec(roots, name, intent).map(|(s, _)| s);
    vm_uid_with(name, intent, spec.as_ref())
}

/// [`vm_uid`] with the spec to believe already read (by a caller that
/// needs it for more than the uid).
pub fn vm_uid_with(
    name: &VmName,
    intent: Option<&Intent>,
    spec: Option<&Spec>,
) -> Result<Option<u32>, UnknownUid> {
    if let Some(i) = intent {
        return Ok(Some(i.principal.uid));
    }
    match spec {
        Some(spec) => principal::uid_of(spec)
            .map(Some)
            .map_err(|source| UnknownUid {
                name: name.to_string(),
                source,
            }),
        None => Ok(None),
    }
}

/// The recorded cgroup of `intent`, when it is from this boot (a cgroup
/// id is only unique within one boot; a record from an earlier boot names
/// processes that died with it).
pub fn recorded_cgroup(intent: &Intent) -> Option<&Cgroup> {
    intent
        .cgroup
        .as_ref()
        .filter(|_| intent.boot_id == intent::boot_id())
}

/// A liveness prober. [`Probe::single`] scans `/proc` per question (one VM);
/// [`Probe::shared`] takes one scan on first need and answers every VM
/// from it (reap, `status` of all VMs); [`Probe::sharing`] uses a
/// command's own scanner, whose scan the command's other checks share
/// (cleanup, `verify-clean`).
#[derive(Debug)]
pub struct Probe {
    via: Via,
    scanner: Option<Scanner>,
}

impl Probe {
    pub fn single() -> Probe {
        Probe {
            via: Via::Recorded,
            scanner: None,
        }
    }

    pub fn shared() -> Probe {
        Probe::sharing(Scanner::new(Wants {
            uids: UidFilter::All,
            mount_namespaces: false,
        }))
    }

    /// A probe answering from `scanner` (its scan is taken on first need,
    /// by the probe or by whoever else asks [`Probe::scanner`]).
    pub fn sharing(scanner: Scanner) -> Probe {
        Probe {
            via: Via::Recorded,
            scanner: Some(scanner),
        }
    }

    pub fn via(mut self, via: Via) -> Probe {
        self.via = via;
        self
    }

    /// The scanner this probe answers from, if it shares one.
    pub fn scanner(&self) -> Option<&Scanner> {
        self.scanner.as_ref()
    }

    /// Processes of `uid` (from the shared scan, or a fresh one).
    pub fn tasks_of(&self, uid: u32) -> UidTasks {
        match &self.scanner {
            Some(s) => s.tasks_of(uid),
            None => procs::tasks_of_uid(uid),
        }
    }

    /// Is VM `name` running? The lease, then the instance's processes (its
    /// cgroup, or the uid's processes), then the control socket.
    pub fn probe(&self, roots: &Roots, name: &VmName) -> Verdict {
        match dirs::open_dir(&roots.runtime_dir(name)) {
            Ok(d) => self.probe_dir(roots, name, Some(&d)),
            Err(e) if e.is_not_found() => self.probe_dir(roots, name, None),
            Err(e) => Verdict::Ambiguous(format!("cannot open its runtime dir: {e}")),
        }
    }

    /// [`Probe::probe`] with the runtime dir already open (`None`: it does
    /// not exist), for a caller walking the runtime root.
    pub fn probe_dir(&self, roots: &Roots, name: &VmName, rundir: Option<&dirs::Dir>) -> Verdict {
        let mut intent = None;
        if let Some(d) = rundir {
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
            Ok(uid) => self.with_lease_held(roots, name, uid, intent.as_ref()),
            Err(e) => Verdict::Ambiguous(e.to_string()),
        }
    }

    /// Everything but the lease, for a caller that holds the lease itself
    /// (the launcher after taking it, cleanup and purge under their own
    /// lock) or has just found it free. `intent` is the record on disk, if
    /// any; `uid` the VM's (None: only the cgroup and the sockets can say).
    pub fn with_lease_held(
        &self,
        roots: &Roots,
        name: &VmName,
        uid: Option<u32>,
        intent: Option<&Intent>,
    ) -> Verdict {
        let cg = intent
            .and_then(recorded_cgroup)
            .filter(|_| self.via == Via::Recorded);
        if let Some(cg) = cg {
            match cgroup::occupancy(cg) {
                // Everything the instance ran is gone with its cgroup.
                Ok(Occupancy::Gone | Occupancy::Empty) => {}
                Ok(Occupancy::Held { pids, child }) => {
                    return Verdict::Ambiguous(match child {
                        None => format!(
                            "its cgroup {} still holds processes {pids:?} while its lease is free (see `vmwarden stop` / `vmwarden reap --kill`)",
                            cg.path.display()
                        ),
                        Some(c) => format!(
                            "its cgroup {} has a populated child cgroup {c}",
                            cg.path.display()
                        ),
                    })
                }
                Err(e) => {
                    return Verdict::Ambiguous(format!(
                        "cannot read its cgroup {}: {e}",
                        cg.path.display()
                    ))
                }
            }
        } else if let Some(uid) = uid {
            let t = self.tasks_of(uid);
            if !t.pids.is_empty() {
                return Verdict::Ambiguous(format!(
                    "processes {:?} run as the VM's uid {uid} without holding its lease (see `vmwarden stop` / `vmwarden reap --kill`)",
                    t.pids
                ));
            }
            if let Some((what, e)) = t.unreadable.0.first() {
                return Verdict::Ambiguous(format!(
                    "cannot tell whether uid {uid} runs anything: {what}: {e}"
                ));
            }
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
        Verdict::Dead
    }
}

/// Everything but the lease, scanning `/proc` only if the record has no
/// cgroup (see [`Probe::with_lease_held`]).
pub fn probe_with_lease_held(
    roots: &Roots,
    name: &VmName,
    uid: u32,
    intent: Option<&Intent>,
) -> Verdict {
    Probe::single().with_lease_held(roots, name, Some(uid), intent)
}

/// Is VM `name` running? (One VM: see [`Probe`] for many.)
pub fn probe(roots: &Roots, name: &VmName) -> Verdict {
    Probe::single().probe(roots, name)
}
