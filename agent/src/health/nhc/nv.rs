//! NHC's `lbnl_nv.nhc` and `csc_nvidia_smi.nhc` functions translated to the engine's
//! checks: check_nv_healthmon, check_nvsmi_healthmon.
//!
//! NHC runs a program and fails on a non-zero exit (`nvidia-healthmon -e -v`,
//! `nvidia-smi`). Where the file names that program (`NVIDIA_HEALTHMON`,
//! `NVIDIA_SMI_HEALTHMON`, e.g. `dcgmi` with `diag -r 1`), the agent runs it the same way
//! (no shell). Otherwise it asks NVML itself instead of running nvidia-smi: NVML must
//! load and every GPU must answer (what nvidia-smi's exit status reports); for
//! `check_nv_healthmon` also the GPU check's default health limits (ECC, retired pages,
//! remapped rows, hardware slowdown, XID errors).

use super::*;
use crate::health::checks::gpu::{GpuCount, GpuSpec};

/// `check_nv_healthmon` / `check_nvsmi_healthmon`.
pub(super) fn healthmon(name: &str, args: &[String], cx: &Cx) -> Result<Built, NhcError> {
    too_many(args, 0)?;
    let (var, args_var, default_args) = if name == "check_nv_healthmon" {
        ("NVIDIA_HEALTHMON", "NVIDIA_HEALTHMON_ARGS", "-e -v")
    } else {
        ("NVIDIA_SMI_HEALTHMON", "NVIDIA_SMI_HEALTHMON_ARGS", "")
    };
    if let Some(prog) = cx.var(var).filter(|p| !p.trim().is_empty()) {
        let mut argv: Vec<String> = prog.split_whitespace().map(str::to_string).collect();
        argv.extend(
            cx.var(args_var)
                .unwrap_or(default_args)
                .split_whitespace()
                .map(str::to_string),
        );
        return Ok(one(
            CheckKind::Command(CommandSpec {
                argv,
                status: 0,
                matches: Vec::new(),
                check_name: Some(name.to_string()),
                messages: Vec::new(),
            }),
            cx.timeout,
        ));
    }
    let spec = if name == "check_nv_healthmon" {
        GpuSpec {
            require: true,
            ..GpuSpec::default()
        }
    } else {
        GpuSpec {
            count: GpuCount::Auto,
            xid: false,
            xid_ignore: Vec::new(),
            max_uncorrected_ecc: None,
            max_retired_pages: None,
            max_remapped_rows: None,
            max_temperature_c: None,
            fail_on_hw_slowdown: false,
            nvlink: false,
            library: None,
            require: true,
            // check_nvsmi_healthmon: NVML answers, nothing more (nvidia-smi's own check).
            fabric_manager: Some(false),
            ..GpuSpec::default()
        }
    };
    Ok(one(CheckKind::Gpu(spec), cx.timeout))
}
