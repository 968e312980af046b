//! Which Slurm the suite runs against.
//!
//! `SLURM_E2E_PREFIX` names the installation: `/opt/slurm` after `scripts/slurm-build.sh
//! <version>` (SchedMD's pinned tarball built by the image's own build function; that is
//! what `scripts/test.sh` sets, for `SLURM_E2E_VERSION`, default 25.11), or `/usr` for
//! Debian 12's packages (22.05, the default when the variable is unset). Every Slurm
//! program the harness starts comes from there ([`program`]), the agent under test is
//! given its `bin/` as `slurm.bin_dir`, and the node's `slurmd.service` is that version's
//! own unit ([`unit_file`]).
//!
//! What differs between versions lives in [`Version`] and its methods, nowhere else.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{bail, Context, Result};

/// The variable naming the installation prefix.
pub const PREFIX_ENV: &str = "SLURM_E2E_PREFIX";

/// The installation prefix: [`PREFIX_ENV`], or `/usr`.
pub fn prefix() -> PathBuf {
    std::env::var_os(PREFIX_ENV)
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from("/usr"), PathBuf::from)
}

/// `<prefix>/bin`: the client commands (`scontrol`, `sinfo`, `srun`, ...).
pub fn bin_dir() -> PathBuf {
    prefix().join("bin")
}

/// The path of Slurm program `name` in the installation (`sbin/` for the daemons,
/// `bin/` for the rest); `name` itself (a PATH lookup) for anything else.
pub fn program(name: impl AsRef<std::ffi::OsStr>) -> PathBuf {
    let name = name.as_ref();
    let p = prefix();
    for dir in ["sbin", "bin"] {
        let candidate = p.join(dir).join(name);
        if candidate.is_file() {
            return candidate;
        }
    }
    PathBuf::from(name)
}

/// A systemd unit of the installation: `<prefix>/lib/systemd/system/<name>` for a source
/// build (scripts/slurm-build.sh keeps the build's own units there), else the
/// distribution's `/lib/systemd/system/<name>`.
pub fn unit_file(name: &str) -> PathBuf {
    let own = prefix().join("lib/systemd/system").join(name);
    if own.is_file() && prefix() != Path::new("/usr") {
        own
    } else {
        Path::new("/lib/systemd/system").join(name)
    }
}

/// A Slurm release, `MAJOR.MINOR.MICRO` as `slurmd -V` prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    /// Year of the release (22, 24, 25, 26).
    pub major: u32,
    /// Month (02, 05, 11).
    pub minor: u32,
    /// Maintenance release.
    pub micro: u32,
}

impl Version {
    /// Parses `slurm 25.11.6` or `25.11.6`.
    pub fn parse(text: &str) -> Option<Version> {
        let v = text.split_whitespace().last()?;
        let mut it = v.split(['.', '-']).map(str::parse::<u32>);
        Some(Version {
            major: it.next()?.ok()?,
            minor: it.next()?.ok()?,
            micro: it.next().and_then(Result::ok).unwrap_or(0),
        })
    }

    /// At least `major.minor`.
    pub fn at_least(self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }

    /// `AuthType=auth/slurm`, `CredType=cred/slurm` (23.11+).
    pub fn has_auth_slurm(self) -> bool {
        self.at_least(23, 11)
    }

    /// slurmd takes `--instance-id` and `--instance-type` (23.11+).
    pub fn has_instance_fields(self) -> bool {
        self.at_least(23, 11)
    }

    /// slurmctld takes slurmd's `--instance-id` only at the node's first registration or
    /// after the node booted (26.05: slurmd's boot time later than the record's last
    /// response). A "replacement" started on the same kernel, as the tests' are, keeps the
    /// record's value; a real replacement is a new machine.
    pub fn applies_instance_fields_after_boot_only(self) -> bool {
        self.at_least(26, 5)
    }

    /// The reference `slurmd.service` is `Type=notify` with `slurmd --systemd` (23.11+).
    pub fn notify_unit(self) -> bool {
        self.at_least(23, 11)
    }

    /// `State=RESUME` clears a node's reason (22.05, and again from 26.05). From 23.02 to
    /// 25.11 slurmctld clears it only through accounting storage
    /// (`clusteracct_storage_g_node_up`, which returned first without a storage plugin, as
    /// in the suite's controllers): the reason stays on the IDLE record, and `sinfo -R` no
    /// longer lists it. 26.05 clears it before that return.
    pub fn clears_reason_on_resume(self) -> bool {
        !self.at_least(23, 2) || self.at_least(26, 5)
    }

    /// slurmctld appends its own system reasons to a node's reason with ` : ` (23.02+),
    /// e.g. `<reason> : reboot issued`.
    pub fn appends_system_reasons(self) -> bool {
        self.at_least(23, 2)
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{:02}.{}", self.major, self.minor, self.micro)
    }
}

/// The installation's version (`slurmd -V`, asked once per test process).
///
/// # Errors
/// When slurmd cannot be run or prints no version.
pub fn version() -> Result<Version> {
    static V: OnceLock<std::result::Result<Version, String>> = OnceLock::new();
    V.get_or_init(|| {
        let slurmd = program("slurmd");
        let out = Command::new(&slurmd)
            .arg("-V")
            .output()
            .map_err(|e| format!("running {} -V: {e}", slurmd.display()))?;
        let text = String::from_utf8_lossy(&out.stdout);
        Version::parse(&text).ok_or_else(|| {
            format!(
                "{} -V printed no version: {text:?} (is {PREFIX_ENV} an installation?)",
                slurmd.display()
            )
        })
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

/// A Slurm build of the cache (`slurm-<release>-<key>.tar`, made by `scripts/slurm-build.sh
/// --cache-only`, configured for the prefix `/opt/slurm`) unpacked under `into`: its
/// release (from the tar's name) and its tree (`<into>/opt/slurm`). Its programs find their
/// libraries and plugins at `/opt/slurm` (compiled in), so they run only where that path is
/// this tree, e.g. bound there in a mount namespace of their own.
///
/// # Errors
/// A name that is not a cache tar's, or tar failing.
pub fn unpack_build(tar: &Path, into: &Path) -> Result<(Version, PathBuf)> {
    let version = tar
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("slurm-"))
        .and_then(|n| n.split('-').next())
        .and_then(Version::parse)
        .with_context(|| {
            format!(
                "{}: not a Slurm build cache tar (slurm-<release>-<key>.tar)",
                tar.display()
            )
        })?;
    std::fs::create_dir_all(into).with_context(|| format!("creating {}", into.display()))?;
    let mut c = Command::new("tar");
    c.arg("-xf").arg(tar).arg("-C").arg(into).arg("./opt/slurm");
    crate::process::run_ok(c, std::time::Duration::from_secs(300))
        .with_context(|| format!("unpacking {}", tar.display()))?;
    let tree = into.join("opt/slurm");
    if !tree.join("sbin/slurmctld").is_file() {
        bail!("{} holds no opt/slurm/sbin/slurmctld", tar.display());
    }
    Ok((version, tree))
}

/// Fails unless the installation is at least `major.minor`, naming both.
///
/// # Errors
/// When it is older, or its version cannot be read.
pub fn require(major: u32, minor: u32) -> Result<Version> {
    let v = version().context("reading the Slurm version under test")?;
    if !v.at_least(major, minor) {
        bail!(
            "Slurm {v} under test ({PREFIX_ENV}={}); this needs {major}.{minor:02} or later",
            prefix().display()
        );
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::Version;

    #[test]
    fn versions_parse_and_compare() {
        let v = Version::parse("slurm 25.11.6\n").unwrap();
        assert_eq!(
            v,
            Version {
                major: 25,
                minor: 11,
                micro: 6
            }
        );
        assert!(v.at_least(25, 11) && v.at_least(23, 2) && !v.at_least(26, 5));
        assert!(!Version::parse("slurm 22.05.8")
            .unwrap()
            .has_instance_fields());
        assert!(Version::parse("24.11.7").unwrap().has_instance_fields());
        let clears = |s: &str| Version::parse(s).unwrap().clears_reason_on_resume();
        assert!(clears("22.05.8") && !clears("24.11.7") && !clears("25.11.6") && clears("26.05.3"));
        assert_eq!(
            Version::parse("slurm 22.05.8").unwrap().to_string(),
            "22.05.8"
        );
        assert_eq!(Version::parse("slurm"), None);
    }
}
