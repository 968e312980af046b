//! Checking Packer HCL2 templates against Packer's own schema, without a current Packer.
//!
//! Only Packer 1.6.6 can be installed on the build machines and it cannot read templates
//! with `required_plugins`, so `packer validate` is usually skipped. This module checks every
//! block of a template folder against the HCL2 schema extracted from Packer's and the
//! Amazon plugin's generated `*.hcl2spec.go` files and Packer's hand-written core schemas
//! (`imagebuilder/data/`, provenance in `imagebuilder/data/PROVENANCE.md`): once at the
//! current versions (Packer v1.16.0, amazon v1.8.2) and once at the lowest versions the
//! templates allow (Packer v1.10.0, amazon v1.3.0), since a template must work with both.
//!
//! Findings:
//! - error: an unknown attribute or block, an attribute written as a block or the other way
//!   round, a wrong number of block labels, a repeated single block, a literal value whose
//!   type is clearly wrong (e.g. a list where the schema says `string`; expressions are not
//!   evaluated), or a missing attribute the schema marks `required` (hcldec's Required flag);
//! - warning: a missing attribute whose Go field has the struct tag `required:"true"`
//!   (`required_tag`, a documentation marker: the plugin's `Prepare()` decides, and accepts
//!   e.g. `source_ami_filter` instead of `source_ami`), a block type the schema does not
//!   cover (only `amazon-ebs`, `shell`, `file` and `manifest` are), and a template whose
//!   version constraints allow versions older than the lowest extraction.
//!
//! The schema files' format is described in `shared/reference/packer/README.md` ("Field
//! meanings"); blocks are `{nesting, labels, attributes, blocks}`, attributes
//! `{type, required, required_tag}`.

use crate::error::{Error, Result};
use crate::packer::Version;
use crate::template::template_files;
use serde::Serialize;
use serde_json::{Map, Value as Json};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// The schema at the current versions (Packer v1.16.0, amazon plugin v1.8.2, SDK v0.6.10).
const CURRENT: &str = include_str!("../data/packer-hcl2-schema.json");
/// The schema at the lowest versions `packer/node.pkr.hcl` allows (Packer v1.10.0, amazon
/// plugin v1.3.0, SDK v0.5.2; core blocks transcribed from v1.16.0).
const LOWEST: &str = include_str!("../data/packer-hcl2-schema.packer-v1.10.0.amazon-v1.3.0.json");

/// Known alternatives to attributes marked `required_tag` (from the plugin's `Prepare()`
/// rules, as summarised in the reference README), shown in the warning.
const ALTERNATIVES: &[(&str, &str)] = &[
    ("source_ami", "the plugin accepts source_ami_filter instead"),
    (
        "access_key",
        "credentials may come from the environment, a profile or an instance role",
    ),
    (
        "secret_key",
        "credentials may come from the environment, a profile or an instance role",
    ),
    (
        "content",
        "the file provisioner needs either content or source",
    ),
    (
        "source",
        "the file provisioner needs either content or source",
    ),
];

/// One extraction of the schema.
#[derive(Debug, Clone)]
pub struct Schema {
    /// e.g. `Packer v1.16.0 + amazon v1.8.2`.
    pub label: String,
    /// Packer version the plugin part was extracted at.
    pub packer: Option<Version>,
    /// Amazon plugin version.
    pub amazon: Option<Version>,
    root: Json,
}

impl Schema {
    /// Read a schema file's text (the format of `shared/reference/packer-hcl2-schema.json`).
    pub fn parse(text: &str, origin: &str) -> Result<Schema> {
        let root: Json = serde_json::from_str(text).map_err(|e| Error::File {
            path: PathBuf::from(origin),
            message: format!("not a Packer HCL2 schema file: {e}"),
        })?;
        let version_of = |key: &str| {
            root["source"][key]
                .as_str()
                .and_then(|s| s.rsplit_once('@'))
                .and_then(|(_, v)| Version::parse(v))
        };
        let packer = version_of("packer");
        let amazon = version_of("packer-plugin-amazon");
        let show = |v: Option<Version>| v.map_or("?".to_string(), |v| format!("v{v}"));
        Ok(Schema {
            label: format!("Packer {} + amazon {}", show(packer), show(amazon)),
            packer,
            amazon,
            root,
        })
    }

    /// The embedded extraction at the current versions.
    pub fn current() -> Result<Schema> {
        Schema::parse(CURRENT, "imagebuilder/data/packer-hcl2-schema.json")
    }

    /// The embedded extraction at the lowest versions the templates allow. Its core block
    /// part is the v1.16.0 transcription; the reference README says Packer v1.10.0 lacks
    /// only the top-level `hcp_packer_registry` block and the provisioner
    /// `continue_on_error` attribute, so both are removed here.
    pub fn lowest() -> Result<Schema> {
        let mut s = Schema::parse(
            LOWEST,
            "imagebuilder/data/packer-hcl2-schema.packer-v1.10.0.amazon-v1.3.0.json",
        )?;
        if let Some(blocks) = s.root["top_level"]["blocks"].as_object_mut() {
            blocks.remove("hcp_packer_registry");
        }
        for kind in ["provisioner", "error-cleanup-provisioner"] {
            if let Some(attrs) = s.root["build_block"]["blocks"][kind]["attributes"].as_object_mut()
            {
                attrs.remove("continue_on_error");
            }
        }
        Ok(s)
    }

    /// Both embedded extractions, current first.
    pub fn embedded() -> Result<Vec<Schema>> {
        Ok(vec![Schema::current()?, Schema::lowest()?])
    }
}

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Packer would refuse the template (or misread it).
    Error,
    /// Worth a look; Packer may still accept it.
    Warning,
}

/// One problem found in a template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Error or warning.
    pub severity: Severity,
    /// The `*.pkr.hcl` file.
    pub file: PathBuf,
    /// Where in the file: blocks from the top, e.g. `build > provisioner "file" #3`.
    pub location: String,
    /// What is wrong, naming the attribute or block.
    pub message: String,
    /// The schema extractions that report it (labels of [`Schema`]).
    pub schemas: Vec<String>,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sev = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(
            f,
            "{sev}: {}: {}: {} [{}]",
            self.file.display(),
            self.location,
            self.message,
            self.schemas.join("; ")
        )
    }
}

/// Check every `*.pkr.hcl` file of a template folder (or one file) against each schema.
/// Findings reported by several schemas are reported once, naming them all. Errors:
/// unreadable or non-HCL files ([`Error::File`], [`Error::Io`]).
pub fn check(path: &Path, schemas: &[Schema]) -> Result<Vec<Finding>> {
    let mut merged: BTreeMap<(Severity, PathBuf, String, String), Vec<String>> = BTreeMap::new();
    let mut order = Vec::new();
    for file in template_files(path)? {
        let text = std::fs::read_to_string(&file)
            .map_err(|e| Error::io(format!("reading {}", file.display()), e))?;
        let body = hcl::parse(&text).map_err(|e| Error::File {
            path: file.clone(),
            message: format!("not valid HCL: {e}"),
        })?;
        for schema in schemas {
            let mut c = Checker {
                root: &schema.root,
                out: Vec::new(),
            };
            c.top(&body);
            for (sev, loc, msg) in c.out {
                let key = (sev, file.clone(), loc, msg);
                let entry = merged.entry(key.clone()).or_default();
                if entry.is_empty() {
                    order.push(key);
                }
                if !entry.contains(&schema.label) {
                    entry.push(schema.label.clone());
                }
            }
        }
    }
    let mut findings: Vec<Finding> = order
        .into_iter()
        .map(|key| {
            let schemas = merged.remove(&key).unwrap_or_default();
            let (severity, file, location, message) = key;
            Finding {
                severity,
                file,
                location,
                message,
                schemas,
            }
        })
        .collect();
    findings.sort_by_key(|f| f.severity);
    Ok(findings)
}

type Out = Vec<(Severity, String, String)>;

struct Checker<'a> {
    root: &'a Json,
    out: Out,
}

fn empty() -> &'static Map<String, Json> {
    static EMPTY: std::sync::OnceLock<Map<String, Json>> = std::sync::OnceLock::new();
    EMPTY.get_or_init(Map::new)
}

fn obj(v: &Json) -> &Map<String, Json> {
    v.as_object().unwrap_or_else(|| empty())
}

fn block_name(block: &hcl::Block) -> String {
    let mut s = block.identifier().to_string();
    for l in block.labels() {
        s.push_str(&format!(" \"{}\"", l.as_str()));
    }
    s
}

fn join(loc: &str, name: &str) -> String {
    if loc.is_empty() {
        name.to_string()
    } else {
        format!("{loc} > {name}")
    }
}

fn names(map: &Map<String, Json>) -> String {
    let mut v: Vec<&str> = map.keys().map(String::as_str).collect();
    v.sort();
    v.join(", ")
}

impl Checker<'_> {
    fn error(&mut self, loc: &str, msg: String) {
        self.out.push((Severity::Error, loc.to_string(), msg));
    }

    fn warn(&mut self, loc: &str, msg: String) {
        self.out.push((Severity::Warning, loc.to_string(), msg));
    }

    fn top(&mut self, body: &hcl::Body) {
        let root = self.root;
        let blocks = obj(&root["top_level"]["blocks"]);
        for attr in body.attributes() {
            self.error(
                "(top level)",
                format!(
                    "attribute '{}' is not allowed at the top level of a Packer template",
                    attr.key()
                ),
            );
        }
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for block in body.blocks() {
            let id = block.identifier();
            let name = block_name(block);
            let n = counts.entry(name.clone()).or_default();
            *n += 1;
            let loc = if *n > 1 {
                format!("{name} #{n}")
            } else {
                name.clone()
            };
            let Some(spec) = blocks.get(id) else {
                self.error(&loc, format!("unknown top-level block '{id}'"));
                continue;
            };
            if !self.labels(block, &spec["labels"], &loc) {
                continue;
            }
            if spec["decoded"] == Json::Bool(false) {
                self.warn(
                    &loc,
                    format!("'{id}' is in Packer's schema but Packer never decodes it"),
                );
                continue;
            }
            let label = |i: usize| block.labels().get(i).map(|l| l.as_str()).unwrap_or("");
            match id {
                "packer" => self.packer_block(block.body(), &loc),
                "variable" => {
                    let spec = &root["variable_block"];
                    self.body(block.body(), spec, &loc, true);
                }
                "variables" | "locals" => {
                    for b in block.body().blocks() {
                        self.error(
                            &join(&loc, &block_name(b)),
                            format!("'{id}' holds attributes only, not blocks"),
                        );
                    }
                }
                "local" => self.body(block.body(), &root["local_block"], &loc, true),
                "source" => {
                    let ty = label(0);
                    match root["sources"].get(ty) {
                        Some(spec) => self.body(block.body(), spec, &loc, true),
                        None => self.warn(
                            &loc,
                            format!(
                                "builder '{ty}' is not covered by the schema (covered: {}); its body was not checked",
                                names(obj(&root["sources"]))
                            ),
                        ),
                    }
                }
                "data" => {
                    let ty = label(0);
                    match root["data_sources"].get(ty) {
                        Some(spec) => self.body(block.body(), spec, &loc, true),
                        None => self.warn(
                            &loc,
                            format!(
                                "data source '{ty}' is not covered by the schema (covered: {}); its body was not checked",
                                names(obj(&root["data_sources"]))
                            ),
                        ),
                    }
                }
                "build" => self.build(block.body(), &loc),
                "hcp_packer_registry" => {
                    self.body(block.body(), &root["hcp_packer_registry_block"], &loc, true)
                }
                _ => {}
            }
        }
        for (name, n) in counts {
            if (name.starts_with("variable ") || name.starts_with("source ")) && n > 1 {
                self.error(
                    &name,
                    format!("{name} is declared {n} times; Packer refuses duplicates"),
                );
            }
        }
    }

    /// Check the number of labels against the spec's `labels` list (absent = none).
    fn labels(&mut self, block: &hcl::Block, labels: &Json, loc: &str) -> bool {
        let want: Vec<&str> = labels
            .as_array()
            .map(|a| a.iter().filter_map(Json::as_str).collect())
            .unwrap_or_default();
        let got = block.labels().len();
        if got == want.len() {
            return true;
        }
        self.error(
            loc,
            format!(
                "block '{}' takes {} label(s){}, found {got}",
                block.identifier(),
                want.len(),
                if want.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", want.join(", "))
                }
            ),
        );
        false
    }

    /// `packer { required_version, required_plugins { name = { version, source } } }`.
    fn packer_block(&mut self, body: &hcl::Body, loc: &str) {
        let spec = &self.root["packer_block"];
        let attrs = obj(&spec["attributes"]);
        let blocks = obj(&spec["blocks"]);
        self.attributes(body, attrs, blocks, loc);
        for b in body.blocks() {
            let bloc = join(loc, &block_name(b));
            if b.identifier() != "required_plugins" {
                self.unknown_block(b.identifier(), attrs, blocks, &bloc);
                continue;
            }
            let value_spec = &blocks["required_plugins"]["attribute_value"];
            let keys = obj(&value_spec["keys"]);
            for inner in b.body().blocks() {
                self.error(
                    &join(&bloc, &block_name(inner)),
                    "required_plugins holds attributes (name = { version, source }), not blocks"
                        .into(),
                );
            }
            for attr in b.body().attributes() {
                let aloc = join(&bloc, attr.key());
                let hcl::Expression::Object(o) = attr.expr() else {
                    self.error(
                        &aloc,
                        format!(
                            "plugin '{}' must be an object {{ version = \"...\", source = \"...\" }}",
                            attr.key()
                        ),
                    );
                    continue;
                };
                let mut present = Vec::new();
                for (k, v) in o {
                    let key = match k {
                        hcl::ObjectKey::Identifier(i) => i.as_str().to_string(),
                        hcl::ObjectKey::Expression(hcl::Expression::String(s)) => s.clone(),
                        _ => continue,
                    };
                    match keys.get(&key) {
                        Some(kspec) => {
                            self.type_check(&aloc, &key, kspec, v);
                            present.push(key);
                        }
                        None => self.error(
                            &aloc,
                            format!(
                                "unknown key '{key}' in plugin '{}' (allowed: {})",
                                attr.key(),
                                names(keys)
                            ),
                        ),
                    }
                }
                for (k, kspec) in keys {
                    if kspec["required"] == Json::Bool(true) && !present.contains(k) {
                        self.error(
                            &aloc,
                            format!("missing required key '{k}' in plugin '{}'", attr.key()),
                        );
                    }
                }
            }
        }
    }

    /// `build { ... }`: its own attributes, then sources, provisioners, post-processors.
    fn build(&mut self, body: &hcl::Body, loc: &str) {
        let root = self.root;
        let spec = &root["build_block"];
        let attrs = obj(&spec["attributes"]);
        let blocks = obj(&spec["blocks"]);
        self.attributes(body, attrs, blocks, loc);
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for b in body.blocks() {
            let id = b.identifier();
            let n = counts.entry(id.to_string()).or_default();
            *n += 1;
            let bloc = join(loc, &format!("{} #{n}", block_name(b)));
            let Some(bspec) = blocks.get(id) else {
                self.unknown_block(id, attrs, blocks, &bloc);
                continue;
            };
            if !self.labels(b, &bspec["labels"], &bloc) {
                continue;
            }
            match id {
                "provisioner" | "error-cleanup-provisioner" => {
                    self.plugin_block(b, bspec, "provisioners", &bloc)
                }
                "post-processor" => self.plugin_block(b, bspec, "post_processors", &bloc),
                "post-processors" => {
                    let inner_spec = &bspec["blocks"]["post-processor"];
                    for attr in b.body().attributes() {
                        self.error(
                            &bloc,
                            format!(
                                "unknown attribute '{}': post-processors holds post-processor blocks only",
                                attr.key()
                            ),
                        );
                    }
                    for (i, inner) in b.body().blocks().enumerate() {
                        let iloc = join(&bloc, &format!("{} #{}", block_name(inner), i + 1));
                        if inner.identifier() != "post-processor" {
                            self.error(
                                &iloc,
                                format!(
                                    "unknown block '{}': post-processors holds post-processor blocks only",
                                    inner.identifier()
                                ),
                            );
                        } else if self.labels(inner, &inner_spec["labels"], &iloc) {
                            self.plugin_block(inner, inner_spec, "post_processors", &iloc);
                        }
                    }
                }
                "source" => {
                    // `source "source.TYPE.NAME" { ... }`: the body is merged into the
                    // referenced source and decoded by its builder.
                    let reference = b.labels().first().map(|l| l.as_str()).unwrap_or("");
                    let ty = reference
                        .trim_start_matches("source.")
                        .split('.')
                        .next()
                        .unwrap_or("");
                    match root["sources"].get(ty) {
                        Some(src) => {
                            let mut a = obj(&src["attributes"]).clone();
                            a.extend(obj(&bspec["attributes"]).clone());
                            let mut merged = src.clone();
                            merged["attributes"] = Json::Object(a);
                            self.body(b.body(), &merged, &bloc, false);
                        }
                        None => self.warn(
                            &bloc,
                            format!(
                                "source '{reference}': builder '{ty}' is not covered by the schema; its body was not checked"
                            ),
                        ),
                    }
                }
                "from" => self.warn(
                    &bloc,
                    "'from' is in Packer's schema but Packer never decodes it".into(),
                ),
                _ => self.body(b.body(), bspec, &bloc, true),
            }
        }
        self.single_counts(&counts, blocks, loc);
    }

    /// A provisioner or post-processor: the core's common attributes plus the plugin's.
    fn plugin_block(&mut self, b: &hcl::Block, common: &Json, kind: &str, loc: &str) {
        let ty = b.labels().first().map(|l| l.as_str()).unwrap_or("");
        let Some(plugin) = self.root[kind].get(ty) else {
            self.warn(
                loc,
                format!(
                    "{} type '{ty}' is not covered by the schema (covered: {}); its body was not checked",
                    kind.trim_end_matches('s').replace('_', "-"),
                    names(obj(&self.root[kind]))
                ),
            );
            return;
        };
        let mut attrs = obj(&plugin["attributes"]).clone();
        attrs.extend(obj(&common["attributes"]).clone());
        let mut merged = plugin.clone();
        merged["attributes"] = Json::Object(attrs);
        self.body(b.body(), &merged, loc, true);
    }

    /// Check a body against `{attributes, blocks}`; `required` also checks missing ones.
    fn body(&mut self, body: &hcl::Body, spec: &Json, loc: &str, required: bool) {
        let attrs = obj(&spec["attributes"]);
        let blocks = obj(&spec["blocks"]);
        self.attributes(body, attrs, blocks, loc);
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for b in body.blocks() {
            let (name, inner, dynamic) = if b.identifier() == "dynamic" {
                let Some(label) = b.labels().first() else {
                    self.error(
                        loc,
                        "a dynamic block needs the block name as its label".into(),
                    );
                    continue;
                };
                let content = b
                    .body()
                    .blocks()
                    .find(|c| c.identifier() == "content")
                    .map(|c| c.body());
                (label.as_str().to_string(), content, true)
            } else {
                (b.identifier().to_string(), Some(b.body()), false)
            };
            let n = counts.entry(name.clone()).or_default();
            *n += 1;
            let bloc = join(
                loc,
                &if dynamic {
                    format!("dynamic \"{name}\"")
                } else if *n > 1 {
                    format!("{} #{n}", block_name(b))
                } else {
                    block_name(b)
                },
            );
            let Some(bspec) = blocks.get(&name) else {
                self.unknown_block(&name, attrs, blocks, &bloc);
                continue;
            };
            if !dynamic && !self.labels(b, &bspec["labels"], &bloc) {
                continue;
            }
            match inner {
                Some(inner) => self.body(inner, bspec, &bloc, required),
                None => self.error(&bloc, "a dynamic block needs a content block".into()),
            }
        }
        self.single_counts(&counts, blocks, loc);
        if required {
            for (name, aspec) in attrs {
                if body.attributes().any(|a| a.key() == name) {
                    continue;
                }
                if aspec["required"] == Json::Bool(true) {
                    self.error(loc, format!("missing required attribute '{name}'"));
                } else if aspec["required_tag"] == Json::Bool(true) {
                    let hint = ALTERNATIVES
                        .iter()
                        .find(|(a, _)| a == name)
                        .map(|(_, h)| format!(" ({h})"))
                        .unwrap_or_default();
                    self.warn(
                        loc,
                        format!(
                            "attribute '{name}' is marked required:\"true\" in the plugin and is not set{hint}"
                        ),
                    );
                }
            }
        }
    }

    fn single_counts(
        &mut self,
        counts: &BTreeMap<String, usize>,
        blocks: &Map<String, Json>,
        loc: &str,
    ) {
        for (name, n) in counts {
            if *n > 1 && blocks.get(name).is_some_and(|b| b["nesting"] == "single") {
                self.error(
                    loc,
                    format!("block '{name}' may appear at most once, found {n}"),
                );
            }
        }
    }

    fn attributes(
        &mut self,
        body: &hcl::Body,
        attrs: &Map<String, Json>,
        blocks: &Map<String, Json>,
        loc: &str,
    ) {
        for attr in body.attributes() {
            let key = attr.key();
            match attrs.get(key) {
                Some(spec) => self.type_check(loc, key, spec, attr.expr()),
                None if blocks.contains_key(key) => self.error(
                    loc,
                    format!("'{key}' is a block here, not an attribute: write {key} {{ ... }}"),
                ),
                None => self.error(loc, format!("unknown attribute '{key}'")),
            }
        }
    }

    fn unknown_block(
        &mut self,
        name: &str,
        attrs: &Map<String, Json>,
        _blocks: &Map<String, Json>,
        loc: &str,
    ) {
        if attrs.contains_key(name) {
            self.error(
                loc,
                format!("'{name}' is an attribute here, not a block: write {name} = ..."),
            );
        } else {
            self.error(loc, format!("unknown block '{name}'"));
        }
    }

    fn type_check(&mut self, loc: &str, key: &str, spec: &Json, expr: &hcl::Expression) {
        let ty = spec["type"].as_str().unwrap_or("any");
        if let Some(found) = type_problem(ty, expr) {
            self.error(
                loc,
                format!("attribute '{key}' must be {ty}, but the value is {found}"),
            );
        }
    }
}

/// What kind of literal `expr` is, when it clearly cannot convert to `ty` (cty's
/// conversions: numbers and bools convert to strings, "true"/"false" and numeric strings
/// back). `None` when it fits or cannot be known without evaluation.
pub fn type_problem(ty: &str, expr: &hcl::Expression) -> Option<String> {
    use hcl::Expression as E;
    let ty = ty.trim();
    if ty == "any" {
        return None;
    }
    if ty == "type_expression" {
        return match expr {
            E::Variable(_) | E::FuncCall(_) => None,
            E::String(s) => Some(format!(
                "the string \"{s}\" (write a type constraint such as string or list(string), unquoted)"
            )),
            E::Number(_) | E::Bool(_) | E::Array(_) | E::Object(_) => {
                Some("a literal value, not a type constraint".into())
            }
            _ => None,
        };
    }
    let inner = |prefix: &str| {
        ty.strip_prefix(prefix)
            .and_then(|r| r.strip_suffix(')'))
            .map(str::trim)
    };
    let kind = match expr {
        E::Null => return None,
        E::Parenthesis(e) => return type_problem(ty, e),
        E::String(_) => "a string",
        E::TemplateExpr(_) => "a string template",
        E::Number(_) => "a number",
        E::Bool(_) => "a bool",
        E::Array(_) => "a list",
        E::Object(_) => "an object",
        _ => return None,
    };
    let fits = match ty {
        "string" => !matches!(expr, E::Array(_) | E::Object(_)),
        "bool" => match expr {
            E::Bool(_) | E::TemplateExpr(_) => true,
            E::String(s) => s == "true" || s == "false",
            _ => false,
        },
        "number" => match expr {
            E::Number(_) | E::TemplateExpr(_) => true,
            E::String(s) => s.trim().parse::<f64>().is_ok(),
            _ => false,
        },
        "object" => matches!(expr, E::Object(_)),
        _ => {
            if let Some(elem) = inner("list(").or_else(|| inner("set(")) {
                match expr {
                    E::Array(items) => {
                        if let Some(p) = items.iter().find_map(|i| type_problem(elem, i)) {
                            return Some(format!("a list with {p}"));
                        }
                        true
                    }
                    _ => false,
                }
            } else if let Some(elem) = inner("map(") {
                match expr {
                    E::Object(o) => {
                        if let Some(p) = o.values().find_map(|i| type_problem(elem, i)) {
                            return Some(format!("an object with {p}"));
                        }
                        true
                    }
                    _ => false,
                }
            } else {
                true
            }
        }
    };
    if fits {
        None
    } else {
        Some(match expr {
            E::String(s) => format!("the string \"{s}\""),
            _ => kind.to_string(),
        })
    }
}

/// The template's lower version bounds, checked against the schema's lowest extraction:
/// a warning when the template allows a Packer or amazon plugin older than the
/// extraction (the checks then cannot vouch for those versions).
pub fn version_coverage(
    required_version: Option<&str>,
    amazon_constraint: Option<&str>,
    lowest: &Schema,
) -> Vec<String> {
    let mut out = Vec::new();
    for (what, constraint, v) in [
        ("Packer", required_version, lowest.packer),
        ("the amazon plugin", amazon_constraint, lowest.amazon),
    ] {
        let Some(v) = v else { continue };
        let Some(c) = constraint else {
            out.push(format!(
                "the template does not constrain {what}'s version; the schema's lowest extraction is v{v}"
            ));
            continue;
        };
        let below = if v.2 > 0 {
            Version(v.0, v.1, v.2 - 1)
        } else if v.1 > 0 {
            Version(v.0, v.1 - 1, u64::MAX)
        } else {
            continue;
        };
        if below.satisfies(c) == Some(true) {
            out.push(format!(
                "the template allows {what} older than v{v} ('{c}'), older than the schema's lowest extraction"
            ));
        }
    }
    out
}

/// The amazon plugin's version constraint from `packer { required_plugins { amazon } }`.
pub fn amazon_constraint(path: &Path) -> Result<Option<String>> {
    for file in template_files(path)? {
        let text = std::fs::read_to_string(&file)
            .map_err(|e| Error::io(format!("reading {}", file.display()), e))?;
        let Ok(body) = hcl::parse(&text) else {
            continue;
        };
        for b in body.blocks().filter(|b| b.identifier() == "packer") {
            for rp in b
                .body()
                .blocks()
                .filter(|r| r.identifier() == "required_plugins")
            {
                for attr in rp.body().attributes() {
                    let Some(Json::Object(o)) = crate::template::literal(attr.expr()) else {
                        continue;
                    };
                    let source = o.get("source").and_then(Json::as_str).unwrap_or("");
                    if source.ends_with("/amazon") {
                        return Ok(o.get("version").and_then(Json::as_str).map(String::from));
                    }
                }
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn findings(text: &str) -> Vec<Finding> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("t.pkr.hcl"), text).unwrap();
        check(dir.path(), &Schema::embedded().unwrap()).unwrap()
    }

    fn errors(f: &[Finding]) -> Vec<String> {
        f.iter()
            .filter(|f| f.severity == Severity::Error)
            .map(|f| format!("{}: {}", f.location, f.message))
            .collect()
    }

    fn repo() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    #[test]
    fn the_real_templates_have_no_error_against_either_schema() {
        let f = check(&repo().join("packer"), &Schema::embedded().unwrap()).unwrap();
        let e = errors(&f);
        assert!(e.is_empty(), "schema errors in packer/: {e:#?}");
        // The amazon-ebs source sets source_ami_filter, not source_ami: a warning, with
        // the plugin's alternative named, from both extractions.
        let w = f
            .iter()
            .find(|f| f.message.contains("'source_ami'"))
            .expect("a warning for source_ami");
        assert_eq!(w.severity, Severity::Warning);
        assert!(w.message.contains("source_ami_filter"), "{w}");
        assert_eq!(w.schemas.len(), 2, "{w}");
        // Every provisioner and the post-processor were checked: the file provisioners
        // set source and destination, so no warning names them.
        assert!(
            !f.iter().any(|f| f.message.contains("'destination'")),
            "{f:#?}"
        );
    }

    #[test]
    fn schema_data_matches_the_shared_reference() {
        let shared = repo().join("../shared/reference");
        if !shared.is_dir() {
            eprintln!(
                "skipped: {} not here (CI has it beside the clone)",
                shared.display()
            );
            return;
        }
        for (here, there) in [
            (CURRENT, "packer-hcl2-schema.json"),
            (
                LOWEST,
                "packer/packer-hcl2-schema.packer-v1.10.0.amazon-v1.3.0.json",
            ),
        ] {
            let theirs = std::fs::read_to_string(shared.join(there)).unwrap();
            assert!(
                here == theirs,
                "imagebuilder/data copy of {there} differs: refresh it"
            );
        }
    }

    #[test]
    fn unknown_attribute_is_an_error_naming_it_and_the_block() {
        let f = findings(
            "source \"amazon-ebs\" \"n\" {\n  region = \"us-east-1\"\n  ami_nmae = \"x\"\n  metadata_options {\n    http_tokenz = \"required\"\n  }\n}\n",
        );
        let e = errors(&f);
        assert_eq!(e.len(), 2, "{e:#?}");
        assert!(
            e[0].contains("source \"amazon-ebs\" \"n\"")
                && e[0].contains("unknown attribute 'ami_nmae'"),
            "{e:?}"
        );
        assert!(
            e[1].contains("metadata_options") && e[1].contains("'http_tokenz'"),
            "{e:?}"
        );
    }

    #[test]
    fn unknown_block_and_attribute_block_confusion_are_errors() {
        let f = findings(
            "build {\n  sources = [\"source.amazon-ebs.n\"]\n  provisioner \"shell\" {\n    inline = [\"true\"]\n    retry {\n    }\n  }\n  post-processor \"manifest\" {\n    custom_data {\n      a = \"b\"\n    }\n  }\n}\nsource \"amazon-ebs\" \"n\" {\n  metadata_options = {}\n}\nbogus {\n}\n",
        );
        let e = errors(&f);
        assert_eq!(e.len(), 4, "{e:#?}");
        assert!(
            e.iter()
                .any(|e| e.contains("provisioner \"shell\" #1")
                    && e.contains("unknown block 'retry'")),
            "{e:#?}"
        );
        assert!(
            e.iter()
                .any(|e| e.contains("'custom_data' is an attribute here, not a block")),
            "{e:#?}"
        );
        assert!(
            e.iter()
                .any(|e| e.contains("'metadata_options' is a block here, not an attribute")),
            "{e:#?}"
        );
        assert!(
            e.iter()
                .any(|e| e.contains("unknown top-level block 'bogus'")),
            "{e:#?}"
        );
    }

    #[test]
    fn wrong_literal_types_are_errors() {
        let f = findings(
            "source \"amazon-ebs\" \"n\" {\n  ami_regions   = \"us-west-2\"\n  encrypt_boot  = \"yes\"\n  instance_type = [\"c6i.large\"]\n  tags          = { a = [\"b\"] }\n  region        = var.region\n}\nvariable \"v\" {\n  type = \"string\"\n}\n",
        );
        let e = errors(&f);
        assert_eq!(e.len(), 5, "{e:#?}");
        assert!(
            e.iter().any(|e| e.contains(
                "'ami_regions' must be list(string), but the value is the string \"us-west-2\""
            )),
            "{e:#?}"
        );
        assert!(
            e.iter().any(|e| e.contains("'encrypt_boot' must be bool")),
            "{e:#?}"
        );
        assert!(
            e.iter()
                .any(|e| e.contains("'instance_type' must be string, but the value is a list")),
            "{e:#?}"
        );
        assert!(
            e.iter().any(|e| e
                .contains("'tags' must be map(string), but the value is an object with a list")),
            "{e:#?}"
        );
        assert!(
            e.iter()
                .any(|e| e.contains("variable \"v\"") && e.contains("type constraint")),
            "{e:#?}"
        );
    }

    #[test]
    fn missing_required_is_an_error_and_missing_required_tag_a_warning() {
        let f = findings(
            "packer {\n  required_plugins {\n    amazon = {\n      version = \">= 1.3.0\"\n    }\n  }\n}\nvariable \"v\" {\n  validation {\n    condition = true\n  }\n}\nbuild {\n  provisioner \"file\" {\n    source = \"a\"\n  }\n}\n",
        );
        let e = errors(&f);
        assert_eq!(e.len(), 2, "{e:#?}");
        assert!(
            e.iter()
                .any(|e| e.contains("required_plugins")
                    && e.contains("missing required key 'source'")),
            "{e:#?}"
        );
        assert!(
            e.iter().any(|e| e.contains("validation")
                && e.contains("missing required attribute 'error_message'")),
            "{e:#?}"
        );
        let w: Vec<&Finding> = f
            .iter()
            .filter(|f| f.severity == Severity::Warning)
            .collect();
        assert!(
            w.iter().any(|w| w.location.contains("provisioner \"file\"")
                && w.message.contains("'destination'")),
            "{w:#?}"
        );
        assert!(
            w.iter().any(|w| w.message.contains("'content'")
                && w.message.contains("either content or source")),
            "{w:#?}"
        );
    }

    #[test]
    fn labels_and_single_blocks_are_counted() {
        let f = findings(
            "source \"amazon-ebs\" {\n}\nsource \"amazon-ebs\" \"n\" {\n  metadata_options {\n  }\n  metadata_options {\n  }\n}\n",
        );
        let e = errors(&f);
        assert_eq!(e.len(), 2, "{e:#?}");
        assert!(
            e.iter()
                .any(|e| e.contains("takes 2 label(s) (type, name), found 1")),
            "{e:#?}"
        );
        assert!(
            e.iter()
                .any(|e| e.contains("'metadata_options' may appear at most once, found 2")),
            "{e:#?}"
        );
    }

    #[test]
    fn literal_types() {
        let e = |s: &str| {
            hcl::parse(&format!("v = {s}\n"))
                .unwrap()
                .attributes()
                .next()
                .unwrap()
                .expr()
                .clone()
        };
        assert!(type_problem("string", &e("[\"a\"]")).is_some());
        assert!(type_problem("string", &e("3")).is_none());
        assert!(type_problem("bool", &e("\"yes\"")).is_some());
        assert!(type_problem("bool", &e("\"true\"")).is_none());
        assert!(type_problem("number", &e("\"40\"")).is_none());
        assert!(type_problem("number", &e("true")).is_some());
        assert!(type_problem("list(string)", &e("\"a\"")).is_some());
        assert!(type_problem("list(string)", &e("[{ a = 1 }]")).is_some());
        assert!(type_problem("map(string)", &e("[]")).is_some());
        assert!(type_problem("map(string)", &e("var.x")).is_none());
        assert!(type_problem("type_expression", &e("\"string\"")).is_some());
        assert!(type_problem("type_expression", &e("list(string)")).is_none());
    }

    #[test]
    fn lowest_schema_lacks_what_v1_10_lacks() {
        let f = findings(
            "hcp_packer_registry {\n  bucket_name = \"b\"\n}\nbuild {\n  provisioner \"shell\" {\n    inline            = [\"true\"]\n    continue_on_error = true\n  }\n}\n",
        );
        let e = errors(&f);
        assert_eq!(e.len(), 2, "{e:?}");
        for f in f.iter().filter(|f| f.severity == Severity::Error) {
            assert_eq!(
                f.schemas,
                vec!["Packer v1.10.0 + amazon v1.3.0".to_string()]
            );
        }
    }

    #[test]
    fn dynamic_blocks_are_checked_through_their_content() {
        let f = findings(
            "source \"amazon-ebs\" \"x\" {\n  dynamic \"run_tag\" {\n    for_each = {}\n    content {\n      key   = \"a\"\n      colour = \"b\"\n    }\n  }\n}\n",
        );
        let e = errors(&f);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].contains("colour"), "{e:?}");
    }

    #[test]
    fn version_coverage_warns_only_below_the_extraction() {
        let low = Schema::lowest().unwrap();
        assert!(version_coverage(Some(">= 1.10.0"), Some(">= 1.3.0"), &low).is_empty());
        let w = version_coverage(Some(">= 1.9.0"), Some(">= 1.3.0"), &low);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("Packer") && w[0].contains("1.10.0"), "{w:?}");
        assert_eq!(version_coverage(None, Some("~> 1.2"), &low).len(), 2);
    }
}
