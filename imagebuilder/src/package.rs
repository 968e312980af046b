//! An agent package given to the image builder (`--agent-package FILE.deb|FILE.rpm`, made
//! by `scripts/package.sh`): what it is (format, version, architecture, from the package's
//! own header through `dpkg-deb --show` or `rpm -qp --queryformat`) and its two programs,
//! unpacked (`dpkg-deb -x`, or `rpm2cpio | cpio -id`) into a temporary folder so that the
//! builder refuses, before Packer starts, a package whose architecture or glibc floor the
//! image cannot run ([`crate::binary::check_fits`], as for `--agent-bin`). The image
//! installs the package itself with the OS's package manager (packer/scripts/70-agent.sh).
//!
//! Formats: the Debian binary package (deb(5), `dpkg-deb`) and RPM v4 (`rpm`, `rpm2cpio`);
//! the programs are read where both packages put them, `usr/bin/slurm-node-agent` and
//! `usr/bin/slurm-node-agent-healthcheck`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{Error, Result};

/// The agent's programs in its packages, relative to the root.
pub const PROGRAMS: [&str; 2] = [
    "usr/bin/slurm-node-agent",
    "usr/bin/slurm-node-agent-healthcheck",
];

/// A package's format: which package manager installs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `.deb`: dpkg and apt (Debian, Ubuntu).
    Deb,
    /// `.rpm`: rpm and dnf (Amazon Linux 2023, RHEL, Rocky).
    Rpm,
}

impl Format {
    /// The family of OS that installs it, in `local.os_catalog`'s words (`deb`, `rpm`).
    pub fn family(self) -> &'static str {
        match self {
            Format::Deb => "deb",
            Format::Rpm => "rpm",
        }
    }
}

/// An agent package, read and unpacked.
#[derive(Debug)]
pub struct AgentPackage {
    /// The file as given.
    pub path: PathBuf,
    /// Its format, from the file name's extension.
    pub format: Format,
    /// The agent's version: the package's version without its Debian revision
    /// (`0.1.0-1` is `0.1.0`) or the RPM `VERSION` tag (release apart).
    pub version: String,
    /// Its architecture in the image builder's words (`x86_64`, `arm64`); another
    /// package architecture as the package writes it (`all`, `noarch`, `riscv64`...).
    pub arch: String,
    /// Where it was unpacked (removed on drop).
    pub unpacked: tempfile::TempDir,
}

impl AgentPackage {
    /// Reads and unpacks `path`.
    ///
    /// # Errors
    /// [`Error::BadInput`] naming the file: not a `.deb` or `.rpm`, unreadable by
    /// dpkg-deb / rpm, or without the agent's programs; [`Error::Io`] when the tools
    /// cannot be run (dpkg-deb, rpm, rpm2cpio and cpio are needed on this machine).
    pub fn open(path: &Path) -> Result<AgentPackage> {
        let named = format!("--agent-package {}", path.display());
        let format = match path.extension().and_then(|e| e.to_str()) {
            Some("deb") => Format::Deb,
            Some("rpm") => Format::Rpm,
            _ => {
                return Err(Error::BadInput(format!(
                    "{named}: not a .deb or .rpm file (scripts/package.sh makes both)"
                )))
            }
        };
        if !path.is_file() {
            return Err(Error::BadInput(format!("{named}: no such file")));
        }
        let fields = match format {
            Format::Deb => output(
                Command::new("dpkg-deb")
                    .args(["--show", "--showformat", "${Version}\t${Architecture}"])
                    .arg(path),
                &named,
            )?,
            Format::Rpm => output(
                Command::new("rpm")
                    .args(["-qp", "--queryformat", "%{VERSION}\t%{ARCH}"])
                    .arg(path),
                &named,
            )?,
        };
        let (version, arch) = fields.trim().split_once('\t').ok_or_else(|| {
            Error::BadInput(format!(
                "{named}: no version and architecture in {fields:?}"
            ))
        })?;
        let version = match format {
            Format::Deb => version.rsplit_once('-').map_or(version, |(v, _)| v),
            Format::Rpm => version,
        }
        .to_string();
        let arch = match arch {
            "amd64" | "x86_64" => "x86_64",
            "arm64" | "aarch64" => "arm64",
            other => other,
        }
        .to_string();
        let unpacked = tempfile::Builder::new()
            .prefix("agent-package-")
            .tempdir()
            .map_err(|e| Error::io("creating a folder to unpack the agent package", e))?;
        match format {
            Format::Deb => {
                output(
                    Command::new("dpkg-deb")
                        .arg("-x")
                        .arg(path)
                        .arg(unpacked.path()),
                    &named,
                )?;
            }
            Format::Rpm => unpack_rpm(path, unpacked.path(), &named)?,
        }
        for p in PROGRAMS {
            if !unpacked.path().join(p).is_file() {
                return Err(Error::BadInput(format!(
                    "{named}: has no /{p} (not a slurm-node-agent package?)"
                )));
            }
        }
        Ok(AgentPackage {
            path: path.to_path_buf(),
            format,
            version,
            arch,
            unpacked,
        })
    }

    /// A program's path in the unpacked package (one of [`PROGRAMS`]).
    pub fn program(&self, rel: &str) -> PathBuf {
        self.unpacked.path().join(rel)
    }
}

/// Runs `cmd`; its stdout, or an error naming the package and the tool's message.
fn output(cmd: &mut Command, named: &str) -> Result<String> {
    let tool = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::io(format!("{named}: running {tool}"), e))?;
    if !out.status.success() {
        return Err(Error::BadInput(format!(
            "{named}: {tool} cannot read it ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `rpm2cpio FILE | cpio -idm` in `dest`, the pipe made here (no shell).
fn unpack_rpm(path: &Path, dest: &Path, named: &str) -> Result<()> {
    let mut rpm2cpio = Command::new("rpm2cpio")
        .arg(path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::io(format!("{named}: running rpm2cpio"), e))?;
    let archive = rpm2cpio
        .stdout
        .take()
        .map(Stdio::from)
        .unwrap_or_else(Stdio::null);
    let cpio = Command::new("cpio")
        .args(["-idm", "--quiet", "--no-absolute-filenames"])
        .current_dir(dest)
        .stdin(archive)
        .output()
        .map_err(|e| Error::io(format!("{named}: running cpio"), e))?;
    let unpacked = rpm2cpio
        .wait_with_output()
        .map_err(|e| Error::io(format!("{named}: running rpm2cpio"), e))?;
    // rpm2cpio 4.18 exits 1 after writing the whole archive of a package whose header
    // has no payload size it expects (cargo-generate-rpm's): its status is not used; cpio
    // failing, or the programs missing afterwards ([`AgentPackage::open`]), is.
    if !cpio.status.success() {
        return Err(Error::BadInput(format!(
            "{named}: rpm2cpio | cpio cannot unpack it: {} {}",
            String::from_utf8_lossy(&unpacked.stderr).trim(),
            String::from_utf8_lossy(&cpio.stderr).trim()
        )));
    }
    Ok(())
}
