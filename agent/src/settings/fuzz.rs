//! Property tests ("fuzz targets") of the settings layers: whatever text, tag or flag comes
//! in, reading and merging never panics, and every error names its source.
//!
//! `cargo test -p slurm-node-agent --lib settings::fuzz` runs a few hundred cases of each;
//! the ignored `fuzz_settings_layers_for_a_while` runs them for `SNA_FUZZ_SECS` seconds
//! (default 60) with fresh seeds, as CI does (`.ci/run`).
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use super::*;

/// Values that probe the edges: huge and zero durations, numbers at the limits, paths,
/// control characters, long strings.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0s".to_string()),
        Just("580000000000years".to_string()),
        Just("18446744073709551615s".to_string()),
        Just("9223372036854775807".to_string()),
        Just("-1".to_string()),
        Just(String::new()),
        Just("/etc/cron.d/x".to_string()),
        Just("file:/etc/shadow".to_string()),
        Just("ssm:/a/b".to_string()),
        Just("x-systemd.requires=a.service".to_string()),
        (
            0u64..u64::MAX,
            prop_oneof![Just("s"), Just("ms"), Just("d"), Just("years"), Just("")]
        )
            .prop_map(|(n, u)| format!("{n}{u}")),
        any::<i64>().prop_map(|n| n.to_string()),
        "[a-z0-9,.:/@=_ -]{0,40}",
        any::<String>(),
        "[a-z]{1,4}".prop_map(|s| s.repeat(400)),
    ]
}

fn key() -> impl Strategy<Value = String> {
    let known: Vec<String> = trust::all_keys().into_iter().map(|(k, _)| k).collect();
    prop_oneof![
        4 => proptest::sample::select(known),
        1 => "[a-z_.]{0,20}",
    ]
}

fn source() -> impl Strategy<Value = Source> {
    prop_oneof![
        Just(Source::File("/etc/slurm-node-agent/agent.toml".into())),
        Just(Source::UserData(1)),
        Just(Source::Flag),
    ]
}

/// A TOML document over known keys with probing values, in table or dotted form.
fn document() -> impl Strategy<Value = String> {
    proptest::collection::vec((key(), value(), any::<bool>(), any::<bool>()), 0..8).prop_map(
        |entries| {
            let mut s = String::new();
            for (k, v, quoted, mount) in entries {
                let v = if quoted {
                    toml::Value::String(v).to_string()
                } else {
                    v
                };
                if mount {
                    let leaf = k.rsplit('.').next().unwrap_or_default();
                    s.push_str(&format!(
                        "[[mounts]]\nmount_point = \"/fsx\"\n{leaf} = {v}\n"
                    ));
                } else {
                    s.push_str(&format!("{k} = {v}\n"));
                }
            }
            s
        },
    )
}

fn starts_with_source(e: &SettingsError, source: &Source) -> bool {
    let text = e.to_string();
    !text.is_empty() && text.starts_with(&source.to_string())
}

fn check_text(source: &Source, text: &str) -> Result<(), TestCaseError> {
    match Layer::from_toml(source.clone(), text) {
        Err(e) => prop_assert!(starts_with_source(&e, source), "{e}"),
        Ok(layer) => {
            if let Err(e) = Resolved::merge(std::slice::from_ref(&layer)) {
                // A value error names the layer's source (or, for a cross-key check, the
                // default it conflicts with).
                prop_assert!(
                    starts_with_source(&e, source) || starts_with_source(&e, &Source::Default),
                    "{e}"
                );
            }
            Resolved::merge_with(&[layer], Enforce::WarnAndIgnore).ok();
        }
    }
    Ok(())
}

fn check_tag(key: &str, value: &str) -> Result<(), TestCaseError> {
    let full = format!("{TAG_PREFIX}{key}");
    let tag = Source::Tag(full.clone());
    match Layer::from_tags([(full.as_str(), value)]) {
        Err(e) => prop_assert!(starts_with_source(&e, &tag), "{e}"),
        Ok(layers) => {
            if let Err(e) = Resolved::merge(&layers) {
                prop_assert!(
                    starts_with_source(&e, &tag) || starts_with_source(&e, &Source::Default),
                    "{e}"
                );
            }
        }
    }
    Ok(())
}

fn runner(cases: u32, seed: u64) -> TestRunner {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    TestRunner::new_with_rng(
        Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
    )
}

fn run_all(cases: u32, seed: u64) {
    runner(cases, seed)
        .run(&(source(), document()), |(s, t)| check_text(&s, &t))
        .unwrap();
    runner(cases, seed)
        .run(&(source(), any::<String>()), |(s, t)| check_text(&s, &t))
        .unwrap();
    runner(cases, seed)
        .run(&(key(), value()), |(k, v)| check_tag(&k, &v))
        .unwrap();
}

#[test]
fn settings_layers_never_panic_and_errors_name_a_source() {
    run_all(256, 1);
}

#[test]
#[ignore = "runs for SNA_FUZZ_SECS seconds (default 60): .ci/run"]
fn fuzz_settings_layers_for_a_while() {
    let secs: u64 = std::env::var("SNA_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let start = std::time::Instant::now();
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(7);
    let mut rounds = 0u64;
    while start.elapsed().as_secs() < secs {
        eprintln!("fuzz round {rounds}, seed {seed}");
        run_all(512, seed);
        seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        rounds += 1;
    }
}
