//! A cgroup (v2) the agent owns for each command a check runs, so that the command and
//! everything it started, including a grandchild that called `setsid` (which leaves the
//! process group), is killed at once through `cgroup.kill`.
//!
//! The cgroup is `<the agent's own cgroup>/slurm-node-agent-cmd-<agent pid>-<n>` in the
//! unified (v2) hierarchy, found once per process from `/proc/self/cgroup` (`0::<path>`)
//! and the `cgroup2` mount in `/proc/self/mountinfo` (`/sys/fs/cgroup` on a pure v2 host,
//! `/sys/fs/cgroup/unified` on a hybrid one). No controller is enabled in it, so it is
//! allowed below a cgroup that holds processes. The child joins it itself, between `fork`
//! and `exec` ([`CmdCgroup::join_before_exec`]: it writes `0` to the cgroup's
//! `cgroup.procs`, opened by the parent), so the program and every process it starts
//! are in it from their first instruction: there is no window in which a child could fork
//! outside it. Where no cgroup can be made or joined (no cgroup v2, no permission)
//! commands fall back to their process group alone, and the result says so.

use super::facts::{HostIo, HostOp};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// Folder name prefix of the command cgroups.
pub const PREFIX: &str = "slurm-node-agent-cmd-";

/// Why a command cgroup cannot be made or joined (the caller falls back to the process
/// group); each variant names the file or folder concerned.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CgroupError {
    /// A file under `/proc/self` could not be read, the command's cgroup folder created or
    /// its `cgroup.procs` opened for writing.
    #[error(transparent)]
    Io(#[from] HostIo),
    /// `/proc/self/cgroup` has no `0::` line (no cgroup v2).
    #[error("no cgroup v2 entry (0::) in {}", path.display())]
    NoV2Entry {
        /// The file read (`/proc/self/cgroup`).
        path: PathBuf,
    },
    /// No `cgroup2` line in `/proc/self/mountinfo`.
    #[error("no cgroup2 file system mounted")]
    NotMounted {
        /// The file read (`/proc/self/mountinfo`).
        mountinfo: PathBuf,
    },
}

/// The cgroup v2 folder the agent runs in, read once per process (a service's cgroup does
/// not change while it runs).
///
/// # Errors
/// [`CgroupError`]: no cgroup v2 hierarchy, or `/proc` unreadable.
pub fn own_cgroup() -> Result<PathBuf, CgroupError> {
    static OWN: OnceLock<Result<PathBuf, CgroupError>> = OnceLock::new();
    OWN.get_or_init(read_own_cgroup).clone()
}

fn read_own_cgroup() -> Result<PathBuf, CgroupError> {
    let read = |p: &str| {
        std::fs::read_to_string(p).map_err(|e| HostIo::new(HostOp::Read, Path::new(p), e))
    };
    let cg = read("/proc/self/cgroup")?;
    let rel = cg
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or_else(|| CgroupError::NoV2Entry {
            path: PathBuf::from("/proc/self/cgroup"),
        })?;
    let mi = read("/proc/self/mountinfo")?;
    // mountinfo: id parent maj:min root mount-point options... - fstype source superopts
    let mount = mi
        .lines()
        .find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            (post.split_whitespace().next()? == "cgroup2")
                .then(|| pre.split_whitespace().nth(4).map(str::to_string))?
        })
        .ok_or_else(|| CgroupError::NotMounted {
            mountinfo: PathBuf::from("/proc/self/mountinfo"),
        })?;
    Ok(Path::new(&mount).join(rel.trim().trim_start_matches('/')))
}

/// One command's cgroup; killed and removed on drop.
#[derive(Debug)]
pub struct CmdCgroup {
    dir: PathBuf,
}

impl CmdCgroup {
    /// Creates a new command cgroup below the agent's own.
    ///
    /// # Errors
    /// [`CgroupError`] saying why not (the caller falls back to the process group).
    pub fn create() -> Result<CmdCgroup, CgroupError> {
        static N: AtomicU64 = AtomicU64::new(0);
        let parent = own_cgroup()?;
        let n = N.fetch_add(1, Ordering::Relaxed);
        if n == 0 {
            sweep(&parent);
        }
        let dir = parent.join(format!("{PREFIX}{}-{n}", std::process::id()));
        std::fs::create_dir(&dir).map_err(|e| HostIo::new(HostOp::Create, &dir, e))?;
        Ok(CmdCgroup { dir })
    }

    /// The cgroup's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Opens the cgroup's `cgroup.procs` for writing (close-on-exec), for
    /// [`CmdCgroup::join_before_exec`].
    ///
    /// # Errors
    /// [`CgroupError::Io`] (the caller falls back to the process group).
    pub fn open_procs(&self) -> Result<std::fs::File, CgroupError> {
        let path = self.dir.join("cgroup.procs");
        // std opens with O_CLOEXEC: the program run never inherits it.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|e| HostIo::new(HostOp::Open, &path, e).into())
    }

    /// Makes the child of `cmd` join the cgroup before it runs its program: between `fork`
    /// and `exec` it writes `0` ("the writing process", cgroup v2) to `procs`, the
    /// cgroup's `cgroup.procs` from [`CmdCgroup::open_procs`]. `procs` must stay open
    /// until `spawn` returns. When the write fails, `spawn` fails with its error before
    /// the program ran (the caller may spawn again without the cgroup).
    #[allow(unsafe_code)]
    pub fn join_before_exec(cmd: &mut tokio::process::Command, procs: &std::fs::File) {
        let fd = procs.as_raw_fd();
        // SAFETY: the closure runs in the forked child, where only async-signal-safe
        // calls are allowed: it makes one write(2) system call (rustix, no libc buffering)
        // and allocates nothing (an OS error is stored inline in io::Error).
        unsafe {
            cmd.pre_exec(move || {
                // SAFETY: `fd` is open in the parent until spawn returns (the caller keeps
                // `procs`), so the child's copy is open here; it is closed at exec.
                let fd = BorrowedFd::borrow_raw(fd);
                match rustix::io::write(fd, b"0") {
                    Ok(_) => Ok(()),
                    Err(e) => Err(std::io::Error::from_raw_os_error(e.raw_os_error())),
                }
            });
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
