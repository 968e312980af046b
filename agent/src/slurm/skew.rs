//! Version skew between this node's Slurm and its controller's (issue 23 §1): which
//! combinations Slurm accepts, how a refusal shows in what `scontrol` prints, and the
//! controller's release as `scontrol show config` reports it.
//!
//! Slurm's rule (SchedMD, "Upgrades" in the Quick Start Administrator Guide; `unpack_header`
//! in `src/common/slurm_protocol_pack.c`): a slurmctld accepts the RPCs of daemons and
//! commands of its own release and of the two releases before it (up to 24.05), three
//! from 24.11 on; never of a newer release. A slurmd newer than its controller cannot fetch
//! its configuration, so it never registers.
//!
//! Finding the refusal costs no RPC: bootstrap's one look at slurmctld's record before
//! slurmd starts ([`crate::slurm::record::look_before_start`]) is made by this node's
//! `scontrol`, of slurmd's release, and slurmctld answers or refuses it as it would
//! slurmd's configuration request ([`refusal_in`]).

use super::{Scontrol, ScontrolError, SlurmVersion};

/// How a controller's refusal of this node's protocol shows in scontrol's error text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Certainly the protocol: the controller did not answer in this release's protocol,
    /// or said the versions are incompatible. A 26.05 client against a 25.11 slurmctld
    /// reads the HTTP error that 25.11's listener answers to 26.05's message
    /// (`Insane message length`); `Incompatible versions of client and server code` is
    /// Slurm's own word for it (`SLURM_PROTOCOL_VERSION_ERROR`).
    Protocol,
    /// The protocol or the key: a slurmctld of 24.11 or older closes the connection of a
    /// newer client unanswered, and the client says `Protocol authentication error`, as
    /// it does for a key that differs.
    ProtocolOrKey,
}

/// Whether scontrol's error text (`text`: its stderr and stdout) says the controller
/// refused this node's protocol ([`Refusal`]); `None` for any other failure.
pub fn refusal_in(text: &str) -> Option<Refusal> {
    const PROTOCOL: [&str; 2] = [
        "Insane message length",
        "Incompatible versions of client and server code",
    ];
    if PROTOCOL.iter().any(|p| text.contains(p)) {
        Some(Refusal::Protocol)
    } else if text.contains("Protocol authentication error") {
        Some(Refusal::ProtocolOrKey)
    } else {
        None
    }
}

/// The refusal in a failed scontrol call ([`refusal_in`] of its output), with the line
/// that shows it.
pub fn refusal_of(e: &ScontrolError) -> Option<(Refusal, String)> {
    let ScontrolError::Failed { stderr, stdout, .. } = e else {
        return None;
    };
    let text = format!("{stderr}\n{stdout}");
    let refusal = refusal_in(&text)?;
    let line = text
        .lines()
        .find(|l| refusal_in(l).is_some())
        .unwrap_or_default()
        .trim()
        .to_string();
    Some((refusal, line))
}

/// Slurm's major releases in order, up to 24.11; from 24.05 on there is one each May
/// (`YY.05`) and November (`YY.11`). Slurm's protocol window counts releases, not years.
const RELEASES: [(u32, u32); 12] = [
    (17, 2),
    (17, 11),
    (18, 8),
    (19, 5),
    (20, 2),
    (20, 11),
    (21, 8),
    (22, 5),
    (23, 2),
    (23, 11),
    (24, 5),
    (24, 11),
];

impl SlurmVersion {
    /// The release's place in Slurm's sequence of major releases (17.02 is 0, 24.11 is 11,
    /// 25.05 is 12, 26.05 is 14); `None` for a release Slurm never made (e.g. 24.08) or
    /// one before 17.02.
    pub fn release_index(self) -> Option<u32> {
        if self.major >= 25 {
            return match self.minor {
                5 => Some(12 + (self.major - 25) * 2),
                11 => Some(13 + (self.major - 25) * 2),
                _ => None,
            };
        }
        RELEASES
            .iter()
            .position(|&r| r == (self.major, self.minor))
            .and_then(|i| u32::try_from(i).ok())
    }

    /// How many older releases a slurmctld of this release accepts: two up to 24.05, three
    /// from 24.11 (`SLURM_MIN_PROTOCOL_VERSION`).
    pub fn older_releases_accepted(self) -> u32 {
        if self.at_least(24, 11) {
            3
        } else {
            2
        }
    }

    /// Whether a slurmctld of this release (`self`) accepts a slurmd (or a client command)
    /// of release `node` ([`Acceptance`]).
    pub fn accepts(self, node: SlurmVersion) -> Acceptance {
        let (Some(c), Some(n)) = (self.release_index(), node.release_index()) else {
            return Acceptance::Unknown;
        };
        if n > c {
            Acceptance::NodeNewer
        } else if c - n > self.older_releases_accepted() {
            Acceptance::NodeTooOld
        } else {
            Acceptance::Accepted
        }
    }
}

/// What a controller makes of a node's release ([`SlurmVersion::accepts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acceptance {
    /// Its own release or one it still accepts.
    Accepted,
    /// A release newer than the controller's: refused.
    NodeNewer,
    /// More releases older than the controller accepts: refused.
    NodeTooOld,
    /// A release this table does not know.
    Unknown,
}

impl Acceptance {
    /// Whether Slurm refuses the combination.
    pub fn refused(self) -> bool {
        matches!(self, Acceptance::NodeNewer | Acceptance::NodeTooOld)
    }

    /// Words for `status` and errors: `accepted`, `refused: ...`.
    pub fn describe(self, controller: SlurmVersion, node: SlurmVersion) -> String {
        match self {
            Acceptance::Accepted => "accepted".into(),
            Acceptance::NodeNewer => format!(
                "refused: slurmd {node} is newer than slurmctld {controller} (a controller never accepts a newer release)"
            ),
            Acceptance::NodeTooOld => format!(
                "refused: slurmd {node} is more than {} releases older than slurmctld {controller}",
                controller.older_releases_accepted()
            ),
            Acceptance::Unknown => format!("unknown: release {node} or {controller} not in Slurm's sequence"),
        }
    }
}

/// The controller's release as `scontrol show config` prints it (`SLURM_VERSION =
/// 25.11.6`): one `REQUEST_BUILD_INFO`. For operator commands (`status`, `config show`),
/// never for a booting node.
///
/// # Errors
/// [`ScontrolError`]; an answer without `SLURM_VERSION` is [`ScontrolError::Failed`]
/// with the answer's first line.
pub async fn controller_version(scontrol: &Scontrol) -> Result<SlurmVersion, ScontrolError> {
    let out = scontrol.run(&["show", "config"]).await?;
    parse_show_config(&out).ok_or_else(|| ScontrolError::Failed {
        program: scontrol.program.clone(),
        args: "show config".into(),
        code: 0,
        stderr: "no SLURM_VERSION in the answer".into(),
        stdout: out.lines().next().unwrap_or_default().to_string(),
    })
}

/// This node's Slurm release and its controller's, for `status` and `config show`.
#[derive(Debug)]
pub struct Releases {
    /// `slurmd -V` on this node; `None` when it cannot be run.
    pub node: Option<SlurmVersion>,
    /// The controller's (`scontrol show config`: one `REQUEST_BUILD_INFO`), or why it is
    /// not known (scontrol's error; a refusal of this node's protocol says so).
    pub controller: Result<SlurmVersion, ControllerReleaseError>,
}

/// Why the controller's release is not known ([`Releases::controller`]).
#[derive(Debug, thiserror::Error)]
pub enum ControllerReleaseError {
    /// It refuses this node's protocol ([`Refusal::Protocol`]).
    #[error("refuses the protocol of this node's release ({line}): older than {older_than}")]
    Protocol {
        /// scontrol's line that shows it.
        line: String,
        /// This node's release, `MAJOR.MINOR`.
        older_than: String,
    },
    /// It refuses this node, for its protocol or its key ([`Refusal::ProtocolOrKey`]).
    #[error(
        "refuses this node ({line}): an older release than this node's, or a key that differs"
    )]
    ProtocolOrKey {
        /// scontrol's line that shows it.
        line: String,
    },
    /// Not asked (`--no-slurm`).
    #[error("not asked (--no-slurm)")]
    NotAsked,
    /// `scontrol show config` failed otherwise.
    #[error(transparent)]
    Scontrol(#[from] ScontrolError),
}

impl Releases {
    /// Looks at both: `slurmd -V` beside `slurm.bin_dir`, and `scontrol show config`
    /// through the configured scontrol.
    pub async fn look(slurm: &super::SlurmSettings) -> Releases {
        let slurmd = super::version::slurmd_path(&slurm.bin_dir);
        let (node, controller) = futures_lite::future::zip(
            super::version::slurmd_version(&slurmd),
            controller_version(&Scontrol::configured(slurm)),
        )
        .await;
        let controller = controller.map_err(|e| match refusal_of(&e) {
            Some((Refusal::Protocol, line)) => ControllerReleaseError::Protocol {
                line,
                older_than: node.map_or_else(|| "this node's".into(), SlurmVersion::release),
            },
            Some((Refusal::ProtocolOrKey, line)) => ControllerReleaseError::ProtocolOrKey { line },
            None => ControllerReleaseError::Scontrol(e),
        });
        Releases { node, controller }
    }

    /// This node's release only; the controller is not asked.
    pub async fn look_local(slurm: &super::SlurmSettings) -> Releases {
        let slurmd = super::version::slurmd_path(&slurm.bin_dir);
        Releases {
            node: super::version::slurmd_version(&slurmd).await,
            controller: Err(ControllerReleaseError::NotAsked),
        }
    }

    /// What the controller makes of the node's release, when both are known.
    pub fn acceptance(&self) -> Option<Acceptance> {
        Some(self.controller.as_ref().ok()?.accepts(self.node?))
    }

    /// `{"node": "25.11.6", "controller": "26.05.3", "controller_error": null,
    /// "acceptance": "accepted"}`; a release not known is `null`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "node": self.node.map(|v| v.to_string()),
            "controller": self.controller.as_ref().ok().map(ToString::to_string),
            "controller_error": self.controller.as_ref().err().map(ToString::to_string),
            "acceptance": self.acceptance().zip(self.controller.as_ref().ok().zip(self.node))
                .map(|(a, (c, n))| a.describe(*c, n)),
        })
    }
}

/// `SLURM_VERSION = 25.11.6` in `scontrol show config`'s output.
pub fn parse_show_config(out: &str) -> Option<SlurmVersion> {
    out.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == "SLURM_VERSION")
            .then(|| SlurmVersion::parse(v.trim()))
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn v(s: &str) -> SlurmVersion {
        SlurmVersion::parse(s).unwrap()
    }

    #[test]
    fn releases_are_counted_in_slurms_sequence() {
        assert_eq!(v("17.02.1").release_index(), Some(0));
        assert_eq!(v("23.11.4").release_index(), Some(9));
        assert_eq!(v("24.11.7").release_index(), Some(11));
        assert_eq!(v("25.05.0").release_index(), Some(12));
        assert_eq!(v("25.11.6").release_index(), Some(13));
        assert_eq!(v("26.05.3").release_index(), Some(14));
        assert_eq!(v("27.11.0").release_index(), Some(17));
        assert_eq!(v("24.08.0").release_index(), None);
        assert_eq!(v("26.02.0").release_index(), None);
    }

    #[test]
    fn a_controller_accepts_its_release_and_older_ones_within_its_window() {
        // The pairs seen on this machine with SchedMD's builds (24.11.7, 25.11.6, 26.05.3).
        assert_eq!(v("26.05.3").accepts(v("25.11.6")), Acceptance::Accepted);
        assert_eq!(v("26.05.3").accepts(v("24.11.7")), Acceptance::Accepted);
        assert_eq!(v("25.11.6").accepts(v("26.05.3")), Acceptance::NodeNewer);
        assert_eq!(v("24.11.7").accepts(v("25.11.6")), Acceptance::NodeNewer);
        assert_eq!(v("25.11.6").accepts(v("25.11.0")), Acceptance::Accepted);
        // Three older from 24.11: 26.05 takes 24.11 (three back), not 24.05 (four).
        assert_eq!(v("26.05.0").accepts(v("24.05.8")), Acceptance::NodeTooOld);
        assert_eq!(v("24.11.0").accepts(v("23.02.7")), Acceptance::Accepted);
        assert_eq!(v("24.11.0").accepts(v("22.05.8")), Acceptance::NodeTooOld);
        // Two older up to 24.05: 24.05 takes 23.02, not 22.05.
        assert_eq!(v("24.05.8").accepts(v("23.02.7")), Acceptance::Accepted);
        assert_eq!(v("24.05.8").accepts(v("22.05.8")), Acceptance::NodeTooOld);
        assert_eq!(v("24.08.0").accepts(v("24.05.8")), Acceptance::Unknown);
        assert!(Acceptance::NodeNewer.refused() && !Acceptance::Unknown.refused());
        let words = Acceptance::NodeNewer.describe(v("25.11.6"), v("26.05.3"));
        assert!(
            words.contains("26.05.3") && words.contains("25.11.6"),
            "{words}"
        );
    }

    #[test]
    fn refusals_are_told_from_what_scontrol_prints() {
        // Captured on this machine: scontrol 26.05.3 against slurmctld 25.11.6, with and
        // without a configuration on the node; 25.11.6 and 26.05.3 against 24.11.7.
        assert_eq!(
            refusal_in("slurm_load_node error: Insane message length"),
            Some(Refusal::Protocol)
        );
        assert_eq!(
            refusal_in(
                "scontrol: error: _fetch_child: failed to fetch remote configs: Insane message length\n\
                 scontrol: fatal: Could not establish a configuration source"
            ),
            Some(Refusal::Protocol)
        );
        assert_eq!(
            refusal_in("slurm_load_node error: Protocol authentication error"),
            Some(Refusal::ProtocolOrKey)
        );
        assert_eq!(refusal_in("Node x not found"), None);
        assert_eq!(
            refusal_in(
                "slurm_load_node error: Unable to contact slurm controller (connect failure)"
            ),
            None
        );
        let e = ScontrolError::Failed {
            program: "scontrol".into(),
            args: "show node -o n1".into(),
            code: 1,
            stderr: "scontrol: error: x\nslurm_load_node error: Insane message length".into(),
            stdout: String::new(),
        };
        assert_eq!(
            refusal_of(&e),
            Some((
                Refusal::Protocol,
                "slurm_load_node error: Insane message length".into()
            ))
        );
    }

    #[test]
    fn show_config_gives_the_controllers_release() {
        let out = "Configuration data as of 2026-12-03T21:36:54\nAccountingStorageBackupHost = (null)\n\
                   SLURM_CONF              = /etc/slurm/slurm.conf\nSLURM_VERSION           = 26.05.3\n";
        assert_eq!(parse_show_config(out), Some(v("26.05.3")));
        assert_eq!(parse_show_config("SLURM_CONF = /x\n"), None);
    }
}
