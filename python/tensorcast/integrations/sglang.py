"""SGLang HiCache on tensorcast: a storage backend for SGLang's hierarchical
cache, loaded by SGLang's ``dynamic`` storage backend with no code to write.

SGLang keeps KV pages in a host pool (its L2) and backs them up to, and
prefetches them from, a storage backend (its L3) in batches of at most 128
pages, each page under a hash chained from the previous one.
:class:`TensorcastStore` is that backend, with tensorcast's KV block store as
L3. Launch SGLang with one flag and an extra config naming this class::

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config \\
      '{"backend_name": "tensorcast", "module_path": "tensorcast.integrations.sglang",
        "class_name": "TensorcastStore", "interface_v1": 1, "allocator": "shm",
        "socket": "/run/tensorcast/tensorcastd.sock"}'

``interface_v1`` makes SGLang call ``batch_set_v1``/``batch_get_v1`` (pages
moved straight between its host pool and the store); without it SGLang calls
``batch_set``/``batch_get`` with copies of the pages; both store the same keys
and bytes, so either finds what the other wrote. ``allocator: shm`` makes
SGLang allocate its host pool in a memfd, which this backend registers with
the daemon (direct mode, below). The other keys of the extra config this
backend reads: ``socket``, ``key_prefix`` (default ``"sglang/"``),
``durable`` (puts answer once the pages are on L2), ``retry_interval``
(seconds between reconnection attempts) and ``call_timeout`` (seconds each
call may take before it answers a miss and the connection is dialled again;
default 60, 0 for no bound); the factory's keyword arguments override them.

Keys. Every pool SGLang registers (its KV pool, and for hybrid models the
Mamba, SWA, indexer and draft pools of ``register_mem_host_pool_v2``) gets a
layout fingerprint (:mod:`tensorcast.integrations.layout`) of the model, the
pool's name, layout, dtype, page size, head and layer counts, the byte size
of each of a page's buffers, and the ranks whose pages differ: TP rank and
size (except for the pools every TP rank holds alike, an MLA model's), PP
rank and size, and the attention-CP rank and size. A page is stored as one
object per buffer the pool's ``get_page_buffer_meta`` names for it (a K and
a V for an MHA pool in page_first layout, a K and a V per layer in
layer_first), under ``<key_prefix><model>/<fingerprint>:<hash>.<i>``. A page
written under another layout, rank or model is never a hit. Attention-DP
replicas share pages, as SGLang's file backend has them: each holds the same
heads of the same layers, so a prefix one computed is valid for the others
(the DP rank names the connection instead).

The older calls (``batch_set``/``batch_get``/``set``/``get``) take a page as
SGLang's flat data page (``get_data_page``) and store its buffers under the
same keys: the flat page lists them in address order for a pool in one
tensor, in the order of ``get_page_buffer_meta`` for one in several (Mamba).

The v2 calls (``batch_exists_v2``, ``batch_get_v2``, ``batch_set_v2``) take
``PoolTransfer`` lists: each transfer moves the pages of one named pool
(sidecar pools included: their host indices are the KV pool's), and
``batch_exists_v2`` applies each transfer's hit policy (``all_pages``: every
page of the KV prefix; ``trailing_pages``: only the last ``len(keys)``).

Direct mode: when the host pool lies in memory the daemon can map (SGLang's
``ShmHostTensorAllocator``, chosen by ``allocator: shm``, or
:class:`HostAllocator`), its memfds are registered as buffers of the
connection, so a set or a get is one call in which the daemon copies between
the store's blocks and the host pages themselves: no staging copy, and no
copy by this process. Otherwise (or when the daemon refuses a memfd, which
is logged) the pages are copied by libtensorcast through the store's queue,
still one copy each way.

One copy each way is the least a backup or a prefetch can cost: the store's
value must outlive the host page (SGLang frees and rewrites host pages
without telling its storage backend) and no client may change it once
stored, and a prefetch must land in the host pages SGLang chose, which the
GPU copies from (pinned for DMA: their memory cannot be swapped for the
store's). So direct mode moves each byte once, as a memcpy would (see
BENCHMARKS.md for what that bounds its speed to). The pages' addresses
come from the pool's layout (checked against its get_page_buffer_meta at
registration and on each call's first page) rather than from asking it page
by page.

Failures: a storage call never raises (an exception escaping it would end
HiCache's prefetch or backup thread for good). On a daemon error it answers a
miss, logs the outage once, and a later call reconnects (see
:class:`tensorcast.integrations._link.Link`); the host pool's memory is
registered with each new connection.

When SGLang is importable, :class:`TensorcastStore` is built on its
``HiCacheStorage`` (the factory checks that), and ``batch_exists_v2``
answers its ``PoolTransferResult``; otherwise it is duck-typed to the same
interface.
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import math
import mmap
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

from ..client import Client
from ..errors import Error, Status
from ._link import CALL_TIMEOUT, Link, call_timeout_option
from .layout import bind, fingerprint

try:  # SGLang's interface, when it is installed
    from sglang.srt.mem_cache import hicache_storage as _upstream
except ImportError:
    _upstream = None

__all__ = ["HostAllocator", "HostRegion", "PoolTransferResult", "TensorcastStore"]

log = logging.getLogger("tensorcast.integrations.sglang")

# Max pages per batched storage call in SGLang's HiCache.
STORAGE_BATCH_SIZE = 128

_STORED = (Status.OK, Status.ALREADY_EXISTS)

_Base: type = _upstream.HiCacheStorage if _upstream is not None else object


if _upstream is not None and hasattr(_upstream, "PoolTransferResult"):
    PoolTransferResult = _upstream.PoolTransferResult
else:
    @dataclass
    class PoolTransferResult:  # type: ignore[no-redef]
        """What ``batch_exists_v2`` answers: the usable KV prefix in pages,
        and the pages found of each pool by name."""

        kv_hit_pages: int
        extra_pool_hit_pages: Dict[str, int] = field(default_factory=dict)


def _name(pool_name: Any) -> str:
    """A pool's name as text (SGLang's PoolName is a str enum)."""
    return str(getattr(pool_name, "value", pool_name))


def _kv_name() -> Any:
    if _upstream is not None and hasattr(_upstream, "PoolName"):
        return _upstream.PoolName.KV
    return "kv"


class _Unsupported(Exception):
    """A call the registered pool cannot serve (logged once, a miss)."""


# -- memory the daemon can map -------------------------------------------------------


def _mapping_base(mm: mmap.mmap) -> int:
    probe = ctypes.c_char.from_buffer(mm)
    try:
        return ctypes.addressof(probe)
    finally:
        del probe


class HostRegion:
    """A memfd of this process, mapped here, that the daemon can map as a
    client buffer: registered with each connection (its segment id is per
    connection). Made by :class:`HostAllocator` (sealed against shrinking
    and growing), or found in SGLang's shared-memory allocator (unsealed: the
    daemon must accept it, see the module's doc)."""

    def __init__(self, size: int = 0, name: str = "tensorcast-host-pool", *, fd: Optional[int] = None,
                 mm: Optional[mmap.mmap] = None) -> None:
        if fd is not None and mm is not None:  # a mapping made elsewhere (SGLang's)
            self.fd, self.mm, self.size, self.sealed = fd, mm, len(mm), False
        else:
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
            self.sealed = True
        self.base = _mapping_base(self.mm)
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
    dtype, device)`` returns a CPU tensor over a sealed :class:`HostRegion`,
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


def _regions_of(allocator: Any) -> List[HostRegion]:
    """The memfds an allocator keeps: HostAllocator's regions, or the fds
    and mappings of SGLang's ShmHostTensorAllocator."""
    if isinstance(allocator, HostAllocator):
        return list(allocator.regions)
    fds, mms = getattr(allocator, "fds", None), getattr(allocator, "mms", None)
    if not isinstance(fds, list) or not isinstance(mms, list) or len(fds) != len(mms):
        return []
    return [HostRegion(fd=fd, mm=mm) for fd, mm in zip(fds, mms) if fd is not None and mm is not None]


# -- a pool's pages --------------------------------------------------------------------


class _Plan(NamedTuple):
    """How a pool's page is stored: one object per buffer of the page."""

    sizes: Tuple[int, ...]  # bytes of each buffer, in get_page_buffer_meta's order
    flat: Tuple[int, ...]  # where each lies in the pool's flat data page
    page_bytes: int
    by_address: bool  # the pool answers get_page_buffer_meta
    why_not: str = ""  # what it answered instead


@dataclass
class _Pool:
    name: str
    pool: Any
    page_size: int
    plan: _Plan
    fp: str
    prefix: bytes  # of its keys: key_prefix, model, fingerprint
    regions: List[HostRegion]
    # Where the pages' buffers lie, as an affine function of each page's
    # first token (see _affine), or None: the pool's own meta every call.
    affine: Optional[Tuple[Any, Any]] = None

    @property
    def parts(self) -> int:
        return len(self.plan.sizes)

    def keys(self, hashes: Sequence[Any]) -> List[bytes]:
        """The store keys of pages hashes: one per buffer of each page, in
        page order."""
        out = []
        n = self.parts
        for h in hashes:
            k = self.prefix + (h.encode() if isinstance(h, str) else bytes(h))
            if n == 1:
                out.append(k)
            else:
                out.extend(b"%s.%d" % (k, j) for j in range(n))
        return out


def _meta(pool: Any, host_indices: Any) -> Tuple[List[int], List[int]]:
    ptrs, sizes = pool.get_page_buffer_meta(host_indices)
    ptrs = [int(p) for p in ptrs]
    sizes = [int(sizes)] * len(ptrs) if isinstance(sizes, int) else [int(z) for z in sizes]
    if len(sizes) != len(ptrs):
        raise ValueError(f"the host pool named {len(ptrs)} buffers and {len(sizes)} sizes")
    return ptrs, sizes


def _affine(pool: Any, page_size: int, parts: int) -> Optional[Tuple[Any, Any]]:
    """(base, stride) numpy int64 arrays such that buffer j of the page
    whose first token is t lies at ``base[j] + t * stride[j]``, as every
    pool of SGLang's in one dense tensor lays its pages out; None when the
    pool's get_page_buffer_meta does not agree on every page (all are
    asked, once, at registration). The direct path then computes a call's
    addresses at once instead of asking the pool page by page, and checks
    them against the pool's meta for the call's first page each time (a
    mismatch ends the shortcut for the pool)."""
    import numpy
    import torch

    pages = int(getattr(pool, "size", 0) or 0) // page_size
    if pages < 2:
        return None

    def meta(ps: Sequence[int]) -> Any:
        idx = (torch.as_tensor(list(ps), dtype=torch.int64)[:, None] * page_size
               + torch.arange(page_size, dtype=torch.int64)).reshape(-1)
        ptrs, _ = _meta(pool, idx)
        if len(ptrs) != len(ps) * parts:
            raise ValueError(f"{len(ptrs)} buffers for {len(ps)} pages of {parts}")
        return numpy.array(ptrs, dtype=numpy.int64).reshape(len(ps), parts)

    first = meta([0, 1])
    step = first[1] - first[0]
    if (step % page_size).any():
        return None
    base, stride = first[0], step // page_size
    for lo in range(0, pages, 4096):
        check = range(lo, min(pages, lo + 4096))
        want = numpy.arange(check.start, check.stop, dtype=numpy.int64)[:, None] * page_size * stride + base
        if not numpy.array_equal(meta(check), want):
            return None
    return base, stride


def _plan(pool: Any, page_size: int) -> _Plan:
    """The page plan of pool, from the buffers of its first page."""
    import torch

    try:
        ptrs, sizes = _meta(pool, torch.arange(page_size, dtype=torch.int64))
    except Exception as e:  # noqa: BLE001 - a pool without zero-copy metadata (Mamba in layer_first)
        dummy = pool.get_dummy_flat_data_page()
        n = int(dummy.numel() * dummy.element_size())
        return _Plan((n,), (0,), n, False, f"{type(e).__name__}: {e}")
    if not ptrs or min(sizes) <= 0:
        raise ValueError(f"the host pool's page has buffers of {sizes} bytes")
    # The flat data page of a pool in one tensor is a slice of it: its
    # buffers in address order. A pool in several tensors concatenates them
    # in the order get_page_buffer_meta names them.
    kv = getattr(pool, "kv_buffer", None)
    one = False
    if hasattr(kv, "data_ptr") and hasattr(kv, "numel"):
        lo = int(kv.data_ptr())
        hi = lo + int(kv.numel()) * int(kv.element_size())
        one = all(lo <= p and p + z <= hi for p, z in zip(ptrs, sizes))
    order = sorted(range(len(ptrs)), key=lambda j: ptrs[j]) if one else list(range(len(ptrs)))
    flat = [0] * len(ptrs)
    off = 0
    for j in order:
        flat[j] = off
        off += sizes[j]
    return _Plan(tuple(sizes), tuple(flat), off, True)


def _nbytes(t: Any) -> int:
    return int(t.numel()) * int(t.element_size())


class TensorcastStore(_Base):  # type: ignore[misc,valid-type]
    """A HiCache storage backend on tensorcast's KV block store (see the
    module's doc).

    ``TensorcastStore(storage_config, kwargs)`` is how SGLang's factory
    makes it: storage_config is SGLang's ``HiCacheStorageConfig`` (or
    None), kwargs a dict of options (the extra config's keys). A host pool
    in kwargs' place (``TensorcastStore(config, mem_pool_host)``) is
    registered at once. Keyword arguments override both.
    """

    def __init__(self, storage_config: Any = None, kwargs: Any = None, *, socket: Optional[str] = None,
                 allocator: Optional[HostAllocator] = None, key_prefix: Optional[str] = None,
                 durable: Optional[bool] = None, retry_interval: Optional[float] = None,
                 logger: Optional[logging.Logger] = None) -> None:
        mem_pool = None
        options: Dict[str, Any] = dict(getattr(storage_config, "extra_config", None) or {})
        if isinstance(kwargs, dict):
            options.update(kwargs)
        elif kwargs is not None:
            mem_pool = kwargs  # the built-in backends' (storage_config, mem_pool_host)
        for k, v in (("socket", socket), ("key_prefix", key_prefix), ("durable", durable),
                     ("retry_interval", retry_interval)):
            if v is not None:
                options[k] = v
        self.log = logger or log
        self.storage_config = storage_config
        cfg = storage_config
        self.tp_rank, self.tp_size = int(getattr(cfg, "tp_rank", 0)), int(getattr(cfg, "tp_size", 1))
        self.pp_rank, self.pp_size = int(getattr(cfg, "pp_rank", 0)), int(getattr(cfg, "pp_size", 1))
        self.cp_rank = int(getattr(cfg, "attn_cp_rank", 0) or 0)
        self.cp_size = int(getattr(cfg, "attn_cp_size", 1) or 1)
        self.dp_rank = int(getattr(cfg, "dp_rank", 0) or 0)
        self.is_mla = bool(getattr(cfg, "is_mla_model", False))
        self.model = str(getattr(cfg, "model_name", None) or "")
        self.durable = bool(options.get("durable", False))
        prefix = str(options.get("key_prefix", "sglang/"))
        if self.model:
            # For people listing keys; the fingerprint has the whole name,
            # and a key has at most 256 bytes.
            prefix += "-".join(self.model.split("/"))[-64:] + "/"
        self._prefix = prefix.encode()
        self.allocator = allocator
        self.mem_pool_host: Any = None
        self.registered_pools: Dict[Any, Any] = {}
        # mu guards _pools, _regions, _refused and _once: pools are
        # registered by SGLang's scheduler thread while its storage threads
        # make calls.
        self._mu = threading.Lock()
        self._pools: Dict[str, _Pool] = {}
        self._regions: List[HostRegion] = []
        self._refused: Set[int] = set()  # fds the daemon refused (logged once each)
        self._once: Set[Tuple[str, str]] = set()  # what _log_once said
        # counters are added to by SGLang's storage threads at once: under
        # _cmu (_tally), so that no count is lost to another's.
        self._cmu = threading.Lock()
        self.counters: Dict[str, int] = {"pages_set": 0, "pages_set_failed": 0, "pages_got": 0, "pages_missed": 0,
                                         "exists_calls": 0, "pages_direct": 0, "pages_copied": 0}
        name = f"sglang-hicache-tp{self.tp_rank}-pp{self.pp_rank}-cp{self.cp_rank}-dp{self.dp_rank}"
        self._link = Link(options.get("socket"), name, self.log, on_connect=self._on_connect,
                          retry_interval=float(options.get("retry_interval", 1.0)),
                          call_timeout=call_timeout_option(options.get("call_timeout", CALL_TIMEOUT)))
        if mem_pool is not None:
            self.register_mem_pool_host(mem_pool)

    # -- host pools --------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Takes the engine's KV host pool (see :meth:`register_mem_host_pool_v2`)."""
        self.mem_pool_host = mem_pool_host
        self.register_mem_host_pool_v2(mem_pool_host, _kv_name())

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """Takes one of the engine's host pools by name: its page plan, its
        keys' fingerprint, and the memfds it lies in (direct mode). A pool
        whose pages cannot be described is logged and left out: its calls
        answer misses."""
        self.registered_pools[host_pool_name] = host_pool
        name = _name(host_pool_name)
        try:
            p = self._describe(name, host_pool)
        except Exception as e:  # noqa: BLE001 - a storage call never raises
            self.log.error("tensorcast: host pool %r left out: %s; its calls answer misses", name, e)
            return
        with self._mu:
            # One region per memfd, whichever pools lie in it.
            known = {r.fd: r for r in self._regions}
            p.regions = [known.setdefault(r.fd, r) for r in p.regions]
            self._regions = list(known.values())
            self._pools[name] = p
        self.log.info("tensorcast: host pool %r registered: pages of %d tokens stored as %d objects (%s), "
                      "fingerprint %s, %s", name, p.page_size, p.parts, "+".join(map(str, p.plan.sizes)), p.fp,
                      "in memfds the daemon maps (direct)" if p.regions else "copied by this process")
        if not p.plan.by_address:
            self.log.warning("tensorcast: host pool %r has no zero-copy page metadata (%s); its pages are copied "
                             "through its flat data pages", name, p.plan.why_not)
        c = self._link.client()  # dials now; on_connect registers every region
        if c is not None and p.regions:
            try:
                self._register(c)
            except Exception as e:  # noqa: BLE001 - a storage call never raises
                self._link.failed("register_mem_host_pool_v2", e, c)

    def _describe(self, name: str, pool: Any) -> _Pool:
        page_size = int(getattr(pool, "page_size", 1) or 1)
        plan = _plan(pool, page_size)
        replicated = self.is_mla and name != "mamba"  # MLA's KV is the same on every TP rank; Mamba state is not
        dtype = str(getattr(pool, "dtype", "")).replace("torch.", "")
        fields: Dict[str, Any] = dict(
            model=self.model, pool=name, layout=str(getattr(pool, "layout", "")), dtype=dtype, page_size=page_size,
            part_bytes=",".join(map(str, plan.sizes)), flat=",".join(map(str, plan.flat)),
            tp_rank=None if replicated else self.tp_rank, tp_size=None if replicated else self.tp_size,
            pp_rank=self.pp_rank, pp_size=self.pp_size, cp_rank=self.cp_rank, cp_size=self.cp_size)
        for attr in ("layer_num", "head_num", "head_dim", "kv_cache_dim"):
            v = getattr(pool, attr, None)
            if isinstance(v, int):
                fields[attr] = v
        fp = fingerprint(**fields)
        regions: List[HostRegion] = []
        alloc = self.allocator if self.allocator is not None else getattr(pool, "allocator", None)
        found = _regions_of(alloc) if alloc is not None else []
        affine = None
        if found and plan.by_address:
            import torch

            ptrs, sizes = _meta(pool, torch.arange(page_size, dtype=torch.int64))
            if all(any(r.contains(p, z) for r in found) for p, z in zip(ptrs, sizes)):
                regions = found
                try:
                    affine = _affine(pool, page_size, len(plan.sizes))
                except Exception as e:  # noqa: BLE001 - the pool's own meta then
                    self.log.info("tensorcast: host pool %r: page addresses asked of the pool each call (%s)", name, e)
        return _Pool(name, pool, page_size, plan, fp, self._prefix + bind(fp, "").encode(), regions, affine)

    def _register(self, c: Client) -> None:
        with self._mu:
            regions = list(self._regions)
        for r in regions:
            if r.client is c:
                continue
            try:
                r.register(c)
            except Error as e:
                if e.code < 0:
                    raise  # the connection failed: the dial did
                r.segment, r.client = None, None
                with self._mu:
                    first = r.fd not in self._refused
                    self._refused.add(r.fd)
                if first:
                    self.log.warning("tensorcast: the daemon refuses the host pool's memfd (%s%s); its pages are "
                                     "copied through the store's queue instead of by the daemon", e,
                                     "" if r.sealed else ", an unsealed memfd")

    @property
    def direct(self) -> bool:
        """Whether the KV pool's pages move by the daemon's copy on the
        current connection."""
        with self._mu:
            p = self._pools.get("kv")
        c = self._link.client()
        return bool(p and p.regions and c is not None and all(r.client is c and r.segment for r in p.regions))

    def _on_connect(self, c: Client) -> None:
        self._register(c)

    def _locate(self, c: Client, p: _Pool, ptrs: List[int],
                sizes: List[int]) -> Optional[List[Tuple[int, int, int]]]:
        """The extents of the host buffers in direct mode, or None (the copy
        path) when one is not in a region registered with c."""
        if not p.regions:
            return None
        out = []
        last = p.regions[0]
        for a, z in zip(ptrs, sizes):
            r = last if last.contains(a, z) else next((r for r in p.regions if r.contains(a, z)), None)
            if r is None or r.client is not c or r.segment is None:
                return None
            last = r
            out.append((r.segment, a - r.base, z))
        return out

    def _pool(self, name: str, what: str) -> Optional[_Pool]:
        with self._mu:
            p = self._pools.get(name)
        if p is None:
            self._log_once(what, f"no host pool registered as {name!r}")
        return p

    def _log_once(self, what: str, msg: str) -> None:
        with self._mu:
            first = (what, msg) not in self._once
            self._once.add((what, msg))
        if first:
            self.log.warning("tensorcast: %s: %s; answering misses (logged once)", what, msg)

    # -- moving pages ----------------------------------------------------------------

    def _by_address(self, c: Client, p: _Pool, hashes: Sequence[Any], host_indices: Any,
                    write: bool) -> List[bool]:
        """Moves pages hashes between the store and p's host pool at
        host_indices: True for each page moved whole."""
        n = len(hashes)
        if not p.plan.by_address:
            return self._by_flat_pages(c, p, hashes, host_indices, write)
        if host_indices is None or int(host_indices.numel()) != n * p.page_size:
            got = 0 if host_indices is None else int(host_indices.numel())
            raise _Unsupported(f"{got} host indices for {n} pages of {p.page_size} tokens")
        keys = p.keys(hashes)
        ext = self._extents_at(c, p, host_indices) if p.affine is not None else None
        if ext is not None:
            ptrs, sizes = [], []  # not needed: direct
        else:
            ptrs, sizes = _meta(p.pool, host_indices)
            if len(ptrs) != n * p.parts or sizes != list(p.plan.sizes) * n:
                raise _Unsupported(f"the host pool named {len(ptrs)} buffers for {n} pages of {p.parts}")
            ext = self._locate(c, p, ptrs, sizes)
        if write:
            if ext is not None:
                codes = c.store_put(keys, ext, durable=self.durable)
            else:
                codes = c.put_addresses(keys, ptrs, sizes, durable=self.durable)
            ok = [s in _STORED for s in codes]
        else:
            r = c.store_read(keys, ext) if ext is not None else c.get_addresses(keys, ptrs, sizes)
            want = list(p.plan.sizes) * n
            ok = [s == Status.OK and ln == z for s, ln, z in zip(r, r.lengths, want)]
        self._tally("pages_direct" if ext is not None else "pages_copied", n)
        return self._per_page(p, ok, n)

    def _extents_at(self, c: Client, p: _Pool, host_indices: Any) -> Any:
        """The direct path's extents of the pages at host_indices from p's
        affine layout, as an (n * parts, 3) uint64 array; None (the pool's
        meta, then) when a page does not start on a page boundary inside
        the pool, when its buffers are not in one region registered with c,
        or when the pool's meta disagrees for the first page (which ends
        the shortcut for p, logged)."""
        import numpy

        assert p.affine is not None
        base, stride = p.affine
        ps = p.page_size
        sel = host_indices[::ps]
        firsts = numpy.array(sel.tolist() if hasattr(sel, "tolist") else list(sel), dtype=numpy.int64)
        size = int(getattr(p.pool, "size", 0) or 0)
        if (firsts % ps).any() or int(firsts.min()) < 0 or int(firsts.max()) + ps > size:
            return None
        ptrs = (firsts[:, None] * stride + base).ravel()
        sizes = numpy.tile(numpy.array(p.plan.sizes, dtype=numpy.int64), len(firsts))
        real, _ = _meta(p.pool, host_indices[:ps])
        if [int(x) for x in ptrs[:p.parts]] != real:
            p.affine = None  # once: the pool's own meta from now on
            self.log.warning("tensorcast: host pool %r: a page's buffers are not where the layout the pool showed at "
                             "registration puts them; its addresses are asked of the pool from now on", p.name)
            return None
        if len(p.regions) != 1:
            return None
        r = p.regions[0]
        if r.client is not c or r.segment is None:
            return None
        if int(ptrs.min()) < r.base or int((ptrs + sizes).max()) > r.base + r.size:
            return None
        ext = numpy.empty((len(ptrs), 3), dtype=numpy.uint64)
        ext[:, 0] = r.segment
        ext[:, 1] = ptrs - r.base
        ext[:, 2] = sizes
        return ext

    def _by_flat_pages(self, c: Client, p: _Pool, hashes: Sequence[Any], host_indices: Any,
                       write: bool) -> List[bool]:
        """The pages of a pool without zero-copy metadata, through its flat
        data pages (copied here, as SGLang's own backends do)."""
        n = len(hashes)
        if host_indices is None or int(host_indices.numel()) != n * p.page_size:
            raise _Unsupported(f"host indices for {n} pages of {p.page_size} tokens expected")
        firsts = [int(host_indices[i * p.page_size]) for i in range(n)]
        if write:
            pages = [p.pool.get_data_page(i, flat=True).contiguous() for i in firsts]
            return self._flat(c, p, hashes, pages, True)
        pages = [p.pool.get_dummy_flat_data_page() for _ in firsts]
        ok = self._flat(c, p, hashes, pages, False)
        for i, good, page in zip(firsts, ok, pages):
            if good:
                p.pool.set_from_flat_data_page(i, page)
        return ok

    def _flat(self, c: Client, p: _Pool, hashes: Sequence[Any], pages: Sequence[Any], write: bool) -> List[bool]:
        """Moves pages hashes between the store and flat data pages (tensors
        of p's page size, or (address, bytes) pairs)."""
        n = len(hashes)
        plan = p.plan
        addrs = []
        for t in pages:
            a, z = (int(t[0]), int(t[1])) if isinstance(t, tuple) else (int(t.data_ptr()), _nbytes(t))
            if z != plan.page_bytes:
                raise _Unsupported(f"a page of {z} bytes where the pool's have {plan.page_bytes}")
            addrs.extend(a + off for off in plan.flat)
        sizes = list(plan.sizes) * n
        keys = p.keys(hashes)
        if write:
            ok = [s in _STORED for s in c.put_addresses(keys, addrs, sizes, durable=self.durable)]
        else:
            r = c.get_addresses(keys, addrs, sizes)
            ok = [s == Status.OK and ln == z for s, ln, z in zip(r, r.lengths, sizes)]
        self._tally("pages_copied", n)
        return self._per_page(p, ok, n)

    @staticmethod
    def _per_page(p: _Pool, ok: List[bool], n: int) -> List[bool]:
        m = p.parts
        return ok if m == 1 else [all(ok[i * m:(i + 1) * m]) for i in range(n)]

    def _tally(self, name: str, n: int) -> None:
        with self._cmu:
            self.counters[name] += n

    def _count(self, write: bool, ok: List[bool]) -> None:
        done = sum(ok)
        with self._cmu:
            if write:
                self.counters["pages_set"] += done
                self.counters["pages_set_failed"] += len(ok) - done
            else:
                self.counters["pages_got"] += done
                self.counters["pages_missed"] += len(ok) - done

    def _move(self, what: str, name: str, hashes: Sequence[Any], write: bool, host_indices: Any = None,
              pages: Optional[Sequence[Any]] = None) -> List[bool]:
        """One storage call moving pages of pool name; never raises."""
        n = len(hashes)
        if n == 0:
            return []
        p = self._pool(name, what)
        c = self._link.client() if p is not None else None
        if p is None or c is None:
            self._count(write, [False] * n)
            return [False] * n
        try:
            if pages is not None:
                ok = self._flat(c, p, hashes, pages, write)
            else:
                ok = self._by_address(c, p, hashes, host_indices, write)
        except _Unsupported as e:
            self._log_once(what, str(e))
            ok = [False] * n
        except Exception as e:  # noqa: BLE001 - a storage call never raises
            self._link.failed(what, e, c)
            ok = [False] * n
        self._count(write, ok)
        return ok

    # -- HiCacheStorage: the zero-copy calls -------------------------------------------

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """How many leading pages of keys are stored (every object of each)."""
        self._tally("exists_calls", 1)
        if not keys:
            return 0
        p = self._pool("kv", "batch_exists")
        c = self._link.client() if p is not None else None
        if p is None or c is None:
            return 0
        try:
            return c.lookup_prefix(p.keys(keys)) // p.parts
        except Exception as e:  # noqa: BLE001 - a storage call never raises
            self._link.failed("batch_exists", e, c)
            return 0

    def batch_set_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        """Stores the pages keys from the KV host pool at host_indices: True
        for each page now stored (by this call or before it)."""
        return self._move("batch_set_v1", "kv", keys, True, host_indices)

    def batch_get_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        """Reads the pages keys into the KV host pool at host_indices: True
        for each page read whole."""
        return self._move("batch_get_v1", "kv", keys, False, host_indices)

    # -- HiCacheStorage: the v2 calls ---------------------------------------------------

    def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[List[Any]] = None,
                        extra_info: Any = None) -> Any:
        """The usable KV prefix of keys in pages, shortened by each
        transfer's pool under its hit policy, and the pages found of each."""
        kv_pages = self.batch_exists(keys, extra_info)
        hits: Dict[Any, int] = {_kv_name(): kv_pages} if kv_pages else {}
        final = kv_pages
        for t in pool_transfers or []:
            if final == 0:
                break
            boundary = self._pool_hits(t, keys[:kv_pages])
            if boundary:
                hits[t.name] = boundary
            final = min(final, boundary)
        return PoolTransferResult(final, hits)

    def _pool_hits(self, t: Any, keys: List[str]) -> int:
        """How long a prefix of keys (all stored in the KV pool) t's pool
        can serve under t's hit policy."""
        name = _name(t.name)
        p = self._pool(name, "batch_exists_v2")
        c = self._link.client() if p is not None else None
        if p is None or c is None:
            return 0
        try:
            found = c.exists(p.keys(keys))
        except Exception as e:  # noqa: BLE001 - a storage call never raises
            self._link.failed("batch_exists_v2", e, c)
            return 0
        present = self._per_page(p, found, len(keys))
        if _name(getattr(t, "hit_policy", "all_pages")) != "trailing_pages":
            return present.index(False) if False in present else len(present)
        # Only the last `trailing` pages of the prefix must be there: the
        # longest prefix whose tail window is all present.
        trailing = max(1, len(t.keys) if getattr(t, "keys", None) else 1)
        run = 0
        runs = []
        for ok in present:
            run = run + 1 if ok else 0
            runs.append(run)
        for end in range(len(present), 0, -1):
            if runs[end - 1] >= min(trailing, end):
                return end
        return 0

    def batch_get_v2(self, transfers: List[Any], extra_info: Any = None) -> Dict[Any, List[bool]]:
        """Reads each transfer's pages (keys) into its pool at its host
        indices: the per-page results by pool name."""
        return {t.name: self._move("batch_get_v2", _name(t.name), getattr(t, "keys", None) or [], False,
                                   getattr(t, "host_indices", None)) for t in transfers}

    def batch_set_v2(self, transfers: List[Any], extra_info: Any = None) -> Dict[Any, List[bool]]:
        """Stores each transfer's pages (keys) from its pool at its host
        indices: the per-page results by pool name."""
        return {t.name: self._move("batch_set_v2", _name(t.name), getattr(t, "keys", None) or [], True,
                                   getattr(t, "host_indices", None)) for t in transfers}

    # -- HiCacheStorage: the calls on flat data pages ---------------------------------

    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        """Stores pages given as flat data pages (tensors, or addresses with
        target_sizes): True when every page is stored."""
        if not keys:
            return False
        pages = self._pages(keys, values, target_locations, target_sizes)
        return pages is not None and all(self._move("batch_set", "kv", keys, True, pages=pages))

    def batch_get(self, keys: List[str], target_locations: Any = None, target_sizes: Any = None) -> Any:
        """Reads pages into flat data pages: for tensors, the list of those
        read (None for each miss); for addresses with target_sizes, how many
        leading pages were read."""
        pages = self._pages(keys, None, target_locations, target_sizes)
        if pages is None:
            return 0 if target_sizes is not None else [None] * len(keys)
        ok = self._move("batch_get", "kv", keys, False, pages=pages)
        if target_sizes is not None:
            return ok.index(False) if False in ok else len(ok)
        return [t if good else None for t, good in zip(target_locations, ok)]

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return self.batch_set([key], None if value is None else [value],
                              None if target_location is None else [target_location],
                              None if target_sizes is None else [target_sizes])

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        """One page into target_location: the tensor (None on a miss), or
        True or False for an address with target_sizes."""
        if target_location is None:
            return None
        got = self.batch_get([key], [target_location], None if target_sizes is None else [target_sizes])
        return got == 1 if target_sizes is not None else got[0]

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def _pages(self, keys: Sequence[str], values: Any, targets: Any, sizes: Any) -> Optional[List[Any]]:
        """The flat pages of an older call: tensors, or (address, bytes);
        None (logged once) for anything else."""
        try:
            return self._page_list(keys, values, targets, sizes)
        except Exception as e:  # noqa: BLE001 - a storage call never raises
            self._log_once("set/get", f"pages it cannot take ({type(e).__name__}: {e})")
            return None

    def _page_list(self, keys: Sequence[str], values: Any, targets: Any, sizes: Any) -> Optional[List[Any]]:
        n = len(keys)
        if values is not None and len(values) == n and all(v is not None for v in values):
            return [v if v.is_contiguous() else v.contiguous() for v in values]
        if targets is not None and len(targets) == n:
            if sizes is not None and len(sizes) == n:
                return [(int(a), int(z)) for a, z in zip(targets, sizes)]
            if all(hasattr(t, "data_ptr") and t.is_contiguous() for t in targets):
                return list(targets)
        self._log_once("set/get", "pages neither as contiguous tensors nor as addresses with sizes")
        return None

    # -- the rest ----------------------------------------------------------------------

    def clear(self) -> None:
        """Removes every page of this backend's pools (their fingerprints)
        from the store (pinned or busy ones stay)."""
        c = self._link.client()
        if c is None:
            return
        with self._mu:
            prefixes = [p.prefix for p in self._pools.values()]
        try:
            for prefix in prefixes:
                after = b""
                while True:
                    infos, more = c.list_keys(prefix, after, 1024)
                    if infos:
                        c.remove([i.key for i in infos])
                        after = infos[-1].key
                    if not more or not infos:
                        break
        except Exception as e:  # noqa: BLE001 - a storage call never raises
            self._link.failed("clear", e, c)

    def get_stats(self) -> None:
        """SGLang's storage metrics are not kept here (see ``counters``)."""
        return None

    def close(self) -> None:
        self._link.close()
