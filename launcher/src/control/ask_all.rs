//! `status` of many QEMU VMs at once: each VM's QMP conversation
//! (greeting, `qmp_capabilities`, `query-status`, then `query-balloon`
//! when its spec has a balloon) is the one [`Qmp::status_within`] and
//! `balloon_mib` hold, but all of them run side by side in one thread,
//! multiplexed with `poll(2)`: 100 VMs cost the slowest answer, not the
//! sum of all of them. The commands are written together once connected
//! (QMP answers them in order), so each VM is woken once rather than once
//! per round trip; the answers are still taken in turn, the greeting
//! first.
//!
//! Every bound of the one-by-one client holds per connection: the peer
//! check of [`peer::connect`] (the control dir's owner), an overall
//! deadline per conversation ([`super::STATUS_ATTEMPT`] for the status,
//! a fresh one for the balloon query, as `balloon_mib`'s own connection
//! had), lines of at most [`peer::MAX_MESSAGE`] bytes, at most
//! [`peer::MAX_CONNECTION_BYTES`] and [`peer::MAX_CONNECTION_MESSAGES`]
//! per connection, each line parsed by [`parse_message`]. A VM that
//! answers slowly, never, or endlessly ends only its own conversation.
//!
//! [`Qmp::status_within`]: crate::hypervisor::qmp::Qmp::status_within

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::host::peer::{self, MAX_CONNECTION_BYTES, MAX_CONNECTION_MESSAGES};
use crate::hypervisor::qmp::{parse_message, status_of, Message};

/// One VM to ask: its QMP socket, and whether to ask its balloon too.
#[derive(Debug, Clone)]
pub struct Ask {
    pub sock: PathBuf,
    pub balloon: bool,
}

/// What one VM answered: its run state, and its balloon's `actual` (the
/// guest memory that remains, bytes) when asked and answered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answer {
    pub status: Option<String>,
    pub actual: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Greeting,
    Capabilities,
    Status,
    Balloon,
    Done,
}

struct Conversation {
    stream: UnixStream,
    pending: Vec<u8>,
    out: Vec<u8>,
    bytes: u64,
    messages: u32,
    deadline: Instant,
    step: Step,
    balloon: bool,
    answer: Answer,
}

/// A command line as [`crate::hypervisor::qmp::Qmp`] writes it.
fn command(cmd: &str) -> Vec<u8> {
    let mut b = serde_json::to_vec(&serde_json::json!({ "execute": cmd })).unwrap_or_default();
    b.extend_from_slice(b"\r\n");
    b
}

impl Conversation {
    /// One message of the peer; moves the conversation on.
    fn on_message(&mut self, m: Message, timeout: Duration) {
        self.step = match (self.step, m) {
            (Step::Greeting, Message::Greeting(_)) => Step::Capabilities,
            // Anything else first is no QMP greeting.
            (Step::Greeting, _) => Step::Done,
            (s, Message::Event { .. } | Message::Greeting(_)) => s,
            (_, Message::Error(_)) => Step::Done,
            (Step::Capabilities, Message::Return(_)) => Step::Status,
            (Step::Status, Message::Return(r)) => {
                self.answer.status = Some(status_of(&r));
                if self.balloon {
                    self.deadline = Instant::now() + timeout;
                    Step::Balloon
                } else {
                    Step::Done
                }
            }
            (Step::Balloon, Message::Return(v)) => {
                self.answer.actual = v.get("actual").and_then(|a| a.as_u64());
                Step::Done
            }
            (Step::Done, _) => Step::Done,
        };
    }

    /// Write what is queued, as far as the socket takes it.
    fn flush(&mut self) {
        while !self.out.is_empty() {
            match self.stream.write(&self.out) {
                Ok(0) => return self.step = Step::Done,
                Ok(n) => {
                    self.out.drain(..n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(_) => return self.step = Step::Done,
            }
        }
    }

    /// Read what is there, bounded, and handle every whole line.
    fn read(&mut self, timeout: Duration) {
        let mut chunk = [0u8; 4096];
        let n = match self.stream.read(&mut chunk) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock
                ) =>
            {
                return
            }
            Err(_) => return self.step = Step::Done,
        };
        if n == 0 {
            return self.step = Step::Done;
        }
        self.bytes += n as u64;
        if self.bytes > MAX_CONNECTION_BYTES {
            return self.step = Step::Done;
        }
        self.pending.extend_from_slice(&chunk[..n]);
        while self.step != Step::Done {
            match peer::take_line(&mut self.pending) {
                Ok(Some(line)) => {
                    self.messages += 1;
                    if self.messages > MAX_CONNECTION_MESSAGES {
                        return self.step = Step::Done;
                    }
                    match parse_message(&line) {
                        Ok(m) => self.on_message(m, timeout),
                        Err(_) => self.step = Step::Done,
                    }
                }
                Ok(None) => break,
                Err(_) => self.step = Step::Done,
            }
        }
        self.flush();
    }
}

/// Ask every VM of `asks` at once; one answer per ask, in order. Each
/// connect is bounded by `timeout` (a VM can fill its listener's backlog),
/// and each conversation by `timeout` from its connect.
pub fn ask_all(asks: &[Ask], timeout: Duration) -> Vec<Answer> {
    let mut convs: Vec<Option<Conversation>> = asks
        .iter()
        .map(|a| {
            let stream = peer::connect(&a.sock, timeout).ok()?;
            stream.set_nonblocking(true).ok()?;
            // The whole conversation is sent at once (the peer, already
            // checked to be the VM's principal, answers each in turn): a
            // VM wakes once, not once per round trip. Each answer is still
            // taken only in its turn, after the greeting.
            let mut out = command("qmp_capabilities");
            out.extend(command("query-status"));
            if a.balloon {
                out.extend(command("query-balloon"));
            }
            let mut c = Conversation {
                stream,
                pending: Vec::new(),
                out,
                bytes: 0,
                messages: 0,
                deadline: Instant::now() + timeout,
                step: Step::Greeting,
                balloon: a.balloon,
                answer: Answer::default(),
            };
            c.flush();
            Some(c)
        })
        .collect();
    loop {
        let now = Instant::now();
        for c in convs.iter_mut().flatten() {
            if c.deadline <= now {
                c.step = Step::Done;
            }
        }
        let live: Vec<usize> = (0..convs.len())
            .filter(|i| convs[*i].as_ref().is_some_and(|c| c.step != Step::Done))
            .collect();
        let Some(first) = live
            .iter()
            .filter_map(|i| convs[*i].as_ref().map(|c| c.deadline))
            .min()
        else {
            break;
        };
        let wait = first
            .saturating_duration_since(now)
            .max(Duration::from_millis(1));
        let wait = PollTimeout::try_from(wait).unwrap_or(PollTimeout::MAX);
        let ready: Vec<(usize, PollFlags)> = {
            let mut fds: Vec<PollFd<'_>> = live
                .iter()
                .filter_map(|i| convs[*i].as_ref())
                .map(|c| {
                    let mut f = PollFlags::POLLIN;
                    if !c.out.is_empty() {
                        f |= PollFlags::POLLOUT;
                    }
                    PollFd::new(c.stream.as_fd(), f)
                })
                .collect();
            match poll(&mut fds, wait) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                // Nothing can be waited for: every conversation ends here.
                Err(_) => break,
            }
            live.iter()
                .zip(&fds)
                .filter_map(|(i, f)| f.revents().filter(|r| !r.is_empty()).map(|r| (*i, r)))
                .collect()
        };
        for (i, r) in ready {
            let Some(c) = convs[i].as_mut() else {
                continue;
            };
            if r.contains(PollFlags::POLLOUT) {
                c.flush();
            }
            if r.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR) {
                c.read(timeout);
            }
        }
    }
    convs
        .into_iter()
        .map(|c| c.map(|c| c.answer).unwrap_or_default())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;

    /// A fake QMP server (a thread standing in for a QEMU, honest or not)
    /// on a real socket: `serve` gets each accepted connection.
    fn fake(serve: fn(UnixStream)) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("qmp.sock");
        let l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let c = c.unwrap();
                std::thread::spawn(move || serve(c));
            }
        });
        (dir, sock)
    }

    const GREETING: &[u8] = b"{\"QMP\": {\"version\": {}, \"capabilities\": []}}\r\n";

    /// How many `gathered` peers have been sent their `query-status`.
    static ASKED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    /// An honest peer that answers `query-status` only once 20 such peers
    /// have been asked (or never, after 1.2 s): asked one after another,
    /// the first would wait for the others alone and answer nothing.
    fn gathered(c: UnixStream) {
        use std::sync::atomic::Ordering;
        let mut w = c.try_clone().unwrap();
        let _ = w.write_all(GREETING);
        for line in std::io::BufReader::new(c).lines() {
            let Ok(line) = line else { return };
            let ans: &[u8] = if line.contains("query-status") {
                ASKED.fetch_add(1, Ordering::SeqCst);
                let end = Instant::now() + Duration::from_millis(1200);
                while ASKED.load(Ordering::SeqCst) < 20 {
                    if Instant::now() > end {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                b"{\"return\": {\"status\": \"running\"}}\r\n"
            } else if line.contains("query-balloon") {
                b"{\"return\": {\"actual\": 268435456}}\r\n"
            } else {
                b"{\"return\": {}}\r\n"
            };
            if w.write_all(ans).is_err() {
                return;
            }
        }
    }

    fn ask(sock: &std::path::Path, balloon: bool) -> Ask {
        Ask {
            sock: sock.to_path_buf(),
            balloon,
        }
    }

    #[test]
    fn every_vm_is_asked_at_once_and_a_silent_one_costs_only_its_own_deadline() {
        let good: Vec<_> = (0..20).map(|_| fake(gathered)).collect();
        // Three peers never say a word, one greets and then drips forever.
        let silent: Vec<_> = (0..3)
            .map(|_| {
                fake(|c| {
                    std::thread::sleep(Duration::from_secs(30));
                    drop(c);
                })
            })
            .collect();
        let (_d, drip) = fake(|mut c| {
            let _ = c.write_all(GREETING);
            while c.write_all(b" ").is_ok() {
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let mut asks: Vec<Ask> = good.iter().map(|(_, s)| ask(s, false)).collect();
        for (i, (_, s)) in silent.iter().enumerate() {
            asks.insert(3 + i, ask(s, false));
        }
        asks.push(ask(&drip, true));
        asks.push(ask(&good[0].1, true));
        // All at once: the 20 gathered peers answer only once all of them
        // have been asked, and the silent ones hold nobody else up.
        let answers = ask_all(&asks, Duration::from_millis(1500));
        assert_eq!(answers.len(), asks.len());
        for (i, a) in answers.iter().enumerate() {
            let want = match i {
                3..=5 | 23 => Answer::default(),
                24 => Answer {
                    status: Some("running".into()),
                    actual: Some(268_435_456),
                },
                _ => Answer {
                    status: Some("running".into()),
                    actual: None,
                },
            };
            assert_eq!(a, &want, "answer {i}");
        }
    }

    #[test]
    fn no_greeting_a_refused_command_or_a_flood_is_no_answer() {
        // An answer before any greeting is not taken.
        let (_a, no_greeting) = fake(|mut c| {
            let _ = c.write_all(b"{\"return\": {\"status\": \"running\"}}\r\n");
            std::thread::sleep(Duration::from_secs(2));
        });
        let (_b, refused) = fake(|mut c| {
            let _ = c.write_all(GREETING);
            let _ = c.write_all(b"{\"error\": {\"class\": \"GenericError\"}}\r\n");
            let _ = c.write_all(b"{\"return\": {\"status\": \"running\"}}\r\n");
            std::thread::sleep(Duration::from_secs(2));
        });
        let (_c, flood) = fake(|mut c| {
            let _ = c.write_all(GREETING);
            let _ = c.write_all(b"{\"return\": {}}\r\n");
            while c.write_all(&b"{\"event\":\"X\"}\r\n".repeat(512)).is_ok() {}
        });
        let (_d, huge) = fake(|mut c| {
            let _ = c.write_all(GREETING);
            let _ = c.write_all(b"{\"return\": {}}\r\n");
            let _ = c.write_all(&vec![b'x'; 2 * peer::MAX_MESSAGE as usize]);
            std::thread::sleep(Duration::from_secs(2));
        });
        let asks: Vec<Ask> = [&no_greeting, &refused, &flood, &huge]
            .iter()
            .map(|s| ask(s, false))
            .collect();
        let answers = ask_all(&asks, Duration::from_secs(5));
        assert!(
            answers.iter().all(|a| *a == Answer::default()),
            "{answers:?}"
        );
    }
}
