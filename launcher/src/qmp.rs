//! A small QMP client over the control socket: greeting, capabilities
//! negotiation, commands, events. Blocking with timeouts; no threads.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::error::{Error, Result};

pub struct Qmp {
    path: PathBuf,
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

    /// Connect, read the greeting and negotiate capabilities.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Qmp> {
        let s = UnixStream::connect(path).map_err(|e| Self::err(path, format!("connect: {e}")))?;
        s.set_read_timeout(Some(timeout))
            .and_then(|_| s.set_write_timeout(Some(timeout)))
            .map_err(|e| Self::err(path, format!("set timeout: {e}")))?;
        let writer = s
            .try_clone()
            .map_err(|e| Self::err(path, format!("dup: {e}")))?;
        let mut q = Qmp {
            path: path.to_path_buf(),
            reader: BufReader::new(s),
            writer,
            greeting: Value::Null,
            events: Vec::new(),
        };
        let g = q.read_msg()?;
        if g.get("QMP").is_none() {
            return Err(Self::err(path, format!("unexpected greeting {g}")));
        }
        q.greeting = g;
        q.execute("qmp_capabilities", None)?;
        Ok(q)
    }

    fn read_msg(&mut self) -> Result<Value> {
        let mut line = String::new();
        let n = self
            .reader
            .read_line(&mut line)
            .map_err(|e| Self::err(&self.path, format!("read: {e}")))?;
        if n == 0 {
            return Err(Self::err(&self.path, "connection closed"));
        }
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
        loop {
            let m = self.read_msg()?;
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
            let left = end
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(10));
            let _ = self.reader.get_ref().set_read_timeout(Some(left));
            match self.read_msg() {
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
