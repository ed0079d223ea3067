//! Connecting to a VM's control socket as root, safely.
//!
//! The control dir belongs to the VM's principal, so a compromised VM can
//! plant anything there — a symlink to another VM's socket, or a server of
//! its own. Root's tools therefore (1) accept a peer only when its uid is
//! the uid that owns the control dir (`SO_PEERCRED`), and (2) read bounded
//! messages under an overall deadline.

use std::io::{BufRead, Read};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// Longest line (QMP message, HTTP header block) accepted from a VM.
pub const MAX_MESSAGE: u64 = 64 * 1024;

/// Connect to `sock` and check that the process on the other end runs as
/// the uid owning the socket's directory (the VM's principal). A socket
/// whose peer is anyone else — e.g. reached through a symlink the VM
/// planted — is refused.
pub fn connect(sock: &Path) -> Result<UnixStream, String> {
    let dir = sock
        .parent()
        .ok_or_else(|| format!("{} has no parent directory", sock.display()))?;
    let dmd = std::fs::symlink_metadata(dir).map_err(|e| format!("stat {}: {e}", dir.display()))?;
    if !dmd.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    let s = UnixStream::connect(sock).map_err(|e| format!("connect: {e}"))?;
    let cred = nix::sys::socket::getsockopt(&s, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(|e| format!("SO_PEERCRED: {e}"))?;
    if cred.uid() != dmd.uid() {
        return Err(format!(
            "the peer on {} runs as uid {}, not as uid {} which owns {}; refusing to talk to it (a symlink planted by the VM?)",
            sock.display(),
            cred.uid(),
            dmd.uid(),
            dir.display()
        ));
    }
    Ok(s)
}

/// Read one `\n`-terminated line of at most [`MAX_MESSAGE`] bytes before
/// `deadline`. `Ok(None)` at end of stream.
pub fn read_line<R: BufRead>(
    r: &mut R,
    stream: &UnixStream,
    deadline: Instant,
) -> Result<Option<String>, String> {
    let mut buf = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("timed out".into());
        }
        stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .map_err(|e| format!("set timeout: {e}"))?;
        let room = MAX_MESSAGE + 1 - buf.len() as u64;
        let n = r
            .by_ref()
            .take(room)
            .read_until(b'\n', &mut buf)
            .map_err(|e| format!("read: {e}"))?;
        if buf.len() as u64 > MAX_MESSAGE {
            return Err(format!("message longer than {MAX_MESSAGE} bytes"));
        }
        if n == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err("connection closed mid-message".into())
            };
        }
        if buf.ends_with(b"\n") {
            return String::from_utf8(buf)
                .map(Some)
                .map_err(|_| "message is not UTF-8".into());
        }
    }
}
