//! Repair: what a fault the health checks found calls for, once the node is drained for it
//! (`[repair]`). A fault is classified from the failing check's family and message
//! ([`Fault::classify`]); the `auto` table ([`AUTO`], printed in `docs/repair.md`) maps each
//! fault to an action, and a site overrides the action per check (`repair.checks`, keyed by
//! the check's name as its check file or `nhc.conf` line names it) or for every fault
//! (`repair.action`). Of several failing checks, the strongest action counts
//! (`replace` > `reboot` > `isolate` > `none`).
//!
//! Modes: `off` (the default: nothing is planned), `report` (the daemon's health pass
//! logs and counts what it would do, `REPAIR (report)`, and changes nothing), `on` (a
//! reboot or replacement is a cause of the drain state machine, `repair`, whose action runs
//! once no job is left, in a slot of the rollout's budget: the daemon's repair pass).
//!
//! The reason in Slurm says what will happen ([`reason`]): `slurm-node-agent/repair@<id>:
//! <check>: <message> [reboot after jobs]`, then `[rebooting]` or `[powered off for
//! replacement]`.
//!
//! The managed service's instance health checks name the same actions (AWS PCS API
//! reference, `HealthMonitoring.repairAction`: `AUTO`, `REPLACE`, `ISOLATE`, `NONE`); the
//! agent adds `reboot`.
//!
//! Floor 1 (outside systems' floor, though it is none): over `section` and `fsutil`; below
//! `settings` (its section), the daemon (its pass) and `status`.

use serde::{Deserialize, Serialize};

use crate::section::InvalidKey;

/// `repair.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum RepairMode {
    /// No repair is planned (today's behaviour: a fault drains and the node stays).
    #[default]
    Off,
    /// Trial: the daemon logs and counts what it would do; nothing changes.
    Report,
    /// Repairs happen: a reboot or replacement drains the node, waits for its jobs and
    /// runs, within the rollout's budget.
    On,
}

impl RepairMode {
    /// `off`, `report` or `on`.
    pub fn as_str(self) -> &'static str {
        match self {
            RepairMode::Off => "off",
            RepairMode::Report => "report",
            RepairMode::On => "on",
        }
    }
}

/// Where a repair stands, as its reason in Slurm says ([`reason`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Draining for the action: `[reboot after jobs]`, `[replace after jobs]`.
    AfterJobs(Planned),
    /// Slurm was asked to reboot the node: `[rebooting]`.
    Rebooting,
    /// Powered off for a replacement at these Unix seconds: `[powered off for replacement
    /// at 2026-12-07T01:00:00Z]`. The record keeps it after the instance is gone: the flap
    /// guard's history ([`flap`]).
    PoweredOff(i64),
}

/// The start of [`Stage::PoweredOff`]'s words.
pub const POWERED_OFF: &str = "powered off for replacement";

impl Stage {
    /// The words in brackets at the end of the reason.
    pub fn words(self) -> String {
        match self {
            Stage::AfterJobs(a) => format!("{a} after jobs"),
            Stage::Rebooting => "rebooting".to_string(),
            Stage::PoweredOff(at) => format!("{POWERED_OFF} at {}", crate::time::format(at)),
        }
    }
}

/// The repair's reason in Slurm, written by incarnation `instance_id`:
/// `slurm-node-agent/repair@<instance-id>: <detail> [<stage>]`, at most 256 characters
/// ([`crate::reason::REASON_MAX`]): `detail` (the health checks' `<check>: <message>`) is
/// cut so that the stage always shows.
pub fn reason(instance_id: &str, detail: &str, stage: Stage) -> String {
    use crate::reason::{AgentReason, ReasonCause, REASON_MAX};
    let suffix = format!(" [{}]", stage.words());
    let head = AgentReason::stated(ReasonCause::Repair, instance_id, "").to_reason();
    // `to_reason` of an empty detail ends with `-`: the head is one character shorter.
    let room = REASON_MAX
        .saturating_sub(head.chars().count() - 1)
        .saturating_sub(suffix.chars().count());
    let cut: String = detail.chars().take(room).collect();
    AgentReason::stated(
        ReasonCause::Repair,
        instance_id,
        &format!("{}{suffix}", cut.trim_end()),
    )
    .to_reason()
}

/// A repair's reason read back ([`reason`]'s form): who wrote it, the detail and the
/// stage's words. `None` for any other reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairReason {
    /// The incarnation that wrote it.
    pub instance_id: String,
    /// The health checks' words.
    pub detail: String,
    /// The words in brackets (`reboot after jobs`, `powered off for replacement`...).
    pub stage: String,
}

impl RepairReason {
    /// Whether the node powered off for a replacement.
    pub fn powered_off(&self) -> bool {
        self.stage.starts_with(POWERED_OFF)
    }

    /// When the node powered off for a replacement (Unix seconds), as its reason says.
    pub fn powered_off_at(&self) -> Option<i64> {
        let at = self.stage.strip_prefix(POWERED_OFF)?.strip_prefix(" at ")?;
        crate::time::parse(at).ok()
    }
}

/// Parses a reason Slurm shows (with or without slurmctld's appended ` : ...` words).
pub fn parse_reason(reason: &str) -> Option<RepairReason> {
    let r = crate::reason::AgentReason::parse(reason)?;
    if r.cause != crate::reason::ReasonCause::Repair {
        return None;
    }
    let (detail, stage) = r.detail.strip_suffix(']')?.rsplit_once(" [")?;
    Some(RepairReason {
        instance_id: r.instance_id,
        detail: detail.to_string(),
        stage: stage.to_string(),
    })
}

/// An action as a setting names it (`repair.action`, `repair.checks.<check>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum RepairAction {
    /// The [`AUTO`] table's action for the fault.
    #[default]
    Auto,
    /// Report only: the fault is recorded, the node keeps its state.
    None,
    /// Drain and stay (kept for investigation).
    Isolate,
    /// Drain, wait until no job runs, then Slurm's own reboot (`scontrol reboot ASAP
    /// nextstate=resume`); the checks after the boot decide.
    Reboot,
    /// Drain, wait until no job runs, then leave (powered off) for a replacement.
    Replace,
}

/// An action decided for a fault: [`RepairAction`] without `auto`. Ordered by strength.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Planned {
    /// Report only.
    None,
    /// Drain and stay.
    Isolate,
    /// Reboot once no job runs.
    Reboot,
    /// Replace once no job runs.
    Replace,
}

impl Planned {
    /// `none`, `isolate`, `reboot`, `replace`.
    pub fn as_str(self) -> &'static str {
        match self {
            Planned::None => "none",
            Planned::Isolate => "isolate",
            Planned::Reboot => "reboot",
            Planned::Replace => "replace",
        }
    }
}

impl std::fmt::Display for Planned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl RepairAction {
    /// The action decided for `fault`: the setting's, or the [`AUTO`] table's.
    pub fn for_fault(self, fault: Fault) -> Planned {
        match self {
            RepairAction::Auto => fault.auto(),
            RepairAction::None => Planned::None,
            RepairAction::Isolate => Planned::Isolate,
            RepairAction::Reboot => Planned::Reboot,
            RepairAction::Replace => Planned::Replace,
        }
    }
}

/// A fault, as the health checks' families and messages tell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// A GPU fallen off the bus (Xid 79, or the driver's words), one the kernel sees on
    /// PCI that NVML lost, or fewer GPUs than the instance type has.
    GpuLost,
    /// A GPU's memory degraded past its limits: retired pages, uncorrectable remapped
    /// rows over the limit, or a row remapping that failed.
    GpuMemoryDegraded,
    /// An error a GPU reset clears: uncorrected ECC errors, an Xid other than 79, an
    /// NVLink inactive, NVML or Fabric Manager not answering.
    GpuResettable,
    /// A GPU too hot or slowed down by the hardware.
    GpuThermal,
    /// A DCGM diagnostic test of the start-up gate failed on a GPU with a hardware or
    /// performance error (NVLink, NVSwitch, PCIe, other hardware; a bandwidth or throughput
    /// under its threshold): it fails under load.
    GpuDiagnostic,
    /// Fewer EFA devices than the instance has, or one whose device stopped answering its
    /// driver's admin commands (`no_completion_cmds` moved).
    EfaMissing,
    /// An EFA port not ACTIVE or not LinkUp.
    EfaPort,
    /// The instance has less memory or fewer CPUs than its type, or machine check errors.
    HardwareDegraded,
    /// A required file system is not mounted, not writable or full.
    FileSystem,
    /// A check file entry that does not parse (the site's configuration, not the node).
    CheckConfig,
    /// Any other failing check (a process, a unit, a command, the network...).
    Other,
}

/// One row of the [`AUTO`] table.
#[derive(Debug, Clone, Copy)]
pub struct AutoRow {
    /// The fault.
    pub fault: Fault,
    /// What `auto` does for it.
    pub action: Planned,
    /// What the fault is, for `docs/repair.md`.
    pub what: &'static str,
    /// Why that action.
    pub why: &'static str,
}

/// The `auto` table: each fault's action, in `docs/repair.md` (a test compares them).
pub const AUTO: &[AutoRow] = &[
    AutoRow {
        fault: Fault::GpuLost,
        action: Planned::Replace,
        what: "a GPU fallen off the bus (Xid 79), on PCI but lost by NVML, or fewer GPUs than the instance type has",
        why: "the hardware is gone; a reboot rarely brings it back for long",
    },
    AutoRow {
        fault: Fault::GpuMemoryDegraded,
        action: Planned::Replace,
        what: "retired pages or uncorrectable remapped rows over the limit, or a row remapping that failed",
        why: "the GPU's memory has no spare left",
    },
    AutoRow {
        fault: Fault::GpuResettable,
        action: Planned::Reboot,
        what: "uncorrected ECC errors, an Xid other than 79, an NVLink inactive, NVML or Fabric Manager not answering or not running",
        why: "a GPU reset clears it (a pending row remapping is applied at the reset); the checks after the boot decide",
    },
    AutoRow {
        fault: Fault::GpuThermal,
        action: Planned::Isolate,
        what: "a GPU over its temperature limit, or slowed down by the hardware (HW Slowdown, HW Thermal Slowdown, HW Power Brake Slowdown)",
        why: "cooling or power is the instance's host's; kept for investigation",
    },
    AutoRow {
        fault: Fault::GpuDiagnostic,
        action: Planned::Replace,
        what: "a DCGM diagnostic of the start-up gate failed on a GPU with a hardware error (NVLink, NVSwitch, PCIe, other) or under a performance threshold, or a GPU's NVLink fabric health is Unhealthy",
        why: "the GPU fails under load on a fresh boot; a reboot was the start of the test",
    },
    AutoRow {
        fault: Fault::EfaMissing,
        action: Planned::Replace,
        what: "fewer EFA devices than the instance type has, one on PCI without its device, or one that stopped answering its driver (no_completion_cmds moved)",
        why: "the network interface is gone; another instance gets new ones",
    },
    AutoRow {
        fault: Fault::EfaPort,
        action: Planned::Reboot,
        what: "an EFA port not ACTIVE or not LinkUp, or its state unreadable",
        why: "the driver brings the port up again at the boot; the checks after it decide",
    },
    AutoRow {
        fault: Fault::HardwareDegraded,
        action: Planned::Replace,
        what: "less memory or fewer CPUs than the instance type, machine check errors",
        why: "the host's hardware is degraded",
    },
    AutoRow {
        fault: Fault::FileSystem,
        action: Planned::Isolate,
        what: "a file system not mounted, not writable or full",
        why: "a shared file system fails for every node alike, and a new instance mounts the same one",
    },
    AutoRow {
        fault: Fault::CheckConfig,
        action: Planned::None,
        what: "a check file entry that does not parse",
        why: "the site's configuration is wrong, not the node",
    },
    AutoRow {
        fault: Fault::Other,
        action: Planned::Isolate,
        what: "any other failing check (a process, a unit, a command, the network, the cluster key), a check that timed out, the kernel log unread, a Fabric Manager of another version than the driver, more GPUs than expected",
        why: "the agent cannot tell whether the node is at fault, or the image or a setting is",
    },
];

impl Fault {
    /// Every fault, in [`AUTO`]'s order.
    pub const ALL: [Fault; 11] = [
        Fault::GpuLost,
        Fault::GpuMemoryDegraded,
        Fault::GpuResettable,
        Fault::GpuThermal,
        Fault::GpuDiagnostic,
        Fault::EfaMissing,
        Fault::EfaPort,
        Fault::HardwareDegraded,
        Fault::FileSystem,
        Fault::CheckConfig,
        Fault::Other,
    ];

    /// `gpu_lost`, `gpu_memory_degraded`... (the metrics' and logs' word).
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::GpuLost => "gpu_lost",
            Fault::GpuMemoryDegraded => "gpu_memory_degraded",
            Fault::GpuResettable => "gpu_resettable",
            Fault::GpuThermal => "gpu_thermal",
            Fault::GpuDiagnostic => "gpu_diagnostic",
            Fault::EfaMissing => "efa_missing",
            Fault::EfaPort => "efa_port",
            Fault::HardwareDegraded => "hardware_degraded",
            Fault::FileSystem => "file_system",
            Fault::CheckConfig => "check_config",
            Fault::Other => "other",
        }
    }

    /// The [`AUTO`] table's action.
    pub fn auto(self) -> Planned {
        AUTO.iter()
            .find(|r| r.fault == self)
            .map_or(Planned::Isolate, |r| r.action)
    }

    /// The fault a failing check of `family` (the health checks' family: `gpu`, `efa`,
    /// `mount`, `space`, `hardware`, `mcelog`, `config`...) reports with `message`. A GPU
    /// check's message lists its problems separated by `; `: the fault whose `auto` action
    /// is the strongest counts. A check that did not finish in time (`timed_out`) tells
    /// nothing of the hardware it looks at: `other`.
    pub fn classify(family: &str, message: &str, timed_out: bool) -> Fault {
        if timed_out {
            return Fault::Other;
        }
        match family {
            "gpu" => message
                .split("; ")
                .map(gpu_fault)
                .max_by_key(|f| (f.auto(), *f))
                .unwrap_or(Fault::GpuResettable),
            "efa" => message
                .split("; ")
                .map(efa_fault)
                .max_by_key(|f| (f.auto(), *f))
                .unwrap_or(Fault::EfaMissing),
            "gate" => gate_fault(message),
            "hardware" | "mcelog" => Fault::HardwareDegraded,
            "mount" | "space" => Fault::FileSystem,
            "config" => Fault::CheckConfig,
            _ => Fault::Other,
        }
    }
}

/// A failed part of the start-up gate (the `gate` module's words): DCGM's failures, each
/// `<test> failed on GPU <n>: <words> (DCGM error <id>, category <category>)`, separated
/// by `; `; the strongest counts. A hardware memory error is the GPU's memory; thermal and
/// power are the host's (isolated); any other hardware or performance category is the
/// GPU's under load; a software, internal or unknown category, a host engine or a command
/// that did not answer, and a site command (whose action a site sets by its check's name)
/// tell nothing of the hardware.
fn gate_fault(message: &str) -> Fault {
    message
        .split("; ")
        .map(|m| {
            let Some(c) = m
                .rsplit_once("category ")
                .map(|(_, c)| c.trim_end_matches(')'))
            else {
                return Fault::Other;
            };
            if c == "hardware memory" {
                Fault::GpuMemoryDegraded
            } else if c == "hardware thermal" || c == "hardware power" {
                Fault::GpuThermal
            } else if c.starts_with("hardware ") || c.starts_with("performance ") {
                Fault::GpuDiagnostic
            } else {
                Fault::Other
            }
        })
        .max_by_key(|f| (f.auto(), *f))
        .unwrap_or(Fault::Other)
}

/// One problem of the EFA check (`health::checks::efa`'s words): a port's state, a counter
/// that must never move, an error counter over its rate, libfabric's provider, or the
/// device count.
fn efa_fault(problem: &str) -> Fault {
    if problem.contains("must never move") {
        Fault::EfaMissing
    } else if problem.contains(" port ")
        && (problem.contains(": state ") || problem.contains(": phys_state "))
    {
        Fault::EfaPort
    } else if problem.contains("/min, more than") || problem.contains("fi_info") {
        // An error rate (the network, or a peer), libfabric (the image): not the device.
        Fault::Other
    } else {
        Fault::EfaMissing
    }
}

/// One problem of the GPU check (`health::checks::gpu`'s words).
fn gpu_fault(problem: &str) -> Fault {
    let p = problem.to_ascii_lowercase();
    let xid = p
        .strip_prefix("xid ")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse::<u32>().ok());
    // "found 7 GPUs, expected 8": fewer than the instance has (more is a setting's fault).
    let fewer = p
        .strip_prefix("found ")
        .and_then(|r| r.split_once(" gpus, expected "))
        .and_then(|(n, m)| Some((n.parse::<u64>().ok()?, m.trim().parse::<u64>().ok()?)))
        .map(|(n, m)| n < m);
    if p.starts_with("xid errors unknown")
        || (p.contains("fabric manager") && p.contains("does not match"))
        || fewer == Some(false)
    {
        // The kernel log unread, a Fabric Manager of another version than the driver (the
        // image's), more GPUs than expected (a setting): not this GPU's fault.
        Fault::Other
    } else if xid == Some(79)
        || p.contains("fallen off the bus")
        // NVML's own words (nvml-wrapper's `NvmlError::GpuLost`).
        || p.contains("fell off the bus")
        || p.contains("not in nvml")
        || fewer == Some(true)
    {
        Fault::GpuLost
    } else if p.contains("retired pages")
        || p.contains("uncorrectable remapped rows")
        || p.contains("row remapping failed")
    {
        Fault::GpuMemoryDegraded
    } else if p.contains("fabric health unhealthy") {
        // NVLink degraded (the driver's fabric health): the GPU's links under load.
        Fault::GpuDiagnostic
    } else if p.contains("shows no fabric section") || p.contains("-q could not be started") {
        // A driver older than R530, or the image's nvidia-smi: not this GPU's fault.
        Fault::Other
    } else if p.contains("temperature") || p.contains("slowdown") {
        Fault::GpuThermal
    } else {
        Fault::GpuResettable
    }
}

/// One failing check, as the health checks report it.
#[derive(Debug, Clone, Copy)]
pub struct Failure<'a> {
    /// The check's name (its check file's `name`, or the `nhc.conf` line).
    pub check: &'a str,
    /// Its family (`gpu`, `efa`, `mount`...).
    pub family: &'a str,
    /// What it found.
    pub message: &'a str,
    /// It did not finish within its timeout.
    pub timed_out: bool,
}

/// Where a plan's action came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PlannedBy {
    /// The [`AUTO`] table.
    Auto,
    /// `repair.action`.
    Action,
    /// `repair.checks.<check>`.
    Check(String),
    /// The fault called for a reboot, and a repair's reboot for the same check was this
    /// many boots ago (within `repair.replace_within_boots`): replaced instead.
    Again(u32),
}

impl std::fmt::Display for PlannedBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlannedBy::Auto => f.write_str("the auto table"),
            PlannedBy::Action => f.write_str("repair.action"),
            PlannedBy::Check(c) => write!(f, "[[repair.checks]] check = {c:?}"),
            PlannedBy::Again(1) => f.write_str(
                "found again in the boot after a reboot for it: repair.replace_within_boots",
            ),
            PlannedBy::Again(n) => write!(
                f,
                "found again {n} boots after a reboot for it: repair.replace_within_boots"
            ),
        }
    }
}

/// What a fault calls for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// The action.
    pub action: Planned,
    /// The fault.
    pub fault: Fault,
    /// The check that found it.
    pub check: String,
    /// Where the action came from.
    pub by: PlannedBy,
    /// A reboot or replacement withheld (by the breaker, [`breaker`]; in `on` mode also a
    /// budget with every slot held, or a drain of higher rank such as an administrator's):
    /// `isolate` instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub withheld: Option<Withheld>,
}

/// A reboot or replacement withheld, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Withheld {
    /// What the fault alone calls for.
    pub action: Planned,
    /// Why not: the breaker's count, or why it could not be counted.
    pub why: String,
}

impl Plan {
    /// A key that changes when the plan does (the log and the counts are per change).
    pub fn key(&self) -> String {
        // Withheld or not, not why: a count that moves is no new plan.
        let withheld = self
            .withheld
            .as_ref()
            .map(|w| format!(":withheld {}", w.action))
            .unwrap_or_default();
        format!(
            "{}:{}:{}{withheld}",
            self.action,
            self.fault.as_str(),
            self.check
        )
    }

    /// Whether the plan takes the node out for good or for a while (`reboot`,
    /// `replace`): what the breaker guards.
    pub fn departs(&self) -> bool {
        self.action >= Planned::Reboot
    }

    /// The plan with its reboot or replacement withheld for `why`: `isolate` instead.
    pub fn withhold(mut self, why: String) -> Plan {
        if self.departs() {
            self.withheld = Some(Withheld {
                action: self.action,
                why,
            });
            self.action = Planned::Isolate;
        }
        self
    }
}

/// One entry of `repair.checks`: a check's action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckAction {
    /// The check's name as its check file names it (`name = "GPUs"`), or an `nhc.conf`
    /// line as written or its function alone (`check_fs_mount_rw`).
    pub check: String,
    /// `auto`, `none`, `isolate`, `reboot` or `replace`.
    pub action: RepairAction,
}

/// `[repair]`: what a fault the health checks find leads to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RepairSettings {
    /// `off` (no repair), `report` (log and count what would be done, change nothing) or
    /// `on` (reboot or replace once no job runs, within the rollout's budget:
    /// `upgrade.max_unavailable`). Set by the image or the user data; a tag may not turn
    /// it on.
    pub mode: RepairMode,
    /// Every fault's action unless `checks` names its check: `auto` (the table in
    /// `docs/repair.md`), `none`, `isolate`, `reboot` or `replace`. With `mode = "report"`
    /// it is what is logged and counted, not done.
    pub action: RepairAction,
    /// `[[repair.checks]]`: the action of a check, by its name (`check = "GPUs"`, `action
    /// = "isolate"`). A name no check has is warned about at the daemon's start.
    pub checks: Vec<CheckAction>,
    /// The breaker: a check failing on more than this share of the nodes of one of a
    /// node's partitions (and on at least `breaker_min_nodes` of them) is the fleet's
    /// fault, and no node is rebooted or replaced for it (each stays isolated) until the
    /// share falls back. More than 0, at most 1.
    pub breaker_share: f64,
    /// The breaker's least count of nodes failing the same check (at least 1).
    pub breaker_min_nodes: u32,
    /// A fault that calls for a reboot, found again by the same check within this many
    /// boots after a repair's reboot for it, calls for a replacement instead (at least 1;
    /// counted in `repair.json`, which survives a reboot).
    pub replace_within_boots: u32,
    /// How long a fault must stand (the same failing check, pass after pass) before its
    /// reboot or replacement starts (`on` mode): long enough for every node to have run its
    /// checks meanwhile, so that the breaker counts a fault the whole fleet has before any
    /// node leaves for it (more than 0; default two health intervals at their default).
    pub settle: crate::section::HumanDuration,
    /// The flap guard's window ([`flap`]): a replacement this recent counts against
    /// another replacement for the same check (more than 0).
    pub flap_window: crate::section::HumanDuration,
    /// The flap guard's count: when this many nodes of a partition were replaced for the
    /// same check within `flap_window`, no node of it is replaced for that check again
    /// (at least 1). A NodeName whose previous instance was replaced for the check is not
    /// replaced a second time, whatever this count.
    pub flap_max_replacements: u32,
}

impl Default for RepairSettings {
    fn default() -> Self {
        RepairSettings {
            mode: RepairMode::Off,
            action: RepairAction::Auto,
            checks: Vec::new(),
            breaker_share: 0.1,
            breaker_min_nodes: 2,
            replace_within_boots: 3,
            settle: crate::section::HumanDuration(std::time::Duration::from_secs(120)),
            flap_window: crate::section::HumanDuration(std::time::Duration::from_secs(24 * 3600)),
            flap_max_replacements: 3,
        }
    }
}

/// Whether repairs happen is the image's or the launch's, never a tag's.
impl crate::section::Classified for RepairSettings {
    const SECTION: &'static str = "repair";
    const TRUST: &'static [crate::section::KeyTrust] = {
        use crate::section::KeyTrust as K;
        &[
            K::user_data("mode"),
            K::user_data("action"),
            K::user_data("checks"),
            K::user_data("breaker_share"),
            K::user_data("breaker_min_nodes"),
            K::user_data("replace_within_boots"),
            K::user_data("settle"),
            K::user_data("flap_window"),
            K::user_data("flap_max_replacements"),
        ]
    };
}

impl RepairSettings {
    /// Checks `checks`' names (not empty, no control characters, each once) and the
    /// breaker's share (more than 0, at most 1) and count (at least 1).
    ///
    /// # Errors
    /// [`InvalidKey`]: the key (`repair.checks[<i>].check`, `repair.breaker_share`...) and
    /// what is wrong.
    pub fn validate(&self) -> Result<(), InvalidKey> {
        if !(self.breaker_share > 0.0 && self.breaker_share <= 1.0) {
            return Err(InvalidKey::new(
                "repair.breaker_share",
                format!(
                    "must be more than 0 and at most 1 (0.1 is 10 %), got {}",
                    self.breaker_share
                ),
            ));
        }
        if self.breaker_min_nodes < 1 {
            return Err(InvalidKey::new(
                "repair.breaker_min_nodes",
                "must be at least 1",
            ));
        }
        if self.settle.is_zero() {
            return Err(InvalidKey::new(
                "repair.settle",
                "must be more than 0 (the breaker needs the other nodes' checks to have run)",
            ));
        }
        if self.flap_window.is_zero() {
            return Err(InvalidKey::new(
                "repair.flap_window",
                "must be more than 0 (the flap guard's history window)",
            ));
        }
        if self.flap_max_replacements < 1 {
            return Err(InvalidKey::new(
                "repair.flap_max_replacements",
                "must be at least 1",
            ));
        }
        let most = record::KEPT - 1;
        if self.replace_within_boots < 1 || self.replace_within_boots as usize > most {
            return Err(InvalidKey::new(
                "repair.replace_within_boots",
                format!("must be from 1 (the boot after a repair's reboot is the first) to {most} (the boots repair.json keeps)"),
            ));
        }
        for (i, c) in self.checks.iter().enumerate() {
            let key = format!("repair.checks[{i}].check");
            if c.check.trim().is_empty() || c.check.chars().any(char::is_control) {
                return Err(InvalidKey::new(
                    key,
                    format!("{:?} is not a check's name", c.check),
                ));
            }
            if let Some(j) = self.checks[..i].iter().position(|o| o.check == c.check) {
                return Err(InvalidKey::new(
                    key,
                    format!("{:?} is named already by repair.checks[{j}]", c.check),
                ));
            }
        }
        Ok(())
    }

    /// The plan for `failures` (a health run's fatal failures, in file order): each
    /// failure's action (`repair.checks.<check>`, else `repair.action`), the strongest
    /// wins, the first in file order among equals. `None` when repair is off or nothing
    /// failed.
    pub fn plan(&self, failures: &[Failure<'_>]) -> Option<Plan> {
        if self.mode == RepairMode::Off {
            return None;
        }
        let mut best: Option<Plan> = None;
        for f in failures {
            let fault = Fault::classify(f.family, f.message, f.timed_out);
            let (setting, by) = match self.check_setting(f.check) {
                Some((key, a)) => (a, PlannedBy::Check(key.to_string())),
                None => (self.action, PlannedBy::Action),
            };
            let by = if setting == RepairAction::Auto && by == PlannedBy::Action {
                PlannedBy::Auto
            } else {
                by
            };
            let action = setting.for_fault(fault);
            if best.as_ref().is_none_or(|b| action > b.action) {
                best = Some(Plan {
                    action,
                    fault,
                    check: f.check.to_string(),
                    by,
                    withheld: None,
                });
            }
        }
        best
    }

    /// `plan` after the node's history (`record`, the current boot `boot_id`): a reboot for
    /// a check whose fault came back within `repair.replace_within_boots` boots of a
    /// repair's reboot for it becomes a replacement ([`PlannedBy::Again`]).
    pub fn escalate(&self, plan: Plan, record: &record::Record, boot_id: &str) -> Plan {
        if plan.action != Planned::Reboot {
            return plan;
        }
        match record.boots_since_reboot(&plan.check, boot_id) {
            Some(n) if n >= 1 && n <= self.replace_within_boots => Plan {
                action: Planned::Replace,
                by: PlannedBy::Again(n),
                ..plan
            },
            _ => plan,
        }
    }

    /// The setting of check `check` in `checks`, and the key it is under: its whole name
    /// (a check file's `name`, an `nhc.conf` line as written), else the name's first word
    /// (the NHC function of an `nhc.conf` line: `check_fs_mount_rw` for `check_fs_mount_rw
    /// -f /fsx`).
    fn check_setting<'a>(&'a self, check: &str) -> Option<(&'a str, RepairAction)> {
        let first = nhc_function(check).unwrap_or(check);
        [check, first]
            .into_iter()
            .find_map(|k| self.checks.iter().find(|c| c.check == k))
            .map(|c| (c.check.as_str(), c.action))
    }

    /// The names in `checks` that no check named in `known` has, whole or by its first
    /// word (warned about, not refused: a check file may come later in the image).
    pub fn unknown_checks<'a>(&'a self, known: &[String]) -> Vec<&'a str> {
        self.checks
            .iter()
            .map(|c| c.check.as_str())
            .filter(|k| !known.iter().any(|n| n == k || nhc_function(n) == Some(*k)))
            .collect()
    }
}

/// The NHC function of an `nhc.conf` line's check (`check_fs_mount_rw` of
/// `check_fs_mount_rw -f /fsx`); `None` for a check file's name.
fn nhc_function(check: &str) -> Option<&str> {
    let first = check.split_whitespace().next()?;
    (first.starts_with("check_") && first != check).then_some(first)
}

/// What `plan` would do on `node` in `report` mode, in words: `would replace compute-1 for
/// GPUs: gpu_lost (the auto table)`, `would leave compute-1 as it is for ...` (`none`),
/// with the withheld action and why; in `on` mode `will replace ...`, `isolates ...`.
pub fn describe(plan: &Plan, node: &str, mode: RepairMode) -> String {
    let what = match (plan.action, mode) {
        (Planned::None, RepairMode::On) => format!("leaves {node} as it is"),
        (Planned::Isolate, RepairMode::On) => format!("isolates {node}"),
        (a, RepairMode::On) => format!("will {a} {node} once no job runs"),
        (Planned::None, _) => format!("would leave {node} as it is"),
        (a, _) => format!("would {a} {node}"),
    };
    let withheld = plan
        .withheld
        .as_ref()
        .map(|w| format!("; {} withheld: {}", w.action, w.why))
        .unwrap_or_default();
    format!(
        "{what} for {}: {} ({}){withheld}",
        plan.check,
        plan.fault.as_str(),
        plan.by
    )
}

/// `docs/repair.md`'s table, generated from [`AUTO`].
pub fn auto_table_markdown() -> String {
    let mut out = String::from("| Fault | What | `auto` | Why |\n|---|---|---|---|\n");
    for r in AUTO {
        out.push_str(&format!(
            "| `{}` | {} | `{}` | {} |\n",
            r.fault.as_str(),
            r.what,
            r.action,
            r.why
        ));
    }
    out
}

pub mod breaker;
pub mod flap;
pub mod record;

#[cfg(test)]
mod tests;
