//! `repair.json` in `agent.state_dir`: the plan in effect on this node and the count of
//! plans made, so that the log and the counts are per change and survive the daemon's
//! restarts; rendered as `repair.prom` for node_exporter's textfile collector.
//!
//! ```text
//! slurm_node_agent_repair_planned_total{mode="report",action="replace",fault="gpu_lost"} 1
//! slurm_node_agent_repair_pending{mode="report",action="replace",fault="gpu_lost"} 1
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Plan, RepairMode};

/// The file's name in `agent.state_dir`.
pub const RECORD_FILE: &str = "repair.json";

/// The operator's file in `agent.state_dir` (`slurm-node-agent repair`): written by the
/// command only, read by the daemon at each repair pass, so that neither overwrites the
/// other's writes ([`Operator`]).
pub const OPERATOR_FILE: &str = "repair-operator.json";

/// What an operator asked for (`slurm-node-agent repair`), in [`OPERATOR_FILE`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Operator {
    /// `--clear-history`: when, Unix seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history_cleared_at: Option<i64>,
    /// `--lift-breaker`: until when, Unix seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breaker_lifted_until: Option<i64>,
}

impl Operator {
    /// `repair-operator.json` under `state_dir`.
    pub fn path(state_dir: &Path) -> PathBuf {
        state_dir.join(OPERATOR_FILE)
    }

    /// Reads it; none, or one that does not parse, is nothing asked.
    pub fn load(state_dir: &Path) -> Operator {
        std::fs::read(Operator::path(state_dir))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// Writes it atomically.
    ///
    /// # Errors
    /// [`crate::fsutil::WriteError`] naming the path.
    pub fn save(&self, state_dir: &Path) -> Result<(), crate::fsutil::WriteError> {
        let text = serde_json::to_vec_pretty(self).unwrap_or_default();
        crate::fsutil::write_atomic(&Operator::path(state_dir), &text, 0o644, None)
    }
}

/// The metrics file's name, beside the drain metrics.
pub const METRICS_FILE: &str = "repair.prom";

/// What the repair planned on this node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Record {
    /// Plans made, by `<mode>/<action>/<fault>`.
    pub planned: BTreeMap<String, u64>,
    /// The plan in effect and its mode (`None`: no fault).
    pub current: Option<Current>,
    /// The boot ids this node's daemon has run under, oldest first (the last
    /// [`KEPT`]): how many boots ago a repair's reboot was.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub boots: Vec<String>,
    /// The repairs' reboots (`repair.mode = "on"`), oldest first (the last [`KEPT`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reboots: Vec<Reboot>,
    /// The rollout budget's slot this node took for a repair (`repair.mode = "on"`),
    /// released once the node is back in service or its repair ends without an action.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot: Option<String>,
    /// The replacements of this NodeName's earlier instances, copied from the record's
    /// reason before this instance overwrote it (the flap guard's history, [`super::flap`]),
    /// oldest first (the last [`KEPT`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub replaced: Vec<Replaced>,
    /// When an operator cleared the history (`slurm-node-agent repair --clear-history`):
    /// the flap guard counts no replacement from before it, in slurmctld's records either.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history_cleared_at: Option<i64>,
    /// Until when an operator lifted the breaker on this node (`slurm-node-agent repair
    /// --lift-breaker`), Unix seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breaker_lifted_until: Option<i64>,
    /// The check a plan is made for now, and since when it fails (Unix seconds), whatever
    /// became of the plan meanwhile (withheld, let go): `repair.settle` counts from it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failing: Option<(String, i64)>,
}

/// An earlier instance of this NodeName powered off for a replacement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replaced {
    /// Its reason's detail (`<check>: <message>`).
    pub detail: String,
    /// The instance.
    pub instance: String,
    /// When it powered off, Unix seconds.
    pub at: i64,
}

/// How many boots and reboots the record keeps.
pub const KEPT: usize = 16;

/// A repair's reboot, planned in boot `boot_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reboot {
    /// The check whose fault called for it.
    pub check: String,
    /// The boot it was planned in (the reboot ends it).
    pub boot_id: String,
    /// When, Unix seconds.
    pub at: i64,
}

/// The plan in effect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Current {
    /// The mode it was made in.
    pub mode: RepairMode,
    /// The plan.
    pub plan: Plan,
    /// What the check found.
    pub message: String,
    /// When it was made, Unix seconds.
    pub since: i64,
}

/// What one health pass changed in the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A new plan (a fault found, or another fault or action than before).
    Planned,
    /// The fault cleared: no plan any more.
    Cleared,
    /// Nothing.
    Same,
}

/// `repair.json` under `state_dir`.
pub fn record_path(state_dir: &Path) -> PathBuf {
    state_dir.join(RECORD_FILE)
}

impl Record {
    /// Reads `path`; none is an empty record, and one that does not parse is set aside
    /// (`repair.json.corrupt-<time>`, logged) and counts as empty.
    pub fn load(path: &Path) -> Record {
        let Ok(bytes) = std::fs::read(path) else {
            return Record::default();
        };
        Record::parse(path, &bytes)
    }

    /// Reads `path` without touching it (`status`): `None` when there is none or it does
    /// not parse (the daemon sets a corrupt one aside at its next health pass).
    pub fn peek(path: &Path) -> Option<Record> {
        serde_json::from_slice(&std::fs::read(path).ok()?).ok()
    }

    /// `bytes` read from `path`; one that does not parse is set aside and counts as empty.
    fn parse(path: &Path, bytes: &[u8]) -> Record {
        match serde_json::from_slice(bytes) {
            Ok(r) => r,
            Err(e) => {
                crate::fsutil::set_aside_corrupt(path, bytes, &e.to_string());
                Record::default()
            }
        }
    }

    /// Writes `path` atomically.
    ///
    /// # Errors
    /// [`crate::fsutil::WriteError`] naming the path.
    pub fn save(&self, path: &Path) -> Result<(), crate::fsutil::WriteError> {
        let text = serde_json::to_vec_pretty(self).unwrap_or_default();
        crate::fsutil::write_atomic(path, &text, 0o644, None)
    }

    /// Takes the plan of one health pass in `mode` (`None`: healthy, or nothing planned),
    /// with what the check found, at `now` (Unix seconds): a plan other than the one in
    /// effect is counted and becomes current.
    pub fn observe(&mut self, mode: RepairMode, plan: Option<(&Plan, &str)>, now: i64) -> Change {
        match plan {
            None if self.current.is_some() => {
                self.current = None;
                Change::Cleared
            }
            None => Change::Same,
            Some((p, message))
                if self
                    .current
                    .as_ref()
                    .is_some_and(|c| c.mode == mode && c.plan.key() == p.key()) =>
            {
                // The same plan: its words (the breaker's count, the message) kept current,
                // nothing counted.
                if let Some(c) = self.current.as_mut() {
                    c.plan = p.clone();
                    c.message = message.to_string();
                }
                Change::Same
            }
            Some((p, message)) => {
                *self
                    .planned
                    .entry(format!(
                        "{}/{}/{}",
                        mode.as_str(),
                        p.action,
                        p.fault.as_str()
                    ))
                    .or_default() += 1;
                self.current = Some(Current {
                    mode,
                    plan: p.clone(),
                    message: message.to_string(),
                    since: now,
                });
                Change::Planned
            }
        }
    }

    /// Notes that the daemon runs under boot `boot_id` (once per boot). Returns whether it
    /// is a boot not seen before.
    pub fn saw_boot(&mut self, boot_id: &str) -> bool {
        if boot_id.is_empty() || self.boots.iter().any(|b| b == boot_id) {
            return false;
        }
        self.boots.push(boot_id.to_string());
        let extra = self.boots.len().saturating_sub(KEPT);
        self.boots.drain(..extra);
        true
    }

    /// Takes a predecessor's repair reason found on this NodeName's record (`reason`, as
    /// Slurm holds it) into the history when it says the predecessor, an instance other
    /// than `instance_id`, powered off for a replacement. Returns whether it was new.
    pub fn saw_predecessor(&mut self, reason: &str, instance_id: &str) -> bool {
        let Some(r) = super::parse_reason(reason) else {
            return false;
        };
        let Some(at) = r.powered_off_at() else {
            return false;
        };
        if r.instance_id == instance_id
            || self
                .replaced
                .iter()
                .any(|p| p.instance == r.instance_id && p.at == at)
        {
            return false;
        }
        self.replaced.push(Replaced {
            detail: r.detail,
            instance: r.instance_id,
            at,
        });
        let extra = self.replaced.len().saturating_sub(KEPT);
        self.replaced.drain(..extra);
        true
    }

    /// Forgets the history at `now` (`slurm-node-agent repair --clear-history`): the
    /// reboots and the replacements of earlier instances, and, for the flap guard, every
    /// replacement in slurmctld's records from before `now`. Returns whether there was
    /// any of this node's own.
    pub fn clear_history(&mut self, now: i64) -> bool {
        let had = !self.reboots.is_empty() || !self.replaced.is_empty();
        self.reboots.clear();
        self.replaced.clear();
        self.history_cleared_at = Some(now);
        had
    }

    /// Takes what an operator asked for: a history cleared later than the record's is
    /// cleared now; the breaker's lift is the operator's. Returns whether the record changed.
    pub fn take_operator(&mut self, op: &Operator) -> bool {
        let mut changed = false;
        if let Some(t) = op.history_cleared_at {
            if self.history_cleared_at.is_none_or(|mine| mine < t) {
                self.clear_history(t);
                changed = true;
            }
        }
        if self.breaker_lifted_until != op.breaker_lifted_until {
            self.breaker_lifted_until = op.breaker_lifted_until;
            changed = true;
        }
        changed
    }

    /// Notes which check the plan of this pass is for (`None`: no plan) at `now`; returns
    /// since when it fails.
    pub fn failing_since(&mut self, check: Option<&str>, now: i64) -> Option<i64> {
        match check {
            None => {
                self.failing = None;
                None
            }
            Some(c) => match &self.failing {
                Some((k, since)) if k == c => Some(*since),
                _ => {
                    self.failing = Some((c.to_string(), now));
                    Some(now)
                }
            },
        }
    }

    /// Whether the breaker is lifted at `now`.
    pub fn breaker_lifted(&self, now: i64) -> bool {
        self.breaker_lifted_until.is_some_and(|t| now < t)
    }

    /// Notes a repair's reboot for `check`, planned in boot `boot_id` at `now`.
    pub fn rebooted_for(&mut self, check: &str, boot_id: &str, now: i64) {
        self.reboots
            .retain(|r| !(r.check == check && r.boot_id == boot_id));
        self.reboots.push(Reboot {
            check: check.to_string(),
            boot_id: boot_id.to_string(),
            at: now,
        });
        let extra = self.reboots.len().saturating_sub(KEPT);
        self.reboots.drain(..extra);
    }

    /// Forgets the reboots planned in boot `boot_id` (a repair's drain lifted or handed
    /// back before its action: no reboot happened for it).
    pub fn unplan_reboot(&mut self, boot_id: &str) {
        self.reboots.retain(|r| r.boot_id != boot_id);
    }

    /// How many boots have begun since the last repair's reboot for `check` was planned
    /// (1: this is the boot right after it), the current boot being `boot_id`; `None` when
    /// there was none, or it was planned in this boot (the reboot has not happened), or
    /// its boot is older than the boots kept.
    pub fn boots_since_reboot(&self, check: &str, boot_id: &str) -> Option<u32> {
        let r = self.reboots.iter().rev().find(|r| r.check == check)?;
        if r.boot_id == boot_id {
            return None;
        }
        let planned = self.boots.iter().position(|b| *b == r.boot_id)?;
        let now = self.boots.iter().position(|b| b == boot_id)?;
        u32::try_from(now.checked_sub(planned)?).ok()
    }

    /// The Prometheus textfile.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP slurm_node_agent_repair_planned_total Repairs planned for faults the health checks found, by mode, action and fault.\n");
        out.push_str("# TYPE slurm_node_agent_repair_planned_total counter\n");
        // Only keys of the agent's own words (a hand-edited file's others left out): no
        // label value needs escaping.
        let word = |w: &str| !w.is_empty() && w.chars().all(|c| c.is_ascii_lowercase() || c == '_');
        for (k, n) in self.planned.iter().filter(|(k, _)| k.split('/').all(word)) {
            let mut parts = k.splitn(3, '/');
            if let (Some(mode), Some(action), Some(fault)) =
                (parts.next(), parts.next(), parts.next())
            {
                let _ = writeln!(
                    out,
                    "slurm_node_agent_repair_planned_total{{mode=\"{mode}\",action=\"{action}\",fault=\"{fault}\"}} {n}"
                );
            }
        }
        out.push_str("# HELP slurm_node_agent_repair_pending The repair in effect for the fault found now (1), by mode, action and fault; none when healthy.\n");
        out.push_str("# TYPE slurm_node_agent_repair_pending gauge\n");
        if let Some(c) = &self.current {
            let _ = writeln!(
                out,
                "slurm_node_agent_repair_pending{{mode=\"{}\",action=\"{}\",fault=\"{}\"}} 1",
                c.mode.as_str(),
                c.plan.action,
                c.plan.fault.as_str()
            );
        }
        out
    }
}
