//! The budget of planned departures: how many nodes of a partition may be out of service
//! at once for the rollout, and this node's place in it.
//!
//! - The size: `upgrade.max_unavailable` of the partition's nodes (`upgrade.budget_partition`
//!   or the node's first partition), counted from `scontrol show nodes` ([`count_upgrading`],
//!   [`Budget::of`]); the slots themselves are [`super::slot`]'s.
//! - The holder's renewals: a node out of service for a departure renews its slot every
//!   third of `upgrade.slot_timeout` ([`Budget::renew_if_due`]), from its drain until its
//!   action, so that a slot outlives its holder by at most `slot_timeout`
//!   ([`Budget::keep`], each drain tick of the daemon).
//! - Reclaiming a dead node's slot: a slot whose holder stopped renewing ends on
//!   slurmctld's clock; a replacement under another NodeName releases a gone holder's slot
//!   at once ([`super::slot::release_for_replacement`]).
//!
//! One budget for every kind of planned departure: an upgrade and a repair that reboots or
//! replaces a node take slots of the same partitions through [`Budget::of`] and
//! [`super::slot::take`] (the comment says which, [`super::slot::SlotFor`]), and
//! [`Budget::keep`] renews either while it drains. Its size is `upgrade.max_unavailable`
//! for both: one number for how many nodes the agent may take out at once for its own
//! reasons (a second key would add up, so that a rollout and a faulty fleet together
//! exceed what the site allowed).

use std::sync::Mutex;
use std::time::Instant;

use crate::drain::{Cause, DrainError, Engine, Phase};
use crate::slurm::NodeInfo;

/// This node's place in the budget: when it last took or renewed its slot (in this
/// process; a restarted daemon renews at once).
#[derive(Debug, Default)]
pub struct Budget {
    renewed: Mutex<Option<Instant>>,
    waiting: Mutex<Option<SlotWait>>,
}

/// What a node found when every slot of its partition was held: where it waits, so that
/// its next tries first read the slots alone ([`super::check::check`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotWait {
    /// The partition whose slots it waits for (empty: every node).
    pub partition: String,
    /// Its number of slots.
    pub limit: usize,
    /// When the full check that found them held ran: the daemon makes a full one again
    /// once the poll's interval has passed ([`Budget::expire_waiting`]).
    pub since: Instant,
}

impl Budget {
    /// No slot taken or renewed yet by this process.
    pub fn new() -> Budget {
        Budget::default()
    }

    /// Where this node waits for a slot, if its last upgrade check found every slot held.
    pub fn waiting(&self) -> Option<SlotWait> {
        self.waiting.lock().ok().and_then(|w| w.clone())
    }

    /// Forgets where this node waits once `full_every` has passed since the full check
    /// that found every slot held: the next check is a full one (the desired image may
    /// have changed meanwhile).
    pub fn expire_waiting(&self, full_every: std::time::Duration) {
        if let Ok(mut w) = self.waiting.lock() {
            if w.as_ref().is_some_and(|w| w.since.elapsed() >= full_every) {
                *w = None;
            }
        }
    }

    /// Notes where this node waits (`Some`), or that it no longer does (`None`): the
    /// next check is a full one.
    pub fn set_waiting(&self, wait: Option<SlotWait>) {
        if let Ok(mut w) = self.waiting.lock() {
            *w = wait;
        }
    }

    /// Notes that the slot was taken or renewed now.
    pub fn renewed_now(&self) {
        if let Ok(mut t) = self.renewed.lock() {
            *t = Some(Instant::now());
        }
    }

    /// Renews the slot this node holds ([`super::slot::renew`]) when a third of
    /// `upgrade.slot_timeout` has passed since this process last took or renewed it (at
    /// once after a restart): each renewal adds that third to the reservation, so its end
    /// stays between two and three thirds ahead while the node lives. A failure is logged
    /// and tried again at the next step.
    pub async fn renew_if_due(&self, engine: &Engine) {
        let every = engine.upgrade.slot_timeout.0 / 3;
        let due = self
            .renewed
            .lock()
            .map_or(true, |t| t.is_none_or(|t| t.elapsed() >= every));
        if !due {
            return;
        }
        match super::slot::renew(&engine.ops.scontrol, &engine.node, every).await {
            Ok(renewed) => {
                if !renewed.is_empty() {
                    tracing::info!(node = %engine.node, ?renewed, "renewed the upgrade budget slot");
                }
                self.renewed_now();
            }
            Err(e) => tracing::warn!(node = %engine.node, "renewing the upgrade budget slot: {e}"),
        }
    }

    /// Each drain tick: while a departure that holds a slot (an upgrade, a repair) drains
    /// or waits for its action, its slot is renewed when due.
    pub async fn keep(&self, engine: &Engine) {
        let holds = engine.load().is_ok_and(|st| {
            matches!(st.phase, Phase::Draining | Phase::Drained)
                && matches!(st.cause, Some(Cause::Upgrade { .. } | Cause::Repair { .. }))
        });
        if holds {
            self.renew_if_due(engine).await;
        }
    }

    /// The partition whose budget `node` counts in: `upgrade.budget_partition`, else the
    /// node's first partition (empty: none, every node).
    pub fn partition(engine: &Engine, node: &NodeInfo) -> String {
        if engine.upgrade.budget_partition.is_empty() {
            node.fields
                .get("Partitions")
                .and_then(|p| p.split(',').next())
                .unwrap_or_default()
                .to_string()
        } else {
            engine.upgrade.budget_partition.clone()
        }
    }

    /// The budget of `node`'s partition: `(partition, count, limit)`, `count` its nodes
    /// (and those with an upgrade reason, for the log) and `limit` `upgrade.max_unavailable`
    /// of its nodes: the number of slots ([`super::slot`]).
    ///
    /// # Errors
    /// [`DrainError`] from scontrol.
    pub async fn of(
        engine: &Engine,
        node: &NodeInfo,
    ) -> Result<(String, BudgetCount, usize), DrainError> {
        let partition = Budget::partition(engine, node);
        let budget = crate::upgrade::Budget::parse(&engine.upgrade.max_unavailable)
            .unwrap_or(crate::upgrade::Budget::Nodes(1));
        let out = engine.ops.scontrol.run(&["show", "nodes", "-o"]).await?;
        let count = count_upgrading(&out, &partition);
        let limit = budget.limit(count.total);
        Ok((partition, count, limit))
    }
}

/// The time Slurm recorded with a reason (`Reason=... [root@2024-05-01T10:00:00]`), as
/// text that sorts in time order, or empty.
pub fn reason_time(n: &NodeInfo) -> &str {
    n.fields
        .get("Reason")
        .filter(|r| r.ends_with(']'))
        .and_then(|r| r.rsplit_once(" ["))
        .and_then(|(_, s)| s.rsplit_once('@'))
        .map_or("", |(_, t)| t.trim_end_matches(']'))
}

/// Nodes of a partition for the upgrade budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetCount {
    /// Nodes in scope.
    pub total: usize,
    /// Nodes unavailable because of an upgrade now, oldest drain first (by Slurm's reason
    /// time, then name).
    pub upgrading: Vec<String>,
    /// Nodes with an upgrade reason that hold no slot: their instance powered off, or they
    /// no longer respond and run no job.
    pub gone: Vec<String>,
}

/// Whether a node with an upgrade reason is gone rather than being upgraded: the agent
/// marked it powered off, or slurmd no longer responds (`NOT_RESPONDING`, no reboot
/// pending) and no job is on it. Such a record holds no budget slot (its instance is
/// gone; a replacement is another record, or this one once it registers again).
pub fn upgrade_record_gone(n: &NodeInfo, reason: &crate::upgrade::UpgradeReason<'_>) -> bool {
    if reason.powered_off() {
        return true;
    }
    let rebooting = n.has_flag("REBOOT_ISSUED") || n.has_flag("REBOOT_REQUESTED");
    let not_responding = n.has_flag("NOT_RESPONDING") || n.state().contains('*');
    not_responding && !rebooting && n.runs_no_job()
}

/// Counts, from `scontrol show nodes -o` output, the nodes of `partition` (all nodes when
/// empty) and those unavailable because of an upgrade (an upgrade reason of the agent,
/// [`crate::upgrade::parse_upgrade_reason`], and not [`upgrade_record_gone`]).
pub fn count_upgrading(show_nodes: &str, partition: &str) -> BudgetCount {
    let mut gone = Vec::new();
    let mut total = 0;
    let mut up: Vec<(String, String)> = Vec::new();
    for n in show_nodes
        .lines()
        .filter(|l| l.starts_with("NodeName="))
        .map(NodeInfo::parse)
    {
        let in_scope = partition.is_empty()
            || n.fields
                .get("Partitions")
                .is_some_and(|p| p.split(',').any(|x| x == partition));
        if !in_scope {
            continue;
        }
        total += 1;
        let Some(r) = n
            .held_reason()
            .and_then(crate::upgrade::parse_upgrade_reason)
        else {
            continue;
        };
        if upgrade_record_gone(&n, &r) {
            gone.push(n.name().to_string());
        } else {
            up.push((reason_time(&n).to_string(), n.name().to_string()));
        }
    }
    up.sort();
    BudgetCount {
        total,
        upgrading: up.into_iter().map(|(_, n)| n).collect(),
        gone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_upgrades_in_time_order() {
        let out = "\
NodeName=c1 State=IDLE+DRAIN Partitions=main,gpu Reason=slurm-node-agent/upgrade@i-0123456789abcdef0: image upgrade ami-1 -> ami-2 [root@2024-05-01T10:00:05]
NodeName=c2 State=IDLE Partitions=main Reason=(null)
NodeName=c3 State=MIXED+DRAIN Partitions=main Reason=slurm-node-agent/upgrade@i-0123456789abcdef0: image upgrade ami-1 -> ami-2 [root@2024-05-01T10:00:01]
NodeName=c4 State=IDLE+DRAIN Partitions=main Reason=bad disk [admin@2024-05-01T09:00:00]
NodeName=g1 State=IDLE+DRAIN Partitions=gpu Reason=slurm-node-agent/upgrade@unknown: x [root@2024-05-01T09:00:00]
NodeName=c5 State=DOWN+DRAIN+DYNAMIC_NORM+NOT_RESPONDING Partitions=main Reason=slurm-node-agent/upgrade@i-0aaaaaaaaaaaaaaaa: image upgrade ami-1 -> ami-2 [root@2024-05-01T08:00:00]
NodeName=c6 State=IDLE+DRAIN Partitions=main Reason=slurm-node-agent/upgrade@i-0bbbbbbbbbbbbbbbb: powered off for image upgrade ami-1 -> ami-2 [root@2024-05-01T08:00:00]
NodeName=c7 State=DOWN*+DRAIN+REBOOT_ISSUED Partitions=main Reason=slurm-node-agent/upgrade@i-0cccccccccccccccc: image upgrade ami-1 -> ami-2 [root@2024-05-01T10:00:09]
NodeName=c8 State=IDLE+DRAIN Partitions=main Reason=slurm-node-agent: upgrade [admin@2024-05-01T09:00:00]
";
        let c = count_upgrading(out, "main");
        assert_eq!(c.total, 8);
        // c5 no longer responds and runs nothing, c6 powered off: no slot. c7 reboots: slot.
        assert_eq!(c.upgrading, ["c3", "c1", "c7"]);
        assert_eq!(c.gone, ["c5", "c6"]);
        let all = count_upgrading(out, "");
        assert_eq!(all.total, 9);
        assert_eq!(all.upgrading, ["g1", "c3", "c1", "c7"]);
        assert_eq!(count_upgrading(out, "none").total, 0);
    }

    /// A node waiting for a slot keeps its wait (its tries read the slots alone) until the
    /// poll's interval has passed since the full check; then the next check is a full one.
    #[test]
    fn a_slot_wait_is_forgotten_after_the_poll_interval() {
        let b = Budget::new();
        let wait = SlotWait {
            partition: "main".into(),
            limit: 2,
            since: Instant::now() - std::time::Duration::from_secs(30),
        };
        b.set_waiting(Some(wait.clone()));
        b.expire_waiting(std::time::Duration::from_secs(60));
        assert_eq!(b.waiting(), Some(wait));
        b.expire_waiting(std::time::Duration::from_secs(30));
        assert_eq!(b.waiting(), None);
    }
}
