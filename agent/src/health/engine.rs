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

use super::checks::cmd;
use super::checks::ps::{ServiceAction, Verify};
use super::checks::{hw, net, psres};
use super::checks::{CheckKind, Checked, Failed, UnitSpec};
use super::facts::{Facts, Host};
use super::{Check, CheckResult, CheckSet, Report, Status};
use crate::systemd::{Systemd, SystemdError};

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
    /// Time limit of the whole run (`health.run_deadline`): a check still running then is
    /// reported as hung (a command is killed with its cgroup) and the run ends.
    pub run_deadline: Duration,
    /// Whether checks take their actions (off for `check --no-act`, which only reports
    /// them): NHC's service actions (`-S`/`-r`/`-c`/`-s`/`-k`/`-e`/`-E`), the per-process
    /// checks' SIGKILL, renice and `-e`, `check_net_socket -e/-E`, and `check_fs_mount`'s
    /// mount point creation, `-r` and `-e/-E`.
    pub service_actions: bool,
}

impl Default for RunEnv {
    fn default() -> Self {
        RunEnv {
            host: Host::default(),
            systemd_bus: "system".into(),
            output_limit: 64 * 1024,
            node: None,
            run_deadline: Duration::from_secs(30),
            service_actions: true,
        }
    }
}

impl RunEnv {
    /// From `[health]` (`health.output_limit`, `health.run_deadline`) and the systemd bus
    /// (`systemd.bus`); no NodeName (the caller sets [`RunEnv::node`]).
    pub fn new(health: &super::HealthSettings, systemd_bus: &str) -> RunEnv {
        RunEnv {
            host: Host::default(),
            systemd_bus: systemd_bus.to_string(),
            output_limit: usize::try_from(health.output_limit).unwrap_or(64 * 1024),
            node: None,
            run_deadline: health.run_deadline.0,
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
    systemd: tokio::sync::OnceCell<Result<Systemd, Arc<SystemdError>>>,
}

impl Ctx {
    async fn systemd(&self) -> Result<&Systemd, Arc<SystemdError>> {
        self.systemd
            .get_or_init(|| async { Systemd::connect(&self.bus).await.map_err(Arc::new) })
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

impl From<Result<String, Failed>> for Outcome {
    /// A host check's result: its message on pass, or why it failed.
    fn from(r: Result<String, Failed>) -> Outcome {
        match r {
            Ok(m) => Outcome::Pass(m),
            Err(f) => Outcome::Fail(f.to_string()),
        }
    }
}

/// Messages from lane workers (worker id first).
enum LaneMsg {
    Started(usize, usize, Instant),
    Done(usize, usize, Result<String, Failed>, Duration),
    Idle(usize),
}

type Queue = Arc<Mutex<std::collections::VecDeque<usize>>>;

/// How long a check may run on a worker before another worker takes the queue: checks
/// take microseconds, so one slower than this is probably hung, and the checks after it
/// must not wait for its timeout (N hung checks cost about one timeout, not N).
pub const HEDGE: Duration = Duration::from_millis(50);

/// Starts worker `w` that runs queued blocking checks one by one.
fn spawn_worker(
    w: usize,
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
            let Some(i) = next else {
                let _ = tx.send(LaneMsg::Idle(w));
                return;
            };
            let start = Instant::now();
            if tx.send(LaneMsg::Started(w, i, start)).is_err() {
                return;
            }
            let r = checks[i].kind.run_blocking(&facts);
            done_flags[i].store(true, Ordering::Release);
            if tx.send(LaneMsg::Done(w, i, r, start.elapsed())).is_err() {
                return;
            }
        })
        .map(drop)
}

/// The message of a check still running when the run deadline passed.
fn deadline_message(run_deadline: Duration, what: &str) -> String {
    format!(
        "hung: no answer by the run deadline ({}; {what})",
        cmd::shown_duration(run_deadline)
    )
}

/// Runs the blocking checks `idx` (indexes into `checks`) on worker threads: one worker
/// while checks are quick, one more each time every worker has been on its check for
/// [`HEDGE`]. A check past its timeout is reported as timed out and its thread left
/// behind; at `deadline` every check still running or queued is reported as hung.
/// Returns (index, outcome, duration) for each.
async fn run_lane(
    checks: &[Arc<Check>],
    idx: Vec<usize>,
    facts: Arc<Facts>,
    deadline: Instant,
    run_deadline: Duration,
) -> Vec<(usize, Outcome, Duration)> {
    let mut out = Vec::with_capacity(idx.len());
    let mut queued = std::collections::VecDeque::new();
    for i in idx.iter().copied() {
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
    // Workers: id -> the check it runs and since when (None: between checks).
    let mut workers: HashMap<usize, Option<(usize, Instant)>> = HashMap::new();
    let mut next_worker = 0usize;
    let mut spawn = |workers: &mut HashMap<usize, Option<(usize, Instant)>>,
                     out: &mut Vec<(usize, Outcome, Duration)>,
                     pending: &mut usize| {
        let w = next_worker;
        next_worker += 1;
        match spawn_worker(
            w,
            queue.clone(),
            all.clone(),
            flags.clone(),
            facts.clone(),
            tx.clone(),
        ) {
            Ok(()) => {
                workers.insert(w, None);
            }
            Err(e) if workers.is_empty() => {
                for i in queue.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
                    out.push((
                        i,
                        Outcome::Fail(format!("cannot start a worker thread: {e}")),
                        Duration::ZERO,
                    ));
                    *pending -= 1;
                }
            }
            // The workers there are take the queue.
            Err(_) => {}
        }
    };
    spawn(&mut workers, &mut out, &mut pending);
    // Running checks: index -> (worker, started, its timeout's deadline).
    let mut running: HashMap<usize, (usize, Instant, Instant)> = HashMap::new();
    let mut reported: Vec<bool> = vec![false; checks.len()];
    while pending > 0 {
        let queue_waiting = !queue.lock().unwrap_or_else(|p| p.into_inner()).is_empty();
        // Hedge: when every worker is on a check started HEDGE ago or more.
        let hedge_at = if queue_waiting && !workers.is_empty() {
            workers
                .values()
                .map(|s| s.map(|(_, t)| t + HEDGE))
                .collect::<Option<Vec<Instant>>>()
                .and_then(|v| v.into_iter().max())
        } else {
            None
        };
        let wake = running
            .values()
            .map(|(_, _, d)| *d)
            .chain(hedge_at)
            .chain(std::iter::once(deadline))
            .min()
            .unwrap_or(deadline);
        let msg = match tokio::time::timeout_at(wake.into(), rx.recv()).await {
            Ok(m) => m,
            Err(_) => {
                let now = Instant::now();
                if now >= deadline {
                    // Messages already sent count (a check that just ended, or started).
                    while let Ok(m) = rx.try_recv() {
                        match m {
                            LaneMsg::Started(_, i, at) => {
                                running.insert(i, (0, at, at));
                            }
                            LaneMsg::Done(_, i, r, took) if !reported[i] => {
                                running.remove(&i);
                                out.push((i, Outcome::from(r), took));
                                reported[i] = true;
                            }
                            _ => {}
                        }
                    }
                    for (i, (_, started, _)) in running.drain() {
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
                            Outcome::Timeout(deadline_message(
                                run_deadline,
                                &format!("{} left running", what_hangs(&c.kind)),
                            )),
                            started.elapsed(),
                        ));
                        reported[i] = true;
                    }
                    for i in queue.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
                        out.push((
                            i,
                            Outcome::Timeout(deadline_message(run_deadline, "not started")),
                            Duration::ZERO,
                        ));
                        reported[i] = true;
                    }
                    break;
                }
                // Checks past their own timeout: reported, their threads left behind.
                let late: Vec<usize> = running
                    .iter()
                    .filter(|(_, (_, _, dl))| *dl <= now)
                    .map(|(i, _)| *i)
                    .collect();
                for i in late {
                    let Some((w, started, _)) = running.remove(&i) else {
                        continue;
                    };
                    workers.remove(&w);
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
                            cmd::shown_duration(c.timeout),
                            what_hangs(&c.kind)
                        )),
                        started.elapsed(),
                    ));
                    reported[i] = true;
                    pending -= 1;
                }
                let queue_waiting = !queue.lock().unwrap_or_else(|p| p.into_inner()).is_empty();
                let all_busy = workers
                    .values()
                    .all(|s| s.is_some_and(|(_, t)| now >= t + HEDGE));
                if queue_waiting && all_busy {
                    spawn(&mut workers, &mut out, &mut pending);
                }
                continue;
            }
        };
        match msg {
            Some(LaneMsg::Started(w, i, at)) => {
                workers.insert(w, Some((i, at)));
                running.insert(i, (w, at, at + checks[i].timeout));
            }
            Some(LaneMsg::Done(w, i, r, took)) => {
                running.remove(&i);
                if reported[i] {
                    // A check reported as timed out came back: its worker goes on.
                    workers.insert(w, None);
                    continue;
                }
                workers.insert(w, None);
                out.push((i, Outcome::from(r), took));
                reported[i] = true;
                pending -= 1;
            }
            Some(LaneMsg::Idle(w)) => {
                workers.remove(&w);
            }
            // Every worker ended (cannot happen while checks are pending and `tx` lives).
            None => break,
        }
    }
    // A check a worker took but had not announced when the deadline passed.
    for i in idx {
        if !reported[i] && out.iter().all(|(j, _, _)| *j != i) {
            out.push((
                i,
                Outcome::Timeout(deadline_message(run_deadline, "left running")),
                Duration::ZERO,
            ));
        }
    }
    out
}

fn what_hangs(kind: &CheckKind) -> String {
    match kind {
        CheckKind::Mount(m) => format!("file system at {}", m.path),
        CheckKind::Space(s) => format!("file system at {}", s.path),
        CheckKind::FreeSpace(s) => format!("file system at {}", s.path),
        CheckKind::FileTest(f) => format!("access to {}", f.paths.join(" ")),
        CheckKind::FileContents(f) => format!("read of {}", f.path),
        CheckKind::FileStat(f) => format!("stat of {}", f.paths.join(" ")),
        CheckKind::AuthKey(k) => format!("stat of {}", k.path),
        CheckKind::Process(_) => "read of /proc".into(),
        CheckKind::Command(c) => format!("command {}", c.argv.join(" ")),
        CheckKind::Mcelog(c) => format!("command {}", c.argv.join(" ")),
        CheckKind::PsResource(_) | CheckKind::PsUsers(_) | CheckKind::Kswapd(_) => {
            "read of /proc".into()
        }
        CheckKind::NetSocket(_) => "read of /proc/net".into(),
        CheckKind::Ping(p) => format!("ping of {}", p.target),
        CheckKind::Unit(u) => format!("systemd query of {}", u.unit),
        k => format!("{} check", k.family()),
    }
}

async fn run_unit(spec: &UnitSpec, ctx: &Ctx) -> Result<String, Failed> {
    let systemd = |source| Failed::Systemd {
        unit: spec.unit.clone(),
        source,
    };
    let sd = ctx.systemd().await.map_err(systemd)?;
    let state = sd
        .active_state(&spec.unit)
        .await
        .map_err(|e| systemd(Arc::new(e)))?;
    if state == spec.state {
        Ok(format!("{} is {state}", spec.unit))
    } else {
        Err(Failed::new(
            Checked::Unit(spec.unit.clone()),
            format!("{} is {state} (expected {})", spec.unit, spec.state),
        ))
    }
}

/// NHC's `-S`/`-r`/`-c` for a missing service: a systemd job on `<service>.service`.
/// The systemd unit NHC's service name stands for (`munged` → `munged.service`).
fn unit_of(service: &str) -> String {
    if service.contains('.') {
        service.to_string()
    } else {
        format!("{service}.service")
    }
}

/// Runs a service action through systemd: whether its job completed, and what happened.
async fn service_action(service: &str, action: ServiceAction, ctx: &Ctx) -> (bool, String) {
    let unit = unit_of(service);
    if let Err(m) = crate::systemd::validate_unit_name(&unit) {
        return (false, format!("no action: {m}"));
    }
    let sd = match ctx.systemd().await {
        Ok(s) => s,
        Err(e) => {
            return (
                false,
                format!("{} of {unit} not possible: {e}", action.verb()),
            )
        }
    };
    let r = match action {
        ServiceAction::Start => sd.start(&unit).await,
        ServiceAction::Restart => sd.restart(&unit).await,
        ServiceAction::Cycle => match sd.stop(&unit).await {
            Ok(()) => sd.start(&unit).await,
            Err(e) => Err(e),
        },
        ServiceAction::Stop => sd.stop(&unit).await,
        ServiceAction::None
        | ServiceAction::Kill
        | ServiceAction::Command
        | ServiceAction::CommandWhenFound => return (false, String::new()),
    };
    match r {
        Ok(()) => (true, format!("{} {unit}: done", action.verb())),
        Err(e) => (false, format!("{} {unit} failed: {e}", action.verb())),
    }
}

/// NHC's `-k`: SIGKILL every process the check matched; whether all were killed, and
/// what happened. `-V` also needs each to be gone (or a zombie) within a second.
async fn kill_matching(p: &super::checks::ps::ProcessSpec, ctx: &Ctx) -> (bool, String) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let pids = match super::checks::ps::matching_pids(p, &ctx.facts) {
        Ok(v) => v,
        Err(e) => return (false, format!("kill not done: {e}")),
    };
    let mut notes = Vec::new();
    let mut ok = true;
    for pid in &pids {
        match i32::try_from(*pid).map(|n| kill(Pid::from_raw(n), Signal::SIGKILL)) {
            Ok(Ok(())) => notes.push(format!("killed process ID {pid} (SIGKILL)")),
            Ok(Err(e)) => {
                ok = false;
                notes.push(format!("kill -9 {pid} failed: {e}"));
            }
            Err(_) => ok = false,
        }
    }
    if ok && p.verify == Verify::Check {
        let gone = |pid: &u32| {
            std::fs::read_to_string(ctx.facts.host.proc_dir.join(format!("{pid}/stat")))
                .map(|s| {
                    s.rsplit(')')
                        .next()
                        .unwrap_or("")
                        .trim_start()
                        .starts_with('Z')
                })
                .unwrap_or(true)
        };
        // Bounded poll (SIGKILL is delivered asynchronously); 1 s at most.
        for _ in 0..100 {
            if pids.iter().all(gone) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for pid in pids.iter().filter(|p| !gone(p)) {
            ok = false;
            notes.push(format!("process {pid} still there after SIGKILL"));
        }
    }
    (ok, notes.join("; "))
}

/// Runs an async check (command, unit).
async fn run_async(
    check: Arc<Check>,
    ctx: Arc<Ctx>,
    deadline: Instant,
    run_deadline: Duration,
) -> (Outcome, Duration) {
    let start = Instant::now();
    // The check's own timeout, cut at the run deadline: a command kills itself (and its
    // cgroup) then, so nothing it started outlives the run.
    let left = deadline.saturating_duration_since(start);
    let (timeout, cut) = if left < check.timeout {
        (left.max(Duration::from_millis(1)), true)
    } else {
        (check.timeout, false)
    };
    let outcome = match &check.kind {
        CheckKind::Command(spec) => {
            // The command kills itself at the timeout; the outer limit only guards the
            // engine against a spawn that never returns.
            let limit = timeout + Duration::from_secs(2);
            let r =
                tokio::time::timeout(limit, cmd::check_command(spec, timeout, ctx.output_limit))
                    .await;
            program_outcome(r, "command", limit, cut, run_deadline, &check.kind)
        }
        CheckKind::Mcelog(spec) => {
            let limit = timeout + Duration::from_secs(2);
            let r = tokio::time::timeout(limit, hw::check_mcelog(spec, timeout, ctx.output_limit))
                .await;
            program_outcome(r, "mcelog", limit, cut, run_deadline, &check.kind)
        }
        CheckKind::PsResource(_)
        | CheckKind::PsUsers(_)
        | CheckKind::Kswapd(_)
        | CheckKind::NetSocket(_)
        | CheckKind::Ping(_) => {
            match tokio::time::timeout(timeout, run_ps(check.clone(), &ctx, timeout)).await {
                Ok(Ok(m)) => Outcome::Pass(m),
                Ok(Err(f)) => Outcome::Fail(f.to_string()),
                Err(_) if cut => {
                    Outcome::Timeout(deadline_message(run_deadline, &what_hangs(&check.kind)))
                }
                Err(_) => Outcome::Timeout(format!(
                    "{} did not finish within {}",
                    what_hangs(&check.kind),
                    cmd::shown_duration(timeout)
                )),
            }
        }
        CheckKind::Unit(spec) => match tokio::time::timeout(timeout, run_unit(spec, &ctx)).await {
            Ok(Ok(m)) => Outcome::Pass(m),
            Ok(Err(f)) => Outcome::Fail(f.to_string()),
            Err(_) if cut => Outcome::Timeout(deadline_message(
                run_deadline,
                &format!("no answer from systemd about {}", spec.unit),
            )),
            Err(_) => Outcome::Timeout(format!(
                "no answer from systemd within {}",
                cmd::shown_duration(timeout)
            )),
        },
        k => Outcome::Fail(format!(
            "internal error: {} is not an async check",
            k.family()
        )),
    };
    (outcome, start.elapsed())
}

/// The outcome of a check that ran a program which kills itself at its timeout (a
/// message starting with [`cmd::TIMEOUT_PREFIX`]), under an outer `limit` that only guards
/// against a spawn that never returns. `cut`: the run deadline shortened its timeout.
fn program_outcome(
    r: Result<Result<String, Failed>, tokio::time::error::Elapsed>,
    what: &str,
    limit: Duration,
    cut: bool,
    run_deadline: Duration,
    kind: &CheckKind,
) -> Outcome {
    match r {
        Ok(Ok(m)) => Outcome::Pass(m),
        Ok(Err(f)) if f.is_timeout() && cut => Outcome::Timeout(deadline_message(
            run_deadline,
            &format!("{}; {f}", what_hangs(kind)),
        )),
        Ok(Err(f)) if f.is_timeout() => Outcome::Timeout(f.to_string()),
        Ok(Err(f)) => Outcome::Fail(f.to_string()),
        Err(_) => Outcome::Timeout(format!("{what} did not finish within {limit:?}")),
    }
}

/// The users running jobs on this node: the lines of `argv`'s output (NHC's `squeue -w
/// $HOSTNAME_S --noheader -o %u`); `None` when it cannot run or fails, with why.
async fn job_users(
    argv: &[String],
    timeout: Duration,
    limit: usize,
) -> Result<Vec<String>, JobUsersError> {
    match cmd::run_command(argv, timeout, limit).await {
        Ok(o) if o.code == Some(0) => Ok(String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()),
        Ok(o) => Err(match o.code {
            Some(code) => JobUsersError::Exit {
                argv: argv.to_vec(),
                code,
            },
            None => JobUsersError::Signal {
                argv: argv.to_vec(),
            },
        }),
        Err(e) => Err(e.into()),
    }
}

/// Why the users with jobs on the node are unknown: the command (`squeue`) failed.
#[derive(Debug, thiserror::Error)]
enum JobUsersError {
    /// It exited with a status other than 0.
    #[error("\"{}\" exited with status {code}", argv.join(" "))]
    Exit { argv: Vec<String>, code: i32 },
    /// A signal killed it.
    #[error("\"{}\" was killed by a signal", argv.join(" "))]
    Signal { argv: Vec<String> },
    /// It could not be started.
    #[error(transparent)]
    Command(#[from] cmd::CommandError),
}

/// The per-process and network checks (NHC's `check_ps_cpu`...
/// `check_ps_userproc_lineage`, `check_net_socket`, `check_net_ping`): reads the host on
/// a blocking thread, then takes the actions the verdict asks for (SIGKILL,
/// renice, a program run without a shell), or only reports them under `--no-act`.
async fn run_ps(check: Arc<Check>, ctx: &Ctx, timeout: Duration) -> Result<String, Failed> {
    let users = match &check.kind {
        CheckKind::PsUsers(u) if !u.jobs_command.is_empty() => {
            match job_users(&u.jobs_command, timeout, ctx.output_limit).await {
                Ok(users) => users,
                // Unlike NHC (which then treats every user as one without a job), no
                // process is judged: a controller that does not answer must not get every
                // job on the node killed or the node drained.
                Err(why) => {
                    return Ok(format!(
                        "not judged: the users with jobs on this node are unknown ({why}); \
                         no process was acted on"
                    ))
                }
            }
        }
        _ => Vec::new(),
    };
    let facts = ctx.facts.clone();
    let c = check.clone();
    let verdict = tokio::task::spawn_blocking(move || match &c.kind {
        CheckKind::PsResource(s) => psres::eval_resource(s, &facts),
        CheckKind::PsUsers(s) => psres::eval_users(s, &facts, &users),
        CheckKind::Kswapd(s) => psres::eval_kswapd(s, &facts),
        CheckKind::NetSocket(s) => net::eval_socket(s, &facts),
        CheckKind::Ping(p) => Ok(psres::Verdict {
            result: net::ping::check_ping(p),
            actions: Vec::new(),
        }),
        k => Err(Failed::WrongRunner {
            family: k.family(),
            expected: "a process check",
        }),
    })
    .await
    .map_err(|e| Failed::Task(Arc::new(e)))??;
    let mut done = Vec::new();
    if !verdict.actions.is_empty() && !ctx.service_actions {
        done.push(format!(
            "not attempted (report only): {}",
            verdict
                .actions
                .iter()
                .map(show_action)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    } else {
        for a in &verdict.actions {
            done.push(take_action(a, ctx, timeout).await);
        }
    }
    let tail = if done.is_empty() {
        String::new()
    } else {
        format!("; {}", done.join("; "))
    };
    match verdict.result {
        Ok(m) => Ok(format!("{m}{tail}")),
        Err(f) if done.is_empty() => Err(f),
        Err(f) => Err(Failed::Acted {
            inner: Box::new(f),
            done,
        }),
    }
}

/// A command's end for messages: `exit code N`, or `killed by a signal`.
fn exit_text(code: Option<i32>) -> String {
    match code {
        Some(c) => format!("exit code {c}"),
        None => "killed by a signal".to_string(),
    }
}

fn show_action(a: &psres::Action) -> String {
    match a {
        psres::Action::Kill(p) => format!("kill -9 {p}"),
        psres::Action::Renice(p, n) => format!("renice -n {n} {p}"),
        psres::Action::Run(argv) => format!("run {:?}", argv.join(" ")),
    }
}

async fn take_action(a: &psres::Action, ctx: &Ctx, timeout: Duration) -> String {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let pid_of = |p: u32| i32::try_from(p).map_err(|_| format!("PID {p} out of range"));
    match a {
        psres::Action::Kill(p) => match pid_of(*p).map(|n| kill(Pid::from_raw(n), Signal::SIGKILL))
        {
            Ok(Ok(())) => format!("killed process ID {p} (SIGKILL)"),
            Ok(Err(e)) => format!("kill -9 {p} failed: {e}"),
            Err(e) => e,
        },
        psres::Action::Renice(p, n) => {
            let r = pid_of(*p).map(|raw| {
                rustix::process::setpriority_process(rustix::process::Pid::from_raw(raw), *n)
            });
            match r {
                Ok(Ok(())) => format!("reniced process ID {p} to {n}"),
                Ok(Err(e)) => format!("renice of {p} failed: {e}"),
                Err(e) => e,
            }
        }
        psres::Action::Run(argv) => {
            let shown = argv.join(" ");
            match cmd::run_command(argv, timeout, ctx.output_limit).await {
                Ok(o) if o.code == Some(0) => format!("{shown:?} succeeded"),
                Ok(o) if o.timed_out => format!("{shown:?} did not finish; killed"),
                Ok(o) => format!("{shown:?} failed ({})", exit_text(o.code)),
                Err(e) => format!("{shown:?} not run: {e}"),
            }
        }
    }
}

/// NHC's `-S`/`-r`/`-c`: a failed process check with an action runs it within the
/// check's timeout and the run deadline. The check still fails for this run unless `-v`
/// (the action's job completed) or `-V` (the unit is active afterwards) says otherwise.
async fn after(check: &Check, outcome: Outcome, ctx: &Ctx, deadline: Instant) -> Outcome {
    match (outcome, &check.kind) {
        (Outcome::Fail(m), CheckKind::Process(p))
            if p.action != ServiceAction::None && !ctx.service_actions =>
        {
            let planned = match p.action {
                ServiceAction::Command | ServiceAction::CommandWhenFound => {
                    format!("running {:?}", p.command.join(" "))
                }
                ServiceAction::Kill => "SIGKILL of the matching processes".to_string(),
                a => format!("{} of {}", a.verb(), p.service),
            };
            Outcome::Fail(format!("{m}; {planned} not attempted (report only)"))
        }
        (Outcome::Fail(m), CheckKind::Process(p))
            if matches!(
                p.action,
                ServiceAction::Command | ServiceAction::CommandWhenFound
            ) =>
        {
            let limit = check
                .timeout
                .min(deadline.saturating_duration_since(Instant::now()));
            let shown = p.command.join(" ");
            let (ok, note) = match cmd::run_command(&p.command, limit, ctx.output_limit).await {
                Ok(o) if o.timed_out => (false, format!("{shown:?} did not finish; killed")),
                Ok(o) if o.code == Some(0) => (true, format!("{shown:?} succeeded")),
                Ok(o) => (false, format!("{shown:?} failed ({})", exit_text(o.code))),
                Err(e) => (false, format!("{shown:?} not run: {e}")),
            };
            if ok && p.verify != Verify::None {
                Outcome::Pass(format!("{m}; {note}"))
            } else {
                Outcome::Fail(format!("{m}; {note}"))
            }
        }
        (Outcome::Fail(m), CheckKind::Process(p)) if p.action == ServiceAction::Kill => {
            let (ok, note) = kill_matching(p, ctx).await;
            if ok && p.verify != Verify::None {
                Outcome::Pass(format!("{m}; {note}"))
            } else {
                Outcome::Fail(format!("{m}; {note}"))
            }
        }
        (Outcome::Fail(m), CheckKind::Process(p)) if p.action != ServiceAction::None => {
            let limit = check
                .timeout
                .min(deadline.saturating_duration_since(Instant::now()));
            let done = tokio::time::timeout(limit, async {
                let (ok, note) = service_action(&p.service, p.action, ctx).await;
                match (ok, p.verify) {
                    (true, Verify::Sync) => (true, note),
                    (true, Verify::Check) => {
                        let unit = unit_of(&p.service);
                        let want_active = p.action != ServiceAction::Stop;
                        match ctx.systemd().await {
                            Ok(sd) => match sd.active_state(&unit).await {
                                Ok(s) if (s == "active") == want_active => {
                                    (true, format!("{note}; {unit} {s}"))
                                }
                                Ok(s) => (false, format!("{note} but {unit} is not running ({s})")),
                                Err(e) => (false, format!("{note}; state of {unit} unknown: {e}")),
                            },
                            Err(e) => (false, format!("{note}; state of {unit} unknown: {e}")),
                        }
                    }
                    (_, _) => (false, note),
                }
            })
            .await
            .unwrap_or_else(|_| {
                (
                    false,
                    "service action not done: timeout or run deadline".into(),
                )
            });
            match done {
                (true, note) => Outcome::Pass(format!("{m}; {note}")),
                (false, note) => Outcome::Fail(format!("{m}; {note}")),
            }
        }
        (o, CheckKind::Mount(m)) if m.actions.any() && !matches!(o, Outcome::Timeout(_)) => {
            let limit = check
                .timeout
                .min(deadline.saturating_duration_since(Instant::now()));
            mount_after(o, m, ctx, limit).await
        }
        (o, _) => o,
    }
}

/// NHC's `check_fs_mount` actions (`-r`/`-O`, `-e`, `-E`, creating a missing mount
/// point): taken after the check, or only reported under `--no-act`. The verdict stays.
async fn mount_after(
    outcome: Outcome,
    m: &super::checks::fs::MountSpec,
    ctx: &Ctx,
    limit: Duration,
) -> Outcome {
    use super::checks::fs::{mount_actions, MountAction};
    let passed = matches!(outcome, Outcome::Pass(_));
    let in_table = !passed
        && ctx
            .facts
            .mounts()
            .map(|t| t.iter().any(|e| e.target == m.path))
            .unwrap_or(false);
    // A stat of the mount point (its parent may hang): off the async threads, bounded.
    let dir_exists = if passed || in_table {
        true
    } else {
        let p = m.path.clone();
        tokio::time::timeout(
            limit,
            tokio::task::spawn_blocking(move || std::path::Path::new(&p).is_dir()),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or(true)
    };
    let actions = mount_actions(m, passed, in_table, dir_exists);
    if actions.is_empty() {
        return outcome;
    }
    let show = |a: &MountAction| match a {
        MountAction::Mkdir(p) => format!("mkdir -p -m 0755 {p}"),
        MountAction::Run(argv) => format!("run {:?}", argv.join(" ")),
    };
    let mut notes = Vec::new();
    if !ctx.service_actions {
        notes.push(format!(
            "not attempted (report only): {}",
            actions.iter().map(show).collect::<Vec<_>>().join(", ")
        ));
    } else {
        for a in &actions {
            notes.push(match a {
                MountAction::Mkdir(p) => {
                    use std::os::unix::fs::DirBuilderExt;
                    match std::fs::DirBuilder::new()
                        .recursive(true)
                        .mode(0o755)
                        .create(p)
                    {
                        Ok(()) => format!("directory {p} missing (auto-fixed)"),
                        Err(e) => format!("directory {p} missing; mkdir failed: {e}"),
                    }
                }
                MountAction::Run(argv) => {
                    let shown = argv.join(" ");
                    match cmd::run_command(argv, limit, ctx.output_limit).await {
                        Ok(o) if o.timed_out => format!("{shown:?} did not finish; killed"),
                        Ok(o) if o.code == Some(0) => format!("{shown:?} succeeded"),
                        Ok(o) => format!("{shown:?} failed ({})", exit_text(o.code)),
                        Err(e) => format!("{shown:?} not run: {e}"),
                    }
                }
            });
        }
    }
    let tail = notes.join("; ");
    match outcome {
        Outcome::Pass(msg) => Outcome::Pass(format!("{msg}; {tail}")),
        Outcome::Fail(msg) => Outcome::Fail(format!("{msg}; {tail}")),
        o => o,
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
        .map(|(i, c)| {
            (
                i,
                tokio::spawn(run_async(
                    c.clone(),
                    ctx.clone(),
                    start + env.run_deadline,
                    env.run_deadline,
                )),
            )
        })
        .collect();
    let blocking: Vec<usize> = (0..checks.len())
        .filter(|i| checks[*i].kind.is_blocking())
        .collect();
    let mut slots: Vec<Option<(Outcome, Duration)>> = (0..checks.len()).map(|_| None).collect();
    let deadline = start + env.run_deadline;
    for (i, o, d) in run_lane(
        &checks,
        blocking,
        ctx.facts.clone(),
        deadline,
        env.run_deadline,
    )
    .await
    {
        slots[i] = Some((o, d));
    }
    for (i, mut h) in handles {
        // Commands end themselves at the deadline; this limit guards against one that
        // does not.
        let limit = deadline + Duration::from_secs(3);
        slots[i] = Some(match tokio::time::timeout_at(limit.into(), &mut h).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => (
                Outcome::Fail(format!("the check panicked: {e}")),
                Duration::ZERO,
            ),
            Err(_) => {
                // Dropping the task kills the command with its cgroup.
                h.abort();
                let _ = h.await;
                (
                    Outcome::Timeout(deadline_message(
                        env.run_deadline,
                        &format!("{} stopped", what_hangs(&checks[i].kind)),
                    )),
                    start.elapsed(),
                )
            }
        });
    }
    let mut results = Vec::with_capacity(checks.len());
    for (c, slot) in checks.iter().zip(slots) {
        let (o, d) = slot.unwrap_or((
            Outcome::Fail("internal error: no result".into()),
            Duration::ZERO,
        ));
        let o = after(c, o, &ctx, deadline).await;
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
