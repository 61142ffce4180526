"""The burst verify's attention kernel (kernels/burst_attention.py) against its torch reference:
ragged positions, GQA groups, padding slots, contexts longer than one key block. On CPU through
Triton's interpreter (set before triton is imported), natively on a GPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from engine_helpers import triton_or_skip  # noqa: E402

triton_or_skip()

from kernels.burst_attention import burst_attention_reference, burst_attention_triton  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def bias_for(positions: torch.Tensor, B: int, Q: int, C: int, group: int, dtype) -> torch.Tensor:
    col = torch.arange(C, device=positions.device)
    visible = col[None, None, :] <= positions.view(B, Q, 1)
    bias = torch.zeros(B, Q, C, dtype=dtype, device=positions.device).masked_fill_(~visible, float("-inf"))
    return bias.repeat(1, group, 1).unsqueeze(1)


@pytest.mark.parametrize("heads,kv_heads,hd", [(9, 3, 64), (4, 4, 16), (8, 2, 32)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_reference(heads, kv_heads, hd, dtype):
    torch.manual_seed(heads + hd)
    B, Q, C, slots = 3, 8, 256, 600
    k_rows = torch.randn(slots, kv_heads, hd, dtype=dtype, device=DEVICE)
    v_rows = torch.randn(slots, kv_heads, hd, dtype=dtype, device=DEVICE)
    starts = torch.tensor([0, 70, 200], device=DEVICE)  # one inside the first key block, one past 3 blocks
    positions = (starts[:, None] + torch.arange(Q, device=DEVICE)[None, :]).reshape(-1)
    table = torch.stack([torch.randperm(slots, device=DEVICE)[:C] for _ in range(B)])
    table[1, 78:] = slots - 1  # padding columns (beyond every position of request 1): never seen
    q = torch.randn(B * Q, heads, hd, dtype=dtype, device=DEVICE)
    got = burst_attention_triton(q, k_rows, v_rows, table, positions, Q, hd**-0.5)
    want = burst_attention_reference(q, k_rows, v_rows, table, bias_for(positions, B, Q, C, heads // kv_heads, dtype),
                                     Q, hd**-0.5)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
    # it fails when a query sees one column too many
    wrong = burst_attention_triton(q, k_rows, v_rows, table, positions + 1, Q, hd**-0.5)
    assert (wrong.float() - want.float()).abs().max() > 10 * tol


def test_kernel_rejects_a_bad_layout():
    q = torch.randn(10, 4, 16, device=DEVICE)
    rows = torch.randn(20, 4, 16, device=DEVICE)
    with pytest.raises(ValueError, match="burst attention"):
        burst_attention_triton(q, rows, rows, torch.zeros(2, 128, dtype=torch.int64, device=DEVICE),
                               torch.zeros(10, dtype=torch.int64, device=DEVICE), 4, 0.25)


@pytest.mark.parametrize("block_n", [32, 128])
def test_kernel_block_sizes_agree(block_n):
    """The key-block size (benchmarks/burst_profile.py --block-n) changes the loop, not the result."""
    torch.manual_seed(block_n)
    B, Q, C, heads, kv_heads, hd = 2, 8, 256, 9, 3, 64
    k_rows = torch.randn(300, kv_heads, hd, device=DEVICE)
    v_rows = torch.randn(300, kv_heads, hd, device=DEVICE)
    positions = (torch.tensor([3, 150], device=DEVICE)[:, None] + torch.arange(Q, device=DEVICE)).reshape(-1)
    table = torch.stack([torch.randperm(300, device=DEVICE)[:C] for _ in range(B)])
    q = torch.randn(B * Q, heads, hd, device=DEVICE)
    want = burst_attention_reference(q, k_rows, v_rows, table, bias_for(positions, B, Q, C, 3, torch.float32), Q,
                                     hd**-0.5)
    got = burst_attention_triton(q, k_rows, v_rows, table, positions, Q, hd**-0.5, block_n=block_n)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
