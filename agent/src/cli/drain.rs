//! `slurm-node-agent drain --reason ... [--wait] [--timeout ...]`: an operator's drain
//! (SSM Run Command), through the same state machine as the daemon's.
//!
//! Exit codes: 0 the node is draining (drained with `--wait`), also when it already was;
//! 2 bad arguments (a reason with a control character or over 256 characters); 69
//! slurmctld unavailable or the node unknown to it; 74 the state file cannot be written;
//! 75 `--wait` ran out of time, the node was resumed while waiting, or the state lock
//! stayed busy (`drain.lock_timeout`); 78 invalid settings or no node name.

use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;

use super::{print_error, Output, SettingsArgs};
use crate::drain::{Begin, DrainState, Engine, Phase};
use crate::settings::{self, Settings};

/// Settings and node name for a one-shot command: files and flags only (no IMDS, so the
/// command answers at once even when IMDS does not); the node name from `node.name` or
/// bootstrap's state file.
///
/// # Errors
/// The exit code (78), after printing the error on stderr.
pub fn local_settings(args: &SettingsArgs) -> Result<(Settings, String), u8> {
    resolve_local(args).map_err(|(code, m)| {
        eprintln!("slurm-node-agent: error: {m}");
        code
    })
}

fn resolve_local(args: &SettingsArgs) -> Result<(Settings, String), (u8, String)> {
    let layers = args.flag_layers().map_err(|e| (78, e.to_string()))?;
    let files = settings::file_layers(&args.paths()).map_err(|e| (78, e.to_string()))?;
    let resolved =
        crate::bootstrap::resolve_with(&files, None, &layers, settings::Enforce::WarnAndIgnore)
            .map_err(|e| (78, e.to_string()))?;
    let s = resolved.settings;
    let node = if s.node.name.is_empty() {
        crate::bootstrap::read_state(&s.agent.state_dir)
            .map(|b| b.node_name)
            .ok_or_else(|| {
                (
                    78,
                    format!(
                        "the node name is unknown: pass --node-name, set node.name, or run \
                         bootstrap first (it writes {})",
                        s.agent
                            .state_dir
                            .join(crate::bootstrap::STATE_FILE)
                            .display()
                    ),
                )
            })?
    } else {
        s.node.name.clone()
    };
    Ok((s, node))
}

fn parse_reason(s: &str) -> Result<String, String> {
    crate::slurm::node::validate_reason(s).map(|()| s.to_string())
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e}; write e.g. 90s, 30m, 2h"))
}

/// Arguments of `drain`.
#[derive(Debug, Args)]
pub struct DrainArgs {
    /// Settings sources.
    #[command(flatten)]
    pub settings: SettingsArgs,
    /// Why (shown by `sinfo -R` as `node-agent/manual: <reason>`).
    #[arg(long, value_parser = parse_reason)]
    pub reason: String,
    /// Wait until no job runs on the node.
    #[arg(long)]
    pub wait: bool,
    /// Give up waiting after this long (with `--wait`): exit 75.
    #[arg(long, value_parser = parse_duration, default_value = "1h", requires = "wait")]
    pub timeout: Duration,
    /// Result format on stdout.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// What `drain`, `resume` and `status` print.
#[derive(Debug, Serialize)]
pub struct Report {
    /// NodeName.
    pub node: String,
    /// What the command did: `started`, `escalated`, `already_draining`,
    /// `already_handled`, `resumed`, `status`.
    pub result: String,
    /// Phase after the command.
    pub phase: String,
    /// Cause kind.
    pub cause: Option<String>,
    /// Slurm reason set by the agent.
    pub reason: Option<String>,
    /// The whole persisted state.
    pub state: DrainState,
    /// Slurm's view (`status`): State and Reason, or the error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slurm: Option<serde_json::Value>,
    /// Milliseconds spent waiting (`--wait`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waited_ms: Option<u64>,
}

impl Report {
    /// A report of `state`.
    pub fn new(node: &str, result: &str, state: DrainState) -> Report {
        Report {
            node: node.to_string(),
            result: result.to_string(),
            phase: state.phase.as_str().to_string(),
            cause: state.cause.as_ref().map(|c| c.kind().to_string()),
            reason: state.reason.clone(),
            state,
            slurm: None,
            waited_ms: None,
        }
    }

    /// Prints it as text or JSON.
    pub fn print(&self, output: Output) {
        match output {
            Output::Json => match serde_json::to_string(self) {
                Ok(s) => println!("{s}"),
                Err(e) => print_error(&e),
            },
            Output::Text => {
                print!("node {}: {}", self.node, self.phase);
                if let Some(r) = &self.reason {
                    print!(" ({r})");
                }
                println!(" [{}]", self.result);
                if let Some(e) = &self.state.last_error {
                    println!("  last error: {e}");
                }
                if let Some(s) = &self.slurm {
                    println!("  slurm: {s}");
                }
            }
        }
    }
}

fn begin_name(b: &Begin) -> &'static str {
    match b {
        Begin::Started => "started",
        Begin::Escalated { .. } => "escalated",
        Begin::AlreadyDraining { .. } => "already_draining",
        Begin::AlreadyHandled => "already_handled",
    }
}

impl DrainArgs {
    /// Runs the command; returns the exit code.
    pub async fn run(self) -> u8 {
        let (s, node) = match local_settings(&self.settings) {
            Ok(v) => v,
            Err(code) => return code,
        };
        let engine = Engine::new(&s, &node);
        let cause = crate::drain::Cause::Manual {
            reason: self.reason.clone(),
        };
        let requested = match engine.request(cause).await {
            Ok(r) => r,
            Err(e) => {
                print_error(&e);
                return e.exit_code();
            }
        };
        let mut report = Report::new(&node, begin_name(&requested.begin), requested.state);
        if !self.wait {
            report.print(self.output);
            return 0;
        }
        let start = Instant::now();
        let code = loop {
            match engine.progress().await {
                Ok(Phase::Drained | Phase::Acting | Phase::Done) => break 0,
                Ok(Phase::Active) => {
                    eprintln!("slurm-node-agent: error: node {node} was resumed while waiting");
                    break 75;
                }
                Ok(Phase::Draining) => {}
                Err(e) => tracing::warn!("{e}"),
            }
            if start.elapsed() >= self.timeout {
                eprintln!(
                    "slurm-node-agent: error: node {node} still has jobs after {}",
                    humantime::format_duration(self.timeout)
                );
                break 75;
            }
            tokio::time::sleep(Duration::from_secs(1).min(self.timeout)).await;
        };
        if let Ok(st) = engine.load() {
            let result = report.result.clone();
            report = Report::new(&node, &result, st);
        }
        report.waited_ms = Some(u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX));
        report.print(self.output);
        code
    }
}
