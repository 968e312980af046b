//! Shared file systems: FSx for Lustre, EFS, NFS (and any other type) mounted through
//! systemd `.mount` units during bootstrap, and kept honest afterwards.
//!
//! Settings: a `[[mounts]]` array of tables ([`MountSettings`]), from the settings files
//! or the user-data part (tags and flags cannot carry arrays of tables):
//!
//! ```toml
//! [[mounts]]                       # FSx for Lustre, DNS name built from the id
//! mount_point = "/fsx"
//! file_system_id = "fs-0123456789abcdef0"
//! mount_name = "abcdefgh"          # region: the instance's unless given
//!
//! [[mounts]]
//! type = "efs"
//! mount_point = "/home"
//! file_system_id = "fs-12345678"
//! ```
//!
//! For each entry, [`ensure_all`]:
//! 1. checks it ([`MountSettings::resolve`]) and leaves alone, with an error, a mount point
//!    that an `/etc/fstab` line, a unit file not written by the agent, or a different file
//!    system already holds;
//! 2. writes `<unit_dir>/<escaped mount point>.mount` (systemd's own path escaping,
//!    [`escape::mount_unit_name`]) atomically, only when its text changed, then one
//!    `Reload()` when an existing unit file was replaced (a new one is loaded by the start
//!    itself; a failed start is retried once after a `Reload()`);
//! 3. for Lustre, checks that the running kernel has a Lustre module and says so plainly
//!    when not (a kernel updated past its Lustre client is the most common FSx failure);
//! 4. starts the unit through the Manager (`StartUnit`, waiting for the job), retrying
//!    with capped, jittered backoff ([`MOUNT_BACKOFF`]) for the entry's `retry_for`;
//! 5. verifies: the mount table shows the expected type at the mount point, `statfs`
//!    answers within the liveness timeout ([`alive`]) and the mount is writable unless `ro`
//!    was asked for.
//!
//! Running it again changes nothing (no rewrite, no reload, starting an active unit is a
//! no-op). When every required mount is in place it writes the marker
//! [`READY_MARKER`] in the runtime folder; the slurmd drop-in
//! (`units/slurmd.service.d/slurm-node-agent.conf`) has `ConditionPathExists=` on it, so
//! slurmd does not start, by bootstrap or otherwise, while a required mount is missing:
//! a node whose required mounts failed never registers and so never becomes IDLE.
//!
//! Afterwards the daemon calls [`reconcile`] periodically: a required mount that is gone
//! is mounted again; one that is still failing (gone, hung, read-only) drains the node
//! with the agent's `mount` reason ([`DRAIN_REASON_CAUSE`]) naming the mount; once all are
//! back, the agent resumes the node only if the drain is its own (the reason still starts
//! with that prefix). Both go through the drain state machine's gateway
//! ([`crate::node_state::Gateway`]): a mount drain is a cause of `drain.json`, taken only
//! while no cause that outranks it holds the node, and lifted only while it is the one.
//!
//! Floor 5 (subsystems): over `node_state`, through which it drains and resumes; the
//! `[[mounts]]` settings section ([`MountSettings`]) is this module's.

pub mod alive;
pub mod escape;
pub mod host;
pub mod spec;

pub use alive::{alive, AliveError, FsStats};
pub use spec::{MountSpec, SpecError, MARKER};

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::node_state::{Begin, Cause, CauseKind, DrainError, Gateway, Lifted};
use crate::retry::Backoff;
use crate::section::{Classified, HumanDuration, InvalidKey, KeyTrust, Refused};
use crate::slurm::NodeInfo;
use crate::systemd::Systemd;

/// Retrying a mount: the first retry soon (a DNS name or a route that is just coming up),
/// then no more often than every 10 s so a file server that is failing over is not
/// hammered.
pub const MOUNT_BACKOFF: Backoff = Backoff {
    base: Duration::from_millis(250),
    cap: Duration::from_secs(10),
};

/// Marker file (in [`MountEnv::runtime_dir`]) present while every required mount is in
/// place; the slurmd drop-in's `ConditionPathExists=%t/slurm-node-agent/mounts-ready`.
pub const READY_MARKER: &str = "mounts-ready";

/// The agent's reason cause for a missing mount: its drains read
/// `slurm-node-agent/mount@<instance-id>: <mount point>: <why>` ([`crate::reason`]);
/// only such a drain is lifted by [`reconcile`].
pub const DRAIN_REASON_CAUSE: crate::reason::ReasonCause = crate::reason::ReasonCause::Mount;

/// Kind of file system, which decides the source checks and the default options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FsKind {
    /// Lustre (FSx for Lustre or any Lustre): `Type=lustre`.
    Lustre,
    /// Amazon EFS through the kernel NFS client: `Type=nfs4`.
    Efs,
    /// NFS (`nfs`, `nfs4`).
    Nfs,
    /// Anything else the kernel mounts (`tmpfs`, `ext4`, `xfs`, `fuse.*`...).
    Other,
}

impl FsKind {
    fn of(fs_type: &str) -> Result<FsKind, SpecError> {
        Ok(match fs_type {
            "lustre" => FsKind::Lustre,
            "efs" => FsKind::Efs,
            "nfs" | "nfs4" => FsKind::Nfs,
            t if !t.is_empty()
                && t.len() <= 32
                && t.split(['.', '_']).all(|p| {
                    !p.is_empty()
                        && p.chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                }) =>
            {
                FsKind::Other
            }
            t => {
                return Err(spec::SpecError::NotFsType {
                    fs_type: t.to_string(),
                })
            }
        })
    }

    fn default_options(self) -> &'static str {
        match self {
            FsKind::Lustre => spec::LUSTRE_DEFAULT_OPTIONS,
            FsKind::Efs => spec::EFS_DEFAULT_OPTIONS,
            FsKind::Nfs => spec::NFS_DEFAULT_OPTIONS,
            FsKind::Other => "",
        }
    }

    fn documentation(self) -> Option<&'static str> {
        match self {
            FsKind::Lustre => Some(
                "https://docs.aws.amazon.com/fsx/latest/LustreGuide/mounting-ec2-instance.html",
            ),
            FsKind::Efs => Some(
                "https://docs.aws.amazon.com/efs/latest/ug/mounting-fs-mount-cmd-dns-name.html",
            ),
            FsKind::Nfs => Some("man:nfs(5)"),
            FsKind::Other => None,
        }
    }
}

/// One `[[mounts]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MountSettings {
    /// `lustre` (default), `efs`, `nfs`, `nfs4`, or another kernel type (`tmpfs`, `ext4`).
    #[serde(rename = "type")]
    pub fs_type: String,
    /// Where to mount it: an absolute, normalized path.
    pub mount_point: PathBuf,
    /// The source as mount(8) takes it: Lustre `<dns-name>@tcp:/<mount-name>` or NIDs
    /// (`10.0.0.1@o2ib,10.0.0.2@o2ib:10.0.0.3@o2ib:/fs`); NFS/EFS `<host>:/<path>`;
    /// other types a device, image file or name. Or give `file_system_id` instead.
    pub source: String,
    /// FSx or EFS file system id (`fs-` and 17 hex digits): the source is then
    /// `<id>.fsx.<region>.amazonaws.com@tcp:/<mount_name>` (Lustre) or
    /// `<id>.efs.<region>.amazonaws.com:<path>` (EFS).
    pub file_system_id: String,
    /// Region of the file system. Empty: the instance's region.
    pub region: String,
    /// FSx for Lustre MountName (with `file_system_id`).
    pub mount_name: String,
    /// EFS: the path inside the file system (with `file_system_id`); default `/`.
    pub path: String,
    /// Mount options, comma-separated, replacing the defaults (Lustre
    /// `relatime,flock,_netdev`; EFS the options the EFS guide recommends; NFS `_netdev`).
    /// `x-systemd.requires=`, `after=`, `before=` and `mount-timeout=` become unit
    /// dependencies and `TimeoutSec=`.
    pub options: Option<String>,
    /// Options added to the defaults (or to `options`).
    pub extra_options: String,
    /// Lustre: add `x-systemd.requires=lnet.service` (hosts that configure LNet through
    /// `lnet.service`, e.g. for EFA).
    pub lnet: bool,
    /// The node takes no jobs without this mount (default). `false`: a failure is logged
    /// and reported only.
    pub required: bool,
    /// How long bootstrap keeps retrying the mount.
    pub retry_for: HumanDuration,
}

impl Default for MountSettings {
    fn default() -> Self {
        MountSettings {
            fs_type: "lustre".into(),
            mount_point: PathBuf::new(),
            source: String::new(),
            file_system_id: String::new(),
            region: String::new(),
            mount_name: String::new(),
            path: String::new(),
            options: None,
            extra_options: String::new(),
            lnet: false,
            required: true,
            retry_for: HumanDuration(Duration::from_secs(120)),
        }
    }
}

/// `[[mounts]]` may come from user data (the cluster's file systems are a launch-time
/// choice), without unit dependencies; every source is held to the mount point and option
/// allow-lists in [`spec`].
impl Classified for MountSettings {
    const SECTION: &'static str = "mounts";
    const TRUST: &'static [KeyTrust] =
        &[KeyTrust::user_data("mounts").guarded(mounts_without_unit_options)];
}

/// `[[mounts]]` from user data: no unit dependencies (`x-systemd.requires=`, `after=`,
/// `before=` in `options` or `extra_options`; `lnet = true` is the image's
/// `lnet.service`): a dependency starts any unit as root.
pub fn mounts_without_unit_options(v: &toml::Value) -> Result<(), Refused> {
    let Some(list) = v.as_array() else {
        return Ok(());
    };
    for (i, m) in list.iter().enumerate() {
        for field in ["options", "extra_options"] {
            let Some(o) = m.get(field).and_then(toml::Value::as_str) else {
                continue;
            };
            if let Some(bad) = o
                .split(',')
                .find(|o| o.starts_with("x-systemd.") && !o.starts_with("x-systemd.mount-timeout="))
            {
                return Err(Refused::Part {
                    key: format!("mounts[{i}].{field}"),
                    part: bad.to_string(),
                    allowed: "unit dependencies come only from image files and the command line",
                });
            }
        }
    }
    Ok(())
}

/// Checks every entry (with a stand-in region where the instance's will be used) and that
/// no mount point appears twice. For `Settings::validate`.
///
/// # Errors
/// [`InvalidKey`], the key like `mounts[1].source`.
pub fn validate_all(mounts: &[MountSettings]) -> Result<(), InvalidKey> {
    let mut seen: Vec<(usize, String)> = Vec::new();
    for (i, m) in mounts.iter().enumerate() {
        let spec = m
            .resolve("us-east-1")
            .map_err(|e| InvalidKey::new(format!("mounts[{i}].{}", e.key()), e))?;
        if let Some((j, _)) = seen.iter().find(|(_, p)| *p == spec.mount_point) {
            return Err(InvalidKey::new(
                format!("mounts[{i}].mount_point"),
                format!(
                    "{} is also the mount point of mounts[{j}]: each mount point once",
                    spec.mount_point
                ),
            ));
        }
        seen.push((i, spec.mount_point));
    }
    Ok(())
}

/// The host as the mount code sees it. Production values come from [`MountEnv::for_bus`];
/// tests point the paths into a scratch folder or another mount namespace.
#[derive(Debug, Clone)]
pub struct MountEnv {
    /// Where the agent writes its `.mount` units (`/etc/systemd/system`).
    pub unit_dir: PathBuf,
    /// Other unit folders where a unit of the same name would be someone else's.
    pub other_unit_dirs: Vec<PathBuf>,
    /// `/etc/fstab`.
    pub fstab: PathBuf,
    /// The mount table of the namespace the Manager mounts in (`/proc/self/mountinfo`).
    pub mountinfo: PathBuf,
    /// Prefix for paths probed with `statfs` (`/`; `/proc/<pid>/root` to look into another
    /// mount namespace).
    pub root: PathBuf,
    /// The agent's runtime folder, for [`READY_MARKER`] (`/run/slurm-node-agent`).
    pub runtime_dir: PathBuf,
    /// Lustre module lookup.
    pub modules: host::ModuleProbe,
    /// Limit for one `statfs` liveness probe.
    pub alive_timeout: Duration,
}

impl MountEnv {
    /// The system manager's paths: units in `/etc/systemd/system`, marker in
    /// `/run/slurm-node-agent`.
    pub fn system() -> MountEnv {
        MountEnv {
            unit_dir: PathBuf::from("/etc/systemd/system"),
            other_unit_dirs: [
                "/run/systemd/system",
                "/run/systemd/generator",
                "/usr/local/lib/systemd/system",
                "/usr/lib/systemd/system",
                "/lib/systemd/system",
            ]
            .iter()
            .map(PathBuf::from)
            .collect(),
            fstab: PathBuf::from("/etc/fstab"),
            mountinfo: PathBuf::from("/proc/self/mountinfo"),
            root: PathBuf::from("/"),
            runtime_dir: PathBuf::from("/run/slurm-node-agent"),
            modules: host::ModuleProbe {
                modules_dir: PathBuf::from("/lib/modules"),
                filesystems: PathBuf::from("/proc/filesystems"),
                kernel_release: rustix::system::uname()
                    .release()
                    .to_string_lossy()
                    .into_owned(),
            },
            alive_timeout: Duration::from_secs(10),
        }
    }

    /// A user manager's paths (`systemd --user`): units in
    /// `$XDG_CONFIG_HOME/systemd/user` (else `$HOME/.config/systemd/user`), marker in
    /// `$XDG_RUNTIME_DIR/slurm-node-agent` (else `/run/user/<uid>/slurm-node-agent`; what
    /// `%t` means to a user manager).
    pub fn user() -> MountEnv {
        let env = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let config = env("XDG_CONFIG_HOME")
            .or_else(|| env("HOME").map(|h| h.join(".config")))
            .unwrap_or_else(|| PathBuf::from("/root/.config"));
        let runtime = env("XDG_RUNTIME_DIR").unwrap_or_else(|| {
            PathBuf::from(format!("/run/user/{}", rustix::process::geteuid().as_raw()))
        });
        MountEnv {
            unit_dir: config.join("systemd/user"),
            other_unit_dirs: vec![runtime.join("systemd/user")],
            runtime_dir: runtime.join("slurm-node-agent"),
            ..MountEnv::system()
        }
    }

    /// [`MountEnv::system`] for the `system` bus, else [`MountEnv::user`] (a session bus or
    /// a D-Bus address is a user manager's).
    pub fn for_bus(bus: &str) -> MountEnv {
        if bus == "system" {
            MountEnv::system()
        } else {
            MountEnv::user()
        }
    }

    fn probe_path(&self, mount_point: &str) -> PathBuf {
        self.root.join(mount_point.trim_start_matches('/'))
    }

    fn mount_table(&self) -> Vec<host::MountEntry> {
        std::fs::read_to_string(&self.mountinfo)
            .map(|t| host::parse_mountinfo(&t))
            .unwrap_or_default()
    }
}

/// Why a mount is not in place.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// The entry is invalid (e.g. no region known for a file system id).
    #[error("mounts[{index}].{}: {source}", .source.key())]
    Settings {
        /// Index in `[[mounts]]`.
        index: usize,
        /// What is wrong, and the key within the entry ([`SpecError::key`]).
        #[source]
        source: SpecError,
    },
    /// Something else holds the mount point; it was left alone.
    #[error("mount {mount_point}: {what}; left alone")]
    Conflict {
        /// Mount point.
        mount_point: String,
        /// What is there.
        what: String,
    },
    /// Writing the unit file failed.
    #[error("mount {mount_point}: {source}")]
    Write {
        /// Mount point.
        mount_point: String,
        /// The write error.
        #[source]
        source: crate::fsutil::WriteError,
    },
    /// Reloading the Manager failed.
    #[error("systemd reload after writing mount units: {0}")]
    Reload(#[source] Box<crate::systemd::SystemdError>),
    /// No connection to the systemd Manager to mount through.
    #[error("mount {mount_point}: {source}")]
    Manager {
        /// The mount point that needed it.
        mount_point: String,
        /// The connection error.
        #[source]
        source: Box<crate::systemd::SystemdError>,
    },
    /// The mount failed (after retries).
    #[error("mount {mount_point} ({fs_type} {what}) failed after {attempts} attempt(s): {reason}")]
    Failed {
        /// Mount point.
        mount_point: String,
        /// Kernel type.
        fs_type: String,
        /// Source.
        what: String,
        /// Attempts made.
        attempts: u32,
        /// The plain reason (the Lustre module diagnosis first when there is one).
        reason: String,
    },
    /// Mounted, but not usable.
    #[error("mount {mount_point}: {reason}")]
    Unhealthy {
        /// Mount point.
        mount_point: String,
        /// What is wrong (hung, read-only, gone).
        reason: String,
    },
}

/// What happened to one mount.
#[derive(Debug, Clone, Serialize)]
pub struct MountReport {
    /// Mount point.
    pub mount_point: String,
    /// Unit name.
    pub unit: String,
    /// Kernel type.
    pub fs_type: String,
    /// Source.
    pub what: String,
    /// Whether the node needs it.
    pub required: bool,
    /// Whether the unit file was (re)written.
    pub unit_changed: bool,
    /// Start attempts made (0: it was already mounted).
    pub attempts: u32,
    /// Milliseconds spent.
    pub duration_ms: u64,
    /// The error, when it is not in place.
    pub error: Option<String>,
}

/// [`ensure_all`] failed for at least one required mount.
#[derive(Debug, thiserror::Error)]
#[error("required mount(s) not in place, slurmd is not started: {}", .errors.join("; "))]
pub struct MountsFailed {
    /// Every mount's report (also the ones that succeeded).
    pub reports: Vec<MountReport>,
    /// The errors of the required mounts that failed.
    pub errors: Vec<String>,
}

/// Mounts every entry (see the module documentation), optional ones included; writes or
/// removes [`READY_MARKER`].
///
/// # Errors
/// [`MountsFailed`] when a required mount is not in place (optional failures are only
/// reported).
pub async fn ensure_all(
    mounts: &[MountSettings],
    instance_region: &str,
    env: &MountEnv,
    systemd: &Systemd,
) -> Result<Vec<MountReport>, MountsFailed> {
    let mut reports = Vec::new();
    let mut errors = Vec::new();
    let mut planned: Vec<(MountSpec, Instant, bool)> = Vec::new();
    // A new unit file is loaded on demand by StartUnit (systemd 246+ retries units it
    // could not find once its unit folders changed); only a replaced one needs Reload(),
    // which costs 100 ms or more. mount_with_retries reloads once when a start fails and
    // the Manager says the unit changed on disk (older systemd, a stale unit in memory).
    let mut needs_reload = false;
    for (index, m) in mounts.iter().enumerate() {
        let start = Instant::now();
        let result = m
            .resolve(instance_region)
            .map_err(|source| MountError::Settings { index, source })
            .and_then(|spec| {
                let written = install_unit(&spec, env)?;
                Ok((spec, written))
            });
        match result {
            Ok((spec, written)) => {
                needs_reload |= written == UnitWrite::Replaced;
                planned.push((spec, start, written.changed()));
            }
            Err(e) => {
                tracing::error!(error = %e, "mount not in place");
                let required = m.required;
                reports.push(MountReport {
                    mount_point: m.mount_point.display().to_string(),
                    unit: String::new(),
                    fs_type: m.fs_type.clone(),
                    what: m.source.clone(),
                    required,
                    unit_changed: false,
                    attempts: 0,
                    duration_ms: ms(start.elapsed()),
                    error: Some(e.to_string()),
                });
                if required {
                    errors.push(e.to_string());
                }
            }
        }
    }
    if needs_reload {
        if let Err(e) = systemd.reload().await {
            let e = MountError::Reload(Box::new(e));
            errors.push(e.to_string());
            for (spec, start, changed) in planned.drain(..) {
                reports.push(report(&spec, changed, 0, start, Some(e.to_string())));
            }
        }
    }
    for (spec, start, changed) in planned {
        let (attempts, result) = mount_with_retries(&spec, env, systemd).await;
        let error = result.err().map(|e| e.to_string());
        match &error {
            Some(e) if spec.required => {
                tracing::error!(mount_point = %spec.mount_point, error = %e, "required mount not in place");
                errors.push(e.clone());
            }
            Some(e) => {
                tracing::warn!(mount_point = %spec.mount_point, error = %e, "optional mount not in place")
            }
            None => {
                tracing::info!(mount_point = %spec.mount_point, unit = %spec.unit, attempts, "mounted")
            }
        }
        reports.push(report(&spec, changed, attempts, start, error));
    }
    let marker = env.runtime_dir.join(READY_MARKER);
    if errors.is_empty() {
        if std::fs::read_to_string(&marker).is_ok_and(|old| {
            old.lines().eq(reports
                .iter()
                .filter(|r| r.error.is_none())
                .map(|r| r.mount_point.as_str()))
        }) {
            return Ok(reports);
        }
        let text: String = reports
            .iter()
            .filter(|r| r.error.is_none())
            .map(|r| format!("{}\n", r.mount_point))
            .collect();
        let written = std::fs::create_dir_all(&env.runtime_dir)
            .map_err(|e| format!("{}: {e}", env.runtime_dir.display()))
            .and_then(|()| {
                crate::fsutil::write_atomic(&marker, text.as_bytes(), 0o644, None)
                    .map_err(|e| e.to_string())
            });
        if let Err(e) = written {
            errors.push(format!("writing the ready marker: {e}"));
        }
    } else if let Err(e) = std::fs::remove_file(&marker) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(path = %marker.display(), error = %e, "could not remove the ready marker");
        }
    }
    if errors.is_empty() {
        Ok(reports)
    } else {
        Err(MountsFailed { reports, errors })
    }
}

fn report(
    spec: &MountSpec,
    changed: bool,
    attempts: u32,
    start: Instant,
    error: Option<String>,
) -> MountReport {
    MountReport {
        mount_point: spec.mount_point.clone(),
        unit: spec.unit.clone(),
        fs_type: spec.fs_type.clone(),
        what: spec.what.clone(),
        required: spec.required,
        unit_changed: changed,
        attempts,
        duration_ms: ms(start.elapsed()),
        error,
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What [`install_unit`] did to the unit file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitWrite {
    /// Same text already there.
    Unchanged,
    /// There was none: the Manager loads it on the next start.
    Created,
    /// An older text of the agent's was replaced: the Manager needs `Reload()`.
    Replaced,
}

impl UnitWrite {
    /// Whether the file was written.
    pub fn changed(self) -> bool {
        self != UnitWrite::Unchanged
    }
}

/// Writes the spec's unit file unless an fstab line or a foreign unit claims the mount
/// point. Does not reload.
///
/// # Errors
/// [`MountError::Conflict`], [`MountError::Write`].
pub fn install_unit(spec: &MountSpec, env: &MountEnv) -> Result<UnitWrite, MountError> {
    let conflict = |what: String| MountError::Conflict {
        mount_point: spec.mount_point.clone(),
        what,
    };
    if let Ok(fstab) = std::fs::read_to_string(&env.fstab) {
        if let Some((n, line)) = host::fstab_line_for(&fstab, &spec.mount_point) {
            return Err(conflict(format!(
                "{} line {n} already mounts it ({line:?}); remove that line or this [[mounts]] entry",
                env.fstab.display()
            )));
        }
    }
    for dir in &env.other_unit_dirs {
        let p = dir.join(&spec.unit);
        if p.exists() {
            return Err(conflict(format!(
                "unit {} exists and is not the agent's",
                p.display()
            )));
        }
    }
    let path = env.unit_dir.join(&spec.unit);
    let text = spec.unit_text();
    let existed = path.exists();
    match std::fs::read_to_string(&path) {
        Ok(old) if old == text => return Ok(UnitWrite::Unchanged),
        Ok(old) if !old.starts_with(MARKER) => {
            return Err(conflict(format!(
                "unit {} exists and is not the agent's",
                path.display()
            )))
        }
        _ => {}
    }
    std::fs::create_dir_all(&env.unit_dir).map_err(|source| MountError::Write {
        mount_point: spec.mount_point.clone(),
        source: crate::fsutil::WriteError {
            op: "create",
            path: env.unit_dir.clone(),
            source,
        },
    })?;
    crate::fsutil::write_atomic(&path, text.as_bytes(), 0o644, None).map_err(|source| {
        MountError::Write {
            mount_point: spec.mount_point.clone(),
            source,
        }
    })?;
    tracing::info!(unit = %path.display(), "mount unit written");
    Ok(if existed {
        UnitWrite::Replaced
    } else {
        UnitWrite::Created
    })
}

/// Starts the unit until it is mounted and verified or `retry_for` has passed. Returns the
/// attempts made and the outcome.
async fn mount_with_retries(
    spec: &MountSpec,
    env: &MountEnv,
    systemd: &Systemd,
) -> (u32, Result<(), MountError>) {
    // Something else mounted there: leave it alone (systemd would take it for ours). Our
    // own unit still activating (the daemon's mount pass started it beside bootstrap) is
    // not in place yet: a FUSE file system (sshfs) is in the table before its connection
    // is made, and goes again when that fails; its start job's result decides (below), as
    // it does for an entry gone by the time it is checked.
    if let Some(e) = host::mounted_at(&env.mount_table(), &spec.mount_point) {
        if !host::same_fs_type(&spec.fs_type, &e.fs_type) {
            return (
                0,
                Err(MountError::Conflict {
                    mount_point: spec.mount_point.clone(),
                    what: format!("{} {} is already mounted there", e.fs_type, e.source),
                }),
            );
        }
        let activating = systemd
            .active_state(&spec.unit)
            .await
            .is_ok_and(|s| s == "activating");
        if !activating {
            match verify(spec, env).await {
                Err(MountError::Unhealthy { reason, .. }) if reason.starts_with("not mounted") => {}
                r => return (0, r),
            }
        }
    }
    let module = match spec.kind {
        FsKind::Lustre => match env.modules.lustre() {
            Ok(found) => {
                tracing::debug!(%found, "lustre kernel module");
                None
            }
            Err(missing) => {
                tracing::error!(mount_point = %spec.mount_point, "{missing}");
                Some(missing)
            }
        },
        _ => None,
    };
    let start = Instant::now();
    let mut attempt = 0u32;
    let mut reloaded = false;
    // A slow mount says what it waits for every 10 s (journal and `status`).
    let mut progress = crate::progress::Progress::new(
        Some(&env.runtime_dir),
        format!("mount {}", spec.mount_point),
    );
    loop {
        attempt += 1;
        let unit = &spec.unit;
        let mut started = progress
            .during(
                |waited| {
                    format!(
                        "{unit} to start: mounting {} ({}) at {}, attempt {attempt}, {}s so far",
                        spec.what,
                        spec.fs_type,
                        spec.mount_point,
                        waited.as_secs()
                    )
                },
                systemd.start(unit),
            )
            .await;
        if started.is_err() && !reloaded {
            // A stale unit of that name in memory (older systemd): reload once, retry;
            // only when the Manager says the file changed on disk. A mount that fails for
            // itself (a server down) makes no daemon-reload, which the daemon's retries
            // would otherwise make every pass while slurmd runs (docs/slurm-versions.md).
            reloaded = true;
            started = match systemd.reload_if_needed(&[&spec.unit]).await {
                Ok(true) => systemd.start(&spec.unit).await,
                Ok(false) => started,
                Err(e) => Err(e),
            };
        }
        let last = match started {
            Ok(()) => match verify(spec, env).await {
                Ok(()) => return (attempt, Ok(())),
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        };
        let elapsed = start.elapsed();
        // Without a module no retry can succeed: say so at once.
        if module.is_some() || elapsed >= spec.retry_for {
            let reason = match &module {
                Some(missing) => format!("{missing} (systemd: {last})"),
                None => last,
            };
            return (
                attempt,
                Err(MountError::Failed {
                    mount_point: spec.mount_point.clone(),
                    fs_type: spec.fs_type.clone(),
                    what: spec.what.clone(),
                    attempts: attempt,
                    reason,
                }),
            );
        }
        let wait = MOUNT_BACKOFF
            .delay(attempt - 1)
            .min(spec.retry_for.saturating_sub(elapsed));
        tracing::warn!(mount_point = %spec.mount_point, attempt, error = %last, retry_in_ms = ms(wait), "mount failed; retrying");
        tokio::time::sleep(wait).await;
    }
}

/// Checks that the expected file system is mounted at the mount point, answers `statfs`
/// in time and is writable unless `ro` was asked for.
///
/// # Errors
/// [`MountError::Unhealthy`].
pub async fn verify(spec: &MountSpec, env: &MountEnv) -> Result<(), MountError> {
    let bad = |reason: String| MountError::Unhealthy {
        mount_point: spec.mount_point.clone(),
        reason,
    };
    let table = env.mount_table();
    let Some(entry) = host::mounted_at(&table, &spec.mount_point) else {
        return Err(bad(format!(
            "not mounted (not in {})",
            env.mountinfo.display()
        )));
    };
    if !host::same_fs_type(&spec.fs_type, &entry.fs_type) {
        return Err(bad(format!(
            "{} {} is mounted there, not {}",
            entry.fs_type, entry.source, spec.fs_type
        )));
    }
    let stats = alive(&env.probe_path(&spec.mount_point), env.alive_timeout)
        .await
        .map_err(|e| bad(e.to_string()))?;
    if (stats.read_only || entry.read_only()) && !spec.read_only() {
        return Err(bad("mounted read-only".into()));
    }
    Ok(())
}

/// What [`reconcile`] did about the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "action", content = "reason")]
pub enum NodeAction {
    /// Nothing to do.
    None,
    /// Drained (or the agent's drain reason updated) with this reason.
    Drained(String),
    /// The agent's own drain was lifted.
    Resumed,
    /// A required mount is failing but the node is already drained by someone else: left
    /// alone (their reason is kept).
    DrainedByOther(String),
}

/// Result of one [`reconcile`] pass.
#[derive(Debug, Clone, Serialize)]
pub struct ReconcileReport {
    /// Mount points that were missing and were mounted again.
    pub remounted: Vec<String>,
    /// Required mounts not in place, with the reason.
    pub failing: Vec<(String, String)>,
    /// What was done to the node.
    pub node: NodeAction,
}

/// Error of [`reconcile`]: talking to slurmctld, or the drain state, failed.
#[derive(Debug, thiserror::Error)]
#[error("node {node}: {source}")]
pub struct ReconcileError {
    /// NodeName.
    pub node: String,
    /// What failed: scontrol, or `drain.json` / `drain.lock`.
    #[source]
    pub source: DrainError,
}

/// One pass for the daemon (call it periodically, e.g. every 30 s): mounts back what is
/// missing (one attempt each), then drains the node naming the first failing required
/// mount, or lifts the agent's own mount drain when all are back. The systemd Manager is
/// connected to only when a mount must be made again (`systemd`,
/// [`crate::systemd::OnDemand`]). Drains and resumes go through `gateway` (its node, its
/// incarnation's reasons). A drain whose reason
/// is not the agent's `mount` reason (an admin's, a health check's) is never
/// lifted nor overwritten. A hung mount is not touched (unmounting a hung Lustre client
/// needs a person); it only drains.
///
/// # Errors
/// [`ReconcileError`] when scontrol or the drain state fails.
pub async fn reconcile(
    mounts: &[MountSettings],
    instance_region: &str,
    env: &MountEnv,
    systemd: &crate::systemd::OnDemand,
    gateway: &Gateway,
) -> Result<ReconcileReport, ReconcileError> {
    let mut remounted = Vec::new();
    let mut failing = Vec::new();
    let mut reloaded = false;
    for (index, m) in mounts.iter().enumerate() {
        let spec = match m.resolve(instance_region) {
            Ok(s) => s,
            Err(source) => {
                if m.required {
                    let e = MountError::Settings { index, source };
                    failing.push((m.mount_point.display().to_string(), e.to_string()));
                }
                continue;
            }
        };
        let table = env.mount_table();
        let present = host::mounted_at(&table, &spec.mount_point)
            .is_some_and(|e| host::same_fs_type(&spec.fs_type, &e.fs_type));
        let result = if present {
            verify(&spec, env).await
        } else {
            let once = MountSpec {
                retry_for: Duration::ZERO,
                ..spec.clone()
            };
            let written = install_unit(&once, env);
            let replaced = matches!(written, Ok(UnitWrite::Replaced));
            let manager = systemd.get().await.map_err(|e| MountError::Manager {
                mount_point: spec.mount_point.clone(),
                source: Box::new(e),
            });
            let mut r = written.map(drop);
            match (&r, manager) {
                (Err(_), _) => {}
                (Ok(()), Err(e)) => r = Err(e),
                (Ok(()), Ok(systemd)) => {
                    if replaced && !reloaded {
                        reloaded = true;
                        r = systemd
                            .reload()
                            .await
                            .map_err(|e| MountError::Reload(Box::new(e)));
                    }
                    if r.is_ok() {
                        r = mount_with_retries(&once, env, systemd).await.1;
                    }
                }
            }
            if r.is_ok() {
                tracing::info!(mount_point = %spec.mount_point, "mounted again");
                remounted.push(spec.mount_point.clone());
            }
            r
        };
        if let Err(e) = result {
            if spec.required {
                failing.push((spec.mount_point.clone(), e.to_string()));
            } else {
                tracing::warn!(mount_point = %spec.mount_point, error = %e, "optional mount not in place");
            }
        }
    }
    let node = gateway.node();
    let err = |e: DrainError| ReconcileError {
        node: node.to_string(),
        source: e,
    };
    let info = gateway
        .record()
        .await
        .map_err(|e| err(DrainError::Slurm(e)))?;
    let drained = info.as_ref().is_some_and(NodeInfo::is_drained);
    let reason = info
        .as_ref()
        .and_then(|n| n.reason())
        .unwrap_or_default()
        .to_string();
    let ours = drained && crate::reason::is_agent_reason_for(&reason, DRAIN_REASON_CAUSE);
    let action = match failing.first() {
        Some((mount_point, why)) => {
            let wanted = drain_reason(gateway.instance_id(), mount_point, why);
            if drained && !ours {
                NodeAction::DrainedByOther(reason)
            } else if (ours && reason == wanted) || info.is_none() {
                NodeAction::None
            } else {
                let cause = Cause::stated(DRAIN_REASON_CAUSE, gateway.instance_id(), &wanted)
                    .unwrap_or_else(|| Cause::Mount {
                        detail: wanted.clone(),
                    });
                let r = gateway.drain(cause, info.as_ref()).await.map_err(err)?;
                match r.begin {
                    Begin::Started | Begin::Escalated { .. } | Begin::Restated { .. } => {
                        tracing::warn!(%node, reason = %wanted, "node drained");
                        NodeAction::Drained(wanted)
                    }
                    // Another cause of the agent's holds the node (one that outranks the
                    // mounts, or its action is running): its reason stays.
                    Begin::AlreadyDraining { .. } | Begin::AlreadyHandled => {
                        NodeAction::DrainedByOther(r.state.reason.unwrap_or_default())
                    }
                }
            }
        }
        None if ours => match gateway
            .lift(CauseKind::Mount, info.as_ref())
            .await
            .map_err(err)?
        {
            Lifted::Resumed => {
                tracing::info!(%node, "mounts back: the agent's drain lifted");
                NodeAction::Resumed
            }
            Lifted::HeldBy(kind) => {
                tracing::info!(%node, %kind, "mounts back; the node stays drained for its {kind} drain");
                NodeAction::None
            }
            Lifted::LeftToOwner { .. } | Lifted::Nothing => NodeAction::None,
        },
        None => NodeAction::None,
    };
    Ok(ReconcileReport {
        remounted,
        failing,
        node: action,
    })
}

/// `slurm-node-agent/mount@<instance-id>: /fsx: <why>`, cut to Slurm's 256 characters.
pub fn drain_reason(instance_id: &str, mount_point: &str, why: &str) -> String {
    let why = why
        .strip_prefix(&format!("mount {mount_point}: "))
        .unwrap_or(why);
    crate::reason::reason(
        DRAIN_REASON_CAUSE,
        instance_id,
        &format!("{mount_point}: {why}"),
    )
}

/// Whether `path` lies on a mount the agent manages (for health checks that want to skip
/// probing outside them).
pub fn is_managed(mounts: &[MountSettings], path: &Path) -> bool {
    mounts.iter().any(|m| path.starts_with(&m.mount_point))
}

#[cfg(test)]
mod tests;
