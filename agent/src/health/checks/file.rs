//! Files (NHC's `check_file_test`, `check_file_contents`, `check_file_stat`), through
//! stat(2)/access(2) directly instead of `test` and `stat` processes.

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fs::{Access, AtFlags, CWD};

use super::{Checked, Failed};
use crate::health::facts::Facts;
use crate::health::matcher::{glob_match, Matcher};

/// `test` operators over files: every operator must hold for every path; negated (NHC's
/// `-!`), the check passes as soon as one test fails and fails only when all hold, as
/// NHC 1.4.3's `check_file_test` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileTestSpec {
    /// Operators, as the letters of `test` (`r`, `w`, `x`, `d`, `f`, `e`, `s`, `c`, `b`,
    /// `p`, `S`, `h`/`L`, `k`, `u`, `g`, `O`, `G`, `N`, `a`).
    pub ops: Vec<char>,
    /// NHC's `-!`.
    pub negate: bool,
    /// Paths; shell glob patterns are expanded.
    pub paths: Vec<String>,
}

/// Lines of a file: each positive expression must match some line, no line may match a
/// negated one (`!expr`).
#[derive(Debug, Clone)]
pub struct FileContentsSpec {
    /// File.
    pub path: String,
    /// Expressions.
    pub matches: Vec<Matcher>,
}

/// The cluster key file of Slurm's authentication plugin (checks.d's `auth_key` kind): where
/// the agent writes it (`auth.key_path`, else the plugin's default), a regular file of a size
/// the plugin takes, that other users can neither read nor write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpec {
    /// The key file.
    pub path: String,
    /// `auth/munge` or `auth/slurm`.
    pub plugin: &'static str,
    /// The user the agent makes the file's owner (`auth.key_owner`, else the plugin's
    /// daemon user): another owner fails; an owner that `/etc/passwd` does not name (a
    /// directory service's user) is not judged.
    pub owner: String,
    /// Fewest bytes the plugin takes.
    pub min: u64,
    /// Most bytes the plugin takes.
    pub max: u64,
}

/// Runs an `auth_key` check: stat(2) only, the key is never read.
///
/// # Errors
/// [`Failed`]: the file is missing, not a regular file, of a size the plugin refuses, or
/// open to other users.
pub fn check_key(spec: &KeySpec, facts: &Facts) -> Result<String, Failed> {
    let p = spec.path.as_str();
    let failed = |m: String| Failed::new(Checked::Files(vec![spec.path.clone()]), m);
    let m = fs::metadata(p).map_err(|e| failed(format!("{} key {p}: {e}", spec.plugin)))?;
    if !m.is_file() {
        return Err(failed(format!(
            "{} key {p} is not a regular file",
            spec.plugin
        )));
    }
    let size = m.len();
    if !(spec.min..=spec.max).contains(&size) {
        return Err(failed(format!(
            "{} key {p} holds {size} bytes; {} takes {} to {}",
            spec.plugin, spec.plugin, spec.min, spec.max
        )));
    }
    let mode = m.mode() & 0o7777;
    if mode & 0o007 != 0 {
        return Err(failed(format!(
            "{} key {p} has mode {mode:04o}: other users may read or write it",
            spec.plugin
        )));
    }
    let owner = facts.user_name(m.uid());
    let unnamed = owner.parse::<u32>().is_ok() && spec.owner.parse::<u32>().is_err();
    if owner != spec.owner && !unnamed {
        return Err(failed(format!(
            "{} key {p} is owned by {owner}, not {}",
            spec.plugin, spec.owner
        )));
    }
    Ok(format!(
        "{} key {p}: {size} bytes, mode {mode:04o}, owner {owner}",
        spec.plugin
    ))
}

/// stat() expectations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileStatSpec {
    /// Files.
    pub paths: Vec<String>,
    /// Owner user name.
    pub user: Option<String>,
    /// Owner uid.
    pub uid: Option<u32>,
    /// Group name.
    pub group: Option<String>,
    /// Group id.
    pub gid: Option<u32>,
    /// Exact mode (permission bits; with file type bits when above 0o7777).
    pub mode_is: Option<u32>,
    /// These mode bits must be set.
    pub mode_has: Option<u32>,
    /// Device number (`st_dev`).
    pub devno: Option<u64>,
    /// Device major (`st_rdev`).
    pub major: Option<u32>,
    /// Device minor (`st_rdev`).
    pub minor: Option<u32>,
    /// mtime newer than this many seconds ago.
    pub mtime_newer: Option<u64>,
    /// mtime older than this many seconds ago.
    pub mtime_older: Option<u64>,
    /// ctime newer than this many seconds ago.
    pub ctime_newer: Option<u64>,
    /// ctime older than this many seconds ago.
    pub ctime_older: Option<u64>,
}

/// Operators `check_file_test` accepts.
pub const TEST_OPS: &str = "abcdefghkprsuwxGLNOS";

fn has_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// Expands a shell glob over the file system, component by component; a pattern that
/// matches nothing is returned as is (bash without `nullglob`).
pub fn expand_glob(pattern: &str) -> Vec<String> {
    if !has_glob(pattern) {
        return vec![pattern.to_string()];
    }
    let absolute = pattern.starts_with('/');
    let mut bases: Vec<PathBuf> = vec![if absolute {
        PathBuf::from("/")
    } else {
        PathBuf::from(".")
    }];
    for comp in pattern.split('/').filter(|c| !c.is_empty()) {
        let mut next = Vec::new();
        for b in &bases {
            if has_glob(comp) {
                let mut names: Vec<String> = fs::read_dir(b)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| {
                        (!n.starts_with('.') || comp.starts_with('.')) && glob_match(comp, n)
                    })
                    .collect();
                names.sort();
                next.extend(names.into_iter().map(|n| b.join(n)));
            } else {
                let p = b.join(comp);
                if p.symlink_metadata().is_ok() {
                    next.push(p);
                }
            }
        }
        bases = next;
    }
    if bases.is_empty() {
        return vec![pattern.to_string()];
    }
    bases
        .into_iter()
        .map(|p| {
            let s = p.to_string_lossy().into_owned();
            if absolute {
                s
            } else {
                s.strip_prefix("./").unwrap_or(&s).to_string()
            }
        })
        .collect()
}

fn test_one(op: char, path: &str) -> bool {
    let p = Path::new(path);
    let meta = || fs::metadata(p).ok();
    let access = |a: Access| rustix::fs::accessat(CWD, p, a, AtFlags::EACCESS).is_ok();
    match op {
        'a' | 'e' => meta().is_some(),
        'f' => meta().is_some_and(|m| m.is_file()),
        'd' => meta().is_some_and(|m| m.is_dir()),
        'c' => meta().is_some_and(|m| m.file_type().is_char_device()),
        'b' => meta().is_some_and(|m| m.file_type().is_block_device()),
        'p' => meta().is_some_and(|m| m.file_type().is_fifo()),
        'S' => meta().is_some_and(|m| m.file_type().is_socket()),
        'h' | 'L' => fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink()),
        's' => meta().is_some_and(|m| m.len() > 0),
        'k' => meta().is_some_and(|m| m.mode() & 0o1000 != 0),
        'u' => meta().is_some_and(|m| m.mode() & 0o4000 != 0),
        'g' => meta().is_some_and(|m| m.mode() & 0o2000 != 0),
        'r' => access(Access::READ_OK),
        'w' => access(Access::WRITE_OK),
        'x' => access(Access::EXEC_OK),
        'O' => meta().is_some_and(|m| m.uid() == rustix::process::geteuid().as_raw()),
        'G' => meta().is_some_and(|m| m.gid() == rustix::process::getegid().as_raw()),
        'N' => meta().is_some_and(|m| m.mtime() > m.atime()),
        _ => false,
    }
}

/// Runs a file test check.
///
/// # Errors
/// [`Failed`]: what is wrong, in NHC's words.
pub fn check_test(spec: &FileTestSpec) -> Result<String, Failed> {
    let failed = |m: String| Failed::new(Checked::Files(spec.paths.clone()), m);
    let paths: Vec<String> = spec.paths.iter().flat_map(|p| expand_glob(p)).collect();
    let ops: String = spec.ops.iter().map(|o| format!("-{o} ")).collect();
    for op in &spec.ops {
        for p in &paths {
            if !test_one(*op, p) {
                return if spec.negate {
                    Ok(format!(
                        "-! {ops}{}: test -{op} {p} is not true",
                        paths.join(" ")
                    ))
                } else {
                    Err(failed(format!("test -{op} {p} is not true")))
                };
            }
        }
    }
    if spec.negate {
        return Err(failed(format!(
            "-! {ops}{}: every test is true",
            paths.join(" ")
        )));
    }
    Ok(format!("{}{}", ops, paths.join(" ")))
}

/// Runs a file contents check, reading line by line and stopping once every positive
/// expression has matched.
///
/// # Errors
/// [`Failed`]: what is wrong, in NHC's words.
pub fn check_contents(spec: &FileContentsSpec) -> Result<String, Failed> {
    let failed = |m: String| Failed::new(Checked::Files(vec![spec.path.clone()]), m);
    let f =
        fs::File::open(&spec.path).map_err(|e| failed(format!("opening {}: {e}", spec.path)))?;
    let mut matched: Vec<bool> = spec.matches.iter().map(Matcher::is_negated).collect();
    let positives = spec.matches.iter().filter(|m| !m.is_negated()).count();
    let mut found = 0;
    for (n, line) in BufReader::new(f).lines().enumerate() {
        let line = line.map_err(|e| failed(format!("reading {}: {e}", spec.path)))?;
        for (i, m) in spec.matches.iter().enumerate() {
            if m.is_negated() {
                if m.matches_ignoring_negation(&line) {
                    return Err(failed(format!(
                        "file {} line {} matches {:?}",
                        spec.path,
                        n + 1,
                        &m.as_str()[1..]
                    )));
                }
            } else if !matched[i] && m.matches(&line) {
                matched[i] = true;
                found += 1;
                if found == spec.matches.len() {
                    return Ok(format!("{} matches", spec.path));
                }
            }
        }
    }
    match spec.matches.iter().zip(&matched).find(|(_, ok)| !**ok) {
        Some((m, _)) => Err(failed(format!(
            "file {} matched {found}/{positives} patterns; first failed: {:?}",
            spec.path,
            m.as_str()
        ))),
        None => Ok(format!("{} matches", spec.path)),
    }
}

fn lookup_name(file: &str, name: &str) -> Option<u32> {
    let text = fs::read_to_string(file).ok()?;
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.first() == Some(&name)).then(|| f.get(2)?.parse().ok())?
    })
}

/// Runs a stat check.
///
/// # Errors
/// [`Failed`]: what is wrong, in NHC's words.
pub fn check_stat(spec: &FileStatSpec, facts: &Facts) -> Result<String, Failed> {
    let failed = |m: String| Failed::new(Checked::Files(spec.paths.clone()), m);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    for p in &spec.paths {
        let m = fs::metadata(p).map_err(|e| failed(format!("stat({p}): {e}")))?;
        let fail = |what: String| Err(failed(format!("file {p:?} {what}")));
        if let Some(u) = spec.uid {
            if m.uid() != u {
                return fail(format!("UID is {}; should be {u}", m.uid()));
            }
        }
        if let Some(u) = &spec.user {
            let name = facts.user_name(m.uid());
            if &name != u {
                return fail(format!("owner is {name:?}; should be {u:?}"));
            }
        }
        if let Some(g) = spec.gid {
            if m.gid() != g {
                return fail(format!("GID is {}; should be {g}", m.gid()));
            }
        }
        if let Some(g) = &spec.group {
            if lookup_name("/etc/group", g) != Some(m.gid()) {
                return fail(format!("group is gid {}; should be {g:?}", m.gid()));
            }
        }
        let perm = m.mode() & 0o7777;
        if let Some(mode) = spec.mode_is {
            let actual = if mode > 0o7777 { m.mode() } else { perm };
            if actual != mode {
                return fail(format!("has mode {actual:04o}; should be {mode:04o}"));
            }
        }
        if let Some(mode) = spec.mode_has {
            if perm & mode != mode {
                return fail(format!(
                    "has mode {perm:04o}; should be at least {mode:04o}"
                ));
            }
        }
        if let Some(d) = spec.devno {
            if m.dev() != d {
                return fail(format!("device number is {}; should be {d}", m.dev()));
            }
        }
        let rdev = m.rdev();
        if let Some(x) = spec.major {
            if rustix::fs::major(rdev) != x {
                return fail(format!(
                    "major is {}; should be {x}",
                    rustix::fs::major(rdev)
                ));
            }
        }
        if let Some(x) = spec.minor {
            if rustix::fs::minor(rdev) != x {
                return fail(format!(
                    "minor is {}; should be {x}",
                    rustix::fs::minor(rdev)
                ));
            }
        }
        for (label, t, newer, older) in [
            ("mtime", m.mtime(), spec.mtime_newer, spec.mtime_older),
            ("ctime", m.ctime(), spec.ctime_newer, spec.ctime_older),
        ] {
            if let Some(s) = newer {
                if t < now - s as i64 {
                    return fail(format!("{label} is not newer than {s}s"));
                }
            }
            if let Some(s) = older {
                if t >= now - s as i64 {
                    return fail(format!("{label} is not older than {s}s"));
                }
            }
        }
    }
    Ok(spec.paths.join(" "))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::health::facts::Host;

    /// The key check passes on a private key of a size the plugin takes and fails, naming
    /// the file, on one that others may read, one too short, a folder and a missing one.
    #[test]
    fn the_key_check_names_what_is_wrong() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("munge.key");
        fs::write(&key, [7u8; 64]).unwrap();
        fs::set_permissions(&key, fs::Permissions::from_mode(0o400)).unwrap();
        let passwd = dir.path().join("passwd");
        let me = nix::unistd::getuid().as_raw();
        fs::write(&passwd, format!("me:x:{me}:{me}::/:/bin/sh\n")).unwrap();
        let facts = Facts::new(Host {
            passwd,
            ..Host::default()
        });
        let spec = |path: &Path| KeySpec {
            path: path.display().to_string(),
            plugin: "auth/munge",
            owner: "me".into(),
            min: 32,
            max: 1024,
        };
        let ok = check_key(&spec(&key), &facts).unwrap();
        assert!(ok.contains("64 bytes, mode 0400, owner me"), "{ok}");
        let other = KeySpec {
            owner: "munge".into(),
            ..spec(&key)
        };
        let e = check_key(&other, &facts).unwrap_err().to_string();
        assert!(e.ends_with("is owned by me, not munge"), "{e}");
        // An owner /etc/passwd does not name is not judged.
        let unnamed = Facts::new(Host {
            passwd: dir.path().join("no-passwd"),
            ..Host::default()
        });
        check_key(&other, &unnamed).unwrap();
        fs::set_permissions(&key, fs::Permissions::from_mode(0o604)).unwrap();
        let e = check_key(&spec(&key), &facts).unwrap_err().to_string();
        assert!(e.contains("mode 0604: other users may read"), "{e}");
        fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).unwrap();
        fs::write(&key, [7u8; 8]).unwrap();
        let e = check_key(&spec(&key), &facts).unwrap_err().to_string();
        assert!(
            e.contains("holds 8 bytes; auth/munge takes 32 to 1024"),
            "{e}"
        );
        let e = check_key(&spec(dir.path()), &facts)
            .unwrap_err()
            .to_string();
        assert!(e.ends_with("is not a regular file"), "{e}");
        let e = check_key(&spec(&dir.path().join("absent")), &facts)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("auth/munge key ") && e.contains("absent"),
            "{e}"
        );
    }

    #[test]
    fn test_operators() {
        let ok = |ops: &str, paths: &[&str], negate| {
            check_test(&FileTestSpec {
                ops: ops.chars().collect(),
                negate,
                paths: paths.iter().map(|s| s.to_string()).collect(),
            })
        };
        ok("rwxdk", &["/tmp"], false).unwrap();
        ok("crw", &["/dev/null", "/dev/zero"], false).unwrap();
        ok("rs", &["/etc/passwd"], false).unwrap();
        assert!(ok("d", &["/etc/passwd"], false).is_err());
        assert!(ok("e", &["/no/such"], false).is_err());
        ok("e", &["/no/such"], true).unwrap();
        assert!(ok("e", &["/tmp"], true).is_err());
        // NHC's -!: passes when any test fails, fails only when all hold.
        ok("fd", &["/tmp"], true).unwrap();
        ok("e", &["/tmp", "/no/such"], true).unwrap();
        assert!(ok("ed", &["/tmp", "/var/tmp"], true)
            .unwrap_err()
            .to_string()
            .contains("every test is true"));
        // Globs expand.
        ok("c", &["/dev/nul?"], false).unwrap();
        assert_eq!(expand_glob("/dev/nul[l]"), vec!["/dev/null".to_string()]);
        assert_eq!(expand_glob("/no/such*"), vec!["/no/such*".to_string()]);
    }

    #[test]
    fn contents_positive_and_negative() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        fs::write(&p, "ID=debian\nVERSION_ID=\"12\"\n").unwrap();
        let spec = |exprs: &[&str]| FileContentsSpec {
            path: p.to_string_lossy().into_owned(),
            matches: exprs.iter().map(|e| Matcher::parse(e).unwrap()).collect(),
        };
        check_contents(&spec(&["ID=debian"])).unwrap();
        check_contents(&spec(&["ID=debian", "/VERSION_ID=.12/"])).unwrap();
        check_contents(&spec(&["ID=debian", "!ID=rhel"])).unwrap();
        let e = check_contents(&spec(&["ID=rhel"])).unwrap_err().to_string();
        assert!(e.contains("ID=rhel"), "{e}");
        let e = check_contents(&spec(&["!/debian/"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 1"), "{e}");
    }

    #[test]
    fn stat_owner_and_mode() {
        let f = Facts::new(Host::default());
        let spec = FileStatSpec {
            paths: vec!["/tmp".into()],
            uid: Some(0),
            user: Some("root".into()),
            mode_is: Some(0o1777),
            mode_has: Some(0o1000),
            ..FileStatSpec::default()
        };
        check_stat(&spec, &f).unwrap();
        let wrong = FileStatSpec {
            mode_is: Some(0o755),
            ..spec.clone()
        };
        assert!(check_stat(&wrong, &f)
            .unwrap_err()
            .to_string()
            .contains("1777"));
        let null = FileStatSpec {
            paths: vec!["/dev/null".into()],
            major: Some(1),
            minor: Some(3),
            ..FileStatSpec::default()
        };
        check_stat(&null, &f).unwrap();
    }
}
