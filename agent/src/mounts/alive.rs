//! Liveness of a mounted file system: `statfs(2)` on a thread of its own under a timeout.
//!
//! A hung network file system (an FSx server gone, a stuck FUSE daemon) blocks `statfs`
//! in the kernel, possibly for ever. The call therefore runs on a dedicated thread that the
//! caller stops waiting for after the timeout; that thread stays blocked until the kernel
//! returns. While one is still blocked on a path, later probes of that path answer
//! [`AliveError::StillHung`] at once instead of piling up more blocked threads. (A tokio
//! `spawn_blocking` task would also work but would keep the runtime from shutting down.)

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// What `statfs` says about a live file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStats {
    /// File system magic (`f_type`), e.g. `0x01021994` for tmpfs, `0x0bd00bd0` for Lustre.
    pub magic: u64,
    /// Size in bytes.
    pub total_bytes: u64,
    /// Bytes available to unprivileged users.
    pub available_bytes: u64,
    /// Mounted read-only (`ST_RDONLY`).
    pub read_only: bool,
}

/// Why a file system is not alive.
#[derive(Debug, thiserror::Error)]
pub enum AliveError {
    /// `statfs` did not return in time: the file system hangs.
    #[error("{path}: statfs did not answer within {timeout:?} (file system hung?)")]
    Timeout {
        /// The path probed.
        path: PathBuf,
        /// The limit.
        timeout: Duration,
    },
    /// An earlier probe of this path is still blocked in the kernel.
    #[error("{path}: an earlier statfs has been blocked for {blocked_for:?} (file system hung)")]
    StillHung {
        /// The path probed.
        path: PathBuf,
        /// Since when.
        blocked_for: Duration,
    },
    /// `statfs` failed (ENOTCONN for a dead FUSE daemon, ESTALE, EIO, ENOENT...).
    #[error("{path}: statfs: {source}")]
    Io {
        /// The path probed.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

fn in_flight() -> &'static Mutex<HashMap<PathBuf, Instant>> {
    static IN_FLIGHT: OnceLock<Mutex<HashMap<PathBuf, Instant>>> = OnceLock::new();
    IN_FLIGHT.get_or_init(|| Mutex::new(HashMap::new()))
}

/// `statfs(path)` on its own thread, waiting at most `timeout`.
///
/// # Errors
/// [`AliveError`]: timeout, still hung from an earlier probe, or the OS error.
pub async fn alive(path: &Path, timeout: Duration) -> Result<FsStats, AliveError> {
    let path = path.to_path_buf();
    {
        let mut map = in_flight().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(since) = map.get(&path) {
            return Err(AliveError::StillHung {
                path,
                blocked_for: since.elapsed(),
            });
        }
        map.insert(path.clone(), Instant::now());
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let p = path.clone();
    let spawned = std::thread::Builder::new()
        .name("statfs".into())
        .spawn(move || {
            let r = rustix::fs::statfs(&p);
            in_flight()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&p);
            let _ = tx.send(r);
        });
    if let Err(source) = spawned {
        in_flight()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&path);
        return Err(AliveError::Io { path, source });
    }
    match tokio::time::timeout(timeout, rx).await {
        Err(_) => Err(AliveError::Timeout { path, timeout }),
        Ok(Err(_)) => Err(AliveError::Io {
            path,
            source: std::io::Error::other("statfs thread ended without an answer"),
        }),
        Ok(Ok(Err(e))) => Err(AliveError::Io {
            path,
            source: e.into(),
        }),
        Ok(Ok(Ok(s))) => {
            let bsize = u64::try_from(s.f_bsize).unwrap_or(0);
            Ok(FsStats {
                magic: u64::try_from(s.f_type).unwrap_or(0),
                total_bytes: s.f_blocks.saturating_mul(bsize),
                available_bytes: s.f_bavail.saturating_mul(bsize),
                read_only: u64::try_from(s.f_flags).unwrap_or(0) & 1 != 0,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn answers_for_a_live_path_and_errors_for_a_missing_one() {
        let dir = tempfile::tempdir().unwrap();
        let s = alive(dir.path(), Duration::from_secs(5)).await.unwrap();
        assert!(s.total_bytes > 0);
        let e = alive(&dir.path().join("missing"), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(e, AliveError::Io { .. }), "{e}");
        assert!(e.to_string().contains("missing"), "{e}");
    }
}
