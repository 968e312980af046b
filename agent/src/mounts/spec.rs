//! From a `[[mounts]]` entry to a checked [`MountSpec`], and from that to the `.mount` unit
//! text. Everything a setting can put into a unit file is checked here: a value that could
//! add a line, a field or a systemd specifier is refused with the key that holds it.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use super::escape::mount_unit_name;
use super::{FsKind, MountSettings};

/// First line of every unit file the agent writes: a unit without it is someone else's
/// and is left alone.
pub const MARKER: &str =
    "# Managed by slurm-node-agent ([[mounts]] in its settings): edits are overwritten.";

/// Options FSx for Lustre documents for clients ("Mounting from an Amazon EC2 instance",
/// FSx for Lustre User Guide): `relatime` and `flock`; `_netdev` marks it a network mount.
pub const LUSTRE_DEFAULT_OPTIONS: &str = "relatime,flock,_netdev";
/// What `lnet = true` adds: the mount waits for LNet to be configured (EFA-enabled FSx
/// file systems and hosts that configure LNet themselves ship an `lnet.service`).
pub const LNET_OPTION: &str = "x-systemd.requires=lnet.service";
/// Options the EFS User Guide recommends for NFS clients ("Mounting EFS file systems
/// using the NFS client").
pub const EFS_DEFAULT_OPTIONS: &str =
    "nfsvers=4.1,rsize=1048576,wsize=1048576,hard,timeo=600,retrans=2,noresvport,_netdev";
/// Plain NFS: a network mount.
pub const NFS_DEFAULT_OPTIONS: &str = "_netdev";

/// One mount, checked and resolved: what goes into the unit file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSpec {
    /// Mount point (absolute, normalized).
    pub mount_point: String,
    /// Unit name (`systemd-escape --path --suffix=mount`).
    pub unit: String,
    /// `What=`: the source.
    pub what: String,
    /// `Type=`: the kernel file system type (`lustre`, `nfs4`, `tmpfs`...).
    pub fs_type: String,
    /// Kind, which decides the checks before mounting.
    pub kind: FsKind,
    /// `Options=`, without the `x-systemd.*` options (those become unit dependencies).
    pub options: Vec<String>,
    /// Units the mount requires and is ordered after (`x-systemd.requires=`).
    pub requires: Vec<String>,
    /// Units it is ordered after (`x-systemd.after=`).
    pub after: Vec<String>,
    /// Units it is ordered before (`x-systemd.before=`).
    pub before: Vec<String>,
    /// `TimeoutSec=` (`x-systemd.mount-timeout=`), when given.
    pub mount_timeout: Option<String>,
    /// Whether the node must not take jobs without it.
    pub required: bool,
    /// How long bootstrap keeps retrying.
    pub retry_for: Duration,
}

impl MountSpec {
    /// Whether the mount is meant to be read-only (`ro` among its options).
    pub fn read_only(&self) -> bool {
        self.options.iter().any(|o| o == "ro")
    }

    /// The `.mount` unit file.
    pub fn unit_text(&self) -> String {
        let mut s = String::new();
        s.push_str(MARKER);
        s.push('\n');
        s.push_str("[Unit]\n");
        s.push_str(&format!(
            "Description=slurm-node-agent: {} {}\n",
            self.fs_type,
            spec_escape(&self.mount_point)
        ));
        if let Some(doc) = self.kind.documentation() {
            s.push_str(&format!("Documentation={doc}\n"));
        }
        // The agent retries with its own backoff: systemd's start rate limit must not
        // refuse those attempts.
        s.push_str("StartLimitIntervalSec=0\n");
        for u in &self.requires {
            s.push_str(&format!("Requires={u}\nAfter={u}\n"));
        }
        for u in &self.after {
            s.push_str(&format!("After={u}\n"));
        }
        for u in &self.before {
            s.push_str(&format!("Before={u}\n"));
        }
        s.push_str("\n[Mount]\n");
        s.push_str(&format!("What={}\n", spec_escape(&self.what)));
        s.push_str(&format!("Where={}\n", spec_escape(&self.mount_point)));
        s.push_str(&format!("Type={}\n", self.fs_type));
        if !self.options.is_empty() {
            s.push_str(&format!(
                "Options={}\n",
                spec_escape(&self.options.join(","))
            ));
        }
        if let Some(t) = &self.mount_timeout {
            s.push_str(&format!("TimeoutSec={t}\n"));
        }
        s
    }
}

/// `%` starts a specifier in `What=`, `Where=`, `Options=` (systemd.unit(5)
/// "Specifiers"): written as `%%`.
fn spec_escape(s: &str) -> String {
    s.replace('%', "%%")
}

/// What is wrong with a `[[mounts]]` entry. Each variant carries the offending value;
/// [`SpecError::key`] names the key within the entry that holds it (`source`, `options`...).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// `mount_point` is not a mount point the agent manages.
    #[error(transparent)]
    MountPoint(#[from] MountPointError),
    /// `type` is not a file system type.
    #[error("{fs_type:?} is not a file system type (lustre, efs, nfs, nfs4, tmpfs, ext4...)")]
    NotFsType {
        /// The `type` given.
        fs_type: String,
    },
    /// `region` is not an AWS region name.
    #[error("{region:?} is not an AWS region name (e.g. us-east-1)")]
    NotRegion {
        /// The region given (or the instance's).
        region: String,
    },
    /// `file_system_id` without a region: none given and none known for the instance.
    #[error("needed to build the DNS name from file_system_id (no instance region known)")]
    NoRegion {
        /// The file system id given.
        file_system_id: String,
    },
    /// Both `source` and `file_system_id`.
    #[error("give either source or file_system_id, not both")]
    SourceAndId {
        /// The source given.
        given_source: String,
        /// The file system id given.
        file_system_id: String,
    },
    /// `mount_name` for a type other than Lustre.
    #[error("applies to type = \"lustre\" only")]
    MountNameNotLustre {
        /// The entry's `type`.
        fs_type: String,
    },
    /// `path` for a type other than EFS.
    #[error("applies to type = \"efs\" with file_system_id only (put the path in source)")]
    PathNotEfs {
        /// The entry's `type`.
        fs_type: String,
    },
    /// `file_system_id` for a type other than Lustre (FSx) and EFS.
    #[error("applies to type = \"lustre\" (FSx) and \"efs\" only")]
    IdNotFsxOrEfs {
        /// The entry's `type`.
        fs_type: String,
    },
    /// `lnet = true` for a type other than Lustre.
    #[error("applies to type = \"lustre\" only")]
    LnetNotLustre {
        /// The entry's `type`.
        fs_type: String,
    },
    /// `file_system_id` is not an FSx or EFS id.
    #[error("{id:?} is not a file system id (fs- and 17 hex digits, e.g. fs-0123456789abcdef0)")]
    NotFsId {
        /// The id given.
        id: String,
    },
    /// A Lustre `file_system_id` without `mount_name`.
    #[error(
        "needed with file_system_id: the file system's MountName (aws fsx describe-file-systems)"
    )]
    NoMountName {
        /// The file system id given.
        file_system_id: String,
    },
    /// `mount_name` is not a Lustre file system name.
    #[error(transparent)]
    MountName(NotLustreFsName),
    /// No `source` (and no `file_system_id` where one would do).
    #[error("missing: {}", missing_source_hint(*.kind))]
    NoSource {
        /// The entry's kind, which decides what a source looks like.
        kind: FsKind,
    },
    /// A Lustre `source` that is not NIDs and a file system name.
    #[error("{value:?}: {problem}")]
    LustreSource {
        /// The source given.
        value: String,
        /// What is wrong with it.
        problem: LustreSourceError,
    },
    /// An EFS or NFS `source` that is not `<host>:/<path>`.
    #[error("{value:?}: {problem}")]
    NfsSource {
        /// The source given.
        value: String,
        /// What is wrong with it.
        problem: NfsSourceError,
    },
    /// The `source` of another type holds a character that could end a field or a line.
    #[error("{value:?} holds {character:?}")]
    PlainSource {
        /// The source given.
        value: String,
        /// The first character refused.
        character: char,
    },
    /// The EFS `path` is not a usable remote path.
    #[error(transparent)]
    Path(RemotePathError),
    /// One of `options` is refused.
    #[error(transparent)]
    Options(OptionError),
    /// One of `extra_options` is refused.
    #[error(transparent)]
    ExtraOptions(OptionError),
    /// A unit dependency (`x-systemd.requires=`, `after=`, `before=`) in `extra_options`.
    #[error("option {option:?}: unit dependencies go in `options` (or `lnet = true`), not in extra_options")]
    DependencyInExtraOptions {
        /// The option.
        option: String,
    },
}

impl SpecError {
    /// The key within the entry that holds the offending value: `mount_point`, `type`,
    /// `region`, `source`, `file_system_id`, `mount_name`, `path`, `lnet`, `options`,
    /// `extra_options`.
    pub fn key(&self) -> &'static str {
        match self {
            SpecError::MountPoint(_) => "mount_point",
            SpecError::NotFsType { .. } => "type",
            SpecError::NotRegion { .. } | SpecError::NoRegion { .. } => "region",
            SpecError::SourceAndId { .. }
            | SpecError::NoSource { .. }
            | SpecError::LustreSource { .. }
            | SpecError::NfsSource { .. }
            | SpecError::PlainSource { .. } => "source",
            SpecError::MountNameNotLustre { .. }
            | SpecError::NoMountName { .. }
            | SpecError::MountName(_) => "mount_name",
            SpecError::PathNotEfs { .. } | SpecError::Path(_) => "path",
            SpecError::IdNotFsxOrEfs { .. } | SpecError::NotFsId { .. } => "file_system_id",
            SpecError::LnetNotLustre { .. } => "lnet",
            SpecError::Options(_) => "options",
            SpecError::ExtraOptions(_) | SpecError::DependencyInExtraOptions { .. } => {
                "extra_options"
            }
        }
    }
}

/// What a missing `source` should look like, by kind.
fn missing_source_hint(kind: FsKind) -> &'static str {
    match kind {
        FsKind::Lustre => {
            "give source (`<dns-name>@tcp:/<mount-name>`) or file_system_id, region and mount_name"
        }
        FsKind::Efs => "give source (`<host>:/<path>`) or file_system_id and region",
        FsKind::Nfs => "`<host>:/<path>`",
        FsKind::Other => "what to mount (for tmpfs: \"tmpfs\")",
    }
}

/// What is wrong with `mount_point`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MountPointError {
    /// Not UTF-8.
    #[error("{}: not UTF-8", .path.display())]
    NotUtf8 {
        /// The path given.
        path: PathBuf,
    },
    /// Empty.
    #[error("missing")]
    Missing,
    /// Relative.
    #[error("{path:?} is not an absolute path")]
    NotAbsolute {
        /// The path given.
        path: String,
    },
    /// `/` itself.
    #[error("\"/\" cannot be a mount point here")]
    Root,
    /// At or under a folder of the operating system ([`SYSTEM_TREES`]).
    #[error("{path:?} is at or under {tree}, which belongs to the operating system: mount shared file systems elsewhere (/fsx, /home, /scratch, /shared, /opt/..., /mnt/...)")]
    SystemTree {
        /// The path given.
        path: String,
        /// The operating system's folder.
        tree: &'static str,
    },
    /// Holds a newline or another control character.
    #[error("{path:?} holds a newline or control character")]
    ControlCharacter {
        /// The path given.
        path: String,
    },
    /// Holds a backslash.
    #[error("{path:?} holds a backslash")]
    Backslash {
        /// The path given.
        path: String,
    },
    /// A trailing or doubled `/`.
    #[error("{path:?} is not normalized (no trailing or doubled \"/\")")]
    NotNormalized {
        /// The path given.
        path: String,
    },
    /// A `.` or `..` component.
    #[error("{path:?} holds a {component:?} component")]
    DotComponent {
        /// The path given.
        path: String,
        /// `.` or `..`.
        component: String,
    },
    /// A component that starts or ends with whitespace.
    #[error("{path:?}: a path component starts or ends with whitespace")]
    Whitespace {
        /// The path given.
        path: String,
    },
    /// The unit name (`systemd-escape --path`) would be longer than 255 characters.
    #[error(
        "{path}: too long for a unit name once escaped ({unit_length} characters, at most 255)"
    )]
    TooLong {
        /// The mount point.
        path: String,
        /// Length of the escaped unit name.
        unit_length: usize,
    },
}

/// A name that is not a Lustre file system name (1 to 8 of `[A-Za-z0-9_-]`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name:?} is not a Lustre file system name (1 to 8 letters, digits, _ or -)")]
pub struct NotLustreFsName {
    /// The name given.
    pub name: String,
}

/// A host that is neither a DNS name nor an IPv4 address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{host:?} is not a host name or IPv4 address")]
pub struct NotHost {
    /// The host given.
    pub host: String,
}

/// The hint that ends a Lustre source error about its NIDs.
const LUSTRE_SOURCE_HINT: &str = "expected <dns-name>@tcp:/<mount-name> (FSx), or NIDs like 10.0.0.1@o2ib,10.0.0.2@o2ib:10.0.0.3@o2ib:/fs";

/// What is wrong with a Lustre source (`<nids>[:<nids>...]:/<fsname>[/<subdir>]`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LustreSourceError {
    /// No `:/` before the file system name.
    #[error("no \":/\" before the file system name; {LUSTRE_SOURCE_HINT}")]
    NoFsName,
    /// A NID without `@<network>`.
    #[error("NID {nid:?} has no @<network> (e.g. @tcp); {LUSTRE_SOURCE_HINT}")]
    NoNetwork {
        /// The NID.
        nid: String,
    },
    /// A NID's host is not a host.
    #[error("{0}; {LUSTRE_SOURCE_HINT}")]
    Host(NotHost),
    /// A NID's network is not an LNet network name.
    #[error("{network:?} is not an LNet network name (tcp, o2ib, efa...); {LUSTRE_SOURCE_HINT}")]
    Network {
        /// The network (after `@`).
        network: String,
    },
    /// The file system name is not one.
    #[error(transparent)]
    FsName(NotLustreFsName),
    /// The subfolder is not a usable remote path.
    #[error(transparent)]
    Subdir(RemotePathError),
}

/// What is wrong with an EFS or NFS source (`<host>:/<path>`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NfsSourceError {
    /// No `:`.
    #[error("expected <host>:/<path>")]
    NoPath,
    /// The host is not a host.
    #[error(transparent)]
    Host(NotHost),
    /// The path is not a usable remote path.
    #[error(transparent)]
    Path(RemotePathError),
}

/// What is wrong with a path on the server.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemotePathError {
    /// Relative.
    #[error("remote path {path:?} does not start with \"/\"")]
    NotAbsolute {
        /// The path.
        path: String,
    },
    /// Holds a character that could end a field or a line.
    #[error("remote path {path:?} holds {character:?}")]
    Character {
        /// The path.
        path: String,
        /// The first character refused.
        character: char,
    },
    /// A `..` component.
    #[error("remote path {path:?} holds a \"..\" component")]
    DotDot {
        /// The path.
        path: String,
    },
}

/// What is wrong with a mount option (in `options` or `extra_options`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    /// An empty option (`,,` or a trailing `,`).
    #[error("{options:?} holds an empty option (\",,\" or a trailing \",\")")]
    Empty {
        /// The whole comma-separated value.
        options: String,
    },
    /// A newline.
    #[error("option {option:?} holds a newline")]
    Newline {
        /// The option.
        option: String,
    },
    /// Whitespace.
    #[error("option {option:?} holds whitespace, which separates fstab fields: one option cannot hold it")]
    Whitespace {
        /// The option.
        option: String,
    },
    /// A character outside letters, digits and `_ . : @ / = + -`.
    #[error(
        "option {option:?} holds {character:?} (allowed: letters, digits and _ . : @ / = + -)"
    )]
    Character {
        /// The option.
        option: String,
        /// The first character refused.
        character: char,
    },
    /// `x-systemd.requires=` (`after=`, `before=`) with an invalid unit name.
    #[error("option {option:?}: {source}")]
    UnitName {
        /// The option.
        option: String,
        /// The unit name in it, refused as systemd.unit(5) says.
        #[source]
        source: crate::systemd::InvalidUnitName,
    },
    /// `x-systemd.mount-timeout=` that is not a duration.
    #[error("option {option:?}: not a duration")]
    NotDuration {
        /// The option.
        option: String,
    },
    /// An `x-systemd.*` option the agent's units do not take.
    #[error("option {option:?} is not supported in the agent's mount units (supported: x-systemd.requires=, after=, before=, mount-timeout=)")]
    UnsupportedSystemd {
        /// The option.
        option: String,
    },
    /// An option not on the type's allow-list.
    #[error("option {option:?} is not among the options allowed for type {fs_type} (see OPTION_* in mounts/spec.rs: mount options that run programs, load files or change unit dependencies are refused)")]
    NotAllowed {
        /// The option.
        option: String,
        /// The kernel file system type.
        fs_type: String,
    },
}

impl MountSettings {
    /// Checks the entry and resolves it; `instance_region` is used when `region` is empty.
    ///
    /// # Errors
    /// [`SpecError`]: what is wrong, with the value; [`SpecError::key`] is the key within
    /// the entry.
    pub fn resolve(&self, instance_region: &str) -> Result<MountSpec, SpecError> {
        let mount_point = check_mount_point(&self.mount_point)?;
        let unit = mount_unit_name(&mount_point);
        if unit.len() > 255 {
            return Err(MountPointError::TooLong {
                unit_length: unit.len(),
                path: mount_point,
            }
            .into());
        }
        let kind = FsKind::of(&self.fs_type)?;
        let region = if self.region.is_empty() {
            instance_region
        } else {
            check_region(&self.region)?;
            &self.region
        };
        let uses_id = !self.file_system_id.is_empty();
        if uses_id && !self.source.is_empty() {
            return Err(SpecError::SourceAndId {
                given_source: self.source.clone(),
                file_system_id: self.file_system_id.clone(),
            });
        }
        if !self.mount_name.is_empty() && kind != FsKind::Lustre {
            return Err(SpecError::MountNameNotLustre {
                fs_type: self.fs_type.clone(),
            });
        }
        if !self.path.is_empty() && kind != FsKind::Efs {
            return Err(SpecError::PathNotEfs {
                fs_type: self.fs_type.clone(),
            });
        }
        if uses_id && !matches!(kind, FsKind::Lustre | FsKind::Efs) {
            return Err(SpecError::IdNotFsxOrEfs {
                fs_type: self.fs_type.clone(),
            });
        }
        if uses_id {
            check_fs_id(&self.file_system_id)?;
            if region.is_empty() {
                return Err(SpecError::NoRegion {
                    file_system_id: self.file_system_id.clone(),
                });
            }
            check_region(region)?;
        }
        let no_source = || SpecError::NoSource { kind };
        let (what, fs_type) = match kind {
            FsKind::Lustre => {
                let what = if uses_id {
                    if self.mount_name.is_empty() {
                        return Err(SpecError::NoMountName {
                            file_system_id: self.file_system_id.clone(),
                        });
                    }
                    check_lustre_fsname(&self.mount_name).map_err(SpecError::MountName)?;
                    format!(
                        "{}@tcp:/{}",
                        aws_dns_name(&self.file_system_id, "fsx", region),
                        self.mount_name
                    )
                } else if self.source.is_empty() {
                    return Err(no_source());
                } else {
                    check_lustre_source(&self.source).map_err(|problem| {
                        SpecError::LustreSource {
                            value: self.source.clone(),
                            problem,
                        }
                    })?;
                    self.source.clone()
                };
                (what, "lustre".to_string())
            }
            FsKind::Efs => {
                let what = if uses_id {
                    let path = if self.path.is_empty() {
                        "/"
                    } else {
                        &self.path
                    };
                    check_remote_path(path).map_err(SpecError::Path)?;
                    format!(
                        "{}:{path}",
                        aws_dns_name(&self.file_system_id, "efs", region)
                    )
                } else if self.source.is_empty() {
                    return Err(no_source());
                } else {
                    check_nfs_source(&self.source)?;
                    self.source.clone()
                };
                (what, "nfs4".to_string())
            }
            FsKind::Nfs => {
                if self.source.is_empty() {
                    return Err(no_source());
                }
                check_nfs_source(&self.source)?;
                (self.source.clone(), self.fs_type.clone())
            }
            FsKind::Other => {
                if self.source.is_empty() {
                    return Err(no_source());
                }
                check_plain_source(&self.source)?;
                (self.source.clone(), self.fs_type.clone())
            }
        };
        let mut opts = String::new();
        match &self.options {
            Some(o) => opts.push_str(o),
            None => {
                opts.push_str(kind.default_options());
                if self.lnet {
                    if kind != FsKind::Lustre {
                        return Err(SpecError::LnetNotLustre {
                            fs_type: self.fs_type.clone(),
                        });
                    }
                    opts.push(',');
                    opts.push_str(LNET_OPTION);
                }
            }
        }
        let mut spec = MountSpec {
            mount_point,
            unit,
            what,
            fs_type,
            kind,
            options: Vec::new(),
            requires: Vec::new(),
            after: Vec::new(),
            before: Vec::new(),
            mount_timeout: None,
            required: self.required,
            retry_for: self.retry_for.0,
        };
        split_options(&opts, &mut spec).map_err(SpecError::Options)?;
        if !self.extra_options.is_empty() {
            if let Some(o) = self
                .extra_options
                .split(',')
                .find(|o| o.starts_with("x-systemd.") && !o.starts_with("x-systemd.mount-timeout="))
            {
                return Err(SpecError::DependencyInExtraOptions {
                    option: o.to_string(),
                });
            }
            split_options(&self.extra_options, &mut spec).map_err(SpecError::ExtraOptions)?;
        }
        Ok(spec)
    }
}

/// `<fs-id>.<service>.<region>.amazonaws.com` (`.amazonaws.com.cn` in China regions), as
/// FSx and EFS name their file systems.
pub fn aws_dns_name(fs_id: &str, service: &str, region: &str) -> String {
    let suffix = if region.starts_with("cn-") {
        "amazonaws.com.cn"
    } else {
        "amazonaws.com"
    };
    format!("{fs_id}.{service}.{region}.{suffix}")
}

fn check_mount_point(p: &std::path::Path) -> Result<String, MountPointError> {
    use MountPointError as E;
    let Some(s) = p.to_str() else {
        return Err(E::NotUtf8 {
            path: p.to_path_buf(),
        });
    };
    let path = || s.to_string();
    if s.is_empty() {
        return Err(E::Missing);
    }
    if !s.starts_with('/') {
        return Err(E::NotAbsolute { path: path() });
    }
    if s == "/" {
        return Err(E::Root);
    }
    if let Some(tree) = SYSTEM_TREES
        .iter()
        .find(|t| s == **t || s.strip_prefix(**t).is_some_and(|r| r.starts_with('/')))
    {
        return Err(E::SystemTree { path: path(), tree });
    }
    if s.chars().any(char::is_control) {
        return Err(E::ControlCharacter { path: path() });
    }
    if s.contains('\\') {
        return Err(E::Backslash { path: path() });
    }
    if s.ends_with('/') || s.contains("//") {
        return Err(E::NotNormalized { path: path() });
    }
    for c in s[1..].split('/') {
        if c == ".." || c == "." {
            return Err(E::DotComponent {
                path: path(),
                component: c.to_string(),
            });
        }
        if c.trim() != c {
            return Err(E::Whitespace { path: path() });
        }
    }
    Ok(path())
}

/// `fs-` and 8 or 17 lower-case hex digits (FSx and EFS ids).
fn check_fs_id(id: &str) -> Result<(), SpecError> {
    let hex = id.strip_prefix("fs-").unwrap_or("");
    let ok = matches!(hex.len(), 8 | 17)
        && hex
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c));
    if ok {
        Ok(())
    } else {
        Err(SpecError::NotFsId { id: id.to_string() })
    }
}

/// Folders of the operating system no `[[mounts]]` entry may cover or mount under.
pub const SYSTEM_TREES: &[&str] = &[
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/root",
    "/run", "/sbin", "/sys", "/usr", "/var",
];

/// An AWS region name: `us-east-1`, `us-gov-west-1`, `ap-southeast-2`, `cn-north-1`.
fn check_region(r: &str) -> Result<(), SpecError> {
    let parts: Vec<&str> = r.split('-').collect();
    let ok = (3..=4).contains(&parts.len())
        && parts[0].len() == 2
        && parts[0].chars().all(|c| c.is_ascii_lowercase())
        && parts[1..parts.len() - 1]
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_lowercase()))
        && parts
            .last()
            .is_some_and(|n| (1..=2).contains(&n.len()) && n.chars().all(|c| c.is_ascii_digit()));
    if ok {
        Ok(())
    } else {
        Err(SpecError::NotRegion {
            region: r.to_string(),
        })
    }
}

/// A Lustre file system name: 1 to 8 of `[A-Za-z0-9_-]` (FSx MountName: 8 lower-case
/// letters and digits, or `fsx`).
fn check_lustre_fsname(n: &str) -> Result<(), NotLustreFsName> {
    let ok = (1..=8).contains(&n.len())
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(NotLustreFsName {
            name: n.to_string(),
        })
    }
}

/// A host: a DNS name or an IPv4 address.
fn check_host(h: &str) -> Result<(), NotHost> {
    if h.parse::<Ipv4Addr>().is_ok() {
        return Ok(());
    }
    let ok = !h.is_empty()
        && h.len() <= 253
        && h.split('.').all(|l| {
            (1..=63).contains(&l.len())
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        });
    if ok {
        Ok(())
    } else {
        Err(NotHost {
            host: h.to_string(),
        })
    }
}

/// `<nids>[:<nids>...]:/<fsname>[/<subdir>]`, each `<nids>` a comma-separated list of
/// `<host>@<network>` (`tcp`, `tcp1`, `o2ib`, `efa`...): the failover groups of the
/// Lustre MGS (mount.lustre(8)).
fn check_lustre_source(src: &str) -> Result<(), LustreSourceError> {
    let Some((nids, rest)) = src.split_once(":/") else {
        return Err(LustreSourceError::NoFsName);
    };
    for group in nids.split(':') {
        for nid in group.split(',') {
            let Some((host, net)) = nid.split_once('@') else {
                return Err(LustreSourceError::NoNetwork {
                    nid: nid.to_string(),
                });
            };
            check_host(host).map_err(LustreSourceError::Host)?;
            // LND name and optional network number: tcp, tcp1, o2ib, o2ib3, efa, kfi...
            let ok = net.starts_with(|c: char| c.is_ascii_lowercase())
                && net
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
            if !ok {
                return Err(LustreSourceError::Network {
                    network: net.to_string(),
                });
            }
        }
    }
    let (fsname, subdir) = match rest.split_once('/') {
        Some((f, s)) => (f, Some(s)),
        None => (rest, None),
    };
    check_lustre_fsname(fsname).map_err(LustreSourceError::FsName)?;
    if let Some(s) = subdir {
        check_remote_path(&format!("/{s}")).map_err(LustreSourceError::Subdir)?;
    }
    Ok(())
}

/// A path on the server: absolute, of characters that cannot end a field or a line.
fn check_remote_path(p: &str) -> Result<(), RemotePathError> {
    let path = || p.to_string();
    if !p.starts_with('/') {
        return Err(RemotePathError::NotAbsolute { path: path() });
    }
    if let Some(c) = p.chars().find(|c| !safe_char(*c)) {
        return Err(RemotePathError::Character {
            path: path(),
            character: c,
        });
    }
    if p.split('/').any(|c| c == "..") {
        return Err(RemotePathError::DotDot { path: path() });
    }
    Ok(())
}

/// `<host>:/<path>` (EFS, NFS).
fn check_nfs_source(src: &str) -> Result<(), SpecError> {
    let err = |problem| SpecError::NfsSource {
        value: src.to_string(),
        problem,
    };
    let Some((host, path)) = src.split_once(':') else {
        return Err(err(NfsSourceError::NoPath));
    };
    check_host(host).map_err(|e| err(NfsSourceError::Host(e)))?;
    check_remote_path(path).map_err(|e| err(NfsSourceError::Path(e)))
}

/// Source of another file system type (`tmpfs`, a device, an image file).
fn check_plain_source(src: &str) -> Result<(), SpecError> {
    match src.chars().find(|c| !safe_char(*c)) {
        Some(c) => Err(SpecError::PlainSource {
            value: src.to_string(),
            character: c,
        }),
        None => Ok(()),
    }
}

/// Characters allowed in sources and remote paths: no whitespace (fstab field separator),
/// control characters, quotes, backslash, `#`, `%` or `,`.
fn safe_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "/._-:@+=~".contains(c)
}

/// Splits `opts` at commas into the spec: `x-systemd.*` options into dependencies, the rest
/// into `Options=`.
fn split_options(opts: &str, spec: &mut MountSpec) -> Result<(), OptionError> {
    if opts.is_empty() {
        return Ok(());
    }
    for o in opts.split(',') {
        let option = || o.to_string();
        if o.is_empty() {
            return Err(OptionError::Empty {
                options: opts.to_string(),
            });
        }
        if o.contains(['\n', '\r']) {
            return Err(OptionError::Newline { option: option() });
        }
        if o.chars().any(char::is_whitespace) {
            return Err(OptionError::Whitespace { option: option() });
        }
        if let Some(c) = o
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || "_.:@/=+-".contains(*c)))
        {
            return Err(OptionError::Character {
                option: option(),
                character: c,
            });
        }
        if let Some(x) = o.strip_prefix("x-systemd.") {
            let (name, value) = x.split_once('=').unwrap_or((x, ""));
            let unit_value = || {
                crate::systemd::validate_unit_name(value)
                    .map(|()| value.to_string())
                    .map_err(|source| OptionError::UnitName {
                        option: option(),
                        source,
                    })
            };
            match name {
                "requires" => spec.requires.push(unit_value()?),
                "after" => spec.after.push(unit_value()?),
                "before" => spec.before.push(unit_value()?),
                "mount-timeout" => {
                    let ok = !value.is_empty()
                        && (value.chars().all(|c| c.is_ascii_digit())
                            || humantime::parse_duration(value).is_ok());
                    if !ok {
                        return Err(OptionError::NotDuration { option: option() });
                    }
                    spec.mount_timeout = Some(value.to_string());
                }
                _ => return Err(OptionError::UnsupportedSystemd { option: option() }),
            }
            continue;
        }
        let name = o.split_once('=').map_or(o, |(n, _)| n);
        if !option_allowed(spec.kind, &spec.fs_type, name) {
            return Err(OptionError::NotAllowed {
                option: option(),
                fs_type: spec.fs_type.clone(),
            });
        }
        spec.options.push(o.to_string());
    }
    Ok(())
}

/// Options any file system type may take (mount(8) "FILESYSTEM-INDEPENDENT MOUNT OPTIONS").
pub const OPTIONS_GENERIC: &[&str] = &[
    "defaults",
    "ro",
    "rw",
    "sync",
    "async",
    "dirsync",
    "atime",
    "noatime",
    "diratime",
    "nodiratime",
    "relatime",
    "norelatime",
    "strictatime",
    "nostrictatime",
    "lazytime",
    "nolazytime",
    "dev",
    "nodev",
    "exec",
    "noexec",
    "suid",
    "nosuid",
    "_netdev",
    "nofail",
    "auto",
    "noauto",
    "user_xattr",
    "nouser_xattr",
    "acl",
    "noacl",
];
/// Lustre client options (mount.lustre(8)).
pub const OPTIONS_LUSTRE: &[&str] = &[
    "flock",
    "localflock",
    "noflock",
    "lazystatfs",
    "nolazystatfs",
    "checksum",
    "nochecksum",
    "user_fid2path",
    "nouser_fid2path",
    "verbose",
    "noverbose",
    "retry",
    "network",
    "mgssec",
    "always_ping",
    "encrypt",
    "noencrypt",
    "test_dummy_encryption",
];
/// NFS and EFS client options (nfs(5)).
pub const OPTIONS_NFS: &[&str] = &[
    "nfsvers",
    "vers",
    "minorversion",
    "rsize",
    "wsize",
    "hard",
    "soft",
    "softerr",
    "timeo",
    "retrans",
    "resvport",
    "noresvport",
    "proto",
    "port",
    "mountport",
    "mountproto",
    "mounthost",
    "mountvers",
    "sec",
    "namlen",
    "acregmin",
    "acregmax",
    "acdirmin",
    "acdirmax",
    "actimeo",
    "ac",
    "noac",
    "lookupcache",
    "cto",
    "nocto",
    "local_lock",
    "lock",
    "nolock",
    "intr",
    "nointr",
    "rdirplus",
    "nordirplus",
    "fsc",
    "nofsc",
    "bg",
    "fg",
    "retry",
    "nconnect",
    "clientaddr",
    "sharecache",
    "nosharecache",
    "xprtsec",
];
/// tmpfs options (tmpfs(5)).
pub const OPTIONS_TMPFS: &[&str] = &[
    "size",
    "nr_blocks",
    "nr_inodes",
    "mode",
    "uid",
    "gid",
    "huge",
    "mpol",
    "noswap",
];
/// `fuse.sshfs` options (sshfs(1)) and the ssh options it passes on that only tune the
/// connection. Never `ssh_command`, `ProxyCommand`, `LocalCommand` and the like: they run
/// programs as root.
pub const OPTIONS_SSHFS: &[&str] = &[
    "allow_other",
    "allow_root",
    "default_permissions",
    "reconnect",
    "delay_connect",
    "idmap",
    "uid",
    "gid",
    "umask",
    "cache",
    "cache_timeout",
    "dir_cache",
    "compression",
    "follow_symlinks",
    "transform_symlinks",
    "no_readahead",
    "max_conns",
    "port",
    "Port",
    "IdentityFile",
    "StrictHostKeyChecking",
    "UserKnownHostsFile",
    "ServerAliveInterval",
    "ServerAliveCountMax",
    "ConnectTimeout",
    "Compression",
    "Ciphers",
    "BatchMode",
];
/// Block file system options (ext4(5), xfs(5)).
pub const OPTIONS_BLOCK: &[&str] = &[
    "loop",
    "discard",
    "nodiscard",
    "errors",
    "data",
    "barrier",
    "nobarrier",
    "noquota",
    "quota",
    "usrquota",
    "grpquota",
    "prjquota",
    "commit",
    "inode64",
    "largeio",
    "logbufs",
];

/// Whether a mount option (its name, before `=`) is allowed for this type.
fn option_allowed(kind: FsKind, fs_type: &str, name: &str) -> bool {
    let specific: &[&str] = match (kind, fs_type) {
        (FsKind::Lustre, _) => OPTIONS_LUSTRE,
        (FsKind::Efs | FsKind::Nfs, _) => OPTIONS_NFS,
        (_, "tmpfs") => OPTIONS_TMPFS,
        (_, "fuse.sshfs") => OPTIONS_SSHFS,
        _ => OPTIONS_BLOCK,
    };
    OPTIONS_GENERIC.contains(&name) || specific.contains(&name)
}
