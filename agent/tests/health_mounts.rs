//! Mount checks against real mounts, in a private mount namespace (`unshare -m
//! --propagation private`, so nothing leaks to the machine): tmpfs with space and inode
//! thresholds, a loop-mounted ext4, a read-only remount, and a FUSE file system whose
//! server answers INIT and then never answers again (every getattr/statfs blocks), to play
//! a hung Lustre mount.
//!
//! The outer test re-runs this test binary under `unshare`; the inner test does the work
//! (it is `#[ignore]`d so that it only runs when asked for, inside the namespace).
//! Needs root, `unshare`, `mount`, `mkfs.ext4`, `/dev/fuse` and `/dev/loop-control`.
#![allow(clippy::unwrap_used)]

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use slurm_node_agent::health::{self, nhc, RunEnv, Status};

const INNER_ENV: &str = "SLURM_NODE_AGENT_HEALTH_MOUNTS_INNER";

#[test]
fn mount_checks_in_a_private_mount_namespace() {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private"])
        .arg(&exe)
        .args([
            "--exact",
            "inner_mount_checks",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(INNER_ENV, "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "inner test failed:\n{text}");
    assert!(text.contains("test inner_mount_checks ... ok"), "{text}");
    assert!(text.contains("1 passed"), "{text}");
}

async fn run_nhc(text: &str) -> health::Report {
    let set = nhc::parse(
        text,
        Path::new("/test/nhc.conf"),
        Some("node1"),
        &nhc::Defaults {
            timeout: Duration::from_secs(1),
            slurm_bin_dir: std::path::PathBuf::new(),
        },
    )
    .unwrap();
    health::run_checks(&set, &RunEnv::default()).await
}

fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn expect(r: &health::Report, want: &[Status]) {
    let got: Vec<Status> = r.results.iter().map(|x| x.status).collect();
    assert_eq!(got, want, "{:#?}", r.results);
}

/// A FUSE server that answers FUSE_INIT, then stops reading: every later request
/// (getattr, statfs) waits forever, as on a dead Lustre server. Requests stay unread so
/// that the waiting threads remain killable; [`abort_fuse`] ends them.
fn mount_hung_fuse(target: &Path) -> File {
    let dev = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .unwrap();
    let data = std::ffi::CString::new(format!(
        "fd={},rootmode=40000,user_id=0,group_id=0",
        dev.as_raw_fd()
    ))
    .unwrap();
    rustix::mount::mount(
        "hungfs",
        target,
        "fuse.hungfs",
        rustix::mount::MountFlags::empty(),
        data.as_c_str(),
    )
    .unwrap();
    let mut reader = dev.try_clone().unwrap();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let Ok(n) = reader.read(&mut buf) else { return };
            if n < 40 {
                continue;
            }
            let opcode = u32::from_ne_bytes(buf[4..8].try_into().unwrap());
            let unique = u64::from_ne_bytes(buf[8..16].try_into().unwrap());
            if opcode != 26 {
                // FUSE_GETATTR, FUSE_STATFS...: never answered.
                continue;
            }
            let max_readahead = u32::from_ne_bytes(buf[48..52].try_into().unwrap());
            let mut reply = Vec::with_capacity(80);
            reply.extend_from_slice(&80u32.to_ne_bytes()); // len
            reply.extend_from_slice(&0i32.to_ne_bytes()); // error
            reply.extend_from_slice(&unique.to_ne_bytes());
            reply.extend_from_slice(&7u32.to_ne_bytes()); // major
            reply.extend_from_slice(&26u32.to_ne_bytes()); // minor
            reply.extend_from_slice(&max_readahead.to_ne_bytes());
            reply.extend_from_slice(&0u32.to_ne_bytes()); // flags
            reply.extend_from_slice(&16u16.to_ne_bytes()); // max_background
            reply.extend_from_slice(&12u16.to_ne_bytes()); // congestion_threshold
            reply.extend_from_slice(&4096u32.to_ne_bytes()); // max_write
            reply.extend_from_slice(&1u32.to_ne_bytes()); // time_gran
            reply.extend_from_slice(&[0u8; 4 + 4 + 28]); // max_pages, map_alignment, flags2, unused
            assert_eq!(reply.len(), 80);
            let _ = reader.write(&reply);
            return;
        }
    });
    dev
}

/// Aborts the FUSE connection of the mount at `target` through fusectl, so the threads
/// waiting on it get ENOTCONN and the process can exit. The connection number is the
/// mount's device minor, read from `/proc/self/mountinfo` (never stat the hung mount).
fn abort_fuse(target: &Path) {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let t = target.display().to_string();
    let line = info
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(t.as_str()))
        .unwrap();
    let minor = line
        .split(' ')
        .nth(2)
        .unwrap()
        .split(':')
        .nth(1)
        .unwrap()
        .to_string();
    let ctl = Path::new("/sys/fs/fuse/connections");
    if !ctl.join(&minor).exists() {
        // Private mount namespace: mounting fusectl here is invisible outside.
        sh(&[
            "mount",
            "-t",
            "fusectl",
            "fusectl",
            "/sys/fs/fuse/connections",
        ]);
    }
    fs::write(ctl.join(&minor).join("abort"), "1").unwrap();
}

#[tokio::test]
#[ignore = "runs inside a private mount namespace, started by mount_checks_in_a_private_mount_namespace"]
async fn inner_mount_checks() {
    if std::env::var_os(INNER_ENV).is_none() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let p = |n: &str| -> PathBuf {
        let d = root.path().join(n);
        fs::create_dir_all(&d).unwrap();
        d
    };

    // tmpfs: type, rw, free space and inodes, with units.
    let t = p("tmpfs");
    let ts = t.display().to_string();
    sh(&[
        "mount",
        "-t",
        "tmpfs",
        "-o",
        "size=16m,nr_inodes=200",
        "tmpfs",
        &ts,
    ]);
    let r = run_nhc(&format!(
        "* || check_fs_mount_rw -t tmpfs -s tmpfs -f {ts}\n\
         * || check_fs_mount -t ext4 -f {ts}\n\
         * || check_fs_free {ts} 50%\n\
         * || check_fs_free {ts} 8M\n\
         * || check_fs_ifree {ts} 100\n\
         * || check_fs_ifree {ts} 100k\n\
         * || check_fs_size {ts} 15M 17M\n"
    ))
    .await;
    expect(
        &r,
        &[
            Status::Pass,
            Status::Fail,
            Status::Pass,
            Status::Pass,
            Status::Pass,
            Status::Fail,
            Status::Pass,
        ],
    );
    assert!(
        r.results[1].message.contains("has type tmpfs"),
        "{}",
        r.results[1].message
    );
    assert!(
        r.results[5].message.contains("minimum is 100000"),
        "{}",
        r.results[5].message
    );
    // Fill it: 15 of 16 MiB and 150 of 200 inodes.
    let mut f = File::create(t.join("big")).unwrap();
    f.write_all(&vec![1u8; 15 << 20]).unwrap();
    f.sync_all().unwrap();
    for i in 0..150 {
        File::create(t.join(format!("f{i}"))).unwrap();
    }
    let r = run_nhc(&format!(
        "* || check_fs_free {ts} 10%\n\
         * || check_fs_used {ts} 80%\n\
         * || check_fs_ifree {ts} 25%\n\
         * || check_fs_iused {ts} 100\n"
    ))
    .await;
    expect(
        &r,
        &[Status::Fail, Status::Fail, Status::Fail, Status::Fail],
    );
    assert!(
        r.results[0].message.contains("% free"),
        "{}",
        r.results[0].message
    );

    // Loop-mounted ext4, then remounted read-only.
    let img = root.path().join("ext4.img");
    File::create(&img).unwrap().set_len(32 << 20).unwrap();
    sh(&["mkfs.ext4", "-q", "-F", &img.display().to_string()]);
    let e = p("ext4");
    let es = e.display().to_string();
    sh(&["mount", "-o", "loop", &img.display().to_string(), &es]);
    let r = run_nhc(&format!(
        "* || check_fs_mount_rw -t ext4 -s '/^\\\\/dev\\\\/loop[0-9]+$/' -f {es}\n\
         * || check_fs_mount_ro -f {es}\n\
         * || check_file_test -w {es}\n"
    ))
    .await;
    expect(&r, &[Status::Pass, Status::Fail, Status::Pass]);
    sh(&["mount", "-o", "remount,ro", &es]);
    let r = run_nhc(&format!(
        "* || check_fs_mount_rw -f {es}\n\
         * || check_fs_mount_ro -t ext4 -f {es}\n\
         * || check_file_test -w {es}\n"
    ))
    .await;
    expect(&r, &[Status::Fail, Status::Pass, Status::Fail]);
    assert!(
        r.results[0].message.contains("mount options ro,"),
        "{}",
        r.results[0].message
    );
    // The agent's own mount check sees the read-only flag through statfs too.
    let toml = format!("[[check]]\nkind = \"mount\"\npath = \"{es}\"\nwritable = true\n");
    let set = health::checksd::parse(
        &toml,
        Path::new("/test/a.toml"),
        &health::Target::for_node(Some("node1")),
        &nhc::Defaults {
            timeout: Duration::from_secs(2),
            slurm_bin_dir: std::path::PathBuf::new(),
        },
    )
    .unwrap();
    let r = health::run_checks(&set, &RunEnv::default()).await;
    expect(&r, &[Status::Fail]);

    // A hung FUSE mount: listed in /proc/mounts, every statfs blocks.
    let h = p("hung");
    let hs = h.display().to_string();
    let _dev = mount_hung_fuse(&h);
    let mounts = fs::read_to_string("/proc/mounts").unwrap();
    assert!(mounts.contains(&format!(" {hs} fuse.hungfs ")), "{mounts}");
    let start = Instant::now();
    let r = run_nhc(&format!(
        "* || check_fs_mount_rw -f {hs}\n\
         * || check_fs_free {hs} 1%\n\
         * || check_fs_mount_rw -t tmpfs -f {ts}\n"
    ))
    .await;
    let took = start.elapsed();
    expect(&r, &[Status::Timeout, Status::Timeout, Status::Pass]);
    assert!(
        r.results[0]
            .message
            .contains(&format!("file system at {hs}")),
        "{}",
        r.results[0].message
    );
    // Each check waited its own 1 s timeout, at the same time: the agent did not hang.
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let reason = r.drain_reason("unknown").unwrap();
    assert!(
        reason.contains(&hs) && reason.ends_with("(+1 more)"),
        "{reason}"
    );
    // The stuck threads are remembered: the next run does not start new ones.
    let r = run_nhc(&format!("* || check_fs_mount_rw -f {hs}\n")).await;
    expect(&r, &[Status::Timeout]);
    assert!(
        r.results[0]
            .message
            .contains("still hung since a previous run"),
        "{}",
        r.results[0].message
    );
    // Six checks on the hung mount, each with a 100 s timeout, under a 3 s run deadline:
    // they run concurrently, so each one is found hung (started, left running) at the
    // deadline, none is "not started", and the run ends there.
    let six = nhc::parse(
        &format!(
            "* || check_fs_mount -f {hs}\n* || check_fs_used {hs} 99%\n\
             * || check_fs_ifree {hs} 1\n* || check_fs_size {hs} 1k\n\
             * || check_file_test -d {hs}\n* || check_fs_inodes {hs} 1\n"
        ),
        Path::new("/test/six.conf"),
        Some("node1"),
        &nhc::Defaults {
            timeout: Duration::from_secs(100),
            slurm_bin_dir: std::path::PathBuf::new(),
        },
    )
    .unwrap();
    let env = RunEnv {
        run_deadline: Duration::from_secs(3),
        ..RunEnv::default()
    };
    let r = health::run_checks(&six, &env).await;
    expect(&r, &[Status::Timeout; 6]);
    for res in &r.results {
        assert!(
            res.message.contains("run deadline (3s") && res.message.contains("left running"),
            "{res:?}"
        );
    }
    let reason = r.drain_reason("unknown").unwrap();
    assert!(
        reason.starts_with(&format!(
            "slurm-node-agent/health@unknown: check_fs_mount -f {hs}: hung"
        )),
        "{reason}"
    );
    // Once the file system answers again (here: the connection is aborted, so statfs
    // fails at once), the check runs again and fails instead of timing out.
    abort_fuse(&h);
    std::thread::sleep(Duration::from_millis(200));
    let r = run_nhc(&format!("* || check_fs_free {hs} 1%\n")).await;
    expect(&r, &[Status::Fail]);
    assert!(
        r.results[0].message.contains("statfs"),
        "{}",
        r.results[0].message
    );
}
