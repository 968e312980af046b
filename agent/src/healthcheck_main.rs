//! `slurm-node-agent-healthcheck`: `slurm-node-agent check` as its own small program, for
//! Slurm's `HealthCheckProgram` (slurm.conf(5)); the image installs it as
//! `/usr/local/bin/slurm-node-agent-healthcheck`.
//!
//! Same options, same checks, same exit codes as `slurm-node-agent check` (0 healthy, 1 a
//! fatal check failed or hung or a check file could not be used, 2 a usage error, 71 no
//! runtime, 74 the report could not be written, 78 invalid settings). slurmd runs it without
//! arguments and with only `SLURMD_NODENAME` in its environment, so no wrapper script is
//! needed. It is a program of its own because slurmd starts it every
//! `HealthCheckInterval`: it links only the health checks (with D-Bus, for the `unit`
//! checks and NHC's service actions), not the AWS SDKs, bootstrap and the daemon, so each
//! run maps and relocates a fraction of the full agent's binary.

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
    /// More logging: -v the agent's debug lines, -vv its trace, -vvv also the libraries'
    /// debug lines, -vvvv everything at trace. `RUST_LOG` overrides.
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(flatten)]
    check: CheckArgs,
}

fn main() -> ExitCode {
    let args: HealthCheck = match cli::parse_or_exit_code() {
        Ok(a) => a,
        Err(code) => return code,
    };
    cli::init_tracing(args.log_format, args.verbose);
    cli::block_on(
        &mut tokio::runtime::Builder::new_current_thread(),
        args.check.run(),
    )
}
