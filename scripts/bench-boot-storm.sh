#!/bin/sh
# Boot-storm benchmark (issue 25 §1): 1,000 simulated nodes launched within 10 s fetch the
# cluster key through the agent's own key fetch (authkey::fetch_in_region, what bootstrap
# runs), one AWS SDK configuration and client per node, all in one tokio runtime, against
# moto behind the throttling front (imds_emulator::throttle: Parameter Store's standard
# 40 TPS by default). Prints, for today's fetch (the SDK's standard retries, 3 attempts) and
# this build's side by side, from one run each: time until every node has its key ÷ the
# ideal N ÷ quota (goal <= 1.3), nodes that gave up (goal 0), requests sent ÷ N (goal
# <= 2.0) and the p99 of a node's time from launch to key. Asserts nothing.
#
#   scripts/bench-boot-storm.sh [--nodes 1000] [--launch-secs 10] [--tps 40]
#                               [--source ssm|secretsmanager] [--policy both|today|build]
#
# Needs moto_server (scripts/test-deps.sh); no root, no Slurm.
set -eu
cd "$(dirname "$0")/.."
cargo build --release --locked -p slurm-node-agent --example boot_storm
exec target/release/examples/boot_storm "$@"
