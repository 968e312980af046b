//! Per-process resources and owners (NHC's `check_ps_cpu`, `check_ps_mem`,
//! `check_ps_physmem`, `check_ps_time`, `check_ps_kswapd`, `check_ps_unauth_users`,
//! `check_ps_userproc_lineage`), from `/proc` with the figures `ps axo
//! uid,ppid,pcpu,pmem,rss,vsz,bsdtime` shows, without running `ps`.
//!
//! Evaluation reads the host and returns the verdict with the actions it asks for
//! (SIGKILL, renice, a program); the engine performs them unless the run is report-only.

use std::path::{Path, PathBuf};

use super::{Checked, Failed};
use crate::health::facts::{Facts, FactsError, HostIo, HostOp, ProcEntry};
use crate::health::matcher::Matcher;

/// Clock ticks per second of `/proc/<pid>/stat` times: the kernel reports them in
/// USER_HZ, which is 100 on every architecture the agent is built for (x86_64, aarch64).
const USER_HZ: u64 = 100;

/// The figures of one process, as `ps` computes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProcStat {
    /// Effective user id.
    pub uid: u32,
    /// Parent process id (0 for the kernel's own).
    pub ppid: u32,
    /// CPU use over the process's life, in tenths of a percent (`ps -o pcpu`).
    pub pcpu_tenths: u64,
    /// Resident memory as tenths of a percent of MemTotal (`ps -o pmem`).
    pub pmem_tenths: u64,
    /// Resident set size, KiB (`ps -o rss`).
    pub rss_kib: u64,
    /// Virtual size, KiB (`ps -o vsz`).
    pub vsz_kib: u64,
    /// User plus system CPU time, whole seconds (`ps -o bsdtime` as `M:SS`).
    pub cpu_secs: u64,
}

/// Reads `/proc/<pid>/status` and `/proc/<pid>/stat`; `None` when the process is gone.
/// `mem_total_kib` and `uptime_secs` scale `pmem` and `pcpu`.
pub fn proc_stat(
    proc_dir: &Path,
    pid: u32,
    mem_total_kib: u64,
    uptime_secs: u64,
) -> Option<ProcStat> {
    let dir = proc_dir.join(pid.to_string());
    let status = std::fs::read_to_string(dir.join("status")).ok()?;
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    let mut s = ProcStat::default();
    let field = |l: &str, k: &str| -> Option<u64> {
        l.strip_prefix(k)?.split_whitespace().next()?.parse().ok()
    };
    for l in status.lines() {
        if let Some(rest) = l.strip_prefix("Uid:") {
            // real, effective, saved, fs: ps's `uid` is the effective one.
            s.uid = rest.split_whitespace().nth(1)?.parse().ok()?;
        } else if let Some(v) = field(l, "PPid:") {
            s.ppid = u32::try_from(v).ok()?;
        } else if let Some(v) = field(l, "VmRSS:") {
            s.rss_kib = v;
        } else if let Some(v) = field(l, "VmSize:") {
            s.vsz_kib = v;
        }
    }
    // Fields after the command name (which may hold spaces and parentheses): state is
    // field 3, utime 14, stime 15, starttime 22.
    let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let num = |n: usize| rest.get(n - 3).and_then(|v| v.parse::<u64>().ok());
    let ticks = num(14)? + num(15)?;
    let start_secs = num(22)? / USER_HZ;
    s.cpu_secs = ticks / USER_HZ;
    let life = uptime_secs.saturating_sub(start_secs);
    // ps shows 0 for a process younger than a second, and without MemTotal.
    s.pcpu_tenths = (ticks * 1000 / USER_HZ).checked_div(life).unwrap_or(0);
    s.pmem_tenths = (s.rss_kib * 1000).checked_div(mem_total_kib).unwrap_or(0);
    Some(s)
}

/// Seconds since boot (`/proc/uptime`).
fn uptime(proc_dir: &Path) -> Result<u64, FactsError> {
    let p = proc_dir.join("uptime");
    let t = std::fs::read_to_string(&p).map_err(|e| HostIo::new(HostOp::Read, &p, e))?;
    match t.split(['.', ' ']).next().and_then(|v| v.parse().ok()) {
        Some(v) => Ok(v),
        None => Err(FactsError::Unexpected {
            path: p,
            content: t,
        }),
    }
}

/// Where the highest system uid comes from (NHC's `MAX_SYS_UID`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysUids {
    /// Set in the configuration (`MAX_SYS_UID=`).
    pub fixed: Option<u32>,
    /// Otherwise read from this file (NHC's `LOGIN_DEFS_SRC`, `/etc/login.defs`).
    pub login_defs: PathBuf,
}

impl SysUids {
    /// NHC's `nhc_common_get_max_sys_uid`: `SYS_UID_MAX`, else `UID_MIN - 1`, from lines
    /// that start with those names; 99 when neither is there or the result is not
    /// positive.
    pub fn max(&self) -> u32 {
        if let Some(n) = self.fixed {
            return n;
        }
        let Ok(text) = std::fs::read_to_string(&self.login_defs) else {
            return 99;
        };
        let digits = |l: &str| -> Option<i64> {
            let d: String = l.chars().filter(char::is_ascii_digit).collect();
            d.parse().ok()
        };
        let (mut uid_min, mut sys_max) = (None, None);
        for l in text.lines() {
            if l.starts_with("UID_MIN") {
                uid_min = digits(l);
            } else if l.starts_with("SYS_UID_MAX") {
                sys_max = digits(l);
                break;
            }
        }
        let n = match (sys_max, uid_min) {
            (Some(s), _) => s,
            (None, Some(u)) => u - 1,
            (None, None) => 99,
        };
        u32::try_from(n).ok().filter(|n| *n > 0).unwrap_or(99)
    }
}

/// The resource a [`ResourceSpec`] limits, and the limit. A process fails when it
/// reaches the limit (NHC: "less than the limit" passes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// `check_ps_cpu`: whole percent of one CPU.
    CpuPercent(u64),
    /// `check_ps_mem`: virtual size, KiB.
    VszKib(u64),
    /// `check_ps_physmem N%`: whole percent of RAM.
    MemPercent(u64),
    /// `check_ps_physmem SIZE`: resident set size, KiB.
    RssKib(u64),
    /// `check_ps_time`: CPU time, seconds.
    CpuSecs(u64),
}

impl std::fmt::Display for Resource {
    /// The limit in words: `50% CPU`, `1 GB memory (RAM+swap)`, `10% RAM`, `512 MB RAM`,
    /// `1m30s of CPU time`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Resource::CpuPercent(l) => write!(f, "{l}% CPU"),
            Resource::VszKib(l) => write!(f, "{} memory (RAM+swap)", unparse_kib(*l)),
            Resource::MemPercent(l) => write!(f, "{l}% RAM"),
            Resource::RssKib(l) => write!(f, "{} RAM", unparse_kib(*l)),
            Resource::CpuSecs(l) => write!(f, "{}m{}s of CPU time", l / 60, l % 60),
        }
    }
}

/// NHC's `check_ps_cpu/mem/physmem/time`: no process (of a non-system user unless
/// `all_users`) matching `pattern` and `owner` may reach the limit.
#[derive(Debug, Clone)]
pub struct ResourceSpec {
    /// The NHC function, for messages.
    pub check: String,
    /// What is limited.
    pub resource: Resource,
    /// `-m`: expression over the first word of the command line (`-f`: all of it).
    pub pattern: Matcher,
    /// `-f`.
    pub full: bool,
    /// `-u`: the owner's user name must match (uid when `owner_by_uid`).
    pub owner: Option<Matcher>,
    /// `-u` was a plain decimal uid.
    pub owner_by_uid: bool,
    /// `-A`: processes of system users too.
    pub all_users: bool,
    /// `-a`: every offending process, not only the first.
    pub all: bool,
    /// System users' limit.
    pub sys_uids: SysUids,
    /// `-k`: SIGKILL each offending process.
    pub kill: bool,
    /// `-K`: SIGKILL its parent (not PID 1, same owner only).
    pub kill_parent: bool,
    /// `-r`: renice it by this much (when not killed).
    pub renice: Option<i32>,
    /// `-e`: run this program (no shell) per offending process.
    pub command: Vec<String>,
}

/// What a check asks the engine to do to processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// SIGKILL this process.
    Kill(u32),
    /// Set this process's nice value (`renice -n N PID`).
    Renice(u32, i32),
    /// Run this program with these arguments (no shell).
    Run(Vec<String>),
}

/// A check's verdict and the actions it asks for.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// Pass message, or why the check failed.
    pub result: Result<String, Failed>,
    /// To do, in order, unless the run is report-only.
    pub actions: Vec<Action>,
}

fn user_of(facts: &Facts, uid: u32) -> String {
    facts.user_name(uid)
}

fn unparse_kib(kib: u64) -> String {
    crate::health::units::human_kib(kib)
}

/// Evaluates a resource check over the process table.
///
/// # Errors
/// `/proc` could not be read.
pub fn eval_resource(spec: &ResourceSpec, facts: &Facts) -> Result<Verdict, Failed> {
    let failed = |m: String| Failed::new(Checked::Processes(spec.check.clone()), m);
    let procs = facts.procs()?;
    let mem_total = facts.mem().map(|m| m.ram_total).unwrap_or(0);
    let up = uptime(&facts.host.proc_dir)?;
    let max_sys = spec.sys_uids.max();
    let mut msgs = Vec::new();
    let mut actions = Vec::new();
    for p in procs {
        let Some(st) = proc_stat(&facts.host.proc_dir, p.pid, mem_total, up) else {
            continue;
        };
        if !spec.all_users && st.uid <= max_sys {
            continue;
        }
        let prog = if spec.full {
            p.args.as_str()
        } else {
            p.argv0()
        };
        if !spec.pattern.matches(prog) {
            continue;
        }
        let user = user_of(facts, st.uid);
        if let Some(o) = &spec.owner {
            let who = if spec.owner_by_uid {
                st.uid.to_string()
            } else {
                user.clone()
            };
            if !o.matches(&who) {
                continue;
            }
        }
        let head = format!("{}: Process \"{prog}\" ({}) of {user}", spec.check, p.pid);
        let mut msg = match spec.resource {
            Resource::CpuPercent(l) if st.pcpu_tenths / 10 >= l => format!(
                "{head} using {}.{}% CPU (limit {l}%)",
                st.pcpu_tenths / 10,
                st.pcpu_tenths % 10
            ),
            Resource::MemPercent(l) if st.pmem_tenths / 10 >= l => format!(
                "{head} using {}.{}% RAM (limit {l}%)",
                st.pmem_tenths / 10,
                st.pmem_tenths % 10
            ),
            Resource::RssKib(l) if st.rss_kib >= l => format!(
                "{head} using {} RAM (limit {})",
                unparse_kib(st.rss_kib),
                unparse_kib(l)
            ),
            Resource::VszKib(l) if st.vsz_kib >= l => format!(
                "{head} using {} memory (RAM+swap) (limit {})",
                unparse_kib(st.vsz_kib),
                unparse_kib(l)
            ),
            Resource::CpuSecs(l) if st.cpu_secs >= l => format!(
                "{head} has consumed {}:{:02} of CPU time (limit {}m{}s)",
                st.cpu_secs / 60,
                st.cpu_secs % 60,
                l / 60,
                l % 60
            ),
            _ => continue,
        };
        // The actions are only asked for here: the engine says what it did with each
        // (or that a report-only run did not attempt it).
        if !spec.command.is_empty() {
            actions.push(Action::Run(spec.command.clone()));
        }
        if spec.kill {
            actions.push(Action::Kill(p.pid));
        } else if let Some(n) = spec.renice {
            actions.push(Action::Renice(p.pid, n));
        }
        if spec.kill_parent {
            let parent_uid = proc_stat(&facts.host.proc_dir, st.ppid, mem_total, up).map(|s| s.uid);
            if st.ppid == 1 {
                msg.push_str("; parent 1 not killed (PPID is 1)");
            } else if parent_uid != Some(st.uid) {
                msg.push_str(&format!("; parent {} not killed (owner mismatch)", st.ppid));
            } else {
                actions.push(Action::Kill(st.ppid));
            }
        }
        msgs.push(msg);
        if !spec.all {
            break;
        }
    }
    let result = match msgs.len() {
        0 => Ok(format!(
            "no matching process over the limit ({})",
            spec.resource
        )),
        1 if !spec.all => Err(failed(msgs.remove(0))),
        n => Err(failed(format!("{} (last of {n})", msgs[n - 1]))),
    };
    Ok(Verdict { result, actions })
}

/// What NHC's `check_ps_unauth_users` / `check_ps_userproc_lineage` do with an offending
/// process, in order (`log`, `syslog`, `die`, `kill`, `ignore`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UserAction {
    /// Note it (the check's message).
    Log,
    /// Fail the check with this process (and look no further).
    Die,
    /// SIGKILL it when its uid is above the system range.
    Kill,
    /// Stop taking actions for this process.
    Ignore,
}

/// Which processes are offending.
#[derive(Debug, Clone)]
pub enum UsersRule {
    /// `check_ps_unauth_users`: owned by a non-system user that is neither in
    /// `auth_users` nor running a job here.
    Unauthorized,
    /// `check_ps_userproc_lineage`: a non-system process (of a user not named in
    /// `auth_users`) that is neither the resource manager's daemon nor below it.
    Lineage {
        /// Expression over the command line of the daemon (NHC's `RM_DAEMON_MATCH`,
        /// `/\bslurmstepd\b/` for Slurm).
        daemon: Matcher,
    },
}

/// NHC's `check_ps_unauth_users` / `check_ps_userproc_lineage`.
#[derive(Debug, Clone)]
pub struct UsersSpec {
    /// Which rule.
    pub rule: UsersRule,
    /// NHC's `-c`, `-u`, `-n`, `-p` values, each list joined with a leading space as NHC
    /// does: a process is skipped when its first word, uid, user or PID is a substring
    /// of the list (NHC's `[[ $IGNORE == *"$X"* ]]`).
    pub ignore_cmd: String,
    /// `-u`.
    pub ignore_uid: String,
    /// `-n`.
    pub ignore_user: String,
    /// `-p`.
    pub ignore_pid: String,
    /// Users always allowed (NHC's `NHC_AUTH_USERS`, default `root nobody`).
    pub auth_users: String,
    /// Users with jobs here come from this command (NHC: `squeue -w $HOSTNAME_S
    /// --noheader -o %u`); only for [`UsersRule::Unauthorized`].
    pub jobs_command: Vec<String>,
    /// System users' limit.
    pub sys_uids: SysUids,
    /// Actions per offending process.
    pub actions: Vec<UserAction>,
}

/// An NHC action word that is not one of those the check takes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown action {word:?} (log, syslog, die{}, ignore)", if *.kill_allowed { ", kill" } else { "" })]
pub struct UnknownAction {
    /// The word.
    pub word: String,
    /// Whether the check takes `kill`.
    pub kill_allowed: bool,
}

/// Parses NHC's action words.
///
/// # Errors
/// [`UnknownAction`].
pub fn parse_user_actions(
    words: &[String],
    kill_allowed: bool,
) -> Result<Vec<UserAction>, UnknownAction> {
    if words.is_empty() {
        return Ok(vec![UserAction::Die]);
    }
    words
        .iter()
        .map(|w| match w.as_str() {
            "log" | "syslog" => Ok(UserAction::Log),
            "die" => Ok(UserAction::Die),
            "kill" if kill_allowed => Ok(UserAction::Kill),
            "ignore" => Ok(UserAction::Ignore),
            o => Err(UnknownAction {
                word: o.to_string(),
                kill_allowed,
            }),
        })
        .collect()
}

/// Evaluates an owner check; `job_users` are the users running jobs on this node.
///
/// # Errors
/// `/proc` could not be read.
pub fn eval_users(
    spec: &UsersSpec,
    facts: &Facts,
    job_users: &[String],
) -> Result<Verdict, Failed> {
    let procs = facts.procs()?;
    let max_sys = spec.sys_uids.max();
    let auth: Vec<&str> = spec.auth_users.split_whitespace().collect();
    let mut notes = Vec::new();
    let mut actions = Vec::new();
    for p in procs {
        let Some(st) = proc_stat(&facts.host.proc_dir, p.pid, 0, 0) else {
            continue;
        };
        let user = user_of(facts, st.uid);
        let cmd = p.argv0();
        if spec.ignore_cmd.contains(cmd)
            || spec.ignore_uid.contains(&st.uid.to_string())
            || spec.ignore_user.contains(&user)
            || spec.ignore_pid.contains(&p.pid.to_string())
        {
            continue;
        }
        if st.uid <= max_sys {
            continue;
        }
        let what = match &spec.rule {
            UsersRule::Unauthorized => {
                if auth.contains(&user.as_str()) || job_users.contains(&user) {
                    continue;
                }
                "unauthorized"
            }
            UsersRule::Lineage { daemon } => {
                if names_word(&spec.auth_users, &user)
                    || daemon.matches(cmd)
                    || below(facts, p.pid, daemon)
                {
                    continue;
                }
                "rogue"
            }
        };
        let fn_name = match spec.rule {
            UsersRule::Unauthorized => "check_ps_unauth_users",
            UsersRule::Lineage { .. } => "check_ps_userproc_lineage",
        };
        let msg = format!(
            "{fn_name}: {user}'s \"{cmd}\" process is {what}. (PID {})",
            p.pid
        );
        let mut noted = false;
        for a in &spec.actions {
            match a {
                // `log` and `syslog` both mean "note it": once per process.
                UserAction::Log if noted => {}
                UserAction::Log => {
                    notes.push(msg.clone());
                    noted = true;
                }
                UserAction::Die => {
                    return Ok(Verdict {
                        result: Err(Failed::new(Checked::Processes(fn_name.to_string()), msg)),
                        actions,
                    })
                }
                UserAction::Kill => actions.push(Action::Kill(p.pid)),
                UserAction::Ignore => break,
            }
        }
    }
    let result = if notes.is_empty() {
        Ok("no offending user process".to_string())
    } else {
        Ok(format!("{} (logged only)", notes.join("; ")))
    };
    Ok(Verdict { result, actions })
}

/// Whether `word` appears in `list` between non-alphanumeric characters (or the ends):
/// NHC's `/(^|[^A-Za-z0-9])$USER($|[^A-Za-z0-9])/` over `NHC_AUTH_USERS`.
fn names_word(list: &str, word: &str) -> bool {
    if word.is_empty() {
        return false;
    }
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    list.match_indices(word).any(|(i, _)| {
        !alnum(list[..i].chars().next_back()) && !alnum(list[i + word.len()..].chars().next())
    })
}

/// NHC's `nhc_ps_pid_lineage`: whether an ancestor's command line (up to and including
/// PID 1) matches `daemon`.
fn below(facts: &Facts, pid: u32, daemon: &Matcher) -> bool {
    let procs = facts.procs().unwrap_or(&[]);
    let args = |pid: u32| -> Option<&ProcEntry> {
        procs
            .binary_search_by_key(&pid, |p| p.pid)
            .ok()
            .map(|i| &procs[i])
    };
    let mut cur = pid;
    let mut seen = 0;
    while cur != 1 && seen < 4096 {
        seen += 1;
        let Some(st) = proc_stat(&facts.host.proc_dir, cur, 0, 0) else {
            return false;
        };
        if st.ppid == 0 {
            return false;
        }
        cur = st.ppid;
        if args(cur).is_some_and(|p| daemon.matches(&p.args)) {
            return true;
        }
    }
    false
}

/// NHC's `check_ps_kswapd THRESHOLD DISCREPANCY [actions]`: the CPU time of the kswapd
/// threads (processes whose command line holds `kswapd`), one per NUMA node, must be
/// balanced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KswapdSpec {
    /// Seconds of CPU time any one may use.
    pub threshold: i64,
    /// Largest allowed ratio of the highest to the lowest time.
    pub discrepancy: i64,
    /// `log`, `syslog`, `die`, `ignore`.
    pub actions: Vec<UserAction>,
}

/// Evaluates a kswapd check: imbalanced when one is above the threshold, or the least
/// is 0 and the most above half the threshold, or most/least (integer) is above the
/// discrepancy. One kswapd (one NUMA node) always passes.
///
/// # Errors
/// `/proc` could not be read.
pub fn eval_kswapd(spec: &KswapdSpec, facts: &Facts) -> Result<Verdict, Failed> {
    let mut found = Vec::new();
    for p in facts.procs()? {
        if !p.args.contains("kswapd") {
            continue;
        }
        if let Some(st) = proc_stat(&facts.host.proc_dir, p.pid, 0, 0) {
            found.push((p.pid, i64::try_from(st.cpu_secs).unwrap_or(i64::MAX)));
        }
    }
    let pids = found
        .iter()
        .map(|(p, _)| p.to_string())
        .collect::<Vec<_>>()
        .join(" ");
    let ok = |m: String| {
        Ok(Verdict {
            result: Ok(m),
            actions: Vec::new(),
        })
    };
    if found.len() == 1 {
        return ok("one kswapd (one NUMA node)".into());
    }
    let over = found.iter().any(|(_, t)| *t > spec.threshold);
    let min = found.iter().map(|(_, t)| *t).min().unwrap_or(0);
    let max = found.iter().map(|(_, t)| *t).max().unwrap_or(0);
    let imbalance = over
        || (min == 0 && max > spec.threshold / 2)
        || (min != 0 && max / min > spec.discrepancy);
    if !imbalance {
        return ok(format!(
            "kswapd CPU times balanced (PIDs {pids}: {min}-{max} s)"
        ));
    }
    let msg = format!("check_ps_kswapd: NUMA imbalance detected among PIDs {pids}.");
    for a in &spec.actions {
        match a {
            UserAction::Die => {
                return Ok(Verdict {
                    result: Err(Failed::new(
                        Checked::Processes("check_ps_kswapd".into()),
                        msg,
                    )),
                    actions: Vec::new(),
                })
            }
            UserAction::Ignore => break,
            UserAction::Log | UserAction::Kill => {}
        }
    }
    ok(format!("{msg} (logged only)"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn max_sys_uid_as_nhc_reads_login_defs() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("login.defs");
        let s = SysUids {
            fixed: None,
            login_defs: f.clone(),
        };
        assert_eq!(s.max(), 99);
        std::fs::write(&f, "#SYS_UID_MAX 5\nUID_MIN\t\t 1000\n").unwrap();
        assert_eq!(s.max(), 999);
        std::fs::write(&f, "UID_MIN 1000\nSYS_UID_MAX 499\n").unwrap();
        assert_eq!(s.max(), 499);
        std::fs::write(&f, "UID_MIN 1\n").unwrap();
        assert_eq!(s.max(), 99);
        assert_eq!(
            SysUids {
                fixed: Some(7),
                login_defs: f
            }
            .max(),
            7
        );
    }

    #[test]
    fn auth_users_as_words() {
        assert!(names_word("root nobody", "root"));
        assert!(names_word("root,alice", "alice"));
        assert!(!names_word("root nobody", "body"));
        assert!(!names_word("alice2", "alice"));
        assert!(names_word("x-alice-y", "alice"));
    }

    #[test]
    fn own_process_figures() {
        let st = proc_stat(Path::new("/proc"), std::process::id(), 1 << 30, 1 << 40).unwrap();
        assert!(st.rss_kib > 0 && st.vsz_kib >= st.rss_kib, "{st:?}");
        assert!(st.ppid > 0);
    }
}
