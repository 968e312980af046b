//! Orphans (`[orphan]`): a node whose cluster is gone powers itself off, so that an
//! instance left behind by a deleted or broken cluster stops billing (ParallelCluster's
//! `computemgtd` does the same after `clustermgtd_timeout`, 10 minutes).
//!
//! Two signs, each watched by the daemon's orphan pass (one `scontrol show node <self>`
//! per [`OrphanSettings::interval`]):
//! - **slurmctld unreachable**: no answer for `orphan.after` since the last one (or since
//!   the daemon started). The window must be longer than the controller's own
//!   `SlurmctldTimeout` (after which a backup controller takes over) and than
//!   `slurm.join_deadline`, so that a restart, an upgrade or a failover of the controller
//!   never powers a node off: a shorter one is refused ([`OrphanSettings::validate`] for
//!   the join deadline, [`WindowError`] against `SlurmctldTimeout` once the controller said
//!   it). An answer within the window starts it again: nothing happened.
//! - **record deleted**: slurmctld answers and does not know this NodeName (`scontrol
//!   delete NodeName=...` by an administrator), after it knew it since the daemon started,
//!   and for `orphan.record_deleted_grace` on end.
//!
//! Time is the monotonic clock and no time is saved (only the controller's
//! `SlurmctldTimeout`, in the state folder): a reboot or a restart of the daemon starts
//! every window again, so that neither can power a node off at once.
//!
//! Floor 1 (outside systems' floor, though it is none): over `section` and `time`; below
//! `settings` (its section) and the daemon (its pass, which powers off by the upgrade's way
//! out).

use std::fmt;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::section::{Classified, HumanDuration, InvalidKey, KeyTrust};

/// `orphan.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum OrphanMode {
    /// On for a dynamic node (`node.dynamic = true`), off for a node defined in slurm.conf.
    #[default]
    Auto,
    /// On for every node.
    On,
    /// Off: the node never powers itself off for this.
    Off,
}

impl OrphanMode {
    /// `auto`, `on` or `off`.
    pub fn as_str(self) -> &'static str {
        match self {
            OrphanMode::Auto => "auto",
            OrphanMode::On => "on",
            OrphanMode::Off => "off",
        }
    }
}

/// `[orphan]`: a node whose controller is gone, or whose record was deleted, powers off.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OrphanSettings {
    /// Whether the node powers itself off when orphaned: `auto` (the default: on for a
    /// dynamic node, off for a node defined in slurm.conf), `on` or `off`. A dynamic node
    /// exists in Slurm only because its instance registered it: nothing else ends an
    /// instance whose cluster was deleted (its slurmctld gone) or whose record an
    /// administrator deleted, and it bills until someone notices. A node defined in
    /// slurm.conf is a fixed fleet that a site (or ParallelCluster's `clustermgtd` and
    /// `computemgtd`) looks after itself: off unless asked. A powered-off instance
    /// launched with `InstanceInitiatedShutdownBehavior = terminate` is terminated.
    pub mode: OrphanMode,
    /// Power off when slurmctld has not answered (`scontrol show node`) for this long.
    /// Must be longer than the controller's `SlurmctldTimeout` (read from `scontrol show
    /// config` at the first answer; a backup controller takes over after it) and than
    /// `slurm.join_deadline`, so that a controller restarted, upgraded or failed over
    /// within minutes powers nothing off. A window not longer than the join deadline is
    /// refused, naming both (the defaults, left alone, turn the watch off with a warning
    /// instead); one not longer than `SlurmctldTimeout` keeps the unreachable-controller
    /// watch off, with an error in the journal naming both. Jobs
    /// still running on the node are lost with it (slurmctld, gone, cannot requeue them):
    /// 30 minutes covers a controller upgrade with room to spare.
    pub after: HumanDuration,
    /// Power off when slurmctld answers that it does not know this NodeName (its record
    /// deleted: `scontrol delete NodeName=...`, which slurmctld refuses while a job runs on
    /// the node) for this long, having known it since the daemon started. A record created
    /// again within it (slurmd registering anew) changes nothing.
    pub record_deleted_grace: HumanDuration,
}

impl Default for OrphanSettings {
    fn default() -> Self {
        OrphanSettings {
            mode: OrphanMode::Auto,
            after: HumanDuration(Duration::from_secs(30 * 60)),
            record_deleted_grace: HumanDuration(Duration::from_secs(10 * 60)),
        }
    }
}

impl Classified for OrphanSettings {
    const SECTION: &'static str = "orphan";
    const TRUST: &'static [KeyTrust] = &[
        KeyTrust::user_data("mode"),
        KeyTrust::user_data("after"),
        KeyTrust::user_data("record_deleted_grace"),
    ];
}

/// A window not longer than the controller's own `SlurmctldTimeout`: a failover would
/// power the node off. The orphan watch of an unreachable controller is then off.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "orphan.after = {after} is not longer than the controller's SlurmctldTimeout = {slurmctld_timeout} \
     (scontrol show config): a controller restart or a failover to its backup would power the node off; \
     the node is not powered off for an unreachable slurmctld until orphan.after is longer"
)]
pub struct WindowError {
    /// `orphan.after`.
    pub after: HumanDuration,
    /// The controller's `SlurmctldTimeout`.
    pub slurmctld_timeout: HumanDuration,
}

impl OrphanSettings {
    /// Whether the watch is on for a node defined so (`node.dynamic`).
    pub fn enabled(&self, dynamic: bool) -> bool {
        match self.mode {
            OrphanMode::Auto => dynamic,
            OrphanMode::On => true,
            OrphanMode::Off => false,
        }
    }

    /// Whether the watch left at its defaults (`mode = "auto"`, `after` the default 30m)
    /// yields to a `slurm.join_deadline` at least as long, on a node where `auto` is on
    /// (`dynamic`): a site that set nothing about orphans but lets its nodes join for 30
    /// minutes or more is not refused at start; the watch stays off and the daemon says
    /// why. A window the site chose (`after` set, or `mode = "on"`) is refused instead.
    pub fn yields_to_join_deadline(&self, dynamic: bool, join_deadline: HumanDuration) -> bool {
        self.mode == OrphanMode::Auto
            && dynamic
            && self.after == OrphanSettings::default().after
            && self.after.0 <= join_deadline.0
    }

    /// Whether the daemon runs the watch: [`OrphanSettings::enabled`], unless it
    /// [yields to the join deadline](OrphanSettings::yields_to_join_deadline).
    pub fn active(&self, dynamic: bool, join_deadline: HumanDuration) -> bool {
        self.enabled(dynamic) && !self.yields_to_join_deadline(dynamic, join_deadline)
    }

    /// How often the daemon looks: a tenth of the shorter window, from 1 s to 60 s.
    pub fn interval(&self) -> Duration {
        (self.after.0.min(self.record_deleted_grace.0) / 10)
            .clamp(Duration::from_secs(1), Duration::from_secs(60))
    }

    /// Checks the windows: not zero, and, where the watch is on (`compute`: a Slurm node,
    /// not a login node, which has no watch; `dynamic`: `node.dynamic`), `after` longer
    /// than `join_deadline` (`slurm.join_deadline`).
    ///
    /// # Errors
    /// [`InvalidKey`]: the dotted key and what is wrong, naming both keys and values.
    pub fn validate(
        &self,
        join_deadline: HumanDuration,
        dynamic: bool,
        compute: bool,
    ) -> Result<(), InvalidKey> {
        if self.after.is_zero() {
            return Err(InvalidKey::new("orphan.after", "must be more than 0"));
        }
        if self.record_deleted_grace.is_zero() {
            return Err(InvalidKey::new(
                "orphan.record_deleted_grace",
                "must be more than 0",
            ));
        }
        if compute && self.active(dynamic, join_deadline) && self.after.0 <= join_deadline.0 {
            return Err(InvalidKey::new(
                "orphan.after",
                format!(
                    "orphan.after = {} is not longer than slurm.join_deadline = {join_deadline}: \
                     a node still joining would power off; make orphan.after longer, or set \
                     orphan.mode = \"off\"",
                    self.after
                ),
            ));
        }
        Ok(())
    }

    /// Checks `after` against the controller's `SlurmctldTimeout`.
    ///
    /// # Errors
    /// [`WindowError`] when `after` is not longer.
    pub fn check_window(&self, slurmctld_timeout: Duration) -> Result<(), WindowError> {
        if self.after.0 > slurmctld_timeout {
            Ok(())
        } else {
            Err(WindowError {
                after: self.after,
                slurmctld_timeout: HumanDuration(slurmctld_timeout),
            })
        }
    }
}

/// What one look at slurmctld (`scontrol show node <self>`) found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look {
    /// It answered with this node's record.
    Found,
    /// It answered that it does not know this NodeName.
    NotFound,
    /// No answer (connection refused, timed out, refused this node): counted as
    /// unreachable.
    NoAnswer,
}

/// Why the node powers off: the journal's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Orphaned {
    /// slurmctld has not answered for `unreachable` (at least `orphan.after`).
    Unreachable {
        /// How long since the last answer (or the daemon's start).
        unreachable: Duration,
        /// `orphan.after`.
        after: HumanDuration,
        /// Whether it answered at all since the daemon started.
        ever_answered: bool,
    },
    /// The record has been missing for `missing` (at least `orphan.record_deleted_grace`).
    RecordDeleted {
        /// How long it has been missing.
        missing: Duration,
        /// When it was first found missing (Unix seconds).
        since: i64,
        /// `orphan.record_deleted_grace`.
        grace: HumanDuration,
    },
}

fn secs(d: Duration) -> HumanDuration {
    HumanDuration(Duration::from_secs(d.as_secs()))
}

impl fmt::Display for Orphaned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Orphaned::Unreachable {
                unreachable,
                after,
                ever_answered,
            } => write!(
                f,
                "slurmctld has not answered for {} ({}; orphan.after = {after}): \
                 no reason can be written in Slurm",
                secs(*unreachable),
                if *ever_answered {
                    "since its last answer"
                } else {
                    "since the daemon started"
                }
            ),
            Orphaned::RecordDeleted {
                missing,
                since,
                grace,
            } => write!(
                f,
                "this node's record was deleted from slurmctld: not found since {} ({} ago; \
                 orphan.record_deleted_grace = {grace})",
                crate::time::format(*since),
                secs(*missing)
            ),
        }
    }
}

/// The orphan watch of one daemon: when slurmctld last answered, whether it knew the node,
/// and since when the record is missing. Monotonic times only; never saved.
#[derive(Debug, Clone)]
pub struct Watch {
    after: HumanDuration,
    grace: HumanDuration,
    /// The daemon's start: the unreachable window counts from it before any answer.
    start: Instant,
    last_answer: Option<Instant>,
    /// The record was seen since the daemon started (before that, "not found" is a node
    /// that has not registered yet, not a deleted record).
    seen: bool,
    /// Missing since (monotonic, Unix seconds for the journal).
    missing_since: Option<(Instant, i64)>,
    /// Whether a window shorter than `SlurmctldTimeout` turned the unreachable watch off
    /// ([`Watch::refuse_unreachable`]), or the timeout is not known yet.
    unreachable_armed: bool,
}

impl Watch {
    /// A watch started at `start` with the settings' windows. The unreachable watch waits
    /// for [`Watch::arm_unreachable`] (the window checked against `SlurmctldTimeout`).
    pub fn new(s: &OrphanSettings, start: Instant) -> Watch {
        Watch {
            after: s.after,
            grace: s.record_deleted_grace,
            start,
            last_answer: None,
            seen: false,
            missing_since: None,
            unreachable_armed: false,
        }
    }

    /// Arms (`true`) or disarms the unreachable watch: the window checked against the
    /// controller's `SlurmctldTimeout`.
    pub fn arm_unreachable(&mut self, armed: bool) {
        self.unreachable_armed = armed;
    }

    /// Whether the unreachable watch is armed.
    pub fn unreachable_armed(&self) -> bool {
        self.unreachable_armed
    }

    /// Takes one look made at `now` (`wall`: Unix seconds, for the journal) and says
    /// whether the node is an orphan now.
    pub fn observe(&mut self, look: Look, now: Instant, wall: i64) -> Option<Orphaned> {
        match look {
            Look::Found => {
                self.last_answer = Some(now);
                self.seen = true;
                self.missing_since = None;
                None
            }
            Look::NotFound => {
                self.last_answer = Some(now);
                if !self.seen {
                    return None;
                }
                let (at, since) = *self.missing_since.get_or_insert((now, wall));
                let missing = now.saturating_duration_since(at);
                (missing >= self.grace.0).then_some(Orphaned::RecordDeleted {
                    missing,
                    since,
                    grace: self.grace,
                })
            }
            Look::NoAnswer => {
                if !self.unreachable_armed {
                    return None;
                }
                let from = self.last_answer.unwrap_or(self.start);
                let unreachable = now.saturating_duration_since(from);
                (unreachable >= self.after.0).then_some(Orphaned::Unreachable {
                    unreachable,
                    after: self.after,
                    ever_answered: self.last_answer.is_some(),
                })
            }
        }
    }

    /// Whether the record was seen since the daemon started (a deletion counts only then).
    pub fn seen(&self) -> bool {
        self.seen
    }

    /// Whether the record, seen before, is missing now (its grace running).
    pub fn missing(&self) -> bool {
        self.missing_since.is_some()
    }

    /// How long slurmctld has not answered at `now` (zero right after an answer).
    pub fn unanswered(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.last_answer.unwrap_or(self.start))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn d(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn settings(after: u64, grace: u64) -> OrphanSettings {
        OrphanSettings {
            mode: OrphanMode::On,
            after: HumanDuration(d(after)),
            record_deleted_grace: HumanDuration(d(grace)),
        }
    }

    #[test]
    fn auto_is_on_for_dynamic_nodes_only() {
        let s = OrphanSettings::default();
        assert!(s.enabled(true));
        assert!(!s.enabled(false));
        let on = settings(900, 60);
        assert!(on.enabled(false));
        let off = OrphanSettings {
            mode: OrphanMode::Off,
            ..on
        };
        assert!(!off.enabled(true));
    }

    #[test]
    fn the_default_window_is_longer_than_the_default_join_deadline() {
        let s = OrphanSettings::default();
        let join = crate::section::HumanDuration(d(600));
        s.validate(join, true, true).unwrap();
        // Slurm's default SlurmctldTimeout is 120 s.
        s.check_window(d(120)).unwrap();
        assert_eq!(s.interval(), d(60));
    }

    #[test]
    fn a_window_not_longer_than_the_join_deadline_is_refused_naming_both() {
        let s = settings(300, 60);
        let e = s.validate(HumanDuration(d(600)), true, true).unwrap_err();
        let m = e.to_string();
        assert!(m.contains("orphan.after"), "{m}");
        assert!(m.contains("5m"), "{m}");
        assert!(m.contains("slurm.join_deadline = 10m"), "{m}");
        // Equal is not longer.
        assert!(settings(600, 60)
            .validate(HumanDuration(d(600)), true, true)
            .is_err());
        // A login node has no watch: not checked.
        settings(300, 60)
            .validate(HumanDuration(d(600)), true, false)
            .unwrap();
        // Off: not checked.
        let off = OrphanSettings {
            mode: OrphanMode::Auto,
            ..s
        };
        off.validate(HumanDuration(d(600)), false, true).unwrap();
        // Zero windows are refused whatever the mode.
        let m = settings(0, 60)
            .validate(HumanDuration(d(1)), false, true)
            .unwrap_err()
            .to_string();
        assert!(m.contains("orphan.after"), "{m}");
        let m = settings(900, 0)
            .validate(HumanDuration(d(1)), false, true)
            .unwrap_err()
            .to_string();
        assert!(m.contains("orphan.record_deleted_grace"), "{m}");
    }

    #[test]
    fn a_window_not_longer_than_slurmctld_timeout_is_refused_naming_both() {
        let s = settings(120, 60);
        let m = s.check_window(d(120)).unwrap_err().to_string();
        assert!(m.contains("orphan.after = 2m"), "{m}");
        assert!(m.contains("SlurmctldTimeout = 2m"), "{m}");
        s.check_window(d(119)).unwrap();
    }

    #[test]
    fn an_unreachable_controller_powers_off_only_past_the_window_and_an_answer_resets_it() {
        let t0 = Instant::now();
        let mut w = Watch::new(&settings(600, 60), t0);
        w.arm_unreachable(true);
        assert_eq!(w.observe(Look::Found, t0, 0), None);
        // Down for 9 minutes, then back: nothing.
        assert_eq!(w.observe(Look::NoAnswer, t0 + d(540), 0), None);
        assert_eq!(w.observe(Look::Found, t0 + d(560), 0), None);
        assert_eq!(w.unanswered(t0 + d(560)), d(0));
        // 10 minutes after that answer: orphaned, and it says for how long.
        assert_eq!(w.observe(Look::NoAnswer, t0 + d(1100), 0), None);
        let o = w.observe(Look::NoAnswer, t0 + d(1160), 0).unwrap();
        assert_eq!(
            o,
            Orphaned::Unreachable {
                unreachable: d(600),
                after: HumanDuration(d(600)),
                ever_answered: true
            }
        );
        let line = o.to_string();
        assert!(
            line.contains("not answered for 10m (since its last answer; orphan.after = 10m)"),
            "{line}"
        );
    }

    #[test]
    fn unarmed_the_unreachable_watch_never_fires() {
        let t0 = Instant::now();
        let mut w = Watch::new(&settings(600, 60), t0);
        assert_eq!(w.observe(Look::NoAnswer, t0 + d(100_000), 0), None);
        w.arm_unreachable(true);
        // Before any answer the window counts from the daemon's start.
        let o = w.observe(Look::NoAnswer, t0 + d(600), 0).unwrap();
        assert!(o.to_string().contains("since the daemon started"), "{o}");
    }

    #[test]
    fn a_record_not_yet_seen_is_not_deleted_and_a_deleted_one_powers_off_after_the_grace() {
        let t0 = Instant::now();
        let mut w = Watch::new(&settings(600, 60), t0);
        // Not registered yet: "not found" for an hour means nothing.
        assert_eq!(w.observe(Look::NotFound, t0 + d(3600), 0), None);
        assert_eq!(w.observe(Look::Found, t0 + d(3601), 0), None);
        assert_eq!(w.observe(Look::NotFound, t0 + d(3610), 1_796_000_000), None);
        // Created again within the grace: the grace starts over.
        assert_eq!(w.observe(Look::Found, t0 + d(3650), 0), None);
        assert_eq!(w.observe(Look::NotFound, t0 + d(3700), 1_796_000_100), None);
        assert_eq!(w.observe(Look::NotFound, t0 + d(3759), 0), None);
        let o = w.observe(Look::NotFound, t0 + d(3760), 0).unwrap();
        assert_eq!(
            o,
            Orphaned::RecordDeleted {
                missing: d(60),
                since: 1_796_000_100,
                grace: HumanDuration(d(60))
            }
        );
        let line = o.to_string();
        assert!(line.contains("record was deleted"), "{line}");
        assert!(line.contains("not found since 2026-"), "{line}");
        assert!(line.contains("1m ago"), "{line}");
    }

    #[test]
    fn a_missing_record_answers_for_the_unreachable_watch() {
        let t0 = Instant::now();
        let mut w = Watch::new(&settings(600, 3600), t0);
        w.arm_unreachable(true);
        w.observe(Look::Found, t0, 0);
        w.observe(Look::NotFound, t0 + d(500), 0);
        assert_eq!(w.observe(Look::NoAnswer, t0 + d(1000), 0), None);
    }

    #[test]
    fn the_interval_is_a_tenth_of_the_shorter_window_within_1_to_60_s() {
        assert_eq!(settings(20, 5).interval(), d(1));
        assert_eq!(settings(100, 300).interval(), d(10));
        assert_eq!(OrphanSettings::default().interval(), d(60));
    }
}
