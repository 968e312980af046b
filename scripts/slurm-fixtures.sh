#!/usr/bin/env bash
# Captures the agent's scontrol fixtures from the real daemons of one Slurm version into
# agent/tests/fixtures/slurm-<MAJOR.MINOR>/ (tests/src/bin/slurm-fixtures.rs says what).
#
#   sudo scripts/slurm-fixtures.sh [VERSION]     # default 25.11; 22.05 is Debian's
set -euo pipefail
cd "$(dirname "$0")/.."
SLURM_E2E_PREFIX=$(scripts/slurm-build.sh "${1:-25.11}" | tail -n1)
export SLURM_E2E_PREFIX
cargo run -q --locked -p slurm-e2e --bin slurm-fixtures
