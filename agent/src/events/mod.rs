//! Interruption and maintenance notices from the instance metadata service: polling over
//! the agent's IMDSv2 client ([`crate::imds::Imds`], through [`InstanceMetadata`]) and turning what was read into drain decisions.
//!
//! - `spot/instance-action` (every `events.spot_interval`, 1 s): drain at once. The path
//!   being present is the notice: a body that cannot be parsed still drains (deadline two
//!   minutes from now, as AWS promises), and the parse error is logged.
//! - `events/recommendations/rebalance` (every `events.interval`, 30 s): drain when
//!   `events.rebalance = "drain"` (default `"ignore"`: logged only); running jobs continue.
//! - `events/maintenance/scheduled` and `events/maintenance/history` (every
//!   `events.maintenance_interval`, 5 min: EC2 announces events days ahead): an `active`
//!   event (or one in an unknown state) drains once `NotBefore - events.maintenance_lead`
//!   has come. The drain it caused is undone when the event is canceled (at once), or
//!   completed, past its `NotAfter`, gone from `scheduled` or moved to `history` (EC2 moves
//!   completed and canceled events there): at once for a code that leaves the instance
//!   running, and for one that takes it down (`system-reboot`, `instance-reboot`,
//!   `instance-stop`, `instance-retirement`) once slurmd has registered again.
//! - `autoscaling/target-lifecycle-state` (every `events.interval`, 30 s): `Terminated`
//!   drains (a termination lifecycle hook holds the instance for its heartbeat timeout,
//!   an hour by default); [`hook`] keeps the hook's lifecycle action alive with heartbeats
//!   while jobs run and completes it with `CONTINUE` when the drain ends.
//!
//! Each notice is polled as often as its deadline needs and no more (a node's daemon is
//! operating-system noise for the jobs on it): 64 metadata requests a minute with the
//! defaults, 60 of them the interruption notice.
//!
//! A failed poll (IMDS 401 after a token refresh, 5xx after retries, unreachable) is never
//! read as "the notice is gone": the last good observation stands and nothing is undone.
//!
//! Floor 7 (subsystems): above `drain`, to which it hands its decisions; the `[events]`
//! settings section ([`EventsSettings`]) is this module's.

pub mod hook;
pub mod notice;

use serde::{Deserialize, Serialize};

use crate::capacity_block::CapacityBlock;
use crate::drain::Cause;
use crate::drain::{SpotJobAction, SpotJobs};
use crate::imds::{ImdsError, InstanceMetadata};
use crate::node_state::CAPACITY_BLOCK_RECLAIM_SECS;
use crate::section::{HumanDuration, InvalidKey};
pub use notice::{MaintenanceEvent, NoticeError, RebalanceNotice, SpotAction, SpotNotice};

/// What AWS gives between the spot notice and the interruption; used as the deadline when
/// the notice's time cannot be read.
pub const SPOT_WARNING_SECS: i64 = 120;

/// What to do with a rebalance recommendation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum RebalancePolicy {
    /// Drain: no new jobs land, running ones continue.
    Drain,
    /// Log it only (the default: EC2 never withdraws a recommendation, and most never turn
    /// into an interruption, so other tools leave rebalance draining off by default too).
    #[default]
    Ignore,
}

/// `[events]`: IMDS notices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EventsSettings {
    /// Watch notices at all.
    pub enabled: bool,
    /// Poll interval of `spot/instance-action` (default 1s: an interruption gives two
    /// minutes, and 1 s keeps the notice-to-DRAIN p99 under 2 s). Also the daemon's tick:
    /// every other periodic job runs on these ticks.
    pub spot_interval: HumanDuration,
    /// Poll interval of the rebalance recommendation and the target lifecycle state
    /// (default 30s: both leave minutes).
    pub interval: HumanDuration,
    /// Poll interval of scheduled maintenance events and their history (default 5m: EC2
    /// announces them days ahead; a canceled event's drain is lifted within this long).
    pub maintenance_interval: HumanDuration,
    /// `drain` or `ignore` (default) rebalance recommendations.
    pub rebalance: RebalancePolicy,
    /// With `rebalance = "drain"`: a recommendation older than this (by its `noticeTime`)
    /// that never became an interruption notice is over: the drain is lifted (EC2 never
    /// withdraws a recommendation). Default 1h.
    pub rebalance_window: HumanDuration,
    /// Drain this long before a maintenance event's `NotBefore`, so jobs can finish (set it
    /// to the longest job time limit).
    pub maintenance_lead: HumanDuration,
    /// Maintenance event codes that do not drain (e.g. `system-maintenance`).
    pub maintenance_ignore_codes: Vec<String>,
    /// Drain on `autoscaling/target-lifecycle-state` = `Terminated`, and complete the
    /// termination lifecycle hooks' action when the drain ends ([`hook`]).
    pub lifecycle: bool,
    /// `RecordLifecycleActionHeartbeat` this often while jobs run on a node in
    /// `Terminating:Wait` (default 5m). Must be below the hook's `HeartbeatTimeout` (30 s
    /// to 2 h, default 1 h): one at or above it is warned about and half the timeout used;
    /// 2h or more is refused (no hook's timeout is longer).
    pub lifecycle_heartbeat_interval: HumanDuration,
    /// The longest the agent holds a terminating instance for its jobs, from the moment
    /// the lifecycle state turned `Terminated` (default 1h, Auto Scaling's default hook
    /// timeout: as long as an instance without the agent waits, but ended as soon as no
    /// job is left). At this time heartbeats stop and the action is completed with
    /// `CONTINUE` whatever runs (`spot_job_action` taken `spot_job_action_lead` before).
    /// At most 48h (Auto Scaling's limit; also at most 100 x the hook's timeout).
    pub lifecycle_max_wait: HumanDuration,
    /// Names of the termination hooks the agent heartbeats and completes. Empty (default):
    /// every `autoscaling:EC2_INSTANCE_TERMINATING` hook of the instance's group.
    pub lifecycle_hooks: Vec<String>,
    /// `none`, `signal` or `requeue` the jobs still running near a spot interruption, and
    /// near `lifecycle_max_wait` on a node Auto Scaling terminates.
    pub spot_job_action: SpotJobAction,
    /// Signal for `spot_job_action = "signal"`: a name (`TERM`, `USR1`, ...) or number.
    pub spot_job_signal: String,
    /// Take the job action this long before the interruption time (at once when less is
    /// left); for a Capacity Block, before EC2 begins terminating its instances; for a
    /// lifecycle drain, before `lifecycle_max_wait` has passed.
    pub spot_job_action_lead: HumanDuration,
    /// Look up the Capacity Block for ML the instance runs in (EC2 `DescribeInstances`, then
    /// `DescribeCapacityReservations`; the instance profile needs `ec2:DescribeInstances`
    /// and `ec2:DescribeCapacityReservations`) and drain ahead of its end. An instance in no
    /// capacity reservation, in an On-Demand Capacity Reservation (its instances outlive
    /// it) or in one without an end date is left alone, after one lookup at start.
    pub capacity_block: bool,
    /// Drain this long before EC2 begins terminating a Capacity Block's instances (30
    /// minutes before the block's end), so that jobs can finish (default 1h; set it to the
    /// longest job time limit the block should still take). The job action
    /// (`spot_job_action`) is taken `spot_job_action_lead` before the termination begins.
    pub capacity_block_lead: HumanDuration,
    /// How often the Capacity Block's end is read again (default 10m): an extended block
    /// moves it, and a drain that no longer falls within `capacity_block_lead` is undone.
    pub capacity_block_interval: HumanDuration,
}

impl Default for EventsSettings {
    fn default() -> Self {
        use std::time::Duration;
        EventsSettings {
            enabled: true,
            spot_interval: HumanDuration(Duration::from_secs(1)),
            interval: HumanDuration(Duration::from_secs(30)),
            maintenance_interval: HumanDuration(Duration::from_secs(300)),
            rebalance: RebalancePolicy::Ignore,
            rebalance_window: HumanDuration(Duration::from_secs(3600)),
            maintenance_lead: HumanDuration(Duration::from_secs(24 * 3600)),
            maintenance_ignore_codes: Vec::new(),
            lifecycle: true,
            lifecycle_heartbeat_interval: HumanDuration(Duration::from_secs(300)),
            lifecycle_max_wait: HumanDuration(Duration::from_secs(3600)),
            lifecycle_hooks: Vec::new(),
            spot_job_action: SpotJobAction::None,
            spot_job_signal: "TERM".into(),
            spot_job_action_lead: HumanDuration(Duration::from_secs(30)),
            capacity_block: true,
            capacity_block_lead: HumanDuration(Duration::from_secs(3600)),
            capacity_block_interval: HumanDuration(Duration::from_secs(600)),
        }
    }
}

/// How the node reacts to notices: the launch template's choice, not a tag's.
impl crate::section::Classified for EventsSettings {
    const SECTION: &'static str = "events";
    const TRUST: &'static [crate::section::KeyTrust] = {
        use crate::section::KeyTrust as K;
        &[
            K::user_data("enabled"),
            K::user_data("spot_interval"),
            K::user_data("interval"),
            K::user_data("maintenance_interval"),
            K::user_data("rebalance"),
            K::user_data("rebalance_window"),
            K::user_data("maintenance_lead"),
            K::user_data("maintenance_ignore_codes"),
            K::user_data("lifecycle"),
            K::user_data("lifecycle_heartbeat_interval"),
            K::user_data("lifecycle_max_wait"),
            K::user_data("lifecycle_hooks"),
            K::user_data("spot_job_action"),
            K::user_data("spot_job_signal"),
            K::user_data("spot_job_action_lead"),
            K::user_data("capacity_block"),
            K::user_data("capacity_block_lead"),
            K::user_data("capacity_block_interval"),
        ]
    };
}

/// Signal names `scancel --signal` takes.
const SIGNALS: [&str; 12] = [
    "HUP", "INT", "QUIT", "ABRT", "KILL", "ALRM", "TERM", "USR1", "USR2", "CONT", "STOP", "TSTP",
];

impl EventsSettings {
    /// What a spot drain does with the jobs still running (`spot_job_action`,
    /// `spot_job_signal`, `spot_job_action_lead`), for the drain engine; also a lifecycle
    /// drain, before `lifecycle_max_wait`.
    pub fn spot_jobs(&self) -> SpotJobs {
        SpotJobs {
            action: self.spot_job_action,
            signal: self.spot_job_signal.clone(),
            lead: self.spot_job_action_lead.0,
            lifecycle_max_wait: self.lifecycle_max_wait.0,
        }
    }

    /// What the termination hooks follow (`lifecycle_heartbeat_interval`,
    /// `lifecycle_max_wait`).
    pub fn hook_policy(&self) -> hook::HookPolicy {
        hook::HookPolicy {
            interval: self.lifecycle_heartbeat_interval.0,
            max_wait: self.lifecycle_max_wait.0,
        }
    }

    /// Checks the values; returns the dotted key and the message.
    ///
    /// # Errors
    /// [`InvalidKey`]: the dotted key and what is wrong.
    pub fn validate(&self) -> Result<(), InvalidKey> {
        let e = |k: &str, m: &str| Err(InvalidKey::new(format!("events.{k}"), m));
        if self.spot_interval.0.is_zero() {
            return e("spot_interval", "must be more than 0");
        }
        if self.rebalance_window.0.is_zero() {
            return e("rebalance_window", "must be more than 0");
        }
        if self.interval.0.is_zero() {
            return e("interval", "must be more than 0");
        }
        if self.maintenance_interval.0.is_zero() {
            return e("maintenance_interval", "must be more than 0");
        }
        if self.capacity_block_interval.0.is_zero() {
            return e("capacity_block_interval", "must be more than 0");
        }
        let beat = self.lifecycle_heartbeat_interval;
        if beat.0.is_zero() {
            return e("lifecycle_heartbeat_interval", "must be more than 0");
        }
        if beat.0 >= hook::MAX_HEARTBEAT_TIMEOUT {
            return e(
                "lifecycle_heartbeat_interval",
                &format!(
                    "{beat} is at or above 2h, the longest HeartbeatTimeout a lifecycle hook \
                     can have: every heartbeat would come after the hook expired"
                ),
            );
        }
        let wait = self.lifecycle_max_wait;
        if wait.0.is_zero() {
            return e("lifecycle_max_wait", "must be more than 0");
        }
        if wait.0 > hook::MAX_GLOBAL_TIMEOUT {
            return e(
                "lifecycle_max_wait",
                &format!(
                    "{wait} is beyond 48h, the longest Auto Scaling keeps an instance in \
                     Terminating:Wait whatever the heartbeats"
                ),
            );
        }
        let sig = self.spot_job_signal.trim_start_matches("SIG");
        let numeric = sig.parse::<u8>().is_ok_and(|n| (1..=64).contains(&n));
        if !numeric && !SIGNALS.contains(&sig) {
            return e(
                "spot_job_signal",
                "expected a signal name (TERM, USR1, ...) or number 1 to 64",
            );
        }
        Ok(())
    }
}

/// What a poll saw at a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed<T> {
    /// 404: no notice.
    Absent,
    /// A notice.
    Present(T),
    /// The path answered, but the body could not be read.
    Unreadable(NoticeError),
}

/// One round of observations; `None` where the path was not polled or the poll failed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observations {
    /// Spot interruption.
    pub spot: Option<Observed<SpotNotice>>,
    /// Rebalance recommendation.
    pub rebalance: Option<Observed<RebalanceNotice>>,
    /// Scheduled maintenance (`Absent`: none scheduled).
    pub maintenance: Option<Observed<Vec<MaintenanceEvent>>>,
    /// Completed and canceled maintenance events (`events/maintenance/history`).
    pub maintenance_history: Option<Observed<Vec<MaintenanceEvent>>>,
    /// Lifecycle state.
    pub lifecycle: Option<Observed<String>>,
    /// The Capacity Block the instance runs in, from EC2's API (`Absent`: none, or a
    /// capacity reservation that is not a Capacity Block).
    pub capacity_block: Option<Observed<CapacityBlock>>,
}

/// Polls one path.
async fn poll<T>(
    imds: &dyn InstanceMetadata,
    path: &str,
    parse: impl FnOnce(&str) -> Result<T, NoticeError>,
) -> Result<Observed<T>, ImdsError> {
    Ok(match imds.get_optional(path).await? {
        None => Observed::Absent,
        Some(body) => match parse(&body) {
            Ok(v) => Observed::Present(v),
            Err(e) => Observed::Unreadable(e),
        },
    })
}

/// Reads `spot/instance-action`.
///
/// # Errors
/// [`ImdsError`] after the client's retries and token refresh.
pub async fn poll_spot(imds: &dyn InstanceMetadata) -> Result<Observed<SpotNotice>, ImdsError> {
    poll(imds, notice::SPOT_PATH, notice::parse_spot).await
}

/// Reads `events/recommendations/rebalance`.
///
/// # Errors
/// [`ImdsError`].
pub async fn poll_rebalance(
    imds: &dyn InstanceMetadata,
) -> Result<Observed<RebalanceNotice>, ImdsError> {
    poll(imds, notice::REBALANCE_PATH, notice::parse_rebalance).await
}

/// Reads `events/maintenance/scheduled`; field-level problems are logged as warnings.
///
/// # Errors
/// [`ImdsError`].
pub async fn poll_maintenance(
    imds: &dyn InstanceMetadata,
) -> Result<Observed<Vec<MaintenanceEvent>>, ImdsError> {
    poll(imds, notice::MAINTENANCE_PATH, |b| {
        notice::parse_maintenance(b).map(|(events, warnings)| {
            for w in warnings {
                tracing::warn!("{w}");
            }
            events
        })
    })
    .await
}

/// Reads `events/maintenance/history`; field-level problems are logged as warnings.
///
/// # Errors
/// [`ImdsError`].
pub async fn poll_maintenance_history(
    imds: &dyn InstanceMetadata,
) -> Result<Observed<Vec<MaintenanceEvent>>, ImdsError> {
    poll(imds, notice::MAINTENANCE_HISTORY_PATH, |b| {
        notice::parse_maintenance_history(b).map(|(events, warnings)| {
            for w in warnings {
                tracing::warn!("{w}");
            }
            events
        })
    })
    .await
}

/// Reads `autoscaling/target-lifecycle-state`.
///
/// # Errors
/// [`ImdsError`].
pub async fn poll_lifecycle(imds: &dyn InstanceMetadata) -> Result<Observed<String>, ImdsError> {
    poll(imds, notice::LIFECYCLE_PATH, |b| Ok(b.trim().to_string())).await
}

/// A drain decision from one round of observations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Drain for this cause.
    Drain(Cause),
    /// The cause with this key ([`Cause::key`]: a maintenance event, a rebalance
    /// recommendation) no longer needs the node drained.
    Undo(String),
    /// The maintenance event with this key is over and took the instance down (a reboot, a
    /// stop: [`notice::takes_instance_down`]): its drain is lifted once this node's slurmd
    /// has registered with slurmctld again after the drain began.
    UndoAfterRegistration(String),
}

/// Turns observations into decisions, most urgent first. `current` is the cause of the
/// drain in progress (to undo a maintenance drain whose event went away), `now` Unix
/// seconds.
pub fn decide(
    s: &EventsSettings,
    obs: &Observations,
    current: Option<&Cause>,
    now: i64,
) -> Vec<Decision> {
    let mut out = Vec::new();
    match &obs.spot {
        Some(Observed::Present(n)) => out.push(Decision::Drain(Cause::Spot {
            action: n.action.as_str().to_string(),
            time: n.time,
        })),
        Some(Observed::Unreadable(e)) => {
            tracing::error!("{e}; draining anyway: the notice is there");
            out.push(Decision::Drain(Cause::Spot {
                action: "unreadable".into(),
                time: now + SPOT_WARNING_SECS,
            }));
        }
        _ => {}
    }
    if s.lifecycle {
        match &obs.lifecycle {
            Some(Observed::Present(st)) if notice::lifecycle_is_terminating(st) => {
                out.push(Decision::Drain(Cause::Lifecycle {
                    state: st.clone(),
                    seen: now,
                }));
            }
            Some(Observed::Present(st)) if !notice::lifecycle_is_known(st) => {
                tracing::warn!(
                    path = notice::LIFECYCLE_PATH,
                    state = %st,
                    "unknown target lifecycle state; ignored"
                );
            }
            _ => {}
        }
    }
    decide_maintenance(s, obs, current, now, &mut out);
    decide_capacity_block(s, obs, current, now, &mut out);
    if s.rebalance == RebalancePolicy::Drain {
        let window = i64::try_from(s.rebalance_window.0.as_secs()).unwrap_or(i64::MAX);
        match &obs.rebalance {
            Some(Observed::Present(r)) if now.saturating_sub(r.notice_time) < window => {
                out.push(Decision::Drain(Cause::Rebalance {
                    notice_time: r.notice_time,
                }))
            }
            Some(Observed::Present(_)) => {
                // The window passed without an interruption notice: the recommendation is
                // over (a spot notice, if one comes, drains on its own).
                if let Some(c @ Cause::Rebalance { .. }) = current {
                    out.push(Decision::Undo(c.key()));
                }
            }
            Some(Observed::Unreadable(e)) => {
                tracing::warn!("{e}; treated as a rebalance recommendation now");
                out.push(Decision::Drain(Cause::Rebalance { notice_time: now }));
            }
            _ => {}
        }
    }
    out
}

/// The Capacity Block part of [`decide`]: drain once `events.capacity_block_lead` before
/// EC2 begins terminating the block's instances (30 minutes before its end); undo this
/// block's drain when its end moved out of the lead (the block was extended). A block
/// without an end date is left alone.
fn decide_capacity_block(
    s: &EventsSettings,
    obs: &Observations,
    current: Option<&Cause>,
    now: i64,
    out: &mut Vec<Decision>,
) {
    if !s.capacity_block {
        return;
    }
    let Some(Observed::Present(block)) = &obs.capacity_block else {
        return;
    };
    let Some(end) = block.end else {
        return;
    };
    let lead = i64::try_from(s.capacity_block_lead.0.as_secs()).unwrap_or(i64::MAX);
    let drain_at = (end - CAPACITY_BLOCK_RECLAIM_SECS).saturating_sub(lead);
    let ours = match current {
        Some(c @ Cause::CapacityBlock { reservation_id, .. })
            if *reservation_id == block.reservation_id =>
        {
            Some(c)
        }
        _ => None,
    };
    if now >= drain_at {
        // A drain for this block already in place stays as it is (its end moved, but not
        // out of the lead).
        if ours.is_none() {
            out.push(Decision::Drain(Cause::CapacityBlock {
                reservation_id: block.reservation_id.clone(),
                end,
            }));
        }
    } else if let Some(c) = ours {
        out.push(Decision::Undo(c.key()));
    }
}

/// How a maintenance event ended, as far as IMDS tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Over {
    /// Canceled: nothing happened to the instance.
    Canceled,
    /// Completed, its window (`NotAfter`) passed, or gone from `scheduled` without a word in
    /// `history`: it may have taken the instance down.
    Done,
}

/// The decision that ends the drain of a maintenance event that is over: at once when it
/// was canceled or its code leaves the instance running; after slurmd registered again when
/// it took the instance down ([`notice::takes_instance_down`]).
fn undo_over(cause: &Cause, code: &str, over: Over) -> Decision {
    if over == Over::Done && notice::takes_instance_down(code) {
        Decision::UndoAfterRegistration(cause.key())
    } else {
        Decision::Undo(cause.key())
    }
}

/// The maintenance part of [`decide`]. `events/maintenance/scheduled` answering 404 is no
/// event scheduled. An event in `events/maintenance/history` is over whatever `scheduled`
/// still says (EC2 moves completed and canceled events there). Nothing is undone while
/// `scheduled` could not be read (a failed poll or an unreadable body), unless `history`
/// names the event.
fn decide_maintenance(
    s: &EventsSettings,
    obs: &Observations,
    current: Option<&Cause>,
    now: i64,
    out: &mut Vec<Decision>,
) {
    let scheduled: Option<&[MaintenanceEvent]> = match &obs.maintenance {
        Some(Observed::Present(events)) => Some(events),
        Some(Observed::Absent) => Some(&[]),
        Some(Observed::Unreadable(_)) | None => None,
    };
    let history: &[MaintenanceEvent] = match &obs.maintenance_history {
        Some(Observed::Present(events)) => events,
        _ => &[],
    };
    let cause_of = |ev: &MaintenanceEvent| Cause::Maintenance {
        event_id: ev.event_id.clone(),
        code: ev.code.clone(),
        not_before: ev.not_before,
    };
    let lead = i64::try_from(s.maintenance_lead.0.as_secs()).unwrap_or(i64::MAX);
    let mut decided: Vec<String> = Vec::new();
    for ev in history {
        let cause = cause_of(ev);
        if decided.contains(&cause.key()) {
            continue;
        }
        decided.push(cause.key());
        let over = match ev.state {
            notice::EventState::Canceled => Over::Canceled,
            _ => Over::Done,
        };
        out.push(undo_over(&cause, &ev.code, over));
    }
    for ev in scheduled.unwrap_or_default() {
        let cause = cause_of(ev);
        if decided.contains(&cause.key()) {
            continue;
        }
        decided.push(cause.key());
        if s.maintenance_ignore_codes.iter().any(|c| c == &ev.code) {
            out.push(Decision::Undo(cause.key()));
            continue;
        }
        let over = match ev.state {
            notice::EventState::Canceled => Some(Over::Canceled),
            notice::EventState::Completed => Some(Over::Done),
            _ if ev.not_after.is_some_and(|end| end <= now) => Some(Over::Done),
            _ => None,
        };
        if let Some(over) = over {
            out.push(undo_over(&cause, &ev.code, over));
            continue;
        }
        let due = ev
            .not_before
            .is_none_or(|nb| nb.saturating_sub(lead) <= now);
        if due {
            out.push(Decision::Drain(cause));
        } else if current.is_some_and(|c| c.key() == cause.key()) {
            // Rescheduled later than the lead: the drain it caused is not needed yet.
            out.push(Decision::Undo(cause.key()));
        }
    }
    if let Some(c @ Cause::Maintenance { code, .. }) = current {
        if scheduled.is_some() && !decided.contains(&c.key()) {
            // Gone from `scheduled` and not in `history`.
            out.push(undo_over(c, code, Over::Done));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ev(
        id: &str,
        state: notice::EventState,
        nb: Option<i64>,
        na: Option<i64>,
    ) -> MaintenanceEvent {
        MaintenanceEvent {
            event_id: id.into(),
            code: "system-reboot".into(),
            description: String::new(),
            not_before: nb,
            not_after: na,
            state,
        }
    }

    #[test]
    fn a_capacity_block_drains_a_lead_before_the_reclaim_and_an_extension_undoes_it() {
        let mut s = EventsSettings::default();
        s.capacity_block_lead = HumanDuration(std::time::Duration::from_secs(600));
        let end = 1_000_000;
        // EC2 terminates from end - 30 min; the drain is due 10 min before that.
        let drain_at = end - 1800 - 600;
        let obs = |end: Option<i64>| Observations {
            capacity_block: Some(Observed::Present(CapacityBlock {
                reservation_id: "cr-1".into(),
                start: Some(end.unwrap_or(0) - 86_400),
                end,
                state: "active".into(),
            })),
            ..Default::default()
        };
        let cause = Cause::CapacityBlock {
            reservation_id: "cr-1".into(),
            end,
        };
        assert!(decide(&s, &obs(Some(end)), None, drain_at - 1).is_empty());
        assert_eq!(
            decide(&s, &obs(Some(end)), None, drain_at),
            [Decision::Drain(cause.clone())]
        );
        // Drained for it: nothing new while it stands; the job action is due at the reclaim.
        assert!(decide(&s, &obs(Some(end)), Some(&cause), drain_at + 5).is_empty());
        assert_eq!(cause.job_action_deadline(), Some(end - 1800));
        // Extended by an hour: out of the lead, the drain is undone.
        assert_eq!(
            decide(&s, &obs(Some(end + 3600)), Some(&cause), drain_at + 5),
            [Decision::Undo(cause.key())]
        );
        // Another block's, or a maintenance drain, is not this block's to undo.
        let other = Cause::CapacityBlock {
            reservation_id: "cr-2".into(),
            end,
        };
        assert!(decide(&s, &obs(Some(end + 3600)), Some(&other), drain_at).is_empty());
        // No end date, or the watch turned off: left alone.
        assert!(decide(&s, &obs(None), None, end).is_empty());
        s.capacity_block = false;
        assert!(decide(&s, &obs(Some(end)), None, end).is_empty());
    }

    #[test]
    fn maintenance_drains_only_within_the_lead_time() {
        let s = EventsSettings::default(); // 24 h lead
        let now = 1_000_000;
        let far = ev(
            "e-far",
            notice::EventState::Active,
            Some(now + 14 * 86_400),
            None,
        );
        let near = ev("e-near", notice::EventState::Active, Some(now + 3600), None);
        let past = ev("e-past", notice::EventState::Active, Some(now - 60), None);
        let unknown_time = ev(
            "e-x",
            notice::EventState::Other("pending".into()),
            None,
            None,
        );
        let obs = Observations {
            maintenance: Some(Observed::Present(vec![far, near, past, unknown_time])),
            ..Default::default()
        };
        let d = decide(&s, &obs, None, now);
        let drained: Vec<String> = d
            .iter()
            .filter_map(|d| match d {
                Decision::Drain(c) => Some(c.key()),
                Decision::Undo(_) | Decision::UndoAfterRegistration(_) => None,
            })
            .collect();
        assert_eq!(
            drained,
            [
                "maintenance:e-near",
                "maintenance:e-past",
                "maintenance:e-x"
            ]
        );
    }

    #[test]
    fn maintenance_canceled_completed_expired_or_gone_undoes() {
        let s = EventsSettings::default();
        let now = 1_000_000;
        let current = Cause::Maintenance {
            event_id: "e-gone".into(),
            code: "system-reboot".into(),
            not_before: Some(now),
        };
        let mut maintenance_stays = ev("e-m", notice::EventState::Completed, Some(now), None);
        maintenance_stays.code = "system-maintenance".into();
        let obs = Observations {
            maintenance: Some(Observed::Present(vec![
                ev("e-c", notice::EventState::Canceled, Some(now), None),
                ev("e-d", notice::EventState::Completed, Some(now), None),
                ev(
                    "e-old",
                    notice::EventState::Active,
                    Some(now - 7200),
                    Some(now - 1),
                ),
                maintenance_stays,
            ])),
            ..Default::default()
        };
        let d = decide(&s, &obs, Some(&current), now);
        // A canceled reboot never happened: undone at once. A reboot that is over (completed,
        // window passed, gone) is undone once slurmd registered again; an event that left
        // the instance running, at once.
        assert_eq!(
            d,
            [
                Decision::Undo("maintenance:e-c".into()),
                Decision::UndoAfterRegistration("maintenance:e-d".into()),
                Decision::UndoAfterRegistration("maintenance:e-old".into()),
                Decision::Undo("maintenance:e-m".into()),
                Decision::UndoAfterRegistration("maintenance:e-gone".into()),
            ]
        );
        // A failed poll (None) undoes nothing.
        let none = decide(&s, &Observations::default(), Some(&current), now);
        assert!(none.is_empty());
        // Neither does an unreadable `scheduled`.
        let unreadable = Observations {
            maintenance: Some(Observed::Unreadable(NoticeError {
                path: notice::MAINTENANCE_PATH,
                message: "EOF".into(),
            })),
            ..Default::default()
        };
        assert!(decide(&s, &unreadable, Some(&current), now).is_empty());
        // `scheduled` answering 404 is no event: the current one is gone.
        let absent = Observations {
            maintenance: Some(Observed::Absent),
            ..Default::default()
        };
        assert_eq!(
            decide(&s, &absent, Some(&current), now),
            [Decision::UndoAfterRegistration("maintenance:e-gone".into())]
        );
    }

    #[test]
    fn maintenance_history_ends_the_drain_whatever_scheduled_still_says() {
        let s = EventsSettings::default();
        let now = 1_000_000;
        let reboot = Cause::Maintenance {
            event_id: "e-r".into(),
            code: "system-reboot".into(),
            not_before: Some(now),
        };
        // `scheduled` as given, and `history` holding e-r in `state`.
        let with_history = |scheduled: Option<Observed<Vec<notice::MaintenanceEvent>>>,
                            state: notice::EventState| Observations {
            maintenance: scheduled,
            maintenance_history: Some(Observed::Present(vec![ev("e-r", state, Some(now), None)])),
            ..Default::default()
        };
        // EC2 moved the reboot to history as completed; `scheduled` still lists it as
        // active (not yet updated): history wins, and nothing drains again.
        let still_active =
            Observed::Present(vec![ev("e-r", notice::EventState::Active, Some(now), None)]);
        let obs = with_history(Some(still_active), notice::EventState::Completed);
        assert_eq!(
            decide(&s, &obs, Some(&reboot), now),
            [Decision::UndoAfterRegistration(reboot.key())]
        );
        // Canceled in history, gone from scheduled (404): at once.
        let obs = with_history(Some(Observed::Absent), notice::EventState::Canceled);
        assert_eq!(
            decide(&s, &obs, Some(&reboot), now),
            [Decision::Undo(reboot.key())]
        );
        // History alone (scheduled not read this round) still ends the drain.
        let obs = with_history(None, notice::EventState::Completed);
        assert_eq!(
            decide(&s, &obs, Some(&reboot), now),
            [Decision::UndoAfterRegistration(reboot.key())]
        );
        // Another event's history says nothing about the current one, and an active event
        // still due keeps its drain.
        let obs = Observations {
            maintenance: Some(Observed::Present(vec![ev(
                "e-r",
                notice::EventState::Active,
                Some(now),
                None,
            )])),
            maintenance_history: Some(Observed::Present(vec![ev(
                "e-other",
                notice::EventState::Completed,
                Some(now - 86_400),
                None,
            )])),
            ..Default::default()
        };
        assert_eq!(
            decide(&s, &obs, Some(&reboot), now),
            [
                Decision::UndoAfterRegistration("maintenance:e-other".into()),
                Decision::Drain(reboot.clone()),
            ]
        );
    }

    #[test]
    fn unreadable_spot_notice_still_drains() {
        let s = EventsSettings::default();
        let obs = Observations {
            spot: Some(Observed::Unreadable(NoticeError {
                path: notice::SPOT_PATH,
                message: "EOF".into(),
            })),
            ..Default::default()
        };
        let d = decide(&s, &obs, None, 100);
        assert_eq!(
            d,
            [Decision::Drain(Cause::Spot {
                action: "unreadable".into(),
                time: 220
            })]
        );
    }

    #[test]
    fn rebalance_policy_and_lifecycle() {
        let mut s = EventsSettings::default();
        let obs = Observations {
            rebalance: Some(Observed::Present(RebalanceNotice { notice_time: 5 })),
            lifecycle: Some(Observed::Present("Terminated".into())),
            ..Default::default()
        };
        // Default: a rebalance recommendation is logged, not drained.
        assert_eq!(
            decide(&s, &obs, None, 10),
            [Decision::Drain(Cause::Lifecycle {
                state: "Terminated".into(),
                seen: 10,
            })]
        );
        s.rebalance = RebalancePolicy::Drain;
        assert_eq!(decide(&s, &obs, None, 10).len(), 2);
        // Past the window without an interruption: the agent's rebalance drain is lifted,
        // and not taken again.
        let current = Cause::Rebalance { notice_time: 5 };
        let late = 5 + 3600;
        let d = decide(&s, &obs, Some(&current), late);
        assert!(d.contains(&Decision::Undo(current.key())), "{d:?}");
        assert!(
            !d.iter()
                .any(|x| matches!(x, Decision::Drain(Cause::Rebalance { .. }))),
            "{d:?}"
        );
        s.rebalance = RebalancePolicy::Ignore;
        s.lifecycle = false;
        assert!(decide(&s, &obs, None, 10).is_empty());
        let inservice = Observations {
            lifecycle: Some(Observed::Present("InService".into())),
            ..Default::default()
        };
        assert!(decide(&EventsSettings::default(), &inservice, None, 10).is_empty());
    }

    #[test]
    fn heartbeat_interval_and_max_wait_are_bounded_naming_key_and_value() {
        let mut s = EventsSettings::default();
        assert!(s.validate().is_ok());
        s.lifecycle_heartbeat_interval = HumanDuration(std::time::Duration::from_secs(7200));
        let err = s.validate().unwrap_err();
        assert_eq!(err.key, "events.lifecycle_heartbeat_interval");
        assert!(err.message.contains("2h"), "{}", err.message);
        s.lifecycle_heartbeat_interval = HumanDuration(std::time::Duration::from_secs(60));
        s.lifecycle_max_wait = HumanDuration(std::time::Duration::from_secs(49 * 3600));
        let err = s.validate().unwrap_err();
        assert_eq!(err.key, "events.lifecycle_max_wait");
        assert!(err.message.contains("2days 1h"), "{}", err.message);
    }

    #[test]
    fn signal_validation() {
        let mut s = EventsSettings::default();
        for ok in ["TERM", "SIGUSR1", "10"] {
            s.spot_job_signal = ok.into();
            assert!(s.validate().is_ok(), "{ok}");
        }
        for bad in ["", "TERM;reboot", "99", "FOO"] {
            s.spot_job_signal = bad.into();
            assert_eq!(s.validate().unwrap_err().key, "events.spot_job_signal");
        }
    }
}
