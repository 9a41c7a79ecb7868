"""`pip install ./python` into a fresh virtual environment, offline, with the
interpreter's own setuptools and wheel; then the core tests against the
installed package, from outside the source tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from .daemon import ROOT, daemon_binary, provides


def build_tools() -> str:
    """What this interpreter lacks to build the package offline ("" when
    nothing)."""
    missing = []
    for mod in ("venv", "ensurepip", "setuptools", "wheel"):
        r = subprocess.run([sys.executable, "-c", f"import {mod}"], capture_output=True)
        if r.returncode:
            missing.append(mod)
    return ", ".join(missing)


MISSING = build_tools()
if MISSING and provides("tools"):
    # CI promised the tools (make deps installs them): a skip would hide the test.
    raise RuntimeError(f"TENSORCAST_TEST_PROVIDES has tools but this interpreter lacks {MISSING}")


@unittest.skipIf(MISSING, f"this interpreter lacks {MISSING} to build the package offline "
                          "(Debian: python3-venv python3-setuptools python3-wheel)")
class TestInstall(unittest.TestCase):
    def test_pip_install_then_the_core_tests(self) -> None:
        lib = ROOT / "c" / "build" / "libtensorcast.so"
        self.assertTrue(lib.is_file(), f"no {lib}: run `make build`")
        d = tempfile.mkdtemp(prefix="tc-install-")
        self.addCleanup(shutil.rmtree, d, True)
        venv = os.path.join(d, "venv")
        py = os.path.join(venv, "bin", "python")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TENSORCAST_LIB")}

        def run(*cmd: str, cwd: str = d) -> str:
            r = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
            self.assertEqual(r.returncode, 0, f"{' '.join(cmd)}:\n{r.stdout}\n{r.stderr}")
            return r.stdout

        # Debian's pip, setuptools and wheel come through the system site
        # packages; nothing is fetched.
        run(sys.executable, "-m", "venv", "--system-site-packages", venv)
        run(py, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-index", str(ROOT / "python"))

        # Outside the source tree the installed package loads the library
        # inside it.
        where = run(py, "-c", "import tensorcast; print(tensorcast.__file__); print(tensorcast.library_path)")
        pkg, loaded = where.split()
        self.assertTrue(pkg.startswith(venv), pkg)
        self.assertEqual(loaded, os.path.join(os.path.dirname(pkg), "libtensorcast.so"))

        # The core tests, copied out of the tree so that `tensorcast` can
        # only be the installed one.
        shutil.copytree(ROOT / "python" / "tests", os.path.join(d, "tests"),
                        ignore=shutil.ignore_patterns("__pycache__", "standin"))
        env["TENSORCASTD"] = daemon_binary()
        env["TENSORCAST_SOURCE"] = str(ROOT)  # for the C header the layout test compiles against
        out = subprocess.run([py, "-m", "unittest", "tests.test_core", "tests.test_queue", "tests.test_store"],
                             env=env, cwd=d, capture_output=True, text=True, timeout=600)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertRegex(out.stderr, r"Ran \d+ tests")


if __name__ == "__main__":
    unittest.main()
