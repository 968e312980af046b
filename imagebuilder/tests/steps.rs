//! The provisioning steps' package handling (issue 14, section 4) with a stand-in package
//! manager (`tests/fixtures/pkg-standin/standin.sh` behind the names apt-get, dpkg-query,
//! dnf, rpm, cloud-init, systemctl, ...): it records what would be installed and can be
//! told to fail the way a freshly launched builder does (package lock held by cloud-init
//! or unattended upgrades, a network error), so nothing is installed on this machine.
#![allow(clippy::unwrap_used)]

mod common;

use common::{repo, text};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const TOOLS: &[&str] = &[
    "apt-get",
    "dpkg-query",
    "dpkg",
    "dnf",
    "rpm",
    "snap",
    "cloud-init",
    "systemctl",
    "curl",
    "nvidia-modprobe",
];

/// A folder of stand-in tools and their record.
struct StandIn {
    dir: tempfile::TempDir,
}

impl StandIn {
    /// Links every stand-in tool into a fresh `bin/`.
    fn new() -> StandIn {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let script = repo().join("imagebuilder/tests/fixtures/pkg-standin/standin.sh");
        for t in TOOLS {
            std::os::unix::fs::symlink(&script, bin.join(t)).unwrap();
        }
        StandIn { dir }
    }

    /// The record folder (`STANDIN_DIR`).
    #[allow(dead_code)]
    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Write a control file (see standin.sh).
    fn set(&self, name: &str, value: &str) {
        std::fs::write(self.dir.path().join(name), value).unwrap();
    }

    /// A record file's text, empty when absent.
    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default()
    }

    /// A record file's lines.
    fn lines(&self, name: &str) -> Vec<String> {
        self.read(name).lines().map(String::from).collect()
    }

    /// `bash -c SCRIPT` with the stand-ins first on PATH and the waits made short.
    fn bash(&self, os: &str, script: &str) -> Output {
        let path = format!(
            "{}:{}",
            self.dir.path().join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        Command::new("bash")
            .arg("-c")
            .arg(script)
            .current_dir(repo())
            .env("PATH", path)
            .env("STANDIN_DIR", self.dir.path())
            .env("IMAGE_OS", os)
            .env("STEP", "test")
            .env("PKG_RETRY_DELAY", "0")
            .env(
                "CLOUD_INIT_MARKER",
                self.dir.path().join("cloud-init-waited"),
            )
            .output()
            .unwrap()
    }
}

fn lib() -> PathBuf {
    repo().join("packer/scripts/lib.sh")
}

fn install(s: &StandIn, os: &str, pkgs: &str) -> Output {
    s.bash(os, &format!(". {}; pkg_install {pkgs}", lib().display()))
}

#[test]
fn install_waits_for_cloud_init_and_the_lock_then_records_the_packages() {
    let s = StandIn::new();
    let out = install(&s, "debian-12", "chrony curl");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(s.lines("installed"), ["chrony", "curl"]);
    let log = s.lines("log");
    let first_pm = log.iter().position(|l| l.starts_with("apt-get")).unwrap();
    let cloud_init = log
        .iter()
        .position(|l| l == "cloud-init status --wait")
        .unwrap();
    assert!(cloud_init < first_pm, "{log:#?}");
    assert!(
        log.iter()
            .any(|l| l.contains("-o DPkg::Lock::Timeout=600") && l.contains("install")),
        "{log:#?}"
    );
    // Everything there: nothing runs, not even an index refresh; cloud-init is not asked again.
    let before = s.lines("log").len();
    let out = install(&s, "debian-12", "chrony");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(s.lines("log").len(), before + 1, "{:#?}", s.lines("log"));
}

#[test]
fn a_held_lock_is_retried_and_said_to_be_a_lock() {
    let s = StandIn::new();
    s.set("fail-lock", "2");
    let out = install(&s, "debian-12", "chrony");
    assert!(out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("apt-get update: lock failure (attempt 1 of 4)")
            && t.contains("apt-get update: lock failure (attempt 2 of 4)"),
        "{t}"
    );
    assert_eq!(s.lines("installed"), ["chrony"]);

    // A lock that stays held: fails after the retries, naming the lock, not the mirrors.
    let s = StandIn::new();
    s.set("fail-lock", "99");
    let out = install(&s, "debian-12", "chrony");
    assert!(!out.status.success());
    let t = text(&out);
    assert!(
        t.contains("the package lock stayed held by another process") && !t.contains("mirrors"),
        "{t}"
    );
    assert_eq!(
        s.lines("log")
            .iter()
            .filter(|l| l.starts_with("apt-get"))
            .count(),
        4
    );
}

#[test]
fn network_failures_are_retried_and_named_and_unknown_packages_fail_at_once() {
    let s = StandIn::new();
    s.set("fail-net", "1");
    let out = install(&s, "debian-12", "chrony");
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("transient failure (attempt 1 of 4)"),
        "{}",
        text(&out)
    );

    let s = StandIn::new();
    s.set("fail-net", "99");
    let out = install(&s, "debian-12", "chrony");
    assert!(!out.status.success());
    assert!(
        text(&out).contains("network or mirror failure, 4 attempts"),
        "{}",
        text(&out)
    );

    let s = StandIn::new();
    s.set("unknown", "no-such-package\n");
    let out = install(&s, "debian-12", "no-such-package");
    assert!(!out.status.success());
    let t = text(&out);
    assert!(
        t.contains("Unable to locate package no-such-package")
            && t.contains("not a lock or network problem"),
        "{t}"
    );
    let installs = s
        .lines("log")
        .iter()
        .filter(|l| l.starts_with("apt-get") && l.contains(" install "))
        .count();
    assert_eq!(installs, 1, "{:#?}", s.lines("log"));
}

#[test]
fn dnf_is_bounded_and_retried_too() {
    let s = StandIn::new();
    s.set("fail-lock", "1");
    let out = install(&s, "rocky9", "chrony");
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("lock failure (attempt 1 of 4)"),
        "{}",
        text(&out)
    );
    assert_eq!(s.lines("installed"), ["chrony"]);
    assert!(
        s.lines("log")
            .iter()
            .any(|l| l == "dnf install -y -q chrony"),
        "{:#?}",
        s.lines("log")
    );
}

#[test]
fn cloud_init_that_never_finishes_stops_the_step_with_a_bounded_wait() {
    let s = StandIn::new();
    s.set("cloud-init-sleep", "30");
    let out = s.bash(
        "debian-12",
        &format!(
            "CLOUD_INIT_TIMEOUT=1; . {}; pkg_install chrony",
            lib().display()
        ),
    );
    assert!(!out.status.success());
    assert!(
        text(&out).contains("cloud-init still running after 1s"),
        "{}",
        text(&out)
    );
    assert!(s.read("installed").is_empty());

    // Errors inside cloud-init's own modules are reported, and the build goes on.
    let s = StandIn::new();
    s.set("cloud-init-rc", "1");
    let out = install(&s, "debian-12", "chrony");
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("cloud-init finished with errors (exit 1"),
        "{}",
        text(&out)
    );
}
