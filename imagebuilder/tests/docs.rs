//! The pages that describe what the builder makes: `docs/support-matrix.md` lists every OS
//! of the template's `local.os_catalog` (and the local target's Debian 12) and every Slurm
//! pinned in `packer/sources.toml`, with the pins' default.
#![allow(clippy::unwrap_used)]

mod common;

use slurm_image_builder::recipe::{os_catalog, Sources};
use slurm_image_builder::template::Template;

/// The first column of the table under `heading` (backticks and anything after the first
/// space taken off).
fn first_column(page: &str, heading: &str) -> Vec<(String, String)> {
    let start = page
        .find(heading)
        .unwrap_or_else(|| panic!("docs/support-matrix.md: no {heading:?}"));
    page[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            let key = cells[0]
                .trim_start_matches('`')
                .split(['`', ' '])
                .next()
                .unwrap()
                .to_string();
            (key, cells.get(1).unwrap_or(&"").to_string())
        })
        .collect()
}

fn page() -> String {
    std::fs::read_to_string(common::repo().join("docs/support-matrix.md")).unwrap()
}

#[test]
fn the_support_matrix_lists_every_os_of_the_template() {
    let template = Template::load(&common::repo().join("packer/node.pkr.hcl")).unwrap();
    let mut want: Vec<String> = os_catalog(&template).unwrap().into_keys().collect();
    want.push("debian-12".into());
    want.sort();
    let mut listed: Vec<String> = first_column(&page(), "## Operating systems")
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    listed.sort();
    assert_eq!(
        listed, want,
        "docs/support-matrix.md's OS table and packer/node.pkr.hcl's os_catalog (plus the local target's debian-12)"
    );
    // The glibc column: what `build` checks an agent binary's floor against.
    let mut glibc: Vec<(String, String)> = os_catalog(&template)
        .unwrap()
        .into_iter()
        .map(|(os, e)| (os, e.glibc.unwrap_or_default()))
        .collect();
    glibc.push((
        "debian-12".into(),
        slurm_image_builder::recipe::LOCAL_OS_GLIBC.into(),
    ));
    glibc.sort();
    let mut listed = first_column(&page(), "## Operating systems");
    listed.sort();
    assert_eq!(
        listed, glibc,
        "docs/support-matrix.md's glibc column and os_catalog's glibc"
    );
}

#[test]
fn the_support_matrix_lists_every_pinned_slurm() {
    let sources = Sources::load(&common::repo().join("packer/sources.toml")).unwrap();
    let rows = first_column(&page(), "## Slurm releases");
    let mut listed: Vec<String> = rows
        .iter()
        .map(|(k, _)| k.clone())
        .filter(|k| k != "22.05")
        .collect();
    listed.sort();
    let pinned: Vec<String> = sources.slurm.keys().cloned().collect();
    assert_eq!(
        listed, pinned,
        "docs/support-matrix.md's Slurm table and packer/sources.toml's pins"
    );
    let defaults: Vec<&String> = rows
        .iter()
        .filter(|(_, images)| images.contains("default"))
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        defaults,
        [&sources.defaults.slurm],
        "docs/support-matrix.md names the builder's default Slurm"
    );
}
