//! `[cloudwatch]`: the Amazon CloudWatch agent's configuration
//! (`amazon-cloudwatch-agent.json`), rendered at boot by `slurm-node-agent config
//! cloudwatch --write` (the unit `slurm-node-agent-cloudwatch-config.service`, ordered
//! before `amazon-cloudwatch-agent.service`), so that the log groups carry the cluster's
//! name and the site's retention.
//!
//! What it ships, one stream per instance (`{instance_id}`, the CloudWatch agent's own
//! placeholder), each log to the group `log_group_template` names:
//!
//! | log | from |
//! |---|---|
//! | `agent` | the journal of `slurm-node-agent.service` and `slurm-node-agent-bootstrap.service` |
//! | `slurm` | the journal of `slurmd.service` and `sackd.service` |
//! | `kernel` | the kernel's log (`_TRANSPORT=kernel`: Xid, NVRM, EFA and LNet errors) |
//! | `cloud-init` | `/var/log/cloud-init.log` and `/var/log/cloud-init-output.log` |
//!
//! The journal is read by the CloudWatch agent itself (`logs_collected.journald`), so no
//! file of ours grows for it; journald caps its own files (`SystemMaxUse`). Host metrics
//! (memory, the root file system), the agent's Prometheus textfiles where the image serves
//! them, and the CloudWatch agent's native `nvidia_smi` and `efa` metrics where the
//! instance has NVIDIA GPUs or EFA devices.
//!
//! The format is the CloudWatch agent's (its JSON Schema, draft-04:
//! `translator/config/schema.json` of aws/amazon-cloudwatch-agent; the suite validates
//! what this renders against it).
//!
//! Floor 1 (no outside system): over `section`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::section::{Classified, InvalidKey, KeyTrust};

/// `cloudwatch.retention_days`: the values CloudWatch Logs accepts (`PutRetentionPolicy`),
/// and `-1`, the CloudWatch agent's "never expire".
pub const RETENTION_DAYS: [i32; 23] = [
    -1, 1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557,
    2922, 3288, 3653,
];

/// The logs shipped, as `{log}` names them in `cloudwatch.log_group_template`.
pub const LOGS: [&str; 4] = ["agent", "slurm", "kernel", "cloud-init"];

/// `[cloudwatch]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CloudWatchSettings {
    /// Where `config cloudwatch --write` writes the CloudWatch agent's configuration. Empty
    /// (the default): nothing is written; an image built with the CloudWatch agent sets
    /// `/opt/aws/amazon-cloudwatch-agent/etc/amazon-cloudwatch-agent.json`.
    pub config_file: PathBuf,
    /// The log group of each log: `{cluster}` is the cluster's name
    /// (`cloudwatch.cluster_name`), `{log}` one of `agent`, `slurm`, `kernel`,
    /// `cloud-init`. Must contain `{log}` (each log its own group, one stream per
    /// instance in each). After the placeholders: 1 to 512 of `A-Z a-z 0-9 _ - / . #`
    /// (CloudWatch Logs' rule).
    pub log_group_template: String,
    /// The cluster's name in the log groups. Empty (the default): `pcs.cluster_id` in the
    /// managed join, else `slurm` (a warning names this key).
    pub cluster_name: String,
    /// Days CloudWatch Logs keeps the events of the log groups the CloudWatch agent
    /// creates: 1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827,
    /// 2192, 2557, 2922, 3288 or 3653, or -1 (never expire). Needs `logs:PutRetentionPolicy`.
    pub retention_days: i32,
    /// The Prometheus scrape configuration of the agent's textfile metrics (the image
    /// writes it where it serves them). Empty: no Prometheus metrics.
    pub prometheus_config: PathBuf,
}

impl Default for CloudWatchSettings {
    fn default() -> Self {
        CloudWatchSettings {
            config_file: PathBuf::new(),
            log_group_template: "/slurm/{cluster}/{log}".into(),
            cluster_name: String::new(),
            retention_days: 30,
            prometheus_config: PathBuf::new(),
        }
    }
}

/// The files are the image's; the names and the retention are the launch's (user data),
/// the cluster's name may come from a tag.
impl Classified for CloudWatchSettings {
    const SECTION: &'static str = "cloudwatch";
    const TRUST: &'static [KeyTrust] = &[
        KeyTrust::image("config_file"),
        KeyTrust::user_data("log_group_template"),
        KeyTrust::tag("cluster_name"),
        KeyTrust::user_data("retention_days"),
        KeyTrust::image("prometheus_config"),
    ];
}

/// A log group name as CloudWatch Logs allows it: 1 to 512 of `A-Z a-z 0-9 _ - / . #`.
fn valid_group(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 512
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '/' | '.' | '#'))
}

impl CloudWatchSettings {
    /// Checks the template (its placeholders, and the group names it gives with this
    /// cluster name), the cluster's name and the retention.
    ///
    /// # Errors
    /// [`InvalidKey`] naming the key, the value and what is allowed.
    pub fn validate(&self) -> Result<(), InvalidKey> {
        let t = &self.log_group_template;
        if !t.contains("{log}") {
            return Err(InvalidKey::new(
                "cloudwatch.log_group_template",
                format!(
                    "{t:?} has no {{log}}: each log needs its own group (one stream per \
                     instance in each), e.g. \"/slurm/{{cluster}}/{{log}}\""
                ),
            ));
        }
        let rest = t.replace("{cluster}", "").replace("{log}", "");
        if let Some(p) = rest.find('{').map(|i| &rest[i..]) {
            let p = p.split_inclusive('}').next().unwrap_or(p);
            return Err(InvalidKey::new(
                "cloudwatch.log_group_template",
                format!("{t:?}: unknown placeholder {p} (known: {{cluster}}, {{log}})"),
            ));
        }
        if !self.cluster_name.is_empty() && !valid_group(&self.cluster_name) {
            return Err(InvalidKey::new(
                "cloudwatch.cluster_name",
                format!(
                    "{:?} has characters a CloudWatch log group name cannot hold \
                     (allowed: A-Z a-z 0-9 _ - / . #)",
                    self.cluster_name
                ),
            ));
        }
        let sample = self.group("slurm", "kernel");
        if !valid_group(&sample) {
            return Err(InvalidKey::new(
                "cloudwatch.log_group_template",
                format!(
                    "{t:?} gives the log group {sample:?}, which CloudWatch Logs refuses \
                     (1 to 512 of A-Z a-z 0-9 _ - / . #)"
                ),
            ));
        }
        if !RETENTION_DAYS.contains(&self.retention_days) {
            return Err(InvalidKey::new(
                "cloudwatch.retention_days",
                format!(
                    "{} is not a retention CloudWatch Logs accepts: one of 1, 3, 5, 7, 14, \
                     30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, \
                     2922, 3288, 3653, or -1 (never expire)",
                    self.retention_days
                ),
            ));
        }
        Ok(())
    }

    /// The log group of `log` for `cluster`.
    pub fn group(&self, cluster: &str, log: &str) -> String {
        self.log_group_template
            .replace("{cluster}", cluster)
            .replace("{log}", log)
    }
}

/// Where the cluster's name came from ([`cluster_name`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterFrom {
    /// `cloudwatch.cluster_name`.
    Setting,
    /// `pcs.cluster_id`.
    Pcs,
    /// Neither: `slurm`.
    Fallback,
}

/// The cluster's name in the log groups: `cloudwatch.cluster_name`, else `pcs_cluster`
/// (`pcs.cluster_id`) when it is a valid group name part, else `slurm`.
pub fn cluster_name(s: &CloudWatchSettings, pcs_cluster: &str) -> (String, ClusterFrom) {
    if !s.cluster_name.is_empty() {
        (s.cluster_name.clone(), ClusterFrom::Setting)
    } else if !pcs_cluster.is_empty() && valid_group(pcs_cluster) {
        (pcs_cluster.to_string(), ClusterFrom::Pcs)
    } else {
        ("slurm".into(), ClusterFrom::Fallback)
    }
}

/// What the instance has that the CloudWatch agent measures natively.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Devices {
    /// NVIDIA GPUs (`nvidia_smi` metrics).
    pub nvidia_gpus: bool,
    /// EFA devices (`efa` metrics).
    pub efa: bool,
}

impl Devices {
    /// Looks in `sys` (`/sys`) and `dev` (`/dev`): a device `nvidia<N>`, and an
    /// InfiniBand device whose name starts with `efa` or `rdmap` (EFA's names).
    pub fn look(sys: &Path, dev: &Path) -> Devices {
        let any = |dir: &Path, f: &dyn Fn(&str) -> bool| {
            std::fs::read_dir(dir)
                .is_ok_and(|rd| rd.flatten().any(|e| e.file_name().to_str().is_some_and(f)))
        };
        Devices {
            nvidia_gpus: any(dev, &|n| {
                n.strip_prefix("nvidia")
                    .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()))
            }),
            efa: any(&sys.join("class/infiniband"), &|n| {
                n.starts_with("efa") || n.starts_with("rdmap")
            }),
        }
    }
}

/// The CloudWatch agent's configuration for `cluster`.
pub fn render(s: &CloudWatchSettings, cluster: &str, devices: Devices) -> Value {
    let group = |log: &str| s.group(cluster, log);
    let journald = |log: &str, units: &[&str]| {
        json!({
            "log_group_name": group(log),
            "log_stream_name": "{instance_id}",
            "retention_in_days": s.retention_days,
            "units": units,
        })
    };
    let kernel = json!({
        "log_group_name": group("kernel"),
        "log_stream_name": "{instance_id}",
        "retention_in_days": s.retention_days,
        "matches": [{ "_TRANSPORT": "kernel" }],
    });
    let file = |path: &str| {
        json!({
            "file_path": path,
            "log_group_name": group("cloud-init"),
            "log_stream_name": "{instance_id}",
            "retention_in_days": s.retention_days,
            "timezone": "UTC",
        })
    };
    let mut metrics = serde_json::Map::new();
    metrics.insert(
        "mem".into(),
        json!({ "measurement": ["mem_used_percent", "mem_available"] }),
    );
    metrics.insert(
        "disk".into(),
        json!({ "measurement": ["used_percent", "inodes_free"], "resources": ["/"] }),
    );
    if devices.nvidia_gpus {
        metrics.insert(
            "nvidia_smi".into(),
            json!({ "measurement": [
                "utilization_gpu", "utilization_memory", "memory_used", "memory_total",
                "temperature_gpu", "power_draw"
            ] }),
        );
    }
    if devices.efa {
        metrics.insert(
            "efa".into(),
            json!({ "measurement": [
                "rx_bytes", "tx_bytes", "rx_dropped", "rdma_read_bytes", "rdma_write_bytes"
            ] }),
        );
    }
    let mut logs = json!({
        "logs_collected": {
            "journald": { "collect_list": [
                journald("agent", &["slurm-node-agent.service", "slurm-node-agent-bootstrap.service"]),
                journald("slurm", &["slurmd.service", "sackd.service"]),
                kernel,
            ] },
            "files": { "collect_list": [
                file("/var/log/cloud-init.log"),
                file("/var/log/cloud-init-output.log"),
            ] },
        },
    });
    if !s.prometheus_config.as_os_str().is_empty() {
        logs["metrics_collected"] = json!({
            "prometheus": {
                "log_group_name": group("prometheus"),
                "prometheus_config_path": s.prometheus_config.display().to_string(),
                "emf_processor": {
                    "metric_namespace": "SlurmNodeAgent",
                    "metric_declaration": [
                        {
                            "source_labels": ["job"],
                            "label_matcher": "^slurm-node-agent$",
                            "dimensions": [["node"]],
                            "metric_selectors": [
                                "^slurm_node_agent_health_healthy$",
                                "^slurm_node_agent_health_run_duration_seconds$",
                                "^slurm_node_agent_drain_phase$",
                                "^slurm_node_agent_bootstrap_success$",
                                "^slurm_node_agent_bootstrap_duration_seconds$"
                            ]
                        },
                        {
                            "source_labels": ["job"],
                            "label_matcher": "^slurm-node-agent$",
                            "dimensions": [["node", "check"]],
                            "metric_selectors": [
                                "^slurm_node_agent_health_check_ok$",
                                "^slurm_node_agent_health_check_timed_out$"
                            ]
                        }
                    ]
                }
            }
        });
    }
    json!({
        "agent": { "run_as_user": "root" },
        "metrics": {
            "namespace": "SlurmNodeAgent",
            "append_dimensions": { "InstanceId": "${aws:InstanceId}" },
            "metrics_collected": metrics,
        },
        "logs": logs,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn groups_follow_the_template_and_bad_values_name_their_key() {
        let mut s = CloudWatchSettings::default();
        s.validate().unwrap();
        assert_eq!(s.group("hpc-a", "kernel"), "/slurm/hpc-a/kernel");
        s.log_group_template = "/slurm/{cluster}".into();
        let e = s.validate().unwrap_err();
        assert_eq!(e.key, "cloudwatch.log_group_template");
        assert!(e.message.contains("{log}"), "{}", e.message);
        s.log_group_template = "/slurm/{cluster}/{log}/{region}".into();
        let e = s.validate().unwrap_err();
        assert!(
            e.message.contains("unknown placeholder {region}"),
            "{}",
            e.message
        );
        s.log_group_template = "/slurm {cluster}/{log}".into();
        let e = s.validate().unwrap_err();
        assert!(e.message.contains("refuses"), "{}", e.message);
        s.log_group_template = CloudWatchSettings::default().log_group_template;
        s.retention_days = 31;
        let e = s.validate().unwrap_err();
        assert_eq!(e.key, "cloudwatch.retention_days");
        s.retention_days = 90;
        s.cluster_name = "my cluster".into();
        assert_eq!(s.validate().unwrap_err().key, "cloudwatch.cluster_name");
    }

    #[test]
    fn the_cluster_name_is_the_setting_then_pcs_then_slurm() {
        let mut s = CloudWatchSettings::default();
        assert_eq!(cluster_name(&s, "").1, ClusterFrom::Fallback);
        assert_eq!(
            cluster_name(&s, "pcs_abc123"),
            ("pcs_abc123".to_string(), ClusterFrom::Pcs)
        );
        s.cluster_name = "hpc-a".into();
        assert_eq!(cluster_name(&s, "pcs_abc123").0, "hpc-a");
    }

    #[test]
    fn native_gpu_and_efa_metrics_only_where_the_devices_are() {
        let dir = tempfile::tempdir().unwrap();
        let (sys, dev) = (dir.path().join("sys"), dir.path().join("dev"));
        std::fs::create_dir_all(sys.join("class/infiniband")).unwrap();
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("nvidiactl"), "").unwrap();
        assert_eq!(Devices::look(&sys, &dev), Devices::default());
        std::fs::write(dev.join("nvidia0"), "").unwrap();
        std::fs::create_dir(sys.join("class/infiniband/rdmap16s27")).unwrap();
        let d = Devices::look(&sys, &dev);
        assert_eq!(
            d,
            Devices {
                nvidia_gpus: true,
                efa: true
            }
        );
        let s = CloudWatchSettings::default();
        let v = render(&s, "c", d);
        assert!(v["metrics"]["metrics_collected"]["nvidia_smi"].is_object());
        assert!(v["metrics"]["metrics_collected"]["efa"].is_object());
        let v = render(&s, "c", Devices::default());
        assert!(v["metrics"]["metrics_collected"]["nvidia_smi"].is_null());
        assert!(v["logs"]["metrics_collected"].is_null());
    }
}
