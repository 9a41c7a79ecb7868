"""Puts libtensorcast.so inside the tensorcast package when it is built
(pip install ./python; see pyproject.toml). The library is the one `make
build` made (../c/build/libtensorcast.so), or $TENSORCAST_LIB; without
either the build stops and says so. The wheel is one for this platform, not
a pure-Python one."""

import os
import shutil
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
LIB = "libtensorcast.so"


def library() -> Path:
    env = os.environ.get("TENSORCAST_LIB")
    p = Path(env) if env else HERE.parent / "c" / "build" / LIB
    if not p.is_file():
        raise SystemExit(f"tensorcast: no {p}: run `make build` in the repository first"
                         + (" (or unset TENSORCAST_LIB)" if env else " (or set TENSORCAST_LIB)"))
    return p


class BuildWithLibrary(build_py):
    def run(self) -> None:
        # A package directory left by an earlier build may hold modules
        # since removed: build it afresh.
        shutil.rmtree(Path(self.build_lib) / "tensorcast", ignore_errors=True)
        super().run()
        dst = Path(self.build_lib) / "tensorcast" / LIB
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(library(), dst)
        os.chmod(dst, 0o755)

    def get_outputs(self, include_bytecode: bool = True):  # type: ignore[override]
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib) / "tensorcast" / LIB)]


class PlatformDistribution(Distribution):
    def has_ext_modules(self) -> bool:  # a native library inside: a platform wheel
        return True


setup(cmdclass={"build_py": BuildWithLibrary}, distclass=PlatformDistribution)
