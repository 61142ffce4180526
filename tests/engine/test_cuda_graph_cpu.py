"""CPU side of the GPU path: graph buckets and verify tiers, choosing a graph for a step, padding
a step with dummy requests, FlashInfer's plan arrays, when graphs are off, `auto` resolution."""

from __future__ import annotations

import pytest
import torch

from sglaunch.engine.attention import IMPLEMENTED, attention_backend_class
from sglaunch.engine.attention.base import RaggedMetadata
from sglaunch.engine.attention.flashinfer_backend import PlanArrays
from sglaunch.engine.cuda_graph import (
    GraphKey,
    GraphPlan,
    capture_batch_sizes,
    graphs_disabled_reason,
    pad_step,
    parse_extra_tiers,
    static_rows,
    verify_token_tiers,
)
from sglaunch.engine.kv_pool import KVPool
from sglaunch.engine.step import StepInput

from engine_helpers import random_step

PAD = 99  # padding page id in these tests


def make_step(query_lens: list[int], kv_lens: list[int], page_size: int, seed: int = 0) -> StepInput:
    """A ragged step over distinct random pages (page ids < PAD)."""
    return random_step(query_lens, kv_lens, page_size, PAD, seed)


def test_capture_batch_sizes():
    assert capture_batch_sizes(1) == [1]
    assert capture_batch_sizes(12) == [1, 2, 4, 8, 12]
    assert capture_batch_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert capture_batch_sizes(30) == [1, 2, 4, 8, 16, 24, 30]
    with pytest.raises(ValueError):
        capture_batch_sizes(0)


def test_verify_tiers_and_extra_tiers():
    assert verify_token_tiers([1, 2, 4], 5) == [5, 10, 20]
    assert verify_token_tiers([1, 2, 4], 5, (3, 12, 21)) == [3, 5, 10, 12, 20]  # 21 > largest: dropped
    assert parse_extra_tiers(None) == () and parse_extra_tiers("12, 20,48") == (12, 20, 48)
    with pytest.raises(ValueError, match="comma-separated"):
        parse_extra_tiers("12;20")
    with pytest.raises(ValueError, match="positive"):
        parse_extra_tiers("0")


def test_keys_largest_first_and_buffer_sizes():
    plan = GraphPlan.build(max_bs=8, window=5, context_length=100, page_size=4)
    keys = plan.keys()
    assert [k.num_tokens for k in keys] == sorted((k.num_tokens for k in keys), reverse=True)
    assert {k.batch_size for k in keys if k.decode} == {1, 2, 4, 8}
    assert {(k.num_tokens, k.batch_size) for k in keys if not k.decode} == {(5, 6), (10, 9), (20, 9), (40, 9)}
    assert plan.max_tokens == 40 and plan.max_batch == 9
    assert plan.max_pages >= 9 * 27  # every request of the largest batch at full context
    no_spec = GraphPlan.build(max_bs=8, window=0, context_length=100, page_size=4)
    assert no_spec.verify_tiers == () and all(k.decode for k in no_spec.keys())


@pytest.mark.parametrize("query_lens,expected", [
    ([1], GraphKey(True, 1, 1)),
    ([1, 1, 1], GraphKey(True, 4, 4)),
    ([1] * 8, GraphKey(True, 8, 8)),
    ([1] * 9, None),  # over max_bs: eager
    ([3], GraphKey(False, 6, 5)),
    ([5, 1, 2], GraphKey(False, 9, 10)),
    ([5] * 4 + [1], GraphKey(False, 9, 40)),
    ([6], None),  # longer than the window: a prefill chunk, eager
    ([5] * 8, GraphKey(False, 9, 40)),
])
def test_pick(query_lens, expected):
    plan = GraphPlan.build(max_bs=8, window=5, context_length=100, page_size=4)
    step = make_step(query_lens, [q + 7 for q in query_lens], page_size=4)
    assert plan.pick(step) == expected


def test_pick_falls_back_when_pages_overflow():
    plan = GraphPlan.build(max_bs=8, window=5, context_length=100, page_size=4)
    small = GraphPlan(plan.decode_sizes, plan.verify_tiers, plan.max_bs, plan.window, plan.page_size, max_pages=4)
    assert small.pick(make_step([1], [12], page_size=4)) == GraphKey(True, 1, 1)  # 3 pages
    assert small.pick(make_step([1, 1], [12, 8], page_size=4)) is None  # 5 pages


def test_decode_only_plan_never_picks_verify():
    plan = GraphPlan.build(max_bs=8, window=0, context_length=100, page_size=1)
    assert plan.pick(make_step([2], [9], page_size=1)) is None


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("query_lens,key", [
    ([1, 1, 1], GraphKey(True, 4, 4)),
    ([3, 1, 5], GraphKey(False, 9, 20)),
    ([5, 5, 5, 5], GraphKey(False, 9, 20)),  # no padding rows: the spare dummy has none
    ([], GraphKey(False, 9, 40)),  # the all-dummy layout graphs are captured with
])
def test_pad_step(page_size, query_lens, key):
    step = make_step(query_lens, [q + 6 for q in query_lens], page_size)
    padded = pad_step(step, key, PAD, page_size)
    assert (padded.batch_size, padded.num_tokens) == (key.batch_size, key.num_tokens)
    b, t = step.batch_size, step.num_tokens
    # real rows untouched, sample rows unchanged
    assert padded.input_ids[:t] == step.input_ids and padded.positions[:t] == step.positions
    assert padded.page_tables[:b] == step.page_tables and padded.sample_indices == step.sample_indices
    # every dummy lives on the padding page only, attends causally to its own rows
    for q, kv, table in zip(padded.query_lens[b:], padded.kv_lens[b:], padded.page_tables[b:]):
        assert set(table) == {PAD} and len(table) == max(1, -(-q // page_size))
        assert kv == max(q, 1) and (q == 1 if key.decode else q >= 0)
    # the padding rows write their K/V into the padding page only, RoPE positions stay small
    meta = RaggedMetadata.from_step(padded, page_size, torch.device("cpu"))
    pad_slots = meta.out_slots[t:]
    assert ((pad_slots // page_size) == PAD).all()
    assert all(0 <= p < page_size for p in padded.positions[t:])
    # FlashInfer's view of the padded layout is consistent (kv_len from pages and last_page_len)
    arrays = PlanArrays.from_step(padded, page_size)
    pages = arrays.page_indptr[1:] - arrays.page_indptr[:-1]
    assert ((pages - 1) * page_size + arrays.last_page_len).tolist() == padded.kv_lens


@pytest.mark.parametrize("page_size", [1, 3, 16])
def test_static_rows_equal_the_ragged_metadata(page_size):
    """The graph's static inputs (ids, positions, KV slots) built from lists equal RaggedMetadata's,
    for decode and verify layouts, padded or not."""
    cases = [([1, 1, 1], [4, 9, 30], GraphKey(True, 4, 4)), ([3, 1, 5], [7, 2, 40], GraphKey(False, 9, 20)),
             ([1], [1], GraphKey(True, 1, 1)), ([2, 8, 1, 4], [2, 33, 17, 5], GraphKey(False, 17, 40))]
    for seed, (query_lens, kv_lens, key) in enumerate(cases):
        for step in (make_step(query_lens, kv_lens, page_size, seed),
                     pad_step(make_step(query_lens, kv_lens, page_size, seed), key, PAD, page_size)):
            meta = RaggedMetadata.from_step(step, page_size, torch.device("cpu"))
            n = step.num_tokens
            rows = static_rows(step, page_size)
            assert rows[:n] == step.input_ids and rows[n: 2 * n] == meta.positions.tolist()
            assert rows[2 * n:] == meta.out_slots.tolist()


def test_pad_step_refuses_what_does_not_fit():
    step = make_step([2, 2], [5, 5], page_size=1)
    with pytest.raises(ValueError, match="does not fit"):
        pad_step(step, GraphKey(True, 4, 4), PAD, 1)  # not a decode step
    with pytest.raises(ValueError, match="does not fit"):
        pad_step(step, GraphKey(False, 2, 8), PAD, 1)  # no spare request for the padding rows


@pytest.mark.parametrize("page_size", [1, 3])
def test_plan_arrays_match_ragged_metadata(page_size):
    step = make_step([1, 4, 7, 1], [1, 9, 7, 20], page_size)
    arrays = PlanArrays.from_step(step, page_size)
    meta = RaggedMetadata.from_step(step, page_size, torch.device("cpu"))
    assert all(t.dtype == torch.int32 for t in (arrays.qo_indptr, arrays.page_indptr, arrays.page_indices,
                                                  arrays.last_page_len))
    assert arrays.qo_indptr.tolist() == meta.qo_indptr.tolist()
    assert arrays.page_indptr.tolist() == meta.page_indptr.tolist()
    assert arrays.page_indices.tolist() == meta.page_indices.tolist()
    assert arrays.last_page_len.tolist() == meta.last_page_len.tolist()
    assert not arrays.is_decode and PlanArrays.from_step(make_step([1, 1], [3, 4], page_size), page_size).is_decode


def test_graphs_disabled_reason():
    torch_cls, fi_cls = attention_backend_class("torch"), attention_backend_class("flashinfer")
    assert graphs_disabled_reason("cpu", False, fi_cls) == "CPU device"
    assert graphs_disabled_reason("cuda", True, fi_cls) == "--disable-cuda-graph"
    assert "flashinfer" in graphs_disabled_reason("cuda", False, torch_cls)
    assert graphs_disabled_reason("cuda", False, fi_cls) is None


def test_flashinfer_backend_refuses_the_cpu():
    pool = KVPool(1, 4, 1, 2, 64, torch.bfloat16, "cpu")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        attention_backend_class("flashinfer")(pool, 4, 2, 64, torch.device("cpu"))


def test_kv_pool_padding_page():
    pool = KVPool(2, num_pages=5, page_size=4, kv_heads=2, head_dim=8, dtype=torch.float32, device="cpu",
                  padding_page=True)
    assert (pool.num_pages, pool.padding_page, pool.total_pages, pool.num_slots) == (5, 5, 6, 24)
    assert pool.k[0].shape == (24, 2, 8)
    plain = KVPool(2, num_pages=5, page_size=4, kv_heads=2, head_dim=8, dtype=torch.float32, device="cpu")
    assert (plain.padding_page, plain.num_slots) == (None, 20)
    assert "flashinfer" in IMPLEMENTED and "torch" in IMPLEMENTED


# ---- `--attention-backend auto` (front end, torch-free) -------------------------------------
def _resolve(tmp_path, monkeypatch, *, gpus: int, flashinfer: str | None, args=(), head_dim: int = 64):
    import importlib.util
    import json

    from sglaunch.checks.pipeline import run_pipeline
    from sglaunch.probe.environment import EnvironmentInfo, GpuInfo

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (object() if flashinfer else None)
                        if name == "flashinfer" else real_find_spec(name, *a))
    model = tmp_path / "m"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(dict(
        architectures=["LlamaForCausalLM"], hidden_size=4 * head_dim, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=2, intermediate_size=128, vocab_size=256, max_position_embeddings=256,
        torch_dtype="bfloat16")))
    h200s = [GpuInfo(i, "NVIDIA H200", 143771, 143000, "9.0") for i in range(gpus)]
    env = EnvironmentInfo(python="3.12", platform="linux", packages={"torch": "2.11", "flashinfer": flashinfer},
                          torch_cuda="13.0", gpus=h200s)
    report = run_pipeline(["--model-path", str(model), *args], {}, mode="serve", probe=False, env_info=env)
    return {r.flag: (r.value, r.reason) for r in report.resolutions}, report


@pytest.mark.parametrize("gpus,flashinfer,args,head_dim,expected,why", [
    (1, "0.6.14", (), 64, "flashinfer", "FlashInfer 0.6.14"),
    (0, "0.6.14", (), 64, "torch", "CPU device"),
    (1, None, (), 64, "torch", "not installed"),
    (1, "0.6.10", (), 64, "torch", "older than 0.6.14"),
    (1, "0.6.14", ("--dtype", "float32"), 64, "torch", "float32"),
    (1, "0.6.14", (), 32, "torch", "head_dim"),
])
def test_auto_attention_backend(tmp_path, monkeypatch, gpus, flashinfer, args, head_dim, expected, why):
    reasons, _ = _resolve(tmp_path, monkeypatch, gpus=gpus, flashinfer=flashinfer, args=args, head_dim=head_dim)
    value, reason = reasons["--attention-backend"]
    assert value == expected and why in reason, reasons["--attention-backend"]


def test_explicit_flashinfer_that_cannot_run_falls_back_with_a_warning(tmp_path, monkeypatch):
    reasons, report = _resolve(tmp_path, monkeypatch, gpus=0, flashinfer=None,
                                  args=("--attention-backend", "flashinfer"))
    assert reasons["--attention-backend"][0] == "torch"
    eng003 = [d for d in report.diagnostics if d.code == "ENG003"]
    assert eng003 and "CPU device" in eng003[0].message


# ---- padding semantics on the real model (torch backend): dummies never change real rows ----
@pytest.mark.parametrize("decode", [True, False])
def test_padded_step_gives_the_same_logits(checkpoints, decode):
    from engine_helpers import engine_config

    from sglaunch.engine.launch import create_engine

    engine, cluster = create_engine(engine_config(checkpoints["llama"], page_size=4))
    try:
        runner, page_size = engine.runner, 4
        padding_page = engine.allocator.alloc(1)[0]  # stands in for the pool's reserved page
        lengths, windows = [5, 11, 2], ([1, 1, 1] if decode else [3, 1, 3])  # verify: 1 padding row
        step = make_step([n + w for n, w in zip(lengths, windows)], [n + w for n, w in zip(lengths, windows)],
                         page_size, seed=5)
        for table in step.page_tables:  # real pages from the allocator
            table[:] = engine.allocator.alloc(len(table))
        runner.forward(step)  # fill the context
        tail = StepInput([], [], [], [], [], [])
        for b, (n, w) in enumerate(zip(lengths, windows)):
            start = sum(step.query_lens[:b])
            tail.input_ids += step.input_ids[start + n: start + n + w]
            tail.positions += list(range(n, n + w))
            tail.query_lens.append(w)
            tail.kv_lens.append(n + w)
            tail.page_tables.append(step.page_tables[b])
        tail.sample_indices = list(range(tail.num_tokens))
        plan = GraphPlan.build(max_bs=4, window=0 if decode else 4, context_length=256, page_size=page_size)
        key = plan.pick(tail)
        assert key is not None and key.decode == decode
        padded = pad_step(tail, key, padding_page, page_size)
        torch.testing.assert_close(runner.forward(padded), runner.forward(tail), atol=1e-5, rtol=1e-5)
    finally:
        cluster.stop(engine)


def test_greedy_choices_of_a_decode_graph_map_logit_rows_to_token_rows():
    """After a decode-graph replay the engine reads the graph's greedy choices for the rows it
    samples (sample_indices order); a step that replayed no decode graph has none."""
    import torch

    from sglaunch.engine.model_runner import ModelRunner

    runner = object.__new__(ModelRunner)
    runner.step_greedy, runner._greedy_read = None, None
    assert runner.greedy_host([0]) is None
    # 4 requests; requests 0, 2 and 3 sample (request 1 is a 1-token partial prefill chunk)
    greedy = torch.tensor([[11.0, 12.0, 13.0, 14.0], [-0.5, -1.5, -2.5, -3.5]], dtype=torch.float64)
    runner.step_greedy = (greedy, [0, 2, 3])
    tokens, logprobs = runner.greedy_host([2, 0])  # logit rows 2 and 0 are token rows 3 and 0
    assert tokens == [14, 11] and logprobs == [-3.5, -0.5]
    assert all(isinstance(t, int) for t in tokens)
