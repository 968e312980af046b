//! Runs a [`CheckSet`]: every check at once, each under its own timeout.
//!
//! - Checks that read the host run on a thread of their own; the engine waits for the
//!   answer up to the check's timeout. A thread stuck in the kernel (a hung mount) cannot
//!   be killed: it is left behind, remembered, and the check is not started again while
//!   it is still stuck (reported as still hung), so a long-running daemon does not pile up
//!   threads on a dead file system.
//! - Commands run as async child processes ([`super::checks::cmd`]); unit states come
//!   from systemd over D-Bus, the connection made once per run and only when needed.
//!
//! Host facts (`/proc/mounts`, the process table...) are read once per run, when the
//! first check needs them ([`Facts`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::checks::cmd::{self, TIMEOUT_PREFIX};
use super::checks::ps::ServiceAction;
use super::checks::{CheckKind, UnitSpec};
use super::facts::{Facts, Host};
use super::{Check, CheckResult, CheckSet, Report, Status};
use crate::systemd::Systemd;

/// What a run needs besides the checks.
#[derive(Debug, Clone)]
pub struct RunEnv {
    /// Where host facts are read.
    pub host: Host,
    /// systemd bus for unit checks and service actions (`system`, `session`, an address).
    pub systemd_bus: String,
    /// Most bytes of a command's stdout kept.
    pub output_limit: usize,
    /// Node name, for the report.
    pub node: Option<String>,
}

impl Default for RunEnv {
    fn default() -> Self {
        RunEnv {
            host: Host::default(),
            systemd_bus: "system".into(),
            output_limit: 64 * 1024,
            node: None,
        }
    }
}

impl RunEnv {
    /// From the agent's settings (`systemd.bus`, `health.output_limit`, `node.name`).
    pub fn from_settings(s: &crate::settings::Settings) -> RunEnv {
        RunEnv {
            host: Host::default(),
            systemd_bus: s.systemd.bus.clone(),
            output_limit: usize::try_from(s.health.output_limit).unwrap_or(64 * 1024),
            node: (!s.node.name.is_empty()).then(|| s.node.name.clone()),
        }
    }
}

struct Stuck {
    done: Arc<AtomicBool>,
    since: Instant,
}

/// Blocking checks whose thread did not return in time, by check identity.
fn stuck() -> &'static Mutex<HashMap<String, Stuck>> {
    static STUCK: OnceLock<Mutex<HashMap<String, Stuck>>> = OnceLock::new();
    STUCK.get_or_init(|| Mutex::new(HashMap::new()))
}

fn stuck_key(c: &Check) -> String {
    format!("{}\u{0}{}", c.origin, c.name)
}

/// How long a still-stuck check has been hung, if it is.
fn still_stuck(key: &str) -> Option<Duration> {
    let mut map = stuck().lock().unwrap_or_else(|p| p.into_inner());
    let s = map.get(key)?;
    if s.done.load(Ordering::Acquire) {
        map.remove(key);
        return None;
    }
    Some(s.since.elapsed())
}

struct Ctx {
    facts: Arc<Facts>,
    bus: String,
    output_limit: usize,
    systemd: tokio::sync::OnceCell<Result<Systemd, String>>,
}

impl Ctx {
    async fn systemd(&self) -> Result<&Systemd, String> {
        self.systemd
            .get_or_init(|| async { Systemd::connect(&self.bus).await.map_err(|e| e.to_string()) })
            .await
            .as_ref()
            .map_err(Clone::clone)
    }
}

enum Outcome {
    Pass(String),
    Fail(String),
    Timeout(String),
}

async fn run_blocking(check: &Arc<Check>, ctx: &Ctx) -> Outcome {
    let key = stuck_key(check);
    if let Some(for_how_long) = still_stuck(&key) {
        return Outcome::Timeout(format!(
            "still hung since a previous run ({}s ago); not started again",
            for_how_long.as_secs()
        ));
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let done = Arc::new(AtomicBool::new(false));
    let (c, f, d) = (check.clone(), ctx.facts.clone(), done.clone());
    let spawned = std::thread::Builder::new()
        .name("health-check".into())
        .stack_size(256 * 1024)
        .spawn(move || {
            let r = c.kind.run_blocking(&f);
            d.store(true, Ordering::Release);
            let _ = tx.send(r);
        });
    if let Err(e) = spawned {
        return Outcome::Fail(format!("cannot start a thread for the check: {e}"));
    }
    match tokio::time::timeout(check.timeout, rx).await {
        Ok(Ok(Ok(m))) => Outcome::Pass(m),
        Ok(Ok(Err(m))) => Outcome::Fail(m),
        Ok(Err(_)) => Outcome::Fail("the check's thread ended without an answer".into()),
        Err(_) => {
            stuck().lock().unwrap_or_else(|p| p.into_inner()).insert(
                key,
                Stuck {
                    done,
                    since: Instant::now(),
                },
            );
            Outcome::Timeout(format!(
                "no answer within {}; left running (hung {})",
                humantime::format_duration(check.timeout),
                what_hangs(&check.kind)
            ))
        }
    }
}

fn what_hangs(kind: &CheckKind) -> String {
    match kind {
        CheckKind::Mount(m) => format!("file system at {}", m.path),
        CheckKind::Space(s) => format!("file system at {}", s.path),
        CheckKind::FileTest(f) => format!("access to {}", f.paths.join(" ")),
        CheckKind::FileContents(f) => format!("read of {}", f.path),
        CheckKind::FileStat(f) => format!("stat of {}", f.paths.join(" ")),
        CheckKind::Process(_) => "read of /proc".into(),
        k => format!("{} check", k.family()),
    }
}

async fn run_unit(spec: &UnitSpec, ctx: &Ctx) -> Result<String, String> {
    let sd = ctx.systemd().await?;
    let state = sd
        .active_state(&spec.unit)
        .await
        .map_err(|e| e.to_string())?;
    if state == spec.state {
        Ok(format!("{} is {state}", spec.unit))
    } else {
        Err(format!(
            "{} is {state} (expected {})",
            spec.unit, spec.state
        ))
    }
}

/// NHC's `-S`/`-r`/`-c` for a missing service: a systemd job on `<service>.service`.
async fn service_action(service: &str, action: ServiceAction, ctx: &Ctx) -> String {
    let unit = if service.contains('.') {
        service.to_string()
    } else {
        format!("{service}.service")
    };
    if let Err(m) = crate::systemd::validate_unit_name(&unit) {
        return format!("no action: {m}");
    }
    let sd = match ctx.systemd().await {
        Ok(s) => s,
        Err(e) => return format!("{action:?} of {unit} not possible: {e}"),
    };
    let r = match action {
        ServiceAction::Start => sd.start(&unit).await,
        ServiceAction::Restart => sd.restart(&unit).await,
        ServiceAction::Cycle => match sd.stop(&unit).await {
            Ok(()) => sd.start(&unit).await,
            Err(e) => Err(e),
        },
        ServiceAction::None => return String::new(),
    };
    match r {
        Ok(()) => format!("{} {unit}: done", format!("{action:?}").to_lowercase()),
        Err(e) => format!(
            "{} {unit} failed: {e}",
            format!("{action:?}").to_lowercase()
        ),
    }
}

async fn run_one(check: Arc<Check>, ctx: Arc<Ctx>) -> CheckResult {
    let start = Instant::now();
    let outcome = match &check.kind {
        CheckKind::Command(spec) => {
            // The command kills itself at the timeout; the outer limit only guards the
            // engine against a spawn that never returns.
            let limit = check.timeout + Duration::from_secs(2);
            match tokio::time::timeout(
                limit,
                cmd::check_command(spec, check.timeout, ctx.output_limit),
            )
            .await
            {
                Ok(Ok(m)) => Outcome::Pass(m),
                Ok(Err(m)) if m.starts_with(TIMEOUT_PREFIX) => Outcome::Timeout(m),
                Ok(Err(m)) => Outcome::Fail(m),
                Err(_) => Outcome::Timeout(format!("command did not finish within {limit:?}")),
            }
        }
        CheckKind::Unit(spec) => {
            match tokio::time::timeout(check.timeout, run_unit(spec, &ctx)).await {
                Ok(Ok(m)) => Outcome::Pass(m),
                Ok(Err(m)) => Outcome::Fail(m),
                Err(_) => Outcome::Timeout(format!(
                    "no answer from systemd within {}",
                    humantime::format_duration(check.timeout)
                )),
            }
        }
        _ => run_blocking(&check, &ctx).await,
    };
    let outcome = match (outcome, &check.kind) {
        (Outcome::Fail(m), CheckKind::Process(p))
            if p.must_run && p.action != ServiceAction::None =>
        {
            let left = check
                .timeout
                .saturating_sub(start.elapsed())
                .max(Duration::from_secs(1));
            let note = tokio::time::timeout(left, service_action(&p.service, p.action, &ctx))
                .await
                .unwrap_or_else(|_| "service action timed out".into());
            Outcome::Fail(format!("{m}; {note}"))
        }
        (o, _) => o,
    };
    let (status, message) = match outcome {
        Outcome::Pass(m) => (Status::Pass, m),
        Outcome::Fail(m) => (Status::Fail, m),
        Outcome::Timeout(m) => (Status::Timeout, m),
    };
    CheckResult {
        name: check.name.clone(),
        family: check.kind.family().to_string(),
        origin: check.origin.to_string(),
        status,
        fatal: check.fatal,
        message,
        duration_ms: start.elapsed().as_secs_f64() * 1000.0,
    }
}

/// Runs every check of `set` concurrently and collects the results in check order.
/// Never fails: a check that cannot run is a failed check.
pub async fn run_checks(set: &CheckSet, env: &RunEnv) -> Report {
    let started_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let start = Instant::now();
    let ctx = Arc::new(Ctx {
        facts: Arc::new(Facts::new(env.host.clone())),
        bus: env.systemd_bus.clone(),
        output_limit: env.output_limit,
        systemd: tokio::sync::OnceCell::new(),
    });
    let handles: Vec<_> = set
        .checks
        .iter()
        .map(|c| tokio::spawn(run_one(Arc::new(c.clone()), ctx.clone())))
        .collect();
    let mut results = Vec::with_capacity(handles.len());
    for (h, c) in handles.into_iter().zip(&set.checks) {
        results.push(match h.await {
            Ok(r) => r,
            Err(e) => CheckResult {
                name: c.name.clone(),
                family: c.kind.family().to_string(),
                origin: c.origin.to_string(),
                status: Status::Fail,
                fatal: c.fatal,
                message: format!("the check panicked: {e}"),
                duration_ms: 0.0,
            },
        });
    }
    Report {
        node: env.node.clone(),
        results,
        notes: set.notes.clone(),
        started_unix,
        duration_ms: start.elapsed().as_secs_f64() * 1000.0,
    }
}
