"""What every attention backend receives: ragged per-step metadata over the paged KV pool.

The batch is ragged: request b contributes query_lens[b] new tokens (a prefill chunk, one decode
token, or a speculative verify window) and attends to kv_lens[b] tokens, the last
query_lens[b] of which are its own new tokens. Indptr arrays follow FlashInfer's conventions
so a FlashInfer backend can take them as they are.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from sglaunch.engine.kv_pool import KVPool
from sglaunch.engine.step import StepInput


def _indptr(lengths: list[int], device: torch.device) -> torch.Tensor:
    out = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    out[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    return out.to(device)


@dataclass
class RaggedMetadata:
    query_lens: torch.Tensor  # [batch]
    kv_lens: torch.Tensor  # [batch]
    qo_indptr: torch.Tensor  # [batch + 1], query tokens of request b: qo_indptr[b]:qo_indptr[b+1]
    page_indptr: torch.Tensor  # [batch + 1], pages of request b in page_indices
    page_indices: torch.Tensor  # [total_pages], page ids, request after request
    last_page_len: torch.Tensor  # [batch], valid slots in each request's last page
    positions: torch.Tensor  # [num_tokens]
    out_slots: torch.Tensor  # [num_tokens], pool row receiving each new token's K/V
    max_query_len: int
    max_kv_len: int

    @classmethod
    def from_step(cls, step: StepInput, page_size: int, device: torch.device) -> RaggedMetadata:
        query_lens = torch.tensor(step.query_lens, dtype=torch.int64)
        kv_lens = torch.tensor(step.kv_lens, dtype=torch.int64)
        page_indptr = _indptr([len(t) for t in step.page_tables], torch.device("cpu"))
        page_indices = torch.tensor([p for table in step.page_tables for p in table], dtype=torch.int64)
        positions = torch.tensor(step.positions, dtype=torch.int64)
        owner = torch.repeat_interleave(torch.arange(len(step.query_lens)), query_lens)  # [num_tokens]
        out_pages = page_indices[page_indptr[owner] + positions // page_size]
        out_slots = out_pages * page_size + positions % page_size
        return cls(
            query_lens=query_lens.to(device),
            kv_lens=kv_lens.to(device),
            qo_indptr=_indptr(step.query_lens, device),
            page_indptr=page_indptr.to(device),
            page_indices=page_indices.to(device),
            last_page_len=((kv_lens - 1) % page_size + 1).to(device),
            positions=positions.to(device),
            out_slots=out_slots.to(device),
            max_query_len=max(step.query_lens),
            max_kv_len=max(step.kv_lens),
        )


class AttentionBackend(ABC):
    """Writes each layer's new K/V into the pool and attends over the request's context."""

    # Whether cuda_graph.py can capture this backend (its per-step metadata lives in fixed buffers).
    supports_cuda_graph = False

    def __init__(self, kv_pool: KVPool, num_heads: int, num_kv_heads: int, head_dim: int, device: torch.device):
        self.kv_pool = kv_pool
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim**-0.5
        self.device = device
        self.meta: RaggedMetadata | None = None

    def set_query_dtype(self, dtype: torch.dtype) -> None:
        """The model's activation dtype (backends that plan per dtype need it before prepare)."""

    def prepare(self, step: StepInput) -> RaggedMetadata:
        """Build this step's metadata once; every layer reuses it."""
        self.meta = RaggedMetadata.from_step(step, self.kv_pool.page_size, self.device)
        return self.meta

    def kv_destination(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(K rows, V rows, this step's slots) of `layer`: where forward() writes the new K/V, for
        a kernel that writes them itself (then forward() gets k = v = None)."""
        return self.kv_pool.k[layer], self.kv_pool.v[layer], self.meta.out_slots

    @abstractmethod
    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None) -> torch.Tensor:
        """q: [num_tokens, heads, head_dim], k/v: [num_tokens, kv_heads, head_dim] (None: already
        written to kv_destination(layer)) -> [num_tokens, heads, head_dim]."""
