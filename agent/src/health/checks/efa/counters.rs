//! The EFA driver's hardware counters, compared between runs: the HealthCheckProgram is a
//! new process each time, so the last reading is kept in the state folder
//! ([`STATE_FILE`] under [`crate::health::Host::state_dir`]), with the boot it was taken
//! in.
//!
//! The counters and their names are Linux's EFA driver's (`drivers/infiniband/hw/efa/
//! efa_verbs.c`: `EFA_DEFINE_DEVICE_STATS`, `EFA_DEFINE_PORT_STATS`), read from sysfs:
//! `/sys/class/infiniband/<dev>/hw_counters/<name>` (device) and
//! `/sys/class/infiniband/<dev>/ports/<n>/hw_counters/<name>` (port). Two rules:
//! - a counter of [`NEVER_MOVE`] fails when it is above its value at the first reading of
//!   the boot, and keeps failing until the boot (or the driver) changes: a passing run
//!   would resume the node with the device still broken;
//! - a counter of [`RATE_COUNTERS`] fails when it grew faster than the limit the check
//!   sets (`max_rate_per_min`), in events per minute over the time since the last run
//!   (counted as at least one minute, so that two runs a second apart never extrapolate
//!   one event to sixty a minute).
//!
//! The first run of a boot only records. A counter that went down (the driver was
//! reloaded and its counters started again from zero) resets the baseline of its device or
//! port, not a failure.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// File under the state folder that keeps the last reading.
pub const STATE_FILE: &str = "efa-counters.json";

/// Device counters that must never move in a boot, with why.
///
/// - `no_completion_cmds`: an admin command the device never completed within the
///   driver's timeout (`efa_com_wait_and_process_admin_cq_*` counts it and clears the admin
///   queue's running bit, `EFA_AQ_STATE_RUNNING_BIT`): from then on every admin command
///   (create a queue pair, register memory, read the port counters) is refused until the
///   driver is reloaded. The device has stopped answering; no job can use it.
pub const NEVER_MOVE: &[&str] = &["no_completion_cmds"];

/// Error counters a site may limit in events per minute (`max_rate_per_min`), device
/// counters first, then port counters; each counts a failure, never traffic:
///
/// - device: `cmds_err` (admin commands the device completed with an error),
///   `alloc_pd_err`, `create_qp_err`, `create_cq_err`, `reg_mr_err`, `alloc_ucontext_err`,
///   `create_ah_err`, `mmap_err` (verbs the driver refused to a program: resources out, or
///   a program's mistake, hence a rate and never a rule);
/// - port: `rx_drops` (packets the device dropped on receive), `rdma_read_wr_err`,
///   `rdma_write_wr_err` (RDMA work requests that completed in error), `retrans_pkts`
///   (packets sent again), `retrans_timeout_events` (retransmissions that timed out),
///   `unresponsive_remote_events` (peers that stopped answering),
///   `impaired_remote_conn_events` (connections to peers that degraded). The last four
///   exist from Linux 6.14's driver (`EFA_ADMIN_GET_STATS_TYPE_NETWORK`); an older driver
///   has no such file and the limit finds nothing to judge.
pub const RATE_COUNTERS: &[&str] = &[
    "cmds_err",
    "alloc_pd_err",
    "create_qp_err",
    "create_cq_err",
    "reg_mr_err",
    "alloc_ucontext_err",
    "create_ah_err",
    "mmap_err",
    "rx_drops",
    "rdma_read_wr_err",
    "rdma_write_wr_err",
    "retrans_pkts",
    "retrans_timeout_events",
    "unresponsive_remote_events",
    "impaired_remote_conn_events",
];

/// Counters of one device or port, by name.
pub type Values = BTreeMap<String, u64>;

/// The counters of every EFA device and port read in one run, by scope: the device's name
/// (`rdmap16s27`) for its device counters, `<dev> port <n>` for a port's (the words of the
/// messages).
pub type Counters = BTreeMap<String, Values>;

/// The reading kept between runs (JSON in [`STATE_FILE`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reading {
    /// `/proc/sys/kernel/random/boot_id` when it was taken.
    pub boot_id: String,
    /// Seconds since boot (`/proc/uptime`'s first field) when it was taken: a monotonic
    /// clock of the boot, which a clock step does not move.
    pub uptime_s: f64,
    /// Every counter of [`NEVER_MOVE`] and [`RATE_COUNTERS`] read then.
    pub last: Counters,
    /// The [`NEVER_MOVE`] counters' values at the boot's first reading (or since their
    /// device's counters went down).
    pub baseline: Counters,
}

/// Reads the counters of [`NEVER_MOVE`] and [`RATE_COUNTERS`] that `devices` have under
/// `<sys>/class/infiniband`; a counter file that is missing or does not hold a number is
/// left out.
pub fn read_counters(sys_dir: &Path, devices: &[String]) -> Counters {
    let root = sys_dir.join("class/infiniband");
    let mut out = Counters::new();
    for dev in devices {
        let d = root.join(dev);
        let v = read_known(&d.join("hw_counters"));
        if !v.is_empty() {
            out.insert(dev.clone(), v);
        }
        for port in super::ports(&d) {
            let v = read_known(&d.join("ports").join(&port).join("hw_counters"));
            if !v.is_empty() {
                out.insert(format!("{dev} port {port}"), v);
            }
        }
    }
    out
}

fn read_known(dir: &Path) -> Values {
    NEVER_MOVE
        .iter()
        .chain(RATE_COUNTERS)
        .filter_map(|name| {
            let text = std::fs::read_to_string(dir.join(name)).ok()?;
            Some((name.to_string(), text.trim().parse::<u64>().ok()?))
        })
        .collect()
}

/// The path of the kept reading under `state_dir`.
pub fn state_path(state_dir: &Path) -> PathBuf {
    state_dir.join(STATE_FILE)
}

/// The kept reading, if there is one. One that does not parse (empty, truncated, edited)
/// is set aside as `efa-counters.json.corrupt-<unix seconds>` with an error in the log
/// ([`crate::fsutil::set_aside_corrupt`], as the agent's other state files), and the run
/// counts as the boot's first: it records, and the next run compares again.
pub fn load(state_dir: &Path) -> Option<Reading> {
    let path = state_path(state_dir);
    let bytes = std::fs::read(&path).ok()?;
    match serde_json::from_slice(&bytes) {
        Ok(r) => Some(r),
        Err(e) => {
            let problem = format!("invalid EFA counters reading: {e}");
            crate::fsutil::set_aside_corrupt(&path, &bytes, &problem);
            None
        }
    }
}

/// Writes `r` to `state_dir` (atomically, mode 0644).
///
/// # Errors
/// [`crate::fsutil::WriteError`] naming the step and path.
pub fn save(state_dir: &Path, r: &Reading) -> Result<(), crate::fsutil::WriteError> {
    let json = serde_json::to_vec_pretty(r).unwrap_or_default();
    crate::fsutil::write_atomic(&state_path(state_dir), &json, 0o644, None)
}

/// What comparing a reading with the kept one found.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The failures, in NHC's words, scope first.
    pub problems: Vec<String>,
    /// What else is worth saying (the first run of a boot, a baseline reset).
    pub notes: Vec<String>,
    /// The reading to keep.
    pub keep: Reading,
}

/// A rate as shown: `120`, `0.5`.
fn shown(rate: f64) -> String {
    format!("{}", (rate * 10.0).round() / 10.0)
}

/// Compares `now` (read at `uptime_s` in boot `boot_id`) with `prev`, the kept reading:
/// the [`NEVER_MOVE`] rule and the `limits` (events per minute by counter name).
pub fn judge(
    prev: Option<&Reading>,
    boot_id: &str,
    uptime_s: f64,
    now: &Counters,
    limits: &BTreeMap<String, f64>,
) -> Verdict {
    let never: Counters = now
        .iter()
        .map(|(scope, v)| {
            let kept = v
                .iter()
                .filter(|(n, _)| NEVER_MOVE.contains(&n.as_str()))
                .map(|(n, x)| (n.clone(), *x))
                .collect::<Values>();
            (scope.clone(), kept)
        })
        .filter(|(_, v)| !v.is_empty())
        .collect();
    let mut out = Verdict {
        problems: Vec::new(),
        notes: Vec::new(),
        keep: Reading {
            boot_id: boot_id.to_string(),
            uptime_s,
            last: now.clone(),
            baseline: never,
        },
    };
    let prev = match prev {
        Some(p) if p.boot_id == boot_id && p.uptime_s <= uptime_s => p,
        _ => {
            out.notes
                .push("counters recorded (first run of this boot)".into());
            return out;
        }
    };
    let minutes = ((uptime_s - prev.uptime_s) / 60.0).max(1.0);
    for (scope, values) in now {
        let Some(before) = prev.last.get(scope) else {
            // A device or port not seen before: its first reading.
            continue;
        };
        if values
            .iter()
            .any(|(n, x)| before.get(n).is_some_and(|b| x < b))
        {
            out.notes.push(format!(
                "{scope}: counters went down (driver reloaded?), baseline reset"
            ));
            continue;
        }
        let base = prev.baseline.get(scope);
        for (name, &x) in values {
            if NEVER_MOVE.contains(&name.as_str()) {
                let from = base
                    .and_then(|b| b.get(name))
                    .or_else(|| before.get(name))
                    .copied()
                    .unwrap_or(x);
                // Keep the boot's baseline, so that the failure lasts.
                if let Some(b) = out.keep.baseline.get_mut(scope) {
                    b.insert(name.clone(), from);
                }
                if x > from {
                    out.problems.push(format!(
                        "{scope}: {name} moved {from} -> {x} this boot (must never move)"
                    ));
                }
            } else if let (Some(limit), Some(b)) = (limits.get(name), before.get(name)) {
                let rate = (x - b) as f64 / minutes;
                if rate > *limit {
                    out.problems.push(format!(
                        "{scope}: {name} {}/min, more than {}/min",
                        shown(rate),
                        shown(*limit)
                    ));
                }
            }
        }
    }
    out
}
