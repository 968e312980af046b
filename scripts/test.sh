#!/usr/bin/env bash
# Runs the whole test suite on Debian 12 as root: installs what the tests need (Debian's
# Slurm 22.05, munge, systemd, packer, mmdebstrap...; moto from PyPI), builds every binary
# (the end-to-end tests run the real ones), then `cargo test` over the workspace.
#
#   sudo scripts/test.sh [extra cargo test arguments]
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/test-deps.sh
export CHECKPOINT_DISABLE=1
cargo build --workspace --bins --locked
cargo test --workspace --locked "$@"
