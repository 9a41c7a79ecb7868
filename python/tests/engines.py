"""What the engine integrations' tests share: chained page hashes as the
engines make them, and loggers that keep the expected warnings quiet."""

from __future__ import annotations

import hashlib
import logging
from typing import List


def chain(n: int, seed: int = 0) -> List[str]:
    """n chained page keys as SGLang makes them: sha256 of the previous
    hash and the page's token ids, in hex."""
    out, prev = [], b""
    for i in range(n):
        h = hashlib.sha256(prev)
        for t in range(4):
            h.update((seed * 1000 + i * 4 + t).to_bytes(4, "little"))
        prev = h.digest()
        out.append(h.hexdigest())
    return out


def quiet_logger(name: str) -> logging.Logger:
    lg = logging.getLogger(name)
    lg.propagate = False
    if not lg.handlers:
        lg.addHandler(logging.NullHandler())
    return lg
