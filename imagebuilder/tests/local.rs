//! `build --target local` for real: mmdebstrap makes a Debian 12 root, the provisioning
//! steps of `packer/scripts` run in it through chroot (Slurm and munge from Debian's
//! packages), the acceptance checks pass inside, and a tarball and a qcow2 come out.
//! Then the steps run again on the finished root (idempotence) and change nothing the
//! acceptance checks look at. Needs root, mmdebstrap, qemu-img and the Debian mirror;
//! takes about a minute with a warm apt cache (`target/sib-apt-cache`).
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use std::path::PathBuf;

/// The agent binary of this workspace, when built and able to run the acceptance
/// checks' `check --no-act` (the agent's CLI is being written; until it is, the image is
/// built without it and the checks report it as absent, which this test asserts too).
fn usable_agent() -> Option<PathBuf> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target"));
    let bin = ["release", "debug"]
        .iter()
        .map(|p| target.join(p).join("slurm-node-agent"))
        .find(|p| p.is_file())?;
    let ok = |args: &[&str]| {
        std::process::Command::new(&bin)
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    (ok(&["--version"]) && ok(&["check", "--no-act", "--help"])).then_some(bin)
}

#[test]
fn local_target_builds_a_debian_root_that_passes_acceptance() {
    let _one = LOCAL_BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let work = tempfile::Builder::new()
        .prefix("sib-local-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let cache = repo().join("target/sib-apt-cache");
    let agent = usable_agent();
    let mut cmd = sib();
    // From an empty folder, so that only an explicit --agent-bin is used.
    cmd.current_dir(work.path())
        .arg("--packer-dir")
        .arg(repo().join("packer"))
        .args([
            "--output",
            "json",
            "build",
            "--target",
            "local",
            "--units-dir",
        ])
        .arg(repo().join("units"))
        .arg("--work-dir")
        .arg(work.path().join("out"))
        .arg("--apt-cache")
        .arg(&cache);
    if let Some(a) = &agent {
        cmd.arg("--agent-bin").arg(a);
    } else {
        eprintln!(
            "NOTE: no slurm-node-agent with `check` built: the image is built without the agent"
        );
    }
    let out = run(&mut cmd);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let acceptance: Vec<String> = serde_json::from_value(v["acceptance"].clone()).unwrap();
    let has = |line: &str| acceptance.iter().any(|l| l.contains(line));
    assert!(has("ok: slurmd -V reports 22.05.8"), "{acceptance:#?}");
    assert!(has("ok: munge: round trip"), "{acceptance:#?}");
    assert!(has("ok: unit slurmd.service enabled"), "{acceptance:#?}");
    assert!(has("ok: cleanup: nothing left"), "{acceptance:#?}");
    // Package updates on a node: apt waits on the lock and upgrades nothing by itself (as
    // apt reads its configuration); needrestart never restarts the node's daemons.
    assert!(
        has("ok: package updates: apt has DPkg::Lock::Timeout \"600\";"),
        "{acceptance:#?}"
    );
    assert!(
        has("ok: package updates: apt has APT::Periodic::Unattended-Upgrade \"0\";"),
        "{acceptance:#?}"
    );
    assert!(
        has("ok: package updates: needrestart never restarts slurmd, sackd, munge, the agent"),
        "{acceptance:#?}"
    );
    assert!(!has("FAIL"), "{acceptance:#?}");
    if agent.is_some() {
        assert!(has("ok: slurm-node-agent --version"), "{acceptance:#?}");
        assert!(
            has("ok: slurm-node-agent check --no-act"),
            "{acceptance:#?}"
        );
        // Slurm's HealthCheckProgram, run as slurmd runs it.
        assert!(
            has("ok: slurm-node-agent-healthcheck --no-act (as slurmd runs it)"),
            "{acceptance:#?}"
        );
    } else {
        assert!(
            has("not checked: slurm-node-agent (agent: slurm-node-agent binary: absent"),
            "{acceptance:#?}"
        );
    }

    // Unreachable sources are skipped by name and URL, never silently.
    let skipped: Vec<String> = serde_json::from_value(v["skipped"].clone()).unwrap();
    assert!(
        skipped.iter().any(|s| s.starts_with(
            "EFA installer 1.41.0: unreachable from here (https://efa-installer.amazonaws.com/"
        )),
        "{skipped:#?}"
    );
    assert!(
        skipped.iter().any(|s| s.starts_with(
            "FSx Lustre client repository: unreachable from here (https://fsx-lustre-client-repo"
        )),
        "{skipped:#?}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("skipped: EFA installer 1.41.0 unreachable from here"),
        "{stderr}"
    );

    // The artifacts: a tarball of the root and a qcow2 image of it.
    let tarball = PathBuf::from(v["tarball"].as_str().unwrap());
    let list = run(std::process::Command::new("tar").arg("-tzf").arg(&tarball));
    assert!(list.status.success());
    let list = String::from_utf8_lossy(&list.stdout);
    assert!(
        list.lines().any(|l| l == "./usr/sbin/slurmd"),
        "slurmd not in the tarball"
    );
    assert!(list
        .lines()
        .any(|l| l == "./usr/local/sbin/slurm-image-acceptance"));
    if agent.is_some() {
        // The agent's man pages and completions, written by the agent itself (70-agent.sh).
        for file in [
            "./usr/local/share/man/man1/slurm-node-agent.1",
            "./usr/local/share/man/man1/slurm-node-agent-bootstrap.1",
            "./usr/local/share/man/man1/slurm-node-agent-healthcheck.1",
            "./usr/local/share/bash-completion/completions/slurm-node-agent",
            "./usr/local/share/zsh/site-functions/_slurm-node-agent-healthcheck",
            "./usr/local/share/fish/vendor_completions.d/slurm-node-agent.fish",
        ] {
            assert!(list.lines().any(|l| l == file), "{file} not in the tarball");
        }
    }
    assert!(
        !list.lines().any(|l| l.starts_with("./tmp/slurm-image/")),
        "staging left in the image"
    );
    let qcow2 = PathBuf::from(v["qcow2"].as_str().unwrap());
    let info = run(std::process::Command::new("qemu-img")
        .args(["info", "--output=json"])
        .arg(&qcow2));
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(info["format"], "qcow2");

    // Idempotence: the same steps again on the finished root, then the checks again.
    let root = PathBuf::from(v["root"].as_str().unwrap());
    let before = std::fs::read_to_string(root.join("etc/slurm-image/build-info")).unwrap();
    let mut again = sib();
    again
        .current_dir(work.path())
        .arg("--packer-dir")
        .arg(repo().join("packer"))
        .args([
            "--output",
            "json",
            "build",
            "--target",
            "local",
            "--steps-only",
            "--no-artifacts",
            "--units-dir",
        ])
        .arg(repo().join("units"))
        .arg("--work-dir")
        .arg(work.path().join("out"));
    match &agent {
        Some(a) => again.arg("--agent-bin").arg(a),
        None => again.arg("--without-agent"),
    };
    let out = run(&mut again);
    assert!(out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("installing:"),
        "the second run installed packages again: {stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("etc/slurm-image/build-info")).unwrap(),
        before
    );
}

/// The two local builds share the apt cache: one at a time.
static LOCAL_BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());

// The source-build path (`--slurm-source debian-source`) is proven in the fleet proving
// ground, where the same build is also booted as a node: tests/tests/fleet.rs,
// `a_node_of_the_source_built_image_runs_pmix_steps_and_slurmrestd`.

/// `--agent-package`: the workspace's .deb (scripts/package.sh on the debug build) installed
/// by apt inside the root: dpkg knows it, the units are the package's in
/// /usr/lib/systemd/system (none copied to /etc) and enabled, the old /usr/local/bin path
/// links to /usr/bin, and the acceptance checks run the packaged agent.
#[test]
fn local_target_installs_the_agent_package_with_apt() {
    let _one = LOCAL_BUILD.lock().unwrap_or_else(|e| e.into_inner());
    if usable_agent().is_none()
        || std::process::Command::new("cargo-deb")
            .arg("--version")
            .output()
            .is_err()
    {
        eprintln!("skipped: no debug build or no cargo-deb (scripts/test-deps.sh)");
        return;
    }
    let work = tempfile::Builder::new()
        .prefix("sib-local-pkg-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let out = run(
        std::process::Command::new(repo().join("scripts/package.sh"))
            .args(["--profile", "dev", "--no-build", "--fast", "--out"])
            .arg(work.path().join("packages")),
    );
    assert!(out.status.success(), "{}", text(&out));
    let deb = PathBuf::from(String::from_utf8_lossy(&out.stdout).lines().next().unwrap());
    let started = std::time::Instant::now();
    let out = run(sib()
        .current_dir(work.path())
        .arg("--packer-dir")
        .arg(repo().join("packer"))
        .args([
            "--output",
            "json",
            "build",
            "--target",
            "local",
            "--no-artifacts",
        ])
        .arg("--agent-package")
        .arg(&deb)
        .arg("--work-dir")
        .arg(work.path().join("out"))
        .arg("--apt-cache")
        .arg(repo().join("target/sib-apt-cache")));
    assert!(out.status.success(), "{}", text(&out));
    eprintln!(
        "local build with the .deb: {:.0}s",
        started.elapsed().as_secs_f64()
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let acceptance: Vec<String> = serde_json::from_value(v["acceptance"].clone()).unwrap();
    let has = |line: &str| acceptance.iter().any(|l| l.contains(line));
    assert!(has("ok: slurm-node-agent --version"), "{acceptance:#?}");
    assert!(
        has("ok: slurm-node-agent-healthcheck --no-act (as slurmd runs it)"),
        "{acceptance:#?}"
    );
    assert!(!has("FAIL"), "{acceptance:#?}");

    let root = PathBuf::from(v["root"].as_str().unwrap());
    let status = run(std::process::Command::new("dpkg-query")
        .arg(format!(
            "--admindir={}",
            root.join("var/lib/dpkg").display()
        ))
        .args(["-W", "-f", "${Status} ${Version}", "slurm-node-agent"]));
    assert_eq!(
        String::from_utf8_lossy(&status.stdout),
        format!("install ok installed {}-1", env!("CARGO_PKG_VERSION"))
    );
    for unit in [
        "slurm-node-agent.service",
        "slurm-node-agent-bootstrap.service",
    ] {
        assert!(
            root.join("usr/lib/systemd/system").join(unit).is_file(),
            "{unit}"
        );
        assert!(
            !root.join("etc/systemd/system").join(unit).exists(),
            "{unit} copied to /etc, shadowing the package's"
        );
        // Enabled from the package's file: /usr/lib, or /lib as Debian 12's systemctl
        // names the same folder (merged /usr).
        let link = std::fs::read_link(
            root.join("etc/systemd/system/multi-user.target.wants")
                .join(unit),
        )
        .unwrap();
        assert!(
            [
                PathBuf::from("/usr/lib/systemd/system").join(unit),
                PathBuf::from("/lib/systemd/system").join(unit)
            ]
            .contains(&link),
            "{unit} enabled as {}",
            link.display()
        );
    }
    assert!(!root
        .join("etc/systemd/system/slurmd.service.d/slurm-node-agent.conf")
        .exists());
    for bin in ["slurm-node-agent", "slurm-node-agent-healthcheck"] {
        assert_eq!(
            std::fs::read_link(root.join("usr/local/bin").join(bin)).unwrap(),
            PathBuf::from("/usr/bin").join(bin)
        );
    }
    // The image's own settings drop-in, beside the package's settings.
    assert!(root
        .join("etc/slurm-node-agent/conf.d/10-image.toml")
        .is_file());
    assert!(root.join("var/lib/slurm-node-agent").is_dir());
}
