//! The settings-section machinery.
//!
//! Each module owns its settings section: the type of its TOML table (`[events]`,
//! `[[mounts]]`, ...), its defaults, its `validate`, and the trust class of each of its
//! keys, declared next to the type with [`Classified`]. `settings/` above them all reads
//! the layers, assembles the sections into one `Settings` and enforces the classes.
//!
//! What every section uses lives here: [`HumanDuration`] for durations, and the trust
//! classes ([`Trust`], [`KeyTrust`], [`Classified`]). Who may set what:
//! - the image: built-in defaults, root-owned settings files that no group or other user
//!   can write, and the command line (root runs it);
//! - the user data part: written by whoever may launch the instance (`ec2:RunInstances`
//!   with the launch template) or change a stopped instance's attribute;
//! - instance tags: written by whoever holds `ec2:CreateTags` on the instance, at any time.
//!
//! A key's class is the least trusted source that may set it. Keys that name a path, a
//! program, an owner, a unit, a binary folder, an endpoint or a hook are [`Trust::Image`].
//!
//! Floor 0 (ground): uses no other module of the crate.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The least trusted source that may set a key. Ordered from most to least trusted, so
/// `source_class <= key_class` means the source may set the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Trust {
    /// Only the image (root-owned settings files) and the command line.
    Image,
    /// Also the user data part (`application/x-slurm-node-agent`).
    UserData,
    /// Also instance tags `slurm-node-agent:<key>`.
    Tag,
}

impl Trust {
    /// `image`, `user-data` or `tag`, as `config show` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            Trust::Image => "image",
            Trust::UserData => "user-data",
            Trust::Tag => "tag",
        }
    }
}

impl fmt::Display for Trust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A check of the value a source below [`Trust::Image`] gives: what it may choose within the
/// key (e.g. which secret, but not a file). Returns what is refused.
pub type LowerGuard = fn(&toml::Value) -> Result<(), Refused>;

/// What a [`LowerGuard`] refuses of a value from user data or a tag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The value as a whole: of what the key takes, user data and tags may give only
    /// `allowed`.
    #[error("{allowed}")]
    Value {
        /// The value refused (as TOML).
        value: String,
        /// What user data and tags may give instead.
        allowed: &'static str,
    },
    /// One part of the value, at `key` within it (`mounts[0].options`).
    #[error("{key}: {part:?}: {allowed}")]
    Part {
        /// Where the part sits within the value.
        key: String,
        /// The part refused.
        part: String,
        /// Where such parts may come from.
        allowed: &'static str,
    },
}

/// A section's key whose value its `validate` refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("key `{key}`: {message}")]
pub struct InvalidKey {
    /// The dotted key: `node.name`, `mounts[1].source`.
    pub key: String,
    /// What is wrong with the value.
    pub message: String,
}

impl InvalidKey {
    /// The key `key` (dotted) and what is wrong with its value, e.g. a typed error of the
    /// module that owns the section.
    pub fn new(key: impl Into<String>, problem: impl fmt::Display) -> InvalidKey {
        InvalidKey {
            key: key.into(),
            message: problem.to_string(),
        }
    }
}

/// One key's class.
#[derive(Debug, Clone, Copy)]
pub struct KeyTrust {
    /// The key within its section (`name`), or the section itself for an array of tables
    /// (`mounts`).
    pub key: &'static str,
    /// Its class.
    pub trust: Trust,
    /// Extra check of a value from user data or a tag, if any.
    pub lower: Option<LowerGuard>,
}

impl KeyTrust {
    /// Image files and the command line only.
    pub const fn image(key: &'static str) -> KeyTrust {
        KeyTrust {
            key,
            trust: Trust::Image,
            lower: None,
        }
    }
    /// Also user data.
    pub const fn user_data(key: &'static str) -> KeyTrust {
        KeyTrust {
            key,
            trust: Trust::UserData,
            lower: None,
        }
    }
    /// Also tags.
    pub const fn tag(key: &'static str) -> KeyTrust {
        KeyTrust {
            key,
            trust: Trust::Tag,
            lower: None,
        }
    }
    /// With a check of values from user data and tags.
    pub const fn guarded(self, lower: LowerGuard) -> KeyTrust {
        KeyTrust {
            lower: Some(lower),
            ..self
        }
    }
}

/// A settings section and the classes of its keys. Implemented next to each section's type;
/// a test checks that every key of the schema has exactly one class.
pub trait Classified {
    /// The TOML table (`node`), or the array of tables (`mounts`).
    const SECTION: &'static str;
    /// Every key of the section with its class.
    const TRUST: &'static [KeyTrust];
}

/// A duration written the humantime way (`90s`, `10m`, `1h 30m`, `500ms`), at most
/// [`HumanDuration::MAX`]: no setting means more than a year, and a bound here keeps every
/// deadline computed from one (`Instant + d`) from overflowing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct HumanDuration(pub Duration);

impl HumanDuration {
    /// The longest duration any setting takes: 366 days.
    pub const MAX: Duration = Duration::from_secs(366 * 24 * 3600);

    /// Whether it is zero.
    pub fn is_zero(&self) -> bool {
        self.0.is_zero()
    }
}

/// Why a text is not a [`HumanDuration`]. The text is shown to its first 64 characters.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DurationError {
    /// Not a duration humantime reads.
    #[error("invalid duration {shown:?} ({source}); write e.g. \"90s\" or \"10m\"")]
    Invalid {
        /// The text, to its first 64 characters.
        shown: String,
        /// humantime's reason.
        #[source]
        source: humantime::DurationError,
    },
    /// Longer than [`HumanDuration::MAX`].
    #[error("duration {shown:?} is too long: at most 366 days")]
    TooLong {
        /// The text, to its first 64 characters.
        shown: String,
    },
}

impl TryFrom<String> for HumanDuration {
    type Error = DurationError;
    fn try_from(s: String) -> Result<Self, DurationError> {
        let shown: String = s.chars().take(64).collect();
        let d = match humantime::parse_duration(&s) {
            Ok(d) => d,
            Err(source) => return Err(DurationError::Invalid { shown, source }),
        };
        if d > HumanDuration::MAX {
            return Err(DurationError::TooLong { shown });
        }
        Ok(HumanDuration(d))
    }
}

impl From<HumanDuration> for String {
    fn from(d: HumanDuration) -> String {
        humantime::format_duration(d.0).to_string()
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}
