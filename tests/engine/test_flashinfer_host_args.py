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
