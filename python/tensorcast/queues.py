"""The shared-memory queue: many requests in flight on one connection.

:meth:`Client.open_queue` maps a submission ring and a completion ring that
the daemon shares with this process. :meth:`Queue.submit` writes requests
into the ring and returns how many went in; :meth:`Queue.reap` returns the
completions, one per request accepted, in no particular order (the
``user_data`` given at submit says which). While both sides are busy
neither makes a system call; a reap with too little ready spins briefly,
then sleeps in libtensorcast with the GIL released.

    with c.open_queue(256) as q:
        n = q.submit(requests, user_data=range(len(requests)))
        for done in q.reap(64, min=n, timeout=5):
            assert done.status == tensorcast.Status.OK, done
"""

from __future__ import annotations

import ctypes
import math
import threading
from typing import TYPE_CHECKING, Any, Iterable, List, NamedTuple, Optional, Sequence

from . import _lib
from ._lib import lib
from .client import MAX_NOTIFY, Error, Request, Status, TaskState
from .store import _on_collect

if TYPE_CHECKING:
    from .client import Client

__all__ = ["Completion", "Queue", "QueueInfo"]

# tc_queue_opts.flags: no spin before a reap sleeps.
_NOSPIN = 1


class Completion(NamedTuple):
    """The end of one submitted request: its user_data, the bytes it moved,
    its Status (OK, or why not) and its final TaskState (FAILED for a
    request the daemon refused before it ran)."""

    user_data: int
    transferred: int
    status: Status
    state: TaskState


class QueueInfo(NamedTuple):
    """A queue's geometry as the daemon made it, its state bits (1: closed
    by the daemon, 2: broken by an invalid index) and its counters."""

    id: int
    sq_entries: int
    cq_entries: int
    data_size: int
    state: int
    submitted: int
    reaped: int
    submit_doorbells: int
    reap_doorbells: int
    sleeps: int
    missed_wakeups: int
    naps: int
    late_wakes: int


def _ns(timeout: Optional[float]) -> int:
    """seconds as nanoseconds for a reap: None waits without a limit."""
    if timeout is None:
        return -1
    if timeout <= 0:
        return 0
    return min(math.ceil(timeout * 1e9), (1 << 63) - 1)


class Queue:
    """A queue of one connection (see the module's doc).

    One thread at a time submits and one at a time reaps; a submitting and
    a reaping thread may run at once (each side is serialized in the
    library). :meth:`close` may be called from any thread: a reap waiting in
    another thread then ends with Status.CLOSED. The queue is closed with
    its client too; one dropped unclosed is closed by the client's next call
    (and a warning is logged, once)."""

    def __init__(self, client: "Client", raw: int) -> None:
        self._client = client
        self._q: Optional[int] = raw
        # _cv guards _q, _active and _closing: close waits for the calls in
        # the library to leave before it frees the queue.
        self._cv = threading.Condition()
        self._active = 0
        self._closing = False
        info = self.info()
        self.id = info.id
        self.sq_entries = info.sq_entries
        self.cq_entries = info.cq_entries
        self.data_size = info.data_size
        # Reused arrays: the submission side's and the completion side's.
        self._reqs = (_lib.Request * info.sq_entries)()
        self._uds = (ctypes.c_uint64 * info.sq_entries)()
        self._cqes = (_lib.Cqe * info.cq_entries)()
        self._sq_lock = threading.Lock()
        self._cq_lock = threading.Lock()
        # A queue dropped unclosed is closed by the client's next call: its
        # collection may come on any thread, at any allocation, while the
        # connection is busy with another thread's wait, and the close is a
        # round trip on it.
        self._given = _on_collect(self, client, "queue", "_close_dropped_queue", raw)

    # -- lifecycle -------------------------------------------------------------

    def _enter(self) -> int:
        self._client._enter()  # tc_close frees queues: the client waits for us
        with self._cv:
            if self._q is None or self._closing:
                self._client._leave()
                raise Error(Status.CLOSED, "the queue is closed")
            self._active += 1
            return self._q

    def _leave(self) -> None:
        with self._cv:
            self._active -= 1
            if self._closing and self._active == 0:
                self._cv.notify_all()
        self._client._leave()

    def _detach(self) -> None:
        """The client is closing (no call is inside the queue): tc_close
        releases it."""
        self._given.detach()
        with self._cv:
            self._q = None

    @property
    def closed(self) -> bool:
        return self._q is None

    def shutdown(self) -> None:
        """Stops the queue from any thread without releasing it: a reap
        waiting elsewhere ends with Status.CLOSED, later submits too."""
        with self._cv:
            if self._q is not None:
                lib.tc_queue_shutdown(self._q)

    def close(self) -> None:
        """Closes the queue: the daemon ends what is in flight (completions
        not yet reaped are lost) and the mapping is released."""
        self._given.detach()
        try:
            self._client._enter()
        except Error:
            self._detach()  # the client is closed: tc_close released it
            return
        try:
            with self._cv:
                q = self._q
                if q is None or self._closing:
                    return
                self._closing = True
                lib.tc_queue_shutdown(q)
                while self._active:
                    self._cv.wait()
            rc = lib.tc_queue_close(q)
            with self._cv:
                self._q = None
        finally:
            self._client._leave()
        if rc not in (Status.OK, Status.CLOSED):
            raise Error(rc, f"close queue {self.id}")

    def __enter__(self) -> "Queue":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- submission --------------------------------------------------------------

    def submit(self, requests: Sequence[Request], user_data: Iterable[int],
               notify: Optional[Sequence[Optional[bytes]]] = None) -> int:
        """Queues requests[i] with user_data[i], in order, and returns how
        many went in: fewer than len(requests) when the submission ring is
        full (reap, then submit the rest). Each one accepted gets exactly one
        Completion. notify, when given, holds a payload (or None) per request,
        carried by WRITEs to a peer's subscribed client; a submission also
        stops early when the queue's data area has no room for more."""
        uds = list(user_data)
        n = len(requests)
        if len(uds) != n:
            raise Error(Status.INVALID_ARGUMENT, f"{n} requests with {len(uds)} user data")
        if notify is not None and len(notify) != n:
            raise Error(Status.INVALID_ARGUMENT, f"{len(notify)} notifications for {n} requests")
        n = min(n, self.sq_entries)  # more cannot go in at once
        if n == 0:
            return 0
        keep: List[bytes] = []
        narr: Any = None
        if notify is not None:
            narr = (_lib.Notify * n)()
            for i in range(n):
                p = bytes(notify[i]) if notify[i] else b""
                if len(p) > MAX_NOTIFY:
                    raise Error(Status.INVALID_ARGUMENT, f"notification {i} has {len(p)} bytes (max {MAX_NOTIFY})")
                keep.append(p)
                if p:
                    narr[i].payload = ctypes.cast(ctypes.c_char_p(p), ctypes.c_void_p)
                    narr[i].len = len(p)
        accepted = ctypes.c_size_t()
        q = self._enter()
        try:
            with self._sq_lock:
                arr, ua = self._reqs, self._uds
                for i in range(n):
                    r = requests[i]
                    a = arr[i]
                    a.op = int(r[0])
                    a.local, a.local_offset, a.target, a.target_offset, a.length = r[1], r[2], r[3], r[4], r[5]
                    ua[i] = uds[i]
                if narr is None:
                    rc = lib.tc_queue_submit(q, arr, ua, n, ctypes.byref(accepted))
                else:
                    rc = lib.tc_queue_submit_notify(q, arr, narr, ua, n, ctypes.byref(accepted))
        finally:
            self._leave()
        del keep
        if rc:
            raise Error(rc, f"submit on queue {self.id} ({accepted.value} accepted)", ctypes.get_errno())
        return accepted.value

    def nop(self, user_data: int) -> bool:
        """Queues a request that moves nothing and completes at once: a round
        trip through the queue itself. False when the ring is full."""
        accepted = ctypes.c_size_t()
        q = self._enter()
        try:
            rc = lib.tc_queue_nop(q, user_data, ctypes.byref(accepted))
        finally:
            self._leave()
        if rc:
            raise Error(rc, f"nop on queue {self.id}")
        return accepted.value == 1

    # -- completion ----------------------------------------------------------------

    def reap(self, max: Optional[int] = None, min: int = 1, timeout: Optional[float] = None) -> List[Completion]:
        """Up to max completions (None: as many as the ring holds), waiting
        until at least min are ready or timeout seconds pass (None: no
        limit; 0: no wait). Fewer than min come back when the time ran out.
        Once the queue is closed (by close, by the daemon, or the daemon
        died) the completions still ready come back first; then it raises
        Error(Status.CLOSED)."""
        want = self.cq_entries if max is None else max
        if want < 0 or min < 0 or min > want or min > self.cq_entries:
            raise Error(Status.INVALID_ARGUMENT, f"reap of at most {want} with at least {min}")
        want = want if want < self.cq_entries else self.cq_entries
        got = ctypes.c_size_t()
        q = self._enter()
        try:
            with self._cq_lock:
                rc = lib.tc_queue_reap(q, self._cqes, want, min, _ns(timeout), ctypes.byref(got))
                out = [Completion(e.user_data, e.transferred, Status(e.code), TaskState(e.state))
                       for e in self._cqes[:got.value]]
        finally:
            self._leave()
        if rc and rc != Status.DEADLINE_EXCEEDED and not out:
            raise Error(rc, f"reap on queue {self.id}", ctypes.get_errno())
        return out

    def wait(self, min: int = 1, timeout: Optional[float] = None) -> bool:
        """Waits until at least min completions are ready, without taking
        them: False when timeout seconds passed first."""
        if min < 0 or min > self.cq_entries:
            raise Error(Status.INVALID_ARGUMENT, f"wait for {min} completions on a ring of {self.cq_entries}")
        q = self._enter()
        try:
            rc = lib.tc_queue_wait(q, min, _ns(timeout))
        finally:
            self._leave()
        if rc == Status.DEADLINE_EXCEEDED:
            return False
        if rc:
            raise Error(rc, f"wait on queue {self.id}", ctypes.get_errno())
        return True

    def info(self) -> QueueInfo:
        """The geometry, state and counters (see tc_queue_info)."""
        i = _lib.QueueInfo()
        w = _lib.QueueWaits()
        with self._cv:
            if self._q is None:
                raise Error(Status.CLOSED, "the queue is closed")
            lib.tc_queue_get_info(self._q, ctypes.byref(i))
            lib.tc_queue_get_waits(self._q, ctypes.byref(w))
        return QueueInfo(i.id, i.sq_entries, i.cq_entries, i.data_size, i.state, i.submitted, i.reaped,
                         i.submit_doorbells, i.reap_doorbells, i.sleeps, i.missed_wakeups,
                         w.naps, w.late_wakes)
