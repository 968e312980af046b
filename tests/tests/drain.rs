//! Drains driven by the node, end to end: the real `slurm-node-agent` binary (`run`,
//! `drain`, `resume`, `status`) against a real slurmctld and slurmd (Slurm 22.05), the IMDS
//! emulator and moto's SSM.
//!
//! Build the agent first: `cargo build -p slurm-node-agent` (or set SLURM_NODE_AGENT_BIN).
#![allow(clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use rustix::process::Signal;
use serde_json::Value;
use slurm_e2e::agent::agent_binary;
use slurm_e2e::imds_emulator::{Config, Emulator, EventOutcome, Fault, FaultTarget};
use slurm_e2e::slurm::{field, NodeKind};
use slurm_e2e::{run_with_timeout, wait_until, Daemon, Moto, Slurmctld, Slurmd, TempRoot};

const NODE_CONF: &str = "CPUs=1 RealMemory=100";
const WAIT: Duration = Duration::from_secs(60);
/// The emulator's default `ami-id` (AEMM's).
const RUNNING_AMI: &str = "ami-0a887e401f7654935";
/// An AMI id that no image has (the form is right): the desired image must exist.
const MISSING_AMI: &str = "ami-00000000000000000";

struct World {
    // Dropped in order: slurmd before the controller.
    slurmd: Option<Slurmd>,
    ctld: Slurmctld,
    imds: Emulator,
    moto: Option<Moto>,
    root: TempRoot,
    node: String,
}

impl World {
    fn start(node: &str, ctld_lines: &[String], settings: &str) -> World {
        let mut b = Slurmctld::builder("drain");
        for l in ctld_lines {
            b = b.line(l.clone());
        }
        let ctld = b.start().unwrap();
        let slurmd = Slurmd::dynamic(&ctld, node, NODE_CONF).unwrap();
        ctld.wait_node_idle(node, WAIT).unwrap();
        let imds = Emulator::start(Config::default()).unwrap();
        let root = TempRoot::new("drain-e2e-").unwrap();
        fs::create_dir_all(root.path().join("conf.d")).unwrap();
        let w = World {
            slurmd: Some(slurmd),
            ctld,
            imds,
            moto: None,
            root,
            node: node.to_string(),
        };
        w.write_settings(settings);
        w
    }

    fn with_moto(mut self) -> World {
        self.moto = Some(Moto::start().unwrap());
        self
    }

    /// Registers an image in moto (EC2 DescribeImages shows it `available`) and returns
    /// its id: the desired image of an upgrade must exist.
    fn new_image(&self, name: &str) -> String {
        self.moto.as_ref().unwrap().register_image(name).unwrap()
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.path().join(rel)
    }

    fn write_settings(&self, extra: &str) {
        let text = format!(
            "[node]\nname = \"{node}\"\n\n[slurm]\nbin_dir = \"{bin_dir}\"\n\n\
             [imds]\nendpoint = \"{imds}\"\n\n[agent]\nstate_dir = \"{state}\"\n\n\
             [drain]\ncheck_interval = \"200ms\"\nlock_timeout = \"10s\"\n\n{extra}\n",
            node = self.node,
            bin_dir = slurm_e2e::install::bin_dir().display(),
            imds = self.imds.endpoint(),
            state = self.path("state").display(),
        );
        fs::write(self.path("agent.toml"), text).unwrap();
    }

    /// Settings with the defaults for everything the daemon does periodically (for the
    /// benchmarks): only the node, Slurm, the emulator and the state folder.
    fn write_default_settings(&self) {
        let text = format!(
            "[node]\nname = \"{}\"\n[slurm]\nbin_dir = \"{}\"\n[imds]\nendpoint = \"{}\"\n\
             [agent]\nstate_dir = \"{}\"\n",
            self.node,
            slurm_e2e::install::bin_dir().display(),
            self.imds.endpoint(),
            self.path("state").display()
        );
        fs::write(self.path("agent.toml"), text).unwrap();
    }

    fn agent(&self, args: &[&str]) -> Command {
        let mut c = Command::new(agent_binary().unwrap());
        c.args(args)
            .arg("--config")
            .arg(self.path("agent.toml"))
            .arg("--config-dir")
            .arg(self.path("conf.d"))
            .env_clear()
            .env(
                "PATH",
                format!(
                    "{}:{}:/usr/sbin:/usr/bin:/sbin:/bin",
                    slurm_e2e::install::prefix().join("sbin").display(),
                    slurm_e2e::install::bin_dir().display()
                ),
            )
            .env("RUST_LOG", "info")
            .envs(self.ctld.env());
        if let Some(m) = &self.moto {
            c.envs(m.env());
        }
        c
    }

    fn run_agent(&self, args: &[&str]) -> Output {
        run_with_timeout(self.agent(args), Duration::from_secs(120)).unwrap()
    }

    fn daemon(&self, name: &str, notify: Option<&Path>) -> Daemon {
        let mut c = self.agent(&["run"]);
        if let Some(n) = notify {
            c.env("NOTIFY_SOCKET", n);
        }
        Daemon::spawn(name, c, self.root.path()).unwrap()
    }

    fn status(&self) -> Value {
        let out = self.run_agent(&["status", "--output", "json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn wait_phase(&self, phase: &str) -> Value {
        let mut last = Value::Null;
        wait_until(
            &format!("agent phase {phase}"),
            WAIT,
            Duration::from_millis(100),
            || {
                last = self.status();
                Ok((last["phase"] == phase).then(|| last.clone()))
            },
        )
        .unwrap_or_else(|e| panic!("{e}; last status {last}"))
    }

    /// Waits until `status` shows a drain of cause `kind`; returns that status.
    fn wait_cause(&self, kind: &str) -> Value {
        let mut last = Value::Null;
        wait_until(
            &format!("agent cause {kind}"),
            WAIT,
            Duration::from_millis(100),
            || {
                last = self.status();
                Ok((last["cause"] == kind).then(|| last.clone()))
            },
        )
        .unwrap_or_else(|e| panic!("{e}; last status {last}"))
    }

    fn node_line(&self) -> String {
        self.ctld
            .scontrol_ok(&["show", "node", "-o", &self.node])
            .unwrap()
    }

    fn reason(&self) -> String {
        let line = self.node_line();
        let start = line.find("Reason=").map_or(line.len(), |i| i + 7);
        let r = &line[start..];
        r.rfind(" [").map_or(r, |i| &r[..i]).trim().to_string()
    }

    /// The agent's drain is lifted: `sinfo -R` lists no reason for the node, the record is
    /// not drained, and where Slurm clears a reason on RESUME (22.05) none is left at all.
    fn assert_lifted(&self, what: &str) {
        let st = self.state();
        assert!(!st.contains("DRAIN"), "{what}: {st}");
        self.ctld
            .check_reason_lifted(&self.node, &self.reason())
            .unwrap_or_else(|e| panic!("{what}: {e:#}"));
    }

    fn state(&self) -> String {
        field(&self.node_line(), "State")
            .unwrap_or_default()
            .to_string()
    }

    fn wait_state(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        self.ctld
            .wait_node_state(&self.node, pred, WAIT)
            .unwrap_or_else(|e| panic!("{what}: {e:#}"))
    }

    /// A batch job on the node that sleeps `secs` and then writes `done` into `job-done`.
    fn submit_job(&self, secs: u32) -> PathBuf {
        let done = self.path("job-done");
        let out = self
            .ctld
            .run_job(
                "sbatch",
                &[
                    "-w",
                    &self.node,
                    "-o",
                    &self.path("job.out").display().to_string(),
                    "--wrap",
                    &format!("sleep {secs}; echo done > {}", done.display()),
                ],
            )
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.wait_state("job running", |s| {
            s.starts_with("ALLOCATED") || s.starts_with("MIXED")
        });
        done
    }

    /// A batch job on the node that may be requeued (`--requeue`), sleeping 10 minutes;
    /// returns its id once slurmctld runs it there.
    fn requeueable_job_running(&self) -> String {
        let out = self
            .ctld
            .run_job(
                "sbatch",
                &[
                    "-w",
                    &self.node,
                    "--requeue",
                    "-o",
                    "/dev/null",
                    "--wrap",
                    "sleep 600",
                ],
            )
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let job = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .last()
            .unwrap()
            .to_string();
        self.wait_state("job running", |s| {
            s.starts_with("ALLOCATED") || s.starts_with("MIXED")
        });
        job
    }

    /// Job `job`'s state as squeue prints it (`PENDING`, `RUNNING`; empty once it left).
    fn job_state(&self, job: &str) -> String {
        let out = self
            .ctld
            .run_job("squeue", &["-h", "-j", job, "-o", "%T"])
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn script(&self, name: &str, body: &str) -> PathBuf {
        let p = self.path(name);
        fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        p
    }
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: stdout {:?} stderr {:?}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn in_two_minutes() -> String {
    rfc3339_in(120)
}

/// RFC 3339 time `secs` from now.
fn rfc3339_in(secs: u64) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + secs;
    let out = Command::new("date")
        .args(["-u", "-d", &format!("@{t}"), "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn gmt_in(secs: u64) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + secs;
    let out = Command::new("date")
        .args(["-u", "-d", &format!("@{t}"), "+%d %b %Y %H:%M:%S GMT"])
        .env("LC_ALL", "C")
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn notifications(sock: &UnixDatagram) -> Vec<String> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = sock.recv(&mut buf) {
        out.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    out
}

#[test]
fn spot_notice_drains_survives_imds_errors_and_reports_through_sd_notify() {
    let w = World::start("spot1", &[], "[events]\nspot_interval = \"200ms\"\n");
    let notify_path = w.path("notify.sock");
    let sock = UnixDatagram::bind(&notify_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut d = w.daemon("agent", Some(&notify_path));
    wait_until("READY=1", WAIT, Duration::from_millis(50), || {
        Ok(notifications(&sock)
            .iter()
            .any(|m| m.starts_with("READY=1"))
            .then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", d.log_tail(30)));
    assert!(slurm_e2e::is_idle(&w.state()));

    w.imds
        .set_spot_instance_action("terminate", &in_two_minutes());
    w.wait_state("drained by the spot notice", |s| s.contains("DRAIN"));
    assert!(
        w.reason().starts_with("slurm-node-agent/spot@i-")
            && w.reason()
                .contains(": spot interruption notice: terminate at "),
        "{}",
        w.reason()
    );
    let st = w.wait_phase("drained");
    assert_eq!(st["cause"], "spot");

    // IMDS fails in the middle of the interruption: tokens forgotten, then 503 for every
    // GET. The node stays drained; nothing is undone or done twice.
    let log_shows = |d: &Daemon, needle: &str| {
        wait_until(needle, WAIT, Duration::from_millis(100), || {
            Ok(d.log_tail(400).contains(needle).then_some(()))
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log_tail(40)));
    };
    w.imds.expire_tokens();
    w.imds.inject(Fault::status(503).on(FaultTarget::Get));
    log_shows(&d, "HTTP 503 after retries");
    assert!(w.state().contains("DRAIN"), "{}", w.state());
    assert_eq!(w.status()["phase"], "drained");
    w.imds.clear_faults();
    log_shows(&d, "instance metadata answers again");
    w.imds
        .inject(Fault::status(401).on(FaultTarget::Get).times(8));
    log_shows(&d, "requesting a new token");
    d.check_running().unwrap();
    assert!(w.state().contains("DRAIN"), "{}", w.state());
    let st = w.status();
    assert_eq!(st["phase"], "drained");
    let begins = st["state"]["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["event"] == "begin")
        .count();
    assert_eq!(begins, 1, "the repeated notice was handled once: {st}");
    assert_eq!(
        d.log_tail(400).matches("event=\"begin\"").count(),
        1,
        "one begin transition logged"
    );

    // An operator's drain while the spot drain is in progress changes nothing.
    let out = w.run_agent(&["drain", "--reason", "disk check", "--output", "json"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = json(&out);
    assert_eq!(r["result"], "already_draining");
    assert_eq!(r["cause"], "spot");

    // Metrics textfile.
    let prom = slurm_e2e::read_prom(&w.path("state/drain.prom"));
    assert!(
        prom.contains("slurm_node_agent_drain_phase{phase=\"drained\"} 1"),
        "{prom}"
    );
    assert!(
        prom.contains("slurm_node_agent_drain_cause{kind=\"spot\"} 1"),
        "{prom}"
    );

    let status = d.stop().unwrap();
    assert!(
        status.success(),
        "SIGTERM must end the daemon cleanly: {status:?}"
    );
    let msgs = notifications(&sock).join("\n");
    assert!(
        msgs.contains("STATUS=drained (spot): slurm-node-agent/spot@i-"),
        "{msgs}"
    );
    assert!(msgs.contains("STOPPING=1"), "{msgs}");
}

#[test]
fn spot_job_action_signals_the_job_steps_before_the_deadline() {
    let w = World::start(
        "sig1",
        &[],
        "[events]\nspot_interval = \"200ms\"\nspot_job_action = \"signal\"\n\
         spot_job_signal = \"USR1\"\nspot_job_action_lead = \"5m\"\n",
    );
    let got = w.path("got-usr1");
    let step = w.script(
        "step.sh",
        &format!(
            "trap 'echo USR1 > {}; exit 0' USR1\nwhile :; do sleep 0.1; done",
            got.display()
        ),
    );
    let out = w
        .ctld
        .run_job(
            "sbatch",
            &[
                "-w",
                "sig1",
                "-o",
                &w.path("job.out").display().to_string(),
                "--wrap",
                &format!("srun {}", step.display()),
            ],
        )
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    w.wait_state("job running", |s| {
        s.starts_with("ALLOCATED") || s.starts_with("MIXED")
    });
    // Let srun start the step.
    std::thread::sleep(Duration::from_secs(1));
    let mut d = w.daemon("agent", None);
    // The interruption is two minutes away, within the 5 min lead: act at once.
    w.imds
        .set_spot_instance_action("terminate", &in_two_minutes());
    wait_until(
        "USR1 delivered to the job step",
        WAIT,
        Duration::from_millis(100),
        || Ok(got.exists().then_some(())),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", d.log_tail(30)));
    // The step exits on the signal, the job ends, the node is drained.
    let st = w.wait_phase("drained");
    assert_eq!(st["state"]["job_action_done"], true);
    assert!(d
        .log_tail(100)
        .contains("signalling jobs before the spot interruption"));
    d.stop().unwrap();
}

#[test]
fn upgrade_drain_waits_for_the_job_then_reboots_through_slurm() {
    let root_marker = TempRoot::new("drain-reboot-").unwrap();
    let marker = root_marker.path().join("rebooted");
    let reboot = root_marker.path().join("reboot.sh");
    fs::write(
        &reboot,
        format!(
            "#!/bin/sh\necho \"$(date +%s.%N)\" >> {}\n",
            marker.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&reboot, fs::Permissions::from_mode(0o755)).unwrap();
    let mut w = World::start(
        "up1",
        &[format!("RebootProgram={}", reboot.display())],
        "[upgrade]\nparameter = \"/cluster/compute/desired-ami\"\ninterval = \"1s\"\naction = \"reboot\"\n",
    )
    .with_moto();
    let desired_ami = w.new_image("node-v2");
    w.moto
        .as_ref()
        .unwrap()
        .put_parameter("/cluster/compute/desired-ami", &desired_ami, "String")
        .unwrap();
    let job_done = w.submit_job(6);
    let mut d = w.daemon("agent", None);

    w.wait_state("drained for the upgrade", |s| s.contains("DRAIN"));
    assert!(
        w.reason().starts_with("slurm-node-agent/upgrade@i-")
            && w.reason()
                .ends_with(&format!(": image upgrade {RUNNING_AMI} -> {desired_ami}")),
        "{}",
        w.reason()
    );
    // The job still runs on the draining node: the upgrade drain does not kill it.
    let st = w.state();
    assert!(
        st.starts_with("ALLOCATED") || st.starts_with("MIXED"),
        "job must still run: {st}"
    );
    // The agent records its phase right after slurmctld took the drain (two writes, one
    // after the other): waited for, not read at once, as load may come between them.
    w.wait_phase("draining");

    // The job completes; only then does Slurm run the RebootProgram.
    wait_until("reboot program", WAIT, Duration::from_millis(100), || {
        Ok(marker.exists().then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", d.log_tail(40)));
    assert!(
        job_done.exists(),
        "the job must have completed before the reboot"
    );
    assert_eq!(fs::read_to_string(&job_done).unwrap().trim(), "done");
    let st = w.wait_phase("done");
    assert_eq!(st["cause"], "upgrade");

    // "Reboot": slurmd comes back with -b; the node returns to service (nextstate=resume)
    // and the agent records the desired image as applied, without draining again.
    drop(w.slurmd.take());
    let _back = Slurmd::spawn(
        &w.ctld,
        "up1",
        &NodeKind::Dynamic(NODE_CONF.into()),
        &["-b"],
    )
    .unwrap();
    w.ctld.wait_node_idle("up1", WAIT).unwrap();
    let st = w.wait_phase("active");
    assert_eq!(st["state"]["applied_image"], desired_ami.as_str());
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        slurm_e2e::is_idle(&w.state()),
        "drained again: {}",
        w.state()
    );
    assert_eq!(fs::read_to_string(&marker).unwrap().lines().count(), 1);
    d.stop().unwrap();
}

#[test]
fn agent_killed_between_drain_and_action_continues_the_same_drain() {
    let w = World::start("kill1", &[], "").with_moto();
    let hook = w.script(
        "hook.sh",
        &format!(
            "echo \"$SNA_NODE $SNA_CURRENT_IMAGE $SNA_DESIRED_IMAGE\" >> {}",
            w.path("hook-ran").display()
        ),
    );
    w.write_settings(&format!(
        "[upgrade]\nparameter = \"/desired\"\ninterval = \"1s\"\naction = \"hook\"\nhook = [\"{}\"]\n",
        hook.display()
    ));
    let desired_ami = w.new_image("node-v2");
    w.moto
        .as_ref()
        .unwrap()
        .put_parameter("/desired", &desired_ami, "String")
        .unwrap();
    let job_done = w.submit_job(5);
    let mut d = w.daemon("agent-1", None);
    w.wait_phase("draining");
    d.signal(Signal::KILL).unwrap();
    let _ = d.stop();
    drop(d);
    // The job finishes while no agent runs.
    wait_until("job done", WAIT, Duration::from_millis(100), || {
        Ok(job_done.exists().then_some(()))
    })
    .unwrap();
    assert!(
        !w.path("hook-ran").exists(),
        "the action ran before the node was empty"
    );
    assert_eq!(w.status()["phase"], "draining", "state survived the kill");

    let mut d2 = w.daemon("agent-2", None);
    let st = w.wait_phase("active");
    assert_eq!(st["state"]["applied_image"], desired_ami.as_str());
    assert_eq!(
        fs::read_to_string(w.path("hook-ran")).unwrap(),
        format!("kill1 {RUNNING_AMI} {desired_ami}\n"),
        "the hook ran exactly once"
    );
    let history = st["state"]["history"].as_array().unwrap().clone();
    let events: Vec<&str> = history
        .iter()
        .map(|t| t["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        events,
        ["begin", "drained", "act", "done", "complete"],
        "{st}"
    );
    w.ctld.wait_node_idle("kill1", WAIT).unwrap();
    assert!(d2
        .log_tail(200)
        .contains("continuing the drain in progress"));
    d2.stop().unwrap();
}

#[test]
fn maintenance_drains_ahead_and_cancel_resumes_but_never_an_admin_drain() {
    let w = World::start(
        "mnt1",
        &[],
        "[events]\ninterval = \"200ms\"\nmaintenance_interval = \"200ms\"\nmaintenance_lead = \"2h\"\n",
    );
    let mut d = w.daemon("agent", None);
    // Weeks ahead: nothing happens.
    let far = format!(
        r#"[{{"NotBefore": "{}", "Code": "system-reboot", "Description": "x",
             "EventId": "instance-event-far", "NotAfter": "", "State": "active"}}]"#,
        gmt_in(21 * 86_400)
    );
    w.imds.set_scheduled_maintenance(&far);
    std::thread::sleep(Duration::from_secs(2));
    assert!(slurm_e2e::is_idle(&w.state()), "{}", w.state());

    let soon = |state: &str| {
        format!(
            r#"[{{"NotBefore": "{}", "Code": "instance-reboot", "Description": "x",
                 "EventId": "instance-event-1", "NotAfter": "", "State": "{state}"}}]"#,
            gmt_in(3600)
        )
    };
    w.imds.set_scheduled_maintenance(&soon("active"));
    w.wait_state("drained ahead of maintenance", |s| s.contains("DRAIN"));
    assert!(w.reason().starts_with("slurm-node-agent/maintenance@i-"));
    assert!(w
        .reason()
        .contains(": scheduled instance-reboot instance-event-1"));
    w.imds.set_scheduled_maintenance(&soon("canceled"));
    w.ctld.wait_node_idle("mnt1", WAIT).unwrap();
    w.wait_phase("active");

    // An admin drains the node; a new event comes and goes: the admin's drain stays.
    w.ctld
        .scontrol_ok(&[
            "update",
            "nodename=mnt1",
            "state=drain",
            "reason=admin: bad DIMM",
        ])
        .unwrap();
    let ev2 = |state: &str| soon(state).replace("instance-event-1", "instance-event-2");
    w.imds.set_scheduled_maintenance(&ev2("active"));
    w.wait_phase("drained");
    assert_eq!(w.reason(), "admin: bad DIMM");
    w.imds.set_scheduled_maintenance(&ev2("canceled"));
    w.wait_phase("active");
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        w.state().contains("DRAIN"),
        "admin drain resumed: {}",
        w.state()
    );
    assert_eq!(w.reason(), "admin: bad DIMM");
    d.stop().unwrap();
}

/// How many times the metadata service was asked for `path` (under `/latest/meta-data/`).
fn polls(imds: &Emulator, path: &str) -> usize {
    let full = format!("/latest/meta-data/{path}");
    imds.requests().iter().filter(|r| r.path == full).count()
}

/// Waits until the daemon has read `path` `n` more times than `since`.
fn wait_polls(imds: &Emulator, path: &str, since: usize, n: usize) {
    wait_until(
        &format!("{n} more polls of {path}"),
        WAIT,
        Duration::from_millis(50),
        || Ok((polls(imds, path) >= since + n).then_some(())),
    )
    .unwrap();
}

#[test]
fn a_completed_reboot_event_in_history_is_lifted_once_slurmd_registered_again() {
    let mut w = World::start(
        "mnt2",
        &[],
        "[events]\ninterval = \"500ms\"\nmaintenance_interval = \"500ms\"\nmaintenance_lead = \"2h\"\n",
    );
    let mut d = w.daemon("agent", None);
    let event = format!(
        r#"[{{"NotBefore": "{}", "Code": "system-reboot", "Description": "scheduled reboot",
             "EventId": "instance-event-0a1b2c", "NotAfter": "", "State": "active"}}]"#,
        gmt_in(3600)
    );
    w.imds.set_scheduled_maintenance(&event);
    // Drained early (NotBefore within the lead), no job: drained.
    w.wait_state("drained ahead of the reboot", |s| s.contains("DRAIN"));
    w.wait_phase("drained");
    assert!(
        w.reason()
            .starts_with("slurm-node-agent/maintenance@i-1234567890abcdef0: scheduled system-reboot instance-event-0a1b2c"),
        "{}",
        w.reason()
    );

    // EC2 reboots the instance (slurmd goes away) and moves the event to history as
    // completed. Until slurmd has registered again, the drain stays.
    drop(w.slurmd.take());
    w.imds
        .finish_maintenance_event("instance-event-0a1b2c", EventOutcome::Completed)
        .unwrap();
    let history = "events/maintenance/history";
    let seen = polls(&w.imds, history);
    wait_polls(&w.imds, history, seen, 3);
    assert!(w.state().contains("DRAIN"), "{}", w.state());
    assert!(
        w.reason().starts_with("slurm-node-agent/maintenance@"),
        "{}",
        w.reason()
    );

    // The node is back: slurmd registers again; the daemon lifts its drain.
    w.slurmd = Some(Slurmd::dynamic(&w.ctld, "mnt2", NODE_CONF).unwrap());
    let state = w.ctld.wait_node_idle("mnt2", WAIT).unwrap();
    assert!(!state.contains("DRAIN"), "{state}");
    w.assert_lifted("completed reboot event");
    w.wait_phase("active");

    // An admin's drain under a second reboot event that completes stays, reason untouched.
    w.ctld
        .scontrol_ok(&[
            "update",
            "nodename=mnt2",
            "state=drain",
            "reason=admin maintenance",
        ])
        .unwrap();
    let second = event.replace("instance-event-0a1b2c", "instance-event-0d3e4f");
    w.imds.set_scheduled_maintenance(&second);
    let st = w.wait_phase("drained");
    // The reboot comes after the second the drain began (slurmctld's SlurmdStartTime has
    // one-second resolution, and the agent counts only a slurmd started later).
    let began = st["state"]["started"].as_i64().unwrap();
    wait_until("the next second", WAIT, Duration::from_millis(50), || {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        Ok((i64::try_from(now).unwrap() > began).then_some(()))
    })
    .unwrap();
    drop(w.slurmd.take());
    w.imds
        .finish_maintenance_event("instance-event-0d3e4f", EventOutcome::Completed)
        .unwrap();
    w.slurmd = Some(Slurmd::dynamic(&w.ctld, "mnt2", NODE_CONF).unwrap());
    w.wait_phase("active");
    let seen = polls(&w.imds, history);
    wait_polls(&w.imds, history, seen, 2);
    assert!(w.state().contains("DRAIN"), "{}", w.state());
    assert_eq!(w.reason(), "admin maintenance");
    d.stop().unwrap();
}

#[test]
fn rebalance_drains_only_when_asked_and_is_lifted_after_the_window() {
    let rebalance = "events/recommendations/rebalance";
    // Default (`ignore`): a recommendation is logged, the node is not drained.
    let w = World::start("rb1", &[], "[events]\ninterval = \"300ms\"\n");
    let mut d = w.daemon("agent-ignore", None);
    wait_polls(&w.imds, rebalance, 0, 1);
    w.imds.set_rebalance(&rfc3339_in(0));
    let seen = polls(&w.imds, rebalance);
    wait_polls(&w.imds, rebalance, seen, 3);
    assert!(slurm_e2e::is_idle(&w.state()), "{}", w.state());
    assert_eq!(w.reason(), "");
    assert_eq!(w.status()["phase"], "active");
    d.stop().unwrap();

    // `drain` with a window: drained on the recommendation, lifted once the window passed
    // without an interruption notice, and not drained again for the same recommendation.
    w.imds.clear_rebalance();
    w.write_settings(
        "[events]\ninterval = \"300ms\"\nrebalance = \"drain\"\nrebalance_window = \"20s\"\n",
    );
    let mut d = w.daemon("agent-drain", None);
    let seen = polls(&w.imds, rebalance);
    wait_polls(&w.imds, rebalance, seen, 1);
    w.imds.set_rebalance(&rfc3339_in(0));
    w.wait_state("drained on the recommendation", |s| s.contains("DRAIN"));
    assert!(
        w.reason().starts_with(
            "slurm-node-agent/rebalance@i-1234567890abcdef0: rebalance recommendation at "
        ),
        "{}",
        w.reason()
    );
    w.ctld
        .wait_node_state(
            "rb1",
            |s| slurm_e2e::is_idle(s) && !s.contains("DRAIN"),
            Duration::from_secs(180),
        )
        .unwrap_or_else(|e| panic!("{e:#}\n{}", d.log_tail(40)));
    w.assert_lifted("rebalance window over");
    w.wait_phase("active");
    let seen = polls(&w.imds, rebalance);
    wait_polls(&w.imds, rebalance, seen, 3);
    assert!(!w.state().contains("DRAIN"), "drained again: {}", w.state());
    d.stop().unwrap();
}

/// A world for node `node` whose slurm.conf's `RebootProgram` appends a line to `marker`
/// (each "reboot"), and whose health checks (every second) fail while `flag` does not
/// exist (`check_file_test -f <flag>` in an nhc.conf), with `extra` settings; the scratch
/// folder holding both is returned first (kept while it lives).
fn flagged_reboot_world(node: &str, extra: &str) -> (TempRoot, PathBuf, PathBuf, World) {
    let scratch = TempRoot::new("reboot-").unwrap();
    let flag = scratch.path().join("healthy-flag");
    let marker = scratch.path().join("rebooted");
    let reboot = scratch.path().join("reboot.sh");
    fs::write(
        &reboot,
        format!("#!/bin/sh\necho \"$(date +%s)\" >> {}\n", marker.display()),
    )
    .unwrap();
    fs::set_permissions(&reboot, fs::Permissions::from_mode(0o755)).unwrap();
    let w = World::start(node, &[format!("RebootProgram={}", reboot.display())], "");
    fs::create_dir_all(w.path("checks.d")).unwrap();
    fs::write(
        w.path("nhc.conf"),
        format!("* || check_file_test -f {}\n", flag.display()),
    )
    .unwrap();
    w.write_settings(&format!(
        "[health]\nnhc_conf = [\"{}\"]\nchecks_dir = \"{}\"\ninterval = \"1s\"\n\n{extra}",
        w.path("nhc.conf").display(),
        w.path("checks.d").display()
    ));
    (scratch, flag, marker, w)
}

#[test]
fn a_health_drain_is_lifted_after_scontrol_reboot_once_the_checks_pass() {
    let (_scratch, flag, marker, mut w) = flagged_reboot_world("hr1", "");
    let mut d = w.daemon("agent-health", None);
    w.wait_state("drained by the health check", |s| s.contains("DRAIN"));
    assert!(
        w.reason().starts_with("slurm-node-agent/health@"),
        "{}",
        w.reason()
    );

    // An admin reboots the node through Slurm; it comes back (slurmd -b), the check still
    // failing: still drained by the health checks.
    w.ctld.scontrol_ok(&["reboot", "hr1"]).unwrap();
    wait_until("RebootProgram", WAIT, Duration::from_millis(100), || {
        Ok(marker.exists().then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", d.log_tail(40)));
    drop(w.slurmd.take());
    w.slurmd = Some(
        Slurmd::spawn(
            &w.ctld,
            "hr1",
            &NodeKind::Dynamic(NODE_CONF.into()),
            &["-b"],
        )
        .unwrap(),
    );
    w.wait_state("back from the reboot, drained", |s| {
        s.contains("DRAIN") && !s.contains("REBOOT")
    });
    wait_until("health reason", WAIT, Duration::from_millis(100), || {
        Ok(w.reason()
            .starts_with("slurm-node-agent/health@")
            .then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e}: {}", w.reason()));

    // The checks pass: the drain is lifted.
    fs::write(&flag, "ok").unwrap();
    let st = w
        .ctld
        .wait_node_state(
            "hr1",
            |s| slurm_e2e::is_idle(s) && !s.contains("DRAIN"),
            WAIT,
        )
        .unwrap_or_else(|e| panic!("{e:#}\n{}", d.log_tail(40)));
    assert!(!st.contains("REBOOT"), "{st}");
    w.assert_lifted("health drain after scontrol reboot");
    d.stop().unwrap();
}

/// The daemon's `STATUS=` follows what an operator's `drain` and `resume` commands wrote
/// (another process than the daemon): the drain, then `active` again after the resume.
#[test]
fn an_operators_drain_and_resume_show_in_the_running_daemons_status() {
    let w = World::start("opst1", &[], "");
    let notify_path = w.path("notify.sock");
    let sock = UnixDatagram::bind(&notify_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut d = w.daemon("agent", Some(&notify_path));
    w.wait_phase("active");
    let mut seen = Vec::new();
    let mut wait_status = |prefix: &str| {
        wait_until(
            &format!("STATUS={prefix}"),
            WAIT,
            Duration::from_millis(50),
            || {
                seen.extend(notifications(&sock));
                Ok(seen
                    .iter()
                    .any(|m| m.starts_with(&format!("STATUS={prefix}")))
                    .then_some(()))
            },
        )
        .unwrap_or_else(|e| panic!("{e}: {seen:?}\n{}", d.log_tail(20)));
        seen.clear();
    };
    let out = w.run_agent(&["drain", "--reason", "kernel update"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_status("drain");
    let out = w.run_agent(&["resume"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_status("active");
    d.stop().unwrap();
}

#[test]
fn drain_resume_commands_are_idempotent_and_respect_foreign_drains() {
    let w = World::start("cmd1", &[], "");
    let out = w.run_agent(&["drain", "--reason", "kernel update", "--output", "json"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(json(&out)["result"], "started");
    assert!(
        w.reason().starts_with("slurm-node-agent/operator@")
            && w.reason().ends_with(": kernel update"),
        "{}",
        w.reason()
    );
    // Twice, and two at once: all succeed, one drain.
    let again = w.run_agent(&["drain", "--reason", "kernel update", "--output", "json"]);
    assert_eq!(json(&again)["result"], "already_draining");
    let a = w
        .agent(&["drain", "--reason", "other", "--output", "json"])
        .output();
    let b = w
        .agent(&["drain", "--reason", "other", "--output", "json"])
        .output();
    for o in [a.unwrap(), b.unwrap()] {
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let st = w.status();
    assert_eq!(
        st["state"]["history"].as_array().unwrap().len(),
        1,
        "one transition: {st}"
    );
    // --wait on an idle drained node returns at once.
    let out = w.run_agent(&[
        "drain",
        "--reason",
        "x",
        "--wait",
        "--timeout",
        "30s",
        "--output",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(json(&out)["phase"], "drained");

    let out = w.run_agent(&["resume", "--output", "json"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    w.ctld.wait_node_idle("cmd1", WAIT).unwrap();
    let out = w.run_agent(&["resume"]);
    assert_eq!(out.status.code(), Some(0), "resume is idempotent");

    // A job runs: --wait times out with 75, the job is untouched.
    let job_done = w.submit_job(8);
    let out = w.run_agent(&["drain", "--reason", "y", "--wait", "--timeout", "2s"]);
    assert_eq!(
        out.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("still has jobs"));
    let out = w.run_agent(&["drain", "--reason", "y", "--wait", "--timeout", "60s"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(job_done.exists(), "--wait returned before the job ended");
    assert_eq!(w.run_agent(&["resume"]).status.code(), Some(0));
    w.ctld.wait_node_idle("cmd1", WAIT).unwrap();

    // An admin's drain is not ours to resume.
    w.ctld
        .scontrol_ok(&[
            "update",
            "nodename=cmd1",
            "state=drain",
            "reason=hardware ticket 42",
        ])
        .unwrap();
    let out = w.run_agent(&["resume"]);
    assert_eq!(out.status.code(), Some(77));
    assert!(String::from_utf8_lossy(&out.stderr).contains("hardware ticket 42"));
    assert!(w.state().contains("DRAIN"));
    let out = w.run_agent(&["resume", "--force"]);
    assert_eq!(out.status.code(), Some(0));
    w.ctld.wait_node_idle("cmd1", WAIT).unwrap();

    // Bad input: a reason with a newline, and no node name at all.
    let out = w.run_agent(&["drain", "--reason", "a\nb"]);
    assert_eq!(out.status.code(), Some(2));
    fs::write(w.path("agent.toml"), "").unwrap();
    let out = w.run_agent(&[
        "status",
        "--set",
        &format!("agent.state_dir={}", w.path("empty").display()),
    ]);
    // Nothing names the node and no bootstrap record: resolved over instance metadata as
    // bootstrap would, and without it (this world's IMDS has nothing for it) exit 69.
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("node name is unknown"));
}

/// A tag anyone with `ec2:CreateTags` can write must not lock operators out: a tag whose
/// value is bad (`node.name=x;rm` fails validation, `node.weight=heavy` is not a number) is
/// left out by `status`, `drain` and `resume` with a warning naming the tag and the key,
/// and they do their work on the settings from the files. (Bootstrap refuses the same tags:
/// `a_tag_with_a_bad_value_stops_bootstrap_naming_the_tag_and_key` in bootstrap.rs.)
#[test]
fn a_tag_with_a_bad_value_is_left_out_by_status_and_drain_with_a_warning() {
    let w = World::start("badtag1", &[], "");
    w.imds.set_tag("slurm-node-agent:node.name", "x;rm");
    w.imds.set_tag("slurm-node-agent:node.weight", "heavy");
    let warned = |out: &Output| {
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            err.contains(
                "instance tag \"slurm-node-agent:node.weight\": key `node.weight`: expected an integer, got \"heavy\"; ignored"
            ),
            "{err}"
        );
        assert!(
            err.contains("instance tag \"slurm-node-agent:node.name\": key `node.name`")
                && err.contains("every setting from instance tags ignored"),
            "{err}"
        );
    };

    let out = w.run_agent(&["status", "--output", "json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    warned(&out);
    let st = json(&out);
    assert_eq!(st["node"], "badtag1", "{st}");
    assert!(
        st["slurm"]["state"].as_str().unwrap().starts_with("IDLE"),
        "{st}"
    );

    let out = w.run_agent(&["drain", "--reason", "bad tag test", "--output", "json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    warned(&out);
    assert_eq!(json(&out)["result"], "started");
    assert!(
        w.reason().starts_with("slurm-node-agent/operator@")
            && w.reason().ends_with(": bad tag test"),
        "{}",
        w.reason()
    );
    assert!(w.state().contains("DRAIN"), "{}", w.state());

    let out = w.run_agent(&["resume", "--output", "json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    warned(&out);
    w.ctld.wait_node_idle("badtag1", WAIT).unwrap();
}

/// `status` shows Slurm's `Reason` as Slurm holds it: an admin's reason with two spaces
/// keeps both, in text and in JSON, and is not taken for the agent's.
#[test]
fn status_shows_an_admins_reason_as_slurm_holds_it() {
    let w = World::start("st2", &[], "");
    w.ctld
        .scontrol_ok(&[
            "update",
            "NodeName=st2",
            "State=DRAIN",
            "Reason=ADMIN  SHUTDOWN  now",
        ])
        .unwrap();
    w.wait_state("drained by the admin", |s| s.contains("DRAIN"));
    let st = w.status();
    assert_eq!(st["slurm"]["reason"], "ADMIN  SHUTDOWN  now", "{st}");
    assert_eq!(st["slurm"]["reason_held"], true, "{st}");
    let out = w.run_agent(&["status"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text
        .lines()
        .find(|l| l.starts_with("Slurm Reason:"))
        .unwrap_or_else(|| panic!("no Slurm Reason line:\n{text}"));
    assert!(line.ends_with(" ADMIN  SHUTDOWN  now"), "{line:?}");
}

/// `status` in text: one readable line per field; when Slurm's view cannot be had (here
/// scontrol has no configuration), what is known locally is still printed and the exit
/// code is 69. With `--log-format json` every stderr line is a JSON object, the final
/// error and a usage error included.
#[test]
fn status_reads_as_text_and_exits_69_without_slurms_view() {
    let w = World::start("st1", &[], "");
    let out = w.run_agent(&["drain", "--reason", "disk swap"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = w.run_agent(&["status"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    for want in [
        "NodeName:",
        "st1\n",
        "Instance:",
        "Phase:",
        "Reason:",
        "Slurm State:",
    ] {
        assert!(text.contains(want), "{want:?} missing:\n{text}");
    }
    assert!(text.contains("DRAIN"), "{text}");
    assert!(!text.contains('{'), "no raw JSON in text mode:\n{text}");

    let broken = |args: &[&str]| {
        let mut c = w.agent(args);
        c.env("SLURM_CONF", w.path("no-such-slurm.conf"));
        run_with_timeout(c, Duration::from_secs(120)).unwrap()
    };
    let out = broken(&["status"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(69), "{text}\n{err}");
    assert!(text.contains("NodeName:") && text.contains("st1"), "{text}");
    assert!(text.contains("Phase:") && text.contains("drain"), "{text}");
    assert!(
        text.contains("Slurm:") && text.contains("unavailable"),
        "{text}"
    );
    assert!(err.contains("error: Slurm's view of node st1"), "{err}");

    // JSON logs: every stderr line is JSON, the final error too.
    let every_line_json = |out: &Output| {
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!err.trim().is_empty());
        for line in err.lines() {
            let v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}\n{err}"));
            assert!(v["level"].is_string(), "{line}");
        }
        err
    };
    let out = broken(&["status", "--log-format", "json", "--output", "json"]);
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    assert!(json(&out)["slurm"]["error"].is_string());
    let err = every_line_json(&out);
    assert!(err.contains("Slurm's view of node st1"), "{err}");
    let out = w.run_agent(&["status", "--log-format", "json", "--bogus-flag"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = every_line_json(&out);
    assert!(err.contains("--bogus-flag"), "{err}");
}

#[test]
fn bad_desired_image_parameters_never_drain() {
    let w = World::start(
        "ssm1",
        &[],
        "[upgrade]\nparameter = \"/desired\"\ninterval = \"500ms\"\n",
    )
    .with_moto();
    let moto = w.moto.as_ref().unwrap();
    // Missing.
    let mut d = w.daemon("agent-missing", None);
    wait_until("not found logged", WAIT, Duration::from_millis(100), || {
        Ok(d.log_tail(100)
            .contains("SSM parameter /desired: not found")
            .then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", d.log_tail(40)));
    // Not an AMI id (shell metacharacters included).
    moto.put_parameter("/desired", "ami-123; reboot", "String")
        .unwrap();
    wait_until(
        "not an AMI logged",
        WAIT,
        Duration::from_millis(100),
        || Ok(d.log_tail(100).contains("is not an AMI id").then_some(())),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", d.log_tail(40)));
    assert!(slurm_e2e::is_idle(&w.state()), "{}", w.state());
    assert_eq!(w.status()["phase"], "active");
    d.stop().unwrap();

    // Access denied: a moto that enforces IAM, and a user without any policy.
    let strict = Moto::start_with_env(&[("INITIAL_NO_AUTH_ACTION_COUNT", "3")]).unwrap();
    strict
        .put_parameter("/desired", MISSING_AMI, "String")
        .unwrap();
    let (key_id, secret) = strict.create_user_without_permissions("node").unwrap();
    let mut c = w.agent(&["run"]);
    c.env("AWS_ENDPOINT_URL", strict.endpoint())
        .env("AWS_ACCESS_KEY_ID", key_id)
        .env("AWS_SECRET_ACCESS_KEY", secret);
    let mut d = Daemon::spawn("agent-denied", c, w.root.path()).unwrap();
    wait_until(
        "access denied logged",
        WAIT,
        Duration::from_millis(100),
        || {
            Ok(d.log_tail(100)
                .contains("SSM parameter /desired: access denied")
                .then_some(()))
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", d.log_tail(40)));
    assert!(slurm_e2e::is_idle(&w.state()), "{}", w.state());
    d.stop().unwrap();
}

/// `scripts/bench-drain.sh` runs this (release build): latency from a spot notice in the
/// emulator to the node shown draining by slurmctld with the default 1 s polling, then the
/// idle daemon's CPU time and RSS. It prints numbers and asserts no timing.
#[test]
#[ignore = "benchmark: run through scripts/bench-drain.sh"]
fn bench_drain() {
    let trials: usize = std::env::var("BENCH_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let idle_secs: u64 = std::env::var("BENCH_IDLE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let w = World::start("bench1", &[], "");
    // Defaults for everything that matters: spot every 1 s, the other notices every 30 s
    // and 5 min.
    w.write_default_settings();
    let mut d = w.daemon("agent", None);
    w.wait_phase("active");
    let base = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut lat = Vec::new();
    for i in 0..trials {
        // Spread the notice over the poll period (golden-ratio steps through one second).
        let offset = (i as f64 * 0.618_034).fract();
        std::thread::sleep(Duration::from_secs_f64(offset));
        let t = base + 120 + i as u64;
        let when = Command::new("date")
            .args(["-u", "-d", &format!("@{t}"), "+%Y-%m-%dT%H:%M:%SZ"])
            .output()
            .unwrap();
        let when = String::from_utf8(when.stdout).unwrap().trim().to_string();
        let t0 = std::time::Instant::now();
        w.imds.set_spot_instance_action("terminate", &when);
        loop {
            if w.state().contains("DRAIN") {
                break;
            }
            assert!(
                t0.elapsed() < WAIT,
                "trial {i}: no drain\n{}",
                d.log_tail(20)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        lat.push(t0.elapsed().as_secs_f64() * 1000.0);
        w.imds.clear_spot_instance_action();
        let out = w.run_agent(&["resume"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        w.ctld.wait_node_idle("bench1", WAIT).unwrap();
    }
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| lat[((p / 100.0) * (lat.len() - 1) as f64).round() as usize];
    println!(
        "BENCH spot notice -> DRAIN in slurmctld (1 s polling): n={} p50={:.0} ms p99={:.0} ms max={:.0} ms (goal p99 <= 2000 ms)",
        lat.len(),
        pct(50.0),
        pct(99.0),
        lat[lat.len() - 1]
    );

    // Idle: a fresh daemon, no notices.
    d.stop().unwrap();
    drop(d);
    let mut d = w.daemon("agent-idle", None);
    w.wait_phase("active");
    std::thread::sleep(Duration::from_secs(5));
    let ticks = |pid: u32| -> u64 {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = after.split_whitespace().collect();
        // Fields 14 and 15 (utime, stime) are 11 and 12 after the command name.
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    };
    let hz: f64 = String::from_utf8(
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .parse()
    .unwrap();
    let pid = d.pid();
    let c0 = ticks(pid);
    let t0 = std::time::Instant::now();
    std::thread::sleep(Duration::from_secs(idle_secs));
    let c1 = ticks(pid);
    let secs = t0.elapsed().as_secs_f64();
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib = |key: &str| -> f64 {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let cpu_pct = (c1 - c0) as f64 / hz / secs * 100.0;
    println!(
        "BENCH idle daemon over {secs:.0} s: CPU {cpu_pct:.3} % of one core ({} ticks at {hz} Hz; goal <= 0.1 %), RSS {:.1} MiB (peak {:.1} MiB; goal <= 20 MiB), IMDS requests {}",
        c1 - c0,
        kib("VmRSS:") / 1024.0,
        kib("VmHWM:") / 1024.0,
        w.imds.request_count()
    );
    d.stop().unwrap();
}

/// `scripts/bench-noise.sh` runs this (release build): the idle daemon as operating-system
/// noise, beside slurmd on the same node (the floor every node pays). With default
/// settings, no notices and checks passing, after the daemon settled: its periodic jobs
/// (from its own log), then per minute the wake-ups of all its threads, its metadata
/// requests and CPU time, the same for slurmd, and a selfish-detour loop pinned to CPU 0
/// with the daemon on that CPU ÷ the daemon on another (slurmd on CPU 0 in both). Prints
/// numbers and asserts no timing.
#[test]
#[ignore = "benchmark: run through scripts/bench-noise.sh"]
fn bench_noise() {
    use slurm_e2e::noise;
    let env_u64 = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let idle_secs = env_u64("BENCH_IDLE_SECS", 60);
    let detour_secs = env_u64("BENCH_DETOUR_SECS", 10);
    let rounds = env_u64("BENCH_DETOUR_ROUNDS", 3);
    let mut w = World::start("noise1", &[], "");
    // Default settings for everything the daemon does periodically.
    w.write_default_settings();
    let mut c = w.agent(&["run"]);
    // As under systemd (WatchdogSec=60s): the watchdog is one of its periodic jobs.
    c.env("WATCHDOG_USEC", "60000000");
    let mut d = Daemon::spawn("agent-noise", c, w.root.path()).unwrap();
    w.wait_phase("active");
    // Settled: the first health pass and its look at slurmctld are over.
    std::thread::sleep(Duration::from_secs(10));
    let log = fs::read_to_string(d.log_path()).unwrap();
    let schedule = log
        .lines()
        .find(|l| l.contains("periodic jobs"))
        .and_then(|l| l.split("schedule=").nth(1))
        .map(|s| s.trim_matches('"').to_string())
        .unwrap_or_else(|| panic!("no schedule in the log:\n{}", d.log_tail(20)));
    println!("BENCH the daemon's periodic jobs (all on one tick):");
    for job in schedule.split("; ") {
        println!("BENCH   {job}");
    }
    let agent = d.pid();
    let slurmd = w.slurmd.as_mut().unwrap().daemon().pid();
    let r0 = w.imds.request_count();
    let f = noise::Sampler::new(&[agent, slurmd])
        .run(Duration::from_secs(idle_secs))
        .unwrap();
    let requests = (w.imds.request_count() - r0) as f64 * 60.0 / f[0].secs;
    println!(
        "BENCH idle daemon, per minute over {:.0} s: wake-ups {:.0} (goal <= 120), instance metadata requests {:.0} (goal <= 70), CPU {:.0} ms",
        f[0].secs,
        f[0].wakeups_per_min(),
        requests,
        f[0].cpu_ms_per_min()
    );
    println!(
        "BENCH slurmd on the same node (the floor), per minute: wake-ups {:.0}, CPU {:.0} ms",
        f[1].wakeups_per_min(),
        f[1].cpu_ms_per_min()
    );
    let per_thread = |f: &noise::Figures| {
        f.threads
            .iter()
            .map(|(n, w)| format!("{n} {:.0}", *w as f64 * 60.0 / f.secs))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "BENCH   daemon's wake-ups a minute by thread: {}",
        per_thread(&f[0])
    );
    println!(
        "BENCH   slurmd's wake-ups a minute by thread: {}",
        per_thread(&f[1])
    );
    // slurmd idles with next to no wake-ups (slurmctld's pings, SlurmdTimeout / 3): a
    // ratio to it would divide by about zero.
    let ratio = |a: f64, b: f64| {
        if b >= 1.0 {
            format!("{:.1}", a / b)
        } else {
            "n/a (slurmd below 1 a minute)".into()
        }
    };
    println!(
        "BENCH daemon / slurmd: wake-ups {}, CPU {}",
        ratio(f[0].wakeups_per_min(), f[1].wakeups_per_min()),
        ratio(f[0].cpu_ms_per_min(), f[1].cpu_ms_per_min())
    );

    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    if cpus < 2 {
        println!("BENCH selfish detour: skipped (one CPU)");
    } else {
        // The loop owns CPU 0; this process's other threads (the metadata emulator: off
        // the node on EC2) stay on CPU 1.
        noise::pin_process(std::process::id(), 1).unwrap();
        let mut with = noise::Detour::default();
        let mut without = noise::Detour::default();
        let mut bare = noise::Detour::default();
        let span = Duration::from_secs(detour_secs);
        for _ in 0..rounds {
            // Nothing of ours on CPU 0.
            noise::pin_process(slurmd, 1).unwrap();
            noise::pin_process(agent, 1).unwrap();
            bare.add(noise::detour(0, span).unwrap());
            // slurmd on CPU 0, the daemon away.
            noise::pin_process(slurmd, 0).unwrap();
            without.add(noise::detour(0, span).unwrap());
            // Both on CPU 0.
            noise::pin_process(agent, 0).unwrap();
            with.add(noise::detour(0, span).unwrap());
        }
        let line = |name: &str, x: &noise::Detour| {
            println!(
                "BENCH selfish detour on CPU 0, {name}: {:.1} us lost per second in {:.1} detours per second (> {} us each)",
                x.lost_us_per_sec(),
                x.detours as f64 / x.secs,
                noise::DETOUR_THRESHOLD.as_micros()
            );
        };
        line("nothing of the node's", &bare);
        line("slurmd", &without);
        line("slurmd and the daemon", &with);
        println!(
            "BENCH selfish detour, daemon on the loop's CPU / daemon away: {:.2} (slurmd there in both); slurmd there / nothing: {:.2}",
            with.lost_us_per_sec() / without.lost_us_per_sec().max(1e-9),
            without.lost_us_per_sec() / bare.lost_us_per_sec().max(1e-9)
        );
    }
    d.stop().unwrap();
}

#[test]
fn the_daemon_runs_the_health_checks_on_its_schedule() {
    let flag = "/tmp/slurm-e2e-health-flag-".to_string() + &std::process::id().to_string();
    let _ = fs::remove_file(&flag);
    let w = World::start("hc1", &[], "");
    fs::write(
        w.path("nhc.conf"),
        format!("* || check_file_test -f {flag}\n"),
    )
    .unwrap();
    w.write_settings(&format!(
        "[health]\nnhc_conf = [\"{}\"]\nchecks_dir = \"{}\"\ninterval = \"1s\"\n",
        w.path("nhc.conf").display(),
        w.path("checks.d").display()
    ));
    let mut d = w.daemon("agent-health", None);
    // Failing check: drained with the health prefix, within a few intervals.
    let state = w.wait_state("drained by the health check", |s| s.contains("DRAIN"));
    assert!(state.contains("DRAIN"), "{state}");
    assert!(
        w.reason().starts_with("slurm-node-agent/health@"),
        "{}",
        w.reason()
    );
    assert!(w.reason().contains(&flag), "{}", w.reason());
    // The drain is the state machine's (issue 36): `status`, drain.json and the drain
    // metrics show it as a `health` cause, with the reason Slurm has.
    // (drain.json is saved just after Slurm took the drain.)
    let st = w.wait_cause("health");
    assert!(
        st["phase"] == "draining" || st["phase"] == "drained",
        "{st}"
    );
    assert_eq!(st["reason"].as_str(), Some(w.reason().as_str()), "{st}");
    let prom = slurm_e2e::read_prom(&w.path("state/drain.prom"));
    assert!(
        prom.contains("slurm_node_agent_drain_cause{kind=\"health\"} 1"),
        "{prom}"
    );
    // An operator's `resume` lifts the health check's drain (it is the agent's own).
    d.stop().unwrap();
    let out = w.run_agent(&["resume", "--output", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    w.wait_state("resumed by the operator", |s| {
        s.starts_with("IDLE") && !s.contains("DRAIN")
    });
    let st = w.status();
    assert_eq!(
        (&st["phase"], &st["cause"]),
        (&"active".into(), &Value::Null),
        "{st}"
    );
    // The daemon again: drained again, then the fix resumes it.
    let mut d = w.daemon("agent-health-2", None);
    w.wait_state("drained again", |s| s.contains("DRAIN"));
    w.wait_cause("health");
    // Fixed: resumed by the daemon, and the state machine back to active.
    fs::write(&flag, "").unwrap();
    w.wait_state("resumed after the check passes", |s| {
        s.starts_with("IDLE") && !s.contains("DRAIN")
    });
    w.wait_phase("active");
    d.stop().unwrap();
    let _ = fs::remove_file(&flag);
}

#[test]
fn repair_in_report_mode_says_what_it_would_do_against_a_real_slurmctld_and_changes_nothing_more() {
    let w = World::start("rp1", &[], "");
    // A hardware fault (a CPU count the host does not have: replace); the NHC line is
    // judged by its family, as a check file's would be.
    fs::write(w.path("nhc.conf"), "* || check_hw_cpuinfo 64 4096 8192\n").unwrap();
    w.write_settings(&format!(
        "[health]\nnhc_conf = [\"{}\"]\nchecks_dir = \"{}\"\ninterval = \"1s\"\n\n\
         [repair]\nmode = \"report\"\n",
        w.path("nhc.conf").display(),
        w.path("checks.d").display()
    ));
    let mut d = w.daemon("agent-repair", None);
    // The health checks drain as before; the repair only says what it would do, once.
    w.wait_state("drained by the health check", |s| s.contains("DRAIN"));
    let said = "REPAIR (report): would replace rp1 for check_hw_cpuinfo 64 4096 8192: hardware_degraded (the auto table)";
    wait_until(
        "the repair's plan logged",
        WAIT,
        Duration::from_millis(100),
        || Ok((log_count(&d, said) >= 1).then_some(())),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", d.log_tail(40)));
    // The plan is logged before repair.json is saved: wait for the record, not the line.
    let st = wait_until(
        "the repair's plan in status",
        WAIT,
        Duration::from_millis(100),
        || {
            let st = w.status();
            Ok((!st["repair"]["plan"].is_null()).then_some(st))
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", d.log_tail(40)));
    assert_eq!(st["repair"]["plan"]["action"], "replace", "{st}");
    assert_eq!(st["repair"]["mode"], "report", "{st}");
    assert_eq!(st["cause"], "health", "{st}");
    let prom = slurm_e2e::read_prom(&w.path("state/repair.prom"));
    assert!(
        prom.contains(
            "slurm_node_agent_repair_planned_total{mode=\"report\",action=\"replace\",fault=\"hardware_degraded\"} 1"
        ),
        "{prom}"
    );
    // The same fault at every pass: still said once.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(log_count(&d, said), 1, "{}", d.log_tail(40));
    d.stop().unwrap();
}

/// Issue 38 §1, `repair.mode = "on"`, a reboot-class fault on a node running a job: the
/// health drain becomes the repair's (reason `... [reboot after jobs]`) once the node holds
/// a slot of the budget (comment `repair@`); the job completes; only then does Slurm run
/// the RebootProgram; back from the reboot with the checks passing the node is IDLE with
/// no reason of the agent's, the drain machine `active`, and the slot released.
#[test]
fn repair_on_reboots_a_faulty_node_after_its_job_through_slurm_and_gives_the_slot_back() {
    let (_scratch, flag, marker, mut w) = flagged_reboot_world(
        "rr1",
        "[repair]\nmode = \"on\"\nsettle = \"1s\"\n[[repair.checks]]\ncheck = \"check_file_test\"\naction = \"reboot\"\n",
    );
    let job_done = w.submit_job(6);
    let mut d = w.daemon("agent-repair-on", None);
    wait_until(
        "the repair's drain",
        WAIT,
        Duration::from_millis(100),
        || Ok(w.reason().ends_with(" [reboot after jobs]").then_some(())),
    )
    .unwrap_or_else(|e| panic!("{e}: {}\n{}", w.reason(), d.log_tail(40)));
    assert!(
        w.reason().starts_with("slurm-node-agent/repair@i-"),
        "{}",
        w.reason()
    );
    let held = slots(&w);
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[0].1, "rr1");
    assert!(
        held[0].2.starts_with("slurm-node-agent/repair@i-"),
        "{held:?}"
    );
    let st = w.state();
    assert!(
        st.starts_with("ALLOCATED") || st.starts_with("MIXED"),
        "the job must still run: {st}"
    );
    assert_eq!(w.status()["cause"], "repair");

    // The job completes; then Slurm reboots the node.
    wait_until("RebootProgram", WAIT, Duration::from_millis(100), || {
        Ok(marker.exists().then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", d.log_tail(40)));
    assert_eq!(fs::read_to_string(&job_done).unwrap().trim(), "done");
    // The boot fixed it: the checks pass when slurmd is back (slurmd -b).
    fs::write(&flag, "ok").unwrap();
    drop(w.slurmd.take());
    w.slurmd = Some(
        Slurmd::spawn(
            &w.ctld,
            "rr1",
            &NodeKind::Dynamic(NODE_CONF.into()),
            &["-b"],
        )
        .unwrap(),
    );
    w.ctld
        .wait_node_state(
            "rr1",
            |s| slurm_e2e::is_idle(s) && !s.contains("DRAIN"),
            WAIT,
        )
        .unwrap_or_else(|e| panic!("{e:#}\n{}", d.log_tail(40)));
    w.wait_phase("active");
    wait_until(
        "the slot released",
        WAIT,
        Duration::from_millis(100),
        || Ok(slots(&w).is_empty().then_some(())),
    )
    .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", slots(&w), d.log_tail(40)));
    assert_eq!(fs::read_to_string(&marker).unwrap().lines().count(), 1);
    // The reboot is in the node's repair history (a fault back within
    // repair.replace_within_boots boots would call for a replacement).
    let record: Value =
        serde_json::from_str(&fs::read_to_string(w.path("state/repair.json")).unwrap()).unwrap();
    assert_eq!(
        record["reboots"][0]["check"],
        format!("check_file_test -f {}", flag.display()),
        "{record}"
    );
    assert!(record.get("slot").is_none(), "{record}");
    d.stop().unwrap();
}

/// A replace-class fault (an NHC hardware check this host fails) with `repair.mode = "on"`
/// for `w`'s agent, and `upgrade.poweroff_unit` a unit of `sd` that only notes that it
/// ran, in the returned file.
fn replace_class_fault(w: &World, sd: &slurm_e2e::UserSystemd) -> PathBuf {
    let off = w.path("powered-off");
    fs::write(
        sd.unit_dir().join("sna-poweroff.service"),
        format!(
            "[Service]\nType=oneshot\nExecStart=/bin/sh -c 'echo off >> {}'\n",
            off.display()
        ),
    )
    .unwrap();
    sd.daemon_reload().unwrap();
    fs::create_dir_all(w.path("checks.d")).unwrap();
    fs::write(w.path("nhc.conf"), "* || check_hw_cpuinfo 64 4096 8192\n").unwrap();
    w.write_settings(&format!(
        "[systemd]\nbus = \"{}\"\n\n[upgrade]\npoweroff_unit = \"sna-poweroff.service\"\n\n\
         [health]\nnhc_conf = [\"{}\"]\nchecks_dir = \"{}\"\ninterval = \"1s\"\n\n\
         [repair]\nmode = \"on\"\nsettle = \"1s\"\n",
        sd.bus_address(),
        w.path("nhc.conf").display(),
        w.path("checks.d").display()
    ));
    off
}

/// Issue 38 §1, `repair.mode = "on"`, a replace-class fault (a hardware check): the node
/// drains with `... [replace after jobs]`, takes a slot, and once no job runs leaves by the
/// upgrade's way out: the reason becomes `... [powered off for replacement at <time>]` and systemd
/// starts `upgrade.poweroff_unit`, once; the slot stays for the replacement to release.
#[test]
fn repair_on_replaces_a_node_with_a_hardware_fault_by_the_poweroff_way_out() {
    let sd = slurm_e2e::UserSystemd::start().unwrap();
    let w = World::start("rp2", &[], "");
    let off = replace_class_fault(&w, &sd);
    let job_done = w.submit_job(4);
    let mut d = w.daemon("agent-repair-replace", None);
    wait_until(
        "the repair's drain",
        WAIT,
        Duration::from_millis(100),
        || Ok(w.reason().ends_with(" [replace after jobs]").then_some(())),
    )
    .unwrap_or_else(|e| panic!("{e}: {}\n{}", w.reason(), d.log_tail(40)));
    wait_until("poweroff", WAIT, Duration::from_millis(100), || {
        Ok(off.exists().then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", d.log_tail(40)));
    assert_eq!(fs::read_to_string(&job_done).unwrap().trim(), "done");
    assert!(
        w.reason().starts_with("slurm-node-agent/repair@i-")
            && w.reason().contains(" [powered off for replacement at "),
        "{}",
        w.reason()
    );
    let held = slots(&w);
    assert_eq!(held.len(), 1, "{held:?}");
    assert!(
        held[0].2.starts_with("slurm-node-agent/repair@i-"),
        "{held:?}"
    );
    w.wait_phase("done");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(fs::read_to_string(&off).unwrap().lines().count(), 1);
    let said = "REPAIR: drained for the replace once no job runs";
    assert_eq!(log_count(&d, said), 1, "{}", d.log_tail(40));
    d.stop().unwrap();
}

/// Issue 41 §2.1-2: an operator's `drain` then `resume` of a node whose slurmd has not
/// registered (UNKNOWN: declared in slurm.conf, never started). Slurm before 26.05.2
/// refuses the RESUME with ESLURM_INVALID_NODE_STATE although it cleared the drain, and
/// the words of refusals changed in 25.11: the agent decides from the record after the
/// call, so `resume` succeeds on every release and the record holds no drain.
#[test]
fn resume_of_a_node_that_never_registered_is_decided_from_the_record() {
    let host = slurm_e2e::slurm::short_hostname().unwrap();
    let port = slurm_e2e::free_port();
    let node = "un1";
    let ctld = Slurmctld::builder("drain")
        .line(format!(
            "NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} {NODE_CONF}"
        ))
        .partition(format!(
            "PartitionName=only Nodes={node} Default=YES MaxTime=INFINITE State=UP"
        ))
        .start()
        .unwrap();
    let root = TempRoot::new("drain-e2e-").unwrap();
    fs::create_dir_all(root.path().join("conf.d")).unwrap();
    let w = World {
        slurmd: None,
        ctld,
        imds: Emulator::start(Config::default()).unwrap(),
        moto: None,
        root,
        node: node.to_string(),
    };
    w.write_settings("");
    let st = w.state();
    assert!(st.starts_with("UNKNOWN"), "{st}");
    let out = w.run_agent(&["drain", "--reason", "kernel update"]);
    assert!(out.status.success(), "{out:?}");
    assert!(w.state().contains("DRAIN"), "{}", w.state());
    let out = w.run_agent(&["resume"]);
    assert!(out.status.success(), "{out:?}");
    let st = w.state();
    assert!(!st.contains("DRAIN"), "{st}");
    // What slurmctld answers itself, for the record: refused or not, the drain is gone.
    let direct = w
        .ctld
        .scontrol(&["update", &format!("NodeName={node}"), "State=RESUME"])
        .unwrap();
    eprintln!("scontrol RESUME of an UNKNOWN node that is not drained: {direct:?}");
}

/// Issue 38 §1, `replace` for a node of Slurm's power saving (`State=CLOUD`), against a
/// real slurmctld with `SuspendProgram` and `ResumeProgram`: once no job runs the agent
/// does not power the instance off itself but asks Slurm (`scontrol update
/// State=POWER_DOWN_ASAP` with the reason `... [powered off for replacement at <time>]`);
/// slurmctld takes it (the node POWERING_DOWN or POWERED_DOWN) and runs `SuspendProgram`
/// for the node, the way the site's power saving ends an instance; the agent's own
/// power-off unit is never started.
#[test]
fn repair_on_replaces_a_cloud_node_through_slurms_power_down() {
    let sd = slurm_e2e::UserSystemd::start().unwrap();
    let root = TempRoot::new("drain-e2e-").unwrap();
    fs::create_dir_all(root.path().join("conf.d")).unwrap();
    let suspended = root.path().join("suspended");
    let resumed = root.path().join("resumed");
    let program = |name: &str, out: &Path| {
        let p = root.path().join(name);
        fs::write(&p, format!("#!/bin/sh\necho \"$1\" >> {}\n", out.display())).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        p
    };
    let suspend = program("suspend.sh", &suspended);
    let resume = program("resume.sh", &resumed);
    let host = slurm_e2e::slurm::short_hostname().unwrap();
    let port = slurm_e2e::free_port();
    let node = "cl1";
    let ctld = Slurmctld::builder("drain")
        .line(format!("SuspendProgram={}", suspend.display()))
        .line(format!("ResumeProgram={}", resume.display()))
        .line("SuspendTime=3600")
        .line("SuspendTimeout=5")
        .line("ResumeTimeout=60")
        .line(format!(
            "NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} {NODE_CONF} State=CLOUD"
        ))
        .partition(format!(
            "PartitionName=cloud Nodes={node} Default=YES MaxTime=INFINITE State=UP"
        ))
        .start()
        .unwrap();
    // Slurm powers the node up (ResumeProgram), then its slurmd registers.
    ctld.scontrol_ok(&["update", &format!("NodeName={node}"), "State=POWER_UP"])
        .unwrap();
    wait_until("ResumeProgram", WAIT, Duration::from_millis(100), || {
        Ok(resumed.exists().then_some(()))
    })
    .unwrap();
    // `-b`: slurmd reports its start as the boot (slurmctld waits for a boot after the
    // power-up it asked for; this host booted long before).
    let slurmd = Slurmd::spawn(&ctld, node, &NodeKind::Static, &["-b"]).unwrap();
    ctld.wait_node_idle(node, WAIT).unwrap();
    let w = World {
        slurmd: Some(slurmd),
        ctld,
        imds: Emulator::start(Config::default()).unwrap(),
        moto: None,
        root,
        node: node.to_string(),
    };
    let st = w.ctld.node_state(node).unwrap().unwrap_or_default();
    assert!(st.contains("CLOUD"), "{st}");
    let off = replace_class_fault(&w, &sd);
    let job_done = w.submit_job(3);
    let mut d = w.daemon("agent-repair-power-down", None);
    wait_until(
        "SuspendProgram for the node",
        WAIT,
        Duration::from_millis(100),
        || {
            Ok(fs::read_to_string(&suspended)
                .is_ok_and(|s| s.lines().any(|l| l == node))
                .then_some(()))
        },
    )
    .unwrap_or_else(|e| panic!("{e}: {}\n{}", w.reason(), d.log_tail(40)));
    assert_eq!(fs::read_to_string(&job_done).unwrap().trim(), "done");
    let st = w.ctld.node_state(node).unwrap().unwrap_or_default();
    assert!(st.contains("POWER"), "{st}");
    let r = w.reason();
    assert!(
        r.starts_with("slurm-node-agent/repair@i-")
            && r.contains(" [powered off for replacement at "),
        "{r} ({st})"
    );
    w.wait_phase("done");
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        !off.exists(),
        "the agent's own power-off ran for a CLOUD node"
    );
    let said = "scontrol update State=POWER_DOWN_ASAP";
    assert_eq!(log_count(&d, said), 1, "{}", d.log_tail(40));
    d.stop().unwrap();
}

/// Issue 38 §2: the operator's `repair` command, as SSM runs it: `--clear-history` and
/// `--lift-breaker --for 30m` write `repair-operator.json` (the running daemon's next pass
/// takes it: unit-tested in `daemon::pass_tests`), say what they did, and neither option is a usage
/// error (exit 2) that writes nothing.
#[test]
fn the_repair_command_clears_the_history_and_lifts_the_breaker() {
    let w = World::start("rpc1", &[], "");
    let out = w.run_agent(&["repair", "--output", "json"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(!w.path("state/repair-operator.json").exists());
    let out = w.run_agent(&[
        "repair",
        "--clear-history",
        "--lift-breaker",
        "--for",
        "30m",
        "--output",
        "json",
    ]);
    assert!(out.status.success(), "{out:?}");
    let said: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(said["node"], "rpc1");
    let (cleared, until) = (
        said["history_cleared_at"].as_i64().unwrap(),
        said["breaker_lifted_until"].as_i64().unwrap(),
    );
    assert_eq!(until - cleared, 1800, "{said}");
    let record: Value =
        serde_json::from_str(&fs::read_to_string(w.path("state/repair-operator.json")).unwrap())
            .unwrap();
    assert_eq!(record["history_cleared_at"], cleared, "{record}");
    assert_eq!(record["breaker_lifted_until"], until, "{record}");
    let out = w.run_agent(&["repair", "--lift-breaker", "--for", "soon"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--for"),
        "{out:?}"
    );
}

/// How many times `needle` appears in the daemon's log.
fn log_count(d: &Daemon, needle: &str) -> usize {
    d.log_tail(100_000).matches(needle).count()
}

#[test]
fn a_desired_image_missing_in_ec2_drains_nothing_and_is_logged_each_interval() {
    let w = World::start(
        "img1",
        &[],
        "[upgrade]\nparameter = \"/desired\"\ninterval = \"300ms\"\naction = \"none\"\n",
    )
    .with_moto();
    let moto = w.moto.as_ref().unwrap();
    moto.put_parameter("/desired", MISSING_AMI, "String")
        .unwrap();
    let mut d = w.daemon("agent", None);
    let missing =
        format!("desired image {MISSING_AMI} (SSM parameter /desired) does not exist in EC2");
    wait_until(
        "missing image logged 3 times",
        WAIT,
        Duration::from_millis(100),
        || Ok((log_count(&d, &missing) >= 3).then_some(())),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", d.log_tail(40)));
    assert!(d.log_tail(200).contains("ERROR"), "{}", d.log_tail(20));
    assert!(slurm_e2e::is_idle(&w.state()), "{}", w.state());
    assert_eq!(w.status()["phase"], "active");

    // The same daemon, once the parameter names an image that exists: it drains.
    let desired = w.new_image("node-v2");
    moto.put_parameter("/desired", &desired, "String").unwrap();
    w.wait_state("drained for the upgrade", |s| s.contains("DRAIN"));
    assert!(
        w.reason().ends_with(&format!("{RUNNING_AMI} -> {desired}")),
        "{}",
        w.reason()
    );
    d.stop().unwrap();
}

#[test]
fn a_powered_off_node_record_holds_no_budget_slot() {
    // `gone1` is the record of a node whose instance powered off for the upgrade while an
    // older agent's reason stayed on it: its slurmd never answers again (nothing listens on
    // 127.0.0.2), so slurmctld shows it not responding, drained, with the upgrade reason.
    let w = World::start(
        "bud1",
        &[
            "SlurmdTimeout=6".into(),
            "NodeName=gone1 NodeAddr=127.0.0.2 CPUs=1 RealMemory=100 State=UNKNOWN".into(),
        ],
        "[upgrade]\nparameter = \"/desired\"\ninterval = \"300ms\"\naction = \"none\"\n\
         max_unavailable = \"1\"\nbudget_wait = \"300ms\"\n",
    )
    .with_moto();
    let desired = w.new_image("node-v2");
    let old = format!(
        "slurm-node-agent/upgrade@i-0aaaaaaaaaaaaaaaa: image upgrade {RUNNING_AMI} -> {desired}"
    );
    w.ctld
        .scontrol_ok(&[
            "update",
            "nodename=gone1",
            "state=drain",
            &format!("reason={old}"),
        ])
        .unwrap();
    let gone = w
        .ctld
        .wait_node_state(
            "gone1",
            |s| s.contains("NOT_RESPONDING") || s.contains('*'),
            WAIT,
        )
        .unwrap();
    assert!(gone.contains("DRAIN"), "{gone}");

    // With max_unavailable = 1 that record used to take the only slot for ever.
    w.moto
        .as_ref()
        .unwrap()
        .put_parameter("/desired", &desired, "String")
        .unwrap();
    let mut d = w.daemon("agent", None);
    w.wait_state("bud1 drained for the upgrade", |s| s.contains("DRAIN"));
    assert!(
        w.reason().ends_with(&format!("{RUNNING_AMI} -> {desired}")),
        "{}",
        w.reason()
    );
    assert!(
        !d.log_tail(400).contains("budget used up"),
        "{}",
        d.log_tail(40)
    );
    d.stop().unwrap();
}

/// The reservations that are upgrade budget slots: `(name, nodes, comment)`.
fn slots(w: &World) -> Vec<(String, String, String)> {
    let out = w
        .ctld
        .scontrol_ok(&["show", "reservation", "-o"])
        .unwrap_or_default();
    out.lines()
        .filter(|l| l.contains("ReservationName=slurm-node-agent-upgrade-"))
        .map(|l| {
            let f = |k| field(l, k).unwrap_or_default().to_string();
            (f("ReservationName"), f("Nodes"), f("Comment"))
        })
        .collect()
}

/// Issue 25 §4: a slot left by a node that died while holding it (its instance gone, the
/// record not responding) keeps the budget of 1 used up only until the reservation ends on
/// slurmctld's clock; then this node takes the slot, drains, upgrades in place (a hook) and,
/// back in service on the new image, releases it. Meanwhile the node never drained.
#[test]
fn a_slot_left_by_a_dead_node_ends_and_the_upgrade_proceeds_then_the_slot_is_released() {
    let w = World::start(
        "slot1",
        &[
            "SlurmdTimeout=6".into(),
            "NodeName=dead1 NodeAddr=127.0.0.2 CPUs=1 RealMemory=100 State=UNKNOWN".into(),
        ],
        "",
    )
    .with_moto();
    let hook = w.script("hook.sh", "exit 0");
    w.write_settings(&format!(
        "[upgrade]\nparameter = \"/desired\"\ninterval = \"300ms\"\naction = \"hook\"\n\
         hook = [\"{}\"]\nmax_unavailable = \"1\"\nbudget_wait = \"300ms\"\n\
         slot_timeout = \"2m\"\n",
        hook.display()
    ));
    // The only slot, taken by an instance of dead1 that no longer exists, for one minute.
    w.ctld
        .scontrol_ok(&[
            "create",
            "reservation",
            "ReservationName=slurm-node-agent-upgrade-main-slot-1",
            "StartTime=now",
            "Duration=1",
            "Nodes=dead1",
            "Users=root",
            "Flags=IGNORE_JOBS,OVERLAP",
            "Comment=slurm-node-agent/upgrade@i-0deaddeaddeaddead",
        ])
        .unwrap();
    let desired = w.new_image("node-v2");
    w.moto
        .as_ref()
        .unwrap()
        .put_parameter("/desired", &desired, "String")
        .unwrap();
    let mut d = w.daemon("agent", None);
    wait_until(
        "waiting for a slot",
        WAIT,
        Duration::from_millis(200),
        || Ok((log_count(&d, "every upgrade budget slot is held") >= 2).then_some(())),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", d.log_tail(40)));
    assert!(!w.state().contains("DRAIN"), "{}", w.state());
    // The dead node's slot ends (Duration=1: within a minute and slurmctld's next pass);
    // this node takes it and drains.
    let mut seen = Vec::new();
    wait_until(
        "slot1 holds the slot",
        Duration::from_secs(180),
        Duration::from_millis(300),
        || {
            // Slot first, then the drain: drained (read first) implies the slot held.
            let drained = w.state().contains("DRAIN");
            seen = slots(&w);
            let held = seen.iter().any(|s| s.1 == "slot1");
            assert!(!drained || held, "drained without a slot: {seen:?}");
            Ok(held.then_some(()))
        },
    )
    .unwrap_or_else(|e| panic!("{e}: {seen:?}\n{}", d.log_tail(40)));
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].0, "slurm-node-agent-upgrade-main-slot-1");
    assert!(
        seen[0].2.starts_with("slurm-node-agent/upgrade@"),
        "{seen:?}"
    );
    // The hook ran and resumed the node: up to date and in service, it releases the slot.
    wait_until(
        "the slot released",
        WAIT,
        Duration::from_millis(200),
        || Ok(slots(&w).is_empty().then_some(())),
    )
    .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", slots(&w), d.log_tail(40)));
    assert!(!w.state().contains("DRAIN"), "{}", w.state());
    assert!(
        d.log_tail(400).contains("released the upgrade budget slot"),
        "{}",
        d.log_tail(40)
    );
    d.stop().unwrap();
}

/// Waits until daemon `d` has logged `UPGRADE LOOP` `n` times (one per check).
fn wait_for_upgrade_loop_logs(d: &Daemon, n: usize) {
    wait_until(
        &format!("UPGRADE LOOP logged {n} times"),
        WAIT,
        Duration::from_millis(100),
        || Ok((log_count(d, "UPGRADE LOOP") >= n).then_some(())),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", d.log_tail(40)));
}

/// Waits until the world's poweroff unit ran (`off` exists), then checks the reason
/// instance `instance` wrote on the way out for the upgrade to `desired`.
fn wait_powered_off(w: &World, d: &Daemon, off: &Path, instance: &str, desired: &str) {
    wait_until("poweroff", WAIT, Duration::from_millis(100), || {
        Ok(off.exists().then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", d.log_tail(40)));
    assert_eq!(
        w.reason(),
        format!(
            "slurm-node-agent/upgrade@{instance}: powered off for image upgrade {RUNNING_AMI} -> {desired}"
        )
    );
}

/// A world with moto whose upgrade (parameter `/desired`, checked every 300 ms) powers off
/// through `sna-poweroff.service` of a confined manager, which appends a line to the file
/// returned for each run (the "poweroff" of this node).
fn poweroff_world(node: &str) -> (slurm_e2e::UserSystemd, World, PathBuf) {
    let sd = slurm_e2e::UserSystemd::start().unwrap();
    let w = World::start(node, &[], "").with_moto();
    let off = w.path("powered-off");
    fs::write(
        sd.unit_dir().join("sna-poweroff.service"),
        format!(
            "[Service]\nType=oneshot\nExecStart=/bin/sh -c 'echo off >> {}'\n",
            off.display()
        ),
    )
    .unwrap();
    sd.daemon_reload().unwrap();
    w.write_settings(&format!(
        "[systemd]\nbus = \"{}\"\n\n[upgrade]\nparameter = \"/desired\"\ninterval = \"300ms\"\n\
         action = \"poweroff\"\npoweroff_unit = \"sna-poweroff.service\"\n",
        sd.bus_address()
    ));
    (sd, w, off)
}

#[test]
fn a_powered_off_node_is_marked_and_a_replacement_on_the_old_image_does_not_loop() {
    let (_sd, w, off) = poweroff_world("loop1");
    let desired = w.new_image("node-v2");
    w.moto
        .as_ref()
        .unwrap()
        .put_parameter("/desired", &desired, "String")
        .unwrap();
    let first = "i-0aaaaaaaaaaaaaaaa";
    w.imds.set("instance-id", first);
    let mut d = w.daemon("agent-1", None);
    // On the way out the reason says so: the record holds no budget slot.
    wait_powered_off(&w, &d, &off, first, &desired);
    d.stop().unwrap();

    // The replacement: a new instance with the same NodeName and an empty state folder,
    // launched from the old image (the launch template does not follow the parameter).
    let second = "i-0bbbbbbbbbbbbbbbb";
    w.imds.set("instance-id", second);
    fs::remove_dir_all(w.path("state")).unwrap();
    let mut d2 = w.daemon("agent-2", None);
    wait_for_upgrade_loop_logs(&d2, 3);
    assert!(
        w.reason().starts_with(&format!(
            "slurm-node-agent/upgrade@{second}: replacement still runs {RUNNING_AMI}, not {desired} that instance {first} drained for"
        )),
        "{}",
        w.reason()
    );
    assert!(w.state().contains("DRAIN"), "{}", w.state());
    assert_eq!(
        fs::read_to_string(&off).unwrap().lines().count(),
        1,
        "powered off again"
    );

    // The operator points the parameter at the image the fleet runs: the drain is lifted.
    w.moto
        .as_ref()
        .unwrap()
        .put_parameter("/desired", RUNNING_AMI, "String")
        .unwrap();
    w.ctld
        .wait_node_idle("loop1", WAIT)
        .unwrap_or_else(|e| panic!("{e}\n{}", d2.log_tail(40)));
    d2.stop().unwrap();
}

/// Issue 37 §4: the loop guard is keyed by the instance's launch time, not its NodeName.
/// An instance with no predecessor under its NodeName (an Auto Scaling replacement named
/// after its host) that was launched after the desired image was published and still runs
/// the old one drains with a reason saying so, holds a budget slot and never powers off;
/// once the image is published again (the launch template fixed), the same node upgrades
/// from the slot it holds. Fails if the guard matches by name only (it would power off at
/// once) or never lets go.
#[test]
fn an_instance_launched_after_the_publication_on_the_old_image_stops_the_rollout_under_any_name() {
    let (_sd, w, off) = poweroff_world("fresh1");
    let desired = w.new_image("node-v2");
    let moto = w.moto.as_ref().unwrap();
    moto.put_parameter("/desired", &desired, "String").unwrap();
    // Launched 65 s after the publication (beyond the 60 s launch race), from the old image.
    let published = slurm_e2e::unix_now();
    let id = "i-0cccccccccccccccc".to_string();
    w.imds.set("instance-id", id.clone());
    w.imds.set_dynamic(
        "instance-identity/document",
        slurm_e2e::identity_document(&id, RUNNING_AMI, published + 65),
    );
    let mut d = w.daemon("agent-1", None);
    wait_for_upgrade_loop_logs(&d, 2);
    assert_eq!(
        w.reason(),
        format!(
            "slurm-node-agent/upgrade@{id}: replacement still runs {RUNNING_AMI}, not {desired} \
             that /desired named before this instance launched: launch template does not follow /desired"
        )
    );
    assert!(w.state().contains("DRAIN"), "{}", w.state());
    assert!(
        !off.exists(),
        "powered off although launched after the publication"
    );
    let held = slots(&w);
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[0].1, "fresh1", "{held:?}");

    // The launch template fixed, the image is published again (LastModifiedDate after the
    // launch): the node upgrades from the slot it holds.
    while slurm_e2e::unix_now() < published + 7 {
        std::thread::sleep(Duration::from_millis(200));
    }
    moto.put_parameter("/desired", &desired, "String").unwrap();
    wait_powered_off(&w, &d, &off, &id, &desired);
    assert!(
        d.log_tail(400)
            .contains("was published again after this instance launched"),
        "{}",
        d.log_tail(40)
    );
    d.stop().unwrap();
}

/// Installs `sna-agent.service` in the confined manager `sd`: `slurm-node-agent run` with
/// the world's settings and environment as a `Type=notify` unit, its output appended to
/// `agent.log` in the world's folder, plus `service` lines (`WatchdogSec=...`).
fn install_agent_unit(w: &World, sd: &slurm_e2e::UserSystemd, service: &str) -> PathBuf {
    let cmd = w.agent(&["run"]);
    let argv: Vec<String> = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let env: String = cmd
        .get_envs()
        .filter_map(|(k, v)| {
            v.map(|v| {
                format!(
                    "Environment=\"{}={}\"\n",
                    k.to_string_lossy(),
                    v.to_string_lossy()
                )
            })
        })
        .collect();
    let log = w.path("agent.log");
    fs::write(
        sd.unit_dir().join("sna-agent.service"),
        format!(
            "[Unit]\nDescription=slurm-node-agent under test\n\n[Service]\nType=notify\n\
             ExecStart={}\n{env}StandardOutput=append:{log}\nStandardError=append:{log}\n\
             {service}\n",
            argv.join(" "),
            log = log.display()
        ),
    )
    .unwrap();
    sd.daemon_reload().unwrap();
    log
}

#[test]
fn a_25_second_hook_under_a_10_second_watchdog_runs_once_to_completion() {
    let sd = slurm_e2e::UserSystemd::start().unwrap();
    let w = World::start("wd1", &[], "").with_moto();
    let ran = w.path("hook.log");
    let hook = w.script(
        "hook.sh",
        &format!(
            "echo start >> {r}; sleep 25; echo end >> {r}",
            r = ran.display()
        ),
    );
    w.write_settings(&format!(
        "[upgrade]\nparameter = \"/desired\"\ninterval = \"1s\"\naction = \"hook\"\nhook = [\"{}\"]\n",
        hook.display()
    ));
    let desired = w.new_image("node-v2");
    w.moto
        .as_ref()
        .unwrap()
        .put_parameter("/desired", &desired, "String")
        .unwrap();
    let log = install_agent_unit(
        &w,
        &sd,
        "WatchdogSec=10s\nRestart=on-failure\nRestartSec=1s\nTimeoutStartSec=60s",
    );
    // Type=notify: `start` returns once the daemon sent READY=1.
    sd.systemctl_ok(&["start", "sna-agent.service"])
        .unwrap_or_else(|e| panic!("{e:#}\n{}", slurm_e2e::process::tail_file(&log, 40)));
    wait_until(
        "the hook finished",
        Duration::from_secs(180),
        Duration::from_millis(250),
        || {
            Ok(fs::read_to_string(&ran)
                .unwrap_or_default()
                .contains("end")
                .then_some(()))
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", slurm_e2e::process::tail_file(&log, 40)));
    let st = w.wait_phase("active");
    assert_eq!(st["state"]["applied_image"], desired.as_str());
    w.ctld.wait_node_idle("wd1", WAIT).unwrap();
    assert_eq!(
        fs::read_to_string(&ran).unwrap(),
        "start\nend\n",
        "the hook ran once, to completion"
    );
    assert_eq!(
        sd.unit_property("sna-agent.service", "NRestarts").unwrap(),
        "0"
    );
    assert_eq!(
        sd.unit_property("sna-agent.service", "ActiveState")
            .unwrap(),
        "active",
        "{}",
        slurm_e2e::process::tail_file(&log, 40)
    );
    assert!(
        !slurm_e2e::process::tail_file(&log, 1000).contains("Watchdog timeout"),
        "{}",
        slurm_e2e::process::tail_file(&log, 40)
    );
    sd.systemctl_ok(&["stop", "sna-agent.service"]).unwrap();
}

#[test]
fn without_instance_metadata_the_unit_is_ready_and_says_what_it_waits_for() {
    let sd = slurm_e2e::UserSystemd::start().unwrap();
    let w = World::start("nomd1", &[], "");
    // Nothing listens there: IMDS never answers.
    let closed = format!("http://127.0.0.1:{}", slurm_e2e::free_port());
    w.write_settings("");
    let text = fs::read_to_string(w.path("agent.toml"))
        .unwrap()
        .replace(&w.imds.endpoint(), &closed);
    fs::write(w.path("agent.toml"), text).unwrap();
    let log = install_agent_unit(&w, &sd, "WatchdogSec=10s\nTimeoutStartSec=20s");
    sd.systemctl_ok(&["start", "sna-agent.service"])
        .unwrap_or_else(|e| panic!("{e:#}\n{}", slurm_e2e::process::tail_file(&log, 40)));
    assert_eq!(
        sd.unit_property("sna-agent.service", "ActiveState")
            .unwrap(),
        "active"
    );
    wait_until(
        "status names the wait",
        WAIT,
        Duration::from_millis(200),
        || {
            let status = sd.unit_property("sna-agent.service", "StatusText")?;
            Ok(status
                .contains("waiting for instance metadata")
                .then_some(status))
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", slurm_e2e::process::tail_file(&log, 40)));
    // Still alive past the watchdog interval: the loop answers it while IMDS does not.
    std::thread::sleep(Duration::from_secs(12));
    assert_eq!(
        sd.unit_property("sna-agent.service", "NRestarts").unwrap(),
        "0"
    );
    assert_eq!(
        sd.unit_property("sna-agent.service", "ActiveState")
            .unwrap(),
        "active",
        "{}",
        slurm_e2e::process::tail_file(&log, 40)
    );
    sd.systemctl_ok(&["stop", "sna-agent.service"]).unwrap();
}

#[test]
fn a_truncated_or_empty_state_file_is_set_aside_and_the_commands_carry_on() {
    let w = World::start("trunc1", &[], "");
    fs::create_dir_all(w.path("state")).unwrap();
    let state = w.path("state/drain.json");
    let aside = |w: &World| -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = fs::read_dir(w.path("state"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().contains("drain.json.corrupt-"))
            .collect();
        v.sort();
        v
    };
    // status
    fs::write(&state, "{\"version\": 1, \"phase\": \"drain").unwrap();
    let out = w.run_agent(&["status", "--output", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(json(&out)["phase"], "active");
    assert!(String::from_utf8_lossy(&out.stderr).contains("CORRUPT STATE FILE"));
    let kept = aside(&w);
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(
        fs::read_to_string(&kept[0]).unwrap(),
        "{\"version\": 1, \"phase\": \"drain"
    );
    // drain, then resume, each over an empty file
    fs::write(&state, "").unwrap();
    let out = w.run_agent(&["drain", "--reason", "bad DIMM"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    w.wait_state("drained", |s| s.contains("DRAIN"));
    fs::write(&state, "").unwrap();
    let out = w.run_agent(&["resume"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    w.ctld.wait_node_idle("trunc1", WAIT).unwrap();
    assert_eq!(aside(&w).len(), 3);
    // run
    fs::write(&state, "{").unwrap();
    let mut d = w.daemon("agent", None);
    wait_until("daemon running", WAIT, Duration::from_millis(100), || {
        d.check_running()?;
        Ok(d.log_tail(200).contains("agent running").then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", d.log_tail(40)));
    assert!(d.log_tail(200).contains("CORRUPT STATE FILE"));
    assert_eq!(aside(&w).len(), 4);
    d.stop().unwrap();
}

#[test]
fn a_drain_in_the_state_folder_is_continued_only_while_slurms_record_names_this_instance() {
    const THIS: &str = "i-1234567890abcdef0"; // the emulator's default
    const OTHER: &str = "i-0bbbbbbbbbbbbbbbb";
    // Before 23.11 the record names no instance: the state file alone decides.
    let named = slurm_e2e::install::version().unwrap().has_instance_fields();
    let w = World::start("own1", &[], "");
    let out = w.run_agent(&["drain", "--reason", "kernel update", "--output", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reason = format!("slurm-node-agent/operator@{THIS}: kernel update");
    assert_eq!(w.reason(), reason);
    let set_record_instance = |id: &str| {
        w.ctld
            .scontrol_ok(&[
                "update",
                &format!("NodeName={}", w.node),
                &format!("InstanceId={id}"),
            ])
            .unwrap();
        assert_eq!(field(&w.node_line(), "InstanceId"), Some(id));
    };
    let started = |d: &Daemon| {
        wait_until("agent running", WAIT, Duration::from_millis(100), || {
            Ok(d.log_tail(400).contains("agent running").then_some(()))
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log_tail(40)));
    };
    let set_aside = || -> Vec<PathBuf> {
        fs::read_dir(w.path("state"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("drain.json.predecessor-"))
            })
            .collect()
    };

    // The record names this instance: its drain is continued.
    if named {
        set_record_instance(THIS);
    }
    let mut d = w.daemon("agent-1", None);
    started(&d);
    w.wait_phase("drained");
    assert!(
        d.log_tail(400).contains("continuing the drain in progress"),
        "{}",
        d.log_tail(40)
    );
    assert!(!d.log_tail(400).contains("not continued"));
    d.stop().unwrap();
    assert!(set_aside().is_empty());
    if !named {
        return;
    }

    // Another instance has registered the NodeName since (the record says so): the drain
    // in this instance's state folder is not this instance's to continue. It is moved
    // aside, the daemon starts with no drain, and nothing changes in Slurm.
    set_record_instance(OTHER);
    let kept = fs::read(w.path("state/drain.json")).unwrap();
    let mut d = w.daemon("agent-2", None);
    started(&d);
    let log = d.log_tail(400);
    assert!(
        log.contains(&format!(
            "the drain in progress in the state folder is instance {OTHER}'s, not this instance's: not continued"
        )),
        "{log}"
    );
    assert!(!log.contains("continuing the drain in progress"), "{log}");
    let st = w.status();
    assert_eq!(st["phase"], "active", "{st}");
    let aside = set_aside();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(fs::read(&aside[0]).unwrap(), kept);
    assert!(w.state().contains("DRAIN"), "{}", w.state());
    assert_eq!(w.reason(), reason);
    d.stop().unwrap();
}

/// Issue 40 §2: a node in a Capacity Block for ML (EC2's calls served by the project's
/// emulator: moto has no capacity reservations) whose end is within
/// `events.capacity_block_lead` of EC2's reclaim (30 minutes before the end) drains with
/// the block and its end in the reason, its running job is requeued before the reclaim
/// (`events.spot_job_action = "requeue"`), and an extension of the block lifts the drain.
#[test]
fn a_capacity_block_ending_drains_requeues_the_job_and_its_extension_lifts_the_drain() {
    use slurm_e2e::imds_emulator::ec2::{CapacityReservation, Ec2Emulator, Ec2Instance};
    const ME: &str = "i-0cb0000000000000a";
    const CR: &str = "cr-0cb00000000000001";
    let w = World::start(
        "cb1",
        &[],
        "[events]\ninterval = \"1s\"\ncapacity_block_interval = \"1s\"\n\
         capacity_block_lead = \"1m\"\nspot_job_action = \"requeue\"\n\
         spot_job_action_lead = \"10m\"\n",
    );
    w.imds.set("instance-id", ME);
    let ec2 = Ec2Emulator::start().unwrap();
    let (key, secret, token) = ("ASIACAPACITYBLOCK001", "cb-secret", "cb-token");
    ec2.add_instance(Ec2Instance {
        instance_id: ME.into(),
        instance_type: "p5.48xlarge".into(),
        availability_zone: "us-east-1a".into(),
        instance_lifecycle: Some("capacity-block".into()),
        capacity_reservation_id: Some(CR.into()),
        role: "compute".into(),
        access_key_id: key.into(),
        secret_access_key: secret.into(),
        session_token: Some(token.into()),
    });
    let now = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap();
    // A day-long block that ends in two hours: its reclaim is 90 minutes away.
    ec2.put_capacity_reservation(CapacityReservation {
        id: CR.into(),
        instance_type: "p5.48xlarge".into(),
        availability_zone: "us-east-1a".into(),
        total_instance_count: 1,
        state: "active".into(),
        start_date: now - 86_400 + 7200,
        end_date: Some(now + 7200),
        reservation_type: "capacity-block".into(),
    });
    let job = w.requeueable_job_running();
    let mut c = w.agent(&["run"]);
    c.env("AWS_ENDPOINT_URL_EC2", ec2.endpoint())
        .env("AWS_ACCESS_KEY_ID", key)
        .env("AWS_SECRET_ACCESS_KEY", secret)
        .env("AWS_SESSION_TOKEN", token)
        .env("AWS_REGION", "us-east-1");
    let mut d = Daemon::spawn("agent", c, w.root.path()).unwrap();
    // Out of the lead: looked up, nothing drained.
    wait_until(
        "the daemon to look the block up",
        WAIT,
        Duration::from_millis(200),
        || {
            Ok(ec2
                .requests()
                .iter()
                .any(|r| {
                    r.action.as_deref() == Some("DescribeCapacityReservations") && r.status == 200
                })
                .then_some(()))
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{:?}\n{}", ec2.requests(), d.log_tail(30)));
    // The lookup was read: the block, its end and when the node would drain are in the
    // journal; two more lookups (one a second) decided nothing.
    wait_until(
        "the block announced",
        WAIT,
        Duration::from_millis(200),
        || {
            Ok(d.log_tail(200)
                .contains("in a Capacity Block: draining events.capacity_block_lead before")
                .then_some(()))
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", d.log_tail(30)));
    let seen = ec2.requests().len();
    wait_until("two more lookups", WAIT, Duration::from_millis(200), || {
        Ok((ec2.requests().len() >= seen + 2).then_some(()))
    })
    .unwrap();
    assert!(!w.state().contains("DRAIN"), "{}", w.state());

    // The block ends sooner (as booked): its reclaim within the lead, the node drains.
    let end = now + 1800 + 30;
    ec2.set_end_date(CR, Some(end));
    w.wait_state("drained for the block", |s| s.contains("DRAIN"));
    let reason = w.reason();
    assert!(
        reason.starts_with(&format!(
            "slurm-node-agent/capacity-block@{ME}: capacity block {CR} ends "
        )),
        "{reason}"
    );
    // The job is requeued before the reclaim: pending, the node drained under it.
    wait_until("the job requeued", WAIT, Duration::from_millis(200), || {
        Ok((w.job_state(&job) == "PENDING").then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", d.log_tail(40)));
    let st = w.status();
    assert_eq!(st["state"]["job_action_done"], true, "{st}");
    assert!(
        d.log_tail(200)
            .contains("requeueing jobs before the capacity block's reclaim"),
        "{}",
        d.log_tail(60)
    );

    // Extended by a day: the drain is lifted; the requeued job is still queued (Slurm holds
    // a requeued batch job back a while before it is eligible again), not lost.
    ec2.set_end_date(CR, Some(end + 86_400));
    w.wait_state("the drain lifted", |s| !s.contains("DRAIN"));
    w.assert_lifted("after the extension");
    let st = w.job_state(&job);
    assert!(st == "PENDING" || st == "RUNNING", "job {job}: {st}");
    assert!(
        d.log_tail(200)
            .contains("the Capacity Block's end moved (extended)"),
        "{}",
        d.log_tail(60)
    );
    d.stop().unwrap();
}

/// Issue 41 §2.7: a node already draining for an upgrade (a job still running, the upgrade
/// waiting for it) gets a spot interruption notice: the spot cause outranks the upgrade
/// (`escalate`: the reason is the spot's), and the spot job action (`requeue`) happens
/// before the interruption, not after the upgrade's wait for the job; the upgrade's action
/// (`reboot`) never runs.
#[test]
fn a_spot_notice_during_an_upgrade_drain_takes_over_and_its_job_action_runs_before_the_deadline() {
    let root = TempRoot::new("drain-spot-up-").unwrap();
    let rebooted = root.path().join("rebooted");
    let reboot = root.path().join("reboot.sh");
    fs::write(
        &reboot,
        format!("#!/bin/sh\necho rebooted >> {}\n", rebooted.display()),
    )
    .unwrap();
    fs::set_permissions(&reboot, fs::Permissions::from_mode(0o755)).unwrap();
    let w = World::start(
        "su1",
        &[format!("RebootProgram={}", reboot.display())],
        "[upgrade]\nparameter = \"/cluster/compute/desired-ami\"\ninterval = \"1s\"\naction = \"reboot\"\n\n\
         [events]\nspot_interval = \"200ms\"\nspot_job_action = \"requeue\"\nspot_job_action_lead = \"5m\"\n",
    )
    .with_moto();
    let desired_ami = w.new_image("node-v2");
    w.moto
        .as_ref()
        .unwrap()
        .put_parameter("/cluster/compute/desired-ami", &desired_ami, "String")
        .unwrap();
    let job = w.requeueable_job_running();
    let mut d = w.daemon("agent", None);
    w.wait_state("drained for the upgrade", |s| s.contains("DRAIN"));
    assert!(
        w.reason().starts_with("slurm-node-agent/upgrade@"),
        "{}",
        w.reason()
    );
    w.wait_phase("draining");
    // The job runs on: the upgrade waits for it (10 minutes). The spot notice comes: two
    // minutes to the interruption, within the 5 min lead.
    w.imds
        .set_spot_instance_action("terminate", &in_two_minutes());
    let st = w.wait_cause("spot");
    assert_eq!(st["phase"], "draining", "{st}");
    assert!(
        w.reason().starts_with("slurm-node-agent/spot@"),
        "{}",
        w.reason()
    );
    wait_until("the job requeued", WAIT, Duration::from_millis(200), || {
        Ok((w.job_state(&job) == "PENDING").then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", d.log_tail(40)));
    assert!(
        d.log_tail(200)
            .contains("requeueing jobs before the spot interruption"),
        "{}",
        d.log_tail(60)
    );
    let st = w.wait_phase("drained");
    assert_eq!(st["state"]["job_action_done"], true, "{st}");
    assert_eq!(st["cause"], "spot", "{st}");
    // The spot drain has no action: the upgrade's reboot never comes.
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        !rebooted.exists(),
        "the upgrade's reboot ran under a spot drain"
    );
    d.stop().unwrap();
}
