//! The start-up gate (`[start_gate]`): deep checks a node passes at every boot, a reboot
//! included, before it takes a job: NVIDIA DCGM's diagnostics at a profile's level
//! (`dcgmi diag -r 1/2/3`, the managed service's `deepHealthChecks.onStart` profiles
//! `QUICK`, `MEDIUM`, `LONG`) and the site's commands of the same kind (an EFA loopback
//! with `fi_pingpong`, a one-node NCCL test), each with its own time budget, free of the
//! HealthCheckProgram's deadline.
//!
//! Bootstrap runs it after the `nodeBootstrapped` lifecycle scripts (its `start_gate` step):
//! the node is drained with the gate's own reason (`slurm-node-agent/gate@<id>: start-up
//! gate running ...`, a cause of the drain state machine that only the gate lifts) before
//! slurmd registers where slurmctld already has its record, right after otherwise, so that
//! a long profile never keeps a node unregistered past `ResumeTimeout`; then the parts run
//! one after the other. All pass: the gate lifts its drain. One fails: the drain stays with
//! the failure's words, and the `start_gate` health check ([`crate::health::startgate`])
//! reports it for the rest of the boot, so that the repair pass takes the fault's action
//! (the repair module, family `gate`).
//!
//! No NVIDIA GPU, GPUs in MIG mode (DCGM's diagnostics need whole GPUs) and no `dcgmi` skip
//! the DCGM part with the reason, not a failure of the node.
//!
//! Floor 6 (subsystems): over `health` (its record and command runner), `systemd`,
//! `section`.

pub mod dcgm;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::health::startgate::{GateRecord, Part, PartStatus};
use crate::section::{HumanDuration, InvalidKey};

/// `start_gate.profile`: the DCGM diagnostic level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// No DCGM diagnostic.
    #[default]
    None,
    /// `dcgmi diag -r 1` (the service's `QUICK`): seconds to a minute.
    Quick,
    /// `dcgmi diag -r 2` (`MEDIUM`): a few minutes.
    Medium,
    /// `dcgmi diag -r 3` (`LONG`): up to about half an hour.
    Long,
}

impl Profile {
    /// `none`, `quick`, `medium`, `long`.
    pub fn as_str(self) -> &'static str {
        match self {
            Profile::None => "none",
            Profile::Quick => "quick",
            Profile::Medium => "medium",
            Profile::Long => "long",
        }
    }

    /// `dcgmi diag -r`'s level: 1, 2, 3 (`None` for none).
    pub fn level(self) -> Option<u8> {
        match self {
            Profile::None => None,
            Profile::Quick => Some(1),
            Profile::Medium => Some(2),
            Profile::Long => Some(3),
        }
    }

    /// The profile's default time budget: 5 min, 20 min, 90 min.
    pub fn default_budget(self) -> Duration {
        Duration::from_secs(match self {
            Profile::None => 0,
            Profile::Quick => 5 * 60,
            Profile::Medium => 20 * 60,
            Profile::Long => 90 * 60,
        })
    }
}

/// `[[start_gate.commands]]`: a site command of the gate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateCommand {
    /// Its name: the check's (`start-up gate: <name>`) and `repair.checks`' handle.
    pub name: String,
    /// The program (an absolute path) and its arguments, run without a shell; it passes
    /// when it exits 0.
    pub argv: Vec<String>,
    /// Its time budget (default 5 min); killed with its process group past it.
    #[serde(default = "default_command_budget")]
    pub budget: HumanDuration,
}

fn default_command_budget() -> HumanDuration {
    HumanDuration(Duration::from_secs(300))
}

/// `[start_gate]`: deep checks at every boot before the node takes a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StartGateSettings {
    /// DCGM's diagnostic level: `none` (default), `quick`, `medium`, `long`.
    pub profile: Profile,
    /// The DCGM part's time budget; `"0s"` (the default): the profile's (quick 5 min,
    /// medium 20 min, long 90 min).
    pub budget: HumanDuration,
    /// DCGM's command-line program.
    pub dcgmi: PathBuf,
    /// `nvidia-smi`, asked for the GPUs and their MIG mode
    /// (`--query-gpu=index,mig.mode.current --format=csv,noheader`).
    pub nvidia_smi: PathBuf,
    /// DCGM's host engine's unit (`nv-hostengine`), started and waited for before the
    /// diagnostic; missing, `dcgmi` runs its own embedded host engine.
    pub host_engine_unit: String,
    /// How long the host engine may take to become active.
    pub host_engine_wait: HumanDuration,
    /// Site commands, run after DCGM's diagnostic, in order.
    pub commands: Vec<GateCommand>,
}

impl Default for StartGateSettings {
    fn default() -> Self {
        StartGateSettings {
            profile: Profile::None,
            budget: HumanDuration(Duration::ZERO),
            dcgmi: PathBuf::from("/usr/bin/dcgmi"),
            nvidia_smi: PathBuf::from("/usr/bin/nvidia-smi"),
            host_engine_unit: "nvidia-dcgm.service".into(),
            host_engine_wait: HumanDuration(Duration::from_secs(30)),
            commands: Vec::new(),
        }
    }
}

/// What runs as root is the image's or the launch's, never a tag's.
impl crate::section::Classified for StartGateSettings {
    const SECTION: &'static str = "start_gate";
    const TRUST: &'static [crate::section::KeyTrust] = {
        use crate::section::KeyTrust as K;
        &[
            K::user_data("profile"),
            K::user_data("budget"),
            K::image("dcgmi"),
            K::image("nvidia_smi"),
            K::image("host_engine_unit"),
            K::user_data("host_engine_wait"),
            K::image("commands"),
        ]
    };
}

/// The DCGM part's name.
pub const DCGM_PART: &str = "dcgm";

impl StartGateSettings {
    /// Checks the programs (absolute), the budgets (more than 0) and the commands (a name,
    /// each once and not `dcgm`, an absolute program).
    ///
    /// # Errors
    /// [`InvalidKey`]: the key (`start_gate.commands[<i>].argv`...) and what is wrong.
    pub fn validate(&self) -> Result<(), InvalidKey> {
        for (k, p) in [
            ("start_gate.dcgmi", &self.dcgmi),
            ("start_gate.nvidia_smi", &self.nvidia_smi),
        ] {
            if !p.is_absolute() {
                return Err(InvalidKey::new(
                    k,
                    format!(
                        "must be an absolute path, got {:?}",
                        p.display().to_string()
                    ),
                ));
            }
        }
        if self.host_engine_wait.is_zero() {
            return Err(InvalidKey::new(
                "start_gate.host_engine_wait",
                "must be more than 0 (\"30s\")",
            ));
        }
        crate::systemd::validate_unit_name(&self.host_engine_unit)
            .map_err(|e| InvalidKey::new("start_gate.host_engine_unit", e.to_string()))?;
        let mut seen = std::collections::BTreeSet::new();
        for (i, c) in self.commands.iter().enumerate() {
            let key = |leaf: &str| format!("start_gate.commands[{i}].{leaf}");
            if c.name.trim().is_empty() || c.name.chars().any(char::is_control) {
                return Err(InvalidKey::new(
                    key("name"),
                    "must be a name without control characters (\"efa-loopback\")",
                ));
            }
            if c.name == DCGM_PART || !seen.insert(c.name.as_str()) {
                return Err(InvalidKey::new(
                    key("name"),
                    format!("{:?} is taken (by `dcgm` or an earlier command)", c.name),
                ));
            }
            match c.argv.first() {
                Some(p) if p.starts_with('/') => {}
                other => {
                    return Err(InvalidKey::new(
                        key("argv"),
                        format!(
                            "must start with an absolute program path (no shell runs it: [\"/opt/amazon/efa/bin/fi_pingpong\", \"-p\", \"efa\"]), got {other:?}"
                        ),
                    ))
                }
            }
            if c.budget.is_zero() {
                return Err(InvalidKey::new(
                    key("budget"),
                    "must be more than 0 (\"5m\")",
                ));
            }
        }
        Ok(())
    }

    /// Whether the gate has any part.
    pub fn enabled(&self) -> bool {
        self.profile != Profile::None || !self.commands.is_empty()
    }

    /// The parts in the order they run, each its name and its command (`None`: DCGM's
    /// diagnostic, first when a profile is set), then the site's commands.
    fn steps(&self) -> impl Iterator<Item = (&str, Option<&GateCommand>)> {
        (self.profile != Profile::None)
            .then_some((DCGM_PART, None))
            .into_iter()
            .chain(self.commands.iter().map(|c| (c.name.as_str(), Some(c))))
    }

    /// The parts' names, in the order they run: `dcgm` when a profile is set, then the
    /// commands'.
    pub fn parts(&self) -> Vec<String> {
        self.steps().map(|(name, _)| name.to_string()).collect()
    }

    /// The DCGM part's budget.
    pub fn dcgm_budget(&self) -> Duration {
        if self.budget.is_zero() {
            self.profile.default_budget()
        } else {
            self.budget.0
        }
    }

    /// A part's budget: DCGM's with the host engine's wait, or the command's.
    fn step_budget(&self, command: Option<&GateCommand>) -> Duration {
        command.map_or_else(
            || self.dcgm_budget() + self.host_engine_wait.0,
            |c| c.budget.0,
        )
    }

    /// The whole gate's budget: its parts' added (the host engine's wait included).
    pub fn total_budget(&self) -> Duration {
        self.steps().map(|(_, c)| self.step_budget(c)).sum()
    }

    /// What the gate's drain says while it runs: `start-up gate running: dcgm quick, efa
    /// (up to 5m 30s)`.
    pub fn running_words(&self) -> String {
        let parts: Vec<String> = self
            .parts()
            .into_iter()
            .map(|p| {
                if p == DCGM_PART {
                    format!("dcgm {}", self.profile.as_str())
                } else {
                    p
                }
            })
            .collect();
        format!(
            "start-up gate running: {} (up to {})",
            parts.join(", "),
            HumanDuration(self.total_budget())
        )
    }
}

/// The outside systems a gate run uses: the host engine's unit.
pub struct GateEnv<'a> {
    /// systemd, for the host engine.
    pub units: &'a dyn crate::systemd::Units,
    /// The state folder (the record).
    pub state_dir: &'a Path,
    /// This boot (`/proc/sys/kernel/random/boot_id`).
    pub boot_id: String,
    /// This instance.
    pub instance_id: String,
    /// Where PCI devices are listed (`/sys`), for GPUs when `nvidia-smi` is missing.
    pub sys_dir: PathBuf,
}

/// The record with every part `running` from now, as the gate starts (written by
/// [`run`] before the first part, and by bootstrap before its drain).
pub fn starting_record(s: &StartGateSettings, boot_id: &str, instance_id: &str) -> GateRecord {
    let now = crate::time::now();
    GateRecord {
        boot_id: boot_id.to_string(),
        instance_id: instance_id.to_string(),
        started_unix: now,
        deadline_unix: now + i64::try_from(s.total_budget().as_secs()).unwrap_or(i64::MAX / 2),
        parts: s
            .steps()
            .map(|(name, command)| Part {
                budget_s: s.step_budget(command).as_secs(),
                name: name.to_string(),
                status: PartStatus::Running,
                message: String::new(),
                started_unix: now,
                ended_unix: None,
            })
            .collect(),
    }
}

/// Runs every part in order, saving the record after each (so that `status` and the
/// `start_gate` check see where it stands), and returns it. A part that fails does not
/// stop the next ones (every fault is named at once).
pub async fn run(s: &StartGateSettings, env: &GateEnv<'_>) -> GateRecord {
    let mut record = starting_record(s, &env.boot_id, &env.instance_id);
    for (i, (name, command)) in s.steps().enumerate() {
        record.parts[i].started_unix = crate::time::now();
        save(&record, env.state_dir);
        let started = std::time::Instant::now();
        let budget = record.parts[i].budget_s;
        // What runs, said every 10 s (journal and `status`) while it runs.
        let mut progress =
            crate::progress::Progress::new(Some(env.state_dir), format!("start-up gate: {name}"));
        let (status, message) = progress
            .during(
                |ran| {
                    format!(
                        "{name} to end (ran {} of its budget {})",
                        HumanDuration(std::time::Duration::from_secs(ran.as_secs())),
                        HumanDuration(std::time::Duration::from_secs(budget))
                    )
                },
                async {
                    match command {
                        None => run_dcgm(s, env).await,
                        Some(c) => run_command(c).await,
                    }
                },
            )
            .await;
        drop(progress);
        let p = &mut record.parts[i];
        p.status = status;
        p.message = message;
        p.ended_unix = Some(crate::time::now());
        match status {
            PartStatus::Failed => {
                tracing::error!(part = %name, elapsed_ms = started.elapsed().as_millis() as u64, message = %p.message, "START GATE: {name} failed")
            }
            _ => {
                tracing::info!(decision = "gate.part", part = %name, status = status.as_str(), elapsed_ms = started.elapsed().as_millis() as u64, message = %p.message, "START GATE: {name} {}", status.as_str())
            }
        }
        save(&record, env.state_dir);
    }
    record
}

fn save(record: &GateRecord, state_dir: &Path) {
    if let Err(e) = record.save(state_dir) {
        tracing::warn!("start-up gate record not written: {e}");
    }
}

/// A site command: passes on exit 0.
async fn run_command(c: &GateCommand) -> (PartStatus, String) {
    use crate::health::checks::cmd;
    match cmd::run_command(&c.argv, c.budget.0, 64 * 1024).await {
        Err(e) => (PartStatus::Failed, e.to_string()),
        Ok(o) if o.timed_out => (
            PartStatus::Failed,
            format!(
                "{} ran past its budget {} and was killed",
                c.argv.join(" "),
                HumanDuration(c.budget.0)
            ),
        ),
        Ok(o) if o.code == Some(0) => (PartStatus::Passed, format!("{} exited 0", c.argv[0])),
        Ok(o) => {
            let last = last_line(&o.stderr).or_else(|| last_line(&o.stdout));
            (
                PartStatus::Failed,
                format!(
                    "{} {}{}",
                    c.argv[0],
                    o.code
                        .map_or_else(|| "killed by a signal".into(), |c| format!("exited {c}")),
                    last.map(|l| format!(": {l}")).unwrap_or_default()
                ),
            )
        }
    }
}

fn last_line(bytes: &[u8]) -> Option<String> {
    String::from_utf8_lossy(bytes)
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(|l| l.chars().take(200).collect())
}

/// Why a step of the DCGM part could not go on; each names its program or unit.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GateError {
    /// `nvidia-smi` did not list the GPUs.
    #[error("{argv} did not answer{words}")]
    NoGpuList {
        /// The command line asked.
        argv: String,
        /// `: <its last line>`, or nothing.
        words: String,
    },
    /// A program could not be started.
    #[error(transparent)]
    Command(#[from] crate::health::checks::cmd::CommandError),
    /// The host engine's unit could not be started.
    #[error("{unit} could not be started: {message}")]
    HostEngineStart {
        /// The unit.
        unit: String,
        /// systemd's words.
        message: String,
    },
    /// The host engine's unit did not become active in time.
    #[error("{unit} not active within {wait} ({state})")]
    HostEngineNotActive {
        /// The unit.
        unit: String,
        /// How long it was waited for.
        wait: HumanDuration,
        /// Its last state, or systemd's error.
        state: String,
    },
}

/// The GPUs `nvidia-smi` lists, with whether each is in MIG mode: `(index, mig)`.
///
/// # Errors
/// [`GateError`]: it could not tell.
async fn gpus(s: &StartGateSettings) -> Result<Vec<(u32, bool)>, GateError> {
    use crate::health::checks::cmd;
    let argv = vec![
        s.nvidia_smi.display().to_string(),
        "--query-gpu=index,mig.mode.current".into(),
        "--format=csv,noheader".into(),
    ];
    let o = cmd::run_command(&argv, Duration::from_secs(30), 64 * 1024).await?;
    if o.timed_out || o.code != Some(0) {
        return Err(GateError::NoGpuList {
            argv: argv.join(" "),
            words: last_line(&o.stderr)
                .or_else(|| last_line(&o.stdout))
                .map(|l| format!(": {l}"))
                .unwrap_or_default(),
        });
    }
    Ok(parse_mig(&String::from_utf8_lossy(&o.stdout)))
}

/// Parses `nvidia-smi --query-gpu=index,mig.mode.current --format=csv,noheader`: one line
/// per GPU, `0, Enabled`, `1, Disabled`, `2, [N/A]` (no MIG on that GPU).
pub fn parse_mig(out: &str) -> Vec<(u32, bool)> {
    out.lines()
        .filter_map(|l| {
            let (i, m) = l.split_once(',')?;
            Some((
                i.trim().parse().ok()?,
                m.trim().eq_ignore_ascii_case("enabled"),
            ))
        })
        .collect()
}

/// The host engine's unit: active already, or started and waited for.
///
/// # Errors
/// [`GateError`]: it did not become active (not found, failed...).
async fn host_engine(
    s: &StartGateSettings,
    units: &dyn crate::systemd::Units,
) -> Result<(), GateError> {
    let unit = &s.host_engine_unit;
    if units.active_state(unit).await.is_ok_and(|a| a == "active") {
        return Ok(());
    }
    if let Err(e) = units.start_no_wait(unit).await {
        return Err(GateError::HostEngineStart {
            unit: unit.clone(),
            message: e.to_string(),
        });
    }
    let until = std::time::Instant::now() + s.host_engine_wait.0;
    let mut last = String::new();
    while std::time::Instant::now() < until {
        match units.active_state(unit).await {
            Ok(a) if a == "active" => return Ok(()),
            Ok(a) => last = a,
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(GateError::HostEngineNotActive {
        unit: unit.clone(),
        wait: s.host_engine_wait,
        state: last,
    })
}

/// The DCGM part.
async fn run_dcgm(s: &StartGateSettings, env: &GateEnv<'_>) -> (PartStatus, String) {
    use crate::health::checks::cmd;
    let Some(level) = s.profile.level() else {
        return (PartStatus::Skipped, "no profile".into());
    };
    let listed = if s.nvidia_smi.exists() {
        match gpus(s).await {
            Ok(l) => l,
            Err(e) => return (PartStatus::Failed, e.to_string()),
        }
    } else {
        let on_pci = crate::health::checks::gpu::kernel_gpus(&env.sys_dir).len();
        if on_pci > 0 {
            return (
                PartStatus::Failed,
                format!(
                    "{on_pci} NVIDIA GPUs on PCI but no {} (start_gate.nvidia_smi): the driver is not installed",
                    s.nvidia_smi.display()
                ),
            );
        }
        Vec::new()
    };
    if listed.is_empty() {
        return (
            PartStatus::Skipped,
            "no NVIDIA GPU on this node: DCGM diagnostics not run".into(),
        );
    }
    let mig: Vec<String> = listed
        .iter()
        .filter(|(_, m)| *m)
        .map(|(i, _)| i.to_string())
        .collect();
    if !mig.is_empty() {
        return (
            PartStatus::Skipped,
            format!(
                "GPU {} in MIG mode: DCGM diagnostics need whole GPUs, not run",
                mig.join(", ")
            ),
        );
    }
    if !s.dcgmi.exists() {
        tracing::warn!(dcgmi = %s.dcgmi.display(), "START GATE: dcgmi is not installed: DCGM diagnostics not run");
        return (
            PartStatus::Skipped,
            format!(
                "{} not installed (start_gate.dcgmi): DCGM diagnostics not run",
                s.dcgmi.display()
            ),
        );
    }
    let engine = host_engine(s, env.units).await;
    if let Err(e) = &engine {
        tracing::warn!("START GATE: DCGM host engine: {e}; dcgmi runs its own embedded one");
    }
    let argv = vec![
        s.dcgmi.display().to_string(),
        "diag".into(),
        "-r".into(),
        level.to_string(),
        "-j".into(),
    ];
    let shown = argv.join(" ");
    let budget = s.dcgm_budget();
    let o = match cmd::run_command(&argv, budget, 4 * 1024 * 1024).await {
        Ok(o) => o,
        Err(e) => return (PartStatus::Failed, e.to_string()),
    };
    if o.timed_out {
        return (
            PartStatus::Failed,
            format!(
                "{shown} ran past its budget {} (start_gate.budget) and was killed",
                HumanDuration(budget)
            ),
        );
    }
    let stdout = String::from_utf8_lossy(&o.stdout);
    let host_engine_words = |text: &str| {
        text.contains("Unable to connect to host engine")
            || text.contains("Unable to start an embedded host engine")
    };
    let stderr = String::from_utf8_lossy(&o.stderr);
    if host_engine_words(&stdout) || host_engine_words(&stderr) {
        return (
            PartStatus::Failed,
            format!(
                "DCGM host engine: {}; {shown}: {}",
                engine.err().map_or_else(
                    || format!("{} active", s.host_engine_unit),
                    |e| e.to_string()
                ),
                last_line(&o.stdout).unwrap_or_default()
            ),
        );
    }
    let parsed = match dcgm::DiagOutput::parse(&stdout) {
        Ok(p) => p,
        Err(e) => {
            return (
                PartStatus::Failed,
                format!(
                    "{shown} exited {}: not DCGM's JSON ({e}){}",
                    o.code
                        .map_or_else(|| "by a signal".into(), |c| c.to_string()),
                    last_line(&o.stderr)
                        .map(|l| format!(": {l}"))
                        .unwrap_or_default()
                ),
            )
        }
    };
    if let Some(err) = &parsed.diagnostic.runtime_error {
        if err.contains("MIG") {
            return (PartStatus::Skipped, format!("{shown}: {err}"));
        }
        return (PartStatus::Failed, format!("{shown}: {err}"));
    }
    let failures = parsed.failures();
    if failures.is_empty() {
        return (
            PartStatus::Passed,
            format!(
                "{shown}: {} tests passed on {} GPUs",
                parsed.passed_tests(),
                listed.len()
            ),
        );
    }
    let words: Vec<String> = failures.iter().map(ToString::to_string).collect();
    (PartStatus::Failed, format!("{shown}: {}", words.join("; ")))
}

#[cfg(test)]
mod tests;
