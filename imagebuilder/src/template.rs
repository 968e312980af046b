//! Reading Packer HCL2 templates (with hcl-rs): declared variables and their types, the
//! `packer { required_version, required_plugins }` constraints, and literal `locals` such
//! as the OS catalog;
//! checking values against the declarations; writing a `.pkrvars.hcl` file.
//!
//! Packer loads every `*.pkr.hcl` file of a folder as one template (Packer docs, "HCL
//! templates"), so a template here is a folder or a single file.

use crate::error::{Error, Result};
use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// A variable's declared type (the subset of HCL type constraints templates use).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VarType {
    /// `string`
    String,
    /// `number`
    Number,
    /// `bool`
    Bool,
    /// `list(T)`, `set(T)` or `tuple`.
    List(Box<VarType>),
    /// `map(T)` or `object(...)`.
    Map(Box<VarType>),
    /// `any`, or no `type` given.
    Any,
}

impl fmt::Display for VarType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VarType::String => f.write_str("string"),
            VarType::Number => f.write_str("number"),
            VarType::Bool => f.write_str("bool"),
            VarType::List(t) => write!(f, "list({t})"),
            VarType::Map(t) => write!(f, "map({t})"),
            VarType::Any => f.write_str("any"),
        }
    }
}

impl VarType {
    fn from_expr(expr: &hcl::Expression) -> VarType {
        match expr {
            hcl::Expression::Variable(v) => match v.as_str() {
                "string" => VarType::String,
                "number" => VarType::Number,
                "bool" => VarType::Bool,
                _ => VarType::Any,
            },
            hcl::Expression::FuncCall(call) => {
                let inner = call
                    .args
                    .first()
                    .map(VarType::from_expr)
                    .unwrap_or(VarType::Any);
                match call.name.name.as_str() {
                    "list" | "set" => VarType::List(Box::new(inner)),
                    "map" => VarType::Map(Box::new(inner)),
                    _ => VarType::Any,
                }
            }
            _ => VarType::Any,
        }
    }

    /// Whether `value` has this type.
    pub fn accepts(&self, value: &Json) -> bool {
        match (self, value) {
            (VarType::Any, _) => true,
            (VarType::String, Json::String(_)) => true,
            (VarType::Number, Json::Number(_)) => true,
            (VarType::Bool, Json::Bool(_)) => true,
            (VarType::List(t), Json::Array(items)) => items.iter().all(|i| t.accepts(i)),
            (VarType::Map(t), Json::Object(items)) => items.values().all(|i| t.accepts(i)),
            _ => false,
        }
    }

    /// Turn a command-line `NAME=VALUE` value into this type: strings verbatim, anything
    /// else parsed as an HCL expression (`true`, `3`, `["a"]`, `{ k = "v" }`).
    pub fn parse_cli_value(&self, raw: &str) -> Option<Json> {
        if *self == VarType::String {
            return Some(Json::String(raw.to_string()));
        }
        let body = hcl::parse(&format!("v = {raw}\n")).ok()?;
        let attr = body.attributes().next()?;
        let value = literal(attr.expr())?;
        if *self == VarType::Any || self.accepts(&value) {
            Some(value)
        } else {
            None
        }
    }
}

/// A declared variable.
#[derive(Debug, Clone, PartialEq)]
pub struct Variable {
    /// Declared type.
    pub ty: VarType,
    /// Whether it has a default (else Packer requires a value).
    pub has_default: bool,
    /// The file declaring it.
    pub file: PathBuf,
}

/// One entry of `packer { required_plugins { NAME = { source, version } } }`: what
/// `packer init` installs (Packer docs, "Specifying plugin requirements").
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RequiredPlugin {
    /// The local name (`amazon`).
    pub name: String,
    /// Where it comes from (`github.com/hashicorp/amazon`).
    pub source: String,
    /// Its version constraint (`>= 1.3.0`), if any.
    pub version: Option<String>,
}

impl fmt::Display for RequiredPlugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.version {
            Some(v) => write!(f, "{} {v}", self.source),
            None => f.write_str(&self.source),
        }
    }
}

/// What this crate reads from a template.
#[derive(Debug, Clone, Default)]
pub struct Template {
    /// The folder or file read.
    pub path: PathBuf,
    /// Variables by name.
    pub variables: BTreeMap<String, Variable>,
    /// `packer { required_version = "..." }`, if any.
    pub required_version: Option<String>,
    /// `packer { required_plugins { ... } }`, in the order written.
    pub required_plugins: Vec<RequiredPlugin>,
    /// Literal `locals` values (non-literal expressions are left out).
    pub locals: BTreeMap<String, Json>,
}

/// The `*.pkr.hcl` files of a template folder, sorted; or the file itself.
pub fn template_files(path: &Path) -> Result<Vec<PathBuf>> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let entries = std::fs::read_dir(path)
        .map_err(|e| Error::io(format!("reading template folder {}", path.display()), e))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_str().is_some_and(|s| s.ends_with(".pkr.hcl")))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Error::File {
            path: path.to_path_buf(),
            message: "no *.pkr.hcl files here: pass a Packer HCL2 template folder or file".into(),
        });
    }
    Ok(files)
}

impl Template {
    /// Read a template folder or file.
    pub fn load(path: &Path) -> Result<Template> {
        let mut template = Template {
            path: path.to_path_buf(),
            ..Template::default()
        };
        for file in template_files(path)? {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| Error::io(format!("reading {}", file.display()), e))?;
            let body = hcl::parse(&text).map_err(|e| Error::File {
                path: file.clone(),
                message: format!("not valid HCL: {e}"),
            })?;
            template.absorb(&file, &body)?;
        }
        Ok(template)
    }

    fn absorb(&mut self, file: &Path, body: &hcl::Body) -> Result<()> {
        for block in body.blocks() {
            match block.identifier() {
                "variable" => {
                    let Some(name) = block.labels().first() else {
                        return Err(Error::File {
                            path: file.to_path_buf(),
                            message: "a variable block without a name".into(),
                        });
                    };
                    let attrs: BTreeMap<&str, &hcl::Expression> = block
                        .body()
                        .attributes()
                        .map(|a| (a.key(), a.expr()))
                        .collect();
                    let ty = attrs
                        .get("type")
                        .map(|e| VarType::from_expr(e))
                        .unwrap_or(VarType::Any);
                    self.variables.insert(
                        name.as_str().to_string(),
                        Variable {
                            ty,
                            has_default: attrs.contains_key("default"),
                            file: file.to_path_buf(),
                        },
                    );
                }
                "packer" => {
                    for attr in block.body().attributes() {
                        if attr.key() == "required_version" {
                            if let Some(Json::String(v)) = literal(attr.expr()) {
                                self.required_version = Some(v);
                            }
                        }
                    }
                    for plugins in block
                        .body()
                        .blocks()
                        .filter(|b| b.identifier() == "required_plugins")
                    {
                        for attr in plugins.body().attributes() {
                            self.required_plugins.push(required_plugin(
                                file,
                                attr.key(),
                                attr.expr(),
                            )?);
                        }
                    }
                }
                "locals" => {
                    for attr in block.body().attributes() {
                        if let Some(v) = literal(attr.expr()) {
                            self.locals.insert(attr.key().to_string(), v);
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Check a value for `name`: declared, and of the declared type.
    pub fn check(&self, name: &str, value: &Json) -> Result<()> {
        let var = self.declared(name)?;
        if var.ty.accepts(value) {
            Ok(())
        } else {
            Err(Error::VariableType {
                name: name.to_string(),
                expected: var.ty.to_string(),
                value: value.to_string(),
                template: self.path.clone(),
            })
        }
    }

    /// The declaration of `name`, or an error naming the template and what it declares.
    pub fn declared(&self, name: &str) -> Result<&Variable> {
        self.variables
            .get(name)
            .ok_or_else(|| Error::UndeclaredVariable {
                name: name.to_string(),
                template: self.path.clone(),
                declared: self
                    .variables
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// Parse a command-line `NAME=VALUE` into a typed value, checking the declaration.
    pub fn parse_cli_var(&self, assignment: &str) -> Result<(String, Json)> {
        let (name, raw) = assignment
            .split_once('=')
            .ok_or_else(|| Error::BadInput(format!("--var '{assignment}': expected NAME=VALUE")))?;
        let var = self.declared(name)?;
        let value = var
            .ty
            .parse_cli_value(raw)
            .ok_or_else(|| Error::VariableType {
                name: name.to_string(),
                expected: var.ty.to_string(),
                value: format!("'{raw}'"),
                template: self.path.clone(),
            })?;
        Ok((name.to_string(), value))
    }

    /// Variables without a default that `values` does not set.
    pub fn missing_required(&self, values: &BTreeMap<String, Json>) -> Vec<String> {
        self.variables
            .iter()
            .filter(|(n, v)| !v.has_default && !values.contains_key(*n))
            .map(|(n, _)| n.clone())
            .collect()
    }
}

/// One `NAME = { source = "...", version = "..." }` of `required_plugins`; an entry
/// without a literal `source` is refused naming the file and the plugin.
fn required_plugin(file: &Path, name: &str, expr: &hcl::Expression) -> Result<RequiredPlugin> {
    let entry = literal(expr);
    let field = |key: &str| {
        entry
            .as_ref()
            .and_then(|e| e.get(key))
            .and_then(Json::as_str)
            .map(str::to_string)
    };
    let source = field("source").ok_or_else(|| Error::File {
        path: file.to_path_buf(),
        message: format!(
            "packer.required_plugins.{name}: expected {{ source = \"...\", version = \"...\" }} with a literal source"
        ),
    })?;
    Ok(RequiredPlugin {
        name: name.to_string(),
        source,
        version: field("version"),
    })
}

/// The value of a literal expression (strings, numbers, bools, lists, objects, null);
/// `None` for anything that needs evaluation (variables, calls, templates with
/// interpolations).
pub fn literal(expr: &hcl::Expression) -> Option<Json> {
    use hcl::Expression as E;
    Some(match expr {
        E::Null => Json::Null,
        E::Bool(b) => Json::Bool(*b),
        E::Number(n) => serde_json::to_value(n).ok()?,
        E::String(s) => Json::String(s.clone()),
        E::Array(items) => Json::Array(items.iter().map(literal).collect::<Option<_>>()?),
        E::Object(obj) => {
            let mut map = serde_json::Map::new();
            for (k, v) in obj {
                let key = match k {
                    hcl::ObjectKey::Identifier(i) => i.as_str().to_string(),
                    hcl::ObjectKey::Expression(E::String(s)) => s.clone(),
                    hcl::ObjectKey::Expression(E::Variable(v)) => v.as_str().to_string(),
                    _ => return None,
                };
                map.insert(key, literal(v)?);
            }
            Json::Object(map)
        }
        E::Parenthesis(inner) => literal(inner)?,
        _ => return None,
    })
}

/// HCL text of a `.pkrvars.hcl` file setting `values`. Strings are escaped so that
/// Packer reads them literally (`${` and `%{` are not interpolated).
pub fn pkrvars(values: &BTreeMap<String, Json>) -> String {
    let mut out =
        String::from("# Written by slurm-image-builder; passed to packer with -var-file.\n");
    for (name, value) in values {
        out.push_str(name);
        out.push_str(" = ");
        hcl_literal(value, &mut out);
        out.push('\n');
    }
    out
}

fn hcl_literal(value: &Json, out: &mut String) {
    match value {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Number(n) => out.push_str(&n.to_string()),
        Json::String(s) => {
            out.push('"');
            let mut chars = s.chars().peekable();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '"' => out.push_str("\\\""),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    '$' | '%' if chars.peek() == Some(&'{') => {
                        out.push(c);
                        out.push(c);
                    }
                    c => out.push(c),
                }
            }
            out.push('"');
        }
        Json::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                hcl_literal(item, out);
            }
            out.push(']');
        }
        Json::Object(map) => {
            out.push_str("{ ");
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                hcl_literal(&Json::String(k.clone()), out);
                out.push_str(" = ");
                hcl_literal(v, out);
            }
            out.push_str(" }");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn types_from_declarations() {
        let body = hcl::parse(
            "variable \"a\" {\n type = list(string)\n}\nvariable \"b\" {\n type = map(string)\n default = {}\n}\n",
        )
        .unwrap();
        let mut t = Template::default();
        t.absorb(Path::new("x.pkr.hcl"), &body).unwrap();
        assert_eq!(
            t.variables["a"].ty,
            VarType::List(Box::new(VarType::String))
        );
        assert!(!t.variables["a"].has_default);
        assert_eq!(t.variables["b"].ty, VarType::Map(Box::new(VarType::String)));
    }

    #[test]
    fn required_plugins_are_read_and_one_without_a_source_is_refused() {
        let body = hcl::parse(
            "packer {\n required_version = \">= 1.10.0\"\n required_plugins {\n  amazon = {\n   version = \">= 1.3.0\"\n   source = \"github.com/hashicorp/amazon\"\n  }\n  ansible = {\n   source = \"github.com/hashicorp/ansible\"\n  }\n }\n}\n",
        )
        .unwrap();
        let mut t = Template::default();
        t.absorb(Path::new("x.pkr.hcl"), &body).unwrap();
        assert_eq!(t.required_version.as_deref(), Some(">= 1.10.0"));
        let names: Vec<String> = t.required_plugins.iter().map(|p| p.to_string()).collect();
        assert_eq!(
            names,
            [
                "github.com/hashicorp/amazon >= 1.3.0",
                "github.com/hashicorp/ansible"
            ]
        );

        let body =
            hcl::parse("packer {\n required_plugins {\n  amazon = { version = \">= 1\" }\n }\n}\n")
                .unwrap();
        let err = Template::default()
            .absorb(Path::new("x.pkr.hcl"), &body)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("x.pkr.hcl: packer.required_plugins.amazon: expected"),
            "{err}"
        );
    }

    #[test]
    fn cli_values_are_typed() {
        assert_eq!(
            VarType::Bool.parse_cli_value("true"),
            Some(Json::Bool(true))
        );
        assert_eq!(VarType::Bool.parse_cli_value("yes"), None);
        assert_eq!(
            VarType::Number.parse_cli_value("40"),
            Some(serde_json::json!(40))
        );
        assert_eq!(
            VarType::List(Box::new(VarType::String)).parse_cli_value("[\"us-west-2\"]"),
            Some(serde_json::json!(["us-west-2"]))
        );
        assert_eq!(
            VarType::String.parse_cli_value("a=b"),
            Some(Json::String("a=b".into()))
        );
    }

    #[test]
    fn pkrvars_round_trip_through_hcl_rs() {
        let mut values = BTreeMap::new();
        values.insert("s".to_string(), Json::String("a \"q\" ${x} %{y}\n".into()));
        values.insert("l".to_string(), serde_json::json!(["a", "b"]));
        values.insert("m".to_string(), serde_json::json!({"k:1": "v"}));
        values.insert("b".to_string(), Json::Bool(false));
        let text = pkrvars(&values);
        let body = hcl::parse(&text).unwrap();
        let got: BTreeMap<String, Json> = body
            .attributes()
            .filter_map(|a| Some((a.key().to_string(), literal(a.expr())?)))
            .collect();
        assert_eq!(got["l"], values["l"]);
        assert_eq!(got["m"], values["m"]);
        assert_eq!(got["b"], values["b"]);
        assert!(text.contains("$${x} %%{y}"), "{text}");
    }
}
