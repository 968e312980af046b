//! `slurm-node-agent support-bundle`: one `.tar.gz` an operator hands to whoever helps,
//! readable offline, in the spirit of sosreport and Amazon EKS's node log collector.
//!
//! Parts (one file each under `slurm-node-agent-support/`): `MANIFEST.txt` (every part, its
//! size, and whether it was cut or could not be read, with why), `versions.txt` (the agent,
//! `slurmd -V`, the kernel, the drivers present), `settings.txt` (every key with its
//! source, values redacted as below), the state files under `agent.state_dir`,
//! `journal.txt` (the recent journal of the agent's units, slurmd, munge and sackd),
//! `kernel.txt` (the kernel log's tail), `scontrol-show-node.txt` (slurmctld's record of the
//! node), `mounts.txt` and `scratch.txt`.
//!
//! Limits: the archive's parts together hold at most `--max-size` bytes (default 50 MiB):
//! each part gets an equal share and a part over it is cut, with a line saying how much was
//! left out; the whole collection stops at `--timeout` (default 60 s), each program run
//! with what is left of it (a program past it is killed and its part says so). A part that
//! cannot be read is listed in the manifest with why; nothing but writing the archive is
//! fatal.
//!
//! Redaction: no value the instance's user data or tags set reaches the bundle. The
//! settings show a string value only where it is the default, one of the key's fixed
//! values, or a duration; others read `<redacted: N characters, from SOURCE>`.
//! `bootstrap.json`'s copies of the user data parts and tags are redacted, and every part
//! is then scrubbed of each value the user data and tags hold (and of the settings' string
//! values redacted above), wherever it appears.
//!
//! Programs run without a shell, by absolute path or `PATH`, each with its arguments.
//!
//! `--upload s3://bucket/prefix/` then puts it in S3 (`s3:PutObject`, SSE-S3, the instance
//! profile's credentials); the SSM document `SlurmNodeAgent-SupportBundle` runs that.
//!
//! Exit codes: 0 written (and uploaded); 69 written but not uploaded; 74 the archive could
//! not be written; 78 invalid settings.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;

use super::{print_error_message, SettingsArgs};
use crate::exit::Exit;
use crate::settings::{Resolved, Source};

/// Arguments of `support-bundle`.
#[derive(Debug, Args)]
pub struct SupportBundleArgs {
    /// Settings sources.
    #[command(flatten)]
    pub settings: SettingsArgs,
    /// Where to write the archive (default
    /// `/var/tmp/slurm-node-agent-support-<node>-<time>.tar.gz`).
    #[arg(long, value_name = "PATH")]
    pub output: Option<PathBuf>,
    /// Most bytes of the parts together, e.g. `50MiB`, `10MB`, `800KiB`.
    #[arg(long, value_name = "SIZE", default_value = "50MiB", value_parser = parse_size)]
    pub max_size: u64,
    /// Longest time the collection takes, e.g. `60s`, `2m`.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Also put the archive in S3 (`s3:PutObject`, with the instance profile's
    /// credentials): `s3://bucket/prefix/` (the archive's name appended) or
    /// `s3://bucket/key.tar.gz`.
    #[arg(long, value_name = "S3URI", value_parser = parse_s3_uri)]
    pub upload: Option<S3Uri>,
}

/// An `s3://bucket[/key]` location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Uri {
    /// The bucket.
    pub bucket: String,
    /// The key, or the prefix when it is empty or ends with `/`.
    pub key: String,
}

impl S3Uri {
    /// The object key for an archive named `name`.
    pub fn key_for(&self, name: &str) -> String {
        if self.key.is_empty() || self.key.ends_with('/') {
            format!("{}{name}", self.key)
        } else {
            self.key.clone()
        }
    }
}

/// `s3://bucket/prefix/`: a bucket name as S3 allows (3 to 63 of `a-z0-9.-`), a key of
/// printable ASCII without spaces.
///
/// # Errors
/// A message naming the value and the form taken.
pub fn parse_s3_uri(s: &str) -> Result<S3Uri, String> {
    let bad = || format!("{s:?}: expected s3://bucket/prefix/ or s3://bucket/key.tar.gz");
    let rest = s.strip_prefix("s3://").ok_or_else(bad)?;
    let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
    let bucket_ok = (3..=63).contains(&bucket.len())
        && bucket
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-');
    let key_ok = key.len() <= 900 && key.chars().all(|c| c.is_ascii_graphic());
    if bucket_ok && key_ok {
        Ok(S3Uri {
            bucket: bucket.into(),
            key: key.into(),
        })
    } else {
        Err(bad())
    }
}

/// Puts `body` at `to` (named `name` under a prefix) with SSE-S3: the `s3://` location
/// written.
///
/// # Errors
/// S3's error code and message, or the transport's error.
pub async fn upload(
    client: &aws_sdk_s3::Client,
    to: &S3Uri,
    name: &str,
    body: Vec<u8>,
) -> Result<String, String> {
    use aws_sdk_s3::error::ProvideErrorMetadata as _;
    let key = to.key_for(name);
    client
        .put_object()
        .bucket(&to.bucket)
        .key(&key)
        .content_type("application/gzip")
        .server_side_encryption(aws_sdk_s3::types::ServerSideEncryption::Aes256)
        .body(body.into())
        .send()
        .await
        .map_err(|e| match (e.code(), e.message()) {
            (Some(c), m) => format!(
                "S3 PutObject s3://{}/{key}: {c}: {}",
                to.bucket,
                m.unwrap_or("")
            ),
            _ => format!(
                "S3 PutObject s3://{}/{key}: {}",
                to.bucket,
                crate::imds::error_chain(&e)
            ),
        })?;
    Ok(format!("s3://{}/{key}", to.bucket))
}

/// `50MiB`, `10MB`, `800KiB`, `1GiB` or plain bytes.
///
/// # Errors
/// A message naming the value and the forms taken.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?}: expected a size such as 50MiB, 10MB or 800KiB"))?;
    let mult = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" | "kB" => 1000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        u => {
            return Err(format!(
                "{s:?}: unknown unit {u:?}; expected B, KiB, MiB, GiB, KB, MB or GB"
            ))
        }
    };
    n.checked_mul(mult)
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{s:?}: expected a size more than 0"))
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{s:?}: {e}; expected e.g. 60s or 2m"))
        .and_then(|d| {
            if d.is_zero() {
                Err(format!("{s:?}: expected a duration more than 0"))
            } else {
                Ok(d)
            }
        })
}

/// One part of the bundle: its file name and its bytes, or why it could not be had.
#[derive(Debug, Clone)]
pub struct Part {
    /// File name inside the bundle's folder (`journal.txt`, `state/drain.json`).
    pub name: String,
    /// Its bytes, or why it could not be read.
    pub body: Result<Vec<u8>, String>,
}

impl Part {
    fn ok(name: impl Into<String>, body: Vec<u8>) -> Part {
        Part {
            name: name.into(),
            body: Ok(body),
        }
    }
}

/// The folder every part is in, inside the archive.
pub const FOLDER: &str = "slurm-node-agent-support";

impl SupportBundleArgs {
    /// Runs the command; returns the exit code.
    pub async fn run(self) -> Exit {
        let layers = match self.settings.flag_layers() {
            Ok(l) => l,
            Err(e) => {
                super::print_error(&e);
                return Exit::Config;
            }
        };
        let inputs = match crate::settings::pipeline::Inputs::read(&self.settings.paths(), &layers)
        {
            Ok(i) => i,
            Err(e) => {
                super::print_error(&e);
                return Exit::Config;
            }
        };
        // Bootstrap's record, else the files and flags alone: a bundle never waits for IMDS.
        let (resolved, node) =
            match crate::identity::resolve_local(&inputs, crate::identity::CorruptRecord::Leave) {
                Ok((r, id)) => (r, Some(id.node_name)),
                Err(_) => match inputs
                    .without_metadata()
                    .resolve(crate::settings::Enforce::WarnAndIgnore)
                {
                    Ok(r) => (r, None),
                    Err(e) => {
                        super::print_error(&e);
                        return Exit::Config;
                    }
                },
            };
        let deadline = Instant::now() + self.timeout;
        let parts = collect(&resolved, node.as_deref(), deadline).await;
        let secrets = secrets_of(&resolved);
        let bytes = match archive(parts, self.max_size, &secrets) {
            Ok(b) => b,
            Err(e) => {
                print_error_message(&format!("support bundle not written: {e}"));
                return Exit::IoErr;
            }
        };
        let path = self.output.unwrap_or_else(|| {
            PathBuf::from(format!(
                "/var/tmp/slurm-node-agent-support-{}-{}.tar.gz",
                node.as_deref().unwrap_or("unknown"),
                crate::time::format(crate::time::now()).replace(':', "")
            ))
        });
        if let Err(e) = crate::fsutil::write_atomic(&path, &bytes, 0o600, None) {
            print_error_message(&format!("support bundle not written: {e}"));
            return Exit::IoErr;
        }
        println!("{}", path.display());
        let Some(to) = &self.upload else {
            return Exit::Ok;
        };
        // The instance profile's credentials and region (the SDK's default chains).
        let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .load()
            .await;
        let name = path.file_name().map_or_else(
            || "support.tar.gz".into(),
            |n| n.to_string_lossy().into_owned(),
        );
        match upload(&aws_sdk_s3::Client::new(&sdk), to, &name, bytes).await {
            Ok(at) => {
                println!("{at}");
                Exit::Ok
            }
            Err(e) => {
                print_error_message(&format!(
                    "support bundle written to {} but not uploaded: {e}",
                    path.display()
                ));
                Exit::Unavailable
            }
        }
    }
}

/// What `resolved` was read from that must never reach the bundle: every value the user
/// data parts and tags set (bootstrap's record of them included), each string value of
/// the settings that [`settings_part`] redacts, and each part of those values of at least
/// [`MIN_SEGMENT`] characters between `/ : = , @`, spaces and quotes.
pub fn secrets_of(resolved: &Resolved) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (key, value, source, _) in resolved.entries() {
        if !shown(&key, &value, &source) {
            collect_strings(&value, &mut out);
        }
    }
    let state_dir = &resolved.settings.agent.state_dir;
    if let Some(r) =
        crate::identity::Recorded::read(state_dir, crate::identity::CorruptRecord::Leave)
    {
        out.extend(r.setting_tags.into_values());
        for part in r.user_data_settings {
            if let Ok(t) = part.text.parse::<toml::Table>() {
                collect_strings(&toml::Value::Table(t), &mut out);
            }
        }
    }
    // A value's parts too (`ssm:/site/munge-key-prod` quoted as `/site/munge-key-prod`,
    // a path's last component in a log line), where long enough to mean something.
    let segments: Vec<String> = out
        .iter()
        .flat_map(|v| v.split(['/', ':', '=', ',', '@', ' ', '"', '\'']))
        .filter(|seg| seg.len() >= MIN_SEGMENT && !v_is_whole(seg, &out))
        .map(str::to_string)
        .collect();
    out.extend(segments);
    // Short strings (`1`, `a`) would scrub half the bundle and hide nothing.
    out.retain(|s| s.len() >= 4);
    out.sort_by_key(|s| std::cmp::Reverse(s.len()));
    out.dedup();
    out
}

/// The shortest part of a redacted value that is scrubbed on its own.
const MIN_SEGMENT: usize = 10;

fn v_is_whole(seg: &str, values: &[String]) -> bool {
    values.iter().any(|v| v == seg)
}

fn collect_strings(v: &toml::Value, out: &mut Vec<String>) {
    match v {
        toml::Value::String(s) => out.push(s.clone()),
        toml::Value::Array(a) => a.iter().for_each(|x| collect_strings(x, out)),
        toml::Value::Table(t) => t.values().for_each(|x| collect_strings(x, out)),
        _ => {}
    }
}

/// Whether `value` of `key` is shown as it is: a default, a number or boolean, or a
/// string that is one of the key's fixed values or a duration.
fn shown(key: &str, value: &toml::Value, source: &Source) -> bool {
    if *source == Source::Default {
        return true;
    }
    match value {
        toml::Value::Integer(_) | toml::Value::Float(_) | toml::Value::Boolean(_) => true,
        toml::Value::String(s) => {
            humantime::parse_duration(s).is_ok()
                || crate::settings::explain::describe(key)
                    .is_some_and(|h| h.expected.contains(&format!("\"{s}\"")))
        }
        _ => false,
    }
}

/// The settings as resolved: every key, its value (or `<redacted: ...>`), its source.
pub fn settings_part(resolved: &Resolved) -> Vec<u8> {
    let mut out = String::new();
    for (key, value, source, trust) in resolved.entries() {
        let v = if shown(&key, &value, &source) {
            value.to_string()
        } else {
            format!(
                "<redacted: {} characters>",
                value.to_string().chars().count()
            )
        };
        let src = match &source {
            // A tag's key is its name; its value is what is redacted.
            Source::Tag(_) | Source::UserData(_) | Source::File(_) | Source::Flag => {
                source.to_string()
            }
            Source::Default => "default".to_string(),
        };
        out.push_str(&format!(
            "{key} = {v}    # {src}; trust: {}\n",
            trust.as_str()
        ));
    }
    out.into_bytes()
}

/// Runs `program` with `args` (no shell) until `deadline`: stdout, then stderr if any.
async fn program(program: &str, args: &[&str], deadline: Instant) -> Result<Vec<u8>, String> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err("not run: the bundle's --timeout was spent".into());
    }
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .env("LC_ALL", "C");
    let line = format!("{program} {}", args.join(" "));
    match tokio::time::timeout(left, cmd.output()).await {
        Err(_) => Err(format!("{line}: killed at the bundle's --timeout")),
        Ok(Err(e)) => Err(format!("{line}: {e}")),
        Ok(Ok(o)) => {
            let mut b = o.stdout;
            if !o.stderr.is_empty() {
                b.extend_from_slice(b"\n--- stderr ---\n");
                b.extend_from_slice(&o.stderr);
            }
            if !o.status.success() {
                b.extend_from_slice(format!("\n--- {line}: {} ---\n", o.status).as_bytes());
            }
            Ok(b)
        }
    }
}

fn file(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// The units whose journal the bundle holds.
pub const UNITS: [&str; 5] = [
    "slurm-node-agent-bootstrap.service",
    "slurm-node-agent.service",
    "slurmd.service",
    "munge.service",
    "sackd.service",
];

/// Every part, read now (programs each with what is left until `deadline`).
pub async fn collect(resolved: &Resolved, node: Option<&str>, deadline: Instant) -> Vec<Part> {
    let s = &resolved.settings;
    let mut parts = Vec::new();
    // Versions.
    let mut v = format!("slurm-node-agent {}\n", env!("CARGO_PKG_VERSION"));
    let uname = rustix::system::uname();
    v.push_str(&format!(
        "kernel: {} {} {}\n",
        uname.sysname().to_string_lossy(),
        uname.release().to_string_lossy(),
        uname.machine().to_string_lossy()
    ));
    let slurmd = s
        .slurm
        .bin_dir
        .parent()
        .map(|p| p.join("sbin/slurmd"))
        .unwrap_or_else(|| PathBuf::from("slurmd"));
    match program(&slurmd.to_string_lossy(), &["-V"], deadline).await {
        Ok(b) => v.push_str(&format!("slurmd -V: {}", String::from_utf8_lossy(&b))),
        Err(e) => v.push_str(&format!("slurmd -V: not read: {e}\n")),
    }
    for (what, path) in [
        ("nvidia driver", "/proc/driver/nvidia/version"),
        ("efa driver", "/sys/module/efa/version"),
        ("lustre", "/sys/module/lustre/version"),
    ] {
        if let Ok(t) = std::fs::read_to_string(path) {
            v.push_str(&format!("{what}: {}\n", t.trim()));
        }
    }
    parts.push(Part::ok("versions.txt", v.into_bytes()));
    parts.push(Part::ok("settings.txt", settings_part(resolved)));
    // State files.
    let state_dir = &s.agent.state_dir;
    match std::fs::read_dir(state_dir) {
        Err(e) => parts.push(Part {
            name: "state/".into(),
            body: Err(format!("{}: {e}", state_dir.display())),
        }),
        Ok(entries) => {
            let mut names: Vec<PathBuf> = entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| {
                    p.extension().is_some_and(|x| x == "json" || x == "prom") && p.is_file()
                })
                .collect();
            names.push(state_dir.join("lifecycle/state.json"));
            names.sort();
            for p in names {
                let name = p
                    .strip_prefix(state_dir)
                    .unwrap_or(&p)
                    .display()
                    .to_string();
                let body = if name == crate::identity::STATE_FILE {
                    file(&p).map(|b| redact_record(&b))
                } else {
                    file(&p)
                };
                if body.is_ok() || p.exists() {
                    parts.push(Part {
                        name: format!("state/{name}"),
                        body,
                    });
                }
            }
        }
    }
    // The journal of the units, the kernel's tail.
    let mut args = vec![
        "--no-pager",
        "-o",
        "short-iso",
        "-n",
        "20000",
        "--since",
        "-2d",
    ];
    for u in UNITS {
        args.extend(["-u", u]);
    }
    parts.push(Part {
        name: "journal.txt".into(),
        body: program("journalctl", &args, deadline).await,
    });
    parts.push(Part {
        name: "kernel.txt".into(),
        body: program(
            "journalctl",
            &["--no-pager", "-o", "short-iso", "-k", "-n", "5000"],
            deadline,
        )
        .await,
    });
    // slurmctld's record of the node.
    let scontrol = s.slurm.bin_dir.join("scontrol");
    parts.push(Part {
        name: "scontrol-show-node.txt".into(),
        body: match node {
            Some(n) => program(&scontrol.to_string_lossy(), &["show", "node", n], deadline).await,
            None => Err("no NodeName known (no bootstrap record)".into()),
        },
    });
    // Mounts and scratch.
    let mut m = Vec::new();
    for p in ["/proc/self/mountinfo", "/etc/fstab"] {
        m.extend_from_slice(format!("=== {p}\n").as_bytes());
        m.extend(file(Path::new(p)).unwrap_or_else(|e| e.into_bytes()));
        m.push(b'\n');
    }
    parts.push(Part::ok("mounts.txt", m));
    let mut sc = format!(
        "scratch.enabled = {}, mount_point = {}\n",
        s.scratch.enabled,
        s.scratch.mount_point.display()
    )
    .into_bytes();
    sc.extend_from_slice(b"=== /proc/mdstat\n");
    sc.extend(file(Path::new("/proc/mdstat")).unwrap_or_else(|e| e.into_bytes()));
    sc.extend_from_slice(b"\n=== lsblk\n");
    sc.extend(
        program(
            "lsblk",
            &["-o", "NAME,SIZE,TYPE,FSTYPE,MOUNTPOINT,MODEL"],
            deadline,
        )
        .await
        .unwrap_or_else(|e| e.into_bytes()),
    );
    parts.push(Part::ok("scratch.txt", sc));
    parts
}

/// `bootstrap.json` with its copies of the user data parts and the tags' values redacted.
pub fn redact_record(bytes: &[u8]) -> Vec<u8> {
    let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(bytes) else {
        return b"<bootstrap.json is not JSON: left out>".to_vec();
    };
    if let Some(tags) = v.get_mut("setting_tags").and_then(|t| t.as_object_mut()) {
        for val in tags.values_mut() {
            *val = "<redacted>".into();
        }
    }
    if let Some(parts) = v
        .get_mut("user_data_settings")
        .and_then(|t| t.as_array_mut())
    {
        for p in parts {
            if let Some(t) = p.get_mut("text") {
                *t = "<redacted>".into();
            }
        }
    }
    serde_json::to_vec_pretty(&v).unwrap_or_default()
}

/// `bytes` with every one of `secrets` replaced by `<redacted>`.
fn scrub(bytes: &[u8], secrets: &[String]) -> Vec<u8> {
    let mut text = String::from_utf8_lossy(bytes).into_owned();
    for s in secrets {
        if text.contains(s.as_str()) {
            text = text.replace(s.as_str(), "<redacted>");
        }
    }
    text.into_bytes()
}

/// The archive: every part scrubbed of `secrets` and cut to its share of `max_size`, and
/// `MANIFEST.txt` first, as one `.tar.gz` (files 0600, the folder [`FOLDER`]).
///
/// # Errors
/// The archive could not be assembled (an I/O error of the in-memory writer).
pub fn archive(parts: Vec<Part>, max_size: u64, secrets: &[String]) -> std::io::Result<Vec<u8>> {
    let share = usize::try_from(max_size / (parts.len() as u64 + 1)).unwrap_or(usize::MAX);
    let mut manifest = format!(
        "slurm-node-agent support bundle, {} (agent {}); each part at most {share} bytes\n",
        crate::time::format(crate::time::now()),
        env!("CARGO_PKG_VERSION")
    );
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for p in parts {
        match p.body {
            Err(why) => manifest.push_str(&format!(
                "{}: not read: {}\n",
                p.name,
                scrub_str(&why, secrets)
            )),
            Ok(b) => {
                let mut b = scrub(&b, secrets);
                let total = b.len();
                if total > share {
                    // Keep the end (the most recent lines), and say what was cut.
                    let marker = format!(
                        "[... cut by the support bundle: the first {} of {total} bytes left out (share {share} bytes of --max-size) ...]\n",
                        total - share
                    );
                    let keep = share.saturating_sub(marker.len());
                    let mut cut = marker.into_bytes();
                    cut.extend_from_slice(&b[total - keep..]);
                    b = cut;
                    manifest.push_str(&format!("{}: {total} bytes, cut to {}\n", p.name, b.len()));
                } else {
                    manifest.push_str(&format!("{}: {total} bytes\n", p.name));
                }
                files.push((p.name, b));
            }
        }
    }
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    let now = u64::try_from(crate::time::now()).unwrap_or(0);
    let mut add = |name: &str, body: &[u8]| -> std::io::Result<()> {
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_mode(0o600);
        h.set_mtime(now);
        h.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut h, format!("{FOLDER}/{name}"), body)
    };
    add("MANIFEST.txt", manifest.as_bytes())?;
    for (name, body) in &files {
        add(name, body)?;
    }
    let mut gz = tar.into_inner()?;
    gz.flush()?;
    gz.finish()
}

fn scrub_str(s: &str, secrets: &[String]) -> String {
    String::from_utf8_lossy(&scrub(s.as_bytes(), secrets)).into_owned()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::settings::{Layer, TAG_PREFIX};
    use std::io::Read as _;

    /// The archive's files, name to bytes.
    fn unpack(gz: &[u8]) -> Vec<(String, Vec<u8>)> {
        let mut t = tar::Archive::new(flate2::read::GzDecoder::new(gz));
        t.entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let name = e.path().unwrap().display().to_string();
                let mut b = Vec::new();
                e.read_to_end(&mut b).unwrap();
                (name, b)
            })
            .collect()
    }

    /// Issue 44 §1: a secret planted in a user data part, in an instance tag and in a
    /// settings file (and bootstrap's record of the first two) never reaches the bundle's
    /// bytes, compressed or not; the settings part names each key and its source, with the
    /// value redacted.
    #[tokio::test]
    async fn secrets_in_user_data_tags_and_files_never_reach_the_bundle() {
        const UD: &str = "ud-secret-7f3a9c";
        const TAG: &str = "tag-secret-5d21e0";
        const FILE: &str = "file-secret-c4b8a1";
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).unwrap();
        let ud_text = format!("[auth]\nkey_source = \"ssm:/{UD}\"\n");
        let tag_key = format!("{TAG_PREFIX}node.features");
        let layers = vec![
            Layer::from_toml(
                Source::File("/etc/slurm-node-agent/agent.toml".into()),
                &format!(
                    "[agent]\nstate_dir = {:?}\n[upgrade]\nparameter = \"/{FILE}\"\n[health]\ninterval = \"5m\"\n",
                    state.display()
                ),
            )
            .unwrap(),
            Layer::from_toml(Source::UserData(1), &ud_text).unwrap(),
            Layer::from_key_value(Source::Tag(tag_key.clone()), "node.features", TAG).unwrap(),
        ];
        let resolved = Resolved::merge(&layers).unwrap();
        // Bootstrap's record keeps the user data part and the tags it read.
        let record = crate::identity::Recorded {
            node_name: "compute-1".into(),
            instance_id: "i-0123456789abcdef0".into(),
            ami_id: "ami-0123456789abcdef0".into(),
            dynamic_conf: None,
            setting_tags: [(tag_key.clone(), TAG.to_string())].into(),
            user_data_settings: vec![crate::userdata::SettingsPart {
                index: 1,
                text: ud_text.clone(),
            }],
        };
        std::fs::write(
            state.join(crate::identity::STATE_FILE),
            serde_json::to_vec(&record).unwrap(),
        )
        .unwrap();
        // A state file that quotes a secret (a drain reason an operator pasted it into).
        // (without the value's leading `/`).
        std::fs::write(
            state.join("drain.json"),
            format!("{{\"reason\":\"{FILE}\"}}"),
        )
        .unwrap();
        let parts = collect(
            &resolved,
            Some("compute-1"),
            Instant::now() + Duration::from_secs(20),
        )
        .await;
        let secrets = secrets_of(&resolved);
        let gz = archive(parts, 50 << 20, &secrets).unwrap();
        for needle in [UD, TAG, FILE] {
            assert!(
                !gz.windows(needle.len()).any(|w| w == needle.as_bytes()),
                "{needle} in the compressed bytes"
            );
        }
        let files = unpack(&gz);
        for (name, body) in &files {
            let text = String::from_utf8_lossy(body);
            for needle in [UD, TAG, FILE] {
                assert!(
                    !name.contains(needle) && !text.contains(needle),
                    "{needle} in {name}:\n{text}"
                );
            }
        }
        let get = |n: &str| {
            files
                .iter()
                .find(|(name, _)| name == &format!("{FOLDER}/{n}"))
                .map(|(_, b)| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_else(|| {
                    panic!(
                        "no {n} in {:?}",
                        files.iter().map(|f| &f.0).collect::<Vec<_>>()
                    )
                })
        };
        let settings = get("settings.txt");
        assert!(
            settings.contains("auth.key_source = <redacted: "),
            "{settings}"
        );
        assert!(settings.contains("# user data part 1 ("), "{settings}");
        assert!(
            settings.contains("node.features = <redacted: "),
            "{settings}"
        );
        assert!(
            settings.contains(&format!("# instance tag {tag_key:?}")),
            "{settings}"
        );
        assert!(
            settings.contains("upgrade.parameter = <redacted: "),
            "{settings}"
        );
        // What is no secret stays readable: a duration, a default.
        assert!(settings.contains("health.interval = \"5m\""), "{settings}");
        assert!(
            settings.contains("node.role = \"compute\"    # default"),
            "{settings}"
        );
        let rec = get("state/bootstrap.json");
        assert!(rec.contains("\"node_name\": \"compute-1\""), "{rec}");
        assert!(rec.contains("<redacted>"), "{rec}");
        let manifest = get("MANIFEST.txt");
        assert!(manifest.contains("versions.txt: "), "{manifest}");
        assert!(get("versions.txt").starts_with("slurm-node-agent "));
    }

    /// A part over its share is cut from the front with a marker saying how much; a part
    /// that cannot be read is listed with why, and the rest is still written.
    #[test]
    fn parts_over_their_share_are_cut_and_unreadable_ones_listed() {
        let big = "line of the journal\n".repeat(10_000);
        let parts = vec![
            Part::ok("journal.txt", big.clone().into_bytes()),
            Part {
                name: "kernel.txt".into(),
                body: Err("journalctl: No such file or directory".into()),
            },
        ];
        let gz = archive(parts, 30_000, &[]).unwrap();
        let files = unpack(&gz);
        let journal = &files
            .iter()
            .find(|f| f.0.ends_with("journal.txt"))
            .unwrap()
            .1;
        assert!(journal.len() <= 10_000, "{}", journal.len());
        let text = String::from_utf8_lossy(journal);
        assert!(
            text.starts_with("[... cut by the support bundle: the first "),
            "{}",
            &text[..200]
        );
        assert!(text.ends_with("line of the journal\n"));
        let manifest = String::from_utf8_lossy(&files[0].1).into_owned();
        assert!(files[0].0.ends_with("MANIFEST.txt"));
        assert!(
            manifest.contains(&format!("journal.txt: {} bytes, cut to ", big.len())),
            "{manifest}"
        );
        assert!(
            manifest.contains("kernel.txt: not read: journalctl: No such file or directory"),
            "{manifest}"
        );
        assert!(!files.iter().any(|f| f.0.ends_with("kernel.txt")));
    }

    /// `--upload`: the archive lands in S3 (moto) under the prefix, byte for byte; a bucket
    /// that does not exist is S3's error, named.
    #[tokio::test]
    async fn the_archive_is_put_in_s3_under_the_prefix() {
        let moto = slurm_e2e::moto::Moto::start().unwrap();
        moto.create_bucket("support-bundles", false).unwrap();
        let creds = aws_sdk_s3::config::Credentials::new("testing", "testing", None, None, "test");
        let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new("us-east-1"))
            .credentials_provider(creds)
            .endpoint_url(format!("http://127.0.0.1:{}", moto.port()))
            .load()
            .await;
        let client = aws_sdk_s3::Client::from_conf(
            aws_sdk_s3::config::Builder::from(&sdk)
                .force_path_style(true)
                .build(),
        );
        let body = archive(vec![Part::ok("versions.txt", b"x".to_vec())], 1 << 20, &[]).unwrap();
        let to = parse_s3_uri("s3://support-bundles/node-case-42/").unwrap();
        let at = upload(&client, &to, "b.tar.gz", body.clone())
            .await
            .unwrap();
        assert_eq!(at, "s3://support-bundles/node-case-42/b.tar.gz");
        let got = client
            .get_object()
            .bucket("support-bundles")
            .key("node-case-42/b.tar.gz")
            .send()
            .await
            .unwrap()
            .body
            .collect()
            .await
            .unwrap()
            .into_bytes();
        assert_eq!(got.as_ref(), body.as_slice());
        let e = upload(
            &client,
            &parse_s3_uri("s3://no-such-bucket/").unwrap(),
            "b.tar.gz",
            body,
        )
        .await
        .unwrap_err();
        assert!(
            e.starts_with("S3 PutObject s3://no-such-bucket/b.tar.gz: NoSuchBucket"),
            "{e}"
        );
        for bad in [
            "s3://",
            "s3://A/x",
            "https://b/x",
            "s3://bucket/a b",
            "s3://bu",
        ] {
            assert!(parse_s3_uri(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes_read_as_written() {
        assert_eq!(parse_size("50MiB"), Ok(50 << 20));
        assert_eq!(parse_size("10MB"), Ok(10_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("50 parsecs")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_size("0").is_err());
    }
}
