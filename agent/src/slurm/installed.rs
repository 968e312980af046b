//! Several Slurm releases in one image (issue 23 §2): which are installed, and which one
//! `/opt/slurm` points at.
//!
//! The image builder's layout with two or more `slurm_versions`: each release's whole
//! installation in `/opt/slurm-<MAJOR.MINOR.MICRO>`, built for `/opt/slurm` (its
//! programs' RUNPATH and PluginDir are `/opt/slurm/lib/slurm`), with the marker
//! `.slurm-build` (`version=<release>`) written last, and `/opt/slurm` a relative symlink
//! to one of them. A release's programs therefore run only while `/opt/slurm` points at
//! it, so the units, `slurm.bin_dir` and PATH keep naming `/opt/slurm`: bootstrap points
//! it at the release the controller accepts before slurmd starts ([`point_at`]). A prefix
//! without its marker is half-installed and is not a candidate. With a single release
//! `/opt/slurm` is a directory and nothing here applies.

use std::path::{Path, PathBuf};

use super::SlurmVersion;

/// The marker the image builder writes last in a whole installation (`version=25.11.6`).
pub const MARKER: &str = ".slurm-build";

/// The releases installed beside a symlinked prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// The symlink the units and `slurm.bin_dir` name (`/opt/slurm`).
    pub link: PathBuf,
    /// Each whole installation: its release and prefix, newest first.
    pub releases: Vec<(SlurmVersion, PathBuf)>,
    /// The release the link points at now, when it is one of them.
    pub current: Option<SlurmVersion>,
}

/// Errors of [`point_at`].
#[derive(Debug, thiserror::Error)]
pub enum SwitchError {
    /// The new link could not be made or put in place.
    #[error("pointing {link} at {target}: {source}")]
    Link {
        /// The prefix link (`/opt/slurm`).
        link: PathBuf,
        /// Its new target.
        target: PathBuf,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
}

/// The releases installed beside `bin_dir`'s prefix (`slurm.bin_dir` = `/opt/slurm/bin`:
/// `/opt/slurm-*` beside `/opt/slurm`), when that prefix is a symlink and at least two
/// whole installations are there; `None` otherwise (one release: nothing to choose).
pub fn installed(bin_dir: &Path) -> Option<Installed> {
    let link = bin_dir.parent()?.to_path_buf();
    if !std::fs::symlink_metadata(&link)
        .ok()?
        .file_type()
        .is_symlink()
    {
        return None;
    }
    let dir = link.parent()?;
    let stem = format!("{}-", link.file_name()?.to_str()?);
    let mut releases: Vec<(SlurmVersion, PathBuf)> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with(&stem)))
        .filter_map(|e| {
            let prefix = e.path();
            let marker = std::fs::read_to_string(prefix.join(MARKER)).ok()?;
            let v = marker
                .lines()
                .find_map(|l| l.strip_prefix("version="))
                .and_then(SlurmVersion::parse)?;
            // The folder is named after the release it holds; anything else is not ours.
            (e.file_name().to_str()? == format!("{stem}{v}")).then_some((v, prefix))
        })
        .collect();
    releases.sort_by_key(|r| std::cmp::Reverse(r.0));
    if releases.len() < 2 {
        return None;
    }
    let target = std::fs::read_link(&link).ok()?;
    let target = dir.join(target);
    let current = releases.iter().find(|(_, p)| *p == target).map(|(v, _)| *v);
    Some(Installed {
        link,
        releases,
        current,
    })
}

/// Points `link` at `prefix` (a sibling: the link's target is its file name), atomically:
/// a new link beside it renamed over it. Nothing changes when it points there already.
///
/// # Errors
/// [`SwitchError`].
pub fn point_at(link: &Path, prefix: &Path) -> Result<bool, SwitchError> {
    let err = |source| SwitchError::Link {
        link: link.to_path_buf(),
        target: prefix.to_path_buf(),
        source,
    };
    let name = prefix
        .file_name()
        .ok_or_else(|| err(std::io::Error::other("no file name")))?;
    if std::fs::read_link(link).is_ok_and(|t| t.as_os_str() == name) {
        return Ok(false);
    }
    let tmp = link.with_file_name(format!(
        ".{}.new.{}",
        link.file_name().and_then(|n| n.to_str()).unwrap_or("slurm"),
        std::process::id()
    ));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(name, &tmp).map_err(err)?;
    if let Err(e) = std::fs::rename(&tmp, link) {
        let _ = std::fs::remove_file(&tmp);
        return Err(err(e));
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn prefix(root: &Path, name: &str, marker: Option<&str>) {
        let p = root.join(name);
        std::fs::create_dir_all(p.join("bin")).unwrap();
        if let Some(v) = marker {
            std::fs::write(p.join(MARKER), format!("key=abc\nversion={v}\n")).unwrap();
        }
    }

    #[test]
    fn whole_installations_beside_a_symlinked_prefix_are_the_candidates() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        prefix(root, "slurm-24.11.7", Some("24.11.7"));
        prefix(root, "slurm-26.05.3", Some("26.05.3"));
        prefix(root, "slurm-25.11.6", Some("25.11.6"));
        // Half-installed (no marker), a marker naming another release, a stray folder.
        prefix(root, "slurm-25.05.1", None);
        prefix(root, "slurm-23.11.4", Some("23.11.5"));
        prefix(root, "slurmrestd-x", Some("25.11.6"));
        std::os::unix::fs::symlink("slurm-24.11.7", root.join("slurm")).unwrap();
        let found = installed(&root.join("slurm/bin")).unwrap();
        let versions: Vec<String> = found.releases.iter().map(|(v, _)| v.to_string()).collect();
        assert_eq!(versions, ["26.05.3", "25.11.6", "24.11.7"]);
        assert_eq!(found.current, SlurmVersion::parse("24.11.7"));
        assert_eq!(found.link, root.join("slurm"));

        assert!(point_at(&found.link, &root.join("slurm-26.05.3")).unwrap());
        assert!(!point_at(&found.link, &root.join("slurm-26.05.3")).unwrap());
        assert_eq!(
            std::fs::read_link(root.join("slurm")).unwrap(),
            Path::new("slurm-26.05.3")
        );
        let found = installed(&root.join("slurm/bin")).unwrap();
        assert_eq!(found.current, SlurmVersion::parse("26.05.3"));
        // No temporary link left behind.
        let names: Vec<String> = std::fs::read_dir(root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(!names.iter().any(|n| n.contains(".new.")), "{names:?}");
    }

    #[test]
    fn a_directory_prefix_or_a_single_release_offers_no_choice() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        prefix(root, "slurm", Some("25.11.6"));
        prefix(root, "slurm-26.05.3", Some("26.05.3"));
        assert_eq!(installed(&root.join("slurm/bin")), None);
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        prefix(root, "slurm-25.11.6", Some("25.11.6"));
        prefix(root, "slurm-26.05.3", None);
        std::os::unix::fs::symlink("slurm-25.11.6", root.join("slurm")).unwrap();
        assert_eq!(installed(&root.join("slurm/bin")), None);
    }
}
