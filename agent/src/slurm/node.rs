//! Reading a node's state from `scontrol show node -o <NodeName>`, and changing it with
//! `scontrol update`.
//!
//! `scontrol show node -o` prints one line of `Key=Value` pairs (slurm 22.05 to 25.x); some
//! values hold spaces (`OS=Linux 6.1.0 #1 SMP ...`, `Reason=...`), so a word that does not
//! start a new `Key=` belongs to the previous value. `State=` is the base state followed by
//! `+FLAG`s, e.g. `IDLE+DYNAMIC_NORM`, `IDLE+DRAIN`, `DOWN+NOT_RESPONDING`
//! (scontrol(1), "NODE STATE").

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One node as `scontrol show node -o` describes it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeInfo {
    /// Every key and its value, as printed.
    pub fields: BTreeMap<String, String>,
}

impl NodeInfo {
    /// Parses one line of `scontrol show node -o`.
    pub fn parse(line: &str) -> NodeInfo {
        let mut fields: BTreeMap<String, String> = BTreeMap::new();
        let mut last: Option<String> = None;
        for word in line.trim().split(' ').filter(|w| !w.is_empty()) {
            let key = word.split_once('=').map(|(k, _)| k).filter(|k| {
                !k.is_empty()
                    && k.starts_with(|c: char| c.is_ascii_uppercase())
                    && k.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '/')
            });
            match (key, &last) {
                (Some(k), _) => {
                    let v = &word[k.len() + 1..];
                    fields.insert(k.to_string(), v.to_string());
                    last = Some(k.to_string());
                }
                (None, Some(prev)) => {
                    if let Some(v) = fields.get_mut(prev) {
                        v.push(' ');
                        v.push_str(word);
                    }
                }
                (None, None) => {}
            }
        }
        NodeInfo { fields }
    }

    /// `NodeName`.
    pub fn name(&self) -> &str {
        self.fields.get("NodeName").map_or("", String::as_str)
    }

    /// The full `State` value, e.g. `IDLE+DYNAMIC_NORM`.
    pub fn state(&self) -> &str {
        self.fields.get("State").map_or("", String::as_str)
    }

    /// Base state, e.g. `IDLE`, `MIXED`, `ALLOCATED`, `DOWN`, `FUTURE`.
    pub fn base_state(&self) -> &str {
        self.state()
            .split('+')
            .next()
            .unwrap_or_default()
            .trim_end_matches('*')
    }

    /// State flags, e.g. `DRAIN`, `DYNAMIC_NORM`, `NOT_RESPONDING`, `INVALID_REG`.
    pub fn flags(&self) -> impl Iterator<Item = &str> {
        self.state().split('+').skip(1)
    }

    /// Has a flag.
    pub fn has_flag(&self, flag: &str) -> bool {
        self.flags().any(|f| f == flag)
    }

    /// `Reason`, without Slurm's ` [user@time]` suffix.
    pub fn reason(&self) -> Option<&str> {
        let r = self.fields.get("Reason")?;
        let r = match r.rfind(" [") {
            Some(i) if r.ends_with(']') => &r[..i],
            _ => r.as_str(),
        };
        (!r.is_empty() && r != "(null)").then_some(r)
    }

    /// The node can take jobs: IDLE, MIXED or ALLOCATED, responding, not drained, not
    /// invalid.
    pub fn is_available(&self) -> bool {
        matches!(self.base_state(), "IDLE" | "MIXED" | "ALLOCATED")
            && !self.state().contains('*')
            && !self.flags().any(|f| {
                matches!(
                    f,
                    "DRAIN"
                        | "NOT_RESPONDING"
                        | "INVALID_REG"
                        | "INVALID"
                        | "FAIL"
                        | "MAINT"
                        | "POWERED_DOWN"
                        | "POWERING_DOWN"
                        | "POWERING_UP"
                        | "REBOOT_REQUESTED"
                        | "REBOOT_ISSUED"
                )
            })
    }
}

/// `scontrol` failed.
#[derive(Debug, thiserror::Error)]
pub enum ScontrolError {
    /// It could not be run.
    #[error("running {program}: {source}")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// It ran too long and was killed.
    #[error("{program} {args}: no answer in {timeout:?}")]
    Timeout {
        /// The program.
        program: PathBuf,
        /// Its arguments.
        args: String,
        /// The limit.
        timeout: Duration,
    },
    /// It exited non-zero.
    #[error("{program} {args}: exit {code}: {stderr}{stdout}")]
    Failed {
        /// The program.
        program: PathBuf,
        /// Its arguments.
        args: String,
        /// Exit code (-1 for a signal).
        code: i32,
        /// What it printed on stderr.
        stderr: String,
        /// What it printed on stdout.
        stdout: String,
    },
}

/// Runs `scontrol` (absolute path; never through a shell).
#[derive(Debug, Clone)]
pub struct Scontrol {
    /// Path of the `scontrol` binary.
    pub program: PathBuf,
    /// Per-call limit: a controller that does not answer must not hang the agent.
    pub timeout: Duration,
}

impl Scontrol {
    /// `scontrol` in `bin_dir`, with a 10 s limit per call.
    pub fn new(bin_dir: &Path) -> Scontrol {
        Scontrol {
            program: bin_dir.join("scontrol"),
            timeout: Duration::from_secs(10),
        }
    }

    /// Runs `scontrol <args>`, returning stdout.
    ///
    /// # Errors
    /// [`ScontrolError`].
    pub async fn run(&self, args: &[&str]) -> Result<String, ScontrolError> {
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(args)
            .kill_on_drop(true)
            .stdin(std::process::Stdio::null());
        let out = match tokio::time::timeout(self.timeout, cmd.output()).await {
            Err(_) => {
                return Err(ScontrolError::Timeout {
                    program: self.program.clone(),
                    args: args.join(" "),
                    timeout: self.timeout,
                })
            }
            Ok(Err(source)) => {
                return Err(ScontrolError::Spawn {
                    program: self.program.clone(),
                    source,
                })
            }
            Ok(Ok(o)) => o,
        };
        if !out.status.success() {
            return Err(ScontrolError::Failed {
                program: self.program.clone(),
                args: args.join(" "),
                code: out.status.code().unwrap_or(-1),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
                stdout: String::from_utf8_lossy(&out.stdout).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The node, or `None` when the controller does not know it (yet).
    ///
    /// # Errors
    /// [`ScontrolError`] for anything but "not found".
    pub async fn show_node(&self, name: &str) -> Result<Option<NodeInfo>, ScontrolError> {
        match self.run(&["show", "node", "-o", name]).await {
            Ok(out) => Ok(out.lines().map(NodeInfo::parse).find(|n| n.name() == name)),
            // 22.05 prints "Node x not found" on stdout and exits 1; later versions on stderr.
            Err(ScontrolError::Failed { stderr, stdout, .. })
                if stderr.contains("not found") || stdout.contains("not found") =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

/// Checks a drain reason: printable, no newline or control character, at most 256
/// characters (it is shown in `sinfo -R` and stored in slurmctld's state).
///
/// # Errors
/// A message saying what is wrong.
pub fn validate_reason(reason: &str) -> Result<(), String> {
    if reason.trim().is_empty() {
        return Err("the reason is empty".into());
    }
    if reason.chars().count() > 256 {
        return Err("the reason is longer than 256 characters".into());
    }
    if reason.chars().any(char::is_control) {
        return Err("the reason holds a newline or control character".into());
    }
    Ok(())
}

impl Scontrol {
    /// `scontrol update NodeName=<node> State=DRAIN Reason=<reason>`: no new jobs, running
    /// ones finish. Arguments go to scontrol as separate words, never through a shell.
    ///
    /// # Errors
    /// [`ScontrolError`]; an invalid reason is `ScontrolError::Failed` with code -1 and no
    /// call made.
    pub async fn drain(&self, node: &str, reason: &str) -> Result<(), ScontrolError> {
        if let Err(m) = validate_reason(reason) {
            return Err(ScontrolError::Failed {
                program: self.program.clone(),
                args: "update".into(),
                code: -1,
                stderr: m,
                stdout: String::new(),
            });
        }
        self.run(&[
            "update",
            &format!("NodeName={node}"),
            "State=DRAIN",
            &format!("Reason={reason}"),
        ])
        .await
        .map(drop)
    }

    /// `scontrol update NodeName=<node> State=RESUME`.
    ///
    /// # Errors
    /// [`ScontrolError`].
    pub async fn resume(&self, node: &str) -> Result<(), ScontrolError> {
        self.run(&["update", &format!("NodeName={node}"), "State=RESUME"])
            .await
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_values_with_spaces_and_reason() {
        let n = NodeInfo::parse(
            "NodeName=n1 Arch=x86_64 CoresPerSocket=1 State=IDLE+DRAIN+DYNAMIC_NORM \
             OS=Linux 6.1.0-18-amd64 #1 SMP Debian Reason=Kill task failed [root@2026-11-29T10:00:00] Comment=(null)",
        );
        assert_eq!(n.name(), "n1");
        assert_eq!(n.base_state(), "IDLE");
        assert!(n.has_flag("DRAIN"));
        assert_eq!(n.fields["OS"], "Linux 6.1.0-18-amd64 #1 SMP Debian");
        assert_eq!(n.reason(), Some("Kill task failed"));
        assert!(!n.is_available());
    }

    #[test]
    fn availability() {
        assert!(NodeInfo::parse("NodeName=a State=IDLE+DYNAMIC_NORM").is_available());
        assert!(NodeInfo::parse("NodeName=a State=MIXED").is_available());
        assert!(!NodeInfo::parse("NodeName=a State=DOWN+NOT_RESPONDING").is_available());
        assert!(!NodeInfo::parse("NodeName=a State=IDLE*").is_available());
        assert!(!NodeInfo::parse("NodeName=a State=FUTURE").is_available());
    }
}
