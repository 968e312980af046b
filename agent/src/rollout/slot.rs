//! The upgrade budget's slots: Slurm reservations named
//! `slurm-node-agent-upgrade-<partition>-slot-<k>`, `k` in `1..=limit` (`limit` being
//! `upgrade.max_unavailable` of the partition's nodes). slurmctld is the referee: creating a
//! reservation under a name that exists fails with `Duplicate reservation name`, so two
//! nodes can never take the same slot, and at most `limit` nodes of a partition hold one.
//!
//! A slot is taken before the upgrade drain (`scontrol create reservation
//! ReservationName=<slot> StartTime=now Duration=<upgrade.slot_timeout> Nodes=<node>
//! Users=root Flags=IGNORE_JOBS,OVERLAP Comment=slurm-node-agent/upgrade@<instance-id>`):
//! - `Nodes=<node>` names the holder; the node is draining anyway, so the reservation keeps
//!   nothing else from running; `IGNORE_JOBS` lets it start over the jobs still running
//!   there (they run to their end: a reservation never stops a running job), `OVERLAP`
//!   over an administrator's reservation of the node. No `MAINT`: a maintenance
//!   reservation makes the node unavailable to the replacement's join.
//! - it is held until the node of that name is back in service on the desired image: the
//!   replacement (same NodeName) deletes it once it is up to date and available
//!   ([`release`], the daemon's upgrade check), as does an in-place upgrade (reboot,
//!   hook) once the node is back, or any node whose upgrade drain ended without an upgrade
//!   (withdrawn, resumed by an operator);
//! - while its holder drains it renews it (`Duration+=`, [`renew`]); a holder that dies
//!   stops renewing, and slurmctld ends the reservation at its `EndTime`, by slurmctld's
//!   clock: a slot left by a dead node is free again at most `upgrade.slot_timeout` after
//!   its last renewal, whatever the nodes' clocks do. A node whose clock is far behind
//!   slurmctld's cannot take a slot (`StartTime=now` in the past: `Invalid time
//!   specified`), one whose clock is ahead takes one that starts later (the name is held
//!   from its creation): both err on the side of the budget.
//!
//! A replacement under another NodeName (the default `node.name` is the host name, so an
//! Auto Scaling replacement has a new one) cannot tell which slot is its predecessor's.
//! It is counted by the partition instead: once up to date and in service, a node that
//! holds no slot and has not yet released one releases one slot of its partition whose
//! holder is gone ([`release_for_replacement`]): its record deleted, or showing the same
//! instance's `powered off for image upgrade` reason and out of service. One new node in
//! service for one node powered off: the budget is kept, and the slot does not wait for
//! its `EndTime`.

use std::time::Duration;

use crate::slurm::{Scontrol, ScontrolError};

/// Start of every slot's name.
pub const SLOT_PREFIX: &str = "slurm-node-agent-upgrade-";

/// The name of slot `k` of `partition` (every node when empty).
pub fn slot_name(partition: &str, k: usize) -> String {
    if partition.is_empty() {
        format!("{SLOT_PREFIX}slot-{k}")
    } else {
        format!("{SLOT_PREFIX}{partition}-slot-{k}")
    }
}

/// Whether `name` is a slot of `partition`.
pub fn is_slot_of(name: &str, partition: &str) -> bool {
    let prefix = slot_name(partition, 0);
    let prefix = prefix.trim_end_matches('0');
    name.strip_prefix(prefix)
        .is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether `name` is a slot of any partition.
pub fn is_slot(name: &str) -> bool {
    name.strip_prefix(SLOT_PREFIX)
        .and_then(|r| r.rsplit_once("slot-"))
        .is_some_and(|(p, k)| {
            (p.is_empty() || p.ends_with('-'))
                && !k.is_empty()
                && k.bytes().all(|b| b.is_ascii_digit())
        })
}

/// What a slot is held for: its comment's cause word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotFor {
    /// A rolling image upgrade.
    Upgrade,
    /// A repair's reboot or replacement (`repair.mode = "on"`).
    Repair,
}

impl SlotFor {
    /// `upgrade` or `repair`.
    pub fn as_str(self) -> &'static str {
        match self {
            SlotFor::Upgrade => "upgrade",
            SlotFor::Repair => "repair",
        }
    }
}

/// The comment a slot carries: what it is held for and the instance that took it
/// (`slurm-node-agent/upgrade@<instance-id>`, `slurm-node-agent/repair@<instance-id>`).
pub fn slot_comment(held_for: SlotFor, instance_id: &str) -> String {
    format!("slurm-node-agent/{}@{instance_id}", held_for.as_str())
}

/// A slot as `scontrol show reservation -o` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// `ReservationName`.
    pub name: String,
    /// `Nodes`: the holder's NodeName.
    pub node: String,
    /// `Comment` (`slurm-node-agent/upgrade@<instance-id>` or `.../repair@...`), empty when
    /// none.
    pub comment: String,
    /// `EndTime`, as slurmctld prints it.
    pub end_time: String,
}

/// The slots (of any partition) in `scontrol show reservation -o` output; other
/// reservations are left out.
pub fn parse_slots(show: &str) -> Vec<Slot> {
    show.lines()
        .filter(|l| l.starts_with("ReservationName="))
        .filter_map(|l| {
            let field = |k: &str| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix(k).and_then(|v| v.strip_prefix('=')))
                    .unwrap_or_default()
                    .to_string()
            };
            let name = field("ReservationName");
            is_slot(&name).then(|| Slot {
                node: field("Nodes"),
                comment: field("Comment"),
                end_time: field("EndTime"),
                name,
            })
        })
        .collect()
}

impl Slot {
    /// The instance that took the slot, from its comment (`slurm-node-agent/upgrade@<id>`,
    /// `slurm-node-agent/repair@<id>`).
    pub fn instance_id(&self) -> Option<&str> {
        self.held_for()?;
        self.comment
            .split_once('@')
            .map(|(_, id)| id)
            .filter(|id| !id.is_empty())
    }

    /// What the slot is held for, from its comment ([`slot_comment`]).
    pub fn held_for(&self) -> Option<SlotFor> {
        [SlotFor::Upgrade, SlotFor::Repair].into_iter().find(|h| {
            self.comment
                .strip_prefix("slurm-node-agent/")
                .and_then(|r| r.strip_prefix(h.as_str()))
                .is_some_and(|r| r.starts_with('@'))
        })
    }
}

/// A slot released by a replacement under another NodeName ([`release_for_replacement`]).
#[derive(Debug, Clone)]
pub struct Reclaimed {
    /// The slot.
    pub slot: Slot,
    /// Its holder's record as it was (`None`: deleted).
    pub holder: Option<crate::slurm::NodeInfo>,
}

/// Whether the holder of `slot` is gone for good: its record deleted, or out of service
/// with the reason the same instance wrote just before it powered off for the upgrade,
/// and no other instance registered under its NodeName since (`InstanceId`, which the
/// agent's slurmd registers: a replacement under the same NodeName, booting, releases the
/// slot itself once in service).
fn holder_gone(slot: &Slot, holder: Option<&crate::slurm::NodeInfo>) -> bool {
    let Some(record) = holder else {
        return true;
    };
    if record
        .instance()
        .id
        .is_some_and(|id| Some(id) != slot.instance_id())
    {
        return false;
    }
    let reason = record.reason().unwrap_or_default();
    let upgrade = crate::upgrade::parse_upgrade_reason(reason).is_some_and(|r| {
        r.powered_off() && r.instance_id.is_some() && r.instance_id == slot.instance_id()
    });
    let repair = crate::repair::parse_reason(reason)
        .is_some_and(|r| r.powered_off() && Some(r.instance_id.as_str()) == slot.instance_id());
    let powered_off_by_holder = upgrade || repair;
    powered_off_by_holder && !record.is_available()
}

/// Releases one slot of `partition` whose holder is gone (see the module's docs), for
/// `node`, a node up to date and in service that holds none: the oldest by `EndTime`.
/// `None` when there is none. The caller releases at most one per instance.
///
/// # Errors
/// [`ScontrolError`].
pub async fn release_for_replacement(
    scontrol: &Scontrol,
    partition: &str,
    node: &str,
) -> Result<Option<Reclaimed>, ScontrolError> {
    let mut slots: Vec<Slot> = list(scontrol)
        .await?
        .into_iter()
        .filter(|s| is_slot_of(&s.name, partition) && s.node != node)
        .collect();
    slots.sort_by(|a, b| a.end_time.cmp(&b.end_time));
    for slot in slots {
        if !crate::slurm::node::is_plain_node_name(&slot.node) {
            continue;
        }
        let holder = scontrol.show_node(&slot.node).await?;
        if !holder_gone(&slot, holder.as_ref()) {
            continue;
        }
        match scontrol.run(&["delete", "reservation", &slot.name]).await {
            Ok(_) => return Ok(Some(Reclaimed { slot, holder })),
            // Ended, or released by another replacement meanwhile: try the next.
            Err(ScontrolError::Failed { stderr, .. })
                if stderr.contains("Requested reservation is invalid") => {}
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// What [`take`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taken {
    /// This NodeName already holds this slot (an earlier run, a previous instance of the
    /// same NodeName): kept.
    Held(String),
    /// Created now.
    New(String),
    /// Every slot of the partition is held (by these).
    Full(Vec<Slot>),
}

/// Whether a failed `create reservation` says the name is taken.
fn duplicate(e: &ScontrolError) -> bool {
    matches!(e, ScontrolError::Failed { stderr, stdout, .. }
        if stderr.contains("Duplicate reservation name") || stdout.contains("Duplicate reservation name"))
}

/// Whole minutes, at least one: reservations' durations are in minutes.
pub fn minutes(d: Duration) -> u64 {
    d.as_secs().div_ceil(60).max(1)
}

/// `scontrol show reservation -o`: every slot.
///
/// # Errors
/// [`ScontrolError`].
pub async fn list(scontrol: &Scontrol) -> Result<Vec<Slot>, ScontrolError> {
    match scontrol.run(&["show", "reservation", "-o"]).await {
        Ok(out) => Ok(parse_slots(&out)),
        // "No reservations in the system" is not an error on any version, but be lenient.
        Err(ScontrolError::Failed { stdout, stderr, .. })
            if stdout.contains("No reservations") || stderr.contains("No reservations") =>
        {
            Ok(Vec::new())
        }
        Err(e) => Err(e),
    }
}

/// Whether any slot of the budget is held in slurmctld (a rollout or a repair under way).
///
/// # Errors
/// [`ScontrolError`].
pub async fn any_held(scontrol: &Scontrol) -> Result<bool, ScontrolError> {
    Ok(!list(scontrol).await?.is_empty())
}

/// Takes a slot of `partition` (`limit` of them) for `node`, incarnation `instance_id`,
/// held for `held_for` (its comment), for `timeout`: keeps one this NodeName holds already, else creates the first free one;
/// a name taken meanwhile by another node (`Duplicate reservation name`) is skipped.
///
/// # Errors
/// [`ScontrolError`]: any other refusal (an unknown node, `Invalid time specified` from a
/// clock far behind slurmctld's), or no answer.
pub async fn take(
    scontrol: &Scontrol,
    partition: &str,
    limit: usize,
    node: &str,
    (held_for, instance_id): (SlotFor, &str),
    timeout: Duration,
) -> Result<Taken, ScontrolError> {
    if !crate::slurm::node::is_plain_node_name(node) {
        return Err(ScontrolError::NotOneNode {
            node: node.to_string(),
        });
    }
    let slots = list(scontrol).await?;
    if let Some(s) = slots
        .iter()
        .find(|s| s.node == node && is_slot_of(&s.name, partition))
    {
        return Ok(Taken::Held(s.name.clone()));
    }
    let duration = format!("Duration={}", minutes(timeout));
    let nodes = format!("Nodes={node}");
    let comment = format!("Comment={}", slot_comment(held_for, instance_id));
    for k in 1..=limit {
        let name = slot_name(partition, k);
        if slots.iter().any(|s| s.name == name) {
            continue;
        }
        let r = scontrol
            .run(&[
                "create",
                "reservation",
                &format!("ReservationName={name}"),
                "StartTime=now",
                &duration,
                &nodes,
                "Users=root",
                "Flags=IGNORE_JOBS,OVERLAP",
                &comment,
            ])
            .await;
        match r {
            Ok(_) => return Ok(Taken::New(name)),
            Err(e) if duplicate(&e) => continue,
            Err(e) => return Err(e),
        }
    }
    let held = list(scontrol)
        .await?
        .into_iter()
        .filter(|s| is_slot_of(&s.name, partition))
        .collect();
    Ok(Taken::Full(held))
}

/// Extends each slot `node` holds by `by` (`Duration+=`, whole minutes, on slurmctld's
/// clock). Returns the slots renewed.
///
/// # Errors
/// [`ScontrolError`].
pub async fn renew(
    scontrol: &Scontrol,
    node: &str,
    by: Duration,
) -> Result<Vec<String>, ScontrolError> {
    let mut renewed = Vec::new();
    for s in list(scontrol).await?.into_iter().filter(|s| s.node == node) {
        scontrol
            .run(&[
                "update",
                &format!("ReservationName={}", s.name),
                &format!("Duration+={}", minutes(by)),
            ])
            .await?;
        renewed.push(s.name);
    }
    Ok(renewed)
}

/// Deletes every slot `node` holds (`scontrol delete reservation <slot>`); one that ended
/// meanwhile is no error. Returns the slots released.
///
/// # Errors
/// [`ScontrolError`].
pub async fn release(scontrol: &Scontrol, node: &str) -> Result<Vec<String>, ScontrolError> {
    release_matching(scontrol, |s| s.node == node).await
}

/// Deletes the slots `node` holds for `held_for` (their comment), as [`release`] does.
///
/// # Errors
/// [`ScontrolError`].
pub async fn release_for(
    scontrol: &Scontrol,
    node: &str,
    held_for: SlotFor,
) -> Result<Vec<String>, ScontrolError> {
    release_matching(scontrol, |s| {
        s.node == node && s.held_for() == Some(held_for)
    })
    .await
}

/// Deletes every slot `keep` picks, as [`release`] does.
///
/// # Errors
/// [`ScontrolError`].
pub async fn release_matching(
    scontrol: &Scontrol,
    keep: impl Fn(&Slot) -> bool,
) -> Result<Vec<String>, ScontrolError> {
    let mut released = Vec::new();
    for s in list(scontrol).await?.into_iter().filter(|s| keep(s)) {
        match scontrol.run(&["delete", "reservation", &s.name]).await {
            Ok(_) => released.push(s.name),
            Err(ScontrolError::Failed { stderr, .. })
                if stderr.contains("Requested reservation is invalid") => {}
            Err(e) => return Err(e),
        }
    }
    Ok(released)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// `scontrol show reservation -o` of slurmctld 25.11.6 with two slots and an admin's
    /// reservation.
    const SHOW: &str = "\
ReservationName=slurm-node-agent-upgrade-main-slot-1 StartTime=2026-12-04T03:12:09 EndTime=2026-12-04T03:42:09 Duration=00:30:00 Nodes=c1 NodeCnt=1 CoreCnt=1 Features=(null) PartitionName=(null) Flags=OVERLAP,IGNORE_JOBS,SPEC_NODES TRES=cpu=1 AllowedPartitions=(null) QOS=(null) Users=root Groups=(null) Accounts=(null) Licenses=(null) State=ACTIVE BurstBuffer=(null) MaxStartDelay=(null) Comment=slurm-node-agent/upgrade@i-0123456789abcdef0
ReservationName=maint StartTime=2026-12-05T00:00:00 EndTime=2026-12-05T04:00:00 Duration=04:00:00 Nodes=c[1-8] NodeCnt=8 CoreCnt=8 Features=(null) PartitionName=(null) Flags=MAINT,SPEC_NODES TRES=cpu=8 Users=root State=INACTIVE
ReservationName=slurm-node-agent-upgrade-slot-2 StartTime=2026-12-04T03:12:09 EndTime=2026-12-04T03:42:09 Duration=00:30:00 Nodes=g1 NodeCnt=1 Flags=OVERLAP,IGNORE_JOBS,SPEC_NODES Users=root State=ACTIVE
";

    #[test]
    fn slots_are_told_from_other_reservations() {
        let s = parse_slots(SHOW);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].name, "slurm-node-agent-upgrade-main-slot-1");
        assert_eq!(s[0].node, "c1");
        assert_eq!(s[0].comment, "slurm-node-agent/upgrade@i-0123456789abcdef0");
        assert_eq!(s[0].end_time, "2026-12-04T03:42:09");
        assert_eq!(s[1].node, "g1");
        assert!(s[1].comment.is_empty());
        assert!(is_slot_of(&s[0].name, "main"));
        assert!(!is_slot_of(&s[0].name, "gpu"));
        assert!(!is_slot_of(&s[0].name, ""));
        assert!(is_slot_of(&s[1].name, ""));
        assert!(!is_slot_of("slurm-node-agent-upgrade-main-slot-", "main"));
        assert!(!is_slot_of("slurm-node-agent-upgrade-main-slot-1x", "main"));
        assert!(!is_slot("upgrade-slot-1"));
        assert!(parse_slots("No reservations in the system\n").is_empty());
    }

    /// Stands in for scontrol: `show reservation` prints `listed`; `create reservation`
    /// refuses a name in `taken` as slurmctld does, else takes it and notes the call.
    const FAKE: &str = r#"#!/bin/sh
d=$(dirname "$0")
case "$1 $2" in
"show reservation") cat "$d/listed" 2>/dev/null; exit 0 ;;
"create reservation")
  name=${3#ReservationName=}
  if grep -qx "$name" "$d/taken" 2>/dev/null; then
    echo "Error creating the reservation: Duplicate reservation name" >&2; exit 1
  fi
  echo "$name" >> "$d/taken"; echo "$*" >> "$d/created"; echo "Reservation created: $name" ;;
*) exit 1 ;;
esac
"#;

    #[tokio::test]
    async fn take_skips_slots_taken_meanwhile_and_keeps_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let program = dir.path().join("scontrol");
        crate::fsutil::write_test_program(&program, FAKE);
        let sc = Scontrol {
            program,
            timeout: Duration::from_secs(10),
            conf_server: String::new(),
            look: None,
        };
        let listed = "ReservationName=slurm-node-agent-upgrade-main-slot-1 Nodes=c1 State=ACTIVE Comment=slurm-node-agent/upgrade@i-1\n";
        std::fs::write(dir.path().join("listed"), listed).unwrap();
        // slot-2 was taken by another node after the list: slurmctld refuses the name.
        std::fs::write(
            dir.path().join("taken"),
            "slurm-node-agent-upgrade-main-slot-1\nslurm-node-agent-upgrade-main-slot-2\n",
        )
        .unwrap();
        let t = Duration::from_secs(1800);
        let full = take(&sc, "main", 2, "c2", (SlotFor::Upgrade, "i-2"), t)
            .await
            .unwrap();
        assert!(matches!(&full, Taken::Full(h) if h.len() == 1), "{full:?}");
        let new = take(&sc, "main", 3, "c2", (SlotFor::Upgrade, "i-2"), t)
            .await
            .unwrap();
        assert_eq!(
            new,
            Taken::New("slurm-node-agent-upgrade-main-slot-3".into())
        );
        let created = std::fs::read_to_string(dir.path().join("created")).unwrap();
        assert_eq!(
            created.trim(),
            "create reservation ReservationName=slurm-node-agent-upgrade-main-slot-3 \
             StartTime=now Duration=30 Nodes=c2 Users=root Flags=IGNORE_JOBS,OVERLAP \
             Comment=slurm-node-agent/upgrade@i-2"
        );
        // The NodeName holding a slot keeps it (a restart, a replacement under that name).
        let held = take(&sc, "main", 1, "c1", (SlotFor::Upgrade, "i-3"), t)
            .await
            .unwrap();
        assert_eq!(
            held,
            Taken::Held("slurm-node-agent-upgrade-main-slot-1".into())
        );
        // Never a name that is not one node.
        assert!(take(&sc, "main", 1, "c[1-2]", (SlotFor::Upgrade, "i-3"), t)
            .await
            .is_err());
    }

    /// Stands in for scontrol: `show reservation` prints `listed`, `show node X` prints
    /// `node-X` (or "not found"), `delete reservation R` notes R in `deleted`, refusing a
    /// name in `gone` as slurmctld does for one that ended.
    const FAKE_RECORDS: &str = r#"#!/bin/sh
d=$(dirname "$0")
case "$1 $2" in
"show reservation") cat "$d/listed"; exit 0 ;;
"show node")
  if [ -f "$d/node-$4" ]; then cat "$d/node-$4"; exit 0; fi
  echo "Node $4 not found" >&2; exit 1 ;;
"delete reservation")
  if grep -qx "$3" "$d/gone" 2>/dev/null; then echo "Requested reservation is invalid" >&2; exit 1; fi
  echo "$3" >> "$d/deleted" ;;
*) exit 1 ;;
esac
"#;

    #[tokio::test]
    async fn a_replacement_under_a_new_name_releases_one_slot_of_a_holder_that_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let program = dir.path().join("scontrol");
        crate::fsutil::write_test_program(&program, FAKE_RECORDS);
        let sc = Scontrol {
            program,
            timeout: Duration::from_secs(10),
            conf_server: String::new(),
            look: None,
        };
        let slot = |k: u32, node: &str, iid: &str, end: &str| {
            format!(
                "ReservationName=slurm-node-agent-upgrade-main-slot-{k} EndTime={end} Nodes={node} State=ACTIVE Comment=slurm-node-agent/upgrade@{iid}\n"
            )
        };
        let listed = [
            // Still draining (its jobs run): not gone.
            slot(1, "ip-10-0-0-1", "i-0000000000000000a", "2026-12-04T03:40:00"),
            // Powered off by the instance that took the slot: gone.
            slot(2, "ip-10-0-0-2", "i-0000000000000000b", "2026-12-04T03:50:00"),
            // Record deleted: gone, and its slot ends first.
            slot(3, "ip-10-0-0-3", "i-0000000000000000c", "2026-12-04T03:45:00"),
            // Powered off, but the reason is another instance's (a replacement of the same
            // name came and is itself out): not this slot's holder.
            slot(4, "ip-10-0-0-4", "i-0000000000000000d", "2026-12-04T03:30:00"),
            // Another partition's.
            "ReservationName=slurm-node-agent-upgrade-gpu-slot-1 EndTime=2026-12-04T03:00:00 Nodes=g1 Comment=slurm-node-agent/upgrade@i-0000000000000000f\n".to_string(),
        ]
        .concat();
        std::fs::write(dir.path().join("listed"), listed).unwrap();
        let off = "slurm-node-agent/upgrade@{iid}: powered off for image upgrade ami-0a887e401f7654935 -> ami-0123456789abcdef0";
        let record = |name: &str, state: &str, reason: &str| {
            std::fs::write(
                dir.path().join(format!("node-{name}")),
                format!(
                    "NodeName={name} State={state} Reason={reason} [root@2026-12-04T03:10:00]\n"
                ),
            )
            .unwrap();
        };
        record(
            "ip-10-0-0-1",
            "MIXED+DRAIN",
            "slurm-node-agent/upgrade@i-0000000000000000a: image upgrade ami-0a887e401f7654935 -> ami-0123456789abcdef0",
        );
        record(
            "ip-10-0-0-2",
            "IDLE+DRAIN+NOT_RESPONDING",
            &off.replace("{iid}", "i-0000000000000000b"),
        );
        record(
            "ip-10-0-0-4",
            "IDLE+DRAIN+NOT_RESPONDING",
            &off.replace("{iid}", "i-0000000000000004d"),
        );
        std::fs::write(dir.path().join("gone"), "").unwrap();

        let first = release_for_replacement(&sc, "main", "ip-10-0-0-9")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(first.slot.name, "slurm-node-agent-upgrade-main-slot-3");
        assert!(first.holder.is_none());
        // slot-3 ended meanwhile (another replacement released it): the next gone one.
        std::fs::write(
            dir.path().join("gone"),
            "slurm-node-agent-upgrade-main-slot-3\n",
        )
        .unwrap();
        let next = release_for_replacement(&sc, "main", "ip-10-0-0-9")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(next.slot.name, "slurm-node-agent-upgrade-main-slot-2");
        assert_eq!(next.slot.instance_id(), Some("i-0000000000000000b"));
        let deleted = std::fs::read_to_string(dir.path().join("deleted")).unwrap();
        assert_eq!(
            deleted,
            "slurm-node-agent-upgrade-main-slot-3\nslurm-node-agent-upgrade-main-slot-2\n"
        );
        // No slot of a holder that is still there, nor of another partition, nor its own.
        std::fs::write(
            dir.path().join("listed"),
            [
                slot(
                    1,
                    "ip-10-0-0-1",
                    "i-0000000000000000a",
                    "2026-12-04T03:40:00",
                ),
                slot(
                    4,
                    "ip-10-0-0-4",
                    "i-0000000000000000d",
                    "2026-12-04T03:30:00",
                ),
                slot(
                    5,
                    "ip-10-0-0-9",
                    "i-0000000000000000f",
                    "2026-12-04T03:20:00",
                ),
            ]
            .concat(),
        )
        .unwrap();
        assert!(release_for_replacement(&sc, "main", "ip-10-0-0-9")
            .await
            .unwrap()
            .is_none());
    }

    /// A repair's slot (its comment `slurm-node-agent/repair@<id>`) whose holder powered
    /// off for a replacement is released by a replacement under another NodeName, as an
    /// upgrade's; one whose holder still drains, or rebooted, is not.
    #[tokio::test]
    async fn a_gone_repairs_slot_is_released_for_a_replacement() {
        let dir = tempfile::tempdir().unwrap();
        let program = dir.path().join("scontrol");
        crate::fsutil::write_test_program(&program, FAKE_RECORDS);
        let sc = Scontrol {
            program,
            timeout: Duration::from_secs(10),
            conf_server: String::new(),
            look: None,
        };
        let slot = |k: u32, node: &str, iid: &str| {
            format!(
                "ReservationName=slurm-node-agent-upgrade-main-slot-{k} EndTime=2026-12-04T03:4{k}:00 Nodes={node} State=ACTIVE Comment={}\n",
                slot_comment(SlotFor::Repair, iid)
            )
        };
        std::fs::write(
            dir.path().join("listed"),
            [
                slot(1, "ip-10-0-0-1", "i-0000000000000000a"),
                slot(2, "ip-10-0-0-2", "i-0000000000000000b"),
            ]
            .concat(),
        )
        .unwrap();
        let record = |name: &str, state: &str, reason: &str| {
            std::fs::write(
                dir.path().join(format!("node-{name}")),
                format!(
                    "NodeName={name} State={state} Reason={reason} [root@2026-12-04T03:10:00]\n"
                ),
            )
            .unwrap();
        };
        record(
            "ip-10-0-0-1",
            "IDLE+DRAIN+REBOOT_ISSUED",
            &crate::repair::reason(
                "i-0000000000000000a",
                "GPUs: x",
                crate::repair::Stage::Rebooting,
            ),
        );
        record(
            "ip-10-0-0-2",
            "IDLE+DRAIN+NOT_RESPONDING",
            &crate::repair::reason(
                "i-0000000000000000b",
                "GPUs: x",
                crate::repair::Stage::PoweredOff(1_796_605_600),
            ),
        );
        std::fs::write(dir.path().join("gone"), "").unwrap();
        let r = release_for_replacement(&sc, "main", "ip-10-0-0-9")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(r.slot.name, "slurm-node-agent-upgrade-main-slot-2");
        assert_eq!(r.slot.instance_id(), Some("i-0000000000000000b"));
        std::fs::write(
            dir.path().join("listed"),
            slot(1, "ip-10-0-0-1", "i-0000000000000000a"),
        )
        .unwrap();
        assert!(release_for_replacement(&sc, "main", "ip-10-0-0-9")
            .await
            .unwrap()
            .is_none());
    }

    #[test]
    fn names_and_minutes() {
        assert_eq!(slot_name("main", 2), "slurm-node-agent-upgrade-main-slot-2");
        assert_eq!(slot_name("", 1), "slurm-node-agent-upgrade-slot-1");
        assert_eq!(minutes(Duration::from_secs(1)), 1);
        assert_eq!(minutes(Duration::from_secs(1800)), 30);
        assert_eq!(minutes(Duration::from_secs(1801)), 31);
        assert_eq!(minutes(Duration::ZERO), 1);
    }
}
