#!/usr/bin/env bash
# bench-store-queue.sh - the KV block store's figures through the queue, as a
# client gets them from a daemon running in a process of its own, each beside
# its reference measured in the same run, as medians of COUNT repeats:
#   - Put-commit (Reserve + Commit), Get + release (Unpin), Exists,
#     LookupPrefix and LookupPrefix + pin + release at batch 1 and 128, eight
#     calls in flight: keys per second and the daemon's CPU time per key, read
#     from /proc/PID/stat before and after (goal: at most 1 µs per key at 128);
#   - zero-copy Put and Get of 256 KiB values through the queue (the bytes
#     left in place, and written and read by the client) vs memcpy of the same
#     bytes (goal: at least 2x) and vs the copying form on the socket;
#   - Get of L2-only 256 KiB values (promotion, READ_FIXED, 32 in flight) vs
#     fio randread bs=256k iodepth=32 direct=1 io_uring on the same L2 file,
#     alternating (goal: at least 0.9x);
#   - the index's memory per key at 1M and 10M keys (goal: at most 128 bytes
#     plus the key).
# Prints a Markdown section on stdout.
# usage: scripts/bench-store-queue.sh [COUNT (default 5)] [BENCHTIME (default 2s)] [DIR (default /var/tmp/tcbench-store-queue)]
# Environment: POOL (daemon A's pool, default 2GiB), PROMOTE_N (values read
# per promotion run, default 1500), MEMKEYS ("1000000 10000000").
set -euo pipefail
COUNT=${1:-5}
BT=${2:-2s}
DIR=${3:-/var/tmp/tcbench-store-queue}
# The daemon takes only absolute paths; DIR is taken before the cd below.
case $DIR in /*) ;; *) DIR=$PWD/$DIR ;; esac
POOL=${POOL:-2GiB}
PROMOTE_N=${PROMOTE_N:-1500}
MEMKEYS=${MEMKEYS:-1000000 10000000}
cd "$(dirname "$0")/.."
command -v fio >/dev/null || { echo "bench-store-queue: fio not installed (apt-get install fio)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "bench-store-queue: python3 needed to read fio's JSON" >&2; exit 1; }
rm -rf "$DIR"
mkdir -p "$DIR/bin"
out=$(mktemp); fiojs=$(mktemp)
pid=
stop_daemon() {
  if [ -n "$pid" ]; then
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=
  fi
}
trap 'stop_daemon; rm -f "$out" "$fiojs"' EXIT
# bench BENCHARGS...: the client benchmarks against the daemon started
# last; their whole output goes to $DIR/bench.log, their result lines to
# $out. A failure stops the script with the log's end.
bench() {
  if ! TENSORCAST_BENCH_SOCKET=$sock TENSORCAST_BENCH_PID=$pid go test -run '^$' "$@" ./client/ >"$DIR/bench.log" 2>&1; then
    echo "bench-store-queue: go test $* failed:" >&2
    tail -20 "$DIR/bench.log" >&2
    exit 1
  fi
  grep '^Benchmark' "$DIR/bench.log" >>"$out"
}
go build -o "$DIR/bin/tensorcastd" ./cmd/tensorcastd
go build -o "$DIR/bin/tcctl" ./cmd/tcctl

# start_daemon NAME ARGS...: a daemon of its own under $DIR/NAME.
start_daemon() {
  local name=$1; shift
  mkdir -p "$DIR/$name"
  sock="$DIR/$name/s.sock"
  "$DIR/bin/tensorcastd" --socket "$sock" --data-dir "$DIR/$name/data" --metrics-address off --log-level warn "$@" \
    2>"$DIR/$name/log" &
  pid=$!
  for _ in $(seq 300); do
    [ -S "$sock" ] && "$DIR/bin/tcctl" --socket "$sock" ping >/dev/null 2>&1 && return 0
    kill -0 "$pid" 2>/dev/null || { cat "$DIR/$name/log" >&2; exit 1; }
    sleep 0.1
  done
  echo "bench-store-queue: daemon $name did not start" >&2; cat "$DIR/$name/log" >&2; exit 1
}
export TENSORCAST_BENCH_CLK_TCK=$(getconf CLK_TCK)

# Daemon A: DRAM only, so that the calls' CPU is the daemon's own (no L2
# writeback behind the puts). A fresh one for the 256 KiB values: the small
# calls leave the pool's slabs to 4 KiB blocks.
start_daemon a --pool-size "$POOL" --store-l2-path off
bench -bench '^BenchmarkStoreQueue$' -benchtime "$BT" -count "$COUNT"
stop_daemon
start_daemon a2 --pool-size "$POOL" --store-l2-path off
bench -bench 'ZeroCopy256K|Copying256K|Memcpy256K' -benchtime "$BT" -count "$COUNT"
stop_daemon

# Daemon B: an L2 file on $DIR, L1 kept small so that values fall to L2.
start_daemon b --pool-size 256MiB --store-l1-capacity 64MiB --store-l2-size 16GiB
l2="$DIR/b/data/store.l2"
fio_mbs=()
for _ in $(seq "$COUNT"); do
  bench -bench 'Promote256K' -benchtime "${PROMOTE_N}x" -count 1
  # fio over the part of the file the store's regions fill (whole 64 MiB
  # regions from the start), while the daemon is idle.
  used=$("$DIR/bin/tcctl" --socket "$sock" stats | awk '$1 == "store.l2_bytes" { print $2 }')
  size=$(( (used / (64 << 20)) * 64 ))
  [ "$size" -ge 64 ] || size=64
  fio --name=promote-ref --filename="$l2" --rw=randread --bs=256k --iodepth=32 --direct=1 \
    --ioengine=io_uring --size="${size}m" --runtime=5 --time_based --output-format=json >"$fiojs"
  fio_mbs+=("$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["jobs"][0]["read"]["bw_bytes"]/1e6)' "$fiojs")")
done
stop_daemon

mem=()
for n in $MEMKEYS; do
  mem+=("$(go test -count=1 -run TestIndexMemoryPerKey -v ./store/ -store.memkeys="$n" | sed -n 's/.*(\([0-9.]*\) plus.*/\1/p')")
done

. scripts/lib/stats.sh
row() { # LABEL OP
  local b=BenchmarkStoreQueue/op=$2
  echo "| $1 | $(median "$b/batch=1" keys/s) | $(median "$b/batch=1" daemon-ns/key) | $(median "$b/batch=128" keys/s) | $(median "$b/batch=128" daemon-ns/key) |"
}

echo "### KV block store through the queue (daemon in its own process, 8 calls in flight)"
echo
echo "| call | batch 1 keys/s | batch 1 daemon ns/key | batch 128 keys/s | batch 128 daemon ns/key (goal ≤ 1000) |"
echo "|---|---|---|---|---|"
row "Put-commit (Reserve + Commit, 4 KiB)" put
row "Get + release (Unpin)" get-release
row "Exists" exists
row "LookupPrefix" lookup
row "LookupPrefix + pin, then Unpin" lookup-pin-release
echo
zn=$(median BenchmarkStoreQueueZeroCopy256K/touch=none MB/s); zt=$(median BenchmarkStoreQueueZeroCopy256K/touch=copy MB/s)
cp=$(median BenchmarkStoreCopying256K MB/s); mc=$(median BenchmarkMemcpy256K MB/s)
echo "### 256 KiB values through the queue: zero-copy vs copying"
echo
echo "| path | MB/s (each value in and out) | vs memcpy (goal ≥ 2x) | vs copying |"
echo "|---|---|---|---|"
echo "| zero-copy: Reserve, Commit, Get, Unpin; the bytes produced and consumed in place (queue, 4 × 16 keys in flight) | $zn | $(ratio "$zn" "$mc")x | $(ratio "$zn" "$cp")x |"
echo "| zero-copy, the client writing each value in place and reading it out with memcpy | $zt | $(ratio "$zt" "$mc")x | $(ratio "$zt" "$cp")x |"
echo "| copying: StorePut from and StoreRead into client buffers (socket, 16 keys per call) | $cp | $(ratio "$cp" "$mc")x | 1x |"
echo "| memcpy of 256 KiB from and to 64 MiB spans, one thread (what a copying store pays per byte) | $mc | 1x | |"
echo
pr=$(median BenchmarkStoreQueuePromote256K MB/s); fm=$(med "${fio_mbs[@]}")
echo "### Get of L2-only 256 KiB values (promotion) through the queue, depth 32, same file"
echo
echo "| path | MB/s | vs fio (goal ≥ 0.9x) |"
echo "|---|---|---|"
echo "| Get + Unpin of values on L2 only (READ_FIXED into pool blocks, crc32c checked) | $pr | $(ratio "$pr" "$fm")x |"
echo "| fio randread bs=256k iodepth=32 direct=1 io_uring on the L2 file | $fm | 1x |"
echo
echo "### Index memory per key (32-byte keys, on L2)"
echo
echo "| keys | bytes per key, plus the key (goal ≤ 128) |"
echo "|---|---|"
i=0
for n in $MEMKEYS; do
  echo "| $n | ${mem[$i]} |"
  i=$((i + 1))
done
echo
echo "Medians of $COUNT runs ($BT each; promotion: $PROMOTE_N values per run), $(date -u +%Y-%m-%d), $(nproc) CPUs ($(uname -r))."
