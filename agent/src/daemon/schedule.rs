//! The daemon's periodic jobs on one shared tick (operating-system noise).
//!
//! Every periodic job of the daemon (the notices, the drain's progress, the health pass,
//! the mounts, the watchdog, the desired-image check) is due on the ticks of one timer
//! whose period is the shortest job's (`events.spot_interval`, 1 s, by default). A job
//! whose period is longer is due on the first tick at or after its time, so its
//! effective period is rounded up to whole ticks: each wake-up of the daemon serves every
//! job due then, instead of one timer per job waking the daemon at its own phase.
//!
//! The tick itself is a timerfd ([`Ticker`]), not a tokio timer: tokio's hierarchical
//! timer wheel parks the thread until the start of the coarse slot that holds a deadline
//! more than 64 ms away, then again until the deadline (two or three wake-ups per one-
//! second tick, measured with strace); the kernel's periodic timer wakes it once.
//!
//! Floor 10 (roof): part of the `run` loop.

use std::os::fd::OwnedFd;
use std::time::Duration;

use rustix::time::{Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec};
use tokio::io::unix::AsyncFd;
use tokio::time::Instant;

/// A periodic tick from a `CLOCK_MONOTONIC` timerfd (timerfd_create(2)), read through
/// tokio's I/O driver: one wake-up of the thread per tick.
#[derive(Debug)]
pub struct Ticker {
    fd: AsyncFd<OwnedFd>,
}

impl Ticker {
    /// A tick every `period` (at least 1 ms), the first one at once.
    ///
    /// # Errors
    /// The timerfd cannot be made or armed, or registered with tokio (outside a runtime).
    pub fn new(period: Duration) -> std::io::Result<Ticker> {
        let fd = rustix::time::timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        let period = period.max(Duration::from_millis(1));
        let spec = |d: Duration| Timespec {
            tv_sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(d.subsec_nanos()),
        };
        rustix::time::timerfd_settime(
            &fd,
            TimerfdTimerFlags::empty(),
            &Itimerspec {
                it_interval: spec(period),
                // Zero would disarm it: the first tick 1 ns from now.
                it_value: spec(Duration::from_nanos(1)),
            },
        )?;
        // SAFETY: the AsyncFd owns the OwnedFd: the descriptor stays open and the same
        // until the AsyncFd is dropped, and OwnedFd::as_raw_fd always returns it.
        #[allow(unsafe_code)]
        let fd = unsafe { AsyncFd::register(fd) }.map_err(std::io::Error::from)?;
        Ok(Ticker { fd })
    }

    /// Waits for the next tick (ticks missed meanwhile count as one) and returns the time.
    ///
    /// # Errors
    /// Reading the timerfd failed (not expected).
    pub async fn tick(&mut self) -> std::io::Result<Instant> {
        loop {
            let mut guard = self.fd.readable().await?;
            let mut expirations = [0u8; 8];
            match guard.try_io(|fd| Ok(rustix::io::read(fd.get_ref(), &mut expirations)?)) {
                Ok(Ok(_)) => return Ok(Instant::now()),
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Ok(Err(e)) => return Err(e),
                // Not readable after all: wait again.
                Err(_would_block) => continue,
            }
        }
    }
}

/// The desired-image check's times, the rollout's ([`crate::rollout::poll`]).
pub use crate::rollout::poll::UpgradePoll;

/// How the loop arms the rollout's poll ([`UpgradePoll`]) in its [`Schedule`].
pub trait ArmPoll {
    /// Arms the first check in `schedule`, at the drawn fraction of the interval after
    /// `start` (the daemon's start).
    fn arm_first(&self, schedule: &mut Schedule, start: Instant);
    /// The check came due at `now`: `true` to run it (disarmed until [`ArmPoll::checked`]),
    /// `false` when the first check moved later (the bound grew since it was armed; armed
    /// at its new time).
    fn due(&mut self, schedule: &mut Schedule, start: Instant, now: Instant) -> bool;
    /// A check ended at `now`: the next one a jittered interval later.
    fn checked(&mut self, schedule: &mut Schedule, now: Instant);
}

impl ArmPoll for UpgradePoll {
    fn arm_first(&self, schedule: &mut Schedule, start: Instant) {
        if let Some(at) = self.first_at(start) {
            schedule.arm(Job::Upgrade, at);
        }
    }

    fn due(&mut self, schedule: &mut Schedule, start: Instant, now: Instant) -> bool {
        schedule.disarm(Job::Upgrade);
        if let Some(at) = self.first_at(start) {
            if at > now {
                schedule.arm(Job::Upgrade, at);
                return false;
            }
            self.first_done();
        }
        true
    }

    fn checked(&mut self, schedule: &mut Schedule, now: Instant) {
        let wait = self.next_wait();
        schedule.arm(Job::Upgrade, now + wait);
    }
}

/// A periodic job of the daemon's main loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Job {
    /// `spot/instance-action` (`events.spot_interval`).
    Spot,
    /// Rebalance recommendation and the auto scaling target lifecycle state
    /// (`events.interval`).
    Notices,
    /// Scheduled maintenance events and their history (`events.maintenance_interval`).
    Maintenance,
    /// The end of the Capacity Block the instance runs in (`events.capacity_block_interval`).
    CapacityBlock,
    /// A look at the drain state, and a step of the drain when one is in progress
    /// (`drain.check_interval`).
    Progress,
    /// A health pass (`health.interval`).
    Health,
    /// The `[[mounts]]` (every 30 s).
    Mounts,
    /// `WATCHDOG=1` (half of systemd's `WatchdogSec`).
    Watchdog,
    /// The desired image (`upgrade.interval`, or the budget's wait; set by the loop).
    Upgrade,
    /// The orphan watch: this node's record in slurmctld (`[orphan]`, a tenth of its
    /// shorter window, 1 s to 60 s).
    Orphan,
}

impl Job {
    /// The calls to AWS APIs (not the instance metadata, which is local) one run of the
    /// job makes on an idle node: one whose running image is the desired one (a rollout
    /// adds EC2 DescribeImages, and Slurm's commands).
    pub fn idle_aws_calls(self) -> &'static [&'static str] {
        match self {
            Job::Upgrade => &["ssm:GetParameter"],
            // In a Capacity Block (outside one: none after the first lookup).
            Job::CapacityBlock => &["ec2:DescribeCapacityReservations"],
            Job::Spot
            | Job::Notices
            | Job::Maintenance
            | Job::Progress
            | Job::Health
            | Job::Mounts
            | Job::Watchdog
            | Job::Orphan => &[],
        }
    }

    /// The job's name in the schedule's description.
    pub fn name(self) -> &'static str {
        match self {
            Job::Spot => "spot interruption notice",
            Job::Notices => "rebalance recommendation and target lifecycle state",
            Job::Maintenance => "scheduled maintenance events",
            Job::CapacityBlock => "capacity block end",
            Job::Progress => "drain state",
            Job::Health => "health checks",
            Job::Mounts => "mounts",
            Job::Watchdog => "systemd watchdog",
            Job::Upgrade => "desired image",
            Job::Orphan => "orphan watch (slurmctld answers, this node's record)",
        }
    }
}

#[derive(Debug, Clone)]
struct Entry {
    job: Job,
    period: Duration,
    next: Instant,
    /// Off until [`Schedule::arm`]: a job the loop re-arms itself (the upgrade check,
    /// whose next time depends on what the last check said).
    armed: bool,
}

/// The jobs, their periods and their next times, served on one tick.
#[derive(Debug, Clone)]
pub struct Schedule {
    tick: Duration,
    entries: Vec<Entry>,
}

impl Schedule {
    /// A schedule whose jobs are first due at `start`. The tick is the shortest period
    /// (at least 1 ms); a zero period is read as 1 ms.
    pub fn new(start: Instant, jobs: &[(Job, Duration)]) -> Schedule {
        let entries: Vec<Entry> = jobs
            .iter()
            .map(|&(job, period)| Entry {
                job,
                period: period.max(Duration::from_millis(1)),
                next: start,
                armed: true,
            })
            .collect();
        let tick = entries
            .iter()
            .map(|e| e.period)
            .min()
            .unwrap_or(Duration::from_secs(1));
        Schedule { tick, entries }
    }

    /// The period of the one timer that serves every job.
    pub fn tick(&self) -> Duration {
        self.tick
    }

    /// The jobs due at `now`, each moved to its next time (whole periods after the last
    /// one, never in the past: a tick that came late does not make a job run twice).
    pub fn due(&mut self, now: Instant) -> Vec<Job> {
        let mut due = Vec::new();
        for e in self.entries.iter_mut().filter(|e| e.armed && e.next <= now) {
            due.push(e.job);
            e.next += e.period;
            if e.next <= now {
                e.next = now + e.period;
            }
        }
        due
    }

    /// Makes `job` next due at `at` (the first tick at or after it), and from then on every
    /// period; a job not in the schedule is ignored.
    pub fn arm(&mut self, job: Job, at: Instant) {
        if let Some(e) = self.entries.iter_mut().find(|e| e.job == job) {
            e.next = at;
            e.armed = true;
        }
    }

    /// The earliest time an armed job is due (a simulation's next event; the loop waits
    /// for ticks).
    pub fn next_due(&self) -> Option<Instant> {
        self.entries
            .iter()
            .filter(|e| e.armed)
            .map(|e| e.next)
            .min()
    }

    /// Keeps `job` from being due until [`Schedule::arm`].
    pub fn disarm(&mut self, job: Job) {
        if let Some(e) = self.entries.iter_mut().find(|e| e.job == job) {
            e.armed = false;
        }
    }

    /// One line per job: its name and period (`humantime`), the tick first; for the log
    /// at start and the noise benchmark (`scripts/bench-noise.sh`).
    pub fn describe(&self) -> Vec<String> {
        let h = |d: Duration| humantime::format_duration(d).to_string();
        let mut lines = vec![format!("tick every {}", h(self.tick))];
        for e in &self.entries {
            lines.push(format!("{} every {}", e.job.name(), h(e.period)));
        }
        lines
    }
}

#[cfg(test)]
pub(super) mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A bound of `nodes` nodes.
    pub(in crate::daemon) fn bound(nodes: u64) -> Option<crate::slurm::NodeBound> {
        Some(crate::slurm::NodeBound {
            nodes,
            source: format!("{nodes} nodes declared (test)"),
        })
    }

    /// The times (seconds after `start`) of every desired-image check of one node started
    /// at `start`, until `horizon`, through the daemon's own [`Schedule`] and
    /// [`UpgradePoll`] (checks take no time; the tick's rounding, at most one tick, is
    /// left out: the simulation jumps to each due time).
    pub(in crate::daemon) fn check_times(
        mut poll: UpgradePoll,
        start: Instant,
        horizon: Duration,
    ) -> Vec<f64> {
        let mut s = Schedule::new(start, &[(Job::Upgrade, poll.interval())]);
        poll.arm_first(&mut s, start);
        let mut times = Vec::new();
        while let Some(now) = s.next_due().filter(|t| *t <= start + horizon) {
            for job in s.due(now) {
                assert_eq!(job, Job::Upgrade);
                if poll.due(&mut s, start, now) {
                    times.push((now - start).as_secs_f64());
                    poll.checked(&mut s, now);
                }
            }
        }
        times
    }

    #[test]
    fn the_interval_grows_with_the_cluster_to_keep_the_fleet_under_a_quarter_of_ssms_quota() {
        let s = crate::upgrade::UpgradeSettings::default();
        let mut p = UpgradePoll::seeded(&s, 1);
        // No slurm.conf yet: upgrade.interval.
        assert_eq!(p.interval(), s.interval.0);
        // One node: a published image reaches it within 15 minutes, jitter included.
        p.set_bound(bound(1));
        assert!(
            p.interval().mul_f64(UpgradePoll::JITTER.1) <= secs(900),
            "{:?}",
            p.interval()
        );
        // 10,000 declared nodes: under 25 % of SSM's 40 TPS, whatever the jitter draws.
        assert!(p.set_bound(bound(10_000)));
        assert!(!p.set_bound(bound(10_000)));
        let fleet_tps = 10_000.0 / p.interval().mul_f64(UpgradePoll::JITTER.0).as_secs_f64();
        assert!(fleet_tps < 0.25 * 40.0, "{fleet_tps} calls a second");
        assert_eq!(p.interval(), secs(2500));
        for _ in 0..1000 {
            let w = p.next_wait();
            assert!(w >= secs(2000) && w <= secs(3000), "{w:?}");
        }
        // A huge bound or a tiny rate: at most a day.
        let mut tiny = s.clone();
        tiny.fleet_rate = 1e-9;
        let mut p = UpgradePoll::seeded(&tiny, 1);
        p.set_bound(bound(u64::MAX));
        assert_eq!(p.interval(), UpgradePoll::MAX_INTERVAL);
        assert!(
            p.describe().contains("upgrade.fleet_rate"),
            "{}",
            p.describe()
        );
    }

    /// A rollout's budget retries stay within twice `fleet_rate` for the whole cluster at
    /// 10,000 nodes (under a quarter of SSM's 40 TPS); a small cluster keeps
    /// `upgrade.budget_wait`.
    #[test]
    fn budget_retries_are_paced_by_the_cluster_too() {
        // A try of a waiting node reads slurmctld's reservations alone: paced so that the
        // whole cluster makes at most twice SLOT_READS_PER_SECOND of them (the jitter's
        // low end), whatever its size; a small cluster tries at budget_wait.
        let s = crate::upgrade::UpgradeSettings::default();
        let mut p = UpgradePoll::seeded(&s, 1);
        p.set_bound(bound(8));
        for _ in 0..200 {
            let w = p.retry_wait(s.budget_wait.0);
            assert!(
                w >= s.budget_wait.0 / 2 && w <= s.budget_wait.0 * 3 / 2,
                "{w:?}"
            );
        }
        for nodes in [10_000, 100_000] {
            p.set_bound(bound(nodes));
            for _ in 0..200 {
                let w = p.retry_wait(s.budget_wait.0);
                #[allow(clippy::cast_precision_loss)]
                let reads = nodes as f64 / w.as_secs_f64();
                assert!(
                    reads <= 2.0 * UpgradePoll::SLOT_READS_PER_SECOND + 1e-9,
                    "{nodes} nodes, {w:?}: {reads}/s"
                );
            }
        }
    }

    #[test]
    fn a_fleet_started_at_once_spreads_and_stays_spread() {
        let s = crate::upgrade::UpgradeSettings::default();
        let t0 = Instant::now();
        let mut fifth = Vec::new();
        for seed in 0..1000 {
            let mut p = UpgradePoll::seeded(&s, seed);
            p.set_bound(bound(1000));
            let times = check_times(p, t0, secs(6 * 3600));
            assert!(times.len() >= 20, "node {seed}: {} checks", times.len());
            fifth.push(times[4]);
            // Every gap within the jitter: never two checks in a row, never a long silence.
            for w in times.windows(2) {
                assert!((480.0..=720.0).contains(&(w[1] - w[0])), "{w:?}");
            }
        }
        // The 5th checks of 1,000 nodes started at the same instant: no second holds more
        // than 2 % of them (all at once was the fixed interval's way).
        let mut per_second = std::collections::HashMap::new();
        for t in &fifth {
            *per_second.entry(t.floor() as u64).or_insert(0) += 1;
        }
        let busiest = per_second.values().max().copied().unwrap_or(0);
        assert!(
            busiest <= 20,
            "{busiest} of 1000 fifth checks in one second"
        );
        let (lo, hi) = fifth
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), t| (lo.min(*t), hi.max(*t)));
        assert!(hi - lo > 600.0, "fifth checks between {lo} and {hi} s");
    }

    #[test]
    fn the_first_check_moves_later_when_a_larger_bound_appears() {
        let s = crate::upgrade::UpgradeSettings::default();
        let t0 = Instant::now();
        let mut p = UpgradePoll::seeded(&s, 7);
        let mut sched = Schedule::new(t0, &[(Job::Spot, secs(1)), (Job::Upgrade, p.interval())]);
        p.arm_first(&mut sched, t0);
        let first = sched.next_due().unwrap();
        let due_at = sched
            .entries
            .iter()
            .find(|e| e.job == Job::Upgrade)
            .map(|e| e.next)
            .unwrap();
        assert!(due_at >= first && due_at < t0 + s.interval.0);
        let fraction = (due_at - t0).as_secs_f64() / s.interval.0.as_secs_f64();
        // slurmd fetched its configuration meanwhile: 10,000 nodes.
        assert!(p.first_pending());
        p.set_bound(bound(10_000));
        assert!(!p.due(&mut sched, t0, due_at));
        let moved = sched
            .entries
            .iter()
            .find(|e| e.job == Job::Upgrade)
            .map(|e| e.next)
            .unwrap();
        let expected = 2500.0 * fraction;
        assert!(
            ((moved - t0).as_secs_f64() - expected).abs() < 0.01,
            "{moved:?}"
        );
        assert!(p.due(&mut sched, t0, moved));
        assert!(!p.first_pending());
        // Disarmed until the check ends.
        assert!(!sched.due(moved + secs(1)).contains(&Job::Upgrade));
        p.checked(&mut sched, moved + secs(1));
        assert!(sched.due(moved + secs(3100)).contains(&Job::Upgrade));
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn the_tick_is_the_shortest_period_and_longer_jobs_ride_on_it() {
        let t0 = Instant::now();
        let mut s = Schedule::new(
            t0,
            &[
                (Job::Spot, secs(1)),
                (Job::Notices, secs(30)),
                (Job::Watchdog, secs(30)),
                (Job::Health, secs(60)),
            ],
        );
        assert_eq!(s.tick(), secs(1));
        // Everything is due at the start.
        assert_eq!(s.due(t0).len(), 4);
        let mut counts = std::collections::HashMap::new();
        let mut wakeups_with_work = 0;
        for k in 1..=120 {
            let d = s.due(t0 + secs(k));
            if !d.is_empty() {
                wakeups_with_work += 1;
            }
            for j in d {
                *counts.entry(j).or_insert(0) += 1;
            }
        }
        assert_eq!(counts[&Job::Spot], 120);
        assert_eq!(counts[&Job::Notices], 4);
        assert_eq!(counts[&Job::Watchdog], 4);
        assert_eq!(counts[&Job::Health], 2);
        // Every job rides on a spot tick: no wake-up serves a lone slow job.
        assert_eq!(wakeups_with_work, 120);
    }

    #[test]
    fn a_late_tick_runs_a_job_once_and_keeps_its_period_from_then() {
        let t0 = Instant::now();
        let mut s = Schedule::new(t0, &[(Job::Spot, secs(1)), (Job::Health, secs(10))]);
        s.due(t0);
        // The loop was held up for 35 s: Health runs once, then 10 s later.
        assert_eq!(s.due(t0 + secs(35)), vec![Job::Spot, Job::Health]);
        assert_eq!(s.due(t0 + secs(44)), vec![Job::Spot]);
        assert_eq!(s.due(t0 + secs(45)), vec![Job::Spot, Job::Health]);
    }

    #[test]
    fn a_disarmed_job_waits_for_its_arm_and_is_due_at_the_first_tick_after() {
        let t0 = Instant::now();
        let mut s = Schedule::new(t0, &[(Job::Spot, secs(1)), (Job::Upgrade, secs(300))]);
        assert_eq!(s.due(t0), vec![Job::Spot, Job::Upgrade]);
        s.disarm(Job::Upgrade);
        for k in 1..=400 {
            assert_eq!(s.due(t0 + secs(k)), vec![Job::Spot], "tick {k}");
        }
        s.arm(Job::Upgrade, t0 + Duration::from_millis(400_500));
        assert_eq!(s.due(t0 + secs(401)), vec![Job::Spot, Job::Upgrade]);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_ticker_ticks_at_once_then_every_period() {
        let mut t = Ticker::new(Duration::from_millis(20)).unwrap();
        t.tick().await.unwrap();
        let start = std::time::Instant::now();
        for _ in 0..3 {
            t.tick().await.unwrap();
        }
        // Three more periods: never sooner (a timerfd does not fire early).
        assert!(
            start.elapsed() >= Duration::from_millis(40),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn the_description_names_each_job_and_its_period() {
        let s = Schedule::new(
            Instant::now(),
            &[(Job::Spot, secs(1)), (Job::Maintenance, secs(300))],
        );
        assert_eq!(
            s.describe(),
            vec![
                "tick every 1s",
                "spot interruption notice every 1s",
                "scheduled maintenance events every 5m"
            ]
        );
    }
}
