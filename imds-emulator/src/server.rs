//! The HTTP side: one hyper HTTP/1 connection per accepted socket, routing to the IMDSv2
//! token endpoint, the metadata tree, and the control API under `/__emulator/`.
//!
//! Behaviour follows EC2's instance metadata service and AEMM where they agree, and EC2
//! where they differ: the token is checked before the path is resolved (so an absent path
//! without a token is 401, not 404), and a PUT carrying `X-Forwarded-For` is refused.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE, SERVER};
use hyper::{Method, Request, Response, StatusCode};
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::fault::{Fault, FaultKind, FaultSpec, Faults};
use crate::tree::{normalize, Lookup, Tree};

/// Header of the token PUT (requested TTL) and of its response (granted TTL).
pub const TOKEN_TTL_HEADER: &str = "x-aws-ec2-metadata-token-ttl-seconds";
/// Header carrying the session token on metadata requests.
pub const TOKEN_HEADER: &str = "x-aws-ec2-metadata-token";
/// Largest token TTL IMDS grants, in seconds (6 hours).
pub const MAX_TOKEN_TTL_SECS: u64 = 21_600;
/// Prefix of the control API paths.
pub const CONTROL_PREFIX: &str = "/__emulator";

const TOKEN_PATH: &str = "/latest/api/token";

/// IMDS's 404 page (AEMM's `notFoundResponse`, with the newline Go's `http.Error` adds).
pub(crate) const NOT_FOUND_BODY: &str = "<?xml version=\"1.0\" encoding=\"iso-8859-1\"?>
<!DOCTYPE html PUBLIC \"-//W3C//DTD XHTML 1.0 Transitional//EN\"
\t\"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd\">
<html xmlns=\"http://www.w3.org/1999/xhtml\" xml:lang=\"en\" lang=\"en\">
 <head>
  <title>404 - Not Found</title>
 </head>
 <body>
  <h1>404 - Not Found</h1>
 </body>
</html>
";

/// IMDS's error page for every other status (the layout of its 400 and 401 pages).
fn error_body(status: StatusCode) -> String {
    if status == StatusCode::NOT_FOUND {
        return NOT_FOUND_BODY.to_owned();
    }
    let title = format!(
        "{} - {}",
        status.as_u16(),
        status.canonical_reason().unwrap_or("Error")
    );
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>
<!DOCTYPE html PUBLIC \"-//W3C//DTD XHTML 1.0 Transitional//EN\" \"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd\">
<html xmlns=\"http://www.w3.org/1999/xhtml\" xml:lang=\"en\" lang=\"en\">
   <head>
      <title>{title}</title>
   </head>
   <body>
      <h1>{title}</h1>
   </body>
</html>
"
    )
}

/// One request the metadata service answered (control API requests are not recorded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RequestRecord {
    /// HTTP method, e.g. `PUT` or `GET`.
    pub method: String,
    /// Request path as sent, without the query string.
    pub path: String,
    /// Status answered; `None` when the connection was dropped by an injected fault.
    pub status: Option<u16>,
}

/// Mutable emulator state, shared by the handle and the server.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) tree: Tree,
    /// Token value to the instant it expires.
    pub(crate) tokens: HashMap<String, Instant>,
    pub(crate) faults: Faults,
    pub(crate) log: Vec<RequestRecord>,
    pub(crate) allow_imdsv1: bool,
}

/// State plus the settings fixed at start.
#[derive(Debug)]
pub(crate) struct Shared {
    state: Mutex<State>,
    control_api: bool,
}

impl Shared {
    pub(crate) fn new(state: State, control_api: bool) -> Shared {
        Shared {
            state: Mutex::new(state),
            control_api,
        }
    }

    /// Locks the state; a panic while holding the lock leaves the state usable.
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The error that makes hyper close a connection without answering.
#[derive(Debug)]
pub(crate) struct DropConnection;

impl std::fmt::Display for DropConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection dropped by an injected fault")
    }
}

impl std::error::Error for DropConnection {}

type Resp = Response<Full<Bytes>>;

fn response(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Resp {
    let mut resp = Response::new(Full::new(body.into()));
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(SERVER, HeaderValue::from_static("EC2ws"));
    resp
}

fn error(status: StatusCode) -> Resp {
    response(status, "text/html", error_body(status))
}

fn text(body: impl Into<Bytes>) -> Resp {
    response(StatusCode::OK, "text/plain", body)
}

/// Answers one request.
pub(crate) async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Resp, DropConnection> {
    let path = req.uri().path().to_owned();
    if shared.control_api
        && (path == CONTROL_PREFIX || path.starts_with(&format!("{CONTROL_PREFIX}/")))
    {
        return Ok(control(&shared, req).await);
    }
    let is_token = normalize(&path) == normalize(TOKEN_PATH);
    let method = req.method().to_string();
    let record = |status: Option<u16>| {
        tracing::debug!(%method, %path, ?status, "imds request");
        shared.lock().log.push(RequestRecord {
            method: method.clone(),
            path: path.clone(),
            status,
        });
    };

    let faults = shared.lock().faults.take_for(is_token);
    for kind in faults {
        match kind {
            FaultKind::Delay(d) => tokio::time::sleep(d).await,
            FaultKind::Status(code) => {
                let status =
                    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                record(Some(status.as_u16()));
                return Ok(error(status));
            }
            FaultKind::Drop => {
                record(None);
                return Err(DropConnection);
            }
        }
    }

    let resp = if is_token {
        token(&shared, &req)
    } else {
        metadata(&shared, &req, &path)
    };
    record(Some(resp.status().as_u16()));
    Ok(resp)
}

/// `PUT /latest/api/token`: a new session token valid for the requested TTL.
fn token(shared: &Shared, req: &Request<Incoming>) -> Resp {
    if req.method() != Method::PUT {
        return error(StatusCode::METHOD_NOT_ALLOWED);
    }
    if req.headers().contains_key("x-forwarded-for") {
        return error(StatusCode::FORBIDDEN);
    }
    let ttl = req
        .headers()
        .get(TOKEN_TTL_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ttl| (1..=MAX_TOKEN_TTL_SECS).contains(ttl));
    let Some(ttl) = ttl else {
        return error(StatusCode::BAD_REQUEST);
    };
    let token = new_token();
    let now = Instant::now();
    let mut state = shared.lock();
    state.tokens.retain(|_, expiry| *expiry > now);
    state
        .tokens
        .insert(token.clone(), now + Duration::from_secs(ttl));
    drop(state);
    let mut resp = text(token);
    resp.headers_mut()
        .insert(TOKEN_TTL_HEADER, HeaderValue::from(ttl));
    resp
}

/// 32 random bytes, base64 (standard alphabet), like AEMM's tokens.
fn new_token() -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: [u8; 33] = rand::random();
    bytes
        .chunks(3)
        .flat_map(|c| {
            let n = (u32::from(c[0]) << 16) | (u32::from(c[1]) << 8) | u32::from(c[2]);
            (0..4).map(move |i| char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]))
        })
        .collect()
}

/// GETs of `/`, `/latest/` and everything below it.
fn metadata(shared: &Shared, req: &Request<Incoming>, path: &str) -> Resp {
    if req.method() != Method::GET {
        return error(StatusCode::METHOD_NOT_ALLOWED);
    }
    let state = shared.lock();
    match req.headers().get(TOKEN_HEADER) {
        Some(token) => {
            let valid = token
                .to_str()
                .ok()
                .and_then(|t| state.tokens.get(t))
                .is_some_and(|expiry| *expiry > Instant::now());
            if !valid {
                return error(StatusCode::UNAUTHORIZED);
            }
        }
        None if !state.allow_imdsv1 => return error(StatusCode::UNAUTHORIZED),
        None => {}
    }
    let Some(path) = percent_decode(path) else {
        return error(StatusCode::NOT_FOUND);
    };
    if path == "/" {
        return text("latest");
    }
    let rest = match path.strip_prefix("/latest") {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => normalize(rest),
        _ => return error(StatusCode::NOT_FOUND),
    };
    if rest.is_empty() {
        let mut listing = String::from("dynamic\nmeta-data");
        if state.tree.contains("user-data") {
            listing.push_str("\nuser-data");
        }
        return text(listing);
    }
    match state.tree.lookup(&rest) {
        Lookup::Value(v) if rest == "user-data" => {
            response(StatusCode::OK, "application/octet-stream", v)
        }
        Lookup::Value(v) => text(v),
        Lookup::Listing(l) => text(l),
        Lookup::Absent => error(StatusCode::NOT_FOUND),
    }
}

/// Decodes `%XX` escapes; `None` when an escape or the result is invalid.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn control_reply(status: StatusCode, message: impl Into<String>) -> Resp {
    response(status, "text/plain", message.into())
}

/// The control API; see the crate README for the routes.
async fn control(shared: &Shared, req: Request<Incoming>) -> Resp {
    let method = req.method().clone();
    let Some(path) = percent_decode(req.uri().path()) else {
        return control_reply(StatusCode::BAD_REQUEST, "bad percent-encoding in path\n");
    };
    let route = normalize(&path[CONTROL_PREFIX.len()..]);
    let body = match req.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(e) => return control_reply(StatusCode::BAD_REQUEST, format!("reading body: {e}\n")),
    };
    let (head, tail) = route.split_once('/').unwrap_or((route.as_str(), ""));
    let ok = || control_reply(StatusCode::NO_CONTENT, "");
    let mut state = shared.lock();
    match (&method, head, tail) {
        (&Method::PUT, "meta-data" | "dynamic", key) if !key.is_empty() => {
            state.tree.set(&route, body);
            ok()
        }
        (&Method::DELETE, "meta-data" | "dynamic", key) if !key.is_empty() => {
            state.tree.remove(&route);
            ok()
        }
        (&Method::PUT, "user-data", "") => {
            state.tree.set("user-data", body);
            ok()
        }
        (&Method::DELETE, "user-data", "") => {
            state.tree.remove("user-data");
            ok()
        }
        (&Method::PUT, "tags", key) if !key.is_empty() && !key.contains('/') => {
            state.tree.set(&format!("{}/{key}", crate::TAGS_PATH), body);
            ok()
        }
        (&Method::DELETE, "tags", "") => {
            state.tree.remove(crate::TAGS_PATH);
            ok()
        }
        (&Method::DELETE, "tags", key) => {
            state.tree.remove(&format!("{}/{key}", crate::TAGS_PATH));
            ok()
        }
        (&Method::POST, "maintenance", rest) if rest.contains('/') => {
            let (event_id, word) = rest.rsplit_once('/').unwrap_or_default();
            let Some(outcome) = crate::EventOutcome::parse(word) else {
                return control_reply(
                    StatusCode::BAD_REQUEST,
                    format!("maintenance: expected .../completed or .../canceled, got {word:?}\n"),
                );
            };
            match crate::tree::finish_event(&mut state.tree, event_id, outcome) {
                Ok(()) => ok(),
                Err(e) => control_reply(StatusCode::BAD_REQUEST, format!("maintenance: {e}\n")),
            }
        }
        (&Method::POST, "fault", "") => {
            let fault = serde_json::from_slice::<FaultSpec>(&body)
                .map_err(|e| e.to_string())
                .and_then(Fault::try_from);
            match fault {
                Ok(fault) => {
                    state.faults.push(fault);
                    ok()
                }
                Err(e) => control_reply(StatusCode::BAD_REQUEST, format!("fault: {e}\n")),
            }
        }
        (&Method::DELETE, "fault", "") => {
            state.faults.clear();
            ok()
        }
        (&Method::DELETE, "tokens", "") => {
            state.tokens.clear();
            ok()
        }
        (&Method::PUT, "imdsv1", "") => match body.as_ref() {
            b"true" | b"true\n" => {
                state.allow_imdsv1 = true;
                ok()
            }
            b"false" | b"false\n" => {
                state.allow_imdsv1 = false;
                ok()
            }
            _ => control_reply(
                StatusCode::BAD_REQUEST,
                "imdsv1: body must be true or false\n",
            ),
        },
        (&Method::GET, "requests", "") => {
            let json = serde_json::to_vec(&state.log).unwrap_or_default();
            response(StatusCode::OK, "application/json", json)
        }
        _ => control_reply(
            StatusCode::NOT_FOUND,
            format!("no control route {method} {path}\n"),
        ),
    }
}

/// Serves one connection until the client closes it or a fault drops it.
pub(crate) async fn serve_connection(stream: tokio::net::TcpStream, shared: Arc<Shared>) {
    let io = hyper_util::rt::TokioIo::new(GoBadRequest::new(stream));
    let service = hyper::service::service_fn(move |req| handle(shared.clone(), req));
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        .serve_connection(io, service)
        .await
    {
        tracing::debug!("connection closed: {e}");
    }
}

/// Go's `net/http` answer to a request it cannot parse, which is what AEMM (and the
/// golden file `400_bad_request.golden`) shows for, e.g., a header value with a newline.
const GO_BAD_REQUEST: &[u8] =
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request";

/// A socket wrapper that swaps hyper's automatic answer to an unparsable request (a 400
/// with an empty body, which no handler here produces) for Go's `400 Bad Request` page.
struct GoBadRequest<T> {
    inner: T,
    /// Replacement bytes still to write, and how many are written.
    pending: Option<(&'static [u8], usize)>,
}

impl<T> GoBadRequest<T> {
    fn new(inner: T) -> Self {
        GoBadRequest {
            inner,
            pending: None,
        }
    }
}

/// Whether `buf` is hyper's automatic parse-error response head.
fn is_hyper_parse_error_reply(buf: &[u8]) -> bool {
    buf.starts_with(b"HTTP/1.1 400 Bad Request\r\n")
        && buf.ends_with(b"\r\n\r\n")
        && buf
            .windows(21)
            .any(|w| w.eq_ignore_ascii_case(b"\r\ncontent-length: 0\r\n"))
}

impl<T: AsyncWrite + Unpin> GoBadRequest<T> {
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, written)) = self.pending.as_mut() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
            if *written == bytes.len() {
                self.pending = None;
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for GoBadRequest<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for GoBadRequest<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        if is_hyper_parse_error_reply(buf) {
            this.pending = Some((GO_BAD_REQUEST, 0));
            // Accept the whole buffer now; flush and shutdown finish the replacement.
            if let Poll::Ready(Err(e)) = this.poll_pending(cx) {
                return Poll::Ready(Err(e));
            }
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_44_chars_of_base64_and_differ() {
        let (a, b) = (new_token(), new_token());
        assert_eq!(a.len(), 44);
        assert_ne!(a, b);
        assert!(a
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'+' || c == b'/'));
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("/a%20b").unwrap(), "/a b");
        assert!(percent_decode("/a%2").is_none());
        assert!(percent_decode("/a%zz").is_none());
    }

    #[test]
    fn error_pages_follow_imds_layout() {
        assert!(error_body(StatusCode::SERVICE_UNAVAILABLE)
            .contains("<title>503 - Service Unavailable</title>"));
        assert_eq!(error_body(StatusCode::NOT_FOUND), NOT_FOUND_BODY);
    }
}
