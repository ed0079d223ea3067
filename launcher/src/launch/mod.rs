//! The launch, in order (ARCHITECTURE.md "The launch, in order"). One linear
//! function that reads like the step list; each step that creates something
//! is in the intent record before it exists.

pub mod creds;
pub mod helpers;
pub mod issue12;
pub mod landlock;
pub mod sandbox;
pub mod seccomp;
pub mod syscall;
pub mod volumes;

use std::convert::Infallible;
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;

use netlink_packet_route::link::InfoKind;

use crate::config::files::Distrust;
use crate::config::names::{ArgNameError, VmName};
use crate::config::paths::{
    RootError, Roots, API_SOCKET, CH_API_LOCK, CONTROL_DIR, CREDENTIALS_DIR, FIRECRACKER_CONFIG,
    LAUNCHED_SPEC_FILE, LEASE_FILE, QMP_SOCKET, VSOCK_SOCKET,
};
use crate::config::spec::{CredentialSource, HypervisorKind, SandboxMode, Spec, SpecError};
use crate::host::cgroup;
use crate::host::dirs::{self, Dir, DirError, Loose, Want};
use crate::host::net::{self, NetError};
use crate::host::sys::{IoContext, IoError, SysContext, SysError};
use crate::host::trust::{self, Policy};
use crate::hypervisor::{self, Layout, SandboxProbe};
use crate::identity::principal::{self, Principal, PrincipalError};
use crate::identity::registry::{self, RegistryError};
use crate::instance::intent::{self, Intent, IntentError, IntentPrincipal, Resource};
use crate::instance::lease::{self, Lease, LeaseError, LeaseState};
use crate::instance::liveness::{Probe, Verdict, Via};
use crate::launch::creds::CredentialError;
use crate::launch::helpers::HelperError;
use crate::launch::landlock::LandlockError;
use crate::launch::sandbox::SandboxError;
use crate::launch::seccomp::SeccompError;
use crate::launch::syscall::{LinuxSyscall, Syscall};
use crate::launch::volumes::VolumeError;
use crate::profile;

/// Step names, in order. `VMWARDEN_FAULT_AFTER=<step>` (builds with the
/// `fault-injection` feature) SIGKILLs the launcher right after that step.
pub const STEPS: &[&str] = &[
    "sanitized",
    "spec-loaded",
    "principal-resolved",
    "runtime-dir",
    "lease-taken",
    "intent-written",
    "spec-kept",
    "state-dir",
    "control-dir",
    "credentials-dir",
    "taps",
    "hypervisor-config",
    "namespace",
    "masked",
    "proc",
    "images-made",
    "images-in-place",
    "credentials-mounted",
    "credentials-installed",
    "rlimits",
    "helpers-started",
    "privileges-dropped",
    "landlock",
    "seccomp",
];

/// What an error after the last of [`STEPS`] is reported at: preparing and
/// calling `execve`. Not a fault-injection point (after it the launcher is
/// the hypervisor), so `--list-steps` does not print it.
pub const EXEC_STEP: &str = "exec";

/// A failed launch: the step it failed in (one of [`STEPS`], or
/// [`EXEC_STEP`]) and why. The launcher prints it as
/// `vmwarden-launch: error at step "STEP": …`.
#[derive(Debug, thiserror::Error)]
#[error("at step {step:?}: {error}")]
pub struct LaunchError {
    pub step: &'static str,
    #[source]
    pub error: Box<StepError>,
}

impl LaunchError {
    pub fn at(step: &'static str, error: impl Into<StepError>) -> LaunchError {
        LaunchError {
            step,
            error: Box::new(error.into()),
        }
    }

    /// A refusal of the spec, the principal, a path, a credential or the
    /// host (`EX_CONFIG`: starting again will not help).
    pub fn is_refusal(&self) -> bool {
        self.error.is_refusal()
    }
}

/// Why a launch step failed: the error of the part the step called, or one
/// of the launch's own refusals.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Root(#[from] RootError),
    /// A command-line argument its name type refused.
    #[error(transparent)]
    Name(#[from] ArgNameError),
    /// A command-line refusal (`--probe` without a command, …).
    #[error("{0}")]
    Usage(&'static str),
    #[error("argument {0:?}: contains a NUL byte")]
    NulInArgument(String),
    #[error("program {0}: contains a NUL byte")]
    NulInProgram(PathBuf),
    #[error("VM {name} is already running (its lease {lease} is held); nothing was changed")]
    AlreadyRunning { name: String, lease: PathBuf },
    /// The probe under the lease found the VM live or ambiguous.
    #[error("VM {name}: liveness is ambiguous ({}); refusing to start a second instance", .verdict.detail())]
    Ambiguous { name: String, verdict: Verdict },
    #[error(transparent)]
    Principal(#[from] PrincipalError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Dir(#[from] DirError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error(transparent)]
    Intent(#[from] IntentError),
    #[error(transparent)]
    Credential(#[from] CredentialError),
    #[error(transparent)]
    Net(#[from] NetError),
    #[error("network interface {tap}: RTM_GETLINK: the tap vanished right after TUNSETIFF")]
    TapVanished { tap: String },
    /// `field` is the spec field naming the bridge (`interfaces[0].bridge`).
    #[error("network interface {field} {bridge:?}: RTM_GETLINK: the bridge disappeared during the launch")]
    BridgeGone { field: String, bridge: String },
    #[error("network interface {field} {bridge:?}: RTM_GETLINK: is no longer a bridge (its kind is {kind:?})")]
    NoLongerABridge {
        field: String,
        bridge: String,
        kind: Option<InfoKind>,
    },
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error(transparent)]
    Landlock(#[from] LandlockError),
    #[error(transparent)]
    Seccomp(#[from] SeccompError),
    /// Boxed: its mkfs failure carries the program's output.
    #[error(transparent)]
    Volume(Box<VolumeError>),
    /// `vsock.backend = "vhost"` and the kernel's device cannot be opened.
    #[error("{path}: cannot open it for `vsock.backend` = \"vhost\" ({errno}){hint}; nothing was created")]
    VhostVsock {
        path: PathBuf,
        #[source]
        errno: Errno,
        hint: &'static str,
    },
    #[error(transparent)]
    Helper(#[from] HelperError),
    #[error(transparent)]
    Sys(#[from] SysError),
    #[error(transparent)]
    Io(#[from] IoError),
    /// A file the spec names could be changed by someone other than root:
    /// nothing a VM or a local user can write is executed or trusted as
    /// input by root.
    #[error("spec {spec}: field `{field}`: {cause}")]
    Untrusted {
        spec: PathBuf,
        field: &'static str,
        #[source]
        cause: Distrust,
    },
    /// The spec itself could be changed by someone other than root.
    #[error("spec {path} cannot be trusted: {cause}")]
    UntrustedSpec {
        path: PathBuf,
        #[source]
        cause: Distrust,
    },
    /// Whether QEMU has `-sandbox`, or cloud-hypervisor `fw_cfg`, could not
    /// be told (it could not be run, did not exit, or was killed).
    #[error("hypervisor {path}: cannot tell whether it supports {what}: {reason}")]
    HypervisorProbe {
        path: PathBuf,
        what: &'static str,
        reason: String,
    },
    #[error("exec {path}: {errno}")]
    Exec {
        path: PathBuf,
        #[source]
        errno: Errno,
    },
}

impl StepError {
    /// See [`LaunchError::is_refusal`].
    pub fn is_refusal(&self) -> bool {
        match self {
            StepError::Spec(_)
            | StepError::Root(_)
            | StepError::Name(_)
            | StepError::Usage(_)
            | StepError::NulInArgument(_)
            | StepError::NulInProgram(_)
            | StepError::Untrusted { .. }
            | StepError::UntrustedSpec { .. }
            | StepError::Principal(_) => true,
            StepError::Registry(e) => e.is_refusal(),
            StepError::Dir(e) => e.is_refusal(),
            StepError::Lease(e) => e.is_refusal(),
            StepError::Intent(e) => e.is_refusal(),
            StepError::Credential(e) => e.is_refusal(),
            StepError::Net(e) => e.is_refusal(),
            StepError::Sandbox(e) => e.is_refusal(),
            StepError::Volume(e) => e.is_refusal(),
            StepError::VhostVsock { errno, .. } => {
                matches!(errno, Errno::ENOENT | Errno::ENODEV | Errno::ENXIO)
            }
            StepError::AlreadyRunning { .. }
            | StepError::Ambiguous { .. }
            | StepError::TapVanished { .. }
            | StepError::BridgeGone { .. }
            | StepError::NoLongerABridge { .. }
            | StepError::Landlock(_)
            | StepError::Seccomp(_)
            | StepError::Helper(_)
            | StepError::HypervisorProbe { .. }
            | StepError::Sys(_)
            | StepError::Io(_)
            | StepError::Exec { .. } => false,
        }
    }
}

impl From<VolumeError> for StepError {
    fn from(e: VolumeError) -> Self {
        StepError::Volume(Box::new(e))
    }
}

type Result<T, E = StepError> = std::result::Result<T, E>;

/// Environment the hypervisor (or probe command) gets: nothing but a PATH.
pub const EXEC_PATH: &str = "PATH=/run/current-system/sw/bin:/usr/local/bin:/usr/bin:/bin";

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
}

/// The launch's way through [`STEPS`]: the step it is in (what an error is
/// reported at) and, with the `fault-injection` feature, where to SIGKILL.
struct Steps {
    /// Index in [`STEPS`] of the step in progress.
    current: usize,
    fault_after: Option<String>,
}

impl Steps {
    fn new(fault_after: Option<String>) -> Steps {
        Steps {
            current: 0,
            fault_after,
        }
    }

    /// The step in progress: the first not yet done, [`EXEC_STEP`] once all are.
    fn current(&self) -> &'static str {
        STEPS.get(self.current).copied().unwrap_or(EXEC_STEP)
    }

    /// `step` is done; the launch moves on to the next one.
    fn after(&mut self, step: &str) {
        debug_assert_eq!(self.current(), step, "steps out of order");
        profile::mark(self.current());
        self.current += 1;
        tracing::debug!(step = %step, "launch step done");
        if self.current == STEPS.len() {
            profile::report();
        }
        #[cfg(feature = "fault-injection")]
        if self.fault_after.as_deref() == Some(step) {
            tracing::warn!(step = %step, "fault injection: SIGKILL after step");
            let _ =
                nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGKILL);
        }
        #[cfg(not(feature = "fault-injection"))]
        let _ = &self.fault_after;
    }
}

fn root_want(mode: u32, loose: Loose) -> Want {
    Want {
        uid: 0,
        gid: 0,
        mode,
        loose,
    }
}

/// Spec paths must not point into another VM's runtime or state directory:
/// those are masked inside the sandbox (and are not this VM's).
fn check_spec_paths_scoped(spec: &Spec, spec_path: &Path, roots: &Roots) -> Result<(), SpecError> {
    let own_state = roots.state_dir(&spec.name);
    let own_run = roots.runtime_dir(&spec.name);
    let mut fields: Vec<(String, &Path)> = vec![
        ("kernel".into(), &spec.kernel),
        ("hypervisor.binary".into(), &spec.hypervisor.binary),
    ];
    for (i, c) in spec.credentials.iter().enumerate() {
        if let CredentialSource::Path(p) = &c.source {
            fields.push((format!("credentials[{i}].source.path"), p));
        }
    }
    if let Some(i) = &spec.initrd {
        fields.push(("initrd".into(), i));
    }
    for (i, d) in spec.disks.iter().enumerate() {
        fields.push((format!("disks[{i}].path"), &d.path));
    }
    for (i, p) in spec.landlock.read.iter().enumerate() {
        fields.push((format!("landlock.read[{i}]"), p));
    }
    for (i, p) in spec.landlock.write.iter().enumerate() {
        fields.push((format!("landlock.write[{i}]"), p));
    }
    for (field, p) in fields {
        // What root trusts (the hypervisor binary, kernel and initrd it
        // hands over) must not lie where any VM, this one included, can
        // write: vmwarden's state and runtime roots hold only VM dirs.
        let executed = matches!(field.as_str(), "hypervisor.binary" | "kernel" | "initrd");
        if executed && (p.starts_with(&roots.state_root) || p.starts_with(&roots.runtime_root)) {
            return Err(SpecError::Invalid {
                path: spec_path.to_path_buf(),
                field,
                reason: format!(
                    "{} is inside vmwarden's state or runtime root ({} or {}), where VMs write; \
                     nothing a VM can write is executed or trusted by root",
                    p.display(),
                    roots.state_root.display(),
                    roots.runtime_root.display()
                ),
            });
        }
        let foreign = (p.starts_with(&roots.state_root) && !p.starts_with(&own_state))
            || (p.starts_with(&roots.runtime_root) && !p.starts_with(&own_run));
        if foreign {
            return Err(SpecError::Invalid {
                path: spec_path.to_path_buf(),
                field,
                reason: format!(
                    "{} is inside another VM's directory (only {} and {} belong to this VM)",
                    p.display(),
                    own_state.display(),
                    own_run.display()
                ),
            });
        }
    }
    Ok(())
}

/// The spec, the hypervisor binary, kernel and initrd: every component from `/`
/// owned by root and writable by root only (symlinks followed one
/// component at a time, each directory they lead through checked; see
/// `host::trust`), and not inside vmwarden's roots once resolved.
fn check_trusted_files(
    spec: &Spec,
    spec_path: &Path,
    spec_walk: std::result::Result<(), Distrust>,
    roots: &Roots,
    walker: &mut trust::Walker,
) -> Result<()> {
    // The spec itself decides what root runs and reads: it must be root's
    // alone too (on NixOS a chain of links into the Nix store, which
    // passes). `spec_walk`: its walk, made before it was read.
    spec_walk.map_err(|cause| StepError::UntrustedSpec {
        path: spec_path.to_path_buf(),
        cause,
    })?;
    let mut fields: Vec<(&'static str, &Path)> = vec![
        ("hypervisor.binary", &spec.hypervisor.binary),
        ("kernel", &spec.kernel),
    ];
    if let Some(i) = &spec.initrd {
        fields.push(("initrd", i));
    }
    // The helpers root starts for the VM (issue 12) are trusted like the
    // hypervisor: root's alone.
    if let Some(v) = &spec.virtiofsd {
        fields.push(("virtiofsd.binary", &v.binary));
    }
    if let Some(b) = spec.vsock.as_ref().and_then(|v| v.binary.as_ref()) {
        fields.push(("vsock.binary", b));
    }
    for (field, p) in fields {
        let w = walker
            .regular_file(p, Policy::Executable)
            .map_err(|cause| StepError::Untrusted {
                spec: spec_path.to_path_buf(),
                field,
                cause,
            })?;
        if w.resolved.starts_with(&roots.state_root) || w.resolved.starts_with(&roots.runtime_root)
        {
            return Err(StepError::Spec(SpecError::Invalid {
                path: spec_path.to_path_buf(),
                field: field.to_string(),
                reason: format!(
                    "{} resolves to {}, inside vmwarden's state or runtime root, where VMs write",
                    p.display(),
                    w.resolved.display()
                ),
            }));
        }
    }
    Ok(())
}

/// How long the `-sandbox` probe of a QEMU binary may take.
const SANDBOX_PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether QEMU gets `-sandbox`: probed once, before anything is created,
/// so a QEMU without seccomp is refused with the host untouched unless the
/// spec says `hypervisor.seccomp = "best-effort"`.
fn qemu_sandbox(spec: &Spec, spec_path: &Path, principal: &Principal) -> Result<bool> {
    if spec.hypervisor.kind != HypervisorKind::Qemu {
        return Ok(false);
    }
    let bin = &spec.hypervisor.binary;
    // A QEMU that links libseccomp was built with -sandbox (QEMU links it
    // only then): read from its ELF headers in microseconds. Anything else
    // (a static build, a wrapper script) is asked, which means starting it
    // (~40 ms). QEMU older than 3.1 with seccomp lacks `resourcecontrol`
    // and would then fail at its own start, naming the option.
    if hypervisor::elf::links_libseccomp(bin) == Some(true) {
        return Ok(true);
    }
    match hypervisor::qemu_sandbox_probe(bin, principal.uid, principal.gid, SANDBOX_PROBE_TIMEOUT) {
        Ok(SandboxProbe::Supported) => Ok(true),
        Ok(SandboxProbe::Unsupported(why)) => match spec.hypervisor.seccomp {
            SandboxMode::Required => Err(StepError::Spec(SpecError::Invalid {
                path: spec_path.to_path_buf(),
                field: "hypervisor.binary".into(),
                reason: format!(
                    "{} refuses `-sandbox {}` ({why}): QEMU built without seccomp support, or too \
                     old for these options. Use a QEMU with seccomp, or set hypervisor.seccomp = \
                     \"best-effort\" to run it without its own filter",
                    bin.display(),
                    hypervisor::QEMU_SANDBOX
                ),
            })),
            SandboxMode::BestEffort => {
                tracing::warn!(binary = %bin.display(), %why, "QEMU refuses -sandbox; running without its own seccomp filter (hypervisor.seccomp = \"best-effort\")");
                Ok(false)
            }
        },
        Err(reason) => Err(StepError::HypervisorProbe {
            path: bin.clone(),
            what: "its own sandbox",
            reason,
        }),
    }
}

/// cloud-hypervisor with credentials: they go in as fw_cfg files, which
/// only a binary built with the `fw_cfg` feature has. Asked once, before
/// anything is created, so a binary without it is refused with the host
/// untouched. The tmpfs paths go into `--fw-cfg-config items=[…]`, where
/// ',' ':' '[' ']' would split the list: a runtime root containing one is
/// refused too.
fn cloud_hypervisor_credentials(
    spec: &Spec,
    spec_path: &Path,
    principal: &Principal,
    roots: &Roots,
) -> Result<()> {
    if spec.hypervisor.kind != HypervisorKind::CloudHypervisor || spec.credentials.is_empty() {
        return Ok(());
    }
    let dir = roots.credentials_dir(&spec.name);
    if dir
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .any(|b| b",:[]".contains(b))
    {
        return Err(StepError::Spec(SpecError::Invalid {
            path: spec_path.to_path_buf(),
            field: "credentials".into(),
            reason: format!(
                "cannot reach cloud-hypervisor: their directory {} contains one of ',' ':' '[' ']', \
                 which split its --fw-cfg-config list; use a runtime root without them",
                dir.display()
            ),
        }));
    }
    let bin = &spec.hypervisor.binary;
    match hypervisor::cloud_hypervisor_has_fw_cfg(
        bin,
        principal.uid,
        principal.gid,
        SANDBOX_PROBE_TIMEOUT,
    ) {
        Ok(true) => Ok(()),
        Ok(false) => Err(StepError::Spec(SpecError::Invalid {
            path: spec_path.to_path_buf(),
            field: "credentials".into(),
            reason: format!(
                "need cloud-hypervisor's `fw_cfg` feature, but {} was built without it (its --help has no {}); \
                 build it with `--features fw_cfg` (the NixOS module does when a VM has credentials), or drop the credentials",
                bin.display(),
                hypervisor::CH_FW_CFG_OPTION
            ),
        })),
        Err(reason) => Err(StepError::HypervisorProbe {
            path: bin.clone(),
            what: "fw_cfg (credentials)",
            reason,
        }),
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
    check_spec_paths_scoped(&spec, &spec_path, roots)?;
    issue12::check_roots(&spec, &spec_path, roots)?;
    let loaded = creds::read_all(&spec, opts.credentials_directory.as_deref(), &mut walker)?;
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
        &root_want(0o755, Loose::Tighten),
    )?;
    drop(rt_parent);
    dirs::preflight_in(
        runtime_root.as_ref(),
        spec.name.as_str(),
        &root_want(0o755, Loose::Refuse),
    )?;
    preflight_interfaces(&spec, &spec_path, roots)?;
    // What root hands to the hypervisor (binary, kernel, initrd) must be
    // root's alone; then the binary is asked about its sandbox.
    check_trusted_files(&spec, &spec_path, spec_walk, roots, &mut walker)?;
    drop(walker);
    let qemu_sandbox = qemu_sandbox(&spec, &spec_path, &principal)?;
    cloud_hypervisor_credentials(&spec, &spec_path, &principal, roots)?;
    issue12::check_principal(&spec, &spec_path, &principal)?;
    volumes::preflight(&spec, &spec_path, &principal, &roots.state_dir(&spec.name))?;
    // The kernel's vsock device, opened by root before anything is made
    // (a host without it refuses here and changes nothing); its fd goes to
    // QEMU like a tap's, the principal never opens the node.
    let vhost_vsock = open_vhost_vsock(&spec)?;
    steps.after("principal-resolved");

    // 4. Runtime root and this VM's runtime dir, then the lease.
    let runtime_root = dirs::ensure_root(
        &roots.runtime_root,
        runtime_root,
        &root_want(0o755, Loose::Tighten),
    )?;
    let (rundir, _) = dirs::ensure(
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
    // Under the lease, the rest of the probe, by the uid: a principal is
    // dedicated to one VM, so any process running as it now — a previous
    // instance's (they all run as the uid), or anything else's — refuses
    // the launch. (The credentials of each process, from a pidfd; kernel
    // threads and other users' processes are skipped unread.) The launcher's own cgroup, when
    // it holds nobody else or is this VM's unit's (`PREFIX@NAME.service`,
    // where `ExecStartPost=`'s wait-ready runs beside it), will hold this
    // instance and everything it starts: the intent record names it, and
    // stop, status, cleanup and reap ask it instead of /proc.
    let own_cgroup = cgroup::own_dedicated(spec.name.as_str());
    if let Err(why) = &own_cgroup {
        tracing::debug!(%why, "no dedicated cgroup: liveness will scan /proc");
    }
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
    steps.after("lease-taken");

    // 5. Intent record, before any resource exists.
    let state_dir_path = roots.state_dir(&spec.name);
    let kind = spec.hypervisor.kind;
    let resources = planned_resources(&spec, &spec_path, &rundir.path, &state_dir_path);
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
        cgroup: own_cgroup.ok(),
        resources,
    };
    record.write(&rundir)?;
    tracing::info!(
        step = %"intent-written",
        instance = %record.instance_id,
        uid = principal.uid,
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
        &root_want(0o755, Loose::Tighten),
    )?;
    registry::register(&state_root, &spec.name, &principal)?;
    let (state_dir, _) = dirs::ensure(&state_root, spec.name.as_str(), &vm_want(0o700))?;
    steps.after("state-dir");
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

    //    Taps: created here as non-persistent fds (close-on-exec until the
    //    exec below), MAC set, attached to their bridge, up. From now on the
    //    kernel deletes each tap when its last fd holder dies.
    let taps = if kind == HypervisorKind::Firecracker {
        // Persistent and the principal's: the fds close here, firecracker
        // attaches by name; cleanup deletes them (intent record).
        drop(create_taps(&spec, Some(&principal))?);
        Vec::new()
    } else {
        create_taps(&spec, None)?
    };
    steps.after("taps");

    //    The control dir holds only what this instance's hypervisor makes:
    //    stale sockets of a dead instance go (a hypervisor cannot bind over
    //    them), and firecracker's config file is written for the principal.
    for stale in [
        QMP_SOCKET,
        API_SOCKET,
        CH_API_LOCK,
        FIRECRACKER_CONFIG,
        VSOCK_SOCKET,
    ] {
        remove_stale(&control, stale)?;
    }
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
        write_private(&control, CH_API_LOCK, b"", &principal)?;
    }
    if kind == HypervisorKind::Firecracker {
        write_private(
            &control,
            FIRECRACKER_CONFIG,
            hypervisor::firecracker_config(&spec, &control.path).as_bytes(),
            &principal,
        )?;
    }
    steps.after("hypervisor-config");

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
}

/// Steps 7 to 11: namespaces, masks, /proc, the credential tmpfs,
/// rlimits, the privilege drop, Landlock, seccomp, `execve`. Every
/// privileged call goes through `sys` (see [`syscall`]), so the unit tests
/// assert their order without root.
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
    } = c;
    let roots = &opts.roots;
    let kind = spec.hypervisor.kind;
    let state_dir_path = roots.state_dir(&spec.name);
    let control_path = rundir.path.join(CONTROL_DIR);
    let creds_path = rundir.path.join(CREDENTIALS_DIR);
    let api_path = control_path.join(API_SOCKET);
    let fc_config_path = control_path.join(FIRECRACKER_CONFIG);

    // 7. Private mount and IPC namespaces, masks, a private /proc, the
    //    credential tmpfs.
    sandbox::enter_private_namespaces(sys)?;
    steps.after("namespace");
    sandbox::mask_root_except(sys, &roots.runtime_root, rundir)?;
    sandbox::mask_root_except(sys, &roots.state_root, state_dir)?;
    sandbox::mask_dir(sys, Path::new("/run/credentials"))?;
    steps.after("masked");
    // virtiofsd needs /proc/sys (see helpers::need_proc_sys): with it, QEMU
    // gets hidepid=invisible without subset=pid, like the other kinds.
    let planned = helpers::plan(spec, &control_path);
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
    steps.after("rlimits");

    // The seccomp filter is compiled while a failure can still be reported
    // cleanly, and installed after Landlock (the helpers get it too).
    let seccomp_progs = seccomp::programs_for(
        if kind == HypervisorKind::Firecracker && !spec.interfaces.is_empty() {
            seccomp::Taps::ByName
        } else {
            seccomp::Taps::Inherited
        },
    )?;

    // 8b. Helpers (issue 12): forked here, in this namespace, each dropping
    //     to the principal in its own sandbox; recorded in the intent
    //     record at step 5. This process becomes the hypervisor, so their
    //     death signal follows it.
    let started = if planned.is_empty() {
        Vec::new()
    } else {
        let control = dirs::open_dir(&control_path)?;
        let vm_trees = [state_dir_path.clone(), control_path.clone()];
        let mut helper_seccomp = seccomp_progs.clone();
        if cfg!(feature = "fault-injection") && opts.helper_openat2_enosys {
            tracing::warn!("fault injection: openat2 answers ENOSYS in every helper");
            helper_seccomp.push(seccomp::enosys(libc::SYS_openat2)?);
        }
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
            },
        )?
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

    // 9. Drop to the principal and prove it.
    sandbox::drop_privileges_with(sys, principal)?;
    steps.after("privileges-dropped");

    // 10. Landlock.
    let mut policy = landlock::policy(spec, &state_dir_path, &control_path, &creds_path);
    // The helpers' death signal comes from this process once it is the
    // hypervisor: a signal-scoped domain would block it (see the field).
    policy.signals_unscoped = !planned.is_empty();
    // The drop just set no_new_privs and its self-check saw it set.
    policy.no_new_privs_set = true;
    let outcome = sys.landlock_restrict(&policy, spec.landlock.mode)?;
    tracing::info!(step = %"landlock", ?outcome, "landlock applied");
    steps.after("landlock");

    // 10b. seccomp: no namespace, no socket but AF_UNIX, no keyring, no
    //      other process's memory, no io_uring, no tap fd made persistent,
    //      re-owned or re-MACed (see launch::seccomp).
    seccomp::apply(sys, &seccomp_progs)?;
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
                    control_dir: control_path.clone(),
                    vhost_vsock_fd: vhost_vsock.map(AsRawFd::as_raw_fd),
                },
                seccomp,
            )
        }
    };
    let inherit: Vec<_> = vhost_vsock.into_iter().chain(qmp).collect();
    exec(sys, &argv, lease, taps, &inherit, principal, state_dir)
}

/// The kernel's vhost-vsock device (`vsock.backend = "vhost"`), opened
/// read-write and close-on-exec (cleared for the hypervisor only, in
/// [`exec`]).
pub const VHOST_VSOCK: &str = "/dev/vhost-vsock";

fn open_vhost_vsock(spec: &Spec) -> Result<Option<std::os::fd::OwnedFd>> {
    use crate::config::spec::VsockBackend;
    use nix::fcntl::{open, OFlag};
    use nix::sys::stat::Mode;
    if !spec
        .vsock
        .as_ref()
        .is_some_and(|v| v.backend == VsockBackend::Vhost)
    {
        return Ok(None);
    }
    match open(
        VHOST_VSOCK,
        OFlag::O_RDWR | OFlag::O_CLOEXEC | OFlag::O_NOCTTY,
        Mode::empty(),
    ) {
        Ok(fd) => Ok(Some(fd)),
        Err(errno) => Err(StepError::VhostVsock {
            path: PathBuf::from(VHOST_VSOCK),
            errno,
            hint: match errno {
                Errno::ENOENT | Errno::ENODEV | Errno::ENXIO => {
                    ": the kernel has no vhost-vsock here (modprobe vhost_vsock), or use backend \"user\""
                }
                Errno::EPERM | Errno::EACCES => {
                    ": the unit must allow the device (DeviceAllow=/dev/vhost-vsock rw, which `vmwarden render-unit --dropin` writes)"
                }
                _ => "",
            },
        }),
    }
}

/// Before anything is created: every bridge exists and is a bridge, no tap
/// name is taken on this host or claimed by another configured VM.
fn preflight_interfaces(spec: &Spec, spec_path: &Path, roots: &Roots) -> Result<()> {
    if spec.interfaces.is_empty() {
        return Ok(());
    }
    let bad = |field: String, reason: String| {
        StepError::Spec(SpecError::Invalid {
            path: spec_path.to_path_buf(),
            field,
            reason,
        })
    };
    let others = principal::configured_specs_except(roots, Some(&spec.name));
    let mut rtnl = net::Rtnl::open()?;
    for (i, n) in spec.interfaces.iter().enumerate() {
        for (other, _, other_spec) in &others {
            if let Some(o) = other_spec {
                if o.interfaces.iter().any(|x| x.tap == n.tap) {
                    return Err(bad(
                        format!("interfaces[{i}].tap"),
                        format!("{:?} is also a tap of VM {other:?}; tap names must be unique across VMs", n.tap),
                    ));
                }
            }
        }
        if rtnl.link(n.tap.as_str())?.is_some() {
            return Err(bad(
                format!("interfaces[{i}].tap"),
                format!(
                    "{:?} already exists on this host (a leftover of a stopped VM is deleted by `vmwarden reap --apply`)",
                    n.tap
                ),
            ));
        }
        if let Some(b) = &n.bridge {
            match rtnl.link(b.as_str())? {
                None => {
                    return Err(bad(
                        format!("interfaces[{i}].bridge"),
                        format!("{b:?} does not exist; create the bridge first (vmwarden attaches taps to it, it does not make bridges)"),
                    ))
                }
                Some(l) if l.kind != Some(InfoKind::Bridge) => {
                    return Err(bad(
                        format!("interfaces[{i}].bridge"),
                        format!("{b:?} is not a bridge (its kind is {:?})", l.kind),
                    ))
                }
                Some(_) => {}
            }
        }
    }
    Ok(())
}

/// Create, address, attach and raise every tap of the spec.
/// Firecracker's taps (it opens them by name) are then made persistent and
/// owned by the principal (`owner`); their fds are not handed on.
fn create_taps(spec: &Spec, owner: Option<&Principal>) -> Result<Vec<net::Tap>> {
    if spec.interfaces.is_empty() {
        return Ok(Vec::new());
    }
    let mut rtnl = net::Rtnl::open()?;
    let mut taps = Vec::new();
    for (i, n) in spec.interfaces.iter().enumerate() {
        let tap = net::create_tap(&n.tap)?;
        let link = rtnl
            .link(n.tap.as_str())?
            .ok_or_else(|| StepError::TapVanished {
                tap: n.tap.to_string(),
            })?;
        // Re-checked here (the pre-flight ran before the lease): whatever
        // holds the name now must still be a bridge.
        let controller = match &n.bridge {
            Some(b) => {
                let field = format!("interfaces[{i}].bridge");
                match rtnl.link(b.as_str())? {
                    None => {
                        return Err(StepError::BridgeGone {
                            field,
                            bridge: b.to_string(),
                        })
                    }
                    Some(l) if l.kind != Some(InfoKind::Bridge) => {
                        return Err(StepError::NoLongerABridge {
                            field,
                            bridge: b.to_string(),
                            kind: l.kind,
                        })
                    }
                    Some(l) => Some(l.index),
                }
            }
            None => None,
        };
        let mac = spec.guest_mac(i).host_side();
        rtnl.configure(n.tap.as_str(), link.index, &mac.octets(), controller)?;
        if let Some(p) = owner {
            net::persist_for(&tap, p.uid, p.gid)?;
        }
        tracing::info!(step = %"taps", tap = %n.tap, bridge = ?n.bridge, persistent = owner.is_some(), "tap created");
        taps.push(tap);
    }
    Ok(taps)
}

/// Remove `dir/name` if it exists (never following a symlink).
fn remove_stale(dir: &Dir, name: &str) -> Result<()> {
    use std::os::fd::AsFd;
    match nix::unistd::unlinkat(
        dir.fd.as_fd(),
        name,
        nix::unistd::UnlinkatFlags::NoRemoveDir,
    ) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(e)
            .sys("unlink stale", dir.path.join(name))
            .map_err(Into::into),
    }
}

/// Create `dir/name` (`O_EXCL|O_NOFOLLOW`, 0600), owned by the principal.
fn write_private(dir: &Dir, name: &str, bytes: &[u8], p: &Principal) -> Result<()> {
    use nix::fcntl::{openat, OFlag};
    use nix::sys::stat::Mode;
    use std::io::Write;
    use std::os::fd::AsFd;
    let path = dir.path.join(name);
    let fd = openat(
        dir.fd.as_fd(),
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .sys("create", &path)?;
    nix::unistd::fchown(
        &fd,
        Some(nix::unistd::Uid::from_raw(p.uid)),
        Some(nix::unistd::Gid::from_raw(p.gid)),
    )
    .sys("fchown", &path)?;
    let mut f = std::fs::File::from(fd);
    f.write_all(bytes).io("write", &path)?;
    f.sync_all().io("fsync", path)?;
    Ok(())
}

fn resolve_program(arg0: &str) -> PathBuf {
    if arg0.contains('/') {
        return PathBuf::from(arg0);
    }
    for dir in EXEC_PATH.trim_start_matches("PATH=").split(':') {
        let p = Path::new(dir).join(arg0);
        if p.is_file() {
            return p;
        }
    }
    PathBuf::from(arg0)
}

fn exec(
    sys: &dyn Syscall,
    argv: &[String],
    lease: &Lease,
    taps: &[net::Tap],
    inherit: &[&std::os::fd::OwnedFd],
    principal: &Principal,
    state_dir: &Dir,
) -> Result<Infallible> {
    let Some(arg0) = argv.first() else {
        return Err(StepError::Usage("--probe: needs a command after --"));
    };
    let program = resolve_program(arg0);
    let cstr = |s: &str| CString::new(s).map_err(|_| StepError::NulInArgument(s.to_string()));
    let c_argv = argv.iter().map(|a| cstr(a)).collect::<Result<Vec<_>>>()?;
    let c_env = [cstr(EXEC_PATH)?];
    let c_prog = CString::new(program.as_os_str().as_encoded_bytes())
        .map_err(|_| StepError::NulInProgram(program.clone()))?;
    // The working directory is the VM's state dir (the principal's own),
    // by path: inside this namespace it is reached through the bind mount.
    sys.chdir(&state_dir.path).sys("chdir", &state_dir.path)?;
    let mut keep = vec![lease.inherit_across_exec()?];
    for t in taps {
        keep.push(net::inherit_across_exec(&t.fd)?);
    }
    for fd in inherit {
        use nix::fcntl::{fcntl, FcntlArg, FdFlag};
        fcntl(*fd, FcntlArg::F_SETFD(FdFlag::empty())).sys(
            "fcntl(F_SETFD, 0)",
            format!("/proc/self/fd/{}", fd.as_raw_fd()),
        )?;
        keep.push(fd.as_raw_fd());
    }
    sandbox::cloexec_all_but(sys, &keep)?;
    tracing::info!(
        step = %EXEC_STEP,
        uid = principal.uid,
        program = %program.display(),
        "exec"
    );
    let errno = sys.execve(&c_prog, &c_argv, &c_env);
    Err(StepError::Exec {
        path: program,
        errno,
    })
}

/// Every resource this launch will create, in creation order: what the
/// intent record names before any of it exists (the launched spec copy,
/// the state dir, the control dir and its socket — and firecracker's config
/// file —, the credential mount point and its private tmpfs, each tap).
/// Pure: cleanup and reap trust this list, so it is unit-tested.
pub fn planned_resources(
    spec: &Spec,
    spec_path: &Path,
    runtime_dir: &Path,
    state_dir: &Path,
) -> Vec<Resource> {
    let control = runtime_dir.join(CONTROL_DIR);
    let creds = runtime_dir.join(CREDENTIALS_DIR);
    let kind = spec.hypervisor.kind;
    let mut resources = vec![
        Resource::LaunchedSpec {
            path: runtime_dir.join(LAUNCHED_SPEC_FILE),
            source: spec_path.to_path_buf(),
        },
        Resource::StateDir {
            path: state_dir.to_path_buf(),
        },
        Resource::RuntimeDir {
            path: control.clone(),
        },
        Resource::RuntimeFile {
            path: match kind {
                HypervisorKind::Qemu => control.join(QMP_SOCKET),
                _ => control.join(API_SOCKET),
            },
        },
    ];
    for h in helpers::plan(spec, &control) {
        resources.push(Resource::Helper {
            helper: h.kind.as_str().to_string(),
            tag: h.tag.clone(),
            socket: h.socket.clone(),
        });
        if let Some(path) = h.host_socket {
            resources.push(Resource::RuntimeFile { path });
        }
    }
    match kind {
        HypervisorKind::Firecracker => resources.push(Resource::RuntimeFile {
            path: control.join(FIRECRACKER_CONFIG),
        }),
        HypervisorKind::CloudHypervisor => resources.push(Resource::RuntimeFile {
            path: control.join(CH_API_LOCK),
        }),
        HypervisorKind::Qemu => {}
    }
    resources.extend([
        Resource::RuntimeDir {
            path: creds.clone(),
        },
        Resource::PrivateMount {
            path: creds,
            fstype: "tmpfs".into(),
        },
    ]);
    // Images to create: the temporary name is what a killed launch leaves
    // (cleanup removes it); the image itself is never cleanup's.
    resources.extend(
        spec.disks
            .iter()
            .filter(|d| d.create.is_some())
            .filter_map(|d| {
                Some(Resource::CreatedImage {
                    path: d.path.clone(),
                    temp: volumes::temp_path(&d.path)?,
                })
            }),
    );
    resources.extend(spec.interfaces.iter().map(|n| Resource::Tap {
        name: n.tap.to_string(),
        bridge: n.bridge.as_ref().map(|b| b.to_string()),
    }));
    resources
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec_of(v: serde_json::Value) -> Spec {
        Spec::parse(
            Path::new("/etc/vmwarden/vms/web.json"),
            &serde_json::to_vec(&v).unwrap(),
        )
        .unwrap()
    }

    fn base_spec(kind: &str) -> serde_json::Value {
        serde_json::json!({
            "version": 1, "name": "web",
            "principal": { "uid": 61001, "gid": 61001 },
            "hypervisor": { "kind": kind, "binary": "/usr/bin/hv" },
            "vcpus": 1, "memory_mib": 256, "kernel": "/boot/vmlinuz"
        })
    }

    #[test]
    fn the_intent_record_names_every_resource_in_creation_order() {
        let mut v = base_spec("qemu");
        v["interfaces"] = serde_json::json!([{ "tap": "vmw-web0", "bridge": "br0" }]);
        let got = planned_resources(
            &spec_of(v),
            Path::new("/etc/vmwarden/vms/web.json"),
            Path::new("/run/vmwarden/web"),
            Path::new("/var/lib/vmwarden/web"),
        );
        let p = PathBuf::from;
        assert_eq!(
            got,
            vec![
                Resource::LaunchedSpec {
                    path: p("/run/vmwarden/web/launched-spec.json"),
                    source: p("/etc/vmwarden/vms/web.json"),
                },
                Resource::StateDir {
                    path: p("/var/lib/vmwarden/web")
                },
                Resource::RuntimeDir {
                    path: p("/run/vmwarden/web/control")
                },
                Resource::RuntimeFile {
                    path: p("/run/vmwarden/web/control/qmp.sock")
                },
                Resource::RuntimeDir {
                    path: p("/run/vmwarden/web/credentials")
                },
                Resource::PrivateMount {
                    path: p("/run/vmwarden/web/credentials"),
                    fstype: "tmpfs".into()
                },
                Resource::Tap {
                    name: "vmw-web0".into(),
                    bridge: Some("br0".into())
                },
            ]
        );
    }

    #[test]
    fn a_created_image_is_recorded_with_its_temporary_name_before_the_taps() {
        let mut v = base_spec("qemu");
        v["disks"] = serde_json::json!([
            { "path": "/var/lib/vmwarden/web/root.img" },
            { "path": "/var/lib/vmwarden/web/data.img", "create": { "size_mib": 8 } }
        ]);
        v["interfaces"] = serde_json::json!([{ "tap": "vmw-web0" }]);
        let got = planned_resources(
            &spec_of(v),
            Path::new("/etc/vmwarden/vms/web.json"),
            Path::new("/run/vmwarden/web"),
            Path::new("/var/lib/vmwarden/web"),
        );
        let n = got.len();
        assert_eq!(
            got[n - 2..],
            [
                Resource::CreatedImage {
                    path: PathBuf::from("/var/lib/vmwarden/web/data.img"),
                    temp: PathBuf::from("/var/lib/vmwarden/web/.data.img.vmwarden-new"),
                },
                Resource::Tap {
                    name: "vmw-web0".into(),
                    bridge: None
                },
            ]
        );
    }

    #[test]
    fn firecracker_records_its_api_socket_and_config_file() {
        let got = planned_resources(
            &spec_of(base_spec("firecracker")),
            Path::new("/etc/vmwarden/vms/web.json"),
            Path::new("/run/vmwarden/web"),
            Path::new("/var/lib/vmwarden/web"),
        );
        let files: Vec<_> = got
            .iter()
            .filter_map(|r| match r {
                Resource::RuntimeFile { path } => Some(path.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(
            files,
            vec![
                PathBuf::from("/run/vmwarden/web/control/api.sock"),
                PathBuf::from("/run/vmwarden/web/control/firecracker.json"),
            ]
        );
    }

    #[test]
    fn cloud_hypervisor_records_its_api_socket_and_lock() {
        let got = planned_resources(
            &spec_of(base_spec("cloud-hypervisor")),
            Path::new("/etc/vmwarden/vms/web.json"),
            Path::new("/run/vmwarden/web"),
            Path::new("/var/lib/vmwarden/web"),
        );
        let files: Vec<_> = got
            .iter()
            .filter_map(|r| match r {
                Resource::RuntimeFile { path } => Some(path.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(
            files,
            vec![
                PathBuf::from("/run/vmwarden/web/control/api.sock"),
                PathBuf::from("/run/vmwarden/web/control/api.sock.lock"),
            ]
        );
    }

    /// Options for VM `name` with every root in `dir` (nothing there yet).
    fn options(dir: &Path, name: &str) -> Options {
        Options {
            name: VmName::parse(name).unwrap(),
            roots: Roots {
                config_dir: dir.join("config"),
                runtime_root: dir.join("run"),
                state_root: dir.join("state"),
            },
            spec: None,
            probe: Some(vec!["/bin/true".into()]),
            credentials_directory: None,
            fault_after: None,
            helper_openat2_enosys: false,
        }
    }

    fn failure(opts: Options) -> LaunchError {
        match launch(opts) {
            Ok(never) => match never {},
            Err(e) => e,
        }
    }

    #[test]
    fn steps_are_reported_in_order_and_exec_comes_last() {
        let mut steps = Steps::new(None);
        for step in STEPS {
            assert_eq!(steps.current(), *step);
            steps.after(step);
        }
        assert_eq!(steps.current(), EXEC_STEP);
        assert!(!STEPS.contains(&EXEC_STEP));
    }

    #[test]
    fn a_launch_error_names_the_step_it_failed_in() {
        // Refusals that need neither root nor any host change: each fails
        // before anything is created.
        let dir = tempfile::tempdir().unwrap();
        // A bad name never reaches `launch`: clap's value parser refuses it
        // while the arguments are parsed, in the first step.
        let bad = ArgNameError {
            arg: "[NAME]".into(),
            error: VmName::parse("a/b").unwrap_err(),
        };
        let e = LaunchError::at(STEPS[0], bad);
        assert_eq!(e.step, "sanitized");
        assert!(e.is_refusal());
        assert_eq!(
            e.to_string(),
            "at step \"sanitized\": [NAME]: VM name \"a/b\" must match ^[a-z][a-z0-9-]{0,31}$ \
             (lowercase letter first, then lowercase letters, digits or '-', at most 32)"
        );

        let mut relative = options(dir.path(), "web");
        relative.roots.state_root = PathBuf::from("state");
        let e = failure(relative);
        assert_eq!(e.step, "spec-loaded");
        assert!(e.to_string().contains("--state-root state"), "{e}");

        let e = failure(options(dir.path(), "web"));
        assert_eq!(e.step, "spec-loaded");
        assert!(e.to_string().contains("web.json"), "{e}");

        // A valid spec whose principal does not resolve fails a step later.
        let config = dir.path().join("config");
        std::fs::create_dir(&config).unwrap();
        let kernel = dir.path().join("vmlinuz");
        std::fs::write(&kernel, b"").unwrap();
        let spec = serde_json::json!({
            "version": 1, "name": "web",
            "principal": { "user": "vmw-no-such-user", "gid": 61001 },
            "hypervisor": { "kind": "qemu", "binary": "/bin/sh", "accel": "tcg" },
            "vcpus": 1, "memory_mib": 64, "kernel": kernel,
        });
        std::fs::write(config.join("web.json"), spec.to_string()).unwrap();
        let e = failure(options(dir.path(), "web"));
        assert_eq!(e.step, "principal-resolved", "{e}");
        assert!(e.is_refusal());
        assert!(
            e.to_string()
                .starts_with("at step \"principal-resolved\": principal vmw-no-such-user:61001: "),
            "{e}"
        );
        assert!(!dir.path().join("run").exists() && !dir.path().join("state").exists());
    }

    /// The launch tail as far as the unit tests can take it without root:
    /// every privileged call recorded, every other call real (inside a
    /// temporary directory). The roots hold no VM dir, so the masks' mkdir
    /// finds room where the recorded tmpfs would be.
    fn run_tail(sys: &dyn Syscall) -> (std::result::Result<Infallible, StepError>, &'static str) {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = options(dir.path(), "web");
        for d in [&opts.roots.runtime_root, &opts.roots.state_root] {
            std::fs::create_dir(d).unwrap();
        }
        let vm_run = dir.path().join("vm-run/web");
        let vm_state = dir.path().join("vm-state/web");
        std::fs::create_dir_all(vm_run.join(CREDENTIALS_DIR)).unwrap();
        std::fs::create_dir_all(&vm_state).unwrap();
        opts.probe = Some(vec!["/bin/true".into()]);
        let spec = spec_of(base_spec("qemu"));
        // The principal is the caller: installing credentials chowns to it.
        let principal = Principal {
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            user: None,
            groups: Vec::new(),
        };
        let rundir = dirs::open_dir(&vm_run).unwrap();
        let state_dir = dirs::open_dir(&vm_state).unwrap();
        let lease = Lease::acquire_unchecked_for_tests(vm_run.join(LEASE_FILE));
        let mut steps = Steps::new(None);
        while steps.current() != "namespace" {
            let s = steps.current();
            steps.after(s);
        }
        let got = confine_and_exec(
            sys,
            &mut steps,
            Confine {
                opts: &opts,
                spec: &spec,
                principal: &principal,
                rundir: &rundir,
                state_dir: &state_dir,
                loaded: Vec::new(),
                lease: &lease,
                taps: &[],
                vhost_vsock: None,
                qmp: None,
                qemu_sandbox: false,
            },
        );
        (got, steps.current())
    }

    /// The names of the calls, each run of one name (the mounts, one
    /// seccomp load per filter, one close-on-exec range per gap between
    /// inherited fds) folded into one entry: how many masks there are
    /// depends on the host (`/run/credentials` is masked only where it
    /// exists).
    fn phases(sys: &syscall::RecordingSyscall) -> Vec<&'static str> {
        let mut out: Vec<&'static str> = sys
            .names()
            .into_iter()
            .map(|n| if n == "mount" { "mounts" } else { n })
            .collect();
        out.dedup();
        out
    }

    /// Issue 9: unshare before mounts, setgroups < setresgid < bounding and
    /// ambient clear < securebits < no_new_privs < setresuid < self-check <
    /// Landlock < seccomp < execve: the privilege drop's own order
    /// (`sandbox::tests::DROP_ORDER`) between the namespace and the exec.
    fn tail_order() -> Vec<&'static str> {
        let mut order = vec!["unshare", "mounts", "setrlimit"];
        order.extend_from_slice(sandbox::tests::DROP_ORDER);
        order.extend_from_slice(&[
            "landlock_restrict",
            "seccomp_load",
            "chdir",
            "cloexec_range",
            "execve",
        ]);
        order
    }

    #[test]
    fn the_launch_tail_makes_its_privileged_calls_in_order() {
        let sys = syscall::RecordingSyscall::new();
        let (got, step) = run_tail(&sys);
        // The recorder fails execve: the launch reports it at "exec".
        assert!(matches!(got, Err(StepError::Exec { .. })), "{got:?}");
        assert_eq!(step, EXEC_STEP);
        assert_eq!(phases(&sys), tail_order());
        let calls = sys.calls();
        let args = |name: &str| -> Vec<String> {
            calls
                .iter()
                .filter(|c| c.name == name)
                .map(|c| c.args.clone())
                .collect()
        };
        assert_eq!(args("unshare"), ["CloneFlags(CLONE_NEWNS | CLONE_NEWIPC)"]);
        // Every mount comes after the unshare: the first makes "/" a slave.
        let mounts = args("mount");
        assert!(mounts[0].contains("MS_REC | MS_SLAVE"), "{mounts:?}");
        assert!(
            mounts.iter().any(|m| m.contains("noswap")),
            "the credential tmpfs: {mounts:?}"
        );
        assert_eq!(args("setrlimit"), ["RLIMIT_CORE 0 0"]);
        assert_eq!(
            args("seccomp_load").len(),
            seccomp::programs().unwrap().len(),
            "every filter is loaded"
        );
        assert!(args("execve")[0].contains("/bin/true"), "{calls:?}");
    }

    #[test]
    fn a_failed_privileged_call_ends_the_launch_tail_at_its_step() {
        let full = syscall::RecordingSyscall::new();
        let _ = run_tail(&full);
        let names = full.names();
        // The step an error at each call is reported at.
        let step_of = |name: &str| match name {
            "unshare" => "namespace",
            "setrlimit" => "rlimits",
            "landlock_restrict" => "landlock",
            "seccomp_load" => "seccomp",
            "chdir" | "cloexec_range" | "execve" => EXEC_STEP,
            "mount" => "namespace",
            _ => "privileges-dropped",
        };
        for name in tail_order()
            .into_iter()
            .map(|n| if n == "mounts" { "mount" } else { n })
        {
            let k = names.iter().position(|n| *n == name).unwrap();
            let sys = syscall::RecordingSyscall::failing_at(name);
            let (got, step) = run_tail(&sys);
            assert!(got.is_err(), "{name}");
            assert_eq!(sys.names(), names[..=k], "failing at {name}");
            assert_eq!(step, step_of(name), "failing at {name}");
        }
    }
}
