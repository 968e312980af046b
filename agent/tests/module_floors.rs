//! The library's floors: the graph of its top-level modules (`crate::<module>` as the code
//! names them) has no cycle, so each module stands on a floor below the ones that use it.
//!
//! The graph is read from the source with `syn`, from `src/lib.rs` down through every
//! `mod` it declares: every path that starts `crate::<module>` (in expressions, types,
//! patterns, `use` trees such as `use crate::{a, b::c}`, and the tokens of macro calls such
//! as `tracing::info!(.., crate::x::f())`), and `super::` paths that leave their top-level
//! module. Test code (`#[cfg(test)]` items and the files of `#[cfg(test)] mod x;`),
//! comments and doc links do not count. A cycle inside one module's own files is allowed.
//!
//! On failure the test prints a cycle with a witness (`file:line`) for each edge; when it
//! passes it prints the floors (`cargo test --test module_floors -- --nocapture`): each
//! module's level is the longest path from it down to the ground floor (level 0: modules
//! that use no other).
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// One `crate::<to>` reference in module `from`: `file:line` where it was seen.
type Edges = BTreeMap<(String, String), String>;

/// The top-level module graph of the library rooted at `src/lib.rs`.
#[derive(Debug, Default)]
struct Graph {
    /// Every top-level module.
    modules: BTreeSet<String>,
    /// `(from, to)` → the first witness, `file:line` (relative to the source folder).
    edges: Edges,
    /// Each module's own file (`src/x.rs` or `src/x/mod.rs`).
    roots: BTreeMap<String, PathBuf>,
}

impl Graph {
    /// Reads the crate whose source folder is `src`.
    fn read(src: &Path) -> Result<Graph, String> {
        let mut g = Graph::default();
        let lib = src.join("lib.rs");
        let file = parse(&lib)?;
        for item in &file.items {
            let syn::Item::Mod(m) = item else { continue };
            if is_test_only(&m.attrs) {
                continue;
            }
            let name = m.ident.to_string();
            g.modules.insert(name.clone());
            let mut files = Vec::new();
            module_files(src, &[], m, &mut files)?;
            if let Some((root, _)) = files.first() {
                g.roots.insert(name.clone(), root.clone());
            }
            for (path, module_path) in files {
                g.scan(src, &path, &name, &module_path)?;
            }
        }
        g.edges
            .retain(|(from, to), _| from != to && g.modules.contains(to));
        Ok(g)
    }

    fn scan(
        &mut self,
        src: &Path,
        path: &Path,
        top: &str,
        module_path: &[String],
    ) -> Result<(), String> {
        let file = parse(path)?;
        let shown = path.strip_prefix(src).unwrap_or(path).display().to_string();
        let mut v = Refs {
            file: shown,
            module_path: module_path.to_vec(),
            found: Vec::new(),
        };
        v.visit_file(&file);
        for (to, line) in v.found {
            self.edges
                .entry((top.to_string(), to))
                .or_insert_with(|| format!("{}:{line}", v.file));
        }
        Ok(())
    }

    fn deps<'a>(&'a self, m: &'a str) -> impl Iterator<Item = (&'a str, &'a str)> {
        self.edges
            .iter()
            .filter(move |((from, _), _)| from == m)
            .map(|((_, to), w)| (to.as_str(), w.as_str()))
    }

    /// A cycle as `a -> b -> ... -> a`, each edge with its witness; `None` when there is
    /// none.
    fn cycle(&self) -> Option<String> {
        // Depth-first search with colours; the first back edge closes a cycle.
        #[derive(Clone, Copy, PartialEq)]
        enum Colour {
            White,
            Grey,
            Black,
        }
        fn dfs<'a>(
            g: &'a Graph,
            m: &'a str,
            colour: &mut BTreeMap<&'a str, Colour>,
            stack: &mut Vec<&'a str>,
        ) -> Option<Vec<&'a str>> {
            colour.insert(m, Colour::Grey);
            stack.push(m);
            for (to, _) in g.deps(m) {
                match colour.get(to).copied().unwrap_or(Colour::White) {
                    Colour::Grey => {
                        let start = stack.iter().position(|x| *x == to).unwrap_or(0);
                        let mut c = stack[start..].to_vec();
                        c.push(to);
                        return Some(c);
                    }
                    Colour::White => {
                        if let Some(c) = dfs(g, to, colour, stack) {
                            return Some(c);
                        }
                    }
                    Colour::Black => {}
                }
            }
            stack.pop();
            colour.insert(m, Colour::Black);
            None
        }
        let mut colour = BTreeMap::new();
        for m in &self.modules {
            if colour.get(m.as_str()).copied().unwrap_or(Colour::White) != Colour::White {
                continue;
            }
            if let Some(c) = dfs(self, m, &mut colour, &mut Vec::new()) {
                let mut out = c[0].to_string();
                for w in c.windows(2) {
                    let witness = &self.edges[&(w[0].to_string(), w[1].to_string())];
                    let _ = write!(out, " -> {} ({witness})", w[1]);
                }
                return Some(out);
            }
        }
        None
    }

    /// Each module's floor: 0 for a module that uses no other, else one more than the
    /// highest floor it uses. Only for a graph without cycles.
    fn floors(&self) -> BTreeMap<String, usize> {
        fn level(g: &Graph, m: &str, memo: &mut BTreeMap<String, usize>) -> usize {
            if let Some(l) = memo.get(m) {
                return *l;
            }
            let deps: Vec<String> = g.deps(m).map(|(to, _)| to.to_string()).collect();
            let l = deps
                .iter()
                .map(|d| level(g, d, memo) + 1)
                .max()
                .unwrap_or(0);
            memo.insert(m.to_string(), l);
            l
        }
        let mut memo = BTreeMap::new();
        for m in &self.modules {
            level(self, m, &mut memo);
        }
        memo
    }

    /// The floors, top down, each module with the modules it uses.
    fn describe_floors(&self) -> String {
        let floors = self.floors();
        let top = floors.values().copied().max().unwrap_or(0);
        let mut out = String::new();
        for level in (0..=top).rev() {
            let _ = write!(out, "floor {level:>2}:");
            for (m, _) in floors.iter().filter(|(_, l)| **l == level) {
                let uses: Vec<&str> = self.deps(m).map(|(to, _)| to).collect();
                if uses.is_empty() {
                    let _ = write!(out, " {m}");
                } else {
                    let _ = write!(out, " {m} (uses {})", uses.join(", "));
                }
                out.push(';');
            }
            out.pop();
            out.push('\n');
        }
        out
    }
}

/// Where the docs give another floor than the code has: the table in `lib.rs`'s docs
/// (`//! | N | [`a`], [`b`] |`) and each top-level module's own docs (`Floor N (layer)`),
/// one line each to fix.
fn docs_disagreements(src: &Path, g: &Graph) -> Vec<String> {
    let floors = g.floors();
    let mut out = Vec::new();
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap_or_default();
    let mut table: BTreeMap<String, usize> = BTreeMap::new();
    for line in lib.lines() {
        let Some(row) = line.strip_prefix("//! |") else {
            continue;
        };
        let mut cells = row.split('|');
        let Some(Ok(level)) = cells.next().map(|c| c.trim().parse::<usize>()) else {
            continue;
        };
        let rest = cells.next().unwrap_or_default();
        for name in rest.split("[`").skip(1).filter_map(|n| n.split_once("`]")) {
            table.insert(name.0.to_string(), level);
        }
    }
    for (m, level) in &floors {
        match table.get(m) {
            Some(l) if l == level => {}
            Some(l) => out.push(format!(
                "lib.rs: the floor table puts `{m}` on floor {l}; the code has it on floor {level}"
            )),
            None => out.push(format!(
                "lib.rs: the floor table does not name `{m}` (floor {level})"
            )),
        }
    }
    for m in table.keys().filter(|m| !floors.contains_key(*m)) {
        out.push(format!(
            "lib.rs: the floor table names `{m}`, not a top-level module"
        ));
    }
    for (m, root) in &g.roots {
        let text = std::fs::read_to_string(root).unwrap_or_default();
        let docs: String = text
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .collect::<Vec<_>>()
            .join(" ");
        let said = docs.split("Floor ").skip(1).find_map(|rest| {
            let (n, after) = rest.split_once(' ')?;
            after.starts_with('(').then(|| n.parse::<usize>().ok())?
        });
        let shown = root.strip_prefix(src).unwrap_or(root).display().to_string();
        let level = floors.get(m).copied().unwrap_or(0);
        match said {
            Some(n) if n == level => {}
            Some(n) => out.push(format!(
                "{shown}: its docs say `Floor {n} (...)`; the code has `{m}` on floor {level}"
            )),
            None => out.push(format!(
                "{shown}: its //! docs do not say its floor (`Floor {level} (<layer>): ...`)"
            )),
        }
    }
    out
}

fn parse(path: &Path) -> Result<syn::File, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    syn::parse_file(&text).map_err(|e| {
        let at = e.span().start();
        format!("{}:{}:{}: {e}", path.display(), at.line, at.column + 1)
    })
}

/// Whether attributes make an item test-only: `#[cfg(test)]`, or `#[cfg(all(.., test,
/// ..))]`.
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        if !a.path().is_ident("cfg") {
            return false;
        }
        let Ok(meta) = a.parse_args::<syn::Meta>() else {
            return false;
        };
        match meta {
            syn::Meta::Path(p) => p.is_ident("test"),
            syn::Meta::List(l) if l.path.is_ident("all") => l
                .parse_args_with(
                    syn::punctuated::Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated,
                )
                .is_ok_and(|items| {
                    items
                        .iter()
                        .any(|m| matches!(m, syn::Meta::Path(p) if p.is_ident("test")))
                }),
            _ => false,
        }
    })
}

/// The files of module `m` (declared in the module at `parent`, a path of module names
/// below the crate root) and of its submodules, each with its module path.
fn module_files(
    src: &Path,
    parent: &[String],
    m: &syn::ItemMod,
    out: &mut Vec<(PathBuf, Vec<String>)>,
) -> Result<(), String> {
    let mut here = parent.to_vec();
    here.push(m.ident.to_string());
    if m.content.is_some() {
        // Inline: its items are scanned with the file that holds them.
        return Ok(());
    }
    let dir: PathBuf = parent.iter().fold(src.to_path_buf(), |d, p| d.join(p));
    let name = m.ident.to_string();
    let explicit = m.attrs.iter().find_map(|a| {
        let syn::Meta::NameValue(nv) = &a.meta else {
            return None;
        };
        if !nv.path.is_ident("path") {
            return None;
        }
        match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(dir.join(s.value())),
            _ => None,
        }
    });
    let file = match explicit {
        Some(p) => p,
        None if dir.join(format!("{name}.rs")).is_file() => dir.join(format!("{name}.rs")),
        None => dir.join(&name).join("mod.rs"),
    };
    let parsed = parse(&file)?;
    out.push((file.clone(), here.clone()));
    for item in &parsed.items {
        if let syn::Item::Mod(sub) = item {
            if !is_test_only(&sub.attrs) {
                module_files(src, &here, sub, out)?;
            }
        }
    }
    Ok(())
}

/// Collects the top-level modules a file names, outside test code.
struct Refs {
    file: String,
    /// The module the file is (`["drain", "state"]`), for `super::` paths.
    module_path: Vec<String>,
    /// `(module, line)`.
    found: Vec<(String, usize)>,
}

impl Refs {
    /// The top-level module a path names from this file, if it leaves the crate root:
    /// `crate::x::..` → `x`; `super::..` chains that climb to the crate root → the next
    /// segment.
    fn target(&self, segments: &[String]) -> Option<String> {
        match segments.first().map(String::as_str) {
            Some("crate") => segments.get(1).cloned(),
            Some("super") => {
                let ups = segments.iter().take_while(|s| *s == "super").count();
                let depth = self.module_path.len();
                if ups >= depth {
                    segments.get(ups).cloned()
                } else {
                    None
                }
            }
            _ => None,
        }
    }

    fn note(&mut self, segments: &[String], line: usize) {
        if let Some(t) = self.target(segments) {
            if t != "self" && t != "super" && t != "crate" {
                self.found.push((t, line));
            }
        }
    }

    /// `use` trees: every leaf path, with the prefix it sits under.
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let line = n.ident.span().start().line;
                prefix.push(n.ident.to_string());
                let segs = prefix.clone();
                prefix.pop();
                self.note(&segs, line);
            }
            syn::UseTree::Rename(r) => {
                let line = r.ident.span().start().line;
                prefix.push(r.ident.to_string());
                let segs = prefix.clone();
                prefix.pop();
                self.note(&segs, line);
            }
            syn::UseTree::Glob(g) => {
                // `use crate::x::*` names `x`; `use crate::*` names nothing by itself.
                let line = g.star_token.span.start().line;
                let segs = prefix.clone();
                self.note(&segs, line);
            }
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }

    /// `crate :: ident` (and `super :: ...`) in a macro's tokens, at any depth.
    fn tokens(&mut self, tokens: TokenStream) {
        let tts: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < tts.len() {
            match &tts[i] {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(id) if id == "crate" || id == "super" => {
                    // A path: ident (`::` ident)*.
                    let mut segs = vec![id.to_string()];
                    let line = id.span().start().line;
                    let mut j = i + 1;
                    loop {
                        let colons = matches!(
                            (tts.get(j), tts.get(j + 1)),
                            (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
                                if a.as_char() == ':' && b.as_char() == ':'
                        );
                        match (colons, tts.get(j + 2)) {
                            (true, Some(TokenTree::Ident(next))) => {
                                segs.push(next.to_string());
                                j += 3;
                            }
                            _ => break,
                        }
                    }
                    if segs.len() > 1 {
                        self.note(&segs, line);
                    }
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
}

/// The attributes of an item, whatever its kind.
fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::ExternCrate(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::ForeignMod(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::TraitAlias(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

impl<'ast> Visit<'ast> for Refs {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if is_test_only(item_attrs(item)) {
            return;
        }
        if let syn::Item::Mod(m) = item {
            // An inline module: paths inside it are relative to it.
            if let Some((_, items)) = &m.content {
                self.module_path.push(m.ident.to_string());
                for i in items {
                    self.visit_item(i);
                }
                self.module_path.pop();
            }
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs = match item {
            syn::ImplItem::Const(i) => &i.attrs,
            syn::ImplItem::Fn(i) => &i.attrs,
            syn::ImplItem::Type(i) => &i.attrs,
            syn::ImplItem::Macro(i) => &i.attrs,
            _ => return syn::visit::visit_impl_item(self, item),
        };
        if !is_test_only(attrs) {
            syn::visit::visit_impl_item(self, item);
        }
    }

    fn visit_trait_item(&mut self, item: &'ast syn::TraitItem) {
        let attrs = match item {
            syn::TraitItem::Const(i) => &i.attrs,
            syn::TraitItem::Fn(i) => &i.attrs,
            syn::TraitItem::Type(i) => &i.attrs,
            syn::TraitItem::Macro(i) => &i.attrs,
            _ => return syn::visit::visit_trait_item(self, item),
        };
        if !is_test_only(attrs) {
            syn::visit::visit_trait_item(self, item);
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if let Some(first) = p.segments.first() {
            self.note(&segs, first.ident.span().start().line);
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.visit_path(&m.path);
        self.tokens(m.tokens.clone());
    }
}

#[test]
fn the_top_level_modules_form_floors() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let g = Graph::read(&src).unwrap_or_else(|e| panic!("{e}"));
    assert!(g.modules.len() > 10, "modules found: {:?}", g.modules);
    if let Some(c) = g.cycle() {
        panic!(
            "the top-level modules of {} import each other in a cycle (a module on a lower \
             floor reaches up):\n  {c}\nMove what the lower module needs down (or the code \
             that needs the upper module up); the floors are listed in src/lib.rs.",
            src.display()
        );
    }
    let floors = g.describe_floors();
    println!(
        "floors of {} (a module uses only modules on floors below its own):\n{floors}",
        src.display(),
    );
    let wrong = docs_disagreements(&src, &g);
    assert!(
        wrong.is_empty(),
        "the docs give other floors than the code has:\n  {}\nthe floors:\n{floors}",
        wrong.join("\n  ")
    );
}

/// A crate in a temporary folder, from `(path, text)` pairs.
fn synthetic(files: &[(&str, &str)]) -> (tempfile::TempDir, Graph) {
    let dir = tempfile::tempdir().unwrap();
    for (p, text) in files {
        let path = dir.path().join(p);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
    }
    let g = Graph::read(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    (dir, g)
}

#[test]
fn a_cycle_through_an_inline_path_is_found_with_its_witnesses() {
    let (_d, g) = synthetic(&[
        ("lib.rs", "pub mod a;\npub mod b;\n"),
        ("a.rs", "pub fn f() -> u8 {\n    crate::b::g()\n}\n"),
        ("b/mod.rs", "pub mod inner;\npub fn g() -> u8 { 1 }\n"),
        (
            "b/inner.rs",
            "pub fn h() -> u8 {\n    let x = 1;\n    x + crate::a::f()\n}\n",
        ),
    ]);
    let c = g
        .cycle()
        .unwrap_or_else(|| panic!("no cycle in {:?}", g.edges));
    assert!(
        c == "a -> b (a.rs:2) -> a (b/inner.rs:3)" || c == "b -> a (b/inner.rs:3) -> b (a.rs:2)",
        "{c}"
    );
}

#[test]
fn use_groups_macros_and_super_paths_count() {
    let (_d, g) = synthetic(&[
        ("lib.rs", "pub mod a;\npub mod b;\npub mod c;\npub mod d;\n"),
        ("a.rs", "use crate::{b, c::X};\n"),
        (
            "b.rs",
            "pub fn f() {\n    tracing::info!(x = %crate::d::g(), \"y\");\n}\n",
        ),
        ("c/mod.rs", "pub mod deep;\npub struct X;\n"),
        ("c/deep.rs", "pub fn k() { super::super::d::g(); }\n"),
        ("d.rs", "pub fn g() -> u8 { 1 }\n"),
    ]);
    let edges: Vec<(&str, &str)> = g
        .edges
        .keys()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    assert_eq!(edges, [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")]);
    assert_eq!(g.edges[&("b".into(), "d".into())], "b.rs:2");
    assert!(g.cycle().is_none());
    let floors = g.floors();
    assert_eq!(floors["d"], 0);
    assert_eq!(floors["b"], 1);
    assert_eq!(floors["a"], 2);
    let text = g.describe_floors();
    assert!(
        text.starts_with("floor  2: a (uses b, c)\nfloor  1: b (uses d); c (uses d)\n"),
        "{text}"
    );
}

#[test]
fn comments_doc_links_and_test_code_do_not_count() {
    let (_d, g) = synthetic(&[
        ("lib.rs", "pub mod a;\npub mod b;\n#[cfg(test)]\nmod t;\n"),
        ("a.rs", "pub fn f() -> u8 {\n    crate::b::g()\n}\n"),
        (
            "b/mod.rs",
            r#"//! Used by [`crate::a::f`].
// crate::a::f() is the caller.
/// See [`crate::a`] and `crate::a::f`.
pub fn g() -> u8 {
    /* crate::a::f() */
    let _s = "crate::a::f()";
    1
}
#[cfg(test)]
mod tests {
    use crate::a;
    #[test]
    fn t() { assert_eq!(crate::a::f(), 1); }
}
#[cfg(all(test, unix))]
fn only_in_tests() -> u8 { crate::a::f() }
impl Clone for Thing {
    #[cfg(test)]
    fn clone(&self) -> Thing { crate::a::f(); Thing }
}
pub struct Thing;
#[cfg(test)]
mod more;
"#,
        ),
        ("b/more.rs", "use crate::a::f;\n"),
        ("t.rs", "use crate::a; use crate::b;\n"),
    ]);
    assert!(g.cycle().is_none(), "{:?}", g.edges);
    assert_eq!(
        g.edges.keys().cloned().collect::<Vec<_>>(),
        [("a".to_string(), "b".to_string())]
    );
    // `t` is a test-only module: not a floor.
    assert!(!g.modules.contains("t"));
}

// ---------------------------------------------------------------------------------------
// Typed errors (issue 21): outside the edges (`cli/`, the `main`s), no error type is
// free text.

/// One untyped error in the library: `file:line` and what it is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Untyped {
    at: String,
    what: String,
}

/// Names of fields that hold free text rather than a fact (a key, a path, a unit).
const FREE_TEXT_FIELDS: &[&str] = &[
    "message",
    "msg",
    "reason",
    "detail",
    "details",
    "text",
    "error",
    "description",
    "cause",
    "what",
    "why",
];

/// Every untyped error in the library rooted at `src/lib.rs`, outside test code and the
/// top-level modules in `edges` (`cli`): a `Result` whose error type is `String`, `str`
/// (any reference to it), `Cow<str>`, `Box<dyn Error>` or a tuple of them (directly or
/// through a type alias); `Box<dyn Error>` anywhere; `anyhow`; an error type (deriving or implementing
/// `Error`, or named `...Error`) with a variant or struct whose fields are all free text
/// (unnamed, or named `message`, `reason`, ...).
fn untyped_errors(src: &Path, edges: &[&str]) -> Result<Vec<Untyped>, String> {
    let lib = parse(&src.join("lib.rs"))?;
    let mut files = Vec::new();
    for item in &lib.items {
        let syn::Item::Mod(m) = item else { continue };
        if is_test_only(&m.attrs) || edges.contains(&m.ident.to_string().as_str()) {
            continue;
        }
        module_files(src, &[], m, &mut files)?;
    }
    let mut parsed = Vec::new();
    for (path, _) in &files {
        let shown = path.strip_prefix(src).unwrap_or(path).display().to_string();
        parsed.push((shown, parse(path)?));
    }
    // Pass 1: the aliases (`type E = String;`, `type R<T> = Result<T, String>;`), crate-wide
    // by name, until no new one is found (an alias of an alias).
    let mut aliases = Aliases::default();
    loop {
        let before = (aliases.error.len(), aliases.result.len());
        for (_, f) in &parsed {
            let mut v = AliasFinder {
                aliases: &mut aliases,
            };
            v.visit_file(f);
        }
        if (aliases.error.len(), aliases.result.len()) == before {
            break;
        }
    }
    // Pass 2: every type, error type and `anyhow` path.
    let mut found = BTreeSet::new();
    for (shown, f) in &parsed {
        let mut v = UntypedFinder {
            file: shown,
            aliases: &aliases,
            found: &mut found,
        };
        v.visit_file(f);
    }
    Ok(found.into_iter().collect())
}

/// Type aliases of untyped errors, by name.
#[derive(Debug, Default)]
struct Aliases {
    /// `type E = String;` and the like.
    error: BTreeSet<String>,
    /// `type R<T> = Result<T, String>;` and the like.
    result: BTreeSet<String>,
}

impl Aliases {
    /// Whether `ty` is an untyped error type: `String`, `str` behind any reference,
    /// `Cow<str>`, `Box<dyn Error ..>`, or an alias of one.
    fn is_untyped(&self, ty: &syn::Type) -> bool {
        match ty {
            syn::Type::Reference(r) => is_str(&r.elem) || self.is_untyped(&r.elem),
            syn::Type::Paren(p) => self.is_untyped(&p.elem),
            // `(String, String)`: free text in a tuple is still free text.
            syn::Type::Tuple(t) => {
                !t.elems.is_empty() && t.elems.iter().all(|e| self.is_untyped(e))
            }
            syn::Type::Group(g) => self.is_untyped(&g.elem),
            syn::Type::Path(p) => {
                let Some(last) = p.path.segments.last() else {
                    return false;
                };
                let name = last.ident.to_string();
                if p.path.segments.len() == 1 && self.error.contains(&name) {
                    return true;
                }
                match name.as_str() {
                    "String" => true,
                    "Cow" => generic_types(last).iter().any(|t| is_str(t)),
                    "Box" | "Arc" | "Rc" => generic_types(last).first().is_some_and(is_dyn_error),
                    _ => false,
                }
            }
            _ => false,
        }
    }

    /// Whether `ty` is a `Result` (or an alias of one) whose error type is untyped.
    fn is_untyped_result(&self, p: &syn::TypePath) -> bool {
        let Some(last) = p.path.segments.last() else {
            return false;
        };
        let name = last.ident.to_string();
        if p.path.segments.len() == 1 && self.result.contains(&name) {
            return true;
        }
        name == "Result"
            && generic_types(last)
                .get(1)
                .is_some_and(|e| self.is_untyped(e))
    }
}

/// The type arguments of a path segment (`Result<T, E>` → `[T, E]`).
fn generic_types(seg: &syn::PathSegment) -> Vec<&syn::Type> {
    match &seg.arguments {
        syn::PathArguments::AngleBracketed(a) => a
            .args
            .iter()
            .filter_map(|g| match g {
                syn::GenericArgument::Type(t) => Some(t),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn is_str(ty: &syn::Type) -> bool {
    matches!(ty, syn::Type::Path(p) if p.path.is_ident("str"))
}

/// `dyn Error (+ Send + Sync + 'static)`, by the last segment of its first trait.
fn is_dyn_error(ty: &&syn::Type) -> bool {
    let syn::Type::TraitObject(t) = ty else {
        return false;
    };
    t.bounds.iter().any(|b| match b {
        syn::TypeParamBound::Trait(tb) => {
            tb.path.segments.last().is_some_and(|s| s.ident == "Error")
        }
        _ => false,
    })
}

/// Pass 1: aliases of untyped errors.
struct AliasFinder<'a> {
    aliases: &'a mut Aliases,
}

impl<'ast> Visit<'ast> for AliasFinder<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if is_test_only(item_attrs(item)) {
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_item_type(&mut self, t: &'ast syn::ItemType) {
        let name = t.ident.to_string();
        if self.aliases.is_untyped(&t.ty) {
            self.aliases.error.insert(name);
        } else if let syn::Type::Path(p) = &*t.ty {
            if self.aliases.is_untyped_result(p) {
                self.aliases.result.insert(name);
            }
        }
    }
}

/// Pass 2: the untyped errors themselves.
struct UntypedFinder<'a> {
    file: &'a str,
    aliases: &'a Aliases,
    found: &'a mut BTreeSet<Untyped>,
}

impl UntypedFinder<'_> {
    fn note(&mut self, line: usize, what: String) {
        self.found.insert(Untyped {
            at: format!("{}:{line}", self.file),
            what,
        });
    }

    /// An error type's variant (or struct) whose fields are all free text.
    fn free_text_fields(&mut self, owner: &str, fields: &syn::Fields, line: usize) {
        let all: Vec<&syn::Field> = fields.iter().collect();
        if all.is_empty() {
            return;
        }
        let free = all.iter().all(|f| {
            let text = self.aliases.is_untyped(&f.ty);
            let named_fact = f
                .ident
                .as_ref()
                .is_some_and(|i| !FREE_TEXT_FIELDS.contains(&i.to_string().as_str()));
            text && !named_fact
        });
        if free {
            self.note(
                line,
                format!("error {owner} holds only free text (name what it carries, or type it)"),
            );
        }
    }
}

/// Whether an item's attributes derive `Error` (`thiserror::Error` or `Error`).
fn derives_error(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("derive")
            && a.parse_args_with(
                syn::punctuated::Punctuated::<syn::Path, syn::Token![,]>::parse_terminated,
            )
            .is_ok_and(|ps| {
                ps.iter()
                    .any(|p| p.segments.last().is_some_and(|s| s.ident == "Error"))
            })
    })
}

/// A type as the code writes it (near enough): `Result<(), String>`.
fn type_text(ty: &syn::Type) -> String {
    quote::ToTokens::to_token_stream(ty)
        .to_string()
        .replace(" < ", "<")
        .replace("< ", "<")
        .replace(" >", ">")
        .replace(" ,", ",")
        .replace("& ", "&")
        .replace(" :: ", "::")
}

impl<'ast> Visit<'ast> for UntypedFinder<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if is_test_only(item_attrs(item)) {
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        match item {
            syn::ImplItem::Fn(i) if is_test_only(&i.attrs) => {}
            syn::ImplItem::Type(t) if !is_test_only(&t.attrs) => {
                if t.ident == "Error" && self.aliases.is_untyped(&t.ty) {
                    let line = t.ident.span().start().line;
                    self.note(line, format!("type Error = {}", type_text(&t.ty)));
                }
                syn::visit::visit_impl_item(self, item);
            }
            _ => syn::visit::visit_impl_item(self, item),
        }
    }

    fn visit_item_enum(&mut self, e: &'ast syn::ItemEnum) {
        if derives_error(&e.attrs) || e.ident.to_string().ends_with("Error") {
            for v in &e.variants {
                let owner = format!("{}::{}", e.ident, v.ident);
                self.free_text_fields(&owner, &v.fields, v.ident.span().start().line);
            }
        }
        syn::visit::visit_item_enum(self, e);
    }

    fn visit_item_struct(&mut self, s: &'ast syn::ItemStruct) {
        if derives_error(&s.attrs) || s.ident.to_string().ends_with("Error") {
            let owner = s.ident.to_string();
            self.free_text_fields(&owner, &s.fields, s.ident.span().start().line);
        }
        syn::visit::visit_item_struct(self, s);
    }

    fn visit_type(&mut self, ty: &'ast syn::Type) {
        match ty {
            syn::Type::Path(p) if self.aliases.is_untyped_result(p) => {
                let line = p.path.segments[0].ident.span().start().line;
                self.note(line, format!("{} (an untyped error)", type_text(ty)));
            }
            syn::Type::Path(p)
                if matches!(p.path.segments.last(), Some(s) if ["Box", "Arc", "Rc"]
                    .contains(&s.ident.to_string().as_str())
                    && generic_types(s).first().is_some_and(is_dyn_error)) =>
            {
                let line = p.path.segments[0].ident.span().start().line;
                self.note(line, format!("{} (a type-erased error)", type_text(ty)));
            }
            _ => {}
        }
        syn::visit::visit_type(self, ty);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.segments.first().is_some_and(|s| s.ident == "anyhow") {
            let line = p.segments[0].ident.span().start().line;
            self.note(line, "anyhow (only cli/ and the mains may use it)".into());
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if let syn::UseTree::Path(p) = &u.tree {
            if p.ident == "anyhow" {
                let line = p.ident.span().start().line;
                self.note(
                    line,
                    "use anyhow (only cli/ and the mains may use it)".into(),
                );
            }
        }
    }
}

#[test]
fn untyped_errors_are_found_in_every_form() {
    let dir = tempfile::tempdir().unwrap();
    for (p, text) in [
        ("lib.rs", "pub mod a;\npub mod cli;\n#[cfg(test)]\nmod t;\n"),
        (
            "a.rs",
            r#"pub fn s() -> Result<(), String> { Ok(()) }
pub fn r(x: &str) -> Result<u8, &'static str> { Err(x.len().to_string().leak()) }
pub type E = std::borrow::Cow<'static, str>;
pub fn alias() -> Result<(), E> { Ok(()) }
pub type R<T> = Result<T, (String, String)>;
pub fn result_alias() -> R<u8> { Ok(1) }
pub fn boxed() -> Result<(), Box<dyn std::error::Error + Send>> { Ok(()) }
#[derive(Debug, thiserror::Error)]
pub enum AError {
    #[error("{0}")]
    Text(String),
    #[error("{message}")]
    Message { message: String },
    #[error("{path}: {message}")]
    Fact { path: String, message: String },
    #[error("unit")]
    Unit,
}
pub fn typed() -> Result<(), AError> { Ok(()) }
pub fn io() -> std::io::Result<()> { Ok(()) }
pub fn any() -> anyhow::Result<()> { Ok(()) }
"#,
        ),
        ("cli.rs", "pub fn edge() -> Result<(), String> { Ok(()) }\n"),
        (
            "t.rs",
            "pub fn test_only() -> Result<(), String> { Ok(()) }\n",
        ),
    ] {
        std::fs::write(dir.path().join(p), text).unwrap();
    }
    let found = untyped_errors(dir.path(), &["cli"]).unwrap_or_else(|e| panic!("{e}"));
    let at: Vec<&str> = found.iter().map(|u| u.at.as_str()).collect();
    // Lines 1, 2, 4, 6 (results, through aliases too), 5 (the alias itself), 7 (twice: an
    // untyped result, a type-erased error), 11 and 13 (free-text variants), 21 (anyhow);
    // not the variant that names a fact (15), the unit variant, io::Result, cli/ or test
    // code.
    assert_eq!(
        at,
        [
            "a.rs:1", "a.rs:11", "a.rs:13", "a.rs:2", "a.rs:21", "a.rs:4", "a.rs:5", "a.rs:6",
            "a.rs:7", "a.rs:7"
        ],
        "{found:#?}"
    );
}

#[test]
fn library_errors_are_typed() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = untyped_errors(&src, &["cli"]).unwrap_or_else(|e| panic!("{e}"));
    let list: Vec<String> = found
        .iter()
        .map(|u| format!("{}: {}", u.at, u.what))
        .collect();
    if std::env::var_os("UNTYPED_ERRORS_REPORT").is_some() {
        println!("{} untyped errors:\n  {}", list.len(), list.join("\n  "));
        return;
    }
    assert!(
        list.is_empty(),
        "{} untyped errors in {} outside cli/ (a thiserror enum in the module that owns it, \
         its variants carrying the path, key, unit or command, is what the library returns; \
         anyhow is for cli/ and the mains):\n  {}",
        list.len(),
        src.display(),
        list.join("\n  ")
    );
}

// ---------------------------------------------------------------------------------------
// One gateway (issue 36 §1): every change of the node's state in Slurm goes through
// `node_state::Gateway`. Outside `node_state/` (the gateway) and `slurm/node.rs` (where
// scontrol's words are written once), no code calls scontrol to drain, resume, update a
// node's state, reboot, power down or delete a node.

/// Scontrol's methods that change a node's state (`slurm/node.rs`), and the words of one
/// that might come: a call of one of them on a `scontrol` is the gateway's alone.
const NODE_STATE_METHODS: &[&str] = &[
    "drain",
    "resume",
    "reboot",
    "delete_node",
    "power_down",
    "power_up",
    "update_node",
    "set_state",
];

/// Where the gateway is: its own folder, the file that writes scontrol's words, and the
/// seam over scontrol (`slurm/ctl.rs`, whose `impl Slurmctld for Scontrol` calls
/// `Scontrol::drain(self, ..)` and its kin).
fn gateway_file(shown: &str) -> bool {
    shown.starts_with("node_state/") || shown == "slurm/node.rs" || shown == "slurm/ctl.rs"
}

/// One change of the node's state outside the gateway: `file:line` and the call.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Bypass {
    at: String,
    what: String,
}

/// Every call outside the gateway, in the library rooted at `src/lib.rs` (test code
/// aside): a method of [`NODE_STATE_METHODS`] on a receiver that is a scontrol (an
/// expression naming `scontrol`, or a name bound to one: a parameter typed `Scontrol`, a
/// `let` of an expression naming `scontrol` or `Scontrol`), and scontrol's words run
/// directly (`run(&["update", "NodeName=..", "State=.."])`, `reboot`, `power`, `delete
/// NodeName=`, `create NodeName=`).
fn node_state_bypasses(src: &Path) -> Result<Vec<Bypass>, String> {
    let lib = parse(&src.join("lib.rs"))?;
    let mut files = Vec::new();
    for item in &lib.items {
        let syn::Item::Mod(m) = item else { continue };
        if !is_test_only(&m.attrs) {
            module_files(src, &[], m, &mut files)?;
        }
    }
    let mut found = BTreeSet::new();
    for (path, _) in &files {
        let shown = path.strip_prefix(src).unwrap_or(path).display().to_string();
        if gateway_file(&shown) {
            continue;
        }
        let f = parse(path)?;
        let mut v = BypassFinder {
            file: &shown,
            scontrols: Vec::new(),
            fields: scontrol_fields(&f),
            found: &mut found,
        };
        v.visit_file(&f);
    }
    Ok(found.into_iter().collect())
}

/// Whether tokens name a scontrol: an identifier `scontrol`, `Scontrol`, `ReadyScontrol`,
/// `*_scontrol`..., or the seam over it (`slurmctld`, `dyn Slurmctld`).
fn names_scontrol(tokens: TokenStream) -> bool {
    tokens.into_iter().any(|t| match t {
        TokenTree::Ident(i) => {
            let name = i.to_string().to_ascii_lowercase();
            name.contains("scontrol") || name.contains("slurmctld")
        }
        TokenTree::Group(g) => names_scontrol(g.stream()),
        _ => false,
    })
}

/// The words of an argument list's arrays (`&["update", &format!("NodeName={n}")]`): string
/// literals and the templates of `format!`, lower case; `None` for an element that is
/// neither.
fn scontrol_words(
    args: &syn::punctuated::Punctuated<syn::Expr, syn::Token![,]>,
) -> Vec<Vec<Option<String>>> {
    fn word(e: &syn::Expr) -> Option<String> {
        match e {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value().to_ascii_lowercase()),
            syn::Expr::Reference(r) => word(&r.expr),
            syn::Expr::Macro(m) if m.mac.path.is_ident("format") => {
                match m.mac.tokens.clone().into_iter().next() {
                    Some(TokenTree::Literal(l)) => {
                        Some(l.to_string().trim_matches('"').to_ascii_lowercase())
                    }
                    _ => None,
                }
            }
            _ => None,
        }
    }
    fn array(e: &syn::Expr) -> Option<&syn::ExprArray> {
        match e {
            syn::Expr::Array(a) => Some(a),
            syn::Expr::Reference(r) => array(&r.expr),
            _ => None,
        }
    }
    args.iter()
        .filter_map(array)
        .map(|a| a.elems.iter().map(word).collect())
        .collect()
}

/// Whether scontrol's words change a node: `update` of a `NodeName=` or with `State=`,
/// `reboot`, `power`, `delete` or `create` of a `NodeName=`.
fn changes_a_node(words: &[Option<String>]) -> bool {
    let first = words.first().cloned().flatten().unwrap_or_default();
    let any = |p: &str| words.iter().flatten().any(|w| w.starts_with(p));
    match first.as_str() {
        "reboot" | "power" => true,
        "update" => any("nodename=") || any("state="),
        "delete" | "create" => any("nodename="),
        _ => false,
    }
}

/// Finds the bypasses of one file.
struct BypassFinder<'a> {
    file: &'a str,
    /// Names bound to a scontrol in the functions being visited (innermost last).
    scontrols: Vec<Vec<String>>,
    /// The file's struct fields typed as a scontrol (`ctl: Arc<dyn Slurmctld>`).
    fields: Vec<String>,
    found: &'a mut BTreeSet<Bypass>,
}

/// The names of `file`'s struct fields whose type names a scontrol ([`names_scontrol`]).
fn scontrol_fields(file: &syn::File) -> Vec<String> {
    struct Fields(Vec<String>);
    impl<'ast> Visit<'ast> for Fields {
        fn visit_field(&mut self, f: &'ast syn::Field) {
            if let Some(name) = &f.ident {
                if names_scontrol(quote::ToTokens::to_token_stream(&f.ty)) {
                    self.0.push(name.to_string());
                }
            }
        }
    }
    let mut v = Fields(Vec::new());
    v.visit_file(file);
    v.0
}

/// The generic type parameters of `generics` bounded by a scontrol (`C: Slurmctld`, or
/// `where C: Slurmctld`).
fn scontrol_generics(generics: &syn::Generics) -> Vec<String> {
    let mut out = Vec::new();
    for p in generics.type_params() {
        if p.bounds
            .iter()
            .any(|b| names_scontrol(quote::ToTokens::to_token_stream(b)))
        {
            out.push(p.ident.to_string());
        }
    }
    for w in generics
        .where_clause
        .iter()
        .flat_map(|w| w.predicates.iter())
    {
        if let syn::WherePredicate::Type(t) = w {
            if t.bounds
                .iter()
                .any(|b| names_scontrol(quote::ToTokens::to_token_stream(b)))
            {
                out.push(quote::ToTokens::to_token_stream(&t.bounded_ty).to_string());
            }
        }
    }
    out
}

/// Whether `tokens` hold one of the identifiers `names`.
fn holds_ident(tokens: TokenStream, names: &[String]) -> bool {
    tokens.into_iter().any(|t| match t {
        TokenTree::Ident(i) => names.iter().any(|n| i == n),
        TokenTree::Group(g) => holds_ident(g.stream(), names),
        _ => false,
    })
}

impl BypassFinder<'_> {
    fn bound(&self, name: &str) -> bool {
        self.scontrols.iter().flatten().any(|n| n == name)
    }

    fn bind(&mut self, pat: &syn::Pat) {
        let name = match pat {
            syn::Pat::Ident(i) => i.ident.to_string(),
            syn::Pat::Type(t) => match &*t.pat {
                syn::Pat::Ident(i) => i.ident.to_string(),
                _ => return,
            },
            _ => return,
        };
        if let Some(scope) = self.scontrols.last_mut() {
            scope.push(name);
        }
    }

    /// Whether `e` is a scontrol: it names one, is a name bound to one, or a field typed
    /// as one (`self.ctl`); through `&`, `*` and parentheses.
    fn is_scontrol(&self, e: &syn::Expr) -> bool {
        match e {
            syn::Expr::Path(p) => {
                if let Some(id) = p.path.get_ident() {
                    if self.bound(&id.to_string()) {
                        return true;
                    }
                }
            }
            syn::Expr::Field(f) => {
                if let syn::Member::Named(name) = &f.member {
                    if self.fields.iter().any(|n| name == n) {
                        return true;
                    }
                }
            }
            syn::Expr::Reference(r) => return self.is_scontrol(&r.expr),
            syn::Expr::Unary(u) => return self.is_scontrol(&u.expr),
            syn::Expr::Paren(p) => return self.is_scontrol(&p.expr),
            _ => {}
        }
        names_scontrol(quote::ToTokens::to_token_stream(e))
    }

    /// Binds the names a pattern gives to a scontrol: the whole pattern, or the fields of a
    /// struct pattern that name one (`Peers { slurmctld: ctl, .. }`).
    fn bind_fields(&mut self, pat: &syn::Pat) {
        if let syn::Pat::Struct(s) = pat {
            for f in &s.fields {
                if let syn::Member::Named(name) = &f.member {
                    if names_scontrol(quote::ToTokens::to_token_stream(name)) {
                        self.bind(&f.pat);
                    }
                }
            }
        }
    }

    fn note(&mut self, line: usize, what: String) {
        self.found.insert(Bypass {
            at: format!("{}:{line}", self.file),
            what,
        });
    }

    fn words(
        &mut self,
        line: usize,
        args: &syn::punctuated::Punctuated<syn::Expr, syn::Token![,]>,
    ) {
        for words in scontrol_words(args) {
            if changes_a_node(&words) {
                let shown: Vec<&str> = words.iter().map(|w| w.as_deref().unwrap_or("..")).collect();
                self.note(line, format!("scontrol {} run directly", shown.join(" ")));
            }
        }
    }
}

impl<'ast> Visit<'ast> for BypassFinder<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if is_test_only(item_attrs(item)) {
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        if let syn::ImplItem::Fn(f) = item {
            if is_test_only(&f.attrs) {
                return;
            }
        }
        syn::visit::visit_impl_item(self, item);
    }

    fn visit_signature(&mut self, sig: &'ast syn::Signature) {
        // Parameters typed `Scontrol` (`&Scontrol`, `Option<&Scontrol>`...), or a generic
        // type bounded by one (`c: &C` with `C: Slurmctld`), or a struct whose fields
        // name one, destructured.
        let generics = scontrol_generics(&sig.generics);
        for input in &sig.inputs {
            if let syn::FnArg::Typed(t) = input {
                self.bind_fields(&t.pat);
                let ty = quote::ToTokens::to_token_stream(&t.ty);
                if names_scontrol(ty.clone()) || holds_ident(ty, &generics) {
                    self.bind(&t.pat);
                }
            }
        }
        syn::visit::visit_signature(self, sig);
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.scontrols.push(Vec::new());
        syn::visit::visit_item_fn(self, f);
        self.scontrols.pop();
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.scontrols.push(Vec::new());
        syn::visit::visit_impl_item_fn(self, f);
        self.scontrols.pop();
    }

    fn visit_local(&mut self, l: &'ast syn::Local) {
        let typed = matches!(&l.pat, syn::Pat::Type(t)
            if names_scontrol(quote::ToTokens::to_token_stream(&t.ty)));
        let init = l
            .init
            .as_ref()
            .is_some_and(|i| names_scontrol(quote::ToTokens::to_token_stream(&i.expr)));
        if typed || init {
            self.bind(&l.pat);
        }
        self.bind_fields(&l.pat);
        syn::visit::visit_local(self, l);
    }

    fn visit_expr_closure(&mut self, c: &'ast syn::ExprClosure) {
        for input in &c.inputs {
            if let syn::Pat::Type(t) = input {
                if names_scontrol(quote::ToTokens::to_token_stream(&t.ty)) {
                    self.bind(input);
                }
            }
        }
        syn::visit::visit_expr_closure(self, c);
    }

    fn visit_expr_method_call(&mut self, c: &'ast syn::ExprMethodCall) {
        let method = c.method.to_string();
        let line = c.method.span().start().line;
        if NODE_STATE_METHODS.contains(&method.as_str()) && self.is_scontrol(&c.receiver) {
            let receiver = quote::ToTokens::to_token_stream(&c.receiver)
                .to_string()
                .replace(' ', "");
            self.note(
                line,
                format!("{receiver}.{method}(..) changes the node's state"),
            );
        }
        self.words(line, &c.args);
        syn::visit::visit_expr_method_call(self, c);
    }

    fn visit_expr_call(&mut self, c: &'ast syn::ExprCall) {
        let line = match &*c.func {
            syn::Expr::Path(p) => p
                .path
                .segments
                .first()
                .map_or(0, |s| s.ident.span().start().line),
            _ => 0,
        };
        // `Slurmctld::drain(&*c, ..)`, `<dyn Slurmctld>::resume(x, ..)`, `Scontrol::reboot(..)`.
        if let syn::Expr::Path(p) = &*c.func {
            let method = p.path.segments.last().map(|s| s.ident.to_string());
            let on_scontrol = names_scontrol(quote::ToTokens::to_token_stream(p))
                || c.args.first().is_some_and(|a| self.is_scontrol(a));
            if let Some(method) = method {
                if NODE_STATE_METHODS.contains(&method.as_str()) && on_scontrol {
                    let path = quote::ToTokens::to_token_stream(p)
                        .to_string()
                        .replace(' ', "");
                    self.note(line, format!("{path}(..) changes the node's state"));
                }
            }
        }
        self.words(line, &c.args);
        syn::visit::visit_expr_call(self, c);
    }
}

#[test]
fn node_state_bypasses_are_found_in_every_form() {
    let dir = tempfile::tempdir().unwrap();
    for (p, text) in [
        ("lib.rs", "pub mod a;\npub mod node_state;\npub mod slurm;\n"),
        (
            "a.rs",
            r#"use crate::slurm::Scontrol;
pub async fn f(scontrol: &Scontrol, sc2: &Scontrol, gateway: &G, v: &mut Vec<u8>) {
    scontrol.drain("n1", "r").await;
    let mut sc = scontrol.clone();
    sc.resume("n1").await;
    sc2.reboot("n1", "r").await;
    gateway.drain(1, None).await;
    v.drain(..);
    scontrol.run(&["update", &format!("NodeName={}", "n1"), "State=RESUME"]).await;
    scontrol.run(&["update", "ReservationName=x", "Duration+=5"]).await;
    scontrol.run(&["delete", "reservation", "x"]).await;
    scontrol.run(&["show", "node", "n1"]).await;
    crate::slurm::Scontrol::configured(&s).delete_node("n1").await;
    self.ops.scontrol.run(&["power", "down", "n1"]).await;
}
pub async fn h(slurmctld: &dyn Slurmctld) { slurmctld.delete_node("n1").await; }
pub async fn k(ctl: &dyn Slurmctld) { ctl.resume("n").await; }
pub async fn m<C: Slurmctld>(c: &C) { c.reboot("n", "r").await; }
pub async fn p(x: &X) { Slurmctld::resume(x, "n").await; }
pub async fn q(peers: Peers<'_>) { let Peers { slurmctld: ctl, .. } = peers; ctl.drain("n", "r").await; }
pub struct W { ctl: std::sync::Arc<dyn Slurmctld> }
impl W { async fn w(&self) { self.ctl.delete_node("n").await; } }
pub async fn r<C>(c: &C) where C: Slurmctld { let f = |s: &dyn Slurmctld| s.resume("n"); f(c); c.drain("n", "r").await; }
#[cfg(test)]
mod tests {
    async fn t(scontrol: &Scontrol) { scontrol.drain("n1", "r").await; }
}
"#,
        ),
        (
            "node_state/mod.rs",
            "pub async fn g(scontrol: &S) { scontrol.drain(\"n\", \"r\").await; }\n",
        ),
        (
            "slurm/mod.rs",
            "pub mod ctl;\npub mod look;\npub mod node;\npub mod record;\n",
        ),
        (
            "slurm/ctl.rs",
            "impl Slurmctld for Scontrol { async fn drain(&self, n: &str, r: &str) { Scontrol::drain(self, n, r).await; } }\n",
        ),
        (
            "slurm/look.rs",
            "impl Slurmctld for Look { async fn drain(&self, n: &str, r: &str) { Scontrol::drain(&self.0, n, r).await; } }\n",
        ),
        (
            "slurm/node.rs",
            "impl Scontrol { pub async fn resume(&self, n: &str) { self.run(&[\"update\", \"State=RESUME\"]).await; } }\n",
        ),
        (
            "slurm/record.rs",
            "pub async fn stale(scontrol: &Scontrol) { scontrol.delete_node(\"n\").await; }\n",
        ),
    ] {
        let path = dir.path().join(p);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let found = node_state_bypasses(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let at: Vec<&str> = found.iter().map(|b| b.at.as_str()).collect();
    // Lines 3, 5 (a name bound to a scontrol), 6 (a parameter), 9 (update NodeName= State=),
    // 13 (a scontrol made in place), 14 (power), 16 and 17 (the seam over scontrol, named
    // or typed), 18 (a generic bounded by it), 19 (a path call), 20 (a destructured
    // field), 22 (a struct field), 23 (a closure's parameter, a where bound); not the
    // gateway's drain, a Vec's, the reservation's update and delete, a show, test code,
    // node_state/, slurm/node.rs or slurm/ctl.rs; slurm/record.rs and slurm/look.rs are
    // not the gateway.
    assert_eq!(
        at,
        [
            "a.rs:13",
            "a.rs:14",
            "a.rs:16",
            "a.rs:17",
            "a.rs:18",
            "a.rs:19",
            "a.rs:20",
            "a.rs:22",
            "a.rs:23",
            "a.rs:23",
            "a.rs:3",
            "a.rs:5",
            "a.rs:6",
            "a.rs:9",
            "slurm/look.rs:1",
            "slurm/record.rs:1"
        ],
        "{found:#?}"
    );
    assert!(
        found
            .iter()
            .any(|b| b.what == "scontrol update nodename={} state=resume run directly"),
        "{found:#?}"
    );
}

#[test]
fn node_state_changes_go_through_the_gateway() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = node_state_bypasses(&src).unwrap_or_else(|e| panic!("{e}"));
    let list: Vec<String> = found
        .iter()
        .map(|b| format!("{}: {}", b.at, b.what))
        .collect();
    assert!(
        list.is_empty(),
        "{} changes of the node's state in Slurm outside the gateway in {} (drain, resume, \
         reboot and delete go through node_state::Gateway, which records them in the drain \
         state machine and applies the ownership rules of reason.rs):\n  {}",
        list.len(),
        src.display(),
        list.join("\n  ")
    );
}
