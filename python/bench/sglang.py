#!/usr/bin/env python3
"""SGLang-shaped backup and prefetch of 128 pages through the HiCache backend
(tensorcast.integrations.sglang), direct vs copy, each beside numpy copying
the same bytes, as a Markdown section.

The host pool is an MHA pool in page_first layout (tests/sglang_doubles.py):
256 pages of 16 tokens of 4 layers x 8 heads x 128 (bfloat16), so a page is a
K and a V buffer of 128 KiB. Backup is SGLang's controller's batch_set_v1 of
128 pages from slots 0..127 (the keys removed after each call, untimed);
prefetch is its batch_get_v1 of 128 stored pages into slots 128..255.

- direct: the host pool in memfds the daemon maps (tensorcast's
  HostAllocator; and SGLang's own shared-memory allocator, unsealed, when
  the daemon accepts it), the daemon copies between its pool and the pages;
- copy: an ordinary host pool, libtensorcast copies through the store's
  queue.

numpy's references copy the same 32 MiB from the host pool: as two rows
of 16 MiB (the pages' K and V halves) into another array, and buffer by
buffer (256 np.copyto of 128 KiB, the pieces the store keeps). The daemon's pool is
touched first (see store.py's warm). Each case runs ROUNDS times,
alternating with its reference; the table shows medians. The goal: direct at
least 2x numpy copying. CPU seconds per GB are this process's and the
daemon's ($BENCH_DAEMON_PID, from /proc) over the timed calls.

usage: PYTHONPATH=python python3 python/bench/sglang.py SOCKET [ROUNDS] [SECONDS per run]
"""

from __future__ import annotations

import logging
import statistics
import sys
from typing import Any, Callable, List, Tuple

import numpy
import torch

from tensorcast.integrations import sglang

from store import Runner, alternate, start  # python/bench/store.py

sys.path.insert(0, __file__.rsplit("/", 2)[0])  # python/, for the tests' SGLang doubles
from tests.sglang_doubles import HiCacheStorageConfig, HostPool, ShmAllocator  # noqa: E402

PAGES = 128


def pool_of(alloc: Any) -> HostPool:
    pool = HostPool("mha", "page_first", pages=2 * PAGES, page_size=16, layers=4, heads=8, head_dim=128,
                    allocator=alloc)
    pool.kv_buffer.view(torch.uint8).fill_(7)  # the host pool's pages exist (an engine's would)
    return pool


def numpy_reference(pool: HostPool) -> Callable[[int], int]:
    """numpy copying the 128 pages' K and V halves as two rows of 16 MiB
    (the fastest way numpy has to copy these bytes)."""
    src = pool.kv_buffer.view(torch.uint8).numpy().reshape(2, -1)
    n = PAGES * pool.page_bytes() // 2
    dst = numpy.ones((2, n), dtype=numpy.uint8)  # written: no first-touch faults in the runs

    def step(i: int) -> int:
        dst[:] = src[:, :n]
        return 2 * n
    return step


def numpy_pages(pool: HostPool) -> Callable[[int], int]:
    """numpy copying the same bytes buffer by buffer, as the store keeps
    them: the 256 buffers of 128 KiB (each page's K and V) one np.copyto
    each, into 256 separate destinations."""
    half = pool.kv_buffer.view(torch.uint8).numpy().reshape(2, 2 * PAGES, -1)
    srcs = [half[kv, p] for p in range(PAGES) for kv in (0, 1)]
    dsts = [numpy.ones_like(x) for x in srcs]

    def step(i: int) -> int:
        for d, x in zip(dsts, srcs):
            numpy.copyto(d, x)
        return PAGES * pool.page_bytes()
    return step


def alternate3(rn: Runner, rounds: int, step: Callable[[int], int], after: Callable[[int], None],
               ref: Callable[[int], int], paged: Callable[[int], int],
               each: Callable[[], None]) -> Tuple[List[float], List[float], List[float]]:
    """alternate() with two references: each round runs the three in an
    order rotated from the last one's."""
    out: Tuple[List[float], List[float], List[float]] = ([], [], [])
    runs = [lambda: out[0].append(rn.rate(step, after)), lambda: out[1].append(rn.rate(ref)),
            lambda: out[2].append(rn.rate(paged))]
    for r in range(rounds):
        each()
        for k in range(3):
            runs[(r + k) % 3]()
    return out


def cases(socket: str, rn: Runner, rounds: int) -> List[Tuple[str, str, float, float, float, Tuple[float, float],
                                                             Tuple[float, float]]]:
    rows = []
    log = logging.getLogger("bench.sglang")
    for mode in ("direct, HostAllocator", "direct, SGLang's shm allocator", "copy"):
        alloc: Any = sglang.HostAllocator() if "HostAllocator" in mode else ShmAllocator() if "shm" in mode else None
        pool = pool_of(alloc)
        b = sglang.TensorcastStore(HiCacheStorageConfig(), {"socket": socket, "key_prefix": "bench-sglang/"},
                                   logger=log)
        b.register_mem_pool_host(pool)
        if b.direct != mode.startswith("direct"):
            print(f"bench-sglang: {mode}: not direct (the daemon refused the host pool's memfd); left out",
                  file=sys.stderr)
            b.close()
            continue
        client = b._link.client()
        assert client is not None
        kv = b._pools["kv"]
        tag = [0]
        page_bytes = pool.page_bytes()

        def keys(i: int) -> List[str]:
            return [f"{tag[0]}/{i}/{k}" for k in range(PAGES)]

        # The host indices as SGLang's controller has them (a slice of its
        # operation's tensor): made once, untimed.
        lo, hi = pool.indices(range(PAGES)), pool.indices(range(PAGES, 2 * PAGES))

        def backup(i: int) -> int:
            assert b.batch_set_v1(keys(i), lo) == [True] * PAGES
            return PAGES * page_bytes

        def drop(i: int) -> None:
            client.remove(kv.keys(keys(i)))

        stored = [f"get/{k}" for k in range(PAGES)]
        assert b.batch_set_v1(stored, lo) == [True] * PAGES

        def prefetch(i: int) -> int:
            assert b.batch_get_v1(stored, hi) == [True] * PAGES
            return PAGES * page_bytes

        ref, by_page = numpy_reference(pool), numpy_pages(pool)
        for name, step, after in (("backup (batch_set_v1)", backup, drop), ("prefetch (batch_get_v1)", prefetch,
                                                                             lambda i: None)):
            def next_tag() -> None:
                tag[0] += 1

            mine, theirs, paged = alternate3(rn, rounds, step, after, ref, by_page, next_tag)
            rows.append((name, mode, statistics.median(mine), statistics.median(theirs), statistics.median(paged),
                         rn.cpu_per_gb(step), rn.cpu_per_gb(ref)))
        client.remove(kv.keys(stored))
        b.close()
        if isinstance(alloc, ShmAllocator):
            alloc.close()
    return rows


def main() -> int:
    args = start(__doc__, "bench-sglang")
    if args is None:
        return 2
    socket, rounds, seconds, rn, c = args
    c.close()
    rows = cases(socket, rn, rounds)
    print(f"SGLang-shaped backup and prefetch, {PAGES} pages per call (a page: a K and a V buffer of 128 KiB, "
          f"{PAGES * 256 >> 10} MiB per call); medians of {rounds} runs of {seconds:g} s, each alternating with "
          "numpy copying the same bytes.")
    print()
    print("| call | mode | GB/s | numpy copy GB/s | ratio | goal | numpy page by page GB/s | ratio "
          "| CPU s/GB: client + daemon | numpy CPU s/GB |")
    print("| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    for name, mode, mine, theirs, paged, (cc, cd), (nc, _) in rows:
        goal = "≥ 2" if mode.startswith("direct") else ""
        print(f"| {name} | {mode} | {mine / 1e9:.2f} | {theirs / 1e9:.2f} | {mine / theirs:.2f} | {goal} "
              f"| {paged / 1e9:.2f} | {mine / paged:.2f} | {cc:.3f} + {cd:.3f} | {nc:.3f} |")
    print()
    print("numpy copy: the 32 MiB as two rows of 16 MiB; numpy page by page: the same bytes as the store keeps "
          "them, 256 buffers of 128 KiB, one np.copyto each. The goal's ratio is against the first.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
