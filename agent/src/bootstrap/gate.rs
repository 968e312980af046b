//! Bootstrap's start-up gate step ([`crate::gate`]): at every boot, after the
//! `nodeBootstrapped` lifecycle scripts, the node is held with the gate's own drain
//! (before slurmd registers where slurmctld has its record already, right after the
//! registration otherwise), the gate's parts run, and the drain is lifted when they pass or
//! kept with the failure's words when one fails.
//!
//! A bootstrap run again in the same boot (the unit restarted, an operator) does not run
//! the gate again once it ended in that boot: it converges on its result.

use crate::gate::{GateEnv, StartGateSettings};
use crate::health::startgate::GateRecord;
use crate::node_state::{Cause, CauseKind, Gateway};

/// What the gate step decided before slurmd started.
pub(super) struct Pending {
    /// The drain is in place already (slurmctld had the record).
    drained: bool,
    /// The boot.
    boot_id: String,
}

/// Before slurmd starts: `None` when the gate has nothing to do in this boot (no parts, or
/// it ended in this boot already: its drain, if it failed, stays as it is). Otherwise the
/// record says every part is running, and the node is drained with the gate's reason
/// where slurmctld already knows it.
pub(super) async fn before_slurmd(
    s: &StartGateSettings,
    state_dir: &std::path::Path,
    instance_id: &str,
    boot_id: &str,
    gateway: &Gateway,
) -> Option<Pending> {
    // A gate turned off since, or one that passed in this boot before a crash: its drain
    // (this instance's) is over.
    let lift = |why: &'static str| async move {
        match gateway.lift(CauseKind::Gate, None).await {
            Ok(l) => tracing::info!(node = gateway.node(), lifted = ?l, "START GATE: {why}"),
            Err(e) => tracing::debug!(
                node = gateway.node(),
                "START GATE: {why}; nothing lifted: {e}"
            ),
        }
    };
    let earlier = GateRecord::load(state_dir);
    if !s.enabled() {
        if earlier.is_some() {
            lift("no [start_gate] parts any more: an earlier gate's drain lifted").await;
        }
        return None;
    }
    if let Some(r) = earlier.filter(|r| r.boot_id == boot_id && r.ended()) {
        tracing::info!(
            passed = r.passed(),
            "START GATE: already ran in this boot; not run again"
        );
        if r.passed() {
            lift("passed in this boot").await;
        }
        return None;
    }
    if let Err(e) = crate::gate::starting_record(s, boot_id, instance_id).save(state_dir) {
        tracing::warn!("start-up gate record not written: {e}");
    }
    let drained = match hold(s, gateway).await {
        Ok(()) => {
            tracing::info!(
                node = gateway.node(),
                "START GATE: node held before slurmd registers: {}",
                s.running_words()
            );
            true
        }
        Err(e) => {
            tracing::info!(
                node = gateway.node(),
                "START GATE: no record to hold yet ({e}); held right after the registration"
            );
            false
        }
    };
    Some(Pending {
        drained,
        boot_id: boot_id.to_string(),
    })
}

/// Requeues the jobs allocated to the node before the gate's drain held it: the job Slurm
/// powered a `CLOUD` node up for (allocated at the power-up, it starts when slurmd
/// registers, drained or not), or one scheduled on a dynamic node between its registration
/// and the drain. They go back to the queue: to another node, or to this one once the gate
/// passed. A job that may not be requeued (`--no-requeue`, `JobRequeue=0`) is named in a
/// warning and left running.
async fn requeue_allocated(ops: &crate::drain::SlurmOps, node: &str) {
    let jobs = match ops.jobs_allocated(node).await {
        Ok(j) => j,
        Err(e) => {
            tracing::warn!(
                node,
                "START GATE: the jobs allocated to the node could not be listed: {e}"
            );
            return;
        }
    };
    for job in jobs {
        match ops.requeue_job(&job).await {
            Ok(()) => tracing::info!(
                node,
                job = %job,
                "START GATE: job {job}, allocated to the node before the gate held it, requeued: it runs once the gate passes, here or elsewhere"
            ),
            Err(e) => tracing::warn!(
                node,
                job = %job,
                "START GATE: job {job}, allocated to the node before the gate held it, could not be requeued ({e}): it runs while the gate does"
            ),
        }
    }
}

/// Drains the node with the gate's reason while it runs.
async fn hold(s: &StartGateSettings, gateway: &Gateway) -> Result<(), crate::drain::DrainError> {
    let cause = Cause::Gate {
        detail: s.running_words(),
    };
    gateway.drain(cause, None).await.map(|_| ())
}

/// After the join: the drain (when it could not be made before), then the parts, then the
/// drain lifted (passed) or restated with the failure (failed). Returns the record.
pub(super) async fn after_join(
    s: &StartGateSettings,
    pending: Pending,
    state_dir: &std::path::Path,
    instance_id: &str,
    gateway: &Gateway,
    units: &dyn crate::systemd::Units,
    ops: &crate::drain::SlurmOps,
) -> GateRecord {
    let held = pending.drained
        || match hold(s, gateway).await {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(
                    node = gateway.node(),
                    "START GATE: the node could not be held: {e}"
                );
                false
            }
        };
    // Only under the gate's drain: a job requeued from a node that takes jobs would be
    // scheduled straight back onto it.
    if held {
        requeue_allocated(ops, gateway.node()).await;
    }
    let env = GateEnv {
        units,
        state_dir,
        boot_id: pending.boot_id,
        instance_id: instance_id.to_string(),
        sys_dir: crate::health::facts::Host::default().sys_dir,
    };
    tracing::info!(node = gateway.node(), budget = %crate::section::HumanDuration(s.total_budget()), "START GATE: running {}", s.parts().join(", "));
    let record = crate::gate::run(s, &env).await;
    if record.passed() {
        match gateway.lift(CauseKind::Gate, None).await {
            Ok(l) => {
                tracing::info!(node = gateway.node(), lifted = ?l, "START GATE: passed; the gate's drain lifted")
            }
            Err(e) => tracing::error!(
                node = gateway.node(),
                "START GATE: passed, but its drain could not be lifted: {e}"
            ),
        }
    } else {
        let words: Vec<String> = record
            .failures()
            .map(|p| format!("{}: {}", p.name, p.message))
            .collect();
        let detail = format!("start-up gate failed: {}", words.join("; "));
        match gateway.drain(Cause::Gate { detail: detail.clone() }, None).await {
            Ok(_) => tracing::error!(node = gateway.node(), "START GATE: {detail}; the node stays drained (the health checks report it, repair acts on it)"),
            Err(e) => tracing::error!(node = gateway.node(), "START GATE: {detail}; the drain could not be restated: {e}"),
        }
    }
    record
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    //! The step against an in-memory slurmctld, with site commands as the gate's parts: a
    //! first boot, a failure, bootstrap again in the same boot, the next boot, a corrupt
    //! record, a dynamic node, an administrator's drain, the gate turned off.

    use super::*;
    use crate::gate::GateCommand;
    use crate::section::HumanDuration;
    use crate::slurm::ctl::fake::FakeSlurmctld;
    use crate::systemd::fake::FakeUnits;

    const ME: &str = "i-0123456789abcdef0";

    struct Node {
        dir: tempfile::TempDir,
        slurmctld: FakeSlurmctld,
        gateway: Gateway,
    }

    impl Node {
        /// n1 with `record` in slurmctld (`None`: not known yet, a dynamic node).
        fn new(record: Option<&str>) -> Node {
            let dir = tempfile::tempdir().unwrap();
            let slurmctld = FakeSlurmctld::default();
            if let Some(r) = record {
                slurmctld.set_record(r);
            }
            let gateway = Gateway::new(
                "n1",
                crate::slurm::Scontrol::new(dir.path()),
                dir.path(),
                std::time::Duration::from_secs(1),
                dir.path().join("drain.prom"),
            )
            .with_instance(ME)
            .through(slurmctld.clone());
            crate::fsutil::write_test_program(&dir.path().join("ok"), "#!/bin/sh\nexit 0\n");
            // Slurm's job commands: squeue lists `jobs`; scontrol notes each requeue and
            // refuses job 42 as Slurm refuses a job that may not be requeued.
            let bin = dir.path().join("bin");
            std::fs::create_dir_all(&bin).unwrap();
            let d = dir.path().display();
            crate::fsutil::write_test_program(
                &bin.join("squeue"),
                &format!("#!/bin/sh\necho \"$*\" >> {d}/squeue-args\ncat {d}/jobs 2>/dev/null\n"),
            );
            crate::fsutil::write_test_program(
                &bin.join("scontrol"),
                &format!(
                    "#!/bin/sh\n[ \"$2\" = 42 ] && {{ echo 'Requested operation is presently disabled for job 42' >&2; exit 1; }}\necho \"$*\" >> {d}/requeued\n"
                ),
            );
            crate::fsutil::write_test_program(
                &dir.path().join("bad"),
                "#!/bin/sh\necho 'no loopback' >&2\nexit 1\n",
            );
            Node {
                dir,
                slurmctld,
                gateway,
            }
        }

        /// A gate of one command, `ok` or `bad`.
        fn settings(&self, program: &str) -> StartGateSettings {
            StartGateSettings {
                commands: vec![GateCommand {
                    name: "loopback".into(),
                    argv: vec![self.dir.path().join(program).display().to_string()],
                    budget: HumanDuration(std::time::Duration::from_secs(10)),
                }],
                ..StartGateSettings::default()
            }
        }

        async fn before(&self, s: &StartGateSettings, boot: &str) -> Option<Pending> {
            before_slurmd(s, self.dir.path(), ME, boot, &self.gateway).await
        }

        async fn after(&self, s: &StartGateSettings, p: Pending) -> GateRecord {
            after_join(
                s,
                p,
                self.dir.path(),
                ME,
                &self.gateway,
                &FakeUnits::default(),
                &crate::drain::SlurmOps::new(&self.dir.path().join("bin")),
            )
            .await
        }

        fn reason(&self) -> Option<String> {
            let n = self.slurmctld.record("n1").unwrap();
            n.is_drained()
                .then(|| n.reason().unwrap_or_default().to_string())
        }
    }

    const IDLE: &str = "NodeName=n1 State=IDLE Partitions=p";

    #[tokio::test]
    async fn held_before_slurmd_and_lifted_when_it_passes_then_not_run_again_in_the_boot() {
        let n = Node::new(Some(IDLE));
        let s = n.settings("ok");
        let p = n.before(&s, "boot-1").await.unwrap();
        let held = n.reason().unwrap();
        assert!(
            held.starts_with(&format!(
                "slurm-node-agent/gate@{ME}: start-up gate running: loopback (up to 10s)"
            )),
            "{held}"
        );
        assert!(n.after(&s, p).await.passed());
        assert_eq!(n.reason(), None);
        // Bootstrap again in the same boot: nothing runs, nothing is drained.
        assert!(n.before(&s, "boot-1").await.is_none());
        assert_eq!(n.reason(), None);
        // A crash between the pass and the lift: the same boot's run lifts the drain.
        n.slurmctld.set_record(&format!(
            "NodeName=n1 State=IDLE+DRAIN Partitions=p Reason=slurm-node-agent/gate@{ME}: start-up gate running: loopback"
        ));
        assert!(n.before(&s, "boot-1").await.is_none());
        assert_eq!(n.reason(), None);
        // The next boot runs it again.
        assert!(n.before(&s, "boot-2").await.is_some());
        assert!(n.reason().unwrap().contains("start-up gate running"));
    }

    /// A job Slurm allocated to the node before the gate's drain (at a `CLOUD` node's
    /// power-up, or between a dynamic node's registration and the drain) goes back to the
    /// queue; one that may not be requeued is left running, named in a warning.
    #[tokio::test]
    async fn jobs_allocated_before_the_hold_are_requeued_while_the_gate_runs() {
        let n = Node::new(Some(IDLE));
        std::fs::write(n.dir.path().join("jobs"), "41\n42\n").unwrap();
        let s = n.settings("ok");
        let p = n.before(&s, "boot-1").await.unwrap();
        assert!(n.after(&s, p).await.passed());
        let args = std::fs::read_to_string(n.dir.path().join("squeue-args")).unwrap();
        assert_eq!(args.trim(), "-h -w n1 -t CONFIGURING,RUNNING -o %i");
        let requeued = std::fs::read_to_string(n.dir.path().join("requeued")).unwrap();
        assert_eq!(requeued, "requeue 41\n");
    }

    #[tokio::test]
    async fn a_failure_stays_drained_through_the_boot_and_the_next_boot_lifts_it_when_it_passes() {
        let n = Node::new(Some(IDLE));
        let bad = n.settings("bad");
        let p = n.before(&bad, "boot-1").await.unwrap();
        assert!(!n.after(&bad, p).await.passed());
        let failed = n.reason().unwrap();
        assert!(
            failed.starts_with(&format!(
                "slurm-node-agent/gate@{ME}: start-up gate failed: loopback: "
            )) && failed.contains("exited 1: no loopback"),
            "{failed}"
        );
        // Bootstrap again in the same boot: the failure stands, not run again.
        assert!(n.before(&bad, "boot-1").await.is_none());
        assert_eq!(n.reason().unwrap(), failed);
        // The next boot (fixed): the gate runs, its drain restated, then lifted.
        let ok = n.settings("ok");
        let p = n.before(&ok, "boot-2").await.unwrap();
        assert!(n.reason().unwrap().contains("start-up gate running"));
        assert!(n.after(&ok, p).await.passed());
        assert_eq!(n.reason(), None);
    }

    #[tokio::test]
    async fn a_corrupt_record_runs_the_gate_again() {
        let n = Node::new(Some(IDLE));
        std::fs::write(
            crate::health::startgate::record_path(n.dir.path()),
            "{\"boot_id\":",
        )
        .unwrap();
        let s = n.settings("ok");
        let p = n.before(&s, "boot-1").await.unwrap();
        assert!(n.after(&s, p).await.passed());
        assert_eq!(GateRecord::load(n.dir.path()).unwrap().boot_id, "boot-1");
    }

    #[tokio::test]
    async fn a_dynamic_node_is_held_right_after_its_registration() {
        let n = Node::new(None);
        let s = n.settings("bad");
        let p = n.before(&s, "boot-1").await.unwrap();
        assert!(!p.drained);
        // slurmd registers (slurmd -Z creates the record).
        n.slurmctld.set_record(IDLE);
        assert!(!n.after(&s, p).await.passed());
        assert!(n
            .reason()
            .unwrap()
            .contains("start-up gate failed: loopback"));
    }

    #[tokio::test]
    async fn an_administrators_drain_is_kept_through_the_gate() {
        let n = Node::new(Some(
            "NodeName=n1 State=IDLE+DRAIN Partitions=p Reason=bad DIMM, ticket 42 [admin@2026-12-06T00:00:00]",
        ));
        let s = n.settings("ok");
        let p = n.before(&s, "boot-1").await.unwrap();
        assert!(n.reason().unwrap().starts_with("bad DIMM, ticket 42"));
        assert!(n.after(&s, p).await.passed());
        assert!(n.reason().unwrap().starts_with("bad DIMM, ticket 42"));
    }

    /// A replacement under the same NodeName (a new instance, its own empty state folder)
    /// finds its predecessor's failed gate on the record: its own gate takes the drain over
    /// and lifts it when it passes.
    #[tokio::test]
    async fn a_replacement_takes_over_its_predecessors_failed_gate() {
        let n = Node::new(Some(
            "NodeName=n1 State=IDLE+DRAIN Partitions=p Reason=slurm-node-agent/gate@i-0fedcba9876543210: start-up gate failed: dcgm: x [root@2026-12-06T00:00:00]",
        ));
        let s = n.settings("ok");
        let p = n.before(&s, "boot-1").await.unwrap();
        assert!(n.reason().unwrap().starts_with(&format!(
            "slurm-node-agent/gate@{ME}: start-up gate running"
        )));
        assert!(n.after(&s, p).await.passed());
        assert_eq!(n.reason(), None);
    }

    #[tokio::test]
    async fn a_gate_turned_off_lifts_an_earlier_gates_drain() {
        let n = Node::new(Some(IDLE));
        let bad = n.settings("bad");
        let p = n.before(&bad, "boot-1").await.unwrap();
        n.after(&bad, p).await;
        assert!(n.reason().is_some());
        assert!(n
            .before(&StartGateSettings::default(), "boot-2")
            .await
            .is_none());
        assert_eq!(n.reason(), None);
    }
}
