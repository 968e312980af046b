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
        c.record_lifecycle_action_heartbeat()
            .auto_scaling_group_name("g")
            .lifecycle_hook_name("h")
            .instance_id(INSTANCE)
            .send()
            .await
            .unwrap();
    }
    assert_eq!(emu.heartbeats(INSTANCE, "h"), 2);
    c.complete_lifecycle_action()
        .auto_scaling_group_name("g")
        .lifecycle_hook_name("h")
        .instance_id(INSTANCE)
        .lifecycle_action_result("CONTINUE")
        .send()
        .await
        .unwrap();
    assert_eq!(
        emu.outcome(INSTANCE, "h"),
        Some(ActionOutcome::Completed("CONTINUE".into()))
    );
    // Over: a second completion is a ValidationError naming the instance.
    let e = c
        .complete_lifecycle_action()
        .auto_scaling_group_name("g")
        .lifecycle_hook_name("h")
        .instance_id(INSTANCE)
        .lifecycle_action_result("CONTINUE")
        .send()
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("ValidationError"));
    assert_eq!(
        e.message(),
        Some(format!("No active Lifecycle Action found with instance ID {INSTANCE}").as_str())
    );
}

#[tokio::test]
async fn a_timed_out_action_a_bad_result_a_denial_and_a_wrong_secret_are_refused() {
    let emu = AutoScalingEmulator::start(None).unwrap();
    emu.set_credentials("AKIDASG", "secret");
    emu.begin(action(Duration::ZERO));
    let c = client(&emu, "secret").await;
    let e = c
        .record_lifecycle_action_heartbeat()
        .auto_scaling_group_name("g")
        .lifecycle_hook_name("h")
        .instance_id(INSTANCE)
        .send()
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("ValidationError"));
    assert_eq!(
        emu.outcome(INSTANCE, "h"),
        Some(ActionOutcome::TimedOut("ABANDON".into()))
    );

    emu.begin(action(Duration::from_secs(60)));
    let e = c
        .complete_lifecycle_action()
        .auto_scaling_group_name("g")
        .lifecycle_hook_name("h")
        .instance_id(INSTANCE)
        .lifecycle_action_result("MAYBE")
        .send()
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("ValidationError"));

    emu.deny(INSTANCE, "CompleteLifecycleAction", true);
    let e = c
        .complete_lifecycle_action()
        .auto_scaling_group_name("g")
        .lifecycle_hook_name("h")
        .instance_id(INSTANCE)
        .lifecycle_action_result("CONTINUE")
        .send()
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("AccessDenied"));
    assert!(e
        .message()
        .unwrap()
        .contains("autoscaling:CompleteLifecycleAction"));

    let wrong = client(&emu, "not-the-secret").await;
    let e = wrong
        .record_lifecycle_action_heartbeat()
        .auto_scaling_group_name("g")
        .lifecycle_hook_name("h")
        .instance_id(INSTANCE)
        .send()
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("SignatureDoesNotMatch"));
    assert_eq!(emu.outcome(INSTANCE, "h"), Some(ActionOutcome::Waiting));
    assert_eq!(emu.calls().len(), 4);
}
