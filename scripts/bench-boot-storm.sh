#!/bin/sh
# Boot-storm benchmark (issue 25 §1): 1,000 simulated nodes launched within 10 s run the
# agent's boot-time AWS steps through the functions bootstrap calls: the cluster key
# (authkey::fetch_in_region), the PCS registration (pcs::register_with_credentials) and
# the nodeBootstrapped lifecycle script from S3 (node_lifecycle::run_stage); one AWS SDK
# configuration and client per node, all in one tokio runtime, against moto and the PCS
# registration emulator behind the throttling front (imds_emulator::throttle: Parameter
# Store's standard 40 TPS, PCS registration 20/s (a front setting: AWS publishes no
# rate), S3 GetObject 5,500/s by default). Prints, per step and for the whole boot, for
# today's key fetch (the SDK's standard retries, 3 attempts) and this build's: time until
# every node is done ÷ the ideal N ÷ quota (goal <= 1.3), nodes that gave up (goal 0),
# requests sent ÷ N (goal <= 2.0) and the p99 of a node's time. Asserts nothing.
#
#   scripts/bench-boot-storm.sh [--nodes 1000] [--launch-secs 10] [--tps 40]
#                               [--source ssm|secretsmanager] [--pcs-tps 20] [--s3-tps 5500]
#                               [--steps key,register,scripts] [--policy both|today|build]
#
# Needs moto_server (scripts/test-deps.sh); no root, no Slurm.
set -eu
cd "$(dirname "$0")/.."
cargo build --release --locked -p slurm-node-agent --example boot_storm
exec target/release/examples/boot_storm "$@"
