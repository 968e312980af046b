//! What a `checks.d` definition may depend on besides its own keys: the node as the agent's
//! settings describe it (its NodeName for `nodes`, its role and auth plugin for `when`, the
//! cluster key, its own `[[mounts]]` and scratch for the `auth_key`, `agent_mounts` and
//! `scratch` kinds) and the host it runs on (its GPUs and EFA devices for `when`).
//!
//! The settings are assembled above this module (`Settings::health_target`); here they are
//! plain values, so a test gives a node any shape without a settings file. The host's facts
//! are read once, and only when a definition asks for them.

use std::path::PathBuf;
use std::sync::OnceLock;

use super::checks::{efa, gpu, hw};
use super::facts::{Facts, Host};
use crate::authkey::{AuthSettings, AuthType, KeyTarget};
use crate::nodedef::Role;

/// One of the agent's own `[[mounts]]`, as the `agent_mounts` check verifies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnMount {
    /// The mount point.
    pub mount_point: String,
    /// Mounted read-only on purpose (`ro` among its options): not held to be writable.
    pub read_only: bool,
    /// A failure drains the node (`required = true`, the default); otherwise it is only
    /// reported, as the agent's mounts treat it.
    pub required: bool,
}

/// Node-local scratch as the `scratch` check verifies it: what `[scratch]` asks of a node
/// with instance store disks.
#[derive(Debug, Clone)]
pub struct ScratchTarget {
    /// `scratch.mount_point`.
    pub mount_point: String,
    /// Where instance store disks are named (`/dev/disk/by-id`).
    pub by_id_dir: PathBuf,
    /// Whether a by-id name is an instance store disk's (the scratch module's rule).
    pub is_instance_store: fn(&str) -> bool,
}

/// A word of `when`: something a node has or is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// `compute`: `node.role = "compute"` (slurmd).
    Compute,
    /// `login`: `node.role = "login"` (sackd).
    Login,
    /// `auth/munge`: `auth.type = "munge"`.
    AuthMunge,
    /// `auth/slurm`: `auth.type = "slurm"`.
    AuthSlurm,
    /// `gpus`: the instance has NVIDIA GPUs: its instance type has GPUs, or the kernel
    /// sees NVIDIA GPUs on PCI.
    Gpus,
    /// `efa`: the kernel sees EFA devices on PCI (the instance was launched with EFA
    /// interfaces).
    Efa,
}

impl Condition {
    /// Every condition with its word.
    pub const ALL: [(&'static str, Condition); 6] = [
        ("compute", Condition::Compute),
        ("login", Condition::Login),
        ("auth/munge", Condition::AuthMunge),
        ("auth/slurm", Condition::AuthSlurm),
        ("gpus", Condition::Gpus),
        ("efa", Condition::Efa),
    ];

    /// The condition a word names.
    pub fn parse(word: &str) -> Option<Condition> {
        Self::ALL.iter().find(|(w, _)| *w == word).map(|(_, c)| *c)
    }

    /// The words, for messages: `compute, login, ...`.
    pub fn words() -> String {
        Self::ALL.map(|(w, _)| w).join(", ")
    }
}

/// The start-up gate as the checks see it ([`super::startgate`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateTarget {
    /// The agent's state folder, where the gate's record is.
    pub state_dir: std::path::PathBuf,
    /// The gate's parts, in order: `dcgm` (when a profile is set), then the site commands'
    /// names.
    pub parts: Vec<String>,
}

/// The node and host the checks are loaded for.
#[derive(Debug, Clone)]
pub struct Target {
    /// Slurm NodeName, when known (`nodes` expressions are matched against it; with none,
    /// only `*` applies).
    pub node: Option<String>,
    /// `node.role`.
    pub role: Role,
    /// `auth.type`.
    pub auth_type: AuthType,
    /// The cluster key file as the agent writes it (`auth.key_path`, else the plugin's).
    pub key: KeyTarget,
    /// The agent's own `[[mounts]]`.
    pub mounts: Vec<OwnMount>,
    /// Node-local scratch, when `[scratch]` is on and the node makes it (a compute node).
    pub scratch: Option<ScratchTarget>,
    /// The start-up gate, when `[start_gate]` has parts and the node runs it (a compute
    /// node): the `start_gate` check reports each part.
    pub gate: Option<GateTarget>,
    /// Where the host's facts are read (the same roots as the run's
    /// [`super::RunEnv::host`]).
    pub host: Host,
    gpus: OnceLock<bool>,
    efa: OnceLock<bool>,
    instance_storage: OnceLock<bool>,
}

impl Target {
    /// A compute node with the settings' defaults (`auth/munge`, its key at
    /// `/etc/munge/munge.key`, no mounts, no scratch) on this host: what library users and
    /// tests start from.
    pub fn for_node(node: Option<&str>) -> Target {
        Target::new(
            node.map(str::to_string),
            Role::Compute,
            &AuthSettings::default(),
        )
    }

    /// A node of `role` with the `[auth]` settings `auth`, no mounts, no scratch, on this
    /// host.
    pub fn new(node: Option<String>, role: Role, auth: &AuthSettings) -> Target {
        Target {
            node,
            role,
            auth_type: auth.auth_type,
            key: KeyTarget::from_settings(auth),
            mounts: Vec::new(),
            scratch: None,
            gate: None,
            host: Host::default(),
            gpus: OnceLock::new(),
            efa: OnceLock::new(),
            instance_storage: OnceLock::new(),
        }
    }

    /// Whether the condition holds for this node.
    pub fn holds(&self, c: Condition) -> bool {
        match c {
            Condition::Compute => self.role == Role::Compute,
            Condition::Login => self.role == Role::Login,
            Condition::AuthMunge => self.auth_type == AuthType::Munge,
            Condition::AuthSlurm => self.auth_type == AuthType::Slurm,
            Condition::Gpus => *self.gpus.get_or_init(|| {
                let facts = Facts::new(self.host.clone());
                hw::detect_instance_type(&facts)
                    .and_then(|t| crate::hostfacts::expected_gpus(&t))
                    .is_some_and(|n| n > 0)
                    || !gpu::kernel_gpus(&self.host.sys_dir).is_empty()
            }),
            Condition::Efa => *self
                .efa
                .get_or_init(|| !efa::pci_efa_devices(&self.host.sys_dir).is_empty()),
        }
    }

    /// Whether the node has instance store disks, so that `[scratch]` puts scratch on them
    /// (false without a [`Target::scratch`]).
    pub fn has_instance_storage(&self) -> bool {
        let Some(s) = &self.scratch else {
            return false;
        };
        *self.instance_storage.get_or_init(|| {
            std::fs::read_dir(&s.by_id_dir).is_ok_and(|rd| {
                rd.flatten()
                    .any(|e| (s.is_instance_store)(&e.file_name().to_string_lossy()))
            })
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn host(dir: &std::path::Path) -> Host {
        Host {
            sys_dir: dir.join("sys"),
            ..Host::default()
        }
    }

    fn pci(dir: &std::path::Path, addr: &str, vendor: &str, device: &str, class: &str) {
        crate::health::facts::write_pci_device(&dir.join("sys"), addr, vendor, device, class);
    }

    #[test]
    fn words_name_each_condition() {
        for (w, c) in Condition::ALL {
            assert_eq!(Condition::parse(w), Some(c));
        }
        assert_eq!(Condition::parse("gpu"), None);
        assert!(Condition::words().starts_with("compute, login, auth/munge"));
    }

    /// `gpus` from the instance type's table or from PCI; `efa` from PCI only (a type
    /// that supports EFA, launched without it, has none).
    #[test]
    fn gpus_and_efa_are_read_from_the_host() {
        let dir = tempfile::tempdir().unwrap();
        let dmi = dir.path().join("sys/devices/virtual/dmi/id");
        std::fs::create_dir_all(&dmi).unwrap();
        std::fs::write(dmi.join("product_name"), "c6i.32xlarge\n").unwrap();
        let mut t = Target::for_node(Some("n1"));
        t.host = host(dir.path());
        assert!(!t.holds(Condition::Gpus));
        assert!(!t.holds(Condition::Efa));
        assert!(t.holds(Condition::Compute) && t.holds(Condition::AuthMunge));
        assert!(!t.holds(Condition::Login) && !t.holds(Condition::AuthSlurm));

        std::fs::write(dmi.join("product_name"), "p4d.24xlarge\n").unwrap();
        let mut t = Target::for_node(Some("n1"));
        t.host = host(dir.path());
        assert!(t.holds(Condition::Gpus), "the type has GPUs");

        // An unknown type: an NVIDIA 3D controller on PCI, an EFA function.
        std::fs::write(dmi.join("product_name"), "p9x.48xlarge\n").unwrap();
        pci(dir.path(), "0000:10:1c.0", "0x1d0f", "0xefa2", "0x020000");
        pci(dir.path(), "0000:b3:00.0", "0x10de", "0x2330", "0x030200");
        let mut t = Target::for_node(Some("n1"));
        t.host = host(dir.path());
        assert!(t.holds(Condition::Gpus) && t.holds(Condition::Efa));
    }

    #[test]
    fn instance_storage_by_its_by_id_names() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = Target::for_node(None);
        assert!(!t.has_instance_storage(), "no scratch: none looked for");
        t.scratch = Some(ScratchTarget {
            mount_point: "/scratch".into(),
            by_id_dir: dir.path().to_path_buf(),
            is_instance_store: |n| n.starts_with("nvme-Amazon_EC2_NVMe_Instance_Storage_"),
        });
        std::fs::write(dir.path().join("nvme-Amazon_Elastic_Block_Store_vol1"), "").unwrap();
        assert!(!t.clone().has_instance_storage());
        std::fs::write(
            dir.path()
                .join("nvme-Amazon_EC2_NVMe_Instance_Storage_AWS1"),
            "",
        )
        .unwrap();
        assert!(t.has_instance_storage());
    }
}
