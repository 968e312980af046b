//! Each GPU's NVLink fabric state, from `nvidia-smi -q`, with rules per instance type
//! family.
//!
//! On NVSwitch and NVLink-fabric instances a GPU can look healthy to NVML and `nvidia-smi`
//! while CUDA fails with error 802 ("system not yet initialized"): the GPU never finished
//! registering with the fabric (NVIDIA/gpu-operator #2781: on p6-b200, Fabric Manager
//! started without `ib_umad` and NVLSM, exited, and every GPU stayed "In Progress").
//! NVML reports the state through `nvmlDeviceGetGpuFabricInfoV`, which nvml-wrapper does
//! not wrap safely, and the workspace denies `unsafe`: so `nvidia-smi -q` is run as a
//! program with the checks' command runner ([`cmd::run_command`]: argv, no shell, killed
//! with its cgroup and process group at a timeout) and the `Fabric` section of each GPU
//! read from its text ([`parse_query`]).
//!
//! The section, as drivers since R530 print it (NVIDIA's nvidia-smi(1), "Fabric"):
//!
//! ```text
//! GPU 00000000:18:00.0
//!     ...
//!     Fabric
//!         State                             : Completed
//!         Status                            : Success
//!         CliqueId                          : 0
//!         ClusterUUID                       : 00000000-0000-0000-0000-000000000000
//!         Health
//!             Bandwidth                     : N/A
//! ```
//!
//! State is one of `Not Supported`/`N/A`, `Not Started`, `In Progress`, `Completed`
//! (NVML's `NVML_GPU_FABRIC_STATE_*`); Status is meaningful only once the state is
//! `Completed` (NVML: "must be checked only if state returns complete"). R570 and later
//! add `Health` fields (`Summary`, `Bandwidth`, `Route Recovery in progress`, ...).

use std::time::Duration;

use super::super::cmd;

/// nvidia-smi's program (the driver's `nvidia-utils` / `nvidia-driver` packages).
pub const NVIDIA_SMI_PROGRAM: &str = "/usr/bin/nvidia-smi";

/// How long `nvidia-smi -q` may take: a few seconds with nvidia-persistenced running (the
/// images enable it), longer without while the driver initialises each GPU.
pub const NVIDIA_SMI_TIMEOUT: Duration = Duration::from_secs(10);

/// Most bytes of `nvidia-smi -q` kept (about 10 KiB per GPU): beyond it, its first and last
/// halves ([`cmd::run_command`]).
const OUTPUT_LIMIT: usize = 4 << 20;

/// Whether a GPU check looks at the fabric state (checks.d key `fabric`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FabricCheck {
    /// On the NVLink-fabric instance types only ([`NvlinkFabric::of`]).
    #[default]
    Auto,
    /// On every instance type: each GPU must be `Completed`, `Success`.
    On,
    /// Never.
    Off,
}

impl FabricCheck {
    /// Whether the fabric is checked on a node of `platform` (`None`: an instance type
    /// without an NVLink fabric, or none detected).
    pub fn wanted(self, platform: Option<NvlinkFabric>) -> bool {
        match self {
            FabricCheck::Auto => platform.is_some(),
            FabricCheck::On => true,
            FabricCheck::Off => false,
        }
    }
}

/// The NVLink fabric of an instance type family, where its GPUs must register with one
/// before CUDA can use them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NvlinkFabric {
    /// p5, p5e, p5en: HGX H100/H200 on NVSwitches; NVIDIA Fabric Manager runs on the node.
    Hopper,
    /// p6-b200: HGX B200 (NVLink 5); Fabric Manager runs on the node with NVLSM (the
    /// NVLink subnet manager), which reaches the NVSwitches through the InfiniBand stack
    /// (`ib_umad`).
    Blackwell,
    /// p6e-gb200: GB200 NVL72; the fabric is managed outside the node (the rack's NVLink
    /// switch trays), and an inactive Fabric Manager on the node is expected.
    Gb200,
}

impl NvlinkFabric {
    /// The fabric of an EC2 instance type (`p6-b200.48xlarge`), by family; `None` for
    /// families whose GPUs report no fabric state (p4d and p4de: A100 on NVSwitches, whose
    /// Fabric section is `N/A`; g5, g6, ... without NVSwitches).
    pub fn of(instance_type: &str) -> Option<NvlinkFabric> {
        match instance_type.split('.').next().unwrap_or_default() {
            "p5" | "p5e" | "p5en" => Some(NvlinkFabric::Hopper),
            "p6-b200" => Some(NvlinkFabric::Blackwell),
            "p6e-gb200" => Some(NvlinkFabric::Gb200),
            _ => None,
        }
    }

    /// What a GPU that has not finished registering points to.
    fn unregistered_hint(self) -> &'static str {
        match self {
            NvlinkFabric::Hopper => {
                "Fabric Manager has not finished; on p5 it must run at the driver's version"
            }
            NvlinkFabric::Blackwell => {
                "Fabric Manager has not finished; on p6-b200 it needs ib_umad loaded and NVLSM"
            }
            NvlinkFabric::Gb200 => {
                "the NVLink fabric has not registered the GPU; on p6e-gb200 it is managed \
                 outside the node"
            }
        }
    }
}

/// One GPU of `nvidia-smi -q`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuFabric {
    /// nvidia-smi's index: the GPU's position in the output (nvidia-smi lists GPUs in
    /// index order).
    pub index: u32,
    /// PCI bus id as nvidia-smi writes it (`00000000:9A:00.0`); `None` for a Fabric
    /// section without its GPU's header (a `grep -A` excerpt).
    pub bus_id: Option<String>,
    /// Its Fabric section; `None` when the driver prints none.
    pub fabric: Option<FabricInfo>,
}

/// A GPU's Fabric section, values as nvidia-smi writes them (`N/A` included); `None` for
/// a key the section lacks.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FabricInfo {
    /// `State`: `Completed`, `In Progress`, `Not Started`, `Not Supported`, `N/A`.
    pub state: Option<String>,
    /// `Status`: `Success`, `N/A`, or an NVML error in words (`Insufficient Resources`).
    pub status: Option<String>,
    /// `CliqueId`.
    pub clique_id: Option<String>,
    /// `ClusterUUID`.
    pub cluster_uuid: Option<String>,
    /// The `Health` sub-section's fields in order (`Summary`, `Bandwidth`, ...), on drivers
    /// that print it.
    pub health: Vec<(String, String)>,
}

impl FabricInfo {
    /// A health field by name.
    pub fn health(&self, key: &str) -> Option<&str> {
        self.health
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Where the parser is inside a GPU's Fabric section.
struct InFabric {
    /// Indent of the `Fabric` line.
    indent: usize,
    /// Indent of the `Health` line, once seen.
    health: Option<usize>,
}

/// Reads `nvidia-smi -q` (or `-a`) text into its GPUs (`GPU <bus id>` lines at the start
/// of a line) and their Fabric sections, whatever the width of the key column (it grew in
/// R580). A Fabric section before any GPU header, or a second one under the same header
/// (excerpts cut with `grep -A`), counts as a GPU of its own without a bus id; `--` lines
/// and anything else outside a Fabric section are skipped.
pub fn parse_query(text: &str) -> Vec<GpuFabric> {
    let mut gpus: Vec<GpuFabric> = Vec::new();
    let mut inside: Option<InFabric> = None;
    for line in text.lines() {
        let body = line.trim();
        if body.is_empty() {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        if indent == 0 {
            if let Some(bus) = body
                .strip_prefix("GPU ")
                .filter(|b| super::pci_address(b).is_some())
            {
                gpus.push(GpuFabric {
                    index: gpus.len() as u32,
                    bus_id: Some(bus.to_string()),
                    fabric: None,
                });
                inside = None;
                continue;
            }
        }
        if body == "Fabric" {
            if gpus.last().is_none_or(|g| g.fabric.is_some()) {
                gpus.push(GpuFabric {
                    index: gpus.len() as u32,
                    bus_id: None,
                    fabric: None,
                });
            }
            if let Some(g) = gpus.last_mut() {
                g.fabric = Some(FabricInfo::default());
            }
            inside = Some(InFabric {
                indent,
                health: None,
            });
            continue;
        }
        let Some(at) = inside.as_mut() else {
            continue;
        };
        if indent <= at.indent {
            inside = None;
            continue;
        }
        if at.health.is_some_and(|h| indent <= h) {
            at.health = None;
        }
        if body == "Health" {
            at.health = Some(indent);
            continue;
        }
        let Some((key, value)) = body.split_once(':') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim().to_string());
        let Some(f) = gpus.last_mut().and_then(|g| g.fabric.as_mut()) else {
            continue;
        };
        if at.health.is_some() {
            f.health.push((key.to_string(), value));
            continue;
        }
        match key {
            "State" => f.state = Some(value),
            "Status" => f.status = Some(value),
            "CliqueId" => f.clique_id = Some(value),
            "ClusterUUID" => f.cluster_uuid = Some(value),
            _ => {}
        }
    }
    gpus
}

/// What is wrong with the GPUs' fabric, one message per GPU, in NHC's style:
/// `GPU 3 (00000000:9A:00.0): fabric state In Progress, status N/A (Fabric Manager has not
/// finished; on p6-b200 it needs ib_umad loaded and NVLSM)`. Every GPU must be `Completed`
/// with status `Success`, and a health `Summary` other than `Unhealthy`; `platform` picks
/// the hint for a GPU still registering (none: no hint).
pub fn fabric_problems(gpus: &[GpuFabric], platform: Option<NvlinkFabric>) -> Vec<String> {
    if gpus.is_empty() {
        return vec!["nvidia-smi -q listed no GPU: the GPUs' fabric state is unknown".into()];
    }
    let mut out = Vec::new();
    for g in gpus {
        let label = match &g.bus_id {
            Some(b) => format!("GPU {} ({b})", g.index),
            None => format!("GPU {}", g.index),
        };
        let Some(f) = &g.fabric else {
            out.push(format!(
                "{label}: nvidia-smi -q shows no Fabric section (a driver older than R530 \
                 reports no fabric state)"
            ));
            continue;
        };
        let state = f.state.as_deref().unwrap_or("missing");
        let status = f.status.as_deref().unwrap_or("missing");
        if state == "Completed" && status == "Success" {
            if f.health("Summary") == Some("Unhealthy") {
                let fields: Vec<String> = f
                    .health
                    .iter()
                    .filter(|(k, _)| k != "Summary")
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect();
                out.push(format!(
                    "{label}: fabric health Unhealthy ({})",
                    fields.join(", ")
                ));
            }
            continue;
        }
        let hint = match (state, platform) {
            ("In Progress" | "Not Started", Some(p)) => format!(" ({})", p.unregistered_hint()),
            ("In Progress" | "Not Started", None) => " (Fabric Manager has not finished)".into(),
            _ => String::new(),
        };
        out.push(format!(
            "{label}: fabric state {state}, status {status}{hint}"
        ));
    }
    out
}

/// Runs `<program> -q` and returns what is wrong with the GPUs' fabric
/// ([`fabric_problems`]), or the one problem of nvidia-smi itself (not started, failed,
/// silent past `timeout`), naming the program.
pub fn check_fabric(
    program: &str,
    timeout: Duration,
    platform: Option<NvlinkFabric>,
) -> Vec<String> {
    // The checks' command runner: no shell, a cgroup and process group of its own killed
    // at `timeout`, output read as it comes and bounded.
    let argv = [program.to_string(), "-q".to_string()];
    let o = match cmd::run_command_blocking(&argv, timeout, OUTPUT_LIMIT) {
        Ok(o) => o,
        Err(e) => {
            // The program is named once: the start error's own words without it.
            let why = match e {
                cmd::CommandError::Start { source, .. } => source.to_string(),
                e => e.to_string(),
            };
            return vec![format!(
                "nvidia-smi -q could not be started ({program}: {why}): the GPUs' fabric state \
                 is unknown"
            )];
        }
    };
    if o.timed_out {
        return vec![format!(
            "nvidia-smi -q answered nothing within {}s ({program}; killed): the GPUs' fabric \
             state is unknown",
            timeout.as_secs_f32()
        )];
    }
    if o.code == Some(0) {
        return fabric_problems(&parse_query(&String::from_utf8_lossy(&o.stdout)), platform);
    }
    // nvidia-smi writes its errors to stdout ("NVIDIA-SMI has failed because it couldn't
    // communicate with the NVIDIA driver"): the first line it printed.
    let said: String = [&o.stdout, &o.stderr]
        .iter()
        .flat_map(|b| {
            String::from_utf8_lossy(b)
                .lines()
                .map(|l| l.trim().to_string())
                .collect::<Vec<_>>()
        })
        .find(|l| !l.is_empty())
        .unwrap_or_default()
        .chars()
        .take(200)
        .collect();
    let how = o.code.map_or_else(
        || "was killed by a signal".to_string(),
        |c| format!("exited with status {c}"),
    );
    vec![format!(
        "nvidia-smi -q {how} ({program}): {said:?}: the GPUs' fabric state is unknown"
    )]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::Instant;

    fn fixture(name: &str) -> String {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/nvidia-smi")
            .join(name);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    const H100: &str = "h100-sxm-x8-565.57.01-completed.txt";
    const A100: &str = "a100-sxm-x4-555.42.02-na.txt";
    const IN_PROGRESS: &str = "gpu-operator-2511-580.159.04-fabric-in-progress.txt";
    const UNHEALTHY: &str = "dra-driver-626-fabric-completed-unhealthy.txt";
    const INSUFFICIENT: &str = "azhpc-images-506-fabric-insufficient-resources.txt";

    /// The H100 capture with each GPU's Fabric section replaced by the In Progress one of
    /// gpu-operator #2511 (a node whose Fabric Manager exited, as in #2781).
    fn h100_in_progress() -> String {
        let stuck = fixture(IN_PROGRESS);
        let mut out = String::new();
        let mut skipping = false;
        for line in fixture(H100).lines() {
            if line == "    Fabric" {
                out.push_str(&stuck);
                skipping = true;
                continue;
            }
            if skipping && line.starts_with("        ") {
                continue;
            }
            skipping = false;
            out.push_str(line);
            out.push('\n');
        }
        out
    }

    #[test]
    fn a_whole_h100_capture_reads_as_eight_gpus_completed_with_their_bus_ids() {
        let gpus = parse_query(&fixture(H100));
        assert_eq!(gpus.len(), 8);
        assert_eq!(gpus[0].bus_id.as_deref(), Some("00000000:18:00.0"));
        assert_eq!(gpus[4].index, 4);
        assert_eq!(gpus[4].bus_id.as_deref(), Some("00000000:9A:00.0"));
        assert_eq!(gpus[7].bus_id.as_deref(), Some("00000000:DB:00.0"));
        for g in &gpus {
            let f = g.fabric.as_ref().unwrap();
            assert_eq!(f.state.as_deref(), Some("Completed"), "{g:?}");
            assert_eq!(f.status.as_deref(), Some("Success"), "{g:?}");
            assert_eq!(f.clique_id.as_deref(), Some("0"));
            assert_eq!(
                f.cluster_uuid.as_deref(),
                Some("00000000-0000-0000-0000-000000000000")
            );
            assert_eq!(f.health, vec![("Bandwidth".into(), "N/A".into())]);
        }
        assert!(fabric_problems(&gpus, Some(NvlinkFabric::Hopper)).is_empty());
    }

    #[test]
    fn an_a100_capture_reads_as_not_applicable() {
        let gpus = parse_query(&fixture(A100));
        assert_eq!(gpus.len(), 4);
        assert_eq!(gpus[3].bus_id.as_deref(), Some("00000000:D4:00.0"));
        for g in &gpus {
            let f = g.fabric.as_ref().unwrap();
            assert_eq!(f.state.as_deref(), Some("N/A"));
            assert_eq!(f.status.as_deref(), Some("N/A"));
        }
        // On a type whose fabric is checked anyway (fabric = true), N/A fails.
        let p = fabric_problems(&gpus, None);
        assert_eq!(p.len(), 4);
        assert_eq!(
            p[0],
            "GPU 0 (00000000:68:00.0): fabric state N/A, status N/A"
        );
    }

    #[test]
    fn the_r580_in_progress_section_reads_with_its_wider_column_and_health_fields() {
        let gpus = parse_query(&fixture(IN_PROGRESS));
        assert_eq!(gpus.len(), 1);
        assert_eq!(gpus[0].bus_id, None);
        let f = gpus[0].fabric.as_ref().unwrap();
        assert_eq!(f.state.as_deref(), Some("In Progress"));
        assert_eq!(f.status.as_deref(), Some("N/A"));
        assert_eq!(f.clique_id.as_deref(), Some("N/A"));
        assert_eq!(f.health.len(), 7);
        assert_eq!(f.health("Summary"), Some("N/A"));
        assert_eq!(f.health("Partition Assigned"), Some("N/A"));
        assert_eq!(f.health("Route Recovery in progress"), Some("N/A"));
    }

    #[test]
    fn completed_is_not_enough_without_success_or_with_an_unhealthy_summary() {
        let gpus = parse_query(&fixture(INSUFFICIENT));
        assert_eq!(
            fabric_problems(&gpus, Some(NvlinkFabric::Hopper)),
            vec!["GPU 0: fabric state Completed, status Insufficient Resources".to_string()]
        );
        // A grep excerpt: its `--` separator ends the section.
        let gpus = parse_query(&fixture(UNHEALTHY));
        assert_eq!(gpus.len(), 1);
        let f = gpus[0].fabric.as_ref().unwrap();
        assert_eq!(
            f.cluster_uuid.as_deref(),
            Some("dc6e40c4-d722-4357-9ba6-5291dd461278")
        );
        assert_eq!(f.clique_id.as_deref(), Some("2"));
        assert_eq!(
            fabric_problems(&gpus, Some(NvlinkFabric::Gb200)),
            vec!["GPU 0: fabric health Unhealthy (Bandwidth Full)".to_string()]
        );
    }

    #[test]
    fn a_gpu_still_registering_fails_naming_it_with_the_platforms_hint() {
        let gpus = parse_query(&h100_in_progress());
        assert_eq!(gpus.len(), 8);
        let p = fabric_problems(&gpus, Some(NvlinkFabric::Blackwell));
        assert_eq!(p.len(), 8);
        assert_eq!(
            p[4],
            "GPU 4 (00000000:9A:00.0): fabric state In Progress, status N/A (Fabric Manager \
             has not finished; on p6-b200 it needs ib_umad loaded and NVLSM)"
        );
        let p = fabric_problems(&gpus, Some(NvlinkFabric::Hopper));
        assert!(
            p[0].ends_with(
                "(Fabric Manager has not finished; on p5 it must run at the driver's version)"
            ),
            "{}",
            p[0]
        );
        let p = fabric_problems(&gpus, Some(NvlinkFabric::Gb200));
        assert!(p[0].contains("managed outside the node"), "{}", p[0]);
        assert!(!p[0].contains("ib_umad"), "{}", p[0]);
    }

    #[test]
    fn platforms_by_instance_type_family() {
        for t in ["p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge"] {
            assert_eq!(NvlinkFabric::of(t), Some(NvlinkFabric::Hopper), "{t}");
        }
        assert_eq!(
            NvlinkFabric::of("p6-b200.48xlarge"),
            Some(NvlinkFabric::Blackwell)
        );
        assert_eq!(
            NvlinkFabric::of("p6e-gb200.36xlarge"),
            Some(NvlinkFabric::Gb200)
        );
        // A100 on NVSwitches: Fabric Manager yes, fabric state N/A, not checked.
        for t in [
            "p4d.24xlarge",
            "p4de.24xlarge",
            "g5.48xlarge",
            "g6.xlarge",
            "c7i.large",
        ] {
            assert_eq!(NvlinkFabric::of(t), None, "{t}");
        }
        // Auto: on the fabric families only; true and false whatever the type.
        for p in [
            Some(NvlinkFabric::Hopper),
            Some(NvlinkFabric::Blackwell),
            Some(NvlinkFabric::Gb200),
        ] {
            assert!(FabricCheck::Auto.wanted(p), "{p:?}");
        }
        assert!(!FabricCheck::Auto.wanted(NvlinkFabric::of("p4d.24xlarge")));
        assert!(FabricCheck::On.wanted(None));
        assert!(!FabricCheck::Off.wanted(Some(NvlinkFabric::Blackwell)));
    }

    fn script(dir: &std::path::Path, name: &str, body: &str) -> String {
        let p = dir.join(name);
        crate::fsutil::write_test_program(&p, body);
        p.display().to_string()
    }

    #[test]
    fn a_stand_in_nvidia_smi_is_run_with_q_and_its_output_read() {
        let dir = tempfile::tempdir().unwrap();
        let fx = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/nvidia-smi")
            .join(H100);
        // Only `-q` prints the capture (80 KB: more than a pipe holds before it is read).
        let ok = script(
            dir.path(),
            "smi-ok",
            &format!(
                "#!/bin/sh\n[ \"$1\" = -q ] || exit 2\nexec cat '{}'\n",
                fx.display()
            ),
        );
        let t = Duration::from_secs(10);
        assert_eq!(
            check_fabric(&ok, t, Some(NvlinkFabric::Hopper)),
            Vec::<String>::new()
        );
        let stuck = dir.path().join("stuck.txt");
        std::fs::write(&stuck, h100_in_progress()).unwrap();
        let bad = script(
            dir.path(),
            "smi-stuck",
            &format!("#!/bin/sh\nexec cat '{}'\n", stuck.display()),
        );
        let p = check_fabric(&bad, t, Some(NvlinkFabric::Blackwell));
        assert_eq!(p.len(), 8);
        assert!(
            p[7].starts_with("GPU 7 (00000000:DB:00.0): fabric state In Progress"),
            "{}",
            p[7]
        );
    }

    #[test]
    fn a_hanging_failing_or_missing_nvidia_smi_is_named() {
        let dir = tempfile::tempdir().unwrap();
        // A child that keeps the pipe open after its parent is killed: the group goes.
        let hang = script(dir.path(), "smi-hang", "#!/bin/sh\nsleep 30 &\nsleep 30\n");
        let start = Instant::now();
        let p = check_fabric(&hang, Duration::from_millis(300), None);
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(p.len(), 1);
        assert!(
            p[0].starts_with("nvidia-smi -q answered nothing within 0.3s (")
                && p[0].contains("smi-hang; killed)"),
            "{}",
            p[0]
        );
        let fail = script(
            dir.path(),
            "smi-fail",
            "#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't communicate with the \
             NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.\"\n\
             exit 9\n",
        );
        let p = check_fabric(&fail, Duration::from_secs(10), None);
        assert!(
            p[0].starts_with("nvidia-smi -q exited with status 9 (")
                && p[0].contains("NVIDIA-SMI has failed because it couldn't communicate"),
            "{}",
            p[0]
        );
        let p = check_fabric("/nonexistent/nvidia-smi", Duration::from_secs(1), None);
        assert!(
            p[0].starts_with("nvidia-smi -q could not be started (/nonexistent/nvidia-smi: "),
            "{}",
            p[0]
        );
        // Exit 0 with nothing a GPU: unknown, not healthy.
        let empty = script(
            dir.path(),
            "smi-empty",
            "#!/bin/sh\necho 'No devices were found'\n",
        );
        let p = check_fabric(&empty, Duration::from_secs(10), None);
        assert_eq!(
            p,
            vec!["nvidia-smi -q listed no GPU: the GPUs' fabric state is unknown".to_string()]
        );
    }
}
