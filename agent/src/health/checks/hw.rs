//! Hardware against expectation (NHC's `check_hw_cpuinfo`, `check_hw_physmem`,
//! `check_hw_swap`, `check_hw_mem`, `check_hw_*_free`, `check_hw_ib`, `check_hw_eth`), and
//! per instance type expectations for the agent's own `hardware` check.
//!
//! Memory is in KiB as `/proc/meminfo` reports it; "free RAM" is MemFree + Buffers +
//! Cached, as in NHC.

use std::fs;

use super::{Checked, Failed};
use crate::health::facts::Facts;
use crate::health::matcher::Matcher;
use crate::health::units::{human_kib, Threshold};

/// Expected CPU counts (NHC's sockets, cores, threads; plus online logical CPUs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuSpec {
    /// Sockets.
    pub sockets: Option<u32>,
    /// Cores (sockets × cores per socket).
    pub cores: Option<u32>,
    /// Threads (sockets × siblings).
    pub threads: Option<u32>,
    /// Online logical CPUs (`processor` entries).
    pub processors: Option<u32>,
}

/// Which memory figure a [`MemSpec`] bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemWhat {
    /// MemTotal.
    Physmem,
    /// SwapTotal.
    Swap,
    /// MemTotal + SwapTotal.
    Total,
    /// Free RAM.
    PhysmemFree,
    /// SwapFree.
    SwapFree,
    /// Free RAM + SwapFree.
    TotalFree,
}

impl MemWhat {
    fn label(self) -> &'static str {
        match self {
            MemWhat::Physmem => "RAM size",
            MemWhat::Swap => "swap size",
            MemWhat::Total => "system memory (RAM + swap)",
            MemWhat::PhysmemFree => "free RAM",
            MemWhat::SwapFree => "free swap",
            MemWhat::TotalFree => "free memory (RAM + swap)",
        }
    }
}

/// Bounds on one memory figure, in KiB, with a tolerance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemSpec {
    /// Figure.
    pub what: MemWhat,
    /// Lower bound.
    pub min: Option<u64>,
    /// Upper bound.
    pub max: Option<u64>,
    /// Tolerance: a percentage of the actual figure or an amount of KiB (NHC's "fudge").
    pub tolerance: Option<Threshold>,
}

/// CPU and memory expectations.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HardwareSpec {
    /// CPU counts.
    pub cpu: CpuSpec,
    /// Memory bounds.
    pub mem: Vec<MemSpec>,
    /// Also expect the vCPUs and memory of the instance type found in DMI (when it is in
    /// [`instance_type_shape`]'s table), memory within this tolerance.
    pub instance_type_auto: Option<Threshold>,
}

/// An InfiniBand port that is ACTIVE and LinkUp, optionally at a rate or on a device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IbSpec {
    /// Rate in Gb/sec, as the first word of `ports/<n>/rate` (`100`).
    pub rate: Option<String>,
    /// `device:port`, e.g. `mlx5_0:1`.
    pub dev: Option<String>,
}

/// Nominal vCPUs and memory (GiB) of common EC2 instance types used for HPC, from the EC2
/// instance type documentation. Unknown types have no expectation.
pub fn instance_type_shape(instance_type: &str) -> Option<(u32, u64)> {
    Some(match instance_type {
        "t3.micro" => (2, 1),
        "t3.small" => (2, 2),
        "t3.medium" => (2, 4),
        "c5.large" => (2, 4),
        "c5.xlarge" => (4, 8),
        "m5.large" => (2, 8),
        "m5.xlarge" => (4, 16),
        "c5n.18xlarge" => (72, 192),
        "c6i.32xlarge" => (128, 256),
        "c6in.32xlarge" => (128, 256),
        "c7i.48xlarge" => (192, 384),
        "m6i.32xlarge" => (128, 512),
        "r6i.32xlarge" => (128, 1024),
        "hpc6a.48xlarge" => (96, 384),
        "hpc6id.32xlarge" => (64, 1024),
        "hpc7a.96xlarge" => (192, 768),
        "hpc7g.16xlarge" => (64, 128),
        "g5.xlarge" => (4, 16),
        "g5.48xlarge" => (192, 768),
        "p3.16xlarge" => (64, 488),
        "p4d.24xlarge" => (96, 1152),
        "p5.48xlarge" => (192, 2048),
        _ => return None,
    })
}

/// The EC2 instance type from DMI (`/sys/devices/virtual/dmi/id/product_name` on Nitro
/// instances), when it looks like one (`family.size`).
pub fn detect_instance_type(facts: &Facts) -> Option<String> {
    let p = facts
        .host
        .sys_dir
        .join("devices/virtual/dmi/id/product_name");
    let name = fs::read_to_string(p).ok()?.trim().to_string();
    let (family, size) = name.split_once('.')?;
    let ok = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    (ok(family) && ok(size)).then_some(name)
}

fn check_cpu(spec: &CpuSpec, facts: &Facts) -> Result<String, Failed> {
    let failed = |m: String| Failed::new(Checked::Cpu, m);
    let c = facts.cpu()?;
    for (label, want, have) in [
        ("socket", spec.sockets, c.sockets),
        ("core", spec.cores, c.cores),
        ("thread", spec.threads, c.threads),
        ("online CPU", spec.processors, c.processors),
    ] {
        if let Some(w) = want {
            if w != have {
                return Err(failed(format!(
                    "actual CPU {label} count ({have}) does not match expected ({w})"
                )));
            }
        }
    }
    Ok(format!(
        "{} sockets, {} cores, {} threads",
        c.sockets, c.cores, c.threads
    ))
}

fn check_mem(spec: &MemSpec, facts: &Facts) -> Result<String, Failed> {
    let failed = |m: String| Failed::new(Checked::Memory, m);
    let m = facts.mem()?;
    let actual = match spec.what {
        MemWhat::Physmem => m.ram_total,
        MemWhat::Swap => m.swap_total,
        MemWhat::Total => m.ram_total + m.swap_total,
        MemWhat::PhysmemFree => m.ram_free,
        MemWhat::SwapFree => m.swap_free,
        MemWhat::TotalFree => m.ram_free + m.swap_free,
    };
    let fudge = match spec.tolerance {
        None => 0,
        Some(Threshold::Percent(p)) => (actual as f64 * p / 100.0) as u64,
        Some(Threshold::Absolute(n)) => n,
    };
    let label = spec.what.label();
    if let Some(min) = spec.min {
        if actual.saturating_add(fudge) < min {
            return Err(failed(format!(
                "{label} {} ({actual} KiB) less than minimum allowed {} ({min} KiB)",
                human_kib(actual),
                human_kib(min)
            )));
        }
    }
    if let Some(max) = spec.max {
        if actual.saturating_sub(fudge) > max {
            return Err(failed(format!(
                "{label} {} ({actual} KiB) greater than maximum allowed {} ({max} KiB)",
                human_kib(actual),
                human_kib(max)
            )));
        }
    }
    Ok(format!("{label} {}", human_kib(actual)))
}

/// Runs a hardware check.
///
/// # Errors
/// [`Failed`]: what is wrong, in NHC's words.
pub fn check_hardware(spec: &HardwareSpec, facts: &Facts) -> Result<String, Failed> {
    let mut parts = Vec::new();
    if let Some(tolerance) = spec.instance_type_auto {
        match detect_instance_type(facts) {
            Some(t) => match instance_type_shape(&t) {
                Some((vcpus, gib)) => {
                    let kib = gib * 1024 * 1024;
                    let auto = HardwareSpec {
                        cpu: CpuSpec {
                            processors: Some(vcpus),
                            ..CpuSpec::default()
                        },
                        mem: vec![MemSpec {
                            what: MemWhat::Physmem,
                            min: Some(kib),
                            max: Some(kib),
                            tolerance: Some(tolerance),
                        }],
                        instance_type_auto: None,
                    };
                    parts.push(format!("{t}: {}", check_hardware(&auto, facts)?));
                }
                None => parts.push(format!("instance type {t} has no built-in expectation")),
            },
            None => parts.push("instance type unknown (no EC2 DMI product name)".into()),
        }
    }
    if spec.cpu != CpuSpec::default() {
        parts.push(check_cpu(&spec.cpu, facts)?);
    }
    for m in &spec.mem {
        parts.push(check_mem(m, facts)?);
    }
    Ok(parts.join("; "))
}

/// Runs an InfiniBand check over `/sys/class/infiniband/*/ports/*`.
///
/// # Errors
/// [`Failed`]: what is wrong, in NHC's words.
pub fn check_ib(spec: &IbSpec, facts: &Facts) -> Result<String, Failed> {
    let failed = |m: String| Failed::new(Checked::Infiniband(spec.dev.clone()), m);
    let sys = &facts.host.sys_dir;
    let abi = fs::read_to_string(sys.join("class/infiniband_mad/abi_version")).unwrap_or_default();
    if abi.trim().is_empty() || abi.trim() == "0" {
        return Err(failed(
            "no InfiniBand user-level MAD ABI (ib_umad not loaded)".into(),
        ));
    }
    let root = sys.join("class/infiniband");
    let mut seen = Vec::new();
    for dev in fs::read_dir(&root).into_iter().flatten().flatten() {
        let dname = dev.file_name().to_string_lossy().into_owned();
        for port in fs::read_dir(dev.path().join("ports"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let pname = port.file_name().to_string_lossy().into_owned();
            let read = |f: &str| fs::read_to_string(port.path().join(f)).unwrap_or_default();
            // "4: ACTIVE", "5: LinkUp", "100 Gb/sec (4X EDR)"
            let state = read("state");
            let phys = read("phys_state");
            let rate = read("rate");
            let state = state.split(':').nth(1).unwrap_or("").trim().to_string();
            let phys = phys.split(':').nth(1).unwrap_or("").trim().to_string();
            let rate = rate.split_whitespace().next().unwrap_or("").to_string();
            let id = format!("{dname}:{pname}");
            if state == "ACTIVE"
                && phys == "LinkUp"
                && spec.dev.as_ref().is_none_or(|d| *d == id)
                && spec.rate.as_ref().is_none_or(|r| *r == rate)
            {
                return Ok(format!("{id} ACTIVE (LinkUp {rate} Gb/sec)"));
            }
            seen.push(format!("{id} {state}/{phys} {rate}"));
        }
    }
    let dev = spec
        .dev
        .as_ref()
        .map(|d| format!(" {d}"))
        .unwrap_or_default();
    let rate = spec
        .rate
        .as_ref()
        .map(|r| format!(" {r} Gb/sec"))
        .unwrap_or_default();
    Err(failed(format!(
        "no IB port{dev} is ACTIVE (LinkUp{rate}); ports: {}",
        if seen.is_empty() {
            "none".to_string()
        } else {
            seen.join(", ")
        }
    )))
}

/// Runs a network interface check.
///
/// # Errors
/// [`Failed`]: what is wrong, in NHC's words.
pub fn check_netdev(m: &Matcher, facts: &Facts) -> Result<String, Failed> {
    let failed = |msg: String| Failed::new(Checked::NetDev(m.to_string()), msg);
    let devs = facts.netdevs()?;
    match devs.iter().find(|d| m.matches(d)) {
        Some(d) => Ok(format!("network device {d} present")),
        None => Err(failed(format!("Ethernet device {m} not detected"))),
    }
}

/// NHC's `check_hw_mcelog`: runs `mcelog --client` (NHC's `MCELOG` and `MCELOG_ARGS`)
/// and reads its per-DIMM error counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McelogSpec {
    /// Program and arguments (`mcelog --client`), run without a shell.
    pub argv: Vec<String>,
    /// Most corrected memory errors in 24 h per DIMM (`MCELOG_MAX_CORRECTED_RATE`,
    /// default 9). With either limit unset, any output of mcelog fails the check (NHC).
    pub max_corrected: Option<i64>,
    /// Most uncorrected memory errors in 24 h per DIMM (`MCELOG_MAX_UNCORRECTED_RATE`,
    /// default 0).
    pub max_uncorrected: Option<i64>,
}

/// Judges mcelog's output (stdout then stderr) as NHC does: nothing, or `Connection
/// refused` (no daemon), passes; otherwise with both limits set, the count two non-empty
/// lines below each `corrected memory errors:` / `uncorrected memory errors:` line (the
/// `in 24h` line of mcelog's client output) must not exceed its limit; without limits any
/// output fails.
///
/// # Errors
/// [`Failed`]: what is wrong, in NHC's words.
pub fn judge_mcelog(spec: &McelogSpec, output: &str) -> Result<String, Failed> {
    let failed = |m: String| Failed::new(Checked::Mcelog(spec.argv.clone()), m);
    if output.is_empty() {
        return Ok("no machine check errors reported".into());
    }
    if output.contains("Connection refused") {
        return Ok("no mcelog daemon running (connection refused)".into());
    }
    let (Some(max_c), Some(max_u)) = (spec.max_corrected, spec.max_uncorrected) else {
        let first = output.lines().next().unwrap_or("");
        return Err(failed(format!(
            "check_hw_mcelog: MCEs detected in log (no limits set): {first}"
        )));
    };
    let lines: Vec<&str> = output.split('\n').filter(|l| !l.is_empty()).collect();
    for (i, l) in lines.iter().enumerate() {
        let (limit, what) = match *l {
            "corrected memory errors:" => (max_c, "corrected"),
            "uncorrected memory errors:" => (max_u, "UNcorrected"),
            _ => continue,
        };
        let n = lines
            .get(i + 2)
            .and_then(|x| x.split_whitespace().next())
            .and_then(|w| w.parse::<i64>().ok());
        if let Some(n) = n.filter(|n| *n > limit) {
            return Err(failed(format!(
                "check_hw_mcelog: MCEs detected - {n} {what} memory errors detected (limit of {limit}/day)."
            )));
        }
    }
    Ok(format!(
        "machine check errors within limits ({max_c} corrected, {max_u} uncorrected per day)"
    ))
}

/// Runs mcelog and judges its output ([`judge_mcelog`]). A program that cannot be
/// started counts as its error message printed, as NHC's `$(mcelog ... 2>&1)` does.
///
/// # Errors
/// [`Failed`]: what is wrong, in NHC's words; a timeout is [`Failed::TimedOut`].
pub async fn check_mcelog(
    spec: &McelogSpec,
    timeout: std::time::Duration,
    output_limit: usize,
) -> Result<String, Failed> {
    let output = match super::cmd::run_command(&spec.argv, timeout, output_limit).await {
        Ok(o) if o.timed_out => {
            return Err(Failed::TimedOut {
                argv: spec.argv.clone(),
                timeout,
                killed: String::new(),
            })
        }
        Ok(o) => {
            let mut text = String::from_utf8_lossy(&o.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&o.stderr));
            text
        }
        Err(e) => e.to_string(),
    };
    judge_mcelog(spec, &output)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::health::facts::Host;

    fn facts_with(files: &[(&str, &str)]) -> (tempfile::TempDir, Facts) {
        let dir = tempfile::tempdir().unwrap();
        for (p, c) in files {
            let path = dir.path().join(p);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, c).unwrap();
        }
        let host = Host {
            proc_dir: dir.path().join("proc"),
            sys_dir: dir.path().join("sys"),
            ..Host::default()
        };
        (dir, Facts::new(host))
    }

    #[test]
    fn memory_bounds_with_fudge() {
        let (_d, f) = facts_with(&[(
            "proc/meminfo",
            "MemTotal: 1000000 kB\nMemFree: 10 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n",
        )]);
        let spec = |min, max, tol| MemSpec {
            what: MemWhat::Physmem,
            min,
            max,
            tolerance: tol,
        };
        assert!(check_mem(&spec(Some(1_000_000), Some(1_000_000), None), &f).is_ok());
        assert!(check_mem(&spec(Some(1_048_576), None, None), &f).is_err());
        assert!(check_mem(
            &spec(Some(1_048_576), None, Some(Threshold::Percent(5.0))),
            &f
        )
        .is_ok());
        assert!(check_mem(&spec(None, Some(900_000), None), &f).is_err());
        let free = MemSpec {
            what: MemWhat::PhysmemFree,
            min: Some(1024),
            max: None,
            tolerance: None,
        };
        let e = check_mem(&free, &f).unwrap_err().to_string();
        assert!(e.contains("free RAM"), "{e}");
    }

    #[test]
    fn ib_ports_and_netdevs() {
        let (_d, f) = facts_with(&[
            ("sys/class/infiniband_mad/abi_version", "5\n"),
            ("sys/class/infiniband/mlx5_0/ports/1/state", "4: ACTIVE\n"),
            (
                "sys/class/infiniband/mlx5_0/ports/1/phys_state",
                "5: LinkUp\n",
            ),
            (
                "sys/class/infiniband/mlx5_0/ports/1/rate",
                "100 Gb/sec (4X EDR)\n",
            ),
            (
                "proc/net/dev",
                "Inter-|   Receive\n face |bytes\n    lo: 1 2\n  eth0: 3 4\n",
            ),
        ]);
        assert!(check_ib(&IbSpec::default(), &f).is_ok());
        let r = IbSpec {
            rate: Some("200".into()),
            dev: None,
        };
        let e = check_ib(&r, &f).unwrap_err().to_string();
        assert!(e.contains("mlx5_0:1 ACTIVE/LinkUp 100"), "{e}");
        assert!(check_netdev(&Matcher::parse("eth*").unwrap(), &f).is_ok());
        assert!(check_netdev(&Matcher::parse("ib0").unwrap(), &f).is_err());
    }

    #[test]
    fn instance_type_from_dmi() {
        let (_d, f) = facts_with(&[("sys/devices/virtual/dmi/id/product_name", "c5n.18xlarge\n")]);
        assert_eq!(detect_instance_type(&f).as_deref(), Some("c5n.18xlarge"));
        assert_eq!(instance_type_shape("c5n.18xlarge"), Some((72, 192)));
        let (_d, f) = facts_with(&[("sys/devices/virtual/dmi/id/product_name", "HVM domU\n")]);
        assert_eq!(detect_instance_type(&f), None);
    }
}
