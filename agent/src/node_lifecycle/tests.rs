#![allow(clippy::unwrap_used)]
use super::*;
use std::os::unix::fs::PermissionsExt;

fn script(dir: &Path, name: &str, body: &str, on_error: &str, policy: &str) -> Script {
    let p = dir.join(format!("{name}.src"));
    std::fs::write(&p, body).unwrap();
    // Not executable at its source: the agent runs its own checked copy.
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    Script {
        name: name.into(),
        script_source: ScriptSource {
            script_location: format!("file:{}", p.display()),
            checksum: Some(hex::encode(Sha256::digest(body.as_bytes()))),
            s3_version_id: None,
        },
        arguments: vec!["a b".into(), "$HOME".into()],
        execution_policy: policy.into(),
        on_error: on_error.into(),
    }
}

fn actions(policy: &str, list: Vec<Script>) -> NodeLifecycleActions {
    NodeLifecycleActions {
        script_caching_policy: policy.into(),
        stages: Stages {
            node_bootstrapped: list,
            node_ready: Vec::new(),
        },
    }
}

fn facts(pcs: bool) -> Facts {
    Facts {
        node_name: "compute-1".into(),
        instance_id: "i-0123456789abcdef0".into(),
        first_boot: true,
        conf_servers: vec!["10.0.0.1:6817".into()],
        pcs: pcs.then(|| PcsFacts {
            cluster_id: "pcs_c".into(),
            ..PcsFacts::default()
        }),
    }
}

async fn stage(
    dir: &Path,
    a: &NodeLifecycleActions,
    f: &Facts,
    record: &mut RunRecord,
) -> StageOutcome {
    let lists = [ScriptList {
        origin: Origin::Service,
        actions: a,
    }];
    run_stage(dir, "us-east-1", Stage::NodeBootstrapped, &lists, f, record).await
}

fn statuses(o: &StageOutcome) -> Vec<&'static str> {
    o.scripts.iter().map(|s| s.status).collect()
}

#[tokio::test]
async fn scripts_run_in_order_without_a_shell_and_on_error_decides() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("out");
    let ok = format!(
        "#!/bin/sh\nprintf '%s|' \"$@\" \"$PCS_NODE_ID\" \"$PCS_IS_FIRST_BOOT\" \"$SLURM_NODE_AGENT_STAGE\" >> {}\n",
        out.display()
    );
    let fail = "#!/bin/sh\necho failing\nexit 3\n";
    let mut bad_sum = script(d.path(), "badsum", &ok, "CONTINUE", "EVERY_BOOT");
    bad_sum.script_source.checksum = Some("0".repeat(64));
    let a = actions(
        "CACHE_ONCE",
        vec![
            script(d.path(), "one", &ok, "CONTINUE", "EVERY_BOOT"),
            bad_sum,
            script(d.path(), "fails", fail, "STOP_SEQUENCE", "EVERY_BOOT"),
            script(d.path(), "after", &ok, "CONTINUE", "EVERY_BOOT"),
        ],
    );
    validate(&a).unwrap();
    let mut rec = RunRecord::load(d.path(), "i-0123456789abcdef0", "boot1");
    assert!(rec.first_boot());
    let o = stage(d.path(), &a, &facts(true), &mut rec).await;
    assert_eq!(statuses(&o), ["ok", "failed", "failed", "not_run"]);
    let why = o.scripts[1].detail.as_ref().unwrap();
    assert!(why.contains("checksum mismatch"), "{why}");
    assert!(o.terminate.is_none());
    // Arguments reach the script as they are (no shell expansion); the checksum mismatch
    // ran nothing.
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "a b|$HOME|compute-1|true|nodeBootstrapped|"
    );
    let log = log_path(d.path(), Stage::NodeBootstrapped, 3, "fails");
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "failing\n");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&log).unwrap().mode() & 0o777, 0o600);
    assert!(!log_path(d.path(), Stage::NodeBootstrapped, 2, "badsum").exists());

    // TERMINATE stops the stage and names the script.
    let a = actions(
        "CACHE_ONCE",
        vec![
            script(d.path(), "t", fail, "TERMINATE", "EVERY_BOOT"),
            script(d.path(), "u", &ok, "CONTINUE", "EVERY_BOOT"),
        ],
    );
    let o = stage(d.path(), &a, &facts(true), &mut rec).await;
    let t = o.terminate.clone().unwrap();
    assert_eq!(t.script, "t");
    assert_eq!(statuses(&o), ["failed", "not_run"]);
    let reason = terminate_reason("i-0123456789abcdef0", &t);
    let parsed = crate::reason::parse_reason(&reason).unwrap();
    assert_eq!(parsed.cause, crate::reason::ReasonCause::Script);
    assert!(
        parsed
            .detail
            .starts_with("t failed in nodeBootstrapped (onError TERMINATE)"),
        "{reason}"
    );
    assert!(reason.chars().count() <= 256);
}

#[tokio::test]
async fn a_script_without_a_shebang_fails_and_is_not_run_through_a_shell() {
    let d = tempfile::tempdir().unwrap();
    let a = actions(
        "CACHE_ONCE",
        vec![script(
            d.path(),
            "plain",
            "touch /tmp/x\n",
            "CONTINUE",
            "EVERY_BOOT",
        )],
    );
    let mut rec = RunRecord::load(d.path(), "i-0123456789abcdef0", "boot1");
    let o = stage(d.path(), &a, &facts(false), &mut rec).await;
    assert_eq!(statuses(&o), ["failed"]);
    assert!(
        o.scripts[0].detail.as_ref().unwrap().contains("#! line"),
        "{o:?}"
    );
}

#[tokio::test]
async fn first_boot_only_is_skipped_later_succeeded_scripts_are_not_rerun_and_cache_once_keeps_the_first_copy(
) {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("out");
    let body = format!("#!/bin/sh\necho \"$1\" >> {}\n", out.display());
    let mut once = script(d.path(), "once", &body, "CONTINUE", "FIRST_BOOT_ONLY");
    once.arguments = vec!["once".into()];
    let mut every = script(d.path(), "every", &body, "CONTINUE", "EVERY_BOOT");
    every.arguments = vec!["every".into()];
    every.script_source.checksum = None;
    let a = actions("CACHE_ONCE", vec![once, every.clone()]);
    let id = "i-0123456789abcdef0";
    let mut rec = RunRecord::load(d.path(), id, "boot1");
    let o = stage(d.path(), &a, &facts(false), &mut rec).await;
    assert_eq!(statuses(&o), ["ok", "ok"]);
    rec.save(d.path()).unwrap();
    // Bootstrap again in the same boot: nothing runs again.
    let mut rec = RunRecord::load(d.path(), id, "boot1");
    assert!(rec.first_boot());
    let o = stage(d.path(), &a, &facts(false), &mut rec).await;
    assert_eq!(statuses(&o), ["done", "done"]);
    rec.save(d.path()).unwrap();
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "once\nevery\n");

    // The unchecked source changes; CACHE_ONCE keeps running the first copy.
    let src = every
        .script_source
        .script_location
        .strip_prefix("file:")
        .unwrap();
    std::fs::write(src, "#!/bin/sh\nexit 1\n").unwrap();
    let mut rec = RunRecord::load(d.path(), id, "boot2");
    assert!(!rec.first_boot());
    let o = stage(d.path(), &a, &facts(false), &mut rec).await;
    assert_eq!(statuses(&o), ["skipped", "ok"]);
    rec.save(d.path()).unwrap();
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "once\nevery\nevery\n"
    );
    // REFRESH_ON_REBOOT fetches again in a new boot: the changed script now fails.
    let a = actions("REFRESH_ON_REBOOT", vec![every]);
    let mut rec = RunRecord::load(d.path(), id, "boot3");
    let o = stage(d.path(), &a, &facts(false), &mut rec).await;
    assert_eq!(statuses(&o), ["failed"]);

    // Another instance (a record baked into an image): its first boot again.
    let rec = RunRecord::load(d.path(), "i-0fedcba9876543210", "boot3");
    assert!(rec.first_boot());
}

#[test]
fn validation_names_the_script_and_field() {
    let d = tempfile::tempdir().unwrap();
    let mut s = script(d.path(), "n", "x", "EXPLODE", "EVERY_BOOT");
    let InvalidKey { key, message: m } =
        validate(&actions("CACHE_ONCE", vec![s.clone()])).unwrap_err();
    assert_eq!(key, "node_bootstrapped[0].on_error");
    assert!(m.contains("\"n\"") && m.contains("EXPLODE"), "{m}");
    s.on_error = "CONTINUE".into();
    s.arguments = vec!["x".repeat(257)];
    let InvalidKey { key, .. } = validate(&actions("CACHE_ONCE", vec![s.clone()])).unwrap_err();
    assert_eq!(key, "node_bootstrapped[0].arguments");
    s.arguments = vec!["x".into(); 21];
    assert!(validate(&actions("CACHE_ONCE", vec![s.clone()])).is_err());
    s.arguments.clear();
    s.script_source.script_location = "http://example.com/x".into();
    let InvalidKey { key, .. } = validate(&actions("CACHE_ONCE", vec![s.clone()])).unwrap_err();
    assert_eq!(key, "node_bootstrapped[0].script_location");
    s.script_source.script_location = "s3://bucket/key".into();
    s.script_source.checksum = Some("abc".into());
    let InvalidKey { key, .. } = validate(&actions("CACHE_ONCE", vec![s.clone()])).unwrap_err();
    assert_eq!(key, "node_bootstrapped[0].checksum");
    s.script_source.checksum = None;
    assert!(validate(&actions("CACHE_ONCE", vec![s.clone(); 20])).is_ok());
    assert!(validate(&actions("CACHE_ONCE", vec![s.clone(); 21])).is_err());
    let InvalidKey { key, .. } = validate(&actions("SOMETIMES", vec![s])).unwrap_err();
    assert_eq!(key, "script_caching_policy");
}

#[test]
fn the_environment_has_the_agents_names_always_and_the_services_in_the_managed_mode() {
    let names = |f: &Facts| -> Vec<&'static str> {
        f.environment(Stage::NodeReady)
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    };
    let plain = facts(false);
    assert_eq!(
        names(&plain),
        [
            "SLURM_NODE_AGENT_NODE_NAME",
            "SLURM_NODE_AGENT_INSTANCE_ID",
            "SLURM_NODE_AGENT_IS_FIRST_BOOT",
            "SLURM_NODE_AGENT_STAGE",
            "SLURM_NODE_AGENT_CONF_SERVERS",
        ]
    );
    let env = facts(true).environment(Stage::NodeReady);
    let get = |k: &str| env.iter().find(|(n, _)| *n == k).unwrap().1.clone();
    assert_eq!(get("PCS_NODE_ID"), "compute-1");
    assert_eq!(get("PCS_CLUSTER_ID"), "pcs_c");
    assert_eq!(get("PCS_IS_FIRST_BOOT"), "true");
    assert_eq!(get("SLURM_NODE_AGENT_STAGE"), "nodeReady");
    assert_eq!(get("SLURM_NODE_AGENT_CONF_SERVERS"), "10.0.0.1:6817");
    assert_eq!(env.len(), 11);
}

#[test]
fn settings_scripts_are_checked_with_their_dotted_keys() {
    let mut s = NodeLifecycleSettings::default();
    s.validate().unwrap();
    s.node_ready.push(ScriptSettings {
        name: "r".into(),
        script_location: "file:/opt/site/ready.sh".into(),
        checksum: String::new(),
        s3_version_id: String::new(),
        arguments: Vec::new(),
        execution_policy: "EVERY_BOOT".into(),
        on_error: "NEVER".into(),
    });
    let InvalidKey { key, .. } = s.validate().unwrap_err();
    assert_eq!(key, "node_lifecycle.node_ready[0].on_error");
    s.node_ready[0].on_error = "CONTINUE".into();
    s.validate().unwrap();
    let a = s.actions();
    assert_eq!(a.stages.node_ready[0].script_source.checksum, None);
    s.poweroff_unit = "../x".into();
    assert_eq!(
        s.validate().unwrap_err().key,
        "node_lifecycle.poweroff_unit"
    );
}

/// `s3://bucket/key` as `(bucket, key)`, as the fetch reads it.
fn s3_location(loc: &str) -> Option<(&str, &str)> {
    crate::location::Location::parse(loc)?.s3_object()
}

#[test]
fn s3_locations_split_into_bucket_and_key_as_written() {
    assert_eq!(
        s3_location("s3://site-scripts/boot/ready.sh"),
        Some(("site-scripts", "boot/ready.sh"))
    );
    assert_eq!(s3_location("s3://b-1/a%20b+c"), Some(("b-1", "a%20b+c")));
    for bad in [
        "s3://bucket",
        "s3://bucket/",
        "s3:///key",
        "ssm:/x",
        "S3://b/k",
    ] {
        assert_eq!(s3_location(bad), None, "{bad}");
        assert!(
            location_problem(bad).is_some() || bad.starts_with("ssm:"),
            "{bad}"
        );
    }
}

#[test]
fn malformed_locations_are_refused_saying_what_is_wrong() {
    for good in [
        "s3://site-scripts/boot/ready.sh",
        "s3://a.b-c.9/x",
        // A legacy us-east-1 name (before March 2018): capitals and underscores.
        "s3://My_Legacy_Bucket/x.sh",
        "s3://my-ap-abcdefghij1234567890-s3alias/x.sh",
        "ssm:/site/ready-script",
        "ssm:plain_name.v2-x",
        "ssm:/site/ready:3",
        "ssm:/site/ready:prod_label",
        "ssm:/aws/service/public/param",
        "ssm:arn:aws:ssm:eu-west-1:123456789012:parameter/site/ready",
        "file:/opt/site/ready.sh",
        "file:/opt/site dir/ready.sh",
    ] {
        assert_eq!(location_problem(good), None, "{good}");
    }
    for (bad, what) in [
        ("ssm:name with space", "' '"),
        ("ssm:", "empty"),
        ("ssm:/a//b", "empty level"),
        ("ssm:/a/b/", "empty level"),
        ("ssm:a/b", "begin with /"),
        ("ssm:/x;rm", "';'"),
        ("ssm:/x:", "version or label"),
        ("ssm:/x:a b", "version or label"),
        ("ssm:arn:aws:s3:::bucket/x", "ARN"),
        ("file:/opt/a\0b", "NUL"),
        ("file:relative/x", "absolute"),
        ("file:/", "absolute"),
        ("s3://my*bucket/x.sh", "'*'"),
        ("s3://ab/x.sh", "3 to 63"),
        ("s3://-bucket/x", "begin and end"),
        ("s3://bucket-/x", "begin and end"),
        ("s3://a..b/x", "two adjacent periods"),
        ("s3://192.168.5.4/x", "IP address"),
        ("s3://bucket", "s3://bucket/key"),
        ("http://example.com/x", "s3://bucket/key"),
    ] {
        let m = location_problem(bad).unwrap_or_else(|| panic!("{bad:?} accepted"));
        assert!(m.contains(what), "{bad:?}: {m}");
    }
    // 64 to 255 characters: only a legacy us-east-1 name can be that long.
    assert_eq!(
        location_problem(&format!("s3://{}/x", "a".repeat(255))),
        None
    );
    let long = format!("s3://{}/x", "a".repeat(256));
    assert!(location_problem(&long).unwrap().contains("3 to 63"));
    let deep = format!("ssm:{}", "/l".repeat(16));
    assert!(location_problem(&deep).unwrap().contains("15 levels"));
    let d = tempfile::tempdir().unwrap();
    let mut s = script(d.path(), "n", "x", "CONTINUE", "EVERY_BOOT");
    s.script_source.script_location = "ssm:name with space".into();
    let InvalidKey { key, message: m } = validate(&actions("CACHE_ONCE", vec![s])).unwrap_err();
    assert_eq!(key, "node_bootstrapped[0].script_location");
    assert!(
        m.starts_with("script \"n\": \"ssm:name with space\": ") && m.contains("' '"),
        "{m}"
    );
}

#[tokio::test]
async fn fetch_and_record_errors_name_the_location_or_path() {
    let d = tempfile::tempdir().unwrap();
    let src = |loc: &str, checksum: Option<&str>| ScriptSource {
        script_location: loc.to_string(),
        checksum: checksum.map(str::to_string),
        s3_version_id: None,
    };
    let dir = format!("file:{}", d.path().display());
    let e = fetch_once(&src(&dir, None), "us-east-1").await.unwrap_err();
    assert_eq!(e.to_string(), format!("{dir}: not a regular file"));
    let missing = format!("file:{}/nope", d.path().display());
    let e = fetch_once(&src(&missing, None), "us-east-1")
        .await
        .unwrap_err();
    assert!(
        matches!(&e, FetchError::File { location, source }
            if *location == missing && source.kind() == std::io::ErrorKind::NotFound),
        "{e:?}"
    );
    assert!(e.to_string().starts_with(&format!("{missing}: ")), "{e}");
    let e = fetch_once(&src("ftp://x/y", None), "us-east-1")
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "ftp://x/y: expected s3://bucket/key, ssm:<parameter name> or file:<absolute path>"
    );
    let e = check(&src("file:/s", Some("00")), b"x").unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "file:/s: checksum mismatch (SHA-256 {}, expected 00); not run",
            hex::encode(Sha256::digest(b"x"))
        )
    );
    let e = FetchError::Attempts {
        attempts: FETCH_ATTEMPTS,
        last: Box::new(FetchError::S3Status {
            at: ScriptAt {
                location: "s3://b/k".into(),
                version: Some("v1".into()),
            },
            status: 500,
        }),
    };
    assert_eq!(
        e.to_string(),
        "s3://b/k (version v1): S3 GetObject failed: HTTP 500 (3 attempts)"
    );
    // Given up under S3's SlowDown: the API and its quota are named.
    let e = FetchError::Attempts {
        attempts: FETCH_ATTEMPTS,
        last: Box::new(FetchError::S3Code {
            at: ScriptAt {
                location: "s3://b/k".into(),
                version: None,
            },
            code: "SlowDown".into(),
            message: Some("Please reduce your request rate.".into()),
        }),
    };
    assert_eq!(
        e.to_string(),
        "s3://b/k: S3 GetObject failed: SlowDown: Please reduce your request rate. (3 attempts; \
         throttled: s3:GetObject, quota: S3: 5,500 GET/HEAD requests per second per prefix)"
    );
    // A state folder that is a file: the record names the folder it could not make.
    let file = d.path().join("state");
    std::fs::write(&file, "").unwrap();
    let e = LifecycleError::from(RunRecord::default().save(&file).unwrap_err());
    assert!(
        e.to_string()
            .starts_with(&format!("{}: ", file.join(DIR).display())),
        "{e}"
    );
    assert!(matches!(e.exit(), crate::exit::Exit::IoErr));
}

/// The breaker at bootstrap: a `TERMINATE` script that failed on 2 of the 4 nodes of the
/// partition before (their records keep the script's reason after they powered off) holds
/// this node's poweroff; another script's failures, or one node alone, do not.
#[tokio::test]
async fn the_bootstrap_breaker_holds_a_poweroff_when_the_same_script_fails_across_the_partition() {
    use crate::slurm::ctl::fake::FakeSlurmctld;
    let dir = tempfile::tempdir().unwrap();
    let slurmctld = FakeSlurmctld::default();
    let failed = |id: &str, script: &str| {
        terminate_reason(
            id,
            &Terminate {
                stage: "nodeReady".into(),
                script: script.into(),
                message: "exit status 1".into(),
            },
        )
    };
    slurmctld.set_record("NodeName=n1 State=IDLE Partitions=p");
    slurmctld.set_record(&format!(
        "NodeName=n2 State=DOWN+DRAIN+NOT_RESPONDING Partitions=p Reason={} [root@2026-12-06T00:00:00]",
        failed("i-0000000000000000a", "mount-fsx")
    ));
    slurmctld.set_record(&format!(
        "NodeName=n3 State=DOWN+DRAIN+NOT_RESPONDING Partitions=p Reason={} [root@2026-12-06T00:00:00]",
        failed("i-0000000000000000b", "other")
    ));
    slurmctld.set_record("NodeName=n4 State=IDLE Partitions=p");
    let gateway = crate::node_state::Gateway::new(
        "n1",
        crate::slurm::Scontrol::new(dir.path()),
        dir.path(),
        std::time::Duration::from_secs(1),
        dir.path().join("drain.prom"),
    )
    .through(slurmctld.clone());
    let facts = Facts::default();
    let settings = NodeLifecycleSettings::default();
    let cx = Context {
        settings: &settings,
        state_dir: dir.path(),
        gateway: &gateway,
        region: "us-east-1",
        service: None,
        facts: &facts,
        breaker: (0.1, 2),
    };
    let why = bootstrap_breaker(&cx, "n1", "mount-fsx").await.unwrap();
    assert!(
        why.contains("the breaker holds for mount-fsx: 2 of 4 nodes of partition p fail it"),
        "{why}"
    );
    assert_eq!(bootstrap_breaker(&cx, "n1", "setup-efa").await, None);
    let cx = Context {
        breaker: (0.1, 3),
        ..cx
    };
    assert_eq!(bootstrap_breaker(&cx, "n1", "mount-fsx").await, None);
}
