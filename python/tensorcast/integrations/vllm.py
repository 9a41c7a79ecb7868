"""vLLM KV offloading on tensorcast: an offloading spec vLLM loads by name.

Launch (``kv_connector_extra_config`` of vLLM's ``OffloadingConnector``)::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "TensorcastOffloadingSpec",
        "spec_module_path": "tensorcast.integrations.vllm",
        "socket": "/run/tensorcast/tensorcastd.sock", "block_size": 64}}'

vLLM's factory imports this module, takes :class:`TensorcastOffloadingSpec`
and builds it in the scheduler and in every worker. The scheduler asks the
spec for its manager (:class:`TensorcastOffloadingManager`), which decides
what is offloaded and where it lies in the daemon's pool; each worker asks
for its handlers or worker (:mod:`tensorcast.integrations.vllm_worker`),
which copy blocks between its KV cache tensors and the pool.

One offloaded block (``block_size`` tokens of extra config, else vLLM's GPU
block size) is one key whose value holds the block for every rank, rank
after rank: rank r's bytes are ``[r * rank_bytes, (r + 1) * rank_bytes)``,
``rank_bytes`` the KV bytes per offloaded block of one rank (from the KV
cache config). The manager reserves the whole value; each worker writes and
reads its own slice; the value is committed when vLLM says the store is
complete, i.e. when every worker has finished its part. Where every rank
holds the same bytes (an MLA model under tensor parallelism alone: vLLM's
``replicated_layout``, or ``use_mla`` with no pipeline or context
parallelism on older vLLM) the value is one copy, ``rank_bytes`` long:
rank 0 writes it, the other ranks' store jobs copy nothing, and every rank
loads it.

Keys are bound to a layout fingerprint (model, dtype, block size, the
ranks' split and bytes, the hash vLLM chains blocks with): a block written
by an engine of another layout is never a hit. A value the daemon reads back
from L2 is checked against its crc32c there; a mismatch drops the key and
its get fails, so the block is a miss (the load job fails and vLLM
recomputes), never bytes handed to the engine.

vLLM's interface has three generations; the one in use is chosen when this
module is imported, from the vLLM that is importable (without one, the
newest, duck-typed):

- ``blocks`` (vLLM up to 0.19): block hashes, ``lookup(hashes) -> int``,
  ``PrepareStoreOutput(block_hashes_to_store, ...)``, events by hashes.
- ``keys`` (0.20 to 0.24): ``OffloadKey``s, ``lookup(key, req_context) ->
  bool | None`` (None: ask again later), ``PrepareStoreOutput(keys_to_store,
  store_spec, evicted_keys)``, events by keys, ``on_new_request``.
- ``results`` (0.25 on): ``lookup`` answers a ``LookupResult`` (see
  below), ``has_pending_work`` keeps the engine stepping while fetches are
  in flight, and ``on_new_request`` / ``on_request_finished`` frame each
  request.

What a lookup answers of a block (``keys``: True, False or None):

- HIT (True): its value is in the daemon's pool, loadable now.
- HIT_PENDING (None): this manager's store of it is in flight (reserved,
  not committed yet): it will be a hit; the scheduler asks again.
- RETRY (None): it is stored, but only on the daemon's L2 or only on
  another host, so a load would first wait for the L2 read or the other
  host. The lookup starts that fetch (a get and its release on a connection
  of the manager's fetcher thread, so that no scheduler call waits behind
  it) and answers RETRY until it ends; the scheduler goes on scanning the
  request's blocks (each one's fetch starts in the same step) and asks
  again. A fetched value is checked against its crc32c by the daemon; a
  corrupt one is dropped, so the next lookup answers MISS. A fetch that
  fails otherwise (the pool full, the daemon away) makes the next lookup of
  that block a MISS, once (the request recomputes it), so that no request
  waits for good on a block the daemon cannot bring in.
- MISS (False): not stored (or the daemon is away).

``blocks`` answers how many leading blocks are stored, on either tier or on
another host; their load's get waits for the fetch.

Across them vLLM moved its classes (abstract, spec, mediums and
worker.worker up to 0.21, base since), built the spec from
``(vllm_config)``, ``(vllm_config, kv_cache_config)`` or, from 0.26, its
``OffloadingConfig``, and asked it for handlers (``get_handlers``, up to
0.24) or one worker (``get_worker``, from 0.25): the spec takes each of
these as it comes.

The classes are built on vLLM's own (``OffloadingManager``,
``OffloadingSpec``, ``LoadStoreSpec``) when it is importable, so its
factory's and workers' type checks pass.

Failures: no call raises into vLLM on a daemon error. A lookup answers a
miss, ``prepare_store`` None (cannot store now), ``prepare_load`` a spec
whose blocks are all missing (the workers then fail the load job: vLLM
recomputes), the ``complete_*`` calls drop what they cannot finish; the
outage is logged once and a later call reconnects. Pins and reservations
belong to the connection and went with it. A reservation that is not
committed is given back at once with the store's abort; only when the abort
itself cannot be made are its blocks counted as abandoned, and once
``abandon_limit`` are held with nothing in flight the manager reconnects.
"""

from __future__ import annotations

import enum
import importlib
import importlib.util
import logging
import threading
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

from ..client import Client
from ..errors import Error, Status
from . import layout
from ._link import CALL_TIMEOUT, Link, call_timeout_option

__all__ = ["EVENT_MEDIUM", "GENERATION", "MEDIUM", "BlockLayout", "LookupResult", "TensorcastLoadStoreSpec",
           "TensorcastOffloadingManager", "TensorcastOffloadingSpec", "block_layout", "offloading_config_layout"]

log = logging.getLogger("tensorcast.integrations.vllm")

#: What this medium is called in specs and events.
MEDIUM = "TENSORCAST"


# -- vLLM's classes, or stand-ins ----------------------------------------------------


def _module(name: str) -> Optional[ModuleType]:
    """vLLM's module name, None when vLLM is not installed or lacks it."""
    try:
        if importlib.util.find_spec("vllm") is None:
            return None
        return importlib.import_module(name)
    except ImportError:
        return None


# vLLM keeps its offloading classes in abstract, spec and mediums up to 0.21,
# in base from 0.22.
_abstract = _module("vllm.v1.kv_offload.abstract") or _module("vllm.v1.kv_offload.base")
_spec_mod = (_module("vllm.v1.kv_offload.spec") or _abstract) if _abstract is not None else None


def _generation(m: Optional[ModuleType]) -> str:
    if m is None:
        return "results"
    if hasattr(m, "LookupResult"):
        return "results"
    if hasattr(m, "OffloadKey"):
        return "keys"
    return "blocks"


#: The interface generation this module speaks: "blocks", "keys" or "results".
GENERATION = _generation(_abstract)


class _LookupResult(enum.Enum):
    """vLLM's LookupResult, where vLLM is not importable."""

    MISS = enum.auto()
    HIT = enum.auto()
    HIT_PENDING = enum.auto()
    RETRY = enum.auto()


LookupResult: Any = getattr(_abstract, "LookupResult", _LookupResult)


@dataclass
class _PrepareStoreOutput:
    keys_to_store: List[Any]
    store_spec: Any
    evicted_keys: List[Any] = field(default_factory=list)


@dataclass
class _PrepareStoreOutputBlocks:
    block_hashes_to_store: List[Any]
    store_spec: Any
    block_hashes_evicted: List[Any] = field(default_factory=list)


@dataclass
class _OffloadingEvent:
    keys: List[Any]
    medium: str
    removed: bool


@dataclass
class _OffloadingEventBlocks:
    block_hashes: List[Any]
    block_size: int
    medium: str
    removed: bool


_blocks = GENERATION == "blocks"
PrepareStoreOutput: Any = getattr(_abstract, "PrepareStoreOutput",
                                  _PrepareStoreOutputBlocks if _blocks else _PrepareStoreOutput)
OffloadingEvent: Any = getattr(_abstract, "OffloadingEvent", _OffloadingEventBlocks if _blocks else _OffloadingEvent)
_ManagerBase: Any = getattr(_abstract, "OffloadingManager", object)
_LoadStoreSpecBase: Any = getattr(_abstract, "LoadStoreSpec", object)
_SpecBase: Any = getattr(_spec_mod, "OffloadingSpec", object)


#: The medium events name: vLLM's Medium.CPU where vLLM names media by an enum
#: (the daemon's pool is host memory), else MEDIUM.
EVENT_MEDIUM: Any = getattr(getattr(_abstract, "Medium", None), "CPU", MEDIUM)


def _request_context() -> Any:
    """What on_new_request answers: vLLM's default RequestOffloadingContext
    (offload the blocks as they are computed), None without one."""
    cls = getattr(_abstract, "RequestOffloadingContext", None)
    return cls() if cls is not None else None


# -- what the scheduler hands the workers --------------------------------------------------


class TensorcastLoadStoreSpec(_LoadStoreSpecBase):
    """Where offloaded blocks lie in the daemon's pool: block i's value is
    ``lengths[i]`` bytes at ``offsets[i]``; ``ok[i]`` False for a block that
    is not there (a load must not use it). ``pool`` is the identity of the
    pool the offsets are in (a worker mapped to another pool, a restarted
    daemon's, must not use them)."""

    def __init__(self, offsets: List[int], lengths: List[int], ok: List[bool],
                 pool: Optional[Tuple[int, int]]) -> None:
        self.offsets = offsets
        self.lengths = lengths
        self.ok = ok
        self.pool = pool

    @staticmethod
    def medium() -> str:
        return MEDIUM

    def __len__(self) -> int:
        return len(self.offsets)

    def __repr__(self) -> str:
        return f"TensorcastLoadStoreSpec({len(self.offsets)} blocks, {sum(self.ok)} present)"

    def views(self, client: Client) -> List[Optional[memoryview]]:
        """The blocks as writable memoryviews of client's mapping of the
        pool (None where ok is False, or every one when client maps another
        pool)."""
        pv = client.pool.view
        same = self.pool is None or self.pool == client.pool.identity
        return [pv[o:o + n] if good and same else None
                for o, n, good in zip(self.offsets, self.lengths, self.ok)]


def _missing(n: int) -> TensorcastLoadStoreSpec:
    return TensorcastLoadStoreSpec([0] * n, [0] * n, [False] * n, None)


def _hex(k: Any) -> str:
    """The text of a vLLM block key (an OffloadKey or block hash: bytes; an
    older hash: an int, or a tuple whose hash_value is one)."""
    k = getattr(k, "hash_value", k)
    if isinstance(k, (bytes, bytearray, memoryview)):
        return bytes(k).hex()
    if isinstance(k, int):
        return "%x" % (k & ((1 << 256) - 1))
    return str(k).encode().hex()


# -- the manager -------------------------------------------------------------------------


class _Manager:
    """The one implementation behind every generation's interface: the
    methods named with a leading underscore take vLLM's keys (or block
    hashes) and answer in neutral terms; the generation's class names them
    as vLLM calls them."""

    def __init__(self, block_size: int, *, fingerprint: Optional[str] = None, socket: Optional[str] = None,
                 key_prefix: bytes = b"vllm/", durable: bool = False, enable_events: bool = False,
                 block_tokens: int = 0, retry_interval: float = 1.0, abandon_limit: int = 64,
                 logger: Optional[logging.Logger] = None, call_timeout: Optional[float] = CALL_TIMEOUT) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size {block_size}")
        if fingerprint is not None and len(fingerprint) != layout.FINGERPRINT_LEN:
            raise ValueError(f"not a layout fingerprint: {fingerprint!r}")
        self.block_size = block_size
        self.block_tokens = block_tokens
        self.fingerprint = fingerprint
        self.prefix = bytes(key_prefix)
        self.durable = durable
        self.abandon_limit = abandon_limit
        self.log = logger or log
        # mu guards the fields below: what this manager holds (pins of
        # loads, reservations of stores, keyed by the block's store key,
        # one entry per pin or reservation naming the connection it was
        # taken on: another thread may swap the link's connection between a
        # call and its record) and its events. _owner is the connection the
        # abandoned reservations were counted on.
        self._mu = threading.Lock()
        self._owner: Optional[Client] = None
        self._pins: Dict[bytes, List[Client]] = {}
        self._reserved: Dict[bytes, List[Client]] = {}
        self._abandoned = 0
        self._events: Optional[List[Tuple[List[Any], bool]]] = [] if enable_events else None
        # The store keys whose fetch (into the pool, from L2 or another
        # host) is in flight, and those whose last fetch failed (answered a
        # miss once); the fetcher thread is started by the first fetch.
        self._fetching: Set[bytes] = set()
        self._fetch_failed: Set[bytes] = set()
        self._fetcher: Optional[_Fetcher] = None
        self._closed = False
        self.socket = socket
        self.retry_interval = retry_interval
        self.call_timeout = call_timeout
        self._link = Link(socket, "vllm-offload", self.log, retry_interval=retry_interval, call_timeout=call_timeout)

    # -- the connection and what it holds -----------------------------------------

    def _conn(self) -> Optional[Client]:
        c = self._link.client()
        if c is None:
            return None
        with self._mu:
            if c is not self._owner and not c.closed:
                # A new connection holds nothing: what a closed one held
                # went with it. Records of one still open are kept: the
                # link gives an older client to a thread that asked before
                # the swap.
                self._owner = c
                self._abandoned = 0
                for held in (self._pins, self._reserved):
                    for k in [k for k, cs in held.items() if all(x.closed for x in cs)]:
                        del held[k]
        return c

    def store_key(self, k: Any) -> bytes:
        """The daemon's key of vLLM's block key (or hash) k."""
        h = _hex(k)
        if self.fingerprint is not None:
            h = layout.bind(self.fingerprint, h)
        return self.prefix + h.encode()

    def _keys(self, ks: Iterable[Any]) -> List[bytes]:
        return [self.store_key(k) for k in ks]

    @staticmethod
    def _record(held: Dict[bytes, List[Client]], k: bytes, c: Client) -> None:
        held.setdefault(k, []).append(c)

    @staticmethod
    def _take(held: Dict[bytes, List[Client]], k: bytes) -> Optional[Client]:
        """One of k's entries: the connection to give it back on. One of a
        closed connection goes first (its pin went with it), so that a
        live pin stays for the load still in flight."""
        cs = held.get(k)
        if not cs:
            return None
        i = next((i for i, c in enumerate(cs) if c.closed), len(cs) - 1)
        c = cs.pop(i)
        if not cs:
            del held[k]
        return c

    @staticmethod
    def _by_client(taken: List[Tuple[Any, Optional[Client]]]) -> List[Tuple[Client, List[Any]]]:
        """The items taken, grouped by the open connection they are held
        on; those of a closed one are dropped (closing released them)."""
        out: Dict[int, Tuple[Client, List[Any]]] = {}
        for item, c in taken:
            if c is not None and not c.closed:
                out.setdefault(id(c), (c, []))[1].append(item)
        return list(out.values())

    def _abort(self, c: Client, keys: List[bytes]) -> None:
        """Gives back reservations this manager will not commit; those the
        abort cannot reach (the daemon failing) are counted abandoned."""
        try:
            codes = c.abort(keys)
        except Exception as e:  # noqa: BLE001
            self._link.failed("complete_store", e, c)
            codes = [Status.UNAVAILABLE] * len(keys)
        # OK: given back; FAILED_PRECONDITION: not reserved any more (its
        # commit ended it). Anything else is still held.
        held = sum(1 for st in codes if st not in (Status.OK, Status.FAILED_PRECONDITION))
        if held:
            with self._mu:
                self._abandoned += held

    def _maybe_release_abandoned(self) -> None:
        """Reconnects (which gives back every reservation of the connection)
        once abandon_limit blocks are abandoned and nothing is in flight."""
        with self._mu:
            due = self._abandoned >= self.abandon_limit and not self._pins and not self._reserved
        if due:
            self.log.info("tensorcast: reconnecting to give back %d abandoned reservations", self._abandoned)
            self._link.reset()

    # -- the calls, in neutral terms ---------------------------------------------------

    def _state(self, k: Any) -> Any:
        """LookupResult of one block (see the module's doc): HIT when its
        value is in the pool, HIT_PENDING while this manager's store of it
        is in flight, RETRY while it is fetched from L2 or another host
        (starting the fetch), MISS otherwise (also while the daemon is
        away, and once after a fetch of it failed)."""
        sk = self.store_key(k)
        with self._mu:
            if sk in self._reserved:
                return LookupResult.HIT_PENDING
            if sk in self._fetching:
                return LookupResult.RETRY
            if sk in self._fetch_failed:
                self._fetch_failed.discard(sk)
                return LookupResult.MISS
        c = self._conn()
        if c is None:
            return LookupResult.MISS
        try:
            info = c.stat(sk)
        except Error as e:
            if e.code != Status.NOT_FOUND:
                self._link.failed("lookup", e, c)
            return LookupResult.MISS
        except Exception as e:  # noqa: BLE001 - never raises
            self._link.failed("lookup", e, c)
            return LookupResult.MISS
        if info.in_l1:
            return LookupResult.HIT
        # On L2 only, or on another host only (on neither tier here): a load
        # would wait for the read. Fetch it in the background.
        return LookupResult.RETRY if self._fetch(sk) else LookupResult.MISS

    def _fetch(self, sk: bytes) -> bool:
        """Starts the fetch of sk into the pool (unless one is in flight);
        False when the manager is closed."""
        with self._mu:
            if self._closed:
                return False
            if sk in self._fetching:
                return True
            self._fetching.add(sk)
            f = self._fetcher
            if f is None:
                f = self._fetcher = _Fetcher(self.socket, self.log, self.retry_interval, self._fetched,
                                             call_timeout=self.call_timeout)
        f.submit(sk)
        return True

    def _fetched(self, keys: List[bytes], codes: List[Status]) -> None:
        """The fetcher's answer for keys: OK (in the pool now), NOT_FOUND
        (gone, or dropped as corrupt: the next lookup misses), or a failure
        (the next lookup answers a miss, once)."""
        failed = [(k, st) for k, st in zip(keys, codes) if st not in (Status.OK, Status.NOT_FOUND)]
        with self._mu:
            self._fetching.difference_update(keys)
            self._fetch_failed.update(k for k, _ in failed)
        if failed:
            self._link.failed("fetch", Error(failed[0][1], f"fetch of {len(failed)} of {len(keys)} blocks"))

    def _pending_work(self) -> bool:
        """Whether fetches are in flight (the engine must keep stepping to
        ask again)."""
        with self._mu:
            return bool(self._fetching)

    def _prefix(self, ks: Iterable[Any]) -> int:
        """How many leading blocks are stored (renews nothing)."""
        keys = self._keys(ks)
        if not keys:
            return 0
        c = self._conn()
        if c is None:
            return 0
        try:
            return c.lookup_prefix(keys)
        except Exception as e:  # noqa: BLE001 - never raises
            self._link.failed("lookup", e, c)
            return 0

    def _prepare_load(self, ks: Iterable[Any]) -> TensorcastLoadStoreSpec:
        """Pins the blocks (never evicted or moved until complete_load) and
        says where they lie; a block not stored, or every block on a daemon
        error, has ok False."""
        keys = self._keys(ks)
        n = len(keys)
        c = self._conn() if n else None
        if c is None:
            return _missing(n)
        try:
            loc = c.get_locations(keys)
        except Exception as e:  # noqa: BLE001
            self._link.failed("prepare_load", e, c)
            return _missing(n)
        ok = [st == Status.OK for st in loc.codes]
        with self._mu:
            for k, good in zip(keys, ok):
                if good:
                    self._record(self._pins, k, c)
        return TensorcastLoadStoreSpec(list(loc.offsets), list(loc.lengths), ok, c.pool.identity)

    def _touch(self, ks: Iterable[Any]) -> None:
        """Marks the stored blocks among these as recently used (a get and
        its release: the daemon's LRU takes a value back at its head)."""
        keys = self._keys(ks)
        c = self._conn() if keys else None
        if c is None:
            return
        try:
            loc = c.get_locations(list(reversed(keys)))  # the first block ends most recent
            got = [k for k, st in zip(reversed(keys), loc.codes) if st == Status.OK]
            if got:
                c.release(got)
        except Exception as e:  # noqa: BLE001
            self._link.failed("touch", e, c)

    def _complete_load(self, ks: Iterable[Any]) -> None:
        """Unpins the blocks prepare_load pinned (one pin each)."""
        keys = self._keys(ks)
        with self._mu:
            taken = [(k, self._take(self._pins, k)) for k in keys]
        held = self._by_client(taken)
        if not held:
            return  # nothing pinned, or the connection (and its pins) went
        for c, mine in held:
            try:
                c.release(mine)
            except Exception as e:  # noqa: BLE001
                if not c.closed:  # closed meanwhile: the pins went with it
                    self._link.failed("complete_load", e, c)
        self._maybe_release_abandoned()

    def _prepare_store(self, ks: Iterable[Any]) -> Optional[Tuple[List[Any], TensorcastLoadStoreSpec]]:
        """Reserves a pool block for each block not stored yet: the blocks to
        store and where; None when none of them could be (the pool is full,
        the daemon is away)."""
        given = list(ks)
        keys = self._keys(given)
        none = ([], TensorcastLoadStoreSpec([], [], [], None))
        if not keys:
            return none
        c = self._conn()
        if c is None:
            return None
        try:
            there = c.exists(keys)
            want = [i for i, t in enumerate(there) if not t]
            if not want:
                return none
            r = c.reserve([keys[i] for i in want], self.block_size)
        except Exception as e:  # noqa: BLE001
            self._link.failed("prepare_store", e, c)
            return None
        got = [(i, off) for i, st, off in zip(want, r.codes, r.offsets) if st == Status.OK]
        if not got:
            if any(st not in (Status.ALREADY_EXISTS, Status.BUSY) for st in r.codes):
                return None  # could not store any (no room): vLLM retries later
            return none
        with self._mu:
            for i, _ in got:
                self._record(self._reserved, keys[i], c)
        spec = TensorcastLoadStoreSpec([off for _, off in got], [self.block_size] * len(got), [True] * len(got),
                                       c.pool.identity)
        return [given[i] for i, _ in got], spec

    def _complete_store(self, ks: Iterable[Any], success: bool) -> None:
        """With success, commits the blocks prepare_store reserved (durable:
        once on L2), after which they are loadable; without, aborts them."""
        given = list(ks)
        keys = self._keys(given)
        with self._mu:
            taken = [((h, k), self._take(self._reserved, k)) for h, k in zip(given, keys)]
        for c, mine in self._by_client(taken):
            self._complete_store_on(c, mine, success)
        self._maybe_release_abandoned()

    def _complete_store_on(self, c: Client, mine: List[Tuple[Any, bytes]], success: bool) -> None:
        """complete_store of the blocks (vLLM's key, store key) reserved on
        c."""
        if not success:
            self._abort(c, [k for _, k in mine])
            return
        try:
            codes = c.commit([k for _, k in mine], durable=self.durable)
        except Exception as e:  # noqa: BLE001
            self._link.failed("complete_store", e, c)
            codes = [Status.CLOSED] * len(mine)
        stored = [h for (h, _), st in zip(mine, codes) if st == Status.OK]
        # A key whose commit failed may still be reserved (a durable
        # commit that failed on L2 leaves it so): give it back. The
        # others are refused by the abort, harmlessly.
        failed = [k for (_, k), st in zip(mine, codes) if st != Status.OK]
        if failed and not c.closed:
            self._abort(c, failed)
        elif failed:
            with self._mu:
                self._abandoned += len(failed)
        if stored and self._events is not None:
            with self._mu:
                self._events.append((stored, False))

    def _take_events(self) -> List[Tuple[List[Any], bool]]:
        with self._mu:
            out = list(self._events or [])
            if self._events is not None:
                self._events.clear()
        return out

    @property
    def abandoned(self) -> int:
        """Reserved blocks neither committed nor given back by an abort,
        held until the connection closes."""
        with self._mu:
            return self._abandoned

    def close(self) -> None:
        with self._mu:
            self._closed = True
            f, self._fetcher = self._fetcher, None
            self._fetching.clear()
        if f is not None:
            f.close()
        self._link.close()

    def shutdown(self) -> None:
        self.close()


class _Fetcher:
    """A thread that brings stored values into the daemon's pool (a get and
    its release: the daemon reads a value on L2 only from L2, one stored on
    another host from that host, checks it and keeps it) on a connection of
    its own, so that the scheduler's calls never wait behind a fetch.
    done(keys, codes) gets each batch's answer (UNAVAILABLE for every key
    while the daemon is away)."""

    def __init__(self, socket: Optional[str], logger: logging.Logger, retry_interval: float,
                 done: Any, call_timeout: Optional[float] = CALL_TIMEOUT) -> None:
        self._link = Link(socket, "vllm-offload-fetch", logger, retry_interval=retry_interval,
                          call_timeout=call_timeout)
        self._done = done
        self._cv = threading.Condition()
        self._queue: List[bytes] = []
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="tensorcast-vllm-fetch", daemon=True)
        self._thread.start()

    def submit(self, key: bytes) -> None:
        with self._cv:
            self._queue.append(key)
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                batch, self._queue = self._queue, []
            self._done(batch, self._fetch(batch))

    def _fetch(self, keys: List[bytes]) -> List[Status]:
        c = self._link.client()
        if c is None:
            return [Status.UNAVAILABLE] * len(keys)
        try:
            loc = c.get_locations(keys)
            got = [k for k, st in zip(keys, loc.codes) if st == Status.OK]
            if got:
                c.release(got)
            return list(loc.codes)
        except Exception as e:  # noqa: BLE001 - the thread goes on
            self._link.failed("fetch", e, c)
            return [Status.UNAVAILABLE] * len(keys)

    def close(self) -> None:
        """Stops the thread; a fetch in flight ends with the connection."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._link.close()
        self._thread.join()


def _req_and_success(args: Sequence[Any], kw: Dict[str, Any]) -> bool:
    """complete_store's success, whether it comes second (keys, success) or
    after the request's context (keys, req_context, success)."""
    if "success" in kw:
        return bool(kw["success"])
    for a in args:
        if isinstance(a, bool):
            return a
    return True


class _BlocksInterface(_Manager):
    """vLLM's OffloadingManager up to 0.20: block hashes."""

    def lookup(self, block_hashes: Iterable[Any]) -> int:
        return self._prefix(block_hashes)

    def prepare_load(self, block_hashes: Iterable[Any]) -> TensorcastLoadStoreSpec:
        return self._prepare_load(block_hashes)

    def touch(self, block_hashes: Iterable[Any]) -> None:
        self._touch(block_hashes)

    def complete_load(self, block_hashes: Iterable[Any]) -> None:
        self._complete_load(block_hashes)

    def prepare_store(self, block_hashes: Iterable[Any]) -> Any:
        r = self._prepare_store(block_hashes)
        return None if r is None else PrepareStoreOutput(block_hashes_to_store=r[0], store_spec=r[1],
                                                         block_hashes_evicted=[])

    def complete_store(self, block_hashes: Iterable[Any], success: bool = True) -> None:
        self._complete_store(block_hashes, success)

    def take_events(self) -> Iterator[Any]:
        """The blocks stored since the last call (the daemon evicts on its
        own: no removal events)."""
        for ks, removed in self._take_events():
            yield OffloadingEvent(block_hashes=ks, block_size=self.block_tokens, medium=EVENT_MEDIUM, removed=removed)


class _KeysInterface(_Manager):
    """vLLM's OffloadingManager of OffloadKeys and request contexts; lookup
    answers True, False, or None (ask again later: a store of the block is
    in flight)."""

    def on_new_request(self, req_context: Any = None) -> Any:
        return _request_context()

    def on_request_finished(self, req_context: Any = None) -> None:
        return None

    def lookup(self, key: Any, req_context: Any = None) -> Any:
        st = self._state(key)
        return True if st is LookupResult.HIT else False if st is LookupResult.MISS else None

    def has_pending_work(self) -> bool:
        return self._pending_work()

    def prepare_load(self, keys: Iterable[Any], req_context: Any = None) -> TensorcastLoadStoreSpec:
        return self._prepare_load(keys)

    def touch(self, keys: Iterable[Any], req_context: Any = None) -> None:
        self._touch(keys)

    def complete_load(self, keys: Iterable[Any], req_context: Any = None) -> None:
        self._complete_load(keys)

    def prepare_store(self, keys: Iterable[Any], req_context: Any = None) -> Any:
        r = self._prepare_store(keys)
        return None if r is None else PrepareStoreOutput(keys_to_store=r[0], store_spec=r[1], evicted_keys=[])

    def complete_store(self, keys: Iterable[Any], *args: Any, **kw: Any) -> None:
        self._complete_store(keys, _req_and_success(args, kw))

    def take_events(self) -> Iterator[Any]:
        """The blocks stored since the last call (the daemon evicts on its
        own: no removal events)."""
        for ks, removed in self._take_events():
            yield OffloadingEvent(keys=ks, medium=EVENT_MEDIUM, removed=removed)


class _ResultsInterface(_KeysInterface):
    """vLLM's newest OffloadingManager: lookup answers a LookupResult."""

    def lookup(self, key: Any, req_context: Any = None) -> Any:
        return self._state(key)


_INTERFACES = {"blocks": _BlocksInterface, "keys": _KeysInterface, "results": _ResultsInterface}
_bases: Tuple[type, ...] = (_INTERFACES[GENERATION],) if _ManagerBase is object else (_INTERFACES[GENERATION],
                                                                                      _ManagerBase)


class TensorcastOffloadingManager(*_bases):  # type: ignore[misc]
    """vLLM's OffloadingManager on tensorcast's store, in the interface of
    GENERATION (see the module's doc). block_size is the bytes of one
    offloaded block's value (every rank's part); fingerprint, the layout
    fingerprint the keys are bound to; block_tokens, the tokens of one
    block (for events)."""


# -- the spec vLLM's factory builds -------------------------------------------------------


@dataclass(frozen=True)
class BlockLayout:
    """What one offloaded block is, the same in the scheduler and every
    worker: ``tokens`` tokens, ``factor`` GPU blocks of ``gpu_tokens``;
    ``rank_bytes`` KV bytes of one rank; ``world_size`` ranks, rank after
    rank in the value, or, ``replicated``, one copy that every rank holds
    alike (an MLA model's latent KV under tensor parallelism alone), written
    by rank 0 and read by all; ``fingerprint`` binds the keys to all of
    it."""

    tokens: int
    gpu_tokens: int
    factor: int
    rank_bytes: int
    world_size: int
    fingerprint: str
    replicated: bool = False

    @property
    def value_bytes(self) -> int:
        return self.rank_bytes if self.replicated else self.rank_bytes * self.world_size


def _get(obj: Any, *path: str, default: Any = None) -> Any:
    for name in path:
        obj = getattr(obj, name, None)
        if obj is None:
            return default
    return obj


def _gpu_block_bytes(vllm_config: Any, kv_cache_config: Any) -> int:
    """One rank's KV bytes per GPU block: its KV cache tensors' bytes over
    their blocks when the KV cache config is known, else the model's
    layers x K and V x heads x head size x dtype size x tokens."""
    tensors = _get(kv_cache_config, "kv_cache_tensors")
    blocks = _get(kv_cache_config, "num_blocks")
    if tensors and blocks:
        total = sum(int(t.size) for t in tensors)
        if total % int(blocks):
            raise ValueError(f"tensorcast: KV cache tensors of {total} bytes are not {blocks} equal blocks")
        return total // int(blocks)
    groups = _get(kv_cache_config, "kv_cache_groups")
    if tensors and groups:
        return int(groups[0].kv_cache_spec.page_size_bytes) * len(tensors)
    mc, pc = vllm_config.model_config, vllm_config.parallel_config
    if getattr(mc, "use_mla", False):
        raise ValueError("tensorcast: an MLA model needs the KV cache config (a newer vLLM)")
    import torch  # the dtype's size

    dt = str(_get(vllm_config, "cache_config", "cache_dtype", default="auto"))
    dtype = mc.dtype if dt == "auto" else getattr(torch, dt.replace("fp8", "float8_e4m3fn"), mc.dtype)
    esize = torch.empty((), dtype=dtype).element_size()
    return (int(mc.get_num_layers(pc)) * 2 * int(mc.get_num_kv_heads(pc)) * int(mc.get_head_size()) * esize
            * int(vllm_config.cache_config.block_size))


def block_layout(vllm_config: Any, kv_cache_config: Any = None) -> BlockLayout:
    """The offloaded block of this engine (see BlockLayout), from vLLM's
    config and, where vLLM gives it, the KV cache config; raises
    ValueError for a block size that does not fit."""
    extra = dict(_get(vllm_config, "kv_transfer_config", "kv_connector_extra_config", default={}) or {})
    groups = _get(kv_cache_config, "kv_cache_groups") or []
    gpu_sizes = {int(g.kv_cache_spec.block_size) for g in groups} or {int(vllm_config.cache_config.block_size)}
    if len(gpu_sizes) != 1:
        raise ValueError(f"tensorcast: KV cache groups of several block sizes {sorted(gpu_sizes)}")
    gpu = gpu_sizes.pop()
    tokens = int(extra.get("block_size", gpu))
    if tokens <= 0 or tokens % gpu:
        raise ValueError(f"tensorcast: block_size {tokens} is not a multiple of vLLM's block size {gpu}")
    factor = tokens // gpu
    pc = vllm_config.parallel_config
    world = int(getattr(pc, "world_size", 1) or 1)
    rank_bytes = _gpu_block_bytes(vllm_config, kv_cache_config) * factor
    mc = vllm_config.model_config
    cache_dtype = str(_get(vllm_config, "cache_config", "cache_dtype", default="auto"))
    tp = int(getattr(pc, "tensor_parallel_size", 1) or 1)
    # An MLA model's latent KV is the same on every rank of a world that is
    # tensor parallel alone (no pipeline stages, no context parallelism).
    replicated = bool(getattr(mc, "use_mla", False)) and world > 1 and world == tp and all(
        int(getattr(pc, a, 1) or 1) == 1 for a in ("pipeline_parallel_size", "decode_context_parallel_size",
                                                   "prefill_context_parallel_size"))
    fp = layout.fingerprint(
        engine="vllm", kv_layout="replicated/v1" if replicated else "rank-major/v1",
        model=str(getattr(mc, "model", "")), revision=str(getattr(mc, "revision", None)),
        dtype=str(getattr(mc, "dtype", "")) if cache_dtype == "auto" else cache_dtype,
        page_size=tokens, gpu_block_size=gpu, rank_bytes=rank_bytes, world_size=world,
        tp_size=int(getattr(pc, "tensor_parallel_size", 1) or 1),
        pp_size=int(getattr(pc, "pipeline_parallel_size", 1) or 1),
        num_kv_tensors=len(_get(kv_cache_config, "kv_cache_tensors") or ()),
        hash_algo=str(_get(vllm_config, "cache_config", "prefix_caching_hash_algo", default="")),
        hash_block_size=int(vllm_config.cache_config.block_size))
    return BlockLayout(tokens, gpu, factor, rank_bytes, world, fp, replicated)


def offloading_config_layout(config: Any) -> Tuple[BlockLayout, int]:
    """The offloaded block and this process's rank from vLLM's
    OffloadingConfig (vLLM 0.26 on): one chunk of ``blocks_per_chunk``
    blocks of ``tokens_per_block`` tokens, ``worker_kv_bytes_per_block``
    bytes of each rank per block."""
    sizes = {int(g.tokens_per_block) for g in config.groups}
    if len(sizes) != 1:
        raise ValueError(f"tensorcast: KV cache groups of several block sizes {sorted(sizes)}")
    gpu = sizes.pop()
    factor = int(config.cache.blocks_per_chunk)
    if factor <= 0:
        raise ValueError(f"tensorcast: {factor} blocks per chunk")
    p = config.parallel
    rank_bytes = int(config.worker_kv_bytes_per_block) * factor
    # vLLM says when every worker's bytes of a block are the same (a pure
    # MLA model under tensor parallelism alone): one copy is stored.
    replicated = bool(getattr(config, "replicated_layout", False)) and int(p.world_size) > 1
    fp = layout.fingerprint(
        engine="vllm", kv_layout="replicated/v1" if replicated else "rank-major/v1", model=str(config.model.name),
        revision="None",
        dtype=str(config.model.dtype), page_size=gpu * factor, gpu_block_size=gpu, rank_bytes=rank_bytes,
        world_size=int(p.world_size), tp_size=int(p.tp_size), pp_size=int(p.pp_size),
        pcp_size=int(getattr(p, "pcp_size", 1)), dcp_size=int(getattr(p, "dcp_size", 1)),
        num_kv_groups=len(config.groups), hash_block_size=int(config.cache.tokens_per_hash))
    return BlockLayout(gpu * factor, gpu, factor, rank_bytes, int(p.world_size), fp, replicated), int(p.rank)


class TensorcastOffloadingSpec(_SpecBase):
    """vLLM's OffloadingSpec for tensorcast, built by vLLM's factory from
    ``spec_name`` and ``spec_module_path`` (see the module's doc) as
    ``cls(vllm_config)``, ``cls(vllm_config, kv_cache_config)`` or, from
    vLLM 0.26, ``cls(offloading_config)``.

    Extra config: ``socket`` (the daemon's; default $TENSORCAST_SOCKET, else
    the default socket), ``block_size`` (tokens per offloaded block, a
    multiple of vLLM's, where vLLM does not chunk blocks itself),
    ``durable`` (complete a store only once on L2), ``retry_interval``
    (seconds between dials while the daemon is away), ``call_timeout``
    (seconds each call may take before it fails and the connection is
    dialled again; default 60, 0 for no bound)."""

    def __init__(self, config: Any, kv_cache_config: Any = None, *args: Any) -> None:
        if _SpecBase is not object:
            super().__init__(config, *((kv_cache_config,) if kv_cache_config is not None else ()), *args)
        if hasattr(config, "worker_kv_bytes_per_block"):  # vLLM's OffloadingConfig
            self.block, self.rank = offloading_config_layout(config)
            extra = dict(config.extra_config or {})
            self.events = bool(config.enable_kv_cache_events)
        else:
            self.vllm_config = config
            self.kv_cache_config = kv_cache_config
            extra = dict(_get(config, "kv_transfer_config", "kv_connector_extra_config", default={}) or {})
            self.block = block_layout(config, kv_cache_config)
            self.rank = _rank(config)
            self.events = bool(_get(config, "kv_events_config", "enable_kv_cache_events", default=False))
        self.extra_config = extra
        self.socket: Optional[str] = extra.get("socket")
        self.durable = bool(extra.get("durable", False))
        self.retry_interval = float(extra.get("retry_interval", 1.0))
        self.call_timeout = call_timeout_option(extra.get("call_timeout", CALL_TIMEOUT))
        self._manager: Optional[TensorcastOffloadingManager] = None
        self._handlers: Any = None

    def get_manager(self) -> TensorcastOffloadingManager:
        if self._manager is None:
            self._manager = TensorcastOffloadingManager(
                self.block.value_bytes, fingerprint=self.block.fingerprint, socket=self.socket,
                durable=self.durable, enable_events=self.events, block_tokens=self.block.tokens,
                retry_interval=self.retry_interval, call_timeout=self.call_timeout)
        return self._manager

    def _shared(self, kv_caches: Any, attn_backends: Any = None) -> Any:
        from .vllm_worker import Handlers

        if self._handlers is None:
            self._handlers = Handlers(kv_caches, self.block, rank=self.rank, socket=self.socket,
                                      attn_backends=attn_backends, retry_interval=self.retry_interval,
                                      call_timeout=self.call_timeout)
        return self._handlers

    def get_handlers(self, kv_caches: Any, attn_backends: Any = None) -> Iterator[Tuple[type, type, Any]]:
        """This worker's handlers (vLLM up to 0.24): (GPU spec,
        TensorcastLoadStoreSpec, store handler) and (TensorcastLoadStoreSpec,
        GPU spec, load handler). kv_caches is vLLM's: a dict of layer name
        to tensor, or its canonical KV caches."""
        from .vllm_worker import GPULoadStoreSpec

        h = self._shared(kv_caches, attn_backends)
        yield GPULoadStoreSpec, TensorcastLoadStoreSpec, h.store
        yield TensorcastLoadStoreSpec, GPULoadStoreSpec, h.load

    def get_worker(self, kv_caches: Any) -> Any:
        """This worker's OffloadingWorker (vLLM 0.25 on), over its canonical
        KV caches."""
        return self._shared(kv_caches).worker


def _rank(vllm_config: Any) -> int:
    """This worker's rank among the world_size ranks of one engine."""
    r = _get(vllm_config, "parallel_config", "rank")
    if r is not None:
        return int(r)
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except ImportError:  # pragma: no cover - torch is there when vLLM is
        pass
    return 0
