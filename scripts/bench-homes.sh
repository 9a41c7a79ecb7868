#!/usr/bin/env bash
# bench-homes.sh: the store across hosts' home lookups at scale, against
# issue 22's goal (home lookup served from the reader's cache above 95 %,
# fallback to a home or etcd below 5 %). Many daemons' real Clusters in
# one process (homes, location indexes, readers' caches of home answers,
# rendezvous over the members; an in-memory peer channel and mover), a
# Zipf workload of Exists + get, members going down and back meanwhile.
# It prints how each key a reader did not hold was placed (cache, its own
# index, asked of the home) and the share of all key lookups that asked a
# home.
# Usage: scripts/bench-homes.sh [daemons (100)] [seconds (60)] [churn events (6)]
# Extra flags go in HOMEBENCH_FLAGS (e.g. "-storesim.keys=32 -storesim.zipf=1.2").
set -euo pipefail
DAEMONS=${1:-100}
SECS=${2:-60}
CHURN=${3:-6}
cd "$(dirname "$0")/.."
go test -count=1 -run '^$' -bench '^BenchmarkHomeLookups$' -benchtime=1x -timeout 30m ./store/cluster \
	-args -storesim.members="$DAEMONS" -storesim.duration="${SECS}s" -storesim.churn="$CHURN" ${HOMEBENCH_FLAGS:-} |
	sed -n '/^home lookups:/,/^  churn:/p;/^BenchmarkHomeLookups/p;/^--- FAIL/,$p'
