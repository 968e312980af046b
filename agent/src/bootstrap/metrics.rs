//! Bootstrap's Prometheus textfile, `bootstrap.prom` beside the drain metrics (the folder of
//! `drain.metrics_file`, `<state_dir>` by default), written at the end of every run,
//! failed ones included:
//!
//! ```text
//! slurm_node_agent_bootstrap_step_duration_seconds{step="auth_key"} 0.412
//! slurm_node_agent_bootstrap_duration_seconds 3.118          # the whole run
//! slurm_node_agent_bootstrap_success 1                        # 0 when it failed
//! slurm_node_agent_bootstrap_exit_code 0                      # docs/exit-codes.md
//! slurm_node_agent_bootstrap_last_run_timestamp_seconds 1.8e9 # Unix time the run ended
//! slurm_node_agent_start_gate_passed 1                        # when the gate ran
//! slurm_node_agent_start_gate_part_status{part="dcgm",status="passed"} 1
//! slurm_node_agent_start_gate_part_duration_seconds{part="dcgm"} 95
//! slurm_node_agent_build_info{version=,commit=,slurm_release=} 1
//! slurm_node_agent_aws_throttled_total{api="ssm:GetParameter"} 2
//! ```

use std::path::{Path, PathBuf};

use super::Progress;
use crate::settings::Settings;
use crate::textfile::{Kind, Textfile};

/// The file's name.
pub const FILE: &str = "bootstrap.prom";

/// `bootstrap.prom` in the folder of the drain metrics.
pub fn path(s: &Settings) -> PathBuf {
    let drain = crate::node_state::metrics_path(&s.agent.state_dir, &s.drain.metrics_file);
    drain.parent().unwrap_or_else(|| Path::new(".")).join(FILE)
}

/// Renders the textfile of a run that ended with `exit_code` (0: success) after `total_s`
/// seconds, at Unix time `now`.
pub fn render(p: &Progress, exit_code: i32, total_s: f64, now: i64) -> String {
    let mut t = Textfile::new();
    let name = "slurm_node_agent_bootstrap_step_duration_seconds";
    t.family(
        name,
        "Wall time of each bootstrap step of the last run.",
        Kind::Gauge,
    );
    for s in &p.steps {
        #[allow(clippy::cast_precision_loss)]
        t.sample(name, &[("step", s.name)], s.duration_ms as f64 / 1000.0);
    }
    let name = "slurm_node_agent_bootstrap_duration_seconds";
    t.family(name, "Wall time of the last bootstrap run.", Kind::Gauge)
        .sample(name, &[], total_s);
    let name = "slurm_node_agent_bootstrap_success";
    t.family(
        name,
        "1 when the last bootstrap run succeeded.",
        Kind::Gauge,
    )
    .sample(name, &[], f64::from(u8::from(exit_code == 0)));
    let name = "slurm_node_agent_bootstrap_exit_code";
    t.family(
        name,
        "Exit status of the last bootstrap run (docs/exit-codes.md).",
        Kind::Gauge,
    )
    .sample(name, &[], f64::from(exit_code));
    let name = "slurm_node_agent_bootstrap_last_run_timestamp_seconds";
    #[allow(clippy::cast_precision_loss)]
    t.family(name, "Unix time the last bootstrap run ended.", Kind::Gauge)
        .sample(name, &[], now as f64);
    if let Some(g) = &p.gate {
        let name = "slurm_node_agent_start_gate_passed";
        t.family(
            name,
            "1 when the start-up gate of this boot passed (every part passed or was skipped).",
            Kind::Gauge,
        )
        .sample(name, &[], f64::from(u8::from(g.passed())));
        let name = "slurm_node_agent_start_gate_part_status";
        t.family(
            name,
            "The start-up gate's parts (dcgm, or a site command) by their status (1).",
            Kind::Gauge,
        );
        for part in &g.parts {
            t.sample(
                name,
                &[("part", &part.name), ("status", part.status.as_str())],
                1.0,
            );
        }
        let name = "slurm_node_agent_start_gate_part_duration_seconds";
        t.family(
            name,
            "Wall time of each part of the start-up gate.",
            Kind::Gauge,
        );
        for part in &g.parts {
            if let Some(end) = part.ended_unix {
                #[allow(clippy::cast_precision_loss)]
                t.sample(
                    name,
                    &[("part", &part.name)],
                    (end - part.started_unix).max(0) as f64,
                );
            }
        }
    }
    t.build_info(p.slurm_release.as_deref().unwrap_or(""));
    t.aws_throttled();
    t.finish()
}

/// Writes the textfile when the run got as far as its settings; a failure to write is a
/// warning (metrics never change bootstrap's outcome).
pub fn write(p: &Progress, exit_code: i32, total_s: f64) {
    let Some(path) = &p.metrics_file else {
        return;
    };
    let text = render(p, exit_code, total_s, crate::time::now());
    if let Err(e) = crate::textfile::write(path, &text) {
        tracing::warn!("bootstrap metrics not written: {e}");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::bootstrap::Step;

    #[test]
    fn a_failed_run_keeps_its_steps_and_exit_code() {
        let p = Progress {
            steps: vec![
                Step {
                    name: "settings",
                    duration_ms: 12,
                },
                Step {
                    name: "instance_metadata",
                    duration_ms: 1500,
                },
            ],
            metrics_file: None,
            slurm_release: Some("25.11.7".into()),
            gate: None,
        };
        let text = render(&p, 69, 1.52, 1_800_000_000);
        assert!(text.contains("slurm_node_agent_bootstrap_step_duration_seconds{step=\"instance_metadata\"} 1.5\n"), "{text}");
        assert!(
            text.contains("slurm_node_agent_bootstrap_success 0\n"),
            "{text}"
        );
        assert!(
            text.contains("slurm_node_agent_bootstrap_exit_code 69\n"),
            "{text}"
        );
        assert!(text.contains("slurm_release=\"25.11.7\"} 1\n"), "{text}");
    }
}
