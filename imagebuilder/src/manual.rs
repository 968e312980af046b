//! Man pages and shell completions of `slurm-image-builder`, from its clap definition
//! (clap_mangen, clap_complete): `slurm-image-builder generate --out DIR` writes them below
//! `DIR` as a `share` folder holds them (e.g. `/usr/local/share` or `~/.local/share`):
//! `man/man1/slurm-image-builder.1` and one page per subcommand,
//! `bash-completion/completions/slurm-image-builder`, `zsh/site-functions/_slurm-image-builder`,
//! `fish/vendor_completions.d/slurm-image-builder.fish`.

use std::path::{Path, PathBuf};

use clap::CommandFactory;
use clap_complete::Shell;
use serde_json::json;

use crate::cli::{Cli, Report, EXIT_CODES};
use crate::error::{Error, Result};

/// The shells completions are written for.
pub const SHELLS: [Shell; 3] = [Shell::Bash, Shell::Zsh, Shell::Fish];

/// Where a shell's completion file for `bin` goes below a `share` folder.
pub fn completion_path(shell: Shell, bin: &str) -> PathBuf {
    match shell {
        Shell::Bash => PathBuf::from(format!("bash-completion/completions/{bin}")),
        Shell::Zsh => PathBuf::from(format!("zsh/site-functions/_{bin}")),
        Shell::Fish => PathBuf::from(format!("fish/vendor_completions.d/{bin}.fish")),
        _ => PathBuf::from(format!("completions/{bin}.{shell}")),
    }
}

/// The man pages: the program's own (ending with EXIT STATUS and SEE ALSO) and one per
/// visible subcommand, as `(file name, roff text)`.
pub fn man_pages() -> Vec<(String, Vec<u8>)> {
    // The exit codes get a section of their own instead of clap's "EXTRA" text.
    let mut cmd = Cli::command()
        .after_help(None::<&str>)
        .disable_help_subcommand(true);
    cmd.build();
    let top = cmd.get_name().to_string();
    let source = format!("{top} {}", cmd.get_version().unwrap_or_default());
    let mut out = Vec::new();
    let mut subpages = Vec::new();
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let man = clap_mangen::Man::new(sub.clone()).source(source.clone());
        let mut text = Vec::new();
        let _ = man.render(&mut text);
        let name = man.get_filename();
        subpages.push(format!("{}(1)", name.trim_end_matches(".1")));
        out.push((name, text));
    }
    let man = clap_mangen::Man::new(cmd.clone()).source(source);
    let mut text = Vec::new();
    let _ = man.render(&mut text);
    let mut tail = String::from(".SH \"EXIT STATUS\"\n");
    for line in EXIT_CODES.lines().skip(1) {
        let line = line.trim();
        if let Some((code, what)) = line.split_once(char::is_whitespace) {
            tail.push_str(&format!(".TP\n{code}\n{}\n", roff_text(what.trim())));
        }
    }
    subpages.sort();
    subpages.extend(["packer(1)".to_string(), "slurm-node-agent(1)".to_string()]);
    tail.push_str(&see_also(&subpages));
    text.extend_from_slice(tail.as_bytes());
    out.push((man.get_filename(), text));
    out
}

/// The completion script for `shell`.
pub fn completion(shell: Shell) -> Vec<u8> {
    let mut cmd = Cli::command();
    let mut text = Vec::new();
    clap_complete::generate(shell, &mut cmd, "slurm-image-builder", &mut text);
    if shell == Shell::Bash {
        text = fix_bash(text, "slurm-image-builder");
    }
    text
}

/// clap_complete 4.6's bash script never completes a subcommand's options when the
/// program's name has a hyphen: its `case` arms spell the state `a__subcmd__b__subcmd__sub`
/// where the loop that sets it writes `a__b__subcmd__sub` (clap-rs/clap#6421, #6529). The
/// arms are respelled as the loop writes them; a fixed clap_complete leaves nothing to
/// change.
fn fix_bash(script: Vec<u8>, bin: &str) -> Vec<u8> {
    let Ok(text) = String::from_utf8(script) else {
        return Vec::new();
    };
    let broken = format!("{}__subcmd__", bin.replace('-', "__subcmd__"));
    let right = format!("{}__subcmd__", bin.replace('-', "__"));
    text.replace(&broken, &right).into_bytes()
}

/// SEE ALSO (roff): `name(section)` references, one `.BR` each, not hyphenated.
fn see_also(refs: &[String]) -> String {
    let mut s = String::from(".SH \"SEE ALSO\"\n.nh\n.ad l\n");
    for (i, r) in refs.iter().enumerate() {
        let (name, section) = r.split_once('(').unwrap_or((r, ")"));
        let comma = if i + 1 < refs.len() { "," } else { "" };
        s.push_str(&format!(".BR {} ({}{comma}\n", roff_text(name), section));
    }
    s.push_str(".ad\n.hy\n");
    s
}

/// Text for a roff line: backslashes and hyphens escaped, no control character first.
fn roff_text(s: &str) -> String {
    let t = s.replace('\\', "\\e").replace('-', "\\-");
    if t.starts_with('.') || t.starts_with('\'') {
        format!("\\&{t}")
    } else {
        t
    }
}

/// `generate --out DIR`: writes the man pages and completions below `out`.
///
/// # Errors
/// [`Error::Io`] naming the file that could not be written.
pub fn generate(out: &Path) -> Result<Report> {
    let mut files = Vec::new();
    let mut write = |path: PathBuf, text: &[u8]| -> Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        }
        std::fs::write(&path, text)
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
        files.push(path);
        Ok(())
    };
    for (name, text) in man_pages() {
        write(out.join("man/man1").join(name), &text)?;
    }
    for shell in SHELLS {
        write(
            out.join(completion_path(shell, "slurm-image-builder")),
            &completion(shell),
        )?;
    }
    let text: String = files.iter().map(|f| format!("{}\n", f.display())).collect();
    Ok(Report {
        json: json!({ "files": files }),
        text,
    })
}
