//! The agent's reasons in Slurm, and whose a record or a drain is.
//!
//! The node's reason in Slurm is the record of who owns a drain. Every reason the agent
//! writes is `slurm-node-agent/<cause>@<instance-id>: <detail>` ([`AgentReason`]), where
//! `<cause>` is one of [`ReasonCause::ALL`] and `<instance-id>` is the incarnation (the EC2
//! instance id) that wrote it (`unknown` when it was not known). A reason that does not
//! parse exactly so (for example `slurm-node-agent: foo`, or `ADMIN SHUTDOWN`) is an
//! admin's, and the agent never lifts or overwrites it.
//!
//! Whose Slurm's record of a NodeName is, this instance's or a predecessor's, is
//! [`RecordHolder`]: the record's own `InstanceId` where Slurm keeps one (23.11+), else the
//! instance id in the agent's reasons and the local files ([`Incarnation`]).
//!
//! Floor 0 (ground): uses no other module of the crate.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Start of every reason the agent writes.
pub const REASON_PREFIX: &str = "slurm-node-agent/";

/// The instance id written when the incarnation is not known.
pub const UNKNOWN_INSTANCE: &str = "unknown";

/// Slurm keeps at most this many characters of a reason that the agent writes.
pub const REASON_MAX: usize = 256;

/// Why the agent drained a node: the `<cause>` of a reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReasonCause {
    /// A health check failed (`check`, the daemon's checks).
    Health,
    /// A required shared file system is missing.
    Mount,
    /// A spot interruption notice with action `terminate`.
    Spot,
    /// A spot interruption notice with action `stop`.
    Stop,
    /// A spot interruption notice with action `hibernate`.
    Hibernate,
    /// An EC2 rebalance recommendation.
    Rebalance,
    /// A scheduled maintenance event.
    Maintenance,
    /// An Auto Scaling lifecycle state (Terminated).
    Lifecycle,
    /// A rolling image upgrade.
    Upgrade,
    /// An operator's `slurm-node-agent drain`.
    Operator,
    /// A script or hook acting through the agent.
    Script,
    /// Node-local scratch on instance storage is not in place (bootstrap's scratch step).
    Scratch,
    /// A repair: a fault the health checks found calls for a reboot or a replacement once
    /// no job runs (`[repair]`, `mode = "on"`).
    Repair,
    /// The start-up gate (`[start_gate]`: DCGM's diagnostics, the site's commands) runs, or
    /// failed, in this boot: the node takes no job before it passes.
    Gate,
    /// The instance's Capacity Block for ML ends: EC2 terminates its instances from 30
    /// minutes before the end, and the node drains `events.capacity_block_lead` ahead of
    /// that.
    CapacityBlock,
}

impl ReasonCause {
    /// Every cause, in the order `docs/operator-guide.md` ("Drain reasons") lists them.
    pub const ALL: [ReasonCause; 15] = [
        ReasonCause::Health,
        ReasonCause::Mount,
        ReasonCause::Spot,
        ReasonCause::Stop,
        ReasonCause::Hibernate,
        ReasonCause::Rebalance,
        ReasonCause::Maintenance,
        ReasonCause::Lifecycle,
        ReasonCause::Upgrade,
        ReasonCause::Operator,
        ReasonCause::Script,
        ReasonCause::Scratch,
        ReasonCause::Repair,
        ReasonCause::Gate,
        ReasonCause::CapacityBlock,
    ];

    /// The word in the reason: `health`, `mount`, `spot`...
    pub fn as_str(self) -> &'static str {
        match self {
            ReasonCause::Health => "health",
            ReasonCause::Mount => "mount",
            ReasonCause::Spot => "spot",
            ReasonCause::Stop => "stop",
            ReasonCause::Hibernate => "hibernate",
            ReasonCause::Rebalance => "rebalance",
            ReasonCause::Maintenance => "maintenance",
            ReasonCause::Lifecycle => "lifecycle",
            ReasonCause::Upgrade => "upgrade",
            ReasonCause::Operator => "operator",
            ReasonCause::Script => "script",
            ReasonCause::Scratch => "scratch",
            ReasonCause::Repair => "repair",
            ReasonCause::Gate => "gate",
            ReasonCause::CapacityBlock => "capacity-block",
        }
    }

    /// The cause named by `word` (exact, lower case).
    pub fn from_word(word: &str) -> Option<ReasonCause> {
        ReasonCause::ALL.into_iter().find(|c| c.as_str() == word)
    }

    /// The cause of a spot interruption notice's action (`terminate` → spot).
    pub fn of_spot_action(action: &str) -> ReasonCause {
        match action {
            "stop" => ReasonCause::Stop,
            "hibernate" => ReasonCause::Hibernate,
            _ => ReasonCause::Spot,
        }
    }

    /// Whether the cause ends with the incarnation that saw it: a replacement instance, or
    /// the same instance started again, lifts such a drain (the notice, event or image it
    /// was about is gone with the old run). Health and mount drains are lifted by their
    /// own checks; an operator's or a script's drain only by `resume`.
    pub fn ends_with_incarnation(self) -> bool {
        matches!(
            self,
            ReasonCause::Spot
                | ReasonCause::Stop
                | ReasonCause::Hibernate
                | ReasonCause::Rebalance
                | ReasonCause::Maintenance
                | ReasonCause::Lifecycle
                | ReasonCause::Upgrade
                | ReasonCause::Repair
                | ReasonCause::Gate
                | ReasonCause::CapacityBlock
        )
    }
}

impl fmt::Display for ReasonCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether `id` may stand in a reason: `unknown`, or an EC2 instance id (`i-` and 8 or 17
/// lower-case hex digits; anything from 8 to 17 is accepted).
pub fn is_valid_instance_id(id: &str) -> bool {
    id == UNKNOWN_INSTANCE
        || id.strip_prefix("i-").is_some_and(|h| {
            (8..=17).contains(&h.len())
                && h.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
}

/// A reason the agent wrote: `slurm-node-agent/<cause>@<instance-id>: <detail>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentReason {
    /// Why.
    pub cause: ReasonCause,
    /// The incarnation that wrote it (`unknown` when not known).
    pub instance_id: String,
    /// Free text for people (`sinfo -R`); never parsed.
    pub detail: String,
}

impl AgentReason {
    /// A reason; an instance id that is not valid ([`is_valid_instance_id`]) becomes
    /// `unknown`, control characters in `detail` become spaces.
    pub fn new(cause: ReasonCause, instance_id: &str, detail: &str) -> AgentReason {
        let instance_id = if is_valid_instance_id(instance_id) {
            instance_id.to_string()
        } else {
            UNKNOWN_INSTANCE.to_string()
        };
        let mut detail: String = detail
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        // ` : ` is where slurmctld appends its own reasons (below): never in ours.
        while detail.contains(" : ") {
            detail = detail.replace(" : ", ": ");
        }
        AgentReason {
            cause,
            instance_id,
            detail: detail.trim().to_string(),
        }
    }

    /// A reason whose detail its owner wrote to fit (the health checks' `<check>: <message>
    /// (+N more)`, a mount's, a script's, scratch's): kept as written but for control
    /// characters, which become spaces; an instance id that is not valid becomes `unknown`.
    /// [`AgentReason::to_reason`] of the [`AgentReason::new`] of the same words is the same
    /// reason for a detail that `new` leaves as it is.
    pub fn stated(cause: ReasonCause, instance_id: &str, detail: &str) -> AgentReason {
        let instance_id = if is_valid_instance_id(instance_id) {
            instance_id.to_string()
        } else {
            UNKNOWN_INSTANCE.to_string()
        };
        AgentReason {
            cause,
            instance_id,
            detail: detail
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect(),
        }
    }

    /// The reason as written to Slurm: at most [`REASON_MAX`] characters (the detail is
    /// cut), never empty after the `: `.
    pub fn to_reason(&self) -> String {
        let head = reason_head(self.cause, &self.instance_id);
        let detail = if self.detail.is_empty() {
            "-"
        } else {
            &self.detail
        };
        let room = REASON_MAX.saturating_sub(head.chars().count());
        let mut r = head;
        r.extend(detail.chars().take(room));
        r
    }

    /// Parses a reason as Slurm shows it (with or without its ` [user@time]` suffix already
    /// removed). `None` unless it is exactly the agent's form with a known cause and a valid
    /// instance id: such a reason is an admin's.
    ///
    /// slurmctld 23.02 and later append their own reasons to the one a node has, each after
    /// ` : ` (`set_node_reason`: `<reason> : reboot issued`, ` : reboot complete`,
    /// ` : Not responding`); the detail ends before the first of them
    /// ([`slurm_appended`] gives them), as the agent never writes ` : ` itself.
    pub fn parse(reason: &str) -> Option<AgentReason> {
        let rest = reason.strip_prefix(REASON_PREFIX)?;
        let (head, detail) = rest.split_once(": ")?;
        let detail = detail.split_once(" : ").map_or(detail, |(d, _)| d);
        let (cause, id) = head.split_once('@')?;
        let cause = ReasonCause::from_word(cause)?;
        if !is_valid_instance_id(id) {
            return None;
        }
        Some(AgentReason {
            cause,
            instance_id: id.to_string(),
            detail: detail.to_string(),
        })
    }

    /// Whether the instance `instance_id` wrote it (an `unknown` writer matches nobody).
    pub fn written_by(&self, instance_id: &str) -> bool {
        self.instance_id != UNKNOWN_INSTANCE && self.instance_id == instance_id
    }
}

impl fmt::Display for AgentReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_reason())
    }
}

/// Which instance slurmctld's record of this NodeName names, against this instance: the one
/// home for "is this record mine or my predecessor's".
///
/// Where Slurm keeps it (23.11+: `InstanceId`, the slurm module's `NodeInfo::instance`), the record names the
/// instance whose slurmd registered it last. Read before this instance's slurmd registers
/// (bootstrap's look at the record, made anyway before slurmd starts), it tells a
/// replacement (same NodeName, new instance id) from Slurm's own record, which a new root
/// volume does not lose; once this instance's slurmd has registered it names this instance.
/// Where Slurm keeps none (older releases, a slurmd started without `--instance-id`, a
/// powered-down node, no record, a look that failed) it is [`RecordHolder::Unknown`], and
/// the decisions fall back to the instance id in the agent's reasons and the local files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordHolder {
    /// The record names this instance: it registered the NodeName before (an earlier run
    /// of bootstrap, an earlier boot of the same instance).
    This,
    /// The record names another instance: a predecessor with the same NodeName, which
    /// this instance replaces.
    Predecessor(String),
    /// Slurm does not say.
    Unknown,
}

impl RecordHolder {
    /// The holder of a record whose `InstanceId` is `record_instance` (the slurm module's
    /// `NodeInfo::instance`; `None`: Slurm keeps none, slurmctld has no record, or the look
    /// failed), seen by instance `instance_id` (`unknown` when not known: then nothing can
    /// be told).
    pub fn of(record_instance: Option<&str>, instance_id: &str) -> RecordHolder {
        if instance_id == UNKNOWN_INSTANCE || !is_valid_instance_id(instance_id) {
            return RecordHolder::Unknown;
        }
        match record_instance {
            Some(id) if id == instance_id => RecordHolder::This,
            Some(id) => RecordHolder::Predecessor(id.to_string()),
            None => RecordHolder::Unknown,
        }
    }

    /// The instance this one replaces, when the record names another.
    pub fn replaced(&self) -> Option<&str> {
        match self {
            RecordHolder::Predecessor(id) => Some(id),
            RecordHolder::This | RecordHolder::Unknown => None,
        }
    }

    /// Whether the record names this instance: `None` when Slurm does not say.
    pub fn is_this(&self) -> Option<bool> {
        match self {
            RecordHolder::This => Some(true),
            RecordHolder::Predecessor(_) => Some(false),
            RecordHolder::Unknown => None,
        }
    }

    /// Whose is something of the agent's found with this record, written by `writer` (the
    /// instance id in the agent's reason, or in a state file; `unknown` when not known), as
    /// seen by instance `instance_id`:
    ///
    /// - a writer known to be another instance: that instance's, whatever the record says
    ///   (a predecessor's reason may stay on the record after this instance registered);
    /// - otherwise, on a record that names a predecessor, the predecessor's: the record
    ///   wins over a writer `unknown`, and over a reason or file that names this instance
    ///   while Slurm says another instance registered the NodeName since;
    /// - on a record that names this instance, this instance's;
    /// - where Slurm does not say, this instance's when the writer is this instance, else
    ///   [`Incarnation::Unknown`].
    pub fn incarnation_of(&self, writer: &str, instance_id: &str) -> Incarnation {
        let writer = (writer != UNKNOWN_INSTANCE && is_valid_instance_id(writer)).then_some(writer);
        match (self, writer) {
            (_, Some(w)) if w != instance_id => Incarnation::Other(w.to_string()),
            (RecordHolder::Predecessor(p), _) => Incarnation::Other(p.clone()),
            (RecordHolder::This, _) | (RecordHolder::Unknown, Some(_)) => Incarnation::This,
            (RecordHolder::Unknown, None) => Incarnation::Unknown,
        }
    }
}

/// Which incarnation a drain, or a state file, of the agent's belongs to
/// ([`RecordHolder::incarnation_of`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incarnation {
    /// This instance.
    This,
    /// Another instance (a predecessor with the same NodeName), named.
    Other(String),
    /// Neither the writer nor Slurm's record says.
    Unknown,
}

/// `slurm-node-agent/<cause>@<instance-id>: `: what precedes the detail (an invalid
/// instance id becomes `unknown`).
pub fn reason_head(cause: ReasonCause, instance_id: &str) -> String {
    let id = if is_valid_instance_id(instance_id) {
        instance_id
    } else {
        UNKNOWN_INSTANCE
    };
    format!("{REASON_PREFIX}{cause}@{id}: ")
}

/// The reasons slurmctld appended to an agent's reason (23.02+: each after ` : `, e.g.
/// `["reboot issued"]`); empty for a reason that is not the agent's or has none.
pub fn slurm_appended(reason: &str) -> Vec<&str> {
    if AgentReason::parse(reason).is_none() {
        return Vec::new();
    }
    reason.split(" : ").skip(1).collect()
}

/// `slurm-node-agent/<cause>@<instance-id>: <detail>` (see [`AgentReason`]).
pub fn reason(cause: ReasonCause, instance_id: &str, detail: &str) -> String {
    AgentReason::new(cause, instance_id, detail).to_reason()
}

/// The agent's reason in `reason`, if it is one.
pub fn parse_reason(reason: &str) -> Option<AgentReason> {
    AgentReason::parse(reason)
}

/// Whether `reason` is the agent's (any cause, any incarnation).
pub fn is_agent_reason(reason: &str) -> bool {
    AgentReason::parse(reason).is_some()
}

/// Whether `reason` is the agent's for `cause`.
pub fn is_agent_reason_for(reason: &str, cause: ReasonCause) -> bool {
    AgentReason::parse(reason).is_some_and(|r| r.cause == cause)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::slurm::NodeInfo;

    /// The operator guide lists every cause, in this order, and no other.
    #[test]
    fn the_operator_guide_lists_every_cause() {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operator-guide.md");
        let text = std::fs::read_to_string(&p).unwrap();
        let start = text.find("`<cause>` is one of ").unwrap() + "`<cause>` is one of ".len();
        let list = &text[start..start + text[start..].find(';').unwrap()];
        let listed: Vec<&str> = list
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|w| w.starts_with('`'))
            .map(|w| w.trim_matches('`'))
            .collect();
        let code: Vec<&str> = ReasonCause::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(listed, code, "{}: `<cause>` is one of ...", p.display());
    }

    #[test]
    fn slurm_appended_reasons_are_not_part_of_ours() {
        // slurmctld 23.02+ appends " : <its words>"; ours never holds " : " itself.
        let r = super::reason(ReasonCause::Upgrade, "i-0123456789abcdef0", "a : b  :  c");
        assert!(!r.contains(" : "), "{r}");
        let seen = format!("{r} : reboot issued : reboot complete");
        let p = AgentReason::parse(&seen).unwrap();
        assert_eq!(p.cause, ReasonCause::Upgrade);
        assert_eq!(p.to_reason(), r);
        assert_eq!(
            super::slurm_appended(&seen),
            ["reboot issued", "reboot complete"]
        );
        assert!(super::slurm_appended("kernel_update : reboot issued").is_empty());
    }

    const ID: &str = "i-0123456789abcdef0";

    /// The 25.11 capture (`slurmd --instance-id i-0123456789abcdef0`) and its state.
    fn captured(state: &str) -> NodeInfo {
        let path = format!(
            "{}/tests/fixtures/slurm-25.11/scontrol-show-node-{state}.txt",
            env!("CARGO_MANIFEST_DIR")
        );
        NodeInfo::parse(&std::fs::read_to_string(&path).unwrap())
    }

    #[test]
    fn the_record_says_whose_it_is_where_slurm_keeps_an_instance_id() {
        const OTHER: &str = "i-0fedcba9876543210";
        const THIRD: &str = "i-0aaaaaaaaaaaaaaaa";
        let drained = captured("drained");
        // Seen by the instance it names, by a replacement, by an instance that does not
        // know its id; no record; a 22.05-style record without the field.
        assert_eq!(
            RecordHolder::of(drained.instance().id, ID),
            RecordHolder::This
        );
        let replaced = RecordHolder::of(drained.instance().id, OTHER);
        assert_eq!(replaced, RecordHolder::Predecessor(ID.into()));
        assert_eq!(replaced.replaced(), Some(ID));
        assert_eq!(replaced.is_this(), Some(false));
        assert_eq!(
            RecordHolder::of(drained.instance().id, UNKNOWN_INSTANCE),
            RecordHolder::Unknown
        );
        assert_eq!(RecordHolder::of(None, ID), RecordHolder::Unknown);
        let without = NodeInfo::parse(
            &std::fs::read_to_string(format!(
                "{}/tests/fixtures/slurm-22.05/scontrol-show-node-drained.txt",
                env!("CARGO_MANIFEST_DIR")
            ))
            .unwrap(),
        );
        assert_eq!(
            RecordHolder::of(without.instance().id, ID),
            RecordHolder::Unknown
        );
        assert_eq!(RecordHolder::Unknown.is_this(), None);

        // The captured reason was written by the instance the record names.
        let r = parse_reason(drained.held_reason().unwrap()).unwrap();
        let this = RecordHolder::This;
        assert_eq!(this.incarnation_of(&r.instance_id, ID), Incarnation::This);
        assert_eq!(
            replaced.incarnation_of(&r.instance_id, OTHER),
            Incarnation::Other(ID.into())
        );
        // A writer `unknown`: the record says whose it is; without it nobody can.
        for (holder, want) in [
            (&this, Incarnation::This),
            (&replaced, Incarnation::Other(ID.into())),
            (&RecordHolder::Unknown, Incarnation::Unknown),
        ] {
            assert_eq!(
                holder.incarnation_of(UNKNOWN_INSTANCE, OTHER),
                want,
                "{holder:?}"
            );
        }
        // A reason naming this instance on a record Slurm says another instance registered
        // since: the record wins. Where Slurm does not say, the reason's id decides.
        assert_eq!(
            replaced.incarnation_of(OTHER, OTHER),
            Incarnation::Other(ID.into())
        );
        assert_eq!(
            RecordHolder::Unknown.incarnation_of(OTHER, OTHER),
            Incarnation::This
        );
        // A third instance's reason stays that instance's, whoever holds the record.
        for holder in [&this, &replaced, &RecordHolder::Unknown] {
            assert_eq!(
                holder.incarnation_of(THIRD, OTHER),
                Incarnation::Other(THIRD.into()),
                "{holder:?}"
            );
        }
    }

    #[test]
    fn build_and_parse_round_trip() {
        for cause in ReasonCause::ALL {
            let r = reason(cause, ID, "some detail: with colon");
            assert_eq!(
                r,
                format!("slurm-node-agent/{cause}@{ID}: some detail: with colon")
            );
            let p = parse_reason(&r).unwrap();
            assert_eq!(
                (p.cause, p.instance_id.as_str(), p.detail.as_str()),
                (cause, ID, "some detail: with colon")
            );
            assert!(p.written_by(ID));
            assert!(!p.written_by("i-0fffffffffffffff0"));
        }
    }

    #[test]
    fn unknown_and_invalid_instance_ids() {
        let r = reason(ReasonCause::Health, "", "disk");
        assert_eq!(r, "slurm-node-agent/health@unknown: disk");
        let p = parse_reason(&r).unwrap();
        assert!(!p.written_by("unknown"));
        assert_eq!(
            reason(ReasonCause::Spot, "i-XYZ; rm -rf", "x"),
            "slurm-node-agent/spot@unknown: x"
        );
        assert!(is_valid_instance_id("i-12345678"));
        assert!(!is_valid_instance_id("i-1234567"));
        assert!(!is_valid_instance_id("i-0123456789abcdef01"));
    }

    #[test]
    fn admin_look_alikes_are_not_ours() {
        for admin in [
            "slurm-node-agent: foo",
            "slurm-node-agent/health: disk",
            "slurm-node-agent/health@: disk",
            "slurm-node-agent/reboot@i-0123456789abcdef0: x",
            "slurm-node-agent/Health@i-0123456789abcdef0: x",
            "slurm-node-agent/health@i-0123456789abcdef0 x",
            "slurm-node-agent/health@i-0123456789ABCDEF0: x",
            " slurm-node-agent/health@i-0123456789abcdef0: x",
            "node-agent/spot: spot interruption notice",
            "ADMIN SHUTDOWN",
            "Kill task failed",
            "",
        ] {
            assert!(!is_agent_reason(admin), "{admin:?} taken as the agent's");
        }
        assert!(is_agent_reason_for(
            "slurm-node-agent/mount@unknown: /fsx gone",
            ReasonCause::Mount
        ));
        assert!(!is_agent_reason_for(
            "slurm-node-agent/mount@unknown: /fsx gone",
            ReasonCause::Health
        ));
    }

    #[test]
    fn reasons_are_bounded_and_clean() {
        let r = reason(ReasonCause::Operator, ID, &"a\nb\t".repeat(300));
        assert_eq!(r.chars().count(), REASON_MAX);
        assert!(crate::slurm::node::validate_reason(&r).is_ok());
        assert!(parse_reason(&r).is_some());
        assert_eq!(
            reason(ReasonCause::Script, ID, "  "),
            format!("slurm-node-agent/script@{ID}: -")
        );
    }

    #[test]
    fn spot_actions_and_incarnation_causes() {
        assert_eq!(ReasonCause::of_spot_action("terminate"), ReasonCause::Spot);
        assert_eq!(ReasonCause::of_spot_action("stop"), ReasonCause::Stop);
        assert_eq!(
            ReasonCause::of_spot_action("hibernate"),
            ReasonCause::Hibernate
        );
        assert!(ReasonCause::Maintenance.ends_with_incarnation());
        assert!(!ReasonCause::Health.ends_with_incarnation());
        assert!(!ReasonCause::Operator.ends_with_incarnation());
        for c in ReasonCause::ALL {
            assert_eq!(ReasonCause::from_word(c.as_str()), Some(c));
        }
    }
}
