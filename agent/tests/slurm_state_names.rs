//! The 22.05 row of the agent's Slurm spellings table ([`SLURM_STATE_SOURCES`]) against
//! the Slurm the tests run: every name it lists is a string in that build's
//! `libslurmfull.so`, where `node_state_string()` and the state tables live.
//!
//! A C string literal is stored once, NUL-terminated; the linker may keep it as the tail
//! of a longer literal (`"MAINT"` as the end of `"NO_MAINT"`), so a name counts as present
//! when its bytes followed by NUL occur anywhere in the file.
#![allow(clippy::unwrap_used)]

use std::process::Command;

use slurm_node_agent::slurm::node::SLURM_STATE_SOURCES;

fn installed_release() -> String {
    let out = Command::new("/usr/sbin/slurmd")
        .arg("-V")
        .output()
        .expect("running slurmd -V (apt-get install slurmd; scripts/test-deps.sh)");
    let text = String::from_utf8_lossy(&out.stdout);
    // "slurm-wlm 22.05.8" or "slurm 23.11.4"
    let version = text.split_whitespace().nth(1).unwrap_or_default();
    let mut parts = version.split('.');
    format!(
        "{}.{}",
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default()
    )
}

fn libslurmfull() -> std::path::PathBuf {
    let out = Command::new("ldd")
        .arg("/usr/sbin/slurmd")
        .output()
        .expect("running ldd /usr/sbin/slurmd");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| {
            let (name, rest) = l.trim().split_once(" => ")?;
            name.starts_with("libslurmfull")
                .then(|| rest.split_whitespace().next().map(std::path::PathBuf::from))
                .flatten()
        })
        .unwrap_or_else(|| panic!("no libslurmfull in ldd /usr/sbin/slurmd:\n{text}"))
}

#[test]
fn the_installed_slurm_prints_every_name_its_row_lists() {
    let release = installed_release();
    let (_, source, names) = SLURM_STATE_SOURCES
        .iter()
        .find(|(r, _, _)| *r == release)
        .unwrap_or_else(|| {
            panic!("no row for the installed Slurm {release} in SLURM_STATE_SOURCES")
        });
    let lib = libslurmfull();
    let bytes = std::fs::read(&lib).unwrap();
    let mut missing = Vec::new();
    for name in *names {
        let mut needle = name.as_bytes().to_vec();
        needle.push(0);
        if !bytes.windows(needle.len()).any(|w| w == needle.as_slice()) {
            missing.push(*name);
        }
    }
    assert!(
        missing.is_empty(),
        "{} (Slurm {release}) lacks {missing:?}; the row says: {source}",
        lib.display()
    );
    // The check can fail: a name Slurm 22.05 does not have is not found.
    let mut absent = b"NOT_A_SLURM_NODE_STATE".to_vec();
    absent.push(0);
    assert!(!bytes.windows(absent.len()).any(|w| w == absent.as_slice()));
}
