//! The launch, in order (docs/design/launch-sequence.md). One linear
//! function that reads like the step list; each step that creates something
//! is in the intent record before it exists. The steps themselves live one
//! group to a file: [`preflight`] (the checks and trust walks before
//! anything is created), [`interfaces`] (taps and the vhost-vsock device),
//! [`control_files`] (what the control dir holds before the hypervisor
//! starts), [`netns`] (firecracker's network namespace, which holds only
//! its taps), [`probe`] (asking a hypervisor binary about its build, in its
//! confinement), [`volumes`], [`helpers`], [`creds`], [`sandbox`] (with
//! [`landlock`] and [`seccomp`]; its errors in [`sandbox_error`], the
//! privilege drop's self-check in [`drop_check`], every privileged call
//! through [`syscall`]) and [`exec`]; [`resources`] is what the intent
//! record names before any of it exists, [`error`] why a step failed.

pub mod console;
pub mod control_files;
pub mod creds;
pub mod drop_check;
pub mod error;
pub mod exec;
pub mod guest_output;
pub mod helpers;
pub mod interfaces;
pub mod landlock;
mod lock_order;
pub mod machine;
pub mod macvtap;
pub mod netns;
pub mod passthrough;
pub mod preflight;
pub mod probe;
pub mod reach;
pub mod resources;
pub mod restore;
pub mod root;
pub mod sandbox;
pub mod sandbox_error;
pub mod seccomp;
pub mod share_sources;
mod steps;
pub mod syscall;
#[cfg(test)]
mod tests;
pub mod volumes;

pub use error::StepError;
pub use exec::EXEC_PATH;
pub use interfaces::VHOST_VSOCK;
pub use resources::planned_resources;
pub use steps::{LaunchError, EXEC_STEP, STEPS};

use std::convert::Infallible;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};

use crate::config::names::VmName;
use crate::config::paths::{
    Roots, API_SOCKET, CH_API_LOCK, CONTROL_DIR, CREDENTIALS_DIR, FIRECRACKER_CONFIG,
    LAUNCHED_SPEC_FILE, LEASE_FILE, QMP_SOCKET,
};
use crate::config::spec::{HypervisorKind, Spec};
use crate::devices;
use crate::host::cgroup;
use crate::host::dirs::{self, Dir, Loose, Want};
use crate::host::net;
use crate::host::sys::SysContext;
use crate::host::trust::{self, Policy};
use crate::hypervisor::{self, Layout};
use crate::identity::principal::{self, Principal};
use crate::identity::registry;
use crate::instance::creds_floor;
use crate::instance::intent::{self, Intent, IntentPrincipal};
use crate::instance::lease::{self, Lease, LeaseState};
use crate::instance::liveness::{Probe, Via};
use crate::launch::steps::Steps;
use crate::launch::syscall::{LinuxSyscall, Syscall};

type Result<T, E = StepError> = std::result::Result<T, E>;

#[derive(Debug, Clone)]
pub struct Options {
    pub name: VmName,
    pub roots: Roots,
    /// Spec path; defaults to `CONFIG_DIR/NAME.json`.
    pub spec: Option<PathBuf>,
    /// `--probe -- CMD…`: run CMD in the identical sandbox.
    pub probe: Option<Vec<String>>,
    /// `$CREDENTIALS_DIRECTORY`, captured before the environment was cleared.
    pub credentials_directory: Option<PathBuf>,
    /// `$VMWARDEN_FAULT_AFTER`, captured likewise (honoured only with the
    /// `fault-injection` feature).
    pub fault_after: Option<String>,
    /// `$VMWARDEN_TEST_HELPER_OPENAT2_ENOSYS=1`, captured likewise (honoured
    /// only with the `fault-injection` feature): every helper also gets a
    /// filter that answers `openat2` with ENOSYS, as systemd's
    /// `RestrictSUIDSGID=` does, so the tests can show a share holds
    /// without virtiofsd's own `openat2` guard.
    pub helper_openat2_enosys: bool,
    /// `$INVOCATION_ID` and `$SYSTEMD_EXEC_PID`, captured likewise: which
    /// unit started this launch ([`cgroup::Invocation`]).
    pub invocation: cgroup::Invocation,
    /// `$JOURNAL_STREAM` named stdout (the guest's serial output goes to a
    /// stream without level prefixes, [`guest_output`]).
    pub stdout_journal: bool,
}

fn root_want(mode: u32, loose: Loose) -> Want {
    Want {
        uid: 0,
        gid: 0,
        mode,
        loose,
    }
}

/// Everything up to `execve`. Returns only on error, naming the step it
/// failed in.
///
/// Every log line of the launch is in the span `launch{vm=NAME}` and its
/// INFO lines carry `step=` (a step of [`STEPS`], or [`EXEC_STEP`]), so the
/// journal says which VM and where.
pub fn launch(opts: Options) -> std::result::Result<Infallible, LaunchError> {
    let _span = tracing::info_span!("launch", vm = %opts.name).entered();
    let mut steps = Steps::new(opts.fault_after.clone());
    run(&opts, &mut steps).map_err(|error| LaunchError::at(steps.current(), error))
}

fn run(opts: &Options, steps: &mut Steps) -> Result<Infallible> {
    steps.after("sanitized");

    // 2. Spec: every field, and the files it names. Nothing is created yet.
    let roots = &opts.roots;
    roots.validate()?;
    // A runtime root others may write (`/tmp`) is refused before anything
    // in it is read (its pre-flight in step 3 checks it again).
    dirs::check_root(&roots.runtime_root, "--runtime-root")?;
    // A running VM is reported as running before anything else is judged
    // (its taps exist, its credentials may be unavailable to a second caller).
    if let Ok(d) = dirs::open_dir(&roots.runtime_dir(&opts.name)) {
        if matches!(lease::state(&d), Ok(LeaseState::Held)) {
            return Err(StepError::AlreadyRunning {
                name: opts.name.to_string(),
                lease: d.path.join(LEASE_FILE),
            });
        }
    }
    let spec_path = opts
        .spec
        .clone()
        .unwrap_or_else(|| roots.spec_path(&opts.name));
    // The trusted walks of this launch (the spec, credentials, what root
    // hands to the hypervisor) share their way: each directory on it is
    // opened and stat'ed once.
    let mut walker = trust::Walker::new();
    // The spec's walk comes first: its last step (an O_PATH open and fstat
    // of the file, kept open) is the probe the read needs, so the spec is
    // opened once more, for reading, under the walked directory. Its
    // verdict is reported with the other trusted files (step 3); when the
    // walk fails, the spec is read by its path, as it always was, and
    // whatever stops that read is reported here.
    let spec_walk = walker.regular_file(&spec_path, Policy::Executable);
    // The bytes are kept (step 5b): what `status` compares and the
    // teardown tools read while this instance's record exists.
    let spec_read = match &spec_walk {
        Ok(w) => Spec::read_bytes_probed(&spec_path, w.parent.as_fd(), &w.name, &w.stat),
        Err(_) => Spec::read_bytes(&spec_path),
    };
    let (spec, spec_bytes) = Spec::load_bytes(&spec_path, &opts.name, spec_read?)?;
    let spec_walk = spec_walk.map(drop);
    preflight::check_against_roots(&spec, &spec_path, roots)?;
    let loaded = creds::read_all(
        &spec.credentials,
        opts.credentials_directory.as_deref(),
        &mut walker,
    )?;
    tracing::info!(
        step = %"spec-loaded",
        spec = %spec_path.display(),
        hypervisor = %spec.hypervisor.kind.as_str(),
        credentials = loaded.len(),
        "spec valid"
    );
    steps.after("spec-loaded");

    // 3. Principal.
    let principal = principal::resolve(&spec, roots)?;
    // The state root and the runtime root are opened once (when they
    // exist) for the registry check and the pre-flight below, and kept for
    // the steps that create what is in them.
    let state_root = dirs::open_dir_if_exists(&roots.state_root)?;
    // Neither root may be a directory others can write (`/tmp`): it is
    // refused, never taken over (the runtime root's pre-flight is below).
    if let Some(d) = &state_root {
        dirs::check_dir(d, &dirs::root_want("--state-root"))?;
    }
    registry::check_launch(roots, state_root.as_ref(), &spec.name, &principal)?;
    // Pre-flight the directories that already exist, so a refusal leaves
    // nothing behind (no runtime dir, lease or intent record yet).
    let vm_want = |mode| Want {
        uid: principal.uid,
        gid: principal.gid,
        mode,
        loose: Loose::Tighten,
    };
    dirs::preflight_in(state_root.as_ref(), spec.name.as_str(), &vm_want(0o700))?;
    let (rt_parent, rt_name) = dirs::split_parent_if_exists(&roots.runtime_root)?;
    let runtime_root = dirs::preflight_in(
        rt_parent.as_ref(),
        &rt_name,
        &dirs::root_want("--runtime-root"),
    )?;
    drop(rt_parent);
    dirs::preflight_in(
        runtime_root.as_ref(),
        spec.name.as_str(),
        &root_want(0o755, Loose::Refuse),
    )?;
    // The interfaces, what root hands to the hypervisor, the hypervisor
    // binary's sandbox and fw_cfg, and what the principal must own.
    // A writable share's missing source, made at `share-sources-made`.
    let to_make = share_sources::preflight(
        &spec,
        &spec_path,
        &roots.state_dir(&spec.name),
        principal.uid,
    )?;
    let qemu_sandbox = preflight::check_with_principal(
        &spec, &spec_path, spec_walk, roots, walker, &principal, &to_make,
    )?;
    // The kernel's vsock device, opened by root before anything is made
    // (a host without it refuses here and changes nothing); its fd goes to
    // QEMU like a tap's, the principal never opens the node.
    let vhost_vsock = interfaces::open_vhost_vsock(spec.vsock.as_ref())?;
    // The same for vhost-net, one fd per queue of each interface asking.
    let vhost_net = interfaces::open_vhost_net(&spec)?;
    let devices = devices::preflight(&spec)?;
    steps.after("principal-resolved");
    // A hibernated VM restores when its snapshot still matches (launch::restore).
    let decision = restore::decide(&spec, &spec_bytes, roots, &principal)?;
    steps.after("restore-checked");

    // 4. Runtime root and this VM's runtime dir, then the lease.
    let runtime_root = dirs::ensure_root(
        &roots.runtime_root,
        runtime_root,
        &dirs::root_want("--runtime-root"),
    )?;
    let (rundir, rundir_made) = dirs::ensure(
        &runtime_root,
        spec.name.as_str(),
        &root_want(0o755, Loose::Refuse),
    )?;
    steps.after("runtime-dir");
    let lease = match Lease::acquire(&rundir)? {
        Some(l) => l,
        None => {
            return Err(StepError::AlreadyRunning {
                name: spec.name.to_string(),
                lease: rundir.path.join(LEASE_FILE),
            })
        }
    };
    // A runtime dir that was there may hold what an instance recorded no
    // credential floor for: under the lease, its floor is every mount
    // until a cleanup proves none left (instance::creds_floor).
    if !rundir_made {
        creds_floor::note_unknown_past(&rundir)?;
    }
    // Under the lease, the rest of the probe, by the uid: a principal is
    // dedicated to one VM, so any process running as it now — a previous
    // instance's (they all run as the uid), or anything else's — refuses
    // the launch. (The credentials of each process, from a pidfd; kernel
    // threads and other users' processes are skipped unread.) The launcher's own cgroup, when
    // it holds nobody else or is the cgroup of the unit that started this
    // launch (`PREFIX@NAME.service` with the launcher's invocation id,
    // where `ExecStartPost=`'s wait-ready runs beside it), will hold this
    // instance and everything it starts: the intent record names it, and
    // stop, status, cleanup and reap ask it instead of /proc.
    // What the log says of it: the cgroup and why, or why none.
    let (own_cgroup, cgroup_said) =
        match cgroup::own_dedicated(spec.name.as_str(), &opts.invocation) {
            Ok((cg, why)) => {
                let said = format!("{} ({why})", cg.path.display());
                (Some(cg), said)
            }
            Err(why) => (None, format!("none ({why}; liveness scans /proc)")),
        };
    let verdict = Probe::single().via(Via::Procs).with_lease_held(
        roots,
        &spec.name,
        Some(principal.uid),
        None,
    );
    if !verdict.is_dead() {
        return Err(StepError::Ambiguous {
            name: spec.name.to_string(),
            verdict,
        });
    }
    // The decision again if another instance ran since (restore::again).
    // A cold boot over a snapshot that no longer matches: it goes stale
    // now (restore::discard), under the lease, before anything is made.
    // Before the host-wide locks: the discard takes the at-shutdown
    // record's lock (waited on up to 30 s), never under the device claim,
    // and a refusal here leaves no id range behind.
    let decision = restore::again(decision, &spec, &spec_bytes, roots, &principal)?;
    if decision.stale && opts.probe.is_none() {
        restore::discard(roots, &spec.name)?;
    }
    // A share the guest owns: the VM's own id range, recorded under the
    // host-wide ranges lock. Then the host-wide device claim
    // (devices::claim), held until the `devices` step has made them the
    // principal's: under it the devices are checked free again, so of two
    // launches racing for one device the second is refused here, before
    // its intent record names it. In this order, never the ranges lock
    // waited on under the claim (launch::lock_order).
    let (ids, device_claim) = lock_order::take(roots, &spec, &principal, &devices)?;
    let restore = decision.restore;
    steps.after("lease-taken");

    // 5. Intent record, before any resource exists.
    let state_dir_path = roots.state_dir(&spec.name);
    let kind = spec.hypervisor.kind;
    let mut resources = planned_resources(&spec, &spec_path, &rundir.path, &state_dir_path);
    resources.extend(passthrough::records(&devices));
    resources.extend(share_sources::records(&to_make));
    resources.extend(restore::record(&spec, &state_dir_path, restore.is_some()));
    let record = Intent {
        version: 1,
        name: spec.name.to_string(),
        instance_id: intent::new_instance_id()?,
        pid: std::process::id(),
        boot_id: intent::boot_id(),
        created_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        principal: IntentPrincipal {
            uid: principal.uid,
            gid: principal.gid,
            user: principal.user.clone(),
        },
        hypervisor: Some(kind),
        cgroup: own_cgroup,
        resources,
    };
    record.write(&rundir)?;
    tracing::info!(
        step = %"intent-written",
        instance = %record.instance_id,
        uid = principal.uid,
        cgroup = %cgroup_said,
        "intent recorded"
    );
    steps.after("intent-written");

    // 5b. The copy of the spec this instance runs (root 0600). Atomic, not
    //     fsynced: /run does not outlive the machine, and neither need it.
    dirs::atomic_write(&rundir, LAUNCHED_SPEC_FILE, &spec_bytes, 0o600)?;
    drop(spec_bytes);
    steps.after("spec-kept");

    // 6. Host resources: state dir (principal's, 0700), control dir, the
    //    credential mount point (root 0700 on the host side).
    let state_root = dirs::ensure_root(
        &roots.state_root,
        state_root,
        &dirs::root_want("--state-root"),
    )?;
    registry::register(&state_root, &spec.name, &principal)?;
    let (state_dir, _) = dirs::ensure(&state_root, spec.name.as_str(), &vm_want(0o700))?;
    steps.after("state-dir");
    let made = share_sources::make(&to_make, &principal, &state_dir)?;
    steps.after("share-sources-made");
    share_sources::record(&state_root, &spec.name, made)?;
    steps.after("share-sources-recorded");
    let (control, _) = dirs::ensure(
        &rundir,
        CONTROL_DIR,
        &Want {
            loose: Loose::Refuse,
            ..vm_want(0o700)
        },
    )?;
    steps.after("control-dir");
    let (_creds_mountpoint, _) =
        dirs::ensure(&rundir, CREDENTIALS_DIR, &root_want(0o700, Loose::Refuse))?;
    steps.after("credentials-dir");

    //    Taps: non-persistent fds (close-on-exec until the exec), MAC set,
    //    on their bridge, up; gone when their last fd holder dies. A macvtap
    //    (launch::macvtap) outlives its fds: cleanup deletes it. Firecracker
    //    attaches by name, which here would reach every tap without an
    //    owner: it gets a network namespace of its own holding only its
    //    taps, joined to the bridges by veths (launch::netns).
    let taps = if kind == HypervisorKind::Firecracker {
        netns::firecracker_network(&spec, &principal, &record.instance_id)?;
        Vec::new()
    } else {
        interfaces::create_taps(&spec, &record.instance_id, vhost_net, steps)?
    };
    steps.after("taps");
    passthrough::take(device_claim.as_ref(), &devices, &principal)?;
    drop(device_claim);
    steps.after("devices");

    //    The control dir holds only what this instance's hypervisor makes:
    //    stale sockets of a dead instance go (a hypervisor cannot bind over
    //    them), and firecracker's config file is written for the principal.
    control_files::remove_all_stale(&control)?;
    //    QEMU's QMP socket is bound here, by root: root's, mode 0600, so
    //    that a helper — the principal too, in the same namespace, and
    //    Landlock does not mediate connect(2) — cannot connect to the
    //    monitor; QEMU gets the bound socket as an fd and listens on it.
    let qmp = if kind == HypervisorKind::Qemu && opts.probe.is_none() {
        let path = control.path.join(QMP_SOCKET);
        Some(helpers::bind_unix(&control, &path)?)
    } else {
        None
    };
    if kind == HypervisorKind::CloudHypervisor {
        control_files::write_private(&control, CH_API_LOCK, b"", &principal)?;
    }
    if kind == HypervisorKind::Firecracker {
        let config = hypervisor::firecracker_config(&spec, &control.path);
        control_files::write_private(&control, FIRECRACKER_CONFIG, config.as_bytes(), &principal)?;
    }
    steps.after("hypervisor-config");

    // -- The host's own tools: systemd-machined. --
    //    As root, before the drop: class vm, leader this process (the
    //    hypervisor-to-be), its unit the VM's own cgroup's, or no
    //    registration (launch::machine). Cleanup ends one that outlives the
    //    instance. The call runs in a forked child: still single-threaded.
    if spec.register_with_machined && opts.probe.is_none() {
        LinuxSyscall.assert_single_threaded()?;
        machine::register(spec.name.as_str(), record.cgroup.is_some(), &cgroup_said)?;
    }
    steps.after("machine-registered");

    // 7.–11. The sandbox, the drop and the exec.
    confine_and_exec(
        &LinuxSyscall,
        steps,
        Confine {
            opts,
            spec: &spec,
            principal: &principal,
            rundir: &rundir,
            state_dir: &state_dir,
            loaded,
            lease: &lease,
            taps: &taps,
            vhost_vsock: vhost_vsock.as_ref(),
            qmp: qmp.as_ref(),
            qemu_sandbox,
            ids,
            devices: &devices,
            restore: restore.as_ref(),
        },
    )
}

/// What the sandbox and the exec take from the steps before: by now
/// everything of the VM exists on the host; from here on the launcher
/// only restricts itself.
struct Confine<'a> {
    opts: &'a Options,
    spec: &'a Spec,
    principal: &'a Principal,
    rundir: &'a Dir,
    state_dir: &'a Dir,
    loaded: Vec<creds::Loaded>,
    lease: &'a Lease,
    taps: &'a [net::Tap],
    /// `/dev/vhost-vsock`, opened by root for `vsock.backend = "vhost"`.
    vhost_vsock: Option<&'a std::os::fd::OwnedFd>,
    /// QEMU's QMP socket, bound by root (see the hypervisor-config step).
    qmp: Option<&'a std::os::fd::OwnedFd>,
    qemu_sandbox: bool,
    /// The VM's own id range (a share the guest owns), allocated at
    /// `state-dir`.
    ids: Option<registry::IdRange>,
    /// The host devices it holds (`devices`), taken at the `devices` step.
    devices: &'a devices::Plan,
    /// The snapshot to start from (`restore-checked`).
    restore: Option<&'a restore::Restore>,
}

/// Steps 7 to 11: namespaces, masks, the VM's root, /proc, credentials,
/// rlimits, the drop, Landlock, seccomp, `execve`. Every privileged call
/// goes through `sys` (see [`syscall`]): the unit tests assert their order.
fn confine_and_exec(sys: &dyn Syscall, steps: &mut Steps, c: Confine<'_>) -> Result<Infallible> {
    let Confine {
        opts,
        spec,
        principal,
        rundir,
        state_dir,
        loaded,
        lease,
        taps,
        vhost_vsock,
        qmp,
        qemu_sandbox,
        ids,
        devices,
        restore,
    } = c;
    let roots = &opts.roots;
    let kind = spec.hypervisor.kind;
    let state_dir_path = roots.state_dir(&spec.name);
    let control_path = rundir.path.join(CONTROL_DIR);
    let creds_path = rundir.path.join(CREDENTIALS_DIR);
    let api_path = control_path.join(API_SOCKET);
    let fc_config_path = control_path.join(FIRECRACKER_CONFIG);

    // 7. The guest's serial output (fd 1, also the console relay's): to
    //    no stream that reads level prefixes, to no terminal. Then
    //    namespaces, masks, the VM's root, /proc, the credential tmpfs.
    guest_output::report(&guest_output::guard(
        spec.name.as_str(),
        opts.stdout_journal,
    )?);
    sandbox::enter_private_namespaces(sys)?;
    // The credential floor, before the tmpfs exists: the new namespace's
    // root was made by the unshare, so its mount id is below the tmpfs's
    // and every copy's (instance::creds_floor). A kernel that cannot
    // state it (before 6.8) gets floor 0, every mount: never a refusal.
    let floor = sys.root_mount_id().unwrap_or_else(|e| {
        tracing::warn!("{}", creds_floor::no_mount_id(e));
        0
    });
    creds_floor::note_launch(rundir, floor)?;
    steps.after("namespace");
    sandbox::mask_root_except(sys, &roots.runtime_root, rundir)?;
    sandbox::mask_root_except(sys, &roots.state_root, state_dir)?;
    sandbox::mask_dir(sys, Path::new("/run/credentials"))?;
    steps.after("masked");
    let planned = helpers::plan(spec, &control_path);
    let vm_trees = [state_dir_path.clone(), control_path.clone()];
    let mut rules = root::rules(spec, &planned, &vm_trees, &creds_path);
    rules.extend(passthrough::landlock_rules(devices));
    let journal = root::open_journal();
    // Resolved and opened as the principal: what it cannot reach on the
    // host is not bound for it (root::as_principal).
    let (plan, sources) = root::as_principal(principal, || {
        let plan = root::plan(&rules, &vm_trees, std::slice::from_ref(&creds_path));
        let sources = root::open_sources(&plan);
        (plan, sources)
    })?;
    root::enter(sys, &roots.runtime_root, &plan, sources?, journal.as_ref())?;
    steps.after("rooted");
    // virtiofsd needs /proc/sys (see helpers::need_proc_sys): with it, QEMU
    // gets hidepid=invisible without subset=pid, like the other kinds.
    sandbox::mount_private_proc(
        sys,
        kind == HypervisorKind::Qemu && !helpers::need_proc_sys(&planned),
    )?;
    steps.after("proc");
    //    Images of `disks[].create` that do not exist yet: made under a
    //    temporary name (recorded in the intent record), formatted by mkfs
    //    as the principal in this namespace, then renamed into place.
    let images = volumes::prepare(spec, principal, &state_dir_path)?;
    steps.after("images-made");
    volumes::commit(images)?;
    steps.after("images-in-place");
    sandbox::mount_credential_tmpfs(
        sys,
        &creds_path,
        &spec.name,
        creds::tmpfs_size(&loaded),
        loaded.len(),
    )?;
    steps.after("credentials-mounted");
    let creds_dir = dirs::open_dir(&creds_path)?;
    creds::install(&creds_dir, &loaded, principal.uid, principal.gid)?;
    drop(creds_dir);
    drop(loaded);
    sandbox::remount_read_only(sys, &creds_path)?;
    steps.after("credentials-installed");

    // 8. rlimits.
    sandbox::set_rlimits(sys)?;
    passthrough::set_memlock(sys, devices, spec.memory_mib)?;
    steps.after("rlimits");

    // The seccomp filter is compiled while a failure can still be reported
    // cleanly, and installed after Landlock (the helpers get it too).
    let taps_kind = if kind == HypervisorKind::Firecracker && !spec.interfaces.is_empty() {
        seccomp::Taps::ByName
    } else {
        seccomp::Taps::Inherited
    };
    let seccomp_progs = seccomp::programs_for(taps_kind)?;
    // A USB device's QEMU: also the uevent socket libusb cannot start
    // without (seccomp::programs_for_usb); its helpers keep the rest's.
    let hypervisor_seccomp = if devices.usb.is_empty() {
        None
    } else {
        Some(seccomp::programs_for_usb(taps_kind)?)
    };

    // 8b. Helpers: forked here, in this namespace, each dropping
    //     to the principal in its own sandbox; recorded in the intent
    //     record at step 5. This process becomes the hypervisor, so their
    //     death signal follows it.
    let started = if planned.is_empty() {
        Vec::new()
    } else {
        let control = dirs::open_dir(&control_path)?;
        let mut helper_seccomp = seccomp_progs.clone();
        // The virtiofsd of a share the guest owns: its own role's filter
        // (`launch/helpers/owned.rs`).
        let mut owned_seccomp = match ids {
            Some(_) => {
                seccomp::programs_as(seccomp::Taps::Inherited, seccomp::Role::OwnedVirtiofsd)?
            }
            None => Vec::new(),
        };
        if cfg!(feature = "fault-injection") && opts.helper_openat2_enosys {
            tracing::warn!("fault injection: openat2 answers ENOSYS in every helper");
            helper_seccomp.push(seccomp::enosys(libc::SYS_openat2)?);
            owned_seccomp.push(seccomp::enosys(libc::SYS_openat2)?);
        }
        let self_sandboxing = if planned
            .iter()
            .any(|h| h.shape().filter == helpers::Filter::SelfSandboxing)
        {
            seccomp::self_sandboxing_programs()?
        } else {
            Vec::new()
        };
        helpers::start_all(
            &planned,
            &helpers::Context {
                sys,
                principal,
                lease,
                control: &control,
                vm_trees: &vm_trees,
                landlock: spec.landlock.mode,
                seccomp: &helper_seccomp,
                seccomp_self_sandboxing: &self_sandboxing,
                owned: ids.map(|ids| helpers::Owned {
                    ids,
                    seccomp: &owned_seccomp,
                }),
            },
        )?
    };
    // -- The host's own tools: the console relay (launch::console), forked
    //    like a helper; its socket bound by root. --
    let relay = if spec.console && opts.probe.is_none() {
        let control = dirs::open_dir(&control_path)?;
        let r = console::start(
            &helpers::Context {
                sys,
                principal,
                lease,
                control: &control,
                vm_trees: &[],
                landlock: spec.landlock.mode,
                seccomp: &seccomp_progs,
                // The relay sandboxes nothing itself: the hypervisor's filters.
                seccomp_self_sandboxing: &seccomp_progs,
                owned: None,
            },
            &control,
        )?;
        tracing::info!(step = %"helpers-started", helper = "console relay", pid = r.pid.as_raw(), "helper started");
        Some(r)
    } else {
        None
    };
    for (h, s) in planned.iter().zip(&started) {
        tracing::info!(
            step = %"helpers-started",
            helper = %h.name(),
            pid = s.pid.as_raw(),
            ms = s.took.as_secs_f64() * 1000.0,
            "helper started"
        );
    }
    steps.after("helpers-started");
    // The hypervisor's ends of the helpers' socket pairs: passt's is the
    // user network interface's backend.
    let user_net_fd = planned
        .iter()
        .zip(&started)
        .find(|(h, _)| h.kind == helpers::HelperKind::Passt)
        .and_then(|(_, s)| s.hypervisor_end.as_ref())
        .map(AsRawFd::as_raw_fd);
    // cloud-hypervisor's event monitor, which reboot-watch reads.
    let event_monitor_fd = planned
        .iter()
        .zip(&started)
        .find(|(h, _)| h.kind == helpers::HelperKind::RebootWatch)
        .and_then(|(_, s)| s.hypervisor_end.as_ref())
        .map(AsRawFd::as_raw_fd);
    if event_monitor_fd.is_some() {
        // reboot-watch ends cloud-hypervisor with this signal, by its
        // default action: neither an ignored disposition (`nohup`) nor a
        // blocked one may cross the `execve` (config::reboot).
        exec::default_reboot_signal().sys("sigaction(SIGHUP)", &control_path)?;
    }

    // 9. Drop to the principal and prove it.
    sandbox::drop_privileges_with(sys, principal)?;
    steps.after("privileges-dropped");

    // 10. Landlock.
    let mut policy = landlock::policy(spec, &state_dir_path, &control_path, &creds_path);
    // The helpers' death signal comes from this process once it is the
    // hypervisor: a signal-scoped domain would block it (see the field).
    policy.signals_unscoped = !planned.is_empty() || relay.is_some();
    // The drop just set no_new_privs and its self-check saw it set.
    policy.no_new_privs_set = true;
    passthrough::extend_policy(&mut policy, devices);
    let outcome = sys.landlock_restrict(&policy, spec.landlock.mode)?;
    tracing::info!(step = %"landlock", ?outcome, "landlock applied");
    steps.after("landlock");

    // 10b. seccomp: no namespace, no socket but AF_UNIX, no keyring, no
    //      other process's memory, no io_uring, no tap fd made persistent,
    //      re-owned or re-MACed (see launch::seccomp).
    seccomp::apply(sys, hypervisor_seccomp.as_ref().unwrap_or(&seccomp_progs))?;
    steps.after("seccomp");

    // 11. execve: the lease fd is inherited, everything else is closed.
    let argv: Vec<String> = match &opts.probe {
        Some(cmd) => cmd.clone(),
        None => {
            let seccomp = qemu_sandbox;
            hypervisor::argv(
                spec,
                &Layout {
                    qmp_fd: qmp.map_or(-1, AsRawFd::as_raw_fd),
                    credentials_dir: creds_path.clone(),
                    api_socket: api_path.clone(),
                    firecracker_config: fc_config_path.clone(),
                    tap_fds: taps.iter().map(|t| t.fd.as_raw_fd()).collect(),
                    tap_queue_fds: taps
                        .iter()
                        .map(|t| t.queues.iter().map(AsRawFd::as_raw_fd).collect())
                        .collect(),
                    vhost_net_fds: taps
                        .iter()
                        .map(|t| t.vhost.iter().map(AsRawFd::as_raw_fd).collect())
                        .collect(),
                    control_dir: control_path.clone(),
                    vhost_vsock_fd: vhost_vsock.map(AsRawFd::as_raw_fd),
                    user_net_fd,
                    event_monitor_fd,
                    usb_nodes: passthrough::usb_nodes(devices),
                },
                seccomp,
            )
        }
    };
    let argv = restore::argv(spec, argv, restore, opts.probe.is_some(), &state_dir_path);
    // The console relay's end of the serial pair is the hypervisor's
    // stdin and stdout (its serial is stdio); stderr stays the journal.
    if let Some(r) = &relay {
        for fd in [0, 1] {
            // SAFETY: dup2(2) on two integers: the relay's end (open, ours)
            // replaces stdin/stdout, which nothing in this process reads
            // or writes through an owned handle.
            if unsafe { libc::dup2(r.hypervisor_end.as_raw_fd(), fd) } < 0 {
                return Err(nix::errno::Errno::last())
                    .sys("dup2 of the console relay's socket", &control_path)
                    .map_err(Into::into);
            }
        }
    }
    // The probe command inherits the helpers' ends too: the helpers live
    // as long as it does, as they would beside the hypervisor.
    let inherit: Vec<_> = vhost_vsock
        .into_iter()
        .chain(qmp)
        .chain(started.iter().filter_map(|s| s.hypervisor_end.as_ref()))
        .chain(restore.iter().flat_map(|r| r.files.iter().map(|(_, f)| f)))
        .collect();
    exec::exec(sys, &argv, lease, taps, &inherit, principal, state_dir)
}
