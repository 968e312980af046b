//! The flap guard: a fault that comes back on the replacements of a node (or of its
//! partition) is not the node's hardware, and replacing again only spends instances and
//! the budget.
//!
//! - **NodeName**: a node whose previous instance under the same NodeName was replaced for
//!   the same check within `repair.flap_window` is not replaced a second time.
//! - **Partition** (names not reused: the default name template names a node after its
//!   host): when `repair.flap_max_replacements` nodes of one of this node's partitions were
//!   replaced for the same check within the window, no node of it is replaced for that
//!   check again until the oldest falls out of the window.
//!
//! The history is kept in slurmctld, where every node reads it without new
//! infrastructure: the record of a node powered off for a replacement keeps the repair's
//! reason with its time (`... [powered off for replacement at 2026-12-07T01:00:00Z]`), and
//! a repair's replacement does not delete it within the window (the first node started
//! after the window deletes it: `rollout::repair`). A replacement under the same NodeName
//! overwrites that record when it joins; bootstrap, or the daemon's first look, copies its
//! predecessor's reason into `repair.json` first ([`super::record::Replaced`]). The node is
//! then isolated with a reason that says so.

use super::breaker::{detail_names_check, Seen};
use super::record::Replaced;

/// The history the guard reads: slurmctld's records (`fleet`), this node's copy of its
/// predecessor's (`local`), now and the settings.
#[derive(Debug, Clone, Copy)]
pub struct History<'a> {
    /// Every node's record.
    pub fleet: &'a [Seen<'a>],
    /// The replacements of this NodeName's earlier instances (`repair.json`).
    pub local: &'a [Replaced],
    /// Now, Unix seconds.
    pub now: i64,
    /// `repair.flap_window`, seconds.
    pub window: i64,
    /// `repair.flap_max_replacements`.
    pub max: u32,
    /// Replacements before this time are not counted (an operator cleared the history).
    pub since: Option<i64>,
}

/// A replacement for a check, seen in a record: who, when.
fn replaced_at(reason: &str, check: &str) -> Option<i64> {
    let r = super::parse_reason(reason)?;
    if !r.powered_off() || !detail_names_check(&r.detail, check) {
        return None;
    }
    r.powered_off_at()
}

/// Why the guard holds a replacement of node `own` (partitions `own_partitions`) for
/// `check`, or `None`.
pub fn holds(check: &str, own: &str, own_partitions: &str, h: &History<'_>) -> Option<String> {
    let recent = |at: i64| h.now.saturating_sub(at) <= h.window && h.since.is_none_or(|s| at >= s);
    let window = crate::section::HumanDuration(std::time::Duration::from_secs(
        u64::try_from(h.window).unwrap_or(0),
    ));
    let mine: Vec<&Replaced> = h
        .local
        .iter()
        .filter(|r| recent(r.at) && detail_names_check(&r.detail, check))
        .collect();
    if let Some(r) = mine.last() {
        return Some(format!(
            "the flap guard: {own}'s previous instance {} was replaced for {check} at {}, within repair.flap_window ({window}): not replaced a second time",
            r.instance,
            crate::time::format(r.at)
        ));
    }
    for partition in own_partitions.split(',').filter(|p| !p.is_empty()) {
        let others = h
            .fleet
            .iter()
            .filter(|n| n.name != own && n.partitions.split(',').any(|p| p == partition))
            .filter_map(|n| n.held_reason.and_then(|r| replaced_at(r, check)))
            .filter(|at| recent(*at))
            .count();
        let count = u32::try_from(others).unwrap_or(u32::MAX);
        if count >= h.max {
            let (nodes, were) = if count == 1 {
                ("node", "was")
            } else {
                ("nodes", "were")
            };
            return Some(format!(
                "the flap guard: {count} {nodes} of partition {partition} {were} replaced for {check} within repair.flap_window ({window}; repair.flap_max_replacements = {}): not replaced again",
                h.max
            ));
        }
    }
    None
}
