#!/bin/sh
# Noise benchmark (issue 24 §1): the idle daemon as operating-system noise for the jobs on
# its node, printed beside slurmd (the floor every node pays), in one run:
# - the daemon's periodic jobs and their periods (from its own log line `periodic jobs`);
# - per minute, over BENCH_IDLE_SECS (default 60): the wake-ups of all its threads
#   (voluntary context switches; goal <= 120), its instance metadata requests (goal <= 70)
#   and CPU time, and the same for slurmd, with the ratios;
# - a selfish-detour loop pinned to CPU 0: CPU time lost per second with the daemon on
#   that CPU / with it on another (BENCH_DETOUR_ROUNDS rounds of BENCH_DETOUR_SECS each,
#   default 3 x 10 s, alternating);
# - then scripts/bench-drain.sh's spot interruption notice -> DRAIN latency (goal p99 <=
#   2 s, BENCH_TRIALS trials, default 50) with the same daemon build.
# Release build. Prints the numbers; asserts nothing about them.
#
# Needs what the e2e tests need: slurmctld, slurmd, munge, root; two CPUs for the detour.
set -eu
cd "$(dirname "$0")/.."
BENCH_DRAIN_TESTS="bench_noise bench_drain" exec scripts/bench-drain.sh
