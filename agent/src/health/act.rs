//! Acting on a report the way NHC users expect, without fighting Slurm or an admin.
//!
//! On failure the node is drained with `slurm-node-agent/health@<instance-id>: <check>:
//! <message>` ([`crate::reason`]) unless:
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
//!
//! The drain and the resume go through the gateway ([`crate::node_state::Gateway`]): a
//! health drain is a cause of the drain state machine (`drain.json`, the drain metrics,
//! `status`), taken only when no cause that outranks it holds the node, and a passing run
//! lifts only the health checks' own drain: never one another cause holds. The gateway
//! takes `drain.lock` around its read-modify-write; the HealthCheckProgram waits for it at
//! most `health.scontrol_timeout`.
//!
//! Before the registration: slurmd runs its HealthCheckProgram at its start, before it
//! registers (with `HealthCheckNodeState=START_ONLY`, 25.11+, that is the only run;
//! [`crate::slurm::healthcheck`]). A dynamic node's first boot has no record in slurmctld
//! then, and a record that is DOWN, not responding, rebooting (`^`), FUTURE or powered
//! down is left alone by [`decide`] although the registration may return it to service.
//! A failing run in that case records its drain in the state folder ([`PendingDrain`],
//! `health-pending.json`) and exits 1 as any failing run; bootstrap's join applies it
//! once slurmd has registered ([`apply_pending`], deciding again on the state then, so an
//! admin's DOWN or drain still wins). A later run that passes, or that finds the node
//! registered, removes it: the newest verdict counts. A drain on a record that exists
//! (a pre-declared node's `UNKNOWN`, a stale `IDLE`) is made at once: slurmctld keeps the
//! DRAIN flag through the registration.
//!
//! Slurm 26.05 with `SlurmctldParameters=health_check_report` passes
//! `SLURM_NODE_IS_HEALTHY=yes|no` on the runs slurmctld asks for
//! ([`crate::slurm::SlurmVersion::has_node_health_hint`]): `yes` means slurmctld held the
//! node neither DOWN, DRAIN, FAIL nor in MAINT when it asked, so a passing run has no drain
//! to lift and makes no `scontrol` call ([`ActOptions::node_health`]); `no` makes a passing
//! run ask slurmctld even where the cache file says this boot saw no health drain.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{clean_marker, pending_drain_path, Report};
use crate::node_state::{Cause, CauseKind, Gateway, Lifted};
use crate::reason::ReasonCause;
use crate::slurm::node::{NodeInfo, NodeState};

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
        .and_then(crate::reason::parse_reason)
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

/// How to act (the gateway carries the node, the incarnation that writes the reasons and
/// the limits of its scontrol calls and of its wait for `drain.lock`).
#[derive(Debug, Clone)]
pub struct ActOptions {
    /// State folder for the drain marker (`None`: always query slurmctld).
    pub state_dir: Option<PathBuf>,
    /// slurmctld's view of the node when it asked for this run (Slurm 26.05's
    /// `SLURM_NODE_IS_HEALTHY`, [`node_health_hint`]): `Some(true)` not DOWN, DRAIN, FAIL
    /// or MAINT, so a passing run makes no `scontrol` call; `Some(false)` one of those, so a
    /// passing run asks slurmctld whatever the cache file says; `None` not told.
    pub node_health: Option<bool>,
}

impl ActOptions {
    /// With the state folder (`agent.state_dir`, for the drain marker).
    pub fn new(state_dir: &Path) -> ActOptions {
        ActOptions {
            state_dir: Some(state_dir.to_path_buf()),
            node_health: None,
        }
    }
}

/// The gateway of the health checks' actions: `gateway` with `[health]`'s limit for each
/// scontrol call (`health.scontrol_timeout`), which is also its wait for `drain.lock`, so
/// that a run slurmd started ends within its deadline (`check` warns when
/// `health.run_deadline` and three of them do not fit).
pub fn health_gateway(gateway: Gateway, health: &super::HealthSettings) -> Gateway {
    gateway.with_limits(health.scontrol_timeout.0, health.scontrol_timeout.0)
}

/// The gateway's cause of the health drain with reason `reason` (as [`Report::drain_reason`]
/// wrote it for the gateway's incarnation).
fn health_cause(gateway: &Gateway, reason: &str) -> Cause {
    Cause::stated(ReasonCause::Health, gateway.instance_id(), reason).unwrap_or_else(|| {
        Cause::Health {
            detail: reason.to_string(),
        }
    })
}

/// The health drain with `reason` through the gateway; the error as the outcome says it.
async fn drain_through(gateway: &Gateway, reason: &str, node: &NodeInfo) -> Option<String> {
    match gateway
        .drain(health_cause(gateway, reason), Some(node))
        .await
    {
        Ok(r) => {
            tracing::debug!(begin = ?r.begin, phase = r.state.phase.as_str(), "health drain");
            None
        }
        Err(e) => Some(e.to_string()),
    }
}

/// Reads Slurm 26.05's `SLURM_NODE_IS_HEALTHY` (`slurmd.c` `run_script_health_check`,
/// set only on runs slurmctld asks for with `SlurmctldParameters=health_check_report`):
/// `yes` → `Some(true)`, `no` → `Some(false)`, anything else or unset → `None`.
pub fn node_health_hint(value: Option<&std::ffi::OsStr>) -> Option<bool> {
    match value.and_then(|v| v.to_str()) {
        Some("yes") => Some(true),
        Some("no") => Some(false),
        _ => None,
    }
}

/// Whether slurmd's registration may put the node in service while [`decide`] leaves it
/// alone now: no record yet (a dynamic node's first start), or one that is not responding
/// (`*`), DOWN (`ReturnToService` returns it), FUTURE, rebooting (`^`), or powered down or
/// powering down by power saving. A failing run records its drain then ([`PendingDrain`]).
pub fn awaits_registration(state: Option<&NodeState>) -> bool {
    let Some(st) = state else {
        return true;
    };
    st.has("NOT_RESPONDING")
        || matches!(st.base.as_str(), "DOWN" | "FUTURE" | "UNKNOWN")
        || [
            "REBOOT_ISSUED",
            "POWERED_DOWN",
            "POWERING_DOWN",
            "POWER_DOWN",
        ]
        .into_iter()
        .any(|f| st.has(f))
}

/// A failing run's drain that could not be made when the run ended because slurmctld had
/// no record of the node or held it in a state its registration may change
/// ([`awaits_registration`]): typically slurmd's run at its start, before it registers.
/// Stored as JSON in the state folder ([`crate::health::pending_drain_path`]); bootstrap
/// applies it after the registration ([`apply_pending`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingDrain {
    /// `/proc/sys/kernel/random/boot_id` when it was written: another boot's is ignored.
    pub boot_id: String,
    /// When it was written, Unix seconds: one from before slurmd's start is ignored.
    pub written_unix: i64,
    /// The first fatal failing check (file order), as the reason names it.
    pub check: String,
    /// Its message.
    pub message: String,
    /// How many other fatal checks failed (the reason's ` (+N more)`).
    pub more: usize,
    /// The node's state the run saw (`None`: slurmctld had no record).
    pub state: Option<String>,
}

impl PendingDrain {
    /// The failing part of `report` (`None` when it is healthy), written now.
    pub fn from_report(report: &Report, state: Option<&NodeState>) -> Option<PendingDrain> {
        let failed: Vec<_> = report.failures().collect();
        let first = failed.first()?;
        Some(PendingDrain {
            boot_id: crate::hostfacts::boot_id().unwrap_or_default(),
            written_unix: crate::time::now(),
            check: first.name.clone(),
            message: first.message.clone(),
            more: failed.len() - 1,
            state: state.map(NodeState::describe),
        })
    }

    /// The drain reason, written by incarnation `instance_id` (as
    /// [`Report::drain_reason`] writes it).
    pub fn reason(&self, instance_id: &str) -> String {
        let head = crate::reason::reason_head(ReasonCause::Health, instance_id);
        super::health_reason(&head, &self.check, &self.message, self.more)
    }

    /// The one in `state_dir`, if there is one that parses (one that does not is removed).
    pub fn read(state_dir: &Path) -> Option<PendingDrain> {
        let path = pending_drain_path(state_dir);
        let text = std::fs::read(&path).ok()?;
        match serde_json::from_slice(&text) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!(path = %path.display(), "unreadable pending health drain removed: {e}");
                PendingDrain::remove(state_dir);
                None
            }
        }
    }

    /// The one in `state_dir` when it was written in this boot.
    pub fn read_this_boot(state_dir: &Path) -> Option<PendingDrain> {
        let boot = crate::hostfacts::boot_id()?;
        PendingDrain::read(state_dir).filter(|p| p.boot_id == boot)
    }

    /// Writes it to `state_dir` (atomically, mode 0644).
    ///
    /// # Errors
    /// [`crate::fsutil::WriteError`] naming the step and the path.
    pub fn write(&self, state_dir: &Path) -> Result<(), crate::fsutil::WriteError> {
        let json = serde_json::to_vec(self).unwrap_or_default();
        crate::fsutil::write_atomic(&pending_drain_path(state_dir), &json, 0o644, None)
    }

    /// Removes the one in `state_dir`, if any.
    pub fn remove(state_dir: &Path) {
        let path = pending_drain_path(state_dir);
        if let Err(e) = std::fs::remove_file(&path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %path.display(), "{e}");
            }
        }
    }
}

/// Bootstrap's half of [`PendingDrain`]: once the slurmd that started at
/// `slurmd_started_unix` (Unix seconds) has registered `node` (as slurmctld shows it now),
/// drains it through `gateway` with the recorded failure, written by the gateway's
/// incarnation, when
/// [`decide`] says so on the state now (an admin's drain or DOWN is kept). A pending drain
/// of another boot, or written before that slurmd started, is stale and removed.
///
/// Returns `None` when there was nothing to apply; otherwise what was done. The file is
/// removed once decided; it stays when the drain itself failed, for the next look.
pub async fn apply_pending(
    state_dir: &Path,
    gateway: &Gateway,
    node: &NodeInfo,
    slurmd_started_unix: i64,
) -> Option<ActOutcome> {
    let pending = PendingDrain::read(state_dir)?;
    let boot = crate::hostfacts::boot_id().unwrap_or_default();
    if pending.boot_id != boot || pending.written_unix < slurmd_started_unix {
        tracing::debug!(?pending, "stale pending health drain removed");
        PendingDrain::remove(state_dir);
        return None;
    }
    let reason = pending.reason(gateway.instance_id());
    let st = NodeState::from_node_info(node);
    let mut out = ActOutcome {
        action: "none".into(),
        detail: String::new(),
        state: Some(st.describe()),
        error: None,
    };
    match decide(
        Some(&st),
        Some(Failing {
            reason: &reason,
            check: &pending.check,
        }),
    ) {
        Action::Drain { reason } => {
            // A healthy run of this boot must ask Slurm again to lift it.
            let _ = std::fs::remove_file(clean_marker(state_dir));
            out.action = "drain".into();
            if let Some(e) = drain_through(gateway, &reason, node).await {
                out.error = Some(e);
                out.detail = reason;
                return Some(out);
            }
            out.detail = reason;
        }
        Action::None { why } => out.detail = why,
        // Never for a failing run.
        Action::Resume => out.detail = "nothing to do".into(),
    }
    PendingDrain::remove(state_dir);
    Some(out)
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

/// Reads the node's state and drains or resumes it per [`decide`], through `gateway`.
pub async fn act_on(report: &Report, gateway: &Gateway, opts: &ActOptions) -> ActOutcome {
    let failure = report.drain_reason(gateway.instance_id());
    let state_dir = opts.state_dir.as_deref().filter(|d| d.is_dir());
    let marker = state_dir.map(clean_marker);
    let boot = crate::hostfacts::boot_id().unwrap_or_default();
    if failure.is_none() {
        // The newest verdict counts: a failure recorded before the registration is over.
        if let Some(d) = state_dir {
            PendingDrain::remove(d);
        }
        if opts.node_health == Some(true) {
            return ActOutcome {
                action: "none".into(),
                detail: "healthy, and slurmctld holds the node in service (SLURM_NODE_IS_HEALTHY=yes): no drain to lift".into(),
                state: None,
                error: None,
            };
        }
    }
    if failure.is_none() && !boot.is_empty() && opts.node_health != Some(false) {
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
    let record = match gateway.record().await {
        Ok(info) => info,
        Err(e) => {
            // slurmctld did not answer: a failure is kept for bootstrap as well.
            let kept = state_dir
                .zip(PendingDrain::from_report(report, None))
                .is_some_and(|(d, p)| p.write(d).is_ok());
            return ActOutcome {
                action: "none".into(),
                detail: if kept {
                    "node state unknown; the drain is kept for bootstrap, which makes it once slurmd has registered".into()
                } else {
                    "node state unknown".into()
                },
                state: None,
                error: Some(e.to_string()),
            };
        }
    };
    let state = record.as_ref().map(NodeState::from_node_info);
    let failing = failure.as_deref().map(|reason| Failing {
        reason,
        check: report.failures().next().map_or("", |r| r.name.as_str()),
    });
    let action = decide(state.as_ref(), failing);
    // A failure the node cannot be drained for now, although its registration may put it
    // in service: kept for bootstrap's join. Any other outcome replaces an older one.
    let pending = state_dir.and_then(|d| {
        let record = failure.is_some()
            && !matches!(action, Action::Drain { .. })
            && awaits_registration(state.as_ref())
            && !state.as_ref().is_some_and(|st| st.has("DRAIN"));
        match record
            .then(|| PendingDrain::from_report(report, state.as_ref()))
            .flatten()
        {
            Some(p) => match p.write(d) {
                Ok(()) => Some(pending_drain_path(d)),
                Err(e) => {
                    tracing::warn!("the failure is not kept for after the registration: {e}");
                    None
                }
            },
            None => {
                PendingDrain::remove(d);
                None
            }
        }
    });
    let ours_now = state.as_ref().is_some_and(|st| {
        st.has("DRAIN")
            && st
                .reason
                .as_deref()
                .is_some_and(|r| crate::reason::is_agent_reason_for(r, ReasonCause::Health))
    });
    let state_text = state.as_ref().map(NodeState::describe);
    let mut out = ActOutcome {
        action: "none".into(),
        detail: String::new(),
        state: state_text,
        error: None,
    };
    match (action, record.as_ref()) {
        (Action::Drain { reason }, Some(node)) => {
            out.action = "drain".into();
            if let Some(m) = &marker {
                let _ = std::fs::remove_file(m);
            }
            out.error = drain_through(gateway, &reason, node).await;
            out.detail = reason;
        }
        (Action::Resume, Some(node)) => {
            out.action = "resume".into();
            out.detail = "checks pass again; the agent's drain is lifted".into();
            match gateway.lift(CauseKind::Health, Some(node)).await {
                Ok(Lifted::Resumed | Lifted::Nothing) => mark_clean(&marker),
                Ok(Lifted::LeftToOwner { reason }) => {
                    out.detail = format!(
                        "checks pass again; the agent's drain is over, someone else's ({reason}) stays"
                    );
                    mark_clean(&marker);
                }
                Ok(Lifted::HeldBy(kind)) => {
                    out.action = "none".into();
                    out.detail = format!(
                        "checks pass again; the node stays drained for its {kind} drain, which outranks the health checks'"
                    );
                }
                Err(e) => out.error = Some(e.to_string()),
            }
        }
        // decide never drains nor resumes a node slurmctld does not know.
        (Action::Drain { .. } | Action::Resume, None) => {
            out.detail = "node not known to slurmctld".into();
        }
        (Action::None { why }, _) => {
            // Healthy, and Slurm shows no health drain of ours (a pending reboot keeps it:
            // the next run asks again and lifts the drain once the node is back).
            if failure.is_none() && !ours_now {
                mark_clean(&marker);
            }
            out.detail = match &pending {
                Some(p) => format!(
                    "{why}; the drain is kept in {} for bootstrap, which makes it once slurmd has registered",
                    p.display()
                ),
                None => why,
            };
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

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
    fn what_the_registration_may_put_in_service() {
        let waits = |line: &str| awaits_registration(Some(&st(line)));
        assert!(awaits_registration(None));
        for line in [
            "NodeName=n State=DOWN+DYNAMIC_NORM+NOT_RESPONDING Reason=Not responding",
            "NodeName=n State=DOWN Reason=broken board",
            "NodeName=n State=IDLE*",
            "NodeName=n State=IDLE+NOT_RESPONDING",
            "NodeName=n State=DOWN+REBOOT_ISSUED",
            "NodeName=n State=FUTURE",
            "NodeName=n State=IDLE+CLOUD+POWERED_DOWN",
            "NodeName=n State=UNKNOWN",
        ] {
            assert!(waits(line), "{line}");
        }
        for line in [
            "NodeName=n State=IDLE+DYNAMIC_NORM",
            "NodeName=n State=MIXED+MAINTENANCE",
            "NodeName=n State=IDLE+FAIL Reason=failing disk",
            "NodeName=n State=IDLE+REBOOT_REQUESTED Reason=kernel_update",
        ] {
            assert!(!waits(line), "{line}");
        }
        assert_eq!(node_health_hint(Some("yes".as_ref())), Some(true));
        assert_eq!(node_health_hint(Some("no".as_ref())), Some(false));
        assert_eq!(node_health_hint(Some("YES".as_ref())), None);
        assert_eq!(node_health_hint(None), None);
    }

    /// The gateway of node `n1` through a stand-in scontrol in `dir`
    /// ([`crate::slurm::node::test_scontrol`]: `show node` prints `dir/record`, every call
    /// goes to `dir/calls`), its state in `state`, writing reasons as `instance_id`.
    fn gateway(dir: &Path, state: &Path, instance_id: &str) -> Gateway {
        Gateway::new(
            "n1",
            crate::slurm::node::test_scontrol(dir),
            state,
            std::time::Duration::from_secs(5),
            state.join("drain.prom"),
        )
        .with_instance(instance_id)
    }

    fn check_result(name: &str, ok: bool) -> super::super::CheckResult {
        super::super::CheckResult {
            name: name.into(),
            family: "file".into(),
            origin: "nhc.conf:1".into(),
            status: if ok {
                super::super::Status::Pass
            } else {
                super::super::Status::Fail
            },
            fatal: true,
            message: if ok { "ok".into() } else { "missing".into() },
            duration_ms: 1.0,
        }
    }

    fn report(ok: bool) -> Report {
        Report {
            node: Some("n1".into()),
            results: vec![check_result("check_file_test -e /flag", ok)],
            notes: vec![],
            started_unix: 0.0,
            duration_ms: 1.0,
        }
    }

    #[tokio::test]
    async fn a_failure_before_the_registration_is_drained_by_bootstrap_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let state = d.join("state");
        std::fs::create_dir(&state).unwrap();
        let sc = gateway(d, &state, crate::reason::UNKNOWN_INSTANCE);
        let boot = gateway(d, &state, ID);
        let calls = || std::fs::read_to_string(d.join("calls")).unwrap_or_default();
        let opts = ActOptions::new(&state);
        // slurmd's run at its start, on a dynamic node's first boot: no record.
        let out = act_on(&report(false), &sc, &opts).await;
        assert_eq!(out.action, "none");
        assert!(
            out.detail.starts_with("node not known to slurmctld")
                && out.detail.contains("kept in")
                && out.detail.contains("for bootstrap"),
            "{}",
            out.detail
        );
        let p = PendingDrain::read_this_boot(&state).unwrap();
        assert_eq!(
            (p.check.as_str(), p.more, p.state.clone()),
            ("check_file_test -e /flag", 0, None)
        );
        assert!(!calls().contains("update"), "{}", calls());

        // Bootstrap, once the slurmd started before it registered: drained with the
        // failure, written by bootstrap's instance.
        let registered = NodeInfo::parse("NodeName=n1 State=IDLE+DYNAMIC_NORM");
        let o = apply_pending(&state, &boot, &registered, p.written_unix)
            .await
            .unwrap();
        assert_eq!(o.action, "drain", "{o:?}");
        assert_eq!(
            o.detail,
            "slurm-node-agent/health@i-0123456789abcdef0: check_file_test -e /flag: missing"
        );
        assert!(
            calls().contains("update NodeName=n1 State=DRAIN Reason=slurm-node-agent/health@i-0123456789abcdef0: check_file_test -e /flag: missing"),
            "{}",
            calls()
        );
        assert!(PendingDrain::read(&state).is_none());
        // Nothing left to apply.
        assert!(apply_pending(&state, &boot, &registered, 0).await.is_none());

        // An admin's drain (or DOWN) at the registration stays as it is.
        opts_fail_then(&opts, &sc, &state).await;
        let admin = NodeInfo::parse(
            "NodeName=n1 State=IDLE+DRAIN Reason=ADMIN SHUTDOWN [root@2026-01-01T00:00:00]",
        );
        let before = calls();
        let o = apply_pending(&state, &boot, &admin, 0).await.unwrap();
        assert_eq!(o.action, "none");
        assert!(o.detail.contains("ADMIN SHUTDOWN"), "{}", o.detail);
        assert_eq!(calls(), before);
        assert!(PendingDrain::read(&state).is_none());

        // One written before this slurmd started (an earlier start of this boot) is stale.
        opts_fail_then(&opts, &sc, &state).await;
        let written = PendingDrain::read(&state).unwrap().written_unix;
        assert!(apply_pending(&state, &boot, &registered, written + 1)
            .await
            .is_none());
        assert!(PendingDrain::read(&state).is_none());

        // A later passing run takes it back: the newest verdict counts.
        opts_fail_then(&opts, &sc, &state).await;
        let out = act_on(&report(true), &sc, &opts).await;
        assert_eq!(out.action, "none");
        assert!(PendingDrain::read(&state).is_none());

        // A record its registration may return to service (DOWN, not responding): kept;
        // one that can be drained now is drained at once, nothing kept.
        std::fs::write(
            d.join("record"),
            "NodeName=n1 State=DOWN+DYNAMIC_NORM+NOT_RESPONDING Reason=Not responding\n",
        )
        .unwrap();
        let out = act_on(&report(false), &sc, &opts).await;
        assert_eq!(out.action, "none", "{out:?}");
        assert_eq!(
            PendingDrain::read(&state).unwrap().state.as_deref(),
            Some("DOWN+DYNAMIC_NORM+NOT_RESPONDING")
        );
        std::fs::write(d.join("record"), "NodeName=n1 State=UNKNOWN\n").unwrap();
        let out = act_on(&report(false), &sc, &opts).await;
        assert_eq!(out.action, "drain", "{out:?}");
        assert!(PendingDrain::read(&state).is_none());
        // A registered node in maintenance: nothing kept for later.
        std::fs::write(d.join("record"), "NodeName=n1 State=IDLE+MAINTENANCE\n").unwrap();
        let out = act_on(&report(false), &sc, &opts).await;
        assert_eq!(out.action, "none", "{out:?}");
        assert!(PendingDrain::read(&state).is_none());
        // Another boot's is ignored and removed.
        let mut other = PendingDrain::from_report(&report(false), None).unwrap();
        other.boot_id = "another-boot".into();
        other.write(&state).unwrap();
        assert!(PendingDrain::read_this_boot(&state).is_none());
        assert!(apply_pending(&state, &boot, &registered, 0).await.is_none());
        assert!(PendingDrain::read(&state).is_none());
    }

    /// A failing run against a node slurmctld does not know: leaves a pending drain.
    async fn opts_fail_then(opts: &ActOptions, sc: &Gateway, state: &Path) {
        let _ = std::fs::remove_file(state.parent().unwrap().join("record"));
        act_on(&report(false), sc, opts).await;
        assert!(PendingDrain::read(state).is_some());
    }

    #[tokio::test]
    async fn slurm_node_is_healthy_spares_or_forces_the_look() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let state = d.join("state");
        std::fs::create_dir(&state).unwrap();
        let sc = gateway(d, &state, ID);
        let calls = || std::fs::read_to_string(d.join("calls")).unwrap_or_default();
        std::fs::write(d.join("record"), "NodeName=n1 State=IDLE\n").unwrap();
        let mut opts = ActOptions {
            node_health: Some(true),
            ..ActOptions::new(&state)
        };
        // yes: a passing run asks slurmctld nothing.
        let out = act_on(&report(true), &sc, &opts).await;
        assert!(out.detail.contains("SLURM_NODE_IS_HEALTHY=yes"), "{out:?}");
        assert_eq!(calls(), "");
        // A failing run asks (the state decides: reboot requested, power saving...).
        let out = act_on(&report(false), &sc, &opts).await;
        assert_eq!(out.action, "drain");
        assert!(calls().contains("show node"), "{}", calls());
        // no: a passing run asks even where this boot's cache says "no health drain".
        std::fs::write(
            d.join("record"),
            format!("NodeName=n1 State=IDLE+DRAIN Reason=slurm-node-agent/health@{ID}: x: y\n"),
        )
        .unwrap();
        std::fs::write(clean_marker(&state), crate::hostfacts::boot_id().unwrap()).unwrap();
        opts.node_health = None;
        let out = act_on(&report(true), &sc, &opts).await;
        assert!(out.detail.contains("this boot"), "{out:?}");
        opts.node_health = Some(false);
        let out = act_on(&report(true), &sc, &opts).await;
        assert_eq!(out.action, "resume", "{out:?}");
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
