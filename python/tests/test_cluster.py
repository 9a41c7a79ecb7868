"""The KV store across hosts from Python: two daemons of one cluster on
loopback ports; what a client of one puts, a client of the other finds and
reads byte-exact with the same calls (exists, lookup_prefix, get, stat), and
a remove on either removes every copy."""

from __future__ import annotations

import os
import time
import unittest

import tensorcast
from tensorcast import Status

from .daemon import Daemon
from .test_core import pattern

OK, NF = Status.OK, Status.NOT_FOUND


def config(path: str, daemon_id: str, key: str, peers: str) -> str:
    with open(path, "w") as f:
        f.write(f'daemon_id = "{daemon_id}"\npeer_listen = "127.0.0.1:0"\ncluster_key_file = "{key}"\n'
                f'store_l2_path = "off"\nstore_shards = 64\n{peers}')
    return path


class TestCluster(unittest.TestCase):
    def setUp(self) -> None:
        d1 = Daemon()
        key = os.path.join(d1.dir, "cluster.key")
        with open(key, "w") as f:
            f.write("tensorcast python cluster test key\n")
        os.chmod(key, 0o600)
        d1.args += ["--config", config(os.path.join(d1.dir, "d1.toml"), "d1", key, '[[peers]]\nid = "d2"\n')]
        self.d1 = d1.start()
        self.addCleanup(d1.close)
        c1 = tensorcast.connect(d1.socket, "putter")
        self.addCleanup(c1.close)
        self.c1 = c1
        addr = c1.hello.peer_addr
        self.assertTrue(addr)
        d2 = Daemon()
        d2.args += ["--config", config(os.path.join(d2.dir, "d2.toml"), "d2", key,
                                       f'[[peers]]\nid = "d1"\naddr = "{addr}"\n')]
        self.d2 = d2.start()
        self.addCleanup(d2.close)
        self.c2 = tensorcast.connect(d2.socket, "reader")
        self.addCleanup(self.c2.close)

    def eventually(self, cond, what: str) -> None:
        # The announcements of a put reach the homes in the background.
        deadline = time.monotonic() + 10
        while not cond():
            if time.monotonic() > deadline:
                self.fail(f"not within 10 s: {what}")
            time.sleep(0.01)

    def test_put_here_read_there(self) -> None:
        keys = [f"py/{i:02d}".encode() for i in range(8)]
        vals = [pattern(4096 * (i + 1), 40 + i) for i in range(8)]
        self.assertEqual(self.c1.put(keys, vals), [OK] * 8)
        self.eventually(lambda: self.c2.exists(keys) == [True] * 8, "d2 finding d1's keys")
        self.assertEqual(self.c2.exists([keys[0], b"py/absent"]), [True, False])
        self.assertEqual(self.c2.lookup_prefix(keys[:3] + [b"py/absent"] + keys[3:]), 3)
        self.assertEqual(self.c2.stat(keys[5]).size, len(vals[5]))
        outs = [bytearray(len(v)) for v in vals]
        r = self.c2.get(keys, outs)
        self.assertEqual(r, [OK] * 8)
        self.assertEqual([bytes(o) for o in outs], vals)
        # A remove on d2 removes d1's copy too.
        self.assertEqual(self.c2.remove([keys[0]]), [OK])
        self.assertEqual(self.c1.exists([keys[0]]), [False])
        self.assertEqual(self.c2.exists([keys[0]]), [False])
        out = bytearray(len(vals[0]))
        self.assertEqual(self.c1.get([keys[0]], [out]), [NF])


if __name__ == "__main__":
    unittest.main()
