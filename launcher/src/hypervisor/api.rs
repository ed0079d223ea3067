//! A minimal HTTP/1.1 client over a unix socket, for cloud-hypervisor's and
//! firecracker's control API (`control/api.sock`). Blocking, one request per
//! connection, no threads, no runtime. Like QMP, it only talks to a peer
//! running as the control dir's owner ([`crate::host::peer::connect`]) and reads a
//! bounded response under an overall deadline.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::config::spec::HypervisorKind;
use crate::config::text::excerpt;
use crate::host::peer::{self, DeadlineRead, PeerError};

/// Largest response accepted (headers + body): one request per
/// connection, so this is also all one connection may deliver.
pub const MAX_RESPONSE: usize = peer::MAX_MESSAGE as usize;
/// How much of a VM-written body an error message quotes.
const QUOTE: usize = 200;
/// Longest VM state kept from the API (`"Running"`, `"Not started"`).
pub const MAX_STATE: usize = 64;

/// Why the bytes read are not an HTTP response.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("connection closed before the response headers ended")]
    HeadersUnterminated,
    #[error("not an HTTP response: {status_line:?}")]
    NotHttp { status_line: String },
    #[error("bad status line {status_line:?}")]
    BadStatusLine { status_line: String },
    #[error("body ended after {got} of {expected} bytes")]
    ShortBody { got: usize, expected: usize },
    #[error("response over {MAX_RESPONSE} bytes")]
    TooLarge,
}

/// A control API request that failed; every variant names the socket, and
/// those after the connect the request (`GET /api/v1/vm.info`).
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("control API {path}: {source}")]
    Connect {
        path: PathBuf,
        #[source]
        source: PeerError,
    },
    #[error("control API {path}: set timeout: {source}")]
    SetTimeout {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `write`, `read`.
    #[error("control API {path}: {request}: {op}: {source}")]
    Transfer {
        path: PathBuf,
        request: String,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("control API {path}: {request}: no complete response within {timeout:?}")]
    Timeout {
        path: PathBuf,
        request: String,
        timeout: Duration,
    },
    #[error("control API {path}: {request}: response over {MAX_RESPONSE} bytes")]
    TooLarge { path: PathBuf, request: String },
    #[error("control API {path}: {request}: {source}")]
    Http {
        path: PathBuf,
        request: String,
        #[source]
        source: HttpError,
    },
    #[error("control API {path}: {request}: HTTP {status}: {body}")]
    Status {
        path: PathBuf,
        request: String,
        status: u16,
        body: String,
    },
    #[error("control API {path}: {request}: bad JSON: {source}")]
    BadJson {
        path: PathBuf,
        request: String,
        #[source]
        source: serde_json::Error,
    },
}

type Result<T, E = ApiError> = std::result::Result<T, E>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: String,
}

impl Response {
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// The request bytes (exposed for the unit test).
pub fn render_request(method: &str, uri: &str, body: Option<&str>) -> Vec<u8> {
    let mut r =
        format!("{method} {uri} HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n");
    match body {
        Some(b) => {
            r.push_str("Content-Type: application/json\r\n");
            r.push_str(&format!("Content-Length: {}\r\n\r\n{b}", b.len()));
        }
        None => r.push_str("Content-Length: 0\r\n\r\n"),
    }
    r.into_bytes()
}

/// Parse one response from the bytes read so far. `Ok(None)`: incomplete.
/// Pure and bounded (more than [`MAX_RESPONSE`] bytes is an error, whatever
/// they hold); what a fuzzer calls. The status line and body are kept as
/// the VM wrote them (lossily decoded), to be escaped where shown.
pub fn parse_response(buf: &[u8], eof: bool) -> Result<Option<Response>, HttpError> {
    if buf.len() > MAX_RESPONSE {
        return Err(HttpError::TooLarge);
    }
    let Some(hend) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if eof {
            Err(HttpError::HeadersUnterminated)
        } else {
            Ok(None)
        };
    };
    let head = String::from_utf8_lossy(&buf[..hend]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or("");
    if !version.starts_with("HTTP/1.") {
        return Err(HttpError::NotHttp {
            status_line: excerpt(status_line, QUOTE),
        });
    }
    let status: u16 =
        parts
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| HttpError::BadStatusLine {
                status_line: excerpt(status_line, QUOTE),
            })?;
    let content_length = content_length(lines);
    let body = &buf[hend + 4..];
    let body = match content_length {
        Some(n) if body.len() >= n => &body[..n],
        Some(_) if !eof => return Ok(None),
        Some(n) => {
            return Err(HttpError::ShortBody {
                got: body.len(),
                expected: n,
            })
        }
        // No length: 204/304 and friends have no body; otherwise read to EOF.
        None if status == 204 || status == 304 || (100..200).contains(&status) => &[][..],
        None if !eof => return Ok(None),
        None => body,
    };
    Ok(Some(Response {
        status,
        body: String::from_utf8_lossy(body).into_owned(),
    }))
}

/// The `Content-Length` of a response head's header lines (the last one
/// given wins; unparsable is none).
fn content_length<'a>(lines: impl Iterator<Item = &'a str>) -> Option<usize> {
    let mut n = None;
    for l in lines {
        if let Some((k, v)) = l.split_once(':') {
            if k.trim().eq_ignore_ascii_case("content-length") {
                n = v.trim().parse().ok();
            }
        }
    }
    n
}

/// How many bytes a response whose head is complete in `buf` needs in all
/// before [`parse_response`] can return it: head plus `Content-Length`, or
/// `usize::MAX` (only end of stream completes it) without one.
fn complete_at(buf: &[u8]) -> usize {
    let Some(hend) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return usize::MAX;
    };
    let head = String::from_utf8_lossy(&buf[..hend]);
    content_length(head.split("\r\n").skip(1))
        .and_then(|n| (hend + 4).checked_add(n))
        .unwrap_or(usize::MAX)
}

/// One request on a fresh connection to `sock`.
pub fn request(
    sock: &Path,
    method: &str,
    uri: &str,
    body: Option<&str>,
    timeout: Duration,
) -> Result<Response> {
    let deadline = Instant::now() + timeout;
    let path = || sock.to_path_buf();
    let request = || format!("{method} {uri}");
    let set_timeout = |source| ApiError::SetTimeout {
        path: path(),
        source,
    };
    let transfer = |op| {
        move |source| ApiError::Transfer {
            path: path(),
            request: request(),
            op,
            source,
        }
    };
    let mut s: UnixStream = peer::connect(sock, timeout).map_err(|source| ApiError::Connect {
        path: path(),
        source,
    })?;
    s.set_write_timeout(Some(timeout)).map_err(set_timeout)?;
    s.write_all(&render_request(method, uri, body))
        .map_err(transfer("write"))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    // Parse only when a response can be complete: the head's end is looked
    // for in the new bytes alone, and once the head is in, the response is
    // parsed again only when its length is reached (or at end of stream).
    // A reply dripped one byte per read then costs O(bytes), not O(bytes²).
    let mut scanned: usize = 0;
    let mut wait_for: Option<usize> = None;
    loop {
        let n = match peer::read_before(&mut s, &mut chunk, deadline) {
            DeadlineRead::Bytes(n) => n,
            DeadlineRead::TimedOut => {
                return Err(ApiError::Timeout {
                    path: path(),
                    request: request(),
                    timeout,
                })
            }
            DeadlineRead::SetTimeout(e) => return Err(set_timeout(e)),
            DeadlineRead::Failed(e) => return Err(transfer("read")(e)),
        };
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_RESPONSE {
            return Err(ApiError::TooLarge {
                path: path(),
                request: request(),
            });
        }
        let eof = n == 0;
        let ready = eof
            || match wait_for {
                Some(at) => buf.len() >= at,
                None => {
                    let from = scanned.saturating_sub(3);
                    scanned = buf.len();
                    buf[from..].windows(4).any(|w| w == b"\r\n\r\n")
                }
            };
        if !ready {
            continue;
        }
        match parse_response(&buf, eof) {
            Ok(Some(r)) => return Ok(r),
            Ok(None) => wait_for = Some(complete_at(&buf)),
            Err(source) => {
                return Err(ApiError::Http {
                    path: path(),
                    request: request(),
                    source,
                })
            }
        }
    }
}

/// `request`, and an error unless the status is 2xx.
pub fn expect_ok(
    sock: &Path,
    method: &str,
    uri: &str,
    body: Option<&str>,
    timeout: Duration,
) -> Result<Response> {
    let r = request(sock, method, uri, body, timeout)?;
    if !r.ok() {
        return Err(ApiError::Status {
            path: sock.to_path_buf(),
            request: format!("{method} {uri}"),
            status: r.status,
            body: excerpt(r.body.trim(), QUOTE),
        });
    }
    Ok(r)
}

/// Does an HTTP server answer on `sock`? (liveness: any response counts)
pub fn answers(sock: &Path) -> bool {
    request(sock, "GET", "/", None, Duration::from_millis(500)).is_ok()
}

/// The VM's state from its API: cloud-hypervisor `GET /api/v1/vm.info`,
/// firecracker `GET /`; both answer JSON with a `state` field.
pub fn vm_state(sock: &Path, kind: HypervisorKind, timeout: Duration) -> Result<String> {
    let uri = match kind {
        HypervisorKind::CloudHypervisor => "/api/v1/vm.info",
        _ => "/",
    };
    let r = expect_ok(sock, "GET", uri, None, timeout)?;
    let v: serde_json::Value =
        serde_json::from_str(&r.body).map_err(|source| ApiError::BadJson {
            path: sock.to_path_buf(),
            request: format!("GET {uri}"),
            source,
        })?;
    Ok(v.get("state")
        .and_then(|s| s.as_str())
        .unwrap_or("unknown")
        .chars()
        .take(MAX_STATE)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn renders_requests() {
        assert_eq!(
            String::from_utf8(render_request("PUT", "/api/v1/vm.power-button", None)).unwrap(),
            "PUT /api/v1/vm.power-button HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\nContent-Length: 0\r\n\r\n"
        );
        let b = r#"{"action_type":"SendCtrlAltDel"}"#;
        let r = String::from_utf8(render_request("PUT", "/actions", Some(b))).unwrap();
        assert!(r.ends_with(&format!("Content-Length: {}\r\n\r\n{b}", b.len())));
        assert!(r.contains("Content-Type: application/json\r\n"));
    }

    #[test]
    fn parses_responses() {
        let full = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 19\r\n\r\n{\"state\":\"Running\"}";
        let r = parse_response(full, false).unwrap().unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.body, "{\"state\":\"Running\"}");
        assert_eq!(
            parse_response(&full[..full.len() - 3], false).unwrap(),
            None
        );
        parse_response(&full[..full.len() - 3], true).unwrap_err();
        let nc = b"HTTP/1.1 204 No Content\r\nServer: Firecracker API\r\n\r\n";
        assert_eq!(parse_response(nc, false).unwrap().unwrap().status, 204);
        let to_eof = b"HTTP/1.0 400 Bad Request\r\n\r\nnope";
        assert_eq!(parse_response(to_eof, false).unwrap(), None);
        let r = parse_response(to_eof, true).unwrap().unwrap();
        assert_eq!((r.status, r.body.as_str()), (400, "nope"));
        assert!(!r.ok());
        parse_response(b"SSH-2.0-x\r\n\r\n", false).unwrap_err();
        parse_response(b"", true).unwrap_err();
    }

    #[test]
    fn talks_to_a_real_unix_socket_server() {
        // A real socket and a real peer (a thread answering once),
        // not a mock: the client's read loop, framing and timeouts.
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("api.sock");
        let l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let server = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut req = Vec::new();
            let mut b = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = c.read(&mut b).unwrap();
                req.extend_from_slice(&b[..n]);
            }
            c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 18\r\n\r\n{\"state\":\"Paused\"}")
                .unwrap();
            String::from_utf8(req).unwrap()
        });
        let st = vm_state(
            &sock,
            HypervisorKind::CloudHypervisor,
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(st, "Paused");
        assert!(server
            .join()
            .unwrap()
            .starts_with("GET /api/v1/vm.info HTTP/1.1\r\n"));
    }

    /// A hostile API server (a real socket, a thread standing in for a
    /// compromised cloud-hypervisor or firecracker): `answer` gets the
    /// accepted connection once the request is read.
    fn hostile(answer: fn(&mut UnixStream)) -> Result<Response> {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("api.sock");
        let l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let server = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut b = [0u8; 1024];
            let _ = c.read(&mut b);
            answer(&mut c);
        });
        let r = request(&sock, "GET", "/", None, Duration::from_secs(1));
        drop(server);
        r
    }

    #[test]
    fn a_reply_split_anywhere_is_read_whole() {
        // The head's end is looked for in the new bytes only, and the body
        // is parsed once its length is in: a reply cut at every byte (the
        // `\r\n\r\n` across reads, the body a byte at a time) still reads
        // as the whole reply, with nothing after it waited for.
        let one_by_one = hostile(|c| {
            let reply = b"HTTP/1.1 200 OK\r\nContent-Length: 18\r\n\r\n{\"state\":\"Paused\"}";
            for b in reply {
                c.write_all(&[*b]).unwrap();
                c.flush().unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
            // Hold the connection open: the reply must not need EOF.
            std::thread::sleep(Duration::from_secs(3));
        })
        .unwrap();
        assert_eq!(
            (one_by_one.status, one_by_one.body.as_str()),
            (200, "{\"state\":\"Paused\"}")
        );
        let to_eof = hostile(|c| {
            c.write_all(b"HTTP/1.1 200 OK\r\n\r").unwrap();
            std::thread::sleep(Duration::from_millis(20));
            c.write_all(b"\nbody until").unwrap();
            std::thread::sleep(Duration::from_millis(20));
            c.write_all(b" the end").unwrap();
        })
        .unwrap();
        assert_eq!(to_eof.body, "body until the end");
    }

    #[test]
    fn a_silent_or_dripping_server_costs_the_timeout_not_more() {
        // Both end at the overall deadline (the drip would take an hour
        // with a timeout per read); how long is the root suite's business.
        let silent = hostile(|_| std::thread::sleep(Duration::from_secs(3)));
        assert!(
            matches!(silent, Err(ApiError::Timeout { .. })),
            "{silent:?}"
        );
        let drip = hostile(|c| {
            for b in b"HTTP/1.1 200 OK\r\nX: ".iter().chain([b'y'; 4000].iter()) {
                if c.write_all(&[*b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        assert!(matches!(drip, Err(ApiError::Timeout { .. })), "{drip:?}");
    }

    #[test]
    fn a_huge_or_invalid_answer_is_refused_in_bounded_memory() {
        let huge = hostile(|c| {
            let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 104857600\r\n\r\n");
            let chunk = vec![b'x'; 1 << 20];
            for _ in 0..100 {
                if c.write_all(&chunk).is_err() {
                    return;
                }
            }
        });
        assert!(matches!(huge, Err(ApiError::TooLarge { .. })), "{huge:?}");
        let binary = hostile(|c| {
            let _ = c.write_all(b"\xff\xfe\x1b[2J\r\n\r\n");
        });
        let e = binary.unwrap_err().to_string();
        assert!(
            e.contains("not an HTTP response") && !e.contains('\x1b'),
            "{e}"
        );
    }
}
