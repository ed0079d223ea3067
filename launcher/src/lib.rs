//! vmwarden: run each microVM as its own principal, in its own mount
//! namespace, with its credentials on a noswap tmpfs only it can see — and
//! prove after every stop that nothing was left behind.
//!
//! The three binaries (`vmwarden-launch`, `vmwarden-cleanup`, `vmwarden`; and
//! the internal `vmwarden-machined`, which holds the systemd-machined calls)
//! share this library: destructive commands use the same ownership and
//! liveness code as the launcher.

use std::os::fd::AsFd;

use tracing::level_filters::LevelFilter;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Layer as _, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

pub mod config;
pub mod control;
pub mod devices;
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
    if logging_to_journal() && journal_reachable() {
        // One entry, with the VM's field, at error priority.
        tracing::error!("{msg}");
    } else {
        eprintln!("{msg}");
    }
}

/// Whether this process can still send to journald's native socket. In
/// the VM's own root that path leads through `/proc/self/fd`, which a
/// process past its privilege drop (no longer dumpable) cannot follow:
/// an error of a late launch step would then be lost, so it goes to
/// stderr (the unit's journal stream) instead.
fn journal_reachable() -> bool {
    nix::unistd::access(launch::root::JOURNAL_SOCKET, nix::unistd::AccessFlags::W_OK).is_ok()
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
    init_logging_for(filter, &LogTarget::Stderr);
}

/// Where a binary's log lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogTarget {
    /// The plain text format on stderr.
    Stderr,
    /// stderr is the journal (systemd's `JOURNAL_STREAM` names stderr's
    /// device and inode): journald's native protocol, every entry with
    /// `SYSLOG_IDENTIFIER=ident` and, when the command is about one VM,
    /// `VMWARDEN_VM=NAME` (so `journalctl VMWARDEN_VM=web` finds the
    /// launcher's, cleanup's and the tools' lines of VM `web`). Event and
    /// span fields keep tracing-journald's `F_` prefix (`F_STEP=`).
    Journal { ident: String, vm: Option<String> },
}

/// The journal field every entry about one VM carries.
pub const JOURNAL_VM_FIELD: &str = "VMWARDEN_VM";

static JOURNAL_MODE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static STDOUT_JOURNAL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether stderr is the journal: `journal_stream` is `$JOURNAL_STREAM`
/// (`DEVICE:INODE`, which systemd sets for a unit whose stderr is the
/// journal) and it must be stderr's own device and inode — a child that
/// inherited the variable but not the stream writes plain text.
pub fn stderr_is_journal(journal_stream: Option<&str>) -> bool {
    is_journal(std::io::stderr().as_fd(), journal_stream)
}

fn is_journal(fd: std::os::fd::BorrowedFd<'_>, journal_stream: Option<&str>) -> bool {
    let Some((dev, ino)) = journal_stream.and_then(|v| v.trim().split_once(':')) else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<libc::dev_t>(), ino.parse::<libc::ino_t>()) else {
        return false;
    };
    match nix::sys::stat::fstat(fd) {
        Ok(st) => st.st_dev == dev && st.st_ino == ino,
        Err(_) => false,
    }
}

/// The log target for binary `ident` about VM `vm`, from `$JOURNAL_STREAM`.
pub fn log_target(ident: &str, vm: Option<&str>, journal_stream: Option<&str>) -> LogTarget {
    STDOUT_JOURNAL.store(
        is_journal(std::io::stdout().as_fd(), journal_stream),
        std::sync::atomic::Ordering::Relaxed,
    );
    if stderr_is_journal(journal_stream) {
        LogTarget::Journal {
            ident: ident.to_string(),
            vm: vm.map(str::to_string),
        }
    } else {
        LogTarget::Stderr
    }
}

/// [`init_logging`] to `target`. A journal that cannot be reached falls
/// back to stderr.
pub fn init_logging_for(filter: &str, target: &LogTarget) {
    if let LogTarget::Journal { ident, vm } = target {
        if let Ok(layer) = tracing_journald::Layer::new() {
            // The unit this process runs in, as OBJECT_SYSTEMD_UNIT=:
            // `journalctl -u UNIT` finds root's entries about a unit by it
            // even when journald could not read the cgroup of a process
            // that exited right after its last entry (cleanup, stop).
            let unit = host::cgroup::own_path().and_then(|p| {
                p.rsplit('/')
                    .next()
                    .filter(|u| u.ends_with(".service"))
                    .map(str::to_string)
            });
            let layer = layer
                .with_syslog_identifier(ident.clone())
                .with_custom_fields(vm.iter().map(|v| (JOURNAL_VM_FIELD, v.as_bytes())))
                .with_custom_fields(unit.iter().map(|u| ("OBJECT_SYSTEMD_UNIT", u.as_bytes())));
            let registry = tracing_subscriber::registry();
            let ok = match filter.trim().parse::<LevelFilter>() {
                Ok(level) => registry.with(layer.with_filter(level)).try_init().is_ok(),
                Err(_) => registry
                    .with(layer.with_filter(filter_targets(filter)))
                    .try_init()
                    .is_ok(),
            };
            if ok {
                JOURNAL_MODE.store(true, std::sync::atomic::Ordering::Relaxed);
                return;
            }
        }
    }
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

/// One error line on stderr, or an error entry when logging to the journal.
pub fn report_line(line: &str) {
    if logging_to_journal() {
        tracing::error!("{line}");
    } else {
        eprintln!("{line}");
    }
}

/// A line of a command's report (cleanup's JSON, `wait-ready`'s and
/// `stop`'s result): on stdout, or, when stdout is the journal too and log
/// lines go there natively, as one entry with the same fields as the log
/// lines (`VMWARDEN_VM=`), its message the line as stdout would have had it.
pub fn print_report(line: &str) {
    if logging_to_journal() && STDOUT_JOURNAL.load(std::sync::atomic::Ordering::Relaxed) {
        tracing::info!("{line}");
    } else {
        println!("{line}");
    }
}

/// Whether stdout was the journal (`$JOURNAL_STREAM` named it) when
/// logging was set up ([`log_target`]).
pub fn stdout_is_journal() -> bool {
    STDOUT_JOURNAL.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether log lines go to the journal's native protocol (then the error
/// reports do too, with the same fields).
pub fn logging_to_journal() -> bool {
    JOURNAL_MODE.load(std::sync::atomic::Ordering::Relaxed)
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
