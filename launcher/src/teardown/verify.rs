//! `vmwarden verify-clean`: independent checks that nothing of a VM was left
//! running or behind, one line per check.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::config::names::{TapName, VmName};
use crate::config::paths::Roots;
use crate::config::rawpath::{self, show};
use crate::config::text::escape;
use crate::host::dirs;
use crate::host::leftovers;
use crate::host::mountinfo::{self, Mount};
use crate::host::net::SYS_CLASS_NET;
use crate::host::ownership::{self, RUNTIME_KEEP};
use crate::host::procs;
use crate::identity::registry;
use crate::instance::creds_floor;
use crate::instance::intent::Intent;
use crate::instance::known_vms;
use crate::instance::launched::effective_spec;
use crate::instance::lease::{self, LeaseState};
use crate::instance::liveness;
use crate::teardown::{devices, hibernate, machine, taps};

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Check {
    pub check: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vm: Option<String>,
    pub ok: bool,
    pub expected: String,
    pub actual: String,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Report {
    #[serde(serialize_with = "rawpath::path")]
    pub audited_root: PathBuf,
    pub checks: Vec<Check>,
    pub clean: bool,
}

impl Report {
    pub fn lines(&self) -> String {
        // One line per check: a field (a file name a VM made) cannot
        // break it or reach the terminal raw.
        let mut s = format!("audited_root={}\n", show(&self.audited_root));
        for c in &self.checks {
            let vm =
                c.vm.as_deref()
                    .map(|v| format!(" vm={}", escape(v)))
                    .unwrap_or_default();
            if c.ok {
                s.push_str(&format!("{}{vm} check=ok\n", escape(&c.check)));
            } else {
                s.push_str(&format!(
                    "{}{vm} check=FAIL expected={} actual={}\n",
                    escape(&c.check),
                    escape(&c.expected),
                    escape(&c.actual)
                ));
            }
        }
        s.push_str(&format!(
            "result={}\n",
            if self.clean { "clean" } else { "dirty" }
        ));
        s
    }
}

fn check(
    name: &str,
    vm: Option<&str>,
    ok: bool,
    expected: impl Into<String>,
    actual: impl Into<String>,
) -> Check {
    Check {
        check: name.to_string(),
        vm: vm.map(str::to_string),
        ok,
        expected: expected.into(),
        actual: actual.into(),
    }
}

/// Entries under `dir` (recursively) changed after `since` (unix seconds).
fn changed_since(dir: &Path, since: f64, out: &mut Vec<PathBuf>) {
    use std::os::unix::fs::MetadataExt;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let Ok(md) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        let t = (md.mtime() as f64 + md.mtime_nsec() as f64 / 1e9)
            .max(md.ctime() as f64 + md.ctime_nsec() as f64 / 1e9);
        if t > since {
            out.push(p.clone());
        }
        if md.is_dir() {
            changed_since(&p, since, out);
        }
    }
}

pub fn verify(
    roots: &Roots,
    names: &[VmName],
    protected: &[PathBuf],
    since: Option<f64>,
) -> Report {
    let mut checks = Vec::new();
    let every_vm = names.is_empty();
    let names: Vec<VmName> = if every_vm {
        known_vms(roots)
    } else {
        names.to_vec()
    };
    // What each VM's checks read first: its runtime dir, the uid its last
    // launch recorded (else its spec's).
    let vms: Vec<_> = names
        .iter()
        .map(|n| {
            let dir = dirs::open_dir(&roots.runtime_dir(n));
            let intent = dir
                .as_ref()
                .ok()
                .and_then(|d| Intent::read(d).ok().flatten());
            // The spec to believe, read once: the uid (when the record has
            // none) and the taps.
            let spec = effective_spec(roots, n, intent.as_ref()).map(|(s, _)| s);
            let uid = liveness::vm_uid_with(n, intent.as_ref(), spec.as_ref());
            let vm_taps = taps::vm_taps_with(intent.as_ref(), spec.as_ref());
            let machined = spec.as_ref().is_some_and(|s| s.register_with_machined);
            let held = devices::held_check(intent.as_ref(), spec.as_ref(), &uid);
            (n, dir, vm_taps, uid, machined, held)
        })
        .collect();
    // One /proc pass for every VM and every check: the processes of their
    // uids and the mount namespaces, whose credential mounts (of any VM)
    // are read once, one mountinfo per namespace.
    let scan = procs::Scan::take(&procs::Wants::uids_and_mounts(
        vms.iter()
            .filter_map(|(_, _, _, u, _, _)| u.as_ref().ok().copied().flatten()),
    ));
    // Asked about some VMs: only their mounts (a namespace holding none of
    // their sources is not read); about every VM: any VM's.
    // About some VMs, the kernel is asked only from the lowest of their
    // credential floors up (`instance::creds_floor`); a VM without one
    // that is believed has every mount asked.
    let all_mounts = if every_vm {
        mountinfo::credential_mounts_in(&scan, Some(&roots.runtime_root), None, 0)
    } else {
        let since = vms
            .iter()
            .map(|(_, d, ..)| d.as_ref().ok().and_then(creds_floor::read))
            .try_fold(u64::MAX, |low, f| f.map(|f| low.min(f)))
            .unwrap_or(0);
        mountinfo::credential_mounts_of_vms(&scan, Some(&roots.runtime_root), &names, since)
    };
    // The VMs' own id ranges (a share the guest owns), and one scan of
    // every uid when there is any: no process may run with one of them.
    let ranges: Vec<_> = vms
        .iter()
        .map(|(n, ..)| registry::range_of(roots, n))
        .collect();
    let every_uid = ranges
        .iter()
        .any(|r| !matches!(r, Ok(None)))
        .then(procs::Snapshot::take);
    for ((n, dir, vm_taps, uid, machined, held), range) in vms.iter().zip(&ranges) {
        let vm = Some(n.as_str());
        runtime_checks(dir, vm, &mut checks);
        principal_checks(n, uid, &scan, &mut checks);
        if let Some(c) = range_check(vm, range, every_uid.as_ref()) {
            checks.push(c);
        }
        checks.push(tap_check(n, vm_taps));
        checks.push(credential_mount_check(roots, n, &all_mounts));
        checks.push(setid_check(roots, n));
        let running = dir
            .as_ref()
            .is_ok_and(|d| matches!(lease::state(d), Ok(LeaseState::Held)));
        let (ok, actual) = hibernate::verify_check(roots, n, running);
        checks.push(check(
            "no-half-written-snapshot",
            vm,
            ok,
            "none (a complete snapshot is the user's and kept)",
            actual,
        ));
        if *machined {
            checks.push(machine_check(n));
        }
        if let Some(held) = held {
            checks.push(check(
                "no-device-held",
                vm,
                held.is_empty(),
                "none",
                format!("{held:?}"),
            ));
        }
    }
    // Asked about every VM: no credential mount of any VM either, also of
    // one whose runtime dir is gone (the per-VM checks only see known ones).
    if every_vm {
        checks.push(check(
            "no-credential-mount-any",
            None,
            all_mounts.is_empty(),
            "none",
            format!("{}", all_mounts.len()),
        ));
    }
    checks.extend(protected.iter().map(|p| protected_check(p, since)));
    let clean = checks.iter().all(|c| c.ok);
    Report {
        audited_root: roots.runtime_root.clone(),
        checks,
        clean,
    }
}

/// `no-range-process`, for a VM with its own id range: no process runs
/// with a uid of it (virtiofsd's threads take them only while virtiofsd,
/// a process of the principal, runs, and it makes no process).
fn range_check(
    vm: Option<&str>,
    range: &Result<Option<registry::IdRange>, registry::RegistryError>,
    scan: Option<&procs::Snapshot>,
) -> Option<Check> {
    let r = match range {
        Ok(None) => return None,
        Ok(Some(r)) => *r,
        Err(e) => {
            return Some(check(
                "no-range-process",
                vm,
                false,
                "the VM's id range known",
                format!("<{e}>"),
            ))
        }
    };
    let scan = scan?.scan();
    let found = scan.in_range(r.base + 1, r.end());
    let unreadable = &scan.unreadable().0;
    Some(check(
        "no-range-process",
        vm,
        found.is_empty() && unreadable.is_empty(),
        format!("no pid with a uid in {}..{}", r.base + 1, r.end()),
        if unreadable.is_empty() {
            format!("{found:?}")
        } else {
            format!("{found:?}, unreadable {unreadable:?}")
        },
    ))
}

/// The VM's runtime dir holds nothing but the keep set, and nobody holds
/// its lease.
fn runtime_checks(
    dir: &Result<dirs::Dir, dirs::DirError>,
    vm: Option<&str>,
    checks: &mut Vec<Check>,
) {
    // Runtime dir holds nothing but the keep set. Names are raw bytes,
    // shown with Debug escaping (lossless when not UTF-8).
    let left: Result<Vec<OsString>, String> = match &dir {
        Ok(d) => ownership::entries(d)
            .map(|e| ownership::deletion_set(&e, RUNTIME_KEEP, None))
            .map_err(|e| format!("<unreadable: {e}>")),
        Err(e) if e.is_not_found() => Ok(Vec::new()),
        Err(e) => Err(format!("<{e}>")),
    };
    checks.push(check(
        "runtime-empty",
        vm,
        matches!(&left, Ok(l) if l.is_empty()),
        format!("{RUNTIME_KEEP:?}"),
        match &left {
            Ok(l) => format!("{l:?}"),
            Err(e) => e.clone(),
        },
    ));
    // Nobody holds the lease.
    let held = dir.as_ref().ok().and_then(|d| lease::state(d).ok()) == Some(LeaseState::Held);
    checks.push(check(
        "no-lease-holder",
        vm,
        !held,
        "free",
        if held { "held" } else { "free" },
    ));
}

/// No process, kernel key or IPC object of the VM's principal (the uid
/// its intent record names, else its spec's).
fn principal_checks(
    n: &VmName,
    uid: &Result<Option<u32>, liveness::UnknownUid>,
    scan: &procs::Scan,
    checks: &mut Vec<Check>,
) {
    let vm = Some(n.as_str());
    match uid {
        Ok(Some(uid)) => {
            let uid = *uid;
            let t = scan.of(uid).unwrap_or_else(|| procs::tasks_of_uid(uid));
            let unreadable: Vec<String> = t
                .unreadable
                .0
                .iter()
                .map(|(p, e)| format!("{p}: {e}"))
                .collect();
            checks.push(check(
                "no-process",
                vm,
                t.pids.is_empty() && unreadable.is_empty(),
                // The hypervisor and its helper daemons (virtiofsd, vhost-device-vsock) all
                // run as the uid: none may be left.
                format!("no pid of uid {uid} (hypervisor or helper)"),
                if unreadable.is_empty() {
                    format!("{:?}", t.pids)
                } else {
                    format!("{:?}, unreadable {unreadable:?}", t.pids)
                },
            ));
            // The uid's kernel keyrings outlive all its processes.
            let keys = leftovers::stashed_keys(uid);
            checks.push(check(
                "no-key",
                vm,
                keys.is_none(),
                format!(
                    "uid {uid} owns no kernel key beyond its {} empty user keyrings",
                    leftovers::USER_KEYRINGS
                ),
                match keys {
                    Some(n) => format!("{n} keys (/proc/key-users)"),
                    None => "none".into(),
                },
            ));
            // IPC objects in the host's IPC namespace (a VM has its own).
            let mut ipc = leftovers::sysv_objects_of_uid(uid);
            ipc.extend(leftovers::posix_ipc_of_uid(uid));
            checks.push(check(
                "no-ipc",
                vm,
                ipc.is_empty(),
                format!("no SysV or POSIX IPC object of uid {uid} on the host"),
                format!("{ipc:?}"),
            ));
        }
        Ok(None) => {}
        Err(e) => checks.push(check(
            "no-process",
            vm,
            false,
            "principal resolvable",
            e.to_string(),
        )),
    }
}

/// None of the VM's taps (intent record and spec) exists.
fn tap_check(n: &VmName, vm_taps: &[TapName]) -> Check {
    let vm = Some(n.as_str());
    let left = taps::surviving(vm_taps);
    check(
        "no-tap",
        vm,
        left.is_empty(),
        format!("none of {vm_taps:?} in {SYS_CLASS_NET}"),
        format!("{left:?}"),
    )
}

/// No credential tmpfs of the VM in any mount namespace (`all_mounts`: the
/// credential mounts of every VM under this runtime root, one read shared
/// by all the VMs).
fn credential_mount_check(roots: &Roots, n: &VmName, all_mounts: &[(u32, String, Mount)]) -> Check {
    let vm = Some(n.as_str());
    let mounts: Vec<_> = all_mounts
        .iter()
        .filter(|(_, _, m)| mountinfo::is_credential_mount(m, Some(&roots.runtime_root), Some(n)))
        .collect();
    check(
        "no-credential-mount",
        vm,
        mounts.is_empty(),
        "none in any mount namespace",
        format!(
            "{:?}",
            mounts
                .iter()
                .map(|(p, ns, m)| format!(
                    "{} in {ns} ({})",
                    m.mount_point.display(),
                    mountinfo::holder(*p)
                ))
                .collect::<Vec<_>>()
        ),
    )
}

/// No set-user-ID or set-group-ID file under the VM's state dir.
fn setid_check(roots: &Roots, n: &VmName) -> Check {
    let found = leftovers::setid_files(&roots.state_dir(n));
    check(
        "no-setid-file",
        Some(n.as_str()),
        found.is_empty(),
        format!(
            "no set-user-ID or set-group-ID file under {}",
            show(&roots.state_dir(n))
        ),
        format!(
            "{:?}",
            found.iter().map(ToString::to_string).collect::<Vec<_>>()
        ),
    )
}

/// A protected path exists and, with `since`, nothing under it changed.
fn protected_check(p: &Path, since: Option<f64>) -> Check {
    let mut changed = Vec::new();
    let exists = p.exists();
    if let Some(t) = since {
        changed_since(p, t, &mut changed);
    }
    Check {
        check: "protected-untouched".into(),
        vm: None,
        ok: exists && changed.is_empty(),
        expected: format!(
            "{} exists, nothing changed since {}",
            p.display(),
            since.unwrap_or(0.0)
        ),
        actual: if exists {
            format!("changed {changed:?}")
        } else {
            "missing".into()
        },
    }
}

/// `register_with_machined`: systemd-machined lists no vmwarden machine of
/// this name (see `teardown::machine`).
fn machine_check(n: &VmName) -> Check {
    let left = machine::left_registration(n);
    check(
        "no-machine-registration",
        Some(n.as_str()),
        matches!(left, Ok(None)),
        "none",
        match left {
            Ok(None) => "none".to_string(),
            Ok(Some(leader)) => format!("registered, leader {leader}"),
            Err(e) => format!("<{e}>"),
        },
    )
}
