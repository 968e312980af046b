//! One drain state machine for every reason a node steps aside (spot interruption,
//! lifecycle termination, maintenance, image upgrade, rebalance, an operator's `drain`),
//! persisted under `agent.state_dir` so that a restarted agent continues the same drain.
//!
//! - [`state`]: the states, causes and guarded transitions (pure).
//! - [`store`]: `drain.json` (atomic writes) and `drain.lock` (`flock`), shared by the
//!   daemon and the one-shot commands.
//! - [`slurm`]: squeue/scancel/scontrol calls and the upgrade budget count.
//! - [`metrics`]: the Prometheus textfile.
//! - [`boot`]: what bootstrap does with a drain it finds at boot.
//! - [`Engine`]: applies requests and moves the machine forward against Slurm.
//!
//! The agent never resumes a node whose Slurm reason it did not set: a resume checks that
//! the reason is the agent's ([`crate::reason`]: `slurm-node-agent/<cause>@<instance-id>:
//! ...`) and that no foreign reason was on the node when the drain began.
//!
//! Floor 5 (subsystems): above `upgrade`, whose actions it runs; the `[drain]` settings
//! section ([`DrainSettings`]) is this module's.

pub mod boot;
pub mod metrics;
pub mod slurm;
pub mod state;
pub mod store;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::reason::{Incarnation, RecordHolder};
use crate::section::{HumanDuration, InvalidKey};
use crate::slurm::{NodeInfo, ScontrolError};
use crate::time;
use crate::upgrade::{UpgradeAction, UpgradeSettings};
pub use slurm::SlurmOps;
pub use state::{Begin, Cause, DrainState, Phase};
pub use store::{Store, StoreError};

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

/// A drain operation failed.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// State file or lock.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Slurm refused or did not answer.
    #[error(transparent)]
    Slurm(#[from] ScontrolError),
    /// slurmctld does not know the node.
    #[error("node {node} is not known to slurmctld")]
    UnknownNode {
        /// NodeName.
        node: String,
    },
    /// The node was drained by someone else (its reason is not ours): not resumed.
    #[error("node {node} was drained by someone else (reason {reason:?}); not resuming it (use --force)")]
    Foreign {
        /// NodeName.
        node: String,
        /// Slurm's reason.
        reason: String,
    },
    /// The transition is not allowed now (e.g. resume while the action runs).
    #[error(transparent)]
    Refused(#[from] state::Refused),
}

impl DrainError {
    /// The exit code: temporary for a busy lock or a refused transition, unavailable for
    /// Slurm or an unknown node, no permission for a foreign drain, I/O for the state.
    pub fn exit(&self) -> crate::exit::Exit {
        use crate::exit::Exit;
        match self {
            DrainError::Store(StoreError::Busy { .. }) | DrainError::Refused(_) => Exit::TempFail,
            DrainError::Store(_) => Exit::IoErr,
            DrainError::Slurm(_) | DrainError::UnknownNode { .. } => Exit::Unavailable,
            DrainError::Foreign { .. } => Exit::NoPerm,
        }
    }
}

/// The result of a drain request.
#[derive(Debug, Clone)]
pub struct Requested {
    /// What the state machine did.
    pub begin: Begin,
    /// The state after.
    pub state: DrainState,
}

/// Applies drain requests and moves the machine forward, against the real Slurm.
#[derive(Debug, Clone)]
pub struct Engine {
    /// This node's NodeName.
    pub node: String,
    /// Slurm programs.
    pub ops: SlurmOps,
    /// State folder.
    pub store: Store,
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
    /// Where the metrics go (resolved).
    pub metrics_file: PathBuf,
    /// When this process last renewed the upgrade budget slot this node holds (monotonic:
    /// the renewals follow elapsed time, not the clock).
    slot_renewed: std::sync::Arc<std::sync::Mutex<Option<std::time::Instant>>>,
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

/// What the daemon does at its start with the drain in progress it finds in `drain.json`
/// ([`found_state`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FoundState {
    /// No drain in progress, or one of this instance's (or nothing says whose): continued.
    Continue,
    /// Another instance's drain (a state folder carried over from a predecessor, or a
    /// record another instance has registered since): not continued, no action run for it.
    SetAside {
        /// The instance whose drain it is.
        owner: String,
    },
}

/// Whose is the drain in progress in `st`, found at the daemon's start by instance
/// `instance_id` on a record held by `holder`: the writer named in the state's own reason
/// (`slurm-node-agent/<cause>@<instance-id>: ...`; `unknown` without one), against the
/// record's `InstanceId` where Slurm keeps it ([`RecordHolder::incarnation_of`]). A state
/// written by another instance, or a state of this instance's on a record Slurm says
/// another instance has registered since, is set aside: continuing it would run a job
/// action or an upgrade action (a `scontrol reboot` of the NodeName) for a drain that is
/// not this instance's. Where neither says, the state is continued as before.
pub fn found_state(st: &DrainState, instance_id: &str, holder: &RecordHolder) -> FoundState {
    if st.phase == Phase::Active {
        return FoundState::Continue;
    }
    let writer = st
        .reason
        .as_deref()
        .and_then(crate::reason::parse_reason)
        .map_or_else(
            || crate::reason::UNKNOWN_INSTANCE.to_string(),
            |r| r.instance_id,
        );
    match holder.incarnation_of(&writer, instance_id) {
        Incarnation::Other(owner) => FoundState::SetAside { owner },
        Incarnation::This | Incarnation::Unknown => FoundState::Continue,
    }
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
        let metrics_file = if drain.metrics_file.as_os_str().is_empty() {
            state_dir.join("drain.prom")
        } else {
            drain.metrics_file.clone()
        };
        Engine {
            node: node.to_string(),
            ops: SlurmOps::new(bin_dir),
            store: Store::new(state_dir),
            spot_jobs,
            upgrade: upgrade.clone(),
            drain: drain.clone(),
            instance_id: crate::reason::UNKNOWN_INSTANCE.to_string(),
            systemd_bus: systemd_bus.to_string(),
            metrics_file,
            slot_renewed: std::sync::Arc::default(),
        }
    }

    /// The same engine writing reasons as incarnation `instance_id`.
    pub fn with_instance(mut self, instance_id: &str) -> Engine {
        self.instance_id = instance_id.to_string();
        self
    }

    fn lock(&self) -> Result<store::Lock, StoreError> {
        self.store.lock(self.drain.lock_timeout.0)
    }

    fn save(&self, st: &DrainState) -> Result<(), StoreError> {
        self.store.save(st)?;
        metrics::write(&self.metrics_file, st);
        Ok(())
    }

    /// Reads the state (no lock: the file is replaced atomically).
    ///
    /// # Errors
    /// [`StoreError`].
    pub fn load(&self) -> Result<DrainState, StoreError> {
        self.store.load()
    }

    /// The daemon's start: reads the state and, when it holds a drain in progress, looks
    /// once at slurmctld's record (as the first progress step would) to tell whose it is
    /// ([`found_state`]). Another instance's drain is set aside (`drain.json.predecessor-
    /// <unix seconds>`, logged) and the state starts active; nothing is changed in Slurm (a
    /// drain there is bootstrap's and its owners' to lift). A look that fails leaves the
    /// state file to decide.
    ///
    /// # Errors
    /// [`DrainError::Store`].
    pub async fn load_at_start(&self) -> Result<DrainState, DrainError> {
        let st = self.store.load()?;
        if st.phase == Phase::Active {
            return Ok(st);
        }
        let record = match self.ops.scontrol.show_node(&self.node).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(node = %self.node, "slurmctld's record, to tell whose the drain in progress is: {e}");
                None
            }
        };
        let holder = RecordHolder::of(
            record.as_ref().and_then(|n| n.instance().id),
            &self.instance_id,
        );
        let FoundState::SetAside { owner } = found_state(&st, &self.instance_id, &holder) else {
            return Ok(st);
        };
        let _lock = self.lock()?;
        let aside = self.store.set_aside("predecessor")?;
        tracing::warn!(
            node = %self.node,
            phase = st.phase.as_str(),
            reason = st.reason.as_deref(),
            owner = %owner,
            record_instance = ?record.as_ref().and_then(|n| n.instance().id),
            kept_as = ?aside,
            "the drain in progress in the state folder is instance {owner}'s, not this instance's: not continued"
        );
        let fresh = DrainState::default();
        metrics::write(&self.metrics_file, &fresh);
        Ok(fresh)
    }

    async fn node_info(&self) -> Result<NodeInfo, DrainError> {
        self.ops
            .scontrol
            .show_node(&self.node)
            .await?
            .ok_or_else(|| DrainError::UnknownNode {
                node: self.node.clone(),
            })
    }

    /// A cause asks for a drain: the node is drained in Slurm with the cause's reason
    /// (unless someone else's drain is already there: their reason stays), then the state
    /// is saved. Idempotent: a notice already handled, or a drain of equal or higher
    /// priority in progress, changes nothing.
    ///
    /// # Errors
    /// [`DrainError`]; on error the state is unchanged.
    pub async fn request(&self, cause: Cause) -> Result<Requested, DrainError> {
        let _lock = self.lock()?;
        let mut st = self.store.load()?;
        let mut preview = st.preview(&cause);
        if matches!(preview, Begin::AlreadyDraining { .. })
            && matches!(st.phase, Phase::Draining | Phase::Drained)
        {
            // The state file says a drain is in progress; Slurm is the record. When the
            // node is no longer drained there (bootstrap lifted a notice's drain after a
            // stop/start, an operator resumed it), that drain is over: the new notice
            // starts its own rather than being remembered as handled behind it.
            if let Ok(node) = self.node_info().await {
                if !node.is_drained() && !node.has_flag("REBOOT_REQUESTED") {
                    tracing::warn!(node = %self.node, state = node.state(), "node no longer drained in Slurm; someone resumed it");
                    st.resume(time::now())?;
                    self.save(&st)?;
                    preview = st.preview(&cause);
                }
            }
        }
        if !matches!(preview, Begin::Started | Begin::Escalated { .. }) {
            // No transition; a lower notice may still be remembered as handled.
            let before = st.clone();
            let begin = st.begin(cause, None, time::now());
            if st != before {
                self.save(&st)?;
            }
            return Ok(Requested { begin, state: st });
        }
        let node = self.node_info().await?;
        let foreign = node
            .reason()
            .filter(|r| node.is_drained() && !state::is_our_reason(r, None))
            .map(str::to_string);
        let begin = st.begin(cause, foreign.clone(), time::now());
        if let Some(c) = &st.cause {
            st.reason = Some(c.reason_for(&self.instance_id));
        }
        if let Some(f) = &foreign {
            tracing::warn!(node = %self.node, reason = %f, "node already drained by someone else; keeping their reason");
        } else if let Some(reason) = &st.reason {
            self.ops.scontrol.drain(&self.node, reason).await?;
        }
        self.save(&st)?;
        Ok(Requested { begin, state: st })
    }

    /// The maintenance event with key `key` no longer needs a drain: if it is the current
    /// cause, the node is resumed (only if the reason on the node is still ours).
    ///
    /// # Errors
    /// [`DrainError`].
    pub async fn undo(&self, key: &str) -> Result<bool, DrainError> {
        self.undo_inner(key, false).await
    }

    /// The maintenance event with key `key` is over and took the instance down (a reboot, a
    /// stop): like [`Engine::undo`], once this node's slurmd has registered with slurmctld
    /// again, started after the second the drain began ([`registered_since`]). Until then nothing changes
    /// (`Ok(false)`) and the next poll asks again.
    ///
    /// # Errors
    /// [`DrainError`].
    pub async fn undo_after_registration(&self, key: &str) -> Result<bool, DrainError> {
        let st = self.store.load()?;
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
        self.undo_inner(key, false).await
    }

    /// Withdraws the drain with key `key` whatever its kind, if it is still `draining` or
    /// `drained`.
    ///
    /// # Errors
    /// [`DrainError`].
    pub async fn withdraw(&self, key: &str) -> Result<bool, DrainError> {
        self.undo_inner(key, true).await
    }

    async fn undo_inner(&self, key: &str, any_kind: bool) -> Result<bool, DrainError> {
        let current = self.store.load()?;
        let is_current = current.cause.as_ref().is_some_and(|c| c.key() == key);
        if !is_current && !current.handled.contains(key) {
            return Ok(false);
        }
        let _lock = self.lock()?;
        let mut st = self.store.load()?;
        let is_current = st
            .cause
            .as_ref()
            .is_some_and(|c| c.key() == key && (any_kind || c.undoable()));
        if !is_current || !matches!(st.phase, Phase::Draining | Phase::Drained) {
            if st.handled.contains(key) && st.cause.as_ref().is_none_or(|c| c.key() != key) {
                st.forget(key);
                self.save(&st)?;
            }
            return Ok(false);
        }
        tracing::info!(node = %self.node, key, "cause went away; resuming");
        match self.resume_in_slurm(&st, false).await {
            Ok(()) => {}
            Err(DrainError::Foreign { reason, .. }) => {
                // Our drain is over, theirs is not: leave the node as it is.
                tracing::info!(node = %self.node, %reason, "node drained by someone else; left drained");
            }
            Err(e) => return Err(e),
        }
        st.resume(time::now())?;
        st.forget(key);
        self.save(&st)?;
        Ok(true)
    }

    /// Resumes the node in Slurm if it is drained with our reason; refuses (unless `force`)
    /// when the reason is someone else's. Nothing to do when the node is not drained.
    async fn resume_in_slurm(&self, st: &DrainState, force: bool) -> Result<(), DrainError> {
        let node = self.node_info().await?;
        if !node.is_drained() {
            return Ok(());
        }
        let reason = node.reason().unwrap_or_default().to_string();
        let ours = st.foreign_reason.is_none()
            && (state::is_our_reason(&reason, None) || reason.is_empty());
        if !ours && !force {
            return Err(DrainError::Foreign {
                node: self.node.clone(),
                reason,
            });
        }
        self.ops.scontrol.resume(&self.node).await?;
        Ok(())
    }

    /// An operator's `resume`: the node returns to service if the agent drained it (or
    /// `force`). The cause stays handled: the same notice does not drain it again.
    ///
    /// # Errors
    /// [`DrainError::Foreign`], [`DrainError::Refused`] while acting, Slurm errors.
    pub async fn resume(&self, force: bool) -> Result<DrainState, DrainError> {
        let _lock = self.lock()?;
        let mut st = self.store.load()?;
        if st.phase == Phase::Acting {
            return Err(state::Refused {
                event: "resume",
                from: Phase::Acting.as_str(),
            }
            .into());
        }
        // Any of the agent's reasons (health checks and mounts too) is the operator's to
        // lift; an admin's only with --force.
        let agents = self
            .node_info()
            .await?
            .reason()
            .is_some_and(crate::reason::is_agent_reason);
        self.resume_in_slurm(&st, force || agents).await?;
        st.resume(time::now())?;
        self.save(&st)?;
        Ok(st)
    }

    /// One step forward from the current phase (see the module docs of [`state`]): checks
    /// the node, takes the spot job action when due, notes `drained`, runs the action.
    /// Returns the phase after the step.
    ///
    /// # Errors
    /// [`DrainError`]; the state stays consistent (what happened is saved).
    pub async fn progress(&self) -> Result<Phase, DrainError> {
        let phase = self.store.load()?.phase;
        match phase {
            Phase::Active => Ok(Phase::Active),
            Phase::Draining => {
                self.renew_upgrade_slot().await;
                self.progress_draining().await
            }
            Phase::Drained => {
                self.renew_upgrade_slot().await;
                self.progress_action().await
            }
            Phase::Acting => self.progress_action().await,
            Phase::Done => self.progress_done().await,
        }
    }

    /// Notes that the upgrade budget slot was taken or renewed now.
    pub fn slot_renewed_now(&self) {
        if let Ok(mut t) = self.slot_renewed.lock() {
            *t = Some(std::time::Instant::now());
        }
    }

    /// Renews the upgrade budget slot this node holds ([`crate::upgrade::slot::renew`]) when
    /// a third of `upgrade.slot_timeout` has passed since this process last took or renewed
    /// it (at once after a restart): each renewal adds that third to the reservation, so
    /// its end stays between two and three thirds ahead while the node lives. A failure is
    /// logged and tried again at the next step.
    pub async fn renew_slot_if_due(&self) {
        let every = self.upgrade.slot_timeout.0 / 3;
        let due = self
            .slot_renewed
            .lock()
            .map_or(true, |t| t.is_none_or(|t| t.elapsed() >= every));
        if !due {
            return;
        }
        match crate::upgrade::slot::renew(&self.ops.scontrol, &self.node, every).await {
            Ok(renewed) => {
                if !renewed.is_empty() {
                    tracing::info!(node = %self.node, ?renewed, "renewed the upgrade budget slot");
                }
                self.slot_renewed_now();
            }
            Err(e) => tracing::warn!(node = %self.node, "renewing the upgrade budget slot: {e}"),
        }
    }

    async fn progress_draining(&self) -> Result<Phase, DrainError> {
        let node = self.node_info().await?;
        let _lock = self.lock()?;
        let mut st = self.store.load()?;
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
        if let Some(Cause::Spot { time: deadline, .. }) = st.cause.clone() {
            let lead = i64::try_from(self.spot_jobs.lead.as_secs()).unwrap_or(0);
            if !st.job_action_done
                && self.spot_jobs.action != SpotJobAction::None
                && deadline - lead <= now
            {
                let jobs = self.ops.jobs_on(&self.node).await?;
                let r = match self.spot_jobs.action {
                    SpotJobAction::Signal => {
                        let sig = self.spot_jobs.signal.trim_start_matches("SIG");
                        tracing::info!(
                            ?jobs,
                            signal = sig,
                            "signalling jobs before the spot interruption"
                        );
                        self.ops.signal_jobs(&jobs, sig).await
                    }
                    SpotJobAction::Requeue => {
                        tracing::info!(?jobs, "requeueing jobs before the spot interruption");
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

    /// An upgrade drain renews its budget slot ([`Engine::renew_slot_if_due`]).
    async fn renew_upgrade_slot(&self) {
        let upgrade = self
            .store
            .load()
            .is_ok_and(|st| matches!(st.cause, Some(Cause::Upgrade { .. })));
        if upgrade {
            self.renew_slot_if_due().await;
        }
    }

    fn action_of(st: &DrainState, up: &UpgradeSettings) -> Option<UpgradeAction> {
        match st.cause {
            Some(Cause::Upgrade { .. }) => Some(up.action),
            _ => None,
        }
    }

    /// The upgrade budget of this node's partition: `(partition, count, limit)`, where the
    /// partition is `upgrade.budget_partition` or the node's first one, `count` its nodes
    /// (and those with an upgrade reason, for the log) and `limit` `upgrade.max_unavailable`
    /// of its nodes: the number of slots ([`crate::upgrade::slot`]).
    ///
    /// # Errors
    /// [`DrainError`] from scontrol.
    pub async fn upgrade_budget(
        &self,
        node: &NodeInfo,
    ) -> Result<(String, slurm::BudgetCount, usize), DrainError> {
        let partition = if self.upgrade.budget_partition.is_empty() {
            node.fields
                .get("Partitions")
                .and_then(|p| p.split(',').next())
                .unwrap_or_default()
                .to_string()
        } else {
            self.upgrade.budget_partition.clone()
        };
        let budget = crate::upgrade::Budget::parse(&self.upgrade.max_unavailable)
            .unwrap_or(crate::upgrade::Budget::Nodes(1));
        let count = self.ops.count_upgrading(&partition).await?;
        let limit = budget.limit(count.total);
        Ok((partition, count, limit))
    }

    async fn progress_action(&self) -> Result<Phase, DrainError> {
        // With `upgrade.delete_node_record` the poweroff action deletes the record before
        // it powers off; a retry after a failed poweroff finds no record (and no job).
        let node = match self.node_info().await {
            Ok(n) => Some(n),
            Err(DrainError::UnknownNode { .. })
                if self.upgrade.action == UpgradeAction::Poweroff
                    && self.upgrade.delete_node_record =>
            {
                None
            }
            Err(e) => return Err(e),
        };
        let (cause, reason, current_phase, foreign);
        {
            let _lock = self.lock()?;
            let mut st = self.store.load()?;
            let Some(_action) = Self::action_of(&st, &self.upgrade) else {
                return Ok(st.phase);
            };
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
        let _lock = self.lock()?;
        let mut st = self.store.load()?;
        if st.phase != Phase::Acting {
            return Ok(st.phase);
        }
        let now = time::now();
        match result {
            Ok(()) => {
                st.done(now)?;
                if self.upgrade.action == UpgradeAction::Hook && self.upgrade.resume_after_hook {
                    self.save(&st)?;
                    self.resume_in_slurm(&st, false).await?;
                    st.complete(now)?;
                }
            }
            Err(e) => {
                tracing::error!(node = %self.node, "upgrade action failed: {e}");
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

    /// Runs `upgrade.action` for the drain of `cause` ([`crate::upgrade::action`]).
    async fn run_action(
        &self,
        cause: Option<&Cause>,
        reason: &str,
        foreign: bool,
        node: Option<&NodeInfo>,
    ) -> Result<(), crate::upgrade::action::ActionError> {
        let images = match cause {
            Some(Cause::Upgrade { current, desired }) => (current.as_str(), desired.as_str()),
            _ => ("", ""),
        };
        let target = crate::upgrade::action::Target {
            node: &self.node,
            instance_id: &self.instance_id,
            scontrol: &self.ops.scontrol,
            systemd_bus: &self.systemd_bus,
        };
        crate::upgrade::action::run(&self.upgrade, &target, images, reason, foreign, node).await
    }

    async fn progress_done(&self) -> Result<Phase, DrainError> {
        let st = self.store.load()?;
        let reboot = matches!(st.cause, Some(Cause::Upgrade { .. }))
            && self.upgrade.action == UpgradeAction::Reboot;
        if !reboot {
            return Ok(st.phase);
        }
        // After `scontrol reboot ... nextstate=resume` the node comes back available (the
        // agent may have been restarted by the reboot in between).
        let node = self.node_info().await?;
        if node.is_available() {
            let _lock = self.lock()?;
            let mut st = self.store.load()?;
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
        if let Ok(st) = self.store.load() {
            metrics::write(&self.metrics_file, &st);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drain_found_at_start_is_continued_only_when_it_is_this_instances() {
        const ME: &str = "i-0123456789abcdef0";
        const PREV: &str = "i-0fedcba9876543210";
        let unknown = crate::reason::UNKNOWN_INSTANCE;
        let drain_by = |writer: &str| {
            let mut st = DrainState::default();
            let cause = Cause::Upgrade {
                current: "ami-11111111".into(),
                desired: "ami-22222222".into(),
            };
            st.begin(cause.clone(), None, 1);
            st.reason = Some(cause.reason_for(writer));
            st
        };
        let this = RecordHolder::This;
        let prev = RecordHolder::Predecessor(PREV.into());
        let none = RecordHolder::Unknown;
        let aside = |owner: &str| FoundState::SetAside {
            owner: owner.into(),
        };
        // Nothing in progress: nothing to decide.
        assert_eq!(
            found_state(&DrainState::default(), ME, &prev),
            FoundState::Continue
        );
        // This instance's state: continued, unless Slurm says another instance has
        // registered the NodeName since.
        assert_eq!(found_state(&drain_by(ME), ME, &this), FoundState::Continue);
        assert_eq!(found_state(&drain_by(ME), ME, &none), FoundState::Continue);
        assert_eq!(found_state(&drain_by(ME), ME, &prev), aside(PREV));
        // A predecessor's state folder: set aside, whatever the record says.
        for holder in [&this, &prev, &none] {
            assert_eq!(
                found_state(&drain_by(PREV), ME, holder),
                aside(PREV),
                "{holder:?}"
            );
        }
        // A writer `unknown`: the record decides; without it, continued as before.
        assert_eq!(
            found_state(&drain_by(unknown), ME, &this),
            FoundState::Continue
        );
        assert_eq!(found_state(&drain_by(unknown), ME, &prev), aside(PREV));
        assert_eq!(
            found_state(&drain_by(unknown), ME, &none),
            FoundState::Continue
        );
    }

    #[test]
    fn a_state_set_aside_keeps_its_content_and_the_next_load_is_active() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let store = Store::new(dir.path());
        assert_eq!(store.set_aside("predecessor").ok(), Some(None));
        let mut st = DrainState::default();
        st.begin(Cause::Manual { reason: "x".into() }, None, 1);
        store.save(&st).unwrap_or_else(|e| panic!("{e}"));
        let kept = std::fs::read(store.path()).unwrap_or_else(|e| panic!("{e}"));
        let aside = store
            .set_aside("predecessor")
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("nothing set aside"));
        assert!(aside
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("drain.json.predecessor-")));
        assert_eq!(std::fs::read(&aside).ok(), Some(kept));
        assert_eq!(store.load().ok(), Some(DrainState::default()));
    }

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
