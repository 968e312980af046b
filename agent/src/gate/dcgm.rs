//! NVIDIA DCGM's diagnostics as the gate runs them: `dcgmi diag -r <level> -j`, read as its
//! JSON output.
//!
//! The output's shape is DCGM's (`testing/python3/dcgm_diag_schema.json` and
//! `nvvs/include/NvvsJsonStrings.h` in NVIDIA/DCGM, 4.x): an object `"DCGM Diagnostic"`
//! with `test_categories` (each a `category` and its `tests`: `name`, `results` per entity
//! with `entity_group` `GPU`, `entity_id` the GPU's index, `status` `Pass`, `Fail`, `Skip` or
//! `Warn`, and `warnings` with `warning`, `error_id` and `error_category`; a
//! `test_summary.status`) or a `runtime_error` when the diagnostic could not run. The error
//! categories are `dcgmErrorCategory_t` of `dcgmlib/dcgm_errors.h`.

use serde::Deserialize;

/// `dcgmi diag -j`'s output, as far as the gate reads it.
#[derive(Debug, Clone, Deserialize)]
pub struct DiagOutput {
    /// `"DCGM Diagnostic"`.
    #[serde(rename = "DCGM Diagnostic")]
    pub diagnostic: Diagnostic,
}

/// The diagnostic's results.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Diagnostic {
    /// The categories run (`Deployment`, `Hardware`, `Integration`, `Stress`...).
    #[serde(default)]
    pub test_categories: Vec<Category>,
    /// Why the diagnostic could not run at all.
    #[serde(default)]
    pub runtime_error: Option<String>,
}

/// One category of tests.
#[derive(Debug, Clone, Deserialize)]
pub struct Category {
    /// Its name.
    #[serde(default)]
    pub category: String,
    /// Its tests.
    #[serde(default)]
    pub tests: Vec<Test>,
}

/// One test (a plugin: `software`, `memory`, `pcie`, `targeted_stress`, `diagnostic`...).
#[derive(Debug, Clone, Deserialize)]
pub struct Test {
    /// The test's name as DCGM names it.
    pub name: String,
    /// Per entity (GPU).
    #[serde(default)]
    pub results: Vec<EntityResult>,
    /// The test's overall status.
    #[serde(default)]
    pub test_summary: Option<Summary>,
}

/// A test's overall status.
#[derive(Debug, Clone, Deserialize)]
pub struct Summary {
    /// `Pass`, `Fail`, `Skip`, `Warn`.
    pub status: String,
}

/// A test's result on one entity.
#[derive(Debug, Clone, Deserialize)]
pub struct EntityResult {
    /// `GPU` (or `CPU`, `NvSwitch`...).
    #[serde(default)]
    pub entity_group: String,
    /// The entity's index (the GPU's DCGM id, its index on the node).
    #[serde(default)]
    pub entity_id: u32,
    /// `Pass`, `Fail`, `Skip`, `Warn`.
    pub status: String,
    /// What went wrong.
    #[serde(default)]
    pub warnings: Vec<Warning>,
}

/// One of a result's warnings.
#[derive(Debug, Clone, Deserialize)]
pub struct Warning {
    /// DCGM's words.
    pub warning: String,
    /// `dcgmError_t` (`DCGM_FR_...`).
    #[serde(default)]
    pub error_id: u32,
    /// `dcgmErrorCategory_t`.
    #[serde(default)]
    pub error_category: u32,
}

/// The words of `dcgmErrorCategory_t` (`dcgmlib/dcgm_errors.h`), lower case:
/// `hardware memory`, `software CUDA`...; `None` past the known ones.
pub fn category_words(category: u32) -> Option<&'static str> {
    Some(match category {
        0 => "none",
        1 => "performance threshold",
        2 => "performance violation",
        3 => "software configuration",
        4 => "software library",
        5 => "software XID",
        6 => "software CUDA",
        7 => "software EUD",
        8 => "software other",
        9 => "hardware thermal",
        10 => "hardware memory",
        11 => "hardware NVLink",
        12 => "hardware NVSwitch",
        13 => "hardware PCIe",
        14 => "hardware power",
        15 => "hardware other",
        16 => "internal other",
        _ => return None,
    })
}

/// One failure the diagnostic reported: the test, the GPU and DCGM's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiagFailure {
    /// The test as DCGM names it.
    pub test: String,
    /// The entity, `GPU 3` (`None`: the test as a whole).
    pub entity: Option<String>,
    /// DCGM's words (its first warning), or `status Fail` without one.
    pub message: String,
    /// The first warning's `error_id`.
    pub error_id: Option<u32>,
    /// The first warning's category ([`category_words`]).
    pub category: Option<&'static str>,
}

impl std::fmt::Display for DiagFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} failed", self.test)?;
        if let Some(e) = &self.entity {
            write!(f, " on {e}")?;
        }
        write!(f, ": {}", self.message)?;
        match (self.error_id, self.category) {
            (Some(id), Some(c)) => write!(f, " (DCGM error {id}, category {c})"),
            (Some(id), None) => write!(f, " (DCGM error {id})"),
            _ => Ok(()),
        }
    }
}

impl DiagOutput {
    /// Parses `dcgmi diag -j`'s standard output (text before the first `{` and after the
    /// last `}`, which some versions print, is ignored).
    ///
    /// # Errors
    /// serde_json's words when it is not DCGM's JSON.
    pub fn parse(stdout: &str) -> Result<DiagOutput, serde_json::Error> {
        let from = stdout.find('{').unwrap_or(0);
        let to = stdout.rfind('}').map_or(stdout.len(), |i| i + 1);
        serde_json::from_str(stdout.get(from..to).unwrap_or(stdout))
    }

    /// Every failure, in DCGM's order: each entity whose status is `Fail`, and a test
    /// whose summary is `Fail` with no failing entity.
    pub fn failures(&self) -> Vec<DiagFailure> {
        let mut out = Vec::new();
        for t in self
            .diagnostic
            .test_categories
            .iter()
            .flat_map(|c| c.tests.iter())
        {
            let before = out.len();
            for r in t.results.iter().filter(|r| r.status == "Fail") {
                let w = r.warnings.first();
                out.push(DiagFailure {
                    test: t.name.clone(),
                    entity: Some(format!(
                        "{} {}",
                        if r.entity_group.is_empty() {
                            "GPU"
                        } else {
                            &r.entity_group
                        },
                        r.entity_id
                    )),
                    message: w.map_or_else(|| "status Fail".into(), |w| w.warning.trim().into()),
                    error_id: w.map(|w| w.error_id),
                    category: w.and_then(|w| category_words(w.error_category)),
                });
            }
            if out.len() == before && t.test_summary.as_ref().is_some_and(|s| s.status == "Fail") {
                out.push(DiagFailure {
                    test: t.name.clone(),
                    entity: None,
                    message: "status Fail".into(),
                    error_id: None,
                    category: None,
                });
            }
        }
        out
    }

    /// How many tests ran and passed, for the record's words.
    pub fn passed_tests(&self) -> usize {
        self.diagnostic
            .test_categories
            .iter()
            .flat_map(|c| c.tests.iter())
            .filter(|t| t.test_summary.as_ref().is_some_and(|s| s.status == "Pass"))
            .count()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn fixture(name: &str) -> String {
        std::fs::read_to_string(format!(
            "{}/tests/fixtures/dcgm/{name}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
    }

    #[test]
    fn reads_a_passing_and_a_failing_diagnostic() {
        let pass = DiagOutput::parse(&fixture("diag-r1-pass.json")).unwrap();
        assert!(pass.failures().is_empty());
        assert!(pass.passed_tests() >= 2);
        let fail = DiagOutput::parse(&fixture("diag-r2-memory-fail-gpu3.json")).unwrap();
        let f = fail.failures();
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].test, "memory");
        assert_eq!(f[0].entity.as_deref(), Some("GPU 3"));
        assert_eq!(f[0].category, Some("hardware memory"));
        assert!(
            f[0].to_string().starts_with("memory failed on GPU 3: "),
            "{}",
            f[0]
        );
        let mig = DiagOutput::parse(&fixture("diag-runtime-error-mig.json")).unwrap();
        assert!(mig.diagnostic.runtime_error.unwrap().contains("MIG"));
        assert!(DiagOutput::parse("Error: Unable to connect to host engine.").is_err());
        // A failing summary with no failing entity is still a failure of the test.
        let text = r#"{"DCGM Diagnostic":{"test_categories":[{"category":"Stress","tests":[
            {"name":"targeted_power","results":[],"test_summary":{"status":"Fail"}}]}]}}"#;
        let f = DiagOutput::parse(text).unwrap().failures();
        assert_eq!(f[0].to_string(), "targeted_power failed: status Fail");
    }
}
