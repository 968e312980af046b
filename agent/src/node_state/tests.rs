//! The gateway against a stand-in scontrol ([`crate::slurm::node::test_scontrol`]): every
//! call it makes is in `calls`, the record it reads is `record`.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use super::*;

#[test]
fn a_drain_found_at_start_is_continued_only_when_it_is_this_instances() {
    const ME: &str = "i-0123456789abcdef0";
    const PREV: &str = "i-0fedcba9876543210";
    let unknown = crate::reason::UNKNOWN_INSTANCE;
    let drain_by = |writer: &str| {
        let mut st = DrainState::default();
        let cause = Cause::Upgrade {
            current: "ami-11111111".into(),
            desired: "ami-22222222".into(),
        };
        st.begin(cause.clone(), None, 1);
        st.reason = Some(cause.reason_for(writer));
        st
    };
    let this = RecordHolder::This;
    let prev = RecordHolder::Predecessor(PREV.into());
    let none = RecordHolder::Unknown;
    let aside = |owner: &str| FoundState::SetAside {
        owner: owner.into(),
    };
    // Nothing in progress: nothing to decide.
    assert_eq!(
        found_state(&DrainState::default(), ME, &prev),
        FoundState::Continue
    );
    // This instance's state: continued, unless Slurm says another instance has
    // registered the NodeName since.
    assert_eq!(found_state(&drain_by(ME), ME, &this), FoundState::Continue);
    assert_eq!(found_state(&drain_by(ME), ME, &none), FoundState::Continue);
    assert_eq!(found_state(&drain_by(ME), ME, &prev), aside(PREV));
    // A predecessor's state folder: set aside, whatever the record says.
    for holder in [&this, &prev, &none] {
        assert_eq!(
            found_state(&drain_by(PREV), ME, holder),
            aside(PREV),
            "{holder:?}"
        );
    }
    // A writer `unknown`: the record decides; without it, continued as before.
    assert_eq!(
        found_state(&drain_by(unknown), ME, &this),
        FoundState::Continue
    );
    assert_eq!(found_state(&drain_by(unknown), ME, &prev), aside(PREV));
    assert_eq!(
        found_state(&drain_by(unknown), ME, &none),
        FoundState::Continue
    );
}

#[test]
fn a_state_set_aside_keeps_its_content_and_the_next_load_is_active() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let store = Store::new(dir.path());
    assert_eq!(store.set_aside("predecessor").ok(), Some(None));
    let mut st = DrainState::default();
    st.begin(Cause::Manual { reason: "x".into() }, None, 1);
    store.save(&st).unwrap_or_else(|e| panic!("{e}"));
    let kept = std::fs::read(store.path()).unwrap_or_else(|e| panic!("{e}"));
    let aside = store
        .set_aside("predecessor")
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("nothing set aside"));
    assert!(aside
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("drain.json.predecessor-")));
    assert_eq!(std::fs::read(&aside).ok(), Some(kept));
    assert_eq!(store.load().ok(), Some(DrainState::default()));
}

const ID: &str = "i-0123456789abcdef0";

/// A gateway of node `n1` through a stand-in scontrol in `dir` (`show node` prints
/// `dir/record`; every call goes to `dir/calls`), its state in `dir/state`.
fn gateway(dir: &Path) -> Gateway {
    Gateway::new(
        "n1",
        crate::slurm::node::test_scontrol(dir),
        &dir.join("state"),
        Duration::from_millis(200),
        dir.join("state/drain.prom"),
    )
    .with_instance(ID)
}

fn record(dir: &Path, line: &str) {
    std::fs::write(dir.join("record"), format!("NodeName=n1 {line}\n")).unwrap();
}

fn calls(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("calls"))
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.starts_with("show "))
        .map(str::to_string)
        .collect()
}

fn health(detail: &str) -> Cause {
    Cause::Health {
        detail: detail.into(),
    }
}

#[tokio::test]
async fn a_health_drain_is_in_the_state_and_lifted_only_while_it_holds_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let gw = gateway(d);
    record(d, "State=IDLE");
    let r = gw.drain(health("check_a: gone"), None).await.unwrap();
    assert_eq!(r.begin, Begin::Started);
    let reason = format!("slurm-node-agent/health@{ID}: check_a: gone");
    assert_eq!(
        calls(d),
        [format!("update NodeName=n1 State=DRAIN Reason={reason}")]
    );
    let st = gw.load().unwrap();
    assert_eq!(
        (st.phase, st.reason.as_deref()),
        (Phase::Draining, Some(reason.as_str()))
    );
    let prom = std::fs::read_to_string(d.join("state/drain.prom")).unwrap();
    assert!(
        prom.contains("slurm_node_agent_drain_cause{kind=\"health\"} 1"),
        "{prom}"
    );

    // A spot notice takes the node: its reason is written over the health checks'.
    record(
        d,
        &format!("State=IDLE+DRAIN Reason={reason} [root@2026-01-01T00:00:00]"),
    );
    let spot = Cause::Spot {
        action: "terminate".into(),
        time: 1_767_225_610,
    };
    let r = gw.drain(spot.clone(), None).await.unwrap();
    assert!(matches!(r.begin, Begin::Escalated { .. }), "{r:?}");
    let spot_reason = spot.reason_for(ID);
    assert_eq!(
        calls(d).last().unwrap(),
        &format!("update NodeName=n1 State=DRAIN Reason={spot_reason}")
    );
    // The checks pass: the spot drain holds the node, nothing is resumed.
    record(
        d,
        &format!("State=IDLE+DRAIN Reason={spot_reason} [root@2026-01-01T00:00:01]"),
    );
    let before = calls(d);
    assert_eq!(
        gw.lift(CauseKind::Health, None).await.unwrap(),
        Lifted::HeldBy(CauseKind::Spot)
    );
    assert_eq!(calls(d), before);
    // Failing again changes nothing either: the spot drain outranks it.
    let r = gw.drain(health("check_a: gone"), None).await.unwrap();
    assert!(matches!(r.begin, Begin::AlreadyDraining { .. }), "{r:?}");
    assert_eq!(calls(d), before);
    assert_eq!(gw.load().unwrap().cause, Some(spot));
}

#[tokio::test]
async fn a_restated_health_drain_follows_the_failing_check_and_its_lift_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let gw = gateway(d);
    record(d, "State=MIXED");
    gw.drain(health("check_a: gone"), None).await.unwrap();
    let a = format!("slurm-node-agent/health@{ID}: check_a: gone");
    record(
        d,
        &format!("State=MIXED+DRAIN Reason={a} [root@2026-01-01T00:00:00]"),
    );
    let r = gw.drain(health("check_b: hung"), None).await.unwrap();
    assert!(matches!(r.begin, Begin::Restated { .. }), "{r:?}");
    let b = format!("slurm-node-agent/health@{ID}: check_b: hung");
    assert_eq!(
        calls(d).last().unwrap(),
        &format!("update NodeName=n1 State=DRAIN Reason={b}")
    );
    record(
        d,
        &format!("State=MIXED+DRAIN Reason={b} [root@2026-01-01T00:00:01]"),
    );
    assert_eq!(
        gw.lift(CauseKind::Health, None).await.unwrap(),
        Lifted::Resumed
    );
    assert_eq!(calls(d).last().unwrap(), "update NodeName=n1 State=RESUME");
    let st = gw.load().unwrap();
    assert_eq!((st.phase, st.cause), (Phase::Active, None));
    let events: Vec<_> = st.history.iter().map(|t| t.event.as_str()).collect();
    assert_eq!(events, ["begin", "restate", "resume"]);
}

#[tokio::test]
async fn the_ownership_rules_hold_for_every_cause() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let gw = gateway(d);
    // An admin's drain: a mount drain keeps their reason (no call), and remembers it.
    let admin = "State=IDLE+DRAIN Reason=hardware ticket 42 [root@2026-01-01T00:00:00]";
    record(d, admin);
    let mount = Cause::Mount {
        detail: "/fsx: gone".into(),
    };
    let r = gw.drain(mount, None).await.unwrap();
    assert_eq!(r.begin, Begin::Started);
    assert_eq!(
        r.state.foreign_reason.as_deref(),
        Some("hardware ticket 42")
    );
    assert!(calls(d).is_empty(), "{:?}", calls(d));
    // The mounts are back: the machine's drain is over, the admin's stays.
    assert_eq!(
        gw.lift(CauseKind::Mount, None).await.unwrap(),
        Lifted::LeftToOwner {
            reason: "hardware ticket 42".into()
        }
    );
    assert!(calls(d).is_empty(), "{:?}", calls(d));
    assert_eq!(gw.load().unwrap().phase, Phase::Active);
    // With no drain in the state, a lift touches only the agent's drain of that kind.
    assert_eq!(
        gw.lift(CauseKind::Health, None).await.unwrap(),
        Lifted::Nothing
    );
    record(
        d,
        "State=IDLE+DRAIN Reason=slurm-node-agent/health@i-0fedcba9876543210: x: y [root@2026-01-01T00:00:00]",
    );
    assert_eq!(
        gw.lift(CauseKind::Mount, None).await.unwrap(),
        Lifted::Nothing
    );
    // A predecessor's health drain: lifted by this instance's passing checks.
    assert_eq!(
        gw.lift(CauseKind::Health, None).await.unwrap(),
        Lifted::Resumed
    );
    assert_eq!(calls(d), ["update NodeName=n1 State=RESUME"]);
    // A reason rewritten in place never goes over an admin's.
    record(d, admin);
    let e = gw
        .relabel("slurm-node-agent/upgrade@i-0123456789abcdef0: x", None)
        .await
        .unwrap_err();
    assert!(matches!(e, DrainError::Foreign { .. }), "{e}");
    assert_eq!(calls(d).len(), 1);
}

#[tokio::test]
async fn a_busy_lock_is_waited_for_then_refused_without_a_change() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let gw = gateway(d);
    record(d, "State=IDLE");
    let held = gw.lock().await.unwrap();
    let e = gw.drain(health("check_a: gone"), None).await.unwrap_err();
    assert!(
        matches!(e, DrainError::Store(StoreError::Busy { .. })),
        "{e}"
    );
    assert_eq!(e.exit(), crate::exit::Exit::TempFail);
    assert!(calls(d).is_empty());
    drop(held);
    gw.drain(health("check_a: gone"), None).await.unwrap();
    assert_eq!(calls(d).len(), 1);
}

/// A repair's reboot done (`Done`) and the node back in service (`nextstate=resume`)
/// before the engine's step noted it: the health checks finding the fault again drain the
/// node at once (that drain is over), rather than leaving it in service until the engine's
/// next step; while the node is not back yet, nothing changes.
#[tokio::test]
async fn a_fault_found_after_a_reboot_done_drains_at_once_once_the_node_is_back() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let gw = gateway(d);
    let mut st = DrainState::default();
    st.begin(
        Cause::Repair {
            action: crate::repair::Planned::Reboot,
            fault: crate::repair::Fault::GpuResettable,
            check: "GPUs".into(),
            detail: "GPUs: XID 48".into(),
        },
        None,
        1,
    );
    st.drained(2).unwrap();
    st.act(None, 3).unwrap();
    st.done(4).unwrap();
    gw.save(&st).unwrap();
    // Rebooting: still drained in Slurm; the fault's drain waits.
    record(
        d,
        "State=IDLE+DRAIN+REBOOT_ISSUED Reason=x [root@2026-01-01T00:00:00]",
    );
    let r = gw.drain(health("GPUs: XID 48"), None).await.unwrap();
    assert!(matches!(r.begin, Begin::AlreadyDraining { .. }), "{r:?}");
    assert_eq!(gw.load().unwrap().phase, Phase::Done);
    // Back in service: the repair is complete, and the fault drains the node now.
    record(d, "State=IDLE");
    let r = gw.drain(health("GPUs: XID 48"), None).await.unwrap();
    assert_eq!(r.begin, Begin::Started);
    let st = gw.load().unwrap();
    assert_eq!(
        (st.phase, st.cause),
        (Phase::Draining, Some(health("GPUs: XID 48")))
    );
    let events: Vec<&str> = st.history.iter().map(|t| t.event.as_str()).collect();
    assert_eq!(events[events.len() - 2..], ["complete", "begin"]);
}
