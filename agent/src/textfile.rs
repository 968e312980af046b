//! Prometheus textfiles (node_exporter's textfile collector; the text exposition format
//! 0.0.4, <https://prometheus.io/docs/instrumenting/exposition_formats/>): one writer that
//! gives every family its `# HELP` and `# TYPE` once and escapes label values, and the
//! families every textfile of the agent carries: the agent's build
//! ([`BUILD_INFO`]) and the AWS calls throttled so far ([`AWS_THROTTLED`]).
//!
//! Metric names are `slurm_node_agent_<subject>_<what>[_<unit>]`, Prometheus's naming
//! rules: base units (seconds), counters end in `_total`, an `_info` gauge of 1 carries
//! labels. The suite runs `promtool check metrics` over every textfile it produces.
//!
//! Floor 1 (ground's neighbour, no outside system): uses [`crate::fsutil`].

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Mutex;

/// `slurm_node_agent_build_info{version,commit,slurm_release} 1`.
pub const BUILD_INFO: &str = "slurm_node_agent_build_info";

/// `slurm_node_agent_aws_throttled_total{api}`: AWS answers that said the request rate was
/// exceeded (`ThrottlingException`, `SlowDown`, HTTP 429, ...), per IAM action.
pub const AWS_THROTTLED: &str = "slurm_node_agent_aws_throttled_total";

/// A metric family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A value that goes up and down.
    Gauge,
    /// A value that only goes up (reset when the process restarts).
    Counter,
}

/// A textfile being written: families in the order they are started.
#[derive(Debug, Default)]
pub struct Textfile {
    out: String,
}

impl Textfile {
    /// An empty textfile.
    pub fn new() -> Textfile {
        Textfile::default()
    }

    /// Starts a family: its `# HELP` (one line: newlines and backslashes escaped) and
    /// `# TYPE`.
    pub fn family(&mut self, name: &str, help: &str, kind: Kind) -> &mut Textfile {
        let kind = match kind {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
        };
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        self
    }

    /// One sample of the family started last: `name{label="value",...} value`.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) -> &mut Textfile {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape_label(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {}", number(value));
        self
    }

    /// The agent's build and the Slurm release the node runs (`""` when unknown).
    pub fn build_info(&mut self, slurm_release: &str) -> &mut Textfile {
        self.family(
            BUILD_INFO,
            "The agent's version and commit, and the Slurm release slurmd runs (1).",
            Kind::Gauge,
        );
        self.sample(
            BUILD_INFO,
            &[
                ("version", env!("CARGO_PKG_VERSION")),
                ("commit", commit()),
                ("slurm_release", slurm_release),
            ],
            1.0,
        )
    }

    /// [`AWS_THROTTLED`] for every API throttled so far in this process (the family alone
    /// when none was).
    pub fn aws_throttled(&mut self) -> &mut Textfile {
        self.family(
            AWS_THROTTLED,
            "AWS answers that the request rate was exceeded, by IAM action, since the process started.",
            Kind::Counter,
        );
        for (api, n) in throttled() {
            // Counts are small integers: exact in an f64.
            #[allow(clippy::cast_precision_loss)]
            self.sample(AWS_THROTTLED, &[("api", api)], n as f64);
        }
        self
    }

    /// The text.
    pub fn finish(self) -> String {
        self.out
    }
}

/// The commit the binary was built from (`SLURM_NODE_AGENT_COMMIT` at build time), or
/// `unknown`.
pub fn commit() -> &'static str {
    option_env!("SLURM_NODE_AGENT_COMMIT").unwrap_or("unknown")
}

/// A sample value as Prometheus writes it: integers without a fraction, `NaN`, `+Inf`.
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
}

/// A label value escaped as the format says: `\\`, `\"`, `\n`.
pub fn escape_label(v: &str) -> String {
    let mut o = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o
}

static THROTTLED: Mutex<Vec<(&'static str, u64)>> = Mutex::new(Vec::new());

/// Counts one throttled answer of `api` (IAM's spelling, `ssm:GetParameter`).
pub fn note_throttled(api: &'static str) {
    let mut t = THROTTLED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match t.iter_mut().find(|(a, _)| *a == api) {
        Some((_, n)) => *n += 1,
        None => t.push((api, 1)),
    }
}

/// Throttled answers so far, by API, sorted by API.
pub fn throttled() -> Vec<(&'static str, u64)> {
    let mut v = THROTTLED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    v.sort_unstable();
    v
}

/// Writes `text` to `path` atomically (mode 0644, its folder created), so that the
/// collector never reads half a file.
///
/// # Errors
/// [`crate::fsutil::WriteError`] naming the path.
pub fn write(path: &Path, text: &str) -> Result<(), crate::fsutil::WriteError> {
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    crate::fsutil::write_atomic(path, text.as_bytes(), 0o644, None)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn families_samples_and_escaping() {
        let mut t = Textfile::new();
        t.family("x_total", "Things\nseen.", Kind::Counter)
            .sample("x_total", &[("a", "q\"uo\\te\nnl")], 3.0)
            .sample("x_total", &[], 0.25);
        let s = t.finish();
        assert_eq!(
            s,
            "# HELP x_total Things\\nseen.\n# TYPE x_total counter\n\
             x_total{a=\"q\\\"uo\\\\te\\nnl\"} 3\nx_total 0.25\n"
        );
    }

    #[test]
    fn throttled_calls_are_counted_per_api() {
        let before = throttled()
            .iter()
            .find(|(a, _)| *a == "test:Api")
            .map_or(0, |(_, n)| *n);
        note_throttled("test:Api");
        note_throttled("test:Api");
        let after = throttled()
            .iter()
            .find(|(a, _)| *a == "test:Api")
            .map_or(0, |(_, n)| *n);
        assert_eq!(after, before + 2);
        let mut t = Textfile::new();
        t.aws_throttled();
        let text = t.finish();
        assert!(text.contains("api=\"test:Api\"}"), "{text}");
    }
}
