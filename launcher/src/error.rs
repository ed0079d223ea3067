//! The crate's error: every part's own error type, composed with `#[from]`,
//! plus the operator commands' usage refusals. This is the top layer: parts
//! return their own enums and never import it.
//!
//! Every variant names the path or field it is about and carries the cause,
//! so a message printed by a binary is enough to act on.

use crate::config::paths::RootError;
use crate::config::spec::SpecError;
use crate::control::console::ConsoleError;
use crate::control::ControlError;
use crate::devices::DeviceError;
use crate::host::dirs::DirError;
use crate::host::net::NetError;
use crate::host::peer::PeerError;
use crate::hypervisor::api::ApiError;
use crate::hypervisor::qmp::QmpError;
use crate::identity::principal::PrincipalError;
use crate::identity::registry::RegistryError;
use crate::instance::intent::IntentError;
use crate::instance::lease::LeaseError;
use crate::launch::LaunchError;
use crate::teardown::adopt::AdoptError;
use crate::teardown::purge::PurgeError;
use crate::unit::UnitError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Root(#[from] RootError),
    /// `purge` was not run on a terminal to confirm on.
    #[error("purge: needs a terminal to type {phrase} on; nothing deleted")]
    NoTerminal { phrase: &'static str },
    #[error(transparent)]
    Dir(#[from] DirError),
    #[error(transparent)]
    Net(#[from] NetError),
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Peer(#[from] PeerError),
    #[error(transparent)]
    Qmp(#[from] QmpError),
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error(transparent)]
    Principal(#[from] PrincipalError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error(transparent)]
    Intent(#[from] IntentError),
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error(transparent)]
    Console(#[from] ConsoleError),
    #[error(transparent)]
    Purge(#[from] PurgeError),
    #[error(transparent)]
    Unit(#[from] UnitError),
    #[error(transparent)]
    Adopt(#[from] AdoptError),
    #[error("reading confirmation: {0}")]
    Confirm(#[source] std::io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `EX_CONFIG` (sysexits.h): the configuration or the host state it points
/// at is wrong, and starting again will not help. The unit sets
/// `RestartPreventExitStatus=78` so systemd does not retry such a launch.
pub const EXIT_CONFIG: u8 = 78;

impl Error {
    /// The launcher's exit status for this error: 78 for a refused spec,
    /// root flag, usage, principal, credential or path (or a kernel without
    /// tmpfs `noswap`); 1 for everything else. Each part says which of its
    /// errors are refusals.
    pub fn exit_code(&self) -> u8 {
        let refusal = match self {
            Error::Spec(_) | Error::Root(_) | Error::NoTerminal { .. } | Error::Principal(_) => {
                true
            }
            Error::Dir(e) => e.is_refusal(),
            Error::Net(e) => e.is_refusal(),
            Error::Device(e) => e.is_refusal(),
            Error::Registry(e) => e.is_refusal(),
            Error::Lease(e) => e.is_refusal(),
            Error::Intent(e) => e.is_refusal(),
            Error::Launch(e) => e.is_refusal(),
            Error::Purge(e) => e.is_refusal(),
            Error::Adopt(e) => e.is_refusal(),
            Error::Peer(_)
            | Error::Qmp(_)
            | Error::Api(_)
            | Error::Control(_)
            | Error::Console(_)
            | Error::Unit(_)
            | Error::Confirm(_) => false,
        };
        if refusal {
            EXIT_CONFIG
        } else {
            1
        }
    }
}
