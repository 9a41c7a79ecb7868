#!/usr/bin/env bash
# bench-clib.sh - the per-request overhead of libtensorcast against the Go
# client: a queue round trip at depth 1 (submit one request, reap its
# completion; the reap spins, then sleeps), for a NOP (the queue alone) and
# a 4 KiB local WRITE (a client buffer into a pool block). One daemon
# (bin/tensorcastd) serves both clients: the C program c/build/tc_qbench
# (c/bench/queue_bench.c) and the Go benchmarks BenchmarkQueueNop and
# BenchmarkQueueWrite4K (client/queue_bench_test.go) run the same loop,
# alternately (the order flips each round), ROUNDS times; the table shows
# medians. The issue's goal: C/Go at most 1.
#
# usage: scripts/bench-clib.sh [ROUNDS (default 5)] [OPS per run (default 200000)]
# Run it on a quiet machine; `make build` first (make bench does).
set -euo pipefail
ROUNDS=${1:-5}
OPS=${2:-200000}
cd "$(dirname "$0")/.."
for f in bin/tensorcastd bin/tcctl c/build/tc_qbench; do
	[ -x "$f" ] || { echo "bench-clib: no $f (make build)" >&2; exit 1; }
done
. scripts/lib/daemon.sh
bench_workdir

go test -c -o "$work/client.test" ./client/ >/dev/null
sock=$work/d.sock
daemon_serve "$sock" --pool-size 64MiB

# Each prints "nop NS" and "write4k NS" (ns per request).
c_run() { c/build/tc_qbench "$sock" "$OPS"; }
go_run() {
	TENSORCAST_BENCH_SOCKET=$sock "$work/client.test" -test.run '^$' -test.bench 'BenchmarkQueue(Nop|Write4K)$' \
		-test.benchtime "${OPS}x" |
		awk '/^BenchmarkQueueNop/ { print "nop", $3 } /^BenchmarkQueueWrite4K/ { print "write4k", $3 }'
}

for r in $(seq "$ROUNDS"); do
	echo "round $r/$ROUNDS" >&2
	if [ $((r % 2)) = 1 ]; then
		c_run | sed 's/^/c /' >>"$work/results"
		go_run | sed 's/^/go /' >>"$work/results"
	else
		go_run | sed 's/^/go /' >>"$work/results"
		c_run | sed 's/^/c /' >>"$work/results"
	fi
done

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR+1)/2]; else printf "%.0f\n", (v[NR/2] + v[NR/2+1]) / 2 }'; }
med() { awk -v s="$1" -v k="$2" '$1 == s && $2 == k { print $3 }' "$work/results" | median; }

echo "libtensorcast vs the Go client: queue round trip at depth 1, medians of $ROUNDS alternating runs of $OPS requests"
printf '%-20s %10s %10s %7s\n' "case" "C ns/op" "Go ns/op" "C/Go"
for k in nop write4k; do
	c=$(med c "$k")
	g=$(med go "$k")
	[ -n "$c" ] && [ -n "$g" ] || { echo "bench-clib: no result for $k" >&2; exit 1; }
	name=$([ "$k" = nop ] && echo "NOP" || echo "4 KiB local WRITE")
	printf '%-20s %10s %10s %7s\n' "$name" "$c" "$g" "$(awk -v a="$c" -v b="$g" 'BEGIN { printf "%.2f", a / b }')"
done
