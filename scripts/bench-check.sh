#!/usr/bin/env bash
# Benchmark of Slurm's HealthCheckProgram `slurm-node-agent-healthcheck` (the agent's
# `check` as a program of its own) on the 21 NHC checks of shared/bench/nhc-21.conf
# (issues 6 and 11), side by side with LBNL NHC 1.4.3 in the same run:
# - median wall time of each (hyperfine) and the ratio (goal: the agent >= 20x faster);
# - peak RSS of each (GNU time; goal: the agent's no higher than NHC's), and for scale the
#   same checks through the full agent's `slurm-node-agent check`;
# - a run with six hung checks (three reads of FIFOs nobody writes, three commands that
#   sleep) under a 5 s run deadline: total wall within the deadline, all six named.
# LBNL NHC runs in place from ../shared/peers/lbnl-nhc-1.4.3-notests.tar.gz (see the README
# there), else an installed `nhc`; without either the NHC lines say it was skipped.
#
# Usage: scripts/bench-check.sh [NHC_CONF]     (RUNS=200, NHC_RUNS=30 by default)
# Needs: cargo, hyperfine, /usr/bin/time (Debian package `time`), munged (package
# `munge`): the set checks `check_ps_service -u root -S munged`, so a munged is started
# with a throw-away key and its own socket when none runs, and stopped at the end.
# The agent runs the way slurmd runs a HealthCheckProgram: an empty environment except
# SLURMD_NODENAME, no settings files, and a state folder without a drain marker (a
# healthy node the agent has not drained: no scontrol call).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CONF=${1:-$ROOT/../shared/bench/nhc-21.conf}
RUNS=${RUNS:-200}
[[ -r $CONF ]] || { echo "bench-check: cannot read $CONF" >&2; exit 2; }
CONF=$(cd "$(dirname "$CONF")" && pwd)/$(basename "$CONF")
for tool in hyperfine /usr/bin/time python3; do
    command -v "$tool" >/dev/null || { echo "bench-check: $tool is missing (apt-get install -y hyperfine time python3)" >&2; exit 2; }
done

cd "$ROOT"
if [[ -n ${SLURM_NODE_AGENT_BIN:-} ]]; then
    FULL_BIN=$SLURM_NODE_AGENT_BIN    # binaries built elsewhere (numbers are only meaningful for release)
else
    cargo build --release --locked --workspace --bins >&2
    TARGET=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
    FULL_BIN=$TARGET/release/slurm-node-agent
fi
# What slurmd runs: the HealthCheckProgram next to the full agent.
BIN=$(dirname "$FULL_BIN")/slurm-node-agent-healthcheck
[[ -x $BIN ]] || { echo "bench-check: $BIN is missing (built with the agent)" >&2; exit 2; }

WORK=$(mktemp -d /tmp/bench-check.XXXXXX)
MUNGED_PID=
cleanup() {
    if [[ -n $MUNGED_PID ]]; then kill "$MUNGED_PID" 2>/dev/null || true; wait "$MUNGED_PID" 2>/dev/null || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT

if ! pgrep -x munged >/dev/null; then
    # munged wants its key folder private and its socket folder searchable by all.
    chmod 755 "$WORK"
    mkdir -m 700 "$WORK/munge-key" && mkdir -m 755 "$WORK/munge-run"
    mungekey -c -k "$WORK/munge-key/munge.key" >/dev/null
    /usr/sbin/munged -F --key-file="$WORK/munge-key/munge.key" --seed-file="$WORK/munge-key/seed" \
        --socket="$WORK/munge-run/munge.socket" --pid-file="$WORK/munge-run/munged.pid" \
        --log-file="$WORK/munge-key/munged.log" 2>>"$WORK/munge-key/munged.log" &
    MUNGED_PID=$!
    for _ in $(seq 50); do pgrep -x munged >/dev/null && break; sleep 0.1; done
    echo "bench-check: started munged (pid $MUNGED_PID) with a throw-away key" >&2
fi

# `check` reads the node's state with scontrol: a stand-in answers it (an IDLE node, from the
# test fixtures), so no real scontrol looks for a controller (DNS SRV lookups) or skews the
# timings.
mkdir -p "$WORK/bin"
sed 's/^NodeName=[^ ]*/NodeName=bench-node/' "$ROOT/agent/tests/fixtures/slurm-22.05/scontrol-show-node-idle.txt" > "$WORK/node.txt"
printf '#!/bin/sh\ncat %s\n' "$WORK/node.txt" > "$WORK/bin/scontrol"
chmod 755 "$WORK/bin/scontrol"
ARGS=("--config=$WORK/none.toml" "--config-dir=$WORK/none.d" "--checks-dir=$WORK/checks.d"
      "--set=agent.state_dir=$WORK/state" "--set=slurm.bin_dir=$WORK/bin" "--nhc-conf=$CONF")
mkdir -p "$WORK/state" "$WORK/none.d" "$WORK/checks.d"
# Settings files given explicitly must exist: empty ones (the defaults).
: > "$WORK/none.toml"
AGENT=(env -i SLURMD_NODENAME=bench-node)

# One run must pass all 21 checks.
if ! "${AGENT[@]}" "$BIN" "${ARGS[@]}" > "$WORK/first.txt"; then
    cat "$WORK/first.txt" >&2
    echo "bench-check: the checks do not all pass on this machine" >&2
    exit 1
fi
CHECKS=$(grep -c '^PASS' "$WORK/first.txt")

NHC_RUNS=${NHC_RUNS:-30}
NHC_TGZ=$ROOT/../shared/peers/lbnl-nhc-1.4.3-notests.tar.gz
NHC_CMD=
if [[ -r $NHC_TGZ ]]; then
    tar -xzf "$NHC_TGZ" -C "$WORK"
    mkdir -p "$WORK/nhc-conf"
    cp "$CONF" "$WORK/nhc-conf/nhc.conf"
    ln -s "$WORK/lbnl-nhc-1.4.3/scripts" "$WORK/nhc-conf/scripts"
    NHC_CMD="$WORK/lbnl-nhc-1.4.3/nhc -D $WORK/nhc-conf -t 30 -l /dev/null -a MARK_OFFLINE=0 NHC_RM=slurm HELPERDIR=$WORK/lbnl-nhc-1.4.3/helpers"
    NHC_FROM="LBNL NHC 1.4.3 from $(basename "$NHC_TGZ")"
elif command -v nhc >/dev/null; then
    NHC_CMD="$(command -v nhc) -c $CONF -t 30 -l /dev/null -a MARK_OFFLINE=0"
    NHC_FROM="LBNL NHC at $(command -v nhc)"
fi
# Both run with the same small environment (NHC is bash and needs a PATH; the agent
# ignores it).
ENV=(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin SLURMD_NODENAME=bench-node)
median_ms() { python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["results"][int(sys.argv[2])]; print("%.2f" % (r["median"]*1000))' "$@"; }

CMD="$BIN ${ARGS[*]}"
"${ENV[@]}" "$(command -v hyperfine)" -N --warmup 10 --runs "$RUNS" --style none \
    --export-json "$WORK/agent.json" "$CMD" >/dev/null
MEDIAN_MS=$(median_ms "$WORK/agent.json" 0)
MEAN_MS=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["results"][0]; print("%.2f ± %.2f" % (r["mean"]*1000, r["stddev"]*1000))' "$WORK/agent.json")

peak_rss() { # command...: prints the median and max peak RSS (KiB) of 20 runs
    local rss=()
    for _ in $(seq 20); do
        "${ENV[@]}" /usr/bin/time -v "$@" >/dev/null 2>"$WORK/time.txt" || true
        rss+=("$(awk -F': ' '/Maximum resident set size/ {print $2}' "$WORK/time.txt")")
    done
    printf '%s\n' "${rss[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)], a[NR]}'
}
# The binary's pages in the page cache as on a node that read it from disk, not as the
# linker or `cp` left them: on kernels with large page-cache folios (ext4 since 6.16) a
# freshly written file is cached in other folio sizes than one read back, and a fault maps
# the whole folio around it, which moved the file-backed RSS of the same binary by up to
# 1.5 MiB between runs. Its clean pages are written out and dropped (this file only), then
# one run reads them back before the measured runs.
python3 -c 'import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "$BIN"
"${ENV[@]}" "$BIN" "${ARGS[@]}" >/dev/null || true
read -r RSS_MED RSS_MAX < <(peak_rss "$BIN" "${ARGS[@]}")
# For scale: the same run through the full agent (`slurm-node-agent check`), which links
# the AWS SDKs, the daemon and bootstrap too.
python3 -c 'import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "$FULL_BIN"
"${ENV[@]}" "$FULL_BIN" check "${ARGS[@]}" >/dev/null || true
read -r FULL_RSS_MED FULL_RSS_MAX < <(peak_rss "$FULL_BIN" check "${ARGS[@]}")

# Where the agent's resident memory is: its largest /proc/PID/status sample of one run
# (sampled every 5 ms; one more check, a 0.5 s sleep, keeps the process alive after the
# others ended): anonymous (heap, stacks, relocated data: the agent's own) and file-backed
# (its binary's and the libraries' pages, shared with the page cache).
cp "$CONF" "$WORK/split.conf"
echo "* || check_cmd_status -t 5 -r 0 /bin/sleep 0.5" >> "$WORK/split.conf"
"${ENV[@]}" "$BIN" "${ARGS[@]/#--nhc-conf=*/--nhc-conf=$WORK/split.conf}" >/dev/null &
SPLIT_PID=$!
SPLIT=$(python3 - "$SPLIT_PID" "$BIN" <<'PY'
import os, sys, time
pid, binary = sys.argv[1], os.path.realpath(sys.argv[2])
best = None
while True:
    try:
        with open(f"/proc/{pid}/status") as f:
            st = dict(l.split(":", 1) for l in f if ":" in l)
        if st.get("State", "").split()[0] in "ZX":
            break
        with open(f"/proc/{pid}/smaps") as f:
            code = 0; cur = None
            for l in f:
                p = l.split()
                if "-" in p[0] and len(p) >= 5:
                    cur = (p[1], p[5] if len(p) > 5 else "")
                elif p[0] == "Rss:" and cur and cur[1] == binary:
                    code += int(p[1])
        kib = {k: int(st[k].split()[0]) for k in ("VmRSS", "RssAnon", "RssFile")}
        kib["binary"] = code
        if best is None or kib["VmRSS"] > best["VmRSS"]:
            best = kib
    except (OSError, KeyError, IndexError, ValueError):
        break
    time.sleep(0.005)
if best:
    print(f"{best['VmRSS']} KiB: anon {best['RssAnon']} KiB, file {best['RssFile']} KiB (of it the agent's binary {best['binary']} KiB)")
else:
    print("not sampled")
PY
)
wait "$SPLIT_PID" || true

echo "slurm-node-agent-healthcheck (HealthCheckProgram), $CHECKS checks of $(basename "$CONF"), $RUNS runs:"
echo "  median wall time: $MEDIAN_MS ms (mean $MEAN_MS ms)"
echo "  peak RSS:         ${RSS_MED} KiB median, ${RSS_MAX} KiB max (of 20 runs)"
echo "  RSS split:        $SPLIT (largest sample of one run)"
echo "  full agent:       slurm-node-agent check, same checks: peak RSS ${FULL_RSS_MED} KiB median, ${FULL_RSS_MAX} KiB max"
# The layout of the binary's code (agent/build.rs): how many of the functions in
# agent/link-order.txt the binary has, and how many 64 KiB windows they touch (few when the
# ordering applied; regenerate it with scripts/link-order.sh when few match).
if [[ -r $ROOT/agent/link-order.txt ]] && command -v nm >/dev/null; then
    python3 - "$BIN" "$ROOT/agent/link-order.txt" <<'PY'
import subprocess, sys
want = set(open(sys.argv[2]).read().split())
found, windows, size = set(), set(), 0
for line in subprocess.run(["nm", "-S", sys.argv[1]], capture_output=True, text=True).stdout.splitlines():
    p = line.split()
    if len(p) == 4 and p[3] in want:
        a, n = int(p[0], 16), int(p[1], 16)
        found.add(p[3])
        size += n
        windows.update(range(a >> 16, ((a + max(n, 1) - 1) >> 16) + 1))
print(f"  link order:       {len(found)} of {len(want)} functions of agent/link-order.txt in the binary,"
      f" {size // 1024} KiB in {len(windows)} windows of 64 KiB (~{size // 65536 + 1} when ordered)")
PY
fi

if [[ -n $NHC_CMD ]]; then
    # NHC must pass the same file too, or the comparison means nothing.
    if ! "${ENV[@]}" $NHC_CMD >"$WORK/nhc-first.txt" 2>&1; then
        echo "bench-check: LBNL NHC fails on this machine:" >&2; cat "$WORK/nhc-first.txt" >&2
    fi
    # The same run: the agent again, then NHC, in one hyperfine call.
    "${ENV[@]}" "$(command -v hyperfine)" -N -i --warmup 3 --runs "$NHC_RUNS" --style none \
        --export-json "$WORK/both.json" "$CMD" "$NHC_CMD" >/dev/null
    A_MS=$(median_ms "$WORK/both.json" 0)
    NHC_MS=$(median_ms "$WORK/both.json" 1)
    # shellcheck disable=SC2086
    read -r NRSS_MED NRSS_MAX < <(peak_rss $NHC_CMD)
    echo "$NHC_FROM on the same file, $NHC_RUNS runs each, same hyperfine call:"
    echo "  median wall time: NHC $NHC_MS ms, agent $A_MS ms"
    python3 -c "r=float('$NHC_MS')/float('$A_MS'); print(f'  ratio NHC / agent: {r:.1f}x (goal >= 20x: {\"met\" if r >= 20 else \"NOT met\"})')"
    echo "  peak RSS:         NHC ${NRSS_MED} KiB median, ${NRSS_MAX} KiB max (largest process of its tree)"
    if (( RSS_MED <= NRSS_MED )); then
        echo "  RSS goal (agent <= NHC): met (${RSS_MED} <= ${NRSS_MED} KiB)"
    else
        echo "  RSS goal (agent <= NHC): NOT met (${RSS_MED} > ${NRSS_MED} KiB)"
    fi
else
    echo "LBNL NHC: skipped ($NHC_TGZ is absent and no nhc is installed)"
fi
echo "  for scale:        load average $(cut -d' ' -f1-3 /proc/loadavg)"

# Six hung checks under a 5 s run deadline (per-check timeouts 60 s).
HUNG=$WORK/hung.conf
: > "$HUNG"
for n in 1 2 3; do
    mkfifo "$WORK/fifo$n"
    echo "* || check_file_contents $WORK/fifo$n 'never'" >> "$HUNG"
    echo "* || check_cmd_status -t 60 /bin/sleep 100$n" >> "$HUNG"
done
START=$(date +%s.%N)
"${ENV[@]}" "$BIN" "--config=$WORK/none.toml" "--config-dir=$WORK/none.d" \
    "--checks-dir=$WORK/checks.d" "--set=agent.state_dir=$WORK/state" \
    "--set=slurm.bin_dir=$WORK/bin" "--nhc-conf=$HUNG" \
    --set=health.run_deadline=5s --set=health.timeout=60s --no-act > "$WORK/hung.txt" || true
END=$(date +%s.%N)
HUNG_N=$(grep -c 'run deadline' "$WORK/hung.txt" || true)
python3 -c "w=$END-$START; print(f'six hung checks, run deadline 5 s: total wall {w:.2f} s, {$HUNG_N} of 6 reported hung at the deadline ({\"within\" if w < 5 + 1 else \"NOT within\"} the deadline + 1 s)')"
