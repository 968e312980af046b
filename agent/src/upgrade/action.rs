//! The upgrade actions (`upgrade.action`): what runs once a node drained for an image
//! upgrade has no job left. The drain engine (`drain::Engine`, in its `acting` phase) calls
//! [`run`]; retries and the state are the engine's. A repair leaves by the same ways: its
//! reboot is `reboot`, its replacement `poweroff` ([`Step::action`]).
//!
//! - `poweroff`: the reason becomes the step's `powered_off` (`... powered off for image
//!   upgrade A -> B`; a repair's `... [powered off for replacement at <time>]`) and, with
//!   `upgrade.delete_node_record`, a dynamic record with no job is deleted; then systemd
//!   starts `upgrade.poweroff_unit` over D-Bus (`systemd.bus`);
//! - `reboot`: `scontrol reboot ASAP nextstate=resume reason=<reason> <node>`;
//! - `hook`: `upgrade.hook` (argv, no shell) with `SNA_NODE`, `SNA_CURRENT_IMAGE` and
//!   `SNA_DESIRED_IMAGE`, within `upgrade.hook_timeout`;
//! - `none`: nothing.
//!
//! Every change of the node's state (the reason, the reboot, the record's deletion) goes
//! through the gateway ([`crate::node_state::Gateway`]).

use crate::node_state::{DrainError, Gateway};
use crate::slurm::{NodeInfo, ScontrolError};
use crate::systemd::SystemdError;

use super::{upgrade_reason, UpgradeAction, UpgradeSettings, POWERED_OFF};

/// Why an upgrade action failed (the drain engine retries it and records these words).
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    /// `scontrol reboot` failed (e.g. no `RebootProgram` in slurm.conf).
    #[error(transparent)]
    Reboot(ScontrolError),
    /// `scontrol update State=POWER_DOWN_ASAP` failed.
    #[error("POWER_DOWN_ASAP: {0}")]
    PowerDown(ScontrolError),
    /// The reason could not be rewritten to `... powered off for image upgrade A -> B`:
    /// the poweroff does not start.
    #[error("marking the node powered off before the poweroff: {0}")]
    MarkPoweredOff(#[source] DrainError),
    /// systemd could not be reached or refused to start `upgrade.poweroff_unit`.
    #[error(transparent)]
    Poweroff(#[from] SystemdError),
    /// `upgrade.hook` is empty.
    #[error("upgrade.hook is empty")]
    NoHook,
    /// The hook did not exit within `upgrade.hook_timeout`.
    #[error("hook {program}: no exit within {timeout} (upgrade.hook_timeout)")]
    HookTimeout {
        /// The hook's program.
        program: String,
        /// `upgrade.hook_timeout`.
        timeout: crate::section::HumanDuration,
    },
    /// The hook could not be started.
    #[error("hook {program}: {source}")]
    HookSpawn {
        /// The hook's program.
        program: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The hook exited with a failure.
    #[error("hook {program}: {status}")]
    HookFailed {
        /// The hook's program.
        program: String,
        /// How it exited.
        status: std::process::ExitStatus,
    },
}

/// The node an action acts on.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// The node's gateway: its NodeName, the incarnation that writes the reasons, the
    /// reason, reboot and deletion.
    pub gateway: &'a Gateway,
    /// `systemd.bus`, for the poweroff.
    pub systemd_bus: &'a str,
}

/// One action to run on a drained node.
#[derive(Debug, Clone, Copy)]
pub struct Step<'a> {
    /// What to do: `upgrade.action` for an upgrade, `reboot` or `poweroff` for a repair.
    pub action: UpgradeAction,
    /// The upgrade `(current, desired)` images, for the hook (empty for a repair).
    pub images: (&'a str, &'a str),
    /// The reason of the reboot in Slurm.
    pub reason: &'a str,
    /// The reason written before a poweroff: the replacement (and the budget) read it.
    pub powered_off: &'a str,
    /// The node was drained by someone else when the drain began (their reason is never
    /// overwritten).
    pub foreign: bool,
    /// slurmctld's record of the node (`None`: deleted on an earlier attempt).
    pub record: Option<&'a NodeInfo>,
    /// Whether `upgrade.delete_node_record` applies (an upgrade's poweroff; a repair's
    /// replacement keeps its record: the flap guard's history).
    pub delete_record: bool,
    /// Leave through Slurm's power saving instead of powering off from the inside
    /// (`POWER_DOWN_ASAP` with `powered_off` as the reason: a repair's replacement of a
    /// `CLOUD` node, whose instance Slurm's `SuspendProgram` ends).
    pub power_down: bool,
}

/// Runs `step` on `t`, with the ways out of `up` (`upgrade.poweroff_unit`,
/// `upgrade.delete_node_record`, `upgrade.hook`).
///
/// # Errors
/// [`ActionError`]: what failed, for the engine's retry.
pub async fn run(up: &UpgradeSettings, t: &Target<'_>, step: &Step<'_>) -> Result<(), ActionError> {
    let (current, desired) = step.images;
    match step.action {
        UpgradeAction::None => Ok(()),
        UpgradeAction::Reboot => {
            tracing::info!(decision = "node.action", action = "reboot", node = %t.gateway.node(), "scontrol reboot ASAP nextstate=resume");
            t.gateway
                .reboot(step.reason)
                .await
                .map_err(ActionError::Reboot)
        }
        UpgradeAction::Poweroff if step.power_down => {
            tracing::info!(decision = "node.action", action = "power_down", node = %t.gateway.node(), "scontrol update State=POWER_DOWN_ASAP (Slurm's power saving)");
            t.gateway
                .power_down(step.powered_off)
                .await
                .map_err(ActionError::PowerDown)
        }
        UpgradeAction::Poweroff => {
            leave_for_poweroff(up, t, step).await?;
            let unit = &up.poweroff_unit;
            tracing::info!(decision = "node.action", action = "poweroff", unit, bus = %t.systemd_bus, "orderly shutdown through systemd");
            let sd = crate::systemd::Systemd::connect(t.systemd_bus).await?;
            Ok(sd.start(unit).await?)
        }
        UpgradeAction::Hook => {
            let Some((prog, args)) = up.hook.split_first() else {
                return Err(ActionError::NoHook);
            };
            tracing::info!(decision = "node.action", action = "hook", program = %prog, "running the upgrade hook");
            let mut cmd = tokio::process::Command::new(prog);
            cmd.args(args)
                .env("SNA_NODE", t.gateway.node())
                .env("SNA_CURRENT_IMAGE", current)
                .env("SNA_DESIRED_IMAGE", desired)
                .stdin(std::process::Stdio::null())
                .kill_on_drop(true);
            match tokio::time::timeout(up.hook_timeout.0, cmd.status()).await {
                Err(_) => Err(ActionError::HookTimeout {
                    program: prog.clone(),
                    timeout: up.hook_timeout,
                }),
                Ok(Err(source)) => Err(ActionError::HookSpawn {
                    program: prog.clone(),
                    source,
                }),
                Ok(Ok(s)) if s.success() => Ok(()),
                Ok(Ok(status)) => Err(ActionError::HookFailed {
                    program: prog.clone(),
                    status,
                }),
            }
        }
    }
}

/// The reason an upgrade's poweroff writes: `... powered off for image upgrade A -> B`.
pub fn powered_off_reason(instance_id: &str, current: &str, desired: &str) -> String {
    upgrade_reason(instance_id, &format!("{POWERED_OFF}{current} -> {desired}"))
}

/// On the way out for a poweroff: the reason becomes `marker` (an upgrade's `... powered
/// off for image upgrade A -> B`, a repair's `... [powered off for replacement at <time>]`: so the
/// record holds no budget slot and a replacement sees what happened; never over someone
/// else's reason), then, with `upgrade.delete_node_record`, a dynamic record with no job
/// is deleted. Failing to rewrite the reason stops the poweroff (retried); failing to
/// delete is logged.
async fn leave_for_poweroff(
    up: &UpgradeSettings,
    t: &Target<'_>,
    step: &Step<'_>,
) -> Result<(), ActionError> {
    let (marker, foreign) = (step.powered_off, step.foreign);
    let Some(node) = step.record else {
        return Ok(()); // deleted on an earlier attempt
    };
    let gw = t.gateway;
    if !foreign {
        gw.relabel(marker, Some(node))
            .await
            .map_err(ActionError::MarkPoweredOff)?;
    }
    if up.delete_node_record && step.delete_record {
        if node.has_flag("DYNAMIC_NORM") && node.runs_no_job() {
            match gw.delete_record().await {
                Ok(()) => {
                    tracing::info!(node = %gw.node(), "deleted this node's dynamic record before the poweroff")
                }
                Err(e) => {
                    tracing::warn!(node = %gw.node(), "could not delete this node's record (it stays, marked powered off): {e}")
                }
            }
        } else {
            tracing::info!(node = %gw.node(), state = node.state(), "not a dynamic node with no job: its record stays, marked powered off");
        }
    }
    Ok(())
}
