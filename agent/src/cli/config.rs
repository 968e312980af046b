//! `slurm-node-agent config show`: the merged settings with the source and the trust class
//! of each value, then this node's and the controller's Slurm releases (observed, not
//! settings: text `# Node Slurm: ...` lines; JSON `_observed.slurm_releases`, as
//! [`crate::slurm::skew::Releases::to_json`]); `config reference`: every key's
//! documentation (`docs/settings.md`).

use clap::{Args, Subcommand};

use super::{print_error, print_error_message, Output, SettingsArgs};
use crate::exit::Exit;
use crate::identity::InstanceError;
use crate::imds::Imds;
use crate::settings::pipeline::Inputs;
use crate::settings::Enforce;

/// `config` subcommands.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print every key, its value, where it came from and its trust class (`image`:
    /// root-owned settings files and the command line only; `user-data`: also user data;
    /// `tag`: also instance tags). Keys a source may not set are warned about and left out.
    Show(ShowArgs),
    /// Print the settings reference (Markdown): every key with its type, default, trust
    /// class, meaning and an example, from this build's own schema (`docs/settings.md`).
    Reference,
}

/// Arguments of `config show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// Settings sources.
    #[command(flatten)]
    pub settings: SettingsArgs,
    /// Do not read instance tags and user data from IMDS (files and flags only).
    #[arg(long)]
    pub no_imds: bool,
    /// Do not ask slurmctld its release (`scontrol show config`); this node's is still
    /// shown.
    #[arg(long)]
    pub no_slurm: bool,
    /// Result format.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

impl ConfigCommand {
    /// Runs the subcommand; returns the exit code.
    pub async fn run(self) -> Exit {
        match self {
            ConfigCommand::Show(a) => a.run().await,
            ConfigCommand::Reference => {
                print!("{}", crate::settings::reference::markdown());
                Exit::Ok
            }
        }
    }
}

impl ShowArgs {
    async fn run(self) -> Exit {
        let result = async {
            // The one settings pipeline, as bootstrap runs it, warning about (not
            // refusing) a key from a source below its trust class.
            let flags = self.settings.flag_layers()?;
            let inputs = Inputs::read(&self.settings.paths(), &flags)?;
            let early = inputs.resolve(Enforce::WarnAndIgnore)?;
            if self.no_imds {
                return Ok::<_, InstanceError>(early);
            }
            let imds = Imds::new(&early.settings.imds);
            let instance =
                crate::identity::read_instance(&imds, &inputs, Enforce::WarnAndIgnore).await?;
            Ok(instance.settings(Enforce::WarnAndIgnore)?)
        }
        .await;
        let resolved = match result {
            Ok(r) => r,
            Err(e @ InstanceError::Imds(_)) => {
                // Off EC2 (a build host, a laptop) there is no IMDS to ask.
                print_error_message(&format!(
                    "{}; not on an EC2 instance? `config show --no-imds` shows the settings \
                     from the files and flags only",
                    crate::imds::error_chain(&e)
                ));
                return e.exit();
            }
            Err(e) => {
                print_error(&e);
                return e.exit();
            }
        };
        let entries = resolved.entries();
        // Both Slurm releases, observed (not settings): this node's slurmd and the
        // controller's (one `scontrol show config`).
        let releases = if self.no_slurm {
            crate::slurm::skew::Releases::look_local(&resolved.settings.slurm).await
        } else {
            crate::slurm::skew::Releases::look(&resolved.settings.slurm).await
        }
        .to_json();
        match self.output {
            Output::Json => {
                let obj: serde_json::Map<String, serde_json::Value> = entries
                    .into_iter()
                    .map(|(k, v, s, t)| {
                        let value = serde_json::to_value(&v).unwrap_or(serde_json::Value::Null);
                        (
                            k,
                            serde_json::json!({ "value": value, "source": s.to_string(), "trust": t }),
                        )
                    })
                    .collect();
                let mut obj = obj;
                obj.insert(
                    "_observed".into(),
                    serde_json::json!({ "slurm_releases": releases }),
                );
                println!("{}", serde_json::Value::Object(obj));
            }
            Output::Text => {
                for (k, v, s, t) in entries {
                    println!("{k} = {v}    # {s}; trust: {t}");
                }
                for (k, v) in super::status::release_lines(&releases) {
                    println!("# {k}: {v}    (observed, not a setting)");
                }
            }
        }
        Exit::Ok
    }
}
