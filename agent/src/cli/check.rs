//! `slurm-node-agent check`: run the node's health checks once and act on the result.
//!
//! Usable as Slurm's `HealthCheckProgram` (through a one-line wrapper script, since Slurm
//! passes no arguments): it needs no PATH (every program is run by absolute path), takes
//! the node name from `SLURMD_NODENAME`, and never waits on an unreachable controller for
//! longer than `health.scontrol_timeout`. A healthy run on a node the agent has not
//! drained makes no `scontrol` call at all.
//!
//! Exit status: 0 healthy; 1 a fatal check failed (or timed out); 78 invalid settings or
//! check files (the error names the file and line).

use std::path::PathBuf;

use clap::Args;

use super::{print_error, Output, SettingsArgs};
use crate::health::{self, ActOptions, ActOutcome, RunEnv};
use crate::settings::{self, Source};
use crate::slurm::Scontrol;

/// Arguments of `check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Settings sources.
    #[command(flatten)]
    pub settings: SettingsArgs,
    /// An LBNL NHC configuration file to read, besides `health.nhc_conf` (repeatable).
    #[arg(long = "nhc-conf", value_name = "FILE")]
    pub nhc_conf: Vec<PathBuf>,
    /// Folder of TOML check files (default: `health.checks_dir`).
    #[arg(long, value_name = "DIR")]
    pub checks_dir: Option<PathBuf>,
    /// Result format on stdout.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Report only: do not drain or resume the node, nor run NHC service actions (`-S`,
    /// `-r`, `-c`).
    #[arg(long)]
    pub no_act: bool,
    /// Prometheus textfile to write (default: `health.prometheus_textfile`).
    #[arg(long, value_name = "FILE")]
    pub prometheus_textfile: Option<PathBuf>,
}

impl CheckArgs {
    /// Runs the checks; returns the exit code.
    pub async fn run(self) -> u8 {
        let resolved = match self.settings.flag_layers().and_then(|flags| {
            let mut layers = settings::file_layers(&self.settings.paths())?;
            layers.extend(flags);
            settings::Resolved::merge(&layers)
        }) {
            Ok(r) => r,
            Err(e) => {
                print_error(&e);
                return 78;
            }
        };
        let explicit = (resolved.source_of("node.name") == Source::Flag)
            .then(|| resolved.settings.node.name.clone());
        let mut s = resolved.settings;
        if let Some(d) = self.checks_dir {
            s.health.checks_dir = d;
        }
        s.health.nhc_conf.extend(self.nhc_conf);
        if let Some(p) = self.prometheus_textfile {
            s.health.prometheus_textfile = p;
        }
        let node = health::resolve_node_name(&s, explicit.as_deref());
        let checks = match health::load(&s.health, node.as_deref()) {
            Ok(c) => c,
            Err(e) => {
                print_error(&e);
                return 78;
            }
        };
        let mut env = RunEnv::from_settings(&s);
        env.node = node.clone();
        // Report only: no NHC -S/-r/-c service starts either.
        env.service_actions = !self.no_act;
        let report = health::run_checks(&checks, &env).await;
        let action: Option<ActOutcome> = match (&node, s.health.act && !self.no_act) {
            (_, false) => None,
            (None, true) => Some(ActOutcome {
                action: "none".into(),
                detail: "node name unknown (no SLURMD_NODENAME, node.name or bootstrap state)"
                    .into(),
                state: None,
                error: None,
            }),
            (Some(n), true) => {
                let scontrol = Scontrol::new(&s.slurm.bin_dir);
                Some(health::act_on(&report, &scontrol, n, &ActOptions::from_settings(&s)).await)
            }
        };
        if !s.health.prometheus_textfile.as_os_str().is_empty() {
            if let Err(e) = health::output::write_prometheus(&report, &s.health.prometheus_textfile)
            {
                print_error(&e);
            }
        }
        match self.output {
            Output::Text => print!("{}", health::output::text(&report, action.as_ref())),
            Output::Json => println!("{}", health::output::json(&report, action.as_ref())),
        }
        if let Some(e) = action.as_ref().and_then(|a| a.error.as_ref()) {
            eprintln!("slurm-node-agent: warning: {e}");
        }
        if report.healthy() {
            0
        } else {
            1
        }
    }
}
