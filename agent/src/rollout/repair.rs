//! A repair's place in the budget (`repair.mode = "on"`): the same slots as an upgrade
//! ([`super::slot`], comment `slurm-node-agent/repair@<instance-id>`), taken before the
//! repair's drain and held until the node is back in service (after a reboot) or its
//! replacement is (under the same NodeName, or another one: [`back_in_service`]).

use super::budget::Budget;
use super::slot::{self, SlotFor, Taken};
use crate::drain::{DrainError, Engine};
use crate::slurm::NodeInfo;

/// What [`take`] got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepairSlot {
    /// A slot, taken now or held already by this NodeName.
    Held(String),
    /// Every slot of the partition is held.
    Full {
        /// The partition (empty: every node).
        partition: String,
        /// Slots held.
        used: usize,
        /// `upgrade.max_unavailable` of the partition's nodes.
        limit: usize,
    },
}

/// Takes a slot of `node`'s partition for a repair ([`slot::take`], the budget of
/// [`Budget::of`]).
///
/// # Errors
/// [`DrainError`] from scontrol.
pub async fn take(
    engine: &Engine,
    budget: &Budget,
    node: &NodeInfo,
) -> Result<RepairSlot, DrainError> {
    let (partition, _count, limit) = Budget::of(engine, node).await?;
    let taken = slot::take(
        &engine.ops.scontrol,
        &partition,
        limit,
        &engine.node,
        (SlotFor::Repair, &engine.instance_id),
        engine.upgrade.slot_timeout.0,
    )
    .await?;
    Ok(match taken {
        Taken::New(name) | Taken::Held(name) => {
            budget.renewed_now();
            RepairSlot::Held(name)
        }
        Taken::Full(held) => RepairSlot::Full {
            partition,
            used: held.len(),
            limit,
        },
    })
}

/// Releases the slots this NodeName holds for a repair ([`slot::release_for`]; an
/// upgrade's stays).
///
/// # Errors
/// [`DrainError`] from scontrol.
pub async fn release(engine: &Engine) -> Result<Vec<String>, DrainError> {
    Ok(slot::release_for(&engine.ops.scontrol, &engine.node, SlotFor::Repair).await?)
}

/// Releases the repair slots this NodeName holds for another instance (a predecessor of
/// the same NodeName that powered off for its replacement; this instance may be faulty too
/// and held back by the flap guard, so it would not release them by being in service).
///
/// # Errors
/// [`DrainError`] from scontrol.
pub async fn release_predecessors(engine: &Engine) -> Result<Vec<String>, DrainError> {
    Ok(slot::release_matching(&engine.ops.scontrol, |s| {
        s.node == engine.node
            && s.held_for() == Some(SlotFor::Repair)
            && s.instance_id() != Some(engine.instance_id.as_str())
    })
    .await?)
}

/// The node is healthy and in service (`record`, as slurmctld holds it, available): the
/// slots its NodeName holds are released (its own after a repair's reboot, a predecessor's
/// of the same NodeName that was replaced), and, in its first `upgrade.slot_timeout` after
/// its slurmd started, one slot of a holder of its partition that is gone (a predecessor
/// under another NodeName, [`super::check::release_for_a_holder_that_is_gone`]; once per
/// instance). Returns the slots released under this NodeName; nothing when the node is not
/// available.
///
/// # Errors
/// [`DrainError`] from scontrol or the state.
pub async fn back_in_service(
    engine: &Engine,
    record: &NodeInfo,
    image: &str,
) -> Result<Vec<String>, DrainError> {
    if !record.is_available() {
        return Ok(Vec::new());
    }
    // In service: no slot of this NodeName's is still needed, whatever it was held for.
    let released = slot::release(&engine.ops.scontrol, &engine.node).await?;
    if released.is_empty() {
        super::check::release_for_a_holder_that_is_gone(engine, record, image).await?;
    }
    Ok(released)
}

/// Deletes the dynamic records of nodes powered off for a repair's replacement longer
/// than `window` (`repair.flap_window`) ago: the flap guard's history they were is over,
/// and nothing registers under their names again (a replacement under the same NodeName
/// has registered over its record long before). Returns the names deleted; a failure is
/// logged and the others tried.
///
/// # Errors
/// [`DrainError`] when slurmctld's records cannot be read.
pub async fn forget_replaced(
    engine: &Engine,
    window: std::time::Duration,
) -> Result<Vec<String>, DrainError> {
    let before =
        crate::time::now().saturating_sub(i64::try_from(window.as_secs()).unwrap_or(i64::MAX));
    let fleet = engine.gateway.fleet().await?;
    let mut deleted = Vec::new();
    for n in fleet.iter().filter(|n| {
        n.reason()
            .and_then(crate::repair::parse_reason)
            .and_then(|p| p.powered_off_at())
            .is_some_and(|at| at < before)
    }) {
        match engine
            .gateway
            .delete_replaced_record(n.name(), before)
            .await
        {
            Ok(true) => deleted.push(n.name().to_string()),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(node = %engine.node, record = n.name(), "could not delete the record of a node replaced by a repair: {e}")
            }
        }
    }
    Ok(deleted)
}
