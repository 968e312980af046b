//! The settings reference's text, taken from the code: every struct and enum of the agent's
//! library that derives `Deserialize`, with its doc comments, its fields (their names as
//! serde reads them, their types as written, their doc comments) and its variants. Written
//! to `$OUT_DIR/settings_docs.rs`, which `settings::reference` includes; the reference
//! (`slurm-node-agent config reference`, `docs/settings.md`) walks `Settings` through it.
//!
//! The doc comments are the ones the code keeps next to each key (`missing_docs` asks for
//! them), so a section that moves to another module takes its text along, and the
//! reference follows without a change here: types are found by their module path and name.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use quote::ToTokens;

/// One struct or enum.
#[derive(Debug, Default)]
struct Item {
    /// `settings::schema` (no crate name; empty for the crate root).
    module: String,
    name: String,
    doc: String,
    /// `#[serde(default)]` on the container.
    default: bool,
    fields: Vec<Field>,
    variants: Vec<(String, String)>,
    is_enum: bool,
}

#[derive(Debug)]
struct Field {
    key: String,
    /// The type as written, without spaces.
    ty: String,
    /// `module::Name` of the named type inside (`X`, `Vec<X>`, `Option<X>`) when it is
    /// another item here.
    target: String,
    doc: String,
    /// `#[serde(default)]` on the field.
    default: bool,
}

/// A module's `use` names: the name in scope → the path it stands for.
type Uses = BTreeMap<String, Vec<String>>;

/// Reads `src/` (library files only) and writes `out`.
pub fn generate(src: &Path, out: &Path) {
    let mut files = Vec::new();
    collect(src, &mut files);
    files.sort();
    let mut items: Vec<Item> = Vec::new();
    let mut uses: BTreeMap<String, Uses> = BTreeMap::new();
    for file in files {
        let Some(module) = module_of(src, &file) else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        if !text.contains("Deserialize") {
            continue;
        }
        let parsed = match syn::parse_file(&text) {
            Ok(f) => f,
            Err(e) => {
                // The compiler will say it better; the reference just lacks this file.
                println!(
                    "cargo:warning=settings reference: {} does not parse: {e}",
                    file.display()
                );
                continue;
            }
        };
        walk(&parsed.items, &module, &mut items, &mut uses);
    }
    resolve(&mut items, &uses);
    let text = render(&items);
    if std::fs::read_to_string(out).ok().as_deref() != Some(text.as_str()) {
        if let Err(e) = std::fs::write(out, text) {
            panic!("writing {}: {e}", out.display());
        }
    }
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            collect(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `src/a/b.rs` → `a::b`, `src/a/mod.rs` → `a`, `src/lib.rs` → ``; the binaries' roots
/// (`main.rs`, `*_main.rs`) are not the library.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?;
    if parts.is_empty() && (stem == "main" || stem.ends_with("_main")) {
        return None;
    }
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    Some(parts.join("::"))
}

fn join(module: &str, name: &str) -> String {
    if module.is_empty() {
        name.to_string()
    } else {
        format!("{module}::{name}")
    }
}

fn walk(items: &[syn::Item], module: &str, out: &mut Vec<Item>, uses: &mut BTreeMap<String, Uses>) {
    for item in items {
        match item {
            syn::Item::Mod(m) => {
                if is_cfg_test(&m.attrs) {
                    continue;
                }
                if let Some((_, inner)) = &m.content {
                    walk(inner, &join(module, &m.ident.to_string()), out, uses);
                }
            }
            syn::Item::Use(u) => {
                let map = uses.entry(module.to_string()).or_default();
                use_tree(&u.tree, Vec::new(), map);
            }
            syn::Item::Struct(s) if derives_deserialize(&s.attrs) => {
                let serde = container_serde(&s.attrs);
                let mut it = Item {
                    module: module.to_string(),
                    name: s.ident.to_string(),
                    doc: doc(&s.attrs),
                    default: serde.default,
                    ..Item::default()
                };
                if let syn::Fields::Named(named) = &s.fields {
                    for f in &named.named {
                        let fs = field_serde(&f.attrs);
                        if fs.skip {
                            continue;
                        }
                        let ident = f.ident.as_ref().map(|i| i.to_string()).unwrap_or_default();
                        let ident = ident.trim_start_matches("r#").to_string();
                        let key = fs
                            .rename
                            .unwrap_or_else(|| rename(&ident, serde.rename_all.as_deref(), false));
                        it.fields.push(Field {
                            key,
                            ty: f.ty.to_token_stream().to_string().replace(' ', ""),
                            target: String::new(),
                            doc: doc(&f.attrs),
                            default: fs.default,
                        });
                    }
                }
                out.push(it);
            }
            syn::Item::Enum(e) if derives_deserialize(&e.attrs) => {
                let serde = container_serde(&e.attrs);
                let mut it = Item {
                    module: module.to_string(),
                    name: e.ident.to_string(),
                    doc: doc(&e.attrs),
                    is_enum: true,
                    ..Item::default()
                };
                for v in &e.variants {
                    let vs = field_serde(&v.attrs);
                    if vs.skip {
                        continue;
                    }
                    let name = vs.rename.unwrap_or_else(|| {
                        rename(&v.ident.to_string(), serde.rename_all.as_deref(), true)
                    });
                    it.variants.push((name, doc(&v.attrs)));
                }
                out.push(it);
            }
            _ => {}
        }
    }
}

fn use_tree(tree: &syn::UseTree, prefix: Vec<String>, map: &mut Uses) {
    match tree {
        syn::UseTree::Path(p) => {
            let mut next = prefix;
            next.push(p.ident.to_string());
            use_tree(&p.tree, next, map);
        }
        syn::UseTree::Name(n) => {
            let name = n.ident.to_string();
            let mut path = prefix;
            path.push(name.clone());
            map.insert(name, path);
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix;
            path.push(r.ident.to_string());
            map.insert(r.rename.to_string(), path);
        }
        syn::UseTree::Group(g) => {
            for t in &g.items {
                use_tree(t, prefix.clone(), map);
            }
        }
        syn::UseTree::Glob(_) => {}
    }
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs
        .iter()
        .any(|a| a.path().is_ident("cfg") && a.meta.to_token_stream().to_string().contains("test"))
}

fn derives_deserialize(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("derive")
            && a.meta
                .to_token_stream()
                .to_string()
                .split(|c: char| !c.is_alphanumeric() && c != '_')
                .any(|w| w == "Deserialize")
    })
}

/// The doc comment, its lines joined with `\n`, one leading space of each line removed.
fn doc(attrs: &[syn::Attribute]) -> String {
    let mut lines = Vec::new();
    for a in attrs {
        if !a.path().is_ident("doc") {
            continue;
        }
        if let syn::Meta::NameValue(nv) = &a.meta {
            if let syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) = &nv.value
            {
                let v = s.value();
                lines.push(v.strip_prefix(' ').unwrap_or(&v).to_string());
            }
        }
    }
    lines.join("\n").trim().to_string()
}

#[derive(Default)]
struct ContainerSerde {
    rename_all: Option<String>,
    default: bool,
}

fn container_serde(attrs: &[syn::Attribute]) -> ContainerSerde {
    let mut c = ContainerSerde::default();
    for a in attrs.iter().filter(|a| a.path().is_ident("serde")) {
        let _ = a.parse_nested_meta(|m| {
            if m.path.is_ident("rename_all") {
                let s: syn::LitStr = m.value()?.parse()?;
                c.rename_all = Some(s.value());
            } else if m.path.is_ident("default") {
                c.default = true;
                if m.input.peek(syn::Token![=]) {
                    let _: syn::LitStr = m.value()?.parse()?;
                }
            } else if m.input.peek(syn::Token![=]) {
                let _: syn::Expr = m.value()?.parse()?;
            } else if m.input.peek(syn::token::Paren) {
                let _ = m.parse_nested_meta(|_| Ok(()));
            }
            Ok(())
        });
    }
    c
}

#[derive(Default)]
struct FieldSerde {
    rename: Option<String>,
    default: bool,
    skip: bool,
}

fn field_serde(attrs: &[syn::Attribute]) -> FieldSerde {
    let mut f = FieldSerde::default();
    for a in attrs.iter().filter(|a| a.path().is_ident("serde")) {
        let _ = a.parse_nested_meta(|m| {
            if m.path.is_ident("rename") && m.input.peek(syn::Token![=]) {
                let s: syn::LitStr = m.value()?.parse()?;
                f.rename = Some(s.value());
            } else if m.path.is_ident("default") {
                f.default = true;
                if m.input.peek(syn::Token![=]) {
                    let _: syn::LitStr = m.value()?.parse()?;
                }
            } else if m.path.is_ident("skip") || m.path.is_ident("skip_deserializing") {
                f.skip = true;
            } else if m.input.peek(syn::Token![=]) {
                let _: syn::Expr = m.value()?.parse()?;
            } else if m.input.peek(syn::token::Paren) {
                let _ = m.parse_nested_meta(|_| Ok(()));
            }
            Ok(())
        });
    }
    f
}

/// serde's `rename_all` rules, for a field (`snake_case` ident) or a variant (`PascalCase`).
fn rename(ident: &str, rule: Option<&str>, variant: bool) -> String {
    let words: Vec<String> = if variant {
        let mut w: Vec<String> = Vec::new();
        for c in ident.chars() {
            if c.is_uppercase() || w.is_empty() {
                w.push(String::new());
            }
            if let Some(last) = w.last_mut() {
                last.extend(c.to_lowercase());
            }
        }
        w
    } else {
        ident.split('_').map(str::to_string).collect()
    };
    let cap = |s: &String| {
        let mut c = s.chars();
        c.next()
            .map(|f| f.to_uppercase().chain(c).collect::<String>())
            .unwrap_or_default()
    };
    match rule {
        Some("lowercase") => words.concat(),
        Some("UPPERCASE") => words.concat().to_uppercase(),
        Some("snake_case") => words.join("_"),
        Some("SCREAMING_SNAKE_CASE") => words.join("_").to_uppercase(),
        Some("kebab-case") => words.join("-"),
        Some("SCREAMING-KEBAB-CASE") => words.join("-").to_uppercase(),
        Some("camelCase") => {
            let mut s = words.first().cloned().unwrap_or_default();
            for w in words.iter().skip(1) {
                s.push_str(&cap(w));
            }
            s
        }
        Some("PascalCase") => words.iter().map(cap).collect(),
        _ => ident.to_string(),
    }
}

/// Finds, for each field, the item its type names: a path (`crate::`, `super::`, `self::`,
/// a `use` name) resolved to where an item is defined, else the one item of that name.
fn resolve(items: &mut [Item], uses: &BTreeMap<String, Uses>) {
    let known: BTreeMap<String, usize> = items
        .iter()
        .enumerate()
        .map(|(i, it)| (join(&it.module, &it.name), i))
        .collect();
    let mut by_name: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for it in items.iter() {
        by_name
            .entry(it.name.clone())
            .or_default()
            .push(join(&it.module, &it.name));
    }
    for it in items.iter_mut() {
        let module = it.module.clone();
        for f in &mut it.fields {
            let Some(path) = inner_path(&f.ty) else {
                continue;
            };
            let mut segs: Vec<String> = path.split("::").map(str::to_string).collect();
            if segs.len() == 1 {
                if let Some(u) = uses.get(&module).and_then(|m| m.get(&segs[0])) {
                    segs = u.clone();
                } else {
                    let here = join(&module, &segs[0]);
                    if known.contains_key(&here) {
                        f.target = here;
                        continue;
                    }
                }
            }
            let absolute = absolute(&module, &segs);
            if known.contains_key(&absolute) {
                f.target = absolute;
            } else if let Some(last) = segs.last() {
                if let Some([only]) = by_name.get(last).map(Vec::as_slice) {
                    f.target = only.clone();
                }
            }
        }
    }
}

/// A path as seen from `module`, made absolute within the crate (no crate name).
fn absolute(module: &str, segs: &[String]) -> String {
    let mut base: Vec<String> = if module.is_empty() {
        Vec::new()
    } else {
        module.split("::").map(str::to_string).collect()
    };
    let mut rest = segs;
    match segs.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &segs[1..];
        }
        Some("self") => rest = &segs[1..],
        Some("super") => {
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
        }
        _ => {
            // A `use` path is crate-relative in edition 2018+ only with `crate::`; others
            // name an outside crate or a module here.
        }
    }
    base.extend(rest.iter().cloned());
    base.join("::")
}

/// `Vec<crate::x::Y>` → `crate::x::Y`; `Option<Y>` → `Y`; `Y` → `Y`.
fn inner_path(ty: &str) -> Option<String> {
    let mut t = ty;
    while let Some(open) = t.find('<') {
        let outer = &t[..open];
        if !matches!(outer.rsplit("::").next(), Some("Vec" | "Option" | "Box")) {
            return None;
        }
        t = t[open + 1..].strip_suffix('>')?;
    }
    (!t.is_empty()
        && t.chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == ':'))
    .then(|| t.to_string())
}

fn render(items: &[Item]) -> String {
    let mut s = String::from(
        "// Generated by build/settings_docs.rs from the library's doc comments. Do not edit.\n\
         /// Every type of the library that derives `Deserialize`, with its docs.\n\
         pub static ITEMS: &[Item] = &[\n",
    );
    for it in items {
        let _ = writeln!(
            s,
            "    Item {{ module: {:?}, name: {:?}, doc: {:?}, default: {}, is_enum: {}, fields: &[",
            it.module, it.name, it.doc, it.default, it.is_enum
        );
        for f in &it.fields {
            let _ = writeln!(
                s,
                "        Field {{ key: {:?}, ty: {:?}, target: {:?}, doc: {:?}, default: {} }},",
                f.key, f.ty, f.target, f.doc, f.default
            );
        }
        s.push_str("    ], variants: &[\n");
        for (name, doc) in &it.variants {
            let _ = writeln!(s, "        Variant {{ name: {name:?}, doc: {doc:?} }},");
        }
        s.push_str("    ] },\n");
    }
    s.push_str("];\n");
    s
}
