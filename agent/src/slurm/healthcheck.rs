//! How slurmd runs the `HealthCheckProgram`, as the node's slurm.conf and slurmd's release
//! say (slurm.conf(5): `HealthCheckProgram`, `HealthCheckInterval`, `HealthCheckNodeState`).
//!
//! What Slurm does, read from SchedMD's sources (25.11.6, 26.05.3) and checked against the
//! real 25.11 daemons:
//! - slurmd runs the program once at its own start, before it registers with slurmctld
//!   (`slurmd.c`: `run_script_health_check` before `_registration_engine`), when
//!   `HealthCheckInterval` is set or the state is `START_ONLY`; it ignores the exit
//!   status. A dynamic node's first start has no record in slurmctld yet, so that run
//!   cannot drain it; a pre-declared node's record (`UNKNOWN`) or a stale one can be
//!   drained, and the DRAIN flag stays through the registration.
//! - With `HealthCheckInterval` set, slurmctld asks every interval (`controller.c`,
//!   `ping_nodes.c`: `run_health_check`) on nodes in the listed states.
//! - `START_ONLY` (25.11+): the start run only ([`SlurmVersion::has_health_check_start_only`]).
//! - `REBOOT_ONLY` (26.05+): one run when a node that `scontrol reboot` rebooted registers
//!   again, after that registration, and no start run
//!   ([`SlurmVersion::has_health_check_reboot_only`]).
//! - 26.05 refuses either combined with another word
//!   ([`SlurmVersion::refuses_combined_health_check_only`]).
//!
//! The agent's side of it (a failing start run recorded and drained by bootstrap once
//! slurmd has registered) is the health module's (`health::act`).

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{conf_value, SlurmVersion};

/// The HealthCheckProgram settings of one slurm.conf.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HealthCheckConf {
    /// The slurm.conf read.
    pub conf: PathBuf,
    /// `HealthCheckProgram` (`None`: not set, slurmd runs nothing).
    pub program: Option<String>,
    /// `HealthCheckInterval` in seconds (0 or unset: slurmctld never asks).
    pub interval_s: u64,
    /// `HealthCheckNodeState` as written (empty: unset, Slurm's default `ANY`).
    pub node_state: String,
    /// `SlurmctldParameters` names `health_check_report` (26.05: slurmctld's runs pass
    /// `SLURM_NODE_IS_HEALTHY`, [`SlurmVersion::has_node_health_hint`]).
    pub report_health: bool,
}

/// slurm.conf could not be read.
#[derive(Debug, thiserror::Error)]
#[error("reading {}: {source}", path.display())]
pub struct ConfReadError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    #[source]
    pub source: std::io::Error,
}

/// When slurmd runs the program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Runs {
    /// Never: no `HealthCheckProgram`, or no interval and no `*_ONLY` state.
    Never,
    /// At slurmd's start (before it registers), then every `HealthCheckInterval` on nodes
    /// in the listed states.
    AtStartAndInterval,
    /// Only at slurmd's start, before it registers (`START_ONLY`).
    StartOnly,
    /// Only when the node registers again after `scontrol reboot` (`REBOOT_ONLY`).
    RebootOnly,
    /// slurmctld and slurmd refuse this slurm.conf (a `*_ONLY` word combined, 26.05+).
    Refused,
}

/// How slurmd runs the program on this node: [`HealthCheckConf::runs`]. Serialized as is
/// in `check --output json` (`"slurmd"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SlurmdRuns {
    /// The slurm.conf read.
    pub conf: PathBuf,
    /// `HealthCheckProgram`.
    pub program: Option<String>,
    /// `HealthCheckInterval`, seconds.
    pub interval_s: u64,
    /// `HealthCheckNodeState` as written (empty: `ANY`).
    pub node_state: String,
    /// slurmd's release, when it was read (only where it changes the answer).
    pub slurmd_version: Option<String>,
    /// When slurmd runs it.
    pub runs: Runs,
    /// The node states of periodic runs (`ANY`, `IDLE`...; empty unless periodic).
    pub states: Vec<String>,
    /// `HealthCheckNodeState` words this slurmd ignores (too new for it).
    pub ignored: Vec<String>,
    /// Runs slurmctld asks for carry `SLURM_NODE_IS_HEALTHY`.
    pub node_health_hint: bool,
    /// One line for people.
    pub summary: String,
}

const START_ONLY: &str = "START_ONLY";
const REBOOT_ONLY: &str = "REBOOT_ONLY";

impl HealthCheckConf {
    /// Reads the settings from slurm.conf text ([`conf_value`]: whole-line parameters, the
    /// last one wins, keys in any case) of the file `conf`.
    pub fn parse(conf: &Path, text: &str) -> HealthCheckConf {
        let program = conf_value(text, "HealthCheckProgram").filter(|p| !p.is_empty());
        let interval_s = conf_value(text, "HealthCheckInterval")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let node_state = conf_value(text, "HealthCheckNodeState").unwrap_or_default();
        let report_health = conf_value(text, "SlurmctldParameters").is_some_and(|v| {
            v.split(',')
                .any(|w| w.trim().eq_ignore_ascii_case("health_check_report"))
        });
        HealthCheckConf {
            conf: conf.to_path_buf(),
            program,
            interval_s,
            node_state,
            report_health,
        }
    }

    /// Reads slurm.conf at `conf`.
    ///
    /// # Errors
    /// [`ConfReadError`] when the file cannot be read.
    pub fn read(conf: &Path) -> Result<HealthCheckConf, ConfReadError> {
        let text = std::fs::read_to_string(conf).map_err(|source| ConfReadError {
            path: conf.to_path_buf(),
            source,
        })?;
        Ok(HealthCheckConf::parse(conf, &text))
    }

    /// The `HealthCheckNodeState` words, upper case, as Slurm splits them (`,`).
    fn words(&self) -> Vec<String> {
        self.node_state
            .split(',')
            .map(|w| w.trim().to_ascii_uppercase())
            .filter(|w| !w.is_empty())
            .collect()
    }

    /// Whether slurmd's release changes what [`HealthCheckConf::runs`] says: a `*_ONLY`
    /// word, or `health_check_report`. Callers read `slurmd -V` only then.
    pub fn depends_on_version(&self) -> bool {
        self.report_health
            || self
                .words()
                .iter()
                .any(|w| w == START_ONLY || w == REBOOT_ONLY)
    }

    /// When slurmd `version` runs the program (`None`: the release is not known, read as
    /// the newest: both `*_ONLY` words exist and may not be combined). Words a release does
    /// not know are ignored as Slurm ignores them (`_health_node_state`: "Invalid
    /// HealthCheckNodeState value ... ignored"), so `REBOOT_ONLY` on 25.11 with an interval
    /// is a run every interval on nodes in any state.
    pub fn runs(&self, version: Option<SlurmVersion>) -> SlurmdRuns {
        let knows = |w: &str| match w {
            "ANY" | "ALLOC" | "CYCLE" | "IDLE" | "MIXED" | "NONDRAINED_IDLE" => true,
            START_ONLY => version.is_none_or(SlurmVersion::has_health_check_start_only),
            REBOOT_ONLY => version.is_none_or(SlurmVersion::has_health_check_reboot_only),
            _ => false,
        };
        let (known, ignored): (Vec<String>, Vec<String>) =
            self.words().into_iter().partition(|w| knows(w));
        let start = known.iter().any(|w| w == START_ONLY);
        let reboot = known.iter().any(|w| w == REBOOT_ONLY);
        let refuses = version.is_none_or(SlurmVersion::refuses_combined_health_check_only);
        let mut states = Vec::new();
        let (runs, why) = if self.program.is_none() {
            (Runs::Never, "no HealthCheckProgram".to_string())
        } else if (start || reboot) && known.len() > 1 && refuses {
            (
                Runs::Refused,
                format!(
                    "HealthCheckNodeState={}: {} cannot be combined with other words",
                    self.node_state,
                    if start { START_ONLY } else { REBOOT_ONLY }
                ),
            )
        } else if reboot {
            (Runs::RebootOnly, String::new())
        } else if start {
            (Runs::StartOnly, String::new())
        } else if self.interval_s == 0 {
            (
                Runs::Never,
                "HealthCheckInterval is 0 or unset and HealthCheckNodeState has no START_ONLY or REBOOT_ONLY"
                    .to_string(),
            )
        } else {
            states = known.iter().filter(|w| *w != "CYCLE").cloned().collect();
            if states.is_empty() {
                states.push("ANY".into());
            }
            (Runs::AtStartAndInterval, String::new())
        };
        let node_health_hint = self.report_health
            && version.is_none_or(SlurmVersion::has_node_health_hint)
            && matches!(runs, Runs::AtStartAndInterval | Runs::RebootOnly);
        let program = self.program.as_deref().unwrap_or("HealthCheckProgram");
        let mut summary = match runs {
            Runs::Never => format!("slurmd never runs a HealthCheckProgram ({why})"),
            Runs::Refused => format!("slurmctld and slurmd refuse this slurm.conf ({why})"),
            Runs::AtStartAndInterval => format!(
                "slurmd runs {program} at its start, before it registers, and every {} s on nodes in state {}{}",
                self.interval_s,
                states.join(","),
                if known.iter().any(|w| w == "CYCLE") {
                    ", a share of the nodes at a time (CYCLE)"
                } else {
                    ""
                }
            ),
            Runs::StartOnly => format!(
                "slurmd runs {program} only at its start, before it registers (START_ONLY): \
                 a failure then is drained by bootstrap once slurmd has registered; the \
                 daemon's health loop or the next slurmd start lifts the drain"
            ),
            Runs::RebootOnly => format!(
                "slurmd runs {program} only when the node registers after `scontrol reboot` \
                 (REBOOT_ONLY); the daemon's health loop or the next such run lifts a drain it set"
            ),
        };
        if !ignored.is_empty() {
            summary.push_str(&format!(
                "; slurmd{} ignores HealthCheckNodeState {}",
                version.map(|v| format!(" {v}")).unwrap_or_default(),
                ignored.join(",")
            ));
        }
        if node_health_hint {
            summary.push_str(
                "; slurmctld's runs pass SLURM_NODE_IS_HEALTHY (health_check_report): a passing \
                 run on a node slurmctld holds in service asks slurmctld nothing",
            );
        }
        SlurmdRuns {
            conf: self.conf.clone(),
            program: self.program.clone(),
            interval_s: self.interval_s,
            node_state: self.node_state.clone(),
            slurmd_version: version.map(|v| v.to_string()),
            runs,
            states,
            ignored,
            node_health_hint,
            summary,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn conf(lines: &str) -> HealthCheckConf {
        HealthCheckConf::parse(Path::new("/etc/slurm/slurm.conf"), lines)
    }

    const PROG: &str = "HealthCheckProgram=/usr/local/bin/slurm-node-agent-healthcheck\n";

    #[test]
    fn reads_the_health_check_lines() {
        let c = conf(&format!(
            "ClusterName=c\n{PROG}healthcheckinterval=300\nHealthCheckNodeState=idle,CYCLE # site\n\
             SlurmctldParameters=enable_configless,health_check_report\nNodeName=n1 CPUs=1\n"
        ));
        assert_eq!(
            c.program.as_deref(),
            Some("/usr/local/bin/slurm-node-agent-healthcheck")
        );
        assert_eq!(c.interval_s, 300);
        assert_eq!(c.node_state, "idle,CYCLE");
        assert!(c.report_health);
        assert!(c.depends_on_version());
        let c = conf("HealthCheckInterval=soon\nSlurmctldParameters=enable_configless\n");
        assert_eq!((c.program, c.interval_s, c.report_health), (None, 0, false));
        assert!(!conf(PROG).depends_on_version());
        assert!(conf(&format!("{PROG}HealthCheckNodeState=start_only\n")).depends_on_version());
    }

    #[test]
    fn each_release_runs_what_its_sources_say() {
        let v = |s: &str| SlurmVersion::parse(s);
        let runs = |text: &str, ver: &str| conf(&format!("{PROG}{text}")).runs(v(ver));
        // No program, or no interval and no *_ONLY word: never, not even at the start.
        assert_eq!(
            conf("HealthCheckInterval=60\n").runs(None).runs,
            Runs::Never
        );
        assert_eq!(runs("", "25.11.6").runs, Runs::Never);
        // The default: at the start and every interval, ANY.
        let r = runs("HealthCheckInterval=300\n", "24.11.7");
        assert_eq!(
            (r.runs, r.states.clone()),
            (Runs::AtStartAndInterval, vec!["ANY".into()])
        );
        assert!(
            r.summary.contains("every 300 s on nodes in state ANY"),
            "{}",
            r.summary
        );
        let r = runs(
            "HealthCheckInterval=60\nHealthCheckNodeState=IDLE,MIXED,CYCLE\n",
            "25.11.6",
        );
        assert_eq!(r.states, ["IDLE", "MIXED"]);
        assert!(r.summary.contains("(CYCLE)"), "{}", r.summary);
        // START_ONLY: 25.11+, with or without an interval.
        for text in [
            "HealthCheckNodeState=START_ONLY\n",
            "HealthCheckInterval=60\nHealthCheckNodeState=start_only\n",
        ] {
            let r = runs(text, "25.11.6");
            assert_eq!(r.runs, Runs::StartOnly, "{text}");
            assert!(r.summary.contains("only at its start, before it registers"));
        }
        // 24.11 ignores the word: ANY every interval, or never without one.
        let r = runs(
            "HealthCheckInterval=60\nHealthCheckNodeState=START_ONLY\n",
            "24.11.7",
        );
        assert_eq!(
            (r.runs, r.ignored.clone()),
            (Runs::AtStartAndInterval, vec![START_ONLY.into()])
        );
        assert!(
            r.summary
                .ends_with("slurmd 24.11.7 ignores HealthCheckNodeState START_ONLY"),
            "{}",
            r.summary
        );
        assert_eq!(
            runs("HealthCheckNodeState=START_ONLY\n", "24.11.7").runs,
            Runs::Never
        );
        // REBOOT_ONLY: 26.05+; 25.11 ignores it and runs on ANY every interval.
        assert_eq!(
            runs("HealthCheckNodeState=REBOOT_ONLY\n", "26.05.3").runs,
            Runs::RebootOnly
        );
        let r = runs(
            "HealthCheckInterval=30\nHealthCheckNodeState=REBOOT_ONLY\n",
            "25.11.6",
        );
        assert_eq!(
            (r.runs, r.states.clone()),
            (Runs::AtStartAndInterval, vec!["ANY".into()])
        );
        assert_eq!(r.ignored, [REBOOT_ONLY]);
        // Combined: 25.11 takes it (START_ONLY wins); 26.05 refuses to start.
        let text = "HealthCheckInterval=30\nHealthCheckNodeState=START_ONLY,IDLE\n";
        assert_eq!(runs(text, "25.11.6").runs, Runs::StartOnly);
        assert_eq!(runs(text, "26.05.3").runs, Runs::Refused);
        assert_eq!(
            runs("HealthCheckNodeState=REBOOT_ONLY,CYCLE\n", "26.05.3").runs,
            Runs::Refused
        );
        // An unknown release is read as the newest.
        assert_eq!(
            conf(&format!("{PROG}HealthCheckNodeState=REBOOT_ONLY\n"))
                .runs(None)
                .runs,
            Runs::RebootOnly
        );
        // SLURM_NODE_IS_HEALTHY: 26.05 with health_check_report, on slurmctld's runs.
        let hint = "HealthCheckInterval=30\nSlurmctldParameters=health_check_report\n";
        assert!(runs(hint, "26.05.3").node_health_hint);
        assert!(!runs(hint, "25.11.6").node_health_hint);
        assert!(!runs("HealthCheckInterval=30\n", "26.05.3").node_health_hint);
        let start_only =
            "HealthCheckNodeState=START_ONLY\nSlurmctldParameters=health_check_report\n";
        assert!(!runs(start_only, "26.05.3").node_health_hint);
        // JSON names the schedule in snake case.
        let j = serde_json::to_value(runs("HealthCheckNodeState=START_ONLY\n", "25.11.6")).unwrap();
        assert_eq!(j["runs"], "start_only");
        assert_eq!(j["slurmd_version"], "25.11.6");
    }
}
