#!/usr/bin/env python3
"""The Python client's store figures against a running daemon, each beside
numpy copying the same bytes, as a Markdown section (scripts/bench-python.sh
starts the daemon and runs this).

- Zero-copy put (reserve, commit) and get (get_pinned, release) of 256 KiB
  blocks, BATCH keys per call: the bytes left in place (what the store costs
  the client, the issue's goal: at least 2x numpy copying the same bytes),
  and written or read by the client through the views (numpy into or out of
  them).
- Copying put and get (c.put of numpy arrays, c.get into numpy arrays):
  one copy each way in libtensorcast (goal: at least 0.8x numpy).

The SGLang-shaped backend has its own script, sglang.py beside this one.

numpy's reference copies BATCH blocks of 256 KiB from one 64 MiB array into
another, moving through them, so that neither side is a cached block; the
store's blocks come from the daemon's pool, which the daemon recycles. The
pool is touched first as a long-running engine and daemon would have it
(this process's mapping populated, every block written once by the daemon),
and each run starts with an untimed call: first-touch page faults are not
what is measured.
Each case runs ROUNDS times, alternating with its reference; the table shows
medians. Keys put in a round are removed after it, untimed.

usage: PYTHONPATH=python python3 python/bench/store.py SOCKET [ROUNDS] [SECONDS per run]
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy
import torch

import tensorcast
from tensorcast import Status

BLOCK = 256 << 10
BATCH = 32
SPAN = 64 << 20


def daemon_cpu() -> float:
    """The CPU seconds (user and system) of the daemon whose pid is in
    $BENCH_DAEMON_PID so far (0 without it)."""
    pid = os.environ.get("BENCH_DAEMON_PID")
    if not pid:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Runner:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        # Of each rate(): the step, and the CPU seconds per byte of this
        # process and of the daemon over the timed calls.
        self.cpu: List[Tuple[Callable[[int], int], float, float]] = []

    def rate(self, step: Callable[[int], int], after: Callable[[int], None] = lambda i: None) -> float:
        """Bytes per second of step(i) (which returns the bytes it moved),
        called for about self.seconds after one untimed call; after(i) runs
        untimed after each."""
        step(-1)
        after(-1)
        moved, spent, i = 0, 0.0, 0
        mine = theirs = 0.0
        while spent < self.seconds or i < 3:
            d0, c0 = daemon_cpu(), time.process_time()
            t0 = time.perf_counter()
            moved += step(i)
            spent += time.perf_counter() - t0
            mine += time.process_time() - c0
            theirs += daemon_cpu() - d0
            after(i)
            i += 1
        self.cpu.append((step, mine / moved, theirs / moved))
        return moved / spent

    def cpu_per_gb(self, step: Callable[[int], int]) -> Tuple[float, float]:
        """The medians of the CPU seconds per GB of this process and of the
        daemon over the runs of step."""
        runs = [(c, d) for s, c, d in self.cpu if s is step]
        return (statistics.median(c for c, _ in runs) * 1e9, statistics.median(d for _, d in runs) * 1e9)


def alternate(rn: Runner, rounds: int, step: Callable[[int], int], after: Callable[[int], None],
              ref: Callable[[int], int], each: Callable[[], None] = lambda: None) -> Tuple[List[float], List[float]]:
    """rounds rates of step (after each call, after) and of ref, each
    round's order swapped from the last; each() runs before every round."""
    mine: List[float] = []
    theirs: List[float] = []
    for r in range(rounds):
        each()
        pair = [lambda: mine.append(rn.rate(step, after)), lambda: theirs.append(rn.rate(ref))]
        for run in (pair if r % 2 == 0 else pair[::-1]):
            run()
    return mine, theirs


def start(doc: str, name: str) -> Optional[Tuple[str, int, float, Runner, tensorcast.Client]]:
    """A benchmark's start: SOCKET [ROUNDS (5)] [SECONDS per run (1)] from
    sys.argv (None, with doc's usage line printed, when there is no socket),
    one torch thread, and a client named name whose daemon's pool is warm."""
    if len(sys.argv) < 2:
        print(doc.rsplit("usage: ", 1)[1], file=sys.stderr)
        return None
    socket = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
    torch.set_num_threads(1)
    c = tensorcast.connect(socket, name)
    warm(c)
    return socket, rounds, seconds, Runner(seconds), c


def numpy_copy() -> Callable[[int], int]:
    src = numpy.random.default_rng(1).integers(0, 255, SPAN, dtype=numpy.uint8).reshape(-1, BLOCK)
    dst = numpy.ones_like(src)  # written: no first-touch faults in the runs
    per = src.shape[0] // BATCH

    def step(i: int) -> int:
        j = (i % per) * BATCH
        dst[j:j + BATCH] = src[j:j + BATCH]
        return BATCH * BLOCK
    return step


def store_cases(c: tensorcast.Client, rn: Runner, rounds: int) -> List[Tuple[str, float, float, str]]:
    src = numpy.random.default_rng(2).integers(0, 255, SPAN, dtype=numpy.uint8).reshape(-1, BLOCK)
    dst = numpy.ones_like(src)
    per = src.shape[0] // BATCH
    ref = numpy_copy()
    got: Dict[str, List[float]] = {}
    tag = [0]

    def keys(i: int) -> List[bytes]:
        return [b"bench/%d/%d/%d" % (tag[0], i, k) for k in range(BATCH)]

    def drop(i: int) -> None:
        c.remove(keys(i))

    def zput(i: int) -> int:
        r = c.reserve(keys(i), BLOCK)
        assert r.commit() == [Status.OK] * BATCH
        return BATCH * BLOCK

    def zput_write(i: int) -> int:
        r = c.reserve(keys(i), BLOCK)
        j = (i % per) * BATCH
        for k, v in enumerate(r.views):
            numpy.frombuffer(v, dtype=numpy.uint8)[:] = src[j + k]  # type: ignore[arg-type]
        assert r.commit() == [Status.OK] * BATCH
        return BATCH * BLOCK

    def put_copy(i: int) -> int:
        j = (i % per) * BATCH
        assert c.put(keys(i), list(src[j:j + BATCH])) == [Status.OK] * BATCH
        return BATCH * BLOCK

    stored = [b"bench/get/%d" % k for k in range(BATCH)]
    c.put(stored, list(src[:BATCH]))

    def zget(i: int) -> int:
        with c.get_pinned(stored):
            pass
        return BATCH * BLOCK

    def zget_read(i: int) -> int:
        j = (i % per) * BATCH
        with c.get_pinned(stored) as views:
            for k, v in enumerate(views):
                dst[j + k] = numpy.frombuffer(v, dtype=numpy.uint8)  # type: ignore[arg-type]
        return BATCH * BLOCK

    def get_copy(i: int) -> int:
        j = (i % per) * BATCH
        assert c.get(stored, list(dst[j:j + BATCH])) == [Status.OK] * BATCH
        return BATCH * BLOCK

    cases = [
        ("zero-copy put (reserve, commit), bytes left in place", zput, drop, "≥ 2"),
        ("zero-copy get (get_pinned, release), bytes left in place", zget, None, "≥ 2"),
        ("zero-copy put, the client writing the blocks (numpy into the views)", zput_write, drop, ""),
        ("zero-copy get, the client reading the blocks (numpy out of the views)", zget_read, None, ""),
        ("copying put (c.put of numpy arrays)", put_copy, drop, "≥ 0.8"),
        ("copying get (c.get into numpy arrays)", get_copy, None, "≥ 0.8"),
    ]
    rows = []
    for name, step, after, goal in cases:

        def next_tag() -> None:
            tag[0] += 1

        mine, theirs = alternate(rn, rounds, step, after or (lambda i: None), ref, next_tag)
        got[name] = mine
        rows.append((name, statistics.median(mine), statistics.median(theirs), goal))
    c.remove(stored)
    return rows


def warm(c: tensorcast.Client) -> None:
    """Touches the pool as a long-running engine and daemon have: this
    process's mapping populated (MADV_POPULATE_WRITE, which writes nothing),
    and every block the store can hold written once by the daemon (puts
    copied from a buffer, then removed)."""
    try:
        c.pool._mm.madvise(23)  # MADV_POPULATE_WRITE (Linux 5.14)
    except (OSError, ValueError):
        pass
    buf = c.create_buffer(BATCH * BLOCK)
    buf.view[:] = b"\x01" * len(buf.view)
    cap = c.stats().store.get("l1_capacity", c.pool.size // 2)
    for i in range(max(1, int(cap * 0.9) // (BATCH * BLOCK))):
        keys = [b"bench/warm/%d/%d" % (i, k) for k in range(BATCH)]
        c.store_put(keys, [(buf.id, k * BLOCK, BLOCK) for k in range(BATCH)])
        c.remove(keys)
    buf.close()


def main() -> int:
    args = start(__doc__, "bench-python")
    if args is None:
        return 2
    _, rounds, seconds, rn, c = args
    with c:
        rows = store_cases(c, rn, rounds)
    print(f"Python {sys.version.split()[0]}, numpy {numpy.__version__}, torch {torch.__version__}; blocks of "
          f"{BLOCK >> 10} KiB, {BATCH} keys per call; medians of {rounds} runs of {seconds:g} s, each alternating "
          "with numpy's copy of the same bytes (64 MiB spans). The daemon keeps the store in DRAM (L2 off); its pool "
          f"is on {os.environ.get('BENCH_POOL_PAGES', 'unknown')} pages.")
    print()
    print("| measurement | store GB/s | numpy copy GB/s | ratio | goal |")
    print("| --- | ---: | ---: | ---: | --- |")
    for name, mine, theirs, goal in rows:
        print(f"| {name} | {mine / 1e9:.2f} | {theirs / 1e9:.2f} | {mine / theirs:.2f} | {goal} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
