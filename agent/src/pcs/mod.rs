//! Managed join: becoming a node of an AWS Parallel Computing Service (PCS) cluster by
//! registering through the service's `RegisterComputeNodeGroupInstance` call (issue 13),
//! the second join mode beside the configless join to a known controller.
//!
//! Entry point: [`register`], called by bootstrap when `pcs.enabled` is set. It
//! 1. finds the cluster id (`pcs.cluster_id`, else the instance tag `aws:pcs:cluster-id`)
//!    and the compute node group (`pcs.compute_node_group_id`, else
//!    `aws:pcs:compute-node-group-id`);
//! 2. takes this boot's `bootstrapId` (made once per boot, kept in `pcs.bootstrap_id_file`
//!    with the kernel's boot id, so every retry of this boot sends the same one);
//! 3. calls the service with `aws-sdk-pcs`, signed with the instance profile's credentials
//!    from IMDS (aws-config's IMDS credentials provider), the SDK's retries off, retrying
//!    AccessDenied, 5xx and connection errors with capped, jittered backoff and throttling
//!    after a wait drawn from `[0, pcs.throttle_spread]` (a booting fleet's retries spread
//!    over that time, issue 25 §1), for `pcs.register_window`;
//! 4. decodes and checks `sharedSecret` as every key source's key (`auth.type` decides the
//!    path and owner) and returns a [`Managed`]: [`Managed::persist`] installs the key
//!    through the same key writer and keeps the answer, without the secret, in
//!    `<agent.state_dir>/pcs-registration.json` (mode 0600), and bootstrap runs it beside
//!    the node definition and the connection to systemd (before anything starts);
//! 5. [`Managed::join_settings`] make the rest of bootstrap start slurmd configless against
//!    the `SLURMCTLD` endpoints as the pre-declared node `nodeID` (`-N <nodeID>`, not
//!    `-Z`), then wait for the node to be available as usual.
//!
//! When the image's settings (files and flags) already enable the managed mode, bootstrap
//! makes the first attempt early, beside the instance metadata read: [`register_early`]
//! (the cluster id from `pcs.cluster_id` or the one tag, region and credentials from IMDS).
//! [`register`] uses its answer only when the final settings and tags ask the same
//! (cluster, `bootstrapId`, region, endpoint); otherwise, or when the early attempt failed,
//! it registers itself as above. The call is idempotent per `bootstrapId`, so an early
//! answer that goes unused costs nothing.
//!
//! Facts about the API and their sources: `docs/pcs-registration.md`. The service documents
//! this call as the one its own agent makes, not as a public contract (that page says
//! what follows from it).
//!
//! `sharedSecret` never reaches a log line, an error, the record file or `config show`.
//!
//! Floor 4 (subsystems): the `[pcs]` settings section ([`PcsSettings`]) is this module's.

pub mod actions;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use aws_sdk_pcs::config::SharedCredentialsProvider;
use serde::{Deserialize, Serialize};

use crate::authkey::{self, KeyError, KeySource, KeyTarget};
use crate::authkey::{AuthSettings, AuthType, KeyEncoding};
use crate::exit::Exit;
use crate::imds::ImdsSettings;
use crate::imds::InstanceIdentity;
use crate::nodedef::NodeSettings;
use crate::retry::Backoff;
use crate::section::HumanDuration;
use crate::slurm::{ConfServer, SlurmSettings};

pub use actions::NodeLifecycleActions;

/// Instance tag holding the cluster id (set by the service on the instances it launches).
pub const CLUSTER_ID_TAG: &str = "aws:pcs:cluster-id";
/// Instance tag holding the compute node group id.
pub const GROUP_ID_TAG: &str = "aws:pcs:compute-node-group-id";
/// File under `agent.state_dir` keeping the registration answer (without `sharedSecret`).
pub const RECORD_FILE: &str = "pcs-registration.json";

/// Backoff between registration attempts that failed for anything but throttling (a
/// throttled one waits within `pcs.throttle_spread`): a denied call is usually one the
/// service will accept seconds to minutes later (role propagation, the instance not yet
/// known to the group), so start at 1 s and cap at 20 s.
pub const REGISTER_BACKOFF: Backoff = Backoff {
    base: Duration::from_secs(1),
    cap: Duration::from_secs(20),
};

/// The registration's API, IAM's spelling (log lines, [`PcsError::Throttled`]).
pub const API: &str = "pcs:RegisterComputeNodeGroupInstance";

/// The authentication the managed service's clusters use: PCS builds Slurm without MUNGE
/// and runs every cluster with `AuthType=auth/slurm` (`docs/pcs-registration.md`), so its
/// `sharedSecret` is an auth/slurm key. The managed join's `auth.type` when no layer sets
/// it; bootstrap refuses a managed join with another one before it registers.
pub const CLUSTER_AUTH: AuthType = AuthType::Slurm;

/// `[pcs]`: the managed join mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PcsSettings {
    /// Join by registering with PCS instead of `slurm.conf_servers` and `auth.key_source`.
    pub enabled: bool,
    /// Cluster id (`pcs_...`) or name. Empty: the instance tag `aws:pcs:cluster-id`.
    pub cluster_id: String,
    /// Compute node group id. Empty: the tag `aws:pcs:compute-node-group-id` (only used for
    /// the lifecycle scripts' environment when the answer lacks it).
    pub compute_node_group_id: String,
    /// Endpoint URL of the PCS API. Empty: the SDK's regional endpoint (or
    /// `AWS_ENDPOINT_URL_PCS`).
    pub endpoint: String,
    /// Keep retrying transient failures (AccessDenied, throttling, 5xx, connection errors)
    /// this long; the service gives a launched instance about 30 minutes to join.
    pub register_window: HumanDuration,
    /// This boot's `bootstrapId` (with the kernel's boot id), so retries reuse it.
    pub bootstrap_id_file: PathBuf,
    /// Longest wait after a throttled registration: each wait is drawn uniformly from
    /// `[0, throttle_spread]` (full jitter, without growth), which spreads a fleet's
    /// retries over that time, until `register_window` has passed (then exit 69 naming
    /// the API). Size it as the nodes launched together ÷ the call's rate, less the
    /// launch's own spread. AWS publishes no rate for `RegisterComputeNodeGroupInstance`:
    /// the default 45 s fits 1,000 nodes launched within 10 s at 20 registrations a second
    /// (the boot-storm benchmark's assumption). Other failures (AccessDenied, 5xx) back off
    /// from 1 s to 20 s.
    pub throttle_spread: HumanDuration,
}

/// Which cluster and group the node joins is the launch's choice (user data); the API
/// endpoint decides which controller and key the node accepts, and the bootstrap id file is
/// a path: the image's.
impl crate::section::Classified for PcsSettings {
    const SECTION: &'static str = "pcs";
    const TRUST: &'static [crate::section::KeyTrust] = {
        use crate::section::KeyTrust as K;
        &[
            K::user_data("enabled"),
            K::user_data("cluster_id"),
            K::user_data("compute_node_group_id"),
            K::image("endpoint"),
            K::user_data("register_window"),
            K::image("bootstrap_id_file"),
            K::user_data("throttle_spread"),
        ]
    };
}

impl PcsSettings {
    /// Checks the values: `throttle_spread` above zero ([`authkey::ZERO_SPREAD`]).
    ///
    /// # Errors
    /// [`crate::section::InvalidKey`]: the dotted key and what is wrong.
    pub fn validate(&self) -> Result<(), crate::section::InvalidKey> {
        if self.throttle_spread.0.is_zero() {
            return Err(crate::section::InvalidKey::new(
                "pcs.throttle_spread",
                authkey::ZERO_SPREAD,
            ));
        }
        Ok(())
    }
}

impl Default for PcsSettings {
    fn default() -> Self {
        PcsSettings {
            enabled: false,
            cluster_id: String::new(),
            compute_node_group_id: String::new(),
            endpoint: String::new(),
            register_window: HumanDuration(Duration::from_secs(30 * 60)),
            bootstrap_id_file: PathBuf::from("/run/slurm-node-agent/pcs-bootstrap-id"),
            throttle_spread: HumanDuration(Duration::from_secs(45)),
        }
    }
}

/// Why the managed join failed. [`PcsError::exit`] gives the exit code.
#[derive(Debug, thiserror::Error)]
pub enum PcsError {
    /// Settings or tags do not say enough (exit 78).
    #[error("{key}: {message}")]
    Config {
        /// Settings key (or tag) at fault.
        key: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The service refused the request as malformed (exit 78): not worth retrying.
    #[error("PCS RegisterComputeNodeGroupInstance for cluster {cluster}: {code}: {message}")]
    Rejected {
        /// Cluster identifier sent.
        cluster: String,
        /// Error code, e.g. `ValidationException`.
        code: String,
        /// The service's message.
        message: String,
    },
    /// No success within `pcs.register_window` (exit 69); the last error is AWS's.
    #[error(
        "PCS RegisterComputeNodeGroupInstance for cluster {cluster} failed {attempts} times \
         in {waited:?} (pcs.register_window); last error: {last}"
    )]
    Unavailable {
        /// Cluster identifier sent.
        cluster: String,
        /// Attempts made.
        attempts: u32,
        /// Time spent.
        waited: Duration,
        /// The last error.
        last: String,
    },
    /// The service throttled the call until `pcs.register_window` ended (exit 69).
    #[error(
        "PCS RegisterComputeNodeGroupInstance for cluster {cluster}: {API} throttled \
         ({message}) {attempts} times in {waited:?} (pcs.register_window); quota: {}",
        crate::retry::quota_of(API)
    )]
    Throttled {
        /// Cluster identifier sent.
        cluster: String,
        /// AWS's code and message (`ThrottlingException: Rate exceeded`).
        message: String,
        /// Attempts that AWS throttled (others may have failed otherwise).
        attempts: u32,
        /// Time from the first attempt to the last answer.
        waited: Duration,
    },
    /// The answer is unusable (exit 65): an unsafe nodeID, no SLURMCTLD endpoint.
    #[error("PCS registration answer: {0}")]
    Answer(#[source] AnswerError),
    /// The shared secret could not be installed.
    #[error("auth key: {0}")]
    Key(#[from] KeyError),
    /// A folder of the agent's could not be created (exit 74).
    #[error(transparent)]
    Folder(#[from] crate::fsutil::FileError),
    /// A state file (the registration record, the boot's node id) could not be written
    /// (exit 74).
    #[error(transparent)]
    Write(#[from] crate::fsutil::WriteError),
    /// The registration record could not be encoded (exit 74).
    #[error(transparent)]
    Encode(#[from] serde_json::Error),
}

/// What makes a registration answer unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// An endpoint's `privateIpAddress` is not an IP address.
    #[error("SLURMCTLD privateIpAddress {address:?} is not an IP address")]
    NotAnAddress {
        /// The value given.
        address: String,
    },
    /// An endpoint's `port` is not a port.
    #[error("SLURMCTLD port {port:?} is not a port")]
    NotAPort {
        /// The value given.
        port: String,
    },
    /// The endpoint does not make a `--conf-server` entry.
    #[error(transparent)]
    Server(#[from] crate::slurm::InvalidServer),
    /// No endpoint of type `SLURMCTLD`.
    #[error("no SLURMCTLD endpoint")]
    NoSlurmctld,
    /// `nodeID` is not a NodeName slurmd can take.
    #[error("nodeID: {source}")]
    NodeId {
        /// The nodeID given.
        node_id: String,
        /// What is wrong with it, as the NodeName check says.
        #[source]
        source: crate::nodedef::NodeNameError,
    },
}

impl PcsError {
    /// The exit code: config, unavailable, bad data, I/O; key errors as the key's own
    /// ([`KeyError::exit`]).
    pub fn exit(&self) -> Exit {
        match self {
            PcsError::Config { .. } | PcsError::Rejected { .. } => Exit::Config,
            PcsError::Unavailable { .. } | PcsError::Throttled { .. } => Exit::Unavailable,
            PcsError::Answer(_) => Exit::DataErr,
            PcsError::Folder(_) | PcsError::Write(_) | PcsError::Encode(_) => Exit::IoErr,
            PcsError::Key(e) => e.exit(),
        }
    }
}

/// One controller endpoint from the answer (`Endpoint`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// `SLURMCTLD`, `SLURMDBD` or `SLURMRESTD`.
    #[serde(rename = "type")]
    pub endpoint_type: String,
    /// Private IP address.
    pub private_ip_address: String,
    /// Port, as the API gives it (a string).
    pub port: String,
    /// Public IP address, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_ip_address: Option<String>,
    /// IPv6 address, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6_address: Option<String>,
}

/// What the registration gave, kept in [`RECORD_FILE`] for other commands. Has no
/// `sharedSecret`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Registration {
    /// Cluster identifier sent.
    pub cluster_identifier: String,
    /// `bootstrapId` sent.
    pub bootstrap_id: String,
    /// EC2 instance id.
    pub instance_id: String,
    /// Slurm NodeName.
    #[serde(rename = "nodeID")]
    pub node_id: String,
    /// Controller endpoints.
    pub endpoints: Vec<Endpoint>,
    /// Cluster name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<String>,
    /// Compute node group id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_node_group_id: Option<String>,
    /// Compute node group name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_node_group_name: Option<String>,
    /// Lifecycle scripts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_lifecycle_actions: Option<NodeLifecycleActions>,
    /// Attempts it took.
    pub attempts: u32,
    /// The drain reason of a lifecycle script whose `onError = TERMINATE` failed (the node
    /// is powering off); in `nodeBootstrapped` this record and the log are the only places
    /// it goes, as slurmd has not fetched its config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminated_by: Option<String>,
}

impl Registration {
    /// Checks what the agent takes from the answer (a `nodeID` slurmd's `-N` and scontrol
    /// can take, the `SLURMCTLD` endpoints) and returns the configless servers.
    ///
    /// # Errors
    /// [`PcsError::Answer`] (exit 65): an unsafe `nodeID`, or [`Registration::conf_servers`]'s.
    pub fn usable(&self) -> Result<Vec<String>, PcsError> {
        crate::nodedef::validate_node_name(&self.node_id).map_err(|source| {
            PcsError::Answer(AnswerError::NodeId {
                node_id: self.node_id.clone(),
                source,
            })
        })?;
        self.conf_servers()
    }

    /// The `SLURMCTLD` endpoints as configless servers, in the answer's order.
    ///
    /// # Errors
    /// When there is none, or one is not an address and port.
    pub fn conf_servers(&self) -> Result<Vec<String>, PcsError> {
        let mut out = Vec::new();
        for e in self
            .endpoints
            .iter()
            .filter(|e| e.endpoint_type == "SLURMCTLD")
        {
            let ip: std::net::IpAddr = e.private_ip_address.parse().map_err(|_| {
                PcsError::Answer(AnswerError::NotAnAddress {
                    address: e.private_ip_address.clone(),
                })
            })?;
            let port: u16 = e.port.parse().map_err(|_| {
                PcsError::Answer(AnswerError::NotAPort {
                    port: e.port.clone(),
                })
            })?;
            let server = match ip {
                std::net::IpAddr::V4(v4) => format!("{v4}:{port}"),
                std::net::IpAddr::V6(v6) => format!("[{v6}]:{port}"),
            };
            ConfServer::parse(&server).map_err(|e| PcsError::Answer(e.into()))?;
            out.push(server);
        }
        if out.is_empty() {
            return Err(PcsError::Answer(AnswerError::NoSlurmctld));
        }
        Ok(out)
    }
}

/// The outcome of [`register`].
#[derive(Debug, Clone)]
pub struct Managed {
    /// The answer (without the secret).
    pub registration: Registration,
    /// Configless servers from the `SLURMCTLD` endpoints.
    pub conf_servers: Vec<String>,
    /// The checked key from `sharedSecret`, its owner and file, for [`Managed::persist`].
    key: authkey::Key,
    owner: crate::fsutil::Owner,
    path: PathBuf,
}

impl Managed {
    /// What installs the key from the answer (through the key writer, like every key
    /// source: `auth.type`'s path and owner) and writes the record, as a blocking job for
    /// a blocking thread: `Ok(true)` when the key file was (re)written.
    ///
    /// # Errors
    /// [`PcsError::Key`] (the key write failed), [`PcsError::Write`] (the record).
    pub fn persist(
        &self,
        state_dir: &Path,
    ) -> impl FnOnce() -> Result<bool, PcsError> + Send + 'static {
        let (key, owner, path) = (self.key.clone(), self.owner, self.path.clone());
        let state_dir = state_dir.to_path_buf();
        let registration = self.registration.clone();
        move || {
            let changed = authkey::install(&key, &path, owner)?;
            tracing::info!(path = %path.display(), changed, "auth key installed from the registration");
            write_record(&state_dir, &registration)?;
            Ok(changed)
        }
    }

    /// Makes the sections the rest of bootstrap runs with say what the registration says:
    /// NodeName `nodeID`, a pre-declared (not dynamic) node, the `SLURMCTLD` endpoints as
    /// configless servers, and no key source (the key is already installed from the
    /// answer).
    pub fn join_settings(
        &self,
        node: &mut NodeSettings,
        slurm: &mut SlurmSettings,
        auth: &mut AuthSettings,
    ) {
        node.name = self.registration.node_id.clone();
        node.dynamic = false;
        slurm.conf_servers = self.conf_servers.clone();
        auth.key_source = String::new();
    }
}

/// The cluster id and compute node group id from settings or tags.
///
/// # Errors
/// [`PcsError::Config`] when there is no cluster id, or it does not match the API's pattern.
pub fn cluster_and_group(
    s: &PcsSettings,
    tags: &BTreeMap<String, String>,
) -> Result<(String, Option<String>), PcsError> {
    let (cluster, key) = if s.cluster_id.is_empty() {
        match tags.get(CLUSTER_ID_TAG) {
            Some(c) => (c.clone(), "tag aws:pcs:cluster-id"),
            None => {
                return Err(PcsError::Config {
                    key: "pcs.cluster_id",
                    message: format!(
                        "no cluster id: set pcs.cluster_id, or allow tags in instance metadata \
                         so that the tag {CLUSTER_ID_TAG} can be read"
                    ),
                })
            }
        }
    } else {
        (s.cluster_id.clone(), "pcs.cluster_id")
    };
    if !valid_cluster_identifier(&cluster) {
        return Err(PcsError::Config {
            key: if key == "pcs.cluster_id" {
                "pcs.cluster_id"
            } else {
                "tag aws:pcs:cluster-id"
            },
            message: format!(
                "{cluster:?} is not a cluster id or name \
                 (pattern (pcs_[a-zA-Z0-9]+|[A-Za-z][A-Za-z0-9-]{{2,40}}))"
            ),
        });
    }
    let group = if s.compute_node_group_id.is_empty() {
        tags.get(GROUP_ID_TAG).cloned()
    } else {
        Some(s.compute_node_group_id.clone())
    };
    Ok((cluster, group))
}

/// `clusterIdentifier`'s pattern, applied to the whole value:
/// `(pcs_[a-zA-Z0-9]+|[A-Za-z][A-Za-z0-9-]{2,40})`.
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

/// This boot's `bootstrapId`: the one in `path` when it was made in this boot, else a new
/// one (32 random hex digits, as the service's own agent made them) written there first.
///
/// # Errors
/// [`PcsError::Folder`] or [`PcsError::Write`] when the file cannot be written.
pub fn bootstrap_id(path: &Path) -> Result<String, PcsError> {
    let boot = crate::hostfacts::boot_id().unwrap_or_default();
    if let Ok(text) = std::fs::read_to_string(path) {
        if let Some((b, id)) = text.trim().split_once(' ') {
            if b == boot && (1..=1000).contains(&id.len()) && !id.contains(char::is_whitespace) {
                return Ok(id.to_string());
            }
        }
    }
    let id = format!("{:032x}", rand::random::<u128>());
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(crate::fsutil::FileError::at(dir))?;
    }
    crate::fsutil::write_atomic(path, format!("{boot} {id}\n").as_bytes(), 0o600, None)?;
    Ok(id)
}

/// Reads the record a managed bootstrap left, if any.
pub fn read_record(state_dir: &Path) -> Option<Registration> {
    let text = std::fs::read(state_dir.join(RECORD_FILE)).ok()?;
    serde_json::from_slice(&text).ok()
}

/// Whether an error is worth another attempt: everything except a request the service
/// calls malformed.
fn retryable(code: Option<&str>) -> bool {
    !matches!(
        code,
        Some(
            "ValidationException"
                | "SerializationException"
                | "UnknownOperationException"
                | "ResourceNotFoundException"
        )
    )
}

/// The service's answer.
type Answer = aws_sdk_pcs::operation::register_compute_node_group_instance::RegisterComputeNodeGroupInstanceOutput;

/// The instance profile's credentials from IMDS (aws-config's IMDS credentials provider,
/// through the agent's IMDS settings): what the registration is signed with.
fn instance_credentials(imds: &ImdsSettings) -> SharedCredentialsProvider {
    SharedCredentialsProvider::new(
        aws_config::imds::credentials::ImdsCredentialsProvider::builder()
            .imds_client(crate::imds::build_client(imds))
            .build(),
    )
}

/// The PCS client: `region`, `creds` (the instance profile's, [`instance_credentials`]),
/// `pcs.endpoint` when set, and no SDK retries (the callers retry).
async fn client(
    pcs: &PcsSettings,
    creds: SharedCredentialsProvider,
    region: &str,
) -> aws_sdk_pcs::Client {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(region.to_string()))
        .credentials_provider(creds)
        .retry_config(aws_config::retry::RetryConfig::disabled());
    if !pcs.endpoint.is_empty() {
        loader = loader.endpoint_url(&pcs.endpoint);
    }
    aws_sdk_pcs::Client::new(&loader.load().await)
}

/// One answer from an attempt made before the instance's metadata was fully read, with
/// what it asked, or the fact that AWS throttled it; see the module docs.
#[derive(Debug)]
pub struct EarlyRegistration {
    cluster: String,
    bootstrap_id: String,
    region: String,
    endpoint: String,
    answer: EarlyAnswer,
}

/// What the early attempt got.
#[derive(Debug)]
enum EarlyAnswer {
    /// The service's answer (boxed: the answer is large beside the other variant).
    Registered(Box<Answer>),
    /// AWS throttled it (its code and message): [`register`] then waits within
    /// `pcs.throttle_spread` before its own first attempt, as after any throttled
    /// attempt, instead of asking again at once.
    Throttled(String),
}

/// One registration attempt with the image's settings (files and flags: `[pcs]`, `[imds]`), for bootstrap
/// to start beside the instance metadata read: only when `pcs.enabled` is set there; the
/// cluster id from `pcs.cluster_id`, else the tag `aws:pcs:cluster-id` read on its own;
/// region and credentials from IMDS. A throttled attempt is kept as such (see
/// [`EarlyRegistration`]). `None` when it cannot be made or fails otherwise (logged at
/// debug level): [`register`] then registers (and retries) itself, with the cluster id from
/// the identity's tags (EC2's `DescribeTags` with `imds.tags = "describe-tags"`, where
/// metadata serves no tags and this attempt finds none).
pub async fn register_early(pcs: &PcsSettings, imds: &ImdsSettings) -> Option<EarlyRegistration> {
    if !pcs.enabled {
        return None;
    }
    let client_settings = imds;
    let imds = crate::imds::Imds::new(imds);
    let region = imds
        .get("/latest/meta-data/placement/region")
        .await
        .ok()?
        .trim()
        .to_string();
    let cluster = if pcs.cluster_id.is_empty() {
        imds.get(&format!("/latest/meta-data/tags/instance/{CLUSTER_ID_TAG}"))
            .await
            .ok()?
    } else {
        pcs.cluster_id.clone()
    };
    if !valid_cluster_identifier(&cluster) {
        return None;
    }
    let bootstrap_id = bootstrap_id(&pcs.bootstrap_id_file).ok()?;
    let sent = client(pcs, instance_credentials(client_settings), &region)
        .await
        .register_compute_node_group_instance()
        .cluster_identifier(&cluster)
        .bootstrap_id(&bootstrap_id)
        .send()
        .await;
    let early = |answer| EarlyRegistration {
        cluster: cluster.clone(),
        bootstrap_id: bootstrap_id.clone(),
        region: region.clone(),
        endpoint: pcs.endpoint.clone(),
        answer,
    };
    let failure = match sent {
        Ok(answer) => return Some(early(EarlyAnswer::Registered(Box::new(answer)))),
        Err(e) => Failure::of(&e),
    };
    if failure.is_throttle() {
        tracing::debug!(
            "the early PCS registration attempt was throttled: {}",
            failure.last()
        );
        Some(early(EarlyAnswer::Throttled(failure.last())))
    } else {
        tracing::debug!(
            "the early PCS registration attempt failed (bootstrap registers itself): {}",
            failure.last()
        );
        None
    }
}

/// The service's error answer to one registration call, as the retries read it.
struct Failure {
    /// AWS's error code (`ThrottlingException`, `AccessDeniedException`...), when it sent one.
    code: Option<String>,
    /// AWS's message, else the error's chain (a connection error).
    message: String,
    /// The HTTP status, when an answer came.
    status: Option<u16>,
}

impl Failure {
    fn of(
        e: &aws_sdk_pcs::error::SdkError<
            aws_sdk_pcs::operation::register_compute_node_group_instance::RegisterComputeNodeGroupInstanceError,
        >,
    ) -> Failure {
        use aws_sdk_pcs::error::ProvideErrorMetadata;
        let failure = Failure {
            code: e.code().map(str::to_string),
            message: match e.message() {
                Some(m) => m.to_string(),
                None => crate::imds::error_chain(e),
            },
            status: e.raw_response().map(|r| r.status().as_u16()),
        };
        if failure.is_throttle() {
            crate::textfile::note_throttled(API);
        }
        failure
    }

    /// AWS throttled the call (its code, or HTTP 429).
    fn is_throttle(&self) -> bool {
        crate::retry::is_throttling(self.code.as_deref(), self.status)
    }

    /// `code: message`, or the message alone.
    fn last(&self) -> String {
        match &self.code {
            Some(c) => format!("{c}: {}", self.message),
            None => self.message.clone(),
        }
    }
}

/// The one warning of a throttled registration (issue 25 §1: once, not once per retry;
/// `early`: it was bootstrap's early attempt that AWS throttled).
fn warn_throttled(
    attempt: u32,
    wait: Duration,
    last: &str,
    early: bool,
    throttle: &crate::retry::ThrottlePolicy,
) {
    tracing::warn!(
        attempt,
        retry_in_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        "{API} throttled ({last}; quota: {}{}); retrying within {:?} (pcs.throttle_spread) \
         until {:?} (pcs.register_window)",
        crate::retry::quota_of(API),
        if early { "; the early attempt" } else { "" },
        throttle.spread,
        throttle.window
    );
}

/// Registers with PCS (or takes `early`'s answer when it asked the same) and checks the
/// answer and the key; see the module docs. Nothing is written but the `bootstrapId` file:
/// [`Managed::persist`] writes the key and the record.
///
/// # Errors
/// [`PcsError`].
pub async fn register(
    pcs: &PcsSettings,
    imds: &ImdsSettings,
    auth: &AuthSettings,
    id: &InstanceIdentity,
    early: Option<EarlyRegistration>,
) -> Result<Managed, PcsError> {
    register_with_credentials(pcs, instance_credentials(imds), auth, id, early).await
}

/// [`register`] signed with `creds` instead of the instance profile's credentials from
/// IMDS: the boot-storm benchmark's seam (many simulated instances in one process, each
/// with its own role session and client).
///
/// # Errors
/// [`PcsError`].
pub async fn register_with_credentials(
    pcs: &PcsSettings,
    creds: SharedCredentialsProvider,
    auth: &AuthSettings,
    id: &InstanceIdentity,
    early: Option<EarlyRegistration>,
) -> Result<Managed, PcsError> {
    let (cluster, group) = cluster_and_group(pcs, &id.tags)?;
    let bootstrap_id = bootstrap_id(&pcs.bootstrap_id_file)?;
    let early = early.filter(|e| {
        e.cluster == cluster
            && e.bootstrap_id == bootstrap_id
            && e.region == id.region
            && e.endpoint == pcs.endpoint
    });
    let (out, attempts) = match early {
        Some(EarlyRegistration {
            answer: EarlyAnswer::Registered(answer),
            ..
        }) => {
            tracing::info!(%cluster, %bootstrap_id, group = ?group, "registered with PCS beside the instance metadata read");
            (*answer, 1)
        }
        early => {
            let early_throttled = early.and_then(|e| match e.answer {
                EarlyAnswer::Throttled(m) => Some(m),
                EarlyAnswer::Registered(_) => None,
            });
            let ids = (cluster.as_str(), bootstrap_id.as_str(), group.as_deref());
            register_with_retries(pcs, creds, id, ids, early_throttled).await?
        }
    };
    let registration = Registration {
        cluster_identifier: cluster.clone(),
        bootstrap_id,
        instance_id: id.instance_id.clone(),
        node_id: out.node_id().to_string(),
        endpoints: out
            .endpoints()
            .iter()
            .map(|e| Endpoint {
                endpoint_type: e.r#type().as_str().to_string(),
                private_ip_address: e.private_ip_address().to_string(),
                port: e.port().to_string(),
                public_ip_address: e.public_ip_address().map(str::to_string),
                ipv6_address: e.ipv6_address().map(str::to_string),
            })
            .collect(),
        cluster_name: out.cluster_name().map(str::to_string),
        compute_node_group_id: out.compute_node_group_id().map(str::to_string).or(group),
        compute_node_group_name: out.compute_node_group_name().map(str::to_string),
        node_lifecycle_actions: out.node_lifecycle_actions().map(NodeLifecycleActions::from),
        attempts,
        terminated_by: None,
    };
    let conf_servers = registration.usable()?;
    tracing::info!(
        node_id = %registration.node_id,
        servers = ?conf_servers,
        cluster_name = ?registration.cluster_name,
        attempts,
        "registered with PCS"
    );

    // The secret goes through the same checks and writer as every key source.
    let target = KeyTarget::from_settings(auth);
    let owner = authkey::resolve_owner(&target.owner)?;
    let key = authkey::decode(
        &KeySource::Registration(cluster),
        out.shared_secret().as_bytes(),
        KeyEncoding::Base64,
        &target,
    )?;
    Ok(Managed {
        registration,
        conf_servers,
        key,
        owner,
        path: target.path,
    })
}

/// The service's call with retries, the SDK's off (so the two never multiply): a throttled
/// attempt is tried again after a wait drawn uniformly from `[0, pcs.throttle_spread]`
/// (logged once with the API and its quota, later ones at debug level), other transient
/// failures (see [`retryable`]) with [`REGISTER_BACKOFF`], until `pcs.register_window` has
/// passed. `early_throttled`: AWS's words when bootstrap's early attempt
/// ([`register_early`]) was throttled, so the first attempt here waits as after any
/// throttled one. `ids`: the cluster, the
/// `bootstrapId` and the compute node group (logged). Returns the answer and the number of
/// attempts, the early one included.
async fn register_with_retries(
    pcs: &PcsSettings,
    creds: SharedCredentialsProvider,
    id: &InstanceIdentity,
    ids: (&str, &str, Option<&str>),
    early_throttled: Option<String>,
) -> Result<(Answer, u32), PcsError> {
    let (cluster, bootstrap_id, group) = ids;
    let client = client(pcs, creds, &id.region).await;
    tracing::info!(%cluster, %bootstrap_id, group = ?group, "registering with PCS");
    let start = Instant::now();
    let window = pcs.register_window.0;
    let throttle = crate::retry::ThrottlePolicy {
        spread: pcs.throttle_spread.0,
        window,
    };
    let mut attempts = 0u32;
    let mut throttled = 0u32;
    if let Some(last) = early_throttled {
        attempts = 1;
        throttled = 1;
        let wait = throttle.delay(window);
        warn_throttled(attempts, wait, &last, true, &throttle);
        tokio::time::sleep(wait).await;
    }
    loop {
        attempts += 1;
        let result = client
            .register_compute_node_group_instance()
            .cluster_identifier(cluster)
            .bootstrap_id(bootstrap_id)
            .send()
            .await;
        let failure = match result {
            Ok(out) => return Ok((out, attempts)),
            Err(e) => Failure::of(&e),
        };
        if !retryable(failure.code.as_deref()) {
            return Err(PcsError::Rejected {
                cluster: cluster.to_string(),
                code: failure.code.unwrap_or_default(),
                message: failure.message,
            });
        }
        let last = failure.last();
        let is_throttle = failure.is_throttle();
        let left = window.saturating_sub(start.elapsed());
        if left.is_zero() {
            let waited = start.elapsed();
            return Err(if is_throttle {
                PcsError::Throttled {
                    cluster: cluster.to_string(),
                    message: last,
                    attempts: throttled + 1,
                    waited,
                }
            } else {
                PcsError::Unavailable {
                    cluster: cluster.to_string(),
                    attempts,
                    waited,
                    last,
                }
            });
        }
        let wait = if is_throttle {
            throttle.delay(left)
        } else {
            REGISTER_BACKOFF.delay(attempts - throttled - 1).min(left)
        };
        let retry_in_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        if is_throttle {
            // A throttle is logged once (issue 25 §1), not once per retry.
            throttled += 1;
            if throttled == 1 {
                warn_throttled(attempts, wait, &last, false, &throttle);
            } else {
                tracing::debug!(
                    attempt = attempts,
                    retry_in_ms,
                    "{API} throttled again: {last}"
                );
            }
        } else {
            tracing::warn!(
                attempt = attempts,
                retry_in_ms,
                "PCS registration failed: {last}"
            );
        }
        tokio::time::sleep(wait).await;
    }
}

/// Adds `terminatedBy` to the record of this registration.
///
/// # Errors
/// [`PcsError::Folder`], [`PcsError::Write`].
pub fn record_termination(
    state_dir: &Path,
    r: &Registration,
    reason: &str,
) -> Result<(), PcsError> {
    let mut r = r.clone();
    r.terminated_by = Some(reason.to_string());
    write_record(state_dir, &r)
}

fn write_record(state_dir: &Path, r: &Registration) -> Result<(), PcsError> {
    std::fs::create_dir_all(state_dir).map_err(crate::fsutil::FileError::at(state_dir))?;
    let json = serde_json::to_vec_pretty(r)?;
    Ok(crate::fsutil::write_atomic(
        &state_dir.join(RECORD_FILE),
        &json,
        0o600,
        None,
    )?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_zero_throttle_spread_is_refused_naming_the_key() {
        let mut s = PcsSettings::default();
        assert_eq!(s.validate(), Ok(()));
        s.throttle_spread = HumanDuration(Duration::ZERO);
        let e = s.validate().unwrap_err();
        assert_eq!(e.key, "pcs.throttle_spread");
        assert!(e.to_string().contains("must be more than 0s"), "{e}");
        let mut a = AuthSettings {
            throttle_spread: HumanDuration(Duration::ZERO),
            ..AuthSettings::default()
        };
        assert_eq!(a.validate().unwrap_err().key, "auth.throttle_spread");
        a.throttle_spread = HumanDuration(Duration::from_millis(1));
        assert_eq!(a.validate(), Ok(()));
    }

    #[test]
    fn cluster_from_settings_or_tag() {
        let mut tags = BTreeMap::new();
        let mut s = PcsSettings::default();
        let e = cluster_and_group(&s, &tags).unwrap_err();
        assert!(e.to_string().contains("pcs.cluster_id"), "{e}");
        assert_eq!(e.exit().code(), 78);
        tags.insert(CLUSTER_ID_TAG.to_string(), "pcs_abc".to_string());
        tags.insert(GROUP_ID_TAG.to_string(), "pcs_grp".to_string());
        assert_eq!(
            cluster_and_group(&s, &tags).unwrap(),
            ("pcs_abc".to_string(), Some("pcs_grp".to_string()))
        );
        s.cluster_id = "my-cluster".into();
        assert_eq!(cluster_and_group(&s, &tags).unwrap().0, "my-cluster");
        s.cluster_id = "bad id".into();
        let e = cluster_and_group(&s, &tags).unwrap_err();
        assert!(e.to_string().starts_with("pcs.cluster_id:"), "{e}");
        s.cluster_id.clear();
        tags.insert(CLUSTER_ID_TAG.to_string(), "x".to_string());
        let e = cluster_and_group(&s, &tags).unwrap_err();
        assert!(e.to_string().starts_with("tag aws:pcs:cluster-id:"), "{e}");
    }

    #[test]
    fn bootstrap_id_is_kept_within_a_boot_and_renewed_after() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/id");
        let a = bootstrap_id(&p).unwrap();
        assert_eq!(a.len(), 32);
        assert_eq!(bootstrap_id(&p).unwrap(), a);
        // Written in another boot: a new one.
        std::fs::write(&p, format!("another-boot {a}\n")).unwrap();
        let b = bootstrap_id(&p).unwrap();
        assert_ne!(a, b);
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o600);
    }

    #[test]
    fn servers_from_slurmctld_endpoints_only() {
        let ep = |t: &str, ip: &str, port: &str| Endpoint {
            endpoint_type: t.into(),
            private_ip_address: ip.into(),
            port: port.into(),
            public_ip_address: None,
            ipv6_address: None,
        };
        let mut r = Registration {
            cluster_identifier: "pcs_a".into(),
            bootstrap_id: "b".into(),
            instance_id: "i-1".into(),
            node_id: "compute-1".into(),
            endpoints: vec![
                ep("SLURMDBD", "10.0.0.2", "6819"),
                ep("SLURMCTLD", "10.0.0.1", "6817"),
            ],
            cluster_name: None,
            compute_node_group_id: None,
            compute_node_group_name: None,
            node_lifecycle_actions: None,
            attempts: 1,
            terminated_by: None,
        };
        assert_eq!(r.conf_servers().unwrap(), ["10.0.0.1:6817"]);
        assert_eq!(r.usable().unwrap(), ["10.0.0.1:6817"]);
        // A nodeID slurmd's -N and scontrol must not take: ALL is every node in scontrol.
        for bad in ["ALL", "a b", "n[1-2]", ""] {
            r.node_id = bad.into();
            let e = r.usable().unwrap_err();
            assert_eq!(e.exit().code(), 65, "{bad:?}: {e}");
            assert!(
                e.to_string()
                    .starts_with("PCS registration answer: nodeID: NodeName"),
                "{e}"
            );
        }
        r.node_id = "compute-1".into();
        r.endpoints[1].port = "68a".into();
        assert_eq!(r.conf_servers().unwrap_err().exit().code(), 65);
        r.endpoints.remove(1);
        assert!(r
            .conf_servers()
            .unwrap_err()
            .to_string()
            .contains("no SLURMCTLD"));
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains("\"nodeID\":\"compute-1\""), "{json}");
    }
}
