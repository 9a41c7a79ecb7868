#!/usr/bin/env bash
# bench-store.sh - the KV block store's in-process figures, each beside its
# reference measured in the same run, as medians of COUNT repeats:
#   - daemon CPU per key of Get+release, Commit, Exists and LookupPrefix at
#     batch 1 and 128 (goal: at most 1 µs per key at 128); the calls run on
#     the benchmark goroutine, so wall time per key is CPU per key;
#   - zero-copy Put+Get of 256 KiB values vs the copying form vs memcpy;
#   - Get of L2-only 256 KiB values (promotion, READ_FIXED, depth 32) vs fio
#     randread bs=256k iodepth=32 direct=1 io_uring on the same L2 file,
#     alternating (goal: at least 0.9x);
#   - index memory per key at 1M and 10M keys (goal: at most 128 bytes plus
#     the key).
# The figures through the queue (what a client gets) come with the daemon's
# wiring; these are the store alone. Prints a Markdown section on stdout.
# usage: scripts/bench-store.sh [COUNT (default 5)] [BENCHTIME (default 2s)] [DIR (default /var/tmp/tcbench-store)]
set -euo pipefail
COUNT=${1:-5}
BT=${2:-2s}
DIR=${3:-/var/tmp/tcbench-store}
cd "$(dirname "$0")/.."
command -v fio >/dev/null || { echo "bench-store: fio not installed (apt-get install fio)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "bench-store: python3 needed to read fio's JSON" >&2; exit 1; }
mkdir -p "$DIR"
out=$(mktemp); fiojs=$(mktemp); trap 'rm -f "$out" "$fiojs"' EXIT
export TENSORCAST_STORE_BENCH_DIR=$DIR

go test -run '^$' -bench 'GetRelease|Exists|LookupPrefix|Commit|ZeroCopy256K|Copying256K|Memcpy256K' \
  -benchtime "$BT" -count "$COUNT" ./store/ | grep '^Benchmark' >>"$out"
fio_mbs=()
for _ in $(seq "$COUNT"); do
  rm -f "$DIR/l2.data"
  go test -run '^$' -bench 'Promote256K' -benchtime 400x -count 1 ./store/ | grep '^Benchmark' >>"$out"
  fio --name=promote-ref --filename="$DIR/l2.data" --rw=randread --bs=256k --iodepth=32 --direct=1 \
    --ioengine=io_uring --size=128m --runtime=5 --time_based --output-format=json >"$fiojs"
  fio_mbs+=("$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["jobs"][0]["read"]["bw_bytes"]/1e6)' "$fiojs")")
done
mem1=$(go test -count=1 -run TestIndexMemoryPerKey -v ./store/ -store.memkeys=1000000 | sed -n 's/.*(\([0-9.]*\) plus.*/\1/p')
mem10=$(go test -count=1 -run TestIndexMemoryPerKey -v ./store/ -store.memkeys=10000000 | sed -n 's/.*(\([0-9.]*\) plus.*/\1/p')

. scripts/lib/stats.sh

echo "### KV block store, in process: daemon CPU per key"
echo
echo "| call | batch 1 ns/key | batch 128 ns/key (goal ≤ 1000) |"
echo "|---|---|---|"
echo "| Get + release (Unpin) | $(median BenchmarkGetRelease/batch=1 ns/key) | $(median BenchmarkGetRelease/batch=128 ns/key) |"
echo "| Commit (zero-copy put) | $(median BenchmarkCommit/batch=1 commit-ns/key) | $(median BenchmarkCommit/batch=128 commit-ns/key) |"
echo "| Reserve | $(median BenchmarkCommit/batch=1 reserve-ns/key) | $(median BenchmarkCommit/batch=128 reserve-ns/key) |"
echo "| Exists | $(median BenchmarkExists/batch=1 ns/key) | $(median BenchmarkExists/batch=128 ns/key) |"
echo "| LookupPrefix | $(median BenchmarkLookupPrefix/pin=false/batch=1 ns/key) | $(median BenchmarkLookupPrefix/pin=false/batch=128 ns/key) |"
echo "| LookupPrefix + pin, then Unpin | $(median BenchmarkLookupPrefix/pin=true/batch=1 ns/key) | $(median BenchmarkLookupPrefix/pin=true/batch=128 ns/key) |"
echo "| Get + release, one session per core | | $(median BenchmarkGetReleaseParallel ns/key) |"
echo
zc=$(median BenchmarkZeroCopy256K MB/s); cp=$(median BenchmarkCopying256K MB/s); mc=$(median BenchmarkMemcpy256K MB/s)
echo "### 256 KiB values: zero-copy vs copying"
echo
echo "| path | MB/s | vs copying (goal ≥ 2x) |"
echo "|---|---|---|"
echo "| zero-copy Reserve/write in place/Commit + Get/read in place/Unpin | $zc | $(ratio "$zc" "$cp")x |"
echo "| copying Put + Read | $cp | 1x |"
echo "| memcpy 256 KiB | $mc | |"
echo
pr=$(median BenchmarkPromote256K MB/s); fm=$(med "${fio_mbs[@]}")
echo "### Get of L2-only 256 KiB values (promotion), depth 32, same file"
echo
echo "| path | MB/s | vs fio (goal ≥ 0.9x) |"
echo "|---|---|---|"
echo "| store promotion (READ_FIXED into pool blocks, crc32c checked) | $pr | $(ratio "$pr" "$fm")x |"
echo "| fio randread bs=256k iodepth=32 direct=1 io_uring | $fm | 1x |"
echo
echo "### Index memory per key (32-byte keys, on L2)"
echo
echo "| keys | bytes per key beyond the key (goal ≤ 128) |"
echo "|---|---|"
echo "| 1M | $mem1 |"
echo "| 10M | $mem10 |"
