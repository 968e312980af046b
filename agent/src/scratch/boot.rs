//! Scratch's part of a boot: put in place beside bootstrap's other steps (before slurmd
//! starts, so that a dynamic node's definition carries its `TmpDisk`), then, once the node
//! has joined, drain it when scratch failed or compare the size with slurm.conf's
//! `TmpDisk`. Bootstrap calls these two in its list of steps; the policy is scratch's.

use std::path::PathBuf;

use super::{Outcome, ScratchError, ScratchSettings};
use crate::node_state::{Cause, Gateway};
use crate::slurm::NodeInfo;

/// What putting scratch in place gave.
pub type Result = std::result::Result<Outcome, ScratchError>;

/// Node-local scratch ([`super::ensure`]) on a blocking thread; a task that ends without
/// an answer counts as scratch not in place.
pub async fn put_in_place(s: &ScratchSettings) -> Result {
    let s = s.clone();
    tokio::task::spawn_blocking(move || super::ensure(&s, &super::ScratchEnv::system()))
        .await
        .unwrap_or_else(|e| {
            Err(ScratchError::Io {
                path: PathBuf::from("/dev/disk/by-id"),
                source: std::io::Error::other(e.to_string()),
            })
        })
}

/// The size a dynamic node's definition carries as `TmpDisk` (MiB), when scratch is in
/// place and assembled; logs the outcome (an error says the node will be drained once
/// registered).
pub fn tmp_disk(s: &ScratchSettings, scratch: &Result) -> Option<u64> {
    match scratch {
        Ok(outcome) => {
            tracing::info!(?outcome, "scratch");
            outcome.tmp_disk_mib()
        }
        Err(e) => {
            tracing::error!(mount_point = %s.mount_point.display(), error = %e, "scratch not in place: the node will be drained once registered");
            None
        }
    }
}

/// After the join of `node` (slurmctld's record, as the join saw it): scratch that failed
/// drains the node through `gateway` (its reason names the disk; a drain already there, an
/// admin's or another cause's, is left alone); scratch in place on a node whose `TmpDisk`
/// comes from slurm.conf (`dynamic` false) is compared with it (a warning). Never fails:
/// the node is up, and the drain says why it takes no jobs.
pub async fn after_join(
    s: &ScratchSettings,
    gateway: &Gateway,
    dynamic: bool,
    node: &NodeInfo,
    scratch: &Result,
) {
    let mount_point = &s.mount_point;
    let name = gateway.node();
    match scratch {
        Ok(outcome) => {
            let Some(size) = outcome.tmp_disk_mib() else {
                return;
            };
            if dynamic {
                return;
            }
            let conf = node
                .fields
                .get("TmpDisk")
                .and_then(|v| v.parse::<u64>().ok());
            if let Some(w) = super::tmp_disk_mismatch(conf, size, mount_point) {
                tracing::warn!(node = %name, "{w}");
            }
        }
        Err(e) => {
            if node.is_drained() {
                tracing::error!(node = %name, error = %e, "scratch not in place; the node is drained already");
                return;
            }
            let reason = super::drain_reason(gateway.instance_id(), mount_point, e);
            let cause = Cause::stated(
                crate::reason::ReasonCause::Scratch,
                gateway.instance_id(),
                &reason,
            )
            .unwrap_or_else(|| Cause::Scratch {
                detail: reason.clone(),
            });
            match gateway.drain(cause, Some(node)).await {
                Ok(_) => {
                    tracing::error!(node = %name, %reason, "scratch not in place: node drained")
                }
                Err(d) => {
                    tracing::error!(node = %name, %reason, error = %d, "scratch not in place; draining the node failed")
                }
            }
        }
    }
}
