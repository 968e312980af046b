//! Fleet benchmark (`scripts/bench-fleet.sh`): figures printed, never asserted.
//!
//! 1. One node alone (median of 5 boots): container start → IDLE, split into systemd's
//!    boot (until bootstrap starts) and the agent's part (bootstrap's run, which ends once
//!    slurmctld reports the node available: key, munge, slurmd start → IDLE).
//! 2. N nodes booting at once: all IDLE, the agent's part per node, mean ÷ the lone
//!    node's; each node's memory (PSS of its container's processes, and the host's
//!    `MemAvailable` lost per node), what each node takes of the host limits the fleet
//!    raises ([`slurm_e2e::host_limits`]), and one job across all N nodes (`srun -N N`).
//! 3. Controller load: RPCs per node per minute in `sdiag` while the N nodes sit idle
//!    with the daemon running.
//! 4. Spot notices on every node at once → DRAIN seen by slurmctld, per node.
//! 5. The same N nodes booting the same image without the agent (a plain slurmd from a
//!    static configuration): whole fleet to all IDLE, agent ÷ static; its memory per node.
//! 6. Rolling upgrade of 8 busy nodes (`FLEET_BENCH_UPGRADE_NODES`) with a budget of 2
//!    (`FLEET_BENCH_UPGRADE_BUDGET`) and 30 s jobs, with replacements under the same NodeName
//!    and under new ones (`FLEET_BENCH_UPGRADE_NAMING`: `same`, `new` or `both`, the default)
//!    ([`slurm_e2e::fleet_scenarios::rolling_upgrade`]): publish → every node on the new
//!    image and IDLE, ÷ the ideal job + nodes/budget × replacement (the jobs all start
//!    together, so only the first round waits for one), the replacement being the
//!    measured mean from power-off (the instance exited) to the new instance registered
//!    and IDLE; what the agent adds (the slot's release, the next node's drain, its
//!    power-off) is the rest; and the overlap of
//!    each kind at one sample (upgrade drains, nodes powered off awaiting a replacement
//!    IDLE on the new image, withdrawn drains, and the nodes out of service for the
//!    upgrade in all), to set against the budget.
//! 7. Repairs (issue 38): 16 nodes (`FLEET_BENCH_REPAIR_NODES`), 4 of them
//!    (`_FAULTY`) busy with a 30 s job and made faulty (a replace-class check), budget 2
//!    (`_BUDGET`) ([`slurm_e2e::fleet_scenarios::repair_replace`]): fault → every
//!    replacement IDLE, ÷ the ideal job + faulty/budget × replacement (power-off → new
//!    instance IDLE, measured); the most nodes out for a repair and slots held at once.
//!
//! `FLEET_BENCH_TIMELINE=1` prints the rolling upgrade's timeline (each change of a node's
//! state or reason in slurmctld, sampled every half second, and each replacement).
//!
//! `FLEET_BENCH_PHASES` (comma-separated: `solo`, `boot`, `load`, `storm`, `static`,
//! `upgrade`, `repair`; default all) runs only those: `boot,static` is the N-node figure (all IDLE,
//! the job across all, memory, agent ÷ static) without the rest. `load` and `storm` run on
//! `boot`'s fleet; the ratio of 2. needs `solo`. `FLEET_BENCH_SOLO_ONLY=1` is `solo`.
//! The fleets hold up to max(N, 64) nodes ([`slurm_e2e::fleet::FleetBuilder::max_nodes`]).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use slurm_e2e::fleet::{Fleet, FleetBuilder, DEFAULT_MAX_NODES};
use slurm_e2e::host_limits::HostUsage;
use slurm_e2e::slurm::RpcStat;

/// The phases of the benchmark (see the module's documentation).
const PHASES: [&str; 7] = [
    "solo", "boot", "load", "storm", "static", "upgrade", "repair",
];

/// The phases to run: `FLEET_BENCH_PHASES`, or `solo` alone with `FLEET_BENCH_SOLO_ONLY`,
/// else all.
fn phases() -> Result<Vec<String>> {
    if std::env::var_os("FLEET_BENCH_SOLO_ONLY").is_some() {
        return Ok(vec!["solo".into()]);
    }
    let Ok(v) = std::env::var("FLEET_BENCH_PHASES") else {
        return Ok(PHASES.map(str::to_string).to_vec());
    };
    let v: Vec<String> = v
        .split(',')
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect();
    if let Some(bad) = v.iter().find(|p| !PHASES.contains(&p.as_str())) {
        bail!(
            "FLEET_BENCH_PHASES: no phase {bad:?} (phases: {})",
            PHASES.join(", ")
        );
    }
    Ok(v)
}

/// A number from the environment, or `default`.
fn env_usize(name: &str, default: usize) -> Result<usize> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .ok()
            .filter(|n| *n >= 1)
            .with_context(|| format!("{name}={v:?}: not a number of at least 1")),
        Err(_) => Ok(default),
    }
}

/// A fleet for `n` nodes: room for max(n, 64).
fn fleet_for(n: usize) -> FleetBuilder {
    Fleet::builder().max_nodes(n.max(DEFAULT_MAX_NODES))
}

fn main() -> ExitCode {
    let n = match std::env::args().nth(1) {
        None => 16,
        Some(a) => match a.parse::<usize>() {
            Ok(n) if (1..=999).contains(&n) => n,
            _ => {
                eprintln!("fleet bench: NODES {a:?}: expected a number from 1 to 999");
                return ExitCode::from(2);
            }
        },
    };
    let idle_secs = std::env::args()
        .nth(2)
        .and_then(|a| a.parse::<u64>().ok())
        .unwrap_or(60);
    match bench(n, idle_secs) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fleet bench failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A unit property in microseconds (a `...Monotonic` timestamp).
fn prop_us(fleet: &Fleet, node: &str, unit: Option<&str>, prop: &str) -> Result<u64> {
    let mut args = vec!["show", "-p", prop, "--value"];
    if let Some(u) = unit {
        args.push(u);
    }
    let out = fleet.exec(node, "systemctl", &args)?;
    let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
    v.parse::<u64>()
        .with_context(|| format!("{node}: {prop} of {unit:?} is {v:?}"))
}

/// (systemd boot until bootstrap started, bootstrap's run) in seconds.
fn split(fleet: &Fleet, node: &str) -> Result<(f64, f64)> {
    let unit = Some("slurm-node-agent-bootstrap.service");
    let boot = prop_us(fleet, node, None, "UserspaceTimestampMonotonic")?;
    let start = prop_us(fleet, node, unit, "ExecMainStartTimestampMonotonic")?;
    let exit = prop_us(fleet, node, unit, "ExecMainExitTimestampMonotonic")?;
    Ok((
        start.saturating_sub(boot) as f64 / 1e6,
        exit.saturating_sub(start) as f64 / 1e6,
    ))
}

/// Bootstrap's own report of its steps (its text output, in the node's journal): where the
/// agent's part of a boot goes.
fn print_bootstrap_steps(fleet: &Fleet, node: &str) {
    let args = [
        "-b",
        "-o",
        "cat",
        "-u",
        "slurm-node-agent-bootstrap.service",
    ];
    match fleet.exec(node, "journalctl", &args) {
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stdout);
            let report: Vec<&str> = text
                .lines()
                .skip_while(|l| !l.starts_with("node "))
                .collect();
            if report.is_empty() {
                println!("  ({node}: no bootstrap report in the journal)");
            }
            for l in report {
                println!("  {node} bootstrap: {l}");
            }
        }
        Err(e) => println!("  ({node}: journal unreadable: {e:#})"),
    }
}

/// How many times one node alone is booted (fresh fleets); the figures are medians.
const SOLO_RUNS: usize = 5;

fn names(prefix: &str, n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("{prefix}{i:03}")).collect()
}

/// Seconds from `t` until every node in `names` is IDLE, polled every 20 ms with one
/// `scontrol show nodes` per round (the harness's `wait_all_idle` polls every 500 ms, too
/// coarse for a boot of about half a second, and runs one scontrol per node, which would
/// load the 2 cores the nodes boot on).
fn until_all_idle(fleet: &Fleet, names: &[String], t: Instant) -> Result<f64> {
    Ok(until_each_idle(fleet, names, t)?.0)
}

/// [`until_all_idle`], with the seconds from `t` at which each node was first seen IDLE.
fn until_each_idle(
    fleet: &Fleet,
    names: &[String],
    t: Instant,
) -> Result<(f64, std::collections::BTreeMap<String, f64>)> {
    let deadline = Instant::now() + Duration::from_secs(1800);
    let mut first = std::collections::BTreeMap::new();
    loop {
        // The time of the look that sees them all IDLE is when it was asked, not when its
        // answer was read.
        let asked = t.elapsed().as_secs_f64();
        IDLE_POLLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let out = fleet.ctld.scontrol(&["show", "nodes", "-o"])?;
        let text = String::from_utf8_lossy(&out.stdout);
        let idle: Vec<&str> = text
            .lines()
            .filter(|l| slurm_e2e::slurm::field(l, "State").is_some_and(slurm_e2e::slurm::is_idle))
            .filter_map(|l| slurm_e2e::slurm::field(l, "NodeName"))
            .collect();
        for n in &idle {
            first.entry(n.to_string()).or_insert(asked);
        }
        if names.iter().all(|n| idle.contains(&n.as_str())) {
            return Ok((asked, first));
        }
        if Instant::now() > deadline {
            // Fails, naming the nodes that are not IDLE (or returns once they are).
            fleet.wait_all_idle(names, Duration::from_secs(1))?;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// CLOCK_MONOTONIC in microseconds: the clock of systemd's `...Monotonic` timestamps in the
/// nodes (containers share the host's kernel and have no time namespace).
fn monotonic_us() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0) / 1000
}

/// One node booted alone with no agent: the distribution's slurmd unit started by systemd
/// from a static `/etc/default/slurmd` (see `Launch::static_slurmd`). Returns (container
/// start -> IDLE, slurmd.service's start -> IDLE) in seconds: the second is the part of a
/// boot that any agent which starts slurmd through its unit and waits for IDLE includes.
fn static_solo(name: &str) -> Result<(f64, f64)> {
    let mut fleet = Fleet::builder().start()?;
    let one = vec![name.to_string()];
    let (t, t_us) = (Instant::now(), monotonic_us());
    let mut l = fleet.new_launch(name);
    l.static_slurmd = true;
    fleet.launch(l)?;
    let wall = until_all_idle(&fleet, &one, t)?;
    let idle_at = t_us + (wall * 1e6) as u64;
    let started = prop_us(
        &fleet,
        name,
        Some("slurmd.service"),
        "ExecMainStartTimestampMonotonic",
    )?;
    Ok((wall, idle_at.saturating_sub(started) as f64 / 1e6))
}

fn boot(fleet: &mut Fleet, names: &[String]) -> Result<f64> {
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let t = Instant::now();
    fleet.launch_all(&refs)?;
    let wall = until_all_idle(fleet, names, t)?;
    // Bootstrap's exit is recorded just after IDLE: wait for it.
    for n in names {
        slurm_e2e::wait_until(
            "bootstrap to exit",
            Duration::from_secs(120),
            Duration::from_millis(200),
            || Ok(split(fleet, n).ok().filter(|(_, a)| *a > 0.0)),
        )?;
    }
    Ok(wall)
}

/// slurmctld's RPC counts by message type, from `sdiag`.
fn sdiag_by_type(fleet: &Fleet) -> Result<std::collections::BTreeMap<String, u64>> {
    fleet.ctld.rpc_counts()
}

fn sdiag_total(fleet: &Fleet) -> Result<u64> {
    Ok(sdiag_by_type(fleet)?.values().sum())
}

/// The RPC types that grew most between two `sdiag` readings, per node.
fn rpc_growth(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
    nodes: usize,
) -> String {
    let mut grown: Vec<(u64, &str)> = after
        .iter()
        .map(|(k, v)| {
            (
                v.saturating_sub(before.get(k).copied().unwrap_or(0)),
                k.as_str(),
            )
        })
        .filter(|(d, _)| *d > 0)
        .collect();
    grown.sort_by(|a, b| b.cmp(a));
    grown
        .iter()
        .take(5)
        .map(|(d, k)| format!("{k} {:.1}", *d as f64 / nodes as f64))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The host's `MemAvailable` in bytes (`/proc/meminfo`).
fn mem_available() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The benchmark's IDLE polls so far: each `scontrol show nodes` is one REQUEST_NODE_INFO
/// and one REQUEST_PARTITION_INFO (scontrol's `scontrol_print_node_list` loads both), taken
/// off those counts to leave a booting node's own (its agent's look at its record makes the
/// same pair).
static IDLE_POLLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The message types of one IDLE poll ([`IDLE_POLLS`]).
const POLL_RPCS: [&str; 2] = ["REQUEST_NODE_INFO", "REQUEST_PARTITION_INFO"];

/// The benchmark's `sdiag`: left out of a booting node's RPCs.
const BENCH_OWN_RPCS: [&str; 1] = ["REQUEST_STATS_INFO"];

/// Joins to model: nodes, and the seconds they join in (issue 25 §2: 1,000 nodes in a
/// minute).
const MODEL_NODES: f64 = 1000.0;
const MODEL_SECS: f64 = 60.0;

/// slurmctld's side of a boot, modelled at [`MODEL_NODES`] joining in [`MODEL_SECS`]: the
/// RPCs per booting node measured in this boot of `n` nodes (per message type, the
/// benchmark's own left out: `polls` IDLE polls, [`IDLE_POLLS`], and its `sdiag`) × the
/// join rate, beside slurmctld's cost per RPC of that type measured in the same boot
/// (`sdiag`'s `total_time` ÷ `count`, the polls included, on this machine), and the
/// product: slurmctld's busy time per second of the join, as a share of one thread.
fn print_modelled_join(
    before: &std::collections::BTreeMap<String, RpcStat>,
    after: &std::collections::BTreeMap<String, RpcStat>,
    polls: u64,
    n: usize,
) {
    let joins_per_sec = MODEL_NODES / MODEL_SECS;
    let mut rows = Vec::new();
    let (mut rate_all, mut busy_all) = (0.0, 0.0);
    for (k, a) in after {
        if BENCH_OWN_RPCS.contains(&k.as_str()) {
            continue;
        }
        let b = before.get(k).copied().unwrap_or_default();
        let all = a.count.saturating_sub(b.count);
        let count = if POLL_RPCS.contains(&k.as_str()) {
            all.saturating_sub(polls)
        } else {
            all
        };
        if count == 0 {
            continue;
        }
        let per_node = count as f64 / n as f64;
        let cost_us = a.total_time_us.saturating_sub(b.total_time_us) as f64 / all as f64;
        let rate = per_node * joins_per_sec;
        rate_all += rate;
        busy_all += rate * cost_us;
        rows.push((
            rate,
            format!("{k} {per_node:.2}/node -> {rate:.1}/s x {cost_us:.0} us"),
        ));
    }
    rows.sort_by(|x, y| y.0.total_cmp(&x.0));
    println!(
        "  modelled (the bench's {polls} IDLE polls and its sdiag taken off): {MODEL_NODES:.0} nodes joining in {MODEL_SECS:.0} s send slurmctld {rate_all:.1} RPCs/s; at this machine's measured cost per RPC that is {:.1} ms of slurmctld's time per second ({:.1} % of one thread): {}",
        busy_all / 1000.0,
        busy_all / 10_000.0,
        rows.into_iter().map(|r| r.1).collect::<Vec<_>>().join(", ")
    );
}

const MIB: f64 = 1024.0 * 1024.0;

/// Each node's PSS: (mean, min, max) in MiB.
fn pss_per_node(fleet: &Fleet, names: &[String]) -> Result<(f64, f64, f64)> {
    let mut v = Vec::new();
    for x in names {
        v.push(fleet.memory_footprint(x)? as f64 / MIB);
    }
    let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(0.0, f64::max);
    Ok((mean, min, max))
}

/// One job across every node in `names` (`srun -N <n> --ntasks-per-node=1 hostname`):
/// seconds from submission to its end, or why it failed (each node must answer once under
/// its own name).
fn job_across(fleet: &Fleet, names: &[String]) -> Result<f64> {
    let t = Instant::now();
    let nn = format!("-N{}", names.len());
    let out = fleet
        .ctld
        .run_job("srun", &[&nn, "--ntasks-per-node=1", "hostname"])?;
    let secs = t.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!(
            "srun {nn} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let mut hosts: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    hosts.sort();
    if hosts != names {
        bail!(
            "srun {nn}: {} tasks answered, not one per node: {hosts:?}",
            hosts.len()
        );
    }
    Ok(secs)
}

fn bench(n: usize, idle_secs: u64) -> Result<()> {
    let phases = phases()?;
    let run = |p: &str| phases.iter().any(|x| x == p);
    println!(
        "fleet benchmark: {n} nodes; {} CPUs on this machine; {:.1} GiB available; phases {}",
        num_cpus(),
        mem_available() as f64 / MIB / 1024.0,
        phases.join(",")
    );
    // Figures the phases leave for the later ones, and whether any failed.
    let mut alone_agent = None;
    let mut static_part = None;
    let mut agent_wall = None;
    let mut agent_pss = None;
    let mut failed = Vec::new();
    if run("solo") {
        // One node alone, SOLO_RUNS times (a fresh fleet each): the medians, since one boot of
        // half a second on a shared machine varies by tens of percent.
        let mut solo = Vec::new();
        for _ in 0..SOLO_RUNS {
            let mut fleet = fleet_for(1).start()?;
            let one = names("solo", 1);
            let wall = boot(&mut fleet, &one)?;
            let (sd, agent) = split(&fleet, &one[0])?;
            solo.push((wall, sd, agent));
            if solo.len() == SOLO_RUNS {
                print_bootstrap_steps(&fleet, &one[0]);
            }
        }
        let median = |f: fn(&(f64, f64, f64)) -> f64| {
            let mut v: Vec<f64> = solo.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (alone_wall, alone_sd, alone) = (median(|x| x.0), median(|x| x.1), median(|x| x.2));
        println!(
            "one node alone (median of {SOLO_RUNS}): container start -> IDLE {alone_wall:.2} s; systemd boot until bootstrap {alone_sd:.2} s; agent (bootstrap run, incl. slurmd start -> IDLE) {alone:.2} s = {:.1} % of the whole (goal <= 10 %)",
            100.0 * alone / alone_wall
        );

        let mut floor: Vec<(f64, f64)> = (0..SOLO_RUNS)
            .map(|_| static_solo("solo001"))
            .collect::<Result<_>>()?;
        floor.sort_by(|a, b| a.0.total_cmp(&b.0));
        let static_wall = floor[floor.len() / 2].0;
        floor.sort_by(|a, b| a.1.total_cmp(&b.1));
        let static_alone = floor[floor.len() / 2].1;
        println!(
            "one node alone, no agent (medians of {SOLO_RUNS}, each figure its own): container start -> IDLE {static_wall:.2} s; slurmd.service start -> IDLE {static_alone:.2} s = {:.1} % of the whole (the floor of the agent's share above); the agent's boot / this one = {:.2}",
            100.0 * static_alone / static_wall,
            alone_wall / static_wall
        );

        alone_agent = Some(alone);
        static_part = Some(static_alone);
    }

    let all = names("node", n);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    if run("boot") || run("load") || run("storm") {
        let mut fleet = fleet_for(n).start()?;
        let stats_before = fleet.ctld.rpc_stats()?;
        let polls_before = IDLE_POLLS.load(std::sync::atomic::Ordering::Relaxed);
        let (usage_before, mem_before) = (HostUsage::now(), mem_available());
        let wall = boot(&mut fleet, &all)?;
        let stats_after = fleet.ctld.rpc_stats()?;
        let polls = IDLE_POLLS.load(std::sync::atomic::Ordering::Relaxed) - polls_before;
        let counts = |s: &std::collections::BTreeMap<String, RpcStat>| {
            s.iter().map(|(k, v)| (k.clone(), v.count)).collect()
        };
        let (rpc_before, rpc_after) = (counts(&stats_before), counts(&stats_after));
        agent_wall = Some(wall);
        let mut agent = Vec::new();
        let mut sd = Vec::new();
        for x in &all {
            let (s, a) = split(&fleet, x)?;
            sd.push(s);
            agent.push(a);
        }
        println!(
            "{n} nodes at once: all IDLE after {wall:.2} s; mean systemd boot until bootstrap {:.2} s; mean agent part {:.2} s (max {:.2} s){}",
            mean(&sd),
            mean(&agent),
            agent.iter().cloned().fold(0.0, f64::max),
            alone_agent.map_or(String::new(), |a| format!(
                "; agent part {n} at once / alone = {:.2} (goal <= 1.5)",
                mean(&agent) / a
            ))
        );
        println!(
            "  slurmctld RPCs during that boot, per node (the bench's own IDLE polls, one \
             REQUEST_NODE_INFO and one REQUEST_PARTITION_INFO per 20 ms for all nodes, included): {}",
            rpc_growth(&rpc_before, &rpc_after, n)
        );
        print_modelled_join(&stats_before, &stats_after, polls, n);
        let (pss, lo, hi) = pss_per_node(&fleet, &all)?;
        agent_pss = Some(pss);
        let lost = mem_before.saturating_sub(mem_available()) as f64 / MIB / n as f64;
        println!(
            "  memory per node, IDLE with the agent's daemon: PSS {pss:.1} MiB (min {lo:.1}, max {hi:.1}; {:.0} MiB for all {n}); host MemAvailable lost {lost:.1} MiB per node (page tables, kernel objects, tmpfs and page cache too)",
            pss * n as f64
        );
        let [inst, watches, keys, key_bytes, tasks] = HostUsage::now().per_node(&usage_before, n);
        println!(
            "  host resources per node (the most any one user gained): {inst:.1} inotify instances, {watches:.0} inotify watches, {keys:.1} keys ({key_bytes:.0} bytes), {tasks:.1} processes and threads"
        );
        match job_across(&fleet, &all) {
            Ok(secs) => println!(
                "  a job across all {n} nodes (srun -N{n} --ntasks-per-node=1 hostname): completed in {secs:.2} s, one task on each node"
            ),
            Err(e) => {
                println!("  a job across all {n} nodes: FAILED: {e:#}");
                failed.push(format!("the job across all {n} nodes"));
            }
        }

        if run("load") {
            let before = sdiag_total(&fleet)?;
            let t = Instant::now();
            std::thread::sleep(Duration::from_secs(idle_secs));
            let after = sdiag_total(&fleet)?;
            let per = (after.saturating_sub(before)) as f64
                / n as f64
                / (t.elapsed().as_secs_f64() / 60.0);
            println!(
                "controller load, {n} idle nodes over {idle_secs} s: {per:.2} RPCs per node per minute (goal <= 2)"
            );
        }

        if run("storm") {
            // Spot storm: every node gets a notice at once; time until slurmctld shows DRAIN.
            let t = Instant::now();
            let when = "2099-01-01T00:00:00Z";
            for x in &all {
                fleet.imds(x, |e| e.set_spot_instance_action("terminate", when))?;
            }
            let mut lat = Vec::new();
            let mut pending: Vec<String> = all.clone();
            let deadline = Instant::now() + Duration::from_secs(300);
            while !pending.is_empty() && Instant::now() < deadline {
                pending.retain(|x| {
                    let drained = fleet
                        .ctld
                        .node_state(x)
                        .ok()
                        .flatten()
                        .is_some_and(|s| s.contains("DRAIN"));
                    if drained {
                        lat.push(t.elapsed().as_secs_f64());
                    }
                    !drained
                });
                std::thread::sleep(Duration::from_millis(50));
            }
            lat.sort_by(f64::total_cmp);
            if lat.is_empty() {
                println!("spot storm: no node drained within 300 s");
            } else {
                let p =
                    |q: f64| lat[((lat.len() as f64 * q).ceil() as usize).clamp(1, lat.len()) - 1];
                println!(
                    "spot storm, {n} notices at once: {} drained; notice -> DRAIN p50 {:.2} s, p99 {:.2} s (goal p99 <= 2 s; one storm, {} samples)",
                    lat.len(),
                    p(0.5),
                    p(0.99),
                    lat.len()
                );
            }
        }
    }

    // The same fleet booting the same image without the agent: a plain slurmd started by
    // systemd from a static configuration (see `Launch::static_slurmd`).
    if run("static") {
        let mut fleet = fleet_for(n).start()?;
        let rpc_before = sdiag_by_type(&fleet)?;
        let (t, t_us) = (Instant::now(), monotonic_us());
        for x in &all {
            let mut l = fleet.new_launch(x);
            l.static_slurmd = true;
            fleet.launch(l)?;
        }
        let (static_wall, first) = until_each_idle(&fleet, &all, t)?;
        let static_rpcs = rpc_growth(&rpc_before, &sdiag_by_type(&fleet)?, n);
        // Each node's slurmd.service start -> first seen IDLE: the part of each boot that
        // the agent's part includes, with no agent at all.
        let mut static_parts = Vec::new();
        for x in &all {
            let started = prop_us(
                &fleet,
                x,
                Some("slurmd.service"),
                "ExecMainStartTimestampMonotonic",
            )?;
            let idle_at = t_us + (first.get(x).copied().unwrap_or(static_wall) * 1e6) as u64;
            static_parts.push(idle_at.saturating_sub(started) as f64 / 1e6);
        }
        match agent_wall {
            Some(wall) => println!(
                "{n} nodes at once, agent vs a static slurmd on the same image: all IDLE after {wall:.2} s vs {static_wall:.2} s; ratio {:.2} (goal <= 1.2)",
                wall / static_wall
            ),
            None => println!(
                "{n} nodes at once, a static slurmd on the same image (no agent): all IDLE after {static_wall:.2} s"
            ),
        }
        println!(
            "  with no agent, {n} at once: mean slurmd.service start -> IDLE {:.2} s{}",
            mean(&static_parts),
            static_part.map_or(String::new(), |p| format!(
                " vs {p:.2} s alone = {:.2} (the same ratio as the agent part's above, for slurmd's own part of it)",
                mean(&static_parts) / p
            ))
        );
        println!(
            "  slurmctld RPCs during the boot with no agent, per node (as above): {static_rpcs}"
        );
        let (pss, lo, hi) = pss_per_node(&fleet, &all)?;
        println!(
            "  memory per node with no agent: PSS {pss:.1} MiB (min {lo:.1}, max {hi:.1}){}",
            agent_pss.map_or(String::new(), |a| format!(
                "; the agent's daemon and its units cost {:.1} MiB per node",
                a - pss
            ))
        );
        match job_across(&fleet, &all) {
            Ok(secs) => {
                println!("  a job across all {n} nodes with no agent: completed in {secs:.2} s")
            }
            Err(e) => {
                println!("  a job across all {n} nodes with no agent: FAILED: {e:#}");
                failed.push(format!("the job across all {n} nodes with no agent"));
            }
        }
    }

    if run("upgrade") {
        let namings: Vec<slurm_e2e::fleet_scenarios::Naming> = {
            use slurm_e2e::fleet_scenarios::Naming;
            match std::env::var("FLEET_BENCH_UPGRADE_NAMING").as_deref() {
                Ok("same") => vec![Naming::Same],
                Ok("new") => vec![Naming::New],
                Ok("both") | Err(_) => vec![Naming::Same, Naming::New],
                Ok(other) => {
                    bail!("FLEET_BENCH_UPGRADE_NAMING={other}: expected same, new or both")
                }
            }
        };
        for naming in namings {
            let up_nodes = env_usize("FLEET_BENCH_UPGRADE_NODES", 8)?;
            let budget = env_usize("FLEET_BENCH_UPGRADE_BUDGET", 2)?;
            let job = 30;
            let o = slurm_e2e::fleet_scenarios::rolling_upgrade(
                up_nodes,
                budget,
                job,
                // 30 minutes, or 3 minutes a round of `budget` nodes if that is longer.
                Duration::from_secs(1800.max(up_nodes.div_ceil(budget) as u64 * 180)),
                naming,
            )?;
            let replace = if o.replace_times.is_empty() {
                0.0
            } else {
                o.replace_times
                    .iter()
                    .map(Duration::as_secs_f64)
                    .sum::<f64>()
                    / o.replace_times.len() as f64
            };
            // Every node starts its job at once, so only the first round waits for a job; each
            // round after it is a replacement (power-off -> new instance IDLE) alone.
            let ideal = job as f64 + up_nodes.div_ceil(budget) as f64 * replace;
            println!(
            "rolling upgrade ({naming:?} NodeNames), {up_nodes} busy nodes, budget {budget}, {job} s jobs: {:.1} s; ideal {ideal:.1} s (mean replacement {replace:.1} s); ratio {:.2} (goal <= 1.3); at most {} upgrading and {} unavailable at once; {} jobs completed",
            o.total.as_secs_f64(),
            o.total.as_secs_f64() / ideal,
            o.max_upgrading,
            o.max_unavailable,
            o.jobs
        );
            println!(
            "  overlap at one sample (budget {budget}): {} upgrade drains (drain to power-off), {} powered off awaiting a replacement IDLE on the new image, {} drains withdrawn later; {} out of service for the upgrade (drain to replacement IDLE)",
            o.overlap.draining,
            o.overlap.awaiting_replacement,
            o.overlap.withdrawn_drains,
            o.overlap.held
        );
            if std::env::var_os("FLEET_BENCH_TIMELINE").is_some() {
                for line in &o.timeline {
                    println!("  {line}");
                }
                for (n, j) in &o.journals {
                    println!("  --- {n}: the agent's journal of this boot");
                    for line in j.lines() {
                        println!("  {line}");
                    }
                }
            }
            if !o.records_left.is_empty() {
                failed.push(format!(
                    "records of replaced NodeNames left: {:?}",
                    o.records_left
                ));
            }
        }
    }
    if run("repair") {
        let nodes = env_usize("FLEET_BENCH_REPAIR_NODES", 16)?;
        let faulty = env_usize("FLEET_BENCH_REPAIR_FAULTY", 4)?;
        let budget = env_usize("FLEET_BENCH_REPAIR_BUDGET", 2)?;
        let job = 30;
        let o = slurm_e2e::fleet_scenarios::repair_replace(
            nodes,
            faulty,
            budget,
            job,
            Duration::from_secs(1800.max(faulty.div_ceil(budget) as u64 * 180)),
        )?;
        let mean = |v: &[Duration]| {
            if v.is_empty() {
                0.0
            } else {
                v.iter().map(Duration::as_secs_f64).sum::<f64>() / v.len() as f64
            }
        };
        let replace = mean(&o.replace_times);
        // The faulty nodes' jobs start at once: the first round waits for a job, each
        // round after it is a replacement (power-off -> new instance IDLE) alone.
        let ideal = job as f64 + faulty.div_ceil(budget) as f64 * replace;
        println!(
            "repair: {nodes} nodes, {faulty} faulty with a {job} s job each, budget {budget}: fault -> every replacement IDLE {:.1} s; ideal {ideal:.1} s (mean replacement {replace:.1} s); ratio {:.2} (goal <= 1.3); at most {} out of service for a repair and {} budget slots held at once; {} powered off; jobs killed: 0 (the scenario fails on one)",
            o.total.as_secs_f64(),
            o.total.as_secs_f64() / ideal,
            o.max_out,
            o.max_slots,
            o.replaced.len(),
        );
        if o.max_out > budget {
            failed.push(format!(
                "repairs over the budget: {} out at once",
                o.max_out
            ));
        }
    }
    if !failed.is_empty() {
        bail!("failed: {}", failed.join("; "));
    }
    Ok(())
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}
