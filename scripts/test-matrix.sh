#!/usr/bin/env bash
# Runs the suite once per Slurm version and prints what passed on each, side by side:
# the longer matrix run before an issue about Slurm versions is called resolved.
#
#   sudo scripts/test-matrix.sh [VERSION ...] [-- extra cargo test arguments]
#   sudo scripts/test-matrix.sh 24.11 25.11 -- --test fleet     # every fleet scenario
#
# Default versions: 24.11, 25.11 and 26.05 (each must be pinned in packer/sources.toml and its
# tarball be in SLURM_SOURCES_DIR); 22.05 is Debian 12's own packages. Each version's
# output is kept in target/test-matrix/<version>.log. Exits non-zero when any failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
versions=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
	versions+=("$1")
	shift
done
[ "${1:-}" = -- ] && shift
[ ${#versions[@]} -gt 0 ] || versions=(24.11 25.11 26.05)
mkdir -p target/test-matrix
summary=()
rc=0
for v in "${versions[@]}"; do
	log=target/test-matrix/$v.log
	start=$(date +%s)
	SLURM_E2E_VERSION=$v scripts/test.sh --no-fail-fast "$@" >"$log" 2>&1
	status=$?
	secs=$(($(date +%s) - start))
	passed=$(awk '/^test result:/ {p += $4} END {print p + 0}' "$log")
	failed=$(awk '/^test result:/ {f += $6} END {print f + 0}' "$log")
	[ "$status" -eq 0 ] || rc=1
	summary+=("$(printf '%-8s %-6s %6s passed %4s failed %6ss  %s' "$v" "$([ "$status" -eq 0 ] && echo ok || echo FAIL)" "$passed" "$failed" "$secs" "$log")")
	grep -E '^test .* FAILED$' "$log" | sed "s/^/    $v: /" || true
done
printf '%s\n' "Slurm    result   tests            time   log" "${summary[@]}"
exit $rc
