//! The daemon's orphan pass (`[orphan]`, [`crate::orphan`]): one look at this node's record
//! in slurmctld (`scontrol show node <self>`, through the node's gateway) per
//! `OrphanSettings::interval`; the controller's `SlurmctldTimeout` read once at its first
//! answer (`scontrol show config`) and the window checked against it; and, when the watch
//! says the node is an orphan, the power-off by the upgrade's way out
//! ([`crate::upgrade::action`], `poweroff` with no record to relabel: slurmctld is gone, or
//! has no record of the node, so no reason can be written), the journal saying why.

use std::path::Path;
use std::time::{Duration, Instant};

use super::Ctx;
use crate::orphan::{Look, Watch};
use crate::upgrade::action::{self, Step, Target};
use crate::upgrade::UpgradeAction;

/// The orphan watch of the daemon, and what it has said in the journal.
#[derive(Debug)]
pub(super) struct OrphanWatch {
    watch: Watch,
    /// `SlurmctldTimeout` read and the window checked against it (armed or refused).
    window_checked: bool,
    /// The power-off unit was started.
    powering_off: bool,
    /// A pass has looked at slurmctld since the daemon started (the first waits for
    /// slurmd's configuration, as the first health pass does).
    looked: bool,
    /// The last look had no answer (the outage was logged).
    unanswered: bool,
    /// The record was missing at the last look (logged).
    missing: bool,
    /// Why the last power-off was tried (the journal's words), if one was.
    pub(super) tried: Option<crate::orphan::Orphaned>,
}

/// The file that keeps the controller's `SlurmctldTimeout` as last read, in
/// `agent.state_dir`: a daemon started while slurmctld does not answer (a node rebooted
/// after its cluster was deleted) arms its unreachable watch from it. Only the timeout is
/// kept, never a time: the window still counts from the daemon's start.
pub(super) const TIMEOUT_FILE: &str = "orphan-slurmctld-timeout.json";

#[derive(serde::Serialize, serde::Deserialize)]
struct Kept {
    /// `SlurmctldTimeout`, seconds.
    slurmctld_timeout_secs: u64,
}

fn read_kept(state_dir: &Path) -> Option<Duration> {
    let text = std::fs::read(state_dir.join(TIMEOUT_FILE)).ok()?;
    let k: Kept = serde_json::from_slice(&text).ok()?;
    Some(Duration::from_secs(k.slurmctld_timeout_secs))
}

fn keep(state_dir: &Path, t: Duration) {
    let kept = Kept {
        slurmctld_timeout_secs: t.as_secs(),
    };
    let Ok(json) = serde_json::to_vec(&kept) else {
        return;
    };
    if read_kept(state_dir) == Some(t) {
        return;
    }
    if let Err(e) = crate::fsutil::write_atomic(&state_dir.join(TIMEOUT_FILE), &json, 0o644, None) {
        tracing::warn!("ORPHAN: keeping SlurmctldTimeout: {e}");
    }
}

impl OrphanWatch {
    /// The watch as if slurmd's configuration had been waited for already (the tests' node
    /// has none: its scontrol is a stand-in).
    #[cfg(test)]
    pub(super) fn configured(mut self) -> OrphanWatch {
        self.looked = true;
        self
    }

    /// The watch of a daemon started at `start`; the unreachable watch armed from the
    /// `SlurmctldTimeout` kept in `state_dir` ([`TIMEOUT_FILE`]) when there is one (the
    /// controller's own answer counts again at its first answer).
    pub(super) fn new(
        s: &crate::orphan::OrphanSettings,
        start: Instant,
        state_dir: &Path,
    ) -> OrphanWatch {
        let mut watch = Watch::new(s, start);
        if let Some(t) = read_kept(state_dir) {
            match s.check_window(t) {
                Ok(()) => {
                    tracing::info!(
                        "ORPHAN: watching from the start: SlurmctldTimeout {} as last read \
                         ({TIMEOUT_FILE}), read again at slurmctld's first answer",
                        crate::section::HumanDuration(t)
                    );
                    watch.arm_unreachable(true);
                }
                Err(e) => tracing::error!("ORPHAN: {e} (as last read, {TIMEOUT_FILE})"),
            }
        }
        OrphanWatch {
            watch,
            window_checked: false,
            looked: false,
            powering_off: false,
            unanswered: false,
            missing: false,
            tried: None,
        }
    }
}

fn lock(ctx: &Ctx) -> Option<std::sync::MutexGuard<'_, OrphanWatch>> {
    ctx.orphan
        .as_ref()
        .map(|m| m.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
}

/// One pass: look, check the window once, decide, power off.
pub(super) async fn orphan_pass(ctx: &Ctx) {
    let s = &ctx.s;
    if lock(ctx).is_none_or(|w| w.powering_off) {
        return;
    }
    // The daemon starts beside bootstrap: until slurmd has fetched the configuration, a
    // look at slurmctld would first fetch the whole of it (per node, on a fleet booting at
    // once). The first look waits for it, one interval at most, as the first health pass
    // does; later ones look whatever the files say.
    if lock(ctx).is_some_and(|w| !w.looked) {
        let configured = super::wait_for_slurm_config(&s.slurm, s.orphan.interval()).await;
        if let Some(mut w) = lock(ctx) {
            w.looked = true;
        }
        if !configured {
            return;
        }
    }
    let (look, error) = match ctx.gateway.record().await {
        Ok(Some(_)) => (Look::Found, None),
        Ok(None) => (Look::NotFound, None),
        Err(e) => (Look::NoAnswer, Some(e)),
    };
    let check = look != Look::NoAnswer && lock(ctx).is_some_and(|w| !w.window_checked);
    if check {
        let scontrol = crate::slurm::Scontrol::configured(&s.slurm);
        match crate::slurm::ctld_config::slurmctld_timeout(&scontrol).await {
            Ok(t) => {
                keep(&s.agent.state_dir, t);
                let armed = match s.orphan.check_window(t) {
                    Ok(()) => {
                        tracing::info!(
                            node = %ctx.node,
                            "ORPHAN: watching: powers off when slurmctld does not answer for {} \
                             (orphan.after; its SlurmctldTimeout is {}) or when this node's record \
                             stays deleted for {} (orphan.record_deleted_grace)",
                            s.orphan.after,
                            crate::section::HumanDuration(t),
                            s.orphan.record_deleted_grace
                        );
                        true
                    }
                    Err(e) => {
                        tracing::error!(node = %ctx.node, "ORPHAN: {e}");
                        false
                    }
                };
                if let Some(mut w) = lock(ctx) {
                    w.watch.arm_unreachable(armed);
                    w.window_checked = true;
                }
            }
            Err(e) => tracing::warn!(
                "ORPHAN: reading the controller's SlurmctldTimeout: {e}; an unreachable \
                 slurmctld powers nothing off until it is read (tried again at the next look)"
            ),
        }
    }
    let verdict = {
        let Some(mut w) = lock(ctx) else { return };
        let now = Instant::now();
        match (&error, w.unanswered) {
            (Some(e), false) => {
                w.unanswered = true;
                if w.watch.unreachable_armed() {
                    tracing::warn!(
                        "ORPHAN: slurmctld does not answer ({e}); this node powers off if it does \
                         not answer for {} (orphan.after)",
                        s.orphan.after
                    );
                } else {
                    tracing::warn!("ORPHAN: slurmctld does not answer ({e})");
                }
            }
            (Some(e), true) => tracing::debug!("ORPHAN: slurmctld does not answer ({e})"),
            (None, true) => {
                w.unanswered = false;
                tracing::info!(
                    "ORPHAN: slurmctld answers again after {} without an answer: nothing changes",
                    crate::section::HumanDuration(Duration::from_secs(
                        w.watch.unanswered(now).as_secs()
                    ))
                );
            }
            (None, false) => {}
        }
        let was_seen = w.watch.seen();
        let verdict = w.watch.observe(look, now, crate::time::now());
        if !was_seen && w.watch.seen() {
            tracing::info!(
                node = %ctx.node,
                "ORPHAN: slurmctld knows {}: a deletion of its record counts from now",
                ctx.node
            );
        }
        match (look, w.missing) {
            (Look::NotFound, false) if verdict.is_none() && w.watch.missing() => {
                w.missing = true;
                tracing::warn!(
                    node = %ctx.node,
                    "ORPHAN: slurmctld has no record of {} any more (deleted?); this node powers \
                     off if it stays deleted for {} (orphan.record_deleted_grace)",
                    ctx.node,
                    s.orphan.record_deleted_grace
                );
            }
            (Look::Found, true) => {
                w.missing = false;
                tracing::info!(node = %ctx.node, "ORPHAN: this node's record is back in slurmctld: nothing changes");
            }
            _ => {}
        }
        verdict
    };
    let Some(why) = verdict else { return };
    if let Some(mut w) = lock(ctx) {
        w.tried = Some(why.clone());
    }
    tracing::warn!(decision = "orphan.poweroff", node = %ctx.node, "ORPHAN: powering off {}: {why}", ctx.node);
    let target = Target {
        gateway: &ctx.gateway,
        systemd_bus: &s.systemd.bus,
    };
    let step = Step {
        action: UpgradeAction::Poweroff,
        images: ("", ""),
        reason: "",
        powered_off: "",
        foreign: true,
        record: None,
        delete_record: false,
        power_down: false,
    };
    match action::run(&s.upgrade, &target, &step).await {
        Ok(()) => {
            if let Some(mut w) = lock(ctx) {
                w.powering_off = true;
            }
            tracing::warn!(node = %ctx.node, unit = %s.upgrade.poweroff_unit, "ORPHAN: power-off started");
        }
        Err(e) => tracing::error!(
            node = %ctx.node,
            "ORPHAN: the power-off failed: {e}; tried again at the next look"
        ),
    }
}
