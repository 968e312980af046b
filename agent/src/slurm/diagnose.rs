//! Why slurmd has not registered, as far as this node can see: systemd's start limit, a
//! controller that does not answer (which address), a name that does not resolve, no
//! `_slurmctld._tcp` SRV record to use, authentication refused. Bootstrap's join names it
//! in its error at the deadline.

use std::time::Duration;

use super::{ConfServer, SlurmSettings};
use crate::systemd::ServiceInfo;

/// Says, as far as the agent can see, why slurmd has not registered: systemd's start
/// limit, a controller that does not answer (which address), a name that does not
/// resolve, no `_slurmctld._tcp` SRV record to use, authentication refused.
pub async fn why_not_registered(
    slurm: &SlurmSettings,
    svc: Option<&ServiceInfo>,
    seen: &str,
) -> String {
    let mut why = Vec::new();
    let unit = &slurm.slurmd_unit;
    if let Some(svc) = svc {
        if svc.result == "start-limit-hit" {
            why.push(format!(
                "systemd start limit hit for {unit} (StartLimitBurst): systemd refuses to start it until `systemctl reset-failed {unit}`"
            ));
        }
    }
    let low = seen.to_ascii_lowercase();
    if low.contains("authentication") || low.contains("credential") {
        why.push(
            "authentication refused: the cluster key differs from the controller's".to_string(),
        );
    }
    if slurm.conf_servers.is_empty() {
        why.push(
            "slurm.conf_servers is empty, so slurmd needs the DNS SRV record _slurmctld._tcp: \
             none gave it a controller"
                .to_string(),
        );
    }
    for (server, addr) in conf_server_addrs(slurm) {
        let probe = async {
            let addrs: Vec<_> = match tokio::net::lookup_host(&addr).await {
                Ok(a) => a.collect(),
                Err(e) => return Some(format!("name {} not resolvable: {e}", server.host)),
            };
            let mut last = None;
            for a in addrs {
                match tokio::net::TcpStream::connect(a).await {
                    Ok(_) => return None,
                    Err(e) => last = Some(e.to_string()),
                }
            }
            Some(format!(
                "controller unreachable at {addr}: {}",
                last.unwrap_or_else(|| "no address".into())
            ))
        };
        match tokio::time::timeout(Duration::from_secs(3), probe).await {
            Ok(Some(m)) => why.push(m),
            Ok(None) => {}
            Err(_) => why.push(format!("controller unreachable at {addr}: no answer in 3s")),
        }
    }
    why.join("; ")
}

/// Each valid `slurm.conf_servers` entry with the `host:port` (`[v6]:port`) to connect to,
/// slurmctld's default port where the entry names none.
fn conf_server_addrs(slurm: &SlurmSettings) -> impl Iterator<Item = (ConfServer, String)> + '_ {
    slurm
        .conf_servers
        .iter()
        .filter_map(|c| ConfServer::parse(c).ok())
        .map(|server| {
            let port = server.port.unwrap_or(super::DEFAULT_SLURMCTLD_PORT);
            let addr = if server.host.contains(':') {
                format!("[{}]:{port}", server.host)
            } else {
                format!("{}:{port}", server.host)
            };
            (server, addr)
        })
}

/// The first configless server (`slurm.conf_servers`) that accepts a TCP connection within
/// a second, as `host:port`; `None` when none does or none is set (DNS SRV).
pub async fn controller_accepting(slurm: &SlurmSettings) -> Option<String> {
    for (_, addr) in conf_server_addrs(slurm) {
        let connect = tokio::net::TcpStream::connect(addr.clone());
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), connect).await {
            return Some(addr);
        }
    }
    None
}

/// The controller as the settings name it, for an error when none accepted a connection:
/// `slurm.conf_servers` (`10.0.0.5:6817`), or the DNS SRV record when that is empty.
pub fn controller_words(slurm: &SlurmSettings) -> String {
    if slurm.conf_servers.is_empty() {
        "the controller of the DNS SRV record _slurmctld._tcp".to_string()
    } else {
        slurm.conf_servers.join(",")
    }
}
