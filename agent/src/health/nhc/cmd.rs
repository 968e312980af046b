//! NHC's `lbnl_cmd.nhc` functions translated to the engine's checks: check_cmd_status, check_cmd_output.

use super::*;
use crate::health::checks::cmd::{resolve_program_in, SAFE_PATH};

/// NHC's default command timeout (`check_cmd_*` without `-t`), seconds.
const NHC_CMD_TIMEOUT: u64 = 5;

/// `check_cmd_status` / `check_cmd_output`.
pub(super) fn status(name: &str, args: &[String], cx: &Cx) -> Result<Built, NhcError> {
    cmd(name, args, cx)
}

/// `check_cmd_dmesg [-M msg]... [-e cmd] [-m expr]... [-r status] [-t secs]`: NHC's
/// wrapper of `check_cmd_output -C check_cmd_dmesg` over `dmesg` (or the `-e` command).
pub(super) fn dmesg(_name: &str, args: &[String], cx: &Cx) -> Result<Built, NhcError> {
    let (opts, rest) = getopts(args, "M:e:m:r:t:")?;
    too_many(&rest, 0)?;
    let mut out: Vec<String> = vec!["-C".into(), "check_cmd_dmesg".into()];
    let mut cmdline = "dmesg".to_string();
    let (mut msgs, mut matches) = (Vec::new(), Vec::new());
    for (c, v) in opts {
        match c {
            'M' => msgs.extend(["-M".to_string(), v]),
            'm' => matches.extend(["-m".to_string(), v]),
            'e' => cmdline = v,
            _ => out.extend([format!("-{c}"), v]),
        }
    }
    out.extend(["-e".to_string(), cmdline]);
    out.extend(msgs);
    out.extend(matches);
    cmd("check_cmd_output", &out, cx)
}

fn parse_num<T: std::str::FromStr>(s: &str) -> Result<T, NhcError> {
    s.parse().map_err(|_| NhcError::NotANumber {
        value: s.to_string(),
    })
}

/// `check_cmd_status [-C name] [-r status] [-t secs] cmd...` and `check_cmd_output [-C
/// name] [-O var] [-M msg]... [-e cmd] [-m expr]... [-r status] [-t secs] [cmd...]`.
fn cmd(name: &str, args: &[String], cx: &Cx) -> Result<Built, NhcError> {
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
    let mut check_name = None;
    let mut messages = Vec::new();
    for (c, v) in opts {
        match c {
            't' => secs = parse_num(&v)?,
            'r' => status = parse_num(&v)?,
            'm' => matches.push(matcher(&v)?),
            'e' => cmdline = Some(v.split_whitespace().map(str::to_string).collect::<Vec<_>>()),
            // NHC's options for wrapper checks: -C names the check in its messages, -M
            // gives the message of the -m of the same position (%m, %l, %c, %f), -O
            // stores the output in a bash array that nothing in nhc.conf can read.
            'C' => check_name = Some(v),
            'M' => messages.push(v),
            'O' => {}
            _ => {}
        }
    }
    let mut argv = cmdline.unwrap_or(rest);
    if argv.is_empty() {
        return Err(NhcError::NoCommand);
    }
    // A bare name is looked up in the PATH the file set (`export PATH="/opt/bin:$PATH"`),
    // as bash does for NHC; not found there, the engine looks in its own safe PATH. Only
    // absolute folders count (the file is the image's, never the working directory's).
    // Looked up here only when the file changed PATH (the engine resolves the rest).
    let path = cx.var("PATH").filter(|p| *p != SAFE_PATH);
    if let Some(p) = path.and_then(|path| resolve_program_in(&argv[0], path)) {
        argv[0] = p.display().to_string();
    }
    if secs == 0 {
        return Err(NhcError::TimeoutZero);
    }
    Ok(one(
        CheckKind::Command(CommandSpec {
            argv,
            status,
            matches,
            check_name,
            messages,
        }),
        Duration::from_secs(secs),
    ))
}
