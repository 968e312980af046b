//! Health checks against a real slurmctld and slurmd (Slurm 22.05 from Debian):
//! `slurm-node-agent-healthcheck` (the agent's `check` as a program of its own) as slurmd's
//! `HealthCheckProgram`, with a small
//! `HealthCheckInterval`. A failing check drains the node, recovery resumes it, and an
//! admin drain ("ADMIN SHUTDOWN") is never resumed nor overwritten. Also: `check` for a
//! node slurmctld does not know (slurmd not registered) returns at once.
//!
//! `HealthCheckNodeState=START_ONLY` (Slurm 25.11+): the one run, at slurmd's start before
//! it registers, cannot drain a dynamic node's first boot (no record yet): bootstrap drains
//! it after the join; a record that exists (pre-declared, or a stale one) is drained by the
//! run and stays drained through the registration. `REBOOT_ONLY` (26.05+; skipped with a
//! note on older Slurm): the one run after `scontrol reboot` drains or lifts.
//!
//! Slurm runs `HealthCheckProgram` without arguments and with only `SLURMD_NODENAME` in
//! its environment. A node with the default paths names the program itself; the test's
//! paths (settings, state, SLURM_CONF) are its own, so it writes a one-line wrapper that
//! execs the program with them.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use slurm_e2e::agent::{agent_binary, healthcheck_binary, report, NodeEnv, DEFAULT_NODE_NAME};
use slurm_e2e::{is_idle, run_with_timeout, wait_until, NodeKind, Slurmctld, Slurmd, TempRoot};

const INTERVAL_S: u64 = 2;
/// The agent's health reasons: `slurm-node-agent/health@<instance-id>: <check>: ...`.
const PREFIX: &str = "slurm-node-agent/health@";

/// Writes the checks and the wrapper; returns the wrapper's path.
fn setup(root: &Path, ctld_conf: &Path) -> std::path::PathBuf {
    let flag = root.join("healthy-flag");
    fs::write(&flag, "ok").unwrap();
    fs::create_dir_all(root.join("state")).unwrap();
    // Paths given on the command line must exist (only the built-in defaults are optional).
    // Only the Slurm under test (its scontrol) is set.
    fs::write(
        root.join("none.toml"),
        format!(
            "[slurm]\nbin_dir = \"{}\"\n",
            slurm_e2e::install::bin_dir().display()
        ),
    )
    .unwrap();
    fs::create_dir_all(root.join("none.d")).unwrap();
    fs::create_dir_all(root.join("checks.d")).unwrap();
    fs::write(
        root.join("nhc.conf"),
        format!(
            "* || check_file_test -e {}\n* || check_fs_mount_rw -f /\n",
            flag.display()
        ),
    )
    .unwrap();
    let wrapper = root.join("health-check");
    let agent = healthcheck_binary().unwrap();
    let r = root.display();
    fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\n\
             SLURM_CONF={conf} exec {agent} --config={r}/none.toml --config-dir={r}/none.d \
             --checks-dir={r}/checks.d --set=agent.state_dir={r}/state --nhc-conf={r}/nhc.conf \
             >> {r}/check.log 2>&1\n",
            conf = ctld_conf.display(),
            agent = agent.display(),
        ),
    )
    .unwrap();
    fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).unwrap();
    wrapper
}

fn runs(root: &Path) -> usize {
    fs::read_to_string(root.join("check.log"))
        .unwrap_or_default()
        .matches("action: ")
        .count()
}

/// Waits until the health check has run `n` more times.
fn wait_runs(root: &Path, n: usize) {
    let start = runs(root);
    let deadline = Instant::now() + Duration::from_secs(INTERVAL_S * (n as u64) * 10 + 20);
    while runs(root) < start + n {
        assert!(
            Instant::now() < deadline,
            "the health check did not run {n} more times; log:\n{}",
            fs::read_to_string(root.join("check.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The drain state the HealthCheckProgram keeps in its state folder (`drain.json`), once
/// `cause_kind` is its cause (`None`: none); it is saved just after Slurm took the change.
fn drain_state(root: &Path, cause_kind: Option<&str>) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = fs::read_to_string(root.join("state/drain.json")).unwrap_or_default();
        let st: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        if st["cause"]["kind"].as_str() == cause_kind || Instant::now() > deadline {
            return st;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn reason(ctld: &Slurmctld, node: &str) -> String {
    let out = ctld.scontrol_ok(&["show", "node", "-o", node]).unwrap();
    out.split(" Reason=")
        .nth(1)
        .unwrap_or("")
        .trim()
        .to_string()
}

#[test]
fn health_check_program_drains_resumes_and_leaves_admin_drains_alone() {
    let root = TempRoot::new("health-e2e-").unwrap();
    // The wrapper needs the controller's config path, known once it runs; slurmd reads
    // HealthCheckProgram only when it starts, so the path is fixed now, filled after.
    let wrapper_path = root.path().join("health-check");
    let ctld = Slurmctld::builder("health")
        .line(format!("HealthCheckProgram={}", wrapper_path.display()))
        .line(format!("HealthCheckInterval={INTERVAL_S}"))
        .start()
        .unwrap();
    let wrapper = setup(root.path(), ctld.conf_path());
    assert_eq!(wrapper, wrapper_path);
    let _node = Slurmd::dynamic(&ctld, "hc1", "CPUs=1 RealMemory=100").unwrap();
    ctld.wait_node_idle("hc1", Duration::from_secs(60)).unwrap();
    wait_runs(root.path(), 1);
    assert!(is_idle(&ctld.node_state("hc1").unwrap().unwrap()));

    // A failing check drains the node with the agent's prefix and the check's name.
    fs::remove_file(root.path().join("healthy-flag")).unwrap();
    let t0 = Instant::now();
    let st = ctld
        .wait_node_state("hc1", |s| s.contains("DRAIN"), Duration::from_secs(60))
        .unwrap();
    eprintln!(
        "drained after {:?} (interval {INTERVAL_S} s): {st}",
        t0.elapsed()
    );
    let r = reason(&ctld, "hc1");
    assert!(
        r.starts_with(PREFIX) && r.contains(": check_file_test -e "),
        "{r}"
    );
    assert!(r.contains("healthy-flag"), "{r}");
    // The HealthCheckProgram's drain is the drain state machine's (issue 36): drain.json
    // and the drain metrics in its state folder have it as a `health` cause.
    let st = drain_state(root.path(), Some("health"));
    assert_eq!(st["cause"]["kind"], "health", "{st}");
    // (Slurm's reason ends with ` [root@<time>]`.)
    assert!(
        st["reason"]
            .as_str()
            .is_some_and(|x| r.starts_with(&format!("{x} ["))),
        "{st}"
    );
    let prom = slurm_e2e::read_prom(&root.path().join("state/drain.prom"));
    assert!(
        prom.contains("slurm_node_agent_drain_cause{kind=\"health\"} 1"),
        "{prom}"
    );

    // Another check is now the one failing: the agent rewrites its own reason (issue 11).
    let conf = root.path().join("nhc.conf");
    let original = fs::read_to_string(&conf).unwrap();
    fs::write(
        &conf,
        format!("{original}* || check_file_test -f /no/such/second-flag\n"),
    )
    .unwrap();
    fs::write(root.path().join("healthy-flag"), "ok").unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !reason(&ctld, "hc1").contains("second-flag") {
        assert!(
            Instant::now() < deadline,
            "reason not rewritten: {}",
            reason(&ctld, "hc1")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let r = reason(&ctld, "hc1");
    assert!(
        r.starts_with(PREFIX) && r.contains(": check_file_test -f /no/such/second-flag: "),
        "{r}"
    );
    assert!(ctld.node_state("hc1").unwrap().unwrap().contains("DRAIN"));

    // Recovery resumes it, and the state machine is back to active.
    fs::write(&conf, original).unwrap();
    ctld.wait_node_idle("hc1", Duration::from_secs(60)).unwrap();
    let st = drain_state(root.path(), None);
    assert_eq!(
        (&st["phase"], &st["cause"]),
        (&"active".into(), &serde_json::Value::Null),
        "{st}"
    );

    // An admin drain stays, healthy or not, and keeps its reason.
    ctld.scontrol_ok(&[
        "update",
        "nodename=hc1",
        "state=drain",
        "reason=ADMIN SHUTDOWN",
    ])
    .unwrap();
    wait_runs(root.path(), 2);
    let st = ctld.node_state("hc1").unwrap().unwrap();
    assert!(st.contains("DRAIN"), "{st}");
    assert!(reason(&ctld, "hc1").starts_with("ADMIN SHUTDOWN"));
    fs::remove_file(root.path().join("healthy-flag")).unwrap();
    wait_runs(root.path(), 2);
    assert!(
        reason(&ctld, "hc1").starts_with("ADMIN SHUTDOWN"),
        "{}",
        reason(&ctld, "hc1")
    );
    let log = fs::read_to_string(root.path().join("check.log")).unwrap();
    assert!(
        log.contains("already drained for another reason (ADMIN SHUTDOWN): kept"),
        "{log}"
    );
}

#[test]
fn check_for_an_unregistered_node_returns_at_once() {
    let root = TempRoot::new("health-e2e-unreg-").unwrap();
    let ctld = Slurmctld::start("hcunreg").unwrap();
    setup(root.path(), ctld.conf_path());
    fs::remove_file(root.path().join("healthy-flag")).unwrap();
    let r = root.path().display();
    let mut c = Command::new(agent_binary().unwrap());
    c.env_clear()
        .env("SLURMD_NODENAME", "not-registered-yet")
        .env("SLURM_CONF", ctld.conf_path())
        .args([
            "check".to_string(),
            format!("--config={r}/none.toml"),
            format!("--config-dir={r}/none.d"),
            format!("--checks-dir={r}/checks.d"),
            format!("--set=agent.state_dir={r}/state"),
            format!("--nhc-conf={r}/nhc.conf"),
        ]);
    let out = run_with_timeout(c, Duration::from_secs(30)).unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("action: none: node not known to slurmctld (slurmd not registered yet)"),
        "{stdout}"
    );
}

/// The Slurm under test, or `None` (a note printed) when it is older than `major.minor`.
fn slurm_at_least(major: u32, minor: u32, what: &str) -> Option<slurm_e2e::install::Version> {
    let v = slurm_e2e::install::version().unwrap();
    if v.at_least(major, minor) {
        return Some(v);
    }
    eprintln!(
        "skipped: {what} needs Slurm {major}.{minor:02} or later; the Slurm under test is {v} \
         ({}={})",
        slurm_e2e::install::PREFIX_ENV,
        slurm_e2e::install::prefix().display()
    );
    None
}

/// Checks that pass while `root/healthy-flag` exists, and a wrapper at `root/health-check`
/// that runs `slurm-node-agent-healthcheck` with `args` (settings, state folder) and the
/// controller's `conf`, appending its report to `root/check.log`. The wrapper's path goes
/// into slurm.conf before the controller starts; the file is written here, before slurmd
/// starts (slurmd runs the program only from then on).
fn health_program(root: &Path, conf: &Path, args: &[String]) {
    let flag = root.join("healthy-flag");
    fs::create_dir_all(root.join("checks.d")).unwrap();
    fs::write(
        root.join("nhc.conf"),
        format!("* || check_file_test -e {}\n", flag.display()),
    )
    .unwrap();
    let r = root.display();
    let wrapper = root.join("health-check");
    fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\n\
             SLURM_CONF={conf} exec {agent} {args} --checks-dir={r}/checks.d \
             --nhc-conf={r}/nhc.conf >> {r}/check.log 2>&1\n",
            conf = conf.display(),
            agent = healthcheck_binary().unwrap().display(),
            args = args.join(" "),
        ),
    )
    .unwrap();
    fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).unwrap();
}

fn set_healthy(root: &Path, healthy: bool) {
    let flag = root.join("healthy-flag");
    if healthy {
        fs::write(&flag, "ok").unwrap();
    } else if flag.exists() {
        fs::remove_file(&flag).unwrap();
    }
}

fn check_log(root: &Path) -> String {
    fs::read_to_string(root.join("check.log")).unwrap_or_default()
}

/// A job cannot start on `node`: `srun --immediate` is refused at once for a drained node.
fn assert_takes_no_jobs(ctld: &Slurmctld, node: &str) {
    let out = ctld
        .run_job("srun", &["-w", node, "--immediate=10", "--time=1", "true"])
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a job ran on {node}: {stderr}");
    assert!(
        stderr.contains("Required node not available"),
        "srun on {node}: {stderr}"
    );
    let st = ctld.scontrol_ok(&["show", "node", "-o", node]).unwrap();
    assert_eq!(slurm_e2e::slurm::field(&st, "CPUAlloc"), Some("0"), "{st}");
}

/// A node whose controller runs the agent's HealthCheckProgram (a wrapper in the scratch
/// folder: healthy or not) with `HealthCheckNodeState=START_ONLY`; bootstrap not run yet.
fn start_only_node(prefix: &str, healthy: bool) -> (TempRoot, NodeEnv) {
    let scratch = TempRoot::new(prefix).unwrap();
    let wrapper = scratch.path().join("health-check");
    let env = NodeEnv::start_with(
        &[
            format!("HealthCheckProgram={}", wrapper.display()),
            "HealthCheckNodeState=START_ONLY".into(),
        ],
        "",
    )
    .unwrap();
    health_program(
        scratch.path(),
        env.ctld.conf_path(),
        &[
            format!("--config={}", env.config_path().display()),
            format!("--config-dir={}", env.config_dir().display()),
        ],
    );
    set_healthy(scratch.path(), healthy);
    (scratch, env)
}

/// HealthCheckNodeState=START_ONLY (25.11+): slurmd runs the program once, at its start,
/// before it registers, and slurmctld never asks again. On a dynamic node's first boot
/// slurmctld has no record then, so the failing run keeps its drain for bootstrap, which
/// drains the node once slurmd has registered, with its own instance id in the reason. The
/// next slurmd start, with the check passing, lifts it.
#[test]
fn start_only_failing_check_on_a_first_boot_is_drained_by_bootstrap_after_the_join() {
    if slurm_at_least(25, 11, "HealthCheckNodeState=START_ONLY").is_none() {
        return;
    }
    let (scratch, env) = start_only_node("health-start-only-", false);

    let out = env.bootstrap(&[]).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bootstrap failed:\n{stderr}");
    let r = report(&out).unwrap();
    let instance = r["instance_id"].as_str().unwrap().to_string();
    // The one run, at slurmd's start: slurmctld did not know the node yet.
    let log = check_log(scratch.path());
    assert_eq!(log.matches("action: ").count(), 1, "{log}");
    assert!(
        log.contains("action: none: node not known to slurmctld (slurmd not registered yet); the drain is kept in"),
        "{log}"
    );
    assert!(
        log.contains("slurmd: slurmd runs ")
            && log.contains(" only at its start, before it registers (START_ONLY)"),
        "{log}"
    );
    // Bootstrap drained it after the join, with its own instance id, and says so.
    let state = env.ctld.node_state(DEFAULT_NODE_NAME).unwrap().unwrap();
    assert!(state.contains("DRAIN"), "{state}");
    let drained_for = reason(&env.ctld, DEFAULT_NODE_NAME);
    assert!(
        drained_for.starts_with(&format!("{PREFIX}{instance}: check_file_test -e "))
            && drained_for.contains("healthy-flag"),
        "{drained_for}"
    );
    let drain = r["drain"].as_str().unwrap_or_default();
    assert!(
        drain.contains("drained by the agent") && drain.contains("the health checks lift it"),
        "{r}"
    );
    assert!(
        stderr.contains("health checks failed before the registration"),
        "{stderr}"
    );
    assert!(!env.state_dir().join("health-pending.json").exists());
    assert_takes_no_jobs(&env.ctld, DEFAULT_NODE_NAME);
    // slurmctld never asked for another run.
    assert_eq!(check_log(scratch.path()).matches("action: ").count(), 1);

    // Fixed, then slurmd starts again: its run at the start lifts the agent's drain.
    set_healthy(scratch.path(), true);
    env.systemd
        .systemctl_ok(&["restart", "slurmd.service"])
        .unwrap();
    env.ctld
        .wait_node_idle(DEFAULT_NODE_NAME, Duration::from_secs(90))
        .unwrap_or_else(|e| panic!("{e:#}\n{}", check_log(scratch.path())));
    let log = check_log(scratch.path());
    assert!(log.contains("action: resume: checks pass again"), "{log}");
    env.ctld
        .check_reason_lifted(DEFAULT_NODE_NAME, &reason(&env.ctld, DEFAULT_NODE_NAME))
        .unwrap();
}

/// START_ONLY with the check passing: the node joins IDLE, nothing is kept for later.
#[test]
fn start_only_passing_check_on_a_first_boot_leaves_the_node_idle() {
    if slurm_at_least(25, 11, "HealthCheckNodeState=START_ONLY").is_none() {
        return;
    }
    let (scratch, env) = start_only_node("health-start-only-ok-", true);
    let out = env.bootstrap(&[]).unwrap();
    assert!(
        out.status.success(),
        "bootstrap failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = report(&out).unwrap();
    assert!(r["drain"].is_null(), "{r}");
    let log = check_log(scratch.path());
    assert_eq!(log.matches("action: ").count(), 1, "{log}");
    assert!(
        log.contains("action: none: node not known to slurmctld"),
        "{log}"
    );
    assert!(!log.contains("kept in"), "{log}");
    assert!(!env.state_dir().join("health-pending.json").exists());
    let state = env.ctld.node_state(DEFAULT_NODE_NAME).unwrap().unwrap();
    assert!(is_idle(&state), "{state}");
    assert!(env.srun_hostname(DEFAULT_NODE_NAME).is_ok());
}

/// START_ONLY where slurmctld has a record before the registration: a pre-declared node's
/// (`UNKNOWN` until its first registration) and a stale one left by an earlier slurmd of a
/// dynamic node (a replacement). The run at slurmd's start drains the record itself, and
/// slurmctld keeps the DRAIN flag through the registration: nothing is left for later.
#[test]
fn start_only_failing_check_drains_an_existing_record_before_the_registration() {
    if slurm_at_least(25, 11, "HealthCheckNodeState=START_ONLY").is_none() {
        return;
    }
    let host = slurm_e2e::slurm::short_hostname().unwrap();
    for kind in ["pre-declared", "stale dynamic"] {
        let root = TempRoot::new("health-start-only-rec-").unwrap();
        let wrapper = root.path().join("health-check");
        let mut b = Slurmctld::builder("hcrec")
            .line(format!("HealthCheckProgram={}", wrapper.display()))
            .line("HealthCheckNodeState=START_ONLY");
        if kind == "pre-declared" {
            b = b.line(format!(
                "NodeName=hs1 NodeHostname={host} NodeAddr=127.0.0.1 CPUs=1 RealMemory=100"
            ));
        }
        let ctld = b.start().unwrap();
        let r = root.path().display().to_string();
        fs::create_dir_all(root.path().join("state")).unwrap();
        fs::create_dir_all(root.path().join("none.d")).unwrap();
        fs::write(
            root.path().join("none.toml"),
            format!(
                "[slurm]\nbin_dir = \"{}\"\n",
                slurm_e2e::install::bin_dir().display()
            ),
        )
        .unwrap();
        health_program(
            root.path(),
            ctld.conf_path(),
            &[
                format!("--config={r}/none.toml"),
                format!("--config-dir={r}/none.d"),
                format!("--set=agent.state_dir={r}/state"),
            ],
        );
        let node_kind = if kind == "pre-declared" {
            let st = ctld.node_state("hs1").unwrap().unwrap();
            assert!(st.starts_with("UNKNOWN"), "{kind}: {st}");
            NodeKind::Static
        } else {
            // An earlier instance's slurmd registered the record, healthy, then went away.
            set_healthy(root.path(), true);
            let kind = NodeKind::Dynamic("CPUs=1 RealMemory=100".into());
            let mut first = Slurmd::spawn(&ctld, "hs1", &kind, &[]).unwrap();
            ctld.wait_node_idle("hs1", Duration::from_secs(60)).unwrap();
            first.daemon().stop().unwrap();
            kind
        };
        let runs_before = check_log(root.path()).matches("action: ").count();
        set_healthy(root.path(), false);
        let _node = Slurmd::spawn(&ctld, "hs1", &node_kind, &[]).unwrap();
        let st = ctld
            .wait_node_state(
                "hs1",
                |s| s.contains("DRAIN") && !s.contains('*') && !s.contains("NOT_RESPONDING"),
                Duration::from_secs(90),
            )
            .unwrap_or_else(|e| panic!("{kind}: {e:#}\n{}", check_log(root.path())));
        // Drained by the run itself (before the registration), not later. slurmctld shows
        // the drain as soon as the program's scontrol call returns, before the program has
        // saved its state and printed its report: wait for the report.
        let _ = slurm_e2e::wait_until(
            "the health check program's report",
            Duration::from_secs(60),
            Duration::from_millis(100),
            || Ok((check_log(root.path()).matches("action: ").count() > runs_before).then_some(())),
        );
        let log = check_log(root.path());
        assert_eq!(
            log.matches("action: ").count(),
            runs_before + 1,
            "{kind}: {log}"
        );
        assert!(
            log.contains("action: drain: slurm-node-agent/health@"),
            "{kind}: {log}"
        );
        let drained_for = reason(&ctld, "hs1");
        assert!(
            drained_for.starts_with(PREFIX) && drained_for.contains(": check_file_test -e "),
            "{kind}: {st} {drained_for}"
        );
        assert!(
            !root.path().join("state/health-pending.json").exists(),
            "{kind}"
        );
        assert_takes_no_jobs(&ctld, "hs1");
    }
}

/// HealthCheckNodeState=REBOOT_ONLY (26.05+): slurmd does not run the program at its
/// start; slurmctld asks for one run when a node it rebooted (`scontrol reboot`) registers
/// again, after that registration. A failing run there drains the node; a passing one after
/// the next reboot lifts the agent's drain; a passing one leaves the node IDLE. Skipped,
/// with a note, on older Slurm (25.11 ignores the word).
#[test]
fn reboot_only_runs_after_scontrol_reboot_and_drains_or_leaves_idle() {
    if slurm_at_least(26, 5, "HealthCheckNodeState=REBOOT_ONLY").is_none() {
        return;
    }
    let root = TempRoot::new("health-reboot-only-").unwrap();
    let wrapper = root.path().join("health-check");
    let rebooted = root.path().join("rebooted");
    let reboot = root.path().join("reboot.sh");
    fs::write(
        &reboot,
        format!(
            "#!/bin/sh\necho \"$(date +%s)\" >> {}\n",
            rebooted.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&reboot, fs::Permissions::from_mode(0o755)).unwrap();
    let ctld = Slurmctld::builder("hcreboot")
        .line(format!("HealthCheckProgram={}", wrapper.display()))
        .line("HealthCheckNodeState=REBOOT_ONLY")
        .line(format!("RebootProgram={}", reboot.display()))
        .start()
        .unwrap();
    let r = root.path().display().to_string();
    fs::create_dir_all(root.path().join("state")).unwrap();
    fs::create_dir_all(root.path().join("none.d")).unwrap();
    fs::write(
        root.path().join("none.toml"),
        format!(
            "[slurm]\nbin_dir = \"{}\"\n",
            slurm_e2e::install::bin_dir().display()
        ),
    )
    .unwrap();
    health_program(
        root.path(),
        ctld.conf_path(),
        &[
            format!("--config={r}/none.toml"),
            format!("--config-dir={r}/none.d"),
            format!("--set=agent.state_dir={r}/state"),
        ],
    );
    set_healthy(root.path(), false);
    let kind = NodeKind::Dynamic("CPUs=1 RealMemory=100".into());
    let mut node = Some(Slurmd::spawn(&ctld, "hr1", &kind, &[]).unwrap());
    ctld.wait_node_idle("hr1", Duration::from_secs(60)).unwrap();
    // No run at slurmd's start (it would come before the registration), failing check or not.
    assert_eq!(check_log(root.path()), "");

    // One reboot: the node comes back (slurmd -b), slurmctld asks for one run.
    let mut reboots = 0;
    let mut reboot_once = |node: &mut Option<Slurmd>| {
        reboots += 1;
        let runs = check_log(root.path()).matches("action: ").count();
        ctld.scontrol_ok(&["reboot", "hr1"]).unwrap();
        wait_until(
            "RebootProgram",
            Duration::from_secs(90),
            Duration::from_millis(100),
            || {
                Ok((fs::read_to_string(&rebooted)
                    .unwrap_or_default()
                    .lines()
                    .count()
                    >= reboots)
                    .then_some(()))
            },
        )
        .unwrap();
        drop(node.take());
        *node = Some(Slurmd::spawn(&ctld, "hr1", &kind, &["-b"]).unwrap());
        wait_until(
            "the run after the reboot",
            Duration::from_secs(90),
            Duration::from_millis(100),
            || Ok((check_log(root.path()).matches("action: ").count() > runs).then_some(())),
        )
        .unwrap_or_else(|e| panic!("{e:#}\n{}", check_log(root.path())));
    };

    // Passing: IDLE.
    set_healthy(root.path(), true);
    reboot_once(&mut node);
    ctld.wait_node_idle("hr1", Duration::from_secs(90)).unwrap();
    let log = check_log(root.path());
    assert!(log.contains("(REBOOT_ONLY)"), "{log}");

    // Failing: drained with the agent's reason, takes no jobs.
    set_healthy(root.path(), false);
    reboot_once(&mut node);
    ctld.wait_node_state(
        "hr1",
        |s| s.contains("DRAIN") && !s.contains("REBOOT") && !s.contains('*'),
        Duration::from_secs(90),
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", check_log(root.path())));
    let reason_now = reason(&ctld, "hr1");
    assert!(
        reason_now.starts_with(PREFIX) && reason_now.contains(": check_file_test -e "),
        "{reason_now}"
    );
    assert_takes_no_jobs(&ctld, "hr1");

    // Passing after the next reboot: the agent's drain is lifted.
    set_healthy(root.path(), true);
    reboot_once(&mut node);
    ctld.wait_node_idle("hr1", Duration::from_secs(90))
        .unwrap_or_else(|e| panic!("{e:#}\n{}", check_log(root.path())));
    ctld.check_reason_lifted("hr1", &reason(&ctld, "hr1"))
        .unwrap();
}
