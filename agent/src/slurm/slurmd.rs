//! slurmd on this node, for bootstrap: its start prepared (the options file its unit reads,
//! with the instance's id and type where slurmd takes them, [`prepare`]) and its unit
//! stopped or restarted so that exactly one slurmd runs ([`stop`], [`restart`]).

use std::path::{Path, PathBuf};

use super::{InstanceArgs, OptionsFileError, SlurmSettings, SlurmVersion};
use crate::nodedef::NodeDefinition;
use crate::systemd::{Systemd, SystemdError, Units};

/// What [`prepare`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prepared {
    /// slurmd was stopped, to be started with the new options or key.
    pub restart: bool,
    /// `slurmd -V`, when it gave one.
    pub version: Option<SlurmVersion>,
}

/// Why slurmd's start could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// `node.topology` is set for a dynamic node and slurmd predates 25.05, which would
    /// refuse `Topology=` in its `--conf` line.
    #[error("slurmd {version} ({}) takes no Topology= for a dynamic node (Slurm 25.05 and later do)", slurmd.display())]
    Topology {
        /// `slurmd -V`.
        version: SlurmVersion,
        /// The program asked.
        slurmd: PathBuf,
    },
    /// The options file could not be written.
    #[error(transparent)]
    Options(#[from] OptionsFileError),
    /// systemd did not stop slurmd.
    #[error(transparent)]
    Systemd(#[from] SystemdError),
}

/// Prepares slurmd's start for the node `def`: asks `slurmd -V` (the record names its
/// instance, `instance`, where slurmd can say it: 23.11+), writes the options file
/// (`slurm.slurmd_options_file`, else the distribution's), and stops slurmd ([`stop`]) when
/// the options changed or `key_changed`, so that the start that follows uses them.
/// `topology` is `node.topology`; `sack_key` the auth/slurm key file, named to slurmd
/// through `SLURM_SACK_KEY` in the options file (`None` with auth/munge).
///
/// # Errors
/// [`PrepareError`]; nothing is stopped before the options file is written.
pub async fn prepare(
    slurm: &SlurmSettings,
    def: &NodeDefinition,
    topology: &str,
    instance: InstanceArgs,
    sack_key: Option<&Path>,
    key_changed: bool,
    systemd: &Systemd,
) -> Result<Prepared, PrepareError> {
    let servers = slurm.servers();
    let options_file = if slurm.slurmd_options_file.as_os_str().is_empty() {
        super::options::default_options_file()
    } else {
        slurm.slurmd_options_file.clone()
    };
    // The record names its instance where slurmd can say it (23.11+).
    let slurmd = super::version::slurmd_path(&slurm.bin_dir);
    let version = super::version::slurmd_version(&slurmd).await;
    let instance = version
        .filter(|v| v.has_instance_fields())
        .map(|_| instance);
    // Topology= in --conf arrived in 25.05: an older slurmd would refuse the line.
    if def.dynamic_conf.is_some() && !topology.trim().is_empty() {
        if let Some(v) = version.filter(|v| !v.has_dynamic_topology()) {
            return Err(PrepareError::Topology { version: v, slurmd });
        }
    }
    match version {
        Some(v) => {
            tracing::debug!(slurmd = %slurmd.display(), version = %v, instance_fields = instance.is_some(), "slurmd version")
        }
        None => {
            tracing::info!(slurmd = %slurmd.display(), "slurmd -V gave no version: slurmd is started without --instance-id")
        }
    }
    let args = super::slurmd_args(def, &servers, instance.as_ref());
    let options_changed = super::write_slurmd_options(&options_file, &args, sack_key)?;
    let restart = options_changed || key_changed;
    if restart {
        stop(systemd, &slurm.slurmd_unit).await?;
    }
    Ok(Prepared { restart, version })
}

/// Stops slurmd so that none is left: the distribution's units have `KillMode=process`
/// so that job steps (`slurmstepd`) survive a slurmd restart, and the same setting leaves
/// behind a configless slurmd's configuration-fetch child (a second `slurmd` process,
/// retrying forever). So: stop the unit, then SIGKILL any `slurmd` still in its cgroup
/// (never `slurmstepd`).
pub async fn stop(systemd: &dyn Units, unit: &str) -> Result<(), SystemdError> {
    systemd.stop(unit).await?;
    for (pid, cmd) in systemd.unit_processes(unit).await? {
        let program = cmd.split_whitespace().next().unwrap_or_default();
        if program.rsplit('/').next() == Some("slurmd") {
            tracing::warn!(pid, %cmd, "killing a slurmd left behind in {unit}");
            if let Ok(pid) = i32::try_from(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
    Ok(())
}

/// Restarts slurmd so that exactly one runs afterwards (see [`stop`]); the start job is
/// not waited for ([`crate::systemd::Systemd::start_no_wait`]).
pub async fn restart(systemd: &dyn Units, unit: &str) -> Result<(), SystemdError> {
    stop(systemd, unit).await?;
    systemd.start_no_wait(unit).await
}
