//! `slurm-node-agent run`: the long-running daemon (systemd `Type=notify`).
//!
//! It polls the IMDS notices ([`crate::events`]) and the desired image
//! ([`crate::upgrade`]), turns them into drain requests, and moves the drain state machine
//! ([`crate::drain`]) forward while a drain is in progress. It reports through sd_notify
//! (`READY=1` once its settings are read, even while instance metadata does not answer yet;
//! `STATUS=` on every change; `WATCHDOG=1` from the main loop itself; `STOPPING=1`), and
//! stops cleanly on SIGTERM or SIGINT: the step in progress is abandoned (a running hook is
//! killed), the state on disk is always consistent, and the next start continues the same
//! drain.
//!
//! The main loop never does the work itself: each piece (a poll, a health pass, a drain
//! step, an upgrade hook) is a child task, at most one per kind, so that a 25 s hook under
//! `WatchdogSec=10s` neither starves the watchdog nor holds up the spot polling.
//!
//! Floor 10 (roof): the `run` loop, beside `bootstrap` (it settles its settings through
//! the one pipeline, `settings::pipeline`, not through bootstrap).

mod capacity;
pub mod metrics;
pub mod notify;
mod orphan;
mod repair;
pub mod schedule;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::task::JoinSet;
use tokio::time::{interval_at, Instant, MissedTickBehavior};

use crate::drain::{Cause, DrainError, Engine, Phase};
use crate::events::{self, Decision, Observations};
use crate::exit::Exit;
use crate::identity::Instance;
use crate::imds::{Imds, ImdsError, InstanceIdentity, InstanceMetadata};
use crate::retry::Backoff;
use crate::rollout::{self, check::Check, Budget};
use crate::settings::pipeline::Inputs;
use crate::settings::{self, Layer, Settings, SettingsError};
use notify::Notifier;
use schedule::{ArmPoll, Job, Schedule};

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Settings invalid (exit 78).
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// The node's identity could not be resolved (exit 78 or 69).
    #[error(transparent)]
    Identity(#[from] crate::identity::IdentityError),
    /// Signals could not be set up (exit 71).
    #[error("signal handler: {0}")]
    Signal(std::io::Error),
    /// The work runtime's threads or the tick's timerfd could not be made (exit 71).
    #[error("starting the daemon's work threads or tick: {0}")]
    Runtime(std::io::Error),
    /// The state could not be read (exit 74).
    #[error(transparent)]
    Drain(#[from] DrainError),
}

impl DaemonError {
    /// The exit code.
    pub fn exit(&self) -> Exit {
        match self {
            DaemonError::Settings(_) => Exit::Config,
            DaemonError::Identity(e) => e.exit(),
            DaemonError::Signal(_) | DaemonError::Runtime(_) => Exit::OsErr,
            DaemonError::Drain(e) => e.exit(),
        }
    }
}

/// Inputs of the daemon.
#[derive(Debug, Clone)]
pub struct Options {
    /// Settings files.
    pub paths: settings::Paths,
    /// Command-line layers.
    pub flag_layers: Vec<Layer>,
}

/// Logs IMDS failures once per outage (then at debug level), and the recovery.
#[derive(Debug, Default)]
struct Outage {
    failing: bool,
    count: u64,
}

impl Outage {
    fn fail(&mut self, e: &ImdsError) {
        self.count += 1;
        if self.failing {
            tracing::debug!("{e}");
        } else {
            tracing::warn!("{e}; keeping the last observation until it answers again");
            self.failing = true;
        }
    }
    fn ok(&mut self, path: &str) {
        if self.failing {
            tracing::info!(path, "instance metadata answers again");
            self.failing = false;
        }
    }
}

struct Term {
    term: Signal,
    int: Signal,
}

impl Term {
    async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

/// Waits for the instance identity ([`crate::identity::read_instance`]: IMDS, and EC2's
/// `DescribeTags` with `imds.tags = "describe-tags"`), retrying with capped backoff for as
/// long as it takes (a child task of the daemon: the main loop keeps answering the
/// watchdog and signals meanwhile), and says so in `STATUS=`. Invalid settings are no
/// reason to wait: they are returned.
async fn wait_identity(
    imds: Arc<Imds>,
    inputs: Inputs,
    notifier: Arc<Notifier>,
) -> Result<Instance, SettingsError> {
    let mut attempt = 0;
    loop {
        let read = crate::identity::read_instance(&imds, &inputs, settings::Enforce::WarnAndIgnore);
        match read.await {
            Ok(i) => return Ok(i),
            Err(crate::identity::InstanceError::Settings(e)) => return Err(e),
            Err(e) => {
                let wait = Backoff {
                    base: Duration::from_secs(1),
                    cap: Duration::from_secs(30),
                }
                .delay(attempt);
                attempt += 1;
                tracing::warn!("{e}; retrying in {wait:?}");
                notifier.status(&format!(
                    "running; waiting for instance metadata (attempt {attempt}): {e}"
                ));
                tokio::time::sleep(wait).await;
            }
        }
    }
}

fn status_line(phase: Phase, cause: Option<&Cause>, reason: Option<&str>, upgrade: &str) -> String {
    let mut s = phase.as_str().to_string();
    if let Some(c) = cause {
        s.push_str(&format!(" ({})", c.kind()));
    }
    if let Some(r) = reason {
        s.push_str(&format!(": {r}"));
    }
    if !upgrade.is_empty() {
        s.push_str(&format!("; upgrade: {upgrade}"));
    }
    s
}

/// What the main loop hands to its child tasks.
struct Ctx {
    s: Settings,
    node: String,
    id: InstanceIdentity,
    engine: Engine,
    /// This node's place in the rollout's budget (its slot's renewals).
    budget: Budget,
    /// The notices' and events' polls ([`Imds`] in the program).
    imds: Arc<dyn InstanceMetadata>,
    aws: Option<(aws_sdk_ssm::Client, aws_sdk_ec2::Client)>,
    /// EC2 for the Capacity Block watch (`events.capacity_block`; [`capacity`]).
    capacity_ec2: Option<aws_sdk_ec2::Client>,
    /// What the Capacity Block lookups found.
    capacity: std::sync::Mutex<capacity::CapacityLook>,
    mount_env: crate::mounts::MountEnv,
    /// The gateway of the mounts' drains (through the configless `scontrol`, as bootstrap
    /// and the health checks reach slurmctld).
    gateway: crate::node_state::Gateway,
    /// The same with `[health]`'s limits, for the health checks' drains.
    health_gateway: crate::node_state::Gateway,
    health_env: crate::health::RunEnv,
    health_act: crate::health::act::ActOptions,
    outage: std::sync::Mutex<Outage>,
    /// Whether a health pass has looked at slurmctld since the daemon started (see
    /// [`wait_for_slurm_config`]: only the first pass waits).
    health_looked: std::sync::atomic::AtomicBool,
    /// `repair.json` as the repair last left it, and when the file was written (`None`: not
    /// read yet): read again only when someone else wrote it, saved at each change
    /// ([`repair::repair_pass`]).
    repair_record: std::sync::Mutex<Option<repair::Cached>>,
    /// Whether a repair pass has looked for the budget slots to release once the node is
    /// in service since the daemon started (`repair.mode = "on"`).
    repair_looked: std::sync::atomic::AtomicBool,
    /// Whether a repair pass has released a previous instance's repair slot under this
    /// NodeName since the daemon started (`repair.mode = "on"`).
    repair_predecessors_looked: std::sync::atomic::AtomicBool,
    /// Unix seconds when `autoscaling/target-lifecycle-state` was first seen `Terminated`
    /// (or when this instance's lifecycle drain began, after a restart); 0: not seen.
    terminated_at: std::sync::atomic::AtomicI64,
    /// The termination lifecycle hooks ([`events::hook`]) and their Auto Scaling client
    /// (built at the first pass that needs it).
    hooks: tokio::sync::Mutex<Hooks>,
    /// The orphan watch (`[orphan]`), when it is on for this node.
    orphan: Option<std::sync::Mutex<orphan::OrphanWatch>>,
    /// Distinct notices seen since the start (`agent.prom`).
    notices: std::sync::Mutex<metrics::Notices>,
}

/// The termination lifecycle hooks' tracker and client.
struct Hooks {
    tracker: events::hook::Tracker,
    client: Option<aws_sdk_autoscaling::Client>,
}

impl Hooks {
    fn new(s: &Settings) -> Hooks {
        Hooks {
            tracker: events::hook::Tracker::new(
                s.events.hook_policy(),
                s.events.lifecycle_hooks.clone(),
            ),
            client: None,
        }
    }
}

/// What `STATUS=` last said, and the phase it was for.
struct Shown {
    phase: Phase,
    status: String,
}

impl Shown {
    /// Sends `STATUS=` when `st` (with the upgrade watch's words) reads differently from
    /// the last one; returns whether the phase changed.
    fn observe(
        &mut self,
        st: &crate::drain::DrainState,
        upgrade: &str,
        notifier: &Notifier,
    ) -> bool {
        let line = status_line(st.phase, st.cause.as_ref(), st.reason.as_deref(), upgrade);
        if line != self.status {
            notifier.status(&line);
            self.status = line;
        }
        let changed = st.phase != self.phase;
        self.phase = st.phase;
        changed
    }
}

/// What a child task did.
struct Outcome {
    result: Result<(), DrainError>,
    upgrade: Option<Check>,
    /// The desired-image check's read of the cluster's size bound (on the work runtime: a
    /// slurm.conf on a network file system must not hold up the main loop).
    bound: Option<crate::slurm::NodeBound>,
    /// Whether it may have changed the drain state (false: a metadata poll that decided
    /// nothing, which the main loop need not read the state again for).
    acted: bool,
}

/// Runs until SIGTERM/SIGINT.
///
/// The main loop only waits: for a signal, the watchdog tick, a timer, or a child task to
/// finish. Everything that can take long (IMDS, slurmctld, SSM and EC2, health checks,
/// mounts, the upgrade action or hook) runs as a child task, at most one of each kind at a
/// time, so the loop never blocks and `WATCHDOG=1` (sent by the loop itself, only while it
/// runs) means the daemon is alive. `READY=1` is sent once the settings are read, before
/// instance metadata answers: the identity is awaited the same way, and `STATUS=` says so.
///
/// # Errors
/// [`DaemonError`] when it cannot start; once running, failures are logged and retried.
pub async fn run(opts: &Options) -> Result<(), DaemonError> {
    let notifier = Arc::new(Notifier::from_env());
    let mut term = Term {
        term: signal(SignalKind::terminate()).map_err(DaemonError::Signal)?,
        int: signal(SignalKind::interrupt()).map_err(DaemonError::Signal)?,
    };
    // The one settings pipeline (settings::pipeline): the files and flags now, the
    // instance's metadata once it is read (the user data parsed once).
    let inputs = Inputs::read(&opts.paths, &opts.flag_layers)?;
    let early = inputs.resolve(settings::Enforce::Refuse)?;
    let work_rt = WorkRuntime::new().map_err(DaemonError::Runtime)?;
    let watchdog = notify::watchdog_interval();
    let mut watchdog_tick = interval_at(
        Instant::now(),
        watchdog.unwrap_or(Duration::from_secs(3600)),
    );
    watchdog_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    notifier.ready("running; waiting for instance metadata");

    let Some(instance) = wait_for_instance(
        &early.settings,
        &inputs,
        &notifier,
        &mut term,
        watchdog,
        &mut watchdog_tick,
    )
    .await?
    else {
        return Ok(());
    };
    // The one identity rule (crate::identity): bootstrap's record when it is this
    // incarnation's, else the NodeName resolved over the metadata just read, like bootstrap.
    let req = crate::identity::Request {
        inputs: &inputs,
        lookup: crate::identity::Lookup::RecordThenImds,
        instance: Some(&instance),
        imds_timeout: Duration::from_secs(10),
        corrupt_record: crate::identity::CorruptRecord::SetAside,
    };
    let (resolved, ident) = crate::identity::resolve(&req).await?;
    let id = instance.facts;
    let s = resolved.settings;
    let node = ident.node_name.clone();
    if s.node.role == crate::nodedef::Role::Login {
        login_loop(
            &s,
            &node,
            &notifier,
            &mut term,
            (watchdog, watchdog_tick),
            work_rt.handle(),
        )
        .await;
        return Ok(());
    }
    let (ctx, shown) = start_context(s, node, &ident, id, &notifier).await?;
    main_loop(&ctx, shown, &notifier, &mut term, watchdog, &work_rt).await
}

/// The daemon's context once the node is known: the drain engine (a drain in progress is
/// continued only when it is this instance's), the AWS clients of the upgrade check, the
/// gateways, the health checks' environment; `STATUS=` says where the drain stands.
async fn start_context(
    s: Settings,
    node: String,
    ident: &crate::identity::NodeIdentity,
    id: InstanceIdentity,
    notifier: &Notifier,
) -> Result<(Arc<Ctx>, Shown), DaemonError> {
    let engine = s.drain_engine(&node).with_instance(&ident.instance_id);
    let imds = Arc::new(Imds::new(&s.imds));
    let watch_block = s.events.enabled && s.events.capacity_block;
    let sdk = if s.upgrade.parameter.is_empty() && !watch_block {
        None
    } else {
        let region = aws_region(&id);
        Some(
            aws_config::defaults(aws_config::BehaviorVersion::latest())
                .region(aws_config::Region::new(region))
                .load()
                .await,
        )
    };
    let aws = sdk
        .as_ref()
        .filter(|_| !s.upgrade.parameter.is_empty())
        .map(|sdk| (aws_sdk_ssm::Client::new(sdk), aws_sdk_ec2::Client::new(sdk)));
    let capacity_ec2 = sdk
        .as_ref()
        .filter(|_| watch_block)
        .map(aws_sdk_ec2::Client::new);

    // A drain in progress is continued only when it is this instance's (drain.json's
    // writer against slurmctld's record: a state folder from a predecessor is set aside).
    let st = engine.load_at_start().await?;
    engine.write_metrics();
    if st.phase != Phase::Active {
        tracing::info!(
            phase = st.phase.as_str(),
            cause = st.cause.as_ref().map(Cause::kind),
            "continuing the drain in progress"
        );
    }
    tracing::info!(
        node = %node,
        instance_id = %id.instance_id,
        ami_id = %id.ami_id,
        spot_interval = %s.events.spot_interval,
        interval = %s.events.interval,
        upgrade_parameter = %s.upgrade.parameter,
        "agent running"
    );
    let shown = Shown {
        phase: st.phase,
        status: status_line(st.phase, st.cause.as_ref(), st.reason.as_deref(), ""),
    };
    notifier.status(&shown.status);

    // Shared file systems: remount what went away, drain while a required one is missing,
    // lift only that drain when it is back (mounts::reconcile), every MOUNTS_INTERVAL when
    // there are `[[mounts]]`.
    // Health checks on the daemon's own schedule (`health.interval`), the same checks and
    // drain/resume rules as `slurm-node-agent check`. The files are read again at each
    // pass, as Slurm's HealthCheckProgram reads them at each run: an edited or fixed check
    // file counts from the next pass for both, so they never judge by different checks.
    let mut health_env = crate::health::RunEnv::new(&s.health, &s.systemd.bus);
    health_env.node = Some(node.clone());
    // The EFA check's last counter reading is kept in the agent's state folder.
    health_env.host.state_dir = s.agent.state_dir.clone();
    repair::warn_unknown_repair_checks(&s, &node);
    if s.orphan
        .yields_to_join_deadline(s.node.dynamic, s.slurm.join_deadline)
    {
        tracing::warn!(
            "orphan watch off: orphan.after = {} (its default) is not longer than slurm.join_deadline = {}, \
             and a node still joining would power off; set orphan.after longer than both it and the \
             controller's SlurmctldTimeout to power off orphaned nodes, or orphan.mode = \"off\" to say so",
            s.orphan.after,
            s.slurm.join_deadline
        );
    }
    let orphan = s
        .orphan
        .active(s.node.dynamic, s.slurm.join_deadline)
        .then(|| {
            std::sync::Mutex::new(orphan::OrphanWatch::new(
                &s.orphan,
                std::time::Instant::now(),
                &s.agent.state_dir,
            ))
        });
    if orphan.is_none() {
        tracing::info!(
            mode = s.orphan.mode.as_str(),
            dynamic = s.node.dynamic,
            "orphan watch off (orphan.mode; auto is on for dynamic nodes only)"
        );
    }
    let ctx = Arc::new(Ctx {
        budget: Budget::new(),
        mount_env: crate::mounts::MountEnv::for_bus(&s.systemd.bus),
        gateway: s.node_gateway(&node).with_instance(&ident.instance_id),
        health_gateway: crate::health::act::health_gateway(
            s.node_gateway(&node).with_instance(&ident.instance_id),
            &s.health,
        ),
        health_act: crate::health::act::ActOptions::new(&s.agent.state_dir),
        health_env,
        aws,
        capacity_ec2,
        capacity: std::sync::Mutex::default(),
        imds,
        engine,
        id,
        node,
        outage: std::sync::Mutex::new(Outage::default()),
        health_looked: std::sync::atomic::AtomicBool::new(false),
        repair_record: std::sync::Mutex::new(None),
        repair_looked: std::sync::atomic::AtomicBool::new(false),
        repair_predecessors_looked: std::sync::atomic::AtomicBool::new(false),
        terminated_at: std::sync::atomic::AtomicI64::new(0),
        hooks: tokio::sync::Mutex::new(Hooks::new(&s)),
        orphan,
        notices: std::sync::Mutex::new(metrics::Notices::default()),
        s,
    });
    if let (Some(Cause::Lifecycle { seen, .. }), false) = (&st.cause, st.phase == Phase::Active) {
        // A lifecycle drain continued after a restart: its hooks are still to complete,
        // on the clock of the first sighting of `Terminated` (not of an earlier drain that
        // the lifecycle drain replaced).
        let at = Some(*seen)
            .filter(|t| *t > 0)
            .unwrap_or(st.started.unwrap_or(st.since));
        ctx.terminated_at
            .store(at, std::sync::atomic::Ordering::Relaxed);
    }
    Ok((ctx, shown))
}

/// The main loop: the periodic jobs on one tick, each run as a child task (at most one of
/// each kind at once), until a stop signal.
async fn main_loop(
    ctx: &Arc<Ctx>,
    mut shown: Shown,
    notifier: &Notifier,
    term: &mut Term,
    watchdog: Option<Duration>,
    work_rt: &WorkRuntime,
) -> Result<(), DaemonError> {
    let mut upgrade_status = String::new();
    let s = &ctx.s;
    let start = Instant::now();
    let slurm_release = crate::slurm::skew::Releases::look_local(&s.slurm)
        .await
        .node
        .map(|v| v.to_string())
        .unwrap_or_default();
    let mut agent_metrics = metrics::AgentMetrics::new(s, slurm_release);
    agent_metrics.write(&lock_notices(ctx));
    let mut upgrade_poll = schedule::UpgradePoll::new(&s.upgrade);
    upgrade_poll.set_bound(crate::slurm::local_node_bound(&s.slurm));
    let mut schedule = daemon_schedule(
        s,
        watchdog,
        ctx.aws.is_some().then(|| upgrade_poll.interval()),
        start,
    );
    if ctx.aws.is_some() {
        // During a rollout (a slot of the budget held) the first check comes at once: this
        // may be a replacement whose check in service ends its predecessor's slot. Else
        // at a drawn part of the interval, so that a fleet booted at once spreads out.
        // (Bounded: the loop, and the watchdog's pings, start after it.)
        let rollout = tokio::time::timeout(
            Duration::from_secs(5),
            crate::rollout::slot::any_held(&ctx.engine.ops.scontrol),
        )
        .await
        .is_ok_and(|held| held.unwrap_or(false));
        if rollout {
            upgrade_poll.first_done();
            schedule.arm(Job::Upgrade, start);
        } else {
            upgrade_poll.arm_first(&mut schedule, start);
        }
        tracing::info!(
            schedule = %schedule.describe().join("; "),
            upgrade_poll = %upgrade_poll.describe(),
            "periodic jobs"
        );
    } else {
        tracing::info!(schedule = %schedule.describe().join("; "), "periodic jobs");
    }
    let mut ticker = schedule::Ticker::new(schedule.tick()).map_err(DaemonError::Runtime)?;
    let mut tasks: JoinSet<Outcome> = JoinSet::new();
    let mut running: HashMap<tokio::task::Id, Work> = HashMap::new();
    let busy =
        |running: &HashMap<tokio::task::Id, Work>, w: Work| running.values().any(|r| *r == w);

    loop {
        let due = tokio::select! {
            _ = term.recv() => break,
            Some(joined) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                let (task, outcome) = match joined {
                    Ok((task, o)) => (task, Some(o)),
                    Err(e) => {
                        tracing::error!("a daemon task failed: {e}");
                        (e.id(), None)
                    }
                };
                let work = running.remove(&task);
                // An idle poll (once a second) changed nothing: no state to read again.
                let acted = outcome.as_ref().is_none_or(|o| o.acted);
                if work == Some(Work::Upgrade) {
                    // The cluster may have grown (or slurmd fetched its configuration); a
                    // slurm.conf unreadable for a moment (slurmd rewriting its cache) keeps
                    // the last bound.
                    let bound = outcome.as_ref().and_then(|o| o.bound.clone());
                    if bound.is_some() && upgrade_poll.set_bound(bound) {
                        tracing::info!(upgrade_poll = %upgrade_poll.describe(), "upgrade poll resized");
                    }
                    match outcome.as_ref().and_then(|o| o.upgrade.as_ref()) {
                        Some(c) if c.wants_retry_soon() => schedule.arm(
                            Job::Upgrade,
                            Instant::now() + upgrade_poll.retry_wait(s.upgrade.budget_wait.0),
                        ),
                        Some(c) if c.wants_check_soon() => schedule.arm(
                            Job::Upgrade,
                            Instant::now() + s.drain.check_interval.0,
                        ),
                        _ => upgrade_poll.checked(&mut schedule, Instant::now()),
                    }
                }
                if let Some(o) = outcome {
                    if let Some(c) = &o.upgrade {
                        upgrade_status = describe(c);
                        agent_metrics.upgrade(c, crate::time::now());
                        let desired = match c {
                            Check::UpToDate { image, .. } => Some(image.clone()),
                            Check::Started { desired, .. } | Check::Stuck { desired, .. } => {
                                Some(desired.clone())
                            }
                            _ => None,
                        };
                        crate::upgrade::ImageCheck {
                            at_unix: crate::time::now(),
                            running: ctx.id.ami_id.clone(),
                            desired,
                            verdict: upgrade_status.clone(),
                        }
                        .save(&s.agent.state_dir);
                    }
                    agent_metrics.write(&lock_notices(ctx));
                    if let Err(e) = o.result {
                        tracing::warn!("{e}");
                    }
                }
                if let Some(st) = acted.then(|| ctx.engine.load().ok()).flatten() {
                    // A new drain: look at the node again at the next tick rather than a
                    // full interval later.
                    if shown.observe(&st, &upgrade_status, notifier) {
                        schedule.arm(Job::Progress, Instant::now());
                    }
                }
                continue;
            }
            now = ticker.tick() => match now {
                Ok(now) => schedule.due(now),
                Err(e) => {
                    tracing::error!("the daemon's tick failed: {e}; stopping");
                    break;
                }
            },
        };
        for job in due {
            let work = match job {
                Job::Watchdog => {
                    notifier.watchdog();
                    continue;
                }
                // The drain state is a small file: read here (an operator's `drain` and
                // `resume` write it too: `STATUS=` follows), and a child task only when a
                // drain is in progress.
                Job::Progress => match ctx.engine.load() {
                    Ok(st) => {
                        shown.observe(&st, &upgrade_status, notifier);
                        if st.phase == Phase::Active && !hooks_pending(ctx) {
                            continue;
                        }
                        Work::Progress
                    }
                    Err(_) => Work::Progress,
                },
                Job::Spot => Work::Spot,
                Job::Notices => Work::Notices,
                Job::Maintenance => Work::Maintenance,
                Job::CapacityBlock => Work::CapacityBlock,
                Job::Health => Work::Health,
                Job::Mounts => Work::Mounts,
                Job::Orphan => Work::Orphan,
                Job::Upgrade => {
                    // The first check waits for the interval of the bound read now (once
                    // on this thread; later ones are read by the check).
                    let bound = upgrade_poll
                        .first_pending()
                        .then(|| crate::slurm::local_node_bound(&s.slurm))
                        .flatten();
                    if bound.is_some() && upgrade_poll.set_bound(bound) {
                        tracing::info!(upgrade_poll = %upgrade_poll.describe(), "upgrade poll resized");
                    }
                    // Armed again when the check ends.
                    if !upgrade_poll.due(&mut schedule, start, Instant::now()) {
                        continue;
                    }
                    // Waiting for a slot, the tries read the slots alone; a full check
                    // (the desired image again) at least once per poll interval.
                    ctx.budget.expire_waiting(upgrade_poll.interval());
                    Work::Upgrade
                }
            };
            if busy(&running, work) {
                continue;
            }
            // The metadata polls are non-blocking I/O on this (the main) thread; every
            // other piece of work runs on the work runtime's threads (see `WorkRuntime`).
            let handle = if work.polls_metadata() {
                tasks.spawn(do_work(ctx.clone(), work, work_rt.handle().clone()))
            } else {
                tasks.spawn_on(
                    do_work(ctx.clone(), work, work_rt.handle().clone()),
                    work_rt.handle(),
                )
            };
            running.insert(handle.id(), work);
        }
    }
    tracing::info!("stop signal received; stopping");
    notifier.stopping();
    // The step in progress is abandoned (a running hook is killed with its task); the
    // state on disk is consistent and the next start continues the same drain.
    tasks.shutdown().await;
    ctx.engine.write_metrics();
    Ok(())
}

/// Waits for the instance ([`wait_identity`], a child task) while answering the watchdog;
/// `None` when a stop signal came first (stopping was announced).
async fn wait_for_instance(
    early: &Settings,
    inputs: &Inputs,
    notifier: &Arc<Notifier>,
    term: &mut Term,
    watchdog: Option<Duration>,
    watchdog_tick: &mut tokio::time::Interval,
) -> Result<Option<Instance>, DaemonError> {
    let early_imds = Arc::new(Imds::new(&early.imds));
    let mut identity = tokio::spawn(wait_identity(early_imds, inputs.clone(), notifier.clone()));
    loop {
        tokio::select! {
            _ = term.recv() => {
                identity.abort();
                notifier.stopping();
                return Ok(None);
            }
            _ = watchdog_tick.tick(), if watchdog.is_some() => notifier.watchdog(),
            r = &mut identity => match r {
                Ok(Ok(i)) => return Ok(Some(i)),
                Ok(Err(e)) => {
                    notifier.stopping();
                    return Err(e.into());
                }
                Err(e) => {
                    // The task cannot fail but by a panic; there is nothing to go on.
                    tracing::error!("waiting for instance metadata: {e}");
                    notifier.stopping();
                    return Ok(None);
                }
            },
        }
    }
}

/// The daemon of a login node (`node.role = "login"`): the health checks on their
/// schedule (`health.interval`), reported (log, `STATUS=`, the Prometheus textfile) and
/// never acted on (a login node is not in slurmctld: nothing to drain), and the watchdog.
/// No notices, no upgrade watch, no drains: a login node is replaced, not drained.
async fn login_loop(
    s: &Settings,
    node: &str,
    notifier: &Notifier,
    term: &mut Term,
    (watchdog, mut watchdog_tick): (Option<Duration>, tokio::time::Interval),
    work_rt: &tokio::runtime::Handle,
) {
    tracing::info!(login_node = %node, health_interval = %s.health.interval, "agent running on a login node: health checks reported, never acted on");
    notifier.status("login node: sackd; health checks not run yet");
    let mut health_tick = interval_at(Instant::now(), s.health.interval.0);
    health_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut env = crate::health::RunEnv::new(&s.health, &s.systemd.bus);
    env.host.state_dir = s.agent.state_dir.clone();
    let mut pass: Option<tokio::task::JoinHandle<String>> = None;
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = watchdog_tick.tick(), if watchdog.is_some() => notifier.watchdog(),
            r = async { pass.as_mut().expect("guarded").await }, if pass.is_some() => {
                pass = None;
                match r {
                    Ok(line) => notifier.status(&line),
                    Err(e) => tracing::error!("a health pass failed: {e}"),
                }
            }
            _ = health_tick.tick(), if pass.is_none() => {
                let (s, env, node) = (s.clone(), env.clone(), node.to_string());
                pass = Some(work_rt.spawn(async move { login_health_pass(&s, &env, &node).await }));
            }
        }
    }
    if let Some(p) = pass {
        p.abort();
    }
    tracing::info!("stop signal received; stopping");
    notifier.stopping();
}

/// One health pass of a login node: the checks run and reported, nothing acted on. Returns
/// the `STATUS=` line.
async fn login_health_pass(s: &Settings, env: &crate::health::RunEnv, node: &str) -> String {
    let target = s.health_target(Some(node.to_string()));
    let checks = match crate::health::load(&s.health, &s.slurm.bin_dir, &target) {
        Ok(set) => set,
        Err(e) => {
            tracing::error!("health checks not run this pass: {e}");
            return format!("login node: sackd; health checks not run: {e}");
        }
    };
    let report = crate::health::run_checks(&checks, env).await;
    crate::health::LastPass::of(&report, None).save(&s.agent.state_dir);
    if !s.health.prometheus_textfile.as_os_str().is_empty() {
        if let Err(e) =
            crate::health::output::write_prometheus(&report, &s.health.prometheus_textfile)
        {
            tracing::warn!("{e}");
        }
    }
    tracing::info!(
        healthy = report.healthy(),
        action = "none",
        detail = "login node: reported only",
        "health checks"
    );
    if report.healthy() {
        "login node: sackd; health checks pass".into()
    } else {
        "login node: sackd; health checks FAIL (see the log)".into()
    }
}

/// Waits until the agent's Slurm commands find a configuration on the node
/// ([`crate::slurm::has_client_config`]), looking every 200 ms, at most `limit`. Returns
/// whether they do. For the daemon's first health pass only: the candidate paths of
/// [`crate::slurm::client_config`] are the usual ones, not necessarily this build's.
async fn wait_for_slurm_config(slurm: &crate::slurm::SlurmSettings, limit: Duration) -> bool {
    let start = std::time::Instant::now();
    loop {
        if crate::slurm::has_client_config(slurm) {
            return true;
        }
        if start.elapsed() >= limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One health pass of the daemon: the checks, the Prometheus textfile, and the action
/// (drain or lift) through the health gateway once slurmd has its configuration.
async fn health_pass(ctx: &Ctx) {
    let s = &ctx.s;
    // The daemon starts beside bootstrap: until slurmd has fetched the
    // configuration, this boot's slurmd has not registered, and a look at
    // slurmctld would first fetch the whole configuration (per node, on a fleet
    // booting at once). So the first pass waits for it, one interval at most;
    // later passes look whatever the files say (a local slurm.conf at a path
    // the agent does not know of must not switch the health actions off). The
    // checks run after that wait: run before it, they would judge a node that
    // bootstrap has not brought up yet (slurmd, munged, the key, scratch: the
    // image's default checks), and the drain would land on the node as it joins.
    let first = !ctx.health_looked.load(std::sync::atomic::Ordering::Relaxed);
    let configured =
        s.health.act && (!first || wait_for_slurm_config(&s.slurm, s.health.interval.0).await);
    if s.health.act {
        ctx.health_looked
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
    let target = s.health_target(Some(ctx.node.clone()));
    let checks = match crate::health::load(&s.health, &s.slurm.bin_dir, &target) {
        Ok(set) => Some(set),
        Err(e) => {
            tracing::error!("health checks not run this pass: {e}");
            None
        }
    };
    if let Some(checks) = &checks {
        let report = crate::health::run_checks(checks, &ctx.health_env).await;
        if !s.health.prometheus_textfile.as_os_str().is_empty() {
            if let Err(e) =
                crate::health::output::write_prometheus(&report, &s.health.prometheus_textfile)
            {
                tracing::warn!("{e}");
            }
        }
        let mut acted = None;
        if s.health.act && !configured {
            acted = Some("none: slurmd has no configuration yet".to_string());
            tracing::info!(
                healthy = report.healthy(),
                action = "none",
                detail = "slurmd has no configuration yet (not registered): slurmctld not asked",
                "health checks"
            );
        } else if s.health.act {
            let outcome =
                crate::health::act_on(&report, &ctx.health_gateway, &ctx.health_act).await;
            acted = Some(outcome.action.to_string());
            tracing::info!(
                healthy = report.healthy(),
                action = %outcome.action,
                detail = %outcome.detail,
                "health checks"
            );
        }
        crate::health::LastPass::of(&report, acted).save(&s.agent.state_dir);
        // After the health actions: this node's drain, and its peers' of the same pass
        // before it, are in slurmctld's records the breaker counts.
        repair::repair_pass(ctx, &report).await;
    }
}

/// One pass over the `[[mounts]]` ([`crate::mounts::reconcile`]).
async fn mounts_pass(ctx: &Ctx) {
    let s = &ctx.s;
    // Connected only when a mount must be made again; closed after the pass.
    let systemd = crate::systemd::OnDemand::new(&s.systemd.bus);
    let pass = crate::mounts::reconcile(
        &s.mounts,
        &ctx.id.region,
        &ctx.mount_env,
        &systemd,
        &ctx.gateway,
    );
    match pass.await {
        Ok(report) => tracing::debug!(?report, "mounts checked"),
        Err(e) => tracing::warn!("mounts: {e}"),
    }
}

/// One piece of work, run as a child task of the main loop: the metadata polls on the
/// main thread, the rest on `work` (the work runtime). A poll's decisions are applied on
/// `work` too (taking the state lock may block a thread).
async fn do_work(ctx: Arc<Ctx>, work: Work, work_rt: tokio::runtime::Handle) -> Outcome {
    let s = &ctx.s;
    let engine = &ctx.engine;
    let mut upgrade = None;
    let mut bound = None;
    let current = engine.load().ok();
    let cur = current.as_ref().and_then(|c| c.cause.as_ref());
    let result = match work {
        Work::Spot => match events::poll_spot(&*ctx.imds).await {
            Ok(o) => {
                lock_outage(&ctx).ok(events::notice::SPOT_PATH);
                let obs = Observations {
                    spot: Some(o),
                    ..Default::default()
                };
                return decide_and_apply(&ctx, &work_rt, &obs, cur).await;
            }
            Err(e) => {
                lock_outage(&ctx).fail(&e);
                Ok(())
            }
        },
        Work::Notices => {
            let (rb, lc) = tokio::join!(
                events::poll_rebalance(&*ctx.imds),
                events::poll_lifecycle(&*ctx.imds)
            );
            let obs = {
                let mut outage = lock_outage(&ctx);
                Observations {
                    rebalance: keep(&mut outage, rb, events::notice::REBALANCE_PATH),
                    lifecycle: keep(&mut outage, lc, events::notice::LIFECYCLE_PATH),
                    capacity_block: capacity::cached(&ctx),
                    ..Default::default()
                }
            };
            let out = decide_and_apply(&ctx, &work_rt, &obs, cur).await;
            if let Some(events::Observed::Present(state)) = &obs.lifecycle {
                if s.events.lifecycle && events::notice::lifecycle_is_terminating(state) {
                    // The first sighting counts (compare_exchange from 0).
                    let _ = ctx.terminated_at.compare_exchange(
                        0,
                        crate::time::now(),
                        std::sync::atomic::Ordering::Relaxed,
                        std::sync::atomic::Ordering::Relaxed,
                    );
                }
            }
            return out;
        }
        Work::Maintenance => {
            let (mt, mh) = tokio::join!(
                events::poll_maintenance(&*ctx.imds),
                events::poll_maintenance_history(&*ctx.imds)
            );
            let obs = {
                let mut outage = lock_outage(&ctx);
                Observations {
                    maintenance: keep(&mut outage, mt, events::notice::MAINTENANCE_PATH),
                    maintenance_history: keep(
                        &mut outage,
                        mh,
                        events::notice::MAINTENANCE_HISTORY_PATH,
                    ),
                    ..Default::default()
                }
            };
            return decide_and_apply(&ctx, &work_rt, &obs, cur).await;
        }
        Work::CapacityBlock => {
            let obs = Observations {
                capacity_block: capacity::look(&ctx).await,
                ..Default::default()
            };
            return decide_and_apply(&ctx, &work_rt, &obs, cur).await;
        }
        Work::Upgrade => match &ctx.aws {
            None => Ok(()),
            Some((ssm, ec2)) => {
                bound = crate::slurm::local_node_bound(&s.slurm);
                rollout::check::check(
                    engine,
                    &ctx.budget,
                    ssm,
                    ec2,
                    &ctx.id.ami_id,
                    ctx.id.launched_at,
                )
                .await
                .map(|c| upgrade = Some(c))
            }
        },
        Work::Health => {
            health_pass(&ctx).await;
            Ok(())
        }
        Work::Mounts => {
            mounts_pass(&ctx).await;
            Ok(())
        }
        Work::Orphan => {
            orphan::orphan_pass(&ctx).await;
            Ok(())
        }
        Work::Progress => {
            let r = if current.as_ref().is_some_and(|c| c.phase == Phase::Active) {
                Ok(())
            } else {
                ctx.budget.keep(engine).await;
                engine.progress().await.map(drop)
            };
            hooks_pass(&ctx).await;
            r
        }
    };
    Outcome {
        result,
        upgrade,
        bound,
        acted: true,
    }
}

/// The notices' decisions ([`events::decide`]) over what a poll observed, applied on the
/// work runtime ([`apply_on`]). An idle poll (no decision) reports that it changed nothing.
async fn decide_and_apply(
    ctx: &Arc<Ctx>,
    work_rt: &tokio::runtime::Handle,
    obs: &Observations,
    current: Option<&Cause>,
) -> Outcome {
    let d = events::decide(&ctx.s.events, obs, current, crate::time::now());
    let acted = !d.is_empty();
    {
        let mut notices = lock_notices(ctx);
        for c in d.iter().filter_map(|d| match d {
            Decision::Drain(c) => Some(c),
            _ => None,
        }) {
            if notices.saw(c) {
                tracing::info!(
                    decision = "notice.seen",
                    node = %ctx.node,
                    cause = c.kind(),
                    key = %c.key(),
                    "notice seen"
                );
            }
        }
    }
    Outcome {
        result: apply_on(work_rt, ctx, d).await,
        upgrade: None,
        bound: None,
        acted,
    }
}

/// Whether the termination lifecycle hooks still need passes: `Terminated` seen (with
/// `events.lifecycle`) and the hooks not over.
fn hooks_pending(ctx: &Ctx) -> bool {
    ctx.s.events.lifecycle
        && ctx.terminated_at.load(std::sync::atomic::Ordering::Relaxed) != 0
        && ctx.hooks.try_lock().is_ok_and(|h| h.tracker.live())
}

/// One pass of the termination lifecycle hooks ([`events::hook::pass`]) after the drain's
/// step: heartbeats while the node drains with jobs, `CONTINUE` once the drain ended or
/// `events.lifecycle_max_wait` passed. Nothing before `Terminated` was seen; a pass in
/// progress is not waited for.
async fn hooks_pass(ctx: &Ctx) {
    let at = ctx.terminated_at.load(std::sync::atomic::Ordering::Relaxed);
    if at == 0 || !ctx.s.events.lifecycle {
        return;
    }
    let Ok(mut hooks) = ctx.hooks.try_lock() else {
        return;
    };
    let hooks = &mut *hooks;
    hooks.tracker.terminated(at);
    if !hooks.tracker.live() {
        return;
    }
    let view = match ctx.engine.load() {
        Ok(st) => match st.phase {
            Phase::Active => events::hook::DrainView::Active,
            Phase::Draining => events::hook::DrainView::Draining,
            Phase::Drained | Phase::Acting | Phase::Done => events::hook::DrainView::Ended,
        },
        Err(e) => {
            tracing::warn!("lifecycle hooks: the drain state: {e}");
            return;
        }
    };
    let client = match &hooks.client {
        Some(c) => c.clone(),
        None => {
            let c = events::hook::client(&aws_region(&ctx.id)).await;
            hooks.client = Some(c.clone());
            c
        }
    };
    events::hook::pass(
        &mut hooks.tracker,
        &client,
        &ctx.id.instance_id,
        view,
        crate::time::now(),
    )
    .await;
}

/// The region of the AWS clients: `AWS_REGION` when set, else the instance's.
fn aws_region(id: &InstanceIdentity) -> String {
    std::env::var("AWS_REGION")
        .ok()
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| id.region.clone())
}

fn lock_notices(ctx: &Ctx) -> std::sync::MutexGuard<'_, metrics::Notices> {
    ctx.notices
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn lock_outage(ctx: &Ctx) -> std::sync::MutexGuard<'_, Outage> {
    ctx.outage.lock().unwrap_or_else(|p| p.into_inner())
}

fn keep<T>(outage: &mut Outage, r: Result<T, ImdsError>, path: &str) -> Option<T> {
    match r {
        Ok(o) => {
            outage.ok(path);
            Some(o)
        }
        Err(e) => {
            outage.fail(&e);
            None
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Work {
    Spot,
    Notices,
    Maintenance,
    CapacityBlock,
    Upgrade,
    Progress,
    Mounts,
    Health,
    Orphan,
}

impl Work {
    /// Only non-blocking instance metadata requests: run on the main thread.
    fn polls_metadata(self) -> bool {
        matches!(self, Work::Spot | Work::Notices | Work::Maintenance)
    }
}

/// [`apply`] on the work runtime (taking the state lock may block a thread); nothing to do
/// when there is no decision (every idle poll).
async fn apply_on(
    work_rt: &tokio::runtime::Handle,
    ctx: &Arc<Ctx>,
    decisions: Vec<Decision>,
) -> Result<(), DrainError> {
    if decisions.is_empty() {
        return Ok(());
    }
    let ctx = ctx.clone();
    match work_rt
        .spawn(async move { apply(&ctx.engine, decisions).await })
        .await
    {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("applying the notices' decisions failed: {e}");
            Ok(())
        }
    }
}

/// The threads that run the daemon's work that may block a thread for a while (the state
/// lock's wait, statfs on a shared file system, health checks, slurmctld, SSM and EC2):
/// a multi-threaded runtime of its own, whose threads sleep while there is no such work.
/// The main loop, the watchdog and the metadata polls run on the daemon's main thread
/// (a current-thread runtime), so that an idle node's daemon wakes once per tick instead
/// of handing every poll from thread to thread.
struct WorkRuntime(Option<tokio::runtime::Runtime>);

/// Threads of the work runtime: health, drain, mounts and upgrade work at once without
/// one blocking the others.
const WORK_THREADS: usize = 2;

impl WorkRuntime {
    fn new() -> std::io::Result<WorkRuntime> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(WORK_THREADS)
            .thread_name("agent-work")
            .enable_all()
            .build()?;
        Ok(WorkRuntime(Some(rt)))
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        self.0.as_ref().expect("until dropped").handle()
    }
}

impl Drop for WorkRuntime {
    fn drop(&mut self) {
        // Called from the main runtime's thread: never block it waiting for work.
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// The daemon's periodic jobs ([`schedule`]): the notices when `events.enabled`, the drain
/// state, the health pass, the mounts, the watchdog when systemd asked for one, and the
/// desired image (`upgrade`: its interval, [`schedule::UpgradePoll`]) when
/// `upgrade.parameter` is set, and the orphan watch when `[orphan]` is on for the node. Every job is first due at `start`; the loop arms the
/// desired image's first check itself.
fn daemon_schedule(
    s: &Settings,
    watchdog: Option<Duration>,
    upgrade: Option<Duration>,
    start: Instant,
) -> Schedule {
    let mut jobs = Vec::new();
    if s.events.enabled {
        jobs.push((Job::Spot, s.events.spot_interval.0));
        jobs.push((Job::Notices, s.events.interval.0));
        jobs.push((Job::Maintenance, s.events.maintenance_interval.0));
        if s.events.capacity_block {
            jobs.push((Job::CapacityBlock, s.events.capacity_block_interval.0));
        }
    }
    jobs.push((Job::Progress, s.drain.check_interval.0));
    jobs.push((Job::Health, s.health.interval.0));
    if !s.mounts.is_empty() {
        jobs.push((Job::Mounts, MOUNTS_INTERVAL));
    }
    if let Some(w) = watchdog {
        jobs.push((Job::Watchdog, w));
    }
    if let Some(every) = upgrade {
        jobs.push((Job::Upgrade, every));
    }
    if s.orphan.active(s.node.dynamic, s.slurm.join_deadline) {
        jobs.push((Job::Orphan, s.orphan.interval()));
    }
    Schedule::new(start, &jobs)
}

/// How often the daemon checks the `[[mounts]]`: a lost file system drains the node within
/// this long, and one that comes back is mounted again as soon.
const MOUNTS_INTERVAL: Duration = Duration::from_secs(30);

fn describe(c: &Check) -> String {
    match c {
        Check::UpToDate {
            image,
            returning: false,
        } => format!("up to date ({image})"),
        Check::UpToDate {
            image,
            returning: true,
        } => format!("up to date ({image}); not in service yet"),
        Check::Busy => "another drain in progress".into(),
        Check::ForeignDrain => "node drained by someone else; not upgrading".into(),
        Check::Waiting { used, limit } => {
            format!("waiting for a budget slot ({used}/{limit} held)")
        }
        Check::Started { current, desired } => format!("{current} -> {desired}"),
        Check::Error(e) => format!("error: {e}"),
        Check::Stuck {
            current,
            desired,
            previous: Some(previous),
        } => format!(
            "stopped: {previous} already drained for {desired} and this replacement still runs {current} (launch template does not follow the parameter)"
        ),
        Check::Stuck {
            current,
            desired,
            previous: None,
        } => format!(
            "stopped: launched after {desired} was published and still runs {current} (launch template does not follow the parameter)"
        ),
    }
}

/// Applies decisions in order: undo first (a canceled event; an event that is over, once
/// slurmd registered again), then drains.
async fn apply(engine: &Engine, decisions: Vec<Decision>) -> Result<(), DrainError> {
    let mut first_err = None;
    for d in &decisions {
        let r = match d {
            Decision::Undo(k) => engine.undo(k).await,
            Decision::UndoAfterRegistration(k) => engine.undo_after_registration(k).await,
            Decision::Drain(_) => continue,
        };
        if let Err(e) = r {
            first_err.get_or_insert(e);
        }
    }
    for d in decisions {
        if let Decision::Drain(c) = d {
            if let Err(e) = engine.request(c).await {
                first_err.get_or_insert(e);
            }
        }
    }
    first_err.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Metadata paths each job reads.
    fn paths(job: Job) -> usize {
        match job {
            Job::Spot => 1,
            Job::Notices | Job::Maintenance => 2,
            _ => 0,
        }
    }

    #[test]
    fn the_default_schedule_stays_within_the_noise_budget() {
        let s = Settings::default();
        let t0 = Instant::now();
        let mut sched = daemon_schedule(
            &s,
            Some(Duration::from_secs(30)),
            Some(s.upgrade.interval.0),
            t0,
        );
        assert_eq!(sched.tick(), Duration::from_secs(1));
        let (mut requests, mut wakeups) = (0, 0);
        // Ten minutes after the first tick, which serves everything at once.
        sched.due(t0);
        for k in 1..=600 {
            let due = sched.due(t0 + Duration::from_secs(k));
            wakeups += usize::from(!due.is_empty());
            requests += due.iter().map(|j| paths(*j)).sum::<usize>();
        }
        // A minute: 60 interruption polls, 2 x 2 rebalance and lifecycle, 2 / 5 maintenance.
        assert_eq!(requests, 600 + 40 + 4, "requests in 10 minutes");
        assert!(requests / 10 <= 70);
        // One tick a second serves every job: nothing wakes the loop between ticks.
        assert_eq!(wakeups, 600);
    }

    #[test]
    fn without_notices_the_tick_is_the_drain_check_and_the_watchdog_rides_on_it() {
        let mut s = Settings::default();
        s.events.enabled = false;
        let sched = daemon_schedule(&s, Some(Duration::from_secs(30)), None, Instant::now());
        assert_eq!(sched.tick(), s.drain.check_interval.0);
        let jobs = sched.describe().join("; ");
        assert!(!jobs.contains("spot"), "{jobs}");
        assert!(jobs.contains("systemd watchdog every 30s"), "{jobs}");
        assert!(!jobs.contains("desired image"), "{jobs}");
    }

    #[test]
    fn the_orphan_watch_is_scheduled_where_it_is_on_only() {
        let mut s = Settings::default();
        let jobs = daemon_schedule(&s, None, None, Instant::now())
            .describe()
            .join("; ");
        assert!(jobs.contains("orphan watch"), "{jobs}");
        assert!(jobs.contains("every 1m"), "{jobs}");
        s.node.dynamic = false;
        let jobs = daemon_schedule(&s, None, None, Instant::now())
            .describe()
            .join("; ");
        assert!(!jobs.contains("orphan watch"), "{jobs}");
        s.orphan.mode = crate::orphan::OrphanMode::On;
        let jobs = daemon_schedule(&s, None, None, Instant::now())
            .describe()
            .join("; ");
        assert!(jobs.contains("orphan watch"), "{jobs}");
    }

    /// Benchmark (issue 25 §2), run by `scripts/bench-upgrade-poll.sh`: every periodic AWS
    /// call of an idle node's daemon, and the fleet's desired-image checks against SSM
    /// Parameter Store's standard quota, from the daemon's own schedule ([`daemon_schedule`],
    /// [`schedule::UpgradePoll`]) with today's fixed 300 s beside it. Prints; asserts
    /// nothing about the figures.
    #[test]
    #[ignore = "benchmark: scripts/bench-upgrade-poll.sh"]
    fn bench_upgrade_poll() {
        use schedule::tests::{bound, check_times};
        const QUOTA: f64 = 40.0;
        let fleets = [1u64, 1000, 10_000];
        let mut s = Settings::default();
        s.upgrade.parameter = "/slurm/compute/image-id".into();
        let h =
            |d: Duration| humantime::format_duration(Duration::from_secs(d.as_secs())).to_string();
        println!(
            "BENCH desired-image poll: upgrade.interval {}, upgrade.fleet_rate {}/s, jitter x{}-{}; \
             quota: SSM Parameter Store standard throughput, {QUOTA} TPS shared by GetParameter, \
             GetParameters and GetParametersByPath",
            h(s.upgrade.interval.0),
            s.upgrade.fleet_rate,
            schedule::UpgradePoll::JITTER.0,
            schedule::UpgradePoll::JITTER.1
        );

        // An idle node: every job of the daemon's schedule over 24 h of one-second ticks,
        // the desired image re-armed as the loop does, each run's AWS calls counted.
        println!("BENCH idle node, AWS API calls per hour by job (24 h of 1 s ticks; IMDS and slurmctld are not AWS APIs):");
        for &n in &fleets {
            let t0 = Instant::now();
            let mut poll = schedule::UpgradePoll::seeded(&s.upgrade, n);
            poll.set_bound(bound(n));
            let mut sched =
                daemon_schedule(&s, Some(Duration::from_secs(30)), Some(poll.interval()), t0);
            poll.arm_first(&mut sched, t0);
            let mut calls: std::collections::BTreeMap<&str, u64> = Default::default();
            let hours = 24;
            for k in 0..=hours * 3600 {
                let now = t0 + Duration::from_secs(k);
                for job in sched.due(now) {
                    if job == Job::Upgrade {
                        if !poll.due(&mut sched, t0, now) {
                            continue;
                        }
                        poll.checked(&mut sched, now);
                    }
                    for call in job.idle_aws_calls() {
                        *calls.entry(call).or_default() += 1;
                    }
                }
            }
            let per_hour: Vec<String> = calls
                .iter()
                .map(|(c, k)| format!("{c} {:.2}/h", *k as f64 / hours as f64))
                .collect();
            println!(
                "BENCH   cluster of {n:>6} nodes: {} (check every {}); no other job calls AWS",
                per_hour.join(", "),
                h(poll.interval())
            );
        }

        {
            // Today's idle node: the same schedule with the fixed 300 s period.
            let t0 = Instant::now();
            let mut sched = Schedule::new(t0, &[(Job::Upgrade, Duration::from_secs(300))]);
            let calls: usize = (0..24 * 3600)
                .flat_map(|k| sched.due(t0 + Duration::from_secs(k)))
                .map(|j| j.idle_aws_calls().len())
                .sum();
            println!(
                "BENCH   today (fixed 300 s), any cluster: ssm:GetParameter {:.2}/h",
                calls as f64 / 24.0
            );
        }

        // The fleet: N nodes launched at the same instant, N jitter streams.
        println!("BENCH fleet launched at once (N independent jitter streams); publish -> first node's check over 100000 random publish times:");
        println!(
            "BENCH   {:<26} {:>6} {:>10} {:>9} {:>10} {:>8} {:>11} {:>9} {:>9}",
            "schedule",
            "nodes",
            "interval",
            "calls/s",
            "of 40 TPS",
            "peak/s",
            "first mean",
            "first p99",
            "first max"
        );
        let mut rng: rand::rngs::StdRng = rand::SeedableRng::seed_from_u64(25);
        let mut row = |name: &str,
                       n: u64,
                       interval: Duration,
                       times: &mut Vec<f64>,
                       horizon: f64| {
            times.sort_by(f64::total_cmp);
            let rate = times.len() as f64 / horizon;
            let mut per_second = std::collections::HashMap::new();
            for t in times.iter() {
                *per_second.entry(t.floor() as u64).or_insert(0u64) += 1;
            }
            let peak = per_second.values().max().copied().unwrap_or(0);
            // Publish times past the launch's first two intervals and before the end's.
            let (lo, hi) = (
                2.0 * interval.as_secs_f64(),
                horizon - 2.0 * interval.as_secs_f64(),
            );
            let mut delays: Vec<f64> = (0..100_000)
                .filter_map(|_| {
                    let p = rand::Rng::random_range(&mut rng, lo..hi);
                    let i = times.partition_point(|t| *t < p);
                    times.get(i).map(|t| t - p)
                })
                .collect();
            delays.sort_by(f64::total_cmp);
            let mean = delays.iter().sum::<f64>() / delays.len() as f64;
            let p99 = delays[delays.len() * 99 / 100];
            let max = delays.last().copied().unwrap_or(0.0);
            println!(
                "BENCH   {name:<26} {n:>6} {:>10} {rate:>9.3} {:>9.1}% {peak:>8} {:>10.1}s {:>8.1}s {:>8.1}s",
                h(interval),
                100.0 * rate / QUOTA,
                mean,
                p99,
                max
            );
        };
        for &n in &fleets {
            let mut p = schedule::UpgradePoll::seeded(&s.upgrade, 0);
            p.set_bound(bound(n));
            let interval = p.interval();
            // At least 20 intervals and 100,000 checks in all.
            let intervals = 20.max(100_000 / n);
            let horizon = interval * u32::try_from(intervals).unwrap();
            let t0 = Instant::now();
            let mut times = Vec::new();
            for node in 0..n {
                let mut p = schedule::UpgradePoll::seeded(&s.upgrade, node.wrapping_mul(7919) + n);
                p.set_bound(bound(n));
                times.extend(check_times(p, t0, horizon));
            }
            row(
                "jittered (this build)",
                n,
                interval,
                &mut times,
                horizon.as_secs_f64(),
            );
        }
        // Today's: every node first checks at start and then every 300 s, not jittered (the
        // schedule's own period, re-armed at each check), so a fleet launched at once
        // checks in the same second forever; every node's times are the same.
        let today = Duration::from_secs(300);
        for &n in &fleets {
            let horizon = today * 2000;
            let t0 = Instant::now();
            let mut sched = Schedule::new(t0, &[(Job::Upgrade, today)]);
            let mut one = Vec::new();
            while let Some(now) = sched.next_due().filter(|t| *t <= t0 + horizon) {
                if sched.due(now).contains(&Job::Upgrade) {
                    one.push((now - t0).as_secs_f64());
                }
            }
            let mut times: Vec<f64> = one
                .iter()
                .flat_map(|t| std::iter::repeat_n(*t, usize::try_from(n).unwrap()))
                .collect();
            row(
                "today (fixed 300 s)",
                n,
                today,
                &mut times,
                horizon.as_secs_f64(),
            );
        }
    }
}

#[cfg(test)]
#[path = "pass_tests.rs"]
mod pass_tests;
