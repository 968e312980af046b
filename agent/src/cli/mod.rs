//! Command line: one file per subcommand, each with a `run`.
//!
//! Exit codes (sysexits(3)): 0 success; 1 unexpected failure; 2 command-line usage error;
//! 65 bad data (auth key missing, empty or the wrong size; node registered INVALID);
//! 69 a service unavailable (instance metadata, AWS APIs, GPUs missing);
//! 71 systemd refused or failed a job; 74 I/O error writing a file;
//! 75 temporary failure (node not available in slurmctld by the join deadline: retry);
//! 77 permission denied (access to the key denied); 78 invalid settings.
//! `drain`/`resume`/`status`/`run`: 75 also a busy state lock, a `--wait` timeout, or a
//! resume while the upgrade action runs; 77 also `resume` of a node drained by someone else
//! (see each command's module).
//! `check`: 1 a fatal health check failed or timed out; 78 also a bad check file.

pub mod bootstrap;
pub mod check;
pub mod config;
pub mod drain;
pub mod resume;
pub mod run;
pub mod status;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::settings::{self, Layer, SettingsError, Source};

/// Node agent for cloud Slurm clusters: bootstrap, health checks, drains.
#[derive(Debug, Parser)]
#[command(name = "slurm-node-agent", version, about, propagate_version = true)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "SLURM_NODE_AGENT_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// More logging (-v debug, -vv trace). `RUST_LOG` overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// First boot: instance metadata, settings, auth key, slurmd, until the node is IDLE.
    Bootstrap(bootstrap::BootstrapArgs),
    /// Settings: `config show` prints the merged settings with the source of each value.
    #[command(subcommand)]
    Config(config::ConfigCommand),
    /// Run the health checks once, drain or resume the node (also as HealthCheckProgram).
    Check(check::CheckArgs),
    /// The daemon: watches notices and the desired image, drives drains (systemd Type=notify).
    Run(run::RunArgs),
    /// Drain the node (idempotent): no new jobs; `--wait` until none runs.
    Drain(drain::DrainArgs),
    /// Resume the node if the agent drained it.
    Resume(resume::ResumeArgs),
    /// Show the drain state and Slurm's view of the node.
    Status(status::StatusArgs),
}

/// Output format of a command's result on stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum Output {
    /// Human text.
    #[default]
    Text,
    /// One JSON object.
    Json,
}

/// Log format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human text.
    Text,
    /// One JSON object per line.
    Json,
}

/// Where settings come from, shared by the commands that read them.
#[derive(Debug, Clone, Args)]
pub struct SettingsArgs {
    /// Main settings file.
    #[arg(long, value_name = "FILE", default_value = settings::DEFAULT_FILE)]
    pub config: std::path::PathBuf,
    /// Drop-in folder (`*.toml`, read in name order).
    #[arg(long, value_name = "DIR", default_value = settings::DEFAULT_DROPIN_DIR)]
    pub config_dir: std::path::PathBuf,
    /// Set any key, e.g. `--set node.weight=10` (repeatable; lists are comma separated).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Shorthand for `--set node.name=NAME`.
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
    /// Shorthand for `slurm.conf_servers` (repeatable, priority order): `host[:port]`.
    #[arg(long, value_name = "HOST[:PORT]")]
    pub conf_server: Vec<String>,
    /// Shorthand for `--set auth.key_source=...`: `ssm:NAME`, `secretsmanager:ID`, `file:PATH`.
    #[arg(long, value_name = "SOURCE")]
    pub auth_key_source: Option<String>,
}

impl SettingsArgs {
    /// The settings file paths.
    pub fn paths(&self) -> settings::Paths {
        settings::Paths {
            file: self.config.clone(),
            dropin_dir: self.config_dir.clone(),
        }
    }

    /// The flags as settings layers, in the order given (shorthands after `--set`).
    ///
    /// # Errors
    /// [`SettingsError`] naming the flag's key.
    pub fn flag_layers(&self) -> Result<Vec<Layer>, SettingsError> {
        let mut layers = Vec::new();
        for kv in &self.set {
            let Some((k, v)) = kv.split_once('=') else {
                return Err(SettingsError::Key {
                    origin: Source::Flag,
                    key: kv.clone(),
                    message: "--set needs KEY=VALUE".into(),
                });
            };
            layers.push(Layer::from_key_value(Source::Flag, k.trim(), v)?);
        }
        if let Some(n) = &self.node_name {
            layers.push(Layer::from_key_value(Source::Flag, "node.name", n)?);
        }
        if !self.conf_server.is_empty() {
            let mut table = toml::Table::new();
            let mut slurm = toml::Table::new();
            slurm.insert(
                "conf_servers".into(),
                toml::Value::Array(
                    self.conf_server
                        .iter()
                        .map(|s| toml::Value::String(s.clone()))
                        .collect(),
                ),
            );
            table.insert("slurm".into(), toml::Value::Table(slurm));
            layers.push(Layer::new(Source::Flag, table));
        }
        if let Some(s) = &self.auth_key_source {
            layers.push(Layer::from_key_value(Source::Flag, "auth.key_source", s)?);
        }
        Ok(layers)
    }
}

/// Sets up tracing on stderr: INFO by default (WARN... with no -v for one-shot output
/// commands is the caller's choice), `RUST_LOG` overrides.
pub fn init_tracing(format: LogFormat, verbose: u8) {
    let default = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Prints an error with its causes, as `error: a: b: c`.
pub fn print_error(e: &(dyn std::error::Error + 'static)) {
    let mut msg = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !msg.contains(&m) {
            msg.push_str(": ");
            msg.push_str(&m);
        }
        cur = c.source();
    }
    eprintln!("slurm-node-agent: error: {msg}");
}

/// Worker threads of the daemon's runtime: the main loop, and child tasks that may block
/// one thread each (health, drain, events, upgrade) without starving it.
const DAEMON_WORKER_THREADS: usize = 4;

impl Cli {
    /// Runs the command and returns the process exit code.
    pub fn run(self) -> ExitCode {
        // The daemon's main loop must keep answering the watchdog while its child tasks
        // work, some of which block a thread for a while (the state lock's wait, statfs):
        // a few worker threads. The one-shot commands need one.
        let mut builder = if matches!(self.command, Command::Run(_)) {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(DAEMON_WORKER_THREADS);
            b
        } else {
            tokio::runtime::Builder::new_current_thread()
        };
        let rt = match builder.enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                print_error(&e);
                return ExitCode::from(71);
            }
        };
        let code = rt.block_on(async {
            match self.command {
                Command::Bootstrap(a) => a.run().await,
                Command::Config(c) => c.run().await,
                Command::Check(a) => a.run().await,
                Command::Run(a) => a.run().await,
                Command::Drain(a) => a.run().await,
                Command::Resume(a) => a.run().await,
                Command::Status(a) => a.run().await,
            }
        });
        ExitCode::from(code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
