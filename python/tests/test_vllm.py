"""The vLLM integration through vLLM's scheduler-side order and its workers'
transfers, for each generation of vLLM's offloading interface (stand-in
modules on sys.path, see vllm_standins) and without vLLM at all, against
real daemons: the spec loaded by vLLM's factory from its module path,
blocks of two tensor-parallel ranks stored and loaded byte-exact, layouts
kept apart by their fingerprint, an outage answered with misses."""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
import time
import unittest
from types import ModuleType, SimpleNamespace as NS
from typing import Any, List, Optional, Tuple

import tensorcast
from tensorcast import Status

from . import vllm_standins
from .daemon import Daemon
from .test_core import DaemonCase

try:
    import torch
except ImportError:  # pragma: no cover - depends on the interpreter
    torch = None  # type: ignore[assignment]

NEEDS_TORCH = "torch is not installed for this interpreter (Debian: python3-torch)"

MODULE = "tensorcast.integrations.vllm"
GPU_TOKENS = 16
LAYERS, HEADS, HEAD_DIM = 2, 2, 8
NUM_BLOCKS = 16


def hashes(n: int, seed: int) -> List[bytes]:
    """n chained 32-byte block hashes, as vLLM's prefix caching makes them."""
    out, prev = [], seed.to_bytes(4, "little")
    for i in range(n):
        prev = hashlib.sha256(prev + i.to_bytes(4, "little")).digest()
        out.append(prev)
    return out


def configs(socket: str, *, world: int = 1, rank: int = 0, block_tokens: int = 32, dtype: Any = None,
            model: str = "test/model", durable: bool = False, mla: bool = False) -> Tuple[Any, Any]:
    """Stand-ins of vLLM's VllmConfig and KVCacheConfig for a model of
    LAYERS layers, HEADS KV heads per rank of HEAD_DIM, in GPU blocks of
    GPU_TOKENS tokens."""
    dtype = dtype or torch.float16
    esize = torch.empty((), dtype=dtype).element_size()
    page = 2 * GPU_TOKENS * HEADS * HEAD_DIM * esize  # one layer's K and V of one GPU block
    extra = {"spec_name": "TensorcastOffloadingSpec", "spec_module_path": MODULE, "socket": socket,
             "block_size": block_tokens, "retry_interval": 0, "durable": durable}
    vllm_config = NS(
        model_config=NS(model=model, revision=None, dtype=dtype, use_mla=mla,
                        get_num_layers=lambda pc: LAYERS, get_num_kv_heads=lambda pc: HEADS,
                        get_head_size=lambda: HEAD_DIM),
        cache_config=NS(block_size=GPU_TOKENS, cache_dtype="auto", prefix_caching_hash_algo="sha256"),
        parallel_config=NS(world_size=world, tensor_parallel_size=world, pipeline_parallel_size=1, rank=rank),
        kv_transfer_config=NS(kv_connector_extra_config=extra),
        kv_events_config=NS(enable_kv_cache_events=True))
    kv_cache_config = NS(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[NS(size=NUM_BLOCKS * page, shared_by=[f"layer.{i}"]) for i in range(LAYERS)],
        kv_cache_groups=[NS(kv_cache_spec=NS(block_size=GPU_TOKENS, page_size_bytes=page))])
    return vllm_config, kv_cache_config


def kv_caches(rank: int, dtype: Any = None) -> dict:
    """A worker's KV caches as vLLM's FlashAttention layout keeps them:
    per layer (2, num_blocks, tokens, heads, head_dim), K then V, every
    element distinct per rank."""
    dtype = dtype or torch.float16
    g = torch.Generator().manual_seed(rank)
    return {f"layer.{i}": torch.randn((2, NUM_BLOCKS, GPU_TOKENS, HEADS, HEAD_DIM), generator=g).to(dtype)
            for i in range(LAYERS)}


def blocks(caches: dict, ids: List[int]) -> List[bytes]:
    """The bytes of GPU blocks ids of every layer, K and V."""
    return [bytes(t[kv, i].contiguous().view(torch.uint8).numpy()) for t in caches.values() for kv in (0, 1)
            for i in ids]


def eventually(tc: unittest.TestCase, cond: Any, what: str, timeout: float = 10.0) -> None:
    """Waits until cond() holds (the daemon's background work), failing tc
    after timeout seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            tc.fail(f"not within {timeout:g} s: {what}")
        time.sleep(0.005)


def quiet_logger(name: str) -> logging.Logger:
    lg = logging.getLogger(name)
    lg.propagate = False
    lg.addHandler(logging.NullHandler())
    return lg


def canonical(caches: dict) -> Any:
    """vLLM's canonical KV caches of a worker's FlashAttention-layout caches:
    K and V of every layer, each (num_blocks, ...)."""
    import sys

    base = sys.modules.get("vllm.v1.kv_offload.base")
    tensors = [t[kv] for t in caches.values() for kv in (0, 1)]
    if base is None:
        return NS(tensors=[NS(tensor=t, page_size_bytes=t[0].numel() * t.element_size()) for t in tensors],
                  group_data_refs=[])
    return base.CanonicalKVCaches(
        tensors=[base.CanonicalKVCacheTensor(t, t[0].numel() * t.element_size()) for t in tensors],
        group_data_refs=[])


def offloading_config(socket: str, *, world: int = 1, rank: int = 0, block_tokens: int = 32, dtype: Any = None,
                      model: str = "test/model", durable: bool = False, mla: bool = False) -> Any:
    """vLLM's OffloadingConfig (0.26 on) of the same engine as configs()."""
    import importlib

    cfg = importlib.import_module("vllm.v1.kv_offload.config")
    vllm_config, kv_cache_config = configs(socket, world=world, rank=rank, block_tokens=block_tokens, dtype=dtype,
                                           model=model, durable=durable, mla=mla)
    page = kv_cache_config.kv_cache_groups[0].kv_cache_spec.page_size_bytes
    return cfg.OffloadingConfig(
        groups=(cfg.OffloadingGroupConfig(GPU_TOKENS, tuple(f"layer.{i}" for i in range(LAYERS))),),
        worker_kv_bytes_per_block=LAYERS * page, enable_kv_cache_events=True,
        extra_config=vllm_config.kv_transfer_config.kv_connector_extra_config, engine_id="engine-0",
        model=cfg.OffloadingModelConfig(model, str(dtype or torch.float16).replace("torch.", "")),
        cache=cfg.OffloadingCacheConfig(tokens_per_hash=GPU_TOKENS, blocks_per_chunk=block_tokens // GPU_TOKENS),
        parallel=cfg.OffloadingParallelConfig(rank, world, world, 1, 1, 1, 0, False), replicated_layout=mla)


class Engine:
    """One engine: the scheduler's spec and manager, and world workers,
    each with its spec, KV caches and offloading worker, built as the
    generation's vLLM builds them (without vLLM: the spec directly)."""

    def __init__(self, tv: ModuleType, gen: Optional[str], socket: str, world: int = 2, seeds: Any = None,
                 **kw: Any) -> None:
        self.tv = tv
        self.spec = self.create(gen, socket, world, 0, **kw)
        self.manager = self.spec.get_manager()
        self.caches, self.workers, self.specs = [], [], []
        for r in range(world):
            s = self.create(gen, socket, world, r, **kw)
            caches = kv_caches(seeds[r] if seeds else r, kw.get("dtype"))
            if gen in ("blocks", "keys"):  # handlers registered with vLLM's worker, by medium
                import importlib

                w = importlib.import_module("vllm.v1.kv_offload.worker.worker").OffloadingWorker()
                for src, dst, h in s.get_handlers(caches if gen == "blocks" else canonical(caches)):
                    w.register_handler(src, dst, h)
            else:  # one worker per spec
                w = s.get_worker(canonical(caches))
            self.caches.append(caches)
            self.workers.append(w)
            self.specs.append(s)

    @staticmethod
    def create(gen: Optional[str], socket: str, world: int, rank: int, **kw: Any) -> Any:
        import importlib

        if gen is None:
            from tensorcast.integrations import vllm

            return vllm.TensorcastOffloadingSpec(*configs(socket, world=world, rank=rank, **kw))
        factory = importlib.import_module("vllm.v1.kv_offload.factory").OffloadingSpecFactory
        if gen == "results":
            return factory.create_spec(offloading_config(socket, world=world, rank=rank, **kw))
        vllm_config, kv_cache_config = configs(socket, world=world, rank=rank, **kw)
        return factory.create_spec(vllm_config) if gen == "blocks" else factory.create_spec(vllm_config,
                                                                                            kv_cache_config)

    def transfer(self, job_id: int, spec: Tuple[Any, Any]) -> List[bool]:
        """Every worker's result of job job_id."""
        store = isinstance(spec[1], self.tv.TensorcastLoadStoreSpec)
        out = []
        for w in self.workers:
            if hasattr(w, "submit_store"):
                submitted = (w.submit_store if store else w.submit_load)(job_id, *spec)
            else:
                submitted = w.transfer_async(job_id, spec)
            assert submitted is True
            w.wait({job_id})
            res = [r for r in w.get_finished()]
            assert len(res) == 1, res
            r = res[0]
            job, ok = (r.job_id, r.success) if hasattr(r, "job_id") else r
            assert job == job_id
            out.append(ok)
        return out

    def close(self) -> None:
        self.manager.close()
        for s in self.specs:
            if s._handlers is not None:
                s._handlers.shutdown()


class _Generation:
    """The tests of one interface generation (GEN; None: no vLLM)."""

    GEN: Optional[str] = None
    daemon: Daemon
    root: Optional[str]
    tv: ModuleType

    @classmethod
    def setUpClass(cls) -> None:
        cls.root = vllm_standins.write(cls.GEN) if cls.GEN else None
        cls.tv = vllm_standins.load(cls.root)  # type: ignore[arg-type]
        cls.daemon = Daemon(pool_size="64MiB").start()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.daemon.close()
        vllm_standins.unload(cls.root)  # type: ignore[arg-type]

    # -- the generation's calls ------------------------------------------------

    def keys(self, n: int, seed: int) -> List[Any]:
        hs = hashes(n, seed)
        if self.tv.GENERATION == "blocks":
            return hs
        return [h + (0).to_bytes(4, "big") for h in hs]  # an OffloadKey of KV cache group 0

    def req(self, name: str) -> Any:
        import sys

        abstract = sys.modules.get("vllm.v1.kv_offload.abstract") or sys.modules.get("vllm.v1.kv_offload.base")
        if abstract is None or not hasattr(abstract, "ReqContext"):
            return NS(req_id=name, kv_transfer_params=None)
        try:
            return abstract.ReqContext(req_id=name)
        except TypeError:
            return abstract.ReqContext()

    def found(self, m: Any, keys: List[Any], req: Any) -> int:
        """How many leading blocks the scheduler finds offloaded: the old
        prefix lookup, or one lookup per block until a miss."""
        if self.tv.GENERATION == "blocks":
            return m.lookup(keys)
        n = 0
        for k in keys:
            if self.state(m, k, req) != "hit":
                break
            n += 1
        return n

    def state(self, m: Any, k: Any, req: Any) -> str:
        r = m.lookup(k, req)
        if self.tv.GENERATION == "keys":
            return {True: "hit", False: "miss", None: "pending"}[r]
        self.assertIsInstance(r, self.tv.LookupResult)
        return {"HIT": "hit", "MISS": "miss", "HIT_PENDING": "pending", "RETRY": "retry"}[r.name]

    def prepare_store(self, m: Any, keys: List[Any], req: Any) -> Tuple[List[Any], Any]:
        if self.tv.GENERATION == "blocks":
            out = m.prepare_store(keys)
            self.assertEqual(out.block_hashes_evicted, [])
            return out.block_hashes_to_store, out.store_spec
        out = m.prepare_store(keys, req)
        self.assertEqual(out.evicted_keys, [])
        return out.keys_to_store, out.store_spec

    def complete_store(self, m: Any, keys: List[Any], req: Any, success: bool = True) -> None:
        if self.tv.GENERATION == "results":
            m.complete_store(keys, req, success)
        else:
            m.complete_store(keys, success)

    def with_req(self, fn: Any, keys: List[Any], req: Any) -> Any:
        return fn(keys) if self.tv.GENERATION == "blocks" else fn(keys, req)

    def event_keys(self, e: Any) -> List[Any]:
        return e.block_hashes if self.tv.GENERATION == "blocks" else e.keys

    def gpu(self, ids: List[int]) -> Any:
        """vLLM's GPULoadStoreSpec of ids, one KV cache group."""
        from tensorcast.integrations import vllm_worker

        try:
            return vllm_worker.GPULoadStoreSpec(ids, [len(ids)], [0])
        except TypeError:  # the oldest: block ids only
            return vllm_worker.GPULoadStoreSpec(ids)

    # -- the tests ------------------------------------------------------------------

    def test_factory_loads_the_spec_by_module_path(self) -> None:
        self.assertEqual(self.tv.GENERATION, self.GEN or "results")
        e = Engine(self.tv, self.GEN, self.daemon.socket, world=1)
        self.addCleanup(e.close)
        self.assertIsInstance(e.spec, self.tv.TensorcastOffloadingSpec)
        self.assertIs(type(e.manager), self.tv.TensorcastOffloadingManager)
        if self.GEN:
            import sys

            abstract = sys.modules.get("vllm.v1.kv_offload.abstract") or sys.modules["vllm.v1.kv_offload.base"]
            spec_mod = sys.modules.get("vllm.v1.kv_offload.spec") or sys.modules["vllm.v1.kv_offload.base"]
            self.assertIsInstance(e.spec, spec_mod.OffloadingSpec)
            self.assertIsInstance(e.manager, abstract.OffloadingManager)
            self.assertTrue(issubclass(self.tv.TensorcastLoadStoreSpec, abstract.LoadStoreSpec))
        # One block: 32 tokens, two GPU blocks of 16 tokens of 2 layers' K and V.
        self.assertEqual(e.spec.block.factor, 2)
        self.assertEqual(e.spec.block.rank_bytes, 2 * LAYERS * 2 * GPU_TOKENS * HEADS * HEAD_DIM * 2)
        self.assertEqual(e.manager.block_size, e.spec.block.rank_bytes)

    def test_scheduler_order_and_workers_byte_exact(self) -> None:
        e = Engine(self.tv, self.GEN, self.daemon.socket, world=2)
        self.addCleanup(e.close)
        m = e.manager
        peek = tensorcast.connect(self.daemon.socket, "peek")
        self.addCleanup(peek.close)
        keys = self.keys(3, 1)
        req = self.req("r1")
        if self.tv.GENERATION != "blocks":
            on_new = m.on_new_request(req)
            if self.GEN == "results":
                self.assertEqual(on_new.policy.name, "CHUNK_LEVEL")
        self.assertEqual(self.found(m, keys, req), 0)
        stored, spec = self.prepare_store(m, keys[:2], req)
        self.assertEqual(stored, keys[:2])
        self.assertEqual(spec.medium(), "TENSORCAST")
        if self.tv.GENERATION != "blocks":
            self.assertEqual(self.state(m, keys[0], req), "pending")  # a store in flight
        else:
            self.assertEqual(m.lookup(keys), 0)
        # Both ranks write their part of the two blocks: GPU blocks 1-4.
        self.assertEqual(e.transfer(1, (self.gpu([1, 2, 3, 4]), spec)), [True, True])
        self.complete_store(m, keys[:2], req)
        self.assertEqual(self.found(m, keys, req), 2)
        self.assertEqual([(self.event_keys(ev), ev.removed, ev.medium) for ev in m.take_events()],
                         [(keys[:2], False, self.tv.EVENT_MEDIUM)])
        self.assertEqual(str(getattr(self.tv.EVENT_MEDIUM, "value", self.tv.EVENT_MEDIUM)),
                         "CPU" if self.GEN == "results" else "TENSORCAST")
        again, _ = self.prepare_store(m, keys, req)  # the stored ones are skipped
        self.assertEqual(again, keys[2:])
        self.complete_store(m, again, req, False)  # given back at once
        self.assertEqual(self.found(m, keys, req), 2)

        load = self.with_req(m.prepare_load, keys[:2], req)
        self.assertEqual(load.ok, [True, True])
        sk = m.store_key(keys[0])
        self.assertEqual(peek.stat(sk).pins, 1)  # protected until complete_load
        self.assertEqual(peek.remove([sk]), [Status.FAILED_PRECONDITION])
        for c in e.caches:
            for t in c.values():
                t[:, 8:12].zero_()
        self.assertEqual(e.transfer(2, (load, self.gpu([8, 9, 10, 11]))), [True, True])
        for c in e.caches:
            self.assertEqual(blocks(c, [8, 9, 10, 11]), blocks(c, [1, 2, 3, 4]))
        self.assertNotEqual(blocks(e.caches[0], [1]), blocks(e.caches[1], [1]))  # each rank its own part
        self.with_req(m.complete_load, keys[:2], req)
        self.assertEqual(peek.stat(sk).pins, 0)
        self.with_req(m.touch, keys, req)
        self.assertEqual(list(m.take_events()), [])
        if self.tv.GENERATION != "blocks":
            m.on_request_finished(req)
        self.assertEqual(peek.stats().store["reserved"], 0)

    def test_load_skips_the_gpu_blocks_the_engine_has(self) -> None:
        e = Engine(self.tv, self.GEN, self.daemon.socket, world=1)
        self.addCleanup(e.close)
        m, req = e.manager, self.req("r2")
        keys = self.keys(2, 2)
        _, spec = self.prepare_store(m, keys, req)
        self.assertEqual(e.transfer(1, (self.gpu([3, 0, 2, 1]), spec)), [True])  # GPU blocks anywhere
        self.complete_store(m, keys, req)
        load = self.with_req(m.prepare_load, keys, req)
        c = e.caches[0]
        for t in c.values():
            t[:, 9:12].zero_()
        # vLLM has the first GPU block of the first offloaded block: three to load.
        self.assertEqual(e.transfer(2, (load, self.gpu([9, 10, 11]))), [True])
        self.assertEqual(blocks(c, [9, 10, 11]), blocks(c, [0, 2, 1]))
        self.assertNotEqual(blocks(c, [9]), blocks(c, [10]))
        with self.assertLogs("tensorcast.integrations.vllm", logging.WARNING) as logs:
            self.assertEqual(e.transfer(3, (load, self.gpu([9]))), [False])  # more than one offloaded block short
        self.assertIn("1 GPU blocks for 2 offloaded blocks", logs.output[0])
        self.with_req(m.complete_load, keys, req)

    def test_block_on_l2_only_is_fetched_before_it_is_a_hit(self) -> None:
        # Stored durably, then the daemon restarted: both blocks on L2 only.
        d = Daemon(["--store-l2-size", "64MiB"]).start()
        self.addCleanup(d.close)
        e = Engine(self.tv, self.GEN, d.socket, world=1, durable=True)
        self.addCleanup(e.close)
        m, req = e.manager, self.req("r8")
        keys = self.keys(2, 8)
        if self.tv.GENERATION != "blocks":
            m.on_new_request(req)
        _, spec = self.prepare_store(m, keys, req)
        self.assertEqual(e.transfer(1, (self.gpu([0, 1, 2, 3]), spec)), [True])
        self.complete_store(m, keys, req)  # durable: on L2 once complete
        self.assertEqual(d.stop(), 0)
        d.start()
        peek = tensorcast.connect(d.socket, "peek")
        self.addCleanup(peek.close)
        sks = [m.store_key(k) for k in keys]
        self.assertEqual([(peek.stat(k).in_l1, peek.stat(k).in_l2) for k in sks], [(False, True)] * 2)
        if self.tv.GENERATION == "blocks":
            m.lookup(keys)  # the old connection's failure: the manager dials the new daemon
            self.assertEqual(m.lookup(keys), 2)  # found; the load's get waits for L2
        else:
            self.state(m, keys[0], req)  # the old connection's failure: the manager dials the new daemon
            # The scheduler's scan: every block's fetch starts in the same
            # step, and it asks again while the manager has work pending.
            waiting = "retry" if self.tv.GENERATION == "results" else "pending"
            self.assertEqual([self.state(m, k, req) for k in keys], [waiting, waiting])
            self.assertTrue(m.has_pending_work())
            eventually(self, lambda: not m.has_pending_work(), "the fetches from L2")
            self.assertEqual([(peek.stat(k).in_l1, peek.stat(k).pins) for k in sks], [(True, 0)] * 2)
            self.assertEqual([self.state(m, k, req) for k in keys], ["hit", "hit"])
        load = self.with_req(m.prepare_load, keys, req)
        self.assertEqual(load.ok, [True, True])
        c = e.caches[0]
        for t in c.values():
            t[:, 8:12].zero_()
        self.assertEqual(e.transfer(2, (load, self.gpu([8, 9, 10, 11]))), [True])
        self.assertEqual(blocks(c, [8, 9, 10, 11]), blocks(c, [0, 1, 2, 3]))
        self.with_req(m.complete_load, keys, req)
        if self.tv.GENERATION != "blocks":
            m.on_request_finished(req)
        self.assertEqual([peek.stat(k).pins for k in sks], [0, 0])

    def test_mla_one_copy_written_by_rank_0(self) -> None:
        if self.tv.GENERATION == "blocks":  # built from the model alone: MLA's bytes per block are not known
            with self.assertRaisesRegex(ValueError, "MLA model needs the KV cache config"):
                Engine(self.tv, self.GEN, self.daemon.socket, world=2, mla=True)
            return
        # Every rank holds the same latent KV; rank 1's tensors differ here
        # only so that a copy it made would show.
        e = Engine(self.tv, self.GEN, self.daemon.socket, world=2, mla=True, seeds=[10, 11])
        self.addCleanup(e.close)
        rank_bytes = 2 * LAYERS * 2 * GPU_TOKENS * HEADS * HEAD_DIM * 2
        self.assertTrue(e.spec.block.replicated)
        self.assertEqual(e.manager.block_size, rank_bytes)  # one copy, not one per rank
        mha = Engine(self.tv, self.GEN, self.daemon.socket, world=2)
        self.addCleanup(mha.close)
        self.assertNotEqual(e.spec.block.fingerprint, mha.spec.block.fingerprint)
        m, req = e.manager, self.req("r9")
        keys = self.keys(2, 9)
        m.on_new_request(req)
        _, spec = self.prepare_store(m, keys, req)
        self.assertEqual(spec.lengths, [rank_bytes] * 2)
        self.assertEqual(e.transfer(1, (self.gpu([0, 1, 2, 3]), spec)), [True, True])
        self.complete_store(m, keys, req)
        load = self.with_req(m.prepare_load, keys, req)
        # Both ranks load rank 0's copy (had rank 1 written its own, rank
        # 1 would get its own blocks back).
        for caches in e.caches:
            for t in caches.values():
                t[:, 8:12].zero_()
        self.assertEqual(e.transfer(2, (load, self.gpu([8, 9, 10, 11]))), [True, True])
        for caches in e.caches:
            self.assertEqual(blocks(caches, [8, 9, 10, 11]), blocks(e.caches[0], [0, 1, 2, 3]))
        self.with_req(m.complete_load, keys, req)
        m.on_request_finished(req)

    def test_another_layout_is_a_miss(self) -> None:
        e = Engine(self.tv, self.GEN, self.daemon.socket, world=1)
        self.addCleanup(e.close)
        keys, req = self.keys(2, 3), self.req("r3")
        _, spec = self.prepare_store(e.manager, keys, req)
        self.assertEqual(e.transfer(1, (self.gpu([0, 1, 2, 3]), spec)), [True])
        self.complete_store(e.manager, keys, req)
        same = Engine(self.tv, self.GEN, self.daemon.socket, world=1)
        self.addCleanup(same.close)
        self.assertEqual(self.found(same.manager, keys, req), 2)
        for kw in ({"dtype": torch.bfloat16}, {"model": "test/other"}, {"block_tokens": 16}):
            other = Engine(self.tv, self.GEN, self.daemon.socket, world=1, **kw)
            self.addCleanup(other.close)
            self.assertEqual(self.found(other.manager, keys, req), 0, kw)
            self.assertNotEqual(other.manager.store_key(keys[0]), e.manager.store_key(keys[0]))


@unittest.skipIf(torch is None, NEEDS_TORCH)
class TestBlocksInterface(_Generation, unittest.TestCase):
    GEN = "blocks"


@unittest.skipIf(torch is None, NEEDS_TORCH)
class TestKeysInterface(_Generation, unittest.TestCase):
    GEN = "keys"


@unittest.skipIf(torch is None, NEEDS_TORCH)
class TestResultsInterface(_Generation, unittest.TestCase):
    GEN = "results"


@unittest.skipIf(torch is None, NEEDS_TORCH)
class TestWithoutVLLM(_Generation, unittest.TestCase):
    GEN = None

    def test_outage_is_a_miss_logged_once(self) -> None:
        # DRAM only: what the writeback may have put on L2 before the kill
        # would survive the restart, and the lookup after it would race it.
        d = Daemon(["--store-l2-path", "off"]).start()
        self.addCleanup(d.close)
        tv = self.tv
        from tensorcast.integrations import vllm_worker

        vcfg, kcfg = configs(d.socket)
        block = tv.block_layout(vcfg, kcfg)
        lg = logging.getLogger("test.vllm.outage")
        wlg = quiet_logger("test.vllm.outage.worker")
        m = tv.TensorcastOffloadingManager(block.value_bytes, fingerprint=block.fingerprint, socket=d.socket,
                                           retry_interval=0, logger=lg)
        self.addCleanup(m.close)
        caches = kv_caches(0)
        h = vllm_worker.Handlers(caches, block, socket=d.socket, retry_interval=0, logger=wlg)
        self.addCleanup(h.shutdown)
        keys, req = self.keys(2, 4), self.req("r4")

        def job(handler: Any, job_id: int, spec: Any) -> bool:
            self.assertTrue(handler.transfer_async(job_id, spec))
            (r,) = handler.get_finished()
            self.assertEqual(r[0], job_id)
            return r[1]

        _, spec = self.prepare_store(m, keys, req)
        self.assertTrue(job(h.store, 1, (self.gpu([0, 1, 2, 3]), spec)))
        self.complete_store(m, keys, req)
        load = m.prepare_load(keys, req)
        d.kill()
        with self.assertLogs(lg, logging.DEBUG) as logs:
            self.assertEqual(self.state(m, keys[0], req), "miss")
            m.complete_load(keys, req)  # the pins went with the connection: quiet
            self.assertIsNone(m.prepare_store(self.keys(1, 5), req))
            self.assertEqual(m.prepare_load(keys, req).ok, [False, False])
            m.touch(keys, req)
            self.assertEqual(list(m.take_events()), [])
            # The values the load pinned stay whole in the worker's mapping.
            self.assertTrue(job(h.load, 2, (load, self.gpu([8, 9, 10, 11]))))
            self.assertEqual(blocks(caches, [8, 9, 10, 11]), blocks(caches, [0, 1, 2, 3]))
            d.start()
            self.assertEqual(self.state(m, keys[0], req), "miss")  # a new daemon, with nothing kept
            stored, spec = self.prepare_store(m, keys, req)
            self.assertEqual(stored, keys)
            # The worker dials the new daemon, whose pool the spec names.
            self.assertTrue(job(h.store, 3, (self.gpu([4, 5, 6, 7]), spec)))
            self.complete_store(m, keys, req)
        warnings = [r for r in logs.records if r.levelno >= logging.WARNING]
        self.assertEqual(len(warnings), 1, [r.getMessage() for r in warnings])
        self.assertTrue(any("reconnected" in r.getMessage() for r in logs.records))
        # A spec of the old daemon's pool, which the worker maps no more: failed.
        dials = h._link.counts["dials"]
        with self.assertLogs(wlg, logging.WARNING) as wlogs:
            self.assertFalse(job(h.load, 4, (load, self.gpu([8, 9, 10, 11]))))
            self.assertFalse(job(h.load, 5, (load, self.gpu([8, 9, 10, 11]))))
        self.assertEqual(len(wlogs.records), 1, wlogs.output)
        self.assertEqual(h._link.counts["dials"], dials)  # its live connection kept
        self.assertEqual(self.found(m, keys, req), 2)
        load = m.prepare_load(keys, req)
        for t in caches.values():
            t[:, 8:12].zero_()
        self.assertTrue(job(h.load, 6, (load, self.gpu([8, 9, 10, 11]))))
        self.assertEqual(blocks(caches, [8, 9, 10, 11]), blocks(caches, [4, 5, 6, 7]))
        m.complete_load(keys, req)

    def test_value_corrupt_on_l2_is_a_miss(self) -> None:
        d = Daemon(["--store-l2-size", "64MiB"]).start()
        self.addCleanup(d.close)
        tv = self.tv
        from tensorcast.integrations import vllm_worker

        block = tv.block_layout(*configs(d.socket))
        lg = quiet_logger("test.vllm.l2")
        m = tv.TensorcastOffloadingManager(block.value_bytes, fingerprint=block.fingerprint, socket=d.socket,
                                           durable=True, retry_interval=0, logger=lg)
        self.addCleanup(m.close)
        caches = kv_caches(0)
        h = vllm_worker.Handlers(caches, block, socket=d.socket, retry_interval=0, logger=lg)
        self.addCleanup(h.shutdown)
        keys, req = self.keys(2, 7), self.req("r7")
        _, spec = self.prepare_store(m, keys, req)
        self.assertTrue(h.store.transfer_async(1, (self.gpu([0, 1, 2, 3]), spec)))
        self.assertEqual(h.store.get_finished(), [(1, True)])
        self.complete_store(m, keys, req)  # durable: on L2 once complete
        self.assertEqual(d.stop(), 0)
        # One byte of the first block's value flipped on L2; after the
        # restart the values are on L2 only, read back (and checked) on a get.
        with open(os.path.join(d.data, "store.l2"), "r+b") as f, mmap.mmap(f.fileno(), 0) as l2:
            at = l2.find(blocks(caches, [0])[0][:64])
            self.assertGreaterEqual(at, 0)
            l2[at + 10] ^= 0xFF
        d.start()
        self.state(m, keys[0], req)  # the old connection's failure: the manager dials the new daemon
        # Both indexed from L2: fetched first, and the corrupt one is
        # dropped when its fetch reads it.
        self.assertEqual([self.state(m, k, req) for k in keys], ["retry", "retry"])
        eventually(self, lambda: not m.has_pending_work(), "the fetches from L2")
        self.assertEqual([self.state(m, k, req) for k in keys], ["miss", "hit"])
        # A scheduler that loads without asking again: the corrupt block is
        # missing from the load, which fails; no byte reaches the engine.
        for t in caches.values():
            t[:, 8:12].zero_()
        load = m.prepare_load(keys, req)
        self.assertEqual(load.ok, [False, True])  # the daemon dropped the corrupt value
        self.assertTrue(h.load.transfer_async(2, (load, self.gpu([8, 9, 10, 11]))))
        self.assertEqual(h.load.get_finished(), [(2, False)])
        self.assertEqual(blocks(caches, [8, 9, 10, 11]), [bytes(len(b)) for b in blocks(caches, [8, 9, 10, 11])])
        m.complete_load(keys, req)
        self.assertEqual([self.state(m, k, req) for k in keys], ["miss", "hit"])

    @unittest.skipUnless(torch is not None and torch.cuda.is_available(),
                         "no CUDA device (torch.cuda.is_available() is False): the handlers' CUDA path is not run")
    def test_cuda_blocks_both_ways_on_the_handlers_stream(self) -> None:
        # The worker's KV caches on the GPU: the pool mapping is registered
        # with the CUDA runtime (page-locked, so the copies are DMA), a job
        # runs on the handlers' own stream and is finished when its event
        # has passed.
        tv = self.tv
        from tensorcast.integrations import vllm_worker

        block = tv.block_layout(*configs(self.daemon.socket))
        lg = quiet_logger("test.vllm.cuda")
        m = tv.TensorcastOffloadingManager(block.value_bytes, fingerprint=block.fingerprint,
                                           socket=self.daemon.socket, retry_interval=0, logger=lg)
        self.addCleanup(m.close)
        caches = {k: t.cuda() for k, t in kv_caches(0).items()}
        h = vllm_worker.Handlers(caches, block, socket=self.daemon.socket, retry_interval=0, logger=lg)
        self.addCleanup(h.shutdown)
        self.assertTrue(h.cuda)
        keys, req = self.keys(2, 9), self.req("r9")
        _, spec = self.prepare_store(m, keys, req)
        self.assertTrue(h.store.transfer_async(1, (self.gpu([0, 1, 2, 3]), spec)))
        h.store.wait({1})
        self.assertEqual(h.store.get_finished(), [(1, True)])
        self.assertIsNotNone(h._registered)  # cudaHostRegister took the pool
        self.complete_store(m, keys, req)
        for t in caches.values():
            t[:, 8:12].zero_()
        load = m.prepare_load(keys, req)
        self.assertTrue(h.load.transfer_async(2, (load, self.gpu([8, 9, 10, 11]))))
        h.load.wait({2})
        self.assertEqual(h.load.get_finished(), [(2, True)])
        host = {k: t.cpu() for k, t in caches.items()}
        self.assertEqual(blocks(host, [8, 9, 10, 11]), blocks(host, [0, 1, 2, 3]))
        m.complete_load(keys, req)

    def test_failed_store_is_given_back(self) -> None:
        e = Engine(self.tv, self.GEN, self.daemon.socket, world=1)
        self.addCleanup(e.close)
        m, req = e.manager, self.req("r5")
        peek = tensorcast.connect(self.daemon.socket, "peek")
        self.addCleanup(peek.close)
        lost = self.keys(2, 6)
        before = peek.stats().store["aborted"]
        self.prepare_store(m, lost, req)
        self.assertEqual(peek.stats().store["reserved"], 2)
        self.complete_store(m, lost, req, False)
        self.assertEqual(peek.stats().store["reserved"], 0)
        self.assertEqual(peek.stats().store["aborted"] - before, 2)
        self.assertEqual(m.abandoned, 0)
        self.assertEqual(self.state(m, lost[0], req), "miss")
        again, _ = self.prepare_store(m, lost, req)  # the keys are free again
        self.assertEqual(again, lost)
        self.complete_store(m, lost, req)
        self.assertEqual(self.found(m, lost, req), 2)

    def test_worker_refuses_what_does_not_fit(self) -> None:
        tv = self.tv
        from tensorcast.integrations import vllm_worker

        vcfg, kcfg = configs(self.daemon.socket)
        block = tv.block_layout(vcfg, kcfg)
        with self.assertRaises(ValueError):  # more bytes per block than the scheduler's layout
            vllm_worker.Handlers({"x": torch.zeros((NUM_BLOCKS, 1 << 16), dtype=torch.uint8)}, block,
                                 socket=self.daemon.socket)
        with self.assertRaises(ValueError):
            vllm_worker.Handlers(kv_caches(0), block, rank=1, socket=self.daemon.socket)
        with self.assertRaises(ValueError):  # a block size that is not whole GPU blocks
            tv.block_layout(*configs(self.daemon.socket, block_tokens=24))


class _SwapLink:
    """A link for a manager, whose connection the test swaps as another
    thread would: hook runs inside the next client(), after the client it
    answers was taken."""

    def __init__(self, c: tensorcast.Client) -> None:
        self.c = c
        self.hook: Any = None
        self.errors: List[Any] = []

    def client(self) -> tensorcast.Client:
        c = self.c
        h, self.hook = self.hook, None
        if h is not None:
            h()
        return c

    def failed(self, what: str, err: BaseException, client: Any = None) -> None:
        self.errors.append((what, err))

    def reset(self) -> None:
        pass

    def close(self) -> None:
        pass


class TestManagerSwappedConnection(DaemonCase):
    """Pins and reservations are given back on the connection they were
    taken on, whatever connection the link has meanwhile."""

    def manager(self) -> Tuple[Any, _SwapLink, tensorcast.Client, tensorcast.Client]:
        from tensorcast.integrations import vllm

        old, new = self.connect(), self.connect()
        m = vllm._Manager(256, socket=self.daemon.socket, key_prefix=b"swap/")
        self.addCleanup(m.close)
        link = _SwapLink(old)
        m._link = link
        return m, link, old, new

    def test_a_load_taken_on_a_connection_swapped_out_before_it_is_recorded(self) -> None:
        m, link, old, new = self.manager()
        a = m.store_key(b"a")
        self.assertEqual(old.put([a], [b"v" * 256]), [Status.OK])
        real = old.get_locations

        def then_swap(keys: Any) -> Any:
            loc = real(keys)
            link.c = new  # another thread's call takes the new connection
            m._conn()
            return loc

        old.get_locations = then_swap  # type: ignore[method-assign]
        self.assertEqual(m._prepare_load([b"a"]).ok, [True])
        self.assertEqual(old.stat(a).pins, 1)
        m._complete_load([b"a"])
        self.assertEqual(old.stat(a).pins, 0)  # on old, still open
        self.assertEqual(link.errors, [])

    def test_a_stale_client_does_not_drop_the_new_connections_records(self) -> None:
        m, link, old, new = self.manager()
        b = m.store_key(b"b")
        self.assertEqual(new.put([b], [b"v" * 256]), [Status.OK])

        def swap() -> None:
            # The link drops old and dials new; another thread loads on it,
            # before this thread, which got old, goes on.
            link.c = new
            old.close()
            self.assertEqual(m._prepare_load([b"b"]).ok, [True])

        link.hook = swap
        self.assertEqual(m._prepare_load([b"a"]).ok, [False])  # old is closed
        self.assertEqual(new.stat(b).pins, 1)
        m._complete_load([b"b"])
        self.assertEqual(new.stat(b).pins, 0)

    def test_a_store_reserved_on_a_connection_swapped_out_before_it_is_recorded(self) -> None:
        m, link, old, new = self.manager()
        s = m.store_key(b"s")
        real = old.reserve

        def then_swap(keys: Any, sizes: Any) -> Any:
            r = real(keys, sizes)
            link.c = new
            m._conn()
            return r

        old.reserve = then_swap  # type: ignore[method-assign]
        before = new.stats().store["reserved"]
        got = m._prepare_store([b"s"])
        self.assertIsNotNone(got)
        self.assertEqual(got[0], [b"s"])  # type: ignore[index]
        self.assertEqual(new.stats().store["reserved"], before + 1)
        m._complete_store([b"s"], True)
        self.assertEqual(new.exists([s]), [True])  # committed on old
        self.assertEqual(new.stats().store["reserved"], before)


if __name__ == "__main__":
    unittest.main()
