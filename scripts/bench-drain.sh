#!/bin/sh
# Drain benchmark: latency from a spot interruption notice appearing in the IMDS emulator to
# the node shown draining by a real slurmctld (default 1 s polling, BENCH_TRIALS trials,
# default 50; goal p99 <= 2 s), then the idle daemon's CPU time (goal <= 0.1 % of one core)
# and RSS (goal <= 20 MiB) over BENCH_IDLE_SECS (default 60). Release build. Prints the
# numbers; asserts nothing about them.
#
# BENCH_DRAIN_TESTS: the drain tests' benchmarks to run, in order (default bench_drain;
# scripts/bench-noise.sh adds bench_noise).
#
# Needs what the e2e tests need: slurmctld, slurmd, munge (Debian packages), root.
set -eu
cd "$(dirname "$0")/.."
cargo build --release --locked --workspace --bins
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
SLURM_NODE_AGENT_BIN="${SLURM_NODE_AGENT_BIN:-$target_dir/release/slurm-node-agent}"
export SLURM_NODE_AGENT_BIN
echo "agent: $SLURM_NODE_AGENT_BIN"
# shellcheck disable=SC2086 # test names are words
cargo test --release --locked --workspace --test drain -- --ignored --exact ${BENCH_DRAIN_TESTS:-bench_drain} \
    --test-threads=1 --nocapture 2>&1 |
    grep -E '^BENCH|panicked|error' | sed 's/^BENCH //'
