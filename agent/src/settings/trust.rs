//! Who may change what: every settings key carries a [`Trust`] class, declared next to its
//! section's type (`impl Classified for <Section>`), and [`super::Resolved::merge`] enforces
//! it layer by layer.
//!
//! Sources, most trusted first:
//! - the image: built-in defaults, root-owned settings files that no group or other user
//!   can write ([`check_image_file`]), and the command line (root runs it);
//! - the user data part: written by whoever may launch the instance (`ec2:RunInstances`
//!   with the launch template) or change a stopped instance's attribute;
//! - instance tags: written by whoever holds `ec2:CreateTags` on the instance, at any time.
//!
//! A key's class is the least trusted source that may set it. Keys that name a path, a
//! program, an owner, a unit, a binary folder, an endpoint or a hook are [`Trust::Image`].

use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::Source;

/// The least trusted source that may set a key. Ordered from most to least trusted, so
/// `source_class <= key_class` means the source may set the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
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

impl Source {
    /// The class of this source: defaults, files and flags are [`Trust::Image`].
    pub fn trust(&self) -> Trust {
        match self {
            Source::Default | Source::File(_) | Source::Flag => Trust::Image,
            Source::UserData(_) => Trust::UserData,
            Source::Tag(_) => Trust::Tag,
        }
    }
}

/// A check of the value a source below [`Trust::Image`] gives: what it may choose within the
/// key (e.g. which secret, but not a file). Returns what is refused.
pub type LowerGuard = fn(&toml::Value) -> Result<(), String>;

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

/// Every section's classes, in schema order.
pub fn sections() -> [(&'static str, &'static [KeyTrust]); 13] {
    fn s<T: Classified>() -> (&'static str, &'static [KeyTrust]) {
        (T::SECTION, T::TRUST)
    }
    [
        s::<super::Node>(),
        s::<super::Slurm>(),
        s::<super::Auth>(),
        s::<super::Imds>(),
        s::<super::Systemd>(),
        s::<super::Agent>(),
        s::<crate::mounts::MountSettings>(),
        s::<crate::events::EventsSettings>(),
        s::<crate::upgrade::UpgradeSettings>(),
        s::<crate::drain::DrainSettings>(),
        s::<crate::health::HealthSettings>(),
        s::<crate::pcs::PcsSettings>(),
        s::<crate::node_lifecycle::NodeLifecycleSettings>(),
    ]
}

/// The class of a dotted key (`node.name`, `mounts`). A key without one is
/// [`Trust::Image`] (the safe side; a test keeps the tables complete).
pub fn class_of(key: &str) -> KeyTrust {
    let (section, leaf) = key.split_once('.').unwrap_or((key, ""));
    sections()
        .into_iter()
        .filter(|(s, _)| *s == section)
        .flat_map(|(_, keys)| keys.iter())
        .find(|k| k.key == leaf || (leaf.is_empty() && k.key == section))
        .copied()
        .unwrap_or(KeyTrust::image("?"))
}

/// Every dotted key with its class, in schema order.
pub fn all_keys() -> Vec<(String, KeyTrust)> {
    sections()
        .into_iter()
        .flat_map(|(section, keys)| {
            keys.iter().map(move |k| {
                let name = if k.key == section {
                    section.to_string()
                } else {
                    format!("{section}.{}", k.key)
                };
                (name, *k)
            })
        })
        .collect()
}

/// Whether `source` may set `key` to `value`; the message says why not.
///
/// # Errors
/// What is refused, naming the class.
pub fn admit(key: &str, value: &toml::Value, source: &Source) -> Result<(), String> {
    let class = class_of(key);
    let from = source.trust();
    if from > class.trust {
        return Err(format!(
            "may not be set from {}: trust class `{}` (only {}; see \"Who may set what\" in docs/operator-guide.md)",
            match from {
                Trust::Tag => "an instance tag",
                _ => "user data",
            },
            class.trust,
            match class.trust {
                Trust::Image => "root-owned settings files of the image and the command line",
                _ => "image files, the command line and user data",
            }
        ));
    }
    if from > Trust::Image {
        if let Some(guard) = class.lower {
            guard(value)?;
        }
    }
    Ok(())
}

/// The table of keys × sources in `docs/settings.md` (GitHub markdown), generated from the
/// classes.
pub fn markdown_table() -> String {
    let mut s = String::from(
        "| key | class | image files, command line | user data | tags |\n|---|---|---|---|---|\n",
    );
    for (key, k) in all_keys() {
        let cell = |t: Trust| match (k.trust >= t, k.lower.is_some()) {
            (true, true) => "limited",
            (true, false) => "yes",
            (false, _) => "no",
        };
        let (ud, tag) = (cell(Trust::UserData), cell(Trust::Tag));
        s.push_str(&format!("| `{key}` | {} | yes | {ud} | {tag} |\n", k.trust));
    }
    s
}

/// Most bytes of one settings file (the main file or a drop-in).
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// Checks that a settings file may count as part of the image: owned by root (or by the
/// user running the agent, for tests and development as that user) and not writable by
/// its group or others; its folder likewise (a sticky folder such as `/tmp` protects
/// root's files from other users).
///
/// # Errors
/// What is wrong, naming owner and mode.
pub fn check_image_file(path: &Path, meta: &std::fs::Metadata) -> Result<(), String> {
    let euid = rustix::process::geteuid().as_raw();
    let owner_ok = |uid: u32| uid == 0 || uid == euid;
    if !owner_ok(meta.uid()) {
        return Err(format!(
            "owned by uid {}, not root: a settings file must be part of the image (root-owned, not group or world writable)",
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "mode {:o} lets its group or others write it: a settings file must be part of the image (chmod go-w)",
            meta.mode() & 0o7777
        ));
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(d) = std::fs::metadata(dir) {
            let sticky = d.mode() & 0o1000 != 0;
            if !owner_ok(d.uid()) || (d.mode() & 0o022 != 0 && !sticky) {
                return Err(format!(
                    "its folder {} (uid {}, mode {:o}) can be written by others: a settings file must be part of the image",
                    dir.display(),
                    d.uid(),
                    d.mode() & 0o7777
                ));
            }
        }
    }
    Ok(())
}

/// `auth.key_source` from user data or a tag may pick a secret (`ssm:`,
/// `secretsmanager:`), never a file on the node: that would copy any root-readable file
/// into the key file, which the munge user reads.
pub fn secret_sources_only(v: &toml::Value) -> Result<(), String> {
    match v.as_str() {
        Some(s) if s.is_empty() || s.starts_with("ssm:") || s.starts_with("secretsmanager:") => {
            Ok(())
        }
        _ => Err(
            "from user data or a tag only ssm: and secretsmanager: sources (which secret, never a file on the node)".into(),
        ),
    }
}

/// `[[mounts]]` from user data: no unit dependencies (`x-systemd.requires=`, `after=`,
/// `before=` in `options` or `extra_options`; `lnet = true` is the image's
/// `lnet.service`): a dependency starts any unit as root.
pub fn mounts_without_unit_options(v: &toml::Value) -> Result<(), String> {
    let Some(list) = v.as_array() else {
        return Ok(());
    };
    for (i, m) in list.iter().enumerate() {
        for field in ["options", "extra_options"] {
            let Some(o) = m.get(field).and_then(toml::Value::as_str) else {
                continue;
            };
            if let Some(bad) = o
                .split(',')
                .find(|o| o.starts_with("x-systemd.") && !o.starts_with("x-systemd.mount-timeout="))
            {
                return Err(format!(
                    "mounts[{i}].{field}: {bad:?}: unit dependencies come only from image files and the command line"
                ));
            }
        }
    }
    Ok(())
}
