//! Acting on a report the way NHC users expect, without fighting Slurm or an admin.
//!
//! On failure the node is drained with `<prefix><check>: <message>` unless:
//! - slurmctld does not know the node yet (slurmd not registered: nothing to drain);
//! - it is already drained or draining (by the agent: kept; by anyone else: their reason
//!   is never overwritten);
//! - it is DOWN, FAIL/FAILING, in a MAINT reservation, FUTURE, or rebooting (`^`); or
//!   Slurm's power saving owns it (`~` powered down, `%` powering down, `!` power down
//!   pending).
//!
//! Other states act normally: RESERVED (`resv`), not responding (`*`), powering up (`#`),
//! reboot requested (`@`), PLANNED, COMPLETING.
//!
//! On success the node is resumed only when it is drained with a reason starting with the
//! prefix, and not while a reboot is requested or issued (`@`, `^`: RESUME would cancel
//! the admin's reboot) or power saving owns it. An admin drain ("ADMIN SHUTDOWN") is
//! never resumed.
//!
//! A marker file in the state folder remembers that the agent drained the node, so a
//! healthy run with no marker makes no `scontrol` call at all (fast, and no load on
//! slurmctld from thousands of nodes). Without a state folder the node is always queried.
//! Race: an admin drain landing between our query and our drain is overwritten; the
//! window is one scontrol round trip.

use std::path::PathBuf;
use std::time::Duration;

use super::{drain_marker, Report};
use crate::slurm::node::NodeState;
use crate::slurm::Scontrol;

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// `scontrol update State=DRAIN Reason=<reason>`.
    Drain {
        /// Reason.
        reason: String,
    },
    /// `scontrol update State=RESUME`.
    Resume,
    /// Nothing, and why.
    None {
        /// Why nothing is done.
        why: String,
    },
}

fn none(why: impl Into<String>) -> Action {
    Action::None { why: why.into() }
}

/// The failing check a health reason names: the text after `prefix` up to the first
/// `": "` (`<prefix><check>: <detail>`, as [`Report::drain_reason`] writes it).
pub fn reason_check<'a>(reason: &'a str, prefix: &str) -> &'a str {
    let body = reason.strip_prefix(prefix).unwrap_or(reason);
    // scontrol shows the reason followed by ` [user@time]`.
    let body = match body.rfind(" [") {
        Some(i) if body.ends_with(']') && body[i..].contains('@') => &body[..i],
        _ => body,
    };
    body.split_once(": ").map_or(body, |(c, _)| c)
}

/// Decides what to do given the node's state (`None`: not known to slurmctld) and the
/// drain reason of the report (`None`: healthy).
pub fn decide(state: Option<&NodeState>, failure: Option<&str>, prefix: &str) -> Action {
    let Some(st) = state else {
        return none("node not known to slurmctld (slurmd not registered yet)");
    };
    let ours = st.reason.as_deref().is_some_and(|r| r.starts_with(prefix));
    let power = ["POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN"]
        .into_iter()
        .find(|f| st.has(f));
    let drained = st.has("DRAIN");
    match failure {
        Some(reason) => {
            if drained {
                return if ours {
                    // NHC rewrites its own note: when another check is now the one
                    // failing, the reason says so (the same check with new numbers keeps
                    // the reason, so it does not churn between runs).
                    let now = st.reason.as_deref().map(|r| reason_check(r, prefix));
                    if now.is_some_and(|c| c != reason_check(reason, prefix)) {
                        Action::Drain {
                            reason: reason.to_string(),
                        }
                    } else {
                        none("already drained by the agent")
                    }
                } else {
                    none(format!(
                        "already drained for another reason ({}): kept",
                        st.reason.as_deref().unwrap_or("none")
                    ))
                };
            }
            if let Some(p) = power {
                return none(format!("{p}: Slurm's power saving owns the node"));
            }
            if st.has("REBOOT_ISSUED") {
                return none("node is rebooting (REBOOT_ISSUED)");
            }
            for (cond, what) in [
                (st.base == "DOWN", "DOWN"),
                (st.base == "FUTURE", "FUTURE"),
                (
                    st.has("FAIL") || st.base == "FAIL" || st.base == "FAILING",
                    "FAIL",
                ),
                (
                    st.has("MAINT") || st.base == "MAINT",
                    "in a MAINT reservation",
                ),
            ] {
                if cond {
                    return none(format!(
                        "node is {what}{}: left alone",
                        st.reason
                            .as_deref()
                            .map(|r| format!(" ({r})"))
                            .unwrap_or_default()
                    ));
                }
            }
            Action::Drain {
                reason: reason.to_string(),
            }
        }
        None => {
            if !drained {
                return none("healthy and not drained");
            }
            if !ours {
                return none(format!(
                    "drained by someone else ({}): not resumed",
                    st.reason.as_deref().unwrap_or("no reason")
                ));
            }
            if st.has("REBOOT_REQUESTED") || st.has("REBOOT_ISSUED") {
                return none("reboot pending: RESUME would cancel it");
            }
            if let Some(p) = power {
                return none(format!("{p}: Slurm's power saving owns the node"));
            }
            Action::Resume
        }
    }
}

/// How to act.
#[derive(Debug, Clone)]
pub struct ActOptions {
    /// Reason prefix.
    pub prefix: String,
    /// State folder for the drain marker (`None`: always query slurmctld).
    pub state_dir: Option<PathBuf>,
    /// Limit of each scontrol call.
    pub scontrol_timeout: Duration,
}

impl ActOptions {
    /// From settings: `health.reason_prefix`, `agent.state_dir`, `health.scontrol_timeout`.
    pub fn from_settings(s: &crate::settings::Settings) -> ActOptions {
        ActOptions {
            prefix: s.health.reason_prefix.clone(),
            state_dir: Some(s.agent.state_dir.clone()),
            scontrol_timeout: s.health.scontrol_timeout.0,
        }
    }
}

/// What [`act_on`] did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ActOutcome {
    /// `drain`, `resume` or `none`.
    pub action: String,
    /// Reason written, or why nothing was done.
    pub detail: String,
    /// The node's state as read (`IDLE+DRAIN`...), when it was read.
    pub state: Option<String>,
    /// An error reading or changing the state.
    pub error: Option<String>,
}

impl ActOutcome {
    /// One line for humans.
    pub fn summary(&self) -> String {
        let mut s = format!("{}: {}", self.action, self.detail);
        if let Some(st) = &self.state {
            s.push_str(&format!(" [state {st}]"));
        }
        if let Some(e) = &self.error {
            s.push_str(&format!(" (error: {e})"));
        }
        s
    }
}

/// Reads the node's state and drains or resumes it per [`decide`].
pub async fn act_on(
    report: &Report,
    scontrol: &Scontrol,
    node: &str,
    opts: &ActOptions,
) -> ActOutcome {
    let failure = report.drain_reason(&opts.prefix);
    let marker = opts
        .state_dir
        .as_ref()
        .filter(|d| d.is_dir())
        .map(|d| drain_marker(d));
    if failure.is_none() {
        if let Some(m) = &marker {
            if !m.exists() {
                return ActOutcome {
                    action: "none".into(),
                    detail: "healthy; the agent has not drained this node".into(),
                    state: None,
                    error: None,
                };
            }
        }
    }
    let mut sc = scontrol.clone();
    sc.timeout = opts.scontrol_timeout;
    let state = match sc.show_node(node).await {
        Ok(info) => info.map(|i| NodeState::from_node_info(&i)),
        Err(e) => {
            return ActOutcome {
                action: "none".into(),
                detail: "node state unknown".into(),
                state: None,
                error: Some(e.to_string()),
            }
        }
    };
    let action = decide(state.as_ref(), failure.as_deref(), &opts.prefix);
    let state_text = state.as_ref().map(NodeState::describe);
    let mut out = ActOutcome {
        action: "none".into(),
        detail: String::new(),
        state: state_text,
        error: None,
    };
    match action {
        Action::Drain { reason } => {
            out.action = "drain".into();
            match sc.drain(node, &reason).await {
                Ok(()) => {
                    if let Some(m) = &marker {
                        if let Err(e) =
                            crate::fsutil::write_atomic(m, reason.as_bytes(), 0o644, None)
                        {
                            out.error =
                                Some(format!("drained, but the marker was not written: {e}"));
                        }
                    }
                }
                Err(e) => out.error = Some(e.to_string()),
            }
            out.detail = reason;
        }
        Action::Resume => {
            out.action = "resume".into();
            out.detail = "checks pass again; the agent's drain is lifted".into();
            match sc.resume(node).await {
                Ok(()) => {
                    if let Some(m) = &marker {
                        let _ = std::fs::remove_file(m);
                    }
                }
                Err(e) => out.error = Some(e.to_string()),
            }
        }
        Action::None { why } => {
            // A drain that is not (or no longer) ours: forget the marker.
            if failure.is_none() {
                if let Some(m) = &marker {
                    let _ = std::fs::remove_file(m);
                }
            }
            out.detail = why;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::slurm::node::NodeInfo;

    const P: &str = "slurm-node-agent: ";

    fn st(line: &str) -> NodeState {
        NodeState::from_node_info(&NodeInfo::parse(line))
    }

    fn drains(line: &str) -> bool {
        matches!(
            decide(Some(&st(line)), Some("slurm-node-agent: x: y"), P),
            Action::Drain { .. }
        )
    }

    fn resumes(line: &str) -> bool {
        decide(Some(&st(line)), None, P) == Action::Resume
    }

    #[test]
    fn another_failing_check_rewrites_the_agents_reason() {
        let mut drained = st("NodeName=n State=IDLE+DRAIN");
        drained.reason = Some("slurm-node-agent: check_a: 3% free".into());
        assert_eq!(
            decide(
                Some(&drained),
                Some("slurm-node-agent: check_a: 2% free"),
                P
            ),
            none("already drained by the agent")
        );
        assert_eq!(
            decide(Some(&drained), Some("slurm-node-agent: check_b: gone"), P),
            Action::Drain {
                reason: "slurm-node-agent: check_b: gone".into()
            }
        );
        // An admin's reason is never rewritten.
        drained.reason = Some("ADMIN SHUTDOWN".into());
        assert!(matches!(
            decide(Some(&drained), Some("slurm-node-agent: check_b: gone"), P),
            Action::None { .. }
        ));
    }

    #[test]
    fn failure_drains_only_when_nobody_else_owns_the_node() {
        assert!(drains("NodeName=n State=IDLE+DYNAMIC_NORM"));
        assert!(drains("NodeName=n State=MIXED"));
        assert!(drains("NodeName=n State=ALLOCATED"));
        assert!(drains("NodeName=n State=IDLE*"));
        assert!(drains("NodeName=n State=IDLE+NOT_RESPONDING"));
        assert!(drains("NodeName=n State=RESERVED"));
        assert!(drains("NodeName=n State=IDLE+RESERVED"));
        assert!(drains("NodeName=n State=IDLE+POWERING_UP"));
        assert!(drains("NodeName=n State=MIXED+REBOOT_REQUESTED"));
        assert!(!drains(
            "NodeName=n State=IDLE+DRAIN Reason=ADMIN SHUTDOWN [root@2026-01-01T00:00:00]"
        ));
        assert!(!drains(
            "NodeName=n State=IDLE+DRAIN Reason=slurm-node-agent: x: old [root@2026-01-01T00:00:00]"
        ));
        // Another check failing now: the agent's own reason is rewritten.
        assert!(drains(
            "NodeName=n State=IDLE+DRAIN Reason=slurm-node-agent: old [root@2026-01-01T00:00:00]"
        ));
        assert!(!drains(
            "NodeName=n State=MIXED+DRAIN Reason=ADMIN SHUTDOWN"
        ));
        assert!(!drains("NodeName=n State=DOWN Reason=broken board"));
        assert!(!drains("NodeName=n State=DOWN*+NOT_RESPONDING"));
        assert!(!drains("NodeName=n State=IDLE+FAIL Reason=failing disk"));
        assert!(!drains("NodeName=n State=IDLE+MAINT"));
        assert!(!drains("NodeName=n State=FUTURE"));
        assert!(!drains("NodeName=n State=IDLE+CLOUD+POWERED_DOWN"));
        assert!(!drains("NodeName=n State=IDLE+POWERING_DOWN"));
        assert!(!drains("NodeName=n State=IDLE+POWER_DOWN"));
        assert!(!drains("NodeName=n State=DOWN+REBOOT_ISSUED"));
        assert_eq!(
            decide(None, Some("x"), P),
            none("node not known to slurmctld (slurmd not registered yet)")
        );
    }

    #[test]
    fn recovery_resumes_only_the_agents_drain() {
        assert!(resumes("NodeName=n State=IDLE+DRAIN Reason=slurm-node-agent: check_x: bad [root@2026-01-01T00:00:00]"));
        assert!(resumes(
            "NodeName=n State=MIXED+DRAIN Reason=slurm-node-agent: check_x: bad"
        ));
        assert!(resumes(
            "NodeName=n State=DOWN+DRAIN+NOT_RESPONDING Reason=slurm-node-agent: x"
        ));
        assert!(!resumes(
            "NodeName=n State=IDLE+DRAIN Reason=ADMIN SHUTDOWN [root@2026-01-01T00:00:00]"
        ));
        assert!(!resumes(
            "NodeName=n State=IDLE+DRAIN Reason=Kill task failed"
        ));
        assert!(!resumes("NodeName=n State=IDLE+DRAIN"));
        assert!(!resumes("NodeName=n State=IDLE"));
        assert!(!resumes("NodeName=n State=DOWN Reason=slurm-node-agent: x"));
        assert!(!resumes(
            "NodeName=n State=IDLE+DRAIN+REBOOT_REQUESTED Reason=slurm-node-agent: x"
        ));
        assert!(!resumes(
            "NodeName=n State=DOWN+DRAIN+REBOOT_ISSUED Reason=slurm-node-agent: x"
        ));
        assert!(!resumes(
            "NodeName=n State=IDLE+DRAIN+POWERED_DOWN Reason=slurm-node-agent: x"
        ));
        assert!(!resumes(
            "NodeName=n State=IDLE+DRAIN Reason=xslurm-node-agent: x"
        ));
    }

    #[test]
    fn reasons_are_bounded_and_clean() {
        let r = Report {
            node: None,
            results: vec![
                super::super::CheckResult {
                    name: "check_a".into(),
                    family: "file".into(),
                    origin: "f:1".into(),
                    status: super::super::Status::Fail,
                    fatal: true,
                    message: format!("line1\nline2 {}", "x".repeat(400)),
                    duration_ms: 1.0,
                },
                super::super::CheckResult {
                    name: "check_b".into(),
                    family: "file".into(),
                    origin: "f:2".into(),
                    status: super::super::Status::Timeout,
                    fatal: true,
                    message: "hung".into(),
                    duration_ms: 1.0,
                },
            ],
            notes: vec![],
            started_unix: 0.0,
            duration_ms: 1.0,
        };
        let reason = r.drain_reason(P).unwrap();
        assert!(
            reason.starts_with("slurm-node-agent: check_a: line1 line2"),
            "{reason}"
        );
        assert!(reason.ends_with("... (+1 more)"), "{reason}");
        assert_eq!(reason.chars().count(), 256);
        crate::slurm::node::validate_reason(&reason).unwrap();
    }
}
