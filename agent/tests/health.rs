//! Health checks end to end on this machine, without Slurm: the checks engine through its
//! library API, and `slurm-node-agent check` as Slurm runs it (no PATH, only
//! `SLURMD_NODENAME`). Bad inputs from issue 6 each have a test here; mounts are in
//! `health_mounts.rs`, Slurm in `tests/tests/health.rs`.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use slurm_node_agent::health::{self, nhc, CheckSet, RunEnv, Status};

fn nhc_checks(text: &str) -> CheckSet {
    nhc::parse(
        text,
        Path::new("/test/nhc.conf"),
        Some("node1"),
        &nhc::Defaults {
            timeout: Duration::from_secs(10),
            slurm_bin_dir: std::path::PathBuf::new(),
        },
    )
    .unwrap()
}

async fn run(text: &str) -> health::Report {
    health::run_checks(&nhc_checks(text), &RunEnv::default()).await
}

/// State of a process: `Some('Z')` for a zombie, `None` when it is gone.
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.trim().chars().next()
}

#[tokio::test]
async fn bench_set_passes_on_this_machine_with_munged() {
    // The benchmark set needs munged (check_ps_service -S munged): skip that line when
    // no munged runs here, the rest must pass.
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/health/nhc-21.conf"
    ))
    .unwrap();
    let munged = std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == "munged")
    });
    let text: String = text
        .lines()
        .filter(|l| munged || !l.contains("munged"))
        .map(|l| format!("{l}\n"))
        .collect();
    let r = run(&text).await;
    for res in &r.results {
        assert_eq!(res.status, Status::Pass, "{res:?}");
    }
    assert_eq!(r.results.len(), if munged { 21 } else { 20 });
}

#[tokio::test]
async fn hanging_command_is_killed_with_its_children_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("child.pid");
    let text = format!(
        "* || check_cmd_status -t 1 /bin/sh -c 'sleep 1000 & echo $! > {}; wait'\n",
        pidfile.display()
    );
    let start = Instant::now();
    let r = run(&text).await;
    let elapsed = start.elapsed();
    let res = &r.results[0];
    assert_eq!(res.status, Status::Timeout, "{res:?}");
    assert!(res.message.contains("/bin/sh"), "{}", res.message);
    assert!(res.message.contains("killed"), "{}", res.message);
    assert!(elapsed < Duration::from_secs(30), "took {elapsed:?}");
    let child: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The grandchild (sleep) was in the command's process group: it is gone, or a zombie
    // waiting for its new parent to reap it; never still sleeping.
    let mut st = proc_state(child);
    for _ in 0..100 {
        if matches!(st, None | Some('Z')) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        st = proc_state(child);
    }
    assert!(matches!(st, None | Some('Z')), "child {child} state {st:?}");
    // The report names the check.
    let reason = r.drain_reason("unknown").unwrap();
    assert!(
        reason.starts_with("slurm-node-agent/health@unknown: check_cmd_status -t 1 /bin/sh"),
        "{reason}"
    );
}

#[tokio::test]
async fn a_grandchild_that_left_the_process_group_is_killed_with_the_cgroup() {
    // `setsid` puts the sleeper in a session and process group of its own: a process
    // group kill misses it, the command's cgroup does not.
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("escaped.pid");
    let script = dir.path().join("escape.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nsetsid sleep 1000 </dev/null >/dev/null 2>&1 &\necho $! > {}\nwait\n",
            pidfile.display()
        ),
    )
    .unwrap();
    let mut perm = std::fs::metadata(&script).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
    std::fs::set_permissions(&script, perm).unwrap();
    let r = run(&format!(
        "* || check_cmd_status -t 2 {}\n",
        script.display()
    ))
    .await;
    let res = &r.results[0];
    assert_eq!(res.status, Status::Timeout, "{res:?}");
    assert!(
        res.message.contains("killed with its cgroup"),
        "{}",
        res.message
    );
    let escaped: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let sid = |pid: u32| -> Option<String> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit(')')
            .next()?
            .split_whitespace()
            .nth(3)
            .map(str::to_string)
    };
    let mut st = proc_state(escaped);
    for _ in 0..250 {
        if matches!(st, None | Some('Z')) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        st = proc_state(escaped);
    }
    assert!(
        matches!(st, None | Some('Z')),
        "escaped {escaped} (session {:?}) state {st:?}",
        sid(escaped)
    );
}

#[tokio::test]
async fn run_deadline_ends_a_run_of_hung_commands_and_names_them() {
    // Six commands that would each run 100 s, under a 2 s run deadline: all six are found
    // hung at the deadline (they ran at the same time) and killed.
    let mut text = String::new();
    for n in 1..=6 {
        text.push_str(&format!("* || check_cmd_status -t 100 sleep 10{n}\n"));
    }
    let env = RunEnv {
        run_deadline: Duration::from_secs(2),
        ..RunEnv::default()
    };
    let r = health::run_checks(&nhc_checks(&text), &env).await;
    for res in &r.results {
        assert_eq!(res.status, Status::Timeout, "{res:?}");
        assert!(res.message.contains("run deadline (2s"), "{res:?}");
    }
    assert_eq!(r.results.len(), 6);
    let reason = r.drain_reason("unknown").unwrap();
    assert!(
        reason.starts_with(
            "slurm-node-agent/health@unknown: check_cmd_status -t 100 sleep 101: hung"
        ),
        "{reason}"
    );
    // No `sleep 10N` is left.
    let left = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("cmdline")).ok())
            .filter(|c| c.starts_with("sleep\u{0}10") && c.len() == "sleep\u{0}101\u{0}".len())
            .count()
    };
    let mut n = left();
    for _ in 0..250 {
        if n == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        n = left();
    }
    assert_eq!(n, 0, "sleep commands left running");
}

#[tokio::test]
async fn a_bare_command_name_is_resolved_and_shown() {
    let r = run("* || check_cmd_status true\n").await;
    let res = &r.results[0];
    assert_eq!(res.status, Status::Pass, "{res:?}");
    assert!(
        res.message.contains("(/usr/bin/true)") || res.message.contains("(/bin/true)"),
        "{}",
        res.message
    );
}

#[tokio::test]
async fn command_printing_megabytes_is_bounded() {
    // 8 MiB on stdout; the match is on the first line, kept within the bound.
    let text = "* || check_cmd_output -t 20 -m '/^x+$/' /bin/sh -c 'head -c 8388608 /dev/zero | tr \"\\\\000\" x; echo'\n";
    let set = nhc_checks(text);
    let env = RunEnv {
        output_limit: 64 * 1024,
        ..RunEnv::default()
    };
    let r = health::run_checks(&set, &env).await;
    let res = &r.results[0];
    assert_eq!(res.status, Status::Pass, "{res:?}");
    assert!(
        res.message
            .contains("output 8388609 bytes, kept its first and last lines"),
        "{}",
        res.message
    );
    // The newest lines are seen past the bound (dmesg's last messages); a line in the
    // middle is not, and the failure says the output was cut.
    let text = "* || check_cmd_output -t 20 -m '/^end$/' /bin/sh -c 'head -c 1048576 /dev/zero; echo; echo end'\n";
    let r = health::run_checks(&nhc_checks(text), &env).await;
    assert_eq!(r.results[0].status, Status::Pass, "{:?}", r.results[0]);
    let text = "* || check_cmd_output -t 20 -m '/^middle$/' /bin/sh -c 'head -c 1048576 /dev/zero; echo; echo middle; head -c 1048576 /dev/zero; echo'\n";
    let r = health::run_checks(&nhc_checks(text), &env).await;
    assert_eq!(r.results[0].status, Status::Fail);
    assert!(
        r.results[0]
            .message
            .contains("cut to its first and last lines"),
        "{}",
        r.results[0].message
    );
}

#[tokio::test]
async fn failures_fail_and_warnings_do_not_drain() {
    let r = run("* || check_file_test -e /no/such/file\n\
         * || check_cmd_status -r 3 /bin/false\n\
         * || check_cmd_output -m '/Plan9/' /bin/uname -s\n\
         * || check_fs_mount -0 -f /proc/no-such-mount\n\
         * || check_ps_blacklist xyzzy-cryptominer\n")
    .await;
    let st: Vec<(Status, bool)> = r.results.iter().map(|x| (x.status, x.fatal)).collect();
    assert_eq!(
        st,
        vec![
            (Status::Fail, true),
            (Status::Fail, true),
            (Status::Fail, true),
            (Status::Fail, false),
            (Status::Pass, true),
        ],
        "{:#?}",
        r.results
    );
    assert_eq!(r.failures().count(), 3);
    assert!(r.drain_reason("p: ").unwrap().ends_with("(+2 more)"));
    let warn_only = run("* || check_fs_mount -0 -f /proc/no-such-mount\n").await;
    assert!(warn_only.healthy());
}

fn agent() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_slurm-node-agent"));
    // As slurmd runs HealthCheckProgram: no PATH, no SLURM_CONF, only SLURMD_NODENAME.
    c.env_clear().env("SLURMD_NODENAME", "node1");
    c
}

struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Files {
        Files {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        p
    }
    fn args(&self) -> Vec<String> {
        // Settings paths given explicitly must exist: an empty file and folder.
        std::fs::write(self.dir.path().join("none.toml"), "").unwrap();
        std::fs::create_dir_all(self.dir.path().join("none.d")).unwrap();
        std::fs::create_dir_all(self.dir.path().join("checks.d")).unwrap();
        let d = self.dir.path().display();
        vec![
            "check".into(),
            format!("--config={d}/none.toml"),
            format!("--config-dir={d}/none.d"),
            format!("--checks-dir={d}/checks.d"),
            format!("--set=agent.state_dir={d}/state"),
        ]
    }
}

#[test]
fn check_command_runs_without_path_and_prints_json_and_prometheus() {
    let f = Files::new();
    let conf = f.write(
        "nhc.conf",
        "* || check_cmd_output -m '/Linux/' uname -s\nnode1 || check_file_test -r /etc/passwd\nother || check_file_test -r /nope\n",
    );
    f.write(
        "checks.d/10-a.toml",
        "[[check]]\nkind = \"mount\"\npath = \"/\"\nname = \"root fs\"\n",
    );
    let prom = f.dir.path().join("agent.prom");
    let out = agent()
        .args(f.args())
        .arg(format!("--nhc-conf={}", conf.display()))
        .arg(format!("--prometheus-textfile={}", prom.display()))
        .args(["--output", "json", "--no-act"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["node"], "node1");
    assert_eq!(v["healthy"], true);
    assert!(v["duration_ms"].is_u64(), "{v}");
    let checks = v["checks"].as_array().unwrap();
    let names: Vec<&str> = checks.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        vec![
            "root fs",
            "check_cmd_output -m '/Linux/' uname -s",
            "check_file_test -r /etc/passwd"
        ]
    );
    for c in checks {
        assert!(c["duration_ms"].is_u64(), "{c}");
        assert_eq!(c["status"], "pass");
    }
    let p = std::fs::read_to_string(&prom).unwrap();
    assert!(
        p.contains("slurm_node_agent_health_check_ok{node=\"node1\",check=\"root fs\""),
        "{p}"
    );
}

#[test]
fn bad_nhc_lines_fail_on_their_own_and_every_other_line_runs() {
    // Issue 11 section 2: one bad line must not switch health checking off.
    let f = Files::new();
    let conf = f.write(
        "nhc.conf",
        "# site checks\n* || check_fs_free / 1%\n* || check_fs_free /\n\
         NVIDIA_HEALTHMON=dcgmi\ngpu* || check_nv_magic\n* || check_moab_torque\n\
         * || check_file_test -e /no/such/file\n",
    );
    let out = agent()
        .args(f.args())
        .arg(format!("--nhc-conf={}", conf.display()))
        .args(["--output", "json", "--no-act"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let checks = v["checks"].as_array().unwrap();
    let summary: Vec<(&str, &str)> = checks
        .iter()
        .map(|c| {
            (
                c["status"].as_str().unwrap(),
                c["message"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(checks.len(), 4, "{summary:?}");
    assert_eq!(summary[0].0, "pass", "{summary:?}");
    assert_eq!(summary[1].0, "fail");
    assert!(
        summary[1].1.starts_with(&format!(
            "{}:3: check_fs_free: missing threshold",
            conf.display()
        )),
        "{summary:?}"
    );
    assert!(
        summary[2]
            .1
            .contains(":6: check_moab_torque: unsupported NHC check"),
        "{summary:?}"
    );
    // The real failure on the same node is still found.
    assert_eq!(summary[3].0, "fail");
    assert!(summary[3].1.contains("/no/such/file"), "{summary:?}");
    let notes = v["notes"].to_string();
    assert!(notes.contains(":4: skipped: no '||'"), "{notes}");
    assert!(notes.contains(":5: not for this node"), "{notes}");
}

#[test]
fn malformed_checks_file_is_a_failing_check_naming_file_and_line() {
    let f = Files::new();
    let bad = f.write(
        "checks.d/20-bad.toml",
        "[[check]]\nkind = \"mount\"\npath = \"/\"\n\n[[check]]\nkind = \"mount\"\npath = \"/x\"\nmin_free = \"ten percent\"\n",
    );
    f.write(
        "checks.d/10-ok.toml",
        "[[check]]\nkind = \"efa\"\ncount = 0\n",
    );
    // Fail closed, file by file: the bad file is a failing check naming its file and line,
    // and the good file's check still runs.
    let out = agent().args(f.args()).arg("--no-act").output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let fail = stdout
        .lines()
        .find(|l| l.starts_with("FAIL"))
        .unwrap_or_default();
    assert!(fail.contains("20-bad.toml"), "{stdout}");
    assert!(
        stdout.contains(&format!("{}:5:", bad.display())),
        "{stdout}"
    );
    assert!(stdout.contains("invalid size \"ten percent\""), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("PASS") && l.contains("10-ok.toml")),
        "{stdout}"
    );
    // An nhc.conf named by the settings that cannot be read fails closed the same way.
    let missing = f.dir.path().join("missing-nhc.conf");
    let out = agent()
        .args(f.args())
        .arg(format!("--set=health.nhc_conf={}", missing.display()))
        .arg("--no-act")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("FAIL") && l.contains("missing-nhc.conf")),
        "{stdout}"
    );
}

#[test]
fn failing_check_exits_1_and_does_not_need_a_controller_with_no_act() {
    let f = Files::new();
    let conf = f.write("nhc.conf", "* || check_file_test -e /no/such/file\n");
    let out = agent()
        .args(f.args())
        .arg(format!("--nhc-conf={}", conf.display()))
        .arg("--no-act")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("FAIL") && stdout.contains("/no/such/file"),
        "{stdout}"
    );
}

/// `--no-act` only reports: a corrupt bootstrap record in the state folder is named as
/// corrupt on stderr and left as it is, nothing set aside.
#[test]
fn no_act_reports_a_corrupt_bootstrap_record_and_leaves_it() {
    let f = Files::new();
    let conf = f.write("nhc.conf", "* || check_file_test -r /etc/passwd\n");
    let record = f.write("state/bootstrap.json", "{\"node_name\": \"node1\", \"inst");
    let out = agent()
        .args(f.args())
        .arg(format!("--nhc-conf={}", conf.display()))
        .arg("--no-act")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("CORRUPT STATE FILE: invalid bootstrap record")
            && stderr.contains(&record.display().to_string())
            && stderr.contains("left in place"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(&record).unwrap(),
        "{\"node_name\": \"node1\", \"inst"
    );
    let names: Vec<String> = std::fs::read_dir(record.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["bootstrap.json".to_string()]);
}

#[test]
fn explicit_checks_dir_and_nhc_conf_that_do_not_exist_are_errors() {
    let f = Files::new();
    for extra in [
        format!("--checks-dir={}/nope.d", f.dir.path().display()),
        format!("--nhc-conf={}/nope.conf", f.dir.path().display()),
    ] {
        let mut args = f.args();
        args.retain(|a| !a.starts_with("--checks-dir") || extra.starts_with("--nhc"));
        let out = agent().args(&args).arg(&extra).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{extra}: {stderr}");
        assert!(
            stderr.contains("nope") && stderr.contains("must exist"),
            "{stderr}"
        );
    }
}

#[test]
fn a_latin1_byte_in_nhc_conf_does_not_switch_checking_off() {
    let f = Files::new();
    let conf = f.dir.path().join("latin1.conf");
    // "# caf\xe9" in Latin-1, then a check that fails.
    let mut text = b"# caf\xe9 machines\n".to_vec();
    text.extend_from_slice(b"* || check_file_test -e /no/such/file\n");
    std::fs::write(&conf, text).unwrap();
    let out = agent()
        .args(f.args())
        .arg(format!("--nhc-conf={}", conf.display()))
        .arg("--no-act")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The checks ran (and the failing one failed), not exit 78 for the whole file.
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stdout.contains("/no/such/file"), "{stdout}");
    assert!(
        stderr.contains("latin1.conf:1: not valid UTF-8"),
        "{stderr}"
    );
}

/// Slurm's HealthCheckProgram, `slurm-node-agent-healthcheck`: the same options, output and
/// exit codes as `slurm-node-agent check` (it is the same code in a smaller program).
#[test]
fn healthcheck_program_answers_as_check_does() {
    fn healthcheck() -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_slurm-node-agent-healthcheck"));
        c.env_clear().env("SLURMD_NODENAME", "node1");
        c
    }
    // Times differ from run to run: "0.03 ms" becomes "_ ms", JSON's numbers "_".
    fn text(out: &[u8]) -> String {
        let re = regex::Regex::new(r#"\d+\.\d+ ms|"(duration_ms|started_unix)":[\d.]+"#).unwrap();
        re.replace_all(&String::from_utf8_lossy(out), "_")
            .into_owned()
    }
    let f = Files::new();
    let pass = f.write("pass.conf", "* || check_file_test -r /etc/passwd\n");
    let fail = f.write(
        "fail.conf",
        "* || check_file_test -r /etc/passwd\n* || check_file_test -f /no/such/flag\n",
    );
    let bad_line = f.write("bad.conf", "* || check_no_such_function\n");
    f.write("bad.d/10-bad.toml", "[[check]]\nkind = \"mount\"\n");
    let d = f.dir.path().display().to_string();
    let cases: Vec<(Vec<String>, i32)> = vec![
        (vec![format!("--nhc-conf={}", pass.display())], 0),
        (
            vec![format!("--nhc-conf={}", fail.display()), "--no-act".into()],
            1,
        ),
        (
            vec![
                format!("--nhc-conf={}", bad_line.display()),
                "--no-act".into(),
                "--output=json".into(),
            ],
            1,
        ),
        // A malformed check file (a mount without its path): a failing check of its own.
        (
            vec![
                format!("--nhc-conf={}", pass.display()),
                format!("--checks-dir={d}/bad.d"),
                "--no-act".into(),
            ],
            1,
        ),
        // Invalid settings: 78.
        (vec!["--set=health.timeout=soon".into()], 78),
        // A usage error as a JSON line when JSON logs are asked for.
        (
            vec!["--log-format=json".into(), "--no-such-option".into()],
            2,
        ),
        (vec![format!("--nhc-conf={d}/no-such.conf")], 78),
        (vec!["--no-such-option".into()], 2),
    ];
    for (extra, code) in cases {
        // The common arguments without the leading "check".
        let mut args: Vec<String> = f.args()[1..].to_vec();
        if extra.iter().any(|a| a.starts_with("--checks-dir")) {
            args.retain(|a| !a.starts_with("--checks-dir"));
        }
        args.extend(extra.iter().cloned());
        let by_check = agent().arg("check").args(&args).output().unwrap();
        let by_program = healthcheck().args(&args).output().unwrap();
        assert_eq!(
            by_program.status.code(),
            Some(code),
            "{extra:?}: {by_program:?}"
        );
        assert_eq!(
            by_check.status.code(),
            Some(code),
            "{extra:?}: {by_check:?}"
        );
        if code == 2 {
            // clap's usage error names the program it came from.
            assert!(
                text(&by_program.stderr).contains("slurm-node-agent-healthcheck"),
                "{by_program:?}"
            );
            if extra.iter().any(|a| a == "--log-format=json") {
                for out in [&by_program, &by_check] {
                    let line = String::from_utf8_lossy(&out.stderr);
                    let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
                    assert_eq!(v["level"], "ERROR", "{line}");
                }
            }
            continue;
        }
        assert_eq!(
            text(&by_program.stdout),
            text(&by_check.stdout),
            "{extra:?}: stdout differs"
        );
        // The same lines, but each program's own error lines name it.
        let (program_err, check_err) = (text(&by_program.stderr), text(&by_check.stderr));
        assert!(
            !program_err.contains("slurm-node-agent: "),
            "{extra:?}: {program_err}"
        );
        if code == 78 {
            assert!(
                program_err.starts_with("slurm-node-agent-healthcheck: error: ")
                    && check_err.starts_with("slurm-node-agent: error: "),
                "{extra:?}: {program_err}\n{check_err}"
            );
        }
        assert_eq!(
            program_err.replace("slurm-node-agent-healthcheck: ", "slurm-node-agent: "),
            check_err,
            "{extra:?}: stderr differs"
        );
    }
    // SLURMD_NODENAME that is not a NodeName: refused by both (78), naming the variable.
    for mut cmd in [agent(), healthcheck()] {
        if cmd
            .get_program()
            .to_string_lossy()
            .ends_with("slurm-node-agent")
        {
            cmd.arg("check");
        }
        let out = cmd
            .args(&f.args()[1..])
            .arg(format!("--nhc-conf={}", pass.display()))
            .env("SLURMD_NODENAME", "node1 State=RESUME")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(78), "{out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("SLURMD_NODENAME"),
            "{out:?}"
        );
    }
}

/// `export PATH="/opt/bin:$PATH"` in nhc.conf: later commands given by bare name are found
/// there, as bash finds them for NHC; without it the same line fails naming the safe PATH.
#[test]
fn an_exported_path_finds_commands_named_by_bare_name() {
    use std::os::unix::fs::PermissionsExt;
    let f = Files::new();
    let tool = f.write("opt-bin/site-tool", "#!/bin/sh\nexit 0\n");
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = tool.parent().unwrap().display().to_string();
    let with = f.write(
        "with.conf",
        &format!("* || export PATH=\"{bin}:$PATH\"\n* || check_cmd_status -r 0 site-tool\n"),
    );
    let without = f.write("without.conf", "* || check_cmd_status -r 0 site-tool\n");
    let run = |conf: &Path| {
        agent()
            .args(f.args())
            .arg(format!("--nhc-conf={}", conf.display()))
            .arg("--no-act")
            .output()
            .unwrap()
    };
    let out = run(&with);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = run(&without);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("site-tool"),
        "{out:?}"
    );
}

/// The warning about slurmd killing its HealthCheckProgram reads slurm.conf's
/// `HealthCheckTimeout` (Slurm 26.05+) where the node's slurm.conf sets one, else 60 s.
#[test]
fn the_slurmd_limit_warning_reads_health_check_timeout() {
    let f = Files::new();
    let conf = f.write("nhc.conf", "* || check_file_test -r /etc/passwd\n");
    let run = |slurm_conf: &Path| {
        let out = agent()
            .args(f.args())
            .arg(format!("--nhc-conf={}", conf.display()))
            // Acting (not --no-act) is what the warning is about; the node is unknown to
            // any slurmctld here, so nothing is changed.
            .env("SLURM_CONF", slurm_conf)
            .env("SLURMD_NODENAME", "node1")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    // run_deadline 30 s + 3 x scontrol_timeout 5 s (show, drain lock, update) = 45 s: under
    // 60 s, over 20 s.
    let with = f.write("slurm.conf", "ClusterName=c\nHealthCheckTimeout=20\n");
    let err = run(&with);
    assert!(
        err.contains("kills its HealthCheckProgram after 20 s")
            && err.contains("HealthCheckTimeout=20"),
        "{err}"
    );
    let without = f.write("slurm-old.conf", "ClusterName=c\n");
    let err = run(&without);
    assert!(!err.contains("kills its HealthCheckProgram"), "{err}");
}

/// The report says how slurmd runs the HealthCheckProgram, from the node's slurm.conf and,
/// where the release changes it, slurmd's version (`<bin_dir>/../sbin/slurmd -V`): 24.11
/// ignores START_ONLY, 25.11 has it, 26.05 has REBOOT_ONLY and refuses combinations.
#[test]
fn the_report_says_how_slurmd_runs_the_program() {
    use std::os::unix::fs::PermissionsExt;
    let f = Files::new();
    let conf = f.write("nhc.conf", "* || check_file_test -r /etc/passwd\n");
    let slurmd = f.write("slurm/sbin/slurmd", "");
    std::fs::set_permissions(&slurmd, std::fs::Permissions::from_mode(0o755)).unwrap();
    f.write("slurm/bin/.keep", "");
    let bin_dir = f.dir.path().join("slurm/bin");
    let run = |version: &str, lines: &str| {
        std::fs::write(&slurmd, format!("#!/bin/sh\necho 'slurm {version}'\n")).unwrap();
        let slurm_conf = f.write(
            "slurm.conf",
            &format!("ClusterName=c\nHealthCheckProgram=/usr/local/bin/slurm-node-agent-healthcheck\n{lines}"),
        );
        let out = agent()
            .args(f.args())
            .arg(format!("--nhc-conf={}", conf.display()))
            .arg(format!("--set=slurm.bin_dir={}", bin_dir.display()))
            .args(["--no-act", "--output", "json"])
            .env("SLURM_CONF", &slurm_conf)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["slurmd"].clone()
    };
    let s = run("25.11.6", "HealthCheckNodeState=START_ONLY\n");
    assert_eq!(s["runs"], "start_only", "{s}");
    assert_eq!(s["slurmd_version"], "25.11.6", "{s}");
    assert!(
        s["summary"]
            .as_str()
            .unwrap()
            .contains("only at its start, before it registers"),
        "{s}"
    );
    let s = run(
        "24.11.7",
        "HealthCheckInterval=60\nHealthCheckNodeState=START_ONLY\n",
    );
    assert_eq!(s["runs"], "at_start_and_interval", "{s}");
    assert_eq!(s["ignored"], serde_json::json!(["START_ONLY"]), "{s}");
    let s = run("26.05.3", "HealthCheckNodeState=REBOOT_ONLY\n");
    assert_eq!(s["runs"], "reboot_only", "{s}");
    let s = run("26.05.3", "HealthCheckNodeState=START_ONLY,CYCLE\n");
    assert_eq!(s["runs"], "refused", "{s}");
    // No *_ONLY word: slurmd's version is not asked for.
    let s = run("26.05.3", "HealthCheckInterval=300\n");
    assert_eq!(s["runs"], "at_start_and_interval", "{s}");
    assert!(s["slurmd_version"].is_null(), "{s}");
}
