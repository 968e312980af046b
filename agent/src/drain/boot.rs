//! What bootstrap does with a drain it finds on a node whose slurmd has just registered
//! (the boot-time drain policy): the agent's drain for a cause that ended with the
//! incarnation that saw it is lifted; an admin's, or one whose owner lifts it, stays
//! ([`found_drain`]).

use crate::reason::{AgentReason, Incarnation, ReasonCause, RecordHolder};

/// What bootstrap does with a drain it finds on a node its slurmd has registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FoundDrain {
    /// The agent's drain for a cause that ended with the incarnation that saw it (a spot,
    /// stop or hibernate notice, a maintenance event, a rebalance, a lifecycle state; an
    /// upgrade of another instance): lifted.
    Lift(AgentReason),
    /// A drain that stays: an admin's (any reason not in the agent's scheme), or the
    /// agent's own that its owner lifts (health checks, mounts, an operator's `drain`).
    Keep(String),
}

/// Decides on a drain with `reason` found by incarnation `instance_id`, which runs image
/// `running_ami`, at bootstrap, on a record whose holder before this instance's slurmd
/// registered was `holder` ([`RecordHolder`]).
///
/// Whose an upgrade drain is comes from [`RecordHolder::incarnation_of`]: on a record
/// Slurm says a predecessor held, a reason with the writer `unknown`, or one naming this
/// instance, is the predecessor's; on a record that names this instance, a reason with the
/// writer `unknown` is this instance's; where Slurm does not say, the reason's instance id
/// decides. Every other cause is decided by the cause alone; a reason not in the agent's
/// scheme is an admin's and stays.
pub fn found_drain(
    reason: Option<&str>,
    instance_id: &str,
    running_ami: &str,
    holder: &RecordHolder,
) -> FoundDrain {
    let Some(r) = reason.and_then(crate::reason::parse_reason) else {
        return FoundDrain::Keep(format!(
            "drained by an admin ({}); left drained",
            reason.unwrap_or("no reason")
        ));
    };
    let incarnation = holder.incarnation_of(&r.instance_id, instance_id);
    let lift = match r.cause {
        // The instance booted again (or is another one): the notice or event is over; the
        // daemon drains again within one interval if it still stands.
        ReasonCause::Spot
        | ReasonCause::Stop
        | ReasonCause::Hibernate
        | ReasonCause::Maintenance
        | ReasonCause::Rebalance
        | ReasonCause::Lifecycle => true,
        // The block and its end outlive a reboot: this instance's drain stays (the daemon
        // undoes it when the block is extended); another instance's ended with it.
        ReasonCause::CapacityBlock => incarnation != Incarnation::This,
        // Bootstrap puts scratch in place at every boot, and drains again when it fails.
        ReasonCause::Scratch => true,
        // This instance's upgrade drain is the upgrade's to finish; another instance's is
        // over unless this replacement still runs an image other than the desired one (then
        // the daemon's loop check owns it: lifting it would drain and power off again).
        ReasonCause::Upgrade => {
            incarnation != Incarnation::This
                && !reason.is_some_and(|x| crate::upgrade::leftover_still_applies(x, running_ami))
        }
        // This instance's repair is the drain engine's to finish (its reboot); another
        // instance's repair ended with that instance (replaced).
        ReasonCause::Repair => incarnation != Incarnation::This,
        // This instance's gate (bootstrap's step runs it at every boot, and lifts or keeps
        // its drain); another instance's ended with that instance.
        ReasonCause::Gate => incarnation != Incarnation::This,
        ReasonCause::Health | ReasonCause::Mount | ReasonCause::Operator | ReasonCause::Script => {
            false
        }
    };
    if lift {
        FoundDrain::Lift(r)
    } else {
        let owner = match r.cause {
            ReasonCause::Health => "the health checks lift it when they pass",
            ReasonCause::Mount => "the daemon lifts it when the mount is back",
            ReasonCause::Upgrade if incarnation == Incarnation::This => {
                "the upgrade in progress owns it"
            }
            ReasonCause::Upgrade => {
                "this instance still runs another image than the one it was drained for: the upgrade check owns it"
            }
            ReasonCause::Repair => "the repair in progress owns it",
            ReasonCause::Gate => "the start-up gate owns it: it lifts it when it passes",
            ReasonCause::CapacityBlock => {
                "the Capacity Block still ends: the daemon lifts it if the block is extended"
            }
            _ => "`slurm-node-agent resume` lifts it",
        };
        let whose = match &incarnation {
            Incarnation::Other(previous) => format!(", left by instance {previous}"),
            Incarnation::This | Incarnation::Unknown => String::new(),
        };
        FoundDrain::Keep(format!(
            "drained by the agent ({}){whose}: {owner}",
            r.to_reason()
        ))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::slurm::record::FoundRecord;
    use crate::slurm::NodeInfo;

    const ME: &str = "i-0123456789abcdef0";
    const OTHER: &str = "i-0fedcba9876543210";
    const UNKNOWN: &str = crate::reason::UNKNOWN_INSTANCE;
    const AMI: &str = "ami-0123456789abcdef0";

    #[test]
    fn drains_found_at_bootstrap() {
        let unknown = RecordHolder::Unknown;
        let lifts =
            |r: &str| matches!(found_drain(Some(r), ME, AMI, &unknown), FoundDrain::Lift(_));
        for cause in [
            "spot",
            "stop",
            "hibernate",
            "maintenance",
            "rebalance",
            "lifecycle",
        ] {
            assert!(
                lifts(&format!("slurm-node-agent/{cause}@{OTHER}: x")),
                "{cause}"
            );
            assert!(
                lifts(&format!("slurm-node-agent/{cause}@{ME}: x")),
                "{cause}"
            );
        }
        assert!(lifts(&format!("slurm-node-agent/upgrade@{OTHER}: a -> b")));
        // Another instance drained for image ami-22222222; this one runs it: lift. Still
        // the old image: the upgrade's loop check owns it.
        assert!(lifts(&format!(
            "slurm-node-agent/upgrade@{OTHER}: image upgrade ami-11111111 -> {AMI}"
        )));
        assert!(!lifts(&format!(
            "slurm-node-agent/upgrade@{OTHER}: image upgrade {AMI} -> ami-22222222"
        )));
        assert!(!lifts(&format!("slurm-node-agent/upgrade@{ME}: a -> b")));
        // A repair: another instance's ended with it (replaced); this instance's (its
        // reboot) is the drain engine's.
        assert!(lifts(&format!(
            "slurm-node-agent/repair@{OTHER}: GPUs: x [powered off for replacement]"
        )));
        assert!(!lifts(&format!(
            "slurm-node-agent/repair@{ME}: GPUs: x [rebooting]"
        )));
        // A Capacity Block's drain outlives a reboot of its instance (the block still ends:
        // the daemon lifts it if the block is extended); another instance's ended with it.
        let block = |writer: &str| {
            format!("slurm-node-agent/capacity-block@{writer}: capacity block cr-1 ends 2026-12-07T12:00:00Z")
        };
        assert!(!lifts(&block(ME)));
        assert!(lifts(&block(OTHER)));
        let FoundDrain::Keep(why) = found_drain(Some(&block(ME)), ME, AMI, &unknown) else {
            panic!()
        };
        assert!(why.contains("the Capacity Block still ends"), "{why}");
        for kept in ["health", "mount", "operator", "script"] {
            assert!(
                !lifts(&format!("slurm-node-agent/{kept}@{OTHER}: x")),
                "{kept}"
            );
        }
        let FoundDrain::Keep(why) = found_drain(Some("slurm-node-agent: spot"), ME, AMI, &unknown)
        else {
            panic!("an admin look-alike was lifted")
        };
        assert!(why.starts_with("drained by an admin"), "{why}");
        let FoundDrain::Keep(why) = found_drain(None, ME, AMI, &unknown) else {
            panic!()
        };
        assert!(why.contains("no reason"), "{why}");
    }

    /// The 25.11 capture of a record `slurmd --instance-id i-0123456789abcdef0` registered,
    /// drained with `reason` (the captured drain's reason replaced).
    fn captured_drained(reason: &str) -> NodeInfo {
        let text = std::fs::read_to_string(format!(
            "{}/tests/fixtures/slurm-25.11/scontrol-show-node-drained.txt",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        let captured = "slurm-node-agent/spot@i-0123456789abcdef0: spot interruption notice: terminate at 2026-12-01T20:00:00Z";
        assert!(text.contains(captured));
        NodeInfo::parse(&text.replace(captured, reason))
    }

    #[test]
    fn slurms_record_says_whose_upgrade_drain_it_is() {
        // The captured record names ME; OTHER boots onto it: a replacement.
        let upgrade = |writer: &str| {
            format!("slurm-node-agent/upgrade@{writer}: image upgrade ami-11111111 -> {AMI}")
        };
        let decide = |reason: &str, me: &str| {
            let node = captured_drained(reason);
            let found = FoundRecord::new("d1", Some(&node), me);
            (found_drain(node.reason(), me, AMI, &found.holder), found)
        };
        // A replacement: the record names the predecessor, whatever the reason's writer.
        for writer in [UNKNOWN, ME, OTHER] {
            let (d, found) = decide(&upgrade(writer), OTHER);
            assert_eq!(found.holder.replaced(), Some(ME), "{writer}");
            assert!(found.slurmd_start_time.is_some());
            assert!(matches!(d, FoundDrain::Lift(_)), "{writer}: {d:?}");
        }
        // Before, a reason naming this instance was taken for this instance's upgrade.
        let old = found_drain(Some(&upgrade(OTHER)), OTHER, AMI, &RecordHolder::Unknown);
        assert!(matches!(old, FoundDrain::Keep(_)), "{old:?}");
        // The record names this instance (an earlier run registered it): an upgrade drain
        // whose writer is `unknown` is this instance's upgrade in progress, kept.
        let (d, found) = decide(&upgrade(UNKNOWN), ME);
        assert_eq!(found.holder, RecordHolder::This);
        let FoundDrain::Keep(why) = d else {
            panic!("{d:?}")
        };
        assert!(why.ends_with("the upgrade in progress owns it"), "{why}");
        // Another instance's, written before this one registered: lifted.
        let (d, _) = decide(&upgrade(OTHER), ME);
        assert!(matches!(d, FoundDrain::Lift(_)), "{d:?}");
        // Where Slurm keeps no instance id, the writer `unknown` is not this instance.
        let d = found_drain(Some(&upgrade(UNKNOWN)), ME, AMI, &RecordHolder::Unknown);
        assert!(matches!(d, FoundDrain::Lift(_)), "{d:?}");
        // A predecessor's drain for an image this replacement does not run stays for the
        // upgrade check, and says whose it is.
        let stale =
            format!("slurm-node-agent/upgrade@{UNKNOWN}: image upgrade {AMI} -> ami-22222222");
        let (d, _) = decide(&stale, OTHER);
        let FoundDrain::Keep(why) = d else {
            panic!("{d:?}")
        };
        assert!(why.contains(&format!("left by instance {ME}")), "{why}");
        // Admin drains are never the agent's, whoever holds the record.
        for holder in [RecordHolder::This, RecordHolder::Predecessor(ME.into())] {
            let d = found_drain(Some("ADMIN  SHUTDOWN"), OTHER, AMI, &holder);
            assert!(matches!(d, FoundDrain::Keep(ref w) if w.starts_with("drained by an admin")));
        }
        // The agent's health drain of a predecessor stays for the checks to lift.
        let (d, _) = decide(&format!("slurm-node-agent/health@{ME}: disk"), OTHER);
        let FoundDrain::Keep(why) = d else {
            panic!("{d:?}")
        };
        assert!(
            why.contains(&format!(", left by instance {ME}: the health checks")),
            "{why}"
        );
    }
}
