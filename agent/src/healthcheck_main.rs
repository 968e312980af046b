//! `slurm-node-agent-healthcheck`: `slurm-node-agent check` as its own small program, for
//! Slurm's `HealthCheckProgram` (slurm.conf(5)): `HealthCheckProgram=/usr/sbin/slurm-node-agent-healthcheck`.
//!
//! Same options, same checks, same exit codes as `slurm-node-agent check` (0 healthy, 1 a
//! fatal check failed or hung, 78 invalid settings or check files). slurmd runs it without
//! arguments and with only `SLURMD_NODENAME` in its environment, so no wrapper script is
//! needed. It is a program of its own because slurmd starts it every
//! `HealthCheckInterval`: it links only the health checks, not the AWS SDKs, D-Bus and
//! the daemon, so each run maps and relocates a fraction of the full agent's binary.

use std::process::ExitCode;

use clap::Parser;
use slurm_node_agent::cli::{self, check::CheckArgs, LogFormat};

/// Runs the node's health checks once and drains or resumes the node (Slurm's
/// HealthCheckProgram; the same as `slurm-node-agent check`).
#[derive(Debug, Parser)]
#[command(name = "slurm-node-agent-healthcheck", version)]
struct HealthCheck {
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "SLURM_NODE_AGENT_LOG_FORMAT")]
    log_format: LogFormat,
    /// More logging: -v the agent's debug lines, -vv its trace. `RUST_LOG` overrides.
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(flatten)]
    check: CheckArgs,
}

fn main() -> ExitCode {
    let args = match HealthCheck::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    cli::init_tracing(args.log_format, args.verbose);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            cli::print_error(&e);
            return ExitCode::from(71);
        }
    };
    ExitCode::from(rt.block_on(args.check.run()))
}
