//! NVIDIA GPUs through NVML (nvml-wrapper; `libnvidia-ml.so.1` is loaded at run time):
//! count, XID errors since boot (from the kernel log, where the driver reports them as
//! `NVRM: Xid (PCI:...): <n>, ...`), uncorrected ECC errors, retired pages and remapped
//! rows, temperature and hardware slowdown reasons, and NVLink state.
//!
//! The GPUs' NVLink fabric state, per GPU, is read from `nvidia-smi -q` ([`fabric`]).
//!
//! A node without the driver (the library does not load, or the driver is not loaded)
//! reports "no GPU": that passes unless GPUs are expected (a count, an instance type
//! known to have them, or, with `count = "auto"`, NVIDIA GPUs the kernel sees on PCI).

use std::collections::BTreeMap;

use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{
    EccCounter, MemoryError, RetirementCause, TemperatureSensor,
};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::Nvml;

use super::{Checked, Failed};
use crate::health::facts::{Facts, FactsError, HostIo, HostOp};

pub mod fabric;

pub use fabric::{FabricCheck, NvlinkFabric, NVIDIA_SMI_PROGRAM};

/// How many GPUs are expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuCount {
    /// From the instance type (DMI product name), when known; otherwise any number.
    Auto,
    /// Exactly this many.
    Exact(u32),
}

/// GPU expectations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSpec {
    /// Expected count.
    pub count: GpuCount,
    /// Fail on XID errors logged since boot, except these codes.
    pub xid: bool,
    /// XID codes that do not fail the check (e.g. 13 and 31 are usually application
    /// faults).
    pub xid_ignore: Vec<u32>,
    /// Most volatile uncorrected ECC errors per GPU.
    pub max_uncorrected_ecc: Option<u64>,
    /// Most retired pages (both causes) per GPU.
    pub max_retired_pages: Option<u64>,
    /// Most uncorrectable remapped rows per GPU; a remapping failure always fails.
    pub max_remapped_rows: Option<u64>,
    /// Highest GPU temperature, °C.
    pub max_temperature_c: Option<u32>,
    /// Fail on hardware slowdown (HW slowdown, HW thermal, power brake).
    pub fail_on_hw_slowdown: bool,
    /// Every NVLink that reports a state must be active.
    pub nvlink: bool,
    /// Library to load (default `libnvidia-ml.so.1`).
    pub library: Option<String>,
    /// NVML must load (NHC's `check_nvsmi_healthmon`: nvidia-smi fails without the
    /// driver): "no GPU" fails too.
    pub require: bool,
    /// Fabric Manager must run at the driver's version: `None` (the default) where the
    /// instance type needs it on the node ([`has_nvswitch`]: p4d, p4de, p5, p5e, p5en,
    /// p6-b200; not p6e-gb200), `Some(true)` always, `Some(false)` never.
    pub fabric_manager: Option<bool>,
    /// The Fabric Manager program asked for its version (`<program> --version`).
    pub fabric_manager_program: String,
    /// Each GPU's fabric state must be `Completed` with status `Success`
    /// ([`fabric::fabric_problems`]): on the NVLink-fabric instance types
    /// ([`NvlinkFabric::of`]) with [`FabricCheck::Auto`], the default.
    pub fabric: FabricCheck,
    /// nvidia-smi, run as `<program> -q` for the fabric state (absolute; default
    /// [`NVIDIA_SMI_PROGRAM`]).
    pub nvidia_smi: String,
}

impl Default for GpuSpec {
    fn default() -> Self {
        GpuSpec {
            count: GpuCount::Auto,
            xid: true,
            xid_ignore: vec![13, 31, 43, 45, 68],
            max_uncorrected_ecc: Some(0),
            max_retired_pages: Some(60),
            max_remapped_rows: Some(512),
            max_temperature_c: None,
            fail_on_hw_slowdown: true,
            nvlink: false,
            library: None,
            require: false,
            fabric_manager: None,
            fabric_manager_program: FABRIC_MANAGER_PROGRAM.into(),
            fabric: FabricCheck::Auto,
            nvidia_smi: NVIDIA_SMI_PROGRAM.into(),
        }
    }
}

/// Parses an XID report of the NVIDIA driver in a kernel log line:
/// `NVRM: Xid (PCI:0000:00:1e): 79, pid=1234, GPU has fallen off the bus.` →
/// (`0000:00:1e`, 79).
pub fn parse_xid(line: &str) -> Option<(String, u32)> {
    let rest = &line[line.find("NVRM: Xid (")? + "NVRM: Xid (".len()..];
    let (dev, rest) = rest.split_once("):")?;
    let dev = dev.strip_prefix("PCI:").unwrap_or(dev).to_string();
    let code: String = rest
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((dev, code.parse().ok()?))
}

/// NVIDIA Fabric Manager's program (Debian and Ubuntu's `nvidia-fabricmanager-<branch>`,
/// the RHEL family's `nvidia-fabric-manager`), also its process name.
pub const FABRIC_MANAGER_PROGRAM: &str = "/usr/bin/nv-fabricmanager";

/// How long Fabric Manager may take to say its version.
pub const FABRIC_MANAGER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether instances of this type have NVSwitches, whose GPUs need NVIDIA Fabric Manager
/// (at the driver's exact version) before CUDA can use them: p4d, p4de, p5, p5e, p5en,
/// p6-b200. Not p6e-gb200 (GB200 NVL72): its NVLink fabric is managed outside the node, and
/// its Fabric Manager is expected inactive.
pub fn has_nvswitch(instance_type: &str) -> bool {
    let family = instance_type.split('.').next().unwrap_or_default();
    matches!(family, "p4d" | "p4de" | "p5" | "p5e" | "p5en" | "p6-b200")
}

/// The version in Fabric Manager's `--version` output (`Fabric Manager version is :
/// 590.48.01`): the last dotted number on a line that says "version".
pub fn parse_fabric_manager_version(out: &str) -> Option<String> {
    let is_version = |w: &&str| {
        w.contains('.')
            && w.split('.')
                .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
    };
    out.lines()
        .filter(|l| l.to_ascii_lowercase().contains("version"))
        .filter_map(|l| {
            l.split(|c: char| c.is_whitespace() || c == ':')
                .rev()
                .find(is_version)
        })
        .next_back()
        .map(str::to_string)
}

/// What Fabric Manager answered to `--version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FabricManagerAnswer {
    /// Its version.
    Version(String),
    /// It exited without a version in its output.
    NoVersion(String),
    /// Nothing within the timeout (killed).
    Silent,
    /// It could not be started.
    NotStarted(String),
}

/// Runs `<program> --version` (never through a shell), killing it after `timeout`.
pub fn ask_fabric_manager(program: &str, timeout: std::time::Duration) -> FabricManagerAnswer {
    use std::process::{Command, Stdio};
    let mut child = match Command::new(program)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return FabricManagerAnswer::NotStarted(e.to_string()),
    };
    let start = std::time::Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if start.elapsed() < timeout => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return FabricManagerAnswer::Silent;
            }
        }
    }
    let out = match child.wait_with_output() {
        Ok(o) => o,
        Err(e) => return FabricManagerAnswer::NotStarted(e.to_string()),
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    match parse_fabric_manager_version(&text) {
        Some(v) => FabricManagerAnswer::Version(v),
        None => FabricManagerAnswer::NoVersion(text.trim().chars().take(200).collect()),
    }
}

/// Whether a process named `nv-fabricmanager` runs (`<proc>/<pid>/comm`).
pub fn fabric_manager_running(proc_dir: &std::path::Path) -> bool {
    let Ok(rd) = std::fs::read_dir(proc_dir) else {
        return false;
    };
    rd.flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .chars()
                .all(|c| c.is_ascii_digit())
        })
        .any(|e| {
            std::fs::read_to_string(e.path().join("comm"))
                .is_ok_and(|c| c.trim() == "nv-fabricmanager")
        })
}

/// The Fabric Manager problem, if any: not running, silent, without a version, or at
/// another version than the NVIDIA driver's (`driver`), naming both (NVIDIA's own words
/// for it: "fabric manager NVIDIA GPU driver interface version X don't match with driver
/// version Y", NVIDIA/gpu-driver-container #735).
pub fn fabric_manager_problem(
    running: bool,
    answer: impl FnOnce() -> FabricManagerAnswer,
    driver: &str,
    program: &str,
) -> Option<String> {
    if !running {
        return Some(format!(
            "NVIDIA Fabric Manager is not running (no nv-fabricmanager process; NVIDIA driver \
             {driver}): the NVSwitch GPUs cannot be used"
        ));
    }
    match answer() {
        FabricManagerAnswer::Version(v) if v == driver => None,
        FabricManagerAnswer::Version(v) => Some(format!(
            "NVIDIA Fabric Manager {v} does not match the NVIDIA driver {driver}: install and \
             hold both at one version"
        )),
        FabricManagerAnswer::Silent => Some(format!(
            "NVIDIA Fabric Manager answered nothing within {}s ({program} --version; driver \
             {driver})",
            FABRIC_MANAGER_TIMEOUT.as_secs()
        )),
        FabricManagerAnswer::NoVersion(out) => Some(format!(
            "NVIDIA Fabric Manager gave no version ({program} --version said {out:?}; driver \
             {driver})"
        )),
        FabricManagerAnswer::NotStarted(e) => Some(format!(
            "NVIDIA Fabric Manager's version is unknown ({program} --version: {e}; driver \
             {driver})"
        )),
    }
}

/// The Xid that a GPU "fallen off the bus" counts as: NVIDIA's Xid 79 ("GPU has fallen off
/// the bus"), fatal.
pub const XID_FALLEN_OFF_THE_BUS: u32 = 79;

/// How many kernel log records after `NVRM: The NVIDIA GPU <address>` may complete its
/// "fallen off the bus" report (the driver prints it as 3 records).
const FALLEN_OFF_WITHIN: u32 = 4;

/// Reads the NVIDIA driver's reports in the kernel log, record by record, as
/// `(PCI address, Xid)`:
/// - `NVRM: Xid (PCI:0000:00:1e): 79, pid=1234, ...` ([`parse_xid`]);
/// - newer drivers' "fallen off the bus" without an Xid number, several records
///   (NVIDIA/NVSentinel #155): `NVRM: The NVIDIA GPU 0000:b3:00.0` /
///   `NVRM: (PCI ID: 10de:26b5) installed in this system has` /
///   `NVRM: fallen off the bus and is not responding to commands.`, counted as Xid 79 on
///   that address (on the address in the same record, or `unknown address` when the
///   record naming it was lost: a log cut in the middle still fails the node, never
///   names a GPU it did not see).
#[derive(Debug, Default)]
pub struct KmsgScanner {
    /// The address of the last `NVRM: The NVIDIA GPU <address>` record, and how many
    /// records ago it came.
    pending: Option<(String, u32)>,
}

impl KmsgScanner {
    /// Feeds one kernel log record (a `/dev/kmsg` record `prio,seq,time,flags;message`
    /// with its continuation lines, or a bare message line); returns the Xid it
    /// completes, if any.
    pub fn feed(&mut self, record: &str) -> Option<(String, u32)> {
        let msg = record
            .split_once(';')
            .map_or(record, |(_, m)| m)
            .lines()
            .next()
            .unwrap_or_default();
        if let Some(x) = parse_xid(msg) {
            return Some(x);
        }
        if let Some((_, age)) = &mut self.pending {
            *age += 1;
            if *age > FALLEN_OFF_WITHIN {
                self.pending = None;
            }
        }
        if let Some(rest) = msg.split("NVRM: The NVIDIA GPU ").nth(1) {
            let addr = rest.split_whitespace().next().unwrap_or_default();
            if let Some(a) = pci_address(addr) {
                self.pending = Some((a, 0));
            }
        }
        if msg.contains("NVRM:") && msg.contains("fallen off the bus") {
            let here = msg.split_whitespace().find_map(|w| {
                let w = w.trim_matches(|c: char| !c.is_ascii_hexdigit() && c != ':' && c != '.');
                pci_address(w.trim_end_matches([':', '.']))
            });
            let dev = here
                .or_else(|| self.pending.take().map(|(a, _)| a))
                .unwrap_or_else(|| "unknown address".to_string());
            self.pending = None;
            return Some((dev, XID_FALLEN_OFF_THE_BUS));
        }
        None
    }
}

/// A PCI address as the kernel writes it (`0000:b3:00.0`, or NVML's `00000000:B3:00.0`),
/// normalised to the kernel's form (4-digit domain, lower case); `None` for anything else.
pub fn pci_address(text: &str) -> Option<String> {
    let mut parts = text.split(':');
    let (domain, bus, devfn) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let (dev, func) = devfn.split_once('.')?;
    let hex = |s: &str, max: usize| {
        !s.is_empty() && s.len() <= max && s.chars().all(|c| c.is_ascii_hexdigit())
    };
    if !(hex(domain, 8) && hex(bus, 2) && hex(dev, 2) && hex(func, 1)) {
        return None;
    }
    let domain = u32::from_str_radix(domain, 16).ok()?;
    Some(format!(
        "{domain:04x}:{}:{}.{}",
        bus.to_ascii_lowercase(),
        dev.to_ascii_lowercase(),
        func
    ))
}

/// XID reports in the kernel log since boot, by (device, code) with a count
/// ([`KmsgScanner`]). Reads `/dev/kmsg` without blocking.
fn read_xids(facts: &Facts) -> Result<BTreeMap<(String, u32), u32>, FactsError> {
    use rustix::fs::{Mode, OFlags};
    let path = &facts.host.kmsg;
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| HostIo::new(HostOp::Open, path, e))?;
    let mut out = BTreeMap::new();
    let mut scanner = KmsgScanner::default();
    let mut buf = vec![0u8; 8192];
    loop {
        match rustix::io::read(&fd, &mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let rec = String::from_utf8_lossy(&buf[..n]);
                if let Some(k) = scanner.feed(&rec) {
                    *out.entry(k).or_insert(0) += 1;
                }
            }
            // EPIPE: a record was overwritten while reading; go on.
            Err(rustix::io::Errno::PIPE) => continue,
            Err(rustix::io::Errno::AGAIN) => break,
            Err(e) => return Err(HostIo::new(HostOp::Read, path, e).into()),
        }
    }
    Ok(out)
}

/// The NVIDIA GPUs the kernel sees on PCI: devices of vendor `0x10de` and class VGA
/// (`0x0300xx`) or 3D controller (`0x0302xx`) under `<sys>/bus/pci/devices`, by address
/// (sorted). Empty when the folder cannot be read.
pub fn kernel_gpus(sys_dir: &std::path::Path) -> Vec<String> {
    let dir = sys_dir.join("bus/pci/devices");
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).unwrap_or_default();
    let mut out: Vec<String> = rd
        .flatten()
        .filter(|e| {
            let vendor = read(e.path().join("vendor"));
            let class = read(e.path().join("class"));
            vendor.trim().eq_ignore_ascii_case("0x10de")
                && (class.trim().starts_with("0x0300") || class.trim().starts_with("0x0302"))
        })
        .filter_map(|e| pci_address(&e.file_name().to_string_lossy()))
        .collect();
    out.sort();
    out
}

/// The GPUs the kernel sees that NVML does not (`nvml`: NVML's bus ids, any form
/// [`pci_address`] reads).
pub fn missing_from_nvml(kernel: &[String], nvml: &[String]) -> Vec<String> {
    let seen: Vec<String> = nvml.iter().filter_map(|b| pci_address(b)).collect();
    kernel
        .iter()
        .filter(|k| !seen.contains(k))
        .cloned()
        .collect()
}

fn load(spec: &GpuSpec) -> Result<Nvml, NvmlError> {
    match &spec.library {
        Some(p) => Nvml::builder().lib_path(std::ffi::OsStr::new(p)).init(),
        None => Nvml::init(),
    }
}

fn expected_count(spec: &GpuSpec, facts: &Facts) -> Option<u32> {
    match spec.count {
        GpuCount::Exact(n) => Some(n),
        GpuCount::Auto => {
            super::hw::detect_instance_type(facts).and_then(|t| crate::hostfacts::expected_gpus(&t))
        }
    }
}

/// Runs a GPU check.
///
/// # Errors
/// [`Failed`]: what is wrong, in NHC's words.
pub fn check_gpus(spec: &GpuSpec, facts: &Facts) -> Result<String, Failed> {
    let failed = |m: String| Failed::new(Checked::Gpus, m);
    let expected = expected_count(spec, facts);
    let nvml = match load(spec) {
        Ok(n) => n,
        Err(
            e @ (NvmlError::LibloadingError(_)
            | NvmlError::DriverNotLoaded
            | NvmlError::LibraryNotFound),
        ) => {
            return match expected {
                Some(n) if n > 0 => Err(failed(format!(
                    "expected {n} GPUs, but NVML is unavailable: {e}"
                ))),
                // An instance type not in the table: the GPUs the kernel sees count.
                None if !kernel_gpus(&facts.host.sys_dir).is_empty() => {
                    let pci = kernel_gpus(&facts.host.sys_dir);
                    Err(failed(format!(
                        "the kernel sees {} NVIDIA GPUs on PCI ({}), but NVML is unavailable: {e}",
                        pci.len(),
                        pci.join(", ")
                    )))
                }
                _ if spec.require => Err(failed(format!("NVML is unavailable: {e}"))),
                _ => Ok(format!("no GPU (NVML unavailable: {e})")),
            };
        }
        Err(e) => return Err(failed(format!("NVML initialisation failed: {e}"))),
    };
    let count = nvml
        .device_count()
        .map_err(|e| failed(format!("NVML device count: {e}")))?;
    if let Some(n) = expected {
        if count != n {
            return Err(failed(format!("found {count} GPUs, expected {n}")));
        }
    }
    let mut problems = Vec::new();
    let instance_type = super::hw::detect_instance_type(facts);
    // NVSwitch instance types: Fabric Manager at the driver's version.
    let fm_wanted = spec
        .fabric_manager
        .unwrap_or_else(|| instance_type.as_deref().is_some_and(has_nvswitch));
    if fm_wanted {
        let driver = nvml
            .sys_driver_version()
            .unwrap_or_else(|e| format!("unknown ({e})"));
        let program = spec.fabric_manager_program.as_str();
        if let Some(p) = fabric_manager_problem(
            fabric_manager_running(&facts.host.proc_dir),
            || ask_fabric_manager(program, FABRIC_MANAGER_TIMEOUT),
            &driver,
            program,
        ) {
            problems.push(p);
        }
    }
    // NVLink-fabric instance types: every GPU registered with the fabric.
    let platform = instance_type.as_deref().and_then(NvlinkFabric::of);
    if spec.fabric.wanted(platform) {
        problems.extend(fabric::check_fabric(
            &spec.nvidia_smi,
            fabric::NVIDIA_SMI_TIMEOUT,
            platform,
        ));
    }
    // A GPU the kernel has on PCI that NVML lost (fallen off the bus, a driver that gave
    // up on it): the kernel's count is the one the instance has.
    let kernel = kernel_gpus(&facts.host.sys_dir);
    if !kernel.is_empty() {
        let nvml_ids: Vec<String> = (0..count)
            .filter_map(|i| nvml.device_by_index(i).ok()?.pci_info().ok())
            .map(|p| p.bus_id)
            .collect();
        let missing = missing_from_nvml(&kernel, &nvml_ids);
        if !missing.is_empty() {
            problems.push(format!(
                "the kernel sees {} NVIDIA GPUs on PCI, NVML {count}: not in NVML: {}",
                kernel.len(),
                missing.join(", ")
            ));
        }
    }
    for i in 0..count {
        let dev = match nvml.device_by_index(i) {
            Ok(d) => d,
            Err(e) => {
                problems.push(format!("GPU {i}: {e}"));
                continue;
            }
        };
        if let Some(max) = spec.max_uncorrected_ecc {
            match dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile) {
                Ok(n) if n > max => {
                    problems.push(format!("GPU {i}: {n} uncorrected ECC errors (max {max})"))
                }
                Ok(_) | Err(NvmlError::NotSupported) => {}
                Err(e) => problems.push(format!("GPU {i}: ECC errors: {e}")),
            }
        }
        if let Some(max) = spec.max_retired_pages {
            let mut n = 0u64;
            for cause in [
                RetirementCause::MultipleSingleBitEccErrors,
                RetirementCause::DoubleBitEccError,
            ] {
                if let Ok(p) = dev.retired_pages(cause) {
                    n += p.len() as u64;
                }
            }
            if n > max {
                problems.push(format!("GPU {i}: {n} retired pages (max {max})"));
            }
        }
        if let Some(max) = spec.max_remapped_rows {
            let ids = [FieldId(143), FieldId(145)]; // NVML_FI_DEV_REMAPPED_UNC, _FAILURE
            if let Ok(vals) = dev.field_values_for(&ids) {
                let get = |k: usize| -> Option<u64> {
                    match vals.get(k)?.as_ref().ok()?.value.as_ref().ok()? {
                        nvml_wrapper::enums::device::SampleValue::U32(v) => Some(u64::from(*v)),
                        nvml_wrapper::enums::device::SampleValue::U64(v) => Some(*v),
                        nvml_wrapper::enums::device::SampleValue::I64(v) => u64::try_from(*v).ok(),
                        nvml_wrapper::enums::device::SampleValue::F64(v) => Some(*v as u64),
                    }
                };
                if let Some(unc) = get(0).filter(|n| *n > max) {
                    problems.push(format!(
                        "GPU {i}: {unc} uncorrectable remapped rows (max {max})"
                    ));
                }
                if get(1).is_some_and(|f| f > 0) {
                    problems.push(format!("GPU {i}: row remapping failed"));
                }
            }
        }
        if let Some(max) = spec.max_temperature_c {
            if let Ok(t) = dev.temperature(TemperatureSensor::Gpu) {
                if t > max {
                    problems.push(format!("GPU {i}: temperature {t} °C (max {max})"));
                }
            }
        }
        if spec.fail_on_hw_slowdown {
            if let Ok(r) = dev.current_throttle_reasons() {
                let bad = r
                    & (ThrottleReasons::HW_SLOWDOWN
                        | ThrottleReasons::HW_THERMAL_SLOWDOWN
                        | ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN);
                if !bad.is_empty() {
                    problems.push(format!("GPU {i}: {}", slowdown_text(bad)));
                }
            }
        }
        if spec.nvlink {
            for link in 0..18 {
                match dev.link_wrapper_for(link).is_active() {
                    Ok(false) => problems.push(format!("GPU {i}: NVLink {link} inactive")),
                    Ok(true) => {}
                    // Past the last link, or no NVLink at all.
                    Err(_) => break,
                }
            }
        }
    }
    if spec.xid {
        match read_xids(facts) {
            Ok(xids) => {
                for ((dev, code), n) in xids {
                    if !spec.xid_ignore.contains(&code) {
                        problems.push(format!("XID {code} on {dev} ({n}x since boot)"));
                    }
                }
            }
            Err(e) => problems.push(format!("XID errors unknown: {e}")),
        }
    }
    if problems.is_empty() {
        Ok(format!("{count} GPUs healthy"))
    } else {
        Err(failed(problems.join("; ")))
    }
}

/// The hardware slowdown reasons in NVIDIA's words (`nvidia-smi -q`'s "Clocks Event
/// Reasons"): `HW Slowdown`, `HW Thermal Slowdown`, `HW Power Brake Slowdown`.
fn slowdown_text(bad: ThrottleReasons) -> String {
    let names: Vec<&str> = [
        (ThrottleReasons::HW_SLOWDOWN, "HW Slowdown"),
        (ThrottleReasons::HW_THERMAL_SLOWDOWN, "HW Thermal Slowdown"),
        (
            ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
            "HW Power Brake Slowdown",
        ),
    ]
    .into_iter()
    .filter(|(f, _)| bad.contains(*f))
    .map(|(_, n)| n)
    .collect();
    format!("hardware slowdown active ({})", names.join(", "))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::health::facts::Host;

    #[test]
    fn slowdown_reasons_read_as_nvidia_smi_names_them() {
        assert_eq!(
            slowdown_text(
                ThrottleReasons::HW_THERMAL_SLOWDOWN | ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN
            ),
            "hardware slowdown active (HW Thermal Slowdown, HW Power Brake Slowdown)"
        );
        assert_eq!(
            slowdown_text(ThrottleReasons::HW_SLOWDOWN),
            "hardware slowdown active (HW Slowdown)"
        );
    }

    #[test]
    fn fallen_off_the_bus_without_an_xid_counts_as_xid_79_on_its_address() {
        // NVIDIA/NVSentinel #155: three records, no Xid number.
        let records = [
            "3,1001,5000,-;NVRM: The NVIDIA GPU 0000:b3:00.0",
            "3,1002,5001,-;NVRM: (PCI ID: 10de:26b5) installed in this system has",
            "3,1003,5002,-;NVRM: fallen off the bus and is not responding to commands.",
        ];
        let mut k = KmsgScanner::default();
        let got: Vec<_> = records.iter().filter_map(|r| k.feed(r)).collect();
        assert_eq!(got, vec![("0000:b3:00.0".to_string(), 79)]);
        // The older one-record form names its address in the record itself.
        let mut k = KmsgScanner::default();
        assert_eq!(
            k.feed("NVRM: GPU 0000:3B:00.0: GPU has fallen off the bus."),
            Some(("0000:3b:00.0".to_string(), 79))
        );
        // A log cut in the middle: the record naming the GPU was lost. Still fatal, never
        // pinned on a GPU the log did not name.
        let mut k = KmsgScanner::default();
        assert_eq!(k.feed("usb 1-1: new device"), None);
        assert_eq!(
            k.feed("NVRM: fallen off the bus and is not responding to commands."),
            Some(("unknown address".to_string(), 79))
        );
        // Only the first record (cut after it): nothing, and an old pending address does not
        // leak onto a report many records later.
        let mut k = KmsgScanner::default();
        assert_eq!(k.feed("NVRM: The NVIDIA GPU 0000:b3:00.0"), None);
        for _ in 0..FALLEN_OFF_WITHIN + 1 {
            assert_eq!(k.feed("eth0: link up"), None);
        }
        assert_eq!(
            k.feed("NVRM: fallen off the bus and is not responding to commands."),
            Some(("unknown address".to_string(), 79))
        );
        // Ordinary Xid lines still parse through the scanner.
        assert_eq!(
            KmsgScanner::default().feed("4,1,2,-;NVRM: Xid (PCI:0000:00:1e): 48, DBE"),
            Some(("0000:00:1e".to_string(), 48))
        );
    }

    #[test]
    fn fabric_manager_at_another_version_than_the_driver_fails_naming_both() {
        assert!(has_nvswitch("p5.48xlarge") && has_nvswitch("p4d.24xlarge"));
        assert!(has_nvswitch("p6-b200.48xlarge") && !has_nvswitch("g6.48xlarge"));
        // Fabric Manager by default: on the node's NVSwitches, never on GB200 NVL72, whose
        // fabric is managed outside the node.
        for t in [
            "p4d.24xlarge",
            "p5.48xlarge",
            "p5en.48xlarge",
            "p6-b200.48xlarge",
        ] {
            assert!(has_nvswitch(t), "{t}");
        }
        for t in ["p6e-gb200.36xlarge", "g6.48xlarge", "g5.xlarge"] {
            assert!(!has_nvswitch(t), "{t}");
        }
        assert_eq!(
            parse_fabric_manager_version("Fabric Manager version is : 590.48.01\n").as_deref(),
            Some("590.48.01")
        );
        assert_eq!(
            parse_fabric_manager_version("usage: nv-fabricmanager [options]"),
            None
        );
        let v = |s: &'static str| move || FabricManagerAnswer::Version(s.to_string());
        let p = "/usr/bin/nv-fabricmanager";
        assert_eq!(
            fabric_manager_problem(true, v("580.126.09"), "580.126.09", p),
            None
        );
        let e = fabric_manager_problem(true, v("590.48.01"), "580.126.09", p).unwrap();
        assert!(e.contains("590.48.01") && e.contains("580.126.09"), "{e}");
        let e = fabric_manager_problem(false, v("580.126.09"), "580.126.09", p).unwrap();
        assert!(e.contains("not running"), "{e}");
        let e =
            fabric_manager_problem(true, || FabricManagerAnswer::Silent, "580.126.09", p).unwrap();
        assert!(e.contains("answered nothing"), "{e}");
    }

    #[test]
    fn fabric_manager_is_asked_directly_and_a_silent_one_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let script = |name: &str, body: &str| {
            let p = dir.path().join(name);
            crate::fsutil::write_test_program(&p, body);
            p.display().to_string()
        };
        let ok = script(
            "fm-ok",
            "#!/bin/sh\necho 'Fabric Manager version is : 580.126.09'\n",
        );
        assert_eq!(
            ask_fabric_manager(&ok, std::time::Duration::from_secs(10)),
            FabricManagerAnswer::Version("580.126.09".into())
        );
        let silent = script("fm-silent", "#!/bin/sh\nexec sleep 30\n");
        let start = std::time::Instant::now();
        assert_eq!(
            ask_fabric_manager(&silent, std::time::Duration::from_millis(300)),
            FabricManagerAnswer::Silent
        );
        assert!(start.elapsed() < std::time::Duration::from_secs(10));
        assert!(matches!(
            ask_fabric_manager(
                "/nonexistent/nv-fabricmanager",
                std::time::Duration::from_secs(1)
            ),
            FabricManagerAnswer::NotStarted(_)
        ));
        // The process is found by its name in /proc.
        let proc_dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(proc_dir.path().join("4242")).unwrap();
        std::fs::write(proc_dir.path().join("4242/comm"), "sshd\n").unwrap();
        assert!(!fabric_manager_running(proc_dir.path()));
        std::fs::create_dir_all(proc_dir.path().join("4243")).unwrap();
        std::fs::write(proc_dir.path().join("4243/comm"), "nv-fabricmanager\n").unwrap();
        assert!(fabric_manager_running(proc_dir.path()));
    }

    #[test]
    fn pci_addresses_of_the_kernel_and_of_nvml_compare() {
        assert_eq!(
            pci_address("00000000:B3:00.0").as_deref(),
            Some("0000:b3:00.0")
        );
        assert_eq!(pci_address("0000:b3:00.0").as_deref(), Some("0000:b3:00.0"));
        assert_eq!(pci_address("b3:00.0"), None);
        assert_eq!(pci_address("10de:26b5"), None);
        let kernel = vec!["0000:53:00.0".to_string(), "0000:b3:00.0".to_string()];
        assert_eq!(
            missing_from_nvml(&kernel, &["00000000:53:00.0".to_string()]),
            vec!["0000:b3:00.0".to_string()]
        );
        assert!(missing_from_nvml(
            &kernel,
            &["00000000:53:00.0".into(), "00000000:B3:00.0".into()]
        )
        .is_empty());
    }

    #[test]
    fn the_kernels_gpus_are_nvidia_display_and_3d_controllers_on_pci() {
        let sys = tempfile::tempdir().unwrap();
        for (addr, vendor, class) in [
            ("0000:b3:00.0", "0x10de", "0x030200"),
            ("0000:53:00.0", "0x10de", "0x030000"),
            ("0000:54:00.0", "0x10de", "0x068000"), // NVSwitch: a bridge, not a GPU
            ("0000:00:1f.0", "0x1d0f", "0x030200"), // another vendor
        ] {
            let d = sys.path().join("bus/pci/devices").join(addr);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("vendor"), format!("{vendor}\n")).unwrap();
            std::fs::write(d.join("class"), format!("{class}\n")).unwrap();
        }
        assert_eq!(
            kernel_gpus(sys.path()),
            vec!["0000:53:00.0".to_string(), "0000:b3:00.0".to_string()]
        );
        assert!(kernel_gpus(&sys.path().join("none")).is_empty());
    }

    #[test]
    fn parses_xid_lines() {
        assert_eq!(
            parse_xid("4,1203,5512,-;NVRM: Xid (PCI:0000:00:1e): 79, pid=1234, name=python, GPU has fallen off the bus."),
            Some(("0000:00:1e".to_string(), 79))
        );
        assert_eq!(
            parse_xid("NVRM: Xid (PCI:0000:3b:00): 48, An uncorrectable double bit error"),
            Some(("0000:3b:00".to_string(), 48))
        );
        assert_eq!(parse_xid("6,1,2,-;usb 1-1: new device"), None);
    }

    #[test]
    fn no_driver_is_no_gpu_unless_gpus_are_expected() {
        // This machine has no NVIDIA driver: the library does not load.
        let f = Facts::new(Host::default());
        let spec = GpuSpec {
            library: Some("/nonexistent/libnvidia-ml.so.1".into()),
            ..GpuSpec::default()
        };
        let msg = check_gpus(&spec, &f).unwrap();
        assert!(msg.starts_with("no GPU"), "{msg}");
        let want = GpuSpec {
            count: GpuCount::Exact(8),
            ..spec.clone()
        };
        let e = check_gpus(&want, &f).unwrap_err().to_string();
        assert!(e.contains("expected 8 GPUs"), "{e}");
        let required = GpuSpec {
            require: true,
            count: GpuCount::Auto,
            ..want
        };
        let e = check_gpus(&required, &f).unwrap_err().to_string();
        assert!(e.starts_with("NVML is unavailable"), "{e}");
        // An instance type not in the table whose GPUs the kernel sees on PCI: a driver
        // that does not load fails it, naming them; `count = 0` still passes.
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path().join("sys");
        std::fs::create_dir_all(sys.join("devices/virtual/dmi/id")).unwrap();
        std::fs::write(
            sys.join("devices/virtual/dmi/id/product_name"),
            "p9x.48xlarge\n",
        )
        .unwrap();
        let d = sys.join("bus/pci/devices/0000:b3:00.0");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("vendor"), "0x10de\n").unwrap();
        std::fs::write(d.join("class"), "0x030200\n").unwrap();
        let f = Facts::new(Host {
            sys_dir: sys,
            ..Host::default()
        });
        let e = check_gpus(&spec, &f).unwrap_err().to_string();
        assert!(
            e.starts_with(
                "the kernel sees 1 NVIDIA GPUs on PCI (0000:b3:00.0), but NVML is unavailable"
            ),
            "{e}"
        );
        let none = GpuSpec {
            count: GpuCount::Exact(0),
            ..spec.clone()
        };
        assert!(check_gpus(&none, &f).unwrap().starts_with("no GPU"));
    }
}
