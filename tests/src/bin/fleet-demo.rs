//! Fleet demo (`scripts/demo.sh --nodes N`): the project's image booted as N nodes, each
//! a container with systemd as PID 1 on a private network with slurmctld, DNS and its own
//! instance metadata; the nodes join by themselves, `sinfo` shows them IDLE, a job spans
//! all of them, then everything is stopped and removed.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use slurm_e2e::fleet::{Fleet, DEFAULT_MAX_NODES};

fn main() -> ExitCode {
    let n = std::env::args()
        .nth(1)
        .and_then(|a| a.parse::<usize>().ok())
        .filter(|n| (1..=999).contains(n));
    let Some(n) = n else {
        eprintln!("usage: fleet-demo NODES (1 to 999)");
        return ExitCode::from(2);
    };
    match demo(n) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fleet demo failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn say(s: &str) {
    println!("\n==> {s}");
}

fn demo(n: usize) -> anyhow::Result<()> {
    say("image root, fleet network, slurmctld and DNS");
    let mut fleet = Fleet::builder()
        .max_nodes(n.max(DEFAULT_MAX_NODES))
        .start()?;
    println!(
        "    image      {} ({})",
        fleet.image().root.display(),
        if fleet.image().rebuilt {
            "built now"
        } else {
            "cached"
        }
    );
    println!("    netns      {}", fleet.netns().path().display());
    println!(
        "    slurmctld  {} (host ctld, netns {})",
        fleet.ctld.conf_server(),
        fleet.controller().netns().path().display()
    );
    let names: Vec<String> = (1..=n).map(|i| format!("node{i:03}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();

    say(&format!(
        "booting {n} nodes at once (systemd-nspawn --boot)"
    ));
    let t = Instant::now();
    fleet.launch_all(&refs)?;
    fleet.wait_all_idle(&names, Duration::from_secs(900))?;
    println!("    all {n} IDLE after {:.1?}", t.elapsed());

    say("sinfo");
    println!("{}", fleet.ctld.sinfo(&["-N", "-l"])?);

    say(&format!("srun -N{n} hostname"));
    let out = fleet.ctld.run_job(
        "srun",
        &[&format!("-N{n}"), "--ntasks-per-node=1", "hostname"],
    )?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    anyhow::ensure!(
        out.status.success(),
        "srun failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    say(&format!("{}: systemctl is-system-running", names[0]));
    println!("    {}", fleet.system_state(&names[0])?);

    say("stopping the fleet");
    drop(fleet);
    println!("    done");
    Ok(())
}
