//! NHC's `lbnl_ps.nhc` functions translated to the engine's checks: check_ps_service, check_ps_daemon, check_ps_blacklist, check_ps_loadavg, check_ps_cpu/mem/physmem/time, check_ps_unauth_users, check_ps_userproc_lineage, check_ps_kswapd.

use super::*;

/// `check_ps_service`.
pub(super) fn service(_name: &str, args: &[String], cx: &Cx) -> Result<Built, NhcError> {
    let timeout = cx.timeout;
    ps_service(args, timeout)
}

/// `check_ps_daemon` / `check_ps_blacklist`.
pub(super) fn daemon(name: &str, args: &[String], cx: &Cx) -> Result<Built, NhcError> {
    let timeout = cx.timeout;
    too_many(args, 3)?;
    let daemon = need(args, 0, "process name")?;
    let full = match arg(args, 2) {
        Some(a) => format!("{daemon} {a}"),
        None => daemon.to_string(),
    };
    let blacklist = name == "check_ps_blacklist";
    // NHC compares the owner with the process's user name: as a match expression
    // for the blacklist, as a plain string for the daemon (so a numeric owner such
    // as `0` never matches a user that has a name).
    let owner = match arg(args, 1) {
        None => None,
        Some(o) if blacklist => Some(matcher(o)?),
        Some(o) => Some(Matcher::literal(o)),
    };
    let owner_by_uid = false;
    Ok(one(
        CheckKind::Process(ProcessSpec {
            service: daemon.to_string(),
            pattern: Matcher::parse(&format!("*{full}*"))?,
            on: MatchOn::Args,
            owner,
            owner_by_uid,
            must_run: !blacklist,
            action: ServiceAction::None,
            verify: Verify::None,
            command: Vec::new(),
        }),
        timeout,
    ))
}

/// `check_ps_loadavg`.
pub(super) fn loadavg(_name: &str, args: &[String], cx: &Cx) -> Result<Built, NhcError> {
    let timeout = cx.timeout;
    too_many(args, 3)?;
    let mut limits = [None; 3];
    for (i, l) in limits.iter_mut().enumerate() {
        *l = arg(args, i)
            .map(|s| {
                s.parse::<u64>().map_err(|_| NhcError::NotAWholeNumber {
                    value: s.to_string(),
                })
            })
            .transpose()?;
    }
    if limits.iter().all(Option::is_none) {
        return Err(NhcError::NoLoadLimit);
    }
    Ok(one(CheckKind::LoadAvg(LoadAvgSpec { limits }), timeout))
}

fn ps_service(args: &[String], timeout: Duration) -> Result<Built, NhcError> {
    let (opts, rest) = getopts(args, "0E:SVcd:e:fkm:rsu:v")?;
    let mut fatal = true;
    let mut on = MatchOn::Argv0;
    let mut daemon = None;
    let mut pattern = None;
    let mut owner = None;
    let mut action = ServiceAction::None;
    let mut verify = Verify::None;
    let mut command = Vec::new();
    for (c, v) in opts {
        match c {
            '0' => fatal = false,
            'f' => on = MatchOn::Args,
            'd' => daemon = Some(v),
            'm' => pattern = Some(v),
            'u' => owner = Some(v),
            'S' => action = ServiceAction::Start,
            'r' => action = ServiceAction::Restart,
            'c' => action = ServiceAction::Cycle,
            'v' => verify = Verify::Sync,
            'V' => verify = Verify::Check,
            's' => action = ServiceAction::Stop,
            'k' => action = ServiceAction::Kill,
            // NHC runs these through `bash -c`; the agent splits them into words once,
            // here (quotes and backslashes; no variables, substitutions or operators),
            // and runs the program directly.
            'e' | 'E' => {
                command = shell_words(&v, &[]).map_err(|source| NhcError::ActionWords {
                    option: c,
                    value: v.clone(),
                    source,
                })?;
                if command.is_empty() {
                    return Err(NhcError::EmptyAction { option: c });
                }
                action = if c == 'e' {
                    ServiceAction::Command
                } else {
                    ServiceAction::CommandWhenFound
                };
            }
            _ => {}
        }
    }
    let service = rest.join(" ");
    if service.is_empty() {
        return Err(NhcError::NoServiceName);
    }
    let daemon = daemon.unwrap_or_else(|| service.clone());
    let pattern = pattern.unwrap_or_else(|| format!("*{daemon}"));
    // NHC: an all-digit owner is a uid, turned into its user name; anything else
    // (`!0` too) is a match expression over the user name.
    let owner_by_uid = owner
        .as_deref()
        .is_some_and(|o| !o.is_empty() && o.chars().all(|c| c.is_ascii_digit()));
    Ok(vec![(
        String::new(),
        CheckKind::Process(ProcessSpec {
            service,
            pattern: matcher(&pattern)?,
            on,
            owner: owner.as_deref().map(matcher).transpose()?,
            owner_by_uid,
            // -s / -k: the service must not run (NHC passes when nothing matches).
            must_run: !matches!(
                action,
                ServiceAction::Stop | ServiceAction::Kill | ServiceAction::CommandWhenFound
            ),
            action,
            verify,
            command,
        }),
        fatal,
        timeout,
    )])
}

/// NHC's `MAX_SYS_UID` / `LOGIN_DEFS_SRC` settings.
fn sys_uids(cx: &Cx) -> Result<SysUids, NhcError> {
    let fixed = match cx.var("MAX_SYS_UID").filter(|v| !v.is_empty()) {
        Some(v) => Some(v.parse::<u32>().map_err(|_| NhcError::NotAUid {
            value: v.to_string(),
        })?),
        None => None,
    };
    Ok(SysUids {
        fixed,
        login_defs: cx.var("LOGIN_DEFS_SRC").unwrap_or("/etc/login.defs").into(),
    })
}

/// `check_ps_cpu` / `check_ps_mem` / `check_ps_physmem` / `check_ps_time [-0] [-A] [-a]
/// [-f] [-K] [-k] [-l] [-s] [-e action] [-m match] [-r renice] [-u user] limit`.
pub(super) fn resource(name: &str, args: &[String], cx: &Cx) -> Result<Built, NhcError> {
    let (opts, rest) = getopts(args, "0AKae:fklm:r:su:")?;
    too_many(&rest, 1)?;
    let t = need(&rest, 0, "limit")?;
    let resource = match name {
        "check_ps_cpu" => {
            let n = t.strip_suffix('%').unwrap_or(t);
            if n.is_empty() || !n.chars().all(|c| c.is_ascii_digit()) {
                return Err(NhcError::CpuLimitRequired {
                    value: t.to_string(),
                });
            }
            Resource::CpuPercent(n.parse().map_err(|_| NhcError::TooLarge {
                value: t.to_string(),
            })?)
        }
        "check_ps_mem" if t.ends_with('%') => {
            return Err(NhcError::PercentNotSupported {
                value: t.to_string(),
            })
        }
        "check_ps_mem" => Resource::VszKib(parse_size_kib(t)?),
        "check_ps_physmem" => match t.strip_suffix('%') {
            Some(n) => {
                Resource::MemPercent(n.parse().map_err(|_| NhcError::InvalidPercentage {
                    value: t.to_string(),
                })?)
            }
            None => Resource::RssKib(parse_size_kib(t)?),
        },
        _ => {
            // [0-9MmSs] only: `90`, `30s`, `5m`, `1m30s`.
            if !t.chars().all(|c| c.is_ascii_digit() || "MmSs".contains(c)) {
                return Err(NhcError::CpuTimeCharacters {
                    value: t.to_string(),
                });
            }
            let t = t.replace('s', "");
            let secs = match t.split_once(['m', 'M']) {
                Some((m, s)) => {
                    let num = |x: &str| -> Result<u64, NhcError> {
                        if x.is_empty() {
                            Ok(0)
                        } else {
                            x.parse().map_err(|_| NhcError::InvalidCpuTime {
                                value: x.to_string(),
                            })
                        }
                    };
                    num(m)? * 60 + num(s)?
                }
                None => t
                    .parse()
                    .map_err(|_| NhcError::InvalidCpuTime { value: t.clone() })?,
            };
            Resource::CpuSecs(secs)
        }
    };
    let mut spec = ResourceSpec {
        check: name.to_string(),
        resource,
        pattern: matcher("*")?,
        full: false,
        owner: None,
        owner_by_uid: false,
        all_users: false,
        all: false,
        sys_uids: sys_uids(cx)?,
        kill: false,
        kill_parent: false,
        renice: None,
        command: Vec::new(),
    };
    let mut fatal = true;
    for (c, v) in opts {
        match c {
            '0' => fatal = false,
            'A' => spec.all_users = true,
            'a' => spec.all = true,
            'f' => spec.full = true,
            'K' => spec.kill_parent = true,
            'k' => spec.kill = true,
            'm' => spec.pattern = matcher(&v)?,
            'r' => {
                spec.renice = Some(
                    v.parse()
                        .map_err(|_| NhcError::NotANiceValue { value: v.clone() })?,
                )
            }
            'u' => {
                spec.owner_by_uid = !v.is_empty() && v.chars().all(|c| c.is_ascii_digit());
                spec.owner = Some(matcher(&v)?);
            }
            // NHC runs it with `bash -c` in the background; the agent splits it into
            // words once (no variables, substitutions or operators) and runs the program.
            'e' => {
                spec.command = shell_words(&v, &[]).map_err(|source| NhcError::ActionWords {
                    option: 'e',
                    value: v.clone(),
                    source,
                })?;
                if spec.command.is_empty() {
                    return Err(NhcError::EmptyAction { option: 'e' });
                }
            }
            // -l / -s: log / syslog; the check's message is logged anyway.
            _ => {}
        }
    }
    Ok(vec![(
        String::new(),
        CheckKind::PsResource(spec),
        fatal,
        cx.timeout,
    )])
}

/// `check_ps_unauth_users` / `check_ps_userproc_lineage [-c cmd] [-u uid] [-n user] [-p
/// pid] [actions...]`, with NHC's `NHC_AUTH_USERS`, `MAX_SYS_UID`, `RM_DAEMON_MATCH`,
/// `SQUEUE_CMD`, `SQUEUE_NODE`, `SQUEUE_FMT_ARGS` and `NHC_RM` settings.
pub(super) fn users(name: &str, args: &[String], cx: &Cx) -> Result<Built, NhcError> {
    let (opts, rest) = getopts(args, "c:u:n:p:")?;
    let mut ignore = [String::new(), String::new(), String::new(), String::new()];
    for (c, v) in opts {
        let i = "cunp".find(c).unwrap_or(0);
        ignore[i].push(' ');
        ignore[i].push_str(&v);
    }
    let rm = cx.var("NHC_RM").unwrap_or("slurm");
    let rule = if name == "check_ps_unauth_users" {
        UsersRule::Unauthorized
    } else {
        let default = match rm {
            "slurm" => "/\\bslurmstepd\\b/",
            "pbs" => "/\\bpbs_mom\\b/",
            "sge" => "/\\bsge_(execd|shepherd)\\b/",
            "lsf" => "/\\bres\\b/",
            _ => return Err(NhcError::UnsupportedResourceManager { rm: rm.to_string() }),
        };
        UsersRule::Lineage {
            daemon: matcher(cx.var("RM_DAEMON_MATCH").unwrap_or(default))?,
        }
    };
    // Users with jobs here: only Slurm's squeue is asked (NHC's other resource managers
    // read their spool files).
    let jobs_command = if matches!(rule, UsersRule::Unauthorized) && rm == "slurm" {
        let words = |var: &str, default: String| -> Vec<String> {
            cx.var(var)
                .map(str::to_string)
                .unwrap_or(default)
                .split_whitespace()
                .map(str::to_string)
                .collect()
        };
        let host = cx.var("HOSTNAME_S").unwrap_or("").to_string();
        // Set by the reader from slurm.bin_dir unless the file sets it.
        let mut argv = words("SQUEUE_CMD", "/usr/bin/squeue".into());
        argv.extend(words("SQUEUE_NODE", format!("-w {host}")));
        argv.extend(words("SQUEUE_FMT_ARGS", "--noheader -o %u".into()));
        argv
    } else {
        Vec::new()
    };
    let [ignore_cmd, ignore_uid, ignore_user, ignore_pid] = ignore;
    Ok(one(
        CheckKind::PsUsers(Box::new(UsersSpec {
            rule,
            ignore_cmd,
            ignore_uid,
            ignore_user,
            ignore_pid,
            auth_users: cx
                .var("NHC_AUTH_USERS")
                .unwrap_or("root nobody")
                .to_string(),
            jobs_command,
            sys_uids: sys_uids(cx)?,
            actions: parse_user_actions(&rest, true)?,
        })),
        cx.timeout,
    ))
}

/// `check_ps_kswapd THRESHOLD DISCREPANCY [actions...]`.
pub(super) fn kswapd(_name: &str, args: &[String], cx: &Cx) -> Result<Built, NhcError> {
    let num = |i: usize, what: &'static str| -> Result<i64, NhcError> {
        let v = need(args, i, what)?;
        crate::health::arith::parse_int(v).map_err(|source| NhcError::ArgumentNotInteger {
            argument: what,
            value: v.to_string(),
            source,
        })
    };
    Ok(one(
        CheckKind::Kswapd(KswapdSpec {
            threshold: num(0, "CPU time threshold")?,
            discrepancy: num(1, "discrepancy")?,
            actions: parse_user_actions(args.get(2..).unwrap_or(&[]), false)?,
        }),
        cx.timeout,
    ))
}
