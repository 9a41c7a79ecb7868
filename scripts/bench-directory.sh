#!/usr/bin/env bash
# bench-directory.sh: the etcd directory at scale, against the seed's gates.
# Many daemons (full daemons in one process, each with a 4 MiB pool, its own
# control socket and peer plane) register in one etcd (Debian's etcd-server,
# run by the harness on loopback ports); workers run a Zipf workload of
# directory lookups and OpenRemote calls while daemons are killed (their
# leases left to lapse), restarted with new epochs and added, and etcd is
# stopped for a while in the middle. It prints:
#   - the cache hit rate (goal > 95 %) and fallback rate (goal < 5 %), with
#     etcd up, and over the whole run;
#   - etcd requests per 1,000 lookups;
#   - lookup p50/p99 from the cache, on fallback to etcd and to the peer,
#     and OpenRemote's;
#   - how long a killed daemon takes to disappear and a restarted one to
#     appear (goal: within the lease TTL + 1 s);
#   - with etcd down: lookups past the budget, how many failed closed, and
#     false successes (must be 0).
# Usage: scripts/bench-directory.sh [daemons (100)] [seconds (120)] [outage seconds (30)]
# Extra harness flags go in DIRBENCH_FLAGS (e.g. "-dirbench.ttl=5s -dirbench.workers=8").
set -euo pipefail
DAEMONS=${1:-100}
SECS=${2:-120}
OUTAGE=${3:-30}
cd "$(dirname "$0")/.."
command -v etcd >/dev/null || { echo "bench-directory: etcd is not installed (scripts/deps.sh test)" >&2; exit 1; }
# All the daemons share this process's descriptors (about 3 per peer
# connection): ask for more, and say so when the limit will not move (the
# report prints the peak against it).
ulimit -n 65536 2>/dev/null || echo "bench-directory: could not raise the descriptor limit above $(ulimit -n)" >&2
go test -count=1 -run '^$' -bench '^BenchmarkDirectoryChurn$' -benchtime=1x -timeout 60m ./daemon \
	-args -dirbench.report -dirbench.daemons="$DAEMONS" -dirbench.duration="${SECS}s" -dirbench.outage="${OUTAGE}s" \
	-dirbench.ttl=3s -dirbench.budget=2s -dirbench.exports=8 -dirbench.workers=8 ${DIRBENCH_FLAGS:-} |
	sed -n '/^directory churn/,/^  churn:/p;/^  killed /p;/^--- FAIL/,$p'
