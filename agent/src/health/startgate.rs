//! The start-up gate's record (`<agent.state_dir>/start-gate.json`), which the gate
//! (the `gate` module, run by bootstrap at every boot) writes and the `start_gate` check reads:
//! each part of the gate (`dcgm`, a site command) passed, failed, was skipped or is still
//! running, for one boot.
//!
//! The check turns a failed part into a failing health check, `start-up gate: <part>`
//! (family `gate`; the image's `start_gate` entry names it `start-up gate`), for the rest of that boot: the repair pass plans the fault's action from
//! it as from any other check, and the HealthCheckProgram reports it. A record of another
//! boot, a running part and a skipped one pass: the gate's own drain holds the node while it
//! runs, and the next boot runs the gate again.
//!
//! Floor 5 (subsystems, with the rest of `health`): over `fsutil` and `time`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The record's file name in the state folder.
pub const FILE: &str = "start-gate.json";

/// The record's path in `state_dir`.
pub fn record_path(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE)
}

/// Where one part of the gate stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PartStatus {
    /// Started, not finished (or the run died: bootstrap runs it again).
    Running,
    /// Passed.
    Passed,
    /// Failed: the message says what failed.
    Failed,
    /// Not run, and not a failure of the node (no GPU, GPUs in MIG mode, no `dcgmi`): the
    /// message says why.
    Skipped,
}

impl PartStatus {
    /// `running`, `passed`, `failed`, `skipped`.
    pub fn as_str(self) -> &'static str {
        match self {
            PartStatus::Running => "running",
            PartStatus::Passed => "passed",
            PartStatus::Failed => "failed",
            PartStatus::Skipped => "skipped",
        }
    }
}

/// One part of the gate: DCGM's diagnostics (`dcgm`) or a site command (its name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    /// `dcgm`, or the site command's `name`.
    pub name: String,
    /// Where it stands.
    pub status: PartStatus,
    /// What it found: the failure (DCGM's test, GPU and words), why it was skipped, or
    /// what passed.
    pub message: String,
    /// Its time budget, seconds.
    pub budget_s: u64,
    /// When it started and ended, Unix seconds.
    pub started_unix: i64,
    /// `None` while running.
    pub ended_unix: Option<i64>,
}

/// The gate of one boot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateRecord {
    /// The boot (`/proc/sys/kernel/random/boot_id`) it ran in.
    pub boot_id: String,
    /// The instance it ran on.
    pub instance_id: String,
    /// When the gate started, Unix seconds.
    pub started_unix: i64,
    /// When it must have ended (the parts' budgets added), Unix seconds.
    pub deadline_unix: i64,
    /// Its parts, in the order they run.
    pub parts: Vec<Part>,
}

impl GateRecord {
    /// Reads the record; `None` when there is none or it does not parse (logged: the gate
    /// runs again at the next boot, and the check passes rather than failing on its own
    /// file).
    pub fn load(state_dir: &Path) -> Option<GateRecord> {
        let path = record_path(state_dir);
        let text = std::fs::read_to_string(&path).ok()?;
        match serde_json::from_str(&text) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(path = %path.display(), "start-up gate record unreadable: {e}");
                None
            }
        }
    }

    /// Writes the record atomically.
    ///
    /// # Errors
    /// [`crate::fsutil::WriteError`] naming the step and path.
    pub fn save(&self, state_dir: &Path) -> Result<(), crate::fsutil::WriteError> {
        // A struct of strings and numbers always serializes.
        let json = serde_json::to_vec_pretty(self).unwrap_or_default();
        crate::fsutil::write_atomic(&record_path(state_dir), &json, 0o644, None)
    }

    /// Whether every part has ended (passed, failed or skipped).
    pub fn ended(&self) -> bool {
        self.parts.iter().all(|p| p.status != PartStatus::Running)
    }

    /// Whether the gate passed: every part ended, none failed.
    pub fn passed(&self) -> bool {
        self.ended() && !self.parts.iter().any(|p| p.status == PartStatus::Failed)
    }

    /// The failed parts.
    pub fn failures(&self) -> impl Iterator<Item = &Part> {
        self.parts.iter().filter(|p| p.status == PartStatus::Failed)
    }
}

/// The `start_gate` check of one part: reads the record in `state_dir` at each run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateSpec {
    /// The agent's state folder.
    pub state_dir: PathBuf,
    /// The part this check reports (`dcgm`, a site command's name).
    pub part: String,
}

/// Runs the `start_gate` check of one part against the record of this boot (`boot_id`).
///
/// # Errors
/// [`super::checks::Failed`]: the part failed in this boot, with its words.
pub fn check_gate(spec: &GateSpec, boot_id: Option<&str>) -> Result<String, super::checks::Failed> {
    let Some(r) = GateRecord::load(&spec.state_dir) else {
        return Ok("the start-up gate has not run on this node".into());
    };
    if boot_id.is_some_and(|b| b != r.boot_id) {
        return Ok("the start-up gate has not run yet in this boot".into());
    }
    let Some(p) = r.parts.iter().find(|p| p.name == spec.part) else {
        return Ok(format!(
            "no part {} in this boot's start-up gate",
            spec.part
        ));
    };
    match p.status {
        PartStatus::Failed => Err(super::checks::Failed::new(
            super::checks::Checked::Gate,
            p.message.clone(),
        )),
        PartStatus::Running => Ok(format!(
            "running since {} (its budget {} s)",
            crate::time::format(p.started_unix),
            p.budget_s
        )),
        PartStatus::Passed | PartStatus::Skipped => {
            Ok(format!("{}: {}", p.status.as_str(), p.message))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn part(name: &str, status: PartStatus, message: &str) -> Part {
        Part {
            name: name.into(),
            status,
            message: message.into(),
            budget_s: 600,
            started_unix: 1_800_000_000,
            ended_unix: None,
        }
    }

    #[test]
    fn a_failed_part_fails_its_check_in_its_boot_only() {
        let dir = tempfile::tempdir().unwrap();
        let spec = |p: &str| GateSpec {
            state_dir: dir.path().to_path_buf(),
            part: p.into(),
        };
        // No record: passes.
        assert!(check_gate(&spec("dcgm"), Some("b1")).is_ok());
        let r = GateRecord {
            boot_id: "b1".into(),
            instance_id: "i-0123456789abcdef0".into(),
            started_unix: 1_800_000_000,
            deadline_unix: 1_800_000_600,
            parts: vec![
                part(
                    "dcgm",
                    PartStatus::Failed,
                    "dcgmi diag -r 1: memory failed on GPU 3",
                ),
                part("pingpong", PartStatus::Running, ""),
            ],
        };
        r.save(dir.path()).unwrap();
        assert!(!r.ended() && !r.passed());
        let e = check_gate(&spec("dcgm"), Some("b1")).unwrap_err();
        assert_eq!(e.to_string(), "dcgmi diag -r 1: memory failed on GPU 3");
        assert!(check_gate(&spec("pingpong"), Some("b1"))
            .unwrap()
            .starts_with("running since 2027-01-15T08:00:00Z"));
        // The next boot: the failure was the last boot's.
        assert!(check_gate(&spec("dcgm"), Some("b2")).is_ok());
        // A record that does not parse passes (the gate runs again at the next boot).
        std::fs::write(record_path(dir.path()), "{").unwrap();
        assert!(check_gate(&spec("dcgm"), Some("b1")).is_ok());
    }
}
