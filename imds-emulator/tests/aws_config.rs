//! Compatibility with aws-config's IMDS client, which the agent uses: token flow, TTL
//! header, and its retry of a 401 (it refreshes the token and tries again).
#![allow(clippy::unwrap_used)]

use imds_emulator::{Config, Emulator, Fault, FaultTarget};

#[tokio::test]
async fn aws_config_imds_client_reads_metadata_and_retries_a_401() {
    let emu = Emulator::start(Config::default()).unwrap();
    let client = aws_config::imds::Client::builder()
        .endpoint(emu.endpoint())
        .unwrap()
        .build();

    let id = client.get("/latest/meta-data/instance-id").await.unwrap();
    assert_eq!(id.as_ref(), "i-1234567890abcdef0");
    let requests = emu.requests();
    assert_eq!(requests[0].method, "PUT");
    assert_eq!(requests[0].path, "/latest/api/token");
    assert_eq!(requests[0].status, Some(200));

    emu.inject(Fault::status(401).on(FaultTarget::Get).times(1));
    let region = client
        .get("/latest/meta-data/placement/region")
        .await
        .unwrap();
    assert_eq!(region.as_ref(), "us-east-1");
    let statuses: Vec<_> = emu
        .requests()
        .iter()
        .filter(|r| r.path == "/latest/meta-data/placement/region")
        .map(|r| r.status)
        .collect();
    assert_eq!(statuses, vec![Some(401), Some(200)]);

    emu.set_tag("slurm:partition", "gpu");
    let tags = client.get("/latest/meta-data/tags/instance").await.unwrap();
    assert_eq!(tags.as_ref(), "Name\nTest\nslurm:partition");

    // Absent paths are errors the client does not retry.
    let before = emu.request_count();
    let err = client
        .get("/latest/meta-data/spot/instance-action")
        .await
        .unwrap_err();
    assert!(format!("{err:?}").contains("404"), "{err:?}");
    assert_eq!(emu.request_count(), before + 1);
}

/// Pins a fact the agent must work around: aws-config's IMDS client retries a 401 with
/// the token it has cached (it does not drop the token on 401), so when the service
/// forgets its tokens early, that client keeps failing until the cached token's own TTL
/// runs out; a new client fetches a new token.
#[tokio::test]
async fn aws_config_imds_client_keeps_its_cached_token_after_a_401() {
    let emu = Emulator::start(Config::default()).unwrap();
    let build = || {
        aws_config::imds::Client::builder()
            .endpoint(emu.endpoint())
            .unwrap()
            .build()
    };
    let client = build();
    client.get("/latest/meta-data/ami-id").await.unwrap();
    emu.expire_tokens();
    let err = client.get("/latest/meta-data/ami-id").await.unwrap_err();
    assert!(format!("{err:?}").contains("401"), "{err:?}");
    let puts = emu.requests().iter().filter(|r| r.method == "PUT").count();
    assert_eq!(puts, 1, "the stale client asked for no new token");

    let ami = build().get("/latest/meta-data/ami-id").await.unwrap();
    assert_eq!(ami.as_ref(), "ami-0a887e401f7654935");
    let puts = emu.requests().iter().filter(|r| r.method == "PUT").count();
    assert_eq!(puts, 2);
}
