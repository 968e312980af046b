//! The signing-key pins of `packer/files/keys/`, read as the build's `lib.sh`
//! (`pinned_fingerprint`, used by `verify_signature` and `fetch_signed`) reads them, so that
//! `validate` finds a broken pin before a build does.
//!
//! A pin `<id>.fpr` holds one line of 40 hex digits (any case; spaces between groups and a
//! `0x` prefix are allowed); `#` starts a comment, a whole line or the rest of one; blank
//! lines, a UTF-8 byte order mark and CRLF line ends are ignored. Beside it, `<id>.asc` (the
//! public key) or `<id>.key-url` (where the publisher serves it). Every id a provisioning
//! step passes to `fetch_signed` must have a pin.

use crate::error::{Error, Result};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// One pin that passed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Pin {
    /// Key id: the file name without `.fpr` (`amazon-ssm-agent`).
    pub id: String,
    /// The fingerprint, 40 hex digits in capitals.
    pub fingerprint: String,
    /// `<id>.asc` or `<id>.key-url`, whichever is there (`.asc` first, as `lib.sh` does).
    pub key: PathBuf,
}

/// The fingerprint pinned in `text`, read from `file` (named in errors).
///
/// # Errors
/// `<file>, line <n>: <what is wrong>`, or `<file>: no pinned signing key fingerprint: ...`
/// when no line holds one; the same words as `lib.sh`'s `pinned_fingerprint`.
pub fn parse_pin(file: &Path, text: &str) -> std::result::Result<String, String> {
    let f = file.display();
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut found: Option<(String, usize)> = None;
    for (i, line) in text.split('\n').enumerate() {
        let n = i + 1;
        let line = line.strip_suffix('\r').unwrap_or(line);
        let before = line.split('#').next().unwrap_or_default();
        let before = before.trim_matches(|c| c == ' ' || c == '\t');
        if before.is_empty() {
            continue;
        }
        if let Some((_, at)) = &found {
            return Err(format!(
                "{f}, line {n}: a second fingerprint (the first is on line {at}); pin one key per file"
            ));
        }
        let hex: String = before.chars().filter(|c| *c != ' ' && *c != '\t').collect();
        let hex = hex
            .strip_prefix("0x")
            .or_else(|| hex.strip_prefix("0X"))
            .unwrap_or(&hex);
        if !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(format!(
                "{f}, line {n}: \"{before}\" is not a fingerprint: only hex digits may come before a # comment (spaces and a 0x prefix are ignored)"
            ));
        }
        if hex.len() != 40 {
            return Err(format!(
                "{f}, line {n}: \"{before}\" has {} hex digits; a fingerprint has 40",
                hex.len()
            ));
        }
        found = Some((hex.to_ascii_uppercase(), n));
    }
    found.map(|(fpr, _)| fpr).ok_or_else(|| {
        format!(
            "{f}: no pinned signing key fingerprint: no line of 40 hex digits (lines starting with # are comments)"
        )
    })
}

/// The key ids the provisioning steps in `scripts` pass to `fetch_signed` as a literal last
/// word (`fetch_signed NAME URL DEST KEYID`), in name order.
pub fn referenced_ids(scripts: &Path) -> Result<BTreeSet<String>> {
    let mut ids = BTreeSet::new();
    let entries = match std::fs::read_dir(scripts) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ids),
        Err(e) => return Err(Error::io(format!("reading {}", scripts.display()), e)),
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().and_then(|x| x.to_str()) != Some("sh")
            || path.file_name().and_then(|n| n.to_str()) == Some("lib.sh")
        {
            continue;
        }
        let text = std::fs::read_to_string(&path)
            .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        for line in text.lines() {
            let line = line.trim_start();
            if line.starts_with('#') {
                continue;
            }
            let Some(call) = line.split("fetch_signed ").nth(1) else {
                continue;
            };
            let call = call.split("||").next().unwrap_or_default();
            let words: Vec<&str> = call.split_whitespace().collect();
            if let [_, _, _, id, ..] = words.as_slice() {
                let id = id.trim_matches('"');
                if !id.is_empty()
                    && id
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
                {
                    ids.insert(id.to_string());
                }
            }
        }
    }
    Ok(ids)
}

/// Checks every pin in `<packer_dir>/files/keys/` and that every key id the steps in
/// `<packer_dir>/scripts/` pass to `fetch_signed` has one.
///
/// # Errors
/// [`Error::BadInput`] naming the file, the line and what is wrong (exit 2).
pub fn check(packer_dir: &Path) -> Result<Vec<Pin>> {
    let dir = packer_dir.join("files/keys");
    let mut pins = Vec::new();
    let mut problems = Vec::new();
    let mut ids: BTreeSet<String> = BTreeSet::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for path in paths {
            if path.extension().and_then(|x| x.to_str()) != Some("fpr") {
                continue;
            }
            let id = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or_default()
                .to_string();
            ids.insert(id.clone());
            let text = match std::fs::read(&path) {
                Ok(b) => String::from_utf8_lossy(&b).into_owned(),
                Err(e) => {
                    problems.push(format!("{}: {e}", path.display()));
                    continue;
                }
            };
            let fingerprint = match parse_pin(&path, &text) {
                Ok(f) => f,
                Err(m) => {
                    problems.push(m);
                    continue;
                }
            };
            let asc = dir.join(format!("{id}.asc"));
            let url = dir.join(format!("{id}.key-url"));
            let key = if asc.is_file() {
                asc
            } else if url.is_file() {
                url
            } else {
                problems.push(format!(
                    "{}: no public key beside the pin: neither {id}.asc nor {id}.key-url",
                    path.display()
                ));
                continue;
            };
            pins.push(Pin {
                id,
                fingerprint,
                key,
            });
        }
    }
    for id in referenced_ids(&packer_dir.join("scripts"))? {
        if !ids.contains(&id) {
            problems.push(format!(
                "{}: no pinned signing key fingerprint: the file does not exist, and a provisioning step checks packages against key {id:?} (write the key's 40-hex-digit fingerprint there)",
                dir.join(format!("{id}.fpr")).display()
            ));
        }
    }
    if problems.is_empty() {
        Ok(pins)
    } else {
        Err(Error::BadInput(format!(
            "signing key pins in {}:\n  {}",
            dir.display(),
            problems.join("\n  ")
        )))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const FPR: &str = "937616F3450B7D806CBD9725D58167303B789C72";

    #[test]
    fn harmless_forms_are_read_and_broken_ones_named_with_their_line() {
        let p = Path::new("/k/x.fpr");
        for ok in [
            format!("# where it is published\n{FPR}\n"),
            format!("{FPR}  # trailing comment\n"),
            format!("0x{FPR}\n"),
            format!("\u{feff}{FPR}\r\n"),
            format!("\n{}\n", FPR.to_lowercase()),
            "9376 16F3 450B 7D80 6CBD  9725 D581 6730 3B78 9C72\n".to_string(),
        ] {
            assert_eq!(parse_pin(p, &ok).as_deref(), Ok(FPR), "{ok:?}");
        }
        for (bad, what) in [
            (format!("# c\n{FPR};\n"), "/k/x.fpr, line 2: \"937616F3450B7D806CBD9725D58167303B789C72;\" is not a fingerprint"),
            (format!("{}\n", &FPR[1..]), "/k/x.fpr, line 1: \"" ),
            (format!("{FPR}\n\n{FPR}\n"), "/k/x.fpr, line 3: a second fingerprint (the first is on line 1)"),
            ("# only a comment\n".to_string(), "/k/x.fpr: no pinned signing key fingerprint: no line"),
            (String::new(), "/k/x.fpr: no pinned signing key fingerprint"),
        ] {
            let m = parse_pin(p, &bad).unwrap_err();
            assert!(m.starts_with(what), "{bad:?}: {m}");
        }
        assert!(parse_pin(p, &format!("{}\n", &FPR[1..]))
            .unwrap_err()
            .ends_with("has 39 hex digits; a fingerprint has 40"));
    }

    #[test]
    fn the_shipped_pins_pass_and_cover_every_fetch_signed_key() {
        let packer = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packer");
        let ids = referenced_ids(&packer.join("scripts")).unwrap();
        assert_eq!(
            ids.iter().map(String::as_str).collect::<Vec<_>>(),
            ["amazon-cloudwatch-agent", "amazon-ssm-agent"]
        );
        let pins = check(&packer).unwrap();
        assert_eq!(pins.len(), 2, "{pins:?}");
    }
}
