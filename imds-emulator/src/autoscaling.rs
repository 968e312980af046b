//! An emulator of the two Amazon EC2 Auto Scaling calls moto 5.2 lacks,
//! `RecordLifecycleActionHeartbeat` and `CompleteLifecycleAction`, in front of moto (which
//! serves the rest of Auto Scaling: groups, instances, `DescribeLifecycleHooks`), for tests
//! and local use.
//!
//! [`AutoScalingEmulator::start`] binds a TCP port on 127.0.0.1 and answers as the
//! service's regional endpoint does (Amazon EC2 Auto Scaling API Reference, API version
//! 2011-01-01: "CompleteLifecycleAction", "RecordLifecycleActionHeartbeat", "Common
//! Errors"):
//!
//! - `POST /`, `Content-Type: application/x-www-form-urlencoded`, the Query protocol:
//!   `Action=<name>&Version=2011-01-01&...`. The two calls are answered here; every other
//!   action is forwarded unchanged (headers included) to the upstream (moto), or, without
//!   one, `InvalidAction` (400).
//! - A SigV4 `Authorization` header with the credential scope
//!   `<date>/<region>/autoscaling/aws4_request`: none or a malformed one is
//!   `MissingAuthenticationToken`/`IncompleteSignature` (403). When credentials were given
//!   ([`AutoScalingEmulator::set_credentials`]) the signature is verified with the secret
//!   key (`SignatureDoesNotMatch`, 403) and the access key must be known
//!   (`InvalidClientTokenId`, 403).
//! - `Version` must be `2011-01-01`; `LifecycleHookName` (1 to 255 characters),
//!   `AutoScalingGroupName` (1 to 1600) are required, and one of `InstanceId` or
//!   `LifecycleActionToken` (36 characters); `CompleteLifecycleAction` requires
//!   `LifecycleActionResult` `CONTINUE` or `ABANDON`. Anything else: `ValidationError`
//!   (400).
//! - The lifecycle action must be active: started by [`AutoScalingEmulator::begin`] (the
//!   test's stand-in for a scale-in that puts the instance into `Terminating:Wait`), not
//!   completed, and within its hook's heartbeat timeout of the start or of the last
//!   heartbeat (after that the service ends it with the hook's default result). Else
//!   `ValidationError` (400): `No active Lifecycle Action found with instance ID <id>`.
//!   A heartbeat restarts the timeout; completion ends the action with its result.
//! - An instance denied an action ([`AutoScalingEmulator::deny`]): `AccessDenied` (403)
//!   naming `autoscaling:<Action>`, as IAM's message does.
//!
//! Answers are XML in the `http://autoscaling.amazonaws.com/doc/2011-01-01/` namespace:
//! `<ActionResponse><ActionResult/><ResponseMetadata><RequestId>...`; errors
//! `<ErrorResponse><Error><Type>Sender</Type><Code>...</Code><Message>...</Message></Error>
//! <RequestId>...</RequestId></ErrorResponse>`. Every call served here is kept as an
//! [`AsgCall`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};

use crate::aws::{
    expected_signature, form_pairs, header, parse_authorization, request_id, xml_escape as escape,
    xml_response, Resp, Server,
};

/// The Query protocol's API version of Auto Scaling.
pub const VERSION: &str = "2011-01-01";

/// The XML namespace of Auto Scaling's answers.
pub const XMLNS: &str = "http://autoscaling.amazonaws.com/doc/2011-01-01/";

/// The account in ARNs and messages.
pub const ACCOUNT_ID: &str = "111122223333";

/// One lifecycle action waiting for completion: an instance of a group held in
/// `Terminating:Wait` by a hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LifecycleAction {
    /// EC2 instance id.
    pub instance_id: String,
    /// Auto Scaling group name.
    pub group: String,
    /// Lifecycle hook name.
    pub hook: String,
    /// The hook's `HeartbeatTimeout`.
    pub heartbeat_timeout: Duration,
    /// The hook's `DefaultResult` (applied when the timeout passes).
    pub default_result: String,
}

/// How a lifecycle action ended, or that it still waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActionOutcome {
    /// Still in `Terminating:Wait`.
    Waiting,
    /// Completed with this result (`CONTINUE`, `ABANDON`).
    Completed(String),
    /// The heartbeat timeout passed: the hook's default result.
    TimedOut(String),
}

/// One request served here (not the forwarded ones).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AsgCall {
    /// `Action`.
    pub action: String,
    /// `InstanceId`, when given.
    pub instance_id: Option<String>,
    /// `LifecycleHookName`.
    pub hook: Option<String>,
    /// `AutoScalingGroupName`.
    pub group: Option<String>,
    /// `LifecycleActionResult`, when given.
    pub result: Option<String>,
    /// HTTP status answered.
    pub status: u16,
    /// Error code answered, if any.
    pub error: Option<String>,
}

#[derive(Debug)]
struct Active {
    action: LifecycleAction,
    token: String,
    deadline: Instant,
    outcome: ActionOutcome,
    heartbeats: u32,
}

#[derive(Debug, Default)]
struct State {
    actions: Vec<Active>,
    credentials: HashMap<String, String>,
    denied: HashSet<(String, String)>,
    log: Vec<AsgCall>,
}

type Shared = Arc<Mutex<State>>;

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

impl State {
    /// Ends the actions whose heartbeat timeout passed (the hook's default result).
    fn expire(&mut self, now: Instant) {
        for a in &mut self.actions {
            if a.outcome == ActionOutcome::Waiting && now >= a.deadline {
                a.outcome = ActionOutcome::TimedOut(a.action.default_result.clone());
            }
        }
    }
}

/// A running Auto Scaling emulator; dropping it stops the server.
#[derive(Debug)]
pub struct AutoScalingEmulator {
    server: Server,
    shared: Shared,
}

impl AutoScalingEmulator {
    /// Binds a free port on 127.0.0.1 and serves; other actions go to `upstream` (moto's
    /// address), or are `InvalidAction` without one.
    ///
    /// # Errors
    /// When the socket, runtime or thread cannot be created.
    pub fn start(upstream: Option<SocketAddr>) -> io::Result<AutoScalingEmulator> {
        Self::start_on(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), upstream)
    }

    /// Like [`AutoScalingEmulator::start`], bound to `addr` (port 0: a free one), e.g. an
    /// address of a network namespace the caller runs in (the socket, and the server
    /// thread's connections to `upstream`, stay in the namespace it was started in).
    ///
    /// # Errors
    /// When the socket, runtime or thread cannot be created.
    pub fn start_on(
        addr: SocketAddr,
        upstream: Option<SocketAddr>,
    ) -> io::Result<AutoScalingEmulator> {
        let shared: Shared = Arc::default();
        let server_shared = shared.clone();
        let server = Server::start(addr, "asg-emulator", move |req| {
            handle(server_shared.clone(), upstream, req)
        })?;
        Ok(AutoScalingEmulator { server, shared })
    }

    /// The endpoint URL, e.g. `http://127.0.0.1:40123` (`AWS_ENDPOINT_URL_AUTO_SCALING`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.server.addr)
    }

    /// Starts a lifecycle action (the instance enters `Terminating:Wait` for the hook);
    /// returns its `LifecycleActionToken`. One replaces an earlier one of the same
    /// instance and hook.
    pub fn begin(&self, action: LifecycleAction) -> String {
        let token = request_id();
        let mut s = lock(&self.shared);
        s.actions.retain(|a| {
            !(a.action.instance_id == action.instance_id && a.action.hook == action.hook)
        });
        s.actions.push(Active {
            deadline: Instant::now() + action.heartbeat_timeout,
            action,
            token: token.clone(),
            outcome: ActionOutcome::Waiting,
            heartbeats: 0,
        });
        token
    }

    /// Where the action of `instance_id` for `hook` stands (`None`: never begun).
    pub fn outcome(&self, instance_id: &str, hook: &str) -> Option<ActionOutcome> {
        let mut s = lock(&self.shared);
        s.expire(Instant::now());
        s.actions
            .iter()
            .find(|a| a.action.instance_id == instance_id && a.action.hook == hook)
            .map(|a| a.outcome.clone())
    }

    /// Heartbeats recorded for the action of `instance_id` for `hook`.
    pub fn heartbeats(&self, instance_id: &str, hook: &str) -> u32 {
        lock(&self.shared)
            .actions
            .iter()
            .find(|a| a.action.instance_id == instance_id && a.action.hook == hook)
            .map_or(0, |a| a.heartbeats)
    }

    /// Verifies signatures from now on: `access_key_id` signs with `secret_access_key`
    /// (more than one pair may be given; an unknown access key is refused).
    pub fn set_credentials(&self, access_key_id: &str, secret_access_key: &str) {
        lock(&self.shared)
            .credentials
            .insert(access_key_id.to_string(), secret_access_key.to_string());
    }

    /// Whether `instance_id` may call `action` (`CompleteLifecycleAction`,
    /// `RecordLifecycleActionHeartbeat`); denied: `AccessDenied`.
    pub fn deny(&self, instance_id: &str, action: &str, denied: bool) {
        let key = (instance_id.to_string(), action.to_string());
        let mut s = lock(&self.shared);
        if denied {
            s.denied.insert(key);
        } else {
            s.denied.remove(&key);
        }
    }

    /// Every call served here, oldest first.
    pub fn calls(&self) -> Vec<AsgCall> {
        lock(&self.shared).log.clone()
    }
}

fn xml(status: StatusCode, body: String) -> Resp {
    xml_response(status, "text/xml", body)
}

/// A Query-protocol error answer (`Sender` for 4xx, `Receiver` for 5xx).
fn error(status: StatusCode, code: &str, message: &str) -> Resp {
    let kind = if status.is_server_error() {
        "Receiver"
    } else {
        "Sender"
    };
    xml(
        status,
        format!(
            "<ErrorResponse xmlns=\"{XMLNS}\">\n  <Error>\n    <Type>{kind}</Type>\n    \
             <Code>{code}</Code>\n    <Message>{}</Message>\n  </Error>\n  \
             <RequestId>{}</RequestId>\n</ErrorResponse>\n",
            escape(message),
            request_id()
        ),
    )
}

fn success(action: &str) -> Resp {
    xml(
        StatusCode::OK,
        format!(
            "<{action}Response xmlns=\"{XMLNS}\">\n  <{action}Result/>\n  <ResponseMetadata>\n    \
             <RequestId>{}</RequestId>\n  </ResponseMetadata>\n</{action}Response>\n",
            request_id()
        ),
    )
}

/// `application/x-www-form-urlencoded` into its pairs (`+` is a space, `%XX` a byte).
pub fn parse_form(body: &str) -> BTreeMap<String, String> {
    form_pairs(body.as_bytes()).into_iter().collect()
}

/// The two actions served here.
const SERVED: [&str; 2] = ["CompleteLifecycleAction", "RecordLifecycleActionHeartbeat"];

async fn handle(
    shared: Shared,
    upstream: Option<SocketAddr>,
    req: Request<Incoming>,
) -> Result<Resp, std::convert::Infallible> {
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let form = parse_form(&String::from_utf8_lossy(&body));
    let action = form.get("Action").cloned().unwrap_or_default();
    if parts.method != Method::POST || !SERVED.contains(&action.as_str()) {
        let Some(up) = upstream else {
            return Ok(error(
                StatusCode::BAD_REQUEST,
                "InvalidAction",
                &format!("The action {action} is not valid for this web service."),
            ));
        };
        let req = Request::from_parts(parts, Full::new(body));
        return Ok(crate::throttle::forward_full(up, req)
            .await
            .unwrap_or_else(|e| {
                error(
                    StatusCode::BAD_GATEWAY,
                    "InternalFailure",
                    &format!("Auto Scaling emulator: upstream {up}: {e}"),
                )
            }));
    }
    Ok(answer(&shared, &parts, &body, &action, &form))
}

/// Checks and serves one call of [`SERVED`]; the call is logged.
fn answer(
    shared: &Shared,
    parts: &hyper::http::request::Parts,
    body: &[u8],
    action: &str,
    form: &BTreeMap<String, String>,
) -> Resp {
    let get = |k: &str| form.get(k).cloned();
    let mut call = AsgCall {
        action: action.to_string(),
        instance_id: get("InstanceId"),
        hook: get("LifecycleHookName"),
        group: get("AutoScalingGroupName"),
        result: get("LifecycleActionResult"),
        status: 200,
        error: None,
    };
    let mut s = lock(shared);
    let out = serve(&mut s, parts, body, action, form);
    match &out {
        Ok(()) => {}
        Err((status, code, _)) => {
            call.status = status.as_u16();
            call.error = Some((*code).to_string());
        }
    }
    s.log.push(call);
    drop(s);
    match out {
        Ok(()) => success(action),
        Err((status, code, message)) => error(status, code, &message),
    }
}

type Refusal = (StatusCode, &'static str, String);

fn serve(
    s: &mut State,
    parts: &hyper::http::request::Parts,
    body: &[u8],
    action: &str,
    form: &BTreeMap<String, String>,
) -> Result<(), Refusal> {
    let forbidden = |code: &'static str, m: &str| Err((StatusCode::FORBIDDEN, code, m.to_string()));
    let invalid = |m: String| Err((StatusCode::BAD_REQUEST, "ValidationError", m));
    let Some(auth) = header(&parts.headers, "authorization") else {
        return forbidden(
            "MissingAuthenticationToken",
            "Request is missing Authentication Token",
        );
    };
    let Some(sig) = parse_authorization(auth) else {
        return forbidden(
            "IncompleteSignature",
            "Authorization header requires 'Credential', 'Signature' and 'SignedHeaders' parameters.",
        );
    };
    if sig.service != "autoscaling" {
        return forbidden(
            "IncompleteSignature",
            &format!(
                "Credential should be scoped to correct service: 'autoscaling'; got '{}'.",
                sig.service
            ),
        );
    }
    if !s.credentials.is_empty() {
        let Some(secret) = s.credentials.get(sig.access_key_id) else {
            return forbidden(
                "InvalidClientTokenId",
                "The security token included in the request is invalid.",
            );
        };
        if expected_signature(parts, body, &sig, secret).as_deref() != Some(sig.signature) {
            return forbidden(
                "SignatureDoesNotMatch",
                "The request signature we calculated does not match the signature you provided.",
            );
        }
    }
    if form.get("Version").map(String::as_str) != Some(VERSION) {
        return invalid(format!(
            "Version {} is not supported; Auto Scaling's is {VERSION}",
            form.get("Version").map_or("(none)", String::as_str)
        ));
    }
    let hook = form.get("LifecycleHookName").cloned().unwrap_or_default();
    let group = form
        .get("AutoScalingGroupName")
        .cloned()
        .unwrap_or_default();
    if hook.is_empty() || hook.len() > 255 {
        return invalid(
            "1 validation error detected: Value at 'lifecycleHookName' failed to satisfy \
             constraint: Member must have length between 1 and 255"
                .into(),
        );
    }
    if group.is_empty() || group.len() > 1600 {
        return invalid(
            "1 validation error detected: Value at 'autoScalingGroupName' failed to satisfy \
             constraint: Member must have length between 1 and 1600"
                .into(),
        );
    }
    let instance = form.get("InstanceId").cloned();
    let token = form.get("LifecycleActionToken").cloned();
    if let Some(t) = &token {
        if t.len() != 36 {
            return invalid(
                "1 validation error detected: Value at 'lifecycleActionToken' failed to \
                 satisfy constraint: Member must have length between 36 and 36"
                    .into(),
            );
        }
    }
    if instance.is_none() && token.is_none() {
        return invalid("Either InstanceId or LifecycleActionToken must be specified".into());
    }
    let result = form.get("LifecycleActionResult").cloned();
    if action == "CompleteLifecycleAction" {
        match result.as_deref() {
            Some("CONTINUE" | "ABANDON") => {}
            Some(other) => {
                return invalid(format!(
                    "Invalid LifecycleActionResult '{other}': expected CONTINUE or ABANDON"
                ))
            }
            None => {
                return invalid(
                    "1 validation error detected: Value null at 'lifecycleActionResult' failed \
                     to satisfy constraint: Member must not be null"
                        .into(),
                )
            }
        }
    }
    let who = instance.clone().unwrap_or_default();
    if s.denied.contains(&(who.clone(), action.to_string())) {
        return forbidden(
            "AccessDenied",
            &format!(
                "User: arn:aws:sts::{ACCOUNT_ID}:assumed-role/node-role/{who} is not authorized \
                 to perform: autoscaling:{action} on resource: \
                 arn:aws:autoscaling:us-east-1:{ACCOUNT_ID}:autoScalingGroup:*:autoScalingGroupName/{group} \
                 because no identity-based policy allows the autoscaling:{action} action"
            ),
        );
    }
    let now = Instant::now();
    s.expire(now);
    let found = s.actions.iter_mut().find(|a| {
        a.outcome == ActionOutcome::Waiting
            && a.action.hook == hook
            && a.action.group == group
            && instance.as_ref().is_none_or(|i| *i == a.action.instance_id)
            && token.as_ref().is_none_or(|t| *t == a.token)
    });
    let Some(a) = found else {
        let message = match (&instance, &token) {
            (Some(i), _) => format!("No active Lifecycle Action found with instance ID {i}"),
            (None, Some(t)) => format!("No active Lifecycle Action found with token {t}"),
            (None, None) => "No active Lifecycle Action found".into(),
        };
        return invalid(message);
    };
    if action == "CompleteLifecycleAction" {
        a.outcome = ActionOutcome::Completed(result.unwrap_or_default());
    } else {
        a.heartbeats += 1;
        a.deadline = now + a.action.heartbeat_timeout;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn forms_decode_plus_and_percent() {
        let f = parse_form(
            "Action=CompleteLifecycleAction&Version=2011-01-01&LifecycleHookName=my+hook%2F1&X=",
        );
        assert_eq!(f["LifecycleHookName"], "my hook/1");
        assert_eq!(f["X"], "");
        assert_eq!(f["Version"], VERSION);
    }

    #[test]
    fn tokens_are_36_characters() {
        assert_eq!(request_id().len(), 36);
    }
}
