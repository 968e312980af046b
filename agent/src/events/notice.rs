//! Parsers of the IMDS notice documents. Each takes the body as served and returns a typed
//! notice, or a [`NoticeError`] naming the path and what is wrong.
//!
//! Shapes (AWS EC2 User Guide, "Spot Instance interruption notices", "Rebalance
//! recommendations", "Scheduled events", "Auto Scaling target lifecycle state"):
//! - `spot/instance-action`: `{"action": "terminate"|"stop"|"hibernate", "time": "<RFC 3339>"}`
//! - `events/recommendations/rebalance`: `{"noticeTime": "<RFC 3339>"}`
//! - `events/maintenance/scheduled`: `[{"NotBefore": "21 Jan 2019 09:00:43 GMT", "Code":
//!   "system-reboot", "Description": "...", "EventId": "instance-event-...", "NotAfter":
//!   "...", "State": "active"|"canceled"|"completed"}]`; `NotAfter` may be empty.
//! - `events/maintenance/history`: the same array, for the events EC2 moved out of
//!   `scheduled` once they were completed or canceled (AWS EC2 User Guide, "Scheduled
//!   events for your instances", "view event history ... using instance metadata"); 404
//!   while there are none.
//! - `autoscaling/target-lifecycle-state`: plain text, e.g. `InService`, `Terminated`.

use serde::{Deserialize, Serialize};

use crate::time;

/// IMDS path of the spot interruption notice (under `/latest/meta-data/`).
pub const SPOT_PATH: &str = "/latest/meta-data/spot/instance-action";
/// IMDS path of the rebalance recommendation.
pub const REBALANCE_PATH: &str = "/latest/meta-data/events/recommendations/rebalance";
/// IMDS path of the scheduled maintenance events.
pub const MAINTENANCE_PATH: &str = "/latest/meta-data/events/maintenance/scheduled";
/// IMDS path of the completed and canceled maintenance events.
pub const MAINTENANCE_HISTORY_PATH: &str = "/latest/meta-data/events/maintenance/history";
/// IMDS path of the Auto Scaling target lifecycle state.
pub const LIFECYCLE_PATH: &str = "/latest/meta-data/autoscaling/target-lifecycle-state";

/// A notice body that cannot be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("instance metadata {path}: {message}")]
pub struct NoticeError {
    /// IMDS path.
    pub path: &'static str,
    /// What is wrong (JSON error with line/column, missing field, bad time...).
    pub message: String,
}

/// What a spot interruption will do to the instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpotAction {
    /// The instance is terminated.
    Terminate,
    /// The instance is stopped.
    Stop,
    /// The instance is hibernated.
    Hibernate,
    /// An action this agent does not know; treated like `terminate`.
    Other(String),
}

impl SpotAction {
    fn parse(s: &str) -> SpotAction {
        match s.trim().to_ascii_lowercase().as_str() {
            "terminate" => SpotAction::Terminate,
            "stop" => SpotAction::Stop,
            "hibernate" => SpotAction::Hibernate,
            _ => SpotAction::Other(s.trim().to_string()),
        }
    }

    /// As IMDS writes it.
    pub fn as_str(&self) -> &str {
        match self {
            SpotAction::Terminate => "terminate",
            SpotAction::Stop => "stop",
            SpotAction::Hibernate => "hibernate",
            SpotAction::Other(s) => s,
        }
    }
}

/// A spot interruption notice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpotNotice {
    /// What will happen.
    pub action: SpotAction,
    /// When, in Unix seconds.
    pub time: i64,
}

#[derive(Deserialize)]
struct SpotDoc {
    action: String,
    time: String,
}

/// Parses `spot/instance-action`.
///
/// # Errors
/// [`NoticeError`]: not JSON, truncated, a field missing or empty, or a bad time.
pub fn parse_spot(body: &str) -> Result<SpotNotice, NoticeError> {
    let err = |message: String| NoticeError {
        path: SPOT_PATH,
        message,
    };
    let doc: SpotDoc = serde_json::from_str(body).map_err(|e| err(e.to_string()))?;
    if doc.action.trim().is_empty() {
        return Err(err("field `action` is empty".into()));
    }
    let time = time::parse(&doc.time).map_err(|e| err(format!("field `time`: {e}")))?;
    Ok(SpotNotice {
        action: SpotAction::parse(&doc.action),
        time,
    })
}

/// A rebalance recommendation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebalanceNotice {
    /// When it was issued, in Unix seconds.
    pub notice_time: i64,
}

#[derive(Deserialize)]
struct RebalanceDoc {
    #[serde(rename = "noticeTime")]
    notice_time: String,
}

/// Parses `events/recommendations/rebalance`.
///
/// # Errors
/// [`NoticeError`].
pub fn parse_rebalance(body: &str) -> Result<RebalanceNotice, NoticeError> {
    let err = |message: String| NoticeError {
        path: REBALANCE_PATH,
        message,
    };
    let doc: RebalanceDoc = serde_json::from_str(body).map_err(|e| err(e.to_string()))?;
    let notice_time =
        time::parse(&doc.notice_time).map_err(|e| err(format!("field `noticeTime`: {e}")))?;
    Ok(RebalanceNotice { notice_time })
}

/// State of a scheduled event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventState {
    /// Scheduled or in progress.
    Active,
    /// Canceled by AWS.
    Canceled,
    /// Done.
    Completed,
    /// A state this agent does not know; treated like `active` (draining is the safe side).
    Other(String),
}

/// One scheduled maintenance event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaintenanceEvent {
    /// `instance-event-0d59937288b749b32`.
    pub event_id: String,
    /// `instance-reboot`, `system-reboot`, `system-maintenance`, `instance-retirement`,
    /// `instance-stop`, or another code (kept as given).
    pub code: String,
    /// Human text from AWS.
    pub description: String,
    /// Start of the window, Unix seconds. `None` when the field was missing or unreadable:
    /// such an event counts as due now.
    pub not_before: Option<i64>,
    /// End of the window; `None` when empty.
    pub not_after: Option<i64>,
    /// State.
    pub state: EventState,
}

#[derive(Deserialize)]
struct EventDoc {
    #[serde(rename = "EventId", default)]
    event_id: String,
    #[serde(rename = "Code", default)]
    code: String,
    #[serde(rename = "Description", default)]
    description: String,
    #[serde(rename = "NotBefore", default)]
    not_before: String,
    #[serde(rename = "NotAfter", default)]
    not_after: String,
    #[serde(rename = "State", default)]
    state: String,
}

/// The events of `events/maintenance/scheduled`, and one message per field that could not be
/// read (the event is kept, on the safe side: an unreadable `NotBefore` is due now).
///
/// An empty body is no events.
///
/// # Errors
/// [`NoticeError`] when the document is not a JSON array of objects, or an event has no
/// `EventId` (it could not be followed to its cancellation).
pub fn parse_maintenance(body: &str) -> Result<(Vec<MaintenanceEvent>, Vec<String>), NoticeError> {
    parse_events_at(MAINTENANCE_PATH, body)
}

/// The events of `events/maintenance/history` (completed and canceled events, the same
/// shape as [`parse_maintenance`]'s), and one message per field that could not be read.
///
/// # Errors
/// [`NoticeError`] naming [`MAINTENANCE_HISTORY_PATH`], as for [`parse_maintenance`].
pub fn parse_maintenance_history(
    body: &str,
) -> Result<(Vec<MaintenanceEvent>, Vec<String>), NoticeError> {
    parse_events_at(MAINTENANCE_HISTORY_PATH, body)
}

/// Maintenance event codes whose event takes the instance down (a reboot, a stop, a
/// retirement): once such an event is over the node's slurmd has started again, and the
/// drain is lifted only after it registered (AWS EC2 User Guide, "Scheduled events for your
/// instances": instance-reboot, system-reboot, instance-stop, instance-retirement;
/// `system-maintenance` keeps the instance running).
pub fn takes_instance_down(code: &str) -> bool {
    matches!(
        code.trim(),
        "system-reboot" | "instance-reboot" | "instance-stop" | "instance-retirement"
    )
}

fn parse_events_at(
    path: &'static str,
    body: &str,
) -> Result<(Vec<MaintenanceEvent>, Vec<String>), NoticeError> {
    let err = |message: String| NoticeError { path, message };
    if body.trim().is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let docs: Vec<EventDoc> = serde_json::from_str(body).map_err(|e| err(e.to_string()))?;
    let mut events = Vec::new();
    let mut warnings = Vec::new();
    for (i, d) in docs.into_iter().enumerate() {
        let id = d.event_id.trim().to_string();
        if id.is_empty() {
            return Err(err(format!(
                "event {i}: field `EventId` is missing or empty"
            )));
        }
        let not_before = match time::parse(&d.not_before) {
            Ok(t) => Some(t),
            Err(e) => {
                warnings.push(format!(
                    "{path}: event {id}: field `NotBefore`: {e}; treated as due now"
                ));
                None
            }
        };
        let not_after = if d.not_after.trim().is_empty() {
            None
        } else {
            match time::parse(&d.not_after) {
                Ok(t) => Some(t),
                Err(e) => {
                    warnings.push(format!(
                        "{path}: event {id}: field `NotAfter`: {e}; ignored"
                    ));
                    None
                }
            }
        };
        let state = match d.state.trim().to_ascii_lowercase().as_str() {
            "active" => EventState::Active,
            "canceled" | "cancelled" => EventState::Canceled,
            "completed" => EventState::Completed,
            other => {
                warnings.push(format!(
                    "{path}: event {id}: unknown State {other:?}; treated as active"
                ));
                EventState::Other(other.to_string())
            }
        };
        events.push(MaintenanceEvent {
            event_id: id,
            code: d.code.trim().to_string(),
            description: d.description,
            not_before,
            not_after,
            state,
        });
    }
    Ok((events, warnings))
}

/// Whether an Auto Scaling target lifecycle state means the instance is going away
/// (`Terminated`, `Warmed:Terminated`).
pub fn lifecycle_is_terminating(state: &str) -> bool {
    matches!(state.trim(), "Terminated" | "Warmed:Terminated")
}

/// Whether a lifecycle state is one AWS documents (others are logged).
pub fn lifecycle_is_known(state: &str) -> bool {
    let s = state.trim();
    let s = s.strip_prefix("Warmed:").unwrap_or(s);
    matches!(
        s,
        "InService" | "Terminated" | "Standby" | "Detached" | "Stopped" | "Running" | "Hibernated"
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn spot_actions() {
        let n = parse_spot(r#"{"action": "terminate", "time": "2017-09-18T08:22:00Z"}"#).unwrap();
        assert_eq!(n.action, SpotAction::Terminate);
        assert_eq!(n.time, 1_505_722_920);
        let n = parse_spot(r#"{"action":"hibernate","time":"2017-09-18T08:22:00Z"}"#).unwrap();
        assert_eq!(n.action, SpotAction::Hibernate);
        let n = parse_spot(r#"{"action":"reboot","time":"2017-09-18T08:22:00Z"}"#).unwrap();
        assert_eq!(n.action, SpotAction::Other("reboot".into()));
    }

    #[test]
    fn spot_bad_bodies_name_the_path() {
        for bad in [
            "",
            "{",
            r#"{"action": "terminate", "time": "2017-09-18T08:2"#,
            r#"{"action": "terminate"}"#,
            r#"{"action": "", "time": "2017-09-18T08:22:00Z"}"#,
            r#"{"action": "terminate", "time": ""}"#,
            r#"{"action": "terminate", "time": "soon"}"#,
            "[]",
            "null",
        ] {
            let e = parse_spot(bad).unwrap_err();
            assert!(e.to_string().contains(SPOT_PATH), "{e}");
        }
    }

    #[test]
    fn maintenance_both_time_formats_and_empty_not_after() {
        let body = r#"[
          {"NotBefore": "21 Jan 2019 09:00:43 GMT", "Code": "system-reboot",
           "Description": "scheduled reboot", "EventId": "instance-event-0d59937288b749b32",
           "NotAfter": "", "State": "active"},
          {"NotBefore": "2019-01-22T09:00:00Z", "Code": "instance-stop",
           "Description": "x", "EventId": "instance-event-2", "NotAfter": "23 Jan 2019 09:00:00 GMT",
           "State": "canceled"},
          {"NotBefore": "whenever", "Code": "brand-new-code", "EventId": "instance-event-3",
           "State": "pending"}
        ]"#;
        let (ev, warnings) = parse_maintenance(body).unwrap();
        assert_eq!(ev.len(), 3);
        assert_eq!(ev[0].not_before, Some(1_548_061_243));
        assert_eq!(ev[0].not_after, None);
        assert_eq!(ev[0].state, EventState::Active);
        assert_eq!(ev[1].not_before, Some(1_548_147_600));
        assert_eq!(ev[1].not_after, Some(1_548_234_000));
        assert_eq!(ev[1].state, EventState::Canceled);
        assert_eq!(ev[2].not_before, None);
        assert_eq!(ev[2].code, "brand-new-code");
        assert_eq!(ev[2].state, EventState::Other("pending".into()));
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains("instance-event-3"));
    }

    #[test]
    fn maintenance_malformed() {
        assert_eq!(parse_maintenance("").unwrap().0, vec![]);
        assert_eq!(parse_maintenance("[]").unwrap().0, vec![]);
        for bad in [
            "[",
            "[{\"EventId\": \"x\"",
            "{}",
            "[1]",
            "[{\"Code\": \"system-reboot\"}]",
        ] {
            let e = parse_maintenance(bad).unwrap_err();
            assert!(e.to_string().contains(MAINTENANCE_PATH), "{e}");
        }
    }

    #[test]
    fn maintenance_history_in_the_shape_aws_documents() {
        // AWS EC2 User Guide, "Scheduled events for your instances": a canceled and a
        // completed system-reboot event, as `events/maintenance/history` serves them.
        let body = r#"[
          {"NotBefore" : "21 Jan 2019 09:00:43 GMT", "Code" : "system-reboot",
           "Description" : "[Canceled] scheduled reboot",
           "EventId" : "instance-event-0d59937288b749b32",
           "NotAfter" : "21 Jan 2019 09:17:23 GMT", "State" : "canceled"},
          {"NotBefore" : "29 Jan 2019 09:00:43 GMT", "Code" : "system-reboot",
           "Description" : "[Completed] scheduled reboot",
           "EventId" : "instance-event-0d59937288b749b32b",
           "NotAfter" : "29 Jan 2019 09:17:23 GMT", "State" : "completed"}
        ]"#;
        let (ev, warnings) = parse_maintenance_history(body).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(ev.len(), 2);
        assert_eq!(ev[0].state, EventState::Canceled);
        assert_eq!(ev[1].state, EventState::Completed);
        assert_eq!(ev[1].event_id, "instance-event-0d59937288b749b32b");
        let e = parse_maintenance_history("[{").unwrap_err();
        assert!(e.to_string().contains(MAINTENANCE_HISTORY_PATH), "{e}");
        let (_, w) = parse_maintenance_history(
            r#"[{"EventId": "instance-event-1", "NotBefore": "soon", "State": "completed"}]"#,
        )
        .unwrap();
        assert!(w[0].starts_with(MAINTENANCE_HISTORY_PATH), "{w:?}");
        assert!(takes_instance_down("system-reboot"));
        assert!(takes_instance_down("instance-stop"));
        assert!(!takes_instance_down("system-maintenance"));
    }

    #[test]
    fn rebalance_and_lifecycle() {
        let r = parse_rebalance(r#"{"noticeTime": "2020-10-27T08:22:00Z"}"#).unwrap();
        assert_eq!(r.notice_time, 1_603_786_920);
        assert!(parse_rebalance(r#"{"noticeTime": ""}"#).is_err());
        assert!(parse_rebalance("{\"notice").is_err());
        assert!(lifecycle_is_terminating("Terminated\n"));
        assert!(lifecycle_is_terminating("Warmed:Terminated"));
        assert!(!lifecycle_is_terminating("InService"));
        assert!(lifecycle_is_known("Warmed:Hibernated"));
        assert!(!lifecycle_is_known("Exploded"));
    }
}
