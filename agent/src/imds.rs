//! The EC2 instance metadata service, IMDSv2 only, through aws-config's IMDS client.
//!
//! aws-config's client does the session token (`PUT /latest/api/token` with a TTL, the
//! token on every GET, never a fallback to IMDSv1), the standard endpoint override
//! (`AWS_EC2_METADATA_SERVICE_ENDPOINT`) and retries with backoff. On top of it this module:
//! - retries 429 (throttling) as well as 401, 5xx and connect failures/timeouts (its own
//!   classifier only retries 401 and 5xx);
//! - refreshes the token when a GET still answers 401 after the client's retries (its token
//!   cache only drops a token when the token's own TTL runs out, so a token the service has
//!   forgotten would otherwise be sent until then);
//! - maps errors to [`ImdsError`], which always names the path;
//! - reads the user data as bytes ([`Imds::get_bytes_optional`]). EC2 serves user data as
//!   it was given (`application/octet-stream`), often gzip-compressed, and aws-config's
//!   client (1.13) only returns UTF-8 text: its `get` refuses any other body and drops it.
//!   So user data goes through the same orchestrator the client is built on
//!   (aws-smithy-runtime's `Operation`, with its default HTTP client, standard retries,
//!   timeouts and the same retry classifier), with the same IMDSv2 token flow done here:
//!   `PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds`, then the GET with
//!   `X-aws-ec2-metadata-token`. The endpoint is `imds.endpoint`, else
//!   `AWS_EC2_METADATA_SERVICE_ENDPOINT`, else the IPv6 address when
//!   `AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE=IPv6`, else `http://169.254.169.254`, as
//!   aws-config resolves it (less its `~/.aws/config` profile keys).
//!
//! Both clients share one HTTP client ([`http_client`]): the SDK's, but without the
//! platform's trusted root certificates when the endpoint is plain HTTP, as IMDS's own
//! addresses are (loading and parsing `/etc/ssl/certs`, about a third of a debug build's
//! bootstrap CPU time, for roots no request uses).
//!
//! The `[imds]` settings section ([`ImdsSettings`]) is this module's.
//!
//! Paths and formats: <https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-categories.html>.
//!
//! Floor 1 (outside systems): below everything that reads instance metadata.

use aws_config::imds::client::error::ImdsError as SdkImdsError;
use aws_smithy_http_client::tls::rustls_provider::CryptoMode;
use aws_smithy_http_client::tls::{Provider, TlsContext, TrustStore};
use aws_smithy_runtime::client::orchestrator::operation::Operation;
use aws_smithy_runtime_api::client::http::SharedHttpClient;
use aws_smithy_runtime_api::client::interceptors::context::InterceptorContext;
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse, OrchestratorError};
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_runtime_api::client::retries::classifiers::{
    ClassifyRetry, RetryAction, SharedRetryClassifier,
};
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::retry::RetryConfig;
use aws_smithy_types::timeout::TimeoutConfig;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::section::{Classified, HumanDuration, InvalidKey, KeyTrust};

/// `[imds]`: the instance metadata service client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImdsSettings {
    /// Endpoint URL. Empty: aws-config's default (`AWS_EC2_METADATA_SERVICE_ENDPOINT`, the
    /// profile, or `http://169.254.169.254`).
    pub endpoint: String,
    /// Connect and read timeout of one attempt.
    pub timeout: HumanDuration,
    /// Attempts per request (retries on 401, 429, 5xx, timeouts), with backoff.
    pub attempts: i64,
    /// Session token TTL.
    pub token_ttl: HumanDuration,
    /// Where the instance's tags come from: `metadata` (instance metadata,
    /// `tags/instance/`, when the instance's `InstanceMetadataTags` is on) or
    /// `describe-tags` (EC2's `DescribeTags` API, through the instance profile, which then
    /// needs `ec2:DescribeTags`). EC2 refuses to turn tags in metadata on while any tag key
    /// holds `/` or a space; `describe-tags` reads such keys too. Either way the tags set
    /// the same `slurm-node-agent:<key>` settings and `{tag:<key>}` placeholders. Not
    /// settable by a tag.
    pub tags: TagSource,
}

/// `imds.tags`: where the instance's tags come from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TagSource {
    /// Instance metadata (`/latest/meta-data/tags/instance/`): no AWS API call and no IAM
    /// permission, but only when tags in metadata are on; when they are off the tags are
    /// unavailable (not none).
    #[default]
    Metadata,
    /// EC2's `DescribeTags` (filters `resource-id` = the instance id, `resource-type` =
    /// `instance`) in the instance's region, with the SDK's default credentials (the
    /// instance profile; `ec2:DescribeTags`).
    DescribeTags,
}

impl TagSource {
    /// The setting's word: `metadata`, `describe-tags`.
    pub fn as_str(self) -> &'static str {
        match self {
            TagSource::Metadata => "metadata",
            TagSource::DescribeTags => "describe-tags",
        }
    }
}

impl std::fmt::Display for TagSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Default for ImdsSettings {
    fn default() -> Self {
        ImdsSettings {
            endpoint: String::new(),
            timeout: HumanDuration(Duration::from_secs(1)),
            attempts: 4,
            token_ttl: HumanDuration(Duration::from_secs(21_600)),
            tags: TagSource::Metadata,
        }
    }
}

/// How user data and tags are read cannot come from them; user data may choose where the
/// tags come from (it is read before them), a tag may not.
impl Classified for ImdsSettings {
    const SECTION: &'static str = "imds";
    const TRUST: &'static [KeyTrust] = &[
        KeyTrust::image("endpoint"),
        KeyTrust::image("timeout"),
        KeyTrust::image("attempts"),
        KeyTrust::image("token_ttl"),
        KeyTrust::user_data("tags"),
    ];
}

impl ImdsSettings {
    /// Checks the values: one attempt's timeout, the attempts and the token TTL within
    /// IMDSv2's limits, the endpoint an http(s) URL.
    ///
    /// # Errors
    /// [`InvalidKey`]: the dotted key and what is wrong.
    pub fn validate(&self) -> Result<(), InvalidKey> {
        let e = |k: &str, m: &str| Err(InvalidKey::new(format!("imds.{k}"), m));
        if self.timeout.is_zero() || self.timeout.0 > Duration::from_secs(300) {
            return e("timeout", "must be more than 0 and at most 5m");
        }
        if !(1..=10).contains(&self.attempts) {
            return e("attempts", "must be 1 to 10");
        }
        let ttl = self.token_ttl.0.as_secs();
        if !(1..=21_600).contains(&ttl) {
            return e("token_ttl", "must be 1s to 6h (IMDSv2 limit)");
        }
        let endpoint = &self.endpoint;
        let is_url = endpoint.starts_with("http://") || endpoint.starts_with("https://");
        if !endpoint.is_empty() && !is_url {
            return e("endpoint", "must be an http:// or https:// URL");
        }
        Ok(())
    }
}

/// An IMDS failure, naming the path.
#[derive(Debug, thiserror::Error)]
pub enum ImdsError {
    /// The service answered with an error status after all retries.
    #[error("instance metadata {path}: HTTP {status} after retries")]
    Status {
        /// Path requested, e.g. `/latest/meta-data/instance-id`.
        path: String,
        /// Last HTTP status.
        status: u16,
    },
    /// No session token could be had (PUT /latest/api/token failed).
    #[error("instance metadata {path}: no IMDSv2 session token: {message}")]
    Token {
        /// Path that needed the token.
        path: String,
        /// Cause.
        message: String,
    },
    /// The service could not be reached or did not answer in time.
    #[error("instance metadata {path}: unreachable: {message}")]
    Unreachable {
        /// Path requested.
        path: String,
        /// Cause (connect refused, timeout...).
        message: String,
    },
}

impl ImdsError {
    /// The HTTP status, where the service answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            ImdsError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// Retries 401 (expired token), 429 (throttled), 5xx and connect failures or timeouts.
#[derive(Debug, Default)]
struct RetryClassifier;

impl ClassifyRetry for RetryClassifier {
    fn name(&self) -> &'static str {
        "slurm-node-agent IMDS"
    }

    fn classify_retry(&self, ctx: &InterceptorContext) -> RetryAction {
        match ctx.response().map(|r| r.status().as_u16()) {
            Some(429) => RetryAction::throttling_error(),
            Some(401) => RetryAction::server_error(),
            Some(s) if s >= 500 => RetryAction::server_error(),
            Some(_) => RetryAction::NoActionIndicated,
            None if ctx.output_or_error().is_some_and(|r| r.is_err()) => {
                RetryAction::transient_error()
            }
            None => RetryAction::NoActionIndicated,
        }
    }
}

/// IMDSv2 client.
pub struct Imds {
    client: Mutex<aws_config::imds::Client>,
    bytes: BytesClient,
    http: Option<SharedHttpClient>,
    settings: ImdsSettings,
}

impl std::fmt::Debug for Imds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Imds")
            .field("settings", &self.settings)
            .finish()
    }
}

impl Imds {
    /// A client with the given endpoint, timeouts, attempts and token TTL.
    pub fn new(settings: &ImdsSettings) -> Imds {
        let http = http_client(&endpoint(settings));
        Imds {
            client: Mutex::new(build_client_with(settings, http.clone())),
            bytes: BytesClient::new(settings, http.clone()),
            http,
            settings: settings.clone(),
        }
    }

    fn client(&self) -> aws_config::imds::Client {
        self.client
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// GETs a path (e.g. `/latest/meta-data/instance-id`). 404 is `Ok(None)`.
    ///
    /// # Errors
    /// [`ImdsError`] naming the path, after the retries.
    pub async fn get_optional(&self, path: &str) -> Result<Option<String>, ImdsError> {
        match self.get_once(path).await {
            Err(ImdsError::Status { status: 401, .. }) => {
                // The service no longer knows our token: start a new session once.
                tracing::warn!(
                    path,
                    "IMDS answered 401 after retries; requesting a new token"
                );
                *self.client.lock().unwrap_or_else(|p| p.into_inner()) =
                    build_client_with(&self.settings, self.http.clone());
                self.get_once(path).await
            }
            other => other,
        }
    }

    /// GETs a path that must exist.
    ///
    /// # Errors
    /// [`ImdsError`]; a 404 is `ImdsError::Status { status: 404 }`.
    pub async fn get(&self, path: &str) -> Result<String, ImdsError> {
        self.get_optional(path).await?.ok_or(ImdsError::Status {
            path: path.to_string(),
            status: 404,
        })
    }

    async fn get_once(&self, path: &str) -> Result<Option<String>, ImdsError> {
        match self.client().get(path).await {
            Ok(v) => Ok(Some(String::from(v))),
            Err(SdkImdsError::ErrorResponse(r)) if r.response().status().as_u16() == 404 => {
                Ok(None)
            }
            Err(SdkImdsError::ErrorResponse(r)) => Err(ImdsError::Status {
                path: path.to_string(),
                status: r.response().status().as_u16(),
            }),
            Err(e @ SdkImdsError::FailedToLoadToken(_)) => Err(ImdsError::Token {
                path: path.to_string(),
                message: error_chain(&e),
            }),
            Err(e) => Err(ImdsError::Unreachable {
                path: path.to_string(),
                message: error_chain(&e),
            }),
        }
    }

    /// GETs a path as bytes, whatever they are (user data: `/latest/user-data`), with a
    /// session token of its own; retried and refreshed as [`Imds::get_optional`] does. 404
    /// is `Ok(None)`.
    ///
    /// # Errors
    /// [`ImdsError`] naming the path, after the retries.
    pub async fn get_bytes_optional(&self, path: &str) -> Result<Option<Vec<u8>>, ImdsError> {
        let token = self.bytes.token(path).await?;
        match self.bytes.get(path, &token).await {
            Err(ImdsError::Status { status: 401, .. }) => {
                tracing::warn!(
                    path,
                    "IMDS answered 401 after retries; requesting a new token"
                );
                let token = self.bytes.token(path).await?;
                self.bytes.get(path, &token).await
            }
            other => other,
        }
    }

    /// Reads what bootstrap needs to know about this instance; independent reads run
    /// concurrently.
    ///
    /// # Errors
    /// The first [`ImdsError`].
    pub async fn identity(&self) -> Result<InstanceIdentity, ImdsError> {
        let md = |p: &str| format!("/latest/meta-data/{p}");
        let (
            instance_id,
            instance_type,
            region,
            availability_zone,
            local_ipv4,
            local_hostname,
            ami_id,
            life_cycle,
            tag_keys,
            user_data,
            document,
        ) = tokio::try_join!(
            self.get("/latest/meta-data/instance-id"),
            self.get("/latest/meta-data/instance-type"),
            self.get("/latest/meta-data/placement/region"),
            self.get("/latest/meta-data/placement/availability-zone"),
            // 404 on an IPv6-only instance: only a setting that needs it fails.
            self.get_optional("/latest/meta-data/local-ipv4"),
            self.get("/latest/meta-data/local-hostname"),
            self.get("/latest/meta-data/ami-id"),
            self.get_optional("/latest/meta-data/instance-life-cycle"),
            self.get_optional("/latest/meta-data/tags/instance"),
            self.get_bytes_optional("/latest/user-data"),
            self.get_optional("/latest/dynamic/instance-identity/document"),
        )?;
        let mut tags = BTreeMap::new();
        let tags_available = tag_keys.is_some();
        let keys: Vec<String> = tag_keys
            .unwrap_or_default()
            .lines()
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .map(str::to_string)
            .collect();
        // Few tags, each a local round trip of well under a millisecond: read them in turn.
        for k in keys {
            let v = self.get(&md(&format!("tags/instance/{k}"))).await?;
            tags.insert(k, v);
        }
        Ok(InstanceIdentity {
            instance_id: instance_id.trim().to_string(),
            instance_type: instance_type.trim().to_string(),
            region: region.trim().to_string(),
            availability_zone: availability_zone.trim().to_string(),
            local_ipv4: local_ipv4.unwrap_or_default().trim().to_string(),
            local_hostname: local_hostname.trim().to_string(),
            ami_id: ami_id.trim().to_string(),
            spot: life_cycle.is_some_and(|l| l.trim() == "spot"),
            tags,
            tags_available,
            user_data,
            launched_at: document.as_deref().and_then(pending_time),
        })
    }
}

/// `pendingTime` of an instance identity document (`dynamic/instance-identity/document`,
/// JSON; e.g. `"pendingTime" : "2019-10-31T07:02:24Z"`): when the instance was launched, in
/// Unix seconds. `None` when the document has none or it does not parse (logged).
pub fn pending_time(document: &str) -> Option<i64> {
    let v: serde_json::Value = serde_json::from_str(document)
        .map_err(|e| tracing::warn!("IMDS dynamic/instance-identity/document: not JSON: {e}"))
        .ok()?;
    let t = v.get("pendingTime")?.as_str()?;
    crate::time::parse(t)
        .map_err(|e| {
            tracing::warn!("IMDS dynamic/instance-identity/document: pendingTime: {e}");
        })
        .ok()
}

/// aws-config's IMDS client for these settings.
pub(crate) fn build_client(s: &ImdsSettings) -> aws_config::imds::Client {
    build_client_with(s, http_client(&endpoint(s)))
}

/// The HTTP client for `endpoint`: `None` (the SDK's default, with the platform's trusted
/// roots) for `https://`; for plain `http://` (IMDS's own addresses) the same client with
/// an empty trust store, which spares loading and parsing every certificate in
/// `/etc/ssl/certs` (the SDK does that once per process, and again for each connector).
fn http_client(endpoint: &str) -> Option<SharedHttpClient> {
    if endpoint
        .get(..8)
        .is_some_and(|p| p.eq_ignore_ascii_case("https://"))
    {
        return None;
    }
    let tls = TlsContext::builder()
        .with_trust_store(TrustStore::empty())
        .build()
        .map_err(|e| tracing::warn!("IMDS HTTP client: {e}; using the default one"))
        .ok()?;
    Some(
        aws_smithy_http_client::Builder::new()
            .tls_provider(Provider::Rustls(CryptoMode::AwsLc))
            .tls_context(tls)
            .build_https(),
    )
}

fn build_client_with(s: &ImdsSettings, http: Option<SharedHttpClient>) -> aws_config::imds::Client {
    let mut b = aws_config::imds::Client::builder()
        .max_attempts(u32::try_from(s.attempts).unwrap_or(4))
        .token_ttl(s.token_ttl.0)
        .connect_timeout(s.timeout.0)
        .read_timeout(s.timeout.0)
        .operation_attempt_timeout(s.timeout.0 + s.timeout.0)
        .operation_timeout(Duration::from_secs(120))
        .retry_classifier(SharedRetryClassifier::new(RetryClassifier));
    if let Some(http) = http {
        b = b.configure(
            &aws_config::provider_config::ProviderConfig::without_region().with_http_client(http),
        );
    }
    if !s.endpoint.is_empty() {
        // Validated as an http(s) URL by the settings.
        match b.clone().endpoint(&s.endpoint) {
            Ok(with) => b = with,
            Err(e) => tracing::warn!(endpoint = %s.endpoint, "ignoring IMDS endpoint: {e}"),
        }
    }
    b.build()
}

/// An IMDS answer that is not a success, for the orchestrator's error path.
#[derive(Debug, thiserror::Error)]
#[error("HTTP {0}")]
struct BadStatus(u16);

/// A session token, kept out of `Debug` output (the orchestrator logs its input at trace).
#[derive(Clone)]
struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(** redacted **)")
    }
}

/// Input of a GET: the path and the token.
#[derive(Debug)]
struct GetInput {
    path: String,
    token: Token,
}

/// IMDS GETs that return bytes, with the IMDSv2 token flow (see the module docs for why).
#[derive(Debug)]
struct BytesClient {
    token: Operation<(), Token, BadStatus>,
    get: Operation<GetInput, Vec<u8>, BadStatus>,
}

/// IMDS's own address when no endpoint is configured (IPv4 and IPv6 endpoint modes).
const DEFAULT_ENDPOINT_V4: &str = "http://169.254.169.254";
const DEFAULT_ENDPOINT_V6: &str = "http://[fd00:ec2::254]";

/// The endpoint as aws-config resolves it: setting, environment, endpoint mode, default.
fn endpoint(s: &ImdsSettings) -> String {
    if !s.endpoint.is_empty() {
        return s.endpoint.clone();
    }
    if let Ok(e) = std::env::var("AWS_EC2_METADATA_SERVICE_ENDPOINT") {
        if !e.is_empty() {
            return e;
        }
    }
    match std::env::var("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE") {
        Ok(m) if m.eq_ignore_ascii_case("ipv6") => DEFAULT_ENDPOINT_V6.to_string(),
        _ => DEFAULT_ENDPOINT_V4.to_string(),
    }
}

fn status_of(response: &HttpResponse) -> Result<(), OrchestratorError<BadStatus>> {
    let status = response.status().as_u16();
    if response.status().is_success() {
        Ok(())
    } else {
        Err(OrchestratorError::operation(BadStatus(status)))
    }
}

fn body_of(response: &HttpResponse) -> &[u8] {
    // The orchestrator reads the whole body before deserializing (non-streaming).
    response.body().bytes().unwrap_or_default()
}

impl BytesClient {
    fn new(s: &ImdsSettings, http: Option<SharedHttpClient>) -> BytesClient {
        let timeouts = TimeoutConfig::builder()
            .connect_timeout(s.timeout.0)
            .read_timeout(s.timeout.0)
            .operation_attempt_timeout(s.timeout.0 + s.timeout.0)
            .operation_timeout(Duration::from_secs(120))
            .build();
        let retry =
            RetryConfig::standard().with_max_attempts(u32::try_from(s.attempts).unwrap_or(4));
        let endpoint = endpoint(s);
        let ttl = s.token_ttl.0.as_secs().max(1).to_string();
        let base = |name: &'static str| {
            let b = Operation::builder();
            let b = match &http {
                Some(h) => b.http_client(h.clone()),
                None => b,
            };
            b
                // Its own retry partition: its retry tokens are not the metadata client's.
                .service_name("imds-bytes")
                .operation_name(name)
                .endpoint_url(&endpoint)
                .no_auth()
                .standard_retry(&retry)
                .retry_classifier(RetryClassifier)
                .timeout_config(timeouts.clone())
        };
        let token = base("token")
            .serializer(move |()| {
                let mut r = HttpRequest::new(SdkBody::empty());
                r.set_method("PUT")?;
                r.set_uri("/latest/api/token")?;
                r.headers_mut()
                    .try_insert("x-aws-ec2-metadata-token-ttl-seconds", ttl.clone())?;
                Ok(r)
            })
            .deserializer(|response| {
                status_of(response)?;
                let text = std::str::from_utf8(body_of(response))
                    .map_err(|_| OrchestratorError::operation(BadStatus(0)))?;
                Ok(Token(text.trim().to_string()))
            })
            .build();
        let get = base("get-bytes")
            .serializer(|input: GetInput| {
                let mut r = HttpRequest::new(SdkBody::empty());
                r.set_method("GET")?;
                r.set_uri(input.path)?;
                r.headers_mut()
                    .try_insert("x-aws-ec2-metadata-token", input.token.0)?;
                Ok(r)
            })
            .deserializer(|response| {
                status_of(response)?;
                Ok(body_of(response).to_vec())
            })
            .build();
        BytesClient { token, get }
    }

    /// A session token; the service answering no (or nothing usable) is
    /// [`ImdsError::Token`], no answer at all [`ImdsError::Unreachable`].
    async fn token(&self, path: &str) -> Result<Token, ImdsError> {
        let path = path.to_string();
        self.token.invoke(()).await.map_err(|e| match e {
            SdkError::ServiceError(ctx) => ImdsError::Token {
                path,
                message: match ctx.err().0 {
                    0 => "the token is not text".to_string(),
                    status => format!("HTTP {status}"),
                },
            },
            other => ImdsError::Unreachable {
                path,
                message: error_chain(&other),
            },
        })
    }

    async fn get(&self, path: &str, token: &Token) -> Result<Option<Vec<u8>>, ImdsError> {
        let input = GetInput {
            path: path.to_string(),
            token: token.clone(),
        };
        match self.get.invoke(input).await {
            Ok(bytes) => Ok(Some(bytes)),
            Err(SdkError::ServiceError(ctx)) if ctx.err().0 == 404 => Ok(None),
            Err(SdkError::ServiceError(ctx)) => Err(ImdsError::Status {
                path: path.to_string(),
                status: ctx.err().0,
            }),
            Err(e) => Err(ImdsError::Unreachable {
                path: path.to_string(),
                message: error_chain(&e),
            }),
        }
    }
}

pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

/// What bootstrap knows about the instance, all from IMDS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstanceIdentity {
    /// `i-0123456789abcdef0`.
    pub instance_id: String,
    /// `c5.xlarge`.
    pub instance_type: String,
    /// `us-east-1`.
    pub region: String,
    /// `us-east-1a`.
    pub availability_zone: String,
    /// `10.0.0.12`; empty on an IPv6-only instance (IMDS answers 404).
    pub local_ipv4: String,
    /// `ip-10-0-0-12.ec2.internal`.
    pub local_hostname: String,
    /// `ami-0123456789abcdef0`.
    pub ami_id: String,
    /// `instance-life-cycle` is `spot`.
    pub spot: bool,
    /// Instance tags, key to value: from instance metadata (empty unless the instance's
    /// `InstanceMetadataTags` is on), or from EC2's `DescribeTags` with
    /// `imds.tags = "describe-tags"` (read by the `identity` module, which fills this in).
    pub tags: BTreeMap<String, String>,
    /// Whether the tags could be read at all: instance metadata serves them
    /// (`tags/instance` answered; 404 when `InstanceMetadataTags` is off), or
    /// `DescribeTags` answered. When false, no tags means "unavailable", not "none".
    pub tags_available: bool,
    /// The user data as served (bytes: text, gzip, anything), if any.
    pub user_data: Option<Vec<u8>>,
    /// When EC2 launched the instance (`pendingTime` of the instance identity document,
    /// Unix seconds); `None` when the document has none. It survives reboots and names the
    /// instance, not the NodeName: the upgrade's loop guard compares it with the desired
    /// image's publication.
    pub launched_at: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AEMM's default instance identity document (`pendingTime` 2019-10-31T07:02:24Z).
    #[test]
    fn the_launch_time_is_the_identity_documents_pending_time() {
        let doc = r#"{
  "accountId" : "0123456789",
  "architecture" : "x86_64",
  "availabilityZone" : "us-east-1a",
  "imageId" : "ami-0b69ea66ff7391e80",
  "instanceId" : "i-1234567890abcdef0",
  "instanceType" : "m4.xlarge",
  "pendingTime" : "2019-10-31T07:02:24Z",
  "privateIp" : "172.31.4.42",
  "region" : "us-east-1",
  "version" : "2017-09-30"
}"#;
        assert_eq!(pending_time(doc), Some(1_572_505_344));
        assert_eq!(pending_time(r#"{"instanceId": "i-1"}"#), None);
        assert_eq!(pending_time(r#"{"pendingTime": "yesterday"}"#), None);
        assert_eq!(pending_time("<html>"), None);
    }

    #[test]
    fn only_a_plain_http_endpoint_gets_the_client_without_trusted_roots() {
        assert!(http_client("http://169.254.169.254").is_some());
        assert!(http_client("http://[fd00:ec2::254]").is_some());
        assert!(http_client("http://127.0.0.1:8080").is_some());
        assert!(http_client("https://imds.example").is_none());
        assert!(http_client("HTTPS://imds.example").is_none());
    }
}

/// The seam over the instance metadata service for the daemon's polls of notices and
/// events (EC2 User Guide, "Instance metadata categories"): [`Imds`] over IMDSv2, and an
/// in-memory service in unit tests.
#[async_trait::async_trait]
pub trait InstanceMetadata: Send + Sync {
    /// GETs `path` (e.g. `/latest/meta-data/spot/instance-action`); 404 is `Ok(None)`
    /// ([`Imds::get_optional`]).
    ///
    /// # Errors
    /// [`ImdsError`] naming the path.
    async fn get_optional(&self, path: &str) -> Result<Option<String>, ImdsError>;
}

#[async_trait::async_trait]
impl InstanceMetadata for Imds {
    async fn get_optional(&self, path: &str) -> Result<Option<String>, ImdsError> {
        Imds::get_optional(self, path).await
    }
}

/// An in-memory instance metadata service for unit tests.
#[cfg(test)]
pub(crate) mod fake {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex, MutexGuard};

    use super::{ImdsError, InstanceMetadata};

    /// Bodies by path (a path without one answers 404); while `down`, every request is
    /// [`ImdsError::Unreachable`]. Clones share the paths.
    #[derive(Debug, Clone, Default)]
    pub(crate) struct FakeImds {
        paths: Arc<Mutex<BTreeMap<String, String>>>,
        down: Arc<std::sync::atomic::AtomicBool>,
    }

    impl FakeImds {
        fn paths(&self) -> MutexGuard<'_, BTreeMap<String, String>> {
            self.paths
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }

        /// Serves `body` at `path`.
        pub(crate) fn set(&self, path: &str, body: &str) {
            self.paths().insert(path.to_string(), body.to_string());
        }

        /// Stops serving `path` (404).
        pub(crate) fn remove(&self, path: &str) {
            self.paths().remove(path);
        }

        /// Makes the service unreachable (`true`) or back.
        pub(crate) fn set_down(&self, down: bool) {
            self.down.store(down, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[async_trait::async_trait]
    impl InstanceMetadata for FakeImds {
        async fn get_optional(&self, path: &str) -> Result<Option<String>, ImdsError> {
            if self.down.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(ImdsError::Unreachable {
                    path: path.to_string(),
                    message: "connection refused".into(),
                });
            }
            Ok(self.paths().get(path).cloned())
        }
    }
}
