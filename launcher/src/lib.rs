//! vmwarden: run each microVM as its own principal, in its own mount
//! namespace, with its credentials on a noswap tmpfs only it can see — and
//! prove after every stop that nothing was left behind.
//!
//! The three binaries (`vmwarden-launch`, `vmwarden-cleanup`, `vmwarden`)
//! share this library: destructive commands use the same ownership and
//! liveness code as the launcher.

pub mod config;
pub mod control;
pub mod error;
pub mod host;
pub mod hypervisor;
pub mod identity;
pub mod instance;
pub mod launch;
pub mod teardown;
pub mod unit;

pub use error::{Error, Result};

use clap::error::{ContextKind, ContextValue};
use config::names::{ArgNameError, NameError};

/// Print an error with its chain of causes, the way every binary reports.
pub fn report_error(prog: &str, err: &dyn std::error::Error) {
    report(format!("{prog}: error: {err}"), err);
}

/// The launcher's report: `PROG: error at step "STEP": …`.
pub fn report_launch_error(prog: &str, err: &launch::LaunchError) {
    report(format!("{prog}: error {err}"), err);
}

/// Print `msg` and each cause of `err` that `msg` does not already say.
fn report(mut msg: String, err: &dyn std::error::Error) {
    let mut src = err.source();
    while let Some(s) = src {
        let s_txt = s.to_string();
        if !msg.contains(&s_txt) {
            msg.push_str(&format!("\n  caused by: {s_txt}"));
        }
        src = s.source();
    }
    eprintln!("{msg}");
}

/// Set up `tracing` to stderr; `filter` comes from `VMWARDEN_LOG`.
pub fn init_logging(filter: Option<&str>) {
    let f = tracing_subscriber::EnvFilter::try_new(filter.unwrap_or("info"))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(f)
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .try_init();
}

/// Parse the command line. A name argument its type refused (a
/// [`NameError`] from clap's value parser) comes back as an
/// [`ArgNameError`], for the binary to report like its other errors and to
/// exit with its status for a bad name; every other clap error, and
/// `--help`/`--version`, clap prints and exits on (2, or 0).
pub fn parse_args<T: clap::Parser>() -> std::result::Result<T, ArgNameError> {
    T::try_parse().map_err(|e| name_refused(&e).unwrap_or_else(|| e.exit()))
}

fn name_refused(e: &clap::Error) -> Option<ArgNameError> {
    let error = std::error::Error::source(e)?
        .downcast_ref::<NameError>()?
        .clone();
    let arg = match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(a)) => a.clone(),
        _ => "argument".to_string(),
    };
    Some(ArgNameError { arg, error })
}
