//! The drain state machine: states, causes, guarded transitions. Pure: no I/O, the time is
//! passed in, so every transition is unit-tested. `docs/drain-state-machine.md` draws it.
//!
//! ```text
//!            begin                 no jobs left             cause has an action
//! active ──────────▶ draining ─────────────────▶ drained ─────────────────────▶ acting
//!   ▲                   │                          │   ▲   action failed (retry)   │
//!   │     resume        │                          │   └───────────────────────────┤
//!   ├───────────────────┘◀─────────────────────────┘                               │ ok
//!   │                         resume                                               ▼
//!   └───────────────────────────── complete (node back after reboot/hook) ──────── done
//! ```
//!
//! A cause with a higher [`Cause::priority`] replaces the current one while draining or
//! drained (`escalate`: e.g. a spot notice during an upgrade drain, so the upgrade action is
//! not run); never during `acting` or `done`.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::time;

/// Start of every reason this agent sets on a node: the scheme of [`crate::reason`],
/// `slurm-node-agent/<cause>@<instance-id>: <detail>`. A node whose reason does not parse
/// so was drained by someone else and is never resumed by the agent.
pub use crate::reason::REASON_PREFIX;
use crate::reason::{self, ReasonCause};

/// How many transitions the state keeps in its history.
const HISTORY_LEN: usize = 32;

/// Where the drain stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Not drained by the agent.
    Active,
    /// DRAIN set in Slurm; jobs may still run.
    Draining,
    /// DRAIN set and no job left on the node.
    Drained,
    /// Running the cause's action (power off, reboot, hook).
    Acting,
    /// The action finished (or was handed to Slurm / systemd).
    Done,
}

impl Phase {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Active => "active",
            Phase::Draining => "draining",
            Phase::Drained => "drained",
            Phase::Acting => "acting",
            Phase::Done => "done",
        }
    }

    /// Every phase, in order.
    pub const ALL: [Phase; 5] = [
        Phase::Active,
        Phase::Draining,
        Phase::Drained,
        Phase::Acting,
        Phase::Done,
    ];
}

/// The kinds of [`Cause`], each a row of the table of causes in
/// `docs/drain-state-machine.md` (a test compares them): its priority, whether the agent
/// undoes it by itself, and its action once the node is drained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CauseKind {
    /// A spot interruption notice (`terminate`, `stop`, `hibernate`).
    Spot,
    /// An Auto Scaling target lifecycle state `Terminated`.
    Lifecycle,
    /// An operator's `drain --reason`.
    Manual,
    /// A scheduled maintenance event.
    Maintenance,
    /// A rolling image upgrade.
    Upgrade,
    /// A rebalance recommendation.
    Rebalance,
    /// A health check failed (the daemon's checks, `check`, the HealthCheckProgram).
    Health,
    /// A required mount is not in place.
    Mount,
    /// A lifecycle script failed with `on_failure = "terminate"`: drained before the
    /// instance powers off.
    Script,
    /// Node-local scratch is not in place (bootstrap's scratch step).
    Scratch,
    /// A repair (`repair.mode = "on"`): a fault that calls for a reboot or a replacement,
    /// run once no job is left, in a slot of the rollout's budget.
    Repair,
    /// The start-up gate runs (or failed) in this boot (the `gate` module): lifted by the gate
    /// alone, when it passes.
    Gate,
    /// The instance's Capacity Block ends: drained `events.capacity_block_lead` before EC2
    /// begins terminating its instances; undone when the block is extended.
    #[serde(rename = "capacity-block")]
    CapacityBlock,
}

impl CauseKind {
    /// Every kind, in the order of the table of causes in `docs/drain-state-machine.md`.
    pub const ALL: [CauseKind; 13] = [
        CauseKind::Spot,
        CauseKind::Lifecycle,
        CauseKind::Script,
        CauseKind::Manual,
        CauseKind::Maintenance,
        CauseKind::CapacityBlock,
        CauseKind::Repair,
        CauseKind::Upgrade,
        CauseKind::Rebalance,
        CauseKind::Health,
        CauseKind::Mount,
        CauseKind::Scratch,
        CauseKind::Gate,
    ];

    /// `spot`, `lifecycle`, `manual`, `maintenance`, `repair`, `upgrade`, `rebalance`,
    /// `health`, `mount`, `script`, `scratch`: the `kind` in `drain.json`, the metrics and
    /// `status`.
    pub fn as_str(self) -> &'static str {
        match self {
            CauseKind::Spot => "spot",
            CauseKind::Lifecycle => "lifecycle",
            CauseKind::Manual => "manual",
            CauseKind::Maintenance => "maintenance",
            CauseKind::Upgrade => "upgrade",
            CauseKind::Rebalance => "rebalance",
            CauseKind::Health => "health",
            CauseKind::Mount => "mount",
            CauseKind::Script => "script",
            CauseKind::Scratch => "scratch",
            CauseKind::Repair => "repair",
            CauseKind::Gate => "gate",
            CauseKind::CapacityBlock => "capacity-block",
        }
    }

    /// Higher wins: the instance going away (spot, lifecycle, a lifecycle script's
    /// terminate) outranks an operator, who outranks the notices the agent undoes, which
    /// outrank the conditions the agent lifts when they clear (health, mounts, scratch):
    /// those keep the node only while nothing else does. A repair outranks an upgrade (the
    /// node is faulty whatever its image; both hold the same budget slot) and the
    /// conditions it was planned from, and yields to an operator, a scheduled event and
    /// the instance going away.
    pub fn priority(self) -> u8 {
        match self {
            CauseKind::Spot | CauseKind::Lifecycle | CauseKind::Script => 40,
            CauseKind::Manual => 30,
            CauseKind::Maintenance | CauseKind::CapacityBlock => 20,
            CauseKind::Repair => 17,
            CauseKind::Upgrade => 15,
            CauseKind::Rebalance => 10,
            CauseKind::Health | CauseKind::Mount | CauseKind::Scratch | CauseKind::Gate => 5,
        }
    }

    /// Whether the cause has an action once the node is drained: the upgrade's
    /// `upgrade.action`, a repair's reboot or replacement.
    pub fn has_action(self) -> bool {
        matches!(self, CauseKind::Upgrade | CauseKind::Repair)
    }

    /// Whether the cause's owner states it again at each of its checks (a health pass, a
    /// mount pass, bootstrap's scratch and script steps): never remembered as handled, and
    /// a new detail of the same kind rewrites the reason (`restate`). A repair is stated
    /// at each health pass with the checks' words and its plan.
    pub fn restated(self) -> bool {
        matches!(
            self,
            CauseKind::Health
                | CauseKind::Mount
                | CauseKind::Script
                | CauseKind::Scratch
                | CauseKind::Repair
                | CauseKind::Gate
        )
    }

    /// The kind of the agent's reason `cause` ([`crate::reason::ReasonCause`]): `stop`
    /// and `hibernate` are spot notices, `operator` is a manual drain.
    pub fn of_reason(cause: ReasonCause) -> CauseKind {
        match cause {
            ReasonCause::Spot | ReasonCause::Stop | ReasonCause::Hibernate => CauseKind::Spot,
            ReasonCause::Lifecycle => CauseKind::Lifecycle,
            ReasonCause::Operator => CauseKind::Manual,
            ReasonCause::Maintenance => CauseKind::Maintenance,
            ReasonCause::Upgrade => CauseKind::Upgrade,
            ReasonCause::Rebalance => CauseKind::Rebalance,
            ReasonCause::Health => CauseKind::Health,
            ReasonCause::Mount => CauseKind::Mount,
            ReasonCause::Script => CauseKind::Script,
            ReasonCause::Scratch => CauseKind::Scratch,
            ReasonCause::Repair => CauseKind::Repair,
            ReasonCause::Gate => CauseKind::Gate,
            ReasonCause::CapacityBlock => CauseKind::CapacityBlock,
        }
    }
}

impl std::fmt::Display for CauseKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How long before a Capacity Block's end EC2 begins terminating its instances, seconds
/// (EC2 User Guide, "Capacity Blocks for ML": "EC2 starts terminating any instances that
/// are running in the Capacity Block 30 minutes before the end time").
pub const CAPACITY_BLOCK_RECLAIM_SECS: i64 = 30 * 60;

/// Why the node is drained.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Cause {
    /// A spot interruption notice.
    Spot {
        /// `terminate`, `stop`, `hibernate` or what IMDS said.
        action: String,
        /// Interruption time, Unix seconds.
        time: i64,
    },
    /// An Auto Scaling target lifecycle state `Terminated`.
    Lifecycle {
        /// The state read.
        state: String,
        /// When the state was first seen, Unix seconds: the lifecycle hooks' and the job
        /// action's clock (`events.lifecycle_max_wait`), whatever drain came before. 0: not
        /// known (a `drain.json` of an older agent): the drain's start stands in.
        #[serde(default)]
        seen: i64,
    },
    /// An operator's `drain --reason`.
    Manual {
        /// The operator's words.
        reason: String,
    },
    /// A scheduled maintenance event, drained ahead of `NotBefore`.
    Maintenance {
        /// `instance-event-...`.
        event_id: String,
        /// Event code.
        code: String,
        /// Start of the window, Unix seconds (`None`: unknown, treated as now).
        not_before: Option<i64>,
    },
    /// The desired image differs from the running one.
    Upgrade {
        /// The running image.
        current: String,
        /// The desired image.
        desired: String,
    },
    /// A rebalance recommendation.
    Rebalance {
        /// When it was issued, Unix seconds.
        notice_time: i64,
    },
    /// A health check failed.
    Health {
        /// The reason's words after `slurm-node-agent/health@<instance-id>: ` (the failing
        /// check, its message, ` (+N more)`), as the health checks wrote them.
        detail: String,
    },
    /// A required mount is not in place.
    Mount {
        /// The reason's words after `slurm-node-agent/mount@<instance-id>: `.
        detail: String,
    },
    /// A lifecycle script failed with `on_failure = "terminate"`.
    Script {
        /// The reason's words after `slurm-node-agent/script@<instance-id>: `.
        detail: String,
    },
    /// Node-local scratch is not in place.
    Scratch {
        /// The reason's words after `slurm-node-agent/scratch@<instance-id>: `.
        detail: String,
    },
    /// The start-up gate runs or failed in this boot (the `gate` module).
    Gate {
        /// The reason's words after `slurm-node-agent/gate@<instance-id>: `.
        detail: String,
    },
    /// The instance's Capacity Block for ML ends: EC2 begins terminating its instances 30
    /// minutes before `end`; drained `events.capacity_block_lead` before that.
    #[serde(rename = "capacity-block")]
    CapacityBlock {
        /// The capacity reservation, `cr-...`.
        reservation_id: String,
        /// The block's end (`EndDate`), Unix seconds.
        end: i64,
    },
    /// A repair: the health checks' fault calls for a reboot or a replacement
    /// ([`crate::repair`]).
    Repair {
        /// `reboot` or `replace`.
        action: crate::repair::Planned,
        /// The fault.
        fault: crate::repair::Fault,
        /// The check that found it.
        check: String,
        /// The health checks' words (`<check>: <message> (+N more)`); the reason adds the
        /// plan (`[reboot after jobs]`, [`crate::repair::reason_detail`]).
        detail: String,
    },
}

impl Cause {
    /// Its kind ([`CauseKind`]).
    pub fn cause_kind(&self) -> CauseKind {
        match self {
            Cause::Spot { .. } => CauseKind::Spot,
            Cause::Lifecycle { .. } => CauseKind::Lifecycle,
            Cause::Manual { .. } => CauseKind::Manual,
            Cause::Maintenance { .. } => CauseKind::Maintenance,
            Cause::Upgrade { .. } => CauseKind::Upgrade,
            Cause::Rebalance { .. } => CauseKind::Rebalance,
            Cause::Health { .. } => CauseKind::Health,
            Cause::Mount { .. } => CauseKind::Mount,
            Cause::Script { .. } => CauseKind::Script,
            Cause::Scratch { .. } => CauseKind::Scratch,
            Cause::Repair { .. } => CauseKind::Repair,
            Cause::Gate { .. } => CauseKind::Gate,
            Cause::CapacityBlock { .. } => CauseKind::CapacityBlock,
        }
    }

    /// `spot`, `lifecycle`, `manual`, `maintenance`, `upgrade`, `rebalance`, `health`,
    /// `mount`, `script`, `scratch` ([`CauseKind::as_str`]).
    pub fn kind(&self) -> &'static str {
        self.cause_kind().as_str()
    }

    /// Higher wins ([`CauseKind::priority`]).
    pub fn priority(&self) -> u8 {
        self.cause_kind().priority()
    }

    /// The cause of kind `cause` (health, mount, script or scratch: the causes whose owner
    /// writes the detail) from the reason `reason` it built for incarnation `instance_id`
    /// (`slurm-node-agent/<cause>@<instance-id>: <detail>`): the detail is kept as written.
    /// `None` for another cause, or a reason that does not start so.
    pub fn stated(cause: ReasonCause, instance_id: &str, reason: &str) -> Option<Cause> {
        let detail = reason
            .strip_prefix(&reason::reason_head(cause, instance_id))?
            .to_string();
        match cause {
            ReasonCause::Health => Some(Cause::Health { detail }),
            ReasonCause::Mount => Some(Cause::Mount { detail }),
            ReasonCause::Script => Some(Cause::Script { detail }),
            ReasonCause::Scratch => Some(Cause::Scratch { detail }),
            ReasonCause::Gate => Some(Cause::Gate { detail }),
            _ => None,
        }
    }

    /// The key under which the notice is remembered as handled, so that a notice seen again
    /// (every poll) is acted on once. A restated cause ([`CauseKind::restated`]) has its
    /// kind as key and is never remembered.
    pub fn key(&self) -> String {
        match self {
            Cause::Spot { time, .. } => format!("spot:{time}"),
            Cause::Lifecycle { state, .. } => format!("lifecycle:{state}"),
            Cause::Manual { reason } => format!("manual:{reason}"),
            Cause::Maintenance { event_id, .. } => format!("maintenance:{event_id}"),
            Cause::Upgrade { desired, .. } => format!("upgrade:{desired}"),
            Cause::Rebalance { notice_time } => format!("rebalance:{notice_time}"),
            Cause::CapacityBlock {
                reservation_id,
                end,
            } => format!("capacity-block:{reservation_id}:{end}"),
            Cause::Health { .. }
            | Cause::Mount { .. }
            | Cause::Script { .. }
            | Cause::Scratch { .. }
            | Cause::Gate { .. }
            | Cause::Repair { .. } => self.kind().to_string(),
        }
    }

    /// The cause word of its Slurm reason ([`crate::reason::ReasonCause`]): a spot
    /// notice's `stop` and `hibernate` are their own causes, an operator's drain is
    /// `operator`.
    pub fn reason_cause(&self) -> ReasonCause {
        match self {
            Cause::Spot { action, .. } => ReasonCause::of_spot_action(action),
            Cause::Lifecycle { .. } => ReasonCause::Lifecycle,
            Cause::Manual { .. } => ReasonCause::Operator,
            Cause::Maintenance { .. } => ReasonCause::Maintenance,
            Cause::Upgrade { .. } => ReasonCause::Upgrade,
            Cause::Rebalance { .. } => ReasonCause::Rebalance,
            Cause::Health { .. } => ReasonCause::Health,
            Cause::Mount { .. } => ReasonCause::Mount,
            Cause::Script { .. } => ReasonCause::Script,
            Cause::Scratch { .. } => ReasonCause::Scratch,
            Cause::Repair { .. } => ReasonCause::Repair,
            Cause::Gate { .. } => ReasonCause::Gate,
            Cause::CapacityBlock { .. } => ReasonCause::CapacityBlock,
        }
    }

    /// The Slurm reason with an unknown writer (see [`Cause::reason_for`]).
    pub fn reason(&self) -> String {
        self.reason_for(reason::UNKNOWN_INSTANCE)
    }

    /// The Slurm reason written by incarnation `instance_id`:
    /// `slurm-node-agent/<cause>@<instance-id>: <details>`, at most 256 characters. The
    /// detail of a health, mount, script or scratch cause is its owner's, kept as written
    /// ([`crate::reason::AgentReason::stated`]).
    pub fn reason_for(&self, instance_id: &str) -> String {
        let detail = match self {
            Cause::Spot { action, time } => {
                format!(
                    "spot interruption notice: {action} at {}",
                    time::format(*time)
                )
            }
            Cause::Lifecycle { state, .. } => {
                format!("auto scaling target lifecycle state {state}")
            }
            Cause::Manual { reason } => reason.clone(),
            Cause::Maintenance {
                event_id,
                code,
                not_before,
            } => format!(
                "scheduled {code} {event_id} not before {}",
                not_before.map_or_else(|| "(unknown)".to_string(), time::format)
            ),
            Cause::Upgrade { current, desired } => {
                format!("image upgrade {current} -> {desired}")
            }
            Cause::Rebalance { notice_time } => {
                format!("rebalance recommendation at {}", time::format(*notice_time))
            }
            Cause::CapacityBlock {
                reservation_id,
                end,
            } => format!(
                "capacity block {reservation_id} ends {}; EC2 terminates its instances from {}",
                time::format(*end),
                time::format(end - CAPACITY_BLOCK_RECLAIM_SECS)
            ),
            Cause::Health { detail }
            | Cause::Mount { detail }
            | Cause::Script { detail }
            | Cause::Scratch { detail }
            | Cause::Gate { detail } => {
                return reason::AgentReason::stated(self.reason_cause(), instance_id, detail)
                    .to_reason()
            }
            Cause::Repair { action, detail, .. } => {
                return crate::repair::reason(
                    instance_id,
                    detail,
                    crate::repair::Stage::AfterJobs(*action),
                )
            }
        };
        reason::reason(self.reason_cause(), instance_id, &detail)
    }

    /// Whether the agent undoes the drain by itself when the cause goes away (a
    /// maintenance event canceled or completed, a rebalance recommendation past
    /// `events.rebalance_window` without an interruption notice). Health, mount and
    /// scratch drains are lifted by their owners ([`crate::node_state::Gateway::lift`]).
    pub fn undoable(&self) -> bool {
        matches!(
            self,
            Cause::Maintenance { .. } | Cause::Rebalance { .. } | Cause::CapacityBlock { .. }
        )
    }

    /// The deadline by which jobs must be off the node, if the cause has one.
    pub fn deadline(&self) -> Option<i64> {
        match self {
            Cause::Spot { time, .. } => Some(*time),
            Cause::Maintenance { not_before, .. } => *not_before,
            Cause::CapacityBlock { end, .. } => Some(end - CAPACITY_BLOCK_RECLAIM_SECS),
            _ => None,
        }
    }

    /// When the job action (`events.spot_job_action`) is due against, Unix seconds: a spot
    /// notice's interruption time, the time EC2 begins terminating a Capacity Block's
    /// instances. `None`: the cause leaves running jobs alone.
    pub fn job_action_deadline(&self) -> Option<i64> {
        match self {
            Cause::Spot { time, .. } => Some(*time),
            Cause::CapacityBlock { end, .. } => Some(end - CAPACITY_BLOCK_RECLAIM_SECS),
            _ => None,
        }
    }
}

/// Whether a Slurm reason is one this agent set for a drain cause of `kind` (a
/// [`Cause::kind`]; `None`: any cause). Every reason of the agent's scheme
/// ([`crate::reason::is_agent_reason`]) is a cause of this machine.
pub fn is_our_reason(reason: &str, kind: Option<&str>) -> bool {
    let Some(r) = reason::parse_reason(reason) else {
        return false;
    };
    kind.is_none_or(|want| CauseKind::of_reason(r.cause).as_str() == want)
}

/// One recorded transition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transition {
    /// From.
    pub from: Phase,
    /// To.
    pub to: Phase,
    /// Name of the event: `begin`, `escalate`, `restate`, `hand_back`, `drained`, `act`,
    /// `action_failed`, `done`, `resume`, `complete`.
    pub event: String,
    /// Unix seconds.
    pub at: i64,
    /// Cause kind at that time.
    pub cause: Option<String>,
}

/// A transition that is not allowed from the current phase.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("drain state: `{event}` is not allowed in phase {from}")]
pub struct Refused {
    /// The event attempted.
    pub event: &'static str,
    /// The phase it was attempted in.
    pub from: &'static str,
}

/// What [`DrainState::begin`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    /// active → draining.
    Started,
    /// The new cause replaced a lower one (phase kept).
    Escalated {
        /// The cause replaced.
        previous: Cause,
    },
    /// The cause in progress, of the same kind, stated again with another detail (a
    /// restated cause, [`CauseKind::restated`]): the reason follows, the phase stays.
    Restated {
        /// The cause as it was.
        previous: Cause,
    },
    /// A drain of equal or higher priority is in progress; nothing changed.
    AlreadyDraining {
        /// The cause in effect.
        current: Cause,
    },
    /// The notice was handled before (and since resumed by an operator): ignored.
    AlreadyHandled,
}

/// The persisted drain state (`drain.json` under `agent.state_dir`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DrainState {
    /// File format version.
    pub version: u32,
    /// Current phase.
    pub phase: Phase,
    /// Current cause (none when active).
    pub cause: Option<Cause>,
    /// The Slurm reason set for it.
    pub reason: Option<String>,
    /// A reason someone else had set on the node when the drain began; while it is set the
    /// agent never resumes the node.
    pub foreign_reason: Option<String>,
    /// When the current phase was entered, Unix seconds.
    pub since: i64,
    /// When the drain began.
    pub started: Option<i64>,
    /// Whether the action on running jobs (spot) was taken.
    pub job_action_done: bool,
    /// Failed attempts of the action.
    pub action_attempts: u32,
    /// Earliest time of the next action attempt.
    pub next_attempt: i64,
    /// The last error of an action or Slurm call.
    pub last_error: Option<String>,
    /// Keys of notices already acted on ([`Cause::key`]).
    pub handled: BTreeSet<String>,
    /// Image installed by the last completed upgrade action that keeps the AMI id
    /// (reboot, hook): compared with the desired image instead of IMDS's `ami-id`.
    pub applied_image: Option<String>,
    /// Boot id when the action started (a reboot changes it).
    pub boot_id: Option<String>,
    /// The instance that, up to date and in service under a NodeName no slot holder had,
    /// released the upgrade budget slot of a holder that is gone
    /// (the rollout's slot release for a replacement, floors up): at most one per instance. Left
    /// out of the file while none did (a file of the previous release reads and writes the
    /// same).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replaced_slot_released_by: Option<String>,
    /// Count of each `from->to` transition since the state file was created.
    pub transitions: BTreeMap<String, u64>,
    /// The last transitions, oldest first.
    pub history: Vec<Transition>,
}

impl Default for DrainState {
    fn default() -> Self {
        DrainState {
            version: 1,
            phase: Phase::Active,
            cause: None,
            reason: None,
            foreign_reason: None,
            since: 0,
            started: None,
            job_action_done: false,
            action_attempts: 0,
            next_attempt: 0,
            last_error: None,
            handled: BTreeSet::new(),
            applied_image: None,
            boot_id: None,
            replaced_slot_released_by: None,
            transitions: BTreeMap::new(),
            history: Vec::new(),
        }
    }
}

impl DrainState {
    fn go(&mut self, to: Phase, event: &str, now: i64) {
        let from = self.phase;
        tracing::info!(
            decision = "drain.transition",
            from = from.as_str(),
            to = to.as_str(),
            event,
            cause = self.cause.as_ref().map(Cause::kind),
            reason = self.reason.as_deref(),
            "drain transition"
        );
        *self
            .transitions
            .entry(format!("{}->{}", from.as_str(), to.as_str()))
            .or_default() += 1;
        self.history.push(Transition {
            from,
            to,
            event: event.to_string(),
            at: now,
            cause: self.cause.as_ref().map(|c| c.kind().to_string()),
        });
        if self.history.len() > HISTORY_LEN {
            let extra = self.history.len() - HISTORY_LEN;
            self.history.drain(..extra);
        }
        self.phase = to;
        self.since = now;
    }

    /// Whether `cause` was handled before and is not taken up again (a notice seen again at
    /// every poll; never an operator's drain nor a restated cause).
    fn handled_before(&self, cause: &Cause) -> bool {
        self.handled.contains(&cause.key())
            && !matches!(cause, Cause::Manual { .. })
            && !cause.cause_kind().restated()
    }

    /// What [`DrainState::begin`] would do, without changing anything.
    pub fn preview(&self, cause: &Cause) -> Begin {
        if self.handled_before(cause) {
            return Begin::AlreadyHandled;
        }
        match (self.phase, &self.cause) {
            (Phase::Active, _) | (_, None) => Begin::Started,
            (Phase::Draining | Phase::Drained, Some(current))
                if cause.priority() > current.priority() =>
            {
                Begin::Escalated {
                    previous: current.clone(),
                }
            }
            (Phase::Draining | Phase::Drained, Some(current))
                if current.cause_kind() == cause.cause_kind()
                    && cause.cause_kind().restated()
                    && current != cause =>
            {
                Begin::Restated {
                    previous: current.clone(),
                }
            }
            (_, Some(current)) => Begin::AlreadyDraining {
                current: current.clone(),
            },
        }
    }

    /// A cause asks for a drain. `foreign_reason` is the reason someone else already set on
    /// the node (it is kept, and forbids resuming later).
    pub fn begin(&mut self, cause: Cause, foreign_reason: Option<String>, now: i64) -> Begin {
        let remember = !cause.cause_kind().restated();
        match self.preview(&cause) {
            Begin::AlreadyHandled => Begin::AlreadyHandled,
            Begin::Started => {
                if remember {
                    self.handled.insert(cause.key());
                }
                self.reason = Some(cause.reason());
                self.cause = Some(cause);
                self.foreign_reason = foreign_reason;
                self.started = Some(now);
                self.job_action_done = false;
                self.action_attempts = 0;
                self.next_attempt = 0;
                self.last_error = None;
                self.go(Phase::Draining, "begin", now);
                Begin::Started
            }
            Begin::Escalated { previous } => {
                if remember {
                    self.handled.insert(cause.key());
                }
                self.reason = Some(cause.reason());
                self.cause = Some(cause);
                self.job_action_done = false;
                self.action_attempts = 0;
                self.next_attempt = 0;
                let phase = self.phase;
                self.go(phase, "escalate", now);
                Begin::Escalated { previous }
            }
            Begin::Restated { previous } => {
                // The same condition with other words (another failing check, another
                // missing mount): the reason follows, the phase stays.
                self.reason = Some(cause.reason());
                self.cause = Some(cause);
                let phase = self.phase;
                self.go(phase, "restate", now);
                Begin::Restated { previous }
            }
            Begin::AlreadyDraining { current } => {
                if current.key() != cause.key() && current.priority() >= cause.priority() {
                    // Remember it so it is not taken up again once the current drain ends.
                    if matches!(
                        cause,
                        Cause::Spot { .. } | Cause::Lifecycle { .. } | Cause::Rebalance { .. }
                    ) {
                        self.handled.insert(cause.key());
                    }
                }
                Begin::AlreadyDraining { current }
            }
        }
    }

    fn need(&self, event: &'static str, allowed: &[Phase]) -> Result<(), Refused> {
        if allowed.contains(&self.phase) {
            Ok(())
        } else {
            Err(Refused {
                event,
                from: self.phase.as_str(),
            })
        }
    }

    /// draining | drained, phase kept: a repair no longer called for (the breaker holds, the
    /// plan became `isolate`) hands the drain back to `cause`, the one it was planned from
    /// (the health checks'), whatever their priorities; the reason follows.
    ///
    /// # Errors
    /// [`Refused`] from any other phase, or when the current cause is not a repair.
    pub fn hand_back(&mut self, cause: Cause, now: i64) -> Result<(), Refused> {
        self.need("hand_back", &[Phase::Draining, Phase::Drained])?;
        if !matches!(self.cause, Some(Cause::Repair { .. })) {
            return Err(Refused {
                event: "hand_back",
                from: self.phase.as_str(),
            });
        }
        self.reason = Some(cause.reason());
        self.cause = Some(cause);
        self.action_attempts = 0;
        self.next_attempt = 0;
        let phase = self.phase;
        self.go(phase, "hand_back", now);
        Ok(())
    }

    /// draining → drained: no job left on the node.
    ///
    /// # Errors
    /// [`Refused`] from any other phase.
    pub fn drained(&mut self, now: i64) -> Result<(), Refused> {
        self.need("drained", &[Phase::Draining])?;
        self.go(Phase::Drained, "drained", now);
        Ok(())
    }

    /// drained → acting: the action starts (`boot_id` of the running system).
    ///
    /// # Errors
    /// [`Refused`] from any other phase.
    pub fn act(&mut self, boot_id: Option<String>, now: i64) -> Result<(), Refused> {
        self.need("act", &[Phase::Drained])?;
        self.boot_id = boot_id;
        self.go(Phase::Acting, "act", now);
        Ok(())
    }

    /// acting → drained: the action failed; the next attempt waits `retry_after` seconds.
    ///
    /// # Errors
    /// [`Refused`] from any other phase.
    pub fn action_failed(
        &mut self,
        error: String,
        retry_after: i64,
        now: i64,
    ) -> Result<(), Refused> {
        self.need("action_failed", &[Phase::Acting])?;
        self.action_attempts += 1;
        self.next_attempt = now + retry_after;
        self.last_error = Some(error);
        self.go(Phase::Drained, "action_failed", now);
        Ok(())
    }

    /// acting → done.
    ///
    /// # Errors
    /// [`Refused`] from any other phase.
    pub fn done(&mut self, now: i64) -> Result<(), Refused> {
        self.need("done", &[Phase::Acting])?;
        self.last_error = None;
        self.go(Phase::Done, "done", now);
        Ok(())
    }

    /// draining | drained | done → active: the node was resumed (cause undone, or an
    /// operator's `resume`). The cause's key stays handled.
    ///
    /// # Errors
    /// [`Refused`] while acting.
    pub fn resume(&mut self, now: i64) -> Result<(), Refused> {
        self.need(
            "resume",
            &[Phase::Draining, Phase::Drained, Phase::Done, Phase::Active],
        )?;
        if self.phase == Phase::Active {
            return Ok(());
        }
        self.go(Phase::Active, "resume", now);
        self.clear();
        Ok(())
    }

    /// done → active: the node came back after the action (reboot, hook); an upgrade's
    /// desired image is recorded as applied.
    ///
    /// # Errors
    /// [`Refused`] from any other phase.
    pub fn complete(&mut self, now: i64) -> Result<(), Refused> {
        self.need("complete", &[Phase::Done])?;
        if let Some(Cause::Upgrade { desired, .. }) = &self.cause {
            self.applied_image = Some(desired.clone());
        }
        self.go(Phase::Active, "complete", now);
        self.clear();
        Ok(())
    }

    /// Forgets a handled notice (a maintenance event that was canceled), so that it can be
    /// acted on again if it comes back.
    pub fn forget(&mut self, key: &str) {
        self.handled.remove(key);
    }

    fn clear(&mut self) {
        self.cause = None;
        self.reason = None;
        self.foreign_reason = None;
        self.started = None;
        self.job_action_done = false;
        self.action_attempts = 0;
        self.next_attempt = 0;
        self.last_error = None;
        self.boot_id = None;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn spot() -> Cause {
        Cause::Spot {
            action: "terminate".into(),
            time: 1_505_722_920,
        }
    }
    fn upgrade() -> Cause {
        Cause::Upgrade {
            current: "ami-0a887e401f7654935".into(),
            desired: "ami-0123456789abcdef0".into(),
        }
    }
    fn maint(id: &str) -> Cause {
        Cause::Maintenance {
            event_id: id.into(),
            code: "system-reboot".into(),
            not_before: Some(1_548_061_243),
        }
    }

    #[test]
    fn full_path_active_to_done_to_active() {
        let mut s = DrainState::default();
        assert_eq!(s.begin(upgrade(), None, 10), Begin::Started);
        assert_eq!(s.phase, Phase::Draining);
        assert_eq!(
            s.reason.as_deref(),
            Some(
                "slurm-node-agent/upgrade@unknown: image upgrade ami-0a887e401f7654935 -> ami-0123456789abcdef0"
            )
        );
        s.drained(11).unwrap();
        s.act(Some("boot-a".into()), 12).unwrap();
        s.done(13).unwrap();
        s.complete(14).unwrap();
        assert_eq!(s.phase, Phase::Active);
        assert_eq!(s.applied_image.as_deref(), Some("ami-0123456789abcdef0"));
        assert_eq!(s.cause, None);
        let events: Vec<_> = s.history.iter().map(|t| t.event.as_str()).collect();
        assert_eq!(events, ["begin", "drained", "act", "done", "complete"]);
        assert_eq!(s.transitions["draining->drained"], 1);
    }

    #[test]
    fn guards_refuse_out_of_order_transitions() {
        let mut s = DrainState::default();
        assert!(s.drained(1).is_err());
        assert!(s.act(None, 1).is_err());
        assert!(s.done(1).is_err());
        assert!(s.complete(1).is_err());
        assert!(s.action_failed("x".into(), 5, 1).is_err());
        s.begin(upgrade(), None, 1);
        assert!(s.act(None, 2).is_err(), "acting needs drained first");
        s.drained(2).unwrap();
        assert!(s.drained(3).is_err());
        s.act(None, 3).unwrap();
        let e = s.resume(4).unwrap_err();
        assert_eq!(
            e.to_string(),
            "drain state: `resume` is not allowed in phase acting"
        );
        s.action_failed("hook exited 1".into(), 30, 4).unwrap();
        assert_eq!(
            (s.phase, s.action_attempts, s.next_attempt),
            (Phase::Drained, 1, 34)
        );
        assert_eq!(s.last_error.as_deref(), Some("hook exited 1"));
    }

    #[test]
    fn repeated_notice_is_handled_once_even_after_resume() {
        let mut s = DrainState::default();
        assert_eq!(s.begin(spot(), None, 1), Begin::Started);
        assert_eq!(
            s.begin(spot(), None, 2),
            Begin::AlreadyHandled,
            "same notice polled again"
        );
        s.resume(3).unwrap();
        assert_eq!(s.begin(spot(), None, 4), Begin::AlreadyHandled);
        assert_eq!(s.phase, Phase::Active);
        let later = Cause::Spot {
            action: "stop".into(),
            time: 1_600_000_000,
        };
        assert_eq!(
            s.begin(later, None, 5),
            Begin::Started,
            "a new interruption"
        );
    }

    #[test]
    fn higher_priority_escalates_lower_is_kept_out() {
        let mut s = DrainState::default();
        s.begin(upgrade(), None, 1);
        s.drained(2).unwrap();
        assert_eq!(
            s.begin(spot(), None, 3),
            Begin::Escalated {
                previous: upgrade()
            }
        );
        assert_eq!(s.phase, Phase::Drained);
        assert_eq!(s.cause.as_ref().unwrap().kind(), "spot");
        assert!(matches!(
            s.begin(maint("e1"), None, 4),
            Begin::AlreadyDraining { .. }
        ));
        let manual = Cause::Manual {
            reason: "disk check".into(),
        };
        assert!(matches!(
            s.begin(manual, None, 5),
            Begin::AlreadyDraining { .. }
        ));
        assert_eq!(s.cause.as_ref().unwrap().kind(), "spot");
    }

    #[test]
    fn manual_drain_outranks_maintenance_and_no_escalation_while_acting() {
        let mut s = DrainState::default();
        s.begin(maint("e1"), None, 1);
        let manual = Cause::Manual {
            reason: "bad DIMM".into(),
        };
        assert!(matches!(
            s.begin(manual.clone(), None, 2),
            Begin::Escalated { .. }
        ));
        assert!(!s.cause.as_ref().unwrap().undoable());
        assert_eq!(
            s.reason.as_deref(),
            Some("slurm-node-agent/operator@unknown: bad DIMM")
        );
        // The same manual drain again is idempotent.
        assert!(matches!(
            s.begin(manual, None, 3),
            Begin::AlreadyDraining { .. }
        ));

        let mut s = DrainState::default();
        s.begin(upgrade(), None, 1);
        s.drained(2).unwrap();
        s.act(None, 3).unwrap();
        assert!(matches!(
            s.begin(spot(), None, 4),
            Begin::AlreadyDraining { .. }
        ));
        assert_eq!(s.phase, Phase::Acting);
    }

    #[test]
    fn preview_predicts_begin_without_changing_anything() {
        let mut s = DrainState::default();
        for (cause, expect_started) in [
            (upgrade(), true),
            (upgrade(), false),
            (spot(), true),
            (maint("e"), false),
            (spot(), false),
        ] {
            let before = s.clone();
            let p = s.preview(&cause);
            assert_eq!(s, before);
            let b = s.begin(cause, None, 1);
            assert_eq!(p, b);
            assert_eq!(
                matches!(b, Begin::Started | Begin::Escalated { .. }),
                expect_started
            );
        }
    }

    #[test]
    fn reasons_are_ours_and_bounded() {
        assert!(is_our_reason(&spot().reason(), Some("spot")));
        assert!(is_our_reason(&spot().reason(), None));
        assert!(!is_our_reason(&spot().reason(), Some("upgrade")));
        assert!(!is_our_reason("Kill task failed", None));
        assert!(!is_our_reason("node-agent/spot: x", None));
        assert!(!is_our_reason("slurm-node-agent: x", None));
        // A health drain is a cause of this machine too (it was not before the gateway).
        assert!(is_our_reason(
            "slurm-node-agent/health@unknown: disk",
            Some("health")
        ));
        assert!(!is_our_reason(
            "slurm-node-agent/health@unknown: disk",
            Some("spot")
        ));
        assert!(is_our_reason(
            &spot().reason_for("i-0123456789abcdef0"),
            Some("spot")
        ));
        assert_eq!(
            spot().reason(),
            "slurm-node-agent/spot@unknown: spot interruption notice: terminate at 2017-09-18T08:22:00Z"
        );
        let long = Cause::Manual {
            reason: "x\n".repeat(300),
        };
        let r = long.reason();
        assert_eq!(r.chars().count(), 256);
        assert!(!r.contains('\n'));
        assert!(crate::slurm::node::validate_reason(&r).is_ok());
    }

    #[test]
    fn persisted_form_round_trips() {
        let mut s = DrainState::default();
        s.begin(maint("instance-event-1"), Some("admin said so".into()), 7);
        let json = serde_json::to_string(&s).unwrap();
        assert!(json.contains("\"phase\":\"draining\""), "{json}");
        assert!(json.contains("\"kind\":\"maintenance\""), "{json}");
        let back: DrainState = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
        // Older or partial files still load.
        let partial: DrainState = serde_json::from_str(r#"{"phase":"drained"}"#).unwrap();
        assert_eq!(partial.phase, Phase::Drained);
    }

    const ID: &str = "i-0123456789abcdef0";

    fn health(detail: &str) -> Cause {
        Cause::Health {
            detail: detail.into(),
        }
    }

    #[test]
    fn a_health_drain_begins_restates_and_resumes_and_is_never_remembered() {
        let mut s = DrainState::default();
        assert_eq!(s.begin(health("check_a: gone"), None, 1), Begin::Started);
        assert_eq!(
            (s.phase, s.cause.as_ref().map(Cause::kind)),
            (Phase::Draining, Some("health"))
        );
        assert!(s.handled.is_empty(), "{:?}", s.handled);
        // The same words again: nothing.
        assert!(matches!(
            s.begin(health("check_a: gone"), None, 2),
            Begin::AlreadyDraining { .. }
        ));
        // Another failing check: the reason follows, the phase stays.
        assert_eq!(
            s.begin(health("check_b: hung"), None, 3),
            Begin::Restated {
                previous: health("check_a: gone")
            }
        );
        assert_eq!(s.phase, Phase::Draining);
        assert_eq!(
            s.reason.as_deref(),
            Some("slurm-node-agent/health@unknown: check_b: hung")
        );
        s.drained(4).unwrap();
        // No action after drained for a health drain.
        assert!(!CauseKind::Health.has_action());
        s.resume(5).unwrap();
        assert_eq!((s.phase, s.cause.clone()), (Phase::Active, None));
        // Not handled: the next failure drains again.
        assert_eq!(s.begin(health("check_a: gone"), None, 6), Begin::Started);
        let events: Vec<_> = s.history.iter().map(|t| t.event.as_str()).collect();
        assert_eq!(events, ["begin", "restate", "drained", "resume", "begin"]);
        assert_eq!(s.transitions["draining->draining"], 1);
    }

    #[test]
    fn notices_outrank_the_conditions_the_agent_lifts_and_not_the_other_way() {
        // A spot notice over a health drain: escalated (the spot reason is written).
        let mut s = DrainState::default();
        s.begin(health("check_a: gone"), None, 1);
        assert_eq!(
            s.begin(spot(), None, 2),
            Begin::Escalated {
                previous: health("check_a: gone")
            }
        );
        assert_eq!(s.cause.as_ref().map(Cause::kind), Some("spot"));
        // A health failure during an upgrade drain: the upgrade keeps the node (and its
        // action), a mount's or scratch's too.
        let mut s = DrainState::default();
        s.begin(upgrade(), None, 1);
        for c in [
            health("check_a: gone"),
            Cause::Mount {
                detail: "/fsx: gone".into(),
            },
            Cause::Scratch {
                detail: "/scratch: no disks".into(),
            },
        ] {
            assert!(
                matches!(s.begin(c.clone(), None, 2), Begin::AlreadyDraining { .. }),
                "{c:?}"
            );
        }
        assert_eq!(s.cause, Some(upgrade()));
        // Health and mounts do not take the node from each other: first come keeps it.
        let mut s = DrainState::default();
        s.begin(health("check_a: gone"), None, 1);
        assert!(matches!(
            s.begin(
                Cause::Mount {
                    detail: "/fsx: gone".into()
                },
                None,
                2
            ),
            Begin::AlreadyDraining { .. }
        ));
        // A lifecycle script's terminate outranks an operator and every condition.
        let script = Cause::Script {
            detail: "s.sh failed in nodeReady (onError TERMINATE), powering off: exit 1".into(),
        };
        assert!(matches!(s.begin(script, None, 3), Begin::Escalated { .. }));
        let manual = Cause::Manual { reason: "x".into() };
        assert!(matches!(
            s.begin(manual, None, 4),
            Begin::AlreadyDraining { .. }
        ));
    }

    #[test]
    fn stated_causes_keep_their_owners_words() {
        // The health checks' reason, cut to fit and with ` : ` (which AgentReason::new
        // would change): the cause gives back the very reason.
        let reason = format!("slurm-node-agent/health@{ID}: check_a : line 1 ...");
        let c = Cause::stated(ReasonCause::Health, ID, &reason).unwrap();
        assert_eq!(c, health("check_a : line 1 ..."));
        assert_eq!(c.reason_for(ID), reason);
        assert_eq!(c.key(), "health");
        let long = format!("slurm-node-agent/mount@{ID}: {}", "x".repeat(300));
        let m = Cause::stated(ReasonCause::Mount, ID, &long).unwrap();
        assert_eq!(m.reason_for(ID).chars().count(), 256);
        // Another incarnation's head, or a cause whose words are the agent's: none.
        assert!(Cause::stated(ReasonCause::Health, "i-0fedcba9876543210", &reason).is_none());
        assert!(Cause::stated(ReasonCause::Spot, ID, &reason).is_none());
        for c in ReasonCause::ALL {
            let k = CauseKind::of_reason(c);
            assert!(CauseKind::ALL.contains(&k), "{c}");
            assert!(
                is_our_reason(&reason::reason(c, ID, "x"), Some(k.as_str())),
                "{c}"
            );
        }
    }

    fn repair(action: crate::repair::Planned) -> Cause {
        Cause::Repair {
            action,
            fault: crate::repair::Fault::GpuLost,
            check: "GPUs".into(),
            detail: "GPUs: XID 79".into(),
        }
    }

    /// A repair takes the node from the health checks' drain and from an upgrade's, yields
    /// to an operator, a scheduled event and a spot notice, and is restated (never
    /// remembered as handled: the next fault after a resume repairs again); a repair no
    /// longer called for hands the drain back to the health checks, and nothing else can.
    #[test]
    fn a_repair_outranks_the_health_drain_and_hands_it_back() {
        use crate::repair::Planned;
        let mut s = DrainState::default();
        s.begin(health("GPUs: XID 79"), None, 1);
        assert!(matches!(
            s.begin(repair(Planned::Reboot), None, 2),
            Begin::Escalated { .. }
        ));
        assert_eq!(
            s.cause.as_ref().unwrap().reason_for(ID),
            format!("slurm-node-agent/repair@{ID}: GPUs: XID 79 [reboot after jobs]")
        );
        assert!(CauseKind::Repair.has_action());
        // The plan became a replacement: restated, phase kept.
        assert!(matches!(
            s.begin(repair(Planned::Replace), None, 3),
            Begin::Restated { .. }
        ));
        assert!(matches!(
            s.begin(upgrade(), None, 4),
            Begin::AlreadyDraining { .. }
        ));
        assert!(matches!(
            s.begin(health("GPUs: XID 79"), None, 5),
            Begin::AlreadyDraining { .. }
        ));
        s.hand_back(health("GPUs: XID 79"), 6).unwrap();
        assert_eq!(s.cause, Some(health("GPUs: XID 79")));
        assert_eq!(s.phase, Phase::Draining);
        assert_eq!(s.history.last().unwrap().event, "hand_back");
        // Only a repair hands back.
        assert!(s.hand_back(health("x"), 7).is_err());
        assert!(s.handled.is_empty(), "{:?}", s.handled);
        for higher in [
            spot(),
            maint("e1"),
            Cause::Manual {
                reason: "bad DIMM".into(),
            },
        ] {
            let mut s = DrainState::default();
            s.begin(repair(Planned::Replace), None, 1);
            assert!(matches!(s.begin(higher, None, 2), Begin::Escalated { .. }));
            assert!(s.hand_back(health("x"), 3).is_err());
        }
        let mut s = DrainState::default();
        s.begin(upgrade(), None, 1);
        assert!(matches!(
            s.begin(repair(Planned::Replace), None, 2),
            Begin::Escalated { .. }
        ));
        // Once acting, it stays.
        s.drained(3).unwrap();
        s.act(None, 4).unwrap();
        assert!(s.hand_back(health("x"), 5).is_err());
    }

    /// `docs/drain-state-machine.md`'s table of causes lists every kind, in
    /// [`CauseKind::ALL`]'s order, with its priority, and `none` as the action after
    /// `drained` exactly for the kinds without one.
    #[test]
    fn the_docs_table_of_causes_is_the_code() {
        let p =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/drain-state-machine.md");
        let text = std::fs::read_to_string(&p).unwrap();
        let section = &text[text.find("\n## Causes\n").unwrap()..];
        let section = &section[..section[1..].find("\n## ").map_or(section.len(), |e| e + 1)];
        let rows: Vec<Vec<&str>> = section
            .lines()
            .filter(|l| l.starts_with("| `"))
            .map(|l| l.trim_matches('|').split(" | ").map(str::trim).collect())
            .collect();
        let kinds: Vec<&str> = rows.iter().map(|r| r[0].trim_matches('`')).collect();
        let code: Vec<&str> = CauseKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(kinds, code, "{}: the kinds of ## Causes", p.display());
        for (row, kind) in rows.iter().zip(CauseKind::ALL) {
            assert_eq!(row.len(), 5, "{}: {row:?}", p.display());
            assert_eq!(
                row[2],
                kind.priority().to_string(),
                "{}: {kind}'s priority",
                p.display()
            );
            assert_eq!(
                row[4].starts_with("none"),
                !kind.has_action(),
                "{}: {kind}'s action after drained: {}",
                p.display(),
                row[4]
            );
        }
    }

    /// A `drain.json` the release before the gateway wrote (an upgrade drain whose hook
    /// failed once) loads as it was, and is written back in the same form.
    #[test]
    fn a_state_file_of_the_previous_release_loads() {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/drain-state/before-gateway.json");
        let text = std::fs::read_to_string(&p).unwrap();
        let st: DrainState = serde_json::from_str(&text).unwrap();
        assert_eq!(st.phase, Phase::Drained);
        assert_eq!(
            st.cause,
            Some(Cause::Upgrade {
                current: "ami-0a887e401f7654935".into(),
                desired: "ami-0123456789abcdef0".into(),
            })
        );
        assert_eq!(st.action_attempts, 1);
        assert!(st.handled.contains("spot:1767225000"));
        assert_eq!(st.transitions["active->draining"], 2);
        assert_eq!(st.history.len(), 6);
        assert_eq!(st.history[5].event, "action_failed");
        let again = serde_json::to_string_pretty(&st).unwrap();
        assert_eq!(again.trim_end(), text.trim_end());
        // And the machine carries on from it: the action is tried again.
        let mut st = st;
        st.act(None, 1_767_225_760).unwrap();
        assert_eq!(st.phase, Phase::Acting);
    }
}
