//! Running Packer: finding the binary and its version, checking a template's
//! `required_version`, `packer init` (the template's `required_plugins`), `packer fmt
//! -check`, `packer validate`, and `packer build -machine-readable` with a full log,
//! progress, and clean cancellation.
//!
//! Packer runs with this program's environment, so `PACKER_PLUGIN_PATH` (where `packer
//! init` installs plugins and where validate and build look for them) reaches every call.
//!
//! Cancellation: Packer (1.6.6 at least) runs as a wrapper process and a child; the wrapper
//! does not forward a SIGINT sent to it alone, Packer expects the terminal's SIGINT to the
//! whole process group. So packer runs in its own process group, and a SIGINT or SIGTERM
//! to this program becomes one SIGINT to that group; Packer then cancels its builds and
//! cleans up ("Cleanly cancelled builds after being interrupted"). Whatever is left of the
//! group after Packer exits is killed, so no process outlives the build.

use crate::error::{Error, Result};
use crate::machine_readable::{parse_line, Event, RunSummary, UiLevel};
use crate::template::RequiredPlugin;
use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

/// How long Packer gets to clean up (terminate instances, delete temporary keys) after
/// the SIGINT before its process group is killed. Cleaning up an EC2 build takes a few
/// minutes at worst; killing earlier would leave instances behind.
pub const CANCEL_GRACE: Duration = Duration::from_secs(600);

/// How many of Packer's last output lines a failed `packer init` reports.
const INIT_TAIL_LINES: usize = 20;

/// Where `packer init` installs plugins and Packer looks for them, in words: the
/// `PACKER_PLUGIN_PATH` environment variable when set, else Packer's default folder
/// (Packer docs, "packer init": `$HOME/.config/packer/plugins` on Unix).
pub fn plugin_dir() -> String {
    match std::env::var_os("PACKER_PLUGIN_PATH").filter(|v| !v.is_empty()) {
        Some(dir) => format!("PACKER_PLUGIN_PATH={}", dir.to_string_lossy()),
        None => "Packer's default plugin folder (~/.config/packer/plugins; PACKER_PLUGIN_PATH is not set)".into(),
    }
}

/// A semantic-ish version `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u64, pub u64, pub u64);

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

impl Version {
    /// Parse `1.6.6`, `v1.11.2`, `1.10` (missing parts are 0; suffixes like `-dev` dropped).
    pub fn parse(s: &str) -> Option<Version> {
        let s = s.trim().trim_start_matches('v');
        let core = s.split(['-', '+', ' ']).next()?;
        let mut parts = core.split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next().map_or(Some(0), |p| p.parse().ok())?;
        let patch = parts.next().map_or(Some(0), |p| p.parse().ok())?;
        Some(Version(major, minor, patch))
    }

    /// The version in `packer version` output (`Packer v1.6.6`, first line).
    pub fn from_packer_output(out: &str) -> Option<Version> {
        out.split_whitespace()
            .find(|w| w.starts_with('v') && w[1..].starts_with(|c: char| c.is_ascii_digit()))
            .or_else(|| {
                out.split_whitespace()
                    .find(|w| w.starts_with(|c: char| c.is_ascii_digit()))
            })
            .and_then(Version::parse)
    }

    /// Whether this version meets a constraint such as `>= 1.10.0` or `>= 1.7, < 2.0`
    /// (operators `=`, `!=`, `>`, `>=`, `<`, `<=`, `~>`, comma-separated). `None` when the
    /// constraint cannot be read.
    pub fn satisfies(&self, constraint: &str) -> Option<bool> {
        for part in constraint.split(',') {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let (op, rest) = ["~>", ">=", "<=", "!=", ">", "<", "="]
                .iter()
                .find_map(|op| part.strip_prefix(op).map(|r| (*op, r)))
                .unwrap_or(("=", part));
            let v = Version::parse(rest)?;
            let ok = match op {
                ">=" => *self >= v,
                "<=" => *self <= v,
                ">" => *self > v,
                "<" => *self < v,
                "!=" => *self != v,
                "~>" => {
                    // ~> 1.2.3 means >= 1.2.3, < 1.3; ~> 1.2 means >= 1.2, < 2.
                    let segments = rest.trim().split('.').count();
                    let upper = if segments >= 3 {
                        Version(v.0, v.1 + 1, 0)
                    } else {
                        Version(v.0 + 1, 0, 0)
                    };
                    *self >= v && *self < upper
                }
                _ => *self == v,
            };
            if !ok {
                return Some(false);
            }
        }
        Some(true)
    }
}

/// The Packer binary to run.
#[derive(Debug, Clone)]
pub struct Packer {
    /// Resolved path.
    pub program: PathBuf,
    /// Its version.
    pub version: Version,
}

fn packer_command(program: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.env("CHECKPOINT_DISABLE", "1").stdin(Stdio::null());
    cmd
}

/// Find `program` (a path, or a name searched on PATH) and read its version.
/// `required` is only used in the error message when it is missing.
pub async fn locate(program: &str, required: &str) -> Result<Packer> {
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    let found = if program.contains('/') {
        Some(PathBuf::from(program)).filter(|p| p.is_file())
    } else {
        std::env::split_paths(&path_var)
            .map(|dir| dir.join(program))
            .find(|p| p.is_file())
    };
    let missing = || Error::PackerMissing {
        program: program.to_string(),
        path: path_var.to_string_lossy().into_owned(),
        required: if required.is_empty() {
            "(any)".into()
        } else {
            required.to_string()
        },
    };
    let program_path = found.ok_or_else(missing)?;
    let out = packer_command(&program_path)
        .arg("version")
        .output()
        .await
        .map_err(|e| Error::io(format!("running {} version", program_path.display()), e))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version = Version::from_packer_output(&text).ok_or_else(|| {
        Error::BadInput(format!(
            "{} version printed no version: {:?}",
            program_path.display(),
            text.trim()
        ))
    })?;
    Ok(Packer {
        program: program_path,
        version,
    })
}

impl Packer {
    /// Error unless this Packer meets the template's `required_version`.
    pub fn require(&self, required: Option<&str>, template: &Path) -> Result<()> {
        let Some(required) = required else {
            return Ok(());
        };
        match self.version.satisfies(required) {
            Some(true) => Ok(()),
            Some(false) => Err(Error::PackerTooOld {
                found: self.version.to_string(),
                required: required.to_string(),
                program: self.program.display().to_string(),
                template: template.to_path_buf(),
            }),
            None => Err(Error::File {
                path: template.to_path_buf(),
                message: format!("required_version '{required}' is not a version constraint"),
            }),
        }
    }

    /// `packer init <template>`: install the template's `required_plugins` (Packer ≥ 1.7;
    /// call it after [`Packer::require`]). Returns what Packer printed (its "Installed
    /// plugin ..." lines; nothing when all were there already). A failure is
    /// [`Error::PackerInit`] naming the plugin(s), the exit status and the last lines
    /// Packer printed.
    pub async fn init(&self, template: &Path, plugins: &[RequiredPlugin]) -> Result<Vec<String>> {
        let out = packer_command(&self.program)
            .arg("init")
            .arg(template)
            .output()
            .await
            .map_err(|e| Error::io(format!("running {} init", self.program.display()), e))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            return Ok(stdout
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect());
        }
        let printed = format!("{stdout}\n{stderr}");
        let named: Vec<&RequiredPlugin> = plugins
            .iter()
            .filter(|p| printed.contains(&p.source))
            .collect();
        let failed: Vec<String> = if named.is_empty() {
            plugins.iter().map(ToString::to_string).collect()
        } else {
            named.iter().map(ToString::to_string).collect()
        };
        let shown = if stderr.trim().is_empty() {
            &stdout
        } else {
            &stderr
        };
        Err(Error::PackerInit {
            template: template.to_path_buf(),
            plugins: if failed.is_empty() {
                "the template's plugins".into()
            } else {
                format!("the plugin {}", failed.join(", "))
            },
            plugin_dir: plugin_dir(),
            status: exit_words(out.status),
            output: tail(shown, INIT_TAIL_LINES),
        })
    }

    /// `packer fmt -check <template>`: Ok, or the files that need formatting.
    pub async fn fmt_check(&self, template: &Path) -> Result<()> {
        let out = packer_command(&self.program)
            .args(["fmt", "-check"])
            .arg(template)
            .output()
            .await
            .map_err(|e| Error::io(format!("running {} fmt", self.program.display()), e))?;
        if out.status.success() {
            return Ok(());
        }
        Err(Error::TemplateCheck {
            check: "packer fmt -check".into(),
            template: template.to_path_buf(),
            output: format!(
                "{}{}(run `packer fmt {}` to fix)",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                template.display()
            ),
        })
    }

    /// `packer validate -var-file=<vars> <template>`.
    pub async fn validate(&self, template: &Path, var_file: &Path) -> Result<()> {
        let out = packer_command(&self.program)
            .arg("validate")
            .arg(format!("-var-file={}", var_file.display()))
            .arg(template)
            .output()
            .await
            .map_err(|e| Error::io(format!("running {} validate", self.program.display()), e))?;
        if out.status.success() {
            return Ok(());
        }
        Err(Error::TemplateCheck {
            check: "packer validate".into(),
            template: template.to_path_buf(),
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        })
    }
}

/// `exit status 1`, or the signal that ended a process.
fn exit_words(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => status.to_string(),
    }
}

/// The last `n` non-empty lines of `text`, each trimmed at the end.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.trim().is_empty())
        .collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// What became of a build run.
#[derive(Debug)]
pub struct BuildOutcome {
    /// Packer's exit code (None when killed by a signal).
    pub exit_code: Option<i32>,
    /// Events gathered from its output.
    pub summary: RunSummary,
    /// The signal that cancelled it, if any.
    pub cancelled_by: Option<&'static str>,
    /// Last ui error lines (for the failure message).
    pub last_errors: Vec<String>,
}

/// Where progress goes: a spinner on a terminal, plain lines otherwise.
pub struct Progress {
    bar: Option<indicatif::ProgressBar>,
}

impl Progress {
    /// A spinner only when stderr is a terminal.
    pub fn for_stderr() -> Progress {
        if std::io::stderr().is_terminal() {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.enable_steady_tick(Duration::from_millis(120));
            Progress { bar: Some(bar) }
        } else {
            Progress { bar: None }
        }
    }

    /// Show one step heading or message.
    pub fn ui(&self, level: UiLevel, text: &str) {
        let text = text.trim();
        if text.is_empty() {
            return;
        }
        match &self.bar {
            Some(bar) => match level {
                UiLevel::Say => bar.set_message(text.replace('\n', " ")),
                UiLevel::Error => bar.println(text),
                UiLevel::Message => {}
            },
            None => eprintln!("{text}"),
        }
    }

    /// Remove the spinner.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// Run `packer build -machine-readable <args>` in `cwd`, writing everything it prints to
/// `log_path`, showing progress, and cancelling it cleanly on SIGINT or SIGTERM.
pub async fn build(
    packer: &Packer,
    args: &[OsString],
    cwd: &Path,
    log_path: &Path,
    progress: &Progress,
) -> Result<BuildOutcome> {
    use tokio::signal::unix::{signal, SignalKind};

    let mut sigint =
        signal(SignalKind::interrupt()).map_err(|e| Error::io("installing SIGINT handler", e))?;
    let mut sigterm =
        signal(SignalKind::terminate()).map_err(|e| Error::io("installing SIGTERM handler", e))?;

    if let Some(dir) = log_path.parent() {
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    }
    let mut log = tokio::fs::File::create(log_path)
        .await
        .map_err(|e| Error::io(format!("creating log {}", log_path.display()), e))?;

    let mut cmd = packer_command(&packer.program);
    cmd.arg("build")
        .arg("-machine-readable")
        .args(args)
        .current_dir(cwd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::io(format!("starting {}", packer.program.display()), e))?;
    let pid = child
        .id()
        .ok_or_else(|| Error::Build("packer exited before it could be watched".into()))?;
    let group = PackerGroup::new(pid);
    let header =
        format!(
        "# slurm-image-builder: {} build -machine-readable {} (pid {pid}, process group {pid})\n",
        packer.program.display(),
        args.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" ")
    );
    log.write_all(header.as_bytes())
        .await
        .map_err(|e| Error::io(format!("writing {}", log_path.display()), e))?;

    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| Error::Build("no stdout pipe".into()))?;
    let stderr = child
        .stderr
        .take()
        .ok_or_else(|| Error::Build("no stderr pipe".into()))?;
    let mut out_lines = BufReader::new(stdout).lines();
    let mut err_lines = BufReader::new(stderr).lines();
    let (mut out_open, mut err_open) = (true, true);
    let mut summary = RunSummary::default();
    let mut last_errors: Vec<String> = Vec::new();
    let mut cancelled_by: Option<&'static str> = None;
    let grace = tokio::time::sleep(Duration::MAX);
    tokio::pin!(grace);

    let status = loop {
        tokio::select! {
            line = out_lines.next_line(), if out_open => match line {
                Ok(Some(line)) => {
                    write_log(&mut log, &line, log_path).await?;
                    if let Some(event) = parse_line(&line) {
                        summary.observe(&event);
                        if let Event::Ui { level, text } = &event {
                            progress.ui(*level, text);
                            if *level == UiLevel::Error {
                                last_errors.push(text.trim().to_string());
                                if last_errors.len() > 8 { last_errors.remove(0); }
                            }
                        }
                    }
                }
                _ => out_open = false,
            },
            line = err_lines.next_line(), if err_open => match line {
                Ok(Some(line)) => {
                    write_log(&mut log, &line, log_path).await?;
                    progress.ui(UiLevel::Error, &line);
                    last_errors.push(line);
                    if last_errors.len() > 8 { last_errors.remove(0); }
                }
                _ => err_open = false,
            },
            _ = sigint.recv() => {
                cancel(&group, &mut cancelled_by, "SIGINT", &mut log, log_path, grace.as_mut()).await?;
            }
            _ = sigterm.recv() => {
                cancel(&group, &mut cancelled_by, "SIGTERM", &mut log, log_path, grace.as_mut()).await?;
            }
            () = &mut grace => {
                write_log(&mut log, "# slurm-image-builder: packer did not stop in time; killing its process group", log_path).await?;
                group.kill();
                grace.as_mut().reset(tokio::time::Instant::now() + Duration::from_secs(3600));
            }
            status = child.wait(), if !out_open && !err_open => {
                break status.map_err(|e| Error::io("waiting for packer", e))?;
            }
        }
    };
    // Nothing of the build may outlive it (shell-local children, plugins).
    group.kill();
    progress.finish();
    let code = status.code();
    write_log(
        &mut log,
        &format!("# slurm-image-builder: packer exited with {status}"),
        log_path,
    )
    .await?;
    log.flush()
        .await
        .map_err(|e| Error::io(format!("writing {}", log_path.display()), e))?;
    Ok(BuildOutcome {
        exit_code: code,
        summary,
        cancelled_by,
        last_errors,
    })
}

async fn write_log(log: &mut tokio::fs::File, line: &str, path: &Path) -> Result<()> {
    log.write_all(line.as_bytes())
        .await
        .and(log.write_all(b"\n").await)
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

async fn cancel(
    group: &PackerGroup,
    cancelled_by: &mut Option<&'static str>,
    signal: &'static str,
    log: &mut tokio::fs::File,
    log_path: &Path,
    grace: std::pin::Pin<&mut tokio::time::Sleep>,
) -> Result<()> {
    if cancelled_by.is_some() {
        // A second signal: stop waiting for Packer's cleanup.
        write_log(
            log,
            &format!("# slurm-image-builder: second {signal}; killing packer"),
            log_path,
        )
        .await?;
        group.kill();
        return Ok(());
    }
    *cancelled_by = Some(signal);
    write_log(
        log,
        &format!(
            "# slurm-image-builder: {signal} received; sending SIGINT to packer's process group"
        ),
        log_path,
    )
    .await?;
    eprintln!(
        "{signal} received: cancelling the build (Packer cleans up; a second signal kills it)"
    );
    group.interrupt();
    grace.reset(tokio::time::Instant::now() + CANCEL_GRACE);
    Ok(())
}

/// Packer's process group (its pid is the group id: it was started with `process_group(0)`).
struct PackerGroup {
    pgid: Option<rustix::process::Pid>,
}

impl PackerGroup {
    fn new(pid: u32) -> Self {
        let pgid = i32::try_from(pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw);
        PackerGroup { pgid }
    }

    fn interrupt(&self) {
        if let Some(pgid) = self.pgid {
            let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::INT);
        }
    }

    fn kill(&self) {
        if let Some(pgid) = self.pgid {
            // ESRCH (nothing left) is the normal case.
            let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
        }
    }
}

impl Drop for PackerGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::{tail, Version};

    #[test]
    fn tail_keeps_the_last_non_empty_lines() {
        assert_eq!(tail("a\n\nb  \nc\n\n", 2), "b\nc");
        assert_eq!(tail("only\n", 20), "only");
        assert_eq!(tail("", 3), "");
    }

    #[test]
    fn versions_and_constraints() {
        let v = Version::from_packer_output("Packer v1.6.6\n").unwrap_or(Version(0, 0, 0));
        assert_eq!(v, Version(1, 6, 6));
        assert_eq!(v.satisfies(">= 1.10.0"), Some(false));
        assert_eq!(Version(1, 11, 2).satisfies(">= 1.10.0"), Some(true));
        assert_eq!(Version(1, 7, 0).satisfies(">= 1.7, < 2.0"), Some(true));
        assert_eq!(Version(1, 2, 9).satisfies("~> 1.2.3"), Some(true));
        assert_eq!(Version(1, 3, 0).satisfies("~> 1.2.3"), Some(false));
        assert_eq!(v.satisfies(">= banana"), None);
    }
}
