//! A cgroup (v2) the agent owns for each command a check runs, so that the command and
//! everything it started, including a grandchild that called `setsid` (which leaves the
//! process group), is killed at once through `cgroup.kill`.
//!
//! The cgroup is `<the agent's own cgroup>/slurm-node-agent-cmd-<agent pid>-<n>` in the
//! unified (v2) hierarchy, found from `/proc/self/cgroup` (`0::<path>`) and the `cgroup2`
//! mount in `/proc/self/mountinfo` (`/sys/fs/cgroup` on a pure v2 host,
//! `/sys/fs/cgroup/unified` on a hybrid one). No controller is enabled in it, so it is
//! allowed below a cgroup that holds processes. The child is moved into it right after
//! `spawn` returns (std returns only once the `exec` succeeded, before a dynamically
//! linked program has run any of its own code), and any process it forked before the move
//! is moved after it. Where no cgroup can be made (no cgroup v2, no permission) commands
//! fall back to their process group alone, and the result says so.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Folder name prefix of the command cgroups.
pub const PREFIX: &str = "slurm-node-agent-cmd-";

/// The cgroup v2 folder the agent runs in.
///
/// # Errors
/// No cgroup v2 hierarchy, or `/proc` unreadable.
pub fn own_cgroup() -> Result<PathBuf, String> {
    let cg = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("reading /proc/self/cgroup: {e}"))?;
    let rel = cg
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or("no cgroup v2 entry (0::) in /proc/self/cgroup")?;
    let mi = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("reading /proc/self/mountinfo: {e}"))?;
    // mountinfo: id parent maj:min root mount-point options... - fstype source superopts
    let mount = mi
        .lines()
        .find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            (post.split_whitespace().next()? == "cgroup2")
                .then(|| pre.split_whitespace().nth(4).map(str::to_string))?
        })
        .ok_or("no cgroup2 file system mounted")?;
    Ok(Path::new(&mount).join(rel.trim().trim_start_matches('/')))
}

/// One command's cgroup; killed and removed on drop.
#[derive(Debug)]
pub struct CmdCgroup {
    dir: PathBuf,
    parent: PathBuf,
}

impl CmdCgroup {
    /// Creates a new command cgroup below the agent's own.
    ///
    /// # Errors
    /// A message saying why not (the caller falls back to the process group).
    pub fn create() -> Result<CmdCgroup, String> {
        static N: AtomicU64 = AtomicU64::new(0);
        let parent = own_cgroup()?;
        let n = N.fetch_add(1, Ordering::Relaxed);
        if n == 0 {
            sweep(&parent);
        }
        let dir = parent.join(format!("{PREFIX}{}-{n}", std::process::id()));
        std::fs::create_dir(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        Ok(CmdCgroup { dir, parent })
    }

    /// The cgroup's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Moves `pid` into the cgroup, and then any process still in the parent cgroup whose
    /// parent is `pid` or one already moved (forked before the move).
    ///
    /// # Errors
    /// `pid` could not be moved.
    pub fn adopt(&self, pid: u32) -> Result<(), String> {
        let procs = self.dir.join("cgroup.procs");
        std::fs::write(&procs, pid.to_string())
            .map_err(|e| format!("moving {pid} into {}: {e}", self.dir.display()))?;
        let mut moved = vec![pid];
        loop {
            let mut more = false;
            for p in read_procs(&self.parent) {
                if moved.contains(&p) {
                    continue;
                }
                if ppid(p).is_some_and(|pp| moved.contains(&pp))
                    && std::fs::write(&procs, p.to_string()).is_ok()
                {
                    moved.push(p);
                    more = true;
                }
            }
            if !more {
                return Ok(());
            }
        }
    }

    /// The processes in the cgroup.
    pub fn procs(&self) -> Vec<u32> {
        read_procs(&self.dir)
    }

    /// SIGKILL to every process in the cgroup: `cgroup.kill` (Linux 5.14+), else each pid
    /// in `cgroup.procs` until none is left (a few rounds, for processes forking meanwhile).
    pub fn kill(&self) {
        if std::fs::write(self.dir.join("cgroup.kill"), "1").is_ok() {
            return;
        }
        for _ in 0..10 {
            let procs = self.procs();
            if procs.is_empty() {
                return;
            }
            for p in procs {
                if let Some(pid) = rustix::process::Pid::from_raw(p as i32) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
        }
    }
}

/// Removes command cgroups left by agents that exited before removing them (empty ones
/// only: a cgroup with processes cannot be removed anyway).
fn sweep(parent: &Path) {
    let Ok(rd) = std::fs::read_dir(parent) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

impl Drop for CmdCgroup {
    fn drop(&mut self) {
        self.kill();
        // Killed processes leave the cgroup within moments.
        for _ in 0..5 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        // Killed processes leave the cgroup a moment later; remove it then, off the
        // caller's thread.
        let dir = self.dir.clone();
        let _ = std::thread::Builder::new()
            .name("cgroup-rmdir".into())
            .stack_size(64 * 1024)
            .spawn(move || {
                for _ in 0..250 {
                    std::thread::sleep(Duration::from_millis(20));
                    if std::fs::remove_dir(&dir).is_ok() || !dir.exists() {
                        return;
                    }
                }
                tracing::warn!("could not remove cgroup {}", dir.display());
            });
    }
}

fn read_procs(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn ppid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ppid ...: comm may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}
