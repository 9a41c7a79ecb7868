"""numpy arrays and torch tensors over the pool and client buffers: no copy
between the array and the memory the daemon moves."""

from __future__ import annotations

import unittest

import tensorcast
from tensorcast import Op, Request, Status

from .test_core import DaemonCase, pattern

try:
    import numpy
except ImportError:  # pragma: no cover - depends on the interpreter
    numpy = None  # type: ignore[assignment]
try:
    import torch
except ImportError:  # pragma: no cover
    torch = None  # type: ignore[assignment]


@unittest.skipIf(numpy is None, "numpy is not installed for this interpreter (Debian: python3-numpy)")
class TestNumpy(DaemonCase):
    def test_pool_array_is_the_pool(self) -> None:
        c = self.connect()
        blk = c.alloc_blocks(1, 64 << 10)[0]
        a = c.pool.array(blk, 64 << 10)
        self.assertEqual(a.dtype, numpy.uint8)
        self.assertTrue(a.flags.writeable)
        a[:] = numpy.frombuffer(pattern(64 << 10, 51), dtype=numpy.uint8)
        # The same bytes through the memoryview: one mapping.
        self.assertEqual(bytes(c.pool.view[blk:blk + (64 << 10)]), pattern(64 << 10, 51))
        self.assertEqual(c.locate(a), (c.pool.segment, blk))
        f = c.pool.array(blk, 64 << 10, dtype=numpy.float32)
        self.assertEqual(f.shape, ((64 << 10) // 4,))

    def test_transfer_between_arrays(self) -> None:
        c = self.connect()
        blk = c.alloc_blocks(1, 256 << 10)[0]
        src = c.pool.array(blk, 256 << 10, dtype=numpy.float32)
        src[:] = numpy.arange(src.size, dtype=numpy.float32)
        buf = c.create_buffer(256 << 10)
        dst = buf.array(numpy.float32)
        self.assertTrue(dst.flags.writeable)
        seg, off = c.locate(dst[1024:])
        self.assertEqual((seg, off), (buf.id, 4096))
        r = c.transfer([Request(Op.READ, buf.id, 0, c.pool.segment, blk, 256 << 10)], timeout=5)
        self.assertEqual(r.codes, [Status.OK])
        self.assertTrue(numpy.array_equal(dst, src))
        buf.close()
        self.assertTrue(numpy.array_equal(dst, src))  # the array outlives the registration


@unittest.skipIf(torch is None, "torch is not installed for this interpreter (Debian: python3-torch)")
class TestTorch(DaemonCase):
    def test_tensors_over_buffers_and_pool(self) -> None:
        c = self.connect()
        buf = c.create_buffer(1 << 20)
        t = buf.tensor(torch.float16)
        self.assertEqual(t.numel(), (1 << 20) // 2)
        t.copy_((torch.arange(t.numel()) % 1000).to(torch.float16))
        self.assertEqual(c.locate(t[2048:]), (buf.id, 4096))
        blk = c.alloc_blocks(1, 1 << 20)[0]
        r = c.transfer([Request(Op.WRITE, buf.id, 0, c.pool.segment, blk, 1 << 20)], timeout=5)
        self.assertEqual(r.codes, [Status.OK])
        p = c.pool.tensor(blk, 1 << 20, torch.float16)
        self.assertTrue(torch.equal(p, t))
        # A page-first KV layout: [pages, 2, heads, tokens, dim] viewed in place.
        kv = p.view(8, 2, 4, 64, 128)
        self.assertEqual(c.locate(kv[3]), (c.pool.segment, blk + 3 * (1 << 20) // 8))
        buf.close()


if __name__ == "__main__":
    unittest.main()
