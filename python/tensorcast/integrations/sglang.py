"""SGLang HiCache on tensorcast: a storage backend with the shape of SGLang's
``HiCacheStorage`` (``sglang.srt.mem_cache.hicache_storage``) and a host
allocator with the shape of its ``HostTensorAllocator``.

SGLang's HiCache keeps KV pages in a host pool (its L2) and backs them up to,
and prefetches them from, a storage backend (its L3) in batches of pages,
each page under a key chained from the previous one. :class:`TensorcastStore`
is that backend, with tensorcast's KV block store as L3:

- ``batch_exists(keys)`` is one ``lookup_prefix`` through the store's queue:
  how many leading pages are stored.
- ``batch_set_v1(keys, host_indices)`` and ``batch_get_v1(keys,
  host_indices)`` move the pages between the host pool (located with the
  pool's ``get_page_buffer_meta``) and the store: one key per page
  component (a K and a V key per page for MHA pools), a list of bool per
  page.

Direct mode: when the host pool was allocated by :class:`HostAllocator`
(SGLang's allocator-backed mode), the pool lives in a sealed memfd that the
daemon maps as a buffer of the connection, so a set or a get is one call in
which the daemon copies between the store's blocks and the host pages
themselves: no staging copy, and no copy by this process. Without it, the
pages are copied by libtensorcast through the queue (reserve, copy, commit;
get, copy, unpin), still one copy each way.

Failures: a storage call never raises (an exception escaping it would end
HiCache's prefetch or backup thread for good). On a daemon error it answers a
miss (0, False), logs the outage once, and a later call reconnects (see
:class:`tensorcast.integrations._link.Link`); the allocator's memory is
registered with each new connection.

SGLang itself is not imported: the host pool is duck-typed (``page_size``,
``kv_buffer``, ``get_page_buffer_meta(indices) -> (pointers, sizes)``).
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import math
import mmap
import os
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..client import Client
from ..errors import Status
from ._link import Link

__all__ = ["HostAllocator", "HostRegion", "TensorcastStore"]

log = logging.getLogger("tensorcast.integrations.sglang")

# Max pages per batched storage call in SGLang's HiCache.
STORAGE_BATCH_SIZE = 128

_STORED = (Status.OK, Status.ALREADY_EXISTS)


class HostRegion:
    """A sealed memfd of this process, mapped here, that the daemon can map
    as a client buffer: register it with each connection (its segment id is
    per connection)."""

    def __init__(self, size: int, name: str = "tensorcast-host-pool") -> None:
        if size <= 0:
            raise ValueError(f"a host region of {size} bytes")
        self.size = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, self.size)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
            self.mm = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self.fd)
            raise
        probe = ctypes.c_char.from_buffer(self.mm)
        self.base = ctypes.addressof(probe)
        del probe
        self.segment: Optional[int] = None  # on the client it was registered with last
        self.client: Optional[Client] = None

    def register(self, client: Client) -> int:
        self.segment = client.register_fd(self.fd, self.size)
        self.client = client
        return self.segment

    def contains(self, addr: int, length: int) -> bool:
        return self.base <= addr and addr + length <= self.base + self.size


class HostAllocator:
    """The shape of SGLang's ``HostTensorAllocator``: ``allocate(dims,
    dtype, device)`` returns a CPU tensor, here over a :class:`HostRegion`,
    so that a host pool allocated by it is memory the daemon maps (put it in
    the host pool's ``allocator``, or pass it to :class:`TensorcastStore`)."""

    def __init__(self) -> None:
        self.dtype: Any = None
        self.dims: Optional[Tuple[int, ...]] = None
        self.regions: List[HostRegion] = []
        self._mu = threading.Lock()

    def allocate(self, dims: Tuple[int, ...], dtype: Any, device: str = "cpu") -> Any:
        import torch

        if device != "cpu":
            raise ValueError(f"HostAllocator allocates CPU memory; got device={device!r}")
        self.dims, self.dtype = tuple(dims), dtype
        n = math.prod(dims) * torch.empty([], dtype=dtype).element_size()
        region = HostRegion(max(n, 1))
        with self._mu:
            self.regions.append(region)
        t = torch.frombuffer(region.mm, dtype=torch.uint8, count=n) if n else torch.empty(0, dtype=torch.uint8)
        return t.view(dtype).view(dims)

    def find(self, addr: int, length: int) -> Optional[HostRegion]:
        for r in self.regions:
            if r.contains(addr, length):
                return r
        return None


def _extra(storage_config: Any) -> Dict[str, Any]:
    return dict(getattr(storage_config, "extra_config", None) or {})


class TensorcastStore:
    """A HiCache storage backend on tensorcast's KV block store (see the
    module's doc).

    storage_config is SGLang's ``HiCacheStorageConfig`` (or None): its
    model name and, unless the model is MLA (whose KV every TP rank shares),
    its TP rank and size go into the keys, and its ``extra_config`` may set
    ``socket``, ``key_prefix`` (default ``"sglang/"``), ``durable`` (puts
    that return once on L2) and ``retry_interval`` (seconds between
    reconnection attempts). Keyword arguments override them.
    """

    def __init__(self, storage_config: Any = None, mem_pool: Any = None, *, socket: Optional[str] = None,
                 allocator: Optional[HostAllocator] = None, key_prefix: Optional[str] = None,
                 durable: Optional[bool] = None, retry_interval: Optional[float] = None,
                 logger: Optional[logging.Logger] = None) -> None:
        extra = _extra(storage_config)
        self.log = logger or log
        self.durable = bool(extra.get("durable", False) if durable is None else durable)
        prefix = key_prefix if key_prefix is not None else str(extra.get("key_prefix", "sglang/"))
        model = getattr(storage_config, "model_name", None)
        if model:
            prefix += "-".join(str(model).split("/")) + "/"
        self._prefix = prefix.encode()
        suffix = ""
        if storage_config is not None and not getattr(storage_config, "is_mla_model", False):
            suffix = f"@{storage_config.tp_rank}.{storage_config.tp_size}"
            if getattr(storage_config, "pp_size", 1) > 1:
                suffix += f"p{storage_config.pp_rank}.{storage_config.pp_size}"
        self._suffix = suffix.encode()
        self.allocator = allocator
        self.mem_pool_host: Any = None
        self.page_size = 1
        self._parts = 1  # storage objects per page (2 for an MHA pool's K and V)
        self.direct = False
        self.counters: Dict[str, int] = {"pages_set": 0, "pages_set_failed": 0, "pages_got": 0, "pages_missed": 0,
                                         "exists_calls": 0}
        self._link = Link(socket if socket is not None else extra.get("socket"), "sglang-hicache", self.log,
                          on_connect=self._on_connect,
                          retry_interval=float(extra.get("retry_interval", 1.0) if retry_interval is None
                                               else retry_interval))
        if mem_pool is not None:
            self.register_mem_pool_host(mem_pool)

    # -- the host pool ---------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Takes the engine's host pool: its page size, how many storage
        objects a page has, and whether it lies in memory the daemon maps
        (direct mode)."""
        self.mem_pool_host = mem_pool_host
        self.page_size = int(getattr(mem_pool_host, "page_size", 1) or 1)
        alloc = self.allocator
        if alloc is None and isinstance(getattr(mem_pool_host, "allocator", None), HostAllocator):
            alloc = mem_pool_host.allocator
        self.allocator = alloc
        import torch

        ptrs, _ = self._meta(torch.arange(self.page_size, dtype=torch.int64))
        self._parts = max(1, len(ptrs))
        kv = getattr(mem_pool_host, "kv_buffer", None)
        self.direct = bool(alloc is not None and kv is not None and hasattr(kv, "data_ptr") and
                           alloc.find(int(kv.data_ptr()), kv.numel() * kv.element_size()) is not None)
        self.log.info("tensorcast: host pool registered: page of %d tokens, %d storage objects per page, %s",
                      self.page_size, self._parts,
                      "direct (the daemon copies to and from the host pages)" if self.direct
                      else "copied by this process through the store's queue")
        c = self._link.client()  # dials now; the allocator's regions are registered with it
        if c is not None and self.direct:
            try:
                self._register(c)
            except Exception as e:  # noqa: BLE001 - a storage call never raises
                self._link.failed("register_mem_pool_host", e, c)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        if not hasattr(self, "registered_pools"):
            self.registered_pools: Dict[Any, Any] = {}
        self.registered_pools[host_pool_name] = host_pool

    def _register(self, c: Client) -> None:
        if self.allocator is None:
            return
        for r in self.allocator.regions:
            if r.client is not c:
                r.register(c)

    def _on_connect(self, c: Client) -> None:
        if self.direct:
            self._register(c)

    def _meta(self, host_indices: Any) -> Tuple[List[int], List[int]]:
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        ptrs = [int(p) for p in ptrs]
        if isinstance(sizes, int):
            sizes = [sizes] * len(ptrs)
        else:
            sizes = [int(z) for z in sizes]
        return ptrs, sizes

    # -- keys ----------------------------------------------------------------------

    def _page_keys(self, keys: Sequence[str]) -> List[bytes]:
        """The storage keys of pages keys: one per storage object of each
        page, in page order."""
        base = [self._prefix + (k.encode() if isinstance(k, str) else bytes(k)) + self._suffix for k in keys]
        if self._parts == 1:
            return base
        tags = [b".k", b".v"] if self._parts == 2 else [b".%d" % j for j in range(self._parts)]
        return [b + t for b in base for t in tags]

    def _per_page(self, ok: List[bool], n: int) -> List[bool]:
        m = self._parts
        return [all(ok[i * m:(i + 1) * m]) for i in range(n)]

    def _locate(self, c: Client, ptrs: List[int], sizes: List[int]) -> Optional[List[Tuple[int, int, int]]]:
        """The extents of the host pages in direct mode, or None (the copy
        path) when one is not in a region registered with c."""
        alloc = self.allocator
        if not self.direct or alloc is None:
            return None
        out = []
        for p, z in zip(ptrs, sizes):
            r = alloc.find(p, z)
            if r is None or r.client is not c or r.segment is None:
                return None
            out.append((r.segment, p - r.base, z))
        return out

    # -- HiCacheStorage: batches -----------------------------------------------------

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """How many leading pages of keys are stored (every storage object
        of each)."""
        self.counters["exists_calls"] += 1
        if not keys:
            return 0
        c = self._link.client()
        if c is None:
            return 0
        try:
            found = c.lookup_prefix(self._page_keys(keys))
        except Exception as e:  # noqa: BLE001 - a storage call never raises
            self._link.failed("batch_exists", e, c)
            return 0
        return found // self._parts

    def _pages(self, c: Any, keys: List[str], host_indices: Any):
        """The object keys of pages keys, their buffers in the host pool at
        host_indices, and those buffers as pool extents when they lie in
        memory the daemon knows (else None: the calls then go by address)."""
        pk = self._page_keys(keys)
        ptrs, sizes = self._meta(host_indices)
        if len(ptrs) != len(pk):
            raise ValueError(f"{len(ptrs)} page buffers for {len(keys)} pages of {self._parts} objects")
        return pk, ptrs, sizes, self._locate(c, ptrs, sizes)

    def batch_set_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        """Stores the pages keys from the host pool at host_indices: True for
        each page now stored (by this call or before it)."""
        n = len(keys)
        if n == 0:
            return []
        c = self._link.client()
        if c is None:
            self.counters["pages_set_failed"] += n
            return [False] * n
        try:
            pk, ptrs, sizes, ext = self._pages(c, keys, host_indices)
            if ext is not None:
                codes = c.store_put(pk, ext, durable=self.durable)
            else:
                codes = c.put_addresses(pk, ptrs, sizes, durable=self.durable)
        except Exception as e:  # noqa: BLE001 - a storage call never raises
            self._link.failed("batch_set_v1", e, c)
            self.counters["pages_set_failed"] += n
            return [False] * n
        out = self._per_page([s in _STORED for s in codes], n)
        done = sum(out)
        self.counters["pages_set"] += done
        self.counters["pages_set_failed"] += n - done
        return out

    def batch_get_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        """Reads the pages keys into the host pool at host_indices: True for
        each page read whole."""
        n = len(keys)
        if n == 0:
            return []
        c = self._link.client()
        if c is None:
            self.counters["pages_missed"] += n
            return [False] * n
        try:
            pk, ptrs, sizes, ext = self._pages(c, keys, host_indices)
            if ext is not None:
                r = c.store_read(pk, ext)
            else:
                r = c.get_addresses(pk, ptrs, sizes)
        except Exception as e:  # noqa: BLE001 - a storage call never raises
            self._link.failed("batch_get_v1", e, c)
            self.counters["pages_missed"] += n
            return [False] * n
        out = self._per_page([s == Status.OK and ln == z for s, ln, z in zip(r, r.lengths, sizes)], n)
        got = sum(out)
        self.counters["pages_got"] += got
        self.counters["pages_missed"] += n - got
        return out

    # -- HiCacheStorage: the older calls ----------------------------------------------

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        """One page: into the tensor target_location (returned; None on a
        miss), or into raw memory at target_location of target_sizes bytes
        (True or False)."""
        return self._get_one(key, target_location, target_sizes)

    def batch_get(self, keys: List[str], target_locations: Any = None, target_sizes: Any = None) -> Any:
        """Tensors: a list of the tensors read (None for a miss). Raw
        memory (target_sizes given): the number of leading keys read."""
        if target_sizes is not None:
            ok = [self._get_one(k, a, z) is True for k, a, z in zip(keys, target_locations, target_sizes)]
            return ok.index(False) if False in ok else len(ok)
        return [self._get_one(k, t, None) for k, t in zip(keys, target_locations or [None] * len(keys))]

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return self._set_many([key], [value], [target_location], [target_sizes])[0]

    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        n = len(keys)
        if n == 0:
            return False
        return all(self._set_many(keys, values or [None] * n, target_locations or [None] * n,
                                  target_sizes or [None] * n))

    def _object_keys(self, keys: Sequence[str]) -> List[bytes]:
        return [self._prefix + (k.encode() if isinstance(k, str) else bytes(k)) + self._suffix for k in keys]

    def _get_one(self, key: str, target: Any, size: Any) -> Any:
        c = self._link.client()
        if c is None:
            return None if size is None else False
        try:
            k = self._object_keys([key])
            if size is None:
                if target is None:
                    return None
                r = c.get(k, [target])
                return target if r[0] == Status.OK else None
            r = c.get_addresses(k, [int(target)], [int(size)])
            return r[0] == Status.OK
        except Exception as e:  # noqa: BLE001 - a storage call never raises
            self._link.failed("get", e, c)
            return None if size is None else False

    def _set_many(self, keys: Sequence[str], values: Sequence[Any], targets: Sequence[Any],
                  sizes: Sequence[Any]) -> List[bool]:
        n = len(keys)
        c = self._link.client()
        if c is None:
            return [False] * n
        try:
            k = self._object_keys(keys)
            if all(v is not None for v in values):
                codes = c.put(k, list(values), durable=self.durable)
            else:
                codes = c.put_addresses(k, [int(t) for t in targets], [int(z) for z in sizes], durable=self.durable)
        except Exception as e:  # noqa: BLE001 - a storage call never raises
            self._link.failed("set", e, c)
            return [False] * n
        return [s in _STORED for s in codes]

    # -- the rest ----------------------------------------------------------------------

    def clear(self) -> None:
        """Removes every key of this backend's prefix and suffix from the
        store (pinned or busy ones stay)."""
        c = self._link.client()
        if c is None:
            return
        try:
            after = b""
            while True:
                infos, more = c.list_keys(self._prefix, after, 1024)
                mine = [i.key for i in infos if self._suffix in i.key[len(self._prefix):]]
                if mine:
                    c.remove(mine)
                if not more or not infos:
                    break
                after = infos[-1].key
        except Exception as e:  # noqa: BLE001
            self._link.failed("clear", e, c)

    def get_stats(self) -> None:
        """SGLang's storage metrics are not kept here (see ``counters``)."""
        return None

    def close(self) -> None:
        self._link.close()
