//! What the emulators of AWS APIs share (the PCS registration API in [`crate::pcs`], EC2's
//! capacity reservation calls in [`crate::ec2`]): an HTTP server on a thread of its own, and
//! SigV4 request signatures checked the way AWS checks them (AWS General Reference, "Create
//! a signed AWS API request").

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::thread::JoinHandle;

use bytes::Bytes;
use hmac::{Hmac, KeyInit, Mac};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use sha2::{Digest, Sha256};

/// A response of an emulated API.
pub(crate) type Resp = Response<Full<Bytes>>;

/// A server answering each request with `handler`, on a thread with its own current-thread
/// tokio runtime; dropping it stops the server and joins the thread.
#[derive(Debug)]
pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Binds `addr` (port 0: a free one; the socket stays in the network namespace the
    /// caller runs in) and serves HTTP/1.1 with `handler`, on a thread named
    /// `<name>-<port>` with a current-thread runtime.
    ///
    /// # Errors
    /// When the socket, runtime or thread cannot be created.
    pub(crate) fn start<H, F, E>(addr: SocketAddr, name: &str, handler: H) -> io::Result<Server>
    where
        H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
        F: Future<Output = Result<Resp, E>> + Send + 'static,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        Self::start_on(addr, name, runtime, handler)
    }

    /// [`Server::start`] on `runtime` (a multi-threaded one for a handler that waits on
    /// another server).
    ///
    /// # Errors
    /// When the socket or thread cannot be created.
    pub(crate) fn start_on<H, F, E>(
        addr: SocketAddr,
        name: &str,
        runtime: tokio::runtime::Runtime,
        handler: H,
    ) -> io::Result<Server>
    where
        H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
        F: Future<Output = Result<Resp, E>> + Send + 'static,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let std_listener = std::net::TcpListener::bind(addr)?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let listener = {
            let _guard = runtime.enter();
            tokio::net::TcpListener::from_std(std_listener)?
        };
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("{name}-{}", addr.port()))
            .spawn(move || {
                runtime.block_on(async move {
                    loop {
                        tokio::select! {
                            _ = &mut stopped => break,
                            accepted = listener.accept() => match accepted {
                                Ok((stream, _)) => {
                                    let handler = handler.clone();
                                    tokio::spawn(async move {
                                        let io = hyper_util::rt::TokioIo::new(stream);
                                        let service = hyper::service::service_fn(handler);
                                        let _ = hyper::server::conn::http1::Builder::new()
                                            .serve_connection(io, service)
                                            .await;
                                    });
                                }
                                Err(_) => {
                                    tokio::time::sleep(std::time::Duration::from_millis(50))
                                        .await;
                                }
                            },
                        }
                    }
                });
            })?;
        Ok(Server {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

pub(crate) fn header<'a>(h: &'a hyper::HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// The parsed `Authorization: AWS4-HMAC-SHA256 Credential=..., SignedHeaders=...,
/// Signature=...` header.
pub(crate) struct SigV4<'a> {
    pub(crate) access_key_id: &'a str,
    pub(crate) date: &'a str,
    pub(crate) region: &'a str,
    pub(crate) service: &'a str,
    pub(crate) signed_headers: Vec<&'a str>,
    pub(crate) signature: &'a str,
}

pub(crate) fn parse_authorization(value: &str) -> Option<SigV4<'_>> {
    let rest = value.strip_prefix("AWS4-HMAC-SHA256 ")?;
    let mut credential = None;
    let mut signed = None;
    let mut signature = None;
    for part in rest.split(',') {
        let (k, v) = part.trim().split_once('=')?;
        match k {
            "Credential" => credential = Some(v),
            "SignedHeaders" => signed = Some(v),
            "Signature" => signature = Some(v),
            _ => return None,
        }
    }
    let scope: Vec<&str> = credential?.split('/').collect();
    if scope.len() != 5 || scope[4] != "aws4_request" {
        return None;
    }
    Some(SigV4 {
        access_key_id: scope[0],
        date: scope[1],
        region: scope[2],
        service: scope[3],
        signed_headers: signed?.split(';').collect(),
        signature: signature?,
    })
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC takes keys of any length.
    let mut mac = match <Hmac<Sha256> as KeyInit>::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => return Vec::new(),
    };
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// The signature SigV4 expects for this request (AWS General Reference, "Create a signed
/// AWS API request"): canonical request, string to sign, derived signing key.
pub(crate) fn expected_signature(
    parts: &hyper::http::request::Parts,
    body: &[u8],
    auth: &SigV4<'_>,
    secret: &str,
) -> Option<String> {
    let mut canonical_headers = String::new();
    for name in &auth.signed_headers {
        let value = if *name == "host" {
            header(&parts.headers, "host")?.to_string()
        } else {
            let values: Vec<&str> = parts
                .headers
                .get_all(*name)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .collect();
            if values.is_empty() {
                return None;
            }
            values.join(",")
        };
        let collapsed = value.split_whitespace().collect::<Vec<_>>().join(" ");
        canonical_headers.push_str(&format!("{name}:{collapsed}\n"));
    }
    let payload_hash = match header(&parts.headers, "x-amz-content-sha256") {
        Some(h) => h.to_string(),
        None => hex::encode(Sha256::digest(body)),
    };
    let path = if parts.uri.path().is_empty() {
        "/"
    } else {
        parts.uri.path()
    };
    let canonical_request = format!(
        "{}\n{}\n{}\n{}\n{}\n{}",
        parts.method,
        path,
        parts.uri.query().unwrap_or(""),
        canonical_headers,
        auth.signed_headers.join(";"),
        payload_hash
    );
    let amz_date = header(&parts.headers, "x-amz-date")?;
    let scope = format!(
        "{}/{}/{}/aws4_request",
        auth.date, auth.region, auth.service
    );
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex::encode(Sha256::digest(canonical_request.as_bytes()))
    );
    let k_date = hmac(format!("AWS4{secret}").as_bytes(), auth.date.as_bytes());
    let k_region = hmac(&k_date, auth.region.as_bytes());
    let k_service = hmac(&k_region, auth.service.as_bytes());
    let k_signing = hmac(&k_service, b"aws4_request");
    Some(hex::encode(hmac(&k_signing, string_to_sign.as_bytes())))
}

/// A request id as AWS's query APIs write them: a random UUID (version 4).
pub(crate) fn request_id() -> String {
    let h = format!("{:032x}", rand::random::<u128>());
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

/// XML text: `&`, `<`, `>`, `"` and `'` escaped.
pub(crate) fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// An XML answer of a query-protocol API (`content_type` as the service sends it).
pub(crate) fn xml_response(status: StatusCode, content_type: &'static str, body: String) -> Resp {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// `application/x-www-form-urlencoded` pairs, in order (`+` is a space, `%XX` a byte; a
/// `%` not followed by two hex digits stays as it is).
pub(crate) fn form_pairs(body: &[u8]) -> Vec<(String, String)> {
    fn decode(s: &str) -> String {
        let b = s.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < b.len() => {
                    let hex = |c: u8| char::from(c).to_digit(16);
                    match (hex(b[i + 1]), hex(b[i + 2])) {
                        (Some(h), Some(l)) => {
                            out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                            i += 2;
                        }
                        _ => out.push(b'%'),
                    }
                }
                c => out.push(c),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    String::from_utf8_lossy(body)
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}
