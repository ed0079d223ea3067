//! vmwarden: run each microVM as its own principal, in its own mount
//! namespace, with its credentials on a noswap tmpfs only it can see — and
//! prove after every stop that nothing was left behind.
//!
//! The three binaries (`vmwarden-launch`, `vmwarden-cleanup`, `vmwarden`)
//! share this library: destructive commands use the same ownership and
//! liveness code as the launcher.

use tracing::level_filters::LevelFilter;

pub mod config;
pub mod control;
pub mod error;
pub mod host;
pub mod hypervisor;
pub mod identity;
pub mod instance;
pub mod launch;
pub mod profile;
pub mod status;
pub mod teardown;
pub mod unit;

pub use error::{Error, Result};

// The unwinder linked in, as `gcc -static-libgcc` does, instead of
// `libgcc_s.so.1`: std names libgcc_s, but a library listed before it
// resolves its symbols first and `--as-needed` then drops it. Loading
// libgcc_s and running its constructor (CPUID, which traps under a
// hypervisor) cost every start of every binary ~0.15 ms here, about half
// of what a Rust binary's start costs over `/bin/true`. No code is
// needed from it: the `extern` block only names the archive to link.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[link(name = "gcc_eh", kind = "static", modifiers = "-bundle")]
extern "C" {}

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

/// The log filter: `--quiet` (warnings and errors only) wins; otherwise
/// `VMWARDEN_LOG`, else `RUST_LOG` (either in `tracing`'s `EnvFilter`
/// syntax, e.g. `debug`), else `info`. `VMWARDEN_LOG` is the name the units
/// and older installations use; `RUST_LOG` is what Rust tools take.
pub fn log_filter(quiet: bool, vmwarden_log: Option<&str>, rust_log: Option<&str>) -> String {
    let set = |v: Option<&str>| {
        v.map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    if quiet {
        return "warn".into();
    }
    set(vmwarden_log)
        .or_else(|| set(rust_log))
        .unwrap_or_else(|| "info".into())
}

/// Set up `tracing` to stderr (the journal, under systemd) with `filter`
/// (see [`log_filter`]; an unparsable filter falls back to `info`). A bare
/// level (the usual case: `info`) needs no directive parser, which every
/// start of every binary would otherwise run.
pub fn init_logging(filter: &str) {
    let fmt = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time();
    let _ = match filter.trim().parse::<LevelFilter>() {
        Ok(level) => fmt.with_max_level(level).try_init(),
        Err(_) => {
            let f = tracing_subscriber::EnvFilter::try_new(filter)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
            fmt.with_env_filter(f).try_init()
        }
    };
}

#[cfg(test)]
mod tests {
    use super::log_filter;

    #[test]
    fn quiet_wins_then_vmwarden_log_then_rust_log_then_info() {
        assert_eq!(log_filter(true, Some("debug"), Some("trace")), "warn");
        assert_eq!(log_filter(false, Some("debug"), Some("trace")), "debug");
        assert_eq!(log_filter(false, None, Some("trace")), "trace");
        assert_eq!(log_filter(false, Some(" "), Some("trace")), "trace");
        assert_eq!(log_filter(false, None, None), "info");
    }
}
