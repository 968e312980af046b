//! Layered settings, read once and validated once into [`Settings`].
//!
//! Layers, lowest to highest precedence:
//! 1. built-in defaults ([`Settings::default`]);
//! 2. the main file, `/etc/slurm-node-agent/agent.toml` (baked into the image);
//! 3. drop-ins `/etc/slurm-node-agent/conf.d/*.toml`, in name order (cloud-init's
//!    `write_files`, or the image);
//! 4. a part of MIME multipart user data whose content type is [`USER_DATA_CONTENT_TYPE`]
//!    (other parts, and user data that is not multipart, are ignored);
//! 5. instance tags whose key starts with the prefix [`TAG_PREFIX`] followed by a dotted
//!    key, e.g. tag `slurm-node-agent:node.name` = `gpu-001`;
//! 6. command-line flags (`--set node.name=gpu-001`, and the shorthand flags).
//!
//! Every layer is checked on its own against the same schema (unknown keys are errors, types
//! must match), so an error always names its source (file with line and column, user data,
//! tag key or flag) and the key. [`Resolved`] keeps the source of every value for
//! `slurm-node-agent config show`.

mod schema;

pub use schema::*;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// Default main settings file.
pub const DEFAULT_FILE: &str = "/etc/slurm-node-agent/agent.toml";
/// Default drop-in folder.
pub const DEFAULT_DROPIN_DIR: &str = "/etc/slurm-node-agent/conf.d";
/// Prefix of the instance tags that set keys: `slurm-node-agent:<section>.<key>`.
pub const TAG_PREFIX: &str = "slurm-node-agent:";
/// MIME content type of the user-data part that carries settings (TOML text).
pub const USER_DATA_CONTENT_TYPE: &str = "application/x-slurm-node-agent";

/// Where a setting came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Built-in default.
    Default,
    /// A settings file (main file or drop-in).
    File(PathBuf),
    /// A settings part of the instance's user data, by its 1-based position among the
    /// document's leaf parts (0: the user data as a whole).
    UserData(usize),
    /// An instance tag, by its full key.
    Tag(String),
    /// A command-line flag.
    Flag,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File(p) => write!(f, "{}", p.display()),
            Source::UserData(0) => f.write_str("user data"),
            Source::UserData(n) => write!(f, "user data part {n} ({USER_DATA_CONTENT_TYPE})"),
            Source::Tag(k) => write!(f, "instance tag {k:?}"),
            Source::Flag => f.write_str("command line"),
        }
    }
}

/// A settings error; its text names the source and, where there is one, the key.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// TOML syntax or schema error in a file or the user-data part (the message carries the
    /// line and column, and names the key).
    #[error("{origin}: {message}")]
    Parse {
        /// Where the text came from.
        origin: Source,
        /// toml's message, with line, column and the offending key.
        message: String,
    },
    /// A single key's value is invalid.
    #[error("{origin}: key `{key}`: {message}")]
    Key {
        /// Where the value came from.
        origin: Source,
        /// Dotted key, e.g. `node.name`.
        key: String,
        /// What is wrong.
        message: String,
    },
}

/// One layer: a TOML table and where it came from.
#[derive(Debug, Clone)]
pub struct Layer {
    /// Source of every key in the table.
    pub source: Source,
    /// The keys.
    pub table: toml::Table,
}

impl Layer {
    /// Parses TOML text from `source` and checks it against the schema.
    ///
    /// # Errors
    /// [`SettingsError::Parse`] with line, column and key.
    pub fn from_toml(source: Source, text: &str) -> Result<Layer, SettingsError> {
        let parse_err = |e: toml::de::Error| SettingsError::Parse {
            origin: source.clone(),
            message: e.to_string().trim_end().to_string(),
        };
        // Deserializing from the text (not from the table) keeps line and column in errors.
        toml::from_str::<Settings>(text).map_err(parse_err)?;
        let table = text.parse::<toml::Table>().map_err(parse_err)?;
        Ok(Layer { source, table })
    }

    /// Reads a TOML file. A missing file is `Ok(None)`.
    ///
    /// # Errors
    /// [`SettingsError::Read`] or [`SettingsError::Parse`].
    pub fn from_file(path: &Path) -> Result<Option<Layer>, SettingsError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Layer::from_toml(Source::File(path.to_path_buf()), &text).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(SettingsError::Read {
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    /// Reads the drop-ins `*.toml` of a folder in name order. A missing folder has none.
    ///
    /// # Errors
    /// As [`Layer::from_file`].
    pub fn from_dropin_dir(dir: &Path) -> Result<Vec<Layer>, SettingsError> {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(SettingsError::Read {
                    path: dir.to_path_buf(),
                    source,
                })
            }
        };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "toml") && p.is_file())
            .collect();
        paths.sort();
        let mut layers = Vec::new();
        for p in paths {
            layers.extend(Layer::from_file(&p)?);
        }
        Ok(layers)
    }

    /// One `key=value` pair given as a string (a tag or a flag): the value is converted to
    /// the key's type (lists are comma separated) and checked.
    ///
    /// # Errors
    /// [`SettingsError::Key`] for an unknown key or a value of the wrong shape.
    pub fn from_key_value(source: Source, key: &str, value: &str) -> Result<Layer, SettingsError> {
        let key_err = |message: String| SettingsError::Key {
            origin: source.clone(),
            key: key.to_string(),
            message,
        };
        let kind = key_kind(key).ok_or_else(|| {
            key_err(format!(
                "unknown key; known keys: {}",
                known_keys().join(", ")
            ))
        })?;
        let v = match kind {
            Kind::String => toml::Value::String(value.to_string()),
            Kind::Integer => value
                .trim()
                .parse::<i64>()
                .map(toml::Value::Integer)
                .map_err(|_| key_err(format!("expected an integer, got {value:?}")))?,
            Kind::Bool => match value.trim() {
                "true" => toml::Value::Boolean(true),
                "false" => toml::Value::Boolean(false),
                _ => return Err(key_err(format!("expected true or false, got {value:?}"))),
            },
            Kind::List => toml::Value::Array(
                value
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|s| toml::Value::String(s.to_string()))
                    .collect(),
            ),
        };
        let mut table = toml::Table::new();
        let (section, leaf) = key.split_once('.').unwrap_or(("", key));
        let mut inner = toml::Table::new();
        inner.insert(leaf.to_string(), v);
        table.insert(section.to_string(), toml::Value::Table(inner));
        toml::Value::Table(table.clone())
            .try_into::<Settings>()
            .map_err(|e| key_err(e.to_string().trim_end().to_string()))?;
        Ok(Layer { source, table })
    }

    /// The `key=value` tags that carry settings (those under [`TAG_PREFIX`]); other tags are
    /// ignored.
    ///
    /// # Errors
    /// As [`Layer::from_key_value`], naming the tag.
    pub fn from_tags<'a>(
        tags: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Vec<Layer>, SettingsError> {
        tags.into_iter()
            .filter_map(|(k, v)| k.strip_prefix(TAG_PREFIX).map(|key| (k, key, v)))
            .map(|(full, key, v)| Layer::from_key_value(Source::Tag(full.to_string()), key, v))
            .collect()
    }
}

/// What type a key holds, from the defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    String,
    Integer,
    Bool,
    List,
}

fn default_table() -> toml::Table {
    toml::Table::try_from(Settings::default()).unwrap_or_default()
}

fn leaves(table: &toml::Table, prefix: &str, out: &mut Vec<(String, toml::Value)>) {
    for (k, v) in table {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(t) => leaves(t, &key, out),
            _ => out.push((key, v.clone())),
        }
    }
}

fn known_keys() -> Vec<String> {
    let mut out = Vec::new();
    leaves(&default_table(), "", &mut out);
    out.into_iter().map(|(k, _)| k).collect()
}

fn key_kind(key: &str) -> Option<Kind> {
    let mut out = Vec::new();
    leaves(&default_table(), "", &mut out);
    out.into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| match v {
            toml::Value::String(_) => Kind::String,
            toml::Value::Integer(_) => Kind::Integer,
            toml::Value::Boolean(_) => Kind::Bool,
            _ => Kind::List,
        })
}

/// Settings merged from all layers, with the source of each value.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The typed, validated settings.
    pub settings: Settings,
    /// Source of every dotted key that a layer set (keys absent here are defaults).
    pub sources: BTreeMap<String, Source>,
}

impl Resolved {
    /// Merges layers in the order given (later wins, key by key; lists are replaced, not
    /// appended) over the defaults, and validates the result.
    ///
    /// # Errors
    /// [`SettingsError`] naming the source of the offending key.
    pub fn merge(layers: &[Layer]) -> Result<Resolved, SettingsError> {
        let mut merged = toml::Table::new();
        let mut sources = BTreeMap::new();
        for layer in layers {
            let mut lv = Vec::new();
            leaves(&layer.table, "", &mut lv);
            for (key, value) in lv {
                sources.insert(key.clone(), layer.source.clone());
                let mut parts: Vec<&str> = key.split('.').collect();
                let last = parts.pop().unwrap_or_default();
                let mut t = &mut merged;
                for p in parts {
                    let entry = t
                        .entry(p.to_string())
                        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
                    if !entry.is_table() {
                        *entry = toml::Value::Table(toml::Table::new());
                    }
                    t = match entry {
                        toml::Value::Table(inner) => inner,
                        _ => unreachable!("made a table above"),
                    };
                }
                t.insert(last.to_string(), value);
            }
        }
        let settings: Settings =
            toml::Value::Table(merged)
                .try_into()
                .map_err(|e: toml::de::Error| SettingsError::Parse {
                    origin: Source::Default,
                    message: e.to_string(),
                })?;
        let resolved = Resolved { settings, sources };
        resolved
            .settings
            .validate()
            .map_err(|(key, message)| SettingsError::Key {
                origin: resolved.source_of(&key),
                key,
                message,
            })?;
        Ok(resolved)
    }

    /// Where the value of a dotted key came from.
    pub fn source_of(&self, key: &str) -> Source {
        self.sources.get(key).cloned().unwrap_or(Source::Default)
    }

    /// Every key with its value (as TOML) and its source, in key order, for `config show`.
    /// Secret values never appear: the key itself is never a setting, only where to get it.
    pub fn entries(&self) -> Vec<(String, toml::Value, Source)> {
        let table = toml::Table::try_from(&self.settings).unwrap_or_default();
        let mut out = Vec::new();
        leaves(&table, "", &mut out);
        out.into_iter()
            .map(|(k, v)| {
                let s = self.source_of(&k);
                (k, v, s)
            })
            .collect()
    }
}

/// Where to read the file layers from.
#[derive(Debug, Clone)]
pub struct Paths {
    /// Main file.
    pub file: PathBuf,
    /// Drop-in folder.
    pub dropin_dir: PathBuf,
}

impl Default for Paths {
    fn default() -> Self {
        Paths {
            file: PathBuf::from(DEFAULT_FILE),
            dropin_dir: PathBuf::from(DEFAULT_DROPIN_DIR),
        }
    }
}

/// Reads the file layers (main file, then drop-ins) in precedence order.
///
/// # Errors
/// [`SettingsError`] naming the file, line, column and key.
pub fn file_layers(paths: &Paths) -> Result<Vec<Layer>, SettingsError> {
    let mut layers: Vec<Layer> = Layer::from_file(&paths.file)?.into_iter().collect();
    layers.extend(Layer::from_dropin_dir(&paths.dropin_dir)?);
    Ok(layers)
}

#[cfg(test)]
mod tests;
