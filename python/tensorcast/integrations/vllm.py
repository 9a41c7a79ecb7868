"""vLLM KV offloading on tensorcast: an object with the shape of vLLM's
``OffloadingManager`` (``vllm.v1.kv_offload.abstract``), which runs in the
scheduler, decides what is offloaded and where it lies, with tensorcast's KV
block store as the offloading medium.

Each offloaded block is one key (``key_prefix`` + its block hash) whose value
is one block of ``block_size`` bytes in the daemon's pool:

- ``lookup(hashes)``: how many leading blocks are stored (one lookup_prefix
  through the store's queue; renews nothing).
- ``prepare_load(hashes)``: pins each block and says where it lies in the
  pool (a :class:`TensorcastLoadStoreSpec`): a pinned block is never evicted
  or moved until ``complete_load``.
- ``touch(hashes)``: marks the blocks recently used.
- ``prepare_store(hashes)``: skips the blocks already stored, reserves a pool
  block for each of the others and says where (the worker writes the KV
  data there); ``complete_store(hashes)`` commits them, after which they are
  loadable.

A worker reaches the same pool with a client of its own (``spec.views(c)``
gives writable memoryviews of the blocks in that client's mapping).

Failures: no call raises on a daemon error. ``lookup`` answers 0,
``prepare_store`` None (cannot store now), ``prepare_load`` a spec whose
blocks are all missing (``ok`` False: load nothing from them), and the
``complete_*`` calls drop what they cannot finish; the outage is logged once
and a later call reconnects. Pins and reservations belong to the connection
and went with it.

A reservation that is not committed (``complete_store(success=False)``, or a
commit that fails) is given back at once with the store's abort, so its pool
blocks are free again and its keys can be stored by the next attempt. Only
when the abort itself cannot be made (the daemon is failing) are the blocks
counted as abandoned: once ``abandon_limit`` of them are held and no load or
store is in flight, the manager reconnects, which releases them.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Optional

from ..client import Client
from ..errors import Status
from ._link import Link

__all__ = ["OffloadingEvent", "PrepareStoreOutput", "TensorcastLoadStoreSpec", "TensorcastOffloadingManager"]

log = logging.getLogger("tensorcast.integrations.vllm")


@dataclass
class TensorcastLoadStoreSpec:
    """Where blocks lie in the daemon's pool: offsets[i] and lengths[i] for
    block_hashes[i]; ok[i] False for a block that is not there (a load must
    skip it)."""

    block_hashes: List[Any]
    offsets: List[int]
    lengths: List[int]
    ok: List[bool]

    @staticmethod
    def medium() -> str:
        return "TENSORCAST"

    def views(self, client: Client) -> List[Optional[memoryview]]:
        """The blocks as writable memoryviews of client's mapping of the
        pool (None where ok is False)."""
        pv = client.pool.view
        return [pv[o:o + n] if good else None for o, n, good in zip(self.offsets, self.lengths, self.ok)]


@dataclass
class PrepareStoreOutput:
    """vLLM's PrepareStoreOutput: the blocks to store, where, and the blocks
    evicted to make room (the daemon evicts on its own: none reported)."""

    block_hashes_to_store: List[Any]
    store_spec: TensorcastLoadStoreSpec
    block_hashes_evicted: List[Any] = field(default_factory=list)


@dataclass
class OffloadingEvent:
    block_hashes: List[Any]
    block_size: int
    medium: str
    removed: bool


def _key(prefix: bytes, h: Any) -> bytes:
    if isinstance(h, (bytes, bytearray, memoryview)):
        return prefix + bytes(h)
    if isinstance(h, int):
        return prefix + b"%x" % (h & ((1 << 256) - 1))
    return prefix + str(h).encode()


class TensorcastOffloadingManager:
    """An OffloadingManager on tensorcast's store (see the module's doc).
    block_size is the bytes of one offloaded block."""

    def __init__(self, block_size: int, *, socket: Optional[str] = None, key_prefix: bytes = b"vllm/",
                 durable: bool = False, enable_events: bool = False, retry_interval: float = 1.0,
                 abandon_limit: int = 64, logger: Optional[logging.Logger] = None) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size {block_size}")
        self.block_size = block_size
        self.prefix = bytes(key_prefix)
        self.durable = durable
        self.abandon_limit = abandon_limit
        self.log = logger or log
        # mu guards the fields below: what this manager holds on the
        # connection it made them on (pins of loads, reservations of stores,
        # keyed by the block's key with a count) and its events.
        self._mu = threading.Lock()
        self._owner: Optional[Client] = None
        self._pins: Dict[bytes, int] = {}
        self._reserved: Dict[bytes, int] = {}
        self._abandoned = 0
        self._events: Optional[List[OffloadingEvent]] = [] if enable_events else None
        self._link = Link(socket, "vllm-offload", self.log, retry_interval=retry_interval)

    # -- the connection and what it holds -----------------------------------------

    def _conn(self) -> Optional[Client]:
        c = self._link.client()
        if c is None:
            return None
        with self._mu:
            if c is not self._owner:
                # A new connection holds nothing: what the old one held went
                # with it.
                self._owner = c
                self._pins.clear()
                self._reserved.clear()
                self._abandoned = 0
        return c

    def _keys(self, hashes: Iterable[Any]) -> List[bytes]:
        return [_key(self.prefix, h) for h in hashes]

    @staticmethod
    def _take(held: Dict[bytes, int], k: bytes) -> bool:
        n = held.get(k, 0)
        if n == 0:
            return False
        if n == 1:
            del held[k]
        else:
            held[k] = n - 1
        return True

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

    # -- OffloadingManager ---------------------------------------------------------

    def lookup(self, block_hashes: Iterable[Any]) -> int:
        """How many leading blocks are offloaded (renews nothing)."""
        keys = self._keys(block_hashes)
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

    def prepare_load(self, block_hashes: Iterable[Any]) -> TensorcastLoadStoreSpec:
        """Pins the blocks (never evicted or moved until complete_load) and
        says where they lie; a block not stored, or every block on a daemon
        error, has ok False."""
        hashes = list(block_hashes)
        keys = self._keys(hashes)
        n = len(keys)
        missing = TensorcastLoadStoreSpec(hashes, [0] * n, [0] * n, [False] * n)
        c = self._conn() if n else None
        if c is None:
            return missing
        try:
            loc = c.get_locations(keys)
        except Exception as e:  # noqa: BLE001
            self._link.failed("prepare_load", e, c)
            return missing
        ok = [st == Status.OK for st in loc.codes]
        with self._mu:
            if c is self._owner:
                for k, good in zip(keys, ok):
                    if good:
                        self._pins[k] = self._pins.get(k, 0) + 1
        return TensorcastLoadStoreSpec(hashes, loc.offsets, loc.lengths, ok)

    def touch(self, block_hashes: Iterable[Any]) -> None:
        """Marks the stored blocks among these as recently used (a get and
        its release: the daemon's LRU takes a value back at its head)."""
        keys = self._keys(block_hashes)
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

    def complete_load(self, block_hashes: Iterable[Any]) -> None:
        """Unpins the blocks prepare_load pinned (one pin each)."""
        keys = self._keys(block_hashes)
        with self._mu:
            c = self._owner
            mine = [k for k in keys if self._take(self._pins, k)]
        if not mine or c is None or c.closed:
            return  # nothing pinned, or the connection (and its pins) went
        try:
            c.release(mine)
        except Exception as e:  # noqa: BLE001
            self._link.failed("complete_load", e, c)
        self._maybe_release_abandoned()

    def prepare_store(self, block_hashes: Iterable[Any]) -> Optional[PrepareStoreOutput]:
        """Reserves a pool block for each block not stored yet and says
        where; None when none of them could be (the pool is full, the daemon
        is away)."""
        hashes = list(block_hashes)
        keys = self._keys(hashes)
        if not keys:
            return PrepareStoreOutput([], TensorcastLoadStoreSpec([], [], [], []))
        c = self._conn()
        if c is None:
            return None
        try:
            there = c.exists(keys)
            want = [i for i, t in enumerate(there) if not t]
            if not want:
                return PrepareStoreOutput([], TensorcastLoadStoreSpec([], [], [], []))
            r = c.reserve([keys[i] for i in want], self.block_size)
        except Exception as e:  # noqa: BLE001
            self._link.failed("prepare_store", e, c)
            return None
        got = [(i, off) for i, st, off in zip(want, r.codes, r.offsets) if st == Status.OK]
        if not got:
            if any(st not in (Status.ALREADY_EXISTS, Status.BUSY) for st in r.codes):
                return None  # could not store any (no room): vLLM retries later
            return PrepareStoreOutput([], TensorcastLoadStoreSpec([], [], [], []))
        with self._mu:
            if c is self._owner:
                for i, _ in got:
                    self._reserved[keys[i]] = self._reserved.get(keys[i], 0) + 1
        to_store = [hashes[i] for i, _ in got]
        spec = TensorcastLoadStoreSpec(to_store, [off for _, off in got], [self.block_size] * len(got),
                                       [True] * len(got))
        return PrepareStoreOutput(to_store, spec)

    def complete_store(self, block_hashes: Iterable[Any], success: bool = True) -> None:
        """With success, commits the blocks prepare_store reserved (durable:
        once on L2), after which they are loadable; without, aborts them
        (see the module's doc)."""
        hashes = list(block_hashes)
        keys = self._keys(hashes)
        with self._mu:
            c = self._owner
            mine = [(h, k) for h, k in zip(hashes, keys) if self._take(self._reserved, k)]
        if mine and c is not None and not c.closed:
            if not success:
                self._abort(c, [k for _, k in mine])
                self._maybe_release_abandoned()
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
                    self._events.append(OffloadingEvent(stored, self.block_size, TensorcastLoadStoreSpec.medium(),
                                                        False))
        self._maybe_release_abandoned()

    def take_events(self) -> Iterator[OffloadingEvent]:
        """The blocks stored since the last call (the daemon evicts on its
        own: no removal events)."""
        with self._mu:
            out = list(self._events or [])
            if self._events is not None:
                self._events.clear()
        yield from out

    @property
    def abandoned(self) -> int:
        """Reserved blocks neither committed nor given back by an abort,
        held until the connection closes."""
        with self._mu:
            return self._abandoned

    def close(self) -> None:
        self._link.close()
