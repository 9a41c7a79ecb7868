#!/usr/bin/env bash
# bench-syscalls.sh - system calls per request through the shared-memory
# queue, on both sides, in steady state: a tcbench job of 4 KiB local
# copies at iodepth 32 runs a fixed number of requests (io_size) against a
# private tensorcastd, with `strace -c -f` on the client and attached to the
# daemon, every system call counted. Each side's count over a short run is
# subtracted from its count over a long one, so set-up and tear-down cancel
# out and what is left is per request. The daemon's CPU time per request is
# read from /proc/PID/stat the same way (without strace, in its own pair of
# runs). Prints a Markdown section on stdout.
#
# usage: scripts/bench-syscalls.sh [REQUESTS (default 1000000)]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000000}
SHORT=$((N / 10))
BIN=${BIN:-bin}
command -v strace >/dev/null || { echo "bench-syscalls: strace is not installed (make deps)" >&2; exit 1; }
[ -x "$BIN/tensorcastd" ] && [ -x "$BIN/tcbench" ] || { echo "bench-syscalls: build first (make build)" >&2; exit 1; }

work=$(mktemp -d)
trap 'kill "$dpid" 2>/dev/null; wait "$dpid" 2>/dev/null; rm -rf "$work"' EXIT
cat >"$work/d.toml" <<EOF
socket = "$work/d.sock"
data_dir = "$work/data"
metrics_address = "off"
ebpf = "off"
pool_size = "256MiB"
EOF
"$BIN/tensorcastd" --config "$work/d.toml" >"$work/daemon.log" 2>&1 &
dpid=$!
for _ in $(seq 100); do [ -S "$work/d.sock" ] && break; sleep 0.1; done
[ -S "$work/d.sock" ] || { cat "$work/daemon.log" >&2; exit 1; }

job() { # requests → a job file
  cat >"$work/job-$1.fio" <<EOF
[local-4k-qd32]
engine=local
daemon=$work/d.sock
rw=randread
bs=4k
size=64m
io_size=$(( $1 * 4096 ))
iodepth=32
batch=8
EOF
  echo "$work/job-$1.fio"
}

# calls FILE: the total of strace -c's "calls" column.
# (columns: % time, seconds, usecs/call, calls, [errors,] name).
calls() { awk '$NF == "total" { print $4 }' "$1"; }
ticks() { awk '{ print $14 + $15 }' "/proc/$dpid/stat"; }
hz=$(getconf CLK_TCK)

count() { # requests → "client-calls daemon-calls"
  local j; j=$(job "$1")
  strace -c -f -q -p "$dpid" -o "$work/d-$1.strace" & local sp=$!
  sleep 0.5
  strace -c -f -q -o "$work/c-$1.strace" "$BIN/tcbench" "$j" >"$work/out-$1.txt"
  kill -INT "$sp"; wait "$sp" 2>/dev/null || true
  echo "$(calls "$work/c-$1.strace") $(calls "$work/d-$1.strace")"
}

cpu() { # requests → daemon CPU seconds
  local j; j=$(job "$1")
  local t0; t0=$(ticks)
  "$BIN/tcbench" "$j" >/dev/null
  local t1; t1=$(ticks)
  echo "$t0 $t1 $hz" | awk '{ printf "%.6f", ($2 - $1) / $3 }'
}

read -r cl_s dm_s < <(count "$SHORT")
read -r cl_l dm_l < <(count "$N")
cpu_s=$(cpu "$SHORT")
cpu_l=$(cpu "$N")
per() { awk -v a="$1" -v b="$2" -v n=$((N - SHORT)) 'BEGIN { printf "%.4f", (a - b) / n }'; }
client=$(per "$cl_l" "$cl_s")
daemon=$(per "$dm_l" "$dm_s")
cpu_ns=$(awk -v a="$cpu_l" -v b="$cpu_s" -v n=$((N - SHORT)) 'BEGIN { printf "%.0f", (a - b) / n * 1e9 }')

echo "### System calls per request through the queue (4 KiB local, iodepth 32, batch 8)"
echo
echo "\`scripts/bench-syscalls.sh $N\`: $N requests against $SHORT, the difference per request; every system call"
echo "counted by \`strace -c -f\` on each process (strace slows each call it sees, so this is an upper bound)."
echo
echo "| side | calls ($SHORT requests) | calls ($N requests) | per request | goal |"
echo "|---|---|---|---|---|"
echo "| client (tcbench) | $cl_s | $cl_l | $client | <= 0.1 |"
echo "| daemon | $dm_s | $dm_l | $daemon | <= 0.1 |"
echo
echo "Daemon CPU time per request (user + system, without strace): ${cpu_ns} ns."
echo
echo "The client's busiest calls over the long run:"
echo
echo '```'
head -12 "$work/c-$N.strace"
echo '```'
echo "The daemon's:"
echo
echo '```'
head -12 "$work/d-$N.strace"
echo '```'
