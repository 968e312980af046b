//! `slurm-image-builder`: bakes Slurm compute node images from the project's `packer/`
//! templates and publishes their ids to SSM.
//!
//! - [`recipe`]: versions, pins (`packer/sources.toml`) and the OS catalog → Packer variables;
//! - [`template`]: reading templates with hcl-rs (variables, `required_version`, locals);
//! - [`schema`]: checking templates against Packer's HCL2 schema (embedded extractions);
//! - [`packer`]: running Packer (version, fmt, validate, build with cancellation);
//! - [`machine_readable`]: parsing `-machine-readable` output and the manifest;
//! - [`sources`]: sha256-verified downloads;
//! - [`keys`]: the signing-key pins of `packer/files/keys/`;
//! - [`binary`]: what an agent binary needs (architecture, glibc floor); [`package`]: an
//!   agent `.deb` or `.rpm` (`--agent-package`), read and unpacked to check its programs;
//! - [`publish`]: the SSM parameter nodes watch;
//! - [`local`]: the Debian 12 chroot target;
//! - [`cli`]: the command line; [`error`]: errors and exit codes; [`manual`]: man pages
//!   and shell completions.

pub mod binary;
pub mod cli;
pub mod error;
pub mod keys;
pub mod local;
pub mod machine_readable;
pub mod manual;
pub mod package;
pub mod packer;
pub mod publish;
pub mod recipe;
pub mod schema;
pub mod sources;
pub mod template;

pub use error::{Error, Result};
