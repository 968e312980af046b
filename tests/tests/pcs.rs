//! End to end, the managed join (issue 13): the real `slurm-node-agent bootstrap` registers
//! with the PCS registration emulator through `aws-sdk-pcs` (credentials from the IMDS
//! emulator's instance profile), installs the cluster secret as the key, starts slurmd
//! configless as the pre-declared cloud node the answer names, and the node runs a job in a
//! real slurmctld configured as the service configures a node group
//! (`NodeName=<group>-[1-4] State=CLOUD`, `enable_configless,cloud_reg_addrs`; munge, since
//! Slurm 22.05 has no auth/slurm).
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use base64::Engine;
use slurm_e2e::agent::{munge_ids, report, NodeEnv};
use slurm_e2e::imds_emulator::pcs::{PcsCluster, PcsEmulator, PcsEndpoint, PcsGroup, PcsInstance};
use slurm_e2e::wait_until;

const CLUSTER: &str = "pcs_e2e0cluster";
const GROUP: &str = "pcs_e2e0group";
const INSTANCE: &str = "i-1234567890abcdef0";
const ACCESS_KEY: &str = "ASIAE2ENODE0001";

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A node env whose controller declares the group's cloud nodes, a registration emulator
/// that knows the cluster and this instance, and settings for the managed join.
fn managed_env(window: &str) -> (NodeEnv, PcsEmulator, String) {
    let lines = [
        "SlurmctldParameters=enable_configless,cloud_reg_addrs".to_string(),
        "PrivateData=cloud".to_string(),
        "NodeName=compute-[1-4] State=CLOUD CPUs=1".to_string(),
    ];
    let env = NodeEnv::start_with(&lines, "").unwrap();
    for n in 1..=4 {
        std::fs::create_dir_all(env.ctld.spool_dir(&format!("compute-{n}"))).unwrap();
    }
    let secret = base64::engine::general_purpose::STANDARD
        .encode(slurm_e2e::Munge::shared().unwrap().key().unwrap());
    env.imds.set_role_credentials(
        "AWSPCS-e2e",
        ACCESS_KEY,
        "e2e-secret-access-key",
        "e2e-session-token",
        "2099-01-01T00:00:00Z",
    );
    env.imds.set("placement/region", "us-east-1");
    env.imds.set_tag("aws:pcs:cluster-id", CLUSTER);
    env.imds.set_tag("aws:pcs:compute-node-group-id", GROUP);
    let pcs = PcsEmulator::start().unwrap();
    pcs.add_cluster(PcsCluster {
        id: CLUSTER.into(),
        name: "e2e".into(),
        region: "us-east-1".into(),
        shared_secret: secret.clone(),
        endpoints: vec![PcsEndpoint {
            endpoint_type: "SLURMCTLD".into(),
            private_ip_address: "127.0.0.1".into(),
            port: env.ctld.port().to_string(),
        }],
        groups: vec![PcsGroup {
            id: GROUP.into(),
            name: "compute".into(),
            nodes: (1..=4).map(|n| format!("compute-{n}")).collect(),
            lifecycle_actions: None,
        }],
    });
    pcs.add_instance(PcsInstance {
        instance_id: INSTANCE.into(),
        role: "AWSPCS-e2e".into(),
        access_key_id: ACCESS_KEY.into(),
        secret_access_key: "e2e-secret-access-key".into(),
        session_token: Some("e2e-session-token".into()),
        cluster_id: CLUSTER.into(),
        group_id: GROUP.into(),
    });
    std::fs::write(
        env.config_dir().join("50-pcs.toml"),
        format!(
            "[pcs]\nenabled = true\nendpoint = \"{}\"\nregister_window = \"{window}\"\n\
             bootstrap_id_file = \"{}\"\n",
            pcs.endpoint(),
            env.root.path().join("pcs-bootstrap-id").display()
        ),
    )
    .unwrap();
    (env, pcs, secret)
}

#[test]
fn registration_gives_the_node_its_name_key_and_controller_and_a_job_runs() {
    let (env, pcs, secret) = managed_env("60s");
    let out = env.bootstrap(&[]).unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "bootstrap failed:\n{err}");
    assert!(!err.contains(&secret), "the secret reached the log");
    let r = report(&out).unwrap();
    assert_eq!(r["node_name"], "compute-1");
    assert!(r["state"].as_str().unwrap().starts_with("IDLE"), "{r}");
    assert!(r["dynamic_conf"].is_null(), "{r}");
    let steps: Vec<&str> = r["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert!(steps.contains(&"register"), "{steps:?}");

    // One request, signed with the instance's credentials, for the tagged cluster.
    let reqs = pcs.requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    assert_eq!(reqs[0].instance_id.as_deref(), Some(INSTANCE));
    assert_eq!(reqs[0].cluster_identifier.as_deref(), Some(CLUSTER));
    let bootstrap_id = reqs[0].bootstrap_id.clone().unwrap();
    assert_eq!(reqs[0].status, 200);

    // The controller sees the cloud node, registered from its address, IDLE.
    let state = env.ctld.node_state("compute-1").unwrap().unwrap();
    assert!(state.starts_with("IDLE"), "{state}");
    assert!(state.contains("CLOUD"), "{state}");
    let options = std::fs::read_to_string(env.options_file()).unwrap();
    assert!(
        options.contains(&format!(
            "-N compute-1 --conf-server 127.0.0.1:{}",
            env.ctld.port()
        )),
        "{options}"
    );
    assert!(!options.contains("-Z"), "{options}");

    // The key is the cluster secret, written as every key is.
    let key = std::fs::read(env.key_path()).unwrap();
    assert_eq!(key, slurm_e2e::Munge::shared().unwrap().key().unwrap());
    let meta = std::fs::metadata(env.key_path()).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o400);
    assert_eq!(meta.uid(), munge_ids().unwrap().0);

    // The record: root-only, the answer without the secret.
    let record_path = env.state_dir().join("pcs-registration.json");
    let record = std::fs::read_to_string(&record_path).unwrap();
    assert_eq!(
        std::fs::metadata(&record_path).unwrap().mode() & 0o777,
        0o600
    );
    assert!(!record.contains(&secret), "{record}");
    let v: serde_json::Value = serde_json::from_str(&record).unwrap();
    assert_eq!(v["nodeID"], "compute-1");
    assert_eq!(v["computeNodeGroupName"], "compute");
    assert_eq!(v["bootstrapId"], bootstrap_id.as_str());

    // A job runs.
    let host = env.srun_hostname("compute-1").unwrap();
    assert_eq!(host.trim(), slurm_e2e::slurm::short_hostname().unwrap());

    // Again in the same boot: the same bootstrapId, the same node, nothing restarted.
    let pid = env.slurmd_pid().unwrap();
    let out = env.bootstrap(&[]).unwrap();
    assert!(out.status.success(), "second bootstrap:\n{}", stderr(&out));
    let r = report(&out).unwrap();
    assert_eq!(r["node_name"], "compute-1");
    assert_eq!(r["key_changed"], false);
    assert_eq!(r["slurmd_restarted"], false);
    assert_eq!(env.slurmd_pid().unwrap(), pid);
    let reqs = pcs.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[1].bootstrap_id.as_deref(), Some(bootstrap_id.as_str()));
}

#[test]
fn access_denied_is_retried_until_granted_with_the_same_bootstrap_id() {
    let (env, pcs, _) = managed_env("10m");
    pcs.set_allowed(INSTANCE, false);
    std::thread::scope(|scope| {
        let boot = scope.spawn(|| env.bootstrap(&[]).unwrap());
        wait_until(
            "two denied registrations",
            Duration::from_secs(90),
            Duration::from_millis(100),
            || {
                Ok((pcs
                    .requests()
                    .iter()
                    .filter(|r| r.error.as_deref() == Some("AccessDeniedException"))
                    .count()
                    >= 2)
                    .then_some(()))
            },
        )
        .unwrap();
        pcs.set_allowed(INSTANCE, true);
        let out = boot.join().unwrap();
        assert!(out.status.success(), "bootstrap failed:\n{}", stderr(&out));
        assert_eq!(report(&out).unwrap()["node_name"], "compute-1");
    });
    let reqs = pcs.requests();
    let last = reqs.last().unwrap();
    assert_eq!(last.status, 200);
    assert!(reqs[..reqs.len() - 1]
        .iter()
        .all(|r| r.error.as_deref() == Some("AccessDeniedException")));
    let ids: std::collections::HashSet<_> = reqs.iter().map(|r| r.bootstrap_id.clone()).collect();
    assert_eq!(
        ids.len(),
        1,
        "bootstrapId changed between retries: {reqs:?}"
    );
}

#[test]
fn denied_past_the_window_fails_with_nothing_started() {
    let (env, pcs, _) = managed_env("3s");
    pcs.set_allowed(INSTANCE, false);
    let out = env.bootstrap(&[]).unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(err.contains("AccessDeniedException"), "{err}");
    assert!(err.contains("pcs.register_window"), "{err}");
    assert!(
        err.contains(&format!("assumed-role/AWSPCS-e2e/{INSTANCE}")),
        "{err}"
    );
    assert!(pcs.requests().len() >= 2, "not retried");
    assert!(!env.key_path().exists(), "a key file was written");
    assert!(!env.options_file().exists(), "slurmd options were written");
}
