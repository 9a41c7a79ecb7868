#!/usr/bin/env bash
# bench-python.sh - the Python client's store figures (python/bench/store.py):
# zero-copy put and get of 256 KiB blocks vs numpy copying the same bytes
# (goal: at least 2x), the copying put and get vs numpy (goal: at least
# 0.8x), vLLM-shaped blocks stored and loaded through the worker handlers vs
# torch copying the same bytes (goal: at least 0.9x; python/bench/vllm_blocks.py),
# and the SGLang-shaped backup and prefetch of 128 pages per call
# (python/bench/sglang.py), direct and copied, vs numpy copying the same bytes
# (goal for direct: at least 2x), against one daemon (bin/tensorcastd, its
# store in DRAM) on Debian's python3 with numpy and torch. Prints a Markdown
# section on stdout.
#
# The pool is on 4 KiB pages; POOL_PAGES=huge puts it on 2 MiB hugepages,
# reserved for the run (as root) and given back after it, as a GPU host
# would give them. The section says which the pool had.
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
pages=(--hugepages off)
if [ "${POOL_PAGES:-normal}" = huge ]; then
	nr=/proc/sys/vm/nr_hugepages
	[ -w "$nr" ] || { echo "bench-python: reserving hugepages needs root ($nr); POOL_PAGES=normal runs without them" >&2; exit 1; }
	before=$(cat "$nr")
	trap 'echo "$before" >"$nr"; bench_cleanup' EXIT
	echo $((before + 520)) >"$nr" # 1 GiB of 2 MiB pages, and a few for the queue
	pages=(--hugepages on)
fi
daemon_serve "$sock" --pool-size 1GiB --store-l2-path off "${pages[@]}"
BENCH_POOL_PAGES=$(sed -n 's/.*shm pool mapped.* pages=\("[^"]*"\|[a-z0-9]*\).*/\1/p' "$work/daemon.log" | tr -d '"' | head -1)
[ -n "$BENCH_POOL_PAGES" ] || { echo "bench-python: the daemon's log does not say how its pool is paged" >&2; cat "$work/daemon.log" >&2; exit 1; }
export BENCH_POOL_PAGES
export BENCH_DAEMON_PID=$daemon_pid

PYTHONPATH=python "$PYTHON" python/bench/store.py "$sock" "$ROUNDS" "$SECONDS_PER_RUN"
PYTHONPATH=python "$PYTHON" python/bench/vllm_blocks.py "$sock" "$ROUNDS" "$SECONDS_PER_RUN"
echo
PYTHONPATH=python "$PYTHON" python/bench/sglang.py "$sock" "$ROUNDS" "$SECONDS_PER_RUN"
