//! Benchmark: the managed join (PCS registration with the emulator, then slurmd as the
//! pre-declared cloud node) to IDLE, against today's configless join (dynamic node) to
//! IDLE, both by the agent, alternately in one run on the same controller.
//!
//! Before each managed trial the cloud node is set DOWN (it comes back IDLE when its slurmd
//! registers, `ReturnToService=2`); before each configless trial the dynamic node is
//! deleted. Both trials stop slurmd and munged and remove the key and the options file, so
//! both include the key write and the munge start.
//!
//! The cloud node's record keeps the `SlurmdStartTime` (whole seconds) of the previous
//! managed trial's slurmd. Bootstrap proves a registration by a start time not before its
//! own slurmd's, so when the old one is from the same second it waits for the next second
//! before starting slurmd (see `registered_by` in the agent). A node never boots within
//! the second its NodeName's previous slurmd started, so a managed trial starts (untimed)
//! once the wall clock has left the second in which the previous one ended: what is timed
//! is the boot, not that wait.
//!
//!     scripts/bench-pcs.sh [TRIALS]      (default 10)

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use base64::Engine;
use slurm_e2e::agent::{NodeEnv, DEFAULT_NODE_NAME};
use slurm_e2e::imds_emulator::pcs::{PcsCluster, PcsEmulator, PcsEndpoint, PcsGroup, PcsInstance};
use slurm_e2e::process::run_with_timeout;

fn main() -> ExitCode {
    match bench() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-pcs failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Seconds since the epoch.
fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Sleeps until the wall clock's second is later than `sec`.
fn after_second(sec: u64) {
    while now_secs() <= sec {
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn stop_node(env: &NodeEnv) -> Result<()> {
    env.systemd
        .systemctl(&["stop", "slurmd.service", "munge.service"])?;
    for p in [env.key_path(), env.options_file()] {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

/// One trial: the wall time (ms) and bootstrap's own step times (`steps[].duration_ms` of
/// its JSON report).
fn trial(env: &NodeEnv, managed: bool) -> Result<(f64, Vec<(String, f64)>)> {
    stop_node(env)?;
    if managed {
        env.ctld
            .scontrol_ok(&["update", "nodename=compute-1", "state=down", "reason=bench"])?;
    } else {
        let deadline = Instant::now() + Duration::from_secs(30);
        while env.ctld.node_state(DEFAULT_NODE_NAME)?.is_some() {
            let _ = env
                .ctld
                .scontrol(&["delete", &format!("nodename={DEFAULT_NODE_NAME}")])?;
            if Instant::now() > deadline {
                bail!("cannot delete {DEFAULT_NODE_NAME}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let mut cmd = env.agent_command(&["bootstrap", "--output", "json"])?;
    cmd.env("RUST_LOG", "warn");
    if managed {
        cmd.args(["--set", "pcs.enabled=true"]);
    }
    let start = Instant::now();
    let out = run_with_timeout(cmd, Duration::from_secs(120))?;
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    if !out.status.success() {
        bail!("bootstrap failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    for l in String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.contains("TIMING"))
    {
        eprintln!("{l}");
    }
    let report = slurm_e2e::agent::report(&out)?;
    let steps = report["steps"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| Some((s["name"].as_str()?.to_string(), s["duration_ms"].as_f64()?)))
                .collect()
        })
        .unwrap_or_default();
    Ok((ms, steps))
}

/// Median per step name over trials, in the order the steps first appear.
fn step_medians(trials: &[Vec<(String, f64)>]) -> Vec<(String, f64)> {
    let mut names: Vec<String> = Vec::new();
    for t in trials {
        for (n, _) in t {
            if !names.contains(n) {
                names.push(n.clone());
            }
        }
    }
    names
        .into_iter()
        .map(|n| {
            let mut v: Vec<f64> = trials
                .iter()
                .map(|t| t.iter().filter(|(m, _)| *m == n).map(|(_, d)| d).sum())
                .collect();
            let m = median(&mut v);
            (n, m)
        })
        .collect()
}

fn bench() -> Result<()> {
    let trials: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()
        .context("TRIALS must be a number")?
        .unwrap_or(10);
    let lines = [
        "SlurmctldParameters=enable_configless,cloud_reg_addrs".to_string(),
        "PrivateData=cloud".to_string(),
        "NodeName=compute-[1-4] State=CLOUD CPUs=1".to_string(),
    ];
    let env = NodeEnv::start_with(&lines, "")?;
    std::fs::create_dir_all(env.ctld.spool_dir("compute-1"))?;
    let secret =
        base64::engine::general_purpose::STANDARD.encode(slurm_e2e::Munge::shared()?.key()?);
    env.imds.set_role_credentials(
        "AWSPCS-bench",
        "ASIABENCH",
        "bench-secret",
        "bench-token",
        "2099-01-01T00:00:00Z",
    );
    env.imds.set("placement/region", "us-east-1");
    let pcs = PcsEmulator::start()?;
    pcs.add_cluster(PcsCluster {
        id: "pcs_bench".into(),
        name: "bench".into(),
        region: "us-east-1".into(),
        shared_secret: secret,
        endpoints: vec![PcsEndpoint {
            endpoint_type: "SLURMCTLD".into(),
            private_ip_address: "127.0.0.1".into(),
            port: env.ctld.port().to_string(),
        }],
        groups: vec![PcsGroup {
            id: "pcs_benchgroup".into(),
            name: "compute".into(),
            nodes: vec!["compute-1".into()],
            lifecycle_actions: None,
        }],
    });
    pcs.add_instance(PcsInstance {
        instance_id: "i-1234567890abcdef0".into(),
        role: "AWSPCS-bench".into(),
        access_key_id: "ASIABENCH".into(),
        secret_access_key: "bench-secret".into(),
        session_token: Some("bench-token".into()),
        cluster_id: "pcs_bench".into(),
        group_id: "pcs_benchgroup".into(),
    });
    std::fs::write(
        env.config_dir().join("50-pcs.toml"),
        format!(
            "[pcs]\ncluster_id = \"pcs_bench\"\nendpoint = \"{}\"\nbootstrap_id_file = \"{}\"\n",
            pcs.endpoint(),
            env.root.path().join("pcs-bootstrap-id").display()
        ),
    )?;
    // Warm-up of both paths.
    trial(&env, false)?;
    trial(&env, true)?;
    let mut managed_end = now_secs();
    let (mut managed, mut configless) = (Vec::new(), Vec::new());
    let (mut managed_steps, mut configless_steps) = (Vec::new(), Vec::new());
    for i in 0..trials {
        let (c, cs) = trial(&env, false)?;
        after_second(managed_end);
        let (m, ms) = trial(&env, true)?;
        managed_end = now_secs();
        configless_steps.push(cs);
        managed_steps.push(ms);
        println!(
            "trial {:>2}: configless {c:7.1} ms   managed (PCS) {m:7.1} ms",
            i + 1
        );
        configless.push(c);
        managed.push(m);
    }
    let (mc, mm) = (median(&mut configless), median(&mut managed));
    println!();
    for (label, steps) in [
        ("configless", &configless_steps),
        ("managed", &managed_steps),
    ] {
        let line: Vec<String> = step_medians(steps)
            .iter()
            .map(|(n, d)| format!("{n} {d:.0}"))
            .collect();
        println!("median step ms, {label}: {}", line.join(", "));
    }
    println!("median time to IDLE: configless join {mc:.1} ms, managed join {mm:.1} ms");
    println!("managed adds (median): {:.1} ms   (goal <= 20 ms)", mm - mc);
    println!("ratio managed/configless (median): {:.2}", mm / mc);
    Ok(())
}
