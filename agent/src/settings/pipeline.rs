//! The one settings pipeline, in the spirit of zincati's `config/`: fragments → inputs →
//! validated settings.
//!
//! - **Fragments**: the settings files ([`super::file_layers`]), the instance's metadata
//!   ([`Metadata`]: the user data's settings parts and the `slurm-node-agent:` tags, read
//!   from IMDS or as bootstrap recorded them), and the flags.
//! - **Inputs** ([`Inputs`]): those fragments in precedence order, each read and parsed
//!   once per start: the user data is parsed when the instance is read
//!   ([`Metadata::of_instance`]), not again for each resolution.
//! - **Settings** ([`Inputs::resolve`]): merged, trust-checked and validated into
//!   [`Resolved`]; the one entry point bootstrap, the daemon and every command call
//!   (through the identity module, which chooses the metadata: IMDS's or bootstrap's
//!   record).

use std::collections::BTreeMap;

use super::{Enforce, Layer, Paths, Resolved, SettingsError, Source, TAG_PREFIX};
use crate::imds::InstanceIdentity;
use crate::userdata::SettingsPart;

/// The settings an instance's metadata carries: its user data's settings parts (TOML, in
/// document order) and its `slurm-node-agent:<key>` tags.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Metadata {
    /// The user data's settings parts ([`crate::userdata::settings_parts`]).
    pub user_data: Vec<SettingsPart>,
    /// The tags that set settings (key with [`TAG_PREFIX`]), key to value.
    pub tags: BTreeMap<String, String>,
}

impl Metadata {
    /// Parses `id`'s user data (once) and picks its settings tags.
    ///
    /// # Errors
    /// [`SettingsError`] naming the user data part.
    pub fn of_instance(id: &InstanceIdentity) -> Result<Metadata, SettingsError> {
        Ok(Metadata {
            user_data: user_data_parts(id.user_data.as_deref())?,
            tags: setting_tags(&id.tags),
        })
    }

    /// The same without tags: what chooses where the tags come from (`imds.tags` is never
    /// a tag's to set).
    pub fn without_tags(&self) -> Metadata {
        Metadata {
            user_data: self.user_data.clone(),
            tags: BTreeMap::new(),
        }
    }

    /// The layers, user data parts first (each its own layer: later parts override
    /// earlier ones, and an error names its part and a line of it), then each tag.
    /// A bad tag is ignored with a warning under [`Enforce::WarnAndIgnore`] (anyone with
    /// `ec2:CreateTags` can write one; it must not lock operators out).
    ///
    /// # Errors
    /// [`SettingsError`] naming the user data part or the tag.
    pub fn layers(&self, enforce: Enforce) -> Result<Vec<Layer>, SettingsError> {
        let mut layers = Vec::new();
        for part in &self.user_data {
            layers.push(Layer::from_toml(Source::UserData(part.index), &part.text)?);
        }
        for (k, v) in &self.tags {
            match Layer::from_tags([(k.as_str(), v.as_str())]) {
                Ok(l) => layers.extend(l),
                Err(e) if enforce == Enforce::WarnAndIgnore => tracing::warn!("{e}; ignored"),
                Err(e) => return Err(e),
            }
        }
        Ok(layers)
    }
}

/// The settings parts of user data as served (text, gzip, MIME multipart), in document
/// order; none without user data.
///
/// # Errors
/// [`SettingsError`] naming the user data part.
pub fn user_data_parts(user_data: Option<&[u8]>) -> Result<Vec<SettingsPart>, SettingsError> {
    let Some(ud) = user_data else {
        return Ok(Vec::new());
    };
    crate::userdata::settings_parts(ud).map_err(|e| SettingsError::Parse {
        origin: Source::UserData(e.part()),
        message: e.detail(),
    })
}

/// The tags among `tags` that set settings (key starting with [`TAG_PREFIX`]).
pub fn setting_tags(tags: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    tags.iter()
        .filter(|(k, _)| k.starts_with(TAG_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The fragments of one resolution, in precedence order: files, the instance's metadata
/// (when known), flags.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// The settings files' layers (main file, then drop-ins).
    pub files: Vec<Layer>,
    /// The instance's metadata; `None` before it is read, or where it is never read.
    pub metadata: Option<Metadata>,
    /// The flags' layers (highest precedence).
    pub flags: Vec<Layer>,
}

impl Inputs {
    /// Reads the files at `paths`, with `flags` on top; no metadata yet.
    ///
    /// # Errors
    /// [`SettingsError`] naming the file, line, column and key.
    pub fn read(paths: &Paths, flags: &[Layer]) -> Result<Inputs, SettingsError> {
        Ok(Inputs {
            files: super::file_layers(paths)?,
            metadata: None,
            flags: flags.to_vec(),
        })
    }

    /// The same files and flags with `metadata`.
    pub fn with_metadata(&self, metadata: Metadata) -> Inputs {
        Inputs {
            files: self.files.clone(),
            metadata: Some(metadata),
            flags: self.flags.clone(),
        }
    }

    /// The same files and flags without metadata: what the files and flags alone say
    /// (where IMDS is, the state folder, a NodeName given as a flag).
    pub fn without_metadata(&self) -> Inputs {
        Inputs {
            files: self.files.clone(),
            metadata: None,
            flags: self.flags.clone(),
        }
    }

    /// Merges the layers in precedence order and validates the result: the settings.
    /// `enforce`: what a key from a source below its trust class does (bootstrap refuses
    /// it, exit 78; the daemon, `config show` and the operator commands warn and ignore
    /// it).
    ///
    /// # Errors
    /// [`SettingsError`] naming the source and the key.
    pub fn resolve(&self, enforce: Enforce) -> Result<Resolved, SettingsError> {
        let mut layers = self.files.clone();
        if let Some(m) = &self.metadata {
            layers.extend(m.layers(enforce)?);
        }
        layers.extend(self.flags.iter().cloned());
        Resolved::merge_with(&layers, enforce)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Precedence: files < user data parts (in order) < tags < flags; a bad tag is
    /// ignored when warning, refused otherwise.
    #[test]
    fn the_fragments_resolve_in_precedence_order() {
        let files = vec![Layer::from_toml(
            Source::File("/etc/slurm-node-agent/agent.toml".into()),
            "[node]\nname = \"from-file\"\nfeatures = [\"file\"]\n",
        )
        .unwrap()];
        let metadata = Metadata {
            user_data: vec![
                SettingsPart {
                    index: 1,
                    text: "[node]\nname = \"from-part-1\"\nweight = 7\n".into(),
                },
                SettingsPart {
                    index: 2,
                    text: "[node]\nname = \"from-part-2\"\n".into(),
                },
            ],
            tags: [(format!("{TAG_PREFIX}node.name"), "from-tag".to_string())].into(),
        };
        let inputs = Inputs {
            files,
            metadata: None,
            flags: Vec::new(),
        };
        let r = inputs.resolve(Enforce::Refuse).unwrap();
        assert_eq!(r.settings.node.name, "from-file");

        let with = inputs.with_metadata(metadata.without_tags());
        let r = with.resolve(Enforce::Refuse).unwrap();
        assert_eq!(r.settings.node.name, "from-part-2");
        assert_eq!(r.settings.node.weight, 7);
        assert_eq!(r.source_of("node.name"), Source::UserData(2));

        let with = inputs.with_metadata(metadata.clone());
        let r = with.resolve(Enforce::Refuse).unwrap();
        assert_eq!(r.settings.node.name, "from-tag");

        let mut flagged = with.clone();
        flagged.flags =
            vec![Layer::from_key_value(Source::Flag, "node.name", "from-flag").unwrap()];
        let r = flagged.resolve(Enforce::Refuse).unwrap();
        assert_eq!(r.settings.node.name, "from-flag");
        assert_eq!(r.source_of("node.name"), Source::Flag);
        assert_eq!(
            flagged
                .without_metadata()
                .resolve(Enforce::Refuse)
                .unwrap()
                .settings
                .node
                .weight,
            super::super::Settings::default().node.weight,
            "the user data's weight outlived without_metadata"
        );

        let bad = inputs.with_metadata(Metadata {
            user_data: Vec::new(),
            tags: [(format!("{TAG_PREFIX}node.nope"), "x".to_string())].into(),
        });
        assert!(bad.resolve(Enforce::WarnAndIgnore).is_ok());
        let e = bad.resolve(Enforce::Refuse).unwrap_err().to_string();
        assert!(e.contains("node.nope"), "{e}");
    }
}
