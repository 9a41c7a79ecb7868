#!/usr/bin/env python3
"""vLLM-shaped store and load of blocks through tensorcast's worker handlers,
each beside torch copying the same bytes, as a Markdown section.

The engine is one worker of a vLLM-shaped model: LAYERS layers in
FlashAttention's layout, (2, NUM_BLOCKS, 16 tokens, 8 KV heads, 128) fp16
CPU tensors, one offloaded block per GPU block (1 MiB with every layer's K
and V). A store is BATCH blocks: the scheduler's prepare_store, the store
handler's transfer (the timed part: the blocks' bytes from the KV tensors
into the pool), complete_store. A load is the way back into other GPU
blocks between prepare_load and complete_load.

The reference is what vLLM's own CPU offloading does with the same blocks
(its swap_blocks: one copy per KV tensor and block) done by torch on CPU
tensors: per KV tensor and block, the block's bytes copied to its slot of a
CPU cache shaped as the KV tensors (torch copy_ of one row), the same bytes.
The goal (issue 23): the handlers at least 0.9x the reference.

Rows: the handlers' transfer alone, and the whole store (load) with the
scheduler's calls around it, each with the reference of the same run.
The pool is warmed first as store.py does (every block written once by the
daemon, the mappings populated). Each case runs ROUNDS times, alternating
with its reference; the table shows medians. The keys of a round are
removed after it, untimed.

usage: PYTHONPATH=python /usr/bin/python3 python/bench/vllm_blocks.py SOCKET [ROUNDS] [SECONDS per run]
"""

from __future__ import annotations

import statistics
import sys
from types import SimpleNamespace as NS
from typing import Callable, List, Tuple

import torch

import tensorcast
from tensorcast.integrations import vllm, vllm_worker

sys.path.insert(0, __file__.rsplit("/", 1)[0])  # python/bench, for store.py's runner and warm-up
from store import Runner, warm  # noqa: E402

LAYERS = 16
NUM_BLOCKS = 96
TOKENS, HEADS, HEAD_DIM = 16, 8, 128
BATCH = 16


def configs(socket: str) -> Tuple[NS, NS]:
    page = 2 * TOKENS * HEADS * HEAD_DIM * 2
    vllm_config = NS(
        model_config=NS(model="bench/model", revision=None, dtype=torch.float16, use_mla=False),
        cache_config=NS(block_size=TOKENS, cache_dtype="auto", prefix_caching_hash_algo="sha256"),
        parallel_config=NS(world_size=1, tensor_parallel_size=1, pipeline_parallel_size=1, rank=0),
        kv_transfer_config=NS(kv_connector_extra_config={"socket": socket}),
        kv_events_config=NS(enable_kv_cache_events=False))
    kv_cache_config = NS(num_blocks=NUM_BLOCKS,
                         kv_cache_tensors=[NS(size=NUM_BLOCKS * page) for _ in range(LAYERS)],
                         kv_cache_groups=[NS(kv_cache_spec=NS(block_size=TOKENS, page_size_bytes=page))])
    return vllm_config, kv_cache_config


def main() -> int:
    args = sys.argv[1:]
    if not 1 <= len(args) <= 3:
        print(__doc__.rsplit("usage: ", 1)[1], file=sys.stderr)
        return 2
    socket, rounds, seconds = args[0], int((args[1:2] or [5])[0]), float((args[2:3] or [1.0])[0])
    torch.set_num_threads(1)
    rn = Runner(seconds)

    spec = vllm.TensorcastOffloadingSpec(*configs(socket))
    m = spec.get_manager()
    caches = {f"layer.{i}": torch.randn((2, NUM_BLOCKS, TOKENS, HEADS, HEAD_DIM)).half() for i in range(LAYERS)}
    (_, _, store_h), (_, _, load_h) = list(spec.get_handlers(caches))
    peek = tensorcast.connect(socket, "bench-vllm")
    rows = vllm_worker.kv_block_tensors(caches)  # (NUM_BLOCKS, block bytes) views, as the handlers see them
    cpu = [torch.zeros_like(r) for r in rows]  # the reference's CPU cache, one slot per block, touched
    gpu = vllm_worker.GPULoadStoreSpec
    block_bytes = sum(r.shape[1] for r in rows)
    n = BATCH * block_bytes
    half = NUM_BLOCKS // 2

    def ids(i: int) -> List[int]:  # BATCH GPU blocks, moving through the first half
        lo = (i * BATCH) % (half - BATCH + 1)
        return list(range(lo, lo + BATCH))

    def keys(i: int) -> List[bytes]:
        return [b"bench-%d-%d" % (i, j) for j in range(BATCH)]

    def drop(i: int) -> None:
        peek.remove([m.store_key(k) for k in keys(i)])

    def job(h: object, spec_pair: tuple, job_id: int) -> None:
        assert h.transfer_async(job_id, spec_pair)  # type: ignore[attr-defined]
        (r,) = h.get_finished()  # type: ignore[attr-defined]
        assert r[1] if isinstance(r, tuple) else r.success, "a job failed"

    def store_whole(i: int) -> int:
        out = m.prepare_store(keys(i))
        job(store_h, (gpu(ids(i)), out.store_spec), i)
        m.complete_store(keys(i))
        return n

    warm(peek)
    stored = [b"bench-stored-%d" % j for j in range(BATCH)]
    first = m.prepare_store(stored)
    job(store_h, (gpu(ids(0)), first.store_spec), 0)
    m.complete_store(stored)
    try:  # the handlers' own mapping of the pool, populated as a long-running worker's is
        spec._handlers._client.pool._mm.madvise(23)  # MADV_POPULATE_WRITE (Linux 5.14)
    except (OSError, ValueError, AttributeError):
        pass

    def load_whole(i: int) -> int:
        spec_ = m.prepare_load(stored)
        job(load_h, (spec_, gpu([half + j for j in ids(i)])), i)
        m.complete_load(stored)
        return n

    def reference_store(i: int) -> int:
        slots = [(i * BATCH + j) % NUM_BLOCKS for j in range(BATCH)]
        for r, c in zip(rows, cpu):
            for g, slot in zip(ids(i), slots):
                c[slot].copy_(r[g])
        return n

    def reference_load(i: int) -> int:
        for r, c in zip(rows, cpu):
            for slot, g in zip(ids(0), ids(i)):
                r[half + g].copy_(c[slot])
        return n

    # The transfer alone: prepare and complete outside the clock.
    specs: dict = {}

    def t_store_prep(i: int) -> None:
        specs[i] = m.prepare_store(keys(i)).store_spec

    def t_store(i: int) -> int:
        job(store_h, (gpu(ids(i)), specs[i]), i)
        return n

    def t_store_done(i: int) -> None:
        m.complete_store(keys(i))
        drop(i)

    def t_load_prep(i: int) -> None:
        specs[i] = m.prepare_load(stored)

    def t_load(i: int) -> int:
        job(load_h, (specs[i], gpu([half + j for j in ids(i)])), i)
        return n

    def t_load_done(i: int) -> None:
        m.complete_load(stored)

    def alone(prep: Callable[[int], None], fn: Callable[[int], int], done: Callable[[int], None]) -> float:
        """fn's rate, prep(i) and done(i) untimed around each fn(i)."""
        def after(i: int) -> None:
            done(i)
            prep(i + 1)

        prep(-1)  # the runner's untimed first call
        return rn.rate(fn, after)

    cases = [
        ("store, handler transfer", lambda: alone(t_store_prep, t_store, t_store_done),
         lambda: rn.rate(reference_store)),
        ("load, handler transfer", lambda: alone(t_load_prep, t_load, t_load_done),
         lambda: rn.rate(reference_load)),
        ("store, with prepare/complete_store", lambda: rn.rate(store_whole, drop),
         lambda: rn.rate(reference_store)),
        ("load, with prepare/complete_load", lambda: rn.rate(load_whole),
         lambda: rn.rate(reference_load)),
    ]
    print(f"### vLLM-shaped blocks through the worker handlers ({BATCH} blocks of {block_bytes >> 10} KiB per job, "
          f"{LAYERS} layers, medians of {rounds})\n")
    print("| case | tensorcast GB/s | torch copy GB/s | ratio (goal >= 0.9x) |")
    print("| --- | --- | --- | --- |")
    for name, ours, ref in cases:
        a, b = [], []
        for _ in range(rounds):
            a.append(ours())
            b.append(ref())
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"| {name} | {ma / 1e9:.2f} | {mb / 1e9:.2f} | {ma / mb:.2f}x |")
    peek.remove([m.store_key(k) for k in stored])
    spec._handlers.shutdown()
    m.close()
    peek.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
