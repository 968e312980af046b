//! Every settings example in README.md and docs/*.md is what the agent accepts: each
//! ```toml block is a valid settings file (its `[[mounts]]` resolve for an instance region),
//! and the user data example yields a settings part that is valid too. (`agent.toml.example`
//! is checked in the settings module's own tests; `docs/settings.md`'s examples also in
//! tests/settings_reference.rs.)
#![allow(clippy::unwrap_used)]

use slurm_node_agent::settings::{Layer, Resolved, Source};

/// `(name, text)` of README.md and every page of docs/.
fn pages() -> Vec<(String, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out = vec![(
        "README.md".to_string(),
        std::fs::read_to_string(root.join("README.md")).unwrap(),
    )];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    for p in docs {
        let name = format!("docs/{}", p.file_name().unwrap().to_string_lossy());
        out.push((name, std::fs::read_to_string(&p).unwrap()));
    }
    out
}

/// Fenced blocks: (info string, body, line of the opening fence).
fn blocks(text: &str) -> Vec<(String, String, usize)> {
    let mut out = Vec::new();
    let mut open: Option<(String, String, usize)> = None;
    for (i, line) in text.lines().enumerate() {
        if let Some(rest) = line.strip_prefix("```") {
            match open.take() {
                None => open = Some((rest.trim().to_string(), String::new(), i + 1)),
                Some(b) => out.push(b),
            }
        } else if let Some((_, body, _)) = open.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    out
}

#[test]
fn every_toml_example_in_the_readme_and_docs_is_valid() {
    let mut seen = 0;
    for (page, text) in pages() {
        for (info, body, line) in blocks(&text) {
            if info != "toml" {
                continue;
            }
            seen += 1;
            let source = Source::File(format!("{page}:{line}").into());
            let layer = Layer::from_toml(source, &body)
                .unwrap_or_else(|e| panic!("{page} line {line}: {e}"));
            let r = Resolved::merge(&[layer]).unwrap_or_else(|e| panic!("{page} line {line}: {e}"));
            for m in &r.settings.mounts {
                m.resolve("us-east-1")
                    .unwrap_or_else(|e| panic!("{page} line {line}: mount: {e:?}"));
            }
        }
    }
    assert!(seen > 0, "no ```toml block in README.md or docs/");
}

#[test]
fn the_readme_user_data_example_is_read() {
    let (_, text) = pages().into_iter().next().unwrap();
    let docs: Vec<_> = blocks(&text)
        .into_iter()
        .filter(|(_, body, _)| body.starts_with("Content-Type: multipart/"))
        .collect();
    assert!(!docs.is_empty(), "no user data example in README.md");
    for (_, body, line) in docs {
        // User data as EC2 serves it: CRLF or LF both work; the README has LF.
        let parts = slurm_node_agent::userdata::settings_parts(body.as_bytes()).unwrap();
        assert!(
            !parts.is_empty(),
            "README.md line {line}: no settings part found"
        );
        let layers: Vec<Layer> = parts
            .iter()
            .map(|p| Layer::from_toml(Source::UserData(p.index), &p.text).unwrap())
            .collect();
        Resolved::merge(&layers).unwrap_or_else(|e| panic!("README.md line {line}: {e}"));
    }
}

/// The README's "A first cluster in a page", read in order as an administrator runs it:
/// every name a step uses (the secret, the role and its instance profile, the image's
/// manifest, the parameter, the launch template, the user data file, the policies) was
/// made by an earlier step, and the Auto Scaling group fits in the controller's
/// `MaxNodeCount`. A command the test does not know fails it: teach it what the command
/// makes and uses.
#[test]
fn the_readmes_first_cluster_uses_only_names_made_by_an_earlier_step() {
    let (_, text) = pages().into_iter().next().unwrap();
    let walk = Walkthrough::read(&text).unwrap_or_else(|e| panic!("README.md: {e}"));
    // What the steps make, in order (the test's own view, so that a step dropped or
    // renamed in the README shows here too).
    let made: Vec<String> = walk
        .made
        .iter()
        .map(|(k, n, _)| format!("{k} {n}"))
        .collect();
    for want in [
        "secret slurm/munge-key",
        "role slurm-node",
        "instance profile slurm-node",
        "file target/release/slurm-image-builder",
        "file build/amazon/manifest.json",
        "parameter /slurm/compute/ami",
        "file user-data.txt",
        "launch template slurm-compute",
    ] {
        assert!(
            made.iter().any(|m| m == want),
            "README.md makes no {want}: {made:?}"
        );
    }
}

/// The walkthrough's checker itself: a name used before the step that makes it, a name
/// nobody makes, and a group larger than `MaxNodeCount` are each refused, naming the line.
#[test]
fn the_walkthrough_check_refuses_names_used_too_early() {
    let good = "## A first cluster in a page\n\n```\n# slurm.conf\nMaxNodeCount=8\n```\n\n\
                ```sh\naws ec2 create-launch-template --launch-template-name lt \\\n    \
                --launch-template-data '{\"ImageId\": \"ami-0123456789abcdef0\"}'\n\
                aws autoscaling create-auto-scaling-group --auto-scaling-group-name g \\\n    \
                --launch-template LaunchTemplateName=lt --min-size 0 --max-size 8\n```\n";
    Walkthrough::read(good).unwrap();

    let early = "## A first cluster in a page\n\n```sh\n\
                 slurm-image-builder publish --parameter /p --manifest m.json --launch-template lt\n\
                 aws ec2 create-launch-template --launch-template-name lt --launch-template-data '{}'\n```\n";
    let e = Walkthrough::read(early).unwrap_err();
    assert!(e.contains("file m.json") && e.contains("line 4"), "{e}");
    let early = early.replace("--manifest m.json ", "--ami-id ami-0123456789abcdef0 ");
    let e = Walkthrough::read(&early).unwrap_err();
    assert!(
        e.contains("launch template lt") && e.contains("used before") && e.contains("line 4"),
        "{e}"
    );

    let secret = "## A first cluster in a page\n\n```sh\n\
                  aws secretsmanager create-secret --name slurm/munge-key --secret-string x\n```\n\n\
                  ```\nContent-Type: multipart/mixed; boundary=\"B\"\nMIME-Version: 1.0\n\n--B\n\
                  Content-Type: application/x-slurm-node-agent\n\n[auth]\n\
                  key_source = \"secretsmanager:pcs!slurm-secret\"\n--B--\n```\n";
    let e = Walkthrough::read(secret).unwrap_err();
    assert!(e.contains("secret pcs!slurm-secret"), "{e}");

    let big = good.replace("--max-size 8", "--max-size 9");
    let e = Walkthrough::read(&big).unwrap_err();
    assert!(
        e.contains("MaxNodeCount=8") && e.contains("--max-size 9"),
        "{e}"
    );

    let unknown = "## A first cluster in a page\n\n```sh\naws s3 mb s3://x\n```\n";
    let e = Walkthrough::read(unknown).unwrap_err();
    assert!(e.contains("aws s3 mb"), "{e}");
}

/// What the README's first cluster makes and uses, step by step.
#[derive(Debug)]
struct Walkthrough {
    /// (kind, name, line) in the order made.
    made: Vec<(&'static str, String, usize)>,
    max_node_count: Option<u64>,
}

impl Walkthrough {
    fn read(readme: &str) -> Result<Walkthrough, String> {
        let start = readme
            .find("## A first cluster in a page")
            .ok_or("no \"## A first cluster in a page\" section")?;
        let rest = &readme[start..];
        let end = rest[3..].find("\n## ").map_or(rest.len(), |i| i + 3);
        let first_line = readme[..start].lines().count();
        let section = &rest[..end];
        let mut w = Walkthrough {
            made: Vec::new(),
            max_node_count: None,
        };
        let lines: Vec<&str> = section.lines().collect();
        for (info, body, line) in blocks(section) {
            let line = first_line + line;
            // "Save this as `user-data.txt`:" names the file the next block is.
            let before = lines[..line - first_line - 1]
                .iter()
                .rev()
                .find(|l| !l.trim().is_empty())
                .copied()
                .unwrap_or("");
            if body.starts_with("Content-Type: multipart/") {
                w.user_data(&body, line)?;
            }
            if let Some(file) = before
                .trim_end()
                .strip_suffix("`:")
                .and_then(|s| s.rsplit_once(" as `"))
                .map(|(_, f)| f)
            {
                w.make("file", file, line);
            }
            match info.as_str() {
                "sh" => {
                    for (cmd, at) in shell_commands(&body) {
                        w.command(&cmd, line + at)?;
                    }
                }
                "toml" => w.settings(&body, line)?,
                "" if body.starts_with("# slurm.conf") => {
                    w.max_node_count = body
                        .lines()
                        .find_map(|l| l.strip_prefix("MaxNodeCount="))
                        .map(|v| {
                            v.trim()
                                .parse()
                                .map_err(|e| format!("line {line}: MaxNodeCount: {e}"))
                        })
                        .transpose()?;
                }
                _ => {}
            }
        }
        Ok(w)
    }

    fn make(&mut self, kind: &'static str, name: &str, line: usize) {
        self.made.push((kind, name.to_string(), line));
    }

    fn uses(&self, kind: &str, name: &str, line: usize) -> Result<(), String> {
        if self.made.iter().any(|(k, n, _)| *k == kind && n == name) {
            return Ok(());
        }
        Err(format!(
            "line {line}: {kind} {name} is used before any step made it (made so far: {:?})",
            self.made
                .iter()
                .map(|(k, n, l)| format!("{k} {n} (line {l})"))
                .collect::<Vec<_>>()
        ))
    }

    /// A file named by a command: one of the repository's (a policy), an absolute path on
    /// the machine the step runs on (the controller's munge key), or one a step made.
    fn uses_file(&self, path: &str, line: usize) -> Result<(), String> {
        if path.starts_with('/') {
            return Ok(());
        }
        let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        if self.uses("file", path, line).is_ok() || repo.join(path).is_file() {
            return Ok(());
        }
        self.uses("file", path, line)
    }

    fn user_data(&mut self, body: &str, line: usize) -> Result<(), String> {
        let parts = slurm_node_agent::userdata::settings_parts(body.as_bytes())
            .map_err(|e| format!("line {line}: user data: {e}"))?;
        for p in parts {
            self.settings(&p.text, line)?;
        }
        Ok(())
    }

    /// A settings file: the key's secret and the upgrade's parameter must exist.
    fn settings(&mut self, toml: &str, line: usize) -> Result<(), String> {
        let layer = Layer::from_toml(Source::File(format!("README.md:{line}").into()), toml)
            .map_err(|e| e.to_string())?;
        let r = Resolved::merge(&[layer]).map_err(|e| e.to_string())?;
        let set = |key: &str| toml.contains(key);
        if set("key_source") {
            let src = &r.settings.auth.key_source;
            if let Some(name) = src.strip_prefix("secretsmanager:") {
                let name = name.rsplit_once(":secret:").map_or(name, |(_, n)| n);
                self.uses("secret", name, line)?;
            } else if let Some(name) = src.strip_prefix("ssm:") {
                self.uses("parameter", name, line)?;
            }
        }
        if set("parameter") && !r.settings.upgrade.parameter.is_empty() {
            self.uses("parameter", &r.settings.upgrade.parameter, line)?;
        }
        Ok(())
    }

    fn command(&mut self, cmd: &[String], line: usize) -> Result<(), String> {
        let words: Vec<&str> = cmd.iter().map(String::as_str).collect();
        let flag = |name: &str| -> Vec<&str> {
            let mut out = Vec::new();
            for (i, w) in words.iter().enumerate() {
                if *w == name {
                    if let Some(v) = words.get(i + 1) {
                        out.push(*v);
                    }
                } else if let Some(v) = w.strip_prefix(name).and_then(|v| v.strip_prefix('=')) {
                    out.push(v);
                }
            }
            out
        };
        let one = |name: &str| -> Result<&str, String> {
            flag(name)
                .first()
                .copied()
                .ok_or_else(|| format!("line {line}: `{}` has no {name}", words.join(" ")))
        };
        // Files read by command substitutions: `$(base64 -w0 user-data.txt)`.
        for w in &words {
            let mut rest = *w;
            while let Some(i) = rest.find("$(") {
                let inner = &rest[i + 2..];
                let close = inner
                    .find(')')
                    .ok_or(format!("line {line}: unclosed $( in {w}"))?;
                let sub: Vec<&str> = inner[..close].split_whitespace().collect();
                if let ["base64", "-w0", file] = sub[..] {
                    self.uses_file(file, line)?;
                }
                rest = &inner[close..];
            }
        }
        let program = words[0].rsplit('/').next().unwrap_or(words[0]);
        match (program, words.get(1).copied(), words.get(2).copied()) {
            ("cargo", Some("build"), _) => {
                let profile = if words.contains(&"--release") {
                    "release"
                } else {
                    "debug"
                };
                for p in flag("-p") {
                    self.make("file", &format!("target/{profile}/{p}"), line);
                }
            }
            ("slurm-image-builder", Some(sub), _) => {
                if words[0].contains('/') {
                    self.uses_file(words[0], line)?;
                }
                match sub {
                    "build" => {
                        for bin in flag("--agent-bin") {
                            self.uses_file(bin, line)?;
                        }
                        let work = flag("--work-dir")
                            .first()
                            .copied()
                            .unwrap_or("build/amazon");
                        self.make("file", &format!("{work}/manifest.json"), line);
                    }
                    "publish" => {
                        for m in flag("--manifest") {
                            self.uses_file(m, line)?;
                        }
                        for t in flag("--launch-template") {
                            self.uses("launch template", t, line)?;
                        }
                        self.make("parameter", one("--parameter")?, line);
                    }
                    other => {
                        return Err(format!(
                            "line {line}: slurm-image-builder {other}: unknown to this test"
                        ))
                    }
                }
            }
            ("aws", Some("secretsmanager"), Some("create-secret")) => {
                self.make("secret", one("--name")?, line);
            }
            ("aws", Some("iam"), Some("create-role")) => {
                self.make("role", one("--role-name")?, line)
            }
            ("aws", Some("iam"), Some("put-role-policy" | "attach-role-policy")) => {
                self.uses("role", one("--role-name")?, line)?;
                for doc in flag("--policy-document") {
                    if let Some(file) = doc.strip_prefix("file://") {
                        self.uses_file(file, line)?;
                    }
                }
            }
            ("aws", Some("iam"), Some("create-instance-profile")) => {
                self.make("instance profile", one("--instance-profile-name")?, line);
            }
            ("aws", Some("iam"), Some("add-role-to-instance-profile")) => {
                self.uses("instance profile", one("--instance-profile-name")?, line)?;
                self.uses("role", one("--role-name")?, line)?;
            }
            ("aws", Some("ec2"), Some("create-launch-template")) => {
                let data = one("--launch-template-data")?;
                // The command substitutions' output is base64: a placeholder parses the same.
                let mut json = String::new();
                let mut rest = data;
                while let Some(i) = rest.find("$(") {
                    json.push_str(&rest[..i]);
                    json.push_str("BASE64");
                    let close = rest[i..].find(')').map_or(rest.len(), |c| i + c + 1);
                    rest = &rest[close..];
                }
                json.push_str(rest);
                let v: serde_json::Value = serde_json::from_str(&json)
                    .map_err(|e| format!("line {line}: --launch-template-data: {e}"))?;
                if let Some(p) = v["ImageId"]
                    .as_str()
                    .and_then(|i| i.strip_prefix("resolve:ssm:"))
                {
                    self.uses("parameter", p, line)?;
                }
                if let Some(p) = v["IamInstanceProfile"]["Name"].as_str() {
                    self.uses("instance profile", p, line)?;
                }
                self.make("launch template", one("--launch-template-name")?, line);
            }
            ("aws", Some("autoscaling"), Some("create-auto-scaling-group")) => {
                let lt = one("--launch-template")?;
                let name = lt
                    .split(',')
                    .find_map(|kv| kv.strip_prefix("LaunchTemplateName="))
                    .ok_or(format!(
                        "line {line}: --launch-template {lt}: no LaunchTemplateName"
                    ))?;
                self.uses("launch template", name, line)?;
                let max: u64 = one("--max-size")?
                    .parse()
                    .map_err(|e| format!("line {line}: --max-size: {e}"))?;
                match self.max_node_count {
                    Some(n) if max <= n => {}
                    Some(n) => {
                        return Err(format!(
                            "line {line}: --max-size {max} is more than the controller's MaxNodeCount={n}"
                        ))
                    }
                    None => return Err(format!("line {line}: no MaxNodeCount in the controller's slurm.conf before")),
                }
            }
            ("sinfo" | "scontrol" | "squeue" | "srun" | "sbatch" | "slurm-node-agent", _, _) => {}
            _ => {
                return Err(format!(
                    "line {line}: `{}`: unknown to this test (say what it makes and uses)",
                    words.join(" ")
                ))
            }
        }
        Ok(())
    }
}

/// The commands of a shell block as words, with the line (from 1) each starts on: quotes
/// removed (`'...'` literal; `"..."` with `\"`, `\\`, `\$` escapes, `$(...)` kept as
/// written), `\` before a newline joins lines, `#` starts a comment.
fn shell_commands(body: &str) -> Vec<(Vec<String>, usize)> {
    let mut out = Vec::new();
    let (mut words, mut word, mut in_word) = (Vec::new(), String::new(), false);
    let mut line = 1;
    let mut start = 1;
    let mut chars = body.chars().peekable();
    let end_word = |words: &mut Vec<String>, word: &mut String, in_word: &mut bool| {
        if *in_word {
            words.push(std::mem::take(word));
            *in_word = false;
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'\n') => {
                chars.next();
                line += 1;
                end_word(&mut words, &mut word, &mut in_word);
            }
            '\n' => {
                end_word(&mut words, &mut word, &mut in_word);
                if !words.is_empty() {
                    out.push((std::mem::take(&mut words), start));
                }
                line += 1;
                start = line;
            }
            ' ' | '\t' => end_word(&mut words, &mut word, &mut in_word),
            '#' if !in_word => {
                while chars.peek().is_some_and(|c| *c != '\n') {
                    chars.next();
                }
            }
            '\'' => {
                in_word = true;
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    if c == '\n' {
                        line += 1;
                    }
                    word.push(c);
                }
            }
            '"' => {
                in_word = true;
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' if matches!(chars.peek(), Some('"' | '\\' | '$')) => {
                            word.push(chars.next().unwrap_or('\\'));
                        }
                        '\n' => {
                            line += 1;
                            word.push(c);
                        }
                        _ => word.push(c),
                    }
                }
            }
            _ => {
                in_word = true;
                word.push(c);
            }
        }
    }
    end_word(&mut words, &mut word, &mut in_word);
    if !words.is_empty() {
        out.push((words, start));
    }
    out
}

/// No page, unit, SSM document or image file shows a reason the agent does not write: every
/// `node-agent/` there is the start of `slurm-node-agent/<cause>@...` with a cause the
/// agent has.
#[test]
fn every_reason_shown_in_the_docs_is_one_the_agent_writes() {
    use slurm_node_agent::reason::ReasonCause;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = vec![root.join("README.md")];
    for dir in [
        "docs",
        "ssm-documents",
        "units",
        "packer/files",
        "packer/scripts",
    ] {
        let mut stack = vec![root.join(dir)];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    files.push(p);
                }
            }
        }
    }
    let causes: Vec<&str> = ReasonCause::ALL.iter().map(|c| c.as_str()).collect();
    let mut wrong = Vec::new();
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            for (at, _) in line.match_indices("node-agent/") {
                let rest = &line[at + "node-agent/".len()..];
                let word: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || matches!(c, '<' | '>' | '-'))
                    .collect();
                let next = rest[word.len()..].chars().next();
                // A path (`/etc/slurm-node-agent/conf.d`), not a reason.
                if !matches!(next, Some(':' | '@')) {
                    continue;
                }
                let ok = line[..at].ends_with("slurm-")
                    && next == Some('@')
                    && (word.starts_with('<') || causes.contains(&word.as_str()));
                if !ok {
                    wrong.push(format!("{}:{}: {line}", f.display(), n + 1));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "reasons the agent never writes:\n{}",
        wrong.join("\n")
    );
}

/// Every relative link of README.md and docs/*.md reaches a file of the repository, and a
/// `#fragment` a heading of that page (GitHub's anchors: lower case, punctuation but `-`
/// and `_` dropped, spaces as `-`).
#[test]
fn every_relative_link_reaches_a_file_and_heading() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let anchors = |text: &str| -> Vec<String> {
        let mut fenced = false;
        text.lines()
            .filter(|l| {
                if l.starts_with("```") {
                    fenced = !fenced;
                }
                !fenced && l.starts_with('#')
            })
            .map(|l| {
                l.trim_start_matches('#')
                    .trim()
                    .to_lowercase()
                    .chars()
                    .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
                    .map(|c| if c == ' ' { '-' } else { c })
                    .collect()
            })
            .collect()
    };
    let mut broken = Vec::new();
    for (page, text) in pages() {
        let dir = root.join(&page).parent().unwrap().to_path_buf();
        let mut fenced = false;
        for (n, line) in text.lines().enumerate() {
            if line.starts_with("```") {
                fenced = !fenced;
            }
            if fenced {
                continue;
            }
            for (at, _) in line.match_indices("](") {
                let target = &line[at + 2..];
                let Some(end) = target.find(')') else {
                    continue;
                };
                let target = &target[..end];
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (file, fragment) = target.split_once('#').unwrap_or((target, ""));
                let path = if file.is_empty() {
                    root.join(&page)
                } else {
                    dir.join(file)
                };
                if !path.exists() {
                    broken.push(format!("{page}:{}: {target}: no such file", n + 1));
                    continue;
                }
                if !fragment.is_empty() && path.extension().is_some_and(|e| e == "md") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    if !anchors(&text).iter().any(|a| a == fragment) {
                        broken.push(format!("{page}:{}: {target}: no such heading", n + 1));
                    }
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}
