//! Waiting for cloud-init to finish before slurmd starts.
//!
//! A site's launch-time user-data script (cloud-init's `scripts-user` module, run by
//! `cloud-final.service`) must be able to prepare the node (mounts, packages, files) before
//! it takes jobs. On Debian and Ubuntu `cloud-final.service` is ordered after
//! `multi-user.target`, so ordering the bootstrap unit after it would make an ordering
//! cycle; bootstrap waits for cloud-init here instead, with `cloud-init status --wait`
//! (cloud-init docs, "CLI commands: status"), bounded by a timeout.
//!
//! Exit codes of `cloud-init status` (cloud-init 23.4 and later): 0 done, 1 a critical
//! error, 2 done with recoverable errors (older versions use 1 for every error). A missing
//! `cloud-init` program (a container, an image without it) means there is nothing to wait
//! for.
//!
//! Floor 1 (outside systems): cloud-init, run as a program; its errors' exit codes from
//! [`crate::exit`].

use std::path::PathBuf;
use std::time::Duration;

use crate::exit::Exit;

/// How long bootstrap waits for cloud-init by default: user-data scripts that install
/// packages on a fresh instance take minutes; beyond 10 minutes something is stuck and the
/// node is better reported than silently held back.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// How cloud-init ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// No `cloud-init` program here: nothing to wait for.
    NotInstalled,
    /// cloud-init finished without errors (exit 0).
    Done,
    /// cloud-init finished with recoverable errors (exit 2); its output, trimmed.
    Recoverable(String),
    /// cloud-init reported an error (exit 1, or another code); the code and its output.
    Failed {
        /// Exit code of `cloud-init status --wait` (`None` when killed by a signal).
        code: Option<i32>,
        /// What it printed, trimmed.
        detail: String,
    },
}

/// Errors of the wait.
#[derive(Debug, thiserror::Error)]
pub enum CloudInitError {
    /// cloud-init was still running at the deadline (the `status --wait` child is killed).
    #[error("cloud-init still running after {waited:?} ({program} status --wait); see /var/log/cloud-init-output.log")]
    Timeout {
        /// The program run.
        program: PathBuf,
        /// The bound.
        waited: Duration,
    },
    /// The program exists but could not be run.
    #[error("running {program} status --wait: {source}")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl CloudInitError {
    /// The exit code: temporary failure for a timeout, an OS error otherwise.
    pub fn exit(&self) -> Exit {
        match self {
            CloudInitError::Timeout { .. } => Exit::TempFail,
            CloudInitError::Spawn { .. } => Exit::OsErr,
        }
    }
}

/// `cloud-init status --wait`, bounded.
#[derive(Debug, Clone)]
pub struct CloudInit {
    /// The program: `cloud-init` on PATH, or a path (tests use a stand-in).
    pub program: PathBuf,
    /// Upper bound of the wait.
    pub timeout: Duration,
}

impl Default for CloudInit {
    fn default() -> Self {
        CloudInit {
            program: PathBuf::from("cloud-init"),
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

impl CloudInit {
    /// Wait until cloud-init has finished, at most `timeout`.
    pub async fn wait(&self) -> Result<Outcome, CloudInitError> {
        let child = tokio::process::Command::new(&self.program)
            .args(["status", "--wait"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn();
        let child = match child {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Outcome::NotInstalled),
            Err(source) => {
                return Err(CloudInitError::Spawn {
                    program: self.program.clone(),
                    source,
                })
            }
        };
        // On timeout the future (and with it the child, kill_on_drop) is dropped.
        let out = match tokio::time::timeout(self.timeout, child.wait_with_output()).await {
            Ok(Ok(out)) => out,
            Ok(Err(source)) => {
                return Err(CloudInitError::Spawn {
                    program: self.program.clone(),
                    source,
                })
            }
            Err(_) => {
                return Err(CloudInitError::Timeout {
                    program: self.program.clone(),
                    waited: self.timeout,
                })
            }
        };
        let detail = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
        .trim()
        .to_string();
        Ok(match out.status.code() {
            Some(0) => Outcome::Done,
            Some(2) => Outcome::Recoverable(detail),
            code => Outcome::Failed { code, detail },
        })
    }

    /// [`CloudInit::wait`], logging how cloud-init ended. Errors in cloud-init's own
    /// modules are logged as warnings and not fatal (the node can still serve; the site's
    /// health checks decide); only a timeout or a program that cannot run is an error.
    pub async fn wait_and_log(&self) -> Result<Outcome, CloudInitError> {
        let outcome = self.wait().await?;
        match &outcome {
            Outcome::NotInstalled => {
                tracing::info!(program = %self.program.display(), "no cloud-init here; not waiting")
            }
            Outcome::Done => tracing::info!("cloud-init finished"),
            Outcome::Recoverable(d) => {
                tracing::warn!(detail = %d, "cloud-init finished with recoverable errors")
            }
            Outcome::Failed { code, detail } => {
                tracing::warn!(?code, detail = %detail, "cloud-init reported an error; starting slurmd anyway")
            }
        }
        Ok(outcome)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::path::Path;

    /// A stand-in `cloud-init`: records its arguments and PID, prints, exits with `rc`
    /// after `sleep` seconds.
    fn standin(dir: &Path, rc: i32, sleep: u32) -> PathBuf {
        let p = dir.join("cloud-init");
        crate::fsutil::write_test_program(&p, &format!(
                "#!/bin/sh\necho \"$*\" > {d}/args\necho $$ > {d}/pid\necho 'status: done'\n[ {sleep} -eq 0 ] || exec sleep {sleep}\nexit {rc}\n",
                d = dir.display()
            ),);
        p
    }

    fn ci(program: PathBuf, timeout: Duration) -> CloudInit {
        CloudInit { program, timeout }
    }

    #[tokio::test]
    async fn done_recoverable_and_failed_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let long = Duration::from_secs(120);
        let out = ci(standin(dir.path(), 0, 0), long).wait().await.unwrap();
        assert_eq!(out, Outcome::Done);
        let args = std::fs::read_to_string(dir.path().join("args")).unwrap();
        assert_eq!(args.trim(), "status --wait");
        let out = ci(standin(dir.path(), 2, 0), long).wait().await.unwrap();
        assert_eq!(out, Outcome::Recoverable("status: done".into()));
        let out = ci(standin(dir.path(), 1, 0), long)
            .wait_and_log()
            .await
            .unwrap();
        assert_eq!(
            out,
            Outcome::Failed {
                code: Some(1),
                detail: "status: done".into()
            }
        );
    }

    #[tokio::test]
    async fn no_cloud_init_means_nothing_to_wait_for() {
        let dir = tempfile::tempdir().unwrap();
        let out = ci(dir.path().join("absent"), Duration::from_secs(5))
            .wait()
            .await
            .unwrap();
        assert_eq!(out, Outcome::NotInstalled);
    }

    #[tokio::test]
    async fn a_wait_past_the_bound_is_a_timeout_and_the_child_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let err = ci(standin(dir.path(), 0, 600), Duration::from_secs(1))
            .wait()
            .await
            .unwrap_err();
        assert!(matches!(err, CloudInitError::Timeout { .. }), "{err}");
        assert_eq!(err.exit().code(), 75);
        assert!(err.to_string().contains("status --wait"), "{err}");
        // The stand-in (now `sleep 600`) is gone: eventually, with a generous deadline.
        // (No pid file: it was killed before it got that far.)
        let Ok(pid) = std::fs::read_to_string(dir.path().join("pid")) else {
            return;
        };
        let pid: i32 = pid.trim().parse().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let alive = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| !s.contains(") Z "))
                .unwrap_or(false);
            if !alive {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "stand-in {pid} still running"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
