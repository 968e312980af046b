//! `imds-emulator`: runs the IMDSv2 emulator until SIGINT or SIGTERM.
//!
//! Prints the endpoint (`http://ADDR:PORT`) as one line on stdout once listening; logs go
//! to stderr (`RUST_LOG=debug` shows every request). The control API under
//! `/__emulator/` changes the state while it runs (see the crate README).

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Parser;
use imds_emulator::{Config, Emulator};

/// An emulator of the EC2 instance metadata service (IMDSv2) for tests and local use.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:1338")]
    bind: SocketAddr,
    /// Write the port actually bound to this file (atomically), for scripts.
    #[arg(long, value_name = "FILE")]
    port_file: Option<PathBuf>,
    /// Add an instance tag KEY=VALUE (repeatable).
    #[arg(long = "tag", value_name = "KEY=VALUE", value_parser = key_value)]
    tags: Vec<(String, String)>,
    /// Remove AEMM's default tags (Name, Test) before adding --tag ones.
    #[arg(long)]
    clear_tags: bool,
    /// Serve this file's bytes as /latest/user-data.
    #[arg(long, value_name = "FILE", conflicts_with = "no_user_data")]
    user_data_file: Option<PathBuf>,
    /// Serve no user data (/latest/user-data answers 404).
    #[arg(long)]
    no_user_data: bool,
    /// Set a meta-data path, e.g. `instance-type=c5.large` (repeatable).
    #[arg(long = "set", value_name = "PATH=VALUE", value_parser = key_value)]
    sets: Vec<(String, String)>,
    /// Answer GETs without a token (IMDSv1 allowed); by default a token is required.
    #[arg(long)]
    allow_imdsv1: bool,
    /// Do not serve the control API under /__emulator/.
    #[arg(long)]
    no_control_api: bool,
}

fn key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    if let Err(e) = run(Cli::parse()) {
        eprintln!("imds-emulator: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    let user_data = match &cli.user_data_file {
        Some(path) => Some(
            std::fs::read(path)
                .with_context(|| format!("reading --user-data-file {}", path.display()))?,
        ),
        None => None,
    };
    for (key, _) in &cli.tags {
        if key.contains('/') {
            bail!("--tag {key:?}: a tag key served in metadata cannot contain '/'");
        }
    }
    let emulator = Emulator::start(Config {
        bind: cli.bind,
        allow_imdsv1: cli.allow_imdsv1,
        control_api: !cli.no_control_api,
    })
    .with_context(|| format!("listening on {}", cli.bind))?;
    if cli.clear_tags {
        emulator.clear_tags();
    }
    for (key, value) in &cli.tags {
        emulator.set_tag(key, value);
    }
    if cli.no_user_data {
        emulator.clear_user_data();
    }
    if let Some(data) = user_data {
        emulator.set_user_data(data);
    }
    for (path, value) in &cli.sets {
        emulator.set(path, value.as_str());
    }
    // The signal handlers before the port file is written and the endpoint printed: whoever read it may send SIGTERM
    // at once (a SIGTERM between the two was lost: the emulator ran on until a second one).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("creating the signal runtime")?;
    let (mut term, mut int) = runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        let int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
        anyhow::Ok((term, int))
    })?;
    if let Some(path) = &cli.port_file {
        write_atomically(path, format!("{}\n", emulator.addr().port()).as_bytes())
            .with_context(|| format!("writing --port-file {}", path.display()))?;
    }
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{}", emulator.endpoint()).context("writing to stdout")?;
    stdout.flush().context("writing to stdout")?;
    drop(stdout);
    tracing::info!(endpoint = %emulator.endpoint(), "IMDS emulator listening");

    runtime.block_on(async {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    });
    tracing::info!("stopping");
    emulator.shutdown();
    Ok(())
}

/// Writes `data` to a temporary file beside `path`, syncs it and renames it over `path`.
fn write_atomically(path: &std::path::Path, data: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp.{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(data)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}
