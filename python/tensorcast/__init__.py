"""tensorcast: the Python client of tensorcastd.

Pure Python on ctypes over libtensorcast (the C client library); no
third-party package is needed. numpy and torch are used when present, by the
buffer protocol, for zero-copy arrays over the daemon's pool and over client
buffers.

    import tensorcast

    with tensorcast.connect() as c:            # $TENSORCAST_SOCKET, then the default path
        offs = c.alloc_blocks(4, 64 << 10)     # pool blocks, mapped here
        c.pool.view[offs[0]:offs[0] + 5] = b"hello"
        buf = c.create_buffer(1 << 20)         # a sealed memfd, registered
        r = c.transfer([tensorcast.Request(tensorcast.Op.READ, buf.id, 0,
                                           c.pool.segment, offs[0], 64 << 10)], timeout=5)
        assert r.codes == [tensorcast.Status.OK]

The shared-memory queue (``c.open_queue(entries)``) keeps many requests in
flight on one connection: ``q.submit(requests, user_data)`` and
``q.reap(max, min=1, timeout=None)``, one :class:`Completion` per request.

The KV block store: ``c.put(keys, values, durable=False)``, ``c.get(keys,
outs)``, ``c.exists(keys)``, ``c.lookup_prefix(keys)``, ``c.remove(keys)``,
and zero copy ``c.reserve(keys, sizes)`` (writable views into the pool, then
``.commit()``, or ``.abort()`` to give them back) and ``with c.get_pinned(keys) as views`` (see
:mod:`tensorcast.store`).

Calls that fail as a whole raise :class:`Error` (``.code`` is a
:class:`Status`); batch calls return one :class:`Status` per item.
"""

from . import client as _client
from ._lib import path as library_path
from .client import *  # noqa: F401,F403 (the names of client.__all__)
from .queues import Completion, Queue, QueueInfo
from .store import MAX_KEY, Codes, Extent, Handle, Holder, Key, KeyInfo, KeyLocation, Lease, PinnedValues, Reservation

__all__ = [
    *_client.__all__,
    "Codes",
    "Completion",
    "Extent",
    "Handle",
    "Holder",
    "Key",
    "KeyInfo",
    "KeyLocation",
    "Lease",
    "MAX_KEY",
    "PinnedValues",
    "Queue",
    "QueueInfo",
    "Reservation",
    "library_path",
]
