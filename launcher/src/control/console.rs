//! `vmwarden console NAME`: root's terminal attached to the guest's serial
//! console, through the VM's console relay (`launch::console`).
//!
//! This is the one place where the VM's bytes reach root's terminal
//! unescaped: the operator asked for them. Everything else vmwarden shows
//! of a VM (status, errors, reports) is escaped. Ctrl-] detaches (as
//! `virsh console` and `telnet`); the VM runs on, and the journal keeps
//! its copy of the serial output whether or not anyone is attached.

use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::termios::{self, SetArg, Termios};

use crate::config::names::VmName;
use crate::config::paths::Roots;
use crate::host::peer::{self, PeerError};
use crate::instance::launched::effective_spec_of;
use crate::instance::liveness::{Probe, Verdict};

/// The byte that detaches: Ctrl-] (GS), as `virsh console`.
pub const DETACH: u8 = 0x1d;
/// How the detach key is named to the operator.
pub const DETACH_NAME: &str = "Ctrl-]";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    #[error("VM {name} is not running ({reason}); a console is attached to a running VM")]
    NotRunning { name: String, reason: String },
    #[error("VM {name} has no console to attach to: its launched spec has no `console: true` (NixOS: vmwarden.vms.{name}.console, on by default for qemu and cloud-hypervisor); set it and restart the VM, or read its serial output with journalctl -u microvm@{name}")]
    NoConsole { name: String },
    #[error("VM {name}: cannot attach to its console {sock}: {source}")]
    Connect {
        name: String,
        sock: PathBuf,
        #[source]
        source: PeerError,
    },
    #[error("VM {name}: console: {op}: {source}")]
    Io {
        name: String,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// How an attached console ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The operator pressed [`DETACH`]; the VM runs on.
    Detached,
    /// The relay closed the connection (the VM stopped, or another
    /// console was attached first: the relay said so).
    Closed,
    /// Standard input ended (not a terminal: a script's input ran out).
    InputEnded,
}

/// Puts a terminal in raw mode and restores it when dropped.
struct RawMode<'a> {
    fd: BorrowedFd<'a>,
    saved: Termios,
}

impl<'a> RawMode<'a> {
    fn enter(fd: BorrowedFd<'a>) -> Option<RawMode<'a>> {
        let saved = termios::tcgetattr(fd).ok()?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(fd, SetArg::TCSANOW, &raw).ok()?;
        Some(RawMode { fd, saved })
    }
}

impl Drop for RawMode<'_> {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(self.fd, SetArg::TCSANOW, &self.saved);
    }
}

/// Connect to VM `name`'s console relay (its peer must be the VM's
/// principal, as for QMP: `host::peer::connect`).
pub fn connect(roots: &Roots, name: &VmName) -> Result<UnixStream, ConsoleError> {
    let verdict = Probe::single().probe(roots, name);
    if !matches!(verdict, Verdict::Live(_)) {
        return Err(ConsoleError::NotRunning {
            name: name.to_string(),
            reason: verdict.reason(),
        });
    }
    if !effective_spec_of(roots, name).is_some_and(|(s, _)| s.console) {
        return Err(ConsoleError::NoConsole {
            name: name.to_string(),
        });
    }
    let sock = roots.console_socket(name);
    peer::connect(&sock, CONNECT_TIMEOUT).map_err(|source| ConsoleError::Connect {
        name: name.to_string(),
        sock,
        source,
    })
}

/// Copy `input` to the console and the console to `output` until the
/// operator detaches, the relay closes or the input ends. A terminal
/// `input` is put in raw mode for the while (every key goes to the guest,
/// Ctrl-C included) and restored after.
pub fn attach(
    name: &VmName,
    mut conn: UnixStream,
    input: BorrowedFd<'_>,
    output: &mut dyn Write,
) -> Result<Ended, ConsoleError> {
    let io = |op| {
        move |source| ConsoleError::Io {
            name: name.to_string(),
            op,
            source,
        }
    };
    let _raw = RawMode::enter(input);
    let mut buf = [0u8; 4096];
    loop {
        let mut fds = [
            PollFd::new(conn.as_fd(), PollFlags::POLLIN),
            PollFd::new(input, PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(io("poll")(e.into())),
        }
        let wake = PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR;
        let ready: Vec<bool> = fds
            .iter()
            .map(|f| f.revents().is_some_and(|r| r.intersects(wake)))
            .collect();
        if ready[0] {
            let n = match conn.read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => 0,
            };
            if n == 0 {
                return Ok(Ended::Closed);
            }
            // The guest's bytes, unescaped: the operator asked for them.
            output
                .write_all(&buf[..n])
                .map_err(io("write to the terminal"))?;
            output.flush().map_err(io("write to the terminal"))?;
        }
        if ready[1] {
            let n = match nix::unistd::read(input, &mut buf) {
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(io("read the terminal")(e.into())),
            };
            if n == 0 {
                return Ok(Ended::InputEnded);
            }
            let chunk = &buf[..n];
            let (send, detach) = match chunk.iter().position(|&b| b == DETACH) {
                Some(i) => (&chunk[..i], true),
                None => (chunk, false),
            };
            conn.write_all(send).map_err(io("write to the console"))?;
            if detach {
                return Ok(Ended::Detached);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_detach_key_ends_the_session_and_what_came_before_it_is_sent() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (r, w) = nix::unistd::pipe().unwrap();
        nix::unistd::write(&w, b"ls\r\x1dignored").unwrap();
        let mut out = Vec::new();
        let name = VmName::parse("web").unwrap();
        let ended = attach(&name, ours, r.as_fd(), &mut out).unwrap();
        assert_eq!(ended, Ended::Detached);
        let mut got = [0u8; 16];
        theirs.set_nonblocking(true).unwrap();
        let n = (&theirs).read(&mut got).unwrap();
        assert_eq!(&got[..n], b"ls\r");
    }

    #[test]
    fn the_guests_bytes_reach_the_output_as_they_are_and_a_close_ends_it() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let (r, _w) = nix::unistd::pipe().unwrap();
        theirs.write_all(b"login: \x1b[1mx\x1b[0m\r\n").unwrap();
        drop(theirs);
        let mut out = Vec::new();
        let name = VmName::parse("web").unwrap();
        assert_eq!(
            attach(&name, ours, r.as_fd(), &mut out).unwrap(),
            Ended::Closed
        );
        assert_eq!(out, b"login: \x1b[1mx\x1b[0m\r\n");
    }
}
