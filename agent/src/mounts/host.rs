//! What the host already has: `/etc/fstab` lines, the mount table
//! (`/proc/self/mountinfo`), unit files of the same name, and the Lustre kernel module.

use std::path::{Path, PathBuf};

/// Undoes the octal escapes of fstab(5) and proc(5) mountinfo (`\040` space, `\011` tab,
/// `\012` newline, `\134` backslash).
pub fn unescape_octal(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The line number (1-based) and text of the first fstab line whose mount point is
/// `mount_point`. A missing file has none.
pub fn fstab_line_for(fstab: &str, mount_point: &str) -> Option<(usize, String)> {
    fstab.lines().enumerate().find_map(|(i, line)| {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            return None;
        }
        let field = t.split_whitespace().nth(1)?;
        (unescape_octal(field) == mount_point).then(|| (i + 1, t.to_string()))
    })
}

/// One line of `/proc/<pid>/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Mount point.
    pub mount_point: String,
    /// File system type (`tmpfs`, `lustre`, `nfs4`...).
    pub fs_type: String,
    /// Source as the kernel shows it (a Lustre DNS name appears as its address).
    pub source: String,
    /// Per-mount options (`rw`/`ro` first).
    pub options: String,
}

impl MountEntry {
    /// Whether the mount is read-only.
    pub fn read_only(&self) -> bool {
        self.options.split(',').any(|o| o == "ro")
    }
}

/// Parses mountinfo (proc(5)): `id parent maj:min root mount-point options [optional...] -
/// fstype source super-options`.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let l: Vec<&str> = left.split(' ').collect();
            let mut r = right.split(' ');
            Some(MountEntry {
                mount_point: unescape_octal(l.get(4)?),
                options: l.get(5)?.to_string(),
                fs_type: r.next()?.to_string(),
                source: unescape_octal(r.next().unwrap_or_default()),
            })
        })
        .collect()
}

/// The mount on top at `mount_point` (the last one listed), if any.
pub fn mounted_at<'a>(entries: &'a [MountEntry], mount_point: &str) -> Option<&'a MountEntry> {
    entries.iter().rev().find(|e| e.mount_point == mount_point)
}

/// Whether the kernel type `found` is what a mount of type `wanted` shows (`nfs` and
/// `nfs4` are the same client).
pub fn same_fs_type(wanted: &str, found: &str) -> bool {
    let norm = |t: &str| if t == "nfs4" { "nfs" } else { t }.to_string();
    norm(wanted) == norm(found)
}

/// Where the running kernel's modules are looked for.
#[derive(Debug, Clone)]
pub struct ModuleProbe {
    /// `/lib/modules`.
    pub modules_dir: PathBuf,
    /// `/proc/filesystems` (lists a type once its module is loaded or built in).
    pub filesystems: PathBuf,
    /// The running kernel's release (`uname -r`).
    pub kernel_release: String,
}

/// No Lustre client module for the running kernel ([`ModuleProbe::lustre`]): which kernel,
/// and where it looked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "no Lustre client kernel module for the running kernel {kernel_release} ({}, not loaded). \
     The kernel was probably updated past the installed Lustre client: install the Lustre \
     client modules built for {kernel_release} (e.g. kmod-lustre-client or lustre-client-modules-{kernel_release}) \
     or boot the kernel they were built for",
    self.looked()
)]
pub struct LustreModuleMissing {
    /// The running kernel's release (`uname -r`).
    pub kernel_release: String,
    /// `/proc/filesystems`, which does not list `lustre`.
    pub filesystems: PathBuf,
    /// `/lib/modules/<release>`, searched (its `modules.dep`, else its files).
    pub modules_dir: PathBuf,
    /// Whether that folder exists.
    pub modules_dir_exists: bool,
    /// The modinfo(8) asked, when one was found.
    pub modinfo: Option<&'static str>,
}

impl LustreModuleMissing {
    /// Where it looked, as the message says it: `not in <dir>` or `<dir> does not exist`.
    fn looked(&self) -> String {
        if self.modules_dir_exists {
            format!("not in {}", self.modules_dir.display())
        } else {
            format!("{} does not exist", self.modules_dir.display())
        }
    }
}

/// modinfo(8) locations, by absolute path (the agent never relies on PATH).
const MODINFO: [&str; 3] = ["/usr/sbin/modinfo", "/sbin/modinfo", "/usr/bin/modinfo"];

impl ModuleProbe {
    /// Whether a `lustre` kernel module is usable by the running kernel: already loaded
    /// or built in (`/proc/filesystems`), listed in `modules.dep`, present as a file under
    /// `/lib/modules/<release>`, or found by `modinfo -k <release> lustre`.
    ///
    /// Returns where it found it, in words.
    ///
    /// # Errors
    /// [`LustreModuleMissing`]: which kernel, where it looked (its message says what to do).
    pub fn lustre(&self) -> Result<String, LustreModuleMissing> {
        let release = &self.kernel_release;
        if std::fs::read_to_string(&self.filesystems).is_ok_and(|t| {
            t.lines()
                .any(|l| l.split_whitespace().last() == Some("lustre"))
        }) {
            return Ok(format!("lustre listed in {}", self.filesystems.display()));
        }
        let dir = self.modules_dir.join(release);
        let dep = dir.join("modules.dep");
        let is_lustre_ko = |name: &str| {
            let base = name.rsplit('/').next().unwrap_or(name);
            ["lustre.ko", "lustre.ko.xz", "lustre.ko.zst", "lustre.ko.gz"].contains(&base)
        };
        if let Ok(text) = std::fs::read_to_string(&dep) {
            if text
                .lines()
                .filter_map(|l| l.split(':').next())
                .any(is_lustre_ko)
            {
                return Ok(format!("lustre.ko listed in {}", dep.display()));
            }
        } else if let Some(p) = find_file(&dir, &is_lustre_ko, 6) {
            return Ok(format!("{} exists", p.display()));
        }
        let mut modinfo = None;
        for m in MODINFO {
            if Path::new(m).exists() {
                modinfo = Some(m);
                let ok = std::process::Command::new(m)
                    .args(["-k", release, "-F", "filename", "lustre"])
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                if ok {
                    return Ok(format!("{m} -k {release} lustre found it"));
                }
                break;
            }
        }
        Err(LustreModuleMissing {
            kernel_release: release.clone(),
            filesystems: self.filesystems.clone(),
            modules_dir_exists: dir.is_dir(),
            modules_dir: dir,
            modinfo,
        })
    }
}

fn find_file(dir: &Path, pred: &dyn Fn(&str) -> bool, depth: u32) -> Option<PathBuf> {
    if depth == 0 {
        return None;
    }
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        let ft = e.file_type().ok()?;
        if ft.is_dir() {
            if let Some(f) = find_file(&p, pred, depth - 1) {
                return Some(f);
            }
        } else if pred(&e.file_name().to_string_lossy()) {
            return Some(p);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn fstab_lines_match_by_unescaped_mount_point() {
        let fstab = "# comment /fsx\nUUID=1 / ext4 defaults 0 1\n\
                     fs-1.fsx.us-east-1.amazonaws.com@tcp:/abc /fsx lustre relatime 0 0\n\
                     srv:/x /mnt/my\\040fs nfs defaults 0 0\n";
        assert_eq!(fstab_line_for(fstab, "/fsx").unwrap().0, 3);
        assert_eq!(fstab_line_for(fstab, "/mnt/my fs").unwrap().0, 4);
        assert!(fstab_line_for(fstab, "/other").is_none());
    }

    #[test]
    fn mountinfo_parses_optional_fields_and_escapes() {
        let text = "36 35 98:0 / /mnt1 rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n\
                    64 43 0:40 / /tmp/my\\040dir ro,relatime shared:5 shared:6 - tmpfs tmpfs rw,size=1024k\n\
                    70 43 0:41 / /fsx rw - lustre 10.0.0.1@tcp:/abc rw,flock\n";
        let e = parse_mountinfo(text);
        assert_eq!(e.len(), 3);
        assert_eq!(e[1].mount_point, "/tmp/my dir");
        assert_eq!(e[1].fs_type, "tmpfs");
        assert!(e[1].read_only());
        assert!(!e[0].read_only());
        assert_eq!(mounted_at(&e, "/fsx").unwrap().source, "10.0.0.1@tcp:/abc");
        assert!(same_fs_type("nfs4", "nfs"));
        assert!(!same_fs_type("lustre", "tmpfs"));
    }

    #[test]
    fn lustre_module_found_in_modules_dep_or_reported_plainly() {
        let dir = tempfile::tempdir().unwrap();
        let probe = ModuleProbe {
            modules_dir: dir.path().to_path_buf(),
            filesystems: dir.path().join("filesystems"),
            kernel_release: "6.1.0-test".into(),
        };
        std::fs::write(dir.path().join("filesystems"), "nodev\ttmpfs\n\text4\n").unwrap();
        let e = probe.lustre().unwrap_err().to_string();
        assert!(
            e.contains("no Lustre client kernel module for the running kernel 6.1.0-test"),
            "{e}"
        );
        assert!(e.contains("does not exist"), "{e}");
        let kdir = dir.path().join("6.1.0-test");
        std::fs::create_dir_all(&kdir).unwrap();
        std::fs::write(
            kdir.join("modules.dep"),
            "kernel/fs/ext4/ext4.ko: kernel/lib/crc16.ko\n",
        )
        .unwrap();
        assert!(probe.lustre().unwrap_err().to_string().contains("not in"));
        std::fs::write(
            kdir.join("modules.dep"),
            "extra/lustre/fs/lustre.ko.xz: extra/lustre/net/lnet.ko.xz\n",
        )
        .unwrap();
        assert!(probe.lustre().unwrap().contains("modules.dep"));
        std::fs::write(kdir.join("modules.dep"), "").unwrap();
        std::fs::write(dir.path().join("filesystems"), "nodev\tlustre\n").unwrap();
        assert!(probe.lustre().is_ok());
    }
}
