//! `build --target local`: a Debian 12 root made by mmdebstrap, provisioned by the same
//! `packer/scripts/NN-*.sh` through chroot, checked by the acceptance checks installed in
//! it (`slurm-image-acceptance`, the on-demand path), and packed as a tarball and a qcow2.
//!
//! Each step runs as `unshare -m --propagation private sh -c <fixed script> sh <root> ...`
//! with its settings in the environment: the mounts (`/proc`, `/dev`, the apt cache) live
//! in a private mount namespace and vanish with it, and no input is ever interpolated
//! into shell text.

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

/// Where the steps find their inputs inside the root.
pub const STAGING: &str = "/tmp/slurm-image";

/// The shell text run in the private mount namespace for one step. Arguments:
/// `$1` root, `$2` apt cache folder ('' for none), `$3` Slurm build cache folder ('' for
/// none), then the command to run inside the root.
const STEP_SH: &str = r#"set -eu
root=$1 cache=$2 builds=$3; shift 3
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount --make-rslave "$root/dev"
if [ -n "$cache" ]; then
  mkdir -p "$root/var/cache/apt/archives"
  mount --bind "$cache" "$root/var/cache/apt/archives"
fi
if [ -n "$builds" ]; then
  mkdir -p "$root/var/cache/slurm-image/builds"
  mount --bind "$builds" "$root/var/cache/slurm-image/builds"
fi
exec chroot "$root" "$@"
"#;

/// Settings of a local build.
#[derive(Debug, Clone)]
pub struct LocalBuild {
    /// Work folder: `root/`, `image.tar.gz`, `image.qcow2`, `local.log`.
    pub work_dir: PathBuf,
    /// `packer/` (scripts/ and files/ are used).
    pub packer_dir: PathBuf,
    /// Assembled agent folder (binary, units/, agent.toml).
    pub agent_dir: PathBuf,
    /// Persistent apt archive cache (kept warm between builds), if any.
    pub apt_cache: Option<PathBuf>,
    /// Pre-fetched source tarballs, copied into the staging `sources/` (the steps check
    /// each against its pin), if any.
    pub sources_dir: Option<PathBuf>,
    /// Finished Slurm builds, mounted at `/var/cache/slurm-image/builds` for 30-slurm.sh,
    /// if any.
    pub slurm_build_cache: Option<PathBuf>,
    /// Debian mirror for mmdebstrap (None: its default).
    pub mirror: Option<String>,
    /// Environment of the steps (from the recipe).
    pub env: Vec<(String, String)>,
    /// Keep the existing root and only run the provisioning steps again.
    pub steps_only: bool,
    /// Skip the tarball and qcow2.
    pub no_artifacts: bool,
    /// Log file.
    pub log_path: PathBuf,
}

/// Time one phase took.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Timing {
    /// Phase name (`mmdebstrap`, `10-base`, ..., `acceptance`, `tarball`, `qcow2`).
    pub phase: String,
    /// Seconds.
    pub seconds: f64,
}

/// What a local build produced.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LocalOutcome {
    /// The provisioned root.
    pub root: PathBuf,
    /// Root file system tarball.
    pub tarball: Option<PathBuf>,
    /// qcow2 image (ext4, whole root).
    pub qcow2: Option<PathBuf>,
    /// Parts skipped with the reason (`/etc/slurm-image/skipped`).
    pub skipped: Vec<String>,
    /// Acceptance check lines.
    pub acceptance: Vec<String>,
    /// Seconds of the provisioning steps alone (the benchmark's measure).
    pub provisioning_seconds: f64,
    /// Every phase.
    pub timings: Vec<Timing>,
}

fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// The tools the local target needs, each with the Debian package that has it.
const TOOLS: &[(&str, &str)] = &[
    ("mmdebstrap", "mmdebstrap"),
    ("unshare", "util-linux"),
    ("chroot", "coreutils"),
    ("mkfs.ext4", "e2fsprogs"),
    ("qemu-img", "qemu-utils"),
    ("tar", "tar"),
];

/// The provisioning steps in order (`NN-*.sh` in `scripts`), without the acceptance
/// checks (`99-*`), which run from the copy installed in the image.
pub fn steps(scripts: &Path) -> Result<Vec<String>> {
    let rd = std::fs::read_dir(scripts)
        .map_err(|e| Error::io(format!("reading {}", scripts.display()), e))?;
    let mut names: Vec<String> = rd
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| {
            n.ends_with(".sh")
                && n.len() > 3
                && n.as_bytes()[..2].iter().all(u8::is_ascii_digit)
                && n.as_bytes()[2] == b'-'
                && !n.starts_with("99-")
        })
        .collect();
    names.sort();
    Ok(names)
}

impl LocalBuild {
    /// Run the whole local build.
    pub async fn run(&self) -> Result<LocalOutcome> {
        for (tool, package) in TOOLS {
            if which(tool).is_none() {
                return Err(Error::BadInput(format!(
                    "{tool} not found on PATH: the local target needs it (apt-get install {package})"
                )));
            }
        }
        if !rustix::process::geteuid().is_root() {
            return Err(Error::BadInput(
                "the local target needs root (mmdebstrap, chroot and mounts)".into(),
            ));
        }
        std::fs::create_dir_all(&self.work_dir)
            .map_err(|e| Error::io(format!("creating {}", self.work_dir.display()), e))?;
        let mut log = tokio::fs::File::create(&self.log_path)
            .await
            .map_err(|e| Error::io(format!("creating {}", self.log_path.display()), e))?;
        let root = self.work_dir.join("root");
        let mut timings = Vec::new();

        if self.steps_only {
            if !root.join("etc/debian_version").is_file() {
                return Err(Error::BadInput(format!(
                    "--steps-only: no finished root at {} (run a full local build first)",
                    root.display()
                )));
            }
        } else {
            let started = Instant::now();
            self.mmdebstrap(&root, &mut log).await?;
            timings.push(Timing {
                phase: "mmdebstrap".into(),
                seconds: started.elapsed().as_secs_f64(),
            });
        }

        self.stage(&root)?;
        let had_resolv = root.join("etc/resolv.conf").exists();
        std::fs::copy("/etc/resolv.conf", root.join("etc/resolv.conf"))
            .map_err(|e| Error::io("copying /etc/resolv.conf into the root", e))?;
        let policy = root.join("usr/sbin/policy-rc.d");
        write_file(
            &policy,
            "#!/bin/sh\n# slurm-image-builder: no daemons start in the chroot\nexit 101\n",
            0o755,
        )?;

        let provisioning = Instant::now();
        let mut result = Ok(());
        for step in steps(&self.packer_dir.join("scripts"))? {
            let started = Instant::now();
            let (cache, builds) = if step.starts_with("90-") {
                (None, None)
            } else {
                (self.apt_cache.as_deref(), self.slurm_build_cache.as_deref())
            };
            let script = format!("{STAGING}/scripts/{step}");
            let r = self
                .in_root(
                    &root,
                    cache,
                    builds,
                    &["/bin/bash", &script],
                    &mut log,
                    &step,
                )
                .await;
            timings.push(Timing {
                phase: step.trim_end_matches(".sh").to_string(),
                seconds: started.elapsed().as_secs_f64(),
            });
            if let Err(e) = r {
                result = Err(e);
                break;
            }
        }
        let provisioning_seconds = provisioning.elapsed().as_secs_f64();
        let _ = std::fs::remove_file(&policy);
        if !had_resolv {
            let _ = std::fs::remove_file(root.join("etc/resolv.conf"));
        }
        result?;

        let started = Instant::now();
        let acceptance = self.acceptance(&root, &mut log).await;
        timings.push(Timing {
            phase: "acceptance".into(),
            seconds: started.elapsed().as_secs_f64(),
        });
        let acceptance = acceptance?;

        let skipped = std::fs::read_to_string(root.join("etc/slurm-image/skipped"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect();

        let (mut tarball, mut qcow2) = (None, None);
        if !self.no_artifacts {
            let started = Instant::now();
            tarball = Some(self.tarball(&root, &mut log).await?);
            timings.push(Timing {
                phase: "tarball".into(),
                seconds: started.elapsed().as_secs_f64(),
            });
            let started = Instant::now();
            qcow2 = Some(self.qcow2(&root, &mut log).await?);
            timings.push(Timing {
                phase: "qcow2".into(),
                seconds: started.elapsed().as_secs_f64(),
            });
        }
        log.flush()
            .await
            .map_err(|e| Error::io("writing the log", e))?;
        Ok(LocalOutcome {
            root,
            tarball,
            qcow2,
            skipped,
            acceptance,
            provisioning_seconds,
            timings,
        })
    }

    async fn mmdebstrap(&self, root: &Path, log: &mut tokio::fs::File) -> Result<()> {
        if root.exists() {
            std::fs::remove_dir_all(root)
                .map_err(|e| Error::io(format!("removing the old root {}", root.display()), e))?;
        }
        let mut cmd = Command::new("mmdebstrap");
        cmd.args(["--variant=minbase", "--quiet"]);
        if let Some(cache) = &self.apt_cache {
            std::fs::create_dir_all(cache)
                .map_err(|e| Error::io(format!("creating apt cache {}", cache.display()), e))?;
            let cache = cache
                .to_str()
                .filter(|c| !c.contains(char::is_whitespace))
                .ok_or_else(|| {
                    Error::BadInput(format!(
                        "apt cache path {} must be UTF-8 without spaces",
                        cache.display()
                    ))
                })?;
            // mmdebstrap's documented package cache recipe (man mmdebstrap, EXAMPLES).
            cmd.arg("--skip=essential/unlink")
                .arg("--setup-hook=mkdir -p \"$1\"/var/cache/apt/archives/")
                .arg(format!(
                    "--setup-hook=sync-in {cache} /var/cache/apt/archives/"
                ))
                .arg(format!(
                    "--customize-hook=sync-out /var/cache/apt/archives {cache}"
                ));
        }
        cmd.arg("bookworm").arg(root);
        if let Some(m) = &self.mirror {
            cmd.arg(m);
        }
        run_logged(cmd, log, "mmdebstrap").await
    }

    fn stage(&self, root: &Path) -> Result<()> {
        let staging = root.join(STAGING.trim_start_matches('/'));
        if staging.exists() {
            std::fs::remove_dir_all(&staging)
                .map_err(|e| Error::io(format!("clearing {}", staging.display()), e))?;
        }
        for (from, to) in [
            (self.packer_dir.join("scripts"), staging.join("scripts")),
            (self.packer_dir.join("files"), staging.join("files")),
            (self.agent_dir.clone(), staging.join("agent")),
        ] {
            copy_tree(&from, &to)?;
        }
        std::fs::create_dir_all(staging.join("sources"))
            .map_err(|e| Error::io(format!("creating {}", staging.display()), e))?;
        if let Some(dir) = &self.sources_dir {
            let rd = std::fs::read_dir(dir).map_err(|e| {
                Error::io(format!("reading the sources folder {}", dir.display()), e)
            })?;
            for entry in rd.flatten() {
                let name = entry.file_name();
                let is_tarball = name.to_str().is_some_and(|n| n.contains(".tar."));
                if is_tarball && entry.path().is_file() {
                    let to = staging.join("sources").join(&name);
                    std::fs::copy(entry.path(), &to).map_err(|e| {
                        Error::io(
                            format!("copying {} to {}", entry.path().display(), to.display()),
                            e,
                        )
                    })?;
                }
            }
        }
        if let Some(builds) = &self.slurm_build_cache {
            std::fs::create_dir_all(builds)
                .map_err(|e| Error::io(format!("creating {}", builds.display()), e))?;
        }
        Ok(())
    }

    async fn in_root(
        &self,
        root: &Path,
        cache: Option<&Path>,
        builds: Option<&Path>,
        command: &[&str],
        log: &mut tokio::fs::File,
        label: &str,
    ) -> Result<()> {
        let mut cmd = Command::new("unshare");
        cmd.args(["-m", "--propagation", "private", "sh", "-c", STEP_SH, "sh"])
            .arg(root)
            .arg(cache.map(|c| c.as_os_str()).unwrap_or_default())
            .arg(builds.map(|c| c.as_os_str()).unwrap_or_default())
            .args(command)
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .env("HOME", "/root")
            .env("LANG", "C.UTF-8")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        run_logged(cmd, log, label).await
    }

    async fn acceptance(&self, root: &Path, log: &mut tokio::fs::File) -> Result<Vec<String>> {
        let mut cmd = Command::new("unshare");
        cmd.args(["-m", "--propagation", "private", "sh", "-c", STEP_SH, "sh"])
            .arg(root)
            .arg("")
            .arg("")
            .arg("/usr/local/sbin/slurm-image-acceptance")
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .env("HOME", "/root")
            .env("LANG", "C.UTF-8")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let out = cmd
            .output()
            .await
            .map_err(|e| Error::io("running the acceptance checks", e))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        log.write_all(text.as_bytes())
            .await
            .map_err(|e| Error::io("writing the log", e))?;
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        if !out.status.success() {
            let fails: Vec<&str> = lines
                .iter()
                .filter(|l| l.contains("FAIL"))
                .map(String::as_str)
                .collect();
            return Err(Error::Build(format!(
                "acceptance checks failed in {}:\n{}",
                root.display(),
                fails.join("\n")
            )));
        }
        Ok(lines)
    }

    async fn tarball(&self, root: &Path, log: &mut tokio::fs::File) -> Result<PathBuf> {
        let dest = self.work_dir.join("image.tar.gz");
        let part = self.work_dir.join(".image.tar.gz.part");
        let mut cmd = Command::new("tar");
        cmd.args([
            "--numeric-owner",
            "--xattrs",
            "--acls",
            "--one-file-system",
            "-I",
            "gzip -1",
            "-C",
        ])
        .arg(root)
        .arg("-cf")
        .arg(&part)
        .arg(".");
        run_logged(cmd, log, "tarball").await?;
        std::fs::rename(&part, &dest)
            .map_err(|e| Error::io(format!("renaming to {}", dest.display()), e))?;
        Ok(dest)
    }

    async fn qcow2(&self, root: &Path, log: &mut tokio::fs::File) -> Result<PathBuf> {
        let raw = self.work_dir.join("image.raw");
        let dest = self.work_dir.join("image.qcow2");
        let part = self.work_dir.join(".image.qcow2.part");
        // Room for the root plus half again (ext4 metadata, first-boot growth).
        let used = dir_size(root);
        let size = (used + used / 2 + (256 << 20)).div_ceil(1 << 20) << 20;
        let file = std::fs::File::create(&raw)
            .map_err(|e| Error::io(format!("creating {}", raw.display()), e))?;
        file.set_len(size)
            .map_err(|e| Error::io(format!("sizing {}", raw.display()), e))?;
        drop(file);
        let mut mkfs = Command::new("mkfs.ext4");
        mkfs.args(["-q", "-F", "-L", "slurm-root", "-d"])
            .arg(root)
            .arg(&raw);
        run_logged(mkfs, log, "mkfs.ext4").await?;
        let mut convert = Command::new("qemu-img");
        convert
            .args(["convert", "-f", "raw", "-O", "qcow2", "-c"])
            .arg(&raw)
            .arg(&part);
        let r = run_logged(convert, log, "qemu-img").await;
        let _ = std::fs::remove_file(&raw);
        r?;
        std::fs::rename(&part, &dest)
            .map_err(|e| Error::io(format!("renaming to {}", dest.display()), e))?;
        Ok(dest)
    }
}

fn dir_size(path: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in rd.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                total += meta.len();
            }
        }
    }
    total
}

fn write_file(path: &Path, content: &str, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, content)
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| Error::io(format!("chmod {}", path.display()), e))
}

/// Copy a folder's files recursively (regular files and folders; modes kept).
pub fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).map_err(|e| Error::io(format!("creating {}", to.display()), e))?;
    if !from.is_dir() {
        return Ok(());
    }
    let rd =
        std::fs::read_dir(from).map_err(|e| Error::io(format!("reading {}", from.display()), e))?;
    for entry in rd.flatten() {
        let src = entry.path();
        let dst = to.join(entry.file_name());
        if src.is_dir() {
            copy_tree(&src, &dst)?;
        } else if src.is_file() {
            std::fs::copy(&src, &dst).map_err(|e| {
                Error::io(format!("copying {} to {}", src.display(), dst.display()), e)
            })?;
        }
    }
    Ok(())
}

/// Run a command, its output into the log and (prefixed) onto stderr; cancel it on
/// SIGINT/SIGTERM (SIGTERM to its process group, then wait).
async fn run_logged(mut cmd: Command, log: &mut tokio::fs::File, label: &str) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut sigint =
        signal(SignalKind::interrupt()).map_err(|e| Error::io("installing SIGINT handler", e))?;
    let mut sigterm =
        signal(SignalKind::terminate()).map_err(|e| Error::io("installing SIGTERM handler", e))?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::io(format!("starting {label}"), e))?;
    let pgid = child
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .and_then(rustix::process::Pid::from_raw);
    let mut out = BufReader::new(
        child
            .stdout
            .take()
            .ok_or_else(|| Error::Build("no stdout".into()))?,
    )
    .lines();
    let mut err = BufReader::new(
        child
            .stderr
            .take()
            .ok_or_else(|| Error::Build("no stderr".into()))?,
    )
    .lines();
    let (mut out_open, mut err_open) = (true, true);
    let mut cancelled: Option<&'static str> = None;
    let mut tail: Vec<String> = Vec::new();
    let status = loop {
        tokio::select! {
            line = out.next_line(), if out_open => match line {
                Ok(Some(l)) => { emit(log, label, &l, &mut tail).await?; }
                _ => out_open = false,
            },
            line = err.next_line(), if err_open => match line {
                Ok(Some(l)) => { emit(log, label, &l, &mut tail).await?; }
                _ => err_open = false,
            },
            _ = sigint.recv() => { cancelled = Some("SIGINT"); signal_group(pgid, rustix::process::Signal::TERM); }
            _ = sigterm.recv() => { cancelled = Some("SIGTERM"); signal_group(pgid, rustix::process::Signal::TERM); }
            status = child.wait(), if !out_open && !err_open => {
                break status.map_err(|e| Error::io(format!("waiting for {label}"), e))?;
            }
        }
    };
    signal_group(pgid, rustix::process::Signal::KILL);
    if let Some(signal) = cancelled {
        return Err(Error::Cancelled {
            signal: signal.into(),
        });
    }
    if !status.success() {
        return Err(Error::Build(format!(
            "{label} failed ({status}):\n{}",
            tail.join("\n")
        )));
    }
    Ok(())
}

fn signal_group(pgid: Option<rustix::process::Pid>, sig: rustix::process::Signal) {
    if let Some(pgid) = pgid {
        let _ = rustix::process::kill_process_group(pgid, sig);
    }
}

async fn emit(
    log: &mut tokio::fs::File,
    label: &str,
    line: &str,
    tail: &mut Vec<String>,
) -> Result<()> {
    eprintln!("[{label}] {line}");
    log.write_all(format!("[{label}] {line}\n").as_bytes())
        .await
        .map_err(|e| Error::io("writing the log", e))?;
    tail.push(line.to_string());
    if tail.len() > 12 {
        tail.remove(0);
    }
    Ok(())
}

/// Format seconds for people.
pub fn secs(d: f64) -> String {
    format!("{:.1} s", Duration::from_secs_f64(d).as_secs_f64())
}
