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
/// Slurm version of Debian 12's packages (slurm-wlm 22.05.8), the default locally.
pub const DEBIAN_12_SLURM: &str = "22.05.8";

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
    /// Slurm version.
    pub slurm_version: Option<String>,
    /// `tarball`, `debian-source` or `distro`.
    pub slurm_source: Option<String>,
    /// `munge` or `slurm`.
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

/// A fully resolved recipe.
#[derive(Debug, Clone, Serialize)]
pub struct Recipe {
    /// Base OS.
    pub os: String,
    /// Architecture.
    pub arch: String,
    /// Package family of the OS.
    pub family: String,
    /// Slurm version.
    pub slurm_version: String,
    /// `tarball`, `debian-source` or `distro`.
    pub slurm_source: String,
    /// Slurm tarball pin (tarball builds).
    pub slurm: Option<Pin>,
    /// `munge` or `slurm`.
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

impl Recipe {
    /// Resolve a request against the pins and the OS catalog.
    pub fn resolve(
        req: &Request,
        sources: &Sources,
        sources_file: &Path,
        catalog: &BTreeMap<String, OsEntry>,
    ) -> Result<Recipe> {
        let known_os = || catalog.keys().cloned().collect::<Vec<_>>().join(", ");
        let (os, family, arch) = if req.local {
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
            (os, "deb".to_string(), arch)
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
            (os, entry.family.clone(), arch)
        };

        let slurm_source = req
            .slurm_source
            .clone()
            .unwrap_or_else(|| if req.local { "distro" } else { "tarball" }.to_string());
        let slurm_version = req.slurm_version.clone().unwrap_or_else(|| {
            if req.local || slurm_source == "debian-source" {
                DEBIAN_12_SLURM.to_string()
            } else {
                sources.defaults.slurm.clone()
            }
        });
        if slurm_version.is_empty() {
            return Err(Error::BadInput(format!(
                "no Slurm version: pass --slurm-version or set [defaults] slurm in {}",
                sources_file.display()
            )));
        }
        let slurm = match slurm_source.as_str() {
            "tarball" => Some(pinned(
                "Slurm",
                &slurm_version,
                &sources.slurm,
                sources_file,
            )?),
            "distro" => None,
            // Debian's own source package: apt verifies it against the signed Sources
            // index of the root's mirror, so there is no pin of ours.
            "debian-source" if family != "deb" => {
                return Err(Error::BadInput(format!(
                    "Slurm source 'debian-source' needs a Debian-family OS, not {os}: use tarball"
                )))
            }
            "debian-source" => None,
            other => {
                return Err(Error::BadInput(format!(
                    "unknown Slurm source '{other}' (supported: tarball, debian-source, distro)"
                )))
            }
        };

        let auth = req.auth.clone().unwrap_or_else(|| "munge".to_string());
        match auth.as_str() {
            "munge" => {}
            "slurm" if version_at_least(&slurm_version, 23, 11) => {}
            "slurm" => {
                return Err(Error::BadInput(format!(
                    "auth 'slurm' needs Slurm 23.11 or later, not {slurm_version}: use --auth munge"
                )))
            }
            other => {
                return Err(Error::BadInput(format!(
                    "unknown auth '{other}' (supported: munge, slurm)"
                )))
            }
        }

        // MUNGE from source only where the OS has no package (Amazon Linux 2023).
        let munge_version = sources.defaults.munge.clone();
        let munge = if auth == "munge" && os == "al2023" {
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
            slurm,
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
                .unwrap_or_else(|| "0.0.0-dev".to_string()),
            region: req
                .region
                .clone()
                .unwrap_or_else(|| "us-east-1".to_string()),
            ami_regions: req.ami_regions.clone(),
            sources_file: sources_file.to_path_buf(),
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
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Every pinned download of this recipe: (name, pin).
    pub fn downloads(&self) -> Vec<(String, Pin)> {
        let mut out = Vec::new();
        if let Some(p) = &self.slurm {
            out.push((format!("Slurm {} source", self.slurm_version), p.clone()));
        }
        if self.auth == "munge" && self.os == "al2023" {
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
            "variable 'efa_installer_version': '{efa}' is not a version (e.g. 1.32.0)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
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
