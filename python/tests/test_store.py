"""The KV block store's calls (tensorcast.store) against real daemons, with
the standard library only (this module also runs on interpreters without
numpy and torch; test_arrays covers those)."""

from __future__ import annotations

import ctypes
import gc
import time
import unittest
from typing import Any, Callable

import tensorcast
from tensorcast import Error, Status, store

from .daemon import Daemon, wait_blocked
from .test_core import DaemonCase, pattern
from .test_queue import Reaper

OK, NF = Status.OK, Status.NOT_FOUND
VAL = 4096


class TestStore(DaemonCase):
    def test_copying_calls_are_positional(self) -> None:
        c = self.connect()
        vals = [pattern(VAL, 10 + i) for i in range(4)]
        got = c.put([b"cp/0", "cp/1", b"cp/2", b"cp/0", b"k" * 300, b"cp/empty"],
                    [vals[0], bytearray(vals[1]), memoryview(vals[2]), vals[3], vals[3], b""])
        # A key twice in one call: the second is refused while the first is
        # in flight; a key over 256 bytes and an empty value are refused.
        self.assertEqual(got, [OK, OK, OK, Status.BUSY, Status.INVALID_ARGUMENT, Status.INVALID_ARGUMENT])
        self.assertEqual(c.put([b"cp/1"], [vals[0]]), [Status.ALREADY_EXISTS])

        outs = [bytearray(VAL), bytearray(VAL + 10), bytearray(VAL), bytearray(VAL - 1)]
        r = c.get([b"cp/1", b"cp/0", b"cp/none", "cp/2"], outs)
        self.assertEqual(r, [OK, OK, NF, Status.INVALID_ARGUMENT])
        self.assertEqual(r.lengths, [VAL, VAL, 0, VAL])
        self.assertEqual(bytes(outs[0]), vals[1])
        self.assertEqual(bytes(outs[1][:VAL]), vals[0])
        self.assertEqual(bytes(outs[3]), bytes(VAL - 1))  # too short: nothing copied

        self.assertEqual(c.exists([b"cp/0", b"cp/none", "cp/2", b"k" * 300]), [True, False, True, False])
        self.assertEqual(c.lookup_prefix([b"cp/0", b"cp/1", b"cp/none", b"cp/2"]), 2)
        self.assertEqual(c.lookup_prefix([b"cp/none", b"cp/0"]), 0)
        c.flush(timeout=10)  # a key being written back to L2 is BUSY to remove
        self.assertEqual(c.remove([b"cp/0", b"cp/never"]), [OK, OK])
        self.assertEqual(c.exists([b"cp/0"]), [False])
        # The stored copies are exact through every path.
        info = c.stat("cp/2")
        self.assertEqual((info.key, info.size, info.pins), (b"cp/2", VAL, 0))
        with self.assertRaises(Error) as e:
            c.stat(b"cp/0")
        self.assertEqual(e.exception.code, NF)
        with self.assertRaises(Error) as e:
            c.put([b"a"], [b"x", b"y"])
        self.assertEqual(e.exception.code, Status.INVALID_ARGUMENT)
        with self.assertRaises(Error) as e:
            c.get([b"cp/1"], [b"read-only"])
        self.assertEqual(e.exception.code, Status.INVALID_ARGUMENT)
        self.assertEqual(c.exists([]), [])

    def test_durable_put_and_flush(self) -> None:
        c = self.connect()
        self.assertEqual(c.put([b"dur/0", b"dur/1"], [pattern(VAL, 1), pattern(2 * VAL, 2)], durable=True), [OK, OK])
        info = c.stat(b"dur/1")
        self.assertTrue(info.in_l1 and info.in_l2)
        self.assertEqual(info.size, 2 * VAL)
        c.put([b"dur/2"], [pattern(VAL, 3)])
        c.flush(timeout=10)
        self.assertTrue(c.stat(b"dur/2").in_l2)
        self.assertGreaterEqual(c.stats().store["durable_puts"], 2)

    def test_calls_over_the_per_call_bound_are_split(self) -> None:
        c = self.connect(max_keys_per_call=4)
        keys = [f"split/{i}".encode() for i in range(10)]
        vals = [pattern(512, i) for i in range(10)]
        self.assertEqual(c.put(keys, vals), [OK] * 10)
        self.assertEqual(c.exists(keys + [b"split/x"]), [True] * 10 + [False])
        self.assertEqual(c.lookup_prefix(keys + [b"split/x"] + keys), 10)
        outs = [bytearray(512) for _ in keys]
        self.assertEqual(c.get(keys, outs), [OK] * 10)
        self.assertEqual([bytes(o) for o in outs], vals)
        r = c.reserve([f"split/r{i}" for i in range(6)], 64)
        self.assertEqual(r.codes, [OK] * 6)
        self.assertEqual(r.commit(), [OK] * 6)
        with c.get_pinned(keys) as views:
            self.assertEqual([bytes(v) for v in views if v is not None], vals)
        self.assertEqual(c.stat(keys[9]).pins, 0)

    def test_reserve_and_commit_in_place(self) -> None:
        c = self.connect()
        c.put([b"rs/taken"], [b"x"])
        r = c.reserve([b"rs/0", b"rs/taken", b"rs/1"], VAL)
        self.assertEqual(r.codes, [OK, Status.ALREADY_EXISTS, OK])
        self.assertIsNone(r.views[1])
        v0, v1 = r.views[0], r.views[2]
        assert v0 is not None and v1 is not None
        self.assertFalse(v0.readonly)
        v0[:] = pattern(VAL, 5)
        v1[:] = pattern(VAL, 6)
        self.assertEqual(c.exists([b"rs/0"]), [False])  # invisible until committed
        self.assertEqual(r.commit(durable=True), [OK, Status.ALREADY_EXISTS, OK])
        with self.assertRaises(ValueError):
            v0[0]  # released by the commit
        with self.assertRaises(Error) as e:
            r.commit()
        self.assertEqual(e.exception.code, Status.FAILED_PRECONDITION)
        out = [bytearray(VAL), bytearray(VAL)]
        self.assertEqual(c.get([b"rs/0", b"rs/1"], out), [OK, OK])
        self.assertEqual([bytes(o) for o in out], [pattern(VAL, 5), pattern(VAL, 6)])
        self.assertTrue(c.stat(b"rs/1").in_l2)
        # Sizes that differ go on the socket: the same result.
        r = c.reserve([b"rs/a", b"rs/b"], [100, 3000])
        self.assertEqual(r.codes, [OK, OK])
        self.assertEqual([len(v) for v in r.views if v is not None], [100, 3000])
        r.views[1][:] = pattern(3000, 9)  # type: ignore[index]
        self.assertEqual(r.commit(), [OK, OK])
        self.assertEqual(c.stat(b"rs/b").size, 3000)
        self.assertEqual(c.commit([b"rs/never"]), [Status.FAILED_PRECONDITION])

    def test_handles_and_leases(self) -> None:
        c = self.connect()
        other = self.connect()
        self.assertEqual(c.put([b"hl/0", b"hl/1"], [pattern(VAL, 1), pattern(VAL, 2)]), [OK, OK])
        h = c.handle_issue([b"hl/0", "hl/1"], ttl=60)
        self.assertIsInstance(h, tensorcast.Handle)
        self.assertTrue(h.token and h.id and h.expiry_unix_ms)
        self.assertEqual(c.stat(b"hl/0").pins, 1)
        with self.assertRaises(Error) as e:
            c.handle_issue([b"hl/absent"], ttl=60)
        self.assertEqual(e.exception.code, NF)
        # Any holder of the token renews and releases it.
        h2 = other.handle_renew(h, ttl=120)
        self.assertEqual(h2.id, h.id)
        self.assertNotEqual(h2.token, h.token)
        self.assertGreaterEqual(h2.expiry_unix_ms, h.expiry_unix_ms)
        forged = h2.token[:-1] + bytes([h2.token[-1] ^ 1])
        with self.assertRaises(Error) as e:
            other.handle_release(forged)
        self.assertEqual(e.exception.code, Status.PERMISSION_DENIED)
        other.handle_release(h2)
        with self.assertRaises(Error) as e:
            other.handle_release(h2)  # released already
        self.assertEqual(e.exception.code, Status.PERMISSION_DENIED)
        self.assertEqual(c.stat(b"hl/0").pins, 0)

        first = c.lease_create("op-py", [b"hl/0", b"hl/1"], ttl=60)
        self.assertFalse(first.joined)
        again = other.lease_create(b"op-py", [b"hl/0", b"hl/1"], ttl=60)
        self.assertEqual(again, tensorcast.Lease(first.expiry_unix_ms, True))
        self.assertEqual(c.stat(b"hl/1").pins, 1)
        with self.assertRaises(Error) as e:
            c.lease_create("op-py", [b"hl/0"], ttl=60)
        self.assertEqual(e.exception.code, Status.FAILED_PRECONDITION)
        c.lease_release("op-py")
        self.assertEqual(c.stat(b"hl/1").pins, 0)
        with self.assertRaises(Error) as e:
            c.lease_release("op-none")
        self.assertEqual(e.exception.code, NF)
        with self.assertRaises(Error) as e:
            c.lease_create("op-py", [], ttl=60)
        self.assertEqual(e.exception.code, Status.INVALID_ARGUMENT)
        self.assertEqual(c.remove([b"hl/0", b"hl/1"]), [OK, OK])

    def test_reserve_abort(self) -> None:
        # A daemon of its own: the store's figures are this test's alone.
        d = Daemon().start()
        self.addCleanup(d.close)
        c = tensorcast.connect(d.socket, "test_abort")
        self.addCleanup(c.close)

        def figures() -> tuple:
            st = c.stats().store
            return st["l1_bytes"], st["reserved"], st["aborted"]

        before = figures()
        r = c.reserve([b"ab/0", b"ab/1"], VAL)
        self.assertEqual(r.codes, [OK, OK])
        r.views[0][:] = pattern(VAL, 1)  # type: ignore[index]
        self.assertNotEqual(figures()[:2], before[:2])
        self.assertEqual(r.abort(), [OK, OK])
        self.assertTrue(r.aborted)
        self.assertEqual(figures(), (before[0], before[1], before[2] + 2))  # the blocks are back
        with self.assertRaises(ValueError):
            r.views[0][0]  # released by the abort
        for again in (r.abort, r.commit):
            with self.assertRaises(Error) as e:
                again()
            self.assertEqual(e.exception.code, Status.FAILED_PRECONDITION)
        self.assertEqual(c.commit([b"ab/0"]), [Status.FAILED_PRECONDITION])  # nothing left to commit
        self.assertEqual(c.abort([b"ab/0", b"ab/never"]), [Status.FAILED_PRECONDITION] * 2)
        self.assertEqual(c.exists([b"ab/0", b"ab/1"]), [False, False])

        # Sizes that differ (the socket's reserve), and a key not reserved:
        # it keeps its reserve's Status.
        c.put([b"ab/taken"], [b"x"])
        before = figures()
        r = c.reserve([b"ab/0", b"ab/taken", b"ab/1"], [100, 10, 3000])
        self.assertEqual(r.codes, [OK, Status.ALREADY_EXISTS, OK])
        self.assertEqual(r.abort(), [OK, Status.ALREADY_EXISTS, OK])
        self.assertEqual(figures()[:2], before[:2])

        # A with block that raises aborts; one that forgets to commit too;
        # one that commits stores.
        with self.assertRaises(RuntimeError):
            with c.reserve([b"ab/0"], VAL) as r:
                r.views[0][:] = pattern(VAL, 2)  # type: ignore[index]
                raise RuntimeError("the engine preempted the sequence")
        self.assertTrue(r.aborted)
        with c.reserve([b"ab/0"], VAL) as r:
            pass
        self.assertTrue(r.aborted)
        self.assertEqual(figures(), (before[0], before[1], before[2] + 4))
        with c.reserve([b"ab/0"], VAL) as r:
            r.views[0][:] = pattern(VAL, 3)  # type: ignore[index]
            self.assertEqual(r.commit(), [OK])
        self.assertFalse(r.aborted)
        out = [bytearray(VAL)]
        self.assertEqual(c.get([b"ab/0"], out), [OK])
        self.assertEqual(bytes(out[0]), pattern(VAL, 3))

        # Another client's reservation is not this one's to abort.
        other = tensorcast.connect(d.socket, "test_abort_other")
        self.addCleanup(other.close)
        theirs = other.reserve([b"ab/theirs"], VAL)
        self.assertEqual(c.abort([b"ab/theirs"]), [Status.FAILED_PRECONDITION])
        self.assertEqual(theirs.commit(), [OK])

        with self.assertRaises(Error) as e:
            c.abort([b"ab/1", b"k" * 300])  # a key over 256 bytes refuses the call
        self.assertEqual(e.exception.code, Status.INVALID_ARGUMENT)

    def test_get_pinned(self) -> None:
        c = self.connect()
        c.put([b"pin/0", b"pin/1"], [pattern(VAL, 20), pattern(VAL, 21)])
        with c.get_pinned([b"pin/1", b"pin/none", b"pin/0"]) as views:
            self.assertEqual(views.codes, [OK, NF, OK])
            self.assertIsNone(views[1])
            v = views[0]
            assert v is not None
            self.assertTrue(v.readonly)
            self.assertEqual(bytes(v), pattern(VAL, 21))
            self.assertEqual(bytes(views[2]), pattern(VAL, 20))  # type: ignore[arg-type]
            self.assertEqual(c.stat(b"pin/1").pins, 1)
            self.assertEqual(c.remove([b"pin/1"]), [Status.FAILED_PRECONDITION])
        self.assertEqual(c.stat(b"pin/1").pins, 0)
        with self.assertRaises(ValueError):
            bytes(v)  # released on exit
        held = c.get_pinned([b"pin/0"])  # without a with block
        self.assertEqual(c.stat(b"pin/0").pins, 1)
        held.release()
        held.release()  # once only
        self.assertEqual(c.stat(b"pin/0").pins, 0)
        # A view still exported (here by hand, as a C extension would hold
        # it) cannot be released: unpinned all the same, and said.
        held = c.get_pinned([b"pin/0"])
        pb = store._PyBuffer()
        store._get_buffer(held[0], ctypes.addressof(pb), 0)
        with self.assertRaises(Error) as e:
            held.release()
        self.assertEqual(e.exception.code, Status.FAILED_PRECONDITION)
        self.assertEqual(c.stat(b"pin/0").pins, 0)
        store._release_buffer(ctypes.addressof(pb))

    def test_pins_leases_and_prefix_pins(self) -> None:
        c = self.connect()
        c.put([b"lp/0", b"lp/1", b"lp/2"], [b"a", b"b", b"c"])
        # All or nothing.
        self.assertEqual(c.pin([b"lp/0", b"lp/none"]), [Status.FAILED_PRECONDITION, NF])
        self.assertEqual(c.stat(b"lp/0").pins, 0)
        self.assertEqual(c.pin([b"lp/0", b"lp/1"], ttl=60), [OK, OK])
        self.assertEqual(c.stat(b"lp/1").pins, 1)
        self.assertEqual(c.unpin([b"lp/0", b"lp/1"]), [OK, OK])  # the leases
        self.assertEqual(c.unpin([b"lp/0"]), [Status.FAILED_PRECONDITION])  # below zero
        # A pinned prefix: the get that follows cannot miss.
        self.assertEqual(c.lookup_prefix([b"lp/0", b"lp/1", b"lp/x", b"lp/2"], pin=True), 2)
        self.assertEqual([c.stat(k).pins for k in (b"lp/0", b"lp/1", b"lp/2")], [1, 1, 0])
        self.assertEqual(c.unpin([b"lp/0", b"lp/1"]), [OK, OK])
        self.assertEqual(c.stat(b"lp/1").pins, 0)

    def test_listing(self) -> None:
        c = self.connect()
        keys = [f"ls/{i:02d}".encode() for i in range(5)]
        c.put(keys, [b"v"] * 5)
        got, more = c.list_keys(prefix=b"ls/")
        self.assertEqual([k.key for k in got], keys)
        self.assertFalse(more)
        got, more = c.list_keys(prefix="ls/", after=b"ls/01", max=2)
        self.assertEqual([k.key for k in got], keys[2:4])
        self.assertTrue(more)
        self.assertEqual(c.list_keys(prefix=b"nothing/"), ([], False))

    def test_copies_through_extents(self) -> None:
        c = self.connect()
        buf = c.create_buffer(4 * VAL)
        self.addCleanup(buf.close)
        buf.view[:2 * VAL] = pattern(2 * VAL, 30)
        off = c.alloc_blocks(1, VAL)[0]
        c.pool.view[off:off + VAL] = pattern(VAL, 31)
        got = c.store_put([b"ext/0", b"ext/1", b"ext/2"],
                          [(buf.id, 0, 2 * VAL), (c.pool.segment, off, VAL), (999999, 0, VAL)])
        self.assertEqual(got, [OK, OK, NF])
        r = c.store_read([b"ext/1", b"ext/0", b"ext/x"], [(buf.id, 2 * VAL, VAL), (buf.id, 0, VAL), (buf.id, 0, VAL)])
        self.assertEqual(r, [OK, Status.INVALID_ARGUMENT, NF])
        self.assertEqual(r.lengths, [VAL, 2 * VAL, 0])
        self.assertEqual(bytes(buf.view[2 * VAL:3 * VAL]), pattern(VAL, 31))

    def test_gil_released_while_a_store_call_waits(self) -> None:
        d = Daemon().start()
        self.addCleanup(d.close)
        c = tensorcast.connect(d.socket)
        self.addCleanup(c.close)
        c.put([b"gil"], [b"x"])
        d.freeze()
        try:
            t = Reaper(lambda: c.exists([b"gil"])).start_blocked()  # asleep on the store's queue
            n = 0
            for i in range(20000):
                n += i
            self.assertTrue(t.is_alive())
            # Still waiting: the reap wakes every 200 ms to check the
            # connection, so it is waited for in futex again, not sampled.
            wait_blocked(t.native, timeout=5, futex=True)
        finally:
            d.thaw()
        t.join(10)
        self.assertIsNone(t.error)
        self.assertEqual(t.result, [True])
        self.assertEqual(n, sum(range(20000)))


class TestStoreFailures(unittest.TestCase):
    def test_killed_daemon_then_reconnect(self) -> None:
        d = Daemon().start()
        self.addCleanup(d.close)
        c = tensorcast.connect(d.socket)
        self.addCleanup(c.close)
        self.assertEqual(c.put([b"kd/durable"], [pattern(VAL, 40)], durable=True), [OK])
        self.assertEqual(c.put([b"kd/l1"], [pattern(VAL, 41)]), [OK])
        d.kill()
        calls = [lambda: c.put([b"kd/2"], [b"x"]), lambda: c.get([b"kd/l1"], [bytearray(VAL)]),
                 lambda: c.exists([b"kd/l1"]), lambda: c.lookup_prefix([b"kd/l1"]), lambda: c.remove([b"kd/l1"]),
                 lambda: c.reserve([b"kd/3"], 8), lambda: c.get_pinned([b"kd/l1"]), lambda: c.stat(b"kd/l1")]
        for call in calls:
            with self.assertRaises(Error) as e:
                call()
            self.assertEqual(e.exception.code, Status.CLOSED)
        d.start()
        c.reconnect()
        # An acknowledged durable put survives the kill; the rest start over.
        out = [bytearray(VAL)]
        self.assertEqual(c.get([b"kd/durable"], out), [OK])
        self.assertEqual(bytes(out[0]), pattern(VAL, 40))
        self.assertEqual(c.put([b"kd/2"], [b"again"]), [OK])
        self.assertEqual(c.exists([b"kd/2"]), [True])

    def test_a_stopped_daemon_ends_store_calls_by_the_call_timeout(self) -> None:
        # call_timeout bounds the store's calls (on the store's queue) as
        # it bounds the others: a daemon that answers nothing (stopped) ends
        # them with TIMED_OUT, the client stays in use, and what a late call
        # pinned is given back by the next store call.
        d = Daemon().start()
        self.addCleanup(d.close)
        c = tensorcast.connect(d.socket, call_timeout=0.3)
        self.addCleanup(c.close)
        self.assertEqual(c.put([b"st/0", b"st/1"], [pattern(VAL, 50), pattern(VAL, 51)]), [OK, OK])
        d.freeze()
        try:
            t0 = time.monotonic()
            with self.assertRaises(Error) as e:
                c.get_pinned([b"st/0", b"st/1"])
            self.assertEqual(e.exception.code, Status.TIMED_OUT)
            self.assertLess(time.monotonic() - t0, 5)
        finally:
            d.thaw()
        self.assertEqual(c.exists([b"st/0"]), [True])
        self.assertEqual([c.stat(k).pins for k in (b"st/0", b"st/1")], [0, 0])
        with c.get_pinned([b"st/1"]) as views:
            self.assertEqual(bytes(views[0]), pattern(VAL, 51))

    def test_killed_while_a_call_waits(self) -> None:
        d = Daemon().start()
        self.addCleanup(d.close)
        c = tensorcast.connect(d.socket)
        self.addCleanup(c.close)
        c.put([b"kw"], [b"x"])
        d.freeze()
        t = Reaper(lambda: c.lookup_prefix([b"kw"])).start_blocked()
        t0 = time.monotonic()
        d.kill()
        t.join(10)
        self.assertFalse(t.is_alive())
        self.assertLess(time.monotonic() - t0, 5)
        assert isinstance(t.error, Error)
        self.assertEqual(t.error.code, Status.CLOSED)


if __name__ == "__main__":
    unittest.main()


class _Interrupt(BaseException):
    """Stands for a KeyboardInterrupt arriving in the middle of a call."""


def interrupt_after(c: tensorcast.Client, what: str, nth: int) -> None:
    """Makes c's nth store-queue call named what raise _Interrupt once the
    library has answered it (the daemon did the work)."""
    real = c._run_kv
    seen = [0]

    def run(name: str, fn: object, *args: object) -> int:
        rc = real(name, fn, *args)  # type: ignore[arg-type]
        if name == what:
            seen[0] += 1
            if seen[0] == nth:
                raise _Interrupt(name)
        return rc

    c._run_kv = run  # type: ignore[method-assign]


class TestStoreInterrupted(DaemonCase):
    """An exception in the middle of a call made of several parts leaves
    nothing held in the daemon."""

    def keys(self, c: tensorcast.Client, tag: str, n: int) -> list:
        keys = [f"{tag}/{i}".encode() for i in range(n)]
        self.assertEqual(c.put(keys, [pattern(256, i) for i in range(n)]), [OK] * n)
        return keys

    def test_get_pinned_gives_back_every_part(self) -> None:
        c = self.connect(max_keys_per_call=2)
        keys = self.keys(c, "int-gp", 4)
        interrupt_after(c, "get", 2)  # the second part's pins taken, then the exception
        with self.assertRaises(_Interrupt):
            c.get_pinned(keys)
        self.assertEqual([c.stat(k).pins for k in keys], [0] * 4)

    def test_get_locations_gives_back_earlier_parts(self) -> None:
        c = self.connect(max_keys_per_call=2)
        keys = self.keys(c, "int-gl", 4)
        interrupt_after(c, "get", 2)
        with self.assertRaises(_Interrupt):
            c.get_locations(keys)
        self.assertEqual([c.stat(k).pins for k in keys], [0] * 4)

    def test_lookup_prefix_pin_gives_back_earlier_parts(self) -> None:
        c = self.connect(max_keys_per_call=2)
        keys = self.keys(c, "int-lp", 4)
        interrupt_after(c, "lookup_prefix", 2)
        with self.assertRaises(_Interrupt):
            c.lookup_prefix(keys, pin=True)
        self.assertEqual([c.stat(k).pins for k in keys], [0] * 4)

    def test_reserve_gives_back_earlier_parts(self) -> None:
        c = self.connect(max_keys_per_call=2)
        keys = [f"int-rs/{i}".encode() for i in range(4)]
        before = c.stats().store["reserved"]
        interrupt_after(c, "reserve", 2)
        with self.assertRaises(_Interrupt):
            c.reserve(keys, 256)
        self.assertEqual(c.stats().store["reserved"], before)
        c._run_kv = type(c)._run_kv.__get__(c)  # type: ignore[method-assign]
        r = c.reserve(keys, 256)  # none of them still reserved
        self.assertEqual(r.codes, [OK] * 4)
        r.abort()


class TestStoreDropped(DaemonCase):
    """A result dropped without its release gives back what it held at the
    client's next call; its finalizer itself calls nothing."""

    def setUp(self) -> None:
        store._warned.clear()

    def keys(self, c: tensorcast.Client, tag: str, n: int) -> list:
        keys = [f"{tag}/{i}".encode() for i in range(n)]
        self.assertEqual(c.put(keys, [pattern(256, i) for i in range(n)]), [OK] * n)
        return keys

    def calls(self, c: tensorcast.Client) -> list:
        """The names of c's calls into the library from now on."""
        seen: list = []
        run_kv, run_conn, enter = c._run_kv, c._run_conn, c._enter
        c._run_kv = lambda name, *a: seen.append(name) or run_kv(name, *a)  # type: ignore[method-assign]
        c._run_conn = lambda fn, *a: seen.append(fn.__name__) or run_conn(fn, *a)  # type: ignore[method-assign]
        c._enter = lambda: seen.append("enter") or enter()  # type: ignore[method-assign]
        return seen

    def test_a_dropped_get_pinned_result_is_unpinned_at_the_next_call(self) -> None:
        c = self.connect()
        keys = self.keys(c, "drop-gp", 2)
        pv = c.get_pinned(keys + [b"drop-gp/none"])
        seen = self.calls(c)
        with self.assertLogs("tensorcast", "WARNING") as logs:
            del pv
            gc.collect()
            self.assertEqual(seen, [])  # the finalizer only queued the unpin
            self.assertEqual([c.stat(k).pins for k in keys], [0, 0])
            self.assertEqual(seen[:3], ["tc_store_stat", "enter", "unpin"])  # at the start of the next call
            pv = c.get_pinned(keys)
            del pv
            gc.collect()
            self.assertEqual([c.stat(k).pins for k in keys], [0, 0])
        self.assertEqual(len(logs.records), 1)  # once
        self.assertIn("get_pinned result", logs.output[0])

    def test_a_view_kept_keeps_its_pin(self) -> None:
        c = self.connect()
        keys = self.keys(c, "drop-view", 2)
        part = c.get_pinned(keys)[1][8:16]  # a slice of a view; the list is gone
        gc.collect()
        self.assertEqual([c.stat(k).pins for k in keys], [1, 1])
        self.assertEqual(bytes(part), pattern(256, 1)[8:16])
        with self.assertLogs("tensorcast", "WARNING"):
            del part
            gc.collect()
            self.assertEqual([c.stat(k).pins for k in keys], [0, 0])

    def test_a_result_released_then_dropped_is_unpinned_once(self) -> None:
        c = self.connect()
        keys = self.keys(c, "drop-twice", 1)
        first, second = c.get_pinned(keys), c.get_pinned(keys)
        self.assertEqual(c.stat(keys[0]).pins, 2)
        first.release()
        del first
        gc.collect()
        self.assertEqual(c.stat(keys[0]).pins, 1)  # second's pin stays
        second.release()
        second.release()
        self.assertEqual(c.stat(keys[0]).pins, 0)

    def test_a_result_of_a_closed_connection_gives_back_nothing(self) -> None:
        c = self.connect()
        keys = self.keys(c, "drop-old", 1)
        old = c.get_pinned(keys)
        c.reconnect()  # the close released old's pin
        new = c.get_pinned(keys)
        del old
        gc.collect()
        self.assertEqual(c.stat(keys[0]).pins, 1)  # new's, untouched
        new.release()

    def test_a_dropped_reservation_stays_for_a_commit_by_key(self) -> None:
        # Reservations are also committed and aborted by key (the vLLM
        # integration keeps the offsets only): dropping one gives back nothing.
        c = self.connect()
        keys = [b"drop-rs/0", b"drop-rs/1"]
        r = c.reserve(keys, 256)
        self.assertEqual(r.codes, [OK, OK])
        del r
        gc.collect()
        self.assertEqual(c.commit(keys), [OK, OK])
        self.assertEqual(c.exists(keys), [True, True])

    def dropped_one_is_released(self, counter: str, kind: str, open_one: Callable[[tensorcast.Client], Any]) -> None:
        """One of two things open_one(c) opens, dropped unclosed, is closed
        at the client's next call (counter, of the connection's stats,
        counts them), not by the collection, and the drop is logged once;
        the other, closed and then collected, is closed once."""
        c = self.connect()
        before = c.stats().connection[counter]
        dropped, kept = open_one(c), open_one(c)
        self.assertEqual(c.stats().connection[counter], before + 2)
        seen = self.calls(c)
        with self.assertLogs("tensorcast", "WARNING") as logs:
            del dropped
            gc.collect()
            self.assertEqual(seen, [])
            self.assertEqual(c.stats().connection[counter], before + 1)
        self.assertIn(kind, logs.output[0])
        kept.close()
        del kept
        gc.collect()
        self.assertEqual(c.stats().connection[counter], before)

    def test_a_dropped_buffer_is_unregistered_at_the_next_call(self) -> None:
        self.dropped_one_is_released("segments", "buffer", lambda c: c.create_buffer(4096))

    def test_a_dropped_queue_is_closed_at_the_next_call(self) -> None:
        # Its close is a round trip on the connection: the collection, on
        # any thread, only queues it.
        self.dropped_one_is_released("queues", "queue", lambda c: c.open_queue(8))


class TestLinkInterrupted(DaemonCase):
    def test_an_exception_in_a_dial_does_not_end_the_dials(self) -> None:
        import logging

        from tensorcast.integrations._link import Link

        made: list = []
        calls = [0]

        def on_connect(c: tensorcast.Client) -> None:
            made.append(c)
            calls[0] += 1
            if calls[0] == 1:
                raise _Interrupt("in on_connect")

        link = Link(self.daemon.socket, "test_link", logging.getLogger("test_link"), on_connect=on_connect,
                    retry_interval=0)
        self.addCleanup(link.close)
        with self.assertRaises(_Interrupt):
            link.client()
        self.assertTrue(made[0].closed)  # the connection it made is not left open
        c = link.client()  # dials again
        self.assertIsNotNone(c)
        self.assertIs(c, made[1])


    def test_a_close_during_a_dial_keeps_no_connection(self) -> None:
        import logging

        from tensorcast.integrations._link import Link

        made: list = []

        def on_connect(c: tensorcast.Client) -> None:
            made.append(c)
            link.close()  # as another thread's close would, while the dial runs

        link = Link(self.daemon.socket, "test_link", logging.getLogger("test_link"), on_connect=on_connect,
                    retry_interval=0)
        self.assertIsNone(link.client())
        self.assertEqual(len(made), 1)
        self.assertTrue(made[0].closed)  # closed, not kept by a closed link
        self.assertIsNone(link.client())  # and no dial after the close
        self.assertEqual(len(made), 1)

class TestKeyTypes(DaemonCase):
    def test_a_key_of_another_type_is_refused(self) -> None:
        c = self.connect()
        self.assertEqual(c.put([b"\0" * 5, bytes([1, 2])], [b"x", b"y"]), [OK, OK])
        for bad in (5, [1, 2], None, 1.5):
            with self.assertRaises(TypeError):
                c.exists([bad])  # type: ignore[list-item]
            with self.assertRaises(TypeError):
                c.get([bad], [bytearray(1)])  # type: ignore[list-item]
        self.assertEqual(c.exists([bytearray(b"\0" * 5), memoryview(bytes([1, 2]))]), [True, True])


class _Index:
    """An integer-like that is no int (as a numpy integer is)."""

    def __init__(self, v: int) -> None:
        self.v = v

    def __index__(self) -> int:
        return self.v


class TestNumbers(DaemonCase):
    def test_lengths_sizes_and_addresses_out_of_range_are_refused(self) -> None:
        c = self.connect()
        buf = ctypes.create_string_buffer(b"abcd", 4)
        at = ctypes.addressof(buf)
        # ctypes would cut 2**64 to 0 and store an empty value, and take -1
        # as 2**64-1.
        for lengths in ([1 << 64], [-1]):
            with self.assertRaises(Error) as e:
                c.put_addresses([b"n"], [at], lengths)
            self.assertEqual(e.exception.code, Status.INVALID_ARGUMENT)
        with self.assertRaises(Error) as e:
            c.put_addresses([b"n"], [0], [4])
        self.assertEqual(e.exception.code, Status.INVALID_ARGUMENT)
        with self.assertRaises(Error) as e:
            c.get_addresses([b"n"], [at], [-1])
        self.assertEqual(e.exception.code, Status.INVALID_ARGUMENT)
        self.assertEqual(c.exists([b"n"]), [False])
        with self.assertRaises(Error) as e:
            c.reserve([b"n"], -1)
        self.assertEqual(e.exception.code, Status.INVALID_ARGUMENT)
        with self.assertRaises(TypeError):
            c.reserve([b"n"], [1.5])  # int(1.5) would reserve 1 byte
        with self.assertRaises(Error) as e:
            c.alloc_blocks(1 << 32, 4096)  # ctypes would cut the count to 0
        self.assertEqual(e.exception.code, Status.INVALID_ARGUMENT)
        # Integer-likes that are not ints are taken.
        self.assertEqual(c.put_addresses([b"n"], [_Index(at)], [_Index(4)]), [OK])
        out = ctypes.create_string_buffer(4)
        self.assertEqual(c.get_addresses([b"n"], [ctypes.addressof(out)], [_Index(4)]), [OK])
        self.assertEqual(out.raw, b"abcd")
