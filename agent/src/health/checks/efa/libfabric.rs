//! Whether libfabric finds its EFA provider: `fi_info -p efa`, the EFA installer's own
//! check ("Verify that the EFA software components were successfully installed", in the
//! EC2 User Guide's "Get started with EFA and MPI"), run without a shell through
//! [`crate::health::checks::cmd::run_command`] (its own process group and cgroup, killed
//! at [`FI_INFO_TIMEOUT`]).

use std::time::Duration;

use crate::health::checks::{cmd, Checked, Failed};

/// Where the EFA installer puts `fi_info` (`aws-efa-installer`: `/opt/amazon/efa`).
pub const FI_INFO_PROGRAM: &str = "/opt/amazon/efa/bin/fi_info";

/// How long `fi_info` may take: it opens every EFA device (32 on a p5.48xlarge), which
/// takes well under a second on a healthy node; a hung device holds it.
pub const FI_INFO_TIMEOUT: Duration = Duration::from_secs(5);

/// Most bytes of `fi_info`'s output kept (a `provider:` block is about 150 bytes).
const OUTPUT_LIMIT: usize = 64 * 1024;

/// The `domain:`s of the `provider: efa` blocks of `fi_info`'s output, in order; `None`
/// when no block names `provider: efa` (libfabric's provider list format, `fi_info(1)`:
/// `provider: NAME` then indented `fabric:`, `domain:`, `version:`, `type:`, `protocol:`).
pub fn efa_domains(output: &str) -> Option<Vec<String>> {
    let mut found = false;
    let mut in_efa = false;
    let mut domains = Vec::new();
    for line in output.lines() {
        let l = line.trim();
        if let Some(p) = l.strip_prefix("provider:") {
            in_efa = p.trim() == "efa";
            found |= in_efa;
        } else if let Some(d) = l.strip_prefix("domain:").filter(|_| in_efa) {
            domains.push(d.trim().to_string());
        }
    }
    found.then_some(domains)
}

/// Runs `<program> -p efa` and judges it: `Ok` with what it found.
///
/// # Errors
/// [`Failed`] (EFA) with what is wrong in NHC's words
/// (`/opt/amazon/efa/bin/fi_info -p efa: exited with 1 (...)`): the program cannot be
/// started, was killed at [`FI_INFO_TIMEOUT`], exited non-zero, or printed no
/// `provider: efa`.
pub fn check_provider(program: &str) -> Result<String, Failed> {
    let fail = |problem: String| Failed::new(Checked::Efa, format!("{program} -p efa: {problem}"));
    let argv = [program.to_string(), "-p".into(), "efa".into()];
    let o = cmd::run_command_blocking(&argv, FI_INFO_TIMEOUT, OUTPUT_LIMIT)
        .map_err(|e| fail(e.to_string()))?;
    if o.timed_out {
        return Err(fail(format!(
            "no answer within {} (killed)",
            cmd::shown_duration(FI_INFO_TIMEOUT)
        )));
    }
    let stderr = String::from_utf8_lossy(&o.stderr);
    let first = stderr.lines().map(str::trim).find(|l| !l.is_empty());
    let why = first.map(|l| format!(" ({l})")).unwrap_or_default();
    match o.code {
        Some(0) => {}
        Some(c) => return Err(fail(format!("exited with {c}{why}"))),
        None => return Err(fail(format!("killed by a signal{why}"))),
    }
    efa_domains(&String::from_utf8_lossy(&o.stdout))
        .map(|d| format!("libfabric's efa provider: {}", d.join(", ")))
        .ok_or_else(|| fail("no \"provider: efa\" in its output".into()))
}
