//! The settings schema: [`Settings`] assembles every module's section (each defined, with
//! its defaults, trust classes and checks, in the module that owns it) and holds `[agent]`,
//! the agent's own files. Unknown keys are errors.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

use crate::section::{Classified, InvalidKey, KeyTrust};

/// All settings. Sections map to TOML tables: `[node]`, `[slurm]`, `[auth]`, `[imds]`,
/// `[systemd]`, `[agent]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// The Slurm node this instance becomes.
    pub node: crate::nodedef::NodeSettings,
    /// How to reach the controller and run slurmd.
    pub slurm: crate::slurm::SlurmSettings,
    /// The cluster's authentication key.
    pub auth: crate::authkey::AuthSettings,
    /// The instance metadata service.
    pub imds: crate::imds::ImdsSettings,
    /// The systemd Manager.
    pub systemd: crate::systemd::SystemdSettings,
    /// The agent itself.
    pub agent: Agent,
    /// `[[mounts]]`: shared file systems mounted before slurmd starts.
    pub mounts: Vec<crate::mounts::MountSettings>,
    /// IMDS notices (spot, maintenance, rebalance, lifecycle).
    pub events: crate::events::EventsSettings,
    /// Rolling image upgrades.
    pub upgrade: crate::upgrade::UpgradeSettings,
    /// The drain state machine.
    pub drain: crate::drain::DrainSettings,
    /// Health checks (`check`, and the daemon's schedule).
    pub health: crate::health::HealthSettings,
    /// `[pcs]`: the managed join (AWS Parallel Computing Service registration).
    pub pcs: crate::pcs::PcsSettings,
    /// `[node_lifecycle]`: the image's lifecycle scripts and the `TERMINATE` shutdown unit.
    pub node_lifecycle: crate::node_lifecycle::NodeLifecycleSettings,
    /// `[scratch]`: node-local scratch on the instance store disks.
    pub scratch: crate::scratch::ScratchSettings,
    /// `[repair]`: what a fault the health checks find leads to.
    pub repair: crate::repair::RepairSettings,
    /// `[start_gate]`: deep checks at every boot before the node takes a job.
    pub start_gate: crate::gate::StartGateSettings,
    /// `[orphan]`: a node whose controller is gone, or whose record was deleted, powers off.
    pub orphan: crate::orphan::OrphanSettings,
    /// `[cloudwatch]`: the CloudWatch agent's configuration rendered at boot.
    pub cloudwatch: crate::cloudwatch::CloudWatchSettings,
}

/// `[agent]`: the agent's own files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Agent {
    /// Folder for state that survives restarts (bootstrap result, drain state).
    pub state_dir: PathBuf,
}

impl Default for Agent {
    fn default() -> Self {
        Agent {
            state_dir: PathBuf::from("/var/lib/slurm-node-agent"),
        }
    }
}

impl Classified for Agent {
    const SECTION: &'static str = "agent";
    const TRUST: &'static [KeyTrust] = &[KeyTrust::image("state_dir")];
}

impl Agent {
    /// Checks `state_dir`: not empty, absolute.
    ///
    /// # Errors
    /// [`InvalidKey`]: the dotted key and what is wrong.
    pub fn validate(&self) -> Result<(), InvalidKey> {
        let p = &self.state_dir;
        if p.as_os_str().is_empty() {
            return Err(InvalidKey::new(
                "agent.state_dir",
                "must not be empty (the folder for bootstrap and drain state)",
            ));
        }
        if !p.is_absolute() {
            return Err(InvalidKey::new(
                "agent.state_dir",
                format!("must be an absolute path, got {}", p.display()),
            ));
        }
        Ok(())
    }
}

impl Settings {
    /// Checks values whose shape the types do not capture: each section checks its own
    /// (`validate` next to its type).
    ///
    /// # Errors
    /// [`InvalidKey`] for the first invalid value: the dotted key and what is wrong.
    pub fn validate(&self) -> Result<(), InvalidKey> {
        self.node.validate()?;
        self.slurm.validate()?;
        self.agent.validate()?;
        self.auth.validate()?;
        self.pcs.validate()?;
        self.imds.validate()?;
        self.events.validate()?;
        self.upgrade.validate()?;
        self.drain.validate()?;
        self.health.validate()?;
        self.node_lifecycle.validate()?;
        self.scratch.validate()?;
        self.repair.validate()?;
        self.start_gate.validate()?;
        self.orphan.validate(
            self.slurm.join_deadline,
            self.node.dynamic,
            self.node.role == crate::nodedef::Role::Compute,
        )?;
        self.cloudwatch.validate()?;
        crate::mounts::validate_all(&self.mounts)?;
        self.systemd.validate()
    }
}
