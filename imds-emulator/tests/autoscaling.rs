//! The Auto Scaling lifecycle-action emulator with the service's own SDK as the client:
//! heartbeats restart the timeout, completion ends the action, and the errors are those of
//! AWS's API reference (`ValidationError`, `AccessDenied`, `SignatureDoesNotMatch`).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use aws_sdk_autoscaling::error::ProvideErrorMetadata;
use imds_emulator::autoscaling::{ActionOutcome, AutoScalingEmulator, LifecycleAction};

const INSTANCE: &str = "i-0abc1234567890def";

async fn client(emu: &AutoScalingEmulator, secret: &str) -> aws_sdk_autoscaling::Client {
    let creds = aws_sdk_autoscaling::config::Credentials::new("AKIDASG", secret, None, None, "t");
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(creds)
        .endpoint_url(emu.endpoint())
        .retry_config(aws_config::retry::RetryConfig::disabled())
        .load()
        .await;
    aws_sdk_autoscaling::Client::new(&sdk)
}

/// `CompleteLifecycleAction` of `INSTANCE` for hook `h` of group `g` with `result`:
/// Auto Scaling's error code and message when refused.
async fn complete(
    c: &aws_sdk_autoscaling::Client,
    result: &str,
) -> Result<(), (Option<String>, Option<String>)> {
    c.complete_lifecycle_action()
        .auto_scaling_group_name("g")
        .lifecycle_hook_name("h")
        .instance_id(INSTANCE)
        .lifecycle_action_result(result)
        .send()
        .await
        .map(drop)
        .map_err(|e| {
            (
                e.code().map(str::to_string),
                e.message().map(str::to_string),
            )
        })
}

/// `RecordLifecycleActionHeartbeat` of `INSTANCE` for hook `h` of group `g`: Auto
/// Scaling's error code and message when refused.
async fn heartbeat(
    c: &aws_sdk_autoscaling::Client,
) -> Result<(), (Option<String>, Option<String>)> {
    c.record_lifecycle_action_heartbeat()
        .auto_scaling_group_name("g")
        .lifecycle_hook_name("h")
        .instance_id(INSTANCE)
        .send()
        .await
        .map(drop)
        .map_err(|e| {
            (
                e.code().map(str::to_string),
                e.message().map(str::to_string),
            )
        })
}

fn action(timeout: Duration) -> LifecycleAction {
    LifecycleAction {
        instance_id: INSTANCE.into(),
        group: "g".into(),
        hook: "h".into(),
        heartbeat_timeout: timeout,
        default_result: "ABANDON".into(),
    }
}

#[tokio::test]
async fn heartbeats_then_continue_and_then_no_active_action() {
    let emu = AutoScalingEmulator::start(None).unwrap();
    emu.set_credentials("AKIDASG", "secret");
    emu.begin(action(Duration::from_secs(60)));
    let c = client(&emu, "secret").await;
    for _ in 0..2 {
        heartbeat(&c).await.unwrap();
    }
    assert_eq!(emu.heartbeats(INSTANCE, "h"), 2);
    complete(&c, "CONTINUE").await.unwrap();
    assert_eq!(
        emu.outcome(INSTANCE, "h"),
        Some(ActionOutcome::Completed("CONTINUE".into()))
    );
    // Over: a second completion is a ValidationError naming the instance.
    let (code, message) = complete(&c, "CONTINUE").await.unwrap_err();
    assert_eq!(code.as_deref(), Some("ValidationError"));
    assert_eq!(
        message,
        Some(format!(
            "No active Lifecycle Action found with instance ID {INSTANCE}"
        ))
    );
}

#[tokio::test]
async fn a_timed_out_action_a_bad_result_a_denial_and_a_wrong_secret_are_refused() {
    let emu = AutoScalingEmulator::start(None).unwrap();
    emu.set_credentials("AKIDASG", "secret");
    emu.begin(action(Duration::ZERO));
    let c = client(&emu, "secret").await;
    let (code, _) = heartbeat(&c).await.unwrap_err();
    assert_eq!(code.as_deref(), Some("ValidationError"));
    assert_eq!(
        emu.outcome(INSTANCE, "h"),
        Some(ActionOutcome::TimedOut("ABANDON".into()))
    );

    emu.begin(action(Duration::from_secs(60)));
    let (code, _) = complete(&c, "MAYBE").await.unwrap_err();
    assert_eq!(code.as_deref(), Some("ValidationError"));

    emu.deny(INSTANCE, "CompleteLifecycleAction", true);
    let (code, message) = complete(&c, "CONTINUE").await.unwrap_err();
    assert_eq!(code.as_deref(), Some("AccessDenied"));
    assert!(message
        .unwrap()
        .contains("autoscaling:CompleteLifecycleAction"));

    let wrong = client(&emu, "not-the-secret").await;
    let (code, _) = heartbeat(&wrong).await.unwrap_err();
    assert_eq!(code.as_deref(), Some("SignatureDoesNotMatch"));
    assert_eq!(emu.outcome(INSTANCE, "h"), Some(ActionOutcome::Waiting));
    assert_eq!(emu.calls().len(), 4);
}
