#!/usr/bin/env bash
# bench-ebpf-cost.sh - what the kernel-side io_uring view costs the I/O it
# watches: tcbench's 4 KiB random-read job through a spawned daemon with the
# eBPF views off, on with the default sample (one request in 16 timed), and
# on timing every request, each run beside fio on the same file (tcbench
# --baseline). The three settings alternate ROUNDS times, so that the
# machine's drift hits them alike; the table gives each one's median.
#
# usage: scripts/bench-ebpf-cost.sh [ROUNDS (default 3)] [JOB (default examples/jobs/uring-4k-randread.fio)]
# Needs root (the views load only with CAP_BPF and CAP_PERFMON) and a built
# tree (make build). Run it on a quiet machine.
set -euo pipefail
ROUNDS=${1:-3}
JOB=${2:-examples/jobs/uring-4k-randread.fio}
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "bench-ebpf-cost: needs root to load the eBPF views" >&2; exit 1; }
[ -x bin/tcbench ] && [ -x bin/tensorcastd ] || { echo "bench-ebpf-cost: run make build first" >&2; exit 1; }
out=$(mktemp); trap 'rm -f "$out"' EXIT

settings=("off 16" "auto 16" "auto 1")
for ((r = 1; r <= ROUNDS; r++)); do
  for s in "${settings[@]}"; do
    set -- $s
    # The last line of the baseline table: job engine VALUE UNIT REF UNIT RATIO tool...
    line=$(TENSORCAST_EBPF=$1 TENSORCAST_EBPF_URING_SAMPLE=$2 bin/tcbench --spawn --daemon-bin bin/tensorcastd \
      --baseline --repeat 1 "$JOB" 2>&1 | tail -1)
    read -r _ _ tc tcu ref refu ratio _ <<<"$line"
    [[ $ratio =~ ^[0-9.]+$ ]] || { echo "bench-ebpf-cost: no result from tcbench: $line" >&2; exit 1; }
    echo "$1 $2 $tc $tcu $ref $refu $ratio" >>"$out"
  done
done

median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
echo "| ebpf | ebpf_uring_sample | tensorcast (median) | fio beside it (median) | ratio (median of $ROUNDS) | ratios |"
echo "|---|---|---|---|---|---|"
for s in "${settings[@]}"; do
  set -- $s
  rows=$(awk -v e="$1" -v n="$2" '$1 == e && $2 == n' "$out")
  tc=$(awk '{print $3}' <<<"$rows" | sed 's/k$/e3/' | median)
  ref=$(awk '{print $5}' <<<"$rows" | sed 's/k$/e3/' | median)
  unit=$(awk 'NR == 1 {print $4}' <<<"$rows")
  ratio=$(awk '{print $7}' <<<"$rows" | median)
  all=$(awk '{print $7}' <<<"$rows" | paste -sd' ')
  sample=$2; [ "$1" = off ] && sample="(none timed)"
  printf '| %s | %s | %.1fk %s | %.1fk %s | %s | %s |\n' "$1" "$sample" "$(awk -v v="$tc" 'BEGIN {print v / 1000}')" "$unit" \
    "$(awk -v v="$ref" 'BEGIN {print v / 1000}')" "$unit" "$ratio" "$all"
done
echo
echo "Job: $JOB, one client connection and queue, through a spawned daemon; fio io_uring beside each run."
