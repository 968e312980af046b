//! The agent's packages (`scripts/package.sh`: cargo-deb and cargo-generate-rpm, from
//! agent/Cargo.toml's metadata), made from the debug build the suite has already made
//! (`--profile dev --no-build`, so that CI does not build a release twice):
//!
//! - the `.deb` and the `.rpm` as dpkg-deb and rpm read them: both programs in /usr/bin,
//!   the units, drop-ins, tmpfiles.d, SSM documents, man pages and completions; the
//!   settings marked as configuration kept on upgrade (a dpkg conffile,
//!   `%config(noreplace)`); the dependencies (systemd, glibc 2.34); maintainer scripts that
//!   enable nothing;
//! - rpmlint finds nothing but [`RPMLINT_ACCEPTED`];
//! - the `.deb` installed with dpkg into a Debian 12 root (mmdebstrap): the files are
//!   there and the agent runs; an upgrade keeps an edited settings file and the state
//!   folder; a removal keeps the state.
//!
//! Needs root, mmdebstrap, dpkg-deb, rpm, rpmlint, cargo-deb and cargo-generate-rpm
//! (scripts/test-deps.sh), and `cargo build --workspace --bins` first.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Instant;

use slurm_e2e::fleet::repo_root;

/// The packages' version as the workspace says.
const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The upgrade's version: higher than [`VERSION`] for dpkg.
const UPGRADE: &str = "99.0.0";

/// What rpmlint 2.4 (Debian 12's) says of our .rpm that we accept, by name:
/// - `no-signature`: a site's repository signs what it serves;
/// - `no-packager-tag`, `no-group-tag`, `no-changelogname-tag`, `no-buildhost-tag`: tags
///   cargo-generate-rpm does not write and no installer needs (Group is deprecated since
///   RPM 4.14; the changelog is the git history);
/// - `invalid-license`: rpmlint 2.4's list predates Fedora's SPDX identifiers
///   (`Apache-2.0` is what Fedora and RHEL 10 write now);
/// - `only-non-binary-in-usr-lib`: /usr/lib holds systemd units and tmpfiles.d, where
///   systemd looks for a package's (an openSUSE check about architecture-independent
///   files);
/// - `unstripped-binary-or-object`: the tests package the debug build; the release build
///   is packaged with `strip = "debuginfo"` (symbols kept for backtraces);
/// - `no-manual-page-for-binary`: rpmlint 2.4 records a man page's section, not its name
///   (FilesCheck's `man_basenames.add(res.group('category'))`), so it says this of every
///   program; both pages are in the package (asserted above).
///
/// Run with `CompressExtension = "gz"`: Fedora's and RHEL's rpmbuild gzip man pages
/// (brp-compress); rpmlint's default is openSUSE's bz2.
const RPMLINT_ACCEPTED: &[&str] = &[
    "no-signature",
    "no-packager-tag",
    "no-group-tag",
    "no-changelogname-tag",
    "no-buildhost-tag",
    "invalid-license",
    "only-non-binary-in-usr-lib",
    "unstripped-binary-or-object",
    "no-manual-page-for-binary",
];

/// Files both packages carry, as absolute paths.
const FILES: &[&str] = &[
    "/usr/bin/slurm-node-agent",
    "/usr/bin/slurm-node-agent-healthcheck",
    "/usr/lib/systemd/system/slurm-node-agent.service",
    "/usr/lib/systemd/system/slurm-node-agent-bootstrap.service",
    "/usr/lib/systemd/system/slurm-node-agent-cloudwatch-config.service",
    "/usr/lib/systemd/system/slurmd.service.d/slurm-node-agent.conf",
    "/usr/lib/systemd/system/munge.service.d/slurm-node-agent.conf",
    "/usr/lib/systemd/system/sackd.service.d/slurm-node-agent.conf",
    "/usr/lib/tmpfiles.d/slurm-node-agent.conf",
    "/etc/slurm-node-agent/agent.toml",
    "/etc/slurm-node-agent/checks.d/10-defaults.toml",
    "/usr/share/slurm-node-agent/ssm-documents/SlurmNodeAgent-Drain.json",
    "/usr/share/slurm-node-agent/ssm-documents/SlurmNodeAgent-Status.json",
    "/usr/share/man/man1/slurm-node-agent.1.gz",
    "/usr/share/man/man1/slurm-node-agent-healthcheck.1.gz",
    "/usr/share/man/man1/slurm-node-agent-drain.1.gz",
    "/usr/share/bash-completion/completions/slurm-node-agent",
    "/usr/share/fish/vendor_completions.d/slurm-node-agent.fish",
    "/usr/share/doc/slurm-node-agent/agent.toml.example",
    "/usr/share/doc/slurm-node-agent/docs/operator-guide.md",
];

/// The settings files a site edits, kept on upgrade.
const CONFIG: &[&str] = &[
    "/etc/slurm-node-agent/agent.toml",
    "/etc/slurm-node-agent/checks.d/10-defaults.toml",
];

struct Packages {
    deb: PathBuf,
    rpm: PathBuf,
    /// The same .deb at version [`UPGRADE`].
    deb_upgrade: PathBuf,
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// package.sh into `out`; the (.deb, .rpm) it printed.
fn package(out: &Path, version: Option<&str>) -> (PathBuf, PathBuf) {
    let mut c = Command::new(repo_root().join("scripts/package.sh"));
    c.args(["--profile", "dev", "--no-build", "--fast", "--out"])
        .arg(out);
    if let Some(v) = version {
        c.args(["--version", v]);
    }
    let printed = stdout(&run(&mut c));
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(lines.len(), 2, "package.sh printed {printed:?}");
    (PathBuf::from(lines[0]), PathBuf::from(lines[1]))
}

/// Made once for all the tests of this file.
fn packages() -> &'static Packages {
    static P: OnceLock<Packages> = OnceLock::new();
    P.get_or_init(|| {
        // In the target folder, made again by each run: a static is never dropped, so a
        // temporary folder would be left behind in /tmp.
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("packages");
        if dir.exists() {
            std::fs::remove_dir_all(&dir).unwrap();
        }
        let started = Instant::now();
        let (deb, rpm) = package(&dir.join("now"), None);
        eprintln!(
            "packages: {} ({} bytes), {} ({} bytes), made in {:.1}s",
            deb.display(),
            deb.metadata().unwrap().len(),
            rpm.display(),
            rpm.metadata().unwrap().len(),
            started.elapsed().as_secs_f64()
        );
        let (deb_upgrade, _) = package(&dir.join("upgrade"), Some(UPGRADE));
        Packages {
            deb,
            rpm,
            deb_upgrade,
        }
    })
}

#[test]
fn the_deb_carries_both_programs_the_units_and_the_settings_as_conffiles() {
    let p = packages();
    let fields = |f: &str| {
        stdout(&run(Command::new("dpkg-deb")
            .args(["-f"])
            .arg(&p.deb)
            .arg(f)))
        .trim()
        .to_string()
    };
    assert_eq!(fields("Package"), "slurm-node-agent");
    assert_eq!(fields("Version"), format!("{VERSION}-1"));
    assert_eq!(fields("Architecture"), "amd64");
    let depends: Vec<String> = fields("Depends")
        .split(',')
        .map(|d| d.trim().to_string())
        .collect();
    assert!(
        depends.contains(&"libc6 (>= 2.34)".to_string()),
        "{depends:?}"
    );
    assert!(depends.contains(&"systemd".to_string()), "{depends:?}");

    // `-rwxr-xr-x root/root 123 2026-01-01 00:00 ./usr/bin/slurm-node-agent`
    let listing = stdout(&run(Command::new("dpkg-deb").arg("-c").arg(&p.deb)));
    let entries: Vec<(&str, &str)> = listing
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            Some((*w.first()?, w.get(5)?.trim_start_matches('.')))
        })
        .collect();
    for f in FILES {
        assert!(
            entries.iter().any(|(_, p)| p == f),
            "{f} not in the .deb:\n{listing}"
        );
    }
    for bin in [
        "/usr/bin/slurm-node-agent",
        "/usr/bin/slurm-node-agent-healthcheck",
    ] {
        let mode = entries.iter().find(|(_, p)| *p == bin).unwrap().0;
        assert_eq!(mode, "-rwxr-xr-x", "{bin}");
    }
    assert!(
        !entries.iter().any(|(_, p)| p.starts_with("/usr/local")),
        "a package never installs under /usr/local:\n{listing}"
    );
    assert!(
        !entries.iter().any(|(_, p)| p.starts_with("/var/lib")),
        "the state folder is not the package's (removal would take it):\n{listing}"
    );

    let control = tempfile::tempdir().unwrap();
    run(Command::new("dpkg-deb")
        .arg("--control")
        .arg(&p.deb)
        .arg(control.path()));
    let conffiles = std::fs::read_to_string(control.path().join("conffiles")).unwrap();
    let mut listed: Vec<&str> = conffiles.lines().collect();
    listed.sort();
    assert_eq!(listed, CONFIG);
    for script in ["postinst", "postrm"] {
        let text = std::fs::read_to_string(control.path().join(script)).unwrap();
        assert!(
            text.contains("systemctl daemon-reload"),
            "{script}:\n{text}"
        );
        assert_no_enable(script, &text);
    }
    for script in ["preinst", "prerm"] {
        assert!(!control.path().join(script).exists(), "{script}");
    }
}

/// Maintainer scripts install units, never enable or start them (an image does).
fn assert_no_enable(what: &str, text: &str) {
    for word in ["enable", "start", "deb-systemd-helper", "preset"] {
        let code = text
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(!code.contains(word), "{what} runs `{word}`:\n{text}");
    }
}

#[test]
fn the_rpm_requires_systemd_and_glibc_2_34_and_keeps_the_settings() {
    let p = packages();
    let q = |args: &[&str]| stdout(&run(Command::new("rpm").arg("-qp").args(args).arg(&p.rpm)));
    assert_eq!(
        q(&["--queryformat", "%{NAME} %{VERSION} %{ARCH}"]),
        format!("slurm-node-agent {VERSION} x86_64")
    );
    let requires = q(&["--requires"]);
    let requires: Vec<&str> = requires.lines().map(str::trim).collect();
    assert!(requires.contains(&"glibc >= 2.34"), "{requires:?}");
    assert!(requires.contains(&"systemd"), "{requires:?}");
    // rpm's own scan of the binaries: no libc symbol version above the floor.
    for r in &requires {
        if let Some(v) = r
            .strip_prefix("libc.so.6(GLIBC_")
            .and_then(|v| v.strip_suffix(")(64bit)"))
        {
            let key: Vec<u32> = v.split('.').map(|n| n.parse().unwrap()).collect();
            assert!(key <= vec![2, 34], "{r} is above the glibc 2.34 floor");
        }
    }
    let list = q(&["-l"]);
    for f in FILES {
        assert!(
            list.lines().any(|l| l == *f),
            "{f} not in the .rpm:\n{list}"
        );
    }
    assert!(!list.contains("/usr/local"), "{list}");
    assert!(!list.contains("/var/lib"), "{list}");
    // %config(noreplace): flags "c" and "n" (rpm's fflags).
    let flags = q(&["--queryformat", "[%{FILENAMES} %{FILEFLAGS:fflags}\n]"]);
    for c in CONFIG {
        let f = flags
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{c} ")))
            .unwrap_or_else(|| panic!("{c} not in:\n{flags}"));
        assert!(f.contains('c') && f.contains('n'), "{c}: flags {f:?}");
    }
    let modes = q(&["--queryformat", "[%{FILENAMES} %{FILEMODES:perms}\n]"]);
    for bin in [
        "/usr/bin/slurm-node-agent",
        "/usr/bin/slurm-node-agent-healthcheck",
    ] {
        assert!(
            modes.lines().any(|l| l == format!("{bin} -rwxr-xr-x")),
            "{bin}:\n{modes}"
        );
    }
    let scripts = q(&["--scripts"]);
    assert!(scripts.contains("postinstall scriptlet"), "{scripts}");
    assert!(scripts.contains("systemctl daemon-reload"), "{scripts}");
    assert_no_enable("the .rpm's scriptlets", &scripts);
}

#[test]
fn rpmlint_finds_only_what_we_accept() {
    let p = packages();
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), "CompressExtension = \"gz\"\n").unwrap();
    let out = Command::new("rpmlint")
        .arg("--config")
        .arg(config.path())
        .arg(&p.rpm)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = stdout(&out);
    // `slurm-node-agent.x86_64: W: no-manual-page-for-binary slurm-node-agent`
    let found: std::collections::BTreeSet<&str> = text
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("slurm-node-agent.x86_64: ")?;
            let rest = rest
                .strip_prefix("E: ")
                .or_else(|| rest.strip_prefix("W: "))?;
            rest.split_whitespace().next()
        })
        .collect();
    assert!(
        text.contains("1 packages and 0 specfiles checked"),
        "{text}"
    );
    let unexpected: Vec<&&str> = found
        .iter()
        .filter(|f| !RPMLINT_ACCEPTED.contains(f))
        .collect();
    assert!(unexpected.is_empty(), "rpmlint: {unexpected:?}\n{text}");
}

/// A Debian 12 root with systemd (the package's dependency) by mmdebstrap, with the fleet's
/// apt cache when there is one (read only).
fn debian_root(dir: &Path) -> PathBuf {
    let root = dir.join("root");
    let mut c = Command::new("mmdebstrap");
    c.args(["--variant=minbase", "--quiet", "--include=systemd"]);
    let cache = Path::new(slurm_e2e::fleet::DEFAULT_CACHE).join("apt");
    if cache.is_dir() {
        c.arg("--skip=essential/unlink")
            .arg("--setup-hook=mkdir -p \"$1\"/var/cache/apt/archives/")
            .arg(format!(
                "--setup-hook=sync-in {} /var/cache/apt/archives/",
                cache.display()
            ));
    }
    c.arg("bookworm").arg(&root);
    let started = Instant::now();
    run(&mut c);
    eprintln!(
        "Debian 12 root made in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    root
}

/// `args` chrooted into `root` in a private mount namespace with /proc; must succeed.
fn in_root(root: &Path, args: &[&str]) -> Output {
    run(&mut root_command(root, args))
}

fn root_command(root: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("unshare");
    c.args(["--mount", "--fork", "--pid"])
        .arg(format!("--mount-proc={}", root.join("proc").display()))
        .arg("chroot")
        .arg(root)
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::null());
    c
}

fn dpkg_install(root: &Path, deb: &Path) -> f64 {
    std::fs::copy(deb, root.join("tmp/agent.deb")).unwrap();
    let started = Instant::now();
    in_root(root, &["dpkg", "-i", "/tmp/agent.deb"]);
    let secs = started.elapsed().as_secs_f64();
    std::fs::remove_file(root.join("tmp/agent.deb")).unwrap();
    secs
}

#[test]
fn the_deb_installs_upgrades_and_removes_in_debian_12_keeping_settings_and_state() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: needs root (mmdebstrap, chroot)");
        return;
    }
    let p = packages();
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let root = debian_root(dir.path());
    let at = |f: &str| root.join(f.trim_start_matches('/'));

    let secs = dpkg_install(&root, &p.deb);
    eprintln!("dpkg -i took {secs:.1}s");
    for f in FILES {
        assert!(at(f).is_file(), "{f} not installed");
    }
    let version = stdout(&in_root(&root, &["slurm-node-agent", "--version"]));
    assert!(
        version.starts_with(&format!("slurm-node-agent {VERSION} (commit ")),
        "{version}"
    );
    in_root(&root, &["slurm-node-agent-healthcheck", "--version"]);
    // The state folder, by tmpfiles.d from postinst; the units installed, not enabled.
    assert!(at("/var/lib/slurm-node-agent").is_dir());
    for unit in [
        "slurm-node-agent.service",
        "slurm-node-agent-bootstrap.service",
        "slurm-node-agent-cloudwatch-config.service",
    ] {
        let out = root_command(&root, &["systemctl", "is-enabled", unit])
            .output()
            .unwrap();
        assert_eq!(stdout(&out).trim(), "disabled", "{unit}: {out:?}");
    }

    // The site edits its settings, the agent keeps state; then the upgrade.
    let settings = at("/etc/slurm-node-agent/agent.toml");
    let mut edited = std::fs::read_to_string(&settings).unwrap();
    edited.push_str("\n# site edit\n[health]\ninterval = \"7m\"\n");
    std::fs::write(&settings, &edited).unwrap();
    let state = at("/var/lib/slurm-node-agent/bootstrap.json");
    std::fs::write(&state, "{\"joined\": true}\n").unwrap();
    dpkg_install(&root, &p.deb_upgrade);
    let installed = stdout(&in_root(
        &root,
        &["dpkg-query", "-W", "-f", "${Version}", "slurm-node-agent"],
    ));
    assert_eq!(installed, format!("{UPGRADE}-1"));
    assert_eq!(std::fs::read_to_string(&settings).unwrap(), edited);
    assert_eq!(
        std::fs::read_to_string(&state).unwrap(),
        "{\"joined\": true}\n"
    );

    in_root(&root, &["dpkg", "-r", "slurm-node-agent"]);
    assert!(!at("/usr/bin/slurm-node-agent").exists());
    assert!(!at("/usr/lib/systemd/system/slurm-node-agent.service").exists());
    assert_eq!(
        std::fs::read_to_string(&state).unwrap(),
        "{\"joined\": true}\n",
        "removal keeps the state"
    );
    // dpkg keeps a removed package's conffiles until purge.
    assert_eq!(std::fs::read_to_string(&settings).unwrap(), edited);
}
