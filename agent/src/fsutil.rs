//! Crash-safe, symlink-safe file writes for files the agent writes as root (the cluster
//! key, the `SLURMD_OPTIONS` file, state files, `.mount` units, markers, the Prometheus
//! textfile).
//!
//! [`write_atomic`] creates a temporary file in the target's folder with
//! `O_CREAT|O_EXCL` under an unpredictable name (`tempfile`'s `Builder`: 12 random
//! characters; `O_EXCL` refuses an existing name, so a symlink planted there is never
//! followed), writes, fsyncs, sets mode and owner through the open descriptor, renames it
//! over the target and fsyncs the folder. A reader sees the old content or the new, never a
//! mix, and a crash at any point leaves no partial file under the target's name.
//!
//! A symlink (or any other non-regular file) at the target path is **replaced**, never
//! followed: `rename(2)` replaces the link itself. So the final path is always a regular
//! file the agent wrote, whoever could write the folder before.
//!
//! Temporaries left by a killed run (`.<name>.<random>.sna-tmp`, and the older fixed
//! `.<name>.tmp.<pid>` names) are removed before the next write of the same file when
//! their writer is gone (its pid, which is part of the name, no longer runs) or they are
//! older than [`STALE_AFTER`]; removal unlinks the entry and never follows it.
//!
//! A state file that cannot be read back anyway (truncated by a full disk, emptied, edited
//! by hand) is moved aside by [`set_aside_corrupt`], so that the commands carry on from
//! what Slurm says instead of refusing to run; a command that changes nothing on disk
//! (`check --no-act`) only reports it ([`report_corrupt`]).
//!
//! Floor 0 (ground): uses no other module of the crate.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Suffix of the agent's temporary files.
const TMP_SUFFIX: &str = ".sna-tmp";

/// A temporary file older than this is stale even if a process with its pid runs (pids are
/// reused). A write takes milliseconds; an hour leaves room for a very slow disk.
pub const STALE_AFTER: Duration = Duration::from_secs(3600);

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

/// A file or folder of the agent's that could not be read, created or locked: its path
/// and the OS error. Shown as `<path>: <error>`.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub struct FileError {
    /// The file or folder.
    pub path: PathBuf,
    /// The OS error.
    #[source]
    pub source: io::Error,
}

impl FileError {
    /// A closure for `map_err` that names `path`.
    pub fn at(path: &Path) -> impl FnOnce(io::Error) -> FileError + '_ {
        move |source| FileError {
            path: path.to_path_buf(),
            source,
        }
    }
}

fn folder_and_name(path: &Path) -> (&Path, String) {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    (dir, name)
}

/// Writes `contents` to `path` atomically with permission bits `mode` and, when given, the
/// owner `owner`. The folder must exist. A symlink at `path` is replaced, not followed.
///
/// # Errors
/// [`WriteError`] naming the step and path; the temporary file is removed on failure.
pub fn write_atomic(
    path: &Path,
    contents: &[u8],
    mode: u32,
    owner: Option<Owner>,
) -> Result<(), WriteError> {
    let (dir, name) = folder_and_name(path);
    fn err<'a>(op: &'static str, p: &'a Path) -> impl FnOnce(io::Error) -> WriteError + 'a {
        move |source| WriteError {
            op,
            path: p.to_path_buf(),
            source,
        }
    }
    remove_stale_temporaries(dir, &name);
    // O_CREAT|O_EXCL with a random name: an existing entry (a planted symlink) makes
    // tempfile pick another name; it is never opened.
    let prefix = format!(".{name}.{}.", std::process::id());
    let mut tmp = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(TMP_SUFFIX)
        .rand_bytes(12)
        .permissions(fs::Permissions::from_mode(mode & 0o777 | 0o200))
        .tempfile_in(dir)
        .map_err(err("create", dir))?;
    let tmp_path = tmp.path().to_path_buf();
    {
        let file = tmp.as_file_mut();
        file.write_all(contents).map_err(err("write", &tmp_path))?;
        if let Some(o) = owner {
            std::os::unix::fs::fchown(&*file, Some(o.uid), Some(o.gid))
                .map_err(err("chown", &tmp_path))?;
        }
        // The umask may have narrowed `mode` at creation; set it exactly (after chown,
        // which clears set-id bits).
        file.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(err("chmod", &tmp_path))?;
        file.sync_all().map_err(err("fsync", &tmp_path))?;
    }
    // rename(2) replaces whatever is at `path` (a symlink included) without following it.
    // On failure the temporary file is removed when `e.file` drops.
    tmp.persist(path).map_err(|e| WriteError {
        op: "rename",
        path: path.to_path_buf(),
        source: e.error,
    })?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(err("fsync", dir))
}

/// Removes temporaries of `name` in `dir` left by a killed writer. Best effort: what cannot
/// be removed is logged and left.
fn remove_stale_temporaries(dir: &Path, name: &str) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let current = format!(".{name}.");
    let legacy = format!(".{name}.tmp.");
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(n) = file_name.to_str() else {
            continue;
        };
        // Another thread of this process may be writing its own temporary of the current
        // scheme; the legacy fixed names are never written any more.
        let (pid, is_legacy) = if let Some(rest) = n
            .strip_prefix(&current)
            .and_then(|r| r.strip_suffix(TMP_SUFFIX))
        {
            (
                rest.split('.').next().and_then(|p| p.parse::<i32>().ok()),
                false,
            )
        } else if let Some(rest) = n.strip_prefix(&legacy) {
            (rest.parse::<i32>().ok(), true)
        } else {
            continue;
        };
        let Some(pid) = pid else { continue };
        // lstat: the entry itself, never what a symlink points at.
        let old = entry
            .metadata()
            .ok()
            .and_then(|m| m.modified().ok())
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .is_some_and(|age| age > STALE_AFTER);
        let own = is_legacy && u32::try_from(pid).is_ok_and(|p| p == std::process::id());
        if own || old || !process_exists(pid) {
            let p = entry.path();
            match fs::remove_file(&p) {
                Ok(()) => tracing::info!(path = %p.display(), "removed a stale temporary file"),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(path = %p.display(), "cannot remove a stale temporary file: {e}")
                }
            }
        }
    }
}

fn process_exists(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) => true,
        Err(nix::errno::Errno::ESRCH) => false,
        // EPERM: it exists, owned by someone else.
        Err(_) => true,
    }
}

/// Reads `path` if it is a regular file, without following a symlink and without blocking
/// on a FIFO: `Ok(None)` when it does not exist or is not a regular file (a symlink, a
/// folder, a device), otherwise its bytes and metadata. Reads at most `limit` bytes; a
/// larger file is `Ok(None)` too (it is not what the agent wrote).
///
/// # Errors
/// Other I/O errors.
pub fn read_regular(path: &Path, limit: u64) -> io::Result<Option<(Vec<u8>, fs::Metadata)>> {
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc_flags())
        .open(path)
    {
        Ok(f) => f,
        Err(e)
            if e.kind() == io::ErrorKind::NotFound
                || e.raw_os_error() == Some(nix::errno::Errno::ELOOP as i32)
                || e.raw_os_error() == Some(nix::errno::Errno::ENXIO as i32) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    if !meta.file_type().is_file() || meta.size() > limit {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(usize::try_from(meta.size()).unwrap_or(0));
    file.take(limit + 1).read_to_end(&mut out)?;
    if out.len() as u64 > limit {
        return Ok(None);
    }
    Ok(Some((out, meta)))
}

fn libc_flags() -> i32 {
    (nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK).bits()
}

/// An exclusive `flock(2)` lock, held until this value drops (or the process dies: the
/// kernel releases it, so a killed holder never leaves a stale lock). The one
/// implementation of the agent's lock files (bootstrap's, `drain.lock`): taken with
/// [`lock_exclusive`] in async code that may wait long, or [`lock_exclusive_blocking`]
/// around a short read-modify-write.
#[derive(Debug)]
pub struct FileLock {
    _file: File,
}

impl FileLock {
    /// Opens `path` (created 0600 if missing, never through a symlink planted at its name)
    /// for [`FileLock::try_take`].
    fn open(path: &Path) -> io::Result<File> {
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
            .open(path)
    }

    /// One non-blocking try on `file`: `Ok(Err(file))` while another process holds it.
    fn try_take(file: File) -> io::Result<Result<FileLock, File>> {
        use rustix::fs::{flock, FlockOperation};
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Ok(FileLock { _file: file })),
            Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR) => Ok(Err(file)),
            Err(e) => Err(e.into()),
        }
    }
}

/// Takes an exclusive lock on `path` (created 0600 if missing, never through a symlink),
/// waiting up to `wait`; `on_wait` runs once when the lock is busy at first try. Returns
/// `Ok(None)` when it is still busy after `wait`.
///
/// # Errors
/// The OS error of opening or locking the file.
pub async fn lock_exclusive(
    path: &Path,
    wait: Duration,
    on_wait: impl FnOnce(),
) -> io::Result<Option<FileLock>> {
    let mut file = FileLock::open(path)?;
    let start = std::time::Instant::now();
    let mut on_wait = Some(on_wait);
    loop {
        file = match FileLock::try_take(file)? {
            Ok(lock) => return Ok(Some(lock)),
            Err(file) => file,
        };
        if let Some(f) = on_wait.take() {
            f();
        }
        if start.elapsed() >= wait {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// [`lock_exclusive`] for a lock held only around a short read-modify-write (`drain.lock`):
/// tries every `poll`, sleeping the thread in between, for at most `wait`. `Ok(None)` when
/// it is still busy after `wait`.
///
/// # Errors
/// The OS error of opening or locking the file.
pub fn lock_exclusive_blocking(
    path: &Path,
    wait: Duration,
    poll: Duration,
) -> io::Result<Option<FileLock>> {
    let mut file = FileLock::open(path)?;
    let start = std::time::Instant::now();
    loop {
        file = match FileLock::try_take(file)? {
            Ok(lock) => return Ok(Some(lock)),
            Err(file) => file,
        };
        if start.elapsed() >= wait {
            return Ok(None);
        }
        std::thread::sleep(poll);
    }
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

/// Reports the corrupt state file `path` without touching it (a command that changes
/// nothing on disk, `check --no-act`): an error in the log naming the file and `problem`,
/// as [`set_aside_corrupt`] logs it.
pub fn report_corrupt(path: &Path, problem: &str) {
    tracing::error!(
        file = %path.display(),
        "CORRUPT STATE FILE: {problem}; left in place (nothing is changed on disk), carrying on without it"
    );
}

/// Test support: writes `text` as an executable program at `path` (mode 0755) without this
/// process ever holding a writable descriptor of it. A test that writes a script itself
/// races with other test threads forking: a child that inherited the open descriptor until
/// its own exec makes `exec` of the script fail with ETXTBSY ("Text file busy"). So the
/// text goes to `<path>.src` and `install` (another process) writes the program.
///
/// # Panics
/// When either write fails (tests only).
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) fn write_test_program(path: &Path, text: &str) {
    let src = path.with_extension("src");
    std::fs::write(&src, text).unwrap();
    let status = std::process::Command::new("install")
        .args(["-m", "0755"])
        .arg(&src)
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success(), "install {} failed", path.display());
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

    #[test]
    fn a_symlink_at_the_target_is_replaced_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, b"precious").unwrap();
        let p = dir.path().join("munge.key");
        std::os::unix::fs::symlink(&victim, &p).unwrap();
        write_atomic(&p, b"secret", 0o400, None).unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
        let meta = fs::symlink_metadata(&p).unwrap();
        assert!(meta.file_type().is_file(), "{meta:?}");
        assert_eq!(fs::read(&p).unwrap(), b"secret");
    }

    #[test]
    fn planted_symlinks_at_temporary_names_are_never_followed_and_stale_ones_go() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, b"precious").unwrap();
        let p = dir.path().join("munge.key");
        // The old, predictable name for this process, and a leftover of a dead writer
        // (pid 0 never names a process) in the current scheme.
        let legacy = dir
            .path()
            .join(format!(".munge.key.tmp.{}", std::process::id()));
        std::os::unix::fs::symlink(&victim, &legacy).unwrap();
        let stale = dir
            .path()
            .join(format!(".munge.key.0.abcdefabcdef{TMP_SUFFIX}"));
        fs::write(&stale, b"half a key").unwrap();
        // Someone else's file that merely looks similar is left alone.
        let other = dir.path().join(".munge.key.notes");
        fs::write(&other, b"x").unwrap();
        write_atomic(&p, b"secret", 0o400, None).unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
        assert!(fs::symlink_metadata(&legacy).is_err(), "legacy temp kept");
        assert!(fs::symlink_metadata(&stale).is_err(), "stale temp kept");
        assert!(other.exists());
        let mut names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, [".munge.key.notes", "munge.key", "victim"]);
    }

    #[test]
    fn a_live_writers_temporary_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        // pid 1 runs; its fresh temporary may be in use.
        let live = dir.path().join(format!(".f.1.abcdefabcdef{TMP_SUFFIX}"));
        fs::write(&live, b"").unwrap();
        write_atomic(&dir.path().join("f"), b"x", 0o644, None).unwrap();
        assert!(live.exists());
    }

    #[tokio::test]
    async fn a_second_lock_waits_for_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bootstrap.lock");
        let first = lock_exclusive(&p, Duration::ZERO, || {}).await.unwrap();
        assert!(first.is_some());
        let mut told = false;
        let second = lock_exclusive(&p, Duration::from_millis(300), || told = true)
            .await
            .unwrap();
        assert!(second.is_none(), "two holders at once");
        assert!(told, "the wait was not announced");
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            drop(first);
        });
        let third = lock_exclusive(&p, Duration::from_secs(60), || {})
            .await
            .unwrap();
        assert!(third.is_some());
        release.await.unwrap();
    }

    #[test]
    fn read_regular_refuses_symlinks_and_fifos() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        fs::write(&f, b"abc").unwrap();
        assert_eq!(read_regular(&f, 10).unwrap().unwrap().0, b"abc");
        assert!(read_regular(&f, 2).unwrap().is_none());
        let l = dir.path().join("l");
        std::os::unix::fs::symlink(&f, &l).unwrap();
        assert!(read_regular(&l, 10).unwrap().is_none());
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(read_regular(&fifo, 10).unwrap().is_none());
        assert!(read_regular(&dir.path().join("none"), 10)
            .unwrap()
            .is_none());
    }
}
