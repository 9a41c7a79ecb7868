"""The SGLang-shaped integration through its engine's call sequences,
without the engine: doubles of its host pools (page-first torch tensors),
against real daemons, including one killed and restarted mid-sequence.
The vLLM integration's tests are in test_vllm."""

from __future__ import annotations

import hashlib
import logging
import os
import unittest
from typing import Any, List, Optional
from unittest import mock

import tensorcast
from tensorcast import Status

from .daemon import Daemon
from .test_core import pattern


try:
    import torch
except ImportError:  # pragma: no cover - depends on the interpreter
    torch = None  # type: ignore[assignment]

if torch is not None:
    from tensorcast.integrations import sglang

    from .doubles import MHAHostPool, MLAHostPool, StorageConfig

NEEDS_TORCH = "torch is not installed for this interpreter (Debian: python3-torch)"


def chain(n: int, seed: int = 0) -> List[str]:
    """n chained page keys as SGLang makes them: sha256 of the previous
    hash and the page's token ids, in hex."""
    out, prev = [], b""
    for i in range(n):
        h = hashlib.sha256(prev)
        for t in range(4):
            h.update((seed * 1000 + i * 4 + t).to_bytes(4, "little"))
        prev = h.digest()
        out.append(h.hexdigest())
    return out


def quiet_logger(name: str) -> logging.Logger:
    lg = logging.getLogger(name)
    lg.propagate = False
    lg.addHandler(logging.NullHandler())
    return lg


@unittest.skipIf(torch is None, NEEDS_TORCH)
class TestSGLang(unittest.TestCase):
    daemon: Daemon

    @classmethod
    def setUpClass(cls) -> None:
        cls.daemon = Daemon(pool_size="64MiB").start()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.daemon.close()

    def backend(self, pool: Any, cfg: Optional[StorageConfig] = None, **kw: Any) -> "sglang.TensorcastStore":
        b = sglang.TensorcastStore(cfg or StorageConfig(), socket=self.daemon.socket,
                                   logger=quiet_logger("test.sglang"), **kw)
        b.register_mem_pool_host(pool)
        self.addCleanup(b.close)
        return b

    def hicache_sequence(self, pool: Any, b: Any, seed: int) -> None:
        """What HiCache does: back pages up after checking what is there,
        then, for a request sharing the prefix, count the pages present and
        prefetch them into other slots of the host pool."""
        keys = chain(8, seed)
        for slot in range(8):
            pool.fill(slot, seed * 100 + slot)
        self.assertEqual(b.batch_exists(keys), 0)
        self.assertEqual(b.batch_set_v1(keys, pool.indices(0, 8)), [True] * 8)
        self.assertEqual(b.batch_exists(keys), 8)
        self.assertEqual(b.batch_exists(keys[:3] + ["not-stored"] + keys[3:]), 3)
        self.assertEqual(b.batch_set_v1(keys[:2], pool.indices(0, 2)), [True, True])  # stored already: fine
        got = b.batch_get_v1(keys, pool.indices(8, 8))
        self.assertEqual(got, [True] * 8)
        for i in range(8):
            self.assertEqual(pool.page(8 + i), pool.page(i), f"page {i}")
        self.assertEqual(b.batch_get_v1([keys[0], "not-stored", keys[2]], pool.indices(8, 3)), [True, False, True])
        self.assertTrue(b.exists(keys[5]))
        self.assertFalse(b.exists("not-stored"))

    def test_direct_mode_copies_nothing_here(self) -> None:
        alloc = sglang.HostAllocator()
        pool = MHAHostPool(allocator=alloc)
        self.assertEqual(tuple(pool.kv_buffer.shape), (2, 64, 2, 2, 64))
        self.assertEqual(pool.kv_buffer.dtype, torch.bfloat16)
        self.assertEqual((alloc.dims, alloc.dtype), ((2, 64, 2, 2, 64), torch.bfloat16))
        self.assertTrue(os.readlink(f"/proc/self/fd/{alloc.regions[0].fd}").startswith("/memfd:"))
        b = self.backend(pool)
        self.assertTrue(b.direct)
        # Every page moves by the daemon's copy between the store and the
        # host pool's own memory: this process copies nothing.
        with mock.patch.object(tensorcast.Client, "put_addresses", side_effect=AssertionError("a client copy")), \
                mock.patch.object(tensorcast.Client, "get_addresses", side_effect=AssertionError("a client copy")):
            self.hicache_sequence(pool, b, 1)
        self.assertEqual(b.counters["pages_set"], 10)

    def test_copy_mode_without_the_allocator(self) -> None:
        pool = MHAHostPool()
        b = self.backend(pool)
        self.assertFalse(b.direct)
        with mock.patch.object(tensorcast.Client, "store_put", side_effect=AssertionError("not direct")):
            self.hicache_sequence(pool, b, 2)

    def test_mla_pool_and_tp_ranks(self) -> None:
        pool = MLAHostPool(allocator=sglang.HostAllocator())
        b = self.backend(pool, StorageConfig(is_mla_model=True))
        self.assertEqual(b._parts, 1)
        self.hicache_sequence(pool, b, 3)
        # MHA ranks hold different heads: their keys differ by rank.
        p0, p1 = MHAHostPool(), MHAHostPool()
        r0 = self.backend(p0, StorageConfig(tp_rank=0, tp_size=2))
        r1 = self.backend(p1, StorageConfig(tp_rank=1, tp_size=2))
        keys = chain(2, 4)
        p0.fill(0, 1)
        p0.fill(1, 2)
        self.assertEqual(r0.batch_set_v1(keys, p0.indices(0, 2)), [True, True])
        self.assertEqual(r0.batch_exists(keys), 2)
        self.assertEqual(r1.batch_exists(keys), 0)

    def test_older_calls(self) -> None:
        pool = MHAHostPool()
        b = self.backend(pool)
        t = torch.arange(64, dtype=torch.float32)
        self.assertTrue(b.set("old/0", t))
        out = torch.zeros(64, dtype=torch.float32)
        self.assertIs(b.get("old/0", out), out)
        self.assertTrue(torch.equal(out, t))
        self.assertIsNone(b.get("old/none", torch.zeros(64)))
        self.assertTrue(b.batch_set(["old/1", "old/2"], [t, t + 1]))
        outs = [torch.zeros(64), torch.zeros(64), torch.zeros(64)]
        got = b.batch_get(["old/1", "old/none", "old/2"], outs)
        self.assertIs(got[0], outs[0])
        self.assertIsNone(got[1])
        self.assertTrue(torch.equal(got[2], t + 1))
        # Raw memory: the count of leading keys read.
        dst = torch.zeros(3, 64)
        n = b.batch_get(["old/1", "old/2", "old/none"], [dst[i].data_ptr() for i in range(3)], [256] * 3)
        self.assertEqual(n, 2)
        self.assertTrue(torch.equal(dst[1], t + 1))
        b.clear()
        self.assertFalse(b.exists("old/1"))
        self.assertIsNone(b.get_stats())

    def test_a_pool_that_does_not_fit_is_a_miss_logged_once(self) -> None:
        pool = MHAHostPool()
        lg = logging.getLogger("test.sglang.layout")
        b = sglang.TensorcastStore(StorageConfig(), socket=self.daemon.socket, logger=lg)
        self.addCleanup(b.close)
        b.register_mem_pool_host(pool)
        keys = chain(2, 6)
        with self.assertLogs(lg, logging.WARNING) as logs:
            # Indices of three pages for two keys: not a layout the backend
            # can map, a miss for every page (and no exception).
            self.assertEqual(b.batch_set_v1(keys, pool.indices(0, 3)), [False, False])
            self.assertEqual(b.batch_set_v1(keys, pool.indices(0, 3)), [False, False])
        self.assertEqual(len(logs.records), 1)
        self.assertEqual(b.batch_set_v1(keys, pool.indices(0, 2)), [True, True])  # the connection stayed
        self.assertEqual(b._link.counts["outages"], 0)

    def test_daemon_killed_and_restarted_mid_sequence(self) -> None:
        d = Daemon().start()
        self.addCleanup(d.close)
        alloc = sglang.HostAllocator()
        pool = MHAHostPool(allocator=alloc)
        lg = logging.getLogger("test.sglang.failures")
        b = sglang.TensorcastStore(StorageConfig(), socket=d.socket, retry_interval=0, logger=lg)
        self.addCleanup(b.close)
        b.register_mem_pool_host(pool)
        keys = chain(4, 5)
        for slot in range(4):
            pool.fill(slot, 500 + slot)
        self.assertEqual(b.batch_set_v1(keys[:2], pool.indices(0, 2)), [True, True])
        first_segment = alloc.regions[0].segment
        d.kill()
        with self.assertLogs(lg, logging.DEBUG) as logs:
            # Every call answers a miss; none raises (an exception here would
            # end HiCache's prefetch thread for good).
            self.assertEqual(b.batch_exists(keys), 0)
            self.assertEqual(b.batch_set_v1(keys, pool.indices(0, 4)), [False] * 4)
            self.assertEqual(b.batch_get_v1(keys, pool.indices(4, 4)), [False] * 4)
            self.assertFalse(b.exists(keys[0]))
            self.assertIsNone(b.get(keys[0], torch.zeros(4)))
            self.assertEqual(b.batch_exists(keys), 0)
            d.start()
            self.assertEqual(b.batch_set_v1(keys, pool.indices(0, 4)), [True] * 4)
        warnings = [r for r in logs.records if r.levelno >= logging.WARNING]
        self.assertEqual(len(warnings), 1, [r.getMessage() for r in warnings])  # the outage, once
        self.assertTrue(any("reconnected" in r.getMessage() for r in logs.records))
        # The host pool was registered again with the new connection: still
        # direct.
        self.assertNotEqual(alloc.regions[0].segment, None)
        self.assertIsNot(alloc.regions[0].client, None)
        with mock.patch.object(tensorcast.Client, "get_addresses", side_effect=AssertionError("a client copy")):
            self.assertEqual(b.batch_get_v1(keys, pool.indices(4, 4)), [True] * 4)
        for i in range(4):
            self.assertEqual(pool.page(4 + i), pool.page(i))
        self.assertGreaterEqual(b._link.counts["outages"], 1)
        del first_segment


if __name__ == "__main__":
    unittest.main()
