//! The binary end to end with real components: Debian's Packer 1.6.6 (builds of the test
//! templates, `packer fmt`, and its refusal by packer/'s `required_version`), moto's EC2 and
//! SSM on 127.0.0.1, shellcheck; and every bad input of issue 5, each with its exit code.
//! Commands on packer/ itself run a stand-in Packer new enough for it (`common::sib`).
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use std::time::Duration;

fn json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(out)))
}

/// `--output json plan <args>` on packer/, which must succeed: its JSON.
fn plan_json(args: &[&str]) -> serde_json::Value {
    let out = run(sib().args(["--output", "json", "plan"]).args(args));
    assert!(out.status.success(), "plan {args:?}: {}", text(&out));
    json(&out)
}

/// Recipe flags that need no download (the test templates never reach the steps).
const OFFLINE: &[&str] = &[
    "--slurm-source",
    "distro",
    "--slurm-version",
    "22.05.8",
    "--efa-version",
    "",
];

#[test]
fn packer_fmt_check_passes_on_the_real_templates() {
    let out = run(std::process::Command::new("packer")
        .args(["fmt", "-check", "packer"])
        .current_dir(repo())
        .env("CHECKPOINT_DISABLE", "1"));
    assert!(out.status.success(), "{}", text(&out));
    for fixture in ["moto-ebs", "sleep"] {
        let out = run(std::process::Command::new("packer")
            .args(["fmt", "-check"])
            .arg(format!("imagebuilder/tests/fixtures/{fixture}"))
            .current_dir(repo())
            .env("CHECKPOINT_DISABLE", "1"));
        assert!(out.status.success(), "{fixture}: {}", text(&out));
    }
}

#[test]
fn provisioning_scripts_are_shellcheck_clean() {
    let mut cmd = std::process::Command::new("shellcheck");
    cmd.current_dir(repo());
    for entry in std::fs::read_dir(repo().join("packer/scripts"))
        .unwrap()
        .flatten()
    {
        let name = entry.file_name().into_string().unwrap();
        if name.ends_with(".sh") {
            cmd.arg(format!("packer/scripts/{name}"));
        }
    }
    for script in ["scripts/bench-imagebuilder.sh", "scripts/slurm-build.sh"] {
        if repo().join(script).exists() {
            cmd.arg(script);
        }
    }
    let out = run(&mut cmd);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn validate_checks_variables_schema_format_and_refuses_debians_packer_1_6_6() {
    let out = run(sib().args(["--output", "json", "validate"]));
    assert!(out.status.success(), "{}", text(&out));
    let v = json(&out);
    assert_eq!(v["fmt"], "ok");
    assert_eq!(v["packer"]["version"], "1.11.2");
    assert_eq!(v["validate"], "ok");
    assert_eq!(v["schema"]["result"], "ok");
    assert_eq!(
        v["schema"]["schemas"],
        serde_json::json!([
            "Packer v1.16.0 + amazon v1.8.2",
            "Packer v1.10.0 + amazon v1.3.0"
        ])
    );

    // Debian's Packer is older than the template requires: refused (it was once "skipped"
    // with exit 0), naming the version, the constraint and the template, after the checks
    // that need no Packer.
    let out = run(sib_debian_packer().args(["--output", "json", "validate"]));
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    let v = json(&out);
    let error = v["error"].as_str().unwrap();
    assert!(
        error.starts_with("Packer 1.6.6 (")
            && error.contains(&format!(
                "is too old for {}: it requires Packer >= 1.10.0",
                repo().join("packer").display()
            )),
        "{error}"
    );
    assert!(!text(&out).contains("skipped"), "{}", text(&out));
}

#[test]
fn validate_refuses_a_template_the_schema_rejects_naming_each_error() {
    let dir = tempfile::tempdir().unwrap();
    for f in ["node.pkr.hcl", "variables.pkr.hcl", "sources.toml"] {
        std::fs::copy(repo().join("packer").join(f), dir.path().join(f)).unwrap();
    }
    let node = dir.path().join("node.pkr.hcl");
    let bad = std::fs::read_to_string(&node)
        .unwrap()
        .replace("  imds_support = \"v2.0\"", "  imds_version = \"v2.0\"")
        .replace("    strip_path = true", "    strip_path = [true]");
    std::fs::write(&node, bad).unwrap();
    let out = run(sib().arg("--packer-dir").arg(dir.path()).arg("validate"));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("the schema check (2 error(s))")
            && t.contains("unknown attribute 'imds_version'")
            && t.contains("'strip_path' must be bool, but the value is a list")
            && t.contains("post-processor \"manifest\"")
            && t.contains("warning:"),
        "{t}"
    );
}

#[test]
fn validate_fails_on_an_unformatted_template() {
    let dir = tempfile::tempdir().unwrap();
    for f in ["node.pkr.hcl", "variables.pkr.hcl", "sources.toml"] {
        std::fs::copy(repo().join("packer").join(f), dir.path().join(f)).unwrap();
    }
    let node = dir.path().join("node.pkr.hcl");
    let bad = std::fs::read_to_string(&node)
        .unwrap()
        .replace("  region        = var.region", "  region = var.region");
    std::fs::write(&node, bad).unwrap();
    let out = run(sib().arg("--packer-dir").arg(dir.path()).arg("validate"));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(text(&out).contains("node.pkr.hcl"), "{}", text(&out));
}

#[test]
fn plan_prints_versions_checksums_and_variables() {
    let v = plan_json(&["--os", "ubuntu-22.04", "--arch", "arm64"]);
    assert_eq!(v["variables"]["os"], "ubuntu-22.04");
    assert_eq!(v["variables"]["arch"], "arm64");
    assert_eq!(v["variables"]["slurm_version"], "25.11.7");
    // What package updates do on a node of it: nothing by themselves (ubuntu: apt).
    assert!(
        v["node_updates"]
            .as_str()
            .unwrap()
            .contains("needrestart never restarts slurmd"),
        "{}",
        v["node_updates"]
    );
    // SchedMD's support against this month: the listed ends, each marked ended when it is
    // before this month, and the warning exactly when the default's release has ended.
    let out = std::process::Command::new("date")
        .args(["-u", "+%Y-%m"])
        .output()
        .unwrap();
    let month = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let support = v["slurm_support"].as_array().unwrap();
    let of = |r: &str| support.iter().find(|s| s["release"] == r).unwrap().clone();
    assert_eq!(of("24.11")["until"], "2026-05");
    assert_eq!(of("25.11")["until"], "2027-05");
    for s in support {
        let until = s["until"].as_str().unwrap();
        assert_eq!(s["ended"], until < month.as_str(), "{s}");
    }
    assert_eq!(
        v["slurm_support_warning"].is_null(),
        of("25.11")["ended"] == false,
        "{}",
        v["slurm_support_warning"]
    );
    assert_eq!(v["variables"]["slurm_sha256"].as_str().unwrap().len(), 64);
    assert!(v["sources"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["name"].as_str().unwrap().starts_with("EFA installer")));
}

/// The plan names what the image gets for NVIDIA's NVLink fabrics, by driver branch:
/// NVLink 5 (p6-b200) needs NVLSM and ib_umad, which a branch from 570 on brings.
#[test]
fn plan_names_the_nvlink5_prerequisites_by_driver_branch() {
    let v = plan_json(&["--os", "ubuntu-22.04", "--nvidia-driver", "580.126.09"]);
    let fabric: Vec<&str> = v["nvidia_fabric"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert_eq!(
        fabric,
        [
            "Fabric Manager of the driver's version (started only where NVSwitches are)",
            "NVLink 5 (p6-b200): NVLSM and linux-modules-extra installed, ib_umad loaded at boot (/etc/modules-load.d/nvidia-fabric.conf)",
        ]
    );
    let out = run(sib().args(["plan", "--os", "rocky9", "--nvidia-driver", "580"]));
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(
            "NVIDIA fabric: NVLink 5 (p6-b200): NVLSM installed, ib_umad loaded at boot (/etc/modules-load.d/nvidia-fabric.conf)\n"
        ),
        "{}",
        text(&out)
    );
    let out = run(sib().args(["plan", "--nvidia-driver", "550"]));
    assert!(
        text(&out).contains(
            "NVIDIA fabric: NVLink 5 (p6-b200): not supported by driver branch 550 (needs 570 or later)"
        ) && !text(&out).contains("ib_umad"),
        "{}",
        text(&out)
    );
    assert_eq!(plan_json(&[])["nvidia_fabric"], serde_json::json!([]));
}

#[test]
fn unknown_os_is_refused() {
    let out = run(sib().args(["plan", "--os", "centos7"]));
    assert_eq!(out.status.code(), Some(2));
    let t = text(&out);
    assert!(
        t.contains("unknown OS 'centos7'") && t.contains("al2023"),
        "{t}"
    );
}

#[test]
fn unknown_arch_is_refused() {
    let out = run(sib().args(["plan", "--os", "rocky9", "--arch", "riscv64"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).contains("unknown architecture 'riscv64' for rocky9"),
        "{}",
        text(&out)
    );
}

#[test]
fn version_without_checksum_is_refused() {
    let out = run(sib().args(["plan", "--slurm-version", "99.1.1"]));
    assert_eq!(out.status.code(), Some(2));
    let t = text(&out);
    assert!(
        t.contains("Slurm 99.1.1") && t.contains("sources.toml"),
        "{t}"
    );

    let dir = tempfile::tempdir().unwrap();
    let sources = dir.path().join("sources.toml");
    std::fs::write(
        &sources,
        "[slurm.\"24.05.1\"]\nurl = \"https://example.invalid/slurm-24.05.1.tar.bz2\"\n",
    )
    .unwrap();
    let out = run(sib()
        .args([
            "plan",
            "--efa-version",
            "",
            "--slurm-version",
            "24.05.1",
            "--sources",
        ])
        .arg(&sources));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).contains("Slurm 24.05.1 has no sha256"),
        "{}",
        text(&out)
    );
}

#[test]
fn the_managed_services_slurm_versions_are_pinned_with_their_source_and_25_05_is_refused() {
    // Each pinned version resolves to its own tarball and a 64-hex sha256.
    let mut seen = std::collections::BTreeSet::new();
    for v in ["24.05.8", "24.11.7", "25.11.6", "25.11.7", "26.05.3"] {
        let j = plan_json(&["--slurm-version", v]);
        let url = j["variables"]["slurm_url"].as_str().unwrap().to_string();
        assert!(
            url.ends_with(&format!("slurm-{}-1.tar.gz", v.replace('.', "-"))),
            "{url}"
        );
        let sha = j["variables"]["slurm_sha256"].as_str().unwrap().to_string();
        assert_eq!(sha.len(), 64, "{v}: {sha}");
        assert!(seen.insert(sha), "{v}: the same sha256 as another version");
    }
    // Every pin names where its checksum came from, on the line above it.
    let sources = std::fs::read_to_string(repo().join("packer/sources.toml")).unwrap();
    let lines: Vec<&str> = sources.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        if l.starts_with("[slurm.") {
            assert!(
                i > 0 && lines[i - 1].contains("Source:"),
                "{l} has no `# Source:` line above it"
            );
        }
    }
    // No publisher's sha256 for 25.05 here: refused, naming the file to add it to.
    let out = run(sib().args(["plan", "--slurm-version", "25.05.9"]));
    assert_eq!(out.status.code(), Some(2));
    let t = text(&out);
    assert!(
        t.contains("Slurm 25.05.9 has no pinned source") && t.contains("sources.toml"),
        "{t}"
    );
}

#[test]
fn debian_source_needs_a_debian_root_and_no_pin() {
    let out = run(sib().args(["plan", "--os", "al2023", "--slurm-source", "debian-source"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).contains("'debian-source' needs a Debian-family OS, not al2023"),
        "{}",
        text(&out)
    );
    let j = plan_json(&["--target", "local", "--slurm-source", "debian-source"]);
    assert_eq!(j["variables"]["slurm_source"], "debian-source");
    // Debian 12's own Slurm, and no tarball of ours to fetch.
    assert_eq!(j["variables"]["slurm_version"], "22.05.8");
    assert_eq!(j["variables"]["slurm_url"], "");
}

fn sources_with(url: &str, sha: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("sources.toml"),
        format!("[defaults]\nslurm = \"23.11.4\"\n\n[slurm.\"23.11.4\"]\nurl = \"{url}\"\nsha256 = \"{sha}\"\n"),
    )
    .unwrap();
    dir
}

#[test]
fn checksum_mismatch_is_refused_and_a_match_is_accepted() {
    static BODY: &[u8] = b"not really a slurm tarball\n";
    let port = serve_bytes(BODY);
    let url = format!("http://127.0.0.1:{port}/slurm-23.11.4.tar.bz2");
    let wrong = "0".repeat(64);
    let dir = sources_with(&url, &wrong);
    let cache = dir.path().join("cache");
    let out = run(sib()
        .args([
            "validate",
            "--os",
            "ubuntu-22.04",
            "--efa-version",
            "",
            "--check-sources",
            "--sources",
        ])
        .arg(dir.path().join("sources.toml"))
        .arg("--cache-dir")
        .arg(&cache));
    assert_eq!(out.status.code(), Some(5), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("checksum mismatch") && t.contains(&url) && t.contains(&sha256_hex(BODY)),
        "{t}"
    );
    assert!(
        !cache.join("slurm-23.11.4.tar.bz2").exists(),
        "a mismatching file must not be kept"
    );

    let dir = sources_with(&url, &sha256_hex(BODY));
    let out = run(sib()
        .args([
            "--output",
            "json",
            "validate",
            "--os",
            "ubuntu-22.04",
            "--efa-version",
            "",
            "--check-sources",
            "--sources",
        ])
        .arg(dir.path().join("sources.toml"))
        .arg("--cache-dir")
        .arg(&cache));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        std::fs::read(cache.join("slurm-23.11.4.tar.bz2")).unwrap(),
        BODY
    );
}

#[test]
fn unreachable_source_error_names_the_url() {
    let url = format!("http://127.0.0.1:{}/slurm-23.11.4.tar.bz2", free_port());
    let dir = sources_with(&url, &"a".repeat(64));
    let out = run(sib()
        .args([
            "validate",
            "--os",
            "ubuntu-22.04",
            "--efa-version",
            "",
            "--check-sources",
            "--sources",
        ])
        .arg(dir.path().join("sources.toml"))
        .arg("--cache-dir")
        .arg(dir.path().join("cache")));
    assert_eq!(out.status.code(), Some(5), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("source unreachable: {url}")),
        "{}",
        text(&out)
    );
}

#[test]
fn provisioning_step_refuses_a_checksum_mismatch_and_names_an_unreachable_url() {
    static BODY: &[u8] = b"tarball\n";
    let port = serve_bytes(BODY);
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "STEP=test; . {lib}; rc=0; fetch_verified thing http://127.0.0.1:{port}/t.tgz {sha} {d}/t.tgz || rc=$?; echo rc=$rc",
        lib = repo().join("packer/scripts/lib.sh").display(),
        sha = "0".repeat(64),
        d = dir.path().display()
    );
    let out = run(std::process::Command::new("bash")
        .args(["-c", &script])
        .env("IMAGE_STAGING", dir.path()));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("[test] FAILED: checksum mismatch for thing"),
        "{}",
        text(&out)
    );

    let closed = free_port();
    let script = format!(
        "STEP=test; ALLOW_SKIPS=true; BUILD_INFO_DIR={d}; SKIPPED_FILE={d}/skipped; . {lib}; \
         BUILD_INFO_DIR={d}; SKIPPED_FILE={d}/skipped; rc=0; \
         fetch_verified thing http://127.0.0.1:{closed}/t.tgz {sha} {d}/t.tgz || rc=$?; \
         [ $rc -eq 2 ] && unreachable thing http://127.0.0.1:{closed}/t.tgz",
        lib = repo().join("packer/scripts/lib.sh").display(),
        sha = "0".repeat(64),
        d = dir.path().display()
    );
    let out = run(std::process::Command::new("bash")
        .args(["-c", &script])
        .env("IMAGE_STAGING", dir.path()));
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&format!(
            "skipped: thing unreachable from here (http://127.0.0.1:{closed}/t.tgz)"
        )),
        "{}",
        text(&out)
    );
}

#[test]
fn undeclared_or_mistyped_variable_is_refused() {
    let out = run(sib().args(["validate", "--var", "no_such_variable=1"]));
    assert_eq!(out.status.code(), Some(2));
    let t = text(&out);
    assert!(
        t.contains("variable 'no_such_variable' is not declared in ")
            && t.contains("slurm_version"),
        "{t}"
    );

    let out = run(sib().args(["validate", "--var", "root_volume_size_gib=big"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).contains("variable 'root_volume_size_gib' is declared as number"),
        "{}",
        text(&out)
    );
}

#[test]
fn packer_missing_is_reported_with_the_path_searched() {
    let out = run(sib_debian_packer()
        .env("PATH", "/nonexistent-bin")
        .args(["build"])
        .args(OFFLINE));
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("packer not found") && t.contains("/nonexistent-bin") && t.contains(">= 1.10.0"),
        "{t}"
    );
}

#[test]
fn packer_too_old_names_both_versions() {
    let work = tempfile::tempdir().unwrap();
    let out = run(sib_debian_packer()
        .args(["build", "--work-dir"])
        .arg(work.path())
        .args(OFFLINE));
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("Packer 1.6.6") && t.contains("requires Packer >= 1.10.0"),
        "{t}"
    );
}

#[test]
fn build_against_moto_extracts_amis_and_publish_keeps_history() {
    let moto = Moto::start();
    let source_ami = moto.amazon_ami();
    let work = tempfile::tempdir().unwrap();
    let out = run(sib_debian_packer()
        .args([
            "--output",
            "json",
            "build",
            "--template",
            "imagebuilder/tests/fixtures/moto-ebs",
        ])
        .args(OFFLINE)
        .args(["--region", "us-east-1", "--ami-region", "us-west-2"])
        .arg(format!("--var=endpoint={}", moto.endpoint))
        .arg(format!("--var=source_ami={source_ami}"))
        .arg("--work-dir")
        .arg(work.path()));
    assert!(out.status.success(), "{}", text(&out));
    let v = json(&out);
    let east = v["amis"]["us-east-1"].as_str().unwrap().to_string();
    let west = v["amis"]["us-west-2"].as_str().unwrap().to_string();
    assert!(
        east.starts_with("ami-") && west.starts_with("ami-") && east != west,
        "{v}"
    );
    assert!(moto.has_image(&east), "moto does not know {east}");
    assert_eq!(v["amis_from"], "artifact lines");
    // The manifest agrees with the artifact lines; the full log is on disk.
    let manifest = work.path().join("manifest.json");
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    let id = m["builds"][0]["artifact_id"].as_str().unwrap();
    assert!(
        id.contains(&format!("us-east-1:{east}")) && id.contains(&format!("us-west-2:{west}")),
        "{id}"
    );
    let log = std::fs::read_to_string(work.path().join("packer.log")).unwrap();
    assert!(log.contains(",artifact,0,id,"), "{log}");

    // Publish twice: from the manifest, then an explicit id; history is the versions.
    let parameter = "/slurm/compute/ami";
    let out = run(sib()
        .args([
            "--output",
            "json",
            "publish",
            "--parameter",
            parameter,
            "--region",
            "us-east-1",
            "--label",
            "first",
        ])
        .arg("--manifest")
        .arg(&manifest)
        .args(["--endpoint-url", &moto.endpoint]));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(json(&out)["version"], 1);
    let out = run(sib()
        .args([
            "--output",
            "json",
            "publish",
            "--parameter",
            parameter,
            "--region",
            "us-east-1",
            "--label",
            "second",
        ])
        .args(["--ami-id", &west, "--endpoint-url", &moto.endpoint]));
    assert!(out.status.success(), "{}", text(&out));
    let v = json(&out);
    assert_eq!(v["version"], 2);
    assert_eq!(v["history"][0]["value"], east.as_str());

    // Read back with the SDK, independently of the binary.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        std::env::set_var("AWS_ACCESS_KEY_ID", "testing");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "testing");
        let client = slurm_image_builder::publish::client(
            Some("us-east-1".into()),
            Some(moto.endpoint.clone()),
        )
        .await;
        let current = client.get_parameter().name(parameter).send().await.unwrap();
        let p = current.parameter().unwrap();
        assert_eq!(p.value(), Some(west.as_str()));
        assert_eq!(p.data_type(), Some("aws:ec2:image"));
        let history = client
            .get_parameter_history()
            .name(parameter)
            .send()
            .await
            .unwrap();
        let versions: Vec<(i64, String, Vec<String>)> = history
            .parameters()
            .iter()
            .map(|h| {
                (
                    h.version(),
                    h.value().unwrap().to_string(),
                    h.labels().to_vec(),
                )
            })
            .collect();
        assert_eq!(
            versions,
            vec![
                (1, east.clone(), vec!["first".to_string()]),
                (2, west.clone(), vec!["second".to_string()])
            ]
        );
    });

    // A value that is not an AMI id never reaches SSM.
    let out = run(sib()
        .args([
            "publish",
            "--parameter",
            parameter,
            "--region",
            "us-east-1",
            "--ami-id",
            "ami-nothex!",
        ])
        .args(["--endpoint-url", &moto.endpoint]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

#[test]
fn sigterm_cancels_packer_cleanly_with_exit_130_and_no_stray_process() {
    use std::os::unix::process::CommandExt;
    let work = tempfile::tempdir().unwrap();
    let log = work.path().join("packer.log");
    let mut child = sib_debian_packer()
        .args(["build", "--template", "imagebuilder/tests/fixtures/sleep"])
        .args(OFFLINE)
        .arg("--work-dir")
        .arg(work.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    // Wait until the step runs (the sleep is in progress), then cancel.
    let mut started = false;
    for _ in 0..600 {
        if std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("step started")
        {
            started = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    let pgid: i32 = log_text
        .split("process group ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no packer process group in the log: {log_text}"));
    if !started {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{pgid}")])
            .status();
        let _ = child.kill();
        panic!("the build step never started: {log_text}");
    }
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    let stray = processes_in_group(pgid);
    if !stray.is_empty() {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{pgid}")])
            .status();
    }
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("build cancelled by SIGTERM"));
    assert!(
        stray.is_empty(),
        "processes left in packer's group: {stray:?}"
    );
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(
        log_text.contains("Cleanly cancelled builds after being interrupted"),
        "{log_text}"
    );
    assert!(!log_text.contains("step finished"), "{log_text}");
}

/// The agent binary of this workspace (built by `cargo test --workspace` for its own tests).
fn agent_bin() -> std::path::PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| repo().join("target"));
    target.join("debug/slurm-node-agent")
}

#[test]
fn bench_script_probes_the_agent_with_the_flag_it_has() {
    let probe = |agent: &std::path::Path| {
        let out = run(std::process::Command::new("bash")
            .arg(repo().join("scripts/bench-imagebuilder.sh"))
            .env("BENCH_PROBE_ONLY", "1")
            .env("BENCH_AGENT", agent)
            .current_dir(repo()));
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    // A program that accepts anything is not taken for the agent.
    assert_eq!(
        probe(std::path::Path::new("/bin/true")),
        "agent: --without-agent"
    );
    let agent = agent_bin();
    if !agent.is_file() {
        eprintln!(
            "skipped the real-agent half: {} not built (cargo build -p slurm-node-agent)",
            agent.display()
        );
        return;
    }
    assert_eq!(
        probe(&agent),
        format!("agent: --agent-bin {}", agent.display())
    );
}

#[test]
fn var_overrides_are_checked_like_the_recipe_flags() {
    for (var, needle) in [
        (
            "arch=sparc",
            "variable 'arch': unknown architecture 'sparc'",
        ),
        ("os=plan9", "variable 'os': unknown OS 'plan9'"),
        (
            "region=moon-base",
            "variable 'region': 'moon-base' is not an AWS Region code",
        ),
        (
            "ami_regions=[\"eu-west-1\",\"Mars\"]",
            "variable 'ami_regions': 'Mars' is not an AWS Region code",
        ),
        (
            "nvidia_driver_version=latest;reboot",
            "variable 'nvidia_driver_version': 'latest;reboot'",
        ),
    ] {
        let out = run(sib().args(["validate", "--var", var]));
        assert_eq!(out.status.code(), Some(2), "{var}: {}", text(&out));
        assert!(text(&out).contains(needle), "{var}: {}", text(&out));
    }
    let out = run(sib().args(["plan", "--region", "us-east-1x"]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let out = run(sib().args(["plan", "--nvidia-driver", "550 "]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("NVIDIA driver '550 '"),
        "{}",
        text(&out)
    );
    let out = run(sib().args([
        "plan",
        "--region",
        "us-gov-west-1",
        "--ami-region",
        "eu-central-2",
        "--nvidia-driver",
        "550.127.05",
    ]));
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn packer_folder_is_found_without_the_repository_as_working_directory() {
    let elsewhere = tempfile::tempdir().unwrap();
    let out = run(sib()
        .current_dir(elsewhere.path())
        .env_remove("SIB_PACKER_DIR")
        .args(["--output", "json", "plan"]));
    assert!(out.status.success(), "{}", text(&out));
    let v = json(&out);
    assert_eq!(
        std::path::PathBuf::from(v["template"].as_str().unwrap()),
        repo().join("packer")
    );
    // A binary far from any source tree and share folder names what it tried.
    let bin = elsewhere.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::copy(
        env!("CARGO_BIN_EXE_slurm-image-builder"),
        bin.join("slurm-image-builder"),
    )
    .unwrap();
    let out = run(std::process::Command::new(bin.join("slurm-image-builder"))
        .current_dir(elsewhere.path())
        .env_remove("SIB_PACKER_DIR")
        .arg("plan"));
    if std::path::Path::new("/usr/share/slurm-image-builder/packer/node.pkr.hcl").is_file() {
        return;
    }
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("share/slurm-image-builder/packer")
            && text(&out).contains("/usr/share/slurm-image-builder/packer")
            && text(&out).contains("--packer-dir"),
        "{}",
        text(&out)
    );
    // Installed under a prefix: <prefix>/share/slurm-image-builder/packer.
    let share = elsewhere.path().join("share/slurm-image-builder/packer");
    std::fs::create_dir_all(&share).unwrap();
    for f in ["node.pkr.hcl", "variables.pkr.hcl", "sources.toml"] {
        std::fs::copy(repo().join("packer").join(f), share.join(f)).unwrap();
    }
    let standin = StandinPacker::shared();
    let out = run(std::process::Command::new(bin.join("slurm-image-builder"))
        .current_dir("/")
        .env_remove("SIB_PACKER_DIR")
        .env("SIB_PACKER", &standin.program)
        .args(["--output", "json", "plan"]));
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        json(&out)["template"]
            .as_str()
            .unwrap()
            .ends_with("share/slurm-image-builder/packer"),
        "{}",
        text(&out)
    );
}

#[test]
fn packer_validate_gets_absolute_existing_upload_folders() {
    let dir = tempfile::tempdir().unwrap();
    let packer = StandinPacker::new(dir.path(), "1.11.2");
    let out = run(sib()
        .arg("--packer")
        .arg(&packer.program)
        .args(["--output", "json", "validate"]));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(json(&out)["validate"], "ok");
    // Every call is recorded: nothing said that an upload folder is missing or relative.
    let calls = packer.calls();
    assert!(
        calls.len() == 4 && calls[3].starts_with("validate -var-file="),
        "{calls:?}"
    );
    let vars = std::fs::read_to_string(dir.path().join("calls.vars")).unwrap();
    assert!(vars.contains("agent_dir = \"/"), "{vars}");
}

#[test]
fn no_colour_on_stderr_when_it_is_not_a_terminal() {
    // validate logs the schema warnings through tracing.
    let out = run(sib().arg("validate"));
    assert!(out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("WARN"), "{err}");
    assert!(!err.contains('\u{1b}'), "ANSI escape in {err:?}");
}

#[test]
fn missing_sources_or_manifest_file_is_a_usage_error() {
    let out = run(sib().args(["plan", "--sources", "/nonexistent/sources.toml"]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("sources file /nonexistent/sources.toml: no such file"),
        "{}",
        text(&out)
    );
    let out = run(sib().args([
        "publish",
        "--parameter",
        "/slurm/ami",
        "--manifest",
        "/nonexistent/manifest.json",
    ]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("--manifest /nonexistent/manifest.json: no such file"),
        "{}",
        text(&out)
    );
}

/// The first two image ids of moto's `describe-images --owners amazon`.
fn two_amazon_amis(moto: &Moto) -> (String, String) {
    let body = "Action=DescribeImages&Version=2016-11-15&Owner.1=amazon";
    let resp = http_post(moto.port(), "/", body).unwrap();
    let ids: Vec<&str> = resp
        .split("<imageId>")
        .skip(1)
        .filter_map(|s| s.split("</imageId>").next())
        .collect();
    (ids[0].to_string(), ids[1].to_string())
}

/// `ec2:CreateLaunchTemplate` through the query API.
fn create_launch_template(moto: &Moto, name: &str, image: &str) {
    let image = image.replace(':', "%3A").replace('/', "%2F");
    let body = format!(
        "Action=CreateLaunchTemplate&Version=2016-11-15&LaunchTemplateName={name}\
         &LaunchTemplateData.ImageId={image}&LaunchTemplateData.InstanceType=m5.large"
    );
    let resp = http_post(moto.port(), "/", &body).unwrap();
    assert!(resp.contains("<launchTemplateId>"), "{resp}");
}

/// The image of the default version of a launch template, read with the SDK.
fn default_image(moto: &Moto, name: &str) -> (i64, String) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        std::env::set_var("AWS_ACCESS_KEY_ID", "testing");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "testing");
        let ec2 = slurm_image_builder::publish::ec2_client(
            Some("us-east-1".into()),
            Some(moto.endpoint.clone()),
        )
        .await;
        let out = ec2
            .describe_launch_template_versions()
            .launch_template_name(name)
            .versions("$Default")
            .send()
            .await
            .unwrap();
        let v = &out.launch_template_versions()[0];
        (
            v.version_number().unwrap(),
            v.launch_template_data()
                .and_then(|d| d.image_id())
                .unwrap()
                .to_string(),
        )
    })
}

#[test]
fn publish_rolls_the_named_launch_templates_to_the_new_image() {
    let moto = Moto::start();
    let (old, new) = two_amazon_amis(&moto);
    let parameter = "/slurm/compute/ami";
    create_launch_template(&moto, "compute", &old);
    create_launch_template(&moto, "follower", &format!("resolve:ssm:{parameter}"));
    let publish = |extra: &[&str]| {
        run(sib()
            .args(["--output", "json", "publish", "--parameter", parameter])
            .args(["--region", "us-east-1", "--ami-id", &new])
            .args(["--endpoint-url", &moto.endpoint])
            .args(extra))
    };
    let args = [
        "--launch-template",
        "compute",
        "--launch-template",
        "follower",
    ];
    let out = publish(&args);
    assert!(out.status.success(), "{}", text(&out));
    let v = json(&out);
    let t = &v["launch_templates"];
    assert_eq!(t[0]["name"], "compute", "{v}");
    assert_eq!(t[0]["outcome"], "updated", "{v}");
    assert_eq!(t[0]["previous_default"], 1, "{v}");
    assert_eq!(t[0]["previous_image"], old.as_str(), "{v}");
    assert_eq!(t[0]["default_version"], 2, "{v}");
    assert_eq!(t[1]["outcome"], "follows-parameter", "{v}");
    assert_eq!(default_image(&moto, "compute"), (2, new.clone()));
    assert_eq!(
        default_image(&moto, "follower"),
        (1, format!("resolve:ssm:{parameter}"))
    );

    // Again: converged, no new version.
    let out = publish(&args);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(json(&out)["launch_templates"][0]["outcome"], "unchanged");
    assert_eq!(default_image(&moto, "compute"), (2, new.clone()));

    // A template that does not exist: exit 7, named.
    let out = publish(&["--launch-template", "nope"]);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out));
    assert!(
        text(&out).contains("launch template nope"),
        "{}",
        text(&out)
    );
}

/// A packer folder with the real templates, sources, provisioning steps and key pins.
fn packer_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["node.pkr.hcl", "variables.pkr.hcl", "sources.toml"] {
        std::fs::copy(repo().join("packer").join(f), dir.path().join(f)).unwrap();
    }
    for sub in ["scripts", "files/keys"] {
        let to = dir.path().join(sub);
        std::fs::create_dir_all(&to).unwrap();
        for e in std::fs::read_dir(repo().join("packer").join(sub)).unwrap() {
            let p = e.unwrap().path();
            std::fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
        }
    }
    dir
}

#[test]
fn validate_reads_the_signing_key_pins_as_the_build_does() {
    let out = run(sib().args(["--output", "json", "validate"]));
    assert!(out.status.success(), "{}", text(&out));
    let pins = json(&out)["signing_keys"].clone();
    assert_eq!(pins.as_array().unwrap().len(), 2, "{pins}");
    assert_eq!(pins[1]["id"], "amazon-ssm-agent");
    assert_eq!(
        pins[1]["fingerprint"],
        "DE92C7DA3E56E92331D62A36BC1F495C97DD04ED"
    );

    // Harmless forms pass: a BOM, a 0x prefix, groups, a trailing comment, CRLF.
    let dir = packer_copy();
    let fpr = dir.path().join("files/keys/amazon-ssm-agent.fpr");
    std::fs::write(
        &fpr,
        "\u{feff}# SSM Agent\r\n0xDE92 C7DA 3E56 E923 31D6  2A36 BC1F 495C 97DD 04ed  # from AWS\r\n",
    )
    .unwrap();
    let out = run(sib().arg("--packer-dir").arg(dir.path()).arg("validate"));
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(
            "signing key pin ok: amazon-ssm-agent DE92C7DA3E56E92331D62A36BC1F495C97DD04ED"
        ),
        "{}",
        text(&out)
    );

    // A broken pin is refused before any build, naming the file, the line and what is wrong.
    std::fs::write(
        &fpr,
        "# SSM Agent\nDE92C7DA3E56E92331D62A36BC1F495C97DD04E\n",
    )
    .unwrap();
    let out = run(sib().arg("--packer-dir").arg(dir.path()).arg("validate"));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains(&format!(
            "{}, line 2: \"DE92C7DA3E56E92331D62A36BC1F495C97DD04E\" has 39 hex digits; a fingerprint has 40",
            fpr.display()
        )),
        "{}",
        text(&out)
    );
    // build stops on it too, before Packer is even looked for (here it would be exit 4).
    let out = run(sib()
        .arg("--packer-dir")
        .arg(dir.path())
        .arg("build")
        .args(OFFLINE));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("has 39 hex digits"), "{}", text(&out));
    std::fs::write(&fpr, "DE92C7DA3E56E92331D62A36BC1F495C97DD04ED; see AWS\n").unwrap();
    let out = run(sib().arg("--packer-dir").arg(dir.path()).arg("validate"));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("amazon-ssm-agent.fpr, line 1: \"DE92C7DA3E56E92331D62A36BC1F495C97DD04ED; see AWS\" is not a fingerprint"),
        "{}",
        text(&out)
    );

    // A key a step checks against with no pin, and a pin with no key beside it.
    std::fs::remove_file(&fpr).unwrap();
    std::fs::remove_file(
        dir.path()
            .join("files/keys/amazon-cloudwatch-agent.key-url"),
    )
    .unwrap();
    let out = run(sib().arg("--packer-dir").arg(dir.path()).arg("validate"));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("amazon-ssm-agent.fpr: no pinned signing key fingerprint: the file does not exist, and a provisioning step checks packages against key \"amazon-ssm-agent\"")
            && t.contains("amazon-cloudwatch-agent.fpr: no public key beside the pin: neither amazon-cloudwatch-agent.asc nor amazon-cloudwatch-agent.key-url"),
        "{t}"
    );
}

#[test]
fn plan_takes_several_slurm_versions_and_refuses_one_listed_twice() {
    let j = plan_json(&["--slurm-version", "25.11,26.05", "--slurm-default", "26.05"]);
    let vars = &j["variables"];
    assert_eq!(vars["slurm_version"], "26.05.3");
    assert!(vars["slurm_url"]
        .as_str()
        .unwrap()
        .ends_with("slurm-26-05-3-1.tar.gz"));
    let list = vars["slurm_versions"].as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["version"], "25.11.7");
    assert_eq!(list[0]["sha256"].as_str().unwrap().len(), 64);
    assert_eq!(list[1]["version"], "26.05.3");

    let out = run(sib().args([
        "plan",
        "--slurm-version",
        "25.11",
        "--slurm-version",
        "25.11.7",
    ]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("entries '25.11' and '25.11.7' are both Slurm 25.11.7"),
        "{}",
        text(&out)
    );
    let out = run(sib().args(["plan", "--slurm-version", "25.11,25.05"]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("slurm_versions entry '25.05': Slurm 25.05 has no pinned source"),
        "{}",
        text(&out)
    );
}
