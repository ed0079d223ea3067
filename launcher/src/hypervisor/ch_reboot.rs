//! cloud-hypervisor's event monitor, as the helper `reboot-watch` reads it
//! (`config::reboot` says who gets one and why).
//!
//! cloud-hypervisor writes each event (`--event-monitor fd=N`) as a JSON
//! object, pretty-printed, followed by an empty line: `{"timestamp": …,
//! "source": "vm", "event": "rebooting", "properties": null}`. Its own
//! reboot — asked by the guest (a reset) or through its API — starts with
//! the event `rebooting`, before it drops the VM's devices. The helper acts
//! on that event alone: it ends cloud-hypervisor with
//! [`config::reboot::REBOOT_SIGNAL`](crate::config::reboot::REBOOT_SIGNAL)
//! through a pidfd it opened on its parent. Nothing else is read into a
//! decision, logged or answered. The bytes are the hypervisor's (the other
//! end of the pair is its alone); an event longer than [`MAX_EVENT`] is
//! skipped whole, so a hypervisor that lies can only end itself, which it
//! could anyway.

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use nix::errno::Errno;
use serde::Deserialize;

use crate::host::cgroup;

/// The signal `reboot-watch` sends (systemd's name for it is
/// `config::reboot::REBOOT_SIGNAL`; a unit test checks they agree).
pub const SIGNAL: libc::c_int = libc::SIGHUP;
/// Most bytes of one event kept: cloud-hypervisor's are a few hundred.
pub const MAX_EVENT: usize = 16 * 1024;
/// What ends an event in the stream.
const SEPARATOR: &[u8] = b"\n\n";

/// The fields of an event read.
#[derive(Deserialize)]
struct Event {
    source: String,
    event: String,
}

/// The event stream, cut into events.
#[derive(Debug, Default)]
pub struct Events {
    buf: Vec<u8>,
    /// An event outgrew [`MAX_EVENT`]: the bytes up to the next separator
    /// are dropped.
    skipping: bool,
}

impl Events {
    pub fn new() -> Events {
        Events::default()
    }

    /// Take `chunk` of the stream; true once a whole event in it says the
    /// VM reboots.
    pub fn push(&mut self, chunk: &[u8]) -> bool {
        self.buf.extend_from_slice(chunk);
        while let Some(at) = find(&self.buf, SEPARATOR) {
            let event: Vec<u8> = self.buf.drain(..at + SEPARATOR.len()).collect();
            if std::mem::take(&mut self.skipping) {
                continue;
            }
            if is_reboot(&event[..at]) {
                return true;
            }
        }
        if self.buf.len() > MAX_EVENT {
            self.buf.clear();
            self.skipping = true;
        }
        false
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Whether one event is cloud-hypervisor's `rebooting`.
fn is_reboot(event: &[u8]) -> bool {
    serde_json::from_slice::<Event>(event).is_ok_and(|e| e.source == "vm" && e.event == "rebooting")
}

/// One line on stderr (the unit's journal stream). Not through `tracing`:
/// this runs in a forked child that closed every descriptor it did not
/// need, the journal's datagram socket included.
fn say(line: &str) {
    let text = format!("vmwarden reboot-watch: {line}\n");
    // SAFETY: write(2) on fd 2 with a buffer that outlives the call.
    let _ = unsafe { libc::write(2, text.as_ptr().cast(), text.len()) };
}

/// Read the event monitor (`events`, this helper's end of the pair) until
/// cloud-hypervisor says the VM reboots: then end it (`hypervisor`, a
/// pidfd) with [`SIGNAL`] and return 0. Returns 0 when the stream ends (the
/// hypervisor is gone), 1 when it fails. Runs as the principal, confined.
pub fn serve(events: OwnedFd, hypervisor: OwnedFd) -> i32 {
    let mut stream = UnixStream::from(events);
    let mut seen = Events::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = match stream.read(&mut chunk) {
            Ok(0) => return 0,
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => {
                say(&format!(
                    "reading the event monitor: {e}; a reboot will not restart the VM"
                ));
                return 1;
            }
        };
        if !seen.push(&chunk[..n]) {
            continue;
        }
        // Said before the signal: the hypervisor's end kills this helper
        // (its death signal) at once.
        say("cloud-hypervisor reboots the VM, whose virtiofsd serves one connection: ending it (SIGHUP) for its unit to start it again");
        return match cgroup::pidfd_signal(hypervisor.as_raw_fd(), SIGNAL) {
            Ok(()) | Err(Errno::ESRCH) => 0,
            Err(e) => {
                say(&format!("the hypervisor cannot be signalled: {e}"));
                1
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::reboot::REBOOT_SIGNAL;
    use std::io::Write;
    use std::os::unix::process::ExitStatusExt;

    /// Two events as cloud-hypervisor v53 wrote them (`--event-monitor`).
    const BOOTED: &[u8] = b"{\n  \"timestamp\": {\n    \"secs\": 0,\n    \"nanos\": 100193154\n  },\n  \"source\": \"vm\",\n  \"event\": \"booted\",\n  \"properties\": null\n}\n\n";
    const REBOOTING: &[u8] = b"{\n  \"timestamp\": {\n    \"secs\": 8,\n    \"nanos\": 14268395\n  },\n  \"source\": \"vm\",\n  \"event\": \"rebooting\",\n  \"properties\": null\n}\n\n";

    #[test]
    fn the_signal_is_the_one_the_unit_names() {
        let s = nix::sys::signal::Signal::try_from(SIGNAL).unwrap();
        assert_eq!(s.as_str(), REBOOT_SIGNAL);
    }

    #[test]
    fn only_a_whole_rebooting_event_of_the_vm_counts() {
        let mut e = Events::new();
        assert!(!e.push(BOOTED));
        // Cut anywhere: counted once the separator arrives.
        let (a, b) = REBOOTING.split_at(40);
        assert!(!e.push(a));
        let (b1, b2) = b.split_at(b.len() - 1);
        assert!(!e.push(b1));
        assert!(e.push(b2));
        // Not the VM's, not the event, not JSON.
        let mut e = Events::new();
        assert!(!e.push(b"{\"source\":\"vmm\",\"event\":\"rebooting\"}\n\n"));
        assert!(!e.push(b"{\"source\":\"vm\",\"event\":\"rebooted2\"}\n\n"));
        assert!(!e.push(b"rebooting\n\n"));
        assert!(e.push(b"{\"source\":\"vm\",\"event\":\"rebooting\"}\n\n"));
    }

    #[test]
    fn an_event_past_the_bound_is_skipped_whole() {
        let mut e = Events::new();
        // A huge event whose tail looks like a reboot: never counted.
        let mut huge = b"{\"source\":\"vm\",\"event\":\"rebooting\",\"p\":\"".to_vec();
        huge.extend(std::iter::repeat_n(b'x', MAX_EVENT));
        assert!(!e.push(&huge));
        assert!(e.buf.len() <= MAX_EVENT);
        assert!(!e.push(b"\"}\n\n"));
        // The next one counts again.
        assert!(e.push(REBOOTING));
    }

    /// A child process that stands for the hypervisor: `sleep`, with
    /// SIGHUP's default action whatever the test inherited (under `nohup`
    /// it is ignored, as the launcher resets it before the hypervisor's
    /// exec: `launch::exec`).
    fn stand_in() -> std::process::Child {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("30");
        let hup_default = || {
            // SAFETY: SIG_DFL installs no handler, so no handler can run
            // in an unexpected context.
            unsafe {
                nix::sys::signal::signal(
                    nix::sys::signal::Signal::SIGHUP,
                    nix::sys::signal::SigHandler::SigDfl,
                )
            }
            .map(|_| ())
            .map_err(std::io::Error::from)
        };
        // SAFETY: between fork and exec the child only calls sigaction
        // (`hup_default`), which is async-signal-safe: no lock, no
        // allocation.
        unsafe {
            cmd.pre_exec(hup_default);
        }
        cmd.spawn().unwrap()
    }

    #[test]
    fn the_helper_ends_its_parent_on_rebooting_and_not_before() {
        let mut hv = stand_in();
        let pidfd = cgroup::pidfd_open(hv.id()).unwrap();
        let (mut ours, theirs) = UnixStream::pair().unwrap();
        let server = std::thread::spawn(move || serve(OwnedFd::from(theirs), pidfd));
        ours.write_all(BOOTED).unwrap();
        ours.write_all(&REBOOTING[..30]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(hv.try_wait().unwrap().is_none(), "ended before the event");
        ours.write_all(&REBOOTING[30..]).unwrap();
        assert_eq!(server.join().unwrap(), 0);
        assert_eq!(hv.wait().unwrap().signal(), Some(libc::SIGHUP));
    }

    #[test]
    fn the_helper_ends_quietly_with_the_stream() {
        let mut hv = stand_in();
        let pidfd = cgroup::pidfd_open(hv.id()).unwrap();
        let (mut ours, theirs) = UnixStream::pair().unwrap();
        ours.write_all(BOOTED).unwrap();
        drop(ours);
        assert_eq!(serve(OwnedFd::from(theirs), pidfd), 0);
        assert!(hv.try_wait().unwrap().is_none(), "ended without a reboot");
        hv.kill().unwrap();
        hv.wait().unwrap();
    }
}
