"""Stand-ins of vLLM's KV offloading modules, one tree per interface
generation, written under a directory that a test puts on sys.path.

They are this project's own minimal versions of the classes vLLM's
offloading connector uses, with the module layout, names, signatures and
checks of each generation: what the integration is built on and called
through when vLLM is importable.

- blocks (vLLM 0.11-0.13): abstract, spec, mediums, factory, worker.worker;
  block hashes, lookup(hashes) -> int; the factory builds
  spec_cls(vllm_config); handlers report (job_id, success) pairs.
- keys (0.23-0.24): base holds the classes, worker.worker the handlers;
  OffloadKey = hash + group index, lookup(key, req_context) -> bool | None,
  on_new_request, PrepareStoreOutput(keys_to_store, store_spec,
  evicted_keys), complete_store(keys, success);
  spec_cls(vllm_config, kv_cache_config), get_handlers(canonical KV caches).
- results (0.26 on): base and config; LookupResult, req_context on every
  call, events by vLLM's Medium; spec_cls(offloading_config) and
  get_worker(canonical KV caches) with submit_store / submit_load.
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

# Pieces the later generations share, put together below.
_KEYS = '''
OffloadKey = NewType("OffloadKey", bytes)


def make_offload_key(block_hash: bytes, group_idx: int) -> OffloadKey:
    return OffloadKey(block_hash + group_idx.to_bytes(4, "big"))
'''

_STORE_OUTPUT = '''

@dataclass
class PrepareStoreOutput:
    keys_to_store: list
    store_spec: LoadStoreSpec
    evicted_keys: list
'''

_REQUEST_HOOKS = '''
    @abstractmethod
    def on_new_request(self, req_context): ...

    def on_request_finished(self, req_context):
        return None

    def take_events(self):
        return ()

    def shutdown(self):
        return None
'''

_GPU_SPEC = '''

class GPULoadStoreSpec(LoadStoreSpec):
    def __init__(self, block_ids, group_sizes, block_indices):
        assert sum(group_sizes) == len(block_ids) and len(block_indices) == len(group_sizes)
        self.block_ids = np.array(block_ids, dtype=np.int64)
        self.group_sizes = group_sizes
        self.block_indices = block_indices
{medium}

@dataclass
class CanonicalKVCacheTensor:
    tensor: Any
    page_size_bytes: int


@dataclass
class CanonicalKVCaches:
    tensors: list
    group_data_refs: list
'''

_TRANSFER_RESULT = '''

@dataclass
class TransferResult:
    job_id: int
    success: bool
    transfer_size: int | None = None
    transfer_time: float | None = None
'''

_POLICY = '''

class OffloadPolicy(Enum):
    {unit}_LEVEL = "{low}_level"
    REQUEST_LEVEL = "request_level"


@dataclass
class RequestOffloadingContext:
    policy: OffloadPolicy = OffloadPolicy.{unit}_LEVEL
'''

_IMPORTS = '''
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any, NewType

import numpy as np
'''

_BASE_KEYS = _IMPORTS + _KEYS + '''

@dataclass
class ReqContext:
    req_id: str
    kv_transfer_params: Any = None

''' + _POLICY.format(unit="BLOCK", low="block") + '''

class LoadStoreSpec(ABC):
    @staticmethod
    @abstractmethod
    def medium() -> str: ...
''' + _STORE_OUTPUT + '''

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
''' + _REQUEST_HOOKS + _GPU_SPEC.format(medium='''
    @staticmethod
    def medium():
        return "GPU"
''') + '''

class OffloadingSpec(ABC):
    def __init__(self, vllm_config, kv_cache_config):
        self.vllm_config = vllm_config
        self.kv_cache_config = kv_cache_config
        self.extra_config = vllm_config.kv_transfer_config.kv_connector_extra_config

    @abstractmethod
    def get_manager(self): ...

    @abstractmethod
    def get_handlers(self, kv_caches): ...
'''

_BASE_RESULTS = _IMPORTS + _KEYS + '''

class Medium(Enum):
    CPU = "CPU"
    STORAGE = "STORAGE"


@dataclass
class ReqContext:
    req_id: str
    kv_transfer_params: Any = None
    _state: dict = field(default_factory=dict, repr=False, init=False)


class LookupResult(Enum):
    MISS = auto()
    HIT = auto()
    HIT_PENDING = auto()
    RETRY = auto()

''' + _POLICY.format(unit="CHUNK", low="chunk") + '''

class LoadStoreSpec:
    pass
''' + _STORE_OUTPUT + '''

@dataclass
class OffloadingEvent:
    keys: list
    medium: Medium
    removed: bool
    locality: Any = None


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
''' + _REQUEST_HOOKS + _GPU_SPEC.format(medium="") + _TRANSFER_RESULT + '''

class OffloadingWorker(ABC):
    @abstractmethod
    def submit_store(self, job_id, src_spec, dst_spec) -> bool: ...

    @abstractmethod
    def submit_load(self, job_id, src_spec, dst_spec) -> bool: ...

    @abstractmethod
    def get_finished(self): ...

    @abstractmethod
    def wait(self, job_ids): ...

    def shutdown(self):
        return None


class OffloadingSpec(ABC):
    def __init__(self, config):
        assert hasattr(config, "worker_kv_bytes_per_block"), config
        self.config = config
        self.extra_config = config.extra_config

    @abstractmethod
    def get_manager(self): ...

    @abstractmethod
    def get_worker(self, kv_caches): ...
'''

_CONFIG = '''
from dataclasses import field, make_dataclass


def _frozen(name, *fields):
    return make_dataclass(name, fields, frozen=True)


OffloadingGroupConfig = _frozen("OffloadingGroupConfig", "tokens_per_block", "layer_names")
OffloadingModelConfig = _frozen("OffloadingModelConfig", "name", "dtype")
OffloadingCacheConfig = _frozen("OffloadingCacheConfig", "tokens_per_hash", "blocks_per_chunk")
OffloadingParallelConfig = _frozen("OffloadingParallelConfig", "rank", "world_size", "tp_size", "pp_size",
                                   "pcp_size", "dcp_size", "data_parallel_index", "is_parallelism_agnostic")
OffloadingConfig = make_dataclass("OffloadingConfig", [
    "groups", "worker_kv_bytes_per_block", "enable_kv_cache_events", "extra_config", "engine_id", "model", "cache",
    "parallel", ("replicated_layout", bool, field(default=False))], frozen=True)
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

from vllm.v1.kv_offload.{spec_module} import OffloadingSpec


class OffloadingSpecFactory:
    _registry = {{}}

    @classmethod
    def create_spec(cls, *config):
        extra = config[0].{extra}
        name = extra.get("spec_name", "CPUOffloadingSpec")
        if name in cls._registry:
            spec_cls = cls._registry[name]()
        else:
            path = extra.get("spec_module_path")
            if path is None:
                raise ValueError(f"Unsupported spec type: {{name}}")
            spec_cls = getattr(importlib.import_module(path), name)
        assert issubclass(spec_cls, OffloadingSpec)
        return spec_cls(*config)
'''

_WORKER = '''
from abc import ABC, abstractmethod
from dataclasses import dataclass

HAS_RESULTS = {results}
''' + _TRANSFER_RESULT + '''    transfer_type: tuple | None = None


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
    files: Dict[str, str] = {
        "vllm/__init__.py": _EMPTY,
        "vllm/v1/__init__.py": _EMPTY,
        "vllm/v1/kv_offload/__init__.py": _EMPTY,
    }
    kv = "vllm/v1/kv_offload/"
    if generation == "blocks":  # 0.11-0.13: split modules, spec_cls(vllm_config), (job_id, ok) results
        files[kv + "abstract.py"] = _ABSTRACT_BLOCKS
        files[kv + "mediums.py"] = _MEDIUMS
        files[kv + "spec.py"] = _SPEC.format(kv=False)
        files[kv + "factory.py"] = _FACTORY.format(spec_module="spec", extra="kv_transfer_config."
                                                   "kv_connector_extra_config")
        files[kv + "worker/__init__.py"] = _EMPTY
        files[kv + "worker/worker.py"] = _WORKER.format(results=False)
    elif generation == "keys":  # 0.23-0.24: base, bool | None, on_new_request, handlers
        files[kv + "base.py"] = _BASE_KEYS
        files[kv + "factory.py"] = _FACTORY.format(spec_module="base", extra="kv_transfer_config."
                                                   "kv_connector_extra_config")
        files[kv + "worker/__init__.py"] = _EMPTY
        files[kv + "worker/worker.py"] = _WORKER.format(results=True).replace(
            "vllm.v1.kv_offload.abstract", "vllm.v1.kv_offload.base")
    else:  # 0.26 on: base, LookupResult, OffloadingConfig, one worker per spec
        files[kv + "base.py"] = _BASE_RESULTS
        files[kv + "config.py"] = _CONFIG
        files[kv + "factory.py"] = _FACTORY.format(spec_module="base", extra="extra_config")
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
