"""Export grants from every client but Go's (which has its own tests): a
tenant's export that grants another tenant, made by the Python client, the
C client (tc_compat export-to) and tcctl export, is read by a client of the
granted tenant on a peer daemon; an export that grants nobody is refused to
it; the end of each export takes it from the granted tenant too."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import unittest
from typing import List

import tensorcast
from tensorcast import Error, Op, Request, Rights, Status, Transport

from .daemon import ROOT, Daemon
from .test_compat import c_client
from .test_core import pattern

SIZE = 64 << 10


def tcctl() -> str:
    path = os.environ.get("TENSORCAST_TCCTL") or str(ROOT / "bin" / "tcctl")
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"no tcctl at {path}: run `make build` or set TENSORCAST_TCCTL")
    return path


class TestGrants(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="tc-pygrants-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        key = os.path.join(self.dir, "cluster.key")
        with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        common = ["--peer-listen", "127.0.0.1:0", "--cluster-key-file", key, "--rdma", "off"]
        # This user is tenant A on py-a and tenant C on py-b.
        uid = os.getuid()
        conf = {}
        for d, tenant in (("a", "A"), ("b", "C")):
            conf[d] = os.path.join(self.dir, f"{d}.toml")
            with open(conf[d], "w") as f:
                f.write(f'[[tenants]]\nname = "{tenant}"\nuids = [{uid}]\n')
        self.a = Daemon(["--config", conf["a"], "--daemon-id", "py-a", "--peer", "py-b=", *common]).start()
        self.addCleanup(self.a.close)
        self.ca = tensorcast.connect(self.a.socket)
        self.addCleanup(self.ca.close)
        self.b = Daemon(["--config", conf["b"], "--daemon-id", "py-b", "--peer", f"py-a={self.ca.hello.peer_addr}",
                         *common]).start()
        self.addCleanup(self.b.close)
        self.cb = tensorcast.connect(self.b.socket)
        self.addCleanup(self.cb.close)

    def _held(self, argv: List[str]) -> "subprocess.Popen[str]":
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.addCleanup(p.wait)
        self.addCleanup(p.stdout.close)  # type: ignore[union-attr]

        def end() -> None:
            if p.stdin is not None and not p.stdin.closed:
                p.stdin.close()
        self.addCleanup(end)
        return p

    def _read(self, name: str) -> bytes:
        """C's client on py-b opens py-a's export of tenant A and reads it."""
        r = self.cb.open_remote(f"py-a/A/{name}", rights=Rights.READ, transport=Transport.TCP)
        dst = self.cb.create_buffer(SIZE)
        try:
            self.assertEqual(r.size, SIZE)
            res = self.cb.transfer([Request(Op.READ, dst.id, 0, r.id, 0, SIZE)], timeout=10)
            self.assertEqual(res.codes, [Status.OK], name)
            return bytes(dst.view[:SIZE])
        finally:
            self.cb.close_remote(r.id)
            dst.close()

    def test_grants_from_python_c_and_tcctl(self) -> None:
        want = {"py-kv": pattern(SIZE, 51), "c-kv": pattern(SIZE, 52), "tcctl-kv": pattern(SIZE, 53)}
        # Python.
        granted = self.ca.create_buffer(SIZE)
        granted.view[:] = want["py-kv"]
        self.assertEqual(self.ca.export_segment("py-kv", granted.id, rights=Rights.READ, grants=["C"]), SIZE)
        closed = self.ca.create_buffer(SIZE)
        closed.view[:] = pattern(SIZE, 54)
        self.ca.export_segment("py-closed", closed.id, rights=Rights.READ)
        with self.assertRaises(Error) as e:
            self.ca.export_segment("py-own", closed.id, rights=Rights.READ, grants=["A"])
        self.assertEqual(e.exception.code, Status.INVALID_ARGUMENT, "granting the exporter's own tenant")
        # C.
        cx = self._held([*c_client(), "export-to", self.a.socket, "c-kv", "52", str(SIZE), "C", "D"])
        assert cx.stdout is not None and cx.stdin is not None
        self.assertEqual(json.loads(cx.stdout.readline()), {"client": "c", "ok": True, "exported": SIZE})
        bad = subprocess.run([*c_client(), "export-to", self.a.socket, "c-bad", "1", "4096", "C", "C"],
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
        self.assertEqual(json.loads(bad.stdout.splitlines()[0]),
                         {"client": "c", "ok": False, "code": int(Status.INVALID_ARGUMENT)}, "a tenant granted twice")
        # tcctl.
        blob = os.path.join(self.dir, "blob")
        with open(blob, "wb") as f:
            f.write(want["tcctl-kv"])
        tx = self._held([tcctl(), "--socket", self.a.socket, "export", "--grant", "C", "tcctl-kv", blob])
        assert tx.stdout is not None and tx.stdin is not None
        self.assertEqual(tx.stdout.readline().strip(),
                         f"exported tcctl-kv: {SIZE} bytes, read-only, granted to tenants C; "
                         "held until interrupted or stdin ends")

        listing = subprocess.run([tcctl(), "--socket", self.a.socket, "segments"], capture_output=True, text=True,
                                 check=True, timeout=30).stdout
        rows = {line.split()[0]: line.split() for line in listing.splitlines()[1:]}
        self.assertEqual({n: rows[n][-1] for n in ("py-kv", "py-closed", "c-kv", "tcctl-kv")},
                         {"py-kv": "C", "py-closed": "-", "c-kv": "C,D", "tcctl-kv": "C"}, listing)

        for name, data in want.items():
            self.assertEqual(self._read(name), data, f"{name} as read by the granted tenant")
        with self.assertRaises(Error) as e:
            self.cb.open_remote("py-a/A/py-closed", rights=Rights.READ, transport=Transport.TCP)
        self.assertEqual(e.exception.code, Status.PERMISSION_DENIED, "an export that grants nobody")

        # The end of each export ends its grant: one opened before it ends
        # reads no more, and it cannot be opened again.
        held = self.cb.open_remote("py-a/A/py-kv", rights=Rights.READ, transport=Transport.TCP)
        dst = self.cb.create_buffer(SIZE)
        self.ca.unexport_segment("py-kv")
        cx.stdin.close()
        self.assertEqual(json.loads(cx.stdout.readline()), {"client": "c", "ok": True, "unexported": 0})
        tx.stdin.close()
        self.assertEqual(tx.stdout.readline().strip(), "unexported tcctl-kv")
        self.assertEqual(tx.wait(30), 0)
        res = self.cb.transfer([Request(Op.READ, dst.id, 0, held.id, 0, SIZE)], timeout=10)
        self.assertNotEqual(res.codes, [Status.OK], "a read of an ended export")
        self.assertNotEqual(bytes(dst.view[:SIZE]), want["py-kv"])
        for name in want:
            with self.assertRaises(Error, msg=name) as e:
                self.cb.open_remote(f"py-a/A/{name}", rights=Rights.READ, transport=Transport.TCP)
            self.assertIn(e.exception.code, (Status.NOT_FOUND, Status.PERMISSION_DENIED), name)


if __name__ == "__main__":
    unittest.main()
