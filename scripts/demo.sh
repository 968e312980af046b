#!/usr/bin/env bash
# Local demo on a fresh Debian 12 machine, as root: installs what it needs, starts
# slurmctld, munge, moto, the IMDS emulator and a confined systemd Manager, runs
# `slurm-node-agent bootstrap`, shows the node IDLE in sinfo and jobs running on it, and
# cleans up. (A debug build: it shares the test suite's build and compiles much faster
# than the release profile, which the benchmarks use.)
#
#   sudo scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/test-deps.sh
cargo build --locked -p slurm-node-agent -p slurm-e2e --bins
SLURM_NODE_AGENT_BIN="$PWD/target/debug/slurm-node-agent" exec target/debug/demo
