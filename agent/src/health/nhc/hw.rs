//! NHC's `lbnl_hw.nhc` functions translated to the engine's checks: check_hw_cpuinfo, check_hw_physmem/swap/mem (and _free), check_hw_ib, check_hw_eth, check_hw_mcelog.

use super::*;

/// `check_hw_cpuinfo`.
pub(super) fn cpuinfo(_name: &str, args: &[String], cx: &Cx) -> Result<Built, NhcError> {
    let timeout = cx.timeout;
    too_many(args, 3)?;
    let n = |i: usize| -> Result<Option<u32>, NhcError> {
        arg(args, i)
            .map(|s| {
                s.parse::<u32>().map_err(|_| NhcError::NotACount {
                    value: s.to_string(),
                })
            })
            .transpose()
    };
    Ok(one(
        CheckKind::Hardware(HardwareSpec {
            cpu: CpuSpec {
                sockets: n(0)?,
                cores: n(1)?,
                threads: n(2)?,
                processors: None,
            },
            mem: Vec::new(),
            instance_type_auto: None,
        }),
        timeout,
    ))
}

/// `check_hw_physmem` / `check_hw_swap` / `check_hw_mem`.
pub(super) fn mem(name: &str, args: &[String], cx: &Cx) -> Result<Built, NhcError> {
    let timeout = cx.timeout;
    too_many(args, 3)?;
    let what = match name {
        "check_hw_physmem" => MemWhat::Physmem,
        "check_hw_swap" => MemWhat::Swap,
        _ => MemWhat::Total,
    };
    let min = arg(args, 0).map(parse_size_kib).transpose()?;
    let max = arg(args, 1).map(parse_size_kib).transpose()?;
    let tolerance = arg(args, 2).map(parse_space_threshold).transpose()?;
    Ok(one(
        CheckKind::Hardware(HardwareSpec {
            cpu: CpuSpec::default(),
            mem: vec![MemSpec {
                what,
                min,
                max,
                tolerance,
            }],
            instance_type_auto: None,
        }),
        timeout,
    ))
}

/// `check_hw_physmem_free` / `check_hw_swap_free` / `check_hw_mem_free`.
pub(super) fn mem_free(name: &str, args: &[String], cx: &Cx) -> Result<Built, NhcError> {
    let timeout = cx.timeout;
    too_many(args, 1)?;
    let what = match name {
        "check_hw_physmem_free" => MemWhat::PhysmemFree,
        "check_hw_swap_free" => MemWhat::SwapFree,
        _ => MemWhat::TotalFree,
    };
    let min = Some(parse_size_kib(need(args, 0, "minimum")?)?);
    Ok(one(
        CheckKind::Hardware(HardwareSpec {
            cpu: CpuSpec::default(),
            mem: vec![MemSpec {
                what,
                min,
                max: None,
                tolerance: None,
            }],
            instance_type_auto: None,
        }),
        timeout,
    ))
}

/// `check_hw_ib`.
pub(super) fn ib(_name: &str, args: &[String], cx: &Cx) -> Result<Built, NhcError> {
    let timeout = cx.timeout;
    too_many(args, 2)?;
    Ok(one(
        CheckKind::Ib(IbSpec {
            rate: arg(args, 0).map(str::to_string),
            dev: arg(args, 1).map(str::to_string),
        }),
        timeout,
    ))
}

/// `check_hw_mcelog`: `$MCELOG $MCELOG_ARGS` (default `mcelog --client`, words split on
/// whitespace, run without a shell), limits from `MCELOG_MAX_CORRECTED_RATE` (default 9)
/// and `MCELOG_MAX_UNCORRECTED_RATE` (default 0); an empty limit means none.
pub(super) fn mcelog(_name: &str, args: &[String], cx: &Cx) -> Result<Built, NhcError> {
    too_many(args, 0)?;
    let mut argv: Vec<String> = cx
        .var("MCELOG")
        .unwrap_or("mcelog")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    if argv.is_empty() {
        return Err(NhcError::EmptySetting { setting: "MCELOG" });
    }
    argv.extend(
        cx.var("MCELOG_ARGS")
            .unwrap_or("--client")
            .split_whitespace()
            .map(str::to_string),
    );
    let limit = |var: &'static str, default: &str| -> Result<Option<i64>, NhcError> {
        let v = cx.var(var).unwrap_or(default);
        if v.is_empty() {
            return Ok(None);
        }
        crate::health::arith::parse_int(v)
            .map(Some)
            .map_err(|source| NhcError::SettingNotInteger {
                setting: var,
                value: v.to_string(),
                source,
            })
    };
    Ok(one(
        CheckKind::Mcelog(McelogSpec {
            argv,
            max_corrected: limit("MCELOG_MAX_CORRECTED_RATE", "9")?,
            max_uncorrected: limit("MCELOG_MAX_UNCORRECTED_RATE", "0")?,
        }),
        cx.timeout,
    ))
}

/// `check_hw_eth`.
pub(super) fn eth(_name: &str, args: &[String], cx: &Cx) -> Result<Built, NhcError> {
    let timeout = cx.timeout;
    too_many(args, 1)?;
    Ok(one(
        CheckKind::NetDev(matcher(need(args, 0, "device")?)?),
        timeout,
    ))
}
