//! The Slurm calls a drain needs besides `scontrol update` (which [`Scontrol`] has): the
//! jobs on the node (`squeue`), signalling (`scancel --signal`) and requeueing
//! (`scontrol requeue`) them, and counting the nodes of a partition (the upgrade budget's
//! size; its slots are [`crate::upgrade::slot`]'s) and those that carry an upgrade reason
//! (the upgrade actions' own calls, `scontrol reboot` and `delete`, are
//! [`crate::upgrade::action`]'s). Programs run by absolute path from `slurm.bin_dir`, arguments as
//! separate words, never through a shell.

use std::path::Path;

use crate::slurm::{NodeInfo, Scontrol, ScontrolError};

/// Slurm programs in one folder.
#[derive(Debug, Clone)]
pub struct SlurmOps {
    /// `scontrol`.
    pub scontrol: Scontrol,
    squeue: Scontrol,
    scancel: Scontrol,
}

/// The time Slurm recorded with a reason (`Reason=... [root@2024-05-01T10:00:00]`), as
/// text that sorts in time order, or empty.
pub fn reason_time(n: &NodeInfo) -> &str {
    n.fields
        .get("Reason")
        .filter(|r| r.ends_with(']'))
        .and_then(|r| r.rsplit_once(" ["))
        .and_then(|(_, s)| s.rsplit_once('@'))
        .map_or("", |(_, t)| t.trim_end_matches(']'))
}

/// Nodes of a partition for the upgrade budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetCount {
    /// Nodes in scope.
    pub total: usize,
    /// Nodes unavailable because of an upgrade now, oldest drain first (by Slurm's reason
    /// time, then name).
    pub upgrading: Vec<String>,
    /// Nodes with an upgrade reason that hold no slot: their instance powered off, or they
    /// no longer respond and run no job.
    pub gone: Vec<String>,
}

/// Whether a node with an upgrade reason is gone rather than being upgraded: the agent
/// marked it powered off, or slurmd no longer responds (`NOT_RESPONDING`, no reboot
/// pending) and no job is on it. Such a record holds no budget slot (its instance is
/// gone; a replacement is another record, or this one once it registers again).
pub fn upgrade_record_gone(n: &NodeInfo, reason: &crate::upgrade::UpgradeReason<'_>) -> bool {
    if reason.powered_off() {
        return true;
    }
    let rebooting = n.has_flag("REBOOT_ISSUED") || n.has_flag("REBOOT_REQUESTED");
    let not_responding = n.has_flag("NOT_RESPONDING") || n.state().contains('*');
    not_responding && !rebooting && n.runs_no_job()
}

/// Counts, from `scontrol show nodes -o` output, the nodes of `partition` (all nodes when
/// empty) and those unavailable because of an upgrade (an upgrade reason of the agent,
/// [`crate::upgrade::parse_upgrade_reason`], and not [`upgrade_record_gone`]).
pub fn count_upgrading(show_nodes: &str, partition: &str) -> BudgetCount {
    let mut gone = Vec::new();
    let mut total = 0;
    let mut up: Vec<(String, String)> = Vec::new();
    for n in show_nodes
        .lines()
        .filter(|l| l.starts_with("NodeName="))
        .map(NodeInfo::parse)
    {
        let in_scope = partition.is_empty()
            || n.fields
                .get("Partitions")
                .is_some_and(|p| p.split(',').any(|x| x == partition));
        if !in_scope {
            continue;
        }
        total += 1;
        let Some(r) = n
            .held_reason()
            .and_then(crate::upgrade::parse_upgrade_reason)
        else {
            continue;
        };
        if upgrade_record_gone(&n, &r) {
            gone.push(n.name().to_string());
        } else {
            up.push((reason_time(&n).to_string(), n.name().to_string()));
        }
    }
    up.sort();
    BudgetCount {
        total,
        upgrading: up.into_iter().map(|(_, n)| n).collect(),
        gone,
    }
}

impl SlurmOps {
    /// The programs in `bin_dir`.
    pub fn new(bin_dir: &Path) -> SlurmOps {
        SlurmOps {
            scontrol: Scontrol::new(bin_dir),
            squeue: Scontrol {
                program: bin_dir.join("squeue"),
                ..Scontrol::new(bin_dir)
            },
            scancel: Scontrol {
                program: bin_dir.join("scancel"),
                ..Scontrol::new(bin_dir)
            },
        }
    }

    /// Ids of the jobs running (or completing) on `node`: `squeue -h -w <node> -t R,CG -o %i`.
    ///
    /// # Errors
    /// [`ScontrolError`].
    pub async fn jobs_on(&self, node: &str) -> Result<Vec<String>, ScontrolError> {
        let out = self
            .squeue
            .run(&["-h", "-w", node, "-t", "RUNNING,COMPLETING", "-o", "%i"])
            .await?;
        Ok(out
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect())
    }

    /// `scancel --signal=<sig> <job>` for each job (the job steps get the signal).
    ///
    /// # Errors
    /// The first [`ScontrolError`]; the other jobs are still tried.
    pub async fn signal_jobs(&self, jobs: &[String], signal: &str) -> Result<(), ScontrolError> {
        let mut first = None;
        for j in jobs {
            let arg = format!("--signal={signal}");
            if let Err(e) = self.scancel.run(&[&arg, j]).await {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// `scontrol requeue <job>` for each job.
    ///
    /// # Errors
    /// The first [`ScontrolError`]; the other jobs are still tried.
    pub async fn requeue_jobs(&self, jobs: &[String]) -> Result<(), ScontrolError> {
        let mut first = None;
        for j in jobs {
            if let Err(e) = self.scontrol.run(&["requeue", j]).await {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Counts the upgrade drains of `partition`.
    ///
    /// # Errors
    /// [`ScontrolError`].
    pub async fn count_upgrading(&self, partition: &str) -> Result<BudgetCount, ScontrolError> {
        let out = self.scontrol.run(&["show", "nodes", "-o"]).await?;
        Ok(count_upgrading(&out, partition))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_upgrades_in_time_order() {
        let out = "\
NodeName=c1 State=IDLE+DRAIN Partitions=main,gpu Reason=slurm-node-agent/upgrade@i-0123456789abcdef0: image upgrade ami-1 -> ami-2 [root@2024-05-01T10:00:05]
NodeName=c2 State=IDLE Partitions=main Reason=(null)
NodeName=c3 State=MIXED+DRAIN Partitions=main Reason=slurm-node-agent/upgrade@i-0123456789abcdef0: image upgrade ami-1 -> ami-2 [root@2024-05-01T10:00:01]
NodeName=c4 State=IDLE+DRAIN Partitions=main Reason=bad disk [admin@2024-05-01T09:00:00]
NodeName=g1 State=IDLE+DRAIN Partitions=gpu Reason=slurm-node-agent/upgrade@unknown: x [root@2024-05-01T09:00:00]
NodeName=c5 State=DOWN+DRAIN+DYNAMIC_NORM+NOT_RESPONDING Partitions=main Reason=slurm-node-agent/upgrade@i-0aaaaaaaaaaaaaaaa: image upgrade ami-1 -> ami-2 [root@2024-05-01T08:00:00]
NodeName=c6 State=IDLE+DRAIN Partitions=main Reason=slurm-node-agent/upgrade@i-0bbbbbbbbbbbbbbbb: powered off for image upgrade ami-1 -> ami-2 [root@2024-05-01T08:00:00]
NodeName=c7 State=DOWN*+DRAIN+REBOOT_ISSUED Partitions=main Reason=slurm-node-agent/upgrade@i-0cccccccccccccccc: image upgrade ami-1 -> ami-2 [root@2024-05-01T10:00:09]
NodeName=c8 State=IDLE+DRAIN Partitions=main Reason=slurm-node-agent: upgrade [admin@2024-05-01T09:00:00]
";
        let c = count_upgrading(out, "main");
        assert_eq!(c.total, 8);
        // c5 no longer responds and runs nothing, c6 powered off: no slot. c7 reboots: slot.
        assert_eq!(c.upgrading, ["c3", "c1", "c7"]);
        assert_eq!(c.gone, ["c5", "c6"]);
        let all = count_upgrading(out, "");
        assert_eq!(all.total, 9);
        assert_eq!(all.upgrading, ["g1", "c3", "c1", "c7"]);
        assert_eq!(count_upgrading(out, "none").total, 0);
    }
}
