"""Doubles of the SGLang parts that call a HiCache storage backend, written
from SGLang's interface (not its code): the storage config and transfer
descriptors, MHA, MLA and Mamba host pools in their layouts, its
shared-memory host allocator, the storage factory's ``dynamic`` backend, and
the cache controller's backup and prefetch threads.

The types SGLang's ``sglang.srt.mem_cache.hicache_storage`` exports are
defined here; ``standin/sglang/srt/mem_cache/hicache_storage.py`` adds the
abstract ``HiCacheStorage`` to them, for the tests that put a stand-in
``sglang`` on sys.path.
"""

from __future__ import annotations

import enum
import importlib
import math
import mmap
import os
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from .test_core import pattern

STORAGE_BATCH_SIZE = 128  # pages per storage call, as SGLang's controller makes them


@dataclass
class HiCacheStorageConfig:
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    attn_cp_rank: int = 0
    attn_cp_size: int = 1
    is_mla_model: bool = False
    enable_storage_metrics: bool = False
    is_page_first_layout: bool = True
    model_name: Optional[str] = "test/model"
    dp_rank: int = 0
    dp_size: int = 1
    tp_lcm_size: Optional[int] = None
    should_split_heads: bool = False
    extra_config: Optional[dict] = None


@dataclass
class HiCacheStorageExtraInfo:
    prefix_keys: Optional[List[str]] = None
    extra_info: Optional[dict] = None


class PoolName(str, enum.Enum):
    KV = "kv"
    MAMBA = "mamba"
    SWA = "swa"
    INDEXER = "indexer"

    def __str__(self) -> str:
        return self.value


class PoolHitPolicy(str, enum.Enum):
    ALL_PAGES = "all_pages"
    TRAILING_PAGES = "trailing_pages"


@dataclass
class PoolTransfer:
    name: PoolName
    host_indices: Optional[torch.Tensor] = None
    device_indices: Optional[torch.Tensor] = None
    keys: Optional[List[str]] = None
    hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES
    nodes_to_load: Optional[List[Any]] = None
    indices_from_pool: Optional[PoolName] = None


@dataclass
class PoolTransferResult:
    kv_hit_pages: int
    extra_pool_hit_pages: Dict[str, int] = field(default_factory=dict)


# -- host memory --------------------------------------------------------------------------


class ShmAllocator:
    """SGLang's shared-memory host allocator as it behaves: each allocation
    is a memfd (not sealable, not sealed) mapped shared, kept in ``fds`` and
    ``mms``."""

    def __init__(self) -> None:
        self.fds: List[int] = []
        self.mms: List[mmap.mmap] = []
        self.dtype: Any = None
        self.dims: Any = None

    def allocate(self, dims: Tuple[int, ...], dtype: torch.dtype, device: str) -> torch.Tensor:
        assert device == "cpu"
        self.dims, self.dtype = dims, dtype
        n = math.prod(dims) * torch.empty([], dtype=dtype).element_size()
        size = -(-n // mmap.PAGESIZE) * mmap.PAGESIZE
        fd = os.memfd_create("host-pool-double", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.fds.append(fd)
        self.mms.append(mm)
        return torch.frombuffer(mm, dtype=dtype, count=math.prod(dims)).view(dims)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


class HostPool:
    """A KV host pool: MHA (a K and a V per token) or MLA (one latent per
    token), in SGLang's layouts:

    - page_first: tokens outermost, then layers (a page's K is contiguous);
    - layer_first: layers outermost (a page's K is one run per layer);
    - page_first_direct: pages outermost, then layers, then the page's tokens.

    ``get_page_buffer_meta`` names each page's buffers (K then V, per layer
    in layer_first), ``get_data_page`` is the page as a slice of the pool,
    flattened."""

    def __init__(self, kind: str = "mha", layout: str = "page_first", pages: int = 64, page_size: int = 4,
                 layers: int = 2, heads: int = 2, head_dim: int = 32, dtype: torch.dtype = torch.bfloat16,
                 allocator: Any = None) -> None:
        assert kind in ("mha", "mla") and layout in ("page_first", "layer_first", "page_first_direct")
        self.kind, self.layout, self.page_size = kind, layout, page_size
        self.page_num, self.size = pages, pages * page_size
        self.layer_num, self.dtype, self.allocator = layers, dtype, allocator
        self.head_num, self.head_dim = (heads, head_dim) if kind == "mha" else (1, head_dim)
        kvs = (2,) if kind == "mha" else ()
        inner = (self.head_num, self.head_dim)
        dims = {"page_first": (*kvs, self.size, layers, *inner),
                "layer_first": (*kvs, layers, self.size, *inner),
                "page_first_direct": (*kvs, pages, layers, page_size, *inner)}[layout]
        self.kv_buffer = allocator.allocate(dims, dtype, "cpu") if allocator else torch.zeros(dims, dtype=dtype)

    def _page(self, index: int) -> torch.Tensor:
        """The page starting at token index, as a view of the pool."""
        i, ps, kv = index, self.page_size, self.kv_buffer
        p = i // ps
        lead = (slice(None),) if self.kind == "mha" else ()
        if self.layout == "page_first":
            return kv[(*lead, slice(i, i + ps))]
        if self.layout == "layer_first":
            return kv[(*lead, slice(None), slice(i, i + ps))]
        return kv[(*lead, slice(p, p + 1))]

    def _buffers(self, index: int) -> List[torch.Tensor]:
        """The page's contiguous buffers, in the order the meta names them."""
        page = self._page(index)
        halves = [page[0], page[1]] if self.kind == "mha" else [page]
        if self.layout == "layer_first":  # one run per layer: K and V of layer 0, then of layer 1, ...
            return [h[layer] for layer in range(self.layer_num) for h in halves]
        return halves

    def get_page_buffer_meta(self, indices: torch.Tensor) -> Tuple[List[int], List[int]]:
        assert len(indices) % self.page_size == 0
        ptrs, sizes = [], []
        for first in indices.tolist()[::self.page_size]:
            for b in self._buffers(first):
                assert b.is_contiguous()
                ptrs.append(b.data_ptr())
                sizes.append(b.numel() * b.element_size())
        return ptrs, sizes

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        page = self._page(index)
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(self._page(0).numel(), dtype=self.dtype)

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        page = self._page(index)
        page.copy_(data_page.view(page.shape))

    # -- for the tests --

    def page_bytes(self) -> int:
        return self._page(0).numel() * self.kv_buffer.element_size()

    def fill(self, slot: int, seed: int) -> None:
        page = self._page(slot * self.page_size)
        data = torch.frombuffer(bytearray(pattern(self.page_bytes(), seed)), dtype=torch.uint8)
        page.copy_(data.view(self.dtype).view(page.shape))

    def page(self, slot: int) -> bytes:
        return bytes(self._page(slot * self.page_size).flatten().view(torch.uint8).numpy())

    def indices(self, slots: Sequence[int]) -> torch.Tensor:
        """The token indices of pages slots, in that order."""
        ps = self.page_size
        return torch.cat([torch.arange(s * ps, (s + 1) * ps, dtype=torch.int64) for s in slots])


class MambaHostPool:
    """A Mamba state pool: a page is one slot (page_size 1) of a temporal
    and a conv buffer, two tensors, named in that order."""

    layout = "page_first"
    page_size = 1

    def __init__(self, slots: int = 16, layers: int = 2, allocator: Any = None) -> None:
        self.size = slots
        self.dtype = torch.float32

        def alloc(dims: Tuple[int, ...]) -> torch.Tensor:
            return allocator.allocate(dims, torch.float32, "cpu") if allocator else torch.zeros(dims)

        self.allocator = allocator
        self.temporal = alloc((slots, layers, 1, 24))
        self.conv = alloc((slots, layers, 1, 8))

    def get_page_buffer_meta(self, indices: torch.Tensor) -> Tuple[List[int], List[int]]:
        ptrs, sizes = [], []
        for i in indices.tolist():
            for b in (self.temporal[i], self.conv[i]):
                ptrs.append(b.data_ptr())
                sizes.append(b.numel() * b.element_size())
        return ptrs, sizes

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        return torch.cat([self.temporal[index].flatten().view(torch.uint8), self.conv[index].flatten().view(torch.uint8)])

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(self.get_data_page(0).numel(), dtype=torch.uint8)

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        n = self.temporal[index].numel() * 4
        self.temporal[index].view(-1).view(torch.uint8).copy_(data_page[:n])
        self.conv[index].view(-1).view(torch.uint8).copy_(data_page[n:])

    def fill(self, slot: int, seed: int) -> None:
        data = torch.frombuffer(bytearray(pattern(self.get_data_page(slot).numel(), seed)), dtype=torch.uint8)
        self.set_from_flat_data_page(slot, data)

    def page(self, slot: int) -> bytes:
        return bytes(self.get_data_page(slot).numpy())


# -- SGLang's storage factory, dynamic backend ----------------------------------------------


def create_dynamic_backend(storage_config: HiCacheStorageConfig, base: type) -> Any:
    """What SGLang's factory does for ``--hicache-storage-backend
    dynamic``: import module_path from the extra config, take class_name,
    require a subclass of HiCacheStorage (base), construct it as
    ``cls(storage_config, kwargs)`` with the factory's keyword arguments (a
    dict, empty here)."""
    extra = storage_config.extra_config or {}
    for f in ("backend_name", "module_path", "class_name"):
        if f not in extra:
            raise ValueError(f"missing {f!r} in the extra config")
    cls = getattr(importlib.import_module(extra["module_path"]), extra["class_name"])
    if not issubclass(cls, base):
        raise TypeError(f"Backend class {extra['class_name']} must inherit from HiCacheStorage")
    return cls(storage_config, {})


# -- the cache controller ---------------------------------------------------------------------


@dataclass
class Backup:
    hashes: List[str]
    host_indices: torch.Tensor
    completed_tokens: int = 0


@dataclass
class Prefetch:
    hashes: List[str]
    hit_hashes: List[str] = field(default_factory=list)
    host_indices: Optional[torch.Tensor] = None
    completed_pages: int = 0


class Controller:
    """SGLang's HiCacheController's storage side: a backup thread writing
    pages in batches of 128 (``batch_set_v1`` with ``interface_v1``, else
    ``batch_set`` of flat data pages, stopping at the first failed batch),
    a prefetch thread counting the stored prefix (``batch_exists`` per batch
    of 128, stopping at the first short one), and a prefetch I/O thread
    reading the hit pages into host slots the scheduler gives it
    (``batch_get_v1``, else ``batch_get`` into dummy pages copied into the
    pool), counting leading successes. For an MLA model only TP rank 0
    backs up. Threads stop on close()."""

    def __init__(self, backend: Any, pool: Any, interface_v1: bool, tp_rank: int = 0,
                 is_mla: bool = False) -> None:
        self.backend, self.pool, self.v1 = backend, pool, interface_v1
        self.page_size = pool.page_size
        self.backup_skip = is_mla and tp_rank != 0
        self.backup_q: "queue.Queue[Optional[Backup]]" = queue.Queue()
        self.backup_acks: "queue.Queue[Backup]" = queue.Queue()
        self.hit_q: "queue.Queue[Optional[Prefetch]]" = queue.Queue()
        self.hits: "queue.Queue[Prefetch]" = queue.Queue()
        self.io_q: "queue.Queue[Optional[Prefetch]]" = queue.Queue()
        self.io_acks: "queue.Queue[Prefetch]" = queue.Queue()
        self.threads = [threading.Thread(target=self._loop, args=(q, fn), daemon=True)
                        for q, fn in ((self.backup_q, self._backup), (self.hit_q, self._hit_query),
                                      (self.io_q, self._transfer))]
        for t in self.threads:
            t.start()

    def _loop(self, q: "queue.Queue[Any]", fn: Any) -> None:
        while True:
            op = q.get()
            if op is None:
                return
            fn(op)

    def close(self) -> None:
        for q in (self.backup_q, self.hit_q, self.io_q):
            q.put(None)
        for t in self.threads:
            t.join()

    # backup

    def write_storage(self, hashes: List[str], host_indices: torch.Tensor, timeout: float = 60,
                      wait: bool = True) -> Optional[Backup]:
        """Queues a backup; returns it once done (wait), else None (take it
        from backup_acks)."""
        self.backup_q.put(Backup(hashes, host_indices))
        return self.backup_acks.get(timeout=timeout) if wait else None

    def _page_set(self, hashes: List[str], host_indices: torch.Tensor, extra: HiCacheStorageExtraInfo) -> bool:
        if self.v1:
            return all(self.backend.batch_set_v1(hashes, host_indices, extra))
        pages = [self.pool.get_data_page(int(host_indices[i * self.page_size])) for i in range(len(hashes))]
        return bool(self.backend.batch_set(hashes, pages))

    def _backup(self, op: Backup) -> None:
        if not self.backup_skip:
            for i in range(0, len(op.hashes), STORAGE_BATCH_SIZE):
                batch = op.hashes[i:i + STORAGE_BATCH_SIZE]
                idx = op.host_indices[i * self.page_size:(i + len(batch)) * self.page_size]
                if not self._page_set(batch, idx, HiCacheStorageExtraInfo()):
                    break
                op.completed_tokens += len(batch) * self.page_size
        self.backup_acks.put(op)

    # prefetch

    def prefetch(self, hashes: List[str], timeout: float = 60) -> Prefetch:
        """Queues a prefetch; returns it once its hits are counted."""
        self.hit_q.put(Prefetch(hashes))
        return self.hits.get(timeout=timeout)

    def _hit_query(self, op: Prefetch) -> None:
        for i in range(0, len(op.hashes), STORAGE_BATCH_SIZE):
            batch = op.hashes[i:i + STORAGE_BATCH_SIZE]
            n = self.backend.batch_exists(batch, HiCacheStorageExtraInfo())
            op.hit_hashes.extend(batch[:n])
            if n < len(batch):
                break
        self.hits.put(op)

    def load(self, op: Prefetch, host_indices: torch.Tensor, timeout: float = 60,
             wait: bool = True) -> Optional[Prefetch]:
        """The scheduler's part: host slots for the hit pages; then the I/O
        (returned once done with wait, else taken from io_acks)."""
        op.host_indices = host_indices
        self.io_q.put(op)
        return self.io_acks.get(timeout=timeout) if wait else None

    def _page_get(self, hashes: List[str], host_indices: torch.Tensor) -> int:
        if self.v1:
            got = self.backend.batch_get_v1(hashes, host_indices, HiCacheStorageExtraInfo())
            return got.index(False) if False in got else len(got)
        pages = self.backend.batch_get(hashes, [self.pool.get_dummy_flat_data_page() for _ in hashes])
        n = 0
        for i, page in enumerate(pages):
            if page is None:
                break
            self.pool.set_from_flat_data_page(int(host_indices[i * self.page_size]), page)
            n += 1
        return n

    def _transfer(self, op: Prefetch) -> None:
        assert op.host_indices is not None
        for i in range(0, len(op.hit_hashes), STORAGE_BATCH_SIZE):
            batch = op.hit_hashes[i:i + STORAGE_BATCH_SIZE]
            idx = op.host_indices[i * self.page_size:(i + len(batch)) * self.page_size]
            n = self._page_get(batch, idx)
            op.completed_pages += n
            if n != len(batch):
                break
        self.io_acks.put(op)
