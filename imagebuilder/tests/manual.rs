//! `slurm-image-builder generate --out DIR`: man pages (the program's own names every
//! subcommand, each subcommand's page its options, EXIT STATUS lists the exit codes) and
//! bash, zsh and fish completions; bash's completes a subcommand's options.
#![allow(clippy::unwrap_used)]

mod common;

use clap::CommandFactory;
use common::*;
use slurm_image_builder::cli::Cli;
use slurm_image_builder::manual;

fn generate() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let out = run(sib().args(["generate", "--out"]).arg(dir.path()));
    assert!(out.status.success(), "{}", text(&out));
    dir
}

fn read(path: &std::path::Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .replace("\\-", "-")
}

#[test]
fn man_pages_name_every_subcommand_option_and_exit_code() {
    let dir = generate();
    let man1 = dir.path().join("man/man1");
    let top = read(&man1.join("slurm-image-builder.1"));
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let subs: Vec<_> = cmd.get_subcommands().filter(|s| !s.is_hide_set()).collect();
    assert_eq!(subs.len(), 4);
    for sub in subs {
        let page = format!("slurm-image-builder-{}", sub.get_name());
        assert!(top.contains(&format!("{page}(1)")), "{page} not named");
        let text = read(&man1.join(format!("{page}.1")));
        for arg in sub.get_arguments().filter(|a| !a.is_hide_set()) {
            if let Some(long) = arg.get_long() {
                assert!(text.contains(&format!("--{long}")), "{page}: --{long}");
            }
        }
    }
    assert!(!top.contains("slurm-image-builder-generate"));
    let status = &top[top.find("EXIT STATUS").unwrap()..];
    for code in ["0", "1", "2", "3", "4", "5", "6", "7", "130"] {
        assert!(status.contains(&format!(".TP\n{code}\n")), "exit {code}");
    }
}

#[test]
fn completions_for_bash_zsh_and_fish() {
    let dir = generate();
    for shell in manual::SHELLS {
        let path = dir
            .path()
            .join(manual::completion_path(shell, "slurm-image-builder"));
        let text = std::fs::read_to_string(&path).unwrap();
        for word in ["plan", "validate", "build", "publish", "packer-dir"] {
            assert!(text.contains(word), "{}: {word}", path.display());
        }
    }
    let script = dir
        .path()
        .join("bash-completion/completions/slurm-image-builder");
    let out = run(std::process::Command::new("bash").arg("-c").arg(format!(
        "source '{}'; COMP_WORDS=(slurm-image-builder publish --param); COMP_CWORD=2; \
         _slurm__image__builder slurm-image-builder --param publish; \
         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display()
    )));
    assert_eq!(text(&out).trim(), "--parameter", "{}", text(&out));
}
