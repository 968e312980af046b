//! The systemd Manager API over D-Bus (zbus): start, restart and stop units and wait for
//! their jobs, reload unit files, read unit states.
//!
//! Interface: `org.freedesktop.systemd1.Manager` and `org.freedesktop.systemd1.Unit`
//! (org.freedesktop.systemd1(5)). A job's outcome arrives as the `JobRemoved` signal with
//! result `done`, `canceled`, `timeout`, `failed`, `dependency` or `skipped`.
//!
//! The `[systemd]` settings section ([`SystemdSettings`]: which Manager) is this module's.
//!
//! Floor 1 (outside systems): below everything that starts a unit.

use std::time::Duration;

use futures_lite::StreamExt;
use serde::{Deserialize, Serialize};
use zbus::zvariant::{ObjectPath, OwnedObjectPath};

use crate::section::{Classified, InvalidKey, KeyTrust};

/// `[systemd]`: which Manager to talk to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SystemdSettings {
    /// `system` (the system bus), `session` (`DBUS_SESSION_BUS_ADDRESS`, as for
    /// `systemd --user`), or a D-Bus address such as `unix:path=/run/user/0/bus`.
    pub bus: String,
}

impl Default for SystemdSettings {
    fn default() -> Self {
        SystemdSettings {
            bus: "system".into(),
        }
    }
}

impl Classified for SystemdSettings {
    const SECTION: &'static str = "systemd";
    const TRUST: &'static [KeyTrust] = &[KeyTrust::image("bus")];
}

impl SystemdSettings {
    /// Checks `bus`.
    ///
    /// # Errors
    /// [`InvalidKey`]: the dotted key and what is wrong.
    pub fn validate(&self) -> Result<(), InvalidKey> {
        match self.bus.as_str() {
            "system" | "session" => Ok(()),
            b if b.starts_with("unix:") => Ok(()),
            b => Err(InvalidKey::new(
                "systemd.bus",
                format!("expected system, session or a unix: D-Bus address, got {b:?}"),
            )),
        }
    }
}

#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1",
    gen_blocking = false
)]
trait Manager {
    fn start_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
    fn restart_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
    fn stop_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
    fn reload(&self) -> zbus::Result<()>;
    fn reset_failed_unit(&self, name: &str) -> zbus::Result<()>;
    fn load_unit(&self, name: &str) -> zbus::Result<OwnedObjectPath>;
    fn get_unit_processes(&self, name: &str) -> zbus::Result<Vec<(String, u32, String)>>;
    fn subscribe(&self) -> zbus::Result<()>;
    #[zbus(signal)]
    fn job_removed(
        &self,
        id: u32,
        job: ObjectPath<'_>,
        unit: &str,
        result: &str,
    ) -> zbus::Result<()>;
}

#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Unit",
    default_service = "org.freedesktop.systemd1",
    gen_blocking = false
)]
trait Unit {
    #[zbus(property)]
    fn active_state(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn sub_state(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn load_state(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn need_daemon_reload(&self) -> zbus::Result<bool>;
}

#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Service",
    default_service = "org.freedesktop.systemd1",
    gen_blocking = false
)]
trait Service {
    #[zbus(property)]
    fn exec_main_start_timestamp(&self) -> zbus::Result<u64>;
    #[zbus(property, name = "ExecMainPID")]
    fn exec_main_pid(&self) -> zbus::Result<u32>;
    #[zbus(property)]
    fn result(&self) -> zbus::Result<String>;
}

/// What systemd knows about a service's main process (org.freedesktop.systemd1(5),
/// `Service` interface).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServiceInfo {
    /// `ExecMainStartTimestamp`: when the main process was started, microseconds since
    /// the Unix epoch (`0`: never started).
    pub exec_main_start_usec: u64,
    /// `ExecMainPID` (`0`: not running).
    pub exec_main_pid: u32,
    /// `Result`: `success`, `exit-code`, `signal`, `start-limit-hit`, ...
    pub result: String,
    /// The unit's `ActiveState`.
    pub active_state: String,
}

/// A systemd failure, naming the unit.
#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    /// The bus could not be reached.
    #[error("connecting to the systemd Manager on the {bus} bus: {source}")]
    Connect {
        /// Which bus.
        bus: String,
        /// zbus error.
        #[source]
        source: zbus::Error,
    },
    /// A Manager call failed.
    #[error("systemd {call} {unit}: {source}")]
    Call {
        /// Method name.
        call: &'static str,
        /// Unit name.
        unit: String,
        /// zbus error (the D-Bus error name and message, e.g. NoSuchUnit).
        #[source]
        source: zbus::Error,
    },
    /// The job finished with a result other than `done`.
    #[error("systemd {call} {unit}: job result {result:?} (unit is {active_state})")]
    Job {
        /// Method name.
        call: &'static str,
        /// Unit name.
        unit: String,
        /// Job result.
        result: String,
        /// Unit's ActiveState afterwards.
        active_state: String,
    },
    /// The job did not finish in time.
    #[error("systemd {call} {unit}: job did not finish in {timeout:?}")]
    Timeout {
        /// Method name.
        call: &'static str,
        /// Unit name.
        unit: String,
        /// Limit.
        timeout: Duration,
    },
}

/// Checks a unit name (systemd.unit(5)): ASCII letters, digits, `:-_.\@`, a known suffix,
/// at most 255 characters, and not a template (`slurmd@.service`: systemd starts, stops
/// and watches an instance of a template, `slurmd@gpu-001.service`, never the template).
///
/// # Errors
/// [`InvalidUnitName`]: the name.
pub fn validate_unit_name(name: &str) -> Result<(), InvalidUnitName> {
    const SUFFIXES: [&str; 8] = [
        ".service", ".mount", ".target", ".socket", ".timer", ".path", ".slice", ".scope",
    ];
    let ok = name.len() <= 255
        && SUFFIXES
            .iter()
            .any(|s| name.len() > s.len() && name.ends_with(s))
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ":-_.\\@".contains(c));
    if ok && !is_template(name) {
        Ok(())
    } else {
        Err(InvalidUnitName {
            name: name.to_string(),
        })
    }
}

/// `foo@.service`: a template unit (an `@` right before the suffix's dot).
fn is_template(name: &str) -> bool {
    name.rsplit_once('.')
        .is_some_and(|(stem, _)| stem.ends_with('@'))
}

/// A text that is not a systemd unit name ([`validate_unit_name`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", unit_name_problem(name))]
pub struct InvalidUnitName {
    /// The text given.
    pub name: String,
}

fn unit_name_problem(name: &str) -> String {
    if is_template(name) {
        let (stem, suffix) = name.rsplit_once('.').unwrap_or((name, "service"));
        format!(
            "{name:?} is a template unit, which systemd never starts itself: name one \
             instance of it, such as \"{stem}instance.{suffix}\""
        )
    } else {
        format!(
            "invalid systemd unit name {name:?}: expected a name such as \"slurmd.service\" \
             (letters, digits and :-_.\\@, ending .service, .mount, .target, .socket, \
             .timer, .path, .slice or .scope)"
        )
    }
}

/// A connection to the systemd Manager made at its first use, for one pass of periodic
/// work that needs the Manager only when something must change (the daemon's mounts pass):
/// the connection closes when this is dropped. A connection kept open between passes is
/// subscribed (job signals, [`Systemd::connect`]) and would wake the daemon for every job
/// and unit change on the node.
#[derive(Debug)]
pub struct OnDemand {
    bus: String,
    conn: tokio::sync::OnceCell<Systemd>,
}

impl OnDemand {
    /// Nothing connected yet; `bus` as [`Systemd::connect`] takes it.
    pub fn new(bus: &str) -> OnDemand {
        OnDemand {
            bus: bus.to_string(),
            conn: tokio::sync::OnceCell::new(),
        }
    }

    /// The connection, made now when it is the first use.
    ///
    /// # Errors
    /// [`SystemdError::Connect`] (and a later call tries again).
    pub async fn get(&self) -> Result<&Systemd, SystemdError> {
        self.conn
            .get_or_try_init(|| Systemd::connect(&self.bus))
            .await
    }
}

/// A connection to the systemd Manager.
#[derive(Debug, Clone)]
pub struct Systemd {
    manager: ManagerProxy<'static>,
    /// Limit for each job to finish.
    pub job_timeout: Duration,
}

/// A failed `LoadUnit` or read of `unit`'s properties.
fn load_error(unit: &str, source: zbus::Error) -> SystemdError {
    SystemdError::Call {
        call: "LoadUnit",
        unit: unit.to_string(),
        source,
    }
}

impl Systemd {
    /// Connects to `bus`: `system`, `session` (`DBUS_SESSION_BUS_ADDRESS`) or a D-Bus address.
    ///
    /// # Errors
    /// [`SystemdError::Connect`].
    pub async fn connect(bus: &str) -> Result<Systemd, SystemdError> {
        let err = |source| SystemdError::Connect {
            bus: bus.to_string(),
            source,
        };
        let conn = match bus {
            "system" => zbus::Connection::system().await,
            "session" => zbus::Connection::session().await,
            addr => match zbus::connection::Builder::address(addr) {
                Ok(b) => b.build().await,
                Err(e) => Err(e),
            },
        }
        .map_err(err)?;
        let manager = ManagerProxy::new(&conn).await.map_err(err)?;
        // Job signals are sent only to subscribed clients; once per connection.
        match manager.subscribe().await {
            Ok(()) => {}
            Err(zbus::Error::MethodError(name, _, _))
                if name.as_str() == "org.freedesktop.systemd1.AlreadySubscribed" => {}
            Err(e) => return Err(err(e)),
        }
        Ok(Systemd {
            manager,
            job_timeout: Duration::from_secs(90),
        })
    }

    /// `StartUnit(name, "replace")`, waiting for the job. Starting an active unit is a no-op.
    ///
    /// # Errors
    /// [`SystemdError`].
    pub async fn start(&self, unit: &str) -> Result<(), SystemdError> {
        self.job("StartUnit", unit).await
    }

    /// `RestartUnit(name, "replace")`, waiting for the job.
    ///
    /// # Errors
    /// [`SystemdError`].
    pub async fn restart(&self, unit: &str) -> Result<(), SystemdError> {
        self.job("RestartUnit", unit).await
    }

    /// `StopUnit(name, "replace")`, waiting for the job.
    ///
    /// # Errors
    /// [`SystemdError`].
    pub async fn stop(&self, unit: &str) -> Result<(), SystemdError> {
        self.job("StopUnit", unit).await
    }

    /// `Reload()`: re-reads unit files, as `systemctl daemon-reload`.
    ///
    /// # Errors
    /// [`SystemdError::Call`].
    pub async fn reload(&self) -> Result<(), SystemdError> {
        self.manager
            .reload()
            .await
            .map_err(|source| SystemdError::Call {
                call: "Reload",
                unit: String::new(),
                source,
            })
    }

    /// `ResetFailedUnit(name)`: forgets a failed unit's failure and its start-rate count
    /// (`StartLimitBurst=`), as `systemctl reset-failed <unit>`.
    ///
    /// # Errors
    /// [`SystemdError::Call`] (also when the unit is not failed).
    pub async fn reset_failed(&self, unit: &str) -> Result<(), SystemdError> {
        self.manager
            .reset_failed_unit(unit)
            .await
            .map_err(|source| SystemdError::Call {
                call: "ResetFailedUnit",
                unit: unit.to_string(),
                source,
            })
    }

    /// The processes in the unit's cgroup: `(pid, command line)`, as `systemctl status`
    /// lists them (`GetUnitProcesses`). A unit that is not loaded has none.
    ///
    /// # Errors
    /// [`SystemdError::Call`].
    pub async fn unit_processes(&self, unit: &str) -> Result<Vec<(u32, String)>, SystemdError> {
        match self.manager.get_unit_processes(unit).await {
            Ok(v) => Ok(v.into_iter().map(|(_, pid, cmd)| (pid, cmd)).collect()),
            Err(zbus::Error::MethodError(name, _, _))
                if name.as_str() == "org.freedesktop.systemd1.NoSuchUnit" =>
            {
                Ok(Vec::new())
            }
            Err(source) => Err(SystemdError::Call {
                call: "GetUnitProcesses",
                unit: unit.to_string(),
                source,
            }),
        }
    }

    /// The unit's `ActiveState` (`active`, `inactive`, `failed`, `activating`, ...).
    ///
    /// # Errors
    /// [`SystemdError::Call`].
    pub async fn active_state(&self, unit: &str) -> Result<String, SystemdError> {
        let u = self.unit(unit).await?;
        u.active_state().await.map_err(|e| load_error(unit, e))
    }

    /// The unit's object (`LoadUnit`), for one property read: no property cache (its
    /// set-up is a GetAll and a match rule).
    async fn unit(&self, unit: &str) -> Result<UnitProxy<'_>, SystemdError> {
        let err = |e| load_error(unit, e);
        let path = self.manager.load_unit(unit).await.map_err(err)?;
        UnitProxy::builder(self.manager.inner().connection())
            .path(path)
            .map_err(err)?
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
            .map_err(err)
    }

    /// Whether the Manager must re-read its unit files for `unit` (`NeedDaemonReload`: the
    /// file, or a drop-in, changed on disk since it was loaded). A unit the Manager never
    /// loaded is read from disk as it is loaded now: `false`.
    ///
    /// # Errors
    /// [`SystemdError::Call`].
    pub async fn needs_reload(&self, unit: &str) -> Result<bool, SystemdError> {
        let u = self.unit(unit).await?;
        u.need_daemon_reload()
            .await
            .map_err(|e| load_error(unit, e))
    }

    /// `Reload()` only when one of `units` [needs it](Systemd::needs_reload) (a failed
    /// look counts as needing it): a `daemon-reload` while slurmd runs re-applies every
    /// unit's cgroup settings, which on Slurm before 25.11.3 could make systemd kill
    /// slurmd (docs/slurm-versions.md). Whether it reloaded.
    ///
    /// # Errors
    /// [`SystemdError`] of the reload.
    pub async fn reload_if_needed(&self, units: &[&str]) -> Result<bool, SystemdError> {
        let mut needed = None;
        for u in units {
            match self.needs_reload(u).await {
                Ok(false) => {}
                Ok(true) => {
                    needed = Some((*u).to_string());
                    break;
                }
                Err(e) => {
                    needed = Some(format!("{u} (its state unread: {e})"));
                    break;
                }
            }
        }
        let Some(why) = needed else {
            return Ok(false);
        };
        tracing::info!(unit = %why, "systemctl daemon-reload: the unit changed on disk");
        self.reload().await?;
        Ok(true)
    }

    /// The service's main process start time, PID, result and state.
    ///
    /// # Errors
    /// [`SystemdError::Call`].
    pub async fn service_info(&self, unit: &str) -> Result<ServiceInfo, SystemdError> {
        let err = |source| SystemdError::Call {
            call: "LoadUnit",
            unit: unit.to_string(),
            source,
        };
        let path = self.manager.load_unit(unit).await.map_err(err)?;
        let conn = self.manager.inner().connection();
        // One read of each property, all four asked at once (bootstrap polls this while
        // it waits for the registration): no property cache.
        let svc = ServiceProxy::builder(conn)
            .path(path.clone())
            .map_err(err)?
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
            .map_err(err)?;
        let u = UnitProxy::builder(conn)
            .path(path)
            .map_err(err)?
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
            .map_err(err)?;
        let ((exec_main_start_usec, exec_main_pid), (result, active_state)) =
            futures_lite::future::zip(
                futures_lite::future::zip(svc.exec_main_start_timestamp(), svc.exec_main_pid()),
                futures_lite::future::zip(svc.result(), u.active_state()),
            )
            .await;
        Ok(ServiceInfo {
            exec_main_start_usec: exec_main_start_usec.map_err(err)?,
            exec_main_pid: exec_main_pid.map_err(err)?,
            result: result.map_err(err)?,
            active_state: active_state.map_err(err)?,
        })
    }

    /// Queues `RestartUnit(name, "replace")` and returns once systemd has accepted the
    /// job, without waiting for it: the caller does other work while the unit (re)starts,
    /// then waits with [`QueuedJob::wait`]. A job queued after it for a unit ordered
    /// `After=` this one waits for it in systemd.
    ///
    /// # Errors
    /// [`SystemdError::Call`].
    pub async fn queue_restart(&self, unit: &str) -> Result<QueuedJob<'_>, SystemdError> {
        self.queue("RestartUnit", unit).await
    }

    /// Queues `StartUnit(name, "replace")` without waiting for it, as
    /// [`Systemd::queue_restart`].
    ///
    /// # Errors
    /// [`SystemdError::Call`].
    pub async fn queue_start(&self, unit: &str) -> Result<QueuedJob<'_>, SystemdError> {
        self.queue("StartUnit", unit).await
    }

    /// Queues `StartUnit(name, "replace")` and returns once systemd has accepted the job,
    /// never waiting for it to finish. For a `Type=notify` unit (Slurm 23.11+'s reference
    /// `slurmd.service`, `slurmd --systemd`) the job ends only at `READY=1`, which a
    /// configless slurmd that cannot reach its controller never sends (it retries the
    /// fetch every 10 s, in the unit's `activating` state): the caller watches the unit's
    /// state and slurmctld's record instead ([`Systemd::service_info`]).
    ///
    /// # Errors
    /// [`SystemdError::Call`] (no such unit, the bus refused).
    ///
    /// It does wait (up to 5 s) until systemd has dispatched the job, that is until the
    /// unit has left `inactive` or the job has ended, so that a caller reading the unit's
    /// state next never takes the moment before for a slurmd that is not running. A job
    /// whose result is `failed` ran the unit's process, which exited during its start:
    /// dispatched like any other, so `Ok` whichever of the two was seen first (the caller
    /// finds the unit `failed` and restarts it); any other result that is not `done`
    /// (`dependency`, `canceled`, `timeout`, ...) is that error.
    pub async fn start_no_wait(&self, unit: &str) -> Result<(), SystemdError> {
        let job = self.queue("StartUnit", unit).await?;
        let job = async {
            match job.wait().await {
                Err(SystemdError::Job { result, .. }) if result == "failed" => Ok(()),
                r => r,
            }
        };
        let dispatched = async {
            loop {
                if self.active_state(unit).await.is_ok_and(|s| s != "inactive") {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::select! {
            r = job => r,
            () = dispatched => Ok(()),
            () = tokio::time::sleep(Duration::from_secs(5)) => Ok(()),
        }
    }

    async fn queue(&self, call: &'static str, unit: &str) -> Result<QueuedJob<'_>, SystemdError> {
        let err = |source| SystemdError::Call {
            call,
            unit: unit.to_string(),
            source,
        };
        // Listen before queuing the job so that its JobRemoved cannot be missed.
        let removed = self.manager.receive_job_removed().await.map_err(err)?;
        let job = match call {
            "StartUnit" => self.manager.start_unit(unit, "replace").await,
            "RestartUnit" => self.manager.restart_unit(unit, "replace").await,
            _ => self.manager.stop_unit(unit, "replace").await,
        }
        .map_err(err)?;
        Ok(QueuedJob {
            systemd: self,
            call,
            unit: unit.to_string(),
            job,
            removed,
        })
    }

    async fn job(&self, call: &'static str, unit: &str) -> Result<(), SystemdError> {
        self.queue(call, unit).await?.wait().await
    }
}

/// A job systemd accepted ([`Systemd::queue_restart`]), not yet waited for.
pub struct QueuedJob<'a> {
    systemd: &'a Systemd,
    call: &'static str,
    unit: String,
    job: OwnedObjectPath,
    removed: JobRemovedStream,
}

impl std::fmt::Debug for QueuedJob<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuedJob")
            .field("call", &self.call)
            .field("unit", &self.unit)
            .field("job", &self.job.as_str())
            .finish()
    }
}

impl QueuedJob<'_> {
    /// Waits for the job to finish (its `JobRemoved` signal), up to the connection's
    /// `job_timeout`.
    ///
    /// # Errors
    /// [`SystemdError::Job`] for a result other than `done` (naming the unit's
    /// `ActiveState` then), [`SystemdError::Timeout`].
    pub async fn wait(mut self) -> Result<(), SystemdError> {
        let (call, unit, job) = (self.call, self.unit.as_str(), self.job.as_str());
        let removed = &mut self.removed;
        let wait = async {
            while let Some(sig) = removed.next().await {
                let Ok(args) = sig.args() else { continue };
                if args.job().as_str() == job {
                    return Some(args.result().to_string());
                }
            }
            None
        };
        let timeout = self.systemd.job_timeout;
        let result = tokio::time::timeout(timeout, wait)
            .await
            .map_err(|_| SystemdError::Timeout {
                call,
                unit: unit.to_string(),
                timeout,
            })?
            .unwrap_or_else(|| "unknown".into());
        if result == "done" {
            return Ok(());
        }
        let active_state = self
            .systemd
            .active_state(unit)
            .await
            .unwrap_or_else(|e| format!("unknown ({e})"));
        Err(SystemdError::Job {
            call,
            unit: unit.to_string(),
            result,
            active_state,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_names() {
        for good in [
            "slurmd.service",
            "mnt-fsx.mount",
            "getty@tty1.service",
            "a\\x2db.mount",
        ] {
            assert!(validate_unit_name(good).is_ok(), "{good}");
        }
        for bad in [
            "slurmd",
            ".service",
            "a b.service",
            "x;y.service",
            "../x.service",
            "",
            "slurmd@.service",
        ] {
            assert!(validate_unit_name(bad).is_err(), "{bad}");
        }
    }
}

/// The seam over the systemd Manager for the orchestrators that watch and restart a unit
/// (bootstrap's join of slurmd): the calls [`Systemd`] makes over D-Bus
/// (org.freedesktop.systemd1(5)), implemented by it and, in unit tests, by an in-memory
/// fake.
#[async_trait::async_trait]
pub trait Units: Send + Sync {
    /// The unit's `ActiveState` ([`Systemd::active_state`]).
    ///
    /// # Errors
    /// [`SystemdError`].
    async fn active_state(&self, unit: &str) -> Result<String, SystemdError>;

    /// The service's main process and state ([`Systemd::service_info`]).
    ///
    /// # Errors
    /// [`SystemdError`].
    async fn service_info(&self, unit: &str) -> Result<ServiceInfo, SystemdError>;

    /// `StopUnit`, waiting for the job ([`Systemd::stop`]).
    ///
    /// # Errors
    /// [`SystemdError`].
    async fn stop(&self, unit: &str) -> Result<(), SystemdError>;

    /// `StartUnit`, not waiting for the job to finish ([`Systemd::start_no_wait`]).
    ///
    /// # Errors
    /// [`SystemdError`].
    async fn start_no_wait(&self, unit: &str) -> Result<(), SystemdError>;

    /// The processes in the unit's cgroup, `(pid, command line)`
    /// ([`Systemd::unit_processes`]).
    ///
    /// # Errors
    /// [`SystemdError`].
    async fn unit_processes(&self, unit: &str) -> Result<Vec<(u32, String)>, SystemdError>;
}

#[async_trait::async_trait]
impl Units for Systemd {
    async fn active_state(&self, unit: &str) -> Result<String, SystemdError> {
        Systemd::active_state(self, unit).await
    }

    async fn service_info(&self, unit: &str) -> Result<ServiceInfo, SystemdError> {
        Systemd::service_info(self, unit).await
    }

    async fn stop(&self, unit: &str) -> Result<(), SystemdError> {
        Systemd::stop(self, unit).await
    }

    async fn start_no_wait(&self, unit: &str) -> Result<(), SystemdError> {
        Systemd::start_no_wait(self, unit).await
    }

    async fn unit_processes(&self, unit: &str) -> Result<Vec<(u32, String)>, SystemdError> {
        Systemd::unit_processes(self, unit).await
    }
}

/// An in-memory systemd Manager for unit tests.
#[cfg(test)]
pub(crate) mod fake {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex, MutexGuard};

    use super::{ServiceInfo, SystemdError, Units};

    /// Services by unit name: a start makes the unit `active` with a new main process
    /// started now, a stop makes it `inactive` without one; an unknown unit is `inactive`,
    /// never started. A unit's cgroup lists no process (its main PID is not a process of
    /// this host: `slurmd::stop` kills the `slurmd` it finds there). Every start and stop
    /// is logged. Clones share the units.
    #[derive(Debug, Clone, Default)]
    pub(crate) struct FakeUnits {
        units: Arc<Mutex<BTreeMap<String, ServiceInfo>>>,
        calls: Arc<Mutex<Vec<String>>>,
    }

    /// Microseconds since the Unix epoch, now.
    pub(crate) fn now_usec() -> u64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        u64::try_from(now.as_micros()).unwrap_or(u64::MAX)
    }

    impl FakeUnits {
        fn units(&self) -> MutexGuard<'_, BTreeMap<String, ServiceInfo>> {
            self.units
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }

        fn log(&self, call: String) {
            self.calls
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(call);
        }

        /// Sets `unit`'s service as `info`.
        pub(crate) fn set(&self, unit: &str, info: ServiceInfo) {
            self.units().insert(unit.to_string(), info);
        }

        /// `unit` active, its main process (PID 4242) started `ago` before now.
        pub(crate) fn running_since(&self, unit: &str, ago: std::time::Duration) {
            let ago = u64::try_from(ago.as_micros()).unwrap_or(u64::MAX);
            self.set(
                unit,
                ServiceInfo {
                    exec_main_start_usec: now_usec().saturating_sub(ago),
                    exec_main_pid: 4242,
                    result: "success".into(),
                    active_state: "active".into(),
                },
            );
        }

        /// The starts and stops so far (`start slurmd.service`).
        pub(crate) fn calls(&self) -> Vec<String> {
            self.calls
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone()
        }

        fn info(&self, unit: &str) -> ServiceInfo {
            self.units()
                .get(unit)
                .cloned()
                .unwrap_or_else(|| ServiceInfo {
                    active_state: "inactive".into(),
                    result: "success".into(),
                    ..ServiceInfo::default()
                })
        }
    }

    #[async_trait::async_trait]
    impl Units for FakeUnits {
        async fn active_state(&self, unit: &str) -> Result<String, SystemdError> {
            Ok(self.info(unit).active_state)
        }

        async fn service_info(&self, unit: &str) -> Result<ServiceInfo, SystemdError> {
            Ok(self.info(unit))
        }

        async fn stop(&self, unit: &str) -> Result<(), SystemdError> {
            self.log(format!("stop {unit}"));
            let info = ServiceInfo {
                exec_main_pid: 0,
                active_state: "inactive".into(),
                ..self.info(unit)
            };
            self.set(unit, info);
            Ok(())
        }

        async fn start_no_wait(&self, unit: &str) -> Result<(), SystemdError> {
            self.log(format!("start {unit}"));
            self.running_since(unit, std::time::Duration::ZERO);
            Ok(())
        }

        async fn unit_processes(&self, _unit: &str) -> Result<Vec<(u32, String)>, SystemdError> {
            Ok(Vec::new())
        }
    }
}
