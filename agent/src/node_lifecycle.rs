//! Node lifecycle actions (issue 13): a site's own scripts, run by bootstrap at two stages:
//! `nodeBootstrapped` (after registration, key and mounts, before slurmd starts) and
//! `nodeReady` (after the node is available in slurmctld).
//!
//! Two sources, run in this order within each stage:
//! 1. the managed service's `nodeLifecycleActions` (PCS's registration answer, shape in
//!    [`crate::pcs::actions`]), with the facts in `PCS_*` variables;
//! 2. the image's `[node_lifecycle]` settings ([`NodeLifecycleSettings`]), in both join modes.
//!
//! Every script gets `SLURM_NODE_AGENT_*` variables ([`Facts::environment`]).
//!
//! Each script is
//! - fetched from `scriptLocation`: `s3://bucket/key` (with `s3VersionId` when given; as the
//!   service sends), or this agent's `ssm:<parameter name>` and `file:<absolute path>`;
//!   through S3 `GetObject` (`aws-sdk-s3`) or SSM `GetParameter` (`aws-sdk-ssm`) with the
//!   SDK's default credentials chain (the instance profile) in the instance's region (a
//!   failed download names the location and S3's error code, e.g. `NoSuchKey`,
//!   `NoSuchVersion`, `AccessDenied`). A download is tried [`FETCH_ATTEMPTS`] times with
//!   backoff; at most [`MAX_SCRIPT_BYTES`];
//! - compared with its SHA-256 `checksum` (64 hex digits) before anything runs: a mismatch
//!   never runs it, and counts as the script failing;
//! - cached under `<agent.state_dir>/lifecycle/cache/` per `scriptCachingPolicy`:
//!   `CACHE_ONCE` keeps the first copy (fetched again only if it no longer matches the
//!   checksum), `REFRESH_ON_REBOOT` fetches once per boot;
//! - run as root, executed directly (no shell around it: it needs its own `#!` line), with
//!   its `arguments` as separate words, stdin from `/dev/null`, stdout and stderr in its own
//!   log file `<agent.state_dir>/lifecycle/logs/<stage>-<n>-<name>.log` (the last run's
//!   output; `n` is its position in the stage, from 1). Scripts are never retried.
//!
//! `executionPolicy`: `FIRST_BOOT_ONLY` runs only in the instance's first boot (the first
//! boot in which bootstrap ran on this instance id), `EVERY_BOOT` in every boot. A script that
//! succeeded is not run again in the same boot (bootstrap may run again; it converges).
//! `onError` on failure (exit status not 0, no `#!`, download or checksum failure):
//! `CONTINUE` goes on; `STOP_SEQUENCE` skips the rest of the stage, bootstrap goes on;
//! `TERMINATE` stops bootstrap and shuts the instance down in order (see
//! [`terminate_reason`] and `bootstrap`).
//!
//! What ran is kept in `<agent.state_dir>/lifecycle/state.json` ([`RunRecord`]).
//!
//! Floor 5 (subsystems): above `pcs`, whose registration answer carries the service's
//! scripts, and `node_state`, through which a `TERMINATE` drains the node.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::location::Location;
use crate::pcs::actions::{NodeLifecycleActions, Script, ScriptSource, Stages};
use crate::retry::Backoff;
use crate::section::InvalidKey;

/// Largest script accepted: 2 MiB (the service's limit).
pub const MAX_SCRIPT_BYTES: u64 = 2 * 1024 * 1024;
/// Most scripts in one stage (the service's limit, per source here).
pub const MAX_SCRIPTS: usize = 20;
/// Most arguments of one script.
pub const MAX_ARGUMENTS: usize = 20;
/// Most characters of one argument.
pub const MAX_ARGUMENT_CHARS: usize = 256;
/// Download attempts per script (scripts themselves are never retried).
pub const FETCH_ATTEMPTS: u32 = 3;
/// Backoff between download attempts.
pub const FETCH_BACKOFF: Backoff = Backoff {
    base: Duration::from_millis(500),
    cap: Duration::from_secs(4),
};
/// Folder under `agent.state_dir`.
pub const DIR: &str = "lifecycle";
/// The run record under `agent.state_dir`.
pub const STATE_FILE: &str = "lifecycle/state.json";

/// A stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Stage {
    /// After registration (key, mounts), before slurmd starts.
    #[serde(rename = "nodeBootstrapped")]
    NodeBootstrapped,
    /// After the node is available in slurmctld.
    #[serde(rename = "nodeReady")]
    NodeReady,
}

impl Stage {
    /// The API's name: `nodeBootstrapped`, `nodeReady`.
    pub fn name(self) -> &'static str {
        match self {
            Stage::NodeBootstrapped => "nodeBootstrapped",
            Stage::NodeReady => "nodeReady",
        }
    }

    fn of(self, stages: &Stages) -> &[Script] {
        match self {
            Stage::NodeBootstrapped => &stages.node_bootstrapped,
            Stage::NodeReady => &stages.node_ready,
        }
    }
}

/// Where a script list comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// The managed service's `nodeLifecycleActions`.
    Service,
    /// The image's `[node_lifecycle]` settings.
    Settings,
}

/// `[[node_lifecycle.node_bootstrapped]]`, `[[node_lifecycle.node_ready]]`: one script, in
/// the service's terms (snake_case keys, the service's values).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptSettings {
    /// Name: in logs, reasons and its log file's name.
    pub name: String,
    /// `s3://bucket/key`, `ssm:<parameter name>` or `file:<absolute path>`.
    pub script_location: String,
    /// SHA-256 of the script, 64 hex digits; empty: not checked.
    #[serde(default)]
    pub checksum: String,
    /// S3 object version; empty: the latest.
    #[serde(default)]
    pub s3_version_id: String,
    /// Arguments, at most 20 of at most 256 characters.
    #[serde(default)]
    pub arguments: Vec<String>,
    /// `FIRST_BOOT_ONLY` or `EVERY_BOOT`.
    pub execution_policy: String,
    /// `TERMINATE`, `STOP_SEQUENCE` or `CONTINUE`.
    pub on_error: String,
}

/// `[node_lifecycle]`: the image's lifecycle scripts (both join modes) and how a
/// `TERMINATE` shuts the instance down.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeLifecycleSettings {
    /// Unit started (through `systemd.bus`) for the orderly shutdown a failed `TERMINATE`
    /// script asks for: `poweroff.target`.
    pub poweroff_unit: String,
    /// `scriptCachingPolicy` of the scripts below: `CACHE_ONCE` or `REFRESH_ON_REBOOT`.
    pub script_caching_policy: String,
    /// Scripts run before slurmd starts, in order (after the service's).
    pub node_bootstrapped: Vec<ScriptSettings>,
    /// Scripts run once the node is available, in order (after the service's).
    pub node_ready: Vec<ScriptSettings>,
}

impl Default for NodeLifecycleSettings {
    fn default() -> Self {
        NodeLifecycleSettings {
            poweroff_unit: "poweroff.target".into(),
            script_caching_policy: "REFRESH_ON_REBOOT".into(),
            node_bootstrapped: Vec::new(),
            node_ready: Vec::new(),
        }
    }
}

/// Scripts run as root and the unit is a unit: only the image says.
impl crate::section::Classified for NodeLifecycleSettings {
    const SECTION: &'static str = "node_lifecycle";
    const TRUST: &'static [crate::section::KeyTrust] = {
        use crate::section::KeyTrust as K;
        &[
            K::image("poweroff_unit"),
            K::image("script_caching_policy"),
            K::image("node_bootstrapped"),
            K::image("node_ready"),
        ]
    };
}

impl NodeLifecycleSettings {
    /// The scripts as the service's shape.
    pub fn actions(&self) -> NodeLifecycleActions {
        let list = |l: &[ScriptSettings]| -> Vec<Script> {
            l.iter()
                .map(|s| Script {
                    name: s.name.clone(),
                    script_source: ScriptSource {
                        script_location: s.script_location.clone(),
                        checksum: Some(s.checksum.clone()).filter(|c| !c.is_empty()),
                        s3_version_id: Some(s.s3_version_id.clone()).filter(|v| !v.is_empty()),
                    },
                    arguments: s.arguments.clone(),
                    execution_policy: s.execution_policy.clone(),
                    on_error: s.on_error.clone(),
                })
                .collect()
        };
        NodeLifecycleActions {
            script_caching_policy: self.script_caching_policy.clone(),
            stages: Stages {
                node_bootstrapped: list(&self.node_bootstrapped),
                node_ready: list(&self.node_ready),
            },
        }
    }

    /// Checks the unit and the scripts as [`validate`] does.
    ///
    /// # Errors
    /// [`InvalidKey`]: the dotted key and what is wrong.
    pub fn validate(&self) -> Result<(), InvalidKey> {
        if let Err(m) = crate::systemd::validate_unit_name(&self.poweroff_unit) {
            return Err(InvalidKey::new("node_lifecycle.poweroff_unit", m));
        }
        validate(&self.actions()).map_err(|e| InvalidKey {
            key: format!("node_lifecycle.{}", e.key),
            message: e.message,
        })
    }
}

/// What is wrong with a script location, if anything: `s3://<bucket>/<key>` with a bucket
/// name as S3's general purpose bucket naming rules allow (3 to 63 lowercase letters,
/// digits, `.` and `-`, beginning and ending with a letter or digit, no `..`, not an IPv4
/// address; an access point alias such as `name-...-s3alias` passes, as `GetObject` takes
/// one), `ssm:<parameter name>` ([`ssm_name_problem`]) or `file:<absolute path>` without
/// NUL.
pub fn location_problem(loc: &str) -> Option<String> {
    const EXPECTED: &str = "expected s3://bucket/key, ssm:<parameter name> or file:<absolute path>";
    match Location::parse(loc) {
        Some(s3 @ Location::S3(_)) => {
            let Some((bucket, _)) = s3.s3_object() else {
                return Some(format!(
                    "{EXPECTED} (s3://bucket/key with a bucket and a key)"
                ));
            };
            bucket_problem(bucket).map(|m| format!("bucket {bucket:?}: {m}"))
        }
        Some(Location::Ssm(name)) => ssm_name_problem(name),
        Some(Location::File(path)) => {
            if path.contains('\0') {
                return Some("the path contains a NUL character".into());
            }
            if !path.starts_with('/') || path.len() < 2 {
                return Some("the path must be absolute (file:/path/to/script)".into());
            }
            None
        }
        Some(Location::SecretsManager(_)) | None => Some(EXPECTED.into()),
    }
}

/// S3's general purpose bucket naming rules (see [`location_problem`]), or a legacy
/// name: buckets created in us-east-1 before March 2018 may have 3 to 255 characters of
/// letters of either case, digits, `.`, `-` and `_`, and S3 still serves them (a name the
/// service sends must not be refused).
fn bucket_problem(b: &str) -> Option<String> {
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let legacy = (3..=255).contains(&b.len())
        && b.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        && alnum(b.chars().next())
        && alnum(b.chars().last())
        && !b.contains("..")
        && b.parse::<std::net::Ipv4Addr>().is_err();
    strict_bucket_problem(b).filter(|_| !legacy)
}

/// S3's current general purpose bucket naming rules.
fn strict_bucket_problem(b: &str) -> Option<String> {
    const RULE: &str = "S3 bucket names are 3 to 63 characters: lowercase letters, digits, \
                        '.' and '-' (legacy us-east-1 names: up to 255, also capitals and '_')";
    if !(3..=63).contains(&b.chars().count()) {
        return Some(format!("{} characters; {RULE}", b.chars().count()));
    }
    if let Some(c) = b
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '.' || *c == '-'))
    {
        return Some(format!("character {c:?} is not allowed; {RULE}"));
    }
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !alnum(b.chars().next()) || !alnum(b.chars().last()) {
        return Some("S3 bucket names begin and end with a letter or digit".into());
    }
    if b.contains("..") {
        return Some("S3 bucket names have no two adjacent periods".into());
    }
    if b.parse::<std::net::Ipv4Addr>().is_ok() {
        return Some("S3 bucket names are not formatted as an IP address".into());
    }
    None
}

/// What is wrong with an SSM parameter reference for `GetParameter`, if anything: a name of
/// 1 to 1011 characters `a-z A-Z 0-9 _ . -`, where a name with `/` is a hierarchy that
/// begins with `/`, has no empty level and at most 15 levels; or the parameter's ARN
/// (`arn:<partition>:ssm:<region>:<account>:parameter/<name>`); either with an optional
/// `:<version>` or `:<label>` selector (1 to 100 of `a-z A-Z 0-9 _ . -`). Names are as
/// Parameter Store's naming constraints (PutParameter's `Name`) specify.
pub fn ssm_name_problem(reference: &str) -> Option<String> {
    const CHARS: &str = "SSM parameter names are made of a-z A-Z 0-9 _ . - and / between levels";
    let word = |c: char| c.is_ascii_alphanumeric() || "_.-".contains(c);
    if reference.is_empty() {
        return Some("empty SSM parameter name".into());
    }
    let (name, hierarchy_rule) = match reference.strip_prefix("arn:") {
        Some(arn) => {
            let parts: Vec<&str> = arn.splitn(5, ':').collect();
            match parts.as_slice() {
                [_, "ssm", _, _, rest] if rest.starts_with("parameter/") => {
                    (&rest["parameter".len()..], false)
                }
                _ => {
                    return Some(
                        "not an SSM parameter ARN \
                         (arn:<partition>:ssm:<region>:<account>:parameter/<name>)"
                            .into(),
                    )
                }
            }
        }
        None => (reference, true),
    };
    let (name, selector) = match name.split_once(':') {
        Some((n, s)) => (n, Some(s)),
        None => (name, None),
    };
    if let Some(s) = selector {
        if s.is_empty() || s.len() > 100 || !s.chars().all(word) {
            return Some(format!(
                "{s:?} after ':' is not a version or label (1 to 100 of a-z A-Z 0-9 _ . -)"
            ));
        }
    }
    if let Some(c) = name.chars().find(|c| !(word(*c) || *c == '/')) {
        return Some(format!("character {c:?} is not allowed; {CHARS}"));
    }
    if name.is_empty() {
        return Some("empty SSM parameter name".into());
    }
    if name.len() > 1011 {
        return Some(format!(
            "{} characters; SSM parameter names have at most 1011",
            name.len()
        ));
    }
    if name.contains('/') {
        if hierarchy_rule && !name.starts_with('/') {
            return Some("a name with levels must begin with / (e.g. ssm:/site/script)".into());
        }
        let levels: Vec<&str> = name.trim_start_matches('/').split('/').collect();
        if levels.iter().any(|l| l.is_empty()) || name.starts_with("//") {
            return Some("an empty level (\"//\" or a trailing /)".into());
        }
        if levels.len() > 15 {
            return Some(format!(
                "{} levels; SSM parameter hierarchies have at most 15 levels",
                levels.len()
            ));
        }
    }
    None
}

/// Checks what the API allows: a known caching policy; per stage at most 20 scripts; each
/// with a name of 1 to 256 characters, a location this agent knows, a checksum of 64 hex
/// digits when given, at most 20 arguments of at most 256 characters without NUL, and
/// known policies.
///
/// # Errors
/// The key (`script_caching_policy`, `<stage>[<i>].<field>` in snake_case) and a message
/// naming the script.
pub fn validate(a: &NodeLifecycleActions) -> Result<(), InvalidKey> {
    if !matches!(
        a.script_caching_policy.as_str(),
        "CACHE_ONCE" | "REFRESH_ON_REBOOT"
    ) {
        return Err(InvalidKey::new(
            "script_caching_policy",
            format!(
                "{:?} is not CACHE_ONCE or REFRESH_ON_REBOOT",
                a.script_caching_policy
            ),
        ));
    }
    for (stage, key) in [
        (Stage::NodeBootstrapped, "node_bootstrapped"),
        (Stage::NodeReady, "node_ready"),
    ] {
        let list = stage.of(&a.stages);
        if list.len() > MAX_SCRIPTS {
            return Err(InvalidKey::new(
                key,
                format!("{} scripts, at most {MAX_SCRIPTS}", list.len()),
            ));
        }
        for (i, s) in list.iter().enumerate() {
            let e = |field: &str, m: String| {
                Err(InvalidKey::new(
                    format!("{key}[{i}].{field}"),
                    format!("script {:?}: {m}", s.name),
                ))
            };
            if s.name.is_empty() || s.name.chars().count() > 256 {
                return e("name", "must be 1 to 256 characters".into());
            }
            let loc = &s.script_source.script_location;
            if let Some(m) = location_problem(loc) {
                return e("script_location", format!("{loc:?}: {m}"));
            }
            if let Some(c) = &s.script_source.checksum {
                if c.len() != 64 || !c.chars().all(|c| c.is_ascii_hexdigit()) {
                    return e("checksum", "not 64 hex digits (SHA-256)".into());
                }
            }
            if s.arguments.len() > MAX_ARGUMENTS {
                return e(
                    "arguments",
                    format!("{} arguments, at most {MAX_ARGUMENTS}", s.arguments.len()),
                );
            }
            if let Some(a) = s
                .arguments
                .iter()
                .find(|a| a.chars().count() > MAX_ARGUMENT_CHARS || a.contains('\0'))
            {
                return e(
                    "arguments",
                    format!(
                        "an argument of {} characters (at most {MAX_ARGUMENT_CHARS}, no NUL)",
                        a.chars().count()
                    ),
                );
            }
            if !matches!(
                s.execution_policy.as_str(),
                "FIRST_BOOT_ONLY" | "EVERY_BOOT"
            ) {
                return e(
                    "execution_policy",
                    format!(
                        "{:?} is not FIRST_BOOT_ONLY or EVERY_BOOT",
                        s.execution_policy
                    ),
                );
            }
            if !matches!(
                s.on_error.as_str(),
                "TERMINATE" | "STOP_SEQUENCE" | "CONTINUE"
            ) {
                return e(
                    "on_error",
                    format!(
                        "{:?} is not TERMINATE, STOP_SEQUENCE or CONTINUE",
                        s.on_error
                    ),
                );
            }
        }
    }
    Ok(())
}

/// The managed service's facts (`PCS_*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PcsFacts {
    /// `PCS_CLUSTER_ID`: the cluster identifier registered with.
    pub cluster_id: String,
    /// `PCS_CLUSTER_NAME`.
    pub cluster_name: String,
    /// `PCS_COMPUTE_NODE_GROUP_ID`.
    pub group_id: String,
    /// `PCS_COMPUTE_NODE_GROUP_NAME`.
    pub group_name: String,
}

/// The `PCS_*` facts of a registration.
impl From<&crate::pcs::Registration> for PcsFacts {
    fn from(r: &crate::pcs::Registration) -> PcsFacts {
        PcsFacts {
            cluster_id: r.cluster_identifier.clone(),
            cluster_name: r.cluster_name.clone().unwrap_or_default(),
            group_id: r.compute_node_group_id.clone().unwrap_or_default(),
            group_name: r.compute_node_group_name.clone().unwrap_or_default(),
        }
    }
}

/// What scripts learn from their environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    /// Slurm NodeName (`nodeID` in the managed mode).
    pub node_name: String,
    /// EC2 instance id.
    pub instance_id: String,
    /// Whether this is the instance's first boot.
    pub first_boot: bool,
    /// The configless servers slurmd uses (`host:port`), in order.
    pub conf_servers: Vec<String>,
    /// Set in the managed mode.
    pub pcs: Option<PcsFacts>,
}

impl Facts {
    /// The variables a script of `stage` gets (besides the agent's own environment):
    /// always `SLURM_NODE_AGENT_NODE_NAME`, `SLURM_NODE_AGENT_INSTANCE_ID`,
    /// `SLURM_NODE_AGENT_IS_FIRST_BOOT` (`true`/`false`), `SLURM_NODE_AGENT_STAGE`
    /// (`nodeBootstrapped`/`nodeReady`), `SLURM_NODE_AGENT_CONF_SERVERS` (comma-separated
    /// `host:port`); in the managed mode also `PCS_CLUSTER_ID`, `PCS_CLUSTER_NAME`,
    /// `PCS_COMPUTE_NODE_GROUP_ID`, `PCS_COMPUTE_NODE_GROUP_NAME`, `PCS_NODE_ID`,
    /// `PCS_IS_FIRST_BOOT` (`true`/`false`), as the service's own agent sets them.
    pub fn environment(&self, stage: Stage) -> Vec<(&'static str, String)> {
        let first = if self.first_boot { "true" } else { "false" };
        let mut env = vec![
            ("SLURM_NODE_AGENT_NODE_NAME", self.node_name.clone()),
            ("SLURM_NODE_AGENT_INSTANCE_ID", self.instance_id.clone()),
            ("SLURM_NODE_AGENT_IS_FIRST_BOOT", first.to_string()),
            ("SLURM_NODE_AGENT_STAGE", stage.name().to_string()),
            ("SLURM_NODE_AGENT_CONF_SERVERS", self.conf_servers.join(",")),
        ];
        if let Some(p) = &self.pcs {
            env.extend([
                ("PCS_CLUSTER_ID", p.cluster_id.clone()),
                ("PCS_CLUSTER_NAME", p.cluster_name.clone()),
                ("PCS_COMPUTE_NODE_GROUP_ID", p.group_id.clone()),
                ("PCS_COMPUTE_NODE_GROUP_NAME", p.group_name.clone()),
                ("PCS_NODE_ID", self.node_name.clone()),
                ("PCS_IS_FIRST_BOOT", first.to_string()),
            ]);
        }
        env
    }
}

/// What happened to one script.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScriptResult {
    /// Stage.
    pub stage: Stage,
    /// Where the script list came from.
    pub origin: Origin,
    /// Script name.
    pub name: String,
    /// `ok`, `failed`, `skipped` (`FIRST_BOOT_ONLY` after the first boot), `done` (succeeded
    /// earlier in this boot) or `not_run` (after a `STOP_SEQUENCE` or `TERMINATE` failure).
    pub status: &'static str,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// A failed `TERMINATE` script.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Terminate {
    /// Stage name.
    pub stage: String,
    /// Script name.
    pub script: String,
    /// Why it failed.
    pub message: String,
}

/// The outcome of a stage.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StageOutcome {
    /// Every script, in order.
    pub scripts: Vec<ScriptResult>,
    /// The failed script whose `onError` is `TERMINATE`, if one failed.
    pub terminate: Option<Terminate>,
}

/// `<agent.state_dir>/lifecycle/state.json`: which boot was the instance's first, which
/// scripts succeeded in this boot, when each cached copy was fetched, and the last
/// `TERMINATE`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunRecord {
    /// The instance this record is about (a record from another instance, e.g. baked
    /// into an image, starts afresh).
    pub instance_id: String,
    /// Kernel boot id of the first boot bootstrap ran in on this instance.
    pub first_boot_id: String,
    /// Kernel boot id `succeeded` is about.
    pub boot_id: String,
    /// Scripts that succeeded in this boot: `<stage>/<origin>/<n>/<checksum or location>`.
    pub succeeded: Vec<String>,
    /// Cache file name → boot id in which it was fetched.
    pub fetched: BTreeMap<String, String>,
    /// The drain reason of the last failed `TERMINATE` script.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub terminated_by: Option<String>,
}

impl RunRecord {
    /// Reads the record (a missing or unreadable one is empty), then makes it about this
    /// instance and boot.
    pub fn load(state_dir: &Path, instance_id: &str, boot_id: &str) -> RunRecord {
        let mut r: RunRecord = std::fs::read(state_dir.join(STATE_FILE))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        if r.instance_id != instance_id || r.first_boot_id.is_empty() {
            r = RunRecord {
                instance_id: instance_id.to_string(),
                first_boot_id: boot_id.to_string(),
                ..RunRecord::default()
            };
        }
        if r.boot_id != boot_id {
            r.boot_id = boot_id.to_string();
            r.succeeded.clear();
        }
        r
    }

    /// Whether this boot is the instance's first.
    pub fn first_boot(&self) -> bool {
        self.first_boot_id == self.boot_id
    }

    /// Writes the record atomically (mode 0600).
    ///
    /// # Errors
    /// [`RecordWriteError`], naming the folder or the file.
    pub fn save(&self, state_dir: &Path) -> Result<(), RecordWriteError> {
        let dir = state_dir.join(DIR);
        std::fs::create_dir_all(&dir).map_err(crate::fsutil::FileError::at(&dir))?;
        let json = serde_json::to_vec_pretty(self)?;
        crate::fsutil::write_atomic(&state_dir.join(STATE_FILE), &json, 0o600, None)?;
        Ok(())
    }
}

/// Why the run record could not be written ([`RunRecord::save`]).
#[derive(Debug, thiserror::Error)]
pub enum RecordWriteError {
    /// Its folder (`<agent.state_dir>/lifecycle`) could not be made.
    #[error(transparent)]
    CreateDir(#[from] crate::fsutil::FileError),
    /// The record did not serialize.
    #[error(transparent)]
    Encode(#[from] serde_json::Error),
    /// Writing the file failed.
    #[error(transparent)]
    Write(#[from] crate::fsutil::WriteError),
}

/// Where a script comes from: its `scriptLocation` and, for an S3 download that asked for
/// one, its `s3VersionId`. Shown as `<location>` or `<location> (version <id>)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptAt {
    /// `scriptLocation`.
    pub location: String,
    /// `s3VersionId` asked for.
    pub version: Option<String>,
}

impl std::fmt::Display for ScriptAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.version {
            Some(v) => write!(f, "{} (version {v})", self.location),
            None => f.write_str(&self.location),
        }
    }
}

/// Why a script's copy could not be had, or is not the one asked for.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// S3 answered `GetObject` with an error code (`NoSuchKey`, `NoSuchBucket`,
    /// `NoSuchVersion`, `AccessDenied`...).
    #[error(
        "{at}: S3 GetObject failed: {code}{}",
        .message.as_deref().map(|m| format!(": {m}")).unwrap_or_default()
    )]
    S3Code {
        /// The object.
        at: ScriptAt,
        /// S3's error code.
        code: String,
        /// S3's error message, when it sent one.
        message: Option<String>,
    },
    /// S3 answered 403 without an error code: still a refusal.
    #[error("{at}: S3 GetObject failed: HTTP 403 Forbidden (access denied; no error code in the answer)")]
    S3Forbidden {
        /// The object.
        at: ScriptAt,
    },
    /// S3 answered another HTTP status without an error code.
    #[error("{at}: S3 GetObject failed: HTTP {status}")]
    S3Status {
        /// The object.
        at: ScriptAt,
        /// The HTTP status.
        status: u16,
    },
    /// No answer from S3 (transport, credentials, timeout...).
    #[error(
        "{at}: S3 GetObject failed: {}",
        aws_smithy_types::error::display::DisplayErrorContext(.source.as_ref())
    )]
    S3Request {
        /// The object.
        at: ScriptAt,
        /// The SDK's error.
        #[source]
        source: Box<aws_sdk_s3::error::SdkError<aws_sdk_s3::operation::get_object::GetObjectError>>,
    },
    /// Reading the object's body failed.
    #[error("{at}: reading the object: {}", crate::imds::error_chain(.source))]
    S3Read {
        /// The object.
        at: ScriptAt,
        /// The stream's error.
        #[source]
        source: aws_smithy_types::byte_stream::error::Error,
    },
    /// The copy (as S3 announced or sent it, or as read) is larger than
    /// [`MAX_SCRIPT_BYTES`].
    #[error("{at}: {bytes} bytes, larger than {}", MAX_SCRIPT_BYTES)]
    TooBig {
        /// The script.
        at: ScriptAt,
        /// Its size (so far).
        bytes: u64,
    },
    /// SSM `GetParameter` failed.
    #[error("{location}: {}", crate::imds::error_chain(.source.as_ref()))]
    Ssm {
        /// `scriptLocation` (`ssm:<name>`).
        location: String,
        /// The SDK's error.
        #[source]
        source: Box<
            aws_sdk_ssm::error::SdkError<aws_sdk_ssm::operation::get_parameter::GetParameterError>,
        >,
    },
    /// A `file:` script larger than [`MAX_SCRIPT_BYTES`].
    #[error("{location}: larger than {} bytes", MAX_SCRIPT_BYTES)]
    FileTooBig {
        /// `scriptLocation` (`file:<path>`).
        location: String,
    },
    /// A `file:` script that is not a regular file (a folder, a device, a symlink).
    #[error("{location}: not a regular file")]
    NotRegularFile {
        /// `scriptLocation` (`file:<path>`).
        location: String,
    },
    /// Reading a `file:` script failed.
    #[error("{location}: {source}")]
    File {
        /// `scriptLocation` (`file:<path>`).
        location: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `scriptLocation` is none of `s3://`, `ssm:`, `file:`.
    #[error("{location}: expected s3://bucket/key, ssm:<parameter name> or file:<absolute path>")]
    UnknownScheme {
        /// `scriptLocation`.
        location: String,
    },
    /// The copy's SHA-256 is not `checksum`: not run.
    #[error("{location}: checksum mismatch (SHA-256 {got}, expected {expected}); not run")]
    ChecksumMismatch {
        /// `scriptLocation`.
        location: String,
        /// The copy's SHA-256 (hex).
        got: String,
        /// `checksum`.
        expected: String,
    },
    /// Every download attempt failed: the last one's error (and, when S3 throttled it, the
    /// API and the quota it hit).
    #[error("{last} ({attempts} attempts{})", throttled_quota(.last))]
    Attempts {
        /// Attempts made ([`FETCH_ATTEMPTS`]).
        attempts: u32,
        /// The last attempt's error.
        #[source]
        last: Box<FetchError>,
    },
}

/// `; throttled: s3:GetObject, quota: …` when `e` is S3's `SlowDown` (or another throttling
/// code), else nothing: a download given up under throttling names what it hit.
fn throttled_quota(e: &FetchError) -> String {
    match e {
        FetchError::S3Code { code, .. } if crate::retry::is_throttling(Some(code), None) => {
            format!(
                "; throttled: s3:GetObject, quota: {}",
                crate::retry::quota_of("s3:GetObject")
            )
        }
        _ => String::new(),
    }
}

/// Why a lifecycle script failed ([`ScriptResult::detail`], [`Terminate::message`]).
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    /// No checked copy: the download or the checksum failed.
    #[error(transparent)]
    Fetch(#[from] FetchError),
    /// A folder (of the cache or the logs) could not be made.
    #[error(transparent)]
    CreateDir(#[from] crate::fsutil::FileError),
    /// Writing the cached copy failed.
    #[error(transparent)]
    Cache(#[from] crate::fsutil::WriteError),
    /// The log file could not be opened.
    #[error("{}: {source}", .path.display())]
    OpenLog {
        /// The log file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The log file's handle could not be duplicated for stderr.
    #[error("{source}")]
    CloneLog {
        /// The log file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The kernel did not start it (most often: no `#!` line).
    #[error("cannot run it ({source}); a script needs a #! line (no shell runs it)")]
    Exec {
        /// The cached copy run.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// It ran and failed.
    #[error("{status}; output in {}", .log.display())]
    Failed {
        /// Its exit status (or signal).
        status: std::process::ExitStatus,
        /// Its log file.
        log: PathBuf,
    },
}

/// A name usable in a file name: other characters become `_`; at most 100.
fn safe_name(name: &str) -> String {
    name.chars()
        .take(100)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Log file of the `n`-th (from 1) script of a stage:
/// `<state_dir>/lifecycle/logs/<stage>-<n>-<name>.log`.
pub fn log_path(state_dir: &Path, stage: Stage, n: usize, name: &str) -> PathBuf {
    state_dir
        .join(DIR)
        .join("logs")
        .join(format!("{}-{n}-{}.log", stage.name(), safe_name(name)))
}

/// The drain reason of a failed `TERMINATE` script, in the one reason scheme (cause
/// `script`): `slurm-node-agent/script@<instance-id>: <script> failed in <stage> (onError
/// TERMINATE), powering off: <why>` (cut to Slurm's 256 characters).
pub fn terminate_reason(instance_id: &str, t: &Terminate) -> String {
    crate::reason::reason(
        crate::reason::ReasonCause::Script,
        instance_id,
        &format!(
            "{} failed in {} (onError TERMINATE), powering off: {}",
            t.script, t.stage, t.message
        ),
    )
}

/// The SDK's configuration in `region` (default credentials chain: the instance profile),
/// without the SDK's retries: [`fetch`] makes [`FETCH_ATTEMPTS`] itself, and the two would
/// multiply (3 × 3 requests per script when S3 throttles a booting fleet, issue 25 §1).
async fn sdk(region: &str) -> aws_config::SdkConfig {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(region.to_string()))
        .retry_config(aws_config::retry::RetryConfig::disabled())
        .load()
        .await
}

/// S3 `GetObject` of `bucket`/`key` (version `version` when given) with the SDK's default
/// credentials chain in `region`; at most [`MAX_SCRIPT_BYTES`] are read.
///
/// # Errors
/// [`FetchError`] naming `loc` (and the version) with S3's error code when S3 answered one
/// (`NoSuchKey`, `NoSuchBucket`, `NoSuchVersion`, `AccessDenied`, ...), else the HTTP
/// status or the transport error.
async fn s3_get(
    loc: &str,
    bucket: &str,
    key: &str,
    version: Option<&str>,
    region: &str,
) -> Result<Vec<u8>, FetchError> {
    use aws_sdk_s3::error::ProvideErrorMetadata as _;
    let at = ScriptAt {
        location: loc.to_string(),
        version: version.map(str::to_string),
    };
    let client = aws_sdk_s3::Client::new(&sdk(region).await);
    let out = client
        .get_object()
        .bucket(bucket)
        .key(key)
        .set_version_id(version.map(str::to_string))
        .send()
        .await
        .map_err(|e| {
            let status = e.raw_response().map(|r| r.status().as_u16());
            let code = e.code().map(str::to_string);
            let at = at.clone();
            match (code, status) {
                (Some(code), _) => FetchError::S3Code {
                    at,
                    code,
                    message: e.message().map(str::to_string),
                },
                // S3 sends a code with every GET error; a bare 403 is still a refusal.
                (None, Some(403)) => FetchError::S3Forbidden { at },
                (None, Some(status)) => FetchError::S3Status { at, status },
                (None, None) => FetchError::S3Request {
                    at,
                    source: Box::new(e),
                },
            }
        })?;
    let too_big = |bytes: u64| FetchError::TooBig {
        at: at.clone(),
        bytes,
    };
    if let Some(n) = out.content_length().and_then(|n| u64::try_from(n).ok()) {
        if n > MAX_SCRIPT_BYTES {
            return Err(too_big(n));
        }
    }
    let mut body = out.body;
    let mut bytes = Vec::new();
    while let Some(chunk) = body.try_next().await.map_err(|source| FetchError::S3Read {
        at: at.clone(),
        source,
    })? {
        bytes.extend_from_slice(&chunk);
        if bytes.len() as u64 > MAX_SCRIPT_BYTES {
            return Err(too_big(bytes.len() as u64));
        }
    }
    Ok(bytes)
}

/// Fetches a script's bytes once.
async fn fetch_once(source: &ScriptSource, region: &str) -> Result<Vec<u8>, FetchError> {
    let loc = &source.script_location;
    let location = Location::parse(loc);
    if let Some((bucket, key)) = location.and_then(|l| l.s3_object()) {
        s3_get(loc, bucket, key, source.s3_version_id.as_deref(), region).await
    } else if let Some(Location::Ssm(name)) = location {
        let client = aws_sdk_ssm::Client::new(&sdk(region).await);
        let out = client
            .get_parameter()
            .name(name)
            .with_decryption(true)
            .send()
            .await
            .map_err(|e| FetchError::Ssm {
                location: loc.clone(),
                source: Box::new(e),
            })?;
        Ok(out
            .parameter
            .and_then(|p| p.value)
            .unwrap_or_default()
            .into_bytes())
    } else if let Some(Location::File(path)) = location {
        let location = loc.clone();
        match crate::fsutil::read_regular(Path::new(path), MAX_SCRIPT_BYTES) {
            Ok(Some((bytes, _))) => Ok(bytes),
            Ok(None) => match std::fs::metadata(path) {
                Ok(m) if m.is_file() => Err(FetchError::FileTooBig { location }),
                Ok(_) => Err(FetchError::NotRegularFile { location }),
                Err(source) => Err(FetchError::File { location, source }),
            },
            Err(source) => Err(FetchError::File { location, source }),
        }
    } else {
        Err(FetchError::UnknownScheme {
            location: loc.clone(),
        })
    }
}

/// Size and checksum of a copy.
fn check(source: &ScriptSource, bytes: &[u8]) -> Result<(), FetchError> {
    if bytes.len() as u64 > MAX_SCRIPT_BYTES {
        return Err(FetchError::TooBig {
            at: ScriptAt {
                location: source.script_location.clone(),
                version: None,
            },
            bytes: bytes.len() as u64,
        });
    }
    if let Some(want) = &source.checksum {
        let got = hex::encode(Sha256::digest(bytes));
        if !got.eq_ignore_ascii_case(want) {
            return Err(FetchError::ChecksumMismatch {
                location: source.script_location.clone(),
                got,
                expected: want.clone(),
            });
        }
    }
    Ok(())
}

/// Downloads with [`FETCH_ATTEMPTS`] attempts, then checks size and checksum (a mismatch is
/// not retried: the object is what it is).
async fn fetch(script: &Script, region: &str) -> Result<Vec<u8>, FetchError> {
    let mut attempt = 0;
    let mut throttled = false;
    loop {
        if attempt > 0 {
            tokio::time::sleep(FETCH_BACKOFF.delay(attempt - 1)).await;
        }
        match fetch_once(&script.script_source, region).await {
            Ok(bytes) => {
                check(&script.script_source, &bytes)?;
                return Ok(bytes);
            }
            Err(e) => {
                let slow_down = matches!(&e, FetchError::S3Code { code, .. }
                    if crate::retry::is_throttling(Some(code), None));
                if slow_down {
                    crate::textfile::note_throttled("s3:GetObject");
                }
                if slow_down && throttled {
                    tracing::debug!(script = %script.name, attempt = attempt + 1, "S3 throttled the script's download again: {e}");
                } else if slow_down {
                    throttled = true;
                    tracing::warn!(
                        script = %script.name,
                        attempt = attempt + 1,
                        "s3:GetObject throttled ({e}; quota: {}); backing off",
                        crate::retry::quota_of("s3:GetObject")
                    );
                } else {
                    tracing::warn!(script = %script.name, attempt = attempt + 1, "fetching the script failed: {e}");
                }
                attempt += 1;
                if attempt >= FETCH_ATTEMPTS {
                    return Err(FetchError::Attempts {
                        attempts: FETCH_ATTEMPTS,
                        last: Box::new(e),
                    });
                }
            }
        }
    }
}

/// Runs one script: no shell, its arguments, the facts, output to its log. A script that
/// the kernel finds busy (`ETXTBSY`: another thread's fork held the new file open for a
/// moment) is tried again: it never started.
async fn execute(
    script: &Script,
    path: &Path,
    log: &Path,
    env: &[(&'static str, String)],
) -> Result<(), ScriptError> {
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir).map_err(crate::fsutil::FileError::at(dir))?;
    }
    let mut tries = 0;
    let status = loop {
        let out = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(log)
                .map_err(|source| ScriptError::OpenLog {
                    path: log.to_path_buf(),
                    source,
                })?
        };
        let err = out.try_clone().map_err(|source| ScriptError::CloneLog {
            path: log.to_path_buf(),
            source,
        })?;
        let mut cmd = tokio::process::Command::new(path);
        cmd.args(&script.arguments)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true);
        match cmd.status().await {
            Ok(s) => break s,
            Err(e) if e.raw_os_error() == Some(nix::errno::Errno::ETXTBSY as i32) && tries < 20 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(source) => {
                return Err(ScriptError::Exec {
                    path: path.to_path_buf(),
                    source,
                })
            }
        }
    };
    if status.success() {
        Ok(())
    } else {
        Err(ScriptError::Failed {
            status,
            log: log.to_path_buf(),
        })
    }
}

/// One list of scripts to run in a stage.
#[derive(Debug, Clone, Copy)]
pub struct ScriptList<'a> {
    /// Where it comes from.
    pub origin: Origin,
    /// The actions (the stage's list and the caching policy).
    pub actions: &'a NodeLifecycleActions,
}

/// Runs a stage: the lists in order, each script per its policies (see the module docs).
/// Updates `record` (the caller saves it). A failed `TERMINATE` script ends the stage.
pub async fn run_stage(
    state_dir: &Path,
    region: &str,
    stage: Stage,
    lists: &[ScriptList<'_>],
    facts: &Facts,
    record: &mut RunRecord,
) -> StageOutcome {
    let env = facts.environment(stage);
    let mut outcome = StageOutcome::default();
    let mut n = 0;
    for list in lists {
        let mut stopped = outcome.terminate.is_some();
        for script in stage.of(&list.actions.stages) {
            n += 1;
            let result = |status, detail| ScriptResult {
                stage,
                origin: list.origin,
                name: script.name.clone(),
                status,
                detail,
            };
            if stopped {
                outcome.scripts.push(result("not_run", None));
                continue;
            }
            if script.execution_policy == "FIRST_BOOT_ONLY" && !record.first_boot() {
                tracing::info!(stage = stage.name(), script = %script.name, "FIRST_BOOT_ONLY, not the first boot: skipped");
                outcome.scripts.push(result("skipped", None));
                continue;
            }
            let id = format!(
                "{}/{}/{n}/{}",
                stage.name(),
                match list.origin {
                    Origin::Service => "service",
                    Origin::Settings => "settings",
                },
                script
                    .script_source
                    .checksum
                    .as_deref()
                    .unwrap_or(&script.script_source.script_location)
            );
            if record.succeeded.contains(&id) {
                outcome.scripts.push(result("done", None));
                continue;
            }
            let cache_name = format!(
                "{}-{}-{n}-{}",
                stage.name(),
                match list.origin {
                    Origin::Service => "s",
                    Origin::Settings => "i",
                },
                safe_name(&script.name)
            );
            let cache = state_dir.join(DIR).join("cache").join(&cache_name);
            let ran = match cached_or_fetched(
                script,
                &cache,
                &cache_name,
                &list.actions.script_caching_policy,
                region,
                record,
            )
            .await
            {
                Ok(()) => {
                    let log = log_path(state_dir, stage, n, &script.name);
                    tracing::info!(stage = stage.name(), script = %script.name, log = %log.display(), "running lifecycle script");
                    execute(script, &cache, &log, &env).await
                }
                Err(e) => Err(e),
            };
            match ran {
                Ok(()) => {
                    tracing::info!(stage = stage.name(), script = %script.name, "lifecycle script succeeded");
                    record.succeeded.push(id);
                    outcome.scripts.push(result("ok", None));
                }
                Err(e) => {
                    tracing::warn!(stage = stage.name(), script = %script.name, on_error = %script.on_error, "lifecycle script failed: {e}");
                    let e = e.to_string();
                    outcome.scripts.push(result("failed", Some(e.clone())));
                    match script.on_error.as_str() {
                        "CONTINUE" => {}
                        "STOP_SEQUENCE" => stopped = true,
                        _ => {
                            stopped = true;
                            outcome.terminate = Some(Terminate {
                                stage: stage.name().into(),
                                script: script.name.clone(),
                                message: e,
                            });
                        }
                    }
                }
            }
        }
    }
    outcome
}

/// Makes `cache` hold a checked copy: the cached one when the policy allows and it still
/// matches, else a download.
async fn cached_or_fetched(
    script: &Script,
    cache: &Path,
    cache_name: &str,
    policy: &str,
    region: &str,
    record: &mut RunRecord,
) -> Result<(), ScriptError> {
    let fresh = policy == "CACHE_ONCE" || record.fetched.get(cache_name) == Some(&record.boot_id);
    if fresh {
        if let Ok(Some((bytes, _))) = crate::fsutil::read_regular(cache, MAX_SCRIPT_BYTES) {
            if check(&script.script_source, &bytes).is_ok() {
                return Ok(());
            }
        }
    }
    let bytes = fetch(script, region).await?;
    if let Some(dir) = cache.parent() {
        std::fs::create_dir_all(dir).map_err(crate::fsutil::FileError::at(dir))?;
    }
    crate::fsutil::write_atomic(cache, &bytes, 0o700, None)?;
    record
        .fetched
        .insert(cache_name.to_string(), record.boot_id.clone());
    Ok(())
}

/// Why a stage stopped bootstrap.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    /// The actions break the API's limits (exit 65): nothing of the stage ran.
    #[error("nodeLifecycleActions from the {origin}: {key}: {message}")]
    Invalid {
        /// `service` or `settings`.
        origin: &'static str,
        /// Where in the actions.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// A `TERMINATE` script failed: the node was drained (when registered) and the
    /// shutdown unit started (exit 65).
    #[error("lifecycle script {script:?} failed in {stage} with onError TERMINATE ({message}); {action}")]
    Terminated {
        /// Stage name.
        stage: String,
        /// Script name.
        script: String,
        /// Why it failed.
        message: String,
        /// The drain reason (also in the log and the records).
        reason: String,
        /// What was done: `powering off (poweroff.target started)` or why not.
        action: String,
    },
    /// The run record could not be written (exit 74).
    #[error(transparent)]
    Io(#[from] RecordWriteError),
}

impl LifecycleError {
    /// The exit code: bad data for invalid actions and a `TERMINATE`, I/O for the record.
    pub fn exit(&self) -> crate::exit::Exit {
        use crate::exit::Exit;
        match self {
            LifecycleError::Invalid { .. } | LifecycleError::Terminated { .. } => Exit::DataErr,
            LifecycleError::Io(_) => Exit::IoErr,
        }
    }
}

/// What bootstrap hands [`run`].
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// `[node_lifecycle]` as bootstrap runs with it (the image's scripts, the poweroff unit).
    pub settings: &'a NodeLifecycleSettings,
    /// `agent.state_dir` (the run record, the cache and the logs).
    pub state_dir: &'a Path,
    /// The node's gateway (the drain of a `TERMINATE` in `nodeReady`, a cause of the drain
    /// state machine).
    pub gateway: &'a crate::node_state::Gateway,
    /// The instance's region (downloads).
    pub region: &'a str,
    /// The service's actions, in the managed mode.
    pub service: Option<&'a NodeLifecycleActions>,
    /// The facts, but `first_boot`, which comes from the run record.
    pub facts: &'a Facts,
    /// The breaker (`repair.breaker_share`, `repair.breaker_min_nodes`): a `TERMINATE`
    /// script failing on that share of the partition's nodes does not power this one off.
    pub breaker: (f64, u32),
}

/// Runs one stage for bootstrap: the service's scripts, then the settings', per the module
/// docs; keeps the run record. On a failed `TERMINATE` script: in `nodeReady` drains the node
/// with [`terminate_reason`]; in `nodeBootstrapped` (slurmd has not fetched its config, the
/// node is not registered) the reason goes to the log and the records only; then starts
/// `node_lifecycle.poweroff_unit` through `systemd` (an orderly shutdown).
///
/// # Errors
/// [`LifecycleError`].
pub async fn run(
    cx: Context<'_>,
    stage: Stage,
    systemd: &crate::systemd::Systemd,
) -> Result<StageOutcome, LifecycleError> {
    let image = cx.settings.actions();
    if let Some(a) = cx.service {
        validate(a).map_err(|InvalidKey { key, message }| LifecycleError::Invalid {
            origin: "service",
            key,
            message,
        })?;
    }
    let mut lists = Vec::new();
    if let Some(a) = cx.service {
        lists.push(ScriptList {
            origin: Origin::Service,
            actions: a,
        });
    }
    lists.push(ScriptList {
        origin: Origin::Settings,
        actions: &image,
    });
    if lists.iter().all(|l| stage.of(&l.actions.stages).is_empty()) {
        return Ok(StageOutcome::default());
    }
    let state_dir = cx.state_dir;
    let mut record = RunRecord::load(
        state_dir,
        &cx.facts.instance_id,
        &crate::hostfacts::boot_id().unwrap_or_default(),
    );
    let facts = Facts {
        first_boot: record.first_boot(),
        ..cx.facts.clone()
    };
    let outcome = run_stage(state_dir, cx.region, stage, &lists, &facts, &mut record).await;
    let Some(t) = outcome.terminate.clone() else {
        record.save(state_dir).map_err(LifecycleError::Io)?;
        return Ok(outcome);
    };
    let held = if stage == Stage::NodeReady {
        bootstrap_breaker(&cx, &facts.node_name, &t.script).await
    } else {
        None
    };
    let reason = match &held {
        None => terminate_reason(&facts.instance_id, &t),
        Some(why) => crate::reason::reason(
            crate::reason::ReasonCause::Script,
            &facts.instance_id,
            &format!(
                "{} failed in {} (onError TERMINATE), not powered off: {why}: {}",
                t.script, t.stage, t.message
            ),
        ),
    };
    record.terminated_by = Some(reason.clone());
    if let Err(e) = record.save(state_dir) {
        tracing::error!("{e}");
    }
    if stage == Stage::NodeReady {
        let cause = crate::node_state::Cause::stated(
            crate::reason::ReasonCause::Script,
            cx.gateway.instance_id(),
            &reason,
        )
        .unwrap_or_else(|| crate::node_state::Cause::Script {
            detail: reason.clone(),
        });
        match cx.gateway.drain(cause, None).await {
            Ok(r) if r.state.foreign_reason.is_some() => {
                tracing::error!(node = %facts.node_name, %reason, kept = ?r.state.foreign_reason, "drained by someone else already (their reason is kept); powering off")
            }
            Ok(_) => {
                tracing::error!(node = %facts.node_name, %reason, "drained before powering off")
            }
            Err(e) => {
                tracing::error!(node = %facts.node_name, %reason, "draining before powering off failed: {e}")
            }
        }
    } else {
        tracing::error!(%reason, "slurmd has not started: the reason goes to the log and the records only");
    }
    if let Some(why) = held {
        tracing::error!(node = %facts.node_name, %reason, "NOT powering off: {why}; the node stays drained");
        return Err(LifecycleError::Terminated {
            stage: t.stage,
            script: t.script,
            message: t.message,
            reason,
            action: format!("not powered off: {why}"),
        });
    }
    let unit = &cx.settings.poweroff_unit;
    let action = match systemd.start(unit).await {
        Ok(()) => format!("powering off ({unit} started)"),
        Err(e) => {
            tracing::error!("starting {unit} for the orderly shutdown failed: {e}");
            format!("starting {unit} failed: {e}")
        }
    };
    Err(LifecycleError::Terminated {
        stage: t.stage,
        script: t.script,
        message: t.message,
        reason,
        action,
    })
}

/// The breaker at bootstrap: a `TERMINATE` script `script` that failed on more than
/// `repair.breaker_share` of the nodes of one of `node`'s partitions (and on at least
/// `repair.breaker_min_nodes` of them), as slurmctld's records show it (their drain
/// reasons, kept after those nodes powered off), is the fleet's fault: powering off would
/// only launch a replacement that fails the same way. Why it holds, or `None`; `None` too
/// when the records cannot be read (the script's terminate is the site's choice).
async fn bootstrap_breaker(cx: &Context<'_>, node: &str, script: &str) -> Option<String> {
    let fleet = match cx.gateway.fleet().await {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!("the breaker could not count (slurmctld's records: {e}): powering off as the script asks");
            return None;
        }
    };
    let own = fleet.iter().find(|n| n.name() == node)?;
    let partitions = own.fields.get("Partitions").map_or("", String::as_str);
    let seen: Vec<crate::repair::breaker::Seen<'_>> = fleet
        .iter()
        .map(|n| crate::repair::breaker::Seen {
            // A node that powered off for the same failure is the loop's evidence.
            present: true,
            ..crate::node_state::breaker_view(n)
        })
        .collect();
    let t = crate::repair::breaker::tripped_by(node, partitions, &seen, cx.breaker, &|r| {
        crate::repair::breaker::names_failed_script(r, script)
    })?;
    Some(crate::repair::breaker::holds(script, &t, cx.breaker))
}

#[cfg(test)]
mod tests;
