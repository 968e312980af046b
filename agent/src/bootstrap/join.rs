//! Bootstrap's join: from slurmd's start to the node available in slurmctld. It waits for
//! slurmd's configuration cache and, on Slurm 25.11+, for slurmd's `GET /readyz`, then
//! looks at slurmctld until the slurmd now running has registered
//! ([`registered_by`]) and the node is available; a failing start-up health check is
//! drained ([`crate::health::act::apply_pending`]), a drain of the agent's whose cause is
//! over is lifted ([`found_drain`]), a slurmd that stopped is restarted with backoff, and
//! the error at `slurm.join_deadline` says why as far as this node can see
//! ([`why_not_registered`]).

use std::time::{Duration, Instant};

use super::BootstrapError;
use crate::drain::boot::{found_drain, FoundDrain};
use crate::imds::InstanceIdentity;
use crate::nodedef::NodeDefinition;
use crate::reason::RecordHolder;
use crate::retry::Backoff;
use crate::settings::Settings;
use crate::slurm::ctl::LookAhead;
use crate::slurm::diagnose::why_not_registered;
use crate::slurm::record::registered_by;
use crate::slurm::skew::{self, Refusal};
use crate::slurm::{self, slurmd, NodeInfo, SlurmVersion, Slurmctld};
use crate::systemd::Units;

/// The outside systems the join talks to: slurmctld (through scontrol: the looks at the
/// node's record) and systemd (slurmd's unit). The program's are
/// [`crate::slurm::Scontrol`] and [`crate::systemd::Systemd`]; unit tests give in-memory
/// ones.
#[derive(Clone, Copy)]
pub(super) struct Peers<'a> {
    /// The looks at the node's record.
    pub slurmctld: &'a dyn Slurmctld,
    /// slurmd's unit.
    pub systemd: &'a dyn Units,
}

/// Waits until the slurmd now running has registered and slurmctld reports the node
/// available, until `slurm.join_deadline`. Returns the node and, when it stays drained by
/// someone else's decision, why ([`FoundDrain::Keep`]): bootstrap succeeds then (the node
/// is registered; a failure would make the unit restart bootstrap forever).
///
/// "Registered" is proved with [`registered_by`]; a re-run that restarts nothing proves it
/// the same way. A drain of the agent's from an earlier run or another incarnation whose
/// cause is over is lifted ([`found_drain`]).
///
/// slurmd in configless mode either keeps retrying the configuration fetch itself (22.05
/// does, under systemd) or exits (a missing spool folder, a refused registration, other
/// versions); when the unit is `failed` or `inactive` it is restarted with capped,
/// jittered backoff ([`Backoff::CONTROLLER`]). scontrol and the unit are read together,
/// 5 ms apart at first, then with backoff to 1 s ([`poll_pause`]). The error at the
/// deadline names the cause as far as it is visible ([`why_not_registered`]), scontrol's
/// last answer and the unit's state.
///
/// `peers` are slurmctld and systemd, `id` is this instance (its id writes the reasons, its
/// image decides on a leftover upgrade drain), `gateway` the node's (the pending health drain, the lift of a drain
/// whose cause is over), `holder` whose record slurmctld held before slurmd (re)started,
/// `version` `slurmd -V`.
pub(super) async fn join(
    s: &Settings,
    def: &NodeDefinition,
    peers: Peers<'_>,
    id: &InstanceIdentity,
    gateway: &crate::node_state::Gateway,
    holder: &RecordHolder,
    version: Option<SlurmVersion>,
) -> Result<(NodeInfo, Option<String>), BootstrapError> {
    let (instance_id, running_ami) = (id.instance_id.as_str(), id.ami_id.as_str());
    let unit = &s.slurm.slurmd_unit;
    let Peers { slurmctld, systemd } = peers;
    let deadline = s.slurm.join_deadline.0;
    let start = Instant::now();
    let mut restarts = 0u32;
    let mut polls = 0u32;
    let mut lifted: Option<String> = None;
    // The next look, its scontrol started during the pause before it
    // ([`Slurmctld::look_ahead`]): the look is then one RPC, not a program's start.
    let mut ready: Option<LookAhead> = None;
    // What the join waits for, said every 10 s (journal and `status`).
    let mut progress = crate::progress::Progress::new(Some(&s.agent.state_dir), "bootstrap: join");
    wait_for_config_cache(s, systemd, deadline, &mut progress).await;
    wait_for_slurmd_ready(s, systemd, version, deadline, &mut progress).await;
    loop {
        let look = async {
            match ready.take() {
                Some(look) => look.await,
                None => slurmctld.show_node(&def.node_name).await,
            }
        };
        // slurmctld's record and the unit's state, read together: one wait per poll.
        let (node, svc) = futures_lite::future::zip(look, systemd.service_info(unit)).await;
        let svc = match svc {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!("{e}");
                None
            }
        };
        polls += 1;
        let mut registered = false;
        let not_known = matches!(node, Ok(None));
        let seen = match node {
            Ok(Some(node)) if svc.as_ref().is_some_and(|v| registered_by(&node, v)) => {
                registered = true;
                let look = Look {
                    s,
                    def,
                    gateway,
                    holder,
                    instance_id,
                    running_ami,
                };
                match look.registered(node, svc.as_ref(), &mut lifted).await? {
                    Registered::Joined(node, kept) => return Ok((node, kept)),
                    Registered::LookAgain => {
                        polls = 0;
                        continue;
                    }
                    Registered::NotYet(seen) => seen,
                }
            }
            Ok(Some(node)) => format!(
                "slurmctld shows no registration by the slurmd now running (SlurmdStartTime={}, {unit} started at {})",
                node.fields.get("SlurmdStartTime").map_or("none", String::as_str),
                svc.as_ref()
                    .map(|v| crate::time::format(
                        i64::try_from(v.exec_main_start_usec / 1_000_000).unwrap_or(0)
                    ))
                    .unwrap_or_else(|| "an unknown time".into())
            ),
            Ok(None) => "slurmctld does not know the node yet".into(),
            Err(e) => {
                // slurmctld refuses this release's protocol (the look before slurmd's start
                // got no answer, so it could not tell): slurmd never registers.
                if let Some((Refusal::Protocol, evidence)) = skew::refusal_of(&e) {
                    return Err(super::version_skew(s, def, version, evidence, String::new()).await);
                }
                e.to_string()
            }
        };
        if !registered {
            if let Some(e) = refused(s, def, svc.as_ref(), version).await {
                return Err(e);
            }
        }
        if start.elapsed() >= deadline {
            return Err(not_joined(s, def, systemd, &seen, start.elapsed(), restarts).await);
        }
        let unit_state = match &svc {
            Some(v) => v.active_state.clone(),
            None => systemd.active_state(unit).await?,
        };
        tracing::debug!(%unit_state, %seen, "waiting for the node");
        progress.waiting(&format!(
            "slurmd's registration with slurmctld ({unit} {unit_state}; {} of join_deadline {} left): {seen}",
            crate::section::HumanDuration(Duration::from_secs(
                deadline.saturating_sub(start.elapsed()).as_secs()
            )),
            s.slurm.join_deadline
        ));
        if matches!(unit_state.as_str(), "failed" | "inactive") {
            restart_slurmd(
                s,
                def,
                systemd,
                version,
                not_known,
                restarts,
                &unit_state,
                &seen,
                (start, deadline),
            )
            .await?;
            restarts += 1;
            polls = 0;
            continue;
        }
        ready = slurmctld.look_ahead(&def.node_name);
        // A failing health check run waits for the registration: look as often as at first.
        let pause = match crate::health::act::PendingDrain::read_this_boot(&s.agent.state_dir) {
            Some(_) => JOIN_FAST_PAUSE,
            None => poll_pause(polls),
        };
        tokio::time::sleep(pause.min(deadline.saturating_sub(start.elapsed()))).await;
    }
}

/// slurmd is not running (its unit `unit_state`, `failed` or `inactive`): restarts it
/// after a capped, jittered wait ([`Backoff::CONTROLLER`], the `restarts`-th), then waits
/// for its configuration cache and readiness within what is left of the join's
/// `(start, deadline)`. A node that is not dynamic and that slurmctld does not know
/// (`not_known`) after [`UNKNOWN_NODE_AFTER_RESTARTS`] restarts never will be (a mistyped
/// name, or a nodeID the cluster's slurm.conf does not declare): refused, naming the key
/// the name came from.
#[allow(clippy::too_many_arguments)]
async fn restart_slurmd(
    s: &Settings,
    def: &NodeDefinition,
    systemd: &dyn Units,
    version: Option<SlurmVersion>,
    not_known: bool,
    restarts: u32,
    unit_state: &str,
    seen: &str,
    (start, deadline): (Instant, Duration),
) -> Result<(), BootstrapError> {
    let unit = &s.slurm.slurmd_unit;
    // A node that is not dynamic must be in slurmctld's table from its slurm.conf: unknown
    // there while slurmd exits again and again (`Unable to find node record for <name>`).
    if not_known && def.dynamic_conf.is_none() && restarts >= UNKNOWN_NODE_AFTER_RESTARTS {
        return Err(BootstrapError::UnknownNode {
            node_name: def.node_name.clone(),
            source_key: if s.pcs.enabled {
                "the registration's nodeID"
            } else if s.node.name.is_empty() {
                "node.name_template"
            } else {
                "node.name"
            },
            unit: unit.clone(),
            restarts,
        });
    }
    let wait = Backoff::CONTROLLER
        .delay(restarts)
        .min(deadline.saturating_sub(start.elapsed()));
    tracing::warn!(
        %unit,
        %unit_state,
        %seen,
        retry_in_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        "slurmd is not running; restarting it"
    );
    tokio::time::sleep(wait).await;
    if let Err(e) = slurmd::restart(systemd, unit).await {
        tracing::warn!("{e}");
    }
    let mut progress = crate::progress::Progress::new(Some(&s.agent.state_dir), "bootstrap: join");
    wait_for_config_cache(
        s,
        systemd,
        deadline.saturating_sub(start.elapsed()),
        &mut progress,
    )
    .await;
    let left = deadline.saturating_sub(start.elapsed());
    wait_for_slurmd_ready(s, systemd, version, left, &mut progress).await;
    Ok(())
}

/// What the join does with a record the slurmd now running registered.
enum Registered {
    /// Joined: the record as seen, and the drain kept on it (why), if any.
    Joined(NodeInfo, Option<String>),
    /// Something changed on the record (a pending health drain applied, an earlier
    /// drain lifted): look again at once.
    LookAgain,
    /// Registered but not yet in service: what was seen, for the log and the error at the
    /// deadline.
    NotYet(String),
}

/// What one look at a registered record needs.
struct Look<'a> {
    s: &'a Settings,
    def: &'a NodeDefinition,
    gateway: &'a crate::node_state::Gateway,
    holder: &'a RecordHolder,
    instance_id: &'a str,
    running_ami: &'a str,
}

impl Look<'_> {
    /// The record `node`, registered by the slurmd of unit `svc`: refused when slurmctld
    /// marks the registration invalid; a health drain pending from before the registration
    /// is applied; an available node has joined; a drain of the agent's whose cause is
    /// over is lifted once (`lifted` remembers it), one that still applies is kept.
    async fn registered(
        &self,
        node: NodeInfo,
        svc: Option<&crate::systemd::ServiceInfo>,
        lifted: &mut Option<String>,
    ) -> Result<Registered, BootstrapError> {
        let def = self.def;
        if node.has_flag("INVALID_REG") || node.has_flag("INVALID") {
            return Err(BootstrapError::Invalid {
                node_name: def.node_name.clone(),
                state: node.state().to_string(),
                reason: node.reason().unwrap_or("no reason given").to_string(),
            });
        }
        // A failing HealthCheckProgram run from before this registration (slurmd runs it at
        // its start; health::act::PendingDrain): drained now.
        let started = svc.map_or(0, |v| {
            i64::try_from(v.exec_main_start_usec / 1_000_000).unwrap_or(0)
        });
        let state_dir = &self.s.agent.state_dir;
        let pending = crate::health::act::apply_pending(state_dir, self.gateway, &node, started);
        if let Some(o) = pending.await {
            tracing::warn!(node = %def.node_name, action = %o.action, detail = %o.detail, error = ?o.error, "health checks failed before the registration");
            if o.action == "drain" && o.error.is_none() {
                return Ok(Registered::LookAgain);
            }
        }
        if node.is_available() {
            return Ok(Registered::Joined(node, None));
        }
        if node.is_drained() && !node.has_flag("NOT_RESPONDING") && !node.state().contains('*') {
            match found_drain(
                node.reason(),
                self.instance_id,
                self.running_ami,
                self.holder,
            ) {
                FoundDrain::Keep(why) => {
                    tracing::warn!(node = %def.node_name, "{why}");
                    return Ok(Registered::Joined(node, Some(why)));
                }
                FoundDrain::Lift(r) if lifted.as_deref() != Some(&r.to_reason()) => {
                    tracing::info!(node = %def.node_name, reason = %r, previous_instance = ?self.holder.replaced(), "lifting the agent's drain of an earlier run: its cause is over");
                    if r.cause == crate::reason::ReasonCause::Repair {
                        keep_replacement_history(state_dir, node.reason(), self.instance_id);
                    }
                    let kind = crate::node_state::CauseKind::of_reason(r.cause);
                    match self.gateway.lift(kind, Some(&node)).await {
                        Ok(crate::node_state::Lifted::HeldBy(other)) => {
                            let why = format!(
                                "drained by the agent ({}): its {other} drain in progress holds the node",
                                r.to_reason()
                            );
                            tracing::warn!(node = %def.node_name, "{why}");
                            return Ok(Registered::Joined(node, Some(why)));
                        }
                        Ok(_) => {}
                        Err(e) => tracing::warn!("{e}"),
                    }
                    *lifted = Some(r.to_reason());
                    return Ok(Registered::LookAgain);
                }
                FoundDrain::Lift(_) => {}
            }
        }
        Ok(Registered::NotYet(format!(
            "node is {}{}",
            node.state(),
            node.reason().map(|r| format!(" ({r})")).unwrap_or_default()
        )))
    }
}

/// A predecessor of this NodeName powered off for a repair's replacement (its reason,
/// `reason`, about to be lifted): copied into `repair.json` under `state_dir`, the flap
/// guard's history of this NodeName ([`crate::repair::flap`]). A failure to write is
/// logged: the guard then sees only what slurmctld still holds.
fn keep_replacement_history(state_dir: &std::path::Path, reason: Option<&str>, instance_id: &str) {
    use crate::repair::record::{record_path, Record};
    let Some(reason) = reason else {
        return;
    };
    let path = record_path(state_dir);
    let mut record = Record::load(&path);
    if record.saw_predecessor(reason, instance_id) {
        tracing::info!(%reason, "the previous instance of this node was replaced by a repair: kept for the flap guard");
        if let Err(e) = record.save(&path) {
            tracing::warn!("repair record: {e}");
        }
    }
}

/// The error at the join's deadline: the cause as far as it is visible
/// ([`why_not_registered`]), what was `seen` last, the unit's state and its restarts.
async fn not_joined(
    s: &Settings,
    def: &NodeDefinition,
    systemd: &dyn Units,
    seen: &str,
    waited: Duration,
    restarts: u32,
) -> BootstrapError {
    let unit = &s.slurm.slurmd_unit;
    let unit_state = systemd
        .active_state(unit)
        .await
        .unwrap_or_else(|e| format!("unknown ({e})"));
    let info = systemd.service_info(unit).await.ok();
    let why = why_not_registered(&s.slurm, info.as_ref(), seen).await;
    let why = if why.is_empty() {
        String::new()
    } else {
        format!("{why}; ")
    };
    BootstrapError::Join {
        node_name: def.node_name.clone(),
        waited,
        last_error: format!("{why}{seen}; {unit} is {unit_state} (restarted {restarts} times)"),
    }
}

/// On a configless node whose client commands have no configuration yet
/// ([`slurm::client_config`]), waits until slurmd has fetched it and written its cache, at
/// most [`CONFIG_CACHE_WAIT`] and half of `time_left` (the join's), or until slurmd's unit
/// is no longer active. slurmd registers only after that, and each `scontrol` run before it
/// would fetch the whole configuration from slurmctld (`REQUEST_CONFIG`, the largest answer
/// it sends), once per look and per node.
async fn wait_for_config_cache(
    s: &Settings,
    systemd: &dyn Units,
    time_left: Duration,
    progress: &mut crate::progress::Progress,
) {
    let missing = || !client_has_config(s);
    if !missing() {
        return;
    }
    let start = Instant::now();
    // Half the join's time left at most, so that slurmctld is asked (and its answer named
    // in the error) before the deadline.
    let limit = CONFIG_CACHE_WAIT.min(time_left / 2);
    let mut looks = 0u32;
    while start.elapsed() < limit {
        if !missing() {
            tracing::debug!(waited = ?start.elapsed(), "slurmd's configuration cache is there");
            return;
        }
        progress.waiting(&format!(
            "slurmd to fetch the configuration from slurmctld (its cache {})",
            slurm::CONFIG_CACHE
        ));
        // The unit's state every 4 looks (20 ms): a slurmd that failed is [`join`]'s to
        // handle, with slurmctld's answer in its message.
        if looks.is_multiple_of(4) {
            if let Ok(state) = systemd.active_state(&s.slurm.slurmd_unit).await {
                if matches!(state.as_str(), "failed" | "inactive") {
                    return;
                }
            }
        }
        looks += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tracing::debug!(
        cache = slurm::CONFIG_CACHE,
        "no configuration cache from slurmd after {limit:?}: asking slurmctld anyway"
    );
}

/// On Slurm 25.11+ ([`SlurmVersion::has_slurmd_http_probes`]), waits until slurmd on this
/// node answers `GET /readyz` on its own port ([`slurm::readyz`]): it then has its
/// configuration, has run its start-up `HealthCheckProgram` and has sent its registration,
/// so the looks at slurmctld that follow can find the node registered. Each look before
/// that is an RPC slurmctld answers in vain, one every 5 ms at first ([`poll_pause`]),
/// for as long as slurmd's start-up health check runs. The wait costs slurmctld nothing.
///
/// At most half of `time_left` (the join's). It ends early, and the join looks at
/// slurmctld as before, when slurmd's unit is no longer active, when slurmd gives no HTTP
/// answer (HTTP off: `CommunicationParameters=disable_http`, TLS, or no HTTP parser
/// plugin), or when the address slurmd listens on `SlurmdPort` at
/// ([`slurm::readyz::listening_address`]) refuses connections for [`READYZ_REFUSED_LIMIT`].
async fn wait_for_slurmd_ready(
    s: &Settings,
    systemd: &dyn Units,
    version: Option<SlurmVersion>,
    time_left: Duration,
    progress: &mut crate::progress::Progress,
) {
    if !version.is_some_and(SlurmVersion::has_slurmd_http_probes) {
        return;
    }
    let port = slurmd_port(s);
    let start = Instant::now();
    let limit = time_left / 2;
    let mut refused_since: Option<Instant> = None;
    let mut tries = 0u32;
    while start.elapsed() < limit {
        progress.waiting(&format!(
            "slurmd to answer GET /readyz on port {port} (its configuration, its start-up health check, its registration)"
        ));
        // Nothing listens on slurmd's port yet: it is still fetching its configuration.
        let Some(addr) = slurm::readyz::listening_address(port) else {
            if tries.is_multiple_of(4) && slurmd_stopped(s, systemd).await {
                return;
            }
            // slurmd still without its configuration after [`FETCH_REFUSED_AFTER`]: the
            // join looks at why ([`refused`]).
            if tries.is_multiple_of(100) && slurmd_ran_for(s, systemd).await >= FETCH_REFUSED_AFTER
            {
                return;
            }
            tries += 1;
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        match slurm::readyz::probe(addr, READYZ_PROBE_TIMEOUT).await {
            Ok(true) => {
                tracing::debug!(%addr, waited = ?start.elapsed(), "slurmd answers /readyz");
                return;
            }
            // Not servicing RPCs yet, or (a timeout) its listener still holds connections
            // back: slurmd is working, its start-up health check perhaps.
            Ok(false) | Err(slurm::readyz::ReadyzError::Timeout { .. }) => refused_since = None,
            Err(e @ slurm::readyz::ReadyzError::Connect { .. }) => {
                let since = *refused_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= READYZ_REFUSED_LIMIT {
                    tracing::debug!("{e} for {READYZ_REFUSED_LIMIT:?}: looking at slurmctld without waiting for /readyz");
                    return;
                }
            }
            Err(e) => {
                tracing::debug!("{e}: looking at slurmctld without waiting for /readyz");
                return;
            }
        }
        // The unit's state every 4 tries: a slurmd that failed is [`join`]'s to handle.
        if tries.is_multiple_of(4) && slurmd_stopped(s, systemd).await {
            return;
        }
        tries += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tracing::debug!(
        port,
        "slurmd gave no 2xx to /readyz in {limit:?}: looking at slurmctld anyway"
    );
}

/// slurmd's `SlurmdPort` as the configuration the agent's scontrol reads says it (on a
/// configless node, slurmd's cache, once slurmd has fetched it), else the default.
fn slurmd_port(s: &Settings) -> u16 {
    let env_conf = std::env::var_os("SLURM_CONF");
    let conf = slurm::client_config(&s.slurm.bin_dir, env_conf.as_deref(), |p| p.exists())
        .and_then(|p| std::fs::read_to_string(p).ok());
    conf.as_deref().map_or(
        slurm::readyz::DEFAULT_SLURMD_PORT,
        slurm::readyz::slurmd_port,
    )
}

/// How long slurmd may run without its configuration, while a configless server accepts
/// connections, before the join calls it refused ([`refused`]): slurmd asks slurmctld for
/// it at its start and then every 10 s ("failed to load configs. Retrying in 10
/// seconds.", `_establish_configuration` in `slurmd.c`), so this is three refusals. A
/// controller that answers gives the configuration to the first request.
pub const FETCH_REFUSED_AFTER: Duration = Duration::from_secs(25);

/// How many times slurmd of a node that is not dynamic is restarted while slurmctld does
/// not know its NodeName, before bootstrap stops ([`BootstrapError::UnknownNode`]).
const UNKNOWN_NODE_AFTER_RESTARTS: u32 = 2;

/// How long slurmd's main process has run while its unit is `active` or `activating`
/// (zero otherwise, or when the unit cannot be read).
async fn slurmd_ran_for(s: &Settings, systemd: &dyn Units) -> Duration {
    match systemd.service_info(&s.slurm.slurmd_unit).await {
        Ok(v) => running_for(&v),
        Err(_) => Duration::ZERO,
    }
}

pub(super) fn running_for(v: &crate::systemd::ServiceInfo) -> Duration {
    if !matches!(v.active_state.as_str(), "active" | "activating") || v.exec_main_start_usec == 0 {
        return Duration::ZERO;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    now.saturating_sub(Duration::from_micros(v.exec_main_start_usec))
}

/// The error for a slurmd that slurmctld refuses: it has run for [`FETCH_REFUSED_AFTER`]
/// without its configuration (nothing listens on its `SlurmdPort`: slurmd opens it only
/// once configured) while a configless server accepts connections. slurmctld then refuses
/// its `REQUEST_CONFIG`: seen with a key that differs (slurmctld: `decode_jwt: jwt_decode
/// (with key) failure`), and with an auth type that differs (`auth_g_unpack:
/// authentication plugin auth/munge(101) not found`, or `auth/slurm(103)`); slurmd says
/// `failed to fetch remote configs: Protocol authentication error` each time (Slurm
/// 25.11.6). `None` while that is not so, or with no `slurm.conf_servers` (DNS SRV).
async fn refused(
    s: &Settings,
    def: &NodeDefinition,
    svc: Option<&crate::systemd::ServiceInfo>,
    version: Option<SlurmVersion>,
) -> Option<BootstrapError> {
    let ran = running_for(svc?);
    if ran < FETCH_REFUSED_AFTER || slurm::readyz::listening_address(slurmd_port(s)).is_some() {
        return None;
    }
    let controller = slurm::diagnose::controller_accepting(&s.slurm).await?;
    Some(BootstrapError::Refused {
        node_name: def.node_name.clone(),
        controller,
        auth_type: s.auth.auth_type,
        key_path: crate::authkey::KeyTarget::from_settings(&s.auth).path,
        version,
        daemon: "slurmd",
        unit: s.slurm.slurmd_unit.clone(),
        ran,
    })
}

/// Whether slurmd's unit is `failed` or `inactive` (a state read that fails counts as not).
async fn slurmd_stopped(s: &Settings, systemd: &dyn Units) -> bool {
    systemd
        .active_state(&s.slurm.slurmd_unit)
        .await
        .is_ok_and(|state| matches!(state.as_str(), "failed" | "inactive"))
}

/// How long one `GET /readyz` waits for slurmd's answer: a listener still quiesced holds
/// the connection unanswered, and the unit's state is read between tries.
const READYZ_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// How long `connect` to slurmd's listening address may be refused before
/// [`wait_for_slurmd_ready`] stops waiting (a listener that is there refuses only while it
/// is being replaced).
const READYZ_REFUSED_LIMIT: Duration = Duration::from_secs(10);

/// Whether the agent's `scontrol` finds a configuration on this node
/// ([`slurm::client_config`]) rather than fetching one from slurmctld.
pub(super) fn client_has_config(s: &Settings) -> bool {
    slurm::has_client_config(&s.slurm)
}

/// How long [`join`] waits for slurmd's configuration cache before it asks slurmctld with a
/// configuration fetched for each look.
const CONFIG_CACHE_WAIT: Duration = Duration::from_secs(5);

/// The pause after the `polls`-th look at slurmctld in [`join`]: a registration normally
/// shows within tens of milliseconds of slurmd's start, so the first
/// [`JOIN_FAST_POLLS`] looks come [`JOIN_FAST_PAUSE`] apart; then the pause grows by half
/// each time, up to one second.
fn poll_pause(polls: u32) -> Duration {
    let slow = polls.saturating_sub(JOIN_FAST_POLLS).min(16);
    let mut pause = JOIN_FAST_PAUSE;
    for _ in 0..slow {
        pause = pause * 3 / 2;
    }
    pause.min(Duration::from_secs(1))
}

/// Looks at slurmctld [`JOIN_FAST_PAUSE`] apart at first ([`poll_pause`]).
const JOIN_FAST_POLLS: u32 = 20;
/// The pause between the first looks at slurmctld ([`poll_pause`]).
const JOIN_FAST_PAUSE: Duration = Duration::from_millis(5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_join_looks_often_at_first_then_backs_off_to_one_second() {
        for n in 0..=JOIN_FAST_POLLS {
            assert_eq!(poll_pause(n), JOIN_FAST_PAUSE, "poll {n}");
        }
        assert!(poll_pause(JOIN_FAST_POLLS + 1) > JOIN_FAST_PAUSE);
        let mut last = Duration::ZERO;
        for n in 0..200 {
            let p = poll_pause(n);
            assert!(p >= last, "poll {n}: {p:?} after {last:?}");
            last = p;
        }
        assert_eq!(poll_pause(200), Duration::from_secs(1));
        assert_eq!(poll_pause(u32::MAX), Duration::from_secs(1));
    }
}

#[cfg(test)]
#[path = "join_tests.rs"]
mod join_tests;
