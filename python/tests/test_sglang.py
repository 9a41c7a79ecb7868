"""The SGLang backend through SGLang's call sequences (tests/sglang_doubles.py):
the controller backing up pages in batches of 128 and prefetching them into
other host slots, byte-exact, for MHA and MLA pools in the three layouts,
through either interface, copied or direct; the v2 calls with sidecar pools
and both hit policies; the factory's dynamic construction against a
stand-in SGLang; keys bound to layout and ranks; a daemon killed mid-way."""

from __future__ import annotations

import importlib
import logging
import os
import sys
import time
import unittest
from pathlib import Path
from typing import Any, Iterator, List, Optional
from unittest import mock

import tensorcast

from .daemon import Daemon
from .engines import chain, quiet_logger as quiet

try:
    import torch
except ImportError:  # pragma: no cover - depends on the interpreter
    torch = None  # type: ignore[assignment]

if torch is not None:
    from tensorcast.integrations import sglang

    from .sglang_doubles import (
        Controller,
        HiCacheStorageConfig,
        HostPool,
        MambaHostPool,
        PoolHitPolicy,
        PoolName,
        PoolTransfer,
        ShmAllocator,
        create_dynamic_backend,
    )

NEEDS_TORCH = "torch is not installed for this interpreter (Debian: python3-torch)"
STANDIN = Path(__file__).resolve().parent / "standin"
LAYOUTS = ("page_first", "layer_first", "page_first_direct")
PAGES = 300  # three storage batches: 128, 128, 44


def config(**kw: Any) -> "HiCacheStorageConfig":
    return HiCacheStorageConfig(**kw)


@unittest.skipIf(torch is None, NEEDS_TORCH)
class SGLangCase(unittest.TestCase):
    daemon: Daemon

    @classmethod
    def setUpClass(cls) -> None:
        cls.daemon = Daemon(["--store-l2-path", "off"], pool_size="128MiB").start()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.daemon.close()

    def backend(self, pool: Any = None, cfg: Optional["HiCacheStorageConfig"] = None, **kw: Any) -> Any:
        b = sglang.TensorcastStore(cfg or config(), {"socket": self.daemon.socket}, logger=quiet("test.sglang"), **kw)
        self.addCleanup(b.close)
        if pool is not None:
            b.register_mem_pool_host(pool)
        return b

    def controller(self, b: Any, pool: Any, v1: bool, **kw: Any) -> "Controller":
        ctl = Controller(b, pool, v1, **kw)
        self.addCleanup(ctl.close)
        return ctl

    def round_trip(self, ctl: "Controller", pool: "HostPool", seed: int, pages: int = PAGES,
                   writer: Optional["Controller"] = None) -> None:
        """Backs pages up from slots 0.. (by writer's controller, default
        ctl), then prefetches them with ctl into other slots, in another
        order, and checks every byte."""
        hashes = chain(pages, seed)
        for s in range(pages):
            pool.fill(s, seed * 1000 + s)
        before = ctl.prefetch(hashes)
        self.assertEqual(before.hit_hashes, [])
        done = (writer or ctl).write_storage(hashes, pool.indices(range(pages)))
        assert done is not None
        self.assertEqual(done.completed_tokens, pages * pool.page_size)
        op = ctl.prefetch(hashes + chain(3, seed + 1))  # a request sharing the prefix, then new pages
        self.assertEqual(op.hit_hashes, hashes)
        slots = list(range(2 * pages - 1, pages - 1, -1))  # other slots, reversed
        got = ctl.load(op, pool.indices(slots))
        assert got is not None
        self.assertEqual(got.completed_pages, pages)
        for i, s in enumerate(slots):
            if pool.page(s) != pool.page(i):
                self.fail(f"page {i} differs after the round trip (slot {s})")


if torch is not None:
    class SwappedHostPool(HostPool):
        """An MHA pool in page_first layout whose pages named in swap (by
        page number) lie in each other's place."""

        def __init__(self, swap: Optional[dict] = None, **kw: Any) -> None:
            super().__init__("mha", "page_first", **kw)
            self.swap = {2: 3, 3: 2} if swap is None else swap

        def _page(self, index: int) -> "torch.Tensor":
            ps = self.page_size
            q = self.swap.get(index // ps, index // ps)
            return super()._page(q * ps + index % ps)


class TestControllerSequence(SGLangCase):
    """The controller's backup and prefetch, every layout, MHA and MLA,
    both interfaces, copied and direct."""

    def cases(self) -> Iterator[Any]:
        for kind in ("mha", "mla"):
            for layout in LAYOUTS:
                for v1 in (True, False):
                    yield kind, layout, v1

    def test_copy_mode(self) -> None:
        for n, (kind, layout, v1) in enumerate(self.cases()):
            with self.subTest(kind=kind, layout=layout, interface_v1=v1):
                pool = HostPool(kind, layout, pages=2 * PAGES)
                b = self.backend(pool, config(is_mla_model=kind == "mla"))
                self.assertFalse(b.direct)
                with mock.patch.object(tensorcast.Client, "store_put", side_effect=AssertionError("not direct")):
                    self.round_trip(self.controller(b, pool, v1), pool, n)
                self.assertEqual(b.counters["pages_direct"], 0)
                b.clear()

    def test_direct_mode_copies_nothing_here(self) -> None:
        for n, (kind, layout, v1) in enumerate(self.cases()):
            if not v1:
                continue  # the older calls take copies of the pages: not direct by design
            with self.subTest(kind=kind, layout=layout):
                alloc = sglang.HostAllocator()
                pool = HostPool(kind, layout, pages=2 * PAGES, allocator=alloc)
                self.assertTrue(os.readlink(f"/proc/self/fd/{alloc.regions[0].fd}").startswith("/memfd:"))
                b = self.backend(pool, config(is_mla_model=kind == "mla"))
                self.assertTrue(b.direct)
                self.assertIsNotNone(b._pools["kv"].affine)  # addresses from the layout, not page by page
                # Every page moves by the daemon's copy between the store and
                # the host pool's own memory: this process copies nothing.
                with mock.patch.object(tensorcast.Client, "put_addresses", side_effect=AssertionError("a copy")), \
                        mock.patch.object(tensorcast.Client, "get_addresses", side_effect=AssertionError("a copy")):
                    self.round_trip(self.controller(b, pool, True), pool, 100 + n)
                self.assertEqual(b.counters["pages_direct"], 2 * PAGES)
                self.assertEqual(b.counters["pages_copied"], 0)
                b.clear()

    def test_direct_mode_asks_a_pool_not_laid_out_as_a_tensor(self) -> None:
        # A pool whose pages 2 and 3 trade places: its meta is no affine
        # layout, so every call asks it for each page's buffers.
        alloc = sglang.HostAllocator()
        pool = SwappedHostPool(pages=2 * PAGES, allocator=alloc)
        b = self.backend(pool)
        self.assertTrue(b.direct)
        self.assertIsNone(b._pools["kv"].affine)
        self.round_trip(self.controller(b, pool, True), pool, 7)
        self.assertEqual(b.counters["pages_direct"], 2 * PAGES)
        b.clear()

    def test_direct_mode_notices_pages_moved_after_registration(self) -> None:
        alloc = sglang.HostAllocator()
        pool = SwappedHostPool(pages=2 * PAGES, allocator=alloc, swap={})
        lg = logging.getLogger("test.sglang.moved")
        b = sglang.TensorcastStore(config(), {"socket": self.daemon.socket}, logger=lg)
        self.addCleanup(b.close)
        b.register_mem_pool_host(pool)
        self.assertIsNotNone(b._pools["kv"].affine)
        pool.swap = {0: 5, 5: 0}  # the first page of the first backup moved
        with self.assertLogs(lg, logging.WARNING) as logs:
            self.round_trip(self.controller(b, pool, True), pool, 8)
        self.assertIsNone(b._pools["kv"].affine)
        self.assertEqual(len(logs.records), 1, logs.output)
        self.assertIn("asked of the pool from now on", logs.output[0])
        self.assertEqual(b.counters["pages_direct"], 2 * PAGES)
        b.clear()

    def daemon_maps_unsealed_memfds(self) -> bool:
        """Whether this daemon registers a memfd its owner could still
        shrink (asked directly, not through the backend)."""
        fd = os.memfd_create("probe", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, 1 << 16)
            with tensorcast.connect(self.daemon.socket, "probe") as c:
                try:
                    c.unregister(c.register_fd(fd, 1 << 16))
                    return True
                except tensorcast.Error as e:
                    self.assertEqual(e.code, tensorcast.Status.INVALID_ARGUMENT, e)
                    return False
        finally:
            os.close(fd)

    def test_sglang_shm_allocator(self) -> None:
        # SGLang's own shared-memory allocator hands out memfds that cannot
        # be sealed. Where the daemon maps them, pages move by its copy with
        # no copy here; where it refuses them, that is said once and the
        # pages go through the queue, still byte-exact.
        accepted = self.daemon_maps_unsealed_memfds()
        alloc = ShmAllocator()
        self.addCleanup(alloc.close)
        pool = HostPool("mha", "page_first", pages=2 * PAGES, allocator=alloc)
        lg = logging.getLogger("test.sglang.shm")
        b = sglang.TensorcastStore(config(), {"socket": self.daemon.socket}, logger=lg)
        self.addCleanup(b.close)
        with self.assertLogs(lg, logging.INFO) as logs:
            b.register_mem_pool_host(pool)
        refused = [r.getMessage() for r in logs.records if "refuses" in r.getMessage()]
        self.assertEqual(b.direct, accepted)
        if accepted:
            self.assertEqual(refused, [])
            with mock.patch.object(tensorcast.Client, "put_addresses", side_effect=AssertionError("a copy")), \
                    mock.patch.object(tensorcast.Client, "get_addresses", side_effect=AssertionError("a copy")):
                self.round_trip(self.controller(b, pool, True), pool, 7)
            self.assertEqual(b.counters["pages_direct"], 2 * PAGES)
            # The engine shrinks its pool under the daemon: its own calls
            # fail (misses, no exception), nobody else's. Nothing here
            # touches the pool's memory while it is short.
            size = len(alloc.mms[0])
            keys = chain(4, 8)
            os.ftruncate(alloc.fds[0], 0)
            try:
                self.assertEqual(b.batch_set_v1(keys, pool.indices(range(4))), [False] * 4)
                self.assertEqual(b.batch_get_v1(chain(4, 7), pool.indices(range(4))), [False] * 4)
                other = HostPool("mha", "page_first")
                other.fill(0, 9)
                o = self.backend(other)
                self.assertEqual(o.batch_set_v1(keys[:1], other.indices([0])), [True])
                self.assertEqual(o.batch_get_v1(keys[:1], other.indices([1])), [True])
                self.assertEqual(other.page(1), other.page(0))
                o.clear()
            finally:
                os.ftruncate(alloc.fds[0], size)
        else:
            self.assertEqual(len(refused), 1, [r.getMessage() for r in logs.records])
            self.assertIn("unsealed", refused[0])
            self.round_trip(self.controller(b, pool, True), pool, 7)
            self.assertEqual(b.counters["pages_direct"], 0)
        b.clear()

    def test_backup_and_prefetch_at_once(self) -> None:
        # SGLang's backup and prefetch threads call the backend at the same
        # time: one backs a request's pages up while the other reads
        # another's into the pool.
        for kind in ("mha", "mla"):
            with self.subTest(kind=kind):
                pool = HostPool(kind, "page_first", pages=3 * PAGES, allocator=sglang.HostAllocator())
                b = self.backend(pool, config(is_mla_model=kind == "mla"))
                ctl = self.controller(b, pool, True)
                old, new = chain(PAGES, 900), chain(PAGES, 901)
                for s in range(2 * PAGES):
                    pool.fill(s, 9000 + s)
                ctl.write_storage(old, pool.indices(range(PAGES)))
                op = ctl.prefetch(old)
                self.assertEqual(len(op.hit_hashes), PAGES)
                slots = range(2 * PAGES, 3 * PAGES)
                ctl.write_storage(new, pool.indices(range(PAGES, 2 * PAGES)), wait=False)
                ctl.load(op, pool.indices(slots), wait=False)
                self.assertEqual(ctl.backup_acks.get(timeout=60).completed_tokens, PAGES * pool.page_size)
                self.assertEqual(ctl.io_acks.get(timeout=60).completed_pages, PAGES)
                self.assertEqual([pool.page(s) for s in slots], [pool.page(s) for s in range(PAGES)])
                self.assertEqual(b.batch_exists(new), PAGES)
                b.clear()

    def test_one_key_scheme_for_both_interfaces(self) -> None:
        # What batch_set_v1 wrote, batch_exists finds and batch_get reads,
        # and the other way round, in each layout (the flat page and the
        # pool's buffers hold the same bytes in the same order).
        for n, layout in enumerate(LAYOUTS):
            with self.subTest(layout=layout):
                pool = HostPool("mha", layout, pages=2 * PAGES)
                b = self.backend(pool)
                v1, flat = self.controller(b, pool, True), self.controller(b, pool, False)
                self.round_trip(flat, pool, 200 + n, pages=130, writer=v1)
                self.round_trip(v1, pool, 210 + n, pages=130, writer=flat)
                b.clear()


class TestKeys(SGLangCase):
    def test_ranks(self) -> None:
        keys = chain(4, 300)

        def stored_by(cfg: Any, reader: Any, kind: str = "mha") -> int:
            p0, p1 = HostPool(kind), HostPool(kind)
            for s in range(4):
                p0.fill(s, s)
            w = self.backend(p0, cfg)
            self.assertEqual(w.batch_set_v1(keys, p0.indices(range(4))), [True] * 4)
            r = self.backend(p1, reader)
            found = r.batch_exists(keys)
            if found:
                self.assertEqual(r.batch_get_v1(keys, p1.indices(range(4))), [True] * 4)
                self.assertEqual([p1.page(s) for s in range(4)], [p0.page(s) for s in range(4)])
            w.clear()
            return found

        # MHA ranks hold different heads, PP ranks different layers, CP
        # ranks different slices: their pages are apart.
        self.assertEqual(stored_by(config(tp_rank=0, tp_size=2), config(tp_rank=1, tp_size=2)), 0)
        self.assertEqual(stored_by(config(pp_rank=0, pp_size=2), config(pp_rank=1, pp_size=2)), 0)
        self.assertEqual(stored_by(config(attn_cp_rank=0, attn_cp_size=2), config(attn_cp_rank=1, attn_cp_size=2)), 0)
        self.assertEqual(stored_by(config(tp_size=2), config(tp_size=4)), 0)
        # MLA's KV is the same on every TP rank: one writes, all read.
        self.assertEqual(stored_by(config(tp_rank=0, tp_size=2, is_mla_model=True),
                                   config(tp_rank=1, tp_size=2, is_mla_model=True), "mla"), 4)
        # Attention-DP replicas hold the same heads: they share pages.
        self.assertEqual(stored_by(config(dp_rank=0, dp_size=2), config(dp_rank=1, dp_size=2)), 4)
        # The same rank again (a restarted engine) finds its pages.
        self.assertEqual(stored_by(config(tp_rank=1, tp_size=2), config(tp_rank=1, tp_size=2)), 4)

    def test_mla_tp_ranks_through_the_controller(self) -> None:
        pool0, pool1 = HostPool("mla", pages=2 * PAGES), HostPool("mla", pages=2 * PAGES)
        b0 = self.backend(pool0, config(tp_rank=0, tp_size=2, is_mla_model=True))
        b1 = self.backend(pool1, config(tp_rank=1, tp_size=2, is_mla_model=True))
        c0 = self.controller(b0, pool0, True, tp_rank=0, is_mla=True)
        c1 = self.controller(b1, pool1, True, tp_rank=1, is_mla=True)
        hashes = chain(PAGES, 310)
        for s in range(PAGES):
            pool0.fill(s, s)
            pool1.fill(s, s)  # the same KV on both ranks
        c1.write_storage(hashes, pool1.indices(range(PAGES)))  # rank 1 skips its backup
        self.assertEqual(b1.counters["pages_set"], 0)
        c0.write_storage(hashes, pool0.indices(range(PAGES)))
        op = c1.prefetch(hashes)
        self.assertEqual(len(op.hit_hashes), PAGES)
        slots = range(PAGES, 2 * PAGES)
        got = c1.load(op, pool1.indices(slots))
        assert got is not None
        self.assertEqual(got.completed_pages, PAGES)
        self.assertEqual([pool1.page(s) for s in slots], [pool0.page(s) for s in range(PAGES)])
        b0.clear()

    def test_another_layout_is_a_miss(self) -> None:
        keys = chain(2, 320)
        base = HostPool("mha", "page_first")
        for s in range(2):
            base.fill(s, s)
        w = self.backend(base)
        self.assertEqual(w.batch_set_v1(keys, base.indices(range(2))), [True, True])
        others = {"layout": HostPool("mha", "page_first_direct"), "page size": HostPool("mha", page_size=8),
                  "dtype": HostPool("mha", dtype=torch.float16), "heads": HostPool("mha", heads=4, head_dim=16),
                  "layers": HostPool("mha", layers=4, head_dim=16)}
        for what, pool in others.items():
            with self.subTest(what):
                r = self.backend(pool)
                self.assertEqual(r.batch_exists(keys), 0)
                self.assertEqual(r.batch_get_v1(keys, pool.indices(range(2))), [False, False])
        other_model = self.backend(HostPool("mha"), config(model_name="other/model"))
        self.assertEqual(other_model.batch_exists(keys), 0)
        self.assertEqual(self.backend(HostPool("mha")).batch_exists(keys), 2)  # the same layout: a hit
        w.clear()
        self.assertEqual(w.batch_exists(keys), 0)

    def test_older_single_page_calls(self) -> None:
        pool = HostPool("mha", "layer_first")
        b = self.backend(pool)
        pool.fill(0, 1)
        page = pool.get_data_page(0)
        self.assertTrue(b.set("old/0", page))
        self.assertTrue(b.exists("old/0"))
        out = pool.get_dummy_flat_data_page()
        self.assertIs(b.get("old/0", out), out)
        self.assertTrue(torch.equal(out.view(torch.uint8), page.view(torch.uint8)))
        self.assertIsNone(b.get("old/none", pool.get_dummy_flat_data_page()))
        # Raw memory: the count of leading pages read.
        dst = torch.zeros(2, page.numel(), dtype=pool.dtype)
        z = pool.page_bytes()
        self.assertEqual(b.batch_get(["old/0", "old/none"], [dst[0].data_ptr(), dst[1].data_ptr()], [z, z]), 1)
        self.assertTrue(torch.equal(dst[0].view(torch.uint8), page.view(torch.uint8)))
        self.assertTrue(b.get("old/0", dst[1].data_ptr(), z))
        # A value that is not a page of the pool, or not a tensor: a miss,
        # not an exception.
        self.assertFalse(b.set("old/1", torch.zeros(3)))
        self.assertFalse(b.batch_set(["old/1"], [b"bytes"]))
        self.assertEqual(b.batch_get(["old/0"], [b"bytes"]), [None])
        self.assertIsNone(b.get_stats())
        b.clear()
        self.assertFalse(b.exists("old/0"))


class TestV2(SGLangCase):
    """The hybrid controller's calls: KV pages by batch_set_v1 and
    batch_get_v1, a KV-derived sidecar pool (the indexer, on the KV pool's
    host indices) and a Mamba pool (its own slots, the trailing page only)
    by the v2 calls."""

    def setup_pools(self, alloc: Any = None) -> Any:
        kv = HostPool("mla", pages=64, allocator=alloc)
        indexer = HostPool("mla", pages=64, layers=2, head_dim=16, allocator=alloc)
        mamba = MambaHostPool(slots=16, allocator=alloc)
        b = self.backend(kv, config(is_mla_model=True))
        b.register_mem_host_pool_v2(kv, PoolName.KV)
        b.register_mem_host_pool_v2(indexer, PoolName.INDEXER)
        b.register_mem_host_pool_v2(mamba, PoolName.MAMBA)
        return b, kv, indexer, mamba

    def check(self, b: Any, kv: Any, indexer: Any, mamba: Any, seed: int) -> None:
        hashes = chain(8, seed)
        for s in range(8):
            kv.fill(s, seed + s)
            indexer.fill(s, seed + 50 + s)
        mamba.fill(3, seed + 99)
        idx = kv.indices(range(8))
        side = PoolTransfer(PoolName.INDEXER, host_indices=idx, keys=hashes, indices_from_pool=PoolName.KV)
        state = PoolTransfer(PoolName.MAMBA, host_indices=torch.tensor([3]), keys=hashes[-1:],
                             hit_policy=PoolHitPolicy.TRAILING_PAGES)
        probe = [PoolTransfer(PoolName.INDEXER), PoolTransfer(PoolName.MAMBA, keys=["x"],
                                                                hit_policy=PoolHitPolicy.TRAILING_PAGES)]
        self.assertEqual(b.batch_exists_v2(hashes, probe).kv_hit_pages, 0)

        # Backup: the sidecars by batch_set_v2, then the KV pages.
        res = b.batch_set_v2([side, state])
        self.assertEqual(res, {PoolName.INDEXER: [True] * 8, PoolName.MAMBA: [True]})
        self.assertEqual(b.batch_exists_v2(hashes, probe).kv_hit_pages, 0)  # no KV yet
        self.assertEqual(b.batch_set_v1(hashes, idx), [True] * 8)
        r = b.batch_exists_v2(hashes, probe)
        self.assertEqual((r.kv_hit_pages, dict(r.extra_pool_hit_pages)),
                         (8, {PoolName.KV: 8, PoolName.INDEXER: 8, PoolName.MAMBA: 8}))
        # A shorter query: Mamba's state is stored for page 8 only, so a
        # trailing-page pool serves no shorter prefix; all_pages ones do.
        r = b.batch_exists_v2(hashes[:5], probe)
        self.assertEqual((r.kv_hit_pages, r.extra_pool_hit_pages.get(PoolName.MAMBA, 0)), (0, 0))
        r = b.batch_exists_v2(hashes[:5], probe[:1])
        self.assertEqual(r.kv_hit_pages, 5)
        # Two trailing pages wanted, one stored: the window ends nowhere.
        two = PoolTransfer(PoolName.MAMBA, keys=["a", "b"], hit_policy=PoolHitPolicy.TRAILING_PAGES)
        self.assertEqual(b.batch_exists_v2(hashes, [two]).kv_hit_pages, 0)
        # An indexer page missing in the middle shortens the prefix to it.
        c = b._link.client()
        c.remove(b._pools["indexer"].keys(hashes[4:5]))
        r = b.batch_exists_v2(hashes, probe)
        self.assertEqual((r.kv_hit_pages, r.extra_pool_hit_pages.get(PoolName.INDEXER)), (4, 4))
        self.assertEqual(b.batch_set_v2([side])[PoolName.INDEXER], [True] * 8)

        # Prefetch into other slots: KV and its sidecar batch by batch, then
        # the Mamba state for the last hit page.
        dst = kv.indices(range(8, 16))
        self.assertEqual(b.batch_get_v1(hashes, dst), [True] * 8)
        got = b.batch_get_v2([PoolTransfer(PoolName.INDEXER, host_indices=dst, keys=hashes)])
        self.assertEqual(got, {PoolName.INDEXER: [True] * 8})
        got = b.batch_get_v2([PoolTransfer(PoolName.MAMBA, host_indices=torch.tensor([9]), keys=hashes[-1:])])
        self.assertEqual(got, {PoolName.MAMBA: [True]})
        for s in range(8):
            self.assertEqual(kv.page(8 + s), kv.page(s))
            self.assertEqual(indexer.page(8 + s), indexer.page(s))
        self.assertEqual(mamba.page(9), mamba.page(3))
        # A transfer whose indices do not fit its keys: misses, no exception.
        bad = b.batch_get_v2([PoolTransfer(PoolName.MAMBA, host_indices=torch.tensor([1, 2]), keys=hashes[-1:])])
        self.assertEqual(bad, {PoolName.MAMBA: [False]})
        self.assertEqual(b.batch_get_v2([PoolTransfer(PoolName.SWA, host_indices=dst, keys=hashes)]),
                         {PoolName.SWA: [False] * 8})
        b.clear()

    def test_copied(self) -> None:
        self.check(*self.setup_pools(), seed=400)

    def test_direct(self) -> None:
        alloc = sglang.HostAllocator()
        b, kv, indexer, mamba = self.setup_pools(alloc)
        self.assertTrue(b.direct)
        with mock.patch.object(tensorcast.Client, "put_addresses", side_effect=AssertionError("a copy")), \
                mock.patch.object(tensorcast.Client, "get_addresses", side_effect=AssertionError("a copy")):
            self.check(b, kv, indexer, mamba, seed=500)

    def test_a_pool_without_page_metadata(self) -> None:
        # Mamba in layer_first answers no zero-copy metadata: its pages go
        # through its flat data pages, said once at registration.
        class LayerFirstMamba(MambaHostPool):
            def get_page_buffer_meta(self, indices: Any) -> Any:
                raise ValueError("zero-copy requires page_first")

        lg = logging.getLogger("test.sglang.nometa")
        b = sglang.TensorcastStore(config(), {"socket": self.daemon.socket}, logger=lg)
        self.addCleanup(b.close)
        mamba = LayerFirstMamba()
        with self.assertLogs(lg, logging.WARNING) as logs:
            b.register_mem_host_pool_v2(mamba, PoolName.MAMBA)
        self.assertIn("zero-copy requires page_first", logs.records[0].getMessage())
        keys = chain(2, 450)
        mamba.fill(0, 1)
        mamba.fill(1, 2)
        t = PoolTransfer(PoolName.MAMBA, host_indices=torch.tensor([0, 1]), keys=keys)
        self.assertEqual(b.batch_set_v2([t]), {PoolName.MAMBA: [True, True]})
        back = PoolTransfer(PoolName.MAMBA, host_indices=torch.tensor([5, 4]), keys=keys)
        self.assertEqual(b.batch_get_v2([back]), {PoolName.MAMBA: [True, True]})
        self.assertEqual((mamba.page(5), mamba.page(4)), (mamba.page(0), mamba.page(1)))
        b.clear()

    def test_mamba_keys_carry_the_tp_rank_under_mla(self) -> None:
        # MLA's KV is the same on every TP rank, a Mamba state is not: rank
        # 1 reads rank 0's KV pages but never its state.
        b0, _, _, _ = self.setup_pools()
        b1 = self.backend(HostPool("mla", pages=64), config(tp_rank=1, tp_size=2, is_mla_model=True))
        b1.register_mem_host_pool_v2(MambaHostPool(), PoolName.MAMBA)
        self.assertEqual(b0._pools["kv"].fp, b1._pools["kv"].fp)
        self.assertNotEqual(b0._pools["mamba"].fp, b1._pools["mamba"].fp)


class TestFactory(SGLangCase):
    """SGLang's ``dynamic`` backend, against a stand-in SGLang on sys.path:
    the class is a HiCacheStorage, made as cls(storage_config, kwargs)."""

    def setUp(self) -> None:
        saved = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
        own = sys.modules.pop("tensorcast.integrations.sglang", None)
        parent = importlib.import_module("tensorcast.integrations")
        sys.path.insert(0, str(STANDIN))

        def restore() -> None:
            sys.path.remove(str(STANDIN))
            for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
                del sys.modules[k]
            sys.modules.update(saved)
            if own is not None:
                sys.modules["tensorcast.integrations.sglang"] = own
                parent.sglang = own  # type: ignore[attr-defined]

        self.addCleanup(restore)

    def extra(self, **kw: Any) -> dict:
        return {"backend_name": "tensorcast", "module_path": "tensorcast.integrations.sglang",
                "class_name": "TensorcastStore", "socket": self.daemon.socket, **kw}

    def test_dynamic_backend_through_the_controller(self) -> None:
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, PoolTransferResult

        for n, v1 in enumerate((1, 0)):
            with self.subTest(interface_v1=v1):
                cfg = config(extra_config=self.extra(interface_v1=v1))
                b = create_dynamic_backend(cfg, HiCacheStorage)
                self.addCleanup(b.close)
                self.assertIsInstance(b, HiCacheStorage)
                pool = HostPool("mha", "page_first", pages=2 * PAGES)
                b.register_mem_pool_host(pool)  # as the controller does, after construction
                self.assertIsInstance(b.batch_exists_v2(chain(1, 9)), PoolTransferResult)
                self.round_trip(self.controller(b, pool, bool(v1)), pool, 600 + n)
                b.clear()

    def test_without_sglang_the_class_is_not_a_subclass(self) -> None:
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

        own = sys.modules.get("tensorcast.integrations.sglang")  # None: popped by setUp
        self.assertIsNone(own)
        with mock.patch.dict(sys.modules):  # an engine without SGLang importable
            for k in [k for k in sys.modules if k.startswith("sglang.")]:
                del sys.modules[k]
            sys.modules["sglang"] = None  # type: ignore[assignment]
            duck = importlib.import_module("tensorcast.integrations.sglang")
        self.assertFalse(issubclass(duck.TensorcastStore, HiCacheStorage))
        with self.assertRaisesRegex(TypeError, "must inherit from HiCacheStorage"):
            with mock.patch("importlib.import_module", return_value=duck):
                create_dynamic_backend(config(extra_config=self.extra()), HiCacheStorage)

    def test_missing_fields(self) -> None:
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

        with self.assertRaisesRegex(ValueError, "class_name"):
            create_dynamic_backend(config(extra_config={"backend_name": "x", "module_path": "y"}), HiCacheStorage)


class TestFailures(SGLangCase):
    def test_a_pool_that_does_not_fit_is_a_miss_logged_once(self) -> None:
        pool = HostPool("mha")
        lg = logging.getLogger("test.sglang.layout")
        b = sglang.TensorcastStore(config(), {"socket": self.daemon.socket}, logger=lg)
        self.addCleanup(b.close)
        b.register_mem_pool_host(pool)
        keys = chain(2, 700)
        with self.assertLogs(lg, logging.WARNING) as logs:
            # Indices of three pages for two keys: a miss for every page.
            self.assertEqual(b.batch_set_v1(keys, pool.indices(range(3))), [False, False])
            self.assertEqual(b.batch_set_v1(keys, pool.indices(range(3))), [False, False])
        self.assertEqual(len(logs.records), 1)
        self.assertEqual(b.batch_set_v1(keys, pool.indices(range(2))), [True, True])  # the connection stayed
        self.assertEqual(b._link.counts["outages"], 0)
        b.clear()

    def test_daemon_killed_and_restarted_mid_sequence(self) -> None:
        d = Daemon(["--store-l2-path", "off"]).start()
        self.addCleanup(d.close)
        alloc = sglang.HostAllocator()
        pool = HostPool("mha", pages=8, allocator=alloc)
        lg = logging.getLogger("test.sglang.failures")
        b = sglang.TensorcastStore(config(), {"socket": d.socket, "retry_interval": 0}, logger=lg)
        self.addCleanup(b.close)
        b.register_mem_pool_host(pool)
        keys = chain(4, 800)
        for s in range(4):
            pool.fill(s, s)
        self.assertEqual(b.batch_set_v1(keys[:2], pool.indices(range(2))), [True, True])
        d.kill()
        with self.assertLogs(lg, logging.DEBUG) as logs:
            # Every call answers a miss; none raises (an exception here would
            # end HiCache's prefetch thread for good).
            self.assertEqual(b.batch_exists(keys), 0)
            self.assertEqual(b.batch_set_v1(keys, pool.indices(range(4))), [False] * 4)
            self.assertEqual(b.batch_get_v1(keys, pool.indices(range(4, 8))), [False] * 4)
            self.assertFalse(b.batch_set(keys[:1], [pool.get_data_page(0)]))
            self.assertEqual(b.batch_get(keys[:1], [pool.get_dummy_flat_data_page()]), [None])
            self.assertEqual(b.batch_exists_v2(keys, [PoolTransfer(PoolName.KV)]).kv_hit_pages, 0)
            self.assertEqual(b.batch_set_v2([PoolTransfer(PoolName.KV, pool.indices([0]), keys=keys[:1])]),
                             {PoolName.KV: [False]})
            self.assertFalse(b.exists(keys[0]))
            d.start()
            self.assertEqual(b.batch_set_v1(keys, pool.indices(range(4))), [True] * 4)
        warnings = [r for r in logs.records if r.levelno >= logging.WARNING]
        self.assertEqual(len(warnings), 1, [r.getMessage() for r in warnings])  # the outage, once
        self.assertTrue(any("reconnected" in r.getMessage() for r in logs.records))
        # The host pool was registered again with the new connection.
        self.assertTrue(b.direct)
        with mock.patch.object(tensorcast.Client, "get_addresses", side_effect=AssertionError("a client copy")):
            self.assertEqual(b.batch_get_v1(keys, pool.indices(range(4, 8))), [True] * 4)
        for s in range(4):
            self.assertEqual(pool.page(4 + s), pool.page(s))

    def test_a_bad_call_timeout_is_refused(self) -> None:
        for bad in (-1, None, "soon", True, float("inf")):
            with self.assertRaises(ValueError) as e:
                sglang.TensorcastStore(config(), {"socket": "/nonexistent", "call_timeout": bad},
                                       logger=quiet("test.sglang.bad"))
            self.assertIn("call_timeout", str(e.exception))

    def test_a_stopped_daemon_is_a_miss_by_the_call_timeout(self) -> None:
        # A daemon that answers nothing (stopped) ends each call by the
        # extra config's call_timeout: the scheduler sees misses instead of
        # waiting for good, and the pages go through once it answers again.
        d = Daemon(["--store-l2-path", "off"]).start()
        self.addCleanup(d.close)
        pool = HostPool("mha", pages=8, allocator=sglang.HostAllocator())
        lg = logging.getLogger("test.sglang.stopped")
        b = sglang.TensorcastStore(config(), {"socket": d.socket, "retry_interval": 0, "call_timeout": 0.3},
                                   logger=lg)
        self.addCleanup(b.close)
        b.register_mem_pool_host(pool)
        keys = chain(2, 900)
        for s in range(2):
            pool.fill(s, s)
        self.assertEqual(b.batch_set_v1(keys, pool.indices(range(2))), [True, True])
        d.freeze()
        try:
            with self.assertLogs(lg, logging.WARNING):
                t0 = time.monotonic()
                self.assertEqual(b.batch_get_v1(keys, pool.indices(range(2, 4))), [False, False])
                self.assertLess(time.monotonic() - t0, 5)
        finally:
            d.thaw()
        self.assertEqual(b.batch_get_v1(keys, pool.indices(range(2, 4))), [True, True])
        for s in range(2):
            self.assertEqual(pool.page(2 + s), pool.page(s))


if __name__ == "__main__":
    unittest.main()
