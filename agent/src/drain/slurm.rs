//! The Slurm calls a drain needs besides `scontrol update` (which [`Scontrol`] has): the
//! jobs on the node (`squeue`), signalling (`scancel --signal`) and requeueing
//! (`scontrol requeue`) them (the upgrade budget's count is the rollout's, the upgrade
//! actions' own calls, `scontrol reboot` and `delete`, are [`crate::upgrade::action`]'s). Programs run by absolute path from `slurm.bin_dir`, arguments as
//! separate words, never through a shell.

use std::path::Path;

use crate::slurm::{Scontrol, ScontrolError};

/// Slurm programs in one folder.
#[derive(Debug, Clone)]
pub struct SlurmOps {
    /// `scontrol`.
    pub scontrol: Scontrol,
    squeue: Scontrol,
    scancel: Scontrol,
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
        self.jobs_in(node, "RUNNING,COMPLETING").await
    }

    /// Ids of the jobs on `node` in `states` (squeue's `-t` list).
    async fn jobs_in(&self, node: &str, states: &str) -> Result<Vec<String>, ScontrolError> {
        let out = self
            .squeue
            .run(&["-h", "-w", node, "-t", states, "-o", "%i"])
            .await?;
        Ok(out
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect())
    }

    /// Ids of the jobs allocated to `node` that have not ended: configuring (a node Slurm
    /// powers up for them) or running: `squeue -h -w <node> -t CONFIGURING,RUNNING -o %i`.
    ///
    /// # Errors
    /// [`ScontrolError`].
    pub async fn jobs_allocated(&self, node: &str) -> Result<Vec<String>, ScontrolError> {
        self.jobs_in(node, "CONFIGURING,RUNNING").await
    }

    /// `scontrol requeue <job>` for one job.
    ///
    /// # Errors
    /// [`ScontrolError`] with Slurm's words (a job that may not be requeued, one that ended).
    pub async fn requeue_job(&self, job: &str) -> Result<(), ScontrolError> {
        self.scontrol.run(&["requeue", job]).await.map(drop)
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
            if let Err(e) = self.requeue_job(j).await {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}
