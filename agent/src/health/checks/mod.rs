//! The check families and what each one verifies. A check's evaluation returns
//! `Ok(message)` when it passes and `Err(`[`Failed`]`)` when it fails, which names what was
//! checked and displays NHC's words (they become the Slurm drain reason); the engine adds
//! the timeout, the duration and the check's name.

pub mod cmd;
pub mod dmi;
pub mod efa;
pub mod file;
pub mod fs;
pub mod gpu;
pub mod hw;
pub mod net;
pub mod ps;
pub mod psres;

use std::time::Duration;

use super::facts::{Facts, FactsError};
use super::ConfigError;

/// What a failed check looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// The file system mounted on (or holding) this path.
    FileSystem(String),
    /// CPU topology (`/proc/cpuinfo`).
    Cpu,
    /// Memory and swap sizes (`/proc/meminfo`).
    Memory,
    /// The shape of this instance type.
    InstanceType(String),
    /// InfiniBand ports (of this device, when one is named).
    Infiniband(Option<String>),
    /// A network interface, by its match expression.
    NetDev(String),
    /// GPUs (NVML, kernel XID messages).
    Gpus,
    /// EFA devices.
    Efa,
    /// A process (the service name or match expression).
    Process(String),
    /// Load averages (`/proc/loadavg`).
    LoadAvg,
    /// A systemd unit.
    Unit(String),
    /// These files.
    Files(Vec<String>),
    /// A command (its argv).
    Command(Vec<String>),
    /// DMI data, by the match expression.
    Dmi(String),
    /// Machine check errors (mcelog's argv).
    Mcelog(Vec<String>),
    /// Processes over a resource limit, of unauthorized users, or kswapd's (the NHC
    /// check: `check_ps_cpu`...).
    Processes(String),
    /// Sockets (the criteria, as described in messages).
    Sockets(String),
    /// A host answering ICMP echo.
    Host(String),
    /// A part of the start-up gate ([`crate::health::startgate`]).
    Gate,
}

/// Why a check failed: what it looked at, and NHC's words for it (which become the Slurm
/// drain reason).
#[derive(Debug, Clone, thiserror::Error)]
pub enum Failed {
    /// What the check looked at is not as expected.
    #[error("{message}")]
    Check {
        /// What the check looked at.
        checked: Checked,
        /// The failure as NHC words it.
        message: String,
    },
    /// A command (or mcelog) was killed at its timeout; displays as starting with
    /// [`cmd::TIMEOUT_PREFIX`], which the engine recognises.
    #[error("{prefix}{} for {:?}{killed}", cmd::shown_duration(*timeout), argv.join(" "), prefix = cmd::TIMEOUT_PREFIX)]
    TimedOut {
        /// The command.
        argv: Vec<String>,
        /// Its timeout.
        timeout: Duration,
        /// What the message says after the command: ` (program); killed with its ...`,
        /// or nothing.
        killed: String,
    },
    /// A command could not be started.
    #[error(transparent)]
    Command(#[from] cmd::CommandError),
    /// No socket table could be read.
    #[error(transparent)]
    Sockets(#[from] net::NoSocketTable),
    /// A host fact the check needs could not be read.
    #[error(transparent)]
    Host(#[from] FactsError),
    /// The definition cannot run on this node (the file and line say why).
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    /// A failure of a check that NHC prefixes with the check's name (`check_cmd_* -C`).
    #[error("{name}: {inner}")]
    Named {
        /// The name (NHC's `-C`).
        name: String,
        /// The failure.
        #[source]
        inner: Box<Failed>,
    },
    /// systemd could not be asked about a unit.
    #[error("{source}")]
    Systemd {
        /// The unit.
        unit: String,
        /// systemd's (or D-Bus's) error.
        #[source]
        source: std::sync::Arc<crate::systemd::SystemdError>,
    },
    /// A failure after which the engine took actions (killed, reniced, ran a program):
    /// the failure, then what was done.
    #[error("{inner}; {}", done.join("; "))]
    Acted {
        /// The failure.
        #[source]
        inner: Box<Failed>,
        /// What each action did.
        done: Vec<String>,
    },
    /// An async check given to [`CheckKind::run_blocking`] (a bug).
    #[error("internal error: an async check was run as a blocking one")]
    NotBlocking {
        /// The check's family.
        family: &'static str,
    },
    /// A check given to the wrong async runner (a bug).
    #[error("internal error: {family} is not {expected}")]
    WrongRunner {
        /// The check's family.
        family: &'static str,
        /// What the runner takes (`an async check`, `a process check`).
        expected: &'static str,
    },
    /// The blocking task of a check panicked or was cancelled.
    #[error("internal error: {0}")]
    Task(#[source] std::sync::Arc<tokio::task::JoinError>),
}

impl Failed {
    /// A failure of the check of `checked`, displayed as `message`.
    pub fn new(checked: Checked, message: impl Into<String>) -> Failed {
        Failed::Check {
            checked,
            message: message.into(),
        }
    }

    /// Whether the failure is a timeout: [`Failed::TimedOut`], or any failure whose
    /// message starts with [`cmd::TIMEOUT_PREFIX`] (as the engine has always told them).
    pub fn is_timeout(&self) -> bool {
        matches!(self, Failed::TimedOut { .. }) || self.to_string().starts_with(cmd::TIMEOUT_PREFIX)
    }
}

/// What one check verifies.
#[derive(Debug, Clone)]
pub enum CheckKind {
    /// A mount point: in `/proc/mounts` with the expected source, type and options; alive;
    /// optionally writable and with free space.
    Mount(fs::MountSpec),
    /// Space or inodes of the file system holding a path.
    Space(fs::SpaceSpec),
    /// Space and inodes of the file system holding a path, whether or not it is a mount
    /// point (checks.d's `space`).
    FreeSpace(fs::FreeSpaceSpec),
    /// CPU topology and memory sizes.
    Hardware(hw::HardwareSpec),
    /// An InfiniBand port ACTIVE/LinkUp at a rate.
    Ib(hw::IbSpec),
    /// A network interface exists.
    NetDev(super::matcher::Matcher),
    /// GPUs through NVML.
    Gpu(gpu::GpuSpec),
    /// EFA devices.
    Efa(efa::EfaSpec),
    /// A process runs (or must not run).
    Process(ps::ProcessSpec),
    /// Load averages under limits.
    LoadAvg(ps::LoadAvgSpec),
    /// A systemd unit's ActiveState over D-Bus.
    Unit(UnitSpec),
    /// File tests (`test -r -w ...`).
    FileTest(file::FileTestSpec),
    /// Lines of a file match (or do not match) expressions.
    FileContents(file::FileContentsSpec),
    /// stat() attributes of files.
    FileStat(file::FileStatSpec),
    /// The cluster key file of Slurm's authentication plugin (checks.d's `auth_key`).
    AuthKey(file::KeySpec),
    /// A command's exit status and output.
    Command(cmd::CommandSpec),
    /// DMI (SMBIOS) data from dmidecode.
    Dmi(dmi::DmiSpec),
    /// Machine check errors from `mcelog --client`.
    Mcelog(hw::McelogSpec),
    /// No process over a CPU, memory or CPU time limit.
    PsResource(psres::ResourceSpec),
    /// No process of an unauthorized user, or outside the resource manager's tree.
    PsUsers(Box<psres::UsersSpec>),
    /// kswapd CPU times balanced across NUMA nodes.
    Kswapd(psres::KswapdSpec),
    /// A socket exists (or must not).
    NetSocket(Box<net::SocketSpec>),
    /// A host answers ICMP echo.
    Ping(net::ping::PingSpec),
    /// A part of this boot's start-up gate, from its record.
    Gate(crate::health::startgate::GateSpec),
    /// A definition that cannot run on this node (an unsupported NHC function, a bad
    /// option...): always fails with this error, which names the file and line.
    Invalid(super::ConfigError),
}

/// A systemd unit in an expected state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitSpec {
    /// Unit name, e.g. `slurmd.service`.
    pub unit: String,
    /// Expected `ActiveState` (`active`).
    pub state: String,
}

impl CheckKind {
    /// Whether the check runs on a thread of its own (it reads the host: a hung file
    /// system or process must not hang the agent) as opposed to running as async code
    /// (commands, D-Bus, and the per-process and network checks, which read the host on
    /// a blocking thread of their own and then may take actions).
    pub fn is_blocking(&self) -> bool {
        !matches!(
            self,
            CheckKind::Command(_)
                | CheckKind::Unit(_)
                | CheckKind::Mcelog(_)
                | CheckKind::PsResource(_)
                | CheckKind::PsUsers(_)
                | CheckKind::Kswapd(_)
                | CheckKind::NetSocket(_)
                | CheckKind::Ping(_)
        )
    }

    /// A stable short family name for metrics: `mount`, `space`, `hardware`...
    pub fn family(&self) -> &'static str {
        match self {
            CheckKind::Mount(_) => "mount",
            CheckKind::Space(_) | CheckKind::FreeSpace(_) => "space",
            CheckKind::Hardware(_) => "hardware",
            CheckKind::Ib(_) => "infiniband",
            CheckKind::NetDev(_) => "netdev",
            CheckKind::Gpu(_) => "gpu",
            CheckKind::Efa(_) => "efa",
            CheckKind::Process(_) => "process",
            CheckKind::LoadAvg(_) => "loadavg",
            CheckKind::Unit(_) => "unit",
            CheckKind::FileTest(_)
            | CheckKind::FileContents(_)
            | CheckKind::FileStat(_)
            | CheckKind::AuthKey(_) => "file",
            CheckKind::Command(_) => "command",
            CheckKind::Dmi(_) => "dmi",
            CheckKind::Mcelog(_) => "mcelog",
            CheckKind::PsResource(_) | CheckKind::PsUsers(_) | CheckKind::Kswapd(_) => "process",
            CheckKind::NetSocket(_) | CheckKind::Ping(_) => "network",
            CheckKind::Gate(_) => "gate",
            CheckKind::Invalid(_) => "config",
        }
    }

    /// Runs a blocking check on the calling thread.
    ///
    /// # Errors
    /// [`Failed`]: why the check failed.
    pub fn run_blocking(&self, facts: &Facts) -> Result<String, Failed> {
        match self {
            CheckKind::Mount(s) => fs::check_mount(s, facts),
            CheckKind::Space(s) => fs::check_space(s, facts),
            CheckKind::FreeSpace(s) => fs::check_free_space(s),
            CheckKind::Hardware(s) => hw::check_hardware(s, facts),
            CheckKind::Ib(s) => hw::check_ib(s, facts),
            CheckKind::NetDev(m) => hw::check_netdev(m, facts),
            CheckKind::Gpu(s) => gpu::check_gpus(s, facts),
            CheckKind::Efa(s) => efa::check_efa(s, facts),
            CheckKind::Process(s) => ps::check_process(s, facts),
            CheckKind::LoadAvg(s) => ps::check_loadavg(s, facts),
            CheckKind::FileTest(s) => file::check_test(s),
            CheckKind::FileContents(s) => file::check_contents(s),
            CheckKind::FileStat(s) => file::check_stat(s, facts),
            CheckKind::AuthKey(s) => file::check_key(s, facts),
            CheckKind::Dmi(s) => dmi::check_dmi(s, facts),
            CheckKind::Gate(s) => {
                crate::health::startgate::check_gate(s, crate::hostfacts::boot_id().as_deref())
            }
            CheckKind::Invalid(e) => Err(Failed::Invalid(e.clone())),
            CheckKind::Command(_)
            | CheckKind::Unit(_)
            | CheckKind::Mcelog(_)
            | CheckKind::PsResource(_)
            | CheckKind::PsUsers(_)
            | CheckKind::Kswapd(_)
            | CheckKind::NetSocket(_)
            | CheckKind::Ping(_) => Err(Failed::NotBlocking {
                family: self.family(),
            }),
        }
    }
}
