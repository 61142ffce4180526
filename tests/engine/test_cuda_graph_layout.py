"""cuda_graph.fill_padded (a graph replay's host inputs written into persistent arrays) gives
exactly what pad_step + static_rows + PlanArrays.from_step give, for random decode and ragged
verify steps, several page sizes, list and int32-array page tables, arrays reused across steps."""

from __future__ import annotations

import random
from array import array

import numpy as np
import pytest

from sglaunch.engine.attention.flashinfer_backend import PlanArrays
from sglaunch.engine.cuda_graph import (
    GraphKey,
    GraphPlan,
    HostLayout,
    fill_padded,
    pad_step,
    static_rows,
    verify_batch_size,
)
from sglaunch.engine.step import StepInput

PAD = 7  # padding page id (real pages are drawn from other ids, some above it)
MAX_BS, WINDOW, CONTEXT = 16, 6, 120


def old_layout(step: StepInput, key: GraphKey, page_size: int) -> dict[str, list[int]]:
    padded = pad_step(step, key, PAD, page_size)
    n = padded.num_tokens
    rows = static_rows(padded, page_size)
    arrays = PlanArrays.from_step(padded, page_size)
    return dict(ids=rows[:n], positions=rows[n: 2 * n], slots=rows[2 * n:], qo_indptr=arrays.qo_indptr.tolist(),
                page_indptr=arrays.page_indptr.tolist(), page_indices=arrays.page_indices.tolist(),
                last_page_len=arrays.last_page_len.tolist())


def new_layout(step: StepInput, key: GraphKey, page_size: int, out: HostLayout) -> dict[str, list[int]]:
    pages = fill_padded(step, key, PAD, page_size, out)
    n, b = key.num_tokens, key.batch_size
    rows = out.rows_np
    assert rows.dtype == np.int64 and out.page_indices_np.dtype == np.int32 and out.qo_indptr_np.dtype == np.int32
    # the torch tensors _load copies from see the same values (shared memory)
    assert out.rows[: 3 * n].tolist() == rows[: 3 * n].tolist()
    assert out.page_indices[:pages].tolist() == out.page_indices_np[:pages].tolist()
    return dict(ids=rows[:n].tolist(), positions=rows[n: 2 * n].tolist(), slots=rows[2 * n: 3 * n].tolist(),
                qo_indptr=out.qo_indptr_np[: b + 1].tolist(), page_indptr=out.page_indptr_np[: b + 1].tolist(),
                page_indices=out.page_indices_np[:pages].tolist(), last_page_len=out.last_page_len_np[:b].tolist())


def random_step(rng: random.Random, query_lens: list[int], page_size: int, arrays) -> StepInput:
    """Requests of random contexts (>= their query rows) on distinct scattered pages; ids include
    overlap placeholders (negative). Tables: int32 arrays (as Req.pages), lists, or ("mixed") both."""
    total = sum(-(-(CONTEXT + WINDOW) // page_size) for _ in query_lens) + 1
    free = [p for p in rng.sample(range(3 * total + PAD + 1), 3 * total + PAD + 1) if p != PAD]
    step = StepInput([], [], [], [], [], [])
    for q in query_lens:
        kv = rng.randint(q, CONTEXT + q)
        step.input_ids += [rng.randrange(-3, 49152) for _ in range(q)]
        step.positions += list(range(kv - q, kv))
        step.query_lens.append(q)
        step.kv_lens.append(kv)
        table = [free.pop() for _ in range(-(-kv // page_size))]
        as_array = rng.random() < 0.5 if arrays == "mixed" else arrays
        step.page_tables.append(array("i", table) if as_array else table)
        step.sample_indices.append(len(step.input_ids) - 1)
    return step


@pytest.mark.parametrize("page_size", [1, 2, 3, 16])
def test_fill_padded_equals_pad_step_static_rows_and_plan_arrays(page_size):
    rng = random.Random(page_size)
    plan = GraphPlan.build(max_bs=MAX_BS, window=WINDOW, context_length=CONTEXT + WINDOW, page_size=page_size)
    # one layout reused for every step (stale larger contents must not leak), a small page room
    # that has to grow
    out = HostLayout(plan.max_tokens, plan.max_batch, plan.max_pages, pages=8)
    seen = set()
    for i in range(120):
        b = rng.randint(1, MAX_BS)
        decode = i % 2 == 0
        query_lens = [1] * b if decode else [rng.randint(1, WINDOW) for _ in range(b)]
        step = random_step(rng, query_lens, page_size, arrays=(False, True, "mixed")[i % 3])
        if decode:
            key = plan.pick(step)
        else:  # the verify tier, even for an all-ones step (plan.pick would give it a decode graph)
            tier = next(t for t in plan.verify_tiers if t >= step.num_tokens)
            key = GraphKey(False, verify_batch_size(tier, MAX_BS), tier)
        assert key is not None and key.decode == decode
        seen.add((key.decode, key.batch_size > b, key.num_tokens > step.num_tokens))
        assert new_layout(step, key, page_size, out) == old_layout(step, key, page_size), (i, key)
    assert (True, True, True) in seen and (False, True, True) in seen
    assert len(out.page_indices_np) > 8


@pytest.mark.parametrize("page_size", [1, 4])
def test_fill_padded_all_dummy_and_unpadded_layouts(page_size):
    """The all-dummy layouts graphs are captured with, an exact decode bucket (no dummies), a
    verify step whose rows fill its tier (the spare dummy has no rows)."""
    plan = GraphPlan.build(max_bs=8, window=5, context_length=64, page_size=page_size)
    out = HostLayout(plan.max_tokens, plan.max_batch, plan.max_pages)
    for key in plan.keys():
        empty = StepInput([], [], [], [], [], [])
        assert new_layout(empty, key, page_size, out) == old_layout(empty, key, page_size), key
    rng = random.Random(1)
    for query_lens, key in (([1] * 8, GraphKey(True, 8, 8)), ([5, 5, 5, 5], GraphKey(False, 9, 20))):
        step = random_step(rng, query_lens, page_size, arrays=True)
        assert new_layout(step, key, page_size, out) == old_layout(step, key, page_size), key


def test_fill_padded_refuses_what_does_not_fit():
    out = HostLayout(8, 4, 16)
    step = random_step(random.Random(0), [2, 2], 1, arrays=False)
    with pytest.raises(ValueError, match="does not fit"):
        fill_padded(step, GraphKey(True, 4, 4), PAD, 1, out)  # not a decode step
    with pytest.raises(ValueError, match="does not fit"):
        fill_padded(step, GraphKey(False, 2, 8), PAD, 1, out)  # no spare request for the padding rows
    big = random_step(random.Random(0), [1, 1], 1, arrays=False)
    big.page_tables[0] = list(range(100, 130))
    with pytest.raises(ValueError, match="page indices do not fit"):
        fill_padded(big, GraphKey(True, 2, 2), PAD, 1, out)


def test_mixed_steps_pick_a_ragged_graph():
    """A decode batch with a prefill chunk (an arrival under load) replays the smallest ragged tier
    that holds its tokens, with DSpark (verify windows beside it) and without (the ragged tiers
    exist for mixed steps alone); by default any chunk that fits the largest tier with its step
    does; a longer one, or SGLAUNCH_MIXED_GRAPHS=0, runs eagerly as before."""
    from sglaunch.engine.cuda_graph import MIXED_WIDTH

    rng = random.Random(3)
    plain = GraphPlan.build(max_bs=MAX_BS, window=0, context_length=CONTEXT, page_size=1, mixed=True)
    assert plain.verify_tiers == tuple(sorted({b * MIXED_WIDTH for b in plain.decode_sizes}))
    assert plain.max_query == max(plain.verify_tiers) == MAX_BS * MIXED_WIDTH
    step = random_step(rng, [1] * 9 + [40], 1, arrays=True)
    key = plain.pick(step)
    assert key == GraphKey(False, verify_batch_size(64, MAX_BS), 64)  # 49 tokens: the tier of 64
    out = HostLayout(plain.max_tokens, plain.max_batch, plain.max_pages)
    assert new_layout(step, key, 1, out) == old_layout(step, key, 1)
    assert plain.pick(random_step(rng, [1] * 9, 1, arrays=True)).decode  # decodes alone: a decode graph
    assert plain.pick(random_step(rng, [1, MAX_BS * MIXED_WIDTH - 1], 1, arrays=True)) is not None
    assert plain.pick(random_step(rng, [1, MAX_BS * MIXED_WIDTH], 1, arrays=True)) is None  # over the tier
    assert GraphPlan.build(max_bs=MAX_BS, window=0, context_length=CONTEXT, page_size=1).verify_tiers == ()
    dspark = GraphPlan.build(max_bs=MAX_BS, window=WINDOW, context_length=CONTEXT + WINDOW, page_size=1, mixed=True)
    verify_and_prefill = random_step(rng, [WINDOW] * 3 + [30], 1, arrays=False)
    assert dspark.pick(verify_and_prefill) is not None
    off = GraphPlan.build(max_bs=MAX_BS, window=WINDOW, context_length=CONTEXT + WINDOW, page_size=1)
    assert off.max_query == WINDOW and off.pick(verify_and_prefill) is None


def test_an_eager_step_is_told_why():
    """GraphPlan.pick_or_why names why a step runs eagerly (CudaGraphRunner counts it in `replays` as
    "eager (WHY)"), and agrees with pick wherever a graph fits."""
    rng = random.Random(5)
    plan = GraphPlan.build(max_bs=MAX_BS, window=WINDOW, context_length=CONTEXT + WINDOW, page_size=1, mixed=True)
    decodes = random_step(rng, [1] * 3, 1, arrays=True)
    assert plan.pick_or_why(decodes) == (plan.pick(decodes), None) and plan.pick(decodes).decode
    assert plan.pick_or_why(random_step(rng, [1] * (MAX_BS + 1), 1, arrays=True)) == (None, "batch")
    assert plan.pick_or_why(random_step(rng, [1, plan.max_query + 1], 1, arrays=True)) == (None, "query")
    empty = random_step(rng, [1], 1, arrays=True)
    empty.query_lens, empty.page_tables = [], []
    assert plan.pick_or_why(empty) == (None, "empty")
    narrow = GraphPlan.build(max_bs=MAX_BS, window=WINDOW, context_length=CONTEXT + WINDOW, page_size=1,
                             mixed=True, mixed_max_query=WINDOW * 2)
    assert narrow.pick_or_why(random_step(rng, [1, WINDOW * 2 + 1], 1, arrays=True)) == (None, "query")
    too_many = random_step(rng, [WINDOW * 2] * (max(plan.verify_tiers) // (WINDOW * 2) + 1), 1, arrays=True)
    assert plan.pick_or_why(too_many) == (None, "tokens")


def test_mixed_graphs_env(monkeypatch):
    from sglaunch.engine.cuda_graph import MIXED_ENV, mixed_from_env

    monkeypatch.delenv(MIXED_ENV, raising=False)
    assert mixed_from_env()
    monkeypatch.setenv(MIXED_ENV, "0")
    assert not mixed_from_env()
    monkeypatch.setenv(MIXED_ENV, "yes")
    with pytest.raises(ValueError, match=MIXED_ENV):
        mixed_from_env()


def test_longer_mixed_chunks_pick_a_ragged_graph_when_allowed():
    """SGLAUNCH_MIXED_MAX_QUERY limits the longest prefill chunk a mixed step may hold and still
    replay a ragged graph (default: the largest tier); the chunk and the rest of the step must still
    fit the largest tier, and the padded layout of such a step is the reference one."""
    rng = random.Random(11)
    default = GraphPlan.build(max_bs=MAX_BS, window=0, context_length=CONTEXT, page_size=1, mixed=True)
    wide = GraphPlan.build(max_bs=MAX_BS, window=0, context_length=CONTEXT, page_size=1, mixed=True,
                           mixed_max_query=100)
    assert default.max_query == MAX_BS * 8 and wide.max_query == 100
    assert wide.verify_tiers == default.verify_tiers and max(wide.verify_tiers) == MAX_BS * 8
    step = random_step(rng, [1] * 9 + [100], 1, arrays=True)  # 109 tokens
    key = wide.pick(step)
    assert key == GraphKey(False, verify_batch_size(128, MAX_BS), 128)  # the tiers are 8, 16, 32, 64, 128
    out = HostLayout(wide.max_tokens, wide.max_batch, wide.max_pages)
    assert new_layout(step, key, 1, out) == old_layout(step, key, 1)
    assert wide.pick(random_step(rng, [1] * 9 + [101], 1, arrays=True)) is None  # over the limit
    widest = GraphPlan.build(max_bs=MAX_BS, window=0, context_length=CONTEXT, page_size=1, mixed=True,
                             mixed_max_query=128)
    assert widest.pick(random_step(rng, [1] * 3 + [125], 1, arrays=True)) is not None  # 128 tokens
    assert widest.pick(random_step(rng, [1] * 4 + [125], 1, arrays=True)) is None  # 129 > the largest tier
    narrow = GraphPlan.build(max_bs=MAX_BS, window=0, context_length=CONTEXT, page_size=1, mixed=True,
                             mixed_max_query=20)
    assert narrow.pick(random_step(rng, [1] * 9 + [21], 1, arrays=True)) is None
    assert narrow.pick(random_step(rng, [1] * 9 + [20], 1, arrays=True)) is not None
    off = GraphPlan.build(max_bs=MAX_BS, window=0, context_length=CONTEXT, page_size=1, mixed_max_query=100)
    assert off.verify_tiers == () and off.max_query == 0


def test_mixed_max_query_env(monkeypatch):
    from sglaunch.engine.cuda_graph import MIXED_MAX_QUERY, MIXED_MAX_QUERY_ENV, mixed_max_query_from_env

    monkeypatch.delenv(MIXED_MAX_QUERY_ENV, raising=False)
    assert mixed_max_query_from_env() == MIXED_MAX_QUERY
    monkeypatch.setenv(MIXED_MAX_QUERY_ENV, "2048")
    assert mixed_max_query_from_env() == 2048
    monkeypatch.setenv(MIXED_MAX_QUERY_ENV, "0")
    assert mixed_max_query_from_env() == 0  # no limit but the largest tier
    for bad in ("-5", "lots", "1.5"):
        monkeypatch.setenv(MIXED_MAX_QUERY_ENV, bad)
        with pytest.raises(ValueError, match=MIXED_MAX_QUERY_ENV):
            mixed_max_query_from_env()
