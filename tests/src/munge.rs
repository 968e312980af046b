//! One munged for every test on this machine, on munge's default socket.
//!
//! Configless slurmd cannot learn a custom munge socket before it has its configuration,
//! so munged must listen on the default socket `/run/munge/munge.socket.2`, and there is
//! only one of it. All tests (threads of one test binary, and several test binaries or
//! `cargo test` runs at once) therefore share one munged with one key,
//! [`SHARED_KEY`](Munge::key_path), and this module arranges that with two lock files in
//! [`RUN_DIR`]:
//!
//! - `munge.start.lock`: held exclusively (flock) while a process checks for and, if
//!   needed, starts munged, so two processes never start two.
//! - `munge.users.lock`: every process that uses munged holds a *shared* flock on it for
//!   the rest of its life (the file stays open in a `static`; the kernel drops the lock
//!   when the process exits, however it exits).
//!
//! munged is started under a tiny `sh` supervisor that waits for an *exclusive* lock on
//! `munge.users.lock`, which it gets only once the last user process has exited; it then
//! stops munged (SIGTERM, and waits for it) while still holding the lock, so a newcomer
//! cannot attach to a munged that is going away. A newcomer takes its shared lock before
//! looking, so it either sees a live munged that will stay, or none and starts one.
//! Result: munged lives exactly as long as some test process needs it and nothing stays
//! behind; a later run reuses the same key file (created once with `mungekey`).
//!
//! A munged on the default socket that this module did not start (a system one, another
//! tool's) is an error: its key is unknown, so agents under test could not be given it.

use std::fs::{self, File, Permissions};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rustix::fs::{flock, FlockOperation};

use crate::process::{run_ok, run_with_timeout, tail_file, wait_until};

/// Folder for the shared munged's key, seed, log, pid file and lock files.
pub const RUN_DIR: &str = "/run/slurm-e2e";

/// munge's default socket, the only one configless slurmd can use.
pub const DEFAULT_SOCKET: &str = "/run/munge/munge.socket.2";

/// The marker in the supervisor's command line (its `$0`).
const SUPERVISOR_NAME: &str = "slurm-e2e-munge-supervisor";

/// Starts munged (`"$@"`), waits for the exclusive users lock, then stops munged.
const SUPERVISOR_SCRIPT: &str = r#"set -u
users=$1; shift
"$@" &
pid=$!
exec 9<"$users"
flock -x 9
kill -TERM "$pid" 2>/dev/null
wait "$pid"
"#;

/// How long to wait for the start lock (another process may be starting munged).
const LOCK_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a freshly started munged gets to answer (it takes about 20 ms here).
const START_TIMEOUT: Duration = Duration::from_secs(15);

/// The munged shared by all tests on this machine; see the module docs.
#[derive(Debug)]
pub struct Munge {
    key_path: PathBuf,
    pid: u32,
    /// Holds the shared users lock for as long as this process lives.
    _users_lock: File,
}

static SHARED: OnceLock<Munge> = OnceLock::new();
static INIT: Mutex<()> = Mutex::new(());

impl Munge {
    /// The shared munged: attaches to the running one or starts it (see the module docs).
    /// Cheap after the first call in a process.
    pub fn shared() -> Result<&'static Munge> {
        if let Some(m) = SHARED.get() {
            return Ok(m);
        }
        let _guard = INIT.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = SHARED.get() {
            return Ok(m);
        }
        let m = attach_or_start()?;
        Ok(SHARED.get_or_init(|| m))
    }

    /// The key munged uses (`/run/slurm-e2e/munge.key`, 128 random bytes, mode 0600).
    pub fn key_path(&self) -> &Path {
        &self.key_path
    }

    /// The key's bytes, e.g. to store in moto for the agent to fetch.
    pub fn key(&self) -> Result<Vec<u8>> {
        fs::read(&self.key_path).with_context(|| format!("reading {}", self.key_path.display()))
    }

    /// munged's socket ([`DEFAULT_SOCKET`]).
    pub fn socket(&self) -> &Path {
        Path::new(DEFAULT_SOCKET)
    }

    /// munged's process id when this process attached to it.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Encodes a credential with `munge -n` and decodes it with `unmunge`; returns
    /// unmunge's report (`STATUS: Success (0)`, ...).
    pub fn roundtrip(&self) -> Result<String> {
        let mut munge = Command::new("munge");
        munge.args(["-n", "-S", DEFAULT_SOCKET]);
        let cred = run_ok(munge, Duration::from_secs(10))?;
        let mut child = Command::new("unmunge")
            .args(["-S", DEFAULT_SOCKET])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting unmunge")?;
        child
            .stdin
            .take()
            .context("unmunge's stdin is piped")?
            .write_all(cred.as_bytes())
            .context("writing the credential to unmunge")?;
        let out = child.wait_with_output().context("waiting for unmunge")?;
        let report = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            bail!(
                "unmunge failed with {}: {}{}",
                out.status,
                report,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(report)
    }
}

fn path(name: &str) -> PathBuf {
    Path::new(RUN_DIR).join(name)
}

fn make_dir(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    fs::set_permissions(dir, Permissions::from_mode(0o755))
        .with_context(|| format!("setting mode 0755 on {} (munged demands it)", dir.display()))
}

fn open_lock(p: &Path) -> Result<File> {
    File::options()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(p)
        .with_context(|| format!("opening lock file {}", p.display()))
}

/// Takes a flock without blocking forever.
fn lock(file: &File, op: FlockOperation, what: &Path) -> Result<()> {
    wait_until(
        &format!("a lock on {}", what.display()),
        LOCK_TIMEOUT,
        Duration::from_millis(20),
        || match flock(file, op) {
            Ok(()) => Ok(Some(())),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
            Err(e) => Err(e.into()),
        },
    )
}

/// munged's command line, NUL-separated arguments.
fn cmdline(pid: u32) -> Option<Vec<String>> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

fn parent_pid(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ppid ...; comm may contain spaces, so split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    if state == "Z" {
        return None;
    }
    fields.next()?.parse().ok()
}

/// The pid of the munged this module started, if it is alive and still supervised.
/// A live one without its supervisor (killed by hand) is stopped so a supervised one
/// can take its place.
fn ours_running(key: &Path) -> Option<u32> {
    let pid: u32 = fs::read_to_string(path("munged.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let args = cmdline(pid)?;
    let key_arg = format!("--key-file={}", key.display());
    if !args.contains(&key_arg) {
        return None;
    }
    let ppid = parent_pid(pid)?;
    let supervised = cmdline(ppid).is_some_and(|a| a.iter().any(|x| x == SUPERVISOR_NAME));
    if !supervised {
        if let Ok(p) = crate::process::pid_of(pid) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
            let _ = wait_until(
                "an unsupervised munged to exit",
                Duration::from_secs(5),
                Duration::from_millis(20),
                || Ok(parent_pid(pid).is_none().then_some(())),
            );
        }
        return None;
    }
    Some(pid)
}

/// Whether something answers on the default socket.
fn socket_answers() -> bool {
    let mut cmd = Command::new("munge");
    cmd.args(["-n", "-S", DEFAULT_SOCKET]);
    run_with_timeout(cmd, Duration::from_secs(5)).is_ok_and(|o| o.status.success())
}

fn attach_or_start() -> Result<Munge> {
    let run_dir = Path::new(RUN_DIR);
    make_dir(run_dir)?;
    make_dir(Path::new("/run/munge"))?;
    let start_path = path("munge.start.lock");
    let start_lock = open_lock(&start_path)?;
    lock(
        &start_lock,
        FlockOperation::NonBlockingLockExclusive,
        &start_path,
    )?;
    let users_path = path("munge.users.lock");
    let users_lock = open_lock(&users_path)?;
    lock(
        &users_lock,
        FlockOperation::NonBlockingLockShared,
        &users_path,
    )?;

    let key_path = path("munge.key");
    if let Some(pid) = ours_running(&key_path) {
        wait_until(
            "the shared munged to answer",
            START_TIMEOUT,
            Duration::from_millis(20),
            || Ok(socket_answers().then_some(())),
        )?;
        return Ok(Munge {
            key_path,
            pid,
            _users_lock: users_lock,
        });
    }
    if socket_answers() {
        bail!(
            "a munged that slurm-e2e did not start answers on {DEFAULT_SOCKET}; its key is \
             unknown to the tests. Stop it (its pid is in /run/munge/munged.pid if it is \
             the system one) and run the tests again"
        );
    }

    if !key_path.exists() {
        let mut cmd = Command::new("mungekey");
        cmd.arg("-c").arg("-k").arg(&key_path);
        run_ok(cmd, Duration::from_secs(30)).context("creating the shared munge key")?;
    }
    fs::set_permissions(&key_path, Permissions::from_mode(0o600))
        .with_context(|| format!("setting mode 0600 on {}", key_path.display()))?;
    let pid_file = path("munged.pid");
    let _ = fs::remove_file(&pid_file);
    let log_file = path("munged.log");
    let out = File::options()
        .create(true)
        .append(true)
        .open(path("supervisor.log"))
        .context("opening the munge supervisor's log")?;
    let err = out.try_clone().context("duplicating a log file handle")?;
    // The supervisor outlives this process on purpose (see the module docs). Its own
    // process group keeps a Ctrl-C to `cargo test` from reaching it directly.
    let mut supervisor = Command::new("sh");
    supervisor
        .arg("-c")
        .arg(SUPERVISOR_SCRIPT)
        .arg(SUPERVISOR_NAME)
        .arg(&users_path)
        .arg("munged")
        .arg("-F")
        .arg(format!("--key-file={}", key_path.display()))
        .arg(format!("--seed-file={}", path("munged.seed").display()))
        .arg(format!("--log-file={}", log_file.display()))
        .arg(format!("--pid-file={}", pid_file.display()))
        .arg(format!("--socket={DEFAULT_SOCKET}"))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    let mut child = supervisor.spawn().context("starting munged's supervisor")?;
    let started = Instant::now();
    let pid = wait_until(
        "the shared munged to start and answer",
        START_TIMEOUT,
        Duration::from_millis(10),
        || {
            if let Some(st) = child.try_wait()? {
                bail!(
                    "munged's supervisor exited with {st}; munged log:\n{}\nsupervisor log:\n{}",
                    tail_file(&log_file, 20),
                    tail_file(&path("supervisor.log"), 20)
                );
            }
            Ok(ours_running(&key_path).filter(|_| socket_answers()))
        },
    )?;
    // The supervisor is left running; this process never waits for it (it is reaped by
    // init when this process exits).
    drop(child);
    eprintln!(
        "slurm-e2e: started the shared munged (pid {pid}) in {:?}",
        started.elapsed()
    );
    Ok(Munge {
        key_path,
        pid,
        _users_lock: users_lock,
    })
}
