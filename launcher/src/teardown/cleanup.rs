//! `vmwarden-cleanup NAME`: tear down what a launch created, verify, report.
//!
//! Not dead ⇒ delete nothing. Otherwise: take the lease (no launch can start
//! meanwhile), delete the runtime dir's entries minus the keep set (the
//! intent record last), check no credential tmpfs of the VM survives in any
//! mount namespace, re-check every deletion, report. Idempotent.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::config::names::{TapName, VmName};
use crate::config::paths::{Roots, CREDS_FLOOR_FILE, LEASE_FILE};
use crate::config::rawpath;
use crate::config::spec::Spec;
use crate::host::dirs;
use crate::host::leftovers::{self, SetId};
use crate::host::mountinfo;
use crate::host::net::{self, Rtnl, SYS_CLASS_NET};
use crate::host::ownership::{self, Failed, Kept, Outcome, DELETE_LAST, RUNTIME_KEEP};
use crate::host::procs::{self, Scanner, Wants};
use crate::instance::creds_floor;
use crate::instance::intent::{Intent, Resource};
use crate::instance::last_cleanup::LastCleanup;
use crate::instance::launched::effective_spec;
use crate::instance::lease::{self, Lease, LeaseState};
use crate::instance::liveness::{self, Probe, Verdict};
use crate::teardown::{devices, hibernate, machine, made_sources, taps};

#[derive(Debug, Clone, Serialize, PartialEq, Eq, Default)]
pub struct ServiceResult {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_result: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<String>,
}

impl ServiceResult {
    /// `$SERVICE_RESULT`, `$EXIT_CODE`, `$EXIT_STATUS` as systemd sets them
    /// for `ExecStopPost=`.
    pub fn from_env() -> Self {
        ServiceResult {
            service_result: std::env::var("SERVICE_RESULT").ok(),
            exit_code: std::env::var("EXIT_CODE").ok(),
            exit_status: std::env::var("EXIT_STATUS").ok(),
        }
    }
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Report {
    pub name: String,
    #[serde(serialize_with = "rawpath::path")]
    pub runtime_dir: PathBuf,
    pub liveness: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    #[serde(serialize_with = "rawpath::paths")]
    pub deleted: Vec<PathBuf>,
    pub kept: Vec<Kept>,
    pub failed: Vec<Failed>,
    pub service_result: ServiceResult,
    /// The devices given back (`devices`), each with its proof.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
    pub clean: bool,
}

impl Report {
    fn new(roots: &Roots, name: &VmName, service_result: ServiceResult) -> Self {
        Report {
            name: name.to_string(),
            runtime_dir: roots.runtime_dir(name),
            liveness: String::new(),
            instance_id: None,
            deleted: Vec::new(),
            kept: Vec::new(),
            failed: Vec::new(),
            service_result,
            devices: Vec::new(),
            clean: false,
        }
    }

    /// The runtime dir cannot be opened (the VM is not running).
    fn fail_dir(mut self, reason: String) -> Self {
        self.liveness = Verdict::Dead.reason();
        self.failed.push(Failed {
            path: self.runtime_dir.clone(),
            reason,
        });
        self
    }

    fn refuse(mut self, verdict: &Verdict) -> Self {
        self.liveness = verdict.reason();
        self.kept.push(Kept {
            path: self.runtime_dir.clone(),
            reason: format!("not deleted: VM is {}", verdict.reason()),
        });
        self.clean = false;
        self
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

/// Tear down VM `name`'s runtime state. Never touches the state dir.
pub fn cleanup(roots: &Roots, name: &VmName, service_result: ServiceResult) -> Report {
    let report = Report::new(roots, name, service_result);
    // With a runtime dir, only its lease is asked here (held ⇒ live); the
    // rest of the probe runs once, under the lease, in `cleanup_dir`.
    match dirs::open_dir(&roots.runtime_dir(name)) {
        Ok(d) => match lease::state(&d) {
            Ok(LeaseState::Held) => report.refuse(&Verdict::Live(format!(
                "lease {} is held",
                d.path.join(LEASE_FILE).display()
            ))),
            Ok(_) => cleanup_dir(roots, name, &d, report),
            Err(e) => report.refuse(&Verdict::Ambiguous(format!("cannot probe the lease: {e}"))),
        },
        Err(e) if e.is_not_found() => {
            // One /proc scan for the probe and the mount check.
            let uid = liveness::vm_uid(roots, name, None).ok().flatten();
            let probe = Probe::sharing(Scanner::new(Wants::uids_and_mounts(uid)));
            let verdict = probe.probe(roots, name);
            if !verdict.is_dead() {
                return report.refuse(&verdict);
            }
            match dirs::open_dir(&roots.runtime_dir(name)) {
                // A launch made it meanwhile: the whole teardown, under
                // the lease.
                Ok(d) => cleanup_dir(roots, name, &d, report),
                Err(e) if e.is_not_found() => cleanup_absent(roots, name, &probe, report),
                Err(e) => report.fail_dir(e.to_string()),
            }
        }
        Err(e) => report.refuse(&Verdict::Ambiguous(format!(
            "cannot open its runtime dir: {e}"
        ))),
    }
}

/// Nothing was ever created (or it is already gone): check mounts and taps.
fn cleanup_absent(roots: &Roots, name: &VmName, probe: &Probe, mut report: Report) -> Report {
    report.liveness = Verdict::Dead.reason();
    report
        .failed
        .extend(surviving_credential_mounts_in(probe, roots, name, None));
    report.failed.extend(surviving_taps(roots, name, None));
    report.failed.extend(setid_in_state_dir(roots, name));
    report.clean = report.failed.is_empty();
    report
}

/// The lease is free (or absent): take it, probe the rest under it, and
/// tear down.
fn cleanup_dir(roots: &Roots, name: &VmName, rundir: &dirs::Dir, mut report: Report) -> Report {
    report.liveness = Verdict::Dead.reason();
    // Same exclusive lock as the launcher: no launch starts while we delete.
    let _lease = match take_lease(rundir) {
        Ok(l) => l,
        Err(v) => return report.refuse(&v),
    };
    let UnderLease {
        intent,
        spec,
        uid,
        probe,
    } = match probe_under_lease(roots, name, rundir) {
        Ok(u) => u,
        Err(v) => return report.refuse(&v),
    };
    report.instance_id = intent.as_ref().map(|i| i.instance_id.clone());
    // Recorded resources outside the runtime dir are not cleanup's to delete.
    keep_recorded_outside(intent.as_ref(), rundir, &mut report);
    // ...except what a launch killed while making an image leaves.
    remove_image_temps(roots, name, intent.as_ref(), &mut report);
    // ...and a share source it made but did not record (kept once recorded).
    let made = made_sources::cleanup(roots, name, intent.as_ref());
    report.deleted.extend(made.deleted);
    report.kept.extend(made.kept);
    report.failed.extend(made.failed);
    // ...and a half-written hibernation snapshot (the complete one is kept).
    let snap = hibernate::cleanup(roots, name, intent.as_ref());
    report.deleted.extend(snap.deleted);
    report.kept.extend(snap.kept);
    report.failed.extend(snap.failed);
    // Firecracker's taps (it opens them by name) were persistent in the
    // host's namespace before they moved into a namespace of its own; a
    // record written then names them, and they go here, the instance
    // being dead, before the survivors are counted. So do the host sides
    // of the links into its namespace that the kernel has not yet removed.
    delete_persistent_taps(intent.as_ref(), &mut report);
    delete_ns_link_ends(intent.as_ref(), &mut report);
    // The devices it held, given back and proven so before the record that
    // names them goes: one not given back keeps the record for the next try.
    let given = devices::give_back(intent.as_ref());
    report.devices = given.returned;
    if !given.failed.is_empty() {
        report.failed.extend(given.failed);
        return report;
    }
    // A macvtap outlives its fds: it goes here, the instance being dead.
    if let Some(i) = intent.as_ref() {
        let (gone, failed) = taps::delete_macvtaps(i);
        report.deleted.extend(gone);
        report.failed.extend(failed);
    }
    let vm_taps = taps::vm_taps_with(intent.as_ref(), spec.as_ref());
    let Some((keep, taps_left)) = delete_runtime_entries(rundir, &vm_taps, &mut report) else {
        return report;
    };
    verify_deleted(roots, name, rundir, &keep, taps_left, &probe, &mut report);
    // No process of the VM's uid (the hypervisor or a helper) is left.
    report.failed.extend(surviving_processes_in(&probe, uid));
    // -- The host's own tools: the machined registration ends with it. --
    if let (Some(i), Some(true)) = (&intent, spec.as_ref().map(|s| s.register_with_machined)) {
        if let Err(reason) = machine::end_registration(name, i.pid) {
            report.failed.push(Failed {
                path: machine::state_path(name),
                reason,
            });
        }
    }
    // Nor a set-id program in its state dir (not deleted: the state dir is
    // the user's; reported, so the teardown is not clean until it is gone).
    report.failed.extend(setid_in_state_dir(roots, name));
    report.clean = report.failed.is_empty();
    record_verdict(rundir, &report);
    report
}

/// Keep this cleanup's verdict in the runtime dir for `vmwarden metrics`
/// (`instance::last_cleanup`), still under the lease. A record that cannot
/// be written is logged, not a residue: the teardown itself is as clean as
/// its report says.
fn record_verdict(rundir: &dirs::Dir, report: &Report) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let rec = LastCleanup::next(
        LastCleanup::read(rundir).as_ref(),
        report.instance_id.as_deref(),
        report.clean,
        report.failed.len() as u64,
        now,
    );
    if let Err(e) = rec.write(rundir) {
        tracing::warn!("cannot keep the last cleanup's verdict: {e}");
    }
}

/// The lease, taken as the launcher takes it; held by someone else (or
/// unreadable) is the verdict to refuse with.
fn take_lease(rundir: &dirs::Dir) -> Result<Lease, Verdict> {
    match Lease::acquire(rundir) {
        Ok(Some(l)) => Ok(l),
        Ok(None) => Err(Verdict::Live(
            "its lease was taken while cleanup started".into(),
        )),
        Err(e) => Err(Verdict::Ambiguous(format!("cannot take the lease: {e}"))),
    }
}

/// What the probe under the lease read, for the teardown after it.
struct UnderLease {
    intent: Option<Intent>,
    /// The spec to believe (the launched copy the record names, else the
    /// configured one), read once: the uid when the record has none, and
    /// the taps.
    spec: Option<Spec>,
    uid: Option<u32>,
    /// Holds the command's one `/proc` scan (taken by the probe when the
    /// record names no cgroup, else by the first check after the deletions
    /// that needs it): the uid's processes and every mount namespace.
    probe: Probe,
}

/// The intent record and the rest of the liveness probe, under the lease;
/// anything but dead is the verdict to refuse with.
fn probe_under_lease(
    roots: &Roots,
    name: &VmName,
    rundir: &dirs::Dir,
) -> Result<UnderLease, Verdict> {
    let intent = Intent::read(rundir).map_err(|e| Verdict::Ambiguous(e.to_string()))?;
    let spec = effective_spec(roots, name, intent.as_ref()).map(|(s, _)| s);
    // The rest of the probe, under the lease: the recorded cgroup, else the
    // uid's processes (the record's, else the spec's), then the sockets.
    let uid = liveness::vm_uid_with(name, intent.as_ref(), spec.as_ref())
        .map_err(|e| Verdict::Ambiguous(e.to_string()))?;
    let probe = Probe::sharing(Scanner::new(Wants::uids_and_mounts(uid)));
    let v = probe.with_lease_held(roots, name, uid, intent.as_ref());
    if !v.is_dead() {
        return Err(v);
    }
    Ok(UnderLease {
        intent,
        spec,
        uid,
        probe,
    })
}

/// Resources the record names outside the runtime dir (the state dir, …)
/// are reported kept: they are not cleanup's to delete.
fn keep_recorded_outside(intent: Option<&Intent>, rundir: &dirs::Dir, report: &mut Report) {
    if let Some(i) = intent {
        for r in &i.resources {
            match r {
                Resource::CreatedImage { path, .. } => report.kept.push(Kept {
                    path: path.clone(),
                    reason: "created image: persistent and the user's; only `vmwarden purge` deletes it".into(),
                }),
                Resource::StateDir { path } => report.kept.push(Kept {
                    path: path.clone(),
                    reason: "state dir: persistent and the user's; only `vmwarden purge` deletes in it".into(),
                }),
                Resource::RuntimeDir { path } | Resource::RuntimeFile { path } if !path.starts_with(&rundir.path) => {
                    report.kept.push(Kept {
                        path: path.clone(),
                        reason: "recorded outside this VM's runtime dir; not vmwarden-cleanup's to delete".into(),
                    })
                }
                _ => {}
            }
        }
    }
}

/// E(runtime dir) \ K, the intent record last. `None` when the dir cannot
/// be enumerated (reported); else the keep set used and the taps that
/// survive (which keep the intent record).
fn delete_runtime_entries(
    rundir: &dirs::Dir,
    vm_taps: &[TapName],
    report: &mut Report,
) -> Option<(Vec<&'static str>, Vec<Failed>)> {
    let names = match ownership::entries(rundir) {
        Ok(n) => n,
        Err(e) => {
            report.failed.push(Failed {
                path: rundir.path.clone(),
                reason: format!("cannot enumerate: {e}"),
            });
            return None;
        }
    };
    for k in RUNTIME_KEEP {
        if names.iter().any(|n| n.as_os_str() == OsStr::new(k)) {
            report.kept.push(Kept {
                path: rundir.path.join(k),
                reason: match *k {
                    LEASE_FILE => "keep set: the lease file stays so every launch locks the same inode",
                    CREDS_FLOOR_FILE => "keep set: the credential floor stays: it bounds the search for what an instance left",
                    _ => "keep set: the last cleanup's record stays: it counts the instances torn down",
                }
                .into(),
            });
        }
    }
    // A surviving tap keeps the intent record: it is what ties the tap to
    // this VM for a later reap once the spec is gone.
    let taps_left = taps_failed(taps::surviving(vm_taps));
    let mut keep: Vec<&str> = RUNTIME_KEEP.to_vec();
    if !taps_left.is_empty() {
        keep.push(DELETE_LAST);
        report.kept.push(Kept {
            path: rundir.path.join(DELETE_LAST),
            reason: "a tap of this VM survives; the intent record stays until it is gone".into(),
        });
    }
    let doomed = ownership::deletion_set(&names, &keep, Some(DELETE_LAST));
    let skip = ownership::test_skip_delete();
    let out: Outcome = ownership::delete_entries(rundir, &doomed, skip.as_deref());
    report.deleted.extend(out.deleted);
    report.failed.extend(out.failed);
    report.kept.extend(out.kept);

    Some((keep, taps_left))
}

/// Nothing but the keep set remains, no credential mount anywhere, no tap.
fn verify_deleted(
    roots: &Roots,
    name: &VmName,
    rundir: &dirs::Dir,
    keep: &[&str],
    taps_left: Vec<Failed>,
    probe: &Probe,
    report: &mut Report,
) {
    match ownership::entries(rundir) {
        Ok(left) => {
            for n in ownership::deletion_set(&left, keep, None) {
                let p = rundir.path.join(&n);
                if !report.failed.iter().any(|f| f.path == p) {
                    report.failed.push(Failed {
                        path: p,
                        reason: "still present after cleanup".into(),
                    });
                }
            }
        }
        Err(e) => report.failed.push(Failed {
            path: rundir.path.clone(),
            reason: format!("cannot re-enumerate: {e}"),
        }),
    }
    report.failed.extend(surviving_credential_mounts_in(
        probe,
        roots,
        name,
        Some(rundir),
    ));
    report.failed.extend(taps_left);
}

/// The temporary names of the images the record lists (see
/// [`remove_image_temp`]).
fn remove_image_temps(roots: &Roots, name: &VmName, intent: Option<&Intent>, report: &mut Report) {
    for r in intent.map(|i| i.resources.as_slice()).unwrap_or_default() {
        if let Resource::CreatedImage { temp, .. } = r {
            remove_image_temp(roots, name, temp, report);
        }
    }
}

/// The temporary name of an image a launch was making (`disks[].create`):
/// a killed launch leaves it, half made, and it is never a finished image
/// (those are renamed to their final name), so it goes. Only that exact
/// name, only inside this VM's state dir, reached without a symlink.
fn remove_image_temp(roots: &Roots, name: &VmName, temp: &Path, report: &mut Report) {
    use std::os::fd::AsFd;
    let own = roots.state_dir(name);
    let fail = |reason: String| Failed {
        path: temp.to_path_buf(),
        reason,
    };
    let (Some(parent), Some(file)) = (temp.parent(), temp.file_name()) else {
        return;
    };
    if !parent.starts_with(&own)
        || !file
            .to_str()
            .is_some_and(|f| f.starts_with('.') && f.ends_with(".vmwarden-new"))
    {
        report.kept.push(Kept {
            path: temp.to_path_buf(),
            reason: "recorded image temporary is not one vmwarden names; not deleted".into(),
        });
        return;
    }
    let dir = match dirs::open_dir(parent) {
        Ok(d) => d,
        Err(e) if e.is_not_found() => return,
        Err(e) => {
            report.failed.push(fail(e.to_string()));
            return;
        }
    };
    match nix::unistd::unlinkat(
        dir.fd.as_fd(),
        file,
        nix::unistd::UnlinkatFlags::NoRemoveDir,
    ) {
        Ok(()) => report.deleted.push(temp.to_path_buf()),
        Err(nix::errno::Errno::ENOENT) => {}
        Err(e) => report.failed.push(fail(format!("unlink: {e}"))),
    }
    match nix::sys::stat::fstatat(
        dir.fd.as_fd(),
        file,
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    ) {
        Err(nix::errno::Errno::ENOENT) => {}
        _ if report.failed.iter().any(|f| f.path == temp) => {}
        _ => report
            .failed
            .push(fail("still present after cleanup".into())),
    }
}

/// Processes of the VM's uid still running after the teardown: the
/// hypervisor, or a helper daemon (virtiofsd, vhost-device-vsock) that outlived it. The probe
/// under the lease asked the recorded cgroup when there is one; this asks
/// the uid itself, so a process that left the cgroup is not missed.
pub fn surviving_processes(uid: Option<u32>) -> Vec<Failed> {
    surviving_processes_in(&Probe::single(), uid)
}

/// [`surviving_processes`] from `probe`'s scan (a scan taken under the
/// lease with no process of the uid, before the deletions, stands: the
/// lease keeps launches out, and nothing else starts the VM's processes).
fn surviving_processes_in(probe: &Probe, uid: Option<u32>) -> Vec<Failed> {
    let Some(uid) = uid else { return Vec::new() };
    let t = probe.tasks_of(uid);
    let mut out: Vec<Failed> = t
        .pids
        .iter()
        .map(|pid| Failed {
            path: PathBuf::from(format!("/proc/{pid}")),
            reason: format!(
                "process {pid} of the VM's uid {uid} (the hypervisor or a helper) survives the instance"
            ),
        })
        .collect();
    out.extend(t.unreadable.0.iter().map(|(what, e)| Failed {
        path: PathBuf::from("/proc").join(what),
        reason: format!("cannot tell whether uid {uid} runs anything: {e}"),
    }));
    out
}

/// Set-user-ID and set-group-ID files under the VM's state dir (see
/// [`leftovers::setid_files`]), each a failure naming it.
pub fn setid_in_state_dir(roots: &Roots, name: &VmName) -> Vec<Failed> {
    leftovers::setid_files(&roots.state_dir(name))
        .into_iter()
        .map(|f| {
            let path = match &f {
                SetId::File { path, .. } | SetId::Unreadable { path, .. } => path.clone(),
            };
            let reason = match &f {
                SetId::File { .. } => format!(
                    "{f}: a set-id program left in the VM's state dir runs as its owner for anyone who reaches it; not deleted (the state dir is the user's): remove it or `chmod ug-s` it"
                ),
                SetId::Unreadable { .. } => f.to_string(),
            };
            Failed { path, reason }
        })
        .collect()
}

/// Delete the persistent taps the intent record names that are owned by
/// its principal: what a launch for a hypervisor that opens its taps by
/// name (firecracker) made in the host's namespace before it got one of
/// its own, recorded before they existed (an instance started by an older
/// vmwarden, cleaned up by this one). Only called with
/// the instance dead and the lease held. A tap with another owner, or not
/// persistent (someone holds it open), is left to the survivor check.
fn delete_persistent_taps(intent: Option<&Intent>, report: &mut Report) {
    let Some(intent) = intent else { return };
    let mut rtnl = None;
    for tap in intent.taps() {
        let Some((index, true)) = net::tun_info(tap.as_str()) else {
            continue;
        };
        if net::tun_owner(tap.as_str()) != Some(intent.principal.uid) {
            continue;
        }
        let path = PathBuf::from(SYS_CLASS_NET).join(tap.as_str());
        if rtnl.is_none() {
            match Rtnl::open() {
                Ok(n) => rtnl = Some(n),
                Err(e) => {
                    report.failed.push(Failed {
                        path,
                        reason: e.to_string(),
                    });
                    return;
                }
            }
        }
        let Some(n) = rtnl.as_mut() else { return };
        // The vetted device by its index, not whatever holds the name now.
        match n.delete_index(tap.as_str(), index) {
            Ok(_) if net::tun_info(tap.as_str()).map(|(i, _)| i) != Some(index) => {
                report.deleted.push(path)
            }
            Ok(_) => report.failed.push(Failed {
                path,
                reason: "RTM_DELLINK succeeded but the tap still exists".into(),
            }),
            Err(e) => report.failed.push(Failed {
                path,
                reason: e.to_string(),
            }),
        }
    }
}

/// Delete the host sides of the links into the VM's own network namespace
/// (`ns-link` in the intent record) that are still here: the kernel
/// removes them with the namespace once the hypervisor is gone, but does so
/// asynchronously, and a namespace something else still holds would keep
/// its link to the bridge. Each is vetted (a veth whose other end is in
/// another namespace, marked with the record's instance id: another set of
/// roots may have a link of the same name) and deleted by its index. Only called with the
/// instance dead and the lease held.
fn delete_ns_link_ends(intent: Option<&Intent>, report: &mut Report) {
    let Some(names) = intent.map(Intent::ns_links).filter(|n| !n.is_empty()) else {
        return;
    };
    let path = |name: &TapName| PathBuf::from(SYS_CLASS_NET).join(name.as_str());
    let mut rtnl = match Rtnl::open() {
        Ok(r) => r,
        Err(e) => {
            report.failed.extend(names.iter().map(|n| Failed {
                path: path(n),
                reason: e.to_string(),
            }));
            return;
        }
    };
    let Some(intent) = intent else { return };
    for name in &names {
        let outcome = match rtnl.link(name.as_str()) {
            // Gone, not such a link, or not this instance's (another set of
            // roots' VM may have a tap of the same name): the survivor
            // check judges it.
            Ok(None) => continue,
            Ok(Some(l)) if !taps::is_ns_link_end_of(&l, intent) => continue,
            Ok(Some(l)) => taps::delete_vetted(&mut rtnl, name.as_str(), l.index),
            Err(e) => Err(e.to_string()),
        };
        match outcome {
            Ok(true) => report.deleted.push(path(name)),
            Ok(false) => {}
            Err(reason) => report.failed.push(Failed {
                path: path(name),
                reason,
            }),
        }
    }
}

/// Taps of `name` (intent record and spec) that still exist. The kernel
/// deletes a non-persistent tap with its last fd; a survivor means some
/// process still holds it or it was made persistent by someone else than
/// the launcher (whose persistent taps cleanup deleted first). Cleanup does
/// not delete it (it may be in use); `vmwarden reap --apply` does once the
/// VM is not live.
pub fn surviving_taps(roots: &Roots, name: &VmName, intent: Option<&Intent>) -> Vec<Failed> {
    taps_failed(taps::surviving(&taps::vm_taps(roots, name, intent)))
}

fn taps_failed(left: Vec<(TapName, String)>) -> Vec<Failed> {
    left.into_iter()
        .map(|(tap, why)| Failed {
            path: PathBuf::from(SYS_CLASS_NET).join(tap.as_str()),
            reason: format!(
                "tap {tap} survives the hypervisor ({why}): something still holds its fd or it was made persistent; `vmwarden reap --apply` deletes it"
            ),
        })
        .collect()
}

/// Credential tmpfs mounts of `name` still present in any mount namespace.
/// Only a mount at this set of roots' mount point counts (another set of
/// roots may run a VM of the same name).
pub fn surviving_credential_mounts(roots: &Roots, name: &VmName) -> Vec<Failed> {
    surviving_credential_mounts_in(&Probe::single(), roots, name, None)
}

/// [`surviving_credential_mounts`] from the mount namespaces of `probe`'s
/// scan (one of its own when the probe shares none). With the VM's
/// runtime dir (under its lease, its processes gone), the kernel is asked
/// only from the VM's credential floor up (`instance::creds_floor`), and
/// a search that finds none marks the floor proven.
fn surviving_credential_mounts_in(
    probe: &Probe,
    roots: &Roots,
    name: &VmName,
    rundir: Option<&dirs::Dir>,
) -> Vec<Failed> {
    let root = Some(roots.runtime_root.as_path());
    let floor = rundir.and_then(creds_floor::read);
    let since = floor.unwrap_or(0);
    let found = match probe.scanner() {
        Some(s) => mountinfo::credential_mounts_in(s.get(), root, Some(name), since),
        None => mountinfo::credential_mounts_in(&procs::Scan::default(), root, Some(name), since),
    };
    if let (true, Some(d)) = (found.is_empty(), rundir) {
        if let Err(e) = creds_floor::mark_proven(d, floor) {
            // Safe to leave: the floor stays unproven and lower.
            tracing::warn!("{e}");
        }
    }
    found
        .into_iter()
        .map(|(pid, ns, m)| Failed {
            path: m.mount_point,
            reason: format!(
                "credential tmpfs still mounted in mount namespace {ns} ({})",
                mountinfo::holder(pid)
            ),
        })
        .collect()
}
