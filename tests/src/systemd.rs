//! A real systemd 252 service manager (`systemd --user`) confined to its own cgroup
//! subtree, for testing code that drives systemd's Manager API over D-Bus.
//!
//! The recipe is the one in `shared/PROVING-GROUND.md`, with its safety rule enforced:
//! an unconfined `systemd --user` takes over every process of the machine. So a small
//! `sh` starter first moves itself into fresh cgroups `<name>` in every cgroup hierarchy
//! systemd uses (`/sys/fs/cgroup/systemd` and `/sys/fs/cgroup/unified` on this hybrid
//! machine, `/sys/fs/cgroup` alone on a pure cgroup v2 one), checks in each
//! `cgroup.procs` that the move happened (`set -e`: any failure ends the script before
//! systemd runs), and only then `exec`s `unshare -m` (private mount namespace), which
//! mounts a tmpfs on `/run/systemd`, creates `/run/systemd/system` and `exec`s systemd.
//! The pid of the spawned process is therefore systemd's.
//!
//! Stop: SIGTERM to systemd (a user manager then starts `exit.target`, stops its units and
//! exits, in about 0.1 s), then SIGKILL to whatever is left in its cgroups, then the
//! cgroup folders are removed deepest first.

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rustix::process::{kill_process, Signal};

use crate::process::{pid_of, run_ok, run_with_timeout, unique_name, wait_until, Daemon, TempRoot};

/// Deadline for `systemctl`, `busctl`, `systemd-run`.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long systemd gets to start its bus and answer.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The manager's configuration: unit output goes to the manager's own log (no journald
/// here), and a unit that ignores SIGTERM is killed after 10 s instead of 90 s.
const USER_CONF: &str = "[Manager]\n\
DefaultStandardOutput=inherit\n\
DefaultStandardError=inherit\n\
DefaultTimeoutStopSec=10s\n";

/// The starter: `$1` XDG_RUNTIME_DIR, `$2` XDG_CONFIG_HOME, then the cgroup folders.
const STARTER: &str = r#"set -eu
xdg=$1; cfg=$2; shift 2
[ "$#" -gt 0 ]
for d in "$@"; do
  echo "$$" > "$d/cgroup.procs"
  grep -qxF "$$" "$d/cgroup.procs"
done
exec unshare -m --propagation private sh -c 'set -e
mount -t tmpfs -o mode=0755 tmpfs /run/systemd
mkdir -p /run/systemd/system
printf "%s\n" "${SLURM_E2E_PRIVATE_DIRS:-}" | while read -r p m u g; do
  [ -n "$p" ] || continue
  mkdir -p "$p"
  mount -t tmpfs -o "mode=$m,uid=$u,gid=$g" tmpfs "$p"
done
XDG_RUNTIME_DIR="$1" XDG_CONFIG_HOME="$2" exec /usr/lib/systemd/systemd --user' sh "$xdg" "$cfg"
"#;

/// A confined `systemd --user` for one test; stopped and its cgroups removed on drop.
#[derive(Debug)]
pub struct UserSystemd {
    // Dropped before `root` (fields drop in order).
    daemon: Option<Daemon>,
    name: String,
    cgroups: Vec<PathBuf>,
    xdg_runtime_dir: PathBuf,
    xdg_config_home: PathBuf,
    root: TempRoot,
}

/// The cgroup hierarchies systemd uses on this machine.
pub(crate) fn cgroup_roots() -> Result<Vec<PathBuf>> {
    let base = Path::new("/sys/fs/cgroup");
    if base.join("cgroup.controllers").exists() {
        return Ok(vec![base.to_path_buf()]);
    }
    let named = base.join("systemd");
    if !named.join("cgroup.procs").exists() {
        bail!(
            "no cgroup hierarchy for systemd found (neither cgroup v2 on /sys/fs/cgroup nor \
             /sys/fs/cgroup/systemd): refusing to start systemd --user unconfined"
        );
    }
    let mut roots = vec![named];
    let unified = base.join("unified");
    if unified.join("cgroup.procs").exists() {
        roots.push(unified);
    }
    Ok(roots)
}

/// The prefix of the cgroup names; followed by the test process's pid, `x` and a counter.
const NAME_PREFIX: &str = "slurm-e2e-systemd-";

/// Removes the cgroups (and kills what is in them) of managers whose test process is
/// gone without cleaning up (killed by Ctrl-C or a runner's timeout).
fn sweep_stale_cgroups(roots: &[PathBuf]) {
    for root in roots {
        let Ok(entries) = fs::read_dir(root) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(owner) = name
                .strip_prefix(NAME_PREFIX)
                .and_then(|rest| rest.split('x').next())
                .and_then(|pid| pid.parse::<u32>().ok())
            else {
                continue;
            };
            if Path::new(&format!("/proc/{owner}")).exists() {
                continue;
            }
            let dir = e.path();
            for p in UserSystemd::pids_in(&dir) {
                if let Ok(pid) = pid_of(p) {
                    let _ = kill_process(pid, Signal::KILL);
                }
            }
            if let Err(err) = remove_cgroup_tree(&dir) {
                eprintln!(
                    "slurm-e2e: removing stale cgroup {}: {err:#}",
                    dir.display()
                );
            }
        }
    }
}

impl UserSystemd {
    /// Starts a confined `systemd --user` and waits until it answers on its bus.
    ///
    /// First removes what managers of test processes that died without cleaning up left
    /// behind (their cgroups and the processes in them).
    pub fn start() -> Result<UserSystemd> {
        Self::start_with_private_dirs(&[])
    }

    /// Like [`UserSystemd::start`], with a private tmpfs on each `(path, mode, uid, gid)`
    /// in the Manager's mount namespace, so that its units see their own folder there (for
    /// example their own `/run/munge` for a munged on the default socket).
    pub fn start_with_private_dirs(dirs: &[(&str, u32, u32, u32)]) -> Result<UserSystemd> {
        let spec: String = dirs
            .iter()
            .map(|(p, m, u, g)| format!("{p} {m:o} {u} {g}\n"))
            .collect();
        let roots = cgroup_roots()?;
        sweep_stale_cgroups(&roots);
        let name = unique_name(NAME_PREFIX);
        let root = TempRoot::new(&format!("{name}-"))?;
        let xdg_runtime_dir = root.subdir("xdg")?;
        fs::set_permissions(
            &xdg_runtime_dir,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .context("setting mode 0700 on XDG_RUNTIME_DIR")?;
        let xdg_config_home = root.subdir("config")?;
        let unit_dir = xdg_config_home.join("systemd/user");
        fs::create_dir_all(&unit_dir)
            .with_context(|| format!("creating {}", unit_dir.display()))?;
        fs::write(xdg_config_home.join("systemd/user.conf"), USER_CONF)
            .context("writing user.conf")?;

        let mut me = UserSystemd {
            daemon: None,
            name: name.clone(),
            cgroups: Vec::new(),
            xdg_runtime_dir,
            xdg_config_home,
            root,
        };
        for r in roots {
            let dir = r.join(&name);
            fs::create_dir(&dir).with_context(|| format!("creating cgroup {}", dir.display()))?;
            me.cgroups.push(dir);
        }

        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(STARTER)
            .arg("slurm-e2e-systemd-starter")
            .arg(&me.xdg_runtime_dir)
            .arg(&me.xdg_config_home)
            .args(&me.cgroups)
            .env("SYSTEMD_LOG_TARGET", "console")
            .env("SLURM_E2E_PRIVATE_DIRS", &spec)
            .env_remove("DBUS_SESSION_BUS_ADDRESS")
            .env_remove("NOTIFY_SOCKET");
        me.daemon = Some(Daemon::spawn("systemd-user", cmd, me.root.path())?);
        me.wait_ready()?;
        me.check_confined()?;
        Ok(me)
    }

    fn wait_ready(&mut self) -> Result<()> {
        let bus = self.xdg_runtime_dir.join("bus");
        let daemon = self.daemon.as_mut().context("systemd was started")?;
        let env = [("XDG_RUNTIME_DIR", self.xdg_runtime_dir.clone())];
        wait_until(
            "systemd --user to answer on its bus",
            START_TIMEOUT,
            Duration::from_millis(20),
            || {
                daemon.check_running()?;
                if !bus.exists() {
                    return Ok(None);
                }
                let mut c = Command::new("busctl");
                c.args([
                    "--user",
                    "get-property",
                    "org.freedesktop.systemd1",
                    "/org/freedesktop/systemd1",
                    "org.freedesktop.systemd1.Manager",
                    "Version",
                ])
                .envs(env.iter().cloned());
                let out = run_with_timeout(c, CLIENT_TIMEOUT)?;
                Ok(out.status.success().then_some(()))
            },
        )
        .with_context(|| format!("systemd log:\n{}", daemon.log_tail(30)))
    }

    /// Belt and braces: systemd's process must sit inside our subtree in every hierarchy.
    fn check_confined(&mut self) -> Result<()> {
        let pid = self.pid();
        let cg = fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .with_context(|| format!("reading /proc/{pid}/cgroup"))?;
        for line in cg.lines() {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next(), parts.next(), parts.next());
            let relevant = matches!(controllers, Some("") | Some("name=systemd"));
            if relevant && !path.is_some_and(|p| p.starts_with(&format!("/{}", self.name))) {
                self.stop();
                bail!(
                    "systemd --user (pid {pid}) is not inside cgroup /{}: {line}",
                    self.name
                );
            }
        }
        Ok(())
    }

    /// systemd's process id.
    pub fn pid(&self) -> u32 {
        self.daemon.as_ref().map_or(0, Daemon::pid)
    }

    /// The cgroup name (`/sys/fs/cgroup/<hierarchy>/<name>`).
    pub fn cgroup_name(&self) -> &str {
        &self.name
    }

    /// The cgroup folders created for this manager, one per hierarchy.
    pub fn cgroups(&self) -> &[PathBuf] {
        &self.cgroups
    }

    /// `XDG_RUNTIME_DIR` of the manager (holds `bus` and `systemd/private`).
    pub fn xdg_runtime_dir(&self) -> &Path {
        &self.xdg_runtime_dir
    }

    /// `XDG_CONFIG_HOME` of the manager.
    pub fn xdg_config_home(&self) -> &Path {
        &self.xdg_config_home
    }

    /// Where the manager loads user units from: `$XDG_CONFIG_HOME/systemd/user`. Write
    /// units there, then call [`UserSystemd::daemon_reload`].
    pub fn unit_dir(&self) -> PathBuf {
        self.xdg_config_home.join("systemd/user")
    }

    /// The D-Bus session bus the manager is on (`dbus-daemon` started by its
    /// `dbus.socket`): `unix:path=<xdg>/bus`. systemd owns `org.freedesktop.systemd1` there.
    pub fn bus_address(&self) -> String {
        format!("unix:path={}", self.xdg_runtime_dir.join("bus").display())
    }

    /// The manager's private peer-to-peer socket (`<xdg>/systemd/private`), no bus daemon.
    pub fn private_socket(&self) -> PathBuf {
        self.xdg_runtime_dir.join("systemd/private")
    }

    /// `XDG_RUNTIME_DIR` and `DBUS_SESSION_BUS_ADDRESS` for clients of this manager.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            (
                "XDG_RUNTIME_DIR".into(),
                self.xdg_runtime_dir.display().to_string(),
            ),
            ("DBUS_SESSION_BUS_ADDRESS".into(), self.bus_address()),
        ]
    }

    /// `program` with [`UserSystemd::env`] set.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new(program);
        c.envs(self.env());
        c
    }

    /// `systemctl --user args...`; a non-zero exit is returned, not an error.
    pub fn systemctl(&self, args: &[&str]) -> Result<Output> {
        let mut c = self.command("systemctl");
        c.arg("--user").args(args);
        run_with_timeout(c, CLIENT_TIMEOUT)
    }

    /// `systemctl --user args...`; a non-zero exit is an error. Returns stdout.
    pub fn systemctl_ok(&self, args: &[&str]) -> Result<String> {
        let mut c = self.command("systemctl");
        c.arg("--user").args(args);
        run_ok(c, CLIENT_TIMEOUT)
    }

    /// `busctl --user args...`; a non-zero exit is an error. Returns stdout.
    pub fn busctl(&self, args: &[&str]) -> Result<String> {
        let mut c = self.command("busctl");
        c.arg("--user").args(args);
        run_ok(c, CLIENT_TIMEOUT)
    }

    /// `systemctl --user daemon-reload`.
    pub fn daemon_reload(&self) -> Result<()> {
        self.systemctl_ok(&["daemon-reload"]).map(drop)
    }

    /// One property of a unit (`systemctl --user show -p <prop> --value <unit>`).
    pub fn unit_property(&self, unit: &str, prop: &str) -> Result<String> {
        Ok(self
            .systemctl_ok(&["show", "-p", prop, "--value", unit])?
            .trim()
            .to_string())
    }

    /// The manager's log (its own messages and, by the user.conf written here, the output
    /// of its units).
    pub fn log_path(&self) -> Option<&Path> {
        self.daemon.as_ref().map(Daemon::log_path)
    }

    /// Every pid in the subtree of `dir`.
    fn pids_in(dir: &Path) -> Vec<u32> {
        let mut pids = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            if let Ok(s) = fs::read_to_string(d.join("cgroup.procs")) {
                pids.extend(s.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
            }
            if let Ok(rd) = fs::read_dir(&d) {
                stack.extend(
                    rd.flatten()
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .map(|e| e.path()),
                );
            }
        }
        pids
    }

    /// Stops systemd and everything in its cgroups, and removes the cgroups. Idempotent.
    fn stop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            if let Err(e) = d.stop() {
                eprintln!("slurm-e2e: stopping systemd --user: {e:#}");
            }
            // Its Drop prints the log tail when a test panics.
            drop(d);
        }
        // Whatever systemd left (it normally stops all its units itself).
        let cgroups = self.cgroups.clone();
        let _ = wait_until(
            "the systemd --user cgroups to empty",
            Duration::from_secs(10),
            Duration::from_millis(20),
            || {
                let pids: Vec<u32> = cgroups.iter().flat_map(|c| Self::pids_in(c)).collect();
                for p in &pids {
                    if let Ok(pid) = pid_of(*p) {
                        let _ = kill_process(pid, Signal::KILL);
                    }
                }
                Ok(pids.is_empty().then_some(()))
            },
        );
        for cg in std::mem::take(&mut self.cgroups) {
            if let Err(e) = remove_cgroup_tree(&cg) {
                eprintln!("slurm-e2e: removing cgroup {}: {e:#}", cg.display());
            }
        }
    }
}

impl Drop for UserSystemd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Removes a cgroup folder and its sub-cgroups, deepest first, retrying while zombies
/// still hold them (EBUSY) for up to 10 s.
pub(crate) fn remove_cgroup_tree(dir: &Path) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    let mut dirs = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(rd) = fs::read_dir(&d) {
            stack.extend(
                rd.flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
        dirs.push(d);
    }
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    for d in dirs {
        wait_until(
            &format!("removing cgroup {}", d.display()),
            Duration::from_secs(10),
            Duration::from_millis(50),
            || match fs::remove_dir(&d) {
                Ok(()) => Ok(Some(())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Some(())),
                Err(e) => Err(e.into()),
            },
        )?;
    }
    Ok(())
}
