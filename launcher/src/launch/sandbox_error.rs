//! What stops the sandbox: its errors, and what the privilege drop's
//! self-check found still held. Below both the sandbox and the system-call
//! seam (`launch::syscall`), which return them.

use std::path::PathBuf;

use caps::errors::CapsError;
use caps::CapsHashSet;
use nix::errno::Errno;
use nix::unistd::{ResGid, ResUid};

use crate::host::dirs::DirError;
use crate::host::mountinfo::Mount;
use crate::host::sys::SysError;

/// The sandbox could not be built, or the privilege drop did not hold.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("kernel lacks tmpfs `noswap` (needs Linux 6.4 or later) for {path}: {errno}; refusing to put credentials on swappable memory")]
    NoSwapUnsupported {
        path: PathBuf,
        #[source]
        errno: Errno,
    },
    #[error("{path}: refused: cannot read /proc/self/mountinfo to confirm noswap: {source}")]
    NoSwapUnconfirmed {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: refused: the credential tmpfs was mounted but mountinfo does not show it with noswap ({found:?}); refusing to put credentials on swappable memory")]
    NoSwapNotShown {
        path: PathBuf,
        found: Option<Box<Mount>>,
    },
    #[error("{path}: refused: has no file name")]
    NoFileName { path: PathBuf },
    #[error("{path}: refused: was replaced while the sandbox was being built")]
    Replaced { path: PathBuf },
    #[error("capabilities: {op}: {source}")]
    Caps {
        op: &'static str,
        #[source]
        source: CapsError,
    },
    #[error("privilege drop failed: {0}")]
    Drop(#[source] DropFailure),
    #[error(transparent)]
    Dir(#[from] DirError),
    #[error(transparent)]
    Sys(#[from] SysError),
}

impl SandboxError {
    /// Host state that refuses the sandbox (`EX_CONFIG`): no `noswap`, or a
    /// directory that is not what was vetted.
    pub fn is_refusal(&self) -> bool {
        match self {
            SandboxError::NoSwapUnsupported { .. }
            | SandboxError::NoSwapUnconfirmed { .. }
            | SandboxError::NoSwapNotShown { .. }
            | SandboxError::NoFileName { .. }
            | SandboxError::Replaced { .. } => true,
            SandboxError::Dir(e) => e.is_refusal(),
            SandboxError::Caps { .. } | SandboxError::Drop(_) | SandboxError::Sys(_) => false,
        }
    }
}

/// What the privilege drop's self-check found still held.
#[derive(Debug, thiserror::Error)]
pub enum DropFailure {
    #[error("cannot count threads: {0}")]
    CountThreads(#[source] std::io::Error),
    #[error("the launcher has {0} threads; it must be single-threaded to drop privileges")]
    Threads(usize),
    #[error("the {set} capability set still holds {held:?}")]
    CapsHeld {
        set: &'static str,
        held: CapsHashSet,
    },
    #[error("the {set} capability set still holds mask {mask} (/proc/self/status)")]
    CapMaskHeld { set: &'static str, mask: String },
    #[error("/proc/self/status has no readable {key} line")]
    StatusField { key: &'static str },
    #[error("{what} are {found:?} (real, effective, saved, fs), expected {expected}")]
    StatusIds {
        what: &'static str,
        found: Vec<u32>,
        expected: u32,
    },
    #[error("uids are {found:?}, expected {expected}")]
    Uids { found: ResUid, expected: u32 },
    #[error("gids are {found:?}, expected {expected}")]
    Gids { found: ResGid, expected: u32 },
    #[error("supplementary groups are {found:?}, expected {expected:?}")]
    Groups { found: Vec<u32>, expected: Vec<u32> },
    #[error("no_new_privs is not set")]
    NoNewPrivs,
    #[error("setuid(0) succeeded after the drop")]
    Setuid0,
    #[error("setgid(0) succeeded after the drop")]
    Setgid0,
}
