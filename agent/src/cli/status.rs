//! `slurm-node-agent status`: the drain state, and Slurm's view of the node.
//!
//! Text output is one `Field: value` line each (NodeName, Instance, Role, Phase, Plan,
//! Cause, Reason, Last error, Repair, Start-up gate, Waiting, Last health pass, Image,
//! Slurm release, then Slurm's State and Reason and both Slurm releases); `--output json`
//! is one object (the drain report with `instance_id`, `role`, `plan`, `health`, `image`,
//! `slurm_release`, `waiting` and `slurm`: `{state, reason, releases}` or `{error}`).
//!
//! Exit codes: 0 printed, Slurm's view included (or not asked, `--no-slurm`); 69 Slurm's
//! view could not be had (scontrol failed, slurmctld unreachable, the node unknown to it):
//! what is known locally is still printed, and the error goes to stderr; 74 the state file
//! cannot be read or is corrupt; 78 invalid settings or no node name.

use clap::Args;

use super::drain::{local_settings, Report};
use super::{print_error_message, Output, SettingsArgs};
use crate::exit::Exit;
use crate::reason::RecordHolder;
use crate::slurm::NodeInfo;

/// Exit code when Slurm's view of the node could not be obtained (sysexits EX_UNAVAILABLE).
/// Arguments of `status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Settings sources.
    #[command(flatten)]
    pub settings: SettingsArgs,
    /// Do not ask slurmctld (state file only).
    #[arg(long)]
    pub no_slurm: bool,
    /// Result format on stdout.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

impl StatusArgs {
    /// Runs the command; returns the exit code.
    pub async fn run(self) -> Exit {
        let (s, id) = match local_settings(&self.settings).await {
            Ok(v) => v,
            Err(code) => return code,
        };
        if s.node.role == crate::nodedef::Role::Login {
            return login_status(&s, &id, self.no_slurm, self.output).await;
        }
        let node = id.node_name.clone();
        let engine = s.drain_engine(&node).with_instance(&id.instance_id);
        let st = match engine.load() {
            Ok(st) => st,
            Err(e) => {
                super::print_error(&e);
                return Exit::IoErr;
            }
        };
        let mut report = Report::new(&node, "status", st);
        report.instance_id = Some(id.instance_id.clone());
        // Read only: a corrupt file is the daemon's to set aside at its next pass.
        report.repair = crate::repair::record::Record::peek(&crate::repair::record::record_path(
            &s.agent.state_dir,
        ))
        .and_then(|r| r.current);
        look_local(&mut report, &s, &id.ami_id, crate::time::now());
        let boot = crate::hostfacts::boot_id();
        report.start_gate = crate::health::startgate::GateRecord::load(&s.agent.state_dir)
            .filter(|g| boot.as_deref() == Some(g.boot_id.as_str()));
        let mut slurm_error = None;
        if !self.no_slurm {
            // Slurm's record of the node and both releases (slurmd -V; the controller's
            // `scontrol show config`), asked together.
            let (looked, releases) = futures_lite::future::zip(
                engine.ops.scontrol.show_node(&node),
                crate::slurm::skew::Releases::look(&s.slurm),
            )
            .await;
            let mut view = match looked {
                Ok(Some(n)) => slurm_view(&n, &id.instance_id),
                Ok(None) => {
                    let e = "node not known to slurmctld".to_string();
                    slurm_error = Some(e.clone());
                    serde_json::json!({ "error": e })
                }
                Err(e) => {
                    let e = crate::imds::error_chain(&e);
                    slurm_error = Some(e.clone());
                    serde_json::json!({ "error": e })
                }
            };
            if let Some(o) = view.as_object_mut() {
                o.insert("releases".into(), releases.to_json());
            }
            report.slurm = Some(view);
        }
        match self.output {
            Output::Json => report.print(Output::Json),
            Output::Text => print!("{}", render_text(&report)),
        }
        match slurm_error {
            Some(e) => {
                print_error_message(&format!("Slurm's view of node {node}: {e}"));
                Exit::Unavailable
            }
            None => Exit::Ok,
        }
    }
}

/// The folder a mount's progress record is in (the mounts' runtime folder).
const RUNTIME_DIR: &str = "/run/slurm-node-agent";

/// What `status` reads from this node's own files, `now` being the time its ages count to:
/// the role, the drain's plan, the daemon's last health pass and desired-image check, the
/// Slurm release `/opt/slurm` points at, and what a long step waits for now.
pub fn look_local(report: &mut Report, s: &crate::settings::Settings, running_ami: &str, now: i64) {
    report.role = Some(s.node.role.as_str().to_string());
    report.plan = Some(plan(&report.state, &s.upgrade));
    report.health = crate::health::LastPass::load(&s.agent.state_dir).and_then(|p| {
        let mut v = serde_json::to_value(&p).ok()?;
        v["age_s"] = (now - p.at_unix).max(0).into();
        Some(v)
    });
    let check = crate::upgrade::ImageCheck::load(&s.agent.state_dir);
    report.image = Some(serde_json::json!({
        "running": (!running_ami.is_empty()).then_some(running_ami),
        "parameter": (!s.upgrade.parameter.is_empty()).then_some(&s.upgrade.parameter),
        "desired": check.as_ref().and_then(|c| c.desired.clone()),
        "checked_unix": check.as_ref().map(|c| c.at_unix),
        "verdict": check.as_ref().map(|c| c.verdict.clone()),
    }));
    report.slurm_release = crate::slurm::installed::installed(&s.slurm.bin_dir).map(|i| {
        serde_json::json!({
            "chosen": i.current.map(|v| v.to_string()),
            "installed": i.releases.iter().map(|(v, _)| v.to_string()).collect::<Vec<_>>(),
        })
    });
    report.waiting = [
        s.agent.state_dir.as_path(),
        std::path::Path::new(RUNTIME_DIR),
    ]
    .iter()
    .filter_map(|d| crate::progress::Record::load(d))
    .filter(crate::progress::Record::process_alive)
    .collect();
}

/// What the drain does next, from its phase, its cause and `[upgrade]`.
pub fn plan(st: &crate::drain::DrainState, up: &crate::upgrade::UpgradeSettings) -> String {
    use crate::drain::Phase;
    use crate::upgrade::UpgradeAction;
    let then = match crate::drain::Engine::action_of(st, up) {
        Some(UpgradeAction::Poweroff) => format!("power off ({})", up.poweroff_unit),
        Some(UpgradeAction::Reboot) => {
            "reboot through Slurm (scontrol reboot ASAP nextstate=resume)".to_string()
        }
        Some(UpgradeAction::Hook) => format!("run the upgrade hook ({})", up.hook.join(" ")),
        Some(UpgradeAction::None) => "stay drained (upgrade.action = \"none\")".to_string(),
        None => match &st.cause {
            Some(c) => format!(
                "stay drained: a {} drain has no action of its own; it is lifted when its cause is over",
                c.kind()
            ),
            None => "stay drained".to_string(),
        },
    };
    match st.phase {
        Phase::Active => "none: the node takes jobs".to_string(),
        Phase::Draining => format!("no new jobs; once the running ones end: {then}"),
        Phase::Drained => format!("no job left; next: {then}"),
        Phase::Acting => format!("under way: {then}"),
        Phase::Done => format!("done: {then}"),
    }
}

/// `status` on a login node (`node.role = "login"`): no drain state and no record in
/// slurmctld, but sackd's unit and `scontrol ping` as the node's users would run it
/// (through sackd's configuration and credentials), and the daemon's last health pass.
/// Text: `NodeName`, `Role`, `Instance`, `sackd`, `Last health pass`, `Slurm` lines; JSON:
/// `{node, role, instance_id, sackd: {unit, state}, health, slurm: {ping} or {error}}`.
/// Exit 69 when the ping fails.
async fn login_status(
    s: &crate::settings::Settings,
    id: &crate::identity::NodeIdentity,
    no_slurm: bool,
    output: Output,
) -> Exit {
    let unit = &s.slurm.sackd_unit;
    let sackd_state = match crate::systemd::Systemd::connect(&s.systemd.bus).await {
        Ok(sd) => sd
            .active_state(unit)
            .await
            .unwrap_or_else(|e| format!("unknown ({e})")),
        Err(e) => format!("unknown ({e})"),
    };
    let mut slurm_error = None;
    let slurm = if no_slurm {
        None
    } else {
        Some(
            match crate::slurm::Scontrol::new(&s.slurm.bin_dir).ping().await {
                Ok(out) => serde_json::json!({ "ping": out }),
                Err(e) => {
                    let e = crate::imds::error_chain(&e);
                    slurm_error = Some(e.clone());
                    serde_json::json!({ "error": e })
                }
            },
        )
    };
    let health = crate::health::LastPass::load(&s.agent.state_dir).and_then(|p| {
        let mut v = serde_json::to_value(&p).ok()?;
        v["age_s"] = (crate::time::now() - p.at_unix).max(0).into();
        Some(v)
    });
    match output {
        Output::Json => println!(
            "{}",
            serde_json::json!({
                "node": id.node_name,
                "role": "login",
                "instance_id": id.instance_id,
                "sackd": { "unit": unit, "state": sackd_state },
                "health": health,
                "slurm": slurm,
            })
        ),
        Output::Text => {
            println!("NodeName: {} (not a Slurm node)", id.node_name);
            println!("Role: login");
            println!("Instance: {}", id.instance_id);
            println!("sackd: {sackd_state} ({unit})");
            println!("Last health pass: {}", health_line(health.as_ref()));
            match &slurm {
                None => println!("Slurm: not asked (--no-slurm)"),
                Some(v) => match v.get("ping").and_then(|p| p.as_str()) {
                    Some(p) => println!("Slurm: {p}"),
                    None => println!("Slurm: unavailable"),
                },
            }
        }
    }
    match slurm_error {
        Some(e) => {
            print_error_message(&format!("slurmctld from login node {}: {e}", id.node_name));
            Exit::Unavailable
        }
        None => Exit::Ok,
    }
}

/// Slurm's view of the node in the report (`slurm`): its state, and its `Reason` as Slurm
/// holds it (every space kept, without the ` [user@time]` suffix), whether that reason
/// still holds the node, the instance the record names and whether it is `instance_id`,
/// and slurmd's version.
pub fn slurm_view(n: &NodeInfo, instance_id: &str) -> serde_json::Value {
    serde_json::json!({
        "state": n.state(),
        // As Slurm holds it; `reason_held` is false for a reason that no longer holds the
        // node (23.02+ keep the last one after RESUME).
        "reason": n.reason(),
        "reason_held": n.held_reason().is_some(),
        // Slurm 23.11+: the instance the record names, and whether it is this one (null
        // where Slurm keeps none: reason::RecordHolder).
        "instance_id": n.instance().id,
        "instance_type": n.instance().instance_type,
        "record_is_this_instance": RecordHolder::of(n.instance().id, instance_id).is_this(),
        "slurmd_version": n.slurmd_version(),
    })
}

/// `Node Slurm` and `Controller Slurm` from the report's `slurm.releases`
/// ([`crate::slurm::skew::Releases::to_json`]).
pub(super) fn release_lines(r: &serde_json::Value) -> Vec<(&'static str, String)> {
    let field = |k: &str| r.get(k).and_then(|s| s.as_str());
    let node = field("node").unwrap_or("unknown (slurmd -V gave no version)");
    let controller = match (field("controller"), field("acceptance")) {
        (Some(c), Some(a)) => format!("{c} ({a})"),
        (Some(c), None) => c.to_string(),
        // scontrol's last line says it (`scontrol: fatal: ...`): one line per field.
        (None, _) => format!(
            "unknown: {}",
            field("controller_error")
                .and_then(|e| e.lines().rfind(|l| !l.trim().is_empty()))
                .unwrap_or("not asked")
                .trim()
        ),
    };
    vec![
        ("Node Slurm", node.to_string()),
        ("Controller Slurm", controller),
    ]
}

/// The text rendering: one `Field: value` line each, fields that are not set left out.
pub fn render_text(r: &Report) -> String {
    let mut lines: Vec<(&str, String)> = vec![("NodeName", r.node.clone())];
    if let Some(i) = &r.instance_id {
        lines.push(("Instance", i.clone()));
    }
    let since = if r.state.since > 0 {
        format!(" since {}", crate::time::format(r.state.since))
    } else {
        String::new()
    };
    if let Some(role) = &r.role {
        lines.push(("Role", role.clone()));
    }
    lines.push(("Phase", format!("{}{since}", r.phase)));
    if let Some(p) = &r.plan {
        lines.push(("Plan", p.clone()));
    }
    if let Some(c) = &r.cause {
        lines.push(("Cause", c.clone()));
    }
    if let Some(reason) = &r.reason {
        lines.push(("Reason", reason.clone()));
    }
    if let Some(f) = &r.state.foreign_reason {
        lines.push(("Admin reason", f.clone()));
    }
    if let Some(e) = &r.state.last_error {
        lines.push(("Last error", e.clone()));
    }
    if let Some(c) = &r.repair {
        lines.push((
            "Repair",
            format!(
                "{} ({} mode) since {}",
                crate::repair::describe(&c.plan, &r.node, c.mode),
                c.mode.as_str(),
                crate::time::format(c.since)
            ),
        ));
    }
    if let Some(g) = &r.start_gate {
        lines.push(("Start-up gate", gate_line(g, crate::time::now())));
    }
    for w in &r.waiting {
        lines.push((
            "Waiting",
            format!(
                "{}: {} (since {}, said {})",
                w.step,
                w.waiting_for,
                crate::time::format(w.since_unix),
                crate::time::format(w.updated_unix)
            ),
        ));
    }
    lines.push(("Last health pass", health_line(r.health.as_ref())));
    if let Some(i) = &r.image {
        lines.push(("Image", image_line(i)));
    }
    if let Some(rel) = &r.slurm_release {
        let chosen = rel["chosen"]
            .as_str()
            .unwrap_or("none of them (/opt/slurm points elsewhere)");
        let installed: Vec<&str> = rel["installed"]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
            .unwrap_or_default();
        lines.push((
            "Slurm release",
            format!("{chosen} (chosen among {})", installed.join(", ")),
        ));
    }
    match &r.slurm {
        None => lines.push(("Slurm", "not asked (--no-slurm)".to_string())),
        Some(v) => {
            if let Some(r) = v.get("releases") {
                lines.extend(release_lines(r));
            }
            if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
                lines.push(("Slurm", format!("unavailable: {e}")));
            } else {
                let field = |k: &str| v.get(k).and_then(|s| s.as_str()).map(str::to_string);
                lines.push(("Slurm State", field("state").unwrap_or_default()));
                let held = v.get("reason_held").and_then(serde_json::Value::as_bool);
                lines.push((
                    "Slurm Reason",
                    match (field("reason"), held) {
                        (Some(r), Some(false)) => {
                            format!("{r} (left from before: the node is not drained)")
                        }
                        (Some(r), _) => r,
                        (None, _) => "(none)".to_string(),
                    },
                ));
                if let Some(i) = field("instance_id") {
                    lines.push(("Slurm InstanceId", i));
                }
                if let Some(ver) = field("slurmd_version") {
                    lines.push(("Slurm Version", ver));
                }
            }
        }
    }
    let width = lines.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    lines
        .iter()
        .map(|(k, v)| format!("{:<width$} {v}\n", format!("{k}:")))
        .collect()
}

/// `passed at 2026-12-07T08:00:00Z (2m 5s ago, 14 checks, 310 ms)`, `FAILED at ...: GPUs:
/// ...`, or `none recorded yet (the daemon writes one after each pass)`.
fn health_line(h: Option<&serde_json::Value>) -> String {
    let Some(h) = h else {
        return "none recorded yet (the daemon records each pass)".to_string();
    };
    let age = crate::section::HumanDuration(std::time::Duration::from_secs(
        h["age_s"].as_u64().unwrap_or(0),
    ));
    let when = crate::time::format(h["at_unix"].as_i64().unwrap_or(0));
    let head = format!(
        "at {when} ({age} ago, {} checks, {} ms)",
        h["checks"].as_u64().unwrap_or(0),
        h["duration_ms"].as_u64().unwrap_or(0)
    );
    let action = h["action"]
        .as_str()
        .map(|a| format!("; action: {a}"))
        .unwrap_or_default();
    if h["healthy"].as_bool().unwrap_or(false) {
        format!("passed {head}{action}")
    } else {
        let failed: Vec<&str> = h["failed"]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
            .unwrap_or_default();
        format!("FAILED {head}: {}{action}", failed.join("; "))
    }
}

/// `running ami-A, desired ami-B (SSM /p, checked at T: ami-A -> ami-B)`.
fn image_line(i: &serde_json::Value) -> String {
    let running = i["running"].as_str().unwrap_or("unknown");
    let Some(parameter) = i["parameter"].as_str() else {
        return format!("running {running}; no desired image (upgrade.parameter is not set)");
    };
    match i["checked_unix"].as_i64() {
        None => format!("running {running}; desired: not checked yet (SSM parameter {parameter})"),
        Some(at) => format!(
            "running {running}, desired {} (SSM parameter {parameter}, checked at {}: {})",
            i["desired"].as_str().unwrap_or("unknown"),
            crate::time::format(at),
            i["verdict"].as_str().unwrap_or("")
        ),
    }
}

/// This boot's start-up gate in one line: `running dcgm since 2026-12-07T08:00:00Z, may run
/// until 2026-12-07T08:05:30Z (5m 12s left)`, `passed (dcgm: ...)`, `failed: dcgm: ...`.
fn gate_line(g: &crate::health::startgate::GateRecord, now: i64) -> String {
    use crate::health::startgate::PartStatus;
    if let Some(p) = g.parts.iter().find(|p| p.status == PartStatus::Running) {
        let left = u64::try_from(g.deadline_unix - now).unwrap_or(0);
        return format!(
            "running {} since {}, may run until {} ({} left)",
            p.name,
            crate::time::format(p.started_unix),
            crate::time::format(g.deadline_unix),
            crate::section::HumanDuration(std::time::Duration::from_secs(left))
        );
    }
    let parts: Vec<String> = g
        .parts
        .iter()
        .map(|p| format!("{} {}: {}", p.name, p.status.as_str(), p.message))
        .collect();
    format!(
        "{} ({})",
        if g.passed() { "passed" } else { "failed" },
        parts.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drain::DrainState;

    /// An admin's reason with two spaces, as Slurm 25.11 prints it, keeps both.
    #[test]
    fn slurms_reason_is_shown_as_slurm_holds_it() {
        let line = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/slurm-25.11/scontrol-show-node-admin-drain.txt"
        ))
        .expect("fixture");
        assert!(line.contains("Reason=ADMIN  SHUTDOWN ["), "{line}");
        let mut r = Report::new("d1", "status", DrainState::default());
        r.slurm = Some(slurm_view(&NodeInfo::parse(&line), "i-0123456789abcdef0"));
        let v = r.slurm.as_ref().expect("view");
        assert_eq!(v["reason"], "ADMIN  SHUTDOWN", "{v}");
        assert_eq!(v["reason_held"], true, "{v}");
        assert_eq!(v["record_is_this_instance"], true, "{v}");
        let t = render_text(&r);
        let shown = t.lines().find(|l| l.starts_with("Slurm Reason:"));
        assert!(
            shown.is_some_and(|l| l.ends_with(" ADMIN  SHUTDOWN")),
            "{t}"
        );
    }

    /// Both releases and the controller's verdict, one line each; a refusal's scontrol
    /// error on one line.
    #[test]
    fn both_slurm_releases_are_shown_with_what_the_controller_makes_of_the_nodes() {
        use crate::slurm::skew::{ControllerReleaseError, Releases};
        let v = |s: &str| crate::slurm::SlurmVersion::parse(s);
        let shown = |r: Releases| {
            let mut rep = Report::new("d1", "status", DrainState::default());
            rep.slurm = Some(serde_json::json!({ "error": "x", "releases": r.to_json() }));
            render_text(&rep)
        };
        let t = shown(Releases {
            node: v("25.11.6"),
            controller: Ok(v("26.05.3").expect("version")),
        });
        assert!(t.contains("Node Slurm:") && t.contains(" 25.11.6\n"), "{t}");
        assert!(t.contains(" 26.05.3 (accepted)\n"), "{t}");
        let t = shown(Releases {
            node: v("26.05.3"),
            controller: Ok(v("25.11.6").expect("version")),
        });
        assert!(
            t.contains("25.11.6 (refused: slurmd 26.05.3 is newer than slurmctld 25.11.6"),
            "{t}"
        );
        let t = shown(Releases {
            node: v("26.05.3"),
            controller: Err(ControllerReleaseError::Protocol {
                line: "slurm_load_node error: Insane message length".into(),
                older_than: "26.05".into(),
            }),
        });
        let line = t
            .lines()
            .find(|l| l.starts_with("Controller Slurm:"))
            .expect("line");
        assert!(
            line.ends_with("(slurm_load_node error: Insane message length): older than 26.05"),
            "{t}"
        );
        let t = shown(Releases {
            node: None,
            controller: Err(ControllerReleaseError::NotAsked),
        });
        assert!(t.contains("unknown (slurmd -V gave no version)"), "{t}");
        assert!(t.contains("unknown: not asked (--no-slurm)"), "{t}");
    }

    #[test]
    fn text_says_when_a_reason_no_longer_holds_the_node() {
        let mut r = Report::new("gpu-1", "status", DrainState::default());
        r.slurm = Some(serde_json::json!({
            "state": "IDLE+DYNAMIC_NORM",
            "reason": "slurm-node-agent/spot@i-0abc1234: notice",
            "reason_held": false,
            "instance_id": "i-0abc1234",
            "slurmd_version": "25.11.6",
        }));
        let t = render_text(&r);
        assert!(
            t.contains("(left from before: the node is not drained)"),
            "{t}"
        );
        assert!(
            t.contains("Slurm InstanceId:") && t.contains("i-0abc1234"),
            "{t}"
        );
        assert!(t.contains("Slurm Version:") && t.contains("25.11.6"), "{t}");
    }

    #[test]
    fn text_names_each_field_and_never_prints_json() {
        let mut r = Report::new("gpu-1", "status", DrainState::default());
        r.instance_id = Some("i-0abc".into());
        r.slurm = Some(serde_json::json!({"state": "IDLE+DRAIN", "reason": "admin: disk"}));
        let t = render_text(&r);
        assert!(t.starts_with("NodeName:"), "{t}");
        for want in [
            "gpu-1\n",
            "Instance:",
            "i-0abc\n",
            "Phase:",
            "Slurm State:",
            "IDLE+DRAIN\n",
            "Slurm Reason:",
            "admin: disk\n",
        ] {
            assert!(t.contains(want), "{want:?} missing in {t}");
        }
        assert!(!t.contains('{'), "{t}");
        r.slurm = Some(serde_json::json!({"error": "slurmctld unreachable"}));
        let t = render_text(&r);
        assert!(t.contains("unavailable: slurmctld unreachable\n"), "{t}");
        assert!(!t.contains('{'), "{t}");
    }

    /// Issue 44 §2: at a glance and as JSON, from the node's own files: the role, the
    /// drain's phase and plan, the last health pass and its age, the running and desired
    /// image, the Slurm release chosen among those installed, and what a long step waits
    /// for now.
    #[test]
    fn status_shows_role_plan_health_age_images_release_and_waits() {
        let dir = tempfile::tempdir().expect("dir");
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).expect("state");
        // Two releases as the image builder lays them out; /opt/slurm points at the older.
        for v in ["25.11.7", "24.11.6"] {
            let prefix = dir.path().join(format!("slurm-{v}"));
            std::fs::create_dir_all(prefix.join("bin")).expect("prefix");
            std::fs::write(prefix.join(".slurm-build"), format!("version={v}\n")).expect("marker");
        }
        std::os::unix::fs::symlink("slurm-24.11.6", dir.path().join("slurm")).expect("link");
        let mut s = crate::settings::Settings::default();
        s.agent.state_dir = state.clone();
        s.slurm.bin_dir = dir.path().join("slurm/bin");
        s.upgrade.parameter = "/cluster/compute-image".into();
        s.upgrade.action = crate::upgrade::UpgradeAction::Reboot;
        let now = 1_800_000_000;
        crate::health::LastPass {
            at_unix: now - 125,
            duration_ms: 310,
            healthy: false,
            checks: 14,
            failed: vec!["GPUs: XID 79".into()],
            action: Some("drain".into()),
        }
        .save(&state);
        crate::upgrade::ImageCheck {
            at_unix: now - 60,
            running: "ami-0aaaaaaaaaaaaaaaa".into(),
            desired: Some("ami-0bbbbbbbbbbbbbbbb".into()),
            verdict: "ami-0aaaaaaaaaaaaaaaa -> ami-0bbbbbbbbbbbbbbbb".into(),
        }
        .save(&state);
        let mut progress = crate::progress::Progress::new(Some(&state), "bootstrap: join");
        assert!(progress.waiting("slurmd's registration with slurmctld"));
        let mut st = DrainState::default();
        st.begin(
            crate::drain::Cause::Upgrade {
                current: "ami-0aaaaaaaaaaaaaaaa".into(),
                desired: "ami-0bbbbbbbbbbbbbbbb".into(),
            },
            None,
            now - 30,
        );
        let mut r = Report::new("gpu-1", "status", st);
        look_local(&mut r, &s, "ami-0aaaaaaaaaaaaaaaa", now);
        let t = render_text(&r);
        let line = |k: &str| {
            t.lines()
                .find(|l| l.starts_with(&format!("{k}:")))
                .unwrap_or_else(|| panic!("no {k} line in\n{t}"))
                .to_string()
        };
        assert!(line("Role").ends_with(" compute"), "{t}");
        assert!(line("Phase").contains(" draining since "), "{t}");
        assert!(
            line("Plan").ends_with(
                "no new jobs; once the running ones end: reboot through Slurm (scontrol reboot ASAP nextstate=resume)"
            ),
            "{t}"
        );
        assert!(
            line("Last health pass").ends_with(
                "FAILED at 2027-01-15T07:57:55Z (2m 5s ago, 14 checks, 310 ms): GPUs: XID 79; action: drain"
            ),
            "{t}"
        );
        assert!(
            line("Image").ends_with(
                "running ami-0aaaaaaaaaaaaaaaa, desired ami-0bbbbbbbbbbbbbbbb (SSM parameter /cluster/compute-image, checked at 2027-01-15T07:59:00Z: ami-0aaaaaaaaaaaaaaaa -> ami-0bbbbbbbbbbbbbbbb)"
            ),
            "{t}"
        );
        assert!(
            line("Slurm release").ends_with(" 24.11.6 (chosen among 25.11.7, 24.11.6)"),
            "{t}"
        );
        assert!(
            line("Waiting")
                .contains(" bootstrap: join: slurmd's registration with slurmctld (since "),
            "{t}"
        );
        // The same as JSON.
        let j = serde_json::to_value(&r).expect("JSON");
        assert_eq!(j["role"], "compute");
        assert_eq!(j["phase"], "draining");
        assert!(
            j["plan"].as_str().is_some_and(|p| p.contains("reboot")),
            "{j}"
        );
        assert_eq!(j["health"]["age_s"], 125);
        assert_eq!(j["health"]["healthy"], false);
        assert_eq!(j["image"]["running"], "ami-0aaaaaaaaaaaaaaaa");
        assert_eq!(j["image"]["desired"], "ami-0bbbbbbbbbbbbbbbb");
        assert_eq!(j["slurm_release"]["chosen"], "24.11.6");
        assert_eq!(j["waiting"][0]["step"], "bootstrap: join");
        // Once the step ends, it waits for nothing.
        drop(progress);
        let mut r = Report::new("gpu-1", "status", DrainState::default());
        look_local(&mut r, &s, "ami-0aaaaaaaaaaaaaaaa", now);
        let t = render_text(&r);
        assert!(!t.contains("Waiting:"), "{t}");
        assert!(
            t.contains("Plan:") && t.contains(" none: the node takes jobs\n"),
            "{t}"
        );
    }

    #[test]
    fn the_gate_line_says_what_runs_and_for_how_long() {
        use crate::health::startgate::{GateRecord, Part, PartStatus};
        let part = |name: &str, status| Part {
            name: name.into(),
            status,
            message: "m".into(),
            budget_s: 300,
            started_unix: 1_800_000_000,
            ended_unix: None,
        };
        let mut g = GateRecord {
            boot_id: "b".into(),
            instance_id: "i-0123456789abcdef0".into(),
            started_unix: 1_800_000_000,
            deadline_unix: 1_800_000_330,
            parts: vec![
                part("dcgm", PartStatus::Passed),
                part("efa", PartStatus::Running),
            ],
        };
        assert_eq!(
            gate_line(&g, 1_800_000_018),
            "running efa since 2027-01-15T08:00:00Z, may run until 2027-01-15T08:05:30Z (5m 12s left)"
        );
        g.parts[1].status = PartStatus::Failed;
        assert_eq!(
            gate_line(&g, 1_800_000_018),
            "failed (dcgm passed: m; efa failed: m)"
        );
    }

    #[test]
    fn text_shows_the_repair_in_effect() {
        let s = crate::repair::RepairSettings {
            mode: crate::repair::RepairMode::Report,
            ..Default::default()
        };
        let failure = crate::repair::Failure {
            check: "GPUs",
            family: "gpu",
            message: "XID 79 on PCI:0000:00:1e (1x since boot)",
            timed_out: false,
        };
        let mut record = crate::repair::record::Record::default();
        record.observe(
            s.mode,
            Some((&s.plan(&[failure]).expect("a plan"), failure.message)),
            0,
        );
        let mut r = Report::new("n1", "status", DrainState::default());
        r.repair = record.current;
        let text = render_text(&r);
        assert!(
            text.lines().any(|l| l.starts_with("Repair:")
                && l.ends_with(" would replace n1 for GPUs: gpu_lost (the auto table) (report mode) since 1970-01-01T00:00:00Z")),
            "{text}"
        );
        let json = serde_json::to_value(&r).expect("JSON");
        assert_eq!(json["repair"]["plan"]["action"], "replace");
        assert_eq!(json["repair"]["mode"], "report");
    }
}
