//! Host kernel limits that a large fleet ([`crate::fleet`]) outgrows, raised while it runs
//! and put back afterwards.
//!
//! The fleet's nodes are containers without a user namespace: every node's systemd,
//! journald, dbus-daemon, munged and slurmd count against the *host's* per-user limits
//! (root's, or the image's `munge` and `messagebus` users', whose ids are the same in
//! every node), and against machine-wide ones. With the kernel's defaults a fleet stops
//! growing long before memory or CPU run out. What a node of the default image takes,
//! IDLE with the agent's daemon (measured on Debian 12's systemd 252, kernel 6.18; the
//! bench's "host resources per node" line), and what is raised:
//!
//! | limit | default | a node takes | counted here per node |
//! |---|---|---|---|
//! | `fs.inotify.max_user_instances` | 128 | 7 (root's: systemd, journald, dbus, ...) | 16 |
//! | `fs.inotify.max_user_watches` | ~8k-1M | 26 | 256 |
//! | `kernel.pid_max` | 32768 | 22 to 24 processes and threads | 64 |
//! | `net.ipv4.neigh.default.gc_thresh2`, `gc_thresh3` | 512, 1024 | 6 ARP entries (the gateway's and the controller's for it, its own for them; one table for every namespace: 768 for 128 nodes after a job across all) | 8, 16 |
//!
//! inotify instances are what stop a fleet of the defaults first: 18 nodes. Past 85 nodes
//! the ARP table holds more than `gc_thresh2`, and the kernel starts evicting entries in
//! use (each costs a new ARP round trip) until `gc_thresh3`, past which it refuses new
//! neighbours (`neighbour table overflow`): at 170 nodes. Kernel key
//! quotas are not raised: a node's services add one key, root's (`kernel.keys.root_maxkeys`,
//! a million), and none of another user's (`kernel.keys.maxkeys`, 200 per user).
//!
//! [`HostLimits::start`] reads what is in use before the first node (per user, the most
//! any user holds), and [`HostLimits::ensure`] is asked before each launch: when a limit is
//! below `in use + nodes × per node + margin` it is raised, for the fleet's capacity at
//! once (`FleetBuilder::max_nodes`), saying so on stderr. On drop every raised limit whose
//! value is still the one written is put back (another value means someone else changed
//! it meanwhile: left as it is, said on stderr). Raising needs root; when writing fails,
//! the error names the limit, the value it needs and the `sysctl` to run.
//!
//! The per-node figures are the measured ones above with room to spare (a job's
//! processes, the daemon's threads at work).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// What a fleet takes of one limit: `in use at the start + nodes × per_node + margin`.
#[derive(Debug, Clone, Copy)]
struct Need {
    /// The sysctl (dotted), under `/proc/sys`.
    name: &'static str,
    /// In use before the fleet's first node (the most any one user holds, for per-user
    /// limits).
    base: u64,
    /// Per node, with room to spare.
    per_node: u64,
    /// Left over besides the fleet (the host's own processes come and go).
    margin: u64,
}

impl Need {
    fn for_nodes(&self, nodes: usize) -> u64 {
        self.base + nodes as u64 * self.per_node + self.margin
    }
}

/// One limit raised: put back to `old` on drop if it still reads `new`.
#[derive(Debug)]
struct Raised {
    name: &'static str,
    old: u64,
    new: u64,
}

/// Per node: inotify instances (measured: 7, root's).
pub const INOTIFY_INSTANCES_PER_NODE: u64 = 16;
/// Per node: inotify watches (measured: 26).
pub const INOTIFY_WATCHES_PER_NODE: u64 = 256;
/// Per node: processes and threads (measured: 22 to 24 with the agent's daemon).
pub const TASKS_PER_NODE: u64 = 64;
/// Per node: ARP entries in all namespaces together, as many as the table may hold before
/// the kernel evicts entries (`gc_thresh2`; `gc_thresh3` is twice that): measured 6, the
/// gateway's and the controller's entry for the node, the node's for them.
pub const NEIGHBOURS_PER_NODE: u64 = 8;

/// The limits a fleet may raise, and those it raised (put back on drop).
#[derive(Debug)]
pub struct HostLimits {
    needs: Vec<Need>,
    /// How many nodes the fleet may hold at once: the limits are raised for that many.
    capacity: usize,
    raised: Vec<Raised>,
}

fn sysctl_path(name: &str) -> PathBuf {
    Path::new("/proc/sys").join(name.replace('.', "/"))
}

/// A sysctl's value (the first number of the file).
///
/// # Errors
/// When it cannot be read or is no number.
pub fn read_sysctl(name: &str) -> Result<u64> {
    let p = sysctl_path(name);
    let s = fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    s.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("{name} is {s:?}"))
}

fn write_sysctl(name: &str, value: u64) -> Result<()> {
    let p = sysctl_path(name);
    fs::write(&p, value.to_string()).with_context(|| format!("writing {}", p.display()))
}

/// What the host's processes hold now of what a fleet's nodes take.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostUsage {
    /// inotify instances per effective user id.
    pub inotify_instances: BTreeMap<u32, u64>,
    /// inotify watches per effective user id.
    pub inotify_watches: BTreeMap<u32, u64>,
    /// Keys per user id (`/proc/key-users`: `qnkeys`, what the quota counts).
    pub keys: BTreeMap<u32, u64>,
    /// Bytes of keys per user id (`qnbytes`).
    pub key_bytes: BTreeMap<u32, u64>,
    /// Processes and threads of the whole machine.
    pub tasks: u64,
}

impl HostUsage {
    /// Reads `/proc`: every process's inotify descriptors (an instance shared by two
    /// processes counts twice: a little too much, never too little) and threads, and
    /// `/proc/key-users`.
    pub fn now() -> HostUsage {
        let mut u = HostUsage::default();
        let Ok(procs) = fs::read_dir("/proc") else {
            return u;
        };
        for p in procs.flatten() {
            let name = p.file_name();
            let Some(pid) = name
                .to_str()
                .filter(|s| s.bytes().all(|b| b.is_ascii_digit()))
            else {
                continue;
            };
            let dir = Path::new("/proc").join(pid);
            u.tasks += fs::read_dir(dir.join("task")).map_or(0, |t| t.count() as u64);
            let Ok(fds) = fs::read_dir(dir.join("fd")) else {
                continue;
            };
            let euid = fs::read_to_string(dir.join("status"))
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("Uid:"))
                        .and_then(|v| v.split_whitespace().nth(1)?.parse::<u32>().ok())
                })
                .unwrap_or(0);
            for fd in fds.flatten() {
                let inotify =
                    fs::read_link(fd.path()).is_ok_and(|t| t.as_os_str() == "anon_inode:inotify");
                if !inotify {
                    continue;
                }
                *u.inotify_instances.entry(euid).or_default() += 1;
                let watches = fs::read_to_string(dir.join("fdinfo").join(fd.file_name()))
                    .map_or(0, |s| {
                        s.lines().filter(|l| l.starts_with("inotify wd:")).count() as u64
                    });
                *u.inotify_watches.entry(euid).or_default() += watches;
            }
        }
        let key_users = fs::read_to_string("/proc/key-users").unwrap_or_default();
        for (uid, keys, bytes) in parse_key_users(&key_users) {
            u.keys.insert(uid, keys);
            u.key_bytes.insert(uid, bytes);
        }
        u
    }

    /// Per node, between `before` (no node) and `self` (`nodes` nodes up): the most any one
    /// user gained of each kind, and the tasks; (instances, watches, keys, key bytes,
    /// tasks).
    pub fn per_node(&self, before: &HostUsage, nodes: usize) -> [f64; 5] {
        let gain = |a: &BTreeMap<u32, u64>, b: &BTreeMap<u32, u64>| {
            a.iter()
                .map(|(k, v)| v.saturating_sub(b.get(k).copied().unwrap_or(0)))
                .max()
                .unwrap_or(0) as f64
                / nodes.max(1) as f64
        };
        [
            gain(&self.inotify_instances, &before.inotify_instances),
            gain(&self.inotify_watches, &before.inotify_watches),
            gain(&self.keys, &before.keys),
            gain(&self.key_bytes, &before.key_bytes),
            self.tasks.saturating_sub(before.tasks) as f64 / nodes.max(1) as f64,
        ]
    }
}

/// `/proc/key-users` lines: `uid: usage nkeys/nikeys qnkeys/maxkeys qnbytes/maxbytes`, as
/// (uid, qnkeys, qnbytes).
fn parse_key_users(text: &str) -> Vec<(u32, u64, u64)> {
    text.lines()
        .filter_map(|l| {
            let (uid, rest) = l.trim().split_once(':')?;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let first = |s: &str| s.split('/').next()?.parse::<u64>().ok();
            Some((
                uid.trim().parse().ok()?,
                first(f.get(2)?)?,
                first(f.get(3)?)?,
            ))
        })
        .collect()
}

fn most(m: &BTreeMap<u32, u64>) -> u64 {
    m.values().copied().max().unwrap_or(0)
}

impl HostLimits {
    /// Reads what is in use now (before the fleet's first node) for a fleet of at most
    /// `capacity` nodes. Changes nothing.
    pub fn start(capacity: usize) -> HostLimits {
        let u = HostUsage::now();
        let needs = vec![
            Need {
                name: "fs.inotify.max_user_instances",
                base: most(&u.inotify_instances),
                per_node: INOTIFY_INSTANCES_PER_NODE,
                margin: 64,
            },
            Need {
                name: "fs.inotify.max_user_watches",
                base: most(&u.inotify_watches),
                per_node: INOTIFY_WATCHES_PER_NODE,
                margin: 8192,
            },
            Need {
                name: "kernel.pid_max",
                base: u.tasks,
                per_node: TASKS_PER_NODE,
                margin: 4096,
            },
            // Soft, then hard maximum of ARP entries (all namespaces together); the
            // fleet's namespaces start with none.
            Need {
                name: "net.ipv4.neigh.default.gc_thresh2",
                base: 0,
                per_node: NEIGHBOURS_PER_NODE,
                margin: 256,
            },
            Need {
                name: "net.ipv4.neigh.default.gc_thresh3",
                base: 0,
                per_node: 2 * NEIGHBOURS_PER_NODE,
                margin: 512,
            },
        ];
        HostLimits {
            needs,
            capacity,
            raised: Vec::new(),
        }
    }

    /// Before the fleet holds `nodes` nodes: raises each limit below what they need, to
    /// what the fleet's capacity needs (once, not node by node), saying so on stderr.
    ///
    /// # Errors
    /// A limit that cannot be read or written (not root), naming it and the value needed.
    pub fn ensure(&mut self, nodes: usize) -> Result<()> {
        for need in &self.needs {
            // A kernel without this limit (no such file) has nothing to raise.
            if !sysctl_path(need.name).exists() {
                continue;
            }
            let now = read_sysctl(need.name)?;
            if now >= need.for_nodes(nodes) {
                continue;
            }
            let new = need.for_nodes(self.capacity.max(nodes));
            if let Err(e) = write_sysctl(need.name, new) {
                bail!(
                    "{} is {now}, a fleet of {nodes} nodes needs about {} ({} in use + {} per \
                     node + {}), and raising it failed ({e:#}): run `sysctl -w {}={new}` as \
                     root, or use fewer nodes",
                    need.name,
                    need.for_nodes(nodes),
                    need.base,
                    need.per_node,
                    need.margin,
                    need.name
                );
            }
            eprintln!(
                "slurm-e2e fleet: raised {} from {now} to {new} for up to {} nodes ({} in use \
                 + {} per node + {}); put back when the fleet is dropped",
                need.name,
                self.capacity.max(nodes),
                need.base,
                need.per_node,
                need.margin
            );
            // Raised once for the whole run: an earlier raise of the same limit keeps its
            // original value.
            match self.raised.iter_mut().find(|r| r.name == need.name) {
                Some(r) => r.new = new,
                None => self.raised.push(Raised {
                    name: need.name,
                    old: now,
                    new,
                }),
            }
        }
        Ok(())
    }
}

impl Drop for HostLimits {
    fn drop(&mut self) {
        for r in self.raised.drain(..).rev() {
            match read_sysctl(r.name) {
                Ok(v) if v == r.new => match write_sysctl(r.name, r.old) {
                    Ok(()) => eprintln!(
                        "slurm-e2e fleet: put {} back from {} to {}",
                        r.name, r.new, r.old
                    ),
                    Err(e) => eprintln!(
                        "slurm-e2e fleet: putting {} back to {}: {e:#}",
                        r.name, r.old
                    ),
                },
                Ok(v) => eprintln!(
                    "slurm-e2e fleet: {} is {v}, not the {} the fleet set: left as it is \
                     (it was {})",
                    r.name, r.new, r.old
                ),
                Err(e) => eprintln!("slurm-e2e fleet: {e:#}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_users_give_each_uid_its_quota_counts() {
        let text = "    0:    11 10/10 5/1000000 90/25000000\n  105:     2 2/2 2/200 33/20000\n";
        assert_eq!(parse_key_users(text), vec![(0, 5, 90), (105, 2, 33)]);
        assert_eq!(most(&[(0, 9), (105, 2)].into()), 9);
    }

    #[test]
    fn a_need_counts_what_is_in_use_each_node_and_the_margin() {
        let n = Need {
            name: "fs.inotify.max_user_instances",
            base: 20,
            per_node: 16,
            margin: 64,
        };
        assert_eq!(n.for_nodes(0), 84);
        assert_eq!(n.for_nodes(128), 20 + 128 * 16 + 64);
    }

    #[test]
    fn per_node_is_the_most_any_user_gained() {
        let before = HostUsage {
            inotify_instances: [(0, 10)].into(),
            tasks: 100,
            ..HostUsage::default()
        };
        let after = HostUsage {
            inotify_instances: [(0, 38), (101, 4)].into(),
            keys: [(105, 8)].into(),
            tasks: 260,
            ..HostUsage::default()
        };
        let [inst, watches, keys, _, tasks] = after.per_node(&before, 4);
        assert_eq!((inst, watches, keys, tasks), (7.0, 0.0, 2.0, 40.0));
    }
}
