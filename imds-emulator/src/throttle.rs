//! A throttling front: an HTTP reverse proxy on 127.0.0.1 in front of moto (SSM Parameter
//! Store, Secrets Manager, S3) and of the PCS registration emulator, which answers as AWS
//! does when an API's request-rate quota is exceeded (issue 25 §1, boot storms).
//!
//! [`Front::start`] binds a free port. Each request is named by its API
//! ([`api_of`]: `X-Amz-Target` for the JSON protocols, e.g. `AmazonSSM.GetParameter` is
//! `ssm:GetParameter`; method and path for S3, e.g. `s3:GetObject`), and charged to the
//! token bucket of the first [`Quota`] that lists it (burst = the rate, refilled
//! continuously). An empty bucket is answered, as AWS answers:
//!
//! - SSM and Secrets Manager (awsJson1_1): HTTP 400,
//!   `{"__type":"ThrottlingException","message":"Rate exceeded"}`;
//! - PCS (awsJson1_0): HTTP 429 with the same body (the service model's
//!   `ThrottlingException` is `httpError: 429`);
//! - S3: HTTP 503, `<Error><Code>SlowDown</Code><Message>Please reduce your request
//!   rate.</Message>...</Error>`.
//!
//! Everything else is forwarded unchanged (headers included, so SigV4 signatures still
//! verify upstream): `AWSParallelComputingService.*` targets to the PCS upstream, the rest
//! to moto. APIs no quota lists are never throttled.
//!
//! Default quotas ([`Quota::aws_defaults`]), as AWS documents them:
//! - SSM Parameter Store, standard throughput: 40 transactions per second shared by
//!   `GetParameter`, `GetParameters` and `GetParametersByPath`
//!   ([`Quota::ssm_higher_throughput`]: 3,000 for `GetParameter` and `GetParameters`, 100
//!   for `GetParametersByPath`) ("AWS Systems Manager endpoints and quotas");
//! - Secrets Manager `GetSecretValue`: 10,000 per second ("AWS Secrets Manager quotas");
//! - S3: 5,500 GET/HEAD and 3,500 PUT/POST/DELETE requests per second per prefix (taken
//!   here as one bucket for all of S3: a stricter front) ("Best practices design patterns: optimizing Amazon S3 performance");
//! - PCS `RegisterComputeNodeGroupInstance`: AWS publishes no rate; a setting of the front,
//!   20 per second by default ([`PCS_REGISTER_DEFAULT_TPS`]).
//!
//! Counts of served and throttled requests per API: [`Front::stats`], or
//! `GET /__front/stats` (JSON).

use std::collections::BTreeMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};

use crate::aws::{Resp, Server};

/// The front's own route: the counts as JSON.
pub const STATS_PATH: &str = "/__front/stats";

/// PCS `RegisterComputeNodeGroupInstance` requests per second by default (no published
/// quota: a setting of the front).
pub const PCS_REGISTER_DEFAULT_TPS: f64 = 20.0;

/// One request-rate quota: a token bucket shared by `apis`.
#[derive(Debug, Clone, PartialEq)]
pub struct Quota {
    /// How AWS names it, e.g. `Parameter Store standard throughput (40 TPS)`.
    pub name: String,
    /// The APIs it covers, as [`api_of`] names them (`ssm:GetParameter`).
    pub apis: Vec<String>,
    /// Requests per second; also the burst. 0: every request is throttled.
    pub rate: f64,
}

impl Quota {
    /// A quota named `name` of `rate` per second over `apis`.
    pub fn new(name: &str, apis: &[&str], rate: f64) -> Quota {
        Quota {
            name: name.to_string(),
            apis: apis.iter().map(|s| (*s).to_string()).collect(),
            rate,
        }
    }

    /// Parameter Store's standard throughput: 40 TPS shared by the three reads.
    pub fn ssm_standard(rate: f64) -> Quota {
        Quota::new(
            "Parameter Store standard throughput",
            &[
                "ssm:GetParameter",
                "ssm:GetParameters",
                "ssm:GetParametersByPath",
            ],
            rate,
        )
    }

    /// Parameter Store's higher throughput: 3,000 TPS for `GetParameter`/`GetParameters`,
    /// 100 for `GetParametersByPath`.
    pub fn ssm_higher_throughput() -> Vec<Quota> {
        vec![
            Quota::new(
                "Parameter Store higher throughput",
                &["ssm:GetParameter", "ssm:GetParameters"],
                3000.0,
            ),
            Quota::new(
                "Parameter Store higher throughput (GetParametersByPath)",
                &["ssm:GetParametersByPath"],
                100.0,
            ),
        ]
    }

    /// The defaults listed in the module docs (Parameter Store at standard throughput).
    pub fn aws_defaults() -> Vec<Quota> {
        vec![
            Quota::ssm_standard(40.0),
            Quota::new(
                "Secrets Manager GetSecretValue",
                &["secretsmanager:GetSecretValue"],
                10_000.0,
            ),
            Quota::new(
                "S3 GET/HEAD per prefix",
                &["s3:GetObject", "s3:HeadObject"],
                5_500.0,
            ),
            Quota::new(
                "S3 PUT/COPY/POST/DELETE per prefix",
                &["s3:PutObject", "s3:PostObject", "s3:DeleteObject"],
                3_500.0,
            ),
            Quota::new(
                "PCS RegisterComputeNodeGroupInstance (front setting)",
                &["pcs:RegisterComputeNodeGroupInstance"],
                PCS_REGISTER_DEFAULT_TPS,
            ),
        ]
    }
}

/// Where the front forwards to.
#[derive(Debug, Clone, PartialEq)]
pub struct FrontConfig {
    /// moto's address (SSM, Secrets Manager, S3, anything not PCS).
    pub moto: SocketAddr,
    /// The PCS emulator's address, if any (`AWSParallelComputingService.*` targets).
    pub pcs: Option<SocketAddr>,
    /// The quotas, first match wins.
    pub quotas: Vec<Quota>,
}

/// Requests one API got.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ApiCount {
    /// Forwarded (whatever upstream answered).
    pub served: u64,
    /// Answered with the throttling error.
    pub throttled: u64,
}

#[derive(Debug)]
struct Bucket {
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn new(rate: f64) -> Bucket {
        Bucket {
            rate,
            tokens: burst(rate),
            last: Instant::now(),
        }
    }

    fn take(&mut self, now: Instant) -> bool {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * self.rate).min(burst(self.rate));
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// A bucket holds the rate's worth of requests (at least one when the rate is not 0).
fn burst(rate: f64) -> f64 {
    if rate > 0.0 {
        rate.max(1.0)
    } else {
        0.0
    }
}

#[derive(Debug)]
struct State {
    config: FrontConfig,
    buckets: Vec<Bucket>,
    counts: BTreeMap<String, ApiCount>,
}

type Shared = Arc<Mutex<State>>;

/// A running front; dropping it stops the server.
#[derive(Debug)]
pub struct Front {
    server: Server,
    shared: Shared,
}

impl Front {
    /// Binds a free port on 127.0.0.1 and serves on a thread of its own (a runtime with
    /// two worker threads: forwarding waits on upstream).
    ///
    /// # Errors
    /// When the socket, runtime or thread cannot be created.
    pub fn start(config: FrontConfig) -> io::Result<Front> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let buckets = config.quotas.iter().map(|q| Bucket::new(q.rate)).collect();
        let shared: Shared = Arc::new(Mutex::new(State {
            config,
            buckets,
            counts: BTreeMap::new(),
        }));
        let server_shared = shared.clone();
        let server = Server::start_on(
            SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            "throttle-front",
            runtime,
            move |req| handle(server_shared.clone(), req),
        )?;
        Ok(Front { server, shared })
    }

    /// The endpoint URL, e.g. `http://127.0.0.1:40123` (`AWS_ENDPOINT_URL`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.server.addr)
    }

    /// Served and throttled requests per API so far.
    pub fn stats(&self) -> BTreeMap<String, ApiCount> {
        self.shared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .counts
            .clone()
    }
}

/// The API a request calls: `<service>:<operation>` from `X-Amz-Target`
/// (`AmazonSSM.GetParameter` is `ssm:GetParameter`, `secretsmanager.GetSecretValue` is
/// `secretsmanager:GetSecretValue`, `AWSParallelComputingService.X` is `pcs:X`); without a
/// target, S3's from the method and whether the path names an object (`s3:GetObject`,
/// `s3:HeadObject`, `s3:PutObject`, `s3:DeleteObject`, `s3:PostObject`; on a bucket or the
/// service, `s3:<METHOD>Bucket`).
pub fn api_of(method: &str, path: &str, target: Option<&str>) -> String {
    if let Some(t) = target {
        let (prefix, op) = t.split_once('.').unwrap_or((t, ""));
        let service = match prefix {
            "AmazonSSM" => "ssm",
            "secretsmanager" => "secretsmanager",
            "AWSParallelComputingService" => "pcs",
            other => other,
        };
        return format!("{service}:{op}");
    }
    let path = path.split('?').next().unwrap_or("");
    let object = path
        .trim_start_matches('/')
        .split_once('/')
        .is_some_and(|(_, key)| !key.is_empty());
    let op = match (method, object) {
        ("GET", true) => "GetObject",
        ("HEAD", true) => "HeadObject",
        ("PUT", true) => "PutObject",
        ("DELETE", true) => "DeleteObject",
        ("POST", _) => "PostObject",
        ("GET", false) => "GetBucket",
        ("HEAD", false) => "HeadBucket",
        ("PUT", false) => "PutBucket",
        ("DELETE", false) => "DeleteBucket",
        _ => "Other",
    };
    format!("s3:{op}")
}

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, State> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn handle(shared: Shared, req: Request<Incoming>) -> Result<Resp, hyper::Error> {
    if req.uri().path() == STATS_PATH {
        let body = serde_json::to_vec(&lock(&shared).counts).unwrap_or_default();
        return Ok(plain(StatusCode::OK, "application/json", body));
    }
    let target = req
        .headers()
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let api = api_of(req.method().as_str(), req.uri().path(), target.as_deref());
    let (allowed, upstream) = {
        let mut s = lock(&shared);
        let now = Instant::now();
        let quota = s.config.quotas.iter().position(|q| q.apis.contains(&api));
        let allowed = match quota {
            Some(i) => s.buckets[i].take(now),
            None => true,
        };
        let count = s.counts.entry(api.clone()).or_default();
        if allowed {
            count.served += 1;
        } else {
            count.throttled += 1;
        }
        let upstream = if api.starts_with("pcs:") {
            s.config.pcs.unwrap_or(s.config.moto)
        } else {
            s.config.moto
        };
        (allowed, upstream)
    };
    if !allowed {
        return Ok(throttled(&api));
    }
    Ok(forward(upstream, req).await.unwrap_or_else(|e| {
        plain(
            StatusCode::BAD_GATEWAY,
            "text/plain",
            format!("throttling front: upstream {upstream}: {e}").into_bytes(),
        )
    }))
}

/// AWS's answer to a request over its quota.
fn throttled(api: &str) -> Resp {
    if api.starts_with("s3:") {
        let body = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>\
             <Message>Please reduce your request rate.</Message>\
             <RequestId>{:016X}</RequestId><HostId>throttling-front</HostId></Error>",
            rand::random::<u64>()
        );
        return plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "application/xml",
            body.into_bytes(),
        );
    }
    let (status, content_type) = if api.starts_with("pcs:") {
        (StatusCode::TOO_MANY_REQUESTS, "application/x-amz-json-1.0")
    } else {
        (StatusCode::BAD_REQUEST, "application/x-amz-json-1.1")
    };
    let mut r = plain(
        status,
        content_type,
        br#"{"__type":"ThrottlingException","message":"Rate exceeded"}"#.to_vec(),
    );
    r.headers_mut().insert(
        "x-amzn-errortype",
        hyper::header::HeaderValue::from_static("ThrottlingException"),
    );
    r
}

fn plain(status: StatusCode, content_type: &'static str, body: Vec<u8>) -> Resp {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    r
}

/// Sends the request, headers unchanged, on a new connection to `upstream`.
async fn forward(
    upstream: SocketAddr,
    req: Request<Incoming>,
) -> Result<Resp, Box<dyn std::error::Error + Send + Sync>> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await?.to_bytes();
    forward_full(upstream, Request::from_parts(parts, Full::new(body))).await
}

/// Sends a request already read, headers unchanged, on a new connection to `upstream`.
pub(crate) async fn forward_full(
    upstream: SocketAddr,
    req: Request<Full<Bytes>>,
) -> Result<Resp, Box<dyn std::error::Error + Send + Sync>> {
    let stream = tokio::net::TcpStream::connect(upstream).await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let out = sender.send_request(req).await?;
    let (parts, body) = out.into_parts();
    let body = body.collect().await?.to_bytes();
    Ok(Response::from_parts(parts, Full::new(body)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn apis_by_target_or_s3_path() {
        assert_eq!(
            api_of("POST", "/", Some("AmazonSSM.GetParameter")),
            "ssm:GetParameter"
        );
        assert_eq!(
            api_of("POST", "/", Some("secretsmanager.GetSecretValue")),
            "secretsmanager:GetSecretValue"
        );
        assert_eq!(
            api_of(
                "POST",
                "/",
                Some("AWSParallelComputingService.RegisterComputeNodeGroupInstance")
            ),
            "pcs:RegisterComputeNodeGroupInstance"
        );
        assert_eq!(
            api_of("GET", "/b/k/x.sh?x-id=GetObject", None),
            "s3:GetObject"
        );
        assert_eq!(api_of("GET", "/b", None), "s3:GetBucket");
        assert_eq!(api_of("PUT", "/b/", None), "s3:PutBucket");
    }

    #[test]
    fn a_bucket_holds_its_rate_and_refills() {
        let mut b = Bucket::new(40.0);
        let t = b.last;
        assert_eq!((0..100).filter(|_| b.take(t)).count(), 40);
        // A quarter of a second later: 10 more.
        let later = t + std::time::Duration::from_millis(250);
        assert_eq!((0..100).filter(|_| b.take(later)).count(), 10);
        let mut zero = Bucket::new(0.0);
        assert!(!zero.take(later + std::time::Duration::from_secs(100)));
    }
}
