//! Every Prometheus textfile the agent writes passes `promtool check metrics` (Prometheus's
//! own linter, Debian's `prometheus` package): the health checks' (from a real run of
//! checks, one failing with quotes and a newline in its message), the drain state
//! machine's, the repair record's, bootstrap's and the daemon's, each with the families
//! every textfile carries (build info, throttled AWS calls). The end-to-end tests run the
//! same check on the textfiles the agent wrote there (`slurm_e2e::assert_promtool`).
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use slurm_node_agent::drain::{Cause, DrainState, Phase};
use slurm_node_agent::health::{self, nhc, RunEnv};

/// `promtool check metrics` on `text`: its exit status and what it said.
fn promtool(text: &str) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package; scripts/test-deps.sh installs it)");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success() && said.trim().is_empty(), said)
}

fn assert_clean(name: &str, text: &str) {
    let (ok, said) = promtool(text);
    assert!(ok, "promtool on {name}:\n{said}\n--- the textfile:\n{text}");
}

#[test]
fn promtool_catches_a_bad_textfile() {
    // The check can fail: a counter without _total and a sample of no declared family.
    let (ok, said) = promtool("# HELP x_seconds a\n# TYPE x_seconds counter\nx_seconds 1\n");
    assert!(!ok, "{said}");
    assert!(said.contains("_total"), "{said}");
}

#[tokio::test]
async fn health_textfile_of_a_real_run() {
    let checks = nhc::parse(
        "* || check_cmd_output -m '/Linux/' uname -s\n\
         * || check_file_test -r /nope/\"quoted\"\n",
        Path::new("/test/nhc.conf"),
        Some("node\"1"),
        &nhc::Defaults {
            timeout: Duration::from_secs(10),
            slurm_bin_dir: std::path::PathBuf::new(),
        },
    )
    .unwrap();
    let report = health::run_checks(&checks, &RunEnv::default()).await;
    assert!(!report.healthy());
    assert_clean("health.prom", &health::output::prometheus(&report));
}

#[test]
fn drain_textfile_in_every_phase() {
    let mut st = DrainState::default();
    assert_clean(
        "drain.prom (active)",
        &slurm_node_agent::drain::metrics::render(&st),
    );
    st.phase = Phase::Draining;
    st.cause = Some(Cause::Manual {
        reason: "bad \"DIMM\"\nslot 3".into(),
    });
    st.transitions.insert("active->draining".into(), 2);
    st.transitions.insert("draining->drained".into(), 1);
    assert_clean(
        "drain.prom (draining)",
        &slurm_node_agent::drain::metrics::render(&st),
    );
}

#[test]
fn repair_textfile() {
    let mut r = slurm_node_agent::repair::record::Record::default();
    r.planned.insert("on/replace/gpu_lost".into(), 2);
    r.planned.insert("report/reboot/gpu_row_remap".into(), 1);
    assert_clean("repair.prom", &r.render());
}

#[test]
fn bootstrap_textfile_of_a_failed_and_a_good_run() {
    use slurm_node_agent::bootstrap::{metrics, Progress, Step};
    slurm_node_agent::textfile::note_throttled("ssm:GetParameter");
    let mut p = Progress {
        steps: vec![Step {
            name: "settings",
            duration_ms: 3,
        }],
        metrics_file: None,
        slurm_release: None,
        gate: None,
    };
    assert_clean(
        "bootstrap.prom (failed)",
        &metrics::render(&p, 69, 1.5, 1_800_000_000),
    );
    p.steps.push(Step {
        name: "join",
        duration_ms: 2400,
    });
    p.slurm_release = Some("25.11.7".into());
    use slurm_node_agent::health::startgate::{GateRecord, Part, PartStatus};
    let part = |name: &str, status, ended| Part {
        name: name.into(),
        status,
        message: "a \"quoted\" word".into(),
        budget_s: 600,
        started_unix: 1_800_000_000,
        ended_unix: ended,
    };
    p.gate = Some(GateRecord {
        boot_id: "b".into(),
        instance_id: "i-0".into(),
        started_unix: 1_800_000_000,
        deadline_unix: 1_800_001_200,
        parts: vec![
            part("dcgm", PartStatus::Running, None),
            part("nccl \"one node\"", PartStatus::Running, None),
        ],
    });
    assert_clean(
        "bootstrap.prom (gate running)",
        &metrics::render(&p, 0, 2.403, 1_800_000_000),
    );
    p.gate = Some(GateRecord {
        parts: vec![
            part("dcgm", PartStatus::Failed, Some(1_800_000_095)),
            part("nccl \"one node\"", PartStatus::Passed, Some(1_800_000_100)),
        ],
        ..p.gate.clone().unwrap()
    });
    let text = metrics::render(&p, 0, 2.403, 1_800_000_000);
    assert!(
        text.contains("slurm_node_agent_start_gate_passed 0\n"),
        "{text}"
    );
    assert!(
        text.contains("slurm_node_agent_start_gate_part_duration_seconds{part=\"dcgm\"} 95\n"),
        "{text}"
    );
    assert_clean("bootstrap.prom", &text);
}

#[test]
fn daemon_textfile() {
    use slurm_node_agent::daemon::metrics::{AgentMetrics, Notices};
    use slurm_node_agent::rollout::check::Check;
    let s = slurm_node_agent::settings::Settings::default();
    let mut m = AgentMetrics::new(&s, "25.11.7".into());
    let mut notices = Notices::default();
    assert_clean("agent.prom (start)", &m.render(&notices));
    assert!(notices.saw(&Cause::Spot {
        action: "terminate".into(),
        time: 1_800_000_000
    }));
    assert!(!notices.saw(&Cause::Spot {
        action: "terminate".into(),
        time: 1_800_000_000
    }));
    m.upgrade(
        &Check::Started {
            current: "ami-1".into(),
            desired: "ami-2".into(),
        },
        1_800_000_000,
    );
    let text = m.render(&notices);
    assert!(
        text.contains("slurm_node_agent_notices_seen_total{kind=\"spot\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("slurm_node_agent_upgrade_state{state=\"started\"} 1\n"),
        "{text}"
    );
    assert_clean("agent.prom", &text);
}
