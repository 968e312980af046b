//! NHC's `lbnl_file.nhc` functions translated to the engine's checks: check_file_test, check_file_contents, check_file_stat.

use super::*;

/// `check_file_test`.
pub(super) fn test(_name: &str, args: &[String], cx: &Cx) -> Result<Built, NhcError> {
    let timeout = cx.timeout;
    let (opts, rest) = getopts(args, "!GLNOSabcdefghkprstuwx")?;
    let mut ops = Vec::new();
    let mut negate = false;
    for (c, _) in opts {
        match c {
            '!' => negate = true,
            't' => return Err(unsupported_opt('t', "it tests a terminal, not a file")),
            c if TEST_OPS.contains(c) => ops.push(c),
            c => return Err(NhcError::InvalidOption { option: c }),
        }
    }
    if ops.is_empty() {
        return Err(NhcError::NoTestOperator);
    }
    if rest.is_empty() {
        return Err(NhcError::NoFile);
    }
    Ok(one(
        CheckKind::FileTest(FileTestSpec {
            ops,
            negate,
            paths: rest,
        }),
        timeout,
    ))
}

/// `check_file_contents`.
pub(super) fn contents(_name: &str, args: &[String], cx: &Cx) -> Result<Built, NhcError> {
    let timeout = cx.timeout;
    let path = need(args, 0, "file")?.to_string();
    if args.len() < 2 {
        return Err(NhcError::NoMatchExpressions);
    }
    let matches = args[1..]
        .iter()
        .map(|s| matcher(s))
        .collect::<Result<_, _>>()?;
    Ok(one(
        CheckKind::FileContents(FileContentsSpec { path, matches }),
        timeout,
    ))
}

/// `check_file_stat`.
pub(super) fn stat(_name: &str, args: &[String], cx: &Cx) -> Result<Built, NhcError> {
    let timeout = cx.timeout;
    file_stat(args, timeout)
}

/// A value NHC compares with bash arithmetic (`[[ $X -ne $VALUE ]]`, `$((A & VALUE))`):
/// `0x..` is hex, a leading `0` octal, else decimal. So `-m 0755` is the mode 0755 but
/// `-m 755` is decimal 755 (0o1363), exactly as NHC reads it.
fn bash_num<T: TryFrom<i64>>(c: char, s: &str) -> Result<T, NhcError> {
    let n =
        crate::health::arith::eval(s, &|_| None).map_err(|source| NhcError::OptionNotInteger {
            option: c,
            value: s.to_string(),
            source,
        })?;
    T::try_from(n).map_err(|_| NhcError::OptionOutOfRange {
        option: c,
        value: s.to_string(),
        number: n,
    })
}

/// A uid or gid NHC compares as a string with stat's decimal `%u`/`%g`: only the plain
/// decimal spelling can ever match.
fn decimal_id(c: char, s: &str) -> Result<u32, NhcError> {
    match s.parse::<u32>() {
        Ok(n) if n.to_string() == s => Ok(n),
        _ => Err(NhcError::NotDecimalId {
            option: c,
            value: s.to_string(),
        }),
    }
}

/// `check_file_stat [-D|-d devno] [-G group] [-g gid] [-M mode] [-m mode] [-N|-O secs]
/// [-n|-o secs] [-T minor] [-t major] [-U user] [-u uid] file...` (NHC 1.4.3's options).
fn file_stat(args: &[String], timeout: Duration) -> Result<Built, NhcError> {
    let (opts, rest) = getopts(args, "D:G:M:N:O:T:U:d:g:m:n:o:t:u:")?;
    let mut s = FileStatSpec::default();
    for (c, v) in opts {
        match c {
            'D' | 'd' => s.devno = Some(bash_num(c, &v)?),
            'G' => s.group = Some(v),
            'g' => s.gid = Some(decimal_id(c, &v)?),
            'U' => s.user = Some(v),
            'u' => s.uid = Some(decimal_id(c, &v)?),
            'm' => s.mode_is = Some(bash_num(c, &v)?),
            'M' => s.mode_has = Some(bash_num(c, &v)?),
            't' => s.major = Some(bash_num(c, &v)?),
            'T' => s.minor = Some(bash_num(c, &v)?),
            'n' => s.mtime_newer = Some(bash_num(c, &v)?),
            'o' => s.mtime_older = Some(bash_num(c, &v)?),
            'N' => s.ctime_newer = Some(bash_num(c, &v)?),
            'O' => s.ctime_older = Some(bash_num(c, &v)?),
            c => return Err(NhcError::InvalidOption { option: c }),
        }
    }
    if rest.is_empty() {
        return Err(NhcError::NoFile);
    }
    s.paths = rest;
    Ok(one(CheckKind::FileStat(s), timeout))
}
