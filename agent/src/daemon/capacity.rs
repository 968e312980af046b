//! The daemon's watch on the Capacity Block the instance runs in (`events.capacity_block`):
//! one lookup at start ([`crate::capacity_block::lookup`]), then the block's end read again
//! every `events.capacity_block_interval` (an extension moves it). An instance in no
//! Capacity Block is settled by the first good lookup and never looked up again (a running
//! instance's capacity reservation does not change). The drain decision
//! ([`crate::events::decide`]) is taken from the last good lookup at every notices poll, so
//! that the node drains on time whatever the interval.
//!
//! A failed lookup never undoes anything: the last good one stands. The first failure is a
//! warning (naming the IAM action when EC2 denied it), later ones are logged at debug
//! level until a lookup succeeds again.

use crate::capacity_block::{self, CapacityBlock};
use crate::events::Observed;

use super::Ctx;

/// What the lookups found so far.
#[derive(Debug, Default)]
pub(super) struct CapacityLook {
    /// The last good lookup (`None` before the first): `Absent` for no Capacity Block.
    seen: Option<Observed<CapacityBlock>>,
    /// The capacity reservation of the instance, once read (`Some(None)`: none).
    reservation: Option<Option<String>>,
    /// A failure was logged as a warning since the last good lookup.
    warned: bool,
}

fn lock(ctx: &Ctx) -> std::sync::MutexGuard<'_, CapacityLook> {
    ctx.capacity.lock().unwrap_or_else(|p| p.into_inner())
}

/// The last good lookup, for the notices' decisions (`None`: off, or none succeeded yet).
pub(super) fn cached(ctx: &Ctx) -> Option<Observed<CapacityBlock>> {
    if !ctx.s.events.capacity_block {
        return None;
    }
    lock(ctx).seen.clone()
}

/// Looks the block up again (the reservation's end only, once the reservation is known;
/// nothing once the instance is known to be in none) and returns the last good lookup.
pub(super) async fn look(ctx: &Ctx) -> Option<Observed<CapacityBlock>> {
    if !ctx.s.events.capacity_block {
        return None;
    }
    let ec2 = ctx.capacity_ec2.as_ref()?;
    let instance_id = &ctx.id.instance_id;
    let known = lock(ctx).reservation.clone();
    let reservation = match known {
        Some(None) => return cached(ctx),
        Some(Some(id)) => Ok(Some(id)),
        None => capacity_block::reservation_of(ec2, instance_id).await,
    };
    let found = match reservation {
        Ok(Some(id)) => capacity_block::describe(ec2, instance_id, &id)
            .await
            .map(|b| (Some(id), b)),
        Ok(None) => Ok((None, None)),
        Err(e) => Err(e),
    };
    let mut st = lock(ctx);
    match found {
        Ok((reservation, block)) => {
            st.warned = false;
            if st.reservation.is_none() && block.is_none() {
                tracing::info!(
                    instance_id = %instance_id,
                    capacity_reservation = reservation.as_deref().unwrap_or("none"),
                    "not in a Capacity Block: no drain ahead of a block's end"
                );
            }
            // A reservation that is not a Capacity Block never becomes one.
            st.reservation = Some(reservation.filter(|_| block.is_some()));
            let previous = match &st.seen {
                Some(Observed::Present(b)) => b.end,
                _ => None,
            };
            match block {
                Some(b) => {
                    if st.seen.is_none() || previous != b.end {
                        announce(ctx, &b, previous);
                    }
                    st.seen = Some(Observed::Present(b));
                }
                None => st.seen = Some(Observed::Absent),
            }
        }
        Err(e) if !st.warned => {
            st.warned = true;
            if e.is_access_denied() {
                tracing::warn!(
                    iam_action = %e.iam_action(),
                    "{e}; the instance profile needs {} to drain ahead of a Capacity Block's end",
                    e.iam_action()
                );
            } else {
                tracing::warn!(
                    "{e}; the last lookup stands, tried again in {}",
                    ctx.s.events.capacity_block_interval
                );
            }
        }
        Err(e) => tracing::debug!("{e}"),
    }
    st.seen.clone()
}

/// Says in the journal when the block ends and when the node drains for it (at the first
/// lookup, and when the end moved: an extension); warns when `events.capacity_block_lead`
/// is longer than the block itself.
fn announce(ctx: &Ctx, b: &CapacityBlock, previous: Option<i64>) {
    let lead = &ctx.s.events.capacity_block_lead;
    let Some(end) = b.end else {
        tracing::info!(
            capacity_reservation = %b.reservation_id,
            "in a Capacity Block without an end date: left alone"
        );
        return;
    };
    let reclaim = end - crate::node_state::CAPACITY_BLOCK_RECLAIM_SECS;
    let lead_secs = i64::try_from(lead.0.as_secs()).unwrap_or(i64::MAX);
    tracing::info!(
        capacity_reservation = %b.reservation_id,
        state = %b.state,
        end = %crate::time::format(end),
        previous_end = previous.map(crate::time::format).unwrap_or_default(),
        reclaim_from = %crate::time::format(reclaim),
        drain_from = %crate::time::format(reclaim.saturating_sub(lead_secs)),
        "{}",
        if previous.is_some() {
            "the Capacity Block's end moved (extended)"
        } else {
            "in a Capacity Block: draining events.capacity_block_lead before EC2 begins terminating its instances"
        }
    );
    if let Some(start) = b.start {
        if reclaim.saturating_sub(lead_secs) <= start {
            tracing::warn!(
                capacity_reservation = %b.reservation_id,
                "events.capacity_block_lead = {lead} is longer than Capacity Block {} leaves ({} to {}, EC2 terminating its instances from {}): the node drains as soon as it runs",
                b.reservation_id,
                crate::time::format(start),
                crate::time::format(end),
                crate::time::format(reclaim)
            );
        }
    }
}
