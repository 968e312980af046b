#!/bin/sh
# Desired-image poll benchmark (issue 25 §2): the periodic AWS calls of an idle node's
# daemon, and the whole fleet's against the quota they share, from the daemon's own
# schedule code (daemon_schedule, schedule::UpgradePoll) in one run:
# - per hour, each AWS API call of an idle node's daemon (24 h of one-second ticks) in a
#   cluster of 1, 1,000 and 10,000 nodes, and today's fixed 300 s beside it;
# - for a fleet of 1, 1,000 and 10,000 nodes launched at the same instant (N independent
#   jitter streams, fixed seeds): the fleet's SSM GetParameter calls a second and their
#   share of Parameter Store's standard quota (40 TPS, shared by GetParameter,
#   GetParameters and GetParametersByPath; goal under 25 % at 10,000 nodes), the busiest
#   second, and the time from a publish to the first node's check (mean, p99, max; goal
#   within 15 minutes), then the same for today's fixed 300 s.
# A simulation (no AWS, no Slurm, no root; a few seconds): prints the numbers, asserts
# nothing about them. Debug build: the figures do not depend on speed.
set -eu
cd "$(dirname "$0")/.."
cargo test --locked -p slurm-node-agent --lib -- --ignored --exact daemon::tests::bench_upgrade_poll \
    --nocapture 2>&1 |
    grep -E '^BENCH|panicked|error' | sed 's/^BENCH //'
