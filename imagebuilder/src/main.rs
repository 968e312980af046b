//! `slurm-image-builder` binary: parse the command line, run, print, map errors to exit
//! codes (see `slurm_image_builder::error`).

use clap::Parser;
use slurm_image_builder::cli::{Cli, Output};
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Colour only for a person at a terminal; journald, CI logs and files get plain text.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let output = cli.output;
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(slurm_image_builder::error::EXIT_FAILURE);
        }
    };
    match runtime.block_on(cli.run()) {
        Ok(report) => {
            match output {
                Output::Json => println!("{}", report.json),
                Output::Text => print!("{}", report.text),
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            let code = e.exit_code();
            if output == Output::Json {
                println!(
                    "{}",
                    serde_json::json!({"error": e.to_string(), "exit_code": code})
                );
            }
            eprintln!("error: {e}");
            ExitCode::from(code)
        }
    }
}
