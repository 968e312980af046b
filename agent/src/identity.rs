//! The node's identity, in one place: which NodeName this instance is and which instance
//! incarnation registered it, for every command.
//!
//! - **NodeName**: [`crate::nodedef::node_name`] (`node.name`, else `node.name_template`
//!   over instance facts) is the one rule; [`resolve`] applies it for every command:
//!   bootstrap's record (`bootstrap.json`) when there is one, otherwise the settings
//!   resolved exactly as bootstrap resolves them (files, user data, tags, flags) over
//!   IMDS's facts.
//!   `check` (Slurm's `HealthCheckProgram`) first takes `SLURMD_NODENAME`.
//! - **Incarnation**: the EC2 instance id. Bootstrap records it with the NodeName
//!   ([`Recorded`]); a replacement instance (same NodeName, new instance id) is a new
//!   incarnation. Whose Slurm's record is, and how the agent marks the drains it owns,
//!   is the reason scheme's ([`crate::reason`]).
//!
//! Floor 9 (assembly): above `settings`, which it reads.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::imds::{Imds, ImdsError, InstanceIdentity, TagSource};
use crate::reason::{is_valid_instance_id, ReasonCause, UNKNOWN_INSTANCE};
use crate::settings::pipeline::{Inputs, Metadata};
use crate::settings::{self, Resolved, SettingsError, Source};
use crate::userdata::SettingsPart;

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
    /// What bootstrap records once the node `def` of instance `id` is registered: the
    /// NodeName, the incarnation, the image, a dynamic node's `--conf` line, and the
    /// settings tags and user data parts it read (`metadata`).
    pub fn of(
        id: &InstanceIdentity,
        metadata: &Metadata,
        def: &crate::nodedef::NodeDefinition,
    ) -> Recorded {
        Recorded {
            dynamic_conf: def.dynamic_conf.clone(),
            ..Recorded::of_login(id, metadata, &def.node_name)
        }
    }

    /// What bootstrap records for a login node (`node.role = "login"`) named `name`: no
    /// `--conf` line (it is not a Slurm node).
    pub fn of_login(id: &InstanceIdentity, metadata: &Metadata, name: &str) -> Recorded {
        Recorded {
            node_name: name.to_string(),
            instance_id: id.instance_id.clone(),
            ami_id: id.ami_id.clone(),
            dynamic_conf: None,
            setting_tags: metadata.tags.clone(),
            user_data_settings: metadata.user_data.clone(),
        }
    }

    /// The settings fragments this record kept: the instance's metadata as bootstrap read
    /// it.
    pub fn metadata(&self) -> Metadata {
        Metadata {
            user_data: self.user_data_settings.clone(),
            tags: self.setting_tags.clone(),
        }
    }

    /// Reads `<state_dir>/bootstrap.json`; `None` when it is missing or unreadable.
    ///
    /// A record that cannot be parsed (empty, truncated) is `None` with an error in the log
    /// naming the file, and the caller resolves the node as if bootstrap had left nothing;
    /// `on_corrupt` says whether it is also moved aside as
    /// `bootstrap.json.corrupt-<unix seconds>` ([`CorruptRecord`]).
    pub fn read(state_dir: &Path, on_corrupt: CorruptRecord) -> Option<Recorded> {
        let path = state_dir.join(STATE_FILE);
        let text = std::fs::read(&path).ok()?;
        match serde_json::from_slice(&text) {
            Ok(r) => Some(r),
            Err(e) => {
                let problem = format!("invalid bootstrap record: {e}");
                match on_corrupt {
                    CorruptRecord::SetAside => {
                        crate::fsutil::set_aside_corrupt(&path, &text, &problem);
                    }
                    CorruptRecord::Leave => crate::fsutil::report_corrupt(&path, &problem),
                }
                None
            }
        }
    }

    /// Writes it atomically.
    ///
    /// # Errors
    /// [`RecordError`] naming the folder or the file.
    pub fn write(&self, state_dir: &Path) -> Result<(), RecordError> {
        std::fs::create_dir_all(state_dir).map_err(crate::fsutil::FileError::at(state_dir))?;
        let json = serde_json::to_vec_pretty(self)?;
        let path = state_dir.join(STATE_FILE);
        crate::fsutil::write_atomic(&path, &json, 0o644, None)
            .map_err(|source| RecordError::Write { path, source })
    }
}

/// What reading bootstrap's record ([`Recorded::read`]) does with a record that cannot be
/// parsed; either way it says so in the log and reads as no record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CorruptRecord {
    /// Moved aside as `bootstrap.json.corrupt-<unix seconds>`, so that later commands
    /// (and bootstrap's next record) start clean: every command but `check --no-act`.
    SetAside,
    /// Left where it is: `check --no-act` only reports, and changes nothing on disk.
    Leave,
}

/// Why the bootstrap record ([`Recorded`]) could not be written.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The state folder could not be created.
    #[error(transparent)]
    Folder(#[from] crate::fsutil::FileError),
    /// The record could not be encoded as JSON.
    #[error(transparent)]
    Encode(#[from] serde_json::Error),
    /// The file could not be written.
    #[error("{}: {source}", path.display())]
    Write {
        /// The record's path.
        path: std::path::PathBuf,
        /// What failed.
        #[source]
        source: crate::fsutil::WriteError,
    },
}

/// Why the instance could not be read ([`read_instance`]).
#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    /// Instance metadata unavailable (exit 69).
    #[error(transparent)]
    Imds(#[from] ImdsError),
    /// The settings that choose the tag source are invalid (exit 78).
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// `imds.tags = "describe-tags"` and EC2's `DescribeTags` failed (exit 77 when access
    /// is denied, else 69).
    #[error(transparent)]
    Tags(#[from] crate::ec2tags::DescribeTagsError),
}

impl InstanceError {
    /// The exit code.
    pub fn exit(&self) -> crate::exit::Exit {
        match self {
            InstanceError::Imds(_) => crate::exit::Exit::Unavailable,
            InstanceError::Settings(_) => crate::exit::Exit::Config,
            InstanceError::Tags(e) => e.exit(),
        }
    }
}

/// An instance as read once per start: its facts and the settings fragments its metadata
/// carries ([`Inputs`] with [`Inputs::metadata`] set: the user data parsed once).
#[derive(Debug, Clone)]
pub struct Instance {
    /// IMDS's facts (tags from the source `imds.tags` names).
    pub facts: InstanceIdentity,
    /// The settings its metadata carries (the user data parsed once, the settings tags).
    pub metadata: Metadata,
    /// The files and flags it was read with, and [`Instance::metadata`].
    pub inputs: Inputs,
}

impl Instance {
    /// The settings of this instance ([`Inputs::resolve`]).
    ///
    /// # Errors
    /// [`SettingsError`] naming the source and the key.
    pub fn settings(&self, enforce: settings::Enforce) -> Result<Resolved, SettingsError> {
        self.inputs.resolve(enforce)
    }
}

/// Reads the instance from `imds` ([`Imds::identity`]) with its tags from the source
/// `imds.tags` names: the one way bootstrap, the daemon and the commands read it. The
/// user data is parsed here, once ([`Metadata::of_instance`]).
///
/// `imds.tags` is image or user data trust, so it is resolved from the files, the user
/// data part and the flags of `inputs`, without tags; with `describe-tags`, the tags are
/// then EC2's `DescribeTags` answer ([`crate::ec2tags::instance_tags`], in the instance's
/// region), replacing whatever metadata served, and `tags_available` is true. The tags then
/// set settings and fill placeholders exactly as metadata tags do.
///
/// # Errors
/// [`InstanceError`]: IMDS, the settings (`enforce` as for the final resolution), or
/// `DescribeTags`.
pub async fn read_instance(
    imds: &Imds,
    inputs: &Inputs,
    enforce: settings::Enforce,
) -> Result<Instance, InstanceError> {
    let mut id = imds.identity().await?;
    let mut metadata = Metadata::of_instance(&id)?;
    // The tag source is never a tag's to choose: resolved as bootstrap does, tags left out.
    let source = inputs
        .with_metadata(metadata.without_tags())
        .resolve(enforce)?
        .settings
        .imds
        .tags;
    if source == TagSource::DescribeTags {
        id.tags = crate::ec2tags::instance_tags(&id.region, &id.instance_id).await?;
        id.tags_available = true;
        metadata.tags = settings::pipeline::setting_tags(&id.tags);
        tracing::debug!(
            instance_id = %id.instance_id,
            tags = id.tags.len(),
            "instance tags read through EC2 DescribeTags (imds.tags)"
        );
    }
    Ok(Instance {
        facts: id,
        inputs: inputs.with_metadata(metadata.clone()),
        metadata,
    })
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
        crate::reason::reason(cause, &self.instance_id, detail)
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
    /// No record, `imds.tags = "describe-tags"` and `DescribeTags` failed, and nothing
    /// else names the node (exit 77 when access is denied, else 69).
    #[error("the node name is unknown: no bootstrap record ({record}), and {source}")]
    Tags {
        /// The record's path.
        record: String,
        /// Why `DescribeTags` failed.
        #[source]
        source: crate::ec2tags::DescribeTagsError,
    },
    /// No way to know the node name (exit 78).
    #[error("the node name is unknown: pass --node-name, set node.name, or run bootstrap first (it writes {})", record.display())]
    NoName {
        /// The bootstrap record's path, which was not there.
        record: std::path::PathBuf,
    },
    /// `SLURMD_NODENAME` is not a node name (exit 78).
    #[error("environment variable SLURMD_NODENAME={value:?} is not one Slurm NodeName (letters, digits, '-', '_' and '.' only; not ALL or DEFAULT)")]
    BadEnvName {
        /// The variable's value.
        value: String,
    },
}

impl IdentityError {
    /// The exit code.
    pub fn exit(&self) -> crate::exit::Exit {
        match self {
            IdentityError::Settings(_)
            | IdentityError::NoName { .. }
            | IdentityError::BadEnvName { .. } => crate::exit::Exit::Config,
            IdentityError::Imds { .. } => crate::exit::Exit::Unavailable,
            IdentityError::Tags { source, .. } => source.exit(),
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
    /// The settings files and flags ([`Inputs::read`]); their metadata, if any, is not
    /// used: the instance's comes from `instance`, bootstrap's record or IMDS.
    pub inputs: &'a Inputs,
    /// Where to look.
    pub lookup: Lookup,
    /// The instance already read (the daemon reads it anyway); skips the IMDS call.
    pub instance: Option<&'a Instance>,
    /// Limit on the IMDS lookup when there is no record.
    pub imds_timeout: Duration,
    /// What a corrupt bootstrap record becomes ([`CorruptRecord`]).
    pub corrupt_record: CorruptRecord,
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
    let read_now;
    let instance: Option<&Instance> = match (req.instance, &prep.record, req.lookup) {
        (Some(i), _, _) => Some(i),
        (None, None, Lookup::RecordThenImds) => {
            let imds = Imds::new(&prep.early.settings.imds);
            let named = prep.flag_name.is_some() || !prep.early.settings.node.name.is_empty();
            let read = read_instance(&imds, &prep.inputs, settings::Enforce::WarnAndIgnore);
            match tokio::time::timeout(req.imds_timeout, read).await {
                Ok(Ok(i)) => {
                    read_now = i;
                    Some(&read_now)
                }
                Ok(Err(InstanceError::Settings(e))) => return Err(e.into()),
                Ok(Err(InstanceError::Imds(e))) if !named => {
                    return Err(IdentityError::Imds {
                        record: prep.record_path,
                        source: e,
                    })
                }
                Ok(Err(InstanceError::Tags(e))) if !named => {
                    return Err(IdentityError::Tags {
                        record: prep.record_path,
                        source: e,
                    })
                }
                Ok(Err(e)) => {
                    tracing::warn!("{e}; using the files and flags only");
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
    finish(prep, instance)
}

/// [`resolve`] for [`Lookup::Local`] without instance metadata already read: the same
/// result, without an await and without referring to the IMDS client at all, so that a
/// program that only runs `check` (`slurm-node-agent-healthcheck`) does not link it.
/// `corrupt_record`: what a corrupt bootstrap record becomes ([`CorruptRecord::Leave`]
/// for `check --no-act`).
///
/// # Errors
/// [`IdentityError`] (never [`IdentityError::Imds`]).
pub fn resolve_local(
    inputs: &Inputs,
    corrupt_record: CorruptRecord,
) -> Result<(Resolved, NodeIdentity), IdentityError> {
    let req = Request {
        inputs,
        lookup: Lookup::Local,
        instance: None,
        imds_timeout: Duration::ZERO,
        corrupt_record,
    };
    let prep = prepare(&req)?;
    finish(prep, None)
}

/// What [`resolve`] reads before it knows whether to ask IMDS.
struct Prepared {
    inputs: Inputs,
    early: Resolved,
    flag_name: Option<String>,
    env_name: Option<String>,
    record: Option<Recorded>,
    record_path: String,
}

fn prepare(req: &Request<'_>) -> Result<Prepared, IdentityError> {
    let inputs = req.inputs.without_metadata();
    let early = inputs.resolve(settings::Enforce::WarnAndIgnore)?;
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
            return Err(IdentityError::BadEnvName { value: n.clone() });
        }
    }
    let record = Recorded::read(&state_dir, req.corrupt_record);
    let record_path = state_dir.join(STATE_FILE).display().to_string();
    Ok(Prepared {
        inputs,
        early,
        flag_name,
        env_name,
        record,
        record_path,
    })
}

fn finish(
    prep: Prepared,
    instance: Option<&Instance>,
) -> Result<(Resolved, NodeIdentity), IdentityError> {
    let Prepared {
        inputs,
        early,
        flag_name,
        env_name,
        record,
        record_path,
    } = prep;
    let facts = instance.map(|i| &i.facts);
    // The record's metadata stands for IMDS when the record is this incarnation's (or
    // when IMDS is not asked).
    let record_current = record.as_ref().is_some_and(|r| {
        facts.is_none_or(|f| f.instance_id == r.instance_id) && !r.node_name.is_empty()
    });
    let resolved = match (instance, &record) {
        (Some(i), _) => inputs
            .with_metadata(i.metadata.clone())
            .resolve(settings::Enforce::WarnAndIgnore)?,
        (None, Some(r)) => inputs
            .with_metadata(r.metadata())
            .resolve(settings::Enforce::WarnAndIgnore)?,
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
        let n = crate::nodedef::node_name(&resolved.settings.node, f).map_err(|e| {
            SettingsError::Key {
                origin: resolved.source_of(e.key()),
                key: e.key().to_string(),
                message: e.to_string(),
            }
        })?;
        (n, NameSource::Settings)
    } else if !resolved.settings.node.name.is_empty() {
        (resolved.settings.node.name.clone(), NameSource::Settings)
    } else {
        return Err(IdentityError::NoName {
            record: record_path.into(),
        });
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

    const ID: &str = "i-0123456789abcdef0";

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
        let md = Metadata {
            user_data: Vec::new(),
            tags,
        };
        let e = md.layers(settings::Enforce::Refuse).unwrap_err();
        assert!(
            e.to_string().contains("slurm-node-agent:node.weight"),
            "{e}"
        );
        let layers = md.layers(settings::Enforce::WarnAndIgnore).unwrap();
        assert_eq!(layers.len(), 1);
        assert_eq!(
            layers[0].source,
            Source::Tag("slurm-node-agent:node.features".into())
        );
    }

    /// A corrupt record reads as none; it is moved aside, or with
    /// [`CorruptRecord::Leave`] (`check --no-act`) left as it is, nothing else written.
    #[test]
    fn a_corrupt_record_is_set_aside_or_left_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(STATE_FILE);
        let files = || {
            let mut v: Vec<String> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        std::fs::write(&path, "{\"node_name\": \"n1\", \"inst").unwrap();
        assert_eq!(Recorded::read(dir.path(), CorruptRecord::Leave), None);
        assert_eq!(files(), vec![STATE_FILE.to_string()]);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\"node_name\": \"n1\", \"inst"
        );
        assert_eq!(Recorded::read(dir.path(), CorruptRecord::SetAside), None);
        let after = files();
        assert_eq!(after.len(), 1, "{after:?}");
        assert!(after[0].starts_with("bootstrap.json.corrupt-"), "{after:?}");
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
        let back = Recorded::read(&dir, CorruptRecord::SetAside).unwrap();
        assert_eq!(back, rec);
        let layers = back.metadata().layers(settings::Enforce::Refuse).unwrap();
        let r = Resolved::merge(&layers).unwrap();
        assert_eq!(r.settings.node.weight, 7);
        assert_eq!(r.settings.node.features, vec!["ud".to_string()]);
        // An old record (no metadata fields) still reads.
        std::fs::write(
            dir.join(STATE_FILE),
            r#"{"node_name":"n1","instance_id":"i-12345678","ami_id":"a","dynamic_conf":null}"#,
        )
        .unwrap();
        assert!(Recorded::read(&dir, CorruptRecord::SetAside)
            .unwrap()
            .setting_tags
            .is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
