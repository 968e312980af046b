//! Bootstrap of a login node (`node.role = "login"`): the key, munge (auth/munge only), the
//! mounts and cloud-init as on a compute node, then sackd instead of slurmd, until the
//! client commands reach slurmctld through sackd's configuration and credentials.
//!
//! A login node is not a Slurm node: no node definition (its name, `node.name` or the
//! template, only names it in the report, the record and the logs), no slurmd (one that
//! runs is stopped), no lifecycle scripts, no drain, no record of slurmctld's to look at.

use std::time::{Duration, Instant};

use super::join::{running_for, FETCH_REFUSED_AFTER};
use super::{BootstrapError, Report, Steps, Timer};
use crate::authkey::{self, AuthType, Prefetch};
use crate::identity::Recorded;
use crate::pcs::Managed;
use crate::retry::Backoff;
use crate::slurm::{self, sackd, Scontrol, SlurmVersion};
use crate::systemd::Systemd;

/// Runs a login node's bootstrap after the settings, the metadata and the managed
/// registration (`cx`): the key (`prefetch`, or the registration's in the managed mode),
/// munge with auth/munge, the mounts and cloud-init together, slurmd stopped, sackd
/// (re)started with its options, then [`wait_ready`].
///
/// # Errors
/// [`BootstrapError`]: `node.role` (exit 78) on an image without sackd or with a Slurm
/// before 23.11; the key, mounts, systemd, as on a compute node; [`BootstrapError::Refused`]
/// (exit 65) when slurmctld refuses sackd; [`BootstrapError::Join`] (exit 75) at
/// `slurm.join_deadline`.
pub(super) async fn run(
    cx: &Steps<'_>,
    prefetch: Option<Prefetch>,
    managed: Option<&Managed>,
    mut t: Timer,
) -> Result<Report, BootstrapError> {
    let s = cx.s;
    let version = sackd::check_login(&s.slurm)
        .await
        .map_err(|e| cx.key_error("node.role", format!("\"login\": {e}")))?;
    let name = crate::nodedef::node_name(&s.node, cx.id)
        .map_err(|e| cx.key_error(e.key(), e.to_string()))?;

    // The key and the connection to systemd together, as on a compute node.
    let persist = managed.map(|m| tokio::task::spawn_blocking(m.persist(&s.agent.state_dir)));
    let key = super::install_key(cx, prefetch, persist);
    let connect = async { Ok::<_, BootstrapError>(Systemd::connect(&s.systemd.bus).await?) };
    let (key_changed, systemd) = tokio::try_join!(key, connect)?;
    t.done("auth_key");

    // munge (auth/munge: sackd and the client commands authenticate through it), the
    // mounts and cloud-init together; slurmd is stopped meanwhile (a login node runs none:
    // one left from a compute role, or started by hand, would register a node).
    let munge = async {
        let job = match s.auth.auth_type {
            AuthType::Munge if key_changed => {
                Some(systemd.queue_restart(&s.slurm.munge_unit).await?)
            }
            AuthType::Munge => Some(systemd.queue_start(&s.slurm.munge_unit).await?),
            AuthType::Slurm => None,
        };
        if let Some(job) = job {
            job.wait().await?;
        }
        Ok::<_, BootstrapError>(())
    };
    let mounts = async {
        let mount_env = crate::mounts::MountEnv::for_bus(&s.systemd.bus);
        crate::mounts::ensure_all(&s.mounts, &cx.id.region, &mount_env, &systemd)
            .await
            .map_err(BootstrapError::from)
    };
    let cloud_init = async {
        crate::cloudinit::CloudInit::default()
            .wait_and_log()
            .await
            .map_err(BootstrapError::CloudInit)
    };
    let no_slurmd = async {
        let state = systemd
            .active_state(&s.slurm.slurmd_unit)
            .await
            .unwrap_or_default();
        if matches!(state.as_str(), "active" | "activating" | "reloading") {
            tracing::warn!(unit = %s.slurm.slurmd_unit, "a login node runs no slurmd: stopping it");
            slurm::slurmd::stop(&systemd, &s.slurm.slurmd_unit).await?;
        }
        Ok::<_, BootstrapError>(())
    };
    tokio::try_join!(munge, mounts, cloud_init, no_slurmd)?;
    t.done("mounts");

    let sack_key = (s.auth.auth_type == AuthType::Slurm)
        .then(|| authkey::KeyTarget::from_settings(&s.auth).path);
    let restart = sackd::prepare(&s.slurm, sack_key.as_deref(), key_changed, &systemd)
        .await
        .map_err(|e| match e {
            sackd::SackdError::Options(e) => BootstrapError::Options(e),
            sackd::SackdError::Systemd(e) => BootstrapError::Systemd(e),
        })?;
    systemd.start_no_wait(&s.slurm.sackd_unit).await?;
    t.done("sackd");
    let ping = wait_ready(cx, &name, &systemd, version).await?;
    t.done("join");
    tracing::info!(login_node = %name, %ping, "login node ready: the client commands reach slurmctld through sackd");

    Recorded::of_login(cx.id, cx.metadata, &name).write(&s.agent.state_dir)?;
    Ok(Report {
        slurm_release: None,
        role: crate::nodedef::Role::Login,
        node_name: name,
        state: LOGIN_READY.into(),
        instance_id: cx.id.instance_id.clone(),
        dynamic_conf: None,
        key_changed,
        slurmd_restarted: false,
        sackd_restarted: restart,
        drain: None,
        replaced_instance_id: None,
        total_ms: u64::try_from(t.start.elapsed().as_millis()).unwrap_or(u64::MAX),
        steps: t.steps(),
        lifecycle: Vec::new(),
    })
}

/// How many times sackd is started again after it stopped by itself, before bootstrap
/// gives up ([`BootstrapError::DaemonExits`]).
const MAX_SACKD_EXITS: u32 = 3;

/// The least pause before sackd is started again after it stopped.
const RESTART_PAUSE: Duration = Duration::from_secs(3);

/// The report's `state` of a login node once the client commands work.
pub const LOGIN_READY: &str = "LOGIN (sackd ready)";

/// Waits until sackd has the configuration ([`slurm::CONFIG_CACHE`]) and `scontrol ping`,
/// run as a user's command is (no `SLURM_CONF_SERVER`, credentials from sackd with
/// auth/slurm), says slurmctld is UP; returns its answer. A sackd unit that stopped is
/// started again with backoff ([`Backoff::CONTROLLER`]).
///
/// # Errors
/// [`BootstrapError::Refused`] when sackd ran [`FETCH_REFUSED_AFTER`] without the
/// configuration while a configless server accepts connections (sackd retries every 10 s
/// forever: slurmctld refuses its key or auth type); [`BootstrapError::Join`] at
/// `slurm.join_deadline`.
async fn wait_ready(
    cx: &Steps<'_>,
    name: &str,
    systemd: &Systemd,
    version: Option<SlurmVersion>,
) -> Result<String, BootstrapError> {
    let s = cx.s;
    let unit = &s.slurm.sackd_unit;
    let deadline = s.slurm.join_deadline.0;
    let start = Instant::now();
    let scontrol = Scontrol::new(&s.slurm.bin_dir);
    let mut restarts = 0u32;
    let mut pause = Duration::from_millis(20);
    let mut last_error = String::from("sackd has not fetched the configuration yet");
    loop {
        let svc = systemd.service_info(unit).await.ok();
        if slurm::has_client_config(&s.slurm) {
            match scontrol.ping().await {
                Ok(out) if out.contains("is UP") => return Ok(out),
                Ok(out) => last_error = format!("scontrol ping: {out}"),
                Err(e) => last_error = e.to_string(),
            }
        } else if let Some(v) = &svc {
            let ran = running_for(v);
            if ran >= FETCH_REFUSED_AFTER {
                if let Some(controller) = slurm::diagnose::controller_accepting(&s.slurm).await {
                    return Err(BootstrapError::Refused {
                        node_name: name.to_string(),
                        controller,
                        auth_type: s.auth.auth_type,
                        key_path: authkey::KeyTarget::from_settings(&s.auth).path,
                        version,
                        daemon: "sackd",
                        unit: unit.clone(),
                        ran,
                    });
                }
            }
            if matches!(v.active_state.as_str(), "failed" | "inactive") {
                // sackd exits only for what is wrong on this node (its run folder, its key,
                // its user): slurmctld refusing it makes it retry, not exit. A few exits in
                // a row are not waited out until the deadline.
                if restarts >= MAX_SACKD_EXITS {
                    return Err(BootstrapError::DaemonExits {
                        unit: unit.clone(),
                        exits: restarts + 1,
                        result: v.result.clone(),
                    });
                }
                // At least RESTART_PAUSE apart: systemd refuses a unit started more than 5
                // times in 10 s (StartLimitBurst), and sackd's own retry is 10 s.
                let wait = Backoff::CONTROLLER.delay(restarts).max(RESTART_PAUSE);
                restarts += 1;
                last_error = format!(
                    "{unit} is {} (journalctl -u {unit} says why)",
                    v.active_state
                );
                tracing::warn!(%unit, state = %v.active_state, restarts, "sackd stopped: starting it again in {wait:?}");
                tokio::time::sleep(wait.min(deadline.saturating_sub(start.elapsed()))).await;
                let _ = systemd.reset_failed(unit).await;
                if let Err(e) = systemd.start_no_wait(unit).await {
                    last_error = e.to_string();
                }
            }
        }
        if start.elapsed() >= deadline {
            return Err(BootstrapError::Join {
                node_name: name.to_string(),
                waited: start.elapsed(),
                last_error,
            });
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 3 / 2).min(Duration::from_secs(1));
    }
}
