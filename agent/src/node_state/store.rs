//! Persistence of the [`DrainState`]: `drain.json` under `agent.state_dir`, written with
//! [`write_atomic`], and `drain.lock`, an advisory `flock(2)` lock that the daemon and the
//! one-shot commands take around each read-modify-write, so that they can run at the same
//! time (SSM Run Command while `run` is active) without losing an update.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::state::DrainState;
use crate::fsutil::write_atomic;

/// State file name.
pub const STATE_FILE: &str = "drain.json";
/// Lock file name.
pub const LOCK_FILE: &str = "drain.lock";

/// Errors of the store, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Reading or creating a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// The state file is not valid JSON of the expected shape.
    #[error("{path}: invalid drain state: {message}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// serde's message with line and column.
        message: String,
    },
    /// Writing failed.
    #[error(transparent)]
    Write(#[from] crate::fsutil::WriteError),
    /// Another process held the lock for the whole wait.
    #[error("{path}: still locked by another slurm-node-agent after {waited:?}")]
    Busy {
        /// The lock file.
        path: PathBuf,
        /// How long it waited.
        waited: Duration,
    },
}

/// The state folder.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

/// A held lock; released on drop (closing the file releases a `flock`).
pub type Lock = crate::fsutil::FileLock;

impl Store {
    /// A store in `dir` (`agent.state_dir`).
    pub fn new(dir: &Path) -> Store {
        Store {
            dir: dir.to_path_buf(),
        }
    }

    /// Path of the state file.
    pub fn path(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }

    /// Takes the lock, trying every 20 ms for at most `wait`
    /// ([`crate::fsutil::lock_exclusive_blocking`]).
    ///
    /// # Errors
    /// [`StoreError::Busy`] or [`StoreError::Io`].
    pub fn lock(&self, wait: Duration) -> Result<Lock, StoreError> {
        let path = self.dir.join(LOCK_FILE);
        std::fs::create_dir_all(&self.dir).map_err(|source| StoreError::Io {
            path: self.dir.clone(),
            source,
        })?;
        let start = Instant::now();
        match crate::fsutil::lock_exclusive_blocking(&path, wait, Duration::from_millis(20)) {
            Ok(Some(lock)) => Ok(lock),
            Ok(None) => Err(StoreError::Busy {
                path,
                waited: start.elapsed(),
            }),
            Err(source) => Err(StoreError::Io { path, source }),
        }
    }

    /// [`Store::lock`] for async code: tries every 20 ms for at most `wait`, sleeping the
    /// task (not the thread) in between, so that a holder on the same runtime (the daemon's
    /// health, mounts and drain work share two threads; a one-shot command has one) runs
    /// on and lets it go.
    ///
    /// # Errors
    /// [`StoreError::Busy`] or [`StoreError::Io`].
    pub async fn lock_async(&self, wait: Duration) -> Result<Lock, StoreError> {
        let start = Instant::now();
        loop {
            match self.lock(Duration::ZERO) {
                Err(StoreError::Busy { path, .. }) => {
                    let waited = start.elapsed();
                    if waited >= wait {
                        return Err(StoreError::Busy { path, waited });
                    }
                    tokio::time::sleep((wait - waited).min(Duration::from_millis(20))).await;
                }
                r => return r,
            }
        }
    }

    /// Reads the state; a missing file is the default (active) state. A file that is not
    /// valid state (empty, truncated, edited) is moved aside as `drain.json.corrupt-<unix
    /// seconds>` with an error in the log, and the default state is returned: the commands
    /// and the daemon carry on from what Slurm shows rather than stop.
    ///
    /// # Errors
    /// [`StoreError::Io`] when the file cannot be read.
    pub fn load(&self) -> Result<DrainState, StoreError> {
        let path = self.path();
        match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice(&bytes) {
                Ok(st) => Ok(st),
                Err(e) => {
                    let problem = if bytes.iter().all(u8::is_ascii_whitespace) {
                        "empty drain state".to_string()
                    } else {
                        format!("invalid drain state: {e}")
                    };
                    crate::fsutil::set_aside_corrupt(&path, &bytes, &problem);
                    Ok(DrainState::default())
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(DrainState::default()),
            Err(source) => Err(StoreError::Io { path, source }),
        }
    }

    /// Writes the state atomically (mode 0644: `status` may be run by anyone).
    ///
    /// # Errors
    /// [`StoreError`].
    pub fn save(&self, state: &DrainState) -> Result<(), StoreError> {
        std::fs::create_dir_all(&self.dir).map_err(|source| StoreError::Io {
            path: self.dir.clone(),
            source,
        })?;
        let mut json = serde_json::to_vec_pretty(state).map_err(|e| StoreError::Corrupt {
            path: self.path(),
            message: e.to_string(),
        })?;
        json.push(b'\n');
        write_atomic(&self.path(), &json, 0o644, None)?;
        Ok(())
    }

    /// Moves the state file aside as `drain.json.<label>-<unix seconds>` (a number added
    /// when that name is taken), keeping its content for people; the next [`Store::load`]
    /// finds the default (active) state. `None` when there was no file.
    ///
    /// # Errors
    /// [`StoreError::Io`] when the file cannot be renamed.
    pub fn set_aside(&self, label: &str) -> Result<Option<PathBuf>, StoreError> {
        let path = self.path();
        if !path.exists() {
            return Ok(None);
        }
        let secs = crate::time::now();
        let mut aside = self.dir.join(format!("{STATE_FILE}.{label}-{secs}"));
        let mut n = 1;
        while aside.exists() {
            aside = self.dir.join(format!("{STATE_FILE}.{label}-{secs}-{n}"));
            n += 1;
        }
        std::fs::rename(&path, &aside).map_err(|source| StoreError::Io {
            path: path.clone(),
            source,
        })?;
        Ok(Some(aside))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::node_state::state::{Cause, Phase};

    #[test]
    fn saves_loads_and_reports_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(&dir.path().join("sub"));
        assert_eq!(store.load().unwrap().phase, Phase::Active);
        let mut s = DrainState::default();
        s.begin(Cause::Manual { reason: "x".into() }, None, 1);
        store.save(&s).unwrap();
        assert_eq!(store.load().unwrap(), s);
        // Truncated, then empty: set aside (content kept), the default state carries on.
        for bad in [&b"{\"phase\": \"draini"[..], b""] {
            std::fs::write(store.path(), bad).unwrap();
            assert_eq!(store.load().unwrap(), DrainState::default());
            assert!(!store.path().exists());
            let aside: Vec<_> = std::fs::read_dir(dir.path().join("sub"))
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.to_string_lossy().contains("drain.json.corrupt-"))
                .collect();
            assert!(
                aside.iter().any(|p| std::fs::read(p).unwrap() == bad),
                "{aside:?}"
            );
            store.save(&s).unwrap();
            assert_eq!(store.load().unwrap(), s);
        }
    }

    #[test]
    fn second_lock_waits_then_gives_up() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let held = store.lock(Duration::ZERO).unwrap();
        let e = store.lock(Duration::from_millis(60)).unwrap_err();
        assert!(matches!(e, StoreError::Busy { .. }), "{e}");
        drop(held);
        store.lock(Duration::ZERO).unwrap();
    }

    /// The async wait lets the holder, a task of the same one-thread runtime, go on and
    /// release the lock (a thread's sleep would hold it up for the whole wait).
    #[tokio::test(flavor = "current_thread")]
    async fn the_async_wait_lets_a_holder_on_the_same_thread_finish() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let held = store.lock(Duration::ZERO).unwrap();
        let holder = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(held);
        });
        let start = Instant::now();
        store.lock_async(Duration::from_secs(5)).await.unwrap();
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
        holder.await.unwrap();
        let _held = store.lock(Duration::ZERO).unwrap();
        let e = store
            .lock_async(Duration::from_millis(60))
            .await
            .unwrap_err();
        assert!(matches!(e, StoreError::Busy { .. }), "{e}");
    }
}
