//! Benchmark: time from starting `slurm-node-agent bootstrap` to the node IDLE, against
//! the time from starting a bare `slurmd -Z --conf-server ...` to IDLE, measured
//! alternately in one run on the same controller; and the agent's peak RSS.
//!
//! A third trial starts munge.service and slurmd.service through systemd with the files
//! the agent wrote and nothing else of the agent's, the floor of the systemd route.
//!
//! Each agent trial starts from a node that is gone: slurmd and munged stopped, the key
//! and the options file removed, the node deleted from slurmctld, so the key fetch, the
//! key write and the munge start are included. Each bare trial starts slurmd by hand with
//! the `--conf` line the agent computed, and polls `scontrol show node` every 5 ms.
//!
//!     scripts/bench-bootstrap.sh [TRIALS]      (default 10)

use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use slurm_e2e::agent::{agent_binary, NodeEnv, DEFAULT_NODE_NAME};
use slurm_e2e::process::{run_with_timeout, Daemon};

fn main() -> ExitCode {
    match bench() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-bootstrap failed: {e:#}");
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

fn reset(env: &NodeEnv) -> Result<()> {
    env.systemd
        .systemctl(&["stop", "slurmd.service", "munge.service"])?;
    for p in [env.key_path(), env.options_file()] {
        let _ = std::fs::remove_file(p);
    }
    delete_node(env)
}

fn delete_node(env: &NodeEnv) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = env
            .ctld
            .scontrol(&["delete", &format!("nodename={DEFAULT_NODE_NAME}")])?;
        if out.status.success() || env.ctld.node_state(DEFAULT_NODE_NAME)?.is_none() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "cannot delete node: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn agent_trial(env: &NodeEnv) -> Result<(f64, u64, f64)> {
    reset(env)?;
    let rss_file = env.root.path().join("rss");
    let mut cmd = Command::new("/usr/bin/time");
    // Peak RSS (KiB), then user and system CPU seconds.
    cmd.arg("-f").arg("%M %U %S").arg("-o").arg(&rss_file);
    let inner = env.agent_command(&["bootstrap", "--output", "json"])?;
    cmd.arg(inner.get_program()).args(inner.get_args());
    // The agent's environment exactly (agent_command clears the rest).
    cmd.env_clear()
        .envs(inner.get_envs().filter_map(|(k, v)| v.map(|v| (k, v))));
    cmd.env(
        "RUST_LOG",
        std::env::var("BENCH_AGENT_LOG").unwrap_or_else(|_| "warn".into()),
    );
    let start = Instant::now();
    let out = run_with_timeout(cmd, Duration::from_secs(120))?;
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    if !out.status.success() {
        bail!("bootstrap failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    if std::env::var_os("BENCH_STEPS").is_some() {
        let r = slurm_e2e::agent::report(&out)?;
        let steps: Vec<String> = r["steps"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|s| format!("{}={}", s["name"].as_str().unwrap_or("?"), s["duration_ms"]))
                    .collect()
            })
            .unwrap_or_default();
        println!(
            "          steps: {} (agent's total {} ms)",
            steps.join(" "),
            r["total_ms"]
        );
    }
    if std::env::var_os("BENCH_AGENT_LOG").is_some() {
        print!("{}", String::from_utf8_lossy(&out.stderr));
    }
    let time_line = std::fs::read_to_string(&rss_file)?;
    let fields: Vec<&str> = time_line
        .lines()
        .last()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let [rss, user, sys] = fields[..] else {
        bail!("/usr/bin/time wrote {time_line:?}, not \"%M %U %S\"");
    };
    let rss_kib: u64 = rss.parse().context("reading /usr/bin/time's %M")?;
    let cpu_s: f64 =
        user.parse::<f64>().context("reading %U")? + sys.parse::<f64>().context("reading %S")?;
    Ok((ms, rss_kib, cpu_s * 1000.0))
}

fn bare_trial(env: &NodeEnv, conf: &str) -> Result<f64> {
    env.systemd.systemctl(&["stop", "slurmd.service"])?;
    delete_node(env)?;
    let mut cmd = Command::new(slurm_e2e::install::program("slurmd"));
    cmd.args([
        "-D",
        "-N",
        DEFAULT_NODE_NAME,
        "--conf-server",
        &env.ctld.conf_server(),
        "-Z",
        "--conf",
        conf,
    ]);
    let start = Instant::now();
    let mut d = Daemon::spawn("bare-slurmd", cmd, env.root.path())?;
    loop {
        if let Some(s) = env.ctld.node_state(DEFAULT_NODE_NAME)? {
            if slurm_e2e::is_idle(&s) {
                break;
            }
        }
        d.check_running()?;
        if start.elapsed() > Duration::from_secs(60) {
            bail!("bare slurmd not IDLE in 60 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    d.stop()?;
    Ok(ms)
}

/// What the agent must leave on disk before munge and slurmd start (read after the warm-up
/// bootstrap), for [`systemd_trial`].
struct NodeFiles {
    key: Vec<u8>,
    key_mode: u32,
    key_owner: (u32, u32),
    options: Vec<u8>,
}

/// The systemd route with nothing of the agent's: from the same gone node as an agent
/// trial, write the key and the options file the agent wrote, start munge.service and
/// slurmd.service with one `systemctl start` (slurmd.service is `After=munge.service`, so
/// systemd itself starts slurmd once munged is up), and poll `scontrol show node` every
/// 5 ms until IDLE, as the bare trial does. No metadata, no key fetch, no registration
/// proof: the least that any agent starting slurmd through its unit takes here.
fn systemd_trial(env: &NodeEnv, files: &NodeFiles) -> Result<f64> {
    use std::os::unix::fs::PermissionsExt;
    reset(env)?;
    let start = Instant::now();
    std::fs::write(env.key_path(), &files.key)?;
    std::fs::set_permissions(
        env.key_path(),
        std::fs::Permissions::from_mode(files.key_mode),
    )?;
    std::os::unix::fs::chown(
        env.key_path(),
        Some(files.key_owner.0),
        Some(files.key_owner.1),
    )?;
    std::fs::write(env.options_file(), &files.options)?;
    let out = env
        .systemd
        .systemctl(&["start", "munge.service", "slurmd.service"])?;
    if !out.status.success() {
        bail!(
            "systemctl start munge slurmd: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    loop {
        if let Some(s) = env.ctld.node_state(DEFAULT_NODE_NAME)? {
            if slurm_e2e::is_idle(&s) {
                break;
            }
        }
        if start.elapsed() > Duration::from_secs(60) {
            bail!("slurmd started by systemd not IDLE in 60 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(start.elapsed().as_secs_f64() * 1000.0)
}

fn bench() -> Result<()> {
    let trials: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()
        .context("TRIALS must be a number")?
        .unwrap_or(10);
    println!("agent binary: {}", agent_binary()?.display());
    let env = NodeEnv::start("")?;
    // Warm-up (page cache, moto's first request), and the --conf line for the bare runs.
    let out = env.bootstrap(&[])?;
    if !out.status.success() {
        bail!(
            "warm-up bootstrap failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let report = slurm_e2e::agent::report(&out)?;
    let conf = report["dynamic_conf"]
        .as_str()
        .context("dynamic_conf in the report")?
        .to_string();
    let files = {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let meta = std::fs::metadata(env.key_path())?;
        NodeFiles {
            key_owner: (meta.uid(), meta.gid()),
            key: std::fs::read(env.key_path()).context("the key bootstrap wrote")?,
            key_mode: meta.permissions().mode() & 0o7777,
            options: std::fs::read(env.options_file()).context("the options bootstrap wrote")?,
        }
    };
    let (mut agent, mut bare, mut floor, mut rss, mut cpu) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..trials {
        let (a, r, c) = agent_trial(&env)?;
        let b = bare_trial(&env, &conf)?;
        let f = systemd_trial(&env, &files)?;
        println!(
            "trial {:>2}: agent {a:7.1} ms (CPU {c:5.0} ms)   bare slurmd {b:7.1} ms   munge+slurmd by systemd {f:7.1} ms   agent peak RSS {:.1} MiB",
            i + 1,
            r as f64 / 1024.0
        );
        agent.push(a);
        bare.push(b);
        floor.push(f);
        rss.push(r);
        cpu.push(c);
    }
    let (ma, mb, mf) = (median(&mut agent), median(&mut bare), median(&mut floor));
    let peak = rss.iter().copied().max().unwrap_or(0) as f64 / 1024.0;
    println!();
    println!(
        "median time to IDLE: agent bootstrap {ma:.1} ms, bare slurmd {mb:.1} ms, munge+slurmd started by systemd {mf:.1} ms"
    );
    println!("ratio agent/bare (median): {:.2}   (goal <= 2.2)", ma / mb);
    println!(
        "ratio systemd route/bare (median): {:.2}   (the floor of any agent that starts munge and slurmd through their units)",
        mf / mb
    );
    println!(
        "ratio agent/systemd route (median): {:.2}   (what the agent adds: metadata, key fetch, record look, registration proof)",
        ma / mf
    );
    println!(
        "agent CPU time (user+system, median): {:.0} ms",
        median(&mut cpu)
    );
    println!("agent peak RSS (max over trials): {peak:.1} MiB   (goal <= 20 MiB)");
    Ok(())
}
