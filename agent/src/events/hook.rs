//! Auto Scaling termination lifecycle hooks: once `autoscaling/target-lifecycle-state`
//! reads `Terminated` (the instance is in `Terminating:Wait`), keep the lifecycle action
//! alive while jobs run and complete it with `CONTINUE` when the drain ends, so that the
//! instance neither lingers until the hook's timeout nor is terminated mid-drain.
//!
//! Facts (Amazon EC2 Auto Scaling User Guide, "Amazon EC2 Auto Scaling lifecycle hooks",
//! "Complete a lifecycle action"; API Reference 2011-01-01):
//! - A termination hook (`LifecycleTransition` `autoscaling:EC2_INSTANCE_TERMINATING`)
//!   holds the instance for its `HeartbeatTimeout` (30 to 7,200 s, default 3,600 s), then
//!   applies its `DefaultResult` (`CONTINUE` or `ABANDON`: for termination both terminate).
//! - `RecordLifecycleActionHeartbeat` restarts that timeout; the action lasts at most 48 h
//!   or 100 × `HeartbeatTimeout`, whichever is smaller, whatever the heartbeats.
//! - `CompleteLifecycleAction` with `LifecycleActionResult=CONTINUE` ends the wait: the
//!   instance is terminated at once (once every hook of the transition is completed).
//! - An action that is over (completed, timed out) answers `ValidationError` "No active
//!   Lifecycle Action found with instance ID ...".
//!
//! What is found how: the instance id from instance metadata; the group from
//! `DescribeAutoScalingInstances`; the termination hooks, their names and
//! `HeartbeatTimeout` from `DescribeLifecycleHooks` (every termination hook of the group,
//! or those named in `events.lifecycle_hooks`).
//!
//! [`Tracker`] decides (no I/O, Unix seconds given): while the node drains (jobs run) a
//! heartbeat every `events.lifecycle_heartbeat_interval` (below each hook's
//! `HeartbeatTimeout`: a longer one is warned about and halved timeout used), until
//! `events.lifecycle_max_wait` after the state turned `Terminated`; then, or as soon as no
//! job is left, `CompleteLifecycleAction CONTINUE` (the spot job action,
//! `events.spot_job_action`, is taken `events.spot_job_action_lead` before the maximum by
//! the drain engine). Every end of the heartbeats is logged with its reason: completed,
//! the maximum reached, the node resumed (the drain ended without the node leaving), the
//! action no longer active at Auto Scaling (expired or completed elsewhere), no permission.
//! [`pass`] runs one step against Auto Scaling. No permission (`AccessDenied`) is a warning
//! naming the IAM action, never a failure of the daemon.

use std::time::Duration;

use aws_sdk_autoscaling::error::ProvideErrorMetadata;
use serde::Serialize;

/// `LifecycleTransition` of a termination hook.
pub const TERMINATING: &str = "autoscaling:EC2_INSTANCE_TERMINATING";

/// The largest `HeartbeatTimeout` Auto Scaling accepts (7,200 s).
pub const MAX_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(7200);

/// The longest a lifecycle action can last whatever the heartbeats: 48 h (or 100 ×
/// `HeartbeatTimeout` when smaller, [`global_timeout`]).
pub const MAX_GLOBAL_TIMEOUT: Duration = Duration::from_secs(48 * 3600);

/// How long a failed call (throttling, 5xx, unreachable) waits before the next try.
pub const RETRY_AFTER: i64 = 15;

/// The IAM actions the hooks need (docs/iam.md).
pub const IAM_ACTIONS: [&str; 4] = [
    "autoscaling:DescribeAutoScalingInstances",
    "autoscaling:DescribeLifecycleHooks",
    "autoscaling:RecordLifecycleActionHeartbeat",
    "autoscaling:CompleteLifecycleAction",
];

/// One termination lifecycle hook of the instance's group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Hook {
    /// Auto Scaling group name.
    pub group: String,
    /// `LifecycleHookName`.
    pub name: String,
    /// `HeartbeatTimeout`.
    pub heartbeat_timeout: Duration,
    /// `DefaultResult` (`CONTINUE` or `ABANDON`).
    pub default_result: String,
}

/// The most a lifecycle action of `hook` can last: 48 h or 100 × `HeartbeatTimeout`,
/// whichever is smaller.
pub fn global_timeout(hook: &Hook) -> Duration {
    (hook.heartbeat_timeout * 100).min(MAX_GLOBAL_TIMEOUT)
}

/// Why an Auto Scaling call failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum HookError {
    /// The instance role may not make the call (`AccessDenied`): the policy lacks `iam_action`.
    #[error(
        "Auto Scaling {api} for instance {instance}: access denied; the instance role needs \
         {iam_action} (docs/iam.md): {message}"
    )]
    Denied {
        /// The API, e.g. `CompleteLifecycleAction`.
        api: &'static str,
        /// IAM's name of it, e.g. `autoscaling:CompleteLifecycleAction`.
        iam_action: &'static str,
        /// Instance id.
        instance: String,
        /// AWS's message.
        message: String,
    },
    /// Auto Scaling refused the call (e.g. `ValidationError`: no active lifecycle action).
    #[error("Auto Scaling {api} for instance {instance}: {code}: {message}")]
    Rejected {
        /// The API.
        api: &'static str,
        /// Instance id.
        instance: String,
        /// Error code, e.g. `ValidationError`.
        code: String,
        /// AWS's message.
        message: String,
    },
    /// Throttled, a 5xx, unreachable: tried again later.
    #[error("Auto Scaling {api} for instance {instance}: {message}")]
    Unavailable {
        /// The API.
        api: &'static str,
        /// Instance id.
        instance: String,
        /// What went wrong.
        message: String,
    },
}

fn classify<E, R>(
    api: &'static str,
    instance: &str,
    e: &aws_sdk_autoscaling::error::SdkError<E, R>,
) -> HookError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    use aws_sdk_autoscaling::error::SdkError;
    let (code, message) = match e {
        SdkError::ServiceError(se) => (
            se.err().code().map(str::to_string),
            se.err().message().unwrap_or_default().to_string(),
        ),
        other => (
            None,
            aws_sdk_autoscaling::error::DisplayErrorContext(other).to_string(),
        ),
    };
    let instance = instance.to_string();
    match code.as_deref() {
        c if crate::retry::is_access_denied(c) => HookError::Denied {
            api,
            iam_action: iam_action(api),
            instance,
            message,
        },
        Some(c @ ("ValidationError" | "ValidationException" | "InvalidParameterValue")) => {
            HookError::Rejected {
                api,
                instance,
                code: c.to_string(),
                message,
            }
        }
        Some(c) => HookError::Unavailable {
            api,
            instance,
            message: format!("{c}: {message}"),
        },
        None => HookError::Unavailable {
            api,
            instance,
            message,
        },
    }
}

fn iam_action(api: &str) -> &'static str {
    IAM_ACTIONS
        .iter()
        .find(|a| a.strip_prefix("autoscaling:") == Some(api))
        .copied()
        .unwrap_or("autoscaling:*")
}

/// What Auto Scaling says of the instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Discovery {
    /// Not an instance of an Auto Scaling group.
    NotInGroup,
    /// In `group`, with these termination hooks (none: nothing to complete).
    Group {
        /// Group name.
        group: String,
        /// Its termination hooks (those named in `events.lifecycle_hooks` when set).
        hooks: Vec<Hook>,
    },
}

/// The group of `instance` (`DescribeAutoScalingInstances`) and its termination hooks
/// (`DescribeLifecycleHooks`), those named in `names` when it is not empty.
///
/// # Errors
/// [`HookError`] of either call.
pub async fn discover(
    client: &aws_sdk_autoscaling::Client,
    instance: &str,
    names: &[String],
) -> Result<Discovery, HookError> {
    let out = client
        .describe_auto_scaling_instances()
        .instance_ids(instance)
        .send()
        .await
        .map_err(|e| classify("DescribeAutoScalingInstances", instance, &e))?;
    let Some(group) = out
        .auto_scaling_instances()
        .iter()
        .find(|i| i.instance_id() == Some(instance))
        .and_then(|i| i.auto_scaling_group_name())
        .map(str::to_string)
    else {
        return Ok(Discovery::NotInGroup);
    };
    let out = client
        .describe_lifecycle_hooks()
        .auto_scaling_group_name(&group)
        .send()
        .await
        .map_err(|e| classify("DescribeLifecycleHooks", instance, &e))?;
    let hooks = out
        .lifecycle_hooks()
        .iter()
        .filter(|h| h.lifecycle_transition() == Some(TERMINATING))
        .filter_map(|h| {
            let name = h.lifecycle_hook_name()?.to_string();
            if !names.is_empty() && !names.contains(&name) {
                return None;
            }
            // Auto Scaling's default when the hook was created without one.
            let secs = h.heartbeat_timeout().unwrap_or(3600);
            Some(Hook {
                group: group.clone(),
                name,
                heartbeat_timeout: Duration::from_secs(u64::try_from(secs).unwrap_or(3600)),
                default_result: h.default_result().unwrap_or("ABANDON").to_string(),
            })
        })
        .collect();
    Ok(Discovery::Group { group, hooks })
}

/// The Auto Scaling client for `region`: aws-config's default credentials (the instance
/// profile's through IMDS on a node), endpoint from `AWS_ENDPOINT_URL_AUTO_SCALING` or
/// `AWS_ENDPOINT_URL` when set (tests), and the SDK's standard retries.
pub async fn client(region: &str) -> aws_sdk_autoscaling::Client {
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(region.to_string()))
        .load()
        .await;
    aws_sdk_autoscaling::Client::new(&sdk)
}

/// `RecordLifecycleActionHeartbeat` for `hook` and `instance`.
///
/// # Errors
/// [`HookError`].
pub async fn heartbeat(
    client: &aws_sdk_autoscaling::Client,
    hook: &Hook,
    instance: &str,
) -> Result<(), HookError> {
    client
        .record_lifecycle_action_heartbeat()
        .auto_scaling_group_name(&hook.group)
        .lifecycle_hook_name(&hook.name)
        .instance_id(instance)
        .send()
        .await
        .map(drop)
        .map_err(|e| classify("RecordLifecycleActionHeartbeat", instance, &e))
}

/// `CompleteLifecycleAction` with `LifecycleActionResult=CONTINUE` for `hook` and
/// `instance`.
///
/// # Errors
/// [`HookError`].
pub async fn complete(
    client: &aws_sdk_autoscaling::Client,
    hook: &Hook,
    instance: &str,
) -> Result<(), HookError> {
    client
        .complete_lifecycle_action()
        .auto_scaling_group_name(&hook.group)
        .lifecycle_hook_name(&hook.name)
        .instance_id(instance)
        .lifecycle_action_result("CONTINUE")
        .send()
        .await
        .map(drop)
        .map_err(|e| classify("CompleteLifecycleAction", instance, &e))
}

/// Where the node's drain stands, for the hooks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainView {
    /// Drained in Slurm, jobs may still run.
    Draining,
    /// The drain ended: no job left (drained, or its action ran).
    Ended,
    /// Not drained by the agent (not yet, or resumed).
    Active,
}

/// The settings the hooks follow (`[events]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HookPolicy {
    /// `events.lifecycle_heartbeat_interval`.
    pub interval: Duration,
    /// `events.lifecycle_max_wait`.
    pub max_wait: Duration,
}

/// One step the tracker asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Due {
    /// Send a heartbeat for the hook at this index.
    Heartbeat(usize),
    /// Complete the hook's action with `CONTINUE`; why.
    Complete(usize, String),
    /// Stop the hook's heartbeats without completing; why (logged as a warning).
    Stop(usize, String),
}

#[derive(Debug, Clone)]
struct Tracked {
    hook: Hook,
    /// The interval used (below the hook's timeout).
    interval: Duration,
    /// The longest wait used (within the action's global timeout).
    max_wait: Duration,
    /// Unix seconds of the last heartbeat (or of `Terminated`).
    last_beat: i64,
    /// No try before this (after a failed call).
    retry_at: i64,
    /// Whether heartbeats are refused (no permission): the completion is still tried.
    beats_denied: bool,
    /// Whether the expiry was warned about already.
    expiry_warned: bool,
    /// Why it is over, once over.
    end: Option<String>,
}

/// Where the discovery stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Found {
    /// Not asked yet, or to be asked again at this time.
    Pending(i64),
    /// Asked: the hooks are tracked (none: nothing to do).
    Done,
}

/// The hooks of this instance and what is due for them; see the module docs.
#[derive(Debug, Clone)]
pub struct Tracker {
    policy: HookPolicy,
    names: Vec<String>,
    /// Unix seconds when the lifecycle state turned `Terminated` (as first seen).
    terminated_at: Option<i64>,
    found: Found,
    hooks: Vec<Tracked>,
    saw_drain: bool,
    /// Every warning given (also logged), oldest first.
    warnings: Vec<String>,
}

/// Logs `message` as a warning and keeps it in `list`.
fn note(list: &mut Vec<String>, message: String) {
    tracing::warn!("{message}");
    list.push(message);
}

impl Tracker {
    /// A tracker following `policy`, for the hooks named in `names` (empty: every
    /// termination hook of the group).
    pub fn new(policy: HookPolicy, names: Vec<String>) -> Tracker {
        Tracker {
            policy,
            names,
            terminated_at: None,
            found: Found::Pending(0),
            hooks: Vec::new(),
            saw_drain: false,
            warnings: Vec::new(),
        }
    }

    /// The lifecycle state read `Terminated` at `at` (Unix seconds); the earliest counts.
    pub fn terminated(&mut self, at: i64) {
        self.terminated_at = Some(self.terminated_at.map_or(at, |t| t.min(at)));
    }

    /// When the state turned `Terminated`, if it did.
    pub fn terminated_at(&self) -> Option<i64> {
        self.terminated_at
    }

    /// Whether the hooks still need passes: `Terminated` seen and a hook not over (or the
    /// group not asked yet).
    pub fn live(&self) -> bool {
        self.terminated_at.is_some()
            && (matches!(self.found, Found::Pending(_))
                || self.hooks.iter().any(|t| t.end.is_none()))
    }

    /// The hooks tracked, and why each is over (`None`: still live).
    pub fn hooks(&self) -> Vec<(Hook, Option<String>)> {
        self.hooks
            .iter()
            .map(|t| (t.hook.clone(), t.end.clone()))
            .collect()
    }

    /// The warnings given so far (each also logged): an interval or maximum that does not
    /// fit a hook, a hook likely expired, heartbeats that stopped and why.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Whether the group and hooks must be asked for at `now`.
    pub fn needs_discovery(&self, now: i64) -> bool {
        self.terminated_at.is_some() && matches!(self.found, Found::Pending(at) if at <= now)
    }

    /// Takes what Auto Scaling said; logs the hooks (and a heartbeat interval at or above
    /// a hook's timeout, or a maximum beyond what Auto Scaling allows, as warnings naming
    /// the key and the value).
    pub fn found(&mut self, d: Result<Discovery, HookError>, now: i64) {
        let start = self.terminated_at.unwrap_or(now);
        match d {
            Err(e @ HookError::Unavailable { .. })
                if now
                    < start.saturating_add(
                        i64::try_from(self.policy.max_wait.as_secs()).unwrap_or(i64::MAX),
                    ) =>
            {
                note(
                    &mut self.warnings,
                    format!("lifecycle hooks: {e}; asked again in {RETRY_AFTER} s"),
                );
                self.found = Found::Pending(now + RETRY_AFTER);
            }
            Err(e) => {
                note(
                    &mut self.warnings,
                    format!(
                        "lifecycle hooks: {e}; the lifecycle action is not completed by the \
                         agent (the hook's DefaultResult applies at its timeout; an outage is \
                         retried until events.lifecycle_max_wait has passed)"
                    ),
                );
                self.found = Found::Done;
            }
            Ok(Discovery::NotInGroup) => {
                tracing::info!(
                    "lifecycle hooks: the instance is not in an Auto Scaling group; nothing to complete"
                );
                self.found = Found::Done;
            }
            Ok(Discovery::Group { group, hooks }) => {
                if hooks.is_empty() {
                    tracing::info!(group = %group, names = ?self.names, "lifecycle hooks: the group has no termination hook (autoscaling:EC2_INSTANCE_TERMINATING) to complete");
                }
                self.found = Found::Done;
                let policy = self.policy;
                let warnings = &mut self.warnings;
                self.hooks = hooks
                    .into_iter()
                    .map(|hook| Self::track(policy, hook, start, warnings))
                    .collect();
            }
        }
    }

    fn track(policy: HookPolicy, hook: Hook, start: i64, warnings: &mut Vec<String>) -> Tracked {
        let mut interval = policy.interval;
        if interval >= hook.heartbeat_timeout {
            interval = hook.heartbeat_timeout / 2;
            note(
                warnings,
                format!(
                    "events.lifecycle_heartbeat_interval = {} is at or above the HeartbeatTimeout \
                     of lifecycle hook {} of group {} ({} s): heartbeats would come after the \
                     hook expired; every {} s instead",
                    humantime::format_duration(policy.interval),
                    hook.name,
                    hook.group,
                    hook.heartbeat_timeout.as_secs(),
                    interval.as_secs()
                ),
            );
        }
        let global = global_timeout(&hook);
        let mut max_wait = policy.max_wait;
        if max_wait + interval > global {
            max_wait = global.saturating_sub(interval);
            note(
                warnings,
                format!(
                    "events.lifecycle_max_wait = {} is beyond what Auto Scaling allows lifecycle \
                     hook {} ({} s: 48 h or 100 x HeartbeatTimeout, whichever is smaller); \
                     completing after {} s instead",
                    humantime::format_duration(policy.max_wait),
                    hook.name,
                    global.as_secs(),
                    max_wait.as_secs()
                ),
            );
        }
        tracing::info!(
            hook = %hook.name,
            group = %hook.group,
            heartbeat_timeout_s = hook.heartbeat_timeout.as_secs(),
            default_result = %hook.default_result,
            heartbeat_every_s = interval.as_secs(),
            max_wait_s = max_wait.as_secs(),
            "termination lifecycle hook: heartbeats while jobs run, CONTINUE when the drain ends"
        );
        Tracked {
            hook,
            interval,
            max_wait,
            last_beat: start,
            retry_at: 0,
            beats_denied: false,
            expiry_warned: false,
            end: None,
        }
    }

    /// What is due at `now` with the drain as `view`.
    pub fn due(&mut self, view: DrainView, now: i64) -> Vec<Due> {
        let Some(start) = self.terminated_at else {
            return Vec::new();
        };
        if view != DrainView::Active {
            self.saw_drain = true;
        }
        let secs = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
        let mut out = Vec::new();
        for (i, t) in self.hooks.iter_mut().enumerate() {
            if t.end.is_some() || now < t.retry_at {
                continue;
            }
            if view == DrainView::Active {
                if self.saw_drain {
                    out.push(Due::Stop(
                        i,
                        "the node's drain ended without the node leaving (resumed in Slurm or \
                         by an operator): heartbeats stop, and Auto Scaling applies the hook's \
                         DefaultResult at its timeout"
                            .into(),
                    ));
                }
                continue;
            }
            let timeout = secs(t.hook.heartbeat_timeout);
            if now - t.last_beat >= timeout && !t.expiry_warned {
                t.expiry_warned = true;
                note(
                    &mut self.warnings,
                    format!(
                        "lifecycle hook {} of group {}: its HeartbeatTimeout ({timeout} s) has \
                         passed since {} (the lifecycle state turned Terminated at {}): the hook \
                         has likely expired and Auto Scaling applied its DefaultResult {}; \
                         asking Auto Scaling",
                        t.hook.name,
                        t.hook.group,
                        if t.last_beat > start {
                            format!(
                                "the last heartbeat, at {}",
                                crate::time::format(t.last_beat)
                            )
                        } else {
                            "then".to_string()
                        },
                        crate::time::format(start),
                        t.hook.default_result
                    ),
                );
            }
            if view == DrainView::Ended {
                out.push(Due::Complete(i, "the drain ended: no job left".into()));
            } else if now >= start.saturating_add(secs(t.max_wait)) {
                out.push(Due::Complete(
                    i,
                    format!(
                        "events.lifecycle_max_wait ({}) reached with jobs still running: heartbeats stop",
                        humantime::format_duration(t.max_wait)
                    ),
                ));
            } else if !t.beats_denied && now - t.last_beat >= secs(t.interval) {
                out.push(Due::Heartbeat(i));
            }
        }
        out
    }

    /// Takes the result of a step.
    pub fn done(&mut self, due: &Due, r: Result<(), HookError>, now: i64) {
        let (i, what) = match due {
            Due::Heartbeat(i) => (*i, "heartbeat"),
            Due::Complete(i, _) => (*i, "completion"),
            Due::Stop(i, why) => {
                if let Some(t) = self.hooks.get_mut(*i) {
                    note(
                        &mut self.warnings,
                        format!(
                            "lifecycle hook {} of group {}: heartbeats stop: {why}",
                            t.hook.name, t.hook.group
                        ),
                    );
                    t.end = Some(why.clone());
                }
                return;
            }
        };
        let Some(t) = self.hooks.get_mut(i) else {
            return;
        };
        match (due, r) {
            (Due::Heartbeat(_), Ok(())) => {
                t.last_beat = now;
                t.expiry_warned = false;
                tracing::info!(hook = %t.hook.name, group = %t.hook.group, next_in_s = t.interval.as_secs(), "lifecycle action heartbeat recorded (jobs still running)");
            }
            (Due::Complete(_, why), Ok(())) => {
                tracing::info!(hook = %t.hook.name, group = %t.hook.group, "lifecycle action completed with CONTINUE ({why}); heartbeats stop: Auto Scaling terminates the instance");
                t.end = Some(format!("completed with CONTINUE: {why}"));
            }
            (_, Err(e @ HookError::Unavailable { .. })) => {
                note(
                    &mut self.warnings,
                    format!(
                        "lifecycle hook {}: {what}: {e}; tried again in {RETRY_AFTER} s",
                        t.hook.name
                    ),
                );
                t.retry_at = now + RETRY_AFTER;
            }
            (Due::Heartbeat(_), Err(e @ HookError::Denied { .. })) => {
                note(
                    &mut self.warnings,
                    format!(
                        "lifecycle hook {}: heartbeats stop: {e}; the action is still completed \
                         when the drain ends",
                        t.hook.name
                    ),
                );
                t.beats_denied = true;
            }
            (_, Err(e)) => {
                let why = match &e {
                    HookError::Rejected { .. } => format!(
                        "{e} (the action is over at Auto Scaling: expired or completed elsewhere)"
                    ),
                    _ => e.to_string(),
                };
                note(
                    &mut self.warnings,
                    format!(
                        "lifecycle hook {} of group {}: heartbeats stop: {why}",
                        t.hook.name, t.hook.group
                    ),
                );
                t.end = Some(why);
            }
            (Due::Stop(..), Ok(())) => {}
        }
    }
}

/// One pass: asks for the group and hooks when due, then makes the calls due, each result
/// logged. `now` Unix seconds.
pub async fn pass(
    tracker: &mut Tracker,
    client: &aws_sdk_autoscaling::Client,
    instance: &str,
    view: DrainView,
    now: i64,
) {
    if tracker.needs_discovery(now) {
        let d = discover(client, instance, &tracker.names).await;
        tracker.found(d, now);
    }
    for due in tracker.due(view, now) {
        let r = match &due {
            Due::Heartbeat(i) => heartbeat(client, &tracker.hooks[*i].hook, instance).await,
            Due::Complete(i, _) => complete(client, &tracker.hooks[*i].hook, instance).await,
            Due::Stop(..) => Ok(()),
        };
        tracker.done(&due, r, now);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn hook(timeout: u64) -> Hook {
        Hook {
            group: "g".into(),
            name: "drain".into(),
            heartbeat_timeout: Duration::from_secs(timeout),
            default_result: "ABANDON".into(),
        }
    }

    fn tracker(interval: u64, max_wait: u64, timeout: u64) -> Tracker {
        let mut t = Tracker::new(
            HookPolicy {
                interval: Duration::from_secs(interval),
                max_wait: Duration::from_secs(max_wait),
            },
            Vec::new(),
        );
        t.terminated(1000);
        t.found(
            Ok(Discovery::Group {
                group: "g".into(),
                hooks: vec![hook(timeout)],
            }),
            1000,
        );
        t
    }

    #[test]
    fn heartbeats_while_jobs_run_then_continue_when_drained() {
        let mut t = tracker(300, 3600, 900);
        assert!(t.due(DrainView::Draining, 1100).is_empty());
        assert_eq!(t.due(DrainView::Draining, 1300), [Due::Heartbeat(0)]);
        t.done(&Due::Heartbeat(0), Ok(()), 1300);
        assert!(t.due(DrainView::Draining, 1500).is_empty());
        assert_eq!(t.due(DrainView::Draining, 1600), [Due::Heartbeat(0)]);
        let d = t.due(DrainView::Ended, 1700);
        assert!(matches!(d.as_slice(), [Due::Complete(0, _)]), "{d:?}");
        t.done(&d[0], Ok(()), 1700);
        assert!(!t.live());
        assert!(t.due(DrainView::Ended, 1800).is_empty());
    }

    #[test]
    fn the_maximum_ends_heartbeats_with_a_completion() {
        let mut t = tracker(300, 600, 900);
        t.done(&Due::Heartbeat(0), Ok(()), 1300);
        let d = t.due(DrainView::Draining, 1600);
        match d.as_slice() {
            [Due::Complete(0, why)] => {
                assert!(why.contains("events.lifecycle_max_wait"), "{why}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_interval_at_or_above_the_timeout_is_halved_timeout() {
        let mut t = tracker(900, 3600, 600);
        // Every 300 s (600 / 2), not 900; the warning names the key, its value and the
        // hook's timeout.
        assert_eq!(t.due(DrainView::Draining, 1300), [Due::Heartbeat(0)]);
        let w = t.warnings().join("\n");
        assert!(
            w.contains("events.lifecycle_heartbeat_interval = 15m")
                && w.contains("drain of group g (600 s)"),
            "{w}"
        );
        // A maximum beyond 100 x HeartbeatTimeout (here 30 s: 3,000 s) is shortened, named.
        let t = tracker(10, 3 * 3600, 30);
        let w = t.warnings().join("\n");
        assert!(
            w.contains("events.lifecycle_max_wait = 3h") && w.contains("(3000 s"),
            "{w}"
        );
    }

    #[test]
    fn a_hook_whose_timeout_passed_since_terminated_is_warned_about_and_asked_once() {
        let mut t = tracker(300, 36_000, 900);
        // A restart found the drain begun 1,000 s ago, past the 900 s timeout.
        let d = t.due(DrainView::Draining, 2000);
        assert_eq!(d, [Due::Heartbeat(0)]);
        assert_eq!(t.warnings().len(), 1);
        assert!(
            t.warnings()[0].contains("HeartbeatTimeout (900 s) has passed")
                && t.warnings()[0].contains("likely expired"),
            "{:?}",
            t.warnings()
        );
        // Warned once; Auto Scaling's answer decides.
        t.done(
            &d[0],
            Err(HookError::Unavailable {
                api: "RecordLifecycleActionHeartbeat",
                instance: "i-1".into(),
                message: "timeout".into(),
            }),
            2000,
        );
        let _ = t.due(DrainView::Draining, 2000 + RETRY_AFTER);
        assert_eq!(
            t.warnings()
                .iter()
                .filter(|w| w.contains("likely expired"))
                .count(),
            1
        );
    }

    #[test]
    fn a_resumed_node_stops_heartbeats_and_a_rejection_ends_them() {
        let mut t = tracker(300, 3600, 900);
        // Not drained yet: nothing stops.
        assert!(t.due(DrainView::Active, 1001).is_empty());
        assert!(t.due(DrainView::Draining, 1002).is_empty());
        let d = t.due(DrainView::Active, 1003);
        assert!(matches!(d.as_slice(), [Due::Stop(0, _)]), "{d:?}");
        t.done(&d[0], Ok(()), 1003);
        assert!(!t.live());

        let mut t = tracker(300, 3600, 900);
        let rejected = HookError::Rejected {
            api: "RecordLifecycleActionHeartbeat",
            instance: "i-1".into(),
            code: "ValidationError".into(),
            message: "No active Lifecycle Action found with instance ID i-1".into(),
        };
        t.done(&Due::Heartbeat(0), Err(rejected), 1300);
        assert!(!t.live());
        assert!(t.hooks()[0]
            .1
            .as_deref()
            .unwrap()
            .contains("No active Lifecycle Action"));
    }

    #[test]
    fn denied_heartbeats_still_complete_and_outages_retry() {
        let mut t = tracker(300, 3600, 900);
        let denied = HookError::Denied {
            api: "RecordLifecycleActionHeartbeat",
            iam_action: "autoscaling:RecordLifecycleActionHeartbeat",
            instance: "i-1".into(),
            message: "not authorized".into(),
        };
        assert!(denied
            .to_string()
            .contains("autoscaling:RecordLifecycleActionHeartbeat"));
        t.done(&Due::Heartbeat(0), Err(denied), 1300);
        assert!(t.due(DrainView::Draining, 1700).is_empty());
        let d = t.due(DrainView::Ended, 1701);
        assert!(matches!(d.as_slice(), [Due::Complete(0, _)]), "{d:?}");
        let down = HookError::Unavailable {
            api: "CompleteLifecycleAction",
            instance: "i-1".into(),
            message: "Throttling".into(),
        };
        t.done(&d[0], Err(down), 1701);
        assert!(t.due(DrainView::Ended, 1702).is_empty());
        assert_eq!(t.due(DrainView::Ended, 1701 + RETRY_AFTER).len(), 1);
    }

    #[test]
    fn no_permission_to_find_the_hooks_is_a_warning_naming_the_iam_action() {
        let mut t = Tracker::new(
            HookPolicy {
                interval: Duration::from_secs(300),
                max_wait: Duration::from_secs(3600),
            },
            Vec::new(),
        );
        t.terminated(1000);
        assert!(t.needs_discovery(1000));
        t.found(
            Err(HookError::Denied {
                api: "DescribeAutoScalingInstances",
                iam_action: iam_action("DescribeAutoScalingInstances"),
                instance: "i-1".into(),
                message: "not authorized".into(),
            }),
            1000,
        );
        assert!(!t.live() && !t.needs_discovery(2000));
        // Auto Scaling unreachable: asked again, until the maximum has passed.
        let mut u = Tracker::new(
            HookPolicy {
                interval: Duration::from_secs(300),
                max_wait: Duration::from_secs(3600),
            },
            Vec::new(),
        );
        u.terminated(1000);
        let down = || {
            Err(HookError::Unavailable {
                api: "DescribeAutoScalingInstances",
                instance: "i-1".into(),
                message: "dispatch failure".into(),
            })
        };
        u.found(down(), 1000);
        assert!(u.live() && !u.needs_discovery(1001) && u.needs_discovery(1000 + RETRY_AFTER));
        u.found(down(), 1000 + 3600);
        assert!(!u.live());
        assert!(
            t.warnings()[0].contains("autoscaling:DescribeAutoScalingInstances"),
            "{:?}",
            t.warnings()
        );
    }

    #[test]
    fn iam_actions_are_named() {
        assert_eq!(
            iam_action("CompleteLifecycleAction"),
            "autoscaling:CompleteLifecycleAction"
        );
        assert_eq!(global_timeout(&hook(60)), Duration::from_secs(6000));
        assert_eq!(global_timeout(&hook(7200)), MAX_GLOBAL_TIMEOUT);
    }
}
