"""Doubles of SGLang's host KV pools and storage config (page-first torch
tensors), shared by the integration tests and python/bench/store.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from .test_core import pattern


@dataclass
class StorageConfig:
    """A double of SGLang's HiCacheStorageConfig."""

    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    is_mla_model: bool = False
    is_page_first_layout: bool = True
    model_name: Optional[str] = "test/model"
    extra_config: Optional[dict] = field(default_factory=dict)


class MHAHostPool:
    """A double of SGLang's MHA host pool in its page_first layout:
    kv_buffer is (2, tokens, layers, heads, head_dim), K then V; a page's K
    (and its V) is page_size consecutive tokens, contiguous."""

    layout = "page_first"

    def __init__(self, pages: int = 16, page_size: int = 4, layers: int = 2, heads: int = 2, head_dim: int = 64,
                 allocator: Any = None) -> None:
        self.page_size, self.size = page_size, pages * page_size
        self.layers, self.heads, self.head_dim = layers, heads, head_dim
        self.dtype = torch.bfloat16
        dims = (2, self.size, layers, heads, head_dim)
        self.allocator = allocator
        self.kv_buffer = allocator.allocate(dims, self.dtype, "cpu") if allocator else torch.zeros(dims, dtype=self.dtype)

    def per_token(self) -> int:
        return self.layers * self.heads * self.head_dim * 2

    def get_page_buffer_meta(self, indices: Any) -> Any:
        base, tok = self.kv_buffer.data_ptr(), self.per_token()
        v_off = self.size * tok
        ptrs = []
        for first in indices.tolist()[::self.page_size]:
            ptrs += [base + first * tok, base + first * tok + v_off]
        return ptrs, [self.page_size * tok] * len(ptrs)

    def fill(self, slot: int, seed: int) -> None:
        flat = self.kv_buffer.view(torch.uint8).view(2, -1)
        n = self.page_size * self.per_token()
        for kv in range(2):
            flat[kv, slot * n:(slot + 1) * n] = torch.frombuffer(bytearray(pattern(n, seed * 2 + kv)), dtype=torch.uint8)

    def page(self, slot: int) -> bytes:
        flat = self.kv_buffer.view(torch.uint8).view(2, -1)
        n = self.page_size * self.per_token()
        return bytes(flat[0, slot * n:(slot + 1) * n].numpy()) + bytes(flat[1, slot * n:(slot + 1) * n].numpy())

    def indices(self, first_slot: int, pages: int) -> Any:
        return torch.arange(first_slot * self.page_size, (first_slot + pages) * self.page_size, dtype=torch.int64)


class MLAHostPool(MHAHostPool):
    """An MLA host pool double: (tokens, layers, 1, dim), one object per page."""

    def __init__(self, pages: int = 16, page_size: int = 4, allocator: Any = None) -> None:
        self.page_size, self.size = page_size, pages * page_size
        self.layers, self.heads, self.head_dim = 2, 1, 96
        self.dtype = torch.bfloat16
        dims = (self.size, 2, 1, 96)
        self.allocator = allocator
        self.kv_buffer = allocator.allocate(dims, self.dtype, "cpu") if allocator else torch.zeros(dims, dtype=self.dtype)

    def get_page_buffer_meta(self, indices: Any) -> Any:
        base, tok = self.kv_buffer.data_ptr(), self.per_token()
        ptrs = [base + first * tok for first in indices.tolist()[::self.page_size]]
        return ptrs, self.page_size * tok  # one size for all, as some pools answer

    def fill(self, slot: int, seed: int) -> None:
        flat = self.kv_buffer.view(torch.uint8).view(-1)
        n = self.page_size * self.per_token()
        flat[slot * n:(slot + 1) * n] = torch.frombuffer(bytearray(pattern(n, seed)), dtype=torch.uint8)

    def page(self, slot: int) -> bytes:
        flat = self.kv_buffer.view(torch.uint8).view(-1)
        n = self.page_size * self.per_token()
        return bytes(flat[slot * n:(slot + 1) * n].numpy())
