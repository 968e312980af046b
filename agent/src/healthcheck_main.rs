//! `slurm-node-agent-healthcheck`: `slurm-node-agent check` as its own small program, for
//! Slurm's `HealthCheckProgram` (slurm.conf(5)); the image and the packages install it as
//! `/usr/bin/slurm-node-agent-healthcheck`.
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

use slurm_node_agent::cli::{self, healthcheck::HealthCheck};

fn main() -> ExitCode {
    // Its own name on its error lines, not the agent's.
    cli::set_program_name(cli::healthcheck::PROGRAM);
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
