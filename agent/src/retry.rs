//! Capped exponential backoff with full jitter, for calls to outside systems that may not be
//! ready yet (the controller during boot, a mount, IMDS); and what an AWS API's throttling
//! looks like ([`is_throttling`]) and which request-rate quota it hit ([`quota_of`]), for
//! the boot-time AWS calls a whole fleet makes at once (issue 25 §1).
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

/// Whether an AWS error code says the caller may not make the call: `AccessDenied` (S3,
/// Auto Scaling's query protocol), `AccessDeniedException` (JSON protocols: SSM, Secrets
/// Manager, PCS), `UnauthorizedOperation` (EC2). Credentials that are refused outright
/// (`AuthFailure`, `UnrecognizedClientException`) are the caller's to add where they mean
/// the same to it.
pub fn is_access_denied(code: Option<&str>) -> bool {
    matches!(
        code,
        Some("AccessDenied" | "AccessDeniedException" | "UnauthorizedOperation")
    )
}

/// Whether an AWS error code (or, for an answer without one, the HTTP status) says the
/// request was throttled: the codes aws-smithy's retry classifier takes as throttling
/// (`aws-runtime`'s `THROTTLING_ERRORS`), S3's `SlowDown` (503) and HTTP 429.
pub fn is_throttling(code: Option<&str>, status: Option<u16>) -> bool {
    match code {
        Some(c) => matches!(
            c,
            "Throttling"
                | "ThrottlingException"
                | "ThrottledException"
                | "RequestThrottledException"
                | "TooManyRequestsException"
                | "ProvisionedThroughputExceededException"
                | "TransactionInProgressException"
                | "RequestLimitExceeded"
                | "BandwidthLimitExceeded"
                | "LimitExceededException"
                | "RequestThrottled"
                | "SlowDown"
                | "PriorRequestNotComplete"
                | "EC2ThrottledException"
        ),
        None => status == Some(429),
    }
}

/// The request-rate quota an API (`<service>:<operation>`, IAM's spelling) is held to by
/// default, as AWS documents it, for the log line and the error of a throttled call.
pub fn quota_of(api: &str) -> &'static str {
    match api {
        "ssm:GetParameter" | "ssm:GetParameters" | "ssm:GetParametersByPath" => {
            "Parameter Store: 40 TPS standard throughput, shared by GetParameter, GetParameters \
             and GetParametersByPath; 3,000 with higher throughput"
        }
        "secretsmanager:GetSecretValue" => "Secrets Manager GetSecretValue: 10,000 TPS",
        "s3:GetObject" => "S3: 5,500 GET/HEAD requests per second per prefix",
        "pcs:RegisterComputeNodeGroupInstance" => {
            "PCS RegisterComputeNodeGroupInstance: the account's request rate (no published quota)"
        }
        _ => "the API's request rate quota",
    }
}

/// How a call that AWS throttles is tried again: waits drawn uniformly from `[0, spread]`
/// (full jitter, without growth: the spread is sized for the fleet, see
/// `auth.throttle_spread`) until `window` has passed since the first attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThrottlePolicy {
    /// Longest wait after a throttled attempt.
    pub spread: Duration,
    /// How long to keep trying, from the first attempt.
    pub window: Duration,
}

impl ThrottlePolicy {
    /// A wait after a throttled attempt, at most `left`.
    pub fn delay(&self, left: Duration) -> Duration {
        Backoff {
            base: self.spread,
            cap: self.spread,
        }
        .delay(0)
        .min(left)
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

    #[test]
    fn throttling_by_code_or_status() {
        assert!(is_throttling(Some("ThrottlingException"), Some(400)));
        assert!(is_throttling(Some("SlowDown"), Some(503)));
        assert!(is_throttling(None, Some(429)));
        assert!(!is_throttling(Some("ParameterNotFound"), Some(400)));
        assert!(!is_throttling(None, Some(503)));
        assert!(quota_of("ssm:GetParameter").contains("40 TPS"));
        let p = ThrottlePolicy {
            spread: Duration::from_secs(20),
            window: Duration::from_secs(60),
        };
        for _ in 0..50 {
            assert!(p.delay(Duration::from_secs(30)) <= Duration::from_secs(20));
            assert!(p.delay(Duration::from_secs(1)) <= Duration::from_secs(1));
        }
    }
}
