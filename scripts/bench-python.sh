#!/usr/bin/env bash
# bench-python.sh - the Python client's store figures (python/bench/store.py):
# zero-copy put and get of 256 KiB blocks vs numpy copying the same bytes
# (goal: at least 2x), the copying put and get vs numpy (goal: at least
# 0.8x), and the SGLang-shaped backend's pages per second for batch_set_v1 and
# batch_get_v1 at 128 pages per call, against one daemon (bin/tensorcastd,
# its store in DRAM) on Debian's python3 with numpy and torch. Prints a
# Markdown section on stdout.
#
# usage: scripts/bench-python.sh [ROUNDS (default 5)] [SECONDS per run (default 1)]
# Run it on a quiet machine; `make build` first (make bench does).
set -euo pipefail
ROUNDS=${1:-5}
SECONDS_PER_RUN=${2:-1}
PYTHON=${PYTHON:-/usr/bin/python3}
cd "$(dirname "$0")/.."
for f in bin/tensorcastd bin/tcctl c/build/libtensorcast.so; do
	[ -x "$f" ] || [ -f "$f" ] || { echo "bench-python: no $f (make build)" >&2; exit 1; }
done
"$PYTHON" -c 'import numpy, torch' 2>/dev/null || { echo "bench-python: $PYTHON lacks numpy or torch (make deps)" >&2; exit 1; }
. scripts/lib/daemon.sh
bench_workdir

sock=$work/d.sock
daemon_serve "$sock" --pool-size 1GiB --store-l2-path off

PYTHONPATH=python "$PYTHON" python/bench/store.py "$sock" "$ROUNDS" "$SECONDS_PER_RUN"
