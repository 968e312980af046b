//! Who may change what, enforced: every settings key carries a [`Trust`] class, declared
//! next to its section's type (`impl Classified for <Section>`, the machinery in
//! [`crate::section`]), and [`super::Resolved::merge`] enforces it layer by layer
//! ([`admit`]). Settings files count as the image only when [`check_image_file`] says so.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::Source;
pub use crate::section::{Classified, KeyTrust, LowerGuard, Refused, Trust};

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

/// Every section's classes, in schema order.
pub fn sections() -> [(&'static str, &'static [KeyTrust]); 18] {
    fn s<T: Classified>() -> (&'static str, &'static [KeyTrust]) {
        (T::SECTION, T::TRUST)
    }
    [
        s::<crate::nodedef::NodeSettings>(),
        s::<crate::slurm::SlurmSettings>(),
        s::<crate::authkey::AuthSettings>(),
        s::<crate::imds::ImdsSettings>(),
        s::<crate::systemd::SystemdSettings>(),
        s::<super::Agent>(),
        s::<crate::mounts::MountSettings>(),
        s::<crate::events::EventsSettings>(),
        s::<crate::upgrade::UpgradeSettings>(),
        s::<crate::drain::DrainSettings>(),
        s::<crate::health::HealthSettings>(),
        s::<crate::pcs::PcsSettings>(),
        s::<crate::node_lifecycle::NodeLifecycleSettings>(),
        s::<crate::scratch::ScratchSettings>(),
        s::<crate::repair::RepairSettings>(),
        s::<crate::gate::StartGateSettings>(),
        s::<crate::orphan::OrphanSettings>(),
        s::<crate::cloudwatch::CloudWatchSettings>(),
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

/// Why a source may not set a key ([`admit`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotAdmitted {
    /// The source is below the key's class.
    #[error(
        "may not be set from {}: trust class `{class}` (only {}; see \"Who may set what\" in docs/operator-guide.md)",
        from_words(*from),
        class_words(*class)
    )]
    BelowClass {
        /// The source's class.
        from: Trust,
        /// The key's class.
        class: Trust,
    },
    /// The key's guard refuses what user data or a tag gives.
    #[error(transparent)]
    Guarded(#[from] Refused),
}

fn from_words(from: Trust) -> &'static str {
    match from {
        Trust::Tag => "an instance tag",
        _ => "user data",
    }
}

fn class_words(class: Trust) -> &'static str {
    match class {
        Trust::Image => "root-owned settings files of the image and the command line",
        _ => "image files, the command line and user data",
    }
}

/// Whether `source` may set `key` to `value`; the error says why not.
///
/// # Errors
/// [`NotAdmitted`]: what is refused, naming the class.
pub fn admit(key: &str, value: &toml::Value, source: &Source) -> Result<(), NotAdmitted> {
    let class = class_of(key);
    let from = source.trust();
    if from > class.trust {
        return Err(NotAdmitted::BelowClass {
            from,
            class: class.trust,
        });
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

/// Why a settings file does not count as part of the image ([`check_image_file`]); the
/// file's path is the caller's to name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotImageFile {
    /// Owned by someone other than root (or the user running the agent).
    #[error("owned by uid {uid}, not root: a settings file must be part of the image (root-owned, not group or world writable)")]
    Owner {
        /// The owner.
        uid: u32,
    },
    /// Its group or others may write it.
    #[error("mode {mode:o} lets its group or others write it: a settings file must be part of the image (chmod go-w)")]
    Mode {
        /// Its permission bits.
        mode: u32,
    },
    /// Others may write its folder.
    #[error("its folder {} (uid {uid}, mode {mode:o}) can be written by others: a settings file must be part of the image", folder.display())]
    Folder {
        /// The folder.
        folder: PathBuf,
        /// The folder's owner.
        uid: u32,
        /// The folder's permission bits.
        mode: u32,
    },
}

/// Checks that a settings file may count as part of the image: owned by root (or by the
/// user running the agent, for tests and development as that user) and not writable by
/// its group or others; its folder likewise (a sticky folder such as `/tmp` protects
/// root's files from other users).
///
/// # Errors
/// [`NotImageFile`]: what is wrong, naming owner and mode.
pub fn check_image_file(path: &Path, meta: &std::fs::Metadata) -> Result<(), NotImageFile> {
    let euid = rustix::process::geteuid().as_raw();
    let owner_ok = |uid: u32| uid == 0 || uid == euid;
    if !owner_ok(meta.uid()) {
        return Err(NotImageFile::Owner { uid: meta.uid() });
    }
    if meta.mode() & 0o022 != 0 {
        return Err(NotImageFile::Mode {
            mode: meta.mode() & 0o7777,
        });
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(d) = std::fs::metadata(dir) {
            let sticky = d.mode() & 0o1000 != 0;
            if !owner_ok(d.uid()) || (d.mode() & 0o022 != 0 && !sticky) {
                return Err(NotImageFile::Folder {
                    folder: dir.to_path_buf(),
                    uid: d.uid(),
                    mode: d.mode() & 0o7777,
                });
            }
        }
    }
    Ok(())
}
