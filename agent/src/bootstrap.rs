//! First boot: instance metadata → settings → auth key → slurmd in configless (optionally
//! dynamic) mode → node available in slurmctld.
//!
//! Idempotent: every step converges (the key and the options file are rewritten only when
//! they differ, units are started, not spawned, so there is one slurmd), so a bootstrap
//! killed at any step and run again ends in the same state.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::authkey::AuthType;
use crate::authkey::{self, KeyError, KeySource, KeyTarget};
use crate::hostfacts::{GpuProbe, GpuWaitError, HostFacts};
use crate::imds::{Imds, ImdsError, InstanceIdentity};
use crate::nodedef::{self, NodeDefinition};
use crate::reason::{self, AgentReason, Incarnation, ReasonCause, RecordHolder};
use crate::retry::Backoff;
use crate::settings::{self, Enforce, Layer, Resolved, SettingsError};
use crate::slurm::{self, ConfServer, NodeInfo, ReadyScontrol, Scontrol, SlurmVersion};
use crate::systemd::{ServiceInfo, Systemd, SystemdError};

/// Name of the state file written under `agent.state_dir` when bootstrap succeeds.
pub use crate::identity::STATE_FILE;

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
    /// Another bootstrap held the lock for longer than [`LOCK_WAIT`] (exit 75).
    #[error("another bootstrap still holds {} after {:?}", path.display(), LOCK_WAIT)]
    Busy {
        /// The lock file.
        path: PathBuf,
    },
    /// cloud-init did not finish within its bound, or could not be run (exit 75 or 71).
    #[error(transparent)]
    CloudInit(crate::cloudinit::CloudInitError),
    /// The managed join (PCS registration) failed; see [`crate::pcs::PcsError::exit_code`].
    #[error(transparent)]
    Pcs(#[from] crate::pcs::PcsError),
    /// A lifecycle script stopped bootstrap; see
    /// [`crate::node_lifecycle::LifecycleError::exit_code`].
    #[error(transparent)]
    Lifecycle(#[from] crate::node_lifecycle::LifecycleError),
}

/// Lock file, under `agent.state_dir`, that makes concurrent bootstraps take turns.
pub const LOCK_FILE: &str = "bootstrap.lock";

/// How long a bootstrap waits for another one to finish: longer than one bootstrap's own
/// bounds (join deadline, GPU wait, mount retries) at their defaults.
pub const LOCK_WAIT: Duration = Duration::from_secs(20 * 60);

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
            BootstrapError::Join { .. } | BootstrapError::Busy { .. } => 75,
            BootstrapError::Io(_) => 74,
            BootstrapError::Pcs(e) => e.exit_code(),
            BootstrapError::Lifecycle(e) => e.exit_code(),
            BootstrapError::CloudInit(e) => e.exit_code(),
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
    /// When the registered node stays drained: by whom and what lifts it, e.g.
    /// `drained by an admin (bad DIMM); left drained`. `None` when it is available.
    pub drain: Option<String>,
    /// The instance this one replaces: the `InstanceId` of slurmctld's record of the
    /// NodeName, read before this instance's slurmd registered, when it names another
    /// instance ([`RecordHolder`], Slurm 23.11+). `None` when the record names this
    /// instance or no instance, or was not looked at (slurmd was not restarted).
    pub replaced_instance_id: Option<String>,
    /// Step durations in order.
    pub steps: Vec<Step>,
    /// Total milliseconds.
    pub total_ms: u64,
    /// Lifecycle scripts of both stages, in the order they were considered (absent when
    /// there are none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lifecycle: Vec<crate::node_lifecycle::ScriptResult>,
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
/// user data part and the tags from IMDS, in precedence order
/// ([`crate::identity::resolve_settings`]).
///
/// # Errors
/// [`SettingsError`].
pub fn resolve(
    file_layers: &[Layer],
    id: Option<&InstanceIdentity>,
    flag_layers: &[Layer],
) -> Result<Resolved, SettingsError> {
    resolve_with(file_layers, id, flag_layers, Enforce::Refuse)
}

/// [`resolve`], choosing what a key from a source below its trust class does: bootstrap
/// refuses it (exit 78); the daemon, `config show` and the operator commands warn and
/// ignore it.
///
/// # Errors
/// [`SettingsError`].
pub fn resolve_with(
    file_layers: &[Layer],
    id: Option<&InstanceIdentity>,
    flag_layers: &[Layer],
    enforce: Enforce,
) -> Result<Resolved, SettingsError> {
    crate::identity::resolve_settings(file_layers, id, flag_layers, enforce)
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
    // Two bootstraps at once (the unit and an operator, or user data): the second waits
    // for the first, then converges on what it did.
    let _lock = take_lock(&early.settings.agent.state_dir).await?;

    let imds = Imds::new(&early.settings.imds);
    // The key source in the files and flags is almost always the final one (tags and user
    // data can still change it): fetch the key while the rest of the metadata is read, and
    // use the result only if the final source is the same.
    // It runs on a thread of its own, with its own runtime and IMDS session, so that it
    // overlaps everything up to the key step: the AWS SDK's first HTTPS client loads and
    // parses the platform's trusted roots, CPU work that blocks whichever thread does it.
    let prefetch = KeySource::parse(&early.settings.auth.key_source)
        .ok()
        .map(|source| {
            let imds_settings = early.settings.imds.clone();
            let (tx, rx) = tokio::sync::oneshot::channel();
            let fetch = move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .ok()?;
                rt.block_on(async move {
                    let t = Instant::now();
                    let imds = Imds::new(&imds_settings);
                    let region = imds.get("/latest/meta-data/placement/region").await.ok()?;
                    tracing::debug!(elapsed = ?t.elapsed(), "key prefetch: region read");
                    let stored = fetch_stored(&source, region.trim()).await;
                    tracing::debug!(elapsed = ?t.elapsed(), "key prefetch: key fetched");
                    Some((source, stored))
                })
            };
            let spawned = std::thread::Builder::new()
                .name("key-prefetch".into())
                .spawn(move || {
                    let _ = tx.send(fetch());
                });
            if let Err(e) = spawned {
                // The key step fetches it then.
                tracing::warn!("cannot start the key prefetch thread: {e}");
            }
            rx
        });
    // The managed join's first attempt, beside the metadata read when the image's settings
    // already enable it (its own IMDS session); `register` uses it only if it asked what the
    // final settings ask.
    let early_registration = early.settings.pcs.enabled.then(|| {
        let (pcs, imds) = (early.settings.pcs.clone(), early.settings.imds.clone());
        tokio::spawn(async move { crate::pcs::register_early(&pcs, &imds).await })
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

    // Managed join (issue 13): PCS's registration answer names the node, the controller
    // and the key; the rest of bootstrap runs with settings that say so.
    let early_answer = match early_registration {
        Some(task) => task.await.ok().flatten(),
        None => None,
    };
    let managed = match s.pcs.enabled {
        true => Some(crate::pcs::register(&s.pcs, &s.imds, &s.auth, &id, early_answer).await?),
        false => None,
    };
    // The registration's key and record are written on a blocking thread beside the next
    // steps (awaited as the key step).
    let persist = managed
        .as_ref()
        .map(|m| tokio::task::spawn_blocking(m.persist(&s.agent.state_dir)));
    let managed_settings = managed.as_ref().map(|m| {
        let mut joined = s.clone();
        m.join_settings(&mut joined.node, &mut joined.slurm, &mut joined.auth);
        joined
    });
    let s = managed_settings.as_ref().unwrap_or(s);
    if managed.is_some() {
        t.done("register");
    }

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
            Some(rx) => rx.await.ok().flatten(),
            None => None,
        };
        if let Some(task) = persist {
            let written = task
                .await
                .map_err(|e| BootstrapError::Io(format!("writing the registration's key: {e}")))?;
            return Ok::<_, BootstrapError>(written?);
        }
        Ok::<_, BootstrapError>(install_key(s, &id, prefetched).await?)
    });
    let connect = timed(async { Ok::<_, BootstrapError>(Systemd::connect(&s.systemd.bus).await?) });
    let ((def, def_time), (key_changed, key_time), (systemd, _)) =
        tokio::try_join!(node_definition, key, connect)?;
    tracing::info!(node_name = %def.node_name, conf = ?def.dynamic_conf, "node definition");
    t.record("node_definition", def_time);
    t.record("auth_key", key_time);
    // munge, the mounts and slurmd's preparation (options file; stopping an old slurmd)
    // run together; then slurmctld's record is checked (through munge), and slurmd starts
    // (it needs munge, and must not run without its required mounts).
    // munge's job is queued before anything else here: munged's own start is the longest
    // step, and the work below (files written and fsynced, programs spawned) runs on this
    // thread, which would otherwise hold back the request that starts it.
    let munge_start = Instant::now();
    let munge_job = match s.auth.auth_type {
        AuthType::Munge if key_changed => Some(systemd.queue_restart(&s.slurm.munge_unit).await?),
        AuthType::Munge => Some(systemd.queue_start(&s.slurm.munge_unit).await?),
        _ => None,
    };
    // The look at slurmctld's record that follows munge's start, started now: it loads
    // while munged starts, and asks once munged answers. Not on a configless node that has
    // no configuration yet: that scontrol would fetch it from slurmctld as it starts,
    // through a munged that is not up yet, and wait in munge's connection retries.
    let record_look = client_has_config(s)
        .then(|| slurm::Scontrol::configured(&s.slurm).spawn_ready().ok())
        .flatten();
    let munge = async {
        if let Some(job) = munge_job {
            job.wait().await?;
        }
        Ok::<_, BootstrapError>(((), munge_start.elapsed()))
    };
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
        // The record names its instance where slurmd can say it (23.11+).
        let slurmd = slurm::version::slurmd_path(&s.slurm.bin_dir);
        let version = slurm::version::slurmd_version(&slurmd).await;
        let instance = version
            .filter(|v| v.has_instance_fields())
            .map(|_| slurm::InstanceArgs {
                instance_id: id.instance_id.clone(),
                instance_type: id.instance_type.clone(),
            });
        // Topology= in --conf arrived in 25.05: an older slurmd would refuse the line.
        if def.dynamic_conf.is_some() && !s.node.topology.trim().is_empty() {
            if let Some(v) = version.filter(|v| !v.has_dynamic_topology()) {
                return Err(BootstrapError::Settings(SettingsError::Key {
                    origin: resolved.source_of("node.topology"),
                    key: "node.topology".into(),
                    message: format!(
                        "slurmd {v} ({}) takes no Topology= for a dynamic node (Slurm 25.05 and later do)",
                        slurmd.display()
                    ),
                }));
            }
        }
        match version {
            Some(v) => {
                tracing::debug!(slurmd = %slurmd.display(), version = %v, instance_fields = instance.is_some(), "slurmd version")
            }
            None => {
                tracing::info!(slurmd = %slurmd.display(), "slurmd -V gave no version: slurmd is started without --instance-id")
            }
        }
        let args = slurm::slurmd_args(&def, &servers, instance.as_ref());
        let options_changed = slurm::write_slurmd_options(&options_file, &args)
            .map_err(|e| BootstrapError::Io(e.to_string()))?;
        let restart = options_changed || key_changed;
        if restart {
            stop_slurmd(&systemd, &s.slurm.slurmd_unit).await?;
        }
        Ok::<_, BootstrapError>((restart, version))
    });
    // A site's user-data scripts (cloud-init) prepare the node before it takes jobs:
    // waited for here, not by unit ordering (cloud-final is after multi-user.target on
    // Debian and Ubuntu, so `After=` would be a cycle). No cloud-init: nothing to wait for.
    let cloud_init = async {
        crate::cloudinit::CloudInit::default()
            .wait_and_log()
            .await
            .map_err(BootstrapError::CloudInit)
    };
    let ((_, munge_time), (_, mounts_time), ((slurmd_restarted, slurmd_version), mut prep_time), _) =
        tokio::try_join!(munge, mounts, slurmd_prep, cloud_init)?;
    if s.auth.auth_type == AuthType::Munge {
        t.record("munge", munge_time);
    }
    t.record("mounts", mounts_time);
    // Whose record slurmctld holds for the NodeName, from the one look before slurmd
    // (re)starts; a slurmd that keeps running registered it already.
    let mut holder = RecordHolder::Unknown;
    if slurmd_restarted {
        // Only once munge runs: scontrol authenticates through it, and a call made while
        // munged was still starting waited in Slurm's authentication retries.
        let record_start = Instant::now();
        let found = prepare_record(
            s,
            &def.node_name,
            def.dynamic_conf.as_deref(),
            record_look,
            &id.instance_id,
        )
        .await;
        wait_for_next_second(found.slurmd_start_time).await;
        prep_time += record_start.elapsed();
        holder = found.holder;
    }

    // Lifecycle scripts (issue 13): the service's, then the image's settings'.
    let facts = crate::node_lifecycle::Facts {
        node_name: def.node_name.clone(),
        instance_id: id.instance_id.clone(),
        first_boot: false,
        conf_servers: s.slurm.conf_servers.clone(),
        pcs: managed
            .as_ref()
            .map(|m| crate::node_lifecycle::PcsFacts::from(&m.registration)),
    };
    let lifecycle = crate::node_lifecycle::Context {
        settings: &s.node_lifecycle,
        state_dir: &s.agent.state_dir,
        slurm: &s.slurm,
        region: &id.region,
        service: managed
            .as_ref()
            .and_then(|m| m.registration.node_lifecycle_actions.as_ref()),
        facts: &facts,
    };
    let mut scripts = Vec::new();
    let stage = crate::node_lifecycle::Stage::NodeBootstrapped;
    let outcome = run_lifecycle(lifecycle, stage, &systemd, managed.as_ref()).await?;
    if !outcome.scripts.is_empty() {
        t.done("node_bootstrapped");
    }
    scripts.extend(outcome.scripts);

    let slurmd_start = Instant::now();
    // Not waited for: a Type=notify slurmd (23.11+) finishes its start job only once it
    // has its configuration; the join below watches the unit and slurmctld instead.
    systemd.start_no_wait(&s.slurm.slurmd_unit).await?;
    t.record("slurmd", prep_time + slurmd_start.elapsed());

    let (node, kept_drain) = join(
        s,
        &def,
        &systemd,
        &id.instance_id,
        &id.ami_id,
        &holder,
        slurmd_version,
    )
    .await?;
    t.done("join");
    let stage = crate::node_lifecycle::Stage::NodeReady;
    let outcome = run_lifecycle(lifecycle, stage, &systemd, managed.as_ref()).await?;
    if !outcome.scripts.is_empty() {
        t.done("node_ready");
    }
    scripts.extend(outcome.scripts);

    write_state(s, &id, &def).map_err(BootstrapError::Io)?;
    Ok(Report {
        node_name: def.node_name.clone(),
        state: node.state().to_string(),
        instance_id: id.instance_id.clone(),
        dynamic_conf: def.dynamic_conf.clone(),
        key_changed,
        slurmd_restarted,
        drain: kept_drain,
        replaced_instance_id: holder.replaced().map(str::to_string),
        total_ms: u64::try_from(t.start.elapsed().as_millis()).unwrap_or(u64::MAX),
        steps: t.steps,
        lifecycle: scripts,
    })
}

/// One lifecycle stage; a `TERMINATE` also goes into the registration record in the managed
/// mode.
async fn run_lifecycle(
    cx: crate::node_lifecycle::Context<'_>,
    stage: crate::node_lifecycle::Stage,
    systemd: &Systemd,
    managed: Option<&crate::pcs::Managed>,
) -> Result<crate::node_lifecycle::StageOutcome, BootstrapError> {
    let result = crate::node_lifecycle::run(cx, stage, systemd).await;
    if let (Err(crate::node_lifecycle::LifecycleError::Terminated { reason, .. }), Some(m)) =
        (&result, managed)
    {
        if let Err(e) = crate::pcs::record_termination(cx.state_dir, &m.registration, reason) {
            tracing::error!("{e}");
        }
    }
    Ok(result?)
}

/// Takes the bootstrap lock in `state_dir` (created if missing), waiting up to
/// [`LOCK_WAIT`] with a log line.
async fn take_lock(state_dir: &Path) -> Result<crate::fsutil::FileLock, BootstrapError> {
    let io = |e: std::io::Error| BootstrapError::Io(format!("{}: {e}", state_dir.display()));
    std::fs::create_dir_all(state_dir).map_err(io)?;
    let path = state_dir.join(LOCK_FILE);
    let lock = crate::fsutil::lock_exclusive(&path, LOCK_WAIT, || {
        tracing::info!(
            lock = %path.display(),
            "another bootstrap is running: waiting for it to finish (up to {:?})",
            LOCK_WAIT
        );
    })
    .await
    .map_err(|e| BootstrapError::Io(format!("{}: {e}", path.display())))?;
    lock.ok_or(BootstrapError::Busy { path })
}

/// Fetches the stored (still encoded) key bytes; AWS sources use the SDK's default
/// credentials chain in `region`.
async fn fetch_stored(source: &KeySource, region: &str) -> Result<authkey::Stored, KeyError> {
    match source {
        KeySource::File(_) => {
            authkey::fetch(source, &aws_config::SdkConfig::builder().build()).await
        }
        _ => {
            let t = Instant::now();
            let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
                .region(aws_config::Region::new(region.to_string()))
                .load()
                .await;
            tracing::debug!(elapsed = ?t.elapsed(), "AWS SDK configuration loaded");
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
    prefetched: Option<(KeySource, Result<authkey::Stored, KeyError>)>,
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
    if stored.unencrypted_parameter {
        if !s.auth.allow_string_parameter {
            return Err(KeyError::UnencryptedParameter { source_: source });
        }
        tracing::warn!(
            "{source} is not a SecureString: the key is stored unencrypted \
             (auth.allow_string_parameter = true)"
        );
    }
    let key = authkey::decode(&source, &stored.bytes, s.auth.key_encoding, &target)?;
    let changed = authkey::install(&key, &target.path, owner)?;
    tracing::info!(path = %target.path.display(), changed, bytes = key.len(), "auth key installed");
    Ok(changed)
}

/// Where a dynamic node's record in slurmctld differs from the `--conf` line about to be
/// registered: `(key, in slurmctld, wanted)` for CPUs, RealMemory, Features and Gres.
/// slurmctld keeps a dynamic node's record after slurmd stops, and a re-registration does
/// not replace its definition.
pub fn definition_differences(node: &NodeInfo, conf: &str) -> Vec<(String, String, String)> {
    let want: std::collections::BTreeMap<&str, &str> = conf
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .collect();
    let set = |v: &str| -> std::collections::BTreeSet<String> {
        v.split(',')
            .map(str::trim)
            .filter(|x| !x.is_empty() && *x != "(null)")
            .map(str::to_string)
            .collect()
    };
    let have = |k: &str| node.fields.get(k).map_or("", String::as_str);
    let mut out = Vec::new();
    for (ours, theirs, as_set) in [
        ("CPUs", "CPUTot", false),
        ("RealMemory", "RealMemory", false),
        ("Features", "AvailableFeatures", true),
        ("Gres", "Gres", true),
    ] {
        let w = want.get(ours).copied().unwrap_or("");
        let h = have(theirs);
        let differs = if as_set {
            set(w) != set(h)
        } else {
            !w.is_empty() && w != h
        };
        if differs {
            out.push((ours.to_string(), h.to_string(), w.to_string()));
        }
    }
    out
}

/// The proof of registration ([`registered_by`]) has one-second resolution: a slurmd
/// started in the same second as the one that made the record (`old_start`, its
/// `SlurmdStartTime` in Unix seconds) could not be told from it, so this waits into the
/// next second when needed.
async fn wait_for_next_second(old_start: Option<i64>) {
    let Some(old) = old_start else { return };
    let now = crate::time::now();
    if old >= now {
        let ms = u64::try_from((old + 1 - now).max(0)).unwrap_or(1) * 1000
            - u64::from(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.subsec_millis()),
            );
        tokio::time::sleep(Duration::from_millis(ms + 1)).await;
    }
}

/// What [`prepare_record`] found in slurmctld's record before slurmd (re)started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundRecord {
    /// The record's `SlurmdStartTime` (Unix seconds), if any.
    pub slurmd_start_time: Option<i64>,
    /// Whose record it was: this instance's, a predecessor's, or Slurm does not say.
    pub holder: RecordHolder,
}

impl FoundRecord {
    /// From the record as read (`None`: no record, or the look failed), seen by instance
    /// `instance_id`. Logs the replacement when the record names another instance.
    pub fn new(node_name: &str, record: Option<&NodeInfo>, instance_id: &str) -> FoundRecord {
        let holder = RecordHolder::of(record.and_then(|n| n.instance().id), instance_id);
        if let Some(previous) = holder.replaced() {
            tracing::info!(
                node = node_name,
                previous_instance = previous,
                "replacing instance {previous} (InstanceId from slurmctld's record)"
            );
        }
        FoundRecord {
            slurmd_start_time: record.and_then(NodeInfo::slurmd_start_time),
            holder,
        }
    }
}

/// Before slurmd (re)starts: reads slurmctld's record of the NodeName once (whose it is,
/// [`FoundRecord`]), and, for a dynamic node, deletes it (`scontrol delete NodeName=`) when
/// its definition differs from `conf`, so that the registration that follows creates it
/// anew. Never a record with a job on it, nor one whose reason is not the agent's (an
/// admin's drain survives); a failure is logged and bootstrap carries on.
async fn prepare_record(
    s: &settings::Settings,
    node_name: &str,
    conf: Option<&str>,
    ready: Option<ReadyScontrol>,
    instance_id: &str,
) -> FoundRecord {
    let scontrol = Scontrol::configured(&s.slurm);
    // Through the scontrol started while munged started (it first needs munge for this
    // command, so it answers as one started now would).
    let looked = match ready {
        Some(r) => r.show_node(node_name).await,
        None => scontrol.show_node(node_name).await,
    };
    let node = match looked {
        Ok(n) => n,
        Err(e) => {
            tracing::debug!("slurmctld's record before slurmd starts: {e}");
            None
        }
    };
    let found = FoundRecord::new(node_name, node.as_ref(), instance_id);
    let (Some(node), Some(conf)) = (node, conf) else {
        return found;
    };
    let diff = definition_differences(&node, conf);
    if diff.is_empty() {
        return found;
    }
    let admin = node
        .held_reason()
        .is_some_and(|r| !reason::is_agent_reason(r));
    if admin || !node.runs_no_job() {
        tracing::warn!(node = node_name, ?diff, state = node.state(), reason = node.reason(), "slurmctld's record differs from the new definition but holds jobs or an admin's reason: kept");
        return found;
    }
    tracing::info!(
        node = node_name,
        ?diff,
        "deleting the stale dynamic node record so that the new definition registers"
    );
    if let Err(e) = scontrol
        .run(&["delete", &format!("NodeName={node_name}")])
        .await
    {
        tracing::warn!("{e}");
    }
    found
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

/// Restarts slurmd so that exactly one runs afterwards (see [`stop_slurmd`]); the start
/// job is not waited for ([`Systemd::start_no_wait`]).
async fn restart_slurmd(systemd: &Systemd, unit: &str) -> Result<(), SystemdError> {
    stop_slurmd(systemd, unit).await?;
    systemd.start_no_wait(unit).await
}

/// Whether the node record shows a registration by the slurmd now running: its
/// `SlurmdStartTime` (whole seconds) is not before the start of the unit's main process
/// (systemd's `ExecMainStartTimestamp`, floored to the second). A record left by an earlier
/// slurmd (an earlier boot, a slurmd since stopped, another instance with the same
/// NodeName) started before it and does not count.
pub fn registered_by(node: &NodeInfo, svc: &ServiceInfo) -> bool {
    let started = i64::try_from(svc.exec_main_start_usec / 1_000_000).unwrap_or(i64::MAX);
    svc.exec_main_pid != 0 && started > 0 && node.slurmd_start_time().is_some_and(|t| t >= started)
}

/// What bootstrap does with a drain it finds on a node its slurmd has registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FoundDrain {
    /// The agent's drain for a cause that ended with the incarnation that saw it (a spot,
    /// stop or hibernate notice, a maintenance event, a rebalance, a lifecycle state; an
    /// upgrade of another instance): lifted.
    Lift(AgentReason),
    /// A drain that stays: an admin's (any reason not in the agent's scheme), or the
    /// agent's own that its owner lifts (health checks, mounts, an operator's `drain`).
    Keep(String),
}

/// Decides on a drain with `reason` found by incarnation `instance_id`, which runs image
/// `running_ami`, at bootstrap, on a record whose holder before this instance's slurmd
/// registered was `holder` ([`RecordHolder`]).
///
/// Whose an upgrade drain is comes from [`RecordHolder::incarnation_of`]: on a record
/// Slurm says a predecessor held, a reason with the writer `unknown`, or one naming this
/// instance, is the predecessor's; on a record that names this instance, a reason with the
/// writer `unknown` is this instance's; where Slurm does not say, the reason's instance id
/// decides. Every other cause is decided by the cause alone; a reason not in the agent's
/// scheme is an admin's and stays.
pub fn found_drain(
    reason: Option<&str>,
    instance_id: &str,
    running_ami: &str,
    holder: &RecordHolder,
) -> FoundDrain {
    let Some(r) = reason.and_then(reason::parse_reason) else {
        return FoundDrain::Keep(format!(
            "drained by an admin ({}); left drained",
            reason.unwrap_or("no reason")
        ));
    };
    let incarnation = holder.incarnation_of(&r.instance_id, instance_id);
    let lift = match r.cause {
        // The instance booted again (or is another one): the notice or event is over; the
        // daemon drains again within one interval if it still stands.
        ReasonCause::Spot
        | ReasonCause::Stop
        | ReasonCause::Hibernate
        | ReasonCause::Maintenance
        | ReasonCause::Rebalance
        | ReasonCause::Lifecycle => true,
        // This instance's upgrade drain is the upgrade's to finish; another instance's is
        // over unless this replacement still runs an image other than the desired one (then
        // the daemon's loop check owns it: lifting it would drain and power off again).
        ReasonCause::Upgrade => {
            incarnation != Incarnation::This
                && !reason.is_some_and(|x| crate::upgrade::leftover_still_applies(x, running_ami))
        }
        ReasonCause::Health | ReasonCause::Mount | ReasonCause::Operator | ReasonCause::Script => {
            false
        }
    };
    if lift {
        FoundDrain::Lift(r)
    } else {
        let owner = match r.cause {
            ReasonCause::Health => "the health checks lift it when they pass",
            ReasonCause::Mount => "the daemon lifts it when the mount is back",
            ReasonCause::Upgrade if incarnation == Incarnation::This => {
                "the upgrade in progress owns it"
            }
            ReasonCause::Upgrade => {
                "this instance still runs another image than the one it was drained for: the upgrade check owns it"
            }
            _ => "`slurm-node-agent resume` lifts it",
        };
        let whose = match &incarnation {
            Incarnation::Other(previous) => format!(", left by instance {previous}"),
            Incarnation::This | Incarnation::Unknown => String::new(),
        };
        FoundDrain::Keep(format!(
            "drained by the agent ({}){whose}: {owner}",
            r.to_reason()
        ))
    }
}

/// Says, as far as the agent can see, why slurmd has not registered: systemd's start
/// limit, a controller that does not answer (which address), a name that does not
/// resolve, no `_slurmctld._tcp` SRV record to use, authentication refused.
async fn diagnose(s: &settings::Settings, svc: Option<&ServiceInfo>, seen: &str) -> String {
    let mut why = Vec::new();
    let unit = &s.slurm.slurmd_unit;
    if let Some(svc) = svc {
        if svc.result == "start-limit-hit" {
            why.push(format!(
                "systemd start limit hit for {unit} (StartLimitBurst): systemd refuses to start it until `systemctl reset-failed {unit}`"
            ));
        }
    }
    let low = seen.to_ascii_lowercase();
    if low.contains("authentication") || low.contains("credential") {
        why.push(
            "authentication refused: the cluster key differs from the controller's".to_string(),
        );
    }
    if s.slurm.conf_servers.is_empty() {
        why.push(
            "slurm.conf_servers is empty, so slurmd needs the DNS SRV record _slurmctld._tcp: \
             none gave it a controller"
                .to_string(),
        );
    }
    for server in s
        .slurm
        .conf_servers
        .iter()
        .filter_map(|c| ConfServer::parse(c).ok())
    {
        let port = server.port.unwrap_or(6817);
        let addr = if server.host.contains(':') {
            format!("[{}]:{port}", server.host)
        } else {
            format!("{}:{port}", server.host)
        };
        let probe = async {
            let addrs: Vec<_> = match tokio::net::lookup_host(&addr).await {
                Ok(a) => a.collect(),
                Err(e) => return Some(format!("name {} not resolvable: {e}", server.host)),
            };
            let mut last = None;
            for a in addrs {
                match tokio::net::TcpStream::connect(a).await {
                    Ok(_) => return None,
                    Err(e) => last = Some(e.to_string()),
                }
            }
            Some(format!(
                "controller unreachable at {addr}: {}",
                last.unwrap_or_else(|| "no address".into())
            ))
        };
        match tokio::time::timeout(Duration::from_secs(3), probe).await {
            Ok(Some(m)) => why.push(m),
            Ok(None) => {}
            Err(_) => why.push(format!("controller unreachable at {addr}: no answer in 3s")),
        }
    }
    why.join("; ")
}

/// Waits until the slurmd now running has registered and slurmctld reports the node
/// available, until `slurm.join_deadline`. Returns the node and, when it stays drained by
/// someone else's decision, why ([`FoundDrain::Keep`]): bootstrap succeeds then (the node
/// is registered; a failure would make the unit restart bootstrap forever).
///
/// "Registered" is proved with [`registered_by`]; a re-run that restarts nothing proves it
/// the same way. A drain of the agent's from an earlier run or another incarnation whose
/// cause is over is lifted ([`found_drain`]).
///
/// slurmd in configless mode either keeps retrying the configuration fetch itself (22.05
/// does, under systemd) or exits (a missing spool folder, a refused registration, other
/// versions); when the unit is `failed` or `inactive` it is restarted with capped,
/// jittered backoff ([`Backoff::CONTROLLER`]). scontrol and the unit are read together,
/// 5 ms apart at first, then with backoff to 1 s ([`poll_pause`]). The error at the deadline names the cause as far as it is visible
/// ([`diagnose`]), scontrol's last answer and the unit's state.
async fn join(
    s: &settings::Settings,
    def: &NodeDefinition,
    systemd: &Systemd,
    instance_id: &str,
    running_ami: &str,
    holder: &RecordHolder,
    version: Option<SlurmVersion>,
) -> Result<(NodeInfo, Option<String>), BootstrapError> {
    let unit = &s.slurm.slurmd_unit;
    let scontrol = Scontrol::configured(&s.slurm);
    let deadline = s.slurm.join_deadline.0;
    let start = Instant::now();
    let mut restarts = 0u32;
    let mut polls = 0u32;
    let mut lifted: Option<String> = None;
    // The scontrol for the next look, started during the pause before it
    // ([`Scontrol::spawn_ready`]): the look is then one RPC, not a program's start.
    let mut ready: Option<ReadyScontrol> = None;
    wait_for_config_cache(s, systemd, deadline).await;
    wait_for_slurmd_ready(s, systemd, version, deadline).await;
    loop {
        let look = async {
            match ready.take() {
                Some(r) => r.show_node(&def.node_name).await,
                None => scontrol.show_node(&def.node_name).await,
            }
        };
        // slurmctld's record and the unit's state, read together: one wait per poll.
        let (node, svc) = futures_lite::future::zip(look, systemd.service_info(unit)).await;
        let svc = match svc {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!("{e}");
                None
            }
        };
        polls += 1;
        let seen = match node {
            Ok(Some(node)) if svc.as_ref().is_some_and(|v| registered_by(&node, v)) => {
                if node.has_flag("INVALID_REG") || node.has_flag("INVALID") {
                    return Err(BootstrapError::Invalid {
                        node_name: def.node_name.clone(),
                        state: node.state().to_string(),
                        reason: node.reason().unwrap_or("no reason given").to_string(),
                    });
                }
                // A failing HealthCheckProgram run from before this registration (slurmd
                // runs it at its start; health::act::PendingDrain): drained now.
                let started = svc.as_ref().map_or(0, |v| {
                    i64::try_from(v.exec_main_start_usec / 1_000_000).unwrap_or(0)
                });
                let state_dir = &s.agent.state_dir;
                let pending =
                    crate::health::act::apply_pending(state_dir, &scontrol, &node, started, instance_id);
                if let Some(o) = pending.await {
                    tracing::warn!(node = %def.node_name, action = %o.action, detail = %o.detail, error = ?o.error, "health checks failed before the registration");
                    if o.action == "drain" && o.error.is_none() {
                        polls = 0;
                        continue;
                    }
                }
                if node.is_available() {
                    return Ok((node, None));
                }
                if node.is_drained() && !node.has_flag("NOT_RESPONDING") && !node.state().contains('*') {
                    match found_drain(node.reason(), instance_id, running_ami, holder) {
                        FoundDrain::Keep(why) => {
                            tracing::warn!(node = %def.node_name, "{why}");
                            return Ok((node, Some(why)));
                        }
                        FoundDrain::Lift(r) if lifted.as_deref() != Some(&r.to_reason()) => {
                            tracing::info!(node = %def.node_name, reason = %r, previous_instance = ?holder.replaced(), "lifting the agent's drain of an earlier run: its cause is over");
                            if let Err(e) = scontrol.resume(&def.node_name).await {
                                tracing::warn!("{e}");
                            }
                            lifted = Some(r.to_reason());
                            polls = 0;
                            continue;
                        }
                        FoundDrain::Lift(_) => {}
                    }
                }
                format!(
                    "node is {}{}",
                    node.state(),
                    node.reason().map(|r| format!(" ({r})")).unwrap_or_default()
                )
            }
            Ok(Some(node)) => format!(
                "slurmctld shows no registration by the slurmd now running (SlurmdStartTime={}, {unit} started at {})",
                node.fields.get("SlurmdStartTime").map_or("none", String::as_str),
                svc.as_ref()
                    .map(|v| crate::time::format(
                        i64::try_from(v.exec_main_start_usec / 1_000_000).unwrap_or(0)
                    ))
                    .unwrap_or_else(|| "an unknown time".into())
            ),
            Ok(None) => "slurmctld does not know the node yet".into(),
            Err(e) => e.to_string(),
        };
        if start.elapsed() >= deadline {
            let unit_state = systemd
                .active_state(unit)
                .await
                .unwrap_or_else(|e| format!("unknown ({e})"));
            let info = systemd.service_info(unit).await.ok();
            let why = diagnose(s, info.as_ref(), &seen).await;
            let why = if why.is_empty() {
                String::new()
            } else {
                format!("{why}; ")
            };
            return Err(BootstrapError::Join {
                node_name: def.node_name.clone(),
                waited: start.elapsed(),
                last_error: format!(
                    "{why}{seen}; {unit} is {unit_state} (restarted {restarts} times)"
                ),
            });
        }
        let unit_state = match &svc {
            Some(v) => v.active_state.clone(),
            None => systemd.active_state(unit).await?,
        };
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
            wait_for_config_cache(s, systemd, deadline.saturating_sub(start.elapsed())).await;
            let left = deadline.saturating_sub(start.elapsed());
            wait_for_slurmd_ready(s, systemd, version, left).await;
            polls = 0;
            continue;
        }
        ready = scontrol.spawn_ready().ok();
        // A failing health check run waits for the registration: look as often as at first.
        let pause = match crate::health::act::PendingDrain::read_this_boot(&s.agent.state_dir) {
            Some(_) => JOIN_FAST_PAUSE,
            None => poll_pause(polls),
        };
        tokio::time::sleep(pause.min(deadline.saturating_sub(start.elapsed()))).await;
    }
}

/// On a configless node whose client commands have no configuration yet
/// ([`slurm::client_config`]), waits until slurmd has fetched it and written its cache, at
/// most [`CONFIG_CACHE_WAIT`] and half of `time_left` (the join's), or until slurmd's unit
/// is no longer active. slurmd registers only after that, and each `scontrol` run before it
/// would fetch the whole configuration from slurmctld (`REQUEST_CONFIG`, the largest answer
/// it sends), once per look and per node.
async fn wait_for_config_cache(s: &settings::Settings, systemd: &Systemd, time_left: Duration) {
    let missing = || !client_has_config(s);
    if !missing() {
        return;
    }
    let start = Instant::now();
    // Half the join's time left at most, so that slurmctld is asked (and its answer named
    // in the error) before the deadline.
    let limit = CONFIG_CACHE_WAIT.min(time_left / 2);
    let mut looks = 0u32;
    while start.elapsed() < limit {
        if !missing() {
            tracing::debug!(waited = ?start.elapsed(), "slurmd's configuration cache is there");
            return;
        }
        // The unit's state every 4 looks (20 ms): a slurmd that failed is [`join`]'s to
        // handle, with slurmctld's answer in its message.
        if looks % 4 == 0 {
            if let Ok(state) = systemd.active_state(&s.slurm.slurmd_unit).await {
                if matches!(state.as_str(), "failed" | "inactive") {
                    return;
                }
            }
        }
        looks += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tracing::debug!(
        cache = slurm::CONFIG_CACHE,
        "no configuration cache from slurmd after {limit:?}: asking slurmctld anyway"
    );
}

/// On Slurm 25.11+ ([`SlurmVersion::has_slurmd_http_probes`]), waits until slurmd on this
/// node answers `GET /readyz` on its own port ([`slurm::readyz`]): it then has its
/// configuration, has run its start-up `HealthCheckProgram` and has sent its registration,
/// so the looks at slurmctld that follow can find the node registered. Each look before
/// that is an RPC slurmctld answers in vain, one every 5 ms at first ([`poll_pause`]),
/// for as long as slurmd's start-up health check runs. The wait costs slurmctld nothing.
///
/// At most half of `time_left` (the join's). It ends early, and the join looks at
/// slurmctld as before, when slurmd's unit is no longer active, when slurmd gives no HTTP
/// answer (HTTP off: `CommunicationParameters=disable_http`, TLS, or no HTTP parser
/// plugin), or when the address slurmd listens on `SlurmdPort` at
/// ([`slurm::readyz::listening_address`]) refuses connections for [`READYZ_REFUSED_LIMIT`].
async fn wait_for_slurmd_ready(
    s: &settings::Settings,
    systemd: &Systemd,
    version: Option<SlurmVersion>,
    time_left: Duration,
) {
    if !version.is_some_and(SlurmVersion::has_slurmd_http_probes) {
        return;
    }
    // The configuration the agent's scontrol reads: on a configless node, slurmd's cache
    // (where slurmd's own port comes from).
    let env_conf = std::env::var_os("SLURM_CONF");
    let conf = slurm::client_config(&s.slurm.bin_dir, env_conf.as_deref(), |p| p.exists())
        .and_then(|p| std::fs::read_to_string(p).ok());
    let port = conf.as_deref().map_or(
        slurm::readyz::DEFAULT_SLURMD_PORT,
        slurm::readyz::slurmd_port,
    );
    let start = Instant::now();
    let limit = time_left / 2;
    let mut refused_since: Option<Instant> = None;
    let mut tries = 0u32;
    while start.elapsed() < limit {
        // Nothing listens on slurmd's port yet: it is still fetching its configuration.
        let Some(addr) = slurm::readyz::listening_address(port) else {
            if tries % 4 == 0 && slurmd_stopped(s, systemd).await {
                return;
            }
            tries += 1;
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        match slurm::readyz::probe(addr, READYZ_PROBE_TIMEOUT).await {
            Ok(true) => {
                tracing::debug!(%addr, waited = ?start.elapsed(), "slurmd answers /readyz");
                return;
            }
            // Not servicing RPCs yet, or (a timeout) its listener still holds connections
            // back: slurmd is working, its start-up health check perhaps.
            Ok(false) | Err(slurm::readyz::ReadyzError::Timeout { .. }) => refused_since = None,
            Err(e @ slurm::readyz::ReadyzError::Connect { .. }) => {
                let since = *refused_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= READYZ_REFUSED_LIMIT {
                    tracing::debug!("{e} for {READYZ_REFUSED_LIMIT:?}: looking at slurmctld without waiting for /readyz");
                    return;
                }
            }
            Err(e) => {
                tracing::debug!("{e}: looking at slurmctld without waiting for /readyz");
                return;
            }
        }
        // The unit's state every 4 tries: a slurmd that failed is [`join`]'s to handle.
        if tries % 4 == 0 && slurmd_stopped(s, systemd).await {
            return;
        }
        tries += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tracing::debug!(
        port,
        "slurmd gave no 2xx to /readyz in {limit:?}: looking at slurmctld anyway"
    );
}

/// Whether slurmd's unit is `failed` or `inactive` (a state read that fails counts as not).
async fn slurmd_stopped(s: &settings::Settings, systemd: &Systemd) -> bool {
    systemd
        .active_state(&s.slurm.slurmd_unit)
        .await
        .is_ok_and(|state| matches!(state.as_str(), "failed" | "inactive"))
}

/// How long one `GET /readyz` waits for slurmd's answer: a listener still quiesced holds
/// the connection unanswered, and the unit's state is read between tries.
const READYZ_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// How long `connect` to slurmd's listening address may be refused before
/// [`wait_for_slurmd_ready`] stops waiting (a listener that is there refuses only while it
/// is being replaced).
const READYZ_REFUSED_LIMIT: Duration = Duration::from_secs(10);

/// Whether the agent's `scontrol` finds a configuration on this node
/// ([`slurm::client_config`]) rather than fetching one from slurmctld.
fn client_has_config(s: &settings::Settings) -> bool {
    slurm::has_client_config(&s.slurm)
}

/// How long [`join`] waits for slurmd's configuration cache before it asks slurmctld with a
/// configuration fetched for each look.
const CONFIG_CACHE_WAIT: Duration = Duration::from_secs(5);

/// The pause after the `polls`-th look at slurmctld in [`join`]: a registration normally
/// shows within tens of milliseconds of slurmd's start, so the first
/// [`JOIN_FAST_POLLS`] looks come [`JOIN_FAST_PAUSE`] apart; then the pause grows by half
/// each time, up to one second.
fn poll_pause(polls: u32) -> Duration {
    let slow = polls.saturating_sub(JOIN_FAST_POLLS).min(16);
    let mut pause = JOIN_FAST_PAUSE;
    for _ in 0..slow {
        pause = pause * 3 / 2;
    }
    pause.min(Duration::from_secs(1))
}

/// Looks at slurmctld [`JOIN_FAST_PAUSE`] apart at first ([`poll_pause`]).
const JOIN_FAST_POLLS: u32 = 20;
/// The pause between the first looks at slurmctld ([`poll_pause`]).
const JOIN_FAST_PAUSE: Duration = Duration::from_millis(5);

/// What later commands (`check`, `run`) need from bootstrap: [`crate::identity::Recorded`].
pub type State = crate::identity::Recorded;

fn write_state(
    s: &settings::Settings,
    id: &InstanceIdentity,
    def: &NodeDefinition,
) -> Result<(), String> {
    let state = State {
        node_name: def.node_name.clone(),
        instance_id: id.instance_id.clone(),
        ami_id: id.ami_id.clone(),
        dynamic_conf: def.dynamic_conf.clone(),
        setting_tags: crate::identity::setting_tags(id),
        user_data_settings: crate::identity::user_data_settings(id).unwrap_or_default(),
    };
    state.write(&s.agent.state_dir)
}

/// Reads the state bootstrap left, if any. A record that cannot be parsed (empty,
/// truncated) is moved aside as `bootstrap.json.corrupt-<unix seconds>` with an error in
/// the log, and is `None`: the caller resolves the node as if bootstrap had left nothing.
pub fn read_state(state_dir: &std::path::Path) -> Option<State> {
    State::read(state_dir)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const ME: &str = "i-0123456789abcdef0";
    const OTHER: &str = "i-0fedcba9876543210";
    const UNKNOWN: &str = crate::reason::UNKNOWN_INSTANCE;
    const AMI: &str = "ami-0123456789abcdef0";

    #[test]
    fn drains_found_at_bootstrap() {
        let unknown = RecordHolder::Unknown;
        let lifts =
            |r: &str| matches!(found_drain(Some(r), ME, AMI, &unknown), FoundDrain::Lift(_));
        for cause in [
            "spot",
            "stop",
            "hibernate",
            "maintenance",
            "rebalance",
            "lifecycle",
        ] {
            assert!(
                lifts(&format!("slurm-node-agent/{cause}@{OTHER}: x")),
                "{cause}"
            );
            assert!(
                lifts(&format!("slurm-node-agent/{cause}@{ME}: x")),
                "{cause}"
            );
        }
        assert!(lifts(&format!("slurm-node-agent/upgrade@{OTHER}: a -> b")));
        // Another instance drained for image ami-22222222; this one runs it: lift. Still
        // the old image: the upgrade's loop check owns it.
        assert!(lifts(&format!(
            "slurm-node-agent/upgrade@{OTHER}: image upgrade ami-11111111 -> {AMI}"
        )));
        assert!(!lifts(&format!(
            "slurm-node-agent/upgrade@{OTHER}: image upgrade {AMI} -> ami-22222222"
        )));
        assert!(!lifts(&format!("slurm-node-agent/upgrade@{ME}: a -> b")));
        for kept in ["health", "mount", "operator", "script"] {
            assert!(
                !lifts(&format!("slurm-node-agent/{kept}@{OTHER}: x")),
                "{kept}"
            );
        }
        let FoundDrain::Keep(why) = found_drain(Some("slurm-node-agent: spot"), ME, AMI, &unknown)
        else {
            panic!("an admin look-alike was lifted")
        };
        assert!(why.starts_with("drained by an admin"), "{why}");
        let FoundDrain::Keep(why) = found_drain(None, ME, AMI, &unknown) else {
            panic!()
        };
        assert!(why.contains("no reason"), "{why}");
    }

    /// The 25.11 capture of a record `slurmd --instance-id i-0123456789abcdef0` registered,
    /// drained with `reason` (the captured drain's reason replaced).
    fn captured_drained(reason: &str) -> NodeInfo {
        let text = std::fs::read_to_string(format!(
            "{}/tests/fixtures/slurm-25.11/scontrol-show-node-drained.txt",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        let captured = "slurm-node-agent/spot@i-0123456789abcdef0: spot interruption notice: terminate at 2026-12-01T20:00:00Z";
        assert!(text.contains(captured));
        NodeInfo::parse(&text.replace(captured, reason))
    }

    #[test]
    fn slurms_record_says_whose_upgrade_drain_it_is() {
        // The captured record names ME; OTHER boots onto it: a replacement.
        let upgrade = |writer: &str| {
            format!("slurm-node-agent/upgrade@{writer}: image upgrade ami-11111111 -> {AMI}")
        };
        let decide = |reason: &str, me: &str| {
            let node = captured_drained(reason);
            let found = FoundRecord::new("d1", Some(&node), me);
            (found_drain(node.reason(), me, AMI, &found.holder), found)
        };
        // A replacement: the record names the predecessor, whatever the reason's writer.
        for writer in [UNKNOWN, ME, OTHER] {
            let (d, found) = decide(&upgrade(writer), OTHER);
            assert_eq!(found.holder.replaced(), Some(ME), "{writer}");
            assert!(found.slurmd_start_time.is_some());
            assert!(matches!(d, FoundDrain::Lift(_)), "{writer}: {d:?}");
        }
        // Before, a reason naming this instance was taken for this instance's upgrade.
        let old = found_drain(Some(&upgrade(OTHER)), OTHER, AMI, &RecordHolder::Unknown);
        assert!(matches!(old, FoundDrain::Keep(_)), "{old:?}");
        // The record names this instance (an earlier run registered it): an upgrade drain
        // whose writer is `unknown` is this instance's upgrade in progress, kept.
        let (d, found) = decide(&upgrade(UNKNOWN), ME);
        assert_eq!(found.holder, RecordHolder::This);
        let FoundDrain::Keep(why) = d else {
            panic!("{d:?}")
        };
        assert!(why.ends_with("the upgrade in progress owns it"), "{why}");
        // Another instance's, written before this one registered: lifted.
        let (d, _) = decide(&upgrade(OTHER), ME);
        assert!(matches!(d, FoundDrain::Lift(_)), "{d:?}");
        // Where Slurm keeps no instance id, the writer `unknown` is not this instance.
        let d = found_drain(Some(&upgrade(UNKNOWN)), ME, AMI, &RecordHolder::Unknown);
        assert!(matches!(d, FoundDrain::Lift(_)), "{d:?}");
        // A predecessor's drain for an image this replacement does not run stays for the
        // upgrade check, and says whose it is.
        let stale =
            format!("slurm-node-agent/upgrade@{UNKNOWN}: image upgrade {AMI} -> ami-22222222");
        let (d, _) = decide(&stale, OTHER);
        let FoundDrain::Keep(why) = d else {
            panic!("{d:?}")
        };
        assert!(why.contains(&format!("left by instance {ME}")), "{why}");
        // Admin drains are never the agent's, whoever holds the record.
        for holder in [RecordHolder::This, RecordHolder::Predecessor(ME.into())] {
            let d = found_drain(Some("ADMIN  SHUTDOWN"), OTHER, AMI, &holder);
            assert!(matches!(d, FoundDrain::Keep(ref w) if w.starts_with("drained by an admin")));
        }
        // The agent's health drain of a predecessor stays for the checks to lift.
        let (d, _) = decide(&format!("slurm-node-agent/health@{ME}: disk"), OTHER);
        let FoundDrain::Keep(why) = d else {
            panic!("{d:?}")
        };
        assert!(
            why.contains(&format!(", left by instance {ME}: the health checks")),
            "{why}"
        );
    }

    #[test]
    fn definition_differences_name_what_changed() {
        let node = NodeInfo::parse(
            "NodeName=n CPUTot=2 RealMemory=1000 AvailableFeatures=m4.xlarge,first Gres=(null) State=IDLE",
        );
        let same = "CPUs=2 Boards=1 RealMemory=1000 Features=first,m4.xlarge Weight=1";
        assert!(definition_differences(&node, same).is_empty());
        let d = definition_differences(
            &node,
            "CPUs=2 RealMemory=1000 Features=m4.xlarge,second Weight=1",
        );
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].0, "Features");
        let d = definition_differences(
            &node,
            "CPUs=4 RealMemory=900 Features=m4.xlarge,first Gres=gpu:1",
        );
        let keys: Vec<&str> = d.iter().map(|x| x.0.as_str()).collect();
        assert_eq!(keys, ["CPUs", "RealMemory", "Gres"]);
    }

    #[test]
    fn the_join_looks_often_at_first_then_backs_off_to_one_second() {
        for n in 0..=JOIN_FAST_POLLS {
            assert_eq!(poll_pause(n), JOIN_FAST_PAUSE, "poll {n}");
        }
        assert!(poll_pause(JOIN_FAST_POLLS + 1) > JOIN_FAST_PAUSE);
        let mut last = Duration::ZERO;
        for n in 0..200 {
            let p = poll_pause(n);
            assert!(p >= last, "poll {n}: {p:?} after {last:?}");
            last = p;
        }
        assert_eq!(poll_pause(200), Duration::from_secs(1));
        assert_eq!(poll_pause(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn registration_proof_compares_whole_seconds() {
        let node = NodeInfo::parse("NodeName=n SlurmdStartTime=2017-09-18T08:22:00 State=IDLE");
        let svc = |usec: u64, pid: u32| ServiceInfo {
            exec_main_start_usec: usec,
            exec_main_pid: pid,
            ..ServiceInfo::default()
        };
        // Started in the same second (slurmd notes its start after the fork): proved.
        assert!(registered_by(&node, &svc(1_505_722_920_900_000, 7)));
        assert!(registered_by(&node, &svc(1_505_722_919_000_000, 7)));
        // Started a second later: the record is an earlier slurmd's.
        assert!(!registered_by(&node, &svc(1_505_722_921_000_000, 7)));
        assert!(!registered_by(&node, &svc(1_505_722_920_000_000, 0)));
        assert!(!registered_by(&node, &svc(0, 7)));
        let never = NodeInfo::parse("NodeName=n SlurmdStartTime=None State=DOWN");
        assert!(!registered_by(&never, &svc(1_505_722_920_000_000, 7)));
    }
}
