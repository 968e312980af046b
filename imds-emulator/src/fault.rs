//! Fault injection: error statuses, delays and dropped connections, for the token PUT,
//! for metadata GETs, or both, for the next N requests or until cleared.
//!
//! Faults are kept in the order they were injected. For each request, every matching
//! fault is consulted in that order: a delay waits and goes on to the next one, a status
//! or a drop ends the request. Each fault consulted for a request counts one use; a fault
//! with a count is removed once used up.

use std::time::Duration;

use serde::Deserialize;

/// What an injected fault does to a request it applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// Answer with this HTTP status (401, 403, 429, 500, 503, ...) and IMDS's error page
    /// for it. A code outside 100..=999 is answered as 500.
    Status(u16),
    /// Wait this long, then go on (to the next fault, or to the normal answer).
    Delay(Duration),
    /// Close the connection without writing a response.
    Drop,
}

/// Which requests a fault applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FaultTarget {
    /// `/latest/api/token` requests only.
    Token,
    /// Every other request under the metadata service (GETs of `/latest/...`, `/`).
    Get,
    /// Both.
    #[default]
    All,
}

impl FaultTarget {
    pub(crate) fn matches(self, is_token_request: bool) -> bool {
        match self {
            FaultTarget::Token => is_token_request,
            FaultTarget::Get => !is_token_request,
            FaultTarget::All => true,
        }
    }
}

/// A fault to inject with [`crate::Emulator::inject`].
///
/// Build one with [`Fault::status`], [`Fault::delay`] or [`Fault::drop_connection`],
/// then narrow it with [`Fault::on`] and [`Fault::times`]:
///
/// ```
/// use imds_emulator::{Fault, FaultTarget};
/// let f = Fault::status(503).on(FaultTarget::Token).times(2);
/// assert_eq!(f.count, Some(2));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// What happens to a matching request.
    pub kind: FaultKind,
    /// Which requests match.
    pub target: FaultTarget,
    /// How many matching requests it applies to; `None` means until cleared.
    pub count: Option<u32>,
}

impl Fault {
    /// Answer matching requests with `code` (for all requests, until cleared).
    pub fn status(code: u16) -> Fault {
        Fault::new(FaultKind::Status(code))
    }

    /// Delay matching requests by `delay` before answering them.
    pub fn delay(delay: Duration) -> Fault {
        Fault::new(FaultKind::Delay(delay))
    }

    /// Close the connection of matching requests without a response.
    pub fn drop_connection() -> Fault {
        Fault::new(FaultKind::Drop)
    }

    /// Restricts the fault to the token PUT, to GETs, or applies it to both.
    pub fn on(self, target: FaultTarget) -> Fault {
        Fault { target, ..self }
    }

    /// Applies the fault to the next `n` matching requests only.
    pub fn times(self, n: u32) -> Fault {
        Fault {
            count: Some(n),
            ..self
        }
    }

    fn new(kind: FaultKind) -> Fault {
        Fault {
            kind,
            target: FaultTarget::All,
            count: None,
        }
    }
}

/// The JSON form of a fault, as posted to `/__emulator/fault`: exactly one of `status`,
/// `delay_ms` or `drop: true`, optionally `on` (`token`, `get`, `all`) and `count`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FaultSpec {
    status: Option<u16>,
    delay_ms: Option<u64>,
    #[serde(default)]
    drop: bool,
    #[serde(default)]
    on: FaultTarget,
    count: Option<u32>,
}

impl TryFrom<FaultSpec> for Fault {
    type Error = String;

    fn try_from(spec: FaultSpec) -> Result<Fault, String> {
        let kind = match (spec.status, spec.delay_ms, spec.drop) {
            (Some(code), None, false) if (100..=999).contains(&code) => FaultKind::Status(code),
            (Some(code), None, false) => return Err(format!("status {code} is not 100..=999")),
            (None, Some(ms), false) => FaultKind::Delay(Duration::from_millis(ms)),
            (None, None, true) => FaultKind::Drop,
            _ => return Err("give exactly one of \"status\", \"delay_ms\", \"drop\": true".into()),
        };
        Ok(Fault {
            kind,
            target: spec.on,
            count: spec.count,
        })
    }
}

/// The injected faults, in injection order.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    active: Vec<Fault>,
}

impl Faults {
    pub(crate) fn push(&mut self, fault: Fault) {
        if fault.count != Some(0) {
            self.active.push(fault);
        }
    }

    pub(crate) fn clear(&mut self) {
        self.active.clear();
    }

    /// Takes the faults that apply to one request, counting one use of each: the delays
    /// up to and including the first status or drop.
    pub(crate) fn take_for(&mut self, is_token_request: bool) -> Vec<FaultKind> {
        let mut taken = Vec::new();
        for fault in self.active.iter_mut() {
            if !fault.target.matches(is_token_request) {
                continue;
            }
            taken.push(fault.kind);
            if let Some(n) = fault.count.as_mut() {
                *n = n.saturating_sub(1);
            }
            if !matches!(fault.kind, FaultKind::Delay(_)) {
                break;
            }
        }
        self.active.retain(|f| f.count != Some(0));
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_run_out_and_delays_stack_before_a_status() {
        let mut faults = Faults::default();
        faults.push(Fault::delay(Duration::from_millis(5)).times(1));
        faults.push(Fault::status(503).on(FaultTarget::Token).times(2));
        faults.push(Fault::status(500).on(FaultTarget::Get));
        assert_eq!(
            faults.take_for(true),
            vec![
                FaultKind::Delay(Duration::from_millis(5)),
                FaultKind::Status(503)
            ]
        );
        assert_eq!(faults.take_for(true), vec![FaultKind::Status(503)]);
        assert_eq!(faults.take_for(true), vec![]);
        assert_eq!(faults.take_for(false), vec![FaultKind::Status(500)]);
        assert_eq!(faults.take_for(false), vec![FaultKind::Status(500)]);
    }

    #[test]
    fn spec_needs_exactly_one_kind() {
        let parse = |s: &str| -> Result<Fault, String> {
            Fault::try_from(serde_json::from_str::<FaultSpec>(s).map_err(|e| e.to_string())?)
        };
        assert_eq!(
            parse(r#"{"status": 429, "on": "get", "count": 1}"#),
            Ok(Fault::status(429).on(FaultTarget::Get).times(1))
        );
        assert_eq!(parse(r#"{"drop": true}"#), Ok(Fault::drop_connection()));
        assert!(parse(r#"{"status": 500, "drop": true}"#).is_err());
        assert!(parse(r#"{}"#).is_err());
        assert!(parse(r#"{"status": 42}"#).is_err());
        assert!(parse(r#"{"delay": 5}"#).is_err());
    }
}
