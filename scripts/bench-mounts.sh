#!/usr/bin/env bash
# Time the agent adds per mount on top of the mount itself, on tmpfs: the agent's whole
# path (unit written, job started through the systemd Manager and waited for, mount
# table read, statfs, ready marker written) against a bare mount(8), median over
# BENCH_RUNS runs (default 30; one a second, as systemd rate-limits mount table events
# to 5 a second), under a real, confined systemd --user (the test harness's).
# Goal: <= 20 ms added per mount.
#
#   sudo scripts/bench-mounts.sh            # release build
#   BENCH_RUNS=100 PROFILE=dev scripts/bench-mounts.sh
#
# Needs root (mounts, cgroups), systemd, nsenter: the same machine as the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=${PROFILE:-release}
export BENCH_RUNS=${BENCH_RUNS:-30}
if [ "$(id -u)" -ne 0 ]; then
	echo "bench-mounts: run as root (it mounts file systems and creates cgroups)" >&2
	exit 1
fi
args=(--profile "$profile")
cargo test "${args[@]}" --workspace --test mounts -- \
	--ignored --exact bench_mount_overhead --nocapture --test-threads=1 2>&1 |
	grep -E '^(runs|bare|agent|added)' || {
	echo "bench-mounts: the benchmark failed; rerun with: cargo test ${args[*]} --workspace --test mounts -- --ignored bench_mount_overhead --nocapture" >&2
	exit 1
}
