//! Which Slurm release the node runs, and what the agent does differently because of it:
//! the one place where behaviour depends on a Slurm version. Each method below names the
//! release that changed a thing and where Slurm documents or does it.

use std::path::{Path, PathBuf};

/// A Slurm release as `slurmd -V` prints it (`slurm 25.11.6`): `MAJOR.MINOR.MICRO`, the
/// year and month of the major release, then the maintenance release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlurmVersion {
    /// Year of the release: 22, 23, 24, 25, 26.
    pub major: u32,
    /// Month of the release: 2, 5 or 11.
    pub minor: u32,
    /// Maintenance release.
    pub micro: u32,
}

impl SlurmVersion {
    /// `major.minor.micro`.
    pub const fn new(major: u32, minor: u32, micro: u32) -> SlurmVersion {
        SlurmVersion {
            major,
            minor,
            micro,
        }
    }

    /// Parses `slurm 25.11.6`, `25.11.6`, `25.11` or a version with a suffix
    /// (`24.11.5-1`, `25.11.0-0rc1`): the last word, its first three numbers.
    pub fn parse(text: &str) -> Option<SlurmVersion> {
        let word = text.split_whitespace().last()?;
        let mut parts = word.split(['.', '-']);
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let micro = parts
            .next()
            .map(|p| p.trim_end_matches(|c: char| !c.is_ascii_digit()))
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        Some(SlurmVersion::new(major, minor, micro))
    }

    /// The release without its maintenance number: `26.05`.
    pub fn release(self) -> String {
        format!("{}.{:02}", self.major, self.minor)
    }

    /// At least `major.minor`.
    pub fn at_least(self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }

    /// slurmd takes `--instance-id` and `--instance-type`, and `scontrol show node` shows
    /// `InstanceId=` and `InstanceType=` (23.11; slurmd(8)).
    pub fn has_instance_fields(self) -> bool {
        self.at_least(23, 11)
    }

    /// `AuthType=auth/slurm` and `CredType=cred/slurm` exist (23.11: `slurm.key`, or the
    /// file `SLURM_SACK_KEY` names); `slurm.jwks` with several keys arrived in 24.05.
    pub fn has_auth_slurm(self) -> bool {
        self.at_least(23, 11)
    }

    /// slurmctld takes slurmd's `--instance-id`/`--instance-type` (and `Extra`, topology)
    /// only at the node's first registration or when the node booted since slurmctld last
    /// heard from it (slurmd's boot time later than the record's last response): a slurmd
    /// restarted without a reboot keeps the record's values, so an `scontrol update
    /// InstanceId=` stays (26.05: `validate_node_specs` in `src/slurmctld/node_mgr.c`).
    /// Before 26.05 every registration applies them. A replacement instance is a new
    /// machine, so its first registration names it either way.
    pub fn applies_instance_fields_after_boot_only(self) -> bool {
        self.at_least(26, 5)
    }

    /// The reference `slurmd.service` is `Type=notify` with `slurmd --systemd` (23.11;
    /// `etc/slurmd.service.in`), instead of a plain `slurmd -D`.
    pub fn has_notify_unit(self) -> bool {
        self.at_least(23, 11)
    }

    /// slurmctld appends its own reasons to a node's reason after ` : ` instead of
    /// replacing it (23.02: `set_node_reason`, e.g. `<reason> : reboot issued`).
    pub fn appends_system_reasons(self) -> bool {
        self.at_least(23, 2)
    }

    /// `State=RESUME` leaves the node's reason in place unless accounting storage is
    /// configured (23.02 to 25.11: the reason is cleared only by
    /// `clusteracct_storage_g_node_up`, which returned before clearing it without a storage
    /// plugin; seen on 24.11.7 and 25.11.6). 26.05 clears it first, with or without a
    /// plugin (26.05.3, `src/interfaces/accounting_storage.c`; captured in
    /// `tests/fixtures/slurm-26.05/scontrol-show-node-resumed.txt`). Readers use
    /// [`crate::slurm::NodeInfo::held_reason`] on every version, which ignores a reason on
    /// a record that is not drained, down or failing.
    pub fn may_keep_reason_after_resume(self) -> bool {
        self.at_least(23, 2) && !self.at_least(26, 5)
    }

    /// A dynamic node may name its topology in `--conf` (`Topology=`, 25.05).
    pub fn has_dynamic_topology(self) -> bool {
        self.at_least(25, 5)
    }

    /// slurmd serves `/readyz` and `/healthz` on its HTTP listener (25.11).
    pub fn has_slurmd_http_probes(self) -> bool {
        self.at_least(25, 11)
    }

    /// `HealthCheckTimeout` exists in slurm.conf (26.05); before it slurmd kills the
    /// HealthCheckProgram after 60 s.
    pub fn has_health_check_timeout(self) -> bool {
        self.at_least(26, 5)
    }

    /// `HealthCheckNodeState=START_ONLY` exists (25.11): slurmd runs the
    /// HealthCheckProgram only at its start, before it registers (`slurmd.c`:
    /// `run_script_health_check` before `_registration_engine`), and slurmctld never asks
    /// for periodic runs (`controller.c`). Older releases log "Invalid HealthCheckNodeState
    /// value START_ONLY ignored" and read the rest of the list (`ANY` when nothing is left).
    pub fn has_health_check_start_only(self) -> bool {
        self.at_least(25, 11)
    }

    /// `HealthCheckNodeState=REBOOT_ONLY` exists (26.05): slurmd skips its start run, and
    /// slurmctld asks for one run when a node it rebooted (`scontrol reboot`,
    /// `REBOOT_ISSUED`) registers again (`node_mgr.c`: `run_health_check_individual`), never
    /// periodically. Older releases ignore the word as for START_ONLY.
    pub fn has_health_check_reboot_only(self) -> bool {
        self.at_least(26, 5)
    }

    /// slurmctld and slurmd refuse to start when `START_ONLY` or `REBOOT_ONLY` is combined
    /// with any other HealthCheckNodeState word, `CYCLE` included (26.05, `read_config.c`:
    /// "cannot be combined with other options"). 25.11 takes `START_ONLY,IDLE`: the start
    /// run happens and slurmctld never asks for more, as with `START_ONLY` alone.
    pub fn refuses_combined_health_check_only(self) -> bool {
        self.at_least(26, 5)
    }

    /// The HealthCheckProgram may get `SLURM_NODE_IS_HEALTHY=yes|no` (26.05, `slurmd.c`
    /// `run_script_health_check`): on runs slurmctld asks for when slurm.conf has
    /// `SlurmctldParameters=health_check_report` (`REQUEST_NODE_HEALTH_CHECK`, sent to
    /// 26.05+ slurmds only); `no` when slurmctld holds the node DOWN, DRAIN(ED/ING), FAIL or
    /// in MAINT (`ping_nodes.c`: `_node_unhealthy_for_hc`), `yes` otherwise. Never at
    /// slurmd's start, nor without the parameter.
    pub fn has_node_health_hint(self) -> bool {
        self.at_least(26, 5)
    }
}

impl std::fmt::Display for SlurmVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{:02}.{}", self.major, self.minor, self.micro)
    }
}

/// The slurmd beside the client commands in `bin_dir`: `<bin_dir>/../sbin/slurmd`
/// (`/usr/bin` → `/usr/sbin/slurmd`, `/opt/slurm/bin` → `/opt/slurm/sbin/slurmd`).
pub fn slurmd_path(bin_dir: &Path) -> PathBuf {
    bin_dir
        .parent()
        .map_or_else(|| PathBuf::from("/usr/sbin"), |p| p.join("sbin"))
        .join("slurmd")
}

/// The version of `slurmd` (`slurmd -V`, run directly, never through a shell). `None`
/// when it cannot be run (no slurmd there) or prints no version; the caller then uses
/// what every supported release accepts.
pub async fn slurmd_version(slurmd: &Path) -> Option<SlurmVersion> {
    let out = tokio::process::Command::new(slurmd)
        .arg("-V")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(10), out)
        .await
        .ok()?
        .ok()?;
    SlurmVersion::parse(&String::from_utf8_lossy(&out.stdout))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_what_slurmd_prints() {
        assert_eq!(
            SlurmVersion::parse("slurm 25.11.6\n"),
            Some(SlurmVersion::new(25, 11, 6))
        );
        assert_eq!(
            SlurmVersion::parse("slurm-wlm 22.05.8"),
            Some(SlurmVersion::new(22, 5, 8))
        );
        assert_eq!(
            SlurmVersion::parse("24.11.5-1"),
            Some(SlurmVersion::new(24, 11, 5))
        );
        assert_eq!(
            SlurmVersion::parse("25.11.0-0rc1"),
            Some(SlurmVersion::new(25, 11, 0))
        );
        assert_eq!(SlurmVersion::parse("slurm"), None);
        assert_eq!(SlurmVersion::parse(""), None);
        assert_eq!(SlurmVersion::new(26, 5, 3).to_string(), "26.05.3");
    }

    #[test]
    fn each_change_is_at_its_release() {
        let v = |s: &str| SlurmVersion::parse(s).unwrap();
        assert!(!v("22.05.8").has_instance_fields() && v("23.11.0").has_instance_fields());
        assert!(!v("23.02.7").has_auth_slurm() && v("23.11.0").has_auth_slurm());
        assert!(
            !v("25.11.6").applies_instance_fields_after_boot_only()
                && v("26.05.3").applies_instance_fields_after_boot_only()
        );
        assert!(!v("22.05.8").appends_system_reasons() && v("23.02.0").appends_system_reasons());
        assert!(
            !v("22.05.8").may_keep_reason_after_resume()
                && v("24.11.7").may_keep_reason_after_resume()
                && v("25.11.6").may_keep_reason_after_resume()
                && !v("26.05.3").may_keep_reason_after_resume()
        );
        assert!(!v("24.11.7").has_dynamic_topology() && v("25.05.0").has_dynamic_topology());
        assert!(!v("25.05.5").has_slurmd_http_probes() && v("25.11.6").has_slurmd_http_probes());
        assert!(
            !v("25.11.6").has_health_check_timeout() && v("26.05.3").has_health_check_timeout()
        );
        assert!(
            v("25.11.6").has_health_check_start_only()
                && !v("25.11.6").has_health_check_reboot_only()
        );
        assert!(!v("25.05.5").has_health_check_start_only());
        assert!(
            v("26.05.3").has_health_check_reboot_only()
                && v("26.05.3").refuses_combined_health_check_only()
                && !v("25.11.6").refuses_combined_health_check_only()
        );
        assert!(!v("25.11.6").has_node_health_hint() && v("26.05.0").has_node_health_hint());
        assert!(v("22.05.8") < v("23.02.0") && v("25.11.6") < v("26.05.0"));
    }

    #[test]
    fn slurmd_sits_beside_the_clients() {
        assert_eq!(
            slurmd_path(Path::new("/usr/bin")),
            Path::new("/usr/sbin/slurmd")
        );
        assert_eq!(
            slurmd_path(Path::new("/opt/slurm/bin")),
            Path::new("/opt/slurm/sbin/slurmd")
        );
    }
}
