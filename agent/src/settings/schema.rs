//! The settings schema: every key, its type and its default. Unknown keys are errors.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

use crate::section::{Classified, HumanDuration, KeyTrust};

/// All settings. Sections map to TOML tables: `[node]`, `[slurm]`, `[auth]`, `[imds]`,
/// `[systemd]`, `[agent]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// The Slurm node this instance becomes.
    pub node: Node,
    /// How to reach the controller and run slurmd.
    pub slurm: Slurm,
    /// The cluster's authentication key.
    pub auth: Auth,
    /// The instance metadata service.
    pub imds: Imds,
    /// The systemd Manager.
    pub systemd: Systemd,
    /// The agent itself.
    pub agent: Agent,
    /// `[[mounts]]`: shared file systems mounted before slurmd starts.
    pub mounts: Vec<crate::mounts::MountSettings>,
    /// IMDS notices (spot, maintenance, rebalance, lifecycle).
    pub events: crate::events::EventsSettings,
    /// Rolling image upgrades.
    pub upgrade: crate::upgrade::UpgradeSettings,
    /// The drain state machine.
    pub drain: crate::drain::DrainSettings,
    /// Health checks (`check`, and the daemon's schedule).
    pub health: crate::health::HealthSettings,
    /// `[pcs]`: the managed join (AWS Parallel Computing Service registration).
    pub pcs: crate::pcs::PcsSettings,
    /// `[node_lifecycle]`: the image's lifecycle scripts and the `TERMINATE` shutdown unit.
    pub node_lifecycle: crate::node_lifecycle::NodeLifecycleSettings,
}

/// `[agent]`: the agent's own files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Agent {
    /// Folder for state that survives restarts (bootstrap result, drain state).
    pub state_dir: PathBuf,
}

impl Default for Agent {
    fn default() -> Self {
        Agent {
            state_dir: PathBuf::from("/var/lib/slurm-node-agent"),
        }
    }
}

impl Classified for Agent {
    const SECTION: &'static str = "agent";
    const TRUST: &'static [KeyTrust] = &[KeyTrust::image("state_dir")];
}

/// `[node]`: the node definition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Node {
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
    /// RealMemory reserve: this percentage of physical memory is not offered to jobs...
    pub real_memory_reserve_percent: i64,
    /// ...or at least this many MiB, whichever is larger, so the node never registers
    /// INVALID for "Low RealMemory".
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

impl Default for Node {
    fn default() -> Self {
        Node {
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

/// The node's shape: what an operator picks per launch, so tags may set it.
impl Classified for Node {
    const SECTION: &'static str = "node";
    const TRUST: &'static [KeyTrust] = &[
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

/// `[slurm]`: joining the controller.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Slurm {
    /// Configless servers, `host[:port]`, in priority order. Empty: slurmd looks up the DNS
    /// SRV record `_slurmctld._tcp`.
    pub conf_servers: Vec<String>,
    /// File holding `SLURMD_OPTIONS` for the distribution's slurmd unit. Empty:
    /// `/etc/default/slurmd` where `/etc/default` exists (Debian, Ubuntu), else
    /// `/etc/sysconfig/slurmd` (RHEL family, Amazon Linux).
    pub slurmd_options_file: PathBuf,
    /// slurmd's systemd unit.
    pub slurmd_unit: String,
    /// munged's systemd unit (auth/munge only).
    pub munge_unit: String,
    /// Give up joining (node not IDLE) after this long.
    pub join_deadline: HumanDuration,
    /// Folder holding `scontrol`, `sinfo` (absolute: health checks run without PATH).
    pub bin_dir: PathBuf,
}

impl Default for Slurm {
    fn default() -> Self {
        Slurm {
            conf_servers: Vec::new(),
            slurmd_options_file: PathBuf::new(),
            slurmd_unit: "slurmd.service".into(),
            munge_unit: "munge.service".into(),
            join_deadline: HumanDuration(Duration::from_secs(600)),
            bin_dir: PathBuf::from("/usr/bin"),
        }
    }
}

impl Classified for Slurm {
    const SECTION: &'static str = "slurm";
    const TRUST: &'static [KeyTrust] = &[
        // Controller addresses: a rogue controller cannot authenticate without the key.
        KeyTrust::tag("conf_servers"),
        KeyTrust::image("slurmd_options_file"),
        KeyTrust::image("slurmd_unit"),
        KeyTrust::image("munge_unit"),
        KeyTrust::user_data("join_deadline"),
        KeyTrust::image("bin_dir"),
    ];
}

/// Slurm's authentication plugin, which decides the key file and its owner.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthType {
    /// `AuthType=auth/munge`: key `/etc/munge/munge.key`, owner `munge`.
    #[default]
    Munge,
    /// `AuthType=auth/slurm` (Slurm 23.11+): key `/etc/slurm/slurm.key`, owner `slurm`.
    Slurm,
}

/// `[auth]`: the cluster key.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Auth {
    /// Plugin: `munge` or `slurm`.
    #[serde(rename = "type")]
    pub auth_type: AuthType,
    /// Where the key comes from: `ssm:<parameter name>` (SecureString, decrypted),
    /// `secretsmanager:<secret id or ARN>`, or `file:<absolute path>`. Empty: the key is
    /// already in place (baked into the image) and is left alone.
    pub key_source: String,
    /// Destination. Empty: the plugin's default.
    pub key_path: PathBuf,
    /// Owner of the key file. Empty: `munge` or `slurm` by plugin.
    pub key_owner: String,
    /// How the stored key is encoded: `base64` (what ParallelCluster and the managed service
    /// store in Secrets Manager) or `raw` (the key bytes as they are, e.g. SecretBinary or a
    /// key file).
    pub key_encoding: KeyEncoding,
    /// Accept a key from an SSM parameter of type `String` (stored unencrypted, readable by
    /// anyone with `ssm:GetParameter`), with a warning. Off: such a parameter is refused.
    pub allow_string_parameter: bool,
}

/// The key's destination, owner and plugin are the image's; user data may pick which
/// secret (never a file on the node) and how it is encoded.
impl Classified for Auth {
    const SECTION: &'static str = "auth";
    const TRUST: &'static [KeyTrust] = &[
        KeyTrust::image("type"),
        KeyTrust::user_data("key_source").guarded(crate::authkey::secret_sources_only),
        KeyTrust::image("key_path"),
        KeyTrust::image("key_owner"),
        KeyTrust::user_data("key_encoding"),
        KeyTrust::image("allow_string_parameter"),
    ];
}

/// Encoding of the stored key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyEncoding {
    /// Standard base64 (RFC 4648), whitespace ignored.
    #[default]
    Base64,
    /// The bytes as stored.
    Raw,
}

/// `[imds]`: the instance metadata service client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Imds {
    /// Endpoint URL. Empty: aws-config's default (`AWS_EC2_METADATA_SERVICE_ENDPOINT`, the
    /// profile, or `http://169.254.169.254`).
    pub endpoint: String,
    /// Connect and read timeout of one attempt.
    pub timeout: HumanDuration,
    /// Attempts per request (retries on 401, 429, 5xx, timeouts), with backoff.
    pub attempts: i64,
    /// Session token TTL.
    pub token_ttl: HumanDuration,
}

impl Default for Imds {
    fn default() -> Self {
        Imds {
            endpoint: String::new(),
            timeout: HumanDuration(Duration::from_secs(1)),
            attempts: 4,
            token_ttl: HumanDuration(Duration::from_secs(21_600)),
        }
    }
}

/// How user data and tags are read cannot come from them.
impl Classified for Imds {
    const SECTION: &'static str = "imds";
    const TRUST: &'static [KeyTrust] = &[
        KeyTrust::image("endpoint"),
        KeyTrust::image("timeout"),
        KeyTrust::image("attempts"),
        KeyTrust::image("token_ttl"),
    ];
}

/// `[systemd]`: which Manager to talk to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Systemd {
    /// `system` (the system bus), `session` (`DBUS_SESSION_BUS_ADDRESS`, as for
    /// `systemd --user`), or a D-Bus address such as `unix:path=/run/user/0/bus`.
    pub bus: String,
}

impl Default for Systemd {
    fn default() -> Self {
        Systemd {
            bus: "system".into(),
        }
    }
}

impl Classified for Systemd {
    const SECTION: &'static str = "systemd";
    const TRUST: &'static [KeyTrust] = &[KeyTrust::image("bus")];
}

/// Most MiB `node.real_memory_reserve_mib` takes (16 TiB).
const MAX_RESERVE_MIB: i64 = 16 * 1024 * 1024;
/// Most GPUs `node.gpus` declares.
const MAX_GPUS: u32 = 1024;

impl Settings {
    /// Checks values whose shape the types do not capture. Returns the dotted key and what
    /// is wrong.
    ///
    /// # Errors
    /// `(key, message)` for the first invalid value.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let e = |k: &str, m: String| Err((k.to_string(), m));
        if !self.node.name.is_empty() {
            if let Err(m) = crate::nodedef::validate_node_name(&self.node.name) {
                return e("node.name", m);
            }
        }
        if self.node.name_template.trim().is_empty() {
            return e("node.name_template", "must not be empty".into());
        }
        for f in &self.node.features {
            if let Err(m) = crate::nodedef::validate_feature(f) {
                return e("node.features", m);
            }
        }
        if let Err(m) = crate::nodedef::validate_topology(&self.node.topology) {
            return e("node.topology", m);
        }
        if !(0..=100).contains(&self.node.real_memory_reserve_percent) {
            return e(
                "node.real_memory_reserve_percent",
                "must be 0 to 100".into(),
            );
        }
        if !(0..=MAX_RESERVE_MIB).contains(&self.node.real_memory_reserve_mib) {
            return e(
                "node.real_memory_reserve_mib",
                format!("must be 0 to {MAX_RESERVE_MIB} (16 TiB)"),
            );
        }
        if !(0..=u32::MAX as i64).contains(&self.node.weight) {
            return e("node.weight", "must be 0 to 4294967295".into());
        }
        if self.node.gpus != "auto" && !self.node.gpus.parse::<u32>().is_ok_and(|n| n <= MAX_GPUS) {
            return e(
                "node.gpus",
                format!(
                    "expected \"auto\" or a number 0 to {MAX_GPUS}, got {:?}",
                    self.node.gpus
                ),
            );
        }
        for s in &self.slurm.conf_servers {
            if let Err(m) = crate::slurm::ConfServer::parse(s) {
                return e("slurm.conf_servers", m);
            }
        }
        for (k, unit) in [
            ("slurm.slurmd_unit", &self.slurm.slurmd_unit),
            ("slurm.munge_unit", &self.slurm.munge_unit),
        ] {
            if let Err(m) = crate::systemd::validate_unit_name(unit) {
                return e(k, m);
            }
        }
        if self.slurm.join_deadline.is_zero() {
            return e("slurm.join_deadline", "must be more than 0".into());
        }
        if self.agent.state_dir.as_os_str().is_empty() {
            return e(
                "agent.state_dir",
                "must not be empty (the folder for bootstrap and drain state)".into(),
            );
        }
        if !self.slurm.bin_dir.is_absolute() {
            return e("slurm.bin_dir", "must be an absolute path".into());
        }
        for (k, p) in [
            ("slurm.slurmd_options_file", &self.slurm.slurmd_options_file),
            ("auth.key_path", &self.auth.key_path),
            ("agent.state_dir", &self.agent.state_dir),
        ] {
            if !p.as_os_str().is_empty() && !p.is_absolute() {
                return e(k, format!("must be an absolute path, got {}", p.display()));
            }
        }
        if !self.auth.key_source.is_empty() {
            if let Err(m) = crate::authkey::KeySource::parse(&self.auth.key_source) {
                return e("auth.key_source", m);
            }
        }
        if !self.auth.key_owner.is_empty()
            && !self
                .auth
                .key_owner
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-".contains(c))
        {
            return e(
                "auth.key_owner",
                format!("not a user name: {:?}", self.auth.key_owner),
            );
        }
        if self.imds.timeout.is_zero() || self.imds.timeout.0 > Duration::from_secs(300) {
            return e("imds.timeout", "must be more than 0 and at most 5m".into());
        }
        if !(1..=10).contains(&self.imds.attempts) {
            return e("imds.attempts", "must be 1 to 10".into());
        }
        let ttl = self.imds.token_ttl.0.as_secs();
        if !(1..=21_600).contains(&ttl) {
            return e("imds.token_ttl", "must be 1s to 6h (IMDSv2 limit)".into());
        }
        let endpoint = &self.imds.endpoint;
        let is_url = endpoint.starts_with("http://") || endpoint.starts_with("https://");
        if !endpoint.is_empty() && !is_url {
            return e("imds.endpoint", "must be an http:// or https:// URL".into());
        }
        self.events.validate()?;
        self.upgrade.validate()?;
        self.drain.validate()?;
        self.health.validate()?;
        self.node_lifecycle.validate()?;
        crate::mounts::validate_all(&self.mounts)?;
        match self.systemd.bus.as_str() {
            "system" | "session" => {}
            b if b.starts_with("unix:") => {}
            b => {
                return e(
                    "systemd.bus",
                    format!("expected system, session or a unix: D-Bus address, got {b:?}"),
                )
            }
        }
        Ok(())
    }
}
