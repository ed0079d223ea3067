//! The console relay (`console: true`): the one process between the
//! hypervisor's serial port and the world, so that the guest's serial
//! output reaches the journal *and* an attachable console.
//!
//! The hypervisor keeps its usual serial (QEMU `-serial stdio`,
//! cloud-hypervisor `--serial tty`), but its stdin and stdout are one end
//! of a socket pair instead of `/dev/null` and the journal. The relay, forked
//! here (after the credential tmpfs, before the launcher's own drop) and
//! run as the VM's principal, holds the other end and:
//! * copies every byte the guest prints to its own stdout — the unit's
//!   journal stream, so the serial lines keep the unit's fields — whether
//!   or not anyone is attached;
//! * accepts one connection at a time on `control/console.sock`, bound by
//!   root (root's, mode 0600, as QMP's: only root connects) and handed over
//!   as an fd the relay listens on once it is the principal (so that
//!   `vmwarden console` finds the principal as its peer, as for QMP); it copies the guest's output to that connection
//!   and the connection's bytes to the guest. A second connection while
//!   one is attached is told so and closed; a connection that does not
//!   keep up is dropped, never waited for.
//!
//! It runs no other program: after the drop it applies a Landlock domain
//! that grants no file access at all and the launcher's seccomp filter,
//! closes every fd but its four, and loops in [`relay`] until the guest's
//! side closes (the hypervisor exited) or its death signal comes (it is
//! the hypervisor's child: `PR_SET_PDEATHSIG(SIGKILL)`, like the helpers).

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;
use nix::sys::socket::{
    accept4, listen, send, socketpair, AddressFamily, Backlog, MsgFlags, SockFlag, SockType,
};
use nix::unistd::{ForkResult, Pid};

use crate::config::paths::CONSOLE_SOCKET;
use crate::host::dirs::Dir;
use crate::host::sys::{SysContext, SysError};
use crate::identity::principal::Principal;
use crate::launch::helpers::{self, Context, HelperError};
use crate::launch::{landlock, reach, sandbox, seccomp};

/// What the relay says to a second console while one is attached.
pub const BUSY: &[u8] =
    b"\r\nvmwarden: this VM's console is attached elsewhere; detach that one first (Ctrl-])\r\n";
/// Bytes of the operator's input held for a guest that does not read.
const MAX_PENDING_INPUT: usize = 64 * 1024;
const NAME: &str = "console relay";

/// A started relay: its pid and the hypervisor's end of the serial pair
/// (to become the hypervisor's stdin and stdout).
#[derive(Debug)]
pub struct Relay {
    pub pid: Pid,
    pub hypervisor_end: OwnedFd,
}

fn sys_err(source: SysError) -> HelperError {
    HelperError::Sys {
        helper: NAME.into(),
        source,
    }
}

fn setup_err(detail: String) -> HelperError {
    HelperError::Setup {
        helper: NAME.into(),
        binary: helpers::OWN_CODE.into(),
        detail,
    }
}

/// Bind `control/console.sock` (root's, 0600), fork the relay and wait
/// until it is confined. Called where the helpers start.
pub fn start(ctx: &Context<'_>, control: &Dir) -> Result<Relay, HelperError> {
    let path = control.path.join(CONSOLE_SOCKET);
    // Bound by root, listened on by the relay after its drop: a client's
    // SO_PEERCRED is the listener's at listen(2), and `vmwarden console`
    // checks that it is the VM's principal (`host::peer::connect`), as
    // for QMP.
    let listener = helpers::bind_unix(control, &path).map_err(sys_err)?;
    let (relay_end, hypervisor_end) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .sys("socketpair", &path)
    .map_err(sys_err)?;
    let (status_r, status_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)
        .sys("pipe2", &path)
        .map_err(sys_err)?;
    let principal = Principal {
        groups: Vec::new(),
        ..ctx.principal.clone()
    };
    let parent = nix::unistd::getpid();
    ctx.sys
        .assert_single_threaded()
        .map_err(|e| setup_err(e.to_string()))?;
    // SAFETY: the launcher is single-threaded (checked just above), so the
    // child is a complete copy with no lock held by another thread; it runs
    // only the launcher's own code and ends with _exit.
    match unsafe { nix::unistd::fork() }
        .sys("fork", &path)
        .map_err(sys_err)?
    {
        ForkResult::Child => {
            drop(status_r);
            drop(hypervisor_end);
            let keep = [
                relay_end.as_raw_fd(),
                listener.as_raw_fd(),
                status_w.as_raw_fd(),
            ];
            let confined = confine(ctx, &principal, parent, &keep).and_then(|()| {
                listen(&listener, Backlog::new(2).unwrap_or(Backlog::MAXCONN))
                    .map_err(|e| format!("listen on {}: {e}", path.display()))
            });
            if let Err(msg) = confined {
                let _ = nix::unistd::write(&status_w, msg.as_bytes());
                // SAFETY: _exit ends this forked child at once, without the
                // parent's atexit handlers or buffers.
                unsafe { libc::_exit(127) }
            }
            // Confined: the parent's read of the status pipe ends here.
            drop(status_w);
            reach::try_all("console-relay");
            relay(
                relay_end.as_fd(),
                listener.as_fd(),
                std::io::stdout().as_fd(),
            );
            // SAFETY: as above.
            unsafe { libc::_exit(0) }
        }
        ForkResult::Parent { child } => {
            drop(status_w);
            drop(relay_end);
            drop(listener);
            let mut msg = Vec::new();
            let mut buf = [0u8; 512];
            loop {
                match nix::unistd::read(&status_r, &mut buf) {
                    Ok(0) => break,
                    Ok(n) => msg.extend_from_slice(&buf[..n]),
                    Err(Errno::EINTR) => {}
                    Err(_) => break,
                }
            }
            if !msg.is_empty() {
                let _ = nix::sys::wait::waitpid(child, None);
                return Err(setup_err(String::from_utf8_lossy(&msg).into_owned()));
            }
            Ok(Relay {
                pid: child,
                hypervisor_end,
            })
        }
    }
}

/// The child's confinement: the principal, the death signal, no file
/// access (Landlock), the launcher's seccomp filter, no other fd.
fn confine(
    ctx: &Context<'_>,
    principal: &Principal,
    parent: Pid,
    keep: &[RawFd],
) -> Result<(), String> {
    nix::unistd::chdir("/").map_err(|e| format!("chdir /: {e}"))?;
    sandbox::drop_privileges_with(ctx.sys, principal).map_err(|e| e.to_string())?;
    nix::sys::prctl::set_pdeathsig(Some(Signal::SIGKILL))
        .map_err(|e| format!("prctl(PR_SET_PDEATHSIG): {e}"))?;
    if nix::unistd::getppid() != parent {
        return Err("the launcher died while the console relay was starting".into());
    }
    // A write to a closed console connection is an error, not a signal.
    // SAFETY: setting SIGPIPE's disposition to ignore installs no handler.
    unsafe { nix::sys::signal::signal(Signal::SIGPIPE, nix::sys::signal::SigHandler::SigIgn) }
        .map_err(|e| format!("signal(SIGPIPE): {e}"))?;
    sandbox::close_all_but(keep)?;
    let policy = landlock::Policy {
        rules: Vec::new(),
        vm_trees: Vec::new(),
        signals_unscoped: false,
        no_new_privs_set: true,
        ..Default::default()
    };
    ctx.sys
        .landlock_restrict(&policy, ctx.landlock)
        .map_err(|e| e.to_string())?;
    seccomp::apply(ctx.sys, ctx.seccomp).map_err(|e| e.to_string())?;
    Ok(())
}

/// The relay's loop: guest → `journal` (always) and the attached console;
/// console → guest. Returns when the guest's side closes.
pub fn relay(guest: BorrowedFd<'_>, listener: BorrowedFd<'_>, journal: BorrowedFd<'_>) {
    let _ = nix::fcntl::fcntl(guest, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK));
    let mut journal = std::fs::File::from(match journal.try_clone_to_owned() {
        Ok(fd) => fd,
        Err(_) => return,
    });
    let mut client: Option<OwnedFd> = None;
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let mut guest_events = PollFlags::POLLIN;
        if !pending.is_empty() {
            guest_events |= PollFlags::POLLOUT;
        }
        let client_events = if pending.len() < MAX_PENDING_INPUT {
            PollFlags::POLLIN
        } else {
            PollFlags::empty()
        };
        let mut fds = vec![
            PollFd::new(guest, guest_events),
            PollFd::new(listener, PollFlags::POLLIN),
        ];
        if let Some(c) = &client {
            fds.push(PollFd::new(c.as_fd(), client_events));
        }
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(Errno::EINTR) => continue,
            Err(_) => return,
        }
        let revents: Vec<PollFlags> = fds
            .iter()
            .map(|f| f.revents().unwrap_or(PollFlags::empty()))
            .collect();
        drop(fds);
        let hup = PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR;
        // Guest output: to the journal first, then to the console.
        if revents[0].intersects(hup) {
            match nix::unistd::read(guest, &mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    let _ = journal.write_all(&buf[..n]);
                    if let Some(c) = &client {
                        let sent = send(
                            c.as_raw_fd(),
                            &buf[..n],
                            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
                        );
                        if sent != Ok(n) {
                            // Too slow, or gone: dropped, never waited for.
                            client = None;
                        }
                    }
                }
                Err(Errno::EINTR | Errno::EAGAIN) => {}
                Err(_) => return,
            }
        }
        if revents[0].contains(PollFlags::POLLOUT) && !pending.is_empty() {
            match nix::unistd::write(guest, &pending) {
                Ok(n) => {
                    pending.drain(..n);
                }
                Err(Errno::EINTR | Errno::EAGAIN) => {}
                Err(_) => return,
            }
        }
        if revents[1].contains(PollFlags::POLLIN) {
            if let Ok(fd) = accept4(
                listener.as_raw_fd(),
                SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            ) {
                // SAFETY: accept4 returned a new fd that nothing else owns.
                let conn = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
                if client.is_some() {
                    let _ = send(
                        conn.as_raw_fd(),
                        BUSY,
                        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
                    );
                } else {
                    client = Some(conn);
                }
            }
        }
        if let (Some(c), Some(r)) = (&client, revents.get(2)) {
            if r.intersects(hup) {
                match nix::unistd::read(c, &mut buf) {
                    Ok(0) => client = None,
                    Ok(n) => pending.extend_from_slice(&buf[..n]),
                    Err(Errno::EINTR | Errno::EAGAIN) => {}
                    Err(_) => client = None,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::{UnixListener, UnixStream};

    /// The relay's loop on real sockets: guest output reaches the journal
    /// with nobody attached and both once one is; input reaches the guest;
    /// a second console is told it is busy; the guest closing ends it.
    #[test]
    fn guest_output_reaches_the_journal_always_and_the_console_when_attached() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("console.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let (guest_relay, mut guest) = UnixStream::pair().unwrap();
        let (journal_w, mut journal_r) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || {
            relay(guest_relay.as_fd(), listener.as_fd(), journal_w.as_fd());
        });
        guest.write_all(b"boot line\n").unwrap();
        let mut got = [0u8; 64];
        let n = journal_r.read(&mut got).unwrap();
        assert_eq!(&got[..n], b"boot line\n");
        let mut console = UnixStream::connect(&sock).unwrap();
        // The relay accepts before the guest's next bytes are polled.
        std::thread::sleep(std::time::Duration::from_millis(100));
        guest.write_all(b"login: ").unwrap();
        let n = console.read(&mut got).unwrap();
        assert_eq!(&got[..n], b"login: ");
        let n = journal_r.read(&mut got).unwrap();
        assert_eq!(&got[..n], b"login: ");
        console.write_all(b"root\r").unwrap();
        let n = guest.read(&mut got).unwrap();
        assert_eq!(&got[..n], b"root\r");
        let mut second = UnixStream::connect(&sock).unwrap();
        let n = second.read(&mut got).unwrap();
        assert!(BUSY.starts_with(&got[..n]) && n > 0);
        drop(console);
        drop(guest);
        t.join().unwrap();
    }
}
