//! First boot: instance metadata → settings → auth key → slurmd in configless (optionally
//! dynamic) mode → node available in slurmctld.
//!
//! Idempotent: every step converges (the key and the options file are rewritten only when
//! they differ, units are started, not spawned, so there is one slurmd), so a bootstrap
//! killed at any step and run again ends in the same state.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::authkey::{self, KeyError, KeySource, KeyTarget};
use crate::hostfacts::{GpuProbe, GpuWaitError, HostFacts};
use crate::imds::{Imds, ImdsError, InstanceIdentity};
use crate::nodedef::{self, NodeDefinition};
use crate::retry::Backoff;
use crate::settings::{self, AuthType, Layer, Resolved, SettingsError, Source};
use crate::slurm::{self, ConfServer, NodeInfo, Scontrol};
use crate::systemd::{Systemd, SystemdError};

/// Name of the state file written under `agent.state_dir` when bootstrap succeeds.
pub const STATE_FILE: &str = "bootstrap.json";

/// Why bootstrap failed. [`BootstrapError::exit_code`] maps each kind to a sysexits(3) code.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// Settings invalid (exit 78, EX_CONFIG).
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// Instance metadata unavailable (exit 69, EX_UNAVAILABLE).
    #[error(transparent)]
    Imds(#[from] ImdsError),
    /// Auth key missing, empty, unreadable or malformed (exit 65, EX_DATAERR; 77,
    /// EX_NOPERM, when access is denied).
    #[error("auth key: {0}")]
    Key(#[from] KeyError),
    /// GPUs the instance type has did not appear (exit 69).
    #[error(transparent)]
    Gpu(#[from] GpuWaitError),
    /// systemd refused or failed a job (exit 71, EX_OSERR).
    #[error(transparent)]
    Systemd(#[from] SystemdError),
    /// The node was not available in slurmctld by the deadline (exit 75, EX_TEMPFAIL).
    #[error("node {node_name} not available after {waited:?} (slurm.join_deadline): {last_error}")]
    Join {
        /// NodeName.
        node_name: String,
        /// How long it tried.
        waited: Duration,
        /// The last thing that went wrong.
        last_error: String,
    },
    /// Slurm refused the node's registration (exit 65): e.g. INVALID for low RealMemory.
    #[error("node {node_name} registered as {state}: {reason}")]
    Invalid {
        /// NodeName.
        node_name: String,
        /// Slurm state.
        state: String,
        /// Slurm's reason.
        reason: String,
    },
    /// Other I/O (exit 74, EX_IOERR).
    #[error("{0}")]
    Io(String),
}

impl BootstrapError {
    /// The process exit code for this error (sysexits(3) values).
    pub fn exit_code(&self) -> u8 {
        match self {
            BootstrapError::Settings(_) | BootstrapError::Key(KeyError::InvalidSource(_)) => 78,
            BootstrapError::Imds(_) | BootstrapError::Gpu(_) => 69,
            BootstrapError::Key(KeyError::AccessDenied { .. }) => 77,
            BootstrapError::Key(KeyError::Write(_)) => 74,
            BootstrapError::Key(KeyError::Other { .. }) => 69,
            BootstrapError::Key(_) | BootstrapError::Invalid { .. } => 65,
            BootstrapError::Systemd(_) => 71,
            BootstrapError::Join { .. } => 75,
            BootstrapError::Io(_) => 74,
        }
    }
}

/// Inputs besides the settings layers.
#[derive(Debug, Clone)]
pub struct Options {
    /// Settings files to read.
    pub paths: settings::Paths,
    /// Layers from the command line (highest precedence).
    pub flag_layers: Vec<Layer>,
    /// Folder where GPU device files appear (`/dev`).
    pub dev_dir: PathBuf,
}

/// Duration of one step.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    /// Step name: `settings`, `instance_metadata`, `node_definition`, `auth_key`, `munge`,
    /// `slurmd`, `join`.
    pub name: &'static str,
    /// Milliseconds.
    pub duration_ms: u64,
}

/// What bootstrap did: printed as text, or as one JSON object with `--output json`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Slurm NodeName.
    pub node_name: String,
    /// Slurm state at the end, e.g. `IDLE+DYNAMIC_NORM`.
    pub state: String,
    /// EC2 instance id.
    pub instance_id: String,
    /// The `--conf` line of a dynamic node.
    pub dynamic_conf: Option<String>,
    /// Whether the key file was (re)written.
    pub key_changed: bool,
    /// Whether slurmd was restarted (options or key changed).
    pub slurmd_restarted: bool,
    /// Step durations in order.
    pub steps: Vec<Step>,
    /// Total milliseconds.
    pub total_ms: u64,
}

struct Timer {
    start: Instant,
    step: Instant,
    steps: Vec<Step>,
}

impl Timer {
    fn new() -> Timer {
        let now = Instant::now();
        Timer {
            start: now,
            step: now,
            steps: Vec::new(),
        }
    }

    /// Records a step measured on its own (one of several run together).
    fn record(&mut self, name: &'static str, d: Duration) {
        let duration_ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        tracing::info!(step = name, duration_ms, "step done");
        self.steps.push(Step { name, duration_ms });
        self.step = Instant::now();
    }

    fn done(&mut self, name: &'static str) {
        let now = Instant::now();
        let duration_ms = u64::try_from((now - self.step).as_millis()).unwrap_or(u64::MAX);
        tracing::info!(step = name, duration_ms, "step done");
        self.steps.push(Step { name, duration_ms });
        self.step = now;
    }
}

/// Runs a future and measures it.
async fn timed<T, E>(
    f: impl std::future::Future<Output = Result<T, E>>,
) -> Result<(T, Duration), E> {
    let start = Instant::now();
    let v = f.await?;
    Ok((v, start.elapsed()))
}

/// Resolves the settings: files and flags first (they may point IMDS elsewhere), then the
/// user data part and the tags from IMDS, in precedence order.
///
/// # Errors
/// [`SettingsError`].
pub fn resolve(
    file_layers: &[Layer],
    id: Option<&InstanceIdentity>,
    flag_layers: &[Layer],
) -> Result<Resolved, SettingsError> {
    let mut layers: Vec<Layer> = file_layers.to_vec();
    if let Some(id) = id {
        if let Some(ud) = &id.user_data {
            let part = crate::userdata::settings_part(ud.as_bytes()).map_err(|e| {
                SettingsError::Parse {
                    origin: Source::UserData,
                    message: e.to_string(),
                }
            })?;
            if let Some(text) = part {
                layers.push(Layer::from_toml(Source::UserData, &text)?);
            }
        }
        layers.extend(Layer::from_tags(
            id.tags.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        )?);
    }
    layers.extend(flag_layers.iter().cloned());
    Resolved::merge(&layers)
}

/// Runs bootstrap to the end.
///
/// # Errors
/// [`BootstrapError`]; nothing is written before the step that needs it succeeds (no key
/// file for a bad key, munge not restarted).
pub async fn run(opts: &Options) -> Result<Report, BootstrapError> {
    let mut t = Timer::new();
    let file_layers = settings::file_layers(&opts.paths)?;
    let early = resolve(&file_layers, None, &opts.flag_layers)?;
    t.done("settings");

    let imds = Imds::new(&early.settings.imds);
    // The key source in the files and flags is almost always the final one (tags and user
    // data can still change it): fetch the key while the rest of the metadata is read, and
    // use the result only if the final source is the same.
    // It runs as its own task (with its own IMDS session) so that it overlaps everything up
    // to the key step.
    let prefetch = KeySource::parse(&early.settings.auth.key_source)
        .ok()
        .map(|source| {
            let imds_settings = early.settings.imds.clone();
            tokio::spawn(async move {
                let imds = Imds::new(&imds_settings);
                let region = imds.get("/latest/meta-data/placement/region").await.ok()?;
                let stored = fetch_stored(&source, region.trim()).await;
                Some((source, stored))
            })
        });
    let id = imds.identity().await?;
    tracing::info!(
        instance_id = %id.instance_id,
        instance_type = %id.instance_type,
        availability_zone = %id.availability_zone,
        spot = id.spot,
        tags = id.tags.len(),
        "instance metadata read"
    );
    let resolved = resolve(&file_layers, Some(&id), &opts.flag_layers)?;
    let s = &resolved.settings;
    t.done("instance_metadata");

    // Independent steps run together: the node definition (which may wait for GPU
    // devices), the key (fetch, check, write) and the connection to systemd. Each step's
    // own duration is reported. Nothing is started before all three succeed.
    let node_definition = timed(async {
        let host = HostFacts::detect();
        let probe = GpuProbe {
            dev_dir: opts.dev_dir.clone(),
            wait: s.node.gpu_wait.0,
        };
        let configured_gpus = s.node.gpus.parse::<u32>().ok();
        let gpus = if s.node.dynamic {
            probe.gpus(configured_gpus, &id.instance_type).await?
        } else {
            0
        };
        nodedef::node_definition(&s.node, &id, &host, gpus).map_err(|(key, message)| {
            BootstrapError::Settings(SettingsError::Key {
                origin: resolved.source_of(key),
                key: key.to_string(),
                message,
            })
        })
    });
    let key = timed(async {
        let prefetched = match prefetch {
            Some(task) => task.await.ok().flatten(),
            None => None,
        };
        Ok::<_, BootstrapError>(install_key(s, &id, prefetched).await?)
    });
    let connect = timed(async { Ok::<_, BootstrapError>(Systemd::connect(&s.systemd.bus).await?) });
    let ((def, def_time), (key_changed, key_time), (systemd, _)) =
        tokio::try_join!(node_definition, key, connect)?;
    tracing::info!(node_name = %def.node_name, conf = ?def.dynamic_conf, "node definition");
    t.record("node_definition", def_time);
    t.record("auth_key", key_time);
    // munge, the mounts and slurmd's preparation (options file; stopping an old slurmd)
    // run together; slurmd starts when all three are done (it needs munge, and must not
    // run without its required mounts).
    let munge = timed(async {
        if s.auth.auth_type == AuthType::Munge {
            if key_changed {
                systemd.restart(&s.slurm.munge_unit).await?;
            } else {
                systemd.start(&s.slurm.munge_unit).await?;
            }
        }
        Ok::<_, BootstrapError>(())
    });
    // Shared file systems (issue 4): a required mount that fails stops bootstrap here, so
    // slurmd is not started (its drop-in also waits for the marker this writes).
    let mounts = timed(async {
        let mount_env = crate::mounts::MountEnv::for_bus(&s.systemd.bus);
        crate::mounts::ensure_all(&s.mounts, &id.region, &mount_env, &systemd)
            .await
            .map_err(|e| BootstrapError::Io(e.to_string()))
    });
    let slurmd_prep = timed(async {
        let servers: Vec<ConfServer> = s
            .slurm
            .conf_servers
            .iter()
            .filter_map(|c| ConfServer::parse(c).ok())
            .collect();
        let options_file = if s.slurm.slurmd_options_file.as_os_str().is_empty() {
            slurm::options::default_options_file()
        } else {
            s.slurm.slurmd_options_file.clone()
        };
        let args = slurm::slurmd_args(&def, &servers);
        let options_changed = slurm::write_slurmd_options(&options_file, &args)
            .map_err(|e| BootstrapError::Io(e.to_string()))?;
        let restart = options_changed || key_changed;
        if restart {
            stop_slurmd(&systemd, &s.slurm.slurmd_unit).await?;
        }
        Ok::<_, BootstrapError>(restart)
    });
    let ((_, munge_time), (_, mounts_time), (slurmd_restarted, prep_time)) =
        tokio::try_join!(munge, mounts, slurmd_prep)?;
    if s.auth.auth_type == AuthType::Munge {
        t.record("munge", munge_time);
    }
    t.record("mounts", mounts_time);
    let slurmd_start = Instant::now();
    systemd.start(&s.slurm.slurmd_unit).await?;
    t.record("slurmd", prep_time + slurmd_start.elapsed());

    let node = join(s, &def, &systemd).await?;
    t.done("join");

    write_state(s, &id, &def).map_err(|e| BootstrapError::Io(e.to_string()))?;
    Ok(Report {
        node_name: def.node_name.clone(),
        state: node.state().to_string(),
        instance_id: id.instance_id.clone(),
        dynamic_conf: def.dynamic_conf.clone(),
        key_changed,
        slurmd_restarted,
        total_ms: u64::try_from(t.start.elapsed().as_millis()).unwrap_or(u64::MAX),
        steps: t.steps,
    })
}

/// Fetches the stored (still encoded) key bytes; AWS sources use the SDK's default
/// credentials chain in `region`.
async fn fetch_stored(source: &KeySource, region: &str) -> Result<Vec<u8>, KeyError> {
    match source {
        KeySource::File(_) => {
            authkey::fetch(source, &aws_config::SdkConfig::builder().build()).await
        }
        _ => {
            let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
                .region(aws_config::Region::new(region.to_string()))
                .load()
                .await;
            authkey::fetch(source, &sdk).await
        }
    }
}

/// Fetches and installs the key. Returns whether the file changed. With no key source the
/// key is assumed baked into the image. `prefetched` is a fetch started earlier from the
/// files and flags, used when its source is still the one the final settings name.
async fn install_key(
    s: &settings::Settings,
    id: &InstanceIdentity,
    prefetched: Option<(KeySource, Result<Vec<u8>, KeyError>)>,
) -> Result<bool, KeyError> {
    if s.auth.key_source.is_empty() {
        return Ok(false);
    }
    let source = KeySource::parse(&s.auth.key_source).map_err(KeyError::InvalidSource)?;
    let target = KeyTarget::from_settings(&s.auth);
    // Resolve the owner first: a host without the daemon's user gets no key file.
    let owner = authkey::resolve_owner(&target.owner)?;
    let stored = match prefetched {
        Some((early, result)) if early == source => result?,
        _ => fetch_stored(&source, &id.region).await?,
    };
    let key = authkey::decode(&source, &stored, s.auth.key_encoding, &target)?;
    let changed = authkey::install(&key, &target.path, owner)?;
    tracing::info!(path = %target.path.display(), changed, bytes = key.len(), "auth key installed");
    Ok(changed)
}

/// Stops slurmd so that none is left: the distribution's units have `KillMode=process`
/// so that job steps (`slurmstepd`) survive a slurmd restart, and the same setting leaves
/// behind a configless slurmd's configuration-fetch child (a second `slurmd` process,
/// retrying forever). So: stop the unit, then SIGKILL any `slurmd` still in its cgroup
/// (never `slurmstepd`).
async fn stop_slurmd(systemd: &Systemd, unit: &str) -> Result<(), SystemdError> {
    systemd.stop(unit).await?;
    for (pid, cmd) in systemd.unit_processes(unit).await? {
        let program = cmd.split_whitespace().next().unwrap_or_default();
        if program.rsplit('/').next() == Some("slurmd") {
            tracing::warn!(pid, %cmd, "killing a slurmd left behind in {unit}");
            if let Ok(pid) = i32::try_from(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
    Ok(())
}

/// Restarts slurmd so that exactly one runs afterwards (see [`stop_slurmd`]).
async fn restart_slurmd(systemd: &Systemd, unit: &str) -> Result<(), SystemdError> {
    stop_slurmd(systemd, unit).await?;
    systemd.start(unit).await
}

/// Waits until slurmctld reports the node available, until `slurm.join_deadline`.
///
/// slurmd in configless mode either keeps retrying the configuration fetch itself (22.05
/// does, under systemd) or exits (a missing spool folder, a refused registration, other
/// versions); when the unit is `failed` or `inactive` it is restarted with capped,
/// jittered backoff ([`Backoff::CONTROLLER`]). The error at the deadline carries the last
/// thing seen: scontrol's answer and the unit's state.
async fn join(
    s: &settings::Settings,
    def: &NodeDefinition,
    systemd: &Systemd,
) -> Result<NodeInfo, BootstrapError> {
    let unit = &s.slurm.slurmd_unit;
    let scontrol = Scontrol::new(&s.slurm.bin_dir);
    let deadline = s.slurm.join_deadline.0;
    let start = Instant::now();
    let mut unit_state = String::from("unknown");
    let mut restarts = 0u32;
    let mut polls = 0u32;
    loop {
        let seen = match scontrol.show_node(&def.node_name).await {
            Ok(Some(node)) if node.is_available() => return Ok(node),
            Ok(Some(node)) if node.has_flag("INVALID_REG") || node.has_flag("INVALID") => {
                return Err(BootstrapError::Invalid {
                    node_name: def.node_name.clone(),
                    state: node.state().to_string(),
                    reason: node.reason().unwrap_or("no reason given").to_string(),
                })
            }
            Ok(Some(node)) => format!(
                "node is {}{}",
                node.state(),
                node.reason().map(|r| format!(" ({r})")).unwrap_or_default()
            ),
            Ok(None) => "slurmctld does not know the node yet".into(),
            Err(e) => e.to_string(),
        };
        if start.elapsed() >= deadline {
            return Err(BootstrapError::Join {
                node_name: def.node_name.clone(),
                waited: start.elapsed(),
                last_error: format!("{seen}; {unit} is {unit_state} (restarted {restarts} times)"),
            });
        }
        unit_state = systemd.active_state(unit).await?;
        tracing::debug!(%unit_state, %seen, "waiting for the node");
        if matches!(unit_state.as_str(), "failed" | "inactive") {
            let wait = Backoff::CONTROLLER
                .delay(restarts)
                .min(deadline.saturating_sub(start.elapsed()));
            tracing::warn!(
                %unit,
                %unit_state,
                %seen,
                retry_in_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                "slurmd is not running; restarting it"
            );
            tokio::time::sleep(wait).await;
            restarts += 1;
            if let Err(e) = restart_slurmd(systemd, unit).await {
                tracing::warn!("{e}");
            }
            continue;
        }
        polls += 1;
        // slurmd registers in about 0.1 s: poll fast for a second, then less and less.
        let pause = if polls < 100 {
            10
        } else if polls < 300 {
            50
        } else {
            500
        };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

/// What later commands (`check`, `run`) need from bootstrap.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct State {
    /// Slurm NodeName.
    pub node_name: String,
    /// EC2 instance id.
    pub instance_id: String,
    /// AMI the instance runs.
    pub ami_id: String,
    /// `--conf` line of a dynamic node.
    pub dynamic_conf: Option<String>,
}

fn write_state(
    s: &settings::Settings,
    id: &InstanceIdentity,
    def: &NodeDefinition,
) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(&s.agent.state_dir)
        .map_err(|e| format!("{}: {e}", s.agent.state_dir.display()))?;
    let state = State {
        node_name: def.node_name.clone(),
        instance_id: id.instance_id.clone(),
        ami_id: id.ami_id.clone(),
        dynamic_conf: def.dynamic_conf.clone(),
    };
    let json = serde_json::to_vec_pretty(&state)?;
    crate::fsutil::write_atomic(&s.agent.state_dir.join(STATE_FILE), &json, 0o644, None)?;
    Ok(())
}

/// Reads the state bootstrap left, if any. A record that cannot be parsed (empty,
/// truncated) is moved aside as `bootstrap.json.corrupt-<unix seconds>` with an error in
/// the log, and is `None`: the caller resolves the node as if bootstrap had left nothing.
pub fn read_state(state_dir: &std::path::Path) -> Option<State> {
    let path = state_dir.join(STATE_FILE);
    let text = std::fs::read(&path).ok()?;
    match serde_json::from_slice(&text) {
        Ok(st) => Some(st),
        Err(e) => {
            crate::fsutil::set_aside_corrupt(
                &path,
                &text,
                &format!("invalid bootstrap record: {e}"),
            );
            None
        }
    }
}
