//! Man pages and shell completions (`slurm-node-agent generate --out DIR`, what the image's
//! agent step runs): a page for each program and each subcommand, the program's page names
//! every subcommand, and each shell gets a completion script per program that knows the
//! subcommands (bash's is run: it completes a subcommand's options). And `--version` of
//! both programs: the workspace's version and the commit they were built from.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use clap::CommandFactory;
use slurm_node_agent::cli::{healthcheck::HealthCheck, manual, Cli};

fn generate() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_slurm-node-agent"))
        .args(["generate", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    dir
}

/// roff text as a reader sees it: `\-` is `-`.
fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .replace("\\-", "-")
}

/// Every visible subcommand path: `["config", "show"]`, ...
fn subcommands(cmd: &clap::Command, above: &[String], out: &mut Vec<Vec<String>>) {
    for s in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let mut path = above.to_vec();
        path.push(s.get_name().to_string());
        out.push(path.clone());
        subcommands(s, &path, out);
    }
}

#[test]
fn the_man_pages_name_every_subcommand_and_option() {
    let dir = generate();
    let man1 = dir.path().join("man/man1");
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let top = read(&man1.join("slurm-node-agent.1"));
    assert!(
        top.starts_with(".ie") || top.contains(".TH slurm-node-agent 1"),
        "{top}"
    );
    let mut subs = Vec::new();
    subcommands(&cmd, &[], &mut subs);
    assert!(subs.len() >= 8, "{subs:?}");
    for path in &subs {
        let page = format!("slurm-node-agent-{}", path.join("-"));
        // The program's page lists its subcommands; the parent lists nested ones.
        let parent = if path.len() == 1 {
            top.clone()
        } else {
            read(&man1.join(format!(
                "slurm-node-agent-{}.1",
                path[..path.len() - 1].join("-")
            )))
        };
        assert!(parent.contains(&format!("{page}(1)")), "{page} not named");
        assert!(
            top.contains(&format!(".BR {page} (1)")),
            "{page} not in SEE ALSO"
        );
        // Its own page names each of its long options.
        let text = read(&man1.join(format!("{page}.1")));
        let mut sub = &cmd;
        for p in path {
            sub = sub.find_subcommand(p).unwrap();
        }
        for arg in sub.get_arguments().filter(|a| !a.is_hide_set()) {
            if let Some(long) = arg.get_long() {
                assert!(text.contains(&format!("--{long}")), "{page}: --{long}");
            }
        }
    }
    assert!(
        !top.contains("slurm-node-agent-generate"),
        "hidden command in the manual"
    );
    assert!(top.contains("EXIT STATUS"));

    let hc = read(&man1.join("slurm-node-agent-healthcheck.1"));
    for arg in HealthCheck::command().get_arguments() {
        if let Some(long) = arg.get_long() {
            assert!(hc.contains(&format!("--{long}")), "healthcheck: --{long}");
        }
    }
    assert!(hc.contains(".BR slurm-node-agent (1)"));

    // Valid roff, where groff is installed: no warnings.
    if Command::new("groff").arg("-v").output().is_ok() {
        let pages: Vec<_> = std::fs::read_dir(&man1)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        let out = Command::new("groff")
            .args(["-man", "-Tutf8", "-ww", "-z"])
            .args(&pages)
            .output()
            .unwrap();
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn completions_are_written_for_bash_zsh_and_fish() {
    let dir = generate();
    for prog in manual::programs() {
        let bin = prog.get_name().to_string();
        for shell in manual::SHELLS {
            let path = dir.path().join(manual::completion_path(shell, &bin));
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(text.contains(&bin), "{}", path.display());
            for sub in prog.get_subcommands().filter(|s| !s.is_hide_set()) {
                assert!(
                    text.contains(sub.get_name()),
                    "{}: {}",
                    path.display(),
                    sub.get_name()
                );
            }
            for arg in prog.get_arguments() {
                if let Some(long) = arg.get_long() {
                    assert!(text.contains(long), "{}: --{long}", path.display());
                }
            }
        }
    }
    assert!(dir
        .path()
        .join("zsh/site-functions/_slurm-node-agent")
        .is_file());
    assert!(dir
        .path()
        .join("fish/vendor_completions.d/slurm-node-agent-healthcheck.fish")
        .is_file());
}

/// Runs bash's completion function for the words typed so far; returns the candidates.
fn complete(script: &Path, words: &[&str]) -> Vec<String> {
    let list = words
        .iter()
        .map(|w| format!("'{w}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let cur = words.last().unwrap();
    let prev = words[words.len() - 2];
    let body = format!(
        "source '{}'; COMP_WORDS=({list}); COMP_CWORD={}; \
         _slurm__node__agent slurm-node-agent '{cur}' '{prev}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display(),
        words.len() - 1,
    );
    let out = Command::new("bash").arg("-c").arg(body).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect()
}

#[test]
fn bash_completes_subcommands_and_their_options() {
    let dir = generate();
    let script = dir
        .path()
        .join("bash-completion/completions/slurm-node-agent");
    let top = complete(&script, &["slurm-node-agent", ""]);
    for s in [
        "bootstrap",
        "check",
        "drain",
        "resume",
        "status",
        "run",
        "config",
    ] {
        assert!(top.iter().any(|c| c == s), "{s}: {top:?}");
    }
    // The hidden `generate` (the image's build step) is no completion, in any shell.
    assert!(!top.iter().any(|c| c == "generate"), "{top:?}");
    for f in [
        "zsh/site-functions/_slurm-node-agent",
        "fish/vendor_completions.d/slurm-node-agent.fish",
    ] {
        let text = std::fs::read_to_string(dir.path().join(f)).unwrap();
        assert!(!text.contains("generate"), "{f} offers the hidden generate");
    }
    // A subcommand's own options (clap_complete's hyphenated-name bug worked around).
    let drain = complete(&script, &["slurm-node-agent", "drain", "--re"]);
    assert_eq!(drain, ["--reason"]);
    let config = complete(&script, &["slurm-node-agent", "config", "s"]);
    assert_eq!(config, ["show"]);
}

/// `git ARGS` in the source tree; `None` where git or the checkout is missing.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[test]
fn version_names_the_workspace_version_and_the_commit_built_from() {
    let head = git(&["rev-parse", "--short=12", "HEAD"]);
    for (bin, name) in [
        (env!("CARGO_BIN_EXE_slurm-node-agent"), "slurm-node-agent"),
        (
            env!("CARGO_BIN_EXE_slurm-node-agent-healthcheck"),
            "slurm-node-agent-healthcheck",
        ),
    ] {
        let out = Command::new(bin).arg("--version").output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let line = String::from_utf8(out.stdout).unwrap();
        // `slurm-node-agent 0.1.0 (commit 3d43127abcde)`, one line.
        let rest = line
            .strip_prefix(&format!("{name} {} (commit ", env!("CARGO_PKG_VERSION")))
            .and_then(|r| r.strip_suffix(")\n"))
            .unwrap_or_else(|| panic!("{name} --version: {line:?}"));
        let commit = rest.strip_suffix("-dirty").unwrap_or(rest);
        match &head {
            // Built from this checkout: its HEAD (dirty or not depends on edits since).
            Some(head) => assert_eq!(commit, head, "{name} --version: {line:?}"),
            None => assert_eq!(commit, "unknown", "{name} --version: {line:?}"),
        }
        // What the image builder reads as the agent's version (d7f5404): the second word.
        assert_eq!(
            line.split_whitespace().nth(1),
            Some(env!("CARGO_PKG_VERSION"))
        );
    }
}
