//! The drain engine: moves the one drain state machine ([`crate::node_state`]) forward for
//! every reason a node steps aside (spot interruption, lifecycle termination, a lifecycle
//! script's terminate, maintenance, image upgrade, rebalance, an operator's `drain`, the
//! health checks, the mounts, scratch), persisted under `agent.state_dir` so that a
//! restarted agent continues the same drain: it waits for the jobs, takes the spot job
//! action, runs the cause's action once the node is drained (the upgrade's), retries it.
//!
//! - [`crate::node_state`]: the states, causes and transitions, `drain.json` and
//!   `drain.lock`, the metrics, and the gateway through which every change of the node's
//!   state in Slurm goes (re-exported here: [`state`], [`store`], [`metrics`]).
//! - [`slurm`]: squeue/scancel/scontrol requeue and the upgrade budget count.
//! - [`boot`]: what bootstrap does with a drain it finds at boot.
//! - [`Engine`]: applies the notices' requests and moves the machine forward against Slurm.
//!
//! The agent never resumes a node whose Slurm reason it did not set: the gateway checks
//! that the reason is the agent's ([`crate::reason`]: `slurm-node-agent/<cause>@<instance-id>:
//! ...`) and that no foreign reason was on the node when the drain began.
//!
//! Floor 6 (subsystems): above `upgrade`, whose actions it runs; the `[drain]` settings
//! section ([`DrainSettings`]) is this module's.

pub mod boot;
pub mod slurm;
pub use crate::node_state::{metrics, state, store};

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::node_state::Gateway;
pub use crate::node_state::{
    found_state, Begin, Cause, CauseKind, DrainError, DrainState, FoundState, Phase, Requested,
    Store, StoreError,
};
use crate::section::{HumanDuration, InvalidKey};
use crate::slurm::{NodeInfo, Scontrol};
use crate::time;
use crate::upgrade::{UpgradeAction, UpgradeSettings};
pub use slurm::SlurmOps;

/// What to do with the jobs still running when a spot interruption comes close.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SpotJobAction {
    /// Let them run until the instance goes.
    #[default]
    None,
    /// `scancel --signal=<events.spot_job_signal>`: the job steps get the signal (to
    /// checkpoint).
    Signal,
    /// `scontrol requeue`: back to the queue (batch jobs that allow requeue).
    Requeue,
}

/// What a spot drain does with the jobs still running on the node (`[events]`'s
/// `spot_job_action`, `spot_job_signal` and `spot_job_action_lead`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SpotJobs {
    /// `none`, `signal` or `requeue`.
    pub action: SpotJobAction,
    /// The signal for [`SpotJobAction::Signal`]: a name (`TERM`, `USR1`, ...) or number.
    pub signal: String,
    /// How long before the interruption time the action is taken.
    pub lead: Duration,
    /// A lifecycle drain's (Auto Scaling termination) interruption time: this long after
    /// the drain began (`events.lifecycle_max_wait`, when the lifecycle action is
    /// completed whatever runs).
    pub lifecycle_max_wait: Duration,
}

/// `[drain]`: the drain machine itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DrainSettings {
    /// How often the daemon looks at the node while a drain is in progress.
    pub check_interval: HumanDuration,
    /// Prometheus textfile with the drain metrics. Empty: `<agent.state_dir>/drain.prom`.
    pub metrics_file: PathBuf,
    /// How long a command waits for the state lock held by another agent process.
    pub lock_timeout: HumanDuration,
    /// First wait before retrying a failed action (doubles each time, at most 1 h).
    pub action_retry: HumanDuration,
}

impl Default for DrainSettings {
    fn default() -> Self {
        DrainSettings {
            check_interval: HumanDuration(Duration::from_secs(2)),
            metrics_file: PathBuf::new(),
            lock_timeout: HumanDuration(Duration::from_secs(30)),
            action_retry: HumanDuration(Duration::from_secs(60)),
        }
    }
}

impl crate::section::Classified for DrainSettings {
    const SECTION: &'static str = "drain";
    const TRUST: &'static [crate::section::KeyTrust] = {
        use crate::section::KeyTrust as K;
        &[
            K::user_data("check_interval"),
            K::image("metrics_file"),
            K::user_data("lock_timeout"),
            K::user_data("action_retry"),
        ]
    };
}

impl DrainSettings {
    /// Checks the values.
    ///
    /// # Errors
    /// [`InvalidKey`]: the dotted key and what is wrong.
    pub fn validate(&self) -> Result<(), InvalidKey> {
        for (k, d) in [
            ("drain.check_interval", self.check_interval),
            ("drain.lock_timeout", self.lock_timeout),
            ("drain.action_retry", self.action_retry),
        ] {
            if d.0.is_zero() {
                return Err(InvalidKey::new(k, "must be more than 0"));
            }
        }
        if !self.metrics_file.as_os_str().is_empty() && !self.metrics_file.is_absolute() {
            return Err(InvalidKey::new(
                "drain.metrics_file",
                "must be an absolute path",
            ));
        }
        Ok(())
    }
}

/// Applies drain requests and moves the machine forward, against the real Slurm.
#[derive(Debug, Clone)]
pub struct Engine {
    /// This node's NodeName.
    pub node: String,
    /// Slurm programs that read the node and act on its jobs (squeue, scancel, scontrol
    /// show, requeue, the budget's reservations); the node's state changes through
    /// [`Engine::gateway`].
    pub ops: SlurmOps,
    /// The gateway: the node's state in Slurm and in `drain.json`.
    pub gateway: Gateway,
    /// The spot job action (from `[events]`).
    pub spot_jobs: SpotJobs,
    /// `[upgrade]`.
    pub upgrade: UpgradeSettings,
    /// `[drain]`.
    pub drain: DrainSettings,
    /// The incarnation that writes the reasons (`unknown` when not known).
    pub instance_id: String,
    /// `systemd.bus`, for the poweroff action.
    pub systemd_bus: String,
}

/// Whether the node's slurmd started after `since` (Unix seconds) and the node responds.
/// slurmctld's `SlurmdStartTime` has one-second resolution, so a slurmd started in the
/// same second as `since` does not count (it may have started just before): a reboot comes
/// long after the drain that prepared it.
pub fn registered_since(n: &NodeInfo, since: i64) -> bool {
    n.slurmd_start_time().is_some_and(|t| t > since)
        && !n.state().contains('*')
        && !n.has_flag("NOT_RESPONDING")
}

impl Engine {
    /// An engine for `node`: its state under `state_dir` (`agent.state_dir`), Slurm's
    /// programs in `bin_dir` (`slurm.bin_dir`), its own section, the upgrade's, the spot job
    /// action and the systemd bus of the poweroff action (`systemd.bus`). Writes reasons as
    /// an `unknown` incarnation until [`Engine::with_instance`].
    pub fn new(
        node: &str,
        state_dir: &Path,
        bin_dir: &Path,
        drain: &DrainSettings,
        upgrade: &UpgradeSettings,
        spot_jobs: SpotJobs,
        systemd_bus: &str,
    ) -> Engine {
        let metrics_file = crate::node_state::metrics_path(state_dir, &drain.metrics_file);
        Engine {
            node: node.to_string(),
            ops: SlurmOps::new(bin_dir),
            gateway: Gateway::new(
                node,
                Scontrol::new(bin_dir),
                state_dir,
                drain.lock_timeout.0,
                metrics_file,
            ),
            spot_jobs,
            upgrade: upgrade.clone(),
            drain: drain.clone(),
            instance_id: crate::reason::UNKNOWN_INSTANCE.to_string(),
            systemd_bus: systemd_bus.to_string(),
        }
    }

    /// The same engine changing the node through another slurmctld (its gateway's,
    /// [`Gateway::through`]; an in-memory one in unit tests). The budget's reservations
    /// and the jobs' signals keep the programs of `slurm.bin_dir`.
    pub fn through(mut self, slurmctld: impl crate::slurm::Slurmctld + 'static) -> Engine {
        self.gateway = self.gateway.through(slurmctld);
        self
    }

    /// The same engine writing reasons as incarnation `instance_id`.
    pub fn with_instance(mut self, instance_id: &str) -> Engine {
        self.instance_id = instance_id.to_string();
        self.gateway = self.gateway.with_instance(instance_id);
        self
    }

    async fn lock(&self) -> Result<store::Lock, StoreError> {
        self.gateway.lock().await
    }

    fn save(&self, st: &DrainState) -> Result<(), StoreError> {
        self.gateway.save(st)
    }

    /// Reads the state (no lock: the file is replaced atomically).
    ///
    /// # Errors
    /// [`StoreError`].
    pub fn load(&self) -> Result<DrainState, StoreError> {
        self.gateway.load()
    }

    /// The daemon's start ([`Gateway::load_at_start`]): another instance's drain in
    /// progress is set aside, this instance's continued.
    ///
    /// # Errors
    /// [`DrainError::Store`].
    pub async fn load_at_start(&self) -> Result<DrainState, DrainError> {
        self.gateway.load_at_start().await
    }

    async fn node_info(&self) -> Result<NodeInfo, DrainError> {
        self.gateway.node_info().await
    }

    /// A cause asks for a drain ([`Gateway::drain`]): the node is drained in Slurm with the
    /// cause's reason (unless someone else's drain is already there: their reason stays),
    /// then the state is saved. Idempotent: a notice already handled, or a drain of equal
    /// or higher priority in progress, changes nothing.
    ///
    /// # Errors
    /// [`DrainError`]; on error the state is unchanged.
    pub async fn request(&self, cause: Cause) -> Result<Requested, DrainError> {
        self.gateway.drain(cause, None).await
    }

    /// The maintenance event with key `key` no longer needs a drain: if it is the current
    /// cause, the node is resumed (only if the reason on the node is still ours).
    ///
    /// # Errors
    /// [`DrainError`].
    pub async fn undo(&self, key: &str) -> Result<bool, DrainError> {
        self.gateway.withdraw(key, false).await
    }

    /// The maintenance event with key `key` is over and took the instance down (a reboot, a
    /// stop): like [`Engine::undo`], once this node's slurmd has registered with slurmctld
    /// again, started after the second the drain began ([`registered_since`]). Until then nothing changes
    /// (`Ok(false)`) and the next poll asks again.
    ///
    /// # Errors
    /// [`DrainError`].
    pub async fn undo_after_registration(&self, key: &str) -> Result<bool, DrainError> {
        let st = self.load()?;
        let current = st.cause.as_ref().is_some_and(|c| c.key() == key)
            && matches!(st.phase, Phase::Draining | Phase::Drained);
        if current {
            let node = self.node_info().await?;
            let began = st.started.unwrap_or(st.since);
            if !registered_since(&node, began) {
                tracing::debug!(
                    node = %self.node,
                    key,
                    state = node.state(),
                    slurmd_start_time = node.slurmd_start_time(),
                    drain_began = began,
                    "maintenance event over; waiting for slurmd to register again"
                );
                return Ok(false);
            }
        }
        self.gateway.withdraw(key, false).await
    }

    /// Withdraws the drain with key `key` whatever its kind, if it is still `draining` or
    /// `drained`.
    ///
    /// # Errors
    /// [`DrainError`].
    pub async fn withdraw(&self, key: &str) -> Result<bool, DrainError> {
        self.gateway.withdraw(key, true).await
    }

    /// An operator's `resume` ([`Gateway::resume`]): the node returns to service if the
    /// agent drained it (or `force`). The cause stays handled: the same notice does not
    /// drain it again.
    ///
    /// # Errors
    /// [`DrainError::Foreign`], [`DrainError::Refused`] while acting, Slurm errors.
    pub async fn resume(&self, force: bool) -> Result<DrainState, DrainError> {
        self.gateway.resume(force).await
    }

    /// One step forward from the current phase (see the module docs of [`state`]): checks
    /// the node, takes the spot job action when due, notes `drained` and, in the same
    /// call, runs the cause's action. Returns the phase after the step.
    ///
    /// # Errors
    /// [`DrainError`]; the state stays consistent (what happened is saved).
    pub async fn progress(&self) -> Result<Phase, DrainError> {
        let phase = self.load()?.phase;
        match phase {
            Phase::Active => Ok(Phase::Active),
            // Drained now: the cause's action (if it has one) starts in the same pass, not
            // a `drain.check_interval` later (a rolling upgrade's hand-off waited for it
            // once per round). The phase is saved first, so a crash between the two
            // resumes at `drained`.
            Phase::Draining => match self.progress_draining().await? {
                Phase::Drained => self.progress_action().await,
                p => Ok(p),
            },
            Phase::Drained => self.progress_action().await,
            Phase::Acting => self.progress_action().await,
            Phase::Done => self.progress_done().await,
        }
    }

    async fn progress_draining(&self) -> Result<Phase, DrainError> {
        let node = self.node_info().await?;
        let _lock = self.lock().await?;
        let mut st = self.load()?;
        if st.phase != Phase::Draining {
            return Ok(st.phase);
        }
        let now = time::now();
        if !node.is_drained() && !node.has_flag("REBOOT_REQUESTED") {
            // An operator resumed the node behind our back: respect it.
            tracing::warn!(node = %self.node, state = node.state(), "node no longer drained in Slurm; someone resumed it");
            st.resume(now)?;
            self.save(&st)?;
            return Ok(st.phase);
        }
        // A spot notice's interruption, a Capacity Block's reclaim, the lifecycle action's
        // completion at `events.lifecycle_max_wait`: the job action
        // (`events.spot_job_action`) `spot_job_action_lead` before it.
        let deadline = match &st.cause {
            // From when `Terminated` was first seen, whatever drain came before.
            Some(Cause::Lifecycle { seen, .. }) => Some(
                Some(*seen)
                    .filter(|t| *t > 0)
                    .unwrap_or(st.started.unwrap_or(st.since))
                    .saturating_add(
                        i64::try_from(self.spot_jobs.lifecycle_max_wait.as_secs())
                            .unwrap_or(i64::MAX),
                    ),
            ),
            Some(c) => c.job_action_deadline(),
            None => None,
        };
        if let Some(deadline) = deadline {
            let lead = i64::try_from(self.spot_jobs.lead.as_secs()).unwrap_or(0);
            if !st.job_action_done
                && self.spot_jobs.action != SpotJobAction::None
                && deadline - lead <= now
            {
                let before = match st.cause.as_ref().map(Cause::cause_kind) {
                    Some(CauseKind::CapacityBlock) => "the capacity block's reclaim",
                    Some(CauseKind::Lifecycle) => {
                        "the events.lifecycle_max_wait (the lifecycle action is completed then)"
                    }
                    _ => "the spot interruption",
                };
                let jobs = self.ops.jobs_on(&self.node).await?;
                let r = match self.spot_jobs.action {
                    SpotJobAction::Signal => {
                        let sig = self.spot_jobs.signal.trim_start_matches("SIG");
                        tracing::info!(?jobs, signal = sig, "signalling jobs before {before}");
                        self.ops.signal_jobs(&jobs, sig).await
                    }
                    SpotJobAction::Requeue => {
                        tracing::info!(?jobs, "requeueing jobs before {before}");
                        self.ops.requeue_jobs(&jobs).await
                    }
                    SpotJobAction::None => Ok(()),
                };
                if let Err(e) = r {
                    tracing::warn!("job action: {e}");
                    st.last_error = Some(e.to_string());
                }
                st.job_action_done = true;
                self.save(&st)?;
            }
        }
        if node.runs_no_job() {
            st.drained(now)?;
            self.save(&st)?;
        }
        Ok(st.phase)
    }

    /// The action of the drain's cause once the node is drained: `upgrade.action` for an
    /// upgrade; a repair's reboot is `reboot`, its replacement `poweroff` (the upgrade's
    /// ways out). `None` for a cause without one.
    pub fn action_of(st: &DrainState, up: &UpgradeSettings) -> Option<UpgradeAction> {
        Self::action_of_cause(st.cause.as_ref(), up)
    }

    fn action_of_cause(cause: Option<&Cause>, up: &UpgradeSettings) -> Option<UpgradeAction> {
        match cause {
            Some(Cause::Upgrade { .. }) => Some(up.action),
            Some(Cause::Repair { action, .. }) => Some(match action {
                crate::repair::Planned::Replace => UpgradeAction::Poweroff,
                _ => UpgradeAction::Reboot,
            }),
            _ => None,
        }
    }

    async fn progress_action(&self) -> Result<Phase, DrainError> {
        // With `upgrade.delete_node_record` the poweroff action deletes the record before
        // it powers off; a retry after a failed poweroff finds no record (and no job).
        let planned = Self::action_of(&self.load()?, &self.upgrade);
        let node = match self.node_info().await {
            Ok(n) => Some(n),
            Err(DrainError::UnknownNode { .. })
                if planned == Some(UpgradeAction::Poweroff) && self.upgrade.delete_node_record =>
            {
                None
            }
            Err(e) => return Err(e),
        };
        let (cause, reason, current_phase, foreign);
        {
            let _lock = self.lock().await?;
            let mut st = self.load()?;
            if Self::action_of(&st, &self.upgrade).is_none() {
                return Ok(st.phase);
            }
            let now = time::now();
            match st.phase {
                Phase::Drained => {
                    if now < st.next_attempt {
                        return Ok(st.phase);
                    }
                    if let Some(node) = &node {
                        if !node.is_drained() {
                            tracing::warn!(node = %self.node, "node no longer drained in Slurm; someone resumed it");
                            st.resume(now)?;
                            self.save(&st)?;
                            return Ok(st.phase);
                        }
                        if !node.runs_no_job() {
                            // Never act with a job on the node.
                            return Ok(st.phase);
                        }
                        let admins = node
                            .reason()
                            .is_some_and(|r| !crate::reason::is_agent_reason(r));
                        if admins && matches!(st.cause, Some(Cause::Repair { .. })) {
                            // An administrator's reason replaced the repair's: never
                            // rebooted or replaced over it.
                            tracing::debug!(node = %self.node, reason = ?node.reason(), "an administrator's reason is on the node: the repair waits");
                            return Ok(st.phase);
                        }
                    }
                    st.act(crate::hostfacts::boot_id(), now)?;
                    self.save(&st)?;
                }
                Phase::Acting => {
                    tracing::info!("continuing an action interrupted by a restart");
                }
                p => return Ok(p),
            }
            cause = st.cause.clone();
            reason = st.reason.clone().unwrap_or_default();
            current_phase = st.phase;
            foreign = st.foreign_reason.is_some();
        }
        debug_assert_eq!(current_phase, Phase::Acting);
        let result = self
            .run_action(cause.as_ref(), &reason, foreign, node.as_ref())
            .await;
        let _lock = self.lock().await?;
        let mut st = self.load()?;
        if st.phase != Phase::Acting {
            return Ok(st.phase);
        }
        let now = time::now();
        match result {
            Ok(()) => {
                st.done(now)?;
                let hook = Self::action_of(&st, &self.upgrade) == Some(UpgradeAction::Hook);
                if hook && self.upgrade.resume_after_hook {
                    self.save(&st)?;
                    self.gateway.resume_after_action(&st).await?;
                    st.complete(now)?;
                }
            }
            Err(e) => {
                tracing::error!(node = %self.node, cause = st.cause.as_ref().map(Cause::kind), "action failed: {e}");
                let base = i64::try_from(self.drain.action_retry.0.as_secs()).unwrap_or(60);
                let wait = base
                    .saturating_mul(1i64 << st.action_attempts.min(10))
                    .min(3600);
                st.action_failed(e.to_string(), wait, now)?;
            }
        }
        self.save(&st)?;
        Ok(st.phase)
    }

    /// Runs the action of the drain of `cause` ([`Engine::action_of`],
    /// [`crate::upgrade::action`]).
    async fn run_action(
        &self,
        cause: Option<&Cause>,
        reason: &str,
        foreign: bool,
        node: Option<&NodeInfo>,
    ) -> Result<(), crate::upgrade::action::ActionError> {
        use crate::upgrade::action::{powered_off_reason, Step};
        let id = self.gateway.instance_id();
        let (images, reboot_reason, powered_off) = match cause {
            Some(Cause::Upgrade { current, desired }) => (
                (current.as_str(), desired.as_str()),
                reason.to_string(),
                powered_off_reason(id, current, desired),
            ),
            Some(Cause::Repair { detail, .. }) => {
                use crate::repair::{reason as repair_reason, Stage};
                (
                    ("", ""),
                    repair_reason(id, detail, Stage::Rebooting),
                    repair_reason(id, detail, Stage::PoweredOff(crate::time::now())),
                )
            }
            _ => (("", ""), reason.to_string(), reason.to_string()),
        };
        let Some(action) = Self::action_of_cause(cause, &self.upgrade) else {
            return Ok(());
        };
        let target = crate::upgrade::action::Target {
            gateway: &self.gateway,
            systemd_bus: &self.systemd_bus,
        };
        let step = Step {
            action,
            images,
            reason: &reboot_reason,
            powered_off: &powered_off,
            foreign,
            record: node,
            delete_record: matches!(cause, Some(Cause::Upgrade { .. })),
            // A node of Slurm's power saving is Slurm's to end and to bring back.
            power_down: matches!(cause, Some(Cause::Repair { .. }))
                && node.is_some_and(|n| n.has_flag("CLOUD")),
        };
        crate::upgrade::action::run(&self.upgrade, &target, &step).await
    }

    async fn progress_done(&self) -> Result<Phase, DrainError> {
        let st = self.load()?;
        let reboot = Self::action_of(&st, &self.upgrade) == Some(UpgradeAction::Reboot);
        if !reboot {
            return Ok(st.phase);
        }
        // After `scontrol reboot ... nextstate=resume` the node comes back available (the
        // agent may have been restarted by the reboot in between).
        let node = self.node_info().await?;
        if node.is_available() {
            let _lock = self.lock().await?;
            let mut st = self.load()?;
            if st.phase == Phase::Done {
                st.complete(time::now())?;
                self.save(&st)?;
            }
            return Ok(st.phase);
        }
        Ok(Phase::Done)
    }

    /// Rewrites the metrics file from the saved state.
    pub fn write_metrics(&self) {
        self.gateway.write_metrics();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_since_needs_a_later_responding_slurmd() {
        let node = |state: &str, start: &str| {
            NodeInfo::parse(&format!(
                "NodeName=n1 State={state} SlurmdStartTime={start} Reason=x [root@2026-01-01T00:00:00]"
            ))
        };
        // 2026-01-01T00:00:10 is 1767225610.
        let began = 1_767_225_610;
        assert!(registered_since(
            &node("IDLE+DRAIN", "2026-01-01T00:00:11"),
            began
        ));
        // The same second may be a slurmd started just before the drain.
        assert!(!registered_since(
            &node("IDLE+DRAIN", "2026-01-01T00:00:10"),
            began
        ));
        assert!(!registered_since(
            &node("IDLE+DRAIN", "2025-12-31T23:59:00"),
            began
        ));
        assert!(!registered_since(
            &node("IDLE+DRAIN+NOT_RESPONDING", "2026-01-01T00:01:00"),
            began
        ));
        assert!(!registered_since(
            &node("DOWN*+DRAIN", "2026-01-01T00:01:00"),
            began
        ));
        assert!(!registered_since(&node("IDLE+DRAIN", "None"), began));
    }
}
