//! Fleet scenarios: the project's image booted as nodes with systemd as PID 1 on a private
//! network (see `slurm_e2e::fleet`). Each test asserts the end state in slurmctld and,
//! through `jobcomp/filetxt`, that every job completed with exit 0.
//!
//! One fleet at a time (the harness serialises them). `SLURM_E2E_FLEET_NODES` sets the
//! size of the boot test (default 4; 16 is the figure, slow on 2 cores).
//! The first run builds the image root (about a minute with a warm apt cache, longer
//! cold) and caches it under `SLURM_E2E_FLEET_CACHE`.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use slurm_e2e::fleet::{Fleet, FLEET_GATEWAY};

/// Generous: systemd boots of several containers on 2 shared cores.
const BOOT_TIMEOUT: Duration = Duration::from_secs(600);

fn fleet_size() -> usize {
    std::env::var("SLURM_E2E_FLEET_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n >= 1)
        .unwrap_or(4)
}

#[test]
fn nodes_booted_at_once_all_join_idle_and_run_a_job_across_all() {
    let n = fleet_size();
    let mut fleet = Fleet::builder().start().unwrap();
    let names: Vec<String> = (1..=n).map(|i| format!("node{i:03}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    fleet.launch_all(&refs).unwrap();
    fleet.wait_all_idle(&names, BOOT_TIMEOUT).unwrap();

    // Boot is what EC2 does: every node's systemd finished booting with nothing failed
    // (munge was skipped until the key existed, not failed), and bootstrap, munge, slurmd
    // and the daemon ran as units of PID 1.
    for name in &names {
        let st = fleet.wait_booted(name, BOOT_TIMEOUT).unwrap();
        let failed = fleet.failed_units(name).unwrap();
        assert!(failed.is_empty(), "{name}: {st}, failed units: {failed:?}");
        for unit in [
            "slurm-node-agent-bootstrap.service",
            "munge.service",
            "slurmd.service",
        ] {
            let out = fleet.exec(name, "systemctl", &["is-active", unit]).unwrap();
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                "active",
                "{name}: {unit}"
            );
        }
        // The node registered with its own address on the fleet network.
        let line = fleet
            .ctld
            .scontrol_ok(&["show", "node", "-o", name])
            .unwrap();
        let addr = slurm_e2e::slurm::field(&line, "NodeAddr").unwrap();
        assert!(
            addr.starts_with("10.77.") && addr != FLEET_GATEWAY.to_string(),
            "{line}"
        );
    }

    let nn = format!("-N{n}");
    let out = fleet
        .ctld
        .run_job("srun", &[&nn, "--ntasks-per-node=1", "hostname"])
        .unwrap();
    assert!(
        out.status.success(),
        "srun: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut hosts: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    hosts.sort();
    assert_eq!(
        hosts, names,
        "each node ran one task under its own host name"
    );
    fleet.check_no_job_killed(1).unwrap();
}
