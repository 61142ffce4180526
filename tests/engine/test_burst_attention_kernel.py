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


# ---- split-K: programs over (request, KV head, split), then a combine -----------------------------------------

from kernels.burst_attention import choose_splits, scratch_numel, split_chunk  # noqa: E402


def _case(starts, C, Q=8, heads=6, kv_heads=2, hd=16, slots=None, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    B = len(starts)
    slots = slots or C * B + 8
    k_rows = torch.randn(slots, kv_heads, hd, dtype=dtype, device=DEVICE)
    v_rows = torch.randn(slots, kv_heads, hd, dtype=dtype, device=DEVICE)
    positions = (torch.tensor(starts, device=DEVICE)[:, None] + torch.arange(Q, device=DEVICE)[None, :]).reshape(-1)
    table = torch.randperm(slots - 8, device=DEVICE)[: B * C].view(B, C).contiguous()
    q = torch.randn(B * Q, heads, hd, dtype=dtype, device=DEVICE)
    want = burst_attention_reference(q, k_rows, v_rows, table,
                                     bias_for(positions, B, Q, C, heads // kv_heads, dtype), Q, hd**-0.5)
    return q, k_rows, v_rows, table, positions, want


def test_split_chunks_are_static_and_cover_the_table():
    assert split_chunk(512, 8, 64) == (8, 64)
    assert split_chunk(256, 3, 64) == (2, 128)  # 3 splits of 2 blocks would leave the third empty
    assert split_chunk(128, 64, 64) == (2, 64)  # never more splits than key blocks
    assert split_chunk(512, 3, 64) == (3, 192)
    for width, splits, block_n in [(128, 1, 64), (1024, 5, 32), (4096, 64, 64), (384, 7, 16)]:
        n, chunk = split_chunk(width, splits, block_n)
        assert chunk % block_n == 0 and (n - 1) * chunk < width <= n * chunk
    # auto: about two programs per SM (H200: 132), at most one split per key block
    assert choose_splits(1, 3, 512, 132, 64) == 8
    assert choose_splits(32, 3, 512, 132, 64) == 3
    assert choose_splits(1, 3, 8192, 132, 64) == 64
    assert choose_splits(32, 3, 128, 132, 64) == 2
    assert choose_splits(8, 3, 512, 132, 64, splits=1) == 1  # a fixed number wins
    assert choose_splits(8, 3, 512, 132, 64, splits=100) == 8
    assert scratch_numel(2, 9, 3, 64, 8, 1) == 0 and scratch_numel(2, 9, 3, 64, 8, 4) == 2 * 3 * 4 * 32 * 66


@pytest.mark.parametrize("starts,C,splits,block_n", [
    ([0], 256, 4, 64),  # the whole request shorter than one split: the other three exit at once
    ([24, 25, 28, 40], 128, 4, 16),  # last column at a split's end (31), one past it (32), the window across it
    ([0, 5, 40], 1024, 64, 16),  # many splits, nearly all empty
    ([56, 57, 100], 256, 2, 64),  # the window across a key block, a split's last block
    ([0, 120, 200], 256, 3, 32),  # uneven: chunk 96, split 2 partly past the table
    ([3, 150], 256, 1, 32),  # one split: no combine
])
def test_splits_match_reference(starts, C, splits, block_n):
    q, k_rows, v_rows, table, positions, want = _case(starts, C, seed=C + splits)
    got = burst_attention_triton(q, k_rows, v_rows, table, positions, 8, 16**-0.5, block_n=block_n, splits=splits)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("splits", [1, 2, 4])
def test_splits_bf16_gqa(splits):
    q, k_rows, v_rows, table, positions, want = _case([0, 70, 200], 256, heads=9, kv_heads=3, hd=64,
                                                      dtype=torch.bfloat16, seed=splits)
    got = burst_attention_triton(q, k_rows, v_rows, table, positions, 8, 64**-0.5, splits=splits)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("splits,block_n", [(1, 16), (4, 16), (8, 16)])
def test_one_column_too_many_fails(splits, block_n):
    """Each request's first invisible column is the first of a split (chunk 32 with 4 splits of
    C = 128, 16 with 8): poisoning its K / V changes nothing, poisoning the last visible one does."""
    starts = [24, 8, 56]  # last positions 31, 15, 63: column 32 / 16 / 64 starts a split
    q, k_rows, v_rows, table, positions, want = _case(starts, 128, seed=7)
    poison = k_rows.shape[0] - 1  # outside every table row
    for column_offset, same in [(8, True), (7, False)]:
        bad = table.clone()
        for b, s in enumerate(starts):
            bad[b, s + column_offset] = poison
        k2, v2 = k_rows.clone(), v_rows.clone()
        k2[poison], v2[poison] = 30.0, 1000.0
        got = burst_attention_triton(q, k2, v2, bad, positions, 8, 16**-0.5, block_n=block_n, splits=splits)
        if same:
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        else:
            assert (got - want).abs().max() > 1.0
    # and every query one position further sees one column too many
    wrong = burst_attention_triton(q, k_rows, v_rows, table, positions + 1, 8, 16**-0.5, block_n=block_n,
                                   splits=splits)
    assert (wrong - want).abs().max() > 1e-2


@pytest.mark.parametrize("splits,block_n", [(1, 64), (1, 16), (4, 16), (16, 16)])
def test_loop_stops_at_the_real_length(splits, block_n):
    """Slots past each request's last position hold NaN (an unwritten KV row may): nothing of them
    is loaded, so the loop is bounded by the length read on the device, not the table width."""
    starts = [0, 37, 90]
    q, k_rows, v_rows, table, positions, want = _case(starts, 256, seed=11)
    poison = k_rows.shape[0] - 1
    k_rows[poison] = float("nan")
    v_rows[poison] = float("nan")
    bad = table.clone()
    for b, s in enumerate(starts):
        bad[b, s + 8:] = poison
    got = burst_attention_triton(q, k_rows, v_rows, bad, positions, 8, 16**-0.5, block_n=block_n, splits=splits)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_scratch_is_checked_and_reused():
    q, k_rows, v_rows, table, positions, want = _case([5, 60], 128, seed=3)
    need = scratch_numel(2, 6, 2, 16, 8, 4)
    scratch = torch.full((need + 10,), float("nan"), device=DEVICE)  # stale partials must not leak in
    got = burst_attention_triton(q, k_rows, v_rows, table, positions, 8, 16**-0.5, block_n=16, splits=4,
                                 scratch=scratch)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="scratch"):
        burst_attention_triton(q, k_rows, v_rows, table, positions, 8, 16**-0.5, block_n=16, splits=4,
                               scratch=scratch[: need - 1])
