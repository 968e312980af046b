//! When a node asks for the desired image: the rollout's poll, spread over the fleet and
//! bounded by SSM's quota. The daemon's loop schedules the check at the times this gives.

use std::time::Duration;

use tokio::time::Instant;

/// The desired-image check's times: the one periodic call of an idle node's daemon to an
/// AWS API (SSM GetParameter; the other jobs read the instance metadata, which is local,
/// or ask slurmctld).
///
/// Each node checks every `I = max(upgrade.interval, nodes / upgrade.fleet_rate)`, `nodes`
/// being the cluster's size bound from the slurm.conf the node reads
/// ([`crate::slurm::node_bound`]; none: `upgrade.interval`), so the whole cluster makes
/// about `fleet_rate` calls a second however large it grows, and a small one still sees a
/// new image within `1.2 * upgrade.interval`. The first check comes at a random point of
/// the first interval (a fraction drawn once, of the interval the bound gives when the
/// check comes due: a bound that appears later, once slurmd has fetched its
/// configuration, moves it), each next one `I` times a random factor in
/// [`UpgradePoll::JITTER`] after the last ended: a fleet launched at once spreads over the
/// first interval, and the independent factors keep it spread.
#[derive(Debug)]
pub struct UpgradePoll {
    every: Duration,
    fleet_rate: f64,
    rng: rand::rngs::StdRng,
    /// The fraction of the first interval at which the first check comes; `None` once
    /// it ran.
    first: Option<f64>,
    bound: Option<crate::slurm::NodeBound>,
}

impl UpgradePoll {
    /// The factor each interval is multiplied by, drawn uniformly: ±20 %, so a node's gap
    /// stays within 1.2 intervals (12 min at the default 10 min, under the 15 min a
    /// published image may take to reach the first node's drain).
    pub const JITTER: (f64, f64) = (0.8, 1.2);

    /// The longest interval, however large the bound: a day.
    pub const MAX_INTERVAL: Duration = Duration::from_secs(86_400);

    /// For `upgrade.interval` and `upgrade.fleet_rate`, drawing from the operating system's
    /// randomness.
    pub fn new(s: &crate::upgrade::UpgradeSettings) -> UpgradePoll {
        UpgradePoll::with_rng(s, rand::SeedableRng::from_os_rng())
    }

    /// The same with a fixed seed: the same times every run (tests, benchmarks).
    pub fn seeded(s: &crate::upgrade::UpgradeSettings, seed: u64) -> UpgradePoll {
        UpgradePoll::with_rng(s, rand::SeedableRng::seed_from_u64(seed))
    }

    fn with_rng(s: &crate::upgrade::UpgradeSettings, mut rng: rand::rngs::StdRng) -> UpgradePoll {
        let first = rand::Rng::random_range(&mut rng, 0.0..1.0);
        UpgradePoll {
            every: s.interval.0,
            fleet_rate: s.fleet_rate,
            rng,
            first: Some(first),
            bound: None,
        }
    }

    /// Takes the cluster's size bound read now; `true` when it differs from the last.
    pub fn set_bound(&mut self, bound: Option<crate::slurm::NodeBound>) -> bool {
        let changed = bound != self.bound;
        self.bound = bound;
        changed
    }

    /// Whether the first check has not run yet.
    pub fn first_pending(&self) -> bool {
        self.first.is_some()
    }

    /// The mean interval between one node's checks for the bound it holds.
    pub fn interval(&self) -> Duration {
        self.every
            .max(self.fleet_interval())
            .min(UpgradePoll::MAX_INTERVAL.max(self.every))
    }

    /// The bound over `upgrade.fleet_rate`, at most [`Self::MAX_INTERVAL`]: the interval at
    /// which the whole cluster makes `fleet_rate` calls a second.
    fn fleet_interval(&self) -> Duration {
        self.paced(self.fleet_rate)
    }

    /// The bound over `per_second`, at most [`Self::MAX_INTERVAL`]: the interval at which
    /// the whole cluster makes `per_second` calls a second.
    fn paced(&self, per_second: f64) -> Duration {
        let nodes = self.bound.as_ref().map_or(0, |b| b.nodes);
        // u64 -> f64 is exact below 2^53 nodes.
        #[allow(clippy::cast_precision_loss)]
        Duration::try_from_secs_f64(nodes as f64 / per_second)
            .unwrap_or(UpgradePoll::MAX_INTERVAL)
            .min(UpgradePoll::MAX_INTERVAL)
    }

    /// What the log says at start: the interval and where it came from.
    pub fn describe(&self) -> String {
        let h = |d: Duration| humantime::format_duration(Duration::from_secs(d.as_secs()));
        match &self.bound {
            Some(b) => format!(
                "desired image every {} ±20 % per node: max(upgrade.interval {}, {} nodes / upgrade.fleet_rate {}/s); nodes: {}",
                h(self.interval()),
                h(self.every),
                b.nodes,
                self.fleet_rate,
                b.source
            ),
            None => format!(
                "desired image every {} ±20 % per node (upgrade.interval; no slurm.conf to size the cluster by yet)",
                h(self.interval())
            ),
        }
    }

    /// When the first check comes: the drawn fraction of the interval after `start` (the
    /// daemon's start); `None` once the first check ran.
    pub fn first_at(&self, start: Instant) -> Option<Instant> {
        self.first.map(|f| start + self.interval().mul_f64(f))
    }

    /// The first check ran (or is no longer first).
    pub fn first_done(&mut self) {
        self.first = None;
    }

    /// The most reads of slurmctld's reservations a second, the whole cluster together,
    /// that the nodes waiting for a budget slot make: each try of a waiting node is one
    /// `scontrol show reservation` (a short list: the slots and the site's reservations),
    /// and only a node that finds a free slot makes the full check (SSM, EC2, every
    /// node's record).
    pub const SLOT_READS_PER_SECOND: f64 = 50.0;

    /// The wait before a node that found the upgrade budget used up tries again:
    /// `upgrade.budget_wait`, or the cluster's size bound over
    /// [`Self::SLOT_READS_PER_SECOND`] when that is longer, jittered ±50 %
    /// ([`crate::upgrade::jittered`]). A try reads the slots alone (no AWS call), so it
    /// is paced for slurmctld, not for SSM's quota: at 10,000 nodes every waiting node
    /// tries every 200 s at most (50 reads a second); a cluster of 150 or fewer at
    /// `budget_wait`. The desired image is read again at the poll's interval.
    pub fn retry_wait(&self, budget_wait: Duration) -> Duration {
        crate::upgrade::jittered(budget_wait.max(self.paced(Self::SLOT_READS_PER_SECOND)))
    }

    /// The wait until the next check: the interval times a factor drawn from
    /// [`Self::JITTER`].
    pub fn next_wait(&mut self) -> Duration {
        let (lo, hi) = UpgradePoll::JITTER;
        let f = rand::Rng::random_range(&mut self.rng, lo..hi);
        self.interval().mul_f64(f)
    }
}
