//! The image's rotation of cloud-init's logs (`packer/files/logrotate/slurm-image-cloud-init`),
//! run by Debian's real `logrotate` on a file pushed past its cap, read meanwhile by a
//! stand-in for the CloudWatch agent's file follower: it follows the file by name, and when
//! the name points at a new inode it reads the old one to its end first, then the new one
//! from its start. No line is lost and none is read twice across the rotation, and the live
//! file is below the cap after each rotation.
#![allow(clippy::unwrap_used)]

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const RULE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../packer/files/logrotate/slurm-image-cloud-init"
);

/// The stand-in follower: the open file, its inode, and a partial line kept until its end.
struct Follower {
    path: PathBuf,
    reader: Option<(BufReader<File>, u64)>,
    partial: String,
    lines: Vec<String>,
}

impl Follower {
    fn new(path: &Path) -> Follower {
        Follower {
            path: path.to_path_buf(),
            reader: None,
            partial: String::new(),
            lines: Vec::new(),
        }
    }

    /// Reads what is there now: the open file to its end, then, when the name points at
    /// another inode, that file from its start.
    fn poll(&mut self) {
        loop {
            if self.reader.is_none() {
                let Ok(f) = File::open(&self.path) else {
                    return;
                };
                let ino = f.metadata().unwrap().ino();
                self.reader = Some((BufReader::new(f), ino));
            }
            let (r, ino) = self.reader.as_mut().unwrap();
            loop {
                let mut buf = String::new();
                if r.read_line(&mut buf).unwrap() == 0 {
                    break;
                }
                self.partial.push_str(&buf);
                if self.partial.ends_with('\n') {
                    self.lines
                        .push(std::mem::take(&mut self.partial).trim_end().to_string());
                }
            }
            match std::fs::metadata(&self.path) {
                Ok(m) if m.ino() != *ino => self.reader = None, // rotated: the new file next
                _ => return,
            }
        }
    }
}

/// Appends lines `from..to` to `path`, opening it by name as each cloud-init stage does.
fn write_lines(path: &Path, from: usize, to: usize) {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    let mut buf = String::new();
    for i in from..to {
        // ~100 bytes a line, as cloud-init's log lines are.
        buf.push_str(&format!(
            "{i:08} 2026-12-07 10:00:00,000 - util.py[DEBUG]: Running command ['true'] with allowed return codes [0]\n"
        ));
        if buf.len() > 1 << 20 {
            f.write_all(buf.as_bytes()).unwrap();
            buf.clear();
        }
    }
    f.write_all(buf.as_bytes()).unwrap();
}

#[test]
fn a_rotation_loses_no_line_and_repeats_none_and_caps_the_file() {
    if !Path::new("/usr/sbin/logrotate").exists() {
        panic!("logrotate is missing: scripts/test-deps.sh installs it");
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("cloud-init.log");
    let other = dir.path().join("cloud-init-output.log");
    let rule = std::fs::read_to_string(RULE).unwrap();
    assert!(
        rule.contains("size 50M") && !rule.lines().any(|l| l.trim() == "copytruncate"),
        "{rule}"
    );
    // The shipped rule on this test's files (root-owned as in an image: logrotate refuses
    // a configuration others can write).
    let conf = dir.path().join("logrotate.conf");
    std::fs::write(
        &conf,
        rule.replace("/var/log/cloud-init.log", log.to_str().unwrap())
            .replace("/var/log/cloud-init-output.log", other.to_str().unwrap()),
    )
    .unwrap();
    let state = dir.path().join("logrotate.state");
    let rotate = || {
        let out = Command::new("/usr/sbin/logrotate")
            .arg("--state")
            .arg(&state)
            .arg(&conf)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let cap = 50 << 20;
    let mut follower = Follower::new(&log);

    // Below the cap: nothing rotates.
    write_lines(&log, 0, 100_000);
    follower.poll();
    rotate();
    assert!(!dir.path().join("cloud-init.log.1").exists());

    // Pushed past the cap, half read: rotated by name; the rest of the old file is read
    // through the open descriptor, then the new file.
    write_lines(&log, 100_000, 600_000);
    assert!(std::fs::metadata(&log).unwrap().len() > cap);
    follower.poll();
    write_lines(&log, 600_000, 650_000);
    rotate();
    assert!(dir.path().join("cloud-init.log.1").exists());
    assert!(std::fs::metadata(&log).unwrap().len() < cap);
    write_lines(&log, 650_000, 700_000);
    follower.poll();

    // Past the cap again: a second generation, still nothing lost.
    write_lines(&log, 700_000, 1_250_000);
    rotate();
    write_lines(&log, 1_250_000, 1_260_000);
    follower.poll();
    assert!(dir.path().join("cloud-init.log.2").exists());

    let want: Vec<usize> = (0..1_260_000).collect();
    let got: Vec<usize> = follower
        .lines
        .iter()
        .map(|l| l[..8].parse().unwrap())
        .collect();
    let first_bad = got.iter().zip(&want).position(|(a, b)| a != b);
    assert!(
        got.len() == want.len() && first_bad.is_none(),
        "{} lines read of {}; first out of order at {first_bad:?}",
        got.len(),
        want.len()
    );
    // The live file is below the cap after each rotation; the generations kept are the
    // rule's `rotate 3`.
    assert!(std::fs::metadata(&log).unwrap().len() < cap);
    assert!(!dir.path().join("cloud-init.log.4").exists());
}
