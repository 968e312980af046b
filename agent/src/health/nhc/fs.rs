//! NHC's `lbnl_fs.nhc` functions translated to the engine's checks: check_fs_mount (and _rw/_ro), check_fs_free/used/ifree/iused, check_fs_size/inodes.

use super::*;

/// `check_fs_mount`.
pub(super) fn mount(_name: &str, args: &[String], cx: &Cx) -> Result<Built, NhcError> {
    fs_mount(args, None, cx)
}

/// `check_fs_mount_rw`.
pub(super) fn mount_rw(_name: &str, args: &[String], cx: &Cx) -> Result<Built, NhcError> {
    fs_mount(args, Some("rw"), cx)
}

/// `check_fs_mount_ro`.
pub(super) fn mount_ro(_name: &str, args: &[String], cx: &Cx) -> Result<Built, NhcError> {
    fs_mount(args, Some("ro"), cx)
}

/// `check_fs_free` / `check_fs_used` / `check_fs_ifree` / `check_fs_iused`.
pub(super) fn space(name: &str, args: &[String], cx: &Cx) -> Result<Built, NhcError> {
    let timeout = cx.timeout;
    too_many(args, 2)?;
    let path = need(args, 0, "file system")?.to_string();
    let t = need(args, 1, "threshold")?;
    let inodes = name.contains("_i");
    let th = if inodes {
        parse_count_threshold(t)?
    } else {
        parse_space_threshold(t)?
    };
    let (what, min, max) = match name {
        "check_fs_free" => (SpaceWhat::Free, Some(th), None),
        "check_fs_used" => (SpaceWhat::Used, None, Some(th)),
        "check_fs_ifree" => (SpaceWhat::InodesFree, Some(th), None),
        _ => (SpaceWhat::InodesUsed, None, Some(th)),
    };
    Ok(one(
        CheckKind::Space(SpaceSpec {
            path,
            what,
            min,
            max,
        }),
        timeout,
    ))
}

/// `check_fs_size` / `check_fs_inodes`.
pub(super) fn size(name: &str, args: &[String], cx: &Cx) -> Result<Built, NhcError> {
    let timeout = cx.timeout;
    too_many(args, 3)?;
    let path = need(args, 0, "file system")?.to_string();
    let parse = |s: Option<&str>| -> Result<Option<Threshold>, NhcError> {
        let Some(s) = s else { return Ok(None) };
        let t = if name == "check_fs_size" {
            parse_size_kib(s).map(Threshold::Absolute)?
        } else {
            crate::health::units::parse_count(s).map(Threshold::Absolute)?
        };
        Ok(Some(t))
    };
    let what = if name == "check_fs_size" {
        SpaceWhat::Size
    } else {
        SpaceWhat::Inodes
    };
    Ok(one(
        CheckKind::Space(SpaceSpec {
            path,
            what,
            min: parse(arg(args, 1))?,
            max: parse(arg(args, 2))?,
        }),
        timeout,
    ))
}

fn fs_mount(args: &[String], want: Option<&str>, cx: &Cx) -> Result<Built, NhcError> {
    let timeout = cx.timeout;
    // NHC creates a missing mount point directory whatever the options.
    let mut actions = MountActions {
        mkdir: true,
        mount_cmd: cx
            .var("MOUNT_CMD")
            .unwrap_or("mount")
            .split_whitespace()
            .map(str::to_string)
            .collect(),
        ..MountActions::default()
    };
    if actions.mount_cmd.is_empty() {
        return Err(NhcError::EmptySetting {
            setting: "MOUNT_CMD",
        });
    }
    let mut fs_list = Vec::new();
    let mut sources = Vec::new();
    let mut fstypes = Vec::new();
    let mut options = Vec::new();
    let mut fatal = true;
    if args.first().is_some_and(|a| a.starts_with('/')) {
        // Old syntax: fs [src [type [options]]] (mount_rw/ro: fs [src [type]]).
        too_many(args, if want.is_some() { 3 } else { 4 })?;
        fs_list.push(args[0].clone());
        if let Some(s) = arg(args, 1) {
            sources.push(matcher(s)?);
        }
        if let Some(t) = arg(args, 2) {
            fstypes.push(matcher(t)?);
        }
        if let Some(o) = arg(args, 3) {
            options.push(matcher(o)?);
        }
    } else {
        let (opts, rest) = getopts(args, "0rE:F:O:e:f:o:s:t:")?;
        for (c, v) in opts {
            match c {
                '0' => fatal = false,
                'f' | 'F' => fs_list.push(v),
                's' => sources.push(matcher(&v)?),
                't' => fstypes.push(matcher(&v)?),
                'o' => options.push(matcher(&v)?),
                'r' => actions.remount = true,
                'O' => actions.mount_opts = Some(v),
                // NHC runs these with `bash -c`; the agent splits them into words once
                // (no variables, substitutions or operators) and runs the program.
                'e' | 'E' => {
                    let words = shell_words(&v, &[]).map_err(|source| NhcError::ActionWords {
                        option: c,
                        value: v.clone(),
                        source,
                    })?;
                    if words.is_empty() {
                        return Err(NhcError::EmptyAction { option: c });
                    }
                    if c == 'e' {
                        actions.missing = words;
                    } else {
                        actions.found = words;
                    }
                }
                _ => {}
            }
        }
        fs_list.extend(rest);
    }
    if fs_list.is_empty() {
        return Err(NhcError::NoFileSystem);
    }
    if let Some(w) = want {
        options.push(Matcher::mount_option(w));
    }
    Ok(fs_list
        .into_iter()
        .map(|path| {
            (
                path.clone(),
                CheckKind::Mount(MountSpec {
                    path,
                    sources: sources.clone(),
                    fstypes: fstypes.clone(),
                    options: options.clone(),
                    alive: true,
                    writable: want == Some("rw"),
                    space: Vec::new(),
                    actions: actions.clone(),
                }),
                fatal,
                timeout,
            )
        })
        .collect())
}
