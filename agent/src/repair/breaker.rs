//! The breaker: a fault the whole fleet has (a file system down for everyone, a bad image)
//! is no node's to repair. When the check that failed here fails on more than
//! `repair.breaker_share` of the nodes of one of this node's partitions, and on at least
//! `repair.breaker_min_nodes` of them, no node is rebooted or replaced for it. Decided from
//! what every node can see without new infrastructure: slurmctld's records (each node's
//! partitions and the reason that holds it now) and the health checks' reasons in them
//! (`slurm-node-agent/health@<instance-id>: <check>: <message>`); this node counts as
//! failing the check whatever its record says (its drain may not be made yet).

use crate::reason::{parse_reason, ReasonCause};

/// One node as slurmctld's record shows it.
#[derive(Debug, Clone, Copy)]
pub struct Seen<'a> {
    /// NodeName.
    pub name: &'a str,
    /// `Partitions=` (`a,b`; empty: none).
    pub partitions: &'a str,
    /// The reason that holds the node now (`NodeInfo::held_reason`: `None` when the node is
    /// not drained, down or failing).
    pub held_reason: Option<&'a str>,
    /// Whether an instance stands behind the record: not a powered-down or powering-down
    /// slot of Slurm's power saving, not a FUTURE node. Only those count.
    pub present: bool,
}

/// A breaker that holds: in `partition`, `failing` of its `nodes` fail the check.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Tripped {
    /// The partition.
    pub partition: String,
    /// Its nodes failing the check (this one included).
    pub failing: usize,
    /// Its nodes.
    pub nodes: usize,
}

impl std::fmt::Display for Tripped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} nodes of partition {} fail it",
            self.failing, self.nodes, self.partition
        )
    }
}

/// Why the breaker holds for `what` (a check, a lifecycle script): `the breaker holds for
/// <what>: <tripped> (more than <share> %, at least <min>: repair.breaker_share,
/// repair.breaker_min_nodes)`.
pub fn holds(what: &str, t: &Tripped, (share, min_nodes): (f64, u32)) -> String {
    format!(
        "the breaker holds for {what}: {t} (more than {} %, at least {min_nodes}: repair.breaker_share, repair.breaker_min_nodes)",
        (share * 10_000.0).round() / 100.0
    )
}

/// Whether `reason` is a drain of the health checks, or of a repair in progress, for
/// check `check` (the reason names the check first, as the health checks write it, its
/// whitespace and control characters as one space). A node powered off for a replacement
/// is gone and fails nothing any more.
pub fn names_check(reason: &str, check: &str) -> bool {
    let Some(r) = parse_reason(reason) else {
        return false;
    };
    let gone = r.cause == ReasonCause::Repair
        && super::parse_reason(reason).is_some_and(|p| p.powered_off());
    matches!(r.cause, ReasonCause::Health | ReasonCause::Repair)
        && !gone
        && detail_names_check(&r.detail, check)
}

/// Whether a reason's detail (`<check>: <message>`) names check `check` first.
pub fn detail_names_check(detail: &str, check: &str) -> bool {
    let check: Vec<&str> = check
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|w| !w.is_empty())
        .collect();
    detail.starts_with(&format!("{}: ", check.join(" ")))
}

/// The breaker for check `check`, failing on node `own` (its partitions `own_partitions`),
/// over `fleet` (every node's record, this one's included or not; only those
/// [`Seen::present`] count): the partition of `own_partitions` where the share of nodes
/// failing the check is highest, when it is more than `share` (compared in basis points:
/// `0.29` trips at 30 of 100, not 29; `1` never trips) and at least `min_nodes` nodes;
/// `None` when no partition trips it.
pub fn tripped(
    check: &str,
    own: &str,
    own_partitions: &str,
    fleet: &[Seen<'_>],
    share: f64,
    min_nodes: u32,
) -> Option<Tripped> {
    tripped_by(own, own_partitions, fleet, (share, min_nodes), &|r| {
        names_check(r, check)
    })
}

/// Whether `reason` is a lifecycle script's terminate drain for script `script` (`script@
/// <instance>: <script> failed in <stage> (onError TERMINATE)...`), whatever became of
/// the node since: the bootstrap breaker's count.
pub fn names_failed_script(reason: &str, script: &str) -> bool {
    parse_reason(reason).is_some_and(|r| {
        r.cause == ReasonCause::Script && r.detail.starts_with(&format!("{script} failed in "))
    })
}

/// [`tripped`] with the nodes failing told by `fails` (over the reason that holds each
/// other node) and `(share, min_nodes)`.
pub fn tripped_by(
    own: &str,
    own_partitions: &str,
    fleet: &[Seen<'_>],
    (share, min_nodes): (f64, u32),
    fails: &dyn Fn(&str) -> bool,
) -> Option<Tripped> {
    let mut worst: Option<Tripped> = None;
    for partition in own_partitions.split(',').filter(|p| !p.is_empty()) {
        let mut nodes = 0usize;
        let mut failing = 0usize;
        let mut own_seen = false;
        for n in fleet
            .iter()
            .filter(|n| n.present || n.name == own)
            .filter(|n| n.partitions.split(',').any(|p| p == partition))
        {
            nodes += 1;
            if n.name == own {
                own_seen = true;
                failing += 1;
            } else if n.held_reason.is_some_and(fails) {
                failing += 1;
            }
        }
        if !own_seen {
            nodes += 1;
            failing += 1;
        }
        // In basis points, so that a share written in decimal compares as written.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // (0, 1] checked
        let share_bp = (share * 10_000.0).round() as usize;
        let over = failing * 10_000 > share_bp * nodes;
        if over && failing >= usize::try_from(min_nodes).unwrap_or(usize::MAX) {
            let t = Tripped {
                partition: partition.to_string(),
                failing,
                nodes,
            };
            let higher = worst
                .as_ref()
                .is_none_or(|w| failing * w.nodes > w.failing * nodes);
            if higher {
                worst = Some(t);
            }
        }
    }
    worst
}
