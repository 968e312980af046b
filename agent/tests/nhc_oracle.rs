//! NHC semantics (issue 11, section 3), each case run through the agent and, where LBNL
//! NHC 1.4.3 is at hand (`../shared/peers/` next to the workspace, or `SNA_NHC_TARBALL`),
//! through NHC itself on the same config line as the oracle. Every case states what NHC's
//! source does (`scripts/common.nhc`, `lbnl_dmi.nhc`, `lbnl_file.nhc`, `lbnl_ps.nhc`);
//! the agent must agree, and NHC must confirm the expectation when it can run. Without
//! NHC the agent side still runs and a line says the oracle was skipped.
//!
//! Known, deliberate differences are cases with `nhc` and `agent` expectations apart
//! (section 5: a daemon that rewrote its title).
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::time::Duration;

use slurm_node_agent::health::{self, nhc, RunEnv, Status};

/// NHC unpacked once per test process; `None` when the tarball is not there.
fn nhc_root() -> Option<&'static Path> {
    static ROOT: OnceLock<Option<PathBuf>> = OnceLock::new();
    ROOT.get_or_init(|| {
        let tarball = std::env::var_os("SNA_NHC_TARBALL")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../../shared/peers/lbnl-nhc-1.4.3-notests.tar.gz")
            });
        if !tarball.exists() {
            eprintln!(
                "NHC oracle skipped: {} not found; only the agent side runs",
                tarball.display()
            );
            return None;
        }
        let dir = tempfile::tempdir().unwrap().keep();
        let st = Command::new("tar")
            .arg("-xzf")
            .arg(&tarball)
            .arg("-C")
            .arg(&dir)
            .status()
            .unwrap();
        assert!(st.success(), "tar failed on {}", tarball.display());
        Some(dir.join("lbnl-nhc-1.4.3"))
    })
    .as_deref()
}

/// Runs NHC on `conf` as node `host`; `Some(true)` when every check passed.
fn nhc_passes(conf: &str, host: &str) -> Option<bool> {
    let root = nhc_root()?;
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("nhc.conf"), conf).unwrap();
    std::os::unix::fs::symlink(root.join("scripts"), d.path().join("scripts")).unwrap();
    let out = Command::new(root.join("nhc"))
        .arg("-D")
        .arg(d.path())
        .args([
            "-t",
            "30",
            "-l",
            "/dev/null",
            "-a",
            "MARK_OFFLINE=0",
            "NHC_RM=slurm",
        ])
        .arg(format!("HELPERDIR={}", root.join("helpers").display()))
        .arg(format!("HOSTNAME={host}"))
        .output()
        .unwrap();
    Some(out.status.success())
}

/// Runs the agent on `conf` as node `host`; whether every fatal check passed, and the
/// messages.
async fn agent_passes(conf: &str, host: &str, env: &RunEnv) -> (bool, String) {
    let set = nhc::parse(
        conf,
        Path::new("/oracle/nhc.conf"),
        Some(host),
        &nhc::Defaults {
            timeout: Duration::from_secs(10),
            slurm_bin_dir: std::path::PathBuf::new(),
        },
    )
    .unwrap();
    let r = health::run_checks(&set, env).await;
    let msgs = r
        .results
        .iter()
        .map(|x| format!("{}: {:?} {}", x.name, x.status, x.message))
        .collect::<Vec<_>>()
        .join("; ");
    // A non-fatal check (`-0`) that fails is logged, not a failure (NHC returns 0).
    (
        r.results
            .iter()
            .all(|x| x.status == Status::Pass || !x.fatal),
        msgs,
    )
}

/// One case: NHC's result (from its source) and the agent's (the same unless noted).
struct Case<'a> {
    conf: String,
    host: &'a str,
    nhc: bool,
    agent: bool,
}

fn same(conf: impl Into<String>, host: &str, pass: bool) -> Case<'_> {
    Case {
        conf: conf.into(),
        host,
        nhc: pass,
        agent: pass,
    }
}

async fn check_cases(cases: &[Case<'_>], env: &RunEnv) {
    let mut wrong = Vec::new();
    for c in cases {
        let (agent, msgs) = agent_passes(&c.conf, c.host, env).await;
        if agent != c.agent {
            wrong.push(format!(
                "agent {} on {:?} as {}, expected {}: {msgs}",
                if agent { "passes" } else { "fails" },
                c.conf,
                c.host,
                c.agent
            ));
        }
        if let Some(n) = nhc_passes(&c.conf, c.host) {
            if n != c.nhc {
                wrong.push(format!(
                    "NHC {} on {:?} as {}, expected {} (the case is wrong)",
                    if n { "passes" } else { "fails" },
                    c.conf,
                    c.host,
                    c.nhc
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "\n{}", wrong.join("\n"));
}

/// A line that fails wherever its target matches: the target applies iff the run fails.
fn target(t: &str, host: &'static str, applies: bool) -> Case<'static> {
    same(
        format!("{t} || check_file_test -e /nonexistent/oracle\n"),
        host,
        !applies,
    )
}

#[tokio::test]
async fn targets_ranges_globs_and_regexes_as_nhc() {
    check_cases(
        &[
            // mcheck_range: the width of the longer bound.
            target("{n[1-16]}", "n01", true),
            target("{n[1-16]}", "n1", false),
            target("{n[1-16]}", "n16", true),
            target("{n[1-10]}", "n05", true),
            target("{n[1-10]}", "n5", false),
            target("{n[01-16]}", "n5", false),
            target("{n[16-1]}", "n09", true),
            target("{login1,n[1-2]}", "login1", true),
            // mcheck_glob: bash [[ == ]] with extglob and POSIX classes.
            target("n[[:digit:]]*", "n1x", true),
            target("n[[:digit:]]*", "nx1", false),
            target("+(gpu|cpu)*", "gpu5", true),
            target("+(gpu|cpu)*", "cpugpu5", true),
            target("+(gpu|cpu)*", "login1", false),
            target("@(login|gpu)[0-9]", "gpu1", true),
            target("@(login|gpu)[0-9]", "cpu1", false),
            // A leading `!` is mcheck's negation before any extglob: `!(login*)` is "not
            // the glob (login*)", which no name matches.
            target("!(login*)", "login1", true),
            // mcheck_regexp: POSIX ERE. NHC's `read` drops one backslash, so the file's
            // `\\d` is the ERE `\d`, which glibc reads as a plain `d`.
            target("/^n[[:digit:]]+$/", "n5", true),
            target("/^n\\\\d+$/", "n5", false),
            target("/^n\\\\d+$/", "ndd", true),
            target("/^(gpu|cpu)-[0-9]{2}$/", "gpu-07", true),
            target("/^(gpu|cpu)-[0-9]{2}$/", "gpu-7", false),
        ],
        &RunEnv::default(),
    )
    .await;
}

#[tokio::test]
async fn file_contents_patterns_as_nhc() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("release");
    std::fs::write(&f, "ID=debian\nVERSION_ID=\"12\"\nNAME=gpu7\n").unwrap();
    let f = f.display();
    check_cases(
        &[
            same(
                format!("* || check_file_contents {f} 'NAME=+(gpu|cpu)[[:digit:]]'\n"),
                "n1",
                true,
            ),
            same(
                format!("* || check_file_contents {f} 'NAME=+(cpu)*'\n"),
                "n1",
                false,
            ),
            same(
                format!("* || check_file_contents {f} '/^VERSION_ID=\"[[:digit:]]+\"$/'\n"),
                "n1",
                true,
            ),
            same(
                format!("* || check_file_contents {f} '/^VERSION_ID=\"\\\\d+\"$/'\n"),
                "n1",
                false,
            ),
        ],
        &RunEnv::default(),
    )
    .await;
}

#[tokio::test]
async fn dmi_handles_compare_as_bash_numbers() {
    let d = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/health/dmidecode.txt");
    // A stand-in dmidecode for both: the agent runs the path it is given, NHC the one on
    // its PATH (which the config extends, as sites do). Real dmidecode output ends with
    // an End Of Table handle; NHC keeps a handle's lines only when the next one starts.
    let bin = d.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let prog = bin.join("dmidecode");
    std::fs::write(
        &prog,
        format!(
            "#!/bin/sh\ncat '{}'\nprintf '\\nHandle 0x0009, DMI type 127, 4 bytes\\nEnd Of Table\\n'\n",
            fixture.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&prog, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut env = RunEnv::default();
    env.host.dmidecode = prog.clone();
    let line = |h: &str, m: &str| {
        format!(
            "* || export PATH=\"{}:$PATH\"\n* || check_dmi_data_match -h {h} '{m}'\n",
            bin.display()
        )
    };
    // The fixture's handle 0x0008 is type 32 (System Boot Information), 0x0001 type 1.
    let boot = "System Boot Information: Status: No errors detected";
    let product = "System Information: Product Name: c5n.18xlarge";
    check_cases(
        &[
            same(line("0x0008", boot), "n1", true),
            same(line("0x8", boot), "n1", true),
            same(line("8", boot), "n1", true),
            // A leading 0 is octal: 010 is 8.
            same(line("010", boot), "n1", true),
            same(line("10", boot), "n1", false),
            same(line("1", product), "n1", true),
            same(line("0x0001", boot), "n1", false),
            same(line("'0 1'", product), "n1", true),
        ],
        &env,
    )
    .await;
}

#[tokio::test]
async fn file_stat_values_as_bash_arithmetic() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("f");
    std::fs::write(&f, "x").unwrap();
    std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let dev = std::fs::metadata(&f).unwrap().dev();
    let f = f.display();
    check_cases(
        &[
            same(format!("* || check_file_stat -m 0755 {f}\n"), "n1", true),
            same(format!("* || check_file_stat -m 493 {f}\n"), "n1", true),
            same(format!("* || check_file_stat -m 0x1ed {f}\n"), "n1", true),
            // Without a leading 0 the mode is decimal, as NHC reads it: 755 is 0o1363.
            same(format!("* || check_file_stat -m 755 {f}\n"), "n1", false),
            same(format!("* || check_file_stat -M 0644 {f}\n"), "n1", true),
            same(format!("* || check_file_stat -M 0700 {f}\n"), "n1", true),
            same(format!("* || check_file_stat -M 01000 {f}\n"), "n1", false),
            same(
                format!("* || check_file_stat -d {dev:#x} {f}\n"),
                "n1",
                true,
            ),
            same(format!("* || check_file_stat -D {dev} {f}\n"), "n1", true),
            same(
                format!("* || check_file_stat -d {} {f}\n", dev + 1),
                "n1",
                false,
            ),
            // /dev/null is 1:3.
            same("* || check_file_stat -t 0x1 -T 3 /dev/null\n", "n1", true),
            same("* || check_file_stat -t 01 -T 0x03 /dev/null\n", "n1", true),
            same("* || check_file_stat -t 0xff /dev/null\n", "n1", false),
            same(format!("* || check_file_stat -u 0 -g 0 {f}\n"), "n1", true),
            // uid and gid compare as text with the decimal id.
            same(format!("* || check_file_stat -u 00 {f}\n"), "n1", false),
        ],
        &RunEnv::default(),
    )
    .await;
}

/// A process that runs under a chosen argv\[0\] until dropped (killed by PID).
struct Titled(Child);

impl Titled {
    fn start(title: &str) -> Titled {
        let child = Command::new("bash")
            .args(["-c", "exec -a \"$0\" sleep 600", title])
            .spawn()
            .unwrap();
        // Wait until the title is there (exec done).
        let cmdline = format!("/proc/{}/cmdline", child.id());
        for _ in 0..500 {
            if std::fs::read(&cmdline).is_ok_and(|c| c.starts_with(title.as_bytes())) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Titled(child)
    }
}

impl Drop for Titled {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn numeric_owners_and_rewritten_titles() {
    // Run as root (the project's tests do): both processes are owned by uid 0, `root`.
    let tag = format!("oracle{}", std::process::id());
    let daemon = format!("{tag}-daemon");
    let sshd = format!("{tag}-sshd");
    let _d = Titled::start(&format!("/usr/sbin/{daemon}"));
    let _s = Titled::start(&format!(
        "{sshd}: /usr/sbin/{sshd} -D [listener] 0 of 10-100"
    ));
    check_cases(
        &[
            same(format!("* || check_ps_daemon {daemon} root\n"), "n1", true),
            // check_ps_daemon compares the owner with the user name as text.
            same(format!("* || check_ps_daemon {daemon} 0\n"), "n1", false),
            // check_ps_service: digits are a uid turned into its name ...
            same(format!("* || check_ps_service -u 0 {daemon}\n"), "n1", true),
            same(
                format!("* || check_ps_service -u 1 {daemon}\n"),
                "n1",
                false,
            ),
            // ... anything else is a match over the name: `!0` excludes only a user `0`.
            same(
                format!("* || check_ps_service -u '!0' {daemon}\n"),
                "n1",
                true,
            ),
            same(
                format!("* || check_ps_service -u '!root' {daemon}\n"),
                "n1",
                false,
            ),
            same(format!("* || check_ps_blacklist {daemon} 0\n"), "n1", true),
            same(
                format!("* || check_ps_blacklist {daemon} '!0'\n"),
                "n1",
                false,
            ),
            // Section 5: sshd's rewritten title `sshd: ...`. NHC's first word is `sshd:`,
            // which `*sshd` does not match (its long-standing bug); the agent takes the
            // word without the colon.
            Case {
                conf: format!("* || check_ps_service -u root {sshd}\n"),
                host: "n1",
                nhc: false,
                agent: true,
            },
            same(
                format!("* || check_ps_service -f -m '*{sshd}: *' x\n"),
                "n1",
                true,
            ),
        ],
        &RunEnv::default(),
    )
    .await;
}

/// `check_ps_service -S` with `-v` / `-V` (NHC: a start that worked passes the check with
/// `-v`; `-V` also needs `service NAME status` to succeed), through a real, confined
/// `systemd --user`. Agent only: NHC runs `/sbin/service`.
#[tokio::test]
async fn service_start_verified_with_v_and_cap_v() {
    let sd = slurm_e2e::UserSystemd::start().unwrap();
    let tag = format!("sna{}", std::process::id());
    let dir = sd.unit_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let daemon = |name: &str| {
        format!("[Service]\nExecStart=/bin/bash -c 'exec -a {tag}-{name} sleep 600'\n")
    };
    // Runs once and is gone: the start job succeeds, the unit is not active afterwards.
    let oneshot = "[Service]\nType=oneshot\nExecStart=/bin/true\n".to_string();
    let failing = "[Service]\nType=oneshot\nExecStart=/bin/false\n".to_string();
    for (name, text) in [
        ("plain", daemon("plain")),
        ("sync", daemon("sync")),
        ("check", daemon("check")),
        ("gone", oneshot.clone()),
        ("gonev", oneshot),
        ("fails", failing),
        ("stopme", daemon("stopme")),
    ] {
        std::fs::write(dir.join(format!("{tag}-{name}.service")), text).unwrap();
    }
    sd.daemon_reload().unwrap();
    let mut env = RunEnv::default();
    env.systemd_bus = sd.bus_address();
    let run = |opts: &str, name: &str| {
        let conf = format!("* || check_ps_service {opts} -S -d {tag}-{name} {tag}-{name}\n");
        let env = env.clone();
        async move { agent_passes(&conf, "n1", &env).await }
    };
    // Without -v/-V the check fails for this run even though the start worked.
    let (ok, m) = run("", "plain").await;
    assert!(!ok && m.contains("start") && m.contains(": done"), "{m}");
    let (ok, m) = run("-v", "sync").await;
    assert!(ok, "{m}");
    let (ok, m) = run("-V", "check").await;
    assert!(ok && m.contains("active"), "{m}");
    // The job worked but nothing runs afterwards: -v passes, -V does not.
    let (ok, m) = run("-v", "gonev").await;
    assert!(ok, "{m}");
    let (ok, m) = run("-V", "gone").await;
    assert!(!ok && m.contains("not running"), "{m}");
    // The start job fails: -v fails.
    let (ok, m) = run("-v", "fails").await;
    assert!(!ok && m.contains("failed"), "{m}");
    // -s: a service that must not run is stopped; -V passes once the unit is inactive.
    sd.systemctl_ok(&["start", &format!("{tag}-stopme.service")])
        .unwrap();
    // The start job is done once the service forked; wait (generously) until it runs
    // under its title.
    let title = format!("{tag}-stopme");
    let running = || {
        std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c.starts_with(title.as_bytes()))
        })
    };
    for _ in 0..3000 {
        if running() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(running(), "{title} did not start");
    let conf = format!("* || check_ps_service -s -V -d {tag}-stopme {tag}-stopme\n");
    let (ok, m) = agent_passes(&conf, "n1", &env).await;
    assert!(ok && m.contains("stop") && m.contains("inactive"), "{m}");
    assert_eq!(
        sd.unit_property(&format!("{tag}-stopme.service"), "ActiveState")
            .unwrap(),
        "inactive"
    );
    // Nothing runs now: the check passes without an action (NHC returns 0).
    let (ok, m) = agent_passes(&conf, "n1", &env).await;
    assert!(ok, "{m}");
}

/// `check_ps_service -k`: SIGKILL each matching process (only when not report-only);
/// `-V` passes once it is gone.
#[tokio::test]
async fn service_kill_with_k() {
    let tag = format!("sna{}-victim", std::process::id());
    let mut victim = Titled::start(&format!("/usr/sbin/{tag}"));
    let conf = format!("* || check_ps_service -k -V {tag}\n");
    let mut report_only = RunEnv::default();
    report_only.service_actions = false;
    let (ok, m) = agent_passes(&conf, "n1", &report_only).await;
    assert!(!ok && m.contains("not attempted (report only)"), "{m}");
    assert!(
        victim.0.try_wait().unwrap().is_none(),
        "killed in report-only mode"
    );
    let (ok, m) = agent_passes(&conf, "n1", &RunEnv::default()).await;
    assert!(ok && m.contains("killed process ID"), "{m}");
    let status = victim.0.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    // Nothing matches any more: the check passes (NHC returns 0).
    let (ok, m) = agent_passes(&conf, "n1", &RunEnv::default()).await;
    assert!(ok, "{m}");
}

/// NHC's wrapper options on the command checks: `-C` names the check in its message,
/// `-M` replaces the message of the `-m` at its position, `-O` is accepted.
#[tokio::test]
async fn cmd_wrapper_options() {
    let env = RunEnv::default();
    let named = "* || check_cmd_output -C check_mine -M 'no %m in %c (%f failed)' -m '/^zzz$/' /bin/echo hello\n";
    let negated =
        "* || check_cmd_output -C mine -M 'bad %m at line %l' -m '!hello' /bin/echo hello\n";
    let output = "* || check_cmd_output -O OUT -m hello /bin/echo hello\n";
    let status = "* || check_cmd_status -C mine -r 1 /bin/false\n";
    check_cases(
        &[
            same(named, "n1", false),
            same(negated, "n1", false),
            same(output, "n1", true),
            same(status, "n1", true),
        ],
        &env,
    )
    .await;
    let (_, m) = agent_passes(named, "n1", &env).await;
    assert!(
        m.contains("check_mine: no /^zzz$/ in /bin/echo hello (1 failed)"),
        "{m}"
    );
    let (_, m) = agent_passes(negated, "n1", &env).await;
    assert!(m.contains("mine: bad hello at line 1"), "{m}");
}

/// `check_ps_service -e` / `-E`: the action runs as a program with its words (no shell:
/// `;` in it is not an operator but refused), only when not report-only; with `-v` a
/// successful action passes the check.
#[tokio::test]
async fn service_actions_e_and_cap_e_run_without_a_shell() {
    let d = tempfile::tempdir().unwrap();
    let marker = d.path().join("ran");
    let tag = format!("sna{}-e", std::process::id());
    let missing = format!(
        "* || check_ps_service -v -e '/usr/bin/touch {}' {tag}-none\n",
        marker.display()
    );
    let mut report_only = RunEnv::default();
    report_only.service_actions = false;
    let (ok, m) = agent_passes(&missing, "n1", &report_only).await;
    assert!(!ok && m.contains("report only"), "{m}");
    assert!(!marker.exists());
    let (ok, m) = agent_passes(&missing, "n1", &RunEnv::default()).await;
    assert!(ok && m.contains("succeeded"), "{m}");
    assert!(marker.exists());
    // -E runs when the process is found; a failing action fails the check.
    let _p = Titled::start(&format!("/usr/sbin/{tag}-found"));
    let found = format!("* || check_ps_service -v -E /bin/false {tag}-found\n");
    let (ok, m) = agent_passes(&found, "n1", &RunEnv::default()).await;
    assert!(!ok && m.contains("failed (exit code 1)"), "{m}");
    // No shell: an operator in the action is refused when the line is read.
    let evil = format!(
        "* || check_ps_service -e 'touch {}; reboot' {tag}-none\n",
        marker.display()
    );
    let (ok, m) = agent_passes(&evil, "n1", &RunEnv::default()).await;
    assert!(!ok && m.contains("operator"), "{m}");
}

/// A stand-in program for both sides: an executable script in `dir`.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    p
}

/// `check_cmd_dmesg` (NHC's wrapper of `check_cmd_output -C check_cmd_dmesg` over
/// `dmesg`, `-e` replacing the command), `check_hw_mcelog` (`$MCELOG $MCELOG_ARGS`, per
/// DIMM limits `MCELOG_MAX_CORRECTED_RATE` / `MCELOG_MAX_UNCORRECTED_RATE`), and
/// `check_dmi_raw_data_match` (dmidecode's raw lines).
#[tokio::test]
async fn dmesg_mcelog_and_dmi_raw_as_nhc() {
    let d = tempfile::tempdir().unwrap();
    let dmesg = script(
        d.path(),
        "dmesg",
        "echo '[    0.000000] Linux version 6.1.0'\necho '[    5.1] EDAC MC0: 1 CE memory read error'\n",
    );
    let dm = dmesg.display();
    let dimm = |c: u32, u: u32| {
        format!(
            "echo 'memory controller 0 channel 1 dimm 0'\necho 'corrected memory errors:'\necho '        {c} total'\necho '        {c} in 24h'\necho 'uncorrected memory errors:'\necho '        {u} total'\necho '        {u} in 24h'\n"
        )
    };
    let quiet = script(d.path(), "mcelog-quiet", "exit 0\n");
    let refused = script(
        d.path(),
        "mcelog-refused",
        "echo 'mcelog: client connect: Connection refused' >&2\nexit 1\n",
    );
    let ok = script(d.path(), "mcelog-ok", &dimm(9, 0));
    let many = script(d.path(), "mcelog-many", &dimm(10, 0));
    let fatal = script(d.path(), "mcelog-fatal", &dimm(0, 1));
    let mce = |prog: &Path, extra: &str| {
        format!(
            "* || MCELOG={}\n{extra}* || check_hw_mcelog\n",
            prog.display()
        )
    };
    // dmidecode for both (as in dmi_handles_compare_as_bash_numbers).
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/health/dmidecode.txt");
    let bin = d.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let prog = script(&bin, "dmidecode", &format!("cat '{}'\n", fixture.display()));
    let mut env = RunEnv::default();
    env.host.dmidecode = prog;
    let raw = |m: &str| {
        format!(
            "* || export PATH=\"{}:$PATH\"\n* || check_dmi_raw_data_match {m}\n",
            bin.display()
        )
    };
    check_cases(
        &[
            same(
                format!("* || check_cmd_dmesg -e {dm} -m '/EDAC MC[0-9]/'\n"),
                "n1",
                true,
            ),
            same(
                format!("* || check_cmd_dmesg -e {dm} -m '!/ CE memory/'\n"),
                "n1",
                false,
            ),
            same(
                format!("* || check_cmd_dmesg -e {dm} -M 'no %m' -m '*Linux version 7*'\n"),
                "n1",
                false,
            ),
            same(format!("* || check_cmd_dmesg -e {dm} -r 1\n"), "n1", false),
            same(mce(&quiet, ""), "n1", true),
            same(mce(&refused, ""), "n1", true),
            same(mce(&ok, ""), "n1", true),
            same(mce(&many, ""), "n1", false),
            same(mce(&fatal, ""), "n1", false),
            same(
                mce(&many, "* || MCELOG_MAX_CORRECTED_RATE=10\n"),
                "n1",
                true,
            ),
            // Without limits any output is fatal.
            same(mce(&ok, "* || MCELOG_MAX_CORRECTED_RATE=\n"), "n1", false),
            same(raw("'*Product Name: c5n.18xlarge*'"), "n1", true),
            same(raw("'/^[[:space:]]+Product Name: c5n/'"), "n1", true),
            same(raw("'! *Product Name: c5n.18xlarge*'"), "n1", true),
            same(raw("! '*Product Name: c5n.18xlarge*'"), "n1", false),
            same(raw("'*Product Name: m7i*'"), "n1", false),
            same(raw("! '*Product Name: m7i*'"), "n1", true),
        ],
        &env,
    )
    .await;
    let (_, m) = agent_passes(
        &format!("* || check_cmd_dmesg -e {dm} -m '!/ CE memory/'\n"),
        "n1",
        &env,
    )
    .await;
    assert!(m.contains("check_cmd_dmesg: "), "{m}");
    let (_, m) = agent_passes(&mce(&many, ""), "n1", &env).await;
    assert!(
        m.contains("10 corrected memory errors detected (limit of 9/day)"),
        "{m}"
    );
}

/// A process of its own (killed by PID when dropped) with a one-word title, as `uid`.
struct Proc(Child);

impl Proc {
    fn start(title: &str, uid: u32, busy: bool) -> Proc {
        use std::os::unix::process::CommandExt;
        let body = if busy {
            "while :; do :; done"
        } else {
            "sleep 600"
        };
        let child = Command::new("bash")
            .args(["-c", &format!("exec -a \"$0\" bash -c '{body}'"), title])
            .uid(uid)
            .gid(uid)
            .spawn()
            .unwrap();
        let cmdline = format!("/proc/{}/cmdline", child.id());
        for _ in 0..1000 {
            if std::fs::read(&cmdline).is_ok_and(|c| c.starts_with(title.as_bytes())) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Proc(child)
    }

    /// User plus system CPU time so far, seconds.
    fn cpu_secs(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/stat", self.0.id())).unwrap_or_default();
        let f: Vec<&str> = s
            .rsplit_once(')')
            .map(|x| x.1)
            .unwrap_or("")
            .split_whitespace()
            .collect();
        let t = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        (t(11) + t(12)) / 100
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `check_ps_cpu/mem/physmem/time`, `check_ps_kswapd`, `check_ps_unauth_users` and
/// `check_ps_userproc_lineage` on processes this test starts as a non-system uid (one
/// test: these checks see every process of the host, so the cases must not overlap).
/// `SQUEUE_CMD` is a stand-in: no real squeue runs (it would look for a controller).
#[tokio::test]
async fn ps_resources_and_owners_as_nhc() {
    let tag = format!("sna{}", std::process::id());
    let busy_t = format!("{tag}-kswapdbusy");
    let idle_t = format!("{tag}-kswapdidle");
    let busy = Proc::start(&busy_t, 4242000, true);
    let _idle = Proc::start(&idle_t, 4242000, false);
    // Eventually (generous: the machine is shared) it has used 2 s of CPU; then it is
    // stopped so its figures hold still while both sides look. Not at :08 or :09 seconds:
    // NHC reads `ps`'s `M:SS` with bash arithmetic, where `08` and `09` are bad octal
    // numbers and its check_ps_time then passes whatever the limit (an NHC bug).
    let signal = |sig: &str| {
        let st = Command::new("kill")
            .args([sig, &busy.0.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success(), "kill {sig}");
    };
    let mut want = 2;
    loop {
        for _ in 0..1200 {
            if busy.cpu_secs() >= want {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(busy.cpu_secs() >= want, "the busy process got no CPU");
        signal("-STOP");
        // Stopped (state T) before the final figure is read.
        let stopped = || {
            std::fs::read_to_string(format!("/proc/{}/stat", busy.0.id())).is_ok_and(|st| {
                st.rsplit_once(") ")
                    .is_some_and(|(_, r)| r.starts_with('T'))
            })
        };
        for _ in 0..1000 {
            if stopped() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(stopped(), "SIGSTOP did not stop the busy process");
        if ![8, 9].contains(&(busy.cpu_secs() % 60)) {
            break;
        }
        signal("-CONT");
        want = busy.cpu_secs() + 2;
    }
    let d = tempfile::tempdir().unwrap();
    let nojobs = script(d.path(), "squeue-none", "exit 0\n");
    let jobs = script(d.path(), "squeue-4242000", "echo 4242000\n");
    let broken = script(
        d.path(),
        "squeue-broken",
        "echo 'slurm_load_jobs error' >&2; exit 1\n",
    );
    // Test uids above 4000000 and that as the system range: processes of real users that
    // other tests on this machine may run count as system users' and stay out of the way.
    let pre = format!(
        "* || MAX_SYS_UID=4000000\n* || SQUEUE_CMD={}\n",
        nojobs.display()
    );
    let line = |l: &str| format!("{pre}* || {l}\n");
    check_cases(
        &[
            same(line(&format!("check_ps_cpu -m {busy_t} 1")), "n1", false),
            same(line(&format!("check_ps_cpu -m {busy_t} 1000%")), "n1", true),
            same(line(&format!("check_ps_cpu -a -m {busy_t} 1")), "n1", false),
            // -u: uid 0 is root, the owner is 4242000. NHC disagrees here: looking up the
            // nameless uid 4242000 (getent finds nothing) stores an empty name at index ""
            // of its uid-to-name array, which bash reads as index 0, so `-u 0` becomes
            // "any owner" once such a process exists.
            Case {
                conf: line(&format!("check_ps_cpu -u 0 -m {busy_t} 1")),
                host: "n1",
                nhc: false,
                agent: true,
            },
            same(
                line(&format!("check_ps_cpu -u root -m {busy_t} 1")),
                "n1",
                true,
            ),
            same(
                line(&format!("check_ps_cpu -u 1 -m {busy_t} 1")),
                "n1",
                true,
            ),
            same(
                line(&format!("check_ps_cpu -u 4242000 -m {busy_t} 1")),
                "n1",
                false,
            ),
            same(
                line(&format!("check_ps_cpu -f -m '*{busy_t} -c while*' 1")),
                "n1",
                false,
            ),
            same(
                line(&format!("check_ps_cpu -m '*{busy_t} -c while*' 1")),
                "n1",
                true,
            ),
            // System users' processes only with -A.
            same(
                format!("{pre}* || MAX_SYS_UID=5000000\n* || check_ps_cpu -m {busy_t} 1\n"),
                "n1",
                true,
            ),
            same(
                format!("{pre}* || MAX_SYS_UID=5000000\n* || check_ps_cpu -A -m {busy_t} 1\n"),
                "n1",
                false,
            ),
            same(line(&format!("check_ps_time -m {busy_t} 1s")), "n1", false),
            same(line(&format!("check_ps_time -m {busy_t} 100m")), "n1", true),
            same(
                line(&format!("check_ps_time -m {busy_t} 1m30s")),
                "n1",
                true,
            ),
            same(line(&format!("check_ps_mem -m {busy_t} 1k")), "n1", false),
            same(line(&format!("check_ps_mem -m {busy_t} 1t")), "n1", true),
            same(
                line(&format!("check_ps_physmem -m {busy_t} 1k")),
                "n1",
                false,
            ),
            same(
                line(&format!("check_ps_physmem -m {busy_t} 1t")),
                "n1",
                true,
            ),
            same(
                line(&format!("check_ps_physmem -m {busy_t} 100%")),
                "n1",
                true,
            ),
            // kswapd: the busy one (over 1 s) is "a NUMA node" above the threshold.
            same(line("check_ps_kswapd 1 10"), "n1", false),
            same(line("check_ps_kswapd 1 10 log"), "n1", true),
            same(line("check_ps_kswapd 100000000 100000000"), "n1", true),
            // Owners: uid 4242000 is neither a system user, nor allowed, nor running a job.
            same(line("check_ps_unauth_users"), "n1", false),
            same(line("check_ps_unauth_users log syslog"), "n1", true),
            same(line("check_ps_unauth_users -u 4242000"), "n1", true),
            same(
                format!(
                    "{pre}* || NHC_AUTH_USERS=\"root nobody 4242000\"\n* || check_ps_unauth_users\n"
                ),
                "n1",
                true,
            ),
            same(
                format!(
                    "* || MAX_SYS_UID=4000000\n* || SQUEUE_CMD={}\n* || check_ps_unauth_users\n",
                    jobs.display()
                ),
                "n1",
                true,
            ),
            // squeue fails (controller away): NHC then takes every user for one without a
            // job and fails (or, with `kill`, kills them all); the agent judges no process.
            Case {
                conf: format!(
                    "* || MAX_SYS_UID=4000000\n* || SQUEUE_CMD={}\n* || check_ps_unauth_users\n",
                    broken.display()
                ),
                host: "n1",
                nhc: false,
                agent: true,
            },
            same(line("check_ps_userproc_lineage"), "n1", false),
            same(line("check_ps_userproc_lineage -u 4242000"), "n1", true),
            same(line("check_ps_userproc_lineage ignore die"), "n1", true),
        ],
        &RunEnv::default(),
    )
    .await;
    let (ok, m) = agent_passes(
        &format!(
            "* || MAX_SYS_UID=4000000\n* || SQUEUE_CMD={}\n* || check_ps_unauth_users log kill\n",
            broken.display()
        ),
        "n1",
        &RunEnv::default(),
    )
    .await;
    assert!(ok, "{m}");
    assert!(
        m.contains("not judged: the users with jobs on this node are unknown")
            && m.contains("exited with status 1")
            && m.contains("no process was acted on")
            && !m.contains("killed"),
        "{m}"
    );
    let (_, m) = agent_passes(
        &line(&format!("check_ps_time -m {busy_t} 1s")),
        "n1",
        &RunEnv::default(),
    )
    .await;
    assert!(
        m.contains(&format!(
            "Process \"{busy_t}\" ({}) of 4242000 has consumed",
            busy.0.id()
        )),
        "{m}"
    );
    // A process below a `slurmstepd` is a job's: lineage passes for it.
    use std::os::unix::process::CommandExt;
    let step = Command::new("bash")
        .args([
            "-c",
            "exec -a \"$0\" bash -c 'setpriv --reuid=4343000 --regid=4343000 --clear-groups sleep 600 & wait'",
            "slurmstepd:",
        ])
        .process_group(0)
        .spawn()
        .unwrap();
    struct Group(Child);
    impl Drop for Group {
        fn drop(&mut self) {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", self.0.id())])
                .status();
            let _ = self.0.wait();
        }
    }
    let step = Group(step);
    let mut child_seen = false;
    for _ in 0..500 {
        let kids = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", step.0.id()))
            .unwrap_or_default();
        if let Some(k) = kids.split_whitespace().next() {
            let st = std::fs::read_to_string(format!("/proc/{k}/status")).unwrap_or_default();
            let cmd = std::fs::read(format!("/proc/{k}/cmdline")).unwrap_or_default();
            if st.contains("\nUid:\t4343000") && cmd.starts_with(b"sleep") {
                child_seen = true;
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(child_seen, "the job step's child did not start");
    check_cases(
        &[
            same(line("check_ps_userproc_lineage -u 4242000"), "n1", true),
            same(line("check_ps_unauth_users -u 4242000"), "n1", false),
        ],
        &RunEnv::default(),
    )
    .await;
    drop(step);
    // Actions: only reported under --no-act, taken otherwise (agent only: NHC would kill
    // in the background).
    let kill = line(&format!("check_ps_cpu -k -m {busy_t} 1"));
    let mut report_only = RunEnv::default();
    report_only.service_actions = false;
    let (ok, m) = agent_passes(&kill, "n1", &report_only).await;
    assert!(
        !ok && m.contains("not attempted (report only): kill -9"),
        "{m}"
    );
    let mut busy = busy;
    assert!(
        busy.0.try_wait().unwrap().is_none(),
        "killed under --no-act"
    );
    let (ok, m) = agent_passes(&kill, "n1", &RunEnv::default()).await;
    assert!(!ok && m.contains("killed process ID"), "{m}");
    let status = busy.0.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
}

/// `check_net_socket` over a listener this test opens on 127.0.0.1. NHC runs `netstat
/// -Tanpee`, which this netstat refuses (no output: nothing matches), so NHC is pointed at
/// `ss` as it does when netstat is missing.
#[tokio::test]
async fn net_socket_as_nhc() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let closed = {
        let c = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        c.local_addr().unwrap().port()
    };
    let line = |l: &str| format!("* || NETSTAT_CMD=/nonexistent/netstat\n* || {l}\n");
    check_cases(
        &[
            same(
                line(&format!(
                    "check_net_socket -p tcp -s LISTEN -l 127.0.0.1:{port}"
                )),
                "n1",
                true,
            ),
            same(line(&format!("check_net_socket -l '*:{port}'")), "n1", true),
            same(
                line(&format!(
                    "check_net_socket -n test -p tcp -l 127.0.0.1:{closed}"
                )),
                "n1",
                false,
            ),
            same(
                line(&format!("check_net_socket -p udp -l 127.0.0.1:{port}")),
                "n1",
                false,
            ),
            same(
                line(&format!("check_net_socket -! -l 127.0.0.1:{port}")),
                "n1",
                false,
            ),
            same(
                line(&format!("check_net_socket -! -l 127.0.0.1:{closed}")),
                "n1",
                true,
            ),
            same(
                line(&format!(
                    "check_net_socket -0 -l '/^127\\.0\\.0\\.1:{port}$/'"
                )),
                "n1",
                true,
            ),
        ],
        &RunEnv::default(),
    )
    .await;
    // Agent only: the owner and the daemon (this test program).
    let env = RunEnv::default();
    let (ok, m) = agent_passes(
        &line(&format!(
            "check_net_socket -u root -d 'nhc_oracle*' -l 127.0.0.1:{port}"
        )),
        "n1",
        &env,
    )
    .await;
    assert!(ok, "{m}");
    let (ok, m) = agent_passes(
        &line(&format!("check_net_socket -d sshd -l 127.0.0.1:{port}")),
        "n1",
        &env,
    )
    .await;
    assert!(!ok && m.contains("No matching sockets found"), "{m}");
    let (ok, m) = agent_passes(&line("check_net_socket"), "n1", &env).await;
    assert!(!ok && m.contains("no match criteria"), "{m}");
    // -e runs (no shell) when nothing matches, -E when something does; not under --no-act.
    let d = tempfile::tempdir().unwrap();
    let (missing, found) = (d.path().join("missing"), d.path().join("found"));
    let actions = |port: u16| {
        line(&format!(
            "check_net_socket -l 127.0.0.1:{port} -e '/usr/bin/touch {}' -E '/usr/bin/touch {}'",
            missing.display(),
            found.display()
        ))
    };
    let mut report_only = RunEnv::default();
    report_only.service_actions = false;
    let (ok, m) = agent_passes(&actions(closed), "n1", &report_only).await;
    assert!(!ok && m.contains("not attempted (report only)"), "{m}");
    assert!(!missing.exists());
    let (ok, m) = agent_passes(&actions(closed), "n1", &env).await;
    assert!(!ok && m.contains("succeeded"), "{m}");
    assert!(missing.exists() && !found.exists());
    let (ok, m) = agent_passes(&actions(port), "n1", &env).await;
    assert!(ok && m.contains("succeeded"), "{m}");
    assert!(found.exists());
    drop(l);
}

/// `check_net_ping` over ICMP on 127.0.0.1 (NHC runs `ping`; compared with NHC only where
/// a `ping` program is installed). Failing: a source address or an interface this host does
/// not have (the socket cannot bind, nothing is sent).
#[tokio::test]
async fn net_ping_loopback() {
    let env = RunEnv::default();
    let has_ping = cmd_found("ping");
    let cases = [
        ("check_net_ping 127.0.0.1", true),
        ("check_net_ping -c 2 -i 0.2 -w 5 127.0.0.1 127.0.0.2", true),
        ("check_net_ping -I 127.0.0.1 localhost", true),
        ("check_net_ping -I 10.255.255.254 127.0.0.1", false),
        ("check_net_ping -I lo 127.0.0.1", true),
        ("check_net_ping -I nosuchif0 127.0.0.1", false),
        ("check_net_ping", false),
    ];
    for (l, want) in cases {
        let conf = format!("* || {l}\n");
        let (ok, m) = agent_passes(&conf, "n1", &env).await;
        assert_eq!(ok, want, "{l}: {m}");
        if has_ping {
            if let Some(n) = nhc_passes(&conf, "n1") {
                assert_eq!(n, want, "NHC on {l}");
            }
        }
    }
    let (_, m) = agent_passes(
        "* || check_net_ping -I 10.255.255.254 127.0.0.1\n",
        "n1",
        &env,
    )
    .await;
    assert!(
        m.contains("check_net_ping: No response received from 127.0.0.1"),
        "{m}"
    );
}

fn cmd_found(name: &str) -> bool {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .any(|d| Path::new(d).join(name).is_file())
}

/// `check_fs_mount -r -O -e -E` (and NHC's creating a missing mount point): the verdict as
/// NHC's, the actions run as programs (no shell) with the arguments NHC gives them, only
/// when not report-only. `MOUNT_CMD` is a stand-in that records its arguments.
#[tokio::test]
async fn fs_mount_actions_as_nhc() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let log = dir.join("mount.log");
    let mount = script(
        dir,
        "mount",
        &format!("echo \"$*\" >> '{}'\n", log.display()),
    );
    let pre = format!("* || MOUNT_CMD={}\n", mount.display());
    let nhc_dir = dir.join("nhc");
    std::fs::create_dir(&nhc_dir).unwrap();
    let nm = nhc_dir.display();
    let nhc_mount = script(&nhc_dir, "mount", "exit 0\n");
    let nhc_pre = format!("* || MOUNT_CMD={}\n", nhc_mount.display());
    // Verdicts (NHC runs its actions in the background: only in nhc/, never looked at).
    check_cases(
        &[
            same(
                format!("{nhc_pre}* || check_fs_mount -E '/usr/bin/touch {nm}/found' -f /proc\n"),
                "n1",
                true,
            ),
            same(
                format!("{nhc_pre}* || check_fs_mount -r -O size=1m -e '/usr/bin/touch {nm}/x' -f {nm}/gone\n"),
                "n1",
                false,
            ),
            same(
                format!("{nhc_pre}* || check_fs_mount -0 -r -t xfs -f /proc\n"),
                "n1",
                true,
            ),
        ],
        &RunEnv::default(),
    )
    .await;
    let gone = dir.join("gone");
    let found = dir.join("found");
    let missing = dir.join("missing");
    let run = |l: String, env: RunEnv| {
        let conf = format!("{pre}* || {l}\n");
        async move { agent_passes(&conf, "n1", &env).await }
    };
    let mut report_only = RunEnv::default();
    report_only.service_actions = false;
    let not_mounted = format!(
        "check_fs_mount -r -O size=1m -e '/usr/bin/touch {}' -f {}",
        missing.display(),
        gone.display()
    );
    // --no-act: reported, nothing done.
    let (ok, m) = run(not_mounted.clone(), report_only.clone()).await;
    assert!(
        !ok && m.contains("not attempted (report only): mkdir -p -m 0755"),
        "{m}"
    );
    assert!(!gone.exists() && !missing.exists() && !log.exists(), "{m}");
    // Not mounted, no directory: NHC makes it, mounts with -O's options, runs -e.
    let (ok, m) = run(not_mounted.clone(), RunEnv::default()).await;
    assert!(!ok && m.contains("(auto-fixed)"), "{m}");
    assert!(gone.is_dir() && missing.exists(), "{m}");
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        format!("-o size=1m {}\n", gone.display())
    );
    // Mounted but wrong: `-o remount,OPTS`.
    std::fs::remove_file(&log).unwrap();
    let (ok, m) = run(
        "check_fs_mount -r -O ro -t xfs -f /proc".into(),
        RunEnv::default(),
    )
    .await;
    assert!(
        !ok && m.contains("incorrect type") || m.contains("has type proc"),
        "{m}"
    );
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "-o remount,ro /proc\n"
    );
    // Mounted and right: -E runs, the check passes; -e does not run.
    let (ok, m) = run(
        format!(
            "check_fs_mount -E '/usr/bin/touch {}' -e '/usr/bin/touch {}x' -f /proc",
            found.display(),
            found.display()
        ),
        RunEnv::default(),
    )
    .await;
    assert!(ok && m.contains("succeeded"), "{m}");
    assert!(found.exists() && !dir.join("foundx").exists());
    // No shell: an operator in an action is refused when the line is read.
    let (ok, m) = run(
        "check_fs_mount -e 'touch x; reboot' -f /proc".into(),
        RunEnv::default(),
    )
    .await;
    assert!(!ok && m.contains("operator"), "{m}");
}

/// `check_nvsmi_healthmon` / `check_nv_healthmon` with the program the file names
/// (`NVIDIA_SMI_HEALTHMON`, `NVIDIA_HEALTHMON`): its exit status decides, as in NHC.
/// Without one the agent asks NVML (tested in health_gpu.rs and the GPU unit tests); on a
/// machine without the driver and nvidia-smi both fail.
#[tokio::test]
async fn gpu_healthmon_programs_as_nhc() {
    let d = tempfile::tempdir().unwrap();
    let ok = script(d.path(), "smi-ok", "echo 'GPU 0: fine'\n");
    let lost = script(d.path(), "smi-lost", "exit 15\n");
    let conf = |var: &str, prog: &Path, check: &str| {
        format!("* || {var}={}\n* || {check}\n", prog.display())
    };
    let mut cases = vec![
        same(
            conf("NVIDIA_SMI_HEALTHMON", &ok, "check_nvsmi_healthmon"),
            "n1",
            true,
        ),
        same(
            conf("NVIDIA_SMI_HEALTHMON", &lost, "check_nvsmi_healthmon"),
            "n1",
            false,
        ),
        same(
            conf("NVIDIA_HEALTHMON", &ok, "check_nv_healthmon"),
            "n1",
            true,
        ),
        same(
            conf("NVIDIA_HEALTHMON", &lost, "check_nv_healthmon"),
            "n1",
            false,
        ),
    ];
    let no_gpu = !cmd_found("nvidia-smi")
        && !Path::new("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1").exists()
        && !Path::new("/dev/nvidiactl").exists();
    if no_gpu {
        cases.push(same("* || check_nvsmi_healthmon\n", "n1", false));
    }
    check_cases(&cases, &RunEnv::default()).await;
    let (_, m) = agent_passes(
        &conf("NVIDIA_SMI_HEALTHMON", &lost, "check_nvsmi_healthmon"),
        "n1",
        &RunEnv::default(),
    )
    .await;
    assert!(m.contains("check_nvsmi_healthmon: 15 (expected 0)"), "{m}");
}
