//! The agent the workspace builds starts on every OS the image builder supports for this
//! architecture (issue 42 §3): the newest glibc symbol version its two binaries import is at
//! most the oldest glibc of `local.os_catalog` (Amazon Linux 2023 and Rocky 9: 2.34). A
//! change that pulls in a newer glibc symbol (a libc crate upgrade, a new C dependency)
//! fails here, named, rather than at a node's first boot. Reads the debug build that
//! `scripts/test.sh` makes first; the release build imports the same versioned symbols or
//! fewer (its dead code removed).
#![allow(clippy::unwrap_used)]

mod common;

use slurm_image_builder::binary::{needs, GlibcVersion};
use slurm_image_builder::recipe::os_catalog;
use slurm_image_builder::template::Template;

#[test]
fn the_built_agent_needs_no_newer_glibc_than_the_oldest_supported_os() {
    let template = Template::load(&common::repo().join("packer/node.pkr.hcl")).unwrap();
    let (oldest_os, oldest) = os_catalog(&template)
        .unwrap()
        .into_iter()
        .map(|(os, e)| {
            let g = e
                .glibc
                .unwrap_or_else(|| panic!("os_catalog[{os}]: no glibc"));
            (os, GlibcVersion::parse(&g).unwrap())
        })
        .min_by_key(|(_, g)| *g)
        .unwrap();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| common::repo().join("target"));
    let mut checked = 0;
    for bin in ["slurm-node-agent", "slurm-node-agent-healthcheck"] {
        let path = target.join("debug").join(bin);
        if !path.is_file() {
            eprintln!(
                "skipped {}: not built (cargo build -p slurm-node-agent)",
                path.display()
            );
            continue;
        }
        let n = needs(&path).unwrap();
        let floor = n.glibc.expect("a glibc program");
        assert!(
            floor <= oldest,
            "{} needs glibc {floor} (GLIBC_{floor}), but {oldest_os} has {oldest}: it would not start there",
            path.display()
        );
        checked += 1;
    }
    if checked == 0 {
        eprintln!("skipped: no agent binary built");
    }
}
