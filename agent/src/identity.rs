//! The node's identity, in one place: which NodeName this instance is, which instance
//! incarnation registered it, and how the agent marks the drains it owns in Slurm.
//!
//! - **NodeName**: [`node_name`] (`node.name`, else `node.name_template` over instance
//!   facts) is the one rule; [`resolve`] applies it for every command: bootstrap's record
//!   (`bootstrap.json`) when there is one, otherwise the settings resolved exactly as
//!   bootstrap resolves them (files, user data, tags, flags) over IMDS's facts.
//!   `check` (Slurm's `HealthCheckProgram`) first takes `SLURMD_NODENAME`.
//! - **Incarnation**: the EC2 instance id. Bootstrap records it with the NodeName; a
//!   replacement instance (same NodeName, new instance id) is a new incarnation. Whose
//!   Slurm's record is, this instance's or a predecessor's, is [`RecordHolder`]: the
//!   record's own `InstanceId` where Slurm keeps one (23.11+), else the instance id in the
//!   agent's reasons and the local files.
//! - **Reasons**: the node's reason in Slurm is the record of who owns a drain. Every
//!   reason the agent writes is `slurm-node-agent/<cause>@<instance-id>: <detail>`
//!   ([`AgentReason`]), where `<cause>` is one of [`ReasonCause::ALL`] and `<instance-id>`
//!   is the incarnation that wrote it (`unknown` when it was not known). A reason that does
//!   not parse exactly so (for example `slurm-node-agent: foo`, or `ADMIN SHUTDOWN`) is an
//!   admin's, and the agent never lifts or overwrites it.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::imds::{Imds, ImdsError, InstanceIdentity};
use crate::settings::{self, Layer, Resolved, SettingsError, Source};
use crate::slurm::NodeInfo;
use crate::userdata::SettingsPart;

/// Start of every reason the agent writes.
pub const REASON_PREFIX: &str = "slurm-node-agent/";

/// The instance id written when the incarnation is not known.
pub const UNKNOWN_INSTANCE: &str = "unknown";

/// Slurm keeps at most this many characters of a reason that the agent writes.
pub const REASON_MAX: usize = 256;

/// Why the agent drained a node: the `<cause>` of a reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReasonCause {
    /// A health check failed (`check`, the daemon's checks).
    Health,
    /// A required shared file system is missing.
    Mount,
    /// A spot interruption notice with action `terminate`.
    Spot,
    /// A spot interruption notice with action `stop`.
    Stop,
    /// A spot interruption notice with action `hibernate`.
    Hibernate,
    /// An EC2 rebalance recommendation.
    Rebalance,
    /// A scheduled maintenance event.
    Maintenance,
    /// An Auto Scaling lifecycle state (Terminated).
    Lifecycle,
    /// A rolling image upgrade.
    Upgrade,
    /// An operator's `slurm-node-agent drain`.
    Operator,
    /// A script or hook acting through the agent.
    Script,
}

impl ReasonCause {
    /// Every cause, in the order the README lists them.
    pub const ALL: [ReasonCause; 11] = [
        ReasonCause::Health,
        ReasonCause::Mount,
        ReasonCause::Spot,
        ReasonCause::Stop,
        ReasonCause::Hibernate,
        ReasonCause::Rebalance,
        ReasonCause::Maintenance,
        ReasonCause::Lifecycle,
        ReasonCause::Upgrade,
        ReasonCause::Operator,
        ReasonCause::Script,
    ];

    /// The word in the reason: `health`, `mount`, `spot`...
    pub fn as_str(self) -> &'static str {
        match self {
            ReasonCause::Health => "health",
            ReasonCause::Mount => "mount",
            ReasonCause::Spot => "spot",
            ReasonCause::Stop => "stop",
            ReasonCause::Hibernate => "hibernate",
            ReasonCause::Rebalance => "rebalance",
            ReasonCause::Maintenance => "maintenance",
            ReasonCause::Lifecycle => "lifecycle",
            ReasonCause::Upgrade => "upgrade",
            ReasonCause::Operator => "operator",
            ReasonCause::Script => "script",
        }
    }

    /// The cause named by `word` (exact, lower case).
    pub fn from_word(word: &str) -> Option<ReasonCause> {
        ReasonCause::ALL.into_iter().find(|c| c.as_str() == word)
    }

    /// The cause of a spot interruption notice's action (`terminate` → spot).
    pub fn of_spot_action(action: &str) -> ReasonCause {
        match action {
            "stop" => ReasonCause::Stop,
            "hibernate" => ReasonCause::Hibernate,
            _ => ReasonCause::Spot,
        }
    }

    /// Whether the cause ends with the incarnation that saw it: a replacement instance, or
    /// the same instance started again, lifts such a drain (the notice, event or image it
    /// was about is gone with the old run). Health and mount drains are lifted by their
    /// own checks; an operator's or a script's drain only by `resume`.
    pub fn ends_with_incarnation(self) -> bool {
        matches!(
            self,
            ReasonCause::Spot
                | ReasonCause::Stop
                | ReasonCause::Hibernate
                | ReasonCause::Rebalance
                | ReasonCause::Maintenance
                | ReasonCause::Lifecycle
                | ReasonCause::Upgrade
        )
    }
}

impl fmt::Display for ReasonCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether `id` may stand in a reason: `unknown`, or an EC2 instance id (`i-` and 8 or 17
/// lower-case hex digits; anything from 8 to 17 is accepted).
pub fn is_valid_instance_id(id: &str) -> bool {
    id == UNKNOWN_INSTANCE
        || id.strip_prefix("i-").is_some_and(|h| {
            (8..=17).contains(&h.len())
                && h.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
}

/// A reason the agent wrote: `slurm-node-agent/<cause>@<instance-id>: <detail>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentReason {
    /// Why.
    pub cause: ReasonCause,
    /// The incarnation that wrote it (`unknown` when not known).
    pub instance_id: String,
    /// Free text for people (`sinfo -R`); never parsed.
    pub detail: String,
}

impl AgentReason {
    /// A reason; an instance id that is not valid ([`is_valid_instance_id`]) becomes
    /// `unknown`, control characters in `detail` become spaces.
    pub fn new(cause: ReasonCause, instance_id: &str, detail: &str) -> AgentReason {
        let instance_id = if is_valid_instance_id(instance_id) {
            instance_id.to_string()
        } else {
            UNKNOWN_INSTANCE.to_string()
        };
        let mut detail: String = detail
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        // ` : ` is where slurmctld appends its own reasons (below): never in ours.
        while detail.contains(" : ") {
            detail = detail.replace(" : ", ": ");
        }
        AgentReason {
            cause,
            instance_id,
            detail: detail.trim().to_string(),
        }
    }

    /// The reason as written to Slurm: at most [`REASON_MAX`] characters (the detail is
    /// cut), never empty after the `: `.
    pub fn to_reason(&self) -> String {
        let head = reason_head(self.cause, &self.instance_id);
        let detail = if self.detail.is_empty() {
            "-"
        } else {
            &self.detail
        };
        let room = REASON_MAX.saturating_sub(head.chars().count());
        let mut r = head;
        r.extend(detail.chars().take(room));
        r
    }

    /// Parses a reason as Slurm shows it (with or without its ` [user@time]` suffix already
    /// removed). `None` unless it is exactly the agent's form with a known cause and a valid
    /// instance id: such a reason is an admin's.
    ///
    /// slurmctld 23.02 and later append their own reasons to the one a node has, each after
    /// ` : ` (`set_node_reason`: `<reason> : reboot issued`, ` : reboot complete`,
    /// ` : Not responding`); the detail ends before the first of them
    /// ([`slurm_appended`] gives them), as the agent never writes ` : ` itself.
    pub fn parse(reason: &str) -> Option<AgentReason> {
        let rest = reason.strip_prefix(REASON_PREFIX)?;
        let (head, detail) = rest.split_once(": ")?;
        let detail = detail.split_once(" : ").map_or(detail, |(d, _)| d);
        let (cause, id) = head.split_once('@')?;
        let cause = ReasonCause::from_word(cause)?;
        if !is_valid_instance_id(id) {
            return None;
        }
        Some(AgentReason {
            cause,
            instance_id: id.to_string(),
            detail: detail.to_string(),
        })
    }

    /// Whether the instance `instance_id` wrote it (an `unknown` writer matches nobody).
    pub fn written_by(&self, instance_id: &str) -> bool {
        self.instance_id != UNKNOWN_INSTANCE && self.instance_id == instance_id
    }
}

impl fmt::Display for AgentReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_reason())
    }
}

/// Which instance slurmctld's record of this NodeName names, against this instance: the one
/// home for "is this record mine or my predecessor's".
///
/// Where Slurm keeps it (23.11+: `InstanceId`, [`NodeInfo::instance`]), the record names the
/// instance whose slurmd registered it last. Read before this instance's slurmd registers
/// (bootstrap's look at the record, made anyway before slurmd starts), it tells a
/// replacement (same NodeName, new instance id) from Slurm's own record, which a new root
/// volume does not lose; once this instance's slurmd has registered it names this instance.
/// Where Slurm keeps none (older releases, a slurmd started without `--instance-id`, a
/// powered-down node, no record, a look that failed) it is [`RecordHolder::Unknown`], and
/// the decisions fall back to the instance id in the agent's reasons and the local files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordHolder {
    /// The record names this instance: it registered the NodeName before (an earlier run
    /// of bootstrap, an earlier boot of the same instance).
    This,
    /// The record names another instance: a predecessor with the same NodeName, which
    /// this instance replaces.
    Predecessor(String),
    /// Slurm does not say.
    Unknown,
}

impl RecordHolder {
    /// The holder of `record` (`None`: slurmctld has no record, or the look failed) seen by
    /// instance `instance_id` (`unknown` when not known: then nothing can be told).
    pub fn of(record: Option<&NodeInfo>, instance_id: &str) -> RecordHolder {
        if instance_id == UNKNOWN_INSTANCE || !is_valid_instance_id(instance_id) {
            return RecordHolder::Unknown;
        }
        match record.and_then(|n| n.instance().id) {
            Some(id) if id == instance_id => RecordHolder::This,
            Some(id) => RecordHolder::Predecessor(id.to_string()),
            None => RecordHolder::Unknown,
        }
    }

    /// The instance this one replaces, when the record names another.
    pub fn replaced(&self) -> Option<&str> {
        match self {
            RecordHolder::Predecessor(id) => Some(id),
            RecordHolder::This | RecordHolder::Unknown => None,
        }
    }

    /// Whether the record names this instance: `None` when Slurm does not say.
    pub fn is_this(&self) -> Option<bool> {
        match self {
            RecordHolder::This => Some(true),
            RecordHolder::Predecessor(_) => Some(false),
            RecordHolder::Unknown => None,
        }
    }

    /// Whose is something of the agent's found with this record, written by `writer` (the
    /// instance id in the agent's reason, or in a state file; `unknown` when not known), as
    /// seen by instance `instance_id`:
    ///
    /// - a writer known to be another instance: that instance's, whatever the record says
    ///   (a predecessor's reason may stay on the record after this instance registered);
    /// - otherwise, on a record that names a predecessor, the predecessor's: the record
    ///   wins over a writer `unknown`, and over a reason or file that names this instance
    ///   while Slurm says another instance registered the NodeName since;
    /// - on a record that names this instance, this instance's;
    /// - where Slurm does not say, this instance's when the writer is this instance, else
    ///   [`Incarnation::Unknown`].
    pub fn incarnation_of(&self, writer: &str, instance_id: &str) -> Incarnation {
        let writer = (writer != UNKNOWN_INSTANCE && is_valid_instance_id(writer)).then_some(writer);
        match (self, writer) {
            (_, Some(w)) if w != instance_id => Incarnation::Other(w.to_string()),
            (RecordHolder::Predecessor(p), _) => Incarnation::Other(p.clone()),
            (RecordHolder::This, _) | (RecordHolder::Unknown, Some(_)) => Incarnation::This,
            (RecordHolder::Unknown, None) => Incarnation::Unknown,
        }
    }
}

/// Which incarnation a drain, or a state file, of the agent's belongs to
/// ([`RecordHolder::incarnation_of`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incarnation {
    /// This instance.
    This,
    /// Another instance (a predecessor with the same NodeName), named.
    Other(String),
    /// Neither the writer nor Slurm's record says.
    Unknown,
}

/// `slurm-node-agent/<cause>@<instance-id>: `: what precedes the detail (an invalid
/// instance id becomes `unknown`).
pub fn reason_head(cause: ReasonCause, instance_id: &str) -> String {
    let id = if is_valid_instance_id(instance_id) {
        instance_id
    } else {
        UNKNOWN_INSTANCE
    };
    format!("{REASON_PREFIX}{cause}@{id}: ")
}

/// The reasons slurmctld appended to an agent's reason (23.02+: each after ` : `, e.g.
/// `["reboot issued"]`); empty for a reason that is not the agent's or has none.
pub fn slurm_appended(reason: &str) -> Vec<&str> {
    if AgentReason::parse(reason).is_none() {
        return Vec::new();
    }
    reason.split(" : ").skip(1).collect()
}

/// `slurm-node-agent/<cause>@<instance-id>: <detail>` (see [`AgentReason`]).
pub fn reason(cause: ReasonCause, instance_id: &str, detail: &str) -> String {
    AgentReason::new(cause, instance_id, detail).to_reason()
}

/// The agent's reason in `reason`, if it is one.
pub fn parse_reason(reason: &str) -> Option<AgentReason> {
    AgentReason::parse(reason)
}

/// Whether `reason` is the agent's (any cause, any incarnation).
pub fn is_agent_reason(reason: &str) -> bool {
    AgentReason::parse(reason).is_some()
}

/// Whether `reason` is the agent's for `cause`.
pub fn is_agent_reason_for(reason: &str, cause: ReasonCause) -> bool {
    AgentReason::parse(reason).is_some_and(|r| r.cause == cause)
}

/// Name of the record bootstrap writes under `agent.state_dir` when it succeeds.
pub const STATE_FILE: &str = "bootstrap.json";

/// What bootstrap recorded about the node it registered (`<state_dir>/bootstrap.json`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Recorded {
    /// Slurm NodeName.
    pub node_name: String,
    /// EC2 instance id of the incarnation that registered.
    pub instance_id: String,
    /// AMI the instance runs.
    pub ami_id: String,
    /// `--conf` line of a dynamic node.
    pub dynamic_conf: Option<String>,
    /// The instance tags that set agent settings (`slurm-node-agent:<key>`), as bootstrap
    /// read them, so that later commands resolve the same settings without IMDS.
    #[serde(default)]
    pub setting_tags: BTreeMap<String, String>,
    /// The user data's settings parts (TOML, each with its position), as bootstrap read
    /// them.
    #[serde(default)]
    pub user_data_settings: Vec<SettingsPart>,
}

impl Recorded {
    /// Reads `<state_dir>/bootstrap.json`; `None` when it is missing or unreadable.
    ///
    /// A record that cannot be parsed (empty, truncated) is moved aside as
    /// `bootstrap.json.corrupt-<unix seconds>` with an error in the log, and is `None`: the
    /// caller resolves the node as if bootstrap had left nothing.
    pub fn read(state_dir: &Path) -> Option<Recorded> {
        let path = state_dir.join(STATE_FILE);
        let text = std::fs::read(&path).ok()?;
        match serde_json::from_slice(&text) {
            Ok(r) => Some(r),
            Err(e) => {
                crate::fsutil::set_aside_corrupt(
                    &path,
                    &text,
                    &format!("invalid bootstrap record: {e}"),
                );
                None
            }
        }
    }

    /// Writes it atomically.
    ///
    /// # Errors
    /// A message naming the file.
    pub fn write(&self, state_dir: &Path) -> Result<(), String> {
        std::fs::create_dir_all(state_dir).map_err(|e| format!("{}: {e}", state_dir.display()))?;
        let json = serde_json::to_vec_pretty(self).map_err(|e| e.to_string())?;
        let path = state_dir.join(STATE_FILE);
        crate::fsutil::write_atomic(&path, &json, 0o644, None)
            .map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// The settings layers that instance metadata contributes: the user data's settings part,
/// then the `slurm-node-agent:` tags.
///
/// # Errors
/// [`SettingsError`] naming the user data or the tag.
pub fn metadata_layers(
    user_data_settings: &[SettingsPart],
    tags: &BTreeMap<String, String>,
    enforce: settings::Enforce,
) -> Result<Vec<Layer>, SettingsError> {
    // Each part its own layer: later parts override earlier ones, and an error names its
    // part and a line of that part.
    let mut layers = Vec::new();
    for part in user_data_settings {
        layers.push(Layer::from_toml(Source::UserData(part.index), &part.text)?);
    }
    for (k, v) in tags {
        match Layer::from_tags([(k.as_str(), v.as_str())]) {
            Ok(l) => layers.extend(l),
            // A tag anyone with ec2:CreateTags can write must not lock operators out.
            Err(e) if enforce == settings::Enforce::WarnAndIgnore => {
                tracing::warn!("{e}; ignored");
            }
            Err(e) => return Err(e),
        }
    }
    Ok(layers)
}

/// The settings parts of the instance's user data, in document order.
///
/// # Errors
/// [`SettingsError`] naming the user data part.
pub fn user_data_settings(id: &InstanceIdentity) -> Result<Vec<SettingsPart>, SettingsError> {
    let Some(ud) = &id.user_data else {
        return Ok(Vec::new());
    };
    crate::userdata::settings_parts(ud).map_err(|e| SettingsError::Parse {
        origin: Source::UserData(e.part()),
        message: e.detail(),
    })
}

/// The tags that set agent settings.
pub fn setting_tags(id: &InstanceIdentity) -> BTreeMap<String, String> {
    id.tags
        .iter()
        .filter(|(k, _)| k.starts_with(settings::TAG_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Resolves the settings as bootstrap does: files, then (with `id`) the user data part and
/// the tags, then the flags, in precedence order.
///
/// # Errors
/// [`SettingsError`].
pub fn resolve_settings(
    file_layers: &[Layer],
    id: Option<&InstanceIdentity>,
    flag_layers: &[Layer],
    enforce: settings::Enforce,
) -> Result<Resolved, SettingsError> {
    let mut layers: Vec<Layer> = file_layers.to_vec();
    if let Some(id) = id {
        let ud = user_data_settings(id)?;
        layers.extend(metadata_layers(&ud, &setting_tags(id), enforce)?);
    }
    layers.extend(flag_layers.iter().cloned());
    Resolved::merge_with(&layers, enforce)
}

/// The one NodeName rule: `node.name` when set, else `node.name_template` expanded over
/// the instance facts. The result is checked against Slurm's NodeName characters.
///
/// # Errors
/// `(dotted key, message)`.
pub fn node_name(
    node: &settings::Node,
    facts: &InstanceIdentity,
) -> Result<String, (&'static str, String)> {
    if node.name.is_empty() {
        crate::nodedef::expand_template(&node.name_template, facts)
            .map_err(|m| ("node.name_template", m))
    } else {
        crate::nodedef::validate_node_name(&node.name).map_err(|m| ("node.name", m))?;
        Ok(node.name.clone())
    }
}

/// Where the NodeName came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NameSource {
    /// `--node-name` or `--set node.name=...`.
    Flag,
    /// `SLURMD_NODENAME` (set by slurmd for its HealthCheckProgram).
    SlurmdEnv,
    /// Bootstrap's record.
    Recorded,
    /// The settings (`node.name` or the template) over instance metadata.
    Settings,
}

/// Who this node is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeIdentity {
    /// Slurm NodeName.
    pub node_name: String,
    /// EC2 instance id of this incarnation (`unknown` when not known).
    pub instance_id: String,
    /// AMI id (empty when not known).
    pub ami_id: String,
    /// Where the NodeName came from.
    pub source: NameSource,
    /// Whether bootstrap's record exists and was written by this incarnation.
    pub recorded: bool,
}

impl NodeIdentity {
    /// The reason this incarnation writes for `cause`.
    pub fn reason(&self, cause: ReasonCause, detail: &str) -> String {
        reason(cause, &self.instance_id, detail)
    }
}

/// Could not tell who the node is.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// Settings invalid (exit 78).
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// No record and instance metadata unavailable, and nothing else names the node
    /// (exit 69).
    #[error(
        "the node name is unknown: no bootstrap record ({record}), and instance metadata: {source}"
    )]
    Imds {
        /// The record's path.
        record: String,
        /// Why IMDS failed.
        #[source]
        source: ImdsError,
    },
    /// No way to know the node name (exit 78).
    #[error("the node name is unknown: pass --node-name, set node.name, or run bootstrap first (it writes {0})")]
    NoName(String),
    /// `SLURMD_NODENAME` is not a node name (exit 78).
    #[error("environment variable SLURMD_NODENAME={0:?} is not a Slurm NodeName (letters, digits, '-', '_' and '.' only)")]
    BadEnvName(String),
}

impl IdentityError {
    /// sysexits(3) code.
    pub fn exit_code(&self) -> u8 {
        match self {
            IdentityError::Settings(_)
            | IdentityError::NoName(_)
            | IdentityError::BadEnvName(_) => 78,
            IdentityError::Imds { .. } => 69,
        }
    }
}

/// How [`resolve`] may learn what it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// Bootstrap's record, else IMDS (the operator commands and `run`).
    RecordThenImds,
    /// Never IMDS: `SLURMD_NODENAME`, flags, the record, `node.name` (`check`, which Slurm
    /// runs often and must answer at once).
    Local,
}

/// Inputs of [`resolve`].
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// Settings files.
    pub paths: &'a settings::Paths,
    /// Flag layers (highest precedence).
    pub flag_layers: &'a [Layer],
    /// Where to look.
    pub lookup: Lookup,
    /// Instance metadata already read (the daemon reads it anyway); skips the IMDS call.
    pub facts: Option<&'a InstanceIdentity>,
    /// Limit on the IMDS lookup when there is no record.
    pub imds_timeout: Duration,
}

/// The settings and identity every command but bootstrap uses (bootstrap resolves the same
/// way from IMDS and then writes the record this reads).
///
/// Order: a NodeName from the flags wins; for [`Lookup::Local`] then `SLURMD_NODENAME`.
/// Then bootstrap's record: its NodeName, instance id, and the settings from its recorded
/// tags and user data part. Without a record the settings and NodeName are resolved over
/// instance metadata exactly as bootstrap does ([`Lookup::RecordThenImds`]), or from the
/// files and flags (`node.name`) for [`Lookup::Local`].
///
/// # Errors
/// [`IdentityError`].
pub async fn resolve(req: &Request<'_>) -> Result<(Resolved, NodeIdentity), IdentityError> {
    let prep = prepare(req)?;
    let facts_owned;
    let facts: Option<&InstanceIdentity> = match (req.facts, &prep.record, req.lookup) {
        (Some(f), _, _) => Some(f),
        (None, None, Lookup::RecordThenImds) => {
            let imds = Imds::new(&prep.early.settings.imds);
            let named = prep.flag_name.is_some() || !prep.early.settings.node.name.is_empty();
            match tokio::time::timeout(req.imds_timeout, imds.identity()).await {
                Ok(Ok(f)) => {
                    facts_owned = f;
                    Some(&facts_owned)
                }
                Ok(Err(e)) if !named => {
                    return Err(IdentityError::Imds {
                        record: prep.record_path,
                        source: e,
                    })
                }
                Ok(Err(e)) => {
                    tracing::warn!("instance metadata: {e}; using the files and flags only");
                    None
                }
                Err(_) if !named => {
                    return Err(IdentityError::Imds {
                        record: prep.record_path,
                        source: ImdsError::Unreachable {
                            path: "/latest/meta-data/".into(),
                            message: format!("no answer within {:?}", req.imds_timeout),
                        },
                    })
                }
                Err(_) => None,
            }
        }
        _ => None,
    };
    finish(req, prep, facts)
}

/// [`resolve`] for [`Lookup::Local`] without instance metadata already read: the same
/// result, without an await and without referring to the IMDS client at all, so that a
/// program that only runs `check` (`slurm-node-agent-healthcheck`) does not link it.
///
/// # Errors
/// [`IdentityError`] (never [`IdentityError::Imds`]).
pub fn resolve_local(
    paths: &settings::Paths,
    flag_layers: &[Layer],
) -> Result<(Resolved, NodeIdentity), IdentityError> {
    let req = Request {
        paths,
        flag_layers,
        lookup: Lookup::Local,
        facts: None,
        imds_timeout: Duration::ZERO,
    };
    let prep = prepare(&req)?;
    finish(&req, prep, None)
}

/// What [`resolve`] reads before it knows whether to ask IMDS.
struct Prepared {
    files: Vec<Layer>,
    early: Resolved,
    flag_name: Option<String>,
    env_name: Option<String>,
    record: Option<Recorded>,
    record_path: String,
}

fn prepare(req: &Request<'_>) -> Result<Prepared, IdentityError> {
    let files = settings::file_layers(req.paths)?;
    let early = resolve_settings(
        &files,
        None,
        req.flag_layers,
        settings::Enforce::WarnAndIgnore,
    )?;
    let state_dir = early.settings.agent.state_dir.clone();
    let flag_name =
        (early.source_of("node.name") == Source::Flag).then(|| early.settings.node.name.clone());
    let env_name = (req.lookup == Lookup::Local)
        .then(|| std::env::var("SLURMD_NODENAME").ok())
        .flatten()
        .filter(|n| !n.is_empty());
    // slurmd sets it to the node's NodeName; anything else (spaces, control characters,
    // shell or scontrol syntax) is refused rather than passed on to scontrol and reports.
    if let Some(n) = &env_name {
        if flag_name.is_none() && !crate::slurm::node::is_plain_node_name(n) {
            return Err(IdentityError::BadEnvName(n.clone()));
        }
    }
    let record = Recorded::read(&state_dir);
    let record_path = state_dir.join(STATE_FILE).display().to_string();
    Ok(Prepared {
        files,
        early,
        flag_name,
        env_name,
        record,
        record_path,
    })
}

fn finish(
    req: &Request<'_>,
    prep: Prepared,
    facts: Option<&InstanceIdentity>,
) -> Result<(Resolved, NodeIdentity), IdentityError> {
    let Prepared {
        files,
        early,
        flag_name,
        env_name,
        record,
        record_path,
    } = prep;
    // The record's metadata layers stand for IMDS when the record is this incarnation's
    // (or when IMDS is not asked).
    let record_current = record.as_ref().is_some_and(|r| {
        facts.is_none_or(|f| f.instance_id == r.instance_id) && !r.node_name.is_empty()
    });
    let resolved = match (facts, &record) {
        (Some(f), _) => resolve_settings(
            &files,
            Some(f),
            req.flag_layers,
            settings::Enforce::WarnAndIgnore,
        )?,
        (None, Some(r)) => {
            let mut layers = files.clone();
            layers.extend(metadata_layers(
                &r.user_data_settings,
                &r.setting_tags,
                settings::Enforce::WarnAndIgnore,
            )?);
            layers.extend(req.flag_layers.iter().cloned());
            Resolved::merge_with(&layers, settings::Enforce::WarnAndIgnore)?
        }
        (None, None) => early,
    };
    let instance_id = facts
        .map(|f| f.instance_id.clone())
        .or_else(|| record.as_ref().map(|r| r.instance_id.clone()))
        .filter(|i| is_valid_instance_id(i))
        .unwrap_or_else(|| UNKNOWN_INSTANCE.to_string());
    let ami_id = facts
        .map(|f| f.ami_id.clone())
        .or_else(|| record.as_ref().map(|r| r.ami_id.clone()))
        .unwrap_or_default();
    let (node_name, source) = if let Some(n) = flag_name {
        (n, NameSource::Flag)
    } else if let Some(n) = env_name {
        (n, NameSource::SlurmdEnv)
    } else if let (true, Some(r)) = (record_current, &record) {
        (r.node_name.clone(), NameSource::Recorded)
    } else if let Some(f) = facts {
        let n =
            node_name(&resolved.settings.node, f).map_err(|(key, message)| SettingsError::Key {
                origin: resolved.source_of(key),
                key: key.to_string(),
                message,
            })?;
        (n, NameSource::Settings)
    } else if !resolved.settings.node.name.is_empty() {
        (resolved.settings.node.name.clone(), NameSource::Settings)
    } else {
        return Err(IdentityError::NoName(record_path));
    };
    let id = NodeIdentity {
        node_name,
        instance_id,
        ami_id,
        source,
        recorded: record_current,
    };
    Ok((resolved, id))
}

/// The record path under a state folder.
pub fn record_path(state_dir: &Path) -> PathBuf {
    state_dir.join(STATE_FILE)
}

#[cfg(test)]
mod tests {

    #![allow(clippy::unwrap_used)]
    use super::*;
    #[test]
    fn slurm_appended_reasons_are_not_part_of_ours() {
        // slurmctld 23.02+ appends " : <its words>"; ours never holds " : " itself.
        let r = super::reason(ReasonCause::Upgrade, "i-0123456789abcdef0", "a : b  :  c");
        assert!(!r.contains(" : "), "{r}");
        let seen = format!("{r} : reboot issued : reboot complete");
        let p = AgentReason::parse(&seen).unwrap();
        assert_eq!(p.cause, ReasonCause::Upgrade);
        assert_eq!(p.to_reason(), r);
        assert_eq!(
            super::slurm_appended(&seen),
            ["reboot issued", "reboot complete"]
        );
        assert!(super::slurm_appended("kernel_update : reboot issued").is_empty());
    }

    const ID: &str = "i-0123456789abcdef0";

    /// The 25.11 capture (`slurmd --instance-id i-0123456789abcdef0`) and its state.
    fn captured(state: &str) -> NodeInfo {
        let path = format!(
            "{}/tests/fixtures/slurm-25.11/scontrol-show-node-{state}.txt",
            env!("CARGO_MANIFEST_DIR")
        );
        NodeInfo::parse(&std::fs::read_to_string(&path).unwrap())
    }

    #[test]
    fn the_record_says_whose_it_is_where_slurm_keeps_an_instance_id() {
        const OTHER: &str = "i-0fedcba9876543210";
        const THIRD: &str = "i-0aaaaaaaaaaaaaaaa";
        let drained = captured("drained");
        // Seen by the instance it names, by a replacement, by an instance that does not
        // know its id; no record; a 22.05-style record without the field.
        assert_eq!(RecordHolder::of(Some(&drained), ID), RecordHolder::This);
        let replaced = RecordHolder::of(Some(&drained), OTHER);
        assert_eq!(replaced, RecordHolder::Predecessor(ID.into()));
        assert_eq!(replaced.replaced(), Some(ID));
        assert_eq!(replaced.is_this(), Some(false));
        assert_eq!(
            RecordHolder::of(Some(&drained), UNKNOWN_INSTANCE),
            RecordHolder::Unknown
        );
        assert_eq!(RecordHolder::of(None, ID), RecordHolder::Unknown);
        let without = NodeInfo::parse(
            &std::fs::read_to_string(format!(
                "{}/tests/fixtures/slurm-22.05/scontrol-show-node-drained.txt",
                env!("CARGO_MANIFEST_DIR")
            ))
            .unwrap(),
        );
        assert_eq!(RecordHolder::of(Some(&without), ID), RecordHolder::Unknown);
        assert_eq!(RecordHolder::Unknown.is_this(), None);

        // The captured reason was written by the instance the record names.
        let r = parse_reason(drained.held_reason().unwrap()).unwrap();
        let this = RecordHolder::This;
        assert_eq!(this.incarnation_of(&r.instance_id, ID), Incarnation::This);
        assert_eq!(
            replaced.incarnation_of(&r.instance_id, OTHER),
            Incarnation::Other(ID.into())
        );
        // A writer `unknown`: the record says whose it is; without it nobody can.
        for (holder, want) in [
            (&this, Incarnation::This),
            (&replaced, Incarnation::Other(ID.into())),
            (&RecordHolder::Unknown, Incarnation::Unknown),
        ] {
            assert_eq!(
                holder.incarnation_of(UNKNOWN_INSTANCE, OTHER),
                want,
                "{holder:?}"
            );
        }
        // A reason naming this instance on a record Slurm says another instance registered
        // since: the record wins. Where Slurm does not say, the reason's id decides.
        assert_eq!(
            replaced.incarnation_of(OTHER, OTHER),
            Incarnation::Other(ID.into())
        );
        assert_eq!(
            RecordHolder::Unknown.incarnation_of(OTHER, OTHER),
            Incarnation::This
        );
        // A third instance's reason stays that instance's, whoever holds the record.
        for holder in [&this, &replaced, &RecordHolder::Unknown] {
            assert_eq!(
                holder.incarnation_of(THIRD, OTHER),
                Incarnation::Other(THIRD.into()),
                "{holder:?}"
            );
        }
    }

    #[test]
    fn build_and_parse_round_trip() {
        for cause in ReasonCause::ALL {
            let r = reason(cause, ID, "some detail: with colon");
            assert_eq!(
                r,
                format!("slurm-node-agent/{cause}@{ID}: some detail: with colon")
            );
            let p = parse_reason(&r).unwrap();
            assert_eq!(
                (p.cause, p.instance_id.as_str(), p.detail.as_str()),
                (cause, ID, "some detail: with colon")
            );
            assert!(p.written_by(ID));
            assert!(!p.written_by("i-0fffffffffffffff0"));
        }
    }

    #[test]
    fn unknown_and_invalid_instance_ids() {
        let r = reason(ReasonCause::Health, "", "disk");
        assert_eq!(r, "slurm-node-agent/health@unknown: disk");
        let p = parse_reason(&r).unwrap();
        assert!(!p.written_by("unknown"));
        assert_eq!(
            reason(ReasonCause::Spot, "i-XYZ; rm -rf", "x"),
            "slurm-node-agent/spot@unknown: x"
        );
        assert!(is_valid_instance_id("i-12345678"));
        assert!(!is_valid_instance_id("i-1234567"));
        assert!(!is_valid_instance_id("i-0123456789abcdef01"));
    }

    #[test]
    fn admin_look_alikes_are_not_ours() {
        for admin in [
            "slurm-node-agent: foo",
            "slurm-node-agent/health: disk",
            "slurm-node-agent/health@: disk",
            "slurm-node-agent/reboot@i-0123456789abcdef0: x",
            "slurm-node-agent/Health@i-0123456789abcdef0: x",
            "slurm-node-agent/health@i-0123456789abcdef0 x",
            "slurm-node-agent/health@i-0123456789ABCDEF0: x",
            " slurm-node-agent/health@i-0123456789abcdef0: x",
            "node-agent/spot: spot interruption notice",
            "ADMIN SHUTDOWN",
            "Kill task failed",
            "",
        ] {
            assert!(!is_agent_reason(admin), "{admin:?} taken as the agent's");
        }
        assert!(is_agent_reason_for(
            "slurm-node-agent/mount@unknown: /fsx gone",
            ReasonCause::Mount
        ));
        assert!(!is_agent_reason_for(
            "slurm-node-agent/mount@unknown: /fsx gone",
            ReasonCause::Health
        ));
    }

    #[test]
    fn reasons_are_bounded_and_clean() {
        let r = reason(ReasonCause::Operator, ID, &"a\nb\t".repeat(300));
        assert_eq!(r.chars().count(), REASON_MAX);
        assert!(crate::slurm::node::validate_reason(&r).is_ok());
        assert!(parse_reason(&r).is_some());
        assert_eq!(
            reason(ReasonCause::Script, ID, "  "),
            format!("slurm-node-agent/script@{ID}: -")
        );
    }

    #[test]
    fn spot_actions_and_incarnation_causes() {
        assert_eq!(ReasonCause::of_spot_action("terminate"), ReasonCause::Spot);
        assert_eq!(ReasonCause::of_spot_action("stop"), ReasonCause::Stop);
        assert_eq!(
            ReasonCause::of_spot_action("hibernate"),
            ReasonCause::Hibernate
        );
        assert!(ReasonCause::Maintenance.ends_with_incarnation());
        assert!(!ReasonCause::Health.ends_with_incarnation());
        assert!(!ReasonCause::Operator.ends_with_incarnation());
        for c in ReasonCause::ALL {
            assert_eq!(ReasonCause::from_word(c.as_str()), Some(c));
        }
    }

    #[test]
    fn a_tag_that_is_not_a_setting_value_is_left_out_for_operators_only() {
        let tags: BTreeMap<String, String> = [
            (
                "slurm-node-agent:node.weight".to_string(),
                "heavy".to_string(),
            ),
            (
                "slurm-node-agent:node.features".to_string(),
                "gpu".to_string(),
            ),
        ]
        .into();
        let e = metadata_layers(&[], &tags, settings::Enforce::Refuse).unwrap_err();
        assert!(
            e.to_string().contains("slurm-node-agent:node.weight"),
            "{e}"
        );
        let layers = metadata_layers(&[], &tags, settings::Enforce::WarnAndIgnore).unwrap();
        assert_eq!(layers.len(), 1);
        assert_eq!(
            layers[0].source,
            Source::Tag("slurm-node-agent:node.features".into())
        );
    }

    #[test]
    fn record_keeps_metadata_layers() {
        let dir = std::env::temp_dir().join(format!("sna-identity-{}", std::process::id()));
        let mut tags = BTreeMap::new();
        tags.insert("slurm-node-agent:node.weight".to_string(), "7".to_string());
        let rec = Recorded {
            node_name: "n1".into(),
            instance_id: ID.into(),
            ami_id: "ami-1".into(),
            dynamic_conf: None,
            setting_tags: tags,
            user_data_settings: vec![SettingsPart {
                index: 1,
                text: "[node]\nfeatures = [\"ud\"]\n".into(),
            }],
        };
        rec.write(&dir).unwrap();
        let back = Recorded::read(&dir).unwrap();
        assert_eq!(back, rec);
        let layers = metadata_layers(
            &back.user_data_settings,
            &back.setting_tags,
            settings::Enforce::Refuse,
        )
        .unwrap();
        let r = Resolved::merge(&layers).unwrap();
        assert_eq!(r.settings.node.weight, 7);
        assert_eq!(r.settings.node.features, vec!["ud".to_string()]);
        // An old record (no metadata fields) still reads.
        std::fs::write(
            dir.join(STATE_FILE),
            r#"{"node_name":"n1","instance_id":"i-12345678","ami_id":"a","dynamic_conf":null}"#,
        )
        .unwrap();
        assert!(Recorded::read(&dir).unwrap().setting_tags.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
