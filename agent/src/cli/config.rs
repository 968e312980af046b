//! `slurm-node-agent config show`: the merged settings with the source and the trust class
//! of each value, then this node's and the controller's Slurm releases (observed, not
//! settings: text `# Node Slurm: ...` lines; JSON `_observed.slurm_releases`, as
//! [`crate::slurm::skew::Releases::to_json`]); `config reference`: every key's
//! documentation (`docs/settings.md`).

use clap::{Args, Subcommand};

use super::{print_error, print_error_message, print_warning_message, Output, SettingsArgs};
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
    /// Print the CloudWatch agent's configuration for this node (log groups named after
    /// the cluster, retention, native GPU and EFA metrics where the devices are), or
    /// write it to `cloudwatch.config_file` with `--write` (at boot, before the
    /// CloudWatch agent starts).
    Cloudwatch(CloudwatchArgs),
}

/// Arguments of `config cloudwatch`.
#[derive(Debug, Args)]
pub struct CloudwatchArgs {
    /// Settings sources.
    #[command(flatten)]
    pub settings: SettingsArgs,
    /// Do not read instance tags and user data from IMDS (files and flags only).
    #[arg(long)]
    pub no_imds: bool,
    /// Write the configuration to `cloudwatch.config_file` (atomically, only when it
    /// changed) instead of printing it.
    #[arg(long)]
    pub write: bool,
    /// Folder of the kernel's devices (EFA: `class/infiniband`).
    #[arg(long, value_name = "DIR", default_value = "/sys", hide = true)]
    pub sys_dir: std::path::PathBuf,
    /// Folder where GPU device files (`nvidia<N>`) appear.
    #[arg(long, value_name = "DIR", default_value = "/dev", hide = true)]
    pub dev_dir: std::path::PathBuf,
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
            ConfigCommand::Cloudwatch(a) => a.run().await,
            ConfigCommand::Reference => {
                print!("{}", crate::settings::reference::markdown());
                Exit::Ok
            }
        }
    }
}

/// The settings through the one pipeline, as bootstrap reads them, warning about (not
/// refusing) a key from a source below its trust class; instance tags and user data from
/// IMDS unless `no_imds`. `Err`: the exit code, the error printed (`command` names the
/// subcommand in the hint given off EC2).
async fn resolve(
    settings: &SettingsArgs,
    no_imds: bool,
    command: &str,
) -> Result<crate::settings::Resolved, Exit> {
    let result = async {
        let flags = settings.flag_layers()?;
        let inputs = Inputs::read(&settings.paths(), &flags)?;
        let early = inputs.resolve(Enforce::WarnAndIgnore)?;
        if no_imds {
            return Ok::<_, InstanceError>(early);
        }
        let imds = Imds::new(&early.settings.imds);
        let instance =
            crate::identity::read_instance(&imds, &inputs, Enforce::WarnAndIgnore).await?;
        Ok(instance.settings(Enforce::WarnAndIgnore)?)
    }
    .await;
    match result {
        Ok(r) => Ok(r),
        Err(e @ InstanceError::Imds(_)) => {
            // Off EC2 (a build host, a laptop) there is no IMDS to ask.
            print_error_message(&format!(
                "{}; not on an EC2 instance? `{command} --no-imds` reads the settings \
                 from the files and flags only",
                crate::imds::error_chain(&e)
            ));
            Err(e.exit())
        }
        Err(e) => {
            print_error(&e);
            Err(e.exit())
        }
    }
}

impl CloudwatchArgs {
    async fn run(self) -> Exit {
        let resolved = match resolve(&self.settings, self.no_imds, "config cloudwatch").await {
            Ok(r) => r,
            Err(exit) => return exit,
        };
        let s = &resolved.settings;
        let (cluster, from) = crate::cloudwatch::cluster_name(&s.cloudwatch, &s.pcs.cluster_id);
        if from == crate::cloudwatch::ClusterFrom::Fallback {
            print_warning_message(&format!(
                "the log groups are named for the cluster \"{cluster}\": set \
                 cloudwatch.cluster_name (user data or the instance tag) to the cluster's name"
            ));
        }
        let devices = crate::cloudwatch::Devices::look(&self.sys_dir, &self.dev_dir);
        let config = crate::cloudwatch::render(&s.cloudwatch, &cluster, devices);
        let text = match serde_json::to_string_pretty(&config) {
            Ok(t) => t + "\n",
            Err(e) => {
                print_error(&e);
                return Exit::IoErr;
            }
        };
        if !self.write {
            print!("{text}");
            return Exit::Ok;
        }
        let path = &s.cloudwatch.config_file;
        if path.as_os_str().is_empty() {
            print_error_message(
                "config cloudwatch --write: cloudwatch.config_file is empty (the image sets it \
                 where the CloudWatch agent reads its configuration, e.g. \
                 cloudwatch.config_file = \"/opt/aws/amazon-cloudwatch-agent/etc/amazon-cloudwatch-agent.json\")",
            );
            return Exit::Config;
        }
        if std::fs::read(path).is_ok_and(|old| old == text.as_bytes()) {
            tracing::info!(path = %path.display(), "CloudWatch agent configuration unchanged");
            return Exit::Ok;
        }
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        match crate::fsutil::write_atomic(path, text.as_bytes(), 0o644, None) {
            Ok(()) => {
                tracing::info!(
                    decision = "cloudwatch.config",
                    path = %path.display(),
                    cluster = %cluster,
                    log_groups = %crate::cloudwatch::LOGS.map(|l| s.cloudwatch.group(&cluster, l)).join(" "),
                    retention_days = s.cloudwatch.retention_days,
                    nvidia_smi = devices.nvidia_gpus,
                    efa = devices.efa,
                    "CloudWatch agent configuration written"
                );
                Exit::Ok
            }
            Err(e) => {
                print_error(&e);
                Exit::IoErr
            }
        }
    }
}

impl ShowArgs {
    async fn run(self) -> Exit {
        let resolved = match resolve(&self.settings, self.no_imds, "config show").await {
            Ok(r) => r,
            Err(exit) => return exit,
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
