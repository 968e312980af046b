#!/usr/bin/env bash
# Image boot benchmark (issue 14): the locally built image booted as one node of the fleet
# proving ground; prints systemd-analyze's boot time to multi-user.target, the slowest
# units and the critical chain inside the node (see tests/src/bin/image-boot-bench.rs).
# Figures are printed, never asserted.
#
#   sudo scripts/bench-image-boot.sh [TOP_UNITS]
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/test-deps.sh
cargo build --locked --workspace --bins
SLURM_NODE_AGENT_BIN="$PWD/target/debug/slurm-node-agent" exec target/debug/image-boot-bench "${1:-10}"
