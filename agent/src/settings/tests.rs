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
        e.starts_with("/etc/slurm-node-agent/conf.d/20-bad.toml, line 3, column 21: "),
        "{e}"
    );
    // toml's snippet, its caret under the place.
    assert!(e.contains("3 | name = \"unterminated\n"), "{e}");
    assert!(e.ends_with('^'), "{e}");
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

/// A flag's or tag's value that its key's type refuses: one line, the key named once (not
/// toml's own "in `key`" line after it, which would become the error's last line).
#[test]
fn a_refused_flag_value_is_one_line_naming_the_key_once() {
    for (key, value) in [
        ("slurm.join_deadline", "soon"),
        ("auth.type", "kerberos"),
        ("upgrade.interval", "400days"),
    ] {
        let e = Layer::from_key_value(Source::Flag, key, value)
            .unwrap_err()
            .to_string();
        assert!(!e.contains('\n'), "{e:?}");
        // Named once as the key (its example names it again, in a line to copy).
        assert_eq!(e.matches(&format!("`{key}`")).count(), 1, "{e}");
        assert!(
            e.starts_with(&format!("command line: key `{key}`: ")),
            "{e}"
        );
    }
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
    let layers = Layer::from_dropin_dir(dir.path(), false).unwrap();
    let r = Resolved::merge(&layers).unwrap();
    assert_eq!(r.settings.node.weight, 20);
    assert_eq!(r.settings.node.name, "a");
    assert!(Layer::from_dropin_dir(&dir.path().join("missing"), true)
        .unwrap()
        .is_empty());
    // Given explicitly, a missing folder is an error.
    let e = Layer::from_dropin_dir(&dir.path().join("missing"), false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing") && e.contains("no such folder"), "{e}");
}

#[test]
fn entries_list_every_key_with_its_source() {
    let r = Resolved::merge(&[file("[auth]\nkey_source = \"ssm:/c/munge\"\n")]).unwrap();
    let entries = r.entries();
    let ks = entries
        .iter()
        .find(|(k, _, _, _)| k == "auth.key_source")
        .unwrap();
    assert_eq!(ks.1.as_str(), Some("ssm:/c/munge"));
    assert!(matches!(ks.2, Source::File(_)));
    assert!(entries
        .iter()
        .any(|(k, _, s, _)| k == "node.name_template" && *s == Source::Default));
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

// ---- trust classes ----

fn tag(key: &str, value: &str) -> Layer {
    Layer::from_tags([(format!("slurm-node-agent:{key}").as_str(), value)])
        .unwrap()
        .remove(0)
}

#[test]
fn every_key_has_exactly_one_trust_class() {
    let mut schema = known_keys();
    schema.sort();
    let mut classed: Vec<String> = trust::all_keys().into_iter().map(|(k, _)| k).collect();
    classed.sort();
    let before = classed.len();
    classed.dedup();
    assert_eq!(before, classed.len(), "a key is classed twice");
    assert_eq!(schema, classed);
}

#[test]
fn keys_naming_paths_programs_owners_units_and_endpoints_are_image_only() {
    for key in [
        "auth.key_path",
        "auth.key_owner",
        "auth.type",
        "upgrade.hook",
        "upgrade.poweroff_unit",
        "slurm.bin_dir",
        "slurm.slurmd_unit",
        "slurm.munge_unit",
        "slurm.slurmd_options_file",
        "imds.endpoint",
        "agent.state_dir",
        "systemd.bus",
        "health.checks_dir",
        "health.nhc_conf",
        "health.prometheus_textfile",
        "health.reason_prefix",
        "drain.metrics_file",
    ] {
        assert_eq!(trust::class_of(key).trust, Trust::Image, "{key}");
    }
    assert_eq!(trust::class_of("node.name").trust, Trust::Tag);
    assert_eq!(trust::class_of("slurm.conf_servers").trust, Trust::Tag);
    assert_eq!(trust::class_of("auth.key_source").trust, Trust::UserData);
    assert_eq!(trust::class_of("mounts").trust, Trust::UserData);
}

#[test]
fn the_tag_escalation_chain_is_refused_naming_the_tag_and_key() {
    let base = file("[auth]\nkey_source = \"secretsmanager:cluster/munge\"\n");
    for (key, value) in [
        ("auth.key_source", "ssm:/evil/cron"),
        ("auth.key_encoding", "raw"),
        ("auth.key_path", "/etc/cron.d/evil"),
        ("auth.key_owner", "root"),
        ("upgrade.hook", "/bin/sh,-c,id"),
        ("slurm.bin_dir", "/tmp/evil"),
        ("imds.endpoint", "http://10.9.9.9"),
        ("slurm.slurmd_unit", "debug-shell.service"),
        ("agent.state_dir", "/etc"),
    ] {
        let e = Resolved::merge(&[base.clone(), tag(key, value)])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!(
                "instance tag \"slurm-node-agent:{key}\": key `{key}`"
            )),
            "{e}"
        );
        assert!(e.contains("may not be set from an instance tag"), "{e}");
        // Operator commands warn and go on without it.
        let r =
            Resolved::merge_with(&[base.clone(), tag(key, value)], Enforce::WarnAndIgnore).unwrap();
        assert_eq!(r.refused.len(), 1, "{key}");
        assert_eq!(r.settings.auth.key_source, "secretsmanager:cluster/munge");
        assert!(r.settings.auth.key_path.as_os_str().is_empty());
        assert_ne!(
            r.source_of(key),
            Source::Tag(format!("slurm-node-agent:{key}"))
        );
    }
    // The node's shape still comes from tags.
    let r = Resolved::merge(&[base, tag("node.name", "gpu-7"), tag("node.weight", "9")]).unwrap();
    assert_eq!(r.settings.node.name, "gpu-7");
}

#[test]
fn a_tag_with_a_bad_value_fails_bootstrap_but_not_the_operator_commands() {
    let base = file("[node]\nname = \"n1\"\n");
    for (key, value) in [
        ("node.name", "x;rm"),
        ("node.real_memory_reserve_percent", "900"),
    ] {
        let layers = [base.clone(), tag(key, value)];
        let e = Resolved::merge(&layers).unwrap_err().to_string();
        assert!(!e.is_empty());
        // status, drain, resume, config show: warned, and every tag setting left out.
        let r = Resolved::merge_with(&layers, Enforce::WarnAndIgnore).unwrap();
        assert_eq!(r.settings.node.name, "n1", "{key}={value}");
        assert_eq!(r.refused.len(), 1, "{:?}", r.refused);
        assert!(
            r.refused[0].ends_with("every setting from instance tags ignored"),
            "{:?}",
            r.refused
        );
    }
}

#[test]
fn user_data_may_pick_a_secret_but_not_a_file_or_a_destination() {
    let ok = Layer::from_toml(
        Source::UserData(1),
        "[auth]\nkey_source = \"secretsmanager:arn:aws:secretsmanager:us-east-1:111122223333:secret:pcs!x\"\nkey_encoding = \"raw\"\n",
    )
    .unwrap();
    Resolved::merge(&[ok]).unwrap();
    let file_source = Layer::from_toml(
        Source::UserData(1),
        "\n[auth]\nkey_source = \"file:/etc/shadow\"\n",
    )
    .unwrap();
    let e = Resolved::merge(&[file_source]).unwrap_err().to_string();
    assert!(
        e.starts_with(
            "user data part 1 (application/x-slurm-node-agent), line 3: key `auth.key_source`"
        ),
        "{e}"
    );
    assert!(e.contains("never a file"), "{e}");
    let dest = Layer::from_toml(
        Source::UserData(1),
        "[auth]\nkey_path = \"/etc/cron.d/x\"\n",
    )
    .unwrap();
    let e = Resolved::merge(&[dest]).unwrap_err().to_string();
    assert!(
        e.contains("key `auth.key_path`") && e.contains("trust class `image`"),
        "{e}"
    );
    // From a file of the image, a file source is fine.
    Resolved::merge(&[file("[auth]\nkey_source = \"file:/etc/munge/seed.key\"\n")]).unwrap();
    // A tag may not pick the secret at all.
    let e = Resolved::merge(&[tag("auth.key_source", "ssm:/x")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("trust class `user-data`"), "{e}");
}

#[test]
fn mounts_from_user_data_take_no_unit_dependencies() {
    let text = "[[mounts]]\ntype = \"tmpfs\"\nsource = \"tmpfs\"\nmount_point = \"/scratch\"\noptions = \"size=8m,x-systemd.requires=debug-shell.service\"\n";
    let e = Resolved::merge(&[Layer::from_toml(Source::UserData(1), text).unwrap()])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("key `mounts`") && e.contains("unit dependencies"),
        "{e}"
    );
    // The same from the image is allowed.
    Resolved::merge(&[file(text)]).unwrap();
    // Plain mounts from user data are fine.
    let plain = "[[mounts]]\ntype = \"efs\"\nfile_system_id = \"fs-0123456789abcdef0\"\nregion = \"us-east-1\"\nmount_point = \"/home\"\n";
    Resolved::merge(&[Layer::from_toml(Source::UserData(1), plain).unwrap()]).unwrap();
}

#[test]
fn config_entries_carry_the_trust_class() {
    let r = Resolved::merge(&[]).unwrap();
    let e = r.entries();
    let class = |key: &str| e.iter().find(|x| x.0 == key).unwrap().3;
    assert_eq!(class("auth.key_path"), Trust::Image);
    assert_eq!(class("node.features"), Trust::Tag);
    assert_eq!(class("events.enabled"), Trust::UserData);
}

#[test]
fn the_settings_reference_table_matches_the_code() {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/settings.md"))
        .unwrap();
    let table = trust::markdown_table();
    assert!(
        page.contains(&table),
        "docs/settings.md's table of keys and sources is out of date; replace it with:\n{table}"
    );
}

#[cfg(unix)]
#[test]
fn settings_files_must_be_root_owned_and_not_group_or_world_writable() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("agent.toml");
    std::fs::write(&p, "[node]\nweight = 3\n").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(Layer::from_file(&p, false).unwrap().is_some());
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o664)).unwrap();
    let e = Layer::from_file(&p, false).unwrap_err().to_string();
    assert!(e.contains("agent.toml") && e.contains("mode 664"), "{e}");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    // A folder others can write (without the sticky bit) is refused too.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = Layer::from_file(&p, false).unwrap_err().to_string();
    assert!(e.contains("can be written by others"), "{e}");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    assert!(Layer::from_file(&p, false).unwrap().is_some());
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    if rustix::process::geteuid().is_root() {
        rustix::fs::chown(&p, Some(rustix::fs::Uid::from_raw(65534)), None).unwrap();
        let e = Layer::from_file(&p, false).unwrap_err().to_string();
        assert!(e.contains("owned by uid 65534, not root"), "{e}");
    }
}

// ---- bad input: bounds, paths, error naming, sizes ----

#[test]
fn huge_and_zero_durations_are_clear_errors() {
    for (text, key) in [
        ("[imds]\ntimeout = \"580000000000years\"\n", "timeout"),
        ("[health]\ntimeout = \"18446744073709551615s\"\n", "timeout"),
        (
            "[events]\nmaintenance_lead = \"400d\"\n",
            "maintenance_lead",
        ),
    ] {
        let e = Layer::from_toml(Source::File("/x.toml".into()), text)
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2") && e.contains(key), "{e}");
        assert!(
            e.contains("too long") || e.contains("invalid duration"),
            "{e}"
        );
    }
    for (text, key) in [
        ("[imds]\ntimeout = \"0s\"\n", "imds.timeout"),
        ("[slurm]\njoin_deadline = \"0s\"\n", "slurm.join_deadline"),
        ("[events]\ninterval = \"0s\"\n", "events.interval"),
        (
            "[health]\nscontrol_timeout = \"0s\"\n",
            "health.scontrol_timeout",
        ),
        ("[drain]\nlock_timeout = \"0s\"\n", "drain.lock_timeout"),
        ("[upgrade]\nhook_timeout = \"0s\"\n", "upgrade.hook_timeout"),
        ("[upgrade]\nfleet_rate = 0\n", "upgrade.fleet_rate"),
        ("[upgrade]\nfleet_rate = -4.0\n", "upgrade.fleet_rate"),
        ("[upgrade]\ninterval = \"0s\"\n", "upgrade.interval"),
        ("[agent]\nstate_dir = \"\"\n", "agent.state_dir"),
        (
            "[node]\nreal_memory_reserve_mib = 9223372036854775807\n",
            "node.real_memory_reserve_mib",
        ),
        ("[node]\ngpus = \"4294967295\"\n", "node.gpus"),
    ] {
        let e =
            Resolved::merge(&[Layer::from_toml(Source::File("/etc/x.toml".into()), text).unwrap()])
                .unwrap_err()
                .to_string();
        assert!(
            e.starts_with(&format!("/etc/x.toml, line 2: key `{key}`")),
            "{text}: {e}"
        );
    }
}

#[test]
fn mount_errors_name_their_file_entry_and_line() {
    let text = "[[mounts]]\ntype = \"tmpfs\"\nsource = \"tmpfs\"\nmount_point = \"/scratch\"\n\n[[mounts]]\ntype = \"tmpfs\"\nsource = \"tmpfs\"\nmount_point = \"/etc\"\n";
    let layer = Layer::from_toml(
        Source::File("/etc/slurm-node-agent/conf.d/20-fs.toml".into()),
        text,
    )
    .unwrap();
    let e = Resolved::merge(&[layer]).unwrap_err().to_string();
    assert!(
        e.starts_with(
            "/etc/slurm-node-agent/conf.d/20-fs.toml, line 9: key `mounts[1].mount_point`"
        ),
        "{e}"
    );
}

#[test]
fn explicit_missing_files_dangling_links_and_folders_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let e = file_layers(&Paths {
        file: dir.path().join("nope.toml"),
        dropin_dir: dir.path().to_path_buf(),
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("nope.toml") && e.contains("must exist"), "{e}");
    let d = dir.path().join("conf.d");
    std::fs::create_dir(&d).unwrap();
    std::fs::create_dir(d.join("10-dir.toml")).unwrap();
    let e = Layer::from_dropin_dir(&d, false).unwrap_err().to_string();
    assert!(
        e.contains("10-dir.toml") && e.contains("not a regular file"),
        "{e}"
    );
    std::fs::remove_dir(d.join("10-dir.toml")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("gone"), d.join("20-link.toml")).unwrap();
    let e = Layer::from_dropin_dir(&d, false).unwrap_err().to_string();
    assert!(e.contains("20-link.toml") && e.contains("dangling"), "{e}");
}

#[test]
fn oversized_files_and_tag_values_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("big.toml");
    let mut text = String::from("[node]\nfeatures = [\n");
    while text.len() <= trust::MAX_FILE_BYTES as usize {
        text.push_str("\"abcdefghijklmnopqrstuvwxyz\",\n");
    }
    text.push_str("]\n");
    std::fs::write(&p, &text).unwrap();
    let e = Layer::from_file(&p, false).unwrap_err().to_string();
    assert!(
        e.contains("big.toml") && e.contains("limited to 1048576 bytes"),
        "{e}"
    );
    let e = Layer::from_tags([("slurm-node-agent:node.features", "a,".repeat(600).as_str())])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("instance tag \"slurm-node-agent:node.features\"") && e.contains("at most 1024"),
        "{e}"
    );
}

#[test]
fn node_lifecycle_errors_name_their_file_script_and_line() {
    let text = "[node_lifecycle]\npoweroff_unit = \"poweroff.target\"\n\n\
                [[node_lifecycle.node_ready]]\nname = \"ok\"\nscript_location = \"file:/opt/ok.sh\"\n\
                execution_policy = \"EVERY_BOOT\"\non_error = \"CONTINUE\"\n\n\
                [[node_lifecycle.node_ready]]\nname = \"bad\"\n\
                script_location = \"ssm:name with space\"\n\
                execution_policy = \"EVERY_BOOT\"\non_error = \"CONTINUE\"\n";
    let layer = Layer::from_toml(
        Source::File("/etc/slurm-node-agent/conf.d/30-scripts.toml".into()),
        text,
    )
    .unwrap();
    let e = Resolved::merge(&[layer]).unwrap_err().to_string();
    assert!(
        e.starts_with(
            "/etc/slurm-node-agent/conf.d/30-scripts.toml, line 12: \
             key `node_lifecycle.node_ready[1].script_location`: script \"bad\": "
        ),
        "{e}"
    );
    assert!(e.contains("' '"), "{e}");
    // A plain key of the section names its file and line too.
    let layer = Layer::from_toml(
        Source::File("/etc/x.toml".into()),
        "[node_lifecycle]\n\npoweroff_unit = \"../x\"\n",
    )
    .unwrap();
    let e = Resolved::merge(&[layer]).unwrap_err().to_string();
    assert!(
        e.starts_with("/etc/x.toml, line 3: key `node_lifecycle.poweroff_unit`"),
        "{e}"
    );
    // From the command line.
    let flag = Layer::from_key_value(Source::Flag, "node_lifecycle.poweroff_unit", "a b").unwrap();
    let e = Resolved::merge(&[flag]).unwrap_err().to_string();
    assert!(
        e.starts_with("command line: key `node_lifecycle.poweroff_unit`"),
        "{e}"
    );
}

#[test]
fn settings_file_with_mounts_array_and_unknown_keys() {
    let text = r#"
[[mounts]]
mount_point = "/fsx"
file_system_id = "fs-0123456789abcdef0"
mount_name = "abcdefgh"
lnet = true

[[mounts]]
type = "efs"
mount_point = "/home"
file_system_id = "fs-12345678"
required = false
retry_for = "30s"
"#;
    let s: Settings = toml::from_str(text).unwrap();
    assert_eq!(s.mounts.len(), 2);
    assert!(!s.mounts[1].required);
    assert_eq!(s.mounts[1].retry_for.0, std::time::Duration::from_secs(30));
    assert!(s.validate().is_ok());
    let bad = "[[mounts]]\nmount_point = \"/fsx\"\nsorce = \"x\"\n";
    let e = toml::from_str::<Settings>(bad).unwrap_err();
    assert!(e.to_string().contains("sorce"), "{e}");
    let dup = "[[mounts]]\nmount_point = \"/fsx\"\nsource = \"10.0.0.1@tcp:/fsx\"\n\
               [[mounts]]\nmount_point = \"/fsx\"\nsource = \"10.0.0.2@tcp:/fsx\"\n";
    let s: Settings = toml::from_str(dup).unwrap();
    assert_eq!(s.validate().unwrap_err().key, "mounts[1].mount_point");
}

#[test]
fn the_managed_join_uses_auth_slurm_unless_told_otherwise() {
    use crate::authkey::AuthType;
    let r = Resolved::merge(&[file("[slurm]\nconf_servers = [\"ctl\"]\n")]).unwrap();
    assert_eq!(r.settings.auth.auth_type, AuthType::Munge);
    let r = Resolved::merge(&[file("[pcs]\nenabled = true\n")]).unwrap();
    assert_eq!(r.settings.auth.auth_type, AuthType::Slurm);
    let told = file("[pcs]\nenabled = true\n[auth]\ntype = \"munge\"\n");
    let r = Resolved::merge(&[told]).unwrap();
    assert_eq!(r.settings.auth.auth_type, AuthType::Munge);
}

/// `upgrade.fleet_rate` is a number: a whole one in TOML or on the command line counts too.
#[test]
fn the_fleet_rate_takes_whole_and_fractional_numbers() {
    for text in [
        "[upgrade]\nfleet_rate = 8\n",
        "[upgrade]\nfleet_rate = 8.0\n",
    ] {
        let r =
            Resolved::merge(&[Layer::from_toml(Source::File("/etc/x.toml".into()), text).unwrap()])
                .unwrap();
        assert_eq!(r.settings.upgrade.fleet_rate, 8.0, "{text}");
    }
    let r = Resolved::merge(&[
        Layer::from_key_value(Source::Flag, "upgrade.fleet_rate", "0.5").unwrap(),
    ])
    .unwrap();
    assert_eq!(r.settings.upgrade.fleet_rate, 0.5);
    let e =
        Resolved::merge(&[Layer::from_key_value(Source::Flag, "upgrade.fleet_rate", "0").unwrap()])
            .unwrap_err()
            .to_string();
    assert!(
        e.contains("upgrade.fleet_rate") && e.contains("more than 0"),
        "{e}"
    );
}

#[test]
fn repairs_are_never_turned_on_by_a_tag_and_bad_values_name_their_key() {
    for (key, value) in [
        ("repair.mode", "report"),
        ("repair.mode", "on"),
        ("repair.action", "replace"),
        ("repair.breaker_share", "1"),
    ] {
        let e = Resolved::merge(&[tag(key, value)]).unwrap_err().to_string();
        let want = format!("instance tag \"slurm-node-agent:{key}\": key `{key}`");
        assert!(e.starts_with(&want), "{key}: {e}");
    }
    // From user data, an unknown action or a share outside (0, 1] is refused naming both.
    for (text, key) in [
        ("[repair]\naction = \"recycle\"\n", "repair.action"),
        ("[repair]\nmode = \"always\"\n", "repair.mode"),
        ("[repair]\nreplace_within_boots = 0\n", "repair.replace_within_boots"),
        ("[repair]\nbreaker_share = 1.5\n", "repair.breaker_share"),
        ("[repair]\nbreaker_min_nodes = 0\n", "repair.breaker_min_nodes"),
        (
            "[[repair.checks]]\ncheck = \"GPUs\"\naction = \"replace\"\n[[repair.checks]]\ncheck = \"GPUs\"\naction = \"none\"\n",
            "repair.checks[1].check",
        ),
    ] {
        // A bad enum value fails as the part is read; a bad number as the layers merge.
        let e = match Layer::from_toml(Source::UserData(1), text) {
            Err(e) => e.to_string(),
            Ok(layer) => Resolved::merge(&[layer]).unwrap_err().to_string(),
        };
        // As every section's: the dotted key, or (a parse error) its line and leaf key.
        let leaf = key.rsplit('.').next().unwrap().split('[').next().unwrap();
        let named = e.contains(key) || (e.contains(leaf) && e.contains("line "));
        assert!(e.contains("user data") && named, "{text}: {e}");
    }
}

#[test]
fn an_orphan_window_not_longer_than_the_join_deadline_is_refused_naming_both() {
    let text = "[orphan]\nafter = \"5m\"\n";
    let e = Resolved::merge(&[Layer::from_toml(Source::File("/etc/x.toml".into()), text).unwrap()])
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("/etc/x.toml, line 2: key `orphan.after`"),
        "{e}"
    );
    assert!(
        e.contains("orphan.after = 5m") && e.contains("slurm.join_deadline = 10m"),
        "{e}"
    );
    // A node defined in slurm.conf has the watch off by default: not checked.
    let text = "[orphan]\nafter = \"5m\"\n\n[node]\ndynamic = false\n";
    Resolved::merge(&[Layer::from_toml(Source::File("/etc/x.toml".into()), text).unwrap()])
        .unwrap();
    // Longer than the join deadline: accepted.
    let text = "[orphan]\nafter = \"15m\"\n\n[slurm]\njoin_deadline = \"14m\"\n";
    Resolved::merge(&[Layer::from_toml(Source::File("/etc/x.toml".into()), text).unwrap()])
        .unwrap();
}

/// A site that set nothing about orphans but lets its nodes join for 30 minutes or more
/// (the default window's length) is not refused: the watch left at its defaults yields
/// (off, the daemon says why). A window the site chose, or `mode = "on"`, is refused.
#[test]
fn a_join_deadline_as_long_as_the_default_orphan_window_turns_the_default_watch_off() {
    let text = "[slurm]\njoin_deadline = \"30m\"\n";
    let s = Resolved::merge(&[Layer::from_toml(Source::File("/etc/x.toml".into()), text).unwrap()])
        .unwrap();
    let s = &s.settings;
    assert!(s
        .orphan
        .yields_to_join_deadline(true, s.slurm.join_deadline));
    assert!(!s.orphan.active(true, s.slurm.join_deadline));
    let text = "[slurm]\njoin_deadline = \"30m\"\n\n[orphan]\nmode = \"on\"\n";
    let e = Resolved::merge(&[Layer::from_toml(Source::File("/etc/x.toml".into()), text).unwrap()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("key `orphan.after`"), "{e}");
    assert!(
        e.contains("orphan.after = 30m") && e.contains("slurm.join_deadline = 30m"),
        "{e}"
    );
    let text = "[slurm]\njoin_deadline = \"30m\"\n\n[orphan]\nafter = \"20m\"\n";
    let e = Resolved::merge(&[Layer::from_toml(Source::File("/etc/x.toml".into()), text).unwrap()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("orphan.after = 20m"), "{e}");
}

/// Where a bad input of [`every_settings_error_names_source_key_expectation_and_example`]
/// comes from.
enum From {
    /// A settings file's text.
    File(&'static str),
    /// A user data settings part's text (the second part).
    UserData(&'static str),
    /// `--set KEY=VALUE`.
    Flag(&'static str, &'static str),
    /// A `slurm-node-agent:KEY` tag.
    Tag(&'static str, &'static str),
}

/// The error of one bad input, through the pipeline every command uses: the layer's own
/// check, then the merge and the validation.
fn error_of(from: &From) -> String {
    let layer = match from {
        From::File(text) => Layer::from_toml(
            Source::File("/etc/slurm-node-agent/conf.d/50-site.toml".into()),
            text,
        ),
        From::UserData(text) => Layer::from_toml(Source::UserData(2), text),
        From::Flag(k, v) => Layer::from_key_value(Source::Flag, k, v),
        From::Tag(k, v) => Layer::from_key_value(Source::Tag(format!("{TAG_PREFIX}{k}")), k, v),
    };
    match layer {
        Err(e) => e.to_string(),
        Ok(l) => Resolved::merge(&[l])
            .map(|_| String::from("accepted"))
            .unwrap_or_else(|e| e.to_string()),
    }
}

/// Rust's words that must never reach an operator: the names of the settings types (every
/// struct and enum the schema is built from), and serde's words for Rust shapes.
fn rust_names_in(message: &str) -> Vec<String> {
    let mut found: Vec<String> = reference::ITEMS
        .iter()
        .map(|i| i.name)
        // `Settings` alone is an English word; the section types are not.
        .filter(|n| *n != "Settings" && n.chars().skip(1).any(char::is_uppercase))
        .filter(|n| message.contains(n))
        .map(str::to_string)
        .collect();
    let rust = regex::Regex::new(
        r"::|\bstruct\b|\benum\b|\bsequence\b|\bmap\b|\b[iu](8|16|32|64|size)\b|\bf64\b|\bString\b|\bPathBuf\b|\bVec<|\bOption<|\bunknown field\b|\bunknown variant\b|``",
    )
    .unwrap();
    found.extend(rust.find_iter(message).map(|m| m.as_str().to_string()));
    found
}

/// Issue 44 §3: every settings error, at parse stage as at validation, names its source
/// (file and line, user data part, flag, tag), the dotted key, what the key takes and a
/// valid example, in a settings file's words (no Rust type, no serde phrase); a file's
/// error keeps toml's snippet with its caret.
#[test]
fn every_settings_error_names_source_key_expectation_and_example() {
    let file = "/etc/slurm-node-agent/conf.d/50-site.toml, line ";
    let part = "user data part 2 (";
    let flag = "command line: ";
    let tag = "instance tag \"slurm-node-agent:";
    // (input, where it must say it came from, key, what it expected, example)
    let cases: &[(From, &str, &str, &str, &str)] = &[
        // Wrong TOML types.
        (
            From::File("[health]\ninterval = 5\n"),
            &format!("{file}2, column 12"),
            "health.interval",
            "expected a duration, got the integer 5",
            "health.interval = \"5m\"",
        ),
        (
            From::UserData("[node]\nweight = \"heavy\"\n"),
            part,
            "node.weight",
            "expected an integer, got the string \"heavy\"",
            "node.weight = 10",
        ),
        (
            From::File("[events]\nlifecycle_hooks = 3\n"),
            &format!("{file}2"),
            "events.lifecycle_hooks",
            "expected a list of strings",
            "events.lifecycle_hooks = [\"slurm-drain\"]",
        ),
        (
            From::File("health = 5\n"),
            &format!("{file}1"),
            "health",
            "expected a table",
            "health.",
        ),
        // An entry of an array of tables that is not a table: serde would name its type.
        (
            From::File("node_lifecycle.node_ready = [\"x\"]\n"),
            &format!("{file}1"),
            "node_lifecycle.node_ready",
            "expected an array of tables",
            "[[node_lifecycle.node_ready]]",
        ),
        (
            From::File("[[node_lifecycle.node_ready]]\nname = 3\nscript_location = \"file:/x\"\n"),
            &format!("{file}2"),
            "node_lifecycle.node_ready[0].name",
            "expected a string, got the integer 3",
            "name = \"site-ready\" under [[node_lifecycle.node_ready]]",
        ),
        (
            From::File("[[mounts]]\nmount_point = [\"/fsx\"]\n"),
            &format!("{file}2"),
            "mounts[0].mount_point",
            "expected a path",
            "mount_point = \"/fsx\" under [[mounts]]",
        ),
        // Unknown keys: the nearest known one, with its example.
        (
            From::File("[health]\nintervl = \"5s\"\n"),
            &format!("{file}2, column 1"),
            "health.intervl",
            "did you mean `health.interval`",
            "health.interval = \"5m\"",
        ),
        (
            From::UserData("[nodes]\nweight = 1\n"),
            part,
            "nodes",
            "did you mean `node`",
            "node.",
        ),
        (
            From::Flag("node.wieght", "3"),
            flag,
            "node.wieght",
            "did you mean `node.weight`",
            "node.weight = 10",
        ),
        // Unknown enum values.
        (
            From::File("[node]\nrole = \"compte\"\n"),
            &format!("{file}2, column 8"),
            "node.role",
            "expected one of \"compute\", \"login\", got \"compte\"",
            "node.role = \"login\"",
        ),
        (
            From::Tag("events.rebalance", "panic"),
            tag,
            "events.rebalance",
            "expected one of",
            "events.rebalance = \"drain\"",
        ),
        // A missing key of an entry.
        (
            From::File("[[node_lifecycle.node_ready]]\nname = \"x\"\n"),
            &format!("{file}1"),
            "node_lifecycle.node_ready[0].script_location",
            "missing",
            "script_location = \"file:/opt/site/ready.sh\" under [[node_lifecycle.node_ready]]",
        ),
        // An array of tables from a flag: not ``unknown field `` ``.
        (
            From::Flag("mounts", "fs-1"),
            flag,
            "mounts",
            "an array of tables cannot be set from the command line",
            "[[mounts]]",
        ),
        (
            From::Flag("health.interval", "5"),
            flag,
            "health.interval",
            "invalid duration \"5\"",
            "health.interval = \"5m\"",
        ),
        // Validation, after the merge.
        (
            From::File("[health]\ninterval = \"0s\"\n"),
            &format!("{file}2"),
            "health.interval",
            "must be more than 0",
            "health.interval = \"5m\"",
        ),
        (
            From::File("[node]\nname_template = \"{bogus}-x\"\n"),
            &format!("{file}2"),
            "node.name_template",
            "unknown placeholder {bogus}",
            "node.name_template = \"{instance_family}-{local_ipv4_dashed}\"",
        ),
        (
            From::File("[node]\nname_template = \"{instance_id\"\n"),
            &format!("{file}2"),
            "node.name_template",
            "unclosed",
            "node.name_template = ",
        ),
        (
            From::UserData("[upgrade]\nmax_unavailable = \"10 %\"\n"),
            part,
            "upgrade.max_unavailable",
            "a percentage with no space before the sign such as \"10%\"",
            "upgrade.max_unavailable = \"10%\"",
        ),
        (
            From::Flag("upgrade.max_unavailable", "10 %"),
            flag,
            "upgrade.max_unavailable",
            "a node count such as 3",
            "upgrade.max_unavailable = \"10%\"",
        ),
        (
            From::File("[slurm]\nslurmd_unit = \"slurmd@.service\"\n"),
            &format!("{file}2"),
            "slurm.slurmd_unit",
            "\"slurmd@.service\" is a template unit",
            "slurm.slurmd_unit = \"slurmd.service\"",
        ),
        (
            From::File("[[mounts]]\nregion = \"us-east-1\"\n"),
            "/etc/slurm-node-agent/conf.d/50-site.toml",
            "mounts[0].mount_point",
            "missing",
            "mount_point = \"/fsx\" under [[mounts]]",
        ),
    ];
    for (from, source, key, expected, example) in cases {
        let e = error_of(from);
        assert!(e.starts_with(source), "source {source:?}:\n{e}");
        assert!(e.contains(&format!("`{key}`")), "key `{key}`:\n{e}");
        assert!(e.contains(expected), "expected {expected:?}:\n{e}");
        assert!(
            e.contains(&format!("for example `{example}"))
                || e.contains(&format!("For example `{example}"))
                || (example.starts_with("[[") && e.contains(&format!("for example `{example}"))),
            "example {example:?}:\n{e}"
        );
        assert_eq!(
            rust_names_in(&e),
            Vec::<String>::new(),
            "Rust words in:\n{e}"
        );
        if matches!(from, From::File(_) | From::UserData(_)) && e.contains("column") {
            // toml's snippet: the line, and a caret under the value.
            assert!(e.contains("\n  |\n") && e.contains('^'), "snippet:\n{e}");
        }
    }
    // The Rust names check itself finds what serde says without this module.
    let raw = toml::from_str::<Settings>("node_lifecycle.node_ready = [\"x\"]\n")
        .unwrap_err()
        .to_string();
    assert!(!rust_names_in(&raw).is_empty(), "{raw}");
}
