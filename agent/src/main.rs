//! Entry point of `slurm-node-agent`: parse the command line, set up logging, run, and map
//! the outcome to an exit code (see `slurm_node_agent::cli::exit`).

fn main() -> std::process::ExitCode {
    let cli = match slurm_node_agent::cli::Cli::parse_or_exit_code() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    slurm_node_agent::cli::init_tracing(cli.log_format, cli.verbose);
    cli.run()
}
