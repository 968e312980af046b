//! Sockets (NHC's `check_net_socket`) from `/proc/net/{tcp,tcp6,udp,udp6,raw,raw6,unix}`
//! without running `netstat`, described with netstat's words (`-n`): protocol `tcp`,
//! `tcp6`, `udp`, `udp6`, `raw`, `raw6` or `unix`; addresses `127.0.0.1:22`,
//! `:::22`, `0.0.0.0:*` (port 0 is `*`); TCP states `LISTEN`, `ESTABLISHED`...; unix
//! types `STREAM`, `DGRAM`, `SEQPACKET` and states `LISTENING`, `CONNECTED`...; the
//! owner's user name; the daemon as the base name of the owning process's first word.
//!
//! ICMP echo (NHC's `check_net_ping`) is in [`ping`].

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;

use super::psres::{Action, Verdict};
use super::{Checked, Failed};
use crate::health::facts::Facts;
use crate::health::matcher::Matcher;

pub mod ping;

/// One socket, with netstat's words.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Socket {
    /// `tcp`, `tcp6`, `udp`, `udp6`, `raw`, `raw6`, `unix`.
    pub proto: String,
    /// Local address and port, or a unix socket's path.
    pub local: String,
    /// Remote address and port (empty for unix sockets).
    pub remote: String,
    /// State (empty when netstat shows none).
    pub state: String,
    /// Unix socket type (empty for others).
    pub kind: String,
    /// Owner's uid (unix sockets: none).
    pub uid: Option<u32>,
    /// Inode, to find the owning process.
    pub inode: u64,
}

const TCP_STATES: [&str; 12] = [
    "",
    "ESTABLISHED",
    "SYN_SENT",
    "SYN_RECV",
    "FIN_WAIT1",
    "FIN_WAIT2",
    "TIME_WAIT",
    "CLOSE",
    "CLOSE_WAIT",
    "LAST_ACK",
    "LISTEN",
    "CLOSING",
];

fn v4(hex: &str) -> Option<Ipv4Addr> {
    // The address as a native-endian u32 (little-endian on the agent's architectures).
    let n = u32::from_str_radix(hex, 16).ok()?;
    Some(Ipv4Addr::from(n.swap_bytes()))
}

fn v6(hex: &str) -> Option<Ipv6Addr> {
    if hex.len() != 32 {
        return None;
    }
    let mut b = [0u8; 16];
    for w in 0..4 {
        let n = u32::from_str_radix(&hex[w * 8..w * 8 + 8], 16).ok()?;
        b[w * 4..w * 4 + 4].copy_from_slice(&n.swap_bytes().to_be_bytes());
    }
    Some(Ipv6Addr::from(b))
}

fn addr(s: &str, six: bool) -> Option<String> {
    let (a, p) = s.split_once(':')?;
    let port = u16::from_str_radix(p, 16).ok()?;
    let ip = if six {
        v6(a)?.to_string()
    } else {
        v4(a)?.to_string()
    };
    Some(if port == 0 {
        format!("{ip}:*")
    } else {
        format!("{ip}:{port}")
    })
}

/// Parses a `/proc/net/{tcp,udp,raw}{,6}` table.
pub fn parse_inet(text: &str, proto: &str) -> Vec<Socket> {
    let six = proto.ends_with('6');
    let tcp = proto.starts_with("tcp");
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let st = usize::from_str_radix(f.get(3)?, 16).ok()?;
            let state = if tcp {
                TCP_STATES.get(st).copied().unwrap_or("UNKNOWN")
            } else if st == 1 {
                // netstat: a connected UDP or raw socket.
                "ESTABLISHED"
            } else {
                ""
            };
            Some(Socket {
                proto: proto.to_string(),
                local: addr(f.get(1)?, six)?,
                remote: addr(f.get(2)?, six)?,
                state: state.to_string(),
                kind: String::new(),
                uid: f.get(7)?.parse().ok(),
                inode: f.get(9)?.parse().ok()?,
            })
        })
        .collect()
}

/// Parses `/proc/net/unix`.
pub fn parse_unix(text: &str) -> Vec<Socket> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let flags = u32::from_str_radix(f.get(3)?, 16).ok()?;
            let kind = match *f.get(4)? {
                "0001" => "STREAM",
                "0002" => "DGRAM",
                "0003" => "RAW",
                "0004" => "RDM",
                "0005" => "SEQPACKET",
                _ => "UNKNOWN",
            };
            // __SO_ACCEPTCON: a listening socket.
            let state = if flags & 0x10000 != 0 {
                "LISTENING"
            } else {
                match *f.get(5)? {
                    "02" => "CONNECTING",
                    "03" => "CONNECTED",
                    "04" => "DISCONNECTING",
                    _ => "",
                }
            };
            Some(Socket {
                proto: "unix".into(),
                local: f.get(7).copied().unwrap_or("").to_string(),
                remote: String::new(),
                state: state.into(),
                kind: kind.into(),
                uid: None,
                inode: f.get(6)?.parse().ok()?,
            })
        })
        .collect()
}

/// None of the socket tables (`net/tcp`, `net/udp`, `net/unix`...) of a procfs could be
/// read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no socket table readable in {}/net", proc_dir.display())]
pub struct NoSocketTable {
    /// The procfs (`/proc`).
    pub proc_dir: std::path::PathBuf,
}

/// Every socket of the host.
///
/// # Errors
/// [`NoSocketTable`]: no table could be read.
pub fn sockets(proc_dir: &Path) -> Result<Vec<Socket>, NoSocketTable> {
    let mut out = Vec::new();
    let mut read_any = false;
    for proto in ["tcp", "tcp6", "udp", "udp6", "raw", "raw6"] {
        if let Ok(t) = std::fs::read_to_string(proc_dir.join("net").join(proto)) {
            read_any = true;
            out.extend(parse_inet(&t, proto));
        }
    }
    if let Ok(t) = std::fs::read_to_string(proc_dir.join("net/unix")) {
        read_any = true;
        out.extend(parse_unix(&t));
    }
    if !read_any {
        return Err(NoSocketTable {
            proc_dir: proc_dir.to_path_buf(),
        });
    }
    Ok(out)
}

/// Socket inode to (PID, daemon name) from `/proc/<pid>/fd`.
fn owners(facts: &Facts) -> HashMap<u64, (u32, String)> {
    let mut map = HashMap::new();
    let Ok(procs) = facts.procs() else {
        return map;
    };
    for p in procs {
        let dir = facts.host.proc_dir.join(format!("{}/fd", p.pid));
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        let name = p.argv0().rsplit('/').next().unwrap_or("").to_string();
        for e in rd.flatten() {
            if let Ok(t) = std::fs::read_link(e.path()) {
                let t = t.to_string_lossy();
                if let Some(ino) = t
                    .strip_prefix("socket:[")
                    .and_then(|r| r.strip_suffix(']'))
                    .and_then(|n| n.parse().ok())
                {
                    map.entry(ino).or_insert_with(|| (p.pid, name.clone()));
                }
            }
        }
    }
    // This process is not in the table (facts leave it out): its own sockets too.
    if let Ok(rd) = std::fs::read_dir(facts.host.proc_dir.join("self/fd")) {
        let me = std::process::id();
        let name = std::env::args()
            .next()
            .map(|a| a.rsplit('/').next().unwrap_or("").to_string())
            .unwrap_or_default();
        for e in rd.flatten() {
            if let Ok(t) = std::fs::read_link(e.path()) {
                if let Some(ino) = t
                    .to_string_lossy()
                    .strip_prefix("socket:[")
                    .and_then(|r| r.strip_suffix(']'))
                    .and_then(|n| n.parse().ok())
                {
                    map.entry(ino).or_insert_with(|| (me, name.clone()));
                }
            }
        }
    }
    map
}

/// NHC's `check_net_socket`: a socket matching every given expression must exist (or,
/// with `negate`, none may).
#[derive(Debug, Clone)]
pub struct SocketSpec {
    /// `-n`: a name for messages.
    pub name: Option<String>,
    /// `-p`.
    pub proto: Option<Matcher>,
    /// `-l`.
    pub local: Option<Matcher>,
    /// `-r`.
    pub remote: Option<Matcher>,
    /// `-s`.
    pub state: Option<Matcher>,
    /// `-t`.
    pub kind: Option<Matcher>,
    /// `-u`: over the owner's user name.
    pub user: Option<Matcher>,
    /// `-d`: over the owning process's name.
    pub daemon: Option<Matcher>,
    /// `-!`.
    pub negate: bool,
    /// `-a`: count every match (message only).
    pub all: bool,
    /// `-e`: run when nothing matches (no shell).
    pub missing_action: Vec<String>,
    /// `-E`: run when something matches (no shell).
    pub found_action: Vec<String>,
}

impl SocketSpec {
    fn describe(&self) -> String {
        let mut parts = Vec::new();
        for (what, m) in [
            ("protocol", &self.proto),
            ("localaddr", &self.local),
            ("remoteaddr", &self.remote),
            ("state", &self.state),
            ("type", &self.kind),
            ("user", &self.user),
            ("daemon", &self.daemon),
        ] {
            if let Some(m) = m {
                parts.push(format!("({what} =~ \"{m}\")"));
            }
        }
        parts.join(" && ")
    }
}

/// Evaluates a socket check.
///
/// # Errors
/// The socket tables could not be read.
pub fn eval_socket(spec: &SocketSpec, facts: &Facts) -> Result<Verdict, Failed> {
    let all = sockets(&facts.host.proc_dir)?;
    let owners = if spec.daemon.is_some() {
        owners(facts)
    } else {
        HashMap::new()
    };
    let hit = |m: &Option<Matcher>, v: &str| m.as_ref().is_none_or(|m| m.matches(v));
    let mut count = 0usize;
    for s in &all {
        let user = s.uid.map(|u| facts.user_name(u)).unwrap_or_default();
        let daemon = owners
            .get(&s.inode)
            .map(|(_, n)| n.as_str())
            .unwrap_or("unknown");
        if hit(&spec.proto, &s.proto)
            && hit(&spec.local, &s.local)
            && hit(&spec.remote, &s.remote)
            && hit(&spec.state, &s.state)
            && hit(&spec.kind, &s.kind)
            && hit(&spec.user, &user)
            && hit(&spec.daemon, daemon)
        {
            count += 1;
            if !spec.all {
                break;
            }
        }
    }
    let seek = spec.describe();
    let name = spec.name.as_deref().unwrap_or("matching");
    let mut actions = Vec::new();
    if count == 0 && !spec.missing_action.is_empty() {
        actions.push(Action::Run(spec.missing_action.clone()));
    } else if count > 0 && !spec.found_action.is_empty() {
        actions.push(Action::Run(spec.found_action.clone()));
    }
    let result = match (count, spec.negate) {
        (0, false) => Err(Failed::new(
            Checked::Sockets(seek.clone()),
            format!("check_net_socket: No {name} sockets found ({seek})"),
        )),
        (n, true) if n > 0 => Err(Failed::new(
            Checked::Sockets(seek.clone()),
            format!("check_net_socket: {n} {name} socket(s) found ({seek}) (NEGATED)"),
        )),
        (n, _) => Ok(format!("{n} {name} socket(s) found ({seek})")),
    };
    Ok(Verdict { result, actions })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn proc_net_tables_in_netstat_words() {
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:5140 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 6072391 1\n   1: 0100007F:8F7C 0100007F:5140 01 00000000:00000000 03:00000F32 00000000  1000        0 77 3\n";
        let s = parse_inet(tcp, "tcp");
        assert_eq!(s[0].local, "127.0.0.1:20800");
        assert_eq!(s[0].remote, "0.0.0.0:*");
        assert_eq!(s[0].state, "LISTEN");
        assert_eq!(s[0].inode, 6072391);
        assert_eq!(s[1].state, "ESTABLISHED");
        assert_eq!(s[1].uid, Some(1000));
        let tcp6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 00000000000000000000000001000000:0016 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12 1\n";
        let s = parse_inet(tcp6, "tcp6");
        assert_eq!(s[0].local, "::1:22");
        assert_eq!(s[0].remote, ":::*");
        let unix = "Num       RefCount Protocol Flags    Type St Inode Path\n0000: 00000002 00000000 00010000 0001 01 99 /run/x.sock\n0000: 00000002 00000000 00000000 0002 01 98 /run/host/notify\n";
        let s = parse_unix(unix);
        assert_eq!(
            (s[0].kind.as_str(), s[0].state.as_str()),
            ("STREAM", "LISTENING")
        );
        assert_eq!(s[0].local, "/run/x.sock");
        assert_eq!((s[1].kind.as_str(), s[1].state.as_str()), ("DGRAM", ""));
    }
}
