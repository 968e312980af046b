//! End to end, the managed join (issue 13): the real `slurm-node-agent bootstrap` registers
//! with the PCS registration emulator through `aws-sdk-pcs` (credentials from the IMDS
//! emulator's instance profile), installs the cluster secret as the key, starts slurmd
//! configless as the pre-declared cloud node the answer names, and the node runs a job in a
//! real slurmctld configured as the service configures a node group
//! (`NodeName=<group>-[1-4] State=CLOUD`, `enable_configless,cloud_reg_addrs`), with
//! `AuthType=auth/slurm` and `CredType=cred/slurm` as the service runs every cluster, the
//! agent's own choice in the managed join when the image leaves `auth.type` unset (on Slurm
//! older than 23.11, which has no auth/slurm, the tests are skipped); an image that says
//! munge is refused before it registers (issue 37 §3).
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use base64::Engine;
use slurm_e2e::agent::{munge_ids, report, step_names, NodeEnv};
use slurm_e2e::imds_emulator::pcs::{PcsCluster, PcsEmulator, PcsEndpoint, PcsGroup, PcsInstance};
use slurm_e2e::wait_until;

const CLUSTER: &str = "pcs_e2e0cluster";
const GROUP: &str = "pcs_e2e0group";
const INSTANCE: &str = "i-1234567890abcdef0";
const ACCESS_KEY: &str = "ASIAE2ENODE0001";

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A node env whose controller declares the group's cloud nodes and runs auth/slurm, a
/// registration emulator that knows the cluster and this instance, and settings for the
/// managed join that leave `auth.type` to it. `None` (the test is skipped, saying so) on a
/// Slurm without auth/slurm (before 23.11): the managed service runs none.
fn managed_env(window: &str) -> Option<(NodeEnv, PcsEmulator, String)> {
    managed_env_assigning(window, (1..=4).map(|n| format!("compute-{n}")).collect())
}

/// [`managed_env`] whose node group assigns the nodeIDs `nodes` (the controller declares
/// compute-[1-4]).
fn managed_env_assigning(
    window: &str,
    nodes: Vec<String>,
) -> Option<(NodeEnv, PcsEmulator, String)> {
    let lines = [
        "SlurmctldParameters=enable_configless,cloud_reg_addrs".to_string(),
        "PrivateData=cloud".to_string(),
        "NodeName=compute-[1-4] State=CLOUD CPUs=1".to_string(),
    ];
    let version = slurm_e2e::install::version().unwrap();
    if !version.has_auth_slurm() {
        eprintln!(
            "skipped: Slurm {version} has no auth/slurm, which every cluster of the managed \
             service runs"
        );
        return None;
    }
    let env = NodeEnv::start_auth_slurm(&lines, "").unwrap();
    for n in 1..=4 {
        std::fs::create_dir_all(env.ctld.spool_dir(&format!("compute-{n}"))).unwrap();
    }
    let secret = base64::engine::general_purpose::STANDARD.encode(cluster_key(&env));
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
            nodes,
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
            env.root.path().join("pcs-bootstrap-id").display(),
        ),
    )
    .unwrap();
    Some((env, pcs, secret))
}

/// The cluster's key: the auth/slurm controller's `slurm.key`, else the shared munge key.
fn cluster_key(env: &NodeEnv) -> Vec<u8> {
    if env.ctld.is_auth_slurm() {
        env.ctld.slurm_key().unwrap()
    } else {
        slurm_e2e::Munge::shared().unwrap().key().unwrap()
    }
}

/// uid of the key's owner: `slurm` with auth/slurm, else `munge`.
fn key_owner_uid(env: &NodeEnv) -> u32 {
    if env.ctld.is_auth_slurm() {
        slurm_e2e::agent::slurm_ids().unwrap().0
    } else {
        munge_ids().unwrap().0
    }
}

#[test]
fn registration_gives_the_node_its_name_key_and_controller_and_a_job_runs() {
    let Some((env, pcs, secret)) = managed_env("60s") else {
        return;
    };
    let out = env.bootstrap(&[]).unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "bootstrap failed:\n{err}");
    assert!(!err.contains(&secret), "the secret reached the log");
    let r = report(&out).unwrap();
    assert_eq!(r["node_name"], "compute-1");
    assert!(r["state"].as_str().unwrap().starts_with("IDLE"), "{r}");
    assert!(r["dynamic_conf"].is_null(), "{r}");
    let steps = step_names(&r);
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
    // Not a dynamic node: no `-Z` among slurmd's options (the file's paths hold random
    // letters: the words are asked, not the text).
    assert!(!env.slurmd_options().iter().any(|w| w == "-Z"), "{options}");

    // The key is the cluster secret, written as every key is; with auth/slurm (the managed
    // join's default) named to slurmd, and munge not started.
    let key = std::fs::read(env.key_path()).unwrap();
    assert_eq!(key, cluster_key(&env));
    let meta = std::fs::metadata(env.key_path()).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o400);
    assert_eq!(meta.uid(), key_owner_uid(&env));
    if env.ctld.is_auth_slurm() {
        assert!(options.contains("SLURM_SACK_KEY="), "{options}");
        let munge = env
            .systemd
            .unit_property("munge.service", "ActiveState")
            .unwrap();
        assert_eq!(munge.trim(), "inactive");
    }

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

/// An image built for munge only (`slurm-image-builder --auth munge`: its `70-agent.sh`
/// writes `auth.type = "munge"` in `conf.d/10-image.toml`) asked to join the managed
/// service: bootstrap stops with exit 78 naming the key, the file and line, and what the
/// service needs, before it registers, writes a key or starts anything.
#[test]
fn an_image_that_says_munge_is_refused_before_it_registers_naming_the_file() {
    let Some((env, pcs, _)) = managed_env("60s") else {
        return;
    };
    let dropin = env.config_dir().join("10-image.toml");
    std::fs::write(
        &dropin,
        "# Written by packer/scripts/70-agent.sh for this image; later drop-ins override it.\n\
         [auth]\ntype = \"munge\"\n",
    )
    .unwrap();
    let out = env.bootstrap(&[]).unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(
        err.contains(&format!(
            "{}, line 3: key `auth.type`: \"munge\" (auth/munge), but the managed join \
             (pcs.enabled) needs auth/slurm: AWS PCS runs every cluster with \
             AuthType=auth/slurm",
            dropin.display()
        )),
        "{err}"
    );
    assert!(pcs.requests().is_empty(), "{:?}", pcs.requests());
    assert!(!env.key_path().exists());
    assert!(!env.options_file().exists());
    for unit in ["slurmd.service", "munge.service"] {
        let state = env.systemd.unit_property(unit, "ActiveState").unwrap();
        assert_eq!(state.trim(), "inactive", "{unit}");
    }
    assert!(!env.state_dir().join("pcs-registration.json").exists());

    // The image's drop-in as 70-agent.sh writes it by default (`--auth munge+slurm`): the
    // same node joins, with auth/slurm.
    std::fs::write(
        &dropin,
        "# Written by packer/scripts/70-agent.sh for this image; later drop-ins override it.\n\
         # auth.type not set: this image has MUNGE and Slurm's auth/munge and auth/slurm, so\n\
         # the join decides (auth/slurm in the managed join, pcs.enabled; munge otherwise).\n",
    )
    .unwrap();
    let out = env.bootstrap(&[]).unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(report(&out).unwrap()["node_name"], "compute-1");
    assert_eq!(std::fs::read(env.key_path()).unwrap(), cluster_key(&env));
    let options = std::fs::read_to_string(env.options_file()).unwrap();
    assert!(options.contains("SLURM_SACK_KEY="), "{options}");
}

/// The image's settings enable the managed mode, so bootstrap's first attempt goes out
/// beside the metadata read with the cluster of the tag; user data then names the cluster
/// by its name: that answer is not used, bootstrap registers again as the final settings
/// say (same bootstrapId, same node).
#[test]
fn an_early_answer_for_another_cluster_identifier_is_not_used() {
    let Some((env, pcs, _)) = managed_env("60s") else {
        return;
    };
    env.imds.set_user_data(
        "Content-Type: multipart/mixed; boundary=\"XX\"\nMIME-Version: 1.0\n\n--XX\n\
         Content-Type: application/x-slurm-node-agent\n\n[pcs]\ncluster_id = \"e2e\"\n--XX--\n",
    );
    let out = env.bootstrap(&[]).unwrap();
    assert!(out.status.success(), "bootstrap failed:\n{}", stderr(&out));
    assert_eq!(report(&out).unwrap()["node_name"], "compute-1");
    let reqs = pcs.requests();
    let asked: Vec<Option<&str>> = reqs
        .iter()
        .map(|r| r.cluster_identifier.as_deref())
        .collect();
    assert_eq!(asked, [Some(CLUSTER), Some("e2e")], "{reqs:?}");
    assert_eq!(reqs[0].bootstrap_id, reqs[1].bootstrap_id);
    let record: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(env.state_dir().join("pcs-registration.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(record["clusterIdentifier"], "e2e", "{record}");
}

#[test]
fn access_denied_is_retried_until_granted_with_the_same_bootstrap_id() {
    let Some((env, pcs, _)) = managed_env("10m") else {
        return;
    };
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
    let Some((env, pcs, _)) = managed_env("3s") else {
        return;
    };
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

fn sha256(body: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(body.as_bytes()))
}

/// A lifecycle script entry (the service's JSON shape) for a parameter in moto's SSM (the
/// agent's `ssm:` extension; the service itself sends `s3://`).
fn ssm_script(
    name: &str,
    key: &str,
    checksum: &str,
    policy: &str,
    on_error: &str,
    args: &[&str],
) -> serde_json::Value {
    serde_json::json!({
        "name": name,
        "scriptSource": {"scriptLocation": format!("ssm:/pcs-scripts/{key}"), "checksum": checksum},
        "arguments": args,
        "executionPolicy": policy,
        "onError": on_error,
    })
}

/// The node's `Reason=` in `scontrol show node -o`, without Slurm's ` [user@time]` suffix.
fn node_reason(env: &NodeEnv, node: &str) -> String {
    let out = env.ctld.scontrol_ok(&["show", "node", "-o", node]).unwrap();
    let reason = out.split(" Reason=").nth(1).unwrap_or("").trim();
    // Up to Slurm's ` [user@time]`; 23.11+ prints InstanceId= and InstanceType= after it.
    match reason.rsplit_once(" [") {
        Some((r, by)) if by.split(' ').next().is_some_and(|b| b.ends_with(']')) => r.to_string(),
        _ => reason.to_string(),
    }
}

/// `(name, status)` of the report's lifecycle scripts.
fn lifecycle(out: &std::process::Output) -> Vec<(String, String)> {
    report(out).unwrap()["lifecycle"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_string(),
                s["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

/// Makes the lifecycle record look as an earlier boot left it: every mention of this boot's
/// id becomes another boot's (the kernel's boot id cannot change without a reboot).
fn pretend_an_earlier_boot(env: &NodeEnv) {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let path = env.state_dir().join("lifecycle/state.json");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(boot.trim()), "{text}");
    std::fs::write(&path, text.replace(boot.trim(), "an-earlier-boot")).unwrap();
}

/// A unit in the node's confined Manager standing in for `poweroff.target`: it records
/// that it was started. Returns the file it writes.
fn recording_poweroff_unit(env: &NodeEnv) -> std::path::PathBuf {
    let marker = env.root.path().join("powered-off");
    std::fs::write(
        env.systemd.unit_dir().join("sna-poweroff.service"),
        format!(
            "[Service]\nType=oneshot\nExecStart=/bin/touch {}\n",
            marker.display()
        ),
    )
    .unwrap();
    env.systemd.daemon_reload().unwrap();
    std::fs::write(
        env.config_dir().join("60-poweroff.toml"),
        "[node_lifecycle]\npoweroff_unit = \"sna-poweroff.service\"\n",
    )
    .unwrap();
    marker
}

#[test]
fn lifecycle_scripts_from_the_answer_run_by_policy_and_a_checksum_mismatch_never_runs() {
    let Some((env, pcs, _)) = managed_env("60s") else {
        return;
    };
    let out = env.root.path().join("script-out");
    let body = |tag: &str| {
        format!(
            "#!/bin/sh\necho {tag} $PCS_NODE_ID $PCS_COMPUTE_NODE_GROUP_NAME $PCS_CLUSTER_ID \
             $PCS_CLUSTER_NAME $PCS_COMPUTE_NODE_GROUP_ID $PCS_IS_FIRST_BOOT \"$@\" >> {}\n",
            out.display()
        )
    };
    let fail = "#!/bin/sh\necho failing on purpose\nexit 3\n";
    for (key, text) in [
        ("prep.sh", body("prep")),
        ("evil.sh", body("evil")),
        ("fail.sh", fail.to_string()),
        ("after.sh", body("after")),
        ("once.sh", body("once")),
        ("ready.sh", body("ready")),
    ] {
        env.moto
            .put_parameter(&format!("/pcs-scripts/{}", key), &text, "String")
            .unwrap();
    }
    pcs.set_lifecycle_actions(
        GROUP,
        Some(serde_json::json!({
            "scriptCachingPolicy": "REFRESH_ON_REBOOT",
            "stages": {
                "nodeBootstrapped": [
                    ssm_script("prep", "prep.sh", &sha256(&body("prep")), "EVERY_BOOT", "CONTINUE", &["a b", "$HOME"]),
                    // Another script's checksum: never runs, and CONTINUE goes on.
                    ssm_script("evil", "evil.sh", &sha256(&body("prep")), "EVERY_BOOT", "CONTINUE", &[]),
                    ssm_script("fail", "fail.sh", &sha256(fail), "EVERY_BOOT", "STOP_SEQUENCE", &[]),
                    ssm_script("after", "after.sh", &sha256(&body("after")), "EVERY_BOOT", "CONTINUE", &[]),
                ],
                "nodeReady": [
                    ssm_script("once", "once.sh", &sha256(&body("once")), "FIRST_BOOT_ONLY", "CONTINUE", &[]),
                    ssm_script("fail-on", "fail.sh", &sha256(fail), "EVERY_BOOT", "CONTINUE", &[]),
                    ssm_script("ready", "ready.sh", &sha256(&body("ready")), "EVERY_BOOT", "CONTINUE", &[]),
                ],
            }
        })),
    );
    let boot = env.bootstrap(&[]).unwrap();
    assert!(
        boot.status.success(),
        "bootstrap failed:\n{}",
        stderr(&boot)
    );
    let r = report(&boot).unwrap();
    assert!(r["state"].as_str().unwrap().starts_with("IDLE"), "{r}");
    assert_eq!(
        lifecycle(&boot),
        pairs(&[
            ("prep", "ok"),
            ("evil", "failed"),
            ("fail", "failed"),
            ("after", "not_run"),
            ("once", "ok"),
            ("fail-on", "failed"),
            ("ready", "ok"),
        ])
    );
    // nodeBootstrapped before slurmd, nodeReady after the node joined.
    let steps = step_names(&r);
    let at = |n: &str| steps.iter().position(|s| *s == n).unwrap();
    assert!(at("register") < at("node_bootstrapped"), "{steps:?}");
    assert!(at("node_bootstrapped") < at("slurmd"), "{steps:?}");
    assert!(at("join") < at("node_ready"), "{steps:?}");
    let facts = format!("compute-1 compute {CLUSTER} e2e {GROUP}");
    let first = format!("prep {facts} true a b $HOME\nonce {facts} true\nready {facts} true\n");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), first);
    let logs = env.state_dir().join("lifecycle/logs");
    assert_eq!(
        std::fs::read_to_string(logs.join("nodeBootstrapped-3-fail.log")).unwrap(),
        "failing on purpose\n"
    );
    assert!(!logs.join("nodeBootstrapped-2-evil.log").exists());
    assert!(!logs.join("nodeBootstrapped-4-after.log").exists());
    assert!(logs.join("nodeReady-2-fail-on.log").exists());

    // Bootstrap again in the same boot: what succeeded does not run again.
    let boot = env.bootstrap(&[]).unwrap();
    assert!(boot.status.success(), "again:\n{}", stderr(&boot));
    assert_eq!(
        lifecycle(&boot),
        pairs(&[
            ("prep", "done"),
            ("evil", "failed"),
            ("fail", "failed"),
            ("after", "not_run"),
            ("once", "done"),
            ("fail-on", "failed"),
            ("ready", "done"),
        ])
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap(), first);

    // Another boot: FIRST_BOOT_ONLY is skipped, EVERY_BOOT runs again.
    pretend_an_earlier_boot(&env);
    let boot = env.bootstrap(&[]).unwrap();
    assert!(boot.status.success(), "second boot:\n{}", stderr(&boot));
    assert_eq!(
        lifecycle(&boot),
        pairs(&[
            ("prep", "ok"),
            ("evil", "failed"),
            ("fail", "failed"),
            ("after", "not_run"),
            ("once", "skipped"),
            ("fail-on", "failed"),
            ("ready", "ok"),
        ])
    );
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        format!("{first}prep {facts} false a b $HOME\nready {facts} false\n")
    );
}

#[test]
fn terminate_in_node_ready_drains_naming_the_script_and_powers_off() {
    let Some((env, pcs, _)) = managed_env("60s") else {
        return;
    };
    let marker = recording_poweroff_unit(&env);
    let fail = "#!/bin/sh\necho site check failed\nexit 1\n";
    env.moto
        .put_parameter("/pcs-scripts/fail.sh", fail, "String")
        .unwrap();
    pcs.set_lifecycle_actions(
        GROUP,
        Some(serde_json::json!({
            "scriptCachingPolicy": "CACHE_ONCE",
            "stages": {"nodeReady": [
                ssm_script("site-check", "fail.sh", &sha256(fail), "EVERY_BOOT", "TERMINATE", &[]),
            ]}
        })),
    );
    let boot = env.bootstrap(&[]).unwrap();
    let err = stderr(&boot);
    assert_eq!(boot.status.code(), Some(65), "{err}");
    assert!(
        err.contains("\"site-check\"") && err.contains("TERMINATE"),
        "{err}"
    );
    assert!(err.contains("sna-poweroff.service started"), "{err}");
    let reason = node_reason(&env, "compute-1");
    assert!(
        reason.starts_with(&format!(
            "slurm-node-agent/script@{INSTANCE}: site-check failed in nodeReady (onError TERMINATE)"
        )),
        "{reason:?}"
    );
    let state = env.ctld.node_state("compute-1").unwrap().unwrap();
    assert!(state.contains("DRAIN"), "{state}");
    wait_until(
        "the poweroff unit to run",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || Ok(marker.exists().then_some(())),
    )
    .unwrap();
    let record: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(env.state_dir().join("pcs-registration.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(record["terminatedBy"].as_str(), Some(reason.as_str()));
}

#[test]
fn terminate_in_node_bootstrapped_starts_no_slurmd_and_keeps_the_reason_in_the_record() {
    let Some((env, pcs, _)) = managed_env("60s") else {
        return;
    };
    let marker = recording_poweroff_unit(&env);
    let fail = "#!/bin/sh\nexit 4\n";
    let ready = "#!/bin/sh\nexit 0\n";
    env.moto
        .put_parameter("/pcs-scripts/fail.sh", fail, "String")
        .unwrap();
    env.moto
        .put_parameter("/pcs-scripts/ready.sh", ready, "String")
        .unwrap();
    pcs.set_lifecycle_actions(
        GROUP,
        Some(serde_json::json!({
            "scriptCachingPolicy": "CACHE_ONCE",
            "stages": {
                "nodeBootstrapped": [
                    ssm_script("early-check", "fail.sh", &sha256(fail), "FIRST_BOOT_ONLY", "TERMINATE", &[]),
                ],
                "nodeReady": [
                    ssm_script("ready", "ready.sh", &sha256(ready), "EVERY_BOOT", "CONTINUE", &[]),
                ],
            }
        })),
    );
    let boot = env.bootstrap(&[]).unwrap();
    let err = stderr(&boot);
    assert_eq!(boot.status.code(), Some(65), "{err}");
    assert!(err.contains("early-check"), "{err}");
    wait_until(
        "the poweroff unit to run",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || Ok(marker.exists().then_some(())),
    )
    .unwrap();
    // slurmd never started: the controller never heard of the node, nothing was drained.
    let active = env
        .systemd
        .systemctl(&["is-active", "slurmd.service"])
        .unwrap();
    assert_ne!(String::from_utf8_lossy(&active.stdout).trim(), "active");
    let reason = node_reason(&env, "compute-1");
    assert!(!reason.contains("slurm-node-agent"), "{reason:?}");
    // The reason is in the log and the registration record.
    let record: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(env.state_dir().join("pcs-registration.json")).unwrap(),
    )
    .unwrap();
    let kept = record["terminatedBy"].as_str().unwrap();
    assert!(
        kept.starts_with(&format!(
            "slurm-node-agent/script@{INSTANCE}: early-check failed in nodeBootstrapped"
        )),
        "{kept}"
    );
    assert!(err.contains(kept), "{err}");
    assert!(!env
        .state_dir()
        .join("lifecycle/logs/nodeReady-1-ready.log")
        .exists());
}

#[test]
fn settings_scripts_run_in_the_configless_mode_with_the_agents_variables() {
    let env = NodeEnv::start("").unwrap();
    let out = env.root.path().join("script-out");
    let script = format!(
        "#!/bin/sh\necho \"$1\" \"$SLURM_NODE_AGENT_NODE_NAME\" \"$SLURM_NODE_AGENT_INSTANCE_ID\" \
         \"$SLURM_NODE_AGENT_IS_FIRST_BOOT\" \"$SLURM_NODE_AGENT_STAGE\" \
         \"$SLURM_NODE_AGENT_CONF_SERVERS\" \"${{PCS_NODE_ID-unset}}\" >> {}\n",
        out.display()
    );
    let file = env.root.path().join("site-prep.sh");
    std::fs::write(&file, &script).unwrap();
    env.moto
        .put_parameter("/site/ready-script", &script, "String")
        .unwrap();
    std::fs::write(
        env.config_dir().join("40-lifecycle.toml"),
        format!(
            "[node_lifecycle]\nscript_caching_policy = \"CACHE_ONCE\"\n\n\
             [[node_lifecycle.node_bootstrapped]]\nname = \"prep\"\n\
             script_location = \"file:{}\"\nchecksum = \"{}\"\narguments = [\"bootstrapped\"]\n\
             execution_policy = \"EVERY_BOOT\"\non_error = \"TERMINATE\"\n\n\
             [[node_lifecycle.node_ready]]\nname = \"ready\"\n\
             script_location = \"ssm:/site/ready-script\"\narguments = [\"ready\"]\n\
             execution_policy = \"FIRST_BOOT_ONLY\"\non_error = \"STOP_SEQUENCE\"\n",
            file.display(),
            sha256(&script)
        ),
    )
    .unwrap();
    let boot = env.bootstrap(&[]).unwrap();
    assert!(
        boot.status.success(),
        "bootstrap failed:\n{}",
        stderr(&boot)
    );
    let r = report(&boot).unwrap();
    let node = r["node_name"].as_str().unwrap().to_string();
    let instance = r["instance_id"].as_str().unwrap().to_string();
    assert_eq!(lifecycle(&boot), pairs(&[("prep", "ok"), ("ready", "ok")]));
    let servers = format!("127.0.0.1:{}", env.ctld.port());
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        format!(
            "bootstrapped {node} {instance} true nodeBootstrapped {servers} unset\n\
             ready {node} {instance} true nodeReady {servers} unset\n"
        )
    );
    // A bad key is refused before anything runs, naming the key.
    std::fs::write(
        env.config_dir().join("50-bad.toml"),
        "[[node_lifecycle.node_ready]]\nname = \"x\"\nscript_location = \"file:/x\"\n\
         execution_policy = \"EVERY_BOOT\"\non_error = \"EXPLODE\"\n",
    )
    .unwrap();
    let boot = env.bootstrap(&[]).unwrap();
    let err = stderr(&boot);
    assert_eq!(boot.status.code(), Some(78), "{err}");
    let bad = env.config_dir().join("50-bad.toml");
    assert!(
        err.contains(&format!(
            "{}, line 5: key `node_lifecycle.node_ready[0].on_error`: script \"x\"",
            bad.display()
        )),
        "{err}"
    );
    // A malformed location is refused at once too, not when the script is due.
    std::fs::write(
        &bad,
        "[[node_lifecycle.node_ready]]\nname = \"x\"\nscript_location = \"ssm:name with space\"\n\
         execution_policy = \"EVERY_BOOT\"\non_error = \"CONTINUE\"\n",
    )
    .unwrap();
    let boot = env.bootstrap(&[]).unwrap();
    let err = stderr(&boot);
    assert_eq!(boot.status.code(), Some(78), "{err}");
    assert!(
        err.contains(&format!(
            "{}, line 3: key `node_lifecycle.node_ready[0].script_location`: script \"x\": \"ssm:name with space\": character ' ' is not allowed",
            bad.display()
        )),
        "{err}"
    );
}

/// A lifecycle script entry (the service's JSON shape) for an object in moto's S3.
fn s3_script(name: &str, key: &str, checksum: &str, version: Option<&str>) -> serde_json::Value {
    let mut source = serde_json::json!({
        "scriptLocation": format!("s3://pcs-scripts/{key}"),
        "checksum": checksum,
    });
    if let Some(v) = version {
        source["s3VersionId"] = v.into();
    }
    serde_json::json!({
        "name": name,
        "scriptSource": source,
        "arguments": [],
        "executionPolicy": "EVERY_BOOT",
        "onError": "CONTINUE",
    })
}

#[test]
fn s3_scripts_run_by_version_and_a_missing_key_or_wrong_checksum_fails_clearly() {
    let Some((env, pcs, _)) = managed_env("60s") else {
        return;
    };
    let out = env.root.path().join("script-out");
    let body = |tag: &str| format!("#!/bin/sh\necho {tag} $PCS_NODE_ID >> {}\n", out.display());
    env.moto.create_bucket("pcs-scripts", true).unwrap();
    env.moto
        .put_object("pcs-scripts", "boot.sh", body("boot").as_bytes())
        .unwrap();
    let v1 = env
        .moto
        .put_object("pcs-scripts", "ready.sh", body("ready-v1").as_bytes())
        .unwrap()
        .expect("a versioned bucket gives a version id");
    let v2 = env
        .moto
        .put_object("pcs-scripts", "ready.sh", body("ready-v2").as_bytes())
        .unwrap()
        .unwrap();
    assert_ne!(v1, v2);
    env.moto
        .put_object("pcs-scripts", "locked/x.sh", body("locked").as_bytes())
        .unwrap();
    env.moto
        .put_bucket_policy(
            "pcs-scripts",
            &serde_json::json!({
                "Version": "2012-10-17",
                "Statement": [{
                    "Effect": "Deny",
                    "Principal": "*",
                    "Action": "s3:GetObject",
                    "Resource": "arn:aws:s3:::pcs-scripts/locked/*",
                }],
            }),
        )
        .unwrap();
    pcs.set_lifecycle_actions(
        GROUP,
        Some(serde_json::json!({
            "scriptCachingPolicy": "REFRESH_ON_REBOOT",
            "stages": {
                "nodeBootstrapped": [
                    s3_script("boot", "boot.sh", &sha256(&body("boot")), None),
                ],
                "nodeReady": [
                    // The older version, by its id: not the latest object.
                    s3_script("pinned", "ready.sh", &sha256(&body("ready-v1")), Some(&v1)),
                    s3_script("latest", "ready.sh", &sha256(&body("ready-v2")), None),
                    s3_script("missing", "nope.sh", &sha256("x"), None),
                    // The object is there; its checksum is another script's.
                    s3_script("wrong-sum", "boot.sh", &sha256(&body("ready-v1")), None),
                    s3_script("no-version", "ready.sh", &sha256(&body("ready-v1")),
                        Some("3HL4kqtJlcpXroDTDmJ-rmSpXd3dIbrHY")),
                    s3_script("denied", "locked/x.sh", &sha256(&body("locked")), None),
                ],
            }
        })),
    );
    let boot = env.bootstrap(&[]).unwrap();
    assert!(
        boot.status.success(),
        "bootstrap failed:\n{}",
        stderr(&boot)
    );
    assert_eq!(
        lifecycle(&boot),
        pairs(&[
            ("boot", "ok"),
            ("pinned", "ok"),
            ("latest", "ok"),
            ("missing", "failed"),
            ("wrong-sum", "failed"),
            ("no-version", "failed"),
            ("denied", "failed"),
        ])
    );
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "boot compute-1\nready-v1 compute-1\nready-v2 compute-1\n"
    );
    let r = report(&boot).unwrap();
    let detail = |name: &str| -> String {
        r["lifecycle"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .unwrap()["detail"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let missing = detail("missing");
    assert!(
        missing.contains("s3://pcs-scripts/nope.sh") && missing.contains("NoSuchKey"),
        "{missing}"
    );
    let wrong = detail("wrong-sum");
    assert!(
        wrong.contains("s3://pcs-scripts/boot.sh") && wrong.contains("checksum mismatch"),
        "{wrong}"
    );
    let version = detail("no-version");
    assert!(
        version.contains("s3://pcs-scripts/ready.sh (version 3HL4kqtJlcpXroDTDmJ-rmSpXd3dIbrHY)")
            && version.contains("NoSuchVersion"),
        "{version}"
    );
    // moto refuses a policy-denied GET with a bare 403 (S3 itself sends AccessDenied).
    let denied = detail("denied");
    assert!(
        denied.contains("s3://pcs-scripts/locked/x.sh") && denied.contains("access denied"),
        "{denied}"
    );
    // What failed never ran: no log file for them.
    let logs = env.state_dir().join("lifecycle/logs");
    for n in [
        "nodeReady-3-missing.log",
        "nodeReady-4-wrong-sum.log",
        "nodeReady-5-no-version.log",
    ] {
        assert!(!logs.join(n).exists(), "{n}");
    }
}

#[test]
fn a_node_id_the_controller_does_not_know_stops_bootstrap_within_a_minute_naming_it() {
    // The service assigns compute-9; the cluster's slurm.conf declares compute-[1-4] only
    // (a node group whose nodes the controller was never told of).
    let Some((env, _pcs, _)) = managed_env_assigning("2m", vec!["compute-9".into()]) else {
        return;
    };
    let start = std::time::Instant::now();
    let out = env.bootstrap(&[]).unwrap();
    let err = stderr(&out);
    eprintln!("{err}");
    assert!(
        start.elapsed() < std::time::Duration::from_secs(60),
        "took {:?}: {err}",
        start.elapsed()
    );
    assert_eq!(out.status.code(), Some(65), "{err}");
    assert!(err.contains("compute-9") && err.contains("nodeID"), "{err}");
}
