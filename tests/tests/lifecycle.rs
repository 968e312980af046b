//! A node's life after its first boot, end to end (issue 9): the real `slurm-node-agent`
//! (`bootstrap` and `run`) on a whole node ([`NodeEnv`]: slurmctld, munge, slurmd and
//! munge under a confined systemd Manager, moto, the IMDS emulator). Each test ends by
//! asserting what slurmctld shows: the node's state and reason.
//!
//! - a replacement instance (new instance id, same NodeName, empty state folder) lifts
//!   the spot drain its predecessor made;
//! - the same instance starting again after a spot `stop` or `hibernate` notice returns to
//!   service;
//! - an admin's drain survives a bootstrap, which exits 0 (not at the join deadline) and
//!   says who drained the node.
//!
//! Build the agent first: `cargo build -p slurm-node-agent` (or set SLURM_NODE_AGENT_BIN).
#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;
use slurm_e2e::agent::{report, NodeEnv, DEFAULT_NODE_NAME};
use slurm_e2e::slurm::field;
use slurm_e2e::{is_idle, wait_until, Daemon};

const WAIT: Duration = Duration::from_secs(120);
/// The emulator's default instance id (AEMM's): the first incarnation.
const FIRST: &str = "i-1234567890abcdef0";
/// The replacement's instance id.
const SECOND: &str = "i-0fedcba9876543210";

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn node_line(env: &NodeEnv) -> String {
    env.ctld
        .scontrol_ok(&["show", "node", "-o", DEFAULT_NODE_NAME])
        .unwrap()
}

fn state(env: &NodeEnv) -> String {
    field(&node_line(env), "State")
        .unwrap_or_default()
        .to_string()
}

/// The node's reason without Slurm's ` [user@time]` suffix; empty when none.
fn reason(env: &NodeEnv) -> String {
    let line = node_line(env);
    let Some(i) = line.find(" Reason=") else {
        return String::new();
    };
    let r = &line[i + 8..];
    r.rfind(" [").map_or(r, |i| &r[..i]).trim().to_string()
}

/// `bootstrap --output json` that must succeed; its report.
fn bootstrap_ok(env: &NodeEnv, extra: &[&str]) -> Value {
    let out = env.bootstrap(extra).unwrap();
    assert!(out.status.success(), "bootstrap failed:\n{}", stderr(&out));
    report(&out).unwrap()
}

/// RFC 3339 time `secs` from now (a spot notice's `time`).
fn rfc3339_in(secs: u64) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + secs;
    let out = Command::new("date")
        .args(["-u", "-d", &format!("@{t}"), "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The daemon (`run`) sees a spot notice with `action`, drains the node for it, and is
/// stopped (the instance goes away with it); returns the reason it wrote.
fn daemon_drains_for_spot(env: &NodeEnv, action: &str, secs: u64) -> String {
    env.imds.set_spot_instance_action(action, &rfc3339_in(secs));
    let mut d = Daemon::spawn(
        &format!("agent-{action}"),
        env.agent_command(&["run"]).unwrap(),
        env.root.path(),
    )
    .unwrap();
    env.ctld
        .wait_node_state(DEFAULT_NODE_NAME, |s| s.contains("DRAIN"), WAIT)
        .unwrap_or_else(|e| panic!("{e:#}\n{}", d.log_tail(40)));
    d.stop().unwrap();
    reason(env)
}

/// The instance stops, hibernates or is terminated: its slurmd goes with it, and the
/// notice is no longer served (a new or restarted instance has none).
fn instance_goes_away(env: &NodeEnv) {
    env.systemd
        .systemctl_ok(&["stop", "slurmd.service"])
        .unwrap();
    env.imds.clear_spot_instance_action();
}

fn assert_in_service(env: &NodeEnv) {
    let st = state(env);
    assert!(is_idle(&st) && !st.contains("DRAIN"), "{st}");
    // Slurm holds no reason for it, and none is left where RESUME clears one.
    env.ctld
        .check_reason_lifted(DEFAULT_NODE_NAME, &reason(env))
        .unwrap();
}

#[test]
fn a_replacement_instance_lifts_its_predecessors_spot_drain() {
    let env = NodeEnv::start("").unwrap();
    assert_eq!(bootstrap_ok(&env, &[])["instance_id"], FIRST);
    let r = daemon_drains_for_spot(&env, "terminate", 120);
    assert!(
        r.starts_with(&format!(
            "slurm-node-agent/spot@{FIRST}: spot interruption notice: terminate at "
        )),
        "{r}"
    );
    instance_goes_away(&env);

    // The replacement: a new instance id, the same NodeName, an empty state folder.
    std::fs::remove_dir_all(env.state_dir()).unwrap();
    env.imds.set("instance-id", SECOND);
    let rep = bootstrap_ok(&env, &[]);
    assert_eq!(rep["instance_id"], SECOND);
    assert_eq!(rep["node_name"], DEFAULT_NODE_NAME);
    assert!(rep["drain"].is_null(), "{rep}");
    assert_in_service(&env);
    // And it runs jobs.
    let host = env.srun_hostname(DEFAULT_NODE_NAME).unwrap();
    assert!(!host.trim().is_empty());
}

#[test]
fn the_same_instance_back_after_a_stop_or_hibernate_notice_returns_to_service() {
    let env = NodeEnv::start("").unwrap();
    bootstrap_ok(&env, &[]);
    for (action, secs) in [("stop", 120), ("hibernate", 180)] {
        let r = daemon_drains_for_spot(&env, action, secs);
        assert!(
            r.starts_with(&format!(
                "slurm-node-agent/{action}@{FIRST}: spot interruption notice: {action} at "
            )),
            "{r}"
        );
        // Stopped (or hibernated), then started again: same instance, same disk, the
        // notice gone.
        instance_goes_away(&env);
        let rep = bootstrap_ok(&env, &[]);
        assert_eq!(rep["instance_id"], FIRST);
        assert!(rep["drain"].is_null(), "{action}: {rep}");
        assert_in_service(&env);
    }

    // The daemon starts again with the drain of the last notice still in its state file:
    // it follows Slurm (someone resumed the node) and does not drain again.
    let mut d = Daemon::spawn(
        "agent-after",
        env.agent_command(&["run"]).unwrap(),
        env.root.path(),
    )
    .unwrap();
    let spot = "/latest/meta-data/spot/instance-action";
    let polls = || {
        env.imds
            .requests()
            .iter()
            .filter(|r| r.path == spot)
            .count()
    };
    let seen = polls();
    wait_until("three spot polls", WAIT, Duration::from_millis(100), || {
        Ok((polls() >= seen + 3).then_some(()))
    })
    .unwrap();
    assert_in_service(&env);
    d.stop().unwrap();
}

#[test]
fn an_admin_drain_survives_bootstrap_which_exits_0_and_names_it() {
    let env = NodeEnv::start("").unwrap();
    bootstrap_ok(&env, &[]);
    env.ctld
        .scontrol_ok(&[
            "update",
            &format!("nodename={DEFAULT_NODE_NAME}"),
            "state=drain",
            "reason=admin maintenance",
        ])
        .unwrap();
    // The node reboots; bootstrap runs again with a join deadline far beyond the harness's
    // own limit (120 s): an admin-drained record must not make it wait for the deadline.
    env.systemd
        .systemctl_ok(&["stop", "slurmd.service"])
        .unwrap();
    let out = env
        // (The orphan watch's window must be longer than the join deadline.)
        .bootstrap(&[
            "--set",
            "slurm.join_deadline=30m",
            "--set",
            "orphan.after=1h",
        ])
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let rep = report(&out).unwrap();
    let drain = rep["drain"].as_str().unwrap_or_default();
    assert!(
        drain.contains("drained by an admin (admin maintenance)"),
        "{rep}"
    );
    let st = state(&env);
    assert!(st.contains("DRAIN"), "{st}");
    assert_eq!(reason(&env), "admin maintenance");
}
