//! What a long step waits for, said while it waits: an INFO line in the journal at least
//! every [`EVERY`] (10 s), and the same words in `progress.json` under `agent.state_dir`,
//! which `slurm-node-agent status` shows (`Waiting:`), so that neither the journal nor
//! `status` is ever minutes of silence (bootstrap's wait for the join, a slow mount, a
//! part of the start-up gate).
//!
//! The clock is tokio's ([`tokio::time::Instant`]): a test pauses it and advances it, and
//! sees the line repeat without waiting for it.
//!
//! Floor 1 (ground helpers): uses [`crate::fsutil`], [`crate::section`] and [`crate::time`].

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// The longest silence while a step waits.
pub const EVERY: Duration = Duration::from_secs(10);

/// The record's file under `agent.state_dir`.
pub const FILE: &str = "progress.json";

/// What a running step waits for, as `progress.json` holds it (JSON, one object).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The step: `bootstrap: join`, `mount /fsx`, `start-up gate: dcgm`.
    pub step: String,
    /// What it waits for, in words (`slurmd's registration with slurmctld: ...`).
    pub waiting_for: String,
    /// When the step started waiting (Unix seconds).
    pub since_unix: i64,
    /// When the words were last written (Unix seconds): at most [`EVERY`] ago while the
    /// step runs.
    pub updated_unix: i64,
    /// The process that waits (a record whose process is gone is stale).
    pub pid: u32,
    /// How many times the step has said what it waits for (one line each in the journal).
    pub lines: u64,
}

impl Record {
    /// The record under `state_dir`, if any (unreadable or corrupt: none).
    pub fn load(state_dir: &Path) -> Option<Record> {
        let text = std::fs::read_to_string(state_dir.join(FILE)).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Whether the process that wrote it still runs (`/proc/<pid>` exists).
    pub fn process_alive(&self) -> bool {
        Path::new(&format!("/proc/{}", self.pid)).exists()
    }
}

/// One step's progress: says what it waits for when due ([`Progress::waiting`]), and
/// removes its record when dropped.
#[derive(Debug)]
pub struct Progress {
    /// `progress.json`'s path; `None`: journal only.
    path: Option<PathBuf>,
    step: String,
    since_unix: i64,
    last: Option<Instant>,
    every: Duration,
    /// How many lines it has said.
    said: u64,
}

impl Progress {
    /// A step named `step` that writes its record under `state_dir` (`None`: the journal
    /// only), saying what it waits for every [`EVERY`].
    pub fn new(state_dir: Option<&Path>, step: impl Into<String>) -> Progress {
        Progress {
            path: state_dir.map(|d| d.join(FILE)),
            step: step.into(),
            since_unix: crate::time::now(),
            last: None,
            every: EVERY,
            said: 0,
        }
    }

    /// The same with another period (tests).
    pub fn every(mut self, every: Duration) -> Progress {
        self.every = every;
        self
    }

    /// How many lines it has said.
    pub fn said(&self) -> u64 {
        self.said
    }

    /// Says `what` it waits for (an INFO line, and the record) when due: at the first call,
    /// then once every period. Returns whether it said it.
    pub fn waiting(&mut self, what: &str) -> bool {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|l| now.duration_since(l) < self.every)
        {
            return false;
        }
        self.last = Some(now);
        self.said += 1;
        let waited = crate::section::HumanDuration(Duration::from_secs(
            u64::try_from(crate::time::now() - self.since_unix).unwrap_or(0),
        ));
        tracing::info!(step = %self.step, waited = %waited, "{}: waiting for {what}", self.step);
        if let Some(path) = &self.path {
            let record = Record {
                step: self.step.clone(),
                waiting_for: what.to_string(),
                since_unix: self.since_unix,
                updated_unix: crate::time::now(),
                pid: std::process::id(),
                lines: self.said,
            };
            let written = serde_json::to_vec(&record)
                .map_err(std::io::Error::other)
                .and_then(|b| {
                    crate::fsutil::write_atomic(path, &b, 0o644, None)
                        .map_err(std::io::Error::other)
                });
            if let Err(e) = written {
                tracing::debug!("{}: progress not recorded: {e}", path.display());
            }
        }
        true
    }

    /// Runs `fut` to its end, saying `what(waited)` at the start and every period while it
    /// runs.
    pub async fn during<F: Future>(
        &mut self,
        what: impl Fn(Duration) -> String,
        fut: F,
    ) -> F::Output {
        let start = Instant::now();
        tokio::pin!(fut);
        self.waiting(&what(Duration::ZERO));
        let mut tick = tokio::time::interval_at(start + self.every, self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                out = &mut fut => return out,
                _ = tick.tick() => {
                    self.waiting(&what(start.elapsed()));
                }
            }
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        // Only a record this step wrote (another step may have written one since).
        if let (Some(path), true) = (&self.path, self.said > 0) {
            if Record::load(path.parent().unwrap_or(Path::new("/")))
                .is_some_and(|r| r.pid == std::process::id() && r.step == self.step)
            {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// On tokio's paused clock: a wait of 35 s says what it waits for at 0, 10, 20 and
    /// 30 s, and the record says the latest words; the record goes when the step ends.
    #[tokio::test(start_paused = true)]
    async fn a_long_wait_says_what_it_waits_for_every_ten_seconds() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = Progress::new(Some(dir.path()), "mount /fsx");
        let out = p
            .during(
                |waited| format!("mnt-fsx.mount to start ({}s so far)", waited.as_secs()),
                async {
                    tokio::time::sleep(Duration::from_secs(35)).await;
                    7
                },
            )
            .await;
        assert_eq!(out, 7);
        assert_eq!(p.said(), 4);
        let r = Record::load(dir.path()).unwrap();
        assert_eq!(r.step, "mount /fsx");
        assert_eq!(r.waiting_for, "mnt-fsx.mount to start (30s so far)");
        assert_eq!(r.lines, 4);
        assert!(r.process_alive());
        drop(p);
        assert!(Record::load(dir.path()).is_none());
    }

    /// A loop that polls often says it once per period, not once per poll.
    #[tokio::test(start_paused = true)]
    async fn a_polling_loop_says_it_once_per_period() {
        let mut p = Progress::new(None, "bootstrap: join");
        let mut said = Vec::new();
        for i in 0..250u64 {
            // A poll every 100 ms for 25 s.
            if p.waiting("slurmd's registration") {
                said.push(i);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(said, [0, 100, 200]);
    }
}
