//! Mounts and file system space (NHC's `check_fs_mount*`, `check_fs_free/used/size`,
//! `check_fs_inodes/ifree/iused`).
//!
//! Space numbers come from statvfs(2) and are computed the way df(1) does: size =
//! `f_blocks`, used = `f_blocks - f_bfree`, available = `f_bavail` (all × `f_frsize`),
//! use% = `used / (used + available)` rounded up. A file system reporting zero blocks
//! (a pseudo file system) passes space checks, as in NHC.

use std::path::Path;

use super::{Checked, Failed};
use crate::health::facts::Facts;
use crate::health::matcher::Matcher;
use crate::health::units::{df_percent, human_kib, Threshold};

/// What to compare in a [`SpaceSpec`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpaceWhat {
    /// Available space at least `min`.
    Free,
    /// Used space below `max`.
    Used,
    /// Size between `min` and `max`.
    Size,
    /// Inode count between `min` and `max`.
    Inodes,
    /// Free inodes at least `min`.
    InodesFree,
    /// Used inodes below `max`.
    InodesUsed,
}

/// Space or inodes of the file system holding `path`.
#[derive(Debug, Clone, PartialEq)]
pub struct SpaceSpec {
    /// Any path on the file system (usually its mount point).
    pub path: String,
    /// What to compare.
    pub what: SpaceWhat,
    /// Lower bound (free, size, inodes, free inodes).
    pub min: Option<Threshold>,
    /// Upper bound (used, size, inodes, used inodes).
    pub max: Option<Threshold>,
}

/// Space and inodes of the file system that holds `path` (checks.d's `space` kind): measured
/// whether or not `path` is a mount point (`/tmp` on the root file system is the root's
/// space), unlike NHC's `check_fs_free`, which passes on a path that is not a mount point.
#[derive(Debug, Clone, PartialEq)]
pub struct FreeSpaceSpec {
    /// The path (it must exist).
    pub path: String,
    /// The limits, each on the file system holding `path` (their `path` is this one).
    pub space: Vec<SpaceSpec>,
}

/// A mount point.
#[derive(Debug, Clone)]
pub struct MountSpec {
    /// Mount point.
    pub path: String,
    /// Each must match the source (device).
    pub sources: Vec<Matcher>,
    /// Each must match the file system type.
    pub fstypes: Vec<Matcher>,
    /// Each must match the options string (`rw,relatime,...`).
    pub options: Vec<Matcher>,
    /// statvfs() the mount point (on the check's own thread, under its timeout).
    pub alive: bool,
    /// statvfs() must not report a read-only file system.
    pub writable: bool,
    /// Space checks on the mount point, after the above.
    pub space: Vec<SpaceSpec>,
    /// What to do when the check fails or passes (NHC's `-r`, `-O`, `-e`, `-E`).
    pub actions: MountActions,
}

/// NHC's `check_fs_mount` actions, taken by the engine after the check (never through a
/// shell; only reported under `check --no-act`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MountActions {
    /// A missing mount point directory is created (`mkdir -p -m 0755`), as NHC always
    /// does for a file system that is not mounted.
    pub mkdir: bool,
    /// `-r`: mount it (`MOUNT [-o OPTS] PATH`), or, when it is mounted but wrong and `-O`
    /// is given, `MOUNT -o remount,OPTS PATH`.
    pub remount: bool,
    /// The mount program and its first arguments (NHC's `MOUNT_CMD`, `mount`).
    pub mount_cmd: Vec<String>,
    /// `-O`: mount options for `-r`.
    pub mount_opts: Option<String>,
    /// `-e`: run when the check fails.
    pub missing: Vec<String>,
    /// `-E`: run when the check passes.
    pub found: Vec<String>,
}

/// One action of [`MountActions`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountAction {
    /// Create the directory (mode 0755, parents too).
    Mkdir(String),
    /// Run this program with these arguments.
    Run(Vec<String>),
}

impl MountActions {
    /// Whether any action is set.
    pub fn any(&self) -> bool {
        self.mkdir || self.remount || !self.missing.is_empty() || !self.found.is_empty()
    }
}

/// The actions NHC takes after `check_fs_mount` on `spec.path`: `passed` is the check's
/// verdict, `in_table` whether the path is in `/proc/mounts` (mounted, but wrong), and
/// `dir_exists` whether the mount point directory exists.
pub fn mount_actions(
    spec: &MountSpec,
    passed: bool,
    in_table: bool,
    dir_exists: bool,
) -> Vec<MountAction> {
    let a = &spec.actions;
    let mut out = Vec::new();
    if passed {
        if !a.found.is_empty() {
            out.push(MountAction::Run(a.found.clone()));
        }
        return out;
    }
    let mount = |opts: Option<String>| {
        let mut argv = a.mount_cmd.clone();
        if let Some(o) = opts {
            argv.extend(["-o".to_string(), o]);
        }
        argv.push(spec.path.clone());
        MountAction::Run(argv)
    };
    if !in_table && !dir_exists {
        if a.mkdir {
            out.push(MountAction::Mkdir(spec.path.clone()));
        }
        if a.remount {
            out.push(mount(a.mount_opts.clone()));
        }
    } else if a.remount {
        let opts = if in_table {
            a.mount_opts.as_ref().map(|o| format!("remount,{o}"))
        } else {
            a.mount_opts.clone()
        };
        out.push(mount(opts));
    }
    if !a.missing.is_empty() {
        out.push(MountAction::Run(a.missing.clone()));
    }
    out
}

struct Usage {
    size_kib: u64,
    used_kib: u64,
    avail_kib: u64,
    files: u64,
    ffree: u64,
    read_only: bool,
}

fn statvfs(path: &str) -> Result<Usage, Failed> {
    let s = rustix::fs::statvfs(Path::new(path)).map_err(|e| {
        Failed::new(
            Checked::FileSystem(path.to_string()),
            format!("statfs({path}): {e}"),
        )
    })?;
    let k = |blocks: u64| blocks.saturating_mul(s.f_frsize) / 1024;
    Ok(Usage {
        size_kib: k(s.f_blocks),
        used_kib: k(s.f_blocks.saturating_sub(s.f_bfree)),
        avail_kib: k(s.f_bavail),
        files: s.f_files,
        ffree: s.f_ffree,
        read_only: s.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY),
    })
}

/// Runs a mount check.
///
/// # Errors
/// [`Failed`]: what is wrong, in NHC's words.
pub fn check_mount(spec: &MountSpec, facts: &Facts) -> Result<String, Failed> {
    let failed = |m: String| Failed::new(Checked::FileSystem(spec.path.clone()), m);
    let path = spec.path.as_str();
    let mounts = facts.mounts()?;
    let Some(m) = mounts.iter().rev().find(|m| m.target == path) else {
        if Path::new(path).is_dir() {
            return Err(failed(format!("{path} not mounted")));
        }
        return Err(failed(format!(
            "{path} not mounted; directory {path} missing"
        )));
    };
    for s in &spec.sources {
        if !s.matches(&m.source) {
            return Err(failed(format!(
                "{path} mounted from {} (should match {s})",
                m.source
            )));
        }
    }
    for t in &spec.fstypes {
        if !t.matches(&m.fstype) {
            return Err(failed(format!(
                "{path} has type {} (should match {t})",
                m.fstype
            )));
        }
    }
    for o in &spec.options {
        if !o.matches(&m.options) {
            return Err(failed(format!(
                "{path} mount options {} incorrect (should match {o})",
                m.options
            )));
        }
    }
    let mut detail = format!("{} on {path} type {} ({})", m.source, m.fstype, m.options);
    if spec.alive || spec.writable || !spec.space.is_empty() {
        let u = statvfs(path)?;
        if spec.writable && u.read_only {
            return Err(failed(format!("{path} is read-only (statfs ST_RDONLY)")));
        }
        for s in &spec.space {
            detail = format!("{detail}; {}", eval_space(s, &u)?);
        }
    }
    Ok(detail)
}

/// Runs a checks.d `space` check: statfs(2) of `path` itself (under the check's timeout, on
/// its own thread), then each limit.
///
/// # Errors
/// [`Failed`]: `path` cannot be measured (it does not exist), or a limit is not met.
pub fn check_free_space(spec: &FreeSpaceSpec) -> Result<String, Failed> {
    let u = statvfs(&spec.path)?;
    let found = spec
        .space
        .iter()
        .map(|s| eval_space(s, &u))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(found.join("; "))
}

/// Runs a space check.
///
/// # Errors
/// [`Failed`]: what is wrong, in NHC's words.
///
/// As NHC 1.4.3 (which looks the path up among the mounted file systems), a path that is
/// not a mount point, or does not exist, is not measured: the check passes with a warning
/// in its message, never fails on `statfs` and never measures the file system above it.
pub fn check_space(spec: &SpaceSpec, facts: &Facts) -> Result<String, Failed> {
    let path = spec.path.trim_end_matches('/');
    let path = if path.is_empty() { "/" } else { path };
    if !facts.mounts()?.iter().any(|m| m.target == path) {
        let why = if Path::new(path).exists() {
            "is not a mount point"
        } else {
            "does not exist"
        };
        return Ok(format!(
            "warning: {path} {why}: not measured (as NHC, the check passes)"
        ));
    }
    let u = statvfs(path)?;
    eval_space(spec, &u)
}

fn eval_space(spec: &SpaceSpec, u: &Usage) -> Result<String, Failed> {
    let failed = |m: String| Failed::new(Checked::FileSystem(spec.path.clone()), m);
    let path = &spec.path;
    let inode_check = matches!(
        spec.what,
        SpaceWhat::Inodes | SpaceWhat::InodesFree | SpaceWhat::InodesUsed
    );
    if (!inode_check && u.size_kib == 0) || (inode_check && u.files == 0) {
        return Ok(format!("{path}: pseudo file system, no size reported"));
    }
    let pct = df_percent(u.used_kib, u.avail_kib);
    let iused = u.files.saturating_sub(u.ffree);
    let ipct = df_percent(iused, u.ffree);
    match spec.what {
        SpaceWhat::Free => {
            let free_pct = 100 - pct;
            match spec.min {
                Some(Threshold::Percent(p)) if (free_pct as f64) < p => Err(failed(format!(
                    "{path} has only {free_pct}% free ({}), minimum is {p}%",
                    human_kib(u.avail_kib)
                ))),
                Some(Threshold::Absolute(n)) if u.avail_kib < n => Err(failed(format!(
                    "{path} has only {} free, minimum is {}",
                    human_kib(u.avail_kib),
                    human_kib(n)
                ))),
                _ => Ok(format!(
                    "{path}: {} free ({free_pct}%)",
                    human_kib(u.avail_kib)
                )),
            }
        }
        SpaceWhat::Used => match spec.max {
            Some(Threshold::Percent(p)) if pct as f64 >= p => Err(failed(format!(
                "{path} is {pct}% full ({} used), threshold is {p}%",
                human_kib(u.used_kib)
            ))),
            Some(Threshold::Absolute(n)) if u.used_kib >= n => Err(failed(format!(
                "{path} has {} used, threshold is {}",
                human_kib(u.used_kib),
                human_kib(n)
            ))),
            _ => Ok(format!("{path}: {pct}% used ({})", human_kib(u.used_kib))),
        },
        SpaceWhat::Size => {
            if let Some(Threshold::Absolute(n)) = spec.min {
                if u.size_kib < n {
                    return Err(failed(format!(
                        "{path} size {} less than minimum of {}",
                        human_kib(u.size_kib),
                        human_kib(n)
                    )));
                }
            }
            if let Some(Threshold::Absolute(n)) = spec.max {
                if u.size_kib > n {
                    return Err(failed(format!(
                        "{path} size {} exceeds maximum of {}",
                        human_kib(u.size_kib),
                        human_kib(n)
                    )));
                }
            }
            Ok(format!("{path}: size {}", human_kib(u.size_kib)))
        }
        SpaceWhat::Inodes => {
            if let Some(Threshold::Absolute(n)) = spec.min {
                if u.files < n {
                    return Err(failed(format!(
                        "{path} inodes {} less than minimum of {n}",
                        u.files
                    )));
                }
            }
            if let Some(Threshold::Absolute(n)) = spec.max {
                if u.files > n {
                    return Err(failed(format!(
                        "{path} inodes {} exceeds maximum of {n}",
                        u.files
                    )));
                }
            }
            Ok(format!("{path}: {} inodes", u.files))
        }
        SpaceWhat::InodesFree => {
            let free_pct = 100 - ipct;
            match spec.min {
                Some(Threshold::Percent(p)) if (free_pct as f64) < p => Err(failed(format!(
                    "{path} has only {free_pct}% of inodes free ({}), minimum is {p}%",
                    u.ffree
                ))),
                Some(Threshold::Absolute(n)) if u.ffree < n => Err(failed(format!(
                    "{path} has only {} inodes free, minimum is {n}",
                    u.ffree
                ))),
                _ => Ok(format!("{path}: {} inodes free ({free_pct}%)", u.ffree)),
            }
        }
        SpaceWhat::InodesUsed => match spec.max {
            Some(Threshold::Percent(p)) if ipct as f64 >= p => Err(failed(format!(
                "{path} has {ipct}% of inodes used ({iused}), threshold is {p}%"
            ))),
            Some(Threshold::Absolute(n)) if iused >= n => Err(failed(format!(
                "{path} has {iused} inodes used, threshold is {n}"
            ))),
            _ => Ok(format!("{path}: {iused} inodes used ({ipct}%)")),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn usage(size: u64, used: u64, avail: u64, files: u64, ffree: u64) -> Usage {
        Usage {
            size_kib: size,
            used_kib: used,
            avail_kib: avail,
            files,
            ffree,
            read_only: false,
        }
    }

    fn spec(what: SpaceWhat, min: Option<Threshold>, max: Option<Threshold>) -> SpaceSpec {
        SpaceSpec {
            path: "/x".into(),
            what,
            min,
            max,
        }
    }

    /// A `space` check measures the file system holding a folder that is not a mount
    /// point (where NHC's `check_fs_free` passes unmeasured), and fails on one that does
    /// not exist.
    #[test]
    fn free_space_measures_the_file_system_holding_any_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().display().to_string();
        let free = |min: Threshold| FreeSpaceSpec {
            path: path.clone(),
            space: vec![SpaceSpec {
                path: path.clone(),
                what: SpaceWhat::Free,
                min: Some(min),
                max: None,
            }],
        };
        let ok = check_free_space(&free(Threshold::Absolute(1))).unwrap();
        assert!(
            ok.starts_with(&format!("{path}: ")) && ok.contains("free"),
            "{ok}"
        );
        // More than any file system here has: measured, so it fails.
        let e = check_free_space(&free(Threshold::Absolute(u64::MAX / 2)))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with(&format!("{path} has only ")), "{e}");
        let gone = FreeSpaceSpec {
            path: format!("{path}/absent"),
            space: Vec::new(),
        };
        let e = check_free_space(&gone).unwrap_err().to_string();
        assert!(e.contains("statfs(") && e.contains("absent"), "{e}");
    }

    #[test]
    fn free_and_used_thresholds() {
        let u = usage(1000, 950, 50, 100, 1);
        assert!(eval_space(
            &spec(SpaceWhat::Free, Some(Threshold::Percent(10.0)), None),
            &u
        )
        .is_err());
        assert!(eval_space(
            &spec(SpaceWhat::Free, Some(Threshold::Percent(5.0)), None),
            &u
        )
        .is_ok());
        assert!(eval_space(
            &spec(SpaceWhat::Free, Some(Threshold::Absolute(51)), None),
            &u
        )
        .is_err());
        assert!(eval_space(
            &spec(SpaceWhat::Used, None, Some(Threshold::Percent(95.0))),
            &u
        )
        .is_err());
        assert!(eval_space(
            &spec(SpaceWhat::Used, None, Some(Threshold::Percent(96.0))),
            &u
        )
        .is_ok());
        assert!(eval_space(
            &spec(SpaceWhat::InodesFree, Some(Threshold::Absolute(2)), None),
            &u
        )
        .is_err());
        assert!(eval_space(
            &spec(SpaceWhat::InodesFree, Some(Threshold::Percent(1.0)), None),
            &u
        )
        .is_ok());
        assert!(eval_space(
            &spec(SpaceWhat::InodesUsed, None, Some(Threshold::Absolute(99))),
            &u
        )
        .is_err());
        assert!(eval_space(
            &spec(SpaceWhat::Size, Some(Threshold::Absolute(2000)), None),
            &u
        )
        .is_err());
        assert!(eval_space(
            &spec(SpaceWhat::Inodes, None, Some(Threshold::Absolute(99))),
            &u
        )
        .is_err());
    }

    #[test]
    fn pseudo_file_systems_pass() {
        let u = usage(0, 0, 0, 0, 0);
        assert!(eval_space(
            &spec(SpaceWhat::Free, Some(Threshold::Percent(50.0)), None),
            &u
        )
        .is_ok());
    }

    #[test]
    fn statvfs_of_root_and_paths_that_are_no_mount_points() {
        let facts = Facts::new(crate::health::facts::Host::default());
        let s = SpaceSpec {
            path: "/".into(),
            what: SpaceWhat::Free,
            min: Some(Threshold::Absolute(1)),
            max: None,
        };
        check_space(&s, &facts).unwrap();
        // Impossible thresholds on a path that is no mount point (or does not exist):
        // NHC passes; the agent passes with a warning and measures nothing.
        let impossible = u64::MAX / 2;
        for (path, why) in [
            ("/etc", "is not a mount point"),
            ("/no/such/fs", "does not exist"),
        ] {
            let s = SpaceSpec {
                path: path.into(),
                what: SpaceWhat::Free,
                min: Some(Threshold::Absolute(impossible)),
                max: None,
            };
            let m = check_space(&s, &facts).unwrap();
            assert!(m.starts_with("warning: ") && m.contains(why), "{m}");
        }
        // On the mount point itself the same threshold fails.
        let s = SpaceSpec {
            path: "/".into(),
            what: SpaceWhat::Free,
            min: Some(Threshold::Absolute(impossible)),
            max: None,
        };
        assert!(check_space(&s, &facts).is_err());
    }
}
