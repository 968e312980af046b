//! The shape of the service's `nodeLifecycleActions` (API version 2023-02-10), as this agent
//! keeps it: serialized in the service's own JSON member names (camelCase), so the
//! registration record reads like the API answer.

use serde::{Deserialize, Serialize};

/// `nodeLifecycleActions`: scripts per stage and the caching policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeLifecycleActions {
    /// `CACHE_ONCE` or `REFRESH_ON_REBOOT`.
    pub script_caching_policy: String,
    /// The stages.
    #[serde(default)]
    pub stages: Stages,
}

/// `stages`: `nodeBootstrapped` (after registration, before slurmd starts) and `nodeReady`
/// (after the node is available in slurmctld).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Stages {
    /// Scripts run before slurmd starts, in order.
    #[serde(default)]
    pub node_bootstrapped: Vec<Script>,
    /// Scripts run once the node is available, in order.
    #[serde(default)]
    pub node_ready: Vec<Script>,
}

/// One script (`NodeLifecycleScript`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Script {
    /// Name (also the name of its log file).
    pub name: String,
    /// Where it comes from and its checksum.
    pub script_source: ScriptSource,
    /// Arguments, at most 20 of at most 256 characters each.
    #[serde(default)]
    pub arguments: Vec<String>,
    /// `FIRST_BOOT_ONLY` or `EVERY_BOOT`.
    pub execution_policy: String,
    /// `TERMINATE`, `STOP_SEQUENCE` or `CONTINUE`.
    pub on_error: String,
}

/// `scriptSource`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScriptSource {
    /// `s3://bucket/key` (the service), or this agent's `ssm:<parameter>` and
    /// `file:<absolute path>`.
    pub script_location: String,
    /// SHA-256 of the script, 64 hex digits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
    /// S3 object version.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "s3VersionId"
    )]
    pub s3_version_id: Option<String>,
}

impl From<&aws_sdk_pcs::types::NodeLifecycleActions> for NodeLifecycleActions {
    fn from(a: &aws_sdk_pcs::types::NodeLifecycleActions) -> Self {
        let scripts = |list: &[aws_sdk_pcs::types::NodeLifecycleScript]| -> Vec<Script> {
            list.iter()
                .map(|s| Script {
                    name: s.name().to_string(),
                    script_source: ScriptSource {
                        script_location: s
                            .script_source()
                            .map(|src| src.script_location().to_string())
                            .unwrap_or_default(),
                        checksum: s
                            .script_source()
                            .and_then(|src| src.checksum())
                            .map(str::to_string),
                        s3_version_id: s
                            .script_source()
                            .and_then(|src| src.s3_version_id())
                            .map(str::to_string),
                    },
                    arguments: s.arguments().to_vec(),
                    execution_policy: s.execution_policy().as_str().to_string(),
                    on_error: s.on_error().as_str().to_string(),
                })
                .collect()
        };
        NodeLifecycleActions {
            script_caching_policy: a.script_caching_policy().as_str().to_string(),
            stages: Stages {
                node_bootstrapped: a
                    .stages()
                    .map(|s| scripts(s.node_bootstrapped()))
                    .unwrap_or_default(),
                node_ready: a
                    .stages()
                    .map(|s| scripts(s.node_ready()))
                    .unwrap_or_default(),
            },
        }
    }
}
