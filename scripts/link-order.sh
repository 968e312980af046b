#!/usr/bin/env bash
# Regenerates agent/link-order.txt, the symbol ordering file that release builds give LLD
# (agent/build.rs): the functions `slurm-node-agent-healthcheck` (HealthCheckProgram) and
# `slurm-node-agent check` run on the benchmark set (the former's first), so
# that the linker places them next to each other and a run maps about 1 MiB of the
# binary's code instead of several MiB (the kernel maps code 64 KiB around each fault).
#
# The names carry hashes of the crates' build metadata: after a change of Cargo.lock, of
# the Rust toolchain or of the release profile most of them no longer match, and the
# layout (not the behaviour) falls back to the linker's default. scripts/bench-check.sh
# prints how many still match. Then: build, run this, build again.
#
# Usage: scripts/link-order.sh [NHC_CONF]   (default ../shared/bench/nhc-21.conf)
# Needs: valgrind (callgrind), python3, nm (binutils), a release build (SLURM_NODE_AGENT_BIN, default
# target/release/slurm-node-agent, and slurm-node-agent-healthcheck next to it).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CONF=${1:-$ROOT/../shared/bench/nhc-21.conf}
FULL=$(realpath "${SLURM_NODE_AGENT_BIN:-$ROOT/target/release/slurm-node-agent}")
HC=$(dirname "$FULL")/slurm-node-agent-healthcheck
OUT=$ROOT/agent/link-order.txt
for tool in valgrind python3 nm; do
    command -v "$tool" >/dev/null || { echo "link-order: $tool is missing" >&2; exit 2; }
done
[[ -r $CONF ]] || { echo "link-order: cannot read $CONF" >&2; exit 2; }

WORK=$(mktemp -d /tmp/link-order.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/state" "$WORK/none.d" "$WORK/checks.d" "$WORK/bin"
: > "$WORK/none.toml"
# A stand-in scontrol (an IDLE node), as in bench-check.sh.
sed 's/^NodeName=[^ ]*/NodeName=bench-node/' "$ROOT/agent/tests/fixtures/slurm-22.05/scontrol-show-node-idle.txt" > "$WORK/node.txt"
printf '#!/bin/sh\ncat %s\n' "$WORK/node.txt" > "$WORK/bin/scontrol"
chmod 755 "$WORK/bin/scontrol"
ARGS=("--config=$WORK/none.toml" "--config-dir=$WORK/none.d" "--checks-dir=$WORK/checks.d"
      "--set=agent.state_dir=$WORK/state" "--set=slurm.bin_dir=$WORK/bin" "--nhc-conf=$CONF")
# Each program twice: the first run asks (the stand-in) scontrol, the second finds the
# boot's marker.
for prog in hc full; do
    if [[ $prog == hc ]]; then CMD=("$HC" "${ARGS[@]}"); else CMD=("$FULL" check "${ARGS[@]}"); fi
    rm -rf "$WORK/state" && mkdir "$WORK/state"
    for n in 1 2; do
        env -i SLURMD_NODENAME=bench-node valgrind --tool=callgrind --demangle=no \
            --callgrind-out-file="$WORK/$prog$n.out" "${CMD[@]}" >/dev/null 2>"$WORK/valgrind-$prog$n.txt" || true
    done
done
# The process's own entry point first (crt1's _start is in .text too).
# Code that runs natively but not under callgrind is added by name: a forked child's until
# its exec, where callgrind writes no profile (std's do_exec, the cgroup join); tokio's
# pidfd child reaper (valgrind has no pidfd_open, so tokio takes its SIGCHLD path there);
# float formatting's slow path (only some values take it).
for b in "$HC" "$FULL"; do
    nm "$b" | awk '$3 ~ /do_exec|join_before_exec|pidfd|poll_evented|deregister_source|12registration12Registration|flt2dec/ {print $3}'
done > "$WORK/child.txt"
python3 - "$HC" "$FULL" "$OUT" "$WORK/child.txt" "$WORK/hc1.out" "$WORK/hc2.out" "$WORK/full1.out" "$WORK/full2.out" <<'PY'
import re, sys
binaries, out, child, runs = sys.argv[1:3], sys.argv[3], sys.argv[4], sys.argv[5:]
name = re.compile(r"\((\d+)\)(?: (.*))?")
seen = {"_start": None}
for run in runs:
    tables = {"ob": {}, "fn": {}}
    ob = None
    for line in open(run, errors="replace"):
        key, _, val = line.rstrip("\n").partition("=")
        kind = {"ob": "ob", "cob": "ob", "fn": "fn", "cfn": "fn"}.get(key)
        if kind is None:
            continue
        m = name.match(val)
        if m:
            if m.group(2) is not None:
                tables[kind][m.group(1)] = m.group(2)
            val = tables[kind].get(m.group(1), "")
        if key == "ob":
            ob = val
        elif key == "fn" and ob in binaries and re.fullmatch(r"[A-Za-z_$.][\w$.]*", val):
            seen.setdefault(val, None)
for n in open(child).read().split():
    seen.setdefault(n, None)
if len(seen) < 100:
    sys.exit(f"link-order: only {len(seen)} functions found in {binaries}: release builds with symbols?")
with open(out, "w") as f:
    f.write("".join(n + "\n" for n in seen))
print(f"link-order: {len(seen)} functions written to {out}")
PY
