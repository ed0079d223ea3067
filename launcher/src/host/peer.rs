//! Connecting to a VM's control socket as root, safely.
//!
//! The control dir belongs to the VM's principal, so a compromised VM can
//! plant anything there — a symlink to another VM's socket, or a server of
//! its own. Root's tools therefore (1) accept a peer only when its uid is
//! the uid that owns the control dir (`SO_PEERCRED`), and (2) read bounded
//! messages under an overall deadline.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;

/// Longest line (QMP message, HTTP response) accepted from a VM.
pub const MAX_MESSAGE: u64 = 64 * 1024;
/// Most bytes one connection to a VM-controlled socket may deliver, all
/// its messages together.
pub const MAX_CONNECTION_BYTES: u64 = 1024 * 1024;
/// Most messages (QMP lines: greeting, replies and events together) one
/// connection may deliver. A conversation of root's tools takes a handful;
/// a stream of tiny events ends the connection here.
pub const MAX_CONNECTION_MESSAGES: u32 = 256;

/// Why a control socket could not be talked to.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("{sock} has no parent directory")]
    NoParent { sock: PathBuf },
    #[error("stat {dir}: {source}")]
    StatDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{dir} is not a directory")]
    NotADirectory { dir: PathBuf },
    /// `socket`, `SO_SNDTIMEO`, `address`, `connect`, `SO_PEERCRED`.
    #[error("{op}: {errno}")]
    Sys {
        op: &'static str,
        #[source]
        errno: Errno,
    },
    #[error("connect: no answer within {timeout:?} (backlog full)")]
    Backlog { timeout: Duration },
    #[error("the peer on {sock} runs as uid {peer}, not as uid {owner} which owns {dir}; refusing to talk to it (a symlink planted by the VM?)")]
    WrongPeer {
        sock: PathBuf,
        peer: u32,
        owner: u32,
        dir: PathBuf,
    },
    #[error("timed out")]
    TimedOut,
    /// `set timeout`, `read`.
    #[error("{op}: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("message longer than {MAX_MESSAGE} bytes")]
    TooLong,
    #[error("connection closed mid-message")]
    ClosedMidMessage,
    #[error("connection delivered more than {MAX_CONNECTION_BYTES} bytes")]
    ConnectionTooLarge,
    #[error("connection delivered more than {MAX_CONNECTION_MESSAGES} messages")]
    TooManyMessages,
}

fn sys(op: &'static str) -> impl FnOnce(Errno) -> PeerError {
    move |errno| PeerError::Sys { op, errno }
}

fn io(op: &'static str) -> impl FnOnce(std::io::Error) -> PeerError {
    move |source| PeerError::Io { op, source }
}

/// Connect to `sock` and check that the process on the other end runs as
/// the uid owning the socket's directory (the VM's principal). A socket
/// whose peer is anyone else — e.g. reached through a symlink the VM
/// planted — is refused.
/// `timeout` bounds the connect itself (`SO_SNDTIMEO` applies to a Unix
/// stream connect): a VM can fill its own listener's backlog, and a plain
/// blocking connect would then wait forever.
pub fn connect(sock: &Path, timeout: Duration) -> Result<UnixStream, PeerError> {
    let dir = sock.parent().ok_or_else(|| PeerError::NoParent {
        sock: sock.to_path_buf(),
    })?;
    let dmd = std::fs::symlink_metadata(dir).map_err(|source| PeerError::StatDir {
        dir: dir.to_path_buf(),
        source,
    })?;
    if !dmd.is_dir() {
        return Err(PeerError::NotADirectory {
            dir: dir.to_path_buf(),
        });
    }
    use nix::sys::socket::{self as so, sockopt};
    let fd = so::socket(
        so::AddressFamily::Unix,
        so::SockType::Stream,
        so::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(sys("socket"))?;
    // A zero SO_SNDTIMEO means "no timeout": a zero timeout becomes 1 µs.
    let micros = timeout
        .subsec_micros()
        .max(if timeout.is_zero() { 1 } else { 0 });
    let tv = nix::sys::time::TimeVal::new(
        libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        libc::suseconds_t::from(micros),
    );
    so::setsockopt(&fd, sockopt::SendTimeout, &tv).map_err(sys("SO_SNDTIMEO"))?;
    let addr = so::UnixAddr::new(sock).map_err(sys("address"))?;
    so::connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr).map_err(|e| match e {
        Errno::EAGAIN | Errno::EINPROGRESS => PeerError::Backlog { timeout },
        errno => PeerError::Sys {
            op: "connect",
            errno,
        },
    })?;
    let s = UnixStream::from(fd);
    let cred = so::getsockopt(&s, sockopt::PeerCredentials).map_err(sys("SO_PEERCRED"))?;
    if cred.uid() != dmd.uid() {
        return Err(PeerError::WrongPeer {
            sock: sock.to_path_buf(),
            peer: cred.uid(),
            owner: dmd.uid(),
            dir: dir.to_path_buf(),
        });
    }
    Ok(s)
}

/// Cut the first `\n`-terminated line (newline included) off `pending`.
/// Pure: what a fuzzer calls. Err when no newline is within the first
/// [`MAX_MESSAGE`] bytes (no message may be longer).
pub fn take_line(pending: &mut Vec<u8>) -> Result<Option<Vec<u8>>, PeerError> {
    let limit = pending.len().min(MAX_MESSAGE as usize);
    match pending[..limit].iter().position(|&b| b == b'\n') {
        Some(i) => {
            let rest = pending.split_off(i + 1);
            Ok(Some(std::mem::replace(pending, rest)))
        }
        None if pending.len() >= MAX_MESSAGE as usize => Err(PeerError::TooLong),
        None => Ok(None),
    }
}

/// What one read before a deadline gave.
#[derive(Debug)]
pub enum DeadlineRead {
    /// `n` bytes (0: end of stream).
    Bytes(usize),
    /// The deadline passed, before the read or during it.
    TimedOut,
    /// The read timeout could not be set.
    SetTimeout(std::io::Error),
    /// The read failed otherwise.
    Failed(std::io::Error),
}

/// One `read(2)` from a VM-controlled socket that waits for no more than
/// what is left until `deadline`, checked again before every read (a
/// per-read timeout alone lets a peer that drips a byte at a time hold the
/// caller for ever). QMP's line reader and the cloud-hypervisor and
/// firecracker HTTP client both read through it.
pub fn read_before(stream: &mut UnixStream, chunk: &mut [u8], deadline: Instant) -> DeadlineRead {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return DeadlineRead::TimedOut;
        }
        if let Err(e) = stream.set_read_timeout(Some(left.max(Duration::from_millis(1)))) {
            return DeadlineRead::SetTimeout(e);
        }
        match stream.read(chunk) {
            Ok(n) => return DeadlineRead::Bytes(n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return DeadlineRead::TimedOut
            }
            Err(e) => return DeadlineRead::Failed(e),
        }
    }
}

/// The reading side of one connection to a VM-controlled socket: lines of
/// at most [`MAX_MESSAGE`] bytes, at most [`MAX_CONNECTION_BYTES`] and
/// [`MAX_CONNECTION_MESSAGES`] in all, each before its caller's deadline.
/// The deadline is checked again before every `read(2)`, and each read may
/// wait only for what is left of it: a peer dripping one byte at a time
/// holds a caller no longer than the deadline.
#[derive(Debug)]
pub struct LineReader {
    stream: UnixStream,
    pending: Vec<u8>,
    bytes: u64,
    messages: u32,
}

impl LineReader {
    pub fn new(stream: UnixStream) -> LineReader {
        LineReader {
            stream,
            pending: Vec::new(),
            bytes: 0,
            messages: 0,
        }
    }

    /// The next line, newline included; `Ok(None)` at end of stream.
    pub fn next_line(&mut self, deadline: Instant) -> Result<Option<Vec<u8>>, PeerError> {
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(line) = take_line(&mut self.pending)? {
                self.messages += 1;
                if self.messages > MAX_CONNECTION_MESSAGES {
                    return Err(PeerError::TooManyMessages);
                }
                return Ok(Some(line));
            }
            let n = match read_before(&mut self.stream, &mut chunk, deadline) {
                DeadlineRead::Bytes(n) => n,
                DeadlineRead::TimedOut => return Err(PeerError::TimedOut),
                DeadlineRead::SetTimeout(e) => return Err(io("set timeout")(e)),
                DeadlineRead::Failed(e) => {
                    return Err(PeerError::Io {
                        op: "read",
                        source: e,
                    })
                }
            };
            if n == 0 {
                return if self.pending.is_empty() {
                    Ok(None)
                } else {
                    Err(PeerError::ClosedMidMessage)
                };
            }
            self.bytes += n as u64;
            if self.bytes > MAX_CONNECTION_BYTES {
                return Err(PeerError::ConnectionTooLarge);
            }
            self.pending.extend_from_slice(&chunk[..n]);
        }
    }
}
