//! Runs a [`CheckSet`]: every check at once, each under its own timeout.
//!
//! - Checks that read the host (mounts, `/proc`, files) run one after the other on a
//!   worker thread (they take microseconds; one thread avoids a context switch per check
//!   on a busy 2-core node). The engine watches the running check's deadline: when it
//!   passes, the check is reported as timed out, its thread is left behind (a thread stuck
//!   in the kernel on a hung mount cannot be killed), and a new worker takes the remaining
//!   checks. A stuck check is remembered and not started again while it is still stuck
//!   (reported as still hung), so a long-running daemon does not pile up threads on a dead
//!   file system.
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
    /// Whether NHC's `-S`/`-r`/`-c` service actions run (off for `check --no-act`, which
    /// only reports).
    pub service_actions: bool,
}

impl Default for RunEnv {
    fn default() -> Self {
        RunEnv {
            host: Host::default(),
            systemd_bus: "system".into(),
            output_limit: 64 * 1024,
            node: None,
            service_actions: true,
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
            service_actions: true,
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
    service_actions: bool,
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

/// Messages from lane workers.
enum LaneMsg {
    Started(usize, Instant),
    Done(usize, Result<String, String>, Duration),
}

type Queue = Arc<Mutex<std::collections::VecDeque<usize>>>;

/// Starts a worker that runs queued blocking checks one by one.
fn spawn_worker(
    queue: Queue,
    checks: Arc<Vec<Arc<Check>>>,
    done_flags: Arc<Vec<Arc<AtomicBool>>>,
    facts: Arc<Facts>,
    tx: tokio::sync::mpsc::UnboundedSender<LaneMsg>,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("health-checks".into())
        .stack_size(512 * 1024)
        .spawn(move || loop {
            let next = queue.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
            let Some(i) = next else { return };
            let start = Instant::now();
            if tx.send(LaneMsg::Started(i, start)).is_err() {
                return;
            }
            let r = checks[i].kind.run_blocking(&facts);
            done_flags[i].store(true, Ordering::Release);
            if tx.send(LaneMsg::Done(i, r, start.elapsed())).is_err() {
                return;
            }
        })
        .map(drop)
}

/// Runs the blocking checks `idx` (indexes into `checks`) on the lane; returns
/// (index, outcome, duration) for each.
async fn run_lane(
    checks: &[Arc<Check>],
    idx: Vec<usize>,
    facts: Arc<Facts>,
) -> Vec<(usize, Outcome, Duration)> {
    let mut out = Vec::with_capacity(idx.len());
    let mut queued = std::collections::VecDeque::new();
    for i in idx {
        match still_stuck(&stuck_key(&checks[i])) {
            Some(for_how_long) => out.push((
                i,
                Outcome::Timeout(format!(
                    "still hung since a previous run ({}s ago); not started again",
                    for_how_long.as_secs()
                )),
                Duration::ZERO,
            )),
            None => queued.push_back(i),
        }
    }
    let mut pending = queued.len();
    if pending == 0 {
        return out;
    }
    let all: Arc<Vec<Arc<Check>>> = Arc::new(checks.to_vec());
    let flags: Arc<Vec<Arc<AtomicBool>>> = Arc::new(
        (0..checks.len())
            .map(|_| Arc::new(AtomicBool::new(false)))
            .collect(),
    );
    let queue: Queue = Arc::new(Mutex::new(queued));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let spawn = |tx| spawn_worker(queue.clone(), all.clone(), flags.clone(), facts.clone(), tx);
    if let Err(e) = spawn(tx.clone()) {
        for i in queue.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            out.push((
                i,
                Outcome::Fail(format!("cannot start a worker thread: {e}")),
                Duration::ZERO,
            ));
        }
        return out;
    }
    // Running checks and their deadlines; checks already reported as timed out.
    let mut running: HashMap<usize, (Instant, Instant)> = HashMap::new();
    let mut timed_out: Vec<usize> = Vec::new();
    while pending > 0 {
        let next_deadline = running.values().map(|(_, d)| *d).min();
        let msg = match next_deadline {
            Some(d) => match tokio::time::timeout_at(d.into(), rx.recv()).await {
                Ok(m) => m,
                Err(_) => {
                    // The earliest deadline passed: report it, leave its thread, and let a
                    // new worker take the queue.
                    let late: Vec<usize> = running
                        .iter()
                        .filter(|(_, (_, dl))| *dl <= Instant::now())
                        .map(|(i, _)| *i)
                        .collect();
                    for i in late {
                        let (started, _) = running
                            .remove(&i)
                            .unwrap_or((Instant::now(), Instant::now()));
                        let c = &checks[i];
                        stuck().lock().unwrap_or_else(|p| p.into_inner()).insert(
                            stuck_key(c),
                            Stuck {
                                done: flags[i].clone(),
                                since: started,
                            },
                        );
                        out.push((
                            i,
                            Outcome::Timeout(format!(
                                "no answer within {}; left running (hung {})",
                                humantime::format_duration(c.timeout),
                                what_hangs(&c.kind)
                            )),
                            started.elapsed(),
                        ));
                        timed_out.push(i);
                        pending -= 1;
                    }
                    if !queue.lock().unwrap_or_else(|p| p.into_inner()).is_empty() {
                        if let Err(e) = spawn(tx.clone()) {
                            for i in queue.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
                                out.push((
                                    i,
                                    Outcome::Fail(format!("cannot start a worker thread: {e}")),
                                    Duration::ZERO,
                                ));
                                pending -= 1;
                            }
                        }
                    }
                    continue;
                }
            },
            None => rx.recv().await,
        };
        match msg {
            Some(LaneMsg::Started(i, at)) => {
                running.insert(i, (at, at + checks[i].timeout));
            }
            Some(LaneMsg::Done(i, r, took)) => {
                running.remove(&i);
                if timed_out.contains(&i) {
                    continue;
                }
                out.push((
                    i,
                    match r {
                        Ok(m) => Outcome::Pass(m),
                        Err(m) => Outcome::Fail(m),
                    },
                    took,
                ));
                pending -= 1;
            }
            // Every worker ended (cannot happen while checks are pending and `tx` lives).
            None => break,
        }
    }
    out
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

/// Runs an async check (command, unit).
async fn run_async(check: Arc<Check>, ctx: Arc<Ctx>) -> (Outcome, Duration) {
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
        k => Outcome::Fail(format!(
            "internal error: {} is not an async check",
            k.family()
        )),
    };
    (outcome, start.elapsed())
}

/// NHC's `-S`/`-r`/`-c`: a failed process check with an action runs it (the check still
/// fails for this run).
async fn after(check: &Check, outcome: Outcome, ctx: &Ctx) -> Outcome {
    match (outcome, &check.kind) {
        (Outcome::Fail(m), CheckKind::Process(p))
            if p.must_run && p.action != ServiceAction::None && !ctx.service_actions =>
        {
            Outcome::Fail(format!(
                "{m}; {} of {} not attempted (report only)",
                format!("{:?}", p.action).to_lowercase(),
                p.service
            ))
        }
        (Outcome::Fail(m), CheckKind::Process(p))
            if p.must_run && p.action != ServiceAction::None =>
        {
            let note =
                tokio::time::timeout(check.timeout, service_action(&p.service, p.action, ctx))
                    .await
                    .unwrap_or_else(|_| "service action timed out".into());
            Outcome::Fail(format!("{m}; {note}"))
        }
        (o, _) => o,
    }
}

fn result(check: &Check, outcome: Outcome, took: Duration) -> CheckResult {
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
        duration_ms: took.as_secs_f64() * 1000.0,
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
        service_actions: env.service_actions,
        output_limit: env.output_limit,
        systemd: tokio::sync::OnceCell::new(),
    });
    let checks: Vec<Arc<Check>> = set.checks.iter().cloned().map(Arc::new).collect();
    // Async checks (commands, units) start first so their processes overlap the lane.
    let handles: Vec<(usize, tokio::task::JoinHandle<(Outcome, Duration)>)> = checks
        .iter()
        .enumerate()
        .filter(|(_, c)| !c.kind.is_blocking())
        .map(|(i, c)| (i, tokio::spawn(run_async(c.clone(), ctx.clone()))))
        .collect();
    let blocking: Vec<usize> = (0..checks.len())
        .filter(|i| checks[*i].kind.is_blocking())
        .collect();
    let mut slots: Vec<Option<(Outcome, Duration)>> = (0..checks.len()).map(|_| None).collect();
    for (i, o, d) in run_lane(&checks, blocking, ctx.facts.clone()).await {
        slots[i] = Some((o, d));
    }
    for (i, h) in handles {
        slots[i] = Some(match h.await {
            Ok(r) => r,
            Err(e) => (
                Outcome::Fail(format!("the check panicked: {e}")),
                Duration::ZERO,
            ),
        });
    }
    let mut results = Vec::with_capacity(checks.len());
    for (c, slot) in checks.iter().zip(slots) {
        let (o, d) = slot.unwrap_or((
            Outcome::Fail("internal error: no result".into()),
            Duration::ZERO,
        ));
        let o = after(c, o, &ctx).await;
        results.push(result(c, o, d));
    }
    Report {
        node: env.node.clone(),
        results,
        notes: set.notes.clone(),
        started_unix,
        duration_ms: start.elapsed().as_secs_f64() * 1000.0,
    }
}
