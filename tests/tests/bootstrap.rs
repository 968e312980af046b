//! End to end: the real `slurm-node-agent bootstrap` binary takes a node from instance
//! metadata to IDLE in a real slurmctld (Slurm 22.05), with the key from moto's Secrets
//! Manager or SSM, munge.service and slurmd.service started through a real systemd Manager,
//! and a real job runs on it.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::MetadataExt;

use slurm_e2e::agent::{munge_ids, report, NodeEnv, DEFAULT_NODE_NAME};

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn bootstrap_brings_a_dynamic_node_to_idle_and_runs_a_job_then_converges() {
    let env = NodeEnv::start("").unwrap();
    let out = env.bootstrap(&[]).unwrap();
    assert!(out.status.success(), "bootstrap failed:\n{}", stderr(&out));
    let r = report(&out).unwrap();
    assert_eq!(r["node_name"], DEFAULT_NODE_NAME);
    assert!(r["state"].as_str().unwrap().starts_with("IDLE"), "{r}");
    let steps: Vec<&str> = r["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        steps,
        [
            "settings",
            "instance_metadata",
            "node_definition",
            "auth_key",
            "munge",
            "slurmd",
            "join"
        ]
    );
    assert!(r["steps"][0]["duration_ms"].is_u64());
    assert_eq!(r["key_changed"], true);

    // The controller agrees, with the features from instance facts.
    let state = env.ctld.node_state(DEFAULT_NODE_NAME).unwrap().unwrap();
    assert!(state.starts_with("IDLE"), "{state}");
    let show = env
        .ctld
        .scontrol_ok(&["show", "node", "-o", DEFAULT_NODE_NAME])
        .unwrap();
    assert!(
        show.contains("AvailableFeatures=m4.xlarge,us-east-1a,ondemand"),
        "{show}"
    );

    // The key: the cluster's, mode 0400, owned by munge.
    let key = std::fs::read(env.key_path()).unwrap();
    assert_eq!(key, slurm_e2e::Munge::shared().unwrap().key().unwrap());
    let meta = std::fs::metadata(env.key_path()).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o400);
    assert_eq!(meta.uid(), munge_ids().unwrap().0);

    // A real job runs on the node.
    let host = env.srun_hostname(DEFAULT_NODE_NAME).unwrap();
    assert_eq!(host.trim(), slurm_e2e::slurm::short_hostname().unwrap());

    // Run again: same end state, key untouched, the same single slurmd, one options line.
    let pid = env.slurmd_pid().unwrap();
    assert!(pid > 0);
    let options = std::fs::read_to_string(env.options_file()).unwrap();
    let out = env.bootstrap(&[]).unwrap();
    assert!(
        out.status.success(),
        "second bootstrap failed:\n{}",
        stderr(&out)
    );
    let r = report(&out).unwrap();
    assert_eq!(r["key_changed"], false);
    assert_eq!(r["slurmd_restarted"], false);
    assert_eq!(env.slurmd_pid().unwrap(), pid, "slurmd was restarted");
    assert_eq!(
        std::fs::read_to_string(env.options_file()).unwrap(),
        options
    );
    assert_eq!(options.matches("SLURMD_OPTIONS=").count(), 1);
}

#[test]
fn node_name_and_features_from_tags_and_key_from_ssm() {
    let env = NodeEnv::start("").unwrap();
    let key = slurm_e2e::Munge::shared().unwrap().key().unwrap();
    use base64::Engine;
    env.moto
        .put_secure_string(
            "/cluster/munge-key",
            &base64::engine::general_purpose::STANDARD.encode(&key),
        )
        .unwrap();
    env.imds.set_tag("slurm-node-agent:node.name", "tagged-7");
    env.imds
        .set_tag("slurm-node-agent:node.features", "efa,bigmem");
    env.imds.set("instance-life-cycle", "spot");
    std::fs::create_dir_all(env.ctld.spool_dir("tagged-7")).unwrap();
    let out = env
        .bootstrap(&["--auth-key-source", "ssm:/cluster/munge-key"])
        .unwrap();
    assert!(out.status.success(), "bootstrap failed:\n{}", stderr(&out));
    assert_eq!(report(&out).unwrap()["node_name"], "tagged-7");
    let show = env
        .ctld
        .scontrol_ok(&["show", "node", "-o", "tagged-7"])
        .unwrap();
    assert!(
        show.contains("AvailableFeatures=m4.xlarge,us-east-1a,spot,efa,bigmem"),
        "{show}"
    );
}
