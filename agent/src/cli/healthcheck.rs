//! The command line of `slurm-node-agent-healthcheck` (Slurm's `HealthCheckProgram`, see
//! `healthcheck_main.rs`): `check`'s options on a program of its own. Here, in the library,
//! so that `slurm-node-agent generate` writes its man page and completions too.

use clap::Parser;

use super::{check::CheckArgs, LogFormat};

/// The HealthCheckProgram's name, which its usage and final error lines start with.
pub const PROGRAM: &str = "slurm-node-agent-healthcheck";

/// Runs the node's health checks once and drains or resumes the node (Slurm's
/// HealthCheckProgram; the same as `slurm-node-agent check`).
#[derive(Debug, Parser)]
#[command(name = PROGRAM, version = super::VERSION)]
pub struct HealthCheck {
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "SLURM_NODE_AGENT_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// More logging: -v the agent's debug lines, -vv its trace, -vvv also the libraries'
    /// debug lines, -vvvv everything at trace. `RUST_LOG` overrides.
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// The check's options.
    #[command(flatten)]
    pub check: CheckArgs,
}
