//! Packer before the AMI build (issue 37, section 2): the version check, `packer init` of
//! the template's `required_plugins` into `PACKER_PLUGIN_PATH`, and the prerequisites `plan`
//! states; with a stand-in `packer` (`common::StandinPacker`) that records its calls and,
//! like Packer, refuses to validate or build while a required plugin is not installed.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;

/// Recipe flags that need no download.
const OFFLINE: &[&str] = &[
    "--slurm-source",
    "distro",
    "--slurm-version",
    "22.05.8",
    "--efa-version",
    "",
];

fn json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(out)))
}

/// `sib()` with its own stand-in Packer and plugin folder.
fn sib_with(packer: &StandinPacker, plugins: &std::path::Path) -> std::process::Command {
    let mut cmd = sib();
    cmd.env("SIB_PACKER", &packer.program)
        .env("PACKER_PLUGIN_PATH", plugins);
    cmd
}

/// The calls' first words (`version`, `init`, `fmt`, `validate`, `build`).
fn verbs(calls: &[String]) -> Vec<&str> {
    calls
        .iter()
        .map(|c| c.split_whitespace().next().unwrap_or(""))
        .collect()
}

#[test]
fn validate_and_build_run_version_then_init_then_packer_with_the_plugin_path() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    let packer = StandinPacker::new(dir.path(), "1.11.2");
    let template = repo().join("packer");
    let installed = plugins
        .path()
        .join("github.com/hashicorp/amazon/packer-plugin-amazon_v1.8.2_x5.0_linux_amd64");

    let out = run(sib_with(&packer, plugins.path()).args(["--output", "json", "validate"]));
    assert!(out.status.success(), "{}", text(&out));
    let calls = packer.calls();
    assert_eq!(
        verbs(&calls),
        ["version", "init", "fmt", "validate"],
        "{calls:#?}"
    );
    let plugin_path = format!("PACKER_PLUGIN_PATH={}", plugins.path().display());
    assert_eq!(
        calls[1],
        format!("init {} {plugin_path}", template.display())
    );
    for call in &calls {
        assert!(call.ends_with(&plugin_path), "{call}");
    }
    assert!(installed.is_file(), "packer init installed nothing");
    let init = json(&out)["init"].as_str().unwrap().to_string();
    assert!(
        init.starts_with(&format!(
            "ok: github.com/hashicorp/amazon >= 1.3.0 in {plugin_path}"
        )) && init.contains("Installed plugin github.com/hashicorp/amazon v1.8.2"),
        "{init}"
    );

    // build: version, init (the plugin is there already: nothing printed), build.
    let work = tempfile::tempdir().unwrap();
    let out = run(sib_with(&packer, plugins.path())
        .args(["--output", "json", "build", "--without-agent"])
        .args(OFFLINE)
        .args(["--region", "eu-west-1", "--work-dir"])
        .arg(work.path()));
    assert!(out.status.success(), "{}", text(&out));
    let calls = packer.calls();
    assert_eq!(
        verbs(&calls[4..]),
        ["version", "init", "build"],
        "{calls:#?}"
    );
    assert!(
        calls[6].starts_with("build -machine-readable -var-file=")
            && calls[6].ends_with(&format!("{} {plugin_path}", template.display())),
        "{}",
        calls[6]
    );
    let v = json(&out);
    assert_eq!(v["amis"]["eu-west-1"], "ami-0123456789abcdef0", "{v}");
    assert_eq!(
        v["init"],
        format!("ok: github.com/hashicorp/amazon >= 1.3.0 in {plugin_path}")
    );
}

#[test]
fn without_init_the_stand_in_refuses_as_packer_does() {
    // What the builder guards against: validate on a clean machine, plugin not installed.
    let dir = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    let packer = StandinPacker::new(dir.path(), "1.11.2");
    let out = run(std::process::Command::new(&packer.program)
        .args(["validate", "-var-file=/dev/null"])
        .arg(repo().join("packer"))
        .env("PACKER_PLUGIN_PATH", plugins.path()));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("github.com/hashicorp/amazon\n\nDid you run packer init"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_failed_init_stops_validate_and_build_naming_the_plugin_status_and_output() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    let packer = StandinPacker::new(dir.path(), "1.11.2");
    packer.init_fails(
        "Failed getting the \"github.com/hashicorp/amazon\" plugin:\n1 error occurred:\n\t* could not get releases from github.com/hashicorp/amazon: dial tcp: lookup api.github.com: no such host\n",
    );
    let plugin_path = format!("PACKER_PLUGIN_PATH={}", plugins.path().display());
    let expect = |out: &std::process::Output| {
        assert_eq!(out.status.code(), Some(4), "{}", text(out));
        let t = text(out);
        assert!(
            t.contains(&format!(
                "packer init {} failed (exit status 1): could not install the plugin github.com/hashicorp/amazon >= 1.3.0 into {plugin_path}:",
                repo().join("packer").display()
            )) && t.contains("lookup api.github.com: no such host"),
            "{t}"
        );
    };

    let out = run(sib_with(&packer, plugins.path()).arg("validate"));
    expect(&out);
    assert_eq!(verbs(&packer.calls()), ["version", "init"]);

    let work = tempfile::tempdir().unwrap();
    let out = run(sib_with(&packer, plugins.path())
        .args(["build", "--without-agent"])
        .args(OFFLINE)
        .arg("--work-dir")
        .arg(work.path()));
    expect(&out);
    assert_eq!(
        verbs(&packer.calls()),
        ["version", "init", "version", "init"]
    );
    // Nothing staged, nothing built.
    assert!(!work.path().join("agent").exists());
    assert!(!work.path().join("packer.log").exists());
}

#[test]
fn an_old_packer_is_refused_alike_by_plan_validate_and_build() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    let packer = StandinPacker::new(dir.path(), "1.9.5");
    let work = tempfile::tempdir().unwrap();
    let expected = format!(
        "error: Packer 1.9.5 ({}) is too old for {}: it requires Packer >= 1.10.0 (packer.required_version)",
        packer.program.display(),
        repo().join("packer").display()
    );
    let mut build = vec!["build", "--without-agent", "--work-dir"];
    build.push(work.path().to_str().unwrap());
    for args in [vec!["plan"], vec!["validate"], build] {
        let out = run(sib_with(&packer, plugins.path()).args(&args));
        assert_eq!(out.status.code(), Some(4), "{args:?}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        let line = err.lines().find(|l| l.starts_with("error: ")).unwrap();
        assert!(line.starts_with(&expected), "{args:?}: {line}");
    }
    // Only asked for its version: no init, no packer run, nothing downloaded.
    assert_eq!(verbs(&packer.calls()), ["version", "version", "version"]);
    assert_eq!(std::fs::read_dir(plugins.path()).unwrap().count(), 0);
}

#[test]
fn a_template_without_required_plugins_needs_no_init() {
    // The test templates use Packer 1.6.6's built-in components (no init there at all).
    let dir = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    let packer = StandinPacker::new(dir.path(), "1.6.6");
    let work = tempfile::tempdir().unwrap();
    let out = run(sib_with(&packer, plugins.path())
        .args(["--output", "json", "build", "--without-agent"])
        .args(["--template", "imagebuilder/tests/fixtures/sleep"])
        .args(OFFLINE)
        .arg("--work-dir")
        .arg(work.path()));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(verbs(&packer.calls()), ["version", "build"]);
    assert_eq!(
        json(&out)["init"],
        "not needed (imagebuilder/tests/fixtures/sleep names no required_plugins)"
    );
}

#[test]
fn plan_states_the_prerequisites_checks_packer_and_downloads_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    let packer = StandinPacker::new(dir.path(), "1.11.2");
    let out = run(sib_with(&packer, plugins.path()).args([
        "plan",
        "--region",
        "eu-west-1",
        "--ami-region",
        "eu-central-1",
    ]));
    assert!(out.status.success(), "{}", text(&out));
    let t = String::from_utf8_lossy(&out.stdout).to_string();
    let sources = repo().join("packer/sources.toml");
    for want in [
        format!(
            "Packer:        1.11.2 ({}), meets the template's required_version >= 1.10.0",
            packer.program.display()
        ),
        "Prerequisites of the build (plan checks none of them and downloads nothing):".into(),
        format!(
            "  plugins: github.com/hashicorp/amazon >= 1.3.0: validate and build run `packer init` first, which installs them into PACKER_PLUGIN_PATH={}",
            plugins.path().display()
        ),
        "  aws-credentials: Packer's amazon plugin takes them from the AWS SDK's default chain".into(),
        "EBS-backed build in eu-west-1 and ec2:CopyImage to eu-central-1".into(),
        "  network: a default VPC in eu-west-1: subnet_id is empty".into(),
        format!(
            "  outbound-access: the build instance downloads the pinned sources of {}: Slurm 25.11.7 source https://github.com/SchedMD/slurm/archive/slurm-25-11-7-1.tar.gz",
            sources.display()
        ),
    ] {
        assert!(t.contains(&want), "missing {want:?} in:\n{t}");
    }
    assert_eq!(verbs(&packer.calls()), ["version"]);
    assert_eq!(std::fs::read_dir(plugins.path()).unwrap().count(), 0);

    // A subnet of one's own; the same in JSON.
    let out = run(sib_with(&packer, plugins.path()).args([
        "--output",
        "json",
        "plan",
        "--var",
        "subnet_id=subnet-0abc",
    ]));
    assert!(out.status.success(), "{}", text(&out));
    let v = json(&out);
    let names: Vec<&str> = v["prerequisites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["plugins", "aws-credentials", "network", "outbound-access"]
    );
    assert!(v["prerequisites"][2]["detail"]
        .as_str()
        .unwrap()
        .starts_with("subnet subnet-0abc in us-east-1 (subnet_id)"));
    assert_eq!(v["packer"]["version"], "1.11.2");
    assert_eq!(v["packer"]["required_version"], ">= 1.10.0");
    assert_eq!(
        v["required_plugins"][0]["source"],
        "github.com/hashicorp/amazon"
    );

    // The local target builds without Packer: plan neither looks for it nor lists AWS.
    let out = run(sib()
        .env("SIB_PACKER", "/nonexistent/packer")
        .args(["--output", "json", "plan", "--target", "local"]));
    assert!(out.status.success(), "{}", text(&out));
    assert!(json(&out).get("prerequisites").is_none());
    // An AMI plan without Packer is refused as the build would be.
    let out = run(sib().env("SIB_PACKER", "/nonexistent/packer").arg("plan"));
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(
        text(&out).contains("packer not found: '/nonexistent/packer'"),
        "{}",
        text(&out)
    );
}

/// The exit code table: `--help` (cli::EXIT_CODES), docs/image-builder.md and
/// docs/exit-codes.md list the same codes, and say what code 4 now covers.
#[test]
fn exit_code_tables_agree() {
    let help: Vec<String> = slurm_image_builder::cli::EXIT_CODES
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect();
    let codes = [
        0,
        slurm_image_builder::error::EXIT_FAILURE,
        slurm_image_builder::error::EXIT_BAD_INPUT,
        slurm_image_builder::error::EXIT_TEMPLATE,
        slurm_image_builder::error::EXIT_PACKER,
        slurm_image_builder::error::EXIT_SOURCE,
        slurm_image_builder::error::EXIT_BUILD,
        slurm_image_builder::error::EXIT_PUBLISH,
        slurm_image_builder::error::EXIT_CANCELLED,
    ]
    .map(|c| c.to_string());
    assert_eq!(help, codes);

    let all = std::fs::read_to_string(repo().join("docs/exit-codes.md")).unwrap();
    let section = &all[all.find("### `slurm-image-builder`").unwrap()..];
    let rows: Vec<&str> = section
        .lines()
        .skip_while(|l| !l.starts_with("| code"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .collect();
    let documented: Vec<String> = rows
        .iter()
        .map(|r| r.split('|').nth(1).unwrap().trim().to_string())
        .collect();
    assert_eq!(documented, codes);

    let guide = std::fs::read_to_string(repo().join("docs/image-builder.md")).unwrap();
    let start = guide.find("\n## Exit codes").unwrap();
    let end = start + 1 + guide[start + 1..].find("\n## ").unwrap();
    let paragraph = guide[start..end].replace('\n', " ");
    assert!(paragraph.contains(" 0 ok; "), "{paragraph}");
    for code in &codes[1..] {
        assert!(
            paragraph.contains(&format!("; {code} ")),
            "docs/image-builder.md's exit codes lack {code}: {paragraph}"
        );
    }
    let help_4 = slurm_image_builder::cli::EXIT_CODES
        .lines()
        .find(|l| l.trim_start().starts_with("4 "))
        .unwrap();
    for (what, text) in [
        ("--help", help_4),
        ("docs/exit-codes.md", rows[4]),
        ("docs/image-builder.md", paragraph.as_str()),
    ] {
        assert!(text.contains("packer init"), "{what}: {text}");
    }
}

/// The image records the agent it carries: without `--agent-version`, the version the
/// staged binary prints (`slurm-node-agent --version`), not `0.0.0-dev`; a given
/// `--agent-version` or `--var agent_version=` wins.
#[test]
fn the_image_records_the_version_of_the_agent_binary_it_carries() {
    let Some(agent) = built_agent() else {
        return;
    };
    let printed = run(std::process::Command::new(&agent).arg("--version"));
    let version = String::from_utf8_lossy(&printed.stdout)
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_string();
    assert_ne!(version, "0.0.0-dev");
    let dir = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    let packer = StandinPacker::new(dir.path(), "1.11.2");
    let recorded = |extra: &[&str]| {
        let work = tempfile::tempdir().unwrap();
        let out = run(sib_with(&packer, plugins.path())
            .args(["--output", "json", "build", "--agent-bin"])
            .arg(&agent)
            .args(OFFLINE)
            .args(extra)
            .args(["--region", "eu-west-1", "--work-dir"])
            .arg(work.path()));
        assert!(out.status.success(), "{}", text(&out));
        let vars = std::fs::read_to_string(work.path().join("recipe.pkrvars.hcl")).unwrap();
        vars.lines()
            .find_map(|l| l.strip_prefix("agent_version = "))
            .unwrap_or_else(|| panic!("no agent_version in {vars}"))
            .trim_matches('"')
            .to_string()
    };
    assert_eq!(recorded(&[]), version);
    assert_eq!(recorded(&["--agent-version", "1.2.3-site"]), "1.2.3-site");
    assert_eq!(recorded(&["--var", "agent_version=4.5.6"]), "4.5.6");
}

/// Issue 42 §3: an agent binary that cannot start on the image is refused by name before
/// Packer starts (the stand-in records no call): built for another architecture than
/// `--arch`, or (the OS catalog's glibc lowered below the binary's floor in a copy of the
/// templates) needing a newer glibc than the OS has. The same binary on its own
/// architecture and the real catalog passes that check.
#[test]
fn an_agent_binary_that_cannot_run_on_the_image_is_refused_before_packer_starts() {
    let Some(agent) = built_agent() else {
        return;
    };
    let (own, other) = if cfg!(target_arch = "aarch64") {
        ("arm64", "x86_64")
    } else {
        ("x86_64", "arm64")
    };
    let dir = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    let packer = StandinPacker::new(dir.path(), "1.11.2");
    let build = |packer_dir: Option<&std::path::Path>, arch: &str| {
        build_with_agent(&packer, plugins.path(), packer_dir, arch, &agent)
    };
    let out = build(None, other);
    assert!(!out.status.success());
    assert!(
        text(&out).contains(&format!(
            "--agent-bin {}: built for {own}, but the image is {other} (--arch)",
            agent.display()
        )),
        "{}",
        text(&out)
    );
    assert!(packer.calls().is_empty(), "{:?}", packer.calls());

    // The templates with al2023's glibc at 2.17, below any Rust program's floor.
    let templates = tempfile::tempdir().unwrap();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../packer");
    copy_dir(&src, templates.path());
    let hcl = templates.path().join("node.pkr.hcl");
    let t = std::fs::read_to_string(&hcl).unwrap();
    let lowered = t.replacen("glibc        = \"2.34\"", "glibc        = \"2.17\"", 1);
    assert_ne!(t, lowered, "no glibc line for al2023 in {}", hcl.display());
    std::fs::write(&hcl, lowered).unwrap();
    let out = build(Some(templates.path()), own);
    assert!(!out.status.success());
    let said = text(&out);
    assert!(
        said.contains("needs glibc 2.") && said.contains("but al2023 has glibc 2.17"),
        "{said}"
    );
    assert!(packer.calls().is_empty(), "{:?}", packer.calls());

    // Its own architecture, al2023's real glibc: past the check (Packer is asked).
    let out = build(None, own);
    assert!(
        !text(&out).contains("built for") && !text(&out).contains("needs glibc"),
        "{}",
        text(&out)
    );
    assert!(!packer.calls().is_empty(), "{}", text(&out));
}

/// A file that is not an ELF program is refused by its path before Packer starts: as
/// `--agent-bin`, and as the HealthCheckProgram beside an agent that fits (checked too).
#[test]
fn an_agent_or_healthcheck_that_is_no_elf_program_is_refused_before_packer_starts() {
    let own = if cfg!(target_arch = "aarch64") {
        "arm64"
    } else {
        "x86_64"
    };
    let dir = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    let packer = StandinPacker::new(dir.path(), "1.11.2");
    let bins = tempfile::tempdir().unwrap();
    let script = bins.path().join("slurm-node-agent");
    std::fs::write(&script, "#!/bin/sh\necho slurm-node-agent 1.0.0\n").unwrap();
    let out = build_with_agent(&packer, plugins.path(), None, own, &script);
    assert!(!out.status.success());
    assert!(
        text(&out).contains(&format!("{}: not a 64-bit ELF program", script.display())),
        "{}",
        text(&out)
    );
    assert!(packer.calls().is_empty(), "{:?}", packer.calls());

    let Some(agent) = built_agent() else {
        return;
    };
    let beside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(&agent, beside.path().join("slurm-node-agent")).unwrap();
    let hc = beside.path().join("slurm-node-agent-healthcheck");
    std::fs::write(&hc, "not a program\n").unwrap();
    let out = build_with_agent(
        &packer,
        plugins.path(),
        None,
        own,
        &beside.path().join("slurm-node-agent"),
    );
    assert!(!out.status.success());
    assert!(
        text(&out).contains(&format!("{}: not a 64-bit ELF program", hc.display())),
        "{}",
        text(&out)
    );
    assert!(packer.calls().is_empty(), "{:?}", packer.calls());
}

/// `build` with `--agent-bin agent` for `arch` (of packer/, or of `packer_dir`), with the
/// offline recipe flags, the stand-in Packer and a work folder of its own.
fn build_with_agent(
    packer: &StandinPacker,
    plugins: &std::path::Path,
    packer_dir: Option<&std::path::Path>,
    arch: &str,
    agent: &std::path::Path,
) -> std::process::Output {
    let work = tempfile::tempdir().unwrap();
    let mut cmd = sib_with(packer, plugins);
    if let Some(p) = packer_dir {
        cmd.arg("--packer-dir").arg(p);
    }
    run(cmd
        .args(["build", "--agent-bin"])
        .arg(agent)
        .args(OFFLINE)
        .args(["--arch", arch, "--region", "eu-west-1", "--work-dir"])
        .arg(work.path()))
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

/// The workspace's debug build of the agent; `None`, said on stderr, when it is not built.
fn built_agent() -> Option<std::path::PathBuf> {
    let agent =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/slurm-node-agent");
    if agent.is_file() {
        return Some(agent);
    }
    eprintln!(
        "skipped: {} not built (cargo build -p slurm-node-agent)",
        agent.display()
    );
    None
}
