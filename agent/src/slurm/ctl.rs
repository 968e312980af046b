//! The seam over slurmctld as the agent reaches it through `scontrol`: [`Slurmctld`], the
//! calls the orchestrators make (a node's record; the changes the node's gateway alone
//! makes), implemented by [`Scontrol`] and, in unit tests, by an in-memory fake, so
//! that bootstrap's join and the drain engine's passes run without slurmctld.
//!
//! Only the gateway changes a node through it (`agent/tests/module_floors.rs`,
//! `node_state_changes_go_through_the_gateway`, counts a receiver named `slurmctld` as a
//! scontrol).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use super::node::{NodeInfo, Scontrol, ScontrolError};

/// A look at one node's record started ahead of time ([`Slurmctld::look_ahead`]).
pub type LookAhead = Pin<Box<dyn Future<Output = Result<Option<NodeInfo>, ScontrolError>> + Send>>;

/// slurmctld, as `scontrol` reaches it (`scontrol show node`, `scontrol update`, `scontrol
/// reboot`, `scontrol delete`; Slurm's scontrol(1)). Each call is one RPC to slurmctld; the
/// changes of a node are the gateway's alone.
#[async_trait::async_trait]
pub trait Slurmctld: std::fmt::Debug + Send + Sync {
    /// The node's record (`scontrol show node -o <name>`); `None` when slurmctld does not
    /// know it.
    ///
    /// # Errors
    /// [`ScontrolError`] for anything but "not found".
    async fn show_node(&self, name: &str) -> Result<Option<NodeInfo>, ScontrolError>;

    /// Every node's record (`scontrol show nodes -o`).
    ///
    /// # Errors
    /// [`ScontrolError`].
    async fn show_nodes(&self) -> Result<Vec<NodeInfo>, ScontrolError>;

    /// `scontrol update NodeName=<node> State=DRAIN Reason=<reason>`.
    ///
    /// # Errors
    /// [`ScontrolError`].
    async fn drain(&self, node: &str, reason: &str) -> Result<(), ScontrolError>;

    /// `scontrol update NodeName=<node> State=RESUME`.
    ///
    /// # Errors
    /// [`ScontrolError`].
    async fn resume(&self, node: &str) -> Result<(), ScontrolError>;

    /// `scontrol reboot ASAP nextstate=resume reason=<reason> <node>`.
    ///
    /// # Errors
    /// [`ScontrolError`].
    async fn reboot(&self, node: &str, reason: &str) -> Result<(), ScontrolError>;

    /// `scontrol update NodeName=<node> State=POWER_DOWN_ASAP Reason=<reason>` (a node of
    /// Slurm's power saving).
    ///
    /// # Errors
    /// [`ScontrolError`].
    async fn power_down(&self, node: &str, reason: &str) -> Result<(), ScontrolError>;

    /// `scontrol delete NodeName=<node>` (a dynamic node's record).
    ///
    /// # Errors
    /// [`ScontrolError`].
    async fn delete_node(&self, node: &str) -> Result<(), ScontrolError>;

    /// The look at `name` that the next [`Slurmctld::show_node`] would make, with its
    /// program already started ([`Scontrol::spawn_ready`]), so that the look itself is one
    /// RPC; `None` where nothing can be started ahead (the default).
    fn look_ahead(&self, _name: &str) -> Option<LookAhead> {
        None
    }

    /// The same slurmctld with another limit per call (the HealthCheckProgram's
    /// `health.scontrol_timeout`); a fake without limits returns itself.
    fn with_timeout(self: Arc<Self>, _timeout: Duration) -> Arc<dyn Slurmctld>;
}

#[async_trait::async_trait]
impl Slurmctld for Scontrol {
    async fn show_node(&self, name: &str) -> Result<Option<NodeInfo>, ScontrolError> {
        Scontrol::show_node(self, name).await
    }

    async fn show_nodes(&self) -> Result<Vec<NodeInfo>, ScontrolError> {
        let out = self.run(&["show", "nodes", "-o"]).await?;
        Ok(out
            .lines()
            .filter(|l| l.starts_with("NodeName="))
            .map(NodeInfo::parse)
            .collect())
    }

    async fn drain(&self, node: &str, reason: &str) -> Result<(), ScontrolError> {
        Scontrol::drain(self, node, reason).await
    }

    async fn resume(&self, node: &str) -> Result<(), ScontrolError> {
        Scontrol::resume(self, node).await
    }

    async fn reboot(&self, node: &str, reason: &str) -> Result<(), ScontrolError> {
        Scontrol::reboot(self, node, reason).await
    }

    async fn power_down(&self, node: &str, reason: &str) -> Result<(), ScontrolError> {
        Scontrol::power_down(self, node, reason).await
    }

    async fn delete_node(&self, node: &str) -> Result<(), ScontrolError> {
        Scontrol::delete_node(self, node).await
    }

    fn look_ahead(&self, name: &str) -> Option<LookAhead> {
        let ready = self.spawn_ready().ok()?;
        let name = name.to_string();
        Some(Box::pin(async move { ready.show_node(&name).await }))
    }

    fn with_timeout(self: Arc<Self>, timeout: Duration) -> Arc<dyn Slurmctld> {
        Arc::new(Scontrol {
            timeout,
            ..(*self).clone()
        })
    }
}

/// An in-memory slurmctld for unit tests.
#[cfg(test)]
pub(crate) mod fake {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex, MutexGuard};
    use std::time::Duration;

    use super::{NodeInfo, ScontrolError, Slurmctld};

    /// Node records by NodeName, changed by the calls as slurmctld (without accounting
    /// storage) changes them: a drain adds `DRAIN` and the reason (refused, with no call
    /// made, as [`crate::slurm::Scontrol::drain`] refuses them: not one plain NodeName, a reason Slurm
    /// would cut or that holds a line break); a resume takes `DRAIN` away and makes a
    /// `DOWN` node `IDLE`, keeping the last reason (Slurm 23.02+, see
    /// [`NodeInfo::held_reason`]), and is refused as "Invalid node state specified" on a
    /// node neither drained nor down; `reboot ASAP` drains with the reason and adds
    /// `REBOOT_REQUESTED`; a delete removes the record, refused while a job runs on it. A
    /// NodeName it does not know is "not found". Not modelled: jobs starting, slurmd
    /// registering, reservations (a delete of a node a reservation names succeeds here).
    /// Every call is logged (`scontrol`'s words). Clones share the records.
    #[derive(Debug, Clone, Default)]
    pub(crate) struct FakeSlurmctld {
        state: Arc<Mutex<State>>,
    }

    #[derive(Debug, Default)]
    struct State {
        records: BTreeMap<String, NodeInfo>,
        calls: Vec<String>,
        unreachable: bool,
    }

    impl FakeSlurmctld {
        fn state(&self) -> MutexGuard<'_, State> {
            self.state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }

        /// Sets the record `line` (`scontrol show node -o`'s form) under its NodeName.
        pub(crate) fn set_record(&self, line: &str) {
            let node = NodeInfo::parse(line);
            self.state().records.insert(node.name().to_string(), node);
        }

        /// Makes every look fail as scontrol fails when slurmctld is down (`true`), or
        /// answer again.
        pub(crate) fn set_unreachable(&self, down: bool) {
            self.state().unreachable = down;
        }

        /// The record of `name` now.
        pub(crate) fn record(&self, name: &str) -> Option<NodeInfo> {
            self.state().records.get(name).cloned()
        }

        /// The calls so far, as scontrol's words (`update NodeName=n1 State=RESUME`).
        pub(crate) fn calls(&self) -> Vec<String> {
            self.state().calls.clone()
        }

        fn change(
            &self,
            call: String,
            node: &str,
            f: impl FnOnce(&mut NodeInfo) -> Result<(), String>,
        ) -> Result<(), ScontrolError> {
            let mut st = self.state();
            st.calls.push(call.clone());
            let outcome = match st.records.get_mut(node) {
                Some(n) => f(n),
                None => Err(format!("Invalid node name specified: {node}")),
            };
            outcome.map_err(|stderr| ScontrolError::Failed {
                program: "scontrol".into(),
                args: call,
                code: 1,
                stderr,
                stdout: String::new(),
            })
        }
    }

    /// `State` with `flag` added or taken away.
    fn with_flag(n: &mut NodeInfo, flag: &str, on: bool) {
        let state = n.state().to_string();
        let mut words: Vec<&str> = state.split('+').filter(|w| *w != flag).collect();
        if on {
            words.push(flag);
        }
        n.fields.insert("State".into(), words.join("+"));
    }

    #[async_trait::async_trait]
    impl Slurmctld for FakeSlurmctld {
        async fn show_node(&self, name: &str) -> Result<Option<NodeInfo>, ScontrolError> {
            let mut st = self.state();
            st.calls.push(format!("show node -o {name}"));
            if st.unreachable {
                return Err(ScontrolError::Failed {
                    program: "scontrol".into(),
                    args: format!("show node -o {name}"),
                    code: 1,
                    stderr: "slurm_load_node error: Unable to contact slurm controller (connect failure)".into(),
                    stdout: String::new(),
                });
            }
            Ok(st.records.get(name).cloned())
        }

        async fn show_nodes(&self) -> Result<Vec<NodeInfo>, ScontrolError> {
            let mut st = self.state();
            st.calls.push("show nodes -o".into());
            Ok(st.records.values().cloned().collect())
        }

        async fn drain(&self, node: &str, reason: &str) -> Result<(), ScontrolError> {
            let call = format!("update NodeName={node} State=DRAIN Reason={reason}");
            if !crate::slurm::node::is_plain_node_name(node) {
                return Err(ScontrolError::NotOneNode {
                    node: node.to_string(),
                });
            }
            if let Err(m) = crate::slurm::node::validate_reason(reason) {
                return Err(ScontrolError::Failed {
                    program: "scontrol".into(),
                    args: "update".into(),
                    code: -1,
                    stderr: m.to_string(),
                    stdout: String::new(),
                });
            }
            self.change(call, node, |n| {
                with_flag(n, "DRAIN", true);
                n.fields.insert(
                    "Reason".into(),
                    format!("{reason} [root@2026-12-06T00:00:00]"),
                );
                Ok(())
            })
        }

        async fn resume(&self, node: &str) -> Result<(), ScontrolError> {
            let call = format!("update NodeName={node} State=RESUME");
            self.change(call, node, |n| {
                if !n.is_drained() && n.base_state() != "DOWN" {
                    return Err("slurm_update error: Invalid node state specified".into());
                }
                with_flag(n, "DRAIN", false);
                if n.base_state() == "DOWN" {
                    let state = n.state().replacen("DOWN", "IDLE", 1);
                    n.fields.insert("State".into(), state);
                }
                Ok(())
            })
        }

        async fn power_down(&self, node: &str, reason: &str) -> Result<(), ScontrolError> {
            crate::slurm::node::validate_reason(reason).map_err(|m| ScontrolError::Failed {
                program: "scontrol".into(),
                args: "update".into(),
                code: -1,
                stderr: m.to_string(),
                stdout: String::new(),
            })?;
            let call = format!("update NodeName={node} State=POWER_DOWN_ASAP Reason={reason}");
            self.change(call, node, |n| {
                if !n.has_flag("CLOUD") {
                    return Err("Invalid node state specified".into());
                }
                with_flag(n, "DRAIN", true);
                with_flag(n, "POWER_DOWN", true);
                n.fields.insert(
                    "Reason".into(),
                    format!("{reason} [root@2026-12-06T00:00:00]"),
                );
                Ok(())
            })
        }

        async fn reboot(&self, node: &str, reason: &str) -> Result<(), ScontrolError> {
            let call = format!("reboot ASAP nextstate=resume reason={reason} {node}");
            self.change(call, node, |n| {
                with_flag(n, "DRAIN", true);
                with_flag(n, "REBOOT_REQUESTED", true);
                n.fields.insert(
                    "Reason".into(),
                    format!("{reason} [root@2026-12-06T00:00:00]"),
                );
                Ok(())
            })
        }

        async fn delete_node(&self, node: &str) -> Result<(), ScontrolError> {
            let call = format!("delete NodeName={node}");
            let mut st = self.state();
            st.calls.push(call.clone());
            let refused = match st.records.get(node) {
                None => Some(format!("Invalid node name specified: {node}")),
                Some(n) if !n.runs_no_job() => {
                    Some("delete_nodes error: Node has jobs".to_string())
                }
                Some(_) => None,
            };
            match refused {
                None => {
                    st.records.remove(node);
                    Ok(())
                }
                Some(stderr) => Err(ScontrolError::Failed {
                    program: "scontrol".into(),
                    args: call,
                    code: 1,
                    stderr,
                    stdout: String::new(),
                }),
            }
        }

        fn with_timeout(self: Arc<Self>, _timeout: Duration) -> Arc<dyn Slurmctld> {
            self
        }
    }
}
