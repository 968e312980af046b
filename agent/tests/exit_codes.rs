//! What `docs/exit-codes.md` says of the commands' exits, run: a usage error ends with
//! clap's hint; `status` with neither a bootstrap record nor instance metadata exits 69;
//! `config show` with `ec2:DescribeTags` denied exits 77. (The tables themselves are
//! checked against `src/exit.rs` in its unit tests.)
#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

use slurm_e2e::moto::{Moto, REGION};

fn agent(dir: &std::path::Path, args: &[&str], env: &[(String, String)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_slurm-node-agent"))
        .args(args)
        .arg("--config")
        .arg(dir.join("agent.toml"))
        .arg("--config-dir")
        .arg(dir.join("conf.d"))
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .unwrap()
}

fn docs() -> String {
    std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/exit-codes.md"),
    )
    .unwrap()
}

#[test]
fn a_usage_error_exits_2_and_ends_with_claps_hint_as_the_docs_say() {
    for args in [
        &["drain", "--no-such-flag"][..],
        &["status", "--output", "yaml"],
        &["no-such-command"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_slurm-node-agent"))
            .args(args)
            .env_clear()
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap();
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        assert!(
            docs()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .contains(&format!("its last line is `{last}`")),
            "{args:?}: the last line is {last:?}, which docs/exit-codes.md does not say"
        );
    }
}

/// A free port: nothing answers there.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn status_with_neither_a_bootstrap_record_nor_instance_metadata_exits_69() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("conf.d")).unwrap();
    std::fs::write(
        dir.path().join("agent.toml"),
        format!(
            "[imds]\nendpoint = \"http://127.0.0.1:{}\"\nattempts = 1\ntimeout = \"300ms\"\n\
             [agent]\nstate_dir = \"{}\"\n",
            closed_port(),
            dir.path().join("state").display()
        ),
    )
    .unwrap();
    let out = agent(dir.path(), &["status", "--no-slurm"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(err.contains("instance metadata"), "{err}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn config_show_with_describe_tags_denied_exits_77_naming_the_api() {
    // moto enforces IAM after four actions: the image, the instance, a user without any
    // policy and its access key.
    let moto = Moto::start_with_env(&[("INITIAL_NO_AUTH_ACTION_COUNT", "4")]).unwrap();
    let image = moto.register_image("exit-codes").unwrap();
    let id = moto.run_instance(&image).unwrap();
    let (key_id, secret) = moto.create_user_without_permissions("node").unwrap();
    let emu = imds_emulator::Emulator::start(imds_emulator::Config::default()).unwrap();
    emu.clear_tags();
    emu.set("instance-id", id.as_str());
    emu.set("placement/region", REGION);
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("conf.d")).unwrap();
    std::fs::write(
        dir.path().join("agent.toml"),
        format!(
            "[imds]\nendpoint = \"{}\"\nattempts = 1\ntags = \"describe-tags\"\n\
             [agent]\nstate_dir = \"{}\"\n",
            emu.endpoint(),
            dir.path().join("state").display()
        ),
    )
    .unwrap();
    let mut env = moto.env();
    env.retain(|(k, _)| k != "AWS_ACCESS_KEY_ID" && k != "AWS_SECRET_ACCESS_KEY");
    env.push(("AWS_ACCESS_KEY_ID".into(), key_id));
    env.push(("AWS_SECRET_ACCESS_KEY".into(), secret));
    let out = agent(dir.path(), &["config", "show"], &env);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(77), "{err}");
    assert!(err.contains("DescribeTags"), "{err}");
}
