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
    "apt-mark",
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

/// Where a step run in [`step`] wrote: the overlay upper folders of /etc, /usr/local,
/// /usr/bin, /var and /opt.
struct Written {
    root: PathBuf,
}

impl Written {
    /// The text a step wrote at `path` (absolute, under one of the overlaid folders).
    fn read(&self, path: &str) -> String {
        let (top, rest) = path.trim_start_matches('/').split_once('/').unwrap();
        let top = if top == "usr" {
            let (sub, r) = rest.split_once('/').unwrap();
            return std::fs::read_to_string(self.root.join(format!("usr-{sub}")).join(r))
                .unwrap_or_default();
        } else {
            top
        };
        std::fs::read_to_string(self.root.join(top).join(rest)).unwrap_or_default()
    }
}

/// Run a provisioning step as root in a private mount namespace whose /etc, /usr/local,
/// /usr/bin, /var and /opt are overlays (writes land in a temporary folder, never on this machine),
/// with the stand-ins first on PATH.
fn step(s: &StandIn, script: &str, env: &[(&str, &str)]) -> (Output, Written) {
    let root = s.path().join("root");
    let mut mounts = String::new();
    for (dir, name) in [
        ("/etc", "etc"),
        ("/usr/local", "usr-local"),
        ("/usr/bin", "usr-bin"),
        ("/var", "var"),
        ("/opt", "opt"),
    ] {
        let up = root.join(name);
        let work = root.join(format!("{name}.work"));
        std::fs::create_dir_all(&up).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        mounts.push_str(&format!(
            "mount -t overlay overlay -o lowerdir={dir},upperdir={},workdir={} {dir}\n",
            up.display(),
            work.display()
        ));
    }
    let mut vars = String::new();
    for (k, v) in env {
        vars.push_str(&format!("export {k}='{v}'\n"));
    }
    let body = format!(
        "set -e\n{mounts}{vars}exec bash {}\n",
        repo().join("packer/scripts").join(script).display()
    );
    let script_file = s.path().join("run-step.sh");
    std::fs::write(&script_file, body).unwrap();
    let out = s.bash_cmd(
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "bash"])
            .arg(&script_file),
    );
    (out, Written { root })
}

impl StandIn {
    /// Run `cmd` with the same environment as [`StandIn::bash`].
    fn bash_cmd(&self, cmd: &mut Command) -> Output {
        let path = format!(
            "{}:{}",
            self.dir.path().join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        cmd.current_dir(repo())
            .env("PATH", path)
            .env("STANDIN_DIR", self.dir.path())
            .env("PKG_RETRY_DELAY", "0")
            .env(
                "CLOUD_INIT_MARKER",
                self.dir.path().join("cloud-init-waited"),
            )
            .output()
            .unwrap()
    }
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

#[test]
fn services_step_installs_ssm_agent_and_chrony_on_every_family() {
    if !is_root() {
        eprintln!("skipped: needs root for a private mount namespace");
        return;
    }
    // (os, what records the SSM agent, the SSM agent's unit, chrony's config and unit)
    for (os, ssm, ssm_unit, conf, chrony_unit) in [
        (
            "debian-12",
            "amazon-ssm-agent",
            "amazon-ssm-agent.service",
            "/etc/chrony/chrony.conf",
            "chrony.service",
        ),
        (
            "ubuntu-22.04",
            "snap:amazon-ssm-agent",
            "snap.amazon-ssm-agent.amazon-ssm-agent.service",
            "/etc/chrony/chrony.conf",
            "chrony.service",
        ),
        (
            "al2023",
            "amazon-ssm-agent",
            "amazon-ssm-agent.service",
            "/etc/chrony.conf",
            "chronyd.service",
        ),
        (
            "rocky9",
            "amazon-ssm-agent",
            "amazon-ssm-agent.service",
            "/etc/chrony.conf",
            "chronyd.service",
        ),
    ] {
        let s = StandIn::new();
        let keys = signed_agent_packages(&s);
        // The staging folder as Packer uploads it: packer/files.
        let staging = s.path().join("staging");
        std::fs::create_dir_all(staging.join("files/logrotate")).unwrap();
        std::fs::copy(
            repo().join("packer/files/logrotate/slurm-image-cloud-init"),
            staging.join("files/logrotate/slurm-image-cloud-init"),
        )
        .unwrap();
        let staging_s = staging.display().to_string();
        let env = [
            ("IMAGE_OS", os),
            ("IMAGE_ARCH", "arm64"),
            ("IMAGE_REGION", "eu-west-1"),
            ("CLOUDWATCH_AGENT", "true"),
            ("SIGNING_KEYS_DIR", keys.to_str().unwrap()),
            ("IMAGE_STAGING", staging_s.as_str()),
        ];
        let (out, written) = step(&s, "65-services.sh", &env);
        assert!(out.status.success(), "{os}: {}", text(&out));
        let installed = s.lines("installed");
        for want in [ssm, "chrony", "amazon-cloudwatch-agent"] {
            assert!(
                installed.iter().any(|i| i == want),
                "{os}: {want} not in {installed:?}"
            );
        }
        let enabled = s.lines("enabled");
        for want in [ssm_unit, chrony_unit, "amazon-cloudwatch-agent.service"] {
            assert!(
                enabled.iter().any(|e| e == want),
                "{os}: {want} not enabled: {enabled:?}"
            );
        }
        let chrony = written.read(conf);
        assert!(
            chrony.contains("server 169.254.169.123 prefer iburst")
                && chrony.contains("server fd00:ec2::123 prefer iburst"),
            "{os}: {chrony}"
        );
        // The CloudWatch agent's configuration is rendered at boot (the agent's
        // `config cloudwatch --write`, tested in agent/tests/cloudwatch_config.rs, by a unit
        // 70-agent.sh enables where this drop-in is): the image says where, caps the
        // journal (which the CloudWatch agent reads) and rotates cloud-init's files; no
        // export file any more.
        let cw: toml::Value =
            toml::from_str(&written.read("/etc/slurm-node-agent/conf.d/55-cloudwatch.toml"))
                .unwrap();
        assert_eq!(
            cw["cloudwatch"]["config_file"].as_str(),
            Some("/opt/aws/amazon-cloudwatch-agent/etc/amazon-cloudwatch-agent.json")
        );
        let journald = written.read("/etc/systemd/journald.conf.d/slurm-image.conf");
        assert!(journald.contains("SystemMaxUse=1G"), "{os}: {journald}");
        assert!(
            !written
                .root
                .join("etc/systemd/system/slurm-image-journal-export.service")
                .exists(),
            "{os}"
        );
        // The agent's textfile metrics: a node exporter with only its textfile collector on
        // loopback, the agent told (by an image drop-in) to write its textfiles there, and
        // the CloudWatch agent scraping that address.
        let exporter = match os {
            "debian-12" | "ubuntu-22.04" => Some((
                "prometheus-node-exporter",
                "prometheus-node-exporter.service",
            )),
            "rocky9" => Some((
                "golang-github-prometheus-node-exporter",
                "node_exporter.service",
            )),
            _ => None,
        };
        assert_eq!(
            cw["cloudwatch"]["prometheus_config"].as_str(),
            Some(if exporter.is_some() {
                "/opt/aws/amazon-cloudwatch-agent/etc/prometheus.yaml"
            } else {
                ""
            }),
            "{os}"
        );
        if let Some((pkg, unit)) = exporter {
            assert!(
                installed.iter().any(|i| i == pkg),
                "{os}: {pkg} not in {installed:?}"
            );
            assert!(
                enabled.iter().any(|e| e == unit),
                "{os}: {unit} not enabled: {enabled:?}"
            );
            let dropin = written.read(&format!("/etc/systemd/system/{unit}.d/slurm-image.conf"));
            assert!(
                dropin.contains("--web.listen-address=127.0.0.1:9100")
                    && dropin.contains("--collector.disable-defaults")
                    && dropin.contains(
                        "--collector.textfile.directory=/var/lib/slurm-node-agent/metrics"
                    ),
                "{os}: {dropin}"
            );
            let conf: toml::Value = toml::from_str(
                &written.read("/etc/slurm-node-agent/conf.d/60-textfile-metrics.toml"),
            )
            .unwrap();
            assert_eq!(
                conf["health"]["prometheus_textfile"].as_str(),
                Some("/var/lib/slurm-node-agent/metrics/health.prom")
            );
            assert_eq!(
                conf["drain"]["metrics_file"].as_str(),
                Some("/var/lib/slurm-node-agent/metrics/drain.prom")
            );
            let scrape = written.read("/opt/aws/amazon-cloudwatch-agent/etc/prometheus.yaml");
            assert!(
                scrape.contains("targets: [\"127.0.0.1:9100\"]"),
                "{os}: {scrape}"
            );
        } else {
            assert!(
                text(&out).contains(
                    "has no node exporter package, so the textfile metrics are not shipped"
                ),
                "{os}: {}",
                text(&out)
            );
        }
        if os == "rocky9" {
            assert!(
                s.lines("log").iter().any(|l| l.contains(
                    "curl -fsSL --retry 2 --connect-timeout 10 -o /var/cache/slurm-image/amazon-ssm-agent.rpm.sig https://s3.eu-west-1.amazonaws.com/amazon-ssm-eu-west-1/latest/linux_arm64/amazon-ssm-agent.rpm.sig"
                )) && s.lines("log").iter().any(|l| l == "dnf install -y -q /var/cache/slurm-image/amazon-ssm-agent.rpm"),
                "{:#?}",
                s.lines("log")
            );
        }
    }
}

#[test]
fn services_step_is_idempotent_and_keeps_the_distribution_chrony_config() {
    if !is_root() {
        eprintln!("skipped: needs root for a private mount namespace");
        return;
    }
    let s = StandIn::new();
    let keys = signed_agent_packages(&s);
    let env = [
        ("IMAGE_OS", "debian-12"),
        ("IMAGE_ARCH", "x86_64"),
        ("SIGNING_KEYS_DIR", keys.to_str().unwrap()),
    ];
    let (out, written) = step(&s, "65-services.sh", &env);
    assert!(out.status.success(), "{}", text(&out));
    let first = written.read("/etc/chrony/chrony.conf");
    let (out, written) = step(&s, "65-services.sh", &env);
    assert!(out.status.success(), "{}", text(&out));
    let second = written.read("/etc/chrony/chrony.conf");
    assert_eq!(first, second);
    assert_eq!(second.matches("169.254.169.123").count(), 1, "{second}");
    // The second run installs nothing.
    let installs = s
        .lines("log")
        .iter()
        .filter(|l| l.starts_with("apt-get") && l.contains(" install "))
        .count();
    assert_eq!(installs, 1, "{:#?}", s.lines("log"));
    // Not requested: no CloudWatch agent.
    assert!(!s
        .lines("installed")
        .iter()
        .any(|i| i.contains("cloudwatch")));
}

#[test]
fn nvidia_step_sets_up_fabric_manager_persistenced_and_device_nodes_before_slurmd() {
    if !is_root() {
        eprintln!("skipped: needs root for a private mount namespace");
        return;
    }
    for (os, fabric) in [
        ("ubuntu-22.04", "nvidia-fabricmanager-550"),
        ("rocky9", "nvidia-fabric-manager"),
    ] {
        let s = StandIn::new();
        let env = [
            ("IMAGE_OS", os),
            ("IMAGE_ARCH", "x86_64"),
            // A bare branch: the branch's newest driver and Fabric Manager (an exact version
            // is pinned and held: the next test).
            ("NVIDIA_DRIVER_VERSION", "550"),
            ("NVIDIA_DCGM", "true"),
        ];
        let (out, written) = step(&s, "60-nvidia.sh", &env);
        assert!(out.status.success(), "{os}: {}", text(&out));
        let installed = s.lines("installed");
        for want in [fabric, "nvidia-modprobe", "datacenter-gpu-manager"] {
            assert!(
                installed.iter().any(|i| i == want),
                "{os}: {want} not in {installed:?}"
            );
        }
        let enabled = s.lines("enabled");
        for want in [
            "nvidia-persistenced.service",
            "nvidia-fabricmanager.service",
            "nvidia-device-nodes.service",
        ] {
            assert!(
                enabled.iter().any(|e| e == want),
                "{os}: {want} not enabled: {enabled:?}"
            );
        }
        let unit = written.read("/etc/systemd/system/nvidia-device-nodes.service");
        assert!(
            unit.contains("Before=slurmd.service")
                && unit.contains("ExecStart=/usr/local/lib/slurm-image/nvidia-device-nodes"),
            "{unit}"
        );
        let nodes = written.read("/usr/local/lib/slurm-image/nvidia-device-nodes");
        assert!(nodes.contains("nvidia-modprobe -c"), "{nodes}");
        let fm =
            written.read("/etc/systemd/system/nvidia-fabricmanager.service.d/slurm-image.conf");
        assert!(fm.contains("nvidia-nvswitch"), "{fm}");
    }
}

/// NVLink 5 (HGX B200, p6-b200): Fabric Manager needs NVLSM and `ib_umad`
/// (NVIDIA/gpu-operator #2781). An image whose driver branch supports Blackwell (570+)
/// installs NVLSM (and on Ubuntu linux-modules-extra, where ib_umad ships) and loads
/// ib_umad at boot; an older branch (which cannot drive a B200) gets neither.
#[test]
fn nvidia_step_loads_ib_umad_and_installs_nvlsm_for_nvlink5_with_branch_570_and_later() {
    if !is_root() {
        eprintln!("skipped: needs root for a private mount namespace");
        return;
    }
    let kernel = String::from_utf8(Command::new("uname").arg("-r").output().unwrap().stdout)
        .unwrap()
        .trim()
        .to_string();
    // Where the plan says ib_umad is loaded from.
    let modules_load = slurm_image_builder::recipe::NVLINK5_MODULES_LOAD;
    for (os, version, extra) in [
        ("ubuntu-22.04", "580.126.09", true),
        ("ubuntu-24.04", "580", true),
        ("rocky9", "580", false),
    ] {
        let s = StandIn::new();
        let env = [
            ("IMAGE_OS", os),
            ("IMAGE_ARCH", "x86_64"),
            ("NVIDIA_DRIVER_VERSION", version),
        ];
        let (out, written) = step(&s, "60-nvidia.sh", &env);
        assert!(out.status.success(), "{os}: {}", text(&out));
        let installed = s.lines("installed");
        assert!(
            installed.iter().any(|i| i == "nvlsm"),
            "{os}: nvlsm not in {installed:?}"
        );
        let modules_extra = format!("linux-modules-extra-{kernel}");
        assert_eq!(
            installed.contains(&modules_extra),
            extra,
            "{os}: {modules_extra} in {installed:?}"
        );
        let conf = written.read(modules_load);
        assert!(
            conf.lines().any(|l| l.trim() == "ib_umad"),
            "{os}: {modules_load}: {conf:?}"
        );
        assert!(
            text(&out).contains("NVLink 5 prerequisites: nvlsm installed, ib_umad loaded at boot"),
            "{os}: {}",
            text(&out)
        );
    }
    let s = StandIn::new();
    let env = [
        ("IMAGE_OS", "ubuntu-22.04"),
        ("IMAGE_ARCH", "x86_64"),
        ("NVIDIA_DRIVER_VERSION", "550"),
    ];
    let (out, written) = step(&s, "60-nvidia.sh", &env);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!s.lines("installed").iter().any(|i| i == "nvlsm"));
    assert_eq!(written.read(modules_load), "");
}

#[test]
fn an_exact_nvidia_version_pins_and_holds_the_driver_and_fabric_manager_and_acceptance_compares_them(
) {
    if !is_root() {
        eprintln!("skipped: needs root for a private mount namespace");
        return;
    }
    let s = StandIn::new();
    let env = [
        ("IMAGE_OS", "ubuntu-22.04"),
        ("IMAGE_ARCH", "x86_64"),
        ("NVIDIA_DRIVER_VERSION", "580.126.09"),
    ];
    let (out, _) = step(&s, "60-nvidia.sh", &env);
    assert!(out.status.success(), "{}", text(&out));
    let installed = s.lines("installed");
    for want in [
        "nvidia-driver-580-server-open=580.126.09-*",
        "nvidia-fabricmanager-580=580.126.09-*",
    ] {
        assert!(
            installed.iter().any(|i| i == want),
            "{want} not in {installed:?}"
        );
    }
    assert_eq!(
        s.lines("held"),
        vec!["nvidia-driver-580-server-open", "nvidia-fabricmanager-580"]
    );
    let accept = |s: &StandIn| {
        let (out, _) = step(
            s,
            "99-acceptance.sh",
            &[
                ("IMAGE_OS", "ubuntu-22.04"),
                ("NVIDIA_DRIVER_VERSION", "580.126.09"),
                ("ACCEPTANCE_CLEANUP_CHECK", "false"),
            ],
        );
        text(&out)
    };
    let t = accept(&s);
    assert!(
        t.contains("NVIDIA driver and Fabric Manager packages both at 580.126.09")
            && t.contains("package nvidia-fabricmanager-580 held"),
        "{t}"
    );
    // A Fabric Manager of another version (gpu-driver-container #735's pair): named.
    std::fs::create_dir_all(s.dir.path().join("versions")).unwrap();
    std::fs::write(
        s.dir.path().join("versions/nvidia-fabricmanager-580"),
        "590.48.01-1",
    )
    .unwrap();
    let t = accept(&s);
    assert!(
        t.contains("Fabric Manager nvidia-fabricmanager-580 '590.48.01'")
            && t.contains("both must be 580.126.09"),
        "{t}"
    );
}

#[test]
fn nvidia_acceptance_checks_skip_device_checks_without_gpus() {
    if !is_root() {
        eprintln!("skipped: needs root for a private mount namespace");
        return;
    }
    if std::path::Path::new("/proc/driver/nvidia/gpus").exists() {
        eprintln!("skipped: this machine has NVIDIA GPUs");
        return;
    }
    let s = StandIn::new();
    // Only the NVIDIA part matters here: the rest of the checks fail on this host.
    let (out, _) = step(
        &s,
        "99-acceptance.sh",
        &[
            ("IMAGE_OS", "debian-12"),
            ("NVIDIA_DRIVER_VERSION", "550"),
            ("ACCEPTANCE_CLEANUP_CHECK", "false"),
        ],
    );
    let t = text(&out);
    assert!(
        t.contains(
            "not checked: nvidia devices, Fabric Manager version and DCGM: no GPU on this builder"
        ),
        "{t}"
    );
}

/// A stand-in Slurm source tree (`configure` records its arguments, `make install` puts a
/// `slurmd` that reports VERSION and the plugins named in PLUGINS under /opt/slurm), packed
/// as the tarball the recipe pins; returns its sha256.
fn fake_slurm_tarball(dest: &Path, version: &str, plugins: &[&str], record: &Path) -> String {
    let tree = tempfile::tempdir().unwrap();
    let top = tree.path().join("slurm-src");
    std::fs::create_dir(&top).unwrap();
    let configure = format!(
        "#!/bin/sh\nprintf '%s\\n' \"$@\" > {}\nexit 0\n",
        record.display()
    );
    std::fs::write(top.join("configure"), configure).unwrap();
    // `make install DESTDIR=<stage>`, as build_slurm runs it (lib-slurm.sh).
    let mut install = String::from(
        "\tmkdir -p $(DESTDIR)/opt/slurm/sbin $(DESTDIR)/opt/slurm/bin $(DESTDIR)/opt/slurm/lib/slurm\n",
    );
    install.push_str(&format!(
        "\tprintf '#!/bin/sh\\necho \"slurm {version}\"\\n' > $(DESTDIR)/opt/slurm/sbin/slurmd\n\tchmod 755 $(DESTDIR)/opt/slurm/sbin/slurmd\n"
    ));
    for p in plugins {
        install.push_str(&format!("\ttouch $(DESTDIR)/opt/slurm/lib/slurm/{p}\n"));
    }
    std::fs::write(
        top.join("Makefile"),
        format!("all:\n\t@true\ninstall:\n{install}"),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        top.join("configure"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let st = Command::new("tar")
        .arg("-czf")
        .arg(dest)
        .arg("-C")
        .arg(tree.path())
        .arg("slurm-src")
        .status()
        .unwrap();
    assert!(st.success());
    let out = Command::new("sha256sum").arg(dest).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// The managed service's recipe (auth/slurm): the tarball build passes `--without-munge`
/// and the feature flags, installs no MUNGE development package, finds the auth_slurm
/// plugin; the munge recipe passes no `--without-munge`. Runs 30-slurm.sh with the
/// stand-in package manager and a stand-in source tree, so only the plumbing is shown:
/// auth/slurm needs Slurm >= 23.11, which cannot be fetched or built here.
#[test]
fn slurm_step_builds_for_auth_slurm_without_munge_and_for_munge_with_it() {
    if !is_root() {
        eprintln!("skipped: needs root for a private mount namespace");
        return;
    }
    // 23.11.4 (pinned, end of life): never the Slurm the suite itself runs, which sits in
    // this host's /opt/slurm and would count as already installed.
    for auth in ["slurm", "munge"] {
        let s = StandIn::new();
        let staging = s.path().join("staging");
        std::fs::create_dir_all(staging.join("sources")).unwrap();
        let url = "https://github.com/SchedMD/slurm/archive/slurm-23-11-4-1.tar.gz";
        let record = s.path().join("configure-args");
        let sha = fake_slurm_tarball(
            &staging.join("sources/slurm-23-11-4-1.tar.gz"),
            "23.11.4",
            &["auth_slurm.so", "mpi_pmix.so"],
            &record,
        );
        // PMIx's header where a site-built PMIx lives (the overlay's /usr/local).
        let inc = s.path().join("root/usr-local/include");
        std::fs::create_dir_all(&inc).unwrap();
        std::fs::write(inc.join("pmix.h"), "/* stand-in */\n").unwrap();
        let staging_s = staging.display().to_string();
        let env = [
            ("IMAGE_OS", "debian-12"),
            ("IMAGE_ARCH", "x86_64"),
            ("IMAGE_STAGING", staging_s.as_str()),
            ("SLURM_VERSION", "23.11.4"),
            ("SLURM_SOURCE", "tarball"),
            ("SLURM_URL", url),
            ("SLURM_SHA256", sha.as_str()),
            ("SLURM_AUTH", auth),
        ];
        let (out, _written) = step(&s, "30-slurm.sh", &env);
        assert!(out.status.success(), "{auth}: {}", text(&out));
        let args = std::fs::read_to_string(&record).unwrap();
        let args: Vec<&str> = args.lines().collect();
        // PMIx where pmix.h is: the overlay's /usr/local, or Debian's libpmix-dev when the
        // host has it (scripts/test-deps.sh installs it to build Slurm for the suite).
        assert!(
            args.iter()
                .any(|a| a.strip_prefix("--with-pmix=").is_some_and(|d| {
                    d == "/usr/local" || Path::new(d).join("include/pmix.h").exists()
                })),
            "{auth}: no --with-pmix= of a PMIx with pmix.h in {args:?}"
        );
        for want in [
            "--with-hwloc",
            "--with-jwt",
            "--enable-slurmrestd",
            "--without-nvml",
        ] {
            assert!(args.contains(&want), "{auth}: {want} not in {args:?}");
        }
        assert_eq!(
            args.contains(&"--without-munge"),
            auth == "slurm",
            "{auth}: {args:?}"
        );
        let installed = s.lines("installed");
        assert_eq!(
            installed.iter().any(|p| p == "libmunge-dev"),
            auth == "munge",
            "{auth}: {installed:?}"
        );
        for p in ["libpmix-dev", "libjwt-dev", "libhwloc-dev"] {
            assert!(
                installed.iter().any(|i| i == p),
                "{auth}: {p} not in {installed:?}"
            );
        }
        assert!(
            text(&out).contains("slurm 23.11.4 installed"),
            "{auth}: {}",
            text(&out)
        );
    }
}

/// A throwaway OpenPGP signing key (GnuPG in a temporary home), standing in for AWS's
/// package signing keys: the stand-in downloads are signed with it and its fingerprint is
/// pinned in a keys folder shaped like `packer/files/keys`.
struct Signer {
    home: tempfile::TempDir,
    fpr: String,
}

impl Signer {
    /// A new key; `faked_time` (gpg's `--faked-system-time`, e.g. `20200101T000000!`)
    /// makes it in the past with a one-day expiry, so it has expired today.
    fn new(faked_time: Option<&str>) -> Signer {
        let home = tempfile::tempdir().unwrap();
        let mut args = vec!["--batch", "--passphrase", "", "--pinentry-mode", "loopback"];
        let mut expiry = "never";
        if let Some(t) = faked_time {
            args.extend(["--faked-system-time", t]);
            expiry = "1d";
        }
        let mut s = Signer {
            home,
            fpr: String::new(),
        };
        let out = s.gpg(
            &args,
            &[
                "--quick-gen-key",
                "Stand-in Signer <signer@example.invalid>",
                "ed25519",
                "sign",
                expiry,
            ],
        );
        assert!(out.status.success(), "{}", text(&out));
        let out = s.gpg(&["--batch"], &["--with-colons", "--list-keys"]);
        let fpr = String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| {
                l.strip_prefix("fpr:")
                    .map(|r| r.trim_matches(':').to_string())
            })
            .unwrap();
        s.fpr = fpr;
        s
    }

    fn gpg(&self, pre: &[&str], args: &[&str]) -> Output {
        Command::new("gpg")
            .arg("--homedir")
            .arg(self.home.path())
            .args(pre)
            .args(args)
            .output()
            .unwrap()
    }

    /// Writes `data` as `served/NAME` and its detached signature as `served/NAME.sig`.
    fn serve_signed(&self, s: &StandIn, name: &str, data: &str, faked_time: Option<&str>) {
        let served = s.path().join("served");
        std::fs::create_dir_all(&served).unwrap();
        let file = served.join(name);
        std::fs::write(&file, data).unwrap();
        let sig = served.join(format!("{name}.sig"));
        let _ = std::fs::remove_file(&sig);
        let mut pre = vec!["--batch", "--yes"];
        if let Some(t) = faked_time {
            pre.extend(["--faked-system-time", t]);
        }
        let out = self.gpg(
            &pre,
            &[
                "--detach-sign",
                "-o",
                sig.to_str().unwrap(),
                file.to_str().unwrap(),
            ],
        );
        assert!(out.status.success(), "{}", text(&out));
    }

    /// A keys folder pinning this key for `ids` (`<id>.asc` and `<id>.fpr`).
    fn keys_dir(&self, s: &StandIn, ids: &[&str]) -> PathBuf {
        let dir = s.path().join("keys");
        std::fs::create_dir_all(&dir).unwrap();
        let out = self.gpg(&["--batch"], &["--armor", "--export", &self.fpr]);
        assert!(out.status.success());
        for id in ids {
            std::fs::write(dir.join(format!("{id}.asc")), &out.stdout).unwrap();
            std::fs::write(
                dir.join(format!("{id}.fpr")),
                format!("# the test's stand-in key\n{}\n", self.fpr),
            )
            .unwrap();
        }
        dir
    }
}

impl Drop for Signer {
    fn drop(&mut self) {
        // gpg started an agent for the temporary home: stop it.
        let _ = Command::new("gpgconf")
            .arg("--homedir")
            .arg(self.home.path())
            .args(["--kill", "all"])
            .output();
    }
}

/// The AWS agent packages (deb and rpm) served signed by a stand-in key pinned in a keys
/// folder, which is returned. Without gpg, an empty folder (the steps then refuse them).
fn signed_agent_packages(s: &StandIn) -> PathBuf {
    if !has_gpg() {
        return s.path().to_path_buf();
    }
    let signer = Signer::new(None);
    let ids = ["amazon-ssm-agent", "amazon-cloudwatch-agent"];
    for id in ids {
        for ext in ["deb", "rpm"] {
            signer.serve_signed(s, &format!("{id}.{ext}"), &format!("{id} {ext}\n"), None);
        }
    }
    signer.keys_dir(s, &ids)
}

fn has_gpg() -> bool {
    Command::new("gpg").arg("--version").output().is_ok()
}

#[test]
fn aws_agent_packages_are_installed_only_with_a_good_signature_by_the_pinned_key() {
    if !is_root() || !has_gpg() {
        eprintln!("skipped: needs root for a private mount namespace, and gpg");
        return;
    }
    let signer = Signer::new(None);
    let ids = ["amazon-ssm-agent", "amazon-cloudwatch-agent"];
    // packer/files as the template uploads it (the rotation rule of cloud-init's logs), in
    // one staging folder for every run.
    let staging = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(staging.path().join("files/logrotate")).unwrap();
    std::fs::copy(
        repo().join("packer/files/logrotate/slurm-image-cloud-init"),
        staging
            .path()
            .join("files/logrotate/slurm-image-cloud-init"),
    )
    .unwrap();
    let env_for = |keys: &Path, os: &'static str| {
        vec![
            ("IMAGE_OS", os.to_string()),
            ("IMAGE_ARCH", "x86_64".to_string()),
            ("CLOUDWATCH_AGENT", "true".to_string()),
            ("SIGNING_KEYS_DIR", keys.display().to_string()),
            ("IMAGE_STAGING", staging.path().display().to_string()),
        ]
    };
    let run = |s: &StandIn, env: &[(&str, String)]| {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        step(s, "65-services.sh", &env)
    };

    // Good signatures (deb and rpm): installed from the verified files, and said so.
    for (os, ext) in [("debian-12", "deb"), ("rocky9", "rpm")] {
        let s = StandIn::new();
        let keys = signer.keys_dir(&s, &ids);
        for id in ids {
            signer.serve_signed(&s, &format!("{id}.{ext}"), &format!("{id} package\n"), None);
        }
        let (out, _) = run(&s, &env_for(&keys, os));
        assert!(out.status.success(), "{os}: {}", text(&out));
        let t = text(&out);
        assert_eq!(
            t.matches(&format!("good signature by the pinned key {}", signer.fpr))
                .count(),
            2,
            "{os}: {t}"
        );
        let installer = if ext == "deb" {
            "dpkg -i"
        } else {
            "dnf install -y -q"
        };
        for id in ids {
            assert!(
                s.lines("log")
                    .iter()
                    .any(|l| l == &format!("{installer} /var/cache/slurm-image/{id}.{ext}")),
                "{os}: {id}: {:#?}",
                s.lines("log")
            );
        }
    }

    // A package changed after signing: the step stops, names the check, installs nothing
    // and leaves no file where the package would be.
    let s = StandIn::new();
    let keys = signer.keys_dir(&s, &ids);
    signer.serve_signed(&s, "amazon-ssm-agent.deb", "the real package\n", None);
    std::fs::write(
        s.path().join("served/amazon-ssm-agent.deb"),
        "a package changed on the way\n",
    )
    .unwrap();
    let (out, written) = run(&s, &env_for(&keys, "debian-12"));
    assert!(!out.status.success());
    let t = text(&out);
    assert!(
        t.contains("amazon-ssm-agent.deb.sig is not a good signature by the pinned key")
            && t.contains("BAD signature")
            && t.contains("failed its signature check")
            && t.contains("it was not installed"),
        "{t}"
    );
    assert!(!s.lines("log").iter().any(|l| l.starts_with("dpkg -i")));
    assert!(written
        .read("/var/cache/slurm-image/amazon-ssm-agent.deb")
        .is_empty());

    // Signed, but by another key than the pinned one.
    let other = Signer::new(None);
    let s = StandIn::new();
    let keys = signer.keys_dir(&s, &ids);
    other.serve_signed(&s, "amazon-ssm-agent.deb", "a package\n", None);
    let (out, _) = run(&s, &env_for(&keys, "debian-12"));
    assert!(!out.status.success());
    let t = text(&out);
    assert!(
        t.contains(&format!(
            "is not a good signature by the pinned key {}",
            signer.fpr
        )),
        "{t}"
    );
    assert!(!s.lines("log").iter().any(|l| l.starts_with("dpkg -i")));

    // The package is there but its signature is not: a missing signature stops the step
    // (not "unreachable", which a build may be allowed to skip).
    let s = StandIn::new();
    let keys = signer.keys_dir(&s, &ids);
    signer.serve_signed(&s, "amazon-ssm-agent.deb", "a package\n", None);
    std::fs::create_dir_all(s.path().join("missing")).unwrap();
    std::fs::write(s.path().join("missing/amazon-ssm-agent.deb.sig"), "").unwrap();
    let mut env = env_for(&keys, "debian-12");
    env.push(("ALLOW_SKIPS", "true".to_string()));
    let (out, _) = run(&s, &env);
    assert!(!out.status.success());
    let t = text(&out);
    assert!(
        t.contains("no detached signature at https://")
            && t.contains("amazon-ssm-agent.deb.sig (the package itself downloaded)")
            && !t.contains("unreachable"),
        "{t}"
    );
    assert!(!s.lines("log").iter().any(|l| l.starts_with("dpkg -i")));

    // No pin at all: refused, naming the file to write.
    let s = StandIn::new();
    let empty = s.path().join("no-keys");
    std::fs::create_dir_all(&empty).unwrap();
    signer.serve_signed(&s, "amazon-ssm-agent.deb", "a package\n", None);
    let (out, _) = run(&s, &env_for(&empty, "debian-12"));
    assert!(!out.status.success());
    assert!(
        text(&out).contains(
            "amazon-ssm-agent.fpr: no pinned signing key fingerprint: the file does not exist"
        ),
        "{}",
        text(&out)
    );
}

/// `verify_signature` from lib.sh on the served `amazon-ssm-agent.deb` and its `.sig`,
/// with the keys folder `keys`.
fn verify_served(s: &StandIn, keys: &Path) -> Output {
    let served = s.path().join("served");
    s.bash(
        "debian-12",
        &format!(
            "export SIGNING_KEYS_DIR={}; . {}; verify_signature amazon-ssm-agent {}/amazon-ssm-agent.deb {}/amazon-ssm-agent.deb.sig amazon-ssm-agent",
            keys.display(),
            lib().display(),
            served.display(),
            served.display()
        ),
    )
}

#[test]
fn a_signature_by_the_pinned_key_past_its_expiry_date_is_accepted_and_said_so() {
    if !has_gpg() {
        eprintln!("skipped: needs gpg");
        return;
    }
    let t = "20200101T000000!";
    let signer = Signer::new(Some(t));
    let s = StandIn::new();
    let keys = signer.keys_dir(&s, &["amazon-ssm-agent"]);
    signer.serve_signed(
        &s,
        "amazon-ssm-agent.deb",
        "a package\n",
        Some("20200101T010000!"),
    );
    let out = verify_served(&s, &keys);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("past its expiry date; the fingerprint is what is pinned"),
        "{}",
        text(&out)
    );
}

#[test]
fn an_expired_signature_or_a_key_other_than_the_pinned_one_is_refused_and_named() {
    if !has_gpg() {
        eprintln!("skipped: needs gpg");
        return;
    }
    // A key made in 2019 (its copy here expires a day later: accepted, as for AWS's).
    let signer = Signer::new(Some("20190101T000000!"));
    let s = StandIn::new();
    let keys = signer.keys_dir(&s, &["amazon-ssm-agent"]);
    let served = s.path().join("served");
    // A signature that expired an hour after it was made.
    signer.serve_signed(
        &s,
        "amazon-ssm-agent.deb",
        "a package\n",
        Some("20190101T010000!"),
    );
    let sig = served.join("amazon-ssm-agent.deb.sig");
    let out = signer.gpg(
        &[
            "--batch",
            "--yes",
            "--faked-system-time",
            "20190101T010000!",
        ],
        &[
            "--default-sig-expire",
            "seconds=3600",
            "--detach-sign",
            "-o",
            sig.to_str().unwrap(),
            served.join("amazon-ssm-agent.deb").to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let out = verify_served(&s, &keys);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("the signature itself has expired"),
        "{}",
        text(&out)
    );

    // The key shipped beside the pin is another key than the one pinned: named.
    signer.serve_signed(
        &s,
        "amazon-ssm-agent.deb",
        "a package\n",
        Some("20190101T010000!"),
    );
    std::fs::write(
        keys.join("amazon-ssm-agent.fpr"),
        "0000000000000000000000000000000000000000\n",
    )
    .unwrap();
    let out = verify_served(&s, &keys);
    assert!(!out.status.success());
    assert!(
        text(&out).contains(&format!(
            "signed by the key {}, not the pinned one",
            signer.fpr
        )),
        "{}",
        text(&out)
    );
}

/// The keys the recipe ships are the ones pinned next to them.
#[test]
fn the_shipped_signing_keys_match_their_pinned_fingerprints() {
    if !has_gpg() {
        eprintln!("skipped: needs gpg");
        return;
    }
    let dir = repo().join("packer/files/keys");
    let mut checked = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().and_then(|x| x.to_str()) != Some("fpr") {
            continue;
        }
        let pin: String = std::fs::read_to_string(&p)
            .unwrap()
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .collect::<String>()
            .split_whitespace()
            .collect();
        assert_eq!(pin.len(), 40, "{}", p.display());
        let asc = p.with_extension("asc");
        let url = p.with_extension("key-url");
        assert!(
            asc.exists() || url.exists(),
            "{}: neither the key nor where to fetch it",
            p.display()
        );
        if asc.exists() {
            let home = tempfile::tempdir().unwrap();
            let out = Command::new("gpg")
                .arg("--homedir")
                .arg(home.path())
                .args(["--batch", "--with-colons", "--show-keys"])
                .arg(&asc)
                .output()
                .unwrap();
            let fprs = String::from_utf8_lossy(&out.stdout);
            let primary = fprs
                .lines()
                .find_map(|l| {
                    l.strip_prefix("fpr:")
                        .map(|r| r.trim_matches(':').to_string())
                })
                .unwrap();
            assert_eq!(primary, pin.to_uppercase(), "{}", asc.display());
            checked += 1;
        }
    }
    assert!(checked >= 1, "no shipped key checked in {}", dir.display());
}

/// `lib.sh` reads a pin as `slurm-image-builder validate` does (imagebuilder/src/keys.rs):
/// the same answers, word for word, for the harmless forms and the broken ones.
#[test]
fn lib_sh_reads_the_pins_as_validate_does() {
    let s = StandIn::new();
    let fpr = "DE92C7DA3E56E92331D62A36BC1F495C97DD04ED";
    let cases = [
        format!("# from AWS\n{fpr}\n"),
        format!("{fpr}  # trailing comment\n"),
        format!("0x{fpr}\n"),
        format!("\u{feff}{}\r\n", fpr.to_lowercase()),
        "DE92 C7DA 3E56 E923 31D6  2A36 BC1F 495C 97DD 04ED\n".to_string(),
        format!("# c\n{fpr};\n"),
        format!("{}\n", &fpr[1..]),
        format!("{fpr}\n\n{fpr}\n"),
        "# only a comment\n".to_string(),
        "0x\n".to_string(),
    ];
    for (i, case) in cases.iter().enumerate() {
        let file = s.path().join(format!("k{i}.fpr"));
        std::fs::write(&file, case).unwrap();
        let out = s.bash(
            "debian-12",
            &format!(
                ". {}; if pinned_fingerprint {}; then echo ok; fi",
                lib().display(),
                file.display()
            ),
        );
        let ours = slurm_image_builder::keys::parse_pin(&file, case);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        match ours {
            Ok(f) => {
                assert_eq!(f, fpr, "{case:?}");
                assert_eq!(stdout, format!("{fpr}\nok\n"), "{case:?}: {stderr}");
            }
            Err(m) => {
                assert_eq!(stdout, "", "{case:?}");
                assert_eq!(stderr.trim_end(), m, "{case:?}");
            }
        }
    }
    // verify_signature names the step, the package and the pin's own message.
    let keys = s.path().join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    std::fs::write(keys.join("amazon-ssm-agent.fpr"), format!("{fpr}!\n")).unwrap();
    let out = verify_served(&s, &keys);
    assert!(!out.status.success());
    assert!(
        text(&out).contains(&format!(
            "[test] amazon-ssm-agent: {}, line 1: \"{fpr}!\" is not a fingerprint",
            keys.join("amazon-ssm-agent.fpr").display()
        )),
        "{}",
        text(&out)
    );
}

/// The agent build as `assemble_agent` stages it, with a stand-in `slurm-node-agent` whose
/// `generate --out DIR` writes the layout the real one writes (agent/tests/manual.rs checks
/// the real pages and scripts); `$STANDIN_DIR/agent-generate-fails` makes it fail.
fn agent_staging(s: &StandIn) -> PathBuf {
    let staging = s.path().join("staging");
    let agent = staging.join("agent");
    std::fs::create_dir_all(&agent).unwrap();
    let script = r##"#!/bin/bash
echo "$*" >>"$STANDIN_DIR/agent-calls"
[ "$1" = generate ] && [ "$2" = --out ] || exit 2
[ -f "$STANDIN_DIR/agent-generate-fails" ] && { echo "cannot write" >&2; exit 74; }
d=$3
mkdir -p "$d/man/man1" "$d/bash-completion/completions" "$d/zsh/site-functions" "$d/fish/vendor_completions.d"
for b in slurm-node-agent slurm-node-agent-healthcheck; do
	echo ".TH $b 1" >"$d/man/man1/$b.1"
	echo "complete -F _x $b" >"$d/bash-completion/completions/$b"
	echo "#compdef $b" >"$d/zsh/site-functions/_$b"
	echo "complete -c $b" >"$d/fish/vendor_completions.d/$b.fish"
done
echo ".TH slurm-node-agent-drain 1" >"$d/man/man1/slurm-node-agent-drain.1"
"##;
    for bin in ["slurm-node-agent", "slurm-node-agent-healthcheck"] {
        let p = agent.join(bin);
        std::fs::write(&p, script).unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let units = repo().join("units");
    for f in [
        "slurm-node-agent-bootstrap.service",
        "slurm-node-agent.service",
        "slurm-node-agent-cloudwatch-config.service",
        "slurmd.service.d/slurm-node-agent.conf",
        "munge.service.d/slurm-node-agent.conf",
        "sackd.service.d/slurm-node-agent.conf",
        "tmpfiles.d/slurm-node-agent.conf",
    ] {
        let dest = agent.join("units").join(f);
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(units.join(f), dest).unwrap();
    }
    std::fs::copy(
        repo().join("packer/files/agent.toml"),
        agent.join("agent.toml"),
    )
    .unwrap();
    // The image's default health checks, as the template uploads packer/files.
    let checks = staging.join("files/checks.d");
    std::fs::create_dir_all(&checks).unwrap();
    std::fs::copy(
        repo().join("packer/files/checks.d/10-defaults.toml"),
        checks.join("10-defaults.toml"),
    )
    .unwrap();
    staging
}

#[test]
fn agent_step_installs_the_man_pages_and_completions_the_agent_writes() {
    use std::os::unix::fs::PermissionsExt;
    if !is_root() {
        eprintln!("skipped: needs root for a private mount namespace");
        return;
    }
    let s = StandIn::new();
    let staging = agent_staging(&s);
    let staging = staging.to_str().unwrap();
    // 65-services left its CloudWatch drop-in (the image has the CloudWatch agent): the
    // unit that renders the configuration at boot is installed and enabled.
    let dropin = s
        .path()
        .join("root/etc/slurm-node-agent/conf.d/55-cloudwatch.toml");
    std::fs::create_dir_all(dropin.parent().unwrap()).unwrap();
    std::fs::write(&dropin, "[cloudwatch]\nconfig_file = \"/x.json\"\n").unwrap();
    let env = [("IMAGE_OS", "debian-12"), ("IMAGE_STAGING", staging)];
    let (out, written) = step(&s, "70-agent.sh", &env);
    assert!(out.status.success(), "{}", text(&out));
    let cw_unit = "slurm-node-agent-cloudwatch-config.service";
    assert_eq!(
        written.read(&format!("/etc/systemd/system/{cw_unit}")),
        std::fs::read_to_string(repo().join("units").join(cw_unit)).unwrap()
    );
    assert!(
        s.lines("enabled").iter().any(|e| e == cw_unit),
        "{:?}",
        s.lines("enabled")
    );
    let calls = s.lines("agent-calls");
    assert!(
        calls.len() == 1 && calls[0].starts_with("generate --out /"),
        "{calls:?}"
    );
    for (path, text) in [
        (
            "/usr/local/share/man/man1/slurm-node-agent.1",
            ".TH slurm-node-agent 1",
        ),
        (
            "/usr/local/share/man/man1/slurm-node-agent-drain.1",
            ".TH slurm-node-agent-drain 1",
        ),
        (
            "/usr/local/share/man/man1/slurm-node-agent-healthcheck.1",
            ".TH slurm-node-agent-healthcheck 1",
        ),
        (
            "/usr/local/share/bash-completion/completions/slurm-node-agent",
            "complete -F _x slurm-node-agent",
        ),
        (
            "/usr/local/share/zsh/site-functions/_slurm-node-agent-healthcheck",
            "#compdef slurm-node-agent-healthcheck",
        ),
        (
            "/usr/local/share/fish/vendor_completions.d/slurm-node-agent.fish",
            "complete -c slurm-node-agent",
        ),
    ] {
        assert_eq!(written.read(path).trim_end(), text, "{path}");
        let on_disk = written
            .root
            .join("usr-local")
            .join(path.trim_start_matches("/usr/local/"));
        let mode = std::fs::metadata(&on_disk).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o644, "{path}");
    }
    // Both programs in /usr/bin (the packages' path, the units' ExecStart), and the path
    // of images built before as a link to each.
    for bin in ["slurm-node-agent", "slurm-node-agent-healthcheck"] {
        let installed = written.root.join("usr-bin").join(bin);
        assert_eq!(
            std::fs::read(&installed).unwrap(),
            std::fs::read(Path::new(staging).join("agent").join(bin)).unwrap(),
            "/usr/bin/{bin}"
        );
        let mode = std::fs::metadata(&installed).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o755, "/usr/bin/{bin}");
        assert_eq!(
            std::fs::read_link(written.root.join("usr-local/bin").join(bin)).unwrap(),
            Path::new("/usr/bin").join(bin),
            "/usr/local/bin/{bin}"
        );
    }
    // The image's default health checks, as the repository has them.
    assert_eq!(
        written.read("/etc/slurm-node-agent/checks.d/10-defaults.toml"),
        std::fs::read_to_string(repo().join("packer/files/checks.d/10-defaults.toml")).unwrap()
    );
    let log = text(&out);
    assert!(log.contains("done"), "{log}");

    // The generator failing stops the step, naming it; with ALLOW_SKIPS it is a skip.
    let s = StandIn::new();
    let staging = agent_staging(&s);
    s.set("agent-generate-fails", "");
    let staging = staging.to_str().unwrap();
    let (out, _) = step(
        &s,
        "70-agent.sh",
        &[("IMAGE_OS", "debian-12"), ("IMAGE_STAGING", staging)],
    );
    assert!(!out.status.success());
    assert!(
        text(&out).contains("slurm-node-agent generate --out")
            && text(&out).contains("the man pages and completions were not written"),
        "{}",
        text(&out)
    );
    let (out, written) = step(
        &s,
        "70-agent.sh",
        &[
            ("IMAGE_OS", "debian-12"),
            ("IMAGE_STAGING", staging),
            ("ALLOW_SKIPS", "true"),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        written
            .read("/etc/slurm-image/skipped")
            .contains("agent: man pages and completions: slurm-node-agent generate failed"),
        "{}",
        text(&out)
    );
}

/// The image's `auth.type` (issue 37 §3): an image that can join with both plugins (the
/// builder's default `munge+slurm`) leaves it to the node's join, so the managed join takes
/// auth/slurm; `--auth munge` and `--auth slurm` say it; `munge+slurm` over a Slurm whose
/// plugin folder has no `auth_slurm.so` is narrowed to munge and says why. The plugin
/// folder the step looks at, `/opt/slurm/lib/slurm`, is the overlay's: the plugins a case
/// needs are written there (and one the host has is hidden by a whiteout).
#[test]
fn agent_step_leaves_auth_to_the_join_unless_the_image_can_do_only_one() {
    if !is_root() {
        eprintln!("skipped: needs root for a private mount namespace");
        return;
    }
    struct Case {
        auth: &'static str,
        plugins: &'static [&'static str],
        hidden: &'static [&'static str],
        auth_type: Option<&'static str>,
        munge: bool,
    }
    let cases = [
        Case {
            auth: "munge+slurm",
            plugins: &["auth_munge.so", "auth_slurm.so"],
            hidden: &[],
            auth_type: None,
            munge: true,
        },
        Case {
            auth: "munge",
            plugins: &["auth_munge.so", "auth_slurm.so"],
            hidden: &[],
            auth_type: Some("munge"),
            munge: true,
        },
        Case {
            auth: "slurm",
            plugins: &["auth_slurm.so"],
            hidden: &["auth_munge.so"],
            auth_type: Some("slurm"),
            munge: false,
        },
        Case {
            auth: "munge+slurm",
            plugins: &["auth_munge.so"],
            hidden: &["auth_slurm.so"],
            auth_type: Some("munge"),
            munge: true,
        },
    ];
    for c in cases {
        let s = StandIn::new();
        let staging = agent_staging(&s);
        let plugins = s.path().join("root/opt/slurm/lib/slurm");
        std::fs::create_dir_all(&plugins).unwrap();
        for p in c.plugins {
            std::fs::write(plugins.join(p), "").unwrap();
        }
        for p in c.hidden {
            // An overlay whiteout: a 0/0 character device in the upper folder.
            let st = Command::new("mknod")
                .arg(plugins.join(p))
                .args(["c", "0", "0"])
                .status()
                .unwrap();
            assert!(st.success());
        }
        let staging = staging.to_str().unwrap();
        let env = [
            ("IMAGE_OS", "debian-12"),
            ("IMAGE_STAGING", staging),
            ("SLURM_AUTH", c.auth),
        ];
        let (out, written) = step(&s, "70-agent.sh", &env);
        let log = text(&out);
        assert!(out.status.success(), "{}: {log}", c.auth);
        let dropin = written.read("/etc/slurm-node-agent/conf.d/10-image.toml");
        let t: toml::Table =
            toml::from_str(&dropin).unwrap_or_else(|e| panic!("{}: {e}\n{dropin}", c.auth));
        let got = t
            .get("auth")
            .and_then(|a| a.get("type"))
            .and_then(|v| v.as_str());
        assert_eq!(
            got, c.auth_type,
            "{} over {:?}: {dropin}",
            c.auth, c.plugins
        );
        assert!(
            t.get("slurm").and_then(|s| s.get("bin_dir")).is_some(),
            "{dropin}"
        );
        let enabled = s.lines("enabled");
        assert_eq!(
            enabled.iter().any(|u| u == "munge.service"),
            c.munge,
            "{}: {enabled:?}",
            c.auth
        );
        assert_eq!(
            !written
                .read("/etc/systemd/system/munge.service.d/slurm-node-agent.conf")
                .is_empty(),
            c.munge,
            "{}: munge's drop-in",
            c.auth
        );
        let narrowed = c.auth == "munge+slurm" && c.auth_type.is_some();
        assert_eq!(
            log.contains("no auth_slurm.so: this image joins with munge only"),
            narrowed,
            "{log}"
        );
    }

    // A value the builder never passes stops the step, naming it.
    let s = StandIn::new();
    let staging = agent_staging(&s);
    let staging = staging.to_str().unwrap();
    let (out, _) = step(
        &s,
        "70-agent.sh",
        &[
            ("IMAGE_OS", "debian-12"),
            ("IMAGE_STAGING", staging),
            ("SLURM_AUTH", "jwt"),
        ],
    );
    assert!(!out.status.success());
    assert!(
        text(&out).contains("SLURM_AUTH must be munge, slurm or munge+slurm, not 'jwt'"),
        "{}",
        text(&out)
    );
}

/// A finished Slurm tree as `make install DESTDIR=<stage>` leaves it (built for
/// /opt/slurm): a `slurmd` that prints `slurm VERSION` and a reference unit.
fn fake_slurm_stage(stage: &Path, version: &str) {
    use std::os::unix::fs::PermissionsExt;
    let sbin = stage.join("opt/slurm/sbin");
    std::fs::create_dir_all(&sbin).unwrap();
    std::fs::create_dir_all(stage.join("opt/slurm/bin")).unwrap();
    let slurmd = sbin.join("slurmd");
    std::fs::write(&slurmd, format!("#!/bin/sh\necho 'slurm {version}'\n")).unwrap();
    std::fs::set_permissions(&slurmd, std::fs::Permissions::from_mode(0o755)).unwrap();
    let units = stage.join("usr/lib/systemd/system");
    std::fs::create_dir_all(&units).unwrap();
    std::fs::write(
        units.join("slurmd.service"),
        format!("# slurmd {version}\n[Service]\nExecStart=/opt/slurm/sbin/slurmd --systemd\n"),
    )
    .unwrap();
}

/// Runs `install_slurm_versions DEFAULT VERSIONS...` of lib-slurm.sh with SLURM_OPT_ROOT at
/// `root/opt`; the caller's `slurm_build_version` places the fake stage of the version
/// (`stages/<version>`, made by [`fake_slurm_stage`]) and records the version in
/// `root/built`.
fn install_versions(root: &Path, default: &str, versions: &str) -> Output {
    let script = format!(
        ". packer/scripts/lib.sh; . packer/scripts/lib-slurm.sh\n\
         slurm_build_version() {{ echo \"$1\" >>\"$ROOT/built\"; place_slurm_tree \"$ROOT/stages/$1\" \"key-$1\" \"$2\" \"$1\"; }}\n\
         install_slurm_versions {default} {versions}\n"
    );
    Command::new("bash")
        .arg("-c")
        .arg(script)
        .current_dir(repo())
        .env("ROOT", root)
        .env("SLURM_OPT_ROOT", root.join("opt"))
        .env("STEP", "test")
        .output()
        .unwrap()
}

fn read_link(p: &Path) -> String {
    std::fs::read_link(p)
        .map(|t| t.display().to_string())
        .unwrap_or_else(|e| format!("not a symlink: {e}"))
}

fn opt_entries(opt: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(opt)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn slurmd_through_link(opt: &Path) -> String {
    let out = Command::new(opt.join("slurm/sbin/slurmd"))
        .arg("-V")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Issue 23 §2: several Slurm versions side by side. Each finished tree goes to
/// /opt/slurm-<version> with its marker written last, /opt/slurm is a relative symlink to
/// the default's; an interrupted install (a prefix without marker, a leftover swap tree
/// or temporary symlink) is repaired by the next run, which builds only what is missing;
/// an earlier single-version /opt/slurm folder is replaced by the symlink; a version listed
/// twice, a default not listed, a tree reporting another version are refused by name.
#[test]
fn several_slurm_versions_go_side_by_side_behind_a_symlink_and_a_broken_install_is_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let opt = root.join("opt");
    for v in ["25.11.6", "26.05.3", "24.11.7"] {
        fake_slurm_stage(&root.join("stages").join(v), v);
    }
    let built = || {
        let b = std::fs::read_to_string(root.join("built")).unwrap_or_default();
        std::fs::remove_file(root.join("built")).ok();
        b.lines().map(String::from).collect::<Vec<_>>()
    };

    // Both versions, default 25.11.6.
    let out = install_versions(root, "25.11.6", "25.11.6 26.05.3");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(built(), ["25.11.6", "26.05.3"]);
    assert_eq!(
        opt_entries(&opt),
        ["slurm", "slurm-25.11.6", "slurm-26.05.3"]
    );
    for v in ["25.11.6", "26.05.3"] {
        let p = opt.join(format!("slurm-{v}"));
        assert_eq!(
            std::fs::read_to_string(p.join(".slurm-build")).unwrap(),
            format!("key=key-{v}\nversion={v}\n")
        );
        let unit = std::fs::read_to_string(p.join("lib/systemd/system/slurmd.service")).unwrap();
        assert!(unit.contains(&format!("# slurmd {v}")), "{unit}");
    }
    assert_eq!(read_link(&opt.join("slurm")), "slurm-25.11.6");
    assert_eq!(slurmd_through_link(&opt), "slurm 25.11.6");
    // Each version was checked through the symlink, which went back to the default.
    let t = text(&out);
    assert!(
        t.contains("slurm 26.05.3 in") && t.contains("slurmd -V reports 26.05.3"),
        "{t}"
    );

    // Interrupted: 26.05.3's marker never written (and a stray file in its prefix), a swap
    // tree and a temporary symlink left behind. The next run removes them and installs
    // 26.05.3 again, and only it.
    std::fs::remove_file(opt.join("slurm-26.05.3/.slurm-build")).unwrap();
    std::fs::write(opt.join("slurm-26.05.3/half"), "").unwrap();
    std::fs::create_dir_all(opt.join("slurm-25.11.6.new.999/sbin")).unwrap();
    std::os::unix::fs::symlink("slurm-26.05.3", opt.join(".slurm.link.999")).unwrap();
    let out = install_versions(root, "25.11.6", "25.11.6 26.05.3");
    assert!(out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("slurm-26.05.3: half-installed (no marker")
            && t.contains("slurm-25.11.6.new.999, left by an interrupted install")
            && t.contains("slurm 25.11.6 already installed"),
        "{t}"
    );
    assert_eq!(built(), ["26.05.3"]);
    assert_eq!(
        opt_entries(&opt),
        ["slurm", "slurm-25.11.6", "slurm-26.05.3"]
    );
    assert!(!opt.join("slurm-26.05.3/half").exists());
    assert!(opt.join("slurm-26.05.3/.slurm-build").exists());
    assert_eq!(read_link(&opt.join("slurm")), "slurm-25.11.6");

    // Another default: the symlink moves, nothing is built; a version no longer listed goes.
    let out = install_versions(root, "26.05.3", "26.05.3 24.11.7");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(built(), ["24.11.7"]);
    assert_eq!(
        opt_entries(&opt),
        ["slurm", "slurm-24.11.7", "slurm-26.05.3"]
    );
    assert_eq!(read_link(&opt.join("slurm")), "slurm-26.05.3");
    assert_eq!(slurmd_through_link(&opt), "slurm 26.05.3");

    // Refused before anything is touched: a version twice, a default not listed, a version
    // that is not MAJOR.MINOR.MICRO.
    for (default, versions, want) in [
        (
            "25.11.6",
            "25.11.6 26.05.3 25.11.6",
            "SLURM_VERSIONS (25.11.6 26.05.3 25.11.6) lists Slurm 25.11.6 twice",
        ),
        (
            "24.11.7",
            "25.11.6 26.05.3",
            "the default Slurm 24.11.7 is not in SLURM_VERSIONS (25.11.6 26.05.3)",
        ),
        ("25.11", "25.11 26.05.3", "'25.11' is not MAJOR.MINOR.MICRO"),
    ] {
        let out = install_versions(root, default, versions);
        assert!(!out.status.success(), "{versions}: {}", text(&out));
        assert!(text(&out).contains(want), "{versions}: {}", text(&out));
        assert_eq!(built(), Vec::<String>::new(), "{versions}");
        assert_eq!(
            opt_entries(&opt),
            ["slurm", "slurm-24.11.7", "slurm-26.05.3"],
            "{versions}"
        );
    }

    // A tree that reports another version than the one it was built for: refused by name,
    // its prefix removed, the symlink back at the default.
    fake_slurm_stage(&root.join("stages/25.11.6"), "25.11.5");
    let out = install_versions(root, "26.05.3", "26.05.3 25.11.6");
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("the Slurm built for 25.11.6 reports 25.11.5"),
        "{}",
        text(&out)
    );
    assert!(!opt.join("slurm-25.11.6").exists());
    assert_eq!(read_link(&opt.join("slurm")), "slurm-26.05.3");

    // An earlier single-version install (/opt/slurm a folder) is replaced by the symlink.
    let dir2 = tempfile::tempdir().unwrap();
    let root2 = dir2.path();
    let opt2 = root2.join("opt");
    std::fs::create_dir_all(opt2.join("slurm/sbin")).unwrap();
    std::fs::write(opt2.join("slurm/.slurm-build"), "key=k\nversion=24.11.7\n").unwrap();
    for v in ["25.11.6", "26.05.3"] {
        fake_slurm_stage(&root2.join("stages").join(v), v);
    }
    let out = install_versions(root2, "26.05.3", "25.11.6 26.05.3");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        opt_entries(&opt2),
        ["slurm", "slurm-25.11.6", "slurm-26.05.3"]
    );
    assert_eq!(read_link(&opt2.join("slurm")), "slurm-26.05.3");
    assert_eq!(slurmd_through_link(&opt2), "slurm 26.05.3");
}

/// 30-slurm.sh with two versions (issue 23 §2): each pinned tarball is verified, built
/// (stand-in source trees) and installed in /opt/slurm-<version>; /opt/slurm, the host's
/// real folder below the overlay, becomes a symlink to the default's, whose units are the
/// image's; a second run builds nothing; a version listed twice is refused by the step.
#[test]
fn slurm_step_installs_several_versions_side_by_side() {
    if !is_root() {
        eprintln!("skipped: needs root for a private mount namespace");
        return;
    }
    let s = StandIn::new();
    let staging = s.path().join("staging");
    std::fs::create_dir_all(staging.join("sources")).unwrap();
    let inc = s.path().join("root/usr-local/include");
    std::fs::create_dir_all(&inc).unwrap();
    std::fs::write(inc.join("pmix.h"), "/* stand-in */\n").unwrap();
    let mut env: Vec<(String, String)> = vec![
        ("IMAGE_OS".into(), "debian-12".into()),
        ("IMAGE_ARCH".into(), "x86_64".into()),
        ("IMAGE_STAGING".into(), staging.display().to_string()),
        ("SLURM_VERSION".into(), "24.05.8".into()),
        ("SLURM_DEFAULT".into(), "24.05.8".into()),
        ("SLURM_VERSIONS".into(), "23.11.4 24.05.8".into()),
        ("SLURM_SOURCE".into(), "tarball".into()),
        ("SLURM_AUTH".into(), "munge".into()),
        (
            "SLURM_BUILD_CACHE".into(),
            s.path().join("cache").display().to_string(),
        ),
    ];
    for v in ["23.11.4", "24.05.8"] {
        let file = format!("slurm-{}-1.tar.gz", v.replace('.', "-"));
        let sha = fake_slurm_tarball(
            &staging.join("sources").join(&file),
            v,
            &["mpi_pmix.so"],
            &s.path().join(format!("configure-{v}")),
        );
        let suffix = v.replace('.', "_");
        env.push((
            format!("SLURM_URL_{suffix}"),
            format!("https://github.com/SchedMD/slurm/archive/{file}"),
        ));
        env.push((format!("SLURM_SHA256_{suffix}"), sha));
    }
    let env_ref = |extra: &[(&str, &str)]| -> Vec<(String, String)> {
        let mut e = env.clone();
        for (k, v) in extra {
            e.retain(|(n, _)| n != k);
            e.push((k.to_string(), v.to_string()));
        }
        e
    };
    let run_step = |e: &[(String, String)]| {
        let pairs: Vec<(&str, &str)> = e.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        step(&s, "30-slurm.sh", &pairs)
    };
    let opt = s.path().join("root/opt");

    let (out, _) = run_step(&env_ref(&[]));
    assert!(out.status.success(), "{}", text(&out));
    for v in ["23.11.4", "24.05.8"] {
        // Each was configured for /opt/slurm, as a single version is (same cache keys).
        let args = std::fs::read_to_string(s.path().join(format!("configure-{v}"))).unwrap();
        assert!(
            args.lines().any(|a| a == "--prefix=/opt/slurm"),
            "{v}: {args}"
        );
        let marker = std::fs::read_to_string(opt.join(format!("slurm-{v}/.slurm-build"))).unwrap();
        assert!(
            marker.starts_with("key=") && marker.ends_with(&format!("\nversion={v}\n")),
            "{v}: {marker}"
        );
    }
    assert_eq!(read_link(&opt.join("slurm")), "slurm-24.05.8");
    let t = text(&out);
    assert!(
        t.contains("slurmd -V reports 23.11.4") && t.contains("slurm 23.11.4 24.05.8 installed"),
        "{t}"
    );
    assert_eq!(
        std::fs::read_to_string(s.path().join("root/etc/ld.so.conf.d/slurm.conf")).unwrap(),
        "/opt/slurm/lib\n"
    );
    assert_eq!(
        std::fs::read_link(s.path().join("root/usr-local/bin/slurmd")).unwrap(),
        Path::new("/opt/slurm/sbin/slurmd")
    );

    // Again: both prefixes are whole, nothing is fetched or built.
    std::fs::remove_file(s.path().join("configure-23.11.4")).unwrap();
    let (out, _) = run_step(&env_ref(&[]));
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("slurm 23.11.4 already installed"),
        "{}",
        text(&out)
    );
    assert!(!s.path().join("configure-23.11.4").exists());

    // A version twice: refused by the step, naming it.
    let (out, _) = run_step(&env_ref(&[("SLURM_VERSIONS", "24.05.8 23.11.4 24.05.8")]));
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("lists Slurm 24.05.8 twice"),
        "{}",
        text(&out)
    );
    // Several versions from the distribution's packages: refused.
    let (out, _) = run_step(&env_ref(&[("SLURM_SOURCE", "distro")]));
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("installs one Slurm version, not 2 (23.11.4 24.05.8)"),
        "{}",
        text(&out)
    );
}
