//! Acting on a report the way NHC users expect, without fighting Slurm or an admin.
//!
//! On failure the node is drained with `slurm-node-agent/health@<instance-id>: <check>:
//! <message>` ([`crate::identity`]) unless:
//! - slurmctld does not know the node yet (slurmd not registered: nothing to drain);
//! - it is already drained or draining (by the agent: kept; by anyone else: their reason
//!   is never overwritten);
//! - it is DOWN, FAIL/FAILING, in a MAINT reservation, FUTURE, or rebooting (`^`), or a
//!   reboot was requested with a reason (`@`, `scontrol reboot reason=...`); or
//!   Slurm's power saving owns it (`~` powered down, `%` powering down, `!` power down
//!   pending).
//!
//! Other states act normally: RESERVED (`resv`), not responding (`*`), powering up (`#`),
//! reboot requested (`@`) without a reason, PLANNED, COMPLETING.
//!
//! A failing check other than the one named in the agent's health reason rewrites the
//! reason. On success the node is resumed only when its reason is the agent's health
//! reason (any incarnation: a replacement lifts its predecessor's health drain), and not
//! while a reboot is requested or issued (`@`, `^`: RESUME would cancel the admin's
//! reboot) or power saving owns it. An admin drain ("ADMIN SHUTDOWN", or any reason not in
//! the agent's scheme) is never resumed.
//!
//! Slurm's reason is the authority; a cache file in the state folder only saves calls:
//! it holds the boot id of a run that found no health drain of the agent's in Slurm, so a
//! healthy run in the same boot makes no `scontrol` call at all (fast, and no load on
//! slurmctld from thousands of nodes). A drain removes it; a new boot, a new disk or a
//! replacement instance has none, so the first healthy run asks Slurm. Without a state
//! folder the node is always queried.
//! Race: an admin drain landing between our query and our drain is overwritten; the
//! window is one scontrol round trip.

use std::path::PathBuf;
use std::time::Duration;

use super::{clean_marker, Report};
use crate::identity::ReasonCause;
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

/// A failing run, as [`decide`] needs it.
#[derive(Debug, Clone, Copy)]
pub struct Failing<'a> {
    /// The drain reason (`Report::drain_reason`).
    pub reason: &'a str,
    /// The name of the check the reason names (the first fatal failure), as written: a
    /// name may hold `: ` itself, so it is not read back from the reason.
    pub check: &'a str,
}

/// Decides what to do given the node's state (`None`: not known to slurmctld) and the
/// failing run (`None`: healthy).
pub fn decide(state: Option<&NodeState>, failure: Option<Failing<'_>>) -> Action {
    let Some(st) = state else {
        return none("node not known to slurmctld (slurmd not registered yet)");
    };
    let ours_parsed = st
        .reason
        .as_deref()
        .and_then(crate::identity::parse_reason)
        .filter(|r| r.cause == ReasonCause::Health);
    let ours = ours_parsed.is_some();
    let power = ["POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN"]
        .into_iter()
        .find(|f| st.has(f));
    let drained = st.has("DRAIN");
    match failure {
        Some(Failing { reason, check }) => {
            if drained {
                if let Some(cur) = &ours_parsed {
                    // The reason in Slurm names this check when its detail starts with the
                    // check's name as reasons write it (or with the start of it, when the
                    // reason was cut to Slurm's length).
                    let name = super::reason_text(check);
                    // Without the " (+N more)" that other failing checks add.
                    let detail = match cur.detail.rsplit_once(" (+") {
                        Some((d, n))
                            if n.strip_suffix(" more)").is_some_and(|n| {
                                !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
                            }) =>
                        {
                            d
                        }
                        _ => cur.detail.as_str(),
                    };
                    let cut = detail.strip_suffix("...");
                    let same = detail.starts_with(&format!("{name}: "))
                        || cut.is_some_and(|d| format!("{name}: ").starts_with(d));
                    if !same && !st.has("REBOOT_ISSUED") {
                        // Another check is the one failing now: say so.
                        return Action::Drain {
                            reason: reason.to_string(),
                        };
                    }
                }
                return if ours {
                    none("already drained by the agent")
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
            // `scontrol reboot reason=...`: the reason is the admin's; a drain would
            // replace it. The node is checked again once it has rebooted.
            if let (true, Some(r)) = (st.has("REBOOT_REQUESTED"), st.reason.as_deref()) {
                return none(format!(
                    "reboot requested by someone else ({r}): their reason is kept, left alone"
                ));
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
    /// The incarnation that writes the reasons (`unknown` when not known).
    pub instance_id: String,
    /// State folder for the drain marker (`None`: always query slurmctld).
    pub state_dir: Option<PathBuf>,
    /// Limit of each scontrol call.
    pub scontrol_timeout: Duration,
}

impl ActOptions {
    /// From settings (`agent.state_dir`, `health.scontrol_timeout`); the instance id from
    /// bootstrap's record (`unknown` without one; see [`ActOptions::with_instance`]).
    pub fn from_settings(s: &crate::settings::Settings) -> ActOptions {
        ActOptions {
            instance_id: crate::identity::Recorded::read(&s.agent.state_dir).map_or_else(
                || crate::identity::UNKNOWN_INSTANCE.to_string(),
                |r| r.instance_id,
            ),
            state_dir: Some(s.agent.state_dir.clone()),
            scontrol_timeout: s.health.scontrol_timeout.0,
        }
    }
}

impl ActOptions {
    /// The same options writing reasons as incarnation `instance_id`.
    pub fn with_instance(mut self, instance_id: &str) -> ActOptions {
        self.instance_id = instance_id.to_string();
        self
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
    let failure = report.drain_reason(&opts.instance_id);
    let marker = opts
        .state_dir
        .as_ref()
        .filter(|d| d.is_dir())
        .map(|d| clean_marker(d));
    let boot = crate::drain::boot_id().unwrap_or_default();
    if failure.is_none() && !boot.is_empty() {
        if let Some(m) = &marker {
            if std::fs::read_to_string(m).is_ok_and(|b| b.trim() == boot) {
                return ActOutcome {
                    action: "none".into(),
                    detail: "healthy; Slurm showed no health drain of the agent's this boot".into(),
                    state: None,
                    error: None,
                };
            }
        }
    }
    // Marks "Slurm has no health drain of ours" for the rest of this boot.
    let mark_clean = |m: &Option<PathBuf>| {
        if let Some(m) = m {
            if !boot.is_empty() {
                let _ = crate::fsutil::write_atomic(m, boot.as_bytes(), 0o644, None);
            }
        }
    };
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
    let failing = failure.as_deref().map(|reason| Failing {
        reason,
        check: report.failures().next().map_or("", |r| r.name.as_str()),
    });
    let action = decide(state.as_ref(), failing);
    let ours_now = state.as_ref().is_some_and(|st| {
        st.has("DRAIN")
            && st
                .reason
                .as_deref()
                .is_some_and(|r| crate::identity::is_agent_reason_for(r, ReasonCause::Health))
    });
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
            if let Some(m) = &marker {
                let _ = std::fs::remove_file(m);
            }
            if let Err(e) = sc.drain(node, &reason).await {
                out.error = Some(e.to_string());
            }
            out.detail = reason;
        }
        Action::Resume => {
            out.action = "resume".into();
            out.detail = "checks pass again; the agent's drain is lifted".into();
            match sc.resume(node).await {
                Ok(()) => mark_clean(&marker),
                Err(e) => out.error = Some(e.to_string()),
            }
        }
        Action::None { why } => {
            // Healthy, and Slurm shows no health drain of ours (a pending reboot keeps it:
            // the next run asks again and lifts the drain once the node is back).
            if failure.is_none() && !ours_now {
                mark_clean(&marker);
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

    const ID: &str = "i-0123456789abcdef0";

    fn st(line: &str) -> NodeState {
        NodeState::from_node_info(&NodeInfo::parse(line))
    }

    fn drains(line: &str) -> bool {
        matches!(
            decide(
                Some(&st(line)),
                Some(Failing {
                    reason: "slurm-node-agent/health@i-0123456789abcdef0: x: y",
                    check: "x",
                }),
            ),
            Action::Drain { .. }
        )
    }

    fn resumes(line: &str) -> bool {
        decide(Some(&st(line)), None) == Action::Resume
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
        // An admin's `scontrol reboot reason=...`: the reason is never overwritten.
        assert!(!drains(
            "NodeName=n State=IDLE+REBOOT_REQUESTED Reason=kernel_update [root@2026-01-01T00:00:00]"
        ));
        assert!(!drains(
            "NodeName=n State=IDLE+DRAIN Reason=ADMIN SHUTDOWN [root@2026-01-01T00:00:00]"
        ));
        assert!(!drains(
            "NodeName=n State=IDLE+DRAIN Reason=slurm-node-agent/health@i-0fedcba9876543210: x: old [root@2026-01-01T00:00:00]"
        ));
        assert!(!drains(
            "NodeName=n State=MIXED+DRAIN Reason=ADMIN SHUTDOWN"
        ));
        assert!(!drains("NodeName=n State=DOWN Reason=broken board"));
        assert!(!drains("NodeName=n State=DOWN*+NOT_RESPONDING"));
        assert!(!drains("NodeName=n State=IDLE+FAIL Reason=failing disk"));
        assert!(!drains("NodeName=n State=IDLE+MAINT"));
        // scontrol and JSON spell it MAINTENANCE (node_state_flag_string()).
        assert!(!drains("NodeName=n State=IDLE+MAINTENANCE+RESERVED"));
        assert!(!drains("NodeName=n State=MIXED+MAINTENANCE"));
        assert!(!drains("NodeName=n State=FUTURE"));
        assert!(!drains("NodeName=n State=IDLE+CLOUD+POWERED_DOWN"));
        assert!(!drains("NodeName=n State=IDLE+POWERING_DOWN"));
        assert!(!drains("NodeName=n State=IDLE+POWER_DOWN"));
        assert!(!drains("NodeName=n State=DOWN+REBOOT_ISSUED"));
        assert_eq!(
            decide(
                None,
                Some(Failing {
                    reason: "x",
                    check: "x"
                })
            ),
            none("node not known to slurmctld (slurmd not registered yet)")
        );
    }

    #[test]
    fn recovery_resumes_only_the_agents_drain() {
        assert!(resumes("NodeName=n State=IDLE+DRAIN Reason=slurm-node-agent/health@i-0fedcba9876543210: check_x: bad [root@2026-01-01T00:00:00]"));
        assert!(resumes(
            "NodeName=n State=MIXED+DRAIN Reason=slurm-node-agent/health@i-0fedcba9876543210: check_x: bad"
        ));
        assert!(resumes(
            "NodeName=n State=DOWN+DRAIN+NOT_RESPONDING Reason=slurm-node-agent/health@unknown: x"
        ));
        assert!(!resumes(
            "NodeName=n State=IDLE+DRAIN Reason=ADMIN SHUTDOWN [root@2026-01-01T00:00:00]"
        ));
        assert!(!resumes(
            "NodeName=n State=IDLE+DRAIN Reason=Kill task failed"
        ));
        assert!(!resumes("NodeName=n State=IDLE+DRAIN"));
        assert!(!resumes("NodeName=n State=IDLE"));
        assert!(!resumes(
            "NodeName=n State=DOWN Reason=slurm-node-agent/health@unknown: x"
        ));
        assert!(!resumes(
            "NodeName=n State=IDLE+DRAIN+REBOOT_REQUESTED Reason=slurm-node-agent/health@unknown: x"
        ));
        assert!(!resumes(
            "NodeName=n State=DOWN+DRAIN+REBOOT_ISSUED Reason=slurm-node-agent/health@unknown: x"
        ));
        assert!(!resumes(
            "NodeName=n State=IDLE+DRAIN+POWERED_DOWN Reason=slurm-node-agent/health@unknown: x"
        ));
        assert!(!resumes(
            "NodeName=n State=IDLE+DRAIN Reason=xslurm-node-agent/health@unknown: x"
        ));
    }

    #[test]
    fn another_failing_check_rewrites_the_reason_admin_look_alikes_stay() {
        let line = "NodeName=n State=IDLE+DRAIN Reason=slurm-node-agent/health@i-0fedcba9876543210: check_a: bad [root@2026-01-01T00:00:00]";
        let now = "slurm-node-agent/health@i-0123456789abcdef0: check_b: worse";
        let failing = |reason, check| Some(Failing { reason, check });
        assert_eq!(
            decide(Some(&st(line)), failing(now, "check_b")),
            Action::Drain { reason: now.into() }
        );
        let same = "slurm-node-agent/health@i-0123456789abcdef0: check_a: still bad";
        assert!(matches!(
            decide(Some(&st(line)), failing(same, "check_a")),
            Action::None { .. }
        ));
        // Names holding ": " are compared whole: "fs: /scratch" is not "fs: /fsx".
        let fsx = "NodeName=n State=IDLE+DRAIN Reason=slurm-node-agent/health@i-0fedcba9876543210: fs: /fsx: gone [root@2026-01-01T00:00:00]";
        let scratch = "slurm-node-agent/health@i-0123456789abcdef0: fs: /scratch: gone";
        assert_eq!(
            decide(Some(&st(fsx)), failing(scratch, "fs: /scratch")),
            Action::Drain {
                reason: scratch.into()
            }
        );
        assert!(matches!(
            decide(Some(&st(fsx)), failing("r", "fs: /fsx")),
            Action::None { .. }
        ));
        // A long name cut to Slurm's 256 characters, with other checks failing too.
        let long = "check_cmd_output -m /ok/ ".repeat(12);
        let stored = crate::health::health_reason(
            "slurm-node-agent/health@i-0fedcba9876543210: ",
            &long,
            "bad",
            2,
        );
        assert!(stored.ends_with("... (+2 more)"), "{stored}");
        let line =
            format!("NodeName=n State=IDLE+DRAIN Reason={stored} [root@2026-01-01T00:00:00]");
        assert!(matches!(
            decide(Some(&st(&line)), failing("r", &long)),
            Action::None { .. }
        ));
        assert!(matches!(
            decide(Some(&st(&line)), failing("r", "check_other")),
            Action::Drain { .. }
        ));
        // A name with repeated spaces (an aligned nhc.conf line) is the same check as the
        // reason that wrote it, whose spaces Slurm's output and the reason collapse.
        let aligned = "NodeName=n State=IDLE+DRAIN Reason=slurm-node-agent/health@i-0fedcba9876543210: check_file_test -e /x: missing [root@2026-01-01T00:00:00]";
        assert!(matches!(
            decide(Some(&st(aligned)), failing("r", "check_file_test -e   /x")),
            Action::None { .. }
        ));
        assert!(!resumes(
            "NodeName=n State=IDLE+DRAIN Reason=slurm-node-agent: check_x: bad"
        ));
        assert!(!resumes(
            "NodeName=n State=IDLE+DRAIN Reason=slurm-node-agent/operator@unknown: x"
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
        let reason = r.drain_reason(ID).unwrap();
        assert!(
            reason.starts_with("slurm-node-agent/health@i-0123456789abcdef0: check_a: line1 line2"),
            "{reason}"
        );
        assert!(reason.ends_with("... (+1 more)"), "{reason}");
        assert_eq!(reason.chars().count(), 256);
        crate::slurm::node::validate_reason(&reason).unwrap();
    }
}
