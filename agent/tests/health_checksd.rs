//! The checks.d format as docs/health-checks.md documents it: every ```toml example of its
//! "The checks.d format" section is loaded and run by the real `slurm-node-agent check`
//! beside the image's defaults (`packer/files/checks.d/10-defaults.toml`), and does what the
//! page says (a definition with the name of a default replaces it, `enabled = false` turns
//! one off, the others are added), with no definition refused.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The ```toml blocks of the page's section `## The checks.d format`.
fn examples() -> Vec<String> {
    let page = std::fs::read_to_string(root().join("docs/health-checks.md")).unwrap();
    let start = page
        .find("\n## The checks.d format\n")
        .expect("docs/health-checks.md has no section \"The checks.d format\"");
    let rest = &page[start + 1..];
    let section = &rest[..rest[3..].find("\n## ").map_or(rest.len(), |i| i + 3)];
    let mut out = Vec::new();
    let mut body: Option<String> = None;
    for line in section.lines() {
        match (&mut body, line) {
            (None, "```toml") => body = Some(String::new()),
            (Some(b), "```") => {
                out.push(std::mem::take(b));
                body = None;
            }
            (Some(b), l) => {
                b.push_str(l);
                b.push('\n');
            }
            _ => {}
        }
    }
    out
}

/// `(name, origin, family)` of each result of `check --no-act --output json` run on `dir`
/// as checks.d, with the key file `key` as a munge node's.
fn run_checks(dir: &Path, key: &Path) -> Vec<(String, String, String)> {
    let scratch = dir.parent().unwrap();
    std::fs::write(scratch.join("none.toml"), "").unwrap();
    std::fs::create_dir_all(scratch.join("none.d")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_slurm-node-agent"))
        .env_clear()
        .env("SLURMD_NODENAME", "node1")
        .arg("check")
        .arg(format!("--config={}", scratch.join("none.toml").display()))
        .arg(format!("--config-dir={}", scratch.join("none.d").display()))
        .arg(format!("--checks-dir={}", dir.display()))
        .arg(format!(
            "--set=agent.state_dir={}",
            scratch.join("state").display()
        ))
        .arg(format!("--set=auth.key_path={}", key.display()))
        .args(["--no-act", "--output", "json"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_string(),
                c["origin"].as_str().unwrap().to_string(),
                c["family"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn the_docs_checks_d_examples_load_and_run_beside_the_images_defaults() {
    let blocks = examples();
    assert!(blocks.len() >= 2, "examples found: {blocks:?}");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("checks.d");
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(
        root().join("packer/files/checks.d/10-defaults.toml"),
        dir.join("10-defaults.toml"),
    )
    .unwrap();
    let key = tmp.path().join("munge.key");
    std::fs::write(&key, [7u8; 1024]).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400)).unwrap();

    // The defaults alone: every check named, none refused.
    let defaults = run_checks(&dir, &key);
    let refused: Vec<_> = defaults.iter().filter(|c| c.2 == "config").collect();
    assert!(refused.is_empty(), "refused definitions: {refused:?}");
    for name in [
        "root file system",
        "/tmp space",
        "cluster key",
        "munged",
        "slurmd",
    ] {
        assert!(
            defaults
                .iter()
                .any(|c| c.0 == name && c.1.contains("10-defaults.toml:")),
            "{name} not among the defaults' checks: {defaults:?}"
        );
    }
    // A login node's sackd is not a compute node's check.
    assert!(!defaults.iter().any(|c| c.0 == "sackd"), "{defaults:?}");

    // With the page's examples, each in a later file.
    let mut defined: Vec<(String, bool)> = Vec::new();
    for (i, text) in blocks.iter().enumerate() {
        std::fs::write(dir.join(format!("50-example-{i}.toml")), text).unwrap();
        let doc: toml::Table = text.parse().unwrap();
        for c in doc["check"].as_array().unwrap() {
            let enabled = c.get("enabled").and_then(|e| e.as_bool()).unwrap_or(true);
            defined.push((c["name"].as_str().unwrap().to_string(), enabled));
        }
    }
    let results = run_checks(&dir, &key);
    let refused: Vec<_> = results.iter().filter(|c| c.2 == "config").collect();
    assert!(refused.is_empty(), "refused definitions: {refused:?}");
    for (name, enabled) in &defined {
        let found: Vec<_> = results.iter().filter(|c| &c.0 == name).collect();
        if *enabled {
            // Present once, from the example, in place of a default of that name.
            assert!(
                found.len() == 1 && found[0].1.contains("50-example-"),
                "{name}: {found:?} in {results:?}"
            );
        } else {
            assert!(found.is_empty(), "{name} was turned off: {found:?}");
        }
    }
    assert!(
        defined.iter().any(|(n, e)| n == "root file system" && *e),
        "the page no longer shows a default replaced"
    );
}
