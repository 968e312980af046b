//! Bootstrap's check of the node's `auth.type` before the join: against what the join
//! needs (the managed service's auth/slurm) and what the image's Slurm can do (its version,
//! its plugins), before anything is registered, written or started.

use super::BootstrapError;
use crate::authkey::AuthType;
use crate::settings::{self, Resolved};
use crate::slurm as slurm_mod;

/// The node's `auth.type` against what its join needs and what the image's Slurm can do,
/// before anything is registered, written or started: a settings error (exit 78) naming
/// `auth.type` and the layer that set it.
/// - The managed join (`pcs.enabled`) needs its clusters' auth/slurm
///   ([`crate::pcs::CLUSTER_AUTH`]): an image or flag that says `munge` is refused.
/// - auth/slurm needs slurmd 23.11 or later (a slurmd that gives no version is not refused).
/// - Slurm's plugin folder ([`slurm_mod::plugins::plugin_dir`]), when found, must hold the
///   type's plugin (`auth_munge.so`, `auth_slurm.so`): a Slurm built `--without-munge`
///   has no auth/munge, one built without libjwt no auth/slurm.
pub(super) async fn check(resolved: &Resolved) -> Result<(), BootstrapError> {
    let s = &resolved.settings;
    let t = s.auth.auth_type;
    let refuse = |m: String| BootstrapError::Settings(resolved.key_error("auth.type".into(), m));
    let unset = resolved.source_of("auth.type") == settings::Source::Default;
    let value = match (unset, s.pcs.enabled) {
        (true, true) => format!(
            "\"{}\" ({}; not set: the managed join's)",
            t.setting(),
            t.plugin()
        ),
        (true, false) => format!("\"{}\" ({}; not set: the default)", t.setting(), t.plugin()),
        (false, _) => format!("\"{}\" ({})", t.setting(), t.plugin()),
    };
    let managed = crate::pcs::CLUSTER_AUTH;
    if s.pcs.enabled && t != managed {
        return Err(refuse(format!(
            "{value}, but the managed join (pcs.enabled) needs {}: AWS PCS runs every cluster \
             with AuthType={} and its registration hands out that key. Leave auth.type unset \
             (an image built with slurm-image-builder's default --auth munge+slurm does) or \
             set \"{}\"",
            managed.plugin(),
            managed.plugin(),
            managed.setting()
        )));
    }
    let advice = |wanted: AuthType| match (wanted, s.pcs.enabled) {
        (AuthType::Slurm, true) => {
            "build the image with a Slurm that has it (23.11 or later with libjwt, as \
             slurm-image-builder builds it)"
        }
        (AuthType::Slurm, false) => "use \"munge\" with this Slurm, or build it with auth/slurm",
        (AuthType::Munge, _) => {
            "set \"slurm\" for a cluster that runs auth/slurm, or build the image with \
             --auth munge or munge+slurm"
        }
    };
    let slurmd = slurm_mod::version::slurmd_path(&s.slurm.bin_dir);
    if t == AuthType::Slurm {
        if let Some(v) = slurm_mod::version::slurmd_version(&slurmd).await {
            if !v.has_auth_slurm() {
                return Err(refuse(format!(
                    "{value} needs Slurm 23.11 or later; slurmd {} is {v}: {}",
                    slurmd.display(),
                    advice(t)
                )));
            }
        }
    }
    if let Some(dir) = slurm_mod::plugins::plugin_dir(&s.slurm.bin_dir) {
        if !slurm_mod::plugins::has_auth_plugin(&dir, t.setting()) {
            let built = match t {
                AuthType::Munge => {
                    "configure --without-munge, as slurm-image-builder --auth slurm builds it"
                }
                AuthType::Slurm => "auth/slurm needs libjwt when Slurm is built",
            };
            return Err(refuse(format!(
                "{value} needs Slurm's {} plugin, and this Slurm's plugin folder {} has no \
                 auth_{}.so ({built}): {}",
                t.plugin(),
                dir.display(),
                t.setting(),
                advice(t)
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::exit::Exit;
    use crate::settings::{Layer, Source};
    use std::path::{Path, PathBuf};

    /// A Slurm prefix with `bin/` and the plugin files `plugins` in `lib/slurm` (no
    /// slurmd: its version is not known, so only the plugins are checked).
    fn slurm_with(plugins: &[&str]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("bin")).unwrap();
        std::fs::create_dir_all(d.path().join("lib/slurm")).unwrap();
        for p in plugins {
            std::fs::write(d.path().join("lib/slurm").join(p), "").unwrap();
        }
        d
    }

    /// The layers of a node: the image's drop-in (`auth` as 70-agent.sh writes it), the
    /// user data's join.
    fn layers(slurm: &Path, image_auth: Option<&str>, user_data: &str) -> Vec<Layer> {
        let image = format!(
            "# Written by packer/scripts/70-agent.sh for this image; later drop-ins override it.\n\
             {}\n[slurm]\nbin_dir = \"{}\"\n",
            image_auth.map_or_else(
                || "# auth.type not set".to_string(),
                |t| format!("[auth]\ntype = \"{t}\"")
            ),
            slurm.join("bin").display()
        );
        let path = PathBuf::from("/etc/slurm-node-agent/conf.d/10-image.toml");
        vec![
            Layer::from_toml(Source::File(path), &image).unwrap(),
            Layer::from_toml(Source::UserData(1), user_data).unwrap(),
        ]
    }

    async fn check_of(layers: &[Layer]) -> (Resolved, Result<(), BootstrapError>) {
        let r = Resolved::merge(layers).unwrap();
        let out = check(&r).await;
        (r, out)
    }

    const MANAGED: &str = "[pcs]\nenabled = true\n";
    const CONFIGLESS: &str = "[slurm]\nconf_servers = [\"10.0.0.10\"]\n";

    #[tokio::test]
    async fn an_image_that_leaves_auth_unset_joins_the_managed_service_with_auth_slurm() {
        let slurm = slurm_with(&["auth_munge.so", "auth_slurm.so"]);
        let (r, out) = check_of(&layers(slurm.path(), None, MANAGED)).await;
        out.unwrap();
        assert_eq!(r.settings.auth.auth_type, AuthType::Slurm);
        // The same image joins a site's own controller with munge.
        let (r, out) = check_of(&layers(slurm.path(), None, CONFIGLESS)).await;
        out.unwrap();
        assert_eq!(r.settings.auth.auth_type, AuthType::Munge);
    }

    #[tokio::test]
    async fn an_image_that_says_munge_is_refused_for_the_managed_join_naming_the_file() {
        let slurm = slurm_with(&["auth_munge.so", "auth_slurm.so"]);
        let (_, out) = check_of(&layers(slurm.path(), Some("munge"), MANAGED)).await;
        let e = out.unwrap_err();
        assert_eq!(e.exit(), Exit::Config);
        let m = e.to_string();
        assert!(
            m.starts_with(
                "/etc/slurm-node-agent/conf.d/10-image.toml, line 3: key `auth.type`: \"munge\" \
                 (auth/munge), but the managed join (pcs.enabled) needs auth/slurm: AWS PCS \
                 runs every cluster with AuthType=auth/slurm"
            ),
            "{m}"
        );
        // munge stays what a configless join to a munge controller uses.
        let (_, out) = check_of(&layers(slurm.path(), Some("munge"), CONFIGLESS)).await;
        out.unwrap();
        // An image that says slurm joins the managed service.
        let (_, out) = check_of(&layers(slurm.path(), Some("slurm"), MANAGED)).await;
        out.unwrap();
    }

    #[tokio::test]
    async fn a_slurm_without_the_plugin_is_refused_naming_the_folder() {
        // auth/slurm needs libjwt at build time: the managed join's default refused.
        let slurm = slurm_with(&["auth_munge.so"]);
        let (_, out) = check_of(&layers(slurm.path(), None, MANAGED)).await;
        let e = out.unwrap_err();
        assert_eq!(e.exit(), Exit::Config);
        let m = e.to_string();
        let dir = slurm.path().join("lib/slurm");
        assert!(
            m.starts_with("default: key `auth.type`: \"slurm\" (auth/slurm; not set: the managed join's) needs Slurm's auth/slurm plugin")
                && m.contains(&format!("plugin folder {} has no auth_slurm.so", dir.display())),
            "{m}"
        );
        // Built --without-munge (`--auth slurm`), asked for munge by a configless join.
        let slurm = slurm_with(&["auth_slurm.so"]);
        let (_, out) = check_of(&layers(slurm.path(), None, CONFIGLESS)).await;
        let m = out.unwrap_err().to_string();
        assert!(
            m.contains(
                "\"munge\" (auth/munge; not set: the default) needs Slurm's auth/munge plugin"
            ) && m.contains("has no auth_munge.so (configure --without-munge"),
            "{m}"
        );
        // A layout where no plugin folder is found is not checked.
        let bare = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(bare.path().join("bin")).unwrap();
        let (_, out) = check_of(&layers(bare.path(), None, MANAGED)).await;
        out.unwrap();
    }
}
