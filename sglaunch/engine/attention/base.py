"""What every attention backend receives: ragged per-step metadata over the paged KV pool.

The batch is ragged: request b contributes query_lens[b] new tokens (a prefill chunk, one decode
token, or a speculative verify window) and attends to kv_lens[b] tokens, the last
query_lens[b] of which are its own new tokens. Indptr arrays follow FlashInfer's conventions
so a FlashInfer backend can take them as they are.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from array import array
from dataclasses import dataclass

import numpy as np
import torch

from sglaunch.engine.kv_pool import KVPool
from sglaunch.engine.step import StepInput
from sglaunch.engine.transfer import to_device


def flat_pages(tables) -> np.ndarray:
    """The tables back to back as one int32 numpy array (host). The engine's tables are int32
    arrays (Req.pages and its slices): one join of their buffers, a memcpy (64 tables of 150-400
    pages: about 0.02 ms on the dev CPU). Lists go through numpy's fromiter (0.5 ms; array.extend
    per table 1.6 ms, torch.tensor over a flattened list 2.2 ms)."""
    if all(isinstance(t, array) and t.typecode == "i" for t in tables):
        return np.frombuffer(bytearray(b"".join(tables)), dtype=np.int32)
    total = sum(map(len, tables))
    return np.fromiter(itertools.chain.from_iterable(tables), dtype=np.int32, count=total)


def indptr(lengths, dtype=np.int64) -> np.ndarray:
    """[0, running sums of lengths...] on the host (one numpy op, no small torch operators)."""
    out = np.zeros(len(lengths) + 1, dtype=dtype)
    np.cumsum(lengths, dtype=dtype, out=out[1:])
    return out


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
        """An eager step's metadata, laid out by numpy on the host and moved to `device` with one
        copy (transfer.to_device: one pinned buffer and one non-blocking copy on CUDA, none on a
        CPU). NOTE: built from torch.tensor over lists with one .to() per field, a step admitting
        64 prompts of 64 tokens took 0.87 ms on the dev CPU against 0.18 now
        (benchmarks/ragged_metadata_cost.py), the H200's host several times that, and each pageable
        .to() made the host wait for the device."""
        query_lens = np.asarray(step.query_lens, dtype=np.int64)
        kv_lens = np.asarray(step.kv_lens, dtype=np.int64)
        counts = np.fromiter(map(len, step.page_tables), dtype=np.int64, count=len(step.page_tables))
        page_indptr = indptr(counts)
        page_indices = flat_pages(step.page_tables).astype(np.int64)
        positions = np.asarray(step.positions, dtype=np.int64)
        owner = np.repeat(np.arange(len(query_lens)), query_lens)  # [num_tokens]
        out_slots = page_indices[page_indptr[owner] + positions // page_size] * page_size + positions % page_size
        fields = (query_lens, kv_lens, indptr(query_lens), page_indptr, page_indices,
                  (kv_lens - 1) % page_size + 1, positions, out_slots)
        moved = to_device([torch.from_numpy(a) for a in fields], device)
        return cls(*moved, max_query_len=int(query_lens.max()), max_kv_len=int(kv_lens.max()))


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
