//! `slurm-node-agent resume [--force]`: returns the node to service if the agent drained it.
//!
//! Exit codes: 0 resumed, or nothing to resume; 69 slurmctld unavailable or node unknown;
//! 74 state file I/O; 75 the upgrade action is running (`acting`), or the state lock stayed
//! busy; 77 the node was drained by someone else (its reason is not the agent's): pass
//! `--force` to resume it anyway; 78 invalid settings, no node name, or a login node
//! (`node.role = "login"`).

use clap::Args;

use super::drain::{slurm_node_settings, Report};
use super::{print_error, Output, SettingsArgs};
use crate::exit::Exit;

/// Arguments of `resume`.
#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// Settings sources.
    #[command(flatten)]
    pub settings: SettingsArgs,
    /// Resume even when the node's reason is not the agent's.
    #[arg(long)]
    pub force: bool,
    /// Result format on stdout.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

impl ResumeArgs {
    /// Runs the command; returns the exit code.
    pub async fn run(self) -> Exit {
        let (s, id) = match slurm_node_settings(&self.settings).await {
            Ok(v) => v,
            Err(code) => return code,
        };
        let node = id.node_name.clone();
        let engine = s.drain_engine(&node).with_instance(&id.instance_id);
        match engine.resume(self.force).await {
            Ok(st) => {
                Report::new(&node, "resumed", st).print(self.output);
                Exit::Ok
            }
            Err(e) => {
                print_error(&e);
                e.exit()
            }
        }
    }
}
