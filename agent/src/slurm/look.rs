//! The client configuration of bootstrap's one look at slurmctld before slurmd starts
//! (issue 25 §2: one `REQUEST_CONFIG` per booting node, slurmd's own).
//!
//! On a configless node that slurmd has not yet configured, every Slurm client command
//! first fetches the whole configuration from slurmctld (`REQUEST_CONFIG`, the largest
//! answer slurmctld gives) before doing what it was asked; slurmd fetches it again when it
//! starts. The look at this node's record needs none of it: a client reaches slurmctld with
//! its address and port, and authenticates with the auth plugin (the same defaults that a
//! configless slurmd must assume before its fetch: munged's default socket, or the
//! auth/slurm key named by `SLURM_SACK_KEY`). So when the controllers are given
//! (`slurm.conf_servers`), the look reads a slurm.conf of those few lines ([`text`],
//! slurm.conf(5)) written by the agent, and slurmctld answers one `REQUEST_NODE_INFO`.
//!
//! A controller found only through DNS SRV (`_slurmctld._tcp`) has no address the agent
//! knows: the look then fetches as before. A look through this file that fails for any
//! other reason than slurmctld's own answer (a refusal of the protocol or key, or no
//! contact at all) is made again the configless way ([`crate::slurm::record`]): a site
//! whose controller needs more (e.g. `TLSType`) pays the fetch, never a wrong answer.

use std::path::{Path, PathBuf};

use crate::fsutil::WriteError;

/// The `ClusterName` written: slurm.conf(5) requires one, and `scontrol show node` does
/// not compare it with the controller's.
pub const CLUSTER_NAME: &str = "slurm-node-agent-look";

/// The file's name in `agent.state_dir`.
pub const FILE_NAME: &str = "slurmctld-look.conf";

/// slurmctld's default port (`SlurmctldPort`, slurm.conf(5)).
const DEFAULT_PORT: u16 = 6817;

/// The client configuration for [`crate::slurm::Scontrol`]: a slurm.conf (`SLURM_CONF`) and,
/// with auth/slurm, the key (`SLURM_SACK_KEY`, read by Slurm 23.11+'s auth/slurm before
/// `<sysconfdir>/slurm.key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookConf {
    /// The slurm.conf written by [`write`].
    pub conf: PathBuf,
    /// The auth/slurm key file; `None` for auth/munge.
    pub sack_key: Option<PathBuf>,
}

/// The slurm.conf text for `servers` (`host[:port]`, as `slurm.conf_servers` and slurmd's
/// `--conf-server` take them) and `auth_type` (`auth/munge` or `auth/slurm`):
/// `ClusterName`, one `SlurmctldHost` per server in order (the first is the primary, as
/// slurmctld's list), `SlurmctldPort`, `AuthType`.
///
/// `None` when slurm.conf cannot say it: no server; servers on different ports (slurm.conf
/// has one `SlurmctldPort`); a port that is not a number; an IPv6 literal or a host with
/// other characters than letters, digits, `.`, `-` and `_`.
pub fn text(servers: &[String], auth_type: &str) -> Option<String> {
    let mut hosts = Vec::new();
    let mut port = None;
    for s in servers {
        let (host, p) = match s.rsplit_once(':') {
            Some((h, p)) => (h, p.parse::<u16>().ok().filter(|p| *p > 0)?),
            None => (s.as_str(), DEFAULT_PORT),
        };
        let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
        if host.is_empty() || !host.chars().all(plain) {
            return None;
        }
        if port.is_some_and(|q| q != p) {
            return None;
        }
        port = Some(p);
        hosts.push(host);
    }
    let port = port?;
    let mut t = format!(
        "# Written by slurm-node-agent for its look at slurmctld before slurmd starts.\n\
         # Not this cluster's configuration: slurmd fetches that (configless).\n\
         ClusterName={CLUSTER_NAME}\n"
    );
    for h in hosts {
        t.push_str(&format!("SlurmctldHost={h}\n"));
    }
    t.push_str(&format!("SlurmctldPort={port}\nAuthType={auth_type}\n"));
    Some(t)
}

/// Writes [`text`] to `dir/`[`FILE_NAME`] (atomically, mode 0644; unchanged text is not
/// rewritten) and returns the configuration to look with; `Ok(None)` when [`text`] is
/// `None`. `sack_key`: the auth/slurm key file, `None` for auth/munge.
///
/// # Errors
/// [`WriteError`] naming the file.
pub fn write(
    dir: &Path,
    servers: &[String],
    auth_type: &str,
    sack_key: Option<&Path>,
) -> Result<Option<LookConf>, WriteError> {
    let Some(text) = text(servers, auth_type) else {
        return Ok(None);
    };
    let conf = dir.join(FILE_NAME);
    if std::fs::read_to_string(&conf).ok().as_deref() != Some(text.as_str()) {
        crate::fsutil::write_atomic(&conf, text.as_bytes(), 0o644, None)?;
    }
    Ok(Some(LookConf {
        conf,
        sack_key: sack_key.map(Path::to_path_buf),
    }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn servers_become_slurmctld_hosts_on_one_port() {
        let t = text(&s(&["10.0.0.10:6820", "ctl-b:6820"]), "auth/slurm").unwrap();
        assert_eq!(
            t.lines()
                .filter(|l| !l.starts_with('#'))
                .collect::<Vec<_>>(),
            [
                "ClusterName=slurm-node-agent-look",
                "SlurmctldHost=10.0.0.10",
                "SlurmctldHost=ctl-b",
                "SlurmctldPort=6820",
                "AuthType=auth/slurm",
            ]
        );
        let t = text(&s(&["ctl"]), "auth/munge").unwrap();
        assert!(t.contains("SlurmctldHost=ctl\nSlurmctldPort=6817\n"), "{t}");
    }

    #[test]
    fn what_slurm_conf_cannot_say_gives_none() {
        for bad in [
            &[][..],
            &["a:6817", "b:6818"],
            &["a:x"],
            &["a:0"],
            &["[fe80::1]:6817"],
            &["a\nAuthType=auth/none"],
            &["a b"],
            &[":6817"],
        ] {
            assert_eq!(text(&s(bad), "auth/munge"), None, "{bad:?}");
        }
        // Two servers on the default port, one written out.
        assert!(text(&s(&["a", "b:6817"]), "auth/munge").is_some());
    }

    #[test]
    fn written_once_and_kept_when_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let key = Path::new("/etc/slurm/slurm.key");
        let l = write(dir.path(), &s(&["ctl:6817"]), "auth/slurm", Some(key))
            .unwrap()
            .unwrap();
        assert_eq!(l.conf, dir.path().join(FILE_NAME));
        assert_eq!(l.sack_key.as_deref(), Some(key));
        let before = std::fs::metadata(&l.conf).unwrap().modified().unwrap();
        let again = write(dir.path(), &s(&["ctl:6817"]), "auth/slurm", Some(key)).unwrap();
        assert_eq!(again.as_ref(), Some(&l));
        assert_eq!(
            std::fs::metadata(&l.conf).unwrap().modified().unwrap(),
            before
        );
        assert_eq!(write(dir.path(), &[], "auth/slurm", None).unwrap(), None);
    }
}
