//! systemd-machined, as `machinectl` sees it: register a VM (class `vm`,
//! leader the process that becomes the hypervisor), ask for a machine's
//! leader, end a registration. Through `zbus`'s blocking API on the system
//! bus: no hand-written protocol, no `busctl`.
//!
//! Every call runs in a forked child: zbus runs an executor thread per
//! connection, and the launcher must stay single-threaded up to its
//! privilege drop (`Syscall::assert_single_threaded` before every fork and
//! the drop). The child makes the call, writes one line of result to a
//! pipe and `_exit`s; the parent waits for it at most [`DEADLINE`] and
//! kills it after. The parent itself never links a thread into its life.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;
use nix::sys::wait::waitpid;
use nix::unistd::ForkResult;
use zbus::blocking::{Connection, Proxy};
use zbus::zvariant::OwnedObjectPath;

/// How long one call may take, bus connection included.
pub const DEADLINE: Duration = Duration::from_secs(10);
/// The `service` a vmwarden registration names (`machinectl status`).
pub const SERVICE: &str = "vmwarden";
const DEST: &str = "org.freedesktop.machine1";
const PATH: &str = "/org/freedesktop/machine1";
const MANAGER: &str = "org.freedesktop.machine1.Manager";
const MACHINE: &str = "org.freedesktop.machine1.Machine";
const NO_SUCH_MACHINE: &str = "org.freedesktop.machine1.NoSuchMachine";
/// What the bus answers when nothing owns machined's name and nothing
/// can activate it.
const ABSENT: &[&str] = &[
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

/// Why a call failed in the child: no bus to talk to at all, or an error
/// on it.
enum CallError {
    NoBus(zbus::Error),
    Call(zbus::Error),
}

impl From<zbus::Error> for CallError {
    fn from(e: zbus::Error) -> CallError {
        CallError::Call(e)
    }
}

/// What a child reports: `ok <payload>`, `absent <detail>`, `err <detail>`.
fn child_line(r: Result<String, CallError>) -> String {
    match r {
        Ok(p) => format!("ok {p}"),
        Err(CallError::NoBus(e)) => format!("absent no system bus: {e}"),
        Err(CallError::Call(zbus::Error::MethodError(name, msg, _)))
            if ABSENT.contains(&name.as_str()) =>
        {
            format!("absent {name}: {}", msg.unwrap_or_default())
        }
        Err(CallError::Call(zbus::Error::MethodError(name, msg, _)))
            if name.as_str() == NO_SUCH_MACHINE =>
        {
            format!("ok none {}", msg.unwrap_or_default())
        }
        Err(CallError::Call(zbus::Error::MethodError(name, msg, _))) => {
            format!("err {name}: {}", msg.unwrap_or_default())
        }
        Err(CallError::Call(e)) => format!("err {e}"),
    }
}

/// Run `call` in a forked child; its [`child_line`] back.
fn in_child(
    what: &'static str,
    name: &str,
    call: impl FnOnce() -> Result<String, CallError>,
) -> Result<String, MachinedError> {
    let child_err = |detail: String| MachinedError::Child {
        what,
        name: name.to_string(),
        detail,
    };
    let (r, w) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| child_err(format!("pipe2: {e}")))?;
    // SAFETY: every caller is single-threaded (the launcher checks it
    // before each fork; cleanup and `vmwarden` start no thread), so the
    // child is a complete copy; it ends with _exit.
    match unsafe { nix::unistd::fork() }.map_err(|e| child_err(format!("fork: {e}")))? {
        ForkResult::Child => {
            drop(r);
            let line = child_line(call());
            let _ = nix::unistd::write(&w, line.as_bytes());
            // SAFETY: ends the child without the parent's atexit handlers.
            unsafe { libc::_exit(0) }
        }
        ForkResult::Parent { child } => {
            drop(w);
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
            let line = String::from_utf8_lossy(&out).into_owned();
            if let Some(p) = line.strip_prefix("ok ") {
                Ok(p.to_string())
            } else if let Some(d) = line.strip_prefix("absent ") {
                Err(MachinedError::Unavailable {
                    detail: d.to_string(),
                })
            } else if let Some(d) = line.strip_prefix("err ") {
                Err(MachinedError::Refused {
                    what,
                    name: name.to_string(),
                    detail: d.to_string(),
                })
            } else {
                Err(child_err(format!("the child reported nothing ({line:?})")))
            }
        }
    }
}

/// The system bus; a failure to reach it at all (no socket, no daemon)
/// is the host having no machined.
fn system_bus() -> Result<Connection, CallError> {
    Connection::system().map_err(CallError::NoBus)
}

/// `RegisterMachine(name, id=[], service="vmwarden", class="vm", leader,
/// root_directory="")`: machined takes the leader's unit (its cgroup) as
/// the machine's unit, and ends the registration when that unit stops.
pub fn register(name: &str, leader: u32) -> Result<(), MachinedError> {
    in_child("register", name, || {
        let c = system_bus()?;
        c.call_method(
            Some(DEST),
            PATH,
            Some(MANAGER),
            "RegisterMachine",
            &(name, Vec::<u8>::new(), SERVICE, "vm", leader, ""),
        )?;
        Ok(String::new())
    })
    .map(drop)
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
    let out = in_child("look up", name, || {
        let c = system_bus()?;
        let m = c.call_method(Some(DEST), PATH, Some(MANAGER), "GetMachine", &(name,))?;
        let path: OwnedObjectPath = m.body().deserialize()?;
        let p = Proxy::new(&c, DEST, path, MACHINE)?;
        let leader: u32 = p.get_property("Leader")?;
        let service: String = p.get_property("Service")?;
        Ok(format!("{leader} {service}"))
    })?;
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

/// `UnregisterMachine(name)`: the registration ends; no process is
/// signalled. A machine that is already gone is not an error.
pub fn unregister(name: &str) -> Result<(), MachinedError> {
    in_child("unregister", name, || {
        let c = system_bus()?;
        c.call_method(
            Some(DEST),
            PATH,
            Some(MANAGER),
            "UnregisterMachine",
            &(name,),
        )?;
        Ok(String::new())
    })
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

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
