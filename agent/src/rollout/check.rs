//! One upgrade check, the daemon's (its only caller): desired image vs running image, the
//! image exists, no replacement loop, a budget slot ([`super::slot`]), and the drain
//! request; and, once the node is back in service on the desired image, the slot's
//! release. It drives the drain engine ([`crate::drain`]) with what [`crate::upgrade`]
//! knows about images and upgrade reasons, so it sits above both.

use super::budget::Budget;
use super::slot::{self, Taken};
use crate::drain::{state, Begin, Cause, CauseKind, DrainError, Engine, Phase};
use crate::upgrade::{
    check_image, desired_image, launched_after_publication, parse_upgrade_reason, upgrade_reason,
    Desired, DesiredImageError, UpgradeAction, STUCK,
};

/// What an upgrade check found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// The running (or last applied) image is the desired one.
    UpToDate {
        /// The image.
        image: String,
        /// Not in service yet while an upgrade slot of the agent's is held (a replacement
        /// coming up, in its first `upgrade.slot_timeout`): it may release a slot once in
        /// service, so the next check comes soon ([`Check::wants_check_soon`]).
        returning: bool,
    },
    /// Another drain is in progress, or this upgrade was already handled: nothing done.
    Busy,
    /// The node was drained by someone else: not upgraded now.
    ForeignDrain,
    /// Every slot of the budget is held: try again later.
    Waiting {
        /// Slots held.
        used: usize,
        /// The limit.
        limit: usize,
    },
    /// The drain started.
    Started {
        /// From.
        current: String,
        /// To.
        desired: String,
    },
    /// Reading the parameter failed, or the image is missing (logged; no drain).
    Error(String),
    /// This instance still runs `current` although it was launched to replace one that
    /// powered off for `desired` (a previous instance of this NodeName drained for it), or
    /// launched after `desired` was published, under any NodeName: the launch template
    /// does not follow the parameter, and powering off would launch `current` again. The
    /// node stays drained with a reason saying so and holds a budget slot, so the rollout
    /// stops after the budget; nothing is powered off.
    Stuck {
        /// The image this instance runs.
        current: String,
        /// The desired image.
        desired: String,
        /// The instance of this NodeName that drained for it before; `None` when the
        /// launch time gave it away.
        previous: Option<String>,
    },
}

impl Check {
    /// Whether the next check should come after the budget wait rather than the interval.
    pub fn wants_retry_soon(&self) -> bool {
        matches!(self, Check::Waiting { .. })
    }

    /// Whether the next check should come at the drain state's pace
    /// (`drain.check_interval`): a replacement up to date, on its way into service, whose
    /// first check in service releases its predecessor's slot. Paced by the poll interval
    /// (sized to the cluster for SSM's quota) the next node of a rollout waited up to that
    /// long for the slot; such checks are as many as the budget's slots.
    pub fn wants_check_soon(&self) -> bool {
        matches!(
            self,
            Check::UpToDate {
                returning: true,
                ..
            }
        )
    }
}

/// Compares the desired image in SSM parameter `upgrade.parameter` with `running` (IMDS
/// `ami-id`, or the image recorded by the last in-place upgrade), and starts an upgrade
/// drain once it holds a budget slot ([`slot::take`]). A node up to date and back in
/// service releases the slot its NodeName holds ([`slot::release`]): a replacement, or the
/// node itself after an in-place upgrade or a drain that ended without one.
///
/// Before any drain, the desired image must exist in EC2 ([`check_image`]), and there must
/// be no sign of a replacement loop ([`Check::Stuck`]): the node's record shows that a
/// previous instance of this NodeName already drained for the same image, or, with
/// `upgrade.action = "poweroff"`, this instance was launched (`launched_at`, IMDS
/// `pendingTime`) after the desired image was published (the parameter's
/// `LastModifiedDate`, [`launched_after_publication`]): the second holds under any
/// NodeName, the first only when names are reused. A leftover upgrade drain of the agent
/// that no longer applies (the node runs the desired image, or another image is desired
/// now) is lifted.
///
/// # Errors
/// [`DrainError`] from Slurm or the state; SSM and EC2 errors are [`Check::Error`].
pub async fn check(
    engine: &Engine,
    budget: &Budget,
    ssm: &aws_sdk_ssm::Client,
    ec2: &aws_sdk_ec2::Client,
    running: &str,
    launched_at: Option<i64>,
) -> Result<Check, DrainError> {
    // Waiting for a slot: one small read of slurmctld's reservations, and the full check
    // (SSM, EC2, every node's record) only once the partition has a free slot.
    if let Some(w) = budget.waiting() {
        let used = slot::list(&engine.ops.scontrol)
            .await?
            .iter()
            .filter(|s| slot::is_slot_of(&s.name, &w.partition))
            .count();
        if used >= w.limit {
            return Ok(Check::Waiting {
                used,
                limit: w.limit,
            });
        }
        budget.set_waiting(None);
    }
    let Desired {
        image: desired,
        published_at,
    } = match desired_image(ssm, &engine.upgrade.parameter).await {
        Ok(d) => d,
        Err(e) => {
            match &e {
                DesiredImageError::Other { .. } => tracing::warn!("{e}"),
                _ => tracing::error!("{e}"),
            }
            return Ok(Check::Error(e.to_string()));
        }
    };
    let st = engine.load()?;
    let current = st
        .applied_image
        .clone()
        .unwrap_or_else(|| running.to_string());
    if desired == current {
        return up_to_date(engine, st.phase, &desired, current).await;
    }
    if st.phase == Phase::Active && st.handled.contains(&cause_key(&current, &desired)) {
        // The drain for this upgrade ended without it (withdrawn, resumed by an operator).
        release_when_back(engine).await?;
    }
    if let Err(e) = check_image(ec2, &desired, &engine.upgrade.parameter).await {
        tracing::error!("{e}");
        return Ok(Check::Error(e.to_string()));
    }
    let cause = Cause::Upgrade {
        current: current.clone(),
        desired: desired.clone(),
    };
    if st.phase != Phase::Active || st.handled.contains(&cause.key()) {
        return Ok(Check::Busy);
    }
    // Launched after the publication and still on another image: not from the parameter.
    let not_from_parameter = engine.upgrade.action == UpgradeAction::Poweroff
        && st.applied_image.is_none()
        && launched_after_publication(launched_at, published_at);
    if let Some(stuck) =
        replacement_loop(engine, budget, &current, &desired, not_from_parameter).await?
    {
        return Ok(stuck);
    }
    let node = record(engine).await?;
    if node.is_drained()
        && node
            .reason()
            .is_some_and(|r| !state::is_our_reason(r, None))
    {
        return Ok(Check::ForeignDrain);
    }
    if not_from_parameter {
        // Its predecessor (under another NodeName) is gone: this instance takes its place
        // in the budget rather than waiting for that slot to end.
        release_for_a_holder_that_is_gone(engine, &node, &current).await?;
    }
    let (partition, count, limit) = Budget::of(engine, &node).await?;
    let taken = slot::take(
        &engine.ops.scontrol,
        &partition,
        limit,
        &engine.node,
        (slot::SlotFor::Upgrade, &engine.instance_id),
        engine.upgrade.slot_timeout.0,
    )
    .await?;
    let name = match taken {
        Taken::Full(held) => {
            let holders: Vec<&str> = held.iter().map(|s| s.node.as_str()).collect();
            tracing::info!(
                partition,
                used = held.len(),
                limit,
                ?holders,
                nodes = count.total,
                "every upgrade budget slot is held; waiting"
            );
            budget.set_waiting(Some(super::budget::SlotWait {
                partition: partition.clone(),
                limit,
                since: std::time::Instant::now(),
            }));
            return Ok(Check::Waiting {
                used: held.len(),
                limit,
            });
        }
        Taken::New(name) | Taken::Held(name) => name,
    };
    budget.renewed_now();
    if not_from_parameter {
        return stuck_after_launch(engine, &node, &current, &desired, launched_at, published_at)
            .await
            .map(|()| Check::Stuck {
                current,
                desired,
                previous: None,
            });
    }
    let r = engine.request(cause).await?;
    if !matches!(r.begin, Begin::Started) {
        // Another drain came first: the slot goes back at once (a repair's, taken under
        // the same name, stays the repair's).
        slot::release_for(&engine.ops.scontrol, &engine.node, slot::SlotFor::Upgrade).await?;
        return Ok(Check::Busy);
    }
    tracing::info!(decision = "upgrade.drain", %current, %desired, slot = %name, "upgrade drain started");
    Ok(Check::Started { current, desired })
}

/// The node runs the desired image (`current`): lifts an upgrade drain left on it
/// ([`lift_leftover`]), releases the slot its NodeName holds once it is in service, and
/// says whether it is on its way into service while a slot is held (the next check then
/// comes at the drain's pace).
///
/// # Errors
/// [`DrainError`] from Slurm or the state.
async fn up_to_date(
    engine: &Engine,
    phase: Phase,
    desired: &str,
    current: String,
) -> Result<Check, DrainError> {
    // slurmctld's record, read once for the leftover drain and the hand-off.
    let node = engine.ops.scontrol.show_node(&engine.node).await?;
    let lifted = match (&node, phase) {
        (Some(n), Phase::Active) => lift_leftover(engine, n, desired, &current).await?,
        _ => false,
    };
    // A drain just lifted (a replacement under the same NodeName lifts its
    // predecessor's): the slot is released by the next check once the node is in
    // service, so that check comes at the drain's pace while a slot is held, not a
    // poll interval later (the next node of a rollout waited up to 1.2 intervals).
    let returning = if lifted {
        slot::any_held(&engine.ops.scontrol).await?
    } else {
        returning(engine, node.as_ref()).await?
    };
    Ok(Check::UpToDate {
        image: current,
        returning,
    })
}

/// The drain key of the upgrade `current -> desired`.
fn cause_key(current: &str, desired: &str) -> String {
    Cause::Upgrade {
        current: current.to_string(),
        desired: desired.to_string(),
    }
    .key()
}

/// Releases the slot this NodeName holds once the node takes jobs again (not drained,
/// responding): the end of its time out of service for an upgrade.
async fn release_when_back(engine: &Engine) -> Result<(), DrainError> {
    let Some(node) = engine.ops.scontrol.show_node(&engine.node).await? else {
        return Ok(());
    };
    if !node.is_available() {
        return Ok(());
    }
    let released = slot::release(&engine.ops.scontrol, &engine.node).await?;
    if !released.is_empty() {
        tracing::info!(node = %engine.node, ?released, state = node.state(), "back in service: released the upgrade budget slot");
    }
    Ok(())
}

/// Whether this node, up to date, is not in service yet in its first
/// `upgrade.slot_timeout` after slurmd's start while a slot of the agent's budget is held
/// in slurmctld: a replacement on its way in, whose check in service releases a slot (its
/// NodeName's, or a gone holder's). Not a node drained for any other reason than its
/// predecessor's upgrade or repair (its own health checks, an administrator): it is not
/// coming into service soon, and its checks stay at the poll's pace.
async fn returning(
    engine: &Engine,
    node: Option<&crate::slurm::NodeInfo>,
) -> Result<bool, DrainError> {
    let Some(node) = node else {
        return Ok(false);
    };
    if node.is_available() || !in_replacement_window(engine, node) {
        return Ok(false);
    }
    let me = engine.instance_id.as_str();
    let predecessors = node.reason().is_some_and(|r| {
        parse_upgrade_reason(r).is_some_and(|u| u.instance_id.is_some_and(|i| i != me))
            || crate::repair::parse_reason(r).is_some_and(|p| p.instance_id != me)
    });
    if node.is_drained() && !predecessors {
        return Ok(false);
    }
    Ok(slot::any_held(&engine.ops.scontrol).await?)
}

/// Whether `node`'s slurmd started (SlurmdStartTime, which this instance's slurmd reported)
/// within `upgrade.slot_timeout`: the time a replacement has to come up before its
/// predecessor's slot ends anyway.
fn in_replacement_window(engine: &Engine, node: &crate::slurm::NodeInfo) -> bool {
    let window = i64::try_from(engine.upgrade.slot_timeout.0.as_secs()).unwrap_or(i64::MAX);
    node.slurmd_start_time()
        .is_some_and(|t| crate::time::now().saturating_sub(t) <= window)
}

/// slurmctld's record of this node (`scontrol show node`); a node it does not know is
/// [`DrainError::UnknownNode`].
async fn record(engine: &Engine) -> Result<crate::slurm::NodeInfo, DrainError> {
    engine
        .ops
        .scontrol
        .show_node(&engine.node)
        .await?
        .ok_or_else(|| DrainError::UnknownNode {
            node: engine.node.clone(),
        })
}

/// The node is drained with an upgrade reason of the agent while the state machine has no
/// drain: what did an earlier instance (or this one) leave, and does it still apply?
///
/// Returns [`Check::Stuck`] when another instance drained for `desired` and this one still
/// runs `current`, or this instance's own stuck reason still applies
/// (`not_from_parameter`, for one written because of its launch time); resumes the node
/// when the reason names another desired image (stale); `None` otherwise (nothing there,
/// an admin's reason, or a launch-time stuck reason after the image was published again:
/// the check goes on to the upgrade, in the slot the node holds).
async fn replacement_loop(
    engine: &Engine,
    budget: &Budget,
    current: &str,
    desired: &str,
    not_from_parameter: bool,
) -> Result<Option<Check>, DrainError> {
    let node = record(engine).await?;
    if !node.is_drained() {
        return Ok(None);
    }
    let Some(reason) = node.reason().map(str::to_string) else {
        return Ok(None);
    };
    let Some(r) = parse_upgrade_reason(&reason) else {
        return Ok(None);
    };
    let ours = r.instance_id == Some(engine.instance_id.as_str());
    let previous = r.instance_id.filter(|_| !ours);
    let for_desired = r.images().is_some_and(|(_, d)| d == desired)
        || (ours && r.detail.starts_with(STUCK) && r.detail.contains(desired));
    if !for_desired {
        tracing::info!(node = %engine.node, %reason, "lifting an upgrade drain for another image than the desired {desired}");
        engine.gateway.lift(CauseKind::Upgrade, Some(&node)).await?;
        return Ok(None);
    }
    let previous = match previous {
        Some(p) => p.to_string(),
        None if ours => match r.detail.split_once(STUCK_THAT_INSTANCE) {
            Some((_, p)) => p.split(' ').next().unwrap_or("unknown").to_string(),
            // Stuck because of its launch time: for as long as that holds.
            None if not_from_parameter => {
                tracing::error!(
                    node = %engine.node,
                    %current,
                    %desired,
                    "UPGRADE LOOP: this instance was launched after {} named {desired} and still \
                     runs {current}; it stays drained and holds its upgrade budget slot until the \
                     image is published again",
                    engine.upgrade.parameter
                );
                budget.renew_if_due(engine).await;
                return Ok(Some(Check::Stuck {
                    current: current.to_string(),
                    desired: desired.to_string(),
                    previous: None,
                }));
            }
            None => {
                tracing::info!(node = %engine.node, %desired, "{desired} was published again after this instance launched; upgrading from the slot it holds");
                return Ok(None);
            }
        },
        None => return Ok(None),
    };
    tracing::error!(
        node = %engine.node,
        %current,
        %desired,
        previous_instance = %previous,
        "UPGRADE LOOP: instance {previous} of this node already drained for {desired}, and this \
         instance still runs {current}: the launch template does not follow the parameter. \
         Not powering off again; the node stays drained and holds an upgrade budget slot, so \
         the rollout stops. Point the launch template at {desired} (or at \
         resolve:ssm:{}), then publish again.",
        engine.upgrade.parameter
    );
    let stuck = upgrade_reason(
        &engine.instance_id,
        &format!(
            "{STUCK}{current}, not {desired}{STUCK_THAT_INSTANCE}{previous} drained for: launch template does not follow {}",
            engine.upgrade.parameter
        ),
    );
    if !ours {
        engine.gateway.relabel(&stuck, Some(&node)).await?;
    }
    // Out of service because of the upgrade: the slot its NodeName holds stays held.
    budget.renew_if_due(engine).await;
    Ok(Some(Check::Stuck {
        current: current.to_string(),
        desired: desired.to_string(),
        previous: Some(previous),
    }))
}

/// In the detail of a stuck reason, before the instance of the same NodeName that drained
/// for the desired image.
const STUCK_THAT_INSTANCE: &str = " that instance ";

/// This instance was launched after `desired` was published and still runs `current`
/// (under whatever NodeName): it holds a budget slot now; it drains with a reason saying
/// so, and stays drained with no action, so the rollout stops after the budget.
async fn stuck_after_launch(
    engine: &Engine,
    node: &crate::slurm::NodeInfo,
    current: &str,
    desired: &str,
    launched_at: Option<i64>,
    published_at: Option<i64>,
) -> Result<(), DrainError> {
    let param = &engine.upgrade.parameter;
    let at = |t: Option<i64>| t.map_or_else(|| "unknown".to_string(), crate::time::format);
    tracing::error!(
        node = %engine.node,
        %current,
        %desired,
        launched = %at(launched_at),
        published = %at(published_at),
        "UPGRADE LOOP: this instance was launched at {} after {param} named {desired} at {}, \
         and still runs {current}: the launch template does not follow the parameter. Not \
         powering off (the replacement would run {current} again); the node drains and holds \
         an upgrade budget slot, so the rollout stops. Point the launch template at \
         resolve:ssm:{param}, then publish again.",
        at(launched_at),
        at(published_at),
    );
    let stuck = upgrade_reason(
        &engine.instance_id,
        &format!(
            "{STUCK}{current}, not {desired} that {param} named before this instance launched: launch template does not follow {param}"
        ),
    );
    engine.gateway.relabel(&stuck, Some(node)).await
}

/// Up to date: an upgrade drain the agent left on the node (an earlier instance's, or a
/// stuck replacement's) no longer applies; lift it. A node in service releases the
/// upgrade budget slot its NodeName holds (the next check, after a lift).
async fn lift_leftover(
    engine: &Engine,
    node: &crate::slurm::NodeInfo,
    desired: &str,
    current: &str,
) -> Result<bool, DrainError> {
    let leftover = node.is_drained()
        && node
            .reason()
            .and_then(parse_upgrade_reason)
            .is_some_and(|r| r.instance_id.is_some());
    if leftover {
        tracing::info!(node = %engine.node, %current, %desired, reason = ?node.reason(), "the node runs the desired image; lifting the upgrade drain left on it");
        engine.gateway.lift(CauseKind::Upgrade, Some(node)).await?;
        return Ok(true);
    }
    if node.is_available() {
        let released = slot::release(&engine.ops.scontrol, &engine.node).await?;
        if !released.is_empty() {
            tracing::info!(node = %engine.node, image = %current, ?released, state = node.state(), "up to date and in service: released the upgrade budget slot");
        } else {
            release_for_a_holder_that_is_gone(engine, node, current).await?;
        }
    }
    Ok(false)
}

/// A node up to date and in service that holds no slot (or a replacement stuck on the old
/// image, about to take a slot of its own), in its first `upgrade.slot_timeout` after its
/// slurmd started (the time a replacement has to come up before its predecessor's slot
/// ends anyway): releases the slot of one holder of its partition that is gone, once per
/// instance, and deletes that holder's dynamic record. That is how a replacement under
/// another NodeName (an Auto Scaling group's, named after its host) ends its
/// predecessor's time out of service ([`slot::release_for_replacement`]).
pub async fn release_for_a_holder_that_is_gone(
    engine: &Engine,
    node: &crate::slurm::NodeInfo,
    image: &str,
) -> Result<(), DrainError> {
    if engine.load()?.replaced_slot_released_by.as_deref() == Some(engine.instance_id.as_str()) {
        return Ok(());
    }
    // In service for less than a slot's lifetime.
    if !in_replacement_window(engine, node) {
        return Ok(());
    }
    let partition = Budget::partition(engine, node);
    let Some(r) =
        slot::release_for_replacement(&engine.ops.scontrol, &partition, &engine.node).await?
    else {
        return Ok(());
    };
    {
        let _lock = engine.gateway.lock().await?;
        let mut st = engine.gateway.load()?;
        st.replaced_slot_released_by = Some(engine.instance_id.clone());
        engine.gateway.save(&st)?;
    }
    tracing::info!(
        node = %engine.node,
        %image,
        slot = %r.slot.name,
        holder = %r.slot.node,
        holder_instance = r.slot.instance_id().unwrap_or("unknown"),
        holder_record = if r.holder.is_some() { "powered off" } else { "deleted" },
        "in service under another NodeName: released the upgrade budget slot of a holder that is gone"
    );
    // Nothing registers under the holder's NodeName again: its dynamic record goes, so
    // that records of replaced nodes do not pile up against MaxNodeCount (with
    // `upgrade.delete_node_record` the holder deleted it itself when its slot let it).
    if let Some(holder) = &r.holder {
        match engine
            .gateway
            .delete_predecessor_record(holder.name())
            .await
        {
            Ok(true) => tracing::info!(
                node = %engine.node,
                holder = %holder.name(),
                "deleted the dynamic node record of the holder that powered off for the upgrade (replaced under another NodeName)"
            ),
            Ok(false) => {}
            Err(e) => tracing::warn!(
                node = %engine.node,
                holder = %holder.name(),
                "could not delete the record of the holder that powered off for the upgrade: {e}"
            ),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Stands in for scontrol: `show node -o X` prints `node-X`, `show reservation -o`
    /// prints `listed`, `delete reservation R` notes R in `deleted`, `delete NodeName=X`
    /// notes it in `deleted-records`, `update NodeName=X ...` notes its words in `updates`
    /// (`State=RESUME` also takes the drain and the reason off `node-X`).
    const FAKE: &str = r#"#!/bin/sh
d=$(dirname "$0")
case "$1 $2" in
"show node") if [ -f "$d/node-$4" ]; then cat "$d/node-$4"; exit 0; fi
  echo "Node $4 not found" >&2; exit 1 ;;
"show reservation") cat "$d/listed"; exit 0 ;;
"delete reservation") echo "$3" >> "$d/deleted" ;;
"delete NodeName="*) echo "$2" >> "$d/deleted-records" ;;
"update NodeName="*) echo "$2 $3" >> "$d/updates"
  [ "$3" = State=RESUME ] && sed -i 's/+DRAIN//; s/ Reason=.*$//' "$d/node-${2#NodeName=}" ;;
*) exit 1 ;;
esac
"#;

    /// The reason holder `ip-10-0-0-1`'s instance wrote before it powered off.
    const GONE: &str = "slurm-node-agent/upgrade@i-0000000000000000a: powered off for image upgrade ami-0a887e401f7654935 -> ami-0123456789abcdef0";

    /// A folder with [`FAKE`] as `scontrol` and `listed` as its reservations.
    fn fake_slurm(listed: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        crate::fsutil::write_test_program(&bin.join("scontrol"), FAKE);
        std::fs::write(bin.join("listed"), listed).unwrap();
        (dir, bin)
    }

    /// The record of `ip-10-0-0-9`, IDLE in `main`, its slurmd started `secs_ago`.
    fn replacement_record(secs_ago: i64) -> String {
        let at = crate::time::format(crate::time::now() - secs_ago);
        format!(
            "NodeName=ip-10-0-0-9 State=IDLE Partitions=main SlurmdStartTime={}\n",
            at.trim_end_matches('Z')
        )
    }

    /// The engine of `ip-10-0-0-9`, instance `instance`, over the fake.
    /// [`lift_leftover`] on the record slurmctld has now, as [`check`] calls it.
    async fn lift_leftover_now(engine: &Engine, desired: &str, current: &str) {
        let node = engine.ops.scontrol.show_node(&engine.node).await.unwrap();
        lift_leftover(engine, &node.unwrap(), desired, current)
            .await
            .unwrap();
    }

    fn engine_of(dir: &tempfile::TempDir, bin: &std::path::Path, instance: &str) -> Engine {
        Engine::new(
            "ip-10-0-0-9",
            &dir.path().join("state"),
            bin,
            &crate::drain::DrainSettings::default(),
            &crate::upgrade::UpgradeSettings::default(),
            crate::drain::SpotJobs::default(),
            "",
        )
        .with_instance(instance)
    }

    /// A holder whose NodeName another instance registered since (a replacement under the
    /// same NodeName, booting: `InstanceId` is not the slot's) is not gone: its slot and its
    /// record stay for that replacement.
    #[tokio::test]
    async fn a_holder_registered_again_under_its_name_keeps_its_slot_and_record() {
        let (dir, bin) = fake_slurm(
            "ReservationName=slurm-node-agent-upgrade-main-slot-1 EndTime=2026-12-04T03:40:00 Nodes=ip-10-0-0-1 Comment=slurm-node-agent/upgrade@i-0000000000000000a\n",
        );
        let gone = GONE;
        let holder = |instance: &str| {
            format!("NodeName=ip-10-0-0-1 State=IDLE+DRAIN+DYNAMIC_NORM InstanceId={instance} Reason={gone} [root@2026-12-04T03:10:00]\n")
        };
        std::fs::write(bin.join("node-ip-10-0-0-1"), holder("i-0000000000000000c")).unwrap();
        std::fs::write(bin.join("node-ip-10-0-0-9"), replacement_record(60)).unwrap();
        let engine = engine_of(&dir, &bin, "i-0000000000000000f");
        let image = "ami-0123456789abcdef0";
        lift_leftover_now(&engine, image, image).await;
        assert!(!bin.join("deleted").exists(), "a slot was released");
        assert!(
            !bin.join("deleted-records").exists(),
            "a record was deleted"
        );

        // The holder's own instance as the last registration: gone; released, deleted.
        std::fs::write(bin.join("node-ip-10-0-0-1"), holder("i-0000000000000000a")).unwrap();
        lift_leftover_now(&engine, image, image).await;
        assert_eq!(
            std::fs::read_to_string(bin.join("deleted-records")).unwrap(),
            "NodeName=ip-10-0-0-1\n"
        );
    }

    /// A replacement under a new NodeName, up to date and in service: it releases one slot
    /// of a holder that is gone, once per instance (a second check, and the daemon started
    /// again on the same state, release no other), and only within `upgrade.slot_timeout`
    /// of its slurmd's start; the holder's dynamic record is deleted with it (nothing
    /// registers under that name again), a static one is not.
    #[tokio::test]
    async fn a_replacement_under_a_new_name_releases_one_gone_holders_slot_once() {
        let (dir, bin) = fake_slurm(
            "ReservationName=slurm-node-agent-upgrade-main-slot-1 EndTime=2026-12-04T03:40:00 Nodes=ip-10-0-0-1 Comment=slurm-node-agent/upgrade@i-0000000000000000a\n\
             ReservationName=slurm-node-agent-upgrade-main-slot-2 EndTime=2026-12-04T03:50:00 Nodes=ip-10-0-0-2 Comment=slurm-node-agent/upgrade@i-0000000000000000b\n",
        );
        let gone = GONE;
        std::fs::write(
            bin.join("node-ip-10-0-0-1"),
            format!("NodeName=ip-10-0-0-1 State=IDLE+DRAIN+DYNAMIC_NORM+NOT_RESPONDING Reason={gone} [root@2026-12-04T03:10:00]\n"),
        )
        .unwrap();
        // slot-2's holder was deleted: gone as well.
        let started = replacement_record;
        let engine = || engine_of(&dir, &bin, "i-0000000000000000f");
        let deleted = || std::fs::read_to_string(bin.join("deleted")).unwrap_or_default();
        let image = "ami-0123456789abcdef0";

        // Long after its slurmd started (past slot_timeout, 30 min): nothing released.
        std::fs::write(bin.join("node-ip-10-0-0-9"), started(3600)).unwrap();
        lift_leftover_now(&engine(), image, image).await;
        assert_eq!(deleted(), "");

        // Just joined: the oldest gone holder's slot, once.
        std::fs::write(bin.join("node-ip-10-0-0-9"), started(60)).unwrap();
        lift_leftover_now(&engine(), image, image).await;
        assert_eq!(deleted(), "slurm-node-agent-upgrade-main-slot-1\n");
        let records = || std::fs::read_to_string(bin.join("deleted-records")).unwrap_or_default();
        assert_eq!(records(), "NodeName=ip-10-0-0-1\n");
        lift_leftover_now(&engine(), image, image).await;
        lift_leftover_now(&engine(), image, image).await;
        assert_eq!(deleted(), "slurm-node-agent-upgrade-main-slot-1\n");
        assert_eq!(records(), "NodeName=ip-10-0-0-1\n");
        assert_eq!(
            engine()
                .load()
                .unwrap()
                .replaced_slot_released_by
                .as_deref(),
            Some("i-0000000000000000f")
        );

        // Another instance under another name: slot-2's holder was deleted already (no
        // record to delete); a static holder's record (no DYNAMIC_NORM) would stay.
        std::fs::write(
            bin.join("node-ip-10-0-0-1"),
            format!("NodeName=ip-10-0-0-1 State=IDLE+DRAIN+NOT_RESPONDING Reason={gone} [root@2026-12-04T03:10:00]\n"),
        )
        .unwrap();
        std::fs::write(
            bin.join("listed"),
            std::fs::read_to_string(bin.join("listed"))
                .unwrap()
                .lines()
                .next()
                .unwrap(),
        )
        .unwrap();
        let other = engine().with_instance("i-0000000000000000e");
        lift_leftover_now(&other, image, image).await;
        assert_eq!(
            deleted(),
            "slurm-node-agent-upgrade-main-slot-1\nslurm-node-agent-upgrade-main-slot-1\n"
        );
        assert_eq!(
            records(),
            "NodeName=ip-10-0-0-1\n",
            "a static record was deleted"
        );
    }

    /// A replacement under the same NodeName finds its predecessor's upgrade drain and
    /// lifts it before its slurmd has registered: its slot is released by the next check,
    /// which must come at the drain's pace (`returning`), not a poll interval later. Once
    /// in service that check releases the slot and the node is no longer returning.
    #[tokio::test]
    async fn a_replacement_lifting_its_predecessors_drain_checks_again_soon_then_releases_its_slot()
    {
        let slot = "ReservationName=slurm-node-agent-upgrade-main-slot-1 EndTime=2026-12-04T03:40:00 Nodes=ip-10-0-0-9 Comment=slurm-node-agent/upgrade@i-0000000000000000a\n";
        let (dir, bin) = fake_slurm(slot);
        let image = "ami-0123456789abcdef0";
        let record = replacement_record(5);
        std::fs::write(
            bin.join("node-ip-10-0-0-9"),
            record.replace(
                "State=IDLE ",
                "State=IDLE+DRAIN+DYNAMIC_NORM+NOT_RESPONDING ",
            ).trim_end().to_string()
                + &format!(" Reason=slurm-node-agent/upgrade@i-0000000000000000a: powered off for image upgrade ami-0a887e401f7654935 -> {image}\n"),
        )
        .unwrap();
        let engine = engine_of(&dir, &bin, "i-0000000000000000f");
        let deleted = || std::fs::read_to_string(bin.join("deleted")).unwrap_or_default();

        let c = up_to_date(&engine, Phase::Active, image, image.to_string())
            .await
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(bin.join("updates")).unwrap(),
            "NodeName=ip-10-0-0-9 State=RESUME\n"
        );
        assert!(c.wants_check_soon(), "{c:?}");
        assert_eq!(deleted(), "", "released before the node is in service");

        // slurmd registered: in service, the slot goes, and the pace is the poll's again.
        std::fs::write(bin.join("node-ip-10-0-0-9"), record).unwrap();
        let c = up_to_date(&engine, Phase::Active, image, image.to_string())
            .await
            .unwrap();
        assert_eq!(deleted(), "slurm-node-agent-upgrade-main-slot-1\n");
        assert!(!c.wants_check_soon(), "{c:?}");
        std::fs::write(bin.join("listed"), "").unwrap();

        // With no slot held anywhere, a lift does not quicken the checks.
        std::fs::write(
            bin.join("node-ip-10-0-0-9"),
            replacement_record(5).replace("State=IDLE ", "State=IDLE+DRAIN+DYNAMIC_NORM ").trim_end().to_string()
                + &format!(" Reason=slurm-node-agent/upgrade@i-0000000000000000a: powered off for image upgrade ami-0a887e401f7654935 -> {image}\n"),
        )
        .unwrap();
        let c = up_to_date(&engine, Phase::Active, image, image.to_string())
            .await
            .unwrap();
        assert!(!c.wants_check_soon(), "{c:?}");
        assert_eq!(
            std::fs::read_to_string(bin.join("updates"))
                .unwrap()
                .lines()
                .count(),
            2,
            "the second leftover drain was not lifted"
        );
    }

    /// Clients of SSM and EC2 whose endpoint refuses every connection: a call that is made
    /// fails at once.
    fn refused_aws() -> (aws_sdk_ssm::Client, aws_sdk_ec2::Client) {
        let creds =
            aws_sdk_ssm::config::Credentials::new("ASIACHECKTESTS000001", "s", None, None, "t");
        let ssm = aws_sdk_ssm::Config::builder()
            .behavior_version(aws_sdk_ssm::config::BehaviorVersion::latest())
            .region(aws_sdk_ssm::config::Region::new("us-east-1"))
            .endpoint_url("http://127.0.0.1:1")
            .retry_config(aws_sdk_ssm::config::retry::RetryConfig::disabled())
            .credentials_provider(creds.clone())
            .build();
        let ec2 = aws_sdk_ec2::Config::builder()
            .behavior_version(aws_sdk_ec2::config::BehaviorVersion::latest())
            .region(aws_sdk_ec2::config::Region::new("us-east-1"))
            .endpoint_url("http://127.0.0.1:1")
            .retry_config(aws_sdk_ec2::config::retry::RetryConfig::disabled())
            .credentials_provider(creds)
            .build();
        (
            aws_sdk_ssm::Client::from_conf(ssm),
            aws_sdk_ec2::Client::from_conf(ec2),
        )
    }

    /// A node waiting for a slot tries again with one read of the reservations: while its
    /// partition's slots are all held it makes no AWS call and reads no node record; once
    /// one is free it makes the full check (its error reading the parameter shows that it
    /// did), and a
    /// slot of another partition does not count.
    #[tokio::test]
    async fn a_node_waiting_for_a_slot_reads_the_slots_alone_until_one_is_free() {
        let held = "ReservationName=slurm-node-agent-upgrade-main-slot-1 EndTime=2026-12-04T03:40:00 Nodes=ip-10-0-0-1 Comment=slurm-node-agent/upgrade@i-0000000000000000a\n\
                    ReservationName=slurm-node-agent-upgrade-other-slot-1 EndTime=2026-12-04T03:40:00 Nodes=ip-10-0-0-2 Comment=slurm-node-agent/upgrade@i-0000000000000000b\n";
        let (dir, bin) = fake_slurm(held);
        let engine = engine_of(&dir, &bin, "i-0000000000000000f");
        let (ssm, ec2) = refused_aws();
        let budget = Budget::new();
        budget.set_waiting(Some(super::super::budget::SlotWait {
            partition: "main".into(),
            limit: 1,
            since: std::time::Instant::now(),
        }));
        let c = check(&engine, &budget, &ssm, &ec2, "ami-0a887e401f7654935", None)
            .await
            .unwrap();
        assert_eq!(c, Check::Waiting { used: 1, limit: 1 });
        assert!(budget.waiting().is_some());

        // main's slot is free (only another partition's is held): the full check runs.
        std::fs::write(bin.join("listed"), held.lines().nth(1).unwrap()).unwrap();
        let c = check(&engine, &budget, &ssm, &ec2, "ami-0a887e401f7654935", None)
            .await
            .unwrap();
        assert!(matches!(c, Check::Error(_)), "{c:?}");
        assert_eq!(budget.waiting(), None);
    }
}
