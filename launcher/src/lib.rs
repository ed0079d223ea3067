//! vmwarden: run each microVM as its own principal, in its own mount
//! namespace, with its credentials on a noswap tmpfs only it can see — and
//! prove after every stop that nothing was left behind.
//!
//! The three binaries (`vmwarden-launch`, `vmwarden-cleanup`, `vmwarden`)
//! share this library: destructive commands use the same ownership and
//! liveness code as the launcher.

use tracing::level_filters::LevelFilter;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

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
/// Every message and cause is one escaped line ([`config::text::escape`]):
/// errors quote what a VM wrote (a QMP answer, a file name).
fn report(msg: String, err: &dyn std::error::Error) {
    let mut msg = config::text::escape(&msg).into_owned();
    let mut src = err.source();
    while let Some(s) = src {
        let s_txt = config::text::escape(&s.to_string()).into_owned();
        if !msg.contains(&s_txt) {
            msg.push_str(&format!("\n  caused by: {s_txt}"));
        }
        src = s.source();
    }
    eprintln!("{msg}");
}

/// The log filter: `--quiet` (warnings and errors only) wins; otherwise
/// `VMWARDEN_LOG`, else `RUST_LOG` (either a level, `debug`, or a default
/// level and `target=level` pairs, `info,vmwarden=debug`: see
/// [`filter_targets`]), else `info`. `VMWARDEN_LOG` is the name the units
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

/// A filter that is more than a bare level: comma-separated `target=level`
/// directives and at most one bare default level (`info,vmwarden=debug`),
/// as `tracing-subscriber`'s `Targets` reads them: no span or field
/// filters, and so no regular-expression engine in every binary. One that
/// does not parse is `info`.
pub fn filter_targets(filter: &str) -> Targets {
    filter
        .trim()
        .parse::<Targets>()
        .unwrap_or_else(|_| Targets::new().with_default(LevelFilter::INFO))
}

/// stderr with every control character but the line break escaped
/// ([`config::text::escape_lines`]): a log line quotes paths and values a
/// VM, or a state dir's old owner, chose (tracing's own escaping leaves CR
/// and most C0 characters raw). One formatted event is one write.
struct EscapedStderr;

impl std::io::Write for EscapedStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        std::io::stderr().write_all(config::text::escape_lines(&text).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Set up `tracing` to stderr (the journal, under systemd) with `filter`
/// (see [`log_filter`]; an unparsable filter falls back to `info`). A bare
/// level (the usual case: `info`) needs no directive parser, which every
/// start of every binary would otherwise run.
pub fn init_logging(filter: &str) {
    let fmt = tracing_subscriber::fmt()
        .with_writer(|| EscapedStderr)
        .with_target(false)
        .without_time();
    let _ = match filter.trim().parse::<LevelFilter>() {
        Ok(level) => fmt.with_max_level(level).try_init().is_ok(),
        Err(_) => fmt
            .with_max_level(LevelFilter::TRACE)
            .finish()
            .with(filter_targets(filter))
            .try_init()
            .is_ok(),
    };
}

#[cfg(test)]
mod tests {
    use super::{filter_targets, log_filter};
    use tracing::Level;

    #[test]
    fn a_filter_with_targets_sets_each_target_and_the_default() {
        let t = filter_targets("info,vmwarden=debug");
        assert!(t.would_enable("vmwarden::launch", &Level::DEBUG));
        assert!(!t.would_enable("vmwarden::launch", &Level::TRACE));
        assert!(t.would_enable("other", &Level::INFO));
        assert!(!t.would_enable("other", &Level::DEBUG));
        // Unparsable: info.
        let bad = filter_targets("vmwarden=loud");
        assert!(bad.would_enable("vmwarden", &Level::INFO));
        assert!(!bad.would_enable("vmwarden", &Level::DEBUG));
    }

    #[test]
    fn quiet_wins_then_vmwarden_log_then_rust_log_then_info() {
        assert_eq!(log_filter(true, Some("debug"), Some("trace")), "warn");
        assert_eq!(log_filter(false, Some("debug"), Some("trace")), "debug");
        assert_eq!(log_filter(false, None, Some("trace")), "trace");
        assert_eq!(log_filter(false, Some(" "), Some("trace")), "trace");
        assert_eq!(log_filter(false, None, None), "info");
    }
}
