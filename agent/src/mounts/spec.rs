//! From a `[[mounts]]` entry to a checked [`MountSpec`], and from that to the `.mount` unit
//! text. Everything a setting can put into a unit file is checked here: a value that could
//! add a line, a field or a systemd specifier is refused with the key that holds it.

use std::net::Ipv4Addr;
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

/// A resolution error: the key under the entry (`source`, `options`...) and the message.
pub type SpecError = (&'static str, String);

impl MountSettings {
    /// Checks the entry and resolves it; `instance_region` is used when `region` is empty.
    ///
    /// # Errors
    /// The key within the entry and what is wrong with it.
    pub fn resolve(&self, instance_region: &str) -> Result<MountSpec, SpecError> {
        let mount_point = check_mount_point(&self.mount_point)?;
        let unit = mount_unit_name(&mount_point);
        if unit.len() > 255 {
            return Err((
                "mount_point",
                format!("{mount_point}: too long for a unit name once escaped ({} characters, at most 255)", unit.len()),
            ));
        }
        let kind = FsKind::of(&self.fs_type)?;
        let region = if self.region.is_empty() {
            instance_region
        } else {
            check_region(&self.region).map_err(|m| ("region", m))?;
            &self.region
        };
        let uses_id = !self.file_system_id.is_empty();
        if uses_id && !self.source.is_empty() {
            return Err((
                "source",
                "give either source or file_system_id, not both".into(),
            ));
        }
        if !self.mount_name.is_empty() && kind != FsKind::Lustre {
            return Err(("mount_name", "applies to type = \"lustre\" only".into()));
        }
        if !self.path.is_empty() && kind != FsKind::Efs {
            return Err((
                "path",
                "applies to type = \"efs\" with file_system_id only (put the path in source)"
                    .into(),
            ));
        }
        if uses_id && !matches!(kind, FsKind::Lustre | FsKind::Efs) {
            return Err((
                "file_system_id",
                "applies to type = \"lustre\" (FSx) and \"efs\" only".into(),
            ));
        }
        if uses_id {
            check_fs_id(&self.file_system_id).map_err(|m| ("file_system_id", m))?;
            if region.is_empty() {
                return Err((
                    "region",
                    "needed to build the DNS name from file_system_id (no instance region known)"
                        .into(),
                ));
            }
            check_region(region).map_err(|m| ("region", m))?;
        }
        let (what, fs_type) = match kind {
            FsKind::Lustre => {
                let what = if uses_id {
                    if self.mount_name.is_empty() {
                        return Err((
                            "mount_name",
                            "needed with file_system_id: the file system's MountName (aws fsx describe-file-systems)".into(),
                        ));
                    }
                    check_lustre_fsname(&self.mount_name).map_err(|m| ("mount_name", m))?;
                    format!(
                        "{}@tcp:/{}",
                        aws_dns_name(&self.file_system_id, "fsx", region),
                        self.mount_name
                    )
                } else if self.source.is_empty() {
                    return Err((
                        "source",
                        "missing: give source (`<dns-name>@tcp:/<mount-name>`) or file_system_id, region and mount_name".into(),
                    ));
                } else {
                    check_lustre_source(&self.source).map_err(|m| ("source", m))?;
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
                    check_remote_path(path).map_err(|m| ("path", m))?;
                    format!(
                        "{}:{path}",
                        aws_dns_name(&self.file_system_id, "efs", region)
                    )
                } else if self.source.is_empty() {
                    return Err((
                        "source",
                        "missing: give source (`<host>:/<path>`) or file_system_id and region"
                            .into(),
                    ));
                } else {
                    check_nfs_source(&self.source).map_err(|m| ("source", m))?;
                    self.source.clone()
                };
                (what, "nfs4".to_string())
            }
            FsKind::Nfs => {
                if self.source.is_empty() {
                    return Err(("source", "missing: `<host>:/<path>`".into()));
                }
                check_nfs_source(&self.source).map_err(|m| ("source", m))?;
                (self.source.clone(), self.fs_type.clone())
            }
            FsKind::Other => {
                if self.source.is_empty() {
                    return Err((
                        "source",
                        "missing: what to mount (for tmpfs: \"tmpfs\")".to_string(),
                    ));
                }
                check_plain_source(&self.source).map_err(|m| ("source", m))?;
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
                        return Err(("lnet", "applies to type = \"lustre\" only".into()));
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
        split_options(&opts, &mut spec).map_err(|m| ("options", m))?;
        if !self.extra_options.is_empty() {
            if let Some(o) = self
                .extra_options
                .split(',')
                .find(|o| o.starts_with("x-systemd.") && !o.starts_with("x-systemd.mount-timeout="))
            {
                return Err((
                    "extra_options",
                    format!(
                        "option {o:?}: unit dependencies go in `options` (or `lnet = true`), not in extra_options"
                    ),
                ));
            }
            split_options(&self.extra_options, &mut spec).map_err(|m| ("extra_options", m))?;
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

fn check_mount_point(p: &std::path::Path) -> Result<String, SpecError> {
    let err = |m: String| Err(("mount_point", m));
    let Some(s) = p.to_str() else {
        return err(format!("{}: not UTF-8", p.display()));
    };
    if s.is_empty() {
        return err("missing".into());
    }
    if !s.starts_with('/') {
        return err(format!("{s:?} is not an absolute path"));
    }
    if s == "/" {
        return err("\"/\" cannot be a mount point here".into());
    }
    if let Some(tree) = SYSTEM_TREES
        .iter()
        .find(|t| s == **t || s.strip_prefix(**t).is_some_and(|r| r.starts_with('/')))
    {
        return err(format!(
            "{s:?} is at or under {tree}, which belongs to the operating system: mount shared file systems elsewhere (/fsx, /home, /scratch, /shared, /opt/..., /mnt/...)"
        ));
    }
    if s.chars().any(char::is_control) {
        return err(format!("{s:?} holds a newline or control character"));
    }
    if s.contains('\\') {
        return err(format!("{s:?} holds a backslash"));
    }
    if s.ends_with('/') || s.contains("//") {
        return err(format!(
            "{s:?} is not normalized (no trailing or doubled \"/\")"
        ));
    }
    for c in s[1..].split('/') {
        if c == ".." || c == "." {
            return err(format!("{s:?} holds a {c:?} component"));
        }
        if c.trim() != c {
            return err(format!(
                "{s:?}: a path component starts or ends with whitespace"
            ));
        }
    }
    Ok(s.to_string())
}

/// `fs-` and 8 or 17 lower-case hex digits (FSx and EFS ids).
fn check_fs_id(id: &str) -> Result<(), String> {
    let hex = id.strip_prefix("fs-").unwrap_or("");
    let ok = matches!(hex.len(), 8 | 17)
        && hex
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{id:?} is not a file system id (fs- and 17 hex digits, e.g. fs-0123456789abcdef0)"
        ))
    }
}

/// Folders of the operating system no `[[mounts]]` entry may cover or mount under.
pub const SYSTEM_TREES: &[&str] = &[
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/root",
    "/run", "/sbin", "/sys", "/usr", "/var",
];

/// An AWS region name: `us-east-1`, `us-gov-west-1`, `ap-southeast-2`, `cn-north-1`.
fn check_region(r: &str) -> Result<(), String> {
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
        Err(format!("{r:?} is not an AWS region name (e.g. us-east-1)"))
    }
}

/// A Lustre file system name: 1 to 8 of `[A-Za-z0-9_-]` (FSx MountName: 8 lower-case
/// letters and digits, or `fsx`).
fn check_lustre_fsname(n: &str) -> Result<(), String> {
    let ok = (1..=8).contains(&n.len())
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{n:?} is not a Lustre file system name (1 to 8 letters, digits, _ or -)"
        ))
    }
}

/// A host: a DNS name or an IPv4 address.
fn check_host(h: &str) -> Result<(), String> {
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
        Err(format!("{h:?} is not a host name or IPv4 address"))
    }
}

/// `<nids>[:<nids>...]:/<fsname>[/<subdir>]`, each `<nids>` a comma-separated list of
/// `<host>@<network>` (`tcp`, `tcp1`, `o2ib`, `efa`...): the failover groups of the
/// Lustre MGS (mount.lustre(8)).
fn check_lustre_source(src: &str) -> Result<(), String> {
    let hint = "expected <dns-name>@tcp:/<mount-name> (FSx), or NIDs like 10.0.0.1@o2ib,10.0.0.2@o2ib:10.0.0.3@o2ib:/fs";
    let Some((nids, rest)) = src.split_once(":/") else {
        return Err(format!(
            "{src:?}: no \":/\" before the file system name; {hint}"
        ));
    };
    for group in nids.split(':') {
        for nid in group.split(',') {
            let Some((host, net)) = nid.split_once('@') else {
                return Err(format!(
                    "{src:?}: NID {nid:?} has no @<network> (e.g. @tcp); {hint}"
                ));
            };
            check_host(host).map_err(|m| format!("{src:?}: {m}; {hint}"))?;
            // LND name and optional network number: tcp, tcp1, o2ib, o2ib3, efa, kfi...
            let ok = net.starts_with(|c: char| c.is_ascii_lowercase())
                && net
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
            if !ok {
                return Err(format!(
                    "{src:?}: {net:?} is not an LNet network name (tcp, o2ib, efa...); {hint}"
                ));
            }
        }
    }
    let (fsname, subdir) = match rest.split_once('/') {
        Some((f, s)) => (f, Some(s)),
        None => (rest, None),
    };
    check_lustre_fsname(fsname).map_err(|m| format!("{src:?}: {m}"))?;
    if let Some(s) = subdir {
        check_remote_path(&format!("/{s}")).map_err(|m| format!("{src:?}: {m}"))?;
    }
    Ok(())
}

/// A path on the server: absolute, of characters that cannot end a field or a line.
fn check_remote_path(p: &str) -> Result<(), String> {
    if !p.starts_with('/') {
        return Err(format!("remote path {p:?} does not start with \"/\""));
    }
    if let Some(c) = p.chars().find(|c| !safe_char(*c)) {
        return Err(format!("remote path {p:?} holds {c:?}"));
    }
    if p.split('/').any(|c| c == "..") {
        return Err(format!("remote path {p:?} holds a \"..\" component"));
    }
    Ok(())
}

/// `<host>:/<path>` (EFS, NFS).
fn check_nfs_source(src: &str) -> Result<(), String> {
    let Some((host, path)) = src.split_once(':') else {
        return Err(format!("{src:?}: expected <host>:/<path>"));
    };
    check_host(host).map_err(|m| format!("{src:?}: {m}"))?;
    check_remote_path(path).map_err(|m| format!("{src:?}: {m}"))
}

/// Source of another file system type (`tmpfs`, a device, an image file).
fn check_plain_source(src: &str) -> Result<(), String> {
    match src.chars().find(|c| !safe_char(*c)) {
        Some(c) => Err(format!("{src:?} holds {c:?}")),
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
fn split_options(opts: &str, spec: &mut MountSpec) -> Result<(), String> {
    if opts.is_empty() {
        return Ok(());
    }
    for o in opts.split(',') {
        if o.is_empty() {
            return Err(format!(
                "{opts:?} holds an empty option (\",,\" or a trailing \",\")"
            ));
        }
        if o.contains(['\n', '\r']) {
            return Err(format!("option {o:?} holds a newline"));
        }
        if o.chars().any(char::is_whitespace) {
            return Err(format!(
                "option {o:?} holds whitespace, which separates fstab fields: one option cannot hold it"
            ));
        }
        if let Some(c) = o
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || "_.:@/=+-".contains(*c)))
        {
            return Err(format!(
                "option {o:?} holds {c:?} (allowed: letters, digits and _ . : @ / = + -)"
            ));
        }
        if let Some(x) = o.strip_prefix("x-systemd.") {
            let (name, value) = x.split_once('=').unwrap_or((x, ""));
            let unit_value = || {
                crate::systemd::validate_unit_name(value)
                    .map(|()| value.to_string())
                    .map_err(|m| format!("option {o:?}: {m}"))
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
                        return Err(format!("option {o:?}: not a duration"));
                    }
                    spec.mount_timeout = Some(value.to_string());
                }
                _ => {
                    return Err(format!(
                        "option {o:?} is not supported in the agent's mount units (supported: x-systemd.requires=, after=, before=, mount-timeout=)"
                    ))
                }
            }
            continue;
        }
        let name = o.split_once('=').map_or(o, |(n, _)| n);
        if !option_allowed(spec.kind, &spec.fs_type, name) {
            return Err(format!(
                "option {o:?} is not among the options allowed for type {} (see OPTION_* in mounts/spec.rs: mount options that run programs, load files or change unit dependencies are refused)",
                spec.fs_type
            ));
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
