//! sackd on a login node (`node.role = "login"`), for bootstrap: the program checked
//! ([`check_login`]: sackd is there and its Slurm is 23.11 or later), its start prepared
//! (the options file its unit reads, [`prepare`]) and its unit restarted when the options or
//! the key changed.
//!
//! sackd (Slurm 23.11+, sackd(8)) fetches the configuration in configless mode into
//! `$RUNTIME_DIRECTORY/conf` (`/run/slurm/conf` under Slurm's unit, where the client
//! commands look: [`super::CONFIG_CACHE`]), retrying every 10 s while slurmctld refuses, and
//! serves auth/slurm credentials to the client commands through `sack.socket` there.

use std::path::{Path, PathBuf};

use super::{OptionsFileError, SlurmSettings, SlurmVersion};
use crate::systemd::{Systemd, SystemdError};

/// The first Slurm with sackd (and auth/slurm).
pub const SACKD_SINCE: (u32, u32) = (23, 11);

/// The sackd beside the client commands in `bin_dir`: `<bin_dir>/../sbin/sackd`
/// (`/usr/bin` → `/usr/sbin/sackd`, `/opt/slurm/bin` → `/opt/slurm/sbin/sackd`).
pub fn sackd_path(bin_dir: &Path) -> PathBuf {
    bin_dir
        .parent()
        .map_or_else(|| PathBuf::from("/usr/sbin"), |p| p.join("sbin"))
        .join("sackd")
}

/// Why this image cannot be a login node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoginUnsupported {
    /// No sackd program where the image's Slurm is.
    #[error(
        "a login node runs sackd (Slurm 23.11 or later), and this image has none at {}{}: \
         build the image with a Slurm of 23.11 or later (slurm_version), or use node.role = \
         \"compute\"",
        sackd.display(),
        version.map(|v| format!(" (its slurmd is {v})")).unwrap_or_default()
    )]
    NoSackd {
        /// Where sackd was looked for.
        sackd: PathBuf,
        /// `slurmd -V` beside it, when there is one.
        version: Option<SlurmVersion>,
    },
    /// sackd is there but its Slurm predates 23.11 (a leftover of another install).
    #[error(
        "a login node runs sackd of Slurm 23.11 or later; the Slurm at {} is {version}",
        sackd.display()
    )]
    TooOld {
        /// The sackd found.
        sackd: PathBuf,
        /// `slurmd -V` beside it.
        version: SlurmVersion,
    },
}

/// Checks that this image can be a login node: a sackd beside `slurm.bin_dir`, of Slurm
/// 23.11 or later (sackd has no `-V`: the version is `slurmd -V` of the same install; an
/// image without slurmd is not refused on the version). Returns that version.
///
/// # Errors
/// [`LoginUnsupported`].
pub async fn check_login(slurm: &SlurmSettings) -> Result<Option<SlurmVersion>, LoginUnsupported> {
    let sackd = sackd_path(&slurm.bin_dir);
    let version =
        super::version::slurmd_version(&super::version::slurmd_path(&slurm.bin_dir)).await;
    if !is_executable(&sackd) {
        return Err(LoginUnsupported::NoSackd { sackd, version });
    }
    match version {
        Some(v) if !v.at_least(SACKD_SINCE.0, SACKD_SINCE.1) => {
            Err(LoginUnsupported::TooOld { sackd, version: v })
        }
        v => Ok(v),
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Why sackd's start could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum SackdError {
    /// The options file could not be written.
    #[error(transparent)]
    Options(#[from] OptionsFileError),
    /// systemd did not stop sackd.
    #[error(transparent)]
    Systemd(#[from] SystemdError),
}

/// The options file of `slurm`: `slurm.sackd_options_file`, else the distribution's.
pub fn options_file(slurm: &SlurmSettings) -> PathBuf {
    if slurm.sackd_options_file.as_os_str().is_empty() {
        super::options::default_sackd_options_file()
    } else {
        slurm.sackd_options_file.clone()
    }
}

/// Prepares sackd's start: writes its options file (`--conf-server` from
/// `slurm.conf_servers`; `SLURM_SACK_KEY` naming `sack_key` with auth/slurm) and stops sackd
/// when the options changed or `key_changed`, so that the start that follows uses them.
/// Returns whether it was stopped.
///
/// # Errors
/// [`SackdError`]; nothing is stopped before the options file is written.
pub async fn prepare(
    slurm: &SlurmSettings,
    sack_key: Option<&Path>,
    key_changed: bool,
    systemd: &Systemd,
) -> Result<bool, SackdError> {
    let servers = slurm.servers();
    let args = super::options::sackd_args(&servers);
    let changed = super::options::write_sackd_options(&options_file(slurm), &args, sack_key)?;
    let restart = changed || key_changed;
    if restart {
        systemd.stop(&slurm.sackd_unit).await?;
    }
    Ok(restart)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn sackd_is_beside_the_client_commands() {
        assert_eq!(
            sackd_path(Path::new("/opt/slurm/bin")),
            PathBuf::from("/opt/slurm/sbin/sackd")
        );
        assert_eq!(
            sackd_path(Path::new("/usr/bin")),
            PathBuf::from("/usr/sbin/sackd")
        );
    }

    #[tokio::test]
    async fn an_image_without_sackd_cannot_be_a_login_node() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("bin")).unwrap();
        let slurm = SlurmSettings {
            bin_dir: dir.path().join("bin"),
            ..SlurmSettings::default()
        };
        let e = check_login(&slurm).await.unwrap_err();
        assert!(
            matches!(e, LoginUnsupported::NoSackd { version: None, .. }),
            "{e:?}"
        );
        let text = e.to_string();
        assert!(
            text.contains("sbin/sackd") && text.contains("23.11"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn sackd_of_a_slurm_before_23_11_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let sbin = dir.path().join("sbin");
        std::fs::create_dir_all(dir.path().join("bin")).unwrap();
        std::fs::create_dir_all(&sbin).unwrap();
        for (name, body) in [
            ("sackd", "#!/bin/sh\nexit 0\n"),
            ("slurmd", "#!/bin/sh\necho 'slurm 22.05.8'\n"),
        ] {
            crate::fsutil::write_test_program(&sbin.join(name), body);
        }
        let slurm = SlurmSettings {
            bin_dir: dir.path().join("bin"),
            ..SlurmSettings::default()
        };
        let e = check_login(&slurm).await.unwrap_err();
        assert_eq!(
            e,
            LoginUnsupported::TooOld {
                sackd: sbin.join("sackd"),
                version: SlurmVersion::new(22, 5, 8)
            }
        );
        assert!(e.to_string().contains("22.05.8"), "{e}");
        crate::fsutil::write_test_program(
            &sbin.join("slurmd"),
            "#!/bin/sh\necho 'slurm 25.11.6'\n",
        );
        assert_eq!(
            check_login(&slurm).await.unwrap(),
            Some(SlurmVersion::new(25, 11, 6))
        );
    }
}
