//! Errors of the image builder and the exit code each one maps to.
//!
//! Exit codes (also in `--help` and in docs/image-builder.md, "Exit codes"):
//!
//! | code | meaning |
//! |-----:|---------|
//! | 0 | success |
//! | 1 | unexpected failure (I/O, a bug) |
//! | 2 | bad input: command line, unknown OS or architecture, version without checksum, undeclared or mistyped variable |
//! | 3 | template check failed (`packer fmt -check` or `packer validate`) |
//! | 4 | Packer missing, older than the template's `required_version`, or `packer init` could not install the template's plugins |
//! | 5 | a source is unreachable or its checksum does not match |
//! | 6 | the build failed (Packer, a provisioning step, or the acceptance checks) |
//! | 7 | publishing to SSM failed |
//! | 130 | cancelled by SIGINT or SIGTERM (Packer was interrupted and has exited) |

use std::path::PathBuf;

/// Exit code: unexpected failure.
pub const EXIT_FAILURE: u8 = 1;
/// Exit code: bad input.
pub const EXIT_BAD_INPUT: u8 = 2;
/// Exit code: template check failed.
pub const EXIT_TEMPLATE: u8 = 3;
/// Exit code: Packer missing or too old, or its plugins could not be installed.
pub const EXIT_PACKER: u8 = 4;
/// Exit code: source unreachable or checksum mismatch.
pub const EXIT_SOURCE: u8 = 5;
/// Exit code: build failed.
pub const EXIT_BUILD: u8 = 6;
/// Exit code: publish failed.
pub const EXIT_PUBLISH: u8 = 7;
/// Exit code: cancelled.
pub const EXIT_CANCELLED: u8 = 130;

/// Everything that can go wrong, with what a person needs to act on it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Input that cannot be used (names the input and the key).
    #[error("{0}")]
    BadInput(String),
    /// A file could not be read or parsed.
    #[error("{path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A variable passed to the template is not declared there.
    #[error("variable '{name}' is not declared in {template} (declared: {declared})")]
    UndeclaredVariable {
        /// The variable.
        name: String,
        /// Template folder or file.
        template: PathBuf,
        /// Declared names, comma separated.
        declared: String,
    },
    /// A variable's value does not fit its declared type.
    #[error(
        "variable '{name}' is declared as {expected} in {template}, but the value {value} is not"
    )]
    VariableType {
        /// The variable.
        name: String,
        /// Its declared type.
        expected: String,
        /// The value passed, quoted.
        value: String,
        /// Template folder or file.
        template: PathBuf,
    },
    /// `packer fmt -check` or `packer validate` found problems.
    #[error("{check} failed for {template}:\n{output}")]
    TemplateCheck {
        /// The command that failed.
        check: String,
        /// Template folder.
        template: PathBuf,
        /// What Packer printed.
        output: String,
    },
    /// No packer binary.
    #[error("packer not found: '{program}' is not on PATH ({path}); install Packer {required} or pass --packer")]
    PackerMissing {
        /// Program name or path tried.
        program: String,
        /// The PATH searched.
        path: String,
        /// The version the template needs.
        required: String,
    },
    /// Packer is older than the template needs (the same refusal in plan, validate and
    /// build).
    #[error("Packer {found} ({program}) is too old for {template}: it requires Packer {required} (packer.required_version); install a Packer that meets it and pass --packer PATH (or set SIB_PACKER), or put it first on PATH")]
    PackerTooOld {
        /// Version found.
        found: String,
        /// Constraint from `required_version`.
        required: String,
        /// The binary.
        program: String,
        /// Template folder.
        template: PathBuf,
    },
    /// `packer init` failed: the template's plugins are not installed.
    #[error("packer init {template} failed ({status}): could not install {plugins} into {plugin_dir}:\n{output}\n(`packer init` downloads each plugin from its source over HTTPS; without outbound access install it by hand with `packer plugins install <source> <version>` into that folder)")]
    PackerInit {
        /// Template folder or file.
        template: PathBuf,
        /// The plugin(s) named in Packer's output, else every required plugin, each with
        /// its constraint.
        plugins: String,
        /// Where the plugins were to go (PACKER_PLUGIN_PATH or Packer's default).
        plugin_dir: String,
        /// `exit status N` or the signal that ended it.
        status: String,
        /// The last lines Packer printed (stderr, else stdout).
        output: String,
    },
    /// A source could not be downloaded.
    #[error("{name}: source unreachable: {url}: {reason}")]
    SourceUnreachable {
        /// What the source is.
        name: String,
        /// Where it was fetched from.
        url: String,
        /// Why it failed.
        reason: String,
    },
    /// A source's checksum differs from the pin.
    #[error("{name}: checksum mismatch for {url}: expected sha256 {expected}, got {actual}")]
    ChecksumMismatch {
        /// What the source is.
        name: String,
        /// Where it came from.
        url: String,
        /// Pinned checksum.
        expected: String,
        /// Checksum of what arrived.
        actual: String,
    },
    /// The build failed.
    #[error("build failed: {0}")]
    Build(String),
    /// The build was cancelled by a signal.
    #[error("build cancelled by {signal}; Packer was interrupted and has exited")]
    Cancelled {
        /// SIGINT or SIGTERM.
        signal: String,
    },
    /// Publishing failed.
    #[error("publish to SSM parameter {parameter} failed: {message}")]
    Publish {
        /// The parameter.
        parameter: String,
        /// The service's message.
        message: String,
    },
    /// Moving a launch template to the new image failed.
    #[error("launch template {template}: {message}")]
    LaunchTemplate {
        /// The template's name.
        template: String,
        /// What failed and the service's message.
        message: String,
    },
    /// An I/O error with the path or program involved.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// The process exit code for this error (see the module table).
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::BadInput(_)
            | Error::File { .. }
            | Error::UndeclaredVariable { .. }
            | Error::VariableType { .. } => EXIT_BAD_INPUT,
            Error::TemplateCheck { .. } => EXIT_TEMPLATE,
            Error::PackerMissing { .. } | Error::PackerTooOld { .. } | Error::PackerInit { .. } => {
                EXIT_PACKER
            }
            Error::SourceUnreachable { .. } | Error::ChecksumMismatch { .. } => EXIT_SOURCE,
            Error::Build(_) => EXIT_BUILD,
            Error::Cancelled { .. } => EXIT_CANCELLED,
            Error::Publish { .. } | Error::LaunchTemplate { .. } => EXIT_PUBLISH,
            Error::Io { .. } => EXIT_FAILURE,
        }
    }

    /// Wrap an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

/// Result with this crate's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
