//! Local demo: a slurmctld, munge, moto holding the cluster key, the IMDS emulator and a
//! confined systemd Manager; then `slurm-node-agent bootstrap` turns this "instance" into a
//! Slurm node, `sinfo` shows it IDLE, and a job runs on it. Everything is stopped and
//! removed at the end. Run through `scripts/demo.sh`.

use std::process::ExitCode;
use std::time::Duration;

use slurm_e2e::agent::{report, NodeEnv, DEFAULT_NODE_NAME};
use slurm_e2e::process::run_ok;

fn main() -> ExitCode {
    match demo() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn say(s: &str) {
    println!("\n==> {s}");
}

fn demo() -> anyhow::Result<()> {
    say("starting slurmctld, munged, moto (SSM, Secrets Manager), the IMDS emulator and a systemd Manager");
    let env = NodeEnv::start("")?;
    env.imds.set_tag("slurm-node-agent:node.features", "demo");
    println!("    slurmctld      {}", env.ctld.conf_server());
    println!("    moto           {}", env.moto.endpoint());
    println!("    IMDS emulator  {}", env.imds.endpoint());
    println!("    systemd bus    {}", env.systemd.bus_address());
    println!("    agent settings {}", env.config_path().display());
    println!("{}", std::fs::read_to_string(env.config_path())?);

    say("sinfo before bootstrap");
    println!("{}", env.ctld.sinfo(&["-N", "-l"])?);

    say("slurm-node-agent bootstrap");
    let out = env.bootstrap(&[])?;
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        anyhow::bail!("bootstrap exited with {}", out.status);
    }
    let r = report(&out)?;
    println!("{}", serde_json::to_string_pretty(&r)?);

    say("sinfo after bootstrap");
    println!("{}", env.ctld.sinfo(&["-N", "-o", "%N %T %c %m %f"])?);

    say(&format!("srun -N1 -w {DEFAULT_NODE_NAME} hostname"));
    println!("{}", env.srun_hostname(DEFAULT_NODE_NAME)?.trim());

    say("sbatch --wait: a batch job on the node");
    let mut c = env.ctld.command("sbatch");
    c.args([
        "--wait",
        "-N1",
        "-w",
        DEFAULT_NODE_NAME,
        "-o",
        "/dev/null",
        "--wrap",
        "echo hello from $SLURMD_NODENAME",
    ]);
    println!("{}", run_ok(c, Duration::from_secs(120))?.trim());

    say("cleaning up (slurmd, munged, slurmctld, moto, emulator, systemd stopped by PID)");
    drop(env);
    say("done");
    Ok(())
}
