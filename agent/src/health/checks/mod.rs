//! The check families and what each one verifies. A check's evaluation returns
//! `Ok(message)` when it passes and `Err(message)` when it fails; the engine adds the
//! timeout, the duration and the check's name.

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

use super::facts::Facts;

/// What one check verifies.
#[derive(Debug, Clone)]
pub enum CheckKind {
    /// A mount point: in `/proc/mounts` with the expected source, type and options; alive;
    /// optionally writable and with free space.
    Mount(fs::MountSpec),
    /// Space or inodes of the file system holding a path.
    Space(fs::SpaceSpec),
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
    /// A definition that cannot run on this node (an unsupported NHC function, a bad
    /// option...): always fails with this message, which names the file and line.
    Invalid(String),
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
            CheckKind::Space(_) => "space",
            CheckKind::Hardware(_) => "hardware",
            CheckKind::Ib(_) => "infiniband",
            CheckKind::NetDev(_) => "netdev",
            CheckKind::Gpu(_) => "gpu",
            CheckKind::Efa(_) => "efa",
            CheckKind::Process(_) => "process",
            CheckKind::LoadAvg(_) => "loadavg",
            CheckKind::Unit(_) => "unit",
            CheckKind::FileTest(_) | CheckKind::FileContents(_) | CheckKind::FileStat(_) => "file",
            CheckKind::Command(_) => "command",
            CheckKind::Dmi(_) => "dmi",
            CheckKind::Mcelog(_) => "mcelog",
            CheckKind::PsResource(_) | CheckKind::PsUsers(_) | CheckKind::Kswapd(_) => "process",
            CheckKind::NetSocket(_) | CheckKind::Ping(_) => "network",
            CheckKind::Invalid(_) => "config",
        }
    }

    /// Runs a blocking check on the calling thread.
    ///
    /// # Errors
    /// The failure message.
    pub fn run_blocking(&self, facts: &Facts) -> Result<String, String> {
        match self {
            CheckKind::Mount(s) => fs::check_mount(s, facts),
            CheckKind::Space(s) => fs::check_space(s, facts),
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
            CheckKind::Dmi(s) => dmi::check_dmi(s, facts),
            CheckKind::Invalid(m) => Err(m.clone()),
            CheckKind::Command(_)
            | CheckKind::Unit(_)
            | CheckKind::Mcelog(_)
            | CheckKind::PsResource(_)
            | CheckKind::PsUsers(_)
            | CheckKind::Kswapd(_)
            | CheckKind::NetSocket(_)
            | CheckKind::Ping(_) => {
                Err("internal error: an async check was run as a blocking one".into())
            }
        }
    }
}
