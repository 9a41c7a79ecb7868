"""Start real tensorcastd daemons for the tests.

Each daemon gets a socket and data directory under a new temporary directory;
readiness is its sd_notify READY=1 on a socket the test listens on (no
polling of the control socket). The binary is $TENSORCASTD, else the source
tree's bin/tensorcastd (`make build`). The source tree is the one these
tests are in, or $TENSORCAST_SOURCE (for a copy of them run against an
installed package).
"""

from __future__ import annotations

import os
import platform
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import List, Optional, Sequence

ROOT = Path(os.environ.get("TENSORCAST_SOURCE") or Path(__file__).resolve().parent.parent.parent)


def provides(feature: str) -> bool:
    """Whether TENSORCAST_TEST_PROVIDES (comma-separated) names feature: this
    machine must have it, and a test needing it fails without."""
    return feature in os.environ.get("TENSORCAST_TEST_PROVIDES", "").split(",")


def daemon_binary() -> str:
    b = os.environ.get("TENSORCASTD") or str(ROOT / "bin" / "tensorcastd")
    if not os.access(b, os.X_OK):
        raise RuntimeError(f"no tensorcastd at {b}: run `make build` or set TENSORCASTD")
    return b


class Daemon:
    """One tensorcastd; start() may be called again after kill() or stop(),
    on the same socket and data directory (a restart)."""

    def __init__(self, extra: Sequence[str] = (), pool_size: str = "32MiB") -> None:
        self.dir = tempfile.mkdtemp(prefix="tc-pytest-")
        self.socket = os.path.join(self.dir, "s.sock")
        self.data = os.path.join(self.dir, "data")
        self.log = os.path.join(self.dir, "daemon.log")
        # No metrics endpoint: several daemons run on one host.
        self.args: List[str] = [daemon_binary(), "--socket", self.socket, "--data-dir", self.data,
                                "--pool-size", pool_size, "--hugepages", "off", "--metrics-address", "off", *extra]
        self.proc: Optional[subprocess.Popen[bytes]] = None

    def start(self) -> "Daemon":
        notify = os.path.join(self.dir, "notify.sock")
        if os.path.exists(notify):
            os.unlink(notify)
        ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            ns.bind(notify)
            env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORCAST_")}
            env["NOTIFY_SOCKET"] = notify
            with open(self.log, "ab") as log:
                self.proc = subprocess.Popen(self.args, stdout=log, stderr=log, env=env)
            deadline = time.monotonic() + 20
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"tensorcastd not ready after 20 s:\n{self.log_tail()}")
                ns.settimeout(min(left, 0.5))
                try:
                    msg = ns.recv(512)
                except socket.timeout:
                    if self.proc.poll() is not None:
                        raise RuntimeError(f"tensorcastd exited ({self.proc.returncode}):\n{self.log_tail()}")
                    continue
                if b"READY=1" in msg:
                    return self
        finally:
            ns.close()

    def log_tail(self) -> str:
        try:
            return Path(self.log).read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def freeze(self) -> None:
        """SIGSTOP, returning once the daemon has stopped."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)
        os.waitid(os.P_PID, self.proc.pid, os.WSTOPPED)

    def thaw(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return -1
        return self.proc.returncode

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _syscall_of(native_id: int) -> str:
    try:
        with open(f"/proc/self/task/{native_id}/syscall") as f:
            return f.read().split()[0]
    except (OSError, IndexError):
        return ""


def blocked_in_poll(native_id: int) -> bool:
    """Whether thread native_id of this process sleeps in poll(2)/ppoll(2):
    libtensorcast's wait for an answer it has sent for."""
    return _syscall_of(native_id) in _POLL_SYSCALLS.get(platform.machine(), ())


def blocked_in_futex(native_id: int) -> bool:
    """Whether thread native_id sleeps in futex(2): a queue's reap waiting
    for completions."""
    return _syscall_of(native_id) == _FUTEX_SYSCALL.get(platform.machine())


# poll and ppoll, and futex, by architecture.
_POLL_SYSCALLS = {"x86_64": ("7", "271"), "aarch64": ("73",)}
_FUTEX_SYSCALL = {"x86_64": "202", "aarch64": "98"}


def wait_blocked(native_id: int, timeout: float = 10.0, futex: bool = False) -> None:
    """Returns once thread native_id is blocked in poll (futex: in futex),
    checked every millisecond; raises after timeout."""
    deadline = time.monotonic() + timeout
    blocked = blocked_in_futex if futex else blocked_in_poll
    while not blocked(native_id):
        if time.monotonic() > deadline:
            raise AssertionError(f"thread {native_id} did not block in the library within {timeout} s")
        time.sleep(0.001)
