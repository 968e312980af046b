//! Man pages and shell completions of `slurm-node-agent` and
//! `slurm-node-agent-healthcheck`, from their clap definitions (clap_mangen,
//! clap_complete): `slurm-node-agent generate --out DIR` writes them below `DIR` as a
//! `share` folder holds them, e.g. `/usr/local/share` (what the image's agent step does):
//!
//! ```text
//! man/man1/slurm-node-agent.1, slurm-node-agent-<subcommand>.1, ..., slurm-node-agent-healthcheck.1
//! bash-completion/completions/slurm-node-agent, slurm-node-agent-healthcheck
//! zsh/site-functions/_slurm-node-agent, _slurm-node-agent-healthcheck
//! fish/vendor_completions.d/slurm-node-agent.fish, slurm-node-agent-healthcheck.fish
//! ```

use std::io::Write as _;
use std::path::{Path, PathBuf};

use clap::{Args, CommandFactory};
use clap_complete::Shell;

use super::print_error_message;
use crate::exit::Exit;

/// Arguments of the hidden `generate` command.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Folder to write into, laid out as a `share` folder (`man/man1`,
    /// `bash-completion/completions`, `zsh/site-functions`, `fish/vendor_completions.d`).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

impl GenerateArgs {
    /// Writes the files and lists them on stdout; an I/O error when one cannot be written.
    pub async fn run(self) -> Exit {
        match write_all(&self.out) {
            Ok(files) => {
                for f in files {
                    println!("{}", f.display());
                }
                Exit::Ok
            }
            Err((path, e)) => {
                print_error_message(&format!("writing {}: {e}", path.display()));
                Exit::IoErr
            }
        }
    }
}

/// The shells completions are written for.
pub const SHELLS: [Shell; 3] = [Shell::Bash, Shell::Zsh, Shell::Fish];

/// Both programs' command lines: `slurm-node-agent`, `slurm-node-agent-healthcheck`.
pub fn programs() -> [clap::Command; 2] {
    [
        super::Cli::command(),
        super::healthcheck::HealthCheck::command(),
    ]
}

/// Where a shell's completion file for `bin` goes below a `share` folder.
pub fn completion_path(shell: Shell, bin: &str) -> PathBuf {
    match shell {
        Shell::Bash => PathBuf::from(format!("bash-completion/completions/{bin}")),
        Shell::Zsh => PathBuf::from(format!("zsh/site-functions/_{bin}")),
        Shell::Fish => PathBuf::from(format!("fish/vendor_completions.d/{bin}.fish")),
        _ => PathBuf::from(format!("completions/{bin}.{shell}")),
    }
}

/// A program's man pages: its own and one per (visible) subcommand, as
/// `(file name, roff text)`. The program's own page ends with EXIT STATUS and SEE ALSO.
pub fn man_pages(cmd: clap::Command) -> Vec<(String, Vec<u8>)> {
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let top = cmd.get_name().to_string();
    let mut out = Vec::new();
    let mut subpages = Vec::new();
    pages(&cmd, &top, &mut out, &mut subpages);
    if let Some((_, text)) = out.iter_mut().find(|(n, _)| *n == format!("{top}.1")) {
        text.extend_from_slice(tail(&top, &subpages).as_bytes());
    }
    out
}

fn pages(
    cmd: &clap::Command,
    top: &str,
    out: &mut Vec<(String, Vec<u8>)>,
    subpages: &mut Vec<String>,
) {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        pages(sub, top, out, subpages);
    }
    let source = format!("{top} {}", cmd.get_version().unwrap_or_default());
    let man = clap_mangen::Man::new(cmd.clone()).source(source);
    let name = man.get_filename();
    let mut text = Vec::new();
    // Rendering into memory does not fail.
    let _ = man.render(&mut text);
    if name != format!("{top}.1") {
        subpages.push(name.trim_end_matches(".1").to_string());
    }
    out.push((name, text));
}

/// EXIT STATUS and SEE ALSO of a program's own page (roff).
fn tail(top: &str, subpages: &[String]) -> String {
    let mut s = String::from(".SH \"EXIT STATUS\"\n");
    let codes: Vec<(Exit, &str)> = if top.ends_with("-healthcheck") {
        vec![
            (Exit::Ok, "the node is healthy"),
            (
                Exit::Unhealthy,
                "a fatal check failed or hung, or a check file could not be used",
            ),
            (Exit::Usage, "command-line usage error"),
            (Exit::OsErr, "no runtime"),
            (Exit::IoErr, "the report could not be written"),
            (Exit::Config, "invalid settings"),
        ]
    } else {
        Exit::ALL.iter().map(|e| (*e, e.summary())).collect()
    };
    for (code, what) in codes {
        s.push_str(&format!(".TP\n{code}\n{}\n", roff_text(what)));
    }
    s.push_str(
        ".PP\nEach command's causes and what to do: docs/exit\\-codes.md in the source tree.\n",
    );
    let mut refs: Vec<String> = subpages.iter().map(|p| format!("{p}(1)")).collect();
    refs.sort();
    if top.ends_with("-healthcheck") {
        refs.push("slurm-node-agent(1)".into());
    } else {
        refs.push("slurm-node-agent-healthcheck(1)".into());
    }
    refs.extend(
        [
            "slurmd(8)",
            "slurm.conf(5)",
            "scontrol(1)",
            "systemd.service(5)",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    s.push_str(&see_also(&refs));
    s
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

/// Text for a roff line: backslashes and hyphens escaped, no line starting with a control
/// character.
fn roff_text(s: &str) -> String {
    let t = s.replace('\\', "\\e").replace('-', "\\-");
    if t.starts_with('.') || t.starts_with('\'') {
        format!("\\&{t}")
    } else {
        t
    }
}

/// A program's completion script for `shell`, without its hidden subcommands (`generate`).
pub fn completion(cmd: clap::Command, shell: Shell) -> Vec<u8> {
    let mut cmd = without_hidden(&cmd);
    let name = cmd.get_name().to_string();
    let mut text = Vec::new();
    clap_complete::generate(shell, &mut cmd, name.clone(), &mut text);
    if shell == Shell::Bash {
        text = fix_bash(text, &name);
    }
    text
}

/// `cmd` (not yet built) without its hidden subcommands, at every level: clap_complete 4.6
/// offers hidden subcommands as completions, and clap has no way to remove a subcommand,
/// so the command is put together again from its name, texts, arguments and visible
/// subcommands (what completion scripts use).
fn without_hidden(cmd: &clap::Command) -> clap::Command {
    let mut c = clap::Command::new(cmd.get_name().to_string())
        .args(cmd.get_arguments().cloned())
        .visible_aliases(cmd.get_visible_aliases().map(str::to_string))
        .subcommands(
            cmd.get_subcommands()
                .filter(|s| !s.is_hide_set())
                .map(without_hidden),
        );
    if let Some(a) = cmd.get_about() {
        c = c.about(a.clone());
    }
    if let Some(a) = cmd.get_long_about() {
        c = c.long_about(a.clone());
    }
    if let Some(v) = cmd.get_version() {
        c = c.version(v.to_string());
    }
    c
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

/// Writes every man page and completion of both programs below `out`; returns the files.
///
/// # Errors
/// The file that could not be written, and why.
pub fn write_all(out: &Path) -> Result<Vec<PathBuf>, (PathBuf, std::io::Error)> {
    let mut files = Vec::new();
    for cmd in programs() {
        let bin = cmd.get_name().to_string();
        for (name, text) in man_pages(cmd.clone()) {
            files.push(write(&out.join("man/man1").join(name), &text)?);
        }
        for shell in SHELLS {
            let text = completion(cmd.clone(), shell);
            files.push(write(&out.join(completion_path(shell, &bin)), &text)?);
        }
    }
    Ok(files)
}

fn write(path: &Path, text: &[u8]) -> Result<PathBuf, (PathBuf, std::io::Error)> {
    let fail = |e| (path.to_path_buf(), e);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    let mut f = std::fs::File::create(path).map_err(fail)?;
    f.write_all(text).map_err(fail)?;
    Ok(path.to_path_buf())
}
