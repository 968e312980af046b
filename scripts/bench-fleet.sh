#!/usr/bin/env bash
# Fleet benchmark: the project's image booted as N nodes (default 16), figures printed as
# ratios, never asserted (see tests/src/bin/fleet-bench.rs for what is measured):
#   - one node alone: container start -> IDLE, and the agent's share of it (goal <= 10 %);
#   - N nodes at once: all IDLE, the agent's part per node / the lone node's (goal <= 1.5),
#     each node's memory (PSS) and what it takes of the host limits, and one job across
#     all N nodes (srun -N N);
#   - controller load with N idle nodes: RPCs per node per minute from sdiag (goal <= 2);
#   - a spot storm on all N nodes: notice -> DRAIN p50/p99 (goal p99 <= 2 s);
#   - N nodes to all IDLE with the agent / the same image with a plain static slurmd
#     (goal <= 1.2), and the memory per node with no agent;
#   - a rolling upgrade of 8 busy nodes, budget 2, 30 s jobs: time / ideal (goal <= 1.3), and
#     the overlap of each kind against the budget (at most 2 out of service at once);
#   - repairs: 16 nodes, 4 of them busy and made faulty (a replace-class check), budget 2:
#     fault -> every replacement IDLE / ideal (goal <= 1.3), at most 2 out at once, no job
#     killed (FLEET_BENCH_REPAIR_NODES, _FAULTY, _BUDGET).
#
# NODES may pass 64: the fleets hold max(NODES, 64) (slurmctld's MaxNodeCount), and the
# harness raises the host limits a large fleet outgrows (inotify instances first: about 18
# nodes with the defaults), saying so on stderr, and puts them back afterwards (as root).
#
#   sudo scripts/bench-fleet.sh [NODES] [IDLE_SECONDS]
#   FLEET_BENCH_PHASES=boot,static scripts/bench-fleet.sh 64
#                       # only the N-node figures: all IDLE, the job across all, memory per
#                       # node, agent / static slurmd (skips the lone node's 10 boots, the
#                       # idle load, the spot storm and the rolling upgrade). Phases, comma-
#                       # separated: solo boot load storm static upgrade repair (default all; load
#                       # and storm run on boot's fleet; the N-at-once / alone ratio needs solo)
#   FLEET_BENCH_PHASES=upgrade FLEET_BENCH_UPGRADE_NODES=32 scripts/bench-fleet.sh
#                       # the rolling upgrade alone, of 32 busy nodes (FLEET_BENCH_UPGRADE_BUDGET:
#                       # its budget, default 2), once with replacements under the same NodeName
#                       # and once under new ones (FLEET_BENCH_UPGRADE_NAMING=same|new|both,
#                       # default both)
#   FLEET_BENCH_SOLO_ONLY=1 scripts/bench-fleet.sh   # only the lone node's boots and bootstrap's steps
#   BENCH_SLURM_VERSIONS="24.11 25.11 26.05" FLEET_BENCH_SOLO_ONLY=1 scripts/bench-fleet.sh
#                                                    # per Slurm version, side by side
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/test-deps.sh
# The Slurm versions to measure against: scripts/lib-bench.sh.
# shellcheck source=scripts/lib-bench.sh
. scripts/lib-bench.sh
# --workspace, not -p: per-package builds resolve dependency features differently and
# rebuild the AWS SDK crates.
# The image carries the release agent, as shipped images do (the debug build's CPU cost
# would be measured instead of the agent's); the harness itself runs from the debug build.
cargo build --locked --workspace --bins
cargo build --locked --workspace --bins --release
nodes=${1:-16}
idle=${2:-60}
run() {
	SLURM_E2E_VERSION=$1 SLURM_E2E_PREFIX=$2 PATH="$2/sbin:$2/bin:$PATH" \
		SLURM_NODE_AGENT_BIN="$PWD/target/release/slurm-node-agent" \
		target/debug/fleet-bench "$nodes" "$idle"
}
# "the agent's boot / this one = R" (one node alone, agent vs the same image's static
# slurmd: the systemd route) and "ratio R (goal <= 1.2)" (N at once, the same).
row() {
	local solo many
	solo=$(sed -n "s/.*the agent's boot \/ this one = \([0-9.]*\).*/\1/p" "$2")
	many=$(sed -n 's/.*agent vs a static slurmd.*; ratio \([0-9.]*\) (goal.*/\1/p' "$2")
	printf '%-9s %12s %14s' "$1" "${solo:--}" "${many:--}"
}
bench_each_version run row
if [ ${#bench_versions[@]} -gt 1 ]; then
	echo "per Slurm version: container start -> IDLE, agent / the same image with a static slurmd (the systemd route)"
	printf '%-9s %12s %14s\n' Slurm "one alone" "$nodes at once"
	printf '%s\n' "${bench_summary[@]}"
fi
