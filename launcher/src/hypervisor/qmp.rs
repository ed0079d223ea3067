//! A small QMP client over the control socket: greeting, capabilities
//! negotiation, commands, events. Blocking with timeouts; no threads.
//!
//! The other end is the hypervisor, which a VM may control. What one
//! connection may deliver is bounded ([`peer::LineReader`]: bytes, messages,
//! the length of each, the overall deadline before every read); each line
//! is parsed by the pure [`parse_message`]; events are dropped as they
//! arrive, except the one a caller waits for.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::config::text::excerpt;
use crate::host::peer::{self, LineReader, PeerError};

/// How much of a VM-written value an error message quotes.
const QUOTE: usize = 200;
/// Longest run state kept from `query-status` (QEMU's longest is 15).
pub const MAX_STATUS: usize = 64;

/// Why one QMP line is not a QMP message.
#[derive(Debug, thiserror::Error)]
pub enum MessageError {
    #[error("message longer than {} bytes", peer::MAX_MESSAGE)]
    TooLong,
    #[error("message is not UTF-8")]
    NotUtf8,
    #[error("bad JSON {line}: {source}")]
    BadJson {
        /// An escaped excerpt of the line.
        line: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("not a QMP message (no QMP, return, error or event): {0}")]
    Unknown(String),
}

/// One QMP message, typed.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    Greeting(Value),
    Return(Value),
    /// The `error` object of a failed command.
    Error(Value),
    Event {
        name: String,
        msg: Value,
    },
}

/// Parse one QMP line (bytes in, typed message out). Pure and bounded:
/// input over [`peer::MAX_MESSAGE`] bytes is refused before parsing, and
/// serde_json limits nesting; what a fuzzer calls.
pub fn parse_message(line: &[u8]) -> Result<Message, MessageError> {
    if line.len() as u64 > peer::MAX_MESSAGE {
        return Err(MessageError::TooLong);
    }
    let text = std::str::from_utf8(line).map_err(|_| MessageError::NotUtf8)?;
    let v: Value = serde_json::from_str(text).map_err(|source| MessageError::BadJson {
        line: excerpt(text.trim_end(), QUOTE),
        source,
    })?;
    if let Some(name) = v.get("event") {
        let name = name.as_str().unwrap_or("").to_string();
        return Ok(Message::Event { name, msg: v });
    }
    if let Some(e) = v.get("error") {
        return Ok(Message::Error(e.clone()));
    }
    if let Some(r) = v.get("return") {
        return Ok(Message::Return(r.clone()));
    }
    if v.get("QMP").is_some() {
        return Ok(Message::Greeting(v));
    }
    Err(MessageError::Unknown(excerpt(&v.to_string(), QUOTE)))
}

/// The run state in a `query-status` return, cut to [`MAX_STATUS`].
pub fn status_of(ret: &Value) -> String {
    let s = ret
        .get("status")
        .and_then(|s| s.as_str())
        .unwrap_or("unknown");
    s.chars().take(MAX_STATUS).collect()
}

/// A QMP conversation that failed; every variant names the socket.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    /// Connecting (peer check included) or reading a message.
    #[error("QMP {path}: {source}")]
    Peer {
        path: PathBuf,
        #[source]
        source: PeerError,
    },
    /// `set timeout`, `dup`, `write`.
    #[error("QMP {path}: {op}: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("QMP {path}: connection closed")]
    Closed { path: PathBuf },
    #[error("QMP {path}: {source}")]
    Message {
        path: PathBuf,
        #[source]
        source: MessageError,
    },
    #[error("QMP {path}: {source}")]
    Encode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// `greeting`: an escaped excerpt of what came instead.
    #[error("QMP {path}: unexpected greeting {greeting}")]
    Greeting { path: PathBuf, greeting: String },
    /// The command's `error` reply (an escaped excerpt).
    #[error("QMP {path}: {cmd}: {error}")]
    Command {
        path: PathBuf,
        cmd: String,
        error: String,
    },
    #[error("QMP {path}: timed out waiting for event {event}")]
    EventTimeout { path: PathBuf, event: String },
}

type Result<T, E = QmpError> = std::result::Result<T, E>;

#[derive(Debug)]
pub struct Qmp {
    path: PathBuf,
    timeout: Duration,
    reader: LineReader,
    writer: UnixStream,
    pub greeting: Value,
    /// The event [`Qmp::watch`] asked to keep, once it came.
    watched: Option<(String, Option<Value>)>,
}

impl Qmp {
    fn peer_err(path: &Path) -> impl FnOnce(PeerError) -> QmpError + '_ {
        move |source| QmpError::Peer {
            path: path.to_path_buf(),
            source,
        }
    }

    fn io_err<'a>(
        path: &'a Path,
        op: &'static str,
    ) -> impl FnOnce(std::io::Error) -> QmpError + 'a {
        move |source| QmpError::Io {
            path: path.to_path_buf(),
            op,
            source,
        }
    }

    /// Connect (only to a peer running as the control dir's owner, see
    /// [`crate::host::peer::connect`]), read the greeting and negotiate
    /// capabilities, all within `timeout`. Every command then gets
    /// `timeout` as an overall deadline.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Qmp> {
        let deadline = Instant::now() + timeout;
        let s = peer::connect(path, timeout).map_err(Self::peer_err(path))?;
        s.set_write_timeout(Some(timeout))
            .map_err(Self::io_err(path, "set timeout"))?;
        let writer = s.try_clone().map_err(Self::io_err(path, "dup"))?;
        let mut q = Qmp {
            path: path.to_path_buf(),
            timeout,
            reader: LineReader::new(s),
            writer,
            greeting: Value::Null,
            watched: None,
        };
        match q.read_msg(deadline)? {
            Message::Greeting(g) => q.greeting = g,
            other => {
                return Err(QmpError::Greeting {
                    path: path.to_path_buf(),
                    greeting: excerpt(&format!("{other:?}"), QUOTE),
                })
            }
        }
        q.command("qmp_capabilities", None, deadline)?;
        Ok(q)
    }

    /// One message, bounded in size (a VM controls the other end) and in time.
    fn read_msg(&mut self, deadline: Instant) -> Result<Message> {
        let line = self
            .reader
            .next_line(deadline)
            .map_err(Self::peer_err(&self.path))?
            .ok_or_else(|| QmpError::Closed {
                path: self.path.clone(),
            })?;
        parse_message(&line).map_err(|source| QmpError::Message {
            path: self.path.clone(),
            source,
        })
    }

    /// Keep the first event named `name` that arrives from now on (while a
    /// command runs, too) for [`Qmp::wait_event`]; every other event is
    /// dropped as it arrives.
    pub fn watch(&mut self, name: &str) {
        self.watched = Some((name.to_string(), None));
    }

    /// Drop an event, unless it is the watched one and none came yet.
    fn seen(&mut self, name: String, msg: Value) {
        if let Some((w, kept @ None)) = &mut self.watched {
            if *w == name {
                *kept = Some(msg);
            }
        }
    }

    /// Run a command; returns its `return` value. Events meanwhile are
    /// dropped (but the watched one).
    pub fn execute(&mut self, cmd: &str, args: Option<Value>) -> Result<Value> {
        let deadline = Instant::now() + self.timeout;
        self.command(cmd, args, deadline)
    }

    fn command(&mut self, cmd: &str, args: Option<Value>, deadline: Instant) -> Result<Value> {
        let mut msg = json!({ "execute": cmd });
        if let Some(a) = args {
            msg["arguments"] = a;
        }
        let mut bytes = serde_json::to_vec(&msg).map_err(|source| QmpError::Encode {
            path: self.path.clone(),
            source,
        })?;
        bytes.extend_from_slice(b"\r\n");
        self.writer
            .write_all(&bytes)
            .map_err(Self::io_err(&self.path, "write"))?;
        self.answer(cmd, deadline)
    }

    /// The answer to the command `cmd` just sent.
    fn answer(&mut self, cmd: &str, deadline: Instant) -> Result<Value> {
        loop {
            match self.read_msg(deadline)? {
                Message::Event { name, msg } => self.seen(name, msg),
                Message::Error(e) => {
                    return Err(QmpError::Command {
                        path: self.path.clone(),
                        cmd: cmd.to_string(),
                        error: excerpt(&e.to_string(), QUOTE),
                    })
                }
                Message::Return(r) => return Ok(r),
                // A second greeting is no answer; the deadline bounds this.
                Message::Greeting(_) => {}
            }
        }
    }

    /// `getfd`: hand QEMU `fd` (SCM_RIGHTS with the command's bytes)
    /// under the name `fdname`, for a later `fd:NAME` (migration).
    pub fn getfd(&mut self, fdname: &str, fd: std::os::fd::BorrowedFd<'_>) -> Result<Value> {
        use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
        use std::os::fd::AsRawFd;
        let deadline = Instant::now() + self.timeout;
        let msg = json!({ "execute": "getfd", "arguments": { "fdname": fdname } });
        let mut bytes = serde_json::to_vec(&msg).map_err(|source| QmpError::Encode {
            path: self.path.clone(),
            source,
        })?;
        bytes.extend_from_slice(b"\r\n");
        let fds = [fd.as_raw_fd()];
        let iov = [std::io::IoSlice::new(&bytes)];
        let sent = sendmsg::<()>(
            self.writer.as_raw_fd(),
            &iov,
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(|e| QmpError::Io {
            path: self.path.clone(),
            op: "sendmsg (getfd)",
            source: e.into(),
        })?;
        if sent != bytes.len() {
            self.writer
                .write_all(&bytes[sent..])
                .map_err(Self::io_err(&self.path, "write"))?;
        }
        self.answer("getfd", deadline)
    }

    /// [`Qmp::execute`] within `timeout` rather than the connection's.
    pub fn execute_within(
        &mut self,
        cmd: &str,
        args: Option<Value>,
        timeout: Duration,
    ) -> Result<Value> {
        self.command(cmd, args, Instant::now() + timeout)
    }

    /// `query-status` → the run state, e.g. "running" (at most
    /// [`MAX_STATUS`] characters; as the VM wrote them, to be escaped
    /// where shown).
    pub fn status(&mut self) -> Result<String> {
        let v = self.execute("query-status", None)?;
        Ok(status_of(&v))
    }

    /// Connect and ask `query-status`, greeting and all within `timeout`
    /// (what `status` and `wait-ready` ask).
    pub fn status_within(path: &Path, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        let mut q = Qmp::connect(path, timeout)?;
        let v = q.command("query-status", None, deadline)?;
        Ok(status_of(&v))
    }

    /// Wait until an event named `name` arrives or `timeout` passes; other
    /// events are dropped. An event [`Qmp::watch`]ed for earlier counts.
    pub fn wait_event(&mut self, name: &str, timeout: Duration) -> Result<Value> {
        if let Some((w, Some(e))) = &self.watched {
            if w == name {
                return Ok(e.clone());
            }
        }
        let end = Instant::now() + timeout;
        loop {
            match self.read_msg(end) {
                Ok(Message::Event { name: n, msg }) if n == name => return Ok(msg),
                Ok(_) => {}
                Err(QmpError::Peer {
                    source: PeerError::TimedOut,
                    ..
                }) => {
                    return Err(QmpError::EventTimeout {
                        path: self.path.clone(),
                        event: name.to_string(),
                    })
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_four_kinds() {
        let g = parse_message(br#"{"QMP": {"version": {}, "capabilities": []}}"#).unwrap();
        assert!(matches!(g, Message::Greeting(_)));
        assert_eq!(
            parse_message(b"{\"return\": {\"status\": \"running\"}}\r\n").unwrap(),
            Message::Return(json!({"status": "running"}))
        );
        assert!(matches!(
            parse_message(br#"{"error": {"class": "GenericError", "desc": "x"}}"#).unwrap(),
            Message::Error(_)
        ));
        match parse_message(br#"{"event": "SHUTDOWN", "data": {}}"#).unwrap() {
            Message::Event { name, .. } => assert_eq!(name, "SHUTDOWN"),
            m => panic!("{m:?}"),
        }
    }

    #[test]
    fn refuses_what_is_not_a_bounded_qmp_message() {
        assert!(matches!(
            parse_message(b"\xff\xfe{}"),
            Err(MessageError::NotUtf8)
        ));
        assert!(matches!(
            parse_message(&vec![b' '; peer::MAX_MESSAGE as usize + 1]),
            Err(MessageError::TooLong)
        ));
        assert!(matches!(
            parse_message(b"{}"),
            Err(MessageError::Unknown(_))
        ));
        // What an error quotes of the line is escaped and cut.
        let mut bad = b"\x1b[2J".to_vec();
        bad.extend(vec![b'x'; 1000]);
        let e = parse_message(&bad).unwrap_err().to_string();
        assert!(
            !e.contains('\x1b') && e.contains("\\x1b[2J") && e.len() < 600,
            "{e}"
        );
    }

    #[test]
    fn a_run_state_is_cut() {
        let long = "r".repeat(10_000);
        assert_eq!(status_of(&json!({ "status": long })).len(), MAX_STATUS);
        assert_eq!(status_of(&json!({})), "unknown");
    }

    /// A fake QMP server on a real socket (a thread standing in for a
    /// compromised QEMU): `serve` gets each accepted connection.
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

    #[test]
    fn a_flood_of_events_ends_the_connection_and_only_the_watched_one_is_kept() {
        let (_d, sock) = fake(|mut c| {
            let _ = c.write_all(GREETING);
            let _ = c.write_all(b"{\"return\": {}}\r\n");
            let _ = c.write_all(b"{\"event\": \"SHUTDOWN\"}\r\n");
            while c.write_all(&b"{\"event\":\"X\"}\r\n".repeat(512)).is_ok() {}
        });
        let mut q = Qmp::connect(&sock, Duration::from_secs(5)).unwrap();
        q.watch("SHUTDOWN");
        let e = q.execute("query-status", None).unwrap_err();
        assert!(
            matches!(
                e,
                QmpError::Peer {
                    source: PeerError::TooManyMessages,
                    ..
                }
            ),
            "{e}"
        );
        // The event watched for is kept; nothing else was.
        let ev = q.wait_event("SHUTDOWN", Duration::from_secs(1)).unwrap();
        assert_eq!(ev["event"], "SHUTDOWN");
    }

    #[test]
    fn a_dripped_greeting_ends_at_the_deadline() {
        let (_d, sock) = fake(|mut c| {
            for b in b"{\"QMP\": ".iter().chain([b' '; 10_000].iter()) {
                if c.write_all(&[*b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        // A timeout per read would wait for all 10 000 bytes (500 s).
        let e = Qmp::connect(&sock, Duration::from_millis(500)).unwrap_err();
        assert!(
            matches!(
                e,
                QmpError::Peer {
                    source: PeerError::TimedOut,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn a_huge_or_binary_answer_is_refused() {
        let (_d, sock) = fake(|mut c| {
            let _ = c.write_all(GREETING);
            let mut big = b"{\"event\": \"PAD\", \"data\": \"".to_vec();
            big.extend(vec![b'x'; 60_000]);
            big.extend(b"\"}\r\n");
            for _ in 0..200 {
                if c.write_all(&big).is_err() {
                    return;
                }
            }
        });
        let e = Qmp::connect(&sock, Duration::from_secs(5)).unwrap_err();
        assert!(
            matches!(
                e,
                QmpError::Peer {
                    source: PeerError::ConnectionTooLarge,
                    ..
                }
            ),
            "{e}"
        );
        let (_d, sock) = fake(|mut c| {
            let _ = c.write_all(b"{\"QMP\": \"\xff\x1b[2J\"}\r\n");
        });
        let e = Qmp::connect(&sock, Duration::from_secs(5)).unwrap_err();
        assert!(e.to_string().contains("not UTF-8"), "{e}");
    }
}
