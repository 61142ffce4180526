"""combine="fold" of the burst attention (sglaunch/kernels/burst_attention.py) on a real GPU, where the split
programs race for their tickets: what Triton's interpreter (one program after the other) cannot
show. Against the separate combine and the SDPA reference at the target's shapes (9 heads, 3 KV
heads, head_dim 64, Q = 8) with the device's auto split counts; thousands of launches on one
counter buffer (always back to 0, the result independent of which program came last); 30 launches
(a graph's layers) in a CUDA graph, replayed back to back with new lengths; and a DSpark engine's
bursts with SGLAUNCH_DSPARK_BURST_COMBINE=fold against plain greedy and against the separate
combine. The interpreter's tests of the same kernel are tests/engine/test_burst_attention_kernel.py."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import sglaunch.kernels.burst_attention as burst_kernel
from sglaunch.kernels.burst_attention import (
    burst_attention_reference,
    burst_attention_triton,
    choose_splits,
    counters_numel,
    device_sm_count,
    scratch_numel,
)

DEV = torch.device("cuda")
HEADS, KV, HD, Q = 9, 3, 64, 8


def bias_for(positions, B, C, dtype):
    col = torch.arange(C, device=positions.device)
    visible = col[None, None, :] <= positions.view(B, Q, 1)
    bias = torch.zeros(B, Q, C, dtype=dtype, device=positions.device).masked_fill_(~visible, float("-inf"))
    return bias.repeat(1, HEADS // KV, 1).unsqueeze(1)


def case(B, C, dtype=torch.bfloat16, seed=0, starts=None):
    g = torch.Generator(device="cpu").manual_seed(seed)
    slots = B * C + 16
    k_rows = torch.randn(slots, KV, HD, generator=g).to(DEV, dtype)
    v_rows = torch.randn(slots, KV, HD, generator=g).to(DEV, dtype)
    table = torch.randperm(slots - 16, generator=g)[: B * C].view(B, C).to(DEV)
    if starts is None:  # every length from 1 column to the table's end, the ends included
        starts = torch.randint(0, C - Q + 1, (B,), generator=g)
        starts[0] = 0
        if B > 1:
            starts[-1] = C - Q
    positions = (torch.as_tensor(starts)[:, None] + torch.arange(Q)[None, :]).reshape(-1).to(DEV)
    q = torch.randn(B * Q, HEADS, HD, generator=g).to(DEV, dtype)
    return q, k_rows, v_rows, table, positions


def close_bits(got, want, what):
    """Two compiled kernels of one merge: nearly every element the same bits, the rest one rounding."""
    torch.testing.assert_close(got.float(), want.float(), atol=1e-2, rtol=1e-2, msg=what)
    same = (got == want).float().mean().item()
    assert same > 0.99, f"{what}: only {same:.4f} of the elements equal the separate combine's"


@pytest.mark.parametrize("B", [1, 8, 32])
@pytest.mark.parametrize("C", [256, 512, 1024])
def test_fold_matches_separate_and_reference(B, C):
    sms = device_sm_count(DEV)
    splits = choose_splits(B, KV, C, sms)
    q, k_rows, v_rows, table, positions = case(B, C, seed=B * C)
    want = burst_attention_reference(q, k_rows, v_rows, table, bias_for(positions, B, C, q.dtype), Q, HD**-0.5)
    sep = burst_attention_triton(q, k_rows, v_rows, table, positions, Q, HD**-0.5, combine="separate")
    counters = torch.zeros(counters_numel(B, KV), dtype=torch.int32, device=DEV)
    fold = burst_attention_triton(q, k_rows, v_rows, table, positions, Q, HD**-0.5, combine="fold", counters=counters)
    torch.cuda.synchronize()
    torch.testing.assert_close(fold.float(), want.float(), atol=2e-2, rtol=2e-2)
    close_bits(fold, sep, f"B={B} C={C} splits={splits}")
    assert not counters.any(), counters


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fold_many_launches_on_one_counter_buffer(dtype):
    """2,000 launches, no synchronisation between them, new lengths every 50: each result equals the
    first launch of its lengths bit for bit (the merge runs in split order whoever is last), and the
    counters are 0 after every batch of launches."""
    B, C = 8, 1024
    counters = torch.zeros(counters_numel(B, KV), dtype=torch.int32, device=DEV)
    scratch = torch.full((scratch_numel(B, HEADS, KV, HD, Q, 64),), float("nan"), device=DEV)
    for round_ in range(40):
        q, k_rows, v_rows, table, positions = case(B, C, dtype=dtype, seed=100 + round_)
        outs = [burst_attention_triton(q, k_rows, v_rows, table, positions, Q, HD**-0.5, scratch=scratch,
                                       combine="fold", counters=counters) for _ in range(50)]
        sep = burst_attention_triton(q, k_rows, v_rows, table, positions, Q, HD**-0.5, scratch=scratch,
                                     combine="separate")
        torch.cuda.synchronize()
        assert not counters.any(), f"round {round_}: counters {counters.tolist()}"
        for i, out in enumerate(outs[1:]):
            assert torch.equal(out, outs[0]), f"round {round_}: launch {i + 1} differs from the first"
        close_bits(outs[0], sep, f"round {round_}")


@pytest.mark.parametrize("B,C", [(1, 512), (8, 256), (8, 1024), (32, 512)])
def test_fold_in_a_cuda_graph(B, C):
    """30 launches (a graph's layers, each its own K/V) on one scratch and one counter buffer,
    captured once, replayed 20 times back to back per set of lengths written into the static
    positions: the last replay equals the eager separate combine, the counters end at 0."""
    layers = 30
    q, k0, v0, table, positions = case(B, C, seed=7)
    ks = [torch.randn_like(k0) for _ in range(layers)]
    vs = [torch.randn_like(v0) for _ in range(layers)]
    counters = torch.zeros(counters_numel(B, KV), dtype=torch.int32, device=DEV)
    splits = choose_splits(B, KV, C, device_sm_count(DEV))
    scratch = torch.empty(scratch_numel(B, HEADS, KV, HD, Q, splits), device=DEV)
    static_pos = positions.clone()

    def body():
        return [burst_attention_triton(q, ks[i], vs[i], table, static_pos, Q, HD**-0.5, splits=splits,
                                       scratch=scratch, combine="fold", counters=counters) for i in range(layers)]

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        body()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = body()
    g = torch.Generator(device="cpu").manual_seed(B + C)
    for trial in range(5):
        starts = torch.randint(0, C - Q + 1, (B,), generator=g)
        starts[0] = trial  # a short one beside long ones
        static_pos.copy_((starts[:, None] + torch.arange(Q)[None, :]).reshape(-1).to(DEV))
        for _ in range(20):
            graph.replay()
        torch.cuda.synchronize()
        assert not counters.any(), f"trial {trial}: counters {counters.tolist()}"
        for i in (0, layers // 2, layers - 1):
            sep = burst_attention_triton(q, ks[i], vs[i], table, static_pos, Q, HD**-0.5, splits=splits,
                                         combine="separate")
            close_bits(outs[i], sep, f"trial {trial}, layer {i}")


import test_cuda_graph_gpu as graphs_gpu

files = graphs_gpu.files  # the module-scoped fixture: the tiny checkpoint and drafters of the graph tests


def test_dspark_bursts_fold_equal_separate_and_plain(files, monkeypatch):
    """The engine's bursts with SGLAUNCH_DSPARK_BURST_COMBINE=fold (read when the burst runner is
    built): the combine kernel is never launched (nor captured), the greedy outputs equal plain
    decoding's and the separate combine's but for bf16 near ties."""
    launches = {"combine": 0}
    real = burst_kernel._burst_combine_kernel

    class Counted:
        def __getitem__(self, grid):
            launches["combine"] += 1
            return real[grid]

    monkeypatch.setattr(burst_kernel, "_burst_combine_kernel", Counted())
    monkeypatch.setenv("SGLAUNCH_DSPARK_BURST", "auto")
    batch = graphs_gpu.prompts(10, seed=6)
    plain, _ = graphs_gpu.greedy_outputs(graphs_gpu.cuda_config(files), batch, 40)
    config = graphs_gpu.cuda_config(files, drafter="oracle")
    config = dataclasses.replace(config, speculative=dataclasses.replace(config.speculative,
                                                                         ragged_verify_mode="static"))
    outputs = {}
    for combine in ("separate", "fold"):
        monkeypatch.setenv("SGLAUNCH_DSPARK_BURST_COMBINE", combine)
        launches["combine"] = 0
        outputs[combine], replays = graphs_gpu.greedy_outputs(config, batch, 40)
        assert replays["bursts"] > 0, replays
        if combine == "separate":
            assert launches["combine"] > 0, "no burst key had more than one split: the comparison shows nothing"
        else:
            assert launches["combine"] == 0, f"combine=fold launched the combine kernel {launches['combine']} times"
    graphs_gpu.assert_same_greedy(outputs["fold"], outputs["separate"], "bursts fold vs separate", max_diverged=1)
    graphs_gpu.assert_same_greedy(outputs["fold"], plain, "bursts fold vs plain greedy", max_diverged=3)
