//! Mounts through a real systemd 252 Manager (`systemd --user`, confined to its own cgroup
//! and mount namespace by the e2e harness): units written, loaded, started, verified and
//! stopped for real; real tmpfs, loop-mounted ext4, a read-only remount, a FUSE file
//! system that never answers (a hung FSx), and the real "unknown filesystem type
//! 'lustre'" failure of this kernel. Drains and resumes go to a real slurmctld.
//!
//! The Manager mounts in its own mount namespace: the tests look into it through
//! `/proc/<pid>/mountinfo` and `/proc/<pid>/root` (the `MountEnv` paths), and make
//! changes in it with `nsenter --mount=/proc/<pid>/ns/mnt`.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use slurm_e2e::{run_ok, Daemon, Slurmctld, Slurmd, TempRoot, UserSystemd};
use slurm_node_agent::mounts::{
    self, alive, escape::mount_unit_name, host::ModuleProbe, AliveError, MountEnv, MountSettings,
    NodeAction, READY_MARKER,
};
use slurm_node_agent::settings::HumanDuration;
use slurm_node_agent::slurm::Scontrol;
use slurm_node_agent::systemd::Systemd;

struct World {
    // Dropped first: the FUSE holder must die before the Manager's namespace goes.
    holders: Vec<Daemon>,
    sd: UserSystemd,
    root: TempRoot,
}

impl World {
    fn start() -> World {
        let sd = UserSystemd::start().unwrap();
        let root = TempRoot::new("agent-mounts-").unwrap();
        World {
            holders: Vec::new(),
            sd,
            root,
        }
    }

    fn env(&self) -> MountEnv {
        let pid = self.sd.pid();
        MountEnv {
            unit_dir: self.sd.unit_dir(),
            other_unit_dirs: vec![self.root.path().join("lib-units")],
            fstab: self.root.path().join("fstab"),
            mountinfo: PathBuf::from(format!("/proc/{pid}/mountinfo")),
            root: PathBuf::from(format!("/proc/{pid}/root")),
            runtime_dir: self.root.path().join("run"),
            alive_timeout: Duration::from_secs(2),
            ..MountEnv::system()
        }
    }

    /// A canary of daemon-reloads: a started target whose file then changes on disk, so
    /// that the Manager says it needs a reload until one is made.
    async fn reload_canary(&self, systemd: &Systemd) -> &'static str {
        let unit = "reload-canary.target";
        let path = self.sd.unit_dir().join(unit);
        std::fs::write(&path, "[Unit]\nDescription=canary\n").unwrap();
        systemd.start(unit).await.unwrap();
        std::fs::write(&path, "[Unit]\nDescription=canary, changed\n").unwrap();
        assert!(systemd.needs_reload(unit).await.unwrap());
        unit
    }

    async fn systemd(&self) -> Systemd {
        Systemd::connect(&self.sd.bus_address()).await.unwrap()
    }

    fn path(&self, rel: &str) -> String {
        self.root.path().join(rel).display().to_string()
    }

    /// Runs a command in the Manager's mount namespace.
    fn in_ns(&self, args: &[&str]) -> String {
        let mut c = Command::new("nsenter");
        c.arg(format!("--mount=/proc/{}/ns/mnt", self.sd.pid()))
            .arg("--")
            .args(args);
        run_ok(c, Duration::from_secs(30)).unwrap()
    }

    fn mounted(&self, mount_point: &str) -> Option<mounts::host::MountEntry> {
        let t = std::fs::read_to_string(format!("/proc/{}/mountinfo", self.sd.pid())).unwrap();
        mounts::host::mounted_at(&mounts::host::parse_mountinfo(&t), mount_point).cloned()
    }

    fn marker(&self) -> PathBuf {
        self.root.path().join("run").join(READY_MARKER)
    }
}

fn tmpfs(mount_point: &str) -> MountSettings {
    MountSettings {
        fs_type: "tmpfs".into(),
        source: "tmpfs".into(),
        mount_point: mount_point.into(),
        options: Some("size=4m,mode=0755".into()),
        retry_for: HumanDuration(Duration::from_secs(5)),
        ..MountSettings::default()
    }
}

fn systemd_escape(path: &str) -> String {
    let mut c = Command::new("systemd-escape");
    c.args(["--path", "--suffix=mount", path]);
    run_ok(c, Duration::from_secs(10))
        .unwrap()
        .trim()
        .to_string()
}

#[test]
fn escaping_matches_systemd_escape() {
    for p in [
        "/fsx",
        "/mnt/my fs",
        "/mnt/fsx-01/a_b.c:d",
        "/.snapshots/x",
        "/mnt/ümlaut",
        "/mnt/a+b@c%d~e",
        "/mnt/-lead",
        "/mnt/..x./y.",
    ] {
        assert_eq!(mount_unit_name(p), systemd_escape(p), "{p:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tmpfs_mount_is_written_started_verified_and_idempotent() {
    let w = World::start();
    let env = w.env();
    let systemd = w.systemd().await;
    // An odd path: a space and a dash, both escaped in the unit name.
    let mp = w.path("mnt/fsx-01 a");
    let unit = systemd_escape(&mp);
    let m = [tmpfs(&mp)];

    let reports = mounts::ensure_all(&m, "us-east-1", &env, &systemd)
        .await
        .unwrap();
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].unit, unit);
    assert!(reports[0].unit_changed);
    assert_eq!(reports[0].attempts, 1);
    let text = std::fs::read_to_string(w.sd.unit_dir().join(&unit)).unwrap();
    assert!(text.starts_with(mounts::MARKER), "{text}");
    assert_eq!(systemd.active_state(&unit).await.unwrap(), "active");
    let e = w.mounted(&mp).expect("mounted in the Manager's namespace");
    assert_eq!(e.fs_type, "tmpfs");
    assert!(e.options.starts_with("rw"));
    assert_eq!(
        std::fs::read_to_string(w.marker()).unwrap(),
        format!("{mp}\n")
    );
    // It holds data, seen through the Manager's namespace.
    std::fs::write(env.root.join(mp.trim_start_matches('/')).join("f"), b"x").unwrap();

    // Again: nothing rewritten, no start needed, the data is still there.
    let again = mounts::ensure_all(&m, "us-east-1", &env, &systemd)
        .await
        .unwrap();
    assert!(!again[0].unit_changed);
    assert_eq!(again[0].attempts, 0);
    assert!(env.root.join(mp.trim_start_matches('/')).join("f").exists());

    // Stopped through the Manager: unmounted.
    systemd.stop(&unit).await.unwrap();
    assert!(w.mounted(&mp).is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loop_ext4_mount_and_read_only_remount_is_unhealthy() {
    let w = World::start();
    let env = w.env();
    let systemd = w.systemd().await;
    let img = w.path("disk.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let mut c = Command::new("mkfs.ext4");
    c.args(["-q", "-F", &img]);
    run_ok(c, Duration::from_secs(60)).unwrap();
    let mp = w.path("ext4");
    let m = MountSettings {
        fs_type: "ext4".into(),
        source: img.clone(),
        mount_point: mp.clone().into(),
        options: Some("loop,noatime".into()),
        retry_for: HumanDuration(Duration::from_secs(5)),
        ..MountSettings::default()
    };
    mounts::ensure_all(std::slice::from_ref(&m), "", &env, &systemd)
        .await
        .unwrap();
    let e = w.mounted(&mp).unwrap();
    assert_eq!(e.fs_type, "ext4");
    assert!(e.source.starts_with("/dev/loop"), "{e:?}");

    let spec = m.resolve("").unwrap();
    assert!(mounts::verify(&spec, &env).await.is_ok());
    w.in_ns(&["mount", "-o", "remount,ro", &mp]);
    let err = mounts::verify(&spec, &env).await.unwrap_err();
    assert!(err.to_string().contains("read-only"), "{err}");
    // ensure_all sees the same: the required mount is not healthy, no marker.
    let failed = mounts::ensure_all(std::slice::from_ref(&m), "", &env, &systemd)
        .await
        .unwrap_err();
    assert!(failed.to_string().contains("read-only"), "{failed}");
    assert!(!w.marker().exists());
    // An entry that asks for ro is fine read-only.
    let ro = MountSettings {
        options: Some("loop,ro".into()),
        ..m.clone()
    };
    assert!(mounts::verify(&ro.resolve("").unwrap(), &env).await.is_ok());
    systemd.stop(&mount_unit_name(&mp)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lustre_without_a_kernel_module_fails_plainly_at_once_and_removes_the_marker() {
    let w = World::start();
    let mut env = w.env();
    let systemd = w.systemd().await;
    // The real kernel of this machine has no Lustre module (no /lib/modules at all); point
    // the probe at an empty folder so the test does not depend on that.
    env.modules = ModuleProbe {
        modules_dir: w.root.path().join("modules"),
        ..env.modules.clone()
    };
    // A marker left from an earlier good run must go.
    std::fs::create_dir_all(&env.runtime_dir).unwrap();
    std::fs::write(w.marker(), "old\n").unwrap();
    let mp = w.path("fsx");
    let m = MountSettings {
        mount_point: mp.clone().into(),
        source: "127.0.0.1@tcp:/fsx".into(),
        retry_for: HumanDuration(Duration::from_secs(60)),
        ..MountSettings::default()
    };
    let started = std::time::Instant::now();
    let failed = mounts::ensure_all(&[m], "us-east-1", &env, &systemd)
        .await
        .unwrap_err();
    // No 60 s of retries: without a module none can succeed.
    assert!(started.elapsed() < Duration::from_secs(30));
    let msg = failed.to_string();
    assert!(
        msg.contains(&format!(
            "no Lustre client kernel module for the running kernel {}",
            env.modules.kernel_release
        )),
        "{msg}"
    );
    assert!(msg.contains("slurmd is not started"), "{msg}");
    assert!(
        msg.contains(&format!(
            "mount {mp} (lustre 127.0.0.1@tcp:/fsx) failed after 1 attempt"
        )),
        "{msg}"
    );
    assert_eq!(failed.reports[0].attempts, 1);
    assert!(!w.marker().exists());
    // The real mount(8) ran and failed the way this kernel does (exit 32).
    let exec =
        w.sd.unit_property(&mount_unit_name(&mp), "ExecMount")
            .unwrap();
    assert!(exec.contains("status=32"), "{exec}");
    assert_eq!(
        w.sd.unit_property(&mount_unit_name(&mp), "ActiveState")
            .unwrap(),
        "failed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_fuse_mount_times_out_without_piling_up_threads() {
    let mut w = World::start();
    let env = w.env();
    let systemd = w.systemd().await;
    let mp = w.path("hung");
    std::fs::create_dir_all(&mp).unwrap();
    // A FUSE mount whose daemon never answers, not even FUSE_INIT: every statfs and
    // getattr on it blocks, as on a hung FSx client. The holder keeps /dev/fuse open;
    // killing it aborts the connection.
    let mut c = Command::new("nsenter");
    c.arg(format!("--mount=/proc/{}/ns/mnt", w.sd.pid()))
        .args(["--", "sh", "-c"])
        .arg(
            "exec 3<>/dev/fuse && mount -i -t fuse -o fd=3,rootmode=40000,user_id=0,group_id=0 hungfs \"$1\" && exec sleep 600",
        )
        .args(["sh", &mp]);
    w.holders
        .push(Daemon::spawn("fuse-holder", c, w.root.path()).unwrap());
    slurm_e2e::wait_until(
        "the FUSE mount",
        Duration::from_secs(10),
        Duration::from_millis(20),
        || Ok(w.mounted(&mp).filter(|e| e.fs_type == "fuse")),
    )
    .unwrap();

    let probe = env.root.join(mp.trim_start_matches('/'));
    let e = alive(&probe, Duration::from_millis(500)).await.unwrap_err();
    assert!(matches!(e, AliveError::Timeout { .. }), "{e}");
    assert!(e.to_string().contains("hung"), "{e}");
    // The first probe is still blocked: the second answers at once.
    let e = alive(&probe, Duration::from_secs(30)).await.unwrap_err();
    assert!(matches!(e, AliveError::StillHung { .. }), "{e}");

    // A [[mounts]] entry for it: already mounted (type fuse), so verified, and hung.
    let m = MountSettings {
        fs_type: "fuse".into(),
        source: "hungfs".into(),
        mount_point: mp.clone().into(),
        ..MountSettings::default()
    };
    let failed = mounts::ensure_all(&[m], "", &env, &systemd)
        .await
        .unwrap_err();
    assert!(failed.to_string().contains("hung"), "{failed}");

    // The holder dies: the connection is aborted and the blocked statfs returns.
    for h in &mut w.holders {
        h.stop().unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match alive(&probe, Duration::from_secs(1)).await {
            Err(AliveError::StillHung { .. } | AliveError::Timeout { .. })
                if std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            other => {
                // ENOTCONN from the aborted connection: not hung any more.
                assert!(matches!(other, Err(AliveError::Io { .. })), "{other:?}");
                break;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn existing_fstab_line_foreign_unit_or_mount_is_left_alone() {
    let w = World::start();
    let env = w.env();
    let systemd = w.systemd().await;

    let a = w.path("a");
    let fstab = format!("tmpfs {a} tmpfs defaults 0 0\n");
    std::fs::write(&env.fstab, &fstab).unwrap();
    let failed = mounts::ensure_all(&[tmpfs(&a)], "", &env, &systemd)
        .await
        .unwrap_err();
    assert!(
        failed
            .to_string()
            .contains("fstab line 1 already mounts it"),
        "{failed}"
    );
    assert!(failed.to_string().contains("left alone"), "{failed}");
    assert_eq!(std::fs::read_to_string(&env.fstab).unwrap(), fstab);
    assert!(!w.sd.unit_dir().join(mount_unit_name(&a)).exists());

    let b = w.path("b");
    let foreign = format!("[Mount]\nWhat=tmpfs\nWhere={b}\nType=tmpfs\n");
    let foreign_path = w.sd.unit_dir().join(mount_unit_name(&b));
    std::fs::write(&foreign_path, &foreign).unwrap();
    let failed = mounts::ensure_all(&[tmpfs(&b)], "", &env, &systemd)
        .await
        .unwrap_err();
    assert!(
        failed.to_string().contains("is not the agent's"),
        "{failed}"
    );
    assert_eq!(std::fs::read_to_string(&foreign_path).unwrap(), foreign);

    // Something else is mounted there (an ext4 where the entry wants tmpfs).
    let c = w.path("c");
    std::fs::create_dir_all(&c).unwrap();
    w.in_ns(&["mount", "-t", "tmpfs", "-o", "size=1m", "other", &c]);
    let m = MountSettings {
        fs_type: "ext4".into(),
        source: w.path("nothing.img"),
        mount_point: c.clone().into(),
        options: Some("loop".into()),
        ..MountSettings::default()
    };
    let failed = mounts::ensure_all(&[m], "", &env, &systemd)
        .await
        .unwrap_err();
    assert!(
        failed
            .to_string()
            .contains("tmpfs other is already mounted there"),
        "{failed}"
    );
    assert_eq!(w.mounted(&c).unwrap().source, "other");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_drains_for_a_failing_mount_and_lifts_only_its_own_drain() {
    let w = World::start();
    let env = w.env();
    let systemd = w.systemd().await;
    // The daemon's pass connects only when a mount must be made again.
    let on_demand = slurm_node_agent::systemd::OnDemand::new(&w.sd.bus_address());
    let ctld = Slurmctld::start("mounts").unwrap();
    let _node = Slurmd::dynamic(&ctld, "mnt1", "CPUs=1 RealMemory=500").unwrap();
    ctld.wait_node_idle("mnt1", Duration::from_secs(30))
        .unwrap();
    // The real scontrol, pointed at this controller.
    let wrapper = w.root.path().join("scontrol");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nSLURM_CONF={} exec {} \"$@\"\n",
            ctld.conf_path().display(),
            slurm_e2e::install::program("scontrol").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let scontrol = Scontrol {
        program: wrapper,
        timeout: Duration::from_secs(10),
        conf_server: String::new(),
        look: None,
    };
    // The mounts drain and lift through the drain state machine's gateway.
    let state_dir = w.root.path().join("state");
    let gateway = slurm_node_agent::node_state::Gateway::new(
        "mnt1",
        scontrol,
        &state_dir,
        Duration::from_secs(10),
        state_dir.join("drain.prom"),
    );
    let drain_state = || {
        let st = slurm_node_agent::node_state::Store::new(&state_dir)
            .load()
            .unwrap();
        (st.phase.as_str(), st.cause.map(|c| c.kind()))
    };

    let img = w.path("fs.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let mut c = Command::new("mkfs.ext4");
    c.args(["-q", "-F", &img]);
    run_ok(c, Duration::from_secs(60)).unwrap();
    let mp = w.path("data");
    let m = [MountSettings {
        fs_type: "ext4".into(),
        source: img.clone(),
        mount_point: mp.clone().into(),
        options: Some("loop".into()),
        ..MountSettings::default()
    }];
    let unit = mount_unit_name(&mp);
    let state = |ctld: &Slurmctld| ctld.node_state("mnt1").unwrap().unwrap_or_default();

    // Not mounted yet: mounted, nothing to do to the node.
    let r = mounts::reconcile(&m, "", &env, &on_demand, &gateway)
        .await
        .unwrap();
    assert_eq!(r.remounted, std::slice::from_ref(&mp));
    assert_eq!(r.node, NodeAction::None);

    // The file system goes away and cannot come back: drained, naming the mount.
    systemd.stop(&unit).await.unwrap();
    std::fs::rename(&img, format!("{img}.away")).unwrap();
    let r = mounts::reconcile(&m, "", &env, &on_demand, &gateway)
        .await
        .unwrap();
    assert_eq!(r.failing.len(), 1);
    let NodeAction::Drained(reason) = &r.node else {
        panic!("{r:?}")
    };
    assert!(
        reason.starts_with(&format!("slurm-node-agent/mount@unknown: {mp}: ")),
        "{reason}"
    );
    assert!(state(&ctld).contains("DRAIN"), "{}", state(&ctld));
    let shown = ctld.scontrol_ok(&["show", "node", "-o", "mnt1"]).unwrap();
    assert!(
        shown.contains(&format!("Reason=slurm-node-agent/mount@unknown: {mp}")),
        "{shown}"
    );
    // The drain is the state machine's: drain.json has it, and the metrics.
    assert_eq!(drain_state(), ("draining", Some("mount")));
    let prom = std::fs::read_to_string(state_dir.join("drain.prom")).unwrap();
    assert!(
        prom.contains("slurm_node_agent_drain_cause{kind=\"mount\"} 1"),
        "{prom}"
    );
    // A second pass changes nothing.
    let r = mounts::reconcile(&m, "", &env, &on_demand, &gateway)
        .await
        .unwrap();
    assert_eq!(r.node, NodeAction::None);

    // It comes back: mounted again and the agent's own drain lifted.
    std::fs::rename(format!("{img}.away"), &img).unwrap();
    let r = mounts::reconcile(&m, "", &env, &on_demand, &gateway)
        .await
        .unwrap();
    assert_eq!(r.remounted, std::slice::from_ref(&mp));
    assert_eq!(r.node, NodeAction::Resumed);
    assert_eq!(drain_state(), ("active", None));
    ctld.wait_node_idle("mnt1", Duration::from_secs(30))
        .unwrap();

    // Someone else's drain is never lifted nor overwritten.
    ctld.scontrol_ok(&[
        "update",
        "nodename=mnt1",
        "state=drain",
        "reason=disk replacement",
    ])
    .unwrap();
    systemd.stop(&unit).await.unwrap();
    std::fs::rename(&img, format!("{img}.away")).unwrap();
    let r = mounts::reconcile(&m, "", &env, &on_demand, &gateway)
        .await
        .unwrap();
    assert!(
        matches!(&r.node, NodeAction::DrainedByOther(why) if why == "disk replacement"),
        "{r:?}"
    );
    std::fs::rename(format!("{img}.away"), &img).unwrap();
    let r = mounts::reconcile(&m, "", &env, &on_demand, &gateway)
        .await
        .unwrap();
    assert_eq!(r.node, NodeAction::None);
    let shown = ctld.scontrol_ok(&["show", "node", "-o", "mnt1"]).unwrap();
    assert!(shown.contains("Reason=disk replacement"), "{shown}");
    systemd.stop(&unit).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_attempts_are_retried_with_backoff_until_the_source_appears() {
    let w = World::start();
    let env = w.env();
    let systemd = w.systemd().await;
    let img = w.path("late.img");
    let mp = w.path("late");
    let m = MountSettings {
        fs_type: "ext4".into(),
        source: img.clone(),
        mount_point: mp.clone().into(),
        options: Some("loop".into()),
        retry_for: HumanDuration(Duration::from_secs(60)),
        ..MountSettings::default()
    };
    // The image appears after the first attempts have failed.
    let late = img.clone();
    let maker = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        let tmp = format!("{late}.tmp");
        std::fs::File::create(&tmp)
            .unwrap()
            .set_len(16 << 20)
            .unwrap();
        let mut c = Command::new("mkfs.ext4");
        c.args(["-q", "-F", &tmp]);
        run_ok(c, Duration::from_secs(60)).unwrap();
        std::fs::rename(&tmp, &late).unwrap();
    });
    let canary = w.reload_canary(&systemd).await;
    let reports = mounts::ensure_all(&[m], "", &env, &systemd).await.unwrap();
    maker.join().unwrap();
    assert!(reports[0].attempts > 1, "{reports:?}");
    assert_eq!(w.mounted(&mp).unwrap().fs_type, "ext4");
    // The failed starts made no daemon-reload (the canary still needs one): the unit was
    // new, and a mount failing for itself is no stale unit (a reload while slurmd runs
    // can cost it its cgroup settings).
    assert!(
        systemd.needs_reload(canary).await.unwrap(),
        "a daemon-reload was made"
    );
    // The check can fail: asked when a unit changed on disk, the reload is made.
    assert!(systemd.reload_if_needed(&[canary]).await.unwrap());
    assert!(!systemd.needs_reload(canary).await.unwrap());
    assert!(!systemd.reload_if_needed(&[canary]).await.unwrap());
    systemd.stop(&mount_unit_name(&mp)).await.unwrap();
}

/// Benchmark, run by `scripts/bench-mounts.sh` (ignored in normal runs: it asserts no
/// timings). Per mount on tmpfs: the bare `mount -t tmpfs` (mount(8), as systemd runs it)
/// against the agent's whole path (unit written, Manager reloaded, job started and waited
/// for, mount table read, statfs), median over `BENCH_RUNS` runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: scripts/bench-mounts.sh"]
async fn bench_mount_overhead() {
    use std::io::{BufRead, BufReader, Write};
    use std::time::Instant;
    let runs: usize = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let w = World::start();
    let mut env = w.env();
    // The marker lives in /run on a node: a tmpfs, as /dev/shm is.
    let shm = tempfile::Builder::new()
        .prefix("bench-mounts-")
        .tempdir_in("/dev/shm")
        .unwrap();
    env.runtime_dir = shm.path().to_path_buf();
    let systemd = w.systemd().await;

    // Bare: a shell in the Manager's namespace runs mount(8) for each line it reads.
    let mut sh = Command::new("nsenter")
        .arg(format!("--mount=/proc/{}/ns/mnt", w.sd.pid()))
        .args(["--", "sh", "-c"])
        .arg("while read -r mp; do mount -t tmpfs -o size=4m,mode=0755 tmpfs \"$mp\" && echo ok || echo fail; done")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut to = sh.stdin.take().unwrap();
    let mut from = BufReader::new(sh.stdout.take().unwrap());
    let mut bare = Vec::new();
    for i in 0..runs {
        let mp = w.path(&format!("bare/{i}"));
        std::fs::create_dir_all(&mp).unwrap();
        let t = Instant::now();
        writeln!(to, "{mp}").unwrap();
        let mut line = String::new();
        from.read_line(&mut line).unwrap();
        bare.push(t.elapsed());
        assert_eq!(line.trim(), "ok");
        w.in_ns(&["umount", &mp]);
    }
    drop(to);
    let _ = sh.wait();

    // systemd reads the mount table at most 5 times a second (a rate limit on its
    // mountinfo event source) and a mount job ends only once it saw the mount: a burst of
    // mounts and unmounts would measure that limit. A boot mounts a handful, so each run
    // starts after a quiet second.
    let mut agent = Vec::new();
    let mut again = Vec::new();
    for i in 0..runs {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mp = w.path(&format!("agent/{i}"));
        let m = [tmpfs(&mp)];
        let t = Instant::now();
        mounts::ensure_all(&m, "", &env, &systemd).await.unwrap();
        agent.push(t.elapsed());
        let t = Instant::now();
        mounts::ensure_all(&m, "", &env, &systemd).await.unwrap();
        again.push(t.elapsed());
        let unit = mount_unit_name(&mp);
        systemd.stop(&unit).await.unwrap();
        std::fs::remove_file(w.sd.unit_dir().join(&unit)).unwrap();
    }
    // Where the time goes: the same steps one by one.
    let (mut write, mut job, mut check) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..runs {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mp = w.path(&format!("steps/{i}"));
        let spec = tmpfs(&mp).resolve("").unwrap();
        let t = Instant::now();
        mounts::install_unit(&spec, &env).unwrap();
        write.push(t.elapsed());
        let t = Instant::now();
        systemd.start(&spec.unit).await.unwrap();
        job.push(t.elapsed());
        let t = Instant::now();
        mounts::verify(&spec, &env).await.unwrap();
        check.push(t.elapsed());
        systemd.stop(&spec.unit).await.unwrap();
        std::fs::remove_file(w.sd.unit_dir().join(&spec.unit)).unwrap();
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let (b, a, r) = (median(&mut bare), median(&mut agent), median(&mut again));
    let added = a.saturating_sub(b);
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!();
    println!("runs per case:                 {runs}");
    println!("bare mount(8), median:         {:.2} ms", ms(b));
    println!("agent ensure_all, median:      {:.2} ms", ms(a));
    println!("agent, already mounted:        {:.2} ms", ms(r));
    println!(
        "agent steps, medians:          unit file write (fsync) {:.2} ms, start job (Manager: load, mount(8), JobRemoved) {:.2} ms, verify (mountinfo, statfs) {:.2} ms",
        ms(median(&mut write)),
        ms(median(&mut job)),
        ms(median(&mut check))
    );
    println!(
        "added by the agent per mount:  {:.2} ms (goal <= 20 ms: {:.2} of the goal)",
        ms(added),
        ms(added) / 20.0
    );
}
