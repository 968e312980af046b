//! Command line: one file per subcommand, each with a `run`.
//!
//! Exit codes: each command ends with an [`Exit`] from the one table in [`crate::exit`]
//! (sysexits(3) values; `docs/exit-codes.md` lists them), each error type saying which
//! (`exit()`); a command maps only what it finds itself (a usage error, a report it could
//! not write, a failed check).
//!
//! Floor 11 (roof): the commands; only `main.rs` and `healthcheck_main.rs` are above it.

pub mod bootstrap;
pub mod check;
pub mod config;
pub mod drain;
pub mod healthcheck;
pub mod manual;
pub mod repair;
pub mod resume;
pub mod run;
pub mod status;
pub mod support_bundle;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::exit::Exit;
use crate::settings::{self, Layer, SettingsError, Source};

/// Node agent for cloud Slurm clusters: bootstrap, health checks, drains.
#[derive(Debug, Parser)]
#[command(name = PROGRAM, version = VERSION, about, propagate_version = true)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "SLURM_NODE_AGENT_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// More logging: -v the agent's debug lines, -vv its trace, -vvv also the AWS SDK's
    /// and the HTTP libraries' debug lines, -vvvv everything at trace. `RUST_LOG` overrides.
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
    /// Settings: `config show` prints the merged settings with the source of each value,
    /// `config reference` every key's documentation.
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
    /// The repair on this node: clear its history, lift the breaker for a while.
    Repair(repair::RepairArgs),
    /// One .tar.gz for whoever helps: versions, settings (redacted), state files, the
    /// journal, the kernel log, slurmctld's record of the node, mounts and scratch.
    SupportBundle(support_bundle::SupportBundleArgs),
    /// Write the man pages and shell completions (bash, zsh, fish) of slurm-node-agent and
    /// slurm-node-agent-healthcheck below a `share` folder (the image's agent step).
    #[command(hide = true)]
    Generate(manual::GenerateArgs),
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

/// The log filter for `-v` counted `verbose` times: the agent's own targets
/// (`slurm_node_agent`) get more detail first; the libraries (aws-config, the AWS SDK,
/// aws-smithy, hyper), which log hundreds of debug lines per AWS call, only from -vvv.
pub fn filter_directives(verbose: u8) -> &'static str {
    match verbose {
        0 => "info",
        1 => "info,slurm_node_agent=debug",
        2 => "info,slurm_node_agent=trace",
        3 => "debug,slurm_node_agent=trace",
        _ => "trace",
    }
}

/// Sets up tracing on stderr: INFO by default (WARN... with no -v for one-shot output
/// commands is the caller's choice), `RUST_LOG` overrides.
pub fn init_tracing(format: LogFormat, verbose: u8) {
    let default = filter_directives(verbose);
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // JSON lines name their target (filterable); text stays short.
        .with_target(format == LogFormat::Json);
    let _ = LOG_FORMAT.set(format);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// The log format chosen at start-up ([`init_tracing`]); the final error and warning lines
/// ([`print_error_message`], [`print_warning_message`]) follow it.
static LOG_FORMAT: std::sync::OnceLock<LogFormat> = std::sync::OnceLock::new();

/// Prints an error with its causes, as `error: a: b: c` (a JSON line with
/// `--log-format json`).
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
    print_error_message(&msg);
}

/// The agent's program name, which its final error and warning lines start with.
pub const PROGRAM: &str = "slurm-node-agent";

/// What `--version` prints after the program's name (both programs): the workspace's
/// version and the commit it was built from, `0.1.0 (commit 3d43127abcde)`; the commit has
/// `-dirty` appended when tracked files differed from it, and is `unknown` when built
/// outside a git checkout (see the build script's `commit`). The image builder reads the
/// second word of the line as the agent's version.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("SLURM_NODE_AGENT_COMMIT"),
    ")"
);

/// The program whose final lines these are ([`set_program_name`]); [`PROGRAM`] when unset.
static PROGRAM_NAME: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// Names the running program in its final error and warning lines (`NAME: error: MSG`):
/// `slurm-node-agent-healthcheck` sets its own name, the agent keeps [`PROGRAM`]. Call it
/// once at start-up, before anything is printed; a later call changes nothing.
pub fn set_program_name(name: &'static str) {
    let _ = PROGRAM_NAME.set(name);
}

/// Prints a command's final error line on stderr: `slurm-node-agent: error: MSG` (the
/// program's own name: [`set_program_name`]), or with `--log-format json` one JSON object
/// shaped as the log lines are (`timestamp`, `level` `ERROR`, `fields.message`, `target`).
pub fn print_error_message(msg: &str) {
    eprintln!("{}", final_line(program_name(), "ERROR", msg, log_format()));
}

/// Prints a warning line on stderr, as [`print_error_message`] does (level `WARN`).
pub fn print_warning_message(msg: &str) {
    eprintln!("{}", final_line(program_name(), "WARN", msg, log_format()));
}

fn log_format() -> LogFormat {
    LOG_FORMAT.get().copied().unwrap_or(LogFormat::Text)
}

fn program_name() -> &'static str {
    PROGRAM_NAME.get().copied().unwrap_or(PROGRAM)
}

/// One final line of `program`: text `PROGRAM: error: MSG`, or a JSON object.
fn final_line(program: &str, level: &str, msg: &str, format: LogFormat) -> String {
    match format {
        LogFormat::Text => {
            let word = if level == "ERROR" { "error" } else { "warning" };
            format!("{program}: {word}: {msg}")
        }
        LogFormat::Json => serde_json::json!({
            "timestamp": crate::time::format(crate::time::now()),
            "level": level,
            "fields": { "message": msg },
            "target": "slurm_node_agent",
        })
        .to_string(),
    }
}

/// Whether the command line or the environment asks for JSON logs, read without clap (for
/// the usage error clap could not parse).
fn json_logs_requested(args: &[std::ffi::OsString]) -> bool {
    let mut json = std::env::var("SLURM_NODE_AGENT_LOG_FORMAT").is_ok_and(|v| v == "json");
    let mut it = args.iter().map(|a| a.to_string_lossy());
    while let Some(a) = it.next() {
        if a == "--log-format" {
            json = it.next().is_some_and(|v| v == "json");
        } else if let Some(v) = a.strip_prefix("--log-format=") {
            json = v == "json";
        }
    }
    json
}

impl Cli {
    /// Parses the command line; on a usage error prints it (as a JSON line when JSON logs
    /// were asked for) and returns the exit code (2; 0 for `--help` and `--version`).
    ///
    /// # Errors
    /// The exit code to end with.
    pub fn parse_or_exit_code() -> Result<Cli, ExitCode> {
        parse_or_exit_code()
    }
}

/// Parses the command line into `P` (the agent's [`Cli`], or another program's parser such
/// as `slurm-node-agent-healthcheck`'s); on a usage error prints it (as a JSON line when
/// JSON logs were asked for) and returns the exit code (2; 0 for `--help` and `--version`).
///
/// # Errors
/// The exit code to end with.
pub fn parse_or_exit_code<P: Parser>() -> Result<P, ExitCode> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    match P::try_parse_from(&args) {
        Ok(cli) => Ok(cli),
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            Err(Exit::Ok.into())
        }
        Err(e) if json_logs_requested(&args) => {
            let text = e.render().to_string();
            let msg = text
                .trim()
                .strip_prefix("error: ")
                .unwrap_or(text.trim())
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join(" ");
            eprintln!(
                "{}",
                final_line(program_name(), "ERROR", &msg, LogFormat::Json)
            );
            Err(Exit::Usage.into())
        }
        Err(e) => {
            let _ = e.print();
            Err(Exit::Usage.into())
        }
    }
}

impl Cli {
    /// Runs the command and returns the process exit code.
    pub fn run(self) -> ExitCode {
        // One thread for every command. The daemon's main loop, watchdog and metadata
        // polls run on it too; its work that may block a thread for a while (the state
        // lock's wait, statfs, health checks) runs on a runtime of its own (daemon.rs,
        // `WorkRuntime`), so that an idle daemon wakes once per tick.
        let mut builder = tokio::runtime::Builder::new_current_thread();
        block_on(&mut builder, async {
            match self.command {
                Command::Bootstrap(a) => a.run().await,
                Command::Config(c) => c.run().await,
                Command::Check(a) => a.run().await,
                Command::Run(a) => a.run().await,
                Command::Drain(a) => a.run().await,
                Command::Resume(a) => a.run().await,
                Command::Status(a) => a.run().await,
                Command::Repair(a) => a.run().await,
                Command::SupportBundle(a) => a.run().await,
                Command::Generate(a) => a.run().await,
            }
        })
    }
}

/// Runs a command's future on a runtime from `builder` (I/O and timers enabled) and returns
/// its exit code; [`Exit::OsErr`] when the runtime cannot be built.
pub fn block_on(
    builder: &mut tokio::runtime::Builder,
    command: impl std::future::Future<Output = Exit>,
) -> ExitCode {
    match builder.enable_all().build() {
        Ok(rt) => rt.block_on(command).into(),
        Err(e) => {
            print_error(&e);
            Exit::OsErr.into()
        }
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

    #[test]
    fn final_lines_follow_the_log_format() {
        assert_eq!(
            final_line(PROGRAM, "ERROR", "x: y", LogFormat::Text),
            "slurm-node-agent: error: x: y"
        );
        assert_eq!(
            final_line(PROGRAM, "WARN", "w", LogFormat::Text),
            "slurm-node-agent: warning: w"
        );
        // The HealthCheckProgram's lines name it, not the agent.
        assert_eq!(
            final_line(healthcheck::PROGRAM, "ERROR", "x", LogFormat::Text),
            "slurm-node-agent-healthcheck: error: x"
        );
        let v: serde_json::Value =
            serde_json::from_str(&final_line(PROGRAM, "ERROR", "a \"b\"\nc", LogFormat::Json))
                .expect("JSON");
        assert_eq!(v["level"], "ERROR");
        assert_eq!(v["fields"]["message"], "a \"b\"\nc");
        assert_eq!(v["target"], "slurm_node_agent");
    }

    #[test]
    fn json_logs_are_found_without_clap() {
        let a = |v: &[&str]| v.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        assert!(json_logs_requested(&a(&[
            "sna",
            "--log-format",
            "json",
            "bogus"
        ])));
        assert!(json_logs_requested(&a(&[
            "sna",
            "status",
            "--log-format=json"
        ])));
        assert!(!json_logs_requested(&a(&["sna", "--log-format", "text"])));
    }
}
