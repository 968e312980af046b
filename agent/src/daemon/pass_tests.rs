//! The daemon's passes over the notices and events against an in-memory instance metadata
//! service and slurmctld ([`crate::imds::fake`], [`crate::slurm::ctl::fake`]): what the
//! fleet tests reached before (a maintenance event that drains and its cancellation that
//! lifts the drain, a spot notice, a metadata service that goes away).

#![allow(clippy::unwrap_used)]

use super::*;
use crate::imds::fake::FakeImds;
use crate::slurm::ctl::fake::FakeSlurmctld;

const NODE: &str = "compute-1";
const ME: &str = "i-0123456789abcdef0";
const EVENT: &str = "instance-event-0d59937288b749b32";

/// The daemon's context for `NODE`, instance `ME`, its state under a temporary folder,
/// through `imds` and `slurmctld`, which holds the node IDLE.
fn ctx(imds: &FakeImds, slurmctld: &FakeSlurmctld) -> (tempfile::TempDir, Arc<Ctx>) {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Settings::default();
    s.agent.state_dir = dir.path().join("state");
    std::fs::create_dir_all(&s.agent.state_dir).unwrap();
    s.slurm.bin_dir = dir.path().join("bin");
    slurmctld.set_record(&format!(
        "NodeName={NODE} State=IDLE SlurmdStartTime=2026-12-06T00:00:00 Version=25.11.6 InstanceId={ME}"
    ));
    let engine = s
        .drain_engine(NODE)
        .with_instance(ME)
        .through(slurmctld.clone());
    let gateway = s
        .node_gateway(NODE)
        .with_instance(ME)
        .through(slurmctld.clone());
    let ctx = Ctx {
        budget: Budget::new(),
        mount_env: crate::mounts::MountEnv::for_bus(&s.systemd.bus),
        gateway: gateway.clone(),
        health_gateway: crate::health::act::health_gateway(gateway, &s.health),
        health_act: crate::health::act::ActOptions::new(&s.agent.state_dir),
        health_env: crate::health::RunEnv::new(&s.health, &s.systemd.bus),
        aws: None,
        capacity_ec2: None,
        capacity: std::sync::Mutex::default(),
        imds: Arc::new(imds.clone()),
        engine,
        id: InstanceIdentity {
            instance_id: ME.into(),
            ..InstanceIdentity::default()
        },
        node: NODE.into(),
        outage: std::sync::Mutex::new(Outage::default()),
        health_looked: std::sync::atomic::AtomicBool::new(false),
        repair_record: std::sync::Mutex::new(None),
        repair_looked: std::sync::atomic::AtomicBool::new(false),
        repair_predecessors_looked: std::sync::atomic::AtomicBool::new(false),
        terminated_at: std::sync::atomic::AtomicI64::new(0),
        hooks: tokio::sync::Mutex::new(Hooks::new(&s)),
        orphan: None,
        notices: std::sync::Mutex::new(metrics::Notices::default()),
        s,
    };
    (dir, Arc::new(ctx))
}

/// Unix seconds `secs` as IMDS writes a maintenance event's times (`21 Jan 2019 09:00:43
/// GMT`).
fn event_time(secs: i64) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let t = crate::time::format(secs);
    let (date, time) = t.trim_end_matches('Z').split_once('T').unwrap();
    let mut ymd = date.split('-');
    let (y, m, d) = (
        ymd.next().unwrap(),
        ymd.next().unwrap(),
        ymd.next().unwrap(),
    );
    let month = MONTHS[m.parse::<usize>().unwrap() - 1];
    format!("{d} {month} {y} {time} GMT")
}

/// One maintenance event `EVENT` in `state`, an hour from now.
fn event(state: &str) -> String {
    let now = crate::time::now();
    format!(
        r#"[{{"NotBefore":"{}","Code":"system-reboot","Description":"scheduled reboot","EventId":"{EVENT}","NotAfter":"{}","State":"{state}"}}]"#,
        event_time(now + 3600),
        event_time(now + 7200)
    )
}

async fn pass(ctx: &Arc<Ctx>, work: Work) {
    let out = do_work(ctx.clone(), work, tokio::runtime::Handle::current()).await;
    out.result.unwrap();
}

#[tokio::test]
async fn a_maintenance_event_drains_the_node_and_its_cancellation_lifts_the_drain() {
    let (imds, slurmctld) = (FakeImds::default(), FakeSlurmctld::default());
    let (_dir, ctx) = ctx(&imds, &slurmctld);
    imds.set(events::notice::MAINTENANCE_PATH, &event("active"));
    pass(&ctx, Work::Maintenance).await;
    let record = slurmctld.record(NODE).unwrap();
    assert!(record.is_drained(), "{record:?}");
    let reason = record.reason().unwrap();
    assert!(
        reason.starts_with(&format!("slurm-node-agent/maintenance@{ME}: "))
            && reason.contains(EVENT),
        "{reason}"
    );
    let st = ctx.engine.load().unwrap();
    assert_eq!(st.phase, Phase::Draining);
    assert_eq!(
        st.cause.as_ref().map(Cause::key),
        Some(format!("maintenance:{EVENT}"))
    );

    // Polled again, the same event changes nothing.
    pass(&ctx, Work::Maintenance).await;
    let drains = slurmctld
        .calls()
        .iter()
        .filter(|c| c.contains("State=DRAIN"))
        .count();
    assert_eq!(drains, 1, "{:?}", slurmctld.calls());

    // EC2 cancels it: scheduled answers 404, history names it canceled.
    imds.remove(events::notice::MAINTENANCE_PATH);
    imds.set(events::notice::MAINTENANCE_HISTORY_PATH, &event("canceled"));
    pass(&ctx, Work::Maintenance).await;
    let record = slurmctld.record(NODE).unwrap();
    assert!(record.is_available(), "{record:?}");
    assert_eq!(ctx.engine.load().unwrap().phase, Phase::Active);
}

#[tokio::test]
async fn a_metadata_service_gone_away_keeps_the_maintenance_drain() {
    let (imds, slurmctld) = (FakeImds::default(), FakeSlurmctld::default());
    let (_dir, ctx) = ctx(&imds, &slurmctld);
    imds.set(events::notice::MAINTENANCE_PATH, &event("active"));
    pass(&ctx, Work::Maintenance).await;
    assert!(slurmctld.record(NODE).unwrap().is_drained());

    // Unreachable: neither "scheduled" nor "history" could be read; nothing is undone.
    imds.set_down(true);
    pass(&ctx, Work::Maintenance).await;
    assert!(slurmctld.record(NODE).unwrap().is_drained());
    assert_eq!(ctx.engine.load().unwrap().phase, Phase::Draining);
    let outage = lock_outage(&ctx);
    assert!(outage.failing && outage.count == 2, "{outage:?}");
}

#[tokio::test]
async fn a_spot_interruption_notice_drains_with_its_action_and_time() {
    let (imds, slurmctld) = (FakeImds::default(), FakeSlurmctld::default());
    let (_dir, ctx) = ctx(&imds, &slurmctld);
    // No notice: nothing.
    pass(&ctx, Work::Spot).await;
    assert!(slurmctld.record(NODE).unwrap().is_available());
    imds.set(
        events::notice::SPOT_PATH,
        r#"{"action": "terminate", "time": "2026-12-06T21:22:00Z"}"#,
    );
    pass(&ctx, Work::Spot).await;
    let record = slurmctld.record(NODE).unwrap();
    let reason = record.reason().unwrap();
    assert!(
        reason.starts_with(&format!("slurm-node-agent/spot@{ME}: ")),
        "{reason}"
    );
    assert!(
        reason.contains("terminate") && reason.contains("2026-12-06T21:22:00Z"),
        "{reason}"
    );
    assert_eq!(ctx.engine.load().unwrap().phase, Phase::Draining);
}

/// EC2 (the project's emulator: moto has no capacity reservations) with instance `ME`,
/// in capacity reservation `reservation` when given, and a client signed as its instance
/// profile.
fn ec2_with(reservation: Option<&str>) -> (imds_emulator::ec2::Ec2Emulator, aws_sdk_ec2::Client) {
    use imds_emulator::ec2::{Ec2Emulator, Ec2Instance};
    let emu = Ec2Emulator::start().unwrap();
    emu.add_instance(Ec2Instance {
        instance_id: ME.into(),
        instance_type: "p5.48xlarge".into(),
        availability_zone: "us-east-1a".into(),
        instance_lifecycle: reservation.map(|_| "capacity-block".into()),
        capacity_reservation_id: reservation.map(str::to_string),
        role: "compute".into(),
        access_key_id: "ASIAPASSTESTS0000001".into(),
        secret_access_key: "pass-tests-secret".into(),
        session_token: Some("pass-tests-token".into()),
    });
    let config = aws_sdk_ec2::Config::builder()
        .behavior_version(aws_sdk_ec2::config::BehaviorVersion::latest())
        .region(aws_sdk_ec2::config::Region::new("us-east-1"))
        .endpoint_url(emu.endpoint())
        .credentials_provider(aws_sdk_ec2::config::Credentials::new(
            "ASIAPASSTESTS0000001",
            "pass-tests-secret",
            Some("pass-tests-token".into()),
            None,
            "pass-tests",
        ))
        .build();
    (emu, aws_sdk_ec2::Client::from_conf(config))
}

/// Capacity Block `id` from an hour ago to `end`.
fn block(id: &str, end: Option<i64>) -> imds_emulator::ec2::CapacityReservation {
    imds_emulator::ec2::CapacityReservation {
        id: id.into(),
        instance_type: "p5.48xlarge".into(),
        availability_zone: "us-east-1a".into(),
        total_instance_count: 1,
        state: "active".into(),
        start_date: crate::time::now() - 3600,
        end_date: end,
        reservation_type: "capacity-block".into(),
    }
}

/// [`ctx`] with the Capacity Block watch's EC2 client `ec2`.
fn with_ec2(ctx: Arc<Ctx>, ec2: aws_sdk_ec2::Client) -> Arc<Ctx> {
    Arc::new(Ctx {
        capacity_ec2: Some(ec2),
        ..Arc::try_unwrap(ctx).ok().unwrap()
    })
}

#[tokio::test]
async fn a_capacity_block_ending_within_the_lead_drains_and_its_extension_undoes_the_drain() {
    const CR: &str = "cr-0123456789abcdef0";
    let (imds, slurmctld) = (FakeImds::default(), FakeSlurmctld::default());
    let (_dir, ctx) = ctx(&imds, &slurmctld);
    let (emu, ec2) = ec2_with(Some(CR));
    let ctx = with_ec2(ctx, ec2);
    let now = crate::time::now();
    let lead = i64::try_from(ctx.s.events.capacity_block_lead.0.as_secs()).unwrap();
    // EC2 begins terminating 30 minutes before the end; the drain is due a lead before:
    // a minute after that is still a minute too early.
    let end = now + 30 * 60 + lead + 60;
    emu.put_capacity_reservation(block(CR, Some(end)));
    pass(&ctx, Work::CapacityBlock).await;
    assert!(slurmctld.record(NODE).unwrap().is_available());
    // The block ends two minutes sooner (as if a minute past the drain time).
    let end = end - 120;
    emu.set_end_date(CR, Some(end));
    pass(&ctx, Work::CapacityBlock).await;
    let record = slurmctld.record(NODE).unwrap();
    assert!(record.is_drained(), "{record:?}");
    let reason = record.reason().unwrap();
    assert_eq!(
        reason,
        format!(
            "slurm-node-agent/capacity-block@{ME}: capacity block {CR} ends {}; EC2 terminates its instances from {}",
            crate::time::format(end),
            crate::time::format(end - 1800)
        )
    );
    let st = ctx.engine.load().unwrap();
    assert_eq!(st.cause.as_ref().map(Cause::kind), Some("capacity-block"));
    // Only the first lookup asked for the instance's reservation.
    let actions: Vec<String> = emu
        .requests()
        .into_iter()
        .filter_map(|r| r.action)
        .collect();
    assert_eq!(
        actions,
        [
            "DescribeInstances",
            "DescribeCapacityReservations",
            "DescribeCapacityReservations"
        ]
    );

    // The notices' poll decides from the last lookup: the drain stays, nothing is asked.
    pass(&ctx, Work::Notices).await;
    assert!(slurmctld.record(NODE).unwrap().is_drained());
    assert_eq!(emu.requests().len(), 3);

    // The block is extended by a day: the drain is undone at the next lookup.
    emu.set_end_date(CR, Some(end + 86_400));
    pass(&ctx, Work::CapacityBlock).await;
    let record = slurmctld.record(NODE).unwrap();
    assert!(record.is_available(), "{record:?}");
    assert_eq!(ctx.engine.load().unwrap().phase, Phase::Active);
}

#[tokio::test]
async fn outside_a_capacity_block_or_without_permission_nothing_drains() {
    let (imds, slurmctld) = (FakeImds::default(), FakeSlurmctld::default());
    // In no reservation: one lookup, then none.
    {
        let (_dir, ctx) = ctx(&imds, &slurmctld);
        let (emu, ec2) = ec2_with(None);
        let ctx = with_ec2(ctx, ec2);
        pass(&ctx, Work::CapacityBlock).await;
        pass(&ctx, Work::CapacityBlock).await;
        assert!(slurmctld.record(NODE).unwrap().is_available());
        assert_eq!(emu.requests().len(), 1, "{:?}", emu.requests());
    }
    // In an On-Demand Capacity Reservation ending now: its instances outlive it.
    {
        let (_dir, ctx) = ctx(&imds, &slurmctld);
        let (emu, ec2) = ec2_with(Some("cr-0aaaaaaaaaaaaaaaa"));
        let mut odcr = block("cr-0aaaaaaaaaaaaaaaa", Some(crate::time::now()));
        odcr.reservation_type = "default".into();
        emu.put_capacity_reservation(odcr);
        let ctx = with_ec2(ctx, ec2);
        pass(&ctx, Work::CapacityBlock).await;
        pass(&ctx, Work::CapacityBlock).await;
        assert!(slurmctld.record(NODE).unwrap().is_available());
        assert_eq!(emu.requests().len(), 2, "{:?}", emu.requests());
    }
    // A block without an end date is left alone.
    {
        let (_dir, ctx) = ctx(&imds, &slurmctld);
        let (emu, ec2) = ec2_with(Some("cr-0bbbbbbbbbbbbbbbb"));
        emu.put_capacity_reservation(block("cr-0bbbbbbbbbbbbbbbb", None));
        let ctx = with_ec2(ctx, ec2);
        pass(&ctx, Work::CapacityBlock).await;
        assert!(slurmctld.record(NODE).unwrap().is_available());
    }
    // No permission to describe reservations: no failure, no drain; allowed again, the
    // next lookup drains for a block that ends now.
    {
        const CR: &str = "cr-0cccccccccccccccc";
        let (_dir, ctx) = ctx(&imds, &slurmctld);
        let (emu, ec2) = ec2_with(Some(CR));
        emu.put_capacity_reservation(block(CR, Some(crate::time::now() + 600)));
        emu.deny(ME, "DescribeCapacityReservations", true);
        let ctx = with_ec2(ctx, ec2);
        pass(&ctx, Work::CapacityBlock).await;
        assert!(slurmctld.record(NODE).unwrap().is_available());
        let denied = emu.requests().last().cloned().unwrap();
        assert_eq!(denied.error.as_deref(), Some("UnauthorizedOperation"));
        emu.deny(ME, "DescribeCapacityReservations", false);
        pass(&ctx, Work::CapacityBlock).await;
        assert!(slurmctld.record(NODE).unwrap().is_drained());
    }
}

/// A checks.d file whose check fails: a CPU count the host does not have (a hardware
/// fault: `replace`).
const FAILING_CPUS: &str = "[[check]]\nname = \"cpus\"\nkind = \"hardware\"\ncpus = 99999\n";

/// `ctx` (held by nothing else) with settings `s`.
fn with_settings(ctx: Arc<Ctx>, s: Settings) -> Arc<Ctx> {
    Arc::new(Ctx {
        s,
        ..Arc::try_unwrap(ctx).ok().unwrap()
    })
}

/// [`ctx`] with `repair.mode = "report"`, the health checks of `checks` (a checks.d
/// file) and no health actions (the drain is not what these tests look at).
fn report_ctx(
    imds: &FakeImds,
    slurmctld: &FakeSlurmctld,
    checks: &str,
) -> (tempfile::TempDir, Arc<Ctx>) {
    let (dir, ctx) = ctx(imds, slurmctld);
    let mut s = ctx.s.clone();
    let checks_dir = dir.path().join("checks.d");
    std::fs::create_dir_all(&checks_dir).unwrap();
    std::fs::write(checks_dir.join("10-test.toml"), checks).unwrap();
    s.health.checks_dir = checks_dir;
    s.health.nhc_conf = Vec::new();
    s.health.act = false;
    s.repair.mode = crate::repair::RepairMode::Report;
    let ctx = with_settings(ctx, s);
    (dir, ctx)
}

#[tokio::test]
async fn repair_in_report_mode_logs_and_counts_what_it_would_do_and_changes_nothing() {
    let (imds, slurmctld) = (FakeImds::default(), FakeSlurmctld::default());
    // Two failing checks: a mount (isolate) and the CPU count (replace: the strongest).
    let (_dir, ctx) = report_ctx(
        &imds,
        &slurmctld,
        "[[check]]\nname = \"shared file systems\"\nkind = \"mount\"\npath = \"/no/such/mount\"\n\n\
         [[check]]\nname = \"cpus\"\nkind = \"hardware\"\ncpus = 99999\n",
    );
    let record_path = crate::repair::record::record_path(&ctx.s.agent.state_dir);
    health_pass(&ctx).await;
    let record = crate::repair::record::Record::load(&record_path);
    let current = record.current.as_ref().unwrap();
    assert_eq!(current.plan.action, crate::repair::Planned::Replace);
    assert_eq!(current.plan.fault, crate::repair::Fault::HardwareDegraded);
    assert_eq!(current.plan.check, "cpus");
    assert_eq!(record.planned["report/replace/hardware_degraded"], 1);
    let prom = std::fs::read_to_string(ctx.s.agent.state_dir.join("repair.prom")).unwrap();
    assert!(prom.contains("slurm_node_agent_repair_pending{mode=\"report\",action=\"replace\",fault=\"hardware_degraded\"} 1"), "{prom}");
    // The same faults again: counted once.
    health_pass(&ctx).await;
    let record = crate::repair::record::Record::load(&record_path);
    assert_eq!(record.planned["report/replace/hardware_degraded"], 1);
    // Nothing changed in Slurm or in the drain state.
    assert!(slurmctld.record(NODE).unwrap().is_available());
    assert!(
        slurmctld.calls().iter().all(|c| c.starts_with("show ")),
        "{:?}",
        slurmctld.calls()
    );
    assert_eq!(ctx.engine.load().unwrap().phase, Phase::Active);
}

#[tokio::test]
async fn the_breaker_withholds_a_replacement_when_the_fleet_fails_the_same_check() {
    let (imds, slurmctld) = (FakeImds::default(), FakeSlurmctld::default());
    let (_dir, ctx) = report_ctx(&imds, &slurmctld, FAILING_CPUS);
    // Four nodes in `p`: this one, and another drained by its health checks for `cpus`.
    let cpus = crate::reason::reason(
        crate::reason::ReasonCause::Health,
        "i-0fedcba9876543210",
        "cpus: found 4 CPUs, expected 99999",
    );
    slurmctld.set_record(&format!(
        "NodeName={NODE} State=IDLE Partitions=p SlurmdStartTime=2026-12-06T00:00:00 InstanceId={ME}"
    ));
    slurmctld.set_record(&format!(
        "NodeName=compute-2 State=IDLE+DRAIN Partitions=p Reason={cpus} [root@2026-12-06T00:00:00]"
    ));
    for n in ["compute-3", "compute-4"] {
        slurmctld.set_record(&format!("NodeName={n} State=IDLE Partitions=p"));
    }
    let record_path = crate::repair::record::record_path(&ctx.s.agent.state_dir);
    health_pass(&ctx).await;
    let record = crate::repair::record::Record::load(&record_path);
    let plan = &record.current.as_ref().unwrap().plan;
    assert_eq!(plan.action, crate::repair::Planned::Isolate);
    let withheld = plan.withheld.as_ref().unwrap();
    assert_eq!(withheld.action, crate::repair::Planned::Replace);
    assert!(
        withheld.why.contains("2 of 4 nodes of partition p fail it"),
        "{}",
        withheld.why
    );
    // An operator lifts the breaker on this node (`slurm-node-agent repair
    // --lift-breaker`): the replacement is what it would do, while the lift lasts.
    let op = |until: Option<i64>| crate::repair::record::Operator {
        breaker_lifted_until: until,
        ..Default::default()
    };
    op(Some(crate::time::now() + 3600))
        .save(&ctx.s.agent.state_dir)
        .unwrap();
    health_pass(&ctx).await;
    let record = crate::repair::record::Record::load(&record_path);
    let plan = &record.current.as_ref().unwrap().plan;
    assert_eq!(plan.withheld, None, "{plan:?}");
    op(None).save(&ctx.s.agent.state_dir).unwrap();
    health_pass(&ctx).await;
    let record = crate::repair::record::Record::load(&record_path);
    assert!(record.current.as_ref().unwrap().plan.withheld.is_some());
    // compute-2 is healthy again: the share falls back, the replacement is what it would do.
    slurmctld.set_record("NodeName=compute-2 State=IDLE Partitions=p");
    health_pass(&ctx).await;
    let record = crate::repair::record::Record::load(&record_path);
    let plan = &record.current.as_ref().unwrap().plan;
    assert_eq!(
        (plan.action, plan.withheld.as_ref()),
        (crate::repair::Planned::Replace, None)
    );
    // Each change of plan counted: withheld, lifted, withheld again, let go.
    assert_eq!(record.planned["report/isolate/hardware_degraded"], 2);
    assert_eq!(record.planned["report/replace/hardware_degraded"], 2);
}

#[tokio::test]
async fn repair_turned_off_clears_the_plan_left_by_report_mode() {
    let (imds, slurmctld) = (FakeImds::default(), FakeSlurmctld::default());
    let (_dir, ctx) = report_ctx(&imds, &slurmctld, FAILING_CPUS);
    let record_path = crate::repair::record::record_path(&ctx.s.agent.state_dir);
    health_pass(&ctx).await;
    assert!(crate::repair::record::Record::load(&record_path)
        .current
        .is_some());
    let mut s = ctx.s.clone();
    s.repair.mode = crate::repair::RepairMode::Off;
    let ctx = with_settings(ctx, s);
    health_pass(&ctx).await;
    let record = crate::repair::record::Record::load(&record_path);
    assert_eq!(record.current, None);
    assert_eq!(record.planned["report/replace/hardware_degraded"], 1);
    let prom = std::fs::read_to_string(ctx.s.agent.state_dir.join("repair.prom")).unwrap();
    assert!(!prom.contains("slurm_node_agent_repair_pending{"), "{prom}");
}

/// Stands in for the `scontrol` of the rollout's budget (`slurm.bin_dir`): `show nodes -o`
/// prints `nodes`, `show reservation -o` prints `listed`, `create reservation
/// ReservationName=R ... Nodes=N ... Comment=C` adds R to `listed` (refusing a name there
/// with slurmctld's words), `update ReservationName=R Duration+=M` is noted, `delete
/// reservation R` removes it.
const FAKE_BUDGET: &str = r#"#!/bin/sh
d=$(dirname "$0")
case "$1 $2" in
"show nodes") cat "$d/nodes" ;;
"show reservation") cat "$d/listed" 2>/dev/null; exit 0 ;;
"create reservation")
  name=${3#ReservationName=}
  if grep -q "ReservationName=$name " "$d/listed" 2>/dev/null; then echo "Error creating the reservation: Duplicate reservation name" >&2; exit 1; fi
  echo "ReservationName=$name Nodes=${6#Nodes=} EndTime=2026-12-07T03:00:00 Comment=${9#Comment=}" >> "$d/listed" ;;
"delete reservation") grep -v "ReservationName=$3 " "$d/listed" > "$d/listed.new"; mv "$d/listed.new" "$d/listed" ;;
"update ReservationName="*) echo "$2 $3" >> "$d/renewed" ;;
*) exit 1 ;;
esac
"#;

/// [`ctx`] with `repair.mode = "on"`, a check `flagged` that fails while `flag` is missing
/// with its action set to `action`, the health actions on, and [`FAKE_BUDGET`] for the
/// budget of partition `p` (this node and three others).
fn repair_on_ctx(
    imds: &FakeImds,
    slurmctld: &FakeSlurmctld,
    action: crate::repair::RepairAction,
) -> (tempfile::TempDir, Arc<Ctx>, std::path::PathBuf) {
    let (dir, ctx) = ctx(imds, slurmctld);
    let mut s = ctx.s.clone();
    let checks_dir = dir.path().join("checks.d");
    let flag = dir.path().join("healthy");
    std::fs::create_dir_all(&checks_dir).unwrap();
    std::fs::write(
        checks_dir.join("10-test.toml"),
        format!(
            "[[check]]\nname = \"flagged\"\nkind = \"command\"\nargv = [\"/usr/bin/test\", \"-e\", \"{}\"]\n",
            flag.display()
        ),
    )
    .unwrap();
    s.health.checks_dir = checks_dir;
    s.health.nhc_conf = Vec::new();
    s.repair.mode = crate::repair::RepairMode::On;
    s.repair.checks = vec![crate::repair::CheckAction {
        check: "flagged".into(),
        action,
    }];
    let bin = &s.slurm.bin_dir;
    std::fs::create_dir_all(bin).unwrap();
    crate::fsutil::write_test_program(&bin.join("scontrol"), FAKE_BUDGET);
    let nodes: String = [NODE, "compute-2", "compute-3", "compute-4"]
        .iter()
        .map(|n| format!("NodeName={n} State=IDLE Partitions=p\n"))
        .collect();
    std::fs::write(bin.join("nodes"), nodes).unwrap();
    slurmctld.set_record(&format!(
        "NodeName={NODE} State=IDLE Partitions=p SlurmdStartTime=2026-12-06T00:00:00 InstanceId={ME}"
    ));
    let ctx = with_settings(ctx, s);
    ctx.health_looked
        .store(true, std::sync::atomic::Ordering::Relaxed);
    settled(&ctx);
    (dir, ctx, flag)
}

/// This node's reason in slurmctld now.
fn node_reason(slurmctld: &FakeSlurmctld) -> String {
    slurmctld
        .record(NODE)
        .unwrap()
        .reason()
        .unwrap()
        .to_string()
}

/// The plan in effect in `repair.json`.
fn current_plan(ctx: &Ctx) -> crate::repair::Plan {
    let path = crate::repair::record::record_path(&ctx.s.agent.state_dir);
    crate::repair::record::Record::load(&path)
        .current
        .unwrap()
        .plan
}

/// `repair.json` as if the check `flagged` had been failing for an hour: past
/// `repair.settle`, a repair may start at once.
fn settled(ctx: &Ctx) {
    use crate::repair::record::{record_path, Record};
    let path = record_path(&ctx.s.agent.state_dir);
    let mut r = Record::load(&path);
    r.failing = Some(("flagged".into(), crate::time::now() - 3600));
    r.save(&path).unwrap();
}

fn listed(ctx: &Ctx) -> String {
    std::fs::read_to_string(ctx.s.slurm.bin_dir.join("listed")).unwrap_or_default()
}

/// `on`: the fault's drain becomes the repair's once the node holds a slot of the budget
/// (its comment says `repair`), with the plan in the reason; the checks passing before the
/// action lift it and give the slot back.
#[tokio::test]
async fn repair_on_takes_a_slot_drains_for_the_reboot_and_lifts_it_when_healthy_again() {
    let (imds, slurmctld) = (FakeImds::default(), FakeSlurmctld::default());
    let (_dir, ctx, flag) = repair_on_ctx(&imds, &slurmctld, crate::repair::RepairAction::Reboot);
    health_pass(&ctx).await;
    let record = slurmctld.record(NODE).unwrap();
    let reason = record.reason().unwrap();
    assert!(
        reason.starts_with(&format!("slurm-node-agent/repair@{ME}: flagged: "))
            && reason.ends_with(" [reboot after jobs]"),
        "{reason}"
    );
    let st = ctx.engine.load().unwrap();
    assert_eq!(st.cause.as_ref().map(Cause::kind), Some("repair"));
    assert_eq!(st.phase, Phase::Draining);
    assert!(
        listed(&ctx).contains(&format!(
            "ReservationName=slurm-node-agent-upgrade-p-slot-1 Nodes={NODE} EndTime=2026-12-07T03:00:00 Comment=slurm-node-agent/repair@{ME}"
        )),
        "{}",
        listed(&ctx)
    );
    let path = crate::repair::record::record_path(&ctx.s.agent.state_dir);
    let r = crate::repair::record::Record::load(&path);
    assert_eq!(r.slot.as_deref(), Some("slurm-node-agent-upgrade-p-slot-1"));
    assert_eq!(r.reboots.len(), 1);
    assert_eq!(r.reboots[0].check, "flagged");
    assert_eq!(r.planned["on/reboot/other"], 1);

    // The same fault at the next pass: nothing new (no second slot, the same reason).
    health_pass(&ctx).await;
    assert_eq!(listed(&ctx).lines().count(), 1);
    assert_eq!(slurmctld.record(NODE).unwrap().reason().unwrap(), reason);

    // Healthy before the action: the repair's drain lifted, the slot released.
    std::fs::write(&flag, "").unwrap();
    health_pass(&ctx).await;
    assert!(slurmctld.record(NODE).unwrap().is_available());
    assert_eq!(ctx.engine.load().unwrap().phase, Phase::Active);
    assert_eq!(listed(&ctx), "");
    let r = crate::repair::record::Record::load(&path);
    assert_eq!((r.slot, r.current), (None, None));
}

/// `on`, the node held by a failed start-up gate (its failure a failing check of this
/// boot): the repair takes the gate's drain over, as it does the health checks'.
#[tokio::test]
async fn repair_on_takes_over_a_failed_start_up_gates_drain() {
    let (imds, slurmctld) = (FakeImds::default(), FakeSlurmctld::default());
    let (_dir, ctx, _flag) = repair_on_ctx(&imds, &slurmctld, crate::repair::RepairAction::Reboot);
    let gate = Cause::Gate {
        detail: "start-up gate failed: dcgm: memory failed on GPU 3".into(),
    };
    ctx.engine.gateway.drain(gate, None).await.unwrap();
    health_pass(&ctx).await;
    let reason = node_reason(&slurmctld);
    assert!(
        reason.starts_with(&format!("slurm-node-agent/repair@{ME}: flagged: "))
            && reason.ends_with(" [reboot after jobs]"),
        "{reason}"
    );
    assert_eq!(
        ctx.engine.load().unwrap().cause.as_ref().map(Cause::kind),
        Some("repair")
    );
}

/// `on` at the budget (the one slot held by another node): the node stays drained by the
/// health checks, the plan withheld saying why; a slot freed, the repair goes on.
#[tokio::test]
async fn repair_on_waits_at_the_budget_and_goes_on_once_a_slot_frees() {
    let (imds, slurmctld) = (FakeImds::default(), FakeSlurmctld::default());
    let (_dir, ctx, _flag) = repair_on_ctx(&imds, &slurmctld, crate::repair::RepairAction::Replace);
    let held = "ReservationName=slurm-node-agent-upgrade-p-slot-1 Nodes=compute-2 EndTime=2026-12-07T03:00:00 Comment=slurm-node-agent/upgrade@i-0fedcba9876543210\n";
    std::fs::write(ctx.s.slurm.bin_dir.join("listed"), held).unwrap();
    health_pass(&ctx).await;
    let reason = node_reason(&slurmctld);
    assert!(
        reason.starts_with(&format!("slurm-node-agent/health@{ME}: ")),
        "{reason}"
    );
    let plan = current_plan(&ctx);
    assert_eq!(plan.action, crate::repair::Planned::Isolate);
    let w = plan.withheld.unwrap();
    assert_eq!(w.action, crate::repair::Planned::Replace);
    assert!(
        w.why
            .contains("partition p is held (1 of 1: upgrade.max_unavailable)"),
        "{}",
        w.why
    );
    // The upgrade's node is back: its slot released; this node takes it.
    std::fs::write(ctx.s.slurm.bin_dir.join("listed"), "").unwrap();
    health_pass(&ctx).await;
    let reason = node_reason(&slurmctld);
    assert!(reason.ends_with(" [replace after jobs]"), "{reason}");
    assert!(listed(&ctx).contains(&format!("Nodes={NODE}")));
}

/// `on` never goes over an administrator's drain: the plan is withheld, Slurm's record
/// keeps the admin's reason, and no slot is taken.
#[tokio::test]
async fn repair_on_never_goes_over_an_administrators_drain() {
    let (imds, slurmctld) = (FakeImds::default(), FakeSlurmctld::default());
    let (_dir, ctx, _flag) = repair_on_ctx(&imds, &slurmctld, crate::repair::RepairAction::Replace);
    slurmctld.set_record(&format!(
        "NodeName={NODE} State=IDLE+DRAIN Partitions=p Reason=bad DIMM, ticket 42 [admin@2026-12-06T00:00:00] InstanceId={ME}"
    ));
    health_pass(&ctx).await;
    health_pass(&ctx).await;
    assert_eq!(
        slurmctld.record(NODE).unwrap().reason(),
        Some("bad DIMM, ticket 42")
    );
    assert_eq!(listed(&ctx), "");
    let plan = current_plan(&ctx);
    assert_eq!(plan.action, crate::repair::Planned::Isolate);
    assert!(plan.withheld.is_some(), "{plan:?}");
}

/// A spot notice during a repair's drain takes the node (the instance goes anyway): the
/// repair's slot goes back at the next pass, the plan withheld saying why.
#[tokio::test]
async fn a_spot_notice_outranks_a_repair_and_its_slot_goes_back() {
    let (imds, slurmctld) = (FakeImds::default(), FakeSlurmctld::default());
    let (_dir, ctx, _flag) = repair_on_ctx(&imds, &slurmctld, crate::repair::RepairAction::Replace);
    health_pass(&ctx).await;
    assert!(listed(&ctx).contains(&format!("Nodes={NODE}")));
    imds.set(
        events::notice::SPOT_PATH,
        r#"{"action": "terminate", "time": "2026-12-06T21:22:00Z"}"#,
    );
    pass(&ctx, Work::Spot).await;
    let st = ctx.engine.load().unwrap();
    assert_eq!(st.cause.as_ref().map(Cause::kind), Some("spot"));
    health_pass(&ctx).await;
    assert_eq!(listed(&ctx), "");
    let reason = node_reason(&slurmctld);
    assert!(
        reason.starts_with(&format!("slurm-node-agent/spot@{ME}: ")),
        "{reason}"
    );
    let plan = current_plan(&ctx);
    assert!(
        plan.withheld
            .as_ref()
            .unwrap()
            .why
            .contains("drained for spot"),
        "{plan:?}"
    );
}

/// The flap guard: two nodes of partition `p` powered off for a replacement for the same
/// check within `repair.flap_window` (their records keep the repair's reason with its
/// time), and `repair.flap_max_replacements = 2`: this node is not replaced, it stays
/// isolated by the health checks' drain and the plan says why; no slot is taken.
#[tokio::test]
async fn the_flap_guard_withholds_a_replacement_after_replacements_for_the_same_check() {
    let (imds, slurmctld) = (FakeImds::default(), FakeSlurmctld::default());
    let (_dir, ctx, _flag) = repair_on_ctx(&imds, &slurmctld, crate::repair::RepairAction::Replace);
    let mut s = ctx.s.clone();
    s.repair.flap_max_replacements = 2;
    let ctx = with_settings(ctx, s);
    let now = crate::time::now();
    for (n, id, ago) in [
        ("compute-2", "i-0000000000000000a", 600),
        ("compute-3", "i-0000000000000000b", 3600),
    ] {
        let reason = crate::repair::reason(
            id,
            "flagged: 1 (expected 0)",
            crate::repair::Stage::PoweredOff(now - ago),
        );
        slurmctld.set_record(&format!(
            "NodeName={n} State=DOWN+DRAIN+NOT_RESPONDING Partitions=p Reason={reason} [root@2026-12-06T00:00:00]"
        ));
    }
    health_pass(&ctx).await;
    let reason = node_reason(&slurmctld);
    assert!(
        reason.starts_with(&format!("slurm-node-agent/health@{ME}: ")),
        "{reason}"
    );
    assert_eq!(listed(&ctx), "");
    let plan = current_plan(&ctx);
    let w = plan.withheld.as_ref().unwrap();
    assert!(
        w.why
            .contains("the flap guard: 2 nodes of partition p were replaced for flagged"),
        "{plan:?}"
    );
    // The gone nodes are no failing nodes for the breaker (2 of 4 would trip it).
    assert!(!w.why.contains("breaker"), "{plan:?}");
}

/// An operator's `slurm-node-agent repair --clear-history` (another process writing
/// `repair.json`) reaches the running daemon at its next pass: the flap guard that held
/// counts no replacement from before, and the repair goes on.
#[tokio::test]
async fn an_operators_clear_history_reaches_the_running_daemon() {
    let (imds, slurmctld) = (FakeImds::default(), FakeSlurmctld::default());
    let (_dir, ctx, _flag) = repair_on_ctx(&imds, &slurmctld, crate::repair::RepairAction::Replace);
    let mut s = ctx.s.clone();
    s.repair.flap_max_replacements = 1;
    let ctx = with_settings(ctx, s);
    let off = crate::repair::reason(
        "i-0000000000000000a",
        "flagged: 1 (expected 0)",
        crate::repair::Stage::PoweredOff(crate::time::now() - 600),
    );
    slurmctld.set_record(&format!(
        "NodeName=compute-2 State=DOWN+DRAIN+NOT_RESPONDING Partitions=p Reason={off} [root@2026-12-06T00:00:00]"
    ));
    health_pass(&ctx).await;
    let path = crate::repair::record::record_path(&ctx.s.agent.state_dir);
    let plan = current_plan(&ctx);
    assert!(plan.withheld.unwrap().why.contains("the flap guard"));
    // The operator's command, as `cli::repair` writes it (its own file).
    crate::repair::record::Operator {
        history_cleared_at: Some(crate::time::now()),
        ..Default::default()
    }
    .save(&ctx.s.agent.state_dir)
    .unwrap();
    health_pass(&ctx).await;
    let r = crate::repair::record::Record::load(&path);
    assert_eq!(r.current.as_ref().unwrap().plan.withheld, None, "{r:?}");
    assert!(listed(&ctx).contains(&format!("Nodes={NODE}")));
    assert!(slurmctld
        .record(NODE)
        .unwrap()
        .reason()
        .unwrap()
        .ends_with(" [replace after jobs]"));
}

/// An administrator drains a node over its repair's drain (their reason replaces the
/// repair's): the repair gives way at the next pass: the drain goes back to the health
/// checks with the admin's reason kept in Slurm, the slot goes back, and nothing is run.
#[tokio::test]
async fn an_administrators_reason_over_a_repair_stops_it_and_gives_the_slot_back() {
    let (imds, slurmctld) = (FakeImds::default(), FakeSlurmctld::default());
    let (_dir, ctx, _flag) = repair_on_ctx(&imds, &slurmctld, crate::repair::RepairAction::Replace);
    health_pass(&ctx).await;
    assert_eq!(
        ctx.engine.load().unwrap().cause.as_ref().map(Cause::kind),
        Some("repair")
    );
    slurmctld.set_record(&format!(
        "NodeName={NODE} State=IDLE+DRAIN Partitions=p Reason=RMA 1234, keep [admin@2026-12-06T00:00:00] InstanceId={ME}"
    ));
    health_pass(&ctx).await;
    let st = ctx.engine.load().unwrap();
    assert_eq!(st.cause.as_ref().map(Cause::kind), Some("health"));
    assert_eq!(st.foreign_reason.as_deref(), Some("RMA 1234, keep"));
    assert_eq!(
        slurmctld.record(NODE).unwrap().reason(),
        Some("RMA 1234, keep")
    );
    assert_eq!(listed(&ctx), "");
    // The engine runs nothing for it.
    assert_eq!(ctx.engine.progress().await.unwrap(), Phase::Drained);
    assert_eq!(ctx.engine.progress().await.unwrap(), Phase::Drained);
}

/// A node of Slurm's power saving (`CLOUD`) is replaced by Slurm: once drained with no
/// job, the repair asks `POWER_DOWN_ASAP` with the powered-off reason (Slurm's
/// `SuspendProgram` ends the instance, a later job powers one up); nothing is powered off
/// from the inside.
#[tokio::test]
async fn a_cloud_node_is_replaced_through_power_down_asap() {
    let (imds, slurmctld) = (FakeImds::default(), FakeSlurmctld::default());
    let (_dir, ctx, _flag) = repair_on_ctx(&imds, &slurmctld, crate::repair::RepairAction::Replace);
    slurmctld.set_record(&format!(
        "NodeName={NODE} State=IDLE+CLOUD Partitions=p SlurmdStartTime=2026-12-06T00:00:00 InstanceId={ME}"
    ));
    health_pass(&ctx).await;
    // Drained with no job and acted on in the same pass.
    assert_eq!(ctx.engine.progress().await.unwrap(), Phase::Done);
    let call = slurmctld
        .calls()
        .into_iter()
        .find(|c| c.contains("State=POWER_DOWN_ASAP"))
        .unwrap_or_else(|| panic!("{:?}", slurmctld.calls()));
    assert!(
        call.starts_with(&format!(
            "update NodeName={NODE} State=POWER_DOWN_ASAP Reason=slurm-node-agent/repair@{ME}: flagged: "
        )) && call.contains(" [powered off for replacement at "),
        "{call}"
    );
    let record = slurmctld.record(NODE).unwrap();
    assert!(record.has_flag("POWER_DOWN"), "{record:?}");
}

/// A same-name replacement finds the repair slot its predecessor took under this NodeName:
/// it goes back at the daemon's first repair pass (faulty too, this instance takes one of
/// its own only through the budget, as any node).
#[tokio::test]
async fn a_predecessors_repair_slot_under_this_name_goes_back() {
    let (imds, slurmctld) = (FakeImds::default(), FakeSlurmctld::default());
    let (_dir, ctx, _flag) = repair_on_ctx(&imds, &slurmctld, crate::repair::RepairAction::Replace);
    std::fs::write(
        ctx.s.slurm.bin_dir.join("listed"),
        format!("ReservationName=slurm-node-agent-upgrade-p-slot-1 Nodes={NODE} EndTime=2026-12-07T03:00:00 Comment=slurm-node-agent/repair@i-0000000000000000a\n"),
    )
    .unwrap();
    health_pass(&ctx).await;
    assert_eq!(
        listed(&ctx),
        format!("ReservationName=slurm-node-agent-upgrade-p-slot-1 Nodes={NODE} EndTime=2026-12-07T03:00:00 Comment=slurm-node-agent/repair@{ME}\n")
    );
}

/// `on` waits for `repair.settle` before a reboot or replacement: a fault just found is
/// withheld, saying so, and no slot is taken; once it has stood that long, the repair
/// starts.
#[tokio::test]
async fn a_fault_just_found_settles_before_its_repair() {
    let (imds, slurmctld) = (FakeImds::default(), FakeSlurmctld::default());
    let (_dir, ctx, _flag) = repair_on_ctx(&imds, &slurmctld, crate::repair::RepairAction::Replace);
    let path = crate::repair::record::record_path(&ctx.s.agent.state_dir);
    std::fs::remove_file(&path).unwrap();
    health_pass(&ctx).await;
    let plan = current_plan(&ctx);
    let w = plan.withheld.unwrap();
    assert!(
        w.why
            .starts_with("settling: the fault must stand for repair.settle (2m)"),
        "{}",
        w.why
    );
    assert_eq!(listed(&ctx), "");
    let reason = node_reason(&slurmctld);
    assert!(
        reason.starts_with(&format!("slurm-node-agent/health@{ME}: ")),
        "{reason}"
    );
    // Two minutes later (the record's plan made then): the repair starts.
    settled(&ctx);
    health_pass(&ctx).await;
    assert!(listed(&ctx).contains(&format!("Nodes={NODE}")));
}

/// `repair.json` corrupted while a repair drains (its slot named there lost): the checks
/// passing lift the repair's drain and the slot still goes back (released by its comment,
/// not by the record); the corrupt file is set aside.
#[tokio::test]
async fn a_corrupt_repair_record_during_a_repair_still_gives_the_slot_back() {
    let (imds, slurmctld) = (FakeImds::default(), FakeSlurmctld::default());
    let (_dir, ctx, flag) = repair_on_ctx(&imds, &slurmctld, crate::repair::RepairAction::Replace);
    health_pass(&ctx).await;
    assert!(listed(&ctx).contains(&format!("Nodes={NODE}")));
    let path = crate::repair::record::record_path(&ctx.s.agent.state_dir);
    std::fs::write(&path, "{ not json").unwrap();
    std::fs::write(&flag, "").unwrap();
    health_pass(&ctx).await;
    assert!(slurmctld.record(NODE).unwrap().is_available());
    assert_eq!(ctx.engine.load().unwrap().phase, Phase::Active);
    assert_eq!(listed(&ctx), "");
    let aside = std::fs::read_dir(&ctx.s.agent.state_dir)
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("repair.json.corrupt")
        });
    assert!(aside, "the corrupt record was not set aside");
}

/// Auto Scaling for the hooks' passes: moto (groups, instances, `DescribeLifecycleHooks`)
/// behind the project's emulator of the two calls moto lacks (`RecordLifecycleActionHeartbeat`,
/// `CompleteLifecycleAction`), one group with this instance and a termination hook.
struct Asg {
    _moto: slurm_e2e::moto::Moto,
    emu: imds_emulator::autoscaling::AutoScalingEmulator,
    client: aws_sdk_autoscaling::Client,
    instance: String,
}

const GROUP: &str = "compute-asg";
const HOOK: &str = "slurm-drain";

impl Asg {
    /// moto seeded with a group of one instance and the hook `HOOK` (`timeout_s`), the
    /// emulator in front; the instance is put in `Terminating:Wait` with `emulated_timeout`.
    async fn start(timeout_s: u32, emulated_timeout: Duration) -> Asg {
        let moto = slurm_e2e::moto::Moto::start().unwrap();
        let emu = imds_emulator::autoscaling::AutoScalingEmulator::start(Some(
            std::net::SocketAddr::from(([127, 0, 0, 1], moto.port())),
        ))
        .unwrap();
        let client = |endpoint: String| async move {
            let creds = aws_sdk_autoscaling::config::Credentials::new(
                "testing", "testing", None, None, "test",
            );
            let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
                .region(aws_config::Region::new("us-east-1"))
                .credentials_provider(creds)
                .endpoint_url(endpoint)
                .load()
                .await;
            aws_sdk_autoscaling::Client::new(&sdk)
        };
        let image = moto.register_image("asg").unwrap();
        let instance = moto
            .autoscaling_group_with_hook(GROUP, HOOK, timeout_s, &image)
            .unwrap();
        emu.begin(imds_emulator::autoscaling::LifecycleAction {
            instance_id: instance.clone(),
            group: GROUP.into(),
            hook: HOOK.into(),
            heartbeat_timeout: emulated_timeout,
            default_result: "ABANDON".into(),
        });
        let client = client(emu.endpoint()).await;
        Asg {
            _moto: moto,
            emu,
            client,
            instance,
        }
    }

    fn outcome(&self) -> imds_emulator::autoscaling::ActionOutcome {
        self.emu.outcome(&self.instance, HOOK).unwrap()
    }
}

/// [`ctx`] as the instance `asg` holds, with `interval_s` between heartbeats and
/// `max_wait_s` at most, its hooks reaching Auto Scaling through `asg`.
fn hook_ctx(
    imds: &FakeImds,
    slurmctld: &FakeSlurmctld,
    asg: &Asg,
    interval_s: u64,
    max_wait_s: u64,
) -> (tempfile::TempDir, Arc<Ctx>) {
    let (dir, ctx) = ctx(imds, slurmctld);
    let mut s = ctx.s.clone();
    s.events.lifecycle_heartbeat_interval =
        crate::section::HumanDuration(Duration::from_secs(interval_s));
    s.events.lifecycle_max_wait = crate::section::HumanDuration(Duration::from_secs(max_wait_s));
    let mut hooks = Hooks::new(&s);
    hooks.client = Some(asg.client.clone());
    let mut inner = Arc::try_unwrap(ctx).ok().unwrap();
    inner.id.instance_id = asg.instance.clone();
    inner.engine.spot_jobs = s.events.spot_jobs();
    inner.hooks = tokio::sync::Mutex::new(hooks);
    inner.s = s;
    (dir, Arc::new(inner))
}

/// The node with a job running (drained or not, as `drain` says).
fn running_job(slurmctld: &FakeSlurmctld, drain: bool) {
    let state = if drain { "MIXED+DRAIN" } else { "MIXED" };
    slurmctld.set_record(&format!(
        "NodeName={NODE} State={state} CPUAlloc=2 SlurmdStartTime=2026-12-06T00:00:00 Version=25.11.6 InstanceId={ME}"
    ));
}

/// A lifecycle drain that takes over an upgrade drain begun two hours ago counts
/// `events.lifecycle_max_wait` (1 h) from when `Terminated` was first seen, not from the
/// upgrade drain's start: no job action at once (the old clock would have signalled the
/// job and, after a restart, completed the lifecycle action mid-job).
#[tokio::test]
async fn a_lifecycle_drain_over_an_older_drain_counts_from_the_first_sighting() {
    let (imds, slurmctld) = (FakeImds::default(), FakeSlurmctld::default());
    let (dir, ctx) = ctx(&imds, &slurmctld);
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let signalled = dir.path().join("scancel.args");
    for (name, text) in [
        ("squeue", "#!/bin/sh\necho 4242\n".to_string()),
        (
            "scancel",
            format!("#!/bin/sh\necho \"$@\" >> {}\n", signalled.display()),
        ),
    ] {
        crate::fsutil::write_test_program(&bin.join(name), &text);
    }
    let mut inner = Arc::try_unwrap(ctx).ok().unwrap();
    inner.engine.spot_jobs = inner.s.events.spot_jobs();
    inner.engine.spot_jobs.action = crate::drain::SpotJobAction::Signal;
    let ctx = Arc::new(inner);
    running_job(&slurmctld, false);
    ctx.engine
        .request(Cause::Upgrade {
            current: "ami-0a887e401f7654935".into(),
            desired: "ami-0123456789abcdef0".into(),
        })
        .await
        .unwrap();
    // The upgrade drain began two hours ago.
    let path = ctx.s.agent.state_dir.join("drain.json");
    let mut st: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let two_hours_ago = crate::time::now() - 7200;
    st["started"] = serde_json::json!(two_hours_ago);
    st["since"] = serde_json::json!(two_hours_ago);
    std::fs::write(&path, st.to_string()).unwrap();
    imds.set(events::notice::LIFECYCLE_PATH, "Terminated");
    pass(&ctx, Work::Notices).await;
    let st = ctx.engine.load().unwrap();
    let Some(Cause::Lifecycle { seen, .. }) = st.cause else {
        panic!("{st:?}")
    };
    assert!(seen > two_hours_ago + 3600, "seen {seen}");
    running_job(&slurmctld, true);
    pass(&ctx, Work::Progress).await;
    assert!(!ctx.engine.load().unwrap().job_action_done);
    assert!(!signalled.exists());
}

/// Why each tracked hook is over (`None`: live).
async fn hook_ends(ctx: &Ctx) -> Vec<Option<String>> {
    ctx.hooks
        .lock()
        .await
        .tracker
        .hooks()
        .into_iter()
        .map(|(_, end)| end)
        .collect()
}

/// Waits past a whole second (the tracker counts Unix seconds).
async fn next_second() {
    tokio::time::sleep(Duration::from_millis(1100)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminating_node_heartbeats_while_its_job_runs_and_continues_once_drained() {
    let asg = Asg::start(60, Duration::from_secs(60)).await;
    let (imds, slurmctld) = (FakeImds::default(), FakeSlurmctld::default());
    let (_dir, ctx) = hook_ctx(&imds, &slurmctld, &asg, 1, 3600);
    running_job(&slurmctld, false);
    // Not terminating: no call to Auto Scaling.
    pass(&ctx, Work::Notices).await;
    pass(&ctx, Work::Progress).await;
    assert!(asg.emu.calls().is_empty());

    imds.set(events::notice::LIFECYCLE_PATH, "Terminated");
    pass(&ctx, Work::Notices).await;
    assert_eq!(ctx.engine.load().unwrap().phase, Phase::Draining);
    running_job(&slurmctld, true);
    for _ in 0..2 {
        next_second().await;
        pass(&ctx, Work::Progress).await;
    }
    assert_eq!(ctx.engine.load().unwrap().phase, Phase::Draining);
    assert!(
        asg.emu.heartbeats(&asg.instance, HOOK) >= 2,
        "{:?}",
        asg.emu.calls()
    );
    assert_eq!(
        asg.outcome(),
        imds_emulator::autoscaling::ActionOutcome::Waiting
    );

    // The job ends: the node is drained, the action completed with CONTINUE, once.
    slurmctld.set_record(&format!(
        "NodeName={NODE} State=IDLE+DRAIN CPUAlloc=0 SlurmdStartTime=2026-12-06T00:00:00 Version=25.11.6 InstanceId={ME}"
    ));
    pass(&ctx, Work::Progress).await;
    assert_eq!(ctx.engine.load().unwrap().phase, Phase::Drained);
    assert_eq!(
        asg.outcome(),
        imds_emulator::autoscaling::ActionOutcome::Completed("CONTINUE".into())
    );
    let ends = hook_ends(&ctx).await;
    assert!(
        ends[0]
            .as_deref()
            .is_some_and(|e| e.contains("completed with CONTINUE")),
        "{ends:?}"
    );
    let calls = asg.emu.calls().len();
    next_second().await;
    pass(&ctx, Work::Progress).await;
    assert_eq!(asg.emu.calls().len(), calls, "{:?}", asg.emu.calls());
    assert!(!hooks_pending(&ctx));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_maximum_wait_ends_heartbeats_and_completes_with_the_job_still_running() {
    let asg = Asg::start(60, Duration::from_secs(60)).await;
    let (imds, slurmctld) = (FakeImds::default(), FakeSlurmctld::default());
    // A maximum of 8 s: the passes before it (moto's look-ups included) take less even
    // on a loaded machine; the passes after it are waited for, not timed.
    let (dir, ctx) = hook_ctx(&imds, &slurmctld, &asg, 1, 8);
    // The spot job action, `signal` at the maximum (lead 0): through stand-ins of squeue
    // (one job on the node) and scancel (its arguments kept).
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let signalled = dir.path().join("scancel.args");
    for (name, text) in [
        ("squeue", "#!/bin/sh\necho 4242\n".to_string()),
        (
            "scancel",
            format!("#!/bin/sh\necho \"$@\" >> {}\n", signalled.display()),
        ),
    ] {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::write(bin.join(name), text).unwrap();
        std::fs::set_permissions(bin.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut engine = ctx.engine.clone();
    engine.spot_jobs.action = crate::drain::SpotJobAction::Signal;
    engine.spot_jobs.lead = Duration::ZERO;
    let mut inner = Arc::try_unwrap(ctx).ok().unwrap();
    inner.engine = engine;
    let ctx = Arc::new(inner);
    imds.set(events::notice::LIFECYCLE_PATH, "Terminated");
    pass(&ctx, Work::Notices).await;
    running_job(&slurmctld, true);
    pass(&ctx, Work::Progress).await;
    // Before the maximum: no job action.
    assert!(!ctx.engine.load().unwrap().job_action_done);
    assert!(!signalled.exists());
    for _ in 0..30 {
        next_second().await;
        pass(&ctx, Work::Progress).await;
        if asg.outcome() != imds_emulator::autoscaling::ActionOutcome::Waiting {
            break;
        }
    }
    assert_eq!(ctx.engine.load().unwrap().phase, Phase::Draining);
    // At the maximum the job was signalled, then the action completed.
    assert!(ctx.engine.load().unwrap().job_action_done);
    assert_eq!(
        std::fs::read_to_string(&signalled).unwrap().trim(),
        "--signal=TERM 4242"
    );
    assert_eq!(
        asg.outcome(),
        imds_emulator::autoscaling::ActionOutcome::Completed("CONTINUE".into())
    );
    let ends = hook_ends(&ctx).await;
    assert!(
        ends[0]
            .as_deref()
            .is_some_and(|e| e.contains("events.lifecycle_max_wait (8s) reached")),
        "{ends:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_hook_or_a_denied_completion_is_a_warning_not_a_failure() {
    // Auto Scaling already ended the action (its timeout passed): the heartbeat is
    // refused, and the heartbeats stop saying why.
    let asg = Asg::start(60, Duration::ZERO).await;
    let (imds, slurmctld) = (FakeImds::default(), FakeSlurmctld::default());
    let (_dir, ctx) = hook_ctx(&imds, &slurmctld, &asg, 1, 3600);
    imds.set(events::notice::LIFECYCLE_PATH, "Terminated");
    pass(&ctx, Work::Notices).await;
    running_job(&slurmctld, true);
    next_second().await;
    pass(&ctx, Work::Progress).await;
    let ends = hook_ends(&ctx).await;
    assert!(
        ends[0].as_deref().is_some_and(|e| e.contains(&format!(
            "No active Lifecycle Action found with instance ID {}",
            asg.instance
        ))),
        "{ends:?}"
    );

    // No permission to complete: a warning naming the IAM action.
    let asg = Asg::start(60, Duration::from_secs(60)).await;
    asg.emu.deny(&asg.instance, "CompleteLifecycleAction", true);
    let (imds, slurmctld) = (FakeImds::default(), FakeSlurmctld::default());
    let (_dir, ctx) = hook_ctx(&imds, &slurmctld, &asg, 1, 3600);
    imds.set(events::notice::LIFECYCLE_PATH, "Terminated");
    pass(&ctx, Work::Notices).await;
    pass(&ctx, Work::Progress).await;
    assert_eq!(ctx.engine.load().unwrap().phase, Phase::Drained);
    let ends = hook_ends(&ctx).await;
    assert!(
        ends[0]
            .as_deref()
            .is_some_and(|e| e.contains("autoscaling:CompleteLifecycleAction")),
        "{ends:?}"
    );
    assert_eq!(
        asg.outcome(),
        imds_emulator::autoscaling::ActionOutcome::Waiting
    );
}

/// [`ctx`] with the orphan watch on (`orphan.mode = "on"`), a grace of `grace` for a
/// deleted record, and a system bus that is not there (no systemd in a unit test: the
/// power-off is tried and fails, and is tried again at the next pass).
fn orphan_ctx(
    imds: &FakeImds,
    slurmctld: &FakeSlurmctld,
    grace: Duration,
) -> (tempfile::TempDir, Arc<Ctx>) {
    let (dir, ctx) = ctx(imds, slurmctld);
    let mut s = ctx.s.clone();
    s.orphan.mode = crate::orphan::OrphanMode::On;
    s.orphan.record_deleted_grace = crate::section::HumanDuration(grace);
    s.systemd.bus = format!("unix:path={}", dir.path().join("no-bus").display());
    let watch = orphan::OrphanWatch::new(&s.orphan, std::time::Instant::now(), &s.agent.state_dir)
        .configured();
    let ctx = Arc::new(Ctx {
        s,
        orphan: Some(std::sync::Mutex::new(watch)),
        ..Arc::try_unwrap(ctx).ok().unwrap()
    });
    (dir, ctx)
}

fn orphan_tried(ctx: &Ctx) -> Option<crate::orphan::Orphaned> {
    ctx.orphan.as_ref().unwrap().lock().unwrap().tried.clone()
}

#[tokio::test]
async fn a_record_deleted_past_its_grace_powers_the_node_off_and_one_back_within_it_does_not() {
    let (imds, slurmctld) = (FakeImds::default(), FakeSlurmctld::default());
    let (_dir, ctx) = orphan_ctx(&imds, &slurmctld, Duration::from_millis(300));
    orphan::orphan_pass(&ctx).await;
    assert_eq!(orphan_tried(&ctx), None);
    // Deleted, and created again within the grace: nothing.
    crate::slurm::Slurmctld::delete_node(&slurmctld, NODE)
        .await
        .unwrap();
    orphan::orphan_pass(&ctx).await;
    slurmctld.set_record(&format!("NodeName={NODE} State=IDLE InstanceId={ME}"));
    tokio::time::sleep(Duration::from_millis(400)).await;
    orphan::orphan_pass(&ctx).await;
    assert_eq!(orphan_tried(&ctx), None);
    // Deleted for good: past the grace the power-off is tried, saying why.
    crate::slurm::Slurmctld::delete_node(&slurmctld, NODE)
        .await
        .unwrap();
    orphan::orphan_pass(&ctx).await;
    assert_eq!(orphan_tried(&ctx), None);
    tokio::time::sleep(Duration::from_millis(400)).await;
    orphan::orphan_pass(&ctx).await;
    let why = orphan_tried(&ctx).expect("the power-off was not tried");
    assert!(
        matches!(why, crate::orphan::Orphaned::RecordDeleted { .. }),
        "{why}"
    );
    assert!(why.to_string().contains("record was deleted"), "{why}");
    // No reason could be written: no record; nothing else was asked of slurmctld.
    assert!(
        slurmctld
            .calls()
            .iter()
            .all(|c| c.starts_with("show node") || c.starts_with("delete")),
        "{:?}",
        slurmctld.calls()
    );
}

#[tokio::test]
async fn an_unreachable_controller_whose_slurmctld_timeout_is_unknown_powers_nothing_off() {
    let (imds, slurmctld) = (FakeImds::default(), FakeSlurmctld::default());
    let (_dir, ctx) = orphan_ctx(&imds, &slurmctld, Duration::from_millis(1));
    let mut s = ctx.s.clone();
    s.orphan.after = crate::section::HumanDuration(Duration::from_millis(1));
    let watch = orphan::OrphanWatch::new(&s.orphan, std::time::Instant::now(), &s.agent.state_dir)
        .configured();
    let ctx = Arc::new(Ctx {
        s,
        orphan: Some(std::sync::Mutex::new(watch)),
        ..Arc::try_unwrap(ctx).ok().unwrap()
    });
    // The node's scontrol is not there: SlurmctldTimeout cannot be read.
    orphan::orphan_pass(&ctx).await;
    slurmctld.set_unreachable(true);
    tokio::time::sleep(Duration::from_millis(20)).await;
    orphan::orphan_pass(&ctx).await;
    orphan::orphan_pass(&ctx).await;
    assert_eq!(orphan_tried(&ctx), None);
}

/// A daemon started while slurmctld does not answer (a node rebooted after its cluster was
/// deleted) arms its watch from the `SlurmctldTimeout` kept at an earlier answer, and
/// powers off once the window has passed since its own start; a kept timeout not shorter
/// than the window keeps it off.
#[tokio::test]
async fn a_daemon_started_during_an_outage_uses_the_kept_slurmctld_timeout() {
    let (imds, slurmctld) = (FakeImds::default(), FakeSlurmctld::default());
    // The window is a minute: a watch started now does not fire at its first pass, one
    // started a minute and a second ago does (no test waits for the clock).
    for (kept, fires) in [(0u64, true), (3600, false)] {
        for (ago, due) in [(0u64, false), (61, fires)] {
            let (_dir, ctx) = orphan_ctx(&imds, &slurmctld, Duration::from_secs(600));
            let mut s = ctx.s.clone();
            s.orphan.after = crate::section::HumanDuration(Duration::from_secs(60));
            std::fs::write(
                s.agent.state_dir.join(orphan::TIMEOUT_FILE),
                format!("{{\"slurmctld_timeout_secs\": {kept}}}"),
            )
            .unwrap();
            let start = std::time::Instant::now()
                .checked_sub(Duration::from_secs(ago))
                .unwrap();
            let watch = orphan::OrphanWatch::new(&s.orphan, start, &s.agent.state_dir).configured();
            let ctx = Arc::new(Ctx {
                s,
                orphan: Some(std::sync::Mutex::new(watch)),
                ..Arc::try_unwrap(ctx).ok().unwrap()
            });
            slurmctld.set_unreachable(true);
            orphan::orphan_pass(&ctx).await;
            let tried = orphan_tried(&ctx);
            assert_eq!(
                tried.is_some(),
                due,
                "kept {kept}, started {ago}s ago: {tried:?}"
            );
            if let Some(why) = tried {
                assert!(
                    why.to_string().contains("since the daemon started"),
                    "{why}"
                );
            }
            slurmctld.set_unreachable(false);
        }
    }
}
