//! The registration emulator with the service's own SDK (`aws-sdk-pcs`) as the client, and
//! credentials from the IMDS emulator through aws-config's IMDS credentials provider: the
//! request the SDK builds (awsJson1_0, SigV4 for `pcs`) is accepted, the answer parses into
//! the SDK's output shape, and the errors map to the model's error types.
#![allow(clippy::unwrap_used)]

use aws_sdk_pcs::operation::register_compute_node_group_instance::RegisterComputeNodeGroupInstanceError as E;
use imds_emulator::pcs::{PcsCluster, PcsEmulator, PcsEndpoint, PcsFault, PcsGroup, PcsInstance};
use imds_emulator::{Config, Emulator};

fn world(instance: &str, key: &str) -> (Emulator, PcsEmulator) {
    let imds = Emulator::start(Config::default()).unwrap();
    imds.set("instance-id", instance);
    imds.set_role_credentials(
        "AWSPCS-node",
        key,
        "secret-of-the-role",
        &format!("token-{instance}"),
        "2099-01-01T00:00:00Z",
    );
    let pcs = PcsEmulator::start().unwrap();
    pcs.add_cluster(PcsCluster {
        id: "pcs_abc123".into(),
        name: "demo".into(),
        region: "us-east-1".into(),
        shared_secret: "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3JldC0hIQ==".into(),
        endpoints: vec![PcsEndpoint {
            endpoint_type: "SLURMCTLD".into(),
            private_ip_address: "10.0.0.10".into(),
            port: "6817".into(),
        }],
        groups: vec![PcsGroup {
            id: "pcs_grp1".into(),
            name: "compute".into(),
            nodes: vec!["compute-1".into(), "compute-2".into()],
            lifecycle_actions: Some(serde_json::json!({
                "scriptCachingPolicy": "CACHE_ONCE",
                "stages": {"nodeReady": [{
                    "name": "hello",
                    "scriptSource": {"scriptLocation": "s3://b/k", "checksum": "00"},
                    "executionPolicy": "EVERY_BOOT",
                    "onError": "CONTINUE"
                }]}
            })),
        }],
    });
    pcs.add_instance(PcsInstance {
        instance_id: instance.into(),
        role: "AWSPCS-node".into(),
        access_key_id: key.into(),
        secret_access_key: "secret-of-the-role".into(),
        session_token: Some(format!("token-{instance}")),
        cluster_id: "pcs_abc123".into(),
        group_id: "pcs_grp1".into(),
    });
    (imds, pcs)
}

async fn client(imds: &Emulator, pcs: &PcsEmulator, region: &str) -> aws_sdk_pcs::Client {
    let imds_client = aws_config::imds::Client::builder()
        .endpoint(imds.endpoint())
        .unwrap()
        .build();
    let creds = aws_config::imds::credentials::ImdsCredentialsProvider::builder()
        .imds_client(imds_client)
        .build();
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(region.to_string()))
        .credentials_provider(creds)
        .retry_config(aws_config::retry::RetryConfig::disabled())
        .endpoint_url(pcs.endpoint())
        .load()
        .await;
    aws_sdk_pcs::Client::new(&sdk)
}

#[tokio::test]
async fn sdk_registers_and_gets_the_same_node_again() {
    let (imds, pcs) = world("i-0aaa", "ASIAAAA");
    let c = client(&imds, &pcs, "us-east-1").await;
    let out = c
        .register_compute_node_group_instance()
        .cluster_identifier("pcs_abc123")
        .bootstrap_id("0123456789abcdef")
        .send()
        .await
        .unwrap();
    assert_eq!(out.node_id(), "compute-1");
    assert_eq!(out.cluster_name(), Some("demo"));
    assert_eq!(out.compute_node_group_id(), Some("pcs_grp1"));
    assert_eq!(out.compute_node_group_name(), Some("compute"));
    let ep = &out.endpoints()[0];
    assert_eq!(ep.r#type().as_str(), "SLURMCTLD");
    assert_eq!(ep.private_ip_address(), "10.0.0.10");
    assert_eq!(ep.port(), "6817");
    let actions = out.node_lifecycle_actions().unwrap();
    let ready = actions.stages().unwrap().node_ready();
    assert_eq!(ready[0].name(), "hello");
    // The secret never shows in Debug.
    assert!(!format!("{out:?}").contains("c2VjcmV0"));
    assert_eq!(
        out.shared_secret(),
        "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3JldC0hIQ=="
    );

    // By name too, and the same node for the same instance.
    let again = c
        .register_compute_node_group_instance()
        .cluster_identifier("demo")
        .bootstrap_id("0123456789abcdef")
        .send()
        .await
        .unwrap();
    assert_eq!(again.node_id(), "compute-1");
    let r = pcs.requests();
    assert_eq!(r.len(), 2);
    assert_eq!(r[0].instance_id.as_deref(), Some("i-0aaa"));
    assert_eq!(r[0].access_key_id.as_deref(), Some("ASIAAAA"));
    assert_eq!(r[0].bootstrap_id.as_deref(), Some("0123456789abcdef"));
    assert_eq!(r[0].status, 200);
    assert_eq!(pcs.assignments()["i-0aaa"], "compute-1");
}

#[tokio::test]
async fn errors_map_to_the_model() {
    let (imds, pcs) = world("i-0bbb", "ASIABBB");
    let c = client(&imds, &pcs, "us-east-1").await;
    let send = |cluster: &'static str, bootstrap: &'static str| {
        c.register_compute_node_group_instance()
            .cluster_identifier(cluster)
            .bootstrap_id(bootstrap)
            .send()
    };

    pcs.set_allowed("i-0bbb", false);
    let e = send("pcs_abc123", "b1")
        .await
        .unwrap_err()
        .into_service_error();
    assert!(matches!(e, E::AccessDeniedException(_)), "{e:?}");
    assert!(
        format!("{e}").contains("assumed-role/AWSPCS-node/i-0bbb"),
        "{e}"
    );
    pcs.set_allowed("i-0bbb", true);

    let e = send("pcs_other", "b1")
        .await
        .unwrap_err()
        .into_service_error();
    assert!(matches!(e, E::AccessDeniedException(_)), "{e:?}");

    pcs.fail_next(PcsFault::InternalServer, 1);
    pcs.fail_next(PcsFault::Throttling, 1);
    let e = send("pcs_abc123", "b1")
        .await
        .unwrap_err()
        .into_service_error();
    assert!(matches!(e, E::InternalServerException(_)), "{e:?}");
    let e = send("pcs_abc123", "b1")
        .await
        .unwrap_err()
        .into_service_error();
    assert_eq!(
        aws_sdk_pcs::error::ProvideErrorMetadata::code(&e),
        Some("ThrottlingException")
    );

    let e = send("pcs_abc123", "has space")
        .await
        .unwrap_err()
        .into_service_error();
    assert_eq!(
        aws_sdk_pcs::error::ProvideErrorMetadata::code(&e),
        Some("ValidationException")
    );
    let e = send("1bad", "b1").await.unwrap_err().into_service_error();
    assert_eq!(
        aws_sdk_pcs::error::ProvideErrorMetadata::code(&e),
        Some("ValidationException")
    );

    assert_eq!(
        send("pcs_abc123", "b1").await.unwrap().node_id(),
        "compute-1"
    );
    let errors: Vec<Option<String>> = pcs.requests().into_iter().map(|r| r.error).collect();
    assert_eq!(
        errors,
        [
            Some("AccessDeniedException".into()),
            Some("AccessDeniedException".into()),
            Some("InternalServerException".into()),
            Some("ThrottlingException".into()),
            Some("ValidationException".into()),
            Some("ValidationException".into()),
            None
        ]
    );
}

#[tokio::test]
async fn a_wrong_secret_or_region_is_refused() {
    let (imds, pcs) = world("i-0ccc", "ASIACCC");
    // Same access key, another secret: the signature does not match.
    imds.set_role_credentials(
        "AWSPCS-node",
        "ASIACCC",
        "not-the-secret",
        "token-i-0ccc",
        "2099-01-01T00:00:00Z",
    );
    let c = client(&imds, &pcs, "us-east-1").await;
    let e = c
        .register_compute_node_group_instance()
        .cluster_identifier("pcs_abc123")
        .bootstrap_id("b")
        .send()
        .await
        .unwrap_err()
        .into_service_error();
    assert_eq!(
        aws_sdk_pcs::error::ProvideErrorMetadata::code(&e),
        Some("InvalidSignatureException")
    );

    let (imds, pcs) = world("i-0ddd", "ASIADDD");
    let c = client(&imds, &pcs, "eu-west-1").await;
    let e = c
        .register_compute_node_group_instance()
        .cluster_identifier("pcs_abc123")
        .bootstrap_id("b")
        .send()
        .await
        .unwrap_err()
        .into_service_error();
    assert!(matches!(e, E::AccessDeniedException(_)), "{e:?}");
}
