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
        imds: Arc::new(imds.clone()),
        engine,
        id: InstanceIdentity {
            instance_id: ME.into(),
            ..InstanceIdentity::default()
        },
        node: NODE.into(),
        s,
        outage: std::sync::Mutex::new(Outage::default()),
        health_looked: std::sync::atomic::AtomicBool::new(false),
        repair_record: std::sync::Mutex::new(None),
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
    // compute-2 is healthy again: the share falls back, the replacement is what it would do.
    slurmctld.set_record("NodeName=compute-2 State=IDLE Partitions=p");
    health_pass(&ctx).await;
    let record = crate::repair::record::Record::load(&record_path);
    let plan = &record.current.as_ref().unwrap().plan;
    assert_eq!(
        (plan.action, plan.withheld.as_ref()),
        (crate::repair::Planned::Replace, None)
    );
    assert_eq!(record.planned["report/isolate/hardware_degraded"], 1);
    assert_eq!(record.planned["report/replace/hardware_degraded"], 1);
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
