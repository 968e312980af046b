//! `docs/settings.md` is what the code says: the reference generated from the settings'
//! types, doc comments, defaults and trust classes (`slurm-node-agent config reference`).
//! When the code changes, regenerate it:
//!
//! ```sh
//! UPDATE_DOCS=1 cargo test -p slurm-node-agent --test settings_reference
//! ```
//!
//! (or `slurm-node-agent config reference > docs/settings.md`). Every key has an example,
//! and each example is a settings file the agent accepts.
#![allow(clippy::unwrap_used)]

use slurm_node_agent::settings::reference;
use slurm_node_agent::settings::{trust, Layer, Resolved, Source};

fn page() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/settings.md")
}

#[test]
fn docs_settings_md_is_the_generated_reference() {
    let generated = reference::markdown();
    if std::env::var_os("UPDATE_DOCS").is_some_and(|v| v == "1") {
        std::fs::write(page(), &generated).unwrap();
        return;
    }
    let written = std::fs::read_to_string(page()).unwrap_or_default();
    if written != generated {
        let line = written
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| written.lines().count().min(generated.lines().count()));
        panic!(
            "docs/settings.md differs from the code's settings reference (first at line {}):\n  \
             file: {:?}\n  code: {:?}\nRegenerate it: UPDATE_DOCS=1 cargo test -p \
             slurm-node-agent --test settings_reference (or slurm-node-agent config \
             reference > docs/settings.md), and commit it",
            line + 1,
            written.lines().nth(line).unwrap_or("(end of file)"),
            generated.lines().nth(line).unwrap_or("(end of file)"),
        );
    }
}

#[test]
fn the_command_prints_the_same_reference() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_slurm-node-agent"))
        .args(["config", "reference"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        reference::markdown()
    );
}

#[test]
fn every_key_has_a_type_a_doc_a_trust_class_and_an_example() {
    let keys: Vec<_> = reference::sections()
        .into_iter()
        .flat_map(|s| s.keys)
        .collect();
    let all: Vec<String> = trust::all_keys().into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        keys.iter().map(|k| k.dotted.clone()).collect::<Vec<_>>(),
        all,
        "the reference's keys are the trust tables' keys, in schema order"
    );
    for k in &keys {
        assert!(!k.doc.is_empty(), "{}: no doc comment", k.dotted);
        assert!(
            !k.ty.is_empty() && !k.ty.starts_with('`'),
            "{}: type not in words: {}",
            k.dotted,
            k.ty
        );
        assert!(
            !k.example.is_empty(),
            "{}: no example in EXAMPLES",
            k.dotted
        );
        assert_eq!(
            k.trust.trust,
            trust::class_of(&k.dotted).trust,
            "{}",
            k.dotted
        );
        for e in &k.entry {
            assert!(
                !e.doc.is_empty(),
                "{}[].{}: no doc comment",
                k.dotted,
                e.dotted
            );
        }
    }
    for (k, _) in reference::EXAMPLES {
        assert!(all.iter().any(|a| a == k), "example for unknown key {k}");
    }
}

#[test]
fn every_example_is_accepted() {
    for (key, example) in reference::EXAMPLES {
        let text = reference::example_toml(key, example);
        let layer = Layer::from_toml(Source::File(format!("example of {key}").into()), &text)
            .unwrap_or_else(|e| panic!("{key}: {e}\n{text}"));
        let r = Resolved::merge(&[layer]).unwrap_or_else(|e| panic!("{key}: {e}\n{text}"));
        for m in &r.settings.mounts {
            m.resolve("us-east-1")
                .unwrap_or_else(|e| panic!("{key}: mount: {e:?}"));
        }
        // The example sets the key (not a default that hides a typo).
        assert!(
            !matches!(r.source_of(key), Source::Default),
            "{key}: the example does not set it"
        );
    }
}

/// The operator guide's "Who may set what" says every key that names a path is the image's
/// but the paths it lists as user data's: the reference's path keys agree, both ways.
#[test]
fn the_guide_names_every_path_key_user_data_may_set() {
    let guide = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operator-guide.md"),
    )
    .unwrap();
    let at = guide
        .find("Paths user data may set:")
        .expect("docs/operator-guide.md: no \"Paths user data may set:\" in \"Who may set what\"");
    let sentence = &guide[at..at + guide[at..].find('(').unwrap_or(guide.len() - at)];
    let mut listed: Vec<String> = sentence
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    listed.sort();
    let mut not_image: Vec<String> = Vec::new();
    for s in reference::sections() {
        for k in &s.keys {
            let paths: Vec<(String, &str)> = if k.entry.is_empty() {
                vec![(k.dotted.clone(), k.ty.as_str())]
            } else {
                k.entry
                    .iter()
                    .map(|e| (format!("{}[].{}", k.dotted, e.dotted), e.ty.as_str()))
                    .collect()
            };
            for (name, ty) in paths {
                if ty.contains("path") && k.trust.trust != slurm_node_agent::section::Trust::Image {
                    not_image.push(name);
                }
            }
        }
    }
    not_image.sort();
    assert_eq!(
        listed, not_image,
        "docs/operator-guide.md's \"Paths user data may set\" lists {listed:?}; the settings \
         whose type is a path and whose class is not image are {not_image:?}"
    );
}
