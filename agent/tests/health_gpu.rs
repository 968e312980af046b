//! The GPU check (`kind = "gpu"`, through nvml-wrapper) against a stand-in
//! `libnvidia-ml.so.1` built here with `cc`: a small C library exporting the NVML symbols
//! the check calls, with the answers each case compiles in (counts, ECC errors, retired
//! pages, remapped rows, temperature, throttle reasons, NVLink states, failing and
//! hanging initialisation). No GPU is needed; what only a real GPU shows is the driver's
//! own behaviour (field value support per architecture, real XID records).
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use slurm_node_agent::health::{self, nhc, RunEnv, Status};

/// The stand-in library. Each `-D` below is one answer; defaults: two healthy GPUs.
const STUB: &str = r#"
#include <stdint.h>
#include <unistd.h>
#ifndef INIT
#define INIT 0
#endif
#ifndef HANG
#define HANG 0
#endif
#ifndef COUNT
#define COUNT 2
#endif
#ifndef ECC
#define ECC 0
#endif
#ifndef BAD_GPU
#define BAD_GPU 1
#endif
#ifndef RETIRED
#define RETIRED 0
#endif
#ifndef REMAP_UNC
#define REMAP_UNC 0
#endif
#ifndef REMAP_FAIL
#define REMAP_FAIL 0
#endif
#ifndef TEMP
#define TEMP 40
#endif
#ifndef THROTTLE
#define THROTTLE 0
#endif
#ifndef NVLINKS
#define NVLINKS 4
#endif
#ifndef DOWN_LINK
#define DOWN_LINK 99
#endif

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    union { double d; unsigned int ui; unsigned long ul; unsigned long long ull; long long sll; } value;
} nvmlFieldValue_t;

static unsigned idx(nvmlDevice_t d) { return (unsigned)(uintptr_t)d - 1; }
static int bad(nvmlDevice_t d) { return idx(d) == BAD_GPU; }

nvmlReturn_t nvmlInit_v2(void) { if (HANG) sleep(HANG); return INIT; }
nvmlReturn_t nvmlInitWithFlags(unsigned int f) { (void)f; return nvmlInit_v2(); }
nvmlReturn_t nvmlShutdown(void) { return 0; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *c) { *c = COUNT; return 0; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    if (i >= COUNT) return 2;
    *d = (nvmlDevice_t)(uintptr_t)(i + 1);
    return 0;
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int type, int counter, unsigned long long *n) {
    (void)type; (void)counter;
    *n = bad(d) ? ECC : 0;
    return 0;
}
nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t d, int cause, unsigned int *count, unsigned long long *a) {
    (void)cause; (void)a;
    *count = bad(d) ? RETIRED : 0;
    return 0;
}
nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t d, int cause, unsigned int *count,
                                          unsigned long long *a, unsigned long long *t) {
    (void)cause;
    unsigned n = bad(d) ? RETIRED : 0;
    if (*count < n) return 7; /* NVML_ERROR_INSUFFICIENT_SIZE */
    for (unsigned i = 0; i < n; i++) { a[i] = 0x1000 * i; t[i] = i; }
    *count = n;
    return 0;
}
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t d, int n, nvmlFieldValue_t *v) {
    for (int i = 0; i < n; i++) {
        v[i].valueType = 3; /* unsigned long long */
        v[i].nvmlReturn = 0;
        if (v[i].fieldId == 143) v[i].value.ull = bad(d) ? REMAP_UNC : 0;
        else if (v[i].fieldId == 145) v[i].value.ull = bad(d) ? REMAP_FAIL : 0;
        else v[i].nvmlReturn = 3;
    }
    return 0;
}
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *t) {
    (void)sensor;
    *t = bad(d) ? TEMP : 40;
    return 0;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *r) {
    *r = bad(d) ? THROTTLE : 0;
    return 0;
}
nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, int *active) {
    if (link >= NVLINKS) return 2;
    *active = !(bad(d) && link == DOWN_LINK);
    return 0;
}
"#;

/// Builds the stand-in with these `-D` answers into `dir`; returns its path.
fn stub(dir: &Path, name: &str, defines: &[&str]) -> PathBuf {
    let src = dir.join("nvml-stub.c");
    std::fs::write(&src, STUB).unwrap();
    let lib = dir.join(format!("{name}/libnvidia-ml.so.1"));
    std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-O0", "-o"])
        .arg(&lib)
        .arg(&src)
        .args(defines.iter().map(|d| format!("-D{d}")))
        .output()
        .expect("cc is needed to build the NVML stand-in");
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    lib
}

/// Runs one `kind = "gpu"` check named `name` with `extra` TOML keys on the stand-in
/// `lib`.
///
/// Every case has its own name: the engine remembers a check left hung by its origin and
/// name for the whole process (not started again while its thread is still stuck), and
/// the tests of this file share the process. Under one name, [`a_hanging_nvml_times_out`]
/// (whose stand-in sleeps 120 s) would make every later case of another test report
/// "still hung since a previous run", depending on which test runs first or faster.
async fn gpu(lib: &Path, name: &str, extra: &str, env: &RunEnv) -> (Status, String) {
    let toml = format!(
        "[[check]]\nkind = \"gpu\"\nname = \"gpu {name}\"\nlibrary = \"{}\"\n{extra}\n",
        lib.display()
    );
    let set = health::checksd::parse(
        &toml,
        Path::new("/test/gpu.toml"),
        &health::Target::for_node(Some("node1")),
        &nhc::Defaults {
            timeout: Duration::from_secs(20),
            slurm_bin_dir: std::path::PathBuf::new(),
        },
    )
    .unwrap();
    let r = health::run_checks(&set, env).await;
    (r.results[0].status, r.results[0].message.clone())
}

#[tokio::test]
async fn gpu_check_against_a_stand_in_nvml() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let env = RunEnv::default();
    let no_xid = "xid = false\ncount = 2\n";
    let cases: &[(&str, &[&str], &str, Status, &str)] = &[
        ("healthy", &[], no_xid, Status::Pass, "2 GPUs healthy"),
        (
            "count",
            &["COUNT=1"],
            no_xid,
            Status::Fail,
            "found 1 GPUs, expected 2",
        ),
        (
            "ecc",
            &["ECC=3"],
            no_xid,
            Status::Fail,
            "GPU 1: 3 uncorrected ECC errors (max 0)",
        ),
        (
            "ecc-allowed",
            &["ECC=3"],
            "xid = false\ncount = 2\nmax_uncorrected_ecc = 3\n",
            Status::Pass,
            "healthy",
        ),
        (
            "retired",
            &["RETIRED=31"],
            no_xid,
            // 31 pages for each of the two causes.
            Status::Fail,
            "GPU 1: 62 retired pages (max 60)",
        ),
        (
            "remapped",
            &["REMAP_UNC=513"],
            no_xid,
            Status::Fail,
            "GPU 1: 513 uncorrectable remapped rows (max 512)",
        ),
        (
            "remap-failed",
            &["REMAP_FAIL=1"],
            no_xid,
            Status::Fail,
            "GPU 1: row remapping failed",
        ),
        (
            "hot",
            &["TEMP=95"],
            "xid = false\ncount = 2\nmax_temperature_c = 85\n",
            Status::Fail,
            "GPU 1: temperature 95 °C (max 85)",
        ),
        (
            "slowdown",
            &["THROTTLE=0x8"],
            no_xid,
            Status::Fail,
            "GPU 1: hardware slowdown",
        ),
        (
            "slowdown-allowed",
            &["THROTTLE=0x8"],
            "xid = false\ncount = 2\nfail_on_hw_slowdown = false\n",
            Status::Pass,
            "healthy",
        ),
        (
            "nvlink",
            &["DOWN_LINK=3"],
            "xid = false\ncount = 2\nnvlink = true\n",
            Status::Fail,
            "GPU 1: NVLink 3 inactive",
        ),
        (
            "nvlink-unchecked",
            &["DOWN_LINK=3"],
            no_xid,
            Status::Pass,
            "healthy",
        ),
        // NVML_ERROR_DRIVER_NOT_LOADED: no GPU, which fails only when GPUs are expected.
        (
            "no-driver",
            &["INIT=9"],
            "xid = false\n",
            Status::Pass,
            "no GPU",
        ),
        (
            "no-driver-expected",
            &["INIT=9"],
            no_xid,
            Status::Fail,
            "expected 2 GPUs, but NVML is unavailable",
        ),
        // NVML_ERROR_UNKNOWN.
        (
            "init-fails",
            &["INIT=999"],
            no_xid,
            Status::Fail,
            "NVML initialisation failed",
        ),
    ];
    let mut wrong = Vec::new();
    for (name, defines, extra, want, needle) in cases {
        let lib = stub(dir, name, defines);
        let (st, m) = gpu(&lib, name, extra, &env).await;
        if st != *want || !m.contains(needle) {
            wrong.push(format!(
                "{name}: {st:?} {m:?}, expected {want:?} with {needle:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "\n{}", wrong.join("\n"));

    // XID records from the kernel log (a stand-in kmsg file): 79 fails, 13 is ignored.
    let lib = stub(dir, "xid", &[]);
    let kmsg = dir.join("kmsg");
    let mut env = RunEnv::default();
    env.host.kmsg = kmsg.clone();
    std::fs::write(
        &kmsg,
        "4,1203,5512,-;NVRM: Xid (PCI:0000:00:1e): 79, pid=1234, GPU has fallen off the bus.\n",
    )
    .unwrap();
    let (st, m) = gpu(&lib, "xid-79", "count = 2\n", &env).await;
    assert!(
        st == Status::Fail && m.contains("XID 79 on 0000:00:1e"),
        "{m}"
    );
    std::fs::write(
        &kmsg,
        "4,1,2,-;NVRM: Xid (PCI:0000:00:1e): 13, Graphics Exception\n",
    )
    .unwrap();
    let (st, m) = gpu(&lib, "xid-13", "count = 2\n", &env).await;
    assert!(st == Status::Pass, "{m}");
}

/// An NVML call that never returns (a wedged GPU) fails the check at its timeout instead
/// of hanging the run.
#[tokio::test]
async fn a_hanging_nvml_times_out() {
    let d = tempfile::tempdir().unwrap();
    let lib = stub(d.path(), "hang", &["HANG=120"]);
    let hang = "xid = false\ntimeout = \"1s\"\n";
    let (st, m) = gpu(&lib, "hang", hang, &RunEnv::default()).await;
    assert_eq!(st, Status::Timeout, "{m}");
    // Its thread is still in nvmlInit (for 120 s): the same check is not started again.
    let (st, m) = gpu(&lib, "hang", hang, &RunEnv::default()).await;
    assert!(
        st == Status::Timeout && m.contains("still hung since a previous run"),
        "{m}"
    );
}
