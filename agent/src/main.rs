//! Entry point of `slurm-node-agent`: parse the command line, set up logging, run, and map
//! the outcome to an exit code (see `slurm_node_agent::cli::exit`).

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = slurm_node_agent::cli::Cli::parse();
    slurm_node_agent::cli::init_tracing(cli.log_format, cli.verbose);
    cli.run()
}
