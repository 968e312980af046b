//! Capped exponential backoff with full jitter, for calls to outside systems that may not be
//! ready yet (the controller during boot, a mount, IMDS).
//!
//! Floor 0 (ground): uses no other module of the crate.

use std::time::Duration;

/// A backoff policy: the n-th wait is a uniform random duration in `[0, min(cap, base * 2^n)]`
/// ("full jitter", as in the AWS Architecture Blog's "Exponential Backoff And Jitter").
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// First wait's upper bound.
    pub base: Duration,
    /// Upper bound of every wait.
    pub cap: Duration,
}

impl Backoff {
    /// Joining the controller: slurmd registers in about 0.1 s when all is well, so start
    /// small; a controller that is still booting takes tens of seconds, so cap at 5 s to
    /// notice it soon without hammering it.
    pub const CONTROLLER: Backoff = Backoff {
        base: Duration::from_millis(100),
        cap: Duration::from_secs(5),
    };

    /// Upper bound of the wait before attempt `attempt` (0-based), without jitter.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(20)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The jittered wait before attempt `attempt` (0-based).
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self.ceiling(attempt);
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(rand::random_range(0..=nanos))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_then_stay_under_the_cap() {
        let b = Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(2),
        };
        assert_eq!(b.ceiling(0), Duration::from_millis(100));
        assert_eq!(b.ceiling(3), Duration::from_millis(800));
        assert_eq!(b.ceiling(10), Duration::from_secs(2));
        assert_eq!(b.ceiling(400), Duration::from_secs(2));
        for attempt in 0..50 {
            assert!(b.delay(attempt) <= b.ceiling(attempt));
        }
    }
}
