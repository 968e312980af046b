//! Processes and scratch space for tests: free ports, a scratch folder that survives a
//! failing test, a [`Daemon`] guard that always stops what it started, and commands run
//! with a deadline.

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rustix::process::{kill_process, kill_process_group, Pid, Signal};

/// How long a daemon gets between SIGTERM and SIGKILL when it is stopped.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// How many lines of a daemon's log are printed when a test panics.
const LOG_TAIL_LINES: usize = 40;

/// Environment variable: when set to anything but `0`, scratch folders are never deleted.
pub const KEEP_ENV: &str = "SLURM_E2E_KEEP";

/// A TCP port (20000-32767, below the kernel's ephemeral range) that was free on
/// 127.0.0.1 and 0.0.0.0 a moment ago and was not given out before by this process.
///
/// Another process may take it before the caller binds it: callers that start a daemon on
/// it retry with a new port when the daemon fails to bind.
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::Mutex;
    // Below the kernel's ephemeral range (32768-60999 by default): a port taken from that
    // range by binding port 0 can be reused as the local port of any outgoing connection
    // (to moto, the emulator, slurmctld) before the daemon it was meant for binds it, which
    // happened under a full parallel run ("Unable to bind listen port"). Random, so that
    // test processes running at once rarely pick the same port; never the same port twice
    // in one process.
    const LOW: u16 = 20000;
    const HIGH: u16 = 32767;
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..1000 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(u64::from(std::process::id()));
        let port = LOW + (h.finish() % u64::from(HIGH - LOW)) as u16;
        if given.contains(&port) {
            continue;
        }
        let free = TcpListener::bind(("0.0.0.0", port)).is_ok()
            && TcpListener::bind(("127.0.0.1", port)).is_ok();
        if free {
            given.push(port);
            return port;
        }
    }
    // Fall back to the kernel's choice.
    let listener =
        TcpListener::bind(("127.0.0.1", 0)).expect("binding 127.0.0.1:0 must always work");
    listener
        .local_addr()
        .expect("a bound listener has an address")
        .port()
}

/// A name unique in this machine for the lifetime of this process: `<prefix><pid>x<n>`,
/// lower case ASCII letters and digits only (valid as a Slurm ClusterName, a NodeName and
/// a cgroup folder name when `prefix` is).
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{}x{n}", std::process::id())
}

/// Polls `check` every `interval` until it returns `Ok(Some(value))`, or fails once
/// `timeout` has passed with `what` and the last error in the message.
///
/// `check` returning `Err` is not fatal: it is remembered and polling continues.
pub fn wait_until<T>(
    what: &str,
    timeout: Duration,
    interval: Duration,
    mut check: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    let mut last_error = None;
    loop {
        match check() {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(e) => last_error = Some(e),
        }
        if Instant::now() >= deadline {
            match last_error {
                Some(e) => bail!("timed out after {timeout:?} waiting for {what}: {e:#}"),
                None => bail!("timed out after {timeout:?} waiting for {what}"),
            }
        }
        thread::sleep(interval);
    }
}

/// A scratch folder for one test (tempfile), deleted on drop unless the test panicked or
/// [`KEEP_ENV`] is set: then it stays and its path is printed, so the logs in it can be read.
#[derive(Debug)]
pub struct TempRoot {
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
}

impl TempRoot {
    /// Creates `/tmp/<prefix>XXXXXX` (mode 0700).
    pub fn new(prefix: &str) -> Result<TempRoot> {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .context("creating a scratch folder under the temporary directory")?;
        let path = dir.path().to_path_buf();
        Ok(TempRoot {
            dir: Some(dir),
            path,
        })
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `path()/rel`, with its parent folders created.
    pub fn subdir(&self, rel: &str) -> Result<PathBuf> {
        let p = self.path.join(rel);
        fs::create_dir_all(&p).with_context(|| format!("creating {}", p.display()))?;
        Ok(p)
    }
}

impl Drop for TempRoot {
    fn drop(&mut self) {
        let keep = std::env::var(KEEP_ENV).is_ok_and(|v| v != "0");
        if let Some(dir) = self.dir.take() {
            if thread::panicking() || keep {
                let path = dir.keep();
                eprintln!("slurm-e2e: scratch folder kept: {}", path.display());
            }
        }
    }
}

/// A running daemon started by a test, stopped by PID when dropped (also while a test
/// panics).
///
/// The process gets its own process group; stdout and stderr both go to one log file.
/// Stop: SIGTERM to the process, up to [`STOP_GRACE`] to exit, then SIGKILL; after it
/// exited, SIGKILL to its process group to sweep helpers it left behind. When dropped
/// during a panic, the tail of its log is printed to stderr.
#[derive(Debug)]
pub struct Daemon {
    name: String,
    child: Child,
    log: PathBuf,
    status: Option<ExitStatus>,
    grace: Duration,
    swept: bool,
}

impl Daemon {
    /// Spawns `cmd` as daemon `name`, logging to `<log_dir>/<name>.log` (appended).
    ///
    /// stdin is `/dev/null`. The command's own stdio settings are overridden.
    ///
    /// Safety net for when no `Drop` runs (Ctrl-C on `cargo test`, a test runner killing
    /// the process): the command runs under `setpriv --pdeathsig KILL`, so the kernel
    /// kills it when the *thread* that spawned it exits. Spawn daemons in the test's own
    /// thread (the normal case), or use [`Daemon::spawn_outliving_thread`]. The program,
    /// arguments, environment changes and working folder of `cmd` are carried over;
    /// `env_clear()` is not.
    pub fn spawn(name: &str, cmd: Command, log_dir: &Path) -> Result<Daemon> {
        let mut d = Self::spawn_inner(name, with_parent_death_signal(&cmd), log_dir)?;
        // setpriv arms the signal just before it execs the command. Until then the
        // spawning thread must not exit (else the signal is tied to another thread), so
        // wait for that exec: the process's executable is neither this test binary
        // (not yet exec'd) nor setpriv.
        let own = fs::read_link("/proc/self/exe").ok();
        let exe = format!("/proc/{}/exe", d.pid());
        let _ = wait_until(
            "setpriv to exec the daemon",
            Duration::from_secs(5),
            Duration::from_millis(1),
            || {
                let execed = fs::read_link(&exe).is_ok_and(|p| {
                    Some(&p) != own.as_ref() && p.file_name() != Some(OsStr::new("setpriv"))
                });
                Ok((execed || !d.is_running()).then_some(()))
            },
        );
        Ok(d)
    }

    /// Like [`Daemon::spawn`] without the parent-death signal: the daemon may outlive the
    /// spawning thread, and is then left running if the whole process is killed.
    pub fn spawn_outliving_thread(name: &str, cmd: Command, log_dir: &Path) -> Result<Daemon> {
        Self::spawn_inner(name, cmd, log_dir)
    }

    fn spawn_inner(name: &str, mut cmd: Command, log_dir: &Path) -> Result<Daemon> {
        fs::create_dir_all(log_dir)
            .with_context(|| format!("creating log folder {}", log_dir.display()))?;
        let log = log_dir.join(format!("{name}.log"));
        let out = File::options()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening log {}", log.display()))?;
        let err = out
            .try_clone()
            .with_context(|| format!("duplicating log {}", log.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name}: {cmd:?}"))?;
        Ok(Daemon {
            name: name.to_string(),
            child,
            log,
            status: None,
            grace: STOP_GRACE,
            swept: false,
        })
    }

    /// Changes how long [`Daemon::stop`] waits after SIGTERM before SIGKILL.
    pub fn set_grace(&mut self, grace: Duration) {
        self.grace = grace;
    }

    /// The daemon's name (the log file is `<name>.log`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process id (also its process group id).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The log file with its stdout and stderr.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last `lines` lines of the log (lossy UTF-8; at most the last 64 KiB are read).
    pub fn log_tail(&self, lines: usize) -> String {
        tail_file(&self.log, lines)
    }

    /// Whether the process is still running (reaps it if it exited).
    pub fn is_running(&mut self) -> bool {
        self.exit_status().is_none()
    }

    /// The exit status once the process has exited, without waiting.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            if let Ok(Some(st)) = self.child.try_wait() {
                self.status = Some(st);
            }
        }
        self.status
    }

    /// `Ok` while running; an error with the exit status and the log tail once it exited.
    pub fn check_running(&mut self) -> Result<()> {
        match self.exit_status() {
            None => Ok(()),
            Some(st) => bail!(
                "{} (pid {}) exited with {st}; last log lines from {}:\n{}",
                self.name,
                self.pid(),
                self.log.display(),
                self.log_tail(LOG_TAIL_LINES)
            ),
        }
    }

    /// Sends a signal to the process (not its group). No effect once it exited.
    pub fn signal(&mut self, sig: Signal) -> Result<()> {
        if self.exit_status().is_some() {
            return Ok(());
        }
        let pid = pid_of(self.pid())?;
        kill_process(pid, sig).with_context(|| format!("signalling {} ({pid:?})", self.name))
    }

    /// Stops the daemon (see the type's docs) and returns how it exited. Idempotent.
    pub fn stop(&mut self) -> Result<ExitStatus> {
        let status = match self.exit_status() {
            Some(st) => st,
            None => {
                let _ = self.signal(Signal::TERM);
                let deadline = Instant::now() + self.grace;
                loop {
                    if let Some(st) = self.exit_status() {
                        break st;
                    }
                    if Instant::now() >= deadline {
                        let _ = self.child.kill();
                        let st = self
                            .child
                            .wait()
                            .with_context(|| format!("waiting for {}", self.name))?;
                        self.status = Some(st);
                        break st;
                    }
                    thread::sleep(Duration::from_millis(10));
                }
            }
        };
        // Sweep whatever else is left in its process group, once, right after reaping
        // the leader (later the id could be reused); ESRCH (nothing left) is normal.
        if !self.swept {
            self.swept = true;
            if let Ok(pgid) = pid_of(self.pid()) {
                let _ = kill_process_group(pgid, Signal::KILL);
            }
        }
        Ok(status)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let panicking = thread::panicking();
        let result = self.stop();
        if panicking {
            eprintln!(
                "slurm-e2e: ---- last {LOG_TAIL_LINES} lines of {} ({}) ----\n{}\n---- end of {} ----",
                self.name,
                self.log.display(),
                self.log_tail(LOG_TAIL_LINES),
                self.name
            );
        }
        if let Err(e) = result {
            eprintln!("slurm-e2e: stopping {}: {e:#}", self.name);
        }
    }
}

/// `setpriv --pdeathsig KILL -- <cmd>`, with `cmd`'s environment changes and folder.
fn with_parent_death_signal(cmd: &Command) -> Command {
    let mut wrapped = Command::new("setpriv");
    wrapped
        .args(["--pdeathsig", "KILL", "--"])
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => wrapped.env(k, v),
            None => wrapped.env_remove(k),
        };
    }
    if let Some(dir) = cmd.get_current_dir() {
        wrapped.current_dir(dir);
    }
    wrapped
}

/// Converts a child's id to a rustix `Pid`.
pub(crate) fn pid_of(id: u32) -> Result<Pid> {
    i32::try_from(id)
        .ok()
        .and_then(Pid::from_raw)
        .with_context(|| format!("{id} is not a valid process id"))
}

/// The last `lines` lines of a file, lossy UTF-8; empty when it cannot be read.
pub fn tail_file(path: &Path, lines: usize) -> String {
    const MAX: u64 = 64 * 1024;
    let Ok(mut f) = File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if len > MAX {
        let _ = f.seek(SeekFrom::Start(len - MAX));
    }
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Runs `cmd` to completion with stdin `/dev/null` and stdout/stderr captured, killing it
/// (and its process group) if it runs longer than `timeout`.
///
/// A non-zero exit is not an error (the caller reads `Output::status`); failing to start,
/// and running past the deadline, are.
pub fn run_with_timeout(mut cmd: Command, timeout: Duration) -> Result<Output> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
    let stdout = child.stdout.take().context("stdout is piped")?;
    let stderr = child.stderr.take().context("stderr is piped")?;
    // Each wait is a blocking call on a thread of its own, reported over a channel: the
    // caller learns of the exit when it happens, not at its next look (the bootstrap
    // benchmark times commands with this).
    let reader = |mut pipe: Box<dyn Read + Send>| {
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.read_to_end(&mut buf);
            let _ = tx.send(buf);
        });
        rx
    };
    let out_reader = reader(Box::new(stdout));
    let err_reader = reader(Box::new(stderr));
    let pid = child.id();
    let (status_tx, status_rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = status_tx.send(child.wait());
    });
    let kill_group = || {
        if let Ok(pgid) = pid_of(pid) {
            let _ = kill_process_group(pgid, Signal::KILL);
        }
    };
    let deadline = Instant::now() + timeout;
    let status = match status_rx.recv_timeout(timeout) {
        Ok(status) => status.context("waiting for a command")?,
        Err(_) => {
            kill_group();
            // Not reaped yet (the waiter still waits for it), so the id is still its own.
            if let Ok(pid) = pid_of(pid) {
                let _ = kill_process(pid, Signal::KILL);
            }
            // The waiter reaps it.
            let _ = status_rx.recv_timeout(Duration::from_secs(10));
            bail!("{cmd:?} did not finish within {timeout:?}; killed");
        }
    };
    // A grandchild that inherited the pipes can keep them open after the command exited:
    // wait for the readers until the same deadline, then give up on the output.
    let left = || deadline.saturating_duration_since(Instant::now());
    let (Ok(stdout), Ok(stderr)) = (
        out_reader.recv_timeout(left()),
        err_reader.recv_timeout(left()),
    ) else {
        kill_group();
        bail!("{cmd:?} exited with {status} but something it started kept its output open past {timeout:?}");
    };
    Ok(Output {
        status,
        stdout,
        stderr,
    })
}

/// Like [`run_with_timeout`], but a non-zero exit is an error carrying stdout and stderr;
/// returns stdout as (lossy) UTF-8.
pub fn run_ok(cmd: Command, timeout: Duration) -> Result<String> {
    let desc = format!("{cmd:?}");
    let out = run_with_timeout(cmd, timeout)?;
    if !out.status.success() {
        bail!(
            "{desc} failed with {}\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout).trim_end(),
            String::from_utf8_lossy(&out.stderr).trim_end()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
