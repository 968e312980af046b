#!/usr/bin/env bash
# Fleet benchmark: the project's image booted as N nodes (default 16), figures printed as
# ratios, never asserted (see tests/src/bin/fleet-bench.rs for what is measured):
#   - one node alone: container start -> IDLE, and the agent's share of it (goal <= 10 %);
#   - N nodes at once: the agent's part per node / the lone node's (goal <= 1.5);
#   - controller load with N idle nodes: RPCs per node per minute from sdiag (goal <= 2);
#   - a spot storm on all N nodes: notice -> DRAIN p50/p99 (goal p99 <= 2 s);
#   - N nodes to all IDLE with the agent / the same image with a plain static slurmd
#     (goal <= 1.2);
#   - a rolling upgrade of 8 busy nodes, budget 2, 30 s jobs: time / ideal (goal <= 1.3).
#
#   sudo scripts/bench-fleet.sh [NODES] [IDLE_SECONDS]
#   FLEET_BENCH_SOLO_ONLY=1 scripts/bench-fleet.sh   # only the lone node's boots and bootstrap's steps
#   BENCH_SLURM_VERSIONS="24.11 25.11 26.05" FLEET_BENCH_SOLO_ONLY=1 scripts/bench-fleet.sh
#                                                    # per Slurm version, side by side
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/test-deps.sh
# The Slurm versions to measure against (default: scripts/test.sh's SLURM_E2E_VERSION,
# 25.11; BENCH_SLURM_VERSIONS="24.11 25.11 26.05" runs each in turn and prints their
# ratios side by side at the end, the suite's version put back): the figures are printed
# per version.
SLURM_E2E_VERSION=${SLURM_E2E_VERSION:-25.11}
read -r -a versions <<<"${BENCH_SLURM_VERSIONS:-$SLURM_E2E_VERSION}"
# --workspace, not -p: per-package builds resolve dependency features differently and
# rebuild the AWS SDK crates.
# The image carries the release agent, as shipped images do (the debug build's CPU cost
# would be measured instead of the agent's); the harness itself runs from the debug build.
cargo build --locked --workspace --bins
cargo build --locked --workspace --bins --release
summary=()
for v in "${versions[@]}"; do
	prefix=$(scripts/slurm-build.sh "$v" | tail -n1)
	full=$("$prefix/sbin/slurmd" -V | awk '{print $2}')
	echo "Slurm $full ($prefix)"
	out=$(mktemp)
	SLURM_E2E_VERSION=$v SLURM_E2E_PREFIX=$prefix PATH="$prefix/sbin:$prefix/bin:$PATH" \
		SLURM_NODE_AGENT_BIN="$PWD/target/release/slurm-node-agent" \
		target/debug/fleet-bench "${1:-16}" "${2:-60}" | tee "$out"
	# "the agent's boot / this one = R" (one node alone, agent vs the same image's static
	# slurmd: the systemd route) and "ratio R (goal <= 1.2)" (N at once, the same).
	solo=$(sed -n "s/.*the agent's boot \/ this one = \([0-9.]*\).*/\1/p" "$out")
	many=$(sed -n 's/.*agent vs a static slurmd.*; ratio \([0-9.]*\) (goal.*/\1/p' "$out")
	summary+=("$(printf '%-9s %12s %14s' "$full" "${solo:--}" "${many:--}")")
	rm -f "$out"
	echo
done
if [ ${#versions[@]} -gt 1 ]; then
	scripts/slurm-build.sh "$SLURM_E2E_VERSION" >/dev/null
	echo "per Slurm version: container start -> IDLE, agent / the same image with a static slurmd (the systemd route)"
	printf '%-9s %12s %14s\n' Slurm "one alone" "${1:-16} at once"
	printf '%s\n' "${summary[@]}"
fi
