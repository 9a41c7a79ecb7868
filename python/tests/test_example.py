"""examples/kv_connector.py, run as a user runs it, against a real daemon."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import unittest

from .daemon import ROOT, Daemon

try:
    import torch  # noqa: F401
except ImportError:  # pragma: no cover - depends on the interpreter
    torch = None  # type: ignore[assignment]


@unittest.skipIf(torch is None, "torch is not installed for this interpreter (Debian: python3-torch)")
class TestKVConnector(unittest.TestCase):
    def run_example(self, socket: str, *args: str) -> str:
        # As a new user runs it: no PYTHONPATH, from another directory; it
        # finds the checkout's package itself.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["TENSORCAST_SOCKET"] = socket
        r = subprocess.run([sys.executable, str(ROOT / "examples" / "kv_connector.py"), *args], env=env,
                           capture_output=True, text=True, timeout=60, cwd=tempfile.gettempdir())
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r.stdout

    def test_save_lookup_load(self) -> None:
        d = Daemon().start()
        self.addCleanup(d.close)
        small = ("--prompt-tokens", "640", "--layers", "2", "--heads", "2", "--head-dim", "64", "--shared", "0.5")
        out = self.run_example(d.socket, *small)
        # 640 tokens of 16: 40 blocks of 2*2*2*64*2*16 bytes (16 KiB), all
        # new; B shares 320 tokens, 20 blocks.
        self.assertIn("request A: 40 blocks of 16 KiB, 40 saved zero-copy, 0 already cached", out)
        self.assertRegex(out, r"request B: 20 of 40 blocks cached \(hit rate 50\.0%, 20 expected\), "
                              r"loaded 0\.3 MiB zero-copy in [0-9.]+ ms: [0-9.]+ GB/s; verified")
        # Again: A's blocks are cached now; nothing saved, the same hits.
        out = self.run_example(d.socket, *small)
        self.assertIn("0 saved zero-copy, 40 already cached", out)
        self.assertIn("hit rate 50.0%", out)

    def test_no_torch(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "torch.py"), "w") as f:
                f.write("raise ImportError('no torch for this interpreter')\n")
            env = dict(os.environ, PYTHONPATH=d)
            r = subprocess.run([sys.executable, str(ROOT / "examples" / "kv_connector.py")], env=env,
                               capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("apt install python3-torch", r.stderr)
        self.assertIn("pip install torch", r.stderr)

    def test_no_daemon(self) -> None:
        env = dict(os.environ, TENSORCAST_SOCKET="/nonexistent/tc.sock", PYTHONPATH=str(ROOT / "python"))
        r = subprocess.run([sys.executable, str(ROOT / "examples" / "kv_connector.py")], env=env,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 1)
        self.assertIn("make run", r.stderr)


if __name__ == "__main__":
    unittest.main()
