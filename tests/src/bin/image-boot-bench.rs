//! Image boot benchmark (`scripts/bench-image-boot.sh`, issue 14): the locally built image
//! booted as one node of the fleet proving ground, with its services enabled (chrony, the
//! node agent's units, munge, slurmd; amazon-ssm-agent and the CloudWatch agent only where
//! the build could fetch them). Prints, never asserts:
//! - `systemd-analyze time` inside the node (boot to `multi-user.target`);
//! - the slowest units (`systemd-analyze blame`, first N lines);
//! - the critical chain of `multi-user.target`;
//! - which of the operator services are enabled in this image.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use slurm_e2e::fleet::Fleet;

fn main() -> ExitCode {
    let top = std::env::args()
        .nth(1)
        .and_then(|a| a.parse::<usize>().ok())
        .unwrap_or(10);
    match bench(top) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("image boot bench failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn exec_text(fleet: &Fleet, node: &str, program: &str, args: &[&str]) -> Result<String> {
    let out = fleet.exec(node, program, args)?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn bench(top: usize) -> Result<()> {
    let mut fleet = Fleet::builder().start()?;
    let node = "boot001";
    fleet.launch_all(&[node])?;
    let state = fleet.wait_booted(node, Duration::from_secs(600))?;
    fleet.wait_all_idle(&[node.to_string()], Duration::from_secs(600))?;
    println!("image boot benchmark: one node of the fleet proving ground; system state {state}");
    // `systemd-analyze time` needs the boot to be finished, which wait_booted saw.
    let time =
        exec_text(&fleet, node, "systemd-analyze", &["time"]).context("systemd-analyze time")?;
    for l in time.lines().filter(|l| !l.trim().is_empty()) {
        println!("  {l}");
    }
    println!("slowest units (systemd-analyze blame, first {top}):");
    let blame = exec_text(&fleet, node, "systemd-analyze", &["blame", "--no-pager"])?;
    for l in blame.lines().take(top) {
        println!("  {}", l.trim());
    }
    println!("critical chain of multi-user.target:");
    let chain = exec_text(
        &fleet,
        node,
        "systemd-analyze",
        &["critical-chain", "--no-pager", "multi-user.target"],
    )?;
    for l in chain
        .lines()
        .skip_while(|l| !l.contains("multi-user.target"))
    {
        println!("  {l}");
    }
    println!("operator services in this image:");
    for unit in [
        "chrony.service",
        "amazon-ssm-agent.service",
        "amazon-cloudwatch-agent.service",
        "prometheus-node-exporter.service",
        "munge.service",
        "slurmd.service",
        "slurm-node-agent-bootstrap.service",
        "slurm-node-agent.service",
    ] {
        let enabled = exec_text(&fleet, node, "systemctl", &["is-enabled", unit])?;
        let enabled = enabled.trim();
        println!(
            "  {unit}: {}",
            if enabled.is_empty() {
                "not installed"
            } else {
                enabled
            }
        );
    }
    Ok(())
}
