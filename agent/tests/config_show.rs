//! `slurm-node-agent config show`: every key with its value and source, from files, user
//! data, tags (through the IMDS emulator) and flags; errors name the source and key.
#![allow(clippy::unwrap_used)]

use std::process::Command;

use imds_emulator::{Config, Emulator};

fn agent(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_slurm-node-agent"))
        .args(["config", "show"])
        .args(args)
        .arg("--config")
        .arg(dir.join("agent.toml"))
        .arg("--config-dir")
        .arg(dir.join("conf.d"))
        .env_clear()
        .output()
        .unwrap()
}

#[test]
fn shows_each_value_with_its_source() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("conf.d")).unwrap();
    let emu = Emulator::start(Config::default()).unwrap();
    emu.clear_tags();
    emu.set_tag("slurm-node-agent:node.weight", "40");
    emu.set_user_data(
        "Content-Type: multipart/mixed; boundary=\"XX\"\nMIME-Version: 1.0\n\n--XX\n\
         Content-Type: text/x-shellscript\n\n#!/bin/sh\necho hi\n--XX\n\
         Content-Type: application/x-slurm-node-agent\n\n[node]\nfeatures = [\"from-user-data\"]\n--XX--\n",
    );
    std::fs::write(
        dir.path().join("agent.toml"),
        format!(
            "[imds]\nendpoint = \"{}\"\n[auth]\nkey_source = \"ssm:/c/key\"\n",
            emu.endpoint()
        ),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("conf.d/10-site.toml"),
        "[node]\nweight = 5\n",
    )
    .unwrap();
    let out = agent(dir.path(), &["--output", "json", "--node-name", "n-9"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["node.weight"]["value"], 40);
    assert_eq!(
        v["node.weight"]["source"],
        "instance tag \"slurm-node-agent:node.weight\""
    );
    assert_eq!(v["node.features"]["value"][0], "from-user-data");
    assert_eq!(
        v["node.features"]["source"],
        "user data part 2 (application/x-slurm-node-agent)"
    );
    assert_eq!(v["node.name"]["value"], "n-9");
    assert_eq!(v["node.name"]["source"], "command line");
    assert_eq!(v["auth.key_source"]["value"], "ssm:/c/key");
    assert!(v["auth.key_source"]["source"]
        .as_str()
        .unwrap()
        .ends_with("agent.toml"));
    assert_eq!(v["slurm.slurmd_unit"]["source"], "default");

    // Without IMDS: files and flags only.
    let out = agent(dir.path(), &["--no-imds"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("node.weight = 5"), "{text}");
    assert!(text.contains("10-site.toml"), "{text}");
}

/// A whole user data document gzip-compressed (served as bytes by IMDS) is read.
#[test]
fn gzip_compressed_user_data_is_read() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("conf.d")).unwrap();
    let emu = Emulator::start(Config::default()).unwrap();
    emu.clear_tags();
    let doc = "Content-Type: multipart/mixed; boundary=\"XX\"\n\n--XX\n\
         Content-Type: application/x-slurm-node-agent\n\n[node]\nfeatures = [\"zipped\"]\n--XX--\n";
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(doc.as_bytes()).unwrap();
    emu.set_user_data(gz.finish().unwrap());
    std::fs::write(
        dir.path().join("agent.toml"),
        format!("[imds]\nendpoint = \"{}\"\n", emu.endpoint()),
    )
    .unwrap();
    let out = agent(dir.path(), &["--output", "json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("not text"), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["node.features"]["value"][0], "zipped");
    assert_eq!(
        v["node.features"]["source"],
        "user data part 1 (application/x-slurm-node-agent)"
    );
}

/// The JSON log lines' targets at a verbosity.
fn log_targets(dir: &std::path::Path, verbose: &str) -> Vec<String> {
    let out = agent(dir, &[verbose, "--log-format", "json"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    err.lines()
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}"));
            v["target"].as_str().unwrap_or_default().to_string()
        })
        .collect()
}

/// `-v` is the agent's own debug output; the AWS SDK's and HTTP libraries' (hundreds of
/// lines per call) only from `-vvv`.
#[test]
fn verbosity_is_the_agents_until_vvv() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("conf.d")).unwrap();
    let emu = Emulator::start(Config::default()).unwrap();
    std::fs::write(
        dir.path().join("agent.toml"),
        format!("[imds]\nendpoint = \"{}\"\n", emu.endpoint()),
    )
    .unwrap();
    let library = |t: &String| !t.starts_with("slurm_node_agent");
    let v1 = log_targets(dir.path(), "-v");
    assert!(!v1.iter().any(library), "{v1:?}");
    let v3 = log_targets(dir.path(), "-vvv");
    assert!(v3.iter().any(|t| t.starts_with("aws_")), "{v3:?}");
}

/// Off EC2 (nothing answers at the IMDS endpoint) the error says to use `--no-imds`.
#[test]
fn off_ec2_the_error_suggests_no_imds() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("conf.d")).unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    std::fs::write(
        dir.path().join("agent.toml"),
        format!(
            "[imds]\nendpoint = \"http://127.0.0.1:{port}\"\nattempts = 1\ntimeout = \"300ms\"\n"
        ),
    )
    .unwrap();
    let out = agent(dir.path(), &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(err.contains("instance metadata"), "{err}");
    assert!(err.contains("--no-imds"), "{err}");
    let out = agent(dir.path(), &["--no-imds"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn errors_name_file_line_and_key_and_exit_78() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("conf.d")).unwrap();
    std::fs::write(dir.path().join("agent.toml"), "[node]\nweight = 1\n").unwrap();
    std::fs::write(
        dir.path().join("conf.d/20-x.toml"),
        "[slurm]\nconf_servers = 7\n",
    )
    .unwrap();
    let out = agent(dir.path(), &["--no-imds"]);
    assert_eq!(out.status.code(), Some(78));
    let err = String::from_utf8_lossy(&out.stderr);
    // The file, line and column, the key, what it takes, an example, toml's snippet.
    assert!(
        err.contains(
            "20-x.toml, line 2, column 16: key `slurm.conf_servers`: expected a list of \
             strings, got the integer 7; for example `slurm.conf_servers = ["
        ),
        "{err}"
    );
    assert!(err.contains("2 | conf_servers = 7\n"), "{err}");
    // `config show` checks the NodeName template's placeholders, as bootstrap does.
    std::fs::write(
        dir.path().join("conf.d/20-x.toml"),
        "[node]\nname_template = \"{instance_idd}\"\n",
    )
    .unwrap();
    let out = agent(dir.path(), &["--no-imds"]);
    assert_eq!(out.status.code(), Some(78));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "20-x.toml, line 2: key `node.name_template`: unknown placeholder {instance_idd}"
        ),
        "{err}"
    );
    std::fs::remove_file(dir.path().join("conf.d/20-x.toml")).unwrap();
    let out = agent(
        dir.path(),
        &["--no-imds", "--set", "node.name=a.b.example.com"],
    );
    assert_eq!(out.status.code(), Some(78));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("command line: key `node.name`") && err.contains("FQDN"),
        "{err}"
    );
}
