//! Slurm: the configless server list, slurmd's options file, and `scontrol` with the parsers
//! of its output.
//!
//! Formats are those of Slurm 22.05 to 25.x; parsers are tested against captured output in
//! `agent/tests/fixtures/slurm/`.

pub mod node;
pub mod options;

pub use node::{NodeInfo, ReadyScontrol, Scontrol, ScontrolError};
pub use options::{slurmd_args, write_slurmd_options, OptionsFileError};

use std::fmt;

/// Default slurmctld port (slurm.conf `SlurmctldPort`).
pub const DEFAULT_SLURMCTLD_PORT: u16 = 6817;

/// A configless server for `slurmd --conf-server host[:port]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfServer {
    /// Host name, IPv4 address, or IPv6 address (without brackets).
    pub host: String,
    /// Port, when given.
    pub port: Option<u16>,
}

impl ConfServer {
    /// Parses `host`, `host:port`, `[v6addr]` or `[v6addr]:port`. Host names are ASCII
    /// letters, digits, `-` and `.` (RFC 1123).
    ///
    /// # Errors
    /// A message saying what is wrong.
    pub fn parse(s: &str) -> Result<ConfServer, String> {
        let bad = |why: &str| Err(format!("invalid server {s:?}: {why}; expected host[:port]"));
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let Some((h, after)) = rest.split_once(']') else {
                return bad("unclosed '['");
            };
            if h.parse::<std::net::Ipv6Addr>().is_err() {
                return bad("not an IPv6 address in brackets");
            }
            match after {
                "" => (h, None),
                p => match p.strip_prefix(':') {
                    Some(p) => (h, Some(p)),
                    None => return bad("junk after ']'"),
                },
            }
        } else {
            match s.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (s, None),
            }
        };
        let is_v6 = host.contains(':');
        if !is_v6 {
            let label_ok = |l: &str| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            };
            if host.is_empty() || host.len() > 253 || !host.split('.').all(label_ok) {
                return bad("host must be a DNS name or an IP address");
            }
        }
        let port = match port {
            None => None,
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 => Some(n),
                _ => return bad("port must be 1 to 65535"),
            },
        };
        Ok(ConfServer {
            host: host.to_string(),
            port,
        })
    }
}

impl fmt::Display for ConfServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        match self.port {
            Some(p) => write!(f, "{host}:{p}"),
            None => f.write_str(&host),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_servers() {
        let c = ConfServer::parse("ctl.example.com:6817").unwrap();
        assert_eq!((c.host.as_str(), c.port), ("ctl.example.com", Some(6817)));
        assert_eq!(ConfServer::parse("10.0.0.5").unwrap().port, None);
        assert_eq!(
            ConfServer::parse("[fd00::1]:7000").unwrap().to_string(),
            "[fd00::1]:7000"
        );
    }

    #[test]
    fn rejects_bad_servers() {
        for bad in [
            "",
            "a b",
            "host:0",
            "host:99999",
            "host:x",
            "ctl;reboot",
            "ctl\n",
            "ctl,evil",
            "höst",
            "-x",
            "[::1",
            "[zz]:1",
            "a=b",
            "$(id)",
        ] {
            assert!(ConfServer::parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
