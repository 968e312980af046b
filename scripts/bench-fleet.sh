#!/usr/bin/env bash
# Fleet benchmark: the project's image booted as N nodes (default 16), figures printed as
# ratios, never asserted (see tests/src/bin/fleet-bench.rs for what is measured):
#   - one node alone: container start -> IDLE, and the agent's share of it (goal <= 10 %);
#   - N nodes at once: the agent's part per node / the lone node's (goal <= 1.5);
#   - controller load with N idle nodes: RPCs per node per minute from sdiag (goal <= 2);
#   - a spot storm on all N nodes: notice -> DRAIN p50/p99 (goal p99 <= 2 s);
#   - N nodes to all IDLE with the agent / the same image with a plain static slurmd
#     (goal <= 1.2);
#   - a rolling upgrade of 8 busy nodes, budget 2, 30 s jobs: time / ideal (goal <= 1.3).
#
#   sudo scripts/bench-fleet.sh [NODES] [IDLE_SECONDS]
#   FLEET_BENCH_SOLO_ONLY=1 scripts/bench-fleet.sh   # only the lone node's boots and bootstrap's steps
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/test-deps.sh
# The Slurm to measure against (scripts/test.sh's variable; default 25.11): the figures
# are printed for that version.
SLURM_E2E_VERSION=${SLURM_E2E_VERSION:-25.11}
SLURM_E2E_PREFIX=$(scripts/slurm-build.sh "$SLURM_E2E_VERSION" | tail -n1)
export SLURM_E2E_VERSION SLURM_E2E_PREFIX
echo "Slurm $("$SLURM_E2E_PREFIX/sbin/slurmd" -V | awk '{print $2}') ($SLURM_E2E_PREFIX)"
# --workspace, not -p: per-package builds resolve dependency features differently and
# rebuild the AWS SDK crates.
# The image carries the release agent, as shipped images do (the debug build's CPU cost
# would be measured instead of the agent's); the harness itself runs from the debug build.
cargo build --locked --workspace --bins
cargo build --locked --workspace --bins --release
SLURM_NODE_AGENT_BIN="$PWD/target/release/slurm-node-agent" exec target/debug/fleet-bench "${1:-16}" "${2:-60}"
