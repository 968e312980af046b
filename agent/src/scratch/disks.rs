//! Finding instance store disks by what the kernel says they are, and reading what each
//! one holds.
//!
//! A disk is instance storage when udev names it `nvme-Amazon_EC2_NVMe_Instance_Storage_<serial>`
//! in the by-id folder ([`INSTANCE_STORE_PREFIX`]) **and** the kernel's NVMe model of its
//! controller (`/sys/dev/block/<major>:<minor>/device/model`) is
//! `Amazon EC2 NVMe Instance Storage` ([`INSTANCE_STORE_MODEL`]). EBS volumes
//! (`nvme-Amazon_Elastic_Block_Store_*`, model `Amazon Elastic Block Store`) are never
//! taken; partitions (`-part<N>`) and namespace aliases (`-ns-<N>`, `_<N>`) are the same
//! disk, deduplicated by the device they resolve to. The instance metadata's
//! `block-device-mapping/` is not read: it names `ephemeral0` → `sdb` while the disks are
//! `nvme1n1`... (<https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/InstanceStorage.html>).
//!
//! A loop device (major [`LOOP_MAJOR`]) is refused unless [`Probe::allow_loop`] is set,
//! which only the tests do through the library: no setting, flag or environment variable
//! of the agent sets it.

use std::io::Read;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use super::ScratchError;

/// The by-id name prefix udev gives EC2 instance store NVMe disks.
pub const INSTANCE_STORE_PREFIX: &str = "nvme-Amazon_EC2_NVMe_Instance_Storage_";

/// The by-id name prefix of EBS volumes: never scratch.
pub const EBS_PREFIX: &str = "nvme-Amazon_Elastic_Block_Store_";

/// The NVMe model string of instance storage (`/sys/block/nvme1n1/device/model`, padded
/// with spaces by the kernel).
pub const INSTANCE_STORE_MODEL: &str = "Amazon EC2 NVMe Instance Storage";

/// Block major number of loop devices (Linux `LOOP_MAJOR`).
pub const LOOP_MAJOR: u32 = 7;

/// Offset of the primary btrfs superblock on a device (64 KiB).
pub const BTRFS_SUPER_OFFSET: u64 = 0x10000;

/// The btrfs superblock magic, at byte 0x40 of the superblock.
pub const BTRFS_MAGIC: &[u8; 8] = b"_BHRfS_M";

/// Where disks are looked for and what is accepted.
#[derive(Debug, Clone)]
pub struct Probe {
    /// The by-id folder (`/dev/disk/by-id`; a test's own folder of links to loop devices).
    pub by_id_dir: PathBuf,
    /// `/sys/dev/block`: the kernel's view of each device (model, loop, partition).
    pub sys_dev_block: PathBuf,
    /// Accept loop devices (and skip the model check for them). `false` in the agent;
    /// only tests that present loop devices as instance storage set it.
    pub allow_loop: bool,
}

impl Probe {
    /// The host's folders; loop devices refused.
    pub fn system() -> Probe {
        Probe {
            by_id_dir: PathBuf::from("/dev/disk/by-id"),
            sys_dev_block: PathBuf::from("/sys/dev/block"),
            allow_loop: false,
        }
    }
}

/// One instance store disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disk {
    /// Its by-id name (`nvme-Amazon_EC2_NVMe_Instance_Storage_AWS1A2B...`), the shortest
    /// of its aliases.
    pub id: String,
    /// The device it resolves to (`/dev/nvme1n1`).
    pub device: PathBuf,
    /// Block device number (major, minor).
    pub devno: (u32, u32),
}

impl std::fmt::Display for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.id, self.device.display())
    }
}

/// The instance store disks in `probe.by_id_dir`, sorted by by-id name. A missing folder
/// is no disks (an instance without any disk with a by-id name yet).
///
/// # Errors
/// [`ScratchError::NotInstanceStore`] for an instance-store name whose device the kernel
/// describes otherwise (a loop device without [`Probe::allow_loop`], another model, not a
/// block device); [`ScratchError::Io`] when the folder cannot be read.
pub fn discover(probe: &Probe) -> Result<Vec<Disk>, ScratchError> {
    let entries = match std::fs::read_dir(&probe.by_id_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(ScratchError::io(&probe.by_id_dir, e)),
    };
    let mut disks: Vec<Disk> = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !is_instance_store_name(&name) {
            continue;
        }
        let link = entry.path();
        // A link whose device is gone (a disk vanishing) is skipped: it is not there.
        let Ok(device) = std::fs::canonicalize(&link) else {
            continue;
        };
        let disk = check_device(probe, &name, &device)?;
        let Some(disk) = disk else { continue };
        match disks.iter_mut().find(|d| d.devno == disk.devno) {
            Some(d) if (disk.id.len(), &disk.id) < (d.id.len(), &d.id) => *d = disk,
            Some(_) => {}
            None => disks.push(disk),
        }
    }
    disks.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(disks)
}

/// Whether a by-id name is an instance store disk's own (not EBS, not a partition, not a
/// namespace alias).
pub fn is_instance_store_name(name: &str) -> bool {
    let Some(serial) = name.strip_prefix(INSTANCE_STORE_PREFIX) else {
        return false;
    };
    !serial.is_empty() && !serial.contains("-part") && !serial.contains("-ns-")
}

/// The disk behind `device`, or `None` for a partition.
fn check_device(probe: &Probe, name: &str, device: &Path) -> Result<Option<Disk>, ScratchError> {
    let refuse = |what: String| ScratchError::NotInstanceStore {
        disk: name.to_string(),
        device: device.to_path_buf(),
        what,
    };
    let meta = std::fs::metadata(device).map_err(|e| ScratchError::io(device, e))?;
    if !meta.file_type().is_block_device() {
        return Err(refuse("not a block device".into()));
    }
    let rdev = std::os::unix::fs::MetadataExt::rdev(&meta);
    let devno = (rustix::fs::major(rdev), rustix::fs::minor(rdev));
    let sys = probe.sys_dev_block.join(format!("{}:{}", devno.0, devno.1));
    if sys.join("partition").exists() {
        return Ok(None);
    }
    let is_loop = devno.0 == LOOP_MAJOR || sys.join("loop").exists();
    if is_loop && !probe.allow_loop {
        return Err(refuse(
            "a loop device, not instance storage: refused (only the agent's tests present \
             loop devices as instance storage)"
                .into(),
        ));
    }
    if !is_loop {
        let model = std::fs::read_to_string(sys.join("device/model")).unwrap_or_default();
        if model.trim() != INSTANCE_STORE_MODEL {
            return Err(refuse(format!(
                "the kernel says its model is {:?}, not {INSTANCE_STORE_MODEL:?}",
                model.trim()
            )));
        }
    }
    Ok(Some(Disk {
        id: name.to_string(),
        device: device.to_path_buf(),
        devno,
    }))
}

/// What a disk holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// No signature at all (`blkid -p` finds nothing): as instance storage is after a stop
    /// and start.
    Blank,
    /// A member of a btrfs file system.
    Btrfs(BtrfsMember),
    /// Something else (`ext4`, `xfs`, a partition table...): `blkid -p`'s words.
    Other(String),
}

/// A btrfs member, from its primary superblock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BtrfsMember {
    /// The file system's UUID (`fsid`), as blkid prints it.
    pub fsid: String,
    /// How many devices the file system spans (`num_devices`).
    pub num_devices: u64,
    /// This device's id in it (`dev_item.devid`, from 1).
    pub devid: u64,
}

/// Reads what `disk` holds: the btrfs superblock first, then `blkid -p` (the low-level
/// probe: every superblock and partition table signature it knows, without the cache).
///
/// # Errors
/// [`ScratchError::Io`] when the device cannot be read (a disk that vanished),
/// [`ScratchError::Command`] when blkid fails otherwise.
pub fn content(disk: &Disk, runner: &super::assemble::Runner) -> Result<Content, ScratchError> {
    let mut f = std::fs::File::open(&disk.device).map_err(|e| ScratchError::io(&disk.device, e))?;
    let mut sb = vec![0u8; 4096];
    let read = read_at(&mut f, BTRFS_SUPER_OFFSET, &mut sb)
        .map_err(|e| ScratchError::io(&disk.device, e))?;
    if read == sb.len() {
        if let Some(m) = parse_btrfs_superblock(&sb) {
            return Ok(Content::Btrfs(m));
        }
    }
    let dev = disk.device.to_string_lossy().into_owned();
    let out = runner.run(
        "blkid",
        &["-p", "-o", "export", &dev],
        std::slice::from_ref(disk),
    )?;
    match out.status {
        // blkid: 2 means nothing was found.
        2 => Ok(Content::Blank),
        0 => {
            let kv = |k: &str| {
                out.stdout
                    .lines()
                    .find_map(|l| l.strip_prefix(k).map(str::to_string))
            };
            let what = kv("TYPE=")
                .or_else(|| kv("PTTYPE=").map(|t| format!("a {t} partition table")))
                .unwrap_or_else(|| "a signature".into());
            Ok(Content::Other(what))
        }
        _ => Err(out.failed("blkid", std::slice::from_ref(disk))),
    }
}

fn read_at(f: &mut std::fs::File, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    use std::io::{Seek, SeekFrom};
    f.seek(SeekFrom::Start(offset))?;
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Parses a btrfs superblock (the 4 KiB at [`BTRFS_SUPER_OFFSET`]): `fsid` at 0x20, the
/// magic at 0x40, `num_devices` at 0x88, `dev_item.devid` at 0xc9 (little endian), as
/// `struct btrfs_super_block` in the kernel's `include/uapi/linux/btrfs_tree.h` lays them out.
/// `None` without the magic.
pub fn parse_btrfs_superblock(sb: &[u8]) -> Option<BtrfsMember> {
    if sb.get(0x40..0x48)? != BTRFS_MAGIC {
        return None;
    }
    let u64_at =
        |o: usize| -> Option<u64> { Some(u64::from_le_bytes(sb.get(o..o + 8)?.try_into().ok()?)) };
    let id = sb.get(0x20..0x30)?;
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let fsid = format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    );
    Some(BtrfsMember {
        fsid,
        num_devices: u64_at(0x88)?,
        devid: u64_at(0xc9)?,
    })
}

/// The size of `disk` in bytes (`/sys/dev/block/<maj>:<min>/size`, 512-byte sectors).
pub fn size_bytes(probe: &Probe, disk: &Disk) -> Option<u64> {
    let p = probe
        .sys_dev_block
        .join(format!("{}:{}/size", disk.devno.0, disk.devno.1));
    std::fs::read_to_string(p)
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(|s| s * 512)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(is_instance_store_name(
            "nvme-Amazon_EC2_NVMe_Instance_Storage_AWS1F2E3D4C5B6A7980"
        ));
        assert!(is_instance_store_name(
            "nvme-Amazon_EC2_NVMe_Instance_Storage_AWS1F2E3D4C5B6A7980_1"
        ));
        assert!(!is_instance_store_name(
            "nvme-Amazon_EC2_NVMe_Instance_Storage_AWS1F2E3D4C5B6A7980-part1"
        ));
        assert!(!is_instance_store_name(
            "nvme-Amazon_EC2_NVMe_Instance_Storage_AWS1F2E3D4C5B6A7980-ns-1"
        ));
        assert!(!is_instance_store_name(
            "nvme-Amazon_Elastic_Block_Store_vol0123456789abcdef0"
        ));
        assert!(!is_instance_store_name(INSTANCE_STORE_PREFIX));
    }

    #[test]
    fn superblock() {
        let mut sb = vec![0u8; 4096];
        assert_eq!(parse_btrfs_superblock(&sb), None);
        sb[0x40..0x48].copy_from_slice(BTRFS_MAGIC);
        for (i, b) in sb[0x20..0x30].iter_mut().enumerate() {
            *b = i as u8;
        }
        sb[0x88..0x90].copy_from_slice(&3u64.to_le_bytes());
        sb[0xc9..0xd1].copy_from_slice(&2u64.to_le_bytes());
        assert_eq!(
            parse_btrfs_superblock(&sb),
            Some(BtrfsMember {
                fsid: "00010203-0405-0607-0809-0a0b0c0d0e0f".into(),
                num_devices: 3,
                devid: 2,
            })
        );
    }
}
