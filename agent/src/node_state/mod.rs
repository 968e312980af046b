//! The one gateway for every change of the node's state in Slurm, and the drain state it
//! keeps: whoever drains, resumes, reboots or deletes this node (the drain engine, the
//! health checks and the HealthCheckProgram, the mounts, bootstrap's scratch step and
//! join, the lifecycle scripts, the upgrade's actions and its rollout check) does it through
//! [`Gateway`], which applies the ownership rules of [`crate::reason`] once and records the
//! drain in the state machine.
//!
//! - [`state`]: the states, causes and guarded transitions (pure);
//! - [`store`]: `drain.json` (atomic writes) and `drain.lock` (`flock`), shared by the
//!   daemon, the HealthCheckProgram and the one-shot commands;
//! - [`metrics`]: the Prometheus textfile, written after every saved change;
//! - [`Gateway`]: `scontrol update State=DRAIN|RESUME`, `scontrol reboot`, `scontrol delete
//!   NodeName=`, each against the state. Its `scontrol` is private: no other module calls
//!   scontrol to change the node's state (`agent/tests/module_floors.rs`,
//!   `node_state_changes_go_through_the_gateway`, fails on one that does).
//!
//! The rules, once: a drain whose reason is not the agent's ([`crate::reason`]:
//! `slurm-node-agent/<cause>@<instance-id>: ...`) is someone else's: never overwritten
//! (their reason stays and is remembered as the state's foreign reason) and never lifted
//! (unless an operator forces it); a cause takes the node only when it outranks the cause
//! that holds it ([`state::CauseKind::priority`]); a cause lifts only its own drain.
//!
//! It links no AWS SDK and no engine: the HealthCheckProgram
//! (`slurm-node-agent-healthcheck`) uses it as the daemon does.
//!
//! Floor 4 (subsystems): over `slurm`, whose `scontrol` it holds; below every module that
//! changes the node's state.

pub mod metrics;
pub mod state;
pub mod store;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::reason::{Incarnation, RecordHolder};
use crate::slurm::{NodeInfo, ScontrolError, Slurmctld};
use crate::time;
pub use state::{Begin, Cause, CauseKind, DrainState, Phase, CAPACITY_BLOCK_RECLAIM_SECS};
pub use store::{Store, StoreError};

/// A change of the node's state failed.
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

/// What [`Gateway::lift`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lifted {
    /// The cause's drain was lifted: the node resumed in Slurm (the state, if it held the
    /// cause, back to `active`).
    Resumed,
    /// The cause's drain is over, but someone else's drain holds the node (their reason
    /// was on it when the drain began, or replaced ours): left drained.
    LeftToOwner {
        /// Slurm's reason.
        reason: String,
    },
    /// Another cause of the state machine holds the node: nothing changed in Slurm.
    HeldBy(CauseKind),
    /// Nothing of this cause to lift: the node is not drained, or not for this cause.
    Nothing,
}

/// slurmctld's record `n` as the repair's breaker and flap guard count it
/// ([`crate::repair::breaker::Seen`]): its partitions and the reason that holds it; present
/// unless it is a FUTURE node, powered down or powering down by Slurm's power saving, or
/// powered off for a repair's replacement (gone: its record is the flap guard's history).
pub fn breaker_view(n: &NodeInfo) -> crate::repair::breaker::Seen<'_> {
    crate::repair::breaker::Seen {
        name: n.name(),
        partitions: n.fields.get("Partitions").map_or("", String::as_str),
        held_reason: n.held_reason(),
        present: n.base_state() != "FUTURE"
            && !n.has_flag("POWERED_DOWN")
            && !n.has_flag("POWERING_DOWN")
            && !n
                .held_reason()
                .and_then(crate::repair::parse_reason)
                .is_some_and(|p| p.powered_off()),
    }
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

/// The Prometheus textfile of the drain metrics: `drain.metrics_file`, or
/// `<state_dir>/drain.prom` when that is empty.
pub fn metrics_path(state_dir: &Path, metrics_file: &Path) -> PathBuf {
    if metrics_file.as_os_str().is_empty() {
        state_dir.join("drain.prom")
    } else {
        metrics_file.to_path_buf()
    }
}

/// The gateway: this node's state in Slurm and in `drain.json`, changed together.
#[derive(Debug, Clone)]
pub struct Gateway {
    node: String,
    instance_id: String,
    /// The only handle to scontrol's calls that change the node's state (scontrol in
    /// the program, an in-memory slurmctld in unit tests; [`crate::slurm::Scontrol`]).
    scontrol: Arc<dyn Slurmctld>,
    store: Store,
    lock_wait: Duration,
    metrics_file: PathBuf,
}

impl Gateway {
    /// The gateway of `node`, through `scontrol` (reads and changes), its state under
    /// `state_dir` (`agent.state_dir`), waiting at most `lock_wait` for `drain.lock`
    /// (`drain.lock_timeout`), its metrics to `metrics_file` ([`metrics_path`]). Writes
    /// reasons as an `unknown` incarnation until [`Gateway::with_instance`].
    pub fn new(
        node: &str,
        scontrol: impl Slurmctld + 'static,
        state_dir: &Path,
        lock_wait: Duration,
        metrics_file: PathBuf,
    ) -> Gateway {
        Gateway {
            node: node.to_string(),
            instance_id: crate::reason::UNKNOWN_INSTANCE.to_string(),
            scontrol: Arc::new(scontrol),
            store: Store::new(state_dir),
            lock_wait,
            metrics_file,
        }
    }

    /// The same gateway writing reasons as incarnation `instance_id`.
    pub fn with_instance(mut self, instance_id: &str) -> Gateway {
        self.instance_id = instance_id.to_string();
        self
    }

    /// The same gateway with another limit per scontrol call (the HealthCheckProgram's
    /// `health.scontrol_timeout`) and another wait for `drain.lock`.
    pub fn with_limits(mut self, scontrol_timeout: Duration, lock_wait: Duration) -> Gateway {
        self.scontrol = self.scontrol.with_timeout(scontrol_timeout);
        self.lock_wait = lock_wait;
        self
    }

    /// The same gateway through another `scontrol` (bootstrap's look before slurmd has a
    /// configuration, [`crate::slurm::look`]).
    pub fn through(mut self, scontrol: impl Slurmctld + 'static) -> Gateway {
        self.scontrol = Arc::new(scontrol);
        self
    }

    /// This node's NodeName.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The incarnation that writes the reasons (`unknown` when not known).
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// Where the metrics go.
    pub fn metrics_file(&self) -> &Path {
        &self.metrics_file
    }

    /// `drain.lock`, held until the value drops: taken around each read-modify-write of the
    /// state, never while waiting for jobs or while an action runs. The wait sleeps the
    /// task, not the thread ([`Store::lock_async`]).
    ///
    /// # Errors
    /// [`StoreError::Busy`] after the gateway's wait, or [`StoreError::Io`].
    pub async fn lock(&self) -> Result<store::Lock, StoreError> {
        self.store.lock_async(self.lock_wait).await
    }

    /// Reads the state (no lock: the file is replaced atomically).
    ///
    /// # Errors
    /// [`StoreError`].
    pub fn load(&self) -> Result<DrainState, StoreError> {
        self.store.load()
    }

    /// Saves the state (under [`Gateway::lock`]) and rewrites the metrics from it.
    ///
    /// # Errors
    /// [`StoreError`].
    pub fn save(&self, st: &DrainState) -> Result<(), StoreError> {
        self.store.save(st)?;
        metrics::write(&self.metrics_file, st);
        Ok(())
    }

    /// Rewrites the metrics file from the saved state.
    pub fn write_metrics(&self) {
        if let Ok(st) = self.store.load() {
            metrics::write(&self.metrics_file, &st);
        }
    }

    /// slurmctld's record of the node (`scontrol show node`; `None`: not known).
    ///
    /// # Errors
    /// [`ScontrolError`].
    pub async fn record(&self) -> Result<Option<NodeInfo>, ScontrolError> {
        self.scontrol.show_node(&self.node).await
    }

    /// Every node's record in slurmctld (`scontrol show nodes -o`): what the fleet shows,
    /// for the repair's breaker.
    ///
    /// # Errors
    /// [`ScontrolError`].
    pub async fn fleet(&self) -> Result<Vec<NodeInfo>, ScontrolError> {
        self.scontrol.show_nodes().await
    }

    /// slurmctld's record of the node; one it does not know is
    /// [`DrainError::UnknownNode`].
    ///
    /// # Errors
    /// [`DrainError`].
    pub async fn node_info(&self) -> Result<NodeInfo, DrainError> {
        self.record().await?.ok_or_else(|| DrainError::UnknownNode {
            node: self.node.clone(),
        })
    }

    /// The daemon's start: reads the state and, when it holds a drain in progress, looks
    /// once at slurmctld's record to tell whose it is ([`found_state`]). Another
    /// instance's drain is set aside (`drain.json.predecessor-<unix seconds>`, logged) and
    /// the state starts active; nothing is changed in Slurm (a drain there is bootstrap's
    /// and its owners' to lift). A look that fails leaves the state file to decide.
    ///
    /// # Errors
    /// [`DrainError::Store`].
    pub async fn load_at_start(&self) -> Result<DrainState, DrainError> {
        let st = self.store.load()?;
        if st.phase == Phase::Active {
            return Ok(st);
        }
        let record = match self.record().await {
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
        let _lock = self.lock().await?;
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

    /// A cause asks for a drain: the node is drained in Slurm with the cause's reason
    /// (unless someone else's drain is already there: their reason stays), then the state
    /// is saved. Idempotent: a notice already handled, or a drain of equal or higher
    /// priority in progress, changes nothing; a restated cause
    /// ([`CauseKind::restated`]) with other words rewrites its reason. `seen`: slurmctld's
    /// record as the caller just read it (`None`: read here).
    ///
    /// # Errors
    /// [`DrainError`]; on error the state is unchanged.
    pub async fn drain(
        &self,
        cause: Cause,
        seen: Option<&NodeInfo>,
    ) -> Result<Requested, DrainError> {
        let _lock = self.lock().await?;
        let mut st = self.store.load()?;
        let mut node = seen.cloned();
        let mut preview = st.preview(&cause);
        if !matches!(preview, Begin::Started | Begin::Escalated { .. })
            && matches!(st.phase, Phase::Draining | Phase::Drained)
        {
            // The state file says a drain is in progress; Slurm is the record. When the
            // node is no longer drained there (bootstrap lifted a notice's drain after a
            // stop/start, an operator resumed it), that drain is over: the new cause
            // starts its own rather than being remembered as handled behind it.
            if node.is_none() {
                node = self.record().await.ok().flatten();
            }
            if let Some(n) = &node {
                if !n.is_drained() && !n.has_flag("REBOOT_REQUESTED") {
                    tracing::warn!(node = %self.node, state = n.state(), "node no longer drained in Slurm; someone resumed it");
                    st.resume(time::now())?;
                    self.save(&st)?;
                    preview = st.preview(&cause);
                }
            }
        } else if !matches!(preview, Begin::Started | Begin::Escalated { .. })
            && st.phase == Phase::Done
        {
            // The action is done and the node is back in service (a reboot with
            // `nextstate=resume`) before the drain engine's next step noted it: that drain
            // is over, and a cause found now (the fault a reboot did not fix) drains at once
            // rather than leaving the node in service until the engine's step.
            if node.is_none() {
                node = self.record().await.ok().flatten();
            }
            if node.as_ref().is_some_and(NodeInfo::is_available) {
                st.complete(time::now())?;
                self.save(&st)?;
                preview = st.preview(&cause);
            }
        }
        if !matches!(
            preview,
            Begin::Started | Begin::Escalated { .. } | Begin::Restated { .. }
        ) {
            // No transition; a lower notice may still be remembered as handled.
            let before = st.clone();
            let begin = st.begin(cause, None, time::now());
            if st != before {
                self.save(&st)?;
            }
            return Ok(Requested { begin, state: st });
        }
        let node = match node {
            Some(n) => n,
            None => self.node_info().await?,
        };
        let foreign = node
            .reason()
            .filter(|r| node.is_drained() && !state::is_our_reason(r, None))
            .map(str::to_string);
        let begin = st.begin(cause, foreign.clone(), time::now());
        if let Some(c) = &st.cause {
            st.reason = Some(c.reason_for(&self.instance_id));
        }
        if let Some(f) = foreign.as_ref().or(st.foreign_reason.as_ref()) {
            tracing::warn!(node = %self.node, reason = %f, "node already drained by someone else; keeping their reason");
        } else if let Some(reason) = &st.reason {
            self.scontrol.drain(&self.node, reason).await?;
        }
        self.save(&st)?;
        Ok(Requested { begin, state: st })
    }

    /// The cause `kind` no longer needs the node drained (the health checks pass, the
    /// mounts are back, bootstrap found a notice's drain of an earlier run): when it holds
    /// the node in the state machine, the node is resumed (unless someone else's drain is
    /// there) and the state returns to `active`; when another cause holds it, nothing
    /// changes; when the state holds no drain, the agent's drain for `kind` in Slurm (a
    /// predecessor's, one made before the state knew it) is lifted. A state another
    /// instance wrote ([`found_state`]) is left for the daemon to set aside. `seen`:
    /// slurmctld's record as the caller just read it (`None`: read here).
    ///
    /// # Errors
    /// [`DrainError`].
    pub async fn lift(
        &self,
        kind: CauseKind,
        seen: Option<&NodeInfo>,
    ) -> Result<Lifted, DrainError> {
        let _lock = self.lock().await?;
        let mut st = self.store.load()?;
        let holding = st.cause.clone().filter(|_| st.phase != Phase::Active);
        let this_instances =
            found_state(&st, &self.instance_id, &RecordHolder::Unknown) == FoundState::Continue;
        match holding {
            Some(c) if c.cause_kind() == kind && this_instances => {
                if st.phase == Phase::Acting {
                    return Err(state::Refused {
                        event: "resume",
                        from: Phase::Acting.as_str(),
                    }
                    .into());
                }
                let lifted = match self.resume_in_slurm(&st, false, seen).await {
                    Ok(()) => Lifted::Resumed,
                    Err(DrainError::Foreign { reason, .. }) => {
                        tracing::info!(node = %self.node, %reason, "node drained by someone else; left drained");
                        Lifted::LeftToOwner { reason }
                    }
                    Err(e) => return Err(e),
                };
                st.resume(time::now())?;
                self.save(&st)?;
                Ok(lifted)
            }
            Some(c) if this_instances => Ok(Lifted::HeldBy(c.cause_kind())),
            _ => {
                let node = match seen {
                    Some(n) => n.clone(),
                    None => self.node_info().await?,
                };
                let ours = node
                    .reason()
                    .and_then(crate::reason::parse_reason)
                    .is_some_and(|r| CauseKind::of_reason(r.cause) == kind);
                if !node.is_drained() || !ours {
                    return Ok(Lifted::Nothing);
                }
                self.scontrol.resume(&self.node).await?;
                Ok(Lifted::Resumed)
            }
        }
    }

    /// A repair no longer called for (the breaker holds, the plan is `isolate` now, an
    /// administrator's reason replaced the repair's) hands its drain back to `cause`, the
    /// one it was planned from ([`DrainState::hand_back`]): the node stays drained, the
    /// reason becomes `cause`'s (never over someone else's, which is remembered as the
    /// state's foreign reason).
    /// Returns whether a repair's drain was handed back (`false`: none in `draining` or
    /// `drained`).
    ///
    /// # Errors
    /// [`DrainError`]; on error the state is unchanged.
    pub async fn hand_back(&self, cause: Cause) -> Result<bool, DrainError> {
        let _lock = self.lock().await?;
        let mut st = self.store.load()?;
        if !matches!(st.cause, Some(Cause::Repair { .. }))
            || !matches!(st.phase, Phase::Draining | Phase::Drained)
        {
            return Ok(false);
        }
        // An administrator's reason written over the repair's since: theirs stays.
        if st.foreign_reason.is_none() {
            if let Some(r) = self
                .record()
                .await?
                .and_then(|n| n.reason().map(str::to_string))
                .filter(|r| !crate::reason::is_agent_reason(r))
            {
                st.foreign_reason = Some(r);
            }
        }
        st.hand_back(cause, time::now())?;
        if let Some(c) = &st.cause {
            st.reason = Some(c.reason_for(&self.instance_id));
        }
        if st.foreign_reason.is_none() {
            if let Some(reason) = &st.reason {
                self.scontrol.drain(&self.node, reason).await?;
            }
        }
        self.save(&st)?;
        Ok(true)
    }

    /// Withdraws the drain with key `key` ([`Cause::key`]) if it is the current cause and
    /// still `draining` or `drained` (with `any_kind` false, only a cause the agent undoes
    /// itself: [`Cause::undoable`]): the node is resumed (only if the reason on it is still
    /// ours) and the key forgotten. A key handled before and not current is forgotten.
    /// Returns whether the drain was withdrawn.
    ///
    /// # Errors
    /// [`DrainError`].
    pub async fn withdraw(&self, key: &str, any_kind: bool) -> Result<bool, DrainError> {
        let current = self.store.load()?;
        let is_current = current.cause.as_ref().is_some_and(|c| c.key() == key);
        if !is_current && !current.handled.contains(key) {
            return Ok(false);
        }
        let _lock = self.lock().await?;
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
        tracing::info!(decision = "drain.lift", node = %self.node, key, "cause went away; resuming");
        match self.resume_in_slurm(&st, false, None).await {
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

    /// Resumes the node in Slurm if it is drained with the agent's reason; refuses (unless
    /// `force`) when the reason is someone else's. Nothing to do when the node is not
    /// drained.
    async fn resume_in_slurm(
        &self,
        st: &DrainState,
        force: bool,
        seen: Option<&NodeInfo>,
    ) -> Result<(), DrainError> {
        let node = match seen {
            Some(n) => n.clone(),
            None => self.node_info().await?,
        };
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
        self.scontrol.resume(&self.node).await?;
        Ok(())
    }

    /// An operator's `resume`: the node returns to service if the agent drained it (any
    /// of its causes) or `force`. The cause stays handled: the same notice does not drain
    /// it again.
    ///
    /// # Errors
    /// [`DrainError::Foreign`], [`DrainError::Refused`] while acting, Slurm errors.
    pub async fn resume(&self, force: bool) -> Result<DrainState, DrainError> {
        let _lock = self.lock().await?;
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
        let node = self.node_info().await?;
        let agents = node.reason().is_some_and(crate::reason::is_agent_reason);
        self.resume_in_slurm(&st, force || agents, Some(&node))
            .await?;
        st.resume(time::now())?;
        self.save(&st)?;
        Ok(st)
    }

    /// Resumes the node in Slurm after the drain's action (an upgrade hook with
    /// `upgrade.resume_after_hook`), with the rules of an agent's resume: never over
    /// someone else's reason.
    ///
    /// # Errors
    /// [`DrainError`].
    pub async fn resume_after_action(&self, st: &DrainState) -> Result<(), DrainError> {
        self.resume_in_slurm(st, false, None).await
    }

    /// Rewrites the reason of the agent's drain in place (`scontrol update State=DRAIN
    /// Reason=<reason>`): the upgrade's `... powered off for image upgrade A -> B` before a
    /// poweroff, a replacement's `... replacement still runs A`. Never over someone else's
    /// reason: a node drained with a reason not of the agent's scheme is left as it is
    /// ([`DrainError::Foreign`]). `seen`: the record as the caller just read it.
    ///
    /// # Errors
    /// [`DrainError`].
    pub async fn relabel(&self, reason: &str, seen: Option<&NodeInfo>) -> Result<(), DrainError> {
        let node = match seen {
            Some(n) => n.clone(),
            None => self.node_info().await?,
        };
        if let Some(r) = node
            .reason()
            .filter(|r| node.is_drained() && !r.is_empty() && !crate::reason::is_agent_reason(r))
        {
            return Err(DrainError::Foreign {
                node: self.node.clone(),
                reason: r.to_string(),
            });
        }
        self.scontrol.drain(&self.node, reason).await?;
        Ok(())
    }

    /// `scontrol reboot ASAP nextstate=resume reason=<reason> <node>`: the upgrade's
    /// `reboot` action (slurmctld reboots the node once it is idle, through its
    /// `RebootProgram`, and returns it to service).
    ///
    /// # Errors
    /// [`ScontrolError`] (e.g. no `RebootProgram` in slurm.conf).
    pub async fn reboot(&self, reason: &str) -> Result<(), ScontrolError> {
        self.scontrol.reboot(&self.node, reason).await
    }

    /// `scontrol update NodeName=<node> State=POWER_DOWN_ASAP Reason=<reason>`: a repair's
    /// replacement of a node of Slurm's power saving (slurmctld powers it down through its
    /// `SuspendProgram` once no job runs; a later job powers one up).
    ///
    /// # Errors
    /// [`ScontrolError`].
    pub async fn power_down(&self, reason: &str) -> Result<(), ScontrolError> {
        self.scontrol.power_down(&self.node, reason).await
    }

    /// `scontrol delete NodeName=<node>`: removes this dynamic node's record (Slurm refuses
    /// while a job runs on it or it is in a reservation): before an upgrade's poweroff with
    /// `upgrade.delete_node_record`, and bootstrap's stale record before slurmd registers a
    /// new definition.
    ///
    /// # Errors
    /// [`ScontrolError`].
    pub async fn delete_record(&self) -> Result<(), ScontrolError> {
        self.scontrol.delete_node(&self.node).await
    }

    /// `scontrol delete NodeName=<predecessor>`: removes the record of a dynamic node whose
    /// instance powered off for an upgrade and was replaced under another NodeName (an Auto
    /// Scaling group's replacement, named after its host): nothing registers under that
    /// name again, and the record would count against `MaxNodeCount`. The caller has
    /// matched the record to a gone holder of the upgrade budget; here the record is read
    /// again and deleted only when it is of another NodeName, dynamic (`DYNAMIC_NORM`),
    /// runs no job, is out of service, carries an upgrade reason of another instance, and
    /// no other instance registered under the name since (its `InstanceId`, when
    /// slurmd registered one, is the reason's): `Ok(false)` for any other, with no deletion.
    /// A replacement under the same NodeName that registers after the deletion creates the
    /// record again (dynamic nodes register themselves).
    ///
    /// # Errors
    /// [`ScontrolError`] (slurmctld refuses while a reservation names the node).
    pub async fn delete_predecessor_record(&self, name: &str) -> Result<bool, ScontrolError> {
        self.delete_gone_record(name, |_, r| r.cause == crate::reason::ReasonCause::Upgrade)
            .await
    }

    /// `scontrol delete NodeName=<name>`: removes the record of a dynamic node powered off
    /// for a repair's replacement before `before` (Unix seconds: the flap guard's window
    /// is over, and the record is history no more), with the checks of
    /// [`Gateway::delete_predecessor_record`]. `Ok(false)` for any other record.
    ///
    /// # Errors
    /// [`ScontrolError`].
    pub async fn delete_replaced_record(
        &self,
        name: &str,
        before: i64,
    ) -> Result<bool, ScontrolError> {
        self.delete_gone_record(name, |reason, _| {
            crate::repair::parse_reason(reason)
                .and_then(|p| p.powered_off_at())
                .is_some_and(|at| at < before)
        })
        .await
    }

    /// Deletes `name`'s record when its reason is the agent's, of another instance, and
    /// `ours(reason, parsed)` says it is the kind of record the caller deletes; see
    /// [`Gateway::delete_predecessor_record`].
    async fn delete_gone_record(
        &self,
        name: &str,
        ours: impl Fn(&str, &crate::reason::AgentReason) -> bool,
    ) -> Result<bool, ScontrolError> {
        if name == self.node {
            return Ok(false);
        }
        let Some(record) = self.scontrol.show_node(name).await? else {
            return Ok(false);
        };
        let writer = record.reason().and_then(|reason| {
            crate::reason::parse_reason(reason)
                .filter(|r| ours(reason, r) && r.instance_id != self.instance_id)
                .map(|r| r.instance_id)
        });
        let Some(writer) = writer else {
            return Ok(false);
        };
        let registered_since = record.instance().id.is_some_and(|id| id != writer);
        let deletable = record.has_flag("DYNAMIC_NORM")
            && record.runs_no_job()
            && !record.is_available()
            && !registered_since;
        if !deletable {
            return Ok(false);
        }
        self.scontrol.delete_node(name).await?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests;
