#!/usr/bin/env bash
# bench-metrics-cost.sh - what the metrics cost the hot path: the engine's
# per-transport meters (plain counts under the submitter's lock for tasks
# that end inside Submit, a few uncontended atomic adds per later Done, and
# a clock read only for the 1 in 16 submit calls whose latency is sampled;
# xfer/meter.go) and the control server's per-kind request counter (one
# atomic add per request), measured as the engine,
# local-transport and control round-trip benchmarks without the meters and
# with them, alternating COUNT times, compared with benchstat.
#
# usage: scripts/bench-metrics-cost.sh [COUNT (default 6)] [BENCHTIME (default 1s)] [BASE [HEADREV]]
#   Without BASE both sides are the working tree, built with -tags nometers
#   (xfer/meters_off.go: the engine's meters compiled out) and without: the
#   two differ by the meters alone. With BASE, that revision is the "before"
#   side and HEADREV (default: the working tree) the "after" one.
# Prints benchstat's table; run it on a quiet machine.
set -euo pipefail
COUNT=${1:-6}
BT=${2:-1s}
cd "$(dirname "$0")/.."
BASE=${3:-}
BENCHSTAT=golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da
work=$(mktemp -d)
trap 'git worktree remove --force "$work/base" >/dev/null 2>&1 || true; git worktree remove --force "$work/head" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
basetags=()
if [ -n "$BASE" ]; then
  git worktree add --detach "$work/base" "$BASE" >/dev/null 2>&1
else
  basetags=(-tags nometers)
fi
HEADREV=${4:-}
if [ -n "$HEADREV" ]; then git worktree add --detach "$work/head" "$HEADREV" >/dev/null 2>&1; fi

# Test binaries are built once per side, then run alternately so that load
# from elsewhere hits both alike.
for side in base head; do
  dir=$PWD; tags=()
  [ "$side" = base ] && [ -n "$BASE" ] && dir=$work/base
  [ "$side" = base ] && tags=("${basetags[@]}")
  [ "$side" = head ] && [ -n "$HEADREV" ] && dir=$work/head
  (cd "$dir" && go test "${tags[@]}" -c -o "$work/xfer-$side.test" ./xfer/ &&
    go test "${tags[@]}" -c -o "$work/control-$side.test" ./control/)
done
for i in $(seq "$COUNT"); do
  for side in base head; do
    (cd xfer && "$work/xfer-$side.test" -test.run '^$' -test.bench 'SubmitStatus|StreamSubmit|LocalCopy/local' \
      -test.benchtime "$BT" -test.count 1 -test.benchmem) | grep '^Benchmark' >>"$work/$side.txt"
    (cd control && "$work/control-$side.test" -test.run '^$' -test.bench 'ControlTaskStatus|ControlTransfer4K' \
      -test.benchtime "$BT" -test.count 1 -test.benchmem) | grep '^Benchmark' >>"$work/$side.txt"
  done
done
if [ -n "$BASE" ]; then
  echo "metrics cost: $(git rev-parse --short "$BASE") (before) vs $(git rev-parse --short "${HEADREV:-HEAD}"), $COUNT alternating runs of $BT"
else
  echo "metrics cost: $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo +) built with -tags nometers (base: the meters compiled out) vs as shipped (head), $COUNT alternating runs of $BT"
fi
go run "$BENCHSTAT" "base=$work/base.txt" "head=$work/head.txt"
