"""numpy arrays and torch tensors over the pool and client buffers: no copy
between the array and the memory the daemon moves."""

from __future__ import annotations

import unittest
import warnings

import tensorcast
from tensorcast import Error, Op, Request, Status

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

    def test_store_with_arrays(self) -> None:
        c = self.connect()
        a = numpy.arange(1024, dtype=numpy.float32)
        ro = a.copy()
        ro.flags.writeable = False
        self.assertEqual(c.put([b"np/0", b"np/1"], [a, ro]), [Status.OK, Status.OK])
        outs = [numpy.zeros(1024, numpy.float32), numpy.zeros(2048, numpy.float32)]
        r = c.get([b"np/1", b"np/0"], outs)
        self.assertEqual(r, [Status.OK, Status.OK])
        self.assertEqual(r.lengths, [4096, 4096])
        self.assertTrue(numpy.array_equal(outs[0], a))
        self.assertTrue(numpy.array_equal(outs[1][:1024], a))
        with c.get_pinned([b"np/0"]) as views:
            arr = numpy.frombuffer(views[0], dtype=numpy.float32)  # type: ignore[arg-type]
            self.assertTrue(numpy.array_equal(arr, a))  # read in place
        self.assertEqual(c.stat(b"np/0").pins, 0)

    def test_strided_values_are_refused(self) -> None:
        c = self.connect()
        a = numpy.arange(64, dtype=numpy.uint8)
        with self.assertRaises(Error) as e:
            c.put([b"np/strided"], [a[::2]])
        self.assertEqual(e.exception.code, Status.INVALID_ARGUMENT)
        with self.assertRaises(Error) as e:
            c.get([b"np/strided"], [a[::2]])
        self.assertEqual(e.exception.code, Status.INVALID_ARGUMENT)
        self.assertEqual(c.exists([b"np/strided"]), [False])


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

    def test_store_with_tensors(self) -> None:
        c = self.connect()
        pages = torch.randn(4, 2, 8, 16, 64).to(torch.bfloat16)  # page-first KV
        keys = [f"t/{i}".encode() for i in range(4)]
        self.assertEqual(c.put(keys[:2], [pages[0], pages[1]]), [Status.OK, Status.OK])
        # Zero copy: the pages written straight into reserved pool blocks.
        n = pages[2].numel() * pages[2].element_size()
        r = c.reserve(keys[2:], n)
        self.assertEqual(r.codes, [Status.OK, Status.OK])
        for i, v in enumerate(r.views):
            torch.frombuffer(v, dtype=torch.bfloat16).copy_(pages[2 + i].flatten())  # type: ignore[arg-type]
        self.assertEqual(r.commit(), [Status.OK, Status.OK])
        out = torch.empty_like(pages)
        self.assertEqual(c.get(keys, list(out)), [Status.OK] * 4)
        self.assertTrue(torch.equal(out, pages))
        with c.get_pinned(keys) as views, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns that the buffer is read-only
            for i, v in enumerate(views):
                t = torch.frombuffer(v, dtype=torch.bfloat16).view(pages[i].shape)  # type: ignore[arg-type]
                self.assertTrue(torch.equal(t, pages[i]))
                del t
        with self.assertRaises(Error) as e:
            c.put([b"t/strided"], [pages[:, 0]])
        self.assertEqual(e.exception.code, Status.INVALID_ARGUMENT)


if __name__ == "__main__":
    unittest.main()
