//! `slurm-node-agent bootstrap`: first boot to a node available in slurmctld.

use std::path::PathBuf;

use clap::Args;

use super::{print_error, Output, SettingsArgs};
use crate::bootstrap::{self, Report};
use crate::exit::Exit;

/// Arguments of `bootstrap`.
#[derive(Debug, Args)]
pub struct BootstrapArgs {
    /// Settings sources.
    #[command(flatten)]
    pub settings: SettingsArgs,
    /// Result format on stdout.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Folder where GPU device files (`nvidia<N>`) appear.
    #[arg(long, value_name = "DIR", default_value = "/dev", hide = true)]
    pub dev_dir: PathBuf,
}

impl BootstrapArgs {
    /// Runs bootstrap; returns the exit code.
    pub async fn run(self) -> Exit {
        let flag_layers = match self.settings.flag_layers() {
            Ok(l) => l,
            Err(e) => {
                print_error(&e);
                return Exit::Config;
            }
        };
        let opts = bootstrap::Options {
            paths: self.settings.paths(),
            flag_layers,
            dev_dir: self.dev_dir,
            progress: bootstrap::ProgressLog::default(),
        };
        let start = std::time::Instant::now();
        let exit = match bootstrap::run(&opts).await {
            Ok(report) => {
                print_report(&report, self.output);
                Exit::Ok
            }
            Err(e) => {
                print_error(&e);
                e.exit()
            }
        };
        let progress = opts
            .progress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        bootstrap::metrics::write(
            &progress,
            i32::from(exit.code()),
            start.elapsed().as_secs_f64(),
        );
        exit
    }
}

fn print_report(r: &Report, output: Output) {
    match output {
        Output::Json => match serde_json::to_string(r) {
            Ok(s) => println!("{s}"),
            Err(e) => print_error(&e),
        },
        Output::Text => {
            match r.role {
                crate::nodedef::Role::Login => println!(
                    "login node {} is ready: sackd serves the configuration and \
                     credentials to sinfo, sbatch and srun ({} ms)",
                    r.node_name, r.total_ms
                ),
                crate::nodedef::Role::Compute => {
                    println!("node {} is {} ({} ms)", r.node_name, r.state, r.total_ms)
                }
            }
            if let Some(d) = &r.drain {
                println!("  {d}");
            }
            if let Some(c) = &r.dynamic_conf {
                println!("  dynamic node: {c}");
            }
            for s in &r.steps {
                println!("  {:<18} {:>6} ms", s.name, s.duration_ms);
            }
        }
    }
}
