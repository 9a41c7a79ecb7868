#!/usr/bin/env bash
# bench-clib.sh - libtensorcast against the Go client, through one daemon.
#
# 1. The per-request overhead: a queue round trip at depth 1 (submit one
#    request, reap its completion; the reap spins, then sleeps), for a NOP
#    (the queue alone) and a 4 KiB local WRITE (a client buffer into a pool
#    block). The issue's goal: C/Go at most 1.
# 2. A stream of 64 KiB local copies (tcbench's local-64k job): 32 in
#    flight, each wait for 16 completions followed by 16 submits, WRITE and
#    READ, over 128 MiB on each side; the reference is memcpy of the same
#    chunks in one process. Beside each rate, the CPU per request of the
#    client process and of the daemon (from /proc, over the whole run,
#    warm-up included), and memcpy's.
#
# One daemon (bin/tensorcastd) serves both clients: the C program
# c/build/tc_qbench (c/bench/queue_bench.c) and the Go benchmarks
# BenchmarkQueueNop, BenchmarkQueueWrite4K and BenchmarkQueueStream64K*
# (client/queue_bench_test.go) run the same loops, in an order that
# rotates each round, ROUNDS times; the tables show medians.
#
# QBENCH_B=<path> adds a second C build of tc_qbench (for an A/B of the
# library: build c/bench/queue_bench.c against another libtensorcast.a),
# shown as "C (B)".
#
# usage: scripts/bench-clib.sh [ROUNDS (default 5)] [OPS per depth-1 run (default 200000)]
#                              [STREAM_OPS per stream run (default 100000)]
# Run it on a quiet machine; `make build` first (make bench does).
set -euo pipefail
ROUNDS=${1:-5}
OPS=${2:-200000}
STREAM_OPS=${3:-100000}
QBENCH_B=${QBENCH_B:-}
cd "$(dirname "$0")/.."
for f in bin/tensorcastd bin/tcctl c/build/tc_qbench $QBENCH_B; do
	[ -x "$f" ] || { echo "bench-clib: no $f (make build)" >&2; exit 1; }
done
. scripts/lib/daemon.sh
bench_workdir

go test -c -o "$work/client.test" ./client/ >/dev/null
sock=$work/d.sock
daemon_serve "$sock" --pool-size 256MiB
ticks=$(getconf CLK_TCK)

# daemon_cpu is the daemon's CPU time so far, in ns.
daemon_cpu() { awk -v t="$ticks" '{ printf "%.0f\n", ($14 + $15) * 1e9 / t }' "/proc/$daemon_pid/stat"; }

# Each depth-1 run prints "nop NS" and "write4k NS" (ns per request).
qbench_depth1() { "$1" "$sock" "$OPS" 0 depth1; }
go_depth1() { # (no binary: the Go benchmarks)
	TENSORCAST_BENCH_SOCKET=$sock "$work/client.test" -test.run '^$' -test.bench 'BenchmarkQueue(Nop|Write4K)$' \
		-test.benchtime "${OPS}x" |
		awk '/^BenchmarkQueueNop/ { print "nop", $3 } /^BenchmarkQueueWrite4K/ { print "write4k", $3 }'
}
# Each stream run prints "CASE GIBS CLIENT_NS DAEMON_NS" (CPU per request).
qbench_stream() {
	local d0 out
	d0=$(daemon_cpu)
	out=$("$1" "$sock" 0 "$STREAM_OPS" "$2")
	echo "$out $(( ($(daemon_cpu) - d0) / (STREAM_OPS + STREAM_OPS / 10) ))"
}
go_stream() {
	local d0 out bench
	bench=$([ "$1" = stream-write64k ] && echo Write || echo Read)
	d0=$(daemon_cpu)
	out=$(TENSORCAST_BENCH_SOCKET=$sock "$work/client.test" -test.run '^$' \
		-test.bench "^BenchmarkQueueStream64K$bench\$" -test.benchtime "${STREAM_OPS}x" |
		awk -v k="$1" '/^BenchmarkQueueStream64K/ { for (i = 1; i < NF; i++) { if ($(i+1) == "GiB/s") g = $i; if ($(i+1) == "cpu-ns/op") c = $i } print k, g, c }')
	echo "$out $(( ($(daemon_cpu) - d0) / (STREAM_OPS + STREAM_OPS / 10) ))"
}

clients=(c go)
[ -n "$QBENCH_B" ] && clients=(c b go)
one() { # one CLIENT: every case of that client, labelled
	local depth1=qbench_depth1 stream=qbench_stream bin=c/build/tc_qbench
	case $1 in
	b) bin=$QBENCH_B ;;
	go) depth1=go_depth1 stream=go_stream bin="" ;;
	esac
	{
		$depth1 $bin
		for k in stream-write64k stream-read64k; do $stream $bin "$k"; done
	} | sed "s/^/$1 /"
}

for r in $(seq "$ROUNDS"); do
	echo "round $r/$ROUNDS" >&2
	n=${#clients[@]}
	for i in $(seq 0 $((n - 1))); do
		one "${clients[$(( (i + r) % n ))]}" >>"$work/results"
	done
	c/build/tc_qbench "$sock" 0 "$STREAM_OPS" memcpy64k | sed 's/^/ref /' >>"$work/results"
done

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR+1)/2]; else printf "%.3f\n", (v[NR/2] + v[NR/2+1]) / 2 }'; }
# med SIDE CASE FIELD: the median of a result's FIELD-th value (1: the first after the case).
med() { awk -v s="$1" -v k="$2" -v f="$3" '$1 == s && $2 == k { print $(2 + f) }' "$work/results" | median; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

echo "libtensorcast vs the Go client: queue round trip at depth 1, medians of $ROUNDS rotating runs of $OPS requests"
if [ -n "$QBENCH_B" ]; then
	printf '%-20s %10s %10s %10s %7s %7s\n' "case" "C ns/op" "C (B)" "Go ns/op" "C/Go" "C/(B)"
else
	printf '%-20s %10s %10s %7s\n' "case" "C ns/op" "Go ns/op" "C/Go"
fi
for k in nop write4k; do
	c=$(med c "$k" 1)
	g=$(med go "$k" 1)
	[ -n "$c" ] && [ -n "$g" ] || { echo "bench-clib: no result for $k" >&2; exit 1; }
	name=$([ "$k" = nop ] && echo "NOP" || echo "4 KiB local WRITE")
	if [ -n "$QBENCH_B" ]; then
		b=$(med b "$k" 1)
		printf '%-20s %10.0f %10.0f %10.0f %7s %7s\n' "$name" "$c" "$b" "$g" "$(ratio "$c" "$g")" "$(ratio "$c" "$b")"
	else
		printf '%-20s %10.0f %10.0f %7s\n' "$name" "$c" "$g" "$(ratio "$c" "$g")"
	fi
done

echo
echo "64 KiB local copies, 32 in flight, waits for 16: GiB/s and CPU µs per request (client + daemon), medians of $ROUNDS runs of $STREAM_OPS requests"
mc=$(med ref memcpy64k 1)
mcpu=$(med ref memcpy64k 2)
[ -n "$mc" ] || { echo "bench-clib: no memcpy result" >&2; exit 1; }
for k in stream-write64k stream-read64k; do
	for s in "${clients[@]}"; do
		g=$(med "$s" "$k" 1)
		cl=$(med "$s" "$k" 2)
		dm=$(med "$s" "$k" 3)
		[ -n "$g" ] || { echo "bench-clib: no result for $s $k" >&2; exit 1; }
		label=$(case $s in c) echo "C" ;; b) echo "C (B)" ;; go) echo "Go" ;; esac)
		printf '%-16s %-6s %6.2f GiB/s  %5sx memcpy  CPU/req %5.1f µs (client %4.1f + daemon %4.1f)\n' "$k" "$label" "$g" \
			"$(ratio "$g" "$mc")" "$(awk -v a="$cl" -v b="$dm" 'BEGIN { print (a + b) / 1000 }')" \
			"$(awk -v a="$cl" 'BEGIN { print a / 1000 }')" "$(awk -v a="$dm" 'BEGIN { print a / 1000 }')"
	done
done
printf '%-16s %-6s %6.2f GiB/s  %5sx memcpy  CPU/req %5.1f µs\n' "memcpy64k" "ref" "$mc" "1.00" "$(awk -v a="$mcpu" 'BEGIN { print a / 1000 }')"
