//! The project's systemd units (`units/`): every one passes `systemd-analyze verify`, and
//! under a real systemd 252 Manager (`systemd --user`, confined by the harness):
//! - `SLURMD_OPTIONS` written the way the agent writes it reaches slurmd as separate
//!   arguments, `--conf` getting `CPUs=2 RealMemory=1000` as ONE argument;
//! - the slurmd drop-in clears the distribution's `ConditionPathExists=` and lets slurmd
//!   start only once the mounts marker exists;
//! - the bootstrap unit can start slurmd and wait for it (no ordering deadlock), is
//!   retried on failure, and the ordering the units deliberately lack would deadlock a
//!   oneshot;
//! - bootstrap's start job ends when the agent runs (Type=exec), so boot does not wait for
//!   bootstrap's retries;
//! - the munge drop-in skips munged's start (not a failure) until the key exists.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use slurm_e2e::{run_ok, run_with_timeout, wait_until, TempRoot, UserSystemd};

/// What packer installs the agent as; replaced by a stand-in in the copies tested here.
const AGENT_BIN: &str = "/usr/bin/slurm-node-agent";
const BOOTSTRAP: &str = "slurm-node-agent-bootstrap.service";
const DAEMON: &str = "slurm-node-agent.service";
const CLOUDWATCH: &str = "slurm-node-agent-cloudwatch-config.service";
const DROPIN: &str = "slurmd.service.d/slurm-node-agent.conf";
const MUNGE_DROPIN: &str = "munge.service.d/slurm-node-agent.conf";
const TMPFILES: &str = "tmpfiles.d/slurm-node-agent.conf";
/// The line the agent writes (agent/src/slurm/options.rs pins the same text).
const OPTIONS_LINE: &str = "SLURMD_OPTIONS='-N n1 -Z --conf \"CPUs=2 RealMemory=1000\"'";

fn units_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../units")
}

fn read_unit(rel: &str) -> String {
    fs::read_to_string(units_dir().join(rel)).unwrap()
}

/// `systemd-analyze verify <path>`: (success, stderr).
fn verify(path: &Path) -> (bool, String) {
    let mut c = Command::new("systemd-analyze");
    c.arg("verify").arg(path);
    let out = run_with_timeout(c, Duration::from_secs(60)).unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).trim().to_string(),
    )
}

#[test]
fn every_unit_passes_systemd_analyze_verify() {
    let root = TempRoot::new("units-verify-").unwrap();
    let dir = root.subdir("system").unwrap();
    fs::create_dir_all(dir.join("slurmd.service.d")).unwrap();
    for u in [BOOTSTRAP, DAEMON, CLOUDWATCH] {
        let text = read_unit(u);
        assert!(text.contains(&format!("ExecStart={AGENT_BIN} ")), "{u}");
        // The binary is not installed on this machine; verify checks it is executable.
        fs::write(dir.join(u), text.replace(AGENT_BIN, "/bin/true")).unwrap();
    }
    // The drop-in is verified as part of the distribution's slurmd.service.
    fs::copy(
        "/lib/systemd/system/slurmd.service",
        dir.join("slurmd.service"),
    )
    .unwrap();
    fs::write(dir.join(DROPIN), read_unit(DROPIN)).unwrap();
    fs::create_dir_all(dir.join("munge.service.d")).unwrap();
    fs::copy(
        "/lib/systemd/system/munge.service",
        dir.join("munge.service"),
    )
    .unwrap();
    fs::write(dir.join(MUNGE_DROPIN), read_unit(MUNGE_DROPIN)).unwrap();
    for u in [
        BOOTSTRAP,
        DAEMON,
        CLOUDWATCH,
        "slurmd.service",
        "munge.service",
    ] {
        let (ok, stderr) = verify(&dir.join(u));
        assert!(ok && stderr.is_empty(), "{u}: {stderr}");
    }
    // The check can fail: a misspelt key in the drop-in is reported (so it is read).
    fs::write(
        dir.join(DROPIN),
        read_unit(DROPIN).replace(
            "EnvironmentFile=-/etc/default",
            "EnvironmentFiel=-/etc/default",
        ),
    )
    .unwrap();
    let (_, stderr) = verify(&dir.join("slurmd.service"));
    assert!(stderr.contains("EnvironmentFiel"), "{stderr}");

    // tmpfiles.d: the folders it declares, created under a scratch root.
    let conf = units_dir().join(TMPFILES);
    let troot = root.subdir("root").unwrap();
    let mut c = Command::new("systemd-tmpfiles");
    c.arg("--create")
        .arg(format!("--root={}", troot.display()))
        .arg(&conf);
    run_ok(c, Duration::from_secs(30)).unwrap();
    for d in ["var/lib/slurm-node-agent", "run/slurm-node-agent"] {
        let md = fs::metadata(troot.join(d)).unwrap();
        assert!(md.is_dir(), "{d}");
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&md.permissions()) & 0o777,
            0o755
        );
    }
}

/// A user Manager with the project's units (agent binary replaced by `bootstrap_exec`),
/// a stand-in slurmd.service shaped like Debian's that records its argv, and the drop-in
/// pointed at a scratch options file.
struct Node {
    sd: UserSystemd,
    root: TempRoot,
}

impl Node {
    fn start(bootstrap_exec: &str) -> Node {
        let sd = UserSystemd::start().unwrap();
        let root = TempRoot::new("units-node-").unwrap();
        let dir = sd.unit_dir();
        let argv = root.path().join("slurmd.argv");
        let options = root.path().join("default-slurmd");
        fs::write(
            &options,
            format!("# Written by slurm-node-agent bootstrap.\n{OPTIONS_LINE}\n"),
        )
        .unwrap();
        // Debian's unit, but recording argv instead of running slurmd; its condition on
        // slurm.conf is kept (pointed at a path that is surely missing).
        fs::write(
            dir.join("slurmd.service"),
            format!(
                "[Unit]\nDescription=stand-in slurmd\nConditionPathExists={}/etc/slurm/slurm.conf\n\
                 [Service]\nType=simple\n\
                 ExecStart=/bin/sh -c 'printf \"%%s\\\\n\" \"$@\" > {}; exec sleep 600' slurmd -D -s $SLURMD_OPTIONS\n",
                root.path().display(),
                argv.display()
            ),
        )
        .unwrap();
        fs::create_dir_all(dir.join("slurmd.service.d")).unwrap();
        let dropin = read_unit(DROPIN)
            .replace("-/etc/default/slurmd", &format!("-{}", options.display()))
            .replace(
                "-/etc/sysconfig/slurmd",
                &format!("-{}.sysconfig", options.display()),
            );
        fs::write(dir.join(DROPIN), dropin).unwrap();
        fs::write(
            dir.join(BOOTSTRAP),
            read_unit(BOOTSTRAP).replace(&format!("{AGENT_BIN} bootstrap"), bootstrap_exec),
        )
        .unwrap();
        sd.daemon_reload().unwrap();
        Node { sd, root }
    }

    fn marker(&self) -> PathBuf {
        self.sd
            .xdg_runtime_dir()
            .join("slurm-node-agent/mounts-ready")
    }

    fn argv(&self) -> Option<Vec<String>> {
        fs::read_to_string(self.root.path().join("slurmd.argv"))
            .ok()
            .map(|t| t.lines().map(str::to_string).collect())
    }

    fn prop(&self, unit: &str, p: &str) -> String {
        self.sd.unit_property(unit, p).unwrap()
    }

    /// Writes a drop-in for `unit` and reloads.
    fn dropin(&self, unit: &str, text: &str) {
        let d = self.sd.unit_dir().join(format!("{unit}.d"));
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("test.conf"), text).unwrap();
        self.sd.daemon_reload().unwrap();
    }
}

fn expected_argv() -> Vec<String> {
    [
        "-D",
        "-s",
        "-N",
        "n1",
        "-Z",
        "--conf",
        "CPUs=2 RealMemory=1000",
    ]
    .map(String::from)
    .to_vec()
}

#[test]
fn slurmd_options_are_split_into_arguments_and_slurmd_waits_for_the_marker() {
    let n = Node::start("/bin/true");
    // No marker: the start is skipped (condition), not failed, and slurmd never ran.
    n.sd.systemctl_ok(&["start", "slurmd.service"]).unwrap();
    assert_eq!(n.prop("slurmd.service", "ActiveState"), "inactive");
    assert_eq!(n.prop("slurmd.service", "ConditionResult"), "no");
    assert!(n.argv().is_none());
    // Requires= pulled bootstrap in.
    assert_eq!(n.prop(BOOTSTRAP, "ActiveState"), "active");

    // With the marker (and no slurm.conf: the distribution's condition is cleared).
    fs::create_dir_all(n.marker().parent().unwrap()).unwrap();
    fs::write(n.marker(), "").unwrap();
    n.sd.systemctl_ok(&["start", "slurmd.service"]).unwrap();
    assert_eq!(n.prop("slurmd.service", "ActiveState"), "active");
    let argv = wait_until(
        "slurmd's argv",
        Duration::from_secs(10),
        Duration::from_millis(20),
        || Ok(n.argv().filter(|a| a.len() >= 7)),
    )
    .unwrap();
    // systemd 252 splits $SLURMD_OPTIONS at spaces outside quotes and removes the quotes.
    assert_eq!(argv, expected_argv());
}

#[test]
fn bootstrap_starts_slurmd_without_deadlock_and_is_retried_on_failure() {
    // The stand-in bootstrap fails once (a mount not there yet: exit 72), then writes the
    // marker and starts slurmd through the Manager, waiting for the job as the agent does.
    let root = TempRoot::new("units-boot-").unwrap();
    let script = root.path().join("bootstrap.sh");
    fs::write(
        &script,
        "#!/bin/sh\nset -e\nif [ ! -e \"$0.ran\" ]; then touch \"$0.ran\"; exit 72; fi\n\
         mkdir -p \"$XDG_RUNTIME_DIR/slurm-node-agent\"\ntouch \"$XDG_RUNTIME_DIR/slurm-node-agent/mounts-ready\"\n\
         exec timeout 20 systemctl --user start slurmd.service\n",
    )
    .unwrap();
    fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let n = Node::start(&script.display().to_string());
    n.dropin(
        BOOTSTRAP,
        &format!(
            "[Service]\nEnvironment=XDG_RUNTIME_DIR={}\nRestartSec=200ms\n",
            n.sd.xdg_runtime_dir().display()
        ),
    );
    // The start job ends once the agent runs (Type=exec), but a first attempt that fails
    // at once can be seen by the manager (SIGCHLD) before the exec succeeded, and then
    // the job reports the failure: start without waiting for the job, as multi-user.target
    // does (Wants=), and judge by the unit's state (CI saw the blocking start fail).
    n.sd.systemctl_ok(&["start", "--no-block", BOOTSTRAP])
        .unwrap();
    wait_until(
        "bootstrap to have been retried and to have started slurmd",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || {
            Ok((n.prop(BOOTSTRAP, "NRestarts") == "1"
                && n.prop("slurmd.service", "ActiveState") == "active")
                .then_some(()))
        },
    )
    .unwrap();
    // After the successful attempt it stays active (RemainAfterExit=yes), not restarted.
    wait_until(
        "bootstrap's process to have exited",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || Ok((n.prop(BOOTSTRAP, "SubState") == "exited").then_some(())),
    )
    .unwrap();
    assert_eq!(n.prop(BOOTSTRAP, "ActiveState"), "active");
    assert_eq!(n.prop(BOOTSTRAP, "ExecMainStatus"), "0");
    assert_eq!(n.prop(BOOTSTRAP, "NRestarts"), "1");
    assert_eq!(n.argv().unwrap(), expected_argv());
}

#[test]
fn ordering_bootstrap_before_slurmd_would_deadlock() {
    // Why the bootstrap unit has no Before=slurmd.service: were it a oneshot, the slurmd
    // start job that bootstrap waits for would wait for bootstrap itself. The inner
    // timeout ends it.
    let root = TempRoot::new("units-deadlock-").unwrap();
    let script = root.path().join("bootstrap.sh");
    fs::write(
        &script,
        "#!/bin/sh\nmkdir -p \"$XDG_RUNTIME_DIR/slurm-node-agent\"\ntouch \"$XDG_RUNTIME_DIR/slurm-node-agent/mounts-ready\"\n\
         exec timeout 3 systemctl --user start slurmd.service\n",
    )
    .unwrap();
    fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let n = Node::start(&script.display().to_string());
    n.dropin(
        BOOTSTRAP,
        &format!(
            "[Unit]\nBefore=slurmd.service\n[Service]\nType=oneshot\nEnvironment=XDG_RUNTIME_DIR={}\nRestart=no\n",
            n.sd.xdg_runtime_dir().display()
        ),
    );
    let out = n.sd.systemctl(&["start", BOOTSTRAP]).unwrap();
    assert!(!out.status.success());
    // systemctl inside was killed by its timeout (exit 124): slurmd's job never ran
    // while bootstrap was activating.
    assert_eq!(n.prop(BOOTSTRAP, "ExecMainStatus"), "124");
}

#[test]
fn munge_start_is_skipped_not_failed_until_the_key_exists() {
    let sd = UserSystemd::start().unwrap();
    let root = TempRoot::new("units-munge-").unwrap();
    let key = root.path().join("munge.key");
    let dir = sd.unit_dir();
    // Shaped like Debian's munge.service: a daemon that fails without its key.
    fs::write(
        dir.join("munge.service"),
        format!(
            "[Unit]\nDescription=stand-in munge\n[Service]\nType=simple\n\
             ExecStart=/bin/sh -c 'test -r {} && exec sleep 600'\n",
            key.display()
        ),
    )
    .unwrap();
    fs::create_dir_all(dir.join("munge.service.d")).unwrap();
    let dropin = read_unit(MUNGE_DROPIN);
    assert!(dropin.contains("ConditionPathExists=/etc/munge/munge.key"));
    fs::write(
        dir.join(MUNGE_DROPIN),
        dropin.replace("/etc/munge/munge.key", &key.display().to_string()),
    )
    .unwrap();
    sd.daemon_reload().unwrap();
    sd.systemctl_ok(&["start", "munge.service"]).unwrap();
    assert_eq!(
        sd.unit_property("munge.service", "ActiveState").unwrap(),
        "inactive"
    );
    assert_eq!(
        sd.unit_property("munge.service", "ConditionResult")
            .unwrap(),
        "no"
    );
    fs::write(&key, [0u8; 32]).unwrap();
    sd.systemctl_ok(&["start", "munge.service"]).unwrap();
    assert_eq!(
        sd.unit_property("munge.service", "ActiveState").unwrap(),
        "active"
    );
}

/// What replaces the journal export: `slurm-node-agent-cloudwatch-config.service`, run by a
/// real (confined) systemd Manager with the real agent binary, writes the CloudWatch agent's
/// configuration before the CloudWatch agent starts: a stand-in `amazon-cloudwatch-agent`
/// that copies the configuration it finds at its start sees the rendered one, pulled in by
/// the unit's `WantedBy=` once enabled. Started again, the unit leaves the file alone.
#[test]
fn the_cloudwatch_configuration_is_written_before_the_cloudwatch_agent_starts() {
    let sd = UserSystemd::start().unwrap();
    let root = TempRoot::new("units-cloudwatch-").unwrap();
    let dir = sd.unit_dir();
    let agent = slurm_e2e::agent::agent_binary().unwrap();
    let config = root.path().join("cw/amazon-cloudwatch-agent.json");
    let seen = root.path().join("seen.json");
    fs::create_dir_all(root.path().join("conf.d")).unwrap();
    fs::write(
        root.path().join("agent.toml"),
        format!(
            "[cloudwatch]\nconfig_file = \"{}\"\ncluster_name = \"hpc-a\"\nretention_days = 14\n",
            config.display()
        ),
    )
    .unwrap();
    let exec = format!(
        "{} config cloudwatch --write --no-imds --config {} --config-dir {} --sys-dir {} --dev-dir {}",
        agent.display(),
        root.path().join("agent.toml").display(),
        root.path().join("conf.d").display(),
        root.path().display(),
        root.path().display()
    );
    let unit = read_unit(CLOUDWATCH);
    assert!(
        unit.contains(&format!(
            "ExecStart={AGENT_BIN} config cloudwatch --write\n"
        )),
        "{unit}"
    );
    fs::write(
        dir.join(CLOUDWATCH),
        unit.replace(&format!("{AGENT_BIN} config cloudwatch --write"), &exec),
    )
    .unwrap();
    fs::write(
        dir.join("amazon-cloudwatch-agent.service"),
        format!(
            "[Unit]\nDescription=stand-in CloudWatch agent\n[Service]\nType=oneshot\nRemainAfterExit=yes\n\
             ExecStart=/bin/cp {} {}\n",
            config.display(),
            seen.display()
        ),
    )
    .unwrap();
    // What `systemctl enable` makes of `WantedBy=amazon-cloudwatch-agent.service` (the
    // image enables the unit; the client's enable does not see this Manager's unit folder).
    assert!(
        unit.contains("WantedBy=amazon-cloudwatch-agent.service"),
        "{unit}"
    );
    let wants = dir.join("amazon-cloudwatch-agent.service.wants");
    fs::create_dir_all(&wants).unwrap();
    std::os::unix::fs::symlink(dir.join(CLOUDWATCH), wants.join(CLOUDWATCH)).unwrap();
    sd.daemon_reload().unwrap();
    sd.systemctl_ok(&["start", "amazon-cloudwatch-agent.service"])
        .unwrap();
    let text =
        fs::read_to_string(&seen).expect("the CloudWatch agent started without its configuration");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        v["logs"]["logs_collected"]["journald"]["collect_list"][0]["log_group_name"],
        "/slurm/hpc-a/agent"
    );
    assert_eq!(
        v["logs"]["logs_collected"]["journald"]["collect_list"][0]["retention_in_days"],
        14
    );
    assert_eq!(sd.unit_property(CLOUDWATCH, "Result").unwrap(), "success");
    // Again (a reboot): the same configuration, the file not rewritten.
    let mtime = fs::metadata(&config).unwrap().modified().unwrap();
    sd.systemctl_ok(&["restart", CLOUDWATCH]).unwrap();
    assert_eq!(fs::metadata(&config).unwrap().modified().unwrap(), mtime);
    assert_eq!(fs::read_to_string(&config).unwrap(), text);
}
