//! systemd-machined, as `machinectl` sees it: register a VM (class `vm`,
//! leader the process that becomes the hypervisor), ask for a machine's
//! leader, end a registration.
//!
//! The calls themselves ([`bus`], `zbus`'s blocking API on the system bus:
//! no hand-written protocol, no `busctl`) run in a binary of their own,
//! `vmwarden-machined`, beside the caller's own executable: zbus runs an
//! executor thread per connection, which the launcher must never have
//! (`Syscall::assert_single_threaded` before every fork and the drop), and
//! it is most of a megabyte of code whose relocations every start of the
//! launcher, cleanup and `vmwarden` would pay (+0.2 ms CPU each, measured
//! with `bench --compare`) although few VMs register. The caller walks
//! that binary like a hypervisor's (root's alone, every directory on the
//! way too), forks, and the child closes every other descriptor, points
//! stdout at a pipe and `fexecve`s the walked file with an empty
//! environment. The binary prints one line; the parent reads it within
//! [`DEADLINE`] and kills the child after.

pub mod bus;

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;
use nix::sys::wait::waitpid;
use nix::unistd::ForkResult;

use crate::config::names::VmName;
use crate::host::trust::{self, Policy};

/// `close_range`'s flags argument is an int (libc declares the flag, 1 << 2,
/// unsigned).
#[allow(clippy::cast_possible_wrap)]
const CLOSE_RANGE_CLOEXEC: libc::c_int = libc::CLOSE_RANGE_CLOEXEC as libc::c_int;

/// The binary that makes the bus calls, beside the caller's executable.
pub const BINARY: &str = "vmwarden-machined";
/// How long one call may take, bus connection included.
pub const DEADLINE: Duration = Duration::from_secs(10);
/// The `service` a vmwarden registration names (`machinectl status`).
pub const SERVICE: &str = "vmwarden";
pub(crate) const DEST: &str = "org.freedesktop.machine1";
pub(crate) const PATH: &str = "/org/freedesktop/machine1";
pub(crate) const MANAGER: &str = "org.freedesktop.machine1.Manager";
pub(crate) const MACHINE: &str = "org.freedesktop.machine1.Machine";
pub(crate) const NO_SUCH_MACHINE: &str = "org.freedesktop.machine1.NoSuchMachine";
/// What the bus answers when nothing owns machined's name and nothing
/// can activate it.
pub(crate) const ABSENT: &[&str] = &[
    "org.freedesktop.DBus.Error.ServiceUnknown",
    "org.freedesktop.DBus.Error.NameHasNoOwner",
    "org.freedesktop.systemd1.NoSuchUnit",
];

#[derive(Debug, thiserror::Error)]
pub enum MachinedError {
    /// No system bus, or no systemd-machined on it.
    #[error("systemd-machined is not reachable on the system bus ({detail}); install and enable it (Debian: systemd-container; NixOS has it), or turn registration off (register_with_machined, NixOS registerWithMachined)")]
    Unavailable { detail: String },
    /// machined answered with an error (a machine of that name exists, …).
    #[error("systemd-machined refused to {what} machine {name}: {detail}")]
    Refused {
        what: &'static str,
        name: String,
        detail: String,
    },
    #[error("systemd-machined: {what} machine {name}: no answer within {secs} s")]
    Timeout {
        what: &'static str,
        name: String,
        secs: u64,
    },
    #[error("systemd-machined: {what} machine {name}: {detail}")]
    Child {
        what: &'static str,
        name: String,
        detail: String,
    },
}

impl MachinedError {
    /// The host has no machined: starting again will not help.
    pub fn is_refusal(&self) -> bool {
        matches!(self, MachinedError::Unavailable { .. })
    }
}

/// `vmwarden-machined` beside this process's executable.
fn binary() -> Result<PathBuf, String> {
    let exe = std::fs::read_link("/proc/self/exe")
        .map_err(|e| format!("cannot read /proc/self/exe: {e}"))?;
    let dir = exe
        .parent()
        .ok_or_else(|| format!("{} has no directory", exe.display()))?;
    Ok(dir.join(BINARY))
}

/// Run `vmwarden-machined ARGS` and read its one line (see [`bus::line`]).
fn call(what: &'static str, name: &str, args: &[&str]) -> Result<String, MachinedError> {
    let child_err = |detail: String| MachinedError::Child {
        what,
        name: name.to_string(),
        detail,
    };
    let path = binary().map_err(child_err)?;
    // Root runs it: root's alone, as a hypervisor binary is.
    let walked = trust::regular_file(&path, Policy::Executable)
        .map_err(|e| child_err(format!("{BINARY} not trusted: {e}")))?;
    let cstr = |s: &str| CString::new(s).map_err(|_| child_err(format!("{s:?} holds a NUL")));
    let mut argv = vec![cstr(BINARY)?];
    for a in args {
        argv.push(cstr(a)?);
    }
    let env: [CString; 0] = [];
    let (r, w) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| child_err(format!("pipe2: {e}")))?;
    // SAFETY: every caller is single-threaded (the launcher checks it
    // before each fork; cleanup and `vmwarden` start no thread), so the
    // child is a complete copy; it execs or ends with _exit.
    match unsafe { nix::unistd::fork() }.map_err(|e| child_err(format!("fork: {e}")))? {
        ForkResult::Child => {
            drop(r);
            // stdout is the pipe; nothing else of the caller's (its
            // lease, taps, sockets) reaches the binary.
            // SAFETY: dup2 onto fd 1 of this child; `w` stays valid.
            if unsafe { libc::dup2(w.as_raw_fd(), 1) } == 1 {
                // SAFETY: marks every descriptor of this child from 3 up
                // close-on-exec (none is closed before the exec, so
                // `walked.fd`, which the exec reads, stays valid); only
                // 0-2 reach the binary.
                let closed = unsafe { libc::close_range(3, u32::MAX, CLOSE_RANGE_CLOEXEC) };
                if closed == 0 {
                    let _ = nix::unistd::fexecve(walked.fd.as_fd(), &argv, &env);
                }
            }
            let _ = nix::unistd::write(&w, b"err cannot start vmwarden-machined");
            // SAFETY: ends the child without the parent's atexit handlers.
            unsafe { libc::_exit(127) }
        }
        ForkResult::Parent { child } => {
            drop(w);
            drop(walked);
            let end = Instant::now() + DEADLINE;
            let mut out = Vec::new();
            let mut buf = [0u8; 1024];
            let done = loop {
                let left = end.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break false;
                }
                let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
                let mut fds = [PollFd::new(r.as_fd(), PollFlags::POLLIN)];
                match poll(&mut fds, PollTimeout::from(ms)) {
                    Ok(0) | Err(Errno::EINTR) => continue,
                    Ok(_) => {}
                    Err(e) => return Err(child_err(format!("poll: {e}"))),
                }
                match nix::unistd::read(&r, &mut buf) {
                    Ok(0) => break true,
                    Ok(n) if out.len() < 64 * 1024 => out.extend_from_slice(&buf[..n]),
                    Ok(_) => break true,
                    Err(Errno::EINTR) => {}
                    Err(e) => return Err(child_err(format!("read: {e}"))),
                }
            };
            if !done {
                let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
            }
            let _ = waitpid(child, None);
            if !done {
                return Err(MachinedError::Timeout {
                    what,
                    name: name.to_string(),
                    secs: DEADLINE.as_secs(),
                });
            }
            let line = String::from_utf8_lossy(&out).to_string();
            match Reply::parse(&line) {
                Reply::Ok(p) => Ok(p),
                Reply::Absent(detail) => Err(MachinedError::Unavailable { detail }),
                Reply::Err(detail) => Err(MachinedError::Refused {
                    what,
                    name: name.to_string(),
                    detail,
                }),
                Reply::Garbled => Err(child_err(format!("{BINARY} reported nothing ({line:?})"))),
            }
        }
    }
}

/// The one line `vmwarden-machined` prints, read back: `ok[ PAYLOAD]`
/// (a call with nothing to say, register or unregister, prints a bare
/// `ok`), `absent DETAIL`, `err DETAIL`.
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    Ok(String),
    Absent(String),
    Err(String),
    Garbled,
}

impl Reply {
    fn parse(line: &str) -> Reply {
        let line = line.trim_end();
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        match word {
            "ok" => Reply::Ok(rest.to_string()),
            "absent" => Reply::Absent(rest.to_string()),
            "err" => Reply::Err(rest.to_string()),
            _ => Reply::Garbled,
        }
    }
}

/// Register VM `name` with `leader` as its leader: machined takes the
/// leader's unit (its cgroup) as the machine's unit, and ends the
/// registration when that unit stops.
pub fn register(name: &str, leader: u32) -> Result<(), MachinedError> {
    call("register", name, &["register", name, &leader.to_string()]).map(drop)
}

/// A machine as machined lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    pub leader: u32,
    /// Who registered it (`vmwarden` for a vmwarden VM, `nspawn`, …).
    pub service: String,
}

/// Machine `name`, or `None` when machined has no such machine.
pub fn machine(name: &str) -> Result<Option<Machine>, MachinedError> {
    let out = call("look up", name, &["machine", name])?;
    if out.starts_with("none") {
        return Ok(None);
    }
    let (leader, service) = out.trim().split_once(' ').unwrap_or((out.trim(), ""));
    let leader = leader.parse().map_err(|_| MachinedError::Child {
        what: "look up",
        name: name.to_string(),
        detail: format!("leader {leader:?} is not a pid"),
    })?;
    Ok(Some(Machine {
        leader,
        service: service.to_string(),
    }))
}

/// End the registration of machine `name`; no process is signalled. A
/// machine that is already gone is not an error.
pub fn unregister(name: &str) -> Result<(), MachinedError> {
    call("unregister", name, &["unregister", name]).map(drop)
}

/// Ask systemd to start `PREFIX@NAME.service` (no wait for the job: the
/// unit's own `ExecStartPost=` waits for the VM). `prefix` is one
/// `units/unit-names.toml` knows; the unit name is built here, from parts
/// that are already checked, never taken whole from a caller.
pub fn start_vm_unit(prefix: &str, name: &VmName) -> Result<String, MachinedError> {
    call(
        "start the unit of",
        name.as_str(),
        &["start-vm-unit", prefix, name.as_str()],
    )
}

/// Ask systemd to stop `PREFIX@NAME.service` (no wait for the job), built
/// like [`start_vm_unit`]'s.
pub fn stop_vm_unit(prefix: &str, name: &VmName) -> Result<String, MachinedError> {
    call(
        "stop the unit of",
        name.as_str(),
        &["stop-vm-unit", prefix, name.as_str()],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_the_binary_prints_reads_back() {
        // The replies of register and unregister carry nothing: the line
        // is a bare `ok` once the newline is trimmed (the systemd suite's
        // ops VM failed on exactly that).
        assert_eq!(
            Reply::parse(&bus::line(Ok(String::new()))),
            Reply::Ok(String::new())
        );
        assert_eq!(Reply::parse("ok\n"), Reply::Ok(String::new()));
        assert_eq!(
            Reply::parse(&format!("{}\n", bus::line(Ok("42 vmwarden".into())))),
            Reply::Ok("42 vmwarden".into())
        );
        assert_eq!(Reply::parse("ok none gone"), Reply::Ok("none gone".into()));
        assert_eq!(
            Reply::parse("absent no system bus: x"),
            Reply::Absent("no system bus: x".into())
        );
        assert_eq!(Reply::parse("err denied"), Reply::Err("denied".into()));
        assert_eq!(Reply::parse(""), Reply::Garbled);
        assert_eq!(
            Reply::parse("err cannot start vmwarden-machined"),
            Reply::Err("cannot start vmwarden-machined".into())
        );
        assert_eq!(Reply::parse("okay"), Reply::Garbled);
    }

    #[test]
    fn a_host_without_machined_is_told_how_to_fix_it() {
        let e = MachinedError::Unavailable {
            detail: "org.freedesktop.DBus.Error.ServiceUnknown: …".into(),
        };
        let s = e.to_string();
        assert!(s.contains("systemd-machined is not reachable"), "{s}");
        assert!(s.contains("register_with_machined"), "{s}");
        assert!(e.is_refusal());
    }
}
