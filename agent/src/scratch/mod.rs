//! Node-local scratch on instance storage (issue 24 §2): the instance store NVMe disks,
//! found by what the kernel says they are ([`disks`]), striped into one btrfs file system
//! and mounted at `scratch.mount_point` (`/scratch`) with mode `1777`, at every boot before
//! slurmd starts, as ParallelCluster does with its RAID 0.
//!
//! ```toml
//! [scratch]
//! enabled = true          # default: when the instance has instance storage
//! mount_point = "/scratch"
//! disks = 0               # how many to wait for; 0: those present once they settle
//! wait = "30s"            # bound on the wait for the disks
//! ```
//!
//! [`ensure`] decides from what the disks hold, never from a record of its own:
//! - all blank (as instance storage is after a stop and start): `mkfs.btrfs` (one disk
//!   `-d single`, several `-d raid0 -m raid1`), then mount;
//! - every disk a member of the same btrfs, all of its `num_devices` present (a reboot:
//!   instance storage keeps its data): mounted again, never re-created;
//! - already mounted there: only the mode is set again;
//! - anything else (a half-made array from the last boot, a member missing, a disk with
//!   another file system or a partition table, a disk too small): [`ScratchError`] naming
//!   the disk; nothing is written to any disk.
//!
//! Bootstrap never fails for scratch: it logs the error, starts slurmd, and drains the
//! node with the reason `slurm-node-agent/scratch@<instance-id>: <mount point>: <why>`
//! ([`drain_reason`]), which the next boot lifts when scratch is then in place.
//!
//! Floor 6 (subsystems): over [`crate::mounts`]'s mount table parser.

pub mod assemble;
pub mod boot;
pub mod disks;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::section::{Classified, HumanDuration, InvalidKey, KeyTrust};
pub use assemble::Runner;
pub use disks::{Content, Disk, Probe};

/// The mode of the scratch root: everyone writes, only the owner removes (as `/tmp`).
pub const MODE: u32 = 0o1777;

/// The smallest disk the agent makes btrfs on: below this, mkfs.btrfs refuses (its
/// minimum is about 114 MiB per device for these profiles) or the file system is useless.
pub const MIN_DISK_BYTES: u64 = 256 * 1024 * 1024;

/// How long the set of disks must stay the same, with `scratch.disks = 0`, before it is
/// taken: the NVMe driver probes the disks of one instance within this.
pub const SETTLE: Duration = Duration::from_secs(2);

/// `[scratch]`: node-local scratch on the instance store disks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScratchSettings {
    /// Mount the instance store disks (as ParallelCluster does): nothing happens on an
    /// instance type without instance storage. `false`: the disks are left alone.
    pub enabled: bool,
    /// Where the scratch file system is mounted (mode `1777`): an absolute, normalized
    /// path outside the system's own folders. Point Slurm's `TmpFS` here.
    pub mount_point: PathBuf,
    /// How many instance store disks to wait for (the instance type's count). `0`: those
    /// present once the set stops changing for 2 s (none at the first look: no instance
    /// storage, no wait). Fewer within `scratch.wait` drains the node, naming the ones
    /// found.
    pub disks: u32,
    /// The longest bootstrap waits for the disks to appear (and for every member of an
    /// existing array).
    pub wait: HumanDuration,
}

impl Default for ScratchSettings {
    fn default() -> Self {
        ScratchSettings {
            enabled: true,
            mount_point: PathBuf::from("/scratch"),
            disks: 0,
            wait: HumanDuration(Duration::from_secs(30)),
        }
    }
}

/// All of `[scratch]` may come from user data (a cluster's queues choose their scratch at
/// launch, as ParallelCluster's `EphemeralVolume`); the mount point is checked the same
/// whatever its source.
impl Classified for ScratchSettings {
    const SECTION: &'static str = "scratch";
    const TRUST: &'static [KeyTrust] = &[
        KeyTrust::user_data("enabled"),
        KeyTrust::user_data("mount_point"),
        KeyTrust::user_data("disks"),
        KeyTrust::user_data("wait"),
    ];
}

/// Folders the scratch may not be mounted on or under.
const SYSTEM_TREES: &[&str] = &[
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/root",
    "/run", "/sbin", "/sys", "/usr", "/var",
];

impl ScratchSettings {
    /// Checks `mount_point` (absolute, normalized, not `/` nor in a system folder) and
    /// `disks` (at most 24, the most any instance type has).
    ///
    /// # Errors
    /// [`InvalidKey`] naming `scratch.mount_point` or `scratch.disks`.
    pub fn validate(&self) -> Result<(), InvalidKey> {
        let p = &self.mount_point;
        let bad = |why: &str| {
            Err(InvalidKey::new(
                "scratch.mount_point",
                format!("{}: {why}", p.display()),
            ))
        };
        let text = p.to_string_lossy();
        if !p.is_absolute() {
            return bad("must be an absolute path");
        }
        let normal = p
            .components()
            .skip(1)
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !normal || text.ends_with('/') || text.contains("//") {
            return bad("must be normalized (no `.`, `..`, `//` or trailing `/`)");
        }
        if text == "/" {
            return bad("must not be the root");
        }
        if let Some(t) = SYSTEM_TREES
            .iter()
            .find(|t| text == **t || text.starts_with(&format!("{t}/")))
        {
            return bad(&format!("must not be in the system folder {t}"));
        }
        if self.disks > 24 {
            return Err(InvalidKey::new(
                "scratch.disks",
                format!(
                    "{}: no instance type has more than 24 instance store disks",
                    self.disks
                ),
            ));
        }
        Ok(())
    }
}

/// Why scratch is not in place. Each names the disk (its by-id name and device) or the
/// setting; none leaves anything written on a disk.
#[derive(Debug, thiserror::Error)]
pub enum ScratchError {
    /// A by-id name says instance storage but the kernel says otherwise.
    #[error("{disk} ({}): {what}", device.display())]
    NotInstanceStore {
        /// The by-id name.
        disk: String,
        /// The device it resolves to.
        device: PathBuf,
        /// What the kernel says it is.
        what: String,
    },
    /// Fewer disks than `scratch.disks` appeared within `scratch.wait`.
    #[error(
        "{found} of the {expected} instance store disks (scratch.disks) appeared within \
         {waited:?} (scratch.wait): {}",
        if names.is_empty() { "none".to_string() } else { names.join(", ") }
    )]
    Missing {
        /// `scratch.disks`.
        expected: u32,
        /// How many appeared.
        found: usize,
        /// The ones that did.
        names: Vec<String>,
        /// How long it waited.
        waited: Duration,
    },
    /// The disks hold a btrfs that is not whole, or a mix: a half-made array from an
    /// earlier boot, a member that vanished, or blank disks beside members.
    #[error(
        "btrfs {fsid} spans {num_devices} disk(s) but {}; {}: a half-made or incomplete \
         array; nothing re-created (to start over, erase every disk: wipefs -a)",
        members.join(", "),
        if others.is_empty() { "no other disk".to_string() } else { others.join(", ") }
    )]
    Incomplete {
        /// The file system's UUID.
        fsid: String,
        /// Devices it spans, by its superblock.
        num_devices: u64,
        /// Its members found (`<disk> is devid N`).
        members: Vec<String>,
        /// The other disks and what they hold (`<disk> is blank`).
        others: Vec<String>,
    },
    /// A disk holds something the agent did not make (another file system, a partition
    /// table, members of two btrfs): left alone.
    #[error("{disk} holds {what}, not a scratch file system of the agent's; left alone (to use it as scratch, erase it: wipefs -a)")]
    Foreign {
        /// The disk.
        disk: String,
        /// What it holds.
        what: String,
    },
    /// A blank disk too small for the file system.
    #[error("{disk} is {} MiB, too small for the scratch file system (at least {} MiB per disk); nothing made", bytes / (1024 * 1024), MIN_DISK_BYTES / (1024 * 1024))]
    TooSmall {
        /// The disk.
        disk: String,
        /// Its size in bytes.
        bytes: u64,
    },
    /// Something other than the scratch is mounted at the mount point.
    #[error("scratch.mount_point {mount_point}: {what} is mounted there; left alone")]
    Busy {
        /// The mount point.
        mount_point: String,
        /// The mount there.
        what: String,
    },
    /// A program failed (`mkfs.btrfs`, `mount`, `blkid`) or ran past its bound.
    #[error("{command} (disks {}): {why}", disks.join(", "))]
    Command {
        /// The command line.
        command: String,
        /// The disks it was about.
        disks: Vec<String>,
        /// Its status and last words.
        why: String,
    },
    /// A file or device could not be read (a disk that vanished: `No such device`).
    #[error("{}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl ScratchError {
    fn io(path: &Path, source: std::io::Error) -> ScratchError {
        ScratchError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// The host as scratch sees it: production values from [`ScratchEnv::system`]; tests
/// present loop devices through their own by-id folder.
#[derive(Debug, Clone)]
pub struct ScratchEnv {
    /// Where disks are found, and whether loop devices are accepted.
    pub probe: Probe,
    /// The programs.
    pub runner: Runner,
    /// The mount table (`/proc/self/mountinfo`).
    pub mountinfo: PathBuf,
    /// How long the set of disks must stay the same ([`SETTLE`]).
    pub settle: Duration,
}

impl ScratchEnv {
    /// The host: `/dev/disk/by-id`, loop devices refused.
    pub fn system() -> ScratchEnv {
        ScratchEnv {
            probe: Probe::system(),
            runner: Runner::default(),
            mountinfo: PathBuf::from("/proc/self/mountinfo"),
            settle: SETTLE,
        }
    }
}

/// What [`ensure`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Blank disks: a file system was made and mounted.
    Created,
    /// An existing file system (a reboot) was mounted again.
    Assembled,
    /// It was mounted already.
    AlreadyMounted,
}

/// Scratch in place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Ready {
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// The disks, by by-id name.
    pub disks: Vec<String>,
    /// Its size in MiB (Slurm's `TmpDisk`).
    pub size_mib: u64,
    /// What was done.
    pub action: Action,
}

/// What [`ensure`] found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "scratch")]
pub enum Outcome {
    /// `scratch.enabled = false`.
    Disabled,
    /// No instance store disk: nothing to do.
    NoDisks,
    /// Mounted.
    Ready(Ready),
}

impl Outcome {
    /// The size for Slurm's `TmpDisk`, when scratch is in place.
    pub fn tmp_disk_mib(&self) -> Option<u64> {
        match self {
            Outcome::Ready(r) => Some(r.size_mib),
            _ => None,
        }
    }
}

/// Puts scratch in place (see the module docs). Blocking: programs run and disks are read;
/// bounded by `scratch.wait` and the runner's timeout per program. Running it again
/// converges.
///
/// # Errors
/// [`ScratchError`], naming the disk; no disk is written unless every one was blank.
pub fn ensure(s: &ScratchSettings, env: &ScratchEnv) -> Result<Outcome, ScratchError> {
    if !s.enabled {
        return Ok(Outcome::Disabled);
    }
    let (found, contents) = wait_for_disks(s, env)?;
    if found.is_empty() {
        return Ok(Outcome::NoDisks);
    }
    let mp = s.mount_point.to_string_lossy().into_owned();
    let names = found.iter().map(|d| d.id.clone()).collect::<Vec<_>>();
    // Already mounted (bootstrap run again): only the mode is set again.
    let table = std::fs::read_to_string(&env.mountinfo)
        .map(|t| crate::mounts::host::parse_mountinfo(&t))
        .unwrap_or_default();
    if let Some(e) = crate::mounts::host::mounted_at(&table, &mp) {
        let ours = e.fs_type == "btrfs"
            && std::fs::canonicalize(&e.source)
                .is_ok_and(|src| found.iter().any(|d| d.device == src));
        if !ours {
            return Err(ScratchError::Busy {
                mount_point: mp,
                what: format!("{} {}", e.fs_type, e.source),
            });
        }
        assemble::set_mode(&s.mount_point, MODE)?;
        return ready(s, names, Action::AlreadyMounted);
    }
    let action = decide(env, &found, &contents)?;
    if action == Action::Created {
        assemble::make_btrfs(&env.runner, &found)?;
    }
    assemble::mount(&env.runner, &found, &s.mount_point, MODE)?;
    ready(s, names, action)
}

fn ready(s: &ScratchSettings, disks: Vec<String>, action: Action) -> Result<Outcome, ScratchError> {
    Ok(Outcome::Ready(Ready {
        mount_point: s.mount_point.clone(),
        disks,
        size_mib: assemble::size_mib(&s.mount_point)?,
        action,
    }))
}

/// Looks for the disks until the set is whole: `scratch.disks` of them (when set), every
/// member of a btrfs found on them, and the same set for [`ScratchEnv::settle`]; at most
/// `scratch.wait`. Returns the disks and what each holds.
fn wait_for_disks(
    s: &ScratchSettings,
    env: &ScratchEnv,
) -> Result<(Vec<Disk>, Vec<Content>), ScratchError> {
    let start = Instant::now();
    let deadline = start + s.wait.0;
    let mut last: Option<(Vec<Disk>, Instant)> = None;
    loop {
        let found = disks::discover(&env.probe)?;
        let now = Instant::now();
        let since = match &last {
            Some((prev, since)) if *prev == found => *since,
            _ => now,
        };
        last = Some((found.clone(), since));
        let enough = s.disks == 0 || found.len() >= s.disks as usize;
        // With `scratch.disks` set, the count decides; else the set staying the same (or
        // the bound: a set still changing then is taken as it is). None at all: an instance
        // type without instance storage (the kernel has named its NVMe disks long before
        // bootstrap runs), and no wait added to its boot.
        let settled = s.disks > 0
            || found.is_empty()
            || now.duration_since(since) >= env.settle
            || now >= deadline;
        if enough && settled {
            let contents = found
                .iter()
                .map(|d| disks::content(d, &env.runner))
                .collect::<Result<Vec<_>, _>>()?;
            // An array from an earlier boot whose members are not all here yet: wait on.
            let whole = contents.iter().all(|c| match c {
                Content::Btrfs(m) => {
                    let n = contents
                        .iter()
                        .filter(|o| matches!(o, Content::Btrfs(x) if x.fsid == m.fsid))
                        .count();
                    n as u64 >= m.num_devices
                }
                _ => true,
            });
            if whole || now >= deadline {
                return Ok((found, contents));
            }
        } else if !enough && now >= deadline {
            return Err(ScratchError::Missing {
                expected: s.disks,
                found: found.len(),
                names: found.iter().map(ToString::to_string).collect(),
                waited: start.elapsed(),
            });
        }
        std::thread::sleep(
            Duration::from_millis(200).min(env.settle.max(Duration::from_millis(20))),
        );
    }
}

/// What to do with `found` holding `contents`: make (all blank), assemble (one whole
/// btrfs), or refuse.
fn decide(env: &ScratchEnv, found: &[Disk], contents: &[Content]) -> Result<Action, ScratchError> {
    if contents.iter().all(|c| *c == Content::Blank) {
        for d in found {
            let bytes = disks::size_bytes(&env.probe, d).unwrap_or(u64::MAX);
            if bytes < MIN_DISK_BYTES {
                return Err(ScratchError::TooSmall {
                    disk: d.to_string(),
                    bytes,
                });
            }
        }
        return Ok(Action::Created);
    }
    if let Some((d, Content::Other(what))) = found
        .iter()
        .zip(contents)
        .find(|(_, c)| matches!(c, Content::Other(_)))
    {
        return Err(ScratchError::Foreign {
            disk: d.to_string(),
            what: what.clone(),
        });
    }
    // Members of btrfs file systems, maybe beside blank disks.
    let members: Vec<(&Disk, &disks::BtrfsMember)> = found
        .iter()
        .zip(contents)
        .filter_map(|(d, c)| match c {
            Content::Btrfs(m) => Some((d, m)),
            _ => None,
        })
        .collect();
    let (_, first) = members[0];
    if let Some((d, m)) = members.iter().find(|(_, m)| m.fsid != first.fsid) {
        return Err(ScratchError::Foreign {
            disk: d.to_string(),
            what: format!(
                "a member of btrfs {} while another disk holds btrfs {}",
                m.fsid, first.fsid
            ),
        });
    }
    let blank: Vec<String> = found
        .iter()
        .zip(contents)
        .filter(|(_, c)| **c == Content::Blank)
        .map(|(d, _)| format!("{d} is blank"))
        .collect();
    let mut devids: Vec<u64> = members.iter().map(|(_, m)| m.devid).collect();
    devids.sort_unstable();
    devids.dedup();
    if !blank.is_empty()
        || (members.len() as u64) != first.num_devices
        || devids.len() != members.len()
    {
        let present: Vec<String> = members
            .iter()
            .map(|(d, m)| format!("{d} is devid {}", m.devid))
            .collect();
        let missing: Vec<String> = (1..=first.num_devices)
            .filter(|i| !devids.contains(i))
            .map(|i| i.to_string())
            .collect();
        let mut said = present;
        if !missing.is_empty() {
            said.push(format!("devid {} not found", missing.join(", ")));
        }
        return Err(ScratchError::Incomplete {
            fsid: first.fsid.clone(),
            num_devices: first.num_devices,
            members: said,
            others: blank,
        });
    }
    Ok(Action::Assembled)
}

/// The agent's drain reason for scratch not in place:
/// `slurm-node-agent/scratch@<instance-id>: <mount point>: <why>` (cut to Slurm's length).
pub fn drain_reason(instance_id: &str, mount_point: &Path, why: &ScratchError) -> String {
    crate::reason::reason(
        crate::reason::ReasonCause::Scratch,
        instance_id,
        &format!("{}: {why}", mount_point.display()),
    )
}

/// What the node's `TmpDisk` (from slurm.conf, for a node that is not dynamic) says
/// against the scratch size: a warning when they differ by more than 1%, `None` when they
/// agree or slurmctld gave none.
pub fn tmp_disk_mismatch(
    conf_tmp_disk: Option<u64>,
    size_mib: u64,
    mount_point: &Path,
) -> Option<String> {
    let conf = conf_tmp_disk?;
    let diff = conf.abs_diff(size_mib);
    (diff * 100 > size_mib.max(1)).then(|| {
        format!(
            "slurm.conf gives this node TmpDisk={conf} while its scratch at {} is {size_mib} MiB: \
             set TmpDisk={size_mib} (and TmpFS={}) in the cluster's slurm.conf",
            mount_point.display(),
            mount_point.display()
        )
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn mount_point_is_checked() {
        let mut s = ScratchSettings::default();
        assert!(s.validate().is_ok());
        for bad in ["scratch", "/", "/etc/x", "/var", "/a/../b", "/a/"] {
            s.mount_point = PathBuf::from(bad);
            let e = s.validate().unwrap_err().to_string();
            assert!(e.contains("scratch.mount_point"), "{bad}: {e}");
        }
        s.mount_point = PathBuf::from("/local/scratch");
        assert!(s.validate().is_ok());
        s.disks = 25;
        assert!(s
            .validate()
            .unwrap_err()
            .to_string()
            .contains("scratch.disks"));
    }

    #[test]
    fn tmp_disk_warning() {
        let mp = Path::new("/scratch");
        assert_eq!(tmp_disk_mismatch(None, 1000, mp), None);
        assert_eq!(tmp_disk_mismatch(Some(1005), 1000, mp), None);
        let w = tmp_disk_mismatch(Some(0), 1000, mp).unwrap();
        assert!(w.contains("TmpDisk=0") && w.contains("TmpDisk=1000"), "{w}");
    }
}
