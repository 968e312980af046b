//! The `checks.d` format as `docs/health-checks.md` documents it, and the image's default
//! checks (`packer/files/checks.d/10-defaults.toml`): every `toml checks.d/NAME` example of
//! the page is loaded and run beside the defaults, with the precedence the page states; the
//! defaults give each node shape the checks the page's table lists; and the
//! HealthCheckProgram loads them for the node its settings describe.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use slurm_node_agent::authkey::{AuthSettings, AuthType};
use slurm_node_agent::health::matcher::Matcher;
use slurm_node_agent::health::target::{Condition, OwnMount, ScratchTarget};
use slurm_node_agent::health::{self, checksd, nhc, CheckKind, CheckSet, Host, RunEnv, Status};
use slurm_node_agent::health::{ConfigError, Target};
use slurm_node_agent::nodedef::Role;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn defaults_file() -> PathBuf {
    root().join("packer/files/checks.d/10-defaults.toml")
}

fn page() -> String {
    std::fs::read_to_string(root().join("docs/health-checks.md")).unwrap()
}

/// The page's `checks.d` examples: (file name, text, line of the fence).
fn examples() -> Vec<(String, String, usize)> {
    let mut out = Vec::new();
    let mut open: Option<(String, String, usize)> = None;
    for (i, line) in page().lines().enumerate() {
        if let Some(rest) = line.strip_prefix("```") {
            match open.take() {
                Some(b) => {
                    if !b.0.is_empty() {
                        out.push(b);
                    }
                }
                None => {
                    let name = rest
                        .trim()
                        .strip_prefix("toml checks.d/")
                        .unwrap_or_default()
                        .to_string();
                    open = Some((name, String::new(), i + 1));
                }
            }
        } else if let Some((_, body, _)) = open.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    out
}

fn nhc_defaults() -> nhc::Defaults {
    nhc::Defaults {
        timeout: Duration::from_secs(10),
        slurm_bin_dir: PathBuf::new(),
    }
}

/// A host under `dir`: its instance type, and EFA and NVIDIA GPU functions on PCI.
fn fake_host(dir: &Path, instance_type: &str, efa: bool, gpus: bool) -> Host {
    let sys = dir.join("sys");
    let dmi = sys.join("devices/virtual/dmi/id");
    std::fs::create_dir_all(&dmi).unwrap();
    std::fs::write(dmi.join("product_name"), format!("{instance_type}\n")).unwrap();
    let pci = |addr: &str, vendor: &str, device: &str, class: &str| {
        let d = sys.join("bus/pci/devices").join(addr);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("vendor"), format!("{vendor}\n")).unwrap();
        std::fs::write(d.join("device"), format!("{device}\n")).unwrap();
        std::fs::write(d.join("class"), format!("{class}\n")).unwrap();
    };
    if efa {
        pci("0000:10:1c.0", "0x1d0f", "0xefa1", "0x020000");
    }
    if gpus {
        pci("0000:10:1d.0", "0x10de", "0x20b0", "0x030200");
    }
    Host {
        sys_dir: sys,
        ..Host::default()
    }
}

fn target(node: &str, role: Role, auth: AuthType, host: Host) -> Target {
    let mut t = Target::new(
        Some(node.to_string()),
        role,
        &AuthSettings {
            auth_type: auth,
            ..AuthSettings::default()
        },
    );
    t.host = host;
    t
}

fn load(dir: &Path, t: &Target) -> CheckSet {
    checksd::load_dir(dir, t, &nhc_defaults()).unwrap()
}

fn names(set: &CheckSet) -> Vec<&str> {
    set.checks.iter().map(|c| c.name.as_str()).collect()
}

fn invalid(set: &CheckSet) -> Vec<&ConfigError> {
    set.checks
        .iter()
        .filter_map(|c| match &c.kind {
            CheckKind::Invalid(e) => Some(e),
            _ => None,
        })
        .collect()
}

/// The names of the defaults' `[[check]]` tables, in file order.
fn default_names() -> Vec<String> {
    let v: toml::Table =
        toml::from_str(&std::fs::read_to_string(defaults_file()).unwrap()).unwrap();
    v["check"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect()
}

/// Every definition of the defaults has a name (the handle to override it by), and the
/// page's table lists exactly those names in that order.
#[test]
fn the_pages_table_lists_every_default_check() {
    let page = page();
    let section = page
        .split("## The image's default checks")
        .nth(1)
        .unwrap()
        .split("\n## ")
        .next()
        .unwrap();
    let listed: Vec<String> = section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .map(|l| l.split('`').next().unwrap().to_string())
        .collect();
    assert_eq!(listed, default_names());
}

/// What the defaults give each shape of node: only what the node has.
#[tokio::test]
async fn the_defaults_give_each_node_what_it_has() {
    let checks = tempfile::tempdir().unwrap();
    std::fs::copy(defaults_file(), checks.path().join("10-defaults.toml")).unwrap();
    let hosts = tempfile::tempdir().unwrap();
    let plain = || fake_host(&hosts.path().join("c6i"), "c6i.32xlarge", false, false);
    let p4d = || fake_host(&hosts.path().join("p4d"), "p4d.24xlarge", true, true);
    let base = ["root file system", "/tmp space", "cluster key"];
    let with =
        |more: &[&'static str]| -> Vec<&'static str> { base.iter().chain(more).copied().collect() };

    let t = target("n1", Role::Compute, AuthType::Munge, plain());
    assert!(!t.holds(Condition::Gpus) && !t.holds(Condition::Efa));
    let set = load(checks.path(), &t);
    assert_eq!(names(&set), with(&["munged", "slurmd"]));
    assert!(set.notes.is_empty(), "{:?}", set.notes);

    let t = target("login1", Role::Login, AuthType::Slurm, plain());
    assert_eq!(names(&load(checks.path(), &t)), with(&["sackd"]));

    // A GPU type launched with EFA: the GPU and EFA checks, the GPUs' longer timeout.
    let t = target("gpu-1", Role::Compute, AuthType::Slurm, p4d());
    let set = load(checks.path(), &t);
    assert_eq!(names(&set), with(&["slurmd", "GPUs", "EFA"]));
    assert_eq!(set.checks[4].timeout, Duration::from_secs(20));
    // The same type launched without EFA interfaces: no EFA check.
    let no_efa = fake_host(
        &hosts.path().join("p4d-no-efa"),
        "p4d.24xlarge",
        false,
        false,
    );
    let t = target("gpu-2", Role::Compute, AuthType::Slurm, no_efa);
    assert_eq!(names(&load(checks.path(), &t)), with(&["slurmd", "GPUs"]));

    // The node's own mounts (one check each, a `required = false` one never fatal) and
    // scratch on a node with instance store disks; the key where auth.key_path puts it.
    let by_id = tempfile::tempdir().unwrap();
    std::fs::write(
        by_id
            .path()
            .join("nvme-Amazon_EC2_NVMe_Instance_Storage_AWS1"),
        "",
    )
    .unwrap();
    let mut t = Target::new(
        Some("n2".into()),
        Role::Compute,
        &AuthSettings {
            key_path: "/etc/site/munge.key".into(),
            ..AuthSettings::default()
        },
    );
    t.host = plain();
    t.mounts = vec![
        OwnMount {
            mount_point: "/fsx".into(),
            read_only: false,
            required: true,
        },
        OwnMount {
            mount_point: "/ref".into(),
            read_only: true,
            required: false,
        },
    ];
    t.scratch = Some(ScratchTarget {
        mount_point: "/scratch".into(),
        by_id_dir: by_id.path().to_path_buf(),
        is_instance_store: |n| n.starts_with("nvme-Amazon_EC2_NVMe_Instance_Storage_"),
    });
    let set = load(checks.path(), &t);
    assert_eq!(
        names(&set),
        vec![
            "root file system",
            "/tmp space",
            "shared file systems: mount /fsx",
            "shared file systems: mount /ref",
            "scratch",
            "cluster key",
            "munged",
            "slurmd"
        ]
    );
    assert!(set.checks[2].fatal && !set.checks[3].fatal);
    let CheckKind::Mount(m) = &set.checks[3].kind else {
        panic!("{:?}", set.checks[3].kind)
    };
    assert!(!m.writable, "mounted ro on purpose");
    let CheckKind::Mount(m) = &set.checks[4].kind else {
        panic!("{:?}", set.checks[4].kind)
    };
    assert_eq!(m.path, "/scratch");
    let CheckKind::AuthKey(k) = &set.checks[5].kind else {
        panic!("{:?}", set.checks[5].kind)
    };
    assert_eq!(
        (k.path.as_str(), k.plugin, k.owner.as_str()),
        ("/etc/site/munge.key", "auth/munge", "munge")
    );

    // They run here: the host-reading ones answer within their timeout.
    let t = target("n1", Role::Compute, AuthType::Munge, Host::default());
    let r = health::run_checks(&load(checks.path(), &t), &RunEnv::default()).await;
    let root = &r.results[0];
    assert_eq!(root.name, "root file system");
    assert!(
        r.results.iter().all(|c| c.status != Status::Timeout),
        "{r:?}"
    );
    assert!(r.results.iter().all(|c| c.family != "config"), "{r:?}");
}

/// Every `checks.d` example of the page loads beside the defaults without an error or a
/// note, for nodes of each role and auth plugin, with and without GPUs and EFA; each of its
/// named checks replaces the default of its name (or, `enabled = false`, leaves none) and
/// is there exactly where its `nodes` and `when` say; and the whole set runs.
#[tokio::test]
async fn the_pages_checksd_examples_load_and_run_beside_the_defaults() {
    let examples = examples();
    assert!(examples.len() >= 3, "{examples:?}");
    let hosts = tempfile::tempdir().unwrap();
    let shapes = [
        ("n1", Role::Compute, AuthType::Munge, false),
        ("gpu-1", Role::Compute, AuthType::Slurm, true),
        ("login1", Role::Login, AuthType::Munge, false),
    ];
    for (file, text, line) in &examples {
        let at = format!("docs/health-checks.md line {line} ({file})");
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(defaults_file(), dir.path().join("10-defaults.toml")).unwrap();
        let path = dir.path().join(file);
        assert!(
            file.as_str() > "10-defaults.toml",
            "{at}: read before the defaults"
        );
        std::fs::write(&path, text).unwrap();
        let defs: toml::Table = toml::from_str(text).unwrap();
        let defs = defs["check"].as_array().unwrap().clone();
        for (node, role, auth, gpu) in shapes {
            let host = fake_host(&hosts.path().join(node), "p9x.48xlarge", gpu, gpu);
            let t = target(node, role, auth, host);
            let set = load(dir.path(), &t);
            assert!(invalid(&set).is_empty(), "{at}: {:?}", invalid(&set));
            assert!(set.notes.is_empty(), "{at}: {:?}", set.notes);
            for d in &defs {
                let Some(name) = d.get("name").and_then(|n| n.as_str()) else {
                    continue;
                };
                let on = d.get("enabled").and_then(|e| e.as_bool()).unwrap_or(true);
                let nodes = d.get("nodes").and_then(|n| n.as_str()).unwrap_or("*");
                let when: Vec<&str> = match d.get("when") {
                    None => Vec::new(),
                    Some(toml::Value::String(w)) => vec![w.as_str()],
                    Some(w) => w
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|w| w.as_str().unwrap())
                        .collect(),
                };
                let applies = on
                    && Matcher::parse(nodes).unwrap().matches(node)
                    && when.iter().all(|w| match w.strip_prefix('!') {
                        Some(w) => !t.holds(Condition::parse(w).unwrap()),
                        None => t.holds(Condition::parse(w).unwrap()),
                    });
                let found: Vec<_> = set.checks.iter().filter(|c| c.name == name).collect();
                if applies {
                    assert_eq!(found.len(), 1, "{at}: {name} on {node}: {:?}", names(&set));
                    assert_eq!(found[0].origin.file, path, "{at}: {name} on {node}");
                } else {
                    assert!(found.is_empty(), "{at}: {name} on {node}: {found:?}");
                }
            }
            let r = health::run_checks(&set, &RunEnv::default()).await;
            assert_eq!(r.results.len(), set.checks.len(), "{at}");
            assert!(
                r.results.iter().all(|c| c.family != "config"),
                "{at}: {:?}",
                r.results
            );
        }
    }
}

/// The precedence rules the page states, beyond its examples: a replacement that does not
/// apply leaves no check of its name on the node; a name turned off that no earlier file
/// has is noted; checks of one file do not replace each other.
#[test]
fn precedence_between_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(defaults_file(), dir.path().join("10-defaults.toml")).unwrap();
    std::fs::write(
        dir.path().join("50-site.toml"),
        "[[check]]\nname = \"/tmp space\"\nkind = \"space\"\npath = \"/tmp\"\nmin_free = \"1%\"\nnodes = \"big-*\"\n\n\
         [[check]]\nname = \"EFA check\"\nenabled = false\n\n\
         [[check]]\nname = \"twice\"\nkind = \"file\"\npath = \"/etc/passwd\"\n\n\
         [[check]]\nname = \"twice\"\nkind = \"file\"\npath = \"/etc/group\"\n",
    )
    .unwrap();
    let t = target("n1", Role::Compute, AuthType::Munge, Host::default());
    let set = load(dir.path(), &t);
    let n = names(&set);
    assert!(!n.contains(&"/tmp space"), "{n:?}");
    assert_eq!(n.iter().filter(|x| **x == "twice").count(), 2, "{n:?}");
    assert_eq!(set.notes.len(), 1, "{:?}", set.notes);
    assert!(
        set.notes[0].contains("50-site.toml:8: enabled = false turns off nothing")
            && set.notes[0].contains("\"EFA check\""),
        "{:?}",
        set.notes
    );
    let t = target("big-1", Role::Compute, AuthType::Munge, Host::default());
    let set = load(dir.path(), &t);
    let tmp = set.checks.iter().find(|c| c.name == "/tmp space").unwrap();
    assert!(tmp.origin.file.ends_with("50-site.toml"));
    // In the default's place, the second check.
    assert_eq!(set.checks[1].name, "/tmp space");

    // A `when` word that names nothing is an error of the file naming its line.
    std::fs::write(
        dir.path().join("60-bad.toml"),
        "[[check]]\nname = \"x\"\nkind = \"efa\"\nwhen = \"gpu\"\n",
    )
    .unwrap();
    let set = load(dir.path(), &t);
    let e = invalid(&set);
    assert_eq!(e.len(), 1);
    assert!(
        e[0].to_string().contains("60-bad.toml:1: ")
            && e[0].to_string().contains("when: unknown word \"gpu\""),
        "{}",
        e[0]
    );
}

/// The image's `start-up gate` entry gives one check per part of the node's gate, each
/// failing with the gate's words once its part failed in this boot; a node without a gate
/// has none.
#[tokio::test]
async fn the_default_start_gate_entry_reports_each_part_of_this_boots_gate() {
    use slurm_node_agent::health::startgate::{GateRecord, Part, PartStatus};
    use slurm_node_agent::health::target::GateTarget;
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(defaults_file(), dir.path().join("10-defaults.toml")).unwrap();
    let state = tempfile::tempdir().unwrap();
    let mut t = target("n1", Role::Compute, AuthType::Munge, Host::default());
    assert!(!names(&load(dir.path(), &t))
        .iter()
        .any(|n| n.starts_with("start-up gate")));
    t.gate = Some(GateTarget {
        state_dir: state.path().to_path_buf(),
        parts: vec!["dcgm".into(), "efa-loopback".into()],
    });
    let set = load(dir.path(), &t);
    let gate: Vec<&str> = names(&set)
        .into_iter()
        .filter(|n| n.starts_with("start-up gate"))
        .collect();
    assert_eq!(gate, ["start-up gate: dcgm", "start-up gate: efa-loopback"]);
    let part = |name: &str, status, message: &str| Part {
        name: name.into(),
        status,
        message: message.into(),
        budget_s: 300,
        started_unix: 1_800_000_000,
        ended_unix: Some(1_800_000_060),
    };
    GateRecord {
        boot_id: std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .unwrap()
            .trim()
            .to_string(),
        instance_id: "i-0123456789abcdef0".into(),
        started_unix: 1_800_000_000,
        deadline_unix: 1_800_000_600,
        parts: vec![
            part("dcgm", PartStatus::Failed, "memory failed on GPU 3: x"),
            part("efa-loopback", PartStatus::Passed, "exited 0"),
        ],
    }
    .save(state.path())
    .unwrap();
    let only_gate = CheckSet {
        checks: set
            .checks
            .into_iter()
            .filter(|c| c.name.starts_with("start-up gate"))
            .collect(),
        notes: Vec::new(),
    };
    let report = health::run_checks(&only_gate, &RunEnv::default()).await;
    let failed: Vec<_> = report
        .failures()
        .map(|r| (r.name.as_str(), r.message.as_str(), r.family.as_str()))
        .collect();
    assert_eq!(
        failed,
        [("start-up gate: dcgm", "memory failed on GPU 3: x", "gate")]
    );
}

/// The HealthCheckProgram, as slurmd runs it, loads the defaults for the node its settings
/// describe: a login node with auth/slurm, its key at `auth.key_path`, one of `[[mounts]]`.
#[test]
fn the_healthcheck_program_loads_the_defaults_for_its_node() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("checks.d")).unwrap();
    std::fs::create_dir_all(d.join("none.d")).unwrap();
    std::fs::copy(defaults_file(), d.join("checks.d/10-defaults.toml")).unwrap();
    std::fs::write(
        d.join("agent.toml"),
        format!(
            "[node]\nrole = \"login\"\n\n[auth]\ntype = \"slurm\"\nkey_path = \"{}/slurm.key\"\n\n\
             [[mounts]]\nfile_system_id = \"fs-0123456789abcdef0\"\nregion = \"us-east-1\"\n\
             mount_name = \"abcdefgh\"\nmount_point = \"{}/fsx\"\n",
            d.display(),
            d.display()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_slurm-node-agent-healthcheck"))
        .env_clear()
        .env("SLURMD_NODENAME", "login1")
        .args([
            format!("--config={}/agent.toml", d.display()),
            format!("--config-dir={}/none.d", d.display()),
            format!("--checks-dir={}/checks.d", d.display()),
            format!("--set=agent.state_dir={}/state", d.display()),
            "--no-act".into(),
            "--output".into(),
            "json".into(),
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The key and the mount are not there: a failing run, not a refused one.
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let checks = v["checks"].as_array().unwrap();
    let got: Vec<&str> = checks.iter().map(|c| c["name"].as_str().unwrap()).collect();
    let fsx = format!("shared file systems: mount {}/fsx", d.display());
    assert_eq!(
        got,
        vec![
            "root file system",
            "/tmp space",
            &fsx,
            "cluster key",
            "sackd"
        ],
        "{v}"
    );
    let key = checks.iter().find(|c| c["name"] == "cluster key").unwrap();
    assert_eq!(key["status"], "fail");
    let msg = key["message"].as_str().unwrap();
    assert!(
        msg.starts_with(&format!("auth/slurm key {}/slurm.key: ", d.display())),
        "{msg}"
    );
}

fn parse_one(text: &str) -> Result<CheckSet, ConfigError> {
    checksd::parse(
        text,
        Path::new("/etc/slurm-node-agent/checks.d/50-efa.toml"),
        &Target::for_node(Some("n1")),
        &nhc_defaults(),
    )
}

/// The `efa` kind's keys beyond `count`: the rate table, `libfabric` and the `fi_info`
/// program; bad values are refused when the file is read, naming the file, line and key.
#[test]
fn efa_keys_parse_and_bad_values_are_refused_by_name() {
    let set = parse_one(
        "[[check]]\nkind = \"efa\"\nmax_rate_per_min = { rx_drops = 100, retrans_timeout_events = 0.5 }\nlibfabric = true\n",
    )
    .unwrap();
    let CheckKind::Efa(spec) = &set.checks[0].kind else {
        panic!("{:?}", set.checks[0].kind)
    };
    assert_eq!(spec.max_rate_per_min["rx_drops"], 100.0);
    assert_eq!(spec.max_rate_per_min["retrans_timeout_events"], 0.5);
    assert_eq!(spec.fi_info.as_deref(), Some("/opt/amazon/efa/bin/fi_info"));
    let set = parse_one(
        "[[check]]\nkind = \"efa\"\nlibfabric = true\nfi_info_program = \"/usr/bin/fi_info\"\n",
    )
    .unwrap();
    let CheckKind::Efa(spec) = &set.checks[0].kind else {
        panic!("{:?}", set.checks[0].kind)
    };
    assert_eq!(spec.fi_info.as_deref(), Some("/usr/bin/fi_info"));
    assert!(spec.max_rate_per_min.is_empty());
    // Without libfabric = true, fi_info is not run.
    let set = parse_one("[[check]]\nkind = \"efa\"\n").unwrap();
    let CheckKind::Efa(spec) = &set.checks[0].kind else {
        panic!("{:?}", set.checks[0].kind)
    };
    assert_eq!(spec.fi_info, None);

    let err = |text: &str| parse_one(text).unwrap_err().to_string();
    let at = "/etc/slurm-node-agent/checks.d/50-efa.toml:1: [[check]] kind = \"efa\": ";
    assert_eq!(
        err("[[check]]\nkind = \"efa\"\nmax_rate_per_min = { rx_drops = -1 }\n"),
        format!("{at}max_rate_per_min.rx_drops: expected events per minute, a number at or above 0, got -1")
    );
    assert_eq!(
        err("[[check]]\nkind = \"efa\"\nmax_rate_per_min = { rx_drops = \"lots\" }\n"),
        format!("{at}max_rate_per_min.rx_drops: expected events per minute, a number at or above 0, got \"lots\"")
    );
    let e = err("[[check]]\nkind = \"efa\"\nmax_rate_per_min = { rx_dropz = 1 }\n");
    assert!(
        e.starts_with(&format!(
            "{at}max_rate_per_min: unknown counter \"rx_dropz\" (known: "
        )),
        "{e}"
    );
    assert!(
        e.contains("rx_drops") && e.contains("unresponsive_remote_events"),
        "{e}"
    );
    // A counter that must never move takes no rate.
    let e = err("[[check]]\nkind = \"efa\"\nmax_rate_per_min = { no_completion_cmds = 1 }\n");
    assert!(e.contains("unknown counter \"no_completion_cmds\""), "{e}");
    let e = err("[[check]]\nkind = \"efa\"\nmax_rate_per_min = 5\n");
    assert!(
        e.starts_with(&format!("{at}max_rate_per_min: expected a table")),
        "{e}"
    );
    assert_eq!(
        err("[[check]]\nkind = \"efa\"\nlibfabric = true\nfi_info_program = \"fi_info\"\n"),
        format!("{at}fi_info_program: \"fi_info\" must be an absolute path")
    );
    let e = err("[[check]]\nkind = \"gpu\"\nlibfabric = true\n");
    assert!(e.contains("key \"libfabric\" does not apply"), "{e}");
}

/// The `gpu` kind's fabric keys: `fabric` ("auto", true, false) and `nvidia_smi` (an
/// absolute path) are taken; any other value is refused naming the file, line and key.
#[test]
fn gpu_fabric_keys_are_taken_and_bad_values_refused_by_name() {
    use slurm_node_agent::health::checks::gpu::{FabricCheck, NVIDIA_SMI_PROGRAM};
    let dir = tempfile::tempdir().unwrap();
    let t = target("gpu-1", Role::Compute, AuthType::Slurm, Host::default());
    let gpu_spec = |body: &str| {
        std::fs::write(
            dir.path().join("40-gpu.toml"),
            format!("[[check]]\nname = \"GPUs\"\nkind = \"gpu\"\n{body}"),
        )
        .unwrap();
        let set = load(dir.path(), &t);
        match &set.checks[0].kind {
            CheckKind::Gpu(s) => Ok(s.clone()),
            CheckKind::Invalid(e) => Err(e.to_string()),
            k => panic!("{k:?}"),
        }
    };
    let s = gpu_spec("").unwrap();
    assert_eq!(
        (s.fabric, s.nvidia_smi.as_str()),
        (FabricCheck::Auto, NVIDIA_SMI_PROGRAM)
    );
    assert_eq!(
        gpu_spec("fabric = \"auto\"\n").unwrap().fabric,
        FabricCheck::Auto
    );
    assert_eq!(gpu_spec("fabric = true\n").unwrap().fabric, FabricCheck::On);
    assert_eq!(
        gpu_spec("fabric = false\n").unwrap().fabric,
        FabricCheck::Off
    );
    let s = gpu_spec("nvidia_smi = \"/opt/nvidia/bin/nvidia-smi\"\n").unwrap();
    assert_eq!(s.nvidia_smi, "/opt/nvidia/bin/nvidia-smi");
    for (body, want) in [
        (
            "fabric = \"yes\"\n",
            "fabric: expected \"auto\", true or false, got \"yes\"",
        ),
        (
            "fabric = 1\n",
            "fabric: expected \"auto\", true or false, got 1",
        ),
        (
            "nvidia_smi = \"nvidia-smi\"\n",
            "nvidia_smi: expected an absolute path, got \"nvidia-smi\"",
        ),
    ] {
        let e = gpu_spec(body).unwrap_err();
        assert!(
            e.contains("40-gpu.toml:1: ") && e.contains("kind = \"gpu\"") && e.contains(want),
            "{body}: {e}"
        );
    }
    // The keys belong to the gpu kind only.
    std::fs::write(
        dir.path().join("40-gpu.toml"),
        "[[check]]\nname = \"EFA\"\nkind = \"efa\"\nfabric = true\n",
    )
    .unwrap();
    let set = load(dir.path(), &t);
    let e = invalid(&set);
    assert!(
        e[0].to_string()
            .contains("key \"fabric\" does not apply to this kind"),
        "{}",
        e[0]
    );
}
