//! `--agent-package FILE.deb|FILE.rpm`: the image builder reads the package's version and
//! architecture with dpkg-deb / rpm, unpacks its programs, and refuses, before Packer
//! starts, a package the image cannot install or run (another package format than the
//! OS's, another architecture than `--arch`, programs built for another architecture);
//! the plan names the package's version as the agent's. Real packages: the workspace's
//! (scripts/package.sh on the suite's debug build) and .debs made here with `dpkg-deb -b`
//! around the debug build's programs.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{repo, run, sib, text};

fn debug_bin(name: &str) -> Option<PathBuf> {
    let p = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target"))
        .join("debug")
        .join(name);
    p.is_file().then_some(p)
}

/// A .deb of `version` for the Debian architecture `arch`, holding the debug build's
/// programs in /usr/bin, made by `dpkg-deb -b` in `dir`.
fn hand_made_deb(dir: &Path, version: &str, arch: &str) -> Option<PathBuf> {
    let root = dir.join(format!("root-{arch}"));
    std::fs::create_dir_all(root.join("DEBIAN")).unwrap();
    std::fs::create_dir_all(root.join("usr/bin")).unwrap();
    for b in ["slurm-node-agent", "slurm-node-agent-healthcheck"] {
        std::fs::copy(debug_bin(b)?, root.join("usr/bin").join(b)).unwrap();
    }
    std::fs::write(
        root.join("DEBIAN/control"),
        format!(
            "Package: slurm-node-agent\nVersion: {version}\nArchitecture: {arch}\n\
             Maintainer: test <test@example.invalid>\nDescription: test package\n"
        ),
    )
    .unwrap();
    let deb = dir.join(format!("slurm-node-agent_{version}_{arch}.deb"));
    let out = run(Command::new("dpkg-deb")
        .args(["--root-owner-group", "-Znone", "-b"])
        .arg(&root)
        .arg(&deb));
    assert!(out.status.success(), "{}", text(&out));
    Some(deb)
}

fn plan(args: &[&str]) -> std::process::Output {
    run(sib()
        .args([
            "plan",
            "--slurm-source",
            "distro",
            "--slurm-version",
            "22.05.8",
        ])
        .args(["--efa-version", ""])
        .args(args))
}

/// The plan's `Agent:` line.
fn agent_line(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("Agent:"))
        .unwrap_or_else(|| panic!("no Agent: line in {}", text(out)))
        .trim()
        .to_string()
}

#[test]
fn a_deb_is_planned_with_its_version_and_refused_for_another_arch_or_format() {
    let dir = tempfile::tempdir().unwrap();
    let Some(deb) = hand_made_deb(dir.path(), "7.8.9-3", "amd64") else {
        eprintln!("skipped: the debug build's programs are not built");
        return;
    };
    let deb = deb.to_str().unwrap();
    // The version without its Debian revision; --agent-version still wins.
    let out = plan(&["--os", "ubuntu-22.04", "--agent-package", deb]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(agent_line(&out), "7.8.9");
    let out = plan(&[
        "--os",
        "ubuntu-22.04",
        "--agent-package",
        deb,
        "--agent-version",
        "1.0.0-site",
    ]);
    assert_eq!(agent_line(&out), "1.0.0-site");

    // A .deb for an RPM-based OS.
    let out = plan(&["--os", "al2023", "--agent-package", deb]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains(&format!(
            "--agent-package {deb}: a .deb package, but al2023 installs .rpm packages"
        )),
        "{}",
        text(&out)
    );
    // An amd64 package for an arm64 image.
    let out = plan(&[
        "--os",
        "ubuntu-22.04",
        "--arch",
        "arm64",
        "--agent-package",
        deb,
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("a package for x86_64, but the image is arm64 (--arch)"),
        "{}",
        text(&out)
    );
    // A package that says arm64 around x86_64 programs: its programs are read too.
    let mislabelled = hand_made_deb(dir.path(), "7.8.9-3", "arm64").unwrap();
    let out = plan(&[
        "--os",
        "ubuntu-22.04",
        "--arch",
        "arm64",
        "--agent-package",
        mislabelled.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out)
            .contains("(its /usr/bin/slurm-node-agent): built for x86_64, but the image is arm64"),
        "{}",
        text(&out)
    );
    // Not a package.
    let out = plan(&["--agent-package", "/etc/hostname.tar"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("not a .deb or .rpm file"),
        "{}",
        text(&out)
    );
    // A .deb that is not one.
    let fake = dir.path().join("fake.deb");
    std::fs::write(&fake, "not an archive").unwrap();
    let out = plan(&[
        "--os",
        "ubuntu-22.04",
        "--agent-package",
        fake.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("dpkg-deb cannot read it"),
        "{}",
        text(&out)
    );
}

#[test]
fn the_workspace_rpm_is_planned_for_al2023_with_the_workspace_version() {
    if debug_bin("slurm-node-agent").is_none()
        || Command::new("cargo-generate-rpm")
            .arg("--version")
            .output()
            .is_err()
    {
        eprintln!("skipped: no debug build or no cargo-generate-rpm (scripts/test-deps.sh)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = run(Command::new(repo().join("scripts/package.sh"))
        .args(["--profile", "dev", "--no-build", "--fast", "--out"])
        .arg(dir.path()));
    assert!(out.status.success(), "{}", text(&out));
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    let rpm = printed.lines().nth(1).unwrap();
    let out = plan(&["--os", "al2023", "--agent-package", rpm]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(agent_line(&out), env!("CARGO_PKG_VERSION"));
    let out = plan(&["--os", "ubuntu-22.04", "--agent-package", rpm]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("a .rpm package, but ubuntu-22.04 installs .deb packages"),
        "{}",
        text(&out)
    );
}
