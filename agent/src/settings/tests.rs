#![allow(clippy::unwrap_used)]

use super::*;

fn file(text: &str) -> Layer {
    Layer::from_toml(
        Source::File("/etc/slurm-node-agent/agent.toml".into()),
        text,
    )
    .unwrap()
}

#[test]
fn layers_merge_in_order_and_record_sources() {
    let base =
        file("[node]\nweight = 5\nfeatures = [\"a\"]\n[slurm]\nconf_servers = [\"ctl:6817\"]\n");
    let dropin = Layer::from_toml(
        Source::File("/etc/slurm-node-agent/conf.d/10-x.toml".into()),
        "[node]\nweight = 7\n",
    )
    .unwrap();
    let tags = Layer::from_tags([
        ("slurm-node-agent:node.features", "b, c"),
        ("Name", "ignored: not our prefix"),
    ])
    .unwrap();
    let flag = Layer::from_key_value(Source::Flag, "node.name", "n-1").unwrap();
    let mut layers = vec![base, dropin];
    layers.extend(tags);
    layers.push(flag);
    let r = Resolved::merge(&layers).unwrap();
    assert_eq!(r.settings.node.weight, 7);
    assert_eq!(r.settings.node.features, ["b", "c"]);
    assert_eq!(r.settings.node.name, "n-1");
    assert_eq!(r.settings.slurm.conf_servers, ["ctl:6817"]);
    assert_eq!(
        r.source_of("node.weight"),
        Source::File("/etc/slurm-node-agent/conf.d/10-x.toml".into())
    );
    assert_eq!(
        r.source_of("node.features"),
        Source::Tag("slurm-node-agent:node.features".into())
    );
    assert_eq!(r.source_of("node.name"), Source::Flag);
    assert_eq!(r.source_of("node.dynamic"), Source::Default);
    // Defaults survive where nothing overrides them.
    assert!(r.settings.node.dynamic);
}

#[test]
fn malformed_toml_names_file_line_and_column() {
    let e = Layer::from_toml(
        Source::File("/etc/slurm-node-agent/conf.d/20-bad.toml".into()),
        "[node]\nweight = 5\nname = \"unterminated\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("/etc/slurm-node-agent/conf.d/20-bad.toml: "),
        "{e}"
    );
    assert!(e.contains("line 3"), "{e}");
    assert!(e.contains("column"), "{e}");
}

#[test]
fn unknown_keys_are_errors() {
    let e = Layer::from_toml(Source::UserData(1), "[node]\nwieght = 5\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("wieght"), "{e}");
    assert!(e.contains("line 2"), "{e}");
    let e = Layer::from_toml(Source::UserData(1), "[nodes]\nweight = 5\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("nodes"), "{e}");
    let e = Layer::from_key_value(Source::Flag, "node.nmae", "x")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`node.nmae`") && e.contains("unknown key"),
        "{e}"
    );
}

#[test]
fn wrong_types_name_the_key() {
    let e = Layer::from_toml(Source::UserData(1), "[node]\nweight = \"heavy\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("weight") && e.contains("line 2"), "{e}");
    let e = Layer::from_key_value(
        Source::Tag("slurm-node-agent:node.weight".into()),
        "node.weight",
        "x",
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        e,
        "instance tag \"slurm-node-agent:node.weight\": key `node.weight`: expected an integer, got \"x\""
    );
    let e = Layer::from_toml(Source::UserData(1), "[slurm]\njoin_deadline = \"soon\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("invalid duration \"soon\""), "{e}");
}

#[test]
fn hostile_tag_values_are_rejected_with_the_tag_named() {
    for (key, value) in [
        ("node.name", "a b"),
        ("node.name", "x RealMemory=1"),
        ("node.name", "n1\nSLURMD_OPTIONS=evil"),
        ("node.name", "$(reboot)"),
        ("node.name", "nœud"),
        ("node.features", "ok,bad feature"),
        ("node.features", "a=b"),
        ("slurm.conf_servers", "ctl;reboot"),
        ("slurm.conf_servers", "ctl:6817 --conf x"),
        ("auth.key_source", "ssm:a b"),
    ] {
        let tag = format!("slurm-node-agent:{key}");
        let layers = Layer::from_tags([(tag.as_str(), value)]).unwrap();
        let e = Resolved::merge(&layers).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("instance tag {tag:?}: key `{key}`")),
            "{value:?}: {e}"
        );
    }
}

#[test]
fn dropins_are_read_in_name_order_and_only_toml() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("20-b.toml"), "[node]\nweight = 20\n").unwrap();
    std::fs::write(
        dir.path().join("10-a.toml"),
        "[node]\nweight = 10\nname = \"a\"\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("30-c.toml.bak"), "garbage [[[").unwrap();
    let layers = Layer::from_dropin_dir(dir.path()).unwrap();
    let r = Resolved::merge(&layers).unwrap();
    assert_eq!(r.settings.node.weight, 20);
    assert_eq!(r.settings.node.name, "a");
    assert!(Layer::from_dropin_dir(&dir.path().join("missing"))
        .unwrap()
        .is_empty());
}

#[test]
fn entries_list_every_key_with_its_source() {
    let r = Resolved::merge(&[file("[auth]\nkey_source = \"ssm:/c/munge\"\n")]).unwrap();
    let entries = r.entries();
    let ks = entries
        .iter()
        .find(|(k, _, _)| k == "auth.key_source")
        .unwrap();
    assert_eq!(ks.1.as_str(), Some("ssm:/c/munge"));
    assert!(matches!(ks.2, Source::File(_)));
    assert!(entries
        .iter()
        .any(|(k, _, s)| k == "node.name_template" && *s == Source::Default));
}

#[test]
fn the_shipped_sample_settings_are_valid() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/agent.toml.example"))
        .unwrap();
    let layer = Layer::from_toml(Source::File("agent.toml.example".into()), &text).unwrap();
    Resolved::merge(&[layer]).unwrap();
}

#[test]
fn the_image_default_settings_are_valid() {
    // What packer/scripts bake into /etc/slurm-node-agent/agent.toml.
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../packer/files/agent.toml");
    let text = std::fs::read_to_string(path).unwrap();
    let layer = Layer::from_toml(Source::File(path.into()), &text).unwrap();
    let r = Resolved::merge(&[layer]).unwrap();
    assert!(r.settings.node.dynamic);
}
