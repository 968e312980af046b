//! The daemon's own Prometheus textfile, `agent.prom` beside the drain metrics (the folder
//! of `drain.metrics_file`): what the daemon saw and decided that the drain, health and
//! repair textfiles do not carry.
//!
//! ```text
//! slurm_node_agent_notices_seen_total{kind="spot"} 1          # distinct notices since start
//! slurm_node_agent_upgrade_state{state="up_to_date"} 1         # one line per state, 0 or 1
//! slurm_node_agent_upgrade_last_check_timestamp_seconds 1.8e9  # 0 before the first check
//! slurm_node_agent_build_info{version=,commit=,slurm_release=} 1
//! slurm_node_agent_aws_throttled_total{api="ec2:DescribeTags"} 1
//! ```
//!
//! Written when its text changes, atomically; a failure to write is one warning.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use crate::drain::Cause;
use crate::rollout::check::Check;
use crate::settings::Settings;
use crate::textfile::{Kind, Textfile};

/// The file's name.
pub const FILE: &str = "agent.prom";

/// The states of `slurm_node_agent_upgrade_state`, in the order written.
pub const UPGRADE_STATES: [&str; 8] = [
    "up_to_date",
    "returning",
    "busy",
    "foreign_drain",
    "waiting",
    "started",
    "stuck",
    "error",
];

/// The upgrade check's state as the metric names it.
pub fn upgrade_state(c: &Check) -> &'static str {
    match c {
        Check::UpToDate {
            returning: false, ..
        } => "up_to_date",
        Check::UpToDate {
            returning: true, ..
        } => "returning",
        Check::Busy => "busy",
        Check::ForeignDrain => "foreign_drain",
        Check::Waiting { .. } => "waiting",
        Check::Started { .. } => "started",
        Check::Stuck { .. } => "stuck",
        Check::Error(_) => "error",
    }
}

/// Notices seen since the daemon started: each distinct one (its cause's key) once.
#[derive(Debug, Default)]
pub struct Notices {
    keys: HashSet<String>,
    by_kind: BTreeMap<&'static str, u64>,
}

impl Notices {
    /// Counts `c` when it was not seen before; whether it was new.
    pub fn saw(&mut self, c: &Cause) -> bool {
        if !self.keys.insert(c.key()) {
            return false;
        }
        *self.by_kind.entry(c.kind()).or_default() += 1;
        true
    }
}

/// The daemon's textfile.
#[derive(Debug)]
pub struct AgentMetrics {
    path: PathBuf,
    slurm_release: String,
    upgrade: Option<&'static str>,
    upgrade_checked: i64,
    last: String,
}

impl AgentMetrics {
    /// `agent.prom` beside the drain metrics; `slurm_release` as `slurmd -V` gave it.
    pub fn new(s: &Settings, slurm_release: String) -> AgentMetrics {
        let drain = crate::node_state::metrics_path(&s.agent.state_dir, &s.drain.metrics_file);
        AgentMetrics {
            path: drain.parent().unwrap_or_else(|| Path::new(".")).join(FILE),
            slurm_release,
            upgrade: None,
            upgrade_checked: 0,
            last: String::new(),
        }
    }

    /// Records an upgrade check's answer at Unix time `now`.
    pub fn upgrade(&mut self, c: &Check, now: i64) {
        self.upgrade = Some(upgrade_state(c));
        self.upgrade_checked = now;
    }

    /// The textfile's text.
    pub fn render(&self, notices: &Notices) -> String {
        let mut t = Textfile::new();
        let name = "slurm_node_agent_notices_seen_total";
        t.family(
            name,
            "Distinct notices seen (spot interruption, rebalance, scheduled event, capacity block end, lifecycle, upgrade...) since the daemon started, by drain cause.",
            Kind::Counter,
        );
        for (kind, n) in &notices.by_kind {
            #[allow(clippy::cast_precision_loss)]
            t.sample(name, &[("kind", kind)], *n as f64);
        }
        let name = "slurm_node_agent_upgrade_state";
        t.family(
            name,
            "The rolling upgrade check's last answer (1 for the state it is in; all 0 before the first check or without upgrade.parameter).",
            Kind::Gauge,
        );
        for state in UPGRADE_STATES {
            t.sample(
                name,
                &[("state", state)],
                f64::from(u8::from(self.upgrade == Some(state))),
            );
        }
        let name = "slurm_node_agent_upgrade_last_check_timestamp_seconds";
        #[allow(clippy::cast_precision_loss)]
        t.family(
            name,
            "Unix time of the last upgrade check (0: none yet).",
            Kind::Gauge,
        )
        .sample(name, &[], self.upgrade_checked as f64);
        t.build_info(&self.slurm_release);
        t.aws_throttled();
        t.finish()
    }

    /// Writes the textfile when its text changed since the last write.
    pub fn write(&mut self, notices: &Notices) {
        let text = self.render(notices);
        if text == self.last {
            return;
        }
        match crate::textfile::write(&self.path, &text) {
            Ok(()) => self.last = text,
            Err(e) => tracing::warn!("the agent's metrics were not written: {e}"),
        }
    }
}
