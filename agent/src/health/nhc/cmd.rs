//! NHC's `lbnl_cmd.nhc` functions translated to the engine's checks: check_cmd_status, check_cmd_output.

use super::*;

/// NHC's default command timeout (`check_cmd_*` without `-t`), seconds.
const NHC_CMD_TIMEOUT: u64 = 5;

/// `check_cmd_status` / `check_cmd_output`.
pub(super) fn status(name: &str, args: &[String], _timeout: Duration) -> Result<Built, String> {
    cmd(name, args)
}

fn parse_num<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    s.parse().map_err(|_| format!("{s:?} is not a number"))
}

fn cmd(name: &str, args: &[String]) -> Result<Built, String> {
    let spec = if name == "check_cmd_status" {
        "C:r:t:"
    } else {
        "C:O:M:e:m:r:t:"
    };
    let (opts, rest) = getopts(args, spec)?;
    let mut secs = NHC_CMD_TIMEOUT;
    let mut status = 0;
    let mut matches = Vec::new();
    let mut cmdline = None;
    for (c, v) in opts {
        match c {
            't' => secs = parse_num(&v)?,
            'r' => status = parse_num(&v)?,
            'm' => matches.push(matcher(&v)?),
            'e' => cmdline = Some(v.split_whitespace().map(str::to_string).collect::<Vec<_>>()),
            'C' | 'O' | 'M' => return Err(unsupported_opt(c, "only for NHC's own wrapper checks")),
            _ => {}
        }
    }
    let argv = cmdline.unwrap_or(rest);
    if argv.is_empty() {
        return Err("no command specified".into());
    }
    if secs == 0 {
        return Err("-t must be at least 1 second".into());
    }
    Ok(one(
        CheckKind::Command(CommandSpec {
            argv,
            status,
            matches,
        }),
        Duration::from_secs(secs),
    ))
}
