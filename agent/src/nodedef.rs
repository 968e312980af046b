//! The Slurm node this instance becomes: its NodeName and, for dynamic nodes, the `--conf`
//! line (slurm.conf(5) "NODE CONFIGURATION" keys) that `slurmd -Z` registers with.
//!
//! Every value that reaches the `--conf` line is either a number computed here or a string
//! checked against a strict character set, so nothing can add a key to it.
//!
//! The `[node]` settings section ([`NodeSettings`]) and the one NodeName rule
//! ([`node_name`]) are this module's.
//!
//! Floor 2 (outside systems): over the host facts and the instance metadata.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::hostfacts::{GpuProbe, GpuWaitError, HostFacts};
use crate::imds::InstanceIdentity;
use crate::section::{Classified, HumanDuration, InvalidKey, KeyTrust};

/// `[node]`: the node definition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeSettings {
    /// What this instance is: `compute` (the default: slurmd, a Slurm node) or `login`
    /// (sackd only: the configuration and authentication for `sinfo`, `sbatch`, `srun`;
    /// no slurmd, no drains, no upgrade watch). See [`Role`].
    pub role: Role,
    /// Slurm NodeName. Empty: built from `name_template`.
    pub name: String,
    /// Template for NodeName over instance facts: `{instance_id}`, `{instance_type}`,
    /// `{instance_family}` (e.g. `c5`), `{availability_zone}`, `{region}`,
    /// `{local_hostname_short}` (IMDS local-hostname before the first dot),
    /// `{local_ipv4_dashed}` (`10-0-0-1`), `{tag:<key>}` (an instance tag).
    pub name_template: String,
    /// Dynamic node (`slurmd -Z --conf ...`). `false`: the node is pre-declared in slurm.conf.
    pub dynamic: bool,
    /// Extra Slurm Features for dynamic nodes.
    pub features: Vec<String>,
    /// Add features from instance facts: instance type, availability zone, `spot`/`ondemand`.
    pub auto_features: bool,
    /// Slurm Weight of a dynamic node.
    pub weight: i64,
    /// RealMemory reserve: this percentage of physical memory is not offered to jobs, or
    /// `real_memory_reserve_mib`, whichever is larger, so the node never registers INVALID
    /// for "Low RealMemory".
    pub real_memory_reserve_percent: i64,
    /// RealMemory reserve in MiB: at least this much physical memory is not offered to
    /// jobs (the larger of this and `real_memory_reserve_percent` counts).
    pub real_memory_reserve_mib: i64,
    /// GPUs to declare as `Gres=gpu:N`: `auto` (count `/dev/nvidia<N>`, and wait for the
    /// count the instance type is known to have) or a number.
    pub gpus: String,
    /// How long to wait for GPU device files to appear at boot.
    pub gpu_wait: HumanDuration,
    /// The topology a dynamic node joins: `Topology=` in its `--conf` (Slurm 25.05+,
    /// slurm.conf(5) and topology.yaml(5)), `<topology>:<unit>` items separated by commas,
    /// e.g. `default:s1`. Empty (the default): none is given; an empty value never reaches
    /// slurmd, which would read the next word as the topology.
    pub topology: String,
}

impl Default for NodeSettings {
    fn default() -> Self {
        NodeSettings {
            role: Role::Compute,
            name: String::new(),
            name_template: "{local_hostname_short}".into(),
            dynamic: true,
            features: Vec::new(),
            auto_features: true,
            weight: 1,
            real_memory_reserve_percent: 3,
            real_memory_reserve_mib: 256,
            gpus: "auto".into(),
            gpu_wait: HumanDuration(Duration::from_secs(60)),
            topology: String::new(),
        }
    }
}

/// What an instance of the cluster is (`node.role`).
///
/// A login node runs `sackd` (Slurm 23.11+, sackd(8)) instead of slurmd: sackd fetches the
/// configuration from slurmctld in configless mode (into `/run/slurm/conf`, where the client
/// commands look) and answers the client commands' auth/slurm requests through its socket,
/// so users' `sinfo`, `sbatch` and `srun` work without the key and without munge. It is not
/// a Slurm node: it has no NodeName in slurmctld, is never drained, and is not upgraded
/// by the agent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// slurmd: a Slurm node that runs jobs.
    #[default]
    Compute,
    /// sackd: a login node (users submit from it).
    Login,
}

impl Role {
    /// The setting's word: `compute`, `login`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Compute => "compute",
            Role::Login => "login",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The node's shape: what an operator picks per launch, so tags may set it.
impl Classified for NodeSettings {
    const SECTION: &'static str = "node";
    const TRUST: &'static [KeyTrust] = &[
        // A login node group has its own launch template: user data says what the instance
        // is, a tag may not (a tag on a compute instance must not take its slurmd away).
        KeyTrust::user_data("role"),
        KeyTrust::tag("name"),
        KeyTrust::tag("name_template"),
        KeyTrust::tag("dynamic"),
        KeyTrust::tag("features"),
        KeyTrust::tag("auto_features"),
        KeyTrust::tag("weight"),
        KeyTrust::tag("real_memory_reserve_percent"),
        KeyTrust::tag("real_memory_reserve_mib"),
        KeyTrust::tag("gpus"),
        KeyTrust::tag("gpu_wait"),
        KeyTrust::tag("topology"),
    ];
}

/// Most MiB `node.real_memory_reserve_mib` takes (16 TiB).
const MAX_RESERVE_MIB: i64 = 16 * 1024 * 1024;
/// Most GPUs `node.gpus` declares.
const MAX_GPUS: u32 = 1024;

impl NodeSettings {
    /// Checks the values whose shape the types do not capture: the NodeName, template,
    /// features and topology, the memory reserves, the weight and the GPU count.
    ///
    /// # Errors
    /// [`InvalidKey`]: the dotted key and what is wrong.
    pub fn validate(&self) -> Result<(), InvalidKey> {
        let e = |k: &str, m: String| Err(InvalidKey::new(format!("node.{k}"), m));
        if !self.name.is_empty() {
            if let Err(m) = validate_node_name(&self.name) {
                return e("name", m.to_string());
            }
        }
        if self.name_template.trim().is_empty() {
            return e("name_template", "must not be empty".into());
        }
        if let Err(m) = check_template(&self.name_template) {
            return e("name_template", m.to_string());
        }
        for f in &self.features {
            if let Err(m) = validate_feature(f) {
                return e("features", m.to_string());
            }
        }
        if let Err(m) = validate_topology(&self.topology) {
            return e("topology", m.to_string());
        }
        if !(0..=100).contains(&self.real_memory_reserve_percent) {
            return e("real_memory_reserve_percent", "must be 0 to 100".into());
        }
        if !(0..=MAX_RESERVE_MIB).contains(&self.real_memory_reserve_mib) {
            return e(
                "real_memory_reserve_mib",
                format!("must be 0 to {MAX_RESERVE_MIB} (16 TiB)"),
            );
        }
        if !(0..=u32::MAX as i64).contains(&self.weight) {
            return e("weight", "must be 0 to 4294967295".into());
        }
        if self.gpus != "auto" && !self.gpus.parse::<u32>().is_ok_and(|n| n <= MAX_GPUS) {
            return e(
                "gpus",
                format!(
                    "expected \"auto\" or a number 0 to {MAX_GPUS}, got {:?}",
                    self.gpus
                ),
            );
        }
        Ok(())
    }
}

/// The one NodeName rule: `node.name` when set, else `node.name_template` expanded over
/// the instance facts. The result is checked against Slurm's NodeName characters.
///
/// # Errors
/// [`NodeSettingError`] ([`NodeSettingError::Name`] or [`NodeSettingError::Template`]), its
/// dotted key in [`NodeSettingError::key`].
pub fn node_name(
    node: &NodeSettings,
    facts: &InstanceIdentity,
) -> Result<String, NodeSettingError> {
    if node.name.is_empty() {
        Ok(expand_template(&node.name_template, facts)?)
    } else {
        validate_node_name(&node.name)?;
        Ok(node.name.clone())
    }
}

/// A `[node]` value (or its expansion) that cannot make the node definition
/// ([`node_name`], [`node_definition`]); [`NodeSettingError::key`] is its dotted key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeSettingError {
    /// `node.name` is not a NodeName.
    #[error(transparent)]
    Name(#[from] NodeNameError),
    /// `node.name_template` does not expand to a NodeName.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// A feature (of `node.features` or an automatic one) is not a Slurm Feature.
    #[error(transparent)]
    Feature(#[from] InvalidFeature),
    /// `node.topology` is not a topology.
    #[error(transparent)]
    Topology(#[from] InvalidTopology),
}

impl NodeSettingError {
    /// The dotted key of the value: `node.name`, `node.name_template`, `node.features`,
    /// `node.topology`.
    pub fn key(&self) -> &'static str {
        match self {
            NodeSettingError::Name(_) => "node.name",
            NodeSettingError::Template(_) => "node.name_template",
            NodeSettingError::Feature(_) => "node.features",
            NodeSettingError::Topology(_) => "node.topology",
        }
    }
}

/// What is wrong with a NodeName ([`validate_node_name`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeNameError {
    /// Empty.
    #[error("NodeName is empty")]
    Empty,
    /// Longer than [`NODE_NAME_MAX`].
    #[error("NodeName {name:?} is longer than {} characters", NODE_NAME_MAX)]
    TooLong {
        /// The name.
        name: String,
    },
    /// A word Slurm reads as something other than one node (`ALL`: every node; `DEFAULT`).
    #[error("NodeName {name:?} is a word Slurm reserves (ALL is every node, DEFAULT the defaults' line)")]
    Reserved {
        /// The name.
        name: String,
    },
    /// Holds a dot (an FQDN, most likely).
    #[error("NodeName {name:?} contains '.': use the short host name, not an FQDN")]
    Dot {
        /// The name.
        name: String,
    },
    /// Holds other characters than ASCII letters, digits, `-` and `_`, or starts with
    /// `-` or `_`.
    #[error(
        "NodeName {name:?} may only hold ASCII letters, digits, '-' and '_', and must start \
         with a letter or digit"
    )]
    Characters {
        /// The name.
        name: String,
    },
}

/// A Slurm Feature name that is not one ([`validate_feature`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Feature {feature:?} may only hold ASCII letters, digits, '.', '-' and '_' (at most 64)")]
pub struct InvalidFeature {
    /// The feature.
    pub feature: String,
}

/// A `node.topology` that is not one ([`validate_topology`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{topology:?} is not a topology: <topology>:<unit>[,...] of ASCII letters, digits, '.', '-' and '_' (e.g. default:s1)")]
pub struct InvalidTopology {
    /// The value.
    pub topology: String,
}

/// Why a NodeName template does not expand to a NodeName ([`expand_template`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// A `{` without its `}`.
    #[error("unclosed '{{' in {template:?}")]
    Unclosed {
        /// The template.
        template: String,
    },
    /// `{local_ipv4_dashed}` on an instance without an IPv4 address.
    #[error(
        "{{local_ipv4_dashed}} in {template:?} needs the instance's IPv4 address, \
         and instance metadata has no local-ipv4 (an IPv6-only instance): use \
         another placeholder"
    )]
    NoIpv4 {
        /// The template.
        template: String,
    },
    /// `{tag:<key>}` of a tag the instance does not have.
    #[error("instance tag {tag:?} is not set")]
    TagNotSet {
        /// The tag key.
        tag: String,
    },
    /// `{tag:<key>}` on an instance whose metadata serves no tags at all.
    #[error(
        "instance tag {tag:?} cannot be read: this instance's metadata serves no tags \
         (InstanceMetadataTags is off in its launch template or metadata options; EC2 refuses \
         to turn it on while any tag key holds '/' or a space): turn it on, read the tags \
         through EC2 with imds.tags = \"describe-tags\" (needs ec2:DescribeTags), or use \
         another placeholder"
    )]
    TagsUnavailable {
        /// The tag key.
        tag: String,
    },
    /// A placeholder that is none of the known ones.
    #[error(
        "unknown placeholder {{{placeholder}}} in {template:?}: expected {{instance_id}}, \
         {{instance_type}}, {{instance_family}}, {{availability_zone}}, {{region}}, \
         {{local_hostname_short}}, {{local_ipv4_dashed}} or {{tag:<key>}}"
    )]
    UnknownPlaceholder {
        /// The placeholder, without braces.
        placeholder: String,
        /// The template.
        template: String,
    },
    /// The expansion is not a NodeName.
    #[error(transparent)]
    Name(#[from] NodeNameError),
}

/// Longest NodeName accepted. Slurm itself allows more, but host names over 63 characters
/// break DNS labels and most tooling.
pub const NODE_NAME_MAX: usize = 63;

/// Checks a Slurm NodeName: ASCII letters, digits, `-` and `_`, starting with a letter or
/// digit, at most [`NODE_NAME_MAX`] characters. Dots are refused: a NodeName with a dot is
/// almost always an FQDN by accident, and Slurm's hostlist expressions treat `.` oddly.
///
/// # Errors
/// [`NodeNameError`]: what is wrong, with the name.
pub fn validate_node_name(name: &str) -> Result<(), NodeNameError> {
    if name.is_empty() {
        return Err(NodeNameError::Empty);
    }
    let owned = || name.to_string();
    if name.len() > NODE_NAME_MAX {
        return Err(NodeNameError::TooLong { name: owned() });
    }
    if name.contains('.') {
        return Err(NodeNameError::Dot { name: owned() });
    }
    if is_reserved_node_name(name) {
        return Err(NodeNameError::Reserved { name: owned() });
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(NodeNameError::Characters { name: owned() });
    }
    Ok(())
}

/// Words Slurm reads as something other than one node, in any case: `ALL` (every node, in
/// `scontrol update NodeName=` and `scontrol delete NodeName=`: slurmctld's
/// `nodespec_to_hostlist`) and `DEFAULT` (slurm.conf's `NodeName=DEFAULT` line).
pub const RESERVED_NODE_NAMES: [&str; 2] = ["ALL", "DEFAULT"];

/// Whether `name` is one of [`RESERVED_NODE_NAMES`], in any case.
pub fn is_reserved_node_name(name: &str) -> bool {
    RESERVED_NODE_NAMES
        .iter()
        .any(|r| r.eq_ignore_ascii_case(name))
}

/// Checks a Slurm Feature name: ASCII letters, digits, `.`, `-`, `_`, starting with a letter
/// or digit, at most 64 characters (no spaces, `=`, `,`, `&`, `|` or brackets, which Slurm
/// uses as separators or operators in constraints).
///
/// # Errors
/// [`InvalidFeature`].
pub fn validate_feature(f: &str) -> Result<(), InvalidFeature> {
    let ok = !f.is_empty()
        && f.len() <= 64
        && f.starts_with(|c: char| c.is_ascii_alphanumeric())
        && f.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(InvalidFeature {
            feature: f.to_string(),
        })
    }
}

/// Checks `node.topology`: empty, or `<topology>:<unit>` items separated by commas, each
/// name of ASCII letters, digits, `.`, `-` and `_` (at most 256 characters in all).
///
/// # Errors
/// [`InvalidTopology`].
pub fn validate_topology(t: &str) -> Result<(), InvalidTopology> {
    if t.is_empty() {
        return Ok(());
    }
    let name = |n: &str| {
        !n.is_empty()
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
    };
    let ok = t.len() <= 256
        && t.split(',').all(|item| {
            item.split_once(':')
                .is_some_and(|(topo, unit)| name(topo) && name(unit))
        });
    if ok {
        Ok(())
    } else {
        Err(InvalidTopology {
            topology: t.to_string(),
        })
    }
}

/// The placeholders of `node.name_template` besides `{tag:<key>}`.
pub const TEMPLATE_PLACEHOLDERS: [&str; 7] = [
    "instance_id",
    "instance_type",
    "instance_family",
    "availability_zone",
    "region",
    "local_hostname_short",
    "local_ipv4_dashed",
];

/// Checks a NodeName template's shape without the instance's facts: every `{` closed,
/// every placeholder one of [`TEMPLATE_PLACEHOLDERS`] or `{tag:<key>}` with a key. What
/// `config show` and every settings check refuse, as bootstrap's expansion does.
///
/// # Errors
/// [`TemplateError::Unclosed`] or [`TemplateError::UnknownPlaceholder`].
pub fn check_template(template: &str) -> Result<(), TemplateError> {
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        let after = &rest[start + 1..];
        let end = after.find('}').ok_or_else(|| TemplateError::Unclosed {
            template: template.to_string(),
        })?;
        let name = &after[..end];
        let known = TEMPLATE_PLACEHOLDERS.contains(&name)
            || name.strip_prefix("tag:").is_some_and(|k| !k.is_empty());
        if !known {
            return Err(TemplateError::UnknownPlaceholder {
                placeholder: name.to_string(),
                template: template.to_string(),
            });
        }
        rest = &after[end + 1..];
    }
    Ok(())
}

/// Expands the NodeName template over instance facts and checks the result.
///
/// # Errors
/// [`TemplateError`]: an unknown placeholder, a missing tag, or the invalid result.
pub fn expand_template(template: &str, id: &InstanceIdentity) -> Result<String, TemplateError> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let end = after.find('}').ok_or_else(|| TemplateError::Unclosed {
            template: template.to_string(),
        })?;
        let name = &after[..end];
        let value = match name {
            "instance_id" => id.instance_id.clone(),
            "instance_type" => id.instance_type.clone(),
            "instance_family" => id
                .instance_type
                .split('.')
                .next()
                .unwrap_or_default()
                .to_string(),
            "availability_zone" => id.availability_zone.clone(),
            "region" => id.region.clone(),
            "local_hostname_short" => id
                .local_hostname
                .split('.')
                .next()
                .unwrap_or_default()
                .to_string(),
            "local_ipv4_dashed" if id.local_ipv4.is_empty() => {
                return Err(TemplateError::NoIpv4 {
                    template: template.to_string(),
                })
            }
            "local_ipv4_dashed" => id.local_ipv4.replace('.', "-"),
            other => match other.strip_prefix("tag:") {
                Some(key) if !id.tags_available && id.tags.is_empty() => {
                    return Err(TemplateError::TagsUnavailable {
                        tag: key.to_string(),
                    })
                }
                Some(key) => id
                    .tags
                    .get(key)
                    .cloned()
                    .ok_or_else(|| TemplateError::TagNotSet {
                        tag: key.to_string(),
                    })?,
                None => {
                    return Err(TemplateError::UnknownPlaceholder {
                        placeholder: other.to_string(),
                        template: template.to_string(),
                    })
                }
            },
        };
        out.push_str(&value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    validate_node_name(&out)?;
    Ok(out)
}

/// The node definition bootstrap hands to slurmd.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NodeDefinition {
    /// Slurm NodeName (`slurmd -N`).
    pub node_name: String,
    /// For dynamic nodes, the `--conf` line, e.g.
    /// `CPUs=4 Boards=1 Sockets=1 CoresPerSocket=2 ThreadsPerCore=2 RealMemory=7400 Features=c5.xlarge,us-east-1a,ondemand Weight=1`.
    /// `None` for nodes pre-declared in slurm.conf.
    pub dynamic_conf: Option<String>,
}

impl NodeDefinition {
    /// Adds `TmpDisk=<mib>` (Slurm's `TmpDisk`, MiB: the size of the node-local scratch
    /// its `TmpFS` names) to a dynamic node's `--conf` line, replacing one already there.
    /// A node pre-declared in slurm.conf is unchanged: its `TmpDisk` is slurm.conf's.
    pub fn with_tmp_disk(mut self, mib: u64) -> NodeDefinition {
        if let Some(conf) = self.dynamic_conf.as_mut() {
            let kept: Vec<&str> = conf
                .split(' ')
                .filter(|w| !w.starts_with("TmpDisk="))
                .collect();
            *conf = format!("{} TmpDisk={mib}", kept.join(" "));
        }
        self
    }
}

/// RealMemory to declare: physical memory less the larger of the two reserves.
pub fn real_memory_mib(memory_mib: u64, reserve_percent: u64, reserve_mib: u64) -> u64 {
    let by_percent = memory_mib * reserve_percent.min(100) / 100;
    memory_mib
        .saturating_sub(by_percent.max(reserve_mib))
        .max(1)
}

/// Why this host's node definition could not be made ([`detect`]).
#[derive(Debug, thiserror::Error)]
pub enum DefinitionError {
    /// The GPUs the instance type has did not appear.
    #[error(transparent)]
    Gpu(#[from] GpuWaitError),
    /// A setting's value (or its expansion) is invalid.
    #[error("{}: {}", .0.key(), .0)]
    Setting(#[from] NodeSettingError),
}

/// The node definition of this host: its CPUs and memory ([`HostFacts::detect`]), and for
/// a dynamic node the GPUs (`node.gpus`, or the device files in `dev_dir`, waiting up to
/// `node.gpu_wait` for the count the instance type has), over the instance facts.
///
/// # Errors
/// [`DefinitionError`].
pub async fn detect(
    node: &NodeSettings,
    id: &InstanceIdentity,
    dev_dir: &Path,
) -> Result<NodeDefinition, DefinitionError> {
    let host = HostFacts::detect();
    let probe = GpuProbe {
        dev_dir: dev_dir.to_path_buf(),
        wait: node.gpu_wait.0,
    };
    let configured_gpus = node.gpus.parse::<u32>().ok();
    let gpus = if node.dynamic {
        probe.gpus(configured_gpus, &id.instance_type).await?
    } else {
        0
    };
    Ok(node_definition(node, id, &host, gpus)?)
}

/// Builds the node definition.
///
/// # Errors
/// [`NodeSettingError`]: the value (or expansion) that is invalid; its dotted key in
/// [`NodeSettingError::key`].
pub fn node_definition(
    s: &NodeSettings,
    id: &InstanceIdentity,
    host: &HostFacts,
    gpus: u32,
) -> Result<NodeDefinition, NodeSettingError> {
    let node_name = node_name(s, id)?;
    if !s.dynamic {
        return Ok(NodeDefinition {
            node_name,
            dynamic_conf: None,
        });
    }
    let mut features: Vec<String> = Vec::new();
    if s.auto_features {
        features.push(id.instance_type.clone());
        features.push(id.availability_zone.clone());
        features.push(if id.spot { "spot" } else { "ondemand" }.to_string());
    }
    features.extend(s.features.iter().cloned());
    features.retain(|f| !f.is_empty());
    features.dedup();
    for f in &features {
        validate_feature(f)?;
    }
    let mem = real_memory_mib(
        host.memory_mib,
        u64::try_from(s.real_memory_reserve_percent).unwrap_or(0),
        u64::try_from(s.real_memory_reserve_mib).unwrap_or(0),
    );
    let mut conf = format!(
        "CPUs={} Boards=1 Sockets={} CoresPerSocket={} ThreadsPerCore={} RealMemory={mem}",
        host.cpus, host.sockets, host.cores_per_socket, host.threads_per_core
    );
    if gpus > 0 {
        conf.push_str(&format!(" Gres=gpu:{gpus}"));
    }
    if !features.is_empty() {
        conf.push_str(&format!(" Features={}", features.join(",")));
    }
    conf.push_str(&format!(" Weight={}", s.weight));
    // Never an empty `Topology=` (slurmd would take the next word for it).
    let topology = s.topology.trim();
    if !topology.is_empty() {
        validate_topology(topology)?;
        conf.push_str(&format!(" Topology={topology}"));
    }
    Ok(NodeDefinition {
        node_name,
        dynamic_conf: Some(conf),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn topology_is_added_only_when_given_and_valid() {
        assert!(validate_topology("").is_ok());
        assert!(validate_topology("default:s1").is_ok());
        assert!(validate_topology("t1:s1,t2:blk-2").is_ok());
        for bad in ["default", ":s1", "t:", "a:b c", "a:b;x", "a:b,", "a:b:c"] {
            assert!(validate_topology(bad).is_err(), "{bad:?}");
        }
        let mut s = NodeSettings::default();
        let conf = |s: &NodeSettings| {
            node_definition(s, &id(), &HOST, 0)
                .unwrap()
                .dynamic_conf
                .unwrap()
        };
        assert!(!conf(&s).contains("Topology"), "{}", conf(&s));
        s.topology = "  ".into();
        assert!(
            !conf(&s).contains("Topology"),
            "an empty topology never reaches slurmd"
        );
        s.topology = "default:s1".into();
        assert!(
            conf(&s).ends_with(" Weight=1 Topology=default:s1"),
            "{}",
            conf(&s)
        );
        s.topology = "bad value".into();
        assert_eq!(
            node_definition(&s, &id(), &HOST, 0).unwrap_err().key(),
            "node.topology"
        );
    }

    fn id() -> InstanceIdentity {
        InstanceIdentity {
            instance_id: "i-0123456789abcdef0".into(),
            instance_type: "c5.xlarge".into(),
            region: "us-east-1".into(),
            availability_zone: "us-east-1a".into(),
            local_ipv4: "10.0.0.12".into(),
            local_hostname: "ip-10-0-0-12.ec2.internal".into(),
            ami_id: "ami-0123456789abcdef0".into(),
            spot: true,
            tags: [("Queue".to_string(), "gpu".to_string())].into(),
            tags_available: true,
            user_data: None,
            launched_at: None,
        }
    }

    const HOST: HostFacts = HostFacts {
        cpus: 4,
        sockets: 1,
        cores_per_socket: 2,
        threads_per_core: 2,
        memory_mib: 7_800,
    };

    #[test]
    fn template_placeholders() {
        assert_eq!(
            expand_template("{local_hostname_short}", &id()).unwrap(),
            "ip-10-0-0-12"
        );
        assert_eq!(
            expand_template("{tag:Queue}-{instance_family}-{local_ipv4_dashed}", &id()).unwrap(),
            "gpu-c5-10-0-0-12"
        );
        assert!(expand_template("{nope}", &id())
            .unwrap_err()
            .to_string()
            .contains("unknown placeholder"));
        // IPv6-only: only a template that needs the IPv4 address fails, and says why.
        let mut v6 = id();
        v6.local_ipv4.clear();
        assert_eq!(
            expand_template("{local_hostname_short}", &v6).unwrap(),
            "ip-10-0-0-12"
        );
        let e = expand_template("n-{local_ipv4_dashed}", &v6)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("IPv6-only") && e.contains("{local_ipv4_dashed}"),
            "{e}"
        );
        let e = expand_template("{tag:Missing}", &id())
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"Missing\" is not set"), "{e}");
        // Tags off in metadata: said so, not "not set".
        let off = InstanceIdentity {
            tags: Default::default(),
            tags_available: false,
            ..id()
        };
        let e = expand_template("{tag:Name}", &off).unwrap_err().to_string();
        assert!(
            e.contains("serves no tags") && e.contains("InstanceMetadataTags"),
            "{e}"
        );
        // The raw hostname is an FQDN: refused, never used by accident.
        let e = expand_template("{instance_type}", &id())
            .unwrap_err()
            .to_string();
        assert!(e.contains("FQDN"), "{e}");
    }

    #[test]
    fn the_node_name_does_not_depend_on_the_kernel_hostname() {
        // IMDS local-hostname may be the FQDN while the kernel's hostname is still short (or
        // the other way round during boot); NodeName comes from IMDS only.
        let mut a = id();
        let mut b = id();
        a.local_hostname = "ip-10-0-0-12.ec2.internal".into();
        b.local_hostname = "ip-10-0-0-12".into();
        let s = NodeSettings::default();
        assert_eq!(
            node_definition(&s, &a, &HOST, 0).unwrap().node_name,
            node_definition(&s, &b, &HOST, 0).unwrap().node_name
        );
    }

    #[test]
    fn bad_node_names_are_rejected() {
        for bad in [
            "a b",
            "a=b",
            "a\nb",
            "a;rm -rf /",
            "nöde",
            "$(id)",
            "-lead",
            "",
            "a.b.c",
            "x Feature=evil",
            "ALL",
            "all",
            "DEFAULT",
            "Default",
        ] {
            assert!(validate_node_name(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(
            validate_node_name("All").unwrap_err().to_string(),
            "NodeName \"All\" is a word Slurm reserves (ALL is every node, DEFAULT the defaults' line)"
        );
        for good in [
            "node-1",
            "gpu_07",
            "i-0123456789abcdef0",
            "allnodes",
            "default-1",
        ] {
            validate_node_name(good).unwrap();
        }
    }

    #[test]
    fn bad_features_are_rejected() {
        for bad in ["a b", "a=b", "a,b", "a\nb", "a|b", "a&b", "é", "[x]", ""] {
            assert!(validate_feature(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn tmp_disk_in_the_conf_line() {
        let d = NodeDefinition {
            node_name: "n1".into(),
            dynamic_conf: Some("CPUs=4 Weight=1".into()),
        };
        let d = d.with_tmp_disk(7000).with_tmp_disk(7100);
        assert_eq!(
            d.dynamic_conf.as_deref(),
            Some("CPUs=4 Weight=1 TmpDisk=7100")
        );
        let fixed = NodeDefinition {
            node_name: "n1".into(),
            dynamic_conf: None,
        };
        assert_eq!(fixed.with_tmp_disk(7000).dynamic_conf, None);
    }

    #[test]
    fn dynamic_conf_line() {
        let mut s = NodeSettings::default();
        s.features = vec!["efa".into()];
        s.weight = 10;
        let d = node_definition(&s, &id(), &HOST, 2).unwrap();
        assert_eq!(d.node_name, "ip-10-0-0-12");
        assert_eq!(
            d.dynamic_conf.unwrap(),
            "CPUs=4 Boards=1 Sockets=1 CoresPerSocket=2 ThreadsPerCore=2 RealMemory=7544 \
             Gres=gpu:2 Features=c5.xlarge,us-east-1a,spot,efa Weight=10"
        );
        s.dynamic = false;
        assert_eq!(
            node_definition(&s, &id(), &HOST, 0).unwrap().dynamic_conf,
            None
        );
    }

    #[test]
    fn a_tag_with_spaces_cannot_add_keys() {
        let mut bad = id();
        bad.tags.insert("Name".into(), "x RealMemory=999999".into());
        let mut s = NodeSettings::default();
        s.name_template = "{tag:Name}".into();
        let e = node_definition(&s, &bad, &HOST, 0).unwrap_err();
        assert_eq!(e.key(), "node.name_template");
        assert_eq!(
            DefinitionError::from(e).to_string(),
            "node.name_template: NodeName \"x RealMemory=999999\" may only hold ASCII letters, \
             digits, '-' and '_', and must start with a letter or digit"
        );
        s.name_template = "{local_hostname_short}".into();
        s.features = vec!["ok Weight=0".into()];
        let key = node_definition(&s, &id(), &HOST, 0).unwrap_err().key();
        assert_eq!(key, "node.features");
    }

    #[test]
    fn real_memory_reserve_is_the_larger_of_percent_and_mib() {
        assert_eq!(real_memory_mib(7_800, 3, 256), 7_544);
        assert_eq!(real_memory_mib(100_000, 3, 256), 97_000);
        assert_eq!(real_memory_mib(100, 3, 256), 1);
    }
}
