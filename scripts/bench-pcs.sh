#!/usr/bin/env bash
# Managed-join benchmark: the agent's PCS registration join (registration emulator, then
# slurmd as the pre-declared cloud node) to IDLE vs its configless join (dynamic node) to
# IDLE, alternately in one run on one local controller. Prints what the managed mode adds.
#
#   sudo scripts/bench-pcs.sh [TRIALS]
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/test-deps.sh
cargo build --release --locked --workspace --bins
SLURM_NODE_AGENT_BIN="$PWD/target/release/slurm-node-agent" exec target/release/bench-pcs "$@"
