//! The agent's exit codes: the one table every command maps its outcome through (each
//! top-level error says which [`Exit`] it is, `exit()`), and that `docs/exit-codes.md`
//! ("All commands"), the manual's EXIT STATUS and the bootstrap unit's
//! `RestartPreventExitStatus=` follow; tests fail when they disagree with it.
//!
//! The codes are sysexits(3) values, but for 0, 1 (`check`: the node is unhealthy) and 2
//! (a usage error, as clap exits).
//!
//! Floor 0 (ground): uses no other module of the crate.

use std::fmt;

/// How a command ended, as its exit code says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Exit {
    /// 0: done.
    Ok,
    /// 1: `check`: a fatal health check failed or timed out.
    Unhealthy,
    /// 2: a command-line usage error.
    Usage,
    /// 65, EX_DATAERR: bad data (the key, a node registered INVALID, a lifecycle script).
    DataErr,
    /// 69, EX_UNAVAILABLE: a service unavailable (IMDS, AWS, slurmctld, GPUs).
    Unavailable,
    /// 71, EX_OSERR: systemd refused or failed a job; the runtime or signals could not be
    /// set up.
    OsErr,
    /// 72, EX_OSFILE: a required `[[mounts]]` entry is not in place (the file systems jobs
    /// need are missing): bootstrap does not start slurmd.
    MountFailed,
    /// 74, EX_IOERR: a file could not be written or read (the key, the options file, a
    /// state file, `check`'s report).
    IoErr,
    /// 75, EX_TEMPFAIL: try again later (the join deadline, a busy lock, `--wait`).
    TempFail,
    /// 76, EX_PROTOCOL: slurmctld refuses this node's Slurm release (a controller older
    /// than slurmd): bootstrap does not start slurmd.
    Protocol,
    /// 77, EX_NOPERM: permission denied (the key; `resume` of an admin's drain).
    NoPerm,
    /// 78, EX_CONFIG: invalid settings; no node name. (A check file that cannot be used is
    /// a failing check: 1.)
    Config,
}

impl Exit {
    /// Every code, in order.
    pub const ALL: [Exit; 12] = [
        Exit::Ok,
        Exit::Unhealthy,
        Exit::Usage,
        Exit::DataErr,
        Exit::Unavailable,
        Exit::OsErr,
        Exit::MountFailed,
        Exit::IoErr,
        Exit::TempFail,
        Exit::Protocol,
        Exit::NoPerm,
        Exit::Config,
    ];

    /// The process exit code.
    pub const fn code(self) -> u8 {
        match self {
            Exit::Ok => 0,
            Exit::Unhealthy => 1,
            Exit::Usage => 2,
            Exit::DataErr => 65,
            Exit::Unavailable => 69,
            Exit::OsErr => 71,
            Exit::MountFailed => 72,
            Exit::IoErr => 74,
            Exit::TempFail => 75,
            Exit::Protocol => 76,
            Exit::NoPerm => 77,
            Exit::Config => 78,
        }
    }

    /// Its sysexits(3) name, for the codes that are sysexits values.
    pub const fn sysexits_name(self) -> Option<&'static str> {
        match self {
            Exit::Ok | Exit::Unhealthy | Exit::Usage => None,
            Exit::DataErr => Some("EX_DATAERR"),
            Exit::Unavailable => Some("EX_UNAVAILABLE"),
            Exit::OsErr => Some("EX_OSERR"),
            Exit::MountFailed => Some("EX_OSFILE"),
            Exit::IoErr => Some("EX_IOERR"),
            Exit::TempFail => Some("EX_TEMPFAIL"),
            Exit::Protocol => Some("EX_PROTOCOL"),
            Exit::NoPerm => Some("EX_NOPERM"),
            Exit::Config => Some("EX_CONFIG"),
        }
    }

    /// Whether `slurm-node-agent-bootstrap.service` tries bootstrap again after it ended
    /// so: what comes back by itself (IMDS, a file system, the controller); not a usage
    /// error, bad data, no permission or bad settings, which need a person (the unit's
    /// `RestartPreventExitStatus=`). 0 and 1 are no bootstrap failure.
    pub const fn is_temporary(self) -> bool {
        matches!(
            self,
            Exit::Unavailable | Exit::OsErr | Exit::MountFailed | Exit::IoErr | Exit::TempFail
        )
    }

    /// What it means, as the table of all commands in `docs/exit-codes.md` says it.
    pub const fn meaning(self) -> &'static str {
        match self {
            Exit::Ok => {
                "done (`check`: healthy; `bootstrap`: registered, also when it stays drained by an admin)"
            }
            Exit::Unhealthy => {
                "a fatal health check failed or timed out, or a check file could not be used (a failing check naming the file and line)"
            }
            Exit::Usage => "command-line usage error (e.g. a reason with a control character)",
            Exit::DataErr => {
                "bad data: key missing, empty or the wrong size; the node's auth type or key differs from the controller's (slurmctld refuses slurmd or sackd); node registered INVALID; a NodeName that is not dynamic and unknown to slurmctld; lifecycle actions beyond the API's limits; a lifecycle script with `onError = TERMINATE` failed (the instance is powering off)"
            }
            Exit::Unavailable => {
                "unavailable: IMDS, AWS, GPUs; slurmctld or the node unknown to it (`status` still prints what it knows locally); no bootstrap record and no instance metadata; `config show` without IMDS (use `--no-imds` off EC2); a support bundle written but not uploaded"
            }
            Exit::OsErr => {
                "systemd refused or failed a job; signal set-up failed; the async runtime could not start"
            }
            Exit::MountFailed => {
                "a required mount is not in place (a `[[mounts]]` entry, `required = true` by default): slurmd is not started, the node does not join"
            }
            Exit::IoErr => {
                "I/O error: key, options or state file; `check`'s report could not be written to stdout; the CloudWatch agent's configuration or the support bundle could not be written"
            }
            Exit::TempFail => {
                "temporary: node not registered by `slurm.join_deadline`; state lock busy; `--wait` timed out; resume while the upgrade action runs"
            }
            Exit::Protocol => {
                "version skew: slurmctld refuses the protocol of this node's Slurm release (a controller older than the node's slurmd, which never accepts a newer one): slurmd is not started"
            }
            Exit::NoPerm => {
                "permission: access to the key denied; `ec2:DescribeTags` denied (`imds.tags = \"describe-tags\"`); `resume` of an admin's drain without `--force`"
            }
            Exit::Config => {
                "invalid settings (an `auth.type` the join or the image's Slurm cannot use: munge in the managed join, auth/slurm with a Slurm older than 23.11 or without its plugin); no node name (`check` without a name still runs its checks, reports \"node name unknown\" and acts on nothing)"
            }
        }
    }

    /// The commands that end with it, as that table says: from [`COMMANDS`], `all` when
    /// every command may.
    pub fn commands(self) -> String {
        let with: Vec<&str> = COMMANDS
            .iter()
            .filter(|(_, codes)| codes.contains(&self))
            .map(|(name, _)| *name)
            .collect();
        if with.len() == COMMANDS.len() {
            "all".to_string()
        } else {
            with.iter()
                .map(|c| format!("`{c}`"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    }

    /// A line for `slurm-node-agent`'s man page (EXIT STATUS).
    pub const fn summary(self) -> &'static str {
        match self {
            Exit::Ok => "done (check: healthy)",
            Exit::Unhealthy => "check: a fatal health check failed or timed out",
            Exit::Usage => "command-line usage error",
            Exit::DataErr => "bad data (key, node registered INVALID, a lifecycle script)",
            Exit::Unavailable => "a service unavailable (IMDS, AWS, slurmctld, GPUs)",
            Exit::OsErr => "systemd refused or failed a job",
            Exit::MountFailed => "bootstrap: a required mount is not in place",
            Exit::IoErr => "I/O error",
            Exit::TempFail => "temporary failure: retry (join deadline, busy state lock, --wait)",
            Exit::Protocol => "bootstrap: slurmctld refuses this node's Slurm release",
            Exit::NoPerm => "permission denied",
            Exit::Config => "invalid settings",
        }
    }

    /// The table of all commands in `docs/exit-codes.md` (GitHub markdown), from this one.
    pub fn markdown_table() -> String {
        let mut s = String::from("| code | meaning | commands |\n|---|---|---|\n");
        for e in Exit::ALL {
            s.push_str(&format!(
                "| {} | {} | {} |\n",
                e.code(),
                e.meaning(),
                e.commands()
            ));
        }
        s
    }
}

/// Each command, as `docs/exit-codes.md` heads its section ("Each command"), with every
/// code it can end with: what its error types map to (`exit()`), 2 for a usage error (clap)
/// and 71 when the async runtime cannot start (any command). The table of all commands is
/// made from this, and a test checks each command's own table against it.
pub const COMMANDS: [(&str, &[Exit]); 9] = [
    (
        "bootstrap",
        &[
            Exit::Ok,
            Exit::Usage,
            Exit::DataErr,
            Exit::Unavailable,
            Exit::OsErr,
            Exit::MountFailed,
            Exit::IoErr,
            Exit::TempFail,
            Exit::Protocol,
            Exit::NoPerm,
            Exit::Config,
        ],
    ),
    // The daemon: its identity (IMDS, `DescribeTags`), the drain state, signals.
    (
        "run",
        &[
            Exit::Ok,
            Exit::Usage,
            Exit::Unavailable,
            Exit::OsErr,
            Exit::IoErr,
            Exit::TempFail,
            Exit::NoPerm,
            Exit::Config,
        ],
    ),
    // The operator commands: their identity and the drain state machine's errors.
    (
        "drain",
        &[
            Exit::Ok,
            Exit::Usage,
            Exit::Unavailable,
            Exit::OsErr,
            Exit::IoErr,
            Exit::TempFail,
            Exit::NoPerm,
            Exit::Config,
        ],
    ),
    (
        "resume",
        &[
            Exit::Ok,
            Exit::Usage,
            Exit::Unavailable,
            Exit::OsErr,
            Exit::IoErr,
            Exit::TempFail,
            Exit::NoPerm,
            Exit::Config,
        ],
    ),
    (
        "status",
        &[
            Exit::Ok,
            Exit::Usage,
            Exit::Unavailable,
            Exit::OsErr,
            Exit::IoErr,
            Exit::NoPerm,
            Exit::Config,
        ],
    ),
    // `check` never asks IMDS (Slurm runs it often): no 69 nor 77.
    (
        "check",
        &[
            Exit::Ok,
            Exit::Unhealthy,
            Exit::Usage,
            Exit::OsErr,
            Exit::IoErr,
            Exit::Config,
        ],
    ),
    (
        "config show",
        &[
            Exit::Ok,
            Exit::Usage,
            Exit::Unavailable,
            Exit::OsErr,
            Exit::NoPerm,
            Exit::Config,
        ],
    ),
    (
        "config cloudwatch",
        &[
            Exit::Ok,
            Exit::Usage,
            Exit::Unavailable,
            Exit::OsErr,
            Exit::IoErr,
            Exit::NoPerm,
            Exit::Config,
        ],
    ),
    // Written, not uploaded, is 69; an unreadable part is listed, never an error.
    (
        "support-bundle",
        &[
            Exit::Ok,
            Exit::Usage,
            Exit::Unavailable,
            Exit::OsErr,
            Exit::IoErr,
            Exit::Config,
        ],
    ),
];

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.code())
    }
}

impl From<Exit> for std::process::ExitCode {
    fn from(e: Exit) -> std::process::ExitCode {
        std::process::ExitCode::from(e.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo_file(path: &str) -> (std::path::PathBuf, String) {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(path);
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        (p, text)
    }

    #[test]
    fn codes_are_distinct_and_in_order() {
        let codes: Vec<u8> = Exit::ALL.iter().map(|e| e.code()).collect();
        assert!(codes.windows(2).all(|w| w[0] < w[1]), "{codes:?}");
    }

    /// `docs/exit-codes.md`'s first table is this one, row for row.
    #[test]
    fn docs_exit_codes_md_lists_this_table() {
        let (path, text) = repo_file("docs/exit-codes.md");
        let start = text
            .find("| code | meaning | commands |")
            .unwrap_or_else(|| {
                panic!(
                    "{}: no `| code | meaning | commands |` table",
                    path.display()
                )
            });
        let written: Vec<&str> = text[start..]
            .lines()
            .take_while(|l| l.starts_with('|'))
            .collect();
        let code = Exit::markdown_table();
        let generated: Vec<&str> = code.lines().collect();
        assert!(
            written == generated,
            "{} (\"All commands\") differs from the code's exit codes (src/exit.rs); make it:\n\n{code}",
            path.display()
        );
    }

    /// Each command's own table in `docs/exit-codes.md` lists exactly the codes
    /// [`COMMANDS`] gives it, in order.
    #[test]
    fn docs_exit_codes_md_each_commands_table_lists_its_codes() {
        let (path, text) = repo_file("docs/exit-codes.md");
        for (name, codes) in COMMANDS {
            let head = format!("### `slurm-node-agent {name}`");
            let start = text
                .find(&head)
                .unwrap_or_else(|| panic!("{}: no section {head}", path.display()));
            let table = text[start..]
                .find("| code | cause |")
                .map(|i| start + i)
                .unwrap_or_else(|| panic!("{}: {head} has no table", path.display()));
            let written: Vec<u8> = text[table..]
                .lines()
                .skip(2)
                .take_while(|l| l.starts_with('|'))
                .map(|l| {
                    let c = l
                        .trim_start_matches('|')
                        .split('|')
                        .next()
                        .unwrap_or("")
                        .trim();
                    c.parse()
                        .unwrap_or_else(|e| panic!("{}: {head}: {l:?}: {e}", path.display()))
                })
                .collect();
            let declared: Vec<u8> = codes.iter().map(|e| e.code()).collect();
            assert_eq!(
                written,
                declared,
                "{}: {head}'s table lists codes {written:?}; src/exit.rs's COMMANDS says {declared:?}",
                path.display()
            );
        }
    }

    /// A unit's `RestartPreventExitStatus=` codes, with the unit's path.
    fn restart_prevented(unit: &str) -> (std::path::PathBuf, Vec<u8>) {
        let (path, text) = repo_file(unit);
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("RestartPreventExitStatus="))
            .unwrap_or_else(|| panic!("{}: no RestartPreventExitStatus=", path.display()));
        let codes = line
            .split_whitespace()
            .map(|c| c.parse().unwrap_or_else(|e| panic!("{c:?}: {e}")))
            .collect();
        (path, codes)
    }

    /// The daemon's unit restarts it after anything but what a person must fix: its own
    /// codes that are not temporary (usage, permission, settings).
    #[test]
    fn the_daemon_unit_stops_on_what_a_person_must_fix() {
        let (path, prevented) = restart_prevented("units/slurm-node-agent.service");
        let (_, run) = COMMANDS
            .iter()
            .find(|(c, _)| *c == "run")
            .unwrap_or_else(|| panic!("no run in COMMANDS"));
        let permanent: Vec<u8> = run
            .iter()
            .filter(|e| e.code() > 1 && !e.is_temporary())
            .map(|e| e.code())
            .collect();
        assert_eq!(prevented, permanent, "{}", path.display());
    }

    /// The bootstrap unit retries exactly the temporary codes.
    #[test]
    fn the_bootstrap_unit_retries_the_temporary_codes() {
        let (path, prevented) = restart_prevented("units/slurm-node-agent-bootstrap.service");
        let permanent: Vec<u8> = Exit::ALL
            .iter()
            .filter(|e| e.code() > 1 && !e.is_temporary())
            .map(|e| e.code())
            .collect();
        assert_eq!(prevented, permanent, "{}", path.display());
    }
}
