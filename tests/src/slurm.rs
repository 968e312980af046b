//! A real slurmctld (Slurm 22.05 from Debian) per test on 127.0.0.1 (or on another machine
//! made of namespaces, [`SlurmctldBuilder::machine`]: the fleet's controller), and bare
//! slurmds to join it, following `shared/PROVING-GROUND.md`.
//!
//! Each [`Slurmctld`] has its own scratch folder, cluster name, `SlurmctldPort` and
//! `SlurmdPort` (both picked free), so tests run in parallel. Client commands get
//! `SLURM_CONF` pointing at its `slurm.conf`; slurmds join configless with
//! `--conf-server 127.0.0.1:<port>`.
//!
//! Facts that shape this module (checked on Debian 12, Slurm 22.05.8):
//! - slurmd creates only the last component of `SlurmdSpoolDir` (`.../spool/<node>`); a
//!   missing parent is fatal (`mkdir(...): No such file or directory`). The parent is
//!   created here, and the node's folder too.
//! - configless slurmd needs no `-f` and no local slurm.conf; it caches the config in
//!   `SlurmdSpoolDir/conf-cache` and points the machine-wide `/run/slurm/conf` link at
//!   it (last slurmd started wins: always pass `SLURM_CONF` to clients).
//! - `SLURMD_OPTIONS` is only read by Debian's `slurmd.service` (`EnvironmentFile=-
//!   /etc/default/slurmd`), whose `ConditionPathExists=/etc/slurm/slurm.conf` skips a
//!   configless node unless overridden.
//! - A dynamic node's address is the source address of its registration, so two dynamic
//!   slurmds on one address cannot both run jobs; one per controller is fine.

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::munge::Munge;
use crate::process::{
    free_port, run_ok, run_with_timeout, unique_name, wait_until, Daemon, TempRoot,
};

/// Deadline for one client command (scontrol, sinfo): Slurm's own message timeout is 10 s.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

/// Deadline for a job run with [`Slurmctld::run_job`].
pub const JOB_TIMEOUT: Duration = Duration::from_secs(120);

/// How long slurmctld gets to answer `scontrol ping` (about 0.3 s here).
const CTLD_START_TIMEOUT: Duration = Duration::from_secs(30);

/// How often slurmctld is started with new ports when it cannot bind the picked ones.
const START_ATTEMPTS: u32 = 3;

/// The default partition: every node, default, no time limit.
pub const DEFAULT_PARTITION: &str =
    "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP";

/// Builds the configuration of a [`Slurmctld`]; see [`Slurmctld::builder`].
#[derive(Debug, Clone)]
pub struct SlurmctldBuilder {
    cluster_name: String,
    max_node_count: u32,
    lines: Vec<String>,
    partitions: Vec<String>,
    machine: Option<CtldMachine>,
    auth_slurm: bool,
}

/// Another machine for slurmctld, made of namespaces the test created (see
/// [`SlurmctldBuilder::machine`]; the fleet's controller is one, `crate::fleet`).
#[derive(Debug, Clone)]
pub struct CtldMachine {
    /// `nsenter` options that put a process on that machine, e.g. `["-t", "<pid>", "-n",
    /// "-u", "-m"]` (the namespaces of a process that holds them): slurmctld is started
    /// (and started again) through `nsenter <enter> -- slurmctld ...`, which execs it, so
    /// the daemon's pid is slurmctld's.
    pub enter: Vec<String>,
    /// The machine's host name, as slurmctld reads it there (`SlurmctldHost=<hostname>(...)`:
    /// slurmctld refuses to run under a name that is not its own).
    pub hostname: String,
    /// Its address, where slurmctld listens and every node and client reaches it.
    pub addr: Ipv4Addr,
    /// The network namespace (a `/run/netns/<name>` path) where the test's client commands
    /// (`scontrol`, `sinfo`, `srun`, ...) run: a workstation on the controller's network,
    /// which the nodes reach back (srun's I/O).
    pub clients_netns: PathBuf,
    /// The machine's own `/run` as the host sees it (`/proc/<holder>/root/run`): an
    /// auth/slurm slurmctld there makes the clients' credentials at
    /// `<run_dir>/slurmctld/sack.socket`.
    pub run_dir: PathBuf,
}

/// `program` run through `nsenter <enter> --` (which execs it: the child's pid is the
/// program's), or directly when `None`.
///
/// A Slurm program's name resolves to the installation under test
/// ([`crate::install::program`]).
fn ns_command(enter: Option<&[String]>, program: impl AsRef<OsStr>) -> Command {
    let program = crate::install::program(program);
    match enter {
        Some(args) => {
            let mut c = Command::new("nsenter");
            c.args(args).arg("--").arg(program);
            c
        }
        None => Command::new(program),
    }
}

impl CtldMachine {
    /// `nsenter` options for the client commands: the clients' network namespace.
    fn client_enter(&self) -> Vec<String> {
        vec![format!("--net={}", self.clients_netns.display())]
    }

    /// [`CtldMachine::client_enter`], and the machine's mount namespace too: an auth/slurm
    /// client makes its credentials at slurmctld's `/run/slurmctld/sack.socket`, which
    /// Slurm before 25.05 looks for at that fixed path only (no `SLURM_SACK_SOCKET`).
    fn client_enter_with_run(&self) -> Vec<String> {
        let mut v = self.client_enter();
        if let Some(i) = self.enter.iter().position(|a| a == "-t") {
            if let Some(pid) = self.enter.get(i + 1) {
                v.splice(0..0, ["-t".to_string(), pid.clone(), "-m".to_string()]);
            }
        }
        v
    }
}

impl SlurmctldBuilder {
    /// Runs slurmctld on another machine (`machine`): entered through `nsenter`, named
    /// `SlurmctldHost=<hostname>(<addr>)` and listening on every address of that machine
    /// (without `NoCtldInAddrAny`, which would bind the host name's loopback address
    /// instead); the client commands of the [`Slurmctld`] run in
    /// [`CtldMachine::clients_netns`].
    pub fn machine(mut self, machine: CtldMachine) -> Self {
        self.machine = Some(machine);
        self
    }

    /// Adds a line to slurm.conf, after the built-in ones (later lines win in Slurm), e.g.
    /// `HealthCheckProgram=/abs/path`, `HealthCheckInterval=5`, `RebootProgram=/abs/path`,
    /// or a static `NodeName=n1 NodeHostname=<host> NodeAddr=127.0.0.1 Port=<p> CPUs=1`.
    ///
    /// The line is written as given: it must not contain a newline.
    pub fn line(mut self, line: impl Into<String>) -> Self {
        self.lines.push(line.into());
        self
    }

    /// Replaces the default partition ([`DEFAULT_PARTITION`]) with this one; call again to
    /// add more (`PartitionName=... Nodes=... Default=YES|NO`).
    pub fn partition(mut self, line: impl Into<String>) -> Self {
        self.partitions.push(line.into());
        self
    }

    /// `AuthType=auth/slurm` and `CredType=cred/slurm` (Slurm 23.11+) instead of
    /// auth/munge: a 64-byte random `slurm.key` (mode 0600) beside slurm.conf, where
    /// slurmctld reads it. slurmctld runs in a mount namespace of its own whose `/run` is
    /// the scratch folder's `run/`, so its `sack.socket` (`/run/slurmctld/sack.socket`
    /// there) is this controller's alone; the client commands reach it through
    /// `SLURM_SACK_SOCKET` ([`Slurmctld::env`]). On another machine ([`CtldMachine`]) it is
    /// that machine's `/run` (seen from the host at [`CtldMachine::run_dir`]).
    pub fn auth_slurm(mut self) -> Self {
        self.auth_slurm = true;
        self
    }

    /// `MaxNodeCount` (default 16): how many dynamic nodes may register.
    pub fn max_node_count(mut self, n: u32) -> Self {
        self.max_node_count = n;
        self
    }

    /// Starts munge (shared) and slurmctld, and waits until `scontrol ping` says UP.
    pub fn start(self) -> Result<Slurmctld> {
        for l in self.lines.iter().chain(&self.partitions) {
            if l.contains('\n') || l.contains('\r') {
                bail!("slurm.conf line {l:?} contains a line break");
            }
        }
        let root = TempRoot::new(&format!("slurm-e2e-{}-", self.cluster_name))?;
        if self.auth_slurm {
            let key = random_key(64)?;
            let path = root.path().join("slurm.key");
            write_atomic(&path, &key)?;
            fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
            if self.machine.is_none() {
                root.subdir("run")?;
            }
        } else {
            Munge::shared()?;
        }
        let mut last_error = None;
        for attempt in 1..=START_ATTEMPTS {
            match self.try_start(&root, attempt) {
                Ok((daemon, ctld_port, slurmd_port, conf)) => {
                    return Ok(Slurmctld {
                        daemon,
                        machine: self.machine.clone(),
                        auth_slurm: self.auth_slurm,
                        cluster_name: self.cluster_name,
                        ctld_port,
                        slurmd_port,
                        conf,
                        root,
                    });
                }
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("slurmctld was not started")))
    }

    fn try_start(&self, root: &TempRoot, attempt: u32) -> Result<(Daemon, u16, u16, PathBuf)> {
        let ctld_port = free_port();
        let mut slurmd_port = free_port();
        while slurmd_port == ctld_port {
            slurmd_port = free_port();
        }
        let conf = root.path().join("slurm.conf");
        let text = self.render(root.path(), ctld_port, slurmd_port)?;
        write_atomic(&conf, text.as_bytes())?;
        root.subdir("state")?;
        root.subdir("spool")?;
        let enter = self.machine.as_ref().map(|m| m.enter.as_slice());
        let clients = self.machine.as_ref().map(|m| match self.auth_slurm {
            true => m.client_enter_with_run(),
            false => m.client_enter(),
        });
        let sack = self
            .auth_slurm
            .then(|| sack_socket(root.path(), self.machine.as_ref()));
        // A machine of its own has its own /run already.
        let private_run = (self.auth_slurm && self.machine.is_none()).then_some(root.path());
        let mut cmd = ctld_command(enter, private_run);
        cmd.arg("-D")
            .arg("-c")
            .arg("-f")
            .arg(&conf)
            .env("SLURM_CONF", &conf);
        let mut daemon = Daemon::spawn(&format!("slurmctld-{attempt}"), cmd, root.path())?;
        let ping = |daemon: &mut Daemon| -> Result<Option<()>> {
            daemon.check_running()?;
            let mut c = ns_command(clients.as_deref(), "scontrol");
            c.arg("ping").env("SLURM_CONF", &conf);
            if let Some(s) = &sack {
                c.env("SLURM_SACK_SOCKET", s);
            }
            let out = run_with_timeout(c, CLIENT_TIMEOUT)?;
            Ok(String::from_utf8_lossy(&out.stdout)
                .contains("is UP")
                .then_some(()))
        };
        wait_until(
            "slurmctld to answer scontrol ping with UP",
            CTLD_START_TIMEOUT,
            Duration::from_millis(50),
            || ping(&mut daemon),
        )
        .with_context(|| format!("slurmctld log:\n{}", daemon.log_tail(30)))?;
        Ok((daemon, ctld_port, slurmd_port, conf))
    }

    fn render(&self, root: &Path, ctld_port: u16, slurmd_port: u16) -> Result<String> {
        let r = root.display();
        let (host, addr, comm) = match &self.machine {
            Some(m) => (m.hostname.clone(), m.addr.to_string(), ""),
            None => (
                short_hostname()?,
                "127.0.0.1".to_string(),
                "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny\n",
            ),
        };
        let mut s = String::new();
        let _ = write!(
            s,
            "# Written by slurm-e2e for one test.\n\
             ClusterName={cluster}\n\
             SlurmctldHost={host}({addr})\n\
             SlurmctldPort={ctld_port}\n\
             SlurmdPort={slurmd_port}\n\
             SlurmctldParameters=enable_configless\n\
             {comm}\
             {auth}\
             SlurmUser=root\n\
             SlurmdUser=root\n\
             ProctrackType=proctrack/linuxproc\n\
             TaskPlugin=task/none\n\
             SelectType=select/cons_tres\n\
             SelectTypeParameters=CR_Core\n\
             MaxNodeCount={max}\n\
             TreeWidth=65533\n\
             ReturnToService=2\n\
             MpiDefault=none\n\
             StateSaveLocation={r}/state\n\
             SlurmctldPidFile={r}/slurmctld.pid\n\
             MailProg=/bin/true\n",
            cluster = self.cluster_name,
            max = self.max_node_count,
            auth = if self.auth_slurm {
                "AuthType=auth/slurm\nCredType=cred/slurm\n"
            } else {
                "AuthType=auth/munge\n"
            },
        );
        // The nodes' paths, unless a line sets them (nodes in containers have their own).
        for (key, value) in [
            ("SlurmdSpoolDir", format!("{r}/spool/%n")),
            ("SlurmdPidFile", format!("{r}/spool/slurmd-%n.pid")),
            ("SlurmdLogFile", format!("{r}/spool/slurmd-%n.log")),
        ] {
            if !self.lines.iter().any(|l| l.starts_with(&format!("{key}="))) {
                let _ = writeln!(s, "{key}={value}");
            }
        }
        for l in &self.lines {
            s.push_str(l);
            s.push('\n');
        }
        if self.partitions.is_empty() {
            s.push_str(DEFAULT_PARTITION);
            s.push('\n');
        }
        for p in &self.partitions {
            s.push_str(p);
            s.push('\n');
        }
        Ok(s)
    }
}

/// A running slurmctld for one test, stopped (and its scratch folder removed, unless the
/// test failed) on drop.
#[derive(Debug)]
pub struct Slurmctld {
    // Dropped first: the daemon stops before its folder goes.
    daemon: Daemon,
    machine: Option<CtldMachine>,
    auth_slurm: bool,
    cluster_name: String,
    ctld_port: u16,
    slurmd_port: u16,
    conf: PathBuf,
    root: TempRoot,
}

impl Slurmctld {
    /// A builder for a controller of cluster `name_prefix` + a unique suffix (lower-case
    /// letters and digits in the prefix keep it a valid ClusterName).
    pub fn builder(name_prefix: &str) -> SlurmctldBuilder {
        SlurmctldBuilder {
            cluster_name: unique_name(name_prefix),
            max_node_count: 16,
            lines: Vec::new(),
            partitions: Vec::new(),
            machine: None,
            auth_slurm: false,
        }
    }

    /// A controller with the default configuration.
    pub fn start(name_prefix: &str) -> Result<Slurmctld> {
        Self::builder(name_prefix).start()
    }

    /// The cluster name.
    pub fn cluster_name(&self) -> &str {
        &self.cluster_name
    }

    /// `<address>:<SlurmctldPort>` (127.0.0.1, or the machine's address given with
    /// [`SlurmctldBuilder::machine`]), for `slurmd --conf-server`.
    pub fn conf_server(&self) -> String {
        format!("{}:{}", self.address(), self.ctld_port)
    }

    /// The address slurmctld listens on (127.0.0.1 unless on another machine).
    pub fn address(&self) -> Ipv4Addr {
        self.machine
            .as_ref()
            .map_or(Ipv4Addr::LOCALHOST, |m| m.addr)
    }

    /// The machine it runs on ([`SlurmctldBuilder::machine`]), if not this host.
    pub fn machine(&self) -> Option<&CtldMachine> {
        self.machine.as_ref()
    }

    /// `nsenter` options of the client commands (`None`: run directly).
    fn client_enter(&self) -> Option<Vec<String>> {
        self.machine.as_ref().map(|m| match self.auth_slurm {
            true => m.client_enter_with_run(),
            false => m.client_enter(),
        })
    }

    /// `SlurmctldPort`.
    pub fn port(&self) -> u16 {
        self.ctld_port
    }

    /// `SlurmdPort` (the port every dynamic slurmd of this cluster listens on).
    pub fn slurmd_port(&self) -> u16 {
        self.slurmd_port
    }

    /// The slurm.conf.
    pub fn conf_path(&self) -> &Path {
        &self.conf
    }

    /// The scratch folder (slurm.conf, state/, spool/, logs).
    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// The spool folder of node `name` (`SlurmdSpoolDir` with `%n` replaced).
    pub fn spool_dir(&self, node: &str) -> PathBuf {
        self.root.path().join("spool").join(node)
    }

    /// The controller's daemon guard (pid, log).
    pub fn daemon(&mut self) -> &mut Daemon {
        &mut self.daemon
    }

    /// Stops slurmctld (SIGTERM: it saves its state); [`Slurmctld::restart`] brings it
    /// back.
    ///
    /// # Errors
    /// Waiting for it failed.
    pub fn stop(&mut self) -> Result<()> {
        self.daemon.stop()?;
        Ok(())
    }

    /// Starts slurmctld again with the same configuration and ports, recovering its saved
    /// state (no `-c`), and waits until `scontrol ping` says UP.
    ///
    /// # Errors
    /// It did not start or answer within the deadline.
    pub fn restart(&mut self) -> Result<()> {
        self.daemon.stop()?;
        let enter = self.machine.as_ref().map(|m| m.enter.as_slice());
        let private_run = (self.auth_slurm && self.machine.is_none()).then_some(self.root.path());
        let mut cmd = ctld_command(enter, private_run);
        cmd.arg("-D")
            .arg("-f")
            .arg(&self.conf)
            .env("SLURM_CONF", &self.conf);
        self.daemon = Daemon::spawn("slurmctld-restarted", cmd, self.root.path())?;
        let conf = self.conf.clone();
        let clients = self.client_enter();
        let env = self.env();
        let daemon = &mut self.daemon;
        wait_until(
            "the restarted slurmctld to answer scontrol ping with UP",
            CTLD_START_TIMEOUT,
            Duration::from_millis(100),
            || {
                daemon.check_running()?;
                let mut c = ns_command(clients.as_deref(), "scontrol");
                c.arg("ping").env("SLURM_CONF", &conf).envs(env.clone());
                let out = run_with_timeout(c, CLIENT_TIMEOUT)?;
                Ok(String::from_utf8_lossy(&out.stdout)
                    .contains("is UP")
                    .then_some(()))
            },
        )
    }

    /// The environment a Slurm client needs: `[("SLURM_CONF", <conf>)]`, and with
    /// auth/slurm `SLURM_SACK_SOCKET`, this controller's `sack.socket` (a client makes its
    /// credentials there).
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![("SLURM_CONF".into(), self.conf.display().to_string())];
        if self.auth_slurm {
            env.push((
                "SLURM_SACK_SOCKET".into(),
                sack_socket(self.root.path(), self.machine.as_ref())
                    .display()
                    .to_string(),
            ));
        }
        env
    }

    /// Whether it runs `AuthType=auth/slurm` ([`SlurmctldBuilder::auth_slurm`]).
    pub fn is_auth_slurm(&self) -> bool {
        self.auth_slurm
    }

    /// The auth/slurm key (`slurm.key` beside slurm.conf).
    ///
    /// # Errors
    /// Not an auth/slurm controller, or the file cannot be read.
    pub fn slurm_key(&self) -> Result<Vec<u8>> {
        if !self.auth_slurm {
            bail!("not an auth/slurm controller");
        }
        let p = self.root.path().join("slurm.key");
        fs::read(&p).with_context(|| format!("reading {}", p.display()))
    }

    /// The reason `sinfo -R` lists for `node` (slurmctld's own list of nodes down,
    /// drained, failing or failed), as Slurm holds it; empty when it lists none. A record
    /// that is IDLE again is not listed even where it keeps its last reason (23.02+ without
    /// accounting storage, see [`crate::install::Version::clears_reason_on_resume`]).
    ///
    /// # Errors
    /// When sinfo fails.
    pub fn held_reason(&self, node: &str) -> Result<String> {
        let out = self.sinfo(&["-R", "-h", "-n", node, "-o", "%E"])?;
        Ok(out.trim().to_string())
    }

    /// Fails unless a lifted drain left nothing that holds `node`: `sinfo -R` lists no
    /// reason for it, and, where RESUME clears a reason (22.05), `reason` (the record's, as
    /// the caller read it) is empty too; later releases keep the last one on the IDLE record
    /// ([`crate::install::Version::clears_reason_on_resume`]).
    ///
    /// # Errors
    /// What is left, or sinfo failing.
    pub fn check_reason_lifted(&self, node: &str, reason: &str) -> Result<()> {
        let held = self.held_reason(node)?;
        if !held.is_empty() {
            bail!("sinfo -R still lists {node}: {held}");
        }
        if crate::install::version()?.clears_reason_on_resume() && !reason.is_empty() {
            bail!("reason left behind on {node}: {reason}");
        }
        Ok(())
    }

    /// `program` with `SLURM_CONF` set (run in [`CtldMachine::clients_netns`] when the
    /// controller is on another machine).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut c = ns_command(self.client_enter().as_deref(), program);
        c.envs(self.env());
        c
    }

    /// slurmctld's RPC counts by message type since it started (`sdiag`'s "Remote
    /// Procedure Call statistics by message type"), e.g. `REQUEST_CONFIG` → 3.
    ///
    /// # Errors
    /// `sdiag` cannot run or fails.
    pub fn rpc_counts(&self) -> Result<std::collections::BTreeMap<String, u64>> {
        Ok(self
            .rpc_stats()?
            .into_iter()
            .map(|(k, v)| (k, v.count))
            .collect())
    }

    /// slurmctld's RPC statistics by message type since it started (`sdiag`'s "Remote
    /// Procedure Call statistics by message type": `count`, and `total_time` in
    /// microseconds of slurmctld's time handling them).
    ///
    /// # Errors
    /// `sdiag` cannot run or fails.
    pub fn rpc_stats(&self) -> Result<std::collections::BTreeMap<String, RpcStat>> {
        let text = run_ok(self.command("sdiag"), CLIENT_TIMEOUT)?;
        Ok(parse_sdiag_by_type(&text))
    }

    /// The release slurmctld runs (`SLURM_VERSION` of `scontrol show config`, which
    /// slurmctld answers), not the client's.
    ///
    /// # Errors
    /// scontrol failing, or no version in its answer.
    pub fn server_version(&self) -> Result<crate::install::Version> {
        let out = self.scontrol_ok(&["show", "config"])?;
        config_version(&out)
            .with_context(|| format!("no SLURM_VERSION in scontrol show config:\n{out}"))
    }

    /// Runs `scontrol args...` (deadline [`CLIENT_TIMEOUT`]); a non-zero exit is returned,
    /// not an error.
    pub fn scontrol(&self, args: &[&str]) -> Result<Output> {
        let mut c = self.command("scontrol");
        c.args(args);
        run_with_timeout(c, CLIENT_TIMEOUT)
    }

    /// Runs `scontrol args...`; a non-zero exit is an error. Returns stdout.
    pub fn scontrol_ok(&self, args: &[&str]) -> Result<String> {
        let mut c = self.command("scontrol");
        c.args(args);
        run_ok(c, CLIENT_TIMEOUT)
    }

    /// Runs `sinfo args...`; a non-zero exit is an error. Returns stdout.
    pub fn sinfo(&self, args: &[&str]) -> Result<String> {
        let mut c = self.command("sinfo");
        c.args(args);
        run_ok(c, CLIENT_TIMEOUT)
    }

    /// The `State=` field of `scontrol show node -o <name>` (e.g. `IDLE+DYNAMIC_NORM`,
    /// `DOWN*`, `IDLE+DRAIN`), or `None` when the controller does not know the node.
    pub fn node_state(&self, name: &str) -> Result<Option<String>> {
        let out = self.scontrol(&["show", "node", "-o", name])?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            if stderr.contains("not found") || stdout.contains("not found") {
                return Ok(None);
            }
            bail!(
                "scontrol show node {name} failed with {}: {stderr}",
                out.status
            );
        }
        Ok(field(&stdout, "State").map(str::to_string))
    }

    /// Waits until node `name` exists and `pred(state)` holds; returns that state. The
    /// error names the last state seen and carries the controller's log tail.
    pub fn wait_node_state(
        &self,
        name: &str,
        pred: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> Result<String> {
        let mut last = None;
        wait_until(
            &format!("node {name} to reach the expected state"),
            timeout,
            Duration::from_millis(20),
            || {
                let st = self.node_state(name)?;
                let ok = st.as_deref().is_some_and(&pred);
                last = st.clone();
                Ok(if ok { st } else { None })
            },
        )
        .with_context(|| {
            format!(
                "last state of {name}: {last:?}; slurmctld log:\n{}",
                self.daemon.log_tail(20)
            )
        })
    }

    /// Waits until node `name` is IDLE (with any flags but not DRAIN, or a trailing `*`).
    pub fn wait_node_idle(&self, name: &str, timeout: Duration) -> Result<String> {
        self.wait_node_state(name, is_idle, timeout)
    }

    /// Runs a job command (`srun`, `sbatch`, `salloc`...) with `SLURM_CONF` set and a
    /// deadline of [`JOB_TIMEOUT`]; a non-zero exit is returned, not an error. Example:
    /// `run_job("srun", &["-N1", "-w", "node1", "hostname"])`.
    pub fn run_job(&self, program: &str, args: &[&str]) -> Result<Output> {
        let mut c = self.command(program);
        c.args(args);
        run_with_timeout(c, JOB_TIMEOUT)
    }
}

/// `len` random bytes (`/dev/urandom`), e.g. an auth/slurm key.
///
/// # Errors
/// `/dev/urandom` cannot be read.
pub fn random_key(len: usize) -> Result<Vec<u8>> {
    use std::io::Read;
    let mut key = vec![0u8; len];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut key))
        .context("reading /dev/urandom")?;
    Ok(key)
}

/// An auth/slurm controller's `sack.socket` as the host sees it (`/run/slurmctld/` in its
/// own mount namespace is `<root>/run/slurmctld/`).
fn sack_socket(root: &Path, machine: Option<&CtldMachine>) -> PathBuf {
    match machine {
        Some(m) => m.run_dir.join("slurmctld/sack.socket"),
        None => root.join("run/slurmctld/sack.socket"),
    }
}

/// slurmctld's command: through `nsenter` for another machine, or, with `private_run`
/// (an auth/slurm controller's scratch folder), in a mount namespace of its own whose
/// `/run` is `<root>/run` (`unshare` and `sh` exec it: the pid stays slurmctld's; the
/// folder and the program are the script's arguments, never its text).
fn ctld_command(enter: Option<&[String]>, private_run: Option<&Path>) -> Command {
    match private_run {
        None => ns_command(enter, "slurmctld"),
        Some(root) => {
            let mut c = Command::new("unshare");
            c.args(["-m", "--propagation", "private", "sh", "-c"])
                .arg("mount --bind \"$1\" /run && shift && exec \"$@\"")
                .arg("sh")
                .arg(root.join("run"))
                .arg(crate::install::program("slurmctld"));
            c
        }
    }
}

/// `SLURM_VERSION` of `scontrol show config`'s text (`SLURM_VERSION           = 26.05.3`).
fn config_version(text: &str) -> Option<crate::install::Version> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == "SLURM_VERSION").then(|| crate::install::Version::parse(v.trim()))?
    })
}

/// Whether a Slurm node state string means usable and idle: `IDLE`, `IDLE+DYNAMIC_NORM`,
/// ... but not `IDLE+DRAIN`, `IDLE+COMPLETING` (a job's epilog not yet reported), `IDLE*`
/// (not responding) or `IDLE+NOT_RESPONDING`.
pub fn is_idle(state: &str) -> bool {
    let mut parts = state.split('+');
    parts.next() == Some("IDLE")
        && !state.ends_with('*')
        && parts.all(|f| {
            !matches!(
                f,
                "DRAIN" | "COMPLETING" | "NOT_RESPONDING" | "POWERED_DOWN" | "POWERING_DOWN"
            )
        })
}

/// The value of `key=` in one line of `scontrol -o` output (`Key=value` pairs separated
/// by spaces; values of the keys this harness reads have no spaces).
pub fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

/// The host name up to the first dot, as slurmctld compares it with `SlurmctldHost`.
pub fn short_hostname() -> Result<String> {
    let uts = rustix::system::uname();
    let name = uts
        .nodename()
        .to_str()
        .context("the host name is not UTF-8")?;
    let short = name.split('.').next().unwrap_or(name);
    if short.is_empty() {
        bail!("the host name is empty");
    }
    Ok(short.to_string())
}

/// Writes `bytes` to `path` through a temporary file in the same folder and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .context("a file to write has a parent folder")?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    std::io::Write::write_all(&mut tmp, bytes)
        .with_context(|| format!("writing {}", path.display()))?;
    tmp.as_file()
        .sync_all()
        .with_context(|| format!("syncing {}", path.display()))?;
    tmp.persist(path)
        .with_context(|| format!("renaming into {}", path.display()))?;
    Ok(())
}

/// How a [`Slurmd`] is defined in the controller.
#[derive(Debug, Clone)]
pub enum NodeKind {
    /// Dynamic (`-Z --conf "<conf>"`), e.g. `CPUs=2 RealMemory=1000 Feature=x`.
    Dynamic(String),
    /// Pre-declared by a `NodeName=` line of the controller's slurm.conf.
    Static,
}

/// A bare slurmd joined configless to a [`Slurmctld`] (for comparison with the agent and
/// for the benchmark), stopped on drop. Its spool folder is created ahead.
#[derive(Debug)]
pub struct Slurmd {
    daemon: Daemon,
    name: String,
    started: Instant,
}

impl Slurmd {
    /// Starts a dynamic node: `slurmd -D -N <name> -Z --conf-server 127.0.0.1:<port>
    /// --conf "<conf>"`. Does not wait; see [`Slurmctld::wait_node_idle`].
    pub fn dynamic(ctld: &Slurmctld, name: &str, conf: &str) -> Result<Slurmd> {
        Self::spawn(ctld, name, &NodeKind::Dynamic(conf.to_string()), &[])
    }

    /// Starts a static node declared in the controller's slurm.conf.
    pub fn static_node(ctld: &Slurmctld, name: &str) -> Result<Slurmd> {
        Self::spawn(ctld, name, &NodeKind::Static, &[])
    }

    /// Starts slurmd for `name` with extra arguments (e.g. `-b` after a reboot).
    pub fn spawn(ctld: &Slurmctld, name: &str, kind: &NodeKind, extra: &[&str]) -> Result<Slurmd> {
        fs::create_dir_all(ctld.spool_dir(name))
            .with_context(|| format!("creating {}", ctld.spool_dir(name).display()))?;
        let mut cmd = Command::new(crate::install::program("slurmd"));
        cmd.arg("-D")
            .arg("-N")
            .arg(name)
            .arg("--conf-server")
            .arg(ctld.conf_server());
        if let NodeKind::Dynamic(conf) = kind {
            cmd.arg("-Z").arg("--conf").arg(conf);
        }
        cmd.args(extra);
        // slurmd must not find another cluster's config through SLURM_CONF.
        cmd.env_remove("SLURM_CONF");
        let started = Instant::now();
        let daemon = Daemon::spawn(&format!("slurmd-{name}"), cmd, ctld.root())?;
        Ok(Slurmd {
            daemon,
            name: name.to_string(),
            started,
        })
    }

    /// The NodeName.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// When the process was started (for the benchmark).
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The daemon guard (pid, log, stop).
    pub fn daemon(&mut self) -> &mut Daemon {
        &mut self.daemon
    }
}

/// One message type's line of `sdiag`'s "Remote Procedure Call statistics by message type".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RpcStat {
    /// `count`: RPCs of this type slurmctld handled.
    pub count: u64,
    /// `total_time`: microseconds slurmctld spent handling them (from the message's
    /// arrival until its answer was sent).
    pub total_time_us: u64,
}

/// The "by message type" section of `sdiag` output
/// (`\tREQUEST_NODE_INFO ( 2007) count:12 ave_time:341 total_time:4092`).
pub fn parse_sdiag_by_type(text: &str) -> std::collections::BTreeMap<String, RpcStat> {
    let mut stats = std::collections::BTreeMap::new();
    let mut in_rpc = false;
    for l in text.lines() {
        if l.starts_with("Remote Procedure Call statistics by message type") {
            in_rpc = true;
            continue;
        }
        if l.starts_with("Remote Procedure Call statistics by user") {
            break;
        }
        // `\t%-40s(%5u) count:...`: a name of 40 characters or more meets its `(`.
        let Some((name, rest)) = l.trim().split_once('(').filter(|_| in_rpc) else {
            continue;
        };
        let name = name.trim_end();
        let field = |k: &str| {
            rest.split(k)
                .nth(1)
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
        };
        if let Some(count) = field("count:") {
            let total_time_us = field("total_time:").unwrap_or(0);
            stats.insert(
                name.to_string(),
                RpcStat {
                    count,
                    total_time_us,
                },
            );
        }
    }
    stats
}

#[cfg(test)]
mod tests {
    use super::{config_version, is_idle, parse_sdiag_by_type, RpcStat};

    #[test]
    fn the_controllers_release_is_read_from_show_config() {
        let text = "Configuration data as of 2026-12-04T03:25:33\n\
                    AccountingStorageBackupHost = (null)\n\
                    SLURM_CONF              = /tmp/x/slurm.conf\n\
                    SLURM_VERSION           = 26.05.3\n\
                    SlurmUser               = root(0)\n";
        assert_eq!(
            config_version(text).map(|v| v.to_string()),
            Some("26.05.3".to_string())
        );
        assert_eq!(config_version("SLURM_CONF = /etc/slurm/slurm.conf\n"), None);
    }

    #[test]
    fn idle_means_schedulable_now() {
        for s in ["IDLE", "IDLE+DYNAMIC_NORM", "IDLE+CLOUD"] {
            assert!(is_idle(s), "{s}");
        }
        for s in [
            "IDLE+COMPLETING",
            "IDLE+DRAIN",
            "IDLE*",
            "IDLE+NOT_RESPONDING",
            "ALLOCATED",
            "MIXED+COMPLETING",
        ] {
            assert!(!is_idle(s), "{s}");
        }
    }

    #[test]
    fn sdiag_by_type_reads_count_and_total_time_and_stops_at_the_users() {
        // sdiag 25.11's layout (src/sdiag/sdiag.c: `\t%-40s(%5u) count:%-6u ave_time:%-6lu
        // total_time:%lu`), the RPC queue's longer form, and the per-user section.
        let text = "\
Remote Procedure Call statistics by message type
\tREQUEST_CONFIG                          ( 2016) count:16     ave_time:412    total_time:6592
\tMESSAGE_NODE_REGISTRATION_STATUS        ( 1002) count:32     ave_time:1503   total_time:48096        queued:0      cycle_last:0      cycle_max:0      dropped:0
\tREQUEST_A_MESSAGE_TYPE_NAMED_IN_FORTY_CHARS( 9999) count:2      ave_time:5      total_time:10

Remote Procedure Call statistics by user
\troot            (       0) count:99     ave_time:10     total_time:990
";
        let s = parse_sdiag_by_type(text);
        assert_eq!(s.len(), 3, "{s:?}");
        assert_eq!(s["REQUEST_A_MESSAGE_TYPE_NAMED_IN_FORTY_CHARS"].count, 2);
        assert_eq!(
            s["REQUEST_CONFIG"],
            RpcStat {
                count: 16,
                total_time_us: 6592
            }
        );
        assert_eq!(s["MESSAGE_NODE_REGISTRATION_STATUS"].total_time_us, 48096);
        assert!(!s.contains_key("root"));
    }
}
