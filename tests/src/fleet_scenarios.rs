//! Fleet scenarios shared by the tests (`tests/tests/fleet.rs`) and the benchmark
//! (`fleet-bench`): each runs a whole fleet, checks the end state, and returns what it
//! observed (counts and durations) for the caller to assert or print.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::fleet::{image_builder_binary, Fleet, FLEET_GATEWAY};
use crate::imds_emulator::pcs::{PcsCluster, PcsEmulator, PcsEndpoint, PcsGroup, PcsInstance};
use crate::moto::REGION;
use crate::process::{run_ok, wait_until};
use crate::slurm::{field, is_idle};

/// What a rolling upgrade did, sampled every half second from slurmctld.
#[derive(Debug, Clone)]
pub struct UpgradeOutcome {
    /// The image the fleet booted (IMDS `ami-id`).
    pub old_image: String,
    /// The image published (registered in moto).
    pub new_image: String,
    /// The most upgrade drains at once among those that went on to power their instance
    /// off (from the drain's first sight to its "powered off" reason). Withdrawn drains are
    /// in [`UpgradeOutcome::withdrawn`], the time each node is out of service until its
    /// replacement is available in [`UpgradeOutcome::overlap`].
    pub max_upgrading: usize,
    /// The most nodes seen at once with an upgrade drain of a running instance, withdrawn
    /// ones included.
    pub max_upgrade_drains_seen: usize,
    /// Upgrade drains withdrawn before any action, per instance id.
    pub withdrawn: BTreeMap<String, u32>,
    /// The overlap of each kind, the most seen at one sample: upgrade drains of a running
    /// instance (until its power-off), nodes whose instance powered off for the upgrade and
    /// whose replacement is not yet IDLE and available on the new image, and drains that
    /// were later withdrawn (counted among the first kind too).
    pub overlap: Overlap,
    /// The most nodes seen at once not available for jobs for any reason (drained,
    /// powered off and not yet replaced, replacement still booting).
    pub max_unavailable: usize,
    /// Upgrade drains that ended with the instance powered off, per instance id.
    pub drains: BTreeMap<String, u32>,
    /// The distinct upgrade reasons seen, per instance id that wrote them.
    pub reasons: BTreeMap<String, Vec<String>>,
    /// From publish to every node on the new image and IDLE.
    pub total: Duration,
    /// Per replaced node: its power-off seen (the instance exited) to its replacement
    /// registered and IDLE (its slot's release not included: that is the hand-off).
    pub replace_times: Vec<Duration>,
    /// Every change seen in a node's record: `+<seconds since publish> <name> <state>
    /// <reason>`.
    pub timeline: Vec<String>,
    /// With `FLEET_BENCH_TIMELINE` set: each final node's journal of this boot for the
    /// agent's two units (`journalctl -o short-precise`), to tell where a hand-off's time
    /// goes; empty otherwise.
    pub journals: BTreeMap<String, String>,
    /// Jobs that ran (one per node, all completed with exit 0).
    pub jobs: usize,
    /// The NodeNames of the instances at the end.
    pub names: Vec<String>,
    /// Records slurmctld still held a minute after the end under NodeNames that no
    /// instance runs under any more (a replaced node's, under [`Naming::New`]).
    pub records_left: Vec<String>,
}

/// The most nodes of each kind seen at one sample of a rolling upgrade.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Overlap {
    /// Upgrade drains of a running instance (drain to power-off, or to withdrawal).
    pub draining: usize,
    /// Powered off for the upgrade, replacement not yet IDLE and available on the new image.
    pub awaiting_replacement: usize,
    /// Upgrade drains that were withdrawn later.
    pub withdrawn_drains: usize,
    /// The first two together at one sample: nodes out of service because of the upgrade,
    /// from the upgrade drain until the replacement is IDLE on the new image (what
    /// `upgrade.max_unavailable` bounds).
    pub held: usize,
}

/// The SSM parameter the fleet's nodes watch in [`rolling_upgrade`].
pub const UPGRADE_PARAMETER: &str = "/slurm/fleet/compute-ami";

/// `NodeName -> (State, Reason)` from one `scontrol show node -o`.
fn node_table(fleet: &Fleet) -> Result<BTreeMap<String, (String, String)>> {
    let out = fleet.ctld.scontrol_ok(&["show", "node", "-o"])?;
    let mut t = BTreeMap::new();
    for line in out.lines() {
        let Some(name) = field(line, "NodeName") else {
            continue;
        };
        let state = field(line, "State").unwrap_or_default().to_string();
        // Reason=<text with spaces> [user@time]
        let reason = line
            .split(" Reason=")
            .nth(1)
            .map(|r| r.split(" [").next().unwrap_or(r).trim().to_string())
            .unwrap_or_default();
        t.insert(name.to_string(), (state, reason));
    }
    Ok(t)
}

/// `NodeName -> SlurmdStartTime` (as slurmctld prints it) of every record whose slurmd has
/// registered, from one `scontrol show node -o`.
fn slurmd_starts(fleet: &Fleet) -> Result<BTreeMap<String, String>> {
    let out = fleet.ctld.scontrol_ok(&["show", "node", "-o"])?;
    Ok(out
        .lines()
        .filter_map(|l| {
            let start = field(l, "SlurmdStartTime").filter(|t| *t != "None")?;
            Some((field(l, "NodeName")?.to_string(), start.to_string()))
        })
        .collect())
}

/// The NodeNames holding an upgrade budget slot (`Nodes=` of the agent's
/// `slurm-node-agent-upgrade-*` reservations), from one `scontrol show reservation -o`.
/// Read from the reservations, not from the records' `RESERVED` flag: slurmctld sets that
/// flag again only at its next pass over the reservations, so a node that registered
/// meanwhile shows none while its slot is still held.
fn slot_holders(fleet: &Fleet) -> Result<std::collections::BTreeSet<String>> {
    let out = fleet.ctld.scontrol_ok(&["show", "reservation", "-o"])?;
    Ok(out
        .lines()
        .filter(|l| l.starts_with("ReservationName=slurm-node-agent-upgrade-"))
        .filter_map(|l| field(l, "Nodes").map(str::to_string))
        .collect())
}

/// The instance id of an upgrade reason of the agent (`slurm-node-agent/upgrade@<id>: ...`).
fn upgrade_instance(reason: &str) -> Option<&str> {
    reason
        .strip_prefix("slurm-node-agent/upgrade@")?
        .split(':')
        .next()
}

/// A `sleep <job_secs>` job on each of `names`, each running when this returns.
///
/// # Errors
/// `sbatch` fails, or a node is not running its job within 2 minutes.
fn busy(fleet: &Fleet, names: &[String], job_secs: u64) -> Result<()> {
    for name in names {
        fleet.sbatch(&["-N1", "-w", name, "--wrap", &format!("sleep {job_secs}")])?;
    }
    for name in names {
        fleet.ctld.wait_node_state(
            name,
            |s| s.starts_with("ALLOCATED") || s.starts_with("MIXED"),
            Duration::from_secs(120),
        )?;
    }
    Ok(())
}

/// How the auto scaling group of [`rolling_upgrade`] names a replacement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    /// The NodeName of the instance it replaces (a node group with fixed names).
    Same,
    /// A new NodeName, as an Auto Scaling group's replacement named after its host
    /// (`node.name`'s default, the short host name): `node003` becomes `node003r1`.
    New,
}

/// A rolling upgrade of `nodes` busy nodes with a budget of `budget`: the fleet boots with
/// moto, each node runs one `sleep <job_secs>` job, a new image is registered in EC2 and
/// `slurm-image-builder publish`ed to [`UPGRADE_PARAMETER`]; the test then acts as the auto
/// scaling group: a node whose container powered off is replaced (a new instance id,
/// named as `naming` says) by an instance with the new image's id as its `ami-id`. Ends
/// when every node runs the new image and is IDLE, then checks that every job completed
/// with exit 0. Nodes are followed by the name they were launched under ("logical"
/// nodes): a replacement under a new name continues its predecessor's line.
///
/// # Errors
/// Any step, or `timeout` after the publish, with the nodes' diagnostics.
pub fn rolling_upgrade(
    nodes: usize,
    budget: usize,
    job_secs: u64,
    timeout: Duration,
    naming: Naming,
) -> Result<UpgradeOutcome> {
    let toml = format!(
        "[upgrade]\nparameter = \"{UPGRADE_PARAMETER}\"\ninterval = \"2s\"\n\
         max_unavailable = \"{budget}\"\nbudget_wait = \"3s\"\naction = \"poweroff\"\n"
    );
    let mut fleet = Fleet::builder()
        .moto(true)
        .agent_toml(toml)
        .max_nodes(nodes.max(crate::fleet::DEFAULT_MAX_NODES))
        .start()?;
    let names: Vec<String> = (1..=nodes).map(|i| format!("node{i:03}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    fleet.launch_all(&refs)?;
    fleet.wait_all_idle(&names, Duration::from_secs(600))?;
    let old_image = fleet.ami_id(&names[0])?;
    // Logical node (its first name) -> the NodeName of its instance now.
    let mut current: BTreeMap<String, String> =
        names.iter().map(|n| (n.clone(), n.clone())).collect();
    let mut generation = 0;
    busy(&fleet, &names, job_secs)?;

    let new_image = fleet.moto()?.register_image("slurm-compute-fleet-next")?;
    let mut c = Command::new(image_builder_binary()?);
    c.args(["publish", "--parameter", UPGRADE_PARAMETER, "--ami-id"])
        .arg(&new_image)
        .args(["--region", REGION, "--endpoint-url"])
        .arg(fleet.moto()?.endpoint())
        .envs(fleet.moto()?.env());
    run_ok(c, Duration::from_secs(120)).context("slurm-image-builder publish")?;
    let started = Instant::now();

    let mut max_seen = 0;
    let mut max_unavailable = 0;
    let mut drains: BTreeMap<String, u32> = BTreeMap::new();
    let mut withdrawn: BTreeMap<String, u32> = BTreeMap::new();
    // NodeName -> (instance id, first sight) of an upgrade drain not yet ended, and the
    // ended ones: (start, end) of those that powered off.
    let mut open: BTreeMap<String, (String, Instant)> = BTreeMap::new();
    let mut powered_off: Vec<(Instant, Instant)> = Vec::new();
    let mut reasons: BTreeMap<String, Vec<String>> = BTreeMap::new();
    // NodeName -> the instance whose upgrade drain is on its record now.
    let mut drained_now: BTreeMap<String, String> = BTreeMap::new();
    let mut replaced_at: BTreeMap<String, Instant> = BTreeMap::new();
    let mut replace_times = Vec::new();
    let mut timeline = Vec::new();
    let mut last: BTreeMap<String, (String, String)> = BTreeMap::new();
    let mut overlap = Overlap::default();
    // Nodes whose instance powered off for the upgrade, replacement not yet on the new
    // image and available; the open drains of each sample; the withdrawn drains.
    let mut awaiting: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    let mut samples: Vec<Vec<(String, Instant)>> = Vec::new();
    let mut withdrawn_drains: Vec<(String, Instant)> = Vec::new();
    // Logical node -> the SlurmdStartTime its NodeName's record showed when the current
    // instance was launched (none for a new NodeName).
    let mut launched_over: BTreeMap<String, Option<String>> = BTreeMap::new();
    loop {
        let now_names: Vec<String> = current.values().cloned().collect();
        if started.elapsed() > timeout {
            bail!(
                "the rolling upgrade did not finish within {timeout:?}: {:?}\n{}",
                node_table(&fleet).unwrap_or_default(),
                fleet.diagnostics(&now_names)
            );
        }
        let table = node_table(&fleet)?;
        let holders = slot_holders(&fleet)?;
        let starts = slurmd_starts(&fleet)?;
        let (mut upgrading, mut unavailable, mut done) = (0, 0, true);
        for name in &names {
            let node_name = current[name].clone();
            let (state, reason) = table.get(&node_name).cloned().unwrap_or_default();
            if last.get(name) != Some(&(state.clone(), reason.clone())) {
                timeline.push(format!(
                    "+{:.1} {node_name} {state} {reason}",
                    started.elapsed().as_secs_f64()
                ));
                last.insert(name.clone(), (state.clone(), reason.clone()));
            }
            // Takes jobs (a node in a maintenance reservation takes none); available once
            // it holds no budget slot either: out of service for the upgrade until then.
            let up = !state.is_empty()
                && !state.contains("DRAIN")
                && !state.starts_with("DOWN")
                && !state.ends_with('*')
                && !state.contains("NOT_RESPONDING")
                && !state.contains("MAINT");
            let available = up && !holders.contains(&node_name);
            // The record is the running instance's: its slurmd registered since the launch
            // (a replacement under the same NodeName finds its predecessor's record).
            let registered = launched_over.get(name).is_none_or(|before| {
                starts.contains_key(&node_name) && starts.get(&node_name) != before.as_ref()
            });
            if !available {
                unavailable += 1;
            }
            let now = Instant::now();
            match upgrade_instance(&reason) {
                Some(id) if state.contains("DRAIN") => {
                    let seen = reasons.entry(id.to_string()).or_default();
                    if !seen.contains(&reason) {
                        seen.push(reason.clone());
                    }
                    let off = reason.contains(": powered off for image upgrade ");
                    if !off {
                        upgrading += 1;
                    }
                    if drained_now.get(name).map(String::as_str) != Some(id) {
                        drained_now.insert(name.clone(), id.to_string());
                        if !off {
                            open.insert(name.clone(), (id.to_string(), now));
                        }
                    }
                    if off {
                        if let Some((oid, start)) = open.remove(name) {
                            *drains.entry(oid).or_default() += 1;
                            powered_off.push((start, now));
                        }
                        awaiting.insert(name.clone());
                    }
                }
                // The record is gone while its instance still shuts down: a replacement
                // under another NodeName released the slot of a holder that had written
                // "powered off" and deleted its record between two samples. Decided once
                // the instance has exited (a withdrawn drain leaves the record in service).
                _ if state.is_empty()
                    && open.contains_key(name)
                    && fleet.exited(&node_name)?.is_none() => {}
                _ => {
                    drained_now.remove(name);
                    if let Some((oid, start)) = open.remove(name) {
                        // Gone without the "powered off" reason: withdrawn if the same
                        // instance still runs, else it powered off between two samples.
                        let same = fleet.exited(&node_name)?.is_none()
                            && fleet.instance_id(&node_name).is_ok_and(|i| i == oid);
                        if same {
                            *withdrawn.entry(oid).or_default() += 1;
                            withdrawn_drains.push((name.clone(), start));
                        } else {
                            *drains.entry(oid).or_default() += 1;
                            powered_off.push((start, now));
                            awaiting.insert(name.clone());
                        }
                    }
                }
            }
            let on_new = fleet.ami_id(&node_name)? == new_image;
            // The replacement's own time (what an Auto Scaling group and a boot take): to
            // its registration, IDLE; the slot's release after it is the agent's hand-off.
            if on_new && is_idle(&state) && up && registered {
                if let Some(t) = replaced_at.remove(name) {
                    replace_times.push(t.elapsed());
                }
            }
            if on_new && is_idle(&state) && available && registered {
                awaiting.remove(name);
            }
            done &= on_new && is_idle(&state) && available && registered;
        }
        samples.push(
            open.iter()
                .map(|(n, (_, start))| (n.clone(), *start))
                .collect(),
        );
        overlap.draining = overlap.draining.max(open.len());
        overlap.awaiting_replacement = overlap.awaiting_replacement.max(awaiting.len());
        overlap.held = overlap
            .held
            .max(open.len() + awaiting.iter().filter(|n| !open.contains_key(*n)).count());
        max_seen = max_seen.max(upgrading);
        max_unavailable = max_unavailable.max(unavailable);
        if done {
            break;
        }
        // The auto scaling group: a powered-off instance is replaced from the new image.
        for name in &names {
            let node_name = current[name].clone();
            if fleet.exited(&node_name)?.is_some() {
                let next = match naming {
                    Naming::Same => node_name.clone(),
                    Naming::New => {
                        generation += 1;
                        format!("{name}r{generation}")
                    }
                };
                let mut l = fleet.new_launch(&next);
                l.ami_id.clone_from(&new_image);
                fleet.replace(&node_name, l)?;
                timeline.push(format!(
                    "+{:.1} {node_name} exited; {next} launched on the new image",
                    started.elapsed().as_secs_f64()
                ));
                launched_over.insert(name.clone(), starts.get(&next).cloned());
                current.insert(name.clone(), next);
                replaced_at.insert(name.clone(), Instant::now());
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let total = started.elapsed();
    // The most drains that powered off, overlapping at once.
    let max_upgrading = powered_off
        .iter()
        .map(|(s, _)| {
            powered_off
                .iter()
                .filter(|(s2, e2)| s2 <= s && s < e2)
                .count()
        })
        .max()
        .unwrap_or(0);
    overlap.withdrawn_drains = samples
        .iter()
        .map(|s| s.iter().filter(|d| withdrawn_drains.contains(d)).count())
        .max()
        .unwrap_or(0);
    let mut journals = BTreeMap::new();
    if std::env::var_os("FLEET_BENCH_TIMELINE").is_some() {
        for n in current.values() {
            let out = fleet.exec(
                n,
                "journalctl",
                &[
                    "-b",
                    "-o",
                    "short-precise",
                    "-u",
                    "slurm-node-agent-bootstrap.service",
                    "-u",
                    "slurm-node-agent.service",
                ],
            )?;
            journals.insert(n.clone(), String::from_utf8_lossy(&out.stdout).into_owned());
        }
    }
    fleet.wait_no_jobs(Duration::from_secs(120))?;
    fleet.check_no_job_killed(nodes)?;
    // The records of NodeNames no instance runs under any more: a replacement under a new
    // name deletes its predecessor's dynamic record as it releases its slot (within a
    // check or two of being in service); what is left a minute on piles up.
    let running: std::collections::BTreeSet<String> = current.values().cloned().collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    let records_left = loop {
        let left: Vec<String> = node_table(&fleet)?
            .into_keys()
            .filter(|n| !running.contains(n))
            .collect();
        if left.is_empty() || Instant::now() > deadline {
            break left;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    Ok(UpgradeOutcome {
        records_left,
        names: running.into_iter().collect(),
        old_image,
        new_image,
        max_upgrading,
        max_upgrade_drains_seen: max_seen,
        withdrawn,
        overlap,
        max_unavailable,
        drains,
        reasons,
        total,
        replace_times,
        timeline,
        journals,
        jobs: fleet.job_records().len(),
    })
}

/// What [`pcs_join`] saw.
#[derive(Debug, Clone)]
pub struct PcsJoinOutcome {
    /// Per launched node (its host name): the instance id and the `nodeID` the emulator
    /// assigned to that instance.
    pub assigned: BTreeMap<String, (String, String)>,
    /// Per `nodeID`: `NodeHostName` in slurmctld (the host whose slurmd registered it).
    pub hostnames: BTreeMap<String, String>,
    /// Registration requests answered 200, per instance id.
    pub registered: BTreeMap<String, usize>,
    /// The host names printed by one `srun -N<nodes> --ntasks-per-node=1 hostname`,
    /// sorted.
    pub job_hosts: Vec<String>,
    /// From the launch to every assigned node IDLE.
    pub total: Duration,
    /// The `auth.type` the image's own drop-in (`conf.d/10-image.toml`, written by
    /// `70-agent.sh` in the builder's local target) sets; `None` when it leaves it to the
    /// node's join.
    pub image_auth_type: Option<String>,
    /// Per launched node: `systemctl is-active munge.service` and its slurmd options file
    /// (`/etc/default/slurmd`).
    pub auth_on_node: BTreeMap<String, (String, String)>,
}

/// The PCS cluster of [`pcs_join`].
pub const PCS_CLUSTER: &str = "pcs_fleet0cluster";
/// Its compute node group.
pub const PCS_GROUP: &str = "pcs_fleet0group";

/// The managed join of `nodes` nodes of one compute node group (issue 13): slurmctld
/// declares the group's nodes `compute-[1-<nodes>] State=CLOUD` (with
/// `enable_configless,cloud_reg_addrs`, as the service configures a group); the PCS
/// registration emulator listens in the fleet network at [`FLEET_GATEWAY`], names the
/// controller's machine ([`crate::fleet::CTLD_ADDR`]) as the cluster's `SLURMCTLD`
/// endpoint, and knows each instance by the access key of the instance profile its
/// metadata serves; each node (host name `pcs<NNN>`) has the `aws:pcs:*` tags and
/// `pcs.enabled` in its user data, the emulator's endpoint as an image setting. The
/// controller runs `AuthType=auth/slurm`, as the service runs every cluster, and the
/// nodes' settings leave `auth.type` to the image built by the builder's local target
/// ([`crate::fleet::FleetBuilder::auth_left_to_the_join`]). Boot registers, installs the
/// cluster secret as the auth/slurm key and starts slurmd as the `nodeID` the answer
/// names. Once every node the emulator assigned is IDLE, one job step
/// runs a task on each.
///
/// # Errors
/// Any step, or `timeout`, with the nodes' diagnostics.
pub fn pcs_join(nodes: usize, timeout: Duration) -> Result<PcsJoinOutcome> {
    let ids: Vec<String> = (1..=nodes).map(|i| format!("compute-{i}")).collect();
    let mut fleet = Fleet::builder()
        .ctld_line("SlurmctldParameters=enable_configless,cloud_reg_addrs")
        .ctld_line("PrivateData=cloud")
        .ctld_line(format!("NodeName=compute-[1-{nodes}] State=CLOUD CPUs=1"))
        .auth_slurm(true)
        .auth_left_to_the_join(true)
        .start()?;
    let pcs = fleet.netns().run_in(|| {
        PcsEmulator::start_on(std::net::SocketAddr::from((FLEET_GATEWAY, 0)))
            .context("starting the PCS registration emulator in the fleet network")
    })?;
    use base64::Engine as _;
    pcs.add_cluster(PcsCluster {
        id: PCS_CLUSTER.into(),
        name: "fleet".into(),
        region: REGION.into(),
        shared_secret: base64::engine::general_purpose::STANDARD.encode(fleet.ctld.slurm_key()?),
        endpoints: vec![PcsEndpoint {
            endpoint_type: "SLURMCTLD".into(),
            private_ip_address: fleet.ctld.address().to_string(),
            port: fleet.ctld.port().to_string(),
        }],
        groups: vec![PcsGroup {
            id: PCS_GROUP.into(),
            name: "compute".into(),
            nodes: ids.clone(),
            lifecycle_actions: None,
        }],
    });
    let hosts: Vec<String> = (1..=nodes).map(|i| format!("pcs{i:03}")).collect();
    let mut instances = BTreeMap::new();
    let started = Instant::now();
    for (i, host) in hosts.iter().enumerate() {
        let mut l = fleet.new_launch(host);
        let key = format!("ASIAFLEETNODE{i:04}");
        let secret = format!("fleet-secret-{i}");
        let token = format!("fleet-token-{i}");
        pcs.add_instance(PcsInstance {
            instance_id: l.instance_id.clone(),
            role: "AWSPCS-fleet".into(),
            access_key_id: key.clone(),
            secret_access_key: secret.clone(),
            session_token: Some(token.clone()),
            cluster_id: PCS_CLUSTER.into(),
            group_id: PCS_GROUP.into(),
        });
        l.role_credentials = Some(["AWSPCS-fleet".into(), key, secret, token]);
        l.tags = vec![
            ("aws:pcs:cluster-id".into(), PCS_CLUSTER.into()),
            ("aws:pcs:compute-node-group-id".into(), PCS_GROUP.into()),
        ];
        // No controller address in user data: the registration answer names it.
        l.agent_toml = "[pcs]\nenabled = true\nregister_window = \"5m\"\n".into();
        // No auth.type: the image's own drop-in and the managed join decide it.
        l.image_toml = format!("[pcs]\nendpoint = \"{}\"\n", pcs.endpoint());
        instances.insert(host.clone(), l.instance_id.clone());
        fleet.launch(l)?;
    }
    let waited = wait_until(
        "every node of the group to register and be IDLE",
        timeout,
        Duration::from_millis(500),
        || {
            let assigned = pcs.assignments();
            if assigned.len() < nodes {
                bail!("{} of {nodes} instances registered", assigned.len());
            }
            for id in assigned.values() {
                match fleet.ctld.node_state(id)? {
                    Some(st) if is_idle(&st) => {}
                    other => bail!("{id} is {other:?}"),
                }
            }
            Ok(Some(()))
        },
    );
    if let Err(e) = waited {
        bail!(
            "{e:#}\nregistrations: {:?}\n{}",
            pcs.requests(),
            fleet.diagnostics(&hosts)
        );
    }
    let total = started.elapsed();
    let by_instance = pcs.assignments();
    let mut assigned = BTreeMap::new();
    for (host, instance) in &instances {
        let id = by_instance
            .get(instance)
            .with_context(|| format!("{host} ({instance}) has no nodeID"))?;
        assigned.insert(host.clone(), (instance.clone(), id.clone()));
    }
    let mut hostnames = BTreeMap::new();
    for id in by_instance.values() {
        let line = fleet.ctld.scontrol_ok(&["show", "node", "-o", id])?;
        hostnames.insert(
            id.clone(),
            field(&line, "NodeHostName").unwrap_or_default().to_string(),
        );
    }
    let mut registered = BTreeMap::new();
    for r in pcs.requests().iter().filter(|r| r.status == 200) {
        if let Some(i) = &r.instance_id {
            *registered.entry(i.clone()).or_default() += 1;
        }
    }
    let n = format!("-N{nodes}");
    let out = fleet
        .ctld
        .run_job("srun", &[&n, "--ntasks-per-node=1", "hostname"])?;
    if !out.status.success() {
        bail!("srun: {}", String::from_utf8_lossy(&out.stderr));
    }
    let mut job_hosts: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    job_hosts.sort();
    let dropin = fleet
        .image()
        .root
        .join("etc/slurm-node-agent/conf.d/10-image.toml");
    let text = std::fs::read_to_string(&dropin)
        .with_context(|| format!("reading the image's {}", dropin.display()))?;
    // `type = "..."` under `[auth]`, the only shape 70-agent.sh writes it in.
    let mut section = "";
    let mut image_auth_type = None;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
        } else if section == "[auth]" {
            if let Some(v) = line.strip_prefix("type = ") {
                image_auth_type = Some(v.trim_matches('"').to_string());
            }
        }
    }
    let mut auth_on_node = BTreeMap::new();
    for host in &hosts {
        let munge = fleet.exec(host, "systemctl", &["is-active", "munge.service"])?;
        let options = fleet.exec(host, "cat", &["/etc/default/slurmd"])?;
        auth_on_node.insert(
            host.clone(),
            (
                String::from_utf8_lossy(&munge.stdout).trim().to_string(),
                String::from_utf8_lossy(&options.stdout).into_owned(),
            ),
        );
    }
    Ok(PcsJoinOutcome {
        assigned,
        hostnames,
        registered,
        job_hosts,
        total,
        image_auth_type,
        auth_on_node,
    })
}

/// The plan in brackets ending each repair's reason on slurmctld's records (`replace after
/// jobs`, `powered off for replacement at ...`): the reason as Slurm shows it, up to its
/// `[user@time]` suffix.
fn repair_plans(fleet: &Fleet) -> Result<Vec<String>> {
    let out = fleet.ctld.scontrol_ok(&["show", "node", "-o"])?;
    let mut plans = Vec::new();
    for line in out.lines() {
        let Some(reason) = line.split(" Reason=").nth(1) else {
            continue;
        };
        if !reason.starts_with("slurm-node-agent/repair@") {
            continue;
        }
        // Slurm's suffix is the first ` [` whose bracket holds `user@time`.
        let end = reason
            .match_indices(" [")
            .map(|(i, _)| i)
            .find(|i| {
                reason[i + 2..]
                    .split(']')
                    .next()
                    .is_some_and(|b| b.contains('@'))
            })
            .unwrap_or(reason.len());
        if let Some((_, plan)) = reason[..end].rsplit_once(" [") {
            plans.push(plan.trim_end_matches(']').to_string());
        }
    }
    Ok(plans)
}

/// What a fleet repair did ([`repair_replace`]), sampled every half second from slurmctld.
#[derive(Debug, Clone)]
pub struct RepairOutcome {
    /// The most nodes seen at once out of service for a repair: from the repair's drain
    /// (`slurm-node-agent/repair@...`) until its replacement is IDLE and available.
    pub max_out: usize,
    /// The most slots of the budget seen held at once (`scontrol show reservation`).
    pub max_slots: usize,
    /// Instances powered off for a replacement, per instance id.
    pub replaced: BTreeMap<String, u32>,
    /// The distinct repair reasons seen (the plan in each).
    pub reasons: Vec<String>,
    /// From the faults placed to every faulty node's replacement IDLE.
    pub total: Duration,
    /// Per faulty node: the fault placed to its replacement IDLE.
    pub repair_times: Vec<Duration>,
    /// Per replaced node: its power-off seen to its replacement IDLE and available.
    pub replace_times: Vec<Duration>,
    /// The records of NodeNames no instance runs under any more (the powered-off nodes':
    /// the flap guard's history, kept for `repair.flap_window`).
    pub history: Vec<String>,
    /// The NodeNames running at the end.
    pub names: Vec<String>,
    /// Each node's state and reason as they changed.
    pub timeline: Vec<String>,
}

/// A check file that fails on any instance (a CPU count none has: a hardware fault, which
/// the `auto` table replaces), placed on a node to make it faulty.
pub const FAULT_CHECK: &str = "[[check]]\nname = \"cpus\"\nkind = \"hardware\"\ncpus = 9999\n";

/// Places `check` (a check file's text) on node `name` as `checks.d/90-fault.toml`, where
/// its health checks read it at their next pass; `None` takes it away.
///
/// # Errors
/// The node is not running, or the command failed.
pub fn place_fault(fleet: &Fleet, name: &str, check: Option<&str>) -> Result<()> {
    let file = "/etc/slurm-node-agent/checks.d/90-fault.toml";
    let script = match check {
        Some(c) => format!("mkdir -p /etc/slurm-node-agent/checks.d && printf '%s' '{c}' > {file}"),
        None => format!("rm -f {file}"),
    };
    let out = fleet.exec(name, "/bin/sh", &["-c", &script])?;
    if !out.status.success() {
        bail!("placing the fault on {name}: {out:?}");
    }
    Ok(())
}

/// Repairs under a budget (issue 38): `nodes` nodes with `repair.mode = "on"` and
/// `upgrade.max_unavailable = budget` (the breaker out of the way: more nodes fail the
/// same check here than it allows), a `sleep <job_secs>` job on each of the first
/// `faulty`, then [`FAULT_CHECK`] placed on those; the test acts as the auto scaling group:
/// a node whose container powered off is replaced under a new NodeName (`node002r1`, as
/// an Auto Scaling group's replacement named after its host) from the same image, without
/// the fault. Ends when every faulty node's replacement is IDLE and available, then
/// checks that every job completed with exit 0.
///
/// # Errors
/// Any step, or `timeout` after the faults, with the nodes' diagnostics.
pub fn repair_replace(
    nodes: usize,
    faulty: usize,
    budget: usize,
    job_secs: u64,
    timeout: Duration,
) -> Result<RepairOutcome> {
    let toml = format!(
        "[health]\ninterval = \"2s\"\n\n[upgrade]\nmax_unavailable = \"{budget}\"\n\n\
         [repair]\nmode = \"on\"\nsettle = \"4s\"\nbreaker_min_nodes = {}\n",
        nodes + 1
    );
    let mut fleet = Fleet::builder()
        .agent_toml(toml)
        .max_nodes((nodes + faulty).max(crate::fleet::DEFAULT_MAX_NODES))
        .start()?;
    let names: Vec<String> = (1..=nodes).map(|i| format!("node{i:03}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    fleet.launch_all(&refs)?;
    fleet.wait_all_idle(&names, Duration::from_secs(600))?;
    let faulty_names: Vec<String> = names[..faulty].to_vec();
    busy(&fleet, &faulty_names, job_secs)?;
    for name in &faulty_names {
        place_fault(&fleet, name, Some(FAULT_CHECK))?;
    }
    let started = Instant::now();
    // Logical node (its first name) -> the NodeName of its instance now.
    let mut current: BTreeMap<String, String> =
        names.iter().map(|n| (n.clone(), n.clone())).collect();
    let mut generation = 0;
    let mut replaced: BTreeMap<String, u32> = BTreeMap::new();
    let mut reasons: Vec<String> = Vec::new();
    let mut timeline = Vec::new();
    let mut last: BTreeMap<String, (String, String)> = BTreeMap::new();
    // Logical nodes out for a repair: from the repair's drain to the replacement IDLE.
    let mut out: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    let mut repaired: BTreeMap<String, Duration> = BTreeMap::new();
    let mut replaced_at: BTreeMap<String, Instant> = BTreeMap::new();
    let mut replace_times = Vec::new();
    let (mut max_out, mut max_slots) = (0, 0);
    loop {
        let now_names: Vec<String> = current.values().cloned().collect();
        if started.elapsed() > timeout {
            bail!(
                "the repairs did not finish within {timeout:?}: {:?}\n{}\n{}",
                node_table(&fleet).unwrap_or_default(),
                timeline.join("\n"),
                fleet.diagnostics(&now_names)
            );
        }
        let table = node_table(&fleet)?;
        for name in &names {
            let node_name = current[name].clone();
            let (state, reason) = table.get(&node_name).cloned().unwrap_or_default();
            if last.get(name) != Some(&(state.clone(), reason.clone())) {
                timeline.push(format!(
                    "+{:.1} {node_name} {state} {reason}",
                    started.elapsed().as_secs_f64()
                ));
                last.insert(name.clone(), (state.clone(), reason.clone()));
            }
            if reason.starts_with("slurm-node-agent/repair@") {
                out.insert(name.clone());
            }
            let available = !state.is_empty()
                && !state.contains("DRAIN")
                && !state.starts_with("DOWN")
                && !state.ends_with('*')
                && !state.contains("NOT_RESPONDING");
            if node_name != *name && is_idle(&state) && available && out.remove(name) {
                repaired.insert(name.clone(), started.elapsed());
                if let Some(t) = replaced_at.remove(name) {
                    replace_times.push(t.elapsed());
                }
            }
        }
        // The plans in the repairs' reasons, on every record (the powered-off ones too).
        for plan in repair_plans(&fleet)? {
            if !reasons.contains(&plan) {
                reasons.push(plan);
            }
        }
        let slots = fleet
            .ctld
            .scontrol_ok(&["show", "reservation", "-o"])
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("ReservationName=slurm-node-agent-upgrade-"))
            .count();
        max_slots = max_slots.max(slots);
        max_out = max_out.max(out.len());
        if faulty_names.iter().all(|n| repaired.contains_key(n)) {
            break;
        }
        // The auto scaling group: a powered-off instance is replaced under a new name.
        for name in &names {
            let node_name = current[name].clone();
            if fleet.exited(&node_name)?.is_some() {
                *replaced
                    .entry(fleet.instance_id(&node_name).unwrap_or_default())
                    .or_default() += 1;
                generation += 1;
                let next = format!("{name}r{generation}");
                let l = fleet.new_launch(&next);
                fleet.replace(&node_name, l)?;
                current.insert(name.clone(), next);
                replaced_at.insert(name.clone(), Instant::now());
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let total = started.elapsed();
    fleet.wait_no_jobs(Duration::from_secs(120))?;
    fleet.check_no_job_killed(faulty)?;
    let running: std::collections::BTreeSet<String> = current.values().cloned().collect();
    let history: Vec<String> = node_table(&fleet)?
        .into_keys()
        .filter(|n| !running.contains(n))
        .collect();
    Ok(RepairOutcome {
        max_out,
        max_slots,
        replaced,
        reasons,
        total,
        repair_times: repaired.into_values().collect(),
        replace_times,
        history,
        names: running.into_iter().collect(),
        timeline,
    })
}
