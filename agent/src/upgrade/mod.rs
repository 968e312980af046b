//! Rolling image upgrades: the desired image of this node's group is an SSM parameter
//! (published by the image builder); when it differs from the running image the node
//! drains, waits until no job runs, and performs `upgrade.action`.
//!
//! A budget bounds the disruption exactly, with slurmctld as the referee: before draining,
//! the node takes one of `upgrade.max_unavailable` slots of its partition, a Slurm
//! reservation under a fixed name that only one node can create (the rollout's budget). It holds the
//! slot from its upgrade drain until the node of that name is back in service on the new
//! image (the replacement, or the node itself after a reboot or hook, releases it; a
//! replacement under another NodeName releases one slot of a holder that is gone), so at
//! no moment are more nodes out of service for the upgrade than the budget: draining,
//! powered off, or replaced and still booting. A node that finds every slot held waits
//! (`upgrade.budget_wait`, with jitter) and tries again; a slot whose holder died ends at
//! its reservation's end, `upgrade.slot_timeout` after the holder last renewed it.
//!
//! An upgrade drain never kills a job: the action only runs in `drained`, i.e. when Slurm
//! shows no job on the node; a slot's reservation lets running jobs run to their end.
//!
//! Upgrades finish:
//! - the desired image must exist and be `available` (EC2 DescribeImages) before any node
//!   drains for it; a value naming a missing image drains nothing and is logged each
//!   interval;
//! - the agent rewrites the reason to `... powered off for image upgrade A -> B` just before
//!   it powers off (optionally deleting its dynamic record, `upgrade.delete_node_record`),
//!   so that a replacement that reuses the NodeName sees what happened;
//! - a replacement that still runs another image than the one a previous incarnation of the
//!   same NodeName powered off for, or any instance launched after the desired image was
//!   published that still runs another one ([`launched_after_publication`], under any
//!   NodeName), was not launched from the parameter: it does not power off (a replacement
//!   would run the same image again); it stays drained with a reason saying so and holds a
//!   slot, so the rollout stops after the budget (the rollout's check,
//!   `rollout::check`).
//!
//! The actions themselves (poweroff, reboot, hook) are [`action`]'s; the drain engine runs
//! them. The `[upgrade]` settings section ([`UpgradeSettings`]) is this module's.
//!
//! Floor 5 (subsystems): over `node_state`, through which its actions change the node;
//! below `drain`, which runs them.

pub mod action;

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::section::{HumanDuration, InvalidKey};

/// What to do once the node is drained for an upgrade.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum UpgradeAction {
    /// Orderly OS shutdown: systemd starts `upgrade.poweroff_unit` (`poweroff.target`)
    /// over D-Bus; the fleet (Auto Scaling, Slurm's power saving) launches a replacement
    /// from the new image.
    #[default]
    Poweroff,
    /// `scontrol reboot ASAP nextstate=resume reason=... <node>`: Slurm runs its
    /// `RebootProgram`; for in-place updates.
    Reboot,
    /// Run `upgrade.hook` (argv, no shell), with `SNA_NODE`, `SNA_CURRENT_IMAGE` and
    /// `SNA_DESIRED_IMAGE` in its environment; exit 0 is success.
    Hook,
    /// Stay drained (an operator or another system takes it from there).
    None,
}

/// `[upgrade]`: rolling image upgrades.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpgradeSettings {
    /// SSM parameter holding the desired AMI id. Empty: upgrades are off.
    pub parameter: String,
    /// How often a node reads it in a small cluster: a published image reaches the first
    /// node within 1.2 times this. A larger cluster reads it less often (`fleet_rate`).
    /// Each wait is the node's interval times a random factor of 0.8 to 1.2, the first a
    /// random part of the first interval, so that nodes launched at once spread out and
    /// stay spread. During a rollout (a budget slot held) a node's first read comes at its
    /// daemon's start, and a replacement up to date but not yet in service reads again at
    /// `drain.check_interval`: its first read in service ends its predecessor's slot.
    pub interval: HumanDuration,
    /// Reads of the parameter (SSM GetParameter) a second the whole cluster may make:
    /// each node reads it every `interval`, or every `nodes / fleet_rate` seconds when that
    /// is longer, `nodes` being an upper bound of the cluster's size from the slurm.conf
    /// the node reads (its `NodeName` lines, or `MaxNodeCount` when larger; without one,
    /// `interval`). The default 4 is a tenth of SSM Parameter Store's standard quota (40
    /// transactions a second for GetParameter, GetParameters and GetParametersByPath
    /// together, per account and region), leaving the rest to the site's own tools: at
    /// 10,000 nodes each reads every 41 min 40 s, and the first of them sees a new image
    /// within seconds.
    pub fleet_rate: f64,
    /// `poweroff`, `reboot`, `hook` or `none`.
    pub action: UpgradeAction,
    /// Unit started for `poweroff` (`poweroff.target`; systemd's bus is `systemd.bus`).
    pub poweroff_unit: String,
    /// Command for `hook`: program (absolute path) and arguments.
    pub hook: Vec<String>,
    /// Limit for the hook.
    pub hook_timeout: HumanDuration,
    /// After a successful hook, resume the node and record the desired image as applied.
    pub resume_after_hook: bool,
    /// At most this many nodes (`2`) or this share (`10%`, at least one node) of the
    /// partition out of service for an upgrade at once, each from its upgrade drain until
    /// its replacement is available on the new image: the number of slots, Slurm
    /// reservations named `slurm-node-agent-upgrade-<partition>-slot-<k>`.
    pub max_unavailable: String,
    /// Partition the budget counts. Empty: the node's first partition.
    pub budget_partition: String,
    /// Wait before trying the slots again when every one is held (randomized ±50 %). A try
    /// is one read of slurmctld's reservations (the full check only once a slot is free);
    /// the daemon waits the cluster's size over 50 instead when that is longer, so that
    /// the waiting nodes together read them at most about 100 times a second.
    pub budget_wait: HumanDuration,
    /// How long a slot outlives its holder's last renewal: a draining node renews its slot
    /// every third of this; after the poweroff, the replacement must be available within
    /// it, or the slot ends (on slurmctld's clock) and another node may start. Whole
    /// minutes (a reservation's unit), at least 2 minutes.
    pub slot_timeout: HumanDuration,
    /// Before `poweroff`, delete this node's record from slurmctld (`scontrol delete
    /// nodename=`) when it is a dynamic node with no job. Off by default: a replacement
    /// that reuses the NodeName then cannot see that a previous instance already powered
    /// off for the same image; and slurmctld refuses to delete a record that a reservation
    /// names, such as the node's own budget slot (logged; the record stays, marked powered
    /// off). Off, a replacement under another NodeName deletes its predecessor's dynamic
    /// record as it releases that node's slot.
    pub delete_node_record: bool,
}

impl Default for UpgradeSettings {
    fn default() -> Self {
        UpgradeSettings {
            parameter: String::new(),
            interval: HumanDuration(Duration::from_secs(600)),
            fleet_rate: 4.0,
            action: UpgradeAction::Poweroff,
            poweroff_unit: "poweroff.target".into(),
            hook: Vec::new(),
            hook_timeout: HumanDuration(Duration::from_secs(1800)),
            resume_after_hook: true,
            max_unavailable: "1".into(),
            budget_partition: String::new(),
            budget_wait: HumanDuration(Duration::from_secs(60)),
            slot_timeout: HumanDuration(Duration::from_secs(1800)),
            delete_node_record: false,
        }
    }
}

/// The parameter to watch and the budget are the launch template's; what runs (unit, hook)
/// is the image's.
impl crate::section::Classified for UpgradeSettings {
    const SECTION: &'static str = "upgrade";
    const TRUST: &'static [crate::section::KeyTrust] = {
        use crate::section::KeyTrust as K;
        &[
            K::user_data("parameter"),
            K::user_data("interval"),
            K::user_data("fleet_rate"),
            K::user_data("action"),
            K::image("poweroff_unit"),
            K::image("hook"),
            K::image("hook_timeout"),
            K::image("resume_after_hook"),
            K::user_data("max_unavailable"),
            K::user_data("budget_partition"),
            K::user_data("budget_wait"),
            K::user_data("slot_timeout"),
            K::user_data("delete_node_record"),
        ]
    };
}

/// The budget: a node count or a percentage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// At most N nodes.
    Nodes(u32),
    /// At most N % of the nodes (rounded down, at least 1).
    Percent(u32),
}

/// The daemon's last desired-image check, as `upgrade-last.json` in the state folder holds
/// it, for `status` (`Image: running ami-..., desired ami-... (checked at T: up to date)`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ImageCheck {
    /// When (Unix seconds).
    pub at_unix: i64,
    /// The image this instance runs (IMDS `ami-id`).
    pub running: String,
    /// The desired image `upgrade.parameter` held, where the check read one.
    pub desired: Option<String>,
    /// What the check made of it, in the daemon's `STATUS=` words (`up to date (ami-...)`,
    /// `ami-A -> ami-B`, `waiting for a budget slot (2/2 held)`, `error: ...`).
    pub verdict: String,
}

impl ImageCheck {
    /// The file under `state_dir`.
    pub fn path(state_dir: &std::path::Path) -> std::path::PathBuf {
        state_dir.join("upgrade-last.json")
    }

    /// Writes it atomically under `state_dir`; a failure is logged, never fatal.
    pub fn save(&self, state_dir: &std::path::Path) {
        let path = ImageCheck::path(state_dir);
        let written = serde_json::to_vec(self)
            .map_err(std::io::Error::other)
            .and_then(|b| {
                crate::fsutil::write_atomic(&path, &b, 0o644, None).map_err(std::io::Error::other)
            });
        if let Err(e) = written {
            tracing::debug!("{}: desired-image check not recorded: {e}", path.display());
        }
    }

    /// The record under `state_dir`, if any.
    pub fn load(state_dir: &std::path::Path) -> Option<ImageCheck> {
        serde_json::from_slice(&std::fs::read(ImageCheck::path(state_dir)).ok()?).ok()
    }
}

/// An `upgrade.max_unavailable` that is neither a node count nor a percentage.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "expected a node count such as 3, or a percentage with no space before the sign such as \"10%\", got {value:?}"
)]
pub struct InvalidBudget {
    /// The text given.
    pub value: String,
}

impl Budget {
    /// Parses `2` or `10%`.
    ///
    /// # Errors
    /// [`InvalidBudget`]: the text.
    pub fn parse(s: &str) -> Result<Budget, InvalidBudget> {
        let t = s.trim();
        let bad = || InvalidBudget {
            value: s.to_string(),
        };
        match t.strip_suffix('%') {
            // `10 %` is refused, not read: one spelling, the one the docs show.
            Some(p) => match p.parse::<u32>() {
                Ok(n) if (1..=100).contains(&n) => Ok(Budget::Percent(n)),
                _ => Err(bad()),
            },
            None => match t.parse::<u32>() {
                Ok(n) if n >= 1 => Ok(Budget::Nodes(n)),
                _ => Err(bad()),
            },
        }
    }

    /// How many nodes of `total` may be drained for an upgrade at once (at least 1).
    pub fn limit(self, total: usize) -> usize {
        match self {
            Budget::Nodes(n) => usize::try_from(n).unwrap_or(usize::MAX),
            Budget::Percent(p) => (total * usize::try_from(p).unwrap_or(100) / 100).max(1),
        }
    }
}

impl UpgradeSettings {
    /// Checks the values.
    ///
    /// # Errors
    /// [`InvalidKey`]: the dotted key and what is wrong.
    pub fn validate(&self) -> Result<(), InvalidKey> {
        let e = |k: &str, m: String| Err(InvalidKey::new(format!("upgrade.{k}"), m));
        if let Err(m) = Budget::parse(&self.max_unavailable) {
            return e("max_unavailable", m.to_string());
        }
        for (k, d) in [
            ("interval", self.interval),
            ("hook_timeout", self.hook_timeout),
            ("budget_wait", self.budget_wait),
        ] {
            if d.0.is_zero() {
                return e(k, "must be more than 0".into());
            }
        }
        if self.slot_timeout.0 < Duration::from_secs(120) {
            return e(
                "slot_timeout",
                format!(
                    "must be at least 2 minutes (a reservation counts in whole minutes), got {}",
                    self.slot_timeout
                ),
            );
        }
        if !(self.fleet_rate.is_finite() && self.fleet_rate > 0.0) {
            return e(
                "fleet_rate",
                format!(
                    "must be a number of calls a second more than 0 (4 is a tenth of SSM's standard quota), got {}",
                    self.fleet_rate
                ),
            );
        }
        if let Err(m) = crate::systemd::validate_unit_name(&self.poweroff_unit) {
            return e("poweroff_unit", m.to_string());
        }
        if self.action == UpgradeAction::Hook {
            match self.hook.first() {
                Some(p) if std::path::Path::new(p).is_absolute() => {}
                _ => {
                    return e(
                        "hook",
                        "action \"hook\" needs a command whose program is an absolute path".into(),
                    )
                }
            }
        }
        if self
            .parameter
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
        {
            return e(
                "parameter",
                format!("not an SSM parameter name: {:?}", self.parameter),
            );
        }
        Ok(())
    }
}

/// Whether `s` is an AMI id: `ami-` and 8 or 17 lower-case hex digits.
pub fn is_ami_id(s: &str) -> bool {
    s.strip_prefix("ami-").is_some_and(|h| {
        (h.len() == 8 || h.len() == 17) && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// The cause name of upgrade reasons in the agent's reason scheme.
pub const REASON_CAUSE: &str = "upgrade";

/// Start of the detail of the reason written just before an upgrade poweroff.
pub const POWERED_OFF: &str = "powered off for image upgrade ";

/// Start of the detail of the reason of a replacement that still runs the old image.
pub const STUCK: &str = "replacement still runs ";

/// An upgrade reason in the agent's scheme: `slurm-node-agent/upgrade@<instance-id>:
/// <detail>` (`unknown` when the instance id is not known), control characters removed, at
/// most 256 characters (Slurm's reason field).
///
/// The one place this module builds a reason, so that the shared builder of
/// `crate::reason` can replace it in one line.
pub fn upgrade_reason(instance_id: &str, detail: &str) -> String {
    crate::reason::reason(crate::reason::ReasonCause::Upgrade, instance_id, detail)
}

/// An upgrade reason read back from Slurm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpgradeReason<'a> {
    /// The instance that wrote it (`None` for the older `node-agent/upgrade: ` form).
    pub instance_id: Option<&'a str>,
    /// Everything after `: `.
    pub detail: &'a str,
}

impl UpgradeReason<'_> {
    /// The images `(current, desired)` named by an `... A -> B` detail.
    pub fn images(&self) -> Option<(&str, &str)> {
        let (a, b) = self.detail.rsplit_once(" -> ")?;
        let current = a.rsplit(' ').next()?;
        let desired = b.split([' ', ';', ',']).next()?;
        (is_ami_id(current) && is_ami_id(desired)).then_some((current, desired))
    }

    /// Written just before the instance powered off for the upgrade.
    pub fn powered_off(&self) -> bool {
        self.detail.starts_with(POWERED_OFF)
    }
}

/// Parses an upgrade reason of the agent, `slurm-node-agent/upgrade@<instance-id>: <detail>`
/// ([`crate::reason`] decides what is the agent's). Anything else is `None`.
pub fn parse_upgrade_reason(reason: &str) -> Option<UpgradeReason<'_>> {
    if !crate::reason::is_agent_reason_for(reason, crate::reason::ReasonCause::Upgrade) {
        return None;
    }
    let rest = reason.strip_prefix("slurm-node-agent/upgrade@")?;
    let (id, detail) = rest.split_once(": ")?;
    // Without what slurmctld appended (` : reboot issued`; see AgentReason::parse).
    let detail = detail.split_once(" : ").map_or(detail, |(d, _)| d);
    Some(UpgradeReason {
        instance_id: Some(id),
        detail,
    })
}

/// For bootstrap on a replacement (a new instance under a NodeName whose record carries
/// `reason`): whether an upgrade drain left by another instance must stay for the daemon
/// to judge, because it names a desired image other than `running` (the replacement booted
/// from the old image: lifting it would let the node drain and power off again, a loop;
/// the daemon's rollout check marks it stuck instead). `false` for anything else,
/// including an upgrade reason whose desired image is `running` (the upgrade happened:
/// lift it).
pub fn leftover_still_applies(reason: &str, running: &str) -> bool {
    parse_upgrade_reason(reason)
        .and_then(|r| r.images().map(|(_, desired)| desired != running))
        .unwrap_or(false)
}

/// The desired image cannot be used: missing, not available, or the check failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// EC2 does not know the image (deregistered, never existed, another region or account
    /// without launch permission).
    #[error("desired image {image} (SSM parameter {parameter}) does not exist in EC2; no node drains for it")]
    Missing {
        /// The AMI id.
        image: String,
        /// The parameter that names it.
        parameter: String,
    },
    /// It exists but is not `available` yet (`pending`) or any more (`failed`,
    /// `deregistered`, `disabled`).
    #[error("desired image {image} (SSM parameter {parameter}) is {state}, not available; no node drains for it")]
    NotAvailable {
        /// The AMI id.
        image: String,
        /// The parameter.
        parameter: String,
        /// EC2's image state.
        state: String,
    },
    /// DescribeImages failed (access denied, network...).
    #[error("checking desired image {image} with EC2 DescribeImages: {message}")]
    Check {
        /// The AMI id.
        image: String,
        /// The error.
        message: String,
    },
}

/// Checks with EC2 DescribeImages that `image` exists and is `available`.
///
/// # Errors
/// [`ImageError`]; EC2's `InvalidAMIID.NotFound`, `.Unavailable` and `.Malformed` are
/// [`ImageError::Missing`].
pub async fn check_image(
    ec2: &aws_sdk_ec2::Client,
    image: &str,
    parameter: &str,
) -> Result<(), ImageError> {
    use aws_smithy_types::error::metadata::ProvideErrorMetadata;
    let missing = || ImageError::Missing {
        image: image.to_string(),
        parameter: parameter.to_string(),
    };
    let out = match ec2.describe_images().image_ids(image).send().await {
        Ok(o) => o,
        Err(e) => {
            if let Some(code) = e.as_service_error().and_then(|se| se.code()) {
                if code.starts_with("InvalidAMIID.") {
                    return Err(missing());
                }
            }
            let mut message = aws_smithy_types::error::display::DisplayErrorContext(&e).to_string();
            if message.len() > 300 {
                message = message.chars().take(300).collect::<String>() + "...";
            }
            return Err(ImageError::Check {
                image: image.to_string(),
                message,
            });
        }
    };
    let Some(found) = out.images().iter().find(|i| i.image_id() == Some(image)) else {
        return Err(missing());
    };
    match found.state() {
        Some(aws_sdk_ec2::types::ImageState::Available) => Ok(()),
        other => Err(ImageError::NotAvailable {
            image: image.to_string(),
            parameter: parameter.to_string(),
            state: other.map_or_else(|| "in no state".to_string(), |s| s.as_str().to_string()),
        }),
    }
}

/// Reading the desired image failed.
#[derive(Debug, thiserror::Error)]
pub enum DesiredImageError {
    /// No such parameter.
    #[error("SSM parameter {name}: not found")]
    NotFound {
        /// Parameter name.
        name: String,
    },
    /// Access denied (IAM, KMS).
    #[error("SSM parameter {name}: access denied: {message}")]
    AccessDenied {
        /// Parameter name.
        name: String,
        /// AWS's message.
        message: String,
    },
    /// The value is not an AMI id.
    #[error(
        "SSM parameter {name}: value {value:?} is not an AMI id (ami- and 8 or 17 hex digits)"
    )]
    NotAnImage {
        /// Parameter name.
        name: String,
        /// The value (truncated to 80 characters).
        value: String,
    },
    /// Anything else (network, throttling...).
    #[error("SSM parameter {name}: {message}")]
    Other {
        /// Parameter name.
        name: String,
        /// The error chain.
        message: String,
    },
}

/// Classifies a GetParameter error: not found, access denied (by error code, or HTTP 403
/// when the body carries no code the SDK can read), or anything else (one short line).
fn classify(
    name: &str,
    e: &aws_smithy_runtime_api::client::result::SdkError<
        aws_sdk_ssm::operation::get_parameter::GetParameterError,
        aws_smithy_runtime_api::http::Response,
    >,
) -> DesiredImageError {
    use aws_sdk_ssm::operation::get_parameter::GetParameterError as E;
    use aws_smithy_types::error::metadata::ProvideErrorMetadata;
    let name = name.to_string();
    if let Some(se) = e.as_service_error() {
        if matches!(se, E::ParameterNotFound(_)) {
            return DesiredImageError::NotFound { name };
        }
        if matches!(
            se.code(),
            Some("AccessDeniedException" | "AccessDenied" | "UnrecognizedClientException")
        ) {
            return DesiredImageError::AccessDenied {
                name,
                message: se.message().unwrap_or_default().to_string(),
            };
        }
    }
    if let Some(r) = e.raw_response() {
        let body = r
            .body()
            .bytes()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default();
        // The text of an XML error body's message, if there is one.
        let message = body
            .split_once("<Message>")
            .and_then(|(_, m)| m.split_once("</Message>"))
            .map(|(m, _)| m.to_string())
            .unwrap_or_else(|| body.chars().take(200).collect());
        let status = r.status().as_u16();
        if status == 403 {
            return DesiredImageError::AccessDenied { name, message };
        }
        return DesiredImageError::Other {
            name,
            message: format!("HTTP {status}: {message}"),
        };
    }
    let mut message = aws_smithy_types::error::display::DisplayErrorContext(e).to_string();
    if message.len() > 300 {
        message = message.chars().take(300).collect::<String>() + "...";
    }
    DesiredImageError::Other { name, message }
}

/// The desired image as SSM parameter `upgrade.parameter` holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    /// The AMI id (`Value`).
    pub image: String,
    /// When that value was written (`LastModifiedDate`, Unix seconds): when the image was
    /// published; `None` when SSM did not say.
    pub published_at: Option<i64>,
}

/// How much later than the publication of the desired image an instance must have been
/// launched (`pendingTime`) for its launch to have resolved the parameter to it: EC2
/// resolves a launch template's `resolve:ssm:` image while it accepts the launch, before
/// the instance is pending, so only a publication within a launch's own seconds can race
/// it. 60 s.
pub const LAUNCH_RACE_SECS: i64 = 60;

/// Whether an instance launched at `launched_at` (IMDS `pendingTime`) was launched after
/// the desired image was published (`published_at`, the parameter's `LastModifiedDate`),
/// beyond [`LAUNCH_RACE_SECS`]: such an instance that still runs another image was not
/// launched from the parameter (its launch template names an image, or an old version of
/// the parameter), and powering it off would only launch the same image again. Keyed by
/// the instance and the parameter, not by the NodeName, so that it holds for replacements
/// under new names as under the same. `false` when either time is unknown.
pub fn launched_after_publication(launched_at: Option<i64>, published_at: Option<i64>) -> bool {
    matches!((launched_at, published_at), (Some(l), Some(p)) if l > p.saturating_add(LAUNCH_RACE_SECS))
}

/// Reads the desired image from SSM parameter `name` and checks it is an AMI id.
///
/// # Errors
/// [`DesiredImageError`] naming the parameter.
pub async fn desired_image(
    ssm: &aws_sdk_ssm::Client,
    name: &str,
) -> Result<Desired, DesiredImageError> {
    let out = ssm
        .get_parameter()
        .name(name)
        .send()
        .await
        .map_err(|e| classify(name, &e))?;
    let parameter = out
        .parameter
        .unwrap_or_else(|| aws_sdk_ssm::types::Parameter::builder().build());
    let value = parameter
        .value
        .as_deref()
        .unwrap_or_default()
        .trim()
        .to_string();
    if !is_ami_id(&value) {
        return Err(DesiredImageError::NotAnImage {
            name: name.to_string(),
            value: value.chars().take(80).collect(),
        });
    }
    Ok(Desired {
        image: value,
        published_at: parameter.last_modified_date.map(|d| d.secs()),
    })
}

/// A wait of `base` randomized to between 50 % and 150 %.
pub fn jittered(base: Duration) -> Duration {
    let ms = u64::try_from(base.as_millis())
        .unwrap_or(u64::MAX / 2)
        .max(1);
    Duration::from_millis(rand::random_range(ms / 2..=ms + ms / 2))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The loop guard's key: launched after the publication beyond the launch race, with
    /// both times known; fails if the race margin or an unknown time is ignored.
    #[test]
    fn a_launch_after_the_publication_is_one_beyond_the_launch_race() {
        let p = 1_796_000_000;
        assert!(launched_after_publication(
            Some(p + LAUNCH_RACE_SECS + 1),
            Some(p)
        ));
        assert!(!launched_after_publication(
            Some(p + LAUNCH_RACE_SECS),
            Some(p)
        ));
        assert!(!launched_after_publication(Some(p - 3600), Some(p)));
        assert!(!launched_after_publication(None, Some(p)));
        assert!(!launched_after_publication(Some(p + 3600), None));
    }

    #[test]
    fn ami_ids() {
        assert!(is_ami_id("ami-0a887e401f7654935"));
        assert!(is_ami_id("ami-12345678"));
        for bad in [
            "",
            "ami-",
            "ami-0A887E401F7654935",
            "ami-0a887e401f765493",
            "0a887e401f7654935",
            "ami-0a887e401f7654935\n",
            "ami-0a887e40;reboot",
            "{\"image\":\"ami-12345678\"}",
        ] {
            assert!(!is_ami_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn budgets() {
        assert_eq!(Budget::parse("2").unwrap().limit(100), 2);
        assert_eq!(Budget::parse("10%").unwrap().limit(100), 10);
        assert_eq!(Budget::parse("10%").unwrap().limit(5), 1);
        assert_eq!(Budget::parse(" 50% ").unwrap().limit(3), 1);
        for bad in ["0", "0%", "101%", "-1", "x", "", "1.5", "10 %", "% 10"] {
            assert!(Budget::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn validation_names_keys() {
        let mut s = UpgradeSettings::default();
        assert!(s.validate().is_ok());
        s.action = UpgradeAction::Hook;
        assert_eq!(s.validate().unwrap_err().key, "upgrade.hook");
        s.hook = vec!["relative.sh".into()];
        assert_eq!(s.validate().unwrap_err().key, "upgrade.hook");
        s.hook = vec!["/usr/local/bin/upgrade".into()];
        assert!(s.validate().is_ok());
        s.max_unavailable = "lots".into();
        assert_eq!(s.validate().unwrap_err().key, "upgrade.max_unavailable");
        let mut s = UpgradeSettings::default();
        for bad in [0.0, -4.0, f64::NAN, f64::INFINITY] {
            s.fleet_rate = bad;
            let err = s.validate().unwrap_err();
            assert_eq!(err.key, "upgrade.fleet_rate", "{bad}");
        }
        s.fleet_rate = 0.5;
        s.interval = HumanDuration(Duration::ZERO);
        assert_eq!(s.validate().unwrap_err().key, "upgrade.interval");
        let mut s = UpgradeSettings::default();
        s.slot_timeout = HumanDuration(Duration::from_secs(60));
        assert_eq!(s.validate().unwrap_err().key, "upgrade.slot_timeout");
    }

    #[test]
    fn upgrade_reasons_round_trip() {
        let r = upgrade_reason(
            "i-0abc12345678",
            &format!("{POWERED_OFF}ami-0a887e401f7654935 -> ami-0123456789abcdef0"),
        );
        assert_eq!(
            r,
            "slurm-node-agent/upgrade@i-0abc12345678: powered off for image upgrade ami-0a887e401f7654935 -> ami-0123456789abcdef0"
        );
        let p = parse_upgrade_reason(&r).unwrap();
        assert_eq!(p.instance_id, Some("i-0abc12345678"));
        assert!(p.powered_off());
        assert_eq!(
            p.images(),
            Some(("ami-0a887e401f7654935", "ami-0123456789abcdef0"))
        );
        // The form older agents wrote is not the agent's any more (one reason scheme).
        assert!(parse_upgrade_reason(
            "node-agent/upgrade: image upgrade ami-12345678 -> ami-87654321"
        )
        .is_none());
        assert_eq!(
            upgrade_reason("", "x"),
            "slurm-node-agent/upgrade@unknown: x"
        );
        assert!(leftover_still_applies(&r, "ami-0a887e401f7654935"));
        assert!(!leftover_still_applies(&r, "ami-0123456789abcdef0"));
        assert!(!leftover_still_applies(
            "slurm-node-agent/spot@i-1: x",
            "ami-12345678"
        ));
        assert!(upgrade_reason("i-1", &"y\n".repeat(300)).chars().count() <= 256);
        for not_ours in [
            "slurm-node-agent: upgrade",
            "slurm-node-agent/upgrade@: x",
            "slurm-node-agent/upgrade@i 1: x",
            "slurm-node-agent/health@i-1: x",
            "upgrade",
            "ADMIN node-agent/upgrade: x",
        ] {
            assert!(parse_upgrade_reason(not_ours).is_none(), "{not_ours}");
        }
    }

    #[test]
    fn jitter_stays_in_range() {
        for _ in 0..100 {
            let d = jittered(Duration::from_secs(10));
            assert!(d >= Duration::from_secs(5) && d <= Duration::from_secs(15));
        }
    }
}
