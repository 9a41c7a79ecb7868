"""The vLLM-shaped integration through its engine's call sequence, without
the engine: doubles of its workers, against real daemons, including one
killed and restarted mid-sequence (the SGLang backend's are in
test_sglang.py)."""

from __future__ import annotations

import logging
import unittest
from typing import List

import tensorcast
from tensorcast import Status

from .daemon import Daemon
from .engines import chain, quiet_logger
from .test_core import pattern


try:
    import torch
except ImportError:  # pragma: no cover - depends on the interpreter
    torch = None  # type: ignore[assignment]

if torch is not None:
    from tensorcast.integrations import vllm

NEEDS_TORCH = "torch is not installed for this interpreter (Debian: python3-torch)"


@unittest.skipIf(torch is None, NEEDS_TORCH)
class TestVLLM(unittest.TestCase):
    BLOCK = 16 << 10

    def hashes(self, n: int, seed: int) -> List[bytes]:
        return [bytes.fromhex(h) for h in chain(n, seed)]

    def test_scheduler_sequence(self) -> None:
        d = Daemon().start()
        self.addCleanup(d.close)
        m = vllm.TensorcastOffloadingManager(self.BLOCK, socket=d.socket, enable_events=True, abandon_limit=2,
                                             logger=quiet_logger("test.vllm"))
        self.addCleanup(m.close)
        worker = tensorcast.connect(d.socket, "vllm-worker")  # the worker's own mapping of the pool
        self.addCleanup(worker.close)
        hs = self.hashes(4, 1)
        self.assertEqual(m.lookup(hs), 0)
        out = m.prepare_store(hs)
        assert out is not None
        self.assertEqual(out.block_hashes_to_store, hs)
        self.assertEqual(out.store_spec.medium(), "TENSORCAST")
        self.assertEqual(out.block_hashes_evicted, [])
        for i, v in enumerate(out.store_spec.views(worker)):  # the worker writes the blocks in place
            v[:] = pattern(self.BLOCK, 10 + i)  # type: ignore[index]
        self.assertEqual(m.lookup(hs), 0)  # not loadable before complete_store
        m.complete_store(hs)
        self.assertEqual(m.lookup(hs), 4)
        self.assertEqual([(e.block_hashes, e.removed) for e in m.take_events()], [(hs, False)])
        self.assertEqual(list(m.take_events()), [])
        again = m.prepare_store(hs + self.hashes(1, 2))
        assert again is not None
        self.assertEqual(len(again.block_hashes_to_store), 1)  # the stored ones are skipped
        m.complete_store(again.block_hashes_to_store)

        spec = m.prepare_load(hs[:3])
        self.assertEqual(spec.ok, [True] * 3)
        for i, v in enumerate(spec.views(worker)):
            self.assertEqual(bytes(v), pattern(self.BLOCK, 10 + i))  # type: ignore[arg-type]
        key = b"vllm/" + hs[0]
        self.assertEqual(worker.stat(key).pins, 1)  # protected until complete_load
        self.assertEqual(worker.remove([key]), [Status.FAILED_PRECONDITION])
        m.touch(hs)
        m.complete_load(hs[:3])
        self.assertEqual(worker.stat(key).pins, 0)
        m.complete_load(hs[:3])  # nothing more pinned: quiet
        self.assertEqual(worker.stat(key).pins, 0)
        self.assertEqual(m.prepare_load([b"never"]).ok, [False])

        # A store that failed: its reservations are given back at once by
        # an abort (counted by the daemon), with no reconnect.
        lost = self.hashes(2, 3)
        out = m.prepare_store(lost)
        assert out is not None
        owner = m._owner
        self.assertEqual(worker.stats().store["reserved"], 2)
        m.complete_store(lost, success=False)
        self.assertEqual(worker.stats().store["reserved"], 0)
        self.assertEqual(worker.stats().store["aborted"], 2)
        self.assertIs(m._owner, owner)  # the same connection: aborted, not reconnected
        self.assertEqual(m.lookup(lost), 0)
        self.assertEqual(m.abandoned, 0)
        out = m.prepare_store(lost)  # the keys are free again (not BUSY)
        assert out is not None
        self.assertEqual(out.block_hashes_to_store, lost)
        m.complete_store(lost)
        self.assertEqual(m.lookup(lost), 2)

    def test_daemon_killed_and_restarted(self) -> None:
        # DRAM only: what the writeback may have put on L2 before the kill
        # would survive the restart, and the lookup after it would race it.
        d = Daemon(["--store-l2-path", "off"]).start()
        self.addCleanup(d.close)
        lg = logging.getLogger("test.vllm.failures")
        m = vllm.TensorcastOffloadingManager(self.BLOCK, socket=d.socket, retry_interval=0, logger=lg)
        self.addCleanup(m.close)
        hs = self.hashes(3, 4)
        out = m.prepare_store(hs)
        assert out is not None
        m.complete_store(hs)
        spec = m.prepare_load(hs)
        self.assertEqual(spec.ok, [True] * 3)
        d.kill()
        with self.assertLogs(lg, logging.DEBUG) as logs:
            self.assertEqual(m.lookup(hs), 0)
            m.complete_load(hs)  # the pins went with the connection: quiet
            self.assertIsNone(m.prepare_store(self.hashes(1, 5)))
            self.assertEqual(m.prepare_load(hs).ok, [False] * 3)
            m.touch(hs)
            d.start()
            self.assertEqual(m.lookup(hs), 0)  # a new daemon, with nothing kept
            out = m.prepare_store(hs)
            assert out is not None
            self.assertEqual(out.block_hashes_to_store, hs)
            m.complete_store(hs)
        warnings = [r for r in logs.records if r.levelno >= logging.WARNING]
        self.assertEqual(len(warnings), 1, [r.getMessage() for r in warnings])
        self.assertEqual(m.lookup(hs), 3)


if __name__ == "__main__":
    unittest.main()
