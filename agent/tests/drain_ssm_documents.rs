//! The SSM Command documents in `ssm-documents/`: their shape, that every command line they
//! run (with sample parameter values substituted, as SSM does) is accepted by the agent's
//! own command-line parser, and that their `allowedPattern`s keep shell metacharacters out.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use clap::Parser;
use serde_json::Value;
use slurm_node_agent::cli::{Cli, Command};

fn documents() -> Vec<(String, Value)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../ssm-documents");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "json") {
            let text = std::fs::read_to_string(&p).unwrap();
            let v: Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            out.push((p.file_name().unwrap().to_string_lossy().into_owned(), v));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        out.len(),
        5,
        "expected the Drain, Repair, Resume, Status and SupportBundle documents"
    );
    out
}

/// Splits a shell command line made only of plain words and single-quoted words; panics on
/// anything else (so a document cannot smuggle in expansions the test does not model).
/// The documents' line that finds the agent.
const AGENT_PATH_LINE: &str =
    r#"agent=/usr/bin/slurm-node-agent; [ -x "$agent" ] || agent=/usr/local/bin/slurm-node-agent"#;

fn split_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    cur.push(q);
                }
            }
            ' ' | '\t' => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c if "\"$`\\;&|<>(){}*?[]~#!".contains(c) => {
                panic!("unquoted shell metacharacter {c:?} in {line:?}")
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    words
}

/// Sample values of a parameter: its allowed values, or values its pattern accepts.
fn samples(name: &str, p: &Value) -> Vec<String> {
    if let Some(vals) = p["allowedValues"].as_array() {
        return vals
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
    }
    match name {
        "reason" => vec![
            "kernel update 2024-05-01".into(),
            "bad DIMM slot:3".into(),
            "x".into(),
        ],
        "timeout" | "liftFor" => vec!["90s".into(), "30m".into(), "2h".into()],
        "s3Uri" => vec![
            "s3://support-bundles/node-cases/".into(),
            "s3://my.bucket-1/case-42/gpu-001.tar.gz".into(),
            "s3://bkt".into(),
        ],
        "maxSize" => vec!["50MiB".into(), "800KiB".into(), "1GiB".into()],
        "collectFor" => vec!["60s".into(), "5m".into(), "10m".into()],
        other => panic!("no samples for parameter {other}"),
    }
}

fn pattern(p: &Value) -> Option<regex::Regex> {
    p["allowedPattern"]
        .as_str()
        .map(|s| regex::Regex::new(s).unwrap())
}

#[test]
fn documents_have_the_expected_shape() {
    for (name, doc) in documents() {
        assert_eq!(doc["schemaVersion"], "2.2", "{name}");
        for step in doc["mainSteps"].as_array().unwrap() {
            assert_eq!(step["action"], "aws:runShellScript", "{name}");
        }
        for (pname, p) in doc["parameters"].as_object().unwrap() {
            assert_eq!(p["type"], "String", "{name} {pname}");
            assert!(
                p.get("allowedValues").is_some() || p.get("allowedPattern").is_some(),
                "{name}: parameter {pname} is unrestricted"
            );
            if let (Some(re), Some(d)) = (pattern(p), p["default"].as_str()) {
                assert!(
                    re.is_match(d),
                    "{name}: default of {pname} fails its own pattern"
                );
            }
            for s in samples(pname, p) {
                if let Some(re) = pattern(p) {
                    assert!(re.is_match(&s), "{name}: sample {s:?} of {pname} rejected");
                }
            }
        }
    }
}

#[test]
fn every_command_line_is_accepted_by_the_agent() {
    let mut seen = std::collections::BTreeSet::new();
    for (name, doc) in documents() {
        let params = doc["parameters"].as_object().unwrap().clone();
        // Every combination of sample values (few parameters, few samples each).
        let mut combos: Vec<Vec<(String, String)>> = vec![Vec::new()];
        for (pname, p) in &params {
            let mut next = Vec::new();
            for c in &combos {
                for s in samples(pname, p) {
                    let mut c = c.clone();
                    c.push((pname.clone(), s));
                    next.push(c);
                }
            }
            combos = next;
        }
        for step in doc["mainSteps"].as_array().unwrap() {
            let lines = step["inputs"]["runCommand"].as_array().unwrap();
            // The agent's path: /usr/bin (the packages', and images' since), else the
            // /usr/local/bin of images built before.
            assert_eq!(
                lines.get(2).and_then(|l| l.as_str()),
                Some(AGENT_PATH_LINE),
                "{name}"
            );
            for line in lines {
                let line = line.as_str().unwrap();
                if line == AGENT_PATH_LINE {
                    continue;
                }
                let line = &line.replace("exec \"$agent\" ", "exec /usr/bin/slurm-node-agent ");
                if !line.contains("slurm-node-agent") {
                    continue;
                }
                for combo in &combos {
                    let mut l = line.to_string();
                    for (k, v) in combo {
                        l = l.replace(&format!("{{{{ {k} }}}}"), v);
                    }
                    assert!(!l.contains("{{"), "{name}: unknown parameter in {line:?}");
                    let words = split_words(l.trim().trim_start_matches("exec "));
                    assert_eq!(words[0], "/usr/bin/slurm-node-agent", "{name}: {line}");
                    let cli = Cli::try_parse_from(&words).unwrap_or_else(|e| {
                        panic!("{name}: {words:?} rejected by the agent:\n{e}")
                    });
                    match (&cli.command, combo.iter().find(|(k, _)| k == "reason")) {
                        (Command::Drain(d), Some((_, r))) => assert_eq!(&d.reason, r),
                        (Command::Drain(_), None) => panic!("drain without a reason"),
                        _ => {}
                    }
                    seen.insert(words[1].clone());
                }
            }
        }
    }
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        ["drain", "repair", "resume", "status", "support-bundle"]
    );
}

#[test]
fn patterns_reject_shell_metacharacters() {
    let attacks = [
        "a'b",
        "a\"b",
        "$(reboot)",
        "${IFS}",
        "`id`",
        "a;reboot",
        "a&&reboot",
        "a|sh",
        "a>/etc/passwd",
        "a</etc/shadow",
        "a\\'b",
        "line\nreboot",
        "tab\there",
        "glob*",
        "what?",
        "~root",
        "a#b",
        "(x)",
        "{a,b}",
        "[ab]",
        "!1",
        "--force",
        "-x",
        "",
    ];
    let mut checked = 0;
    for (name, doc) in documents() {
        for (pname, p) in doc["parameters"].as_object().unwrap() {
            let Some(re) = pattern(p) else { continue };
            for a in attacks {
                assert!(!re.is_match(a), "{name}: {pname} accepts {a:?}");
            }
            checked += 1;
        }
    }
    assert!(checked >= 2, "reason and timeout patterns");
    // The long form too: 201 characters is over the reason's limit.
    let (_, drain) = &documents()[0];
    let re = pattern(&drain["parameters"]["reason"]).unwrap();
    assert!(re.is_match(&"a".repeat(200)));
    assert!(!re.is_match(&"a".repeat(201)));
}

#[test]
fn agent_rejects_bad_drain_arguments() {
    let parse = |args: &[&str]| {
        let mut v = vec!["slurm-node-agent"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v)
    };
    assert!(parse(&["drain"]).is_err(), "--reason is required");
    assert!(parse(&["drain", "--reason", "a\nb"]).is_err());
    assert!(parse(&["drain", "--reason", &"x".repeat(257)]).is_err());
    assert!(
        parse(&["drain", "--reason", "x", "--timeout", "1h"]).is_err(),
        "--timeout needs --wait"
    );
    assert!(parse(&["drain", "--reason", "x", "--wait", "--timeout", "soon"]).is_err());
    assert!(parse(&["drain", "--reason", "x", "--wait", "--timeout", "90s"]).is_ok());
    assert!(parse(&["resume", "--force", "--output", "json"]).is_ok());
    assert!(parse(&["status", "--output", "yaml"]).is_err());
}

/// The drain document tells the operator the reason Slurm will show: the agent's own
/// reason for an operator's drain.
#[test]
fn the_drain_document_names_the_reason_slurm_shows() {
    use slurm_node_agent::reason::{reason_head, ReasonCause};
    let docs = documents();
    let (_, drain) = docs
        .iter()
        .find(|(n, _)| n == "SlurmNodeAgent-Drain.json")
        .unwrap();
    let said = drain["parameters"]["reason"]["description"]
        .as_str()
        .unwrap();
    let id = "i-0123456789abcdef0";
    let head = reason_head(ReasonCause::Operator, id).replace(id, "<instance-id>");
    assert!(
        said.contains(&format!("{head}<reason>")),
        "SlurmNodeAgent-Drain.json's reason says {said:?}; the agent writes {head}<reason>"
    );
}
