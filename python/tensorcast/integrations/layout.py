"""Layout fingerprints: a KV page is a hit only under the layout it was written with.

A KV page's bytes mean something only for one model, dtype, page size, KV layout, head count and
rank split. An engine restarted with another of these (a new tensor-parallel size, fp8 instead of
bf16, another page size) reads the same prefix hashes and would get pages laid out for the old
one: silent corruption, not an error. Every integration therefore derives a fingerprint from the
fields that decide the layout and binds its keys to it, so a page written under one layout can
never be found under another.

    fp = fingerprint(model="llama-3-8b", dtype="bfloat16", page_size=64, kv_layout="page_first",
                     num_heads=8, head_dim=128, num_layers=32, tp_rank=0, tp_size=2)
    key = bind(fp, "prefix-hash")

Fields are named by the caller; the fingerprint is a hash of all of them, sorted by name, so two
integrations that pass the same fields agree and adding a field changes every key (a new layout
rule is a new key space, never a reinterpretation of old pages).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict

__all__ = ["fingerprint", "bind", "FINGERPRINT_LEN"]

#: Hex characters of a fingerprint: 64 bits, enough that two layouts in one fleet never collide.
FINGERPRINT_LEN = 16

_SCALARS = (str, int, float, bool, type(None))


def _canonical(fields: Dict[str, Any]) -> bytes:
    for name, value in fields.items():
        if not isinstance(value, _SCALARS):
            # A dtype object, a torch.Size: ask for a plain value so that the text of a repr
            # (which may differ between library versions) never decides the key space.
            raise TypeError(f"layout field {name!r} must be str, int, float, bool or None, "
                            f"not {type(value).__name__}")
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def fingerprint(**fields: Any) -> str:
    """The layout fingerprint of the named fields: FINGERPRINT_LEN hex characters.

    Raises ValueError when no field is given and TypeError for a field that is not a plain
    scalar."""
    if not fields:
        raise ValueError("a layout fingerprint needs at least one field")
    return hashlib.blake2b(_canonical(fields), digest_size=FINGERPRINT_LEN // 2).hexdigest()


def bind(fp: str, key: str) -> str:
    """The store key of ``key`` under layout ``fp``."""
    if len(fp) != FINGERPRINT_LEN:
        raise ValueError(f"not a layout fingerprint: {fp!r}")
    return f"{fp}:{key}"
