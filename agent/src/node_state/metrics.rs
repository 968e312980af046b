//! The drain metrics as a Prometheus textfile (node_exporter's textfile collector), written
//! atomically after every saved change:
//!
//! ```text
//! slurm_node_agent_drain_phase{phase="draining"} 1           # one line per phase, 0 or 1
//! slurm_node_agent_drain_transitions_total{from="active",to="draining"} 3
//! slurm_node_agent_drain_cause{kind="spot"} 1                # the current cause, if any
//! slurm_node_agent_drain_phase_since_seconds 1.7e9           # Unix time of the last transition
//! slurm_node_agent_drain_action_failures 0
//! ```

use std::fmt::Write as _;
use std::path::Path;

use super::state::{DrainState, Phase};

/// Renders the textfile.
pub fn render(st: &DrainState) -> String {
    let mut out = String::new();
    out.push_str("# HELP slurm_node_agent_drain_phase Current phase of the drain state machine.\n");
    out.push_str("# TYPE slurm_node_agent_drain_phase gauge\n");
    for p in Phase::ALL {
        let v = u8::from(st.phase == p);
        let _ = writeln!(
            out,
            "slurm_node_agent_drain_phase{{phase=\"{}\"}} {v}",
            p.as_str()
        );
    }
    out.push_str(
        "# HELP slurm_node_agent_drain_transitions_total Transitions of the drain state machine.\n",
    );
    out.push_str("# TYPE slurm_node_agent_drain_transitions_total counter\n");
    for (k, n) in &st.transitions {
        if let Some((from, to)) = k.split_once("->") {
            let _ = writeln!(
                out,
                "slurm_node_agent_drain_transitions_total{{from=\"{from}\",to=\"{to}\"}} {n}"
            );
        }
    }
    out.push_str("# HELP slurm_node_agent_drain_cause Cause of the drain in progress.\n");
    out.push_str("# TYPE slurm_node_agent_drain_cause gauge\n");
    if let Some(c) = &st.cause {
        let _ = writeln!(
            out,
            "slurm_node_agent_drain_cause{{kind=\"{}\"}} 1",
            c.kind()
        );
    }
    out.push_str(
        "# HELP slurm_node_agent_drain_phase_since_seconds Unix time the phase was entered.\n",
    );
    out.push_str("# TYPE slurm_node_agent_drain_phase_since_seconds gauge\n");
    let _ = writeln!(
        out,
        "slurm_node_agent_drain_phase_since_seconds {}",
        st.since
    );
    out.push_str(
        "# HELP slurm_node_agent_drain_action_failures Failed attempts of the current action.\n",
    );
    out.push_str("# TYPE slurm_node_agent_drain_action_failures gauge\n");
    let _ = writeln!(
        out,
        "slurm_node_agent_drain_action_failures {}",
        st.action_attempts
    );
    out
}

/// Writes the textfile; a failure is logged, never fatal (metrics must not stop a drain).
pub fn write(path: &Path, st: &DrainState) {
    if path.as_os_str().is_empty() {
        return;
    }
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Err(e) = crate::fsutil::write_atomic(path, render(st).as_bytes(), 0o644, None) {
        tracing::warn!("drain metrics: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node_state::state::Cause;

    #[test]
    fn renders_phase_cause_and_counters() {
        let mut st = DrainState::default();
        st.begin(Cause::Rebalance { notice_time: 1 }, None, 42);
        let t = render(&st);
        assert!(
            t.contains("slurm_node_agent_drain_phase{phase=\"draining\"} 1\n"),
            "{t}"
        );
        assert!(
            t.contains("slurm_node_agent_drain_phase{phase=\"active\"} 0\n"),
            "{t}"
        );
        assert!(t.contains(
            "slurm_node_agent_drain_transitions_total{from=\"active\",to=\"draining\"} 1\n"
        ));
        assert!(t.contains("slurm_node_agent_drain_cause{kind=\"rebalance\"} 1\n"));
        assert!(t.contains("slurm_node_agent_drain_phase_since_seconds 42\n"));
    }
}
