//! What a binary of vmwarden inherits of signals, made known at its start.
//!
//! Ignored signals and the blocked mask survive `execve`, so whoever
//! starts a tool (a shell, a supervisor, a test harness) chooses them. Two
//! of them change what vmwarden does:
//!
//! - `SIGCHLD` ignored: the kernel reaps every child at once, so a
//!   `waitpid` for a child (reap's unmount child, the launcher's helpers'
//!   start-up checks) fails with `ECHILD` instead of reading its status,
//!   and a pid waited on may already be another process's;
//! - a blocked signal: the launcher's `execve` hands the mask to the
//!   hypervisor, which a blocked `SIGTERM` would keep from stopping.
//!
//! systemd resets both for its services; a start by hand need not. So each
//! binary sets `SIGCHLD` to its default disposition and unblocks every
//! signal before anything else ([`inherited_to_default`]), whatever
//! started it.

use nix::errno::Errno;
use nix::sys::signal::{signal, sigprocmask, SigHandler, SigSet, SigmaskHow, Signal};

/// A call of [`inherited_to_default`] the kernel refused.
#[derive(Debug, thiserror::Error)]
pub enum SignalsError {
    #[error("setting SIGCHLD to its default disposition (the one inherited may ignore it): {0}")]
    Disposition(#[source] Errno),
    #[error("unblocking every signal (the mask inherited may block some): {0}")]
    Mask(#[source] Errno),
}

/// `SIGCHLD` at its default disposition and no signal blocked in the
/// calling thread. Called first in `main`, while the process has one
/// thread.
pub fn inherited_to_default() -> Result<(), SignalsError> {
    // SAFETY: SIG_DFL installs no handler, so nothing can run in an
    // unexpected context; nothing in vmwarden relies on SIGCHLD ignored.
    unsafe { signal(Signal::SIGCHLD, SigHandler::SigDfl) }.map_err(SignalsError::Disposition)?;
    sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None).map_err(SignalsError::Mask)
}
