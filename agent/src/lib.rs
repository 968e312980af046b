//! `slurm-node-agent`: makes a cloud instance a Slurm node and keeps it one.
//!
//! # Floors
//!
//! The top-level modules form floors: a module uses only modules on floors below its own,
//! so the graph of their `crate::<module>` references has no cycle, and a change to a
//! module can reach only the floors above it. A module's floor is the longest path from it
//! down to the ground floor. `tests/module_floors.rs` fails on a cycle (naming it, with a
//! `file:line` witness for each edge), and when this table or a module's own docs give
//! another floor than the code has.
//!
//! | floor | modules |
//! |---|---|
//! | 11 | [`cli`] |
//! | 10 | [`bootstrap`], [`daemon`] |
//! | 9 | [`identity`] |
//! | 8 | [`settings`] |
//! | 7 | [`events`], [`rollout`] |
//! | 6 | [`drain`], [`gate`], [`scratch`] |
//! | 5 | [`health`], [`mounts`], [`node_lifecycle`], [`upgrade`] |
//! | 4 | [`node_state`], [`pcs`] |
//! | 3 | [`slurm`] |
//! | 2 | [`authkey`], [`capacity_block`], [`ec2tags`], [`nodedef`] |
//! | 1 | [`cloudinit`], [`cloudwatch`], [`imds`], [`orphan`], [`progress`], [`repair`], [`systemd`], [`textfile`] |
//! | 0 | [`exit`], [`fsutil`], [`hostfacts`], [`location`], [`reason`], [`retry`], [`section`], [`time`], [`userdata`] |
//!
//! - **Roof (10 to 12)**: [`cli`], one file per subcommand; [`daemon`], the `run` loop (and
//!   the rolling upgrade's rollout check); [`bootstrap`], first boot from instance metadata
//!   to a node IDLE in slurmctld, as a list of steps that each live with their subject.
//! - **Assembly (8, 9)**: [`settings`] reads the layers (defaults, files, drop-ins, user
//!   data, tags, flags), enforces each key's trust class and assembles every module's
//!   section; [`identity`] says who the node is (NodeName, instance incarnation) for every
//!   command.
//! - **Subsystems (4 to 7)**, each owning its settings section: [`events`], IMDS
//!   interruption and maintenance notices; [`drain`], the drain engine that moves the one
//!   drain state machine forward; [`node_state`], that state machine's states, causes and
//!   store, and the one gateway through which every change of the node's state in Slurm
//!   goes (drain, resume, reboot, delete); [`node_lifecycle`], the lifecycle scripts; [`scratch`], node-local scratch striped
//!   over the instance store disks; [`health`], node health checks (`check`,
//!   `HealthCheckProgram`); [`mounts`], FSx for Lustre, EFS and NFS mounts through systemd
//!   `.mount` units; [`pcs`], the managed join (AWS Parallel Computing Service
//!   registration); [`upgrade`], rolling image upgrades and their actions.
//! - **Outside systems (1 to 3)**, one module each, with its section: [`slurm`], `slurmd`'s
//!   options, `scontrol` calls and the parsers of their output; [`authkey`], the cluster's
//!   munge / auth/slurm key from SSM, Secrets Manager or a file; [`nodedef`], the Slurm
//!   node definition (NodeName, dynamic `--conf` line) from host facts; [`imds`], the EC2
//!   instance metadata service (IMDSv2 only), through aws-config's client; [`ec2tags`], the
//!   instance's tags through EC2's `DescribeTags` (`imds.tags = "describe-tags"`);
//!   [`capacity_block`], the Capacity Block the instance runs in and its end; [`systemd`], the
//!   systemd Manager API over D-Bus (zbus); [`cloudinit`], the bounded wait for cloud-init;
//!   and, on floor 1 though it is no outside system, [`repair`], what a fault the health
//!   checks found calls for (the `auto` table, the site's overrides, `report` mode's record),
//!   and [`orphan`], when a node whose controller is gone or whose record was deleted
//!   powers itself off (`[orphan]`); [`progress`], what a long step waits for, said
//!   every 10 s in the journal and to `status`; [`textfile`], the writer of the Prometheus
//!   textfiles and what each carries (the build, throttled AWS calls); and [`cloudwatch`],
//!   the CloudWatch agent's configuration (log groups, retention, native metrics).
//! - **Ground (0)**: what everything uses and that uses nothing of the crate: [`reason`],
//!   the agent's drain reasons in Slurm and whose a record or a drain is; [`time`], Unix
//!   seconds and the time formats IMDS and Slurm write; [`section`], what each settings
//!   section is made of (durations, trust classes); [`location`], the `ssm:`,
//!   `secretsmanager:`, `file:` and `s3://` locations things are fetched from;
//!   [`hostfacts`], CPUs, memory, GPUs and the boot id; [`fsutil`], symlink-safe atomic
//!   writes; [`retry`], backoff; [`userdata`], the settings parts of user data; [`exit`],
//!   the exit codes every command ends with (one table).
//!
//! `main.rs` only parses the command line and runs the command; everything else is here so
//! that tests reach it. Library modules return `thiserror` enums whose variants carry the
//! path, key, unit or command a person needs; each top-level error says which [`exit::Exit`]
//! it ends a command with; `anyhow` is for the edges only.

pub mod authkey;
pub mod bootstrap;
pub mod capacity_block;
pub mod cli;
pub mod cloudinit;
pub mod cloudwatch;
pub mod daemon;
pub mod drain;
pub mod ec2tags;
pub mod events;
pub mod exit;
pub mod fsutil;
pub mod gate;
pub mod health;
pub mod hostfacts;
pub mod identity;
pub mod imds;
pub mod location;
pub mod mounts;
pub mod node_lifecycle;
pub mod node_state;
pub mod nodedef;
pub mod orphan;
pub mod pcs;
pub mod progress;
pub mod reason;
pub mod repair;
pub mod retry;
pub mod rollout;
pub mod scratch;
pub mod section;
pub mod settings;
pub mod slurm;
pub mod systemd;
pub mod textfile;
pub mod time;
pub mod upgrade;
pub mod userdata;
