"""The shared-memory queue (Client.open_queue) against real daemons, with the
standard library only (this module also runs on interpreters without numpy
and torch)."""

from __future__ import annotations

import threading
import time
import unittest
from typing import Dict, List

import tensorcast
from tensorcast import Completion, Error, Op, Request, Status, TaskState

from .daemon import Daemon, blocked_in_futex
from .test_core import Blocked, DaemonCase, pattern


def reap_all(q: tensorcast.Queue, n: int) -> Dict[int, Completion]:
    """n completions by user_data, each exactly once, within 10 s."""
    got: Dict[int, Completion] = {}
    deadline = time.monotonic() + 10
    while len(got) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"{len(got)} of {n} completions within 10 s")
        for c in q.reap(64, min=1, timeout=left):
            if c.user_data in got:
                raise AssertionError(f"a second completion for {c.user_data}")
            got[c.user_data] = c
    return got


class Reaper(Blocked):
    """A reap on its own thread, asleep on the queue's futex."""

    def start_blocked(self) -> "Reaper":
        self.start()
        self.started_id.wait()
        deadline = time.monotonic() + 10
        while not blocked_in_futex(self.native):
            if time.monotonic() > deadline:
                raise AssertionError("the reap did not sleep in the library within 10 s")
            time.sleep(0.001)
        return self


class TestQueue(DaemonCase):
    def test_bytes_both_ways(self) -> None:
        c = self.connect()
        with c.open_queue(64, request_timeout=5) as q:
            self.assertEqual((q.sq_entries, q.cq_entries), (64, 128))
            buf = c.create_buffer(1 << 20)
            buf.view[:] = pattern(1 << 20, 9)
            offs = c.alloc_blocks(16, 64 << 10)
            seg = c.pool.segment
            writes = [Request(Op.WRITE, buf.id, i << 16, seg, off, 64 << 10) for i, off in enumerate(offs)]
            self.assertEqual(q.submit(writes, range(100, 116)), 16)
            for ud, done in reap_all(q, 16).items():
                self.assertEqual(done, Completion(ud, 64 << 10, Status.OK, TaskState.COMPLETED))
            for i, off in enumerate(offs):
                self.assertEqual(bytes(c.pool.view[off:off + (64 << 10)]), bytes(buf.view[i << 16:(i + 1) << 16]))
            buf.view[1 << 19:] = bytes(1 << 19)
            reads = [Request(Op.READ, buf.id, (1 << 19) + (i << 15), seg, off, 32 << 10) for i, off in enumerate(offs)]
            self.assertEqual(q.submit(reads, range(200, 216)), 16)
            self.assertTrue(all(d.status == Status.OK for d in reap_all(q, 16).values()))
            for i, off in enumerate(offs):
                self.assertEqual(bytes(buf.view[(1 << 19) + (i << 15):(1 << 19) + ((i + 1) << 15)]),
                                 bytes(c.pool.view[off:off + (32 << 10)]))
            info = q.info()
            self.assertEqual((info.submitted, info.reaped), (32, 32))
        self.assertTrue(q.closed)
        with self.assertRaises(Error) as e:
            q.nop(1)
        self.assertEqual(e.exception.code, Status.CLOSED)
        self.assertEqual(c.stats().connection["queues"], 0)

    def test_positional_codes_and_nop(self) -> None:
        c = self.connect()
        q = c.open_queue(16)
        self.addCleanup(q.close)
        buf = c.create_buffer(64 << 10)
        off = c.alloc_blocks(1, 64 << 10)[0]
        seg = c.pool.segment
        good = Request(Op.WRITE, buf.id, 0, seg, off, 4096)
        reqs = [
            good,
            Request(Op.WRITE, buf.id, 0, seg, off + 4096, 64 << 10),  # past the block
            Request(7, buf.id, 0, seg, off, 16),  # type: ignore[arg-type]  # no such op
            good,
            Request(Op.WRITE, buf.id, 0, seg, off, 0),  # nothing to move
            Request(Op.WRITE, 999999, 0, seg, off, 16),  # unknown segment
            Request(Op.READ, buf.id, 64 << 10, seg, off, 16),  # past the buffer
        ]
        want = [Status.OK, Status.PERMISSION_DENIED, Status.INVALID_ARGUMENT, Status.OK, Status.INVALID_ARGUMENT,
                Status.NOT_FOUND, Status.INVALID_ARGUMENT]
        self.assertEqual(q.submit(reqs, range(len(reqs))), len(reqs))
        got = reap_all(q, len(reqs))
        self.assertEqual([got[i].status for i in range(len(reqs))], want)
        self.assertEqual([got[i].state for i in range(len(reqs))],
                         [TaskState.COMPLETED if w == Status.OK else TaskState.FAILED for w in want])
        self.assertTrue(q.nop(77))
        self.assertEqual(q.reap(min=1, timeout=10), [Completion(77, 0, Status.OK, TaskState.COMPLETED)])

    def test_backpressure(self) -> None:
        # A client that does not reap: exactly cq_entries completions, then
        # the submission ring fills; a reap lets the rest through.
        c = self.connect()
        q = c.open_queue(16, cq_entries=32)
        self.addCleanup(q.close)
        sent, deadline = 0, time.monotonic() + 10
        while sent < 48:
            if q.nop(sent):
                sent += 1
            else:
                self.assertLess(time.monotonic(), deadline, "the daemon took nothing")
                time.sleep(0.0005)
        self.assertTrue(q.wait(32, timeout=10))
        self.assertFalse(q.nop(48))
        self.assertEqual(c.stats().connection["queue_unreaped"], 32)
        first = q.reap(64, min=0)
        self.assertEqual(len(first), 32)
        rest = q.reap(64, min=16, timeout=10)
        self.assertEqual(sorted(d.user_data for d in first + rest), list(range(48)))
        self.assertTrue(q.nop(48))
        self.assertEqual([d.user_data for d in q.reap(min=1, timeout=10)], [48])

    def test_timeouts_and_arguments(self) -> None:
        c = self.connect()
        with c.open_queue(8) as q:
            self.assertEqual(q.reap(min=1, timeout=0), [])
            t0 = time.monotonic()
            self.assertEqual(q.reap(min=1, timeout=0.05), [])
            self.assertGreaterEqual(time.monotonic() - t0, 0.05)
            self.assertFalse(q.wait(1, timeout=0))
            self.assertEqual(q.reap(4, min=0), [])
            for bad in (lambda: q.reap(2, min=3), lambda: q.reap(min=17), lambda: q.wait(17),
                        lambda: q.submit([Request(Op.WRITE, 1, 0, 1, 0, 1)], [1, 2]),
                        lambda: q.submit([Request(Op.WRITE, 1, 0, 1, 0, 1)], [1], notify=[b"x" * 4097])):
                with self.assertRaises(Error) as e:
                    bad()
                self.assertEqual(e.exception.code, Status.INVALID_ARGUMENT)
            self.assertEqual(q.submit([], []), 0)
        for entries, code in ((0, Status.INVALID_ARGUMENT), (8192, Status.RESOURCE_EXHAUSTED)):
            with self.assertRaises(Error) as e:
                c.open_queue(entries)
            self.assertEqual(e.exception.code, code)
        q = c.open_queue(8, cq_entries=64, data_size=8192, spin=False)
        self.assertEqual((q.sq_entries, q.cq_entries, q.data_size), (8, 64, 8192))
        q.close()
        q.close()  # again: quiet

    def test_many_in_flight(self) -> None:
        # One thread submits while another reaps, through full rings: a
        # submit that finds the ring full waits for the reaper's next reap.
        c = self.connect()
        q = c.open_queue(32, spin=False)
        self.addCleanup(q.close)
        total = 20000
        cv = threading.Condition()
        reaps = [0]
        errors: List[BaseException] = []

        def submit() -> None:
            try:
                i = 0
                while i < total:
                    with cv:
                        gen = reaps[0]
                    if q.nop(i):
                        i += 1
                        continue
                    with cv:
                        if not cv.wait_for(lambda: reaps[0] != gen, timeout=10):
                            raise AssertionError(f"no reap for 10 s with nop {i} refused")
            except BaseException as e:  # noqa: BLE001 - handed to the test
                errors.append(e)

        t = threading.Thread(target=submit)
        t.start()
        seen = bytearray(total)
        got = 0
        while got < total and not errors:
            for d in q.reap(64, min=1, timeout=10):
                self.assertEqual(d.status, Status.OK)
                self.assertFalse(seen[d.user_data])
                seen[d.user_data] = 1
                got += 1
            with cv:
                reaps[0] += 1
                cv.notify_all()
        t.join()
        self.assertEqual(errors, [])
        self.assertEqual(got, total)
        self.assertEqual(q.info().missed_wakeups, 0)

    def test_gil_released_while_a_reap_waits(self) -> None:
        c = self.connect()
        q = c.open_queue(8)
        t = Reaper(lambda: q.reap(min=1, timeout=20)).start_blocked()
        n = 0
        for i in range(20000):
            n += i
        for _ in range(20):
            c.ping(b"meanwhile")
        self.assertTrue(t.is_alive())
        self.assertTrue(blocked_in_futex(t.native))
        self.assertTrue(q.nop(5))  # and a submit from here wakes it
        t.join(10)
        self.assertIsNone(t.error)
        self.assertEqual(t.result, [Completion(5, 0, Status.OK, TaskState.COMPLETED)])
        self.assertEqual(n, sum(range(20000)))
        # close from this thread ends a reap waiting in another one.
        t = Reaper(lambda: q.reap(min=1, timeout=20)).start_blocked()
        q.close()
        t.join(10)
        self.assertFalse(t.is_alive())
        assert isinstance(t.error, Error)
        self.assertEqual(t.error.code, Status.CLOSED)

    def test_client_close_closes_queues(self) -> None:
        c = tensorcast.connect(self.daemon.socket)
        q = c.open_queue(8)
        t = Reaper(lambda: q.reap(min=1, timeout=20)).start_blocked()
        c.close()  # wakes the reap, waits for it, releases the queue
        t.join(10)
        assert isinstance(t.error, Error)
        self.assertEqual(t.error.code, Status.CLOSED)
        self.assertTrue(q.closed)
        with self.assertRaises(Error) as e:
            q.reap(min=0)
        self.assertEqual(e.exception.code, Status.CLOSED)
        q.close()  # quiet


class TestQueueFailures(unittest.TestCase):
    def test_killed_daemon_then_reconnect(self) -> None:
        d = Daemon().start()
        self.addCleanup(d.close)
        c = tensorcast.connect(d.socket)
        self.addCleanup(c.close)
        q = c.open_queue(8)
        self.assertTrue(q.nop(1))
        self.assertEqual(len(q.reap(min=1, timeout=10)), 1)
        t = Reaper(lambda: q.reap(min=1, timeout=30)).start_blocked()
        t0 = time.monotonic()
        d.kill()
        t.join(10)
        self.assertFalse(t.is_alive())
        self.assertLess(time.monotonic() - t0, 5)
        assert isinstance(t.error, Error)
        self.assertEqual(t.error.code, Status.CLOSED)
        with self.assertRaises(Error) as e:
            q.nop(2)
        self.assertEqual(e.exception.code, Status.CLOSED)
        q.close()  # the connection is gone: quiet
        d.start()
        c.reconnect()
        with c.open_queue(8) as q2:
            self.assertTrue(q2.nop(3))
            self.assertEqual([x.user_data for x in q2.reap(min=1, timeout=10)], [3])


if __name__ == "__main__":
    unittest.main()
