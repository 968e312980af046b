//! Elastic Fabric Adapter devices: `/sys/class/infiniband/<dev>` whose `device/driver`
//! link points at the `efa` driver, on instance types that have EFA; and the EFA devices the
//! kernel sees on PCI (the EFA interfaces the instance was launched with, whether or not a
//! driver took them). Beyond counting them: each port ACTIVE and LinkUp, the driver's
//! counters compared between runs ([`counters`]), and libfabric's EFA provider
//! ([`libfabric`]).

pub mod counters;
pub mod libfabric;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use super::{Checked, Failed};
use crate::health::facts::Facts;

/// How many EFA devices are expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EfaCount {
    /// From the instance type (DMI product name) when known, otherwise at least one; and
    /// never fewer than the EFA devices the kernel sees on PCI.
    #[default]
    Auto,
    /// At least this many.
    AtLeast(u32),
}

/// EFA expectations (checks.d's `efa` kind).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EfaSpec {
    /// Expected devices (`count`).
    pub count: EfaCount,
    /// Most events per minute of error counters ([`counters::RATE_COUNTERS`]) by name
    /// (`max_rate_per_min`); a counter not named has no limit.
    pub max_rate_per_min: BTreeMap<String, f64>,
    /// The `fi_info` program (absolute) to ask for libfabric's EFA provider
    /// (`libfabric = true`, `fi_info_program`); `None`: not asked.
    pub fi_info: Option<String>,
}

/// The most EFA interfaces of EC2 instance types (DescribeInstanceTypes'
/// `NetworkInfo.EfaInfo.MaximumEfaInterfaces`: one per network card that has EFA), from
/// the EC2 User Guide:
/// - "Maximize network bandwidth on Amazon EC2 instances with multiple network cards"
///   (<https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html>):
///   P5 and P5e "support up to 32 network cards", G6e "up to four";
/// - the other rows as this table has had them, from "Elastic Fabric Adapter",
///   "Supported instance types"
///   (<https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa.html#efa-instance-types>)
///   and "Network cards"
///   (<https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/using-eni.html#network-cards>):
///   p4d and p4de 4, hpc7a 2, the single-card types 1.
///
/// Types with EFA whose count no AWS page we could read states (p5en, p6-b200,
/// p6e-gb200, trn1, trn1n, trn2, hpc8a) are left out, never guessed: they expect at least
/// one, and never fewer than the kernel sees on PCI. `Some(0)`: a type without EFA.
pub fn expected_efa(instance_type: &str) -> Option<u32> {
    Some(match instance_type {
        "p5.48xlarge" | "p5e.48xlarge" => 32,
        "p4d.24xlarge" | "p4de.24xlarge" | "g6e.48xlarge" => 4,
        "c5n.18xlarge" | "c5n.metal" | "hpc6a.48xlarge" | "hpc6id.32xlarge" | "hpc7g.16xlarge"
        | "c6i.32xlarge" | "c6in.32xlarge" | "c7i.48xlarge" | "g5.48xlarge" | "m6i.32xlarge" => 1,
        "hpc7a.96xlarge" => 2,
        "t3.micro" | "t3.small" | "t3.medium" | "c5.large" | "c5.xlarge" | "m5.large"
        | "m5.xlarge" | "g5.xlarge" => 0,
        _ => return None,
    })
}

/// Amazon's PCI vendor id (`/sys/bus/pci/devices/*/vendor`).
pub const PCI_VENDOR_AMAZON: &str = "0x1d0f";

/// The EFA devices the kernel sees on PCI, whatever driver took them (or none): functions
/// of vendor [`PCI_VENDOR_AMAZON`] whose device id is `0xefa0` to `0xefaf` (Linux's
/// `drivers/infiniband/hw/efa`: `0xefa0`, `0xefa1`, `0xefa2`, `0xefa3`), by PCI address,
/// sorted. Empty when the folder cannot be read. These are the EFA interfaces the instance
/// was launched with: an instance type that supports EFA but was launched without it has
/// none.
pub fn pci_efa_devices(sys_dir: &std::path::Path) -> Vec<String> {
    let Ok(rd) = fs::read_dir(sys_dir.join("bus/pci/devices")) else {
        return Vec::new();
    };
    let read = |p: std::path::PathBuf| fs::read_to_string(p).unwrap_or_default();
    let mut out: Vec<String> = rd
        .flatten()
        .filter(|e| {
            let vendor = read(e.path().join("vendor"));
            let device = read(e.path().join("device"));
            let device = device.trim().to_ascii_lowercase();
            vendor.trim().eq_ignore_ascii_case(PCI_VENDOR_AMAZON)
                && device.len() == 6
                && device.starts_with("0xefa")
                && device[5..].chars().all(|c| c.is_ascii_hexdigit())
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

/// EFA device names under `<sys>/class/infiniband`.
pub fn efa_devices(facts: &Facts) -> Vec<String> {
    let root = facts.host.sys_dir.join("class/infiniband");
    let mut out: Vec<String> = fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            fs::read_link(e.path().join("device/driver"))
                .ok()
                .and_then(|t| t.file_name().map(|n| n == "efa"))
                .unwrap_or(false)
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

/// The ports of an InfiniBand device folder (`<dev>/ports/<n>`), in number order.
pub fn ports(dev_dir: &Path) -> Vec<String> {
    let mut out: Vec<(u32, String)> = fs::read_dir(dev_dir.join("ports"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            Some((n.parse().ok()?, n))
        })
        .collect();
    out.sort();
    out.into_iter().map(|(_, n)| n).collect()
}

/// What the ports of `devices` under `<sys>/class/infiniband` read when not as they must:
/// `ports/<n>/state` `4: ACTIVE` and, where the file is, `ports/<n>/phys_state`
/// `5: LinkUp` (the kernel's words, `drivers/infiniband/core/sysfs.c`), in NHC's words
/// (`rdmap16s27 port 1: state 1: DOWN`). A device without ports says nothing.
pub fn port_problems(sys_dir: &Path, devices: &[String]) -> Vec<String> {
    let root = sys_dir.join("class/infiniband");
    let mut out = Vec::new();
    for dev in devices {
        let d = root.join(dev);
        for port in ports(&d) {
            let p = d.join("ports").join(&port);
            for (file, want, required) in [
                ("state", "4: ACTIVE", true),
                ("phys_state", "5: LinkUp", false),
            ] {
                match fs::read_to_string(p.join(file)) {
                    Ok(v) if v.trim() == want => {}
                    Ok(v) => out.push(format!("{dev} port {port}: {file} {}", v.trim())),
                    Err(e) if required || e.kind() != std::io::ErrorKind::NotFound => {
                        out.push(format!("{dev} port {port}: {file} unreadable: {e}"))
                    }
                    Err(_) => {}
                }
            }
        }
    }
    out
}

/// The counters' verdict for `devices`, keeping the reading in the state folder (when it
/// exists): the failures, and what the pass message says.
fn judge_counters(spec: &EfaSpec, facts: &Facts, devices: &[String]) -> (Vec<String>, String) {
    let now = counters::read_counters(&facts.host.sys_dir, devices);
    if now.is_empty() {
        return (Vec::new(), String::new());
    }
    let state = &facts.host.state_dir;
    if !state.is_dir() {
        return (
            Vec::new(),
            format!(
                "; counters not compared (no state folder {})",
                state.display()
            ),
        );
    }
    let proc = &facts.host.proc_dir;
    let boot = fs::read_to_string(proc.join("sys/kernel/random/boot_id"))
        .ok()
        .map(|b| b.trim().to_string())
        .filter(|b| !b.is_empty());
    let uptime = fs::read_to_string(proc.join("uptime"))
        .ok()
        .and_then(|u| u.split_whitespace().next()?.parse::<f64>().ok());
    let (Some(boot), Some(uptime)) = (boot, uptime) else {
        return (
            Vec::new(),
            format!(
                "; counters not compared (no boot id or uptime under {})",
                proc.display()
            ),
        );
    };
    let prev = counters::load(state);
    let v = counters::judge(prev.as_ref(), &boot, uptime, &now, &spec.max_rate_per_min);
    let mut note = format!("; {} counter scopes", now.len());
    for n in &v.notes {
        note.push_str(&format!("; {n}"));
    }
    if let Err(e) = counters::save(state, &v.keep) {
        tracing::warn!("efa counters not kept: {e}");
        note.push_str(&format!("; counters not kept: {e}"));
    }
    (v.problems, note)
}

/// Runs an EFA check: the count, each port's state, the counters against the last run,
/// and (`fi_info`) libfabric's provider. Every problem is reported, in that order,
/// joined by `; `.
///
/// # Errors
/// [`Failed`]: what is wrong, in NHC's words.
pub fn check_efa(spec: &EfaSpec, facts: &Facts) -> Result<String, Failed> {
    let found = efa_devices(facts);
    let (want, why) = match spec.count {
        EfaCount::AtLeast(n) => (n, String::new()),
        EfaCount::Auto => {
            let (n, why) = match super::hw::detect_instance_type(facts) {
                Some(t) => match expected_efa(&t) {
                    Some(n) => (n, format!(" for {t}")),
                    None => (1, format!(" ({t} not in the EFA table)")),
                },
                None => (1, String::new()),
            };
            // Every EFA interface the instance has on PCI must have its device.
            let on_pci = u32::try_from(pci_efa_devices(&facts.host.sys_dir).len()).unwrap_or(0);
            if on_pci > n {
                (on_pci, format!(" (the kernel sees {on_pci} on PCI)"))
            } else {
                (n, why)
            }
        }
    };
    let mut problems = Vec::new();
    if (found.len() as u32) < want {
        problems.push(format!(
            "{} EFA devices found{}, expected at least {want}{why}",
            found.len(),
            if found.is_empty() {
                String::new()
            } else {
                format!(" ({})", found.join(", "))
            }
        ));
    }
    problems.extend(port_problems(&facts.host.sys_dir, &found));
    let (counted, counters_note) = judge_counters(spec, facts, &found);
    problems.extend(counted);
    let mut provider = String::new();
    if let Some(program) = &spec.fi_info {
        match libfabric::check_provider(program) {
            Ok(m) => provider = format!("; {m}"),
            Err(p) => problems.push(p.to_string()),
        }
    }
    if !problems.is_empty() {
        return Err(Failed::new(Checked::Efa, problems.join("; ")));
    }
    Ok(format!(
        "{} EFA devices: {}{counters_note}{provider}",
        found.len(),
        found.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::health::facts::Host;
    use std::path::PathBuf;

    /// NVSwitch instance types AWS sells whose EFA count no AWS page we could read
    /// states: each must be absent from the table (a number added for one moves it out of
    /// this list), and every other NVSwitch type must be in it.
    const NVSWITCH_NOT_YET_SOURCED: &[&str] = &["p5en.48xlarge", "p6-b200.48xlarge"];

    #[test]
    fn every_nvswitch_instance_type_aws_sells_is_in_the_table() {
        let sold = [
            "p4d.24xlarge",
            "p4de.24xlarge",
            "p5.48xlarge",
            "p5e.48xlarge",
            "p5en.48xlarge",
            "p6-b200.48xlarge",
        ];
        for t in sold {
            assert!(
                super::super::gpu::has_nvswitch(t),
                "{t} is not an NVSwitch type"
            );
            let n = expected_efa(t);
            if NVSWITCH_NOT_YET_SOURCED.contains(&t) {
                assert_eq!(
                    n, None,
                    "{t} has a number now: take it off the unsourced list"
                );
            } else {
                assert!(n.is_some_and(|n| n >= 4), "{t}: {n:?}");
            }
        }
        assert_eq!(expected_efa("p5.48xlarge"), Some(32));
        assert_eq!(expected_efa("p5e.48xlarge"), Some(32));
    }

    /// A host under `dir` with one EFA device `rdmap16s27`, port 1 ACTIVE/LinkUp, its
    /// counters at zero, boot `boot-a` at uptime 1000 s, and a state folder.
    struct Tree {
        _dir: tempfile::TempDir,
        facts_host: Host,
        dev: PathBuf,
    }

    impl Tree {
        fn new() -> Tree {
            let dir = tempfile::tempdir().unwrap();
            let sys = dir.path().join("sys");
            let proc_dir = dir.path().join("proc");
            let state_dir = dir.path().join("state");
            fs::create_dir_all(&state_dir).unwrap();
            fs::create_dir_all(proc_dir.join("sys/kernel/random")).unwrap();
            let drivers = sys.join("bus/pci/drivers/efa");
            fs::create_dir_all(&drivers).unwrap();
            let dev = sys.join("class/infiniband/rdmap16s27");
            fs::create_dir_all(dev.join("device")).unwrap();
            std::os::unix::fs::symlink(&drivers, dev.join("device/driver")).unwrap();
            fs::create_dir_all(dev.join("hw_counters")).unwrap();
            fs::create_dir_all(dev.join("ports/1/hw_counters")).unwrap();
            let t = Tree {
                _dir: dir,
                facts_host: Host {
                    sys_dir: sys,
                    proc_dir,
                    state_dir,
                    ..Host::default()
                },
                dev,
            };
            t.port("state", "4: ACTIVE");
            t.port("phys_state", "5: LinkUp");
            t.device_counter("no_completion_cmds", 0);
            t.device_counter("cmds_err", 0);
            t.device_counter("submitted_cmds", 0);
            for c in ["rx_drops", "retrans_timeout_events", "tx_bytes"] {
                t.port_counter(c, 0);
            }
            t.boot("boot-a", 1000.0);
            t
        }
        fn port(&self, file: &str, v: &str) {
            fs::write(self.dev.join("ports/1").join(file), format!("{v}\n")).unwrap();
        }
        fn device_counter(&self, name: &str, v: u64) {
            fs::write(self.dev.join("hw_counters").join(name), format!("{v}\n")).unwrap();
        }
        fn port_counter(&self, name: &str, v: u64) {
            fs::write(
                self.dev.join("ports/1/hw_counters").join(name),
                format!("{v}\n"),
            )
            .unwrap();
        }
        fn boot(&self, id: &str, uptime: f64) {
            let p = &self.facts_host.proc_dir;
            fs::write(p.join("sys/kernel/random/boot_id"), format!("{id}\n")).unwrap();
            fs::write(p.join("uptime"), format!("{uptime:.2} 12345.67\n")).unwrap();
        }
        /// One run of the check with these rate limits.
        fn run(&self, limits: &[(&str, f64)]) -> Result<String, String> {
            let spec = EfaSpec {
                count: EfaCount::AtLeast(1),
                max_rate_per_min: limits.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
                fi_info: None,
            };
            check_efa(&spec, &Facts::new(self.facts_host.clone())).map_err(|e| e.to_string())
        }
    }

    #[test]
    fn a_port_not_active_or_not_linked_up_fails_naming_device_port_and_reading() {
        let t = Tree::new();
        let ok = t.run(&[]).unwrap();
        assert!(ok.starts_with("1 EFA devices: rdmap16s27"), "{ok}");
        t.port("state", "1: DOWN");
        assert_eq!(t.run(&[]).unwrap_err(), "rdmap16s27 port 1: state 1: DOWN");
        t.port("state", "4: ACTIVE");
        t.port("phys_state", "3: Disabled");
        assert_eq!(
            t.run(&[]).unwrap_err(),
            "rdmap16s27 port 1: phys_state 3: Disabled"
        );
        // phys_state is optional; state is not.
        fs::remove_file(t.dev.join("ports/1/phys_state")).unwrap();
        t.run(&[]).unwrap();
        fs::remove_file(t.dev.join("ports/1/state")).unwrap();
        let e = t.run(&[]).unwrap_err();
        assert!(
            e.starts_with("rdmap16s27 port 1: state unreadable: "),
            "{e}"
        );
    }

    #[test]
    fn the_first_run_of_a_boot_records_and_a_never_move_counter_that_moved_fails_all_boot() {
        let t = Tree::new();
        // Moved before any reading of this boot: nothing to compare with, recorded.
        t.device_counter("no_completion_cmds", 2);
        let ok = t.run(&[]).unwrap();
        assert!(
            ok.contains("counters recorded (first run of this boot)"),
            "{ok}"
        );
        let kept = counters::load(&t.facts_host.state_dir).unwrap();
        assert_eq!(kept.boot_id, "boot-a");
        assert_eq!(kept.last["rdmap16s27"]["no_completion_cmds"], 2);
        // Not in the known counters: not kept.
        assert!(!kept.last["rdmap16s27 port 1"].contains_key("tx_bytes"));
        t.boot("boot-a", 1060.0);
        t.run(&[]).unwrap();
        t.device_counter("no_completion_cmds", 5);
        t.boot("boot-a", 1120.0);
        assert_eq!(
            t.run(&[]).unwrap_err(),
            "rdmap16s27: no_completion_cmds moved 2 -> 5 this boot (must never move)"
        );
        // Still failing at the next run, although it did not move since.
        t.boot("boot-a", 1180.0);
        assert_eq!(
            t.run(&[]).unwrap_err(),
            "rdmap16s27: no_completion_cmds moved 2 -> 5 this boot (must never move)"
        );
        // Another boot: the old reading is discarded, the first run records.
        t.boot("boot-b", 30.0);
        let ok = t.run(&[]).unwrap();
        assert!(ok.contains("first run of this boot"), "{ok}");
        t.boot("boot-b", 90.0);
        t.run(&[]).unwrap();
    }

    #[test]
    fn error_counters_fail_past_the_rate_the_site_sets() {
        let t = Tree::new();
        let limits = [("rx_drops", 100.0), ("retrans_timeout_events", 10.0)];
        t.run(&limits).unwrap();
        // 50 drops in a minute: under 100/min.
        t.port_counter("rx_drops", 50);
        t.boot("boot-a", 1060.0);
        t.run(&limits).unwrap();
        // 240 retransmit timeouts in two minutes: 120/min.
        t.port_counter("retrans_timeout_events", 240);
        t.boot("boot-a", 1180.0);
        assert_eq!(
            t.run(&limits).unwrap_err(),
            "rdmap16s27 port 1: retrans_timeout_events 120/min, more than 10/min"
        );
        // The same growth without a limit on it passes.
        t.port_counter("retrans_timeout_events", 480);
        t.boot("boot-a", 1300.0);
        t.run(&[("rx_drops", 100.0)]).unwrap();
        // Two runs a second apart: 5 drops count as 5/min, not 300/min.
        t.port_counter("rx_drops", 55);
        t.boot("boot-a", 1301.0);
        t.run(&[("rx_drops", 10.0)]).unwrap();
        t.port_counter("rx_drops", 70);
        t.boot("boot-a", 1302.0);
        assert_eq!(
            t.run(&[("rx_drops", 10.0)]).unwrap_err(),
            "rdmap16s27 port 1: rx_drops 15/min, more than 10/min"
        );
    }

    #[test]
    fn counters_that_went_down_reset_the_baseline() {
        let t = Tree::new();
        t.device_counter("no_completion_cmds", 3);
        t.port_counter("rx_drops", 1000);
        t.run(&[("rx_drops", 1.0)]).unwrap();
        // The driver was reloaded: every counter from zero, then one drop.
        t.device_counter("no_completion_cmds", 0);
        t.port_counter("rx_drops", 1);
        t.boot("boot-a", 1060.0);
        let ok = t.run(&[("rx_drops", 1.0)]).unwrap();
        assert!(
            ok.contains("rdmap16s27: counters went down (driver reloaded?), baseline reset"),
            "{ok}"
        );
        assert!(ok.contains("rdmap16s27 port 1: counters went down"), "{ok}");
        // The new baseline is 0: a move from it fails.
        t.device_counter("no_completion_cmds", 1);
        t.boot("boot-a", 1120.0);
        assert_eq!(
            t.run(&[]).unwrap_err(),
            "rdmap16s27: no_completion_cmds moved 0 -> 1 this boot (must never move)"
        );
    }

    #[test]
    fn a_corrupt_or_truncated_state_file_is_set_aside_and_the_next_run_compares_again() {
        let t = Tree::new();
        t.run(&[]).unwrap();
        let path = counters::state_path(&t.facts_host.state_dir);
        let whole = fs::read(&path).unwrap();
        let set_aside = || -> Vec<Vec<u8>> {
            let mut names: Vec<PathBuf> = fs::read_dir(&t.facts_host.state_dir)
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| {
                    p.file_name()
                        .unwrap()
                        .to_string_lossy()
                        .starts_with("efa-counters.json.corrupt-")
                })
                .collect();
            names.sort();
            names.iter().map(|p| fs::read(p).unwrap()).collect()
        };
        let mut uptime = 1000.0;
        let mut moved = 0;
        for (n, bad) in [&whole[..whole.len() / 2], b"".as_slice()]
            .into_iter()
            .enumerate()
        {
            fs::write(&path, bad).unwrap();
            // A move while the reading was lost goes unseen, as before a boot's first run.
            moved += 1;
            t.device_counter("no_completion_cmds", moved);
            uptime += 60.0;
            t.boot("boot-a", uptime);
            let ok = t.run(&[]).unwrap();
            assert!(
                ok.contains("counters recorded (first run of this boot)"),
                "{ok}"
            );
            // Kept aside, not lost; a good reading in its place.
            let aside = set_aside();
            assert_eq!(aside.len(), n + 1);
            assert!(aside.contains(&bad.to_vec()));
            let kept = counters::load(&t.facts_host.state_dir).unwrap();
            assert_eq!(kept.last["rdmap16s27"]["no_completion_cmds"], moved);
            // The next run compares again: no move passes, a move fails.
            uptime += 60.0;
            t.boot("boot-a", uptime);
            t.run(&[]).unwrap();
            t.device_counter("no_completion_cmds", moved + 1);
            uptime += 60.0;
            t.boot("boot-a", uptime);
            assert_eq!(
                t.run(&[]).unwrap_err(),
                format!(
                    "rdmap16s27: no_completion_cmds moved {moved} -> {} this boot (must never move)",
                    moved + 1
                )
            );
            moved += 1;
        }
    }

    #[test]
    fn without_a_state_folder_counters_are_not_compared() {
        let mut t = Tree::new();
        t.facts_host.state_dir = t.facts_host.state_dir.join("missing");
        t.device_counter("no_completion_cmds", 9);
        let ok = t.run(&[]).unwrap();
        assert!(
            ok.contains("counters not compared (no state folder "),
            "{ok}"
        );
        assert!(!t.facts_host.state_dir.exists());
    }

    /// `fi_info -p efa` on a p4d.24xlarge, as the EC2 User Guide shows it ("Get started
    /// with EFA and MPI", step "Verify that the EFA software components were successfully
    /// installed"), first two of its four devices.
    const FI_INFO_P4D: &str = "provider: efa
    fabric: EFA-fe80::c6e:8fff:fef6:e7ff
    domain: efa_0-rdm
    version: 111.0
    type: FI_EP_RDM
    protocol: FI_PROTO_EFA
provider: efa
    fabric: EFA-fe80::c34:3eff:feb2:3c35
    domain: efa_1-rdm
    version: 111.0
    type: FI_EP_RDM
    protocol: FI_PROTO_EFA
provider: efa;ofi_rxd
    fabric: EFA-fe80::c34:3eff:feb2:3c35
    domain: efa_1-dgrm
    version: 1.0
    type: FI_EP_RDM
    protocol: FI_PROTO_RXD
";

    #[test]
    fn fi_info_output_names_the_efa_provider_and_its_domains() {
        assert_eq!(
            libfabric::efa_domains(FI_INFO_P4D),
            Some(vec!["efa_0-rdm".to_string(), "efa_1-rdm".to_string()])
        );
        let tcp_only = "provider: tcp\n    fabric: 10.0.0.0/16\n    domain: eth0\n";
        assert_eq!(libfabric::efa_domains(tcp_only), None);
    }

    /// A stand-in `fi_info` in `dir` running `body` (sh), written without this process
    /// holding it open for writing (ETXTBSY: [`crate::fsutil::write_test_program`]).
    fn script(dir: &Path, name: &str, body: &str) -> String {
        let p = dir.join(name);
        crate::fsutil::write_test_program(&p, &format!("#!/bin/sh\n{body}\n"));
        p.display().to_string()
    }

    #[test]
    fn libfabric_must_find_its_efa_provider() {
        let t = Tree::new();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.txt");
        fs::write(&out, FI_INFO_P4D).unwrap();
        let run = |program: String| {
            let spec = EfaSpec {
                count: EfaCount::AtLeast(1),
                fi_info: Some(program),
                ..EfaSpec::default()
            };
            check_efa(&spec, &Facts::new(t.facts_host.clone())).map_err(|e| e.to_string())
        };
        // It is asked `-p efa`, with no shell between.
        let good = script(
            dir.path(),
            "fi_info",
            &format!(
                "[ \"$1 $2\" = \"-p efa\" ] || exit 9\ncat {}",
                out.display()
            ),
        );
        let ok = run(good).unwrap();
        assert!(
            ok.ends_with("; libfabric's efa provider: efa_0-rdm, efa_1-rdm"),
            "{ok}"
        );
        let none = script(dir.path(), "fi_info_tcp", "echo 'provider: tcp'");
        let e = run(none.clone()).unwrap_err();
        assert_eq!(
            e,
            format!("{none} -p efa: no \"provider: efa\" in its output")
        );
        let fails = script(
            dir.path(),
            "fi_info_fails",
            "echo 'fi_getinfo: -61 (No data available)' >&2\nexit 1",
        );
        let e = run(fails.clone()).unwrap_err();
        assert_eq!(
            e,
            format!("{fails} -p efa: exited with 1 (fi_getinfo: -61 (No data available))")
        );
        let missing = dir.path().join("absent").display().to_string();
        let e = run(missing.clone()).unwrap_err();
        assert!(
            e.starts_with(&format!("{missing} -p efa: starting {missing}: ")),
            "{e}"
        );
    }

    #[test]
    fn counts_devices_bound_to_the_efa_driver() {
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path().join("sys");
        let drivers = sys.join("bus/pci/drivers");
        fs::create_dir_all(drivers.join("efa")).unwrap();
        fs::create_dir_all(drivers.join("mlx5_core")).unwrap();
        for (dev, drv) in [
            ("rdmap0s6", "efa"),
            ("rdmap0s7", "efa"),
            ("mlx5_0", "mlx5_core"),
        ] {
            let d = sys.join("class/infiniband").join(dev).join("device");
            fs::create_dir_all(&d).unwrap();
            std::os::unix::fs::symlink(drivers.join(drv), d.join("driver")).unwrap();
        }
        fs::create_dir_all(sys.join("devices/virtual/dmi/id")).unwrap();
        fs::write(
            sys.join("devices/virtual/dmi/id/product_name"),
            "p4d.24xlarge\n",
        )
        .unwrap();
        let f = Facts::new(Host {
            sys_dir: sys.clone(),
            ..Host::default()
        });
        // The error of `count = "auto"` on `f`.
        let auto_error = |f: &Facts| {
            check_efa(
                &EfaSpec {
                    count: EfaCount::Auto,
                    ..EfaSpec::default()
                },
                f,
            )
            .unwrap_err()
            .to_string()
        };
        assert_eq!(efa_devices(&f), vec!["rdmap0s6", "rdmap0s7"]);
        check_efa(
            &EfaSpec {
                count: EfaCount::AtLeast(2),
                ..EfaSpec::default()
            },
            &f,
        )
        .unwrap();
        let e = auto_error(&f);
        assert!(e.contains("expected at least 4 for p4d.24xlarge"), "{e}");
        // Three EFA functions on PCI (one an ENA, not counted): two bound, so `auto`
        // wants three whatever the table says of an unknown type.
        fs::write(
            sys.join("devices/virtual/dmi/id/product_name"),
            "p9x.48xlarge\n",
        )
        .unwrap();
        for (addr, device) in [
            ("0000:10:1c.0", "0xefa1"),
            ("0000:10:1d.0", "0xefa1"),
            ("0000:10:1e.0", "0xEFA2"),
            ("0000:10:1f.0", "0xec20"),
        ] {
            let d = sys.join("bus/pci/devices").join(addr);
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("vendor"), "0x1d0f\n").unwrap();
            fs::write(d.join("device"), format!("{device}\n")).unwrap();
        }
        assert_eq!(
            pci_efa_devices(&f.host.sys_dir),
            vec!["0000:10:1c.0", "0000:10:1d.0", "0000:10:1e.0"]
        );
        let f = Facts::new(f.host.clone());
        let e = auto_error(&f);
        assert!(
            e.contains("2 EFA devices found (rdmap0s6, rdmap0s7), expected at least 3 (the kernel sees 3 on PCI)"),
            "{e}"
        );
    }
}
