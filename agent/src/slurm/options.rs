//! slurmd's command line and the file the distribution's slurmd unit reads it from.
//!
//! Debian and Ubuntu's `slurmd.service` has `EnvironmentFile=-/etc/default/slurmd` and
//! `ExecStart=/usr/sbin/slurmd -D -s $SLURMD_OPTIONS`; the RHEL family (and SchedMD's own
//! unit) reads `/etc/sysconfig/slurmd`. systemd splits an unbraced `$VAR` at whitespace
//! and removes quotes (systemd.service(5) "Command lines"), so the `--conf` value is written
//! in double quotes, and the whole value in single quotes (systemd.exec(5)
//! "EnvironmentFile=").

use std::path::{Path, PathBuf};

use super::ConfServer;
use crate::fsutil;
use crate::nodedef::NodeDefinition;

/// The EC2 instance a slurmd registers for: `--instance-id` and `--instance-type`
/// (slurmd(8), Slurm 23.11+; `scontrol show node` then shows `InstanceId=` and
/// `InstanceType=`, the record's own word on which instance holds it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceArgs {
    /// `i-0123456789abcdef0`.
    pub instance_id: String,
    /// `c5.xlarge`.
    pub instance_type: String,
}

/// The arguments bootstrap gives slurmd (after the unit's own `-D -s` or `--systemd`):
/// `-N <NodeName>`, `--conf-server a,b` when servers are given (else slurmd looks up DNS SRV
/// `_slurmctld._tcp`), `--instance-id <id> --instance-type <type>` when given (only for a
/// slurmd of 23.11 or later: [`super::SlurmVersion::has_instance_fields`]; an empty value
/// is left out, never passed: slurmd would take the next word for it), and
/// `-Z --conf "<line>"` for dynamic nodes.
pub fn slurmd_args(
    def: &NodeDefinition,
    servers: &[ConfServer],
    instance: Option<&InstanceArgs>,
) -> Vec<String> {
    let mut args = vec!["-N".to_string(), def.node_name.clone()];
    if !servers.is_empty() {
        args.push("--conf-server".into());
        args.push(
            servers
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(","),
        );
    }
    if let Some(i) = instance {
        for (flag, value) in [
            ("--instance-id", &i.instance_id),
            ("--instance-type", &i.instance_type),
        ] {
            if !value.trim().is_empty() {
                args.push(flag.into());
                args.push(value.clone());
            }
        }
    }
    if let Some(conf) = &def.dynamic_conf {
        args.push("-Z".into());
        args.push("--conf".into());
        args.push(conf.clone());
    }
    args
}

/// The `<var>=` line (`SLURMD_OPTIONS`, `SACKD_OPTIONS`) for `args`. Arguments are
/// validated upstream (no quotes, no newlines); an argument with a space is double-quoted.
fn options_line(var: &str, args: &[String]) -> String {
    let words: Vec<String> = args
        .iter()
        .map(|a| {
            if a.contains(' ') {
                format!("\"{a}\"")
            } else {
                a.clone()
            }
        })
        .collect();
    format!("{var}='{}'", words.join(" "))
}

/// Error writing the options file.
#[derive(Debug, thiserror::Error)]
pub enum OptionsFileError {
    /// An argument holds a character that cannot be written safely.
    #[error("slurmd argument {argument:?} holds a quote, newline or control character")]
    Unsafe {
        /// The argument.
        argument: String,
    },
    /// Reading the existing file failed.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// Writing failed.
    #[error(transparent)]
    Write(#[from] fsutil::WriteError),
}

/// The distribution's options file: `/etc/default/slurmd` where `/etc/default` exists,
/// else `/etc/sysconfig/slurmd`.
pub fn default_options_file() -> PathBuf {
    if Path::new("/etc/default").is_dir() {
        PathBuf::from("/etc/default/slurmd")
    } else {
        PathBuf::from("/etc/sysconfig/slurmd")
    }
}

/// The variable that names the auth/slurm key file to slurmd (and sackd), instead of
/// `<sysconfdir>/slurm.key` (Slurm 23.11+: `init_internal` in
/// `src/plugins/auth/slurm/internal.c`; set, it also makes a configless slurmd fetch its
/// configuration with auth/slurm: `fetch_config.c`, `auth_g_init`).
pub const SACK_KEY_VAR: &str = "SLURM_SACK_KEY";

/// Sets `SLURMD_OPTIONS` in `path`, keeping every other line, replacing any earlier
/// `SLURMD_OPTIONS=` lines with one; with `sack_key` (auth/slurm) also
/// `SLURM_SACK_KEY='<path>'` ([`SACK_KEY_VAR`]), replacing earlier ones (without it, such
/// lines are removed: auth/munge). Written atomically (mode 0644); unchanged content is not
/// rewritten. Returns whether the file changed.
///
/// # Errors
/// [`OptionsFileError`].
pub fn write_slurmd_options(
    path: &Path,
    args: &[String],
    sack_key: Option<&Path>,
) -> Result<bool, OptionsFileError> {
    write_options(path, "SLURMD_OPTIONS", args, sack_key)
}

/// The distribution's file for sackd's options: `/etc/default/sackd` where `/etc/default`
/// exists, else `/etc/sysconfig/sackd` (Slurm's `sackd.service` reads both).
pub fn default_sackd_options_file() -> PathBuf {
    if Path::new("/etc/default").is_dir() {
        PathBuf::from("/etc/default/sackd")
    } else {
        PathBuf::from("/etc/sysconfig/sackd")
    }
}

/// The arguments bootstrap gives sackd on a login node (after the unit's own `--systemd`):
/// `--conf-server a,b` when servers are given (else sackd looks up the DNS SRV record
/// `_slurmctld._tcp`), as slurmd takes them (sackd(8)).
pub fn sackd_args(servers: &[ConfServer]) -> Vec<String> {
    if servers.is_empty() {
        return Vec::new();
    }
    vec![
        "--conf-server".into(),
        servers
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
    ]
}

/// Sets `SACKD_OPTIONS` (and `SLURM_SACK_KEY` with auth/slurm) in `path` as
/// [`write_slurmd_options`] does for slurmd. Returns whether the file changed.
///
/// # Errors
/// [`OptionsFileError`].
pub fn write_sackd_options(
    path: &Path,
    args: &[String],
    sack_key: Option<&Path>,
) -> Result<bool, OptionsFileError> {
    write_options(path, "SACKD_OPTIONS", args, sack_key)
}

/// [`write_slurmd_options`] for the variable `var`.
fn write_options(
    path: &Path,
    var: &'static str,
    args: &[String],
    sack_key: Option<&Path>,
) -> Result<bool, OptionsFileError> {
    let sack_key = sack_key.map(|p| p.to_string_lossy().into_owned());
    if let Some(a) = args
        .iter()
        .chain(sack_key.as_ref())
        .find(|a| a.chars().any(|c| c == '\'' || c == '"' || c.is_control()))
    {
        return Err(OptionsFileError::Unsafe {
            argument: a.clone(),
        });
    }
    // Only a regular file's lines are kept: a symlink there is replaced, never read
    // through (it could point at a secret that would end up in this 0644 file).
    let old = match fsutil::read_regular(path, 1 << 20) {
        Ok(Some((bytes, _))) => String::from_utf8_lossy(&bytes).into_owned(),
        Ok(None) => String::new(),
        Err(source) => {
            return Err(OptionsFileError::Read {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let mut managed = vec![(var, options_line(var, args), false)];
    if let Some(k) = &sack_key {
        managed.push((SACK_KEY_VAR, format!("{SACK_KEY_VAR}='{k}'"), false));
    }
    let mut out = String::new();
    for l in old.lines() {
        let t = l.trim_start();
        let t = t.strip_prefix("export ").unwrap_or(t);
        let sets = |var: &str| t.strip_prefix(var).is_some_and(|r| r.starts_with('='));
        // Without auth/slurm no SLURM_SACK_KEY stays: it would make slurmd use auth/slurm.
        if sack_key.is_none() && sets(SACK_KEY_VAR) {
            continue;
        }
        match managed.iter_mut().find(|(var, _, _)| sets(var)) {
            Some((_, line, placed)) => {
                if !*placed {
                    out.push_str(line);
                    out.push('\n');
                    *placed = true;
                }
            }
            None => {
                out.push_str(l);
                out.push('\n');
            }
        }
    }
    for (_, line, placed) in &managed {
        if !placed {
            if out.is_empty() {
                out.push_str("# Written by slurm-node-agent bootstrap.\n");
            }
            out.push_str(line);
            out.push('\n');
        }
    }
    if out == old {
        return Ok(false);
    }
    fsutil::write_atomic(path, out.as_bytes(), 0o644, None)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn def() -> NodeDefinition {
        NodeDefinition {
            node_name: "n1".into(),
            dynamic_conf: Some("CPUs=2 RealMemory=1000".into()),
        }
    }

    #[test]
    fn args_for_dynamic_node() {
        let servers = vec![
            ConfServer::parse("10.0.0.1:6817").unwrap(),
            ConfServer::parse("10.0.0.2").unwrap(),
        ];
        assert_eq!(
            slurmd_args(&def(), &servers, None),
            [
                "-N",
                "n1",
                "--conf-server",
                "10.0.0.1:6817,10.0.0.2",
                "-Z",
                "--conf",
                "CPUs=2 RealMemory=1000"
            ]
        );
        let static_def = NodeDefinition {
            dynamic_conf: None,
            ..def()
        };
        assert_eq!(slurmd_args(&static_def, &[], None), ["-N", "n1"]);
        let instance = InstanceArgs {
            instance_id: "i-0abc1234".into(),
            instance_type: "m5.large".into(),
        };
        assert_eq!(
            slurmd_args(&static_def, &[], Some(&instance)),
            [
                "-N",
                "n1",
                "--instance-id",
                "i-0abc1234",
                "--instance-type",
                "m5.large"
            ]
        );
        // An empty value never reaches slurmd (it would read the next word as the value).
        let no_type = InstanceArgs {
            instance_type: " ".into(),
            ..instance
        };
        assert_eq!(
            slurmd_args(&def(), &[], Some(&no_type)),
            [
                "-N",
                "n1",
                "--instance-id",
                "i-0abc1234",
                "-Z",
                "--conf",
                "CPUs=2 RealMemory=1000"
            ]
        );
    }

    #[test]
    fn options_file_is_idempotent_and_keeps_other_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("slurmd");
        std::fs::write(
            &p,
            "# Debian default\nSLURMD_OPTIONS=\"\"\nOTHER=1\nSLURMD_OPTIONS=x\n",
        )
        .unwrap();
        let args = slurmd_args(&def(), &[], None);
        assert!(write_slurmd_options(&p, &args, None).unwrap());
        let text = std::fs::read_to_string(&p).unwrap();
        assert_eq!(
            text,
            "# Debian default\nSLURMD_OPTIONS='-N n1 -Z --conf \"CPUs=2 RealMemory=1000\"'\nOTHER=1\n"
        );
        // Second run: same content, no rewrite, still one line.
        assert!(!write_slurmd_options(&p, &args, None).unwrap());
        assert_eq!(std::fs::read_to_string(&p).unwrap(), text);
    }

    #[test]
    fn auth_slurm_names_its_key_to_slurmd_once() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("slurmd");
        std::fs::write(
            &p,
            "OTHER=1\nexport SLURM_SACK_KEY=/old\nSLURM_SACK_KEY=/older\n",
        )
        .unwrap();
        let args = slurmd_args(&def(), &[], None);
        let key = Path::new("/etc/slurm/slurm.key");
        assert!(write_slurmd_options(&p, &args, Some(key)).unwrap());
        let text = std::fs::read_to_string(&p).unwrap();
        assert_eq!(
            text,
            "OTHER=1\nSLURM_SACK_KEY='/etc/slurm/slurm.key'\n\
             SLURMD_OPTIONS='-N n1 -Z --conf \"CPUs=2 RealMemory=1000\"'\n"
        );
        assert!(!write_slurmd_options(&p, &args, Some(key)).unwrap());
        // A key path that cannot be written safely is refused, nothing written.
        let e = write_slurmd_options(&p, &args, Some(Path::new("/a'b"))).unwrap_err();
        assert!(matches!(e, OptionsFileError::Unsafe { .. }));
        assert_eq!(std::fs::read_to_string(&p).unwrap(), text);
        // auth/munge again: no SLURM_SACK_KEY left to make slurmd use auth/slurm.
        assert!(write_slurmd_options(&p, &args, None).unwrap());
        assert!(!std::fs::read_to_string(&p)
            .unwrap()
            .contains("SLURM_SACK_KEY"));
    }

    #[test]
    fn refuses_quotes_and_newlines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("slurmd");
        for bad in ["a'b", "a\nSLURMD_OPTIONS=evil", "a\"b"] {
            let e = write_slurmd_options(&p, &[bad.to_string()], None).unwrap_err();
            assert!(matches!(e, OptionsFileError::Unsafe { .. }));
        }
        assert!(!p.exists());
    }
}
