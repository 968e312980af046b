//! Test harness for the end-to-end tests: real munge, slurmctld and slurmd (Slurm 22.05
//! from Debian), moto's server for SSM and Secrets Manager, and a confined real
//! `systemd --user` Manager, each started by a test and stopped by PID when its guard is
//! dropped, also when the test panics (the tail of its log is then printed, and its
//! scratch folder is kept).
//!
//! Everything is synchronous (`std::process`), for plain `#[test]` functions, and safe to
//! use from tests running in parallel: ports are picked free per instance, names are
//! unique, and the one munged that must sit on munge's default socket is shared (see
//! [`munge`]).
//!
//! ```no_run
//! use std::time::Duration;
//! use slurm_e2e::{Moto, Munge, Slurmctld, Slurmd};
//!
//! let ctld = Slurmctld::builder("demo").line("HealthCheckInterval=30").start()?;
//! let _node = Slurmd::dynamic(&ctld, "node1", "CPUs=1 RealMemory=500")?;
//! ctld.wait_node_idle("node1", Duration::from_secs(30))?;
//! let out = ctld.run_job("srun", &["-N1", "-w", "node1", "hostname"])?;
//! assert!(out.status.success());
//!
//! let moto = Moto::start()?;
//! moto.create_secret_binary("cluster/munge-key", &Munge::shared()?.key()?)?;
//! # anyhow::Ok(())
//! ```
//!
//! The IMDS emulator comes from the `imds-emulator` crate, re-exported as
//! [`imds_emulator`].

pub mod agent;
pub mod fleet;
pub mod fleet_scenarios;
pub mod host_limits;
pub mod install;
pub mod moto;
pub mod munge;
pub mod noise;
pub mod process;
pub mod slurm;
pub mod systemd;

pub use imds_emulator;
pub use moto::Moto;
pub use munge::Munge;
pub use process::{free_port, run_ok, run_with_timeout, unique_name, wait_until, Daemon, TempRoot};
pub use slurm::{is_idle, NodeKind, Slurmctld, SlurmctldBuilder, Slurmd};
pub use systemd::UserSystemd;

/// Unix seconds now.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Unix seconds as RFC 3339 UTC (`2019-10-31T07:02:24Z`), the form of EC2's times in
/// instance metadata (e.g. `pendingTime`).
pub fn rfc3339(unix: u64) -> String {
    let days = i64::try_from(unix / 86_400).unwrap_or(i64::MAX);
    let rem = unix % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// An instance identity document (`dynamic/instance-identity/document`) as EC2 serves it,
/// for `instance_id` launched from `ami_id` at `pending_time` (Unix seconds).
pub fn identity_document(instance_id: &str, ami_id: &str, pending_time: u64) -> String {
    serde_json::to_string_pretty(&serde_json::json!({
        "accountId": "123456789012",
        "architecture": "x86_64",
        "availabilityZone": "us-east-1a",
        "imageId": ami_id,
        "instanceId": instance_id,
        "instanceType": "c5.large",
        "pendingTime": rfc3339(pending_time),
        "region": "us-east-1",
        "version": "2017-09-30",
    }))
    .unwrap_or_default()
}

/// Reads a Prometheus textfile the agent wrote and checks it, and every other `*.prom`
/// file in its folder, with `promtool check metrics` (Debian's `prometheus` package):
/// panics naming the file and what promtool said. Returns the file's text.
pub fn read_prom(path: &std::path::Path) -> String {
    let dir = path.parent().expect("a textfile in a folder");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "prom"))
        .collect();
    files.sort();
    assert!(
        files.iter().any(|p| p == path),
        "{} is missing",
        path.display()
    );
    for f in &files {
        let out = std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::fs::File::open(f).unwrap_or_else(|e| panic!("{}: {e}", f.display())))
            .output()
            .expect("promtool (scripts/test-deps.sh installs Debian's prometheus package)");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success() && said.trim().is_empty(),
            "promtool check metrics {}:\n{said}\n--- the file:\n{}",
            f.display(),
            std::fs::read_to_string(f).unwrap_or_default()
        );
    }
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_matches_known_instants() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(1_572_505_344), "2019-10-31T07:02:24Z");
        assert_eq!(super::rfc3339(1_709_164_800), "2024-02-29T00:00:00Z");
    }
}
