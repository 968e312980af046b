//! Settings errors in a settings file's words: which key, what it takes, an example.
//!
//! serde and toml describe a refused value in Rust's terms (`invalid type: integer `5`,
//! expected a string`, `unknown field ``, `expected struct ScriptSettings`). An operator
//! needs the dotted key (`health.interval`), what the key takes in the words of
//! `docs/settings.md` (`a duration`), and a line that works (`health.interval = "5m"`):
//! [`describe`] gives the last two from the settings reference ([`super::reference`]), and
//! [`rewrite`] turns serde's phrases into ours. No message built here names a Rust type.

use std::ops::Range;

use super::reference::{self, Key, Section};

/// The key of a text's value that an error's byte range points at: the deepest key whose
/// name or value overlaps `span` (`mounts[0].source`, `health.interval`; for an error
/// about a whole table, such as a missing key, the table: `node_lifecycle.node_ready[0]`).
/// `None` for text that does not parse as TOML (a syntax error).
pub(super) fn key_at(text: &str, span: &Range<usize>) -> Option<String> {
    let doc = toml::de::DeTable::parse(text).ok()?;
    find(doc.get_ref(), span, "")
}

fn overlaps(a: &Range<usize>, b: &Range<usize>) -> bool {
    // An empty range (a point) overlaps what contains it.
    if b.start == b.end {
        return a.start <= b.start && b.start < a.end.max(a.start + 1);
    }
    a.start < b.end && b.start < a.end
}

fn find(table: &toml::de::DeTable<'_>, span: &Range<usize>, prefix: &str) -> Option<String> {
    for (k, v) in table {
        let key = if prefix.is_empty() {
            k.get_ref().to_string()
        } else {
            format!("{prefix}.{}", k.get_ref())
        };
        let here = overlaps(&k.span(), span) || overlaps(&v.span(), span);
        let deeper = match v.get_ref() {
            toml::de::DeValue::Table(t) => find(t, span, &key),
            toml::de::DeValue::Array(a) => a.iter().enumerate().find_map(|(i, item)| {
                let item_key = format!("{key}[{i}]");
                match item.get_ref() {
                    toml::de::DeValue::Table(t) => find(t, span, &item_key)
                        .or_else(|| overlaps(&item.span(), span).then(|| item_key.clone())),
                    _ => overlaps(&item.span(), span).then(|| key.clone()),
                }
            }),
            _ => None,
        };
        if deeper.is_some() {
            return deeper;
        }
        if here {
            return Some(key);
        }
    }
    None
}

/// What a key takes and a line that sets it well, from the settings reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyHelp {
    /// What the key takes: `a duration`, `one of "compute", "login"`, `a list of strings`.
    pub expected: String,
    /// A valid setting of it as TOML: `health.interval = "5m"`, or for a key of an array
    /// of tables's entry `mount_point = "/fsx" under [[mounts]]`. Empty where the reference
    /// has none.
    pub example: String,
}

/// `mounts[0].source` → (`mounts`, Some(`source`)); `health.interval` → (`health.interval`,
/// None); `node_lifecycle.node_ready[1]` → (`node_lifecycle.node_ready`, None).
fn split_entry(key: &str) -> (&str, Option<&str>) {
    match key.find('[') {
        Some(i) => {
            let rest = &key[i..];
            let leaf = rest
                .find("].")
                .map(|j| &rest[j + 2..])
                .filter(|l| !l.is_empty());
            (&key[..i], leaf)
        }
        None => (key, None),
    }
}

/// With its article: `a duration`, `an integer`, `a list of strings`.
fn article(words: &str) -> String {
    let words = words.trim_end_matches(", optional");
    let an = words.starts_with(['a', 'e', 'i', 'o', 'u']);
    format!("{} {words}", if an { "an" } else { "a" })
}

fn expected_of(k: &Key) -> String {
    if !k.values.is_empty() {
        let vals: Vec<String> = k.values.iter().map(|(v, _)| format!("\"{v}\"")).collect();
        return format!("one of {}", vals.join(", "));
    }
    if !k.entry.is_empty() {
        return format!("an array of tables, each entry written `[[{}]]`", k.dotted);
    }
    article(&k.ty)
}

/// A TOML value for an example line: the reference's example, else the default.
fn value_example(k: &Key) -> Option<String> {
    if !k.example.is_empty() {
        return Some(k.example.to_string());
    }
    k.default
        .as_ref()
        .filter(|d| !matches!(d, toml::Value::String(s) if s.is_empty()))
        .filter(|d| !matches!(d, toml::Value::Array(a) if a.is_empty()))
        .map(toml::Value::to_string)
}

/// Every key of the reference: top-level keys by dotted name, arrays of tables by name.
fn all_keys(sections: &[Section]) -> impl Iterator<Item = &Key> {
    sections.iter().flat_map(|s| s.keys.iter())
}

/// What `key` takes and an example, from the settings reference; `None` for a key the
/// schema does not have.
pub fn describe(key: &str) -> Option<KeyHelp> {
    let sections = reference::sections();
    let (base, leaf) = split_entry(key);
    if let Some(section) = sections.iter().find(|s| s.name == base && !s.array) {
        // A whole section (`health = 5`): a table.
        let example = section
            .keys
            .iter()
            .find_map(|k| value_example(k).map(|v| format!("{} = {v}", k.dotted)))
            .unwrap_or_default();
        return Some(KeyHelp {
            expected: format!("a table: `[{base}]` followed by its keys"),
            example,
        });
    }
    let k = all_keys(&sections).find(|k| k.dotted == base)?;
    match leaf {
        None if key.contains('[') => {
            // One entry of an array of tables.
            Some(KeyHelp {
                expected: format!("a table, written `[[{base}]]`"),
                example: entry_example(k),
            })
        }
        None => {
            let example = if k.entry.is_empty() {
                value_example(k)
                    .map(|v| format!("{} = {v}", k.dotted))
                    .unwrap_or_default()
            } else {
                entry_example(k)
            };
            Some(KeyHelp {
                expected: expected_of(k),
                example,
            })
        }
        Some(leaf) => {
            let e = k.entry.iter().find(|e| e.dotted == leaf)?;
            // The example line of the whole array's example that sets this key.
            let line = k
                .example
                .lines()
                .find(|l| l.split('=').next().is_some_and(|n| n.trim() == leaf))
                .map(str::to_string)
                .or_else(|| value_example(e).map(|v| format!("{leaf} = {v}")));
            Some(KeyHelp {
                expected: expected_of(e),
                example: line
                    .map(|l| format!("{l} under [[{base}]]"))
                    .unwrap_or_default(),
            })
        }
    }
}

/// The reference's example of an array of tables, on one line: `[[mounts]] mount_point =
/// "/fsx" ...` reads as the lines it stands for.
fn entry_example(k: &Key) -> String {
    k.example
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// The known keys next to `key`'s place (its section's, or the sections), for an unknown
/// key; and the nearest of them, if one is near enough to be a typo.
pub fn known_near(key: &str) -> (Vec<String>, Option<String>) {
    let sections = reference::sections();
    let (base, leaf) = split_entry(key);
    let candidates: Vec<String> = match leaf {
        // An entry's key: the entry's keys.
        Some(_) => all_keys(&sections)
            .find(|k| k.dotted == base)
            .map(|k| {
                k.entry
                    .iter()
                    .map(|e| format!("{base}[].{}", e.dotted))
                    .collect()
            })
            .unwrap_or_default(),
        None if !base.contains('.') => sections.iter().map(|s| s.name.clone()).collect(),
        None => match base.rsplit_once('.') {
            Some((section, _)) if sections.iter().any(|s| s.name == section) => all_keys(&sections)
                .filter(|k| k.dotted.rsplit_once('.').is_some_and(|(s, _)| s == section))
                .map(|k| k.dotted.clone())
                .collect(),
            // An unknown section, or a dotted key whose section is unknown: every key.
            _ => all_keys(&sections).map(|k| k.dotted.clone()).collect(),
        },
    };
    let target = match leaf {
        Some(l) => format!("{base}[].{l}"),
        None => base.to_string(),
    };
    let nearest = candidates
        .iter()
        .map(|c| (strsim::damerau_levenshtein(c, &target), c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 5))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c.replace("[]", "[0]"));
    (candidates, nearest)
}

/// serde's or toml's message about `key`, in the words of a settings file: what was found,
/// what the key takes, and an example. `message` is the deserializer's own text.
pub fn rewrite(key: &str, message: &str) -> String {
    let message = message.trim();
    let tick = |s: &str| -> Option<String> {
        let start = s.find('`')? + 1;
        let end = s[start..].find('`')? + start;
        Some(s[start..end].to_string())
    };
    if let Some(rest) = message.strip_prefix("unknown field ") {
        let field = tick(rest).unwrap_or_default();
        let full = if field.is_empty() || key.ends_with(&field) {
            key.to_string()
        } else if key.is_empty() {
            field
        } else {
            format!("{key}.{field}")
        };
        return unknown_key(&full);
    }
    if let Some(rest) = message.strip_prefix("missing field ") {
        let field = tick(rest).unwrap_or_default();
        let full = if key.is_empty() {
            field.clone()
        } else {
            format!("{key}.{field}")
        };
        let mut out = format!("key `{full}`: missing; it has no default and must be set");
        if let Some(h) = describe(&full) {
            out.push_str(&format!(" ({})", h.expected));
            if !h.example.is_empty() {
                out.push_str(&format!("; for example `{}`", h.example));
            }
        }
        return out;
    }
    let got = if let Some(rest) = message.strip_prefix("invalid type: ") {
        Some(found(rest.split(", expected").next().unwrap_or(rest)))
    } else if let Some(rest) = message.strip_prefix("invalid value: ") {
        Some(found(rest.split(", expected").next().unwrap_or(rest)))
    } else if let Some(rest) = message.strip_prefix("unknown variant ") {
        Some(format!("\"{}\"", tick(rest).unwrap_or_default()))
    } else if message.starts_with("invalid length ") {
        Some(message.split(", expected").next().unwrap_or(message).into())
    } else {
        None
    };
    if key.is_empty() {
        // Not about one key (a syntax error): toml's words, which name no Rust type.
        return message.to_string();
    }
    let help = describe(key);
    let mut out = format!("key `{key}`: ");
    match (got, &help) {
        (Some(got), Some(h)) => out.push_str(&format!("expected {}, got {got}", h.expected)),
        (Some(got), None) => out.push_str(&format!("value {got} is not accepted")),
        // The key's own check (a duration's, a budget's): its words already say what;
        // a duration's generic example gives way to the key's own below.
        (None, Some(h)) if !h.example.is_empty() => out.push_str(
            message
                .strip_suffix("; write e.g. \"90s\" or \"10m\"")
                .unwrap_or(message),
        ),
        (None, _) => out.push_str(message),
    }
    if let Some(h) = help.filter(|h| !h.example.is_empty()) {
        if !out.contains(&h.example) {
            out.push_str(&format!("; for example `{}`", h.example));
        }
    }
    out
}

/// serde's `integer `5`` / `string "x"` / `sequence` / `map` in TOML's words.
fn found(serde: &str) -> String {
    let s = serde.trim();
    for (from, to) in [
        ("sequence", "an array"),
        ("map", "a table"),
        ("unit value", "nothing"),
        ("floating point", "a number"),
    ] {
        if let Some(rest) = s.strip_prefix(from) {
            return format!("{to}{rest}");
        }
    }
    if let Some(rest) = s.strip_prefix("integer ") {
        return format!("the integer {}", rest.trim_matches('`'));
    }
    if let Some(rest) = s.strip_prefix("boolean ") {
        return format!("the boolean {}", rest.trim_matches('`'));
    }
    if let Some(rest) = s.strip_prefix("string ") {
        return format!("the string {rest}");
    }
    s.to_string()
}

/// An unknown key's message: the key, the nearest known one, where the others are listed.
pub fn unknown_key(key: &str) -> String {
    let (candidates, nearest) = known_near(key);
    let mut out = format!("unknown key `{key}`");
    match nearest {
        Some(n) => {
            out.push_str(&format!("; did you mean `{n}`?"));
            if let Some(h) = describe(&n).filter(|h| !h.example.is_empty()) {
                out.push_str(&format!(" For example `{}`", h.example));
            }
        }
        None if candidates.len() <= 24 && !candidates.is_empty() => {
            let shown: Vec<String> = candidates.iter().map(|c| c.replace("[]", "[0]")).collect();
            out.push_str(&format!("; expected one of {}", shown.join(", ")));
        }
        None => {
            out.push_str("; `slurm-node-agent config reference` lists every key");
        }
    }
    out
}

/// Whether the dotted key is an array of tables (`mounts`, `node_lifecycle.node_ready`).
pub fn is_array_of_tables(key: &str) -> bool {
    all_keys(&reference::sections()).any(|k| k.dotted == key && !k.entry.is_empty())
}
