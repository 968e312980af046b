//! Boot-storm benchmark (issue 25 §1): N simulated nodes, launched uniformly within a
//! launch window, run the agent's boot-time AWS steps at once, each node with its own AWS
//! SDK configuration and clients, in one tokio runtime, against moto and the PCS
//! registration emulator behind the throttling front (`imds_emulator::throttle`, AWS's
//! quotas). The steps, in bootstrap's order, through the functions bootstrap calls:
//!
//! - `key`: the cluster key from SSM Parameter Store or Secrets Manager
//!   (`authkey::fetch_in_region`, what bootstrap's key step and its prefetch run);
//! - `register`: the managed service's registration, `RegisterComputeNodeGroupInstance`
//!   (`pcs::register_with_credentials`: `pcs::register` signed with the node's own role
//!   session instead of IMDS's, each node a distinct instance of the emulator's group);
//! - `scripts`: the lifecycle scripts of `nodeBootstrapped` from S3
//!   (`node_lifecycle::run_stage`: S3 `GetObject`, checksum, cache, run): one script per
//!   node, from the registration answer's `nodeLifecycleActions` when `register` runs,
//!   else the same actions as the image's settings would give them.
//!
//! Quotas: Parameter Store standard 40 TPS (`--tps`), Secrets Manager GetSecretValue
//! 10,000/s, S3 GetObject 5,500/s per prefix (`--s3-tps`), PCS
//! RegisterComputeNodeGroupInstance 20/s (`--pcs-tps`; AWS publishes no rate for it: a
//! setting of the front). Run by `scripts/bench-boot-storm.sh`; prints, for "today" (the
//! key fetch with the SDK's standard retries, 3 attempts, no agent retry: the fetch as it
//! was before; the key step only) and "this build", per step and for the whole boot:
//!
//! - time until every node has done it ÷ the ideal, goal ≤ 1.3. A step's time runs from
//!   the first node starting it to the last finishing it; its ideal is N ÷ quota, or the
//!   spread of the nodes' starts of the step when that is longer (a step cannot end
//!   before its last node reaches it). The whole boot's runs from the storm's start; its
//!   ideal is the launch window or the slowest step's N ÷ quota;
//! - nodes that gave up (goal 0);
//! - requests sent ÷ N (goal ≤ 2.0; the whole boot: all requests ÷ (N × steps));
//! - p99 of a node's time in the step (the whole boot: from its launch to its last step).
//!
//! Asserts nothing: the figures are printed.
//!
//! ```text
//! boot_storm [--nodes 1000] [--launch-secs 10] [--tps 40] [--source ssm|secretsmanager]
//!            [--pcs-tps 20] [--s3-tps 5500] [--steps key,register,scripts]
//!            [--policy both|today|build]
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use imds_emulator::pcs::{PcsCluster, PcsEmulator, PcsEndpoint, PcsGroup, PcsInstance};
use imds_emulator::throttle::{Front, FrontConfig, Quota};
use sha2::{Digest, Sha256};
use slurm_e2e::moto::{Moto, REGION};
use slurm_node_agent::authkey::{self, AuthSettings, AuthType, KeySource};
use slurm_node_agent::imds::InstanceIdentity;
use slurm_node_agent::node_lifecycle::{self, Facts, Origin, RunRecord, ScriptList, Stage};
use slurm_node_agent::pcs::{self, NodeLifecycleActions, PcsSettings};

const STEPS: [&str; 3] = ["key", "register", "scripts"];
const API: [&str; 3] = ["", "pcs:RegisterComputeNodeGroupInstance", "s3:GetObject"];
const CLUSTER: &str = "pcs_storm";
const GROUP: &str = "pcs_stormgrp";
const SECRET: &str = "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVpBQkNERUY=";
const SCRIPT: &[u8] = b"#!/bin/sh\nexit 0\n";

struct Args {
    nodes: usize,
    launch: Duration,
    tps: f64,
    source: String,
    pcs_tps: f64,
    s3_tps: f64,
    steps: Vec<usize>,
    policy: String,
}

fn args() -> Result<Args> {
    let mut a = Args {
        nodes: 1000,
        launch: Duration::from_secs(10),
        tps: 40.0,
        source: "ssm".into(),
        pcs_tps: imds_emulator::throttle::PCS_REGISTER_DEFAULT_TPS,
        s3_tps: 5_500.0,
        steps: vec![0, 1, 2],
        policy: "both".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--nodes" => a.nodes = v.parse()?,
            "--launch-secs" => a.launch = Duration::from_secs_f64(v.parse()?),
            "--tps" => a.tps = v.parse()?,
            "--source" => a.source = v,
            "--pcs-tps" => a.pcs_tps = v.parse()?,
            "--s3-tps" => a.s3_tps = v.parse()?,
            "--steps" => {
                a.steps = v
                    .split(',')
                    .map(|s| {
                        STEPS
                            .iter()
                            .position(|k| *k == s)
                            .with_context(|| format!("--steps: {s}: key, register or scripts"))
                    })
                    .collect::<Result<_>>()?;
                a.steps.sort_unstable();
                a.steps.dedup();
            }
            "--policy" => a.policy = v,
            _ => bail!("unknown flag {flag}"),
        }
    }
    Ok(a)
}

/// One step of one node: from the storm's start to its start and end, and why it failed.
#[derive(Debug, Clone)]
struct StepResult {
    start: Duration,
    end: Duration,
    error: Option<String>,
}

/// One node: its launch (from the storm's start) and its steps (`None`: not reached).
struct NodeResult {
    launched: Duration,
    steps: [Option<StepResult>; 3],
}

/// What every node shares.
struct World {
    key_source: KeySource,
    pcs_endpoint: String,
    me: String,
    dir: PathBuf,
    actions: NodeLifecycleActions,
}

fn main() -> Result<()> {
    let a = args()?;
    let moto = Moto::start()?;
    moto.put_secure_string("/storm/munge", SECRET)?;
    moto.create_secret_string("storm/munge", SECRET)?;
    moto.create_bucket("storm-scripts", false)?;
    moto.put_object("storm-scripts", "boot/ready.sh", SCRIPT)?;
    let actions = serde_json::json!({
        "scriptCachingPolicy": "REFRESH_ON_REBOOT",
        "stages": {"nodeBootstrapped": [{
            "name": "ready",
            "scriptSource": {
                "scriptLocation": "s3://storm-scripts/boot/ready.sh",
                "checksum": hex::encode(Sha256::digest(SCRIPT)),
            },
            "executionPolicy": "EVERY_BOOT",
            "onError": "TERMINATE"
        }]}
    });
    let (key_source, key_api, key_quota) = match a.source.as_str() {
        "ssm" => (
            "ssm:/storm/munge",
            "ssm:GetParameter",
            Quota::ssm_standard(a.tps),
        ),
        "secretsmanager" => (
            "secretsmanager:storm/munge",
            "secretsmanager:GetSecretValue",
            Quota::new(
                "Secrets Manager GetSecretValue",
                &["secretsmanager:GetSecretValue"],
                a.tps,
            ),
        ),
        other => bail!("--source {other}: ssm or secretsmanager"),
    };
    let apis = [key_api, API[1], API[2]];
    let rates = [a.tps, a.pcs_tps, a.s3_tps];
    let quotas = vec![
        key_quota.clone(),
        Quota::new(
            "PCS RegisterComputeNodeGroupInstance (front setting)",
            &[API[1]],
            a.pcs_tps,
        ),
        Quota::new(
            "S3 GET/HEAD per prefix",
            &["s3:GetObject", "s3:HeadObject"],
            a.s3_tps,
        ),
    ];
    let key_source = KeySource::parse(key_source)?;
    let moto_addr = format!("127.0.0.1:{}", moto.port()).parse()?;
    // The SDK's default chain reads these (on a node the endpoint is AWS's).
    for (k, v) in moto.env() {
        std::env::set_var(k, v);
    }
    std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
    let me = nix::unistd::User::from_uid(nix::unistd::getuid())?
        .context("no user name for this uid")?
        .name;
    let names: Vec<&str> = a.steps.iter().map(|&i| STEPS[i]).collect();
    println!(
        "boot storm: {} nodes launched within {:?}, steps {}: key from {key_source} at {} TPS \
         ({}), PCS registration at {}/s (front setting), S3 GetObject at {}/s",
        a.nodes,
        a.launch,
        names.join(","),
        a.tps,
        key_quota.name,
        a.pcs_tps,
        a.s3_tps
    );
    let policies: Vec<&str> = match a.policy.as_str() {
        "both" => vec!["today", "build"],
        p => vec![p],
    };
    for policy in policies {
        if policy == "today" && !a.steps.contains(&0) {
            continue;
        }
        let pcs_emulator = PcsEmulator::start()?;
        let world = world(&a, &pcs_emulator, key_source.clone(), &me, &actions)?;
        let front = Front::start(FrontConfig {
            moto: moto_addr,
            pcs: Some(
                pcs_emulator
                    .endpoint()
                    .trim_start_matches("http://")
                    .parse()?,
            ),
            quotas: quotas.clone(),
        })?;
        std::env::set_var("AWS_ENDPOINT_URL", front.endpoint());
        let world = Arc::new(World {
            pcs_endpoint: front.endpoint(),
            ..world
        });
        let steps: Vec<usize> = if policy == "today" {
            vec![0]
        } else {
            a.steps.clone()
        };
        let results = storm(&a, &world, policy, &steps)?;
        let stats = front.stats();
        let requests: Vec<u64> = apis
            .iter()
            .map(|api| {
                let c = stats.get(*api).copied().unwrap_or_default();
                c.served + c.throttled
            })
            .collect();
        report(&a, policy, &steps, &rates, &results, &requests);
        drop(front);
        let _ = std::fs::remove_dir_all(&world.dir);
    }
    Ok(())
}

/// The emulator's cluster (one group, a pre-declared node and an instance per simulated
/// node) and the nodes' state folders.
fn world(
    a: &Args,
    pcs_emulator: &PcsEmulator,
    key_source: KeySource,
    me: &str,
    actions: &serde_json::Value,
) -> Result<World> {
    pcs_emulator.add_cluster(PcsCluster {
        id: CLUSTER.into(),
        name: "storm".into(),
        region: REGION.into(),
        shared_secret: SECRET.into(),
        endpoints: vec![PcsEndpoint {
            endpoint_type: "SLURMCTLD".into(),
            private_ip_address: "10.0.0.10".into(),
            port: "6817".into(),
        }],
        groups: vec![PcsGroup {
            id: GROUP.into(),
            name: "storm".into(),
            nodes: (1..=a.nodes).map(|i| format!("storm-{i}")).collect(),
            lifecycle_actions: Some(actions.clone()),
        }],
    });
    for i in 0..a.nodes {
        pcs_emulator.add_instance(PcsInstance {
            instance_id: instance_id(i),
            role: "AWSPCS-storm".into(),
            access_key_id: format!("ASIASTORM{i:08}"),
            secret_access_key: format!("secret-of-node-{i}"),
            session_token: Some(format!("token-of-node-{i}")),
            cluster_id: CLUSTER.into(),
            group_id: GROUP.into(),
        });
    }
    let dir = std::env::temp_dir().join(format!("boot-storm-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(World {
        key_source,
        pcs_endpoint: String::new(),
        me: me.to_string(),
        dir,
        actions: serde_json::from_value(actions.clone())?,
    })
}

fn instance_id(i: usize) -> String {
    format!("i-{i:017x}")
}

fn storm(a: &Args, world: &Arc<World>, policy: &str, steps: &[usize]) -> Result<Vec<NodeResult>> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let auth = AuthSettings::default();
    let throttle = authkey::throttle_policy(&auth);
    let today = policy == "today";
    rt.block_on(async {
        let start = Instant::now();
        let mut tasks = Vec::with_capacity(a.nodes);
        for i in 0..a.nodes {
            let world = world.clone();
            let steps = steps.to_vec();
            let launch = a.launch.mul_f64(rand::random::<f64>());
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep_until((start + launch).into()).await;
                let mut out = NodeResult {
                    launched: start.elapsed(),
                    steps: [None, None, None],
                };
                let mut actions = world.actions.clone();
                let mut managed = None;
                for step in steps {
                    let begun = start.elapsed();
                    let error = match step {
                        0 => key(&world, today, &throttle).await.err(),
                        1 => match register(&world, i).await {
                            Ok(m) => {
                                if let Some(a) = &m.registration.node_lifecycle_actions {
                                    actions = a.clone();
                                }
                                managed = Some(m);
                                None
                            }
                            Err(e) => Some(e),
                        },
                        _ => scripts(&world, i, &actions, managed.as_ref()).await.err(),
                    };
                    let failed = error.is_some();
                    out.steps[step] = Some(StepResult {
                        start: begun,
                        end: start.elapsed(),
                        error,
                    });
                    if failed {
                        break;
                    }
                }
                out
            }));
        }
        let mut out = Vec::with_capacity(a.nodes);
        for t in tasks {
            out.push(t.await?);
        }
        Ok(out)
    })
}

async fn key(
    world: &World,
    today: bool,
    throttle: &slurm_node_agent::retry::ThrottlePolicy,
) -> Result<(), String> {
    let got = if today {
        // The key fetch before boot storms were handled: the SDK's defaults (standard
        // retries, 3 attempts), one attempt of the agent's.
        let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new(REGION))
            .load()
            .await;
        authkey::fetch(&world.key_source, &sdk).await
    } else {
        authkey::fetch_in_region(&world.key_source, REGION, throttle).await
    };
    got.map(drop).map_err(|e| e.to_string())
}

fn node_dir(world: &World, i: usize) -> PathBuf {
    world.dir.join(format!("node-{i}"))
}

/// The registration as bootstrap makes it in the managed mode, signed with node `i`'s own
/// role session (what IMDS would serve that instance).
async fn register(world: &World, i: usize) -> Result<pcs::Managed, String> {
    let dir = node_dir(world, i);
    let settings = PcsSettings {
        enabled: true,
        cluster_id: CLUSTER.into(),
        endpoint: world.pcs_endpoint.clone(),
        bootstrap_id_file: dir.join("pcs-bootstrap-id"),
        ..PcsSettings::default()
    };
    let auth = AuthSettings {
        auth_type: AuthType::Slurm,
        key_owner: world.me.clone(),
        key_path: dir.join("slurm.key"),
        ..AuthSettings::default()
    };
    let id = InstanceIdentity {
        instance_id: instance_id(i),
        region: REGION.into(),
        ..InstanceIdentity::default()
    };
    let creds =
        aws_sdk_pcs::config::SharedCredentialsProvider::new(aws_sdk_pcs::config::Credentials::new(
            format!("ASIASTORM{i:08}"),
            format!("secret-of-node-{i}"),
            Some(format!("token-of-node-{i}")),
            None,
            "boot-storm",
        ));
    pcs::register_with_credentials(&settings, creds, &auth, &id, None)
        .await
        .map_err(|e| e.to_string())
}

/// `nodeBootstrapped`'s scripts as bootstrap runs them (the service's list first).
async fn scripts(
    world: &World,
    i: usize,
    actions: &NodeLifecycleActions,
    managed: Option<&pcs::Managed>,
) -> Result<(), String> {
    let dir = node_dir(world, i);
    let state_dir: &Path = &dir;
    let facts = Facts {
        node_name: managed.map_or_else(|| format!("storm-{i}"), |m| m.registration.node_id.clone()),
        instance_id: instance_id(i),
        first_boot: true,
        conf_servers: managed.map(|m| m.conf_servers.clone()).unwrap_or_default(),
        pcs: managed.map(|m| (&m.registration).into()),
    };
    let mut record = RunRecord::load(state_dir, &facts.instance_id, "storm-boot");
    let origin = if managed.is_some() {
        Origin::Service
    } else {
        Origin::Settings
    };
    let outcome = node_lifecycle::run_stage(
        state_dir,
        REGION,
        Stage::NodeBootstrapped,
        &[ScriptList { origin, actions }],
        &facts,
        &mut record,
    )
    .await;
    match outcome.scripts.iter().find(|s| s.status != "ok") {
        None => Ok(()),
        Some(s) => Err(format!(
            "script {}: {} {}",
            s.name,
            s.status,
            s.detail.as_deref().unwrap_or("")
        )),
    }
}

/// The four figures of one step or of the whole boot.
struct Figures {
    all_over_ideal: String,
    gave_up: usize,
    requests_per_n: f64,
    p99: f64,
}

fn p99(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get((v.len() * 99).div_ceil(100).saturating_sub(1))
        .copied()
        .unwrap_or(0.0)
}

fn over(last: f64, ideal: f64, gave_up: usize) -> String {
    if gave_up == 0 {
        format!("{:.2}", last / ideal)
    } else {
        format!("never (last done at {:.2} x ideal)", last / ideal)
    }
}

fn report(
    a: &Args,
    policy: &str,
    steps: &[usize],
    rates: &[f64; 3],
    results: &[NodeResult],
    requests: &[u64],
) {
    let label = if policy == "today" {
        "today (SDK standard retries, 3 attempts)"
    } else {
        "this build (agent retries, throttle spread)"
    };
    println!("{label}:");
    let n = a.nodes as f64;
    let mut ideal_boot = a.launch.as_secs_f64();
    let mut first_error = None;
    for &s in steps {
        let ran: Vec<&StepResult> = results.iter().filter_map(|r| r.steps[s].as_ref()).collect();
        let gave_up =
            ran.iter().filter(|r| r.error.is_some()).count() + (results.len() - ran.len());
        let first = ran
            .iter()
            .map(|r| r.start.as_secs_f64())
            .fold(f64::MAX, f64::min);
        let last_start = ran
            .iter()
            .map(|r| r.start.as_secs_f64())
            .fold(0.0, f64::max);
        let last = ran
            .iter()
            .filter(|r| r.error.is_none())
            .map(|r| r.end.as_secs_f64())
            .fold(0.0, f64::max);
        let by_quota = n / rates[s];
        ideal_boot = ideal_boot.max(by_quota);
        let ideal = by_quota.max(last_start - first);
        let f = Figures {
            all_over_ideal: over(last - first, ideal, gave_up),
            gave_up,
            requests_per_n: requests[s] as f64 / n,
            p99: p99(ran
                .iter()
                .map(|r| (r.end - r.start).as_secs_f64())
                .collect()),
        };
        print_figures(STEPS[s], &format!("ideal {ideal:.1} s"), &f, a.nodes);
        if first_error.is_none() {
            first_error = ran.iter().find_map(|r| r.error.clone());
        }
    }
    if steps.len() > 1 {
        let done: Vec<Option<f64>> = results
            .iter()
            .map(|r| {
                let all = steps
                    .iter()
                    .all(|&s| r.steps[s].as_ref().is_some_and(|x| x.error.is_none()));
                all.then(|| {
                    steps
                        .iter()
                        .filter_map(|&s| r.steps[s].as_ref())
                        .map(|x| x.end.as_secs_f64())
                        .fold(0.0, f64::max)
                })
            })
            .collect();
        let gave_up = done.iter().filter(|d| d.is_none()).count();
        let last = done.iter().flatten().copied().fold(0.0, f64::max);
        let took = results
            .iter()
            .zip(&done)
            .filter_map(|(r, d)| d.map(|d| d - r.launched.as_secs_f64()))
            .collect();
        let total: u64 = steps.iter().map(|&s| requests[s]).sum();
        let f = Figures {
            all_over_ideal: over(last, ideal_boot, gave_up),
            gave_up,
            requests_per_n: total as f64 / (n * steps.len() as f64),
            p99: p99(took),
        };
        print_figures(
            "whole boot",
            &format!("ideal {ideal_boot:.1} s"),
            &f,
            a.nodes,
        );
    }
    if let Some(e) = first_error {
        println!("  first node to give up: {e}");
    }
}

fn print_figures(what: &str, ideal: &str, f: &Figures, nodes: usize) {
    println!(
        "  {what:<10} every node done / ideal: {} ({ideal}); gave up: {}/{nodes}; \
         requests/N: {:.2}; p99 per node: {:.1} s",
        f.all_over_ideal, f.gave_up, f.requests_per_n, f.p99
    );
}
