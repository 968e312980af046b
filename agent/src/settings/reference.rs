//! The settings reference: every key with its type, default, trust class, doc text and an
//! example, generated from the code (`slurm-node-agent config reference`, checked into
//! `docs/settings.md`; a test fails when they differ).
//!
//! Where each part comes from:
//! - the keys and their types: the `Settings` struct and the section types its fields name,
//!   found wherever they live (`build/settings_docs.rs` reads every type of the library
//!   that derives `Deserialize`, with its doc comments, into [`ITEMS`]);
//! - the doc text: those doc comments, kept next to each key by `missing_docs`;
//! - the defaults: `Settings::default()` as TOML;
//! - the trust classes: each section's `Classified::TRUST` ([`super::trust::class_of`]);
//! - the examples: [`EXAMPLES`] below, by dotted key (keys do not move when code does;
//!   a test checks that each one is accepted).
//!
//! [`sections`] is the one place that lists the sections; it walks `Settings`, so a
//! section that moves to another module needs no change here.

use std::fmt::Write as _;

use super::trust::{self, KeyTrust, Trust};
use super::Settings;

/// A struct or enum of the library that derives `Deserialize`, as its source says.
#[derive(Debug)]
pub struct Item {
    /// Its module inside the crate (`settings::schema`).
    pub module: &'static str,
    /// Its name.
    pub name: &'static str,
    /// Its doc comment.
    pub doc: &'static str,
    /// `#[serde(default)]` on the type: every field may be left out.
    pub default: bool,
    /// An enum (its values are [`Item::variants`]).
    pub is_enum: bool,
    /// A struct's fields, as serde reads them.
    pub fields: &'static [Field],
    /// An enum's values, as serde reads them.
    pub variants: &'static [Variant],
}

/// One field of an [`Item`].
#[derive(Debug)]
pub struct Field {
    /// The key (serde's name for it).
    pub key: &'static str,
    /// The Rust type as written (`Vec<String>`, `HumanDuration`).
    pub ty: &'static str,
    /// `module::Name` of the [`Item`] the type names (directly or in `Vec`/`Option`), if any.
    pub target: &'static str,
    /// Its doc comment.
    pub doc: &'static str,
    /// `#[serde(default)]` on the field.
    pub default: bool,
}

/// One value of an enum [`Item`].
#[derive(Debug)]
pub struct Variant {
    /// The value as written in TOML.
    pub name: &'static str,
    /// Its doc comment.
    pub doc: &'static str,
}

include!(concat!(env!("OUT_DIR"), "/settings_docs.rs"));

/// An example value for every key, by dotted key: a TOML value, or for an array of tables
/// the whole TOML text. Each is checked to be accepted (agent/tests/settings_reference.rs).
pub const EXAMPLES: &[(&str, &str)] = &[
    ("node.role", r#""login""#),
    ("node.name", r#""gpu-001""#),
    ("node.name_template", r#""{instance_family}-{local_ipv4_dashed}""#),
    ("node.dynamic", "false"),
    ("node.features", r#"["efa", "lustre"]"#),
    ("node.auto_features", "false"),
    ("node.weight", "10"),
    ("node.real_memory_reserve_percent", "5"),
    ("node.real_memory_reserve_mib", "1024"),
    ("node.gpus", r#""8""#),
    ("node.gpu_wait", r#""2m""#),
    ("node.topology", r#""default:s1""#),
    ("slurm.conf_servers", r#"["10.0.0.10:6817", "10.0.0.11:6817"]"#),
    ("slurm.slurmd_options_file", r#""/etc/sysconfig/slurmd""#),
    ("slurm.slurmd_unit", r#""slurmd.service""#),
    ("slurm.munge_unit", r#""munge.service""#),
    ("slurm.sackd_unit", r#""sackd.service""#),
    ("slurm.sackd_options_file", r#""/etc/sysconfig/sackd""#),
    ("slurm.join_deadline", r#""20m""#),
    ("slurm.bin_dir", r#""/opt/slurm/bin""#),
    ("auth.type", r#""slurm""#),
    ("auth.key_source", r#""ssm:/cluster/munge-key""#),
    ("auth.key_path", r#""/etc/munge/munge.key""#),
    ("auth.key_owner", r#""munge""#),
    ("auth.key_encoding", r#""raw""#),
    ("auth.allow_string_parameter", "true"),
    ("auth.fetch_window", r#""30m""#),
    ("auth.throttle_spread", r#""60s""#),
    ("imds.endpoint", r#""http://127.0.0.1:1338""#),
    ("imds.timeout", r#""2s""#),
    ("imds.attempts", "6"),
    ("imds.token_ttl", r#""1h""#),
    ("imds.tags", r#""describe-tags""#),
    ("systemd.bus", r#""unix:path=/run/user/0/bus""#),
    ("agent.state_dir", r#""/var/lib/slurm-node-agent""#),
    (
        "mounts",
        "[[mounts]]\nfile_system_id = \"fs-0123456789abcdef0\"\nregion = \"us-east-1\"\nmount_name = \"abcdefgh\"\nmount_point = \"/fsx\"\n",
    ),
    ("events.enabled", "false"),
    ("scratch.enabled", "false"),
    ("scratch.mount_point", r#""/local/scratch""#),
    ("scratch.disks", "4"),
    ("scratch.wait", r#""1m""#),
    ("events.spot_interval", r#""2s""#),
    ("events.interval", r#""1m""#),
    ("events.maintenance_interval", r#""15m""#),
    ("events.rebalance", r#""drain""#),
    ("events.rebalance_window", r#""2h""#),
    ("events.maintenance_lead", r#""48h""#),
    ("events.maintenance_ignore_codes", r#"["system-maintenance"]"#),
    ("events.lifecycle", "false"),
    ("events.lifecycle_heartbeat_interval", r#""2m""#),
    ("events.lifecycle_max_wait", r#""6h""#),
    ("events.lifecycle_hooks", r#"["slurm-drain"]"#),
    ("events.spot_job_action", r#""signal""#),
    ("events.spot_job_signal", r#""USR1""#),
    ("events.spot_job_action_lead", r#""90s""#),
    ("events.capacity_block", "false"),
    ("events.capacity_block_lead", r#""6h""#),
    ("events.capacity_block_interval", r#""5m""#),
    ("upgrade.parameter", r#""/slurm/compute/image-id""#),
    ("upgrade.interval", r#""10m""#),
    ("upgrade.fleet_rate", "2.5"),
    ("upgrade.action", r#""reboot""#),
    ("upgrade.poweroff_unit", r#""poweroff.target""#),
    ("upgrade.hook", r#"["/usr/local/sbin/site-upgrade", "--quick"]"#),
    ("upgrade.hook_timeout", r#""1h""#),
    ("upgrade.resume_after_hook", "false"),
    ("upgrade.max_unavailable", r#""10%""#),
    ("upgrade.budget_partition", r#""compute""#),
    ("upgrade.budget_wait", r#""2m""#),
    ("upgrade.slot_timeout", r#""45m""#),
    ("upgrade.delete_node_record", "true"),
    ("drain.check_interval", r#""5s""#),
    (
        "drain.metrics_file",
        r#""/var/lib/node_exporter/textfile/drain.prom""#,
    ),
    ("drain.lock_timeout", r#""1m""#),
    ("drain.action_retry", r#""5m""#),
    ("health.checks_dir", r#""/etc/slurm-node-agent/checks.d""#),
    ("health.nhc_conf", r#"["/etc/nhc/nhc.conf"]"#),
    ("health.timeout", r#""20s""#),
    ("health.run_deadline", r#""40s""#),
    ("health.act", "false"),
    (
        "health.prometheus_textfile",
        r#""/var/lib/node_exporter/textfile/slurm_node_agent.prom""#,
    ),
    ("health.scontrol_timeout", r#""8s""#),
    ("health.interval", r#""5m""#),
    ("health.output_limit", "131072"),
    ("pcs.enabled", "true"),
    ("pcs.cluster_id", r#""pcs_abcdef1234""#),
    ("pcs.compute_node_group_id", r#""pcs_0123456789""#),
    ("pcs.endpoint", r#""https://pcs.us-east-1.amazonaws.com""#),
    ("pcs.register_window", r#""45m""#),
    (
        "pcs.bootstrap_id_file",
        r#""/run/slurm-node-agent/pcs-bootstrap-id""#,
    ),
    ("pcs.throttle_spread", r#""90s""#),
    ("node_lifecycle.poweroff_unit", r#""poweroff.target""#),
    ("node_lifecycle.script_caching_policy", r#""CACHE_ONCE""#),
    (
        "node_lifecycle.node_bootstrapped",
        "[[node_lifecycle.node_bootstrapped]]\nname = \"site-prepare\"\nscript_location = \"s3://site-scripts/prepare.sh\"\nexecution_policy = \"FIRST_BOOT_ONLY\"\non_error = \"TERMINATE\"\n",
    ),
    (
        "node_lifecycle.node_ready",
        "[[node_lifecycle.node_ready]]\nname = \"site-ready\"\nscript_location = \"file:/opt/site/ready.sh\"\narguments = [\"--quick\"]\nexecution_policy = \"EVERY_BOOT\"\non_error = \"STOP_SEQUENCE\"\n",
    ),    ("repair.mode", r#""report""#),
    ("repair.action", r#""auto""#),
    ("repair.breaker_share", "0.25"),
    ("repair.breaker_min_nodes", "3"),
    ("repair.replace_within_boots", "2"),
    ("repair.settle", r#""5m""#),
    ("repair.flap_window", r#""12h""#),
    ("repair.flap_max_replacements", "5"),
    ("start_gate.profile", r#""quick""#),
    ("start_gate.budget", r#""10m""#),
    ("start_gate.dcgmi", r#""/usr/bin/dcgmi""#),
    ("start_gate.nvidia_smi", r#""/usr/bin/nvidia-smi""#),
    ("start_gate.host_engine_unit", r#""nvidia-dcgm.service""#),
    ("start_gate.host_engine_wait", r#""1m""#),
    ("orphan.mode", r#""on""#),
    ("orphan.after", r#""45m""#),
    ("orphan.record_deleted_grace", r#""15m""#),
    (
        "cloudwatch.config_file",
        r#""/opt/aws/amazon-cloudwatch-agent/etc/amazon-cloudwatch-agent.json""#,
    ),
    ("cloudwatch.log_group_template", r#""/hpc/{cluster}/slurm-nodes/{log}""#),
    ("cloudwatch.cluster_name", r#""genomics-prod""#),
    ("cloudwatch.retention_days", "90"),
    (
        "cloudwatch.prometheus_config",
        r#""/opt/aws/amazon-cloudwatch-agent/etc/prometheus.yaml""#,
    ),
    (
        "start_gate.commands",
        "[[start_gate.commands]]\nname = \"efa-loopback\"\nargv = [\"/opt/site/efa-loopback.sh\", \"--quick\"]\nbudget = \"2m\"\n",
    ),
    (
        "repair.checks",
        "[[repair.checks]]\ncheck = \"shared file systems\"\naction = \"isolate\"\n",
    ),
];

/// One key of the reference.
#[derive(Debug)]
pub struct Key {
    /// `node.name`; for an array of tables its name (`mounts`).
    pub dotted: String,
    /// Its type in words (`string`, `duration`, `list of strings`, ...).
    pub ty: String,
    /// What it does.
    pub doc: String,
    /// The default as TOML; `None` when it has none (not set).
    pub default: Option<toml::Value>,
    /// Its trust class.
    pub trust: KeyTrust,
    /// An enum's values with their meaning.
    pub values: Vec<(&'static str, String)>,
    /// Its example (see [`EXAMPLES`]); empty when there is none.
    pub example: &'static str,
    /// For an array of tables: the keys of one entry.
    pub entry: Vec<Key>,
    /// It may be left out (it has a default, or no value is one).
    pub optional: bool,
}

/// One settings section (a TOML table, or an array of tables such as `[[mounts]]`).
#[derive(Debug)]
pub struct Section {
    /// The table's name (`node`).
    pub name: String,
    /// What it is for.
    pub doc: String,
    /// An array of tables (`[[mounts]]`): its one key is the array itself.
    pub array: bool,
    /// Its keys, in schema order.
    pub keys: Vec<Key>,
}

/// The documented item named by a type path inside the crate (`settings::schema::Node`).
fn item(path: &str) -> Option<&'static Item> {
    ITEMS.iter().find(|i| {
        let full = if i.module.is_empty() {
            i.name.to_string()
        } else {
            format!("{}::{}", i.module, i.name)
        };
        full == path
    })
}

/// The [`Item`] of a Rust type of this crate, by its `type_name`.
fn item_of<T>() -> Option<&'static Item> {
    let name = std::any::type_name::<T>();
    item(name.split_once("::").map_or(name, |(_, rest)| rest))
}

/// Every section of [`Settings`], in schema order, with its keys. Walks `Settings` through
/// its fields' types, so that it follows sections wherever they are defined.
///
/// # Panics
/// When `Settings` or a section type has no docs (a type that no longer derives
/// `Deserialize`); the reference's test says so first.
pub fn sections() -> Vec<Section> {
    #[allow(clippy::expect_used)]
    let settings = item_of::<Settings>().expect("Settings is documented");
    let defaults = toml::Value::try_from(Settings::default())
        .ok()
        .and_then(|v| v.as_table().cloned())
        .unwrap_or_default();
    let mut out = Vec::new();
    for f in settings.fields {
        let Some(ty) = item(f.target) else {
            continue;
        };
        let array = is_vec(f.ty);
        // An array of tables is its one key: the field says what the array is for, the
        // type what one entry is.
        let doc = if array || ty.doc.is_empty() {
            f.doc
        } else {
            ty.doc
        };
        let keys = if array {
            let mut k = key(f.key, f.key, f, defaults.get(f.key));
            k.doc = clean(ty.doc);
            vec![k]
        } else {
            let table = defaults.get(f.key).and_then(toml::Value::as_table);
            ty.fields
                .iter()
                .map(|k| {
                    let dotted = format!("{}.{}", f.key, k.key);
                    key(&dotted, &dotted, k, table.and_then(|t| t.get(k.key)))
                })
                .collect()
        };
        out.push(Section {
            name: f.key.to_string(),
            doc: section_doc(f.key, &clean(doc)),
            array,
            keys,
        });
    }
    out
}

/// A section's doc without the `` `[name]`: `` its heading already says, capitalised.
fn section_doc(name: &str, doc: &str) -> String {
    let rest = [format!("`[{name}]`: "), format!("`[[{name}]]`: ")]
        .iter()
        .find_map(|p| doc.strip_prefix(p.as_str()))
        .unwrap_or(doc);
    let mut c = rest.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

/// A key from its field; `trust_key` is what [`trust::class_of`] takes.
fn key(dotted: &str, trust_key: &str, f: &Field, default: Option<&toml::Value>) -> Key {
    let target = item(f.target);
    let values = target
        .filter(|t| t.is_enum)
        .map(|t| t.variants.iter().map(|v| (v.name, clean(v.doc))).collect())
        .unwrap_or_default();
    let entry = match target {
        Some(t) if !t.is_enum && is_vec(f.ty) => entry_keys(dotted, t),
        _ => Vec::new(),
    };
    Key {
        dotted: dotted.to_string(),
        ty: type_words(f.ty, target),
        doc: clean(f.doc),
        default: default.cloned(),
        trust: trust::class_of(trust_key),
        values,
        example: EXAMPLES
            .iter()
            .find(|(k, _)| *k == dotted)
            .map_or("", |(_, e)| e),
        entry,
        optional: true,
    }
}

/// The keys of one entry of an array of tables; defaults from an entry with no keys, where
/// the type takes one.
fn entry_keys(dotted: &str, t: &'static Item) -> Vec<Key> {
    let empty = entry_defaults(dotted);
    t.fields
        .iter()
        .map(|k| {
            let default = match &empty {
                Some(table) => table.get(k.key).cloned(),
                None if k.default => Some(type_default(k.ty)),
                None => None,
            };
            // An optional key left out has no value: "not set", not "required".
            let optional = k.ty.starts_with("Option<");
            let target = item(k.target);
            Key {
                dotted: k.key.to_string(),
                ty: type_words(k.ty, target),
                doc: clean(k.doc),
                default,
                trust: trust::class_of(dotted),
                values: target
                    .filter(|t| t.is_enum)
                    .map(|t| t.variants.iter().map(|v| (v.name, clean(v.doc))).collect())
                    .unwrap_or_default(),
                example: "",
                entry: Vec::new(),
                optional: optional || empty.is_some(),
            }
        })
        .collect()
}

/// What an entry with no keys (`[[mounts]]`) reads as, when every key has a default.
fn entry_defaults(dotted: &str) -> Option<toml::Table> {
    let text = format!("[[{dotted}]]\n");
    let settings: Settings = toml::from_str(&text).ok()?;
    let v = toml::Value::try_from(settings).ok()?;
    let mut cur = &v;
    for part in dotted.split('.') {
        cur = cur.get(part)?;
    }
    cur.as_array()?.first()?.as_table().cloned()
}

/// The default of a field's type where the field says `#[serde(default)]`.
fn type_default(ty: &str) -> toml::Value {
    match base(ty) {
        _ if is_vec(ty) => toml::Value::Array(Vec::new()),
        "bool" => toml::Value::Boolean(false),
        b if is_integer(b) => toml::Value::Integer(0),
        _ => toml::Value::String(String::new()),
    }
}

fn is_vec(ty: &str) -> bool {
    ty.starts_with("Vec<") || ty.contains("::Vec<")
}

fn is_integer(ty: &str) -> bool {
    matches!(
        ty,
        "i8" | "i16" | "i32" | "i64" | "u8" | "u16" | "u32" | "u64" | "usize" | "isize"
    )
}

/// The last segment of the innermost type (`Option<Vec<crate::x::Y>>` → `Y`).
fn base(ty: &str) -> &str {
    let inner = ty.rsplit('<').next().unwrap_or(ty).trim_end_matches('>');
    inner.rsplit("::").next().unwrap_or(inner)
}

/// A type in the words of a settings file.
fn type_words(ty: &str, target: Option<&Item>) -> String {
    let optional = ty.starts_with("Option<");
    let inner = if optional {
        ty.trim_start_matches("Option<").trim_end_matches('>')
    } else {
        ty
    };
    let one = |t: &str, plural: bool| -> String {
        let s = |w: &str| format!("{w}{}", if plural { "s" } else { "" });
        match (base(t), target) {
            ("String", _) => s("string"),
            ("PathBuf", _) => s("path"),
            ("bool", _) => s("boolean"),
            ("HumanDuration", _) => s("duration"),
            ("f32" | "f64", _) => s("number"),
            (b, _) if is_integer(b) => s("integer"),
            (_, Some(it)) if it.is_enum => {
                let vals: Vec<String> = it
                    .variants
                    .iter()
                    .map(|v| format!("`{}`", v.name))
                    .collect();
                format!("{} ({})", s("string"), vals.join(", "))
            }
            (_, Some(it)) if !it.fields.is_empty() => {
                if plural {
                    "array of tables".into()
                } else {
                    "table".into()
                }
            }
            (b, _) => format!("`{b}`"),
        }
    };
    let words = if is_vec(inner) {
        let el = inner.trim_start_matches("Vec<").trim_end_matches('>');
        match target {
            Some(t) if !t.is_enum => one(el, true),
            _ => format!("list of {}", one(el, true)),
        }
    } else {
        one(inner, false)
    };
    if optional {
        format!("{words}, optional")
    } else {
        words
    }
}

/// Doc comment text as Markdown for the page: rustdoc's intra-doc links become plain code,
/// and the lines of a paragraph are joined.
fn clean(doc: &str) -> String {
    let mut out = String::with_capacity(doc.len());
    let mut rest = doc;
    while let Some(open) = rest.find("[`") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find("`]") {
            Some(close)
                if !after[close + 2..].starts_with('(') && !after[close + 2..].starts_with('[') =>
            {
                out.push_str(&after[..close + 1]);
                rest = &after[close + 2..];
            }
            _ => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out.split("\n\n")
        .map(|p| p.lines().map(str::trim).collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n\n")
}

fn trust_words(k: &KeyTrust) -> String {
    let who = match k.trust {
        Trust::Image => "root-owned settings files of the image and the command line only",
        Trust::UserData => "settings files, the command line and the user data part",
        Trust::Tag => "settings files, the command line, the user data part and instance tags",
    };
    let limited = if k.lower.is_some() {
        "; limited: from user data only some values are taken (see [Who may set what](operator-guide.md#who-may-set-what))"
    } else {
        ""
    };
    format!("`{}`: {who}{limited}", k.trust)
}

fn toml_inline(v: &toml::Value) -> String {
    match v {
        toml::Value::Array(a) if a.is_empty() => "[]".into(),
        v => v.to_string(),
    }
}

/// The TOML text of a key's example.
pub fn example_toml(dotted: &str, example: &str) -> String {
    if example.starts_with("[[") {
        return example.to_string();
    }
    let (section, leaf) = dotted.split_once('.').unwrap_or((dotted, ""));
    format!("[{section}]\n{leaf} = {example}\n")
}

/// The instance tag form of an example (`slurm-node-agent:node.name` = `gpu-001`): lists
/// comma separated, strings without quotes.
fn tag_form(example: &str) -> Option<String> {
    let v: toml::Value = toml::from_str::<toml::Table>(&format!("v = {example}"))
        .ok()?
        .remove("v")?;
    Some(match v {
        toml::Value::String(s) => s,
        toml::Value::Array(a) => a
            .iter()
            .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_string))
            .collect::<Vec<_>>()
            .join(","),
        v => v.to_string(),
    })
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// Explanation at the head of the page.
const PREAMBLE: &str = "\
Every key the agent reads, with its type, its default, who may set it and an example. \
Generated from the code: the settings types, their doc comments, `Settings::default()` \
and each section's trust classes (`slurm-node-agent config reference` prints this page \
for the installed build). How the layers combine, what the trust classes mean and why: \
[the operator guide's Settings chapter](operator-guide.md#settings).

A key is written `section.key` here; in a settings file it is `key` under `[section]`, \
in a tag `slurm-node-agent:section.key`, on the command line `--set section.key=value`. \
Types: a *duration* is a string such as `\"90s\"`, `\"10m\"` or `\"1h 30m\"` (at most 366 \
days); a *path* is a string holding an absolute path; lists given in a tag or `--set` are \
comma separated. Unknown keys are errors.
";

/// The whole reference as Markdown (`docs/settings.md`).
pub fn markdown() -> String {
    let sections = sections();
    let mut s = String::from(
        "<!-- Generated by `slurm-node-agent config reference` from the code. Do not edit: \
         change the doc comments, defaults or trust classes in the code, then run \
         `UPDATE_DOCS=1 cargo test -p slurm-node-agent --test settings_reference`. -->\n\n\
         # Settings reference\n\n",
    );
    s.push_str(PREAMBLE);
    s.push_str("\nSections: ");
    let links: Vec<String> = sections
        .iter()
        .map(|sec| {
            let head = if sec.array {
                format!("[[{}]]", sec.name)
            } else {
                format!("[{}]", sec.name)
            };
            format!("[`{head}`](#{})", anchor(&head))
        })
        .collect();
    s.push_str(&links.join(", "));
    s.push_str(
        ".\n\n## Keys and who may set them\n\n\
         `image`: only root-owned settings files of the image and the command line; \
         `user-data`: also the user data part; `tag`: also instance tags. `limited`: \
         user data may set the key to some values only.\n\n\
         <!-- trust-table: generated by trust::markdown_table(); a test checks it -->\n",
    );
    s.push_str(&trust::markdown_table());
    for sec in &sections {
        let head = if sec.array {
            format!("[[{}]]", sec.name)
        } else {
            format!("[{}]", sec.name)
        };
        let _ = write!(s, "\n## `{head}`\n\n{}\n", sec.doc);
        for k in &sec.keys {
            if sec.array {
                s.push('\n');
            } else {
                let _ = write!(s, "\n### `{}`\n\n", k.dotted);
            }
            if !k.doc.is_empty() {
                let _ = writeln!(s, "{}\n", k.doc);
            }
            let _ = writeln!(s, "- Type: {}", k.ty);
            for (v, d) in &k.values {
                let _ = writeln!(s, "  - `{v}`: {d}");
            }
            let _ = writeln!(
                s,
                "- Default: {}",
                k.default
                    .as_ref()
                    .map_or("not set".to_string(), |d| format!("`{}`", toml_inline(d)))
            );
            let _ = writeln!(s, "- Trust: {}", trust_words(&k.trust));
            if !k.example.is_empty() {
                let _ = write!(
                    s,
                    "- Example:\n\n  ```toml\n{}  ```\n",
                    example_toml(&k.dotted, k.example)
                        .lines()
                        .map(|l| format!("  {l}\n"))
                        .collect::<String>()
                );
                if k.trust.trust == Trust::Tag {
                    if let Some(t) = tag_form(k.example) {
                        let _ = writeln!(
                            s,
                            "\n  As an instance tag: `slurm-node-agent:{}` = `{t}`",
                            k.dotted
                        );
                    }
                }
            }
            if !k.entry.is_empty() {
                s.push_str("\nKeys of each entry:\n\n| key | type | default | meaning |\n|---|---|---|---|\n");
                for e in &k.entry {
                    let mut meaning = e.doc.clone();
                    for (v, d) in &e.values {
                        let _ = write!(meaning, " `{v}`: {d}");
                    }
                    let _ = writeln!(
                        s,
                        "| `{}` | {} | {} | {} |",
                        e.dotted,
                        cell(&e.ty),
                        match (&e.default, e.optional) {
                            (Some(d), _) => format!("`{}`", cell(&toml_inline(d))),
                            (None, true) => "not set".to_string(),
                            (None, false) => "required".to_string(),
                        },
                        cell(&meaning)
                    );
                }
            }
        }
    }
    s
}

/// A heading's anchor as GitHub makes it: lower case, spaces to `-`, other punctuation
/// dropped.
fn anchor(head: &str) -> String {
    head.chars()
        .filter_map(|c| match c {
            c if c.is_alphanumeric() || c == '_' || c == '-' => Some(c.to_ascii_lowercase()),
            ' ' => Some('-'),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_of_the_trust_tables_is_in_the_reference_with_its_docs() {
        let keys: Vec<String> = sections()
            .into_iter()
            .flat_map(|s| s.keys.into_iter().map(|k| (k.dotted, k.doc, k.ty)))
            .map(|(k, doc, ty)| {
                assert!(!doc.is_empty(), "{k}: no doc comment");
                assert!(!ty.starts_with('`'), "{k}: type not in words: {ty}");
                k
            })
            .collect();
        let all: Vec<String> = trust::all_keys().into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, all);
    }

    #[test]
    fn doc_links_become_code() {
        assert_eq!(
            clean("at most [`HumanDuration::MAX`]: a\nb"),
            "at most `HumanDuration::MAX`: a b"
        );
        assert_eq!(clean("see [`x`](y)"), "see [`x`](y)");
    }
}
