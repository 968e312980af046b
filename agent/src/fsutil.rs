//! Crash-safe file writes: a temporary file in the same folder, fsync, rename over the
//! target, fsync the folder. A reader sees the old content or the new, never a mix, and a
//! crash at any point leaves no partial file under the target's name.
//!
//! A state file that cannot be read back anyway (truncated by a full disk, emptied, edited
//! by hand) is moved aside by [`set_aside_corrupt`], so that the commands carry on from
//! what Slurm says instead of refusing to run.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Owner to give a written file: numeric ids, as resolved by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// Error of [`write_atomic`]: the operation that failed and the path it failed on.
#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {source}")]
pub struct WriteError {
    /// What was being done ("create", "write", "fsync", "chown", "rename").
    pub op: &'static str,
    /// The path concerned.
    pub path: PathBuf,
    /// The OS error.
    #[source]
    pub source: io::Error,
}

/// Writes `contents` to `path` atomically with permission bits `mode` and, when given, the
/// owner `owner`. The folder must exist.
///
/// # Errors
/// [`WriteError`] naming the step and path; the temporary file is removed on failure.
pub fn write_atomic(
    path: &Path,
    contents: &[u8],
    mode: u32,
    owner: Option<Owner>,
) -> Result<(), WriteError> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    fn err<'a>(op: &'static str, p: &'a Path) -> impl FnOnce(io::Error) -> WriteError + 'a {
        move |source| WriteError {
            op,
            path: p.to_path_buf(),
            source,
        }
    }
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)
            .map_err(err("create", &tmp))?;
        // The umask may have narrowed `mode` at creation; set it exactly.
        file.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(err("chmod", &tmp))?;
        if let Some(o) = owner {
            std::os::unix::fs::fchown(&file, Some(o.uid), Some(o.gid))
                .map_err(err("chown", &tmp))?;
        }
        file.write_all(contents).map_err(err("write", &tmp))?;
        file.sync_all().map_err(err("fsync", &tmp))?;
        fs::rename(&tmp, path).map_err(err("rename", path))?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(err("fsync", dir))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Moves the corrupt state file `path` aside as `<name>.corrupt-<unix seconds>` (`-<n>`
/// added when that exists), if it still holds `bytes` (a concurrent writer that replaced
/// it in the meantime wins), and logs an error naming both files and `problem`. Returns
/// the new path, or `None` when nothing was moved (already replaced or moved by another
/// process, or the rename failed: logged too).
pub fn set_aside_corrupt(path: &Path, bytes: &[u8], problem: &str) -> Option<PathBuf> {
    match fs::read(path) {
        Ok(now) if now == bytes => {}
        _ => return None,
    }
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let name = path
        .file_name()
        .map_or_else(|| "state".into(), |n| n.to_string_lossy().into_owned());
    let mut aside = path.with_file_name(format!("{name}.corrupt-{secs}"));
    let mut n = 1;
    while aside.exists() {
        aside = path.with_file_name(format!("{name}.corrupt-{secs}-{n}"));
        n += 1;
    }
    match fs::rename(path, &aside) {
        Ok(()) => {
            tracing::error!(
                file = %path.display(),
                kept_as = %aside.display(),
                "CORRUPT STATE FILE: {problem}; moved aside, carrying on from what Slurm says"
            );
            Some(aside)
        }
        Err(e) => {
            tracing::error!(
                file = %path.display(),
                "CORRUPT STATE FILE: {problem}; could not move it aside ({e}); carrying on from what Slurm says"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn writes_content_mode_and_replaces_existing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("key");
        fs::write(&p, b"old").unwrap();
        write_atomic(&p, b"new contents", 0o400, None).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"new contents");
        assert_eq!(fs::metadata(&p).unwrap().mode() & 0o777, 0o400);
        // No temporary file left behind.
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn failure_names_the_path_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("missing-folder").join("key");
        let e = write_atomic(&p, b"x", 0o400, None).unwrap_err();
        assert!(e.to_string().contains("missing-folder"), "{e}");
        assert!(!p.exists());
    }
}
