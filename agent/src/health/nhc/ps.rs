//! NHC's `lbnl_ps.nhc` functions translated to the engine's checks: check_ps_service, check_ps_daemon, check_ps_blacklist, check_ps_loadavg.

use super::*;

/// `check_ps_service`.
pub(super) fn service(_name: &str, args: &[String], timeout: Duration) -> Result<Built, String> {
    ps_service(args, timeout)
}

/// `check_ps_daemon` / `check_ps_blacklist`.
pub(super) fn daemon(name: &str, args: &[String], timeout: Duration) -> Result<Built, String> {
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
pub(super) fn loadavg(_name: &str, args: &[String], timeout: Duration) -> Result<Built, String> {
    too_many(args, 3)?;
    let mut limits = [None; 3];
    for (i, l) in limits.iter_mut().enumerate() {
        *l = arg(args, i)
            .map(|s| {
                s.parse::<u64>()
                    .map_err(|_| format!("{s:?} is not a whole number"))
            })
            .transpose()?;
    }
    if limits.iter().all(Option::is_none) {
        return Err("missing load limit".into());
    }
    Ok(one(CheckKind::LoadAvg(LoadAvgSpec { limits }), timeout))
}

fn ps_service(args: &[String], timeout: Duration) -> Result<Built, String> {
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
                command = shell_words(&v, &[]).map_err(|e| format!("-{c} {v:?}: {e}"))?;
                if command.is_empty() {
                    return Err(format!("-{c}: empty action"));
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
        return Err("missing service name".into());
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
