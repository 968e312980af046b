//! LBNL NHC's `nhc.conf`, read as it is (NHC 1.4 syntax, `scripts/common.nhc` and the
//! `scripts/lbnl_*.nhc` checks).
//!
//! A line is `target || check args...`:
//! - lines are read the way bash's `read` does: a backslash at the end of a line joins
//!   the next one, and a backslash elsewhere escapes the next character (so a regex needs
//!   `\\b` to mean `\b`, as with NHC itself);
//! - `#` starts a comment line; blank lines are skipped;
//! - the target is an NHC match expression ([`Matcher`]: glob, `/regex/`, `{n[1-4]}`,
//!   with `!`), matched against the Slurm NodeName;
//! - the check is split into words like the shell does it (quotes, backslashes, `$VAR`
//!   and `${VAR}` from `HOSTNAME`, `HOSTNAME_S` and variables the file assigns); command
//!   substitution, pipes, redirections and `;` are refused;
//! - `VAR=value` / `export VAR=value` lines set variables; `TIMEOUT` becomes the default
//!   per-check timeout, the settings in `READ_SETTINGS` (`MCELOG`, `NHC_AUTH_USERS`,
//!   `MOUNT_CMD`...) are read by the checks after them, other NHC settings are reported as
//!   ignored.
//!
//! Every line is parsed whatever its target, so a bad line is reported on every node.
//! Supported checks: the translation table `TABLE` (see [`supported`]), one file per NHC family. Anything else is an error naming file and line.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::arith::ArithError;
use super::checks::cmd::CommandSpec;
use super::checks::dmi::DmiSpec;
use super::checks::file::{FileContentsSpec, FileStatSpec, FileTestSpec, TEST_OPS};
use super::checks::fs::{MountActions, MountSpec, SpaceSpec, SpaceWhat};
use super::checks::hw::{CpuSpec, HardwareSpec, IbSpec, McelogSpec, MemSpec, MemWhat};
use super::checks::net::ping::PingSpec;
use super::checks::net::SocketSpec;
use super::checks::ps::{LoadAvgSpec, MatchOn, ProcessSpec, ServiceAction, Verify};
use super::checks::psres::UnknownAction;
use super::checks::psres::{
    parse_user_actions, KswapdSpec, Resource, ResourceSpec, SysUids, UsersRule, UsersSpec,
};
use super::checks::CheckKind;
use super::matcher::Matcher;
use super::matcher::MatcherError;
use super::units::{
    parse_count_threshold, parse_size_kib, parse_space_threshold, Threshold, UnitsError,
};
use super::{Check, CheckSet, ConfigError, Origin};

mod cmd;
mod dmi;
mod file;
mod fs;
mod hw;
mod net;
mod nv;
mod ps;

/// How one NHC check function becomes engine checks: (function name, its arguments, the
/// default timeout) to the checks, or what is wrong.
type Translate = fn(&str, &[String], &Cx) -> Result<Built, NhcError>;

/// A check's words that the shell-like reader refuses ([`shell_words`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShellError {
    /// `$NAME` / `${NAME}` that neither the reader nor the file set.
    #[error(
        "unknown variable ${name} (known: HOSTNAME, HOSTNAME_S, PATH and those this file sets)"
    )]
    UnknownVariable {
        /// The variable's name.
        name: String,
    },
    /// `$((` without its `))`.
    #[error("unclosed $((")]
    UnclosedArithmetic,
    /// `$(( ... ))` that bash arithmetic cannot evaluate.
    #[error(transparent)]
    Arithmetic(#[from] ArithError),
    /// `$(...)`.
    #[error("command substitution $(...) is not supported")]
    DollarSubstitution,
    /// `` `...` ``.
    #[error("command substitution `...` is not supported")]
    BacktickSubstitution,
    /// `${` without its `}`.
    #[error("unclosed ${{")]
    UnclosedBrace,
    /// `${...}` whose name is not a variable name.
    #[error("unsupported parameter expansion ${{{expansion}}}")]
    BadExpansionName {
        /// What is between the braces.
        expansion: String,
    },
    /// `${NAME...}` with an operator other than `:-` and `-`.
    #[error("unsupported parameter expansion ${{{expansion}}} (supported: ${{VAR}}, ${{VAR:-default}}, ${{VAR-default}})")]
    UnsupportedExpansion {
        /// What is between the braces.
        expansion: String,
    },
    /// `'` without its closing quote.
    #[error("unclosed single quote")]
    UnclosedSingleQuote,
    /// `"` without its closing quote.
    #[error("unclosed double quote")]
    UnclosedDoubleQuote,
    /// `;`, `|`, `&`, `<` or `>`.
    #[error("shell operator {operator:?} is not supported: one check per line, no pipes or redirections")]
    Operator {
        /// The operator's character.
        operator: char,
    },
}

/// A line of nhc.conf this reader cannot run: what is wrong with its words, an option, an
/// argument or a setting. Each variant holds the option, value or setting concerned; the
/// caller adds the file, line and check function.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NhcError {
    /// The words of the line.
    #[error(transparent)]
    Shell(#[from] ShellError),
    /// A match expression (target, `-m`, `-u`...).
    #[error(transparent)]
    Matcher(#[from] MatcherError),
    /// A size, count or percentage.
    #[error(transparent)]
    Units(#[from] UnitsError),
    /// An action word of `check_ps_unauth_users` / `check_ps_kswapd`...
    #[error(transparent)]
    Action(#[from] UnknownAction),
    /// Nothing after `||`.
    #[error("empty check")]
    EmptyCheck,
    /// An `export` / assignment line word that is not `VAR=value`.
    #[error("expected VAR=value, got {word:?}")]
    NotAnAssignment {
        /// The word.
        word: String,
    },
    /// A check function this reader does not know.
    #[error("unsupported NHC check (supported: {})", supported().collect::<Vec<_>>().join(", "))]
    UnsupportedCheck {
        /// The function's name.
        function: String,
    },
    /// An option the function does not take.
    #[error("invalid option -{option}")]
    InvalidOption {
        /// The option's letter.
        option: char,
    },
    /// An option that takes a value, last on the line.
    #[error("option -{option} requires an argument")]
    OptionNeedsValue {
        /// The option's letter.
        option: char,
    },
    /// An NHC option the agent does not support, and why.
    #[error("option -{option} is not supported ({why})")]
    UnsupportedOption {
        /// The option's letter.
        option: char,
        /// Why it is not supported.
        why: &'static str,
    },
    /// A required argument is missing.
    #[error("missing {argument}")]
    MissingArgument {
        /// Which argument (`file system`, `threshold`...).
        argument: &'static str,
    },
    /// More arguments than the function takes.
    #[error("unexpected argument {argument:?}")]
    UnexpectedArgument {
        /// The first argument too many.
        argument: String,
    },
    /// A setting naming a program is empty (`MOUNT_CMD`, `MCELOG`).
    #[error("{setting} is empty")]
    EmptySetting {
        /// The setting's name.
        setting: &'static str,
    },
    /// A setting that is not a bash integer (`MCELOG_MAX_CORRECTED_RATE`...).
    #[error("{setting}={value:?}: {source}")]
    SettingNotInteger {
        /// The setting's name.
        setting: &'static str,
        /// Its value.
        value: String,
        /// Why it is not an integer.
        #[source]
        source: ArithError,
    },
    /// `MAX_SYS_UID` is not a uid.
    #[error("MAX_SYS_UID={value:?} is not a uid")]
    NotAUid {
        /// Its value.
        value: String,
    },
    /// `TIMEOUT` is not a number of seconds.
    #[error("TIMEOUT={value:?}: expected seconds")]
    TimeoutNotSeconds {
        /// Its value.
        value: String,
    },
    /// An action option (`-e`, `-E`) whose words cannot be read.
    #[error("-{option} {value:?}: {source}")]
    ActionWords {
        /// The option's letter.
        option: char,
        /// Its value.
        value: String,
        /// Why its words cannot be read.
        #[source]
        source: ShellError,
    },
    /// An action option (`-e`, `-E`) with no words.
    #[error("-{option}: empty action")]
    EmptyAction {
        /// The option's letter.
        option: char,
    },
    /// An option's value that is not a bash integer (`check_file_stat -m 0755`...).
    #[error("-{option} {value:?}: {source}")]
    OptionNotInteger {
        /// The option's letter.
        option: char,
        /// Its value.
        value: String,
        /// Why it is not an integer.
        #[source]
        source: ArithError,
    },
    /// An option's value outside the range of what it sets.
    #[error("-{option} {value:?}: {number} is out of range")]
    OptionOutOfRange {
        /// The option's letter.
        option: char,
        /// Its value.
        value: String,
        /// The value as evaluated.
        number: i64,
    },
    /// A uid / gid not written as NHC compares it (the decimal id as text).
    #[error(
        "-{option} {value:?}: NHC compares it as text with the decimal id, so it never matches"
    )]
    NotDecimalId {
        /// The option's letter.
        option: char,
        /// Its value.
        value: String,
    },
    /// `check_dmi_data_match -h` with a word that is not a handle number.
    #[error("-h {value:?}: not a DMI handle: {source}")]
    NotADmiHandle {
        /// The word.
        value: String,
        /// Why it is not a number.
        #[source]
        source: ArithError,
    },
    /// An option's value that is not a number of seconds.
    #[error("-{option} {value:?}: not a number of seconds")]
    NotSeconds {
        /// The option's letter.
        option: char,
        /// Its value.
        value: String,
    },
    /// An option's value that is not a whole number.
    #[error("-{option} {value:?}: not a whole number")]
    OptionNotWholeNumber {
        /// The option's letter.
        option: char,
        /// Its value.
        value: String,
    },
    /// `check_net_ping -I` with neither an address nor an interface name.
    #[error("-I {value:?}: not an address or interface name")]
    NotAddressOrInterface {
        /// Its value.
        value: String,
    },
    /// `check_net_ping -s` over 65000 bytes.
    #[error("-s {size}: packet too large")]
    PacketTooLarge {
        /// The size asked, bytes.
        size: usize,
    },
    /// `check_ps_cpu -r` / `check_ps_mem -r`... that is not a nice value.
    #[error("-r {value:?}: not a nice value")]
    NotANiceValue {
        /// Its value.
        value: String,
    },
    /// An argument that is not a count (`check_hw_cpuinfo`).
    #[error("{value:?} is not a count")]
    NotACount {
        /// The argument.
        value: String,
    },
    /// An argument that is not a number (`check_cmd_* -t`, `-r`).
    #[error("{value:?} is not a number")]
    NotANumber {
        /// The argument.
        value: String,
    },
    /// An argument that is not a whole number (`check_ps_loadavg`).
    #[error("{value:?} is not a whole number")]
    NotAWholeNumber {
        /// The argument.
        value: String,
    },
    /// An argument that is not a bash integer (`check_ps_kswapd`).
    #[error("{argument} {value:?}: {source}")]
    ArgumentNotInteger {
        /// Which argument (`CPU time threshold`, `discrepancy`).
        argument: &'static str,
        /// Its value.
        value: String,
        /// Why it is not an integer.
        #[source]
        source: ArithError,
    },
    /// `check_fs_mount` without a file system.
    #[error("missing file system (-f /path)")]
    NoFileSystem,
    /// `check_cmd_*` without a command.
    #[error("no command specified")]
    NoCommand,
    /// `check_cmd_* -t 0`.
    #[error("-t must be at least 1 second")]
    TimeoutZero,
    /// `check_file_test` without an operator.
    #[error("at least one test operator is required")]
    NoTestOperator,
    /// `check_file_test` / `check_file_stat` without a file.
    #[error("at least one file is required")]
    NoFile,
    /// `check_file_contents` without a match expression.
    #[error("at least one match expression is required")]
    NoMatchExpressions,
    /// `check_dmi_data_match` without a match expression.
    #[error("missing match expression")]
    NoMatchExpression,
    /// `check_net_socket` with arguments besides its options.
    #[error("unsupported additional arguments supplied ({arguments:?})")]
    ExtraArguments {
        /// The arguments, joined by spaces.
        arguments: String,
    },
    /// `check_net_socket` without a match option.
    #[error("no match criteria supplied")]
    NoMatchCriteria,
    /// `check_net_ping` without a target.
    #[error("no target(s) given for ping")]
    NoPingTarget,
    /// `check_ps_loadavg` without a limit.
    #[error("missing load limit")]
    NoLoadLimit,
    /// `check_ps_service` without a service.
    #[error("missing service name")]
    NoServiceName,
    /// `check_ps_cpu` whose limit is not a percentage.
    #[error("{value:?}: CPU utilization limit (percent) required")]
    CpuLimitRequired {
        /// The limit as written.
        value: String,
    },
    /// `check_ps_cpu` whose limit does not fit.
    #[error("{value:?}: too large")]
    TooLarge {
        /// The limit as written.
        value: String,
    },
    /// `check_ps_mem` with a percentage.
    #[error("percentage not supported by this check")]
    PercentNotSupported {
        /// The limit as written.
        value: String,
    },
    /// `check_ps_physmem` with a percentage that is not a number.
    #[error("{value:?}: invalid percentage")]
    InvalidPercentage {
        /// The limit as written.
        value: String,
    },
    /// `check_ps_time` with characters other than digits and `m`, `s`.
    #[error("invalid characters in CPU time limit {value:?}")]
    CpuTimeCharacters {
        /// The limit as written.
        value: String,
    },
    /// `check_ps_time` minutes or seconds that are not a number.
    #[error("{value:?}: invalid CPU time")]
    InvalidCpuTime {
        /// The part that is not a number.
        value: String,
    },
    /// `check_ps_userproc_lineage` with an `NHC_RM` other than slurm, pbs, sge, lsf.
    #[error("this check requires a supported resource manager (NHC_RM=slurm)")]
    UnsupportedResourceManager {
        /// `NHC_RM`'s value.
        rm: String,
    },
}

/// What a translation may read besides the line: the default timeout and the variables
/// the file set so far (NHC's settings such as `MCELOG`, `NHC_AUTH_USERS`, `MAX_SYS_UID`
/// are shell variables too).
pub(super) struct Cx<'a> {
    /// Default per-check timeout.
    pub timeout: Duration,
    /// Variables in assignment order (the last one of a name wins).
    pub vars: &'a [(String, String)],
}

impl Cx<'_> {
    /// The value of a variable the file set (or the reader's own `HOSTNAME`, `PATH`).
    pub fn var(&self, name: &str) -> Option<&str> {
        self.vars
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The translation table: every NHC check function this reader understands, and the
/// small function (one file per NHC family) that translates it. A new NHC function is
/// one row here and one function in its family's file.
const TABLE: &[(&str, Translate)] = &[
    ("check_fs_mount", fs::mount),
    ("check_fs_mount_rw", fs::mount_rw),
    ("check_fs_mount_ro", fs::mount_ro),
    ("check_fs_free", fs::space),
    ("check_fs_used", fs::space),
    ("check_fs_ifree", fs::space),
    ("check_fs_iused", fs::space),
    ("check_fs_size", fs::size),
    ("check_fs_inodes", fs::size),
    ("check_hw_cpuinfo", hw::cpuinfo),
    ("check_hw_physmem", hw::mem),
    ("check_hw_swap", hw::mem),
    ("check_hw_mem", hw::mem),
    ("check_hw_physmem_free", hw::mem_free),
    ("check_hw_swap_free", hw::mem_free),
    ("check_hw_mem_free", hw::mem_free),
    ("check_hw_ib", hw::ib),
    ("check_hw_eth", hw::eth),
    ("check_hw_mcelog", hw::mcelog),
    ("check_ps_service", ps::service),
    ("check_ps_daemon", ps::daemon),
    ("check_ps_blacklist", ps::daemon),
    ("check_ps_loadavg", ps::loadavg),
    ("check_ps_cpu", ps::resource),
    ("check_ps_mem", ps::resource),
    ("check_ps_physmem", ps::resource),
    ("check_ps_time", ps::resource),
    ("check_ps_unauth_users", ps::users),
    ("check_ps_userproc_lineage", ps::users),
    ("check_ps_kswapd", ps::kswapd),
    ("check_file_test", file::test),
    ("check_file_contents", file::contents),
    ("check_file_stat", file::stat),
    ("check_cmd_status", cmd::status),
    ("check_cmd_output", cmd::status),
    ("check_cmd_dmesg", cmd::dmesg),
    ("check_net_socket", net::socket),
    ("check_net_ping", net::ping),
    ("check_nv_healthmon", nv::healthmon),
    ("check_nvsmi_healthmon", nv::healthmon),
    ("check_dmi_data_match", dmi::data_match),
    ("check_dmi_raw_data_match", dmi::raw_data_match),
];

/// NHC settings the translations read (besides `TIMEOUT` and `PATH`): assigning them is
/// not "ignored".
const READ_SETTINGS: &[&str] = &[
    "MCELOG",
    "MCELOG_ARGS",
    "MCELOG_MAX_CORRECTED_RATE",
    "MCELOG_MAX_UNCORRECTED_RATE",
    "MAX_SYS_UID",
    "LOGIN_DEFS_SRC",
    "NHC_RM",
    "NHC_AUTH_USERS",
    "RM_DAEMON_MATCH",
    "SQUEUE_CMD",
    "SQUEUE_NODE",
    "SQUEUE_FMT_ARGS",
    "MOUNT_CMD",
    "NVIDIA_HEALTHMON",
    "NVIDIA_HEALTHMON_ARGS",
    "NVIDIA_SMI_HEALTHMON",
    "NVIDIA_SMI_HEALTHMON_ARGS",
];

/// The NHC checks this reader understands, in table order.
pub fn supported() -> impl Iterator<Item = &'static str> {
    TABLE.iter().map(|(name, _)| *name)
}

/// Defaults applied to checks that set none.
#[derive(Debug, Clone)]
pub struct Defaults {
    /// Per-check timeout.
    pub timeout: Duration,
    /// Folder of Slurm's commands (`slurm.bin_dir`; empty: `/usr/bin`): NHC's default
    /// `SQUEUE_CMD` is its `squeue`.
    pub slurm_bin_dir: PathBuf,
}

/// Reads an nhc.conf file.
///
/// # Errors
/// [`ConfigError`] with file and line.
pub fn load_file(
    path: &Path,
    node: Option<&str>,
    defaults: &Defaults,
) -> Result<CheckSet, ConfigError> {
    let bytes = std::fs::read(path).map_err(|e| ConfigError {
        file: path.to_path_buf(),
        line: None,
        message: format!("cannot read: {e}"),
    })?;
    // NHC is bash and reads bytes: a Latin-1 comment or a stray byte must not switch every
    // check off. Invalid UTF-8 becomes U+FFFD (it can then only fail to match, or be a
    // line's error naming that line).
    let text = String::from_utf8_lossy(&bytes);
    if let Err(e) = std::str::from_utf8(&bytes) {
        let line = bytes[..e.valid_up_to()]
            .iter()
            .filter(|b| **b == b'\n')
            .count()
            + 1;
        tracing::warn!(
            "{}:{line}: not valid UTF-8; read with U+FFFD in place of the bad bytes",
            path.display()
        );
    }
    parse(&text, path, node, defaults)
}

/// Logical lines (after `read`-style backslash processing) with their first physical
/// line number.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut start = 0;
    let mut continuing = false;
    for (i, raw) in text.lines().enumerate() {
        if !continuing {
            start = i + 1;
            cur.clear();
        }
        let mut chars = raw.chars().peekable();
        continuing = false;
        while let Some(c) = chars.next() {
            if c == '\\' {
                match chars.next() {
                    Some(n) => cur.push(n),
                    None => continuing = true,
                }
            } else {
                cur.push(c);
            }
        }
        if !continuing {
            out.push((start, std::mem::take(&mut cur)));
        }
    }
    if continuing {
        out.push((start, cur));
    }
    out
}

/// What one logical line of nhc.conf is.
enum Line {
    /// Variable assignments (`VAR=value`, `export VAR=value`).
    Assign(Vec<(String, String)>),
    /// A check function and its arguments.
    Check(String, Vec<String>),
}

/// Parses nhc.conf text; `file` is used in errors and origins.
///
/// One bad line never switches health checking off (NHC runs every other line too): a
/// line this reader cannot run becomes a failing check of its own naming its file and line
/// when its target matches this node (or cannot be read), and a note when it does not. A
/// line without `||` (NHC reads the whole line as the target, which matches no host) and
/// an empty check are skipped with a note.
///
/// # Errors
/// None today; kept for file-level errors.
pub fn parse(
    text: &str,
    file: &Path,
    node: Option<&str>,
    defaults: &Defaults,
) -> Result<CheckSet, ConfigError> {
    let mut set = CheckSet::default();
    let mut vars: Vec<(String, String)> = vec![("PATH".into(), cmd_path().to_string())];
    // NHC's default SQUEUE_CMD is `squeue` on its PATH: here the agent's Slurm
    // (`slurm.bin_dir`), which a file's own SQUEUE_CMD overrides.
    let bin_dir = if defaults.slurm_bin_dir.as_os_str().is_empty() {
        Path::new("/usr/bin")
    } else {
        defaults.slurm_bin_dir.as_path()
    };
    vars.push((
        "SQUEUE_CMD".into(),
        bin_dir.join("squeue").display().to_string(),
    ));
    if let Some(n) = node {
        vars.push(("HOSTNAME".into(), n.to_string()));
        vars.push((
            "HOSTNAME_S".into(),
            n.split('.').next().unwrap_or(n).to_string(),
        ));
    }
    let mut default_timeout = defaults.timeout;
    for (line_no, line) in logical_lines(text) {
        let here = format!("{}:{line_no}", file.display());
        let origin = Origin {
            file: file.to_path_buf(),
            line: Some(line_no),
        };
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let Some((target, check)) = trimmed.split_once("||") else {
            set.notes.push(format!(
                "{here}: skipped: no '||' in {trimmed:?} (NHC reads it as a target that matches no host)"
            ));
            continue;
        };
        let (target, check) = (target.trim(), check.trim());
        let invalid = |set: &mut CheckSet, message: String| {
            set.checks.push(Check {
                name: if check.is_empty() { trimmed } else { check }.to_string(),
                origin: origin.clone(),
                timeout: Duration::from_secs(1),
                fatal: true,
                kind: CheckKind::Invalid(ConfigError {
                    file: file.to_path_buf(),
                    line: Some(line_no),
                    message,
                }),
            });
        };
        let applies = match Matcher::parse(target) {
            Ok(m) => match node {
                Some(n) => m.matches(n),
                None => target == "*",
            },
            Err(m) => {
                invalid(&mut set, format!("target {target:?}: {m}"));
                continue;
            }
        };
        if check.is_empty() {
            set.notes.push(format!("{here}: skipped: empty check"));
            continue;
        }
        let parsed = read_line(check, &vars);
        let parsed = match parsed {
            Ok(p) => p,
            Err(m) if applies => {
                invalid(&mut set, m.to_string());
                continue;
            }
            Err(m) => {
                set.notes
                    .push(format!("{here}: not for this node, and cannot run: {m}"));
                continue;
            }
        };
        if !applies {
            if let Line::Check(first, args) = &parsed {
                if let Err(m) = build(first, args, default_timeout, &vars) {
                    set.notes.push(format!(
                        "{here}: not for this node, and cannot run: {first}: {m}"
                    ));
                }
            }
            continue;
        }
        match parsed {
            Line::Assign(assigns) => {
                for (k, v) in assigns {
                    if k == "TIMEOUT" {
                        match v.parse::<u64>() {
                            Ok(secs) => default_timeout = Duration::from_secs(secs.max(1)),
                            Err(_) => {
                                invalid(
                                    &mut set,
                                    NhcError::TimeoutNotSeconds { value: v.clone() }.to_string(),
                                );
                                continue;
                            }
                        }
                    } else if k != "PATH" && !READ_SETTINGS.contains(&k.as_str()) {
                        set.notes.push(format!(
                            "{here}: {k} is not an NHC setting slurm-node-agent reads; kept for $-substitutions in later lines"
                        ));
                    }
                    vars.retain(|(n, _)| *n != k);
                    vars.push((k, v));
                }
            }
            Line::Check(first, args) => match build(&first, &args, default_timeout, &vars) {
                Ok(built) => {
                    let multiple = built.len() > 1;
                    for (suffix, kind, fatal, timeout) in built {
                        let name = if multiple {
                            format!("{check} [{suffix}]")
                        } else {
                            check.to_string()
                        };
                        set.checks.push(Check {
                            name,
                            origin: origin.clone(),
                            timeout,
                            fatal,
                            kind,
                        });
                    }
                }
                Err(m) => invalid(&mut set, format!("{first}: {m}")),
            },
        }
    }
    Ok(set)
}

/// The PATH an nhc.conf file starts with (`$PATH` in `export PATH=...:$PATH`).
fn cmd_path() -> &'static str {
    super::checks::cmd::SAFE_PATH
}

/// Reads one check (the part after `||`): an assignment line or a check and its words.
fn read_line(check: &str, vars: &[(String, String)]) -> Result<Line, NhcError> {
    let first_raw = check.split_whitespace().next().unwrap_or("");
    let is_assign = first_raw == "export" || is_assignment(first_raw);
    // Assignments expand an unset variable to "" as bash does; checks refuse it.
    let words = shell_words_mode(check, vars, is_assign)?;
    let Some(first) = words.first() else {
        return Err(NhcError::EmptyCheck);
    };
    if is_assign {
        let assigns = if first == "export" {
            &words[1..]
        } else {
            &words[..]
        };
        let mut out = Vec::new();
        for a in assigns {
            let Some((k, v)) = a.split_once('=').filter(|(k, _)| is_name(k)) else {
                return Err(NhcError::NotAnAssignment { word: a.clone() });
            };
            out.push((k.to_string(), v.to_string()));
        }
        return Ok(Line::Assign(out));
    }
    Ok(Line::Check(first.clone(), words[1..].to_vec()))
}

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(k, _)| is_name(k))
}

/// Splits a check into words like the shell: `'...'`, `"..."` (with `\"`, `\\`, `\$`),
/// backslash escapes, `$VAR` / `${VAR}` from `vars`. Refuses command substitution and
/// shell operators.
///
/// # Errors
/// [`ShellError`]: what in the words is refused.
pub fn shell_words(s: &str, vars: &[(String, String)]) -> Result<Vec<String>, ShellError> {
    shell_words_mode(s, vars, false)
}

/// [`shell_words`]; `unset_empty`: an unset variable expands to "" (bash) instead of
/// being an error.
fn shell_words_mode(
    s: &str,
    vars: &[(String, String)],
    unset_empty: bool,
) -> Result<Vec<String>, ShellError> {
    let get = |name: &str| -> Option<String> {
        vars.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let lookup = |name: &str| -> Result<String, ShellError> {
        match get(name) {
            Some(v) => Ok(v),
            None if unset_empty => Ok(String::new()),
            None => Err(ShellError::UnknownVariable {
                name: name.to_string(),
            }),
        }
    };
    let chars: Vec<char> = s.chars().collect();
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut i = 0;
    let expand = |i: &mut usize, cur: &mut String| -> Result<(), ShellError> {
        // chars[*i] == '$'
        let next = chars.get(*i + 1).copied();
        match next {
            Some('(') if chars.get(*i + 2) == Some(&'(') => {
                // $(( arithmetic )): up to the matching "))".
                let mut depth = 0usize;
                let mut j = *i + 3;
                let body_start = j;
                loop {
                    match chars.get(j) {
                        None => return Err(ShellError::UnclosedArithmetic),
                        Some('(') => depth += 1,
                        Some(')') if depth == 0 => {
                            if chars.get(j + 1) != Some(&')') {
                                return Err(ShellError::UnclosedArithmetic);
                            }
                            break;
                        }
                        Some(')') => depth -= 1,
                        _ => {}
                    }
                    j += 1;
                }
                let body: String = chars[body_start..j].iter().collect();
                let v = super::arith::eval(&body, &get)?;
                cur.push_str(&v.to_string());
                *i = j + 2;
                Ok(())
            }
            Some('(') => Err(ShellError::DollarSubstitution),
            Some('{') => {
                let end = chars[*i + 2..]
                    .iter()
                    .position(|&c| c == '}')
                    .ok_or(ShellError::UnclosedBrace)?;
                let inner: String = chars[*i + 2..*i + 2 + end].iter().collect();
                let name_len = inner
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(inner.len());
                let (name, op) = inner.split_at(name_len);
                if !is_name(name) {
                    return Err(ShellError::BadExpansionName { expansion: inner });
                }
                let value = if op.is_empty() {
                    lookup(name)?
                } else if let Some(d) = op.strip_prefix(":-") {
                    get(name)
                        .filter(|v| !v.is_empty())
                        .unwrap_or_else(|| d.to_string())
                } else if let Some(d) = op.strip_prefix('-') {
                    get(name).unwrap_or_else(|| d.to_string())
                } else {
                    return Err(ShellError::UnsupportedExpansion { expansion: inner });
                };
                cur.push_str(&value);
                *i += 3 + end;
                Ok(())
            }
            Some(c) if c.is_ascii_alphabetic() || c == '_' => {
                let mut j = *i + 1;
                while j < chars.len() && (chars[j].is_ascii_alphanumeric() || chars[j] == '_') {
                    j += 1;
                }
                let name: String = chars[*i + 1..j].iter().collect();
                cur.push_str(&lookup(&name)?);
                *i = j;
                Ok(())
            }
            _ => {
                cur.push('$');
                *i += 1;
                Ok(())
            }
        }
    };
    while i < chars.len() {
        let c = chars[i];
        match c {
            ' ' | '\t' => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
                i += 1;
            }
            '\'' => {
                let end = chars[i + 1..]
                    .iter()
                    .position(|&c| c == '\'')
                    .ok_or(ShellError::UnclosedSingleQuote)?;
                cur.extend(&chars[i + 1..i + 1 + end]);
                in_word = true;
                i += end + 2;
            }
            '"' => {
                in_word = true;
                i += 1;
                loop {
                    let Some(&d) = chars.get(i) else {
                        return Err(ShellError::UnclosedDoubleQuote);
                    };
                    match d {
                        '"' => {
                            i += 1;
                            break;
                        }
                        '\\' if matches!(chars.get(i + 1), Some('"' | '\\' | '$' | '`')) => {
                            cur.push(chars[i + 1]);
                            i += 2;
                        }
                        '`' => return Err(ShellError::BacktickSubstitution),
                        '$' => expand(&mut i, &mut cur)?,
                        _ => {
                            cur.push(d);
                            i += 1;
                        }
                    }
                }
            }
            '\\' => {
                if let Some(&n) = chars.get(i + 1) {
                    cur.push(n);
                }
                in_word = true;
                i += 2;
            }
            '$' => {
                in_word = true;
                expand(&mut i, &mut cur)?;
            }
            '`' => return Err(ShellError::BacktickSubstitution),
            ';' | '|' | '&' | '<' | '>' => return Err(ShellError::Operator { operator: c }),
            '#' if !in_word => break,
            _ => {
                cur.push(c);
                in_word = true;
                i += 1;
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    Ok(words)
}

/// bash `getopts`: options from `spec` (a letter followed by `:` takes a value), clustered
/// or separate, up to the first non-option or `--`. Returns options and the rest.
type Opts = (Vec<(char, String)>, Vec<String>);

fn getopts(args: &[String], spec: &str) -> Result<Opts, NhcError> {
    let mut opts = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if a == "--" {
            i += 1;
            break;
        }
        if !a.starts_with('-') || a.len() < 2 {
            break;
        }
        let chars: Vec<char> = a[1..].chars().collect();
        let mut j = 0;
        while j < chars.len() {
            let c = chars[j];
            let Some(pos) = spec.find(c).filter(|_| c != ':') else {
                return Err(NhcError::InvalidOption { option: c });
            };
            let takes = spec[pos + c.len_utf8()..].starts_with(':');
            if takes {
                let rest: String = chars[j + 1..].iter().collect();
                let val = if !rest.is_empty() {
                    rest
                } else {
                    i += 1;
                    args.get(i)
                        .cloned()
                        .ok_or(NhcError::OptionNeedsValue { option: c })?
                };
                opts.push((c, val));
                break;
            }
            opts.push((c, String::new()));
            j += 1;
        }
        i += 1;
    }
    Ok((opts, args[i.min(args.len())..].to_vec()))
}

fn matcher(s: &str) -> Result<Matcher, NhcError> {
    Ok(Matcher::parse(s)?)
}

fn unsupported_opt(c: char, why: &'static str) -> NhcError {
    NhcError::UnsupportedOption { option: c, why }
}

type Built = Vec<(String, CheckKind, bool, Duration)>;

fn one(kind: CheckKind, timeout: Duration) -> Built {
    vec![(String::new(), kind, true, timeout)]
}

fn arg(args: &[String], i: usize) -> Option<&str> {
    args.get(i).map(String::as_str).filter(|s| !s.is_empty())
}

fn need<'a>(args: &'a [String], i: usize, what: &'static str) -> Result<&'a str, NhcError> {
    arg(args, i).ok_or(NhcError::MissingArgument { argument: what })
}

fn too_many(args: &[String], max: usize) -> Result<(), NhcError> {
    if args.len() > max {
        return Err(NhcError::UnexpectedArgument {
            argument: args[max].clone(),
        });
    }
    Ok(())
}

/// Builds the check(s) of one NHC line through [`TABLE`].
fn build(
    name: &str,
    args: &[String],
    timeout: Duration,
    vars: &[(String, String)],
) -> Result<Built, NhcError> {
    match TABLE.iter().find(|(n, _)| *n == name) {
        Some((_, translate)) => translate(name, args, &Cx { timeout, vars }),
        None => Err(NhcError::UnsupportedCheck {
            function: name.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const D: Defaults = Defaults {
        timeout: Duration::from_secs(10),
        slurm_bin_dir: PathBuf::new(),
    };

    fn p(text: &str, node: Option<&str>) -> Result<CheckSet, ConfigError> {
        parse(text, Path::new("/etc/nhc/nhc.conf"), node, &D)
    }

    /// NHC's default SQUEUE_CMD is the agent's Slurm (`slurm.bin_dir`), unless the file
    /// sets its own.
    #[test]
    fn squeue_comes_from_the_agents_slurm_bin_dir() {
        let jobs_command = |text: &str| {
            let d = Defaults {
                timeout: Duration::from_secs(10),
                slurm_bin_dir: PathBuf::from("/opt/slurm/bin"),
            };
            let set = parse(text, Path::new("/etc/nhc/nhc.conf"), Some("n1"), &d).unwrap();
            match &set.checks[0].kind {
                CheckKind::PsUsers(u) => u.jobs_command.clone(),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(
            jobs_command("* || check_ps_unauth_users log\n")[0],
            "/opt/slurm/bin/squeue"
        );
        assert_eq!(
            jobs_command("* || SQUEUE_CMD=/site/squeue\n* || check_ps_unauth_users log\n")[0],
            "/site/squeue"
        );
    }

    #[test]
    fn shell_words_like_bash() {
        let vars = vec![("HOSTNAME".to_string(), "n1".to_string())];
        assert_eq!(
            shell_words(r#"check_cmd_output -m '/Linux/' /bin/uname -s"#, &vars).unwrap(),
            vec!["check_cmd_output", "-m", "/Linux/", "/bin/uname", "-s"]
        );
        assert_eq!(
            shell_words(
                r#"a "b c" d\ e "$HOSTNAME-x" ${HOSTNAME}y '$HOSTNAME' # comment"#,
                &vars
            )
            .unwrap(),
            vec!["a", "b c", "d e", "n1-x", "n1y", "$HOSTNAME"]
        );
        assert!(shell_words("a $(id)", &vars)
            .unwrap_err()
            .to_string()
            .contains("command substitution"));
        assert!(shell_words("a `id`", &vars).is_err());
        assert!(shell_words("a; reboot", &vars)
            .unwrap_err()
            .to_string()
            .contains("operator"));
        assert!(shell_words("a | b", &vars).is_err());
        assert!(shell_words("a 'b", &vars)
            .unwrap_err()
            .to_string()
            .contains("unclosed"));
        assert!(shell_words("a $NOPE", &vars)
            .unwrap_err()
            .to_string()
            .contains("$NOPE"));
    }

    #[test]
    fn getopts_clusters_and_values() {
        let a = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (o, r) = getopts(&a(&["-rwx", "-t5", "-m", "x y", "file", "-z"]), "rwxt:m:").unwrap();
        assert_eq!(
            o,
            vec![
                ('r', String::new()),
                ('w', String::new()),
                ('x', String::new()),
                ('t', "5".into()),
                ('m', "x y".into())
            ]
        );
        assert_eq!(r, a(&["file", "-z"]));
        assert!(getopts(&a(&["-q"]), "rw")
            .unwrap_err()
            .to_string()
            .contains("-q"));
        assert!(getopts(&a(&["-t"]), "t:")
            .unwrap_err()
            .to_string()
            .contains("requires"));
    }

    #[test]
    fn bench_file_parses_to_21_checks() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/health/nhc-21.conf"
        ))
        .unwrap();
        let set = p(&text, Some("node1")).unwrap();
        assert_eq!(set.checks.len(), 21);
        assert_eq!(set.checks[0].name, "check_fs_mount_rw -f /");
        assert_eq!(set.checks[0].origin.line, Some(3));
        let cmd = set
            .checks
            .iter()
            .find(|c| c.name.starts_with("check_cmd_status"))
            .unwrap();
        assert_eq!(cmd.timeout, Duration::from_secs(5));
        assert!(matches!(cmd.kind, CheckKind::Command(ref c) if c.argv == ["/bin/true"]));
    }

    #[test]
    fn targets_glob_regex_and_ranges() {
        let text = "\
* || check_hw_eth lo
n* || check_hw_eth eth0
/^gpu-[0-9]+$/ || check_hw_eth ib0
{n[01-04]} || check_hw_eth ib1
!{n[01-04]} || check_hw_eth ib2
";
        let names = |node: Option<&str>| -> Vec<String> {
            p(text, node)
                .unwrap()
                .checks
                .into_iter()
                .map(|c| c.name)
                .collect()
        };
        assert_eq!(
            names(Some("n03")),
            vec!["check_hw_eth lo", "check_hw_eth eth0", "check_hw_eth ib1"]
        );
        assert_eq!(
            names(Some("gpu-17")),
            vec!["check_hw_eth lo", "check_hw_eth ib0", "check_hw_eth ib2"]
        );
        assert_eq!(
            names(Some("n05")),
            vec!["check_hw_eth lo", "check_hw_eth eth0", "check_hw_eth ib2"]
        );
        assert_eq!(names(None), vec!["check_hw_eth lo"]);
    }

    #[test]
    fn continuation_comments_variables_and_settings() {
        let text = "\
# comment
   # indented comment

* || export TIMEOUT=3
* || MARK_OFFLINE=1
* || check_file_test -r \\
      /etc/passwd
* || check_file_contents /etc/hostname \"$HOSTNAME\"
* || MCELOG=/opt/bin/mcelog
";
        let set = p(text, Some("n1")).unwrap();
        assert_eq!(set.checks.len(), 2);
        assert_eq!(set.checks[0].origin.line, Some(6));
        assert_eq!(set.checks[0].timeout, Duration::from_secs(3));
        assert!(
            matches!(&set.checks[1].kind, CheckKind::FileContents(c) if c.matches[0].as_str() == "n1")
        );
        assert!(
            set.notes.iter().any(|n| n.contains("MARK_OFFLINE")),
            "{:?}",
            set.notes
        );
        // A setting a check reads is not "ignored".
        assert!(
            !set.notes.iter().any(|n| n.contains("MCELOG")),
            "{:?}",
            set.notes
        );
    }

    /// The failing check a bad line became (its message names file and line).
    fn invalid(set: &CheckSet) -> Vec<(usize, String)> {
        set.checks
            .iter()
            .filter_map(|c| match &c.kind {
                CheckKind::Invalid(e) => Some((c.origin.line.unwrap_or(0), e.to_string())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_bad_line_is_a_failing_check_and_the_others_still_run() {
        let set = p(
            "* || check_hw_eth lo\n\n* || check_gpu_magic 4\n* || check_hw_eth eth0\n",
            Some("n1"),
        )
        .unwrap();
        assert_eq!(set.checks.len(), 3);
        assert_eq!(set.checks[2].name, "check_hw_eth eth0");
        let bad = invalid(&set);
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].0, 3);
        assert!(
            bad[0]
                .1
                .starts_with("/etc/nhc/nhc.conf:3: check_gpu_magic: unsupported NHC check"),
            "{bad:?}"
        );
        assert_eq!(set.checks[1].name, "check_gpu_magic 4");
        assert!(set.checks[1].fatal);
        // Malformed lines, each a failing check naming its line.
        for (text, line, needle) in [
            ("* || check_fs_free /\n", 1, "missing threshold"),
            ("\n* || check_fs_free / 10x\n", 2, "invalid size"),
            ("* || check_fs_ifree / lots\n", 1, "invalid count"),
            ("{n[1-} || check_hw_eth lo\n", 1, "target"),
            ("* || check_hw_eth 'lo\n", 1, "unclosed"),
            ("* || check_ps_service -e 'a;b' evil\n", 1, "operator"),
            (
                "* || check_cmd_output -m '/(/' /bin/true\n",
                1,
                "regular expression",
            ),
            ("* || check_file_test /tmp\n", 1, "operator"),
            ("* || check_hw_cpuinfo two\n", 1, "not a count"),
            ("* || export TIMEOUT=soon\n", 1, "TIMEOUT"),
            ("* || check_hw_eth $((1/0))\n", 1, "division by 0"),
            ("* || check_hw_eth ${X:?}\n", 1, "parameter expansion"),
            ("* || check_ps_cpu -m x\n", 1, "missing limit"),
            ("* || check_ps_cpu 5x\n", 1, "CPU utilization limit"),
            ("* || check_ps_mem 10%\n", 1, "percentage not supported"),
            ("* || check_ps_time 5h\n", 1, "invalid characters"),
            ("* || check_ps_kswapd 10\n", 1, "missing discrepancy"),
            ("* || check_ps_kswapd 10 2 kill\n", 1, "unknown action"),
            ("* || check_ps_unauth_users explode\n", 1, "unknown action"),
            (
                "* || NHC_RM=none\n* || check_ps_userproc_lineage\n",
                2,
                "resource manager",
            ),
            ("* || check_net_socket -0\n", 1, "no match criteria"),
            (
                "* || check_net_socket -p tcp extra\n",
                1,
                "additional arguments",
            ),
            ("* || check_net_ping\n", 1, "no target"),
            (
                "* || check_net_ping -I a/b 127.0.0.1\n",
                1,
                "interface name",
            ),
            (
                "* || check_net_ping -c many 127.0.0.1\n",
                1,
                "not a whole number",
            ),
            ("* || check_hw_mcelog now\n", 1, "unexpected argument"),
            (
                "* || MCELOG_MAX_CORRECTED_RATE=lots\n* || check_hw_mcelog\n",
                2,
                "MCELOG_MAX",
            ),
            ("* || check_cmd_dmesg extra\n", 1, "unexpected argument"),
            ("* || check_fs_mount -e 'a|b' -f /x\n", 1, "operator"),
        ] {
            let set = p(text, Some("n1")).unwrap();
            let bad = invalid(&set);
            assert_eq!(bad.len(), 1, "{text}: {bad:?}");
            assert_eq!(bad[0].0, line, "{text}: {bad:?}");
            assert!(bad[0].1.contains(needle), "{text}: {bad:?}");
            assert!(
                bad[0].1.starts_with(&format!("/etc/nhc/nhc.conf:{line}: ")),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn lines_nhc_skips_are_skipped_with_a_note() {
        let text = "\
NVIDIA_HEALTHMON=dcgmi
gpu* || check_nv_healthmon
other || check_nope -x
* ||
* || check_hw_eth lo
";
        let set = p(text, Some("n1")).unwrap();
        assert_eq!(set.checks.len(), 1, "{:?}", set.checks);
        assert_eq!(set.checks[0].name, "check_hw_eth lo");
        let notes = set.notes.join("\n");
        assert!(notes.contains("nhc.conf:1: skipped: no '||'"), "{notes}");
        assert!(notes.contains("nhc.conf:3: not for this node"), "{notes}");
        assert!(
            notes.contains("nhc.conf:4: skipped: empty check"),
            "{notes}"
        );
    }

    #[test]
    fn assignments_with_defaults_and_arithmetic() {
        let text = "\
* || export PATH=\"/opt/bin:$PATH\"
* || BASE=/srv
* || DIR=${BASE}/a ALT=${NOPE:-/alt} N=$((2 * 3 + 010))
* || check_file_test -e $DIR $ALT /n$N ${PATH}
* || check_file_test -e $UNSET_VAR
";
        let set = p(text, Some("n1")).unwrap();
        let CheckKind::FileTest(f) = &set.checks[0].kind else {
            panic!("{:?}", set.checks[0])
        };
        let path = format!("/opt/bin:{}", super::cmd_path());
        assert_eq!(
            f.paths,
            vec!["/srv/a", "/alt", "/n14", path.as_str()],
            "{f:?}"
        );
        let bad = invalid(&set);
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert_eq!(bad[0].0, 5);
        assert!(bad[0].1.contains("$UNSET_VAR"), "{bad:?}");
    }

    #[test]
    fn gpu_healthmon_through_nvml_or_the_named_program() {
        let set = p(
            "* || check_nvsmi_healthmon\n* || check_nv_healthmon\n\
             * || NVIDIA_SMI_HEALTHMON=/usr/bin/dcgmi\n\
             * || NVIDIA_SMI_HEALTHMON_ARGS=\"diag -r 1\"\n* || check_nvsmi_healthmon\n\
             * || NVIDIA_HEALTHMON=/opt/nvidia-healthmon\n* || check_nv_healthmon\n",
            Some("n1"),
        )
        .unwrap();
        assert!(set.notes.is_empty(), "{:?}", set.notes);
        let CheckKind::Gpu(smi) = &set.checks[0].kind else {
            panic!("{:?}", set.checks[0])
        };
        assert!(smi.require && !smi.xid && smi.max_uncorrected_ecc.is_none());
        let CheckKind::Gpu(mon) = &set.checks[1].kind else {
            panic!("{:?}", set.checks[1])
        };
        assert!(mon.require && mon.xid && mon.max_uncorrected_ecc == Some(0));
        let CheckKind::Command(c) = &set.checks[2].kind else {
            panic!("{:?}", set.checks[2])
        };
        assert_eq!(c.argv, ["/usr/bin/dcgmi", "diag", "-r", "1"]);
        assert_eq!(c.check_name.as_deref(), Some("check_nvsmi_healthmon"));
        let CheckKind::Command(c) = &set.checks[3].kind else {
            panic!("{:?}", set.checks[3])
        };
        assert_eq!(c.argv, ["/opt/nvidia-healthmon", "-e", "-v"]);
    }

    #[test]
    fn ps_service_defaults() {
        let set = p("* || check_ps_service -u root -S munged\n", Some("n1")).unwrap();
        let CheckKind::Process(s) = &set.checks[0].kind else {
            panic!("not a process check")
        };
        assert_eq!(s.pattern.as_str(), "*munged");
        assert_eq!(s.on, MatchOn::Argv0);
        assert_eq!(s.action, ServiceAction::Start);
        assert_eq!(s.owner.as_ref().unwrap().as_str(), "root");
        assert!(s.pattern.matches("/usr/sbin/munged"));
    }

    #[test]
    fn mount_old_and_new_syntax() {
        let set = p(
            "* || check_fs_mount /scratch fs:/x lustre\n* || check_fs_mount -0 -t tmpfs -f /a -f /b\n",
            Some("n1"),
        )
        .unwrap();
        assert_eq!(set.checks.len(), 3);
        assert!(!set.checks[1].fatal);
        assert_eq!(
            set.checks[2].name,
            "check_fs_mount -0 -t tmpfs -f /a -f /b [/b]"
        );
    }

    #[tokio::test]
    async fn report_only_runs_no_service_action() {
        let set = p("* || check_ps_service -S no-such-daemon-xyz\n", Some("n1")).unwrap();
        let env = |service_actions| crate::health::engine::RunEnv {
            // A bus nobody listens on: an attempted start says it was not possible.
            systemd_bus: "unix:path=/nonexistent/bus".into(),
            service_actions,
            ..Default::default()
        };
        let r = crate::health::engine::run_checks(&set, &env(false)).await;
        let m = &r.results[0].message;
        assert!(
            m.ends_with("start of no-such-daemon-xyz not attempted (report only)"),
            "{m}"
        );
        let r = crate::health::engine::run_checks(&set, &env(true)).await;
        let m = &r.results[0].message;
        assert!(m.contains("not possible"), "{m}");
    }

    /// A /proc with one process: PID 4194301 (above any pid_max: nothing real is ever
    /// signalled), `hog`, uid 5000, parent 1, 99.0% of a CPU over 1000 s.
    fn fake_proc() -> (tempfile::TempDir, crate::health::facts::Host) {
        let d = tempfile::tempdir().unwrap();
        let proc = d.path().join("proc");
        let pid = proc.join("4194301");
        std::fs::create_dir_all(&pid).unwrap();
        std::fs::write(proc.join("uptime"), "1000.00 900.00\n").unwrap();
        std::fs::write(
            proc.join("meminfo"),
            "MemTotal: 1000000 kB\nMemFree: 500000 kB\n",
        )
        .unwrap();
        std::fs::write(pid.join("cmdline"), "hog\0--spin\0").unwrap();
        std::fs::write(
            pid.join("status"),
            "Name:\thog\nUid:\t5000\t5000\t5000\t5000\nPPid:\t1\nVmSize:\t2000 kB\nVmRSS:\t1000 kB\n",
        )
        .unwrap();
        std::fs::write(
            pid.join("stat"),
            "4194301 (hog) R 1 1 1 0 -1 0 0 0 0 0 99000 0 0 0 20 0 1 0 0 0 0\n",
        )
        .unwrap();
        let host = crate::health::facts::Host {
            proc_dir: proc,
            passwd: d.path().join("passwd"),
            ..Default::default()
        };
        (d, host)
    }

    #[tokio::test]
    async fn process_check_messages_are_plain_words_and_say_what_was_done() {
        let (_d, host) = fake_proc();
        let set = p(
            "MAX_SYS_UID=999\n\
             * || check_ps_cpu -m hog 100%\n\
             * || check_ps_cpu -m hog -k 50%\n\
             * || check_ps_cpu -m hog -e /bin/false 50%\n\
             * || check_ps_userproc_lineage log syslog\n\
             * || check_ps_service -e /bin/true no-such-daemon-xyz\n",
            Some("n1"),
        )
        .unwrap();
        let env = |service_actions| crate::health::engine::RunEnv {
            host: host.clone(),
            systemd_bus: "unix:path=/nonexistent/bus".into(),
            service_actions,
            ..Default::default()
        };
        let r = crate::health::engine::run_checks(&set, &env(false)).await;
        let m = |i: usize| r.results[i].message.clone();
        // A limit in words, not a Rust name (was "CpuPercent(100)").
        assert_eq!(m(0), "no matching process over the limit (100% CPU)");
        // --no-act: the kill is not claimed, only reported as not attempted.
        assert_eq!(
            m(1),
            "check_ps_cpu: Process \"hog\" (4194301) of 5000 using 99.0% CPU (limit 50%); \
             not attempted (report only): kill -9 4194301"
        );
        // log and syslog both note it: once.
        assert_eq!(
            m(3),
            "check_ps_userproc_lineage: 5000's \"hog\" process is rogue. (PID 4194301) (logged only)"
        );
        // The action a process check would take, in words (was "command of ...").
        assert!(
            m(4).ends_with("; running \"/bin/true\" not attempted (report only)"),
            "{}",
            m(4)
        );
        // Acting: an exit code as a number (was "exit code Some(1)").
        let r = crate::health::engine::run_checks(&set, &env(true)).await;
        let m2 = &r.results[2].message;
        assert!(
            m2.ends_with("(limit 50%); \"/bin/false\" failed (exit code 1)"),
            "{m2}"
        );
    }

    /// Lines an NHC file may hold: real check names, shell-ish punctuation, arbitrary text.
    fn nhc_line() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let check = proptest::sample::select(supported().collect::<Vec<_>>());
        prop_oneof![
            (check, "[ -~]{0,40}").prop_map(|(c, a)| format!("* || {c} {a}")),
            "[ -~]{0,60}",
            "\\PC{0,30}",
            "[*a-z0-9_.|&;$(){}'\"\\\\ =-]{0,50}",
        ]
    }

    proptest::proptest! {
        // Cases: proptest's default (256), or PROPTEST_CASES (CI's longer run).
        #[test]
        fn fuzz_nhc_parse_never_panics(lines in proptest::collection::vec(nhc_line(), 0..12)) {
            let text = lines.join("\n");
            if let Err(e) = p(&text, Some("n1")) {
                proptest::prop_assert!(e.line.is_some_and(|l| l <= lines.len().max(1)), "{}", e);
            }
        }
    }
}
