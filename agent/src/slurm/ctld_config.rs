//! What the agent reads of the controller's own configuration: `scontrol show config`
//! (one `REQUEST_BUILD_INFO` to slurmctld), e.g. `SlurmctldTimeout`, the time a backup
//! controller waits before it takes over (slurm.conf(5)).

use std::time::Duration;

use super::node::{Scontrol, ScontrolError};

/// The controller's `SlurmctldTimeout` (`scontrol show config`).
///
/// # Errors
/// [`ScontrolError`]; an answer without a `SlurmctldTimeout` line it can read is
/// [`ScontrolError::Failed`] naming it.
pub async fn slurmctld_timeout(scontrol: &Scontrol) -> Result<Duration, ScontrolError> {
    let out = scontrol.run(&["show", "config"]).await?;
    parse_slurmctld_timeout(&out).ok_or_else(|| ScontrolError::Failed {
        program: scontrol.program.clone(),
        args: "show config".into(),
        code: 0,
        stderr: "no SlurmctldTimeout in seconds in the answer".into(),
        stdout: out.lines().next().unwrap_or_default().to_string(),
    })
}

/// `SlurmctldTimeout = 120 sec` in `scontrol show config`'s output.
pub fn parse_slurmctld_timeout(out: &str) -> Option<Duration> {
    out.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        if k.trim() != "SlurmctldTimeout" {
            return None;
        }
        let n = v.trim().strip_suffix("sec").unwrap_or(v.trim()).trim();
        n.parse::<u64>().ok().map(Duration::from_secs)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurmctld_timeout_is_read_in_seconds() {
        let out = "SlurmctldPort           = 6817\nSlurmctldTimeout        = 120 sec\nSlurmdTimeout           = 300 sec\n";
        assert_eq!(parse_slurmctld_timeout(out), Some(Duration::from_secs(120)));
        assert_eq!(
            parse_slurmctld_timeout("SlurmctldTimeout = 7\n"),
            Some(Duration::from_secs(7))
        );
        assert_eq!(parse_slurmctld_timeout("SlurmctldTimeout = soon\n"), None);
        assert_eq!(parse_slurmctld_timeout("SlurmdTimeout = 300 sec\n"), None);
    }
}
