//! Processes and load (NHC's `check_ps_service`, `check_ps_daemon`,
//! `check_ps_blacklist`, `check_ps_loadavg`), from `/proc` without running `ps`.

use super::{Checked, Failed};
use crate::health::facts::{Facts, FactsError, ProcEntry};
use crate::health::matcher::Matcher;

/// What part of a process a [`ProcessSpec`] pattern is matched against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchOn {
    /// The first word of the command line (`check_ps_service` default).
    Argv0,
    /// The whole command line (`check_ps_service -f`, daemon, blacklist).
    Args,
}

/// What to do through systemd when a required service is not running (NHC's `-S`, `-r`,
/// `-c`): start, restart or stop-then-start `<service>.service`. The check still fails
/// for this run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceAction {
    /// Nothing.
    None,
    /// Start the unit.
    Start,
    /// Restart the unit.
    Restart,
    /// Stop then start.
    Cycle,
    /// `-s`: a process that must not run is found: stop the unit.
    Stop,
    /// `-k`: a process that must not run is found: SIGKILL each matching process.
    Kill,
    /// `-e`: a required process is missing: run [`ProcessSpec::command`].
    Command,
    /// `-E`: a process that must not run is found: run [`ProcessSpec::command`].
    CommandWhenFound,
}

impl ServiceAction {
    /// The action in words, for messages: `start`, `restart`, `stop then start`, `stop`,
    /// `SIGKILL`, `run` (`none` for [`ServiceAction::None`]).
    pub fn verb(self) -> &'static str {
        match self {
            ServiceAction::None => "none",
            ServiceAction::Start => "start",
            ServiceAction::Restart => "restart",
            ServiceAction::Cycle => "stop then start",
            ServiceAction::Stop => "stop",
            ServiceAction::Kill => "SIGKILL",
            ServiceAction::Command | ServiceAction::CommandWhenFound => "run",
        }
    }
}

/// NHC's `-v` / `-V` on `check_ps_service`: whether a recovery action that worked makes
/// the check pass for this run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Verify {
    /// The check fails for this run whatever the action did (NHC: "in progress").
    #[default]
    None,
    /// `-v`: pass when the action's systemd job completed successfully.
    Sync,
    /// `-V`: pass when, after the action, the unit is active (NHC runs
    /// `service <name> status`).
    Check,
}

/// A process that must (or must not) run.
#[derive(Debug, Clone)]
pub struct ProcessSpec {
    /// Name used in messages and for the systemd unit (`munged`).
    pub service: String,
    /// Pattern.
    pub pattern: Matcher,
    /// Matched against.
    pub on: MatchOn,
    /// Owner's user name must match (or its uid, when `owner_by_uid`). A process whose
    /// uid has no name in the passwd file is owned by its decimal uid, as `ps` shows it.
    pub owner: Option<Matcher>,
    /// `owner` is a plain decimal uid (`check_ps_service -u 0`: NHC turns it into that
    /// uid's user name). Anything else, `!0` included, is matched against the user name
    /// as NHC does, so `-u '!0'` excludes only a user named `0`.
    pub owner_by_uid: bool,
    /// Must run (`true`) or must not run (`false`).
    pub must_run: bool,
    /// Recovery action when a required process is missing.
    pub action: ServiceAction,
    /// Whether a successful action makes the check pass.
    pub verify: Verify,
    /// The program and arguments of `-e`/`-E`, run directly (never through a shell).
    pub command: Vec<String>,
}

/// Load average limits (1, 5, 15 minutes): fails when the integer part reaches a limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadAvgSpec {
    /// Limits.
    pub limits: [Option<u64>; 3],
}

fn matches_proc(spec: &ProcessSpec, p: &ProcEntry, facts: &Facts) -> bool {
    let hit = match spec.on {
        MatchOn::Argv0 => {
            let argv0 = p.argv0();
            // Better than NHC: a daemon that rewrote its title to `name: what it
            // does` (sshd, postfix's master, ...) is still `name`.
            spec.pattern.matches(argv0)
                || argv0
                    .strip_suffix(':')
                    .is_some_and(|name| !name.is_empty() && spec.pattern.matches(name))
        }
        MatchOn::Args => spec.pattern.matches(&p.args),
    };
    if !hit {
        return false;
    }
    if let Some(o) = &spec.owner {
        let Some(uid) = p.uid(&facts.host.proc_dir) else {
            return false;
        };
        let who = if spec.owner_by_uid {
            uid.to_string()
        } else {
            facts.user_name(uid)
        };
        if !o.matches(&who) {
            return false;
        }
    }
    true
}

fn find<'a>(spec: &ProcessSpec, facts: &'a Facts) -> Result<Option<&'a ProcEntry>, FactsError> {
    Ok(facts.procs()?.iter().find(|p| matches_proc(spec, p, facts)))
}

/// The PIDs of the processes the spec matches (pattern and owner), in `/proc` order.
///
/// # Errors
/// [`FactsError`]: `/proc` could not be read.
pub fn matching_pids(spec: &ProcessSpec, facts: &Facts) -> Result<Vec<u32>, FactsError> {
    let procs = facts.procs()?;
    let mut out = Vec::new();
    for p in procs {
        if matches_proc(spec, p, facts) {
            out.push(p.pid);
        }
    }
    Ok(out)
}

/// Runs a process check.
///
/// # Errors
/// [`Failed`]: what is wrong, in NHC's words.
pub fn check_process(spec: &ProcessSpec, facts: &Facts) -> Result<String, Failed> {
    let failed = |m: String| Failed::new(Checked::Process(spec.service.clone()), m);
    let owner = spec
        .owner
        .as_ref()
        .map(|o| format!(" owned by {o}"))
        .unwrap_or_default();
    match (find(spec, facts)?, spec.must_run) {
        (Some(p), true) => Ok(format!(
            "{} running (pid {}: {})",
            spec.service,
            p.pid,
            truncate(&p.args, 80)
        )),
        (None, true) => Err(failed(format!(
            "service {} (process {}){owner} not running",
            spec.service, spec.pattern
        ))),
        (Some(p), false) => Err(failed(format!(
            "process {}{owner} running (pid {}: {})",
            spec.pattern,
            p.pid,
            truncate(&p.args, 80)
        ))),
        (None, false) => Ok(format!("no process {}{owner}", spec.pattern)),
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}...", s.chars().take(n).collect::<String>())
    }
}

/// Runs a load average check.
///
/// # Errors
/// [`Failed`]: what is wrong, in NHC's words.
pub fn check_loadavg(spec: &LoadAvgSpec, facts: &Facts) -> Result<String, Failed> {
    let failed = |m: String| Failed::new(Checked::LoadAvg, m);
    let l = facts.loadavg()?;
    for (i, minutes) in [1, 5, 15].iter().enumerate() {
        if let Some(limit) = spec.limits[i] {
            let v = l[i].trunc() as u64;
            if v >= limit {
                return Err(failed(format!(
                    "{minutes}-minute load average too high: {} >= {limit}",
                    l[i]
                )));
            }
        }
    }
    Ok(format!("load average {} {} {}", l[0], l[1], l[2]))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::health::facts::Host;

    #[test]
    fn finds_init_and_not_a_ghost() {
        let f = Facts::new(Host::default());
        let pid1 = f
            .procs()
            .unwrap()
            .iter()
            .find(|p| p.pid == 1)
            .unwrap()
            .clone();
        let name = pid1.argv0().rsplit('/').next().unwrap().to_string();
        let spec = ProcessSpec {
            service: name.clone(),
            pattern: Matcher::parse(&format!("*{name}")).unwrap(),
            on: MatchOn::Argv0,
            owner: Some(Matcher::parse("root").unwrap()),
            owner_by_uid: false,
            must_run: true,
            action: ServiceAction::None,
            verify: Verify::None,
            command: Vec::new(),
        };
        check_process(&spec, &f).unwrap();
        let ghost = ProcessSpec {
            pattern: Matcher::parse("*no-such-process-xyzzy*").unwrap(),
            on: MatchOn::Args,
            ..spec.clone()
        };
        assert!(check_process(&ghost, &f).is_err());
        let blacklist = ProcessSpec {
            must_run: false,
            ..ghost
        };
        assert!(check_process(&blacklist, &f).is_ok());
        let wrong_owner = ProcessSpec {
            owner: Some(Matcher::parse("!root").unwrap()),
            ..spec
        };
        assert!(check_process(&wrong_owner, &f).is_err());
    }

    #[test]
    fn loadavg_limits() {
        let f = Facts::new(Host::default());
        assert!(check_loadavg(
            &LoadAvgSpec {
                limits: [Some(100_000), None, None]
            },
            &f
        )
        .is_ok());
        assert!(check_loadavg(
            &LoadAvgSpec {
                limits: [Some(0), None, None]
            },
            &f
        )
        .is_err());
    }
}
