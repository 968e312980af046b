//! DMI/SMBIOS data (NHC's `check_dmi_data_match`) from `dmidecode`'s text output.
//!
//! Lines are flattened the way NHC does it: an indented line is prefixed with the lines
//! it is indented under, each ending in `:`, starting with the handle's type string,
//! e.g. `System Information: Product Name: c5n.18xlarge` or
//! `BIOS Information: Characteristics: PCI is supported`.

use super::{Checked, Failed};
use crate::health::facts::Facts;
use crate::health::matcher::Matcher;

/// One DMI handle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DmiHandle {
    /// Handle, e.g. `0x0100`.
    pub handle: String,
    /// DMI type number.
    pub type_id: u32,
    /// Type string, e.g. `System Information`.
    pub type_name: String,
    /// Flattened data lines.
    pub lines: Vec<String>,
}

/// dmidecode's tables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DmiTable {
    /// Handles in order.
    pub handles: Vec<DmiHandle>,
    /// dmidecode's output lines as printed, without empty ones (NHC's `DMI_RAW_DATA`,
    /// the output split on newlines).
    pub raw: Vec<String>,
}

impl DmiTable {
    /// Parses `dmidecode` output.
    pub fn parse(text: &str) -> DmiTable {
        let mut handles: Vec<DmiHandle> = Vec::new();
        let mut stack: Vec<String> = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("Handle ") {
                // "Handle 0x0001, DMI type 1, 27 bytes"
                let mut parts = rest.split(", ");
                let handle = parts.next().unwrap_or("").to_string();
                let type_id = parts
                    .next()
                    .and_then(|t| t.strip_prefix("DMI type "))
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(u32::MAX);
                handles.push(DmiHandle {
                    handle,
                    type_id,
                    type_name: String::new(),
                    lines: Vec::new(),
                });
                stack.clear();
                continue;
            }
            let Some(h) = handles.last_mut() else {
                continue;
            };
            if line.trim().is_empty() {
                continue;
            }
            let indent = line.len() - line.trim_start_matches(['\t', ' ']).len();
            let text = line.trim();
            if indent == 0 {
                h.type_name = text.to_string();
                stack.clear();
            } else {
                stack.truncate(indent);
                let mut full = stack.join(" ");
                if !full.is_empty() {
                    full.push(' ');
                }
                full.push_str(text);
                h.lines.push(full);
            }
            let tag = if text.ends_with(':') {
                text.to_string()
            } else {
                format!("{text}:")
            };
            stack.push(tag);
        }
        let raw = text
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        DmiTable { handles, raw }
    }
}

/// A DMI data line must (or must not) exist.
#[derive(Debug, Clone)]
pub struct DmiSpec {
    /// Fail when a line matches instead.
    pub negate: bool,
    /// Only these handles, as numbers (NHC keeps handles as subscripts of bash indexed
    /// arrays, so `-h 0x0400`, `-h 0x400` and `-h 1024` name the same handle and `-h 0400`
    /// is octal, i.e. 256).
    pub handles: Vec<i64>,
    /// Only handles of this type (number or type string).
    pub type_filter: Option<String>,
    /// Expression over flattened lines.
    pub pattern: Matcher,
    /// NHC's `check_dmi_raw_data_match`: `pattern` is matched against dmidecode's raw
    /// output lines ([`DmiTable::raw`]); handles and type do not apply.
    pub raw: bool,
}

/// Runs a DMI check.
///
/// # Errors
/// [`Failed`]: what is wrong, in NHC's words.
pub fn check_dmi(spec: &DmiSpec, facts: &Facts) -> Result<String, Failed> {
    let failed = |m: String| Failed::new(Checked::Dmi(spec.pattern.to_string()), m);
    let table = facts.dmi()?;
    if spec.raw {
        let hit = table.raw.iter().find(|l| spec.pattern.matches(l));
        return match (hit, spec.negate) {
            (Some(l), false) => Ok(format!("DMI: {l}")),
            (Some(l), true) => Err(failed(format!(
                "check_dmi_raw_data_match: match found for {}: {l}",
                spec.pattern
            ))),
            (None, false) => Err(failed(format!(
                "check_dmi_raw_data_match: no match found for {}",
                spec.pattern
            ))),
            (None, true) => Ok(format!("no dmidecode line matches {}", spec.pattern)),
        };
    }
    let selected: Vec<&DmiHandle> = table
        .handles
        .iter()
        .filter(|h| {
            spec.handles.is_empty()
                || crate::health::arith::parse_int(&h.handle)
                    .is_ok_and(|n| spec.handles.contains(&n))
        })
        .filter(|h| {
            spec.type_filter
                .as_ref()
                .is_none_or(|t| *t == h.type_id.to_string() || *t == h.type_name)
        })
        .collect();
    if selected.is_empty() {
        return Err(failed("no valid DMI handles found".into()));
    }
    let hit = selected
        .iter()
        .flat_map(|h| h.lines.iter())
        .find(|l| spec.pattern.matches(l));
    match (hit, spec.negate) {
        (Some(l), false) => Ok(format!("DMI: {l}")),
        (Some(l), true) => Err(failed(format!("match found for {}: {l}", spec.pattern))),
        (None, false) => Err(failed(format!("no match found for {}", spec.pattern))),
        (None, true) => Ok(format!("no DMI line matches {}", spec.pattern)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const SAMPLE: &str = include_str!("../../../tests/fixtures/health/dmidecode.txt");

    #[test]
    fn flattens_like_nhc() {
        let t = DmiTable::parse(SAMPLE);
        let sys = t.handles.iter().find(|h| h.type_id == 1).unwrap();
        assert_eq!(sys.type_name, "System Information");
        assert!(sys
            .lines
            .contains(&"System Information: Product Name: c5n.18xlarge".to_string()));
        let bios = t.handles.iter().find(|h| h.type_id == 0).unwrap();
        assert!(bios
            .lines
            .contains(&"BIOS Information: Characteristics: PCI is supported".to_string()));
        assert!(bios
            .lines
            .contains(&"BIOS Information: Vendor: Amazon EC2".to_string()));
    }
}
