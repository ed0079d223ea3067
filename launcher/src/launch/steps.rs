//! The launch's step list ([`STEPS`]), the error that names the step a
//! launch failed in ([`LaunchError`]), and the launch's way through the
//! steps ([`Steps`]: where an error is reported, and with the
//! `fault-injection` feature where the launcher SIGKILLs itself).

use crate::launch::StepError;
use crate::profile;

/// Step names, in order. `VMWARDEN_FAULT_AFTER=<step>` (builds with the
/// `fault-injection` feature) SIGKILLs the launcher right after that step;
/// `stop:<step>` SIGSTOPs it there.
pub const STEPS: &[&str] = &[
    "sanitized",
    "spec-loaded",
    "principal-resolved",
    "restore-checked",
    "runtime-dir",
    "lease-taken",
    "intent-written",
    "spec-kept",
    "state-dir",
    "share-sources-made",
    "share-sources-recorded",
    "control-dir",
    "credentials-dir",
    "taps",
    "devices",
    "hypervisor-config",
    "machine-registered",
    "namespace",
    "masked",
    "rooted",
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

/// The launch's way through [`STEPS`]: the step it is in (what an error is
/// reported at) and, with the `fault-injection` feature, where to SIGKILL.
pub(crate) struct Steps {
    /// Index in [`STEPS`] of the step in progress.
    current: usize,
    fault_after: Option<String>,
}

impl Steps {
    pub(crate) fn new(fault_after: Option<String>) -> Steps {
        Steps {
            current: 0,
            fault_after,
        }
    }

    /// The step in progress: the first not yet done, [`EXEC_STEP`] once all are.
    pub(crate) fn current(&self) -> &'static str {
        STEPS.get(self.current).copied().unwrap_or(EXEC_STEP)
    }

    /// A kill point inside the step in progress: with the `fault-injection`
    /// feature the launcher SIGKILLs itself here when
    /// `VMWARDEN_FAULT_AFTER` is `STEP:WHERE` (e.g. `taps:vmw-web0:apart`).
    /// Not in `--list-steps`: the step that has them names them.
    pub(crate) fn within(&self, at: &str) {
        #[cfg(feature = "fault-injection")]
        if self
            .fault_after
            .as_deref()
            .and_then(|f| f.strip_prefix(self.current()))
            .and_then(|f| f.strip_prefix(':'))
            == Some(at)
        {
            tracing::warn!(step = %self.current(), at = %at, "fault injection: SIGKILL inside the step");
            let _ =
                nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGKILL);
        }
        #[cfg(not(feature = "fault-injection"))]
        let _ = at;
    }

    /// `step` is done; the launch moves on to the next one.
    pub(crate) fn after(&mut self, step: &str) {
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
        // `stop:STEP`: SIGSTOP after it, for a test to act between two
        // steps (it sends SIGCONT).
        #[cfg(feature = "fault-injection")]
        if self
            .fault_after
            .as_deref()
            .and_then(|f| f.strip_prefix("stop:"))
            == Some(step)
        {
            tracing::warn!(step = %step, "fault injection: SIGSTOP after step");
            let _ =
                nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGSTOP);
        }
        #[cfg(not(feature = "fault-injection"))]
        let _ = &self.fault_after;
    }
}
