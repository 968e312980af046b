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
//! tag key or flag) and the key, with its line where it has one. [`Resolved`] keeps the
//! source of every value for `slurm-node-agent config show`.
//!
//! Who may set what is data: each key's [`Trust`] class sits next to its section's type
//! ([`Classified`]) and [`Resolved::merge`] enforces it (see [`trust`]). Settings files
//! count as the image only when root-owned and not writable by group or others, and are
//! at most [`trust::MAX_FILE_BYTES`]; explicit paths that do not exist are errors (only the
//! built-in default paths are optional).
//!
//! Floor 8 (assembly): above every module whose section it assembles.

pub mod explain;
pub mod pipeline;
pub mod reference;
mod schema;
pub mod trust;

pub use crate::section::{Classified, HumanDuration, KeyTrust, Trust};
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
pub use crate::userdata::USER_DATA_CONTENT_TYPE;

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
    /// A value a settings text (a file or a user data part) holds that the schema refuses,
    /// or TOML it cannot read: where (line and column), which key (none for a syntax
    /// error), what the key takes with an example ([`explain::rewrite`]), and toml's
    /// snippet of the line with a caret under the value.
    #[error("{origin}, line {line}, column {column}: {message}\n{snippet}")]
    Text {
        /// Where the text came from.
        origin: Source,
        /// Line (1-based).
        line: usize,
        /// Column (1-based, in characters).
        column: usize,
        /// The dotted key, where the error is about one (`health.interval`,
        /// `mounts[0].source`).
        key: Option<String>,
        /// What is wrong, in a settings file's words, starting ``key `…`: `` where there is
        /// a key.
        message: String,
        /// toml's snippet: the line, and a caret line under the offending text.
        snippet: String,
    },
    /// A single key's value is invalid, at a known line of a file or user data part.
    #[error("{origin}, line {line}: key `{key}`: {message}")]
    At {
        /// Where the value came from.
        origin: Source,
        /// Line (1-based) of the key in that text.
        line: usize,
        /// Dotted key, e.g. `events.interval` or `mounts[1].source`.
        key: String,
        /// What is wrong.
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
    /// Line (1-based) of each dotted key in the text it was parsed from (`mounts[1].source`
    /// for an entry of an array of tables); empty for tags and flags.
    pub lines: BTreeMap<String, usize>,
}

/// Most bytes of one TOML text (a file or a user data part) and of one tag or flag value.
pub const MAX_TEXT_BYTES: usize = trust::MAX_FILE_BYTES as usize;
/// Most bytes of one tag or `--set` value (EC2 allows 256 characters in a tag value).
pub const MAX_VALUE_BYTES: usize = 1024;

impl Layer {
    /// A layer from a table that has no text (built from flags).
    pub fn new(source: Source, table: toml::Table) -> Layer {
        Layer {
            source,
            table,
            lines: BTreeMap::new(),
        }
    }

    /// Parses TOML text from `source` and checks it against the schema.
    ///
    /// # Errors
    /// [`SettingsError::Parse`] with line, column and key; text over [`MAX_TEXT_BYTES`].
    pub fn from_toml(source: Source, text: &str) -> Result<Layer, SettingsError> {
        if text.len() > MAX_TEXT_BYTES {
            return Err(SettingsError::Parse {
                origin: source,
                message: format!(
                    "{} bytes: settings text is limited to {MAX_TEXT_BYTES} bytes",
                    text.len()
                ),
            });
        }
        let parse_err = |e: toml::de::Error| text_error(&source, text, &e);
        // Deserializing from the text (not from the table) keeps line and column in errors.
        toml::from_str::<Settings>(text).map_err(parse_err)?;
        let table = text.parse::<toml::Table>().map_err(parse_err)?;
        let mut lines = BTreeMap::new();
        if let Ok(doc) = toml::de::DeTable::parse(text) {
            key_lines(text, doc.get_ref(), "", &mut lines);
        }
        Ok(Layer {
            source,
            table,
            lines,
        })
    }

    /// Reads a TOML file. A missing file is `Ok(None)` when `optional` (the built-in
    /// default path), else an error. The file must count as part of the image
    /// ([`trust::check_image_file`]) and hold at most [`trust::MAX_FILE_BYTES`].
    ///
    /// # Errors
    /// [`SettingsError::Read`] or [`SettingsError::Parse`].
    pub fn from_file(path: &Path, optional: bool) -> Result<Option<Layer>, SettingsError> {
        use std::io::Read;
        let read_err = |source: std::io::Error| SettingsError::Read {
            path: path.to_path_buf(),
            source,
        };
        let invalid = |m: String| read_err(std::io::Error::new(std::io::ErrorKind::InvalidData, m));
        let file = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && optional => return Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(invalid(if path.is_symlink() {
                    "a symbolic link to nothing (dangling)".into()
                } else {
                    "no such file (given explicitly, so it must exist)".into()
                }))
            }
            Err(e) => return Err(read_err(e)),
        };
        let meta = file.metadata().map_err(read_err)?;
        if !meta.is_file() {
            return Err(invalid("not a regular file".into()));
        }
        trust::check_image_file(path, &meta)
            .map_err(|e| read_err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
        if meta.len() > trust::MAX_FILE_BYTES {
            return Err(invalid(format!(
                "{} bytes: a settings file is limited to {} bytes",
                meta.len(),
                trust::MAX_FILE_BYTES
            )));
        }
        let mut bytes = Vec::new();
        file.take(trust::MAX_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(read_err)?;
        if bytes.len() as u64 > trust::MAX_FILE_BYTES {
            return Err(invalid(format!(
                "a settings file is limited to {} bytes",
                trust::MAX_FILE_BYTES
            )));
        }
        let text = String::from_utf8(bytes).map_err(|e| {
            invalid(format!(
                "not UTF-8 text (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ))
        })?;
        Layer::from_toml(Source::File(path.to_path_buf()), &text).map(Some)
    }

    /// Reads the drop-ins `*.toml` of a folder in name order. A missing folder has none when
    /// `optional` (the built-in default folder); an entry named `*.toml` that is a folder or
    /// a dangling symbolic link is an error.
    ///
    /// # Errors
    /// As [`Layer::from_file`].
    pub fn from_dropin_dir(dir: &Path, optional: bool) -> Result<Vec<Layer>, SettingsError> {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && optional => return Ok(Vec::new()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(SettingsError::Read {
                    path: dir.to_path_buf(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "no such folder (given explicitly, so it must exist)",
                    ),
                })
            }
            Err(source) => {
                return Err(SettingsError::Read {
                    path: dir.to_path_buf(),
                    source,
                })
            }
        };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect();
        paths.sort();
        let mut layers = Vec::new();
        for p in paths {
            layers.extend(Layer::from_file(&p, false)?);
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
        if value.len() > MAX_VALUE_BYTES {
            return Err(key_err(format!(
                "value of {} bytes: at most {MAX_VALUE_BYTES}",
                value.len()
            )));
        }
        let kind = key_kind(key).ok_or_else(|| {
            key_err(explain::unknown_key(key).replacen(
                &format!("unknown key `{key}`"),
                "unknown key",
                1,
            ))
        })?;
        if kind == Kind::Tables {
            return Err(key_err(format!(
                "an array of tables cannot be set from {}: write it in a settings file or a \
                 user data part; for example `{}`",
                match source {
                    Source::Tag(_) => "a tag",
                    _ => "the command line",
                },
                explain::describe(key)
                    .map(|h| h.example)
                    .unwrap_or_default()
            )));
        }
        let v = match kind {
            Kind::String => toml::Value::String(value.to_string()),
            Kind::Integer => value
                .trim()
                .parse::<i64>()
                .map(toml::Value::Integer)
                .map_err(|_| key_err(format!("expected an integer, got {value:?}")))?,
            Kind::Float => value
                .trim()
                .parse::<f64>()
                .map(toml::Value::Float)
                .map_err(|_| key_err(format!("expected a number, got {value:?}")))?,
            Kind::Bool => match value.trim() {
                "true" => toml::Value::Boolean(true),
                "false" => toml::Value::Boolean(false),
                _ => return Err(key_err(format!("expected true or false, got {value:?}"))),
            },
            Kind::Tables => unreachable!("refused above"),
            Kind::List => toml::Value::Array(
                value
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|s| toml::Value::String(s.to_string()))
                    .collect(),
            ),
        };
        // The value at its dotted path (`node_lifecycle.poweroff_unit`: two tables deep).
        let mut value = v;
        for part in key.rsplit('.') {
            let mut t = toml::Table::new();
            t.insert(part.to_string(), value);
            value = toml::Value::Table(t);
        }
        let toml::Value::Table(table) = value else {
            unreachable!("built as a table above")
        };
        toml::Value::Table(table.clone())
            .try_into::<Settings>()
            .map_err(|e| SettingsError::Key {
                origin: source.clone(),
                key: key.to_string(),
                message: strip_key(key, explain::rewrite(key, e.message())),
            })?;
        Ok(Layer::new(source, table))
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

/// A toml error in `text` from `source` as [`SettingsError::Text`]: line and column from
/// its span, the key there, the message in a settings file's words, toml's snippet.
fn text_error(source: &Source, text: &str, e: &toml::de::Error) -> SettingsError {
    let span = e.span().unwrap_or(0..0);
    let before = text.get(..span.start).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    let key = explain::key_at(text, &span);
    let message = match &key {
        Some(k) => explain::rewrite(k, e.message()),
        // A syntax error, or an unknown section at the top: toml's words name no Rust type.
        None => explain::rewrite("", e.message()),
    };
    // toml's text: a heading line, the snippet, then the message; keep the snippet.
    let full = e.to_string();
    let body = full
        .trim_end()
        .strip_suffix(e.message().trim_end())
        .unwrap_or(&full);
    let snippet = body
        .split_once('\n')
        .map_or("", |(_, rest)| rest)
        .trim_end()
        .to_string();
    let key = match &key {
        Some(k) if message.starts_with(&format!("key `{k}`")) => Some(k.clone()),
        _ => message
            .strip_prefix("unknown key `")
            .or_else(|| message.strip_prefix("key `"))
            .and_then(|r| r.split('`').next())
            .map(str::to_string),
    };
    SettingsError::Text {
        origin: source.clone(),
        line,
        column,
        key,
        message,
        snippet,
    }
}

/// `key `x`: rest` → `rest`, where the error names the key already.
fn strip_key(key: &str, message: String) -> String {
    message
        .strip_prefix(&format!("key `{key}`: "))
        .map(str::to_string)
        .unwrap_or(message)
}

/// Records the 1-based line of every key of `table` in `text` (dotted, arrays of tables
/// as `mounts[1].source`).
fn key_lines(
    text: &str,
    table: &toml::de::DeTable<'_>,
    prefix: &str,
    out: &mut BTreeMap<String, usize>,
) {
    let line_of = |offset: usize| text.get(..offset).map_or(0, |t| t.matches('\n').count()) + 1;
    for (k, v) in table {
        let key = if prefix.is_empty() {
            k.get_ref().to_string()
        } else {
            format!("{prefix}.{}", k.get_ref())
        };
        out.entry(key.clone())
            .or_insert_with(|| line_of(k.span().start));
        match v.get_ref() {
            toml::de::DeValue::Table(t) => key_lines(text, t, &key, out),
            toml::de::DeValue::Array(a) => {
                for (i, item) in a.iter().enumerate() {
                    let item_key = format!("{key}[{i}]");
                    out.entry(item_key.clone())
                        .or_insert_with(|| line_of(item.span().start));
                    if let toml::de::DeValue::Table(t) = item.get_ref() {
                        key_lines(text, t, &item_key, out);
                    }
                }
            }
            _ => {}
        }
    }
}

/// What type a key holds, from the defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    String,
    Integer,
    /// A number (`upgrade.fleet_rate`): whole or with a fraction.
    Float,
    Bool,
    List,
    /// An array of tables (`mounts`): only a TOML text sets one.
    Tables,
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

#[cfg(test)]
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
        .map(|(k, v)| match v {
            toml::Value::String(_) => Kind::String,
            toml::Value::Integer(_) => Kind::Integer,
            toml::Value::Float(_) => Kind::Float,
            toml::Value::Boolean(_) => Kind::Bool,
            toml::Value::Array(_) if explain::is_array_of_tables(&k) => Kind::Tables,
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
    /// Line of each key in the text of the layer that set it, where it has one.
    pub lines: BTreeMap<String, usize>,
    /// Keys a source below their trust class tried to set, ignored under
    /// [`Enforce::WarnAndIgnore`]: each message names the source and the key.
    pub refused: Vec<String>,
}

/// What [`Resolved::merge_with`] does with a key set by a source its [`Trust`] class does
/// not admit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforce {
    /// Fail, naming the source and the key (bootstrap: exit 78).
    Refuse,
    /// Log a warning and leave the key out (operator commands and the daemon: a hostile tag
    /// must not lock operators out).
    WarnAndIgnore,
}

/// `mounts[1].source` → `mounts`, `node_lifecycle.node_ready[0].name` →
/// `node_lifecycle.node_ready`: the key a layer sets (arrays are set whole).
fn set_key(key: &str) -> &str {
    match key.find('[') {
        Some(i) => &key[..i],
        None => key,
    }
}

impl Resolved {
    /// Merges layers in the order given (later wins, key by key; lists are replaced, not
    /// appended) over the defaults, and validates the result. A key from a source its trust
    /// class does not admit is an error ([`Enforce::Refuse`]).
    ///
    /// # Errors
    /// [`SettingsError`] naming the source of the offending key (and its line where known).
    pub fn merge(layers: &[Layer]) -> Result<Resolved, SettingsError> {
        Resolved::merge_with(layers, Enforce::Refuse)
    }

    /// [`Resolved::merge`] with a choice of what a refused key does.
    ///
    /// # Errors
    /// As [`Resolved::merge`].
    pub fn merge_with(layers: &[Layer], enforce: Enforce) -> Result<Resolved, SettingsError> {
        match Resolved::merge_layers(layers, enforce) {
            Err(err)
                if enforce == Enforce::WarnAndIgnore
                    && layers.iter().any(|l| matches!(l.source, Source::Tag(_))) =>
            {
                // A tag whose value is bad (wrong type, fails validation) must not lock
                // operators out either: merge again without the instance tags.
                let kept: Vec<Layer> = layers
                    .iter()
                    .filter(|l| !matches!(l.source, Source::Tag(_)))
                    .cloned()
                    .collect();
                match Resolved::merge_layers(&kept, enforce) {
                    Ok(mut r) => {
                        let m = format!("{err}; every setting from instance tags ignored");
                        tracing::warn!("{m}");
                        r.refused.push(m);
                        Ok(r)
                    }
                    Err(_) => Err(err),
                }
            }
            other => other,
        }
    }

    fn merge_layers(layers: &[Layer], enforce: Enforce) -> Result<Resolved, SettingsError> {
        let mut merged = toml::Table::new();
        let mut sources = BTreeMap::new();
        let mut lines = BTreeMap::new();
        let mut refused = Vec::new();
        for layer in layers {
            let mut lv = Vec::new();
            leaves(&layer.table, "", &mut lv);
            for (key, value) in lv {
                if let Err(not_admitted) = trust::admit(&key, &value, &layer.source) {
                    let message = not_admitted.to_string();
                    let err = match layer.lines.get(&key) {
                        Some(&line) => SettingsError::At {
                            origin: layer.source.clone(),
                            line,
                            key: key.clone(),
                            message,
                        },
                        None => SettingsError::Key {
                            origin: layer.source.clone(),
                            key: key.clone(),
                            message,
                        },
                    };
                    match enforce {
                        Enforce::Refuse => return Err(err),
                        Enforce::WarnAndIgnore => {
                            tracing::warn!("{err}; ignored");
                            refused.push(err.to_string());
                            continue;
                        }
                    }
                }
                sources.insert(key.clone(), layer.source.clone());
                lines.retain(|k: &String, _| set_key(k) != key);
                for (k, l) in &layer.lines {
                    if set_key(k) == key {
                        lines.insert(k.clone(), *l);
                    }
                }
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
        let mut settings: Settings =
            toml::Value::Table(merged)
                .try_into()
                .map_err(|e: toml::de::Error| SettingsError::Parse {
                    origin: Source::Default,
                    message: explain::rewrite("", e.message()),
                })?;
        // The managed join uses its clusters' auth/slurm unless a layer says otherwise (and
        // bootstrap refuses any other).
        if settings.pcs.enabled && !sources.contains_key("auth.type") {
            settings.auth.auth_type = crate::pcs::CLUSTER_AUTH;
        }
        let resolved = Resolved {
            settings,
            sources,
            lines,
            refused,
        };
        resolved
            .settings
            .validate()
            .map_err(|e| resolved.key_error(e.key, e.message))?;
        Ok(resolved)
    }

    /// An error about a dotted key, naming the source that set it and its line there, with
    /// an example of a valid setting where the message has none.
    pub fn key_error(&self, key: String, message: String) -> SettingsError {
        let origin = self.source_of(&key);
        let message = match explain::describe(&key) {
            Some(h) if !h.example.is_empty() && !message.contains("for example") => {
                format!("{message}; for example `{}`", h.example)
            }
            _ => message,
        };
        match self.lines.get(&key) {
            Some(&line) => SettingsError::At {
                origin,
                line,
                key,
                message,
            },
            None => SettingsError::Key {
                origin,
                key,
                message,
            },
        }
    }

    /// Where the value of a dotted key came from (`mounts[1].source`: where `mounts` did).
    pub fn source_of(&self, key: &str) -> Source {
        self.sources
            .get(key)
            .or_else(|| self.sources.get(set_key(key)))
            .cloned()
            .unwrap_or(Source::Default)
    }

    /// Every key with its value (as TOML), its source and its trust class, in key order,
    /// for `config show`. Secret values never appear: the key itself is never a setting,
    /// only where to get it.
    pub fn entries(&self) -> Vec<(String, toml::Value, Source, Trust)> {
        let table = toml::Table::try_from(&self.settings).unwrap_or_default();
        let mut out = Vec::new();
        leaves(&table, "", &mut out);
        out.into_iter()
            .map(|(k, v)| {
                let s = self.source_of(&k);
                let t = trust::class_of(&k).trust;
                (k, v, s, t)
            })
            .collect()
    }
}

impl Settings {
    /// The gateway of `node`'s state ([`crate::node_state::Gateway`]): its state under
    /// `agent.state_dir`, `drain.lock` waited for `drain.lock_timeout`, the metrics to
    /// `drain.metrics_file`, through the `scontrol` of `[slurm]` (with the configless
    /// servers, as bootstrap and the health checks reach slurmctld). Writes reasons as an
    /// `unknown` incarnation until `with_instance`.
    pub fn node_gateway(&self, node: &str) -> crate::node_state::Gateway {
        crate::node_state::Gateway::new(
            node,
            crate::slurm::Scontrol::configured(&self.slurm),
            &self.agent.state_dir,
            self.drain.lock_timeout.0,
            crate::node_state::metrics_path(&self.agent.state_dir, &self.drain.metrics_file),
        )
    }

    /// The drain engine of `node`, built from the sections it uses: `[drain]`,
    /// `[upgrade]`, `[events]`' spot job action, `agent.state_dir`, `slurm.bin_dir` and
    /// `systemd.bus`.
    pub fn drain_engine(&self, node: &str) -> crate::drain::Engine {
        crate::drain::Engine::new(
            node,
            &self.agent.state_dir,
            &self.slurm.bin_dir,
            &self.drain,
            &self.upgrade,
            self.events.spot_jobs(),
            &self.systemd.bus,
        )
    }

    /// The node the health checks are loaded for, as these settings describe it: the
    /// NodeName `node`, `node.role`, `[auth]` (its plugin and key file), the `[[mounts]]`
    /// entries and, on a compute node (bootstrap makes scratch there only), `[scratch]`
    /// when enabled; on this host.
    pub fn health_target(&self, node: Option<String>) -> crate::health::Target {
        use crate::health::target::{OwnMount, ScratchTarget};
        let mut t = crate::health::Target::new(node, self.node.role, &self.auth);
        t.mounts = self
            .mounts
            .iter()
            .map(|m| OwnMount {
                mount_point: m.mount_point.display().to_string(),
                // `ro` among the options that replace the defaults, or the added ones.
                read_only: m
                    .options
                    .iter()
                    .chain(std::iter::once(&m.extra_options))
                    .flat_map(|o| o.split(','))
                    .any(|o| o.trim() == "ro"),
                required: m.required,
            })
            .collect();
        t.scratch =
            (self.scratch.enabled && self.node.role == crate::nodedef::Role::Compute).then(|| {
                ScratchTarget {
                    mount_point: self.scratch.mount_point.display().to_string(),
                    by_id_dir: crate::scratch::Probe::system().by_id_dir,
                    is_instance_store: crate::scratch::disks::is_instance_store_name,
                }
            });
        t.gate = (self.start_gate.enabled() && self.node.role == crate::nodedef::Role::Compute)
            .then(|| crate::health::target::GateTarget {
                state_dir: self.agent.state_dir.clone(),
                parts: self.start_gate.parts(),
            });
        t
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
/// Only the built-in default paths may be missing; a path given explicitly must exist.
///
/// # Errors
/// [`SettingsError`] naming the file, line, column and key.
pub fn file_layers(paths: &Paths) -> Result<Vec<Layer>, SettingsError> {
    let file_optional = paths.file == Path::new(DEFAULT_FILE);
    let dir_optional = paths.dropin_dir == Path::new(DEFAULT_DROPIN_DIR);
    let mut layers: Vec<Layer> = Layer::from_file(&paths.file, file_optional)?
        .into_iter()
        .collect();
    layers.extend(Layer::from_dropin_dir(&paths.dropin_dir, dir_optional)?);
    Ok(layers)
}

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;
