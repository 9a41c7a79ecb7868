#!/usr/bin/env bash
# bench-micro.sh - the in-process figures of the foundation, each against its
# reference measured in the same run, as medians of COUNT repeats:
#   - control round trip (TaskStatus; one-shot 4 KiB Transfer) through the
#     real socket vs a raw unix-socket ping-pong of the same frame sizes;
#   - submit+status cost per request at batch sizes 1, 32, 256, with allocs;
#   - the local transport vs copy() for 64 KiB and 1 MiB requests.
# Prints a Markdown section on stdout.
# usage: scripts/bench-micro.sh [COUNT (default 5)] [BENCHTIME (default 2s)]
set -euo pipefail
COUNT=${1:-5}
BT=${2:-2s}
cd "$(dirname "$0")/.."
out=$(mktemp); trap 'rm -f "$out"' EXIT

run() { # pkg pattern
  go test -run '^$' -bench "$2" -benchtime "$BT" -count "$COUNT" "$1" | grep '^Benchmark' >>"$out"
}
run ./control/ 'RawPingPongTaskStatusSize|ControlTaskStatus|RawPingPongTransferSize|ControlTransfer4K'
run ./client/ 'ClientTaskStatus|ClientTransfer4K'
run ./xfer/ 'SubmitStatus|LocalVsCopy'

# median NAME UNIT: the median of the value printed before UNIT on NAME's lines.
median() {
  awk -v name="$1" -v unit="$2" '
    { n = $1; sub(/-[0-9]+$/, "", n); if (n != name) next
      for (i = 3; i <= NF; i++) if ($i == unit) print $(i-1) }' "$out" | sort -g |
  awk '{ v[NR] = $1 } END { if (NR == 0) { print "nan"; exit }
         print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2 }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0) ? a / b : 0 }'; }

raw_ts=$(median BenchmarkRawPingPongTaskStatusSize ns/op)
raw_tr=$(median BenchmarkRawPingPongTransferSize ns/op)
ctl_ts=$(median BenchmarkControlTaskStatus ns/op)
ctl_tr=$(median BenchmarkControlTransfer4K ns/op)
cli_ts=$(median BenchmarkClientTaskStatus ns/op)
cli_tr=$(median BenchmarkClientTransfer4K ns/op)

echo "### Control socket round trip (vs raw unix-socket ping-pong of the same frame sizes)"
echo
echo "| call | tensorcast µs | raw ping-pong µs | rate ratio (goal) |"
echo "|---|---|---|---|"
us() { awk -v n="$1" 'BEGIN { printf "%.1f", n / 1000 }'; }
echo "| TaskStatus, server driven by a raw frame client | $(us "$ctl_ts") | $(us "$raw_ts") | $(ratio "$raw_ts" "$ctl_ts")x (≥ 0.5x) |"
echo "| TaskStatus, Go client | $(us "$cli_ts") | $(us "$raw_ts") | $(ratio "$raw_ts" "$cli_ts")x (≥ 0.5x) |"
echo "| one-shot 4 KiB Transfer, raw frame client | $(us "$ctl_tr") | $(us "$raw_tr") | latency $(ratio "$ctl_tr" "$raw_tr")x (≤ 2x) |"
echo "| one-shot 4 KiB Transfer, Go client | $(us "$cli_tr") | $(us "$raw_tr") | latency $(ratio "$cli_tr" "$raw_tr")x (≤ 2x) |"
echo
echo "### Transfer engine: submit + status per request"
echo
echo "| batch size | ns/request (goal < 1000 at 256) | allocs/op |"
echo "|---|---|---|"
for b in 1 32 256; do
  echo "| $b | $(median "BenchmarkSubmitStatus/batch=$b" ns/request) | $(median "BenchmarkSubmitStatus/batch=$b" allocs/op) |"
done
echo
echo "### local transport vs copy() (working set 128 MiB per side, order alternating)"
echo
echo "| request size | requests per submit | local MB/s | copy() MB/s | local/copy (goal ≥ 0.9) |"
echo "|---|---|---|---|---|"
for s in 64 1024; do
  for d in 1 16; do
    n="BenchmarkLocalVsCopy/size=${s}KiB/depth=$d"
    echo "| ${s} KiB | $d | $(median "$n" local-MB/s) | $(median "$n" copy-MB/s) | $(median "$n" local/copy) |"
  done
done
