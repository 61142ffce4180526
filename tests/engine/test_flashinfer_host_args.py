"""The host-side arguments our FlashInfer backend hands its plans (no GPU, no FlashInfer needed):
the longest query of a qo_indptr, computed once in numpy instead of FlashInfer's element-wise
Python max, and the prefill kernel family chosen by SGLAUNCH_FLASHINFER_PREFILL_BACKEND."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglaunch.engine.attention.base import indptr as host_indptr
from sglaunch.engine.attention.flashinfer_backend import (
    PREFILL_BACKEND_ENV,
    max_query_len,
    prefill_backend_from_env,
)


@pytest.mark.parametrize("lengths", [[1], [1] * 64 + [16], [0, 0, 7, 1, 63], [128] + [0] * 128])
def test_max_query_len_is_the_longest_query(lengths):
    indptr = torch.from_numpy(host_indptr(lengths, np.int32))  # as PlanArrays.from_step builds it
    assert max_query_len(indptr) == max(lengths)
    # FlashInfer's own computation, which the argument replaces
    assert max_query_len(indptr) == max(indptr[1:] - indptr[:-1]).item()


def test_max_query_len_reads_a_pinned_style_view():
    buffer = torch.zeros(10, dtype=torch.int32)  # cuda_graph.HostLayout's arrays are such views
    buffer.numpy()[:4] = np.array([0, 1, 2, 9], dtype=np.int32)
    assert max_query_len(buffer[:4]) == 7
    assert max_query_len(buffer[:1]) == 0


def test_prefill_backend_from_env(monkeypatch):
    monkeypatch.delenv(PREFILL_BACKEND_ENV, raising=False)
    assert prefill_backend_from_env() == "fa2"
    monkeypatch.setenv(PREFILL_BACKEND_ENV, "")
    assert prefill_backend_from_env() == "fa2"
    monkeypatch.setenv(PREFILL_BACKEND_ENV, "auto")
    assert prefill_backend_from_env() == "auto"
    monkeypatch.setenv(PREFILL_BACKEND_ENV, "FA2")
    assert prefill_backend_from_env() == "fa2"
    monkeypatch.setenv(PREFILL_BACKEND_ENV, "cudnn")
    with pytest.raises(ValueError, match=PREFILL_BACKEND_ENV):
        prefill_backend_from_env()


# ---- the float workspace: room for every split-KV plan (session 23: the Qwen3-1.7B shape's
# ragged graph of 2,048 rows and 257 requests asked FlashInfer for 288 MiB of 128) ----------------
def _graphs(max_bs: int, window: int = 0) -> list[tuple[int, int]]:
    from sglaunch.engine.cuda_graph import GraphPlan

    plan = GraphPlan.build(max_bs, window, 4096, 1, mixed=True)
    return [(key.num_tokens, key.batch_size) for key in plan.keys()]


def test_workspace_covers_the_allocation_that_overflowed_on_the_h200():
    from sglaunch.engine.attention.flashinfer_backend import workspace_bytes

    # FlashInfer's message: "batch_prefill_tmp_v with size 301989888 ... only 134217728 bytes available"
    tmp_v = 301_989_888
    tmp_s = tmp_v // 128  # the same tiles, one float a row instead of head_dim
    need = workspace_bytes(16, 8, 128, 132, _graphs(256))
    assert need >= tmp_v + tmp_s
    assert need < 2 * (tmp_v + tmp_s)  # room, not a blanket multiple of it


def test_small_models_keep_the_default_workspace():
    from sglaunch.engine.attention.flashinfer_backend import WORKSPACE_BYTES, workspace_bytes

    # SmolLM2-135M (9 query heads of 64, 3 KV heads), plain and DSpark graphs up to 256 requests
    assert workspace_bytes(9, 3, 64, 132, _graphs(256)) == WORKSPACE_BYTES
    assert workspace_bytes(9, 3, 64, 132, _graphs(256, window=8)) == WORKSPACE_BYTES


@pytest.mark.parametrize("shape", [(16, 8, 128), (32, 8, 128), (64, 8, 128), (32, 1, 128), (8, 8, 256)])
def test_workspace_grows_with_the_graphs_heads_and_sms(shape):
    from sglaunch.engine.attention.flashinfer_backend import workspace_bytes

    heads, kv_heads, head_dim = shape
    small = workspace_bytes(heads, kv_heads, head_dim, 132, _graphs(64))
    large = workspace_bytes(heads, kv_heads, head_dim, 132, _graphs(256))
    assert large >= small and large % (1 << 20) == 0
    # an eager step splits KV over at most 2 CTAs an SM per KV head, tiles of up to 128 rows
    eager = heads * (2 * 132 // kv_heads) * 128 * (head_dim + 1) * 4
    assert workspace_bytes(heads, kv_heads, head_dim, 132) >= eager
    assert workspace_bytes(heads, kv_heads, head_dim, 264) >= workspace_bytes(heads, kv_heads, head_dim, 132)


def test_eager_plans_of_one_kv_head_a_rank_get_more_than_the_default():
    """Tensor parallel 8 of a 64/8-head model leaves 8 query heads and 1 KV head a rank: an eager
    prefill may split its KV over 2 CTAs x 132 SMs, 264 tiles of 128 rows: 139 MB of partials."""
    from sglaunch.engine.attention.flashinfer_backend import WORKSPACE_BYTES, workspace_bytes

    need = workspace_bytes(8, 1, 128, 132)
    assert need > WORKSPACE_BYTES
    assert need >= 8 * 264 * 128 * 129 * 4
