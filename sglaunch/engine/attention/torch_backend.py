"""Attention in plain torch (CPU and GPU): pad the ragged batch, one SDPA call per layer.

Per step, prepare() turns the ragged metadata into padded gather indices and a mask:
request b's queries sit at rows [0, query_lens[b]) of a [batch, max_q] grid and its context
at [0, kv_lens[b]) of a [batch, max_kv] grid. Query i of request b is at absolute position
kv_lens[b] - query_lens[b] + i and sees keys j <= that position (causal within the chunk, all
of the cached prefix).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sglaunch.engine.attention.base import AttentionBackend, RaggedMetadata
from sglaunch.engine.step import StepInput


class TorchAttentionBackend(AttentionBackend):
    def prepare(self, step: StepInput) -> RaggedMetadata:
        meta = super().prepare(step)
        batch, max_q, max_kv = len(step.query_lens), meta.max_query_len, meta.max_kv_len
        page_size = self.kv_pool.page_size
        # q_rows: [num_tokens] row of each flat query token in the flattened [batch * max_q] grid
        owner = torch.repeat_interleave(torch.arange(batch, device=self.device), meta.query_lens)
        index_in_req = torch.arange(len(step.input_ids), device=self.device) - meta.qo_indptr[owner]
        self.q_rows = owner * max_q + index_in_req
        # kv_slots: [batch, max_kv] pool rows of each request's context, padding clamped
        j = torch.arange(max_kv, device=self.device)
        page_pos = torch.minimum(j[None, :] // page_size, (meta.page_indptr[1:] - meta.page_indptr[:-1] - 1)[:, None])
        pages = meta.page_indices[meta.page_indptr[:-1, None] + page_pos]
        self.kv_slots = pages * page_size + j[None, :] % page_size
        # mask: [batch, 1, max_q, max_kv]; padded query rows still see key 0 (no NaN rows)
        query_pos = (meta.kv_lens - meta.query_lens)[:, None] + torch.arange(max_q, device=self.device)[None, :]
        self.mask = (j[None, None, :] <= query_pos[:, :, None]).unsqueeze(1)
        self.batch, self.max_q = batch, max_q
        return meta

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.kv_pool.write(layer, self.meta.out_slots, k, v)
        keys = self._gather(self.kv_pool.k[layer], q.dtype)  # [batch, max_kv, kv_heads, head_dim]
        values = self._gather(self.kv_pool.v[layer], q.dtype)
        if self.max_q == 1:  # pure decode: every request has exactly one query row
            q_pad = q.unsqueeze(1)
        else:
            q_pad = q.new_zeros(self.batch * self.max_q, self.num_heads, self.head_dim)
            q_pad[self.q_rows] = q
            q_pad = q_pad.view(self.batch, self.max_q, self.num_heads, self.head_dim)
        out = F.scaled_dot_product_attention(
            q_pad.transpose(1, 2),  # [batch, heads, max_q, head_dim]
            keys.transpose(1, 2),  # [batch, kv_heads, max_kv, head_dim]
            values.transpose(1, 2),
            attn_mask=self.mask,
            scale=self.scale,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )  # [batch, heads, max_q, head_dim]
        out = out.transpose(1, 2).reshape(self.batch * self.max_q, self.num_heads, self.head_dim)
        return out if self.max_q == 1 else out[self.q_rows]  # [num_tokens, heads, head_dim]

    def _gather(self, buffer: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        # NOTE: index_select on the flat slot list; 2-D advanced indexing is ~100x slower on CPU
        rows = buffer.index_select(0, self.kv_slots.view(-1))  # [batch * max_kv, kv_heads, head_dim]
        return rows.view(self.batch, -1, self.num_kv_heads, self.head_dim).to(dtype)
