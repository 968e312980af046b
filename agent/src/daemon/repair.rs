//! The daemon's repair pass (`[repair]`, [`crate::repair`]), after each health pass: what
//! the faults found call for (the plan), a reboot that comes back within
//! `repair.replace_within_boots` boots made a replacement, a reboot or replacement
//! withheld while the breaker or the flap guard holds ([`repair_guards`]); logged and counted once per
//! change in `repair.json` (read once, kept in memory) and `repair.prom` (beside the drain
//! metrics).
//!
//! - `report`: nothing else changes (`REPAIR (report): would ...`).
//! - `on`: a reboot or replacement becomes the drain's cause (`repair`, above the health
//!   checks' drain it was planned from) once the node holds a slot of the rollout's budget;
//!   the drain engine runs it once no job is left. Never over an administrator's drain or
//!   a cause of higher rank (an operator's, a scheduled event, a spot or lifecycle notice):
//!   the plan is withheld and the node stays drained as it is. Healthy again before the
//!   action: the repair's drain is lifted; the plan becomes `isolate` (the breaker): the
//!   drain goes back to the health checks. The slot is released when the node is back in
//!   service, or its repair ends without an action.
//! - `off`: a plan left from an earlier mode is cleared.

use super::Ctx;
use crate::drain::{Cause, CauseKind, Phase};
use crate::repair::record::{Change, Record};
use crate::repair::{Plan, RepairMode};
use crate::rollout::repair::RepairSlot;
use crate::settings::Settings;

/// Warns about each `repair.checks` entry that names no health check of this node (a check
/// file may come later in the image, so it is not refused).
pub(super) fn warn_unknown_repair_checks(s: &Settings, node: &str) {
    if s.repair.checks.is_empty() {
        return;
    }
    let target = s.health_target(Some(node.to_string()));
    let Ok(set) = crate::health::load(&s.health, &s.slurm.bin_dir, &target) else {
        return; // the health pass names the error
    };
    let known: Vec<String> = set.checks.iter().map(|c| c.name.clone()).collect();
    for name in s.repair.unknown_checks(&known) {
        tracing::warn!(
            key = "repair.checks",
            check = name,
            "repair.checks names {name:?}, which no health check of this node has (known: {})",
            known.join(", ")
        );
    }
}

/// `repair.json` as the daemon holds it, and which write of the file it was read from or
/// saved as ([`written_at`]).
pub(super) type Cached = (Record, Option<(u64, std::time::SystemTime)>);

/// Which write of `path` is there: its inode (each atomic write renames a new file into
/// place) and modification time; `None` when there is none.
fn written_at(path: &std::path::Path) -> Option<(u64, std::time::SystemTime)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.ino(), m.modified().ok()?))
}

/// The record as the last pass left it; read from `repair.json` the first time, and again
/// when someone else wrote it since (an operator's `slurm-node-agent repair`).
fn cached_record(ctx: &Ctx, path: &std::path::Path) -> Record {
    let mut cached = ctx.repair_record.lock().unwrap_or_else(|p| p.into_inner());
    let at = written_at(path);
    match &*cached {
        Some((r, seen)) if *seen == at => r.clone(),
        _ => {
            let r = Record::load(path);
            *cached = Some((r.clone(), written_at(path)));
            r
        }
    }
}

/// Keeps `record` as the current one; saves it when `save`.
fn keep_record(ctx: &Ctx, path: &std::path::Path, record: Record, save: bool) {
    if save {
        save_repair_record(&ctx.s, path, &record);
    }
    let mut cached = ctx.repair_record.lock().unwrap_or_else(|p| p.into_inner());
    let at = written_at(path);
    *cached = Some((record, at));
}

/// One repair pass over the health checks' `report` (see the module's docs).
pub(super) async fn repair_pass(ctx: &Ctx, report: &crate::health::Report) {
    let s = &ctx.s;
    let path = crate::repair::record::record_path(&s.agent.state_dir);
    let mut record = cached_record(ctx, &path);
    if s.repair.mode == RepairMode::Off {
        let cleared = record.observe(s.repair.mode, None, crate::time::now()) == Change::Cleared;
        keep_record(ctx, &path, record, cleared);
        return;
    }
    let boot = crate::hostfacts::boot_id().unwrap_or_default();
    let mut dirty = record.saw_boot(&boot);
    // What an operator asked for since (`slurm-node-agent repair`, its own file).
    let op = crate::repair::record::Operator::load(&s.agent.state_dir);
    if record.take_operator(&op) {
        tracing::info!(node = %ctx.node, history_cleared_at = ?op.history_cleared_at, breaker_lifted_until = ?op.breaker_lifted_until, "REPAIR: the operator's say taken");
        dirty = true;
    }
    let failures: Vec<_> = report.failures().collect();
    let found: Vec<crate::repair::Failure<'_>> = failures
        .iter()
        .map(|r| crate::repair::Failure {
            check: &r.name,
            family: &r.family,
            message: &r.message,
            timed_out: r.status == crate::health::Status::Timeout,
        })
        .collect();
    let mut plan = s
        .repair
        .plan(&found)
        .map(|p| s.repair.escalate(p, &record, &boot));
    if let Some(p) = plan.take_if(|p| p.departs()) {
        // Every check failing here: a peer's reason names its first failure only.
        let checks: Vec<&str> = found.iter().map(|f| f.check).collect();
        let replace_for = (p.action == crate::repair::Planned::Replace).then_some(p.check.as_str());
        let (why, changed) = repair_guards(ctx, &checks, replace_for, &mut record).await;
        dirty |= changed;
        plan = Some(match why {
            Some(why) => p.withhold(why),
            None => p,
        });
    }
    let before = record.failing.clone();
    record.failing_since(plan.as_ref().map(|p| p.check.as_str()), crate::time::now());
    dirty |= record.failing != before;
    if s.repair.mode == RepairMode::On {
        let (p, changed) = repair_on(ctx, plan, report, &mut record, &boot).await;
        plan = p;
        dirty |= changed;
    }
    let message = plan
        .as_ref()
        .and_then(|p| failures.iter().find(|r| r.name == p.check))
        .map_or("", |r| r.message.as_str());
    let change = record.observe(
        s.repair.mode,
        plan.as_ref().map(|p| (p, message)),
        crate::time::now(),
    );
    let tag = match s.repair.mode {
        RepairMode::On => "REPAIR",
        _ => "REPAIR (report)",
    };
    match (&change, &plan) {
        (Change::Planned, Some(p)) => tracing::warn!(
            decision = "repair.plan",
            node = %ctx.node,
            mode = s.repair.mode.as_str(),
            action = %p.action,
            fault = p.fault.as_str(),
            check = %p.check,
            by = %p.by,
            "{tag}: {}: {message}",
            crate::repair::describe(p, &ctx.node, s.repair.mode)
        ),
        (Change::Cleared, _) => tracing::info!(
            node = %ctx.node,
            "{tag}: {} healthy again; no repair pending",
            ctx.node
        ),
        // The same plan: its words (the breaker's count) kept, nothing logged.
        (Change::Same, Some(_)) => dirty = true,
        _ => {}
    }
    keep_record(ctx, &path, record, dirty || change != Change::Same);
}

/// Whether a repair may take over a drain of `cause`: its own (stated again), the health
/// checks', the start-up gate's (its failure is a failing check of this boot), or an
/// upgrade's (the node is faulty whatever its image; the slot the upgrade holds is the
/// repair's). Any other drain outranks a repair.
fn repairs_from(cause: &Cause) -> bool {
    matches!(
        cause,
        Cause::Repair { .. } | Cause::Health { .. } | Cause::Gate { .. } | Cause::Upgrade { .. }
    )
}

/// `repair.mode = "on"`: moves the drain for `plan` (see the module's docs). Returns the
/// plan as it stands (withheld when the budget is full or another drain outranks it) and
/// whether `record` changed (its slot, its reboots).
async fn repair_on(
    ctx: &Ctx,
    plan: Option<Plan>,
    report: &crate::health::Report,
    record: &mut Record,
    boot: &str,
) -> (Option<Plan>, bool) {
    use crate::node_state::Lifted;
    let engine = &ctx.engine;
    let st = match engine.load() {
        Ok(st) => st,
        Err(e) => {
            tracing::warn!("repair: drain state unread: {e}");
            return (plan, false);
        }
    };
    let open = matches!(st.phase, Phase::Draining | Phase::Drained);
    let repairing = matches!(st.cause, Some(Cause::Repair { .. }));
    let id = engine.instance_id.as_str();
    let health = report
        .drain_reason(id)
        .and_then(|r| Cause::stated(crate::reason::ReasonCause::Health, id, &r));
    let mut changed = false;
    // Once per daemon start: a repair slot of a predecessor under this NodeName goes back
    // (its replacement is here; faulty too, it may never be in service to release it).
    if !repairing
        && !ctx
            .repair_predecessors_looked
            .swap(true, std::sync::atomic::Ordering::Relaxed)
    {
        match crate::rollout::repair::release_predecessors(engine).await {
            Ok(r) if !r.is_empty() => {
                tracing::info!(node = %ctx.node, released = ?r, "REPAIR: released the budget slot a previous instance of this node held")
            }
            Ok(_) => {}
            Err(e) => {
                ctx.repair_predecessors_looked
                    .store(false, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(node = %ctx.node, "REPAIR: a previous instance's budget slot: {e}");
            }
        }
    }
    // A cause of higher rank took the node from the repair (a spot or lifecycle notice, an
    // operator's drain, a maintenance event): the slot goes back.
    let outranked = st.phase != Phase::Active && !st.cause.as_ref().is_some_and(repairs_from);
    if outranked && record.slot.is_some() {
        changed |= release_slot(ctx, record).await;
    }
    let Some(p) = plan else {
        if repairing && open {
            match engine.gateway.lift(CauseKind::Repair, None).await {
                Ok(l @ (Lifted::Resumed | Lifted::LeftToOwner { .. })) => {
                    tracing::info!(node = %ctx.node, lifted = ?l, "REPAIR: healthy again before the repair's action: its drain is lifted");
                    record.unplan_reboot(boot);
                    changed = true;
                    release_slot(ctx, record).await;
                }
                Ok(l) => {
                    tracing::debug!(node = %ctx.node, lifted = ?l, "REPAIR: the repair's drain was not lifted")
                }
                Err(e) => {
                    tracing::warn!(node = %ctx.node, "REPAIR: lifting the repair's drain: {e}")
                }
            }
        } else if st.phase == Phase::Active {
            changed |= back_in_service(ctx, record).await;
        }
        return (None, changed);
    };
    if !p.departs() {
        if repairing && open {
            if let Some(h) = health {
                changed |= hand_back(ctx, h, record, boot).await;
            }
        }
        return (Some(p), changed);
    }
    if repairing && !open {
        return (Some(p), changed); // acting or done: the engine's
    }
    if repairing {
        // An administrator's reason written over the repair's: the repair gives way (the
        // drain goes back to the health checks, their reason kept) and its slot goes back.
        let admins = match engine.gateway.record().await {
            Ok(Some(n)) => n
                .reason()
                .filter(|r| !crate::reason::is_agent_reason(r))
                .map(str::to_string),
            _ => None,
        };
        if let (Some(r), Some(h)) = (admins, health.clone()) {
            changed |= hand_back(ctx, h, record, boot).await;
            let why = format!("drained by an administrator ({r}): never repaired over it");
            return (Some(p.withhold(why)), changed);
        }
    }
    let from = st.cause.as_ref().is_some_and(repairs_from);
    let detail = match &health {
        Some(Cause::Health { detail }) if open && from => detail.clone(),
        _ => {
            let why = match &st.cause {
                Some(c) if open => format!(
                    "the node is drained for {} ({}), which outranks a repair",
                    c.kind(),
                    st.reason.as_deref().unwrap_or("")
                ),
                _ => "the health checks have not drained the node (health.act is off, or \
                      someone else's drain holds it): a repair starts from their drain"
                    .to_string(),
            };
            return (Some(p.withhold(why)), changed);
        }
    };
    if let Some(f) = &st.foreign_reason {
        let why = format!("drained by an administrator ({f}): never repaired over it");
        return (Some(p.withhold(why)), changed);
    }
    if !repairing {
        // The fault must have stood for repair.settle (the plan for the same check made
        // that long ago), so that the breaker has seen the other nodes' checks.
        let settle = ctx.s.repair.settle;
        let since = record
            .failing
            .as_ref()
            .filter(|(c, _)| *c == p.check)
            .map(|(_, t)| *t);
        let now = crate::time::now();
        let secs = i64::try_from(settle.0.as_secs()).unwrap_or(i64::MAX);
        if since.is_none_or(|t| now.saturating_sub(t) < secs) {
            let why = format!(
                "settling: the fault must stand for repair.settle ({settle}) before a reboot or replacement, so that the breaker sees a fault the whole fleet has"
            );
            return (Some(p.withhold(why)), changed);
        }
    }
    let cause = Cause::Repair {
        action: p.action,
        fault: p.fault,
        check: p.check.clone(),
        detail,
    };
    if !repairing {
        let node = match engine.gateway.record().await {
            Ok(Some(n)) => n,
            Ok(None) => {
                let why = format!("slurmctld has no record of {}", ctx.node);
                return (Some(p.withhold(why)), changed);
            }
            Err(e) => {
                let why = format!("slurmctld's record unread: {e}");
                return (Some(p.withhold(why)), changed);
            }
        };
        if let Some(r) = node.reason().filter(|r| !crate::reason::is_agent_reason(r)) {
            let why = format!("drained by an administrator ({r}): never repaired over it");
            return (Some(p.withhold(why)), changed);
        }
        match crate::rollout::repair::take(engine, &ctx.budget, &node).await {
            Ok(RepairSlot::Held(name)) => {
                changed |= record.slot.as_deref() != Some(name.as_str());
                record.slot = Some(name);
            }
            Ok(RepairSlot::Full {
                partition,
                used,
                limit,
            }) => {
                let why = format!(
                    "every slot of the budget of partition {partition} is held ({used} of {limit}: upgrade.max_unavailable); waiting for one"
                );
                return (Some(p.withhold(why)), changed);
            }
            Err(e) => return (Some(p.withhold(format!("no budget slot: {e}"))), changed),
        }
    }
    let reboot = p.action == crate::repair::Planned::Reboot;
    match engine.request(cause).await {
        Ok(r) => match r.begin {
            crate::drain::Begin::Started | crate::drain::Begin::Escalated { .. } => {
                tracing::warn!(
                    node = %ctx.node,
                    action = %p.action,
                    check = %p.check,
                    slot = record.slot.as_deref().unwrap_or(""),
                    reason = r.state.reason.as_deref().unwrap_or(""),
                    "REPAIR: drained for the {} once no job runs",
                    p.action
                );
                if reboot {
                    record.rebooted_for(&p.check, boot, crate::time::now());
                }
                changed = true;
            }
            crate::drain::Begin::Restated { previous } => {
                // Another check or action: a reboot now planned for it is noted.
                let was = matches!(&previous, Cause::Repair { action, check, .. }
                    if *action == crate::repair::Planned::Reboot && *check == p.check);
                if reboot && !was {
                    record.rebooted_for(&p.check, boot, crate::time::now());
                    changed = true;
                }
            }
            crate::drain::Begin::AlreadyDraining { current } if !repairing => {
                changed |= release_slot(ctx, record).await;
                let why = format!(
                    "the node is drained for {}, which outranks a repair",
                    current.kind()
                );
                return (Some(p.withhold(why)), changed);
            }
            _ => {}
        },
        Err(e) => {
            tracing::warn!(node = %ctx.node, "REPAIR: the repair's drain: {e}");
            if !repairing {
                changed |= release_slot(ctx, record).await;
            }
            return (
                Some(p.withhold(format!("the repair's drain failed: {e}"))),
                changed,
            );
        }
    }
    (Some(p), changed)
}

/// A repair no longer called for hands its drain back to the health checks' `health`
/// ([`crate::node_state::Gateway::hand_back`]); only once it did (the engine may have
/// started the action meanwhile) is the reboot it planned forgotten and its slot released.
/// Returns whether `record` changed.
async fn hand_back(ctx: &Ctx, health: Cause, record: &mut Record, boot: &str) -> bool {
    match ctx.engine.gateway.hand_back(health).await {
        Ok(true) => {
            tracing::info!(node = %ctx.node, "REPAIR: the repair is no longer called for; the drain is the health checks' again");
            record.unplan_reboot(boot);
            release_slot(ctx, record).await;
            true
        }
        Ok(false) => false,
        Err(e) => {
            tracing::warn!(node = %ctx.node, "REPAIR: handing the drain back to the health checks: {e}");
            false
        }
    }
}

/// Releases the slots this NodeName holds for a repair (their comment says `repair@`;
/// an upgrade's stays its own), whether or not `record` names one (it may have been lost
/// with a crash). Returns whether `record` changed.
async fn release_slot(ctx: &Ctx, record: &mut Record) -> bool {
    match crate::rollout::repair::release(&ctx.engine).await {
        Ok(released) => {
            if !released.is_empty() {
                tracing::info!(node = %ctx.node, ?released, "REPAIR: released the budget slot");
            }
            record.slot.take().is_some()
        }
        Err(e) => {
            tracing::warn!(node = %ctx.node, "REPAIR: releasing the budget slot: {e}");
            false
        }
    }
}

/// Healthy, with no drain in progress: once per daemon start (and while the record names
/// a slot of its own), the slots held for this node or a gone predecessor are released
/// once the node is in service ([`crate::rollout::repair::back_in_service`]).
async fn back_in_service(ctx: &Ctx, record: &mut Record) -> bool {
    let first = !ctx.repair_looked.load(std::sync::atomic::Ordering::Relaxed);
    if !first && record.slot.is_none() {
        return false;
    }
    let node = match ctx.engine.gateway.record().await {
        Ok(Some(n)) => n,
        Ok(None) | Err(_) => return false,
    };
    if !node.is_available() {
        return false;
    }
    match crate::rollout::repair::back_in_service(&ctx.engine, &node, &ctx.id.ami_id).await {
        Ok(released) => {
            ctx.repair_looked
                .store(true, std::sync::atomic::Ordering::Relaxed);
            let mut changed = false;
            if first {
                // Slurm may keep the last reason on a resumed record: a predecessor's
                // replacement that bootstrap lifted is still there to copy.
                changed = node
                    .reason()
                    .is_some_and(|r| record.saw_predecessor(r, &ctx.engine.instance_id));
                match crate::rollout::repair::forget_replaced(
                    &ctx.engine,
                    ctx.s.repair.flap_window.0,
                )
                .await
                {
                    Ok(gone) if !gone.is_empty() => {
                        tracing::info!(node = %ctx.node, deleted = ?gone, "REPAIR: deleted the records of nodes replaced longer than repair.flap_window ago")
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(node = %ctx.node, "REPAIR: the records of replaced nodes: {e}")
                    }
                }
            }
            if !released.is_empty() {
                tracing::info!(node = %ctx.node, ?released, state = node.state(), "REPAIR: back in service: released the budget slot");
            }
            record.slot.take().is_some() || changed
        }
        Err(e) => {
            tracing::warn!(node = %ctx.node, "REPAIR: releasing the budget slot: {e}");
            false
        }
    }
}

/// Saves `repair.json` and rewrites `repair.prom` from it (beside the drain metrics).
pub(super) fn save_repair_record(
    s: &Settings,
    path: &std::path::Path,
    record: &crate::repair::record::Record,
) {
    if let Err(e) = record.save(path) {
        tracing::warn!("repair record: {e}");
    }
    let metrics = crate::node_state::metrics_path(&s.agent.state_dir, &s.drain.metrics_file);
    let metrics = metrics.with_file_name(crate::repair::record::METRICS_FILE);
    if let Err(e) = crate::fsutil::write_atomic(&metrics, record.render().as_bytes(), 0o644, None) {
        tracing::warn!("repair metrics: {e}");
    }
}

/// Why a reboot or replacement of this node, failing `checks`, is withheld, from every
/// node's record in slurmctld (read once, through the health checks' gateway and its
/// `health.scontrol_timeout`): the breaker ([`crate::repair::breaker::tripped`]: the first
/// of `checks` that trips it), then, for a replacement for `plan_check`, the flap guard
/// ([`crate::repair::flap::holds`], over the records and `record`'s copy of this
/// NodeName's history, which a predecessor's reason still on this node's record joins).
/// `None` when neither holds; the records unread (slurmctld unreachable, this node unknown
/// to it) withhold it too, on the safe side. Returns whether `record` changed.
async fn repair_guards(
    ctx: &Ctx,
    checks: &[&str],
    replace_for: Option<&str>,
    record: &mut Record,
) -> (Option<String>, bool) {
    let r = &ctx.s.repair;
    let fleet = match ctx.health_gateway.fleet().await {
        Ok(f) => f,
        Err(e) => {
            return (
                Some(format!(
                    "the breaker could not count (slurmctld's records: {e})"
                )),
                false,
            )
        }
    };
    let Some(own) = fleet.iter().find(|n| n.name() == ctx.node) else {
        return (
            Some(format!(
                "the breaker could not count (slurmctld has no record of {})",
                ctx.node
            )),
            false,
        );
    };
    let changed = own
        .reason()
        .is_some_and(|reason| record.saw_predecessor(reason, &ctx.engine.instance_id));
    let partitions = own.fields.get("Partitions").map_or("", String::as_str);
    let seen: Vec<crate::repair::breaker::Seen<'_>> =
        fleet.iter().map(crate::node_state::breaker_view).collect();
    let lifted = record.breaker_lifted(crate::time::now());
    let breaker = checks.iter().filter(|_| !lifted).find_map(|check| {
        let t = crate::repair::breaker::tripped(
            check,
            &ctx.node,
            partitions,
            &seen,
            r.breaker_share,
            r.breaker_min_nodes,
        )?;
        Some(crate::repair::breaker::holds(
            check,
            &t,
            (r.breaker_share, r.breaker_min_nodes),
        ))
    });
    if breaker.is_some() {
        return (breaker, changed);
    }
    let flap = replace_for.and_then(|check| {
        let history = crate::repair::flap::History {
            fleet: &seen,
            local: &record.replaced,
            now: crate::time::now(),
            window: i64::try_from(r.flap_window.0.as_secs()).unwrap_or(i64::MAX),
            max: r.flap_max_replacements,
            since: record.history_cleared_at,
        };
        crate::repair::flap::holds(check, &ctx.node, partitions, &history)
    });
    (flap, changed)
}
