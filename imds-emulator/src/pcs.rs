//! An emulator of AWS Parallel Computing Service's node registration API
//! (`RegisterComputeNodeGroupInstance`), for tests and local use.
//!
//! [`PcsEmulator::start`] binds a TCP port on 127.0.0.1 and answers, like the service's
//! regional endpoint (facts and sources: `docs/pcs-registration.md`):
//!
//! - `POST /` with `Content-Type: application/x-amz-json-1.0` and
//!   `X-Amz-Target: AWSParallelComputingService.RegisterComputeNodeGroupInstance`
//!   (awsJson1_0); any other target is `UnknownOperationException` (400).
//! - A SigV4 `Authorization` header (`AWS4-HMAC-SHA256`, credential scope
//!   `<date>/<region>/pcs/aws4_request`) whose signature is verified with the secret key of
//!   the instance the access key belongs to (the credentials the IMDS emulator serves that
//!   instance, see [`crate::Emulator::set_role_credentials`]), and the session token in
//!   `X-Amz-Security-Token` when the instance has one. No or a malformed header:
//!   `MissingAuthenticationTokenException`/`IncompleteSignatureException`; an unknown access
//!   key or a wrong token: `UnrecognizedClientException` (403); a wrong signature:
//!   `InvalidSignatureException` (403).
//! - The body is checked against the published model: `clusterIdentifier` (required,
//!   pattern `(pcs_[a-zA-Z0-9]+|[A-Za-z][A-Za-z0-9-]{2,40})`) and `bootstrapId` (required,
//!   1 to 1000 characters, `[\S]+`); anything else is `ValidationException` (400).
//! - An instance that is not allowed to register (see [`PcsEmulator::set_allowed`]), is not
//!   part of the named cluster, or names a cluster that does not exist (or is in another
//!   region) gets `AccessDeniedException` (403) whose message names
//!   `assumed-role/<role>/<instance id>`, as the service's does.
//! - Otherwise the instance gets a node of its compute node group: the one it already has,
//!   or the first of the group's pre-declared nodes no other instance has. The answer has
//!   `nodeID`, `sharedSecret` (the cluster secret, base64), `endpoints`
//!   (`type`, `privateIpAddress`, `port` as a string), `clusterName`, `computeNodeGroupId`,
//!   `computeNodeGroupName` and, when the group has them, `nodeLifecycleActions`. No node
//!   left: `ServiceQuotaExceededException` (402), as when a group is at its maximum.
//! - Faults on demand ([`PcsEmulator::fail_next`]): `AccessDeniedException` (403),
//!   `ThrottlingException` (429), `InternalServerException` (500).
//!
//! Every request is kept as a [`PcsRequest`] (never the secret).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use bytes::Bytes;
use hmac::{Hmac, KeyInit, Mac};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde::Serialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// The `X-Amz-Target` of the registration call.
pub const REGISTER_TARGET: &str = "AWSParallelComputingService.RegisterComputeNodeGroupInstance";

/// awsJson1_0's content type.
pub const JSON_10: &str = "application/x-amz-json-1.0";

/// The account the emulated clusters belong to (in ARNs and messages).
pub const ACCOUNT_ID: &str = "111122223333";

/// One controller endpoint of a cluster (`Endpoint` in the model).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PcsEndpoint {
    /// `SLURMCTLD`, `SLURMDBD` or `SLURMRESTD`.
    pub endpoint_type: String,
    /// IPv4 address in the cluster's VPC.
    pub private_ip_address: String,
    /// Port (the model's type is a string, e.g. `"6817"`).
    pub port: String,
}

/// A compute node group: its id, name, and the Slurm nodes pre-declared for it.
#[derive(Debug, Clone, PartialEq)]
pub struct PcsGroup {
    /// Compute node group id, e.g. `pcs_abcdef0123`.
    pub id: String,
    /// Compute node group name; the service names the group's nodes `<name>-<n>`.
    pub name: String,
    /// Slurm NodeNames of the group, in the order they are handed out.
    pub nodes: Vec<String>,
    /// `nodeLifecycleActions` returned as given (the service's JSON shape).
    pub lifecycle_actions: Option<Value>,
}

/// A cluster: id, name, region, the secret and the controller endpoints.
#[derive(Debug, Clone, PartialEq)]
pub struct PcsCluster {
    /// Cluster id, e.g. `pcs_0123456789`.
    pub id: String,
    /// Cluster name (also accepted as `clusterIdentifier`).
    pub name: String,
    /// Region the cluster is in; requests signed for another region do not find it.
    pub region: String,
    /// The cluster secret, base64 (what the service stores in Secrets Manager).
    pub shared_secret: String,
    /// Controller endpoints.
    pub endpoints: Vec<PcsEndpoint>,
    /// Compute node groups.
    pub groups: Vec<PcsGroup>,
}

/// An EC2 instance with its instance-profile credentials, launched by a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PcsInstance {
    /// EC2 instance id.
    pub instance_id: String,
    /// IAM role of its instance profile.
    pub role: String,
    /// Access key id of its role session.
    pub access_key_id: String,
    /// Secret access key (checks the SigV4 signature).
    pub secret_access_key: String,
    /// Session token; when set, `X-Amz-Security-Token` must carry it.
    pub session_token: Option<String>,
    /// Cluster id it was launched for.
    pub cluster_id: String,
    /// Compute node group id it was launched for.
    pub group_id: String,
}

/// An error the emulator answers on demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PcsFault {
    /// `AccessDeniedException`, 403.
    AccessDenied,
    /// `ThrottlingException`, 429.
    Throttling,
    /// `InternalServerException`, 500.
    InternalServer,
}

impl PcsFault {
    fn answer(self) -> (StatusCode, &'static str, &'static str) {
        match self {
            PcsFault::AccessDenied => (
                StatusCode::FORBIDDEN,
                "AccessDeniedException",
                "You do not have sufficient access to perform this action.",
            ),
            PcsFault::Throttling => (
                StatusCode::TOO_MANY_REQUESTS,
                "ThrottlingException",
                "Rate exceeded",
            ),
            PcsFault::InternalServer => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalServerException",
                "An internal error occurred.",
            ),
        }
    }
}

/// One request the emulator answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PcsRequest {
    /// `X-Amz-Target` as sent.
    pub target: Option<String>,
    /// Access key id from the `Authorization` header.
    pub access_key_id: Option<String>,
    /// Region from the credential scope.
    pub region: Option<String>,
    /// The instance the access key belongs to.
    pub instance_id: Option<String>,
    /// `clusterIdentifier` as sent.
    pub cluster_identifier: Option<String>,
    /// `bootstrapId` as sent.
    pub bootstrap_id: Option<String>,
    /// HTTP status answered.
    pub status: u16,
    /// The error's `__type`, when it was one.
    pub error: Option<String>,
    /// The node handed out, when it succeeded.
    pub node_id: Option<String>,
}

#[derive(Debug, Default)]
struct State {
    clusters: Vec<PcsCluster>,
    /// Access key id to instance.
    instances: HashMap<String, PcsInstance>,
    /// Instance ids whose role may not call the operation.
    denied: std::collections::HashSet<String>,
    /// Instance id to node id.
    assigned: HashMap<String, String>,
    faults: VecDeque<PcsFault>,
    log: Vec<PcsRequest>,
}

type Shared = Arc<Mutex<State>>;

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A running registration emulator; dropping it stops the server.
#[derive(Debug)]
pub struct PcsEmulator {
    addr: SocketAddr,
    shared: Shared,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl PcsEmulator {
    /// Binds a free port on 127.0.0.1 and starts serving (no clusters yet).
    ///
    /// # Errors
    /// When the socket, runtime or thread cannot be created.
    pub fn start() -> io::Result<PcsEmulator> {
        Self::start_on(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
    }

    /// Like [`PcsEmulator::start`], bound to `addr` (port 0: a free one), e.g. an address
    /// of a network namespace the caller runs in: the socket stays in the namespace it was
    /// created in.
    ///
    /// # Errors
    /// When the socket, runtime or thread cannot be created.
    pub fn start_on(addr: SocketAddr) -> io::Result<PcsEmulator> {
        let std_listener = std::net::TcpListener::bind(addr)?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let listener = {
            let _guard = runtime.enter();
            tokio::net::TcpListener::from_std(std_listener)?
        };
        let shared: Shared = Arc::default();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let server_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("pcs-emulator-{}", addr.port()))
            .spawn(move || {
                runtime.block_on(async move {
                    loop {
                        tokio::select! {
                            _ = &mut stopped => break,
                            accepted = listener.accept() => match accepted {
                                Ok((stream, _)) => {
                                    let shared = server_shared.clone();
                                    tokio::spawn(async move {
                                        let io = hyper_util::rt::TokioIo::new(stream);
                                        let service = hyper::service::service_fn(move |req| {
                                            handle(shared.clone(), req)
                                        });
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
        Ok(PcsEmulator {
            addr,
            shared,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The endpoint URL, e.g. `http://127.0.0.1:40123` (the SDK's `endpoint_url`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Adds (or replaces, by id) a cluster.
    pub fn add_cluster(&self, cluster: PcsCluster) {
        let mut s = lock(&self.shared);
        s.clusters.retain(|c| c.id != cluster.id);
        s.clusters.push(cluster);
    }

    /// Adds (or replaces, by access key) an instance.
    pub fn add_instance(&self, instance: PcsInstance) {
        lock(&self.shared)
            .instances
            .insert(instance.access_key_id.clone(), instance);
    }

    /// Whether the instance's role may call `pcs:RegisterComputeNodeGroupInstance`
    /// (default: yes). A denied instance gets `AccessDeniedException` until allowed again.
    pub fn set_allowed(&self, instance_id: &str, allowed: bool) {
        let mut s = lock(&self.shared);
        if allowed {
            s.denied.remove(instance_id);
        } else {
            s.denied.insert(instance_id.to_string());
        }
    }

    /// Replaces the lifecycle actions of a group (`None` removes them).
    pub fn set_lifecycle_actions(&self, group_id: &str, actions: Option<Value>) {
        let mut s = lock(&self.shared);
        for c in &mut s.clusters {
            for g in &mut c.groups {
                if g.id == group_id {
                    g.lifecycle_actions = actions.clone();
                }
            }
        }
    }

    /// Answers the next `n` well-formed, authenticated registration requests with `fault`
    /// (after the ones already queued).
    pub fn fail_next(&self, fault: PcsFault, n: usize) {
        let mut s = lock(&self.shared);
        for _ in 0..n {
            s.faults.push_back(fault);
        }
    }

    /// The node each instance holds, by instance id.
    pub fn assignments(&self) -> HashMap<String, String> {
        lock(&self.shared).assigned.clone()
    }

    /// Every request, oldest first.
    pub fn requests(&self) -> Vec<PcsRequest> {
        lock(&self.shared).log.clone()
    }
}

impl Drop for PcsEmulator {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

type Resp = Response<Full<Bytes>>;

fn json_response(status: StatusCode, body: &Value) -> Resp {
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(JSON_10));
    let id = format!("{:032x}", rand::random::<u128>());
    if let Ok(v) = HeaderValue::from_str(&id) {
        h.insert("x-amzn-requestid", v);
    }
    resp
}

/// An awsJson1_0 error: `__type` in the body and `X-Amzn-ErrorType`.
fn error_response(status: StatusCode, kind: &str, message: &str) -> Resp {
    let mut resp = json_response(status, &json!({"__type": kind, "message": message}));
    if let Ok(v) = HeaderValue::from_str(kind) {
        resp.headers_mut().insert("x-amzn-errortype", v);
    }
    resp
}

async fn handle(shared: Shared, req: Request<Incoming>) -> Result<Resp, std::convert::Infallible> {
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let mut record = PcsRequest {
        target: header(&parts.headers, "x-amz-target").map(str::to_string),
        access_key_id: None,
        region: None,
        instance_id: None,
        cluster_identifier: None,
        bootstrap_id: None,
        status: 0,
        error: None,
        node_id: None,
    };
    let resp = answer(&shared, &parts, &body, &mut record);
    record.status = resp.status().as_u16();
    if !resp.status().is_success() {
        record.error = resp
            .headers()
            .get("x-amzn-errortype")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
    }
    lock(&shared).log.push(record);
    Ok(resp)
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

/// `clusterIdentifier`'s pattern in the model: `(pcs_[a-zA-Z0-9]+|[A-Za-z][A-Za-z0-9-]{2,40})`.
pub fn valid_cluster_identifier(s: &str) -> bool {
    if let Some(rest) = s.strip_prefix("pcs_") {
        if !rest.is_empty() && rest.chars().all(|c| c.is_ascii_alphanumeric()) {
            return true;
        }
    }
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic())
        && (3..=41).contains(&s.len())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '-')
}

/// `bootstrapId`'s constraints in the model: length 1 to 1000, pattern `[\S]+`.
pub fn valid_bootstrap_id(s: &str) -> bool {
    (1..=1000).contains(&s.chars().count()) && !s.chars().any(char::is_whitespace)
}

fn answer(
    shared: &Shared,
    parts: &hyper::http::request::Parts,
    body: &[u8],
    record: &mut PcsRequest,
) -> Resp {
    if parts.method != Method::POST || parts.uri.path() != "/" {
        return error_response(
            StatusCode::NOT_FOUND,
            "UnknownOperationException",
            "The requested operation is not supported.",
        );
    }
    let Some(auth_header) = header(&parts.headers, "authorization") else {
        return error_response(
            StatusCode::BAD_REQUEST,
            "MissingAuthenticationTokenException",
            "Missing Authentication Token",
        );
    };
    let Some(auth) = parse_authorization(auth_header) else {
        return error_response(
            StatusCode::BAD_REQUEST,
            "IncompleteSignatureException",
            "The Authorization header is not a valid AWS4-HMAC-SHA256 signature.",
        );
    };
    record.access_key_id = Some(auth.access_key_id.to_string());
    record.region = Some(auth.region.to_string());
    if auth.service != "pcs" {
        return error_response(
            StatusCode::FORBIDDEN,
            "InvalidSignatureException",
            &format!(
                "Credential should be scoped to correct service: 'pcs', not '{}'.",
                auth.service
            ),
        );
    }
    let instance = lock(shared).instances.get(auth.access_key_id).cloned();
    let Some(instance) = instance else {
        return error_response(
            StatusCode::FORBIDDEN,
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        );
    };
    record.instance_id = Some(instance.instance_id.clone());
    if instance.session_token.as_deref() != header(&parts.headers, "x-amz-security-token") {
        return error_response(
            StatusCode::FORBIDDEN,
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        );
    }
    match expected_signature(parts, body, &auth, &instance.secret_access_key) {
        Some(sig) if sig == auth.signature => {}
        _ => {
            return error_response(
                StatusCode::FORBIDDEN,
                "InvalidSignatureException",
                "The request signature we calculated does not match the signature you provided.",
            )
        }
    }
    if header(&parts.headers, "x-amz-target") != Some(REGISTER_TARGET) {
        return error_response(
            StatusCode::BAD_REQUEST,
            "UnknownOperationException",
            "The requested operation is not supported by this emulator.",
        );
    }
    if header(&parts.headers, "content-type") != Some(JSON_10) {
        return error_response(
            StatusCode::BAD_REQUEST,
            "SerializationException",
            "Content-Type must be application/x-amz-json-1.0.",
        );
    }
    let Ok(Value::Object(input)) = serde_json::from_slice::<Value>(body) else {
        return error_response(
            StatusCode::BAD_REQUEST,
            "SerializationException",
            "The request body is not a JSON object.",
        );
    };
    let cluster_identifier = input.get("clusterIdentifier").and_then(Value::as_str);
    let bootstrap_id = input.get("bootstrapId").and_then(Value::as_str);
    record.cluster_identifier = cluster_identifier.map(str::to_string);
    record.bootstrap_id = bootstrap_id.map(str::to_string);
    let mut problems = Vec::new();
    match cluster_identifier {
        None => problems.push(("clusterIdentifier", "Member must not be null")),
        Some(c) if !valid_cluster_identifier(c) => problems.push((
            "clusterIdentifier",
            "Member must satisfy regular expression pattern: (pcs_[a-zA-Z0-9]+|[A-Za-z][A-Za-z0-9-]{2,40})",
        )),
        _ => {}
    }
    match bootstrap_id {
        None => problems.push(("bootstrapId", "Member must not be null")),
        Some(b) if !valid_bootstrap_id(b) => problems.push((
            "bootstrapId",
            "Member must have length between 1 and 1000 and satisfy regular expression pattern: [\\S]+",
        )),
        _ => {}
    }
    for key in input.keys() {
        if key != "clusterIdentifier" && key != "bootstrapId" {
            problems.push(("", "Unknown member"));
        }
    }
    if !problems.is_empty() {
        let fields: Vec<Value> = problems
            .iter()
            .map(|(name, message)| json!({"name": name, "message": message}))
            .collect();
        let mut resp = json_response(
            StatusCode::BAD_REQUEST,
            &json!({
                "__type": "ValidationException",
                "message": format!("{} validation error(s) detected", problems.len()),
                "reason": "fieldValidationFailed",
                "fieldList": fields,
            }),
        );
        resp.headers_mut().insert(
            "x-amzn-errortype",
            HeaderValue::from_static("ValidationException"),
        );
        return resp;
    }
    let (cluster_identifier, region) = (cluster_identifier.unwrap_or_default(), auth.region);

    let mut s = lock(shared);
    if let Some(fault) = s.faults.pop_front() {
        let (status, kind, message) = fault.answer();
        return error_response(status, kind, message);
    }
    let denied = |why: &str| {
        error_response(
            StatusCode::FORBIDDEN,
            "AccessDeniedException",
            &format!(
                "User: arn:aws:sts::{ACCOUNT_ID}:assumed-role/{}/{} is not authorized to perform: \
                 pcs:RegisterComputeNodeGroupInstance on resource: \
                 arn:aws:pcs:{region}:{ACCOUNT_ID}:cluster/{cluster_identifier} ({why})",
                instance.role, instance.instance_id
            ),
        )
    };
    if s.denied.contains(&instance.instance_id) {
        return denied("no identity-based policy allows the action");
    }
    let Some(cluster) = s
        .clusters
        .iter()
        .find(|c| {
            (c.id == cluster_identifier || c.name == cluster_identifier) && c.region == region
        })
        .cloned()
    else {
        return denied("no such cluster");
    };
    if cluster.id != instance.cluster_id {
        return denied("the instance is not part of the cluster");
    }
    let Some(group) = cluster.groups.iter().find(|g| g.id == instance.group_id) else {
        return denied("the instance is not part of a compute node group of the cluster");
    };
    let node = match s.assigned.get(&instance.instance_id) {
        Some(n) => n.clone(),
        None => {
            let taken: std::collections::HashSet<&String> = s.assigned.values().collect();
            let Some(free) = group.nodes.iter().find(|n| !taken.contains(n)).cloned() else {
                return error_response(
                    StatusCode::PAYMENT_REQUIRED,
                    "ServiceQuotaExceededException",
                    "The compute node group has no free node.",
                );
            };
            s.assigned
                .insert(instance.instance_id.clone(), free.clone());
            free
        }
    };
    record.node_id = Some(node.clone());
    let endpoints: Vec<Value> = cluster
        .endpoints
        .iter()
        .map(|e| {
            json!({
                "type": e.endpoint_type,
                "privateIpAddress": e.private_ip_address,
                "port": e.port,
            })
        })
        .collect();
    let mut out = json!({
        "nodeID": node,
        "sharedSecret": cluster.shared_secret,
        "endpoints": endpoints,
        "clusterName": cluster.name,
        "computeNodeGroupId": group.id,
        "computeNodeGroupName": group.name,
    });
    if let (Some(actions), Some(obj)) = (&group.lifecycle_actions, out.as_object_mut()) {
        obj.insert("nodeLifecycleActions".into(), actions.clone());
    }
    json_response(StatusCode::OK, &out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn identifier_patterns_follow_the_model() {
        assert!(valid_cluster_identifier("pcs_abc123"));
        assert!(valid_cluster_identifier("my-cluster"));
        assert!(valid_cluster_identifier("abc"));
        assert!(!valid_cluster_identifier("ab"));
        assert!(!valid_cluster_identifier("pcs_"));
        assert!(!valid_cluster_identifier("1cluster"));
        assert!(!valid_cluster_identifier("my_cluster"));
        assert!(!valid_cluster_identifier(&format!("a{}", "b".repeat(41))));
        assert!(valid_cluster_identifier(&format!("a{}", "b".repeat(40))));
        assert!(valid_bootstrap_id("x"));
        assert!(valid_bootstrap_id(&"x".repeat(1000)));
        assert!(!valid_bootstrap_id(&"x".repeat(1001)));
        assert!(!valid_bootstrap_id(""));
        assert!(!valid_bootstrap_id("a b"));
    }

    #[test]
    fn authorization_header_parses() {
        let a = parse_authorization(
            "AWS4-HMAC-SHA256 Credential=AKID/20240101/us-east-1/pcs/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date, Signature=abc",
        )
        .unwrap();
        assert_eq!(a.access_key_id, "AKID");
        assert_eq!(a.region, "us-east-1");
        assert_eq!(a.service, "pcs");
        assert_eq!(a.signed_headers, ["content-type", "host", "x-amz-date"]);
        assert!(parse_authorization("Basic abc").is_none());
    }
}
