//! A minimal blocking HTTP/1.1 client over `TcpStream` for the integration tests, and
//! access to the golden files copied from AEMM into `tests/golden/`.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

/// Generous bound so a broken server fails a test instead of hanging it.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// A parsed HTTP response.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8(self.body.clone()).unwrap()
    }
}

/// Sends raw bytes, reads until the server closes; the raw answer.
pub fn raw(addr: SocketAddr, request: &[u8], timeout: Duration) -> std::io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.write_all(request)?;
    let mut out = Vec::new();
    stream.read_to_end(&mut out)?;
    Ok(out)
}

/// Parses a raw HTTP/1.1 response (the whole body is whatever follows the head).
pub fn parse(raw: &[u8]) -> Resp {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no response head in {:?}", String::from_utf8_lossy(raw)));
    let head = std::str::from_utf8(&raw[..split]).unwrap();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    let status = status_line.split(' ').nth(1).unwrap().parse().unwrap();
    let headers = lines
        .map(|l| {
            let (k, v) = l.split_once(':').unwrap();
            (k.trim().to_owned(), v.trim().to_owned())
        })
        .collect();
    Resp {
        status,
        headers,
        body: raw[split + 4..].to_vec(),
    }
}

/// One request with `Connection: close`.
pub fn try_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> std::io::Result<Resp> {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    let answer = raw(addr, &bytes, timeout)?;
    if answer.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "connection closed without a response",
        ));
    }
    Ok(parse(&answer))
}

pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    try_request(addr, method, path, headers, body, IO_TIMEOUT).unwrap()
}

/// A new token with the given TTL header value; panics unless the PUT answers 200.
pub fn token(addr: SocketAddr, ttl: &str) -> String {
    let resp = request(
        addr,
        "PUT",
        "/latest/api/token",
        &[("X-aws-ec2-metadata-token-ttl-seconds", ttl)],
        b"",
    );
    assert_eq!(resp.status, 200, "token PUT: {}", resp.text());
    resp.text()
}

/// GET with a token.
pub fn get(addr: SocketAddr, path: &str, token: &str) -> Resp {
    request(
        addr,
        "GET",
        path,
        &[("X-aws-ec2-metadata-token", token)],
        b"",
    )
}

pub fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// A golden file copied from AEMM's `test/e2e/golden/`.
pub fn golden(rel: &str) -> Vec<u8> {
    std::fs::read(golden_dir().join(rel)).unwrap()
}
