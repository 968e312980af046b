//! Bootstrap's start-up gate step ([`crate::gate`]): at every boot, after the
//! `nodeBootstrapped` lifecycle scripts, the node is held with the gate's own drain
//! (before slurmd registers where slurmctld has its record already, right after the
//! registration otherwise), the gate's parts run, and the drain is lifted when they pass or
//! kept with the failure's words when one fails.
//!
//! A bootstrap run again in the same boot (the unit restarted, an operator) does not run
//! the gate again once it ended in that boot: it converges on its result.

use crate::gate::{GateEnv, StartGateSettings};
use crate::health::startgate::GateRecord;
use crate::node_state::{Cause, CauseKind, Gateway};

/// What the gate step decided before slurmd started.
pub(super) struct Pending {
    /// The drain is in place already (slurmctld had the record).
    drained: bool,
    /// The boot.
    boot_id: String,
}

/// Before slurmd starts: `None` when the gate has nothing to do in this boot (no parts, or
/// it ended in this boot already: its drain, if it failed, stays as it is). Otherwise the
/// record says every part is running, and the node is drained with the gate's reason
/// where slurmctld already knows it.
pub(super) async fn before_slurmd(
    s: &StartGateSettings,
    state_dir: &std::path::Path,
    instance_id: &str,
    gateway: &Gateway,
) -> Option<Pending> {
    let boot_id = crate::hostfacts::boot_id().unwrap_or_default();
    // A gate turned off since, or one that passed in this boot before a crash: its drain
    // (this instance's) is over.
    let lift = |why: &'static str| async move {
        match gateway.lift(CauseKind::Gate, None).await {
            Ok(l) => tracing::info!(node = gateway.node(), lifted = ?l, "START GATE: {why}"),
            Err(e) => tracing::debug!(
                node = gateway.node(),
                "START GATE: {why}; nothing lifted: {e}"
            ),
        }
    };
    if !s.enabled() {
        if GateRecord::load(state_dir).is_some() {
            lift("no [start_gate] parts any more: an earlier gate's drain lifted").await;
        }
        return None;
    }
    if let Some(r) = GateRecord::load(state_dir).filter(|r| r.boot_id == boot_id && r.ended()) {
        tracing::info!(
            passed = r.passed(),
            "START GATE: already ran in this boot; not run again"
        );
        if r.passed() {
            lift("passed in this boot").await;
        }
        return None;
    }
    if let Err(e) = crate::gate::starting_record(s, &boot_id, instance_id).save(state_dir) {
        tracing::warn!("start-up gate record not written: {e}");
    }
    let cause = Cause::Gate {
        detail: s.running_words(),
    };
    let drained = match gateway.drain(cause, None).await {
        Ok(_) => {
            tracing::info!(
                node = gateway.node(),
                "START GATE: node held before slurmd registers: {}",
                s.running_words()
            );
            true
        }
        Err(e) => {
            tracing::info!(
                node = gateway.node(),
                "START GATE: no record to hold yet ({e}); held right after the registration"
            );
            false
        }
    };
    Some(Pending { drained, boot_id })
}

/// After the join: the drain (when it could not be made before), then the parts, then the
/// drain lifted (passed) or restated with the failure (failed). Returns the record.
pub(super) async fn after_join(
    s: &StartGateSettings,
    pending: Pending,
    state_dir: &std::path::Path,
    instance_id: &str,
    gateway: &Gateway,
    units: &dyn crate::systemd::Units,
) -> GateRecord {
    if !pending.drained {
        let cause = Cause::Gate {
            detail: s.running_words(),
        };
        if let Err(e) = gateway.drain(cause, None).await {
            tracing::error!(
                node = gateway.node(),
                "START GATE: the node could not be held: {e}"
            );
        }
    }
    let env = GateEnv {
        units,
        state_dir,
        boot_id: pending.boot_id,
        instance_id: instance_id.to_string(),
        sys_dir: "/sys".into(),
    };
    tracing::info!(node = gateway.node(), budget = %crate::section::HumanDuration(s.total_budget()), "START GATE: running {}", s.parts().join(", "));
    let record = crate::gate::run(s, &env).await;
    if record.passed() {
        match gateway.lift(CauseKind::Gate, None).await {
            Ok(l) => {
                tracing::info!(node = gateway.node(), lifted = ?l, "START GATE: passed; the gate's drain lifted")
            }
            Err(e) => tracing::error!(
                node = gateway.node(),
                "START GATE: passed, but its drain could not be lifted: {e}"
            ),
        }
    } else {
        let words: Vec<String> = record
            .failures()
            .map(|p| format!("{}: {}", p.name, p.message))
            .collect();
        let detail = format!("start-up gate failed: {}", words.join("; "));
        match gateway.drain(Cause::Gate { detail: detail.clone() }, None).await {
            Ok(_) => tracing::error!(node = gateway.node(), "START GATE: {detail}; the node stays drained (the health checks report it, repair acts on it)"),
            Err(e) => tracing::error!(node = gateway.node(), "START GATE: {detail}; the drain could not be restated: {e}"),
        }
    }
    record
}
