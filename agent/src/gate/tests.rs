#![allow(clippy::unwrap_used)]
//! The gate against stand-in `dcgmi` and `nvidia-smi` programs that play back DCGM's JSON
//! (`tests/fixtures/dcgm/`): a pass, a failing test on GPU 3, a hang, MIG mode, no host
//! engine, no GPU, no `dcgmi`; and the site's commands.

use super::*;
use crate::fsutil::write_test_program;
use crate::health::startgate::{check_gate, GateSpec};
use crate::systemd::fake::FakeUnits;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(format!(
        "{}/tests/fixtures/dcgm/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
}

/// A node's folder: stand-in programs, the state folder and an empty `/sys`.
struct Node {
    dir: tempfile::TempDir,
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("state")).unwrap();
        std::fs::create_dir_all(dir.path().join("sys/bus/pci/devices")).unwrap();
        Node { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `nvidia-smi` printing `mig` (the query's lines).
    fn nvidia_smi(&self, mig: &str) {
        write_test_program(
            &self.path("nvidia-smi"),
            &format!("#!/bin/sh\nprintf '{mig}'\n"),
        );
    }

    /// `dcgmi` running `body` after noting its arguments in `dcgmi.args`.
    fn dcgmi(&self, body: &str) {
        let args = self.path("dcgmi.args");
        write_test_program(
            &self.path("dcgmi"),
            &format!("#!/bin/sh\necho \"$@\" > {}\n{body}\n", args.display()),
        );
    }

    fn settings(&self, profile: Profile) -> StartGateSettings {
        StartGateSettings {
            profile,
            dcgmi: self.path("dcgmi"),
            nvidia_smi: self.path("nvidia-smi"),
            host_engine_wait: HumanDuration(Duration::from_secs(1)),
            ..StartGateSettings::default()
        }
    }

    fn env<'a>(&'a self, units: &'a dyn crate::systemd::Units) -> GateEnv<'a> {
        GateEnv {
            units,
            state_dir: self.dir.path().join("state").leak(),
            boot_id: "boot-1".into(),
            instance_id: "i-0123456789abcdef0".into(),
            sys_dir: self.path("sys"),
        }
    }

    fn check(&self, part: &str) -> Result<String, String> {
        check_gate(
            &GateSpec {
                state_dir: self.path("state"),
                part: part.into(),
            },
            Some("boot-1"),
        )
        .map_err(|e| e.to_string())
    }
}

/// A host engine's unit that never becomes active (not installed).
struct NoHostEngine;

#[async_trait::async_trait]
impl crate::systemd::Units for NoHostEngine {
    async fn active_state(&self, _unit: &str) -> Result<String, crate::systemd::SystemdError> {
        Ok("inactive".into())
    }
    async fn service_info(
        &self,
        _unit: &str,
    ) -> Result<crate::systemd::ServiceInfo, crate::systemd::SystemdError> {
        Ok(crate::systemd::ServiceInfo::default())
    }
    async fn stop(&self, _unit: &str) -> Result<(), crate::systemd::SystemdError> {
        Ok(())
    }
    async fn start_no_wait(&self, _unit: &str) -> Result<(), crate::systemd::SystemdError> {
        Ok(())
    }
    async fn unit_processes(
        &self,
        _unit: &str,
    ) -> Result<Vec<(u32, String)>, crate::systemd::SystemdError> {
        Ok(Vec::new())
    }
}

#[tokio::test]
async fn a_passing_diagnostic_passes_after_the_host_engine_started() {
    let n = Node::new();
    n.nvidia_smi("0, Disabled\\n1, [N/A]\\n");
    n.dcgmi(&format!("cat {}", fixture("diag-r1-pass.json").display()));
    let units = FakeUnits::default();
    let r = run(&n.settings(Profile::Quick), &n.env(&units)).await;
    assert!(r.passed(), "{r:?}");
    assert_eq!(
        r.parts[0].message,
        format!(
            "{} diag -r 1 -j: 2 tests passed on 2 GPUs",
            n.path("dcgmi").display()
        )
    );
    assert_eq!(units.calls(), vec!["start nvidia-dcgm.service"]);
    assert_eq!(
        std::fs::read_to_string(n.path("dcgmi.args"))
            .unwrap()
            .trim(),
        "diag -r 1 -j"
    );
    assert!(n.check("dcgm").unwrap().starts_with("passed: "));
}

#[tokio::test]
async fn a_failing_test_on_gpu_3_fails_with_dcgms_words() {
    let n = Node::new();
    n.nvidia_smi("0, Disabled\\n1, Disabled\\n2, Disabled\\n3, Disabled\\n");
    n.dcgmi(&format!(
        "cat {}\nexit 226",
        fixture("diag-r2-memory-fail-gpu3.json").display()
    ));
    let units = FakeUnits::default();
    let r = run(&n.settings(Profile::Medium), &n.env(&units)).await;
    assert!(!r.passed());
    let want = "diag -r 2 -j: memory failed on GPU 3: Found 2 faulty memory elements on GPU 3 (DCGM error 52, category hardware memory)";
    assert!(r.parts[0].message.ends_with(want), "{}", r.parts[0].message);
    // The record on disk says so to the check, which fails with the same words.
    let e = n.check("dcgm").unwrap_err();
    assert!(e.ends_with(want), "{e}");
}

#[tokio::test]
async fn a_hung_diagnostic_fails_at_its_budget() {
    let n = Node::new();
    n.nvidia_smi("0, Disabled\\n");
    n.dcgmi("sleep 30");
    let mut s = n.settings(Profile::Quick);
    s.budget = HumanDuration(Duration::from_secs(1));
    let units = FakeUnits::default();
    let r = run(&s, &n.env(&units)).await;
    assert_eq!(r.parts[0].status, PartStatus::Failed);
    assert!(
        r.parts[0]
            .message
            .ends_with("diag -r 1 -j ran past its budget 1s (start_gate.budget) and was killed"),
        "{}",
        r.parts[0].message
    );
}

#[tokio::test]
async fn mig_no_gpu_and_no_dcgmi_are_answers_not_failures() {
    // MIG mode: skipped, naming the GPUs; dcgmi never runs.
    let n = Node::new();
    n.nvidia_smi("0, Enabled\\n1, Disabled\\n2, Enabled\\n");
    n.dcgmi("exit 1");
    let units = FakeUnits::default();
    let r = run(&n.settings(Profile::Quick), &n.env(&units)).await;
    assert!(r.passed());
    assert_eq!(r.parts[0].status, PartStatus::Skipped);
    assert_eq!(
        r.parts[0].message,
        "GPU 0, 2 in MIG mode: DCGM diagnostics need whole GPUs, not run"
    );
    assert!(!n.path("dcgmi.args").exists());
    // DCGM's own refusal of MIG (a GPU nvidia-smi did not say) is the same answer.
    n.nvidia_smi("0, Disabled\\n");
    n.dcgmi(&format!(
        "cat {}",
        fixture("diag-runtime-error-mig.json").display()
    ));
    let r = run(&n.settings(Profile::Quick), &n.env(&units)).await;
    assert_eq!(r.parts[0].status, PartStatus::Skipped, "{r:?}");
    assert!(r.parts[0].message.contains("MIG mode enabled"));

    // No nvidia-smi and no NVIDIA GPU on PCI: no GPU.
    let n = Node::new();
    let r = run(&n.settings(Profile::Long), &n.env(&units)).await;
    assert_eq!(r.parts[0].status, PartStatus::Skipped);
    assert_eq!(
        r.parts[0].message,
        "no NVIDIA GPU on this node: DCGM diagnostics not run"
    );
    // An NVIDIA GPU on PCI without the driver's nvidia-smi: that fails.
    crate::health::facts::write_pci_device(
        &n.path("sys"),
        "0000:00:1e.0",
        "0x10de",
        "0x2330",
        "0x030200",
    );
    let r = run(&n.settings(Profile::Long), &n.env(&units)).await;
    assert_eq!(r.parts[0].status, PartStatus::Failed);
    assert!(r.parts[0].message.contains("the driver is not installed"));

    // GPUs, no dcgmi: skipped, naming the path and the key.
    let n = Node::new();
    n.nvidia_smi("0, Disabled\\n");
    let r = run(&n.settings(Profile::Quick), &n.env(&units)).await;
    assert_eq!(r.parts[0].status, PartStatus::Skipped);
    assert_eq!(
        r.parts[0].message,
        format!(
            "{} not installed (start_gate.dcgmi): DCGM diagnostics not run",
            n.path("dcgmi").display()
        )
    );
}

#[tokio::test]
async fn no_host_engine_is_named() {
    let n = Node::new();
    n.nvidia_smi("0, Disabled\\n");
    n.dcgmi("echo 'Error: Unable to start an embedded host engine. Host engine connection invalid/disconnected.'\nexit 1");
    let r = run(&n.settings(Profile::Quick), &n.env(&NoHostEngine)).await;
    assert_eq!(r.parts[0].status, PartStatus::Failed);
    let m = &r.parts[0].message;
    assert!(
        m.starts_with("DCGM host engine: nvidia-dcgm.service not active within 1s (inactive); "),
        "{m}"
    );
    assert!(
        m.ends_with(
            "Unable to start an embedded host engine. Host engine connection invalid/disconnected."
        ),
        "{m}"
    );
}

#[tokio::test]
async fn site_commands_run_after_dcgm_each_with_its_budget() {
    let n = Node::new();
    write_test_program(&n.path("ok"), "#!/bin/sh\nexit 0\n");
    write_test_program(
        &n.path("bad"),
        "#!/bin/sh\necho 'fi_pingpong: fi_getinfo(): No data available' >&2\nexit 3\n",
    );
    write_test_program(&n.path("slow"), "#!/bin/sh\nsleep 30\n");
    let cmd = |name: &str, secs: u64| GateCommand {
        name: name.into(),
        argv: vec![
            n.path(name).display().to_string(),
            "-p".into(),
            "efa".into(),
        ],
        budget: HumanDuration(Duration::from_secs(secs)),
    };
    let s = StartGateSettings {
        commands: vec![cmd("ok", 10), cmd("bad", 10), cmd("slow", 1)],
        ..n.settings(Profile::None)
    };
    assert_eq!(s.parts(), vec!["ok", "bad", "slow"]);
    assert_eq!(
        s.running_words(),
        "start-up gate running: ok, bad, slow (up to 21s)"
    );
    let units = FakeUnits::default();
    let r = run(&s, &n.env(&units)).await;
    let status: Vec<_> = r.parts.iter().map(|p| p.status).collect();
    assert_eq!(
        status,
        vec![PartStatus::Passed, PartStatus::Failed, PartStatus::Failed]
    );
    assert!(r.parts[1]
        .message
        .ends_with("bad exited 3: fi_pingpong: fi_getinfo(): No data available"));
    assert!(
        r.parts[2].message.contains("ran past its budget 1s"),
        "{}",
        r.parts[2].message
    );
    assert!(n.check("ok").is_ok());
    assert!(n.check("bad").is_err());
    // No host engine was asked for: no DCGM part.
    assert!(units.calls().is_empty());
}

#[test]
fn bad_settings_are_refused_by_key() {
    let err = |f: &dyn Fn(&mut StartGateSettings)| {
        let mut s = StartGateSettings::default();
        f(&mut s);
        s.validate().unwrap_err().to_string()
    };
    let e = err(&|s| s.dcgmi = "dcgmi".into());
    assert!(
        e.contains("start_gate.dcgmi") && e.contains("absolute"),
        "{e}"
    );
    // budget 0s is the profile's.
    let s = StartGateSettings {
        profile: Profile::Medium,
        ..StartGateSettings::default()
    };
    assert_eq!(s.dcgm_budget(), Duration::from_secs(20 * 60));
    let e = err(&|s| s.host_engine_unit = "../x.service".into());
    assert!(e.contains("start_gate.host_engine_unit"), "{e}");
    let c = |name: &str, argv: &[&str]| GateCommand {
        name: name.into(),
        argv: argv.iter().map(|a| a.to_string()).collect(),
        budget: default_command_budget(),
    };
    let e = err(&|s| s.commands = vec![c("efa", &["fi_pingpong", "-p", "efa"])]);
    assert!(
        e.contains("start_gate.commands[0].argv") && e.contains("absolute"),
        "{e}"
    );
    let e = err(&|s| s.commands = vec![c("x", &["/bin/true"]), c("x", &["/bin/true"])]);
    assert!(e.contains("start_gate.commands[1].name"), "{e}");
    let e = err(&|s| s.commands = vec![c("dcgm", &["/bin/true"])]);
    assert!(e.contains("start_gate.commands[0].name"), "{e}");
    assert!(!StartGateSettings::default().enabled());
}
