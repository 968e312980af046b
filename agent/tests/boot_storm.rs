//! Boot storms (issue 25 §1): the throttling front (`imds_emulator::throttle`) answers as
//! AWS does once an API's quota is spent, and the agent's key fetch (against moto behind
//! it) and PCS registration (against the registration emulator behind it) stop with the
//! API and the quota named when the quota is zero, having logged the throttle once; a
//! registration whose early attempt was throttled asks once more, after a spread wait.

#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use imds_emulator::throttle::{Front, FrontConfig, Quota};
use slurm_e2e::moto::{self, Moto, REGION};
use slurm_node_agent::authkey::{self, KeyError, KeySource};
use slurm_node_agent::retry::ThrottlePolicy;

fn front(moto: &Moto, quotas: Vec<Quota>) -> Front {
    Front::start(FrontConfig {
        moto: format!("127.0.0.1:{}", moto.port()).parse().unwrap(),
        pcs: None,
        quotas,
    })
    .unwrap()
}

fn port(front: &Front) -> u16 {
    front
        .endpoint()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn the_front_throttles_as_aws_once_the_quota_is_spent() {
    let moto = Moto::start().unwrap();
    moto.put_secure_string("/storm/k", "value").unwrap();
    moto.create_bucket("storm", false).unwrap();
    moto.put_object("storm", "scripts/a.sh", b"#!/bin/sh\n")
        .unwrap();
    // A bucket of one request that refills once in 1,000 s: the first served, the second
    // throttled, whatever the pace; S3 at zero: always SlowDown.
    let f = front(
        &moto,
        vec![
            Quota::ssm_standard(0.001),
            Quota::new("S3 GET", &["s3:GetObject"], 0.0),
        ],
    );
    let auth = format!(
        "AWS4-HMAC-SHA256 Credential=testing/20240101/{REGION}/ssm/aws4_request, \
         SignedHeaders=content-type;host;x-amz-target, Signature=0"
    );
    let get = || {
        moto::request(
            port(&f),
            "POST",
            "/",
            &[
                ("Content-Type", "application/x-amz-json-1.1"),
                ("X-Amz-Target", "AmazonSSM.GetParameter"),
                ("Authorization", &auth),
            ],
            br#"{"Name":"/storm/k","WithDecryption":true}"#,
        )
        .unwrap()
    };
    let (status, _, body) = get();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("\"value\""));
    let (status, headers, body) = get();
    assert_eq!(status, 400);
    assert_eq!(
        String::from_utf8_lossy(&body),
        r#"{"__type":"ThrottlingException","message":"Rate exceeded"}"#
    );
    assert!(headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("x-amzn-errortype") && v == "ThrottlingException"));

    let s3_auth = format!(
        "AWS4-HMAC-SHA256 Credential=testing/20240101/{REGION}/s3/aws4_request, \
         SignedHeaders=host, Signature=0"
    );
    let (status, _, body) = moto::request(
        port(&f),
        "GET",
        "/storm/scripts/a.sh",
        &[("Authorization", &s3_auth)],
        b"",
    )
    .unwrap();
    assert_eq!(status, 503);
    let body = String::from_utf8_lossy(&body);
    assert!(
        body.contains("<Code>SlowDown</Code>")
            && body.contains("<Message>Please reduce your request rate.</Message>"),
        "{body}"
    );

    let stats = f.stats();
    assert_eq!(stats["ssm:GetParameter"].served, 1);
    assert_eq!(stats["ssm:GetParameter"].throttled, 1);
    assert_eq!(stats["s3:GetObject"].throttled, 1);
    assert_eq!(stats["s3:GetObject"].served, 0);
}

/// The process environment that the SDK's default chain reads, and aws-config's IMDS
/// credentials provider (`AWS_EC2_METADATA_DISABLED`): one test sets it while it runs and
/// takes it off again, holding [`SDK_ENV`]; the tests whose calls read it hold that lock
/// too ([`SdkEnv::untouched`]), whatever order the test threads run in.
static SDK_ENV: Mutex<()> = Mutex::new(());

/// Holds [`SDK_ENV`]; the variables it set are removed on drop (a failing test's too).
struct SdkEnv {
    set: Vec<String>,
    _lock: std::sync::MutexGuard<'static, ()>,
}

impl SdkEnv {
    fn untouched() -> SdkEnv {
        SdkEnv::set(Vec::new())
    }

    fn set(vars: Vec<(String, String)>) -> SdkEnv {
        let lock = SDK_ENV
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut set = Vec::new();
        for (k, v) in vars {
            std::env::set_var(&k, v);
            set.push(k);
        }
        SdkEnv { set, _lock: lock }
    }
}

impl Drop for SdkEnv {
    fn drop(&mut self) {
        for k in &self.set {
            std::env::remove_var(k);
        }
    }
}

fn capture_logs() -> (Logs, tracing::subscriber::DefaultGuard) {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    (logs, tracing::subscriber::set_default(subscriber))
}

/// A writer the test's log lines go to.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// The captured lines that warn of a throttled call, and all of the log (for a
    /// failure's message).
    fn throttle_warnings(&self) -> (Vec<String>, String) {
        let logs = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        let warned = logs
            .lines()
            .filter(|l| l.contains(" WARN ") && l.contains("throttled"))
            .map(str::to_string)
            .collect();
        (warned, logs)
    }
}

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_zero_quota_stops_the_key_fetch_with_the_api_and_quota_named_after_one_log_line() {
    let moto = Moto::start().unwrap();
    moto.put_secure_string("/storm/munge", "unused").unwrap();
    let f = front(&moto, vec![Quota::ssm_standard(0.0)]);
    // The only test of this file that sets the environment the SDK's default chain reads.
    let mut env = moto.env();
    env.push(("AWS_ENDPOINT_URL".into(), f.endpoint()));
    env.push(("AWS_EC2_METADATA_DISABLED".into(), "true".into()));
    let _env = SdkEnv::set(env);

    let (logs, _guard) = capture_logs();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let policy = ThrottlePolicy {
        spread: Duration::from_millis(200),
        window: Duration::from_secs(2),
    };
    let source = KeySource::parse("ssm:/storm/munge").unwrap();
    let e = rt
        .block_on(authkey::fetch_in_region(&source, REGION, &policy))
        .unwrap_err();
    let KeyError::Throttled {
        api,
        attempts,
        waited,
        ..
    } = &e
    else {
        panic!("not a throttle: {e}");
    };
    println!("stopped after {attempts} attempts in {waited:?} (window 2 s)");
    assert_eq!(*api, "ssm:GetParameter");
    assert!(*attempts > 1, "{e}");
    assert_eq!(e.exit().code(), 69);
    let text = e.to_string();
    assert!(
        text.starts_with("SSM parameter /storm/munge: ssm:GetParameter throttled (ThrottlingException: Rate exceeded)")
            && text.contains("(auth.fetch_window); quota: Parameter Store: 40 TPS standard throughput"),
        "{text}"
    );
    // The SDK retried nothing: every attempt is one request.
    assert_eq!(
        f.stats()["ssm:GetParameter"].throttled,
        u64::from(*attempts)
    );
    let (warned, logs) = logs.throttle_warnings();
    assert_eq!(warned.len(), 1, "{logs}");
    assert!(
        warned[0].contains("ssm:GetParameter throttled (ThrottlingException: Rate exceeded; quota: Parameter Store: 40 TPS"),
        "{}",
        warned[0]
    );
}

#[test]
fn the_front_sends_pcs_calls_to_the_pcs_emulator_and_throttles_them_with_429() {
    let pcs = imds_emulator::pcs::PcsEmulator::start().unwrap();
    let pcs_addr = pcs
        .endpoint()
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let f = Front::start(FrontConfig {
        // Nothing here goes to moto.
        moto: "127.0.0.1:9".parse().unwrap(),
        pcs: Some(pcs_addr),
        quotas: vec![Quota::new(
            "PCS RegisterComputeNodeGroupInstance",
            &["pcs:RegisterComputeNodeGroupInstance"],
            0.001,
        )],
    })
    .unwrap();
    let register = || {
        moto::request(
            port(&f),
            "POST",
            "/",
            &[
                ("Content-Type", "application/x-amz-json-1.0"),
                (
                    "X-Amz-Target",
                    "AWSParallelComputingService.RegisterComputeNodeGroupInstance",
                ),
            ],
            br#"{"clusterIdentifier":"pcs_a","bootstrapId":"b"}"#,
        )
        .unwrap()
    };
    // The emulator's own answer (an unsigned request), then the front's.
    let (status, _, body) = register();
    let body = String::from_utf8_lossy(&body).to_string();
    assert!(
        !body.contains("Rate exceeded") && status != 429,
        "{status} {body}"
    );
    assert_eq!(pcs.requests().len(), 1);
    let (status, _, body) = register();
    assert_eq!(status, 429);
    assert_eq!(
        String::from_utf8_lossy(&body),
        r#"{"__type":"ThrottlingException","message":"Rate exceeded"}"#
    );
    assert_eq!(pcs.requests().len(), 1);
}

/// One PCS cluster of one group on a registration emulator, one instance of it whose
/// metadata (region, instance profile credentials) an IMDS emulator serves, and the
/// agent's settings for it (`endpoint`: where the agent sends the registration).
struct PcsNode {
    pcs: imds_emulator::pcs::PcsEmulator,
    _imds: imds_emulator::Emulator,
    settings: slurm_node_agent::pcs::PcsSettings,
    imds_settings: slurm_node_agent::imds::ImdsSettings,
    auth: slurm_node_agent::authkey::AuthSettings,
    id: slurm_node_agent::imds::InstanceIdentity,
    _dir: tempfile::TempDir,
}

impl PcsNode {
    fn start() -> PcsNode {
        use imds_emulator::pcs::{PcsCluster, PcsEmulator, PcsEndpoint, PcsGroup, PcsInstance};
        use slurm_node_agent::authkey::{AuthSettings, AuthType};
        use slurm_node_agent::pcs::PcsSettings;
        use slurm_node_agent::section::HumanDuration;

        let pcs = PcsEmulator::start().unwrap();
        pcs.add_cluster(PcsCluster {
            id: "pcs_zero".into(),
            name: "zero".into(),
            region: REGION.into(),
            shared_secret: "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVpBQkNERUY=".into(),
            endpoints: vec![PcsEndpoint {
                endpoint_type: "SLURMCTLD".into(),
                private_ip_address: "10.0.0.10".into(),
                port: "6817".into(),
            }],
            groups: vec![PcsGroup {
                id: "pcs_zerogrp".into(),
                name: "zero".into(),
                nodes: vec!["zero-1".into()],
                lifecycle_actions: None,
            }],
        });
        pcs.add_instance(PcsInstance {
            instance_id: "i-0000000000000000a".into(),
            role: "AWSPCS-zero".into(),
            access_key_id: "ASIAZERO".into(),
            secret_access_key: "secret".into(),
            // What the IMDS emulator below serves the instance.
            session_token: Some("token".into()),
            cluster_id: "pcs_zero".into(),
            group_id: "pcs_zerogrp".into(),
        });
        let dir = tempfile::tempdir().unwrap();
        let settings = PcsSettings {
            enabled: true,
            cluster_id: "pcs_zero".into(),
            endpoint: pcs.endpoint(),
            register_window: HumanDuration(Duration::from_secs(2)),
            throttle_spread: HumanDuration(Duration::from_millis(200)),
            bootstrap_id_file: dir.path().join("bootstrap-id"),
            ..PcsSettings::default()
        };
        let me = nix::unistd::User::from_uid(nix::unistd::getuid())
            .unwrap()
            .unwrap()
            .name;
        let auth = AuthSettings {
            auth_type: AuthType::Slurm,
            key_owner: me,
            key_path: dir.path().join("slurm.key"),
            ..AuthSettings::default()
        };
        let id = slurm_node_agent::imds::InstanceIdentity {
            instance_id: "i-0000000000000000a".into(),
            region: REGION.into(),
            ..Default::default()
        };
        // The instance's metadata: its region and its instance profile's credentials, as
        // bootstrap reads them.
        let imds = imds_emulator::Emulator::start(imds_emulator::Config::default()).unwrap();
        imds.set("placement/region", REGION);
        imds.set_role_credentials(
            "AWSPCS-zero",
            "ASIAZERO",
            "secret",
            "token",
            "2999-01-01T00:00:00Z",
        );
        let imds_settings = slurm_node_agent::imds::ImdsSettings {
            endpoint: imds.endpoint(),
            ..Default::default()
        };
        PcsNode {
            pcs,
            _imds: imds,
            settings,
            imds_settings,
            auth,
            id,
            _dir: dir,
        }
    }

    /// As bootstrap: the early attempt beside the metadata read, then the registration.
    fn bootstrap_registration(
        &self,
    ) -> Result<slurm_node_agent::pcs::Managed, slurm_node_agent::pcs::PcsError> {
        use slurm_node_agent::pcs;
        // The instance profile's credentials come from IMDS, which the key-fetch test's
        // `AWS_EC2_METADATA_DISABLED` would turn off.
        let _env = SdkEnv::untouched();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let early = rt.block_on(pcs::register_early(&self.settings, &self.imds_settings));
        assert!(
            early.is_some(),
            "the early attempt was not made: {:?}",
            self.pcs.requests()
        );
        rt.block_on(pcs::register(
            &self.settings,
            &self.imds_settings,
            &self.auth,
            &self.id,
            early,
        ))
    }
}

#[test]
fn a_zero_quota_stops_the_pcs_registration_with_the_api_and_quota_named_after_one_log_line() {
    use slurm_node_agent::pcs::PcsError;

    let mut node = PcsNode::start();
    let f = Front::start(FrontConfig {
        // Nothing here goes to moto.
        moto: "127.0.0.1:9".parse().unwrap(),
        pcs: Some(
            node.pcs
                .endpoint()
                .trim_start_matches("http://")
                .parse()
                .unwrap(),
        ),
        quotas: vec![Quota::new(
            "PCS RegisterComputeNodeGroupInstance",
            &["pcs:RegisterComputeNodeGroupInstance"],
            0.0,
        )],
    })
    .unwrap();
    node.settings.endpoint = f.endpoint();

    let (logs, _guard) = capture_logs();
    // The early one is throttled too: it is kept as such, not dropped and asked again at
    // once (two requests back to back per node in a storm).
    let e = node.bootstrap_registration().map(|_| ()).unwrap_err();
    let PcsError::Throttled {
        attempts, waited, ..
    } = &e
    else {
        panic!("not a throttle: {e}");
    };
    println!("stopped after {attempts} attempts in {waited:?} (window 2 s)");
    assert!(*attempts > 1, "{e}");
    assert_eq!(e.exit().code(), 69);
    let text = e.to_string();
    assert!(
        text.starts_with(
            "PCS RegisterComputeNodeGroupInstance for cluster pcs_zero: \
             pcs:RegisterComputeNodeGroupInstance throttled (ThrottlingException: Rate exceeded)"
        ) && text.contains("(pcs.register_window); quota: PCS RegisterComputeNodeGroupInstance"),
        "{text}"
    );
    // The SDK retried nothing: every attempt is one request (the early one counted), none
    // reached the service.
    assert_eq!(
        f.stats()["pcs:RegisterComputeNodeGroupInstance"].throttled,
        u64::from(*attempts)
    );
    assert!(node.pcs.requests().is_empty());
    let (warned, logs) = logs.throttle_warnings();
    assert_eq!(warned.len(), 1, "{logs}");
    assert!(
        warned[0].contains(
            "pcs:RegisterComputeNodeGroupInstance throttled (ThrottlingException: Rate exceeded; \
             quota: PCS RegisterComputeNodeGroupInstance"
        ) && warned[0].contains("; the early attempt)"),
        "{}",
        warned[0]
    );
}

/// A storm's usual node: its early attempt is throttled, and the registration, after one
/// wait within `pcs.throttle_spread`, is answered: two requests in all (no back-to-back
/// retry, no SDK retry), the record counts both, and the one warning names the early
/// attempt.
#[test]
fn an_early_attempt_throttled_once_is_followed_by_one_registration_after_a_spread_wait() {
    use imds_emulator::pcs::PcsFault;

    let node = PcsNode::start();
    node.pcs.fail_next(PcsFault::Throttling, 1);
    let (logs, _guard) = capture_logs();
    let managed = node.bootstrap_registration().unwrap();
    assert_eq!(managed.registration.attempts, 2);
    assert_eq!(managed.registration.node_id, "zero-1");
    let answered: Vec<(u16, Option<String>)> = node
        .pcs
        .requests()
        .into_iter()
        .map(|r| (r.status, r.error))
        .collect();
    assert_eq!(
        answered,
        [(429, Some("ThrottlingException".to_string())), (200, None)]
    );
    let (warned, logs) = logs.throttle_warnings();
    assert_eq!(warned.len(), 1, "{logs}");
    assert!(warned[0].contains("; the early attempt)"), "{}", warned[0]);
}
