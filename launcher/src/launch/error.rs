//! Why a launch step failed: the error of the part the step called, or one
//! of the launch's own refusals (`LaunchError` adds the step).

use crate::launch::restore::RestoreError;
use std::path::PathBuf;

use netlink_packet_route::link::InfoKind;
use nix::errno::Errno;

use crate::config::files::Distrust;
use crate::config::names::ArgNameError;
use crate::config::paths::RootError;
use crate::config::spec::SpecError;
use crate::devices::DeviceError;
use crate::host::dirs::DirError;
use crate::host::machined::MachinedError;
use crate::host::net::NetError;
use crate::host::signals::SignalsError;
use crate::host::sys::{IoError, SysError};
use crate::identity::principal::PrincipalError;
use crate::identity::registry::RegistryError;
use crate::instance::creds_floor::FloorError;
use crate::instance::intent::IntentError;
use crate::instance::lease::LeaseError;
use crate::instance::liveness::Verdict;
use crate::launch::creds::CredentialError;
use crate::launch::helpers::HelperError;
use crate::launch::landlock::LandlockError;
use crate::launch::sandbox::SandboxError;
use crate::launch::seccomp::SeccompError;
use crate::launch::share_sources::MakeError;
use crate::launch::volumes::VolumeError;

/// Why a launch step failed: the error of the part the step called, or one
/// of the launch's own refusals.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// `register_with_machined`: the registration failed.
    #[error(transparent)]
    Machined(#[from] MachinedError),
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
    CredsFloor(#[from] FloorError),
    #[error(transparent)]
    Credential(#[from] CredentialError),
    #[error(transparent)]
    Net(#[from] NetError),
    /// A PCI or USB device of `devices` (`devices::`).
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error("network interface {tap}: RTM_GETLINK: the tap vanished right after TUNSETIFF")]
    TapVanished { tap: String },
    /// A link of a firecracker VM's network namespace (`launch::netns`)
    /// was gone, or of another kind, right after it was made.
    #[error("network interface {link}: RTM_GETLINK: the {kind:?} link just made is {found}")]
    LinkVanished {
        link: String,
        kind: InfoKind,
        /// "gone", or what holds the name now.
        found: String,
    },
    /// A macvtap's parent (`field`, `interfaces[i].macvtap.link`) was
    /// gone at the `taps` step.
    #[error("network interface {field} {link:?}: RTM_GETLINK: the macvtap's link disappeared during the launch")]
    MacvtapLinkGone { field: String, link: String },
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
    /// The signal state the launcher inherited could not be reset
    /// (`host::signals`).
    #[error(transparent)]
    Signals(#[from] SignalsError),
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
    /// `interfaces[i].vhost = true` and the kernel's vhost-net cannot be
    /// opened.
    #[error("{path}: cannot open it for `{field}` = true ({errno}){hint}; nothing was created")]
    VhostNet {
        field: String,
        path: PathBuf,
        #[source]
        errno: Errno,
        hint: &'static str,
    },
    #[error(transparent)]
    Helper(#[from] HelperError),
    /// A missing writable share source could not be made or recorded.
    #[error(transparent)]
    ShareSource(#[from] MakeError),
    #[error(transparent)]
    Restore(#[from] RestoreError),
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
    /// See [`LaunchError::is_refusal`](crate::launch::LaunchError::is_refusal).
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
            StepError::Machined(e) => e.is_refusal(),
            StepError::Dir(e) => e.is_refusal(),
            StepError::Lease(e) => e.is_refusal(),
            StepError::Intent(e) => e.is_refusal(),
            StepError::Credential(e) => e.is_refusal(),
            StepError::Net(e) => e.is_refusal(),
            StepError::Device(e) => e.is_refusal(),
            StepError::Restore(e) => e.is_refusal(),
            StepError::Sandbox(e) => e.is_refusal(),
            StepError::Volume(e) => e.is_refusal(),
            StepError::VhostVsock { errno, .. } | StepError::VhostNet { errno, .. } => {
                matches!(errno, Errno::ENOENT | Errno::ENODEV | Errno::ENXIO)
            }
            StepError::AlreadyRunning { .. }
            | StepError::Ambiguous { .. }
            | StepError::TapVanished { .. }
            | StepError::LinkVanished { .. }
            | StepError::BridgeGone { .. }
            | StepError::MacvtapLinkGone { .. }
            | StepError::NoLongerABridge { .. }
            | StepError::Landlock(_)
            | StepError::Seccomp(_)
            | StepError::Signals(_)
            | StepError::Helper(_)
            | StepError::ShareSource(_)
            | StepError::HypervisorProbe { .. }
            | StepError::Sys(_)
            | StepError::Io(_)
            | StepError::CredsFloor(_)
            | StepError::Exec { .. } => false,
        }
    }
}

impl From<VolumeError> for StepError {
    fn from(e: VolumeError) -> Self {
        StepError::Volume(Box::new(e))
    }
}
