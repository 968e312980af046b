//! The fleet proving ground: the project's own image (`slurm-image-builder build --target
//! local`) booted as many nodes, each a `systemd-nspawn --boot` container with systemd
//! 252 as PID 1, on a private network that the test creates, with a real slurmctld on a
//! machine of its own, a DNS server and instance metadata per node. The test sets the
//! world and watches slurmctld; boot is what EC2 does (the image's units run bootstrap,
//! munge, slurmd and the daemon).
//!
//! Layout (all of it removed on drop, also when the test fails):
//! - a fleet network namespace (`ip netns add`) with a bridge `br0` (fixed MAC address)
//!   at [`FLEET_GATEWAY`] (10.77.0.1/16), and dnsmasq there answering the nodes' names
//!   (`<name>.fleet.internal`), `ctld.fleet.internal` ([`CTLD_ADDR`]) and
//!   `_slurmctld._tcp.fleet.internal` (SRV), NXDOMAIN for everything else. The test's
//!   Slurm client commands (`scontrol`, `sinfo`, `sbatch`, `srun`) run there too, as on an
//!   admin's workstation on the cluster network: the nodes reach srun back at 10.77.0.1.
//!   No route leads out of the fleet network: nothing is ever sent outside it or loopback.
//! - the controller, "another machine" to the nodes ([`ControllerMachine`]): a network
//!   namespace of its own joined to the bridge by a veth, at [`CTLD_ADDR`] (10.77.0.2),
//!   host name `ctld` (a UTS namespace), a private mount namespace (its own `/run`,
//!   `/etc/hosts` and `/etc/resolv.conf`), its own munged with the cluster key, and
//!   slurmctld (`SlurmctldHost=ctld(10.77.0.2)`, `MaxNodeCount` the fleet's
//!   [`FleetBuilder::max_nodes`], 64 by default, `jobcomp/filetxt`) of
//!   the Slurm under test, the build the image carries. The nodes find it by address
//!   (`conf_servers`) or SRV and reach it through the bridge as they reach each other:
//!   its own link, address and name, nothing of the gateway's. Started through `nsenter`
//!   and `unshare` (not `ip netns exec`, which remounts `/sys`); no PID namespace (see
//!   [`ControllerMachine`]). Its processes are stopped by PID and its namespace deleted on
//!   drop.
//! - per node *incarnation* a network namespace of its own (so its address is ready before
//!   its systemd starts), joined to the bridge by a veth (`host0` inside), no default
//!   route, and the node's own IMDS emulator listening on 169.254.169.254:80 inside it (on
//!   its `lo`): the node reaches instance metadata at the same address as on EC2, and the
//!   test changes that node's world through [`Fleet::imds`].
//! - per node a writable overlayfs layer over the shared image root (lower): a reboot
//!   keeps the node's disk; terminate removes it.
//! - the container: `systemd-nspawn --boot --register=no --keep-unit
//!   --network-namespace-path=...`, started from a shell that first moves itself into
//!   cgroups of its own (each container's systemd then owns its subtree; two containers
//!   in one cgroup would fight over it), the cluster key bound read-only at
//!   `/etc/cluster.key`, `/dev/fuse` bound for FUSE mounts. A reboot inside the container
//!   makes nspawn exit 133: the fleet's supervisor thread starts it again on the same
//!   disk. Each boot runs in a time namespace of its own (`unshare --time`, its boot and
//!   monotonic clocks starting near 0), so that the node's uptime (`/proc/uptime`,
//!   sysinfo(2), what slurmd reports to slurmctld as its boot time) is the container's, as
//!   on an instance, and not the host's: without it slurmctld never sees a node rebooted
//!   by `scontrol reboot` come back from its reboot.
//!
//! - optionally ([`FleetBuilder::moto`]) moto's server for SSM and EC2: it runs on the
//!   host's loopback as in the other tests (its helpers and `slurm-image-builder publish`
//!   reach it there), and a relay in the fleet namespace at `10.77.0.1:<its port>` lets the
//!   nodes reach it; each node's daemon gets `AWS_ENDPOINT_URL` and test credentials from
//!   a drop-in of its disk (the stand-in for an instance profile).
//!
//! Images are cached under [`CACHE_ENV`] (default `/var/tmp/slurm-e2e-fleet`), keyed on
//! the contents of `packer/`, `units/` and the agent binary; a rebuild says so on stderr.
//!
//! Host limits a large fleet outgrows (inotify instances and watches, pid_max, the ARP
//! table) are raised while it runs and put back on drop: [`crate::host_limits`].
//!
//! One fleet at a time in a process (a process-wide lock) and on the machine (a file lock
//! in the cache folder): fleets are heavy on 2 cores.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::{Read, Write as _};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use imds_emulator::{Config as ImdsConfig, Emulator};

use crate::agent::agent_binary;
use crate::host_limits::HostLimits;
use crate::munge::Munge;
use crate::process::{pid_of, run_ok, run_with_timeout, unique_name, wait_until, Daemon, TempRoot};
use crate::slurm::{CtldMachine, Slurmctld};
use crate::systemd::{cgroup_roots, remove_cgroup_tree};
use crate::Moto;

/// Environment variable: where built image roots are cached.
pub const CACHE_ENV: &str = "SLURM_E2E_FLEET_CACHE";

/// Environment variable: use this image root as is (no cache, no build), e.g. one built
/// by hand with `slurm-image-builder build --target local`.
pub const IMAGE_ENV: &str = "SLURM_E2E_FLEET_IMAGE";

/// Cached roots of a recipe kept besides the one in use (most recently used first).
const KEEP_RECENT_ROOTS: usize = 2;

/// Default image cache folder.
pub const DEFAULT_CACHE: &str = "/var/tmp/slurm-e2e-fleet";

/// The bridge's address in the fleet namespace: dnsmasq, the moto relay, the shared
/// folder's sshd, the test's Slurm client commands.
pub const FLEET_GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);

/// The controller's address on the fleet network: a machine of its own
/// ([`ControllerMachine`]), `ctld.fleet.internal`.
pub const CTLD_ADDR: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);

/// The controller machine's host name (`SlurmctldHost=ctld(10.77.0.2)`).
pub const CTLD_HOSTNAME: &str = "ctld";

/// The controller's interface in the fleet namespace (its peer is `eth0` on the
/// controller).
const CTLD_VETH: &str = "vctld";

/// The bridge's MAC address (locally administered, fixed: see [`FleetBuilder::start`]).
const BRIDGE_MAC: &str = "02:77:00:00:00:01";

/// The fleet's DNS domain (the nodes' resolv.conf search domain).
pub const DOMAIN: &str = "fleet.internal";

/// The link-local address of instance metadata, as on EC2.
pub const IMDS_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);

/// Where the cluster key is bound inside each node.
pub const NODE_KEY_PATH: &str = "/etc/cluster.key";

/// Where a node of a fleet with [`FleetBuilder::shared_storage`] mounts the shared folder.
pub const SHARED_MOUNT_POINT: &str = "/mnt/shared";

/// The client key for the shared folder's sshd, on each node's disk (root-owned, 0600).
pub const NODE_SSHFS_KEY: &str = "/etc/slurm-node-agent/fleet-sshfs.key";

/// Debian packages whose installed files make the nodes' client layer for the shared
/// folder (see [`FleetBuilder::shared_storage`]).
const SSHFS_CLIENT_PACKAGES: &[&str] = &[
    "sshfs",
    "fuse3",
    "libfuse3-3",
    "libglib2.0-0",
    "openssh-client",
];

/// nspawn's exit status when the container rebooted.
const REBOOT_EXIT: i32 = 133;

/// How long a container gets to shut down after SIGTERM before SIGKILL.
const CONTAINER_STOP_GRACE: Duration = Duration::from_secs(60);

/// Deadline for one command run inside a node or a namespace.
const CMD_TIMEOUT: Duration = Duration::from_secs(60);

static FLEET_LOCK: Mutex<()> = Mutex::new(());

/// Which image a fleet boots: how `slurm-image-builder build --target local` is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ImageRecipe {
    /// The default local image: Debian's Slurm packages (quick to build).
    #[default]
    Default,
    /// Slurm built from source, as for a production image (PMIx, hwloc, JWT, slurmrestd),
    /// from Debian's own Slurm source package (`--slurm-source debian-source`): several
    /// minutes of compiling, cached like the default image.
    DebianSourceSlurm,
    /// Two Slurm releases side by side, as an image made for a controller upgrade
    /// (issue 23 §2): the one under test and `newer` (`--slurm-version <suite>,<newer>
    /// --slurm-default <suite>`), each from its pinned tarball and the shared build cache
    /// (the newer one's built there by `scripts/slurm-build.sh --cache-only`).
    /// `/opt/slurm-<release>` each, `/opt/slurm` at the suite's. Needs a source build under
    /// test (not Debian's packages).
    SuiteAndNewer(crate::install::Version),
}

impl ImageRecipe {
    /// The cache folder prefix (each recipe keeps and prunes its own roots).
    fn prefix(self) -> &'static str {
        match self {
            ImageRecipe::Default => "image-",
            ImageRecipe::DebianSourceSlurm => "srcimage-",
            ImageRecipe::SuiteAndNewer(_) => "twoslurm-",
        }
    }

    /// The builder's arguments for this recipe. The default image carries the Slurm under
    /// test ([`crate::install`]): Debian's packages for `/usr`, else the same pinned
    /// tarball through the production path (`--slurm-source tarball`, its checksum
    /// verified, offline from the sources folder), whose build the host's
    /// `scripts/slurm-build.sh` left in the shared build cache.
    ///
    /// # Errors
    /// When the version under test cannot be read.
    fn build_args(self) -> Result<Vec<String>> {
        Ok(match self {
            ImageRecipe::Default if crate::install::prefix() != Path::new("/usr") => {
                let v = crate::install::version()?;
                vec![
                    "--slurm-source".into(),
                    "tarball".into(),
                    "--slurm-version".into(),
                    v.to_string(),
                    "--sources-dir".into(),
                    sources_dir().display().to_string(),
                    "--slurm-build-cache".into(),
                    slurm_build_cache().display().to_string(),
                ]
            }
            ImageRecipe::Default => Vec::new(),
            ImageRecipe::DebianSourceSlurm => vec!["--slurm-source".into(), "debian-source".into()],
            ImageRecipe::SuiteAndNewer(newer) => {
                if crate::install::prefix() == Path::new("/usr") {
                    bail!("an image with two Slurm releases needs a source build under test, not Debian's packages");
                }
                let suite = crate::install::version()?;
                if newer <= suite {
                    bail!("Slurm {newer} is not newer than the {suite} under test");
                }
                vec![
                    "--slurm-source".into(),
                    "tarball".into(),
                    "--slurm-version".into(),
                    format!("{suite},{newer}"),
                    "--slurm-default".into(),
                    suite.to_string(),
                    "--sources-dir".into(),
                    sources_dir().display().to_string(),
                    "--slurm-build-cache".into(),
                    slurm_build_cache().display().to_string(),
                ]
            }
        })
    }
}

/// SchedMD's tarballs: `SLURM_SOURCES_DIR`, or `../shared/sources` beside the repository
/// (as `scripts/slurm-build.sh` reads them).
pub fn sources_dir() -> PathBuf {
    std::env::var_os("SLURM_SOURCES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("../shared/sources"))
}

/// The finished Slurm builds shared by the host and the images: `SLURM_BUILD_CACHE`, or
/// `/var/cache/slurm-e2e/slurm-builds` (as `scripts/slurm-build.sh` keeps them).
pub fn slurm_build_cache() -> PathBuf {
    std::env::var_os("SLURM_BUILD_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/slurm-e2e/slurm-builds"))
}

/// A built image root, shared read-only (the lower layer) by every node of a fleet.
#[derive(Debug, Clone)]
pub struct Image {
    /// The root folder.
    pub root: PathBuf,
    /// The cache key (hash of `packer/`, `units/` and the agent binary).
    pub key: String,
    /// Whether this call built it (else it came from the cache).
    pub rebuilt: bool,
    /// The builder's JSON report of the build that made this root (`--output json`:
    /// `root`, `acceptance` lines, ...), kept next to the cached root; `None` for a root
    /// given by [`IMAGE_ENV`] or cached before reports were kept.
    pub report: Option<serde_json::Value>,
}

/// The repository root (this crate's parent folder).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from(".."), Path::to_path_buf)
}

/// The `slurm-image-builder` binary: `SLURM_IMAGE_BUILDER_BIN`, or next to the agent's.
///
/// # Errors
/// When it has not been built (`cargo build -p slurm-image-builder`).
pub fn image_builder_binary() -> Result<PathBuf> {
    if let Ok(p) = std::env::var("SLURM_IMAGE_BUILDER_BIN") {
        return Ok(PathBuf::from(p));
    }
    let p = agent_binary()?.with_file_name("slurm-image-builder");
    if !p.is_file() {
        bail!(
            "{} not found: run `cargo build -p slurm-image-builder` (scripts/test.sh does) or \
             set SLURM_IMAGE_BUILDER_BIN",
            p.display()
        );
    }
    Ok(p)
}

/// A 64-bit FNV-1a over 8-byte words: a stable content hash for the cache key (not for
/// security; the workspace has no hash crate in the tests' dependencies, and this one
/// must not change between Rust versions as std's `DefaultHasher` may).
#[derive(Debug)]
struct KeyHash(u64);

impl KeyHash {
    fn new() -> Self {
        KeyHash(0xcbf2_9ce4_8422_2325)
    }

    fn update(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.0 ^= u64::from_le_bytes(w);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
        for b in chunks.remainder() {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Separate fields so that ("ab","c") and ("a","bc") differ.
        self.0 ^= bytes.len() as u64;
        self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
    }

    fn file(&mut self, path: &Path) -> Result<()> {
        let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f
                .read(&mut buf)
                .with_context(|| format!("reading {}", path.display()))?;
            if n == 0 {
                return Ok(());
            }
            self.update(&buf[..n]);
        }
    }

    fn tree(&mut self, base: &Path) -> Result<()> {
        let mut files = Vec::new();
        let mut stack = vec![base.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in fs::read_dir(&d).with_context(|| format!("listing {}", d.display()))? {
                let e = e?;
                let t = e.file_type()?;
                if t.is_dir() {
                    stack.push(e.path());
                } else if t.is_file() {
                    files.push(e.path());
                }
            }
        }
        files.sort();
        for f in files {
            let rel = f.strip_prefix(base).unwrap_or(&f);
            self.update(rel.to_string_lossy().as_bytes());
            self.file(&f)?;
        }
        Ok(())
    }
}

fn cache_dir() -> PathBuf {
    std::env::var_os(CACHE_ENV).map_or_else(|| PathBuf::from(DEFAULT_CACHE), PathBuf::from)
}

/// An exclusive `flock` on a file, released on drop (the fd closes).
#[derive(Debug)]
struct FileLock(#[allow(dead_code)] File);

impl FileLock {
    fn acquire(path: &Path) -> Result<FileLock> {
        let f = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .with_context(|| format!("opening lock {}", path.display()))?;
        rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)
            .with_context(|| format!("locking {}", path.display()))?;
        Ok(FileLock(f))
    }
}

impl Image {
    /// The image root for the current `packer/`, `units/` and agent binary: from the cache,
    /// or built with `slurm-image-builder build --target local` (about a minute with a
    /// warm apt cache; its log is `<cache>/build-<key>.log`). Older cached roots are
    /// removed after a build, except the [`KEEP_RECENT_ROOTS`] most recently used.
    ///
    /// # Errors
    /// Hashing the inputs, or the build failing (with the tail of its log).
    pub fn cached() -> Result<Image> {
        Image::cached_recipe(ImageRecipe::Default)
    }

    /// [`Image::cached`] for a given recipe. [`IMAGE_ENV`] applies to the default recipe
    /// only.
    ///
    /// # Errors
    /// As [`Image::cached`].
    pub fn cached_recipe(recipe: ImageRecipe) -> Result<Image> {
        if let (ImageRecipe::Default, Some(root)) = (recipe, std::env::var_os(IMAGE_ENV)) {
            let root = PathBuf::from(root);
            if !root.join("usr/bin/slurm-node-agent").is_file() {
                bail!(
                    "{IMAGE_ENV}={}: not an image root with the agent",
                    root.display()
                );
            }
            eprintln!(
                "slurm-e2e fleet: using the image root {} ({IMAGE_ENV})",
                root.display()
            );
            return Ok(Image {
                root,
                key: "0000000000000000".into(),
                rebuilt: false,
                report: None,
            });
        }
        let repo = repo_root();
        let agent = agent_binary()?;
        let mut h = KeyHash::new();
        for part in ["packer", "units"] {
            h.update(part.as_bytes());
            h.tree(&repo.join(part))?;
        }
        // The Slurm the image carries (the one under test for the default recipe).
        for a in recipe.build_args()? {
            h.update(a.as_bytes());
        }
        h.update(b"agent");
        h.file(&agent)?;
        // Slurm's HealthCheckProgram, built with the agent (70-agent.sh installs both).
        h.file(&agent.with_file_name("slurm-node-agent-healthcheck"))?;
        let key = format!("{:016x}", h.0);
        let cache = cache_dir();
        fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;
        let _lock = FileLock::acquire(&cache.join("lock"))?;
        let prefix = recipe.prefix();
        let done = cache.join(format!("{prefix}{key}"));
        let root = done.join("root");
        let read_report = |done: &Path| {
            fs::read(done.join("report.json"))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
        };
        if done.join("complete").exists() {
            // Marks the root as used now: pruning keeps the most recently used roots.
            let _ = fs::File::options()
                .write(true)
                .open(done.join("complete"))
                .and_then(|f| f.set_modified(std::time::SystemTime::now()));
            return Ok(Image {
                report: read_report(&done),
                root,
                key,
                rebuilt: false,
            });
        }
        // Straight to stderr, past the test harness's capture: a rebuild takes minutes.
        let _ = writeln!(
            std::io::stderr(),
            "slurm-e2e fleet: building the node image root ({recipe:?}; no cached root for \
             packer/, units/ and the agent binaries as they are now: key {key}) in {}",
            done.display()
        );
        let work = cache.join(format!("build-{prefix}{key}"));
        if work.exists() {
            let _ = Command::new("rm").arg("-rf").arg(&work).status();
        }
        let log = cache.join(format!("build-{prefix}{key}.log"));
        let mut c = Command::new(image_builder_binary()?);
        c.current_dir(&repo)
            .args([
                "--output",
                "json",
                "build",
                "--target",
                "local",
                "--os",
                "debian-12",
                "--arch",
                "x86_64",
            ])
            .arg("--no-artifacts")
            .arg("--packer-dir")
            .arg(repo.join("packer"))
            .arg("--units-dir")
            .arg(repo.join("units"))
            .arg("--work-dir")
            .arg(&work)
            .arg("--agent-bin")
            .arg(&agent)
            .arg("--apt-cache")
            .arg(cache.join("apt"))
            .arg("--log-file")
            .arg(&log)
            .args(recipe.build_args()?);
        let started = Instant::now();
        // A source build compiles Slurm: 4 minutes on a quiet 2-core machine, much longer
        // beside a loaded test run.
        let deadline = match recipe {
            ImageRecipe::Default | ImageRecipe::SuiteAndNewer(_) => Duration::from_secs(1200),
            ImageRecipe::DebianSourceSlurm => Duration::from_secs(3600),
        };
        let out = run_with_timeout(c, deadline)?;
        if !out.status.success() {
            bail!(
                "slurm-image-builder build --target local failed ({}):\n{}\n{}\nlog: {}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                log.display()
            );
        }
        if !work.join("root/usr/bin/slurm-node-agent").is_file() {
            bail!(
                "the built root {} has no agent",
                work.join("root").display()
            );
        }
        // Remove older roots first (each is a few hundred MB), keeping the
        // KEEP_RECENT_ROOTS most recently used ones besides this: worktrees with other
        // agent binaries take turns at the fleet lock and would otherwise rebuild each
        // other's root every time.
        if let Ok(rd) = fs::read_dir(&cache) {
            let mut others: Vec<(std::time::SystemTime, PathBuf)> = rd
                .flatten()
                .filter(|e| {
                    // The prefixes are disjoint: "srcimage-" and "twoslurm-" do not start
                    // with "image-".
                    e.file_name().to_string_lossy().starts_with(prefix) && e.path() != done
                })
                .map(|e| {
                    let used = fs::metadata(e.path().join("complete"))
                        .and_then(|m| m.modified())
                        .unwrap_or(std::time::UNIX_EPOCH);
                    (used, e.path())
                })
                .collect();
            others.sort_by_key(|o| std::cmp::Reverse(o.0));
            let keep: Vec<&PathBuf> = others
                .iter()
                .filter(|(u, _)| *u != std::time::UNIX_EPOCH)
                .take(KEEP_RECENT_ROOTS)
                .map(|(_, p)| p)
                .collect();
            for (_, path) in &others {
                if !keep.contains(&path) {
                    let _ = Command::new("rm").arg("-rf").arg(path).status();
                }
            }
        }
        fs::create_dir_all(&done)?;
        fs::write(done.join("report.json"), &out.stdout)?;
        fs::rename(work.join("root"), &root)
            .with_context(|| format!("moving the built root into {}", root.display()))?;
        let _ = Command::new("rm").arg("-rf").arg(&work).status();
        fs::write(done.join("complete"), "")?;
        let _ = writeln!(
            std::io::stderr(),
            "slurm-e2e fleet: image root built in {:.0?}: {}",
            started.elapsed(),
            root.display()
        );
        Ok(Image {
            report: serde_json::from_slice(&out.stdout).ok(),
            root,
            key,
            rebuilt: true,
        })
    }
}

/// A network namespace created by the test (`ip netns add`), deleted on drop.
#[derive(Debug)]
pub struct NetNs {
    name: String,
}

impl NetNs {
    /// Creates `/run/netns/<name>` with its loopback up.
    ///
    /// # Errors
    /// When `ip netns add` fails.
    pub fn create(name: &str) -> Result<NetNs> {
        let mut c = Command::new("ip");
        c.args(["netns", "add", name]);
        run_ok(c, CMD_TIMEOUT)?;
        let ns = NetNs {
            name: name.to_string(),
        };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/run/netns/<name>`.
    pub fn path(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.name)
    }

    /// `ip -n <name> args...` (netlink only: no `/sys` remount as `ip netns exec` does).
    ///
    /// # Errors
    /// A non-zero exit, with its stderr.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut c = Command::new("ip");
        c.arg("-n").arg(&self.name).args(args);
        run_ok(c, CMD_TIMEOUT)
    }

    /// `program` run in this namespace (`nsenter --net=...`, which execs it).
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.path().display()))
            .arg("--")
            .arg(program);
        c
    }

    /// Runs `f` on a thread that has entered this namespace: sockets it creates live here.
    ///
    /// # Errors
    /// Entering the namespace, or `f`'s error.
    pub fn run_in<T: Send>(&self, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
        let path = self.path();
        let p = &path;
        thread::scope(|s| {
            s.spawn(move || {
                let fd = File::open(p).with_context(|| format!("opening {}", p.display()))?;
                rustix::thread::move_into_link_name_space(
                    fd.as_fd(),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .with_context(|| format!("entering network namespace {}", p.display()))?;
                f()
            })
            .join()
            .unwrap_or_else(|_| bail!("a thread in namespace {} panicked", path.display()))
        })
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let mut c = Command::new("ip");
        c.args(["netns", "del", &self.name]);
        if let Err(e) = run_ok(c, CMD_TIMEOUT) {
            eprintln!(
                "slurm-e2e fleet: deleting network namespace {}: {e:#}",
                self.name
            );
        }
    }
}

/// Sets up the controller machine's UTS and mount namespaces (run by `unshare --uts
/// --mount --propagation private` in its network namespace), then holds them while
/// sleeping. `$1`: the host name; `$2`: the machine's folder (`hosts`, `resolv.conf`); the
/// rest: paths it must still see.
///
/// The copies of the host's mounts that a new mount namespace starts with would keep
/// each of them alive after the host unmounts it: the handles of other network namespaces
/// under `/run/netns` (a namespace deleted meanwhile would live on), other tests' scratch
/// mounts. Those are dropped first (lazily, in this namespace only), except a mount one of
/// the needed paths lies on.
const CTLD_MACHINE_SCRIPT: &str = r#"set -eu
name=$1; dir=$2; shift 2
hostname "$name"
for m in $(awk '{print $5}' /proc/self/mountinfo | sort -r); do
  case $m in
    /run/netns|/run/netns/*|/tmp/*|/var/tmp/*) ;;
    *) continue ;;
  esac
  keep=
  for p in "$dir" "$@"; do
    case $p/ in "$m"/*) keep=1 ;; esac
  done
  [ -n "$keep" ] || umount -l "$m" 2>/dev/null || true
done
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -m 755 /run/munge
mount --bind "$dir/hosts" /etc/hosts
mount --bind "$dir/resolv.conf" /etc/resolv.conf
exec sleep infinity
"#;

/// The fleet's controller: another machine on the fleet network, which runs slurmctld
/// (started by [`Slurmctld`] through [`ControllerMachine::enter_args`]) and a munged of
/// its own. Made of namespaces the test creates:
/// - **network**: a namespace of its own ([`NetNs`]), joined to the fleet's bridge by a
///   veth (`eth0` inside), with its own address [`CTLD_ADDR`] and no route beyond the
///   fleet network (none is needed: the nodes, the gateway and the test's clients are all
///   on it). The nodes reach it as they reach each other, through the bridge; stopping
///   its slurmctld (or taking its link down) cuts them off from it alone.
/// - **UTS**: host name [`CTLD_HOSTNAME`] (slurmctld checks `SlurmctldHost` against it).
/// - **mount**: private, with its own `/run` (a tmpfs: its munged's socket
///   `/run/munge/munge.socket.2`, pid and seed; nothing it writes there reaches the host or
///   another machine) and its own `/etc/hosts` (its name at its address) and
///   `/etc/resolv.conf` (the fleet's dnsmasq), bound over the host's. The rest of the file
///   system is the host's: the controller's configuration, state and job records stay
///   where the test reads them, and it runs the host's Slurm build, the one the image
///   carries.
///
/// No PID namespace: the test stops every process of it by PID from the host, and the
/// nodes (each in a PID namespace of its own) cannot see its processes either way.
///
/// The namespaces are held by a process that sleeps in them (like a pod's pause
/// container): slurmctld can be stopped and started again on the same machine, and a
/// process enters it with `nsenter -t <pid> -n -u -m`. Dropped: munged and the holder are
/// stopped by PID (slurmctld first, by its own guard), then the network namespace is
/// deleted (its veth with it).
#[derive(Debug)]
pub struct ControllerMachine {
    // Drop order: munged, the holder of the namespaces, then the network.
    _munged: Daemon,
    holder: Daemon,
    netns: NetNs,
}

impl ControllerMachine {
    /// Creates the machine on the fleet's bridge (in `fleet`) and starts its munged with
    /// the cluster key `key`; `dir` is its folder (created).
    ///
    /// # Errors
    /// Any step; what was started is stopped again.
    fn start(fleet: &NetNs, dir: &Path, key: &Path) -> Result<ControllerMachine> {
        fs::create_dir_all(dir)?;
        let netns = NetNs::create(&format!("{}-ctld", fleet.name()))?;
        let mut c = Command::new("ip");
        c.args([
            "-n",
            fleet.name(),
            "link",
            "add",
            CTLD_VETH,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            netns.name(),
        ]);
        run_ok(c, CMD_TIMEOUT)?;
        fleet.ip(&["link", "set", CTLD_VETH, "master", "br0", "up"])?;
        netns.ip(&["addr", "add", &format!("{CTLD_ADDR}/16"), "dev", "eth0"])?;
        netns.ip(&["link", "set", "eth0", "up"])?;

        fs::write(
            dir.join("hosts"),
            format!("127.0.0.1 localhost\n{CTLD_ADDR} {CTLD_HOSTNAME}.{DOMAIN} {CTLD_HOSTNAME}\n"),
        )?;
        fs::write(
            dir.join("resolv.conf"),
            format!("nameserver {FLEET_GATEWAY}\nsearch {DOMAIN}\n"),
        )?;
        // munged wants its key owned by its user and readable by no one else.
        let munge_key = dir.join("munge.key");
        fs::copy(key, &munge_key).context("copying the cluster key for the controller")?;
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(&munge_key, fs::Permissions::from_mode(0o400))?;

        let mut c = netns.command("unshare");
        c.args(["--uts", "--mount", "--propagation", "private", "sh", "-c"])
            .arg(CTLD_MACHINE_SCRIPT)
            .arg("sh")
            .arg(CTLD_HOSTNAME)
            .arg(dir)
            .arg(std::env::temp_dir())
            .arg(crate::install::prefix());
        let mut holder = Daemon::spawn("ctld-machine", c, dir)?;
        let comm = format!("/proc/{}/comm", holder.pid());
        wait_until(
            "the controller machine's namespaces to be set up",
            CMD_TIMEOUT,
            Duration::from_millis(10),
            || {
                holder.check_running()?;
                Ok((fs::read_to_string(&comm)?.trim() == "sleep").then_some(()))
            },
        )?;
        let enter = Self::enter_for(holder.pid());

        let mut c = Command::new("nsenter");
        c.args(&enter)
            .arg("--")
            .arg("munged")
            .arg("-F")
            .arg(format!("--key-file={}", munge_key.display()))
            .arg(format!("--log-file={}", dir.join("munged.log").display()))
            .args([
                "--seed-file=/run/munge/munged.seed",
                "--pid-file=/run/munge/munged.pid",
                "--socket=/run/munge/munge.socket.2",
            ]);
        let mut munged = Daemon::spawn("ctld-munged", c, dir)?;
        wait_until(
            "the controller's munged to answer",
            CMD_TIMEOUT,
            Duration::from_millis(20),
            || {
                munged.check_running()?;
                let mut c = Command::new("nsenter");
                c.args(&enter).args(["--", "munge", "-n"]);
                Ok(run_with_timeout(c, CMD_TIMEOUT)?
                    .status
                    .success()
                    .then_some(()))
            },
        )?;
        Ok(ControllerMachine {
            _munged: munged,
            holder,
            netns,
        })
    }

    fn enter_for(pid: u32) -> Vec<String> {
        ["-t", &pid.to_string(), "-n", "-u", "-m"]
            .map(str::to_string)
            .to_vec()
    }

    /// `nsenter` options that put a process on this machine (its network, UTS and mount
    /// namespaces): `-t <holder's pid> -n -u -m`.
    pub fn enter_args(&self) -> Vec<String> {
        Self::enter_for(self.holder.pid())
    }

    /// `program` run on this machine (`nsenter <enter_args> -- program`).
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.args(self.enter_args()).arg("--").arg(program);
        c
    }

    /// Its own `/run` as the host sees it: `/proc/<holder>/root/run`.
    pub fn run_dir(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root/run", self.holder.pid()))
    }

    /// Binds `tree` (an unpacked build configured for the prefix under test, see
    /// [`crate::install::unpack_build`]) over that prefix in this machine's mount namespace
    /// alone: the programs started here from then on (slurmctld) are that build's, with its
    /// libraries and plugins; the host's prefix and the nodes' images stay as they are.
    ///
    /// # Errors
    /// `mount` failing.
    pub fn bind_slurm(&self, tree: &Path) -> Result<()> {
        let mut c = Command::new("nsenter");
        c.args([
            "-t",
            &self.holder.pid().to_string(),
            "-m",
            "--",
            "mount",
            "--bind",
        ])
        .arg(tree)
        .arg(crate::install::prefix());
        run_ok(c, CMD_TIMEOUT).with_context(|| {
            format!(
                "binding {} over {} on the controller machine",
                tree.display(),
                crate::install::prefix().display()
            )
        })?;
        Ok(())
    }

    /// Its address, [`CTLD_ADDR`].
    pub fn address(&self) -> Ipv4Addr {
        CTLD_ADDR
    }

    /// Its network namespace.
    pub fn netns(&self) -> &NetNs {
        &self.netns
    }
}

/// A TCP relay: listens on an address inside a network namespace and relays each
/// connection to `target` in the host's namespace (here: moto on 127.0.0.1), so that the
/// nodes reach a host service at an address of their own network. Stops accepting on drop;
/// open connections end when either side closes.
#[derive(Debug)]
struct Relay {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Relay {
    fn start(ns: &NetNs, listen: SocketAddr, target: SocketAddr) -> Result<Relay> {
        let listener = ns.run_in(|| {
            TcpListener::bind(listen).with_context(|| format!("relay: binding {listen}"))
        })?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        thread::spawn(move || {
                            if let Err(e) = relay_one(conn, target) {
                                eprintln!("slurm-e2e fleet: relay to {target}: {e:#}");
                            }
                        });
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) => {
                        eprintln!("slurm-e2e fleet: relay accept on {listen}: {e}");
                        thread::sleep(Duration::from_millis(200));
                    }
                }
            }
        });
        Ok(Relay {
            stop,
            thread: Some(thread),
        })
    }
}

fn relay_one(a: TcpStream, target: SocketAddr) -> Result<()> {
    a.set_nonblocking(false)?;
    let b = TcpStream::connect_timeout(&target, CMD_TIMEOUT)?;
    let (mut a_r, mut b_w) = (a.try_clone()?, b.try_clone()?);
    let up = thread::spawn(move || {
        let _ = std::io::copy(&mut a_r, &mut b_w);
        let _ = b_w.shutdown(Shutdown::Write);
    });
    let (mut b_r, mut a_w) = (b, a);
    let _ = std::io::copy(&mut b_r, &mut a_w);
    let _ = a_w.shutdown(Shutdown::Write);
    let _ = up.join();
    Ok(())
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An overlayfs mount, unmounted on drop.
#[derive(Debug)]
struct Overlay {
    merged: PathBuf,
}

impl Overlay {
    fn mount(lower: &Path, upper: &Path, work: &Path, merged: &Path) -> Result<Overlay> {
        for d in [upper, work, merged] {
            fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        let mut c = Command::new("mount");
        c.args(["-t", "overlay", "overlay", "-o"])
            .arg(format!(
                "lowerdir={},upperdir={},workdir={}",
                lower.display(),
                upper.display(),
                work.display()
            ))
            .arg(merged);
        run_ok(c, CMD_TIMEOUT)?;
        Ok(Overlay {
            merged: merged.to_path_buf(),
        })
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        let mut c = Command::new("umount");
        c.arg(&self.merged);
        if run_ok(c, CMD_TIMEOUT).is_err() {
            let mut c = Command::new("umount");
            c.arg("-l").arg(&self.merged);
            let _ = run_ok(c, CMD_TIMEOUT);
        }
    }
}

/// What a node is told about itself at launch (its instance metadata).
#[derive(Debug, Clone)]
pub struct Launch {
    /// NodeName and host name (`<name>.fleet.internal` is its local-hostname).
    pub name: String,
    /// Instance id, e.g. `i-0f1ee700000000001`.
    pub instance_id: String,
    /// AMI id served as `ami-id`.
    pub ami_id: String,
    /// `instance-life-cycle`: `on-demand` or `spot`.
    pub life_cycle: String,
    /// The agent's settings part of the user data (TOML), wrapped in MIME multipart.
    pub agent_toml: String,
    /// The baseline of `scripts/bench-fleet.sh`: the same image without the agent. Its
    /// units are masked, the cluster key is the image's `/etc/munge/munge.key`, and the
    /// distribution's slurmd unit starts `slurmd -Z -N <name> --conf-server <controller>`
    /// from a static `/etc/default/slurmd`. Default `false`.
    pub static_slurmd: bool,
    /// Whether the node has instance metadata at all (`false`: nothing listens on
    /// 169.254.169.254 and there is no route to it, as on a machine outside EC2).
    pub metadata: bool,
    /// Instance tags served in metadata (`tags/instance/<key>`), e.g.
    /// `aws:pcs:cluster-id`. Default none.
    pub tags: Vec<(String, String)>,
    /// The instance profile served in metadata (`iam/security-credentials/<role>`):
    /// `[role, access key id, secret access key, session token]`, valid until 2099.
    /// Default none.
    pub role_credentials: Option<[String; 4]>,
    /// Settings the image carries (a root-owned drop-in `conf.d/60-launch.toml` on the
    /// node's disk), for image-class keys such as `pcs.endpoint`. Default empty: none.
    pub image_toml: String,
    /// When EC2 launched it (Unix seconds): the `pendingTime` of its instance identity
    /// document. Default: when [`Fleet::new_launch`] made this description.
    pub pending_time: u64,
    /// Programs the image carries beyond the fleet's: `(absolute path, text)`, written
    /// executable (0755) on the node's disk before its first boot (stand-ins for
    /// `dcgmi`, `nvidia-smi`...). Default none.
    pub programs: Vec<(String, String)>,
    /// Environment of the node's daemon beyond the fleet's (a drop-in of
    /// `slurm-node-agent.service` on its disk), e.g. `AWS_ENDPOINT_URL_AUTO_SCALING` for an
    /// emulator in the fleet network. Default none.
    pub agent_env: Vec<(String, String)>,
}

/// One node: its network namespace, metadata, disk and container.
#[derive(Debug)]
pub struct Node {
    // Drop order: container first, then the disk, then metadata and network.
    container: Option<Daemon>,
    overlay: Option<Overlay>,
    cgroups: Vec<PathBuf>,
    imds: Option<Emulator>,
    netns: NetNs,
    launch: Launch,
    addr: Ipv4Addr,
    dir: PathBuf,
    /// Whether the supervisor restarts the container when it exits 133.
    keep_running: bool,
    boots: u32,
}

impl Node {
    /// The container's PID 1 (its systemd) as seen from the host, once it runs.
    fn pid1(&mut self) -> Option<u32> {
        let c = self.container.as_mut()?;
        if !c.is_running() {
            return None;
        }
        find_pid1(c.pid())
    }
}

/// `root` and all its descendants (through `/proc/<pid>/task/*/children`).
fn descendants(root: u32) -> Vec<u32> {
    let mut all = Vec::new();
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        all.push(p);
        let Ok(tasks) = fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let children = fs::read_to_string(t.path().join("children")).unwrap_or_default();
            stack.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<u32>().ok()),
            );
        }
    }
    all
}

/// A process's proportional set size in bytes (`Pss:` of `/proc/<pid>/smaps_rollup`, kB):
/// its private pages plus its share of the pages it shares (the image's binaries, mapped
/// by every node, count once across the fleet). 0 when it is gone.
fn pss_bytes(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The first descendant of `root` whose innermost pid is 1 (a container's init).
fn find_pid1(root: u32) -> Option<u32> {
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        if p != root {
            let status = fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
            let inner = status
                .lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .and_then(|v| v.split_whitespace().last().map(str::to_string));
            if inner.as_deref() == Some("1") {
                return Some(p);
            }
        }
        let tasks = fs::read_dir(format!("/proc/{p}/task")).ok()?;
        for t in tasks.flatten() {
            let children = fs::read_to_string(t.path().join("children")).unwrap_or_default();
            stack.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<u32>().ok()),
            );
        }
    }
    None
}

/// The shared folder of [`FleetBuilder::shared_storage`] (files under the fleet's scratch
/// folder).
#[derive(Debug)]
struct SharedStorage {
    /// The nodes' client layer: sshfs, fuse3 and ssh as the host's packages installed them.
    layer: PathBuf,
    /// Served as `/export` (sshd's `ChrootDirectory` is this folder's parent, bound at
    /// `/mnt` in the sshd's own mount namespace: every component of a chroot must be
    /// root-owned and not writable by others).
    export: PathBuf,
    /// The client's private key (copied onto each node's disk).
    client_key: PathBuf,
    /// sshd's configuration.
    config: PathBuf,
}

impl SharedStorage {
    fn prepare(dir: &Path) -> Result<SharedStorage> {
        let srv = dir.join("srv");
        let export = srv.join("export");
        fs::create_dir_all(&export)?;
        use std::os::unix::fs::PermissionsExt as _;
        for (d, mode) in [(dir, 0o755), (&srv, 0o755), (&export, 0o777)] {
            fs::set_permissions(d, fs::Permissions::from_mode(mode))?;
        }
        let layer = dir.join("layer");
        build_client_layer(&layer)?;
        let host_key = dir.join("host_key");
        let client_key = dir.join("client_key");
        for k in [&host_key, &client_key] {
            let mut c = Command::new("ssh-keygen");
            c.args([
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "slurm-e2e-fleet",
                "-f",
            ])
            .arg(k);
            run_ok(c, CMD_TIMEOUT).context("ssh-keygen (Debian package openssh-client)")?;
        }
        let authorized = dir.join("authorized_keys");
        fs::copy(client_key.with_extension("pub"), &authorized)?;
        let config = dir.join("sshd_config");
        fs::write(
            &config,
            format!(
                "ListenAddress {FLEET_GATEWAY}:22\nHostKey {}\nPidFile {}\n\
                 AuthorizedKeysFile {}\nStrictModes no\nPermitRootLogin prohibit-password\n\
                 PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n\
                 Subsystem sftp internal-sftp\n\
                 Match User root\n  ChrootDirectory /mnt\n  ForceCommand internal-sftp\n",
                host_key.display(),
                dir.join("sshd.pid").display(),
                authorized.display()
            ),
        )?;
        Ok(SharedStorage {
            layer,
            export,
            client_key,
            config,
        })
    }
}

/// Copies the files of [`SSHFS_CLIENT_PACKAGES`] as the host's dpkg lists them (no
/// documentation) into `layer`, with `/bin`, `/sbin` and `/lib` under `/usr` as in the
/// image (merged /usr: a real `/lib` folder in a layer would hide the image's link).
fn build_client_layer(layer: &Path) -> Result<()> {
    let mut c = Command::new("dpkg");
    c.arg("-L").args(SSHFS_CLIENT_PACKAGES);
    let list = run_ok(c, CMD_TIMEOUT).with_context(|| {
        format!(
            "listing the files of {} (scripts/test-deps.sh installs them)",
            SSHFS_CLIENT_PACKAGES.join(", ")
        )
    })?;
    for line in list.lines() {
        let Some(rel) = line.strip_prefix('/') else {
            continue; // "diverted by" notes
        };
        if rel.starts_with("usr/share/") || rel.starts_with("usr/lib/systemd/") {
            continue;
        }
        let src = Path::new(line);
        let Ok(meta) = fs::symlink_metadata(src) else {
            continue;
        };
        if meta.is_dir() {
            continue;
        }
        let rel = match rel.split_once('/') {
            Some(("bin" | "sbin" | "lib" | "lib64", _)) => format!("usr/{rel}"),
            _ => rel.to_string(),
        };
        let dest = layer.join(rel);
        if let Some(d) = dest.parent() {
            fs::create_dir_all(d)?;
        }
        if meta.file_type().is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(src)?, &dest)
                .with_context(|| format!("linking {}", dest.display()))?;
        } else {
            fs::copy(src, &dest).with_context(|| format!("copying {line}"))?;
        }
    }
    if !layer.join("usr/bin/sshfs").is_file() {
        bail!("no sshfs among the files of the host's package sshfs");
    }
    Ok(())
}

/// The `[[mounts]]` entry of [`FleetBuilder::shared_storage`] (user data TOML): sshfs from
/// the fleet's sshd at [`SHARED_MOUNT_POINT`], required (slurmd waits for it), retried
/// for 10 minutes.
pub fn shared_storage_toml() -> String {
    format!(
        "[[mounts]]\ntype = \"fuse.sshfs\"\nmount_point = \"{SHARED_MOUNT_POINT}\"\n\
         source = \"root@{FLEET_GATEWAY}:/export\"\n\
         options = \"_netdev,reconnect,IdentityFile={NODE_SSHFS_KEY},\
         StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,allow_other\"\n\
         retry_for = \"10m\"\n"
    )
}

/// Builds a [`Fleet`]; see [`Fleet::builder`].
#[derive(Debug, Clone)]
pub struct FleetBuilder {
    ctld_lines: Vec<String>,
    srv: bool,
    srv_record: bool,
    extra_toml: String,
    moto: bool,
    recipe: ImageRecipe,
    shared: bool,
    auth_slurm: bool,
    auth_by_join: bool,
    max_nodes: usize,
}

/// [`FleetBuilder::max_nodes`]'s default.
pub const DEFAULT_MAX_NODES: usize = 64;

impl FleetBuilder {
    /// The most nodes the fleet holds at once (default [`DEFAULT_MAX_NODES`], 64): the
    /// controller's `MaxNodeCount` (every node of the fleet registers as a dynamic node,
    /// the static baseline's `slurmd -Z` too), and what the host's limits are raised for
    /// ([`crate::host_limits`]) once the nodes launched need more than they allow.
    /// [`Fleet::launch`] refuses a node beyond it. A replacement under a new name while
    /// the old record is still in slurmctld counts twice there: give such a fleet room.
    pub fn max_nodes(mut self, n: usize) -> Self {
        self.max_nodes = n.max(1);
        self
    }

    /// Adds a slurm.conf line for the controller.
    pub fn ctld_line(mut self, line: impl Into<String>) -> Self {
        self.ctld_lines.push(line.into());
        self
    }

    /// Nodes find the controller through DNS SRV `_slurmctld._tcp` (no `conf_servers` in
    /// their settings) instead of its address. Default: address.
    pub fn srv_discovery(mut self, yes: bool) -> Self {
        self.srv = yes;
        self
    }

    /// Whether the fleet's DNS server holds the SRV record `_slurmctld._tcp` at all.
    /// `false`: the nodes' Slurm clients can find the controller only through what they
    /// are given (`conf_servers`), as at a site without that record. Default: `true`.
    pub fn srv_record(mut self, yes: bool) -> Self {
        self.srv_record = yes;
        self
    }

    /// Starts moto (SSM, EC2) for the fleet: see [`Fleet::moto`]. Default: none.
    pub fn moto(mut self, yes: bool) -> Self {
        self.moto = yes;
        self
    }

    /// The image the nodes boot. Default: [`ImageRecipe::Default`].
    pub fn image_recipe(mut self, recipe: ImageRecipe) -> Self {
        self.recipe = recipe;
        self
    }

    /// A shared folder for every node, the fleet's stand-in for FSx or EFS (this kernel has
    /// no NFS or Lustre client): sshfs (FUSE over SFTP) served by an sshd in the fleet
    /// namespace at `root@10.77.0.1:/export` ([`Fleet::shared_export`] on the host), and
    /// mounted by each node's agent at [`SHARED_MOUNT_POINT`] from a `[[mounts]]` entry
    /// added to the user data ([`shared_storage_toml`]). The sshd is not started:
    /// [`Fleet::start_file_server`]. The image carries no sshfs, so the nodes' disks get
    /// one more read-only lower layer with the host's installed sshfs, fuse3 and ssh client
    /// (the same Debian 12 packages), as an image for such a cluster would carry its file
    /// system's client; and the client key at [`NODE_SSHFS_KEY`]. Default: none.
    pub fn shared_storage(mut self, yes: bool) -> Self {
        self.shared = yes;
        self
    }

    /// `AuthType=auth/slurm` and `CredType=cred/slurm` (Slurm 23.11+) for the whole fleet:
    /// the controller's `slurm.key` ([`crate::slurm::SlurmctldBuilder::auth_slurm`]) is the
    /// cluster key bound into every node, and each node's image drop-in says
    /// `auth.type = "slurm"` (an image setting). munge never starts on the nodes (its unit's
    /// drop-in wants `/etc/munge/munge.key`, which nothing writes). Default: auth/munge.
    pub fn auth_slurm(mut self, yes: bool) -> Self {
        self.auth_slurm = yes;
        self
    }

    /// With [`FleetBuilder::auth_slurm`]: the nodes' drop-in leaves `auth.type` out, so the
    /// image's own settings (`conf.d/10-image.toml`, as `70-agent.sh` wrote it) and each
    /// node's join decide it, as on an image built for the managed service. Default: the
    /// drop-in says `auth.type = "slurm"`.
    pub fn auth_left_to_the_join(mut self, yes: bool) -> Self {
        self.auth_by_join = yes;
        self
    }

    /// TOML appended to every node's agent settings (user data part).
    pub fn agent_toml(mut self, toml: impl Into<String>) -> Self {
        self.extra_toml = toml.into();
        self
    }

    /// Builds or reuses the image, creates the network and the controller machine, starts
    /// slurmctld there and dnsmasq.
    /// Nodes are added with [`Fleet::launch`].
    ///
    /// # Errors
    /// Any step; what was started is stopped again.
    pub fn start(self) -> Result<Fleet> {
        let lock = FLEET_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        // The machine-wide fleet lock first: a build removes older cached roots, which
        // must not be the lower layer of a fleet running in another process (another
        // worktree's agent binary makes another key).
        fs::create_dir_all(cache_dir())?;
        let machine_lock = FileLock::acquire(&cache_dir().join("fleet.lock"))?;
        let image = Image::cached_recipe(self.recipe)?;
        // What the host holds before the first node, for the limits its nodes may need
        // raised (nothing is changed before a launch needs it).
        let limits = HostLimits::start(self.max_nodes);
        let root = TempRoot::new("slurm-e2e-fleet-")?;
        let name = unique_name("sef");
        let netns = NetNs::create(&name)?;
        // A fixed address: a bridge without one takes the lowest address of its ports,
        // so it changed whenever a node's veth with a lower (random) address joined, and
        // nodes whose neighbour entry still held the old one lost the gateway (DNS, the
        // relays, srun) until it was probed again: 10-50 s stalls at random in a fleet boot.
        netns.ip(&[
            "link", "add", "br0", "address", BRIDGE_MAC, "type", "bridge",
        ])?;
        netns.ip(&["addr", "add", &format!("{FLEET_GATEWAY}/16"), "dev", "br0"])?;
        netns.ip(&["link", "set", "br0", "up"])?;

        let munge = Munge::shared()?;
        let key = root.path().join("cluster.key");
        fs::write(&key, munge.key()?).context("writing the cluster key")?;

        // The controller: a machine of its own on the fleet network. The test's client
        // commands run on the gateway side (an admin's workstation on that network).
        let controller = ControllerMachine::start(&netns, &root.path().join("ctld"), &key)?;
        let jobcomp = root.path().join("jobcomp.txt");
        let mut b = Slurmctld::builder("fleet")
            .machine(CtldMachine {
                enter: controller.enter_args(),
                hostname: CTLD_HOSTNAME.into(),
                addr: controller.address(),
                clients_netns: netns.path(),
                run_dir: controller.run_dir(),
            })
            .max_node_count(u32::try_from(self.max_nodes).unwrap_or(u32::MAX))
            .line("JobCompType=jobcomp/filetxt")
            .line(format!("JobCompLoc={}", jobcomp.display()))
            // Paths inside the nodes (configless: the nodes read these lines too).
            .line("SlurmdSpoolDir=/var/spool/slurmd")
            .line("SlurmdPidFile=/run/slurmd.pid")
            .line("SlurmdLogFile=/var/log/slurmd.log")
            .line("SlurmdTimeout=300");
        for l in &self.ctld_lines {
            b = b.line(l.clone());
        }
        if self.auth_slurm {
            b = b.auth_slurm();
        }
        let ctld = b.start()?;
        if self.auth_slurm {
            // The nodes' cluster key is the controller's auth/slurm key.
            fs::write(&key, ctld.slurm_key()?).context("writing the cluster key")?;
        }

        let (moto, relay) = if self.moto {
            let m = Moto::start()?;
            let r = Relay::start(
                &netns,
                SocketAddr::from((FLEET_GATEWAY, m.port())),
                SocketAddr::from((Ipv4Addr::LOCALHOST, m.port())),
            )?;
            (Some(m), Some(r))
        } else {
            (None, None)
        };

        let shared = if self.shared {
            Some(SharedStorage::prepare(&root.path().join("sshfs"))?)
        } else {
            None
        };
        // The nodes' lower layers, topmost first (overlayfs' lowerdir= list).
        let lower = match &shared {
            Some(sh) => PathBuf::from(format!("{}:{}", sh.layer.display(), image.root.display())),
            None => image.root.clone(),
        };

        let hosts = root.path().join("hosts");
        let mut fleet = Fleet {
            _relay: relay,
            shared,
            file_server: None,
            lower,
            moto,
            nodes: Arc::new(Mutex::new(BTreeMap::new())),
            supervisor: None,
            stop: Arc::new(AtomicBool::new(false)),
            dns: None,
            ctld,
            controller,
            key,
            jobcomp,
            hosts,
            image,
            builder: self,
            next: AtomicU32::new(1),
            seq: AtomicU32::new(1),
            netns,
            root,
            limits,
            _machine_lock: machine_lock,
            _lock: lock,
        };
        fleet.write_hosts()?;
        fleet.start_dns()?;
        let nodes = fleet.nodes.clone();
        let stop = fleet.stop.clone();
        let lower = fleet.lower.clone();
        let key = fleet.key.clone();
        fleet.supervisor = Some(thread::spawn(move || {
            supervise(&nodes, &stop, &lower, &key)
        }));
        Ok(fleet)
    }
}

/// Restarts containers that exited 133 (a reboot inside) while they should run. `image`:
/// the nodes' lower layers.
fn supervise(nodes: &Mutex<BTreeMap<String, Node>>, stop: &AtomicBool, image: &Path, key: &Path) {
    while !stop.load(Ordering::Relaxed) {
        {
            let mut nodes = nodes.lock().unwrap_or_else(|e| e.into_inner());
            for n in nodes.values_mut() {
                let rebooted = n.keep_running
                    && n.container
                        .as_mut()
                        .and_then(Daemon::exit_status)
                        .is_some_and(|st| st.code() == Some(REBOOT_EXIT));
                if rebooted {
                    n.container = None;
                    if let Err(e) = start_container(n, image, key) {
                        eprintln!(
                            "slurm-e2e fleet: restarting {} after its reboot: {e:#}",
                            n.launch.name
                        );
                    }
                }
            }
        }
        thread::sleep(Duration::from_millis(200));
    }
}

/// Mounts the node's disk if needed and starts its container. `image`: the lower layers
/// (colon-separated, topmost first).
fn start_container(n: &mut Node, image: &Path, key: &Path) -> Result<()> {
    if n.overlay.is_none() {
        n.overlay = Some(Overlay::mount(
            image,
            &n.dir.join("upper"),
            &n.dir.join("work"),
            &n.dir.join("merged"),
        )?);
    }
    let merged = n.dir.join("merged");
    if n.cgroups.is_empty() {
        let cg_name = format!("slurm-e2e-node-{}", n.netns.name());
        for r in cgroup_roots()? {
            let d = r.join(&cg_name);
            fs::create_dir_all(&d).with_context(|| format!("creating cgroup {}", d.display()))?;
            n.cgroups.push(d);
        }
    }
    let mut script = String::from("set -eu\n");
    for d in &n.cgroups {
        let _ = writeln!(
            script,
            "echo $$ > '{0}/cgroup.procs'; grep -qxF $$ '{0}/cgroup.procs'",
            d.display()
        );
    }
    // A reboot takes a moment: slurmctld takes a node's registration as the end of the
    // reboot it asked for only with a boot time (now - uptime, whole seconds, uptime
    // rounded up) not before the request's second, and a container is back within it.
    if n.boots > 0 {
        script.push_str("sleep 2\n");
    }
    // A time namespace of this boot's own (Linux 5.6, time_namespaces(7)): unshare(1)
    // without --fork leaves nspawn in the host's and puts its children, the container,
    // in the new one, whose clocks read the host's minus its whole seconds of uptime now
    // (so they start below 1 s; the kernel refuses an offset that makes a clock negative).
    script.push_str(
        "up=$(cut -d. -f1 /proc/uptime)\n\
         exec unshare --time --boottime \"-$up\" --monotonic \"-$up\" \"$@\"\n",
    );
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(script)
        .arg("sh")
        .arg("systemd-nspawn")
        .arg("-q")
        .arg("-D")
        .arg(&merged)
        .arg("-M")
        .arg(&n.launch.name)
        .args([
            "--register=no",
            "--keep-unit",
            "--boot",
            "--console=read-only",
            "--link-journal=no",
            "--resolv-conf=off",
            "--timezone=off",
        ])
        .arg(format!(
            "--network-namespace-path={}",
            n.netns.path().display()
        ))
        .arg(format!("--bind-ro={}:{NODE_KEY_PATH}", key.display()))
        .arg("--bind=/dev/fuse")
        .env("SYSTEMD_NSPAWN_TMPFS_TMP", "1");
    n.boots += 1;
    let name = format!("node-{}-boot{}", n.launch.name, n.boots);
    let mut d = Daemon::spawn_outliving_thread(&name, c, &n.dir)?;
    d.set_grace(CONTAINER_STOP_GRACE);
    n.container = Some(d);
    Ok(())
}

/// A fleet; everything is stopped by PID and removed on drop (nodes first, then dnsmasq,
/// slurmctld, the controller machine and the namespaces).
#[derive(Debug)]
pub struct Fleet {
    nodes: Arc<Mutex<BTreeMap<String, Node>>>,
    /// Kept for its lifetime: moto as the nodes reach it.
    _relay: Option<Relay>,
    /// [`FleetBuilder::shared_storage`]: keys, sshd configuration, export, client layer.
    shared: Option<SharedStorage>,
    /// The shared folder's sshd, while started ([`Fleet::start_file_server`]).
    file_server: Option<Daemon>,
    /// The nodes' lower layers: the image root, below the client layer if any.
    lower: PathBuf,
    moto: Option<Moto>,
    supervisor: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    dns: Option<Daemon>,
    /// slurmctld, on [`Fleet::controller`]; its client commands run in the fleet namespace
    /// (at [`FLEET_GATEWAY`]).
    pub ctld: Slurmctld,
    /// The machine slurmctld runs on (dropped after it).
    controller: ControllerMachine,
    key: PathBuf,
    jobcomp: PathBuf,
    hosts: PathBuf,
    image: Image,
    builder: FleetBuilder,
    next: AtomicU32,
    seq: AtomicU32,
    netns: NetNs,
    root: TempRoot,
    /// Host limits raised for the nodes: put back once everything above is gone.
    limits: HostLimits,
    _machine_lock: FileLock,
    _lock: MutexGuard<'static, ()>,
}

impl Fleet {
    /// Upgrades the controller in place: stops slurmctld (it saves its state), binds
    /// `tree`, another Slurm build unpacked by [`crate::install::unpack_build`], over the
    /// prefix on the controller machine ([`ControllerMachine::bind_slurm`]), and starts
    /// that build's slurmctld on the same slurm.conf, ports and StateSaveLocation,
    /// recovering the nodes and jobs it saved; waits until it answers `scontrol ping`. The
    /// test's client commands stay the host's (an older client is accepted), and the nodes
    /// keep running what they run.
    ///
    /// # Errors
    /// Any step; a slurmctld that does not come back (with its log's tail).
    pub fn upgrade_controller(&mut self, tree: &Path) -> Result<()> {
        self.ctld.stop()?;
        self.controller.bind_slurm(tree)?;
        let r = self.ctld.restart();
        r.with_context(|| {
            format!(
                "slurmctld from {} on the old state:\n{}",
                tree.display(),
                self.ctld.daemon().log_tail(30)
            )
        })
    }

    /// A builder with the defaults (controller found by address, no extra settings).
    pub fn builder() -> FleetBuilder {
        FleetBuilder {
            ctld_lines: Vec::new(),
            srv: false,
            srv_record: true,
            extra_toml: String::new(),
            moto: false,
            recipe: ImageRecipe::Default,
            max_nodes: DEFAULT_MAX_NODES,
            shared: false,
            auth_slurm: false,
            auth_by_join: false,
        }
    }

    /// The fleet's moto ([`FleetBuilder::moto`]), reached from the host at
    /// [`Moto::endpoint`] and from the nodes at [`Fleet::moto_endpoint_for_nodes`].
    ///
    /// # Errors
    /// When the fleet was built without it.
    pub fn moto(&self) -> Result<&Moto> {
        self.moto
            .as_ref()
            .context("the fleet was built without moto (FleetBuilder::moto)")
    }

    /// `http://10.77.0.1:<moto's port>`: moto as the nodes reach it.
    ///
    /// # Errors
    /// When the fleet was built without it.
    pub fn moto_endpoint_for_nodes(&self) -> Result<String> {
        Ok(format!("http://{FLEET_GATEWAY}:{}", self.moto()?.port()))
    }

    /// The image the nodes boot.
    pub fn image(&self) -> &Image {
        &self.image
    }

    /// The fleet's network namespace: the bridge at [`FLEET_GATEWAY`], dnsmasq, the
    /// relays, the test's Slurm client commands.
    pub fn netns(&self) -> &NetNs {
        &self.netns
    }

    /// The controller's machine (slurmctld's host on the fleet network, [`CTLD_ADDR`]).
    pub fn controller(&self) -> &ControllerMachine {
        &self.controller
    }

    /// The scratch folder (hosts, key, job records, nodes' folders and logs).
    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// The shared folder as the host sees it ([`FleetBuilder::shared_storage`]).
    ///
    /// # Errors
    /// When the fleet was built without it.
    pub fn shared_export(&self) -> Result<&Path> {
        Ok(&self
            .shared
            .as_ref()
            .context("the fleet was built without shared storage")?
            .export)
    }

    /// Starts the shared folder's sshd in the fleet namespace (in a mount namespace of its
    /// own: a private `/run` for its privilege separation folder, the export's parent at
    /// `/mnt` for its chroot) and waits until it accepts connections. A no-op when running.
    ///
    /// # Errors
    /// No shared storage; sshd not starting.
    pub fn start_file_server(&mut self) -> Result<()> {
        if self.file_server.as_mut().is_some_and(Daemon::is_running) {
            return Ok(());
        }
        let sh = self
            .shared
            .as_ref()
            .context("the fleet was built without shared storage")?;
        let srv = sh.export.parent().context("export folder without parent")?;
        let mut c = self.netns.command("unshare");
        c.args(["-m", "--propagation", "private", "sh", "-c"])
            .arg(
                "mount -t tmpfs tmpfs /run && mkdir -m 755 /run/sshd && \
                 mount --bind \"$1\" /mnt && exec /usr/sbin/sshd -D -e -f \"$2\"",
            )
            .arg("sh")
            .arg(srv)
            .arg(&sh.config);
        let d = Daemon::spawn("sshd", c, self.root.path())?;
        self.file_server = Some(d);
        let addr = SocketAddr::from((FLEET_GATEWAY, 22));
        wait_until(
            "the fleet's sshd to accept connections",
            Duration::from_secs(30),
            Duration::from_millis(100),
            || {
                if let Some(d) = self.file_server.as_mut() {
                    d.check_running()?;
                }
                Ok(self
                    .netns
                    .run_in(|| Ok(TcpStream::connect_timeout(&addr, Duration::from_secs(1))))?
                    .ok()
                    .map(|_| ()))
            },
        )
    }

    /// Sends `sig` to the shared folder's SFTP sessions (the sshd's descendants, by PID;
    /// not the listener): `STOP` hangs the file system for the nodes as a stuck server
    /// would, `CONT` brings it back. Returns how many processes got it.
    ///
    /// # Errors
    /// No file server running.
    pub fn signal_file_sessions(&mut self, sig: rustix::process::Signal) -> Result<usize> {
        let d = self
            .file_server
            .as_mut()
            .context("the fleet's sshd is not running")?;
        if !d.is_running() {
            bail!("the fleet's sshd has exited");
        }
        let main = d.pid();
        let mut n = 0;
        for p in descendants(main).into_iter().filter(|p| *p != main) {
            if let Ok(pid) = pid_of(p) {
                if rustix::process::kill_process(pid, sig).is_ok() {
                    n += 1;
                }
            }
        }
        Ok(n)
    }

    /// Stops the shared folder's sshd and its sessions (by PID), if it runs.
    pub fn stop_file_server(&mut self) {
        if let Some(mut d) = self.file_server.take() {
            let main = d.pid();
            let sessions: Vec<u32> = descendants(main)
                .into_iter()
                .filter(|p| *p != main)
                .collect();
            let _ = d.stop();
            for p in sessions {
                if let Ok(pid) = pid_of(p) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
                }
            }
        }
    }

    fn lock_nodes(&self) -> MutexGuard<'_, BTreeMap<String, Node>> {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn write_hosts(&self) -> Result<()> {
        let mut s = format!("{CTLD_ADDR} {CTLD_HOSTNAME}.{DOMAIN} {CTLD_HOSTNAME}\n");
        for n in self.lock_nodes().values() {
            let _ = writeln!(s, "{} {}.{DOMAIN} {}", n.addr, n.launch.name, n.launch.name);
        }
        crate::slurm::write_atomic(&self.hosts, s.as_bytes())
    }

    fn start_dns(&mut self) -> Result<()> {
        let mut c = self.netns.command("dnsmasq");
        c.args([
            "--keep-in-foreground",
            "--log-facility=-",
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            "--no-poll",
            "--bind-interfaces",
            "--user=root",
            "--group=root",
        ])
        .arg(format!("--listen-address={FLEET_GATEWAY}"))
        .arg(format!("--addn-hosts={}", self.hosts.display()))
        .arg(format!(
            "--pid-file={}",
            self.root.path().join("dnsmasq.pid").display()
        ))
        .arg(format!("--domain={DOMAIN}"))
        // Everything not in the hosts file is NXDOMAIN (no upstream at all).
        .arg("--address=/#/");
        if self.builder.srv_record {
            c.arg(format!(
                "--srv-host=_slurmctld._tcp.{DOMAIN},{CTLD_HOSTNAME}.{DOMAIN},{}",
                self.ctld.port()
            ));
        }
        let mut d = Daemon::spawn("dnsmasq", c, self.root.path())?;
        // Ready once it answers, not after a fixed pause: the first SIGHUP of `reload_dns`
        // ended a dnsmasq that had not set up its handlers yet on a loaded machine (an
        // empty log, every lookup in the fleet refused), and the controller, whose
        // resolver it is, then took 5-10 s over every RPC (slurmctld looks its peers up):
        // no node could fetch its configuration.
        let name = format!("{CTLD_HOSTNAME}.{DOMAIN}");
        let server = SocketAddr::from((FLEET_GATEWAY, 53));
        wait_until(
            "the fleet's dnsmasq to answer",
            Duration::from_secs(60),
            Duration::from_millis(20),
            || {
                d.check_running()?;
                let answered = self.netns.run_in(|| dns_answers(server, &name))?;
                Ok(answered.then_some(()))
            },
        )
        .with_context(|| format!("dnsmasq log:\n{}", d.log_tail(20)))?;
        self.dns = Some(d);
        Ok(())
    }

    fn reload_dns(&mut self) -> Result<()> {
        self.write_hosts()?;
        if let Some(d) = self.dns.as_mut() {
            d.signal(rustix::process::Signal::HUP)?;
        }
        Ok(())
    }

    /// The user data a node gets: MIME multipart with the agent's part.
    pub fn user_data(&self, agent_toml: &str) -> String {
        format!(
            "Content-Type: multipart/mixed; boundary=\"==B==\"\nMIME-Version: 1.0\n\n--==B==\n\
             Content-Type: application/x-slurm-node-agent\n\n{agent_toml}\n--==B==--\n"
        )
    }

    /// The default agent settings of a node's user data: the controller by address (or
    /// SRV), plus the builder's extra TOML.
    pub fn default_agent_toml(&self) -> String {
        let mut s = String::new();
        if !self.builder.srv {
            let _ = writeln!(
                s,
                "[slurm]\nconf_servers = [\"{}\"]",
                self.ctld.conf_server()
            );
        }
        // The key's source is a file on the node: an image setting (user data may only name
        // a secret), so it goes in a drop-in of the node's disk (see `launch`), not here.
        s.push_str(&self.builder.extra_toml);
        if self.shared.is_some() {
            s.push('\n');
            s.push_str(&shared_storage_toml());
        }
        s
    }

    /// A launch description for a new instance named `name` (fresh instance id).
    pub fn new_launch(&self, name: &str) -> Launch {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        Launch {
            name: name.to_string(),
            instance_id: format!("i-0f1ee7{n:011x}"),
            ami_id: format!("ami-0f1ee7{}", &self.image.key[..11]),
            life_cycle: "on-demand".into(),
            agent_toml: self.default_agent_toml(),
            static_slurmd: false,
            metadata: true,
            tags: Vec::new(),
            role_credentials: None,
            image_toml: String::new(),
            pending_time: crate::unix_now(),
            programs: Vec::new(),
            agent_env: Vec::new(),
        }
    }

    /// Launches nodes `names` (all at once: containers are started, not waited for).
    ///
    /// # Errors
    /// Creating a node's network, metadata, disk or container.
    pub fn launch_all(&mut self, names: &[&str]) -> Result<()> {
        for n in names {
            let l = self.new_launch(n);
            self.launch(l)?;
        }
        Ok(())
    }

    /// Launches one node: network, metadata, disk, container (not waited for).
    ///
    /// # Errors
    /// Any step; a name already in the fleet; a node beyond [`FleetBuilder::max_nodes`]; a
    /// host limit too low for one more node that cannot be raised (not root).
    pub fn launch(&mut self, launch: Launch) -> Result<()> {
        let held = {
            let nodes = self.lock_nodes();
            if nodes.contains_key(&launch.name) {
                bail!("node {} is already in the fleet", launch.name);
            }
            nodes.len()
        };
        let max = self.builder.max_nodes;
        if held >= max {
            bail!(
                "node {}: the fleet holds {held} nodes, its most (FleetBuilder::max_nodes, \
                 slurmctld's MaxNodeCount) is {max}",
                launch.name
            );
        }
        self.limits.ensure(held + 1)?;
        // Unique per incarnation (names of the node's namespace and veth).
        let index = self.seq.fetch_add(1, Ordering::Relaxed);
        let addr = self.free_address();
        // One folder per incarnation: a replacement under the same name gets a new disk
        // (the old one's drain state must not come back with it).
        let dir = self
            .root
            .path()
            .join("nodes")
            .join(format!("{}-{index}", launch.name));
        fs::create_dir_all(&dir)?;
        let netns = NetNs::create(&format!("{}-{index}", self.netns.name()))?;
        let veth = format!("vf{index}");
        let mut c = Command::new("ip");
        c.args([
            "-n",
            self.netns.name(),
            "link",
            "add",
            &veth,
            "type",
            "veth",
            "peer",
            "name",
            "host0",
            "netns",
            netns.name(),
        ]);
        run_ok(c, CMD_TIMEOUT)?;
        self.netns
            .ip(&["link", "set", &veth, "master", "br0", "up"])?;
        netns.ip(&["addr", "add", &format!("{addr}/16"), "dev", "host0"])?;
        netns.ip(&["link", "set", "host0", "up"])?;
        let imds = if launch.metadata {
            netns.ip(&["addr", "add", &format!("{IMDS_ADDR}/32"), "dev", "lo"])?;
            Some(netns.run_in(|| {
                Emulator::start(ImdsConfig {
                    bind: SocketAddr::from((IMDS_ADDR, 80)),
                    ..ImdsConfig::default()
                })
                .context("starting the node's IMDS emulator on 169.254.169.254:80")
            })?)
        } else {
            None
        };
        let mut node = Node {
            container: None,
            overlay: None,
            cgroups: Vec::new(),
            imds,
            netns,
            addr,
            dir,
            keep_running: true,
            boots: 0,
            launch,
        };
        self.set_world(&node);
        // The node's resolver: the fleet's dnsmasq (written in its own layer).
        let etc = node.dir.join("upper/etc");
        fs::create_dir_all(&etc)?;
        // Its host name (the image's /etc/hostname is the build machine's; systemd in the
        // container would set that one).
        fs::write(etc.join("hostname"), format!("{}\n", node.launch.name))?;
        // The cluster key from the file bound into the container: a root-owned drop-in, as
        // an image would carry it.
        let dropins = etc.join("slurm-node-agent/conf.d");
        fs::create_dir_all(&dropins)?;
        fs::write(
            dropins.join("50-fleet-key.toml"),
            format!(
                "[auth]\n{}key_source = \"file:{NODE_KEY_PATH}\"\nkey_encoding = \"raw\"\n",
                if self.builder.auth_slurm && !self.builder.auth_by_join {
                    "type = \"slurm\"\n"
                } else {
                    ""
                }
            ),
        )?;
        if !node.launch.image_toml.is_empty() {
            fs::write(dropins.join("60-launch.toml"), &node.launch.image_toml)?;
        }
        for (path, text) in &node.launch.programs {
            use std::os::unix::fs::PermissionsExt;
            let Some(rel) = path.strip_prefix('/') else {
                bail!("Launch::programs: {path:?} is not an absolute path");
            };
            let p = node.dir.join("upper").join(rel);
            if let Some(parent) = p.parent() {
                fs::create_dir_all(parent)?;
            }
            fs::write(&p, text)?;
            fs::set_permissions(&p, fs::Permissions::from_mode(0o755))?;
        }
        if self.builder.auth_slurm {
            // sackd (login nodes) runs as SlurmUser, which the fleet's controller keeps at
            // root: Slurm's unit says User=slurm, and sackd refuses a run folder that is
            // not SlurmUser's. A site whose SlurmUser is not `slurm` writes the same
            // drop-in (docs/login-nodes.md).
            let d = etc.join("systemd/system/sackd.service.d");
            fs::create_dir_all(&d)?;
            fs::write(
                d.join("50-fleet-slurmuser.conf"),
                "[Service]\nUser=root\nGroup=root\n",
            )?;
        }
        if self.moto.is_some() {
            // AWS for the daemon: moto through the relay, test credentials (on EC2 an
            // instance profile; the region comes from IMDS).
            let d = etc.join("systemd/system/slurm-node-agent.service.d");
            fs::create_dir_all(&d)?;
            fs::write(
                d.join("50-fleet-aws.conf"),
                format!(
                    "[Service]\nEnvironment=AWS_ENDPOINT_URL={}\n\
                     Environment=AWS_ACCESS_KEY_ID=testing\n\
                     Environment=AWS_SECRET_ACCESS_KEY=testing\n",
                    self.moto_endpoint_for_nodes()?
                ),
            )?;
        }
        if !node.launch.agent_env.is_empty() {
            let d = etc.join("systemd/system/slurm-node-agent.service.d");
            fs::create_dir_all(&d)?;
            let mut text = String::from("[Service]\n");
            for (k, v) in &node.launch.agent_env {
                let _ = writeln!(text, "Environment={k}={v}");
            }
            fs::write(d.join("60-launch-env.conf"), text)?;
        }
        if let Some(sh) = &self.shared {
            let dest = etc.join(
                NODE_SSHFS_KEY
                    .strip_prefix("/etc/")
                    .unwrap_or(NODE_SSHFS_KEY),
            );
            if let Some(d) = dest.parent() {
                fs::create_dir_all(d)?;
            }
            fs::copy(&sh.client_key, &dest)
                .with_context(|| format!("copying the sshfs key to {}", dest.display()))?;
            use std::os::unix::fs::PermissionsExt as _;
            fs::set_permissions(&dest, fs::Permissions::from_mode(0o600))?;
        }
        if node.launch.static_slurmd {
            self.write_static_slurmd(&etc, &node.launch.name)?;
        }
        let resolv = etc.join("resolv.conf");
        let _ = fs::remove_file(&resolv);
        fs::write(
            &resolv,
            format!("nameserver {FLEET_GATEWAY}\nsearch {DOMAIN}\n"),
        )?;
        let name = node.launch.name.clone();
        {
            let mut nodes = self.lock_nodes();
            start_container(&mut node, &self.lower, &self.key)?;
            nodes.insert(name, node);
        }
        self.reload_dns()?;
        Ok(())
    }

    /// See [`Launch::static_slurmd`]; `etc` is the node's upper `/etc`.
    fn write_static_slurmd(&self, etc: &Path, name: &str) -> Result<()> {
        let units = etc.join("systemd/system");
        fs::create_dir_all(units.join("slurmd.service.d"))?;
        for u in [
            "slurm-node-agent-bootstrap.service",
            "slurm-node-agent.service",
        ] {
            let p = units.join(u);
            let _ = fs::remove_file(&p);
            std::os::unix::fs::symlink("/dev/null", &p)
                .with_context(|| format!("masking {}", p.display()))?;
        }
        // Replaces the image's drop-in of the same name (bootstrap's conditions).
        fs::write(
            units.join("slurmd.service.d/slurm-node-agent.conf"),
            "[Unit]\nConditionPathExists=\n[Service]\nEnvironmentFile=-/etc/default/slurmd\n",
        )?;
        fs::create_dir_all(etc.join("default"))?;
        fs::write(
            etc.join("default/slurmd"),
            format!(
                "SLURMD_OPTIONS=\"-Z -N {name} --conf-server {}\"\n",
                self.ctld.conf_server()
            ),
        )?;
        // munge's key, owned by the image's munge user (ids from its passwd).
        let passwd = fs::read_to_string(self.image.root.join("etc/passwd"))?;
        let (uid, gid) = passwd
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.first() == Some(&"munge") && f.len() > 3)
                    .then(|| Some((f[2].parse::<u32>().ok()?, f[3].parse::<u32>().ok()?)))
                    .flatten()
            })
            .context("no munge user in the image's /etc/passwd")?;
        let dir = etc.join("munge");
        fs::create_dir_all(&dir)?;
        let key = dir.join("munge.key");
        fs::copy(&self.key, &key)?;
        for p in [&dir, &key] {
            std::os::unix::fs::chown(p, Some(uid), Some(gid))
                .with_context(|| format!("chown {}", p.display()))?;
        }
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))?;
        fs::set_permissions(&key, fs::Permissions::from_mode(0o400))?;
        Ok(())
    }

    fn set_world(&self, node: &Node) {
        let Some(e) = &node.imds else { return };
        let l = &node.launch;
        e.set("instance-id", l.instance_id.clone());
        e.set("ami-id", l.ami_id.clone());
        e.set_dynamic(
            "instance-identity/document",
            crate::identity_document(&l.instance_id, &l.ami_id, l.pending_time),
        );
        e.set("instance-life-cycle", l.life_cycle.clone());
        e.set("local-hostname", format!("{}.{DOMAIN}", l.name));
        e.set("hostname", format!("{}.{DOMAIN}", l.name));
        e.set("local-ipv4", node.addr.to_string());
        e.clear_tags();
        for (k, v) in &l.tags {
            e.set_tag(k, v);
        }
        if let Some([role, key, secret, token]) = &l.role_credentials {
            e.set_role_credentials(role, key, secret, token, "2099-01-01T00:00:00Z");
        }
        e.set_user_data(self.user_data(&l.agent_toml));
    }

    fn free_address(&self) -> Ipv4Addr {
        let used: Vec<Ipv4Addr> = self.lock_nodes().values().map(|n| n.addr).collect();
        (10u32..)
            .map(|i| Ipv4Addr::new(10, 77, (i / 250) as u8 + 1, (i % 250) as u8 + 2))
            .find(|a| !used.contains(a))
            .unwrap_or(Ipv4Addr::new(10, 77, 200, 1))
    }

    /// The names of the nodes in the fleet.
    pub fn names(&self) -> Vec<String> {
        self.lock_nodes().keys().cloned().collect()
    }

    /// Runs `f` with node `name`'s IMDS emulator (to change its world while it runs).
    ///
    /// # Errors
    /// An unknown node.
    pub fn imds<T>(&self, name: &str, f: impl FnOnce(&Emulator) -> T) -> Result<T> {
        let nodes = self.lock_nodes();
        let n = nodes
            .get(name)
            .with_context(|| format!("no node {name} in the fleet"))?;
        let e = n
            .imds
            .as_ref()
            .with_context(|| format!("node {name} was launched without instance metadata"))?;
        Ok(f(e))
    }

    /// The node's instance id.
    ///
    /// # Errors
    /// An unknown node.
    pub fn instance_id(&self, name: &str) -> Result<String> {
        let nodes = self.lock_nodes();
        let n = nodes
            .get(name)
            .with_context(|| format!("no node {name} in the fleet"))?;
        Ok(n.launch.instance_id.clone())
    }

    /// The exit code of the node's container when it has stopped by itself and was not
    /// started again (a power-off inside: nspawn exits 0); `None` while it runs (a reboot,
    /// exit 133, is restarted by the supervisor).
    ///
    /// # Errors
    /// An unknown node.
    pub fn exited(&self, name: &str) -> Result<Option<i32>> {
        let mut nodes = self.lock_nodes();
        let n = nodes
            .get_mut(name)
            .with_context(|| format!("no node {name} in the fleet"))?;
        Ok(n.container
            .as_mut()
            .and_then(Daemon::exit_status)
            .filter(|st| st.code() != Some(REBOOT_EXIT))
            .map(|st| st.code().unwrap_or(-1)))
    }

    /// The journal of `unit` on node `name`, every boot, as its disk keeps it
    /// (`journalctl -D` on the node's upper layer, `/var/log/journal`), one message a line:
    /// readable after the node powered off.
    ///
    /// # Errors
    /// An unknown node; journalctl could not be run.
    pub fn disk_journal(&self, name: &str, unit: &str) -> Result<String> {
        self.journalctl_on_disk(name, unit, "cat")
    }

    /// `journalctl -D <the node's /var/log/journal> -o <output> -u <unit>`'s output.
    fn journalctl_on_disk(&self, name: &str, unit: &str, output: &str) -> Result<String> {
        let dir = {
            let nodes = self.lock_nodes();
            let n = nodes
                .get(name)
                .with_context(|| format!("no node {name} in the fleet"))?;
            n.dir.join("upper/var/log/journal")
        };
        let mut c = Command::new("journalctl");
        c.arg("-D")
            .arg(&dir)
            .args(["--no-pager", "-o", output, "-u", unit]);
        let out = run_with_timeout(c, Duration::from_secs(60))?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The journal entries of `unit` on node `name`, every boot, as JSON objects
    /// (`journalctl -D ... -o json`: `MESSAGE`, `_SYSTEMD_UNIT`, `_BOOT_ID`, ...), oldest
    /// first; readable after the node powered off.
    ///
    /// # Errors
    /// An unknown node; journalctl could not be run or wrote something else than JSON.
    pub fn disk_journal_json(&self, name: &str, unit: &str) -> Result<Vec<serde_json::Value>> {
        self.journalctl_on_disk(name, unit, "json")?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str(l).with_context(|| format!("journalctl -o json wrote {l}"))
            })
            .collect()
    }

    /// The AMI id node `name` was launched with (its IMDS `ami-id`).
    ///
    /// # Errors
    /// An unknown node.
    pub fn ami_id(&self, name: &str) -> Result<String> {
        let nodes = self.lock_nodes();
        let n = nodes
            .get(name)
            .with_context(|| format!("no node {name} in the fleet"))?;
        Ok(n.launch.ami_id.clone())
    }

    /// How many times the node's container was started.
    ///
    /// # Errors
    /// An unknown node.
    pub fn boots(&self, name: &str) -> Result<u32> {
        let nodes = self.lock_nodes();
        let n = nodes
            .get(name)
            .with_context(|| format!("no node {name} in the fleet"))?;
        Ok(n.boots)
    }

    /// Runs `program args...` inside node `name` (all its namespaces, through its PID 1),
    /// with a deadline; a non-zero exit is returned, not an error.
    ///
    /// # Errors
    /// An unknown node, one not running, or the deadline.
    pub fn exec(&self, name: &str, program: &str, args: &[&str]) -> Result<Output> {
        let pid = {
            let mut nodes = self.lock_nodes();
            let n = nodes
                .get_mut(name)
                .with_context(|| format!("no node {name} in the fleet"))?;
            n.pid1()
                .with_context(|| format!("node {name} is not running"))?
        };
        let mut c = Command::new("nsenter");
        c.arg("-t")
            .arg(pid.to_string())
            .arg("-a")
            .arg("--")
            .arg(program)
            .args(args);
        run_with_timeout(c, CMD_TIMEOUT)
    }

    /// The node's memory footprint in bytes: the proportional set size (PSS) of its
    /// container's processes (nspawn, its systemd and everything below), so pages shared
    /// by all nodes (the image's binaries) are split between them. Page cache and the
    /// overlay's tmpfs-free disk are not counted (they are not per node).
    ///
    /// # Errors
    /// An unknown node, or one not running.
    pub fn memory_footprint(&self, name: &str) -> Result<u64> {
        let pid = {
            let mut nodes = self.lock_nodes();
            let n = nodes
                .get_mut(name)
                .with_context(|| format!("no node {name} in the fleet"))?;
            let running = n.container.as_mut().map(|c| (c.is_running(), c.pid()));
            match running {
                Some((true, pid)) => pid,
                _ => bail!("node {name} is not running"),
            }
        };
        Ok(descendants(pid).into_iter().map(pss_bytes).sum())
    }

    /// `systemctl is-system-running` in the node (`running`, `degraded`, `starting`...).
    ///
    /// # Errors
    /// See [`Fleet::exec`].
    pub fn system_state(&self, name: &str) -> Result<String> {
        let out = self.exec(name, "systemctl", &["is-system-running"])?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// A unit's property in node `name` (`systemctl show -p <prop> --value <unit>`).
    ///
    /// # Errors
    /// See [`Fleet::exec`].
    pub fn unit_property(&self, name: &str, unit: &str, prop: &str) -> Result<String> {
        let out = self.exec(name, "systemctl", &["show", "-p", prop, "--value", unit])?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Submits a batch job (`sbatch --parsable --chdir=/tmp args...`: the test's folder
    /// does not exist in the nodes) and returns its id.
    ///
    /// # Errors
    /// sbatch failing.
    pub fn sbatch(&self, args: &[&str]) -> Result<String> {
        let mut c = self.ctld.command("sbatch");
        c.args(["--parsable", "--chdir=/tmp"]).args(args);
        let out = run_ok(c, CMD_TIMEOUT)?;
        Ok(out.trim().split(';').next().unwrap_or_default().to_string())
    }

    /// Waits until slurmctld has no job left (pending or running).
    ///
    /// # Errors
    /// The deadline.
    pub fn wait_no_jobs(&self, timeout: Duration) -> Result<()> {
        wait_until(
            "every job to end",
            timeout,
            Duration::from_millis(500),
            || {
                let mut c = self.ctld.command("squeue");
                c.args(["-h", "-o", "%i %T"]);
                let out = run_ok(c, CMD_TIMEOUT)?;
                Ok(out.trim().is_empty().then_some(()))
            },
        )
    }

    /// Waits until the node's systemd has finished booting (`running` or `degraded`);
    /// returns the state.
    ///
    /// # Errors
    /// The deadline.
    pub fn wait_booted(&self, name: &str, timeout: Duration) -> Result<String> {
        wait_until(
            &format!("node {name} to finish booting"),
            timeout,
            Duration::from_millis(500),
            || {
                let st = self.system_state(name)?;
                Ok(matches!(st.as_str(), "running" | "degraded").then_some(st))
            },
        )
    }

    /// The node's failed units (`systemctl --failed`), one name per entry.
    ///
    /// # Errors
    /// See [`Fleet::exec`].
    pub fn failed_units(&self, name: &str) -> Result<Vec<String>> {
        let out = self.exec(
            name,
            "systemctl",
            &[
                "list-units",
                "--failed",
                "--plain",
                "--no-legend",
                "--no-pager",
            ],
        )?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect())
    }

    /// Waits until every node in `names` is IDLE in slurmctld.
    ///
    /// # Errors
    /// The deadline, naming the nodes that are not, with each one's console tail.
    pub fn wait_all_idle(&self, names: &[String], timeout: Duration) -> Result<()> {
        let r = wait_until(
            "every node to be IDLE",
            timeout,
            Duration::from_millis(500),
            || {
                for n in names {
                    match self.ctld.node_state(n)? {
                        Some(st) if crate::slurm::is_idle(&st) => {}
                        other => bail!("{n} is {other:?}"),
                    }
                }
                Ok(Some(()))
            },
        );
        r.with_context(|| self.diagnostics(names))
    }

    /// Each node's console tail and bootstrap journal, for error messages.
    pub fn diagnostics(&self, names: &[String]) -> String {
        let mut s = String::new();
        for n in names {
            let tail = {
                let nodes = self.lock_nodes();
                nodes
                    .get(n)
                    .and_then(|x| x.container.as_ref().map(|c| c.log_tail(15)))
                    .unwrap_or_default()
            };
            let journal = self
                .exec(
                    n,
                    "journalctl",
                    &[
                        "-b",
                        "--no-pager",
                        "-n",
                        "25",
                        "-u",
                        "slurm-node-agent-bootstrap",
                        "-u",
                        "slurmd",
                        "-u",
                        "munge",
                        "-u",
                        "sackd",
                    ],
                )
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_else(|e| format!("({e:#})"));
            let _ = write!(
                s,
                "\n---- {n}: console ----\n{tail}\n---- {n}: journal ----\n{journal}"
            );
        }
        s
    }

    /// Reboots a node from inside (`systemctl reboot`): nspawn exits 133 and the supervisor
    /// starts it again on the same disk.
    ///
    /// # Errors
    /// See [`Fleet::exec`].
    pub fn reboot(&self, name: &str) -> Result<()> {
        self.exec(name, "systemctl", &["reboot", "--no-block"])?;
        Ok(())
    }

    /// Stops a node (an orderly shutdown: SIGTERM to nspawn); its disk stays.
    ///
    /// # Errors
    /// An unknown node.
    pub fn stop(&self, name: &str) -> Result<()> {
        let mut nodes = self.lock_nodes();
        let n = nodes
            .get_mut(name)
            .with_context(|| format!("no node {name} in the fleet"))?;
        n.keep_running = false;
        if let Some(mut c) = n.container.take() {
            c.stop()?;
        }
        Ok(())
    }

    /// Starts a stopped node again on its disk.
    ///
    /// # Errors
    /// An unknown node; starting the container.
    pub fn start(&self, name: &str) -> Result<()> {
        let mut nodes = self.lock_nodes();
        let n = nodes
            .get_mut(name)
            .with_context(|| format!("no node {name} in the fleet"))?;
        n.keep_running = true;
        if n.container.as_mut().is_some_and(Daemon::is_running) {
            return Ok(());
        }
        n.container = None;
        start_container(n, &self.lower, &self.key)
    }

    /// Terminates a node: container stopped, disk, metadata and network removed.
    ///
    /// # Errors
    /// An unknown node.
    pub fn terminate(&mut self, name: &str) -> Result<()> {
        let node = self
            .lock_nodes()
            .remove(name)
            .with_context(|| format!("no node {name} in the fleet"))?;
        let dir = node.dir.clone();
        drop_node(node);
        // The disk goes with the instance (its console log stays for diagnostics).
        for d in ["upper", "work", "merged"] {
            let p = dir.join(d);
            if p.exists() {
                fs::remove_dir_all(&p).with_context(|| format!("removing {}", p.display()))?;
            }
        }
        self.reload_dns()
    }

    /// Replaces a node: terminates it and launches `launch` (a new instance id; the same or
    /// a new name).
    ///
    /// # Errors
    /// See [`Fleet::terminate`] and [`Fleet::launch`].
    pub fn replace(&mut self, name: &str, launch: Launch) -> Result<()> {
        self.terminate(name)?;
        self.launch(launch)
    }

    /// Every job record slurmctld wrote (`jobcomp/filetxt`): one line per finished job.
    pub fn job_records(&self) -> Vec<String> {
        fs::read_to_string(&self.jobcomp)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Asserts through the job records that every finished job COMPLETED with exit code 0,
    /// and that there are at least `at_least` of them.
    ///
    /// # Errors
    /// A job that did not, with its record.
    pub fn check_no_job_killed(&self, at_least: usize) -> Result<()> {
        let recs = self.job_records();
        if recs.len() < at_least {
            bail!(
                "{} job records, expected at least {at_least}: {recs:#?}",
                recs.len()
            );
        }
        for r in &recs {
            let state = crate::slurm::field(r, "JobState");
            let exit = crate::slurm::field(r, "ExitCode");
            if state != Some("COMPLETED") || exit != Some("0:0") {
                bail!("a job did not complete with exit 0: {r}");
            }
        }
        Ok(())
    }
}

/// Whether the DNS server at `server` answers a query for `name`'s A record with at least
/// one record (within 250 ms).
///
/// # Errors
/// The socket cannot be made.
fn dns_answers(server: SocketAddr, name: &str) -> Result<bool> {
    const ID: [u8; 2] = [0x5e, 0x20];
    // Header: id, flags (recursion desired), 1 question, no other records.
    let mut q = Vec::from(ID);
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.') {
        q.push(u8::try_from(label.len()).context("a DNS label over 255 bytes")?);
        q.extend_from_slice(label.as_bytes());
    }
    // The root label, type A, class IN.
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).context("binding a UDP socket")?;
    sock.set_read_timeout(Some(Duration::from_millis(250)))?;
    if sock.send_to(&q, server).is_err() {
        return Ok(false);
    }
    let mut buf = [0u8; 512];
    let Ok((n, _)) = sock.recv_from(&mut buf) else {
        return Ok(false);
    };
    let r = &buf[..n];
    // Our id, a response (QR), no error (RCODE 0), at least one answer.
    Ok(n >= 12
        && r[..2] == ID
        && r[2] & 0x80 != 0
        && r[3] & 0x0f == 0
        && u16::from_be_bytes([r[6], r[7]]) >= 1)
}

fn drop_node(mut node: Node) {
    if let Some(mut c) = node.container.take() {
        if let Err(e) = c.stop() {
            eprintln!("slurm-e2e fleet: stopping {}: {e:#}", node.launch.name);
        }
    }
    for cg in std::mem::take(&mut node.cgroups) {
        for p in fs::read_to_string(cg.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
        {
            if let Some(pid) = p.trim().parse::<u32>().ok().and_then(|p| pid_of(p).ok()) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        if let Err(e) = remove_cgroup_tree(&cg) {
            eprintln!("slurm-e2e fleet: removing cgroup {}: {e:#}", cg.display());
        }
    }
    // Then the overlay, the emulator and the namespace (field order).
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // A stopped file server first resumes: processes blocked on its mount would hold up
        // each node's shutdown for minutes.
        let _ = self.signal_file_sessions(rustix::process::Signal::CONT);
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.supervisor.take() {
            let _ = h.join();
        }
        let nodes = std::mem::take(&mut *self.lock_nodes());
        // Stop every container first (in parallel: each shutdown takes seconds).
        let handles: Vec<_> = nodes
            .into_values()
            .map(|n| thread::spawn(move || drop_node(n)))
            .collect();
        for h in handles {
            let _ = h.join();
        }
        if let Some(mut d) = self.dns.take() {
            let _ = d.stop();
        }
        self.stop_file_server();
    }
}
