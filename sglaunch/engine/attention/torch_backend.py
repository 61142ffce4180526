"""Attention in plain torch (CPU and GPU): pad the ragged batch, one SDPA call per group.

Per step, prepare() turns the ragged metadata into padded gather indices and a mask:
request b's queries sit at rows [0, query_lens[b]) of a [batch, max_q] grid and its context
at [0, kv_lens[b]) of a [batch, max_kv] grid. Query i of request b is at absolute position
kv_lens[b] - query_lens[b] + i and sees keys j <= that position (causal within the chunk, all
of the cached prefix).

A step that mixes one-token decodes with longer chunks (prefills, verify windows) is split into
groups by query length, each padded on its own (length_groups): padding every decode to the
longest prefill chunk would multiply the attention work of a busy server's steps by that chunk's
length, and padding DSpark's verify windows (up to 8 rows) to a prompt chunk beside them did the
same to every drafting request of an admitting step (dev CPU, session 45: 7 drafting requests and
one 120-token prompt, 450-620 ms a step against a plain engine's 130-180).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch
import torch.nn.functional as F

from sglaunch.engine.attention.base import AttentionBackend, RaggedMetadata
from sglaunch.engine.step import StepInput
from sglaunch.engine.transfer import to_device
from sglaunch.kernels.layer_ops import folded_gqa_attention


@dataclass
class PaddedGroup:
    """Some of the step's requests, padded to their own longest query and context."""

    tokens: torch.Tensor | None  # [n] rows of the step's flat tokens (None: all of them, in order)
    batch: int
    max_q: int
    q_rows: torch.Tensor  # [n] row of each query in the flat [batch * max_q] grid
    kv_slots: torch.Tensor  # [batch, max_kv] pool rows of each request's context, padding clamped
    mask: torch.Tensor  # [batch, 1, max_q, max_kv]; padded query rows still see key 0 (no NaN rows)
    # the mask of the folded grouped-query layout (_attend), or None where the group keeps enable_gqa
    folded_mask: torch.Tensor | None = None


SHORT_QUERY = 16  # query rows of a short chunk: a DSpark verify window (block size + 1) or a second chain's


def length_groups(query_lens: list[int]) -> list[list[int]] | None:
    """The step's requests in groups padded on their own: one-token decodes; short chunks (2 to
    SHORT_QUERY rows: verify windows); longer chunks (prompts) in groups whose shortest chunk has at
    least half the rows of the longest, so no group pads more than twice its work. None: a single
    group of every request (padded as one, in step order)."""
    decode, short, long = [], [], []
    for i, n in enumerate(query_lens):
        (decode if n == 1 else short if n <= SHORT_QUERY else long).append(i)
    groups = [g for g in (decode, short) if g]
    if long:
        long.sort(key=lambda i: -query_lens[i])
        current = [long[0]]
        for i in long[1:]:
            if 2 * query_lens[i] >= query_lens[current[0]]:
                current.append(i)
            else:
                groups.append(current)
                current = [i]
        groups.append(current)
    return None if len(groups) <= 1 else groups


class TorchAttentionBackend(AttentionBackend):
    split_mixed_steps = True  # False: one padded group for every step (benchmarks/torch_attention_mixed.py)

    def prepare(self, step: StepInput) -> RaggedMetadata:
        meta = super().prepare(step)
        groups = length_groups(step.query_lens) if self.split_mixed_steps else None
        self.groups = ([self._group(step, meta, None)] if groups is None
                       else [self._group(step, meta, reqs) for reqs in groups])
        return meta

    def _group(self, step: StepInput, meta: RaggedMetadata, reqs: list[int] | None) -> PaddedGroup:
        dev, page_size = self.device, self.kv_pool.page_size
        tokens = None
        if reqs is None:
            reqs = list(range(len(step.query_lens)))
            req_t = None
        else:
            starts = [0, *accumulate(step.query_lens)]
            # NOTE: one pinned copy (torch.tensor(..., device=cuda) waits for the stream)
            tokens, req_t = to_device([torch.tensor([t for r in reqs for t in range(starts[r], starts[r + 1])],
                                                    dtype=torch.int64), torch.tensor(reqs, dtype=torch.int64)], dev)

        def pick(x: torch.Tensor) -> torch.Tensor:
            return x if req_t is None else x.index_select(0, req_t)

        q_lens, kv_lens = pick(meta.query_lens), pick(meta.kv_lens)
        page_start = pick(meta.page_indptr[:-1])
        page_count = pick(meta.page_indptr[1:]) - page_start
        batch = len(reqs)
        max_q = max(step.query_lens[r] for r in reqs)
        max_kv = max(step.kv_lens[r] for r in reqs)
        owner = torch.repeat_interleave(torch.arange(batch, device=dev), q_lens)
        local_qo = torch.cumsum(q_lens, 0) - q_lens  # [batch] first flat row of each request
        index_in_req = torch.arange(owner.shape[0], device=dev) - local_qo[owner]
        j = torch.arange(max_kv, device=dev)
        page_pos = torch.minimum(j[None, :] // page_size, (page_count - 1)[:, None])
        pages = meta.page_indices[page_start[:, None] + page_pos]
        query_pos = (kv_lens - q_lens)[:, None] + torch.arange(max_q, device=dev)[None, :]
        mask = (j[None, None, :] <= query_pos[:, :, None]).unsqueeze(1)
        # NOTE: on a CPU the query heads that share a key/value head attend as that head's query rows
        # (layer_ops.folded_gqa_attention): torch's CPU SDPA took 3.1-6.3x less time so than with
        # enable_gqa for SmolLM2's decode rows (9 heads over 3, 200-600 keys, 1-8 requests) and 1.16-1.28x
        # less for 8 requests' 8-row windows, but 0.80-0.96x for one request's window, which keeps
        # enable_gqa (`python benchmarks/sdpa_gqa_cpu.py`, benchmarks/cpu40/sdpa_gqa_cpu.json)
        group = self.num_heads // self.num_kv_heads
        folded_mask = None
        if group > 1 and dev.type == "cpu" and (max_q == 1 or batch > 1):
            folded_mask = mask if max_q == 1 else mask.repeat(1, 1, group, 1)  # rows (member, query)
        return PaddedGroup(
            tokens=tokens, batch=batch, max_q=max_q, q_rows=owner * max_q + index_in_req,
            kv_slots=pages * page_size + j[None, :] % page_size, mask=mask, folded_mask=folded_mask,
        )

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if k is not None:
            self.kv_pool.write(layer, self.meta.out_slots, k, v)
        if len(self.groups) == 1:
            return self._attend(self.groups[0], layer, q)
        out = torch.empty_like(q)
        for group in self.groups:
            out.index_copy_(0, group.tokens, self._attend(group, layer, q.index_select(0, group.tokens)))
        return out

    def _attend(self, g: PaddedGroup, layer: int, q: torch.Tensor) -> torch.Tensor:
        """q: the group's queries [n, heads, head_dim] -> [n, heads, head_dim]."""
        keys = self._gather(g, self.kv_pool.k[layer], q.dtype)  # [batch, max_kv, kv_heads, head_dim]
        values = self._gather(g, self.kv_pool.v[layer], q.dtype)
        if g.max_q == 1:  # pure decode: every request has exactly one query row
            q_pad = q.unsqueeze(1)
        else:
            q_pad = q.new_zeros(g.batch * g.max_q, self.num_heads, self.head_dim)
            q_pad[g.q_rows] = q
            q_pad = q_pad.view(g.batch, g.max_q, self.num_heads, self.head_dim)
        if g.folded_mask is not None:
            out = folded_gqa_attention(q_pad, keys.transpose(1, 2), values.transpose(1, 2), g.folded_mask, self.scale)
        else:
            out = F.scaled_dot_product_attention(
                q_pad.transpose(1, 2),  # [batch, heads, max_q, head_dim]
                keys.transpose(1, 2),  # [batch, kv_heads, max_kv, head_dim]
                values.transpose(1, 2),
                attn_mask=g.mask,
                scale=self.scale,
                enable_gqa=self.num_heads != self.num_kv_heads,
            ).transpose(1, 2)  # [batch, max_q, heads, head_dim]
        out = out.reshape(g.batch * g.max_q, self.num_heads, self.head_dim)
        return out if g.max_q == 1 else out[g.q_rows]  # [n, heads, head_dim]

    def _gather(self, g: PaddedGroup, buffer: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        # NOTE: index_select on the flat slot list; 2-D advanced indexing is ~100x slower on CPU
        rows = buffer.index_select(0, g.kv_slots.view(-1))  # [batch * max_kv, kv_heads, head_dim]
        return rows.view(g.batch, -1, self.num_kv_heads, self.head_dim).to(dtype)
