//! `slurm-node-agent config cloudwatch`: the CloudWatch agent's configuration rendered from
//! the settings (files, user data and tags through the IMDS emulator), validated against
//! the CloudWatch agent's own JSON Schema (`shared/reference/cloudwatch-agent/schema.json`,
//! draft-04, with Python's `jsonschema`, Debian's python3-jsonschema); bad values refused
//! naming their key; `--write` atomic and idempotent.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use imds_emulator::{Config, Emulator};

/// The CloudWatch agent's schema (a copy of the shared reference data: its README says
/// where from).
fn schema() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cloudwatch-agent/schema.json")
}

#[test]
fn the_schema_copy_matches_the_shared_reference() {
    let shared = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/reference/cloudwatch-agent/schema.json");
    if !shared.is_file() {
        eprintln!("skipped: {} not here", shared.display());
        return;
    }
    assert!(
        std::fs::read(&shared).unwrap() == std::fs::read(schema()).unwrap(),
        "agent/tests/fixtures/cloudwatch-agent/schema.json differs from {}: refresh it",
        shared.display()
    );
}

/// Validates `config` (JSON text) against the schema: `Err(what the validator said)`.
fn validate(config: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("amazon-cloudwatch-agent.json");
    std::fs::write(&file, config).unwrap();
    let out = Command::new("python3")
        .args([
            "-c",
            "import json, sys, jsonschema\n\
             schema = json.load(open(sys.argv[1]))\n\
             jsonschema.Draft4Validator.check_schema(schema)\n\
             errors = sorted(jsonschema.Draft4Validator(schema).iter_errors(json.load(open(sys.argv[2]))), key=str)\n\
             for e in errors: print('/'.join(map(str, e.absolute_path)), ':', e.message)\n\
             sys.exit(1 if errors else 0)",
        ])
        .arg(schema())
        .arg(&file)
        .output()
        .expect("python3 with jsonschema (scripts/test-deps.sh installs python3-jsonschema)");
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

struct Node {
    dir: tempfile::TempDir,
    emu: Emulator,
}

impl Node {
    fn new(settings: &str) -> Node {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("conf.d")).unwrap();
        std::fs::create_dir_all(dir.path().join("sys/class/infiniband")).unwrap();
        std::fs::create_dir_all(dir.path().join("dev")).unwrap();
        let emu = Emulator::start(Config::default()).unwrap();
        emu.clear_tags();
        std::fs::write(
            dir.path().join("agent.toml"),
            format!(
                "[imds]\nendpoint = \"{}\"\n\n[cloudwatch]\nconfig_file = \"{}\"\n{settings}",
                emu.endpoint(),
                dir.path().join("cw/amazon-cloudwatch-agent.json").display()
            ),
        )
        .unwrap();
        Node { dir, emu }
    }

    fn run(&self, args: &[&str]) -> std::process::Output {
        let d = self.dir.path();
        Command::new(env!("CARGO_BIN_EXE_slurm-node-agent"))
            .args(["config", "cloudwatch"])
            .args(args)
            .arg("--config")
            .arg(d.join("agent.toml"))
            .arg("--config-dir")
            .arg(d.join("conf.d"))
            .arg("--sys-dir")
            .arg(d.join("sys"))
            .arg("--dev-dir")
            .arg(d.join("dev"))
            .env_clear()
            .output()
            .unwrap()
    }

    fn written(&self) -> PathBuf {
        self.dir.path().join("cw/amazon-cloudwatch-agent.json")
    }
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn the_schema_check_can_fail() {
    assert!(validate(r#"{"logs": {"logs_collected": {"journald": {"collect_list": [{"units": ["a.service"]}]}}}}"#).is_err());
    assert!(validate(r#"{"logs": {"logs_collected": {"files": {"collect_list": [{"file_path": "/x", "log_group_name": "g", "retention_in_days": 31}]}}}}"#).is_err());
}

#[test]
fn groups_are_named_for_the_cluster_from_user_data_and_validate_against_the_schema() {
    let node = Node::new("retention_days = 90\n");
    node.emu.set_user_data(
        "Content-Type: multipart/mixed; boundary=\"XX\"\nMIME-Version: 1.0\n\n--XX\n\
         Content-Type: application/x-slurm-node-agent\n\n[cloudwatch]\ncluster_name = \"genomics-prod\"\n--XX--\n",
    );
    let out = node.run(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    validate(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let journald = v["logs"]["logs_collected"]["journald"]["collect_list"]
        .as_array()
        .unwrap();
    let groups: Vec<&str> = journald
        .iter()
        .map(|e| e["log_group_name"].as_str().unwrap())
        .collect();
    assert_eq!(
        groups,
        [
            "/slurm/genomics-prod/agent",
            "/slurm/genomics-prod/slurm",
            "/slurm/genomics-prod/kernel"
        ]
    );
    assert!(journald
        .iter()
        .all(|e| e["retention_in_days"] == 90 && e["log_stream_name"] == "{instance_id}"));
    assert_eq!(journald[2]["matches"][0]["_TRANSPORT"], "kernel");
    assert_eq!(
        journald[0]["units"],
        serde_json::json!([
            "slurm-node-agent.service",
            "slurm-node-agent-bootstrap.service"
        ])
    );
    let files = v["logs"]["logs_collected"]["files"]["collect_list"]
        .as_array()
        .unwrap();
    assert_eq!(files[0]["file_path"], "/var/log/cloud-init.log");
    assert_eq!(
        files[0]["log_group_name"],
        "/slurm/genomics-prod/cloud-init"
    );
    assert!(v["metrics"]["metrics_collected"]["nvidia_smi"].is_null());
    // Nothing written without --write.
    assert!(!node.written().exists());
}

#[test]
fn native_gpu_and_efa_metrics_and_the_prometheus_scrape_validate_too() {
    let node =
        Node::new("prometheus_config = \"/opt/aws/amazon-cloudwatch-agent/etc/prometheus.yaml\"\n");
    std::fs::write(node.dir.path().join("dev/nvidia0"), "").unwrap();
    std::fs::create_dir(node.dir.path().join("sys/class/infiniband/rdmap0s6")).unwrap();
    let out = node.run(&["--no-imds"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // No cluster name anywhere: `slurm`, and a warning naming the key to set.
    assert!(
        stderr(&out).contains("cloudwatch.cluster_name"),
        "{}",
        stderr(&out)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    validate(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(v["metrics"]["metrics_collected"]["nvidia_smi"].is_object());
    assert!(v["metrics"]["metrics_collected"]["efa"].is_object());
    let prom = &v["logs"]["metrics_collected"]["prometheus"];
    assert_eq!(prom["log_group_name"], "/slurm/slurm/prometheus");
    // Every metric the declarations select is one the agent writes.
    let src: String = [
        "src/health/output.rs",
        "src/node_state/metrics.rs",
        "src/bootstrap/metrics.rs",
    ]
    .iter()
    .map(|f| std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(f)).unwrap())
    .collect();
    for decl in prom["emf_processor"]["metric_declaration"]
        .as_array()
        .unwrap()
    {
        for sel in decl["metric_selectors"].as_array().unwrap() {
            let name = sel
                .as_str()
                .unwrap()
                .trim_start_matches('^')
                .trim_end_matches('$');
            assert!(
                src.contains(&format!("\"{name}")),
                "{name} is not a metric the agent writes"
            );
        }
    }
}

#[test]
fn write_is_atomic_and_idempotent_and_bad_values_name_their_key() {
    let node = Node::new("cluster_name = \"hpc-a\"\n");
    let out = node.run(&["--no-imds", "--write"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let first = std::fs::read_to_string(node.written()).unwrap();
    validate(&first).unwrap();
    assert!(first.contains("/slurm/hpc-a/agent"), "{first}");
    let mtime = std::fs::metadata(node.written())
        .unwrap()
        .modified()
        .unwrap();
    let out = node.run(&["--no-imds", "--write"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::metadata(node.written())
            .unwrap()
            .modified()
            .unwrap(),
        mtime,
        "rewritten though unchanged"
    );

    // A retention CloudWatch Logs does not accept: exit 78 naming the key and the file.
    std::fs::write(
        node.dir.path().join("conf.d/50-site.toml"),
        "[cloudwatch]\nretention_days = 31\n",
    )
    .unwrap();
    let out = node.run(&["--no-imds", "--write"]);
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    let e = stderr(&out);
    assert!(
        e.contains("cloudwatch.retention_days") && e.contains("50-site.toml"),
        "{e}"
    );
    // Nothing changed on disk.
    assert_eq!(std::fs::read_to_string(node.written()).unwrap(), first);

    // A template without {log}.
    std::fs::write(
        node.dir.path().join("conf.d/50-site.toml"),
        "[cloudwatch]\nlog_group_template = \"/slurm/{cluster}\"\n",
    )
    .unwrap();
    let out = node.run(&["--no-imds"]);
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cloudwatch.log_group_template"),
        "{}",
        stderr(&out)
    );

    // --write with no file to write: refused naming the key.
    std::fs::write(
        node.dir.path().join("conf.d/50-site.toml"),
        "[cloudwatch]\nconfig_file = \"\"\n",
    )
    .unwrap();
    let out = node.run(&["--no-imds", "--write"]);
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cloudwatch.config_file"),
        "{}",
        stderr(&out)
    );
}
