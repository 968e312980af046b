//! ICMP echo (NHC's `check_net_ping`, which runs `ping -q -n -c COUNT -w DEADLINE -t TTL
//! TARGET` and passes when ping exits 0), over an ICMP socket instead of the `ping`
//! program: a datagram ("ping") socket where `net.ipv4.ping_group_range` allows it, a raw
//! socket otherwise (root).
//!
//! ping's rule for its exit status is kept: with a deadline, COUNT replies must arrive
//! before it; without one, one reply is enough, waiting up to `-W` (10 s) after the last
//! request.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::fd::OwnedFd;
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketType};

use crate::health::checks::{Checked, Failed};

/// One target's echo test, with ping's options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PingSpec {
    /// Host name or address.
    pub target: String,
    /// `-c`: echo requests to send (NHC: 1).
    pub count: u32,
    /// `-w`: the whole exchange's limit (NHC: 1 s); `None`: no limit.
    pub deadline: Option<Duration>,
    /// `-W`: how long to wait for a reply after the last request (ping: 10 s).
    pub wait: Duration,
    /// `-i`: between requests (ping: 1 s).
    pub interval: Duration,
    /// `-s`: payload bytes (ping: 56).
    pub size: usize,
    /// `-t`: IP time to live (NHC: 2).
    pub ttl: Option<u32>,
    /// `-I ADDRESS`: the source address to send from.
    pub source: Option<IpAddr>,
    /// `-I INTERFACE`: the interface to send through (`SO_BINDTODEVICE`).
    pub device: Option<String>,
}

fn checksum(b: &[u8]) -> u16 {
    let mut sum = 0u32;
    for c in b.chunks(2) {
        let w = u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]);
        sum += u32::from(w);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Why no echo request could be sent: each variant names the target, address, interface
/// or socket option concerned.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PingError {
    /// The target name does not resolve.
    #[error("{target}: unknown host: {source}")]
    UnknownHost {
        /// The target.
        target: String,
        /// The resolver's error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The target name resolves to no address.
    #[error("{target}: no address")]
    NoAddress {
        /// The target.
        target: String,
    },
    /// Neither a datagram nor a raw ICMP socket could be opened.
    #[error("no ICMP socket: datagram: {datagram}; raw: {raw}")]
    NoSocket {
        /// Why not a datagram socket.
        datagram: rustix::io::Errno,
        /// Why not a raw socket.
        raw: rustix::io::Errno,
    },
    /// The TTL (hop limit) could not be set.
    #[error("setting TTL {ttl}: {source}")]
    Ttl {
        /// The TTL.
        ttl: u32,
        /// Why.
        #[source]
        source: rustix::io::Errno,
    },
    /// The socket could not be bound to the interface (`-I dev`).
    #[error("binding to interface {device}: {source}")]
    BindDevice {
        /// The interface.
        device: String,
        /// Why.
        #[source]
        source: nix::Error,
    },
    /// The socket could not be bound to the source address (`-I addr`).
    #[error("binding to {address}: {source}")]
    BindAddress {
        /// The address.
        address: IpAddr,
        /// Why.
        #[source]
        source: rustix::io::Errno,
    },
    /// The receive timeout could not be set.
    #[error("socket timeout: {source}")]
    Timeout {
        /// Why.
        #[source]
        source: rustix::io::Errno,
    },
}

fn open(v6: bool) -> Result<(OwnedFd, bool), PingError> {
    let (fam, proto) = if v6 {
        (AddressFamily::INET6, rustix::net::ipproto::ICMPV6)
    } else {
        (AddressFamily::INET, rustix::net::ipproto::ICMP)
    };
    match rustix::net::socket(fam, SocketType::DGRAM, Some(proto)) {
        Ok(fd) => Ok((fd, false)),
        Err(dgram) => rustix::net::socket(fam, SocketType::RAW, Some(proto))
            .map(|fd| (fd, true))
            .map_err(|raw| PingError::NoSocket {
                datagram: dgram,
                raw,
            }),
    }
}

/// Sends the echo requests and counts the replies.
///
/// # Errors
/// [`PingError`]: the target could not be resolved or no ICMP socket could be opened; no
/// reply is `Ok(0)`-like: the check decides.
pub fn echo(spec: &PingSpec) -> Result<(u32, u32), PingError> {
    let addr = (spec.target.as_str(), 0)
        .to_socket_addrs()
        .map_err(|e| PingError::UnknownHost {
            target: spec.target.clone(),
            source: Arc::new(e),
        })?
        .next()
        .ok_or_else(|| PingError::NoAddress {
            target: spec.target.clone(),
        })?;
    let v6 = addr.is_ipv6();
    let (fd, raw) = open(v6)?;
    if let Some(ttl) = spec.ttl {
        let r = if v6 {
            rustix::net::sockopt::set_ipv6_unicast_hops(&fd, u8::try_from(ttl).ok())
        } else {
            rustix::net::sockopt::set_ip_ttl(&fd, ttl)
        };
        r.map_err(|source| PingError::Ttl { ttl, source })?;
    }
    if let Some(dev) = &spec.device {
        nix::sys::socket::setsockopt(
            &fd,
            nix::sys::socket::sockopt::BindToDevice,
            &std::ffi::OsString::from(dev),
        )
        .map_err(|source| PingError::BindDevice {
            device: dev.clone(),
            source,
        })?;
    }
    if let Some(src) = spec.source {
        rustix::net::bind(&fd, &SocketAddr::new(src, 0)).map_err(|source| {
            PingError::BindAddress {
                address: src,
                source,
            }
        })?;
    }
    // Our identifier (a raw socket sees every echo reply of the host); a datagram socket
    // gets its own from the kernel and only its replies.
    let id = (std::process::id() as u16) ^ 0x5a5a;
    let (req, rep) = if v6 { (128u8, 129u8) } else { (8u8, 0u8) };
    let start = Instant::now();
    let end = spec.deadline.map(|d| start + d);
    let mut sent = 0u32;
    let mut got = vec![false; spec.count as usize];
    let mut next_send = start;
    let mut last_sent = start;
    let mut buf = vec![0u8; 65536];
    loop {
        let now = Instant::now();
        if end.is_some_and(|e| now >= e) {
            break;
        }
        let received = got.iter().filter(|g| **g).count() as u32;
        if received == spec.count {
            break;
        }
        if sent < spec.count && now >= next_send {
            let mut pkt = vec![0u8; 8 + spec.size];
            pkt[0] = req;
            pkt[4..6].copy_from_slice(&id.to_be_bytes());
            pkt[6..8].copy_from_slice(&(sent as u16).to_be_bytes());
            for (i, b) in pkt[8..].iter_mut().enumerate() {
                *b = i as u8;
            }
            if !v6 {
                let c = checksum(&pkt);
                pkt[2..4].copy_from_slice(&c.to_be_bytes());
            }
            // A send error (no route...) is a lost request, as for ping.
            let _ = rustix::net::sendto(&fd, &pkt, SendFlags::empty(), &addr);
            sent += 1;
            last_sent = Instant::now();
            next_send = last_sent + spec.interval;
        }
        if sent == spec.count && end.is_none() && now >= last_sent + spec.wait {
            break;
        }
        // Wait for a reply until the next thing to do.
        let mut until = if sent < spec.count {
            next_send
        } else {
            last_sent + spec.wait
        };
        if let Some(e) = end {
            until = until.min(e);
        }
        let wait = until
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        rustix::net::sockopt::set_socket_timeout(
            &fd,
            rustix::net::sockopt::Timeout::Recv,
            Some(wait),
        )
        .map_err(|source| PingError::Timeout { source })?;
        let Ok((n, _, _)) = rustix::net::recvfrom(&fd, &mut buf[..], RecvFlags::empty()) else {
            continue;
        };
        let mut p = &buf[..n.min(buf.len())];
        if raw && !v6 {
            // A raw IPv4 socket returns the IP header too.
            let ihl = usize::from(p.first().copied().unwrap_or(0) & 0x0f) * 4;
            p = p.get(ihl..).unwrap_or(&[]);
        }
        if p.len() < 8 || p[0] != rep {
            continue;
        }
        if raw && u16::from_be_bytes([p[4], p[5]]) != id {
            continue;
        }
        let seq = usize::from(u16::from_be_bytes([p[6], p[7]]));
        if let Some(g) = got.get_mut(seq) {
            *g = true;
        }
    }
    Ok((sent, got.iter().filter(|g| **g).count() as u32))
}

/// Runs one target's echo test with ping's exit rule.
///
/// # Errors
/// NHC's message `check_net_ping: No response received from TARGET`, with the counts.
pub fn check_ping(spec: &PingSpec) -> Result<String, Failed> {
    let fail = |why: String| {
        Err(Failed::new(
            Checked::Host(spec.target.clone()),
            format!(
                "check_net_ping: No response received from {} ({why})",
                spec.target
            ),
        ))
    };
    match echo(spec) {
        Err(e) => fail(e.to_string()),
        Ok((sent, got)) => {
            let ok = if spec.deadline.is_some() {
                got >= spec.count
            } else {
                got > 0
            };
            if ok {
                Ok(format!("{}: {got} of {sent} echo replies", spec.target))
            } else {
                fail(format!("{got} of {sent} echo replies"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn icmp_checksum() {
        // Echo request, id 1, seq 1, no payload: 0x0800 + 0x0001 + 0x0001 -> !0x0802.
        assert_eq!(checksum(&[8, 0, 0, 0, 0, 1, 0, 1]), !0x0802u16);
        assert_eq!(checksum(&[0xff]), !0xff00u16);
    }
}
