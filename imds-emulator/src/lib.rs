//! An emulator of the EC2 instance metadata service (IMDSv2) for tests and local use.
//!
//! [`Emulator::start`] binds a TCP port (127.0.0.1, any free port by default) and serves,
//! on a thread of its own with its own tokio runtime, what EC2's metadata service serves:
//!
//! - `PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds` (1..=21600, else
//!   400) returns a random token and echoes the TTL header; a PUT carrying
//!   `X-Forwarded-For` gets 403.
//! - GETs need a live token in `X-aws-ec2-metadata-token` (401 without one or with an
//!   expired or unknown one), unless [`Config::allow_imdsv1`] lets token-less GETs in.
//! - `/latest/meta-data/...`, `/latest/dynamic/...` and `/latest/user-data` serve the
//!   defaults of AWS's amazon-ec2-metadata-mock (AEMM), directory listings with a
//!   trailing `/` on subdirectories, and IMDS's 404 page for absent paths; the bodies of
//!   the 400, 401 and 404 pages and the listings match AEMM's golden files byte for byte.
//! - Tags (`meta-data/tags/instance/`), user data and the event paths (spot interruption,
//!   rebalance recommendation, scheduled maintenance and its history, auto scaling
//!   lifecycle state) can be changed while it runs, through the [`Emulator`] handle or the
//!   control API; a scheduled event can be ended (completed or canceled) the way EC2 ends
//!   it, moved to `events/maintenance/history`.
//! - [`Fault`]s: error statuses, delays and dropped connections, for the token PUT, GETs
//!   or both, for the next N requests or until cleared.
//!
//! The control API (`/__emulator/...`, no token needed) lets other processes change the
//! state of a running emulator; the crate README lists its routes.
//!
//! The handle is synchronous and can be used from plain `#[test]`s and from async code
//! alike (it never blocks on the caller's runtime). Dropping it stops the server.
//!
//! ```
//! let emu = imds_emulator::Emulator::start(imds_emulator::Config::default()).unwrap();
//! emu.set("instance-id", "i-0123456789abcdef0");
//! emu.set_tag("slurm:node-name", "gpu-1");
//! assert!(emu.endpoint().starts_with("http://127.0.0.1:"));
//! ```

pub mod autoscaling;
mod aws;
pub mod ec2;
mod fault;
pub mod pcs;
mod server;
pub mod throttle;
mod tree;

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::thread::JoinHandle;

pub use fault::{Fault, FaultKind, FaultTarget};
pub use server::{
    RequestRecord, CONTROL_PREFIX, MAX_TOKEN_TTL_SECS, TOKEN_HEADER, TOKEN_TTL_HEADER,
};
pub use tree::{EventOutcome, AEMM_DEFAULTS_JSON};

use server::{Shared, State};
use tree::Tree;

/// Where instance tags live, relative to `/latest/`.
const TAGS_PATH: &str = "meta-data/tags/instance";

/// How to start an [`Emulator`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Address to listen on; the default `127.0.0.1:0` picks a free port.
    pub bind: SocketAddr,
    /// Answer GETs that carry no token (IMDSv1, "optional" mode). Default `false`: every
    /// GET needs a token, as on instances launched with `HttpTokens=required`. A GET with
    /// an invalid or expired token gets 401 either way.
    pub allow_imdsv1: bool,
    /// Serve the control API under `/__emulator/`. Default `true`.
    pub control_api: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            allow_imdsv1: false,
            control_api: true,
        }
    }
}

/// A running emulator. Dropping it (or [`Emulator::shutdown`]) stops the server and
/// closes every connection.
///
/// Paths given to the setters are relative to `/latest/meta-data/` unless said otherwise;
/// leading and trailing slashes are ignored.
#[derive(Debug)]
pub struct Emulator {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Emulator {
    /// Binds `config.bind` and starts serving with AEMM's defaults; returns once the
    /// socket is listening.
    ///
    /// # Errors
    /// When the address cannot be bound or the runtime or thread cannot be created.
    pub fn start(config: Config) -> io::Result<Emulator> {
        let std_listener = std::net::TcpListener::bind(config.bind)?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let listener = {
            let _guard = runtime.enter();
            tokio::net::TcpListener::from_std(std_listener)?
        };
        let shared = Arc::new(Shared::new(
            State {
                tree: Tree::aemm_defaults(),
                tokens: HashMap::new(),
                faults: Default::default(),
                log: Vec::new(),
                allow_imdsv1: config.allow_imdsv1,
            },
            config.control_api,
        ));
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let server_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("imds-emulator-{}", addr.port()))
            .spawn(move || {
                runtime.block_on(async move {
                    loop {
                        tokio::select! {
                            _ = &mut stopped => break,
                            accepted = listener.accept() => match accepted {
                                Ok((stream, _)) => {
                                    tokio::spawn(server::serve_connection(
                                        stream,
                                        server_shared.clone(),
                                    ));
                                }
                                Err(e) => {
                                    // Out of file descriptors and the like: back off.
                                    tracing::warn!("accept failed: {e}");
                                    tokio::time::sleep(std::time::Duration::from_millis(50))
                                        .await;
                                }
                            },
                        }
                    }
                });
                // Dropping the runtime here cancels the connection tasks.
            })?;
        Ok(Emulator {
            addr,
            shared,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address the emulator listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL, e.g. `http://127.0.0.1:40123` (what `AWS_EC2_METADATA_SERVICE_ENDPOINT`
    /// or aws-config's `imds::Client::builder().endpoint(..)` takes).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Sets the value at a `meta-data` path, e.g. `set("instance-type", "c5.large")`.
    pub fn set(&self, path: &str, value: impl Into<String>) {
        self.set_raw(&format!("meta-data/{path}"), value.into());
    }

    /// Removes the value at a `meta-data` path and everything below it (later GETs: 404).
    pub fn remove(&self, path: &str) {
        self.shared.lock().tree.remove(&format!("meta-data/{path}"));
    }

    /// Sets the value at a `dynamic` path, e.g. `instance-identity/document`.
    pub fn set_dynamic(&self, path: &str, value: impl Into<String>) {
        self.set_raw(&format!("dynamic/{path}"), value.into());
    }

    /// Sets the instance tag `key` (served at `meta-data/tags/instance/<key>`). Like EC2,
    /// tag keys with `/` cannot be served; such a key ends up as a nested path.
    pub fn set_tag(&self, key: &str, value: &str) {
        self.set_raw(&format!("{TAGS_PATH}/{key}"), value.to_owned());
    }

    /// Removes every instance tag: `meta-data/tags/` disappears, as on an instance whose
    /// launch template does not enable tags in metadata. AEMM's defaults have two tags
    /// (`Name`, `Test`).
    pub fn clear_tags(&self) {
        self.shared.lock().tree.remove(TAGS_PATH);
    }

    /// Serves `role`'s instance-profile credentials at `iam/security-credentials/<role>`
    /// (and `role` as the only entry of `iam/security-credentials/`), in the JSON shape
    /// EC2 serves and aws-config's IMDS credentials provider reads: `Code`, `LastUpdated`,
    /// `Type`, `AccessKeyId`, `SecretAccessKey`, `Token`, `Expiration` (RFC 3339, UTC).
    pub fn set_role_credentials(
        &self,
        role: &str,
        access_key_id: &str,
        secret_access_key: &str,
        token: &str,
        expiration: &str,
    ) {
        let body = format!(
            "{{\n  \"Code\" : \"Success\",\n  \"LastUpdated\" : \"2024-01-01T00:00:00Z\",\n  \
             \"Type\" : \"AWS-HMAC\",\n  \"AccessKeyId\" : {},\n  \"SecretAccessKey\" : {},\n  \
             \"Token\" : {},\n  \"Expiration\" : {}\n}}",
            json_string(access_key_id),
            json_string(secret_access_key),
            json_string(token),
            json_string(expiration)
        );
        let mut state = self.shared.lock();
        state.tree.remove("meta-data/iam/security-credentials");
        state
            .tree
            .set("meta-data/iam/security-credentials", role.to_owned());
        state
            .tree
            .set(&format!("meta-data/iam/security-credentials/{role}"), body);
    }

    /// Sets the user data served raw at `/latest/user-data`.
    pub fn set_user_data(&self, data: impl Into<Vec<u8>>) {
        self.shared.lock().tree.set("user-data", data.into());
    }

    /// Removes the user data (`/latest/user-data` answers 404). AEMM's default user data
    /// is `1234,john,reboot,true\n`.
    pub fn clear_user_data(&self) {
        self.shared.lock().tree.remove("user-data");
    }

    /// Schedules a spot interruption: `spot/instance-action` becomes
    /// `{"action": "<action>", "time": "<time>"}` and `spot/termination-time` `<time>`.
    /// `action` is `terminate`, `stop` or `hibernate`; `time` like `2017-09-18T08:22:00Z`.
    pub fn set_spot_instance_action(&self, action: &str, time: &str) {
        let body = format!(
            "{{\"action\": {}, \"time\": {}}}",
            json_string(action),
            json_string(time)
        );
        let mut state = self.shared.lock();
        state.tree.set("meta-data/spot/instance-action", body);
        state
            .tree
            .set("meta-data/spot/termination-time", time.to_owned());
    }

    /// Removes the spot interruption (both paths answer 404 again).
    pub fn clear_spot_instance_action(&self) {
        self.shared.lock().tree.remove("meta-data/spot");
    }

    /// Issues a rebalance recommendation: `events/recommendations/rebalance` becomes
    /// `{"noticeTime": "<notice_time>"}`.
    pub fn set_rebalance(&self, notice_time: &str) {
        let body = format!("{{\"noticeTime\": {}}}", json_string(notice_time));
        self.set_raw("meta-data/events/recommendations/rebalance", body);
    }

    /// Removes the rebalance recommendation.
    pub fn clear_rebalance(&self) {
        self.remove("events/recommendations/rebalance");
    }

    /// Sets `events/maintenance/scheduled`, served verbatim: a JSON array of objects with
    /// `NotBefore`, `Code`, `Description`, `EventId`, `NotAfter` and `State`.
    pub fn set_scheduled_maintenance(&self, events_json: &str) {
        self.set("events/maintenance/scheduled", events_json);
    }

    /// Removes `events/maintenance/scheduled`.
    pub fn clear_scheduled_maintenance(&self) {
        self.remove("events/maintenance/scheduled");
    }

    /// Sets `events/maintenance/history`, served verbatim: the completed and canceled
    /// events, the same shape as `scheduled`.
    pub fn set_maintenance_history(&self, events_json: &str) {
        self.set("events/maintenance/history", events_json);
    }

    /// Removes `events/maintenance/history`.
    pub fn clear_maintenance_history(&self) {
        self.remove("events/maintenance/history");
    }

    /// Ends the scheduled maintenance event `event_id` as EC2 does: it leaves
    /// `events/maintenance/scheduled` (which answers 404 once empty) and is appended to
    /// `events/maintenance/history` with `State` `completed` or `canceled` and
    /// `[Completed] ` or `[Canceled] ` before its description.
    ///
    /// # Errors
    /// When `scheduled` is not a JSON array or has no event with that `EventId`; nothing
    /// changes then.
    pub fn finish_maintenance_event(
        &self,
        event_id: &str,
        outcome: EventOutcome,
    ) -> Result<(), String> {
        tree::finish_event(&mut self.shared.lock().tree, event_id, outcome)
    }

    /// Sets `autoscaling/target-lifecycle-state` (`InService`, `Terminated`, ...).
    pub fn set_target_lifecycle_state(&self, state: &str) {
        self.set("autoscaling/target-lifecycle-state", state);
    }

    /// Removes `autoscaling/target-lifecycle-state`.
    pub fn clear_target_lifecycle_state(&self) {
        self.remove("autoscaling/target-lifecycle-state");
    }

    /// Allows or forbids token-less GETs from now on (see [`Config::allow_imdsv1`]).
    pub fn set_allow_imdsv1(&self, allow: bool) {
        self.shared.lock().allow_imdsv1 = allow;
    }

    /// Forgets every issued token, as if all had expired: the next GET with one gets 401.
    pub fn expire_tokens(&self) {
        self.shared.lock().tokens.clear();
    }

    /// Adds a fault; see [`Fault`] for how several combine.
    pub fn inject(&self, fault: Fault) {
        self.shared.lock().faults.push(fault);
    }

    /// Removes every fault.
    pub fn clear_faults(&self) {
        self.shared.lock().faults.clear();
    }

    /// How many requests the metadata service received (token PUTs included, control API
    /// requests not).
    pub fn request_count(&self) -> u64 {
        self.shared.lock().log.len() as u64
    }

    /// Every request the metadata service received, oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.lock().log.clone()
    }

    /// Stops the server and waits for its thread to end (also done on drop).
    pub fn shutdown(self) {}

    fn set_raw(&self, key: &str, value: impl Into<bytes::Bytes>) {
        self.shared.lock().tree.set(key, value);
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}
