//! Boot-storm benchmark (issue 25 §1): N simulated nodes, launched uniformly within a
//! launch window, fetch the cluster key at once through the agent's own key fetch
//! (`authkey::fetch_in_region`, what bootstrap's key step and its prefetch run), one AWS SDK
//! configuration and client per node, in one tokio runtime, against moto behind the
//! throttling front (`imds_emulator::throttle`, AWS's quotas). Run by
//! `scripts/bench-boot-storm.sh`; prints, for "today" (the SDK's standard retries, 3
//! attempts, no agent retry: the fetch as it was before) and "this build":
//!
//! - time until every node has its key ÷ the ideal (N ÷ quota), goal ≤ 1.3;
//! - nodes that gave up (goal 0);
//! - requests sent ÷ N (goal ≤ 2.0);
//! - p99 of a node's time from its launch to its key.
//!
//! Asserts nothing: the figures are printed.
//!
//! ```text
//! boot_storm [--nodes 1000] [--launch-secs 10] [--tps 40] [--source ssm|secretsmanager]
//!            [--policy both|today|build]
//! ```

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use imds_emulator::throttle::{Front, FrontConfig, Quota};
use slurm_e2e::moto::{Moto, REGION};
use slurm_node_agent::authkey::{self, AuthSettings, KeySource};

struct Args {
    nodes: usize,
    launch: Duration,
    tps: f64,
    source: String,
    policy: String,
}

fn args() -> Result<Args> {
    let mut a = Args {
        nodes: 1000,
        launch: Duration::from_secs(10),
        tps: 40.0,
        source: "ssm".into(),
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
            "--policy" => a.policy = v,
            _ => bail!("unknown flag {flag}"),
        }
    }
    Ok(a)
}

/// One node's outcome: time from the storm's start to its key, from its launch to its key,
/// and why it has none.
struct NodeResult {
    done_at: Duration,
    took: Duration,
    error: Option<String>,
}

fn main() -> Result<()> {
    let a = args()?;
    let moto = Moto::start()?;
    let key = "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVpBQkNERUY=";
    moto.put_secure_string("/storm/munge", key)?;
    moto.create_secret_string("storm/munge", key)?;
    let (source, api, quota) = match a.source.as_str() {
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
    let source = KeySource::parse(source)?;
    let moto_addr = format!("127.0.0.1:{}", moto.port()).parse()?;
    // The SDK's default chain reads these (on a node the endpoint is AWS's).
    for (k, v) in moto.env() {
        std::env::set_var(k, v);
    }
    std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
    let ideal = a.nodes as f64 / a.tps;
    println!(
        "boot storm: {} nodes launched within {:?}, key from {source} through the agent's \
         fetch, {} TPS ({}): ideal N/quota = {ideal:.1} s",
        a.nodes, a.launch, a.tps, quota.name
    );
    let policies: Vec<&str> = match a.policy.as_str() {
        "both" => vec!["today", "build"],
        p => vec![p],
    };
    for policy in policies {
        let front = Front::start(FrontConfig {
            moto: moto_addr,
            pcs: None,
            quotas: vec![quota.clone()],
        })?;
        std::env::set_var("AWS_ENDPOINT_URL", front.endpoint());
        let results = storm(&a, &source, policy)?;
        let stats = front.stats();
        let count = stats.get(api).copied().unwrap_or_default();
        report(&a, policy, ideal, &results, count.served + count.throttled);
    }
    Ok(())
}

fn storm(a: &Args, source: &KeySource, policy: &str) -> Result<Vec<NodeResult>> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let auth = AuthSettings::default();
    let throttle = authkey::throttle_policy(&auth);
    let today = policy == "today";
    rt.block_on(async {
        let start = Instant::now();
        let mut tasks = Vec::with_capacity(a.nodes);
        for _ in 0..a.nodes {
            let source = source.clone();
            let launch = a.launch.mul_f64(rand::random::<f64>());
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep_until((start + launch).into()).await;
                let launched = Instant::now();
                let got = if today {
                    // The key fetch before this change: the SDK's defaults (standard
                    // retries, 3 attempts), one attempt of the agent's.
                    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
                        .region(aws_config::Region::new(REGION))
                        .load()
                        .await;
                    authkey::fetch(&source, &sdk).await
                } else {
                    authkey::fetch_in_region(&source, REGION, &throttle).await
                };
                NodeResult {
                    done_at: start.elapsed(),
                    took: launched.elapsed(),
                    error: got.err().map(|e| e.to_string()),
                }
            }));
        }
        let mut out = Vec::with_capacity(a.nodes);
        for t in tasks {
            out.push(t.await?);
        }
        Ok(out)
    })
}

fn report(a: &Args, policy: &str, ideal: f64, results: &[NodeResult], requests: u64) {
    let label = if policy == "today" {
        "today (SDK standard retries, 3 attempts)"
    } else {
        "this build (agent retries, throttle spread)"
    };
    let ok: Vec<&NodeResult> = results.iter().filter(|r| r.error.is_none()).collect();
    let gave_up = results.len() - ok.len();

    let last = ok
        .iter()
        .map(|r| r.done_at.as_secs_f64())
        .fold(0.0, f64::max);
    let mut took: Vec<f64> = results.iter().map(|r| r.took.as_secs_f64()).collect();
    took.sort_by(f64::total_cmp);
    let p99 = took
        .get((took.len() * 99).div_ceil(100).saturating_sub(1))
        .copied()
        .unwrap_or(0.0);
    let all = if gave_up == 0 {
        format!("{:.2}", last / ideal)
    } else {
        format!("never (last key at {:.2} x ideal)", last / ideal)
    };
    println!(
        "{label}: every node's key / ideal: {all}; gave up: {gave_up}/{}; requests/N: {:.2}; \
         p99 per node: {p99:.1} s",
        a.nodes,
        requests as f64 / a.nodes as f64
    );
    if let Some(e) = results.iter().find_map(|r| r.error.as_deref()) {
        println!("  first node to give up: {e}");
    }
}
