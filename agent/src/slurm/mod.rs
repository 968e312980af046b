//! Slurm: the configless server list, slurmd's options file, and `scontrol` with the parsers
//! of its output.
//!
//! Formats are those of Slurm 22.05 to 25.x; parsers are tested against captured output in
//! `agent/tests/fixtures/slurm/`. The `[slurm]` settings section ([`SlurmSettings`]) is
//! this module's.
//!
//! Floor 3 (outside systems): over the node definition and systemd.

pub mod ctl;
pub mod ctld_config;
pub mod diagnose;
pub mod healthcheck;
pub mod installed;
pub mod look;
pub mod node;
pub mod options;
pub mod plugins;
pub mod readyz;
pub mod record;
pub mod sackd;
pub mod skew;
pub mod slurmd;
pub mod version;

pub use ctl::Slurmctld;
pub use node::{NodeInfo, ReadyScontrol, Scontrol, ScontrolError};
pub use options::{slurmd_args, write_slurmd_options, InstanceArgs, OptionsFileError};
pub use version::SlurmVersion;

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::section::{Classified, HumanDuration, InvalidKey, KeyTrust};

/// `[slurm]`: joining the controller.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SlurmSettings {
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
    /// sackd's systemd unit (`node.role = "login"`): Slurm's own `sackd.service` (Type=notify,
    /// `User=slurm`), shipped disabled; bootstrap starts it on a login node.
    pub sackd_unit: String,
    /// File holding `SACKD_OPTIONS` for sackd's unit. Empty: `/etc/default/sackd` where
    /// `/etc/default` exists, else `/etc/sysconfig/sackd` (Slurm's unit reads both).
    pub sackd_options_file: PathBuf,
    /// Give up joining (node not IDLE) after this long.
    pub join_deadline: HumanDuration,
    /// Folder holding `scontrol`, `sinfo` (absolute: health checks run without PATH).
    pub bin_dir: PathBuf,
}

impl Default for SlurmSettings {
    fn default() -> Self {
        SlurmSettings {
            conf_servers: Vec::new(),
            slurmd_options_file: PathBuf::new(),
            slurmd_unit: "slurmd.service".into(),
            munge_unit: "munge.service".into(),
            sackd_unit: "sackd.service".into(),
            sackd_options_file: PathBuf::new(),
            join_deadline: HumanDuration(Duration::from_secs(600)),
            bin_dir: PathBuf::from("/usr/bin"),
        }
    }
}

impl Classified for SlurmSettings {
    const SECTION: &'static str = "slurm";
    const TRUST: &'static [KeyTrust] = &[
        // Controller addresses: a rogue controller cannot authenticate without the key.
        KeyTrust::tag("conf_servers"),
        KeyTrust::image("slurmd_options_file"),
        KeyTrust::image("slurmd_unit"),
        KeyTrust::image("munge_unit"),
        KeyTrust::image("sackd_unit"),
        KeyTrust::image("sackd_options_file"),
        KeyTrust::user_data("join_deadline"),
        KeyTrust::image("bin_dir"),
    ];
}

impl SlurmSettings {
    /// `conf_servers` parsed (checked by [`SlurmSettings::validate`]; one that does not
    /// parse is left out), in priority order.
    pub fn servers(&self) -> Vec<ConfServer> {
        self.conf_servers
            .iter()
            .filter_map(|c| ConfServer::parse(c).ok())
            .collect()
    }

    /// Checks the values: the configless servers, the unit names, the join deadline and
    /// the paths.
    ///
    /// # Errors
    /// [`InvalidKey`]: the dotted key and what is wrong.
    pub fn validate(&self) -> Result<(), InvalidKey> {
        let e = |k: &str, m: String| Err(InvalidKey::new(format!("slurm.{k}"), m));
        for s in &self.conf_servers {
            if let Err(m) = ConfServer::parse(s) {
                return e("conf_servers", m.to_string());
            }
        }
        for (k, unit) in [
            ("slurmd_unit", &self.slurmd_unit),
            ("munge_unit", &self.munge_unit),
            ("sackd_unit", &self.sackd_unit),
        ] {
            if let Err(m) = crate::systemd::validate_unit_name(unit) {
                return e(k, m.to_string());
            }
        }
        if self.join_deadline.is_zero() {
            return e("join_deadline", "must be more than 0".into());
        }
        if !self.bin_dir.is_absolute() {
            return e("bin_dir", "must be an absolute path".into());
        }
        for (k, p) in [
            ("slurmd_options_file", &self.slurmd_options_file),
            ("sackd_options_file", &self.sackd_options_file),
        ] {
            if !p.as_os_str().is_empty() && !p.is_absolute() {
                return e(k, format!("must be an absolute path, got {}", p.display()));
            }
        }
        Ok(())
    }
}

/// Where Slurm's client commands (`scontrol`, `sinfo`) look for the configuration on a
/// configless node once slurmd has fetched it: slurmd keeps the files in
/// `SlurmdSpoolDir/conf-cache` and links this folder to them
/// (<https://slurm.schedmd.com/configless_slurm.html>).
pub const CONFIG_CACHE: &str = "/run/slurm/conf/slurm.conf";

/// Where a client command finds `slurm.conf` on this node without asking slurmctld, in the
/// order Slurm's client library tries them: `SLURM_CONF` (`env_conf`; set counts, even
/// empty), the compiled-in
/// default (`/etc/slurm/slurm.conf` in Debian's and the RHEL family's packages;
/// `<prefix>/etc/slurm.conf` for a build from source whose programs are in `bin_dir`, that is
/// `<prefix>/bin`), then slurmd's cache [`CONFIG_CACHE`]. `None` when there is none yet:
/// each client command run now fetches the whole configuration from slurmctld
/// (`REQUEST_CONFIG`, from the servers of `SLURM_CONF_SERVER` or of the DNS SRV record
/// `_slurmctld._tcp`) before doing what it was asked.
///
/// The compiled-in default is one path that only the build knows; these are the usual
/// ones. A local file elsewhere is not seen, which costs nothing here: the agent always
/// runs slurmd configless, and slurmd writes its cache before it registers.
pub fn client_config(
    bin_dir: &Path,
    env_conf: Option<&std::ffi::OsStr>,
    exists: impl Fn(&Path) -> bool,
) -> Option<PathBuf> {
    // Set is set, even empty: Slurm then fails to read "" rather than look further.
    if let Some(c) = env_conf {
        return Some(PathBuf::from(c));
    }
    let mut candidates = vec![PathBuf::from("/etc/slurm/slurm.conf")];
    if let Some(prefix) = bin_dir.parent() {
        candidates.push(prefix.join("etc/slurm.conf"));
        candidates.push(prefix.join("etc/slurm/slurm.conf"));
    }
    candidates.push(PathBuf::from(CONFIG_CACHE));
    candidates.into_iter().find(|c| exists(c))
}

/// The value of `key` in slurm.conf text (`Key=Value` lines; keys are case-insensitive,
/// `#` starts a comment, the last line that sets it wins, as in Slurm's parser). Only
/// whole-line parameters such as `HealthCheckTimeout=90` are read: a `NodeName=` or
/// `PartitionName=` line is not looked into, and `Include` files are not followed.
pub fn conf_value(text: &str, key: &str) -> Option<String> {
    let mut found = None;
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or_default().trim();
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        if k.trim().eq_ignore_ascii_case(key) {
            let v = v.split_whitespace().next().unwrap_or_default();
            found = Some(v.trim_matches('"').to_string());
        }
    }
    found
}

/// How long slurmd lets its `HealthCheckProgram` run before it kills it: slurm.conf's
/// `HealthCheckTimeout` (seconds; Slurm 26.05+, slurm.conf(5)), else 60 s (slurmd's fixed
/// limit before 26.05). `conf` is the slurm.conf the node reads ([`client_config`]);
/// `None` or an unreadable file gives the default. Returns the limit and where it came
/// from, for messages.
pub fn health_check_timeout(conf: Option<&Path>) -> (std::time::Duration, String) {
    const DEFAULT: u64 = 60;
    let text = conf.and_then(|c| std::fs::read_to_string(c).ok().map(|t| (c, t)));
    if let Some((path, text)) = text {
        if let Some(v) = conf_value(&text, "HealthCheckTimeout") {
            if let Ok(secs) = v.parse::<u64>() {
                if secs > 0 {
                    return (
                        std::time::Duration::from_secs(secs),
                        format!("HealthCheckTimeout={secs} in {}", path.display()),
                    );
                }
            }
        }
    }
    (
        std::time::Duration::from_secs(DEFAULT),
        format!("{DEFAULT} s, slurmd's limit without HealthCheckTimeout"),
    )
}

/// Whether the agent's Slurm client commands find a configuration on this node now
/// ([`client_config`] with this process's `SLURM_CONF` and the settings' `slurm.bin_dir`).
/// `false` on a configless node before slurmd has fetched it: slurmctld cannot have a
/// registration by this boot's slurmd yet, and each command would fetch the configuration.
pub fn has_client_config(slurm: &SlurmSettings) -> bool {
    let env_conf = std::env::var_os("SLURM_CONF");
    client_config(&slurm.bin_dir, env_conf.as_deref(), |p| p.exists()).is_some()
}

/// An upper bound of the cluster's node count, read from the slurm.conf this node reads:
/// what the fleet's periodic calls are sized by (`upgrade.fleet_rate`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeBound {
    /// At least 1.
    pub nodes: u64,
    /// Where it came from, for the log: `1000 nodes declared by NodeName lines of
    /// /run/slurm/conf/slurm.conf (2 files), MaxNodeCount=2000`.
    pub source: String,
}

/// What one slurm.conf file says about the node count.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfNodes {
    /// Names of its `NodeName=` lines (hostlists counted, `NodeName=DEFAULT` not).
    pub declared: u64,
    /// Its `MaxNodeCount` (the last one).
    pub max_node_count: Option<u64>,
    /// The files its `Include` lines name, as written.
    pub includes: Vec<String>,
}

/// Reads the node count out of slurm.conf text (slurm.conf(5)): the names of every
/// `NodeName=` line (`queue1-dy-c5-[1-1000]`, `a,b`; the `DEFAULT` line sets defaults and
/// declares no node), `MaxNodeCount` (nodes the controller may hold, dynamic ones
/// included), and the `Include` lines. Keys are case-insensitive; `#` starts a comment.
pub fn conf_nodes(text: &str) -> ConfNodes {
    let mut out = ConfNodes::default();
    for line in text.lines() {
        // `NodeName = a[1-4]` is `NodeName=a[1-4]` to Slurm's parser.
        let line = tighten_equals(line.split('#').next().unwrap_or_default().trim());
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else { continue };
        if first.eq_ignore_ascii_case("include") {
            if let Some(file) = words.next() {
                out.includes.push(file.trim_matches('"').to_string());
            }
            continue;
        }
        let Some((k, v)) = first.split_once('=') else {
            continue;
        };
        if k.eq_ignore_ascii_case("NodeName") {
            let v = v.trim_matches('"');
            if !v.eq_ignore_ascii_case("DEFAULT") {
                out.declared = out.declared.saturating_add(node::count_hostlist(v));
            }
        } else if k.eq_ignore_ascii_case("MaxNodeCount") {
            if let Ok(n) = v.trim_matches('"').parse::<u64>() {
                out.max_node_count = Some(n);
            }
        }
    }
    out
}

/// `line` without the blanks around each `=`.
fn tighten_equals(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '=' {
            while out.ends_with([' ', '\t']) {
                out.pop();
            }
            out.push('=');
            while chars.peek().is_some_and(|n| *n == ' ' || *n == '\t') {
                chars.next();
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The cluster's node count bound from `conf` and the files it includes (at most 16; a
/// relative path is read beside `conf`, and an absolute one that is not on this node too,
/// by its file name: slurmd's configless cache keeps the included files beside slurm.conf):
/// the larger of the declared nodes and `MaxNodeCount` (slurm.conf(5): `MaxNodeCount` is
/// ignored when below the declared count). `None` when `conf` cannot be read or declares
/// no node; an include that cannot be read is left out.
pub fn node_bound(conf: &Path) -> Option<NodeBound> {
    let dir = conf.parent().unwrap_or(Path::new("/"));
    let mut queue = vec![conf.to_path_buf()];
    let (mut declared, mut max_node_count, mut files) = (0u64, None, 0usize);
    while let Some(path) = queue.pop() {
        let Ok(text) = std::fs::read_to_string(&path) else {
            if files == 0 {
                return None;
            }
            continue;
        };
        files += 1;
        let c = conf_nodes(&text);
        declared = declared.saturating_add(c.declared);
        max_node_count = c.max_node_count.or(max_node_count);
        for inc in c.includes {
            if files + queue.len() >= 16 {
                break;
            }
            let p = Path::new(&inc);
            let beside = p.file_name().map(|n| dir.join(n));
            let p = if p.is_relative() {
                dir.join(p)
            } else if !p.exists() && beside.as_ref().is_some_and(|b| b.exists()) {
                beside.unwrap_or_default()
            } else {
                p.to_path_buf()
            };
            queue.push(p);
        }
    }
    let nodes = declared.max(max_node_count.unwrap_or(0));
    if nodes == 0 {
        return None;
    }
    let mut source = format!(
        "{declared} nodes declared by NodeName lines of {}",
        conf.display()
    );
    if files > 1 {
        source.push_str(&format!(" ({files} files)"));
    }
    if let Some(m) = max_node_count {
        source.push_str(&format!(", MaxNodeCount={m}"));
    }
    Some(NodeBound { nodes, source })
}

/// [`node_bound`] of the slurm.conf the agent's Slurm commands read now
/// ([`client_config`]); `None` when there is none yet.
pub fn local_node_bound(slurm: &SlurmSettings) -> Option<NodeBound> {
    let env_conf = std::env::var_os("SLURM_CONF");
    client_config(&slurm.bin_dir, env_conf.as_deref(), |p| p.exists()).and_then(|c| node_bound(&c))
}

/// Default slurmctld port (slurm.conf `SlurmctldPort`).
pub const DEFAULT_SLURMCTLD_PORT: u16 = 6817;

/// A configless server for `slurmd --conf-server host[:port]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfServer {
    /// Host name, IPv4 address, or IPv6 address (without brackets).
    pub host: String,
    /// Port, when given.
    pub port: Option<u16>,
}

impl ConfServer {
    /// Parses `host`, `host:port`, `[v6addr]` or `[v6addr]:port`. Host names are ASCII
    /// letters, digits, `-` and `.` (RFC 1123).
    ///
    /// # Errors
    /// [`InvalidServer`]: the text and what is wrong with it.
    pub fn parse(s: &str) -> Result<ConfServer, InvalidServer> {
        let bad = |why: &'static str| {
            Err(InvalidServer {
                server: s.to_string(),
                why,
            })
        };
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let Some((h, after)) = rest.split_once(']') else {
                return bad("unclosed '['");
            };
            if h.parse::<std::net::Ipv6Addr>().is_err() {
                return bad("not an IPv6 address in brackets");
            }
            match after {
                "" => (h, None),
                p => match p.strip_prefix(':') {
                    Some(p) => (h, Some(p)),
                    None => return bad("junk after ']'"),
                },
            }
        } else {
            match s.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (s, None),
            }
        };
        let is_v6 = host.contains(':');
        if !is_v6 {
            let label_ok = |l: &str| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            };
            if host.is_empty() || host.len() > 253 || !host.split('.').all(label_ok) {
                return bad("host must be a DNS name or an IP address");
            }
        }
        let port = match port {
            None => None,
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 => Some(n),
                _ => return bad("port must be 1 to 65535"),
            },
        };
        Ok(ConfServer {
            host: host.to_string(),
            port,
        })
    }
}

/// A `slurm.conf_server` entry (or an endpoint of the registration answer) that is not
/// `host[:port]`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid server {server:?}: {why}; expected host[:port]")]
pub struct InvalidServer {
    /// The text given.
    pub server: String,
    /// What is wrong with it: an unclosed `[`, a bad host or port.
    pub why: &'static str,
}

impl fmt::Display for ConfServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        match self.port {
            Some(p) => write!(f, "{host}:{p}"),
            None => f.write_str(&host),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn health_check_timeout_is_read_from_slurm_conf_else_60_s() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("slurm.conf");
        std::fs::write(
            &conf,
            "ClusterName=c\n# HealthCheckTimeout=5\nhealthchecktimeout=20\nHealthCheckTimeout=90 # site\nNodeName=n1 CPUs=1\n",
        )
        .unwrap();
        let (limit, from) = health_check_timeout(Some(&conf));
        assert_eq!(limit, std::time::Duration::from_secs(90));
        assert!(
            from.contains("HealthCheckTimeout=90") && from.contains("slurm.conf"),
            "{from}"
        );
        std::fs::write(&conf, "ClusterName=c\nHealthCheckTimeout=soon\n").unwrap();
        assert_eq!(health_check_timeout(Some(&conf)).0.as_secs(), 60);
        assert_eq!(
            health_check_timeout(Some(&dir.path().join("none")))
                .0
                .as_secs(),
            60
        );
        assert_eq!(health_check_timeout(None).0.as_secs(), 60);
        assert_eq!(conf_value("A=1\nB = 2\n", "b").as_deref(), Some("2"));
    }

    #[test]
    fn node_counts_follow_slurm_conf_forms() {
        // A ParallelCluster-style partition file: zero padding, ranges, comma lists, a
        // DEFAULT line, lower-case keys, comments.
        let c = conf_nodes(
            "NodeName=DEFAULT CPUs=4 State=CLOUD\n\
             NodeName=q1-st-c5-[001-128] CPUs=4 # static\n\
             NodeName=q1-dy-c5-[1-1000],q1-dy-m5-[1-10,20] Feature=dynamic\n\
             nodename=gpu01,gpu02 Gres=gpu:8\n\
             # NodeName=old-[1-99999]\n\
             NodeName=r[1-2]n[1-4]\n\
             NodeName = spaced-[1-3] CPUs = 2\n\
             NodeSet=all Nodes=ALL\n\
             PartitionName=q1 Nodes=q1-st-c5-[001-128] Default=YES\n\
             DownNodes=q1-st-c5-001 State=DOWN\n\
             MaxNodeCount=5000\n\
             include /etc/slurm/pcluster/slurm_parallelcluster_q2.conf\n",
        );
        assert_eq!(c.declared, 128 + 1000 + 11 + 2 + 8 + 3);
        assert_eq!(c.max_node_count, Some(5000));
        assert_eq!(conf_nodes("MaxNodeCount =\t70\n").max_node_count, Some(70));
        assert_eq!(
            conf_nodes("NodeName=x[0-18446744073709551615]\n").declared,
            u64::MAX
        );
        assert_eq!(
            c.includes,
            vec!["/etc/slurm/pcluster/slurm_parallelcluster_q2.conf"]
        );
        assert_eq!(
            conf_nodes("NodeName=DEFAULT CPUs=2\nNodeName=n1\n").declared,
            1
        );

        // Files: an include beside slurm.conf (relative, or absolute as the configless cache
        // flattens it), MaxNodeCount below the declared count ignored, above it the bound.
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("slurm.conf");
        std::fs::write(
            dir.path().join("q2.conf"),
            "NodeName=q2-dy-[1-500] State=CLOUD\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("q3.conf"),
            "NodeName=q3-[1-9]\nMaxNodeCount=10\n",
        )
        .unwrap();
        std::fs::write(
            &conf,
            "ClusterName=c\nNodeName=n[1-10]\nInclude q2.conf\ninclude /no/such/dir/q3.conf\nInclude missing.conf\n",
        )
        .unwrap();
        let b = node_bound(&conf).unwrap();
        assert_eq!(b.nodes, 519);
        assert!(
            b.source.contains("519 nodes declared") && b.source.contains("(3 files)"),
            "{}",
            b.source
        );
        std::fs::write(&conf, "NodeName=n[1-10]\nMaxNodeCount=10000\n").unwrap();
        assert_eq!(node_bound(&conf).unwrap().nodes, 10_000);
        // Only dynamic nodes: MaxNodeCount alone.
        std::fs::write(&conf, "ClusterName=c\nMaxNodeCount=64\n").unwrap();
        assert_eq!(node_bound(&conf).unwrap().nodes, 64);
        // Nothing to size by: no bound.
        std::fs::write(&conf, "ClusterName=c\nNodeName=DEFAULT CPUs=1\n").unwrap();
        assert_eq!(node_bound(&conf), None);
        assert_eq!(node_bound(&dir.path().join("none.conf")), None);
        // An include loop stops after 16 files.
        std::fs::write(&conf, "NodeName=n1\nInclude slurm.conf\n").unwrap();
        assert_eq!(node_bound(&conf).unwrap().nodes, 16);
    }

    #[test]
    fn client_config_follows_slurms_order() {
        let bin = Path::new("/usr/bin");
        let has = |files: &'static [&'static str]| {
            move |p: &Path| files.iter().any(|f| Path::new(f) == p)
        };
        // Nothing on the node: a client command would fetch it.
        assert_eq!(client_config(bin, None, has(&[])), None);
        // SLURM_CONF first, even when it does not exist (Slurm then fails, it does not fetch).
        let env = std::ffi::OsStr::new("/x/slurm.conf");
        assert_eq!(
            client_config(bin, Some(env), has(&[CONFIG_CACHE])),
            Some(PathBuf::from("/x/slurm.conf"))
        );
        assert_eq!(
            client_config(bin, Some(std::ffi::OsStr::new("")), has(&[CONFIG_CACHE])),
            Some(PathBuf::from(""))
        );
        // A package's file before the cache; a source build's under its prefix.
        assert_eq!(
            client_config(bin, None, has(&["/etc/slurm/slurm.conf", CONFIG_CACHE])),
            Some(PathBuf::from("/etc/slurm/slurm.conf"))
        );
        assert_eq!(
            client_config(
                Path::new("/opt/slurm/bin"),
                None,
                has(&["/opt/slurm/etc/slurm.conf"])
            ),
            Some(PathBuf::from("/opt/slurm/etc/slurm.conf"))
        );
        assert_eq!(
            client_config(bin, None, has(&["/opt/slurm/etc/slurm.conf"])),
            None
        );
    }

    #[test]
    fn parses_servers() {
        let c = ConfServer::parse("ctl.example.com:6817").unwrap();
        assert_eq!((c.host.as_str(), c.port), ("ctl.example.com", Some(6817)));
        assert_eq!(ConfServer::parse("10.0.0.5").unwrap().port, None);
        assert_eq!(
            ConfServer::parse("[fd00::1]:7000").unwrap().to_string(),
            "[fd00::1]:7000"
        );
    }

    #[test]
    fn rejects_bad_servers() {
        for bad in [
            "",
            "a b",
            "host:0",
            "host:99999",
            "host:x",
            "ctl;reboot",
            "ctl\n",
            "ctl,evil",
            "höst",
            "-x",
            "[::1",
            "[zz]:1",
            "a=b",
            "$(id)",
        ] {
            assert!(ConfServer::parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
