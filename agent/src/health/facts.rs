//! Host facts shared by the checks of one run, each read at most once and only when a
//! check needs it: `/proc/mounts`, `/proc/cpuinfo`, `/proc/meminfo`, the process table,
//! `/proc/net/dev`, `/proc/loadavg`, `/etc/passwd`, dmidecode's output.
//!
//! Everything is read from files under configurable roots ([`Host`]) so tests point the
//! checks at fixture trees; no process is spawned except `dmidecode`.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// What the health checks did to a file or folder of the host when the OS refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostOp {
    /// Reading a file.
    Read,
    /// Opening a file.
    Open,
    /// Listing a folder (`/proc`).
    List,
    /// Creating a folder.
    Create,
}

impl HostOp {
    fn verb(self) -> &'static str {
        match self {
            HostOp::Read => "reading",
            HostOp::Open => "opening",
            HostOp::List => "listing",
            HostOp::Create => "creating",
        }
    }
}

/// A file or folder of the host the OS refused: `<verb> <path>: <error>`. Clone (the I/O
/// error is shared) because a fact is read once and given to every check that needs it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{} {}: {source}", op.verb(), path.display())]
pub struct HostIo {
    /// What was done.
    pub op: HostOp,
    /// The file or folder.
    pub path: PathBuf,
    /// Why.
    #[source]
    pub source: Arc<std::io::Error>,
}

impl HostIo {
    /// `op` on `path` failed with `e`.
    pub fn new(op: HostOp, path: &Path, e: impl Into<std::io::Error>) -> HostIo {
        HostIo {
            op,
            path: path.to_path_buf(),
            source: Arc::new(e.into()),
        }
    }
}

/// A host fact that could not be read; each variant names the file, folder or program.
/// Clone (the I/O error is shared) because a fact is read once and given to every check
/// that needs it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FactsError {
    /// A file could not be read or opened, or procfs listed.
    #[error(transparent)]
    Io(#[from] HostIo),
    /// A file did not hold what it should (`/proc/loadavg`).
    #[error("{}: unexpected content {content:?}", path.display())]
    Unexpected {
        /// The file.
        path: PathBuf,
        /// What it held.
        content: String,
    },
    /// A program could not be started.
    #[error("running {}: {source}", program.display())]
    Spawn {
        /// The program.
        program: PathBuf,
        /// Why.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// A program exited with a failure status.
    #[error("{} exited with {status}", program.display())]
    Exit {
        /// The program.
        program: PathBuf,
        /// Its exit status.
        status: std::process::ExitStatus,
    },
}

/// The default of `agent.state_dir` ([`Host::state_dir`] unless the caller sets the
/// configured one).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/slurm-node-agent";

/// Where host facts come from.
#[derive(Debug, Clone)]
pub struct Host {
    /// procfs (`/proc`).
    pub proc_dir: PathBuf,
    /// sysfs (`/sys`).
    pub sys_dir: PathBuf,
    /// The passwd file for user names (`/etc/passwd`).
    pub passwd: PathBuf,
    /// The dmidecode program (`/usr/sbin/dmidecode`).
    pub dmidecode: PathBuf,
    /// The kernel log device for GPU XID errors (`/dev/kmsg`).
    pub kmsg: PathBuf,
    /// The agent's state folder (`agent.state_dir`, default `/var/lib/slurm-node-agent`),
    /// where a check keeps what it compares between runs (the EFA counters). A folder
    /// that does not exist keeps nothing.
    pub state_dir: PathBuf,
}

impl Default for Host {
    fn default() -> Self {
        Host {
            proc_dir: PathBuf::from("/proc"),
            sys_dir: PathBuf::from("/sys"),
            passwd: PathBuf::from("/etc/passwd"),
            dmidecode: PathBuf::from("/usr/sbin/dmidecode"),
            kmsg: PathBuf::from("/dev/kmsg"),
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
        }
    }
}

/// One line of `/proc/mounts`, with octal escapes (`\040`) decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Source (device, `server:/export`, `tmpfs`...).
    pub source: String,
    /// Mount point.
    pub target: String,
    /// File system type.
    pub fstype: String,
    /// Options, comma separated.
    pub options: String,
}

/// CPU counts as NHC computes them from `/proc/cpuinfo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuInfo {
    /// Distinct `physical id`s.
    pub sockets: u32,
    /// Sockets × `cpu cores`.
    pub cores: u32,
    /// Sockets × `siblings`.
    pub threads: u32,
    /// `processor` entries (online logical CPUs).
    pub processors: u32,
}

/// `/proc/meminfo`, in KiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemInfo {
    /// MemTotal.
    pub ram_total: u64,
    /// MemFree + Buffers + Cached (NHC's "free RAM").
    pub ram_free: u64,
    /// SwapTotal.
    pub swap_total: u64,
    /// SwapFree.
    pub swap_free: u64,
}

/// One process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcEntry {
    /// PID.
    pub pid: u32,
    /// Command line joined by spaces (`[comm]` for kernel threads), as `ps -o args`.
    pub args: String,
}

impl ProcEntry {
    /// Effective user id (owner of `/proc/<pid>`), read on demand: only processes that
    /// match a pattern need it. `None` when the process is gone.
    pub fn uid(&self, proc_dir: &Path) -> Option<u32> {
        fs::metadata(proc_dir.join(self.pid.to_string()))
            .ok()
            .map(|m| m.uid())
    }

    /// The first word of the command line (NHC's `${ARGS[0]}`).
    pub fn argv0(&self) -> &str {
        self.args.split_whitespace().next().unwrap_or("")
    }
}

/// Lazily read facts; safe to share between the threads of one run.
#[derive(Debug, Default)]
pub struct Facts {
    /// Roots.
    pub host: Host,
    mounts: OnceLock<Result<Vec<MountEntry>, FactsError>>,
    cpu: OnceLock<Result<CpuInfo, FactsError>>,
    mem: OnceLock<Result<MemInfo, FactsError>>,
    procs: OnceLock<Result<Vec<ProcEntry>, FactsError>>,
    users: OnceLock<HashMap<u32, String>>,
    netdevs: OnceLock<Result<Vec<String>, FactsError>>,
    dmi: OnceLock<Result<super::checks::dmi::DmiTable, FactsError>>,
}

fn read_to_string(p: &Path) -> Result<String, FactsError> {
    fs::read_to_string(p).map_err(|e| HostIo::new(HostOp::Read, p, e).into())
}

impl Facts {
    /// Facts read from `host`.
    pub fn new(host: Host) -> Facts {
        Facts {
            host,
            ..Facts::default()
        }
    }

    /// `/proc/mounts` (the last entry for a mount point wins, as in NHC).
    ///
    /// # Errors
    /// The file could not be read.
    pub fn mounts(&self) -> Result<&[MountEntry], FactsError> {
        self.mounts
            .get_or_init(|| {
                read_to_string(&self.host.proc_dir.join("mounts")).map(|t| parse_mounts(&t))
            })
            .as_deref()
            .map_err(Clone::clone)
    }

    /// CPU counts.
    ///
    /// # Errors
    /// The file could not be read.
    pub fn cpu(&self) -> Result<CpuInfo, FactsError> {
        self.cpu
            .get_or_init(|| {
                read_to_string(&self.host.proc_dir.join("cpuinfo")).map(|t| parse_cpuinfo(&t))
            })
            .clone()
    }

    /// Memory.
    ///
    /// # Errors
    /// The file could not be read.
    pub fn mem(&self) -> Result<MemInfo, FactsError> {
        self.mem
            .get_or_init(|| {
                read_to_string(&self.host.proc_dir.join("meminfo")).map(|t| parse_meminfo(&t))
            })
            .clone()
    }

    /// The process table (without this process).
    ///
    /// # Errors
    /// procfs could not be listed.
    pub fn procs(&self) -> Result<&[ProcEntry], FactsError> {
        self.procs
            .get_or_init(|| read_procs(&self.host.proc_dir))
            .as_deref()
            .map_err(Clone::clone)
    }

    /// User name of a uid (from the passwd file; the number when unknown).
    pub fn user_name(&self, uid: u32) -> String {
        let users = self.users.get_or_init(|| {
            fs::read_to_string(&self.host.passwd)
                .map(|t| parse_passwd(&t))
                .unwrap_or_default()
        });
        users.get(&uid).cloned().unwrap_or_else(|| uid.to_string())
    }

    /// Network interface names from `/proc/net/dev`.
    ///
    /// # Errors
    /// The file could not be read.
    pub fn netdevs(&self) -> Result<&[String], FactsError> {
        self.netdevs
            .get_or_init(|| {
                read_to_string(&self.host.proc_dir.join("net/dev")).map(|t| {
                    t.lines()
                        .filter_map(|l| l.split_once(':'))
                        .map(|(name, _)| name.trim().to_string())
                        .filter(|n| !n.is_empty() && !n.contains('|'))
                        .collect()
                })
            })
            .as_deref()
            .map_err(Clone::clone)
    }

    /// `/proc/loadavg`: 1, 5 and 15 minute averages.
    ///
    /// # Errors
    /// The file could not be read or parsed.
    pub fn loadavg(&self) -> Result<[f64; 3], FactsError> {
        let p = self.host.proc_dir.join("loadavg");
        let t = read_to_string(&p)?;
        let v: Vec<f64> = t
            .split_whitespace()
            .take(3)
            .filter_map(|x| x.parse().ok())
            .collect();
        match v[..] {
            [a, b, c] => Ok([a, b, c]),
            _ => Err(FactsError::Unexpected {
                path: p,
                content: t,
            }),
        }
    }

    /// dmidecode's tables.
    ///
    /// # Errors
    /// dmidecode is missing or failed.
    pub fn dmi(&self) -> Result<&super::checks::dmi::DmiTable, FactsError> {
        self.dmi
            .get_or_init(|| {
                let out = std::process::Command::new(&self.host.dmidecode)
                    .stdin(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .output()
                    .map_err(|e| FactsError::Spawn {
                        program: self.host.dmidecode.clone(),
                        source: Arc::new(e),
                    })?;
                if !out.status.success() {
                    return Err(FactsError::Exit {
                        program: self.host.dmidecode.clone(),
                        status: out.status,
                    });
                }
                Ok(super::checks::dmi::DmiTable::parse(
                    &String::from_utf8_lossy(&out.stdout),
                ))
            })
            .as_ref()
            .map_err(Clone::clone)
    }
}

/// Decodes `\040`-style octal escapes of `/proc/mounts`.
fn unescape_octal(s: &str) -> String {
    if !s.contains('\\') {
        return s.to_string();
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let oct = &b[i + 1..i + 4];
            if oct.iter().all(|c| (b'0'..=b'7').contains(c)) {
                let v = oct
                    .iter()
                    .fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses `/proc/mounts`.
pub fn parse_mounts(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some(MountEntry {
                source: unescape_octal(f.next()?),
                target: unescape_octal(f.next()?),
                fstype: f.next()?.to_string(),
                options: f.next()?.to_string(),
            })
        })
        .collect()
}

/// Parses `/proc/cpuinfo` the way NHC's `nhc_hw_cpu_gather_data` does.
pub fn parse_cpuinfo(text: &str) -> CpuInfo {
    let mut processors = 0u32;
    let mut phys: Vec<String> = Vec::new();
    let mut siblings: Option<u32> = None;
    let mut cores: Option<u32> = None;
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim(), v.trim());
        match k {
            "processor" => processors += 1,
            "physical id" if !phys.iter().any(|p| p == v) => phys.push(v.to_string()),
            "siblings" => siblings = v.parse().ok(),
            "cpu cores" => cores = v.parse().ok(),
            _ => {}
        }
    }
    let sockets = phys.len() as u32;
    if sockets == 0 {
        // No topology (some VMs, non-x86): every processor is a socket.
        return CpuInfo {
            sockets: processors,
            cores: processors,
            threads: processors,
            processors,
        };
    }
    let c = cores.map_or(processors, |c| sockets * c);
    let t = siblings.map_or(processors, |s| sockets * s);
    CpuInfo {
        sockets,
        cores: c,
        threads: t,
        processors,
    }
}

/// Parses `/proc/meminfo`.
pub fn parse_meminfo(text: &str) -> MemInfo {
    let mut m = MemInfo::default();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (Some(k), Some(v)) = (f.next(), f.next()) else {
            continue;
        };
        let Ok(v) = v.parse::<u64>() else { continue };
        match k {
            "MemTotal:" => m.ram_total = v,
            "MemFree:" | "Buffers:" | "Cached:" => m.ram_free += v,
            "SwapTotal:" => m.swap_total = v,
            "SwapFree:" => m.swap_free = v,
            _ => {}
        }
    }
    m
}

fn parse_passwd(text: &str) -> HashMap<u32, String> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            Some((f.get(2)?.parse().ok()?, f.first()?.to_string()))
        })
        .collect()
}

/// Most bytes of one command line read (ps shows at most 128 KiB too).
const CMDLINE_LIMIT: u64 = 64 * 1024;

fn read_all_at(dir: &rustix::fd::OwnedFd, rel: &str, buf: &mut Vec<u8>) -> bool {
    use rustix::fs::{Mode, OFlags};
    buf.clear();
    let Ok(fd) = rustix::fs::openat(dir, rel, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
    else {
        return false;
    };
    let mut chunk = [0u8; 4096];
    while (buf.len() as u64) < CMDLINE_LIMIT {
        match rustix::io::read(&fd, &mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return false,
        }
    }
    true
}

/// Reads `/proc/<pid>/cmdline` of every process (and `comm` of kernel threads), with
/// paths relative to an open `/proc` (fewer lookups) and no stat: owners are read only
/// for processes that match ([`ProcEntry::uid`]).
fn read_procs(proc_dir: &Path) -> Result<Vec<ProcEntry>, FactsError> {
    use rustix::fs::{Mode, OFlags};
    let me = std::process::id();
    let list = |e: std::io::Error| FactsError::from(HostIo::new(HostOp::List, proc_dir, e));
    let dir_fd = rustix::fs::open(
        proc_dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| list(e.into()))?;
    let mut out = Vec::new();
    let mut buf = Vec::with_capacity(4096);
    let mut path = String::with_capacity(32);
    for ent in fs::read_dir(proc_dir).map_err(list)?.flatten() {
        let name = ent.file_name();
        let Some(pid) = name.to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        path.clear();
        path.push_str(&format!("{pid}/cmdline"));
        // A process may exit while we look: skip it.
        if !read_all_at(&dir_fd, &path, &mut buf) {
            continue;
        }
        let args = if buf.is_empty() {
            path.clear();
            path.push_str(&format!("{pid}/comm"));
            if !read_all_at(&dir_fd, &path, &mut buf) {
                continue;
            }
            format!("[{}]", String::from_utf8_lossy(&buf).trim_end())
        } else {
            let s = String::from_utf8_lossy(&buf);
            s.trim_end_matches('\0').replace('\0', " ")
        };
        out.push(ProcEntry { pid, args });
    }
    out.sort_by_key(|p| p.pid);
    Ok(out)
}

/// Test support: a PCI function under `<sys_dir>/bus/pci/devices/<addr>` with its
/// `vendor`, `device` and `class` files, as sysfs shows them.
///
/// # Panics
/// When a write fails (tests only).
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) fn write_pci_device(
    sys_dir: &Path,
    addr: &str,
    vendor: &str,
    device: &str,
    class: &str,
) {
    let d = sys_dir.join("bus/pci/devices").join(addr);
    std::fs::create_dir_all(&d).unwrap();
    for (file, value) in [("vendor", vendor), ("device", device), ("class", class)] {
        std::fs::write(d.join(file), format!("{value}\n")).unwrap();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn mounts_decode_escapes() {
        let m = parse_mounts(
            "/dev/vda1 / ext4 rw,relatime 0 0\nfs:/a\\040b /mnt/a\\040b nfs4 ro 0 0\n",
        );
        assert_eq!(m.len(), 2);
        assert_eq!(m[1].target, "/mnt/a b");
        assert_eq!(m[1].source, "fs:/a b");
        assert_eq!(m[0].options, "rw,relatime");
    }

    #[test]
    fn cpuinfo_like_nhc() {
        let one =
            "processor\t: 0\nphysical id\t: 0\nsiblings\t: 2\ncore id\t: 0\ncpu cores\t: 2\n\n\
                   processor\t: 1\nphysical id\t: 0\nsiblings\t: 2\ncore id\t: 1\ncpu cores\t: 2\n";
        assert_eq!(
            parse_cpuinfo(one),
            CpuInfo {
                sockets: 1,
                cores: 2,
                threads: 2,
                processors: 2
            }
        );
        // Two sockets with hyperthreads.
        let mut two = String::new();
        for p in 0..8 {
            two.push_str(&format!(
                "processor : {p}\nphysical id : {}\nsiblings : 4\ncpu cores : 2\n\n",
                p / 4
            ));
        }
        let c = parse_cpuinfo(&two);
        assert_eq!((c.sockets, c.cores, c.threads), (2, 4, 8));
        // ARM: no physical id.
        let c = parse_cpuinfo("processor : 0\nBogoMIPS : 50\n\nprocessor : 1\n");
        assert_eq!((c.sockets, c.cores, c.threads), (2, 2, 2));
    }

    #[test]
    fn meminfo_free_is_free_buffers_cached() {
        let m = parse_meminfo(
            "MemTotal: 1000 kB\nMemFree: 100 kB\nMemAvailable: 500 kB\nBuffers: 10 kB\nCached: 200 kB\nSwapCached: 5 kB\nSwapTotal: 50 kB\nSwapFree: 40 kB\n",
        );
        assert_eq!(
            m,
            MemInfo {
                ram_total: 1000,
                ram_free: 310,
                swap_total: 50,
                swap_free: 40
            }
        );
    }

    /// The state folder checks write to by default is the settings' default folder.
    #[test]
    fn the_default_state_dir_is_the_settings_default() {
        assert_eq!(
            Host::default().state_dir,
            crate::settings::Agent::default().state_dir
        );
    }

    #[test]
    fn reads_this_machines_process_table() {
        let f = Facts::new(Host::default());
        let procs = f.procs().unwrap();
        assert!(procs.iter().any(|p| p.pid == 1));
        assert!(!procs.iter().any(|p| p.pid == std::process::id()));
        assert_eq!(f.user_name(0), "root");
    }
}
