//! Tests of the harness itself: every piece starts the real component, the component
//! does its job, and the guards leave nothing behind.

#![allow(clippy::unwrap_used)]

use std::fs;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use base64::Engine as _;
use serde_json::json;
use slurm_e2e::slurm::short_hostname;
use slurm_e2e::{
    free_port, run_with_timeout, Daemon, Moto, Munge, Slurmctld, Slurmd, TempRoot, UserSystemd,
};

const NODE_TIMEOUT: Duration = Duration::from_secs(60);

fn alive(pid: u32) -> bool {
    // A reaped process has no /proc entry; a zombie would show state Z.
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| !r.trim_start().starts_with('Z'))
    })
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn free_port_can_be_bound() {
    let p = free_port();
    assert_ne!(p, 0);
    std::net::TcpListener::bind(("127.0.0.1", p)).unwrap();
}

#[test]
fn daemon_guard_kills_its_process_group_even_on_panic() {
    let root = TempRoot::new("slurm-e2e-guard-").unwrap();
    let mut pids = Vec::new();
    let result = catch_unwind(AssertUnwindSafe(|| {
        let mut cmd = Command::new("sh");
        // The background sleep stays in the group; `exec` makes the leader a sleep too,
        // which ignores nothing: SIGTERM ends it, the group sweep ends the other one.
        cmd.args([
            "-c",
            "sleep 300 & echo $! > bg.pid; echo started; exec sleep 300",
        ])
        .current_dir(root.path());
        let d = Daemon::spawn("sleeper", cmd, root.path()).unwrap();
        pids.push(d.pid());
        let bg = slurm_e2e::wait_until(
            "bg.pid",
            Duration::from_secs(10),
            Duration::from_millis(10),
            || {
                Ok(fs::read_to_string(root.path().join("bg.pid"))
                    .ok()
                    .and_then(|s| s.trim().parse::<u32>().ok()))
            },
        )
        .unwrap();
        pids.push(bg);
        assert!(alive(pids[0]) && alive(pids[1]));
        panic!("test failure inside a daemon's scope");
    }));
    assert!(result.is_err());
    assert_eq!(pids.len(), 2);
    // The leader is reaped by the guard; the background sleep is killed by the group
    // sweep and becomes a zombie of the reparenting init until reaped: not "alive".
    // SIGKILL is delivered at once but the process needs a moment to die.
    for pid in &pids {
        slurm_e2e::wait_until(
            "the killed process to die",
            Duration::from_secs(10),
            Duration::from_millis(10),
            || Ok((!alive(*pid)).then_some(())),
        )
        .unwrap_or_else(|e| panic!("process {pid} survived the guard: {e:#}"));
    }
    let log = fs::read_to_string(root.path().join("sleeper.log")).unwrap();
    assert_eq!(log.trim(), "started");
}

#[test]
fn run_with_timeout_kills_a_hanging_command() {
    let mut cmd = Command::new("sleep");
    cmd.arg("30");
    let err = run_with_timeout(cmd, Duration::from_millis(200)).unwrap_err();
    assert!(format!("{err:#}").contains("did not finish"), "{err:#}");
}

#[test]
fn temp_root_is_kept_when_a_test_panics_and_removed_otherwise() {
    let ok = TempRoot::new("slurm-e2e-keep-").unwrap();
    let ok_path = ok.path().to_path_buf();
    drop(ok);
    assert!(!ok_path.exists());

    let mut kept = None;
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let r = TempRoot::new("slurm-e2e-keep-").unwrap();
        kept = Some(r.path().to_path_buf());
        panic!("failing test");
    }));
    let kept = kept.unwrap();
    assert!(kept.exists());
    fs::remove_dir_all(kept).unwrap();
}

#[test]
fn shared_munged_answers_and_is_reused() {
    let m = Munge::shared().unwrap();
    let report = m.roundtrip().unwrap();
    assert!(
        report.contains("STATUS:") && report.contains("Success (0)"),
        "{report}"
    );
    assert_eq!(
        m.key().unwrap().len(),
        128,
        "mungekey's default key is 1024 bits"
    );
    assert!(Path::new(m.socket()).exists());
    // Same process: same instance. The pid file names the munged we attached to.
    let again = Munge::shared().unwrap();
    assert_eq!(again.pid(), m.pid());
    assert!(alive(m.pid()));
    let pid_file = fs::read_to_string("/run/slurm-e2e/munged.pid").unwrap();
    assert_eq!(pid_file.trim().parse::<u32>().unwrap(), m.pid());
}

#[test]
fn slurmctld_up_and_a_bare_dynamic_slurmd_runs_a_job() {
    let ctld = Slurmctld::start("bare").unwrap();
    let ping = ctld.scontrol_ok(&["ping"]).unwrap();
    assert!(ping.contains("is UP"), "{ping}");
    assert_eq!(ctld.node_state("node1").unwrap(), None);

    let node = Slurmd::dynamic(&ctld, "node1", "CPUs=1 RealMemory=500 Feature=bare").unwrap();
    let state = ctld.wait_node_idle(node.name(), NODE_TIMEOUT).unwrap();
    assert!(state.contains("DYNAMIC"), "{state}");

    let out = ctld
        .run_job("srun", &["-N1", "-w", "node1", "hostname"])
        .unwrap();
    assert!(out.status.success(), "srun: {out:?}");
    assert_eq!(stdout(&out).trim(), short_hostname().unwrap());

    // srun returns when the step ends; slurmctld keeps the node COMPLETING until slurmd
    // reports the job's epilog done, which may come after.
    ctld.wait_node_idle(node.name(), NODE_TIMEOUT).unwrap();
    let sinfo = ctld.sinfo(&["-h", "-N", "-o", "%N %t %f"]).unwrap();
    assert_eq!(sinfo.trim(), "node1 idle bare");
}

#[test]
fn slurmctld_takes_extra_lines_and_static_nodes() {
    let host = short_hostname().unwrap();
    let port = free_port();
    let ctld = Slurmctld::builder("static")
        .line("HealthCheckInterval=17")
        .line("HealthCheckProgram=/bin/true")
        .line(format!(
            "NodeName=st1 NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs=1 RealMemory=100"
        ))
        .partition("PartitionName=only Nodes=st1 Default=YES MaxTime=INFINITE State=UP")
        .start()
        .unwrap();
    let config = ctld.scontrol_ok(&["show", "config"]).unwrap();
    assert!(
        config
            .lines()
            .any(|l| l.starts_with("HealthCheckInterval") && l.contains("17")),
        "{config}"
    );
    // Declared but not started: known to the controller, not idle.
    let state = ctld.node_state("st1").unwrap().unwrap();
    assert!(!slurm_e2e::is_idle(&state), "{state}");

    let _node = Slurmd::static_node(&ctld, "st1").unwrap();
    ctld.wait_node_idle("st1", NODE_TIMEOUT).unwrap();
    // (`sbatch --wait` works too, but polls: it returns seconds after the job ended.)
    let out = ctld
        .run_job("srun", &["-N1", "printenv", "SLURMD_NODENAME"])
        .unwrap();
    assert!(out.status.success(), "srun: {out:?}");
    assert_eq!(stdout(&out).trim(), "st1");
    let parts = ctld.sinfo(&["-h", "-o", "%P"]).unwrap();
    assert_eq!(parts.trim(), "only*");
}

#[test]
fn moto_stores_secure_strings_and_secrets() {
    let moto = Moto::start().unwrap();
    let env = moto.env();
    assert!(env.contains(&("AWS_ENDPOINT_URL".into(), moto.endpoint())));
    assert!(!env.iter().any(|(k, _)| k == "AWS_EC2_METADATA_DISABLED"));

    let key = Munge::shared().unwrap().key().unwrap();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&key);
    moto.put_secure_string("/cluster/munge-key", &b64).unwrap();
    // Raw GetParameter with decryption returns the value; without, moto's "encrypted" form.
    let plain = moto
        .call_ok(
            "ssm",
            "AmazonSSM.GetParameter",
            &json!({"Name": "/cluster/munge-key", "WithDecryption": true}),
        )
        .unwrap();
    assert_eq!(plain["Parameter"]["Type"], "SecureString");
    assert_eq!(plain["Parameter"]["Value"], b64.as_str());
    let enc = moto
        .call_ok(
            "ssm",
            "AmazonSSM.GetParameter",
            &json!({"Name": "/cluster/munge-key", "WithDecryption": false}),
        )
        .unwrap();
    assert_ne!(enc["Parameter"]["Value"], b64.as_str());
    assert_eq!(moto.get_parameter("/cluster/absent").unwrap(), None);

    moto.create_secret_binary("cluster/munge", &key).unwrap();
    let got = moto.get_secret_value("cluster/munge").unwrap().unwrap();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(got["SecretBinary"].as_str().unwrap())
        .unwrap();
    assert_eq!(bytes, key);
    moto.create_secret_string("cluster/text", "hello").unwrap();
    let got = moto.get_secret_value("cluster/text").unwrap().unwrap();
    assert_eq!(got["SecretString"], "hello");

    moto.reset().unwrap();
    assert_eq!(moto.get_parameter("/cluster/munge-key").unwrap(), None);
    assert!(moto.get_secret_value("cluster/munge").unwrap().is_none());
}

#[test]
fn user_systemd_runs_units_confined_and_cleans_up() {
    let sd = UserSystemd::start().unwrap();
    let version = sd
        .busctl(&[
            "get-property",
            "org.freedesktop.systemd1",
            "/org/freedesktop/systemd1",
            "org.freedesktop.systemd1.Manager",
            "Version",
        ])
        .unwrap();
    assert!(version.starts_with("s \""), "{version}");

    // A transient unit, through the Manager API (systemd-run calls StartTransientUnit).
    let mut run = sd.command("systemd-run");
    run.args([
        "--user",
        "--wait",
        "--unit=probe-fail",
        "/bin/sh",
        "-c",
        "exit 3",
    ]);
    let out = run_with_timeout(run, Duration::from_secs(30)).unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");

    // Its processes run inside the manager's own cgroup subtree, never outside it.
    let marker = sd.xdg_runtime_dir().join("cgroup.txt");
    let mut run = sd.command("systemd-run");
    run.args(["--user", "--wait", "--unit=probe-cgroup", "/bin/sh", "-c"])
        .arg(format!("cat /proc/self/cgroup > {}", marker.display()));
    let out = run_with_timeout(run, Duration::from_secs(30)).unwrap();
    assert!(out.status.success(), "{out:?}");
    let cg = fs::read_to_string(&marker).unwrap();
    let unified = cg.lines().find(|l| l.starts_with("0::")).unwrap();
    assert!(
        unified.starts_with(&format!(
            "0::/{}/app.slice/probe-cgroup.service",
            sd.cgroup_name()
        )),
        "{cg}"
    );

    // A unit file in unit_dir(), after daemon-reload.
    fs::write(
        sd.unit_dir().join("probe.service"),
        "[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/true\n",
    )
    .unwrap();
    sd.daemon_reload().unwrap();
    sd.systemctl_ok(&["start", "probe.service"]).unwrap();
    assert_eq!(
        sd.unit_property("probe.service", "ActiveState").unwrap(),
        "active"
    );
    assert_eq!(
        sd.unit_property("probe.service", "Result").unwrap(),
        "success"
    );

    let pid = sd.pid();
    let cgroups = sd.cgroups().to_vec();
    assert!(!cgroups.is_empty());
    drop(sd);
    assert!(!alive(pid));
    for c in cgroups {
        assert!(!c.exists(), "{} left behind", c.display());
    }
}

#[test]
fn two_harnesses_run_side_by_side() {
    let a = Slurmctld::start("para").unwrap();
    let b = Slurmctld::start("para").unwrap();
    assert_ne!(a.port(), b.port());
    assert_ne!(a.slurmd_port(), b.slurmd_port());
    assert_ne!(a.cluster_name(), b.cluster_name());
    let _na = Slurmd::dynamic(&a, "n", "CPUs=1 RealMemory=200").unwrap();
    let _nb = Slurmd::dynamic(&b, "n", "CPUs=1 RealMemory=200").unwrap();
    a.wait_node_idle("n", NODE_TIMEOUT).unwrap();
    b.wait_node_idle("n", NODE_TIMEOUT).unwrap();
    for ctld in [&a, &b] {
        let out = ctld.run_job("srun", &["-N1", "hostname"]).unwrap();
        assert!(out.status.success(), "{out:?}");
    }

    let m1 = Moto::start().unwrap();
    let m2 = Moto::start().unwrap();
    assert_ne!(m1.port(), m2.port());
    m1.put_secure_string("/x", "one").unwrap();
    assert_eq!(m2.get_parameter("/x").unwrap(), None);

    let s1 = UserSystemd::start().unwrap();
    let s2 = UserSystemd::start().unwrap();
    assert_ne!(s1.bus_address(), s2.bus_address());
    assert_ne!(s1.cgroup_name(), s2.cgroup_name());
    for s in [&s1, &s2] {
        let state = s
            .systemctl_ok(&["show", "-p", "SystemState", "--value"])
            .unwrap();
        assert_eq!(state.trim(), "running");
    }
}

#[test]
fn daemon_dies_with_its_thread_when_no_drop_runs() {
    let root = TempRoot::new("slurm-e2e-pdeath-").unwrap();
    let dir = root.path().to_path_buf();
    // Simulates a test process killed by Ctrl-C: the guard never runs its Drop.
    let pid = std::thread::spawn(move || {
        let mut cmd = Command::new("sleep");
        cmd.arg("300");
        let d = Daemon::spawn("orphan", cmd, &dir).unwrap();
        let pid = d.pid();
        std::mem::forget(d);
        pid
    })
    .join()
    .unwrap();
    slurm_e2e::wait_until(
        "the orphaned daemon to be killed",
        Duration::from_secs(10),
        Duration::from_millis(10),
        || Ok((!alive(pid)).then_some(())),
    )
    .unwrap();
}

/// Serves the files of `dir` over HTTP/1.0 on a free loopback port until the returned
/// flag is set: `GET /<name>` answers the file (200) or 404. Returns the base URL.
fn serve_dir(dir: &std::path::Path) -> (String, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    use std::io::{BufRead, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (dir, stopped) = (dir.to_path_buf(), stop.clone());
    std::thread::spawn(move || {
        while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
            let Ok((stream, _)) = listener.accept() else {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            };
            stream.set_nonblocking(false).unwrap();
            let mut reader = std::io::BufReader::new(stream);
            let mut line = String::new();
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            // The rest of the request head.
            let mut h = String::new();
            while reader.read_line(&mut h).is_ok_and(|n| n > 2) {
                h.clear();
            }
            let path = line.split_whitespace().nth(1).unwrap_or("/");
            let name = path.trim_start_matches('/');
            let mut stream = reader.into_inner();
            match std::fs::read(dir.join(name))
                .ok()
                .filter(|_| !name.contains('/'))
            {
                Some(body) => {
                    let _ = write!(
                        stream,
                        "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n",
                        body.len()
                    );
                    let _ = stream.write_all(&body);
                }
                None => {
                    let _ =
                        stream.write_all(b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n");
                }
            }
        }
    });
    (base, stop)
}

/// `scripts/slurm-build.sh` refuses what it cannot vouch for, names it, and installs
/// nothing: a version without a pin (64), a tarball whose checksum differs from the pin
/// (65), a tarball neither in the sources folder nor downloadable (66). A tarball missing
/// from the sources folder is downloaded (here from a loopback server standing in for the
/// pinned URL: `SLURM_SOURCE_URL`) and used only when its sha256 is the pin's: a tampered
/// download is refused naming both checksums and deleted.
#[test]
fn slurm_build_refuses_unpinned_versions_bad_checksums_and_missing_tarballs() {
    let repo = slurm_e2e::fleet::repo_root();
    let marker = std::fs::read_to_string("/opt/slurm/.slurm-build").ok();
    let dir = tempfile::tempdir().unwrap();
    let served = tempfile::tempdir().unwrap();
    let (base, stop) = serve_dir(served.path());
    let run = |version: &str, args: &[&str], url: &str| {
        let out = std::process::Command::new(repo.join("scripts/slurm-build.sh"))
            .args(args)
            .arg(version)
            .env("SLURM_SOURCES_DIR", dir.path().join("sources"))
            .env("SLURM_BUILD_CACHE", dir.path().join("cache"))
            .env("SLURM_DOWNLOAD_DIR", dir.path().join("downloads"))
            .env("SLURM_SOURCE_URL", url)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    std::fs::create_dir_all(dir.path().join("sources")).unwrap();
    let missing = format!("{base}/missing.tar.gz");
    // 23.11 (pinned, end of life) is never the version in /opt/slurm, which would count as
    // already in place.
    let (code, err, _) = run("25.05", &[], &missing);
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains("Slurm 25.05 is not pinned") && err.contains("sources.toml"),
        "{err}"
    );
    // Not in the sources folder, and the URL answers 404.
    let (code, err, _) = run("23.11", &[], &missing);
    assert_eq!(code, Some(66), "{err}");
    assert!(
        err.contains("slurm-23-11-4-1.tar.gz") && err.contains(&missing),
        "{err}"
    );
    // A tampered download: refused naming both checksums, deleted.
    std::fs::write(
        served.path().join("tampered.tar.gz"),
        b"not SchedMD's tarball",
    )
    .unwrap();
    let (code, err, _) = run("23.11", &[], &format!("{base}/tampered.tar.gz"));
    assert_eq!(code, Some(65), "{err}");
    let sha_of = |p: &std::path::Path| {
        let out = std::process::Command::new("sha256sum")
            .arg(p)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    let tampered = sha_of(&served.path().join("tampered.tar.gz"));
    let toml = std::fs::read_to_string(repo.join("packer/sources.toml")).unwrap();
    let pinned = toml
        .split("[slurm.\"23.11.4\"]")
        .nth(1)
        .and_then(|t| t.lines().find_map(|l| l.strip_prefix("sha256 = \"")))
        .unwrap()
        .trim_end_matches('"')
        .to_string();
    assert!(
        err.contains("checksum mismatch")
            && err.contains(&pinned)
            && err.contains(&tampered)
            && err.contains("deleted and nothing was installed"),
        "{err}"
    );
    assert!(
        std::fs::read_dir(dir.path().join("downloads"))
            .unwrap()
            .next()
            .is_none(),
        "a tampered download was kept"
    );
    // A tampered file in the sources folder: refused the same way.
    let tarball = dir.path().join("sources/slurm-23-11-4-1.tar.gz");
    std::fs::write(&tarball, b"not SchedMD's tarball").unwrap();
    let (code, err, _) = run("23.11", &[], &missing);
    assert_eq!(code, Some(65), "{err}");
    assert!(
        err.contains("checksum mismatch") && err.contains(&tarball.display().to_string()),
        "{err}"
    );
    assert!(err.contains("nothing was installed"), "{err}");
    std::fs::remove_file(&tarball).unwrap();
    // A tarball whose sha256 is the pin's (the test's own pins, `SLURM_SOURCES_TOML`),
    // served: downloaded, verified, in place (`--fetch-only` stops there; a build would take
    // minutes); a second run uses it without downloading.
    let good = b"a stand-in for SchedMD's release tarball";
    std::fs::write(served.path().join("slurm-90-1-1-1.tar.gz"), good).unwrap();
    let good_sha = sha_of(&served.path().join("slurm-90-1-1-1.tar.gz"));
    let pins = dir.path().join("sources.toml");
    std::fs::write(
        &pins,
        format!(
            "# Source: the test.\n[slurm.\"90.1.1\"]\nurl = \"{base}/slurm-90-1-1-1.tar.gz\"\nsha256 = \"{good_sha}\"\n"
        ),
    )
    .unwrap();
    let fetch = |url: Option<&str>| {
        let mut c = std::process::Command::new(repo.join("scripts/slurm-build.sh"));
        c.args(["--fetch-only", "90.1"])
            .env("SLURM_SOURCES_TOML", &pins)
            .env("SLURM_SOURCES_DIR", dir.path().join("sources"))
            .env("SLURM_DOWNLOAD_DIR", dir.path().join("downloads"))
            .env_remove("SLURM_SOURCE_URL");
        if let Some(u) = url {
            c.env("SLURM_SOURCE_URL", u);
        }
        let out = c.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let (code, err, out) = fetch(None);
    assert_eq!(code, Some(0), "{err}");
    let got = std::path::PathBuf::from(out.trim());
    assert_eq!(got, dir.path().join("downloads/slurm-90-1-1-1.tar.gz"));
    assert_eq!(std::fs::read(&got).unwrap(), good);
    assert!(err.contains("verified (sha256"), "{err}");
    // In place: not downloaded again (the URL now answers 404).
    let (code, err, _) = fetch(Some(&missing));
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("downloading"), "{err}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (code, err, _) = run("not-a-version", &[], &missing);
    assert_eq!(code, Some(64), "{err}");
    // Nothing changed where the suite's Slurm lives, and nothing was cached.
    assert_eq!(
        std::fs::read_to_string("/opt/slurm/.slurm-build").ok(),
        marker
    );
    assert!(!dir.path().join("cache").exists());
}
