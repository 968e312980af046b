//! Parser of Packer's `-machine-readable` output and of the manifest post-processor's file.
//!
//! Format (Packer docs, "Machine-readable output"): one event per line,
//! `timestamp,target,type,data...`, where commas inside a data field are written as
//! `%!(PACKER_COMMA)` and newlines inside a message as the two characters `\n`. The lines
//! this module relies on, as Packer 1.6.6 prints them (see
//! `tests/fixtures/packer-1.6.6/*.machine-readable`):
//! - `ui,say|message|error,<text>`: human messages (target empty);
//! - `<target>,artifact,<n>,id,<id>`: an artifact's id; amazon-ebs ids are
//!   `region:ami-id` pairs joined by commas;
//! - `<target>,error,<text>` and `,error-count,<n>`: failed builds.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The three kinds of `ui` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum UiLevel {
    /// `ui,say`: a step heading.
    Say,
    /// `ui,message`: output of a step.
    Message,
    /// `ui,error`: an error message.
    Error,
}

/// One decoded line of machine-readable output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A message for people.
    Ui {
        /// say, message or error.
        level: UiLevel,
        /// The text, with commas and newlines restored.
        text: String,
    },
    /// One field of an artifact: `<target>,artifact,<index>,<key>,<value...>`.
    Artifact {
        /// The build, e.g. `amazon-ebs.node`.
        target: String,
        /// Artifact index within the build.
        index: u32,
        /// Field name: `builder-id`, `id`, `string`, `files-count`, `end`...
        key: String,
        /// Field value (empty for `end`).
        value: String,
    },
    /// A build's error: `<target>,error,<text>`.
    BuildError {
        /// The build that failed.
        target: String,
        /// Its error message.
        text: String,
    },
    /// Any other well-formed line (`artifact-count`, `error-count`, `version`, ...).
    Other {
        /// Target field (may be empty).
        target: String,
        /// Type field.
        kind: String,
        /// Remaining fields, decoded.
        data: Vec<String>,
    },
}

/// Undo Packer's escaping inside one field.
pub fn unescape(field: &str) -> String {
    field
        .replace("%!(PACKER_COMMA)", ",")
        .replace("\\n", "\n")
        .replace("\\r", "\r")
}

/// Parse one line. `None` for lines that are not machine-readable (Packer writes some
/// errors, e.g. from argument parsing, as plain text).
pub fn parse_line(line: &str) -> Option<Event> {
    let line = line.trim_end_matches(['\r', '\n']);
    let mut fields = line.split(',');
    let timestamp = fields.next()?;
    if timestamp.is_empty() || !timestamp.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let target = fields.next()?.to_string();
    let kind = fields.next()?.to_string();
    let data: Vec<String> = fields.map(unescape).collect();
    let event = match kind.as_str() {
        "ui" if data.len() >= 2 => {
            let level = match data[0].as_str() {
                "say" => UiLevel::Say,
                "message" => UiLevel::Message,
                "error" => UiLevel::Error,
                _ => return Some(Event::Other { target, kind, data }),
            };
            Event::Ui {
                level,
                text: data[1..].join(","),
            }
        }
        "artifact" if data.len() >= 2 => match data[0].parse::<u32>() {
            Ok(index) => Event::Artifact {
                target,
                index,
                key: data[1].clone(),
                value: data.get(2..).map(|v| v.join(",")).unwrap_or_default(),
            },
            Err(_) => Event::Other { target, kind, data },
        },
        "error" if !target.is_empty() => Event::BuildError {
            target,
            text: data.join(","),
        },
        _ => Event::Other { target, kind, data },
    };
    Some(event)
}

/// AMI ids by region, parsed from an amazon-ebs artifact id
/// (`us-east-1:ami-0abc,us-west-2:ami-0def`). Parts without a `region:` prefix are
/// ignored (other builders' ids such as `Null`).
pub fn amis_from_artifact_id(id: &str) -> BTreeMap<String, String> {
    id.split(',')
        .filter_map(|part| {
            let (region, ami) = part.trim().split_once(':')?;
            (!region.is_empty() && ami.starts_with("ami-"))
                .then(|| (region.to_string(), ami.to_string()))
        })
        .collect()
}

/// What a build run produced, gathered from its events.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RunSummary {
    /// AMI ids by region, from every `artifact,<n>,id` line.
    pub amis: BTreeMap<String, String>,
    /// Raw artifact ids by build target.
    pub artifact_ids: BTreeMap<String, Vec<String>>,
    /// Build errors, `target: text`.
    pub errors: Vec<String>,
    /// Packer said it cancelled the builds after an interrupt.
    pub cancelled: bool,
}

impl RunSummary {
    /// Fold one event into the summary.
    pub fn observe(&mut self, event: &Event) {
        match event {
            Event::Artifact {
                target, key, value, ..
            } if key == "id" => {
                let ids = self.artifact_ids.entry(target.clone()).or_default();
                if !ids.contains(value) {
                    ids.push(value.clone());
                }
                self.amis.extend(amis_from_artifact_id(value));
            }
            Event::BuildError { target, text } => self.errors.push(format!("{target}: {text}")),
            Event::Ui { text, .. }
                if text.contains("Cleanly cancelled builds after being interrupted")
                    || text.contains("Cancelling build after receiving interrupt") =>
            {
                self.cancelled = true;
            }
            _ => {}
        }
    }

    /// Summarise a whole captured output.
    pub fn from_output(output: &str) -> Self {
        let mut summary = RunSummary::default();
        for event in output.lines().filter_map(parse_line) {
            summary.observe(&event);
        }
        summary
    }
}

/// The manifest post-processor's file (`packer-manifest.json` layout).
#[derive(Debug, Clone, Deserialize)]
pub struct Manifest {
    /// Every build recorded, oldest first (the file accumulates runs).
    pub builds: Vec<ManifestBuild>,
    /// The run that wrote last.
    #[serde(default)]
    pub last_run_uuid: String,
}

/// One build in the manifest.
#[derive(Debug, Clone, Deserialize)]
pub struct ManifestBuild {
    /// Build name (`node`).
    pub name: String,
    /// Builder type (`amazon-ebs`).
    pub builder_type: String,
    /// `region:ami,...` for amazon-ebs.
    pub artifact_id: String,
    /// Run that produced it.
    #[serde(default)]
    pub packer_run_uuid: String,
    /// The template's `custom_data`.
    #[serde(default)]
    pub custom_data: Option<BTreeMap<String, String>>,
}

impl Manifest {
    /// Parse the manifest's JSON.
    pub fn parse(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// AMI ids by region from the last run's builds.
    pub fn last_run_amis(&self) -> BTreeMap<String, String> {
        self.builds
            .iter()
            .filter(|b| self.last_run_uuid.is_empty() || b.packer_run_uuid == self.last_run_uuid)
            .flat_map(|b| amis_from_artifact_id(&b.artifact_id))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescapes_commas_and_newlines() {
        let e =
            parse_line("1795982894,,ui,say,==> No volumes to clean up%!(PACKER_COMMA) skipping");
        assert_eq!(
            e,
            Some(Event::Ui {
                level: UiLevel::Say,
                text: "==> No volumes to clean up, skipping".into()
            })
        );
    }

    #[test]
    fn plain_text_is_not_an_event() {
        assert_eq!(parse_line("Error: Undefined -var variable"), None);
        assert_eq!(parse_line(""), None);
    }

    #[test]
    fn artifact_ids_split_by_region() {
        let amis = amis_from_artifact_id("us-east-1:ami-1,us-west-2:ami-2");
        assert_eq!(amis.get("us-east-1").map(String::as_str), Some("ami-1"));
        assert_eq!(amis.get("us-west-2").map(String::as_str), Some("ami-2"));
        assert!(amis_from_artifact_id("Null").is_empty());
    }
}
