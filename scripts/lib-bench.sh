# shellcheck shell=bash
# The benchmarks' run per Slurm version, shared by bench-bootstrap.sh and bench-fleet.sh.
# Sourced, never run.
#
# Environment:
#   SLURM_E2E_VERSION     the suite's version (default 25.11), measured when
#                         BENCH_SLURM_VERSIONS is unset, and put back after several
#   BENCH_SLURM_VERSIONS  versions to measure in turn ("24.11 25.11 26.05")

SLURM_E2E_VERSION=${SLURM_E2E_VERSION:-25.11}
read -r -a bench_versions <<<"${BENCH_SLURM_VERSIONS:-$SLURM_E2E_VERSION}"

# bench_each_version RUN ROW: for each version, puts its pinned build in place
# (scripts/slurm-build.sh), runs `RUN VERSION PREFIX` with its output shown and kept, then
# `ROW FULL_VERSION OUTPUT_FILE` prints that version's summary line. Sets bench_summary to
# those lines; puts the suite's version back when it measured several.
bench_each_version() {
	local run=$1 row=$2 v prefix full out
	bench_summary=()
	for v in "${bench_versions[@]}"; do
		prefix=$(scripts/slurm-build.sh "$v" | tail -n1)
		full=$("$prefix/sbin/slurmd" -V | awk '{print $2}')
		echo "Slurm $full ($prefix)"
		out=$(mktemp)
		"$run" "$v" "$prefix" | tee "$out"
		bench_summary+=("$("$row" "$full" "$out")")
		rm -f "$out"
		echo
	done
	if [ ${#bench_versions[@]} -gt 1 ]; then
		scripts/slurm-build.sh "$SLURM_E2E_VERSION" >/dev/null
	fi
}
