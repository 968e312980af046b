#!/usr/bin/env bash
# Bootstrap benchmark: agent bootstrap to IDLE vs a bare `slurmd -Z` to IDLE, measured
# alternately on one local controller, and the agent's peak RSS. Prints the ratio.
#
#   sudo scripts/bench-bootstrap.sh [TRIALS]
#   sudo SLURM_E2E_VERSION=24.11 scripts/bench-bootstrap.sh   # per Slurm version
#
# BENCH_PROFILE=debug measures the debug build instead (no release build of the AWS SDK
# crates; the agent's own CPU time then weighs several times more). BENCH_STEPS=1 prints
# each trial's steps; BENCH_AGENT_LOG=<RUST_LOG> prints the agent's log of each trial
# (e.g. `info,slurm_node_agent=debug` for the key prefetch's and the join's timings).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/test-deps.sh
# The Slurm to measure against (scripts/test.sh's variable; default 25.11): the figures
# are printed for that version.
SLURM_E2E_VERSION=${SLURM_E2E_VERSION:-25.11}
SLURM_E2E_PREFIX=$(scripts/slurm-build.sh "$SLURM_E2E_VERSION" | tail -n1)
export SLURM_E2E_VERSION SLURM_E2E_PREFIX
echo "Slurm $("$SLURM_E2E_PREFIX/sbin/slurmd" -V | awk '{print $2}') ($SLURM_E2E_PREFIX)"
if [ "${BENCH_PROFILE:-release}" = debug ]; then
    cargo build --workspace --locked --bins
    dir=target/debug
else
    cargo build --release --locked --workspace --bins
    dir=target/release
fi
SLURM_NODE_AGENT_BIN="$PWD/$dir/slurm-node-agent" exec "$dir/bench-bootstrap" "$@"
