//! The resolved recipe of one image: OS, architecture, every version, the pinned sources
//! with their checksums, and the Packer variables that carry them.
//!
//! Inputs: `packer/sources.toml` (pins) and the template's `local.os_catalog` (supported
//! OS and architectures, read with hcl-rs from `packer/*.pkr.hcl`).

use crate::error::{Error, Result};
use crate::template::Template;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value as Json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The OS of `build --target local` (a Debian 12 root made by mmdebstrap).
pub const LOCAL_OS: &str = "debian-12";
/// The glibc of [`LOCAL_OS`] (Debian 12's libc6).
pub const LOCAL_OS_GLIBC: &str = "2.36";
/// Slurm version of Debian 12's packages (slurm-wlm 22.05.8), the default locally.
pub const DEBIAN_12_SLURM: &str = "22.05.8";

/// `--auth` for an image that can join with either plugin: MUNGE installed and Slurm built
/// with auth/munge and auth/slurm (23.11+), the node's `auth.type` left to its join. The
/// default where every Slurm version of the image has auth/slurm.
pub const AUTH_BOTH: &str = "munge+slurm";

/// A download pinned by URL and sha256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pin {
    /// Where it comes from.
    pub url: String,
    /// Lowercase hex sha256 of the file.
    #[serde(default)]
    pub sha256: String,
}

/// `packer/sources.toml`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sources {
    /// Slurm source tarballs by version.
    #[serde(default)]
    pub slurm: BTreeMap<String, Pin>,
    /// MUNGE source tarballs by version.
    #[serde(default)]
    pub munge: BTreeMap<String, Pin>,
    /// EFA installer tarballs by version.
    #[serde(default)]
    pub efa: BTreeMap<String, Pin>,
    /// Default versions.
    #[serde(default)]
    pub defaults: Defaults,
    /// SchedMD's end of support by Slurm release (`"24.11" = "2026-05"`, year and month):
    /// each release is supported for 18 months after it comes out.
    #[serde(default)]
    pub slurm_support: BTreeMap<String, String>,
}

/// `[defaults]` of sources.toml.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Defaults {
    /// Default Slurm version.
    #[serde(default)]
    pub slurm: String,
    /// Default MUNGE version.
    #[serde(default)]
    pub munge: String,
    /// Default EFA installer version.
    #[serde(default)]
    pub efa: String,
}

impl Sources {
    /// Read and parse sources.toml; errors name the file.
    pub fn load(path: &Path) -> Result<Sources> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::BadInput(format!("sources file {}: no such file", path.display()))
            } else {
                Error::io(format!("reading {}", path.display()), e)
            }
        })?;
        toml::from_str(&text).map_err(|e| Error::File {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }
}

/// One entry of the template's `local.os_catalog`.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct OsEntry {
    /// `deb` or `rpm`.
    pub family: String,
    /// AMI owner.
    pub owner: String,
    /// AMI name patterns by architecture.
    pub ami_name: BTreeMap<String, String>,
    /// The OS's glibc version (`2.34`): the newest glibc symbol version a program put into
    /// the image may need ([`crate::binary`]).
    #[serde(default)]
    pub glibc: Option<String>,
}

/// The OS catalog from a template's literal `locals { os_catalog = ... }`.
pub fn os_catalog(template: &Template) -> Result<BTreeMap<String, OsEntry>> {
    let raw = template
        .locals
        .get("os_catalog")
        .ok_or_else(|| Error::File {
            path: template.path.clone(),
            message: "no literal local.os_catalog: the builder reads the supported OS list from it"
                .into(),
        })?;
    serde_json::from_value(raw.clone()).map_err(|e| Error::File {
        path: template.path.clone(),
        message: format!("local.os_catalog: {e}"),
    })
}

/// What a person asks for; unset fields take defaults.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// Base OS key.
    pub os: Option<String>,
    /// `x86_64` or `arm64`.
    pub arch: Option<String>,
    /// Slurm versions to install side by side, as given (`25.11`, `25.11.6`); empty: the
    /// default version alone. Two or more need `slurm_source = tarball`.
    pub slurm_versions: Vec<String>,
    /// Which of `slurm_versions` `/opt/slurm` points at in the image (and whose units the
    /// image installs); `None`: the first.
    pub slurm_default: Option<String>,
    /// `tarball`, `debian-source` or `distro`.
    pub slurm_source: Option<String>,
    /// `munge`, `slurm` or `munge+slurm`; `None`: `munge+slurm` where every Slurm version
    /// is 23.11 or later, else `munge`.
    pub auth: Option<String>,
    /// EFA installer version; `Some("")` leaves EFA out.
    pub efa_version: Option<String>,
    /// Lustre client.
    pub lustre: Option<bool>,
    /// NVIDIA driver version or branch.
    pub nvidia_driver: Option<String>,
    /// DCGM.
    pub dcgm: bool,
    /// The CloudWatch agent.
    pub cloudwatch_agent: bool,
    /// Agent version to record.
    pub agent_version: Option<String>,
    /// Build region.
    pub region: Option<String>,
    /// Copy regions.
    pub ami_regions: Vec<String>,
    /// The local target (Debian 12 chroot).
    pub local: bool,
}

/// The agent version a recipe records when none is given; `build` replaces it with what
/// the staged agent's `--version` says.
pub const DEFAULT_AGENT_VERSION: &str = "0.0.0-dev";

/// A fully resolved recipe.
#[derive(Debug, Clone, Serialize)]
pub struct Recipe {
    /// Base OS.
    pub os: String,
    /// Architecture.
    pub arch: String,
    /// Package family of the OS.
    pub family: String,
    /// The default Slurm version: the one `/opt/slurm` points at in the image, in the AMI
    /// name and tags, and the only one of a single-version image.
    pub slurm_version: String,
    /// `tarball`, `debian-source` or `distro`.
    pub slurm_source: String,
    /// SchedMD's end of support by Slurm release, as `packer/sources.toml` lists it
    /// (`"25.11" = "2027-05"`).
    pub slurm_support: BTreeMap<String, String>,
    /// Slurm tarball pin of the default version (tarball builds).
    pub slurm: Option<Pin>,
    /// Every Slurm version of the image, in the order asked for (one entry for a
    /// single-version image). With two or more, each is installed in
    /// `/opt/slurm-<version>` and `/opt/slurm` is a symlink to the default's.
    pub slurm_versions: Vec<SlurmRelease>,
    /// The auth plugins the image can join with: `munge` (auth/munge only: the image's
    /// agent settings say `auth.type = "munge"`), `slurm` (auth/slurm only, Slurm built
    /// `--without-munge`, no MUNGE: `auth.type = "slurm"`), or [`AUTH_BOTH`] (MUNGE and
    /// both plugins; `auth.type` left to the node's join: auth/slurm in the managed join,
    /// munge otherwise).
    pub auth: String,
    /// MUNGE version and pin (when the OS has no package).
    pub munge_version: String,
    /// MUNGE source pin.
    pub munge: Option<Pin>,
    /// EFA installer version (empty: left out).
    pub efa_version: String,
    /// EFA installer pin.
    pub efa: Option<Pin>,
    /// Lustre client.
    pub lustre: bool,
    /// NVIDIA driver (empty: none).
    pub nvidia_driver: String,
    /// DCGM.
    pub dcgm: bool,
    /// The CloudWatch agent (shipping the Slurm units' journal).
    pub cloudwatch_agent: bool,
    /// Agent version.
    pub agent_version: String,
    /// Build region.
    pub region: String,
    /// Copy regions.
    pub ami_regions: Vec<String>,
    /// Where the pins came from.
    pub sources_file: PathBuf,
    /// The OS's glibc as the catalog gives it ([`OsEntry::glibc`]; [`LOCAL_OS_GLIBC`] for
    /// the local target): what an agent binary put into the image may need at most.
    #[serde(skip)]
    pub os_glibc: Option<String>,
}

/// One Slurm version of a recipe, resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SlurmRelease {
    /// The entry as given (`25.11` or `25.11.6`).
    pub entry: String,
    /// The version it resolved to (a key of `[slurm]` in sources.toml for tarball builds).
    pub version: String,
    /// The pinned tarball (tarball builds).
    pub pin: Option<Pin>,
}

/// The version a Slurm entry names: the entry itself when pinned, else for a release
/// series (`MAJOR.MINOR`, e.g. `25.11`) the newest version of it pinned in `table`; else
/// the entry unchanged, which [`pinned`] then refuses naming the pinned versions.
fn slurm_entry_version(entry: &str, table: &BTreeMap<String, Pin>) -> String {
    if table.contains_key(entry) || entry.split('.').count() != 2 {
        return entry.to_string();
    }
    let series = format!("{entry}.");
    table
        .keys()
        .filter(|k| {
            k.strip_prefix(&series)
                .is_some_and(|micro| !micro.contains('.'))
        })
        .max_by_key(|k| version_key(k))
        .cloned()
        .unwrap_or_else(|| entry.to_string())
}

/// A version as numbers, for ordering (`25.11.10` after `25.11.9`).
fn version_key(version: &str) -> Vec<u64> {
    version
        .split(['.', '-'])
        .map(|p| p.parse::<u64>().unwrap_or(0))
        .collect()
}

/// Whether `v` is `MAJOR.MINOR.MICRO` in digits: the name of a versioned prefix
/// (`/opt/slurm-25.11.6`).
fn release_form(v: &str) -> bool {
    let parts: Vec<&str> = v.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// Resolve the Slurm entries of a request: each to its version and pin; one of them
/// the default. Errors name the entry.
fn resolve_slurm(
    req: &Request,
    slurm_source: &str,
    fallback: String,
    sources: &Sources,
    sources_file: &Path,
) -> Result<(Vec<SlurmRelease>, usize)> {
    let entries: Vec<String> = if !req.slurm_versions.is_empty() {
        req.slurm_versions.clone()
    } else if let Some(d) = &req.slurm_default {
        vec![d.clone()]
    } else {
        vec![fallback]
    };
    if entries.len() == 1 && entries[0].is_empty() {
        return Err(Error::BadInput(format!(
            "no Slurm version: pass --slurm-version or set [defaults] slurm in {}",
            sources_file.display()
        )));
    }
    let several = entries.len() > 1;
    if several && slurm_source != "tarball" {
        return Err(Error::BadInput(format!(
            "Slurm source '{slurm_source}' installs one Slurm version, not {} ({}): \
             it is the distribution's {} of one version; use --slurm-source tarball for several",
            entries.len(),
            entries.join(", "),
            if slurm_source == "distro" {
                "packages"
            } else {
                "source package"
            },
        )));
    }
    let mut releases: Vec<SlurmRelease> = Vec::new();
    for entry in &entries {
        if entry.is_empty() {
            return Err(Error::BadInput(format!(
                "an empty Slurm version in slurm_versions ({})",
                entries.join(", ")
            )));
        }
        let (version, pin) = if slurm_source == "tarball" {
            let version = slurm_entry_version(entry, &sources.slurm);
            let pin =
                pinned("Slurm", &version, &sources.slurm, sources_file).map_err(|e| match e {
                    Error::BadInput(m) if several => {
                        Error::BadInput(format!("slurm_versions entry '{entry}': {m}"))
                    }
                    e => e,
                })?;
            (version, Some(pin))
        } else {
            (entry.clone(), None)
        };
        if several && !release_form(&version) {
            return Err(Error::BadInput(format!(
                "slurm_versions entry '{entry}': version '{version}' is not MAJOR.MINOR.MICRO \
                 (it names the prefix /opt/slurm-<version>)"
            )));
        }
        if let Some(first) = releases.iter().find(|r| r.version == version) {
            return Err(Error::BadInput(format!(
                "slurm_versions entries '{}' and '{entry}' are both Slurm {version}: list each version once",
                first.entry
            )));
        }
        releases.push(SlurmRelease {
            entry: entry.clone(),
            version,
            pin,
        });
    }
    let default = match &req.slurm_default {
        None => 0,
        Some(d) => {
            let version = if slurm_source == "tarball" {
                slurm_entry_version(d, &sources.slurm)
            } else {
                d.clone()
            };
            releases
                .iter()
                .position(|r| r.entry == *d || r.version == version)
                .ok_or_else(|| {
                    Error::BadInput(format!(
                        "default Slurm '{d}' is not in slurm_versions ({}): add it with --slurm-version {d} or name one of them",
                        releases
                            .iter()
                            .map(|r| r.version.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                })?
        }
    };
    Ok((releases, default))
}

fn valid_sha256(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn pinned(what: &str, version: &str, table: &BTreeMap<String, Pin>, file: &Path) -> Result<Pin> {
    let known = table.keys().cloned().collect::<Vec<_>>().join(", ");
    let pin = table.get(version).ok_or_else(|| {
        Error::BadInput(format!(
            "{what} {version} has no pinned source and sha256 in {} (pinned: {}); add [{}.\"{version}\"] with url and sha256",
            file.display(),
            if known.is_empty() { "none" } else { &known },
            what.to_lowercase().split(' ').next().unwrap_or(""),
        ))
    })?;
    if pin.sha256.is_empty() {
        return Err(Error::BadInput(format!(
            "{what} {version} has no sha256 in {} ({}): unverified downloads are refused; add its sha256",
            file.display(),
            pin.url
        )));
    }
    if !valid_sha256(&pin.sha256) {
        return Err(Error::BadInput(format!(
            "{what} {version} in {}: sha256 '{}' is not 64 lowercase hex digits",
            file.display(),
            pin.sha256
        )));
    }
    Ok(pin.clone())
}

fn version_at_least(version: &str, major: u64, minor: u64) -> bool {
    let mut parts = version
        .split(['.', '-'])
        .map(|p| p.parse::<u64>().unwrap_or(0));
    let (a, b) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (a, b) >= (major, minor)
}

/// The first NVIDIA driver branch that supports Blackwell and NVLink 5 (HGX B200, p6-b200).
pub const NVLINK5_FIRST_BRANCH: u32 = 570;

/// The file `60-nvidia.sh` writes so that `ib_umad` loads at boot (systemd's
/// modules-load.d(5)).
pub const NVLINK5_MODULES_LOAD: &str = "/etc/modules-load.d/nvidia-fabric.conf";

impl Recipe {
    /// What the image gets for NVIDIA's NVLink fabrics, in the plan's words (empty without a
    /// driver). The builder does not know which instance types an image is for; the driver
    /// branch says which GPUs it can drive, so every image whose branch supports NVLink 5
    /// ([`NVLINK5_FIRST_BRANCH`]) gets what p6-b200's Fabric Manager needs: NVLSM, and
    /// `ib_umad` (with Ubuntu's `linux-modules-extra`, where it ships) loaded at boot
    /// through [`NVLINK5_MODULES_LOAD`]. Fabric Manager starts NVLSM only on NVLink 5
    /// systems, and `ib_umad` is harmless elsewhere (`packer/scripts/60-nvidia.sh`).
    pub fn nvidia_fabric(&self) -> Vec<String> {
        if self.nvidia_driver.is_empty() {
            return Vec::new();
        }
        let mut out = vec![
            "Fabric Manager of the driver's version (started only where NVSwitches are)".into(),
        ];
        let branch: u32 = self
            .nvidia_driver
            .split('.')
            .next()
            .and_then(|b| b.parse().ok())
            .unwrap_or(0);
        if branch >= NVLINK5_FIRST_BRANCH {
            let extra = if self.family == "deb" {
                " and linux-modules-extra"
            } else {
                ""
            };
            out.push(format!(
                "NVLink 5 (p6-b200): NVLSM{extra} installed, ib_umad loaded at boot ({NVLINK5_MODULES_LOAD})"
            ));
        } else {
            out.push(format!(
                "NVLink 5 (p6-b200): not supported by driver branch {branch} (needs {NVLINK5_FIRST_BRANCH} or later)"
            ));
        }
        out
    }

    /// SchedMD's support of each listed Slurm release against `month` (`YYYY-MM`, today's):
    /// `(release, until, ended)` in release order.
    pub fn slurm_support_at(&self, month: &str) -> Vec<(String, String, bool)> {
        self.slurm_support
            .iter()
            .map(|(r, until)| (r.clone(), until.clone(), until.as_str() < month))
            .collect()
    }

    /// The end of SchedMD's support of the image's default Slurm, when that has passed by
    /// `month` (`YYYY-MM`) or the release is not listed: the plan's warning.
    pub fn slurm_support_warning(&self, month: &str) -> Option<String> {
        let release: String = self
            .slurm_version
            .split('.')
            .take(2)
            .collect::<Vec<_>>()
            .join(".");
        match self.slurm_support.get(&release) {
            Some(until) if until.as_str() < month => Some(format!(
                "Slurm {}: SchedMD's support of {release} ended {until}",
                self.slurm_version
            )),
            Some(_) => None,
            None if self.slurm_source == "distro" => None,
            None => Some(format!(
                "Slurm {}: {release} is not in [slurm_support] of packer/sources.toml: its support is unknown",
                self.slurm_version
            )),
        }
    }

    /// What package updates do on a running node of the image (`10-base.sh`): nothing by
    /// themselves; the image's next version replaces the node.
    pub fn node_updates(&self) -> &'static str {
        if self.family == "deb" {
            "none by themselves: no unattended upgrades or list updates (apt.conf.d/90slurm-node), apt waits on the dpkg lock (600 s), needrestart never restarts slurmd, sackd, munge or the agent; a new image replaces the node"
        } else {
            "none by themselves: dnf-automatic's timers masked where installed; a new image replaces the node"
        }
    }

    /// Resolve a request against the pins and the OS catalog.
    pub fn resolve(
        req: &Request,
        sources: &Sources,
        sources_file: &Path,
        catalog: &BTreeMap<String, OsEntry>,
    ) -> Result<Recipe> {
        let known_os = || catalog.keys().cloned().collect::<Vec<_>>().join(", ");
        let (os, family, arch, os_glibc) = if req.local {
            let os = req.os.clone().unwrap_or_else(|| LOCAL_OS.to_string());
            if os != LOCAL_OS {
                return Err(Error::BadInput(format!(
                    "unknown OS '{os}' for --target local: the local target builds {LOCAL_OS}"
                )));
            }
            let host = std::env::consts::ARCH;
            let arch = req
                .arch
                .clone()
                .unwrap_or_else(|| if host == "aarch64" { "arm64" } else { host }.to_string());
            let host_arch = if host == "aarch64" { "arm64" } else { host };
            if arch != host_arch {
                return Err(Error::BadInput(format!(
                    "unknown architecture '{arch}' for --target local: it builds for this host ({host_arch})"
                )));
            }
            (
                os,
                "deb".to_string(),
                arch,
                Some(LOCAL_OS_GLIBC.to_string()),
            )
        } else {
            let os = req.os.clone().unwrap_or_else(|| "al2023".to_string());
            let entry = catalog.get(&os).ok_or_else(|| {
                Error::BadInput(format!("unknown OS '{os}' (supported: {})", known_os()))
            })?;
            let arch = req.arch.clone().unwrap_or_else(|| "x86_64".to_string());
            if !entry.ami_name.contains_key(&arch) {
                return Err(Error::BadInput(format!(
                    "unknown architecture '{arch}' for {os} (supported: {})",
                    entry
                        .ami_name
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            (os, entry.family.clone(), arch, entry.glibc.clone())
        };

        let slurm_source = req
            .slurm_source
            .clone()
            .unwrap_or_else(|| if req.local { "distro" } else { "tarball" }.to_string());
        let fallback = if req.local || slurm_source == "debian-source" {
            DEBIAN_12_SLURM.to_string()
        } else {
            sources.defaults.slurm.clone()
        };
        match slurm_source.as_str() {
            "tarball" | "distro" => {}
            // Debian's own source package: apt verifies it against the signed Sources
            // index of the root's mirror, so there is no pin of ours.
            "debian-source" if family != "deb" => {
                return Err(Error::BadInput(format!(
                    "Slurm source 'debian-source' needs a Debian-family OS, not {os}: use tarball"
                )))
            }
            "debian-source" => {}
            other => {
                return Err(Error::BadInput(format!(
                    "unknown Slurm source '{other}' (supported: tarball, debian-source, distro)"
                )))
            }
        }
        let (slurm_versions, default) =
            resolve_slurm(req, &slurm_source, fallback, sources, sources_file)?;
        let slurm_version = slurm_versions[default].version.clone();
        let slurm = slurm_versions[default].pin.clone();

        // Which auth plugins the image can join with. Not asked: both (MUNGE installed,
        // Slurm with auth/munge and auth/slurm, the node's auth.type left to its join)
        // where every version has auth/slurm (23.11+), else munge.
        let no_auth_slurm = slurm_versions
            .iter()
            .find(|r| !version_at_least(&r.version, 23, 11));
        let auth = match (req.auth.as_deref(), no_auth_slurm) {
            (None, None) => AUTH_BOTH.to_string(),
            (None, Some(_)) => "munge".to_string(),
            (Some(a), _) => a.to_string(),
        };
        match auth.as_str() {
            "munge" => {}
            "slurm" | AUTH_BOTH => {
                if let Some(old) = no_auth_slurm {
                    let entry = if slurm_versions.len() > 1 {
                        format!(" (slurm_versions entry '{}')", old.entry)
                    } else {
                        String::new()
                    };
                    return Err(Error::BadInput(format!(
                        "auth '{auth}' needs Slurm 23.11 or later, not {}{entry}: use --auth munge",
                        old.version
                    )));
                }
            }
            other => {
                return Err(Error::BadInput(format!(
                    "unknown auth '{other}' (supported: munge, slurm, {AUTH_BOTH})"
                )))
            }
        }

        // MUNGE from source only where the OS has no package (Amazon Linux 2023).
        let munge_version = sources.defaults.munge.clone();
        let munge = if auth != "slurm" && os == "al2023" {
            if munge_version.is_empty() {
                return Err(Error::BadInput(format!(
                    "{os} has no munge package, so MUNGE is built from source: set [defaults] munge and pin it in {}",
                    sources_file.display()
                )));
            }
            Some(pinned(
                "MUNGE",
                &munge_version,
                &sources.munge,
                sources_file,
            )?)
        } else {
            sources.munge.get(&munge_version).cloned()
        };

        let efa_version = req
            .efa_version
            .clone()
            .unwrap_or_else(|| sources.defaults.efa.clone());
        let efa = if efa_version.is_empty() {
            None
        } else {
            Some(pinned(
                "EFA installer",
                &efa_version,
                &sources.efa,
                sources_file,
            )?)
        };

        let nvidia_driver = req.nvidia_driver.clone().unwrap_or_default();
        if !nvidia_driver.is_empty() && !driver_version_form(&nvidia_driver) {
            return Err(Error::BadInput(format!(
                "NVIDIA driver '{nvidia_driver}' is not a driver branch or version (e.g. 550 or 550.127.05)"
            )));
        }
        if req.dcgm && nvidia_driver.is_empty() {
            return Err(Error::BadInput(
                "--dcgm needs --nvidia-driver (DCGM runs on the NVIDIA driver)".into(),
            ));
        }

        Ok(Recipe {
            os,
            arch,
            family,
            slurm_version,
            slurm_source,
            slurm_support: sources.slurm_support.clone(),
            slurm,
            slurm_versions,
            auth,
            munge_version,
            munge,
            efa_version,
            efa,
            lustre: req.lustre.unwrap_or(true),
            nvidia_driver,
            dcgm: req.dcgm,
            cloudwatch_agent: req.cloudwatch_agent,
            agent_version: req
                .agent_version
                .clone()
                .unwrap_or_else(|| DEFAULT_AGENT_VERSION.to_string()),
            region: req
                .region
                .clone()
                .unwrap_or_else(|| "us-east-1".to_string()),
            ami_regions: req.ami_regions.clone(),
            sources_file: sources_file.to_path_buf(),
            os_glibc,
        })
    }

    /// The Packer variables of this recipe (names as in `packer/variables.pkr.hcl`).
    pub fn variables(&self) -> BTreeMap<String, Json> {
        let pin_url = |p: &Option<Pin>| p.as_ref().map(|p| p.url.clone()).unwrap_or_default();
        let pin_sha = |p: &Option<Pin>| p.as_ref().map(|p| p.sha256.clone()).unwrap_or_default();
        let mut v = BTreeMap::new();
        v.insert("os".into(), json!(self.os));
        v.insert("arch".into(), json!(self.arch));
        v.insert("region".into(), json!(self.region));
        v.insert("ami_regions".into(), json!(self.ami_regions));
        v.insert("slurm_version".into(), json!(self.slurm_version));
        v.insert("slurm_source".into(), json!(self.slurm_source));
        v.insert("slurm_url".into(), json!(pin_url(&self.slurm)));
        v.insert("slurm_sha256".into(), json!(pin_sha(&self.slurm)));
        v.insert(
            "slurm_versions".into(),
            Json::Array(
                self.slurm_versions
                    .iter()
                    .map(|r| {
                        json!({
                            "version": r.version,
                            "url": pin_url(&r.pin),
                            "sha256": pin_sha(&r.pin),
                        })
                    })
                    .collect(),
            ),
        );
        v.insert("auth".into(), json!(self.auth));
        v.insert("munge_version".into(), json!(self.munge_version));
        v.insert("munge_url".into(), json!(pin_url(&self.munge)));
        v.insert("munge_sha256".into(), json!(pin_sha(&self.munge)));
        v.insert("efa_installer_version".into(), json!(self.efa_version));
        v.insert("efa_installer_url".into(), json!(pin_url(&self.efa)));
        v.insert("efa_installer_sha256".into(), json!(pin_sha(&self.efa)));
        v.insert("lustre_client".into(), json!(self.lustre));
        v.insert("nvidia_driver_version".into(), json!(self.nvidia_driver));
        v.insert("nvidia_dcgm".into(), json!(self.dcgm));
        v.insert("cloudwatch_agent".into(), json!(self.cloudwatch_agent));
        v.insert("agent_version".into(), json!(self.agent_version));
        v
    }

    /// The environment of the provisioning steps (the contract in `packer/scripts/lib.sh`),
    /// as the template's `local.step_env` builds it.
    pub fn step_env(&self, staging: &str, allow_skips: bool) -> Vec<(String, String)> {
        let pin_url = |p: &Option<Pin>| p.as_ref().map(|p| p.url.clone()).unwrap_or_default();
        let pin_sha = |p: &Option<Pin>| p.as_ref().map(|p| p.sha256.clone()).unwrap_or_default();
        [
            ("IMAGE_STAGING", staging.to_string()),
            ("IMAGE_OS", self.os.clone()),
            ("IMAGE_ARCH", self.arch.clone()),
            ("SLURM_VERSION", self.slurm_version.clone()),
            ("SLURM_SOURCE", self.slurm_source.clone()),
            ("SLURM_URL", pin_url(&self.slurm)),
            ("SLURM_SHA256", pin_sha(&self.slurm)),
            ("SLURM_AUTH", self.auth.clone()),
            ("MUNGE_VERSION", self.munge_version.clone()),
            ("MUNGE_URL", pin_url(&self.munge)),
            ("MUNGE_SHA256", pin_sha(&self.munge)),
            ("EFA_INSTALLER_VERSION", self.efa_version.clone()),
            ("EFA_INSTALLER_URL", pin_url(&self.efa)),
            ("EFA_INSTALLER_SHA256", pin_sha(&self.efa)),
            ("LUSTRE_CLIENT", self.lustre.to_string()),
            ("NVIDIA_DRIVER_VERSION", self.nvidia_driver.clone()),
            ("NVIDIA_DCGM", self.dcgm.to_string()),
            ("CLOUDWATCH_AGENT", self.cloudwatch_agent.to_string()),
            ("IMAGE_REGION", self.region.clone()),
            ("AGENT_VERSION", self.agent_version.clone()),
            ("ALLOW_SKIPS", allow_skips.to_string()),
            ("SLURM_VERSIONS", self.slurm_versions_words()),
            ("SLURM_DEFAULT", self.slurm_version.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .chain(self.slurm_versions.iter().flat_map(|r| {
            let suffix = r
                .version
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect::<String>();
            [
                (format!("SLURM_URL_{suffix}"), pin_url(&r.pin)),
                (format!("SLURM_SHA256_{suffix}"), pin_sha(&r.pin)),
            ]
        }))
        .collect()
    }

    /// The versions of the image, space-separated (`SLURM_VERSIONS`).
    pub fn slurm_versions_words(&self) -> String {
        self.slurm_versions
            .iter()
            .map(|r| r.version.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Every pinned download of this recipe: (name, pin).
    pub fn downloads(&self) -> Vec<(String, Pin)> {
        let mut out = Vec::new();
        for r in &self.slurm_versions {
            if let Some(p) = &r.pin {
                out.push((format!("Slurm {} source", r.version), p.clone()));
            }
        }
        if self.auth != "slurm" && self.os == "al2023" {
            if let Some(p) = &self.munge {
                out.push((format!("MUNGE {} source", self.munge_version), p.clone()));
            }
        }
        if let Some(p) = &self.efa {
            out.push((format!("EFA installer {}", self.efa_version), p.clone()));
        }
        out
    }
}

/// Whether `s` is an AWS Region code such as `us-east-1`, `us-gov-west-1`, `cn-north-1`,
/// `us-isob-east-1`: a two-letter area, one or more lowercase words, a number (AWS General
/// Reference, "Regions and Zones").
pub fn region_form(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() >= 3
        && parts[0].len() == 2
        && parts[0].bytes().all(|b| b.is_ascii_lowercase())
        && parts[1..parts.len() - 1]
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase()))
        && parts
            .last()
            .is_some_and(|n| (1..=2).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether `s` is an NVIDIA driver branch or version: `550`, `550.127`, `550.127.05`.
pub fn driver_version_form(s: &str) -> bool {
    let parts: Vec<&str> = s.split('.').collect();
    parts.len() <= 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.len() <= 4 && p.bytes().all(|b| b.is_ascii_digit()))
}

/// Check the final Packer variables (after `--var` overrides) for the values the recipe
/// checks: `os` and `arch` against the template's OS catalog (not for the local target,
/// which builds Debian 12 for the host), `region` and `ami_regions` as Region codes,
/// `nvidia_driver_version` and `efa_installer_version` as versions. Errors name the
/// variable (exit 2).
pub fn check_values(
    vars: &BTreeMap<String, Json>,
    catalog: &BTreeMap<String, OsEntry>,
    local: bool,
) -> Result<()> {
    let text = |name: &str| vars.get(name).and_then(Json::as_str).unwrap_or("");
    if !local {
        let os = text("os");
        let entry = catalog.get(os).ok_or_else(|| {
            Error::BadInput(format!(
                "variable 'os': unknown OS '{os}' (supported: {})",
                catalog.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })?;
        let arch = text("arch");
        if !entry.ami_name.contains_key(arch) {
            return Err(Error::BadInput(format!(
                "variable 'arch': unknown architecture '{arch}' for {os} (supported: {})",
                entry
                    .ami_name
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    let region = text("region");
    if !region_form(region) {
        return Err(Error::BadInput(format!(
            "variable 'region': '{region}' is not an AWS Region code (e.g. us-east-1)"
        )));
    }
    if let Some(list) = vars.get("ami_regions").and_then(Json::as_array) {
        for r in list {
            let r = r.as_str().unwrap_or("");
            if !region_form(r) {
                return Err(Error::BadInput(format!(
                    "variable 'ami_regions': '{r}' is not an AWS Region code (e.g. eu-west-1)"
                )));
            }
        }
    }
    let driver = text("nvidia_driver_version");
    if !driver.is_empty() && !driver_version_form(driver) {
        return Err(Error::BadInput(format!(
            "variable 'nvidia_driver_version': '{driver}' is not a driver branch or version (e.g. 550 or 550.127.05)"
        )));
    }
    let efa = text("efa_installer_version");
    if !efa.is_empty() && !driver_version_form(efa) {
        return Err(Error::BadInput(format!(
            "variable 'efa_installer_version': '{efa}' is not a version (e.g. 1.41.0)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::{OsEntry, Pin, Recipe, Request, Sources};
    use crate::error::Error;
    use std::collections::BTreeMap;
    use std::path::Path;

    fn pin(v: &str, n: u8) -> Pin {
        Pin {
            url: format!("https://example.invalid/slurm-{v}.tar.gz"),
            sha256: format!("{n:x}").repeat(64),
        }
    }

    /// Pins of 23.02.7, 24.11.7, 25.11.5, 25.11.6 and 26.05.3; default 24.11.7.
    fn sources() -> Sources {
        let mut s = Sources::default();
        for (i, v) in ["23.02.7", "24.11.7", "25.11.5", "25.11.6", "26.05.3"]
            .iter()
            .enumerate()
        {
            s.slurm.insert(v.to_string(), pin(v, i as u8 + 1));
        }
        s.defaults.slurm = "24.11.7".into();
        s
    }

    fn catalog() -> BTreeMap<String, OsEntry> {
        let mut c = BTreeMap::new();
        c.insert(
            "ubuntu-24.04".to_string(),
            OsEntry {
                family: "deb".into(),
                owner: "099720109477".into(),
                ami_name: [("x86_64".to_string(), "ubuntu-*".to_string())].into(),
                glibc: Some("2.39".into()),
            },
        );
        c
    }

    fn request(versions: &[&str], default: Option<&str>) -> Request {
        Request {
            os: Some("ubuntu-24.04".into()),
            slurm_versions: versions.iter().map(|v| v.to_string()).collect(),
            slurm_default: default.map(String::from),
            efa_version: Some(String::new()),
            ..Request::default()
        }
    }

    fn resolve(req: &Request) -> Result<Recipe, String> {
        Recipe::resolve(req, &sources(), Path::new("sources.toml"), &catalog()).map_err(|e| match e
        {
            Error::BadInput(m) => m,
            other => panic!("not a bad-input error: {other}"),
        })
    }

    #[test]
    fn a_list_of_versions_resolves_each_to_its_pin_and_the_first_is_the_default() {
        let r = resolve(&request(&["25.11", "26.05.3"], None)).unwrap();
        let got: Vec<(&str, &str)> = r
            .slurm_versions
            .iter()
            .map(|v| (v.entry.as_str(), v.version.as_str()))
            .collect();
        // A release series resolves to its newest pinned version.
        assert_eq!(got, [("25.11", "25.11.6"), ("26.05.3", "26.05.3")]);
        assert_eq!(r.slurm_version, "25.11.6");
        assert_eq!(r.slurm, Some(pin("25.11.6", 4)));
        assert_eq!(r.slurm_versions[1].pin, Some(pin("26.05.3", 5)));
        let vars = r.variables();
        assert_eq!(vars["slurm_version"], "25.11.6");
        assert_eq!(vars["slurm_sha256"], pin("25.11.6", 4).sha256);
        assert_eq!(vars["slurm_versions"][1]["version"], "26.05.3");
        assert_eq!(vars["slurm_versions"][1]["url"], pin("26.05.3", 5).url);
        assert_eq!(
            vars["slurm_versions"][1]["sha256"],
            pin("26.05.3", 5).sha256
        );
        let env: BTreeMap<String, String> = r.step_env("/s", false).into_iter().collect();
        assert_eq!(env["SLURM_VERSIONS"], "25.11.6 26.05.3");
        assert_eq!(env["SLURM_DEFAULT"], "25.11.6");
        assert_eq!(env["SLURM_VERSION"], "25.11.6");
        assert_eq!(env["SLURM_URL_26_05_3"], pin("26.05.3", 5).url);
        assert_eq!(env["SLURM_SHA256_25_11_6"], pin("25.11.6", 4).sha256);
        let names: Vec<String> = r.downloads().into_iter().map(|(n, _)| n).collect();
        assert!(
            names.contains(&"Slurm 25.11.6 source".to_string()),
            "{names:?}"
        );
        assert!(
            names.contains(&"Slurm 26.05.3 source".to_string()),
            "{names:?}"
        );
    }

    #[test]
    fn the_default_is_named_by_its_entry_or_its_series() {
        for d in ["26.05", "26.05.3"] {
            let r = resolve(&request(&["25.11.6", "26.05.3"], Some(d))).unwrap();
            assert_eq!(r.slurm_version, "26.05.3", "{d}");
            assert_eq!(r.slurm, Some(pin("26.05.3", 5)), "{d}");
        }
        // Alone, --slurm-default is the one version.
        let r = resolve(&request(&[], Some("25.11"))).unwrap();
        assert_eq!(r.slurm_version, "25.11.6");
        assert_eq!(r.slurm_versions.len(), 1);
    }

    #[test]
    fn the_os_glibc_comes_from_the_catalog_or_the_local_target() {
        let r = resolve(&request(&[], None)).unwrap();
        assert_eq!(r.os_glibc.as_deref(), Some("2.39"));
        let local = Request {
            os: None,
            local: true,
            ..request(&[], None)
        };
        let r = resolve(&local).unwrap();
        assert_eq!(r.os_glibc.as_deref(), Some(super::LOCAL_OS_GLIBC));
    }

    #[test]
    fn nvlink5_prerequisites_start_at_branch_570() {
        let fabric = |driver: &str| {
            resolve(&Request {
                nvidia_driver: Some(driver.into()),
                ..request(&[], None)
            })
            .unwrap()
            .nvidia_fabric()
        };
        assert!(fabric("570")[1].contains("NVLSM and linux-modules-extra installed"));
        assert!(fabric("570.86.15")[1].contains(super::NVLINK5_MODULES_LOAD));
        assert_eq!(
            fabric("565.57.01")[1],
            "NVLink 5 (p6-b200): not supported by driver branch 565 (needs 570 or later)"
        );
    }

    #[test]
    fn a_single_version_resolves_as_before() {
        let r = resolve(&request(&[], None)).unwrap();
        assert_eq!(r.slurm_version, "24.11.7");
        assert_eq!(r.slurm_versions.len(), 1);
        let r = resolve(&request(&["25.11.5"], None)).unwrap();
        assert_eq!(r.slurm_version, "25.11.5");
        assert_eq!(r.slurm, Some(pin("25.11.5", 3)));
        let e = resolve(&request(&["25.05.9"], None)).unwrap_err();
        assert!(e.starts_with("Slurm 25.05.9 has no pinned source"), "{e}");
    }

    #[test]
    fn an_entry_without_a_pin_is_refused_naming_it_and_the_pinned_versions() {
        for entry in ["25.05", "25.05.1"] {
            let e = resolve(&request(&["25.11.6", entry], None)).unwrap_err();
            assert!(
                e.contains(&format!("slurm_versions entry '{entry}'"))
                    && e.contains("has no pinned source")
                    && e.contains("23.02.7, 24.11.7, 25.11.5, 25.11.6, 26.05.3")
                    && e.contains("sources.toml"),
                "{e}"
            );
        }
        let e = resolve(&request(&["25.11.6", ""], None)).unwrap_err();
        assert!(e.contains("an empty Slurm version"), "{e}");
    }

    #[test]
    fn two_entries_of_one_version_are_refused_naming_both() {
        let e = resolve(&request(&["25.11", "26.05.3", "25.11.6"], None)).unwrap_err();
        assert!(
            e.contains("entries '25.11' and '25.11.6' are both Slurm 25.11.6"),
            "{e}"
        );
        let e = resolve(&request(&["26.05.3", "26.05.3"], None)).unwrap_err();
        assert!(
            e.contains("entries '26.05.3' and '26.05.3' are both Slurm 26.05.3"),
            "{e}"
        );
    }

    #[test]
    fn a_default_not_in_the_list_is_refused_naming_the_list() {
        let e = resolve(&request(&["25.11.6", "26.05.3"], Some("24.11"))).unwrap_err();
        assert!(
            e.contains("default Slurm '24.11' is not in slurm_versions (25.11.6, 26.05.3)"),
            "{e}"
        );
    }

    #[test]
    fn several_versions_need_the_tarball_source() {
        for source in ["distro", "debian-source"] {
            let mut req = request(&["22.05.8", "24.11.7"], None);
            req.slurm_source = Some(source.into());
            let e = resolve(&req).unwrap_err();
            assert!(
                e.contains(&format!(
                    "Slurm source '{source}' installs one Slurm version, not 2 (22.05.8, 24.11.7)"
                )) && e.contains("--slurm-source tarball"),
                "{e}"
            );
        }
    }

    #[test]
    fn auth_slurm_refuses_any_version_before_23_11_naming_the_entry() {
        let mut req = request(&["25.11", "23.02"], None);
        req.auth = Some("slurm".into());
        let e = resolve(&req).unwrap_err();
        assert!(
            e.contains("auth 'slurm' needs Slurm 23.11 or later, not 23.02.7 (slurm_versions entry '23.02')"),
            "{e}"
        );
        let mut req = request(&["25.11", "26.05"], None);
        req.auth = Some("slurm".into());
        assert!(resolve(&req).is_ok());
    }

    /// Not asked, an image joins with either plugin where every version has auth/slurm, and
    /// with munge where one has not; asked, the choice is kept and checked.
    #[test]
    fn auth_defaults_to_both_plugins_where_slurm_has_auth_slurm() {
        let r = resolve(&request(&["25.11", "26.05"], None)).unwrap();
        assert_eq!(r.auth, super::AUTH_BOTH);
        let env = r.step_env("/tmp/slurm-image", false);
        assert_eq!(
            env.iter().find(|(k, _)| k == "SLURM_AUTH").unwrap().1,
            "munge+slurm"
        );
        let r = resolve(&request(&["25.11", "23.02"], None)).unwrap();
        assert_eq!(r.auth, "munge");
        for asked in ["munge", "slurm", "munge+slurm"] {
            let mut req = request(&["25.11"], None);
            req.auth = Some(asked.into());
            assert_eq!(resolve(&req).unwrap().auth, asked);
        }
        let mut req = request(&["23.02"], None);
        req.auth = Some("munge+slurm".into());
        let e = resolve(&req).unwrap_err();
        assert!(
            e.contains(
                "auth 'munge+slurm' needs Slurm 23.11 or later, not 23.02.7: use --auth munge"
            ),
            "{e}"
        );
        let mut req = request(&["25.11"], None);
        req.auth = Some("jwt".into());
        let e = resolve(&req).unwrap_err();
        assert!(
            e.contains("unknown auth 'jwt' (supported: munge, slurm, munge+slurm)"),
            "{e}"
        );
    }

    #[test]
    fn slurm_versions_compare() {
        assert!(super::version_at_least("23.11.4", 23, 11));
        assert!(super::version_at_least("24.05.1", 23, 11));
        assert!(!super::version_at_least("22.05.8", 23, 11));
    }

    #[test]
    fn region_and_driver_forms() {
        for ok in [
            "us-east-1",
            "us-gov-west-1",
            "cn-north-1",
            "us-isob-east-1",
            "eu-central-2",
        ] {
            assert!(super::region_form(ok), "{ok}");
        }
        for bad in [
            "",
            "us-east",
            "US-EAST-1",
            "useast1",
            "us-east-1a",
            "us-east-123",
            "x-y-1",
        ] {
            assert!(!super::region_form(bad), "{bad}");
        }
        for ok in ["550", "550.127", "550.127.05"] {
            assert!(super::driver_version_form(ok), "{ok}");
        }
        for bad in ["", "latest", "550.", "5.5.0.1", "550;rm"] {
            assert!(!super::driver_version_form(bad), "{bad}");
        }
    }
}
