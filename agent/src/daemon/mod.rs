//! `slurm-node-agent run`: the long-running daemon (systemd `Type=notify`).
//!
//! It polls the IMDS notices ([`crate::events`]) and the desired image
//! ([`crate::upgrade`]), turns them into drain requests, and moves the drain state machine
//! ([`crate::drain`]) forward while a drain is in progress. It reports through sd_notify
//! (`READY=1` once the state is loaded, `STATUS=` on every phase change, `WATCHDOG=1` when
//! asked, `STOPPING=1`), and stops cleanly on SIGTERM or SIGINT: the step in progress is
//! abandoned (a running hook is killed), the state on disk is always consistent, and the
//! next start continues the same drain.

pub mod notify;

use std::time::Duration;

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::time::{interval_at, Instant, MissedTickBehavior};

use crate::drain::{Cause, DrainError, Engine, Phase};
use crate::events::{self, Decision, Observations};
use crate::imds::{Imds, ImdsError, InstanceIdentity};
use crate::retry::Backoff;
use crate::settings::{self, Layer, Resolved, SettingsError};
use crate::upgrade::rollout::{self, Check};
use notify::Notifier;

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
    /// The state could not be read (exit 74).
    #[error(transparent)]
    Drain(#[from] DrainError),
}

impl DaemonError {
    /// sysexits(3) code.
    pub fn exit_code(&self) -> u8 {
        match self {
            DaemonError::Settings(_) => 78,
            DaemonError::Identity(e) => e.exit_code(),
            DaemonError::Signal(_) => 71,
            DaemonError::Drain(e) => e.exit_code(),
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

    /// Runs `f` unless a stop signal comes first (`None`).
    async fn or_stop<F: std::future::Future>(&mut self, f: F) -> Option<F::Output> {
        tokio::select! {
            r = f => Some(r),
            _ = self.recv() => None,
        }
    }
}

/// Resolves the settings (files and flags, then IMDS tags and user data) and the instance
/// identity, retrying IMDS until it answers or a stop signal comes.
async fn resolve(
    opts: &Options,
    term: &mut Term,
    notifier: &Notifier,
) -> Result<Option<(Resolved, InstanceIdentity)>, DaemonError> {
    let files = settings::file_layers(&opts.paths)?;
    let early = crate::bootstrap::resolve(&files, None, &opts.flag_layers)?;
    let imds = Imds::new(&early.settings.imds);
    let mut attempt = 0;
    loop {
        match term.or_stop(imds.identity()).await {
            None => return Ok(None),
            Some(Ok(id)) => {
                let full = crate::bootstrap::resolve_with(
                    &files,
                    Some(&id),
                    &opts.flag_layers,
                    settings::Enforce::WarnAndIgnore,
                )?;
                return Ok(Some((full, id)));
            }
            Some(Err(e)) => {
                let wait = Backoff {
                    base: Duration::from_secs(1),
                    cap: Duration::from_secs(30),
                }
                .delay(attempt);
                attempt += 1;
                tracing::warn!("{e}; retrying in {wait:?}");
                notifier.status(&format!("waiting for instance metadata: {e}"));
                if term.or_stop(tokio::time::sleep(wait)).await.is_none() {
                    return Ok(None);
                }
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

/// Runs until SIGTERM/SIGINT.
///
/// # Errors
/// [`DaemonError`] when it cannot start; once running, failures are logged and retried.
pub async fn run(opts: &Options) -> Result<(), DaemonError> {
    let notifier = Notifier::from_env();
    let mut term = Term {
        term: signal(SignalKind::terminate()).map_err(DaemonError::Signal)?,
        int: signal(SignalKind::interrupt()).map_err(DaemonError::Signal)?,
    };
    let Some((resolved, id)) = resolve(opts, &mut term, &notifier).await? else {
        notifier.stopping();
        return Ok(());
    };
    drop(resolved);
    // The one identity rule (crate::identity): bootstrap's record when it is this
    // incarnation's, else the NodeName resolved over the metadata just read, like bootstrap.
    let req = crate::identity::Request {
        paths: &opts.paths,
        flag_layers: &opts.flag_layers,
        lookup: crate::identity::Lookup::RecordThenImds,
        facts: Some(&id),
        imds_timeout: Duration::from_secs(10),
    };
    let (resolved, ident) = crate::identity::resolve(&req).await?;
    let s = resolved.settings;
    let node = ident.node_name.clone();
    let engine = Engine::new(&s, &node).with_instance(&ident.instance_id);
    let imds = Imds::new(&s.imds);
    let ssm = if s.upgrade.parameter.is_empty() {
        None
    } else {
        let region = std::env::var("AWS_REGION")
            .ok()
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| id.region.clone());
        let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new(region))
            .load()
            .await;
        Some(aws_sdk_ssm::Client::new(&sdk))
    };

    let st = engine.load().map_err(DrainError::from)?;
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
    let mut upgrade_status = String::new();
    let mut last_status = status_line(st.phase, st.cause.as_ref(), st.reason.as_deref(), "");
    notifier.ready(&last_status);

    let start = Instant::now();
    let events_on = s.events.enabled;
    let mut spot_tick = interval_at(start, s.events.spot_interval.0);
    let mut events_tick = interval_at(start, s.events.interval.0);
    let mut progress_tick = interval_at(start, s.drain.check_interval.0);
    let watchdog = notify::watchdog_interval();
    let mut watchdog_tick = interval_at(start, watchdog.unwrap_or(Duration::from_secs(3600)));
    for t in [
        &mut spot_tick,
        &mut events_tick,
        &mut progress_tick,
        &mut watchdog_tick,
    ] {
        t.set_missed_tick_behavior(MissedTickBehavior::Delay);
    }
    // Shared file systems: remount what went away, drain while a required one is missing,
    // lift only that drain when it is back (mounts::reconcile).
    let mounts_systemd = if s.mounts.is_empty() {
        None
    } else {
        match crate::systemd::Systemd::connect(&s.systemd.bus).await {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!("mounts will not be watched: {e}");
                None
            }
        }
    };
    let mount_env = crate::mounts::MountEnv::for_bus(&s.systemd.bus);
    let scontrol = crate::slurm::Scontrol::new(&s.slurm.bin_dir);
    // Health checks on the daemon's own schedule (`health.interval`), the same checks and
    // drain/resume rules as `slurm-node-agent check`. Loaded once; a bad checks file is
    // logged and the checks are off until the daemon is restarted.
    let health_checks = match crate::health::load(&s.health, Some(&node)) {
        Ok(set) => Some(set),
        Err(e) => {
            tracing::error!("health checks disabled: {e}");
            None
        }
    };
    let mut health_env = crate::health::RunEnv::from_settings(&s);
    health_env.node = Some(node.clone());
    let health_act =
        crate::health::act::ActOptions::from_settings(&s).with_instance(&ident.instance_id);
    let mut health_tick = interval_at(start, s.health.interval.0);
    health_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut mounts_tick = interval_at(start, MOUNTS_INTERVAL);
    mounts_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let upgrade_sleep = tokio::time::sleep_until(start);
    tokio::pin!(upgrade_sleep);
    let mut outage = Outage::default();

    loop {
        let work = tokio::select! {
            _ = term.recv() => break,
            _ = watchdog_tick.tick(), if watchdog.is_some() => { notifier.watchdog(); continue; }
            _ = spot_tick.tick(), if events_on => Work::Spot,
            _ = events_tick.tick(), if events_on => Work::Events,
            _ = &mut upgrade_sleep, if ssm.is_some() => Work::Upgrade,
            _ = progress_tick.tick() => Work::Progress,
            _ = mounts_tick.tick(), if mounts_systemd.is_some() => Work::Mounts,
            _ = health_tick.tick(), if health_checks.is_some() => Work::Health,
        };
        let current = engine.load().ok();
        let result = match work {
            Work::Spot => {
                let Some(r) = term.or_stop(events::poll_spot(&imds)).await else {
                    break;
                };
                match r {
                    Ok(o) => {
                        outage.ok(events::notice::SPOT_PATH);
                        let obs = Observations {
                            spot: Some(o),
                            ..Default::default()
                        };
                        let cur = current.as_ref().and_then(|c| c.cause.as_ref());
                        let d = events::decide(&s.events, &obs, cur, events::time::now());
                        match term.or_stop(apply(&engine, d)).await {
                            Some(r) => r,
                            None => break,
                        }
                    }
                    Err(e) => {
                        outage.fail(&e);
                        Ok(())
                    }
                }
            }
            Work::Events => {
                let polled = term
                    .or_stop(async {
                        tokio::join!(
                            events::poll_rebalance(&imds),
                            events::poll_maintenance(&imds),
                            events::poll_lifecycle(&imds)
                        )
                    })
                    .await;
                let Some((rb, mt, lc)) = polled else { break };
                let obs = Observations {
                    spot: None,
                    rebalance: keep(&mut outage, rb, events::notice::REBALANCE_PATH),
                    maintenance: keep(&mut outage, mt, events::notice::MAINTENANCE_PATH),
                    lifecycle: keep(&mut outage, lc, events::notice::LIFECYCLE_PATH),
                };
                let cur = current.as_ref().and_then(|c| c.cause.as_ref());
                let d = events::decide(&s.events, &obs, cur, events::time::now());
                match term.or_stop(apply(&engine, d)).await {
                    Some(r) => r,
                    None => break,
                }
            }
            Work::Upgrade => {
                let Some(client) = &ssm else { continue };
                let Some(r) = term
                    .or_stop(rollout::check(&engine, client, &id.ami_id))
                    .await
                else {
                    break;
                };
                let next = match &r {
                    Ok(c) if c.wants_retry_soon() => {
                        crate::upgrade::jittered(s.upgrade.budget_wait.0)
                    }
                    _ => s.upgrade.interval.0,
                };
                upgrade_sleep.as_mut().reset(Instant::now() + next);
                match r {
                    Ok(c) => {
                        upgrade_status = describe(&c);
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            Work::Health => {
                let Some(checks) = &health_checks else {
                    continue;
                };
                let Some(report) = term
                    .or_stop(crate::health::run_checks(checks, &health_env))
                    .await
                else {
                    break;
                };
                if !s.health.prometheus_textfile.as_os_str().is_empty() {
                    if let Err(e) = crate::health::output::write_prometheus(
                        &report,
                        &s.health.prometheus_textfile,
                    ) {
                        tracing::warn!("{e}");
                    }
                }
                if s.health.act {
                    let act = crate::health::act_on(&report, &scontrol, &node, &health_act);
                    match term.or_stop(act).await {
                        Some(outcome) => {
                            tracing::info!(
                                healthy = report.healthy(),
                                action = %outcome.action,
                                detail = %outcome.detail,
                                "health checks"
                            );
                        }
                        None => break,
                    }
                }
                Ok(())
            }
            Work::Mounts => {
                let Some(systemd) = &mounts_systemd else {
                    continue;
                };
                let pass = crate::mounts::reconcile(
                    &s.mounts,
                    &id.region,
                    &mount_env,
                    systemd,
                    &scontrol,
                    &node,
                    &ident.instance_id,
                );
                match term.or_stop(pass).await {
                    Some(Ok(report)) => {
                        tracing::debug!(?report, "mounts checked");
                        Ok(())
                    }
                    Some(Err(e)) => {
                        tracing::warn!("mounts: {e}");
                        Ok(())
                    }
                    None => break,
                }
            }
            Work::Progress => {
                if current.as_ref().is_some_and(|c| c.phase == Phase::Active) {
                    Ok(())
                } else {
                    match term.or_stop(engine.progress()).await {
                        Some(r) => r.map(drop),
                        None => break,
                    }
                }
            }
        };
        if let Err(e) = result {
            tracing::warn!("{e}");
        }
        if let Ok(st) = engine.load() {
            let line = status_line(
                st.phase,
                st.cause.as_ref(),
                st.reason.as_deref(),
                &upgrade_status,
            );
            if line != last_status {
                notifier.status(&line);
                last_status = line;
            }
            // A new drain: look at the node again soon rather than a full interval later.
            if current.as_ref().is_some_and(|c| c.phase != st.phase) {
                progress_tick.reset_immediately();
            }
        }
    }
    tracing::info!("stop signal received; stopping");
    notifier.stopping();
    engine.write_metrics();
    Ok(())
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

#[derive(Debug, Clone, Copy)]
enum Work {
    Spot,
    Events,
    Upgrade,
    Progress,
    Mounts,
    Health,
}

/// How often the daemon checks the `[[mounts]]`: a lost file system drains the node within
/// this long, and one that comes back is mounted again as soon.
const MOUNTS_INTERVAL: Duration = Duration::from_secs(30);

fn describe(c: &Check) -> String {
    match c {
        Check::UpToDate { image } => format!("up to date ({image})"),
        Check::Busy => "another drain in progress".into(),
        Check::ForeignDrain => "node drained by someone else; not upgrading".into(),
        Check::Waiting { used, limit } => format!("waiting for the budget ({used}/{limit})"),
        Check::BackedOff => "backed off (budget)".into(),
        Check::Started { current, desired } => format!("{current} -> {desired}"),
        Check::Error(e) => format!("error: {e}"),
    }
}

/// Applies decisions in order: undo first (a canceled event), then drains.
async fn apply(engine: &Engine, decisions: Vec<Decision>) -> Result<(), DrainError> {
    let mut first_err = None;
    for d in decisions.iter().filter(|d| matches!(d, Decision::Undo(_))) {
        if let Decision::Undo(k) = d {
            if let Err(e) = engine.undo(k).await {
                first_err.get_or_insert(e);
            }
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
