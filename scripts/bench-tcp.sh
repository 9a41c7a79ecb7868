#!/usr/bin/env bash
# bench-tcp.sh: the tcp transport against its references on loopback,
# alternating runs, reporting medians.
#   - WRITE/READ bandwidth of 1 MiB and 4 MiB requests over 1 connection vs
#     `iperf3 -P 1`, and over 4 connections vs `iperf3 -P 4`;
#   - 4 KiB requests/s at queue depth 1 and 64 vs a raw TCP ping-pong of
#     4 KiB (BenchmarkRawPingPong) at the same depth.
# Usage: scripts/bench-tcp.sh [repeats (default 3)] [seconds per run (default 3)]
set -euo pipefail
REPS=${1:-3}
SECS=${2:-3}
cd "$(dirname "$0")/.."
work=$(mktemp -d)
iperf_pid=""
cleanup() {
	[ -n "$iperf_pid" ] && kill "$iperf_pid" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

go test -c -o "$work/tcp.test" ./tcp >/dev/null

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# iperf3 P -> Gbit/s received
iperf() {
	local port
	port=$(free_port)
	iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
	iperf_pid=$!
	for _ in $(seq 50); do
		ss -ltn 2>/dev/null | grep -q ":$port " && break
		sleep 0.1
	done
	iperf3 -c 127.0.0.1 -p "$port" -P "$1" -t "$SECS" -J |
		python3 -c 'import json,sys; print("%.3f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9))'
	wait "$iperf_pid" 2>/dev/null || true
	iperf_pid=""
}

# gobench REGEX METRIC -> value of METRIC ("Gbit/s" or "ops/s")
gobench() {
	"$work/tcp.test" -test.run '^$' -test.bench "$1" -test.benchtime "${SECS}s" 2>/dev/null |
		awk -v m="$2" '/^Benchmark/ { for (i = 1; i < NF; i++) if ($(i+1) == m) print $i }'
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR+1)/2]; else printf "%.3f\n", (v[NR/2] + v[NR/2+1]) / 2 }'; }

declare -A R
for rep in $(seq "$REPS"); do
	echo "repeat $rep/$REPS" >&2
	R[iperf1]+="$(iperf 1) "
	for op in write read; do
		for sz in 1048576 4194304; do
			R[$op-$sz-1]+="$(gobench "Transfer/$op/size=$sz/conns=1/" Gbit/s) "
		done
	done
	R[iperf4]+="$(iperf 4) "
	for op in write read; do
		for sz in 1048576 4194304; do
			R[$op-$sz-4]+="$(gobench "Transfer/$op/size=$sz/conns=4/" Gbit/s) "
		done
	done
	R[raw1]+="$(gobench 'RawPingPong/size=4096/depth=1$' ops/s) "
	R[raw64]+="$(gobench 'RawPingPong/size=4096/depth=64$' ops/s) "
	for op in write read; do
		R[$op-4k-1]+="$(gobench "Transfer/$op/size=4096/conns=1/depth=1$" ops/s) "
		R[$op-4k-64]+="$(gobench "Transfer/$op/size=4096/conns=4/depth=64$" ops/s) "
	done
done

med() { echo "${R[$1]}" | tr ' ' '\n' | grep -v '^$' | median; }
ratio() { python3 -c "print('%.2f' % ($1 / $2))"; }

echo "tcp transport vs references on loopback, medians of $REPS alternating runs of ${SECS}s"
i1=$(med iperf1); i4=$(med iperf4)
printf '%-34s %10s %10s %6s\n' "case" "tcp" "reference" "ratio"
for c in 1 4; do
	ref=$([ $c = 1 ] && echo "$i1" || echo "$i4")
	for op in write read; do
		for sz in 1048576 4194304; do
			v=$(med "$op-$sz-$c")
			printf '%-34s %10s %10s %6s\n' "$op $((sz >> 20)) MiB, $c conn (Gbit/s)" "$v" "$ref" "$(ratio "$v" "$ref")"
		done
	done
done
r1=$(med raw1); r64=$(med raw64)
for op in write read; do
	v=$(med "$op-4k-1");  printf '%-34s %10s %10s %6s\n' "$op 4 KiB depth 1 (ops/s)" "$v" "$r1" "$(ratio "$v" "$r1")"
	v=$(med "$op-4k-64"); printf '%-34s %10s %10s %6s\n' "$op 4 KiB depth 64 (ops/s)" "$v" "$r64" "$(ratio "$v" "$r64")"
done
echo "raw per-run values:"
for k in $(echo "${!R[@]}" | tr ' ' '\n' | sort); do echo "  $k: ${R[$k]}"; done
