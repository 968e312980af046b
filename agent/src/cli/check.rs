//! `slurm-node-agent check`: run the node's health checks once and act on the result.
//!
//! Slurm's `HealthCheckProgram` is the same command as a program of its own,
//! `slurm-node-agent-healthcheck` (src/healthcheck_main.rs), which slurmd runs without
//! arguments and which links only this path. Either way it needs no PATH (every program
//! is run by absolute path), takes the node name from `SLURMD_NODENAME`, and never waits
//! on an unreachable controller for longer than `health.scontrol_timeout`. Its drains and
//! resumes go through the drain state machine's gateway (`node_state::Gateway`: recorded
//! in `drain.json` under `drain.lock`, waited for at most `health.scontrol_timeout`). A
//! healthy run
//! makes no `scontrol` call once a run of the same boot found no health drain of the
//! agent's in Slurm (a cache in the state folder; see `health::act`): the first run of
//! each boot, and every run without a state folder, asks Slurm; nor does a passing run that
//! Slurm 26.05 tells `SLURM_NODE_IS_HEALTHY=yes`.
//!
//! slurmd runs its HealthCheckProgram at its start, before it registers: a failing run
//! that cannot drain the node then (no record yet, or one its registration may return to
//! service) keeps the drain in the state folder for bootstrap, which makes it once slurmd
//! has registered (`health::act::PendingDrain`). The report says how slurmd runs the
//! program on this node, read from the node's slurm.conf (`slurmd:` in text, `"slurmd"` in
//! JSON; `crate::slurm::healthcheck`): at its start and every `HealthCheckInterval`, only
//! at its start (`START_ONLY`, 25.11+), only after `scontrol reboot` (`REBOOT_ONLY`,
//! 26.05+), or never.
//!
//! Exit status: 0 healthy; 1 a fatal check failed or hung, or a check file could not be
//! used (a failing check naming the file and line); 74 the report could not be written to
//! stdout; 78 invalid settings, or a `--checks-dir`/`--nhc-conf` given that does not exist.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;

use super::{print_error, Output, SettingsArgs};
use crate::exit::Exit;
use crate::health::{self, ActOptions, ActOutcome, RunEnv};
use crate::identity;
use crate::settings;

/// Arguments of `check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Settings sources.
    #[command(flatten)]
    pub settings: SettingsArgs,
    /// An LBNL NHC configuration file to read, besides `health.nhc_conf` (repeatable).
    #[arg(long = "nhc-conf", value_name = "FILE")]
    pub nhc_conf: Vec<PathBuf>,
    /// Folder of TOML check files (default: `health.checks_dir`).
    #[arg(long, value_name = "DIR")]
    pub checks_dir: Option<PathBuf>,
    /// Result format on stdout.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Report only: do not drain or resume the node, nor run NHC service actions (`-S`,
    /// `-r`, `-c`), nor move a corrupt bootstrap record aside.
    #[arg(long)]
    pub no_act: bool,
    /// Prometheus textfile to write (default: `health.prometheus_textfile`).
    #[arg(long, value_name = "FILE")]
    pub prometheus_textfile: Option<PathBuf>,
}

impl CheckArgs {
    /// Runs the checks; returns the exit code.
    pub async fn run(self) -> Exit {
        let flags = match self.settings.flag_layers() {
            Ok(f) => f,
            Err(e) => {
                print_error(&e);
                return Exit::Config;
            }
        };
        let inputs = match settings::pipeline::Inputs::read(&self.settings.paths(), &flags) {
            Ok(i) => i,
            Err(e) => {
                print_error(&e);
                return Exit::Config;
            }
        };
        // The one identity rule (crate::identity), without IMDS: SLURMD_NODENAME, flags,
        // bootstrap's record (with the tags and user data it read), node.name.
        // --no-act changes nothing on disk: a corrupt bootstrap record is only reported.
        let corrupt_record = match self.no_act {
            true => identity::CorruptRecord::Leave,
            false => identity::CorruptRecord::SetAside,
        };
        let (mut s, ident) = match identity::resolve_local(&inputs, corrupt_record) {
            Ok((r, id)) => (r.settings, Some(id)),
            Err(identity::IdentityError::NoName { .. }) => {
                match inputs.resolve(settings::Enforce::WarnAndIgnore) {
                    Ok(r) => (r.settings, None),
                    Err(e) => {
                        print_error(&e);
                        return Exit::Config;
                    }
                }
            }
            Err(e) => {
                print_error(&e);
                return e.exit();
            }
        };
        // Paths given on the command line must exist (only the defaults are optional).
        let missing = self
            .checks_dir
            .iter()
            .map(|d| (d, "--checks-dir"))
            .chain(self.nhc_conf.iter().map(|f| (f, "--nhc-conf")))
            .find(|(p, _)| !p.exists());
        if let Some((p, flag)) = missing {
            super::print_error_message(&format!(
                "command line: {flag} {}: no such file or folder (given explicitly, so it must exist)",
                p.display()
            ));
            return Exit::Config;
        }
        // slurmd kills its HealthCheckProgram after HealthCheckTimeout (26.05+), else 60 s
        // (slurmd's run_script limit): a run that may take longer (the checks, then
        // scontrol's `show node`, the wait for drain.lock and the `update`, each under
        // health.scontrol_timeout) is killed before it drains anything.
        // A login node is not in slurmctld: its checks are reported, never acted on.
        if s.node.role == crate::nodedef::Role::Login {
            s.health.act = false;
        }
        let longest = s.health.run_deadline.0 + 3 * s.health.scontrol_timeout.0;
        let conf = crate::slurm::client_config(
            &s.slurm.bin_dir,
            std::env::var_os("SLURM_CONF").as_deref(),
            |p| p.exists(),
        );
        if s.health.act && !self.no_act {
            let (limit, from) = crate::slurm::health_check_timeout(conf.as_deref());
            if longest >= limit {
                super::print_warning_message(&format!(
                    "health.run_deadline ({}) + 3 x health.scontrol_timeout ({}: show, the \
                     drain lock, then update) is {} s or more: slurmd kills its \
                     HealthCheckProgram after {} s ({from}), before a hung check could drain \
                     the node",
                    humantime::format_duration(s.health.run_deadline.0),
                    humantime::format_duration(s.health.scontrol_timeout.0),
                    limit.as_secs(),
                    limit.as_secs(),
                ));
            }
        }
        if let Some(d) = self.checks_dir {
            s.health.checks_dir = d;
        }
        s.health.nhc_conf.extend(self.nhc_conf);
        if let Some(p) = self.prometheus_textfile {
            s.health.prometheus_textfile = p;
        }
        let node = ident.as_ref().map(|i| i.node_name.clone());
        let target = s.health_target(node.clone());
        let checks = match health::load(&s.health, &s.slurm.bin_dir, &target) {
            Ok(c) => c,
            Err(e) => {
                print_error(&e);
                return Exit::Config;
            }
        };
        let mut env = RunEnv::new(&s.health, &s.systemd.bus);
        env.node = node.clone();
        // The EFA check's last counter reading is kept in the agent's state folder.
        env.host.state_dir = s.agent.state_dir.clone();
        // Report only: no NHC -S/-r/-c service starts either.
        env.service_actions = !self.no_act;
        // How slurmd runs its HealthCheckProgram here, read beside the checks (slurmd -V
        // only where the release changes the answer: START_ONLY, REBOOT_ONLY,
        // health_check_report).
        let slurmd_runs = async {
            let hc = crate::slurm::healthcheck::HealthCheckConf::read(conf.as_deref()?)
                .map_err(|e| tracing::debug!("{e}"))
                .ok()?;
            let version = match hc.depends_on_version() {
                true => {
                    let slurmd = crate::slurm::version::slurmd_path(&s.slurm.bin_dir);
                    crate::slurm::version::slurmd_version(&slurmd).await
                }
                false => None,
            };
            Some(hc.runs(version))
        };
        let (report, slurmd_runs) =
            futures_lite::future::zip(health::run_checks(&checks, &env), slurmd_runs).await;
        let action: Option<ActOutcome> = match (&node, s.health.act && !self.no_act) {
            (_, false) => None,
            (None, true) => Some(ActOutcome {
                action: "none".into(),
                detail: "node name unknown (no SLURMD_NODENAME, node.name or bootstrap state)"
                    .into(),
                state: None,
                error: None,
            }),
            (Some(n), true) => {
                // The incarnation from the identity, else from bootstrap's record.
                let instance_id = match &ident {
                    Some(i) => i.instance_id.clone(),
                    None => identity::Recorded::read(
                        &s.agent.state_dir,
                        identity::CorruptRecord::SetAside,
                    )
                    .map_or_else(
                        || crate::reason::UNKNOWN_INSTANCE.to_string(),
                        |r| r.instance_id,
                    ),
                };
                let mut opts = ActOptions::new(&s.agent.state_dir);
                // Slurm 26.05 with health_check_report, on the runs slurmctld asks for.
                opts.node_health = health::act::node_health_hint(
                    std::env::var_os("SLURM_NODE_IS_HEALTHY").as_deref(),
                );
                // drain.json, drain.lock and Slurm through the drain state machine's
                // gateway, each call and the lock's wait under health.scontrol_timeout.
                let gateway = health::act::health_gateway(
                    s.node_gateway(n).with_instance(&instance_id),
                    &s.health,
                );
                Some(health::act_on(&report, &gateway, &opts).await)
            }
        };
        if !s.health.prometheus_textfile.as_os_str().is_empty() {
            // The checks' verdict stands (the exit code is theirs); the textfile is a report.
            if let Err(e) = health::output::write_prometheus(&report, &s.health.prometheus_textfile)
            {
                super::print_warning_message(&format!(
                    "Prometheus textfile not written (the checks' result stands): {e}"
                ));
            }
        }
        let text = match self.output {
            Output::Text => health::output::text(&report, action.as_ref(), slurmd_runs.as_ref()),
            Output::Json => format!(
                "{}\n",
                health::output::json(&report, action.as_ref(), slurmd_runs.as_ref())
            ),
        };
        // Not print!: a closed or full stdout is an I/O error (74), not a panic.
        let mut out = std::io::stdout().lock();
        if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            super::print_error_message(&format!("writing the report to stdout: {e}"));
            return Exit::IoErr;
        }
        if let Some(e) = action.as_ref().and_then(|a| a.error.as_ref()) {
            super::print_warning_message(e);
        }
        if report.healthy() {
            Exit::Ok
        } else {
            Exit::Unhealthy
        }
    }
}
