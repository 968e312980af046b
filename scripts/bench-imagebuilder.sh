#!/usr/bin/env bash
# Benchmark of `slurm-image-builder build --target local` (issue 5):
#   1. a cold local build (fresh mmdebstrap root) with a warm apt package cache;
#   2. a second run of the provisioning steps on the finished root (--steps-only).
# Prints both times and the ratio of the second run to the first run's provisioning
# (goal: at most 10 %). Needs root, mmdebstrap, qemu-img and the Debian mirror.
#
# Usage: scripts/bench-imagebuilder.sh [work-dir]   (default /var/tmp/sib-bench)
# BENCH_AGENT=none builds without the agent; BENCH_AGENT=<path> uses that binary.
# BENCH_PROBE_ONLY=1 prints the agent choice and exits (tested in imagebuilder/tests).
set -euo pipefail

top=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
work=${1:-/var/tmp/sib-bench}
cache=$top/target/sib-apt-cache
cd "$top"
agent=(--without-agent)
# The agent goes in when built with the CLI the acceptance checks call
# (packer/scripts/99-acceptance.sh runs `slurm-node-agent check --no-act`).
case ${BENCH_AGENT:-auto} in
none) candidates=() ;;
auto) candidates=(target/release/slurm-node-agent target/debug/slurm-node-agent) ;;
*) candidates=("$BENCH_AGENT") ;;
esac
for b in "${candidates[@]}"; do
	if [ -x "$b" ] && help=$("$b" check --no-act --help 2>/dev/null) && grep -q -- --no-act <<<"$help"; then
		agent=(--agent-bin "$b")
		break
	fi
done
if [ -n "${BENCH_PROBE_ONLY:-}" ]; then
	echo "agent: ${agent[*]}"
	exit 0
fi
cargo build -q --workspace --bins
sib=$top/target/debug/slurm-image-builder

build() {
	if ! "$sib" --packer-dir "$top/packer" --output json build --target local --units-dir "$top/units" \
		--work-dir "$work" --apt-cache "$cache" "${agent[@]}" "$@" 2>"$work.stderr"; then
		tail -n 20 "$work.stderr" >&2
		echo "bench: the local build failed; full output in $work.stderr" >&2
		return 1
	fi
}
field() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(d[sys.argv[1]])' "$1"; }

if [ -z "$(ls -A "$cache" 2>/dev/null)" ]; then
	echo "warming the apt cache ($cache) with one build..."
	build --no-artifacts >/dev/null
fi

start=$(date +%s.%N)
first=$(build)
end=$(date +%s.%N)
cold=$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }')
first_steps=$(field provisioning_seconds <<<"$first")

start=$(date +%s.%N)
second=$(build --steps-only --no-artifacts)
end=$(date +%s.%N)
second_wall=$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }')
second_steps=$(field provisioning_seconds <<<"$second")

printf 'cold local build (warm apt cache), wall:        %8.2f s\n' "$cold"
printf '  of which provisioning steps:                    %8.2f s\n' "$first_steps"
printf 'second run of the steps on the finished root:     %8.2f s (wall %.2f s)\n' "$second_steps" "$second_wall"
printf 'ratio second run / first provisioning:            %8.1f %%  (goal <= 10 %%)\n' "$(awk -v a="$second_steps" -v b="$first_steps" 'BEGIN { print 100 * a / b }')"
printf 'ratio second run / cold build:                    %8.1f %%\n' "$(awk -v a="$second_steps" -v b="$cold" 'BEGIN { print 100 * a / b }')"
