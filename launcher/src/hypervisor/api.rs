//! A minimal HTTP/1.1 client over a unix socket, for cloud-hypervisor's and
//! firecracker's control API (`control/api.sock`). Blocking, one request per
//! connection, no threads, no runtime. Like QMP, it only talks to a peer
//! running as the control dir's owner ([`crate::host::peer::connect`]) and reads a
//! bounded response under an overall deadline.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use crate::error::{Error, Result};

/// Largest response accepted (headers + body).
const MAX_RESPONSE: usize = crate::host::peer::MAX_MESSAGE as usize;

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

fn err(path: &Path, reason: impl Into<String>) -> Error {
    Error::Api {
        path: path.to_path_buf(),
        reason: reason.into(),
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
pub fn parse_response(buf: &[u8], eof: bool) -> std::result::Result<Option<Response>, String> {
    let Some(hend) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if eof {
            Err("connection closed before the response headers ended".into())
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
        return Err(format!("not an HTTP response: {status_line:?}"));
    }
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let mut content_length: Option<usize> = None;
    for l in lines {
        if let Some((k, v)) = l.split_once(':') {
            if k.trim().eq_ignore_ascii_case("content-length") {
                content_length = v.trim().parse().ok();
            }
        }
    }
    let body = &buf[hend + 4..];
    let body = match content_length {
        Some(n) if body.len() >= n => &body[..n],
        Some(_) if !eof => return Ok(None),
        Some(n) => return Err(format!("body ended after {} of {n} bytes", body.len())),
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

/// One request on a fresh connection to `sock`.
pub fn request(
    sock: &Path,
    method: &str,
    uri: &str,
    body: Option<&str>,
    timeout: Duration,
) -> Result<Response> {
    let deadline = std::time::Instant::now() + timeout;
    let mut s: UnixStream = crate::host::peer::connect(sock, timeout).map_err(|e| err(sock, e))?;
    s.set_write_timeout(Some(timeout))
        .map_err(|e| err(sock, format!("set timeout: {e}")))?;
    s.write_all(&render_request(method, uri, body))
        .map_err(|e| err(sock, format!("{method} {uri}: write: {e}")))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if std::time::Instant::now() > deadline {
            return Err(err(
                sock,
                format!("{method} {uri}: no complete response within {timeout:?}"),
            ));
        }
        // Each read gets only what is left of the overall deadline.
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .map_err(|e| err(sock, format!("set timeout: {e}")))?;
        let n = s
            .read(&mut chunk)
            .map_err(|e| err(sock, format!("{method} {uri}: read: {e}")))?;
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_RESPONSE {
            return Err(err(
                sock,
                format!("{method} {uri}: response over {MAX_RESPONSE} bytes"),
            ));
        }
        match parse_response(&buf, n == 0) {
            Ok(Some(r)) => return Ok(r),
            Ok(None) => {}
            Err(e) => return Err(err(sock, format!("{method} {uri}: {e}"))),
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
        return Err(err(
            sock,
            format!("{method} {uri}: HTTP {}: {}", r.status, r.body.trim()),
        ));
    }
    Ok(r)
}

/// Does an HTTP server answer on `sock`? (liveness: any response counts)
pub fn answers(sock: &Path) -> bool {
    request(sock, "GET", "/", None, Duration::from_millis(500)).is_ok()
}

/// The VM's state from its API: cloud-hypervisor `GET /api/v1/vm.info`,
/// firecracker `GET /`; both answer JSON with a `state` field.
pub fn vm_state(
    sock: &Path,
    kind: crate::config::spec::HypervisorKind,
    timeout: Duration,
) -> Result<String> {
    let uri = match kind {
        crate::config::spec::HypervisorKind::CloudHypervisor => "/api/v1/vm.info",
        _ => "/",
    };
    let r = expect_ok(sock, "GET", uri, None, timeout)?;
    let v: serde_json::Value = serde_json::from_str(&r.body)
        .map_err(|e| err(sock, format!("GET {uri}: bad JSON: {e}")))?;
    Ok(v.get("state")
        .and_then(|s| s.as_str())
        .unwrap_or("unknown")
        .to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(parse_response(&full[..full.len() - 3], true).is_err());
        let nc = b"HTTP/1.1 204 No Content\r\nServer: Firecracker API\r\n\r\n";
        assert_eq!(parse_response(nc, false).unwrap().unwrap().status, 204);
        let to_eof = b"HTTP/1.0 400 Bad Request\r\n\r\nnope";
        assert_eq!(parse_response(to_eof, false).unwrap(), None);
        let r = parse_response(to_eof, true).unwrap().unwrap();
        assert_eq!((r.status, r.body.as_str()), (400, "nope"));
        assert!(!r.ok());
        assert!(parse_response(b"SSH-2.0-x\r\n\r\n", false).is_err());
        assert!(parse_response(b"", true).is_err());
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
            crate::config::spec::HypervisorKind::CloudHypervisor,
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(st, "Paused");
        assert!(server
            .join()
            .unwrap()
            .starts_with("GET /api/v1/vm.info HTTP/1.1\r\n"));
    }
}
