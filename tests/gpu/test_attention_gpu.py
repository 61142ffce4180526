"""FlashInfer attention backend against the torch backend and a float32 reference, on random
inputs (never zeros): prefill, extend over a cached prefix, pure decode, and mixed ragged verify
batches (query lengths 1..8), page sizes 1 and 16, GQA and MHA, head_dim 64 and 128, bf16.

Tolerance (stated): both bf16 backends are compared with the same attention computed in float32
from the same bf16 K/V and queries. FlashInfer must satisfy max abs err <= 2e-2 and mean abs err
<= 2e-3, and its max error must not exceed the torch backend's by more than 1e-2.
"""

from __future__ import annotations

import random

import pytest
import torch

from sglaunch.engine.attention.torch_backend import TorchAttentionBackend
from sglaunch.engine.kv_pool import KVPool
from sglaunch.engine.step import StepInput

from engine_helpers import random_step

MAX_ABS, MEAN_ABS, SLACK_VS_TORCH = 2e-2, 2e-3, 1e-2
DEVICE = torch.device("cuda", 0) if torch.cuda.is_available() else None


def layouts(seed: int = 0) -> dict[str, tuple[list[int], list[int]]]:
    rng = random.Random(seed)
    verify_q = [rng.randint(1, 8) for _ in range(13)]
    return {
        "prefill": ([1, 17, 130, 300], [1, 17, 130, 300]),
        "extend": ([5, 64, 1, 200], [40, 300, 77, 201]),
        "decode": ([1] * 24, [rng.randint(1, 700) for _ in range(24)]),
        "verify": (verify_q, [q + rng.randint(0, 600) for q in verify_q]),
        "verify-with-prefill": ([8, 3, 1, 120, 6], [50, 400, 9, 120, 6]),
    }


def attend(backend, step: StepInput, q, k, v) -> torch.Tensor:
    backend.prepare(step)
    out = backend.forward(0, q, k, v)
    torch.cuda.synchronize()
    return out.float()


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(8, 2, 128), (4, 4, 64), (16, 2, 64)])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("layout", list(layouts()))
def test_flashinfer_matches_torch_backend(flashinfer, layout, page_size, heads, kv_heads, head_dim):
    from sglaunch.engine.attention.flashinfer_backend import FlashInferAttentionBackend, PlanArrays

    query_lens, kv_lens = layouts()[layout]
    num_pages = sum(-(-kv // page_size) for kv in kv_lens) + 8
    step = random_step(query_lens, kv_lens, page_size, num_pages, seed=len(layout))
    gen = torch.Generator(device=DEVICE).manual_seed(7)

    def randn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=gen, device=DEVICE, dtype=torch.float32).to(dtype)

    pool = KVPool(1, num_pages, page_size, kv_heads, head_dim, torch.bfloat16, DEVICE)
    pool.k[0].copy_(randn(*pool.k[0].shape))  # the cached context
    pool.v[0].copy_(randn(*pool.v[0].shape))
    ref_pool = KVPool(1, num_pages, page_size, kv_heads, head_dim, torch.float32, DEVICE)
    ref_pool.k[0].copy_(pool.k[0].float())
    ref_pool.v[0].copy_(pool.v[0].float())
    n = step.num_tokens
    q, k, v = randn(n, heads, head_dim), randn(n, kv_heads, head_dim), randn(n, kv_heads, head_dim)

    ref_backend = TorchAttentionBackend(ref_pool, heads, kv_heads, head_dim, DEVICE)
    reference = attend(ref_backend, step, q.float(), k.float(), v.float())
    torch_out = attend(TorchAttentionBackend(pool, heads, kv_heads, head_dim, DEVICE), step, q, k, v)
    fi = FlashInferAttentionBackend(pool, heads, kv_heads, head_dim, DEVICE)
    fi.set_query_dtype(torch.bfloat16)
    fi_out = attend(fi, step, q, k, v)

    assert fi.wrapper is (fi.decode if PlanArrays.from_step(step, page_size).is_decode else fi.prefill)
    assert torch.isfinite(fi_out).all(), "FlashInfer produced NaN/inf"
    fi_err, torch_err = (fi_out - reference).abs(), (torch_out - reference).abs()
    worst = int(fi_err.amax(dim=(1, 2)).argmax())
    owner = next(b for b in range(step.batch_size) if sum(step.query_lens[: b + 1]) > worst)
    detail = (f"{layout}, page_size {page_size}, heads {heads}/{kv_heads}, head_dim {head_dim}: FlashInfer max abs "
              f"err {fi_err.max():.3e} (mean {fi_err.mean():.3e}), torch backend {torch_err.max():.3e}; worst "
              f"token {worst} of request {owner} (query_len {step.query_lens[owner]}, kv_len {step.kv_lens[owner]})")
    assert fi_err.max() <= MAX_ABS and fi_err.mean() <= MEAN_ABS, detail
    assert fi_err.max() <= torch_err.max() + SLACK_VS_TORCH, detail


def test_flashinfer_writes_new_kv_into_the_pool(flashinfer):
    """The backend stores each layer's new K/V at the step's slots (the next step reads them)."""
    from sglaunch.engine.attention.flashinfer_backend import FlashInferAttentionBackend

    pool = KVPool(2, 16, 4, 2, 64, torch.bfloat16, DEVICE)
    fi = FlashInferAttentionBackend(pool, 4, 2, 64, DEVICE)
    fi.set_query_dtype(torch.bfloat16)
    step = random_step([3, 1], [6, 9], 4, 16, seed=3)
    q = torch.randn(4, 4, 64, device=DEVICE, dtype=torch.bfloat16)
    k, v = torch.randn(2, 4, 2, 64, device=DEVICE, dtype=torch.bfloat16)
    meta = fi.prepare(step)
    fi.forward(1, q, k, v)
    torch.testing.assert_close(pool.k[1][meta.out_slots], k, atol=0, rtol=0)
    torch.testing.assert_close(pool.v[1][meta.out_slots], v, atol=0, rtol=0)
    assert pool.k[0].abs().sum() == 0  # other layers untouched


def test_flashinfer_refuses_float32(flashinfer):
    from sglaunch.engine.attention.flashinfer_backend import FlashInferAttentionBackend

    pool = KVPool(1, 4, 1, 2, 64, torch.float32, DEVICE)
    with pytest.raises(ValueError, match="float16/bfloat16"):
        FlashInferAttentionBackend(pool, 4, 2, 64, DEVICE)
