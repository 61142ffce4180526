"""The torch attention backend against a per-request float64 reference, for steps that mix
one-token decodes with prefill chunks and verify windows (split into two padded groups)."""

from __future__ import annotations

import pytest
import torch

from sglaunch.engine.attention.torch_backend import TorchAttentionBackend
from sglaunch.engine.kv_pool import KVPool
from sglaunch.engine.step import StepInput

from engine_helpers import random_step

LAYOUTS = {
    "decode-only": ([1, 1, 1], [5, 40, 17]),
    "prefill-only": ([4, 30], [4, 30]),
    "mixed": ([1, 12, 1, 3, 1], [9, 12, 33, 20, 2]),
    "mixed-verify": ([8, 1, 5, 1], [60, 70, 5, 1]),
}


def reference(pool: KVPool, step: StepInput, q: torch.Tensor, heads: int, kv_heads: int) -> torch.Tensor:
    """Request by request: gather its context through its page table, causal softmax in float64."""
    out, row, ps = [], 0, pool.page_size
    for b, (ql, kvl) in enumerate(zip(step.query_lens, step.kv_lens)):
        slots = torch.tensor([step.page_tables[b][j // ps] * ps + j % ps for j in range(kvl)])
        keys = pool.k[0][slots].double().repeat_interleave(heads // kv_heads, dim=1)  # [kvl, heads, d]
        values = pool.v[0][slots].double().repeat_interleave(heads // kv_heads, dim=1)
        qb = q[row: row + ql].double()  # [ql, heads, d]
        scores = torch.einsum("qhd,khd->hqk", qb, keys) * q.shape[-1] ** -0.5
        pos = torch.arange(kvl - ql, kvl)[:, None]
        scores = scores.masked_fill(torch.arange(kvl)[None, :] > pos, float("-inf"))
        out.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), values))
        row += ql
    return torch.cat(out)


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_torch_backend_matches_a_per_request_reference(layout, page_size):
    heads, kv_heads, head_dim = 4, 2, 16
    query_lens, kv_lens = LAYOUTS[layout]
    num_pages = sum(-(-kv // page_size) for kv in kv_lens) + 4
    step = random_step(query_lens, kv_lens, page_size, num_pages, seed=len(layout))
    gen = torch.Generator().manual_seed(3)
    pool = KVPool(1, num_pages, page_size, kv_heads, head_dim, torch.float32, torch.device("cpu"))
    pool.k[0].copy_(torch.randn(pool.k[0].shape, generator=gen))
    pool.v[0].copy_(torch.randn(pool.v[0].shape, generator=gen))
    n = step.num_tokens
    q = torch.randn(n, heads, head_dim, generator=gen)
    k, v = torch.randn(n, kv_heads, head_dim, generator=gen), torch.randn(n, kv_heads, head_dim, generator=gen)
    backend = TorchAttentionBackend(pool, heads, kv_heads, head_dim, torch.device("cpu"))
    backend.prepare(step)
    mixed = 0 < query_lens.count(1) < len(query_lens)
    assert len(backend.groups) == (2 if mixed else 1)
    out = backend.forward(0, q, k, v)  # writes the new K/V, then attends
    torch.testing.assert_close(out.double(), reference(pool, step, q, heads, kv_heads), rtol=1e-5, atol=1e-5)
