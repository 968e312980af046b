//! Captures the agent's parser fixtures from the real daemons of the Slurm under test
//! (`SLURM_E2E_PREFIX`, see `slurm_e2e::install`): a slurmctld and a dynamic slurmd `d1`
//! started with `--instance-id`/`--instance-type` where the version has them, driven
//! through each state the agent reads with `scontrol update` and
//! `scontrol reboot` (RebootProgram=/bin/true). For each state it writes
//! `scontrol show node -o <node>` (`scontrol-show-node-<state>.txt`), and for some the
//! multi-line form and `scontrol show node --json` / `sinfo --json` where the version has
//! them, into `agent/tests/fixtures/slurm-<MAJOR.MINOR>/` (or the folder given as the first
//! argument), with `CAPTURED.md` saying how. Run as root: `scripts/slurm-fixtures.sh [VERSION]`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use slurm_e2e::{install, NodeKind, Slurmctld, Slurmd};

fn main() -> ExitCode {
    match capture() {
        Ok(dir) => {
            println!("{}", dir.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("slurm-fixtures: {e:#}");
            ExitCode::FAILURE
        }
    }
}

const WAIT: Duration = Duration::from_secs(60);

fn capture() -> Result<PathBuf> {
    let v = install::version()?;
    let dir = match std::env::args_os().nth(1) {
        Some(d) => PathBuf::from(d),
        None => slurm_e2e::fleet::repo_root().join(format!(
            "agent/tests/fixtures/slurm-{}.{:02}",
            v.major, v.minor
        )),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // One dynamic node per controller: a second slurmd on the same address would share
    // its NodeHostname, and slurmctld's pings after a RESUME would not reach it.
    let ctld = Slurmctld::builder("fixtures")
        .line("RebootProgram=/bin/true")
        .start()?;
    let mut extra = Vec::new();
    if v.has_instance_fields() {
        extra.extend([
            "--instance-id",
            "i-0123456789abcdef0",
            "--instance-type",
            "m5.large",
        ]);
    }
    let mut d1 = Slurmd::spawn(
        &ctld,
        "d1",
        &NodeKind::Dynamic("CPUs=1 RealMemory=500 Features=m5.large,us-east-1a".into()),
        &extra,
    )?;
    ctld.wait_node_idle("d1", WAIT)?;

    let write = |name: &str| -> Result<()> {
        let text = ctld.scontrol_ok(&["show", "node", "-o", "d1"])?;
        std::fs::write(dir.join(format!("scontrol-show-node-{name}.txt")), text)?;
        Ok(())
    };
    let update = |args: &[&str]| -> Result<()> {
        let mut a = vec!["update", "NodeName=d1"];
        a.extend_from_slice(args);
        ctld.scontrol_ok(&a).map(drop)
    };
    let settle = || std::thread::sleep(Duration::from_millis(1500));
    let resume = || -> Result<()> {
        update(&["State=RESUME"])?;
        ctld.wait_node_idle("d1", WAIT).map(drop)
    };

    write("idle")?;
    let multi = ctld.scontrol_ok(&["show", "node", "d1"])?;
    std::fs::write(dir.join("scontrol-show-node-idle-multiline.txt"), multi)?;

    // The agent's drain, then its lift: what the record keeps.
    update(&[
        "State=DRAIN",
        "Reason=slurm-node-agent/spot@i-0123456789abcdef0: spot interruption notice: terminate at 2026-12-01T20:00:00Z",
    ])?;
    settle();
    write("drained")?;
    resume()?;
    write("resumed")?;

    // An admin's drain with two spaces in its reason.
    update(&["State=DRAIN", "Reason=ADMIN  SHUTDOWN"])?;
    settle();
    write("admin-drain")?;
    resume()?;

    update(&["State=FAIL", "Reason=bad_dimm"])?;
    settle();
    write("fail")?;
    resume()?;

    // A reboot asked for with a reason (the node is idle: slurmctld issues it at once).
    ctld.scontrol_ok(&["reboot", "nextstate=resume", "reason=kernel_update", "d1"])?;
    settle();
    write("reboot-issued")?;

    d1.daemon().stop()?;
    update(&["State=DOWN", "Reason=admin_down"])?;
    settle();
    write("down")?;

    // JSON where the version has it (scontrol --json from 23.02).
    if v.at_least(23, 2) {
        let j = ctld.scontrol_ok(&["show", "node", "--json", "d1"])?;
        std::fs::write(dir.join("scontrol-show-node-json-down.json"), j)?;
    }
    let j = ctld.scontrol_ok(&["show", "node", "-o", "nosuchnode"]);
    if j.is_ok() {
        bail!("scontrol show node of an unknown node succeeded");
    }
    std::fs::write(
        dir.join("CAPTURED.md"),
        format!(
            "Captured from the real daemons of Slurm {v} (built from SchedMD's pinned tarball by\n\
             scripts/slurm-build.sh) by `scripts/slurm-fixtures.sh`: a slurmctld, a dynamic slurmd\n\
             `d1`{}, driven through each state with `scontrol update` and\n\
             `scontrol reboot` (RebootProgram=/bin/true). `resumed` is `d1` after the agent's drain\n\
             and `State=RESUME`. Times, loads and host names are as captured.\n",
            if v.has_instance_fields() {
                " (with `--instance-id i-0123456789abcdef0 --instance-type m5.large`)"
            } else {
                ""
            }
        ),
    )?;
    Ok(dir)
}
