//! Bootstrap with `[[mounts]]`, end to end: the real agent binary against a real
//! slurmctld, moto, the IMDS emulator and a confined `systemd --user` Manager (the
//! harness's `NodeEnv`). The agent runs inside the Manager's mount namespace (nsenter), as
//! it runs in the host's on a real node, so what systemd mounts is what it verifies.
//!
//! - A Lustre mount on this kernel (no Lustre module: mount(8) exits 32 "unknown filesystem
//!   type 'lustre'") stops bootstrap with the plain message; slurmd is not started, so the
//!   node never registers, let alone becomes IDLE.
//! - A tmpfs mount is written, started and verified, and the node becomes IDLE.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};
use std::time::Duration;

use slurm_e2e::agent::{report, step_names, NodeEnv, DEFAULT_NODE_NAME};
use slurm_e2e::{is_idle, run_with_timeout, TempRoot};

/// `slurm-node-agent bootstrap --output json` in the Manager's mount namespace, with the
/// XDG folders that make the agent write user units and its marker for that Manager.
fn bootstrap_in_ns(env: &NodeEnv) -> Output {
    let inner = env
        .agent_command(&["bootstrap", "--output", "json"])
        .unwrap();
    let mut c = Command::new("nsenter");
    c.arg(format!("--mount=/proc/{}/ns/mnt", env.systemd.pid()))
        .arg("--")
        .arg(inner.get_program())
        .args(inner.get_args())
        .env_clear()
        .env("XDG_CONFIG_HOME", env.systemd.xdg_config_home())
        .env("XDG_RUNTIME_DIR", env.systemd.xdg_runtime_dir());
    for (k, v) in inner.get_envs() {
        if let Some(v) = v {
            c.env(k, v);
        }
    }
    run_with_timeout(c, Duration::from_secs(180)).unwrap()
}

fn marker(env: &NodeEnv) -> std::path::PathBuf {
    env.systemd
        .xdg_runtime_dir()
        .join("slurm-node-agent/mounts-ready")
}

#[test]
fn lustre_mount_without_module_stops_bootstrap_and_the_node_never_becomes_idle() {
    let mnt = TempRoot::new("e2e-fsx-").unwrap();
    let mp = mnt.path().join("fsx");
    let env = NodeEnv::start(&format!(
        "[[mounts]]\nmount_point = \"{}\"\nsource = \"127.0.0.1@tcp:/fsx\"\nretry_for = \"30s\"\n",
        mp.display()
    ))
    .unwrap();
    let out = bootstrap_in_ns(&env);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(72), "{stderr}");
    assert!(
        stderr.contains("no Lustre client kernel module for the running kernel"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "mount {} (lustre 127.0.0.1@tcp:/fsx) failed",
            mp.display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("slurmd is not started"), "{stderr}");
    // The real mount(8) of this kernel ran and failed with exit 32.
    let mut esc = Command::new("systemd-escape");
    esc.args(["--path", "--suffix=mount"]).arg(&mp);
    let unit = slurm_e2e::run_ok(esc, Duration::from_secs(10)).unwrap();
    let unit = unit.trim();
    let exec = env.systemd.unit_property(unit, "ExecMount").unwrap();
    assert!(exec.contains("status=32"), "{exec}");
    // slurmd was not started and the node never registered.
    assert_eq!(env.slurmd_pid().unwrap(), 0);
    assert_eq!(
        env.systemd
            .unit_property("slurmd.service", "ActiveState")
            .unwrap(),
        "inactive"
    );
    let state = env.ctld.node_state(DEFAULT_NODE_NAME).unwrap();
    assert!(!state.as_deref().is_some_and(is_idle), "{state:?}");
    assert!(!marker(&env).exists());
}

#[test]
fn tmpfs_mount_then_node_idle() {
    let mnt = TempRoot::new("e2e-tmpfs-").unwrap();
    let mp = mnt.path().join("scratch");
    let env = NodeEnv::start(&format!(
        "[[mounts]]\ntype = \"tmpfs\"\nsource = \"tmpfs\"\nmount_point = \"{}\"\noptions = \"size=8m\"\n",
        mp.display()
    ))
    .unwrap();
    let out = bootstrap_in_ns(&env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = report(&out).unwrap();
    let steps = step_names(&r);
    let (m, s) = (
        steps.iter().position(|s| *s == "mounts").unwrap(),
        steps.iter().position(|s| *s == "slurmd").unwrap(),
    );
    assert!(m < s, "{steps:?}");
    env.ctld
        .wait_node_idle(DEFAULT_NODE_NAME, Duration::from_secs(30))
        .unwrap();
    let mountinfo =
        std::fs::read_to_string(format!("/proc/{}/mountinfo", env.systemd.pid())).unwrap();
    assert!(
        mountinfo
            .lines()
            .any(|l| l.contains(&format!(" {} ", mp.display())) && l.contains(" - tmpfs ")),
        "{mountinfo}"
    );
    assert!(marker(&env).exists());
}
