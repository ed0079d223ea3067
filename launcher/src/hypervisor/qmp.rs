//! A small QMP client over the control socket: greeting, capabilities
//! negotiation, commands, events. Blocking with timeouts; no threads.

use std::io::{BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::error::{Error, Result};

pub struct Qmp {
    path: PathBuf,
    timeout: Duration,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    pub greeting: Value,
    pub events: Vec<Value>,
}

impl Qmp {
    fn err(path: &Path, reason: impl Into<String>) -> Error {
        Error::Qmp {
            path: path.to_path_buf(),
            reason: reason.into(),
        }
    }

    /// Connect (only to a peer running as the control dir's owner, see
    /// [`crate::host::peer::connect`]), read the greeting and negotiate
    /// capabilities. Every command gets `timeout` as an overall deadline.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Qmp> {
        let s = crate::host::peer::connect(path, timeout).map_err(|e| Self::err(path, e))?;
        s.set_write_timeout(Some(timeout))
            .map_err(|e| Self::err(path, format!("set timeout: {e}")))?;
        let writer = s
            .try_clone()
            .map_err(|e| Self::err(path, format!("dup: {e}")))?;
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
            return Err(Self::err(path, format!("unexpected greeting {g}")));
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
            .map_err(|e| Self::err(&self.path, format!("dup: {e}")))?;
        let line = crate::host::peer::read_line(&mut self.reader, &stream, deadline)
            .map_err(|e| Self::err(&self.path, e))?
            .ok_or_else(|| Self::err(&self.path, "connection closed"))?;
        serde_json::from_str(&line)
            .map_err(|e| Self::err(&self.path, format!("bad JSON {line:?}: {e}")))
    }

    /// Run a command; returns its `return` value. Events seen meanwhile are kept.
    pub fn execute(&mut self, cmd: &str, args: Option<Value>) -> Result<Value> {
        let mut msg = json!({ "execute": cmd });
        if let Some(a) = args {
            msg["arguments"] = a;
        }
        let mut bytes =
            serde_json::to_vec(&msg).map_err(|e| Self::err(&self.path, e.to_string()))?;
        bytes.extend_from_slice(b"\r\n");
        self.writer
            .write_all(&bytes)
            .map_err(|e| Self::err(&self.path, format!("write: {e}")))?;
        let deadline = Instant::now() + self.timeout;
        loop {
            let m = self.read_msg(deadline)?;
            if m.get("event").is_some() {
                self.events.push(m);
                continue;
            }
            if let Some(e) = m.get("error") {
                return Err(Self::err(&self.path, format!("{cmd}: {e}")));
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
        Err(Self::err(
            &self.path,
            format!("timed out waiting for event {name}"),
        ))
    }
}
