//! What every binary shares: parsing, the three roots and the log level.

use std::path::PathBuf;

use clap::error::{ContextKind, ContextValue};
use vmwarden::config::names::{ArgNameError, NameError};
use vmwarden::config::paths::{
    Roots, DEFAULT_CONFIG_DIR, DEFAULT_RUNTIME_ROOT, DEFAULT_STATE_ROOT,
};

/// Parse the command line. A name argument its type refused (a
/// [`NameError`] from clap's value parser) comes back as an
/// [`ArgNameError`], for the binary to report like its other errors and to
/// exit with its status for a bad name; every other clap error, and
/// `--help`/`--version`, clap prints and exits on (2, or 0).
pub fn parse_args<T: clap::Parser>() -> Result<T, ArgNameError> {
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

/// `--config-dir`, `--runtime-root`, `--state-root` (or their `VMWARDEN_*`
/// variables): tests, demos and benchmarks run side by side without the
/// real roots.
#[derive(Debug, Clone, clap::Args)]
pub struct RootArgs {
    /// Directory holding NAME.json launch specs.
    #[arg(long, env = "VMWARDEN_CONFIG_DIR", default_value = DEFAULT_CONFIG_DIR, value_name = "DIR", global = true)]
    pub config_dir: PathBuf,
    /// Runtime root: one directory per VM (leases, intent records, sockets).
    #[arg(long, env = "VMWARDEN_RUNTIME_ROOT", default_value = DEFAULT_RUNTIME_ROOT, value_name = "DIR", global = true)]
    pub runtime_root: PathBuf,
    /// State root: one persistent, principal-owned directory per VM.
    #[arg(long, env = "VMWARDEN_STATE_ROOT", default_value = DEFAULT_STATE_ROOT, value_name = "DIR", global = true)]
    pub state_root: PathBuf,
}

impl RootArgs {
    pub fn roots(&self) -> Roots {
        Roots {
            config_dir: self.config_dir.clone(),
            runtime_root: self.runtime_root.clone(),
            state_root: self.state_root.clone(),
        }
    }
}

/// `--quiet`: warnings and errors only. Without it the log filter is
/// `VMWARDEN_LOG`, else `RUST_LOG`, else `info` (see docs/operating.md).
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct LogArgs {
    /// Log warnings and errors only (overrides VMWARDEN_LOG and RUST_LOG).
    #[arg(short, long, global = true)]
    pub quiet: bool,
}

impl LogArgs {
    /// Set up logging from the flag and the environment as it is now:
    /// to the journal's native protocol when stderr is the journal, each
    /// entry naming VM `vm` (`VMWARDEN_VM=`), else plain text on stderr.
    pub fn init(&self, ident: &str, vm: Option<&str>) {
        let vmwarden_log = std::env::var("VMWARDEN_LOG").ok();
        let rust_log = std::env::var("RUST_LOG").ok();
        let stream = std::env::var("JOURNAL_STREAM").ok();
        vmwarden::init_logging_for(
            &vmwarden::log_filter(self.quiet, vmwarden_log.as_deref(), rust_log.as_deref()),
            &vmwarden::log_target(ident, vm, stream.as_deref()),
        );
    }
}
