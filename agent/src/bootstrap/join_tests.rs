//! The join against an in-memory slurmctld and systemd ([`crate::slurm::ctl::fake`],
//! [`crate::systemd::fake`]): the paths that only the fleet tests reached before (a
//! refused registration, a drain found at boot, a replacement under the same NodeName).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use super::*;
use crate::reason::{AgentReason, ReasonCause};
use crate::slurm::ctl::fake::FakeSlurmctld;
use crate::systemd::fake::FakeUnits;

const NODE: &str = "compute-1";
const ME: &str = "i-0123456789abcdef0";
const OLD: &str = "i-0fedcba9876543210";
const AMI_NEW: &str = "ami-0bbbbbbbbbbbbbbbb";
const AMI_OLD: &str = "ami-0aaaaaaaaaaaaaaaa";

/// A node: its settings (state under a temporary folder, whose `etc/slurm.conf` is the
/// client configuration, so the join does not wait for slurmd's cache), this instance on
/// `ami`, slurmctld and slurmd's unit (running for a second).
struct World {
    _dir: tempfile::TempDir,
    s: Settings,
    def: NodeDefinition,
    id: InstanceIdentity,
    slurmctld: FakeSlurmctld,
    units: FakeUnits,
}

impl World {
    fn new(ami: &str) -> World {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("bin")).unwrap();
        std::fs::create_dir_all(dir.path().join("etc")).unwrap();
        std::fs::write(dir.path().join("etc/slurm.conf"), "ClusterName=test\n").unwrap();
        let mut s = Settings::default();
        s.agent.state_dir = dir.path().join("state");
        std::fs::create_dir_all(&s.agent.state_dir).unwrap();
        s.slurm.bin_dir = dir.path().join("bin");
        s.slurm.join_deadline = crate::settings::HumanDuration(Duration::from_secs(3));
        let units = FakeUnits::default();
        units.running_since(&s.slurm.slurmd_unit, Duration::from_secs(1));
        World {
            _dir: dir,
            s,
            def: NodeDefinition {
                node_name: NODE.into(),
                dynamic_conf: None,
            },
            id: InstanceIdentity {
                instance_id: ME.into(),
                ami_id: ami.into(),
                ..InstanceIdentity::default()
            },
            slurmctld: FakeSlurmctld::default(),
            units,
        }
    }

    /// slurmctld's record of the node as the slurmd now running registered it (its
    /// `SlurmdStartTime` after any start of its unit in this test), in `state`, for instance `instance`, with `reason`.
    fn registered(&self, state: &str, instance: &str, reason: Option<&str>) {
        let now = crate::time::format(crate::time::now() + 3600);
        let start = now.trim_end_matches('Z');
        let reason = reason.map_or(String::new(), |r| {
            format!(" Reason={r} [root@2026-12-06T00:00:00]")
        });
        self.slurmctld.set_record(&format!(
            "NodeName={NODE} State={state} SlurmdStartTime={start} Version=25.11.6 \
             InstanceId={instance}{reason}"
        ));
    }

    async fn join(
        &self,
        holder: RecordHolder,
    ) -> Result<(NodeInfo, Option<String>), BootstrapError> {
        let gateway = self
            .s
            .node_gateway(NODE)
            .through(self.slurmctld.clone())
            .with_instance(ME);
        let peers = Peers {
            slurmctld: &self.slurmctld,
            systemd: &self.units,
        };
        join(&self.s, &self.def, peers, &self.id, &gateway, &holder, None).await
    }

    /// The changes slurmctld was asked for (its looks aside).
    fn changes(&self) -> Vec<String> {
        self.slurmctld
            .calls()
            .into_iter()
            .filter(|c| !c.starts_with("show "))
            .collect()
    }
}

#[tokio::test]
async fn a_registration_slurmctld_marks_invalid_is_refused_with_its_state_and_reason() {
    let w = World::new(AMI_NEW);
    w.registered(
        "IDLE+INVALID_REG",
        ME,
        Some("Low RealMemory (reported:7400 < 100.00% of configured:15000)"),
    );
    let e = w.join(RecordHolder::Unknown).await.unwrap_err();
    let BootstrapError::Invalid {
        node_name,
        state,
        reason,
    } = &e
    else {
        panic!("not refused as invalid: {e}")
    };
    assert_eq!(node_name, NODE);
    assert_eq!(state, "IDLE+INVALID_REG");
    assert!(reason.starts_with("Low RealMemory"), "{reason}");
    assert!(w.changes().is_empty(), "{:?}", w.changes());
}

#[tokio::test]
async fn a_notice_drain_found_at_boot_is_lifted_and_an_admins_is_kept() {
    // An earlier boot of this instance drained for a spot notice that never came true.
    let w = World::new(AMI_NEW);
    let spot = AgentReason::new(
        ReasonCause::Spot,
        ME,
        "interruption notice at 2026-12-06T20:00:00Z",
    );
    w.registered("IDLE+DRAIN", ME, Some(&spot.to_reason()));
    let (node, kept) = w.join(RecordHolder::This).await.unwrap();
    assert!(node.is_available(), "{:?}", node.state());
    assert_eq!(kept, None);
    assert_eq!(
        w.changes(),
        [format!("update NodeName={NODE} State=RESUME")]
    );
    let record = w.slurmctld.record(NODE).unwrap();
    assert_eq!(record.held_reason(), None, "{record:?}");

    // An admin's drain stays, and the join succeeds with it named.
    let w = World::new(AMI_NEW);
    w.registered("IDLE+DRAIN", ME, Some("bad DIMM B2, ticket 4711"));
    let (node, kept) = w.join(RecordHolder::This).await.unwrap();
    assert!(node.is_drained());
    let kept = kept.unwrap();
    assert!(
        kept.contains("drained by an admin (bad DIMM B2, ticket 4711)"),
        "{kept}"
    );
    assert!(w.changes().is_empty(), "{:?}", w.changes());

    // The agent's health drain of an earlier boot is the health checks' to lift.
    let w = World::new(AMI_NEW);
    let health = AgentReason::new(ReasonCause::Health, ME, "check_fs_mount_rw /fsx failed");
    w.registered("IDLE+DRAIN", ME, Some(&health.to_reason()));
    let (_, kept) = w.join(RecordHolder::This).await.unwrap();
    assert!(kept
        .unwrap()
        .contains("the health checks lift it when they pass"));
    assert!(w.changes().is_empty(), "{:?}", w.changes());
}

#[tokio::test]
async fn a_same_name_replacement_lifts_its_predecessors_upgrade_drain_unless_it_runs_the_old_image()
{
    let upgrade = AgentReason::new(
        ReasonCause::Upgrade,
        OLD,
        &format!("image upgrade {AMI_OLD} -> {AMI_NEW}"),
    )
    .to_reason();
    // The replacement runs the image its predecessor drained for: the upgrade is over.
    let w = World::new(AMI_NEW);
    w.registered("IDLE+DRAIN", ME, Some(&upgrade));
    let (node, kept) = w.join(RecordHolder::Predecessor(OLD.into())).await.unwrap();
    assert!(node.is_available(), "{:?}", node.state());
    assert_eq!(kept, None);
    assert_eq!(
        w.changes(),
        [format!("update NodeName={NODE} State=RESUME")]
    );

    // The replacement was launched from the old image again (a launch template that does
    // not follow the parameter): the drain stays for the upgrade check's loop guard.
    let w = World::new(AMI_OLD);
    w.registered("IDLE+DRAIN", ME, Some(&upgrade));
    let (node, kept) = w.join(RecordHolder::Predecessor(OLD.into())).await.unwrap();
    assert!(node.is_drained());
    let kept = kept.unwrap();
    assert!(kept.contains(&format!("left by instance {OLD}")), "{kept}");
    assert!(kept.contains("the upgrade check owns it"), "{kept}");
    assert!(w.changes().is_empty(), "{:?}", w.changes());
}

/// A same-name replacement of a node a repair powered off lifts the predecessor's drain
/// (its hardware is gone with it) and keeps the replacement in `repair.json`: the flap
/// guard's history of this NodeName, which the lift overwrites in slurmctld.
#[tokio::test]
async fn a_same_name_replacement_lifts_its_predecessors_repair_drain_and_keeps_its_history() {
    let at = crate::time::now() - 600;
    let off = crate::repair::reason(
        OLD,
        "GPUs: XID 79 on PCI:0000:00:1e",
        crate::repair::Stage::PoweredOff(at),
    );
    let w = World::new(AMI_NEW);
    w.registered("IDLE+DRAIN", ME, Some(&off));
    let (node, kept) = w.join(RecordHolder::Predecessor(OLD.into())).await.unwrap();
    assert!(node.is_available(), "{:?}", node.state());
    assert_eq!(kept, None);
    assert_eq!(
        w.changes(),
        [format!("update NodeName={NODE} State=RESUME")]
    );
    let record = crate::repair::record::Record::load(&crate::repair::record::record_path(
        &w.s.agent.state_dir,
    ));
    assert_eq!(
        record.replaced,
        [crate::repair::record::Replaced {
            detail: "GPUs: XID 79 on PCI:0000:00:1e".into(),
            instance: OLD.into(),
            at,
        }]
    );
}

#[tokio::test]
async fn a_slurmd_that_failed_is_restarted_and_the_join_ends_when_it_has_registered() {
    let w = World::new(AMI_NEW);
    let unit = w.s.slurm.slurmd_unit.clone();
    w.units.set(
        &unit,
        crate::systemd::ServiceInfo {
            active_state: "failed".into(),
            result: "exit-code".into(),
            ..Default::default()
        },
    );
    // The record of an earlier registration: not this slurmd's (it is not running).
    w.registered("IDLE", ME, None);
    let (node, kept) = w.join(RecordHolder::This).await.unwrap();
    assert!(node.is_available());
    assert_eq!(kept, None);
    assert_eq!(
        w.units.calls(),
        [format!("stop {unit}"), format!("start {unit}")]
    );
}

#[tokio::test]
async fn a_node_slurmctld_never_shows_registered_fails_at_the_deadline_naming_what_it_saw() {
    let w = World::new(AMI_NEW);
    // A record from a slurmd that ran an hour before this one.
    let before = crate::time::format(crate::time::now() - 3600);
    let before = before.trim_end_matches('Z');
    w.slurmctld.set_record(&format!(
        "NodeName={NODE} State=IDLE+NOT_RESPONDING SlurmdStartTime={before} Version=25.11.6"
    ));
    let e = w.join(RecordHolder::Unknown).await.unwrap_err();
    let BootstrapError::Join {
        node_name,
        last_error,
        ..
    } = &e
    else {
        panic!("not a join error: {e}")
    };
    assert_eq!(node_name, NODE);
    assert!(
        last_error.contains("slurmctld shows no registration by the slurmd now running"),
        "{last_error}"
    );
    assert!(
        last_error.contains("is active (restarted 0 times)"),
        "{last_error}"
    );
}

/// Issue 44 §2: the join says what it waits for at least every 10 s, in the journal and in
/// `progress.json` (what `status` shows), while slurmctld does not show the registration;
/// on tokio's paused clock, so 25 s of waiting take no time. The record goes when the join
/// ends.
#[tokio::test(start_paused = true)]
async fn the_join_says_what_it_waits_for_every_ten_seconds() {
    let mut w = World::new(AMI_NEW);
    // Wall-clock time for the deadline: far enough that only the registration ends it.
    w.s.slurm.join_deadline = crate::settings::HumanDuration(Duration::from_secs(600));
    let before = crate::time::format(crate::time::now() - 3600);
    let before = before.trim_end_matches('Z');
    w.slurmctld.set_record(&format!(
        "NodeName={NODE} State=IDLE+NOT_RESPONDING SlurmdStartTime={before} Version=25.11.6"
    ));
    let state = w.s.agent.state_dir.clone();
    let watch = async {
        tokio::time::sleep(Duration::from_secs(25)).await;
        let r = crate::progress::Record::load(&state).expect("a progress record while waiting");
        // Now slurmd registers: the join ends.
        w.registered("IDLE", ME, None);
        r
    };
    let (joined, seen) = tokio::join!(w.join(RecordHolder::This), watch);
    joined.unwrap();
    assert_eq!(seen.step, "bootstrap: join");
    assert!(
        seen.waiting_for
            .starts_with("slurmd's registration with slurmctld (slurmd.service active;"),
        "{seen:?}"
    );
    assert!(
        seen.waiting_for
            .contains("slurmctld shows no registration by the slurmd now running"),
        "{seen:?}"
    );
    // Said at 0, 10 and 20 s of the wait.
    assert_eq!(seen.lines, 3, "{seen:?}");
    assert!(crate::progress::Record::load(&state).is_none());
}
