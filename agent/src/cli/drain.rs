//! `slurm-node-agent drain --reason ... [--wait] [--timeout ...]`: an operator's drain
//! (SSM Run Command), through the same state machine as the daemon's.
//!
//! Exit codes: 0 the node is draining (drained with `--wait`), also when it already was;
//! 2 bad arguments (a reason with a control character or over 256 characters); 69
//! slurmctld unavailable or the node unknown to it; 74 the state file cannot be written;
//! 75 `--wait` ran out of time, the node was resumed while waiting, or the state lock
//! stayed busy (`drain.lock_timeout`); 78 invalid settings, no node name, or a login node
//! (`node.role = "login"`).

use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;

use super::{print_error, Output, SettingsArgs};
use crate::drain::{Begin, DrainState, Phase};
use crate::exit::Exit;
use crate::identity::{self, NodeIdentity};
use crate::settings::Settings;

/// Settings and identity for a one-shot command (`drain`, `resume`, `status`), through
/// [`crate::identity::resolve`]: bootstrap's record when there is one, else the settings
/// and NodeName resolved over instance metadata exactly as bootstrap does.
///
/// # Errors
/// The exit code (78 settings or no node name, 69 no record and no instance metadata),
/// after printing the error on stderr.
pub async fn local_settings(args: &SettingsArgs) -> Result<(Settings, NodeIdentity), Exit> {
    let layers = args.flag_layers().map_err(|e| {
        print_error(&e);
        Exit::Config
    })?;
    let inputs = crate::settings::pipeline::Inputs::read(&args.paths(), &layers).map_err(|e| {
        print_error(&e);
        Exit::Config
    })?;
    let req = identity::Request {
        inputs: &inputs,
        lookup: identity::Lookup::RecordThenImds,
        instance: None,
        imds_timeout: Duration::from_secs(10),
        corrupt_record: identity::CorruptRecord::SetAside,
    };
    match identity::resolve(&req).await {
        Ok((r, id)) => Ok((r.settings, id)),
        Err(e) => {
            print_error(&e);
            Err(e.exit())
        }
    }
}

/// [`local_settings`] for a command that acts on slurmctld's node (`drain`, `resume`): a
/// login node (`node.role = "login"`) is not a Slurm node, so it is refused (exit 78).
///
/// # Errors
/// As [`local_settings`]; 78 on a login node, after printing why.
pub async fn slurm_node_settings(args: &SettingsArgs) -> Result<(Settings, NodeIdentity), Exit> {
    let (s, id) = local_settings(args).await?;
    if s.node.role == crate::nodedef::Role::Login {
        print_error(&LoginNode {
            name: id.node_name.clone(),
        });
        return Err(Exit::Config);
    }
    Ok((s, id))
}

/// A command for a Slurm node on a login node.
#[derive(Debug, thiserror::Error)]
#[error(
    "{name} is a login node (node.role = \"login\": sackd, no slurmd): it is not a node of \
     slurmctld, so there is nothing to drain or resume"
)]
pub struct LoginNode {
    /// The login node's name.
    pub name: String,
}

fn parse_reason(s: &str) -> Result<String, String> {
    crate::slurm::node::validate_reason(s)
        .map(|()| s.to_string())
        .map_err(|e| e.to_string())
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
    /// Why (shown by `sinfo -R` as `slurm-node-agent/operator@<instance-id>: <reason>`).
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
    /// EC2 instance id of this incarnation (`status`; `unknown` when not known).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
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
    /// The repair in effect for the fault found now (`status`; `repair.json`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repair: Option<crate::repair::record::Current>,
    /// This boot's start-up gate (`status`; `start-gate.json`): its parts, where each
    /// stands, and by when it must have ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_gate: Option<crate::health::startgate::GateRecord>,
    /// `node.role` (`status`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// What the drain does next, in words (`status`): `none: the node takes jobs`, `no new
    /// jobs; once the running ones end: reboot through Slurm ...`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    /// The daemon's last health pass (`status`; `health-last.json`), with `age_s`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health: Option<serde_json::Value>,
    /// The running and desired image (`status`): `{running, desired, checked_unix,
    /// verdict}`, the last three from the daemon's last check (`upgrade-last.json`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<serde_json::Value>,
    /// The Slurm release `/opt/slurm` points at among those installed (`status`):
    /// `{chosen, installed}`; absent with one release.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slurm_release: Option<serde_json::Value>,
    /// What a long step of the agent waits for now (`status`; `progress.json`): bootstrap's
    /// join, a slow mount, a part of the start-up gate.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<crate::progress::Record>,
}

impl Report {
    /// A report of `state`.
    pub fn new(node: &str, result: &str, state: DrainState) -> Report {
        Report {
            node: node.to_string(),
            instance_id: None,
            result: result.to_string(),
            phase: state.phase.as_str().to_string(),
            cause: state.cause.as_ref().map(|c| c.kind().to_string()),
            reason: state.reason.clone(),
            state,
            slurm: None,
            waited_ms: None,
            repair: None,
            start_gate: None,
            role: None,
            plan: None,
            health: None,
            image: None,
            slurm_release: None,
            waiting: Vec::new(),
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
        Begin::Restated { .. } => "restated",
        Begin::AlreadyDraining { .. } => "already_draining",
        Begin::AlreadyHandled => "already_handled",
    }
}

impl DrainArgs {
    /// Runs the command; returns the exit code.
    pub async fn run(self) -> Exit {
        let (s, id) = match slurm_node_settings(&self.settings).await {
            Ok(v) => v,
            Err(code) => return code,
        };
        let node = id.node_name.clone();
        let engine = s.drain_engine(&node).with_instance(&id.instance_id);
        let cause = crate::drain::Cause::Manual {
            reason: self.reason.clone(),
        };
        let requested = match engine.request(cause).await {
            Ok(r) => r,
            Err(e) => {
                print_error(&e);
                return e.exit();
            }
        };
        let mut report = Report::new(&node, begin_name(&requested.begin), requested.state);
        if !self.wait {
            report.print(self.output);
            return Exit::Ok;
        }
        let start = Instant::now();
        let code = loop {
            match engine.progress().await {
                Ok(Phase::Drained | Phase::Acting | Phase::Done) => break Exit::Ok,
                Ok(Phase::Active) => {
                    super::print_error_message(&format!("node {node} was resumed while waiting"));
                    break Exit::TempFail;
                }
                Ok(Phase::Draining) => {}
                Err(e) => tracing::warn!("{e}"),
            }
            if start.elapsed() >= self.timeout {
                super::print_error_message(&format!(
                    "node {node} still has jobs after {}",
                    humantime::format_duration(self.timeout)
                ));
                break Exit::TempFail;
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
