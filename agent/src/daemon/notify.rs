//! A minimal sd_notify(3): datagrams to `$NOTIFY_SOCKET` (a path, or `@name` for the
//! abstract namespace), and the watchdog interval from `$WATCHDOG_USEC` /
//! `$WATCHDOG_PID`. Without `NOTIFY_SOCKET` (not started by systemd) every call is a no-op.

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// A connection to the service manager's notification socket.
#[derive(Debug)]
pub struct Notifier {
    target: Option<(UnixDatagram, SocketAddr)>,
}

impl Notifier {
    /// From `$NOTIFY_SOCKET`; errors (bad address, no socket) are logged and disable it.
    pub fn from_env() -> Notifier {
        let target = std::env::var_os("NOTIFY_SOCKET").and_then(|s| {
            let s = s.to_string_lossy().into_owned();
            let addr = if let Some(name) = s.strip_prefix('@') {
                use std::os::linux::net::SocketAddrExt;
                SocketAddr::from_abstract_name(name.as_bytes())
            } else {
                SocketAddr::from_pathname(&s)
            };
            match (UnixDatagram::unbound(), addr) {
                (Ok(sock), Ok(addr)) => Some((sock, addr)),
                (Err(e), _) | (_, Err(e)) => {
                    tracing::warn!(socket = %s, "NOTIFY_SOCKET unusable: {e}");
                    None
                }
            }
        });
        Notifier { target }
    }

    /// Whether a service manager listens.
    pub fn enabled(&self) -> bool {
        self.target.is_some()
    }

    /// Sends `state` (e.g. `READY=1\nSTATUS=...`); failures are logged at debug level.
    pub fn notify(&self, state: &str) {
        if let Some((sock, addr)) = &self.target {
            if let Err(e) = sock.send_to_addr(state.as_bytes(), addr) {
                tracing::debug!("sd_notify: {e}");
            }
        }
    }

    /// `READY=1` with a status line.
    pub fn ready(&self, status: &str) {
        self.notify(&format!("READY=1\nSTATUS={}", one_line(status)));
    }

    /// `STATUS=...`.
    pub fn status(&self, status: &str) {
        self.notify(&format!("STATUS={}", one_line(status)));
    }

    /// `STOPPING=1`.
    pub fn stopping(&self) {
        self.notify("STOPPING=1\nSTATUS=stopping");
    }

    /// `WATCHDOG=1`.
    pub fn watchdog(&self) {
        self.notify("WATCHDOG=1");
    }
}

fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

/// Half the watchdog interval systemd asked for (`WATCHDOG_USEC`, for this process per
/// `WATCHDOG_PID`), or `None`.
pub fn watchdog_interval() -> Option<Duration> {
    if let Some(pid) = std::env::var_os("WATCHDOG_PID") {
        if pid.to_string_lossy().parse::<u32>().ok() != Some(std::process::id()) {
            return None;
        }
    }
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn sends_datagrams_to_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let server = UnixDatagram::bind(&path).unwrap();
        let n = Notifier {
            target: Some((
                UnixDatagram::unbound().unwrap(),
                SocketAddr::from_pathname(&path).unwrap(),
            )),
        };
        n.ready("active\nwatching");
        let mut buf = [0u8; 256];
        let len = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=active watching");
        n.stopping();
        let len = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"STOPPING=1\nSTATUS=stopping");
        assert!(!Notifier { target: None }.enabled());
    }
}
