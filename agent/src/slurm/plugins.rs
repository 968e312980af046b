//! Which authentication plugins the node's Slurm was built with: the `auth_<name>.so` files
//! of its plugin folder (`PluginDir`, slurm.conf(5): by default `<libdir>/slurm`, where
//! `make install` puts every plugin).
//!
//! A configless node has no slurm.conf to read `PluginDir` from before slurmd fetches it,
//! so the folder is found beside slurmd: `<prefix>/lib/slurm` or `<prefix>/lib64/slurm`
//! (SchedMD's tarball and the RPM packages), `<prefix>/lib/<multiarch>/slurm-wlm` (Debian
//! and Ubuntu's packages), `<prefix>` being the folder above `slurm.bin_dir`. The plugins a
//! build has depend on its configure: auth/munge needs MUNGE's library (absent with
//! `--without-munge`, as the managed service builds Slurm), auth/slurm needs Slurm 23.11
//! or later and libjwt (`src/plugins/auth/Makefile.am`: `if WITH_JWT ... slurm`).

use std::path::{Path, PathBuf};

/// The plugin folder of the Slurm whose client commands are in `bin_dir`: the first of the
/// usual folders (see the module docs) that holds an `auth_*.so`. `None` when none does (a
/// layout the agent does not know): the caller then checks nothing.
pub fn plugin_dir(bin_dir: &Path) -> Option<PathBuf> {
    let prefix = bin_dir.parent()?;
    let mut candidates = vec![prefix.join("lib/slurm"), prefix.join("lib64/slurm")];
    if let Ok(rd) = std::fs::read_dir(prefix.join("lib")) {
        let mut multiarch: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().contains("-linux-"))
            })
            .flat_map(|p| [p.join("slurm-wlm"), p.join("slurm")])
            .collect();
        multiarch.sort();
        candidates.extend(multiarch);
    }
    candidates.into_iter().find(|d| has_auth_plugins(d))
}

/// Whether `dir` holds Slurm's authentication plugin `name` (`munge`, `slurm`):
/// `auth_<name>.so`.
pub fn has_auth_plugin(dir: &Path, name: &str) -> bool {
    dir.join(format!("auth_{name}.so")).is_file()
}

fn has_auth_plugins(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|rd| {
        rd.flatten().any(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.starts_with("auth_") && n.ends_with(".so")
        })
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn touch(p: &Path) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b"").unwrap();
    }

    #[test]
    fn the_tarball_layout_beside_bin_dir() {
        let d = tempfile::tempdir().unwrap();
        let prefix = d.path().join("opt/slurm");
        touch(&prefix.join("bin/scontrol"));
        touch(&prefix.join("lib/slurm/auth_munge.so"));
        touch(&prefix.join("lib/slurm/auth_slurm.so"));
        let dir = plugin_dir(&prefix.join("bin")).unwrap();
        assert_eq!(dir, prefix.join("lib/slurm"));
        assert!(has_auth_plugin(&dir, "munge"));
        assert!(has_auth_plugin(&dir, "slurm"));
    }

    #[test]
    fn debians_multiarch_folder_and_a_build_without_munge() {
        let d = tempfile::tempdir().unwrap();
        let usr = d.path().join("usr");
        std::fs::create_dir_all(usr.join("bin")).unwrap();
        // A folder named slurm without plugins (e.g. Python's) is not the plugin folder.
        touch(&usr.join("lib/slurm/README"));
        touch(&usr.join("lib/x86_64-linux-gnu/slurm-wlm/auth_slurm.so"));
        touch(&usr.join("lib/x86_64-linux-gnu/slurm-wlm/auth_none.so"));
        let dir = plugin_dir(&usr.join("bin")).unwrap();
        assert_eq!(dir, usr.join("lib/x86_64-linux-gnu/slurm-wlm"));
        assert!(has_auth_plugin(&dir, "slurm"));
        assert!(!has_auth_plugin(&dir, "munge"));
    }

    #[test]
    fn an_unknown_layout_gives_none() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("bin")).unwrap();
        touch(&d.path().join("lib/slurm/mpi_pmix.so"));
        assert_eq!(plugin_dir(&d.path().join("bin")), None);
        assert_eq!(plugin_dir(Path::new("/")), None);
    }
}
