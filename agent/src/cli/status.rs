//! `slurm-node-agent status`: the drain state, and Slurm's view of the node.
//!
//! Exit codes: 0 printed (a Slurm error is reported in the output, not as a failure); 74
//! the state file cannot be read or is corrupt; 78 invalid settings or no node name.

use clap::Args;

use super::drain::{local_settings, Report};
use super::{print_error, Output, SettingsArgs};
use crate::drain::Engine;

/// Arguments of `status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Settings sources.
    #[command(flatten)]
    pub settings: SettingsArgs,
    /// Do not ask slurmctld (state file only).
    #[arg(long)]
    pub no_slurm: bool,
    /// Result format on stdout.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

impl StatusArgs {
    /// Runs the command; returns the exit code.
    pub async fn run(self) -> u8 {
        let (s, id) = match local_settings(&self.settings).await {
            Ok(v) => v,
            Err(code) => return code,
        };
        let node = id.node_name.clone();
        let engine = Engine::new(&s, &node).with_instance(&id.instance_id);
        let st = match engine.load() {
            Ok(st) => st,
            Err(e) => {
                print_error(&e);
                return 74;
            }
        };
        let mut report = Report::new(&node, "status", st);
        if !self.no_slurm {
            report.slurm = Some(match engine.ops.scontrol.show_node(&node).await {
                Ok(Some(n)) => serde_json::json!({
                    "state": n.state(),
                    "reason": n.reason(),
                }),
                Ok(None) => serde_json::json!({ "error": "node not known to slurmctld" }),
                Err(e) => serde_json::json!({ "error": e.to_string() }),
            });
        }
        report.print(self.output);
        0
    }
}
