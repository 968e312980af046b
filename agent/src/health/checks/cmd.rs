//! Commands (NHC's `check_cmd_status`, `check_cmd_output`): run without a shell, in a
//! cgroup and a process group of their own ([`crate::health::cgroup`]), killed with the
//! whole cgroup (so also a grandchild that called `setsid`) at the check's timeout, and
//! whatever they left behind killed when they end; output kept up to a bound and the rest
//! read and dropped, so a command printing megabytes neither blocks nor fills memory.
//!
//! A program named without a slash (`nvidia-smi`) is looked up in [`SAFE_PATH`], the only
//! PATH commands get, and the path found is logged and shown in the check's message.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

use super::{Checked, Failed};
use crate::health::matcher::Matcher;

/// The PATH given to commands, and used to find a program named without a slash: checks
/// run as Slurm's `HealthCheckProgram` with no PATH of their own.
pub const SAFE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Start of the failure message of a command killed at its timeout.
pub const TIMEOUT_PREFIX: &str = "timeout after ";

/// A limit as shown in reports and drain reasons: rounded to the millisecond (a limit cut
/// to the run deadline's remainder would otherwise print as `2s 999ms 878us 359ns`).
pub fn shown_duration(d: std::time::Duration) -> humantime::FormattedDuration {
    let ms = d.as_micros().div_ceil(1000);
    humantime::format_duration(std::time::Duration::from_millis(
        u64::try_from(ms).unwrap_or(u64::MAX),
    ))
}

/// A command and what its result must be.
#[derive(Debug, Clone)]
pub struct CommandSpec {
    /// Program (absolute, or looked up in [`SAFE_PATH`]) and arguments.
    pub argv: Vec<String>,
    /// Expected exit status.
    pub status: i32,
    /// Expressions over stdout lines: each positive one must match a line, no line may
    /// match a negated one.
    pub matches: Vec<Matcher>,
    /// NHC's `-C`: the name failures are reported under (`name: message`).
    pub check_name: Option<String>,
    /// NHC's `-M`: the failure message of the match at the same position, with `%m` (the
    /// expression), `%l` (the line number, for a negated match), `%c` (the command) and
    /// `%f` (how many expressions failed to match).
    pub messages: Vec<String>,
}

/// Resolves a program name against [`SAFE_PATH`].
pub fn resolve_program(name: &str) -> Option<std::path::PathBuf> {
    resolve_program_in(name, SAFE_PATH)
}

/// Resolves a program name against `path` (`:`-separated; only absolute folders count, never
/// the working directory's); a name with a `/` is taken as it is.
pub fn resolve_program_in(name: &str, path: &str) -> Option<std::path::PathBuf> {
    if name.contains('/') {
        return Some(std::path::PathBuf::from(name));
    }
    path.split(':')
        .filter(|d| d.starts_with('/'))
        .map(|d| std::path::Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// Reads `r` to the end within `limit` bytes: all of it when it fits; otherwise its first
/// half (cut after the last whole line) and its last half (from its first whole line),
/// joined by a newline, so that the newest lines of a long output (`dmesg`) are seen as
/// well as its head. Returns (kept, total read).
async fn read_bounded<R: AsyncRead + Unpin>(mut r: R, limit: usize) -> (Vec<u8>, u64) {
    let mut head = Vec::new();
    let mut tail = std::collections::VecDeque::new();
    let half = limit / 2;
    let mut total = 0u64;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                total += n as u64;
                let room = limit.saturating_sub(head.len());
                head.extend_from_slice(&buf[..n.min(room)]);
                tail.extend(&buf[..n]);
                let excess = tail.len().saturating_sub(half);
                tail.drain(..excess);
            }
        }
    }
    if total <= limit as u64 {
        return (head, total);
    }
    head.truncate(half);
    if let Some(nl) = head.iter().rposition(|b| *b == b'\n') {
        head.truncate(nl + 1);
    }
    let tail: Vec<u8> = tail.into_iter().collect();
    let from = tail
        .iter()
        .position(|b| *b == b'\n')
        .map_or(tail.len(), |i| i + 1);
    if !head.is_empty() && !head.ends_with(b"\n") {
        head.push(b'\n');
    }
    head.extend_from_slice(&tail[from..]);
    (head, total)
}

/// What a command did.
#[derive(Debug, Clone)]
pub struct CommandOutcome {
    /// Exit code; `None` when killed by a signal.
    pub code: Option<i32>,
    /// Killed at the timeout.
    pub timed_out: bool,
    /// Stdout, or its first and last lines when longer than the output limit.
    pub stdout: Vec<u8>,
    /// Bytes of stdout in all.
    pub stdout_total: u64,
    /// First bytes of stderr.
    pub stderr: Vec<u8>,
    /// Process id of the command (its process group id too).
    pub pid: u32,
    /// The program run (after the PATH lookup).
    pub program: std::path::PathBuf,
    /// Where it ran: its cgroup, or why it had none (process group only).
    pub confinement: String,
}

/// A command that could not be started; each variant names the program.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CommandError {
    /// An empty argv.
    #[error("no command given")]
    NoCommand,
    /// A bare program name not found in [`SAFE_PATH`].
    #[error("{program}: not found in {SAFE_PATH}")]
    NotFound {
        /// The name.
        program: String,
    },
    /// The program could not be started.
    #[error("starting {}: {source}", program.display())]
    Start {
        /// The program (after the PATH lookup).
        program: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::sync::Arc<std::io::Error>,
    },
    /// No runtime could be made to run it from a blocking check.
    #[error("running {program}: no runtime: {source}")]
    Runtime {
        /// The program as given.
        program: String,
        /// Why.
        #[source]
        source: std::sync::Arc<std::io::Error>,
    },
}

/// [`run_command`] from a blocking check (a worker thread of the engine's, outside any
/// runtime): on a runtime of its own, made on this thread, or on one more thread when the
/// caller is inside a runtime already (a runtime never nests).
///
/// # Errors
/// [`CommandError`]: the program could not be started, or no runtime could be made.
pub fn run_command_blocking(
    argv: &[String],
    timeout: Duration,
    output_limit: usize,
) -> Result<CommandOutcome, CommandError> {
    let run = |argv: &[String]| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| CommandError::Runtime {
                program: argv.first().cloned().unwrap_or_default(),
                source: std::sync::Arc::new(e),
            })?;
        rt.block_on(run_command(argv, timeout, output_limit))
    };
    if tokio::runtime::Handle::try_current().is_err() {
        return run(argv);
    }
    let argv = argv.to_vec();
    std::thread::scope(|scope| {
        scope
            .spawn(|| run(&argv))
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Runs `argv` in its own process group, with [`SAFE_PATH`], stdin from /dev/null, and
/// kills the whole group (SIGKILL) at `timeout`.
///
/// # Errors
/// [`CommandError`]: the program could not be started.
pub async fn run_command(
    argv: &[String],
    timeout: Duration,
    output_limit: usize,
) -> Result<CommandOutcome, CommandError> {
    let Some((prog, args)) = argv.split_first() else {
        return Err(CommandError::NoCommand);
    };
    let program = resolve_program(prog).ok_or_else(|| CommandError::NotFound {
        program: prog.clone(),
    })?;
    if !prog.contains('/') {
        tracing::info!(
            "command {prog} resolved to {} (PATH {SAFE_PATH})",
            program.display()
        );
    }
    let build = || {
        let mut cmd = tokio::process::Command::new(&program);
        cmd.args(args)
            .env("PATH", SAFE_PATH)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        cmd
    };
    let starting = |e: std::io::Error| CommandError::Start {
        program: program.clone(),
        source: std::sync::Arc::new(e),
    };
    // The child joins its cgroup before exec (CmdCgroup::join_before_exec); where no
    // cgroup can be made or joined, the command runs in its process group only.
    let confined = crate::health::cgroup::CmdCgroup::create()
        .and_then(|cg| cg.open_procs().map(|procs| (cg, procs)));
    let (mut child, cgroup, confinement) = match confined {
        Ok((cg, procs)) => {
            let mut cmd = build();
            crate::health::cgroup::CmdCgroup::join_before_exec(&mut cmd, &procs);
            match cmd.spawn() {
                Ok(child) => {
                    let c = format!("cgroup {}", cg.dir().display());
                    (child, Some(cg), c)
                }
                // Joining failed (the program never ran), or the program cannot start:
                // once more without the cgroup, which tells them apart.
                Err(e) => {
                    let child = build().spawn().map_err(starting)?;
                    let c = format!("process group only (joining {}: {e})", cg.dir().display());
                    (child, None, c)
                }
            }
        }
        Err(e) => (
            build().spawn().map_err(starting)?,
            None,
            format!("process group only ({e})"),
        ),
    };
    let pid = child.id().unwrap_or(0);
    if cgroup.is_none() {
        tracing::debug!("command {}: {confinement}", program.display());
    }
    let out = child.stdout.take();
    let err = child.stderr.take();
    let out_task = tokio::spawn(async move {
        match out {
            Some(o) => read_bounded(o, output_limit).await,
            None => (Vec::new(), 0),
        }
    });
    let err_task = tokio::spawn(async move {
        match err {
            Some(e) => read_bounded(e, 4096).await,
            None => (Vec::new(), 0),
        }
    });
    let (status, timed_out) = match tokio::time::timeout(timeout, child.wait()).await {
        Ok(s) => (s.ok(), false),
        Err(_) => {
            if let Some(cg) = &cgroup {
                cg.kill();
            }
            kill_group(pid);
            (child.wait().await.ok(), true)
        }
    };
    // What the command left behind in its cgroup dies with it (the cgroup is removed on
    // drop). Without a cgroup the group is left alone after a normal exit (its pid may be
    // reused once reaped). Children still holding the pipes must not hold the check: wait
    // a short grace only.
    if let Some(cg) = &cgroup {
        cg.kill();
    }
    let grace = Duration::from_millis(200);
    let (stdout, stdout_total) = tokio::time::timeout(grace, out_task)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    let (stderr, _) = tokio::time::timeout(grace, err_task)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    Ok(CommandOutcome {
        code: status.and_then(|s| s.code()),
        timed_out,
        stdout,
        stdout_total,
        stderr,
        pid,
        program,
        confinement,
    })
}

fn kill_group(pid: u32) {
    if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
        // ESRCH (group already gone) is fine.
        let _ = rustix::process::kill_process_group(p, rustix::process::Signal::KILL);
    }
}

/// Runs a command check.
///
/// # Errors
/// [`Failed`]: what is wrong, in NHC's words; NHC's `-C` name first
/// ([`Failed::Named`]) unless it is a timeout ([`Failed::is_timeout`]).
pub async fn check_command(
    spec: &CommandSpec,
    timeout: Duration,
    output_limit: usize,
) -> Result<String, Failed> {
    match (
        run_and_judge(spec, timeout, output_limit).await,
        &spec.check_name,
    ) {
        // A timeout keeps its prefix first: the engine recognises it by it.
        (Err(f), Some(name)) if !f.is_timeout() => Err(Failed::Named {
            name: name.clone(),
            inner: Box::new(f),
        }),
        (r, _) => r,
    }
}

/// NHC's `-M` message for match `i`, with its `%` fields filled in.
fn custom_message(spec: &CommandSpec, i: usize, line: usize, failed: usize) -> Option<String> {
    let m = spec.matches.get(i)?;
    let expr = m.as_str().strip_prefix('!').unwrap_or(m.as_str());
    Some(
        spec.messages
            .get(i)?
            .replace("%m", expr)
            .replace("%l", &line.to_string())
            .replace("%c", &spec.argv.join(" "))
            .replace("%f", &failed.to_string()),
    )
}

async fn run_and_judge(
    spec: &CommandSpec,
    timeout: Duration,
    output_limit: usize,
) -> Result<String, Failed> {
    let fail = |m: String| Failed::new(Checked::Command(spec.argv.clone()), m);
    let shown = spec.argv.join(" ");
    let o = run_command(&spec.argv, timeout, output_limit).await?;
    if o.timed_out {
        return Err(Failed::TimedOut {
            argv: spec.argv.clone(),
            timeout,
            killed: format!(
                " ({}); killed with its {}",
                o.program.display(),
                if o.confinement.starts_with("cgroup") {
                    o.confinement.clone()
                } else {
                    format!("process group {} ({})", o.pid, o.confinement)
                }
            ),
        });
    }
    let stderr = String::from_utf8_lossy(&o.stderr).trim().to_string();
    match o.code {
        Some(c) if c == spec.status => {}
        Some(c) => {
            return Err(fail(format!(
                "{c} (expected {}) returned by {shown:?}{}",
                spec.status,
                if stderr.is_empty() {
                    String::new()
                } else {
                    format!(": {}", stderr.lines().next().unwrap_or(""))
                }
            )))
        }
        None => return Err(fail(format!("{shown:?} killed by a signal"))),
    }
    let text = String::from_utf8_lossy(&o.stdout);
    let truncated = o.stdout_total > o.stdout.len() as u64;
    let mut matched = vec![false; spec.matches.len()];
    for (n, line) in text.lines().enumerate() {
        for (i, m) in spec.matches.iter().enumerate() {
            if m.is_negated() {
                if m.matches_ignoring_negation(line) {
                    if let Some(custom) = custom_message(spec, i, n + 1, 0) {
                        return Err(fail(custom));
                    }
                    return Err(fail(format!(
                        "{:?} matched at line {} output by {shown:?}",
                        &m.as_str()[1..],
                        n + 1
                    )));
                }
            } else if !matched[i] && m.matches(line) {
                matched[i] = true;
            }
        }
    }
    let failed = spec
        .matches
        .iter()
        .zip(&matched)
        .filter(|(m, ok)| !m.is_negated() && !**ok)
        .count();
    for (i, (m, ok)) in spec.matches.iter().zip(&matched).enumerate() {
        if !m.is_negated() && !ok {
            if let Some(custom) = custom_message(spec, i, 0, failed) {
                return Err(fail(custom));
            }
            let note = if truncated {
                format!(
                    " (output of {} bytes cut to its first and last lines, {} bytes)",
                    o.stdout_total,
                    o.stdout.len()
                )
            } else {
                String::new()
            };
            return Err(fail(format!(
                "{:?} failed to match {shown:?} output{note}",
                m.as_str()
            )));
        }
    }
    let mut msg = format!(
        "{shown:?} ({}) returned {}",
        o.program.display(),
        spec.status
    );
    if truncated {
        msg.push_str(&format!(
            "; output {} bytes, kept its first and last lines ({} bytes)",
            o.stdout_total,
            o.stdout.len()
        ));
    }
    Ok(msg)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::read_bounded;

    #[tokio::test]
    async fn long_output_keeps_its_first_and_last_whole_lines() {
        let text: String = (0..10_000).map(|i| format!("line {i}\n")).collect();
        let (kept, total) = read_bounded(text.as_bytes(), 1000).await;
        assert_eq!(total, text.len() as u64);
        assert!(kept.len() <= 1001, "{}", kept.len());
        let kept = String::from_utf8(kept).unwrap();
        let lines: Vec<&str> = kept.lines().collect();
        assert_eq!(lines.first(), Some(&"line 0"));
        // The newest line is kept (dmesg's last messages), and every kept line is whole.
        assert_eq!(lines.last(), Some(&"line 9999"));
        assert!(
            lines.iter().all(|l| l
                .strip_prefix("line ")
                .is_some_and(|n| n.parse::<u32>().is_ok())),
            "{kept}"
        );
        assert!(!kept.contains("line 5000\n"), "the middle is left out");

        // Within the limit: all of it, as it was.
        let (kept, total) = read_bounded(&b"a\nb"[..], 1000).await;
        assert_eq!((kept.as_slice(), total), (&b"a\nb"[..], 3));
    }
}
