//! Command line: `plan`, `validate`, `build`, `publish` (clap derive), each returning a
//! report printed as text or, with `--output json`, as one JSON document on stdout.

use crate::error::{Error, Result};
use crate::machine_readable::Manifest;
use crate::recipe::{os_catalog, Recipe, Request, Sources};
use crate::template::{pkrvars, Template};
use crate::{local, packer, publish, sources};
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::{json, Value as Json};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The exit codes, as `--help` and the man page list them.
pub const EXIT_CODES: &str = "Exit codes:
  0    success
  1    unexpected failure (I/O, a bug)
  2    bad input: unknown OS or architecture, version without checksum, undeclared or mistyped variable, bad command line
  3    template check failed (packer fmt -check, packer validate)
  4    Packer missing, older than the template's required_version, or packer init could not install the template's plugins
  5    a source is unreachable or its checksum does not match
  6    the build failed (Packer, a provisioning step, the acceptance checks)
  7    publishing to SSM failed
  130  cancelled by SIGINT or SIGTERM (Packer was interrupted and has exited)";

/// Bakes Slurm compute node images with Packer and publishes their ids to SSM.
#[derive(Debug, Parser)]
#[command(name = "slurm-image-builder", version, after_help = EXIT_CODES)]
pub struct Cli {
    /// The project's packer/ folder (templates, scripts/, files/, sources.toml). Default:
    /// the first of <exe>/../share/slurm-image-builder/packer,
    /// /usr/share/slurm-image-builder/packer, the packer/ folder of the source tree the
    /// binary was built in, ./packer.
    #[arg(long, global = true, env = "SIB_PACKER_DIR")]
    pub packer_dir: Option<PathBuf>,
    /// Packer program: a name looked up on PATH, or a path.
    #[arg(long, global = true, env = "SIB_PACKER", default_value = "packer")]
    pub packer: String,
    /// Output format of the result on stdout (progress and logs go to stderr).
    #[arg(long, global = true, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Lines for people.
    Text,
    /// One JSON document.
    Json,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the resolved recipe (OS, versions, checksums, Packer variables) and, for an AMI,
    /// the build's prerequisites; refuses a Packer older than the template's
    /// required_version. Downloads nothing (no packer init).
    Plan(RecipeArgs),
    /// Check the template: variables passed exist with the right type, the signing-key
    /// pins in files/keys/, the HCL2 schema; then refuses a Packer older than the
    /// template's required_version, and runs packer init, packer fmt -check and packer
    /// validate.
    Validate(ValidateArgs),
    /// Build the image: an AMI with Packer, or a local Debian 12 root, tarball and qcow2.
    Build(BuildArgs),
    /// Write an AMI id to an SSM parameter as a new version (history), optionally labelled.
    Publish(PublishArgs),
    /// Write the man pages and shell completions (bash, zsh, fish) below a `share` folder.
    #[command(hide = true)]
    Generate(GenerateArgs),
}

/// Arguments of the hidden `generate` command.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Folder to write into, laid out as a `share` folder (`man/man1`,
    /// `bash-completion/completions`, `zsh/site-functions`, `fish/vendor_completions.d`).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

/// Where to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Target {
    /// An AMI, with Packer's amazon-ebs builder.
    Amazon,
    /// A Debian 12 root through mmdebstrap and chroot, packed as tarball and qcow2.
    Local,
}

/// What the image contains.
#[derive(Debug, Clone, Args)]
pub struct RecipeArgs {
    /// Build target.
    #[arg(long, value_enum, default_value_t = Target::Amazon)]
    pub target: Target,
    /// Base OS (al2023, ubuntu-22.04, ubuntu-24.04, rocky9; debian-12 for --target local).
    #[arg(long)]
    pub os: Option<String>,
    /// Architecture: x86_64 or arm64.
    #[arg(long)]
    pub arch: Option<String>,
    /// Slurm version (default: sources.toml's, or Debian 12's 22.05.8 locally): a pinned
    /// version (25.11.6) or a release series (25.11: its newest pinned version). Repeat it,
    /// or give a comma list, to install several side by side (tarball only), each in
    /// /opt/slurm-<version>, with /opt/slurm a symlink to the default's.
    #[arg(long = "slurm-version", value_name = "V", value_delimiter = ',')]
    pub slurm_versions: Vec<String>,
    /// Which --slurm-version /opt/slurm points at in the image, whose units are installed
    /// and which names the AMI (default: the first). A node switches to the version its
    /// controller accepts at boot.
    #[arg(long, value_name = "V")]
    pub slurm_default: Option<String>,
    /// Slurm from the pinned source tarball, Debian's own source package (built the same
    /// way, offline from the pins), or the distribution's packages.
    #[arg(long, value_parser = ["tarball", "debian-source", "distro"])]
    pub slurm_source: Option<String>,
    /// The auth plugins the image can join with: munge (auth/munge only), slurm (auth/slurm
    /// only: Slurm built --without-munge, no MUNGE), or munge+slurm (MUNGE and both plugins;
    /// each node's join picks: auth/slurm for the managed service, munge otherwise).
    /// Default: munge+slurm where every Slurm version is 23.11 or later, else munge.
    #[arg(long)]
    pub auth: Option<String>,
    /// EFA installer version; "" leaves EFA out.
    #[arg(long)]
    pub efa_version: Option<String>,
    /// Leave the Lustre client out.
    #[arg(long)]
    pub no_lustre: bool,
    /// NVIDIA driver version or branch to install.
    #[arg(long)]
    pub nvidia_driver: Option<String>,
    /// Install NVIDIA DCGM (needs --nvidia-driver).
    #[arg(long)]
    pub dcgm: bool,
    /// Install the CloudWatch agent, shipping the journal of slurmd and slurm-node-agent.
    #[arg(long)]
    pub cloudwatch_agent: bool,
    /// Version of slurm-node-agent recorded in tags and build-info (default: the
    /// --agent-package's version, else what the staged agent binary's --version prints;
    /// 0.0.0-dev without one).
    #[arg(long)]
    pub agent_version: Option<String>,
    /// The agent as a package (FILE.deb or FILE.rpm, from scripts/package.sh) instead of a
    /// binary: checked against --os and --arch (format, architecture, glibc floor) before
    /// Packer starts, and installed in the image by the OS's package manager.
    #[arg(long, value_name = "FILE")]
    pub agent_package: Option<PathBuf>,
    /// Build region.
    #[arg(long)]
    pub region: Option<String>,
    /// Further region to copy the AMI to (repeatable).
    #[arg(long = "ami-region")]
    pub ami_regions: Vec<String>,
    /// Pinned sources (default: <packer-dir>/sources.toml).
    #[arg(long)]
    pub sources: Option<PathBuf>,
    /// Template folder or file to build (default: <packer-dir>).
    #[arg(long)]
    pub template: Option<PathBuf>,
    /// Extra template variable NAME=VALUE (repeatable; typed by the template's declaration).
    #[arg(long = "var", value_name = "NAME=VALUE")]
    pub vars: Vec<String>,
}

/// `validate` options.
#[derive(Debug, Clone, Args)]
pub struct ValidateArgs {
    /// The recipe.
    #[command(flatten)]
    pub recipe: RecipeArgs,
    /// Also download every pinned source and check its sha256.
    #[arg(long)]
    pub check_sources: bool,
    /// Where --check-sources keeps downloads.
    #[arg(long, default_value = "build/sources")]
    pub cache_dir: PathBuf,
}

/// `build` options.
#[derive(Debug, Clone, Args)]
pub struct BuildArgs {
    /// The recipe.
    #[command(flatten)]
    pub recipe: RecipeArgs,
    /// Work folder: logs, variables file, manifest, agent and sources staging, local root.
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Full log (default: <work-dir>/packer.log or local.log).
    #[arg(long)]
    pub log_file: Option<PathBuf>,
    /// slurm-node-agent binary (default: target/release or target/debug, if built).
    #[arg(long, conflicts_with = "agent_package")]
    pub agent_bin: Option<PathBuf>,
    /// Build without the agent binary (the steps say plainly that it is absent).
    #[arg(long, conflicts_with_all = ["agent_bin", "agent_package"])]
    pub without_agent: bool,
    /// The agent's unit files (default: units/ beside the packer folder).
    #[arg(long)]
    pub units_dir: Option<PathBuf>,
    /// Let steps whose sources are unreachable skip with a message instead of failing
    /// (always on for --target local, where the EFA and FSx sources cannot be reached).
    #[arg(long)]
    pub allow_skips: bool,
    /// Download and verify the pinned sources here and hand them to the build.
    #[arg(long)]
    pub prefetch_sources: bool,
    /// Local target: persistent apt archive cache (warm cache between builds).
    #[arg(long)]
    pub apt_cache: Option<PathBuf>,
    /// Local target: a folder of pre-fetched source tarballs, named as their pinned URLs
    /// name them (e.g. SchedMD's `slurm-25-11-6-1.tar.gz`). The steps still check each
    /// file against its pinned sha256 and refuse one that differs.
    #[arg(long)]
    pub sources_dir: Option<PathBuf>,
    /// Local target: a folder of finished Slurm builds, kept between image builds and
    /// shared with `scripts/slurm-build.sh` (keyed by the source's sha256, the configure
    /// flags, the OS and the architecture; see packer/scripts/lib-slurm.sh).
    #[arg(long)]
    pub slurm_build_cache: Option<PathBuf>,
    /// Local target: Debian mirror for mmdebstrap.
    #[arg(long)]
    pub mirror: Option<String>,
    /// Local target: keep the finished root and run the provisioning steps again.
    #[arg(long)]
    pub steps_only: bool,
    /// Local target: no tarball and qcow2.
    #[arg(long)]
    pub no_artifacts: bool,
}

/// `publish` options.
#[derive(Debug, Clone, Args)]
pub struct PublishArgs {
    /// SSM parameter the nodes watch, e.g. /slurm/compute/ami.
    #[arg(long)]
    pub parameter: String,
    /// The AMI id to publish.
    #[arg(
        long,
        conflicts_with = "manifest",
        required_unless_present = "manifest"
    )]
    pub ami_id: Option<String>,
    /// Take the AMI id from a Packer manifest (the last run's build in --region).
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// Region of the parameter (and of the AMI picked from a manifest).
    #[arg(long)]
    pub region: Option<String>,
    /// Label for the new version (repeatable), e.g. a release name.
    #[arg(long = "label")]
    pub labels: Vec<String>,
    /// Parameter data type.
    #[arg(long, default_value = "aws:ec2:image", value_parser = ["aws:ec2:image", "text"])]
    pub data_type: String,
    /// SSM endpoint override (also AWS_ENDPOINT_URL).
    #[arg(long)]
    pub endpoint_url: Option<String>,
    /// Launch template (name) to roll to the image as well (repeatable): a new version
    /// with the image, made the default, so that replacements boot it. A template that
    /// takes its image from resolve:ssm:<parameter> already follows and is left alone.
    #[arg(long = "launch-template")]
    pub launch_templates: Vec<String>,
}

/// A command's result: JSON for machines, text for people.
#[derive(Debug)]
pub struct Report {
    /// The JSON document.
    pub json: Json,
    /// Lines for people.
    pub text: String,
}

impl Cli {
    /// Run the chosen command.
    pub async fn run(mut self) -> Result<Report> {
        if let Command::Generate(args) = &self.command {
            return crate::manual::generate(&args.out);
        }
        if self.packer_dir.is_none() {
            self.packer_dir = Some(default_packer_dir()?);
        }
        match &self.command {
            Command::Plan(args) => self.plan(args).await,
            Command::Validate(args) => self.validate(args).await,
            Command::Build(args) => self.build(args).await,
            Command::Publish(args) => publish_cmd(args).await,
            Command::Generate(args) => crate::manual::generate(&args.out),
        }
    }

    /// The packer folder ([`default_packer_dir`] when not given).
    fn packer_dir(&self) -> PathBuf {
        self.packer_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("packer"))
    }

    /// The units folder: `--units-dir`, else `units/` beside the packer folder.
    fn units_dir(&self, args: &BuildArgs) -> PathBuf {
        args.units_dir.clone().unwrap_or_else(|| {
            let packer = self.packer_dir();
            let parent = std::path::absolute(&packer)
                .ok()
                .and_then(|p| p.parent().map(Path::to_path_buf))
                .unwrap_or_default();
            parent.join("units")
        })
    }

    fn resolve(&self, args: &RecipeArgs) -> Result<(Recipe, Template, BTreeMap<String, Json>)> {
        let packer_dir = self.packer_dir();
        let sources_file = args
            .sources
            .clone()
            .unwrap_or_else(|| packer_dir.join("sources.toml"));
        let sources = Sources::load(&sources_file)?;
        let project = Template::load(&packer_dir)?;
        let catalog = os_catalog(&project)?;
        let req = Request {
            os: args.os.clone(),
            arch: args.arch.clone(),
            slurm_versions: args.slurm_versions.clone(),
            slurm_default: args.slurm_default.clone(),
            slurm_source: args.slurm_source.clone(),
            auth: args.auth.clone(),
            efa_version: args.efa_version.clone(),
            lustre: Some(!args.no_lustre),
            nvidia_driver: args.nvidia_driver.clone(),
            dcgm: args.dcgm,
            cloudwatch_agent: args.cloudwatch_agent,
            agent_version: args.agent_version.clone(),
            region: args.region.clone(),
            ami_regions: args.ami_regions.clone(),
            local: args.target == Target::Local,
        };
        let mut recipe = Recipe::resolve(&req, &sources, &sources_file, &catalog)?;
        if let Some(path) = &args.agent_package {
            let package = fitting_package(path, &recipe, &self.packer_dir())?;
            if args.agent_version.is_none() {
                recipe.agent_version = package.version.clone();
            }
        }
        let template = match &args.template {
            Some(t) => Template::load(t)?,
            None => project,
        };
        let mut vars = recipe.variables();
        for assignment in &args.vars {
            let (name, value) = template.parse_cli_var(assignment)?;
            vars.insert(name, value);
        }
        // `--var` may override what the recipe checked: check the final values again.
        crate::recipe::check_values(&vars, &catalog, args.target == Target::Local)?;
        Ok((recipe, template, vars))
    }

    async fn plan(&self, args: &RecipeArgs) -> Result<Report> {
        let (recipe, template, vars) = self.resolve(args)?;
        let mut text = format!(
            "OS:            {} ({})\nArchitecture:  {}\nSlurm:         {} from {}\nAuth:          {}\n",
            recipe.os, recipe.family, recipe.arch, recipe.slurm_version, recipe.slurm_source, recipe.auth
        );
        if recipe.slurm_versions.len() > 1 {
            text.push_str(&format!(
                "Slurm versions: {} (default {}; each in /opt/slurm-<version>, /opt/slurm a symlink to the default's)\n",
                recipe.slurm_versions_words(),
                recipe.slurm_version
            ));
        }
        let month = this_month();
        let support = recipe.slurm_support_at(&month);
        let words = |ended: bool| {
            support
                .iter()
                .filter(|(_, _, e)| *e == ended)
                .map(|(r, u, _)| format!("{r} (until {u})"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        text.push_str(&format!(
            "Slurm support: {} (SchedMD: 18 months per release); ended: {}\n",
            words(false),
            words(true)
        ));
        let support_warning = recipe.slurm_support_warning(&month);
        if let Some(w) = &support_warning {
            text.push_str(&format!("WARNING: {w}\n"));
        }
        text.push_str(&format!(
            "EFA installer: {}\nLustre client: {}\nNVIDIA driver: {}{}\nAgent:         {}\n",
            none_if_empty(&recipe.efa_version),
            recipe.lustre,
            none_if_empty(&recipe.nvidia_driver),
            if recipe.dcgm { " + DCGM" } else { "" },
            recipe.agent_version
        ));
        for f in recipe.nvidia_fabric() {
            text.push_str(&format!("NVIDIA fabric: {f}\n"));
        }
        text.push_str(&format!("Node updates:  {}\n", recipe.node_updates()));
        text.push_str(&format!("Sources ({}):\n", recipe.sources_file.display()));
        for (name, pin) in recipe.downloads() {
            text.push_str(&format!(
                "  {name}: {}\n    sha256 {}\n",
                pin.url, pin.sha256
            ));
        }
        text.push_str(&format!("Variables for {}:\n", template.path.display()));
        for (k, v) in &vars {
            text.push_str(&format!("  {k} = {v}\n"));
        }
        let mut json = json!({
            "recipe": recipe,
            "sources": recipe.downloads().into_iter().map(|(n, p)| json!({"name": n, "url": p.url, "sha256": p.sha256})).collect::<Vec<_>>(),
            "template": template.path,
            "variables": vars,
            "nvidia_fabric": recipe.nvidia_fabric(),
            "slurm_support": support.iter().map(|(r, u, e)| json!({"release": r, "until": u, "ended": e})).collect::<Vec<_>>(),
            "slurm_support_warning": support_warning,
            "node_updates": recipe.node_updates(),
        });
        if args.target == Target::Amazon {
            // The build would stop here too: the same refusal, before anything else.
            let packer = self.packer_for(&template).await?;
            let prerequisites = amazon_prerequisites(&recipe, &template, &vars);
            text.push_str(&format!(
                "Packer:        {} ({}){}\n",
                packer.version,
                packer.program.display(),
                template
                    .required_version
                    .as_deref()
                    .map(|r| format!(", meets the template's required_version {r}"))
                    .unwrap_or_default()
            ));
            text.push_str(
                "Prerequisites of the build (plan checks none of them and downloads nothing):\n",
            );
            for p in &prerequisites {
                text.push_str(&format!("  {}: {}\n", p.name, p.detail));
            }
            json["packer"] = json!({
                "program": packer.program,
                "version": packer.version.to_string(),
                "required_version": template.required_version,
            });
            json["required_plugins"] = json!(template.required_plugins);
            json["plugin_dir"] = json!(packer::plugin_dir());
            json["prerequisites"] = json!(prerequisites);
        }
        Ok(Report { json, text })
    }

    /// Find Packer and refuse one older than the template's `required_version` (exit 4):
    /// the same check, with the same message, in plan, validate and build.
    async fn packer_for(&self, template: &Template) -> Result<packer::Packer> {
        let required = template.required_version.clone().unwrap_or_default();
        let packer = packer::locate(&self.packer, &required).await?;
        packer.require(template.required_version.as_deref(), &template.path)?;
        Ok(packer)
    }

    /// `packer init` on the template when it names `required_plugins` (validate and build
    /// need them installed); what happened, in words.
    async fn init(&self, packer: &packer::Packer, template: &Template) -> Result<String> {
        if template.required_plugins.is_empty() {
            return Ok(format!(
                "not needed ({} names no required_plugins)",
                template.path.display()
            ));
        }
        let printed = packer
            .init(&absolute(&template.path)?, &template.required_plugins)
            .await?;
        let plugins = template
            .required_plugins
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let mut words = format!("ok: {plugins} in {}", packer::plugin_dir());
        for line in printed {
            words.push_str(&format!("\n  {line}"));
        }
        Ok(words)
    }

    async fn validate(&self, args: &ValidateArgs) -> Result<Report> {
        let (recipe, template, vars) = self.resolve(&args.recipe)?;
        check_variables(&template, &vars)?;
        let pins = crate::keys::check(&self.packer_dir())?;
        let schema = schema_check(&template)?;
        let packer = self.packer_for(&template).await?;
        let init = self.init(&packer, &template).await?;
        packer.fmt_check(&template.path).await?;
        let validate = {
            let dir = tempfile_dir()?;
            let var_file = dir.join("validate.pkrvars.hcl");
            let mut vars = vars.clone();
            staging_dirs(&dir, &mut vars)?;
            write_atomic(&var_file, &pkrvars(&vars))?;
            let r = packer.validate(&template.path, &var_file).await;
            let _ = std::fs::remove_dir_all(&dir);
            r?;
            "ok".to_string()
        };
        let mut fetched = Vec::new();
        if args.check_sources {
            for (name, pin) in recipe.downloads() {
                fetched.push(sources::fetch_verified(&name, &pin, &args.cache_dir).await?);
            }
        }
        let mut text = format!(
            "variables: {} passed, all declared in {} with the right type\nschema check: ok against {} ({} warning(s))\n",
            vars.len(),
            template.path.display(),
            schema.schemas.join(" and "),
            schema.warnings.len(),
        );
        for w in &schema.warnings {
            text.push_str(&format!("  {w}\n"));
        }
        for p in &pins {
            text.push_str(&format!(
                "signing key pin ok: {} {} ({})\n",
                p.id,
                p.fingerprint,
                p.key.display()
            ));
        }
        text.push_str(&format!(
            "packer: {} ({})\npacker init: {init}\npacker fmt -check: ok\npacker validate: {validate}\n",
            packer.version,
            packer.program.display()
        ));
        for f in &fetched {
            text.push_str(&format!(
                "source ok: {} {} ({}sha256 {})\n",
                f.name,
                f.url,
                if f.cached { "cached, " } else { "" },
                f.sha256
            ));
        }
        Ok(Report {
            json: json!({
                "template": template.path,
                "variables": vars.len(),
                "packer": {"program": packer.program, "version": packer.version.to_string()},
                "init": init,
                "fmt": "ok",
                "schema": {"result": "ok", "schemas": schema.schemas, "warnings": schema.warnings},
                "validate": validate,
                "signing_keys": pins,
                "sources": fetched,
            }),
            text,
        })
    }

    async fn build(&self, args: &BuildArgs) -> Result<Report> {
        // A broken pin would stop the build only when a step fetches a signed package.
        crate::keys::check(&self.packer_dir())?;
        match args.recipe.target {
            Target::Amazon => self.build_amazon(args).await,
            Target::Local => self.build_local(args).await,
        }
    }

    /// The agent binary a build puts in the image (`None`: `--without-agent`), refused
    /// before Packer starts when it cannot run on `recipe`'s architecture and OS
    /// ([`check_agent_fits`]).
    fn fitting_agent(&self, args: &BuildArgs, recipe: &Recipe) -> Result<Option<PathBuf>> {
        if args.recipe.agent_package.is_some() {
            // Checked by `resolve`; staged by `assemble_agent`.
            return Ok(None);
        }
        let agent = agent_source(args.agent_bin.as_deref(), args.without_agent)?;
        check_agent_fits(
            agent.as_deref(),
            args.agent_bin.is_some(),
            recipe,
            &self.packer_dir(),
        )?;
        Ok(agent)
    }

    async fn build_amazon(&self, args: &BuildArgs) -> Result<Report> {
        let (mut recipe, template, mut vars) = self.resolve(&args.recipe)?;
        let agent = self.fitting_agent(args, &recipe)?;
        let work = absolute(
            &args
                .work_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from("build/amazon")),
        )?;
        let manifest_path = work.join("manifest.json");
        let agent_dir = work.join("agent");
        let sources_dir = work.join("sources");
        for (k, v) in [
            ("manifest_path", json!(manifest_path)),
            ("agent_dir", json!(agent_dir)),
            ("sources_dir", json!(sources_dir)),
            ("allow_skips", json!(args.allow_skips)),
        ] {
            vars.entry(k.to_string()).or_insert(v);
        }
        check_variables(&template, &vars)?;

        // Packer and its plugins before anything is staged or downloaded: version, then
        // `packer init`, then (below) `packer build`.
        let packer = self.packer_for(&template).await?;
        let init = self.init(&packer, &template).await?;

        let mut assembled = assemble_agent(
            &agent_dir,
            agent.as_deref(),
            args.recipe.agent_package.as_deref(),
            args.without_agent,
            &self.units_dir(args),
            &self.packer_dir(),
        )?;
        let var_given = vars.get("agent_version").and_then(Json::as_str)
            != Some(crate::recipe::DEFAULT_AGENT_VERSION);
        if let Some(v) =
            staged_agent_version(&agent_dir, &recipe, &mut assembled).filter(|_| !var_given)
        {
            vars.insert("agent_version".into(), json!(v));
            recipe.agent_version = v;
        }
        std::fs::create_dir_all(&sources_dir)
            .map_err(|e| Error::io(format!("creating {}", sources_dir.display()), e))?;
        if args.prefetch_sources {
            for (name, pin) in recipe.downloads() {
                sources::fetch_verified(&name, &pin, &sources_dir).await?;
            }
        }

        let var_file = work.join("recipe.pkrvars.hcl");
        write_atomic(&var_file, &pkrvars(&vars))?;
        let _ = std::fs::remove_file(&manifest_path);
        let log_path = args
            .log_file
            .clone()
            .unwrap_or_else(|| work.join("packer.log"));
        let template_path = absolute(&template.path)?;
        let build_args: Vec<OsString> = vec![
            format!("-var-file={}", var_file.display()).into(),
            template_path.into_os_string(),
        ];
        let progress = packer::Progress::for_stderr();
        let outcome = packer::build(&packer, &build_args, &work, &log_path, &progress).await?;
        if let Some(signal) = outcome.cancelled_by {
            return Err(Error::Cancelled {
                signal: signal.into(),
            });
        }
        if outcome.exit_code != Some(0) || !outcome.summary.errors.is_empty() {
            let detail = if outcome.summary.errors.is_empty() {
                outcome.last_errors.join("\n")
            } else {
                outcome.summary.errors.join("\n")
            };
            return Err(Error::Build(format!(
                "packer exited with {:?}: {detail}\nfull log: {}",
                outcome.exit_code,
                log_path.display()
            )));
        }
        let mut amis = outcome.summary.amis.clone();
        let mut from = "artifact lines";
        if amis.is_empty() {
            if let Ok(text) = std::fs::read_to_string(&manifest_path) {
                if let Ok(m) = Manifest::parse(&text) {
                    amis = m.last_run_amis();
                    from = "manifest";
                }
            }
        }
        if amis.is_empty() {
            return Err(Error::Build(format!(
                "packer finished but reported no AMI (neither in its artifact lines nor in {}); full log: {}",
                manifest_path.display(),
                log_path.display()
            )));
        }
        let mut text = String::new();
        for (region, ami) in &amis {
            text.push_str(&format!("{region}: {ami}\n"));
        }
        text.push_str(&format!(
            "log: {}\nmanifest: {}\n",
            log_path.display(),
            manifest_path.display()
        ));
        for note in &assembled {
            text.push_str(&format!("note: {note}\n"));
        }
        Ok(Report {
            json: json!({
                "target": "amazon",
                "amis": amis,
                "amis_from": from,
                "init": init,
                "log_file": log_path,
                "manifest": manifest_path,
                "var_file": var_file,
                "recipe": recipe,
                "agent_notes": assembled,
            }),
            text,
        })
    }

    async fn build_local(&self, args: &BuildArgs) -> Result<Report> {
        let (mut recipe, _template, _vars) = self.resolve(&args.recipe)?;
        let agent = self.fitting_agent(args, &recipe)?;
        let work = absolute(
            &args
                .work_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from("build/local")),
        )?;
        let agent_dir = work.join("agent");
        let mut assembled = assemble_agent(
            &agent_dir,
            agent.as_deref(),
            args.recipe.agent_package.as_deref(),
            args.without_agent,
            &self.units_dir(args),
            &self.packer_dir(),
        )?;
        if let Some(v) = staged_agent_version(&agent_dir, &recipe, &mut assembled) {
            recipe.agent_version = v;
        }
        let log_path = args
            .log_file
            .clone()
            .unwrap_or_else(|| work.join("local.log"));
        let build = local::LocalBuild {
            work_dir: work.clone(),
            packer_dir: absolute(&self.packer_dir())?,
            agent_dir,
            apt_cache: args.apt_cache.as_deref().map(absolute).transpose()?,
            sources_dir: args.sources_dir.as_deref().map(absolute).transpose()?,
            slurm_build_cache: args
                .slurm_build_cache
                .as_deref()
                .map(absolute)
                .transpose()?,
            mirror: args.mirror.clone(),
            env: recipe.step_env(local::STAGING, true),
            steps_only: args.steps_only,
            no_artifacts: args.no_artifacts,
            log_path: log_path.clone(),
        };
        let out = build.run().await?;
        let mut text = format!("root: {}\n", out.root.display());
        if let Some(t) = &out.tarball {
            text.push_str(&format!("tarball: {}\n", t.display()));
        }
        if let Some(q) = &out.qcow2 {
            text.push_str(&format!("qcow2: {}\n", q.display()));
        }
        for s in &out.skipped {
            text.push_str(&format!("skipped: {s}\n"));
        }
        for note in &assembled {
            text.push_str(&format!("note: {note}\n"));
        }
        text.push_str(&format!(
            "provisioning: {}\nlog: {}\n",
            local::secs(out.provisioning_seconds),
            log_path.display()
        ));
        Ok(Report {
            json: json!({
                "target": "local",
                "root": out.root,
                "tarball": out.tarball,
                "qcow2": out.qcow2,
                "skipped": out.skipped,
                "acceptance": out.acceptance,
                "provisioning_seconds": out.provisioning_seconds,
                "timings": out.timings,
                "log_file": log_path,
                "recipe": recipe,
                "agent_notes": assembled,
            }),
            text,
        })
    }
}

async fn publish_cmd(args: &PublishArgs) -> Result<Report> {
    let ami_id = match (&args.ami_id, &args.manifest) {
        (Some(id), _) => id.clone(),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    Error::BadInput(format!("--manifest {}: no such file", path.display()))
                } else {
                    Error::io(format!("reading manifest {}", path.display()), e)
                }
            })?;
            let m = Manifest::parse(&text).map_err(|e| Error::File {
                path: path.clone(),
                message: format!("not a Packer manifest: {e}"),
            })?;
            let amis = m.last_run_amis();
            match &args.region {
                Some(r) => amis.get(r).cloned().ok_or_else(|| {
                    Error::BadInput(format!(
                        "{}: no AMI for region {r} in the last run (regions: {})",
                        path.display(),
                        amis.keys().cloned().collect::<Vec<_>>().join(", ")
                    ))
                })?,
                None if amis.len() == 1 => amis.values().next().cloned().unwrap_or_default(),
                None => {
                    return Err(Error::BadInput(format!(
                        "{}: the last run has AMIs in {} regions; pass --region",
                        path.display(),
                        amis.len()
                    )))
                }
            }
        }
        (None, None) => return Err(Error::BadInput("pass --ami-id or --manifest".into())),
    };
    let client = publish::client(args.region.clone(), args.endpoint_url.clone()).await;
    let mut result = publish::publish(
        &client,
        &publish::PublishRequest {
            parameter: args.parameter.clone(),
            ami_id,
            labels: args.labels.clone(),
            data_type: args.data_type.clone(),
            description: Some("Slurm compute node image (slurm-image-builder)".into()),
        },
    )
    .await?;
    if !args.launch_templates.is_empty() {
        let ec2 = publish::ec2_client(args.region.clone(), args.endpoint_url.clone()).await;
        result.launch_templates = publish::roll_launch_templates(
            &ec2,
            &args.launch_templates,
            &result.ami_id,
            &result.parameter,
        )
        .await?;
    }
    let mut text = format!(
        "{} version {} = {}\n",
        result.parameter, result.version, result.ami_id
    );
    for t in &result.launch_templates {
        text.push_str(&format!(
            "launch template {} ({}): {}, default version {} (was {}: {})\n",
            t.name, t.id, t.outcome, t.default_version, t.previous_default, t.previous_image
        ));
    }
    if !result.labels.is_empty() {
        text.push_str(&format!("labels: {}\n", result.labels.join(", ")));
    }
    for p in &result.history {
        text.push_str(&format!("  previous version {}: {}\n", p.version, p.value));
    }
    Ok(Report {
        json: serde_json::to_value(&result).unwrap_or(Json::Null),
        text,
    })
}

fn none_if_empty(s: &str) -> &str {
    if s.is_empty() {
        "none"
    } else {
        s
    }
}

/// One thing an AMI build needs that `plan` states but cannot check without AWS or the
/// network (printed by `plan`, in its JSON as `prerequisites`).
#[derive(Debug, serde::Serialize)]
struct Prerequisite {
    /// Short name: `plugins`, `aws-credentials`, `network`, `outbound-access`.
    name: &'static str,
    /// What is needed, with this recipe's values.
    detail: String,
}

/// The AMI build's prerequisites for this recipe: Packer's plugins, AWS credentials, a
/// default VPC or `subnet_id`, and outbound access for the sources the steps download.
fn amazon_prerequisites(
    recipe: &Recipe,
    template: &Template,
    vars: &BTreeMap<String, Json>,
) -> Vec<Prerequisite> {
    let var = |name: &str| vars.get(name).and_then(Json::as_str).unwrap_or("");
    let region = var("region");
    let copies: Vec<&str> = vars
        .get("ami_regions")
        .and_then(Json::as_array)
        .map(|a| a.iter().filter_map(Json::as_str).collect())
        .unwrap_or_default();
    let mut out = Vec::new();
    if !template.required_plugins.is_empty() {
        out.push(Prerequisite {
            name: "plugins",
            detail: format!(
                "{}: validate and build run `packer init` first, which installs them into {} \
                 (downloaded from their source over HTTPS unless already there)",
                template
                    .required_plugins
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                packer::plugin_dir()
            ),
        });
    }
    out.push(Prerequisite {
        name: "aws-credentials",
        detail: format!(
            "Packer's amazon plugin takes them from the AWS SDK's default chain \
             (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE and ~/.aws/config, \
             SSO, an instance profile); they need the EC2 permissions of an EBS-backed build \
             in {region}{}",
            if copies.is_empty() {
                String::new()
            } else {
                format!(" and ec2:CopyImage to {}", copies.join(", "))
            }
        ),
    });
    let subnet = var("subnet_id");
    out.push(Prerequisite {
        name: "network",
        detail: if subnet.is_empty() {
            format!(
                "a default VPC in {region}: subnet_id is empty, so Packer launches the build \
                 instance in the default VPC (without one, pass --var subnet_id=subnet-...); \
                 Packer reaches the instance over SSH (port 22) from this machine"
            )
        } else {
            format!(
                "subnet {subnet} in {region} (subnet_id): the build instance starts there; \
                 Packer reaches it over SSH (port 22) from this machine, so it needs a public \
                 IP address or a route from here"
            )
        },
    });
    let urls: Vec<String> = recipe
        .downloads()
        .into_iter()
        .map(|(name, pin)| format!("{name} {}", pin.url))
        .collect();
    out.push(Prerequisite {
        name: "outbound-access",
        detail: format!(
            "the build instance downloads {}; and its OS's package repositories, plus AWS's \
             and NVIDIA's download sites as the recipe asks (docs/image-builder.md, \
             \"Prerequisites\"){}",
            if urls.is_empty() {
                "no pinned source".to_string()
            } else {
                format!("the pinned sources of {}: {}", recipe.sources_file.display(), urls.join(", "))
            },
            if urls.is_empty() {
                ""
            } else {
                " (build --prefetch-sources fetches and verifies the pinned sources here and uploads them instead)"
            }
        ),
    });
    out
}

/// What the schema check found, when it found no error.
struct SchemaOutcome {
    /// Labels of the schema extractions checked against.
    schemas: Vec<String>,
    /// Warnings (missing `required_tag` attributes, uncovered versions or types).
    warnings: Vec<crate::schema::Finding>,
}

/// Check the template against Packer's HCL2 schema at the current and the lowest allowed
/// versions ([`crate::schema`]); any error fails with exit 3, naming every finding.
fn schema_check(template: &Template) -> Result<SchemaOutcome> {
    use crate::schema::{self, Finding, Schema, Severity};
    let schemas = Schema::embedded()?;
    let mut findings = schema::check(&template.path, &schemas)?;
    let amazon = schema::amazon_constraint(&template.path)?;
    if let Some(lowest) = schemas.last() {
        for w in schema::version_coverage(
            template.required_version.as_deref(),
            amazon.as_deref(),
            lowest,
        ) {
            findings.push(Finding {
                severity: Severity::Warning,
                file: template.path.clone(),
                location: "packer".into(),
                message: w,
                schemas: vec![lowest.label.clone()],
            });
        }
    }
    let (errors, warnings): (Vec<Finding>, Vec<Finding>) = findings
        .into_iter()
        .partition(|f| f.severity == Severity::Error);
    for w in &warnings {
        tracing::warn!("{w}");
    }
    if !errors.is_empty() {
        let mut output = String::new();
        for f in errors.iter().chain(warnings.iter()) {
            output.push_str(&format!("{f}\n"));
        }
        return Err(Error::TemplateCheck {
            check: format!("the schema check ({} error(s))", errors.len()),
            template: template.path.clone(),
            output,
        });
    }
    Ok(SchemaOutcome {
        schemas: schemas.iter().map(|s| s.label.clone()).collect(),
        warnings,
    })
}

/// Every value declared with the right type, and every required variable set.
fn check_variables(template: &Template, vars: &BTreeMap<String, Json>) -> Result<()> {
    for (name, value) in vars {
        template.check(name, value)?;
    }
    let missing = template.missing_required(vars);
    if !missing.is_empty() {
        return Err(Error::BadInput(format!(
            "{} requires variables that are not set: {} (pass --var NAME=VALUE)",
            template.path.display(),
            missing.join(", ")
        )));
    }
    Ok(())
}

/// The agent's HealthCheckProgram, a second binary of the agent's package.
const HEALTHCHECK_BIN: &str = "slurm-node-agent-healthcheck";

/// The agent binary a build stages: `--agent-bin`, else the workspace's release or debug
/// build; `None` with `--without-agent` or where none is built.
///
/// # Errors
/// [`Error::BadInput`]: `--agent-bin` names no file.
fn agent_source(agent_bin: Option<&Path>, without_agent: bool) -> Result<Option<PathBuf>> {
    Ok(match agent_bin {
        Some(p) if p.is_file() => Some(p.to_path_buf()),
        Some(p) => {
            return Err(Error::BadInput(format!(
            "--agent-bin {}: no such file (build it: cargo build --release -p slurm-node-agent)",
            p.display()
        )))
        }
        None if without_agent => None,
        None => [
            "target/release/slurm-node-agent",
            "target/debug/slurm-node-agent",
        ]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file()),
    })
}

/// Reads the agent package at `path` ([`crate::package::AgentPackage`]) and refuses it,
/// before Packer or the local build starts, when the image cannot install or run it: a
/// `.rpm` for a Debian or Ubuntu image (or a `.deb` for an RPM one), a package for
/// another architecture than `--arch`, or programs built for another architecture or
/// needing a newer glibc than the OS has (as [`check_agent_fits`]).
///
/// # Errors
/// [`Error::BadInput`] naming the package and what does not fit.
fn fitting_package(
    path: &Path,
    recipe: &Recipe,
    packer_dir: &Path,
) -> Result<crate::package::AgentPackage> {
    let package = crate::package::AgentPackage::open(path)?;
    let named = format!("--agent-package {}", path.display());
    if package.format.family() != recipe.family {
        return Err(Error::BadInput(format!(
            "{named}: a .{} package, but {} installs .{} packages (scripts/package.sh makes both)",
            package.format.family(),
            recipe.os,
            recipe.family
        )));
    }
    if package.arch != recipe.arch {
        return Err(Error::BadInput(format!(
            "{named}: a package for {}, but the image is {} (--arch)",
            package.arch, recipe.arch
        )));
    }
    let glibc = os_glibc(recipe, packer_dir)?;
    for p in crate::package::PROGRAMS {
        crate::binary::check_fits(
            &package.program(p),
            &format!("{named} (its /{p})"),
            &recipe.arch,
            &recipe.os,
            glibc,
        )?;
    }
    Ok(package)
}

/// The OS's glibc, from the recipe ([`Recipe::os_glibc`]); an error naming
/// `local.os_catalog` when it is not a version.
fn os_glibc(recipe: &Recipe, packer_dir: &Path) -> Result<Option<crate::binary::GlibcVersion>> {
    recipe
        .os_glibc
        .as_deref()
        .map(|g| {
            crate::binary::GlibcVersion::parse(g).ok_or_else(|| Error::File {
                path: packer_dir.to_path_buf(),
                message: format!(
                    "local.os_catalog[\"{}\"].glibc: not a version: {g:?}",
                    recipe.os
                ),
            })
        })
        .transpose()
}

/// Refuses, before Packer or the local build starts, an agent binary `bin` (from
/// [`agent_source`]; `given`: `--agent-bin` named it) and the HealthCheckProgram beside it
/// that cannot start on the image: another architecture than the recipe's, or a glibc floor
/// above the OS's ([`Recipe::os_glibc`]: `glibc` of the project template's
/// `local.os_catalog`, `packer_dir`, as the recipe's OS was checked against; Debian 12's
/// for the local target).
///
/// # Errors
/// [`Error::BadInput`] naming the binary, what it needs and what the image has.
fn check_agent_fits(
    bin: Option<&Path>,
    given: bool,
    recipe: &Recipe,
    packer_dir: &Path,
) -> Result<()> {
    let Some(bin) = bin else {
        return Ok(());
    };
    let glibc = os_glibc(recipe, packer_dir)?;
    let named = |p: &Path| {
        if given && p == bin {
            format!("--agent-bin {}", p.display())
        } else {
            format!("the agent binary {}", p.display())
        }
    };
    let hc = bin.with_file_name(HEALTHCHECK_BIN);
    for p in std::iter::once(bin).chain(hc.is_file().then_some(hc.as_path())) {
        crate::binary::check_fits(p, &named(p), &recipe.arch, &recipe.os, glibc)?;
    }
    Ok(())
}

/// Put the agent build (`bin`, from [`agent_source`]) where the steps expect it (see
/// packer/scripts/70-agent.sh). Returns notes about missing parts (the steps say so again,
/// plainly).
fn assemble_agent(
    dest: &Path,
    bin: Option<&Path>,
    package: Option<&Path>,
    without_agent: bool,
    units: &Path,
    packer_dir: &Path,
) -> Result<Vec<String>> {
    let mut notes = Vec::new();
    if dest.exists() {
        std::fs::remove_dir_all(dest)
            .map_err(|e| Error::io(format!("clearing {}", dest.display()), e))?;
    }
    std::fs::create_dir_all(dest)
        .map_err(|e| Error::io(format!("creating {}", dest.display()), e))?;
    match (bin, package) {
        // 70-agent.sh installs `slurm-node-agent.deb` / `.rpm` with apt-get or dnf.
        (_, Some(p)) => {
            let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("deb");
            let to = dest.join(format!("slurm-node-agent.{ext}"));
            std::fs::copy(p, &to).map_err(|e| Error::io(format!("copying {}", p.display()), e))?;
        }
        (Some(b), None) => {
            std::fs::copy(b, dest.join("slurm-node-agent"))
                .map_err(|e| Error::io(format!("copying {}", b.display()), e))?;
            // Slurm's HealthCheckProgram, built next to the agent (same package).
            let hc = b.with_file_name(HEALTHCHECK_BIN);
            if hc.is_file() {
                std::fs::copy(&hc, dest.join(HEALTHCHECK_BIN))
                    .map_err(|e| Error::io(format!("copying {}", hc.display()), e))?;
            } else {
                notes.push(format!(
                    "no {HEALTHCHECK_BIN} next to {} (cargo build --release -p slurm-node-agent builds both)",
                    b.display()
                ));
            }
        }
        (None, None) if without_agent => notes.push("built --without-agent".into()),
        (None, None) => {
            notes.push("no slurm-node-agent binary (pass --agent-bin or build it)".into())
        }
    }
    if units.is_dir() {
        local::copy_tree(units, &dest.join("units"))?;
    } else {
        notes.push(format!("no units folder at {}", units.display()));
    }
    let settings = packer_dir.join("files/agent.toml");
    if settings.is_file() {
        std::fs::copy(&settings, dest.join("agent.toml"))
            .map_err(|e| Error::io(format!("copying {}", settings.display()), e))?;
    }
    Ok(notes)
}

/// The version recorded on the image when `--agent-version` was not given: what the staged
/// agent says of itself (`slurm-node-agent --version` prints
/// `slurm-node-agent X.Y.Z (commit C)`: the second word), so that an image's tags and
/// build-info name the agent it carries. `None` when a version
/// was given (`--agent-version` or `--var agent_version=`), no agent is staged, or it
/// cannot run here (another architecture: a note says so and the default stays).
fn staged_agent_version(
    agent_dir: &Path,
    recipe: &crate::recipe::Recipe,
    notes: &mut Vec<String>,
) -> Option<String> {
    if recipe.agent_version != crate::recipe::DEFAULT_AGENT_VERSION {
        return None;
    }
    let bin = agent_dir.join("slurm-node-agent");
    if !bin.is_file() {
        return None;
    }
    let out = match std::process::Command::new(&bin)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .output()
    {
        Ok(out) if out.status.success() => out,
        Ok(out) => {
            notes.push(format!(
                "{} --version failed ({}): the image records agent version {} (pass --agent-version)",
                bin.display(),
                out.status,
                recipe.agent_version
            ));
            return None;
        }
        Err(e) => {
            notes.push(format!(
                "{} --version could not run here ({e}; another architecture?): the image records agent version {} (pass --agent-version)",
                bin.display(),
                recipe.agent_version
            ));
            return None;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text.split_whitespace().nth(1).filter(|v| {
        v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+'))
    })?;
    Some(version.to_string())
}

/// This month, `YYYY-MM` (UTC), to compare with the ends of support.
fn this_month() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()[..7].to_string()
}

/// The file provisioners upload `var.agent_dir` and `var.sources_dir`, and Packer checks
/// at validate time that they exist: point both at absolute, existing (empty) folders under
/// `dir` unless the caller set them.
fn staging_dirs(dir: &Path, vars: &mut BTreeMap<String, Json>) -> Result<()> {
    for name in ["agent_dir", "sources_dir"] {
        let path = match vars.get(name).and_then(Json::as_str) {
            Some(p) => absolute(Path::new(p))?,
            None => dir.join(name),
        };
        std::fs::create_dir_all(&path)
            .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
        vars.insert(name.to_string(), json!(path));
    }
    Ok(())
}

/// Where the packer folder is when `--packer-dir` is not given, in this order:
/// `<exe>/../share/slurm-image-builder/packer` (an install under a prefix such as
/// /usr/local), `/usr/share/slurm-image-builder/packer` (the documented system path), the
/// `packer/` folder of the source tree the binary was built in (found above the binary),
/// `./packer`. A folder counts when it holds `node.pkr.hcl`. Error (exit 2) naming them all.
pub fn default_packer_dir() -> Result<PathBuf> {
    let mut tried = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        if let Some(bin) = exe.parent() {
            tried.push(bin.join("../share/slurm-image-builder/packer"));
        }
    }
    tried.push(PathBuf::from("/usr/share/slurm-image-builder/packer"));
    if let Ok(exe) = std::env::current_exe() {
        if let Some(tree) = exe.ancestors().skip(1).find(|a| {
            a.join("packer/node.pkr.hcl").is_file() && a.join("imagebuilder/Cargo.toml").is_file()
        }) {
            tried.push(tree.join("packer"));
        }
    }
    tried.push(PathBuf::from("packer"));
    match tried.iter().find(|d| d.join("node.pkr.hcl").is_file()) {
        Some(found) => absolute(found),
        None => Err(Error::BadInput(format!(
            "no packer folder found (tried {}); pass --packer-dir or set SIB_PACKER_DIR",
            tried
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

fn absolute(p: &Path) -> Result<PathBuf> {
    std::path::absolute(p).map_err(|e| Error::io(format!("resolving {}", p.display()), e))
}

fn tempfile_dir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("slurm-image-builder-{}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    Ok(dir)
}

/// Write a file atomically (temporary file in the same folder, then rename).
pub fn write_atomic(path: &Path, content: &str) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("file"),
        std::process::id()
    ));
    std::fs::write(&tmp, content)
        .map_err(|e| Error::io(format!("writing {}", tmp.display()), e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(format!("renaming to {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    #[test]
    fn cli_is_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
