"""Stand-ins of vLLM's KV offloading modules, one tree per interface
generation, written under a directory that a test puts on sys.path.

They are this project's own minimal versions of the classes vLLM's
offloading connector uses (vllm.v1.kv_offload: abstract, mediums, spec,
factory, worker.worker), with the names, signatures and checks of each
generation: what the integration is built on and called through when vLLM
is importable.

- blocks: block hashes, lookup(hashes) -> int; the factory builds
  spec_cls(vllm_config).
- keys: OffloadKey = hash + group index, lookup(key, req_context) ->
  bool | None, PrepareStoreOutput(keys_to_store, store_spec, evicted_keys),
  complete_store(keys, success); spec_cls(vllm_config, kv_cache_config).
- results: LookupResult, on_new_request (abstract) and
  on_request_finished, req_context on every call.
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
from types import ModuleType
from typing import Dict

GENERATIONS = ("blocks", "keys", "results")

_EMPTY = ""

_ABSTRACT_BLOCKS = '''
from abc import ABC, abstractmethod
from dataclasses import dataclass


class LoadStoreSpec(ABC):
    @staticmethod
    @abstractmethod
    def medium() -> str: ...


@dataclass
class PrepareStoreOutput:
    block_hashes_to_store: list
    store_spec: LoadStoreSpec
    block_hashes_evicted: list


@dataclass
class OffloadingEvent:
    block_hashes: list
    block_size: int
    medium: str
    removed: bool


class OffloadingManager(ABC):
    @abstractmethod
    def lookup(self, block_hashes): ...

    @abstractmethod
    def prepare_load(self, block_hashes): ...

    def touch(self, block_hashes):
        return None

    def complete_load(self, block_hashes):
        return None

    @abstractmethod
    def prepare_store(self, block_hashes): ...

    def complete_store(self, block_hashes, success=True):
        return None

    def take_events(self):
        return ()
'''

_ABSTRACT_KEYS = '''
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, NewType

OffloadKey = NewType("OffloadKey", bytes)


def make_offload_key(block_hash: bytes, group_idx: int) -> OffloadKey:
    return OffloadKey(block_hash + group_idx.to_bytes(4, "big"))


@dataclass
class ReqContext:
    kv_transfer_params: Any = None


class LoadStoreSpec(ABC):
    @staticmethod
    @abstractmethod
    def medium() -> str: ...


@dataclass
class PrepareStoreOutput:
    keys_to_store: list
    store_spec: LoadStoreSpec
    evicted_keys: list


@dataclass
class OffloadingEvent:
    keys: list
    medium: str
    removed: bool


class OffloadingManager(ABC):
    @abstractmethod
    def lookup(self, key, req_context): ...

    @abstractmethod
    def prepare_load(self, keys, req_context): ...

    def touch(self, keys):
        return None

    def complete_load(self, keys):
        return None

    @abstractmethod
    def prepare_store(self, keys, req_context): ...

    def complete_store(self, keys, success=True):
        return None

    def take_events(self):
        return ()

    def shutdown(self):
        return None
'''

_ABSTRACT_RESULTS = '''
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any, NewType

OffloadKey = NewType("OffloadKey", bytes)


def make_offload_key(block_hash: bytes, group_idx: int) -> OffloadKey:
    return OffloadKey(block_hash + group_idx.to_bytes(4, "big"))


@dataclass
class ReqContext:
    req_id: str
    kv_transfer_params: Any = None


class LookupResult(Enum):
    MISS = auto()
    HIT = auto()
    HIT_PENDING = auto()
    RETRY = auto()


class OffloadPolicy(Enum):
    CHUNK_LEVEL = "chunk_level"
    REQUEST_LEVEL = "request_level"


@dataclass
class RequestOffloadingContext:
    policy: OffloadPolicy = OffloadPolicy.CHUNK_LEVEL


class LoadStoreSpec(ABC):
    @staticmethod
    @abstractmethod
    def medium() -> str: ...


@dataclass
class PrepareStoreOutput:
    keys_to_store: list
    store_spec: LoadStoreSpec
    evicted_keys: list


@dataclass
class OffloadingEvent:
    keys: list
    medium: str
    removed: bool


class OffloadingManager(ABC):
    @abstractmethod
    def lookup(self, key, req_context) -> LookupResult: ...

    @abstractmethod
    def prepare_load(self, keys, req_context): ...

    def touch(self, keys, req_context):
        return None

    def complete_load(self, keys, req_context):
        return None

    @abstractmethod
    def prepare_store(self, keys, req_context): ...

    def complete_store(self, keys, req_context, success=True):
        return None

    @abstractmethod
    def on_new_request(self, req_context) -> RequestOffloadingContext: ...

    def on_request_finished(self, req_context):
        return None

    def take_events(self):
        return ()

    def shutdown(self):
        return None
'''

_MEDIUMS = '''
from abc import ABC

import numpy as np

from vllm.v1.kv_offload.abstract import LoadStoreSpec


class BlockIDsLoadStoreSpec(LoadStoreSpec, ABC):
    def __init__(self, block_ids):
        self.block_ids = np.array(block_ids, dtype=np.int64)


class GPULoadStoreSpec(BlockIDsLoadStoreSpec):
    def __init__(self, block_ids, group_sizes=None, block_indices=None):
        super().__init__(block_ids)
        self.group_sizes = group_sizes
        self.block_indices = block_indices

    @staticmethod
    def medium():
        return "GPU"
'''

_SPEC = '''
from abc import ABC, abstractmethod

TAKES_KV_CACHE_CONFIG = {kv}


class OffloadingSpec(ABC):
    def __init__(self, vllm_config, *rest):
        assert len(rest) == (1 if TAKES_KV_CACHE_CONFIG else 0), rest
        self.vllm_config = vllm_config
        self.kv_cache_config = rest[0] if rest else None
        self.extra_config = vllm_config.kv_transfer_config.kv_connector_extra_config

    @abstractmethod
    def get_manager(self): ...

    @abstractmethod
    def get_handlers(self, kv_caches, *rest): ...
'''

_FACTORY = '''
import importlib

from vllm.v1.kv_offload.spec import TAKES_KV_CACHE_CONFIG, OffloadingSpec


class OffloadingSpecFactory:
    _registry = {{}}

    @classmethod
    def create_spec(cls, config, *rest):
        extra = config.kv_transfer_config.kv_connector_extra_config
        name = extra.get("spec_name", "CPUOffloadingSpec")
        if name in cls._registry:
            spec_cls = cls._registry[name]()
        else:
            path = extra.get("spec_module_path")
            if path is None:
                raise ValueError(f"Unsupported spec type: {{name}}")
            spec_cls = getattr(importlib.import_module(path), name)
        assert issubclass(spec_cls, OffloadingSpec)
        return spec_cls(config, *rest) if TAKES_KV_CACHE_CONFIG else spec_cls(config)
'''

_WORKER = '''
from abc import ABC, abstractmethod
from dataclasses import dataclass

HAS_RESULTS = {results}


@dataclass
class TransferResult:
    job_id: int
    success: bool
    transfer_size: int | None = None
    transfer_time: float | None = None
    transfer_type: tuple | None = None


if not HAS_RESULTS:
    del TransferResult


class OffloadingHandler(ABC):
    @abstractmethod
    def transfer_async(self, job_id, spec): ...

    @abstractmethod
    def get_finished(self): ...

    def wait(self, job_ids):
        return None


class OffloadingWorker:
    def __init__(self):
        self.handlers = set()
        self.by_type = {{}}

    def register_handler(self, src_cls, dst_cls, handler):
        t = (src_cls.medium(), dst_cls.medium())
        assert t not in self.by_type
        self.handlers.add(handler)
        self.by_type[t] = handler

    def transfer_async(self, job_id, spec):
        src, dst = spec
        return self.by_type[(src.medium(), dst.medium())].transfer_async(job_id, spec)

    def get_finished(self):
        out = []
        for h in self.handlers:
            out.extend(h.get_finished())
        return out

    def wait(self, job_ids):
        for h in self.handlers:
            h.wait(job_ids)
'''


def write(generation: str) -> str:
    """A new directory holding the stand-in ``vllm`` package of generation."""
    abstract = {"blocks": _ABSTRACT_BLOCKS, "keys": _ABSTRACT_KEYS, "results": _ABSTRACT_RESULTS}[generation]
    later = generation != "blocks"
    files: Dict[str, str] = {
        "vllm/__init__.py": _EMPTY,
        "vllm/v1/__init__.py": _EMPTY,
        "vllm/v1/kv_offload/__init__.py": _EMPTY,
        "vllm/v1/kv_offload/abstract.py": abstract,
        "vllm/v1/kv_offload/mediums.py": _MEDIUMS,
        "vllm/v1/kv_offload/spec.py": _SPEC.format(kv=later),
        "vllm/v1/kv_offload/factory.py": _FACTORY.format(),
        "vllm/v1/kv_offload/worker/__init__.py": _EMPTY,
        "vllm/v1/kv_offload/worker/worker.py": _WORKER.format(results=later),
    }
    root = tempfile.mkdtemp(prefix=f"tc-vllm-{generation}-")
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    return root


_OURS = ("tensorcast.integrations.vllm", "tensorcast.integrations.vllm_worker")


def _forget() -> None:
    for name in list(sys.modules):
        if name == "vllm" or name.startswith("vllm.") or name in _OURS:
            del sys.modules[name]
    importlib.invalidate_caches()


def load(root: str) -> ModuleType:
    """Imports tensorcast.integrations.vllm anew with root's vllm first on
    sys.path (None: with no vllm at all)."""
    _forget()
    if root is not None:
        sys.path.insert(0, root)
    return importlib.import_module("tensorcast.integrations.vllm")


def unload(root: str) -> None:
    """Undoes load: the next import of the integration sees no stand-in."""
    if root is not None and root in sys.path:
        sys.path.remove(root)
    _forget()
