//! The guest's notify messages, as the VMM side of `vmm.notify_socket`
//! reads them (`config::vmm_notify` says who gets one and why), and the
//! loop of the helper that reads them (`vmm-notify`, `launch::helpers`).
//!
//! systemd in the guest connects once per message (`vsock-stream:2:PORT`;
//! firecracker's hybrid vsock hands the connection to the listener at
//! `control/vsock.sock_PORT`), writes `KEY=VALUE` lines — newline-separated,
//! the last one without a newline — and closes, or (systemd 256 and later)
//! half-closes and waits until the host closes. The bytes are the guest's:
//! a connection is read for at most [`DEADLINE`], [`MAX_MESSAGE`] bytes are
//! kept and the rest is never read, and the message ends at the end of the
//! stream or after [`QUIET`] without a byte (a hybrid vsock may not pass a
//! half-close on). Only then, and only when it stayed within its bound, does
//! an unterminated last line count: a line cut by a bound or a deadline
//! never does. The host acts on one key alone, `X_SYSTEMD_SHUTDOWN`, and on
//! its exact values: `poweroff`, `halt` and `exit` (systemd-shutdown's verb
//! when a VM's `systemctl exit` powers it off) end the VM; `reboot` and
//! `kexec` do not (firecracker exits by itself on a guest reset, and a
//! kexec stays in the same VM). Nothing else is read, logged or answered.
//!
//! Ending the VM: the helper closes the connection (the guest's systemd may
//! be waiting for that before its final `reboot(2)`), gives the guest
//! [`GRACE`] to halt, then sends SIGTERM to the hypervisor through a pidfd
//! it opened on its parent before anything else could reuse that pid.
//! firecracker installs no SIGTERM handler: it ends by the signal, which
//! systemd counts as a clean exit (`Result=success`) and
//! `Restart=on-failure` does not restart; its drop-in's
//! `RestartForceExitStatus=0` names exit status 0, not the signal.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::host::cgroup;
use crate::host::peer::{read_before, DeadlineRead};

/// Most bytes of one message kept: systemd's own limit for a notify
/// message (its PID 1 reads a datagram of up to `PIPE_BUF`).
pub const MAX_MESSAGE: usize = 4096;
/// How long one connection may take, from accept to its last byte.
pub const DEADLINE: Duration = Duration::from_secs(2);
/// After this long without a byte the message is complete (systemd writes
/// it with one `sendmsg`).
pub const QUIET: Duration = Duration::from_millis(100);
/// How long the guest may take from its `X_SYSTEMD_SHUTDOWN=poweroff`
/// (sent after its last `sync`) to halting, before the hypervisor ends.
pub const GRACE: Duration = Duration::from_millis(500);

/// How the guest says it ends (`X_SYSTEMD_SHUTDOWN=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    Poweroff,
    Halt,
    /// `systemctl exit` in a VM, which systemd-shutdown turns into a
    /// poweroff (it cannot exit a VM).
    Exit,
    Reboot,
    Kexec,
}

impl Shutdown {
    const ALL: [Shutdown; 5] = [
        Shutdown::Poweroff,
        Shutdown::Halt,
        Shutdown::Exit,
        Shutdown::Reboot,
        Shutdown::Kexec,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Shutdown::Poweroff => "poweroff",
            Shutdown::Halt => "halt",
            Shutdown::Exit => "exit",
            Shutdown::Reboot => "reboot",
            Shutdown::Kexec => "kexec",
        }
    }

    /// The value exactly as systemd writes it; anything else is not one.
    pub fn from_value(v: &[u8]) -> Option<Shutdown> {
        Shutdown::ALL
            .into_iter()
            .find(|s| s.as_str().as_bytes() == v)
    }

    /// Whether the VM is over: the hypervisor is ended for it.
    pub fn ends_vm(self) -> bool {
        matches!(self, Shutdown::Poweroff | Shutdown::Halt | Shutdown::Exit)
    }
}

/// The key the host acts on.
pub const SHUTDOWN_KEY: &[u8] = b"X_SYSTEMD_SHUTDOWN";

/// One connection's message as it arrives: at most [`MAX_MESSAGE`] bytes
/// are kept, whatever the guest sends.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Message {
    bytes: Vec<u8>,
    overflowed: bool,
}

impl Message {
    pub fn new() -> Message {
        Message::default()
    }

    /// Add bytes read from the connection. `false` once the message is over
    /// its bound: read no more (the kept bytes stop at [`MAX_MESSAGE`]).
    pub fn push(&mut self, chunk: &[u8]) -> bool {
        let room = MAX_MESSAGE - self.bytes.len();
        if chunk.len() > room {
            self.bytes.extend_from_slice(&chunk[..room]);
            self.overflowed = true;
            return false;
        }
        self.bytes.extend_from_slice(chunk);
        true
    }

    /// The bytes kept.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Whether more than [`MAX_MESSAGE`] bytes came.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// What the message says of the guest's end, if anything. `ended`: the
    /// sender closed or went quiet (not a deadline): only then, and only
    /// within the bound, does a last line without a newline count.
    /// The last value given wins, as a later assignment does. Allocates
    /// nothing.
    pub fn shutdown(&self, ended: bool) -> Option<Shutdown> {
        // Lines from the last one back. The piece after the last newline
        // (empty when the message ends with one) is a line only when the
        // message is whole.
        let mut lines = self.bytes.rsplit(|b| *b == b'\n');
        let last = lines.next().filter(|_| ended && !self.overflowed);
        last.into_iter().chain(lines).find_map(|line| {
            let v = line.strip_prefix(SHUTDOWN_KEY)?.strip_prefix(b"=")?;
            Shutdown::from_value(v)
        })
    }
}

/// Read one message from `conn` until the end of its stream, [`QUIET`]
/// after its last byte (`quiet`, for tests), its bound, or `deadline`.
/// Returns the message and whether it ended (closed or quiet) rather than
/// being cut.
pub fn read_message(conn: &mut UnixStream, deadline: Instant, quiet: Duration) -> (Message, bool) {
    let mut m = Message::new();
    let mut chunk = [0u8; 1024];
    loop {
        let until = if m.bytes.is_empty() {
            deadline
        } else {
            deadline.min(Instant::now() + quiet)
        };
        match read_before(conn, &mut chunk, until) {
            DeadlineRead::Bytes(0) => return (m, true),
            DeadlineRead::Bytes(n) => {
                if !m.push(&chunk[..n]) {
                    return (m, false);
                }
            }
            // Quiet after some bytes and before the deadline: whole.
            DeadlineRead::TimedOut => {
                let quiet_end = !m.bytes.is_empty() && until < deadline;
                return (m, quiet_end);
            }
            DeadlineRead::SetTimeout(_) | DeadlineRead::Failed(_) => return (m, false),
        }
    }
}

/// One line on stderr (the unit's journal stream), never the guest's bytes.
/// Not through `tracing`: this runs in a forked child that closed every
/// descriptor it did not need, the journal's datagram socket included.
fn say(line: &str) {
    let text = format!("vmwarden vmm-notify: {line}\n");
    // SAFETY: write(2) on fd 2 with a buffer that outlives the call.
    let _ = unsafe { libc::write(2, text.as_ptr().cast(), text.len()) };
}

/// Serve the guest's notify socket until the guest powers off: then end
/// the hypervisor (`hypervisor`, a pidfd) and return 0. Returns 1 when the
/// listening socket fails for good. Runs as the principal, confined.
pub fn serve(listener: OwnedFd, hypervisor: OwnedFd) -> i32 {
    let listener = UnixListener::from(listener);
    loop {
        let mut conn = match listener.accept() {
            Ok((c, _)) => c,
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::ECONNABORTED)) => {
                continue
            }
            // Out of descriptors or memory: the guest's next message may
            // find room again.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                ) =>
            {
                say(&format!("accept: {e}; retrying"));
                std::thread::sleep(QUIET);
                continue;
            }
            Err(e) => {
                say(&format!(
                    "accept: {e}; the guest's poweroff will not end the VM"
                ));
                return 1;
            }
        };
        let (message, ended) = read_message(&mut conn, Instant::now() + DEADLINE, QUIET);
        // Closed before acting: the guest's systemd may wait for it.
        drop(conn);
        match message.shutdown(ended) {
            Some(s) if s.ends_vm() => {
                // Said once the guest had its grace, so that the line does
                // not cut into the guest's last console lines on the same
                // stream, and before the signal: the hypervisor's end
                // kills this helper (its death signal) at once, and on one
                // CPU it may end before this helper runs again.
                let say_ending = || {
                    say(&format!(
                        "the guest's systemd said {}: ending the hypervisor (SIGTERM)",
                        s.as_str()
                    ));
                };
                match end_hypervisor(&hypervisor, say_ending) {
                    Ok(()) => return 0,
                    Err(e) => say(&format!(
                        "the guest's systemd said {}, but the hypervisor cannot be signalled: {e}",
                        s.as_str()
                    )),
                }
            }
            Some(s) => say(&format!(
                "the guest's systemd says {}: the hypervisor is left to it",
                s.as_str()
            )),
            None => {}
        }
    }
}

/// Wait [`GRACE`] for the hypervisor to end by itself; if it has not,
/// `announce`, then SIGTERM it. A hypervisor already gone is not an error.
fn end_hypervisor(pidfd: &OwnedFd, announce: impl FnOnce()) -> Result<(), Errno> {
    let end = Instant::now() + GRACE;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            // Readable: the process has exited.
            Ok(n) if n > 0 => return Ok(()),
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
    announce();
    match cgroup::pidfd_signal(pidfd.as_raw_fd(), libc::SIGTERM) {
        Ok(()) | Err(Errno::ESRCH) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn whole(b: &[u8]) -> Option<Shutdown> {
        let mut m = Message::new();
        assert!(m.push(b));
        m.shutdown(true)
    }

    #[test]
    fn systemds_shutdown_message_is_read_exactly() {
        // What systemd-shutdown sends (256 and later), with and without the
        // reboot parameter, and as the test guest sends it.
        assert_eq!(
            whole(b"EXIT_STATUS=0\nX_SYSTEMD_SHUTDOWN=poweroff"),
            Some(Shutdown::Poweroff)
        );
        assert_eq!(
            whole(b"EXIT_STATUS=0\nX_SYSTEMD_SHUTDOWN=reboot\nX_SYSTEMD_REBOOT_PARAMETER=x"),
            Some(Shutdown::Reboot)
        );
        assert_eq!(whole(b"X_SYSTEMD_SHUTDOWN=halt\n"), Some(Shutdown::Halt));
        assert_eq!(whole(b"X_SYSTEMD_SHUTDOWN=exit"), Some(Shutdown::Exit));
        assert_eq!(whole(b"X_SYSTEMD_SHUTDOWN=kexec"), Some(Shutdown::Kexec));
        for s in Shutdown::ALL {
            assert_eq!(Shutdown::from_value(s.as_str().as_bytes()), Some(s));
            assert_eq!(
                s.ends_vm(),
                matches!(s, Shutdown::Poweroff | Shutdown::Halt | Shutdown::Exit)
            );
        }
        // Everything else a booting guest sends: nothing to act on.
        for m in [
            &b"READY=1\nSTATUS=Ready."[..],
            b"X_SYSTEMD_UNIT_ACTIVE=multi-user.target",
            b"STATUS=X_SYSTEMD_SHUTDOWN=poweroff",
            b"X_SYSTEMD_SHUTDOWN=poweroffX",
            b"X_SYSTEMD_SHUTDOWN=Poweroff",
            b"X_SYSTEMD_SHUTDOWN= poweroff",
            b"X_SYSTEMD_SHUTDOWN=power",
            b"X_SYSTEMD_SHUTDOWN=poweroff\r",
            b" X_SYSTEMD_SHUTDOWN=poweroff",
            b"X_SYSTEMD_SHUTDOWN",
            b"",
            b"\n\n\n",
        ] {
            assert_eq!(whole(m), None, "{:?}", String::from_utf8_lossy(m));
        }
        // The last value given wins, as a later assignment does.
        assert_eq!(
            whole(b"X_SYSTEMD_SHUTDOWN=reboot\nX_SYSTEMD_SHUTDOWN=poweroff"),
            Some(Shutdown::Poweroff)
        );
    }

    #[test]
    fn a_line_cut_by_a_bound_or_a_deadline_never_counts() {
        // Not ended (a deadline cut it): the unterminated line is dropped,
        // a terminated one still counts.
        let mut m = Message::new();
        assert!(m.push(b"X_SYSTEMD_SHUTDOWN=poweroff"));
        assert_eq!(m.shutdown(false), None);
        let mut m = Message::new();
        assert!(m.push(b"X_SYSTEMD_SHUTDOWN=poweroff\nX_SYSTEMD_SHUTDOWN=reb"));
        assert_eq!(m.shutdown(false), Some(Shutdown::Poweroff));
        // Over the bound: MAX_MESSAGE bytes kept, the rest dropped, and the
        // line the bound cut does not count even when the sender closed.
        let mut m = Message::new();
        let mut flood = vec![b'x'; MAX_MESSAGE - 28];
        flood.push(b'\n');
        flood.extend_from_slice(b"X_SYSTEMD_SHUTDOWN=poweroff and more");
        assert!(!m.push(&flood));
        assert!(m.overflowed());
        assert_eq!(m.bytes().len(), MAX_MESSAGE);
        assert!(m.bytes().ends_with(b"X_SYSTEMD_SHUTDOWN=poweroff"));
        assert_eq!(m.shutdown(true), None);
        assert!(!m.push(b"more"));
        assert_eq!(m.bytes().len(), MAX_MESSAGE);
        // Exactly at the bound and whole: it counts.
        let mut m = Message::new();
        let mut exact = vec![b'x'; MAX_MESSAGE - 24];
        exact.push(b'\n');
        exact.extend_from_slice(b"X_SYSTEMD_SHUTDOWN=halt");
        assert_eq!(exact.len(), MAX_MESSAGE);
        assert!(m.push(&exact));
        assert_eq!(m.shutdown(true), Some(Shutdown::Halt));
    }

    fn pair() -> (UnixStream, UnixStream) {
        UnixStream::pair().unwrap()
    }

    #[test]
    fn reading_ends_at_the_close_when_quiet_at_the_bound_or_at_the_deadline() {
        let long = Duration::from_secs(5);
        // Closed: whole, at once.
        let (mut a, mut b) = pair();
        a.write_all(b"EXIT_STATUS=0\nX_SYSTEMD_SHUTDOWN=poweroff")
            .unwrap();
        drop(a);
        let t0 = Instant::now();
        let (m, ended) = read_message(&mut b, t0 + long, long);
        assert!(ended && t0.elapsed() < Duration::from_secs(1));
        assert_eq!(m.shutdown(ended), Some(Shutdown::Poweroff));

        // Half-closed by a hybrid vsock that does not pass it on: quiet
        // after the message, which is whole.
        let (mut a, mut b) = pair();
        a.write_all(b"X_SYSTEMD_SHUTDOWN=halt").unwrap();
        let t0 = Instant::now();
        let (m, ended) = read_message(&mut b, t0 + long, Duration::from_millis(50));
        assert!(ended && t0.elapsed() < Duration::from_secs(2));
        assert_eq!(m.shutdown(ended), Some(Shutdown::Halt));
        drop(a);

        // Nothing at all: the deadline, not ended.
        let (a, mut b) = pair();
        let t0 = Instant::now();
        let (m, ended) = read_message(&mut b, t0 + Duration::from_millis(100), long);
        assert!(!ended && m.bytes().is_empty());
        assert!(t0.elapsed() >= Duration::from_millis(100));
        drop(a);

        // A drip that never goes quiet long enough: cut at the deadline,
        // its unterminated line dropped.
        let (mut a, mut b) = pair();
        let dripper = std::thread::spawn(move || {
            for c in b"X_SYSTEMD_SHUTDOWN=poweroff".iter().cycle().take(400) {
                if a.write_all(&[*c]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        let t0 = Instant::now();
        let (m, ended) = read_message(
            &mut b,
            t0 + Duration::from_millis(150),
            Duration::from_millis(100),
        );
        let took = t0.elapsed();
        assert!(!ended, "a cut drip is not whole");
        assert!(took < Duration::from_millis(600), "{took:?}");
        assert_eq!(m.shutdown(ended), None);
        drop(b);
        dripper.join().unwrap();

        // A flood: MAX_MESSAGE bytes kept, reading stops there.
        let (mut a, mut b) = pair();
        let writer = std::thread::spawn(move || {
            let chunk = [b'y'; 4096];
            for _ in 0..64 {
                if a.write_all(&chunk).is_err() {
                    break;
                }
            }
        });
        let (m, ended) = read_message(&mut b, Instant::now() + long, long);
        assert!(!ended && m.overflowed() && m.bytes().len() == MAX_MESSAGE);
        drop(b);
        writer.join().unwrap();
    }

    #[test]
    fn the_listener_ends_its_parent_on_poweroff_and_not_on_reboot() {
        // A child process stands for the hypervisor.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vsock.sock_8888");
        let mut hv = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pidfd = cgroup::pidfd_open(hv.id()).unwrap();
        let listener = UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || serve(OwnedFd::from(listener), pidfd));
        let send = |b: &[u8]| {
            let mut c = UnixStream::connect(&path).unwrap();
            c.write_all(b).unwrap();
            drop(c);
        };
        send(b"READY=1\nSTATUS=Ready.");
        send(b"EXIT_STATUS=0\nX_SYSTEMD_SHUTDOWN=reboot");
        std::thread::sleep(GRACE + Duration::from_millis(200));
        assert!(hv.try_wait().unwrap().is_none(), "ended on a reboot");
        send(b"EXIT_STATUS=0\nX_SYSTEMD_SHUTDOWN=poweroff");
        assert_eq!(server.join().unwrap(), 0);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(hv.wait().unwrap().signal(), Some(libc::SIGTERM));
    }
}
