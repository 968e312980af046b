//! Report formats: human text, JSON (one object per check), and the Prometheus text
//! exposition format for node_exporter's textfile collector, written atomically.

use std::fmt::Write as _;
use std::path::Path;

use super::{ActOutcome, Report, Status};
use crate::textfile::escape_label;

/// Human text: one line per check, then notes and the action.
pub fn text(
    report: &Report,
    action: Option<&ActOutcome>,
    slurmd: Option<&crate::slurm::healthcheck::SlurmdRuns>,
) -> String {
    let mut s = String::new();
    for r in &report.results {
        let tag = match (r.status, r.fatal) {
            (Status::Pass, _) => "PASS",
            (Status::Fail, true) => "FAIL",
            (Status::Timeout, true) => "TIMEOUT",
            (_, false) => "WARN",
        };
        let _ = writeln!(
            s,
            "{tag:<7} {:>8.2} ms  {}  ({})\n        {}",
            r.duration_ms, r.name, r.origin, r.message
        );
    }
    for n in &report.notes {
        let _ = writeln!(s, "note: {n}");
    }
    let failed = report.failures().count();
    let _ = writeln!(
        s,
        "{}: {} checks, {} failed, {:.2} ms",
        report.node.as_deref().unwrap_or("(node name unknown)"),
        report.results.len(),
        failed,
        report.duration_ms
    );
    if let Some(r) = slurmd {
        let _ = writeln!(s, "slurmd: {} ({})", r.summary, r.conf.display());
    }
    if let Some(a) = action {
        let _ = writeln!(s, "action: {}", a.summary());
    }
    s
}

/// JSON: `{"node", "healthy", "duration_ms", "checks": [one object per check], "notes",
/// "slurmd", "action"}`; `duration_ms` (run and checks) are whole milliseconds; `slurmd`
/// says how slurmd runs the HealthCheckProgram on this node
/// ([`crate::slurm::healthcheck::SlurmdRuns`]: `runs` is `never`, `at_start_and_interval`,
/// `start_only`, `reboot_only` or `refused`), `null` when no slurm.conf was found.
pub fn json(
    report: &Report,
    action: Option<&ActOutcome>,
    slurmd: Option<&crate::slurm::healthcheck::SlurmdRuns>,
) -> String {
    serde_json::json!({
        "node": report.node,
        "healthy": report.healthy(),
        "started_unix": report.started_unix,
        "duration_ms": report.duration_ms.max(0.0).round() as u64,
        "checks": report.results,
        "notes": report.notes,
        "slurmd": slurmd,
        "action": action,
    })
    .to_string()
}

/// Prometheus text format (version 0.0.4).
pub fn prometheus(report: &Report) -> String {
    let mut s = String::new();
    let node = escape_label(report.node.as_deref().unwrap_or(""));
    let metric = |s: &mut String, name: &str, help: &str, kind: &str| {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    metric(
        &mut s,
        "slurm_node_agent_health_check_ok",
        "1 when the health check passed, 0 when it failed or timed out.",
        "gauge",
    );
    for r in &report.results {
        let _ = writeln!(
            s,
            "slurm_node_agent_health_check_ok{{node=\"{node}\",check=\"{}\",family=\"{}\",origin=\"{}\",fatal=\"{}\"}} {}",
            escape_label(&r.name),
            r.family,
            escape_label(&r.origin),
            r.fatal,
            u8::from(r.status == Status::Pass)
        );
    }
    metric(
        &mut s,
        "slurm_node_agent_health_check_timed_out",
        "1 when the health check did not answer within its timeout.",
        "gauge",
    );
    for r in &report.results {
        let _ = writeln!(
            s,
            "slurm_node_agent_health_check_timed_out{{node=\"{node}\",check=\"{}\",origin=\"{}\"}} {}",
            escape_label(&r.name),
            escape_label(&r.origin),
            u8::from(r.status == Status::Timeout)
        );
    }
    metric(
        &mut s,
        "slurm_node_agent_health_check_duration_seconds",
        "Wall time of the health check.",
        "gauge",
    );
    for r in &report.results {
        let _ = writeln!(
            s,
            "slurm_node_agent_health_check_duration_seconds{{node=\"{node}\",check=\"{}\",origin=\"{}\"}} {:.6}",
            escape_label(&r.name),
            escape_label(&r.origin),
            r.duration_ms / 1000.0
        );
    }
    metric(
        &mut s,
        "slurm_node_agent_health_healthy",
        "1 when no fatal health check failed.",
        "gauge",
    );
    let _ = writeln!(
        s,
        "slurm_node_agent_health_healthy{{node=\"{node}\"}} {}",
        u8::from(report.healthy())
    );
    metric(
        &mut s,
        "slurm_node_agent_health_last_run_timestamp_seconds",
        "Unix time the last health check run started.",
        "gauge",
    );
    let _ = writeln!(
        s,
        "slurm_node_agent_health_last_run_timestamp_seconds{{node=\"{node}\"}} {:.3}",
        report.started_unix
    );
    metric(
        &mut s,
        "slurm_node_agent_health_run_duration_seconds",
        "Wall time of the last health check run.",
        "gauge",
    );
    let _ = writeln!(
        s,
        "slurm_node_agent_health_run_duration_seconds{{node=\"{node}\"}} {:.6}",
        report.duration_ms / 1000.0
    );
    s
}

/// Writes [`prometheus`] to `path` atomically (mode 0644), so node_exporter never reads
/// a half-written file.
///
/// # Errors
/// [`crate::fsutil::WriteError`].
pub fn write_prometheus(report: &Report, path: &Path) -> Result<(), crate::fsutil::WriteError> {
    crate::fsutil::write_atomic(path, prometheus(report).as_bytes(), 0o644, None)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::health::CheckResult;

    fn report() -> Report {
        Report {
            node: Some("n1".into()),
            results: vec![
                CheckResult {
                    name: "check_file_contents /etc/os-release 'ID=\"debian\"'".into(),
                    family: "file".into(),
                    origin: "/etc/nhc/nhc.conf:3".into(),
                    status: Status::Pass,
                    fatal: true,
                    message: "ok".into(),
                    duration_ms: 0.5,
                },
                CheckResult {
                    name: "mount /fsx".into(),
                    family: "mount".into(),
                    origin: "/etc/slurm-node-agent/checks.d/a.toml:1".into(),
                    status: Status::Timeout,
                    fatal: true,
                    message: "hung".into(),
                    duration_ms: 5000.0,
                },
            ],
            notes: vec![],
            started_unix: 1.5,
            duration_ms: 5000.5,
        }
    }

    #[test]
    fn prometheus_lines_are_well_formed() {
        let p = prometheus(&report());
        assert!(
            p.contains("check=\"check_file_contents /etc/os-release 'ID=\\\"debian\\\"'\""),
            "{p}"
        );
        assert!(p.contains(
            "slurm_node_agent_health_check_timed_out{node=\"n1\",check=\"mount /fsx\",origin=\"/etc/slurm-node-agent/checks.d/a.toml:1\"} 1"
        ));
        // Every series is unique (node_exporter refuses a textfile with duplicates), also
        // for two checks of the same name on different lines.
        let mut twice = report();
        let mut again = twice.results[0].clone();
        again.origin = "/etc/nhc/nhc.conf:4".into();
        twice.results.push(again);
        let p2 = prometheus(&twice);
        let series: Vec<&str> = p2
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.rsplit_once(' ').unwrap().0)
            .collect();
        let unique: std::collections::BTreeSet<&&str> = series.iter().collect();
        assert_eq!(unique.len(), series.len(), "{p2}");
        assert!(p.contains("slurm_node_agent_health_healthy{node=\"n1\"} 0"));
        for line in p.lines().filter(|l| !l.starts_with('#')) {
            let (_, value) = line.rsplit_once(' ').unwrap();
            value.parse::<f64>().unwrap();
        }
    }

    #[test]
    fn json_has_one_object_per_check() {
        let v: serde_json::Value = serde_json::from_str(&json(&report(), None, None)).unwrap();
        assert_eq!(v["checks"].as_array().unwrap().len(), 2);
        assert_eq!(v["checks"][1]["status"], "timeout");
        assert_eq!(v["healthy"], false);
        assert!(v["slurmd"].is_null());
    }

    #[test]
    fn how_slurmd_runs_it_is_in_text_and_json() {
        let runs = crate::slurm::healthcheck::HealthCheckConf::parse(
            Path::new("/run/slurm/conf/slurm.conf"),
            "HealthCheckProgram=/usr/local/bin/slurm-node-agent-healthcheck
HealthCheckNodeState=START_ONLY
",
        )
        .runs(crate::slurm::SlurmVersion::parse("25.11.6"));
        let t = text(&report(), None, Some(&runs));
        assert!(
            t.contains("\nslurmd: slurmd runs /usr/local/bin/slurm-node-agent-healthcheck only at its start")
                && t.contains("(/run/slurm/conf/slurm.conf)\n"),
            "{t}"
        );
        let v: serde_json::Value =
            serde_json::from_str(&json(&report(), None, Some(&runs))).unwrap();
        assert_eq!(v["slurmd"]["runs"], "start_only");
        assert_eq!(v["slurmd"]["node_state"], "START_ONLY");
    }

    #[test]
    fn textfile_is_written_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("agent.prom");
        write_prometheus(&report(), &p).unwrap();
        assert!(std::fs::read_to_string(&p)
            .unwrap()
            .contains("slurm_node_agent_health_check_ok"));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
