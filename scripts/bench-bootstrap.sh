#!/usr/bin/env bash
# Bootstrap benchmark: agent bootstrap to IDLE vs a bare `slurmd -Z` to IDLE and vs munge
# and slurmd started through their units with the agent's files (the systemd route: the
# floor of any agent that starts them through systemd), measured alternately on one local
# controller, and the agent's peak RSS. Prints the ratios, per Slurm version.
#
#   sudo scripts/bench-bootstrap.sh [TRIALS]
#   sudo SLURM_E2E_VERSION=24.11 scripts/bench-bootstrap.sh       # one Slurm version
#   sudo BENCH_SLURM_VERSIONS="24.11 25.11 26.05" scripts/bench-bootstrap.sh
#                                  # each version in turn, then their ratios side by side
#
# BENCH_PROFILE=debug measures the debug build instead (no release build of the AWS SDK
# crates; the agent's own CPU time then weighs several times more). BENCH_STEPS=1 prints
# each trial's steps; BENCH_AGENT_LOG=<RUST_LOG> prints the agent's log of each trial
# (e.g. `info,slurm_node_agent=debug` for the key prefetch's and the join's timings).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/test-deps.sh
# The Slurm versions to measure against: scripts/lib-bench.sh.
# shellcheck source=scripts/lib-bench.sh
. scripts/lib-bench.sh
if [ "${BENCH_PROFILE:-release}" = debug ]; then
    cargo build --workspace --locked --bins
    dir=target/debug
else
    cargo build --release --locked --workspace --bins
    dir=target/release
fi
run() {
    SLURM_E2E_VERSION=$1 SLURM_E2E_PREFIX=$2 SLURM_NODE_AGENT_BIN="$PWD/$dir/slurm-node-agent" \
        "$dir/bench-bootstrap" "${args[@]}"
}
row() {
    ratio() { awk -v k="$1" 'index($0, k) == 1 { sub(/^[^:]*: /, ""); print $1 }' "$2"; }
    printf '%-9s %10s %10s %12s %10s' "$1" "$(ratio 'ratio agent/systemd route' "$2")" \
        "$(ratio 'ratio agent/bare' "$2")" "$(ratio 'ratio systemd route/bare' "$2")" \
        "$(awk '/^agent peak RSS/ { print $(NF-5) }' "$2")"
}
args=("$@")
bench_each_version run row
if [ ${#bench_versions[@]} -gt 1 ]; then
    echo "per Slurm version (medians; agent/systemd route: what the agent adds to the floor)"
    printf '%-9s %10s %10s %12s %10s\n' Slurm agent/sysd agent/bare sysd/bare "RSS MiB"
    printf '%s\n' "${bench_summary[@]}"
fi
