"""The tensorcast package against real daemons, with the standard library only
(this module also runs on interpreters without numpy and torch)."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import shutil
import subprocess
import tempfile
import threading
import time
import unittest
from typing import List, Optional

import tensorcast
from tensorcast import Error, Op, Request, Status, TaskState
from tensorcast import _lib

from .daemon import ROOT, Daemon, provides, wait_blocked


def pattern(n: int, seed: int) -> bytes:
    """seed's xorshift64 pattern, as every client of the tests writes it."""
    out = bytearray(n + 8)
    x = seed or 1
    m = (1 << 64) - 1
    for i in range(0, n, 8):
        x ^= (x << 13) & m
        x ^= x >> 7
        x ^= (x << 17) & m
        out[i:i + 8] = x.to_bytes(8, "little")
    return bytes(out[:n])


class DaemonCase(unittest.TestCase):
    """One daemon for the class; tests connect to it."""

    daemon: Daemon

    @classmethod
    def setUpClass(cls) -> None:
        cls.daemon = Daemon().start()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.daemon.close()

    def connect(self, **kw: object) -> tensorcast.Client:
        c = tensorcast.connect(self.daemon.socket, "test_core", **kw)  # type: ignore[arg-type]
        self.addCleanup(c.close)
        return c


class TestLibrary(unittest.TestCase):
    def test_layouts_match_the_header(self) -> None:
        # Every field of every ctypes structure sits where the C compiler
        # puts it: a C program built from tensorcast.h prints the offsets.
        cc = shutil.which(os.environ.get("CC", "cc"))
        if cc is None:
            self.skipTest("no C compiler (cc) to read the header's layouts with")
        structs = {"tc_options": _lib.Options, "tc_call_opts": _lib.CallOpts, "tc_limits": _lib.Limits,
                   "tc_hello": _lib.Hello, "tc_pool": _lib.Pool, "tc_buffer": _lib.Buffer,
                   "tc_request": _lib.Request, "tc_notify": _lib.Notify, "tc_task_info": _lib.TaskInfo,
                   "tc_summary": _lib.Summary, "tc_remote": _lib.Remote, "tc_notification": _lib.Notification,
                   "tc_counter": _lib.Counter, "tc_counters": _lib.Counters, "tc_stats": _lib.Stats,
                   "tc_queue_opts": _lib.QueueOpts, "tc_cqe": _lib.Cqe, "tc_queue_info": _lib.QueueInfo,
                   "tc_queue_waits": _lib.QueueWaits,
                   "tc_key": _lib.Key, "tc_keys": _lib.Keys, "tc_extent": _lib.Extent, "tc_key_info": _lib.KeyInfo,
                   "tc_kv_opts": _lib.KvOpts, "tc_holder": _lib.Holder, "tc_key_location": _lib.KeyLocation}
        lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "tensorcast.h"', "int main(void) {"]
        want = []
        for cname, t in structs.items():
            lines.append(f'printf("{cname} %zu\\n", sizeof({cname}));')
            want.append(f"{cname} {ctypes.sizeof(t)}")
            for f in t._fields_:
                lines.append(f'printf("{cname}.{f[0]} %zu\\n", offsetof({cname}, {f[0]}));')
                want.append(f"{cname}.{f[0]} {getattr(t, f[0]).offset}")
        lines.append("return 0; }")
        with tempfile.TemporaryDirectory() as d:
            src, exe = os.path.join(d, "layout.c"), os.path.join(d, "layout")
            with open(src, "w") as f:
                f.write("\n".join(lines))
            subprocess.run([cc, "-std=c99", "-I", str(ROOT / "c" / "include"), src, "-o", exe], check=True)
            got = subprocess.run([exe], check=True, capture_output=True, text=True).stdout.split("\n")
        self.assertEqual([g for g in got if g], want)

    def test_calls_release_the_gil(self) -> None:
        # ctypes.CDLL releases the GIL around each call (PyDLL would not).
        self.assertIsInstance(_lib.lib, ctypes.CDLL)
        self.assertNotIsInstance(_lib.lib, ctypes.PyDLL)

    def test_status(self) -> None:
        self.assertEqual(Status(2), Status.NOT_FOUND)
        self.assertEqual(int(Status.CLOSED), -1)
        odd = Status(42)  # a code from a newer daemon is kept, not remapped
        self.assertEqual(int(odd), 42)
        self.assertEqual(odd.name, "CODE_42")
        e = Error(Status.BUSY, "free_batch")
        self.assertEqual(e.code, Status.BUSY)
        self.assertIn("busy", str(e))

    def test_package_names(self) -> None:
        # What the package exports is there, once, and holds the calls an
        # engine reaches for.
        names = tensorcast.__all__
        self.assertEqual(len(names), len(set(names)))
        self.assertEqual([n for n in names if not hasattr(tensorcast, n)], [])
        for n in ("connect", "Client", "Status", "Error", "Queue", "Reservation", "PinnedValues", "library_path"):
            self.assertIn(n, names)

    def test_missing_library_is_named(self) -> None:
        import subprocess
        import sys

        env = dict(os.environ, TENSORCAST_LIB="/nonexistent/libtensorcast.so",
                   PYTHONPATH=os.path.dirname(os.path.dirname(tensorcast.__file__)))
        r = subprocess.run([sys.executable, "-c", "import tensorcast"], env=env, capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("$TENSORCAST_LIB: /nonexistent/libtensorcast.so: no such file", r.stderr)


class TestConnect(DaemonCase):
    def test_default_socket_from_env(self) -> None:
        old = os.environ.get("TENSORCAST_SOCKET")
        os.environ["TENSORCAST_SOCKET"] = self.daemon.socket
        try:
            with tensorcast.connect() as c:
                self.assertEqual(c.socket, self.daemon.socket)
                c.ping(b"hi")
            self.assertTrue(c.closed)
        finally:
            if old is None:
                del os.environ["TENSORCAST_SOCKET"]
            else:
                os.environ["TENSORCAST_SOCKET"] = old
        with self.assertRaises(Error) as e:
            c.ping()
        self.assertEqual(e.exception.code, Status.CLOSED)

    def test_missing_socket(self) -> None:
        with self.assertRaises(Error) as e:
            tensorcast.connect(os.path.join(self.daemon.dir, "absent.sock"))
        self.assertEqual(e.exception.code, Status.SYSTEM)
        self.assertEqual(e.exception.errno, errno.ENOENT)
        self.assertIn("No such file", str(e.exception))

    def test_refused_uid(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            cfg = os.path.join(d, "tc.toml")
            with open(cfg, "w") as f:
                # allowed_uids alone would not refuse root or the daemon's uid
                f.write(f"denied_uids = [{os.getuid()}]\nmetrics_address = \"off\"\n")
            refusing = Daemon(["--config", cfg]).start()
            self.addCleanup(refusing.close)
            with self.assertRaises(Error) as e:
                tensorcast.connect(refusing.socket)
            self.assertEqual(e.exception.code, Status.PERMISSION_DENIED)

    def test_hello_and_pool(self) -> None:
        c = self.connect()
        h = c.hello
        self.assertEqual(h.protocol_version, tensorcast.PROTOCOL_VERSION)
        self.assertTrue(h.daemon_id)
        self.assertEqual(h.peer_addr, "")
        self.assertEqual(h.limits.max_frame, 1 << 20)
        p = c.pool
        self.assertNotEqual(p.segment, 0)
        self.assertEqual(p.size, 32 << 20)
        self.assertEqual(len(p.view), p.size)
        self.assertFalse(p.view.readonly)
        self.assertEqual(list(p.block_classes), sorted(p.block_classes))

    def test_ping_and_stats(self) -> None:
        c = self.connect()
        c.ping()
        c.ping(pattern(50000, 3))
        c.ping(b"x", opts=tensorcast.CallOptions(lane="stream-first", policy_version=2, qos=1, deadline=1.0))
        with self.assertRaises(Error) as e:
            c.ping(bytes(2 << 20))  # past the daemon's max_frame: refused before sending
        self.assertEqual(e.exception.code, Status.RESOURCE_EXHAUSTED)
        c.ping(b"still good")
        offs = c.alloc_blocks(2, 4096)
        s = c.stats()
        self.assertEqual(s.connection["blocks"], 2)
        self.assertEqual(s.pool["size"], 32 << 20)
        self.assertGreaterEqual(s.connections, 1)
        self.assertEqual(c.free_blocks(offs), [Status.OK, Status.OK])


class TestCalls(DaemonCase):
    def test_blocks_positional(self) -> None:
        c = self.connect()
        offs = c.alloc_blocks(3, 64 << 10)
        self.assertEqual(len(set(offs)), 3)
        for o in offs:
            self.assertLessEqual(o + (64 << 10), c.pool.size)
        c.pool.block(offs[0], 5)[:] = b"hello"
        self.assertEqual(bytes(c.pool.view[offs[0]:offs[0] + 5]), b"hello")
        self.assertEqual(c.free_blocks([offs[0], 12345, offs[1]]), [Status.OK, Status.NOT_FOUND, Status.OK])
        self.assertEqual(c.free_blocks([offs[0], offs[2]]), [Status.NOT_FOUND, Status.OK])
        with self.assertRaises(Error) as e:
            c.alloc_blocks(1, 1 << 40)
        self.assertEqual(e.exception.code, Status.RESOURCE_EXHAUSTED)
        with self.assertRaises(Error) as e:
            c.alloc_blocks(0, 4096)
        self.assertEqual(e.exception.code, Status.INVALID_ARGUMENT)
        with self.assertRaises(ValueError):
            c.pool.block(c.pool.size - 10, 11)

    def test_idempotency(self) -> None:
        c = self.connect()
        key = tensorcast.CallOptions(idempotency_key="py-alloc-1")
        a = c.alloc_blocks(2, 4096, opts=key)
        self.assertEqual(c.alloc_blocks(2, 4096, opts=key), a)
        with self.assertRaises(Error) as e:
            c.alloc_blocks(3, 4096, opts=key)
        self.assertEqual(e.exception.code, Status.FAILED_PRECONDITION)
        self.assertEqual(c.free_blocks(a), [Status.OK, Status.OK])

    def test_buffers(self) -> None:
        c = self.connect()
        b = c.create_buffer(1 << 20)
        self.assertNotEqual(b.id, 0)
        self.assertEqual(b.size, 1 << 20)
        self.assertFalse(b.view.readonly)
        b.view[:16] = pattern(16, 5)
        self.assertEqual(c.locate(b.view[100:200]), (b.id, 100))
        blk = c.alloc_blocks(1, 4096)[0]
        self.assertEqual(c.locate(c.pool.view[blk:blk + 4096]), (c.pool.segment, blk))
        with self.assertRaises(Error) as e:
            c.locate(bytearray(10))
        self.assertEqual(e.exception.code, Status.NOT_FOUND)
        with self.assertRaises(ValueError):
            c.locate(b"read-only")
        # A buffer closed is unregistered; its view stays usable.
        view = b.view
        b.close()
        self.assertFalse(b.registered)
        view[0] = 7
        self.assertEqual(view[0], 7)
        with self.assertRaises(Error) as e:
            c.locate(view[0:10])
        self.assertEqual(e.exception.code, Status.NOT_FOUND)
        b.close()  # idempotent
        with c.create_buffer(4096) as b2:
            self.assertTrue(b2.registered)
            self.assertEqual(b2.huge, 0)
        self.assertFalse(b2.registered)
        # A buffer's whole 2 MiB spans are on transparent huge pages, as
        # the pool's are (the C library's tests hold the rest).
        with c.create_buffer((5 << 20) + 4096) as b3:
            if b3.huge == 0 and not provides("thp"):
                self.skipTest("needs thp: MADV_COLLAPSE on a memfd (Linux 6.1); TENSORCAST_TEST_PROVIDES does not list it")
            self.assertEqual(b3.huge, 4 << 20)

    def test_register_fd(self) -> None:
        c = self.connect()
        fd = os.memfd_create("py-own", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        self.addCleanup(os.close, fd)
        os.ftruncate(fd, 65536)
        seg = c.register_fd(fd, 65536)  # sealable: the daemon seals it against shrinking
        self.assertNotEqual(seg, 0)
        self.assertTrue(fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK)
        with self.assertRaises(PermissionError):
            os.ftruncate(fd, 4096)
        c.unregister(seg)
        # Not sealable, as an engine's shared-memory host allocator makes it:
        # taken unsealed.
        raw = os.memfd_create("py-raw", os.MFD_CLOEXEC)
        self.addCleanup(os.close, raw)
        os.ftruncate(raw, 65536)
        seg = c.register_fd(raw, 65536)
        self.assertNotEqual(seg, 0)
        c.unregister(seg)
        # A file on disk (the source tree's file system) is not memory.
        with tempfile.TemporaryFile(dir=ROOT) as f:
            f.truncate(65536)
            with self.assertRaises(Error) as e:
                c.register_fd(f.fileno(), 65536)
            self.assertEqual(e.exception.code, Status.INVALID_ARGUMENT)
        seg = c.register_fd(fd, 65536)
        self.assertNotEqual(seg, 0)
        with self.assertRaises(Error) as e:
            c.register_fd(-1, 4096)
        self.assertEqual(e.exception.code, Status.INVALID_ARGUMENT)
        c.unregister(seg)
        with self.assertRaises(Error) as e:
            c.unregister(seg)
        self.assertEqual(e.exception.code, Status.NOT_FOUND)

    def test_files(self) -> None:
        c = self.connect()
        path = os.path.join(self.daemon.data, "py.bin")
        with open(path, "wb") as f:
            f.truncate(1 << 20)
        seg, size = c.register_file(path)
        self.assertEqual(size, 1 << 20)
        b = c.create_buffer(256 << 10)
        b.view[:] = pattern(256 << 10, 9)
        r = c.transfer([Request(Op.WRITE, b.id, 0, seg, 4096, 256 << 10)], timeout=5)
        self.assertEqual(r.codes, [Status.OK])
        with open(path, "rb") as f:
            f.seek(4096)
            self.assertEqual(f.read(256 << 10), pattern(256 << 10, 9))
        with self.assertRaises(Error) as e:
            c.register_file("/etc/hostname")
        self.assertEqual(e.exception.code, Status.PERMISSION_DENIED)
        c.unregister(seg)
        b.close()

    def test_batch_lifecycle(self) -> None:
        c = self.connect()
        p = c.pool
        b = c.create_buffer(1 << 20)
        b.view[:] = pattern(1 << 20, 21)
        blk = c.alloc_blocks(2, 128 << 10)
        batch = c.alloc_batch(8)
        codes = c.submit(batch, [
            Request(Op.WRITE, b.id, 0, p.segment, blk[0], 128 << 10),
            Request(Op.WRITE, 999999, 0, p.segment, blk[1], 4096),
            Request(Op.WRITE, b.id, 0, p.segment, blk[1], 0),
            Request(Op.READ, b.id, 512 << 10, p.segment, blk[0], 4096),
        ])
        self.assertEqual(codes, [Status.OK, Status.NOT_FOUND, Status.INVALID_ARGUMENT, Status.OK])
        s = c.wait(batch, timeout=5)
        self.assertTrue(s.done)
        self.assertEqual(s.completed, 2)
        self.assertEqual(bytes(p.view[blk[0]:blk[0] + (128 << 10)]), pattern(1 << 20, 21)[:128 << 10])
        t = c.task_status(batch, 0)
        self.assertEqual((t.state, t.code, t.transferred), (TaskState.COMPLETED, Status.OK, 128 << 10))
        self.assertEqual(c.task_status(batch, 1).state, TaskState.FAILED)
        self.assertEqual(c.batch_status(batch), s)
        c.free_batch(batch)
        for call in (lambda: c.free_batch(batch), lambda: c.batch_status(batch), lambda: c.wait(batch, 0.1),
                     lambda: c.task_status(batch, 0),
                     lambda: c.submit(batch, [Request(Op.READ, b.id, 0, p.segment, blk[0], 8)])):
            with self.assertRaises(Error) as e:
                call()
            self.assertEqual(e.exception.code, Status.NOT_FOUND)
        with self.assertRaises(Error) as e:
            c.alloc_batch(c.hello.limits.max_batch_capacity + 1)
        self.assertEqual(e.exception.code, Status.RESOURCE_EXHAUSTED)
        self.assertEqual(c.free_blocks(blk), [Status.OK, Status.OK])
        b.close()

    def test_transfer_positional(self) -> None:
        c = self.connect()
        p = c.pool
        b = c.create_buffer(1 << 20)
        b.view[:] = pattern(1 << 20, 22)
        blk = c.alloc_blocks(1, 256 << 10)[0]
        r = c.transfer([
            Request(Op.WRITE, b.id, 0, p.segment, blk, 256 << 10),
            Request(Op.READ, 424242, 0, p.segment, blk, 4096),
            Request(Op(2), b.id, 0, p.segment, blk + (1 << 30), 4096),
        ], timeout=5)
        self.assertEqual(r.codes, [Status.OK, Status.NOT_FOUND, Status.PERMISSION_DENIED])
        self.assertEqual(r.states, [TaskState.COMPLETED, TaskState.INVALID, TaskState.INVALID])
        self.assertEqual(r.summary.transferred, 256 << 10)
        self.assertEqual(bytes(p.view[blk:blk + (256 << 10)]), pattern(1 << 20, 22)[:256 << 10])
        # Read it back into another part of the buffer.
        r = c.transfer([Request(Op.READ, b.id, 512 << 10, p.segment, blk, 256 << 10)], timeout=5)
        self.assertEqual(r.codes, [Status.OK])
        self.assertEqual(bytes(b.view[512 << 10:768 << 10]), pattern(1 << 20, 22)[:256 << 10])
        # Without a peer plane a notification cannot ride; refused in place.
        r = c.transfer([Request(Op.WRITE, b.id, 0, p.segment, blk, 8), Request(Op.WRITE, b.id, 8, p.segment, blk, 8)],
                       timeout=5, notify=[b"note", None])
        self.assertEqual(r.codes, [Status.UNAVAILABLE, Status.OK])
        for bad in ([b"x" * (tensorcast.MAX_NOTIFY + 1), None], [b"x"]):
            with self.assertRaises(Error) as e:
                c.transfer([Request(Op.WRITE, b.id, 0, p.segment, blk, 8)] * 2, timeout=5, notify=bad)
            self.assertEqual(e.exception.code, Status.INVALID_ARGUMENT)
        with self.assertRaises(Error):
            c.transfer([], timeout=5)
        b.close()

    def test_exports_without_peers(self) -> None:
        c = self.connect()
        b = c.create_buffer(65536)
        self.assertEqual(c.export_segment("py-kv", b.id), 65536)
        with self.assertRaises(Error) as e:
            c.export_segment("py-kv", b.id)
        self.assertEqual(e.exception.code, Status.ALREADY_EXISTS)
        c.subscribe("py-kv")
        with self.assertRaises(Error) as e:
            c.subscribe("nobody")
        self.assertEqual(e.exception.code, Status.NOT_FOUND)
        self.assertEqual(c.poll_notifications(), [])
        with self.assertRaises(Error) as e:
            c.open_remote("host-x/kv")
        self.assertEqual(e.exception.code, Status.UNAVAILABLE)  # no peer plane
        with self.assertRaises(Error) as e:
            c.close_remote(777)
        self.assertEqual(e.exception.code, Status.NOT_FOUND)
        c.unexport_segment("py-kv")
        with self.assertRaises(Error) as e:
            c.unexport_segment("py-kv")
        self.assertEqual(e.exception.code, Status.NOT_FOUND)
        b.close()


class TestPeers(unittest.TestCase):
    """Two daemons with a peer plane: a notified WRITE into an export of the
    other, read back."""

    def test_remote_write_and_notification(self) -> None:
        import shutil
        import tempfile

        key_dir = tempfile.mkdtemp(prefix="tc-pytest-key-")
        self.addCleanup(shutil.rmtree, key_dir, True)
        key = os.path.join(key_dir, "cluster.key")
        with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        common = ["--peer-listen", "127.0.0.1:0", "--cluster-key-file", key, "--rdma", "off"]
        # py-a accepts py-b when it dials in (a peer it does not list is refused).
        a = Daemon(["--daemon-id", "py-a", "--peer", "py-b=", *common]).start()
        self.addCleanup(a.close)
        ca = tensorcast.connect(a.socket)
        self.addCleanup(ca.close)
        self.assertTrue(ca.hello.peer_addr)
        b = Daemon(["--daemon-id", "py-b", "--peer", f"py-a={ca.hello.peer_addr}", *common]).start()
        self.addCleanup(b.close)
        cb = tensorcast.connect(b.socket)
        self.addCleanup(cb.close)

        target = ca.create_buffer(1 << 20)
        ca.export_segment("kv", target.id)
        ca.subscribe("kv")
        r = cb.open_remote("py-a/kv", transport=tensorcast.Transport.TCP)
        self.assertEqual(r.size, 1 << 20)
        src = cb.create_buffer(1 << 20)
        src.view[:] = pattern(1 << 20, 41)
        res = cb.transfer([Request(Op.WRITE, src.id, 0, r.id, 0, 128 << 10)], timeout=10, notify=[b"page 3 ready"])
        self.assertEqual(res.codes, [Status.OK])
        self.assertEqual(bytes(target.view[:128 << 10]), pattern(1 << 20, 41)[:128 << 10])
        self.assertEqual(ca.poll_notifications(max=4, timeout=5),
                         [tensorcast.Notification("kv", b"page 3 ready")])
        res = cb.transfer([Request(Op.READ, src.id, 512 << 10, r.id, 0, 128 << 10)], timeout=10)
        self.assertEqual(res.codes, [Status.OK])
        self.assertEqual(bytes(src.view[512 << 10:640 << 10]), pattern(1 << 20, 41)[:128 << 10])
        # A notified WRITE through a queue: its completion comes once the
        # peer acknowledged, and the payload arrives whole.
        with cb.open_queue(8) as q:
            self.assertEqual(q.submit([Request(Op.WRITE, src.id, 0, r.id, 256 << 10, 4096)], [7],
                                      notify=[b"queued page"]), 1)
            self.assertEqual(q.reap(min=1, timeout=10), [tensorcast.Completion(7, 4096, Status.OK,
                                                                               TaskState.COMPLETED)])
        self.assertEqual(ca.poll_notifications(max=4, timeout=5), [tensorcast.Notification("kv", b"queued page")])
        self.assertEqual(bytes(target.view[256 << 10:(256 << 10) + 4096]), pattern(1 << 20, 41)[:4096])
        cb.close_remote(r.id)
        with self.assertRaises(Error) as e:
            cb.close_remote(r.id)
        self.assertEqual(e.exception.code, Status.NOT_FOUND)


class Blocked(threading.Thread):
    """A call on its own thread, blocked in the daemon."""

    def __init__(self, fn: "object") -> None:
        super().__init__(daemon=True)
        self.fn = fn
        self.error: Optional[BaseException] = None
        self.result: object = None
        self.started_id = threading.Event()
        self.native: int = 0

    def run(self) -> None:
        self.native = threading.get_native_id()
        self.started_id.set()
        try:
            self.result = self.fn()  # type: ignore[operator]
        except BaseException as e:  # noqa: BLE001 - handed to the test
            self.error = e

    def start_blocked(self) -> "Blocked":
        self.start()
        self.started_id.wait()
        wait_blocked(self.native)
        return self


class TestFailures(unittest.TestCase):
    def test_killed_daemon_then_reconnect(self) -> None:
        d = Daemon().start()
        self.addCleanup(d.close)
        c = tensorcast.connect(d.socket, call_timeout=5.0)
        self.addCleanup(c.close)
        first_pool = c.pool
        blk = c.alloc_blocks(1, 4096)[0]
        first_pool.view[blk] = 0x5A
        d.kill()
        with self.assertRaises(Error) as e:
            c.ping()
        self.assertEqual(e.exception.code, Status.CLOSED)
        with self.assertRaises(Error) as e:
            c.alloc_blocks(1, 4096)
        self.assertEqual(e.exception.code, Status.CLOSED)
        with self.assertRaises(Error) as e:
            c.reconnect()  # nobody there yet
        self.assertEqual(e.exception.code, Status.SYSTEM)
        d.start()  # a new daemon on the same socket
        c.reconnect()
        c.ping(b"back")
        self.assertEqual(len(c.alloc_blocks(1, 4096)), 1)
        self.assertIsNot(c.pool, first_pool)
        self.assertEqual(first_pool.view[blk], 0x5A)  # the old mapping is still readable

    def test_killed_while_waiting(self) -> None:
        d = Daemon().start()
        self.addCleanup(d.close)
        c = tensorcast.connect(d.socket)
        self.addCleanup(c.close)
        t = Blocked(lambda: c.poll_notifications(timeout=30)).start_blocked()
        t0 = time.monotonic()
        d.kill()
        t.join(10)
        self.assertFalse(t.is_alive())
        self.assertLess(time.monotonic() - t0, 5)
        self.assertIsInstance(t.error, Error)
        assert isinstance(t.error, Error)
        self.assertEqual(t.error.code, Status.CLOSED)

    def test_close_ends_a_blocked_call(self) -> None:
        d = Daemon().start()
        self.addCleanup(d.close)
        c = tensorcast.connect(d.socket)
        t = Blocked(lambda: c.poll_notifications(timeout=30)).start_blocked()
        c.close()  # shuts the socket down, waits for the call to leave, frees
        t.join(10)
        self.assertFalse(t.is_alive())
        assert isinstance(t.error, Error)
        self.assertEqual(t.error.code, Status.CLOSED)
        self.assertTrue(c.closed)

    def test_call_timeout(self) -> None:
        d = Daemon().start()
        self.addCleanup(d.close)
        c = tensorcast.connect(d.socket, call_timeout=0.3)
        self.addCleanup(c.close)
        d.freeze()
        self.addCleanup(d.thaw)
        with self.assertRaises(Error) as e:
            c.ping()
        self.assertEqual(e.exception.code, Status.TIMED_OUT)
        with self.assertRaises(Error) as e:
            c.ping()
        self.assertEqual(e.exception.code, Status.CLOSED)


class TestGIL(DaemonCase):
    def test_other_threads_run_while_one_waits(self) -> None:
        waiting = self.connect()
        other = self.connect()
        t = Blocked(lambda: waiting.poll_notifications(timeout=20)).start_blocked()
        # The waiter is inside the library; this thread runs Python and
        # makes calls of its own meanwhile.
        n = 0
        for i in range(20000):
            n += i
        for _ in range(20):
            other.ping(b"meanwhile")
        self.assertTrue(t.is_alive())
        from .daemon import blocked_in_poll

        self.assertTrue(blocked_in_poll(t.native))
        waiting.shutdown()
        t.join(10)
        assert isinstance(t.error, Error)
        self.assertEqual(t.error.code, Status.CLOSED)
        self.assertEqual(n, sum(range(20000)))


class TestThreads(DaemonCase):
    def test_shared_connection(self) -> None:
        c = self.connect()
        errors: List[BaseException] = []

        def work(k: int) -> None:
            try:
                for i in range(100):
                    c.ping(f"{k}-{i}".encode())
                    off = c.alloc_blocks(1, 4096)
                    if c.free_blocks(off) != [Status.OK]:
                        raise AssertionError("free failed")
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(c.stats().connection["blocks"], 0)


if __name__ == "__main__":
    unittest.main()
