//! `vmwarden reap`: find what no live instance owns any more — orphaned
//! runtime dirs, runtime dirs of VMs no longer configured, stray credential
//! mounts, processes of vmwarden principals without a live instance — and,
//! with `--apply` (and `--kill`), remove it with the same liveness probe and
//! cleanup code the unit uses. Deletes in the runtime root only the
//! runtime dirs that carry vmwarden's marks ([`marks`]); anything else
//! there is listed and kept. Never looks inside state dirs.

use std::collections::BTreeSet;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use nix::fcntl::AtFlags;
use nix::sys::stat::fstatat;

use crate::config::files::Kind as FileKind;
use crate::config::names::{TapName, VmName};
use crate::config::paths::{Roots, LEASE_FILE, PRINCIPALS_DIR};
use crate::config::rawpath;
use crate::host::dirs::{self, DirError};
use crate::host::mountinfo;
use crate::host::net::{self, Rtnl, SYS_CLASS_NET};
use crate::host::ownership::{self, RUNTIME_KEEP};
use crate::host::procs;
use crate::identity::{principal, registry};
use crate::instance::intent::Intent;
use crate::instance::known_vms;
use crate::instance::lease::{self, Lease, LeaseError, LeaseState};
use crate::instance::liveness::{Probe, Verdict};
use crate::instance::marks;
use crate::teardown::cleanup::{self, ServiceResult};
use crate::teardown::taps;

mod unmount;

/// What reap could not do (an item's reason in the report).
#[derive(Debug, thiserror::Error)]
pub enum ReapError {
    #[error(transparent)]
    Dir(#[from] DirError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// A credential tmpfs in another namespace not unmounted (boxed: the
    /// largest of these, and rare).
    #[error(transparent)]
    NsUnmount(#[from] Box<unmount::NsUnmountError>),
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    RuntimeDir,
    UnconfiguredRuntimeDir,
    UnknownEntry,
    CredentialMount,
    Tap,
    Process,
    PrincipalRecord,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Item {
    pub kind: Kind,
    #[serde(serialize_with = "rawpath::path")]
    pub path: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vm: Option<VmName>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    pub reason: String,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Report {
    pub apply: bool,
    pub kill: bool,
    /// Would delete (dry run) / was asked to delete (`--apply`).
    pub orphans: Vec<Item>,
    /// Left alone, with the reason (live, ambiguous, or needs `--kill`).
    pub kept: Vec<Item>,
    #[serde(serialize_with = "rawpath::paths")]
    pub deleted: Vec<PathBuf>,
    pub killed: Vec<u32>,
    pub failed: Vec<ownership::Failed>,
}

impl Report {
    pub fn ok(&self) -> bool {
        !self.apply || self.failed.is_empty()
    }
}

/// uids that belong to vmwarden principals: the registry and every spec.
/// A registry record that cannot be read is kept and reported in `r` (its
/// uid's processes cannot be told apart from anyone's until it is fixed);
/// the other records are still used.
fn principal_uids(roots: &Roots, r: &mut Report) -> Vec<(u32, VmName)> {
    let listing = match registry::all(roots) {
        Ok(l) => l,
        Err(e) => {
            r.kept.push(unreadable_registry(roots, &e));
            registry::Listing::default()
        }
    };
    for e in &listing.unreadable {
        r.kept.push(unreadable_registry(roots, e));
    }
    let mut out: Vec<(u32, VmName)> = listing.records.into_iter().map(|r| (r.uid, r.vm)).collect();
    for (name, _, spec) in principal::configured_specs(roots) {
        if let Some(spec) = spec {
            if let Ok(uid) = principal::uid_of(&spec) {
                out.push((uid, name));
            }
        }
    }
    out.sort();
    out.dedup_by_key(|x| x.0);
    out
}

fn unreadable_registry(roots: &Roots, e: &registry::RegistryError) -> Item {
    Item {
        kind: Kind::PrincipalRecord,
        path: roots.state_root.join(PRINCIPALS_DIR),
        vm: None,
        pid: None,
        reason: format!(
            "{e}; the processes of the uid it names are not looked for until it is fixed or removed"
        ),
    }
}

fn lease_held(roots: &Roots, name: &VmName) -> bool {
    dirs::open_dir(&roots.runtime_dir(name))
        .ok()
        .and_then(|d| lease::state(&d).ok())
        == Some(LeaseState::Held)
}

/// The lease of `vm` for the process pass: `Ok(None)` when it is held (the
/// VM is live). With `may_launch` (a configured VM, and we are about to
/// kill), a missing runtime dir is made exactly as a launch would make it,
/// so a launch cannot start while we kill.
fn lease_for_kill(
    roots: &Roots,
    vm: &VmName,
    may_launch: bool,
) -> Result<Option<Option<Lease>>, ReapError> {
    let rundir = match dirs::open_dir(&roots.runtime_dir(vm)) {
        Ok(d) => d,
        Err(e) if e.is_not_found() && !may_launch => return Ok(Some(None)),
        Err(e) if e.is_not_found() => {
            let (parent, name) = dirs::split_parent(&roots.runtime_root)?;
            let want = |mode, loose| dirs::Want {
                uid: 0,
                gid: 0,
                mode,
                loose,
            };
            let (root, _) = dirs::ensure(&parent, &name, &dirs::root_want("--runtime-root"))?;
            dirs::ensure(&root, vm.as_str(), &want(0o755, dirs::Loose::Refuse))?.0
        }
        Err(e) => return Err(e.into()),
    };
    Ok(Lease::acquire(&rundir)?.map(Some))
}

/// Delete a runtime dir whose VM is no longer configured: every entry (the
/// lease file last) while holding the lease, then the directory itself.
fn delete_runtime_dir_under_lease(root: &dirs::Dir, name: &VmName) -> ownership::Outcome {
    let mut out = ownership::Outcome::default();
    let rundir = match dirs::open_existing(root, name.as_str()) {
        Ok(Some(d)) => d,
        Ok(None) => return out,
        Err(e) => {
            out.failed.push(ownership::Failed {
                path: root.path.join(name),
                reason: e.to_string(),
            });
            return out;
        }
    };
    let lease = match Lease::acquire(&rundir) {
        Ok(Some(l)) => l,
        Ok(None) => {
            out.kept.push(ownership::Kept {
                path: rundir.path.clone(),
                reason: "its lease was taken meanwhile (a launch started)".into(),
            });
            return out;
        }
        Err(e) => {
            out.failed.push(ownership::Failed {
                path: rundir.path.clone(),
                reason: e.to_string(),
            });
            return out;
        }
    };
    let names = match ownership::entries(&rundir) {
        Ok(n) => n,
        Err(e) => {
            out.failed.push(ownership::Failed {
                path: rundir.path.clone(),
                reason: format!("cannot enumerate: {e}"),
            });
            return out;
        }
    };
    let doomed = ownership::deletion_set(&names, &[], Some(LEASE_FILE));
    out.merge(ownership::delete_entries(&rundir, &doomed, None));
    if out.failed.is_empty() {
        out.merge(ownership::delete_entries(root, &[name.into()], None));
    }
    drop(lease);
    out
}

pub fn reap(roots: &Roots, apply: bool, kill: bool) -> Report {
    let mut r = Report {
        apply,
        kill,
        ..Default::default()
    };
    let configured: BTreeSet<VmName> = principal::configured_specs(roots)
        .into_iter()
        .map(|(n, _, _)| n)
        .collect();
    // One /proc scan answers every question below that needs one.
    let mut probe = Probe::shared();

    // 1. Processes of principals with no live instance. Listing and killing
    //    happen under the VM's lease (taken as the launcher takes it), so a
    //    VM starting meanwhile is never mistaken for an orphan; a kill acts
    //    only on a fresh scan taken under that lease.
    reap_processes(roots, &configured, &probe, &mut r);
    // What was killed is gone: the passes below must not judge by the
    // scan taken before.
    if !r.killed.is_empty() {
        probe = Probe::shared();
    }

    // 2. Credential mounts of VMs with no live instance, in any namespace
    //    (before the runtime dirs: their cleanup checks for these mounts).
    //    Only mounts at this set of roots' mount points: another set of roots
    //    may run a VM of the same name.
    reap_credential_mounts(roots, &configured, &mut r);
    // 2b. vmw-* taps of VMs with no live instance, and taps no VM claims
    //     (before the runtime dirs: their cleanup checks for these taps).
    reap_taps(roots, &probe, &mut r);

    // 3. Runtime root: the runtime dirs that carry vmwarden's marks.
    reap_runtime_root(roots, &configured, &probe, &mut r);

    r
}

/// Pass 1: the processes of every principal whose VM has no live instance
/// (listed; killed with `--apply --kill`).
fn reap_processes(roots: &Roots, configured: &BTreeSet<VmName>, probe: &Probe, r: &mut Report) {
    let (apply, kill) = (r.apply, r.kill);
    for (uid, vm) in principal_uids(roots, r) {
        if probe.tasks_of(uid).pids.is_empty() {
            continue;
        }
        // Only a run that may kill needs to shut launches out (and may
        // create the runtime dir to do so); a dry run changes nothing.
        let may_launch = configured.contains(&vm) && apply && kill;
        let _lease = if apply && kill {
            match lease_for_kill(roots, &vm, may_launch) {
                Ok(Some(l)) => l,
                Ok(None) => continue, // live: its lease is held
                Err(e) => {
                    r.kept.push(Item {
                        kind: Kind::Process,
                        path: roots.runtime_dir(&vm),
                        vm: Some(vm.clone()),
                        pid: None,
                        reason: format!("cannot take {vm}'s lease to check its processes: {e}"),
                    });
                    continue;
                }
            }
        } else {
            if lease_held(roots, &vm) {
                continue;
            }
            None
        };
        let pids = if apply && kill {
            procs::processes_of_uid(uid)
        } else {
            probe.tasks_of(uid).pids
        };
        let mut killed_here = Vec::new();
        for pid in pids {
            let item = Item {
                kind: Kind::Process,
                path: PathBuf::from(format!("/proc/{pid}")),
                vm: Some(vm.clone()),
                pid: Some(pid),
                reason: format!(
                    "runs as uid {uid} (principal of {vm}) but {vm} has no live instance"
                ),
            };
            if !kill {
                r.kept.push(Item {
                    reason: format!("{}; kill it with --kill", item.reason),
                    ..item
                });
                continue;
            }
            r.orphans.push(item);
            if apply && procs::sigkill(pid).is_ok() {
                killed_here.push(pid);
            }
        }
        // Wait (still under the lease) until the kernel has reaped them.
        let end = std::time::Instant::now() + Duration::from_secs(5);
        while !killed_here.is_empty()
            && std::time::Instant::now() < end
            && !procs::processes_of_uid(uid).is_empty()
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        r.killed.extend(killed_here);
    }
}

/// Pass 2: credential tmpfs mounts of VMs with no live instance, in any
/// mount namespace (unmounted with `--apply`, under the VM's lease, taken
/// as the process pass takes it: a launch of the VM, whose namespace
/// would hold a tmpfs of the same source at the same path, cannot start
/// between the check and the unmount).
fn reap_credential_mounts(roots: &Roots, configured: &BTreeSet<VmName>, r: &mut Report) {
    let apply = r.apply;
    for (pid, ns, m) in mountinfo::credential_mounts_everywhere(Some(&roots.runtime_root), None) {
        let Some(vm) = mountinfo::credential_mount_vm(&m, Some(&roots.runtime_root)) else {
            continue;
        };
        let _lease = match apply {
            false if lease_held(roots, &vm) => continue,
            false => None,
            true => match lease_for_kill(roots, &vm, configured.contains(&vm)) {
                Ok(Some(lease)) => lease,
                Ok(None) => continue,
                Err(e) => {
                    r.failed.push(ownership::Failed {
                        path: m.mount_point.clone(),
                        reason: format!("not unmounted: the lease of {vm}: {e}"),
                    });
                    continue;
                }
            },
        };
        r.orphans.push(Item {
            kind: Kind::CredentialMount,
            path: m.mount_point.clone(),
            vm: Some(vm.clone()),
            pid: (pid != 0).then_some(pid),
            reason: format!(
                "credential tmpfs of {vm} in mount namespace {ns} with no live instance ({})",
                mountinfo::holder(pid)
            ),
        });
        if apply && pid == 0 {
            // No process to enter the namespace through: root unmounts it
            // through what holds it (`nsenter --mount=FILE umount PATH`).
            r.failed.push(ownership::Failed {
                path: m.mount_point.clone(),
                reason: format!("no process is in mount namespace {ns} to unmount it from"),
            });
        } else if apply {
            // Only in the namespace the scan reported, only the mount it
            // reported ([`unmount::in_namespace`]): the pid may be another
            // process's by now.
            match unmount::in_namespace(pid, &ns, &m).map_err(|e| ReapError::from(Box::new(e))) {
                Ok(()) => r.deleted.push(m.mount_point.clone()),
                Err(e) => r.failed.push(ownership::Failed {
                    path: m.mount_point.clone(),
                    reason: e.to_string(),
                }),
            }
        }
    }
}

/// Pass 3: every entry of the runtime root, judged one by one.
fn reap_runtime_root(roots: &Roots, configured: &BTreeSet<VmName>, probe: &Probe, r: &mut Report) {
    let root = match dirs::open_dir(&roots.runtime_root) {
        Ok(d) => d,
        Err(e) if e.is_not_found() => return,
        Err(e) => {
            r.failed.push(ownership::Failed {
                path: roots.runtime_root.clone(),
                reason: e.to_string(),
            });
            return;
        }
    };
    let names = match ownership::entries(&root) {
        Ok(n) => n,
        Err(e) => {
            r.failed.push(ownership::Failed {
                path: root.path.clone(),
                reason: format!("cannot enumerate: {e}"),
            });
            Vec::new()
        }
    };
    for raw in names {
        reap_runtime_entry(roots, configured, probe, &root, raw, r);
    }
}

/// The first words of the reason reap keeps an entry without its marks.
const NOT_OURS: &str = "not vmwarden's (reap deletes only runtime dirs that carry its marks); left alone, remove it by hand if it is not needed";

/// One entry of the runtime root: an entry without vmwarden's marks
/// ([`marks::runtime_dir`]) is kept; a VM's runtime dir is probed, kept
/// when live or ambiguous, else cleaned up (and deleted whole when the VM
/// is no longer configured).
fn reap_runtime_entry(
    roots: &Roots,
    configured: &BTreeSet<VmName>,
    probe: &Probe,
    root: &dirs::Dir,
    raw: std::ffi::OsString,
    r: &mut Report,
) {
    let apply = r.apply;
    let path = root.path.join(&raw);
    // Entries are bytes: one that is not a valid VM name (UTF-8 or
    // not) is an unknown entry, deleted by its raw name.
    let is_dir = fstatat(
        root.fd.as_fd(),
        raw.as_os_str(),
        AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map(|st| FileKind::of(st.st_mode) == FileKind::Directory)
    .unwrap_or(false);
    let vm_dir = raw
        .to_str()
        .and_then(|n| VmName::parse(n).ok())
        .filter(|_| is_dir);
    // Only what carries vmwarden's marks is deleted; anything else in the
    // root is listed and kept (ambiguity keeps).
    let Some(n) = vm_dir else {
        r.kept.push(Item {
            kind: Kind::UnknownEntry,
            path: path.clone(),
            vm: None,
            pid: None,
            reason: format!(
                "{NOT_OURS}: not a VM's runtime dir (not a directory with a VM's name)"
            ),
        });
        return;
    };
    let vm_dir = match marks::runtime_dir(root, raw.as_os_str()) {
        Ok(d) => d,
        Err(why) => {
            r.kept.push(Item {
                kind: Kind::UnknownEntry,
                path: path.clone(),
                vm: Some(n.clone()),
                pid: None,
                reason: format!("{NOT_OURS}: it {why}"),
            });
            return;
        }
    };
    let verdict = probe.probe_dir(roots, &n, Some(&vm_dir));
    let is_configured = configured.contains(&n);
    match verdict {
        Verdict::Live(reason) => {
            r.kept.push(Item {
                kind: Kind::RuntimeDir,
                path,
                vm: Some(n.clone()),
                pid: None,
                reason: format!("live: {reason}"),
            });
            return;
        }
        Verdict::Ambiguous(reason) => {
            r.kept.push(Item {
                kind: Kind::RuntimeDir,
                path,
                vm: Some(n.clone()),
                pid: None,
                reason: format!("ambiguous: {reason}"),
            });
            return;
        }
        Verdict::Dead => {}
    }
    let leftovers = ownership::entries(&vm_dir)
        .ok()
        .map(|e| ownership::deletion_set(&e, RUNTIME_KEEP, None))
        .unwrap_or_default();
    if is_configured && leftovers.is_empty() {
        return;
    }
    r.orphans.push(Item {
        kind: if is_configured {
            Kind::RuntimeDir
        } else {
            Kind::UnconfiguredRuntimeDir
        },
        path: path.clone(),
        vm: Some(n.clone()),
        pid: None,
        reason: if is_configured {
            format!("no live instance; leftovers {leftovers:?}")
        } else {
            "VM is no longer configured and has no live instance".into()
        },
    });
    if apply {
        let rep = cleanup::cleanup(roots, &n, ServiceResult::default());
        if !rep.clean && rep.failed.is_empty() {
            r.failed.push(ownership::Failed {
                path: path.clone(),
                reason: format!("cleanup refused: {}", rep.liveness),
            });
        }
        r.deleted.extend(rep.deleted);
        r.failed.extend(rep.failed);
        if !is_configured && rep.clean {
            // The VM is gone: its runtime dir goes too, lease file
            // and all, deleted while the lease is held.
            let out = delete_runtime_dir_under_lease(root, &n);
            r.deleted.extend(out.deleted);
            r.failed.extend(out.failed);
        }
    }
}

/// Every VM that claims each tap: the intent records in the runtime root
/// and the configured specs (two VMs may name the same tap by mistake);
/// and for each host end of a link into a VM's namespace that a record
/// names, the mark that record's instance put on it
/// (`ns_link::link_mark`).
type Claims = (
    std::collections::BTreeMap<TapName, Vec<VmName>>,
    std::collections::BTreeMap<TapName, Vec<String>>,
);

fn tap_claimants(roots: &Roots) -> Claims {
    let mut owners: std::collections::BTreeMap<TapName, Vec<VmName>> = Default::default();
    let mut marks: std::collections::BTreeMap<TapName, Vec<String>> = Default::default();
    for vm in known_vms(roots) {
        let intent = dirs::open_dir(&roots.runtime_dir(&vm))
            .ok()
            .and_then(|d| Intent::read(&d).ok().flatten());
        if let Some(i) = &intent {
            for t in i.ns_links().into_iter().chain(i.macvtaps()) {
                marks
                    .entry(t)
                    .or_default()
                    .push(net::ns_link::link_mark(&i.instance_id));
            }
        }
        for t in taps::vm_taps(roots, &vm, intent.as_ref()) {
            let v = owners.entry(t).or_default();
            if !v.contains(&vm) {
                v.push(vm.clone());
            }
        }
    }
    (owners, marks)
}

fn reap_taps(roots: &Roots, probe: &Probe, r: &mut Report) {
    let links = net::vmwarden_links();
    if links.is_empty() {
        return;
    }
    let (claimants, marks) = tap_claimants(roots);
    let mut rtnl = None;
    for tap in links {
        let path = PathBuf::from(SYS_CLASS_NET).join(&tap);
        let claims = claimants.get(tap.as_str()).cloned().unwrap_or_default();
        let owner = claims.first().cloned();
        let mut keep = |reason: String| {
            r.kept.push(Item {
                kind: Kind::Tap,
                path: path.clone(),
                vm: owner.clone(),
                pid: None,
                reason,
            })
        };
        // A persistent tap, or the host side of a link into a VM's own
        // network namespace (firecracker's: `ns-link`), which lives as long
        // as that namespace: both are vmwarden's when a VM claims them.
        let (index, what) = match net::tun_info(&tap) {
            Some((index, true)) => (index, "persistent tap"),
            Some((_, false)) => {
                keep(
                    "non-persistent tap: something holds it open (it goes when that process exits)"
                        .into(),
                );
                continue;
            }
            None => match ns_link_end(&mut rtnl, &tap) {
                Ok(Some((index, alias, what)))
                    if owner.is_some()
                        && marks
                            .get(tap.as_str())
                            .is_some_and(|m| alias.as_ref().is_some_and(|a| m.contains(a))) =>
                {
                    (index, what)
                }
                Ok(Some((_, _, what))) if owner.is_some() => {
                    keep(format!("a {what} that no intent record of these roots marked as its own (another set of roots' VM may have a link of this name); not deleted"));
                    continue;
                }
                Ok(Some((_, _, what))) => {
                    keep(format!(
                        "a {what} that no VM's intent record or spec names; not vmwarden's"
                    ));
                    continue;
                }
                Ok(None) => {
                    keep("named vmw-* but neither a tun/tap device, a link into a VM's network namespace nor a macvtap; not vmwarden's".into());
                    continue;
                }
                Err(e) => {
                    keep(format!("cannot tell what it is: {e}"));
                    continue;
                }
            },
        };
        // Any claimant that is not dead keeps it (ambiguity keeps).
        let not_dead: Vec<String> = claims
            .iter()
            .filter_map(|vm| match probe.probe(roots, vm) {
                Verdict::Dead => None,
                v => Some(format!("{vm}: {}", v.reason())),
            })
            .collect();
        if !not_dead.is_empty() {
            keep(format!(
                "tap claimed by a VM that is not dead ({})",
                not_dead.join("; ")
            ));
            continue;
        }
        let reason = match &owner {
            Some(_) => format!(
                "{what} of {}, none of which has a live instance",
                claims.join(", ")
            ),
            None => format!("{what} named vmw-* that no VM's intent record or spec names"),
        };
        r.orphans.push(Item {
            kind: Kind::Tap,
            path: path.clone(),
            vm: owner,
            pid: None,
            reason,
        });
        if r.apply {
            if rtnl.is_none() {
                match Rtnl::open() {
                    Ok(n) => rtnl = Some(n),
                    Err(e) => {
                        r.failed.push(ownership::Failed {
                            path,
                            reason: e.to_string(),
                        });
                        continue;
                    }
                }
            }
            let Some(n) = rtnl.as_mut() else { continue };
            // Delete the vetted device by its index, not whatever holds the name now.
            match taps::delete_vetted(n, &tap, index) {
                Ok(true) => r.deleted.push(path),
                Ok(false) => {}
                Err(reason) => r.failed.push(ownership::Failed { path, reason }),
            }
        }
    }
}

/// A link reap may delete: its index, its mark (alias) and what it is.
type LinkEnd = (u32, Option<String>, &'static str);

/// The index, the mark (alias) and what it is of `name` when it is the
/// host side of a link into a VM's own network namespace (a veth whose
/// other end is in another namespace) or a macvtap; opens `rtnl` the first
/// time it is needed.
fn ns_link_end(rtnl: &mut Option<Rtnl>, name: &str) -> Result<Option<LinkEnd>, net::NetError> {
    if rtnl.is_none() {
        *rtnl = Some(Rtnl::open()?);
    }
    let Some(n) = rtnl.as_mut() else {
        return Ok(None);
    };
    Ok(n.link(name)?.and_then(|l| {
        if taps::is_ns_link_end(&l) {
            Some((l.index, l.alias, "link into a VM's network namespace"))
        } else if taps::is_macvtap(&l) {
            Some((l.index, l.alias, "macvtap"))
        } else {
            None
        }
    }))
}
