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
/// `timeout` bounds the connect itself (`SO_SNDTIMEO` applies to a Unix
/// stream connect): a VM can fill its own listener's backlog, and a plain
/// blocking connect would then wait forever.
pub fn connect(sock: &Path, timeout: Duration) -> Result<UnixStream, String> {
    let dir = sock
        .parent()
        .ok_or_else(|| format!("{} has no parent directory", sock.display()))?;
    let dmd = std::fs::symlink_metadata(dir).map_err(|e| format!("stat {}: {e}", dir.display()))?;
    if !dmd.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    use nix::sys::socket::{self as so, sockopt};
    let fd = so::socket(
        so::AddressFamily::Unix,
        so::SockType::Stream,
        so::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| format!("socket: {e}"))?;
    let tv = nix::sys::time::TimeVal::new(
        timeout.as_secs() as _,
        timeout
            .subsec_micros()
            .max(if timeout.is_zero() { 1 } else { 0 }) as _,
    );
    so::setsockopt(&fd, sockopt::SendTimeout, &tv).map_err(|e| format!("SO_SNDTIMEO: {e}"))?;
    let addr = so::UnixAddr::new(sock).map_err(|e| format!("address: {e}"))?;
    so::connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr).map_err(|e| match e {
        nix::errno::Errno::EAGAIN | nix::errno::Errno::EINPROGRESS => {
            format!("connect: no answer within {timeout:?} (backlog full)")
        }
        e => format!("connect: {e}"),
    })?;
    let s = UnixStream::from(fd);
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
