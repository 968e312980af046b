//! slurmctld's record of this node around slurmd's (re)start, for bootstrap: the one look
//! before slurmd starts (whose the record is, [`FoundRecord`]; whether a dynamic record is
//! stale, [`look_before_start`]) and the proof that the slurmd now running registered
//! ([`registered_by`], [`wait_for_next_second`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::{NodeInfo, ReadyScontrol, Scontrol};
use crate::reason::RecordHolder;
use crate::systemd::ServiceInfo;

/// Where a dynamic node's record in slurmctld differs from the `--conf` line about to be
/// registered: `(key, in slurmctld, wanted)` for CPUs, RealMemory, Features and Gres.
/// slurmctld keeps a dynamic node's record after slurmd stops, and a re-registration does
/// not replace its definition.
pub fn definition_differences(node: &NodeInfo, conf: &str) -> Vec<(String, String, String)> {
    let want: BTreeMap<&str, &str> = conf
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .collect();
    let set = |v: &str| -> BTreeSet<String> {
        v.split(',')
            .map(str::trim)
            .filter(|x| !x.is_empty() && *x != "(null)")
            .map(str::to_string)
            .collect()
    };
    let have = |k: &str| node.fields.get(k).map_or("", String::as_str);
    let mut out = Vec::new();
    for (ours, theirs, as_set) in [
        ("CPUs", "CPUTot", false),
        ("RealMemory", "RealMemory", false),
        ("Features", "AvailableFeatures", true),
        ("Gres", "Gres", true),
    ] {
        let w = want.get(ours).copied().unwrap_or("");
        let h = have(theirs);
        let differs = if as_set {
            set(w) != set(h)
        } else {
            !w.is_empty() && w != h
        };
        if differs {
            out.push((ours.to_string(), h.to_string(), w.to_string()));
        }
    }
    out
}

/// The proof of registration ([`registered_by`]) has one-second resolution: a slurmd
/// started in the same second as the one that made the record (`old_start`, its
/// `SlurmdStartTime` in Unix seconds) could not be told from it, so this waits into the
/// next second when needed.
pub async fn wait_for_next_second(old_start: Option<i64>) {
    let Some(old) = old_start else { return };
    let now = crate::time::now();
    if old >= now {
        let ms = u64::try_from((old + 1 - now).max(0)).unwrap_or(1) * 1000
            - u64::from(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.subsec_millis()),
            );
        tokio::time::sleep(Duration::from_millis(ms + 1)).await;
    }
}

/// What [`look_before_start`] found in slurmctld's record before slurmd (re)started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundRecord {
    /// The record's `SlurmdStartTime` (Unix seconds), if any.
    pub slurmd_start_time: Option<i64>,
    /// Whose record it was: this instance's, a predecessor's, or Slurm does not say.
    pub holder: RecordHolder,
    /// The look failed because slurmctld refused this node's protocol
    /// ([`super::skew::refusal_of`]): how, and scontrol's line that shows it.
    pub refusal: Option<(super::skew::Refusal, String)>,
    /// slurmctld answered the look (the record, or that it has none).
    pub answered: bool,
    /// A dynamic node's record whose definition differs from the one about to be
    /// registered, `(key, in slurmctld, wanted)`, and that holds no job and no admin's
    /// reason: to be deleted (`scontrol delete NodeName=`, through the node's gateway) so
    /// that the registration creates it anew. Empty: kept.
    pub stale: Vec<(String, String, String)>,
}

impl FoundRecord {
    /// From the record as read (`None`: no record, or the look failed), seen by instance
    /// `instance_id`. Logs the replacement when the record names another instance.
    pub fn new(node_name: &str, record: Option<&NodeInfo>, instance_id: &str) -> FoundRecord {
        let holder = RecordHolder::of(record.and_then(|n| n.instance().id), instance_id);
        if let Some(previous) = holder.replaced() {
            tracing::info!(
                node = node_name,
                previous_instance = previous,
                "replacing instance {previous} (InstanceId from slurmctld's record)"
            );
        }
        FoundRecord {
            slurmd_start_time: record.and_then(NodeInfo::slurmd_start_time),
            holder,
            refusal: None,
            answered: record.is_some(),
            stale: Vec::new(),
        }
    }
}

/// Before slurmd (re)starts: reads slurmctld's record of the NodeName once (whose it is,
/// [`FoundRecord`]), and, for a dynamic node whose definition differs from `conf`, says
/// it is stale ([`FoundRecord::stale`]): bootstrap deletes it through the node's gateway
/// (`scontrol delete NodeName=`), so that the registration that follows creates it anew.
/// Never a record with a job on it, nor one whose reason is not the agent's (an admin's
/// drain survives). `scontrol`: the
/// look's ([`Scontrol::configured`]; on a configless node without a configuration yet,
/// with [`crate::slurm::look`]'s); `ready`: the same, started ahead.
pub async fn look_before_start(
    scontrol: &Scontrol,
    node_name: &str,
    conf: Option<&str>,
    ready: Option<ReadyScontrol>,
    instance_id: &str,
) -> FoundRecord {
    // Through the scontrol started while munged started (it first needs munge for this
    // command, so it answers as one started now would).
    let mut looked = match ready {
        Some(r) => r.show_node(node_name).await,
        None => scontrol.show_node(node_name).await,
    };
    // Through the agent's few-line slurm.conf (no fetch): anything but slurmctld's own
    // answer is asked again the configless way, which fetches the configuration.
    if let (Some(look), Err(e)) = (&scontrol.look, &looked) {
        if needs_fetch(e) {
            tracing::info!(conf = %look.conf.display(), "slurmctld not reached with the agent's client configuration ({e}); looking with the controller's configuration (REQUEST_CONFIG)");
            let configless = Scontrol {
                look: None,
                ..scontrol.clone()
            };
            looked = configless.show_node(node_name).await;
        }
    }
    let mut refusal = None;
    let answered = looked.is_ok();
    let node = match looked {
        Ok(n) => n,
        Err(e) => {
            tracing::debug!("slurmctld's record before slurmd starts: {e}");
            refusal = super::skew::refusal_of(&e);
            None
        }
    };
    let found = FoundRecord {
        refusal,
        answered,
        ..FoundRecord::new(node_name, node.as_ref(), instance_id)
    };
    let (Some(node), Some(conf)) = (node, conf) else {
        return found;
    };
    let diff = definition_differences(&node, conf);
    if diff.is_empty() {
        return found;
    }
    let admin = node
        .held_reason()
        .is_some_and(|r| !crate::reason::is_agent_reason(r));
    if admin || !node.runs_no_job() {
        tracing::warn!(node = node_name, ?diff, state = node.state(), reason = node.reason(), "slurmctld's record differs from the new definition but holds jobs or an admin's reason: kept");
        return found;
    }
    FoundRecord {
        stale: diff,
        ..found
    }
}

/// Whether a look through [`crate::slurm::look`]'s configuration that failed with `e`
/// is made again with the controller's configuration: not when slurmctld answered with a
/// refusal of the protocol or key ([`super::skew::refusal_of`]: the same words either way),
/// nor when no slurmctld could be reached or answered in time (the fetch would not reach
/// it either, and would double the wait).
fn needs_fetch(e: &super::ScontrolError) -> bool {
    if super::skew::refusal_of(e).is_some() {
        return false;
    }
    match e {
        super::ScontrolError::Timeout { .. } => false,
        super::ScontrolError::Failed { stderr, stdout, .. } => {
            !(stderr.contains("Unable to contact slurm controller")
                || stdout.contains("Unable to contact slurm controller"))
        }
        _ => true,
    }
}

/// Whether the node record shows a registration by the slurmd now running: its
/// `SlurmdStartTime` (whole seconds) is not before the start of the unit's main process
/// (systemd's `ExecMainStartTimestamp`, floored to the second). A record left by an earlier
/// slurmd (an earlier boot, a slurmd since stopped, another instance with the same
/// NodeName) started before it and does not count.
pub fn registered_by(node: &NodeInfo, svc: &ServiceInfo) -> bool {
    let started = i64::try_from(svc.exec_main_start_usec / 1_000_000).unwrap_or(i64::MAX);
    svc.exec_main_pid != 0 && started > 0 && node.slurmd_start_time().is_some_and(|t| t >= started)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn failed(stderr: &str) -> super::super::ScontrolError {
        super::super::ScontrolError::Failed {
            program: "scontrol".into(),
            args: "show node -o n1".into(),
            code: 1,
            stderr: stderr.into(),
            stdout: String::new(),
        }
    }

    #[test]
    fn a_look_through_the_agents_lines_is_fetched_again_only_past_slurmctlds_answer() {
        // slurmctld's own answers: the same through a fetched configuration.
        for answer in [
            "slurm_load_node error: Insane message length",
            "slurm_load_node error: Protocol authentication error",
            "slurm_load_node error: Unable to contact slurm controller (connect failure)",
        ] {
            assert!(!needs_fetch(&failed(answer)), "{answer}");
        }
        let timeout = super::super::ScontrolError::Timeout {
            program: "scontrol".into(),
            args: String::new(),
            timeout: Duration::from_secs(10),
        };
        assert!(!needs_fetch(&timeout));
        // What the few lines may lack (e.g. a controller that wants TLS), or a file Slurm
        // cannot read: asked again with the controller's configuration.
        for other in [
            "scontrol: error: ClusterName needs to be specified",
            "slurm_load_node error: Zero Bytes were transmitted or received",
        ] {
            assert!(needs_fetch(&failed(other)), "{other}");
        }
    }

    #[test]
    fn definition_differences_name_what_changed() {
        let node = NodeInfo::parse(
            "NodeName=n CPUTot=2 RealMemory=1000 AvailableFeatures=m4.xlarge,first Gres=(null) State=IDLE",
        );
        let same = "CPUs=2 Boards=1 RealMemory=1000 Features=first,m4.xlarge Weight=1";
        assert!(definition_differences(&node, same).is_empty());
        let d = definition_differences(
            &node,
            "CPUs=2 RealMemory=1000 Features=m4.xlarge,second Weight=1",
        );
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].0, "Features");
        let d = definition_differences(
            &node,
            "CPUs=4 RealMemory=900 Features=m4.xlarge,first Gres=gpu:1",
        );
        let keys: Vec<&str> = d.iter().map(|x| x.0.as_str()).collect();
        assert_eq!(keys, ["CPUs", "RealMemory", "Gres"]);
    }

    #[test]
    fn registration_proof_compares_whole_seconds() {
        let node = NodeInfo::parse("NodeName=n SlurmdStartTime=2017-09-18T08:22:00 State=IDLE");
        let svc = |usec: u64, pid: u32| ServiceInfo {
            exec_main_start_usec: usec,
            exec_main_pid: pid,
            ..ServiceInfo::default()
        };
        // Started in the same second (slurmd notes its start after the fork): proved.
        assert!(registered_by(&node, &svc(1_505_722_920_900_000, 7)));
        assert!(registered_by(&node, &svc(1_505_722_919_000_000, 7)));
        // Started a second later: the record is an earlier slurmd's.
        assert!(!registered_by(&node, &svc(1_505_722_921_000_000, 7)));
        assert!(!registered_by(&node, &svc(1_505_722_920_000_000, 0)));
        assert!(!registered_by(&node, &svc(0, 7)));
        let never = NodeInfo::parse("NodeName=n SlurmdStartTime=None State=DOWN");
        assert!(!registered_by(&never, &svc(1_505_722_920_000_000, 7)));
    }
}
