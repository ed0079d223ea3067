//! A small QMP client over the control socket: greeting, capabilities
//! negotiation, commands, events. Blocking with timeouts; no threads.

use std::io::{BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::host::peer::{self, PeerError};

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
    #[error("QMP {path}: bad JSON {line:?}: {source}")]
    BadJson {
        path: PathBuf,
        line: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("QMP {path}: {source}")]
    Encode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("QMP {path}: unexpected greeting {greeting}")]
    Greeting { path: PathBuf, greeting: Value },
    /// The command's `error` reply.
    #[error("QMP {path}: {cmd}: {error}")]
    Command {
        path: PathBuf,
        cmd: String,
        error: Value,
    },
    #[error("QMP {path}: timed out waiting for event {event}")]
    EventTimeout { path: PathBuf, event: String },
}

type Result<T, E = QmpError> = std::result::Result<T, E>;

#[derive(Debug)]
pub struct Qmp {
    path: PathBuf,
    timeout: Duration,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    pub greeting: Value,
    pub events: Vec<Value>,
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
    /// capabilities. Every command gets `timeout` as an overall deadline.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Qmp> {
        let s = peer::connect(path, timeout).map_err(Self::peer_err(path))?;
        s.set_write_timeout(Some(timeout))
            .map_err(Self::io_err(path, "set timeout"))?;
        let writer = s.try_clone().map_err(Self::io_err(path, "dup"))?;
        let mut q = Qmp {
            path: path.to_path_buf(),
            timeout,
            reader: BufReader::new(s),
            writer,
            greeting: Value::Null,
            events: Vec::new(),
        };
        let g = q.read_msg(Instant::now() + timeout)?;
        if g.get("QMP").is_none() {
            return Err(QmpError::Greeting {
                path: path.to_path_buf(),
                greeting: g,
            });
        }
        q.greeting = g;
        q.execute("qmp_capabilities", None)?;
        Ok(q)
    }

    /// One message, bounded in size (a VM controls the other end) and in time.
    fn read_msg(&mut self, deadline: Instant) -> Result<Value> {
        let stream = self
            .writer
            .try_clone()
            .map_err(Self::io_err(&self.path, "dup"))?;
        let line = peer::read_line(&mut self.reader, &stream, deadline)
            .map_err(Self::peer_err(&self.path))?
            .ok_or_else(|| QmpError::Closed {
                path: self.path.clone(),
            })?;
        serde_json::from_str(&line).map_err(|source| QmpError::BadJson {
            path: self.path.clone(),
            line,
            source,
        })
    }

    /// Run a command; returns its `return` value. Events seen meanwhile are kept.
    pub fn execute(&mut self, cmd: &str, args: Option<Value>) -> Result<Value> {
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
        let deadline = Instant::now() + self.timeout;
        loop {
            let m = self.read_msg(deadline)?;
            if m.get("event").is_some() {
                self.events.push(m);
                continue;
            }
            if let Some(e) = m.get("error") {
                return Err(QmpError::Command {
                    path: self.path.clone(),
                    cmd: cmd.to_string(),
                    error: e.clone(),
                });
            }
            return Ok(m.get("return").cloned().unwrap_or(Value::Null));
        }
    }

    /// `query-status` → the run state, e.g. "running".
    pub fn status(&mut self) -> Result<String> {
        let v = self.execute("query-status", None)?;
        Ok(v.get("status")
            .and_then(|s| s.as_str())
            .unwrap_or("unknown")
            .to_string())
    }

    /// Wait until an event named `name` arrives or `timeout` passes.
    pub fn wait_event(&mut self, name: &str, timeout: Duration) -> Result<Value> {
        if let Some(e) = self.events.iter().find(|e| e["event"] == name) {
            return Ok(e.clone());
        }
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            match self.read_msg(end) {
                Ok(m) if m["event"] == name => {
                    self.events.push(m.clone());
                    return Ok(m);
                }
                Ok(m) => self.events.push(m),
                Err(e) => return Err(e),
            }
        }
        Err(QmpError::EventTimeout {
            path: self.path.clone(),
            event: name.to_string(),
        })
    }
}

/// One QMP message, as [`Qmp::execute`] sorts what it reads: an event
/// (kept), a command's `error`, or its `return` value (`null` when absent).
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Event(Value),
    Error(Value),
    Return(Value),
}

/// Parse and sort one line read from the socket without a socket: the pure
/// part of reading a QMP message, the entry point the fuzz targets drive.
pub fn parse_reply(line: &str) -> std::result::Result<Reply, serde_json::Error> {
    let m: Value = serde_json::from_str(line)?;
    Ok(if m.get("event").is_some() {
        Reply::Event(m)
    } else if let Some(e) = m.get("error") {
        Reply::Error(e.clone())
    } else {
        Reply::Return(m.get("return").cloned().unwrap_or(Value::Null))
    })
}
