//! Health checks against a real slurmctld and slurmd (Slurm 22.05 from Debian):
//! `slurm-node-agent-healthcheck` (the agent's `check` as a program of its own) as slurmd's
//! `HealthCheckProgram`, with a small
//! `HealthCheckInterval`. A failing check drains the node, recovery resumes it, and an
//! admin drain ("ADMIN SHUTDOWN") is never resumed nor overwritten. Also: `check` for a
//! node slurmctld does not know (slurmd not registered) returns at once.
//!
//! Slurm runs `HealthCheckProgram` without arguments and with only `SLURMD_NODENAME` in
//! its environment. A node with the default paths names the program itself; the test's
//! paths (settings, state, SLURM_CONF) are its own, so it writes a one-line wrapper that
//! execs the program with them.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use slurm_e2e::agent::{agent_binary, healthcheck_binary};
use slurm_e2e::{is_idle, run_with_timeout, Slurmctld, Slurmd, TempRoot};

const INTERVAL_S: u64 = 2;
/// The agent's health reasons: `slurm-node-agent/health@<instance-id>: <check>: ...`.
const PREFIX: &str = "slurm-node-agent/health@";

/// Writes the checks and the wrapper; returns the wrapper's path.
fn setup(root: &Path, ctld_conf: &Path) -> std::path::PathBuf {
    let flag = root.join("healthy-flag");
    fs::write(&flag, "ok").unwrap();
    fs::create_dir_all(root.join("state")).unwrap();
    // Paths given on the command line must exist (only the built-in defaults are optional).
    // Only the Slurm under test (its scontrol) is set.
    fs::write(
        root.join("none.toml"),
        format!(
            "[slurm]\nbin_dir = \"{}\"\n",
            slurm_e2e::install::bin_dir().display()
        ),
    )
    .unwrap();
    fs::create_dir_all(root.join("none.d")).unwrap();
    fs::create_dir_all(root.join("checks.d")).unwrap();
    fs::write(
        root.join("nhc.conf"),
        format!(
            "* || check_file_test -e {}\n* || check_fs_mount_rw -f /\n",
            flag.display()
        ),
    )
    .unwrap();
    let wrapper = root.join("health-check");
    let agent = healthcheck_binary().unwrap();
    let r = root.display();
    fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\n\
             SLURM_CONF={conf} exec {agent} --config={r}/none.toml --config-dir={r}/none.d \
             --checks-dir={r}/checks.d --set=agent.state_dir={r}/state --nhc-conf={r}/nhc.conf \
             >> {r}/check.log 2>&1\n",
            conf = ctld_conf.display(),
            agent = agent.display(),
        ),
    )
    .unwrap();
    fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).unwrap();
    wrapper
}

fn runs(root: &Path) -> usize {
    fs::read_to_string(root.join("check.log"))
        .unwrap_or_default()
        .matches("action: ")
        .count()
}

/// Waits until the health check has run `n` more times.
fn wait_runs(root: &Path, n: usize) {
    let start = runs(root);
    let deadline = Instant::now() + Duration::from_secs(INTERVAL_S * (n as u64) * 10 + 20);
    while runs(root) < start + n {
        assert!(
            Instant::now() < deadline,
            "the health check did not run {n} more times; log:\n{}",
            fs::read_to_string(root.join("check.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn reason(ctld: &Slurmctld, node: &str) -> String {
    let out = ctld.scontrol_ok(&["show", "node", "-o", node]).unwrap();
    out.split(" Reason=")
        .nth(1)
        .unwrap_or("")
        .trim()
        .to_string()
}

#[test]
fn health_check_program_drains_resumes_and_leaves_admin_drains_alone() {
    let root = TempRoot::new("health-e2e-").unwrap();
    // The wrapper needs the controller's config path, known once it runs; slurmd reads
    // HealthCheckProgram only when it starts, so the path is fixed now, filled after.
    let wrapper_path = root.path().join("health-check");
    let ctld = Slurmctld::builder("health")
        .line(format!("HealthCheckProgram={}", wrapper_path.display()))
        .line(format!("HealthCheckInterval={INTERVAL_S}"))
        .start()
        .unwrap();
    let wrapper = setup(root.path(), ctld.conf_path());
    assert_eq!(wrapper, wrapper_path);
    let _node = Slurmd::dynamic(&ctld, "hc1", "CPUs=1 RealMemory=100").unwrap();
    ctld.wait_node_idle("hc1", Duration::from_secs(60)).unwrap();
    wait_runs(root.path(), 1);
    assert!(is_idle(&ctld.node_state("hc1").unwrap().unwrap()));

    // A failing check drains the node with the agent's prefix and the check's name.
    fs::remove_file(root.path().join("healthy-flag")).unwrap();
    let t0 = Instant::now();
    let st = ctld
        .wait_node_state("hc1", |s| s.contains("DRAIN"), Duration::from_secs(60))
        .unwrap();
    eprintln!(
        "drained after {:?} (interval {INTERVAL_S} s): {st}",
        t0.elapsed()
    );
    let r = reason(&ctld, "hc1");
    assert!(
        r.starts_with(PREFIX) && r.contains(": check_file_test -e "),
        "{r}"
    );
    assert!(r.contains("healthy-flag"), "{r}");

    // Another check is now the one failing: the agent rewrites its own reason (issue 11).
    let conf = root.path().join("nhc.conf");
    let original = fs::read_to_string(&conf).unwrap();
    fs::write(
        &conf,
        format!("{original}* || check_file_test -f /no/such/second-flag\n"),
    )
    .unwrap();
    fs::write(root.path().join("healthy-flag"), "ok").unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !reason(&ctld, "hc1").contains("second-flag") {
        assert!(
            Instant::now() < deadline,
            "reason not rewritten: {}",
            reason(&ctld, "hc1")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let r = reason(&ctld, "hc1");
    assert!(
        r.starts_with(PREFIX) && r.contains(": check_file_test -f /no/such/second-flag: "),
        "{r}"
    );
    assert!(ctld.node_state("hc1").unwrap().unwrap().contains("DRAIN"));

    // Recovery resumes it.
    fs::write(&conf, original).unwrap();
    ctld.wait_node_idle("hc1", Duration::from_secs(60)).unwrap();

    // An admin drain stays, healthy or not, and keeps its reason.
    ctld.scontrol_ok(&[
        "update",
        "nodename=hc1",
        "state=drain",
        "reason=ADMIN SHUTDOWN",
    ])
    .unwrap();
    wait_runs(root.path(), 2);
    let st = ctld.node_state("hc1").unwrap().unwrap();
    assert!(st.contains("DRAIN"), "{st}");
    assert!(reason(&ctld, "hc1").starts_with("ADMIN SHUTDOWN"));
    fs::remove_file(root.path().join("healthy-flag")).unwrap();
    wait_runs(root.path(), 2);
    assert!(
        reason(&ctld, "hc1").starts_with("ADMIN SHUTDOWN"),
        "{}",
        reason(&ctld, "hc1")
    );
    let log = fs::read_to_string(root.path().join("check.log")).unwrap();
    assert!(
        log.contains("already drained for another reason (ADMIN SHUTDOWN): kept"),
        "{log}"
    );
}

#[test]
fn check_for_an_unregistered_node_returns_at_once() {
    let root = TempRoot::new("health-e2e-unreg-").unwrap();
    let ctld = Slurmctld::start("hcunreg").unwrap();
    setup(root.path(), ctld.conf_path());
    fs::remove_file(root.path().join("healthy-flag")).unwrap();
    let r = root.path().display();
    let mut c = Command::new(agent_binary().unwrap());
    c.env_clear()
        .env("SLURMD_NODENAME", "not-registered-yet")
        .env("SLURM_CONF", ctld.conf_path())
        .args([
            "check".to_string(),
            format!("--config={r}/none.toml"),
            format!("--config-dir={r}/none.d"),
            format!("--checks-dir={r}/checks.d"),
            format!("--set=agent.state_dir={r}/state"),
            format!("--nhc-conf={r}/nhc.conf"),
        ]);
    let out = run_with_timeout(c, Duration::from_secs(30)).unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("action: none: node not known to slurmctld (slurmd not registered yet)"),
        "{stdout}"
    );
}
