//! Node health checks: `slurm-node-agent check` (also Slurm's `HealthCheckProgram`) and
//! the checks engine that `slurm-node-agent run` calls on its schedule (issue 6).
//!
//! - Checks come from TOML files in `health.checks_dir` ([`checksd`]; the image ships its
//!   defaults there, `10-defaults.toml`) and from LBNL NHC `nhc.conf` files read as they
//!   are ([`nhc`]), for the node a [`Target`] describes. A check that cannot be understood
//!   is an error naming the file and line, never skipped.
//! - [`run_checks`] runs every check at once, each with its own timeout: checks that read
//!   the host (mounts, `/proc`, files) on a thread of their own, so a hung file system
//!   fails its check instead of hanging the agent; commands in their own process group,
//!   killed with it at the timeout.
//! - [`act_on`] drains or resumes the node with the rules NHC users rely on ([`act`]),
//!   through the gateway of the drain state machine ([`crate::node_state::Gateway`]).
//! - [`output`] prints text or JSON and writes the Prometheus textfile.
//!
//! Library use (the daemon):
//! ```no_run
//! # async fn demo(settings: &slurm_node_agent::settings::Settings) -> anyhow::Result<()> {
//! use slurm_node_agent::health;
//! // The NodeName comes from slurm_node_agent::identity::resolve in the agent's commands.
//! let node = Some("n1".to_string());
//! let target = settings.health_target(node.clone());
//! let checks = health::load(&settings.health, &settings.slurm.bin_dir, &target)?;
//! let env = health::RunEnv::new(&settings.health, &settings.systemd.bus);
//! let report = health::run_checks(&checks, &env).await;
//! if let Some(node) = &node {
//!     let gateway = health::act::health_gateway(settings.node_gateway(node), &settings.health);
//!     let opts = health::ActOptions::new(&settings.agent.state_dir);
//!     let outcome = health::act_on(&report, &gateway, &opts).await;
//!     println!("{}", outcome.summary());
//! }
//! # Ok(()) }
//! ```
//!
//! Floor 5 (subsystems): over `node_state`, through which it drains and resumes; the
//! `[health]` settings section ([`HealthSettings`]) is this module's.

pub mod act;
pub mod arith;
pub mod cgroup;
pub mod checks;
pub mod checksd;
pub mod engine;
pub mod facts;
pub mod matcher;
pub mod nhc;
pub mod output;
pub mod posix;
pub mod startgate;
pub mod target;
pub mod units;

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use act::{act_on, decide, ActOptions, ActOutcome, Action};
pub use checks::CheckKind;
pub use engine::{run_checks, RunEnv};
pub use facts::Host;
pub use target::Target;

use crate::section::{HumanDuration, InvalidKey};

/// `[health]`: the health checks (`check`, the HealthCheckProgram, the daemon's pass).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthSettings {
    /// Folder of TOML check files (`*.toml`, read in name order; a check named in a later
    /// file replaces the one of that name in an earlier file). The image ships its default
    /// checks there as `10-defaults.toml`. A missing folder has no checks.
    pub checks_dir: PathBuf,
    /// LBNL NHC configuration files read as they are (e.g. `/etc/nhc/nhc.conf`).
    pub nhc_conf: Vec<PathBuf>,
    /// Timeout of a check that sets none.
    pub timeout: HumanDuration,
    /// Time limit of a whole run (NHC's `TIMEOUT`; slurmd kills its `HealthCheckProgram`
    /// after 60 s): checks still running then are reported as hung, the node is drained
    /// naming them, and `check` exits.
    pub run_deadline: HumanDuration,
    /// Drain on failure and resume on recovery (`false`: report only).
    pub act: bool,
    /// Prometheus textfile to write after each run (node_exporter's textfile collector),
    /// e.g. `/var/lib/node_exporter/textfile/slurm_node_agent.prom`. Empty: none.
    pub prometheus_textfile: PathBuf,
    /// Time limit of each `scontrol` call made to act: a controller that does not answer
    /// must not hold a health check (slurmd waits for its `HealthCheckProgram`).
    pub scontrol_timeout: HumanDuration,
    /// How often `slurm-node-agent run` runs the checks.
    pub interval: HumanDuration,
    /// Most bytes of a command's output kept (the rest is read and dropped).
    pub output_limit: i64,
}

impl Default for HealthSettings {
    fn default() -> Self {
        HealthSettings {
            checks_dir: PathBuf::from("/etc/slurm-node-agent/checks.d"),
            nhc_conf: Vec::new(),
            timeout: HumanDuration(Duration::from_secs(10)),
            run_deadline: HumanDuration(Duration::from_secs(30)),
            act: true,
            prometheus_textfile: PathBuf::new(),
            scontrol_timeout: HumanDuration(Duration::from_secs(5)),
            interval: HumanDuration(Duration::from_secs(60)),
            output_limit: 64 * 1024,
        }
    }
}

/// Which checks run and which drains the agent may lift are the image's.
impl crate::section::Classified for HealthSettings {
    const SECTION: &'static str = "health";
    const TRUST: &'static [crate::section::KeyTrust] = {
        use crate::section::KeyTrust as K;
        &[
            K::image("checks_dir"),
            K::image("nhc_conf"),
            K::user_data("timeout"),
            K::user_data("run_deadline"),
            K::user_data("act"),
            K::image("prometheus_textfile"),
            K::user_data("scontrol_timeout"),
            K::user_data("interval"),
            K::user_data("output_limit"),
        ]
    };
}

impl HealthSettings {
    /// Checks values the types do not capture.
    ///
    /// # Errors
    /// [`InvalidKey`]: the dotted key and what is wrong.
    pub fn validate(&self) -> Result<(), InvalidKey> {
        let e = |k: &str, m: &str| Err(InvalidKey::new(format!("health.{k}"), m));
        if !self.checks_dir.as_os_str().is_empty() && !self.checks_dir.is_absolute() {
            return e("checks_dir", "must be an absolute path");
        }
        if self.nhc_conf.iter().any(|p| !p.is_absolute()) {
            return e("nhc_conf", "paths must be absolute");
        }
        if !self.prometheus_textfile.as_os_str().is_empty()
            && !self.prometheus_textfile.is_absolute()
        {
            return e("prometheus_textfile", "must be an absolute path");
        }
        if self.run_deadline.0.is_zero() {
            return e("run_deadline", "must be more than 0");
        }
        for (k, d) in [
            ("timeout", self.timeout),
            ("scontrol_timeout", self.scontrol_timeout),
            ("interval", self.interval),
        ] {
            if d.0.is_zero() {
                return e(k, "must be more than 0");
            }
        }
        if !(1024..=64 * 1024 * 1024).contains(&self.output_limit) {
            return e("output_limit", "must be 1024 to 67108864 bytes");
        }
        Ok(())
    }
}

/// Where a check was defined. Displays as `file:line`, or `file` for a whole file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// File.
    pub file: PathBuf,
    /// Line (1-based); `None` for the whole file (one that could not be read or used).
    pub line: Option<usize>,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&place(&self.file, self.line))
    }
}

/// `file:line`, or `file` alone when the place is the whole file.
fn place(file: &Path, line: Option<usize>) -> String {
    match line {
        Some(l) => format!("{}:{l}", file.display()),
        None => file.display().to_string(),
    }
}

/// One check.
#[derive(Debug, Clone)]
pub struct Check {
    /// Name shown in reports and drain reasons (an NHC line's text, or the TOML `name`).
    pub name: String,
    /// Where it was defined.
    pub origin: Origin,
    /// Time limit.
    pub timeout: Duration,
    /// A failure drains the node (`false`: reported as a warning only, NHC's `-0`).
    pub fatal: bool,
    /// What it verifies.
    pub kind: CheckKind,
}

/// The checks to run on this node.
#[derive(Debug, Clone, Default)]
pub struct CheckSet {
    /// Checks, in file order (TOML files first, then nhc.conf files).
    pub checks: Vec<Check>,
    /// Things worth telling that are not checks (ignored NHC settings...).
    pub notes: Vec<String>,
}

/// A check file could not be used. Displays as `file:line: message`, or `file: message`
/// when the whole file is at fault (it could not be read, or no line is known).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", place(.file, *.line))]
pub struct ConfigError {
    /// File.
    pub file: PathBuf,
    /// Line (1-based); `None` when the file itself could not be read or used.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

/// Loads the checks that apply to the node `target` (NHC targets and `nodes` are matched
/// against the Slurm NodeName, with no node name only `*` targets apply; `when` against
/// the node's role, auth plugin and host).
///
/// # Errors
/// [`ConfigError`] naming the folder of `health.checks_dir` when it cannot be listed
/// (a file that cannot be used is a failing check of its own).
pub fn load(
    settings: &HealthSettings,
    slurm_bin_dir: &Path,
    target: &Target,
) -> Result<CheckSet, ConfigError> {
    let node = target.node.as_deref();
    let defaults = nhc::Defaults {
        timeout: settings.timeout.0,
        slurm_bin_dir: slurm_bin_dir.to_path_buf(),
    };
    let mut set = CheckSet::default();
    if !settings.checks_dir.as_os_str().is_empty() {
        let mut s = checksd::load_dir(&settings.checks_dir, target, &defaults)?;
        set.checks.append(&mut s.checks);
        set.notes.append(&mut s.notes);
    }
    for p in &settings.nhc_conf {
        // An nhc.conf that cannot be read fails closed as a checks.d file does.
        match nhc::load_file(p, node, &defaults) {
            Ok(mut s) => {
                set.checks.append(&mut s.checks);
                set.notes.append(&mut s.notes);
            }
            Err(e) => set.checks.push(checksd::unusable_file(e)),
        }
    }
    if node.is_none() {
        set.notes
            .push("node name unknown: only checks targeted at '*' apply".into());
    }
    Ok(set)
}

/// Outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Passed.
    Pass,
    /// Failed.
    Fail,
    /// Did not finish within its timeout.
    Timeout,
}

/// The result of one check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckResult {
    /// Check name.
    pub name: String,
    /// Family (`mount`, `process`...).
    pub family: String,
    /// `file:line` of its definition.
    pub origin: String,
    /// Outcome.
    pub status: Status,
    /// Whether a failure drains the node.
    pub fatal: bool,
    /// What was found.
    pub message: String,
    /// Wall time, milliseconds (JSON: a whole number, rounded).
    #[serde(serialize_with = "whole_ms")]
    pub duration_ms: f64,
}

/// Milliseconds as a whole number in JSON (`duration_ms`, as bootstrap's steps).
fn whole_ms<S: serde::Serializer>(ms: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(ms.max(0.0).round() as u64)
}

impl CheckResult {
    /// A failure or timeout of a fatal check.
    pub fn is_fatal_failure(&self) -> bool {
        self.fatal && self.status != Status::Pass
    }
}

/// The results of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Node name, when known.
    pub node: Option<String>,
    /// Results in check order.
    pub results: Vec<CheckResult>,
    /// Notes about the configuration.
    pub notes: Vec<String>,
    /// Unix time the run started, seconds.
    pub started_unix: f64,
    /// Wall time of the whole run, milliseconds (JSON: a whole number, rounded).
    #[serde(serialize_with = "whole_ms")]
    pub duration_ms: f64,
}

impl Report {
    /// No fatal check failed.
    pub fn healthy(&self) -> bool {
        !self.results.iter().any(CheckResult::is_fatal_failure)
    }

    /// The fatal failures.
    pub fn failures(&self) -> impl Iterator<Item = &CheckResult> {
        self.results.iter().filter(|r| r.is_fatal_failure())
    }

    /// The drain reason for this report, written by incarnation `instance_id`:
    /// `slurm-node-agent/health@<instance-id>: <check>: <message>` of the first fatal
    /// failure in file order ([`crate::reason`]; file order, so the reason does not flap
    /// between runs while checks run concurrently), with `(+N more)` when several failed;
    /// control characters replaced, cut to Slurm's 256 characters. `None` when healthy.
    pub fn drain_reason(&self, instance_id: &str) -> Option<String> {
        let prefix = &crate::reason::reason_head(crate::reason::ReasonCause::Health, instance_id);
        let failed: Vec<&CheckResult> = self.failures().collect();
        let first = failed.first()?;
        Some(health_reason(
            prefix,
            &first.name,
            &first.message,
            failed.len() - 1,
        ))
    }
}

/// The daemon's last health pass, as `health-last.json` in the state folder holds it, for
/// `status` (`Last health pass: passed at T (2m ago)`). Written after every pass of the
/// daemon; the checks' own results stay in the journal and the Prometheus textfile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LastPass {
    /// When the pass started (Unix seconds).
    pub at_unix: i64,
    /// Whole milliseconds it took.
    pub duration_ms: u64,
    /// No fatal check failed.
    pub healthy: bool,
    /// How many checks ran.
    pub checks: usize,
    /// The fatal failures, `<check>: <message>` (each cut to 200 characters).
    pub failed: Vec<String>,
    /// What the pass did about it (`drained`, `lifted`, `none`, ...), when it acted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
}

impl LastPass {
    /// The file under `state_dir`.
    pub fn path(state_dir: &Path) -> PathBuf {
        state_dir.join("health-last.json")
    }

    /// The record of `report`.
    pub fn of(report: &Report, action: Option<String>) -> LastPass {
        LastPass {
            at_unix: report.started_unix as i64,
            duration_ms: report.duration_ms.max(0.0).round() as u64,
            healthy: report.healthy(),
            checks: report.results.len(),
            failed: report
                .failures()
                .map(|r| {
                    format!("{}: {}", r.name, r.message)
                        .chars()
                        .take(200)
                        .collect()
                })
                .collect(),
            action,
        }
    }

    /// Writes it atomically under `state_dir`; a failure is logged, never fatal.
    pub fn save(&self, state_dir: &Path) {
        let path = LastPass::path(state_dir);
        let written = serde_json::to_vec(self)
            .map_err(std::io::Error::other)
            .and_then(|b| {
                crate::fsutil::write_atomic(&path, &b, 0o644, None).map_err(std::io::Error::other)
            });
        if let Err(e) = written {
            tracing::debug!("{}: last health pass not recorded: {e}", path.display());
        }
    }

    /// The record under `state_dir`, if any.
    pub fn load(state_dir: &Path) -> Option<LastPass> {
        serde_json::from_slice(&std::fs::read(LastPass::path(state_dir)).ok()?).ok()
    }
}

/// Path of the cache file in the state folder that holds the boot id of a run that found no
/// health drain of the agent's in Slurm: while it holds the current boot id and the checks
/// pass, no `scontrol` call is needed (see [`act`]). Never the authority: Slurm's reason is.
pub fn clean_marker(state_dir: &Path) -> PathBuf {
    state_dir.join("health-clean")
}

/// Path of the file in the state folder that holds a failing run's drain the agent could not
/// make yet ([`act::PendingDrain`]): slurmctld had no record of the node, or held it in a
/// state its registration may change. Bootstrap applies it once slurmd has registered.
pub fn pending_drain_path(state_dir: &Path) -> PathBuf {
    state_dir.join("health-pending.json")
}

/// Text as drain reasons hold it: control characters become spaces and runs of
/// whitespace one space (`scontrol show node` prints reasons that way too).
pub fn reason_text(text: &str) -> String {
    text.split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The one place a health drain reason is built: `<prefix><check>: <detail>` and
/// ` (+N more)` when `more` other checks failed; as [`reason_text`] (control characters
/// become spaces, whitespace runs one space), and the detail is cut (ending in `...`) so the whole fits Slurm's 256 characters.
pub fn health_reason(prefix: &str, check: &str, detail: &str, more: usize) -> String {
    let more = if more > 0 {
        format!(" (+{more} more)")
    } else {
        String::new()
    };
    let body = reason_text(&format!("{check}: {detail}"));
    let room = 256usize
        .saturating_sub(prefix.chars().count())
        .saturating_sub(more.chars().count());
    let body = if body.chars().count() > room {
        let mut b: String = body.chars().take(room.saturating_sub(3)).collect();
        b.push_str("...");
        b
    } else {
        body
    };
    format!("{prefix}{body}{more}")
}
