"""The C, Python and Go clients against one daemon, byte for byte.

Transfers: each client registers a buffer, writes a pattern in it (seed's
xorshift64), moves it into a pool block with a WRITE, reads the block back
into a second buffer with a READ and checks both; it then holds its
connection, and so its block, while every other client checks the block's
bytes through its own mapping of the daemon's pool.

The store: each client stores two keys of its own, one with a copying put
on the socket and one zero-copy through a queue (reserve, write in place,
durable commit); then every client reads every client's keys back, on the
socket and through a queue (a get in place, its results records, an unpin,
an exists, a lookup_prefix) and stats one: for each writer the three
readers' answers must be identical, records and digests included. The C client is c/build/tc_compat
($TENSORCAST_COMPAT_C), the Go client internal/compat (built here, or
$TENSORCAST_COMPAT_GO), the Python client this package.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import shutil
import subprocess
import tempfile
import unittest
from typing import Dict, List, Tuple

import tensorcast
from tensorcast import Op, Request, Status

from .daemon import ROOT, Daemon
from .test_core import pattern

SIZE = 256 << 10


def c_client() -> List[str]:
    path = os.environ.get("TENSORCAST_COMPAT_C") or str(ROOT / "c" / "build" / "tc_compat")
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"no C compat client at {path}: run `make build`")
    return [path]


class TestCompat(unittest.TestCase):
    go: List[str]

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.mkdtemp(prefix="tc-compat-")
        prebuilt = os.environ.get("TENSORCAST_COMPAT_GO")
        if prebuilt:
            cls.go = [prebuilt]
        else:
            go = shutil.which("go")
            if go is None:
                raise RuntimeError("the Go toolchain (go) is needed to build the Go compat client")
            exe = os.path.join(cls.tmp, "compat-go")
            subprocess.run([go, "build", "-o", exe, "./internal/compat"], cwd=ROOT, check=True)
            cls.go = [exe]
        cls.daemon = Daemon().start()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.daemon.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @staticmethod
    def reap(p: "subprocess.Popen[str]") -> None:
        if p.poll() is None:
            p.kill()
            p.wait()
        for f in (p.stdin, p.stdout):
            if f is not None:
                f.close()

    def python_write(self, c: tensorcast.Client, seed: int) -> Dict[str, object]:
        src, dst = c.create_buffer(SIZE), c.create_buffer(SIZE)
        src.view[:] = pattern(SIZE, seed)
        off = c.alloc_blocks(1, SIZE)[0]
        for r in (Request(Op.WRITE, src.id, 0, c.pool.segment, off, SIZE),
                  Request(Op.READ, dst.id, 0, c.pool.segment, off, SIZE)):
            self.assertEqual(c.transfer([r], timeout=10).codes, [Status.OK])
        ok = bytes(dst.view) == bytes(src.view) == bytes(c.pool.view[off:off + SIZE])
        return {"client": "python", "ok": ok, "daemon": c.hello.daemon_id, "segment": c.pool.segment,
                "offset": off, "size": SIZE}

    def test_same_bytes_through_every_client(self) -> None:
        sock = self.daemon.socket
        seeds = {"c": 0xC0FFEE, "go": 0x60D06, "python": 0x9F7405}
        writers: Dict[str, Tuple[subprocess.Popen[str], Dict[str, object]]] = {}
        with tensorcast.connect(sock, "compat-python") as py:
            reports: Dict[str, Dict[str, object]] = {"python": self.python_write(py, seeds["python"])}
            for name, cmd in (("c", c_client()), ("go", self.go)):
                p = subprocess.Popen(cmd + ["write", sock, str(seeds[name]), str(SIZE)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
                self.addCleanup(self.reap, p)
                assert p.stdout is not None
                line = p.stdout.readline()
                self.assertTrue(line, f"{name} writer printed nothing (exit {p.poll()})")
                writers[name] = (p, json.loads(line))
                reports[name] = writers[name][1]
            for name, r in reports.items():
                self.assertEqual(r["client"], name)
                self.assertTrue(r["ok"], f"{name} writer: {r}")
                self.assertEqual(r["segment"], py.pool.segment)
                self.assertEqual(r["size"], SIZE)
                self.assertEqual(r["daemon"], py.hello.daemon_id)
            # Three blocks held at once: three different places in the pool.
            self.assertEqual(len({r["offset"] for r in reports.values()}), 3)

            # Every client reads every other's block through its own mapping.
            for writer, r in reports.items():
                off = int(r["offset"])  # type: ignore[arg-type]
                want = pattern(SIZE, seeds[writer])
                self.assertEqual(bytes(py.pool.view[off:off + SIZE]), want, f"python reading {writer}'s block")
                for name, cmd in (("c", c_client()), ("go", self.go)):
                    out = subprocess.run(cmd + ["check", sock, str(seeds[writer]), str(off), str(SIZE)],
                                         capture_output=True, text=True, timeout=30)
                    got = json.loads(out.stdout.strip().splitlines()[-1])
                    self.assertEqual(got["client"], name)
                    self.assertTrue(got["ok"], f"{name} reading {writer}'s block: {got} {out.stderr}")
                    self.assertEqual(out.returncode, 0)
                # A wrong seed must not check: the checkers compare bytes.
                out = subprocess.run(c_client() + ["check", sock, str(seeds[writer] + 1), str(off), str(SIZE)],
                                     capture_output=True, text=True, timeout=30)
                self.assertNotEqual(out.returncode, 0)

            for name, (p, _) in writers.items():
                assert p.stdin is not None
                p.stdin.close()
                self.assertEqual(p.wait(30), 0, f"{name} writer")


    # -- the store ---------------------------------------------------------------

    def python_store_write(self, c: tensorcast.Client, prefix: str, seed: int) -> None:
        buf = c.create_buffer(SIZE)
        buf.view[:] = pattern(SIZE, seed)
        self.assertEqual(c.store_put([f"{prefix}/sock"], [(buf.id, 0, SIZE)]), [Status.OK])
        r = c.reserve([f"{prefix}/queue"], SIZE)
        self.assertEqual(r.codes, [Status.OK])
        r.views[0][:] = pattern(SIZE, seed + 1)  # type: ignore[index]
        self.assertEqual(r.commit(durable=True), [Status.OK])

    def python_store_check(self, c: tensorcast.Client, prefix: str, seed: int) -> Dict[str, object]:
        keys = [f"{prefix}/queue", f"{prefix}/sock", f"{prefix}/none"]
        want = [pattern(SIZE, seed + 1), pattern(SIZE, seed)]
        ok = True
        buf = c.create_buffer(3 * SIZE)
        r = c.store_read(keys, [(buf.id, i * SIZE, SIZE) for i in range(3)])
        read_sha = []
        for i, (st, n) in enumerate(zip(r, r.lengths)):
            if st == Status.OK:
                got = bytes(buf.view[i * SIZE:i * SIZE + n])
                read_sha.append(hashlib.sha256(got).hexdigest())
                ok = ok and i < 2 and got == want[i]
        loc = c.get_locations(keys)
        records, get_sha, pinned = [], [], []
        for i, (st, off, n) in enumerate(zip(loc.codes, loc.offsets, loc.lengths)):
            records.append(struct.pack("<B3xIQ", int(st), n, off).hex())
            if st == Status.OK:
                got = bytes(c.pool.view[off:off + n])
                get_sha.append(hashlib.sha256(got).hexdigest())
                ok = ok and i < 2 and got == want[i]
                pinned.append(keys[i])
        self.assertEqual(c.release(pinned), [Status.OK] * len(pinned))
        exists = [int(Status.OK) if e else int(Status.NOT_FOUND) for e in c.exists(keys)]
        info = c.stat(keys[0])
        return {"client": "python", "ok": ok, "read_codes": [int(x) for x in r], "read_lengths": list(r.lengths),
                "read_sha": read_sha, "get_records": records, "get_sha": get_sha, "exists": exists,
                "prefix": c.lookup_prefix([keys[1], keys[0], keys[2]]), "stat_size": info.size,
                "stat_l2": info.in_l2}

    def test_same_store_answers_through_every_client(self) -> None:
        sock = self.daemon.socket
        seeds = {"c": 0x5C, "go": 0x560, "python": 0x59}
        prefix = {name: f"compat-store/{name}" for name in seeds}
        cmds = {"c": c_client(), "go": self.go}
        with tensorcast.connect(sock, "compat-python") as py:
            self.python_store_write(py, prefix["python"], seeds["python"])
            for name, cmd in cmds.items():
                out = subprocess.run(cmd + ["store-write", sock, prefix[name], str(seeds[name]), str(SIZE)],
                                     capture_output=True, text=True, timeout=30)
                self.assertEqual(out.returncode, 0, f"{name} store-write: {out.stdout} {out.stderr}")
                self.assertTrue(json.loads(out.stdout.strip().splitlines()[-1])["ok"])
            for writer in seeds:
                reports = {"python": self.python_store_check(py, prefix[writer], seeds[writer])}
                for name, cmd in cmds.items():
                    out = subprocess.run(cmd + ["store-check", sock, prefix[writer], str(seeds[writer]), str(SIZE)],
                                         capture_output=True, text=True, timeout=30)
                    reports[name] = json.loads(out.stdout.strip().splitlines()[-1])
                    self.assertEqual(out.returncode, 0, f"{name} reading {writer}'s keys: {reports[name]} {out.stderr}")
                sha = [hashlib.sha256(pattern(SIZE, seeds[writer] + 1)).hexdigest(),
                       hashlib.sha256(pattern(SIZE, seeds[writer])).hexdigest()]
                for name, r in reports.items():
                    self.assertEqual(r.pop("client"), name)
                    self.assertTrue(r["ok"], f"{name} reading {writer}'s keys: {r}")
                    self.assertEqual(r["read_codes"], [0, 0, int(Status.NOT_FOUND)])
                    self.assertEqual(r["read_sha"], sha)
                    self.assertEqual(r["get_sha"], sha)
                    self.assertEqual((r["prefix"], r["stat_size"], r["stat_l2"]), (2, SIZE, True))
                # Byte-exact: every client got the same answers, down to the
                # results records (code, length, offset in the pool).
                self.assertEqual(reports["c"], reports["python"], f"{writer}'s keys: C and Python")
                self.assertEqual(reports["go"], reports["python"], f"{writer}'s keys: Go and Python")
                self.assertEqual(py.stat(f"{prefix[writer]}/queue").pins, 0)  # every get was released
            # A wrong seed must not check: the checkers compare bytes.
            out = subprocess.run(c_client() + ["store-check", sock, prefix["go"], str(seeds["go"] + 1), str(SIZE)],
                                 capture_output=True, text=True, timeout=30)
            self.assertNotEqual(out.returncode, 0)


if __name__ == "__main__":
    unittest.main()
