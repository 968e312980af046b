//! `slurm-node-agent run`: the daemon (systemd `Type=notify`); see [`crate::daemon`].

use clap::Args;

use super::{print_error, SettingsArgs};
use crate::daemon;
use crate::exit::Exit;

/// Arguments of `run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Settings sources.
    #[command(flatten)]
    pub settings: SettingsArgs,
}

impl RunArgs {
    /// Runs until SIGTERM; returns the exit code (0 after a clean stop).
    pub async fn run(self) -> Exit {
        let flag_layers = match self.settings.flag_layers() {
            Ok(l) => l,
            Err(e) => {
                print_error(&e);
                return Exit::Config;
            }
        };
        let opts = daemon::Options {
            paths: self.settings.paths(),
            flag_layers,
        };
        match daemon::run(&opts).await {
            Ok(()) => Exit::Ok,
            Err(e) => {
                print_error(&e);
                e.exit()
            }
        }
    }
}
