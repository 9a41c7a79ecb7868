"""vLLM's worker side of tensorcast offloading: handlers that copy blocks
between one worker's KV cache tensors and the daemon's pool.

:class:`TensorcastOffloadingSpec` builds one :class:`Handlers` per worker.
Up to vLLM 0.24 (``get_handlers``), vLLM's offloading worker registers its
``store`` handler for (GPU spec -> TensorcastLoadStoreSpec) transfers and
its ``load`` handler for the other way, calls ``transfer_async(job_id,
(src, dst))`` and collects ``get_finished()``; from 0.25 (``get_worker``)
its ``worker`` takes ``submit_store`` and ``submit_load``. Results are
vLLM's TransferResults, or ``(job_id, success)`` pairs on a vLLM without
them.

The worker's part of an offloaded block's value (see
:mod:`tensorcast.integrations.vllm`) starts at ``rank * rank_bytes`` (at 0
in a replicated layout, whose store jobs only rank 0 copies); in it,
the worker's KV tensors follow one another in their order, each with the
block's ``factor`` GPU blocks one after the other. A job's GPU block ids
name those GPU blocks, block after block; a load may start inside its first
offloaded block (vLLM has its first GPU blocks already), so it skips that
many leading GPU blocks of the first value.

Copies: on CPU tensors, one memcpy per tensor and run of consecutive GPU
blocks, between the tensors and the pool mapping, done when
``transfer_async`` returns. On CUDA, the pool mapping is registered with the
CUDA runtime once per connection (so the copies are DMA), and each job runs
on the handlers' own stream: a store first waits for the compute stream (the
model's writes), gathers the blocks on the GPU and copies each block's part
to the pool; a load copies each part in and scatters it to the blocks; the
job is finished when its event has passed.

Failures: nothing here raises into vLLM. A job that cannot be done (the
daemon away, the pool of the scheduler's spec not the one this worker maps,
a block that is missing, ids that do not fit) is reported finished without
success; vLLM then aborts the store or recomputes the blocks. The daemon's
outage is logged once and the next job reconnects.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import fields
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np
import torch

from ..client import Client
from ._link import CALL_TIMEOUT, Link
from .vllm import MEDIUM, BlockLayout, TensorcastLoadStoreSpec, _module

__all__ = ["GPULoadStoreSpec", "Handlers", "kv_block_tensors"]

log = logging.getLogger("tensorcast.integrations.vllm")


# Up to 0.21 vLLM keeps the GPU spec in mediums; up to 0.24 its handlers and
# TransferResult in worker.worker; base holds what moved.
_base = _module("vllm.v1.kv_offload.base")
_mediums = _module("vllm.v1.kv_offload.mediums") or _base
_handlers = _module("vllm.v1.kv_offload.worker.worker")
_HandlerBase: Any = getattr(_handlers, "OffloadingHandler", object)
# From 0.25, one OffloadingWorker per spec, with a method per direction.
_WorkerBase: Any = getattr(_base, "OffloadingWorker", None)
if _WorkerBase is None or not hasattr(_WorkerBase, "submit_store"):
    _WorkerBase = object
_TransferResult: Any = getattr(_handlers, "TransferResult", None) or getattr(_base, "TransferResult", None)


class _GPULoadStoreSpec:
    """vLLM's GPULoadStoreSpec, where vLLM is not importable."""

    def __init__(self, block_ids: Sequence[int], group_sizes: Optional[Sequence[int]] = None,
                 block_indices: Optional[Sequence[int]] = None) -> None:
        self.block_ids = np.asarray(block_ids, dtype=np.int64)
        self.group_sizes = group_sizes
        self.block_indices = block_indices

    @staticmethod
    def medium() -> str:
        return "GPU"


GPULoadStoreSpec: Any = getattr(_mediums, "GPULoadStoreSpec", _GPULoadStoreSpec)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t, shaped (num_blocks, ...), as (num_blocks, block bytes) uint8
    over the same memory; ValueError when a block's bytes are not
    contiguous."""
    r = t.flatten(1) if t.dim() > 1 else t.unsqueeze(1)
    if r.data_ptr() != t.data_ptr() or (r.shape[1] > 1 and r.stride(1) != 1):
        raise ValueError(f"tensorcast: a KV cache tensor {tuple(t.shape)} whose blocks are not contiguous")
    return r.view(torch.uint8) if r.dtype != torch.uint8 else r


def _blocks_dim(backend: Any) -> int:
    """Which dimension of the backend's KV cache shape counts blocks."""
    probe = 1000003
    try:
        shape = tuple(backend.get_kv_cache_shape(num_blocks=probe, block_size=16, num_kv_heads=1, head_size=64))
    except Exception:  # noqa: BLE001 - a backend that cannot say: the first
        return 0
    return shape.index(probe) if probe in shape else 0


def kv_block_tensors(kv_caches: Any, attn_backends: Any = None) -> List[torch.Tensor]:
    """The worker's KV cache as (num_blocks, block bytes) uint8 views, in
    vLLM's order, each distinct memory once: from vLLM's canonical KV caches
    (``.tensors[i].tensor``), a dict of layer name to tensor (with the
    layers' attention backends to find the blocks' dimension), or a list of
    (num_blocks, ...) tensors."""
    if hasattr(kv_caches, "tensors"):
        ts = [getattr(ct, "tensor", ct) for ct in kv_caches.tensors]
    elif isinstance(kv_caches, dict):
        ts = []
        for name, t in kv_caches.items():
            backend = (attn_backends or {}).get(name) if isinstance(attn_backends, dict) else attn_backends
            dim = _blocks_dim(backend) if backend is not None else (1 if t.dim() >= 3 and t.shape[0] == 2 else 0)
            if dim == 0:
                ts.append(t)
            elif dim == 1:
                ts.extend(t.unbind(0))  # K and V, each (num_blocks, ...)
            else:
                raise ValueError(f"tensorcast: layer {name}: blocks at dimension {dim} of {tuple(t.shape)}")
    else:
        ts = list(kv_caches)
    out: List[torch.Tensor] = []
    seen: Set[Tuple[int, int]] = set()
    for t in ts:
        r = _rows(t)
        k = (r.data_ptr(), r.shape[0])
        if k not in seen:  # a tensor layers share is one
            seen.add(k)
            out.append(r)
    if not out:
        raise ValueError("tensorcast: no KV cache tensors")
    return out


class _Job:
    __slots__ = ("job_id", "store", "size", "t0", "event", "keep")

    def __init__(self, job_id: int, store: bool, size: int, t0: float, event: Any = None, keep: Any = None) -> None:
        self.job_id, self.store, self.size, self.t0, self.event, self.keep = job_id, store, size, t0, event, keep


def _result(job_id: int, ok: bool, size: int, secs: float, store: bool) -> Any:
    if _TransferResult is None:
        return (job_id, ok)
    kw: Dict[str, Any] = {"job_id": job_id, "success": ok, "transfer_size": size, "transfer_time": secs,
                          "transfer_type": ("GPU", MEDIUM) if store else (MEDIUM, "GPU")}
    names = {f.name for f in fields(_TransferResult)}
    return _TransferResult(**{k: v for k, v in kw.items() if k in names})


class Handlers:
    """The copies of one worker (see the module's doc): ``store`` and
    ``load`` are vLLM's OffloadingHandlers for the two directions."""

    def __init__(self, kv_caches: Any, block: BlockLayout, *, rank: int = 0, socket: Optional[str] = None,
                 attn_backends: Any = None, retry_interval: float = 1.0,
                 logger: Optional[logging.Logger] = None, call_timeout: Optional[float] = CALL_TIMEOUT) -> None:
        if not 0 <= rank < block.world_size:
            raise ValueError(f"tensorcast: rank {rank} of a world of {block.world_size}")
        self.block = block
        self.rank = rank
        self.log = logger or log
        self.tensors = kv_block_tensors(kv_caches, attn_backends)
        self.pages = [int(t.shape[1]) for t in self.tensors]
        per_gpu_block = sum(self.pages)
        self.part_bytes = per_gpu_block * block.factor  # this worker's bytes of one offloaded block
        if self.part_bytes > block.rank_bytes:
            raise ValueError(f"tensorcast: this worker's KV tensors hold {self.part_bytes} bytes per offloaded "
                             f"block, more than the {block.rank_bytes} of the engine's layout")
        if self.part_bytes < block.rank_bytes:
            self.log.info("tensorcast: rank %d uses %d of the %d bytes per block of its part", rank,
                          self.part_bytes, block.rank_bytes)
        # starts[i]: where tensor i's rows of a block begin in this rank's part.
        self.starts = [block.factor * sum(self.pages[:i]) for i in range(len(self.pages))]
        # A replicated block is one copy: rank 0 writes it, every rank reads it.
        self.base = 0 if block.replicated else rank * block.rank_bytes
        self.writes = not block.replicated or rank == 0
        # On CPU the copies are numpy's (a memcpy per run of blocks, with
        # far less overhead per call than torch's): the tensors' rows as
        # arrays over the same memory.
        self.arrays = [t.numpy() for t in self.tensors] if self.tensors[0].device.type == "cpu" else []
        self.device = self.tensors[0].device
        self.cuda = self.device.type == "cuda"
        self._stream = torch.cuda.Stream(self.device) if self.cuda else None
        # mu guards the fields below and serializes the jobs' submission.
        self._mu = threading.Lock()
        self._client: Optional[Client] = None
        self._pool: Optional[torch.Tensor] = None
        self._pool_np: Optional[np.ndarray] = None
        self._registered: Optional[int] = None  # the pool's address while registered with CUDA
        self._pending: List[_Job] = []
        self._done: Dict[bool, List[Any]] = {True: [], False: []}
        self._seen: Set[str] = set()
        self._link = Link(socket, f"vllm-worker-{rank}", self.log, retry_interval=retry_interval,
                          call_timeout=call_timeout)
        self.store = _Handler(self, True)
        self.load = _Handler(self, False)
        self.worker = _Worker(self)

    # -- the pool ----------------------------------------------------------------------

    def _once(self, what: str, msg: str, *args: Any) -> None:
        if what not in self._seen:
            self._seen.add(what)
            self.log.warning("tensorcast: " + msg + " (logged once)", *args)

    def _unregister(self) -> None:
        if self._registered is not None:
            torch.cuda.cudart().cudaHostUnregister(self._registered)
            self._registered = None

    def _pool_of(self, identity: Optional[Tuple[int, int]]) -> Optional[torch.Tensor]:
        """The pool the spec's offsets are in, as a uint8 tensor over this
        worker's mapping; None when this worker cannot reach it."""
        c = self._link.client()
        if c is not None and identity is not None and c.pool.identity != identity:
            # Either the daemon restarted since this worker dialed (its
            # connection is broken: dial the new one) or the spec is older
            # than the daemon this worker reaches (fail the job).
            try:
                c.ping()
            except Exception as e:  # noqa: BLE001
                self._link.failed("ping", e, c)
                c = self._link.client()
        if c is None:
            return None
        if identity is not None and c.pool.identity != identity:
            self._once("pool", "a job names a pool this worker does not map (the daemon restarted between "
                       "the scheduler's call and the job); failing such jobs")
            return None
        if c is not self._client:
            for j in self._pending:  # copies in flight into the old mapping end before it is unregistered
                j.event.synchronize()
            self._unregister()
            self._client = c
            self._pool = c.pool.tensor()
            self._pool_np = c.pool.array()
            if self.cuda:
                ptr, size = self._pool.data_ptr(), self._pool.numel()
                err = torch.cuda.cudart().cudaHostRegister(ptr, size, 0)
                if int(getattr(err, "value", err)) == 0:
                    self._registered = ptr
                else:
                    self._once("register", "cudaHostRegister of the %d-byte pool failed (%s): copies go "
                               "through pageable memory, slower", size, err)
        return self._pool

    # -- jobs --------------------------------------------------------------------------

    def _finish(self, job_id: int, store: bool, ok: bool, size: int, t0: float) -> None:
        self._done[store].append(_result(job_id, ok, size, time.monotonic() - t0, store))

    def submit(self, job_id: int, spec: Any, store: bool) -> bool:
        """Runs (CPU) or starts (CUDA) the job; never raises."""
        t0 = time.monotonic()
        with self._mu:
            try:
                job = self._submit(job_id, spec, store, t0)
            except (ValueError, TypeError) as e:  # a spec this worker cannot serve
                self._once(f"refused:{store}:{type(e).__name__}", "a %s job is refused: %s",
                           "store" if store else "load", e)
                job = None
            except Exception as e:  # noqa: BLE001 - never into vLLM's worker
                self._link.failed("store job" if store else "load job", e)  # logged once per kind
                job = None
            if job is None:
                self._finish(job_id, store, False, 0, t0)
            elif job.event is None:
                self._finish(job_id, store, True, job.size, t0)
            else:
                self._pending.append(job)
        return True

    def _submit(self, job_id: int, spec: Any, store: bool, t0: float) -> Optional[_Job]:
        src, dst = spec
        gpu, tc = (src, dst) if store else (dst, src)
        if not isinstance(tc, TensorcastLoadStoreSpec):
            raise TypeError(f"a {type(tc).__name__} where a TensorcastLoadStoreSpec belongs")
        gs = getattr(gpu, "group_sizes", None)
        if gs is not None and len(gs) > 1:
            raise ValueError(f"{len(gs)} KV cache groups (tensorcast offloads one)")
        ids = np.asarray(gpu.block_ids, dtype=np.int64)
        n, f = len(tc.offsets), self.block.factor
        if n == 0:
            return _Job(job_id, store, 0, t0)
        skip = n * f - len(ids)
        if not 0 <= skip < f or (store and skip):
            raise ValueError(f"{len(ids)} GPU blocks for {n} offloaded blocks of {f}")
        if not all(tc.ok):
            self._once("missing", "a load names blocks the store no longer has (evicted, or dropped on a "
                       "checksum mismatch): the load fails and vLLM recomputes")
            return None
        if any(length < self.block.value_bytes for length in tc.lengths):
            raise ValueError(f"values shorter than the layout's {self.block.value_bytes} bytes")
        pool = self._pool_of(tc.pool)
        if pool is None:
            return None
        offs = np.asarray(tc.offsets, dtype=np.int64) + self.base
        if int(offs.max()) + self.part_bytes > pool.numel() or int(offs.min()) < 0:
            raise ValueError("a block outside the pool")
        if store and not self.writes:
            return _Job(job_id, store, 0, t0)  # rank 0 stores the copy every rank holds
        size = len(ids) * sum(self.pages)
        if self.cuda:
            return self._cuda(job_id, store, pool, offs, ids, skip, size, t0)
        assert self._pool_np is not None
        self._cpu(store, self._pool_np, offs, ids, skip)
        return _Job(job_id, store, size, t0)

    def _cpu(self, store: bool, pool: np.ndarray, offs: np.ndarray, ids: np.ndarray, skip: int) -> None:
        """One copy per tensor and run of GPU blocks that are consecutive
        both in the tensor and in one offloaded block's part."""
        f = self.block.factor
        total = len(offs) * f
        gid, off = ids.tolist(), offs.tolist()
        for a, page, start in zip(self.arrays, self.pages, self.starts):
            runs = a.strides[0] == page  # rows back to back: a run is one slice
            k = skip
            while k < total:
                b, j = divmod(k, f)
                g = gid[k - skip]
                e = k + 1
                if runs:
                    end = (b + 1) * f
                    while e < end and gid[e - skip] == g + (e - k):
                        e += 1
                o = off[b] + start + j * page
                part = pool[o:o + (e - k) * page].reshape(e - k, page)
                if store:
                    np.copyto(part, a[g:g + e - k])
                else:
                    np.copyto(a[g:g + e - k], part)
                k = e

    def _cuda(self, job_id: int, store: bool, pool: torch.Tensor, offs: np.ndarray, ids: np.ndarray, skip: int,
              size: int, t0: float) -> _Job:
        """On the handlers' stream: the blocks gathered into (or scattered
        from) a staging tensor of whole parts, each part one copy to (from)
        the registered pool."""
        assert self._stream is not None
        f, n = self.block.factor, len(offs)
        stream = self._stream
        if store:
            stream.wait_stream(torch.cuda.current_stream(self.device))  # the model's writes first
        with torch.cuda.stream(stream):
            ids_t = torch.from_numpy(ids).to(self.device, non_blocking=True)
            staging = torch.empty((n, self.part_bytes), dtype=torch.uint8, device=self.device)
            if store:
                for t, page, start in zip(self.tensors, self.pages, self.starts):
                    staging[:, start:start + f * page].view(n, f, page).copy_(t.index_select(0, ids_t).view(n, f, page))
                for b in range(n):
                    o = int(offs[b])
                    pool[o:o + self.part_bytes].copy_(staging[b], non_blocking=True)
            else:
                for b in range(n):
                    o = int(offs[b])
                    staging[b].copy_(pool[o:o + self.part_bytes], non_blocking=True)
                for t, page, start in zip(self.tensors, self.pages, self.starts):
                    part = staging[:, start:start + f * page].reshape(n * f, page)[skip:]
                    t.index_copy_(0, ids_t, part)
            ev = torch.cuda.Event()
            ev.record(stream)
        return _Job(job_id, store, size, t0, ev, (staging, ids_t))

    def finished(self, store: bool) -> List[Any]:
        with self._mu:
            still = []
            for j in self._pending:
                if j.store == store and j.event.query():
                    self._finish(j.job_id, store, True, j.size, j.t0)
                else:
                    still.append(j)
            self._pending = still
            out, self._done[store] = self._done[store], []
        return out

    def wait(self, job_ids: Set[int]) -> None:
        with self._mu:
            evs = [j.event for j in self._pending if j.job_id in job_ids]
        for ev in evs:
            ev.synchronize()

    def shutdown(self) -> None:
        with self._mu:
            for j in self._pending:
                j.event.synchronize()
            self._unregister()
            self._pool = self._pool_np = None
            self._client = None
        self._link.close()


class _Handler(_HandlerBase):
    """vLLM's OffloadingHandler of one direction over a worker's Handlers."""

    def __init__(self, shared: Handlers, store: bool) -> None:
        self.shared = shared
        self.is_store = store

    def transfer_async(self, job_id: int, spec: Any) -> bool:
        return self.shared.submit(job_id, spec, self.is_store)

    def get_finished(self) -> List[Any]:
        return self.shared.finished(self.is_store)

    def wait(self, job_ids: Set[int]) -> None:
        self.shared.wait(job_ids)

    def shutdown(self) -> None:
        if self.is_store:  # the pair shares one connection: closed once
            self.shared.shutdown()


class _Worker(_WorkerBase):
    """vLLM's OffloadingWorker (0.25 on) over a worker's Handlers: a store
    is (GPU spec, TensorcastLoadStoreSpec), a load the other way."""

    def __init__(self, shared: Handlers) -> None:
        self.shared = shared

    def submit_store(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        return self.shared.submit(job_id, (src_spec, dst_spec), True)

    def submit_load(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        return self.shared.submit(job_id, (src_spec, dst_spec), False)

    def get_finished(self) -> List[Any]:
        return self.shared.finished(True) + self.shared.finished(False)

    def wait(self, job_ids: Set[int]) -> None:
        self.shared.wait(job_ids)

    def shutdown(self) -> None:
        self.shared.shutdown()
