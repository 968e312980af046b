//! `slurm-node-agent repair --clear-history | --lift-breaker [--for DURATION]`: an
//! operator's say over the repair on this node ([`crate::repair`]). `--clear-history`
//! forgets the node's repair history (the reboots that make a reboot's fault a
//! replacement, its previous instances' replacements) and makes the flap guard count no
//! replacement from before now, in slurmctld's records either; `--lift-breaker` lets this
//! node be rebooted or replaced while the breaker would hold, for `--for` (default 1h).
//! Both write `repair-operator.json` under `agent.state_dir` (the command's own file: the
//! daemon, which writes `repair.json`, never overwrites it); the running daemon takes it
//! at its next health pass. Run it on the nodes concerned (SSM Run Command for many).
//!
//! Exit codes: 0 done; 2 neither option given; 74 `repair-operator.json` could not be written;
//! 78 invalid settings, no node name, or a login node.

use std::time::Duration;

use clap::Args;

use super::drain::slurm_node_settings;
use super::{Output, SettingsArgs};
use crate::exit::Exit;
use crate::repair::record::Operator;

/// Arguments of `repair`.
#[derive(Debug, Args)]
pub struct RepairArgs {
    /// Settings sources.
    #[command(flatten)]
    pub settings: SettingsArgs,
    /// Forget this node's repair history, and replacements before now for the flap guard.
    #[arg(long)]
    pub clear_history: bool,
    /// Let this node be rebooted or replaced while the breaker holds (for `--for`).
    #[arg(long)]
    pub lift_breaker: bool,
    /// How long `--lift-breaker` lasts, e.g. 30m, 2h.
    #[arg(long = "for", value_name = "DURATION", default_value = "1h", value_parser = parse_duration)]
    pub lift_for: Duration,
    /// Result format on stdout.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e}; write e.g. 30m, 2h"))
}

impl RepairArgs {
    /// Runs the command; returns the exit code.
    pub async fn run(self) -> Exit {
        if !self.clear_history && !self.lift_breaker {
            eprintln!("error: give --clear-history, --lift-breaker, or both");
            return Exit::Usage;
        }
        let (s, id) = match slurm_node_settings(&self.settings).await {
            Ok(v) => v,
            Err(code) => return code,
        };
        let mut op = Operator::load(&s.agent.state_dir);
        let now = crate::time::now();
        let mut done = Vec::new();
        if self.clear_history {
            op.history_cleared_at = Some(now);
            done.push(format!(
                "repair history cleared (replacements before {} no longer count)",
                crate::time::format(now)
            ));
        }
        if self.lift_breaker {
            let until = now.saturating_add(i64::try_from(self.lift_for.as_secs()).unwrap_or(0));
            op.breaker_lifted_until = Some(until);
            done.push(format!(
                "breaker lifted until {}",
                crate::time::format(until)
            ));
        }
        if let Err(e) = std::fs::create_dir_all(&s.agent.state_dir) {
            eprintln!("error: {}: {e}", s.agent.state_dir.display());
            return Exit::IoErr;
        }
        if let Err(e) = op.save(&s.agent.state_dir) {
            eprintln!("error: {e}");
            return Exit::IoErr;
        }
        tracing::info!(node = %id.node_name, done = ?done, "repair: operator's command");
        match self.output {
            Output::Text => println!("{}: {}", id.node_name, done.join("; ")),
            Output::Json => println!(
                "{}",
                serde_json::json!({
                    "node": id.node_name,
                    "history_cleared_at": op.history_cleared_at,
                    "breaker_lifted_until": op.breaker_lifted_until,
                })
            ),
        }
        Exit::Ok
    }
}
