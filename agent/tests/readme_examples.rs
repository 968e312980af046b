//! Every settings example in README.md and docs/*.md is what the agent accepts: each
//! ```toml block is a valid settings file (its `[[mounts]]` resolve for an instance region),
//! and the user data example yields a settings part that is valid too. (`agent.toml.example`
//! is checked in the settings module's own tests; `docs/settings.md`'s examples also in
//! tests/settings_reference.rs.)
#![allow(clippy::unwrap_used)]

use slurm_node_agent::settings::{Layer, Resolved, Source};

/// `(name, text)` of README.md and every page of docs/.
fn pages() -> Vec<(String, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out = vec![(
        "README.md".to_string(),
        std::fs::read_to_string(root.join("README.md")).unwrap(),
    )];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    for p in docs {
        let name = format!("docs/{}", p.file_name().unwrap().to_string_lossy());
        out.push((name, std::fs::read_to_string(&p).unwrap()));
    }
    out
}

/// Fenced blocks: (info string, body, line of the opening fence).
fn blocks(text: &str) -> Vec<(String, String, usize)> {
    let mut out = Vec::new();
    let mut open: Option<(String, String, usize)> = None;
    for (i, line) in text.lines().enumerate() {
        if let Some(rest) = line.strip_prefix("```") {
            match open.take() {
                None => open = Some((rest.trim().to_string(), String::new(), i + 1)),
                Some(b) => out.push(b),
            }
        } else if let Some((_, body, _)) = open.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    out
}

#[test]
fn every_toml_example_in_the_readme_and_docs_is_valid() {
    let mut seen = 0;
    for (page, text) in pages() {
        for (info, body, line) in blocks(&text) {
            if info != "toml" {
                continue;
            }
            seen += 1;
            let source = Source::File(format!("{page}:{line}").into());
            let layer = Layer::from_toml(source, &body)
                .unwrap_or_else(|e| panic!("{page} line {line}: {e}"));
            let r = Resolved::merge(&[layer]).unwrap_or_else(|e| panic!("{page} line {line}: {e}"));
            for m in &r.settings.mounts {
                m.resolve("us-east-1")
                    .unwrap_or_else(|e| panic!("{page} line {line}: mount: {e:?}"));
            }
        }
    }
    assert!(seen > 0, "no ```toml block in README.md or docs/");
}

#[test]
fn the_readme_user_data_example_is_read() {
    let (_, text) = pages().into_iter().next().unwrap();
    let docs: Vec<_> = blocks(&text)
        .into_iter()
        .filter(|(_, body, _)| body.starts_with("Content-Type: multipart/"))
        .collect();
    assert!(!docs.is_empty(), "no user data example in README.md");
    for (_, body, line) in docs {
        // User data as EC2 serves it: CRLF or LF both work; the README has LF.
        let parts = slurm_node_agent::userdata::settings_parts(body.as_bytes()).unwrap();
        assert!(
            !parts.is_empty(),
            "README.md line {line}: no settings part found"
        );
        let layers: Vec<Layer> = parts
            .iter()
            .map(|p| Layer::from_toml(Source::UserData(p.index), &p.text).unwrap())
            .collect();
        Resolved::merge(&layers).unwrap_or_else(|e| panic!("README.md line {line}: {e}"));
    }
}
