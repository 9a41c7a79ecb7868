"""A restart that keeps the DRAM cache, seen from the Python client: the
daemon runs under a stand-in for systemd (a socket unit's listening socket,
the notify socket and the file descriptor store), is restarted with SIGTERM
and killed with SIGKILL, and the client reconnects to a daemon that serves
every value committed before, in the very pool its old mapping shows."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
from typing import List, Optional, Tuple

import tensorcast
from tensorcast import Status

from .daemon import daemon_binary
from .test_compat import c_client
from .test_core import pattern

OK = Status.OK

# Moves the descriptors named in argv to 3.., sets LISTEN_PID to its own pid
# and execs the daemon (keeping that pid), as systemd's fork does.
_EXEC_WITH_FDS = """
import os, sys
n = int(sys.argv[1])
srcs = [int(a) for a in sys.argv[2:2 + n]]
tmp = [os.dup2(fd, 1000 + i) for i, fd in enumerate(srcs)]
for fd in srcs:
    os.close(fd)
for i, fd in enumerate(tmp):
    os.dup2(fd, 3 + i)
    os.close(fd)
os.environ["LISTEN_PID"] = str(os.getpid())
os.execv(sys.argv[2 + n], sys.argv[2 + n:])
"""


class FdStoreSystemd:
    """Plays systemd for tensorcastd.service with tensorcastd.socket and
    FileDescriptorStoreMax=: holds the control socket, keeps what the
    daemon sends with FDSTORE=1 (a file it holds already only once, as
    systemd does), drops what it names in FDSTOREREMOVE=1, and starts each
    daemon with all of it from fd 3 on (LISTEN_FDS, LISTEN_FDNAMES,
    LISTEN_PID, FDSTORE)."""

    def __init__(self, *extra: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="tc-pyrestart-")
        self.socket = os.path.join(self.dir, "s.sock")
        self.log = os.path.join(self.dir, "daemon.log")
        self.ctl = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.ctl.bind(self.socket)
        self.ctl.listen(128)
        self.notify_path = os.path.join(self.dir, "notify.sock")
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(self.notify_path)
        self.stored: List[Tuple[str, int]] = []
        self.args = [daemon_binary(), "--socket", os.path.join(self.dir, "configured.sock"),
                     "--data-dir", os.path.join(self.dir, "data"), "--pool-size", "64MiB", "--hugepages", "off",
                     "--metrics-address", "off", "--ebpf", "off", "--drain-timeout", "2s", *extra]
        self.proc: Optional[subprocess.Popen[bytes]] = None

    def _take(self, msg: bytes, fds: List[int]) -> None:
        fields = dict(line.split("=", 1) for line in msg.decode().split("\n") if "=" in line)
        if fields.get("FDSTORE") == "1":
            for fd in fds:
                st = os.fstat(fd)
                if any((os.fstat(k).st_dev, os.fstat(k).st_ino) == (st.st_dev, st.st_ino) for _, k in self.stored):
                    os.close(fd)
                else:
                    self.stored.append((fields.get("FDNAME", "stored"), fd))
            return
        for fd in fds:
            os.close(fd)
        if fields.get("FDSTOREREMOVE") == "1":
            for name, fd in [s for s in self.stored if s[0] == fields.get("FDNAME")]:
                os.close(fd)
                self.stored.remove((name, fd))

    def start(self) -> None:
        srcs = [self.ctl.fileno()] + [fd for _, fd in self.stored]
        names = ["control"] + [n for n, _ in self.stored]
        env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORCAST_")}
        env.update(LISTEN_FDS=str(len(srcs)), LISTEN_FDNAMES=":".join(names), NOTIFY_SOCKET=self.notify_path,
                   FDSTORE="16")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-c", _EXEC_WITH_FDS, str(len(srcs)), *map(str, srcs), *self.args],
                                         stdout=log, stderr=log, env=env, pass_fds=srcs)
        deadline = time.monotonic() + 30
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"tensorcastd not ready after 30 s:\n{self.log_tail()}")
            self.notify.settimeout(min(left, 0.5))
            try:
                msg, fds, _, _ = socket.recv_fds(self.notify, 4096, 16)
            except socket.timeout:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"tensorcastd exited ({self.proc.returncode}):\n{self.log_tail()}")
                continue
            self._take(msg, fds)
            if msg.startswith(b"READY=1"):
                return

    def signal(self, sig: int) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        return self.proc.wait(30)

    def log_tail(self) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return f.read()[-3000:]
        except OSError:
            return ""

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for _, fd in self.stored:
            os.close(fd)
        self.stored = []
        self.ctl.close()
        self.notify.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class TestRestartKeepsL1(unittest.TestCase):
    def test_values_and_mappings_survive_sigterm_and_sigkill(self) -> None:
        """The Python client and the C client (tc_compat restart), both
        with reconnect, go on with the connection and the mapping they made
        before the first restart: they connect again by themselves."""
        sd = FdStoreSystemd("--store-l2-path", "off")
        self.addCleanup(sd.close)
        sd.start()
        self.assertEqual(sorted(n for n, _ in sd.stored), ["l1journal-default", "pool-default"])
        c = tensorcast.connect(sd.socket, "restart", reconnect=True)
        self.addCleanup(c.close)
        old = c.pool  # the mapping made before any restart

        keys = [f"kept/{i:04d}".encode() for i in range(1000)]
        vals = [pattern(100 + (i * 37) % 8000, i + 1) for i in range(len(keys))]
        offsets: List[int] = []
        for lo in range(0, len(keys), 250):
            r = c.reserve(keys[lo:lo + 250], [len(v) for v in vals[lo:lo + 250]])
            self.assertEqual(r.codes, [OK] * len(r.codes))
            for view, v in zip(r.views, vals[lo:lo + 250]):
                assert view is not None
                view[:] = v
            offsets.extend(r.offsets)
            self.assertEqual(r.commit(), [OK] * len(r.codes))
        # Being written when the daemon goes: reserved, written, never
        # committed.
        half = [f"half/{i}".encode() for i in range(20)]
        hr = c.reserve(half, 4096)
        for view in hr.views:
            assert view is not None
            view[:] = b"\xab" * 4096

        cproc = subprocess.Popen([*c_client(), "restart", sd.socket, "c-kept", "300"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        self.addCleanup(cproc.stdout.close)  # type: ignore[union-attr]
        self.addCleanup(cproc.wait)
        self.addCleanup(cproc.stdin.close)  # type: ignore[union-attr]
        assert cproc.stdin is not None and cproc.stdout is not None
        self.assertEqual(json.loads(cproc.stdout.readline()), {"client": "c", "ok": True, "put": 300})

        for rounds, sig in enumerate((signal.SIGTERM, signal.SIGKILL)):
            rc = sd.signal(sig)
            if sig == signal.SIGTERM:
                self.assertEqual(rc, 0, sd.log_tail())
            sd.start()
            self.assertIn("L1 values kept across the restart", sd.log_tail())
            # The client connects again by itself: a call on the socket
            # made after the restart succeeds; the store's queue belonged
            # to the old connection, so its first call fails (CLOSED) and
            # the next one runs on a new queue.
            c.ping(b"after")
            self.assertEqual(c.reconnects, rounds + 1)
            self.assertIs(c.pool, old)
            with self.assertRaises(tensorcast.Error) as cm:
                c.exists(keys[:1])
            self.assertEqual(cm.exception.code, Status.CLOSED)
            locs = c.get_locations(keys)
            self.assertEqual(list(locs.codes), [OK] * len(keys), sd.log_tail())
            for i, v in enumerate(vals):
                self.assertEqual(locs.offsets[i], offsets[i])
                self.assertEqual(bytes(old.view[offsets[i]:offsets[i] + len(v)]), v, f"{keys[i]!r} after {sig!r}")
            self.assertEqual(c.release(keys), [OK] * len(keys))
            outs = [bytearray(8100) for _ in keys[:50]]
            got = c.get(keys[:50], outs)
            self.assertEqual(list(got), [OK] * 50)
            for i in range(50):
                self.assertEqual(bytes(outs[i][:got.lengths[i]]), vals[i])
            self.assertEqual(c.exists(half), [False] * len(half), f"uncommitted values served after {sig!r}")
            cproc.stdin.write("check\n")
            cproc.stdin.flush()
            self.assertEqual(json.loads(cproc.stdout.readline()),
                             {"client": "c", "ok": True, "reconnects": rounds + 1, "same_pool": True,
                              "stale_released": True, "in_old_mapping": 300, "in_place": 300, "read_back": 300},
                             f"the C client after {sig!r}")
        sd.signal(signal.SIGTERM)


if __name__ == "__main__":
    unittest.main()
