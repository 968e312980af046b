//! Node-local scratch against real block devices: loop devices over sparse files, presented
//! the way the kernel presents instance storage (a by-id folder of the test's own with
//! `nvme-Amazon_EC2_NVMe_Instance_Storage_<serial>` links, and an EBS-named one that must
//! be ignored), then the real `scratch::ensure`: `blkid`, `mkfs.btrfs`, `mount`.
//!
//! Needs root, `losetup`, `blkid` and `mkfs.btrfs` (btrfs-progs). What it cannot reach:
//! udev's names of real NVMe disks, the model check of `/sys/dev/block/*/device/model`
//! (loop devices have none: [`Probe::allow_loop`] skips it), and the instance type's disk
//! count.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use slurm_node_agent::scratch::{
    ensure, Action, Outcome, Probe, Runner, ScratchEnv, ScratchError, ScratchSettings,
};
use slurm_node_agent::section::HumanDuration;

const STORE: &str = "nvme-Amazon_EC2_NVMe_Instance_Storage_";

/// Loop devices, links and mounts of one test; all undone on drop, even after a failure.
struct Lab {
    dir: tempfile::TempDir,
    loops: Vec<String>,
}

fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

impl Lab {
    fn new() -> Lab {
        assert!(
            rustix::process::geteuid().is_root(),
            "the scratch tests make loop devices and mount file systems: run them as root"
        );
        let dir = tempfile::Builder::new()
            .prefix("agent-scratch-")
            .tempdir()
            .unwrap();
        std::fs::create_dir(dir.path().join("by-id")).unwrap();
        Lab {
            dir,
            loops: Vec::new(),
        }
    }

    /// A new loop device over a sparse file of `mib` MiB.
    fn disk(&mut self, mib: u64) -> String {
        let file = self
            .dir
            .path()
            .join(format!("disk{}.img", self.loops.len()));
        let f = std::fs::File::create(&file).unwrap();
        f.set_len(mib * 1024 * 1024).unwrap();
        let dev = run("losetup", &["-f", "--show", file.to_str().unwrap()]);
        self.loops.push(dev.clone());
        dev
    }

    /// `by-id/<name>` → `dev`.
    fn link(&self, name: &str, dev: &str) {
        let l = self.dir.path().join("by-id").join(name);
        let _ = std::fs::remove_file(&l);
        std::os::unix::fs::symlink(dev, l).unwrap();
    }

    fn unlink(&self, name: &str) {
        std::fs::remove_file(self.dir.path().join("by-id").join(name)).unwrap();
    }

    fn mount_point(&self) -> PathBuf {
        self.dir.path().join("scratch")
    }

    fn settings(&self) -> ScratchSettings {
        ScratchSettings {
            mount_point: self.mount_point(),
            wait: HumanDuration(Duration::from_secs(3)),
            ..ScratchSettings::default()
        }
    }

    fn env(&self, allow_loop: bool) -> ScratchEnv {
        ScratchEnv {
            probe: Probe {
                by_id_dir: self.dir.path().join("by-id"),
                allow_loop,
                ..Probe::system()
            },
            runner: Runner {
                timeout: Duration::from_secs(60),
                ..Runner::default()
            },
            settle: Duration::from_millis(100),
            ..ScratchEnv::system()
        }
    }

    fn ensure(&self) -> Result<Outcome, ScratchError> {
        ensure(&self.settings(), &self.env(true))
    }

    fn umount(&self) {
        run("umount", &[self.mount_point().to_str().unwrap()]);
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let mp = self.mount_point();
        while Command::new("mountpoint")
            .args(["-q", mp.to_str().unwrap()])
            .status()
            .is_ok_and(|s| s.success())
        {
            if !Command::new("umount")
                .arg(&mp)
                .status()
                .is_ok_and(|s| s.success())
            {
                let _ = Command::new("umount").arg("-l").arg(&mp).status();
                break;
            }
        }
        for dev in &self.loops {
            // The kernel's btrfs keeps a list of the members it saw: forget ours.
            let _ = Command::new("btrfs")
                .args(["device", "scan", "--forget", dev])
                .output();
            let _ = Command::new("losetup").args(["-d", dev]).status();
        }
    }
}

fn ready(o: Outcome) -> slurm_node_agent::scratch::Ready {
    match o {
        Outcome::Ready(r) => r,
        other => panic!("scratch not ready: {other:?}"),
    }
}

fn fsid(dev: &str) -> String {
    run("blkid", &["-p", "-o", "value", "-s", "UUID", dev])
}

fn blank(dev: &str) -> bool {
    Command::new("blkid")
        .args(["-p", dev])
        .status()
        .unwrap()
        .code()
        == Some(2)
}

#[test]
fn one_disk_is_made_mounted_1777_and_kept_across_a_reboot() {
    let mut lab = Lab::new();
    let d = lab.disk(300);
    let ebs = lab.disk(300);
    lab.link(&format!("{STORE}AWS11111111111111111"), &d);
    lab.link("nvme-Amazon_Elastic_Block_Store_vol0123456789abcdef0", &ebs);

    let r = ready(lab.ensure().unwrap());
    assert_eq!(r.action, Action::Created);
    assert_eq!(r.disks, vec![format!("{STORE}AWS11111111111111111")]);
    assert!((200..=300).contains(&r.size_mib), "{r:?}");
    let mode = std::fs::metadata(lab.mount_point())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o1777);
    assert!(blank(&ebs), "the EBS volume was touched");
    let made = fsid(&d);
    std::fs::write(lab.mount_point().join("job.out"), "kept").unwrap();

    // Again: nothing to do.
    assert_eq!(ready(lab.ensure().unwrap()).action, Action::AlreadyMounted);
    // A reboot: unmounted, the disk keeps its data; mounted again, never re-made.
    lab.umount();
    let r = ready(lab.ensure().unwrap());
    assert_eq!(r.action, Action::Assembled);
    assert_eq!(fsid(&d), made);
    assert_eq!(
        std::fs::read_to_string(lab.mount_point().join("job.out")).unwrap(),
        "kept"
    );
}

#[test]
fn two_disks_are_striped_and_reassembled() {
    let mut lab = Lab::new();
    let a = lab.disk(300);
    let b = lab.disk(300);
    lab.link(&format!("{STORE}AWS2222222222222222A"), &a);
    lab.link(&format!("{STORE}AWS2222222222222222B"), &b);
    // An alias of the same disk (newer udev adds `_1`) and a partition name: one disk.
    lab.link(&format!("{STORE}AWS2222222222222222A_1"), &a);
    lab.link(&format!("{STORE}AWS2222222222222222A-part1"), &b);

    let r = ready(lab.ensure().unwrap());
    assert_eq!(r.action, Action::Created);
    assert_eq!(r.disks.len(), 2, "{r:?}");
    assert!(r.size_mib > 450, "raid0 over 2 × 300 MiB: {r:?}");
    assert_eq!(fsid(&a), fsid(&b));
    let made = fsid(&a);
    std::fs::write(lab.mount_point().join("f"), "x").unwrap();
    lab.umount();
    let r = ready(lab.ensure().unwrap());
    assert_eq!(r.action, Action::Assembled);
    assert_eq!(fsid(&a), made);
    assert!(lab.mount_point().join("f").exists());
}

#[test]
fn a_half_made_array_is_refused_naming_the_disk_and_nothing_is_re_created() {
    let mut lab = Lab::new();
    let a = lab.disk(300);
    let b = lab.disk(300);
    let (na, nb) = (
        format!("{STORE}AWS3333333333333333A"),
        format!("{STORE}AWS3333333333333333B"),
    );
    lab.link(&na, &a);
    lab.link(&nb, &b);
    ready(lab.ensure().unwrap());
    let made = fsid(&a);
    lab.umount();
    // The second member is replaced by a blank disk (or vanished and came back empty).
    let c = lab.disk(300);
    lab.link(&nb, &c);
    let e = lab.ensure().unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, ScratchError::Incomplete { .. }), "{text}");
    assert!(text.contains(&format!("{nb} ({c}) is blank")), "{text}");
    assert!(text.contains(&format!("{na} ({a}) is devid")), "{text}");
    assert!(text.contains("nothing re-created"), "{text}");
    assert_eq!(fsid(&a), made, "the intact member was re-made");
    assert!(blank(&c), "the blank disk was written");

    // A member that vanished: only one of two appears, within the bound.
    lab.unlink(&nb);
    let start = std::time::Instant::now();
    let e = lab.ensure().unwrap_err().to_string();
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(e.contains("devid 2 not found"), "{e}");
}

#[test]
fn a_disk_too_small_is_refused_and_left_blank() {
    let mut lab = Lab::new();
    let d = lab.disk(16);
    let name = format!("{STORE}AWS44444444444444444");
    lab.link(&name, &d);
    let e = lab.ensure().unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, ScratchError::TooSmall { .. }), "{text}");
    assert!(text.contains(&name) && text.contains("16 MiB"), "{text}");
    assert!(blank(&d));
}

#[test]
fn only_ebs_is_nothing_to_do_and_disabled_touches_nothing() {
    let mut lab = Lab::new();
    let ebs = lab.disk(300);
    lab.link("nvme-Amazon_Elastic_Block_Store_vol0123456789abcdef0", &ebs);
    assert_eq!(lab.ensure().unwrap(), Outcome::NoDisks);
    let d = lab.disk(300);
    lab.link(&format!("{STORE}AWS55555555555555555"), &d);
    let mut s = lab.settings();
    s.enabled = false;
    assert_eq!(ensure(&s, &lab.env(true)).unwrap(), Outcome::Disabled);
    assert!(blank(&d) && blank(&ebs));
}

#[test]
fn a_loop_device_is_refused_without_the_tests_allowance() {
    let mut lab = Lab::new();
    let d = lab.disk(300);
    let name = format!("{STORE}AWS66666666666666666");
    lab.link(&name, &d);
    let e = ensure(&lab.settings(), &lab.env(false))
        .unwrap_err()
        .to_string();
    assert!(e.contains(&name) && e.contains("loop device"), "{e}");
    assert!(blank(&d));
}

#[test]
fn fewer_disks_than_expected_within_the_bound_is_an_error_naming_the_found() {
    let mut lab = Lab::new();
    let d = lab.disk(300);
    let name = format!("{STORE}AWS77777777777777777");
    lab.link(&name, &d);
    let mut s = lab.settings();
    s.disks = 2;
    s.wait = HumanDuration(Duration::from_secs(1));
    let e = ensure(&s, &lab.env(true)).unwrap_err().to_string();
    assert!(e.contains("1 of the 2") && e.contains(&name), "{e}");
    assert!(blank(&d));
}

#[test]
fn another_file_system_is_left_alone() {
    let mut lab = Lab::new();
    let d = lab.disk(300);
    let name = format!("{STORE}AWS88888888888888888");
    lab.link(&name, &d);
    if Command::new("mkfs.ext4").args(["-q", &d]).status().is_err() {
        eprintln!("mkfs.ext4 not found: skipped");
        return;
    }
    let e = lab.ensure().unwrap_err().to_string();
    assert!(
        e.contains(&name) && e.contains("ext4") && e.contains("left alone"),
        "{e}"
    );
    let _ = Path::new(&d);
}
