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
