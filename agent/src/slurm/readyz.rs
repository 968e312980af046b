//! slurmd's readiness probe (Slurm 25.11+): `GET /readyz` on slurmd's own port.
//!
//! From 25.11 slurmd answers HTTP on the port it takes RPCs on (`SlurmdPort`, 6818 by
//! default), unless `CommunicationParameters=disable_http` or its HTTP parser plugin is
//! missing (`src/common/http_switch.c`). `/readyz` answers `204 No Content` once slurmd's
//! listener and connection manager are no longer quiesced, else `500`
//! (`src/slurmd/slurmd/http.c`, `_req_readyz`). slurmd unquiesces its listener right after
//! it has started its registration with slurmctld, and only after it has fetched its
//! configuration and run the `HealthCheckProgram` once (`slurmd.c`, `_slurmd_init` and
//! `main`): a connection made before that waits in the listen backlog and is answered
//! then. So "ready" means "slurmd has sent its registration", which only slurmctld can
//! confirm, but until then a look at slurmctld cannot find the node registered: bootstrap
//! waits here first, at no cost to slurmctld, instead of asking slurmctld every few
//! milliseconds while slurmd runs its start-up health check.

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

/// slurmd's port when slurm.conf sets no `SlurmdPort` (slurm.conf(5)).
pub const DEFAULT_SLURMD_PORT: u16 = 6818;

/// Why a probe got no HTTP status from slurmd.
#[derive(Debug, thiserror::Error)]
pub enum ReadyzError {
    /// Nothing listens there yet (slurmd has not created its socket) or the address is
    /// not slurmd's: `connect` failed.
    #[error("connecting to slurmd at {addr}: {source}")]
    Connect {
        /// The address probed.
        addr: SocketAddr,
        /// The error of `connect(2)`.
        #[source]
        source: std::io::Error,
    },
    /// slurmd took the connection but gave no HTTP answer: HTTP is off on this slurmd
    /// (`CommunicationParameters=disable_http`, no HTTP parser plugin, or TLS), or it is
    /// older than 25.11.
    #[error("slurmd at {addr} gave no HTTP answer to GET /readyz: {source}")]
    NotHttp {
        /// The address probed.
        addr: SocketAddr,
        /// hyper's error.
        #[source]
        source: hyper::Error,
    },
    /// The request could not be built (an address that is no valid `Host` header).
    #[error("building GET /readyz for slurmd at {addr}: {source}")]
    Request {
        /// The address probed.
        addr: SocketAddr,
        /// The HTTP library's error.
        #[source]
        source: hyper::http::Error,
    },
    /// No answer within the probe's timeout (a listener still quiesced keeps the
    /// connection in its backlog unanswered).
    #[error("slurmd at {addr} did not answer GET /readyz within {timeout:?}")]
    Timeout {
        /// The address probed.
        addr: SocketAddr,
        /// The probe's timeout.
        timeout: Duration,
    },
}

/// One `GET /readyz` to slurmd at `addr`, at most `timeout`: `Ok(true)` for a 2xx status
/// (servicing RPCs), `Ok(false)` for any other status (not yet).
///
/// # Errors
/// [`ReadyzError`]: no connection, no HTTP answer, or none in time.
pub async fn probe(addr: SocketAddr, timeout: Duration) -> Result<bool, ReadyzError> {
    let once = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|source| ReadyzError::Connect { addr, source })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|source| ReadyzError::NotHttp { addr, source })?;
        // The connection's driver ends with the exchange (or the error below says why).
        let driver = tokio::spawn(conn);
        let request = hyper::Request::get("/readyz")
            .header(hyper::header::HOST, addr.to_string())
            .header(hyper::header::CONNECTION, "close")
            .body(Empty::<Bytes>::new())
            .map_err(|source| ReadyzError::Request { addr, source })?;
        let answer = sender.send_request(request).await;
        driver.abort();
        let response = answer.map_err(|source| ReadyzError::NotHttp { addr, source })?;
        Ok(response.status().is_success())
    };
    match tokio::time::timeout(timeout, once).await {
        Ok(r) => r,
        Err(_) => Err(ReadyzError::Timeout { addr, timeout }),
    }
}

/// Where something accepts TCP connections on `port` in this network namespace, as the
/// kernel lists listening sockets (`/proc/net/tcp`, then `/proc/net/tcp6`): the bound
/// address, an unspecified one (`0.0.0.0`, `::`) given as loopback. slurmd binds every
/// address by default and only its node's address with `CommunicationParameters=
/// NoInAddrAny` (slurm.conf(5)), so this is where to reach it. `None` while nothing listens
/// there (slurmd has not created its socket yet) or when `/proc/net` cannot be read.
pub fn listening_address(port: u16) -> Option<SocketAddr> {
    use procfs::net::TcpState;
    let v4 = procfs::net::tcp().ok().into_iter().flatten();
    let v6 = procfs::net::tcp6().ok().into_iter().flatten();
    v4.chain(v6)
        .find(|e| e.state == TcpState::Listen && e.local_address.port() == port)
        .map(|e| {
            let a = e.local_address;
            match a.ip() {
                std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
                    SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port))
                }
                std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
                    SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port))
                }
                _ => a,
            }
        })
}

/// slurmd's port as `slurm.conf` text sets it (`SlurmdPort=`), else
/// [`DEFAULT_SLURMD_PORT`]. A value that is not a port number counts as unset.
pub fn slurmd_port(slurm_conf: &str) -> u16 {
    super::conf_value(slurm_conf, "SlurmdPort")
        .and_then(|v| v.parse().ok())
        .filter(|p| *p != 0)
        .unwrap_or(DEFAULT_SLURMD_PORT)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A one-connection server that reads a request and writes `answer`.
    async fn serve_once(answer: &'static [u8]) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 1024];
            let n = s.read(&mut buf).await.unwrap();
            assert!(
                buf[..n].starts_with(b"GET /readyz HTTP/1.1\r\n"),
                "{}",
                String::from_utf8_lossy(&buf[..n])
            );
            s.write_all(answer).await.unwrap();
            s.shutdown().await.unwrap();
        });
        addr
    }

    #[tokio::test]
    async fn no_content_is_ready_and_a_server_error_is_not_yet() {
        let t = Duration::from_secs(5);
        let ok = serve_once(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n").await;
        assert!(probe(ok, t).await.unwrap());
        let not_yet = serve_once(
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(!probe(not_yet, t).await.unwrap());
    }

    #[tokio::test]
    async fn a_slurmd_without_http_nothing_listening_and_silence_are_errors() {
        let t = Duration::from_millis(500);
        // slurmd before 25.11 (or with HTTP off) reads the request as an RPC and closes.
        let rpc = serve_once(b"\x00\x00\x00\x10not http at all").await;
        assert!(matches!(
            probe(rpc, t).await,
            Err(ReadyzError::NotHttp { .. })
        ));
        // A port nobody listens on (bound, then closed).
        let gone = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let e = probe(gone, t).await.unwrap_err();
        assert!(matches!(e, ReadyzError::Connect { .. }), "{e}");
        assert!(e.to_string().contains(&gone.to_string()), "{e}");
        // A listener that never answers (a quiesced slurmd's backlog).
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let e = probe(silent.local_addr().unwrap(), t).await.unwrap_err();
        assert!(matches!(e, ReadyzError::Timeout { .. }), "{e}");
    }

    #[test]
    fn a_listener_is_found_by_its_port_at_the_address_it_bound() {
        let any = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        let port = any.local_addr().unwrap().port();
        assert_eq!(
            listening_address(port),
            Some(SocketAddr::from(([127, 0, 0, 1], port)))
        );
        let one = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
        let at = one.local_addr().unwrap();
        assert_eq!(listening_address(at.port()), Some(at));
        drop(one);
        assert_eq!(listening_address(at.port()), None);
    }

    #[test]
    fn the_port_comes_from_slurm_conf_else_6818() {
        assert_eq!(slurmd_port("ClusterName=c\nSlurmdPort=7000\n"), 7000);
        assert_eq!(slurmd_port("slurmdport=7001 # site\n"), 7001);
        assert_eq!(slurmd_port("ClusterName=c\n"), 6818);
        assert_eq!(slurmd_port("SlurmdPort=none\n"), 6818);
        assert_eq!(slurmd_port("SlurmdPort=0\n"), 6818);
    }
}
