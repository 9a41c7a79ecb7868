#!/usr/bin/env bash
# bench-window.sh - the client's and the daemon's CPU per I/O apart, for a
# uring job through the daemon, in alternating pairs of two builds: REV
# (before) and the working tree's (after, made by make build).
#
# bench-cpu.sh gives each side's CPU per I/O as the marginal over a long
# and a short run, which absorbs a run's start-up but not the noise of a
# small shared host, and gives the client's share only as the run's total
# less the daemon's. This one reads both processes' user and system time
# from /proc/PID/stat over a window inside one run (WINDOW seconds, from
# START seconds after the daemon appears: the ramp and the pool's pinning
# are behind it), and counts the window's I/Os from /proc/diskstats of the
# device the job's file lives on, so every figure is the steady state's
# and the user time (the code's own) is apart from the system time (the
# kernel's I/O, the sleeps and wake-ups). A pair is one run of each build,
# one after the other, the before build first in odd pairs and second in
# even ones. No reference tool runs: this one compares builds, and
# bench-cpu.sh gives fio's figure beside them.
#
# usage: scripts/bench-window.sh REV uring-jobfile.fio
# env:   PAIRS (5), BIN (bin), POOL (256m), START (3), WINDOW (4)
# Prints one line per run and the medians of each build.
set -euo pipefail
cd "$(dirname "$0")/.."

rev=${1:?usage: scripts/bench-window.sh REV uring-jobfile.fio}
job=${2:?usage: scripts/bench-window.sh REV uring-jobfile.fio}
PAIRS=${PAIRS:-5}
BIN=${BIN:-bin}
START=${START:-3}
WINDOW=${WINDOW:-4}
NAME=bench-window
. scripts/lib/uringjob.sh
uring_job "$job"

w=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  git worktree remove --force "$w/src" >/dev/null 2>&1 || true
  rm -rf "$w"
}
trap cleanup EXIT
git worktree add --detach -q "$w/src" "$rev"
short=$(git rev-parse --short "$rev")
echo "bench-window: building tcbench and tensorcastd at $short" >&2
(cd "$w/src" && go build -o "$w/before/" ./cmd/tcbench ./cmd/tensorcastd)
after="$(realpath "$BIN")"

job_warm_up "$w" "$after"
cpu() { cut -d' ' -f14,15 "/proc/$1/stat"; } # utime stime, in clock ticks

# run SIDE DIR: one run of DIR's tcbench and daemon; prints its line.
run() {
  local side=$1 dir=$2 t d c i d1 c1 i1 d2 c2 i2
  "$dir/tcbench" --spawn --pool-size="${POOL:-256m}" --daemon-bin "$dir/tensorcastd" "$job" > "$w/$side.out" 2>&1 &
  t=$!
  pids+=("$t")
  d=""
  for _ in $(seq 100); do
    d=$(pgrep -P "$t" -f tensorcastd | head -1 || true)
    [ -n "$d" ] && break
    sleep 0.1
  done
  [ -n "$d" ] || { echo "bench-window: $side: no daemon started under tcbench $t" >&2; wait "$t" || true; return 1; }
  sleep "$START"
  d1=$(cpu "$d"); c1=$(cpu "$t"); i1=$(ios)
  sleep "$WINDOW"
  d2=$(cpu "$d"); c2=$(cpu "$t"); i2=$(ios)
  wait "$t" || { echo "bench-window: $side: tcbench failed: $(tail -1 "$w/$side.out")" >&2; return 1; }
  echo "$side $d1 $d2 $c1 $c2 $i1 $i2" | awk -v hz="$(getconf CLK_TCK)" -v win="$WINDOW" '{
    io = $11 - $10; us = 1e6 / hz / io
    printf "%-6s daemon user %.2f sys %.2f  client user %.2f sys %.2f  total %.2f µs/IO  %.1f kIOPS\n", $1,
      ($4 - $2) * us, ($5 - $3) * us, ($8 - $6) * us, ($9 - $7) * us, ($4 - $2 + $5 - $3 + $8 - $6 + $9 - $7) * us, io / win / 1000 }' |
    tee -a "$w/lines"
}

: > "$w/lines"
for p in $(seq "$PAIRS"); do
  if [ $((p % 2)) -eq 1 ]; then
    run before "$w/before"; run after "$after"
  else
    run after "$after"; run before "$w/before"
  fi
done

echo "medians of $PAIRS runs each (before $short, after $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo +)):"
for side in before after; do
  awk -v s="$side" '$1 == s { print $4 + $6, $9 + $11, $13, $15 }' "$w/lines" |
    awk -v s="$side" '{ d[NR] = $1; c[NR] = $2; t[NR] = $3; k[NR] = $4 }
      function med(a, n,   i, j, x) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { x = a[i]; a[i] = a[j]; a[j] = x }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
      END { n = NR; printf "%-6s daemon %.2f  client %.2f  total %.2f µs/IO  %.1f kIOPS\n", s, med(d, n), med(c, n), med(t, n), med(k, n) }'
done
