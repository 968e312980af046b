#!/usr/bin/env bash
# Local demo on a fresh Debian 12 machine, as root: installs what it needs, starts
# slurmctld, munge, moto, the IMDS emulator and a confined systemd Manager, runs
# `slurm-node-agent bootstrap`, shows the node IDLE in sinfo and jobs running on it, and
# cleans up. (A debug build: it shares the test suite's build and compiles much faster
# than the release profile, which the benchmarks use.)
#
#   sudo scripts/demo.sh
#   sudo scripts/demo.sh --nodes N   # a fleet: the image booted as N nodes (containers with
#                                    # systemd as PID 1) on a private network; see
#                                    # tests/src/fleet.rs. The first run builds the image.
set -euo pipefail
cd "$(dirname "$0")/.."

nodes=
case "${1:-}" in
  "") ;;
  --nodes) nodes=${2:?--nodes needs a number} ;;
  --nodes=*) nodes=${1#--nodes=} ;;
  *) echo "usage: $0 [--nodes N]" >&2; exit 2 ;;
esac

scripts/test-deps.sh
# The Slurm of the test suite (SLURM_E2E_VERSION, default 25.11; 22.05: Debian's).
SLURM_E2E_PREFIX=$(scripts/slurm-build.sh "${SLURM_E2E_VERSION:-25.11}" | tail -n1)
export SLURM_E2E_PREFIX
echo "Slurm $("$SLURM_E2E_PREFIX/sbin/slurmd" -V | awk '{print $2}') ($SLURM_E2E_PREFIX)"
if [[ -n $nodes ]]; then
  cargo build --locked --workspace --bins
  SLURM_NODE_AGENT_BIN="$PWD/target/debug/slurm-node-agent" exec target/debug/fleet-demo "$nodes"
fi
cargo build --locked --workspace --bins
SLURM_NODE_AGENT_BIN="$PWD/target/debug/slurm-node-agent" exec target/debug/demo
