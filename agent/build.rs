//! Release builds place the functions that `slurm-node-agent-healthcheck` (Slurm's
//! `HealthCheckProgram`) and `slurm-node-agent check` run next to each other
//! in the binary (`link-order.txt`, a symbol ordering file for LLD): the kernel maps the
//! binary's code 64 KiB at a time around each page fault, so `check`'s roughly 1 MB of code
//! spread over 16 MB of text made it map about 6 MiB of it on every run (Slurm runs `check`
//! every `HealthCheckInterval`). Layout only: no code, relocation or ASLR change; a name
//! that is not in the binary (code changed since the file was made) is skipped, so a stale
//! file only places fewer functions. Regenerate it with `scripts/link-order.sh`.
//!
//! Only where the linker is LLD: Rust's default for x86_64-unknown-linux-gnu since 1.90
//! (its bundled rust-lld), unless a linker or linker features are chosen in RUSTFLAGS or
//! `CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER`. `SLURM_NODE_AGENT_LINK_ORDER=0` turns it
//! off.
//!
//! It also writes `$OUT_DIR/settings_docs.rs`, the doc comments of the settings' types
//! for the settings reference (see `build/settings_docs.rs`), and sets
//! `SLURM_NODE_AGENT_COMMIT` for `--version` (see [`commit`]).

use std::process::Command;

#[path = "build/settings_docs.rs"]
mod settings_docs;

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    let out = std::env::var("OUT_DIR").unwrap_or_else(|_| ".".into());
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=build/settings_docs.rs");
    settings_docs::generate(
        &std::path::Path::new(&manifest).join("src"),
        &std::path::Path::new(&out).join("settings_docs.rs"),
    );
    link_order();
    commit();
}

/// `SLURM_NODE_AGENT_COMMIT`, the commit `--version` names: `git rev-parse --short=12 HEAD`
/// of the source tree, with `-dirty` when a tracked file differs from it
/// (`git status --porcelain --untracked-files=no`); `unknown` when the sources are not a
/// git checkout or git is missing (a crate tarball). A packager building from a tarball
/// sets `SLURM_NODE_AGENT_COMMIT` itself, which wins.
///
/// Reruns when HEAD moves: `.git/HEAD` (another branch checked out) and the file of the
/// branch it points to (a commit; `packed-refs` when the branch has no file of its own),
/// found with `git rev-parse --git-path` so that a worktree works too. A change to a source
/// file of this crate reruns the script anyway (`src`); an edit elsewhere in the tree since
/// the last run shows as `-dirty` only from the next run on.
fn commit() {
    println!("cargo:rerun-if-env-changed=SLURM_NODE_AGENT_COMMIT");
    if let Ok(given) = std::env::var("SLURM_NODE_AGENT_COMMIT") {
        println!("cargo:rustc-env=SLURM_NODE_AGENT_COMMIT={given}");
        return;
    }
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .args(args)
            .current_dir(std::env::var("CARGO_MANIFEST_DIR").ok()?)
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let watch = |path: Option<String>| {
        if let Some(p) = path.filter(|p| std::path::Path::new(p).exists()) {
            println!("cargo:rerun-if-changed={p}");
        }
    };
    let Some(hash) = git(&["rev-parse", "--short=12", "HEAD"]).filter(|h| !h.is_empty()) else {
        println!("cargo:rustc-env=SLURM_NODE_AGENT_COMMIT=unknown");
        return;
    };
    watch(git(&[
        "rev-parse",
        "--path-format=absolute",
        "--git-path",
        "HEAD",
    ]));
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        let file = git(&["rev-parse", "--path-format=absolute", "--git-path", &branch]);
        if file
            .as_deref()
            .is_some_and(|f| std::path::Path::new(f).exists())
        {
            watch(file);
        } else {
            watch(git(&[
                "rev-parse",
                "--path-format=absolute",
                "--git-path",
                "packed-refs",
            ]));
        }
    }
    let dirty = git(&[
        "--no-optional-locks",
        "status",
        "--porcelain",
        "--untracked-files=no",
    ])
    .is_some_and(|s| !s.is_empty());
    let suffix = if dirty { "-dirty" } else { "" };
    println!("cargo:rustc-env=SLURM_NODE_AGENT_COMMIT={hash}{suffix}");
}

/// The symbol ordering file for LLD, where the linker is LLD (see the crate docs).
fn link_order() {
    println!("cargo:rerun-if-changed=link-order.txt");
    println!("cargo:rerun-if-env-changed=SLURM_NODE_AGENT_LINK_ORDER");
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER");
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    if env("SLURM_NODE_AGENT_LINK_ORDER") == "0"
        || env("PROFILE") != "release"
        || env("TARGET") != "x86_64-unknown-linux-gnu"
        || !env("CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER").is_empty()
    {
        return;
    }
    let flags = env("CARGO_ENCODED_RUSTFLAGS");
    if ["linker", "fuse-ld", "link-self-contained"]
        .iter()
        .any(|f| flags.contains(f))
    {
        return;
    }
    // "rustc 1.95.0 (59807616e 2026-04-14)": LLD is the default linker from 1.90 on.
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let minor = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|v| {
            let ver = v.split_whitespace().nth(1)?.to_string();
            let mut it = ver.split('.');
            (it.next()? == "1").then_some(())?;
            it.next()?.parse::<u32>().ok()
        });
    if minor.is_none_or(|m| m < 90) {
        return;
    }
    let Ok(dir) = std::env::var("CARGO_MANIFEST_DIR") else {
        return;
    };
    let file = std::path::Path::new(&dir).join("link-order.txt");
    for bin in ["slurm-node-agent", "slurm-node-agent-healthcheck"] {
        println!(
            "cargo:rustc-link-arg-bin={bin}=-Wl,--symbol-ordering-file={}",
            file.display()
        );
        println!("cargo:rustc-link-arg-bin={bin}=-Wl,--no-warn-symbol-ordering");
    }
}
