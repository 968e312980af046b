//! `slurm-node-agent`: makes a cloud instance a Slurm node and keeps it one.
//!
//! One module per outside system the agent talks to:
//! - [`imds`]: the EC2 instance metadata service (IMDSv2 only), through aws-config's client.
//! - [`section`]: what each module's settings section is made of (durations, trust classes).
//! - [`settings`]: layered, validated settings (defaults, files, drop-ins, tags, user data, flags).
//! - [`authkey`]: the cluster's munge / auth/slurm key from SSM, Secrets Manager or a file.
//! - [`nodedef`]: the Slurm node definition (NodeName, dynamic `--conf` line) from host facts.
//! - [`slurm`]: `slurmd` options, `scontrol` calls and the parsers of their output.
//! - [`systemd`]: the systemd Manager API over D-Bus (zbus).
//! - [`identity`]: who the node is (NodeName, instance incarnation).
//! - [`reason`]: the agent's drain reasons in Slurm, and whose a record or a drain is.
//! - [`location`]: the `ssm:`, `secretsmanager:`, `file:` and `s3://` locations things are
//!   fetched from.
//! - [`bootstrap`]: first boot, from instance metadata to a node IDLE in slurmctld.
//! - [`pcs`]: the managed join (AWS Parallel Computing Service registration).
//! - [`cloudinit`]: waiting (bounded) for cloud-init, so user-data scripts run before slurmd.
//! - [`health`]: node health checks (`check`, `HealthCheckProgram`).
//! - [`mounts`]: FSx for Lustre, EFS and NFS mounts through systemd `.mount` units.
//! - [`time`]: Unix seconds and the time formats IMDS and Slurm write.
//! - [`events`]: IMDS interruption and maintenance notices; [`upgrade`]: rolling image
//!   upgrades; [`drain`]: the one drain state machine; [`daemon`]: the `run` loop.
//!
//! `main.rs` only parses the command line and maps errors to exit codes; everything else is
//! here so that tests reach it.

pub mod authkey;
pub mod bootstrap;
pub mod cli;
pub mod cloudinit;
pub mod daemon;
pub mod drain;
pub mod events;
pub mod fsutil;
pub mod health;
pub mod hostfacts;
pub mod identity;
pub mod imds;
pub mod location;
pub mod mounts;
pub mod node_lifecycle;
pub mod nodedef;
pub mod pcs;
pub mod reason;
pub mod retry;
pub mod section;
pub mod settings;
pub mod slurm;
pub mod systemd;
pub mod time;
pub mod upgrade;
pub mod userdata;
