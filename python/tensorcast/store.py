"""The KV block store's calls, as methods of :class:`tensorcast.Client`.

The daemon's store keeps values (KV-cache blocks) by key in its pool and
on its L2 file. Every batch call is positional: it returns one result per
key, in order; a failure of the whole call raises :class:`Error`.

    with tensorcast.connect() as c:
        c.put([b"seq/0", b"seq/1"], [page0, page1])       # [Status.OK, Status.OK]
        n = c.lookup_prefix([b"seq/0", b"seq/1", b"seq/2"])  # 2
        with c.get_pinned([b"seq/0", b"seq/1"]) as views:    # read-only views into the pool
            kv = torch.frombuffer(views[0], dtype=torch.bfloat16)
        with c.reserve([b"seq/2"], 256 << 10) as r:      # writable views into the pool
            r.views[0][:] = page2                          # an exception here aborts r
            r.commit(durable=True)

Keys are ``bytes`` (or ``str``, encoded as UTF-8), 1 to 256 bytes. Values
are any buffer-protocol objects (``bytes``, ``bytearray``, ``memoryview``,
numpy arrays) or CPU torch tensors, C-contiguous.

The hot calls go through a shared-memory queue the client opens on first
use (libtensorcast's ``tc_kv``): ``put`` reserves pool blocks, copies each
value into its block and commits them; ``get`` pins the values, copies them
out and unpins them; ``exists``, ``lookup_prefix``, ``reserve``/``commit``
and ``get_pinned`` are one queue operation each. ``remove``, ``pin``,
``unpin``, ``abort``, ``stat``, ``list_keys``, ``flush`` and the extent copies
(``store_put``, ``store_read``) use the control socket. Every call releases
the GIL while it is in the library. A call with more keys than
``max_keys_per_call`` (``connect``'s keyword, 1024 by default, the daemon's
default bound) is made in several calls of at most that many keys, in
order; all-or-nothing calls (``pin``, ``unpin``) are then all or nothing
per part.
"""

from __future__ import annotations

import array
import ctypes
import logging
import math
import operator
import weakref
from typing import TYPE_CHECKING, Any, Iterator, List, NamedTuple, Optional, Sequence, Set, Tuple, Union

from . import _lib
from ._lib import lib
from .errors import Error, Status

if TYPE_CHECKING:
    from .client import CallOptions

__all__ = ["Codes", "Extent", "Holder", "Key", "KeyInfo", "KeyLocation", "Locations", "PinnedValues", "Reservation",
           "StoreCalls"]

Key = Union[str, bytes, bytearray, memoryview]

MAX_KEY = 256
_MAX_PACKED_KEY = 65535
DEFAULT_MAX_KEYS = 1024

# Status of each code, looked up without the enum's call per key.
_STATUS = {int(s): s for s in Status}


def _status(code: int) -> Status:
    s = _STATUS.get(code)
    return s if s is not None else Status(code)


class KeyInfo(NamedTuple):
    """A stored key: its value's size, the tiers it is on, its pins over all
    clients, and whether it is still owed a writeback to L2 (dirty) or its
    writeback gave up (tombstone)."""

    key: bytes
    size: int
    in_l1: bool
    in_l2: bool
    pins: int
    dirty: bool
    tombstone: bool


class Holder(NamedTuple):
    """One copy of a key's value as the key's home knows it: the holding
    daemon, the run (epoch) that announced it, its tier (1 DRAM, 2 NVMe),
    size and crc32c."""

    id: str
    epoch: int
    tier: int
    size: int
    crc32c: int


class KeyLocation(NamedTuple):
    """Where a key lives in the store across hosts: its shard, the shard's
    home and generation as the daemon knows them, and the holders the home
    names."""

    key: bytes
    shard: int
    home: str
    generation: int
    holders: List[Holder]


class Handle(NamedTuple):
    """A retention handle: its token (the capability: whoever holds it
    renews or releases the handle, at the daemon that issued it), its id
    (0 when only renewed through this client) and its expiry (Unix
    milliseconds)."""

    token: bytes
    id: int
    expiry_unix_ms: int


class Lease(NamedTuple):
    """A placement lease's expiry (Unix milliseconds), and whether the create
    joined a lease an earlier create with the same operation id made."""

    expiry_unix_ms: int
    joined: bool


class Extent(NamedTuple):
    """length bytes at offset in segment: a buffer of this client or pool
    blocks it allocated (``store_put``, ``store_read``)."""

    segment: int
    offset: int
    length: int


class Locations(NamedTuple):
    """Where the values of pinned keys lie in the daemon's pool
    (:meth:`StoreCalls.get_locations`)."""

    codes: List[Status]
    offsets: List[int]
    lengths: List[int]


class Codes(List[Status]):
    """One Status per key; after ``get``, ``lengths`` holds each value's
    length (also for an output too short, whose Status is
    INVALID_ARGUMENT; 0 for a key that is not stored)."""

    lengths: List[int]


def _key(k: Key) -> bytes:
    if isinstance(k, bytes):
        return k
    if isinstance(k, str):
        return k.encode()
    # Not bytes(k): an int n would be n zero bytes, a list of ints its
    # bytes, and either would name another key without a word.
    try:
        return memoryview(k).tobytes()
    except TypeError:
        raise TypeError(f"tensorcast: a key of type {type(k).__name__} (want str, bytes or a buffer)") from None


def _pack(keys: Sequence[Key]) -> Tuple[_lib.Keys, bytes]:
    """keys as the protocol's packed key list, and the tc_keys naming it."""
    parts: List[bytes] = []
    for k in keys:
        b = _key(k)
        n = len(b)
        if n > _MAX_PACKED_KEY:
            raise Error(Status.INVALID_ARGUMENT, f"a {n}-byte key (the store takes at most {MAX_KEY})")
        parts.append(n.to_bytes(2, "little"))
        parts.append(b)
    packed = b"".join(parts)
    return _lib.Keys(len(keys), None, packed, len(packed)), packed


class _PyBuffer(ctypes.Structure):
    # CPython's Py_buffer (stable since 3.3, part of the limited API since
    # 3.11). obj is a PyObject * that PyBuffer_Release drops; it is kept an
    # integer here so that ctypes never counts references on it.
    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


# The buffer calls take the Py_buffer by address: a _Spans holds one array
# of them and passes each element's address, making no ctypes object per
# value.
_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.c_void_p, ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.c_void_p]
_release_buffer.restype = None
_PyBUF_SIMPLE, _PyBUF_WRITABLE = 0, 1
_PYBUF_SIZE = ctypes.sizeof(_PyBuffer)


class _Spans:
    """The memory of a list of objects, held for one call: addresses and
    lengths as C arrays, the buffers exported until release()."""

    def __init__(self, objs: Sequence[Any], writable: bool) -> None:
        n = len(objs)
        self._bufs = (_PyBuffer * n)()
        self._base = ctypes.addressof(self._bufs)
        self._held: List[int] = []  # addresses of the Py_buffers to release
        self._tensors: List[Any] = []
        ptrs: List[int] = [0] * n
        lens: List[int] = [0] * n
        flags = _PyBUF_WRITABLE if writable else _PyBUF_SIMPLE
        try:
            for i, o in enumerate(objs):
                if hasattr(o, "data_ptr") and hasattr(o, "element_size"):  # a torch tensor
                    ptrs[i], lens[i] = self._tensor(o, i)
                    continue
                at = self._base + i * _PYBUF_SIZE
                try:
                    _get_buffer(o, at, flags)
                except (BufferError, TypeError, ValueError) as e:
                    want = "a writable, contiguous buffer" if writable else "a contiguous buffer"
                    raise Error(Status.INVALID_ARGUMENT,
                                f"value {i} ({type(o).__name__}) is not {want}: {e}") from None
                self._held.append(at)
                b = self._bufs[i]
                ptrs[i], lens[i] = b.buf or 0, b.len
        except BaseException:
            self.release()
            raise
        self.ptrs = (ctypes.c_void_p * n)(*ptrs)
        self.lens = (ctypes.c_uint64 * n)(*lens)

    def _tensor(self, o: Any, i: int) -> Tuple[int, int]:
        if o.device.type != "cpu" or not o.is_contiguous():
            raise Error(Status.INVALID_ARGUMENT, f"value {i}: a tensor on {o.device}, "
                        f"{'' if o.is_contiguous() else 'not '}contiguous (want a contiguous CPU tensor)")
        self._tensors.append(o)
        return int(o.data_ptr()), int(o.numel()) * int(o.element_size())

    def release(self) -> None:
        for at in self._held:
            _release_buffer(at)
        self._held = []
        self._tensors = []


_U64 = 1 << 64


def _u64s(what: str, values: Sequence[int], least: int = 0) -> List[int]:
    """values checked as u64s of at least least: ctypes would take -1 as
    2**64-1 and cut 2**64 to 0 without a word."""
    out: List[int] = []
    for x in values:
        try:
            v = operator.index(x)  # an int, or a numpy integer; not a float
        except TypeError:
            raise TypeError(f"tensorcast: {what} of type {type(x).__name__} (want an integer)") from None
        if not least <= v < _U64:
            raise Error(Status.INVALID_ARGUMENT, f"{what} {v} (want {least} to 2**64-1)")
        out.append(v)
    return out


def _chunks(n: int, size: int) -> Iterator[Tuple[int, int]]:
    for lo in range(0, n, size):
        yield lo, min(lo + size, n)


def _ms(seconds: Optional[float]) -> int:
    if seconds is None or seconds <= 0:
        return 0
    return min(max(1, math.ceil(seconds * 1000)), (1 << 32) - 1)


def _extents(ext: Any) -> Any:
    """The tc_extent array of ext: (segment, offset, length) triples, or an
    object whose buffer holds them as native uint64s, C-contiguous (a numpy
    array of shape (n, 3), say)."""
    n = len(ext)
    if isinstance(ext, (list, tuple)):
        flat = array.array("Q")
        for e in ext:
            flat.extend((int(e[0]), int(e[1]), int(e[2])))
    else:
        mv = memoryview(ext)
        if not mv.c_contiguous or mv.itemsize != 8 or mv.format.lstrip("@=<") not in ("Q", "L") \
                or mv.nbytes != 24 * n:
            raise Error(Status.INVALID_ARGUMENT, f"extents: a buffer of format {mv.format!r}, {mv.nbytes} bytes, "
                        f"for {n} extents of three uint64s")
        flat = array.array("Q")
        flat.frombytes(mv.cast("B"))
    return (_lib.Extent * n).from_buffer(flat) if n else None, flat


log = logging.getLogger("tensorcast")

# What to call instead of dropping each kind of result.
_RELEASE = {"get_pinned result": "release() it", "buffer": "close() it", "queue": "close() it"}

# The kinds of result whose drop was logged: once each, as an engine that
# forgets one forgets one per request.
_warned: Set[str] = set()


def _warn_dropped(kind: str) -> None:
    if kind not in _warned:
        _warned.add(kind)
        log.warning("tensorcast: a %s was dropped unreleased: what it held in the daemon was held until it was "
                    "collected (%s, or use it in a with block; logged once)", kind, _RELEASE.get(kind, "release it"))


def _collected(client: "weakref.ref[StoreCalls]", generation: int, kind: str, method: str, arg: Any) -> None:
    # A finalizer runs on whichever thread collects, at any allocation, also
    # while that thread holds one of the client's locks or is inside one of
    # its calls: it must not call the library. It queues the give-back for
    # the client's next call (a deque's append takes no lock).
    c = client()
    if c is not None and c._generation == generation:
        c._dropped.append((generation, kind, method, arg))


def _on_collect(anchor: Any, client: "StoreCalls", kind: str, method: str, arg: Any) -> "weakref.finalize":
    """Has client call method(arg) once anchor is collected (on the
    connection of this moment: after a close, it went with it). The
    finalizer's detach() is the explicit release's claim: it answers None
    once the finalizer ran or was detached, so that what is held is given
    back once."""
    f = weakref.finalize(anchor, _collected, weakref.ref(client), client._generation, kind, method, arg)
    f.atexit = False  # the process ending closes the connection
    return f


def _unset_codes(n: int) -> Any:
    """A codes array for a pinning call: a slot the library leaves unwritten
    reads as not pinned."""
    return (ctypes.c_int * n)(*([int(Status.FAILED_PRECONDITION)] * n))


def _pinned(parts: Sequence[Tuple[List[bytes], Any]]) -> List[bytes]:
    """The keys a pinning (or reserving) call's parts took: each part is registered with
    its codes array before its call, so that an exception raised at any
    point after the library wrote them still finds them."""
    return [k for keys, codes in parts for k, c in zip(keys, codes) if c == 0]


class Reservation:
    """Pool blocks reserved for keys (:meth:`StoreCalls.reserve`): ``views``
    are writable memoryviews of them (None for a key whose Status in
    ``codes`` is not OK). Write the values in place, then :meth:`commit`;
    or, when the values will not be stored after all (a write that failed,
    a request cancelled), :meth:`abort`, which gives the blocks back at
    once. As a context manager, a reservation left neither committed nor
    aborted when the ``with`` block ends (by an exception, or by forgetting
    to commit) is aborted. One never committed nor aborted is released when
    the client closes."""

    def __init__(self, client: "StoreCalls", keys: List[bytes], codes: List[Status], offsets: List[int],
                 sizes: List[int]) -> None:
        self._client = client
        self.keys = keys
        self.codes = codes
        self.offsets = offsets
        self.views: List[Optional[memoryview]] = [
            client.pool.view[o:o + z] if c == Status.OK else None for c, o, z in zip(codes, offsets, sizes)]
        self.committed = False
        self.aborted = False

    def _done(self, what: str) -> None:
        if self.committed or self.aborted:
            state = "committed" if self.committed else "aborted"
            raise Error(Status.FAILED_PRECONDITION, f"{what}: the reservation was {state} already")

    def _release_views(self) -> int:
        """Releases the views; returns how many are still exported (a numpy
        array made over one, say), which cannot be."""
        busy = 0
        for v in self.views:
            if v is not None:
                try:
                    v.release()
                except BufferError:
                    busy += 1
        return busy

    def commit(self, durable: bool = False) -> List[Status]:
        """Makes the reserved values visible (durable: once each is on L2)
        and releases the views. One Status per key: a key that was not
        reserved keeps its reserve's Status."""
        self._done("commit")
        idx = [i for i, c in enumerate(self.codes) if c == Status.OK]
        out = list(self.codes)
        if idx:
            got = self._client.commit([self.keys[i] for i in idx], durable)
            for i, c in zip(idx, got):
                out[i] = c
        self.committed = True
        for v in self.views:
            if v is not None:
                v.release()
        return out

    def abort(self) -> List[Status]:
        """Gives the reserved blocks back without committing them: the views
        are released first (the blocks are the pool's again once this
        returns; memory still exported from a view must not be written any
        more), then each key reserved is released. One Status per key: OK
        for a key given back, a key that was not reserved keeps its
        reserve's Status. Raises FAILED_PRECONDITION when the reservation
        was committed or aborted already, or when a view was still exported
        (the keys are aborted all the same)."""
        self._done("abort")
        self.aborted = True
        busy = self._release_views()
        idx = [i for i, c in enumerate(self.codes) if c == Status.OK]
        out = list(self.codes)
        if idx:
            got = self._client.abort([self.keys[i] for i in idx])
            for i, c in zip(idx, got):
                out[i] = c
        if busy:
            raise Error(Status.FAILED_PRECONDITION, f"abort: {busy} views still exported when the blocks were "
                        "given back (do not write through them)")
        return out

    def __enter__(self) -> "Reservation":
        return self

    def __exit__(self, exc_type: Optional[type], exc: Optional[BaseException], tb: object) -> None:
        # Ending with an exception, the blocks are given back and the
        # exception goes on (an abort that fails raises with it as context).
        if not (self.committed or self.aborted):
            self.abort()


class PinnedValues(List[Optional[memoryview]]):
    """The values of keys pinned by :meth:`StoreCalls.get_pinned`: one
    read-only memoryview into the daemon's pool per key (None for a key
    whose Status in ``codes`` is not OK), valid until :meth:`release` (or
    the end of the ``with`` block) unpins them and releases the views.

    Values never released are unpinned once neither this list nor any view
    of them (one taken out of it, a slice, an array over one) is left: the
    garbage collection queues the unpin and the client's next call makes it
    (a finalizer must not call the library), and a warning is logged, once,
    that a get_pinned result was dropped. Releasing is what to do: a
    collection may come late, or not at all while a reference cycle holds
    the list. The client's close releases them too."""

    codes: List[Status]

    def __init__(self, client: "StoreCalls", keys: List[bytes], codes: List[Status],
                 views: List[Optional[memoryview]], anchor: Any = None) -> None:
        super().__init__(views)
        self._client: Optional[StoreCalls] = client
        self.codes = codes
        # anchor exports the views (Pool._window): it goes with the last of
        # them, and with this list.
        self._anchor = anchor
        self._pinned = [k for k, c in zip(keys, codes) if c == Status.OK]
        self._given = _on_collect(anchor, client, "get_pinned result", "_unpin_queue", self._pinned) \
            if self._pinned and anchor is not None else None

    def release(self) -> None:
        """Releases the views and unpins the values. A view still exported
        (a numpy array made over it, say) cannot be released: the values are
        unpinned all the same, then this raises."""
        client, self._client = self._client, None
        if client is None:
            return
        # First the claim: a pin given back twice would drop another
        # result's pin of the same key.
        if self._given is not None and self._given.detach() is None:
            client = None  # the finalizer ran: the unpin is queued already
        busy = 0
        for v in self:
            if v is not None:
                try:
                    v.release()
                except BufferError:
                    busy += 1
        if self._pinned and client is not None:
            client._unpin_queue(self._pinned)
        if busy:
            raise Error(Status.FAILED_PRECONDITION, f"get_pinned: {busy} views still exported when unpinned "
                        "(copy what must outlive the with block)")

    def __enter__(self) -> "PinnedValues":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class StoreCalls:
    """The store's calls of :class:`tensorcast.Client` (see the module's
    doc)."""

    pool: Any
    _max_keys: int
    _generation: int
    _dropped: Any

    # Provided by Client.
    def _enter(self) -> int:
        raise NotImplementedError

    def _leave(self) -> None:
        raise NotImplementedError

    def _kv(self, conn: int) -> int:
        raise NotImplementedError

    def _copts(self, opts: Optional["CallOptions"]) -> Any:
        raise NotImplementedError

    # -- running calls -----------------------------------------------------

    def _kv_closed(self, kv: int) -> None:
        raise NotImplementedError

    def _run_kv(self, what: str, fn: Any, *args: Any) -> int:
        conn = self._enter()
        try:
            kv = self._kv(conn)
            rc = int(fn(kv, *args))
            if rc == Status.CLOSED:
                self._kv_closed(kv)
            return rc
        finally:
            self._leave()

    def _run_conn(self, fn: Any, *args: Any) -> int:
        conn = self._enter()
        try:
            return int(fn(conn, *args))
        finally:
            self._leave()

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc:
            raise Error(rc, what, ctypes.get_errno())

    # -- the copying calls ---------------------------------------------------

    def put(self, keys: Sequence[Key], values: Sequence[Any], durable: bool = False) -> List[Status]:
        """Stores each key with a copy of its value: one Status per key (OK,
        ALREADY_EXISTS, BUSY while another put of it is in flight,
        RESOURCE_EXHAUSTED, INVALID_ARGUMENT for an empty value or a key the
        store cannot hold). With durable each key's Status comes once its
        value is on L2."""
        n = len(keys)
        if len(values) != n:
            raise Error(Status.INVALID_ARGUMENT, f"put: {len(values)} values for {n} keys")
        out: List[Status] = []
        for lo, hi in _chunks(n, self._max_keys):
            ks, packed = _pack(keys[lo:hi])
            spans = _Spans(values[lo:hi], writable=False)
            codes = (ctypes.c_int * (hi - lo))()
            try:
                rc = self._run_kv("put", lib.tc_kv_put, ctypes.byref(ks), spans.ptrs, spans.lens, int(durable), codes)
            finally:
                spans.release()
            self._check(rc, f"put of {hi - lo} keys")
            out.extend(_status(c) for c in codes)
        return out

    def get(self, keys: Sequence[Key], outs: Sequence[Any]) -> Codes:
        """Copies the value of each key into outs[i] (a writable buffer or a
        CPU tensor at least as long as the value): one Status per key (OK,
        NOT_FOUND, INVALID_ARGUMENT for an output too short), with each
        value's length in ``.lengths``."""
        n = len(keys)
        if len(outs) != n:
            raise Error(Status.INVALID_ARGUMENT, f"get: {len(outs)} outputs for {n} keys")
        out = Codes()
        out.lengths = []
        for lo, hi in _chunks(n, self._max_keys):
            ks, packed = _pack(keys[lo:hi])
            spans = _Spans(outs[lo:hi], writable=True)
            m = hi - lo
            codes, lens = (ctypes.c_int * m)(), (ctypes.c_uint64 * m)()
            try:
                rc = self._run_kv("get", lib.tc_kv_read, ctypes.byref(ks), spans.ptrs, spans.lens, lens, codes)
            finally:
                spans.release()
            self._check(rc, f"get of {m} keys")
            out.extend(_status(c) for c in codes)
            out.lengths.extend(lens)
        return out

    def put_addresses(self, keys: Sequence[Key], addresses: Sequence[int], lengths: Sequence[int],
                      durable: bool = False) -> List[Status]:
        """put of raw memory: key i's value is lengths[i] bytes at address
        addresses[i] of this process (an engine's host pool page, say),
        which must stay valid for the call."""
        n = len(keys)
        if len(addresses) != n or len(lengths) != n:
            raise Error(Status.INVALID_ARGUMENT, f"put_addresses: {len(addresses)} addresses, {len(lengths)} lengths "
                        f"for {n} keys")
        addresses, lengths = _u64s("an address", addresses, 1), _u64s("a length", lengths)
        out: List[Status] = []
        for lo, hi in _chunks(n, self._max_keys):
            ks, packed = _pack(keys[lo:hi])
            m = hi - lo
            ptrs, lens = (ctypes.c_void_p * m)(*addresses[lo:hi]), (ctypes.c_uint64 * m)(*lengths[lo:hi])
            codes = (ctypes.c_int * m)()
            self._check(self._run_kv("put", lib.tc_kv_put, ctypes.byref(ks), ptrs, lens, int(durable), codes),
                        f"put of {m} keys")
            out.extend(_status(c) for c in codes)
        return out

    def get_addresses(self, keys: Sequence[Key], addresses: Sequence[int], capacities: Sequence[int]) -> Codes:
        """get into raw memory: key i's value is copied to addresses[i], at
        most capacities[i] bytes of this process's memory, writable and valid
        for the call."""
        n = len(keys)
        if len(addresses) != n or len(capacities) != n:
            raise Error(Status.INVALID_ARGUMENT, f"get_addresses: {len(addresses)} addresses, {len(capacities)} "
                        f"capacities for {n} keys")
        addresses, capacities = _u64s("an address", addresses, 1), _u64s("a capacity", capacities)
        out = Codes()
        out.lengths = []
        for lo, hi in _chunks(n, self._max_keys):
            ks, packed = _pack(keys[lo:hi])
            m = hi - lo
            ptrs, caps = (ctypes.c_void_p * m)(*addresses[lo:hi]), (ctypes.c_uint64 * m)(*capacities[lo:hi])
            codes, lens = (ctypes.c_int * m)(), (ctypes.c_uint64 * m)()
            self._check(self._run_kv("get", lib.tc_kv_read, ctypes.byref(ks), ptrs, caps, lens, codes),
                        f"get of {m} keys")
            out.extend(_status(c) for c in codes)
            out.lengths.extend(lens)
        return out

    def exists(self, keys: Sequence[Key]) -> List[bool]:
        """Whether each key is stored. It renews nothing (no lease, pin or
        recency)."""
        out: List[bool] = []
        for lo, hi in _chunks(len(keys), self._max_keys):
            ks, packed = _pack(keys[lo:hi])
            codes = (ctypes.c_int * (hi - lo))()
            self._check(self._run_kv("exists", lib.tc_kv_exists, ctypes.byref(ks), codes), "exists")
            out.extend(c == 0 for c in codes)
        return out

    def lookup_prefix(self, keys: Sequence[Key], pin: bool = False) -> int:
        """How many leading keys of the chain are stored. With pin they are
        also pinned for this client in the same call, so that a get of them
        cannot miss (unpin ``keys[:n]`` after)."""
        kb = [_key(k) for k in keys] if pin else keys
        parts: List[Tuple[int, Any]] = []  # each part's first key and found, registered before its call
        try:
            for lo, hi in _chunks(len(kb), self._max_keys):
                ks, packed = _pack(kb[lo:hi])
                found = ctypes.c_size_t()
                parts.append((lo, found))
                self._check(self._run_kv("lookup_prefix", lib.tc_kv_lookup_prefix, ctypes.byref(ks), int(pin),
                                         ctypes.byref(found)), "lookup_prefix")
                if found.value < hi - lo:
                    break
        except BaseException:
            # The caller never learns how many keys were pinned before the
            # exception, so they are given back here.
            if pin:
                self._unpin_quietly([k for lo, found in parts for k in kb[lo:lo + found.value]])
            raise
        return sum(found.value for _, found in parts)

    def remove(self, keys: Sequence[Key], opts: Optional["CallOptions"] = None) -> List[Status]:
        """Removes keys: one Status per key (OK also for an absent key,
        FAILED_PRECONDITION for one a client of this daemon pins, though not
        for one only another host's read in flight holds: it goes, and that
        read keeps its bytes; BUSY for one another caller is reading or
        removing at that moment: asked again, it goes). With the store
        across hosts every other copy goes too; a key whose other copies
        may remain (its home did not answer, or a holder did not drop its
        copy in time) gets UNAVAILABLE, DEADLINE_EXCEEDED or BUSY (its home
        busy), never OK, and the same remove sent again answers OK once
        they are gone."""
        return self._socket_batch("remove", lib.tc_store_remove, keys, opts)

    def pin(self, keys: Sequence[Key], ttl: Optional[float] = None,
            opts: Optional["CallOptions"] = None) -> List[Status]:
        """Pins every key for this client, or none (the keys that refused say
        why, the others FAILED_PRECONDITION). With ttl (seconds) each pin is
        a lease that ends by itself. Pins go when the client closes."""
        return self._socket_batch("pin", lib.tc_store_pin, keys, opts, _ms(ttl))

    def unpin(self, keys: Sequence[Key], opts: Optional["CallOptions"] = None) -> List[Status]:
        """Drops one pin of this client from every key, or from none: a key
        without a pin of this client (FAILED_PRECONDITION) or not stored
        (NOT_FOUND) refuses it, the others FAILED_PRECONDITION."""
        return self._socket_batch("unpin", lib.tc_store_unpin, keys, opts)

    def _socket_batch(self, what: str, fn: Any, keys: Sequence[Key], opts: Optional["CallOptions"],
                      *extra: Any) -> List[Status]:
        out: List[Status] = []
        co = self._copts(opts)
        ref = ctypes.byref(co) if co is not None else None
        for lo, hi in _chunks(len(keys), self._max_keys):
            ks, packed = _pack(keys[lo:hi])
            codes = (ctypes.c_int * (hi - lo))()
            self._check(self._run_conn(fn, ctypes.byref(ks), *extra, codes, ref), what)
            out.extend(_status(c) for c in codes)
        return out

    def _unpin_queue(self, keys: Sequence[Key]) -> None:
        """Unpins keys this client pinned (get_pinned's release), through the
        queue."""
        for lo, hi in _chunks(len(keys), self._max_keys):
            ks, packed = _pack(keys[lo:hi])
            codes = (ctypes.c_int * (hi - lo))()
            self._check(self._run_kv("unpin", lib.tc_kv_unpin, ctypes.byref(ks), codes), f"unpin of {hi - lo} keys")

    def _unpin_quietly(self, keys: Sequence[Key]) -> None:
        """Gives back pins a call that is raising took; the exception it
        raises is the one the caller sees."""
        if not keys:
            return
        try:
            self._unpin_queue(keys)
        except Exception:  # noqa: BLE001 - a broken connection took its pins with it
            pass

    # -- zero copy ------------------------------------------------------------

    def reserve(self, keys: Sequence[Key], sizes: Union[int, Sequence[int]]) -> Reservation:
        """Reserves a pool block of sizes[i] bytes (or sizes, for every key)
        for each key: the Reservation's ``views`` are writable memoryviews
        into the daemon's pool to write the values in place, then
        ``.commit(durable=False)``. ``codes`` says which keys could not be
        reserved (ALREADY_EXISTS, BUSY, RESOURCE_EXHAUSTED, ...)."""
        n = len(keys)
        zs = _u64s("a size", [sizes] * n if isinstance(sizes, int) else list(sizes))
        if len(zs) != n:
            raise Error(Status.INVALID_ARGUMENT, f"reserve: {len(zs)} sizes for {n} keys")
        kb = [_key(k) for k in keys]
        codes: List[Status] = []
        offsets: List[int] = []
        parts: List[Tuple[List[bytes], Any]] = []
        try:
            for lo, hi in _chunks(n, self._max_keys):
                ks, packed = _pack(kb[lo:hi])
                m = hi - lo
                cs, offs = _unset_codes(m), (ctypes.c_uint64 * m)()
                parts.append((kb[lo:hi], cs))  # before the call, as a pinning call's
                part = zs[lo:hi]
                if all(z == part[0] for z in part):
                    rc = self._run_kv("reserve", lib.tc_kv_reserve, ctypes.byref(ks), part[0], offs, cs)
                else:  # sizes that differ: the socket's reserve has one per key
                    sz = (ctypes.c_uint64 * m)(*part)
                    rc = self._run_conn(lib.tc_store_reserve, ctypes.byref(ks), sz, offs, cs, None)
                self._check(rc, f"reserve of {m} keys")
                codes.extend(_status(c) for c in cs)
                offsets.extend(offs)
            return Reservation(self, kb, codes, offsets, zs)
        except BaseException:
            # No Reservation reaches the caller to abort: the blocks already
            # reserved are given back here rather than held until close.
            held = _pinned(parts)
            if held:
                try:
                    self.abort(held)
                except Exception:  # noqa: BLE001 - a broken connection took them with it
                    pass
            raise

    def commit(self, keys: Sequence[Key], durable: bool = False) -> List[Status]:
        """Makes keys this client reserved visible; with durable once each
        value is on L2 (a key whose durable commit failed stays reserved)."""
        out: List[Status] = []
        for lo, hi in _chunks(len(keys), self._max_keys):
            ks, packed = _pack(keys[lo:hi])
            codes = (ctypes.c_int * (hi - lo))()
            self._check(self._run_kv("commit", lib.tc_kv_commit, ctypes.byref(ks), int(durable), codes), "commit")
            out.extend(_status(c) for c in codes)
        return out

    def abort(self, keys: Sequence[Key], opts: Optional["CallOptions"] = None) -> List[Status]:
        """Gives back reservations of this client without committing them
        (their pool blocks are freed at once): OK for each key given back,
        FAILED_PRECONDITION for a key this client has not reserved (never,
        committed or aborted already, or another client's, which this never
        touches), BUSY while its durable commit is in flight. Keys are
        independent; a key that is not valid (empty, over 256 bytes) refuses
        its call with INVALID_ARGUMENT. :meth:`Reservation.abort` is the
        usual way in."""
        return self._socket_batch("abort", lib.tc_store_abort, keys, opts)

    def _pin_part(self, kb: List[bytes], parts: List[Tuple[List[bytes], Any]]) -> Tuple[Any, Any, Any]:
        """One part's pinning get of keys kb (at most max_keys_per_call): its
        codes, offsets and lengths. The part goes into parts before the
        call, so that a caller that raises gives back what it pinned (see
        _pinned)."""
        ks, packed = _pack(kb)
        m = len(kb)
        cs, offs, lens = _unset_codes(m), (ctypes.c_uint64 * m)(), (ctypes.c_uint64 * m)()
        parts.append((kb, cs))
        self._check(self._run_kv("get", lib.tc_kv_get, ctypes.byref(ks), offs, lens, cs), f"get of {m} keys")
        return cs, offs, lens

    def get_locations(self, keys: Sequence[Key]) -> "Locations":
        """Pins each key and says where its value lies in the daemon's pool:
        ``offsets[i]`` and ``lengths[i]`` (0 where ``codes[i]`` is not OK), to
        be read in place through ``pool.view`` (or another client's mapping
        of the same pool) and then given back with :meth:`release`."""
        kb = [_key(k) for k in keys]
        codes: List[Status] = []
        offsets: List[int] = []
        lengths: List[int] = []
        parts: List[Tuple[List[bytes], Any]] = []
        try:
            for lo, hi in _chunks(len(kb), self._max_keys):
                cs, offs, lens = self._pin_part(kb[lo:hi], parts)
                codes.extend(_status(c) for c in cs)
                offsets.extend(offs)
                lengths.extend(lens)
        except BaseException:
            # The caller never sees the pins of the parts that went through:
            # give them back.
            self._unpin_quietly(_pinned(parts))
            raise
        return Locations(codes, offsets, lengths)

    def release(self, keys: Sequence[Key]) -> List[Status]:
        """Drops one pin of this client from every key, through the store's
        queue: the release of :meth:`get_locations` and of
        ``lookup_prefix(pin=True)``. A :meth:`get_pinned` result is released
        with its own ``release()`` (its views go with its pins, and its
        collection gives back what it still holds). All or nothing,
        as :meth:`unpin`: when a key refuses it, its Status says why (and the
        others FAILED_PRECONDITION) and nothing was unpinned."""
        out: List[Status] = []
        for lo, hi in _chunks(len(keys), self._max_keys):
            ks, packed = _pack(keys[lo:hi])
            m = hi - lo
            codes = (ctypes.c_int * m)(*([int(Status.FAILED_PRECONDITION)] * m))
            rc = self._run_kv("unpin", lib.tc_kv_unpin, ctypes.byref(ks), codes)
            if rc not in (0, Status.FAILED_PRECONDITION, Status.NOT_FOUND):
                self._check(rc, f"unpin of {m} keys")
            out.extend(_status(c) for c in codes)
        return out

    def get_pinned(self, keys: Sequence[Key]) -> PinnedValues:
        """Pins each key and gives read-only memoryviews of the values where
        they lie in the daemon's pool, without a copy. Use it as a context
        manager: the views are released and the keys unpinned on exit.

            with c.get_pinned(keys) as views:
                for v in views: ...            # None where views.codes[i] is not OK
        """
        kb = [_key(k) for k in keys]
        codes: List[Status] = []
        views: List[Optional[memoryview]] = []
        anchor: Any = None
        pv: Any = None
        parts: List[Tuple[List[bytes], Any]] = []
        try:
            for lo, hi in _chunks(len(kb), self._max_keys):
                cs, offs, lens = self._pin_part(kb[lo:hi], parts)
                for c, o, z in zip(cs, offs, lens):
                    st = _status(c)
                    codes.append(st)
                    if st == Status.OK and pv is None:
                        anchor, pv = self.pool._window()
                    views.append(pv[o:o + z].toreadonly() if st == Status.OK else None)
        except BaseException:
            # The parts that went through hold pins: give them back.
            for v in views:
                if v is not None:
                    v.release()
            self._unpin_quietly(_pinned(parts))
            raise
        return PinnedValues(self, kb, codes, views, anchor)

    # -- copies through extents ---------------------------------------------------

    def store_put(self, keys: Sequence[Key], extents: Sequence[Tuple[int, int, int]], durable: bool = False,
                  opts: Optional["CallOptions"] = None) -> List[Status]:
        """Stores each key with a copy of the bytes extents[i] names
        (segment, offset, length: a buffer of this client or pool blocks it
        holds), copied by the daemon, on the control socket. extents may
        also be an (n, 3) array of native uint64s (numpy's, say)."""
        n = len(keys)
        if len(extents) != n:
            raise Error(Status.INVALID_ARGUMENT, f"store_put: {len(extents)} extents for {n} keys")
        co = self._copts(opts)
        ref = ctypes.byref(co) if co is not None else None
        out: List[Status] = []
        for lo, hi in _chunks(n, self._max_keys):
            ks, packed = _pack(keys[lo:hi])
            ext, flat = _extents(extents[lo:hi])
            codes = (ctypes.c_int * (hi - lo))()
            self._check(self._run_conn(lib.tc_store_put, ctypes.byref(ks), ext, int(durable), codes, ref), "store_put")
            out.extend(_status(c) for c in codes)
        return out

    def store_read(self, keys: Sequence[Key], extents: Sequence[Tuple[int, int, int]],
                   opts: Optional["CallOptions"] = None) -> Codes:
        """Copies the value of each key into the memory extents[i] names (as
        store_put), by the daemon: one Status per key, lengths in
        ``.lengths``."""
        n = len(keys)
        if len(extents) != n:
            raise Error(Status.INVALID_ARGUMENT, f"store_read: {len(extents)} extents for {n} keys")
        co = self._copts(opts)
        ref = ctypes.byref(co) if co is not None else None
        out = Codes()
        out.lengths = []
        for lo, hi in _chunks(n, self._max_keys):
            ks, packed = _pack(keys[lo:hi])
            ext, flat = _extents(extents[lo:hi])
            m = hi - lo
            codes, lens = (ctypes.c_int * m)(), (ctypes.c_uint64 * m)()
            self._check(self._run_conn(lib.tc_store_read, ctypes.byref(ks), ext, lens, codes, ref), "store_read")
            out.extend(_status(c) for c in codes)
            out.lengths.extend(lens)
        return out

    # -- retention handles and placement leases -----------------------------------
    #
    # Both keep keys from eviction and belong to the daemon's store, not to
    # this client: they outlive it and end when released or at their expiry.

    def _one_batch(self, what: str, keys: Sequence[Key]) -> Tuple[Any, bytes]:
        if not 0 < len(keys) <= self._max_keys:
            raise Error(Status.INVALID_ARGUMENT, f"{what}: {len(keys)} keys (1..{self._max_keys})")
        return _pack(keys)

    def _ref(self, opts: Optional["CallOptions"]) -> Any:
        co = self._copts(opts)
        return ctypes.byref(co) if co is not None else None

    def handle_issue(self, keys: Sequence[Key], ttl: float, opts: Optional["CallOptions"] = None) -> Handle:
        """A retention handle that keeps every key from eviction for ttl
        seconds, or none (Error NOT_FOUND for a key that is not stored;
        RESOURCE_EXHAUSTED when the tenant's handles and leases already pin
        store_max_grant_pinned)."""
        ks, packed = self._one_batch("handle_issue", keys)
        h = _lib.Handle()
        self._check(self._run_conn(lib.tc_handle_issue, ctypes.byref(ks), _ms(ttl), ctypes.byref(h), self._ref(opts)),
                    f"handle_issue of {len(keys)} keys")
        return Handle(bytes(h.token[:h.token_len]), h.id, h.expiry_unix_ms)

    def handle_renew(self, handle: Union[Handle, bytes], ttl: float, opts: Optional["CallOptions"] = None) -> Handle:
        """Extends a handle to ttl seconds from now, at its issuer, and
        returns it with its new token (use that one from now on). A token
        that is forged, expired, released or of an issuer that restarted is
        Error PERMISSION_DENIED."""
        token, hid = (handle.token, handle.id) if isinstance(handle, Handle) else (bytes(handle), 0)
        h = _lib.Handle()
        self._check(self._run_conn(lib.tc_handle_renew, token, len(token), _ms(ttl), ctypes.byref(h),
                                   self._ref(opts)), "handle_renew")
        return Handle(bytes(h.token[:h.token_len]), hid, h.expiry_unix_ms)

    def handle_release(self, handle: Union[Handle, bytes], opts: Optional["CallOptions"] = None) -> None:
        """Gives back a handle's keys, at its issuer (Error PERMISSION_DENIED
        when it was released or expired already)."""
        token = handle.token if isinstance(handle, Handle) else bytes(handle)
        self._check(self._run_conn(lib.tc_handle_release, token, len(token), self._ref(opts)), "handle_release")

    def lease_create(self, op_id: Key, keys: Sequence[Key], ttl: float,
                     opts: Optional["CallOptions"] = None) -> Lease:
        """Pins keys where they are for ttl seconds under operation id op_id.
        A create retried with the same op_id and keys joins the first lease
        (Lease.joined) and pins nothing again; the same op_id with other
        keys, or of a lease released lately, is Error FAILED_PRECONDITION; a
        new lease past store_max_grant_pinned is RESOURCE_EXHAUSTED."""
        op = _key(op_id)
        ks, packed = self._one_batch("lease_create", keys)
        exp, joined = ctypes.c_uint64(), ctypes.c_int()
        self._check(self._run_conn(lib.tc_lease_create, op, len(op), ctypes.byref(ks), _ms(ttl), ctypes.byref(exp),
                                   ctypes.byref(joined), self._ref(opts)), f"lease_create {op!r}")
        return Lease(exp.value, bool(joined.value))

    def lease_release(self, op_id: Key, opts: Optional["CallOptions"] = None) -> None:
        """Gives back the keys of the lease of op_id (nothing to do when it
        ended already; Error NOT_FOUND when op_id names no lease)."""
        op = _key(op_id)
        self._check(self._run_conn(lib.tc_lease_release, op, len(op), self._ref(opts)), f"lease_release {op!r}")

    # -- operators' calls -------------------------------------------------------------

    def stat(self, key: Key, opts: Optional["CallOptions"] = None) -> KeyInfo:
        """Describes one key; Error(Status.NOT_FOUND) when it is not stored.
        It changes nothing."""
        k = _key(key)
        info = _lib.KeyInfo()
        co = self._copts(opts)
        self._check(self._run_conn(lib.tc_store_stat, k, len(k), ctypes.byref(info),
                                   ctypes.byref(co) if co is not None else None), f"stat {k!r}")
        return KeyInfo(k, info.size, bool(info.in_l1), bool(info.in_l2), info.pins, bool(info.dirty),
                       bool(info.tombstone))

    def cluster_locate(self, key: Key, opts: Optional["CallOptions"] = None) -> KeyLocation:
        """Where key lives in the store across hosts: the daemon asks the
        key's home and keeps nothing of its answer (a later get still asks
        the home). Error(Status.UNAVAILABLE) from a daemon without the store
        across hosts."""
        k = _key(key)
        out = ctypes.POINTER(_lib.KeyLocation)()
        co = self._copts(opts)
        self._check(self._run_conn(lib.tc_cluster_locate, k, len(k), ctypes.byref(out),
                                   ctypes.byref(co) if co is not None else None), f"cluster_locate {k!r}")
        try:
            loc = out.contents
            hs = [Holder(loc.holders[i].id.decode(), loc.holders[i].epoch, loc.holders[i].tier, loc.holders[i].size,
                         loc.holders[i].crc32c) for i in range(loc.n_holders)]
            return KeyLocation(k, loc.shard, loc.home.decode(), loc.generation, hs)
        finally:
            lib.tc_free(out)

    def list_keys(self, prefix: Key = b"", after: Key = b"", max: int = 0,
                  opts: Optional["CallOptions"] = None) -> Tuple[List[KeyInfo], bool]:
        """Up to max stored keys (0: as many as one answer holds) that start
        with prefix and sort after after, in order, and whether the listing
        goes on (ask again with after set to the last key)."""
        p, a = _key(prefix), _key(after)
        out = ctypes.POINTER(_lib.KeyInfo)()
        n, more = ctypes.c_size_t(), ctypes.c_int()
        co = self._copts(opts)
        self._check(self._run_conn(lib.tc_store_list, p, len(p), a, len(a), max, ctypes.byref(out), ctypes.byref(n),
                                   ctypes.byref(more), ctypes.byref(co) if co is not None else None), "list_keys")
        try:
            keys = []
            for i in range(n.value):
                e = out[i]
                keys.append(KeyInfo(ctypes.string_at(e.key, e.key_len), e.size, bool(e.in_l1), bool(e.in_l2), e.pins,
                                    bool(e.dirty), bool(e.tombstone)))
            return keys, bool(more.value)
        finally:
            lib.tc_free(out)

    def flush(self, timeout: Optional[float] = None, opts: Optional["CallOptions"] = None) -> None:
        """Waits, at most timeout seconds (None: the daemon's default), until
        no value is owed a writeback to L2 (Error DEADLINE_EXCEEDED when
        some still are)."""
        co = self._copts(opts)
        self._check(self._run_conn(lib.tc_store_flush, _ms(timeout), ctypes.byref(co) if co is not None else None),
                    "flush")
