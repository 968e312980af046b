//! What the host offers to jobs: CPU topology and memory (sysinfo and sysfs), and GPUs
//! (device files); and which boot of the host this is ([`boot_id`]).
//!
//! Floor 0 (ground): uses no other module of the crate.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The kernel's id of this boot (`/proc/sys/kernel/random/boot_id`), the one home of "is
/// this the same boot": the drain state's action, health's pending drain and clean marker,
/// the PCS `bootstrapId` file and the lifecycle scripts' run record compare it. `None` when
/// it cannot be read.
pub fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
}

/// CPU topology and memory of the host, in the units slurm.conf uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostFacts {
    /// Logical CPUs (`CPUs`).
    pub cpus: u32,
    /// Sockets (`Sockets`, on one board).
    pub sockets: u32,
    /// Physical cores per socket (`CoresPerSocket`).
    pub cores_per_socket: u32,
    /// Hardware threads per core (`ThreadsPerCore`).
    pub threads_per_core: u32,
    /// Physical memory in MiB (before any reserve).
    pub memory_mib: u64,
}

impl HostFacts {
    /// Reads the running host: CPU and memory from sysinfo, the socket count from
    /// `/sys/devices/system/cpu/cpu*/topology/physical_package_id` (sysinfo does not give it).
    pub fn detect() -> HostFacts {
        let memory_mib = sysinfo::System::new()
            .map(|mut sys| {
                sys.refresh_memory();
                sys.total_memory() / (1024 * 1024)
            })
            .unwrap_or(0);
        let cpus = u32::try_from(
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
        )
        .unwrap_or(1)
        .max(1);
        let cpus = cpus.max(count_online_cpus().unwrap_or(0));
        let physical = sysinfo::System::physical_core_count()
            .ok()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|&n| n > 0 && n <= cpus)
            .unwrap_or(cpus);
        let sockets = count_sockets()
            .filter(|&s| s > 0 && physical.is_multiple_of(s))
            .unwrap_or(1);
        let threads = if cpus % physical == 0 {
            cpus / physical
        } else {
            1
        };
        HostFacts {
            cpus: physical * threads,
            sockets,
            cores_per_socket: physical / sockets,
            threads_per_core: threads,
            memory_mib,
        }
    }
}

fn count_online_cpus() -> Option<u32> {
    // "0-3,5" style list.
    let s = std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?;
    let mut n = 0u32;
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        n += b.parse::<u32>().ok()?.checked_sub(a.parse::<u32>().ok()?)? + 1;
    }
    Some(n)
}

fn count_sockets() -> Option<u32> {
    let mut ids = std::collections::BTreeSet::new();
    for e in std::fs::read_dir("/sys/devices/system/cpu").ok()?.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("cpu") && name[3..].chars().all(|c| c.is_ascii_digit()) {
            if let Ok(id) = std::fs::read_to_string(e.path().join("topology/physical_package_id")) {
                ids.insert(id.trim().to_string());
            }
        }
    }
    u32::try_from(ids.len()).ok()
}

/// Counts NVIDIA GPU device files `nvidia<N>` in `dev_dir` (normally `/dev`).
pub fn count_gpu_devices(dev_dir: &Path) -> u32 {
    std::fs::read_dir(dev_dir)
        .map(|rd| {
            rd.flatten()
                .filter(|e| {
                    let n = e.file_name();
                    let n = n.to_string_lossy();
                    n.strip_prefix("nvidia")
                        .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()))
                })
                .count()
        })
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
        .unwrap_or(0)
}

/// GPUs an EC2 instance type is known to have (NVIDIA families), `None` when not known.
/// From the EC2 accelerated computing instance type tables.
pub fn expected_gpus(instance_type: &str) -> Option<u32> {
    let (family, size) = instance_type.split_once('.')?;
    let n = match (family, size) {
        ("p3", "2xlarge") => 1,
        ("p3", "8xlarge") => 4,
        ("p3", "16xlarge") | ("p3dn", "24xlarge") => 8,
        ("p4d" | "p4de" | "p5" | "p5e" | "p5en" | "p6-b200", _) => 8,
        ("g4dn", "12xlarge") => 4,
        ("g4dn", "metal") => 8,
        ("g4dn", _) => 1,
        ("g5" | "g6" | "g6e", "12xlarge" | "24xlarge") => 4,
        ("g5" | "g6" | "g6e", "48xlarge") => 8,
        ("g5" | "g6" | "g6e", _) => 1,
        _ => return None,
    };
    Some(n)
}

/// Error when the GPUs an instance type has did not all show up.
#[derive(Debug, thiserror::Error)]
#[error(
    "{instance_type} has {expected} GPUs but {found} /dev/nvidia<N> devices appeared in {}s \
     (is the NVIDIA driver loaded? raise node.gpu_wait, or set node.gpus)",
    waited.as_secs()
)]
pub struct GpuWaitError {
    /// Instance type.
    pub instance_type: String,
    /// GPUs expected.
    pub expected: u32,
    /// Device files found at the deadline.
    pub found: u32,
    /// How long it waited.
    pub waited: Duration,
}

/// Where GPU device files are looked for, and how long to wait for them.
#[derive(Debug, Clone)]
pub struct GpuProbe {
    /// Folder holding `nvidia<N>` (normally `/dev`).
    pub dev_dir: PathBuf,
    /// How long to wait for the expected count.
    pub wait: Duration,
}

impl GpuProbe {
    /// The GPU count to declare: `configured` when set; otherwise the device files, waiting
    /// (polling every 100 ms) until the count the instance type is known to have appears.
    ///
    /// # Errors
    /// [`GpuWaitError`] when the expected GPUs did not all appear in time.
    pub async fn gpus(
        &self,
        configured: Option<u32>,
        instance_type: &str,
    ) -> Result<u32, GpuWaitError> {
        if let Some(n) = configured {
            return Ok(n);
        }
        let Some(expected) = expected_gpus(instance_type) else {
            return Ok(count_gpu_devices(&self.dev_dir));
        };
        let start = Instant::now();
        loop {
            let found = count_gpu_devices(&self.dev_dir);
            if found >= expected {
                return Ok(found);
            }
            if start.elapsed() >= self.wait {
                return Err(GpuWaitError {
                    instance_type: instance_type.to_string(),
                    expected,
                    found,
                    waited: self.wait,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn detect_is_consistent() {
        let h = HostFacts::detect();
        assert!(h.cpus >= 1);
        assert_eq!(h.cpus, h.sockets * h.cores_per_socket * h.threads_per_core);
        assert!(h.memory_mib > 0);
    }

    #[test]
    fn known_gpu_instance_types() {
        assert_eq!(expected_gpus("p4d.24xlarge"), Some(8));
        assert_eq!(expected_gpus("g5.xlarge"), Some(1));
        assert_eq!(expected_gpus("g5.12xlarge"), Some(4));
        assert_eq!(expected_gpus("c5.xlarge"), None);
    }

    #[tokio::test]
    async fn waits_for_gpu_devices_that_appear_late() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("nvidiactl"), "").unwrap();
        let probe = GpuProbe {
            dev_dir: dir.path().to_path_buf(),
            wait: Duration::from_secs(10),
        };
        let d = dir.path().to_path_buf();
        let late = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            std::fs::write(d.join("nvidia0"), "").unwrap();
        });
        assert_eq!(probe.gpus(None, "g5.xlarge").await.unwrap(), 1);
        late.await.unwrap();
    }

    #[tokio::test]
    async fn missing_gpu_devices_fail_with_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let probe = GpuProbe {
            dev_dir: dir.path().to_path_buf(),
            wait: Duration::from_millis(200),
        };
        let e = probe.gpus(None, "p4d.24xlarge").await.unwrap_err();
        let m = e.to_string();
        assert!(m.contains("p4d.24xlarge has 8 GPUs but 0"), "{m}");
        // Explicit setting wins, and unknown types count what is there.
        assert_eq!(probe.gpus(Some(2), "p4d.24xlarge").await.unwrap(), 2);
        assert_eq!(probe.gpus(None, "c5.xlarge").await.unwrap(), 0);
    }
}
