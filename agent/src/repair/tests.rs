#![allow(clippy::unwrap_used)]

use super::*;

fn report() -> RepairSettings {
    RepairSettings {
        mode: RepairMode::Report,
        ..RepairSettings::default()
    }
}

fn check(name: &str, action: RepairAction) -> CheckAction {
    CheckAction {
        check: name.into(),
        action,
    }
}

fn failure<'a>(check: &'a str, family: &'a str, message: &'a str) -> Failure<'a> {
    Failure {
        check,
        family,
        message,
        timed_out: false,
    }
}

#[test]
fn the_gpu_checks_words_classify_as_their_faults() {
    // The messages of health::checks::gpu, as it writes them.
    for (message, fault) in [
        ("XID 79 on PCI:0000:00:1e (1x since boot)", Fault::GpuLost),
        (
            "the kernel sees 8 NVIDIA GPUs on PCI, NVML 7: not in NVML: 0000:53:00.0",
            Fault::GpuLost,
        ),
        ("found 7 GPUs, expected 8", Fault::GpuLost),
        ("GPU 3: 70 retired pages (max 64)", Fault::GpuMemoryDegraded),
        (
            "GPU 3: 600 uncorrectable remapped rows (max 512)",
            Fault::GpuMemoryDegraded,
        ),
        ("GPU 3: row remapping failed", Fault::GpuMemoryDegraded),
        (
            "GPU 3: 2 uncorrected ECC errors (max 0)",
            Fault::GpuResettable,
        ),
        (
            "XID 94 on PCI:0000:00:1e (1x since boot)",
            Fault::GpuResettable,
        ),
        ("GPU 0: NVLink 4 inactive", Fault::GpuResettable),
        (
            "NVML initialisation failed: driver not loaded",
            Fault::GpuResettable,
        ),
        ("GPU 1: temperature 93 °C (max 90)", Fault::GpuThermal),
        (
            "GPU 1: hardware slowdown active (HW Thermal Slowdown)",
            Fault::GpuThermal,
        ),
    ] {
        assert_eq!(Fault::classify("gpu", message, false), fault, "{message}");
    }
    // Several problems: the one whose action is strongest.
    let both = "GPU 1: temperature 93 °C (max 90); XID 94 on PCI:0000:00:1e (1x since boot); XID 79 on PCI:0000:00:1f (1x since boot)";
    assert_eq!(Fault::classify("gpu", both, false), Fault::GpuLost);
    // "XID 790" is not Xid 79.
    assert_eq!(
        Fault::classify("gpu", "XID 790 on x (1x since boot)", false),
        Fault::GpuResettable
    );
}

#[test]
fn the_start_up_gates_failures_are_classified_by_dcgms_category() {
    let diag = |test: &str, id: u32, category: &str| {
        format!("/usr/bin/dcgmi diag -r 2 -j: {test} failed on GPU 3: words (DCGM error {id}, category {category})")
    };
    for (message, fault, action) in [
        (
            diag("memory", 52, "hardware memory"),
            Fault::GpuMemoryDegraded,
            Planned::Replace,
        ),
        (
            diag("pcie", 60, "hardware PCIe"),
            Fault::GpuDiagnostic,
            Planned::Replace,
        ),
        (
            diag("nvbandwidth", 1, "performance threshold"),
            Fault::GpuDiagnostic,
            Planned::Replace,
        ),
        (
            diag("targeted_power", 9, "hardware thermal"),
            Fault::GpuThermal,
            Planned::Isolate,
        ),
        (
            diag("software", 3, "software configuration"),
            Fault::Other,
            Planned::Isolate,
        ),
        (
            "DCGM host engine: nvidia-dcgm.service not active within 30s (failed); x".to_string(),
            Fault::Other,
            Planned::Isolate,
        ),
        (
            "/opt/site/nccl-test exited 1: bus bandwidth 12 GB/s".to_string(),
            Fault::Other,
            Planned::Isolate,
        ),
    ] {
        let f = Fault::classify("gate", &message, false);
        assert_eq!((f, f.auto()), (fault, action), "{message}");
    }
    // Several tests failed: the strongest action's fault.
    let both = format!(
        "{}; {}",
        diag("targeted_power", 9, "hardware thermal"),
        diag("pcie", 60, "hardware NVLink").replace("/usr/bin/dcgmi diag -r 2 -j: ", "")
    );
    assert_eq!(Fault::classify("gate", &both, false), Fault::GpuDiagnostic);
}

#[test]
fn efa_ports_counters_and_gpu_fabric_state_have_their_faults() {
    for (family, message, fault) in [
        ("efa", "rdmap16s27 port 1: state 1: DOWN", Fault::EfaPort),
        ("efa", "rdmap16s27 port 1: phys_state 3: Disabled", Fault::EfaPort),
        ("efa", "rdmap16s27: no_completion_cmds moved 0 -> 3 this boot (must never move)", Fault::EfaMissing),
        ("efa", "rdmap16s27 port 1: retrans_timeout_events 120/min, more than 10/min", Fault::Other),
        ("efa", "/opt/amazon/efa/bin/fi_info -p efa: exited with 1 (fi_getinfo: -61)", Fault::Other),
        ("efa", "3 EFA devices found, expected at least 4 for p4d.24xlarge", Fault::EfaMissing),
        // A port down beside an error rate: the reboot counts.
        ("efa", "rdmap16s27 port 1: rx_drops 500/min, more than 100/min; rdmap16s27 port 1: state 1: DOWN", Fault::EfaPort),
        ("gpu", "GPU 3 (00000000:9A:00.0): fabric state In Progress, status N/A (Fabric Manager has not finished)", Fault::GpuResettable),
        ("gpu", "GPU 1 (00000000:1B:00.0): fabric health Unhealthy (Bandwidth Degraded)", Fault::GpuDiagnostic),
        ("gpu", "GPU 0 (00000000:1B:00.0): nvidia-smi -q shows no Fabric section (a driver older than R530 reports no fabric state)", Fault::Other),
    ] {
        assert_eq!(Fault::classify(family, message, false), fault, "{message}");
    }
    assert_eq!(Fault::EfaPort.auto(), Planned::Reboot);
}

#[test]
fn each_family_has_its_fault_and_the_auto_table_its_action() {
    for (family, fault, action) in [
        ("efa", Fault::EfaMissing, Planned::Replace),
        ("hardware", Fault::HardwareDegraded, Planned::Replace),
        ("mcelog", Fault::HardwareDegraded, Planned::Replace),
        ("mount", Fault::FileSystem, Planned::Isolate),
        ("space", Fault::FileSystem, Planned::Isolate),
        ("config", Fault::CheckConfig, Planned::None),
        ("process", Fault::Other, Planned::Isolate),
        ("unit", Fault::Other, Planned::Isolate),
        ("file", Fault::Other, Planned::Isolate),
    ] {
        let f = Fault::classify(family, "x", false);
        assert_eq!(f, fault, "{family}");
        assert_eq!(f.auto(), action, "{family}");
    }
    // Every fault has exactly one row.
    for f in Fault::ALL {
        assert_eq!(AUTO.iter().filter(|r| r.fault == f).count(), 1, "{f:?}");
    }
    assert_eq!(AUTO.len(), Fault::ALL.len());
}

#[test]
fn off_plans_nothing_and_the_strongest_action_of_the_failures_wins() {
    let gpu = failure("GPUs", "gpu", "XID 79 on PCI:0000:00:1e (1x since boot)");
    let fs = failure("shared file systems", "mount", "/fsx is not mounted");
    assert_eq!(RepairSettings::default().plan(&[gpu, fs]), None);
    let s = report();
    assert_eq!(s.plan(&[]), None);
    let p = s.plan(&[fs, gpu]).unwrap();
    assert_eq!(
        p,
        Plan {
            action: Planned::Replace,
            fault: Fault::GpuLost,
            check: "GPUs".into(),
            by: PlannedBy::Auto,
            withheld: None,
        }
    );
    // Equal actions: the first failure in file order.
    let fs2 = failure("scratch", "mount", "/scratch is not mounted");
    assert_eq!(s.plan(&[fs, fs2]).unwrap().check, "shared file systems");
}

#[test]
fn a_site_overrides_the_action_per_check_and_for_every_fault() {
    let gpu = failure("GPUs", "gpu", "XID 79 on PCI:0000:00:1e (1x since boot)");
    let fs = failure("shared file systems", "mount", "/fsx is not mounted");
    let mut s = report();
    s.checks = vec![
        check("GPUs", RepairAction::Isolate),
        check("shared file systems", RepairAction::Reboot),
    ];
    let p = s.plan(&[gpu, fs]).unwrap();
    assert_eq!(
        (p.action, p.check.as_str()),
        (Planned::Reboot, "shared file systems")
    );
    assert_eq!(p.by, PlannedBy::Check("shared file systems".into()));
    assert_eq!(
        p.by.to_string(),
        "[[repair.checks]] check = \"shared file systems\""
    );
    // repair.action for every check the table does not name.
    let mut s = report();
    s.action = RepairAction::None;
    let p = s.plan(&[gpu]).unwrap();
    assert_eq!((p.action, p.by), (Planned::None, PlannedBy::Action));
}

#[test]
fn bad_settings_are_refused_naming_the_key() {
    for (text, key) in [
        ("mode = \"on-please\"", "mode"),
        ("action = \"terminate\"", "action"),
        (
            "[[checks]]\ncheck = \"GPUs\"\naction = \"recycle\"",
            "recycle",
        ),
    ] {
        let e = toml::from_str::<RepairSettings>(text)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown variant"), "{text}: {e}");
        assert!(
            e.contains(key) || e.contains("expected one of"),
            "{text}: {e}"
        );
    }
    let mut s = RepairSettings::default();
    s.checks = vec![
        check("GPUs", RepairAction::Replace),
        check(" ", RepairAction::Replace),
    ];
    let e = s.validate().unwrap_err();
    assert_eq!(e.key, "repair.checks[1].check");
    s.checks = vec![
        check("GPUs", RepairAction::Replace),
        check("GPUs", RepairAction::Isolate),
    ];
    let e = s.validate().unwrap_err();
    assert_eq!(e.key, "repair.checks[1].check");
    assert!(e.message.contains("repair.checks[0]"), "{}", e.message);
    // A check override naming no check: warned about, not refused.
    let mut s = RepairSettings::default();
    s.checks = vec![
        check("GPU", RepairAction::Replace),
        check("EFA", RepairAction::Replace),
    ];
    assert!(s.validate().is_ok());
    assert_eq!(s.unknown_checks(&["GPUs".into(), "EFA".into()]), ["GPU"]);
    // An nhc.conf line is known by its function too.
    let mut s = RepairSettings::default();
    s.checks = vec![check("check_fs_mount_rw", RepairAction::Reboot)];
    assert!(s
        .unknown_checks(&["check_fs_mount_rw -f /fsx".into()])
        .is_empty());
    let s = RepairSettings {
        mode: RepairMode::Report,
        ..s
    };
    let p = s
        .plan(&[failure(
            "check_fs_mount_rw -f /fsx",
            "mount",
            "/fsx not mounted",
        )])
        .unwrap();
    assert_eq!(p.action, Planned::Reboot);
    assert_eq!(p.by, PlannedBy::Check("check_fs_mount_rw".into()));
}

#[test]
fn the_docs_carry_the_auto_table() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/repair.md")).unwrap();
    let table = auto_table_markdown();
    assert!(
        doc.contains(&table),
        "docs/repair.md does not carry the auto table as the code has it; put this in:\n{table}"
    );
}

#[test]
fn the_record_counts_each_new_plan_once_and_clears_when_healthy() {
    use record::{Change, Record};
    let s = report();
    let gpu = failure("GPUs", "gpu", "XID 79 on PCI:0000:00:1e (1x since boot)");
    let fs = failure("shared file systems", "mount", "/fsx is not mounted");
    let p_gpu = s.plan(&[gpu]).unwrap();
    let p_fs = s.plan(&[fs]).unwrap();
    let mut r = Record::default();
    assert_eq!(r.observe(RepairMode::Report, None, 1), Change::Same);
    assert_eq!(
        r.observe(RepairMode::Report, Some((&p_gpu, gpu.message)), 2),
        Change::Planned
    );
    assert_eq!(
        r.observe(RepairMode::Report, Some((&p_gpu, gpu.message)), 3),
        Change::Same
    );
    assert_eq!(r.current.as_ref().unwrap().since, 2);
    assert_eq!(
        r.observe(RepairMode::Report, Some((&p_fs, fs.message)), 4),
        Change::Planned
    );
    assert_eq!(r.observe(RepairMode::Report, None, 5), Change::Cleared);
    assert_eq!(
        r.observe(RepairMode::Report, Some((&p_gpu, gpu.message)), 6),
        Change::Planned
    );
    assert_eq!(r.planned["report/replace/gpu_lost"], 2);
    assert_eq!(r.planned["report/isolate/file_system"], 1);
    let prom = r.render();
    assert!(
        prom.contains("slurm_node_agent_repair_planned_total{mode=\"report\",action=\"replace\",fault=\"gpu_lost\"} 2\n"),
        "{prom}"
    );
    assert!(
        prom.contains("slurm_node_agent_repair_pending{mode=\"report\",action=\"replace\",fault=\"gpu_lost\"} 1\n"),
        "{prom}"
    );
    // Every sample line has its TYPE line before it.
    for line in prom.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split('{').next().unwrap();
        assert!(prom.contains(&format!("# TYPE {name} ")), "{line}");
    }
}

#[test]
fn the_record_survives_a_restart_and_a_corrupt_one_is_set_aside() {
    use record::{record_path, Record};
    let dir = tempfile::tempdir().unwrap();
    let path = record_path(dir.path());
    assert_eq!(Record::load(&path), Record::default());
    let s = report();
    let gpu = failure("GPUs", "gpu", "XID 79 on PCI:0000:00:1e (1x since boot)");
    let mut r = Record::default();
    r.observe(
        RepairMode::Report,
        Some((&s.plan(&[gpu]).unwrap(), gpu.message)),
        7,
    );
    r.save(&path).unwrap();
    assert_eq!(Record::load(&path), r);
    assert_eq!(Record::peek(&path), Some(r));
    std::fs::write(&path, b"{\"planned\": {\"report/replace/gpu_lost\": ").unwrap();
    // `status` reads it as nothing and leaves it for the daemon to set aside.
    assert_eq!(Record::peek(&path), None);
    assert!(path.exists());
    assert_eq!(Record::load(&path), Record::default());
    assert!(!path.exists());
    let aside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        aside.iter().any(|n| n.starts_with("repair.json.corrupt-")),
        "{aside:?}"
    );
}

fn seen<'a>(name: &'a str, partitions: &'a str, held_reason: Option<&'a str>) -> breaker::Seen<'a> {
    breaker::Seen {
        name,
        partitions,
        held_reason,
        present: true,
    }
}

/// The health checks' drain reason with `detail` (`<check>: <message>`).
fn health_reason(detail: &str) -> String {
    crate::reason::reason(
        crate::reason::ReasonCause::Health,
        "i-0123456789abcdef0",
        detail,
    )
}

#[test]
fn the_breaker_counts_the_nodes_of_each_partition_failing_the_same_check() {
    use breaker::tripped;
    let gpus = health_reason("GPUs: XID 79 on PCI:0000:00:1e (1x since boot)");
    let other = health_reason("EFA: 0 EFA devices found, expected at least 1");
    let mount = crate::reason::reason(
        crate::reason::ReasonCause::Mount,
        "i-0123456789abcdef0",
        "GPUs: not a health drain",
    );
    // 10 nodes in `gpu`: n0 (this one) and n1 fail GPUs; n2 fails EFA, n3 is drained by
    // an admin with the same words, n4 by the mounts.
    let mut fleet = vec![
        seen("n0", "gpu", None),
        seen("n1", "gpu,all", Some(&gpus)),
        seen("n2", "gpu", Some(&other)),
        seen("n3", "gpu", Some("GPUs: XID 79")),
        seen("n4", "gpu", Some(&mount)),
    ];
    let names: Vec<String> = (5..10).map(|i| format!("n{i}")).collect();
    fleet.extend(names.iter().map(|n| seen(n, "gpu", None)));
    // 2 of 10: more than 10 %, at least 2.
    let t = tripped("GPUs", "n0", "gpu", &fleet, 0.1, 2).unwrap();
    assert_eq!((t.partition.as_str(), t.failing, t.nodes), ("gpu", 2, 10));
    assert_eq!(t.to_string(), "2 of 10 nodes of partition gpu fail it");
    // Exactly the share is not more than it; fewer than the count is not enough.
    assert_eq!(tripped("GPUs", "n0", "gpu", &fleet, 0.2, 2), None);
    assert_eq!(tripped("GPUs", "n0", "gpu", &fleet, 0.1, 3), None);
    // A partition of this node with a higher share wins: `all` has n1 only besides it.
    let t = tripped("GPUs", "n0", "gpu,all", &fleet, 0.1, 2).unwrap();
    assert_eq!((t.partition.as_str(), t.failing, t.nodes), ("all", 2, 2));
    // This node counts as failing even where slurmctld has no record of it yet.
    let t = tripped("GPUs", "n99", "gpu", &fleet, 0.1, 2).unwrap();
    assert_eq!((t.failing, t.nodes), (2, 11));
    // A node in no partition trips nothing.
    assert_eq!(tripped("GPUs", "n0", "", &fleet, 0.1, 1), None);
    // The check's name as the reason writes it: whitespace as one space.
    assert!(breaker::names_check(&gpus, "GPUs"));
    assert!(!breaker::names_check(&gpus, "GPU"));
    let spaced = health_reason("shared file systems: /fsx");
    assert!(breaker::names_check(&spaced, "shared  file\tsystems"));
}

#[test]
fn a_withheld_plan_isolates_and_says_why() {
    let s = report();
    let gpu = failure("GPUs", "gpu", "XID 79 on PCI:0000:00:1e (1x since boot)");
    let p = s.plan(&[gpu]).unwrap();
    assert!(p.departs());
    let key = p.key();
    let w = p.withhold("the breaker holds".into());
    assert_eq!(w.action, Planned::Isolate);
    assert_eq!(w.withheld.as_ref().unwrap().action, Planned::Replace);
    assert_ne!(w.key(), key);
    // An isolate plan has nothing to withhold.
    let fs = failure("shared file systems", "mount", "/fsx is not mounted");
    let p = s.plan(&[fs]).unwrap();
    assert!(!p.departs());
    assert_eq!(p.clone().withhold("x".into()), p);
}

#[test]
fn the_breakers_settings_are_checked() {
    for (share, min, key) in [
        (0.0, 2, "repair.breaker_share"),
        (1.5, 2, "repair.breaker_share"),
        (f64::NAN, 2, "repair.breaker_share"),
        (-0.1, 2, "repair.breaker_share"),
        (0.1, 0, "repair.breaker_min_nodes"),
    ] {
        let s = RepairSettings {
            breaker_share: share,
            breaker_min_nodes: min,
            ..RepairSettings::default()
        };
        assert_eq!(s.validate().unwrap_err().key, key, "{share} {min}");
    }
    let s = RepairSettings {
        breaker_share: 1.0,
        breaker_min_nodes: 1,
        ..RepairSettings::default()
    };
    assert!(s.validate().is_ok());
}

#[test]
fn words_that_tell_nothing_of_the_gpu_are_no_gpu_fault() {
    for (message, timed_out, fault) in [
        // NVML's own words for a lost GPU (nvml-wrapper's NvmlError::GpuLost).
        (
            "GPU 3: the GPU has fallen off the bus or has otherwise become inaccessible",
            false,
            Fault::GpuLost,
        ),
        (
            "GPU 3: device fell off the bus or has otherwise become inacessible",
            false,
            Fault::GpuLost,
        ),
        ("XID errors unknown: /dev/kmsg: permission denied", false, Fault::Other),
        ("found 9 GPUs, expected 8", false, Fault::Other),
        (
            "NVIDIA Fabric Manager 550.90.07 does not match the NVIDIA driver 550.54.15: install and hold both at one version",
            false,
            Fault::Other,
        ),
        ("XID 79 on PCI:0000:00:1e (1x since boot)", true, Fault::Other),
    ] {
        assert_eq!(Fault::classify("gpu", message, timed_out), fault, "{message}");
    }
    assert_eq!(
        Fault::classify("efa", "hung: no answer in 30s", true),
        Fault::Other
    );
}

#[test]
fn the_breaker_counts_present_nodes_in_basis_points() {
    use breaker::tripped;
    let gpus = health_reason("GPUs: XID 79");
    let names: Vec<String> = (0..100).map(|i| format!("n{i}")).collect();
    let fleet = |failing: usize| -> Vec<breaker::Seen<'_>> {
        names
            .iter()
            .enumerate()
            .map(|(i, n)| seen(n, "p", (i > 0 && i < failing).then_some(gpus.as_str())))
            .collect()
    };
    // 29 of 100 is not more than 0.29; 30 is.
    assert_eq!(tripped("GPUs", "n0", "p", &fleet(29), 0.29, 2), None);
    assert!(tripped("GPUs", "n0", "p", &fleet(30), 0.29, 2).is_some());
    // 1 never trips.
    assert_eq!(tripped("GPUs", "n0", "p", &fleet(100), 1.0, 1), None);
    // Powered-down slots of power saving and FUTURE nodes do not count: 2 of 4 present.
    let mut f: Vec<breaker::Seen<'_>> = fleet(2).into_iter().take(4).collect();
    assert_eq!(tripped("GPUs", "n0", "p", &f, 0.5, 2), None);
    for n in names.iter().skip(4).take(60) {
        f.push(breaker::Seen {
            present: false,
            ..seen(n, "p", None)
        });
    }
    let t = tripped("GPUs", "n0", "p", &f, 0.4, 2).unwrap();
    assert_eq!((t.failing, t.nodes), (2, 4));
}

#[test]
fn a_plan_seen_again_keeps_its_count_and_takes_the_new_words() {
    use record::{Change, Record};
    let s = report();
    let gpu = failure("GPUs", "gpu", "XID 79 on PCI:0000:00:1e (1x since boot)");
    let p = s.plan(&[gpu]).unwrap();
    let mut r = Record::default();
    let w1 = p
        .clone()
        .withhold("the breaker holds for GPUs: 2 of 10".into());
    let w2 = p.withhold("the breaker holds for GPUs: 3 of 10".into());
    assert_eq!(w1.key(), w2.key());
    assert_eq!(
        r.observe(RepairMode::Report, Some((&w1, "a")), 1),
        Change::Planned
    );
    assert_eq!(
        r.observe(RepairMode::Report, Some((&w2, "b")), 2),
        Change::Same
    );
    let c = r.current.as_ref().unwrap();
    assert_eq!((c.since, c.message.as_str()), (1, "b"));
    assert!(c.plan.withheld.as_ref().unwrap().why.ends_with("3 of 10"));
    assert_eq!(r.planned["report/isolate/gpu_lost"], 1);
    // A key of a hand-edited file that is not the agent's words stays out of the metrics.
    r.planned.insert("report/replace/x\"} 1\nevil".into(), 5);
    assert!(!r.render().contains("evil"));
}

#[test]
fn a_check_files_name_is_matched_whole_and_an_nhc_line_by_its_function() {
    let mut s = report();
    s.checks = vec![check("shared", RepairAction::Replace)];
    let fs = failure("shared file systems", "mount", "/fsx is not mounted");
    assert_eq!(s.plan(&[fs]).unwrap().by, PlannedBy::Auto);
    assert_eq!(
        s.unknown_checks(&["shared file systems".into()]),
        ["shared"]
    );
    let nhc = failure("check_fs_mount_rw -f /fsx", "mount", "/fsx is not mounted");
    s.checks = vec![check("check_fs_mount_rw", RepairAction::Replace)];
    assert_eq!(s.plan(&[nhc]).unwrap().action, Planned::Replace);
    // The words an operator reads.
    let p = s.plan(&[nhc]).unwrap();
    assert_eq!(
        describe(&p, "compute-1", RepairMode::Report),
        "would replace compute-1 for check_fs_mount_rw -f /fsx: file_system ([[repair.checks]] check = \"check_fs_mount_rw\")"
    );
    s.checks = vec![check("check_fs_mount_rw", RepairAction::None)];
    assert!(
        describe(&s.plan(&[nhc]).unwrap(), "compute-1", RepairMode::Report)
            .starts_with("would leave compute-1 as it is for ")
    );
}

#[test]
fn the_reason_says_what_will_happen_and_the_plan_always_shows() {
    let id = "i-0123456789abcdef0";
    let r = reason(
        id,
        "GPUs: XID 79 on PCI:0000:00:1e",
        Stage::AfterJobs(Planned::Replace),
    );
    assert_eq!(
        r,
        "slurm-node-agent/repair@i-0123456789abcdef0: GPUs: XID 79 on PCI:0000:00:1e [replace after jobs]"
    );
    let p = parse_reason(&format!("{r} : reboot issued")).unwrap();
    assert_eq!(
        (p.instance_id.as_str(), p.detail.as_str(), p.stage.as_str()),
        (id, "GPUs: XID 79 on PCI:0000:00:1e", "replace after jobs")
    );
    assert!(!p.powered_off());
    // A long detail is cut; the stage stays, within Slurm's 256 characters.
    let long = "x".repeat(400);
    for stage in [
        Stage::AfterJobs(Planned::Reboot),
        Stage::Rebooting,
        Stage::PoweredOff(1_796_605_600),
    ] {
        let r = reason(id, &long, stage);
        assert_eq!(r.chars().count(), 256, "{r}");
        assert!(r.ends_with(&format!(" [{}]", stage.words())), "{r}");
        assert!(crate::slurm::node::validate_reason(&r).is_ok());
        assert_eq!(
            parse_reason(&r).unwrap().powered_off(),
            stage == Stage::PoweredOff(1_796_605_600)
        );
    }
    let off = reason(id, "GPUs: x", Stage::PoweredOff(1_796_605_600));
    assert!(
        off.ends_with(" [powered off for replacement at 2026-12-07T01:06:40Z]"),
        "{off}"
    );
    assert_eq!(
        parse_reason(&off).unwrap().powered_off_at(),
        Some(1_796_605_600)
    );
    // Not a repair's: another cause, an admin's words, no stage.
    assert!(parse_reason("slurm-node-agent/health@i-0123456789abcdef0: GPUs: x [y]").is_none());
    assert!(parse_reason("GPUs bad [replace after jobs]").is_none());
    assert!(parse_reason("slurm-node-agent/repair@i-0123456789abcdef0: GPUs").is_none());
}

#[test]
fn on_is_a_mode_and_replace_within_boots_is_at_least_one() {
    let s: RepairSettings = toml::from_str("mode = \"on\"\nreplace_within_boots = 2").unwrap();
    assert_eq!((s.mode, s.replace_within_boots), (RepairMode::On, 2));
    assert_eq!(s.mode.as_str(), "on");
    for n in [0, 16] {
        let s = RepairSettings {
            replace_within_boots: n,
            ..RepairSettings::default()
        };
        let e = s.validate().unwrap_err();
        assert_eq!(e.key, "repair.replace_within_boots", "{n}");
    }
    let s = RepairSettings {
        replace_within_boots: 15,
        ..RepairSettings::default()
    };
    assert!(s.validate().is_ok());
}

/// A reboot for a check whose fault comes back within `replace_within_boots` boots of a
/// repair's reboot for it becomes a replacement; in the boot the reboot was planned in, a
/// boot past the limit, or for another check, it stays a reboot.
#[test]
fn a_fault_back_within_the_boots_after_a_reboot_calls_for_a_replacement() {
    let s = RepairSettings {
        mode: RepairMode::On,
        replace_within_boots: 2,
        ..RepairSettings::default()
    };
    let reboot = |check: &str| Plan {
        action: Planned::Reboot,
        fault: Fault::GpuResettable,
        check: check.into(),
        by: PlannedBy::Auto,
        withheld: None,
    };
    let mut r = record::Record::default();
    assert!(r.saw_boot("boot-1"));
    assert!(!r.saw_boot("boot-1"), "the same boot counts once");
    assert_eq!(
        s.escalate(reboot("GPUs"), &r, "boot-1").action,
        Planned::Reboot
    );
    r.rebooted_for("GPUs", "boot-1", 100);
    // Planned, not yet rebooted: still a reboot.
    assert_eq!(
        s.escalate(reboot("GPUs"), &r, "boot-1").action,
        Planned::Reboot
    );
    // A repair lifted before its reboot forgets it: a later boot is no reboot of its.
    let mut unplanned = r.clone();
    unplanned.unplan_reboot("boot-1");
    unplanned.saw_boot("boot-2");
    assert_eq!(
        s.escalate(reboot("GPUs"), &unplanned, "boot-2").action,
        Planned::Reboot
    );
    r.saw_boot("boot-2");
    let p = s.escalate(reboot("GPUs"), &r, "boot-2");
    assert_eq!((p.action, &p.by), (Planned::Replace, &PlannedBy::Again(1)));
    assert!(
        describe(&p, "compute-1", RepairMode::On).contains(
            "will replace compute-1 once no job runs for GPUs: gpu_resettable (found again in the boot after a reboot for it"
        ),
        "{}",
        describe(&p, "compute-1", RepairMode::On)
    );
    // Another check: its own history.
    assert_eq!(
        s.escalate(reboot("EFA"), &r, "boot-2").action,
        Planned::Reboot
    );
    r.saw_boot("boot-3");
    assert_eq!(
        s.escalate(reboot("GPUs"), &r, "boot-3").by,
        PlannedBy::Again(2)
    );
    r.saw_boot("boot-4");
    assert_eq!(
        s.escalate(reboot("GPUs"), &r, "boot-4").action,
        Planned::Reboot
    );
    // A replacement stays one; the history survives the file.
    let mut replace = reboot("GPUs");
    replace.action = Planned::Replace;
    assert_eq!(s.escalate(replace.clone(), &r, "boot-1"), replace);
    let back: record::Record = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    assert_eq!(back, r);
    // Only the last boots are kept.
    for i in 5..40 {
        r.saw_boot(&format!("boot-{i}"));
    }
    assert_eq!(r.boots.len(), record::KEPT);
    assert_eq!(r.boots_since_reboot("GPUs", "boot-39"), None);
}

/// The health checks' reason for `detail`, or a repair's (`stage`), by instance `id`.
fn repair_reason(id: &str, detail: &str, stage: Stage) -> String {
    reason(id, detail, stage)
}

#[test]
fn the_flap_guard_holds_a_nodename_replaced_before_and_a_partition_past_its_count() {
    let now = 1_796_605_600;
    let hour = 3600;
    let off = |id: &str, check: &str, ago: i64| {
        repair_reason(id, &format!("{check}: gone"), Stage::PoweredOff(now - ago))
    };
    let r1 = off("i-000000000000000a1", "GPUs", hour);
    let r2 = off("i-000000000000000a2", "GPUs", 2 * hour);
    let r3 = off("i-000000000000000a3", "GPUs", 30 * hour); // out of the window
    let r4 = off("i-000000000000000a4", "EFA", hour); // another check
    let fleet = [
        seen("c1", "p", Some(&r1)),
        seen("c2", "p,q", Some(&r2)),
        seen("c3", "p", Some(&r3)),
        seen("c4", "p", Some(&r4)),
        seen("c5", "q", None),
        seen("me", "p,q", None),
    ];
    fn h<'a>(
        fleet: &'a [breaker::Seen<'a>],
        local: &'a [record::Replaced],
        now: i64,
        max: u32,
    ) -> flap::History<'a> {
        flap::History {
            fleet,
            local,
            now,
            window: 24 * 3600,
            max,
            since: None,
        }
    }
    // Two replaced for GPUs in p within the window: at 3 nothing holds, at 2 it does.
    assert_eq!(
        flap::holds("GPUs", "me", "p,q", &h(&fleet, &[], now, 3)),
        None
    );
    let why = flap::holds("GPUs", "me", "p,q", &h(&fleet, &[], now, 2)).unwrap();
    assert!(
        why.contains("2 nodes of partition p were replaced for GPUs within repair.flap_window (1day; repair.flap_max_replacements = 2)"),
        "{why}"
    );
    assert_eq!(
        flap::holds("EFA", "me", "p,q", &h(&fleet, &[], now, 2)),
        None
    );
    // This NodeName's previous instance replaced for the check: never a second time.
    let mut rec = record::Record::default();
    assert!(rec.saw_predecessor(
        &off("i-000000000000000b1", "GPUs", hour),
        "i-0123456789abcdef0"
    ));
    assert!(
        !rec.saw_predecessor(
            &off("i-000000000000000b1", "GPUs", hour),
            "i-0123456789abcdef0"
        ),
        "the same one once"
    );
    assert!(
        !rec.saw_predecessor(
            &off("i-0123456789abcdef0", "GPUs", hour),
            "i-0123456789abcdef0"
        ),
        "not its own"
    );
    assert!(!rec.saw_predecessor(
        "slurm-node-agent/health@i-000000000000000b1: GPUs: x",
        "i-0123456789abcdef0"
    ));
    let why = flap::holds("GPUs", "me", "p,q", &h(&fleet, &rec.replaced, now, 5)).unwrap();
    assert!(
        why.contains("me's previous instance i-000000000000000b1 was replaced for GPUs at "),
        "{why}"
    );
    assert_eq!(
        flap::holds("EFA", "me", "p,q", &h(&fleet, &rec.replaced, now, 5)),
        None
    );
    // Out of the window, it is forgotten; and the history can be cleared.
    let later = h(&fleet, &rec.replaced, now + 48 * hour, 5);
    assert_eq!(flap::holds("GPUs", "me", "p,q", &later), None);
    assert!(rec.clear_history(now));
    assert!(rec.replaced.is_empty() && !rec.clear_history(now));
    // Cleared by an operator: the records' replacements from before do not count either.
    let cleared = flap::History {
        since: rec.history_cleared_at,
        ..h(&fleet, &rec.replaced, now, 2)
    };
    assert_eq!(flap::holds("GPUs", "me", "p,q", &cleared), None);
}

/// The breaker counts a node whose drain became a repair's as failing the check; a node
/// powered off for its replacement is gone and fails nothing.
#[test]
fn the_breaker_counts_repairs_in_progress_and_not_the_nodes_replaced() {
    let id = "i-000000000000000a1";
    let draining = repair_reason(id, "GPUs: XID 79", Stage::AfterJobs(Planned::Replace));
    let off = repair_reason(id, "GPUs: XID 79", Stage::PoweredOff(1_796_605_600));
    assert!(breaker::names_check(&draining, "GPUs"));
    assert!(!breaker::names_check(&off, "GPUs"));
    assert!(!breaker::names_check(&draining, "EFA"));
}

#[test]
fn the_flap_guards_settings_are_checked() {
    let s: RepairSettings =
        toml::from_str("flap_window = \"6h\"\nflap_max_replacements = 1").unwrap();
    assert_eq!(s.flap_window.0.as_secs(), 6 * 3600);
    assert!(s.validate().is_ok());
    for (text, key) in [
        ("flap_window = \"0s\"", "repair.flap_window"),
        ("flap_max_replacements = 0", "repair.flap_max_replacements"),
    ] {
        let s: RepairSettings = toml::from_str(text).unwrap();
        assert_eq!(s.validate().unwrap_err().key, key, "{text}");
    }
}
