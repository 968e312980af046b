//! docs/iam.md, the three policies of docs/iam/ and the code agree:
//! - every AWS operation the agent calls (`agent/src`) is allowed by `instance-role.json`,
//!   and every one `publish` calls (`imagebuilder/src/publish.rs`) by
//!   `image-publisher.json`; the operations are found in the source by the SDK crates'
//!   own operation lists (`aws-sdk-*/src/operation/<op>/`), so a new call is caught;
//! - every statement of a policy is a row of the page's table with the same actions, and
//!   every row with a `Sid` is a statement;
//! - the policies' resources use the names of the README's first cluster.
#![allow(clippy::unwrap_used)]

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// `Sid` → (actions, resources as text) of one policy file.
fn policy(rel: &str) -> BTreeMap<String, (BTreeSet<String>, String)> {
    let doc: Value = serde_json::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    let mut out = BTreeMap::new();
    for st in doc["Statement"].as_array().unwrap() {
        assert_eq!(st["Effect"], "Allow", "{rel}: {st}");
        let sid = st["Sid"]
            .as_str()
            .unwrap_or_else(|| panic!("{rel}: a statement without Sid"));
        let actions = match &st["Action"] {
            Value::String(a) => BTreeSet::from([a.clone()]),
            Value::Array(a) => a.iter().map(|v| v.as_str().unwrap().to_string()).collect(),
            other => panic!("{rel}: {sid}: Action {other}"),
        };
        let prev = out.insert(sid.to_string(), (actions, st["Resource"].to_string()));
        assert!(prev.is_none(), "{rel}: Sid {sid} twice");
    }
    out
}

/// IAM's service prefix of an SDK crate (`aws-sdk-secretsmanager` → `secretsmanager`).
const SERVICES: [&str; 6] = ["ssm", "ec2", "secretsmanager", "pcs", "s3", "autoscaling"];

/// The operations of each SDK crate the workspace builds with, as snake_case names (the
/// folders of `src/operation/`): the version locked in Cargo.lock, in Cargo's registry
/// sources (`$CARGO_HOME/registry/src/*/aws-sdk-<service>-<version>/`), where the build
/// put them.
fn sdk_operations() -> BTreeMap<&'static str, BTreeSet<String>> {
    let lock: toml::Table = read("Cargo.lock").parse().unwrap();
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cargo"));
    let registries: Vec<PathBuf> = std::fs::read_dir(cargo_home.join("registry/src"))
        .unwrap_or_else(|e| panic!("{}: {e}", cargo_home.join("registry/src").display()))
        .map(|e| e.unwrap().path())
        .collect();
    let mut ops = BTreeMap::new();
    for service in SERVICES {
        let name = format!("aws-sdk-{service}");
        let versions: Vec<&str> = lock["package"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["name"].as_str() == Some(name.as_str()))
            .map(|p| p["version"].as_str().unwrap())
            .collect();
        assert_eq!(versions.len(), 1, "{name} in Cargo.lock: {versions:?}");
        let dir = registries
            .iter()
            .map(|r| {
                r.join(format!("{name}-{}", versions[0]))
                    .join("src/operation")
            })
            .find(|d| d.is_dir())
            .unwrap_or_else(|| panic!("{name} {} is not in {registries:?}", versions[0]));
        let names: BTreeSet<String> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap())
            .filter(|e| e.file_type().unwrap().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.len() > 5,
            "{}: {} operations",
            dir.display(),
            names.len()
        );
        ops.insert(service, names);
    }
    ops
}

/// `get_parameter_history` → `GetParameterHistory`.
fn pascal(op: &str) -> String {
    op.split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// `file → IAM actions` called in the Rust files below `dir` (or the file `dir`): an
/// operation counts where the file names the SDK crate (`aws_sdk_<service>`) and calls
/// `.<op>()`.
fn calls(
    dir: &Path,
    ops: &BTreeMap<&'static str, BTreeSet<String>>,
) -> BTreeMap<String, BTreeSet<String>> {
    let call = regex::Regex::new(r"\.\s*([a-z][a-z0-9_]*)\s*\(\s*\)").unwrap();
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            files.push(p);
        }
    }
    let mut out = BTreeMap::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let used: Vec<&str> = SERVICES
            .iter()
            .copied()
            .filter(|s| text.contains(&format!("aws_sdk_{s}::")))
            .collect();
        let mut actions = BTreeSet::new();
        for m in call.captures_iter(&text) {
            let op = &m[1];
            for s in &used {
                if ops[s].contains(op) {
                    actions.insert(format!("{s}:{}", pascal(op)));
                }
            }
        }
        if !actions.is_empty() {
            out.insert(
                f.strip_prefix(root()).unwrap_or(&f).display().to_string(),
                actions,
            );
        }
    }
    out
}

#[test]
fn every_aws_call_is_allowed_by_the_policy_of_its_principal() {
    let ops = sdk_operations();
    let allowed = |rel: &str| -> BTreeSet<String> {
        policy(rel).into_values().flat_map(|(a, _)| a).collect()
    };
    let role = allowed("docs/iam/instance-role.json");
    let publisher = allowed("docs/iam/image-publisher.json");

    let agent = calls(&root().join("agent/src"), &ops);
    let publish = calls(&root().join("imagebuilder/src/publish.rs"), &ops);
    // The scan finds what the docs name: if it found nothing, it would check nothing.
    let found: BTreeSet<&String> = agent.values().flatten().collect();
    for known in [
        "secretsmanager:GetSecretValue",
        "ssm:GetParameter",
        "ec2:DescribeImages",
    ] {
        assert!(
            found.iter().any(|a| *a == known),
            "the scan missed {known}: {agent:?}"
        );
    }
    assert!(
        publish.values().flatten().any(|a| a == "ssm:PutParameter"),
        "the scan missed publish's ssm:PutParameter: {publish:?}"
    );

    let mut missing = Vec::new();
    for (file, actions) in &agent {
        for a in actions.difference(&role) {
            missing.push(format!(
                "{file} calls {a}, which docs/iam/instance-role.json does not allow"
            ));
        }
    }
    for (file, actions) in &publish {
        for a in actions.difference(&publisher) {
            missing.push(format!(
                "{file} calls {a}, which docs/iam/image-publisher.json does not allow"
            ));
        }
    }
    // The rest of the image builder (build, validate) calls AWS through Packer only.
    let builder: BTreeMap<String, BTreeSet<String>> = calls(&root().join("imagebuilder/src"), &ops)
        .into_iter()
        .filter(|(f, _)| !f.ends_with("publish.rs"))
        .collect();
    assert!(
        builder.is_empty(),
        "AWS calls outside publish.rs, with no policy: {builder:?}"
    );
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

/// `(principal, Sid) → actions` of docs/iam.md's table (rows whose feature is a `Sid`).
fn table() -> BTreeMap<(String, String), BTreeSet<String>> {
    let page = read("docs/iam.md");
    let tick = regex::Regex::new(r"`([^`]+)`").unwrap();
    let mut out = BTreeMap::new();
    for line in page.lines().filter(|l| l.starts_with("| ")) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        if cells.len() < 5 || cells[0] == "principal" || cells[0].starts_with("---") {
            continue;
        }
        let Some(sid) = tick.captures(cells[1]).map(|c| c[1].to_string()) else {
            continue; // a managed policy row
        };
        let actions: BTreeSet<String> = tick
            .captures_iter(cells[2])
            .map(|c| c[1].to_string())
            .collect();
        let prev = out.insert((cells[0].to_string(), sid.clone()), actions);
        assert!(prev.is_none(), "docs/iam.md: {} {sid} twice", cells[0]);
    }
    out
}

#[test]
fn the_iam_page_table_and_the_policies_list_the_same_statements() {
    let rows = table();
    assert!(
        rows.len() >= 10,
        "docs/iam.md: the table was not read: {rows:?}"
    );
    let mut wrong = Vec::new();
    let mut seen = BTreeSet::new();
    for (principal, file) in [
        ("instance role", "docs/iam/instance-role.json"),
        ("image publisher", "docs/iam/image-publisher.json"),
        ("Packer", "docs/iam/packer.json"),
    ] {
        for (sid, (actions, _)) in policy(file) {
            let key = (principal.to_string(), sid.clone());
            match rows.get(&key) {
                None => wrong.push(format!(
                    "{file}: {sid} has no row for {principal} in docs/iam.md"
                )),
                Some(listed) if *listed != actions => wrong.push(format!(
                    "{sid}: docs/iam.md lists {listed:?}, {file} allows {actions:?}"
                )),
                Some(_) => {}
            }
            seen.insert(key);
        }
    }
    for key in rows.keys().filter(|k| !seen.contains(*k)) {
        wrong.push(format!(
            "docs/iam.md: {} {} is in no policy file",
            key.0, key.1
        ));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_policies_name_the_readmes_secret_parameter_and_launch_template() {
    let readme = read("README.md");
    let role = policy("docs/iam/instance-role.json");
    let publisher = policy("docs/iam/image-publisher.json");
    // (statement, the README's name its resource must hold)
    let names = [
        (&role["ClusterKey"].1, "slurm/munge-key"),
        (&role["UpgradeDesiredImage"].1, "/slurm/compute/ami"),
        (&publisher["PublishImageParameter"].1, "/slurm/compute/ami"),
    ];
    for (resource, name) in names {
        assert!(resource.contains(name), "{resource} does not name {name}");
        assert!(readme.contains(name), "README.md does not use {name}");
    }
    // The README gives the instance role this very file.
    assert!(
        readme.contains("file://docs/iam/instance-role.json"),
        "README.md does not attach docs/iam/instance-role.json"
    );
}
