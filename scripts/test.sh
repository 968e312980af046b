#!/usr/bin/env bash
# Runs the whole test suite on Debian 12 as root: installs what the tests need (munge,
# systemd, packer, mmdebstrap, Slurm's build dependencies...; moto from PyPI), puts the
# Slurm version under test in place (SchedMD's pinned tarball, built once per checksum by
# scripts/slurm-build.sh and reused by the fleet's node image), builds every binary (the
# end-to-end tests run the real ones), then `cargo test` over the workspace.
#
#   sudo scripts/test.sh [extra cargo test arguments]
#
# Environment:
#   SLURM_E2E_VERSION  the Slurm the suite runs against (default 25.11: what AWS PCS and
#                      ParallelCluster 3.15+ ship); 24.11, 25.11 or 22.05 (Debian 12's
#                      own packages). scripts/test-matrix.sh runs several.
#   SLURM_SOURCES_DIR  SchedMD's release tarballs (default ../shared/sources)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/test-deps.sh
export CHECKPOINT_DISABLE=1
SLURM_E2E_VERSION=${SLURM_E2E_VERSION:-25.11}
SLURM_E2E_PREFIX=$(scripts/slurm-build.sh "$SLURM_E2E_VERSION" | tail -n1)
export SLURM_E2E_VERSION SLURM_E2E_PREFIX
export PATH="$SLURM_E2E_PREFIX/sbin:$SLURM_E2E_PREFIX/bin:$PATH"
echo "test.sh: Slurm $("$SLURM_E2E_PREFIX/sbin/slurmd" -V | awk '{print $2}') from $SLURM_E2E_PREFIX" >&2
cargo build --workspace --bins --locked
cargo test --workspace --locked "$@"
