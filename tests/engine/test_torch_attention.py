"""The torch attention backend against a per-request float64 reference, for steps that mix
one-token decodes with prefill chunks and verify windows (split into padded groups by query length)."""

from __future__ import annotations

import pytest
import torch

from sglaunch.engine.attention.torch_backend import TorchAttentionBackend
from sglaunch.engine.kv_pool import KVPool
from sglaunch.engine.step import StepInput

from engine_helpers import random_step

LAYOUTS = {  # query lens, kv lens, the groups padded on their own
    "decode-only": ([1, 1, 1], [5, 40, 17], 1),
    "prefill-only": ([4, 30], [4, 30], 2),  # a short chunk and a long one
    "mixed": ([1, 12, 1, 3, 1], [9, 12, 33, 20, 2], 2),
    "mixed-verify": ([8, 1, 5, 1], [60, 70, 5, 1], 2),
    # DSpark's admitting step: verify windows beside a prompt chunk, and prompts of far apart lengths
    "admitting": ([8, 40, 3, 1, 90, 6, 35], [70, 40, 50, 9, 90, 30, 35], 4),
    "long-only": ([40, 33, 21], [40, 33, 50], 1),  # within 2x of each other: one group
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
    query_lens, kv_lens, groups = LAYOUTS[layout]
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
    assert len(backend.groups) == groups
    out = backend.forward(0, q, k, v)  # writes the new K/V, then attends
    torch.testing.assert_close(out.double(), reference(pool, step, q, heads, kv_heads), rtol=1e-5, atol=1e-5)


def test_length_groups_bound_the_padding():
    """Each group pads to its longest query: decodes alone, verify windows (up to SHORT_QUERY rows) together,
    and longer chunks only beside chunks at least half as long."""
    from sglaunch.engine.attention.torch_backend import SHORT_QUERY, length_groups

    lens = [1, 8, 120, 1, 3, 50, 64, 200, 16, 17]
    groups = length_groups(lens)
    assert sorted(i for g in groups for i in g) == list(range(len(lens)))
    assert [0, 3] in groups and [1, 4, 8] in groups  # decodes; windows of up to 16 rows
    long = [g for g in groups if lens[g[0]] > SHORT_QUERY]
    assert long == [[7, 2], [6, 5], [9]]  # 200 and 120; 64 and 50; 17 (under half of 50)
    assert all(2 * min(lens[i] for i in g) >= max(lens[i] for i in g) for g in long)
    assert length_groups([1, 1]) is None and length_groups([8, 3]) is None and length_groups([30]) is None
