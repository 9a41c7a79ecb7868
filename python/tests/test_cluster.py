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

from . import vllm_standins
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

    def test_locate_and_replicas(self) -> None:
        # cluster_locate names a key's shard, home and generation and the
        # holders its home knows, the same from either daemon; store_put
        # with CallOptions(replicas=2) is copied to the other daemon, one
        # without keeps the daemon's default (one copy); replicas beyond the
        # limit are refused.
        buf = self.c1.create_buffer(2 * 4096)
        self.addCleanup(buf.close)
        buf.view[:] = pattern(2 * 4096, 91)
        self.assertEqual(self.c1.store_put([b"loc/one"], [(buf.id, 0, 4096)]), [OK])
        self.assertEqual(self.c1.store_put([b"loc/two"], [(buf.id, 4096, 4096)],
                                           opts=tensorcast.CallOptions(replicas=2)), [OK])
        self.eventually(lambda: len(self.c2.cluster_locate(b"loc/two").holders) == 2, "both copies of loc/two announced")
        self.eventually(lambda: len(self.c2.cluster_locate(b"loc/one").holders) == 1, "loc/one announced")
        one, two = self.c2.cluster_locate(b"loc/one"), self.c2.cluster_locate(b"loc/two")
        self.assertEqual([h.id for h in one.holders], ["d1"])
        self.assertEqual(sorted(h.id for h in two.holders), ["d1", "d2"])
        for h in one.holders + two.holders:
            self.assertEqual((h.size, h.tier), (4096, 1))
            self.assertNotEqual(h.epoch, 0)
        self.assertEqual(two.holders[0].crc32c, two.holders[1].crc32c)
        self.assertIn(one.home, ("d1", "d2"))
        self.assertNotEqual(one.generation, 0)
        again = self.c1.cluster_locate(b"loc/one")
        self.assertEqual((again.shard, again.home, again.generation), (one.shard, one.home, one.generation))
        none = self.c2.cluster_locate(b"loc/none")
        self.assertEqual(none.holders, [])
        with self.assertRaises(tensorcast.Error) as e:
            self.c1.store_put([b"loc/nine"], [(buf.id, 0, 4096)], opts=tensorcast.CallOptions(replicas=9))
        self.assertEqual(e.exception.code, Status.INVALID_ARGUMENT)


    def test_vllm_lookup_fetches_a_block_from_the_other_host(self) -> None:
        # vLLM's newest scheduler order against the reader's daemon: a block
        # stored only on the other host is RETRY while the manager's fetcher
        # brings it here, then HIT, and loads byte-exact.
        tv = vllm_standins.load(None)  # type: ignore[arg-type]
        self.addCleanup(vllm_standins.unload, None)
        size = 64 << 10
        m = tv.TensorcastOffloadingManager(size, socket=self.d2.socket, retry_interval=0)
        self.addCleanup(m.close)
        key, req = b"\x01" * 32 + (0).to_bytes(4, "big"), None
        sk = m.store_key(key)
        val = pattern(size, 77)
        self.assertEqual(self.c1.put([sk], [val]), [OK])
        self.eventually(lambda: self.c2.exists([sk]) == [True], "d2 finding d1's block")
        info = self.c2.stat(sk)
        self.assertEqual((info.in_l1, info.in_l2), (False, False))  # on the other host only
        m.on_new_request(req)
        self.assertIs(m.lookup(key, req), tv.LookupResult.RETRY)
        self.assertTrue(m.has_pending_work())
        self.eventually(lambda: not m.has_pending_work(), "the fetch from d1")
        # d2's copy is served there once its home has taken its
        # announcement; until then a lookup is RETRY again, never a MISS.
        def hit() -> bool:
            st = m.lookup(key, req)
            self.assertIn(st, (tv.LookupResult.HIT, tv.LookupResult.RETRY))
            return st is tv.LookupResult.HIT

        self.eventually(hit, "the fetched block a HIT on d2")
        self.assertTrue(self.c2.stat(sk).in_l1)
        load = m.prepare_load([key], req)
        self.assertEqual(load.ok, [True])
        c = m._link.client()
        assert c is not None
        self.assertEqual(bytes(load.views(c)[0]), val)
        m.complete_load([key], req)
        m.on_request_finished(req)
        self.assertEqual(self.c2.stat(sk).pins, 0)


if __name__ == "__main__":
    unittest.main()
