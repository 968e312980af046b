//! First boot: instance metadata → settings → auth key → slurmd in configless (optionally
//! dynamic) mode → node available in slurmctld.
//!
//! Idempotent: every step converges (the key and the options file are rewritten only when
//! they differ, units are started, not spawned, so there is one slurmd), so a bootstrap
//! killed at any step and run again ends in the same state.
//!
//! This module is the orchestration only ([`run`] is the list of steps, some run together);
//! each step lives with its subject: the key with [`crate::authkey`], the node definition
//! with [`crate::nodedef`], the managed join with [`crate::pcs`], the mounts with
//! [`crate::mounts`], slurmd's preparation and slurmctld's record with [`crate::slurm`]
//! (`slurmd`, `record`), the lifecycle scripts with [`crate::node_lifecycle`], the drain
//! found at boot with [`crate::drain::boot`], and the join loop in [`join`].
//!
//! Floor 10 (roof): the orchestration of first boot.

mod auth;
mod gate;
pub mod join;
pub mod login;
pub mod metrics;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::authkey::{self, AuthType, KeyError, Prefetch};
use crate::exit::Exit;
use crate::hostfacts::GpuWaitError;
use crate::identity::{Instance, Recorded};
use crate::imds::{Imds, ImdsError, InstanceIdentity};
use crate::node_lifecycle::{self as lifecycle, Stage};
use crate::nodedef::{DefinitionError, NodeDefinition};
use crate::pcs::{EarlyRegistration, Managed};
use crate::reason::RecordHolder;
use crate::settings::pipeline::{Inputs, Metadata};
use crate::settings::{self, Enforce, Layer, Resolved, Settings, SettingsError};
use crate::slurm::skew::Refusal;
use crate::slurm::slurmd::{self, PrepareError};
use crate::slurm::{self as slurm_mod, record, InstanceArgs, SlurmVersion};
use crate::systemd::{Systemd, SystemdError};

/// Why bootstrap failed. [`BootstrapError::exit`] maps each kind to its exit code.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// Settings invalid (exit 78, EX_CONFIG).
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// Instance metadata unavailable (exit 69, EX_UNAVAILABLE).
    #[error(transparent)]
    Imds(#[from] ImdsError),
    /// `imds.tags = "describe-tags"` and EC2's `DescribeTags` failed (exit 77, EX_NOPERM,
    /// when access is denied; else 69).
    #[error(transparent)]
    Tags(#[from] crate::ec2tags::DescribeTagsError),
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
    /// slurmctld refuses the configuration requests of slurmd (sackd on a login node) while
    /// it accepts connections: the node's `auth.type` or key differs from the controller's
    /// `AuthType` and key (exit 65). Seen when the daemon has run
    /// [`join::FETCH_REFUSED_AFTER`] without its configuration.
    #[error(
        "node {node_name}: slurmctld at {controller} refuses {daemon}'s requests: the node's \
         authentication differs from the controller's (auth.type = \"{}\": {}, key {}{}); \
         give the node the controller's AuthType and key. {daemon} ran {}s without its \
         configuration while slurmctld accepted connections; {daemon}'s log \
         (journalctl -u {unit}) says `{}` for this, slurmctld's `authentication error` (a \
         controller without SlurmctldParameters=enable_configless refuses too). A slurmctld \
         of 24.11 or older refuses a {daemon} of a newer release the same way, as any \
         slurmctld refuses one more than three releases older than itself (two before \
         24.11): compare with SLURM_VERSION in `scontrol show config` on the controller",
        auth_type.setting(),
        auth_type.plugin(),
        key_path.display(),
        version.map(|v| format!(", {daemon} {v}")).unwrap_or_default(),
        ran.as_secs(),
        if *daemon == "sackd" {
            "Failed to load configs from slurmctld"
        } else {
            "failed to fetch remote configs: Protocol authentication error"
        }
    )]
    Refused {
        /// NodeName (a login node's name).
        node_name: String,
        /// The configless server that accepted a connection (`host:port`).
        controller: String,
        /// `auth.type`.
        auth_type: AuthType,
        /// The key file the daemon reads.
        key_path: PathBuf,
        /// `slurmd -V`.
        version: Option<SlurmVersion>,
        /// `slurmd`, or `sackd` on a login node.
        daemon: &'static str,
        /// The daemon's unit.
        unit: String,
        /// How long the daemon ran without its configuration.
        ran: Duration,
    },
    /// `/opt/slurm` could not be pointed at the release chosen among several installed
    /// (exit 74).
    #[error(transparent)]
    SlurmRelease(#[from] slurm_mod::installed::SwitchError),
    /// slurmctld refused the protocol of this node's Slurm release at the look before
    /// slurmd's start (exit 76, EX_PROTOCOL): the controller runs an older release than
    /// slurmd, and a controller never accepts a newer one ([`crate::slurm::skew`]). slurmd
    /// is not started.
    #[error(
        "node {node_name}: slurmctld at {controller} refuses the protocol of this node's \
         Slurm{} (scontrol: `{evidence}`){others}: a slurmctld accepts slurmd of its own release and \
         of up to three older ones (two before 24.11), never a newer one, so the controller \
         runs a release older than {} (or one more than three releases newer, or what \
         answers at {controller} is not slurmctld). slurmd is not started. \
         Build the image with the controller's release (slurm_version) or upgrade the \
         controller first; \
         `scontrol show config` on the controller prints its SLURM_VERSION",
        node_version.map(|v| format!(" {v}")).unwrap_or_default(),
        node_version.map_or_else(|| "this node's".to_string(), SlurmVersion::release)
    )]
    VersionSkew {
        /// NodeName.
        node_name: String,
        /// The controller that refused (`host:port`), or how it was found.
        controller: String,
        /// `slurmd -V` on this node.
        node_version: Option<SlurmVersion>,
        /// scontrol's line that shows the refusal.
        evidence: String,
        /// With several releases installed: `; it refused every release installed
        /// (26.05.3, 25.11.6)`; empty otherwise.
        others: String,
    },
    /// A node that is not dynamic whose NodeName slurmctld does not know, while slurmd
    /// exits each time (exit 65): a mistyped `node.name`, or a nodeID the cluster's
    /// slurm.conf does not declare.
    #[error(
        "node {node_name} ({source_key}) is not a node of slurmctld: a node that is not \
         dynamic (node.dynamic = false, and every node of the managed join) must be declared \
         in the cluster's slurm.conf (NodeName={node_name}). {unit} exited {restarts} times \
         saying so (journalctl -u {unit}: `Unable to find node record for {node_name}`)"
    )]
    UnknownNode {
        /// NodeName.
        node_name: String,
        /// Where the name came from: `node.name`, `node.name_template` or the registration's
        /// nodeID.
        source_key: &'static str,
        /// slurmd's unit.
        unit: String,
        /// How many times slurmd was restarted.
        restarts: u32,
    },
    /// A daemon bootstrap started (sackd on a login node) exited by itself again and again
    /// (exit 71, EX_OSERR: something on this node; bootstrap's unit tries again later).
    #[error(
        "{unit} exited {exits} times in a row (last result {result}); its log says why: \
         journalctl -u {unit} (e.g. `_prepare_run_dir: /run/slurm exists but is owned by \
         <uid>`: the unit's User= is not the cluster's SlurmUser)"
    )]
    DaemonExits {
        /// The unit.
        unit: String,
        /// How many times it exited.
        exits: u32,
        /// systemd's `Result` of the last run (`exit-code`, `signal`, ...).
        result: String,
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
    /// A required `[[mounts]]` entry is not in place: slurmd is not started (exit 72,
    /// EX_OSFILE: the file systems jobs need are missing).
    #[error(transparent)]
    Mounts(#[from] crate::mounts::MountsFailed),
    /// The bootstrap record, the lock or another file of the agent's (exit 74, EX_IOERR).
    #[error(transparent)]
    File(#[from] crate::fsutil::FileError),
    /// The bootstrap record could not be written (exit 74).
    #[error(transparent)]
    Record(#[from] crate::identity::RecordError),
    /// The `SLURMD_OPTIONS` file could not be written (exit 74).
    #[error(transparent)]
    Options(#[from] crate::slurm::OptionsFileError),
    /// The task writing the registration's key ended without an answer (exit 74).
    #[error("writing the registration's key: {0}")]
    KeyTask(#[source] tokio::task::JoinError),
    /// Another bootstrap held the lock for longer than [`LOCK_WAIT`] (exit 75).
    #[error("another bootstrap still holds {} after {:?}", path.display(), LOCK_WAIT)]
    Busy {
        /// The lock file.
        path: PathBuf,
    },
    /// cloud-init did not finish within its bound, or could not be run (exit 75 or 71).
    #[error(transparent)]
    CloudInit(crate::cloudinit::CloudInitError),
    /// The managed join (PCS registration) failed; see [`crate::pcs::PcsError::exit`].
    #[error(transparent)]
    Pcs(#[from] crate::pcs::PcsError),
    /// A lifecycle script stopped bootstrap; see
    /// [`crate::node_lifecycle::LifecycleError::exit`].
    #[error(transparent)]
    Lifecycle(#[from] crate::node_lifecycle::LifecycleError),
}

/// Lock file, under `agent.state_dir`, that makes concurrent bootstraps take turns.
pub const LOCK_FILE: &str = "bootstrap.lock";

/// How long a bootstrap waits for another one to finish: longer than one bootstrap's own
/// bounds (join deadline, GPU wait, mount retries) at their defaults.
pub const LOCK_WAIT: Duration = Duration::from_secs(20 * 60);

impl BootstrapError {
    /// The process exit code for this error.
    pub fn exit(&self) -> Exit {
        match self {
            BootstrapError::Settings(_) => Exit::Config,
            BootstrapError::Imds(_) | BootstrapError::Gpu(_) => Exit::Unavailable,
            BootstrapError::Key(e) => e.exit(),
            BootstrapError::Tags(e) => e.exit(),
            BootstrapError::Invalid { .. }
            | BootstrapError::Refused { .. }
            | BootstrapError::UnknownNode { .. } => Exit::DataErr,
            BootstrapError::Systemd(_) | BootstrapError::DaemonExits { .. } => Exit::OsErr,
            BootstrapError::Join { .. } | BootstrapError::Busy { .. } => Exit::TempFail,
            BootstrapError::Mounts(_) => Exit::MountFailed,
            BootstrapError::VersionSkew { .. } => Exit::Protocol,
            BootstrapError::File(_)
            | BootstrapError::SlurmRelease(_)
            | BootstrapError::Record(_)
            | BootstrapError::Options(_)
            | BootstrapError::KeyTask(_) => Exit::IoErr,
            BootstrapError::Pcs(e) => e.exit(),
            BootstrapError::Lifecycle(e) => e.exit(),
            BootstrapError::CloudInit(e) => e.exit(),
        }
    }
}

impl From<crate::identity::InstanceError> for BootstrapError {
    fn from(e: crate::identity::InstanceError) -> Self {
        match e {
            crate::identity::InstanceError::Imds(e) => BootstrapError::Imds(e),
            crate::identity::InstanceError::Settings(e) => BootstrapError::Settings(e),
            crate::identity::InstanceError::Tags(e) => BootstrapError::Tags(e),
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
    /// The run's progress, for the caller to read after it (success or not).
    pub progress: ProgressLog,
}

/// What a bootstrap run has done so far, kept beside its result so that a failed run's
/// steps reach its metrics too ([`metrics`]).
#[derive(Debug, Default, Clone)]
pub struct Progress {
    /// Steps done, in order.
    pub steps: Vec<Step>,
    /// Where the metrics go (`bootstrap.prom` beside the drain metrics), once the settings
    /// are read.
    pub metrics_file: Option<PathBuf>,
    /// The Slurm release slurmd runs (`slurmd -V`), once known.
    pub slurm_release: Option<String>,
    /// The start-up gate's record of this boot, when it ran.
    pub gate: Option<crate::health::startgate::GateRecord>,
}

/// A run's [`Progress`], shared with the caller.
pub type ProgressLog = std::sync::Arc<std::sync::Mutex<Progress>>;

fn progress(log: &ProgressLog) -> std::sync::MutexGuard<'_, Progress> {
    log.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
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
    /// `node.role`: `compute` or `login`.
    pub role: crate::nodedef::Role,
    /// Slurm NodeName (a login node's name: it is not a Slurm node).
    pub node_name: String,
    /// Slurm state at the end, e.g. `IDLE+DYNAMIC_NORM`; a login node's is
    /// [`login::LOGIN_READY`].
    pub state: String,
    /// EC2 instance id.
    pub instance_id: String,
    /// The `--conf` line of a dynamic node.
    pub dynamic_conf: Option<String>,
    /// Whether the key file was (re)written.
    pub key_changed: bool,
    /// Whether slurmd was restarted (options or key changed).
    pub slurmd_restarted: bool,
    /// Whether sackd was restarted (a login node: options or key changed).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub sackd_restarted: bool,
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
    /// With several Slurm releases in the image: which one slurmd started with and why
    /// (absent with one release, or when slurmd kept running).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slurm_release: Option<ReleaseChoice>,
    /// Lifecycle scripts of both stages, in the order they were considered (absent when
    /// there are none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lifecycle: Vec<crate::node_lifecycle::ScriptResult>,
}

struct Timer {
    start: Instant,
    step: Instant,
    /// The steps done are kept in the run's progress (the report's and the metrics').
    log: ProgressLog,
}

impl Timer {
    fn new(log: &ProgressLog) -> Timer {
        let now = Instant::now();
        Timer {
            start: now,
            step: now,
            log: log.clone(),
        }
    }

    /// Records a step measured on its own (one of several run together).
    fn record(&mut self, name: &'static str, d: Duration) {
        let duration_ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        self.push(Step { name, duration_ms });
        self.step = Instant::now();
    }

    fn done(&mut self, name: &'static str) {
        let now = Instant::now();
        let duration_ms = u64::try_from((now - self.step).as_millis()).unwrap_or(u64::MAX);
        self.push(Step { name, duration_ms });
        self.step = now;
    }

    fn push(&mut self, step: Step) {
        tracing::info!(
            decision = "bootstrap.step",
            step = step.name,
            duration_ms = step.duration_ms,
            "step done"
        );
        progress(&self.log).steps.push(step);
    }

    /// The steps done so far, in order.
    fn steps(&self) -> Vec<Step> {
        progress(&self.log).steps.clone()
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

/// Runs bootstrap to the end.
///
/// # Errors
/// [`BootstrapError`]; nothing is written before the step that needs it succeeds (no key
/// file for a bad key, munge not restarted).
pub async fn run(opts: &Options) -> Result<Report, BootstrapError> {
    let mut t = Timer::new(&opts.progress);
    // The one settings pipeline (settings::pipeline): files and flags first (they may
    // point IMDS elsewhere), then the user data part and the tags, in precedence order.
    // Bootstrap refuses a key from a source below its trust class (exit 78).
    let inputs = Inputs::read(&opts.paths, &opts.flag_layers)?;
    let early = inputs.resolve(Enforce::Refuse)?;
    progress(&opts.progress).metrics_file = Some(metrics::path(&early.settings));
    t.done("settings");
    // Two bootstraps at once (the unit and an operator, or user data): the second waits
    // for the first, then converges on what it did.
    let _lock = take_lock(&early.settings.agent.state_dir).await?;

    // The key and the managed join's first attempt start beside the metadata read, from
    // the files and flags; each is used only if the final settings ask the same.
    let prefetch = Prefetch::start(&early.settings.auth, &early.settings.imds);
    let early_registration = start_early_registration(&early.settings);
    let instance = read_instance_metadata(&early.settings, &inputs).await?;
    let resolved = instance.settings(Enforce::Refuse)?;
    let id = &instance.facts;
    t.done("instance_metadata");
    auth::check(&resolved).await?;

    // Managed join (issue 13): PCS's registration answer names the node, the controller
    // and the key; the rest of bootstrap runs with settings that say so.
    let managed = register(&resolved.settings, id, early_registration).await?;
    let joined = managed.as_ref().map(|m| {
        let mut joined = resolved.settings.clone();
        m.join_settings(&mut joined.node, &mut joined.slurm, &mut joined.auth);
        joined
    });
    if managed.is_some() {
        t.done("register");
    }
    let cx = Steps {
        s: joined.as_ref().unwrap_or(&resolved.settings),
        resolved: &resolved,
        id,
        metadata: &instance.metadata,
    };

    if cx.s.node.role == crate::nodedef::Role::Login {
        return login::run(&cx, prefetch, managed.as_ref(), t).await;
    }
    let (def, key_changed, systemd, scratch) =
        define_node_and_install_key(&cx, opts, prefetch, managed.as_ref(), &mut t).await?;
    let prepared = prepare_slurmd(&cx, &def, key_changed, &systemd, &mut t).await?;
    progress(&opts.progress).slurm_release = prepared.version.as_ref().map(ToString::to_string);
    let facts = lifecycle_facts(&cx, &def, managed.as_ref());
    let gateway = cx.gateway(&def);
    let stages = cx.lifecycle(&facts, &gateway, managed.as_ref());
    let mut scripts = lifecycle_stage(
        stages,
        Stage::NodeBootstrapped,
        &systemd,
        managed.as_ref(),
        &mut t,
    )
    .await?;
    let state_dir = &cx.s.agent.state_dir;
    let boot_id = crate::hostfacts::boot_id().unwrap_or_default();
    let gate_pending = gate::before_slurmd(
        &cx.s.start_gate,
        state_dir,
        &id.instance_id,
        &boot_id,
        &gateway,
    )
    .await;
    start_slurmd(&cx, &systemd, prepared.time, &mut t).await?;
    let slurmctld = slurm_mod::Scontrol::configured(&cx.s.slurm);
    let peers = join::Peers {
        slurmctld: &slurmctld,
        systemd: &systemd,
    };
    let (node, kept_drain) = join::join(
        cx.s,
        &def,
        peers,
        id,
        &gateway,
        &prepared.holder,
        prepared.version,
    )
    .await?;
    t.done("join");
    crate::scratch::boot::after_join(
        &cx.s.scratch,
        &gateway,
        def.dynamic_conf.is_some(),
        &node,
        &scratch,
    )
    .await;
    let (mut state, mut drain) = (node.state().to_string(), kept_drain);
    let mut gate_failed = false;
    if let Some(pending) = gate_pending {
        let record = gate::after_join(
            &cx.s.start_gate,
            pending,
            state_dir,
            &id.instance_id,
            &gateway,
            &systemd,
            &crate::drain::SlurmOps::new(&cx.s.slurm.bin_dir),
        )
        .await;
        t.done("start_gate");
        progress(&opts.progress).gate = Some(record.clone());
        if let Ok(Some(n)) = gateway.record().await {
            state = n.state().to_string();
            drain = n.reason().filter(|_| n.is_drained()).map(str::to_string);
        }
        gate_failed = !record.passed();
    }
    // nodeReady's scripts are for a node ready for jobs: not after a failed gate.
    if !gate_failed {
        scripts.extend(
            lifecycle_stage(stages, Stage::NodeReady, &systemd, managed.as_ref(), &mut t).await?,
        );
    }

    Recorded::of(id, cx.metadata, &def).write(&cx.s.agent.state_dir)?;
    Ok(Report {
        role: crate::nodedef::Role::Compute,
        node_name: def.node_name.clone(),
        state,
        instance_id: id.instance_id.clone(),
        dynamic_conf: def.dynamic_conf.clone(),
        key_changed,
        slurmd_restarted: prepared.restart,
        sackd_restarted: false,
        drain,
        replaced_instance_id: prepared.holder.replaced().map(str::to_string),
        slurm_release: prepared.release,
        total_ms: u64::try_from(t.start.elapsed().as_millis()).unwrap_or(u64::MAX),
        steps: t.steps(),
        lifecycle: scripts,
    })
}

/// What the steps after the instance metadata share.
struct Steps<'a> {
    /// The settings the steps run with (the managed join's, in that mode).
    s: &'a Settings,
    /// The settings as resolved, for the source of a key in an error.
    resolved: &'a Resolved,
    /// The instance.
    id: &'a InstanceIdentity,
    /// The settings its metadata carries, as read (bootstrap's record keeps them).
    metadata: &'a Metadata,
}

impl<'a> Steps<'a> {
    /// The gateway of node `def`'s state ([`crate::node_state::Gateway`]), writing this
    /// instance's reasons: every drain, resume and deletion of bootstrap's goes through it.
    fn gateway(&self, def: &NodeDefinition) -> crate::node_state::Gateway {
        self.s
            .node_gateway(&def.node_name)
            .with_instance(&self.id.instance_id)
    }

    /// The lifecycle stages' inputs: `[node_lifecycle]`, the state folder, the node's
    /// gateway, the region, the service's scripts in the managed mode, and `facts`.
    fn lifecycle(
        &self,
        facts: &'a lifecycle::Facts,
        gateway: &'a crate::node_state::Gateway,
        managed: Option<&'a Managed>,
    ) -> lifecycle::Context<'a> {
        lifecycle::Context {
            settings: &self.s.node_lifecycle,
            state_dir: &self.s.agent.state_dir,
            gateway,
            region: &self.id.region,
            service: managed.and_then(|m| m.registration.node_lifecycle_actions.as_ref()),
            facts,
            breaker: (self.s.repair.breaker_share, self.s.repair.breaker_min_nodes),
        }
    }

    /// An error about a settings key, naming the source that set it.
    fn key_error(&self, key: &str, message: String) -> BootstrapError {
        BootstrapError::Settings(SettingsError::Key {
            origin: self.resolved.source_of(key),
            key: key.to_string(),
            message,
        })
    }
}

/// The managed join's first attempt, beside the metadata read when the image's settings
/// already enable it (its own IMDS session); [`register`] uses it only if it asked what the
/// final settings ask.
fn start_early_registration(
    early: &Settings,
) -> Option<tokio::task::JoinHandle<Option<EarlyRegistration>>> {
    // An early settings' auth.type the managed join refuses (check_auth) registers nothing.
    let joins = early.pcs.enabled && early.auth.auth_type == crate::pcs::CLUSTER_AUTH;
    joins.then(|| {
        let (pcs, imds) = (early.pcs.clone(), early.imds.clone());
        tokio::spawn(async move { crate::pcs::register_early(&pcs, &imds).await })
    })
}

/// The instance's identity, tags and user data from IMDS (`imds` of the files and flags),
/// the tags from EC2 with `imds.tags = "describe-tags"` ([`crate::identity::read_instance`]).
async fn read_instance_metadata(
    early: &Settings,
    inputs: &Inputs,
) -> Result<Instance, BootstrapError> {
    let imds = Imds::new(&early.imds);
    let instance = crate::identity::read_instance(&imds, inputs, Enforce::Refuse).await?;
    let id = &instance.facts;
    tracing::info!(
        instance_id = %id.instance_id,
        instance_type = %id.instance_type,
        availability_zone = %id.availability_zone,
        spot = id.spot,
        tags = id.tags.len(),
        tags_available = id.tags_available,
        "instance metadata read"
    );
    Ok(instance)
}

/// The managed join when `pcs.enabled` ([`crate::pcs::register`], taking the early
/// attempt's answer when it asked the same).
async fn register(
    s: &Settings,
    id: &InstanceIdentity,
    early: Option<tokio::task::JoinHandle<Option<EarlyRegistration>>>,
) -> Result<Option<Managed>, BootstrapError> {
    let early_answer = match early {
        Some(task) => task.await.ok().flatten(),
        None => None,
    };
    Ok(match s.pcs.enabled {
        true => Some(crate::pcs::register(&s.pcs, &s.imds, &s.auth, id, early_answer).await?),
        false => None,
    })
}

/// Independent steps run together: the node definition (which may wait for GPU devices),
/// the key (fetch, check, write: [`authkey::install_from`], or the registration's key and
/// record written on a blocking thread in the managed mode) and the connection to systemd.
/// Each step's own duration is reported. Nothing is started before all three succeed.
/// Node-local scratch is put in place beside them (before slurmd starts, so a dynamic
/// node's definition carries its `TmpDisk`); its failure is returned, not raised.
/// Returns the definition, whether the key file changed, the systemd connection and the
/// scratch's outcome.
#[allow(clippy::type_complexity)]
async fn define_node_and_install_key(
    cx: &Steps<'_>,
    opts: &Options,
    prefetch: Option<Prefetch>,
    managed: Option<&Managed>,
    t: &mut Timer,
) -> Result<(NodeDefinition, bool, Systemd, crate::scratch::boot::Result), BootstrapError> {
    let s = cx.s;
    // The registration's key and record are written on a blocking thread beside the
    // other steps (awaited as the key step).
    let persist = managed.map(|m| tokio::task::spawn_blocking(m.persist(&s.agent.state_dir)));
    let node_definition = timed(async {
        crate::nodedef::detect(&s.node, cx.id, &opts.dev_dir)
            .await
            .map_err(|e| match e {
                DefinitionError::Gpu(e) => BootstrapError::Gpu(e),
                DefinitionError::Setting(e) => cx.key_error(e.key(), e.to_string()),
            })
    });
    let key = timed(install_key(cx, prefetch, persist));
    let connect = timed(async { Ok::<_, BootstrapError>(Systemd::connect(&s.systemd.bus).await?) });
    let scratch = timed(async {
        Ok::<_, BootstrapError>(crate::scratch::boot::put_in_place(&s.scratch).await)
    });
    let ((def, def_time), (key_changed, key_time), (systemd, _), (scratch, scratch_time)) =
        tokio::try_join!(node_definition, key, connect, scratch)?;
    let def = match crate::scratch::boot::tmp_disk(&s.scratch, &scratch) {
        Some(mib) => def.with_tmp_disk(mib),
        None => def,
    };
    tracing::info!(node_name = %def.node_name, conf = ?def.dynamic_conf, "node definition");
    t.record("node_definition", def_time);
    t.record("auth_key", key_time);
    t.record("scratch", scratch_time);
    Ok((def, key_changed, systemd, scratch))
}

/// The key step of both roles: the registration's key and record written on a blocking
/// thread (`persist`, the managed mode), else the key fetched (or `prefetch`ed), checked
/// and written ([`authkey::install_from`]). Returns whether the key file changed.
async fn install_key(
    cx: &Steps<'_>,
    prefetch: Option<Prefetch>,
    persist: Option<tokio::task::JoinHandle<Result<bool, crate::pcs::PcsError>>>,
) -> Result<bool, BootstrapError> {
    let prefetched = match prefetch {
        Some(p) => p.take().await,
        None => None,
    };
    if let Some(task) = persist {
        let written = task.await.map_err(BootstrapError::KeyTask)?;
        return Ok(written?);
    }
    Ok(authkey::install_from(&cx.s.auth, &cx.id.region, prefetched).await?)
}

/// What [`prepare_slurmd`] leaves for slurmd's start and the join.
struct SlurmdPrepared {
    /// slurmd was stopped, to start with new options or a new key.
    restart: bool,
    /// `slurmd -V`.
    version: Option<SlurmVersion>,
    /// Whose record slurmctld held for the NodeName before slurmd (re)started.
    holder: RecordHolder,
    /// The time the preparation took (reported with slurmd's start).
    time: Duration,
    /// Which of several installed releases slurmd starts with, and why.
    release: Option<ReleaseChoice>,
}

/// The `scontrol` of the look at slurmctld's record before slurmd starts: on a node without
/// a client configuration yet, through [`slurm_mod::look`]'s slurm.conf when the
/// controllers are given (written to `agent.state_dir`; a failure to write it is logged and
/// the look fetches the configuration, as without it).
fn look_scontrol(s: &Settings) -> slurm_mod::Scontrol {
    let scontrol = slurm_mod::Scontrol::configured(&s.slurm);
    if join::client_has_config(s) {
        return scontrol;
    }
    let target = authkey::KeyTarget::from_settings(&s.auth);
    let sack_key = (s.auth.auth_type == AuthType::Slurm).then_some(target.path.as_path());
    match slurm_mod::look::write(
        &s.agent.state_dir,
        &s.slurm.conf_servers,
        target.plugin,
        sack_key,
    ) {
        Ok(look) => slurm_mod::Scontrol { look, ..scontrol },
        Err(e) => {
            tracing::warn!("{e}; the look at slurmctld fetches its configuration");
            scontrol
        }
    }
}

/// munge, the mounts, slurmd's preparation (options file; stopping an old slurmd) and
/// cloud-init run together; then slurmctld's record is looked at once (through munge)
/// before slurmd (re)starts ([`record::look_before_start`]). slurmd starts later: it needs
/// munge, and must not run without its required mounts.
async fn prepare_slurmd(
    cx: &Steps<'_>,
    def: &NodeDefinition,
    key_changed: bool,
    systemd: &Systemd,
    t: &mut Timer,
) -> Result<SlurmdPrepared, BootstrapError> {
    let (s, id) = (cx.s, cx.id);
    // munge's job is queued before anything else here: munged's own start is the longest
    // step, and the work below (files written and fsynced, programs spawned) runs on this
    // thread, which would otherwise hold back the request that starts it.
    let munge_start = Instant::now();
    let munge_job = match s.auth.auth_type {
        AuthType::Munge if key_changed => Some(systemd.queue_restart(&s.slurm.munge_unit).await?),
        AuthType::Munge => Some(systemd.queue_start(&s.slurm.munge_unit).await?),
        _ => None,
    };
    let running = systemd
        .active_state(&s.slurm.slurmd_unit)
        .await
        .is_ok_and(|state| matches!(state.as_str(), "active" | "activating" | "reloading"));
    // Several Slurm releases in the image (issue 23 §2): the newest is tried first.
    let mut installed = None;
    if !running {
        installed = newest_release(s, systemd).await?.map(|(inst, _)| inst);
    }
    // The look at slurmctld's record that follows munge's start, started now: it loads
    // while munged starts, and asks once munged answers. Not on a configless node that has
    // no configuration yet: that scontrol would fetch it from slurmctld as it starts,
    // through a munged that is not up yet, and wait in munge's connection retries.
    // A node without a configuration yet looks through the agent's few lines (no fetch;
    // `slurm::look`) when the controllers are given.
    let look_scontrol = look_scontrol(s);
    let record_look = (join::client_has_config(s) || look_scontrol.look.is_some())
        .then(|| look_scontrol.spawn_ready().ok())
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
        crate::mounts::ensure_all(&s.mounts, &id.region, &mount_env, systemd)
            .await
            .map_err(BootstrapError::from)
    });
    let slurmd_prep = timed(prepare_options(cx, def, key_changed, systemd));
    // A site's user-data scripts (cloud-init) prepare the node before it takes jobs:
    // waited for here, not by unit ordering (cloud-final is after multi-user.target on
    // Debian and Ubuntu, so `After=` would be a cycle). No cloud-init: nothing to wait for.
    let cloud_init = async {
        crate::cloudinit::CloudInit::default()
            .wait_and_log()
            .await
            .map_err(BootstrapError::CloudInit)
    };
    let ((_, munge_time), (_, mounts_time), (prepared, mut time), _) =
        tokio::try_join!(munge, mounts, slurmd_prep, cloud_init)?;
    if s.auth.auth_type == AuthType::Munge {
        t.record("munge", munge_time);
    }
    t.record("mounts", mounts_time);
    // Whose record slurmctld holds for the NodeName, from the one look before slurmd
    // (re)starts; a slurmd that keeps running registered it already. A slurmd that is not
    // running starts too (a run that stopped before its start, e.g. at a version skew,
    // left its options file in place): looked at the same way.
    let mut holder = RecordHolder::Unknown;
    let mut prepared = prepared;
    let mut release = None;
    if prepared.restart || !running {
        // Only once munge runs: scontrol authenticates through it, and a call made while
        // munged was still starting waited in Slurm's authentication retries.
        let record_start = Instant::now();
        let mut record_look = record_look;
        // A slurmd the preparation stopped (new options or key) chooses its release too, once
        // nothing of it runs.
        if installed.is_none() && prepared.restart {
            if let Some((inst, switched)) = newest_release(s, systemd).await? {
                if switched {
                    // The scontrol started ahead is the earlier release's.
                    record_look = None;
                    let again = prepare_options(cx, def, key_changed, systemd).await?;
                    prepared = slurmd::Prepared {
                        restart: true,
                        version: again.version,
                    };
                }
                installed = Some(inst);
            }
        }
        let mut found = record::look_before_start(
            &look_scontrol,
            &def.node_name,
            def.dynamic_conf.as_deref(),
            record_look,
            &id.instance_id,
        )
        .await;
        if let Some(inst) = &installed {
            let chosen = choose_release(cx, def, key_changed, systemd, inst, found).await?;
            (found, release) = (chosen.found, Some(chosen.choice));
            if let Some(p) = chosen.prepared {
                prepared = slurmd::Prepared {
                    restart: prepared.restart || p.restart,
                    version: p.version,
                };
            }
        }
        if let Some((Refusal::Protocol, evidence)) = found.refusal {
            if let Some(inst) = &installed {
                // Nothing starts: /opt/slurm back at the newest, as the image's tools and the
                // next boot expect to find it.
                slurm_mod::installed::point_at(&inst.link, &inst.releases[0].1)?;
            }
            let others = match &release {
                Some(r) if r.refused.len() > 1 => format!(
                    "; it refused every release installed ({})",
                    r.installed.join(", ")
                ),
                _ => String::new(),
            };
            return Err(version_skew(s, def, prepared.version, evidence, others).await);
        }
        if !found.stale.is_empty() {
            // A dynamic record whose definition differs: deleted through the gateway, so
            // that the registration creates it anew (a failure is logged, bootstrap goes on).
            tracing::info!(
                node = %def.node_name,
                diff = ?found.stale,
                "deleting the stale dynamic node record so that the new definition registers"
            );
            let gateway = cx.gateway(def).through(look_scontrol.clone());
            if let Err(e) = gateway.delete_record().await {
                tracing::warn!("{e}");
            }
        }
        record::wait_for_next_second(found.slurmd_start_time).await;
        time += record_start.elapsed();
        holder = found.holder;
    }
    Ok(SlurmdPrepared {
        restart: prepared.restart,
        version: prepared.version,
        holder,
        time,
        release,
    })
}

/// [`BootstrapError::VersionSkew`] for the controller that refused `evidence` (the first
/// configless server accepting connections, else the settings' words for it).
pub(super) async fn version_skew(
    s: &Settings,
    def: &NodeDefinition,
    node_version: Option<SlurmVersion>,
    evidence: String,
    others: String,
) -> BootstrapError {
    BootstrapError::VersionSkew {
        node_name: def.node_name.clone(),
        controller: slurm_mod::diagnose::controller_accepting(&s.slurm)
            .await
            .unwrap_or_else(|| slurm_mod::diagnose::controller_words(&s.slurm)),
        node_version,
        evidence,
        others,
    }
}

/// With several Slurm releases installed beside `/opt/slurm` and nothing of slurmd's unit
/// running ([`slurmd_busy`]), `/opt/slurm` pointed at the newest: the releases, and whether
/// the link was switched. `None` with one release (systemd is then not asked).
async fn newest_release(
    s: &Settings,
    systemd: &Systemd,
) -> Result<Option<(slurm_mod::installed::Installed, bool)>, BootstrapError> {
    let Some(inst) = slurm_mod::installed::installed(&s.slurm.bin_dir) else {
        return Ok(None);
    };
    if slurmd_busy(s, systemd).await {
        return Ok(None);
    }
    let switched = slurm_mod::installed::point_at(&inst.link, &inst.releases[0].1)?;
    if switched {
        tracing::info!(link = %inst.link.display(), release = %inst.releases[0].0, previous = ?inst.current.map(|v| v.to_string()), "several Slurm releases installed: trying the newest first");
    }
    Ok(Some((inst, switched)))
}

/// Whether anything of slurmd's unit runs (slurmd, or job steps a `KillMode=process` stop
/// left behind), or systemd cannot say: then `/opt/slurm` is not switched to another
/// release, whose programs and plugins those processes would load next.
async fn slurmd_busy(s: &Settings, systemd: &Systemd) -> bool {
    match systemd.unit_processes(&s.slurm.slurmd_unit).await {
        Ok(p) if p.is_empty() => false,
        Ok(p) => {
            tracing::info!(processes = p.len(), unit = %s.slurm.slurmd_unit, "slurmd's unit still has processes: /opt/slurm keeps its release");
            true
        }
        Err(e) => {
            tracing::warn!("{e}: /opt/slurm keeps its release");
            true
        }
    }
}

/// slurmd's options for the release `/opt/slurm` points at now ([`slurmd::prepare`]).
async fn prepare_options(
    cx: &Steps<'_>,
    def: &NodeDefinition,
    key_changed: bool,
    systemd: &Systemd,
) -> Result<slurmd::Prepared, BootstrapError> {
    let (s, id) = (cx.s, cx.id);
    let instance = InstanceArgs {
        instance_id: id.instance_id.clone(),
        instance_type: id.instance_type.clone(),
    };
    let sack_key = (s.auth.auth_type == AuthType::Slurm)
        .then(|| authkey::KeyTarget::from_settings(&s.auth).path);
    slurmd::prepare(
        &s.slurm,
        def,
        &s.node.topology,
        instance,
        sack_key.as_deref(),
        key_changed,
        systemd,
    )
    .await
    .map_err(|e| match e {
        e @ PrepareError::Topology { .. } => cx.key_error("node.topology", e.to_string()),
        PrepareError::Options(e) => BootstrapError::Options(e),
        PrepareError::Systemd(e) => BootstrapError::Systemd(e),
    })
}

/// Which of several installed Slurm releases slurmd starts with, and why (the report's
/// `slurm_release`).
#[derive(Debug, Clone, Serialize)]
pub struct ReleaseChoice {
    /// The release `/opt/slurm` points at for slurmd's start.
    pub chosen: String,
    /// Every whole installation, newest first.
    pub installed: Vec<String>,
    /// The newer releases slurmctld refused, each with scontrol's line that showed it.
    pub refused: Vec<RefusedRelease>,
}

/// A release slurmctld refused ([`ReleaseChoice::refused`]).
#[derive(Debug, Clone, Serialize)]
pub struct RefusedRelease {
    /// The release.
    pub version: String,
    /// scontrol's line that showed the refusal.
    pub scontrol: String,
}

/// What [`choose_release`] settled on.
struct Chosen {
    /// The look made with the chosen release.
    found: record::FoundRecord,
    /// slurmd's options prepared again for it (`None`: the newest's stand).
    prepared: Option<slurmd::Prepared>,
    choice: ReleaseChoice,
}

/// With several releases installed, the newest the controller accepts. `found` is the look
/// made with the newest; while slurmctld refuses the protocol of the one tried
/// ([`crate::slurm::skew::Refusal`]), `/opt/slurm` is pointed at the next older one, slurmd's
/// options are prepared for it and the look is made again with its scontrol (one connection
/// slurmctld refuses per release skipped, and no RPC it serves). When every release is
/// refused for a reason that may be the key (`Protocol authentication error`), the newest
/// stands, as with one release; when each refusal is of the protocol, the oldest's refusal
/// is returned for [`BootstrapError::VersionSkew`].
async fn choose_release(
    cx: &Steps<'_>,
    def: &NodeDefinition,
    key_changed: bool,
    systemd: &Systemd,
    inst: &slurm_mod::installed::Installed,
    mut found: record::FoundRecord,
) -> Result<Chosen, BootstrapError> {
    let s = cx.s;
    let mut prepared = None;
    let mut refused = Vec::new();
    let mut how = Vec::new();
    let mut tried = 0;
    while let Some((refusal, line)) = found.refusal.clone() {
        how.push(refusal);
        refused.push(RefusedRelease {
            version: inst.releases[tried].0.to_string(),
            scontrol: line,
        });
        let Some((next, prefix)) = inst.releases.get(tried + 1) else {
            break;
        };
        tried += 1;
        slurm_mod::installed::point_at(&inst.link, prefix)?;
        tracing::info!(refused = %inst.releases[tried - 1].0, trying = %next, "slurmctld refuses Slurm {}: trying {next}", inst.releases[tried - 1].0);
        prepared = Some(prepare_options(cx, def, key_changed, systemd).await?);
        found = record::look_before_start(
            &look_scontrol(s),
            &def.node_name,
            def.dynamic_conf.as_deref(),
            None,
            &cx.id.instance_id,
        )
        .await;
    }
    // Every release refused, one of them perhaps for its key (`Protocol authentication
    // error`): the newest of those stands (never one whose protocol was refused for
    // certain), and the join names both causes.
    if found.refusal.is_some() {
        if let Some(i) = how.iter().position(|r| *r == Refusal::ProtocolOrKey) {
            if i != tried {
                slurm_mod::installed::point_at(&inst.link, &inst.releases[i].1)?;
                prepared = Some(prepare_options(cx, def, key_changed, systemd).await?);
            }
            let r = refused.remove(i);
            found.refusal = Some((Refusal::ProtocolOrKey, r.scontrol));
            tried = i;
        }
    }
    let chosen = inst.releases[tried].0;
    let choice = ReleaseChoice {
        chosen: chosen.to_string(),
        installed: inst.releases.iter().map(|(v, _)| v.to_string()).collect(),
        refused,
    };
    if !found.answered {
        tracing::warn!(release = %chosen, installed = ?choice.installed, "starting slurmd {chosen} without knowing whether slurmctld accepts it: its look at slurmctld got no answer (the join stops with exit 76 if slurmctld refuses the protocol)");
    } else if found.refusal.is_none() {
        match choice.refused.as_slice() {
            [] => {
                tracing::info!(release = %chosen, installed = ?choice.installed, "starting slurmd {chosen}: the newest installed release, accepted by slurmctld")
            }
            r => {
                tracing::info!(release = %chosen, installed = ?choice.installed, "starting slurmd {chosen}: the newest installed release slurmctld accepts (it refused {})", r.iter().map(|x| format!("{} ({})", x.version, x.scontrol)).collect::<Vec<_>>().join(", "))
            }
        }
    }
    Ok(Chosen {
        found,
        prepared,
        choice,
    })
}

/// What the lifecycle scripts learn of this node (`first_boot` comes from their run record).
fn lifecycle_facts(
    cx: &Steps<'_>,
    def: &NodeDefinition,
    managed: Option<&Managed>,
) -> lifecycle::Facts {
    lifecycle::Facts {
        node_name: def.node_name.clone(),
        instance_id: cx.id.instance_id.clone(),
        first_boot: false,
        conf_servers: cx.s.slurm.conf_servers.clone(),
        pcs: managed.map(|m| lifecycle::PcsFacts::from(&m.registration)),
    }
}

/// One lifecycle stage (issue 13): the service's scripts, then the image's settings'
/// ([`lifecycle::run`]); a `TERMINATE` also goes into the registration record in the managed
/// mode. The stage is reported as a step when it ran scripts.
async fn lifecycle_stage(
    cx: lifecycle::Context<'_>,
    stage: Stage,
    systemd: &Systemd,
    managed: Option<&Managed>,
    t: &mut Timer,
) -> Result<Vec<lifecycle::ScriptResult>, BootstrapError> {
    let result = lifecycle::run(cx, stage, systemd).await;
    if let (Err(lifecycle::LifecycleError::Terminated { reason, .. }), Some(m)) = (&result, managed)
    {
        if let Err(e) = crate::pcs::record_termination(cx.state_dir, &m.registration, reason) {
            tracing::error!("{e}");
        }
    }
    let outcome = result?;
    if !outcome.scripts.is_empty() {
        t.done(match stage {
            Stage::NodeBootstrapped => "node_bootstrapped",
            Stage::NodeReady => "node_ready",
        });
    }
    Ok(outcome.scripts)
}

/// Starts slurmd's unit, not waited for: a Type=notify slurmd (23.11+) finishes its start
/// job only once it has its configuration; the join watches the unit and slurmctld
/// instead. The step's time is `prep_time` (its preparation) and the start.
async fn start_slurmd(
    cx: &Steps<'_>,
    systemd: &Systemd,
    prep_time: Duration,
    t: &mut Timer,
) -> Result<(), BootstrapError> {
    let slurmd_start = Instant::now();
    systemd.start_no_wait(&cx.s.slurm.slurmd_unit).await?;
    t.record("slurmd", prep_time + slurmd_start.elapsed());
    Ok(())
}

/// Takes the bootstrap lock in `state_dir` (created if missing), waiting up to
/// [`LOCK_WAIT`] with a log line.
async fn take_lock(state_dir: &Path) -> Result<crate::fsutil::FileLock, BootstrapError> {
    std::fs::create_dir_all(state_dir).map_err(crate::fsutil::FileError::at(state_dir))?;
    let path = state_dir.join(LOCK_FILE);
    let lock = crate::fsutil::lock_exclusive(&path, LOCK_WAIT, || {
        tracing::info!(
            lock = %path.display(),
            "another bootstrap is running: waiting for it to finish (up to {:?})",
            LOCK_WAIT
        );
    })
    .await
    .map_err(crate::fsutil::FileError::at(&path))?;
    lock.ok_or(BootstrapError::Busy { path })
}
