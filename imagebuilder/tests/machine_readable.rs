//! The machine-readable parser against output captured from Debian's Packer 1.6.6
//! (`tests/fixtures/packer-1.6.6/`: an amazon-ebs build against moto, a null build, a
//! failed step, an interrupted build, and the manifest of the amazon-ebs build).
#![allow(clippy::unwrap_used)]

use slurm_image_builder::machine_readable::{parse_line, Event, Manifest, RunSummary, UiLevel};

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/tests/fixtures/packer-1.6.6/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

#[test]
fn amazon_ebs_artifacts_give_an_ami_per_region() {
    let s = RunSummary::from_output(&fixture("amazon-ebs-moto.machine-readable"));
    assert_eq!(s.amis.len(), 2);
    assert_eq!(s.amis["us-east-1"], "ami-415713dcf730347a2");
    assert_eq!(s.amis["us-west-2"], "ami-6b3d50bea57cc689c");
    assert_eq!(
        s.artifact_ids["amazon-ebs.node"].len(),
        1,
        "the two artifact copies carry one id"
    );
    assert!(s.errors.is_empty() && !s.cancelled);
}

#[test]
fn every_line_of_the_fixtures_parses() {
    for name in ["amazon-ebs-moto", "null", "failed", "interrupted"] {
        for line in fixture(&format!("{name}.machine-readable")).lines() {
            assert!(parse_line(line).is_some(), "{name}: {line}");
        }
    }
}

#[test]
fn null_build_has_no_ami() {
    let s = RunSummary::from_output(&fixture("null.machine-readable"));
    assert!(s.amis.is_empty());
    assert_eq!(s.artifact_ids["null.x"], vec!["Null".to_string()]);
}

#[test]
fn failed_step_is_an_error_of_its_build() {
    let out = fixture("failed.machine-readable");
    let s = RunSummary::from_output(&out);
    assert_eq!(
        s.errors,
        vec![
            "null.x: Script exited with non-zero exit status: 3.Allowed exit codes are: [0]"
                .to_string()
        ]
    );
    let cleanup = out.lines().filter_map(parse_line).find_map(|e| match e {
        Event::Ui {
            level: UiLevel::Say,
            text,
        } if text.contains("cleanup provisioner") => Some(text),
        _ => None,
    });
    assert_eq!(
        cleanup.as_deref(),
        Some("==> null.x: Provisioning step had errors: Running the cleanup provisioner, if present...")
    );
}

#[test]
fn interrupted_build_is_seen_as_cancelled() {
    let s = RunSummary::from_output(&fixture("interrupted.machine-readable"));
    assert!(s.cancelled);
    assert!(s.amis.is_empty());
}

#[test]
fn manifest_gives_the_last_runs_amis() {
    let m = Manifest::parse(&fixture("manifest-amazon-ebs-moto.json")).unwrap();
    let amis = m.last_run_amis();
    assert_eq!(amis["us-east-1"], "ami-415713dcf730347a2");
    assert_eq!(amis["us-west-2"], "ami-6b3d50bea57cc689c");
    assert_eq!(m.builds[0].builder_type, "amazon-ebs");
}
