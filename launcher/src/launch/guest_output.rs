//! Where the guest's serial output goes: never to a stream that reads a
//! `<N>` at a line's start as the line's priority, never to a terminal.
//!
//! The guest's serial console is the hypervisor's stdout (QEMU
//! `-serial stdio`, cloud-hypervisor `--serial tty`, firecracker's serial),
//! or the console relay's, which copies it to its own stdout
//! ([`super::console`]); both inherit this process's fd 1. Under a unit
//! that is the unit's journal stream, whose `SyslogLevelPrefix=` (on by
//! default) makes journald take a line's leading `<0>` as its priority: a
//! guest could log as an emergency, which journald's `ForwardToWall=`
//! broadcasts to every logged-in terminal, escape sequences included.
//! `microvm@.service` sets `SyslogLevelPrefix=no`; this module makes the
//! same hold without that setting (a unit of someone else's, a drop-in):
//!
//! * stdout the journal (`$JOURNAL_STREAM` names it, or, with the
//!   environment wiped on the way, fd 1 is a stream to the listener behind
//!   journald's `stdout` socket): fd 1 becomes a
//!   stream of the launcher's own to journald's `stdout` socket, whose
//!   header (as `sd_journal_stream_fd` writes it) says priority
//!   [`PRIORITY`] and no level prefix. journald still files the lines
//!   under the unit (it reads the peer's cgroup), with the unit's
//!   identifier when the launcher runs in a `PREFIX@NAME.service`.
//! * stdout a terminal (a launch by hand at a shell): fd 1, and fd 0 when
//!   it is a terminal too, become `/dev/null`, with a warning. The guest's
//!   console on a terminal is `vmwarden console`.
//! * anything else (a pipe, a file): left as it is; the caller reads it.

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use crate::host::cgroup;
use crate::host::sys::{SysContext, SysError};

/// journald's socket for stdout streams.
pub const JOURNAL_STDOUT: &str = "/run/systemd/journal/stdout";
/// The priority of every line the guest prints: info, the unit's
/// `SyslogLevel=` (systemd's default, which `microvm@.service` keeps).
pub const PRIORITY: u8 = 6;

/// What [`guard`] did with fd 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Routed {
    /// A stream of the launcher's own to journald, without level prefixes.
    Journal { identifier: String },
    /// journald's socket could not be reached: `/dev/null` (with why).
    NullNoJournal(String),
    /// stdout (and maybe stdin) was a terminal: `/dev/null`.
    NullTerminal,
    /// A pipe or a file: left alone.
    Unchanged,
}

/// The header journald reads first on a stdout stream (journald-stream.c:
/// identifier, unit id, priority, level prefix, forward to syslog, to kmsg,
/// to the console; one line each).
pub fn stream_header(identifier: &str, priority: u8) -> Vec<u8> {
    // A newline in the identifier would shift every field after it.
    let identifier: String = identifier
        .chars()
        .map(|c| if c.is_control() { '_' } else { c })
        .collect();
    format!("{identifier}\n\n{priority}\n0\n0\n0\n0\n").into_bytes()
}

/// The identifier the guest's lines carry: the unit's
/// (`SyslogIdentifier=PREFIX@NAME`) when the launcher runs in
/// `PREFIX@NAME.service`, else the VM's name.
pub fn identifier(vm: &str, own_cgroup: Option<&str>) -> String {
    own_cgroup
        .and_then(|p| p.rsplit('/').next())
        .and_then(|u| u.strip_suffix(".service"))
        .filter(|u| {
            u.rsplit_once('@')
                .is_some_and(|(p, i)| !p.is_empty() && i == vm)
        })
        .map_or_else(|| vm.to_string(), str::to_string)
}

/// Route the guest's serial output (fd 1) as the module says.
/// `stdout_is_journal`: `$JOURNAL_STREAM` named stdout when logging was
/// set up (the environment is cleared since).
pub fn guard(vm: &str, stdout_is_journal: bool) -> Result<Routed, SysError> {
    let behind = if stdout_is_journal {
        None
    } else {
        journal_behind_stdout()
    };
    if stdout_is_journal || behind.is_some() {
        let identifier = identifier(vm, cgroup::own_path().as_deref());
        let stream = match behind {
            Some(s) => start_stream(s, &identifier, PRIORITY),
            None => journal_stream(&identifier, PRIORITY),
        };
        return match stream {
            Ok(s) => {
                replace(1, &OwnedFd::from(s))?;
                Ok(Routed::Journal { identifier })
            }
            Err(e) => {
                let why = format!("{JOURNAL_STDOUT}: {e}");
                replace(1, &dev_null()?)?;
                Ok(Routed::NullNoJournal(why))
            }
        };
    }
    if nix::unistd::isatty(std::io::stdout()).unwrap_or(false) {
        let null = dev_null()?;
        replace(1, &null)?;
        if nix::unistd::isatty(std::io::stdin()).unwrap_or(false) {
            replace(0, &null)?;
        }
        return Ok(Routed::NullTerminal);
    }
    Ok(Routed::Unchanged)
}

/// Log what [`guard`] did (a warning when the output goes nowhere).
pub fn report(r: &Routed) {
    match r {
        Routed::Journal { identifier } => tracing::info!(
            identifier = %identifier,
            priority = PRIORITY,
            "the guest's serial output goes to the journal at one priority, level prefixes off"
        ),
        Routed::NullNoJournal(why) => tracing::warn!(
            "the guest's serial output is discarded: stdout is the journal but a stream without level prefixes could not be opened ({why})"
        ),
        Routed::NullTerminal => tracing::warn!(
            "the guest's serial output is not written to this terminal (it could send escape sequences to it): use `vmwarden console` (console: true), or redirect stdout"
        ),
        Routed::Unchanged => {}
    }
}

/// A new stream to journald with `identifier` and `priority`, level
/// prefixes off; write-only, as `sd_journal_stream_fd` leaves it.
pub fn journal_stream(identifier: &str, priority: u8) -> std::io::Result<UnixStream> {
    start_stream(
        UnixStream::connect(Path::new(JOURNAL_STDOUT))?,
        identifier,
        priority,
    )
}

/// A new connection to journald's `stdout` socket when fd 1 is already a
/// stream to the same listener (its peer's credentials, as the listener's
/// at `listen(2)`, are the new connection's): the journal, though
/// `$JOURNAL_STREAM` did not say so (a unit's environment wiped on the
/// way: `sudo`, `env -i`, `UnsetEnvironment=`), whose header may turn
/// level prefixes on. `None` for anything else: not a socket, no journald.
fn journal_behind_stdout() -> Option<UnixStream> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let stdout = std::io::stdout();
    let theirs = getsockopt(&stdout.as_fd(), PeerCredentials).ok()?;
    let s = UnixStream::connect(Path::new(JOURNAL_STDOUT)).ok()?;
    let ours = getsockopt(&s, PeerCredentials).ok()?;
    (theirs.pid() == ours.pid() && theirs.uid() == ours.uid()).then_some(s)
}

/// Send the stream header on `s`, a new connection to journald's `stdout`
/// socket.
fn start_stream(mut s: UnixStream, identifier: &str, priority: u8) -> std::io::Result<UnixStream> {
    s.shutdown(std::net::Shutdown::Read)?;
    s.write_all(&stream_header(identifier, priority))?;
    Ok(s)
}

fn dev_null() -> Result<OwnedFd, SysError> {
    nix::fcntl::open(
        "/dev/null",
        OFlag::O_RDWR | OFlag::O_CLOEXEC | OFlag::O_NOCTTY,
        Mode::empty(),
    )
    .sys("open", "/dev/null")
}

/// Make `fd` (0 or 1) a copy of `with`, without close-on-exec.
fn replace(fd: i32, with: &OwnedFd) -> Result<(), SysError> {
    // SAFETY: dup2(2) on two integers: `with` is open and ours; fd 0 or 1
    // is not read or written through an owned handle in this process.
    if unsafe { libc::dup2(with.as_raw_fd(), fd) } < 0 {
        return Err(Errno::last()).sys("dup2 of the guest's serial output", JOURNAL_STDOUT);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_fixes_the_priority_and_turns_level_prefixes_off() {
        assert_eq!(
            stream_header("microvm@web", 6),
            b"microvm@web\n\n6\n0\n0\n0\n0\n".to_vec()
        );
        // A name cannot add a line to the header.
        assert_eq!(stream_header("a\nb", 6), b"a_b\n\n6\n0\n0\n0\n0\n".to_vec());
    }

    #[test]
    fn the_identifier_is_the_units_only_when_the_unit_is_the_vms() {
        let s = "/system.slice/system-microvm.slice/microvm@web.service";
        assert_eq!(identifier("web", Some(s)), "microvm@web");
        assert_eq!(
            identifier("web", Some("/system.slice/getty@tty1.service")),
            "web"
        );
        assert_eq!(
            identifier("web", Some("/user.slice/session-3.scope")),
            "web"
        );
        assert_eq!(identifier("web", None), "web");
    }
}
