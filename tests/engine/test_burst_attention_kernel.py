"""The burst verify's attention kernel (sglaunch/kernels/burst_attention.py) against its torch reference:
ragged positions, GQA groups, padding slots, contexts longer than one key block. On CPU through
Triton's interpreter (set before triton is imported), natively on a GPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from engine_helpers import triton_or_skip  # noqa: E402

triton_or_skip()

from sglaunch.kernels.burst_attention import burst_attention_reference, burst_attention_triton  # noqa: E402

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

from sglaunch.kernels.burst_attention import choose_splits, scratch_numel, split_chunk  # noqa: E402


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


# ---- combine="fold": the split kernel's last program per (request, KV head) merges the splits ----------------

import sglaunch.kernels.burst_attention as burst_kernel  # noqa: E402
from sglaunch.kernels.burst_attention import COMBINE_ENV, combine_from_env, counters_numel  # noqa: E402


def _no_combine_kernel(monkeypatch):
    """The fold launches the split kernel only: the combine kernel, if launched, fails the test."""

    class Refuse:
        def __getitem__(self, grid):
            raise AssertionError("combine='fold' launched the separate combine kernel")

    monkeypatch.setattr(burst_kernel, "_burst_combine_kernel", Refuse())


def _both(q, k_rows, v_rows, table, positions, Q, scale, counters=None, **kw):
    sep = burst_attention_triton(q, k_rows, v_rows, table, positions, Q, scale, combine="separate", **kw)
    fold = burst_attention_triton(q, k_rows, v_rows, table, positions, Q, scale, combine="fold", counters=counters,
                                  **kw)
    return sep, fold


def _assert_same(fold, sep):
    """The fold's merge is the separate combine's arithmetic in the same split order: the same bits
    through the interpreter; on a GPU two compiled kernels may round a last bit differently."""
    if DEVICE.type == "cpu":
        assert torch.equal(fold, sep)
    else:
        torch.testing.assert_close(fold.float(), sep.float(), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("starts,C,splits,block_n", [
    ([0], 256, 4, 64),  # the whole request inside split 0: it writes the output itself, no ticket
    ([24, 25, 28, 40], 128, 4, 16),  # last column at a split's end (31), one past it (32), the window across it
    ([0, 5, 40], 1024, 64, 16),  # many splits, nearly all empty: each request reaches 1, 1 and 3 of 64
    ([56, 57, 100], 256, 2, 64),  # the window across a key block, a split's last block
    ([0, 120, 200], 256, 3, 32),  # uneven: chunk 96, split 2 partly past the table
    ([3, 150], 256, 1, 32),  # one split: nothing to merge, counters untouched
    ([248, 0, 130], 256, 4, 64),  # a request clamped at the table's end (all splits) beside one in split 0
])
def test_fold_matches_separate_and_reference(starts, C, splits, block_n, monkeypatch):
    q, k_rows, v_rows, table, positions, want = _case(starts, C, seed=C + splits + 1)
    positions = positions.clamp(max=C - 1)  # as the burst clamps its rows to the slot table
    want = burst_attention_reference(q, k_rows, v_rows, table, bias_for(positions, len(starts), 8, C, 3, q.dtype), 8,
                                     16**-0.5)
    sep = burst_attention_triton(q, k_rows, v_rows, table, positions, 8, 16**-0.5, block_n=block_n, splits=splits)
    counters = torch.zeros(counters_numel(len(starts), 2), dtype=torch.int32, device=DEVICE)
    _no_combine_kernel(monkeypatch)
    fold = burst_attention_triton(q, k_rows, v_rows, table, positions, 8, 16**-0.5, block_n=block_n, splits=splits,
                                  combine="fold", counters=counters)
    torch.testing.assert_close(fold, want, atol=1e-5, rtol=1e-5)
    _assert_same(fold, sep)
    assert not counters.any(), "the fold left a ticket counter nonzero"


def test_fold_lengths_of_one():
    """Every row of a request at position 0 (a dummy row, a request's first token): one column, in
    split 0; beside a request that reaches every split."""
    q, k_rows, v_rows, table, positions, _ = _case([0, 0, 100], 128, seed=5)
    positions = positions.clone().view(3, 8)
    positions[0] = 0
    positions[1, :] = torch.tensor([0, 0, 0, 0, 1, 0, 0, 0])  # one row sees two columns, the others one
    positions = positions.reshape(-1)
    want = burst_attention_reference(q, k_rows, v_rows, table, bias_for(positions, 3, 8, 128, 3, q.dtype), 8, 0.25)
    sep, fold = _both(q, k_rows, v_rows, table, positions, 8, 0.25, block_n=16, splits=8)
    torch.testing.assert_close(fold, want, atol=1e-5, rtol=1e-5)
    _assert_same(fold, sep)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fold_gqa_model_shape(dtype):
    """The target's shape (9 heads, 3 KV heads, head_dim 64, Q = 8) with the auto split count."""
    q, k_rows, v_rows, table, positions, want = _case([0, 70, 200, 255], 256, heads=9, kv_heads=3, hd=64, dtype=dtype,
                                                      seed=21)
    positions = positions.clamp(max=255)
    want = burst_attention_reference(q, k_rows, v_rows, table, bias_for(positions, 4, 8, 256, 3, dtype), 8, 0.125)
    sep, fold = _both(q, k_rows, v_rows, table, positions, 8, 0.125)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(fold.float(), want.float(), atol=tol, rtol=tol)
    _assert_same(fold, sep)


def test_fold_repeated_launches_reuse_the_counters():
    """One counter buffer and one scratch across launches (a graph's layers and replays): each launch
    leaves the counters at 0, whatever splits the lengths reached; stale NaN partials never leak."""
    B, C, splits = 3, 256, 8
    counters = torch.zeros(counters_numel(B, 2) + 3, dtype=torch.int32, device=DEVICE)
    scratch = torch.full((scratch_numel(B, 6, 2, 16, 8, splits),), float("nan"), device=DEVICE)
    for i, starts in enumerate([[0, 100, 240], [31, 32, 33], [248, 248, 0], [5, 64, 190]]):
        q, k_rows, v_rows, table, positions, _ = _case(starts, C, seed=40 + i)
        positions = positions.clamp(max=C - 1)
        want = burst_attention_reference(q, k_rows, v_rows, table, bias_for(positions, B, 8, C, 3, q.dtype), 8, 0.25)
        for layer in range(2):
            fold = burst_attention_triton(q, k_rows, v_rows, table, positions, 8, 0.25, block_n=32, splits=splits,
                                          scratch=scratch, combine="fold", counters=counters)
            torch.testing.assert_close(fold, want, atol=1e-5, rtol=1e-5)
            assert not counters.any(), f"launch {i}.{layer}: counters {counters.tolist()}"


@pytest.mark.parametrize("splits,block_n", [(4, 16), (16, 16)])
def test_fold_loop_stops_at_the_real_length(splits, block_n):
    """NaN in every slot past each request's length: the fold neither loads nor merges them."""
    starts = [0, 37, 90]
    q, k_rows, v_rows, table, positions, want = _case(starts, 256, seed=11)
    poison = k_rows.shape[0] - 1
    k_rows[poison] = float("nan")
    v_rows[poison] = float("nan")
    bad = table.clone()
    for b, s in enumerate(starts):
        bad[b, s + 8:] = poison
    got = burst_attention_triton(q, k_rows, v_rows, bad, positions, 8, 16**-0.5, block_n=block_n, splits=splits,
                                 combine="fold")
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_fold_one_column_too_many_fails():
    starts = [24, 8, 56]  # last positions 31, 15, 63: column 32 / 16 / 64 starts a split (chunk 16)
    q, k_rows, v_rows, table, positions, want = _case(starts, 128, seed=7)
    got = burst_attention_triton(q, k_rows, v_rows, table, positions, 8, 0.25, block_n=16, splits=8, combine="fold")
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    wrong = burst_attention_triton(q, k_rows, v_rows, table, positions + 1, 8, 0.25, block_n=16, splits=8,
                                   combine="fold")
    assert (wrong - want).abs().max() > 1e-2


def test_fold_arguments_are_checked(monkeypatch):
    q, k_rows, v_rows, table, positions, _ = _case([5, 60], 128, seed=3)
    with pytest.raises(ValueError, match="counters"):
        burst_attention_triton(q, k_rows, v_rows, table, positions, 8, 0.25, block_n=16, splits=4, combine="fold",
                               counters=torch.zeros(3, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="counters"):
        burst_attention_triton(q, k_rows, v_rows, table, positions, 8, 0.25, block_n=16, splits=4, combine="fold",
                               counters=torch.zeros(4, dtype=torch.int64, device=DEVICE))
    with pytest.raises(ValueError, match="combine"):
        burst_attention_triton(q, k_rows, v_rows, table, positions, 8, 0.25, combine="fused")
    monkeypatch.delenv(COMBINE_ENV, raising=False)
    assert combine_from_env() == "separate"
    monkeypatch.setenv(COMBINE_ENV, " Fold ")
    assert combine_from_env() == "fold"
    monkeypatch.setenv(COMBINE_ENV, "both")
    with pytest.raises(ValueError, match=COMBINE_ENV):
        combine_from_env()
