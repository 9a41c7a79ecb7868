#!/usr/bin/env bash
# bench-metrics-cost.sh - what the metrics cost the hot path: the engine's
# per-transport meters (a clock read per dispatch group and per completion,
# a few uncontended atomic adds per task) and the control server's per-kind
# request counter (one atomic add per request), measured as the engine,
# local-transport and control round-trip benchmarks at BASE (before them)
# and at HEAD, alternating COUNT times, compared with benchstat.
#
# usage: scripts/bench-metrics-cost.sh [COUNT (default 6)] [BENCHTIME (default 1s)] [BASE] [HEADREV]
#   BASE defaults to the parent of the commit that added the meters.
#   HEADREV (default: the working tree) is the other side. The tree has
#   changed in many other ways since the meters came, so BASE against the
#   tree does not isolate them: `make bench` passes the meters' commit and
#   its parent, which differ by the meters alone.
# Prints benchstat's table; run it on a quiet machine.
set -euo pipefail
COUNT=${1:-6}
BT=${2:-1s}
cd "$(dirname "$0")/.."
BASE=${3:-$(git log --format=%H --grep '^xfer: per-transport meters' | tail -1)^}
BENCHSTAT=golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da
work=$(mktemp -d)
trap 'git worktree remove --force "$work/base" >/dev/null 2>&1 || true; git worktree remove --force "$work/head" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git worktree add --detach "$work/base" "$BASE" >/dev/null 2>&1
HEADREV=${4:-}
if [ -n "$HEADREV" ]; then git worktree add --detach "$work/head" "$HEADREV" >/dev/null 2>&1; fi

# Test binaries are built once per side, then run alternately so that load
# from elsewhere hits both alike.
for side in base head; do
  dir=$PWD; [ "$side" = base ] && dir=$work/base; [ "$side" = head ] && [ -n "$HEADREV" ] && dir=$work/head
  (cd "$dir" && go test -c -o "$work/xfer-$side.test" ./xfer/ && go test -c -o "$work/control-$side.test" ./control/)
done
for i in $(seq "$COUNT"); do
  for side in base head; do
    (cd xfer && "$work/xfer-$side.test" -test.run '^$' -test.bench 'SubmitStatus|LocalCopy/local' \
      -test.benchtime "$BT" -test.count 1 -test.benchmem) | grep '^Benchmark' >>"$work/$side.txt"
    (cd control && "$work/control-$side.test" -test.run '^$' -test.bench 'ControlTaskStatus|ControlTransfer4K' \
      -test.benchtime "$BT" -test.count 1 -test.benchmem) | grep '^Benchmark' >>"$work/$side.txt"
  done
done
echo "metrics cost: $(git rev-parse --short "$BASE") (before) vs $(git rev-parse --short "${HEADREV:-HEAD}")${HEADREV:+ (the meters)}, $COUNT alternating runs of $BT"
go run "$BENCHSTAT" "base=$work/base.txt" "head=$work/head.txt"
