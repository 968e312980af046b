//! The metadata tree: every value the emulator serves under `/latest/`, keyed by its path,
//! and the directory listings derived from those paths.
//!
//! Keys are paths relative to `/latest/` without leading or trailing slashes, for example
//! `meta-data/instance-id`, `dynamic/instance-identity/document` or `user-data`. A
//! directory exists exactly when some key lies below it, so removing the last value under
//! `spot/` also removes `spot/` from the listing of `meta-data`, as on EC2.
//!
//! The defaults are those of AWS's amazon-ec2-metadata-mock (AEMM, Apache-2.0), embedded
//! from `data/aemm-metadata-default-values.json`: a value is served at a path when the
//! file names both (paths such as `spot/instance-action` have no default value and stay
//! absent until set). JSON object values are rendered the way AEMM renders them: Go's
//! `json.MarshalIndent` with a tab indent, in the file's key order. User data is stored
//! base64-encoded in the file and served decoded.

use std::collections::BTreeMap;
use std::fmt;

use bytes::Bytes;
use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};

/// The AEMM default values file, embedded so the emulator works from any directory.
pub const AEMM_DEFAULTS_JSON: &str = include_str!("../data/aemm-metadata-default-values.json");

/// AEMM serves this one path as compact JSON rather than indented (see its `static.go`).
const COMPACT_JSON_PATH: &str =
    "meta-data/elastic-inference/associations/eia-bfa21c7904f64a82a21b9f4540169ce1";

/// The values served under `/latest/`, keyed by path relative to it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tree {
    values: BTreeMap<String, Bytes>,
}

/// What a GET of a path under `/latest/` resolves to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// A leaf value.
    Value(Bytes),
    /// A directory: its entries, subdirectories with a trailing `/`, joined by `\n`.
    Listing(String),
    /// Nothing at this path.
    Absent,
}

impl Tree {
    /// The tree with AEMM's default values.
    pub(crate) fn aemm_defaults() -> Tree {
        // The embedded file is checked by the tests, so a parse failure here is a bug in
        // this crate, not bad input; an empty tree would hide it, hence the expect.
        #[allow(clippy::expect_used)]
        let file: DefaultsFile =
            serde_json::from_str(AEMM_DEFAULTS_JSON).expect("embedded AEMM defaults parse");
        let mut tree = Tree::default();
        for section in [&file.metadata, &file.dynamic] {
            for (name, path) in &section.paths {
                let Some(value) = section.value(name) else {
                    continue;
                };
                let key = normalize(path.trim_start_matches("/latest/"));
                let body = match value {
                    Json::Str(s) => s.clone().into_bytes(),
                    json if key == COMPACT_JSON_PATH => json.to_compact(),
                    json => json.to_go_pretty(),
                };
                tree.set(&key, body);
            }
        }
        for (name, path) in &file.userdata.paths {
            if let Some(Json::Str(b64)) = file.userdata.value(name) {
                let key = normalize(path.trim_start_matches("/latest/"));
                // AEMM serves an undecodable value as an empty body; keep that behaviour.
                tree.set(&key, base64_decode(b64).unwrap_or_default());
            }
        }
        tree
    }

    /// Sets the value at `key` (relative to `/latest/`).
    pub(crate) fn set(&mut self, key: &str, value: impl Into<Bytes>) {
        self.values.insert(normalize(key), value.into());
    }

    /// Removes the value at `key` and every value below it.
    pub(crate) fn remove(&mut self, key: &str) {
        let key = normalize(key);
        let prefix = format!("{key}/");
        self.values
            .retain(|k, _| *k != key && !k.starts_with(&prefix));
    }

    /// Whether a value is stored exactly at `key`.
    pub(crate) fn contains(&self, key: &str) -> bool {
        self.values.contains_key(&normalize(key))
    }

    /// Resolves `key`: a leaf wins over a directory of the same name (AEMM strips a
    /// trailing slash before routing, so `spot/instance-action/` is the leaf too).
    pub(crate) fn lookup(&self, key: &str) -> Lookup {
        let key = normalize(key);
        if let Some(value) = self.values.get(&key) {
            return Lookup::Value(value.clone());
        }
        let prefix = if key.is_empty() {
            String::new()
        } else {
            format!("{key}/")
        };
        let mut entries: BTreeMap<&str, bool> = BTreeMap::new();
        for k in self.values.range(prefix.clone()..) {
            let Some(rest) = k.0.strip_prefix(&prefix) else {
                break;
            };
            match rest.split_once('/') {
                Some((child, _)) => *entries.entry(child).or_default() = true,
                None => {
                    entries.entry(rest).or_default();
                }
            }
        }
        if entries.is_empty() {
            return Lookup::Absent;
        }
        let lines: Vec<String> = entries
            .into_iter()
            .map(|(name, dir)| {
                if dir {
                    format!("{name}/")
                } else {
                    name.to_owned()
                }
            })
            .collect();
        Lookup::Listing(lines.join("\n"))
    }
}

/// Where the scheduled maintenance events are, relative to `/latest/`.
pub(crate) const SCHEDULED_PATH: &str = "meta-data/events/maintenance/scheduled";
/// Where EC2 keeps completed and canceled maintenance events, relative to `/latest/`.
pub(crate) const HISTORY_PATH: &str = "meta-data/events/maintenance/history";

/// How a scheduled maintenance event ended (its `State` in `events/maintenance/history`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventOutcome {
    /// `completed`: the reboot, stop or maintenance happened.
    Completed,
    /// `canceled`: AWS canceled it.
    Canceled,
}

impl EventOutcome {
    /// The `State` value, `completed` or `canceled`.
    pub fn state(self) -> &'static str {
        match self {
            EventOutcome::Completed => "completed",
            EventOutcome::Canceled => "canceled",
        }
    }

    /// Parses `completed` or `canceled` (also `cancelled`).
    pub fn parse(s: &str) -> Option<EventOutcome> {
        match s {
            "completed" => Some(EventOutcome::Completed),
            "canceled" | "cancelled" => Some(EventOutcome::Canceled),
            _ => None,
        }
    }

    /// The prefix EC2 puts before the description of an event in history, as in the AWS
    /// documentation's example (`[Canceled] scheduled reboot`).
    fn description_prefix(self) -> &'static str {
        match self {
            EventOutcome::Completed => "[Completed] ",
            EventOutcome::Canceled => "[Canceled] ",
        }
    }
}

/// A JSON array of event objects at `key`, keys in document order; none when absent.
fn event_list(tree: &Tree, key: &str) -> Result<Vec<Json>, String> {
    let Lookup::Value(body) = tree.lookup(key) else {
        return Ok(Vec::new());
    };
    match serde_json::from_slice::<Json>(&body) {
        Ok(Json::Arr(items)) => Ok(items),
        Ok(_) => Err(format!("{key} is not a JSON array")),
        Err(e) => Err(format!("{key} is not JSON: {e}")),
    }
}

fn field<'a>(event: &'a Json, name: &str) -> Option<&'a Json> {
    match event {
        Json::Obj(entries) => entries.iter().find(|(k, _)| k == name).map(|(_, v)| v),
        _ => None,
    }
}

fn set_field(event: &mut Json, name: &str, value: String) {
    if let Json::Obj(entries) = event {
        match entries.iter_mut().find(|(k, _)| k == name) {
            Some((_, v)) => *v = Json::Str(value),
            None => entries.push((name.to_owned(), Json::Str(value))),
        }
    }
}

/// Moves the event `event_id` from `events/maintenance/scheduled` to the end of
/// `events/maintenance/history`, with `State` set to the outcome and `[Completed] ` or
/// `[Canceled] ` before its `Description`, as EC2 does once an event is over. The other
/// events and every field keep their order; `scheduled` disappears (404) when its last
/// event leaves.
pub(crate) fn finish_event(
    tree: &mut Tree,
    event_id: &str,
    outcome: EventOutcome,
) -> Result<(), String> {
    let mut scheduled = event_list(tree, SCHEDULED_PATH)?;
    let Some(i) = scheduled
        .iter()
        .position(|e| field(e, "EventId") == Some(&Json::Str(event_id.to_owned())))
    else {
        return Err(format!("no event {event_id:?} in {SCHEDULED_PATH}"));
    };
    let mut history = event_list(tree, HISTORY_PATH)?;
    let mut event = scheduled.remove(i);
    set_field(&mut event, "State", outcome.state().to_owned());
    let description = match field(&event, "Description") {
        Some(Json::Str(d)) => d.clone(),
        _ => String::new(),
    };
    if !description.starts_with(outcome.description_prefix()) {
        set_field(
            &mut event,
            "Description",
            format!("{}{description}", outcome.description_prefix()),
        );
    }
    history.push(event);
    if scheduled.is_empty() {
        tree.remove(SCHEDULED_PATH);
    } else {
        tree.set(SCHEDULED_PATH, Json::Arr(scheduled).to_go_pretty());
    }
    tree.set(HISTORY_PATH, Json::Arr(history).to_go_pretty());
    Ok(())
}

/// Strips leading and trailing slashes and collapses empty segments.
pub(crate) fn normalize(path: &str) -> String {
    path.split('/')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("/")
}

#[derive(Deserialize)]
struct DefaultsFile {
    metadata: Section,
    dynamic: Section,
    userdata: Section,
}

#[derive(Deserialize)]
struct Section {
    paths: BTreeMap<String, String>,
    values: Json,
}

impl Section {
    fn value(&self, name: &str) -> Option<&Json> {
        match &self.values {
            Json::Obj(entries) => entries.iter().find(|(k, _)| k == name).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// A JSON value that keeps object keys in document order (AEMM's Go structs serialize
/// their fields in declaration order, which is the order of the defaults file).
#[derive(Debug, Clone, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Num(serde_json::Number),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    fn to_go_pretty(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let fmt = serde_json::ser::PrettyFormatter::with_indent(b"\t");
        let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
        // Serializing an in-memory tree of strings and numbers into a Vec cannot fail.
        let _ = self.serialize(&mut ser);
        out
    }

    fn to_compact(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

impl Serialize for Json {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Json::Null => s.serialize_unit(),
            Json::Bool(b) => s.serialize_bool(*b),
            Json::Num(n) => n.serialize(s),
            Json::Str(v) => s.serialize_str(v),
            Json::Arr(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Json::Obj(entries) => {
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
        Ok(Json::Num(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
        Ok(Json::Num(v.into()))
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Json, E> {
        serde_json::Number::from_f64(v)
            .map(Json::Num)
            .ok_or_else(|| E::custom("non-finite number"))
    }
    fn visit_str<E>(self, v: &str) -> Result<Json, E> {
        Ok(Json::Str(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Json, E> {
        Ok(Json::Str(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Json::Arr(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut entries = Vec::new();
        while let Some(entry) = map.next_entry::<String, Json>()? {
            entries.push(entry);
        }
        Ok(Json::Obj(entries))
    }
}

/// Decodes standard base64 (with or without padding); `None` on any invalid character.
fn base64_decode(input: &str) -> Option<Vec<u8>> {
    fn sextet(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    }
    let data = input.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(data.len() * 3 / 4);
    for chunk in data.chunks(4) {
        let mut acc = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            acc |= sextet(c)? << (18 - 6 * i);
        }
        let bytes = acc.to_be_bytes();
        match chunk.len() {
            4 => out.extend_from_slice(&bytes[1..4]),
            3 => out.extend_from_slice(&bytes[1..3]),
            2 => out.push(bytes[1]),
            _ => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn base64_decodes_aemm_user_data() {
        assert_eq!(
            base64_decode("MTIzNCxqb2huLHJlYm9vdCx0cnVlCg==").unwrap(),
            b"1234,john,reboot,true\n"
        );
        assert_eq!(base64_decode("YQ").unwrap(), b"a");
        assert_eq!(base64_decode("YWI=").unwrap(), b"ab");
        assert!(base64_decode("a").is_none());
        assert!(base64_decode("a*bc").is_none());
    }

    #[test]
    fn listing_marks_directories_and_leaf_wins() {
        let mut t = Tree::default();
        t.set("meta-data/iam/info", "{}");
        t.set("meta-data/iam/security-credentials", "role");
        t.set("meta-data/iam/security-credentials/role", "{}");
        assert_eq!(
            t.lookup("meta-data/iam"),
            Lookup::Listing("info\nsecurity-credentials/".into())
        );
        assert_eq!(
            t.lookup("meta-data/iam/security-credentials/"),
            Lookup::Value(Bytes::from("role"))
        );
        assert_eq!(t.lookup("meta-data/ia"), Lookup::Absent);
        t.remove("meta-data/iam");
        assert_eq!(t.lookup("meta-data"), Lookup::Absent);
    }

    #[test]
    fn a_finished_event_moves_to_history_in_order() {
        let mut t = Tree::default();
        t.set(
            SCHEDULED_PATH,
            r#"[{"NotBefore": "21 Jan 2019 09:00:43 GMT", "Code": "system-reboot",
                 "Description": "scheduled reboot", "EventId": "instance-event-1",
                 "NotAfter": "", "State": "active"},
                {"NotBefore": "22 Jan 2019 09:00:43 GMT", "Code": "instance-stop",
                 "Description": "stop", "EventId": "instance-event-2",
                 "NotAfter": "", "State": "active"}]"#,
        );
        assert!(
            finish_event(&mut t, "instance-event-3", EventOutcome::Completed)
                .unwrap_err()
                .contains("no event")
        );
        finish_event(&mut t, "instance-event-1", EventOutcome::Completed).unwrap();
        let body = |t: &Tree, k: &str| match t.lookup(k) {
            Lookup::Value(v) => serde_json::from_slice::<serde_json::Value>(&v).unwrap(),
            other => panic!("{k}: {other:?}"),
        };
        let h = body(&t, HISTORY_PATH);
        assert_eq!(h[0]["State"], "completed");
        assert_eq!(h[0]["Description"], "[Completed] scheduled reboot");
        assert_eq!(h[0]["NotBefore"], "21 Jan 2019 09:00:43 GMT");
        assert_eq!(body(&t, SCHEDULED_PATH)[0]["EventId"], "instance-event-2");
        // Field order kept: NotBefore first, State last.
        let Lookup::Value(raw) = t.lookup(HISTORY_PATH) else {
            panic!()
        };
        let raw = String::from_utf8(raw.to_vec()).unwrap();
        assert!(raw.find("NotBefore").unwrap() < raw.find("State").unwrap());
        finish_event(&mut t, "instance-event-2", EventOutcome::Canceled).unwrap();
        assert_eq!(t.lookup(SCHEDULED_PATH), Lookup::Absent);
        let h = body(&t, HISTORY_PATH);
        assert_eq!(h[1]["State"], "canceled");
        assert_eq!(h[1]["Description"], "[Canceled] stop");
        assert_eq!(h.as_array().unwrap().len(), 2);
        t.set(SCHEDULED_PATH, "{");
        assert!(finish_event(&mut t, "x", EventOutcome::Canceled)
            .unwrap_err()
            .contains("not JSON"));
    }

    #[test]
    fn objects_keep_file_order_with_tab_indent() {
        let t = Tree::aemm_defaults();
        let Lookup::Value(doc) = t.lookup("meta-data/iam/info") else {
            panic!("iam/info missing")
        };
        assert_eq!(
            std::str::from_utf8(&doc).unwrap(),
            "{\n\t\"Code\": \"Success\",\n\t\"LastUpdated\": \"2020-04-02T18:50:40Z\",\n\t\
             \"InstanceProfileArn\": \"arn:aws:iam::896453262835:instance-profile/baskinc-role\",\n\t\
             \"InstanceProfileId\": \"AIPA5BOGHHXZELSK34VU4\"\n}"
        );
    }
}
