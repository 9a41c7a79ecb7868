"""The client: one connection to tensorcastd, on libtensorcast."""

from __future__ import annotations

import collections
import ctypes
import enum
import math
import mmap
import os
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

from . import _lib
from ._lib import lib
from .errors import Error, Status
from .store import DEFAULT_MAX_KEYS, StoreCalls, _on_collect, _warn_dropped

if TYPE_CHECKING:
    from .queues import Queue

__all__ = [
    "DEFAULT_SOCKET",
    "MAX_NOTIFY",
    "PROTOCOL_VERSION",
    "Buffer",
    "CallOptions",
    "Client",
    "Error",
    "Hello",
    "Limits",
    "Notification",
    "Op",
    "Pool",
    "Remote",
    "Request",
    "Rights",
    "Stats",
    "Status",
    "Summary",
    "TaskInfo",
    "TaskState",
    "TransferResult",
    "Transport",
    "connect",
]

DEFAULT_SOCKET = "/run/tensorcast/tensorcastd.sock"
MAX_NOTIFY = 4096
PROTOCOL_VERSION = 1


class Op(enum.IntEnum):
    """READ moves target -> local, WRITE local -> target."""

    READ = 1
    WRITE = 2


class TaskState(enum.IntEnum):
    INVALID = 0
    WAITING = 1
    PENDING = 2
    COMPLETED = 3
    FAILED = 4
    TIMEOUT = 5
    CANCELED = 6

    @classmethod
    def _missing_(cls, value: object) -> Optional["TaskState"]:
        if isinstance(value, int):
            m = int.__new__(cls, value)
            m._name_ = f"STATE_{value}"
            m._value_ = value
            return m
        return None


class Rights(enum.IntFlag):
    READ = 1
    WRITE = 2


class Transport(enum.IntEnum):
    """How requests to a remote segment travel: AUTO (RDMA when both
    daemons can, else tcp), TCP, or RDMA (never tcp)."""

    AUTO = 0
    TCP = 1
    RDMA = 2


class Request(NamedTuple):
    """One transfer of ``length`` bytes between (local, local_offset) and
    (target, target_offset)."""

    op: Op
    local: int
    local_offset: int
    target: int
    target_offset: int
    length: int


class Summary(NamedTuple):
    total: int
    waiting: int
    pending: int
    completed: int
    failed: int
    timeout: int
    canceled: int
    transferred: int

    @property
    def done(self) -> bool:
        """No task is still waiting or pending."""
        return self.waiting + self.pending == 0


class TaskInfo(NamedTuple):
    state: TaskState
    code: Status
    transferred: int


class TransferResult(NamedTuple):
    """A one-shot transfer's answer: one code and one final state per
    request, in request order, and the batch's summary."""

    codes: List[Status]
    states: List[TaskState]
    summary: Summary


class Limits(NamedTuple):
    max_frame: int
    max_buffers: int
    max_blocks: int
    max_batches: int
    max_batch_capacity: int
    max_requests: int
    max_idempotency_keys: int


class Hello(NamedTuple):
    protocol_version: int
    daemon_id: str
    version: str
    peer_addr: str
    limits: Limits


class Remote(NamedTuple):
    id: int
    size: int
    epoch: int


class Notification(NamedTuple):
    segment: str
    payload: bytes


@dataclass(frozen=True)
class Stats:
    pool: dict[str, int]
    engine: dict[str, int]
    connection: dict[str, int]
    transports: dict[str, int]
    connections: int
    store: dict[str, int]


@dataclass(frozen=True)
class CallOptions:
    """One call's context. ``idempotency_key`` makes a mutating call
    idempotent on its connection; ``deadline`` (seconds) bounds its work in
    the daemon; lane and policy_version override the connection's.
    ``replicas`` (1..8; 0: the daemon's store_replicas) is how many copies
    of each value a store_put or commit on the control socket keeps across
    the daemons of the cluster, this one's included: with durable, each
    Status comes once every copy is on its holder's L2."""

    idempotency_key: Optional[str] = None
    lane: Optional[str] = None
    policy_version: int = 0
    qos: int = 0
    deadline: Optional[float] = None
    replicas: int = 0


_Bytes = Union[bytes, bytearray, memoryview]


def _ms(seconds: Optional[float], zero: int = 0) -> int:
    """seconds as whole milliseconds (at least 1 for a positive time);
    None as zero."""
    if seconds is None:
        return zero
    if seconds <= 0:
        return 0
    return min(max(1, math.ceil(seconds * 1000)), 1 << 31)


def _us(seconds: Optional[float]) -> int:
    """seconds as whole microseconds (at least 1 for a positive time, at
    most what a u32 holds); None as zero."""
    if seconds is None or seconds <= 0:
        return 0
    return min(max(1, math.ceil(seconds * 1e6)), (1 << 32) - 1)


def _copts(o: Optional[CallOptions]) -> Optional[_lib.CallOpts]:
    if o is None:
        return None
    return _lib.CallOpts(
        o.idempotency_key.encode() if o.idempotency_key is not None else None,
        o.lane.encode() if o.lane is not None else None,
        o.policy_version,
        o.qos,
        min(max(o.replicas, 0), 255),
        _ms(o.deadline),
    )


def _ref(o: Optional[_lib.CallOpts]) -> Any:
    return ctypes.byref(o) if o is not None else None


def _mapping_address(mm: mmap.mmap) -> int:
    probe = ctypes.c_char.from_buffer(mm)
    try:
        return ctypes.addressof(probe)
    finally:
        del probe


def _span(obj: Any) -> Tuple[int, int]:
    """The address and length of obj's memory: a torch tensor, a numpy
    array, or a writable C-contiguous buffer."""
    if hasattr(obj, "data_ptr") and hasattr(obj, "element_size"):
        return int(obj.data_ptr()), int(obj.numel()) * int(obj.element_size())
    ai = getattr(obj, "__array_interface__", None)
    if ai is not None:
        return int(ai["data"][0]), int(obj.nbytes)
    mv = memoryview(obj)
    if not mv.c_contiguous:
        raise ValueError("tensorcast: locate needs contiguous memory")
    if mv.readonly:
        raise ValueError("tensorcast: locate needs a writable buffer, a numpy array or a torch tensor")
    n = mv.nbytes
    probe = (ctypes.c_char * max(n, 1)).from_buffer(mv) if n else None
    try:
        return (ctypes.addressof(probe) if probe is not None else 0), n
    finally:
        del probe
        mv.release()


class Pool:
    """The daemon's DRAM pool, mapped in this process.

    ``view`` is a writable memoryview of the whole pool; pool blocks from
    :meth:`Client.alloc_blocks` are ``view[offset:offset + size]``.
    ``identity`` is the same for every client of one daemon run. Views
    and arrays keep the mapping alive on their own, also past the client's
    close (the daemon then no longer moves bytes through it)."""

    def __init__(self, segment: int, size: int, classes: Tuple[int, ...], fd: int) -> None:
        self.segment = segment
        self.size = size
        self.block_classes = classes
        # Which pool this is: every connection to one daemon run maps the
        # same memfd, and a restarted daemon has another. Offsets handed
        # from one client to another are good only between equal identities.
        st = os.fstat(fd)
        self.identity: Tuple[int, int] = (st.st_dev, st.st_ino)
        self._mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._base = _mapping_address(self._mm)
        self.view = memoryview(self._mm)
        self._exporter = type("_PoolBytes", (ctypes.c_char * size,), {})

    def _window(self) -> Tuple[Any, memoryview]:
        """A view of the whole pool with an exporter of its own: every view
        cut from it, every slice of those and every array over them holds
        the exporter, so that the exporter is collected only once none of
        them is left. Results that hold pins or reservations take their
        views from one and give back what they hold when it goes."""
        w = self._exporter.from_address(self._base)
        w.pool = self.view  # keeps the mapping, as views of the pool do
        return w, memoryview(w).cast("B")

    def block(self, offset: int, size: int) -> memoryview:
        """A writable view of size bytes at offset."""
        if offset < 0 or size < 0 or offset + size > self.size:
            raise ValueError(f"tensorcast: [{offset}, +{size}) is outside the {self.size}-byte pool")
        return self.view[offset:offset + size]

    def array(self, offset: int = 0, size: Optional[int] = None, dtype: Any = None) -> Any:
        """A numpy array over the pool's bytes (no copy): uint8 unless dtype."""
        import numpy

        n = self.size - offset if size is None else size
        v = self.block(offset, n)
        return numpy.frombuffer(v, dtype=numpy.uint8 if dtype is None else dtype)

    def tensor(self, offset: int = 0, size: Optional[int] = None, dtype: Any = None) -> Any:
        """A torch tensor over the pool's bytes (no copy): uint8 unless dtype."""
        import torch

        n = self.size - offset if size is None else size
        v = self.block(offset, n)
        return torch.frombuffer(v, dtype=torch.uint8 if dtype is None else dtype)


class Buffer:
    """A client buffer (a sealed memfd, mapped by this process and the
    daemon) registered as segment ``id``. ``view`` is a writable
    memoryview; it stays valid after :meth:`close`, which unregisters it.
    ``huge`` is how many of its bytes are on transparent 2 MiB pages (its
    whole 2 MiB spans where the kernel gives them, as the pool's are).

    A buffer collected without :meth:`close` is unregistered at its
    client's next call (the collection only queues it: a finalizer may run
    on any thread, also one inside the client), and a warning is logged,
    once, that one was dropped; close it when done with it."""

    def __init__(self, client: "Client", raw: Any) -> None:
        self._client: Optional[Client] = client
        self._raw = raw
        b = raw.contents
        self.id: int = b.id
        self.size: int = b.size
        self.huge: int = b.huge
        self._mm = mmap.mmap(b.fd, b.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._base = _mapping_address(self._mm)
        self.view = memoryview(self._mm)
        self._given: Any = None  # see create_buffer

    def array(self, dtype: Any = None) -> Any:
        """A numpy array over the buffer (no copy): uint8 unless dtype."""
        import numpy

        return numpy.frombuffer(self.view, dtype=numpy.uint8 if dtype is None else dtype)

    def tensor(self, dtype: Any = None) -> Any:
        """A torch tensor over the buffer (no copy): uint8 unless dtype."""
        import torch

        return torch.frombuffer(self.view, dtype=torch.uint8 if dtype is None else dtype)

    @property
    def registered(self) -> bool:
        return self._client is not None

    def close(self, opts: Optional[CallOptions] = None) -> None:
        """Unregisters the buffer. A broken or closed connection has
        already dropped it; closing is then quiet."""
        client, self._client = self._client, None
        # detach() answers None once the finalizer ran: then the buffer is
        # the finalizer's to unregister, once.
        if client is not None and (self._given is None or self._given.detach() is not None):
            client._destroy(self, opts)

    def __enter__(self) -> "Buffer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Client(StoreCalls):
    """One connection to tensorcastd.

    Its methods may be called from several threads; the library serializes
    their round trips on the connection, and a call that waits in the
    daemon (:meth:`wait`, :meth:`transfer`, :meth:`poll_notifications`)
    holds it while it waits. Every call releases the GIL while it is in
    the library. Per-item results are lists of :class:`Status`, one per
    item, in order; a failure of the whole call raises :class:`Error`.
    The KV block store's calls (put, get, exists, lookup_prefix, remove,
    reserve, get_pinned, ...) are described in :mod:`tensorcast.store`.
    """

    def __init__(
        self,
        socket: Optional[str] = None,
        name: Optional[str] = None,
        *,
        connect_timeout: float = 5.0,
        call_timeout: Optional[float] = None,
        max_frame: int = 0,
        lane: Optional[str] = None,
        policy_version: int = 0,
        max_keys_per_call: int = DEFAULT_MAX_KEYS,
        reconnect: bool = False,
    ) -> None:
        if not 1 <= max_keys_per_call <= 65535:
            raise Error(Status.INVALID_ARGUMENT, f"max_keys_per_call {max_keys_per_call} (want 1..65535)")
        if socket is None:
            socket = os.environ.get("TENSORCAST_SOCKET") or DEFAULT_SOCKET
        self.socket: str = socket
        self._args = (name, connect_timeout, call_timeout, max_frame, lane, policy_version, reconnect)
        self._reconnect = reconnect
        # _cv guards _conn, _active and _closing: close waits for the calls
        # in flight to leave the library before it frees the connection.
        self._cv = threading.Condition()
        self._conn: Optional[int] = None
        self._active = 0
        self._closing = False
        self._buffers: "weakref.WeakSet[Buffer]" = weakref.WeakSet()
        self._queues: "weakref.WeakSet[Queue]" = weakref.WeakSet()
        # The store's queue (a tc_kv), opened on first use under _kv_lock and
        # freed by tc_close.
        self._max_keys = max_keys_per_call
        self._kv_lock = threading.Lock()
        self._kv_ptr: Optional[int] = None
        # What results collected unreleased held (their finalizers queue it,
        # see store._on_collect), given back at the start of the next call:
        # (generation, kind, method, argument). _generation counts closes;
        # an entry of an earlier generation went with its connection.
        self._dropped: "collections.deque[Tuple[int, str, str, Any]]" = collections.deque()
        self._generation = 0
        self._giving_back = threading.local()
        self._dial()

    def _dial(self) -> None:
        name, connect_timeout, call_timeout, max_frame, lane, policy_version, reconnect = self._args
        o = _lib.Options(
            self.socket.encode(),
            name.encode() if name is not None else None,
            _ms(connect_timeout),
            _ms(call_timeout),
            max_frame,
            lane.encode() if lane is not None else None,
            policy_version,
            1 if reconnect else 0,
        )
        conn = ctypes.c_void_p()
        rc = lib.tc_connect(ctypes.byref(o), ctypes.byref(conn))
        if rc:
            raise Error(rc, f"connect to {self.socket}", ctypes.get_errno())
        h = lib.tc_hello_info(conn).contents
        l = h.limits
        self.hello = Hello(h.protocol_version, h.daemon_id.decode(), h.version.decode(), h.peer_addr.decode(),
                           Limits(l.max_frame, l.max_buffers, l.max_blocks, l.max_batches, l.max_batch_capacity,
                                  l.max_requests, l.max_idempotency_keys))
        p = lib.tc_pool_info(conn).contents
        try:
            self.pool = Pool(p.segment, p.size, tuple(p.block_classes[i] for i in range(p.n_block_classes)), p.fd)
        except BaseException:
            lib.tc_close(conn)
            raise
        with self._cv:
            self._conn = conn.value
            self._closing = False

    # -- lifecycle ---------------------------------------------------------

    def _enter(self) -> int:
        if self._dropped:
            self._give_back()
        with self._cv:
            if self._conn is None or self._closing:
                raise Error(Status.CLOSED, "the client is closed")
            self._active += 1
            return self._conn

    def _give_back(self) -> None:
        """Gives back what collected results held (see _dropped), each on
        the connection it was taken on: the call holds the connection open
        meanwhile, so a close (or a reconnect) cannot come between the
        check of the generation and the call."""
        if getattr(self._giving_back, "on", False):
            return  # the give-back's own calls
        self._giving_back.on = True
        try:
            while True:
                try:
                    gen, kind, method, arg = self._dropped.popleft()
                except IndexError:
                    return
                with self._cv:
                    if self._conn is None or self._closing or gen != self._generation:
                        continue  # its connection closed, and released it
                    self._active += 1
                try:
                    _warn_dropped(kind)
                    getattr(self, method)(arg)
                except Exception:  # noqa: BLE001 - a broken connection took it with it
                    pass
                finally:
                    self._leave()
        finally:
            self._giving_back.on = False

    def _leave(self) -> None:
        with self._cv:
            self._active -= 1
            if self._closing and self._active == 0:
                self._cv.notify_all()

    def _call(self, what: str, fn: Any, *args: Any) -> None:
        conn = self._enter()
        try:
            rc = fn(conn, *args)
        finally:
            self._leave()
        if rc:
            raise Error(rc, what, ctypes.get_errno())

    @property
    def closed(self) -> bool:
        return self._conn is None

    def close(self) -> None:
        """Closes the connection: calls in other threads end with
        Status.CLOSED, the daemon releases everything the connection held.
        Views of the pool and of buffers stay readable and writable."""
        with self._cv:
            conn = self._conn
            if conn is None or self._closing:
                return
            self._closing = True
            if self._active:
                lib.tc_shutdown(conn)
            while self._active:
                self._cv.wait()
            self._conn = None
            gen = self._generation
            self._generation += 1
        # Closing releases what dropped results held; they are still worth
        # the warning.
        while self._dropped:
            try:
                g, kind, _, _ = self._dropped.popleft()
            except IndexError:
                break
            if g == gen:
                _warn_dropped(kind)
        for b in list(self._buffers):
            b._client = None
            if b._given is not None:
                b._given.detach()
        self._buffers = weakref.WeakSet()
        for q in list(self._queues):
            q._detach()  # tc_close releases it
        self._queues = weakref.WeakSet()
        self._kv_ptr = None  # and the store's queue
        lib.tc_close(conn)

    def _close_dropped_queue(self, raw: int) -> None:
        """Closes the library's queue of a Queue collected unclosed (its
        finalizer queued it, see _dropped)."""
        rc = lib.tc_queue_close(raw)
        if rc not in (Status.OK, Status.CLOSED):
            raise Error(rc, "close a dropped queue")

    def _kv(self, conn: int) -> int:
        """The store's queue, opened on first use (called between _enter and
        _leave)."""
        kv = self._kv_ptr
        if kv is not None:
            return kv
        with self._kv_lock:
            if self._kv_ptr is None:
                # call_timeout bounds the store's calls too: one that runs
                # out raises TIMED_OUT and leaves the queue in use (its next
                # call gives back what the late one took).
                o = _lib.KvOpts(self._max_keys, _ms(self._args[2]), 0, 0)
                out = ctypes.c_void_p()
                rc = lib.tc_kv_open(conn, ctypes.byref(o), ctypes.byref(out))
                if rc:
                    raise Error(rc, "open the store's queue", ctypes.get_errno())
                self._kv_ptr = out.value
            return self._kv_ptr  # type: ignore[return-value]

    def _kv_closed(self, kv: int) -> None:
        """The store's queue kv ended (Status.CLOSED) and the client
        reconnects: the next store call opens a new one on the connection,
        which dials again. kv itself stays allocated until close (tc_close
        frees it), as another thread may still be inside it."""
        if self._reconnect:
            with self._kv_lock:
                if self._kv_ptr == kv:
                    self._kv_ptr = None

    @property
    def reconnects(self) -> int:
        """How many times the connection was made again by itself after
        the daemon restarted (reconnect=True). Each time, what it held in
        the daemon (buffers, queues, pins, reservations, exports) was
        dropped there; the pool mapping stayed."""
        conn = self._enter()
        try:
            return int(lib.tc_reconnects(conn))
        finally:
            self._leave()

    def _copts(self, opts: Optional["CallOptions"]) -> Any:
        return _copts(opts)

    def reconnect(self) -> None:
        """Closes this connection and opens a new one with the same
        options, to a daemon that may have restarted: a new Hello and pool
        (the old pool and buffers no longer reach the daemon)."""
        self.close()
        self._dial()

    def shutdown(self) -> None:
        """Shuts the connection down from any thread: calls blocked in it
        end with Status.CLOSED; only close may follow."""
        with self._cv:
            if self._conn is not None:
                lib.tc_shutdown(self._conn)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # -- basics ------------------------------------------------------------

    def ping(self, payload: _Bytes = b"", opts: Optional[CallOptions] = None) -> None:
        """One round trip carrying payload, checked to come back unchanged."""
        data = bytes(payload)
        co = _copts(opts)
        self._call("ping", lib.tc_ping, data, len(data), _ref(co))

    def stats(self, opts: Optional[CallOptions] = None) -> Stats:
        out = ctypes.POINTER(_lib.Stats)()
        co = _copts(opts)
        self._call("stats", lib.tc_stats_get, ctypes.byref(out), _ref(co))
        try:
            s = out.contents

            def group(g: _lib.Counters) -> dict[str, int]:
                return {g.items[i].name.decode(): g.items[i].value for i in range(g.n)}

            return Stats(group(s.pool), group(s.engine), group(s.connection), group(s.transports), s.connections,
                         group(s.store))
        finally:
            lib.tc_free(out)

    # -- pool blocks ---------------------------------------------------------

    def alloc_blocks(self, n: int, size: int, opts: Optional[CallOptions] = None) -> List[int]:
        """n pool blocks of size bytes, all or nothing: their offsets."""
        if not 0 < n < 1 << 32 or not 0 < size < 1 << 64:
            raise Error(Status.INVALID_ARGUMENT, f"alloc_blocks({n}, {size}): want 1 to 2**32-1 blocks of 1 to 2**64-1 bytes")
        offs = (ctypes.c_uint64 * n)()
        co = _copts(opts)
        self._call("alloc_blocks", lib.tc_blocks_alloc, n, size, offs, _ref(co))
        return list(offs)

    def free_blocks(self, offsets: Sequence[int], opts: Optional[CallOptions] = None) -> List[Status]:
        """Frees pool blocks: one Status per offset."""
        n = len(offsets)
        if n == 0:
            raise Error(Status.INVALID_ARGUMENT, "free_blocks of no blocks")
        arr = (ctypes.c_uint64 * n)(*offsets)
        codes = (ctypes.c_int * n)()
        co = _copts(opts)
        self._call("free_blocks", lib.tc_blocks_free, arr, n, codes, _ref(co))
        return [Status(c) for c in codes]

    # -- buffers and files ---------------------------------------------------

    def create_buffer(self, size: int, opts: Optional[CallOptions] = None) -> Buffer:
        """A new buffer of size bytes: a sealed memfd the library makes,
        maps and registers."""
        raw = ctypes.POINTER(_lib.Buffer)()
        co = _copts(opts)
        self._call("create_buffer", lib.tc_buffer_create, size, ctypes.byref(raw), _ref(co))
        try:
            b = Buffer(self, raw)
        except BaseException:
            self._raw_destroy(raw, None)
            raise
        # Outside the try: the except's destroy and the finalizer's must
        # never both run.
        b._given = _on_collect(b, self, "buffer", "_raw_destroy", raw)
        self._buffers.add(b)
        return b

    def _raw_destroy(self, raw: Any, opts: Optional[CallOptions] = None) -> int:
        co = _copts(opts)
        try:
            conn = self._enter()
        except Error:
            return Status.CLOSED  # tc_close already released it
        try:
            return int(lib.tc_buffer_destroy(conn, raw, _ref(co)))
        finally:
            self._leave()

    def _destroy(self, b: Buffer, opts: Optional[CallOptions]) -> None:
        self._buffers.discard(b)
        rc = self._raw_destroy(b._raw, opts)
        if rc not in (Status.OK, Status.CLOSED):
            raise Error(rc, f"unregister buffer {b.id}")

    def register_fd(self, fd: int, size: int, opts: Optional[CallOptions] = None) -> int:
        """Registers the first size bytes of fd (a memfd, or a file on
        tmpfs such as an unlinked /dev/shm file) as a buffer; the caller
        keeps fd and its own mapping. Returns the segment id (unregister
        with :meth:`unregister`).

        A memfd sealed with F_SEAL_SHRINK is taken as it is; one made with
        MFD_ALLOW_SEALING is sealed against shrinking by the daemon (for
        good: a seal is never removed); one
        that cannot be sealed (``os.memfd_create(name, os.MFD_CLOEXEC)``,
        as engines' shared-memory host allocators make them) is taken
        unsealed: shrinking it under a request fails that request
        (FAILED_PRECONDITION) and nothing else, and transfers to peers over
        TCP and exports refuse it. A file on disk is INVALID_ARGUMENT."""
        seg = ctypes.c_uint64()
        co = _copts(opts)
        self._call("register_fd", lib.tc_buffer_register_fd, fd, size, ctypes.byref(seg), _ref(co))
        return seg.value

    def register_file(self, path: str, direct: bool = False, size: int = 0,
                      opts: Optional[CallOptions] = None) -> Tuple[int, int]:
        """Opens path in the daemon (under its data_dir or allowed_files) as
        a file segment of size bytes (0: the file's): (segment, size)."""
        seg, got = ctypes.c_uint64(), ctypes.c_uint64()
        co = _copts(opts)
        self._call(f"register_file {path}", lib.tc_file_register, os.fsencode(path), int(direct), size,
                   ctypes.byref(seg), ctypes.byref(got), _ref(co))
        return seg.value, got.value

    def unregister(self, segment: int, opts: Optional[CallOptions] = None) -> None:
        """Unregisters a segment from register_fd or register_file."""
        co = _copts(opts)
        self._call(f"unregister {segment}", lib.tc_segment_unregister, segment, _ref(co))

    def locate(self, obj: Any) -> Tuple[int, int]:
        """(segment, offset) of obj's memory: a view, numpy array or torch
        tensor inside the pool or a buffer of this client."""
        addr, n = _span(obj)
        for seg, base, size in self._regions():
            if base <= addr and addr + n <= base + size:
                return seg, addr - base
        raise Error(Status.NOT_FOUND, "locate: the memory is neither in the pool nor in a buffer of this client")

    def _regions(self) -> Iterator[Tuple[int, int, int]]:
        yield self.pool.segment, self.pool._base, self.pool.size
        for b in list(self._buffers):
            if b.registered:
                yield b.id, b._base, b.size

    # -- queues --------------------------------------------------------------

    def open_queue(self, entries: int, cq_entries: int = 0, data_size: int = 0,
                   request_timeout: Optional[float] = None, spin: bool = True, spin_us: int = 0) -> "Queue":
        """A shared-memory queue of entries submission slots (rounded up to a
        power of two) and cq_entries completion slots (0: twice as many, the
        least): the path for many requests in flight. data_size sizes the
        area notification payloads travel through (0: the daemon's
        default); request_timeout (seconds) is each request's deadline (None:
        the daemon's default); a reap spins up to spin_us microseconds (0:
        50) before it sleeps, unless spin is False. The queue is a context
        manager, and closes with the client."""
        from .queues import Queue

        if entries <= 0:
            raise Error(Status.INVALID_ARGUMENT, f"open_queue({entries})")
        o = _lib.QueueOpts(cq_entries, data_size, _us(request_timeout), spin_us, 0 if spin else 1)
        raw = ctypes.c_void_p()
        self._call(f"open_queue({entries})", lib.tc_queue_open, entries, ctypes.byref(o), ctypes.byref(raw))
        try:
            q = Queue(self, raw.value)
        except BaseException:
            lib.tc_queue_close(raw)
            raise
        self._queues.add(q)
        return q

    # -- batches -------------------------------------------------------------

    @staticmethod
    def _requests(reqs: Sequence[Request]) -> Any:
        n = len(reqs)
        arr = (_lib.Request * n)()
        for i, r in enumerate(reqs):
            q = arr[i]
            q.op = int(r[0])
            q.local, q.local_offset, q.target, q.target_offset, q.length = r[1], r[2], r[3], r[4], r[5]
        return arr

    @staticmethod
    def _notify(notify: Optional[Sequence[Optional[bytes]]], n: int) -> Tuple[Any, List[bytes]]:
        if notify is None:
            return None, []
        if len(notify) != n:
            raise Error(Status.INVALID_ARGUMENT, f"{len(notify)} notifications for {n} requests")
        keep = [bytes(p) if p else b"" for p in notify]
        arr = (_lib.Notify * n)()
        for i, p in enumerate(keep):
            if len(p) > MAX_NOTIFY:
                raise Error(Status.INVALID_ARGUMENT, f"notification {i} has {len(p)} bytes (max {MAX_NOTIFY})")
            arr[i].payload = ctypes.cast(ctypes.c_char_p(p), ctypes.c_void_p) if p else None
            arr[i].len = len(p)
        return arr, keep

    def alloc_batch(self, capacity: int, opts: Optional[CallOptions] = None) -> int:
        """A batch of up to capacity tasks."""
        out = ctypes.c_uint64()
        co = _copts(opts)
        self._call("alloc_batch", lib.tc_batch_alloc, capacity, ctypes.byref(out), _ref(co))
        return out.value

    def submit(self, batch: int, requests: Sequence[Request],
               notify: Optional[Sequence[Optional[bytes]]] = None,
               opts: Optional[CallOptions] = None) -> List[Status]:
        """Adds requests to batch: one Status per request (a refused request
        still takes its task index). notify, when given, has one payload (or
        None) per request, riding on WRITEs to remote segments."""
        n = len(requests)
        if n == 0:
            raise Error(Status.INVALID_ARGUMENT, "submit of no requests")
        arr = self._requests(requests)
        narr, keep = self._notify(notify, n)
        codes = (ctypes.c_int * n)()
        co = _copts(opts)
        self._call("submit", lib.tc_batch_submit, batch, arr, n, narr, codes, _ref(co))
        del keep
        return [Status(c) for c in codes]

    def task_status(self, batch: int, index: int, opts: Optional[CallOptions] = None) -> TaskInfo:
        t = _lib.TaskInfo()
        co = _copts(opts)
        self._call("task_status", lib.tc_task_status, batch, index, ctypes.byref(t), _ref(co))
        return TaskInfo(TaskState(t.state), Status(t.code), t.transferred)

    @staticmethod
    def _summary(s: _lib.Summary) -> Summary:
        return Summary(s.total, s.waiting, s.pending, s.completed, s.failed, s.timeout, s.canceled, s.transferred)

    def batch_status(self, batch: int, opts: Optional[CallOptions] = None) -> Summary:
        s = _lib.Summary()
        co = _copts(opts)
        self._call("batch_status", lib.tc_batch_status, batch, ctypes.byref(s), _ref(co))
        return self._summary(s)

    def wait(self, batch: int, timeout: Optional[float] = None, opts: Optional[CallOptions] = None) -> Summary:
        """Waits up to timeout seconds (None: the daemon's default) for the
        batch's tasks to end; ``.done`` is False when the time ran out."""
        s = _lib.Summary()
        co = _copts(opts)
        ms = _ms(timeout) if timeout is None or timeout > 0 else 1
        self._call("wait", lib.tc_batch_wait, batch, ms, ctypes.byref(s), _ref(co))
        return self._summary(s)

    def free_batch(self, batch: int, opts: Optional[CallOptions] = None) -> None:
        """Frees batch; Status.BUSY while tasks are live (nothing changes)."""
        co = _copts(opts)
        self._call("free_batch", lib.tc_batch_free, batch, _ref(co))

    def transfer(self, requests: Sequence[Request], timeout: Optional[float] = None,
                 notify: Optional[Sequence[Optional[bytes]]] = None,
                 opts: Optional[CallOptions] = None) -> TransferResult:
        """Runs requests in one message (allocate, submit, wait, free):
        one code and final state per request."""
        n = len(requests)
        if n == 0:
            raise Error(Status.INVALID_ARGUMENT, "transfer of no requests")
        arr = self._requests(requests)
        narr, keep = self._notify(notify, n)
        codes = (ctypes.c_int * n)()
        states = (ctypes.c_int * n)()
        s = _lib.Summary()
        co = _copts(opts)
        self._call("transfer", lib.tc_transfer, arr, n, narr, _ms(timeout), codes, states, ctypes.byref(s),
                   _ref(co))
        del keep
        return TransferResult([Status(c) for c in codes], [TaskState(x) for x in states], self._summary(s))

    # -- peers ---------------------------------------------------------------

    def export_segment(self, name: str, segment: int, offset: int = 0, length: int = 0,
                       rights: Rights = Rights.READ | Rights.WRITE, opts: Optional[CallOptions] = None,
                       grants: Sequence[str] = ()) -> int:
        """Makes [offset, offset+length) of segment (a buffer of this
        client, length 0 = to its end, or pool blocks it holds) reachable by
        peer daemons as name: the exported size. The clients of this
        client's tenant on peer daemons open it as "daemon/name"; those of
        the tenants in grants (at most 16, never this client's own) as
        "daemon/tenant/name", tenant being this client's. The export and
        its grants end with unexport_segment or the connection."""
        size = ctypes.c_uint64()
        co = _copts(opts)
        gs = [g.encode() for g in grants]
        arr = (ctypes.c_char_p * max(len(gs), 1))(*gs)
        self._call(f"export {name}", lib.tc_segment_export_to, name.encode(), arr, len(gs), segment, offset, length,
                   int(rights), ctypes.byref(size), _ref(co))
        return size.value

    def unexport_segment(self, name: str, opts: Optional[CallOptions] = None) -> None:
        co = _copts(opts)
        self._call(f"unexport {name}", lib.tc_segment_unexport, name.encode(), _ref(co))

    def open_remote(self, name: str, rights: Rights = Rights.READ | Rights.WRITE,
                    transport: Transport = Transport.AUTO, opts: Optional[CallOptions] = None) -> Remote:
        """Opens "peer/segment" on another daemon: its id is a request target."""
        r = _lib.Remote()
        co = _copts(opts)
        self._call(f"open_remote {name}", lib.tc_remote_open, name.encode(), int(rights), int(transport),
                   ctypes.byref(r), _ref(co))
        return Remote(r.id, r.size, r.epoch)

    def close_remote(self, segment: int, opts: Optional[CallOptions] = None) -> None:
        co = _copts(opts)
        self._call(f"close_remote {segment}", lib.tc_remote_close, segment, _ref(co))

    def subscribe(self, name: str, opts: Optional[CallOptions] = None) -> None:
        """Receives the notifications peers attach to WRITEs into the
        segment this daemon exports as name."""
        co = _copts(opts)
        self._call(f"subscribe {name}", lib.tc_notify_subscribe, name.encode(), _ref(co))

    def poll_notifications(self, max: int = 0, timeout: float = 0.0,
                           opts: Optional[CallOptions] = None) -> List[Notification]:
        """Up to max queued notifications (0: as many as fit one answer),
        waiting up to timeout seconds for the first (0: not at all)."""
        out = ctypes.POINTER(_lib.Notification)()
        n = ctypes.c_size_t()
        co = _copts(opts)
        self._call("poll_notifications", lib.tc_notify_poll, max, _ms(timeout), ctypes.byref(out),
                   ctypes.byref(n), _ref(co))
        try:
            return [Notification(out[i].segment.decode(), ctypes.string_at(out[i].payload, out[i].len))
                    for i in range(n.value)]
        finally:
            lib.tc_free(out)


def connect(socket: Optional[str] = None, name: Optional[str] = None, **kwargs: Any) -> Client:
    """Connects to tensorcastd at socket (default: $TENSORCAST_SOCKET, then
    the daemon's default path). The client is a context manager.
    Keyword arguments: connect_timeout, call_timeout (seconds; bounds each
    call, the store's included: a store call that runs out raises
    Status.TIMED_OUT and leaves the connection in use, what it pinned or
    reserved given back by the next store call; any other call that runs
    out breaks the connection), max_frame,
    lane, policy_version, max_keys_per_call (most keys of one store call),
    reconnect (after the daemon restarted, the next call connects again by
    itself and keeps the pool mapping when the daemon kept its pool; a
    call in flight then fails with Status.CLOSED and is not retried; a
    daemon with another pool is refused, Status.CLOSED for good; buffers
    and queues of before are gone in the daemon)."""
    return Client(socket, name, **kwargs)
