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
//! - maps errors to [`ImdsError`], which always names the path.
//!
//! Paths and formats: <https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-categories.html>.

use aws_config::imds::client::error::ImdsError as SdkImdsError;
use aws_smithy_runtime_api::client::interceptors::context::InterceptorContext;
use aws_smithy_runtime_api::client::retries::classifiers::{
    ClassifyRetry, RetryAction, SharedRetryClassifier,
};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::settings;

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
    settings: settings::Imds,
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
    pub fn new(settings: &settings::Imds) -> Imds {
        Imds {
            client: Mutex::new(build_client(settings)),
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
                    build_client(&self.settings);
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

    /// The user data as text. User data that is not text (gzip-compressed, binary) cannot
    /// carry the settings part, so it counts as none, with a warning.
    async fn user_data(&self) -> Result<Option<String>, ImdsError> {
        match self.get_optional("/latest/user-data").await {
            Err(ImdsError::Unreachable { message, .. }) if message.contains("UTF-8") => {
                tracing::warn!("user data is not text (compressed?): no settings read from it");
                Ok(None)
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
            self.user_data(),
        )?;
        let mut tags = BTreeMap::new();
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
            user_data,
        })
    }
}

pub(crate) fn build_client(s: &settings::Imds) -> aws_config::imds::Client {
    let mut b = aws_config::imds::Client::builder()
        .max_attempts(u32::try_from(s.attempts).unwrap_or(4))
        .token_ttl(s.token_ttl.0)
        .connect_timeout(s.timeout.0)
        .read_timeout(s.timeout.0)
        .operation_attempt_timeout(s.timeout.0 + s.timeout.0)
        .operation_timeout(Duration::from_secs(120))
        .retry_classifier(SharedRetryClassifier::new(RetryClassifier));
    if !s.endpoint.is_empty() {
        // Validated as an http(s) URL by the settings.
        match b.clone().endpoint(&s.endpoint) {
            Ok(with) => b = with,
            Err(e) => tracing::warn!(endpoint = %s.endpoint, "ignoring IMDS endpoint: {e}"),
        }
    }
    b.build()
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
    /// Instance tags (empty unless the launch template allows tags in metadata).
    pub tags: BTreeMap<String, String>,
    /// Raw user data, if any.
    pub user_data: Option<String>,
}
