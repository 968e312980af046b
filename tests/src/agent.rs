//! A whole node for the agent to bootstrap: a slurmctld, moto holding the cluster's munge
//! key, the IMDS emulator, and a confined `systemd --user` Manager with the distribution's
//! own `munge.service` and `slurmd.service` (read from `/lib/systemd/system`, with only
//! their paths pointed into the scratch folder), plus the agent's settings file.
//!
//! The node's munged must sit on munge's default socket (configless slurmd cannot use
//! another), where the shared test munged already is. So the Manager gets a private
//! `/run/munge` (a tmpfs in its own mount namespace): the agent's munged runs there, with
//! the key the agent fetched, and the controller's side keeps the shared munged with the
//! same key. Credentials cross because the keys are equal.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use base64::Engine;
use imds_emulator::{Config, Emulator};

use crate::process::{run_ok, run_with_timeout, TempRoot};
use crate::{Moto, Munge, Slurmctld, UserSystemd};

/// Secrets Manager secret holding the base64 munge key (as ParallelCluster stores it).
pub const KEY_SECRET: &str = "cluster/munge-key";

/// NodeName the default template gives for the emulator's default `local-hostname`.
pub const DEFAULT_NODE_NAME: &str = "ip-172-16-34-43";

/// Where the built `slurm-node-agent` binary is: next to the running test's `deps/` folder
/// (`target/<profile>/`), or `SLURM_NODE_AGENT_BIN`.
///
/// # Errors
/// When it has not been built (`cargo build -p slurm-node-agent`).
pub fn agent_binary() -> Result<PathBuf> {
    if let Ok(p) = std::env::var("SLURM_NODE_AGENT_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("current_exe")?;
    for dir in exe.ancestors().skip(1).take(3) {
        let p = dir.join("slurm-node-agent");
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!(
        "slurm-node-agent binary not found near {}: run `cargo build -p slurm-node-agent` \
         (scripts/test.sh does) or set SLURM_NODE_AGENT_BIN",
        exe.display()
    )
}

/// Where the built `slurm-node-agent-healthcheck` (Slurm's HealthCheckProgram) is: next to
/// [`agent_binary`], which builds it too.
///
/// # Errors
/// When it has not been built (`cargo build -p slurm-node-agent`).
pub fn healthcheck_binary() -> Result<PathBuf> {
    let p = agent_binary()?.with_file_name("slurm-node-agent-healthcheck");
    if !p.is_file() {
        bail!(
            "{} not found: run `cargo build -p slurm-node-agent` (scripts/test.sh does)",
            p.display()
        );
    }
    Ok(p)
}

/// One node's world. Fields drop in order: systemd (and the node's munged and slurmd)
/// first, then the controller, moto and the emulator.
#[derive(Debug)]
pub struct NodeEnv {
    /// The Manager that runs the node's munge.service and slurmd.service.
    pub systemd: UserSystemd,
    /// The controller.
    pub ctld: Slurmctld,
    /// SSM and Secrets Manager.
    pub moto: Moto,
    /// Instance metadata.
    pub imds: Emulator,
    /// Scratch folder: settings, key, options file, state.
    pub root: TempRoot,
    /// The controller runs auth/slurm ([`NodeEnv::start_auth_slurm`]).
    auth_slurm: bool,
}

impl NodeEnv {
    /// Starts everything; the settings file names the key secret, the controller, IMDS and
    /// the Manager's bus. `extra_settings` is appended to it (TOML).
    ///
    /// # Errors
    /// When a component fails to start.
    pub fn start(extra_settings: &str) -> Result<NodeEnv> {
        Self::start_with(&[], extra_settings)
    }

    /// Like [`NodeEnv::start`], with extra slurm.conf lines for the controller (static
    /// node declarations, health check settings).
    ///
    /// # Errors
    /// When a component fails to start.
    pub fn start_with(ctld_lines: &[String], extra_settings: &str) -> Result<NodeEnv> {
        Self::start_opts(ctld_lines, extra_settings, false)
    }

    /// Like [`NodeEnv::start_with`], with a controller that runs `AuthType=auth/slurm`
    /// ([`crate::slurm::SlurmctldBuilder::auth_slurm`], Slurm 23.11+): the secret holds its
    /// `slurm.key` (base64), the agent's key file is [`NodeEnv::key_path`] (`slurm.key` in
    /// the scratch folder, never the compile-time `<sysconfdir>/slurm.key`), and the
    /// Manager gets a private `/run/slurm` for slurmd's `sack.socket`. The settings do not
    /// set `auth.type`: each test says it (a drop-in) or leaves it to the managed join.
    ///
    /// # Errors
    /// When a component fails to start.
    pub fn start_auth_slurm(ctld_lines: &[String], extra_settings: &str) -> Result<NodeEnv> {
        Self::start_opts(ctld_lines, extra_settings, true)
    }

    fn start_opts(
        ctld_lines: &[String],
        extra_settings: &str,
        auth_slurm: bool,
    ) -> Result<NodeEnv> {
        let mut builder = Slurmctld::builder("boot");
        for l in ctld_lines {
            builder = builder.line(l.clone());
        }
        if auth_slurm {
            builder = builder.auth_slurm();
        }
        let ctld = builder.start()?;
        let moto = Moto::start()?;
        let key = if auth_slurm {
            ctld.slurm_key()?
        } else {
            Munge::shared()?.key()?
        };
        moto.create_secret_string(
            KEY_SECRET,
            &base64::engine::general_purpose::STANDARD.encode(&key),
        )?;
        let imds = Emulator::start(Config::default()).context("starting the IMDS emulator")?;
        imds.clear_tags();
        imds.clear_user_data();

        let root = TempRoot::new("slurm-e2e-node-")?;
        // munged (user munge) must reach its key, log and seed through these folders.
        fs::set_permissions(root.path(), fs::Permissions::from_mode(0o755))?;
        let munge_dir = root.subdir("munge")?;
        let (uid, gid) = munge_ids()?;
        rustix::fs::chown(
            &munge_dir,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        )?;
        fs::set_permissions(&munge_dir, fs::Permissions::from_mode(0o700))?;
        root.subdir("conf.d")?;

        // slurmd with auth/slurm serves its node's clients on /run/slurm/sack.socket: the
        // node's own, not the host's.
        let private: &[(&str, u32, u32, u32)] = if auth_slurm {
            &[("/run/munge", 0o755, uid, gid), ("/run/slurm", 0o755, 0, 0)]
        } else {
            &[("/run/munge", 0o755, uid, gid)]
        };
        let systemd = UserSystemd::start_with_private_dirs(private)?;
        let env = NodeEnv {
            systemd,
            ctld,
            moto,
            imds,
            root,
            auth_slurm,
        };
        env.install_units()?;
        fs::create_dir_all(env.ctld.spool_dir(DEFAULT_NODE_NAME))?;
        fs::write(env.config_path(), env.settings(extra_settings))?;
        Ok(env)
    }

    /// The agent's main settings file.
    pub fn config_path(&self) -> PathBuf {
        self.root.path().join("agent.toml")
    }

    /// The drop-in folder.
    pub fn config_dir(&self) -> PathBuf {
        self.root.path().join("conf.d")
    }

    /// The key file the agent writes: `munge/munge.key` in the scratch folder, or
    /// `slurm.key` there with an auth/slurm controller.
    pub fn key_path(&self) -> PathBuf {
        if self.auth_slurm {
            self.root.path().join("slurm.key")
        } else {
            self.root.path().join("munge/munge.key")
        }
    }

    /// The file the agent writes `SLURMD_OPTIONS` to (`/etc/default/slurmd` on a node).
    pub fn options_file(&self) -> PathBuf {
        self.root.path().join("default-slurmd")
    }

    /// The words of the `SLURMD_OPTIONS` the agent wrote ([`NodeEnv::options_file`]):
    /// `-N`, the name, `--conf-server`, ... (empty when there is no such line). A test
    /// asks these for an option, never the whole file, whose paths hold random letters.
    pub fn slurmd_options(&self) -> Vec<String> {
        let text = std::fs::read_to_string(self.options_file()).unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix("SLURMD_OPTIONS="))
            .map(|v| {
                v.trim_matches(|c| c == '\'' || c == '"')
                    .split_whitespace()
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The agent's state folder.
    pub fn state_dir(&self) -> PathBuf {
        self.root.path().join("state")
    }

    fn settings(&self, extra: &str) -> String {
        format!(
            "# Written by slurm-e2e for one test.\n\
             [slurm]\n\
             conf_servers = [\"{server}\"]\n\
             {bin_dir}\
             slurmd_options_file = \"{options}\"\n\
             join_deadline = \"60s\"\n\
             [auth]\n\
             key_source = \"secretsmanager:{KEY_SECRET}\"\n\
             key_path = \"{key}\"\n\
             [imds]\n\
             endpoint = \"{imds}\"\n\
             [systemd]\n\
             bus = \"{bus}\"\n\
             [agent]\n\
             state_dir = \"{state}\"\n\
             {extra}\n",
            server = self.ctld.conf_server(),
            // The Slurm under test (a test that sets its own bin_dir keeps it).
            bin_dir = if extra.contains("bin_dir") {
                String::new()
            } else {
                format!("bin_dir = \"{}\"\n", crate::install::bin_dir().display())
            },
            options = self.options_file().display(),
            key = self.key_path().display(),
            imds = self.imds.endpoint(),
            bus = self.systemd.bus_address(),
            state = self.state_dir().display(),
        )
    }

    /// Writes munge.service and slurmd.service into the Manager's unit folder, from the
    /// distribution's units, and reloads it.
    fn install_units(&self) -> Result<()> {
        let dir = self.systemd.unit_dir();
        let munge_dir = self.root.path().join("munge");
        let munge_env = self.root.path().join("default-munge");
        fs::write(
            &munge_env,
            format!(
                "OPTIONS=\"--key-file={} --seed-file={}/munged.seed --log-file={}/munged.log\"\n",
                self.key_path().display(),
                munge_dir.display(),
                munge_dir.display()
            ),
        )?;
        let munge = fs::read_to_string("/lib/systemd/system/munge.service")
            .context("reading Debian's munge.service (apt-get install munge)")?;
        let munge = rewrite_unit(
            &munge,
            &[(
                "EnvironmentFile=",
                Some(format!("EnvironmentFile=-{}", munge_env.display())),
            )],
            // /run/munge is the Manager's private tmpfs (a user manager would put a
            // RuntimeDirectory under XDG_RUNTIME_DIR instead).
            &["RuntimeDirectory", "RuntimeDirectoryMode"],
        );
        fs::write(dir.join("munge.service"), munge)?;

        let unit = crate::install::unit_file("slurmd.service");
        let slurmd = fs::read_to_string(&unit).with_context(|| {
            format!(
                "reading {} (the slurmd unit of the Slurm under test)",
                unit.display()
            )
        })?;
        let slurmd = rewrite_unit(
            &slurmd,
            &[(
                "EnvironmentFile=",
                Some(format!(
                    "EnvironmentFile=-{}",
                    self.options_file().display()
                )),
            )],
            // Configless: no /etc/slurm/slurm.conf (the image's drop-in clears this
            // condition too); the pid file would be shared by parallel tests.
            &["ConditionPathExists", "PIDFile"],
        );
        fs::write(dir.join("slurmd.service"), slurmd)?;
        self.systemd.daemon_reload()
    }

    /// `slurm-node-agent <args>` with this node's settings and environment.
    ///
    /// # Errors
    /// When the binary is missing.
    pub fn agent_command(&self, args: &[&str]) -> Result<Command> {
        let mut c = Command::new(agent_binary()?);
        c.args(args)
            .arg("--config")
            .arg(self.config_path())
            .arg("--config-dir")
            .arg(self.config_dir())
            .env_clear()
            .env("PATH", agent_path())
            .env(
                "RUST_LOG",
                std::env::var("SLURM_E2E_AGENT_LOG").unwrap_or_else(|_| "info".into()),
            )
            .envs(self.moto.env())
            .envs(self.ctld.env())
            // On a user bus the agent writes .mount units and its mounts-ready marker where
            // this Manager looks: its XDG folders, not the host's /run/user/0.
            .env("XDG_RUNTIME_DIR", self.systemd.xdg_runtime_dir())
            .env("XDG_CONFIG_HOME", self.systemd.xdg_config_home());
        Ok(c)
    }

    /// Runs `slurm-node-agent bootstrap --output json <extra>`.
    ///
    /// # Errors
    /// When it cannot be run or does not finish in 120 s.
    pub fn bootstrap(&self, extra: &[&str]) -> Result<Output> {
        let mut args = vec!["bootstrap", "--output", "json"];
        args.extend_from_slice(extra);
        run_with_timeout(self.agent_command(&args)?, Duration::from_secs(120))
    }

    /// slurmd's MainPID under the Manager (0 when not running).
    ///
    /// # Errors
    /// When systemctl fails.
    pub fn slurmd_pid(&self) -> Result<u32> {
        let v = self.systemd.unit_property("slurmd.service", "MainPID")?;
        Ok(v.trim().parse().unwrap_or(0))
    }

    /// Runs a job on the node through the controller and returns its stdout.
    ///
    /// # Errors
    /// When the job fails.
    pub fn srun_hostname(&self, node: &str) -> Result<String> {
        let mut c = self.ctld.command("srun");
        c.args(["-N1", "-w", node, "--time=1", "hostname"]);
        run_ok(c, Duration::from_secs(60))
    }
}

/// The agent's PATH: the Slurm under test first, then the system's.
fn agent_path() -> String {
    let p = crate::install::prefix();
    format!(
        "{}:{}:/usr/sbin:/usr/bin:/sbin:/bin",
        p.join("sbin").display(),
        p.join("bin").display()
    )
}

/// Replaces lines starting with a key, and drops lines whose key is in `drop`.
fn rewrite_unit(unit: &str, replace: &[(&str, Option<String>)], drop: &[&str]) -> String {
    let mut out = String::new();
    for line in unit.lines() {
        let key = line.split('=').next().unwrap_or_default();
        if drop.contains(&key) {
            continue;
        }
        match replace.iter().find(|(prefix, _)| line.starts_with(prefix)) {
            Some((_, Some(new))) => out.push_str(new),
            Some((_, None)) => continue,
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// uid and gid of the `munge` user.
///
/// # Errors
/// When munge is not installed.
pub fn munge_ids() -> Result<(u32, u32)> {
    user_ids("munge").context("apt-get install munge")
}

/// uid and gid of the `slurm` user (auth/slurm's key owner).
///
/// # Errors
/// When there is no such user.
pub fn slurm_ids() -> Result<(u32, u32)> {
    user_ids("slurm").context("scripts/slurm-build.sh makes it")
}

fn user_ids(name: &str) -> Result<(u32, u32)> {
    let passwd = fs::read_to_string("/etc/passwd")?;
    for line in passwd.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() > 3 && f[0] == name {
            return Ok((f[2].parse()?, f[3].parse()?));
        }
    }
    bail!("no {name} user in /etc/passwd")
}

/// The names of the steps in a bootstrap report, in order (`settings`, `instance_metadata`,
/// ..., `join`).
pub fn step_names(report: &serde_json::Value) -> Vec<&str> {
    report["steps"]
        .as_array()
        .map(|a| a.iter().filter_map(|s| s["name"].as_str()).collect())
        .unwrap_or_default()
}

/// Parses the agent's `--output json` report.
///
/// # Errors
/// When stdout is not one JSON object.
pub fn report(out: &Output) -> Result<serde_json::Value> {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).with_context(|| {
        format!(
            "agent stdout is not JSON: {text}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Whether `path` exists (for key-file assertions).
pub fn exists(path: &Path) -> bool {
    path.exists()
}
