//! One flat error type for the launcher, cleanup and operator commands.
//!
//! Every variant names the path or field it is about and carries the cause,
//! so a message printed by a binary is enough to act on.

use std::path::PathBuf;

use nix::errno::Errno;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Spec(#[from] crate::config::spec::SpecError),

    #[error("{flag} {path}: {reason}")]
    Root {
        flag: String,
        path: PathBuf,
        reason: &'static str,
    },

    #[error("{what}: {reason}")]
    Usage { what: String, reason: String },

    #[error("principal {principal}: {reason}")]
    Principal { principal: String, reason: String },

    #[error("{path}: {op}: {errno}")]
    Sys {
        op: &'static str,
        path: PathBuf,
        errno: Errno,
    },

    #[error("{path}: {op}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{path}: refused: {reason}")]
    Refused { path: PathBuf, reason: String },

    #[error("VM {name} is already running ({reason}); nothing was changed")]
    AlreadyRunning { name: String, reason: String },

    #[error("VM {name}: liveness is ambiguous ({reason}); refusing to start a second instance")]
    Ambiguous { name: String, reason: String },

    #[error("credential {name} ({source_desc}): {reason}")]
    Credential {
        name: String,
        source_desc: String,
        reason: String,
    },

    #[error("kernel lacks tmpfs `noswap` (needs Linux 6.4 or later) for {path}: {errno}; refusing to put credentials on swappable memory")]
    NoSwapUnsupported { path: PathBuf, errno: Errno },

    #[error("privilege drop failed: {0}")]
    Drop(String),

    #[error("landlock: {0}")]
    Landlock(String),

    #[error("capabilities: {op}: {source}")]
    Caps {
        op: &'static str,
        #[source]
        source: caps::errors::CapsError,
    },

    #[error("exec {path}: {errno}")]
    Exec { path: PathBuf, errno: Errno },

    #[error("network interface {what}: {op}: {source}")]
    Net {
        what: String,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },

    #[error("control API {path}: {reason}")]
    Api { path: PathBuf, reason: String },

    #[error("QMP {path}: {reason}")]
    Qmp { path: PathBuf, reason: String },

    #[error("intent record {path}: {reason}")]
    Intent { path: PathBuf, reason: String },

    #[error("{0}")]
    Other(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `EX_CONFIG` (sysexits.h): the configuration or the host state it points
/// at is wrong, and starting again will not help. The unit sets
/// `RestartPreventExitStatus=78` so systemd does not retry such a launch.
pub const EXIT_CONFIG: u8 = 78;

impl Error {
    /// The launcher's exit status for this error: 78 for a refused spec,
    /// principal, credential or path; 1 for everything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Spec(_)
            | Error::Root { .. }
            | Error::Usage { .. }
            | Error::Principal { .. }
            | Error::Refused { .. }
            | Error::Credential { .. }
            | Error::NoSwapUnsupported { .. } => EXIT_CONFIG,
            _ => 1,
        }
    }
}

/// Attach a path and an operation name to a nix error.
pub trait SysContext<T> {
    fn sys(self, op: &'static str, path: impl Into<PathBuf>) -> Result<T>;
}

impl<T> SysContext<T> for std::result::Result<T, Errno> {
    fn sys(self, op: &'static str, path: impl Into<PathBuf>) -> Result<T> {
        self.map_err(|errno| Error::Sys {
            op,
            path: path.into(),
            errno,
        })
    }
}

/// Attach a path and an operation name to an io error.
pub trait IoContext<T> {
    fn io(self, op: &'static str, path: impl Into<PathBuf>) -> Result<T>;
}

impl<T> IoContext<T> for std::result::Result<T, std::io::Error> {
    fn io(self, op: &'static str, path: impl Into<PathBuf>) -> Result<T> {
        self.map_err(|source| Error::Io {
            op,
            path: path.into(),
            source,
        })
    }
}
