//! The cluster's authentication key: fetched from SSM Parameter Store (SecureString, with
//! decryption), Secrets Manager, or a local file; checked; written atomically with mode 0400
//! and the owner the daemon needs.
//!
//! | `auth.type` | default path            | owner   | size accepted        |
//! |-------------|-------------------------|---------|----------------------|
//! | `munge`     | `/etc/munge/munge.key`  | `munge` | 32 to 1024 bytes (mungekey(8)) |
//! | `slurm`     | `/etc/slurm/slurm.key`  | `slurm` | 32 to 65536 bytes (auth/slurm, Slurm 23.11+) |
//!
//! The `[auth]` settings section ([`AuthSettings`]) is this module's.
//!
//! A fleet launched at once asks SSM or Secrets Manager for the key at once, and Parameter
//! Store serves 40 `GetParameter`s per second by default (issue 25 §1, boot storms). The
//! AWS fetch ([`fetch_in_region`]) therefore makes its own retries, the SDK none (so the two
//! never multiply): a throttled attempt is tried again after a wait drawn uniformly from
//! `[0, auth.throttle_spread]` until `auth.fetch_window` has passed, logged once with the
//! API and the quota it hit ([`crate::retry::quota_of`]); a network error or a 5xx is tried
//! [`TRANSIENT_ATTEMPTS`] times, as the SDK's standard mode did.
//!
//! The key never appears in a log line, an error or `config show`: it lives in [`Key`],
//! whose `Debug` prints only its length.
//!
//! Floor 2 (outside systems): reads the region through `imds`.

use base64::Engine;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use crate::exit::Exit;
use crate::fsutil::{self, Owner};
use crate::location::Location;
use crate::retry::{Backoff, ThrottlePolicy};
use crate::section::{Classified, HumanDuration, InvalidKey, KeyTrust, Refused};

/// Attempts at a key fetch that failed for the network or a 5xx answer (not throttling):
/// the SDK's standard retry mode's 3, which the agent's own retries replace.
pub const TRANSIENT_ATTEMPTS: u32 = 3;

/// Waits between those attempts: the SDK standard mode's (1 s base, 20 s cap, full jitter).
pub const TRANSIENT_BACKOFF: Backoff = Backoff {
    base: std::time::Duration::from_secs(1),
    cap: std::time::Duration::from_secs(20),
};

/// Slurm's authentication plugin, which decides the key file and its owner.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthType {
    /// `AuthType=auth/munge`: key `/etc/munge/munge.key`, owner `munge`; munged is started.
    #[default]
    Munge,
    /// `AuthType=auth/slurm` (Slurm 23.11+): key `/etc/slurm/slurm.key`, owner `slurm`;
    /// munge is neither needed nor started. slurmd is started with `SLURM_SACK_KEY=<key
    /// path>` in its environment, so it reads the key the agent wrote whatever Slurm's
    /// compile-time sysconfdir is (a `slurm.jwks` there still comes first: Slurm's own
    /// order).
    Slurm,
}

impl AuthType {
    /// Slurm's name of the plugin: `auth/munge`, `auth/slurm`.
    pub fn plugin(self) -> &'static str {
        match self {
            AuthType::Munge => "auth/munge",
            AuthType::Slurm => "auth/slurm",
        }
    }

    /// The value as `auth.type` spells it: `munge`, `slurm`.
    pub fn setting(self) -> &'static str {
        match self {
            AuthType::Munge => "munge",
            AuthType::Slurm => "slurm",
        }
    }
}

/// `[auth]`: the cluster key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthSettings {
    /// Plugin: `munge` (`AuthType=auth/munge`) or `slurm` (`AuthType=auth/slurm`, Slurm
    /// 23.11 or later). Not set: the join decides: `slurm` in the managed join
    /// (`pcs.enabled`), as the managed service runs every cluster with auth/slurm; `munge`
    /// otherwise. An image that can do only one sets it (the image builder's `--auth munge`
    /// or `--auth slurm`). Bootstrap refuses with exit 78, before it registers or writes
    /// anything and naming where the value came from: a managed join with `munge`; `slurm`
    /// with a slurmd older than 23.11; a type whose plugin (`auth_munge.so`,
    /// `auth_slurm.so`) Slurm's plugin folder lacks. It must be the controller's
    /// `AuthType`: a node whose type or key differs stops with exit 65 once slurmctld has
    /// refused slurmd's configuration requests for 25 s.
    #[serde(rename = "type")]
    pub auth_type: AuthType,
    /// Where the key comes from: `ssm:<parameter name>` (SecureString, decrypted),
    /// `secretsmanager:<secret id or ARN>`, or `file:<absolute path>`. Empty: the key is
    /// already in place (baked into the image) and is left alone.
    pub key_source: String,
    /// Destination. Empty: the plugin's default.
    pub key_path: PathBuf,
    /// Owner of the key file. Empty: `munge` or `slurm` by plugin.
    pub key_owner: String,
    /// How the stored key is encoded: `base64` (what ParallelCluster and the managed service
    /// store in Secrets Manager) or `raw` (the key bytes as they are, e.g. SecretBinary or a
    /// key file).
    pub key_encoding: KeyEncoding,
    /// Accept a key from an SSM parameter of type `String` (stored unencrypted, readable by
    /// anyone with `ssm:GetParameter`), with a warning. Off: such a parameter is refused.
    pub allow_string_parameter: bool,
    /// How long a key fetch from SSM or Secrets Manager that AWS throttles is tried again,
    /// from the first attempt; then bootstrap stops with exit 69, naming the API and its
    /// quota.
    pub fetch_window: HumanDuration,
    /// Longest wait after a throttled key fetch: each wait is drawn uniformly from
    /// `[0, throttle_spread]` (full jitter, without growth), which spreads a fleet's
    /// retries over that time. Size it as the nodes launched together ÷ the API's quota,
    /// less the launch's own spread: the default 20 s fits 1,000 nodes launched within
    /// 10 s against Parameter Store's standard 40 TPS (every node has its key within about
    /// 1.2 × the 25 s that quota needs, with fewer than 2 requests per node). A node that
    /// is not throttled never waits.
    pub throttle_spread: HumanDuration,
}

impl Default for AuthSettings {
    fn default() -> Self {
        AuthSettings {
            auth_type: AuthType::default(),
            key_source: String::new(),
            key_path: PathBuf::new(),
            key_owner: String::new(),
            key_encoding: KeyEncoding::default(),
            allow_string_parameter: false,
            fetch_window: HumanDuration(std::time::Duration::from_secs(10 * 60)),
            throttle_spread: HumanDuration(std::time::Duration::from_secs(20)),
        }
    }
}

/// The key's destination, owner and plugin are the image's; user data may pick which
/// secret (never a file on the node) and how it is encoded.
impl Classified for AuthSettings {
    const SECTION: &'static str = "auth";
    const TRUST: &'static [KeyTrust] = &[
        KeyTrust::image("type"),
        KeyTrust::user_data("key_source").guarded(secret_sources_only),
        KeyTrust::image("key_path"),
        KeyTrust::image("key_owner"),
        KeyTrust::user_data("key_encoding"),
        KeyTrust::image("allow_string_parameter"),
        KeyTrust::user_data("fetch_window"),
        KeyTrust::user_data("throttle_spread"),
    ];
}

/// Encoding of the stored key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyEncoding {
    /// Standard base64 (RFC 4648), whitespace ignored.
    #[default]
    Base64,
    /// The bytes as stored.
    Raw,
}

impl AuthSettings {
    /// Checks the values: the key path absolute, the key source one this agent reads
    /// ([`KeySource::parse`]), the owner a user name, `throttle_spread` above zero (a zero
    /// spread would retry a throttled fetch at once, over and over, for the whole
    /// `fetch_window`: the retry storm the spread exists to prevent).
    ///
    /// # Errors
    /// [`InvalidKey`]: the dotted key and what is wrong.
    pub fn validate(&self) -> Result<(), InvalidKey> {
        let e = |k: &str, m: String| Err(InvalidKey::new(format!("auth.{k}"), m));
        let p = &self.key_path;
        if !p.as_os_str().is_empty() && !p.is_absolute() {
            return e(
                "key_path",
                format!("must be an absolute path, got {}", p.display()),
            );
        }
        if !self.key_source.is_empty() {
            if let Err(m) = KeySource::parse(&self.key_source) {
                return e("key_source", m.to_string());
            }
        }
        if !self.key_owner.is_empty()
            && !self
                .key_owner
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-".contains(c))
        {
            return e(
                "key_owner",
                format!("not a user name: {:?}", self.key_owner),
            );
        }
        if self.throttle_spread.0.is_zero() {
            return e("throttle_spread", ZERO_SPREAD.into());
        }
        Ok(())
    }
}

/// Why a `throttle_spread` of zero is refused (`auth.throttle_spread`,
/// `pcs.throttle_spread`).
pub const ZERO_SPREAD: &str = "must be more than 0s: a throttled call would be tried again at \
     once, over and over, until its window ends (size it as the nodes launched together / \
     the API's quota)";

/// Where the key comes from (`auth.key_source`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// `ssm:<parameter name>[#field]`: an SSM SecureString, read with decryption.
    Ssm {
        /// Parameter name or ARN.
        name: String,
        /// JSON field holding the key, when the value is a JSON object.
        field: Option<String>,
    },
    /// `secretsmanager:<secret id or ARN>[#field]`: SecretBinary, or SecretString.
    SecretsManager {
        /// Secret name or ARN.
        id: String,
        /// JSON field holding the key, when the secret is a key/value (JSON) secret.
        field: Option<String>,
    },
    /// `file:<absolute path>`.
    File(PathBuf),
    /// The `sharedSecret` of the managed service's registration answer for this cluster
    /// (base64); never parsed from settings (see the `pcs` module).
    Registration(String),
}

impl KeySource {
    /// Parses `ssm:NAME[#FIELD]`, `secretsmanager:ID[#FIELD]` or `file:/PATH` (the scheme
    /// read by [`Location::parse`], the rest checked here). Neither SSM
    /// parameter names nor Secrets Manager names and ARNs may contain `#`, so the text
    /// after the last `#` is the JSON field.
    ///
    /// # Errors
    /// [`InvalidKeySource`]: the text, which is none of these.
    pub fn parse(s: &str) -> Result<KeySource, InvalidKeySource> {
        let printable =
            |v: &str| !v.is_empty() && v.len() <= 2048 && v.chars().all(|c| c.is_ascii_graphic());
        let with_field = |v: &str| -> Option<(String, Option<String>)> {
            match v.split_once('#') {
                None if printable(v) => Some((v.to_string(), None)),
                Some((n, f)) if printable(n) && printable(f) && !f.contains('#') => {
                    Some((n.to_string(), Some(f.to_string())))
                }
                _ => None,
            }
        };
        match Location::parse(s) {
            Some(Location::Ssm(rest)) => {
                if let Some((name, field)) = with_field(rest) {
                    return Ok(KeySource::Ssm { name, field });
                }
            }
            Some(Location::SecretsManager(rest)) => {
                if let Some((id, field)) = with_field(rest) {
                    return Ok(KeySource::SecretsManager { id, field });
                }
            }
            Some(Location::File(p)) if p.starts_with('/') && !p.contains('\n') => {
                return Ok(KeySource::File(PathBuf::from(p)));
            }
            _ => {}
        }
        Err(InvalidKeySource {
            value: s.to_string(),
        })
    }

    /// The JSON field named after `#`, if any.
    pub fn field(&self) -> Option<&str> {
        match self {
            KeySource::Ssm { field, .. } | KeySource::SecretsManager { field, .. } => {
                field.as_deref()
            }
            KeySource::File(_) | KeySource::Registration(_) => None,
        }
    }
}

/// An `auth.key_source` that is not `ssm:`, `secretsmanager:` or `file:` as
/// [`KeySource::parse`] reads them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid key source {value:?}: expected ssm:<parameter name>[#<JSON field>], \
     secretsmanager:<secret id or ARN>[#<JSON field>] or file:<absolute path>"
)]
pub struct InvalidKeySource {
    /// The text given.
    pub value: String,
}

impl std::fmt::Display for KeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeySource::Ssm { name, .. } => write!(f, "SSM parameter {name}")?,
            KeySource::SecretsManager { id, .. } => write!(f, "Secrets Manager secret {id}")?,
            KeySource::File(p) => write!(f, "key file {}", p.display())?,
            KeySource::Registration(c) => {
                write!(f, "sharedSecret of the PCS registration (cluster {c})")?
            }
        }
        match self.field() {
            Some(field) => write!(f, " (JSON field {field:?})"),
            None => Ok(()),
        }
    }
}

/// `auth.key_source` from user data or a tag may pick a secret (`ssm:`,
/// `secretsmanager:`), never a file on the node: that would copy any root-readable file
/// into the key file, which the munge user reads.
pub fn secret_sources_only(v: &toml::Value) -> Result<(), Refused> {
    match v.as_str() {
        Some(s)
            if s.is_empty()
                || matches!(
                    Location::parse(s),
                    Some(Location::Ssm(_) | Location::SecretsManager(_))
                ) =>
        {
            Ok(())
        }
        _ => Err(Refused::Value {
            value: v.to_string(),
            allowed: "from user data or a tag only ssm: and secretsmanager: sources (which secret, never a file on the node)",
        }),
    }
}

/// What [`fetch`] read: the stored (still encoded) bytes, and whether they came from an SSM
/// parameter that is not a SecureString (stored unencrypted).
#[derive(Clone, PartialEq, Eq)]
pub struct Stored {
    /// The value as stored.
    pub bytes: Vec<u8>,
    /// An SSM `String` or `StringList` parameter, not a `SecureString`.
    pub unencrypted_parameter: bool,
}

impl std::fmt::Debug for Stored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Stored({} bytes, unencrypted_parameter: {})",
            self.bytes.len(),
            self.unencrypted_parameter
        )
    }
}

/// Key bytes. `Debug` shows only the length.
#[derive(Clone, PartialEq, Eq)]
pub struct Key(Vec<u8>);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({} bytes)", self.0.len())
    }
}

impl Key {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A key error. Its text names the source and never holds key material.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The parameter, secret or file does not exist.
    #[error("{source_}: not found")]
    NotFound {
        /// The source.
        source_: KeySource,
    },
    /// The credentials may not read it (or may not decrypt it).
    #[error("{source_}: access denied: {message}")]
    AccessDenied {
        /// The source.
        source_: KeySource,
        /// AWS's message.
        message: String,
    },
    /// It exists but is empty.
    #[error("{source_}: the key is empty")]
    Empty {
        /// The source.
        source_: KeySource,
    },
    /// It does not decode.
    #[error("{source_}: the key is not valid {encoding} ({message}); set auth.key_encoding")]
    Decode {
        /// The source.
        source_: KeySource,
        /// Expected encoding.
        encoding: &'static str,
        /// Decoder message.
        message: String,
    },
    /// It has the wrong size for the plugin.
    #[error("{source_}: the key is {len} bytes; {plugin} needs {min} to {max} bytes")]
    WrongSize {
        /// The source.
        source_: KeySource,
        /// Decoded length.
        len: usize,
        /// `auth/munge` or `auth/slurm`.
        plugin: &'static str,
        /// Minimum.
        min: usize,
        /// Maximum.
        max: usize,
    },
    /// An SSM parameter of type `String`/`StringList` holds the key, and
    /// `auth.allow_string_parameter` is off.
    #[error(
        "{source_}: the parameter is not a SecureString (the key is stored unencrypted); \
         store it as a SecureString, or set auth.allow_string_parameter = true"
    )]
    UnencryptedParameter {
        /// The source.
        source_: KeySource,
    },
    /// The value is a JSON object and no field was named, or the named field is not there.
    #[error("{source_}: {message}")]
    Json {
        /// The source.
        source_: KeySource,
        /// What is wrong (field names only, never values).
        message: String,
    },
    /// AWS throttled the fetch ([`crate::retry::is_throttling`]) until `auth.fetch_window`
    /// ended (exit 69).
    #[error(
        "{source_}: {api} throttled ({message}) {attempts} times in {waited:?} \
         (auth.fetch_window); quota: {}",
        crate::retry::quota_of(api)
    )]
    Throttled {
        /// The source.
        source_: KeySource,
        /// The API, IAM's spelling (`ssm:GetParameter`).
        api: &'static str,
        /// AWS's code and message (`ThrottlingException: Rate exceeded`).
        message: String,
        /// Attempts made.
        attempts: u32,
        /// Time from the first attempt to the last answer.
        waited: std::time::Duration,
    },
    /// A network error, a timeout or a 5xx answer, [`TRANSIENT_ATTEMPTS`] times (exit 69).
    #[error("{source_}: {message}")]
    Transient {
        /// The source.
        source_: KeySource,
        /// What happened (the last attempt).
        message: String,
    },
    /// Any other failure (an AWS error, I/O).
    #[error("{source_}: {message}")]
    Other {
        /// The source.
        source_: KeySource,
        /// What happened.
        message: String,
    },
    /// `auth.key_source` is not a source (the settings check refuses it before this).
    #[error("auth.key_source: {0}")]
    InvalidSource(#[from] InvalidKeySource),
    /// The key's owner does not exist on this host.
    #[error("user {user:?} (owner of the key file) does not exist")]
    NoSuchOwner {
        /// `auth.key_owner`.
        user: String,
    },
    /// Writing the file failed.
    #[error(transparent)]
    Write(#[from] fsutil::WriteError),
}

impl KeyError {
    /// The exit code: bad settings for a source that is none, no permission for access
    /// denied, I/O for the write, unavailable for the service, bad data for the key itself.
    pub fn exit(&self) -> Exit {
        match self {
            KeyError::InvalidSource(_) => Exit::Config,
            KeyError::AccessDenied { .. } => Exit::NoPerm,
            KeyError::Write(_) => Exit::IoErr,
            KeyError::Other { .. } | KeyError::Throttled { .. } | KeyError::Transient { .. } => {
                Exit::Unavailable
            }
            KeyError::NotFound { .. }
            | KeyError::Empty { .. }
            | KeyError::Decode { .. }
            | KeyError::WrongSize { .. }
            | KeyError::UnencryptedParameter { .. }
            | KeyError::Json { .. }
            | KeyError::NoSuchOwner { .. } => Exit::DataErr,
        }
    }
}

/// Destination, owner and size limits for a plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyTarget {
    /// File to write.
    pub path: PathBuf,
    /// Owner's user name.
    pub owner: String,
    /// `auth/munge` or `auth/slurm`.
    pub plugin: &'static str,
    /// Smallest accepted key.
    pub min: usize,
    /// Largest accepted key.
    pub max: usize,
}

impl KeyTarget {
    /// The target for the settings (plugin defaults, overridden by `auth.key_path` and
    /// `auth.key_owner`).
    pub fn from_settings(s: &AuthSettings) -> KeyTarget {
        let (path, owner, plugin, max) = match s.auth_type {
            AuthType::Munge => ("/etc/munge/munge.key", "munge", "auth/munge", 1024),
            AuthType::Slurm => ("/etc/slurm/slurm.key", "slurm", "auth/slurm", 65_536),
        };
        KeyTarget {
            path: if s.key_path.as_os_str().is_empty() {
                PathBuf::from(path)
            } else {
                s.key_path.clone()
            },
            owner: if s.key_owner.is_empty() {
                owner.to_string()
            } else {
                s.key_owner.clone()
            },
            plugin,
            min: 32,
            max,
        }
    }
}

/// Decodes and checks raw stored bytes.
///
/// # Errors
/// [`KeyError::Empty`], [`KeyError::Decode`], [`KeyError::WrongSize`].
pub fn decode(
    source: &KeySource,
    stored: &[u8],
    encoding: KeyEncoding,
    target: &KeyTarget,
) -> Result<Key, KeyError> {
    let selected = select_field(source, stored)?;
    let stored = selected.as_deref().unwrap_or(stored);
    if stored.iter().all(u8::is_ascii_whitespace) {
        return Err(KeyError::Empty {
            source_: source.clone(),
        });
    }
    let bytes = match encoding {
        KeyEncoding::Raw => stored.to_vec(),
        KeyEncoding::Base64 => {
            let compact: Vec<u8> = stored
                .iter()
                .copied()
                .filter(|b| !b.is_ascii_whitespace())
                .collect();
            base64::engine::general_purpose::STANDARD
                .decode(compact)
                .map_err(|e| KeyError::Decode {
                    source_: source.clone(),
                    encoding: "base64",
                    message: base64_problem(&e),
                })?
        }
    };
    if !(target.min..=target.max).contains(&bytes.len()) {
        return Err(KeyError::WrongSize {
            source_: source.clone(),
            len: bytes.len(),
            plugin: target.plugin,
            min: target.min,
            max: target.max,
        });
    }
    Ok(Key(bytes))
}

/// With a field named (`#field`): that string field of the JSON object. Without one: `None`,
/// or an error when the value is a JSON object (a key/value secret; installing its text as
/// the key would be wrong whatever the encoding).
fn select_field(source: &KeySource, stored: &[u8]) -> Result<Option<Vec<u8>>, KeyError> {
    let err = |message: String| KeyError::Json {
        source_: source.clone(),
        message,
    };
    let object = || match serde_json::from_slice::<serde_json::Value>(stored) {
        Ok(serde_json::Value::Object(m)) => Some(m),
        _ => None,
    };
    match source.field() {
        None => {
            let trimmed = stored.trim_ascii_start();
            if trimmed.first() == Some(&b'{') && object().is_some() {
                let example = match source {
                    KeySource::Ssm { name, .. } => format!("ssm:{name}#FIELD"),
                    KeySource::SecretsManager { id, .. } => format!("secretsmanager:{id}#FIELD"),
                    KeySource::File(_) | KeySource::Registration(_) => {
                        return Err(err("the value is a JSON object, not a key".into()))
                    }
                };
                return Err(err(format!(
                    "the value is a JSON object (a key/value secret), not a key: name the \
                     field that holds the key, e.g. auth.key_source = \"{example}\""
                )));
            }
            Ok(None)
        }
        Some(field) => {
            let Some(map) = object() else {
                return Err(err(format!(
                    "JSON field {field:?} was named but the value is not a JSON object"
                )));
            };
            match map.get(field) {
                Some(serde_json::Value::String(v)) => Ok(Some(v.clone().into_bytes())),
                Some(_) => Err(err(format!("JSON field {field:?} is not a string"))),
                None => {
                    let names: Vec<&str> = map.keys().map(String::as_str).take(20).collect();
                    Err(err(format!(
                        "the JSON object has no field {field:?} (it has: {})",
                        names.join(", ")
                    )))
                }
            }
        }
    }
}

/// What is wrong with base64 text, without the offending byte (the base64 crate's own
/// message, `Invalid symbol 195, offset 40.`, repeats a byte of the key).
fn base64_problem(e: &base64::DecodeError) -> String {
    match e {
        base64::DecodeError::InvalidByte(..) => "a character outside the base64 alphabet",
        base64::DecodeError::InvalidLength(_) => {
            "its length is not a whole number of base64 blocks"
        }
        base64::DecodeError::InvalidLastSymbol(..) => {
            "its last character has bits set past the end"
        }
        base64::DecodeError::InvalidPadding => "its `=` padding is wrong",
    }
    .to_string()
}

/// Fetches the stored key bytes (still encoded).
///
/// # Errors
/// [`KeyError`] naming the source.
pub async fn fetch(source: &KeySource, sdk: &aws_config::SdkConfig) -> Result<Stored, KeyError> {
    use aws_sdk_secretsmanager::operation::get_secret_value::GetSecretValueError as SmErr;
    use aws_sdk_ssm::operation::get_parameter::GetParameterError as SsmErr;
    let src = || source.clone();
    match source {
        KeySource::File(p) => std::fs::read(p)
            .map(|bytes| Stored {
                bytes,
                unencrypted_parameter: false,
            })
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => KeyError::NotFound { source_: src() },
                std::io::ErrorKind::PermissionDenied => KeyError::AccessDenied {
                    source_: src(),
                    message: e.to_string(),
                },
                _ => KeyError::Other {
                    source_: src(),
                    message: e.to_string(),
                },
            }),
        KeySource::Registration(_) => Err(KeyError::Other {
            source_: src(),
            message: "comes with the registration answer, not fetched".into(),
        }),
        KeySource::Ssm { name, .. } => {
            let client = aws_sdk_ssm::Client::new(sdk);
            match client
                .get_parameter()
                .name(name)
                .with_decryption(true)
                .send()
                .await
            {
                Ok(out) => {
                    let (kind, value) = out
                        .parameter
                        .map(|p| (p.r#type, p.value))
                        .unwrap_or_default();
                    Ok(Stored {
                        bytes: value.unwrap_or_default().into_bytes(),
                        unencrypted_parameter: !matches!(
                            kind,
                            Some(aws_sdk_ssm::types::ParameterType::SecureString)
                        ),
                    })
                }
                Err(e) => Err(sdk_error(src(), "ssm:GetParameter", e, |se| {
                    matches!(se, SsmErr::ParameterNotFound(_))
                })),
            }
        }
        KeySource::SecretsManager { id, .. } => {
            let client = aws_sdk_secretsmanager::Client::new(sdk);
            match client.get_secret_value().secret_id(id).send().await {
                Ok(out) => Ok(Stored {
                    bytes: match (out.secret_binary, out.secret_string) {
                        (Some(b), _) => b.into_inner(),
                        (None, Some(s)) => s.into_bytes(),
                        (None, None) => Vec::new(),
                    },
                    unencrypted_parameter: false,
                }),
                Err(e) => Err(sdk_error(src(), "secretsmanager:GetSecretValue", e, |se| {
                    matches!(se, SmErr::ResourceNotFoundException(_))
                })),
            }
        }
    }
}

/// Classifies an AWS SDK error of `api`: not found, access denied (by error code, or HTTP
/// 403 when the body carries no code the SDK can read), throttled, transient (no answer, a
/// timeout, a 5xx), or anything else.
fn sdk_error<E>(
    source: KeySource,
    api: &'static str,
    e: aws_smithy_runtime_api::client::result::SdkError<E, aws_smithy_runtime_api::http::Response>,
    not_found: impl Fn(&E) -> bool,
) -> KeyError
where
    E: aws_smithy_types::error::metadata::ProvideErrorMetadata + std::error::Error + 'static,
{
    let status = e.raw_response().map(|r| r.status().as_u16());
    let code = e.as_service_error().and_then(|se| se.code());
    if crate::retry::is_throttling(code, status) {
        crate::textfile::note_throttled(api);
        let message = e.as_service_error().and_then(|se| se.message());
        return KeyError::Throttled {
            source_: source,
            api,
            message: match (code, message) {
                (Some(c), Some(m)) => format!("{c}: {m}"),
                (Some(c), None) => c.to_string(),
                _ => format!("HTTP {}", status.unwrap_or_default()),
            },
            attempts: 1,
            waited: std::time::Duration::ZERO,
        };
    }
    if let Some(se) = e.as_service_error() {
        if not_found(se) {
            return KeyError::NotFound { source_: source };
        }
        if is_access_denied(se.code()) {
            return KeyError::AccessDenied {
                source_: source,
                message: se.message().unwrap_or_default().to_string(),
            };
        }
    }
    if e.raw_response().map(|r| r.status().as_u16()) == Some(403) {
        return KeyError::AccessDenied {
            source_: source,
            message: "HTTP 403 Forbidden".into(),
        };
    }
    let message = aws_smithy_types::error::display::DisplayErrorContext(&e).to_string();
    if e.as_service_error().is_none() || status.is_some_and(|s| s >= 500) {
        return KeyError::Transient {
            source_: source,
            message,
        };
    }
    KeyError::Other {
        source_: source,
        message,
    }
}

fn is_access_denied(code: Option<&str>) -> bool {
    crate::retry::is_access_denied(code)
        || code == Some("UnrecognizedClientException")
        || code.is_some_and(|c| c.starts_with("KMS"))
}

/// Resolves a user name to its uid and primary gid.
///
/// # Errors
/// [`KeyError::NoSuchOwner`].
pub fn resolve_owner(name: &str) -> Result<Owner, KeyError> {
    match nix::unistd::User::from_name(name) {
        Ok(Some(u)) => Ok(Owner {
            uid: u.uid.as_raw(),
            gid: u.gid.as_raw(),
        }),
        _ => Err(KeyError::NoSuchOwner {
            user: name.to_string(),
        }),
    }
}

/// Writes the key to `path` (mode 0400, `owner`) unless the file already holds exactly
/// these bytes with that mode and owner. Returns whether the file changed (a daemon that
/// reads the key needs a restart only then).
///
/// # Errors
/// [`KeyError::Write`].
pub fn install(key: &Key, path: &Path, owner: Owner) -> Result<bool, KeyError> {
    use std::os::unix::fs::MetadataExt;
    // Compared only when it is a regular file (never through a symlink, which is replaced).
    if let Ok(Some((old, meta))) = fsutil::read_regular(path, 1 << 17) {
        if old == key.0
            && meta.mode() & 0o7777 == 0o400
            && meta.uid() == owner.uid
            && meta.gid() == owner.gid
        {
            return Ok(false);
        }
    }
    fsutil::write_atomic(path, &key.0, 0o400, Some(owner))?;
    Ok(true)
}

/// What a prefetch ([`Prefetch`]) or a fetch read, with the source it read.
pub type Fetched = (KeySource, Result<Stored, KeyError>);

/// A fetch of the key started before the final settings are known: the key source in the
/// files and flags is almost always the final one (tags and user data can still change
/// it), so bootstrap fetches it while the rest of the metadata is read, and uses the
/// result only if the final source is the same ([`install_from`]).
#[derive(Debug)]
pub struct Prefetch(tokio::sync::oneshot::Receiver<Option<Fetched>>);

impl Prefetch {
    /// Starts fetching the key `auth.key_source` names (`None` when it does not parse: the
    /// key step says why). It runs on a thread of its own, with its own runtime and IMDS
    /// session (`imds`, for the region), so that it overlaps everything up to the key step:
    /// the AWS SDK's first HTTPS client loads and parses the platform's trusted roots, CPU
    /// work that blocks whichever thread does it.
    pub fn start(auth: &AuthSettings, imds: &crate::imds::ImdsSettings) -> Option<Prefetch> {
        let source = KeySource::parse(&auth.key_source).ok()?;
        let policy = throttle_policy(auth);
        let imds_settings = imds.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let fetch = move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async move {
                let t = std::time::Instant::now();
                let imds = crate::imds::Imds::new(&imds_settings);
                let region = imds.get("/latest/meta-data/placement/region").await.ok()?;
                tracing::debug!(elapsed = ?t.elapsed(), "key prefetch: region read");
                let stored = fetch_in_region(&source, region.trim(), &policy).await;
                tracing::debug!(elapsed = ?t.elapsed(), "key prefetch: key fetched");
                Some((source, stored))
            })
        };
        let spawned = std::thread::Builder::new()
            .name("key-prefetch".into())
            .spawn(move || {
                let _ = tx.send(fetch());
            });
        if let Err(e) = spawned {
            // The key step fetches it then.
            tracing::warn!("cannot start the key prefetch thread: {e}");
        }
        Some(Prefetch(rx))
    }

    /// What it fetched; `None` when it could not run or read the region.
    pub async fn take(self) -> Option<Fetched> {
        self.0.await.ok().flatten()
    }
}

/// `auth.throttle_spread` and `auth.fetch_window`.
pub fn throttle_policy(auth: &AuthSettings) -> ThrottlePolicy {
    ThrottlePolicy {
        spread: auth.throttle_spread.0,
        window: auth.fetch_window.0,
    }
}

/// The AWS SDK configuration of the key fetch: the default credentials chain in `region`,
/// without the SDK's retries ([`fetch_with_retries`] makes them).
pub async fn sdk_config(region: &str) -> aws_config::SdkConfig {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(region.to_string()))
        .retry_config(aws_config::retry::RetryConfig::disabled())
        .load()
        .await
}

/// Fetches the stored (still encoded) key bytes; AWS sources use the SDK's default
/// credentials chain in `region` ([`sdk_config`]) and `policy`'s retries
/// ([`fetch_with_retries`]).
///
/// # Errors
/// As [`fetch_with_retries`].
pub async fn fetch_in_region(
    source: &KeySource,
    region: &str,
    policy: &ThrottlePolicy,
) -> Result<Stored, KeyError> {
    match source {
        KeySource::File(_) => fetch(source, &aws_config::SdkConfig::builder().build()).await,
        _ => {
            let t = std::time::Instant::now();
            let sdk = sdk_config(region).await;
            tracing::debug!(elapsed = ?t.elapsed(), "AWS SDK configuration loaded");
            fetch_with_retries(source, &sdk, policy).await
        }
    }
}

/// [`fetch`] with the agent's retries (see the module docs): a throttled attempt again
/// after `policy`'s jittered wait until its window has passed (the first throttle logged
/// at warning level with the API and the quota, the others at debug level), a transient
/// failure up to [`TRANSIENT_ATTEMPTS`] times. `sdk` should have the SDK's retries off
/// ([`sdk_config`]), or the two multiply.
///
/// # Errors
/// [`KeyError::Throttled`] once the window has passed, else as [`fetch`].
pub async fn fetch_with_retries(
    source: &KeySource,
    sdk: &aws_config::SdkConfig,
    policy: &ThrottlePolicy,
) -> Result<Stored, KeyError> {
    let start = std::time::Instant::now();
    let mut attempts = 0u32;
    let mut transient = 0u32;
    loop {
        attempts += 1;
        let err = match fetch(source, sdk).await {
            Ok(stored) => {
                if attempts > 1 {
                    tracing::info!(attempts, elapsed = ?start.elapsed(), "{source}: fetched after retries");
                }
                return Ok(stored);
            }
            Err(e) => e,
        };
        let left = policy.window.saturating_sub(start.elapsed());
        let wait = match err {
            KeyError::Throttled {
                source_,
                api,
                message,
                ..
            } => {
                if left.is_zero() {
                    return Err(KeyError::Throttled {
                        source_,
                        api,
                        message,
                        attempts,
                        waited: start.elapsed(),
                    });
                }
                if attempts - transient == 1 {
                    tracing::warn!(
                        "{source_}: {api} throttled ({message}; quota: {}); trying again after \
                         waits of up to {:?} (auth.throttle_spread) for {:?} \
                         (auth.fetch_window)",
                        crate::retry::quota_of(api),
                        policy.spread,
                        policy.window
                    );
                } else {
                    tracing::debug!(attempts, "{source_}: {api} throttled again ({message})");
                }
                policy.delay(left)
            }
            KeyError::Transient { .. } if transient + 1 < TRANSIENT_ATTEMPTS => {
                tracing::warn!(attempt = attempts, "key fetch failed: {err}");
                transient += 1;
                TRANSIENT_BACKOFF.delay(transient - 1)
            }
            e => return Err(e),
        };
        tokio::time::sleep(wait).await;
    }
}

/// Fetches and installs the key `auth` names, in `region`. Returns whether the file
/// changed. With no key source the key is assumed baked into the image. `prefetched` is a
/// fetch started earlier from the files and flags ([`Prefetch`]), used when its source is
/// still the one `auth` names.
///
/// # Errors
/// [`KeyError`]; nothing is written for a key that fails its checks.
pub async fn install_from(
    auth: &AuthSettings,
    region: &str,
    prefetched: Option<Fetched>,
) -> Result<bool, KeyError> {
    if auth.key_source.is_empty() {
        return Ok(false);
    }
    let source = KeySource::parse(&auth.key_source).map_err(KeyError::InvalidSource)?;
    let target = KeyTarget::from_settings(auth);
    // Resolve the owner first: a host without the daemon's user gets no key file.
    let owner = resolve_owner(&target.owner)?;
    let stored = match prefetched {
        Some((early, result)) if early == source => result?,
        _ => fetch_in_region(&source, region, &throttle_policy(auth)).await?,
    };
    if stored.unencrypted_parameter {
        if !auth.allow_string_parameter {
            return Err(KeyError::UnencryptedParameter { source_: source });
        }
        tracing::warn!(
            "{source} is not a SecureString: the key is stored unencrypted \
             (auth.allow_string_parameter = true)"
        );
    }
    let key = decode(&source, &stored.bytes, auth.key_encoding, &target)?;
    let changed = install(&key, &target.path, owner)?;
    tracing::info!(path = %target.path.display(), changed, bytes = key.len(), "auth key installed");
    Ok(changed)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn munge() -> KeyTarget {
        KeyTarget::from_settings(&AuthSettings::default())
    }

    #[test]
    fn parses_sources() {
        assert_eq!(
            KeySource::parse("ssm:/cluster/munge").unwrap(),
            KeySource::Ssm {
                name: "/cluster/munge".into(),
                field: None
            }
        );
        assert_eq!(
            KeySource::parse("secretsmanager:arn:aws:secretsmanager:us-east-1:1:secret:x").unwrap(),
            KeySource::SecretsManager {
                id: "arn:aws:secretsmanager:us-east-1:1:secret:x".into(),
                field: None
            }
        );
        let s = KeySource::parse("secretsmanager:cluster/k#munge_key").unwrap();
        assert_eq!(s.field(), Some("munge_key"));
        assert_eq!(
            s.to_string(),
            "Secrets Manager secret cluster/k (JSON field \"munge_key\")"
        );
        assert_eq!(
            KeySource::parse("ssm:/k#f").unwrap(),
            KeySource::Ssm {
                name: "/k".into(),
                field: Some("f".into())
            }
        );
        for bad in [
            "",
            "ssm:",
            "s3:x",
            "file:relative",
            "ssm:a b",
            "ssm:a\nb",
            "ssm:/k#",
            "ssm:#f",
            "ssm:/k#a#b",
        ] {
            assert!(KeySource::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn plugin_defaults() {
        let t = munge();
        assert_eq!(t.path, PathBuf::from("/etc/munge/munge.key"));
        assert_eq!(t.owner, "munge");
        let s = AuthSettings {
            auth_type: AuthType::Slurm,
            ..Default::default()
        };
        let t = KeyTarget::from_settings(&s);
        assert_eq!(
            (t.path.to_str().unwrap(), t.owner.as_str()),
            ("/etc/slurm/slurm.key", "slurm")
        );
    }

    #[test]
    fn decode_checks_encoding_and_size_without_leaking() {
        let src = KeySource::Ssm {
            name: "/k".into(),
            field: None,
        };
        let raw = vec![7u8; 64];
        let b64 = base64::engine::general_purpose::STANDARD.encode(&raw);
        let k = decode(
            &src,
            format!("{b64}\n").as_bytes(),
            KeyEncoding::Base64,
            &munge(),
        )
        .unwrap();
        assert_eq!(k.len(), 64);
        assert_eq!(format!("{k:?}"), "Key(64 bytes)");
        let short = base64::engine::general_purpose::STANDARD.encode([1u8; 8]);
        let e = decode(&src, short.as_bytes(), KeyEncoding::Base64, &munge()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "SSM parameter /k: the key is 8 bytes; auth/munge needs 32 to 1024 bytes"
        );
        let e = decode(&src, b"  \n", KeyEncoding::Base64, &munge()).unwrap_err();
        assert!(matches!(e, KeyError::Empty { .. }));
        let secret = "not*base64*secret-material";
        let e = decode(&src, secret.as_bytes(), KeyEncoding::Base64, &munge()).unwrap_err();
        assert!(!e.to_string().contains(secret), "{e}");
        // No byte value or offset either (the decoder's own message has both).
        let mut b64 = base64::engine::general_purpose::STANDARD.encode([9u8; 40]);
        b64.replace_range(40..41, "\u{e9}");
        let e = decode(&src, b64.as_bytes(), KeyEncoding::Base64, &munge()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "SSM parameter /k: the key is not valid base64 (a character outside the base64 \
             alphabet); set auth.key_encoding"
        );
        for (bad, what) in [
            ("QUJDR", "length"),
            ("QUJ=", "last character"),
            ("QQ=", "padding"),
        ] {
            let e = decode(&src, bad.as_bytes(), KeyEncoding::Base64, &munge()).unwrap_err();
            assert!(e.to_string().contains(what), "{bad}: {e}");
            assert!(!e.to_string().contains("offset"), "{e}");
        }
        let e = decode(&src, &[1u8; 2000], KeyEncoding::Raw, &munge()).unwrap_err();
        assert!(matches!(e, KeyError::WrongSize { len: 2000, .. }));
    }

    #[test]
    fn key_value_secrets_need_a_field_and_never_leak_values() {
        let b64 = base64::engine::general_purpose::STANDARD.encode([5u8; 32]);
        let json = format!("{{\"munge_key\": \"{b64}\", \"other\": 1}}");
        let plain = KeySource::parse("secretsmanager:cluster/k").unwrap();
        for enc in [KeyEncoding::Base64, KeyEncoding::Raw] {
            let e = decode(&plain, json.as_bytes(), enc, &munge()).unwrap_err();
            assert_eq!(
                e.to_string(),
                "Secrets Manager secret cluster/k: the value is a JSON object (a key/value \
                 secret), not a key: name the field that holds the key, e.g. \
                 auth.key_source = \"secretsmanager:cluster/k#FIELD\""
            );
        }
        let with = KeySource::parse("secretsmanager:cluster/k#munge_key").unwrap();
        let k = decode(&with, json.as_bytes(), KeyEncoding::Base64, &munge()).unwrap();
        assert_eq!(k.0, vec![5u8; 32]);
        let missing = KeySource::parse("ssm:/k#key").unwrap();
        let e = decode(&missing, json.as_bytes(), KeyEncoding::Base64, &munge()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "SSM parameter /k (JSON field \"key\"): the JSON object has no field \"key\" \
             (it has: munge_key, other)"
        );
        let e = decode(&missing, b64.as_bytes(), KeyEncoding::Base64, &munge()).unwrap_err();
        assert!(e
            .to_string()
            .contains("was named but the value is not a JSON object"));
        assert!(!e.to_string().contains(&b64[..8]), "{e}");
        let other = KeySource::parse("ssm:/k#other").unwrap();
        let e = decode(&other, json.as_bytes(), KeyEncoding::Base64, &munge()).unwrap_err();
        assert!(e.to_string().contains("is not a string"), "{e}");
    }

    #[test]
    fn install_is_atomic_idempotent_and_0400() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("munge.key");
        let me = Owner {
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
        };
        let key = Key(vec![1u8; 32]);
        assert!(install(&key, &p, me).unwrap());
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o7777, 0o400);
        assert!(!install(&key, &p, me).unwrap(), "same key rewritten");
        assert!(install(&Key(vec![2u8; 32]), &p, me).unwrap());
        assert_eq!(std::fs::read(&p).unwrap(), vec![2u8; 32]);
    }

    #[test]
    fn unknown_owner_is_an_error() {
        let e = resolve_owner("no-such-user-xyz").unwrap_err();
        assert!(e.to_string().contains("no-such-user-xyz"));
    }
}
