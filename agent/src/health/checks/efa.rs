//! Elastic Fabric Adapter devices: `/sys/class/infiniband/<dev>` whose `device/driver`
//! link points at the `efa` driver, on instance types that have EFA; and the EFA devices the
//! kernel sees on PCI (the EFA interfaces the instance was launched with, whether or not a
//! driver took them).

use std::fs;

use super::{Checked, Failed};
use crate::health::facts::Facts;

/// How many EFA devices are expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EfaCount {
    /// From the instance type (DMI product name) when known, otherwise at least one; and
    /// never fewer than the EFA devices the kernel sees on PCI.
    Auto,
    /// At least this many.
    AtLeast(u32),
}

/// EFA expectations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EfaSpec {
    /// Expected devices.
    pub count: EfaCount,
}

/// EFA interfaces of EC2 instance types, from the EC2 documentation ("Supported instance
/// types" of EFA); unknown types expect at least one.
pub fn expected_efa(instance_type: &str) -> Option<u32> {
    Some(match instance_type {
        "p5.48xlarge" => 32,
        "p4d.24xlarge" | "p4de.24xlarge" => 4,
        "c5n.18xlarge" | "c5n.metal" | "hpc6a.48xlarge" | "hpc6id.32xlarge" | "hpc7g.16xlarge"
        | "c6i.32xlarge" | "c6in.32xlarge" | "c7i.48xlarge" | "g5.48xlarge" | "m6i.32xlarge" => 1,
        "hpc7a.96xlarge" => 2,
        "t3.micro" | "t3.small" | "t3.medium" | "c5.large" | "c5.xlarge" | "m5.large"
        | "m5.xlarge" | "g5.xlarge" => 0,
        _ => return None,
    })
}

/// Amazon's PCI vendor id (`/sys/bus/pci/devices/*/vendor`).
pub const PCI_VENDOR_AMAZON: &str = "0x1d0f";

/// The EFA devices the kernel sees on PCI, whatever driver took them (or none): functions
/// of vendor [`PCI_VENDOR_AMAZON`] whose device id is `0xefa0` to `0xefaf` (Linux's
/// `drivers/infiniband/hw/efa`: `0xefa0`, `0xefa1`, `0xefa2`, `0xefa3`), by PCI address,
/// sorted. Empty when the folder cannot be read. These are the EFA interfaces the instance
/// was launched with: an instance type that supports EFA but was launched without it has
/// none.
pub fn pci_efa_devices(sys_dir: &std::path::Path) -> Vec<String> {
    let Ok(rd) = fs::read_dir(sys_dir.join("bus/pci/devices")) else {
        return Vec::new();
    };
    let read = |p: std::path::PathBuf| fs::read_to_string(p).unwrap_or_default();
    let mut out: Vec<String> = rd
        .flatten()
        .filter(|e| {
            let vendor = read(e.path().join("vendor"));
            let device = read(e.path().join("device"));
            let device = device.trim().to_ascii_lowercase();
            vendor.trim().eq_ignore_ascii_case(PCI_VENDOR_AMAZON)
                && device.len() == 6
                && device.starts_with("0xefa")
                && device[5..].chars().all(|c| c.is_ascii_hexdigit())
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

/// EFA device names under `<sys>/class/infiniband`.
pub fn efa_devices(facts: &Facts) -> Vec<String> {
    let root = facts.host.sys_dir.join("class/infiniband");
    let mut out: Vec<String> = fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            fs::read_link(e.path().join("device/driver"))
                .ok()
                .and_then(|t| t.file_name().map(|n| n == "efa"))
                .unwrap_or(false)
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

/// Runs an EFA check.
///
/// # Errors
/// [`Failed`]: what is wrong, in NHC's words.
pub fn check_efa(spec: &EfaSpec, facts: &Facts) -> Result<String, Failed> {
    let failed = |m: String| Failed::new(Checked::Efa, m);
    let found = efa_devices(facts);
    let (want, why) = match spec.count {
        EfaCount::AtLeast(n) => (n, String::new()),
        EfaCount::Auto => {
            let (n, why) = match super::hw::detect_instance_type(facts) {
                Some(t) => match expected_efa(&t) {
                    Some(n) => (n, format!(" for {t}")),
                    None => (1, format!(" ({t} not in the EFA table)")),
                },
                None => (1, String::new()),
            };
            // Every EFA interface the instance has on PCI must have its device.
            let on_pci = u32::try_from(pci_efa_devices(&facts.host.sys_dir).len()).unwrap_or(0);
            if on_pci > n {
                (on_pci, format!(" (the kernel sees {on_pci} on PCI)"))
            } else {
                (n, why)
            }
        }
    };
    if (found.len() as u32) < want {
        return Err(failed(format!(
            "{} EFA devices found{}, expected at least {want}{why}",
            found.len(),
            if found.is_empty() {
                String::new()
            } else {
                format!(" ({})", found.join(", "))
            }
        )));
    }
    Ok(format!("{} EFA devices: {}", found.len(), found.join(", ")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::health::facts::Host;

    #[test]
    fn counts_devices_bound_to_the_efa_driver() {
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path().join("sys");
        let drivers = sys.join("bus/pci/drivers");
        fs::create_dir_all(drivers.join("efa")).unwrap();
        fs::create_dir_all(drivers.join("mlx5_core")).unwrap();
        for (dev, drv) in [
            ("rdmap0s6", "efa"),
            ("rdmap0s7", "efa"),
            ("mlx5_0", "mlx5_core"),
        ] {
            let d = sys.join("class/infiniband").join(dev).join("device");
            fs::create_dir_all(&d).unwrap();
            std::os::unix::fs::symlink(drivers.join(drv), d.join("driver")).unwrap();
        }
        fs::create_dir_all(sys.join("devices/virtual/dmi/id")).unwrap();
        fs::write(
            sys.join("devices/virtual/dmi/id/product_name"),
            "p4d.24xlarge\n",
        )
        .unwrap();
        let f = Facts::new(Host {
            sys_dir: sys.clone(),
            ..Host::default()
        });
        // The error of `count = "auto"` on `f`.
        let auto_error = |f: &Facts| {
            check_efa(
                &EfaSpec {
                    count: EfaCount::Auto,
                },
                f,
            )
            .unwrap_err()
            .to_string()
        };
        assert_eq!(efa_devices(&f), vec!["rdmap0s6", "rdmap0s7"]);
        check_efa(
            &EfaSpec {
                count: EfaCount::AtLeast(2),
            },
            &f,
        )
        .unwrap();
        let e = auto_error(&f);
        assert!(e.contains("expected at least 4 for p4d.24xlarge"), "{e}");
        // Three EFA functions on PCI (one an ENA, not counted): two bound, so `auto`
        // wants three whatever the table says of an unknown type.
        fs::write(
            sys.join("devices/virtual/dmi/id/product_name"),
            "p9x.48xlarge\n",
        )
        .unwrap();
        for (addr, device) in [
            ("0000:10:1c.0", "0xefa1"),
            ("0000:10:1d.0", "0xefa1"),
            ("0000:10:1e.0", "0xEFA2"),
            ("0000:10:1f.0", "0xec20"),
        ] {
            let d = sys.join("bus/pci/devices").join(addr);
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("vendor"), "0x1d0f\n").unwrap();
            fs::write(d.join("device"), format!("{device}\n")).unwrap();
        }
        assert_eq!(
            pci_efa_devices(&f.host.sys_dir),
            vec!["0000:10:1c.0", "0000:10:1d.0", "0000:10:1e.0"]
        );
        let f = Facts::new(f.host.clone());
        let e = auto_error(&f);
        assert!(
            e.contains("2 EFA devices found (rdmap0s6, rdmap0s7), expected at least 3 (the kernel sees 3 on PCI)"),
            "{e}"
        );
    }
}
