//! The agent's own check files: `*.toml` in `health.checks_dir`
//! (`/etc/slurm-node-agent/checks.d/`), read in name order. Each file holds `[[check]]`
//! tables; `kind` picks the family, unknown keys are errors, and every error names the
//! file and line. The format, every kind and its keys, and the precedence between files
//! are documented in `docs/health-checks.md` ("The checks.d format"), whose examples a test
//! runs (`agent/tests/health_checksd.rs`).
//!
//! ```toml
//! [[check]]
//! name = "root file system"      # shown in reports and drain reasons
//! kind = "mount"                 # in /proc/mounts, alive, optionally type/source/options
//! path = "/"
//! writable = true
//! min_free = "5%"                # or a size: "500G"
//!
//! [[check]]
//! name = "GPUs"
//! kind = "gpu"                   # count = "auto" (from the instance type) or a number
//! when = "gpus"                  # only where the instance has GPUs
//! ```
//!
//! Common keys: `name` (a definition that gives several checks names each `NAME: PIECE`,
//! `shared file systems: mount /fsx`), `timeout`, `fatal` (default true; false: a failure
//! is only reported), `nodes` (an NHC target expression, default `*`), `when` (words the node must
//! have: [`Condition`]), `enabled` (false: the definition is off). A `[[check]]` with a
//! `name` replaces every check of that name from earlier files, at the place of the first;
//! with `enabled = false` (and no `kind`) it only turns them off ([`load_dir`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::checks::cmd::CommandSpec;
use super::checks::efa::counters::RATE_COUNTERS;
use super::checks::efa::libfabric::FI_INFO_PROGRAM;
use super::checks::efa::{EfaCount, EfaSpec};
use super::checks::file::{FileContentsSpec, FileStatSpec, FileTestSpec, KeySpec};
use super::checks::fs::{FreeSpaceSpec, MountSpec, SpaceSpec, SpaceWhat};
use super::checks::gpu::{FabricCheck, GpuCount, GpuSpec};
use super::checks::hw::{instance_type_shape, CpuSpec, HardwareSpec, MemSpec, MemWhat};
use super::checks::ps::{MatchOn, ProcessSpec, ServiceAction};
use super::checks::{CheckKind, UnitSpec};
use super::matcher::{Matcher, MatcherError};
use super::nhc::Defaults;
use super::target::{Condition, Target};
use super::units::{parse_count_threshold, parse_size_kib, parse_space_threshold, UnitsError};
use super::{Check, CheckSet, ConfigError, Origin};
use crate::section::HumanDuration;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    check: Vec<toml::Spanned<Def>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Def {
    kind: Option<String>,
    name: Option<String>,
    timeout: Option<HumanDuration>,
    fatal: Option<bool>,
    nodes: Option<String>,
    when: Option<toml::Value>,
    enabled: Option<bool>,
    // mount
    path: Option<String>,
    fstype: Option<String>,
    source: Option<String>,
    options: Option<Vec<String>>,
    writable: Option<bool>,
    min_free: Option<String>,
    max_used: Option<String>,
    min_free_inodes: Option<String>,
    // hardware
    instance_type: Option<String>,
    cpus: Option<u32>,
    sockets: Option<u32>,
    cores: Option<u32>,
    threads: Option<u32>,
    memory_min: Option<String>,
    memory_max: Option<String>,
    memory_tolerance: Option<String>,
    swap_min: Option<String>,
    swap_max: Option<String>,
    // gpu, efa
    count: Option<toml::Value>,
    xid: Option<bool>,
    xid_ignore: Option<Vec<u32>>,
    max_uncorrected_ecc: Option<u64>,
    max_retired_pages: Option<u64>,
    max_remapped_rows: Option<u64>,
    max_temperature_c: Option<u32>,
    fail_on_hw_slowdown: Option<bool>,
    nvlink: Option<bool>,
    library: Option<String>,
    fabric_manager: Option<bool>,
    fabric_manager_program: Option<String>,
    max_rate_per_min: Option<toml::Value>,
    libfabric: Option<bool>,
    fi_info_program: Option<String>,
    fabric: Option<toml::Value>,
    nvidia_smi: Option<String>,
    // process
    process: Option<String>,
    full_command_line: Option<bool>,
    user: Option<String>,
    running: Option<bool>,
    start: Option<bool>,
    // unit
    unit: Option<String>,
    state: Option<String>,
    // file
    exists: Option<bool>,
    mode: Option<String>,
    owner: Option<String>,
    contains: Option<Vec<String>>,
    // command
    argv: Option<Vec<String>>,
    exit_status: Option<i32>,
    output_matches: Option<Vec<String>>,
    // nhc
    line: Option<String>,
}

/// A check file the agent cannot use (read or parse), as one failing check named after the
/// file, with the error (file and line) as its message: fail closed, file by file.
pub fn unusable_file(e: ConfigError) -> Check {
    Check {
        name: e.file.file_name().map_or_else(
            || e.file.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        ),
        origin: Origin {
            file: e.file.clone(),
            line: e.line,
        },
        timeout: Duration::from_secs(1),
        fatal: true,
        kind: CheckKind::Invalid(e),
    }
}

/// Reads every `*.toml` file of `dir` in name order for the node `target`. A missing folder
/// has no checks; a file that cannot be read or parsed becomes one failing check naming the
/// file and line (the other files still give theirs).
///
/// Precedence: a `[[check]]` with a `name` replaces every check of that name from earlier
/// files (the image's defaults, say), at the place of the first one; where it does not
/// apply (`nodes`, `when`) the name has no check on this node. With `enabled = false` it
/// only turns them off; one that finds no earlier check of its name is noted. Checks of one
/// file never replace each other.
///
/// # Errors
/// [`ConfigError`] when the folder cannot be listed.
pub fn load_dir(dir: &Path, target: &Target, defaults: &Defaults) -> Result<CheckSet, ConfigError> {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "toml"))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(CheckSet::default()),
        Err(e) => {
            return Err(ConfigError {
                file: dir.to_path_buf(),
                line: None,
                message: format!("cannot list: {e}"),
            })
        }
    };
    files.sort();
    /// A definition's checks, by name and file (its index in `files`).
    struct Slot {
        name: Option<String>,
        file: usize,
        checks: Vec<Check>,
    }
    let mut slots: Vec<Slot> = Vec::new();
    let mut notes = Vec::new();
    for (fi, f) in files.iter().enumerate() {
        let parsed = std::fs::read_to_string(f)
            .map_err(|e| ConfigError {
                file: f.clone(),
                line: None,
                message: format!("cannot read: {e}"),
            })
            .and_then(|text| definitions(&text, f, target, defaults));
        let defs = match parsed {
            Ok(d) => d,
            // Fail closed, file by file: a file the agent cannot use is a failing check of
            // its own (file and line in the drain reason), and every other file still runs,
            // as a bad line of an nhc.conf is. Its definitions replace nothing.
            Err(e) => {
                slots.push(Slot {
                    name: None,
                    file: fi,
                    checks: vec![unusable_file(e)],
                });
                continue;
            }
        };
        for d in defs {
            let earlier: Vec<usize> = slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.file < fi && d.named && s.name.as_ref() == Some(&d.name))
                .map(|(i, _)| i)
                .collect();
            if d.off && d.named && earlier.is_empty() {
                notes.push(format!(
                    "{}:{}: enabled = false turns off nothing: no earlier file has a check \
                     named {:?}",
                    f.display(),
                    d.line,
                    d.name
                ));
            }
            let slot = Slot {
                name: Some(d.name),
                file: fi,
                checks: d.checks,
            };
            match earlier.split_first() {
                Some((&first, rest)) => {
                    for &i in rest.iter().rev() {
                        slots.remove(i);
                    }
                    slots[first] = slot;
                }
                None => slots.push(slot),
            }
        }
    }
    Ok(CheckSet {
        checks: slots.into_iter().flat_map(|s| s.checks).collect(),
        notes,
    })
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Parses one TOML checks file: the checks of its definitions that apply to `target`, in
/// file order (no precedence between files: see [`load_dir`]).
///
/// # Errors
/// [`ConfigError`] with file and line.
pub fn parse(
    text: &str,
    file: &Path,
    target: &Target,
    defaults: &Defaults,
) -> Result<CheckSet, ConfigError> {
    Ok(CheckSet {
        checks: definitions(text, file, target, defaults)?
            .into_iter()
            .flat_map(|d| d.checks)
            .collect(),
        notes: Vec::new(),
    })
}

/// One `[[check]]` as read for a node: its name (the `name` given, or its first check's
/// default name), the checks it gives there (none where `nodes` or `when` leave it out, or
/// with `enabled = false`), and its line.
#[derive(Debug)]
struct Definition {
    name: String,
    named: bool,
    off: bool,
    line: usize,
    checks: Vec<Check>,
}

/// The words of `when`, each with whether it is negated (`!gpus`).
fn parse_when(v: Option<&toml::Value>) -> Result<Vec<(bool, Condition)>, DefError> {
    let words: Vec<&str> = match v {
        None => Vec::new(),
        Some(toml::Value::String(w)) => vec![w.as_str()],
        Some(toml::Value::Array(a)) => a
            .iter()
            .map(|w| {
                w.as_str().ok_or_else(|| DefError::BadWhen {
                    value: toml::Value::Array(a.clone()),
                })
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(DefError::BadWhen {
                value: other.clone(),
            })
        }
    };
    words
        .into_iter()
        .map(|w| {
            let (negated, bare) = match w.strip_prefix('!') {
                Some(rest) => (true, rest),
                None => (false, w),
            };
            Condition::parse(bare)
                .map(|c| (negated, c))
                .ok_or_else(|| DefError::UnknownCondition {
                    word: w.to_string(),
                })
        })
        .collect()
}

fn definitions(
    text: &str,
    file: &Path,
    target: &Target,
    defaults: &Defaults,
) -> Result<Vec<Definition>, ConfigError> {
    let parsed: File = toml::from_str(text).map_err(|e| {
        let line = e.span().map(|s| line_of(text, s.start));
        ConfigError {
            file: file.to_path_buf(),
            line,
            message: e.message().to_string(),
        }
    })?;
    let mut out = Vec::new();
    for spanned in parsed.check {
        let line = line_of(text, spanned.span().start);
        let def = spanned.into_inner();
        let err = |problem: DefError| ConfigError {
            file: file.to_path_buf(),
            line: Some(line),
            message: match &def.kind {
                Some(k) => format!("[[check]] kind = {k:?}: {problem}"),
                None => format!("[[check]]: {problem}"),
            },
        };
        if def.name.as_deref().is_some_and(|n| n.trim().is_empty()) {
            return Err(err(DefError::EmptyName));
        }
        let enabled = def.enabled.unwrap_or(true);
        let Some(kind) = def.kind.as_deref() else {
            // `enabled = false` alone: turns off the checks of its name in earlier files.
            if enabled {
                return Err(err(DefError::MissingKind));
            }
            let Some(name) = def.name.clone() else {
                return Err(err(DefError::OffWithoutName));
            };
            let common = [
                ("timeout", def.timeout.is_some()),
                ("fatal", def.fatal.is_some()),
                ("nodes", def.nodes.is_some()),
                ("when", def.when.is_some()),
            ];
            let other = common
                .iter()
                .find(|(_, set)| *set)
                .map(|(k, _)| *k)
                .or_else(|| set_keys(&def).into_iter().next());
            if let Some(key) = other {
                return Err(err(DefError::OffTakesOnlyName { key }));
            }
            out.push(Definition {
                name,
                named: true,
                off: true,
                line,
                checks: Vec::new(),
            });
            continue;
        };
        let nodes = def.nodes.clone().unwrap_or_else(|| "*".into());
        let matcher = Matcher::parse(&nodes).map_err(|m| err(DefError::Nodes(m)))?;
        let when = parse_when(def.when.as_ref()).map_err(err)?;
        let timeout = def.timeout.map_or(defaults.timeout, |d| d.0);
        if timeout.is_zero() {
            return Err(err(DefError::ZeroTimeout));
        }
        let built = build(kind, &def, timeout, defaults, target).map_err(err)?;
        let name = def
            .name
            .clone()
            .or_else(|| built.first().map(|p| p.name.clone()))
            .unwrap_or_else(|| kind.to_string());
        let applies = enabled
            && match target.node.as_deref() {
                Some(n) => matcher.matches(n),
                None => nodes == "*",
            }
            && when.iter().all(|(negated, c)| target.holds(*c) != *negated);
        let fatal = def.fatal.unwrap_or(true);
        // A definition that gives several checks (an `agent_mounts` always: how many
        // depends on the settings) names each after itself and the piece, so that two
        // checks never share a name (a report's line, a Prometheus series).
        let several = built.len() > 1 || kind == "agent_mounts" || kind == "start_gate";
        let checks = match applies {
            false => Vec::new(),
            true => built
                .into_iter()
                .map(|p| Check {
                    name: match &def.name {
                        Some(n) if several => format!("{n}: {}", p.name),
                        Some(n) => n.clone(),
                        None => p.name,
                    },
                    origin: Origin {
                        file: file.to_path_buf(),
                        line: Some(line),
                    },
                    timeout: p.timeout,
                    fatal: fatal && p.may_drain,
                    kind: p.kind,
                })
                .collect(),
        };
        out.push(Definition {
            name,
            named: def.name.is_some(),
            off: !enabled,
            line,
            checks,
        });
    }
    Ok(out)
}

/// The kinds a `[[check]]` may have.
const KINDS: &str = "mount, space, agent_mounts, scratch, hardware, gpu, efa, process, unit, \
                     file, auth_key, command, nhc";

/// What is wrong with one `[[check]]` table; the file, line and kind are added by
/// [`parse`] ([`ConfigError`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DefError {
    /// `kind` is none of [`KINDS`].
    #[error("unknown kind (expected one of: {KINDS})")]
    UnknownKind {
        /// The kind as written.
        kind: String,
    },
    /// A key the kind does not take.
    #[error("key {key:?} does not apply to this kind (allowed: {})", allowed.join(", "))]
    KeyNotForKind {
        /// The key.
        key: &'static str,
        /// The keys the kind takes.
        allowed: &'static [&'static str],
    },
    /// A key the kind requires is missing.
    #[error("missing key {key:?}")]
    MissingKey {
        /// The key.
        key: &'static str,
    },
    /// `nodes` is not an NHC match expression.
    #[error("nodes: {0}")]
    Nodes(#[source] MatcherError),
    /// `timeout = "0s"`.
    #[error("timeout must be above zero")]
    ZeroTimeout,
    /// `name = ""`.
    #[error("name must not be empty")]
    EmptyName,
    /// A word of `when` that names no condition.
    #[error(
        "when: unknown word {word:?} (expected: {}, each may start with !)",
        Condition::words()
    )]
    UnknownCondition {
        /// The word as written.
        word: String,
    },
    /// `when` that is neither a word nor a list of words.
    #[error("when: expected a word or a list of words, got {value}")]
    BadWhen {
        /// The value.
        value: toml::Value,
    },
    /// `enabled = false` without `kind` and without `name`: nothing to turn off.
    #[error("enabled = false without kind turns off the checks of a name: give name")]
    OffWithoutName,
    /// `enabled = false` without `kind` and with another key.
    #[error(
        "enabled = false without kind takes only name, not {key:?} (to keep the check on \
         some nodes, define it again with nodes or when)"
    )]
    OffTakesOnlyName {
        /// The key.
        key: &'static str,
    },
    /// No `kind`.
    #[error("missing key \"kind\" (one of: {KINDS})")]
    MissingKind,
    /// A `space` check without a limit.
    #[error("nothing to check: set min_free, max_used or min_free_inodes")]
    NoLimit,
    /// A `space` path that is not absolute.
    #[error("path {path:?} must be absolute")]
    NotAbsolute {
        /// The path.
        path: String,
    },
    /// A match expression (`source`, `fstype`, `process`, `user`, `contains`...).
    #[error(transparent)]
    Matcher(#[from] MatcherError),
    /// A size, count or percentage.
    #[error(transparent)]
    Units(#[from] UnitsError),
    /// `instance_type` not in the built-in table.
    #[error(
        "instance type {instance_type:?} is not in the built-in table; give cpus and memory_min"
    )]
    UnknownInstanceType {
        /// The instance type.
        instance_type: String,
    },
    /// A `hardware` check with nothing to compare.
    #[error(
        "nothing to check: set instance_type, cpus, sockets, cores, threads, memory_* or swap_*"
    )]
    NothingToCheck,
    /// `count` that is neither `"auto"` nor a number.
    #[error("count: expected \"auto\" or a number, got {value}")]
    BadCount {
        /// The value.
        value: toml::Value,
    },
    /// `max_rate_per_min` that is not a table.
    #[error(
        "max_rate_per_min: expected a table of counter = events per minute \
         ({{ rx_drops = 100 }}), got {value}"
    )]
    BadRateTable {
        /// The value.
        value: toml::Value,
    },
    /// A `max_rate_per_min` entry that is not a number at or above zero.
    #[error("max_rate_per_min.{counter}: expected events per minute, a number at or above 0, got {value}")]
    BadRate {
        /// The counter.
        counter: String,
        /// The value.
        value: toml::Value,
    },
    /// A `max_rate_per_min` counter that is none of the EFA driver's error counters.
    #[error(
        "max_rate_per_min: unknown counter {counter:?} (known: {})",
        RATE_COUNTERS.join(", ")
    )]
    UnknownCounter {
        /// The counter as written.
        counter: String,
    },
    /// A program path that is not absolute (no PATH lookup).
    #[error("{key}: {path:?} must be an absolute path")]
    RelativeProgram {
        /// The key.
        key: &'static str,
        /// The path as written.
        path: String,
    },
    /// A key whose value is not one the key takes (`fabric = "yes"`, `nvidia_smi =
    /// "nvidia-smi"`).
    #[error("{key}: expected {expected}, got {value}")]
    BadValue {
        /// The key.
        key: &'static str,
        /// What it takes.
        expected: &'static str,
        /// The value as written (TOML).
        value: String,
    },
    /// `unit` that is not a systemd unit name (systemd.unit(5)).
    #[error(transparent)]
    BadUnitName(#[from] crate::systemd::InvalidUnitName),
    /// `exists = false` with `mode`, `owner` or `contains`.
    #[error("exists = false takes no mode, owner or contains")]
    AbsentWithAttributes,
    /// `mode` that is not octal.
    #[error("mode {mode:?} is not octal")]
    NotOctal {
        /// The mode as written.
        mode: String,
    },
    /// `argv = []`.
    #[error("argv must not be empty")]
    EmptyArgv,
    /// A `line` the NHC reader refuses (its message, without file and line).
    #[error("{problem}")]
    NhcLine {
        /// The line.
        line: String,
        /// What the NHC reader says is wrong with it.
        problem: String,
    },
    /// A `line` that holds no check (an assignment, a comment).
    #[error("line {line:?} holds no check")]
    NoCheckInLine {
        /// The line.
        line: String,
    },
}

fn req<'a, T>(v: &'a Option<T>, key: &'static str) -> Result<&'a T, DefError> {
    v.as_ref().ok_or(DefError::MissingKey { key })
}

/// Keys each kind accepts besides the common ones; `None` for an unknown kind.
fn allowed(kind: &str) -> Option<&'static [&'static str]> {
    Some(match kind {
        "space" => &["path", "min_free", "max_used", "min_free_inodes"],
        "agent_mounts" | "scratch" => &["min_free", "max_used", "min_free_inodes"],
        "start_gate" => &[],
        "auth_key" => &[],
        "mount" => &[
            "path",
            "fstype",
            "source",
            "options",
            "writable",
            "min_free",
            "max_used",
            "min_free_inodes",
        ],
        "hardware" => &[
            "instance_type",
            "cpus",
            "sockets",
            "cores",
            "threads",
            "memory_min",
            "memory_max",
            "memory_tolerance",
            "swap_min",
            "swap_max",
        ],
        "gpu" => &[
            "count",
            "xid",
            "xid_ignore",
            "max_uncorrected_ecc",
            "max_retired_pages",
            "max_remapped_rows",
            "max_temperature_c",
            "fail_on_hw_slowdown",
            "nvlink",
            "library",
            "fabric_manager",
            "fabric_manager_program",
            "fabric",
            "nvidia_smi",
        ],
        "efa" => &["count", "max_rate_per_min", "libfabric", "fi_info_program"],
        "process" => &["process", "full_command_line", "user", "running", "start"],
        "unit" => &["unit", "state"],
        "file" => &["path", "exists", "mode", "owner", "contains"],
        "command" => &["argv", "exit_status", "output_matches"],
        "nhc" => &["line"],
        _ => return None,
    })
}

fn set_keys(d: &Def) -> Vec<&'static str> {
    let mut k = Vec::new();
    macro_rules! chk {
        ($($f:ident),*) => { $( if d.$f.is_some() { k.push(stringify!($f)); } )* };
    }
    chk!(
        path,
        fstype,
        source,
        options,
        writable,
        min_free,
        max_used,
        min_free_inodes,
        instance_type,
        cpus,
        sockets,
        cores,
        threads,
        memory_min,
        memory_max,
        memory_tolerance,
        swap_min,
        swap_max,
        count,
        xid,
        xid_ignore,
        max_uncorrected_ecc,
        max_retired_pages,
        max_remapped_rows,
        max_temperature_c,
        fail_on_hw_slowdown,
        nvlink,
        library,
        fabric_manager,
        fabric_manager_program,
        max_rate_per_min,
        libfabric,
        fi_info_program,
        fabric,
        nvidia_smi,
        process,
        full_command_line,
        user,
        running,
        start,
        unit,
        state,
        exists,
        mode,
        owner,
        contains,
        argv,
        exit_status,
        output_matches,
        line
    );
    k
}

/// One check a definition gives: its default name (the definition's `name` replaces it),
/// what it verifies, its timeout, and whether its failure may drain the node at all (an
/// optional mount's never does).
struct Piece {
    name: String,
    kind: CheckKind,
    timeout: Duration,
    may_drain: bool,
}

fn piece(name: String, kind: CheckKind, timeout: Duration) -> Piece {
    Piece {
        name,
        kind,
        timeout,
        may_drain: true,
    }
}

type Built = Vec<Piece>;

/// `min_free`, `max_used` and `min_free_inodes` on `path`.
fn space_limits(d: &Def, path: &str) -> Result<Vec<SpaceSpec>, DefError> {
    let mut space = Vec::new();
    if let Some(s) = &d.min_free {
        space.push(SpaceSpec {
            path: path.to_string(),
            what: SpaceWhat::Free,
            min: Some(parse_space_threshold(s)?),
            max: None,
        });
    }
    if let Some(s) = &d.max_used {
        space.push(SpaceSpec {
            path: path.to_string(),
            what: SpaceWhat::Used,
            min: None,
            max: Some(parse_space_threshold(s)?),
        });
    }
    if let Some(s) = &d.min_free_inodes {
        space.push(SpaceSpec {
            path: path.to_string(),
            what: SpaceWhat::InodesFree,
            min: Some(parse_count_threshold(s)?),
            max: None,
        });
    }
    Ok(space)
}

/// A mount point the agent made: mounted, answering statfs (under the check's timeout),
/// writable unless it is read-only on purpose, and the limits of the definition.
fn own_mount(
    d: &Def,
    path: &str,
    fstype: Option<&str>,
    writable: bool,
) -> Result<CheckKind, DefError> {
    Ok(CheckKind::Mount(MountSpec {
        path: path.to_string(),
        sources: Vec::new(),
        fstypes: fstype.map(Matcher::literal).into_iter().collect(),
        options: Vec::new(),
        alive: true,
        writable,
        space: space_limits(d, path)?,
        actions: Default::default(),
    }))
}

/// `max_rate_per_min`: a table of the EFA driver's error counters
/// ([`RATE_COUNTERS`]) to events per minute, each a number at or above zero.
fn efa_rates(v: Option<&toml::Value>) -> Result<BTreeMap<String, f64>, DefError> {
    let Some(v) = v else {
        return Ok(BTreeMap::new());
    };
    let toml::Value::Table(t) = v else {
        return Err(DefError::BadRateTable { value: v.clone() });
    };
    t.iter()
        .map(|(counter, value)| {
            if !RATE_COUNTERS.contains(&counter.as_str()) {
                return Err(DefError::UnknownCounter {
                    counter: counter.clone(),
                });
            }
            let rate = match value {
                toml::Value::Integer(n) => *n as f64,
                toml::Value::Float(f) => *f,
                _ => f64::NAN,
            };
            if rate.is_nan() || rate < 0.0 || rate.is_infinite() {
                return Err(DefError::BadRate {
                    counter: counter.clone(),
                    value: value.clone(),
                });
            }
            Ok((counter.clone(), rate))
        })
        .collect()
}

fn build(
    kind: &str,
    d: &Def,
    timeout: Duration,
    defaults: &Defaults,
    target: &Target,
) -> Result<Built, DefError> {
    let Some(ok_keys) = allowed(kind) else {
        return Err(DefError::UnknownKind {
            kind: kind.to_string(),
        });
    };
    if let Some(bad) = set_keys(d).into_iter().find(|k| !ok_keys.contains(k)) {
        return Err(DefError::KeyNotForKind {
            key: bad,
            allowed: ok_keys,
        });
    }
    let kind = match kind {
        "space" => {
            let path = req(&d.path, "path")?.clone();
            if !path.starts_with('/') {
                return Err(DefError::NotAbsolute { path });
            }
            let space = space_limits(d, &path)?;
            if space.is_empty() {
                return Err(DefError::NoLimit);
            }
            return Ok(vec![piece(
                format!("space {path}"),
                CheckKind::FreeSpace(FreeSpaceSpec { path, space }),
                timeout,
            )]);
        }
        "agent_mounts" => {
            return target
                .mounts
                .iter()
                .map(|m| {
                    Ok(Piece {
                        name: format!("mount {}", m.mount_point),
                        kind: own_mount(d, &m.mount_point, None, !m.read_only)?,
                        timeout,
                        may_drain: m.required,
                    })
                })
                .collect();
        }
        "scratch" => {
            let Some(s) = target
                .scratch
                .as_ref()
                .filter(|_| target.has_instance_storage())
            else {
                return Ok(Vec::new());
            };
            return Ok(vec![piece(
                format!("scratch {}", s.mount_point),
                own_mount(d, &s.mount_point, Some("btrfs"), true)?,
                timeout,
            )]);
        }
        "start_gate" => {
            let Some(g) = &target.gate else {
                return Ok(Vec::new());
            };
            return Ok(g
                .parts
                .iter()
                .map(|part| {
                    piece(
                        part.clone(),
                        CheckKind::Gate(crate::health::startgate::GateSpec {
                            state_dir: g.state_dir.clone(),
                            part: part.clone(),
                        }),
                        timeout,
                    )
                })
                .collect());
        }
        "auth_key" => {
            let k = &target.key;
            let path = k.path.display().to_string();
            return Ok(vec![piece(
                format!("auth key {path}"),
                CheckKind::AuthKey(KeySpec {
                    path,
                    plugin: k.plugin,
                    owner: k.owner.clone(),
                    min: k.min as u64,
                    max: k.max as u64,
                }),
                timeout,
            )]);
        }
        "mount" => {
            let path = req(&d.path, "path")?.clone();
            let space = space_limits(d, &path)?;
            let mut options: Vec<Matcher> = d
                .options
                .iter()
                .flatten()
                .map(|o| Matcher::mount_option(o))
                .collect();
            let writable = d.writable.unwrap_or(false);
            if writable {
                options.push(Matcher::mount_option("rw"));
            }
            let name = format!("mount {path}");
            return Ok(vec![piece(
                name,
                CheckKind::Mount(MountSpec {
                    path,
                    sources: d
                        .source
                        .as_deref()
                        .map(Matcher::parse)
                        .transpose()?
                        .into_iter()
                        .collect(),
                    fstypes: d
                        .fstype
                        .as_deref()
                        .map(Matcher::parse)
                        .transpose()?
                        .into_iter()
                        .collect(),
                    options,
                    alive: true,
                    writable,
                    space,
                    actions: Default::default(),
                }),
                timeout,
            )]);
        }
        "hardware" => {
            let mut cpu = CpuSpec {
                sockets: d.sockets,
                cores: d.cores,
                threads: d.threads,
                processors: d.cpus,
            };
            let tolerance = d
                .memory_tolerance
                .as_deref()
                .map(parse_space_threshold)
                .transpose()?;
            let mut mem_min = d.memory_min.as_deref().map(parse_size_kib).transpose()?;
            let mut mem_max = d.memory_max.as_deref().map(parse_size_kib).transpose()?;
            if let Some(t) = d.instance_type.as_deref() {
                // "auto" is resolved when the check runs (DMI); a named type now.
                if t != "auto" {
                    let (vcpus, gib) =
                        instance_type_shape(t).ok_or_else(|| DefError::UnknownInstanceType {
                            instance_type: t.to_string(),
                        })?;
                    cpu.processors = cpu.processors.or(Some(vcpus));
                    mem_min = mem_min.or(Some(gib * 1024 * 1024));
                    mem_max = mem_max.or(Some(gib * 1024 * 1024));
                }
            }
            let mut mem = Vec::new();
            if mem_min.is_some() || mem_max.is_some() {
                mem.push(MemSpec {
                    what: MemWhat::Physmem,
                    min: mem_min,
                    max: mem_max,
                    tolerance: tolerance.or(Some(super::units::Threshold::Percent(8.0))),
                });
            }
            let swap_min = d.swap_min.as_deref().map(parse_size_kib).transpose()?;
            let swap_max = d.swap_max.as_deref().map(parse_size_kib).transpose()?;
            if swap_min.is_some() || swap_max.is_some() {
                mem.push(MemSpec {
                    what: MemWhat::Swap,
                    min: swap_min,
                    max: swap_max,
                    tolerance: None,
                });
            }
            let auto = d.instance_type.as_deref() == Some("auto");
            if !auto && cpu == CpuSpec::default() && mem.is_empty() {
                return Err(DefError::NothingToCheck);
            }
            let instance_type_auto =
                auto.then(|| tolerance.unwrap_or(super::units::Threshold::Percent(8.0)));
            let spec = HardwareSpec {
                cpu,
                mem,
                instance_type_auto,
            };
            CheckKind::Hardware(spec)
        }
        "gpu" => {
            let mut s = GpuSpec::default();
            s.count = match &d.count {
                None => GpuCount::Auto,
                Some(toml::Value::String(a)) if a == "auto" => GpuCount::Auto,
                Some(toml::Value::Integer(n)) if *n >= 0 => GpuCount::Exact(*n as u32),
                Some(v) => return Err(DefError::BadCount { value: v.clone() }),
            };
            if let Some(x) = d.xid {
                s.xid = x;
            }
            if let Some(x) = &d.xid_ignore {
                s.xid_ignore = x.clone();
            }
            s.max_uncorrected_ecc = d.max_uncorrected_ecc.or(s.max_uncorrected_ecc);
            s.max_retired_pages = d.max_retired_pages.or(s.max_retired_pages);
            s.max_remapped_rows = d.max_remapped_rows.or(s.max_remapped_rows);
            s.max_temperature_c = d.max_temperature_c;
            s.fail_on_hw_slowdown = d.fail_on_hw_slowdown.unwrap_or(s.fail_on_hw_slowdown);
            s.nvlink = d.nvlink.unwrap_or(false);
            s.library = d.library.clone();
            s.fabric_manager = d.fabric_manager;
            if let Some(p) = &d.fabric_manager_program {
                s.fabric_manager_program = p.clone();
            }
            s.fabric = match &d.fabric {
                None => FabricCheck::Auto,
                Some(toml::Value::String(a)) if a == "auto" => FabricCheck::Auto,
                Some(toml::Value::Boolean(true)) => FabricCheck::On,
                Some(toml::Value::Boolean(false)) => FabricCheck::Off,
                Some(v) => {
                    return Err(DefError::BadValue {
                        key: "fabric",
                        expected: "\"auto\", true or false",
                        value: v.to_string(),
                    })
                }
            };
            if let Some(p) = &d.nvidia_smi {
                if !p.starts_with('/') {
                    return Err(DefError::BadValue {
                        key: "nvidia_smi",
                        expected: "an absolute path",
                        value: toml::Value::String(p.clone()).to_string(),
                    });
                }
                s.nvidia_smi = p.clone();
            }
            CheckKind::Gpu(s)
        }
        "efa" => CheckKind::Efa(EfaSpec {
            count: match &d.count {
                None => EfaCount::Auto,
                Some(toml::Value::String(a)) if a == "auto" => EfaCount::Auto,
                Some(toml::Value::Integer(n)) if *n >= 0 => EfaCount::AtLeast(*n as u32),
                Some(v) => return Err(DefError::BadCount { value: v.clone() }),
            },
            max_rate_per_min: efa_rates(d.max_rate_per_min.as_ref())?,
            fi_info: match (d.libfabric.unwrap_or(false), &d.fi_info_program) {
                (_, Some(p)) if !p.starts_with('/') => {
                    return Err(DefError::RelativeProgram {
                        key: "fi_info_program",
                        path: p.clone(),
                    })
                }
                (true, p) => Some(p.clone().unwrap_or_else(|| FI_INFO_PROGRAM.into())),
                (false, _) => None,
            },
        }),
        "process" => {
            let p = req(&d.process, "process")?;
            CheckKind::Process(ProcessSpec {
                service: p
                    .trim_matches('*')
                    .rsplit('/')
                    .next()
                    .unwrap_or(p)
                    .to_string(),
                pattern: Matcher::parse(p)?,
                on: if d.full_command_line.unwrap_or(false) {
                    MatchOn::Args
                } else {
                    MatchOn::Argv0
                },
                owner: d.user.as_deref().map(Matcher::parse).transpose()?,
                owner_by_uid: false,
                verify: Default::default(),
                command: Vec::new(),
                must_run: d.running.unwrap_or(true),
                action: if d.start.unwrap_or(false) {
                    ServiceAction::Start
                } else {
                    ServiceAction::None
                },
            })
        }
        "unit" => {
            let unit = req(&d.unit, "unit")?.clone();
            crate::systemd::validate_unit_name(&unit).map_err(DefError::BadUnitName)?;
            CheckKind::Unit(UnitSpec {
                unit,
                state: d.state.clone().unwrap_or_else(|| "active".into()),
            })
        }
        "file" => {
            let path = req(&d.path, "path")?.clone();
            let exists = d.exists.unwrap_or(true);
            let mut out: Built = Vec::new();
            if !exists {
                if d.mode.is_some() || d.owner.is_some() || d.contains.is_some() {
                    return Err(DefError::AbsentWithAttributes);
                }
                return Ok(vec![piece(
                    format!("file {path} absent"),
                    CheckKind::FileTest(FileTestSpec {
                        ops: vec!['e'],
                        negate: true,
                        paths: vec![path],
                    }),
                    timeout,
                )]);
            }
            if d.mode.is_some() || d.owner.is_some() {
                let mode = d
                    .mode
                    .as_deref()
                    .map(|m| {
                        u32::from_str_radix(m, 8).map_err(|_| DefError::NotOctal {
                            mode: m.to_string(),
                        })
                    })
                    .transpose()?;
                out.push(piece(
                    format!("file {path}"),
                    CheckKind::FileStat(FileStatSpec {
                        paths: vec![path.clone()],
                        user: d.owner.clone(),
                        mode_is: mode,
                        ..FileStatSpec::default()
                    }),
                    timeout,
                ));
            }
            if let Some(c) = &d.contains {
                out.push(piece(
                    format!("file {path} contents"),
                    CheckKind::FileContents(FileContentsSpec {
                        path: path.clone(),
                        matches: c
                            .iter()
                            .map(|m| Matcher::parse(m))
                            .collect::<Result<_, _>>()?,
                    }),
                    timeout,
                ));
            }
            if out.is_empty() {
                out.push(piece(
                    format!("file {path}"),
                    CheckKind::FileTest(FileTestSpec {
                        ops: vec!['e'],
                        negate: false,
                        paths: vec![path],
                    }),
                    timeout,
                ));
            }
            return Ok(out);
        }
        "command" => {
            let argv = req(&d.argv, "argv")?.clone();
            if argv.is_empty() {
                return Err(DefError::EmptyArgv);
            }
            let name = format!("command {}", argv.join(" "));
            return Ok(vec![piece(
                name,
                CheckKind::Command(CommandSpec {
                    argv,
                    status: d.exit_status.unwrap_or(0),
                    matches: d
                        .output_matches
                        .iter()
                        .flatten()
                        .map(|m| Matcher::parse(m))
                        .collect::<Result<_, _>>()?,
                    check_name: None,
                    messages: Vec::new(),
                }),
                timeout,
            )]);
        }
        "nhc" => {
            let line = req(&d.line, "line")?;
            let text = format!("* || {line}\n");
            let set = super::nhc::parse(
                &text,
                Path::new("inline"),
                Some("*"),
                &Defaults {
                    timeout,
                    slurm_bin_dir: defaults.slurm_bin_dir.clone(),
                },
            )
            .map_err(|e| DefError::NhcLine {
                line: line.clone(),
                problem: e.message,
            })?;
            // In a TOML file a bad NHC line is an error of the file, as every TOML error.
            if let Some(e) = set.checks.iter().find_map(|c| match &c.kind {
                CheckKind::Invalid(e) => Some(e),
                _ => None,
            }) {
                return Err(DefError::NhcLine {
                    line: line.clone(),
                    problem: e.to_string().trim_start_matches("inline:1: ").to_string(),
                });
            }
            if set.checks.is_empty() {
                return Err(DefError::NoCheckInLine { line: line.clone() });
            }
            return Ok(set
                .checks
                .into_iter()
                .map(|c| piece(c.name, c.kind, c.timeout))
                .collect());
        }
        _ => unreachable!("kinds are checked above"),
    };
    let name = match &kind {
        CheckKind::Hardware(_) => "hardware".to_string(),
        CheckKind::Gpu(_) => "gpu".to_string(),
        CheckKind::Efa(_) => "efa".to_string(),
        CheckKind::Process(p) => format!("process {}", p.pattern),
        CheckKind::Unit(u) => format!("unit {}", u.unit),
        k => k.family().to_string(),
    };
    Ok(vec![piece(name, kind, timeout)])
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const D: Defaults = Defaults {
        timeout: Duration::from_secs(10),
        slurm_bin_dir: PathBuf::new(),
    };

    fn p(text: &str) -> Result<CheckSet, ConfigError> {
        parse(
            text,
            Path::new("/etc/slurm-node-agent/checks.d/10-site.toml"),
            &Target::for_node(Some("n1")),
            &D,
        )
    }

    #[test]
    fn every_kind_parses() {
        let set = p(r#"
[[check]]
kind = "mount"
path = "/"
options = ["rw"]
min_free = "1%"
min_free_inodes = "1k"
timeout = "2s"

[[check]]
kind = "hardware"
cpus = 2
memory_min = "512M"

[[check]]
kind = "gpu"
count = 0

[[check]]
kind = "efa"
count = 0
nodes = "{n[1-4]}"

[[check]]
kind = "process"
process = "*munged"
user = "root"

[[check]]
kind = "unit"
unit = "slurmd.service"

[[check]]
kind = "file"
path = "/etc/passwd"
mode = "0644"
contains = ["/^root:/"]

[[check]]
kind = "command"
argv = ["/bin/true"]
name = "true works"
fatal = false

[[check]]
kind = "nhc"
line = "check_fs_free /tmp 1%"

[[check]]
kind = "efa"
nodes = "gpu*"
"#)
        .unwrap();
        let names: Vec<&str> = set.checks.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            vec![
                "mount /",
                "hardware",
                "gpu",
                "efa",
                "process *munged",
                "unit slurmd.service",
                "file /etc/passwd",
                "file /etc/passwd contents",
                "true works",
                "check_fs_free /tmp 1%"
            ]
        );
        assert_eq!(set.checks[0].timeout, Duration::from_secs(2));
        assert_eq!(set.checks[0].origin.line, Some(2));
        assert!(!set.checks[8].fatal);
    }

    /// A file that cannot be read is named alone, `FILE: message`, never `FILE:0:`: in its
    /// error and as the failing check's origin; an nhc.conf that cannot be read too.
    #[test]
    fn a_file_that_cannot_be_read_is_named_without_a_line() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("10-bad.toml");
        std::fs::create_dir(&bad).unwrap();
        let set = load_dir(dir.path(), &Target::for_node(Some("n1")), &D).unwrap();
        assert_eq!(set.checks.len(), 1);
        let c = &set.checks[0];
        assert_eq!(c.origin.to_string(), bad.display().to_string());
        let CheckKind::Invalid(e) = &c.kind else {
            panic!("{:?}", c.kind)
        };
        assert_eq!(e.line, None);
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("{}: cannot read: ", bad.display())),
            "{text}"
        );
        let missing = dir.path().join("nhc.conf");
        let e = crate::health::nhc::load_file(&missing, Some("n1"), &D).unwrap_err();
        assert!(
            e.to_string()
                .starts_with(&format!("{}: cannot read: ", missing.display())),
            "{e}"
        );
        // A line where there is one.
        let e = p("[[check]]\nkind = \"mount\"\nfstyp = \"x\"\n").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/etc/slurm-node-agent/checks.d/10-site.toml:3: "),
            "{e}"
        );
    }

    #[test]
    fn errors_name_the_line() {
        let e = p("[[check]]\nkind = \"mount\"\npath = \"/\"\n\n[[check]]\nkind = \"mount\"\nfstyp = \"x\"\n").unwrap_err();
        assert_eq!(e.line, Some(7), "{e}");
        assert!(e.to_string().contains("fstyp"), "{e}");
        let e = p("[[check]]\nkind = \"mount\"\npath = \"/\"\n\n[[check]]\nkind = \"mount\"\nunit = \"x\"\n").unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
        assert!(e.to_string().contains("does not apply"), "{e}");
        let e = p("[[check]]\nkind = \"teleport\"\n").unwrap_err();
        assert!(e.to_string().contains("unknown kind"), "{e}");
        let e = p("[[check]]\nkind = \"mount\"\npath = \"/\"\nmin_free = \"lots\"\n").unwrap_err();
        assert!(e.to_string().contains("invalid size"), "{e}");
        let e = p("[[check]\nkind = 1\n").unwrap_err();
        assert_eq!(e.line, Some(1), "{e}");
        let e = p("[[check]]\nkind = \"nhc\"\nline = \"check_unknown_thing\"\n").unwrap_err();
        assert!(e.to_string().contains("unsupported NHC check"), "{e}");
        let e = p("[[check]]\nkind = \"unit\"\nunit = \"a b\"\n").unwrap_err();
        assert!(e.to_string().contains("unit"), "{e}");
    }
}
