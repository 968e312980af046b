#!/usr/bin/env bash
# Bootstrap benchmark: agent bootstrap to IDLE vs a bare `slurmd -Z` to IDLE, measured
# alternately on one local controller, and the agent's peak RSS. Prints the ratio.
#
#   sudo scripts/bench-bootstrap.sh [TRIALS]
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/test-deps.sh
cargo build --release --locked -p slurm-node-agent -p slurm-e2e --bins
SLURM_NODE_AGENT_BIN="$PWD/target/release/slurm-node-agent" exec target/release/bench-bootstrap "$@"
