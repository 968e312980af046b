//! One upgrade check: desired image vs running image, the budget, and the drain request.

use super::{desired_image, Budget, DesiredImageError};
use crate::drain::{state, Begin, Cause, DrainError, Engine, Phase};

/// What an upgrade check found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// The running (or last applied) image is the desired one.
    UpToDate {
        /// The image.
        image: String,
    },
    /// Another drain is in progress, or this upgrade was already handled: nothing done.
    Busy,
    /// The node was drained by someone else: not upgraded now.
    ForeignDrain,
    /// The budget is used up: try again later.
    Waiting {
        /// Nodes drained for an upgrade.
        used: usize,
        /// The limit.
        limit: usize,
    },
    /// Beyond the budget after a simultaneous start: this node withdrew its drain.
    BackedOff,
    /// The drain started.
    Started {
        /// From.
        current: String,
        /// To.
        desired: String,
    },
    /// Reading the parameter failed (logged; no drain).
    Error(String),
}

impl Check {
    /// Whether the next check should come after the budget wait rather than the interval.
    pub fn wants_retry_soon(&self) -> bool {
        matches!(self, Check::Waiting { .. } | Check::BackedOff)
    }
}

/// Compares the desired image in SSM parameter `upgrade.parameter` with `running` (IMDS
/// `ami-id`, or the image recorded by the last in-place upgrade), and starts an upgrade
/// drain within the budget.
///
/// # Errors
/// [`DrainError`] from Slurm or the state; SSM errors are [`Check::Error`].
pub async fn check(
    engine: &Engine,
    ssm: &aws_sdk_ssm::Client,
    running: &str,
) -> Result<Check, DrainError> {
    let desired = match desired_image(ssm, &engine.upgrade.parameter).await {
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
        return Ok(Check::UpToDate { image: current });
    }
    let cause = Cause::Upgrade {
        current: current.clone(),
        desired: desired.clone(),
    };
    if st.phase != Phase::Active || st.handled.contains(&cause.key()) {
        return Ok(Check::Busy);
    }
    let node = engine
        .ops
        .scontrol
        .show_node(&engine.node)
        .await?
        .ok_or_else(|| DrainError::UnknownNode(engine.node.clone()))?;
    if node.has_flag("DRAIN")
        && node
            .reason()
            .is_some_and(|r| !state::is_our_reason(r, None))
    {
        return Ok(Check::ForeignDrain);
    }
    let partition = if engine.upgrade.budget_partition.is_empty() {
        node.fields
            .get("Partitions")
            .and_then(|p| p.split(',').next())
            .unwrap_or_default()
            .to_string()
    } else {
        engine.upgrade.budget_partition.clone()
    };
    let budget = Budget::parse(&engine.upgrade.max_unavailable).unwrap_or(Budget::Nodes(1));
    let count = engine.ops.count_upgrading(&partition).await?;
    let limit = budget.limit(count.total);
    let others = count
        .upgrading
        .iter()
        .filter(|n| **n != engine.node)
        .count();
    if others >= limit {
        tracing::info!(
            partition,
            used = others,
            limit,
            "upgrade budget used up; waiting"
        );
        return Ok(Check::Waiting {
            used: others,
            limit,
        });
    }
    let key = cause.key();
    let r = engine.request(cause).await?;
    if !matches!(r.begin, Begin::Started) {
        return Ok(Check::Busy);
    }
    // Count again: a node that started at the same moment may have taken the last slot.
    let after = engine.ops.count_upgrading(&partition).await?;
    let rank = after.upgrading.iter().position(|n| *n == engine.node);
    if rank.is_some_and(|r| r >= limit) {
        tracing::info!(
            partition,
            ?rank,
            limit,
            "over the upgrade budget after a simultaneous start; backing off"
        );
        engine.withdraw(&key).await?;
        return Ok(Check::BackedOff);
    }
    tracing::info!(%current, %desired, "upgrade drain started");
    Ok(Check::Started { current, desired })
}
