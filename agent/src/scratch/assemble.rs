//! Making and mounting the scratch file system: `mkfs.btrfs`, `mount`, by exec with
//! argument vectors (never a shell), each bounded by a timeout.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::disks::Disk;
use super::ScratchError;

/// Runs the programs, each bounded by `timeout`, from `path` (a `PATH`-like list; the
/// agent's: `/usr/sbin:/usr/bin:/sbin:/bin`).
#[derive(Debug, Clone)]
pub struct Runner {
    /// Where programs are looked for, in order.
    pub path: Vec<PathBuf>,
    /// The longest one program may run before it is killed.
    pub timeout: Duration,
}

impl Default for Runner {
    fn default() -> Self {
        Runner {
            path: ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
                .iter()
                .map(PathBuf::from)
                .collect(),
            timeout: Duration::from_secs(300),
        }
    }
}

/// What a program did.
#[derive(Debug, Clone)]
pub struct Output {
    /// Its exit status (`-1` when killed by a signal).
    pub status: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    program: String,
    args: Vec<String>,
}

impl Output {
    /// This run as a [`ScratchError::Command`] about `disks`.
    pub fn failed(&self, program: &str, disks: &[Disk]) -> ScratchError {
        let why = self.stderr.trim();
        ScratchError::Command {
            command: format!("{} {}", program, self.args.join(" ")),
            disks: disks.iter().map(ToString::to_string).collect(),
            why: if why.is_empty() {
                format!("exit status {}", self.status)
            } else {
                format!("exit status {}: {}", self.status, last_lines(why))
            },
        }
    }
}

fn last_lines(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(3)..].join(" / ")
}

impl Runner {
    fn find(&self, program: &str) -> Option<PathBuf> {
        self.path
            .iter()
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    }

    /// Runs `program args`, waiting up to [`Runner::timeout`].
    ///
    /// # Errors
    /// [`ScratchError::Command`] when the program is missing, cannot be started or ran
    /// past the timeout (it is killed), naming `disks`.
    pub fn run(
        &self,
        program: &str,
        args: &[&str],
        disks: &[Disk],
    ) -> Result<Output, ScratchError> {
        let command = format!("{program} {}", args.join(" "));
        let fail = |why: String| ScratchError::Command {
            command: command.clone(),
            disks: disks.iter().map(ToString::to_string).collect(),
            why,
        };
        let exe = self
            .find(program)
            .ok_or_else(|| fail(format!("{program} not found in {:?}", self.path)))?;
        let mut child = Command::new(&exe)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| fail(format!("cannot start {}: {e}", exe.display())))?;
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(fail(format!(
                        "still running after {:?}: killed",
                        self.timeout
                    )));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => return Err(fail(format!("waiting for it: {e}"))),
            }
        };
        let mut stdout = String::new();
        let mut stderr = String::new();
        if let Some(mut o) = child.stdout.take() {
            let _ = o.read_to_string(&mut stdout);
        }
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut stderr);
        }
        Ok(Output {
            status: status.code().unwrap_or(-1),
            stdout,
            stderr,
            program: program.to_string(),
            args: args.iter().map(|a| a.to_string()).collect(),
        })
    }

    /// Runs and requires exit status 0.
    ///
    /// # Errors
    /// As [`Runner::run`], and [`ScratchError::Command`] for another status.
    pub fn check(
        &self,
        program: &str,
        args: &[&str],
        disks: &[Disk],
    ) -> Result<Output, ScratchError> {
        let out = self.run(program, args, disks)?;
        if out.status != 0 {
            return Err(out.failed(&out.program, disks));
        }
        Ok(out)
    }
}

/// The label the agent gives the file system it makes.
pub const LABEL: &str = "scratch";

/// Makes btrfs over blank `disks`: one disk `-d single -m single`; several `-d raid0 -m
/// raid1` (striped data as ParallelCluster's RAID 0; metadata mirrored). `--nodiscard`:
/// instance storage comes trimmed, and a discard of terabytes takes minutes. No `-f`: a
/// disk that has gained a signature since it was found blank makes mkfs refuse.
///
/// # Errors
/// [`ScratchError::Command`] naming the disks and mkfs's last words.
pub fn make_btrfs(runner: &Runner, disks: &[Disk]) -> Result<(), ScratchError> {
    let profile = if disks.len() == 1 {
        ["-d", "single", "-m", "single"]
    } else {
        ["-d", "raid0", "-m", "raid1"]
    };
    let devs: Vec<String> = disks
        .iter()
        .map(|d| d.device.to_string_lossy().into_owned())
        .collect();
    let mut args: Vec<&str> = vec!["--nodiscard", "-L", LABEL];
    args.extend(profile);
    args.extend(devs.iter().map(String::as_str));
    runner.check("mkfs.btrfs", &args, disks).map(drop)
}

/// Mounts the btrfs over `disks` at `mount_point` (`-o noatime,device=<each>`: every
/// member named, so no `btrfs device scan` or udev is needed), then sets the root's mode.
///
/// # Errors
/// [`ScratchError::Command`] or [`ScratchError::Io`].
pub fn mount(
    runner: &Runner,
    disks: &[Disk],
    mount_point: &Path,
    mode: u32,
) -> Result<(), ScratchError> {
    std::fs::create_dir_all(mount_point).map_err(|e| ScratchError::io(mount_point, e))?;
    let mut options = String::from("noatime");
    for d in disks {
        options.push_str(",device=");
        options.push_str(&d.device.to_string_lossy());
    }
    let first = disks[0].device.to_string_lossy().into_owned();
    let mp = mount_point.to_string_lossy().into_owned();
    runner.check(
        "mount",
        &["-t", "btrfs", "-o", &options, &first, &mp],
        disks,
    )?;
    set_mode(mount_point, mode)
}

/// Sets `mount_point`'s mode (`1777`: every job writes, only the owner removes).
///
/// # Errors
/// [`ScratchError::Io`].
pub fn set_mode(mount_point: &Path, mode: u32) -> Result<(), ScratchError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(mount_point, std::fs::Permissions::from_mode(mode))
        .map_err(|e| ScratchError::io(mount_point, e))
}

/// The size of the file system at `mount_point` in MiB (`statvfs`: `f_blocks × f_frsize`),
/// what Slurm's `TmpDisk` counts.
///
/// # Errors
/// [`ScratchError::Io`].
pub fn size_mib(mount_point: &Path) -> Result<u64, ScratchError> {
    let st = rustix::fs::statvfs(mount_point)
        .map_err(|e| ScratchError::io(mount_point, std::io::Error::from(e)))?;
    Ok(st.f_blocks.saturating_mul(st.f_frsize) / (1024 * 1024))
}
