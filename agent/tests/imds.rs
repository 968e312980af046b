//! The agent's IMDSv2 client against the IMDS emulator: identity, tags, user data, token
//! refresh, and every failure mode the bootstrap issue lists, each ending in an error that
//! names the path after bounded retries.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use imds_emulator::{Config, Emulator, Fault, FaultTarget};
use slurm_node_agent::imds::ImdsSettings;
use slurm_node_agent::imds::{Imds, ImdsError};
use slurm_node_agent::section::HumanDuration;

fn client(endpoint: &str, attempts: i64, timeout_ms: u64) -> Imds {
    let s = ImdsSettings {
        endpoint: endpoint.to_string(),
        attempts,
        timeout: HumanDuration(Duration::from_millis(timeout_ms)),
        ..Default::default()
    };
    Imds::new(&s)
}

#[tokio::test]
async fn reads_identity_tags_and_user_data() {
    let emu = Emulator::start(Config::default()).unwrap();
    emu.clear_tags();
    emu.set_tag("slurm-node-agent:node.name", "gpu-001");
    emu.set_tag("Team", "hpc");
    emu.set("instance-life-cycle", "spot");
    let id = client(&emu.endpoint(), 2, 1000).identity().await.unwrap();
    assert!(id.instance_id.starts_with("i-"), "{id:?}");
    assert_eq!(id.instance_type, "m4.xlarge");
    assert_eq!(id.region, "us-east-1");
    assert_eq!(id.availability_zone, "us-east-1a");
    assert!(id.spot);
    assert_eq!(
        id.tags.get("slurm-node-agent:node.name").unwrap(),
        "gpu-001"
    );
    assert_eq!(id.tags.len(), 2);
    assert!(id.user_data.is_some());
    // Every GET carried a token: no request was answered 401.
    assert!(emu.requests().iter().all(|r| r.status != Some(401)));
}

#[tokio::test]
async fn no_tags_in_metadata_and_no_user_data() {
    let emu = Emulator::start(Config::default()).unwrap();
    emu.clear_tags();
    emu.clear_user_data();
    let id = client(&emu.endpoint(), 2, 1000).identity().await.unwrap();
    assert!(id.tags.is_empty());
    assert_eq!(id.user_data, None);
}

#[tokio::test]
async fn a_forgotten_token_is_replaced() {
    let emu = Emulator::start(Config::default()).unwrap();
    let imds = client(&emu.endpoint(), 2, 1000);
    imds.get("/latest/meta-data/instance-id").await.unwrap();
    let puts_before = emu.requests().iter().filter(|r| r.method == "PUT").count();
    emu.expire_tokens();
    imds.get("/latest/meta-data/instance-id").await.unwrap();
    let puts_after = emu.requests().iter().filter(|r| r.method == "PUT").count();
    assert!(puts_after > puts_before, "no new token requested after 401");
}

#[tokio::test]
async fn a_missing_path_is_none_and_a_required_one_names_the_path() {
    let emu = Emulator::start(Config::default()).unwrap();
    let imds = client(&emu.endpoint(), 2, 1000);
    assert_eq!(
        imds.get_optional("/latest/meta-data/spot/instance-action")
            .await
            .unwrap(),
        None
    );
    let e = imds.get("/latest/meta-data/nope").await.unwrap_err();
    assert_eq!(e.status(), Some(404));
    assert!(e.to_string().contains("/latest/meta-data/nope"), "{e}");
}

async fn fails_naming_the_path(emu: &Emulator, attempts: i64, timeout_ms: u64) -> ImdsError {
    let imds = client(&emu.endpoint(), attempts, timeout_ms);
    let e = imds.get("/latest/meta-data/instance-id").await.unwrap_err();
    assert!(
        e.to_string().contains("/latest/meta-data/instance-id"),
        "error does not name the path: {e}"
    );
    e
}

#[tokio::test]
async fn every_get_answered_401_ends_in_an_error() {
    let emu = Emulator::start(Config::default()).unwrap();
    emu.inject(Fault::status(401).on(FaultTarget::Get));
    let e = fails_naming_the_path(&emu, 2, 1000).await;
    assert_eq!(e.status(), Some(401));
    // Bounded: two attempts, a new token, two attempts again.
    let gets = emu.requests().iter().filter(|r| r.method == "GET").count();
    assert_eq!(gets, 4);
}

#[tokio::test]
async fn token_refused_ends_in_a_token_error() {
    let emu = Emulator::start(Config::default()).unwrap();
    emu.inject(Fault::status(403).on(FaultTarget::Token));
    let e = fails_naming_the_path(&emu, 2, 1000).await;
    assert!(matches!(e, ImdsError::Token { .. }), "{e:?}");
    // Never a fallback to IMDSv1 (a GET without a token), even where v1 would answer.
    emu.set_allow_imdsv1(true);
    let _ = fails_naming_the_path(&emu, 2, 1000).await;
    assert!(
        emu.requests().iter().all(|r| r.method != "GET"),
        "{:?}",
        emu.requests()
    );
}

#[tokio::test]
async fn throttling_and_server_errors_are_retried_then_reported() {
    for status in [429u16, 500, 503] {
        let emu = Emulator::start(Config::default()).unwrap();
        // Two failures, then success: retried through.
        emu.inject(Fault::status(status).on(FaultTarget::Get).times(2));
        let imds = client(&emu.endpoint(), 3, 1000);
        imds.get("/latest/meta-data/instance-id").await.unwrap();
        // Always failing: an error naming the path and the status, after exactly 3 tries.
        emu.clear_faults();
        emu.inject(Fault::status(status).on(FaultTarget::Get));
        let before = emu.requests().len();
        let e = fails_naming_the_path(&emu, 3, 1000).await;
        assert_eq!(e.status(), Some(status), "{e}");
        let gets = emu.requests()[before..]
            .iter()
            .filter(|r| r.method == "GET")
            .count();
        assert_eq!(gets, 3, "status {status}");
    }
}

#[tokio::test]
async fn a_slow_service_times_out() {
    let emu = Emulator::start(Config::default()).unwrap();
    emu.inject(Fault::delay(Duration::from_secs(30)).on(FaultTarget::Get));
    let start = Instant::now();
    let e = fails_naming_the_path(&emu, 2, 200).await;
    assert!(matches!(e, ImdsError::Unreachable { .. }), "{e:?}");
    // Not a timing assertion on speed: only that it gave up long before the 30 s answer.
    assert!(start.elapsed() < Duration::from_secs(25));
}

#[tokio::test]
async fn dropped_connections_and_no_service_are_unreachable() {
    let emu = Emulator::start(Config::default()).unwrap();
    emu.inject(Fault::drop_connection().on(FaultTarget::Get));
    let e = fails_naming_the_path(&emu, 2, 1000).await;
    assert!(matches!(e, ImdsError::Unreachable { .. }), "{e:?}");

    // Nothing listening at all.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let imds = client(&format!("http://127.0.0.1:{port}"), 2, 300);
    let e = imds.get("/latest/meta-data/instance-id").await.unwrap_err();
    assert!(
        e.to_string().contains("/latest/meta-data/instance-id"),
        "{e}"
    );
}

#[tokio::test]
async fn binary_user_data_is_read_as_served() {
    let emu = Emulator::start(Config::default()).unwrap();
    // A gzip header and bytes that are not UTF-8: aws-config's text client refuses them.
    let bytes = vec![0x1f, 0x8b, 0x08, 0x00, 0xff, 0xfe, 0x00, 0x01];
    emu.set_user_data(bytes.clone());
    let id = client(&emu.endpoint(), 2, 1000).identity().await.unwrap();
    assert_eq!(id.user_data, Some(bytes));
    assert!(!id.instance_id.is_empty());
    // Every user data GET carried a token (IMDSv2 only).
    assert!(emu.requests().iter().all(|r| r.status != Some(401)));
}

fn user_data_gets(emu: &Emulator) -> usize {
    emu.requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path == "/latest/user-data")
        .count()
}

#[tokio::test]
async fn user_data_bytes_are_retried_refreshed_and_named_on_failure() {
    const UD: &str = "/latest/user-data";
    let emu = Emulator::start(Config::default()).unwrap();
    emu.set_user_data(vec![0xffu8; 3]);
    let imds = client(&emu.endpoint(), 3, 1000);
    // Throttled and failing twice, then served.
    emu.inject(Fault::status(429).on(FaultTarget::Get).times(1));
    emu.inject(Fault::status(503).on(FaultTarget::Get).times(1));
    assert_eq!(
        imds.get_bytes_optional(UD).await.unwrap(),
        Some(vec![0xff; 3])
    );
    assert_eq!(user_data_gets(&emu), 3);
    // A token the service forgot: a new one, and the data.
    emu.clear_faults();
    emu.expire_tokens();
    assert!(imds.get_bytes_optional(UD).await.unwrap().is_some());
    // Always 401: bounded (three tries, a new token, three tries), an error naming the path.
    emu.inject(Fault::status(401).on(FaultTarget::Get));
    let before = user_data_gets(&emu);
    let e = imds.get_bytes_optional(UD).await.unwrap_err();
    assert_eq!(e.status(), Some(401), "{e}");
    assert!(e.to_string().contains(UD), "{e}");
    assert_eq!(user_data_gets(&emu) - before, 6);
    // The token refused: a token error, never a GET without a token.
    emu.clear_faults();
    emu.inject(Fault::status(403).on(FaultTarget::Token));
    let before = user_data_gets(&emu);
    let e = imds.get_bytes_optional(UD).await.unwrap_err();
    assert!(matches!(e, ImdsError::Token { .. }), "{e:?}");
    assert_eq!(user_data_gets(&emu), before);
    // None at all: 404 is no user data.
    emu.clear_faults();
    emu.clear_user_data();
    assert_eq!(imds.get_bytes_optional(UD).await.unwrap(), None);
    // Nothing listening: unreachable, naming the path.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let e = client(&format!("http://127.0.0.1:{port}"), 2, 300)
        .get_bytes_optional(UD)
        .await
        .unwrap_err();
    assert!(matches!(e, ImdsError::Unreachable { .. }), "{e:?}");
    assert!(e.to_string().contains(UD), "{e}");
}
