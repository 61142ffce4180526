"""Host time of building a CUDA-graph replay's static input rows (ids, positions, KV slots):
RaggedMetadata's torch operators (what `CudaGraphRunner._load` did up to session 6) against
`cuda_graph.static_rows` over plain lists (what it does now); and of FlashInfer's page-index
array (`PlanArrays.page_indices`): torch.tensor over a flattened list against
`flashinfer_backend.flat_int32` (the tables are int32 arrays since session 7, as `Req.pages` is:
one join of their buffers). Host work only, so it runs on any
machine; the ratio is what matters (the H200 machine's host is another CPU).

    python benchmarks/graph_load_host.py [--repeats 2000]

Then (session 7) the drafter's context slot table, before and after, and the planner's step-aside
decision at 64 requests.

Then (session 9) the whole host layout of a replay, `CudaGraphRunner._load` before its device
copies and plan: pad_step + static_rows + torch.tensor + PlanArrays.from_step (its torch-operator
indptrs, what `_load` did up to session 8, before pinning four of them per step) against
`cuda_graph.fill_padded` into a persistent HostLayout (numpy views; pinned on the GPU), for decode
batches of 1, 8, 64 and 256 requests and verify batches, contexts of ~300 tokens, page size 1
(EngineConfig's default). The pinned copies the old way also made per step (five
`pin_memory` allocations and copies) are not in the old column: a CPU build cannot pin.

Per layout: the padded step of a decode batch or a verify batch (random pages, contexts of
200-600 tokens), median microseconds of each way over --repeats runs (after 50 warm-up runs),
both producing the [3, tokens] int64 CPU tensor `_load` copies to the device.
"""

from __future__ import annotations

import argparse
from array import array
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from sglaunch.engine.attention.base import RaggedMetadata  # noqa: E402
from sglaunch.engine.cuda_graph import GraphKey, pad_step, static_rows  # noqa: E402
from sglaunch.engine.step import StepInput  # noqa: E402

PAD, PAGE = 0, 1


def layout(query_lens: list[int], seed: int, contexts: tuple[int, int] = (200, 600)) -> StepInput:
    """A ragged step over distinct pages (page size 1), contexts of 200-600 tokens by default."""
    gen = torch.Generator().manual_seed(seed)
    step, next_page = StepInput([], [], [], [], [], []), 1
    for q in query_lens:
        kv = int(torch.randint(*contexts, (1,), generator=gen))
        step.input_ids += torch.randint(0, 49152, (q,), generator=gen).tolist()
        step.positions += list(range(kv - q, kv))
        step.query_lens.append(q)
        step.kv_lens.append(kv)
        step.page_tables.append(array("i", range(next_page, next_page + kv)))  # as Req.pages
        next_page += kv
        step.sample_indices += list(range(len(step.input_ids) - q, len(step.input_ids)))
    return step


def old_rows(step: StepInput) -> torch.Tensor:
    meta = RaggedMetadata.from_step(step, PAGE, torch.device("cpu"))
    return torch.stack([torch.tensor(step.input_ids, dtype=torch.int64), meta.positions, meta.out_slots])


def new_rows(step: StepInput) -> torch.Tensor:
    return torch.tensor(static_rows(step, PAGE), dtype=torch.int64).view(3, step.num_tokens)


def old_page_indices(step: StepInput) -> torch.Tensor:
    """PlanArrays' page_indices up to session 6 (over list tables)."""
    return torch.tensor([p for table in step.page_tables for p in table], dtype=torch.int32)


def new_page_indices(step: StepInput) -> torch.Tensor:
    from sglaunch.engine.attention.flashinfer_backend import flat_int32

    return flat_int32(step.page_tables)


def old_context_slots(page_tables, lengths: list[int], page_size: int) -> torch.Tensor:
    """The drafter's context slot table up to session 7: padded nested lists through torch.tensor."""
    page_tables = [list(t) for t in page_tables]
    batch, width = len(page_tables), max(lengths, default=0)
    most = max(1, max((len(t) for t in page_tables), default=0))
    table = torch.tensor([t + [0] * (most - len(t)) for t in page_tables], dtype=torch.int64).view(batch, most)
    pos = torch.minimum(torch.arange(width)[None, :].expand(batch, width),
                        (torch.tensor(lengths, dtype=torch.int64) - 1).clamp_min(0)[:, None])
    return table.gather(1, pos // page_size) * page_size + pos % page_size


def host_extras(repeats: int) -> None:
    """Session 7: the drafter's context slots (64 requests, contexts of 200-600 tokens) and the
    planner's step-aside decision (64 known requests, a profiled-like step-cost table)."""
    import random

    from sglaunch.speculative.draft_runner import context_slots
    from sglaunch.speculative.planner import DSparkPlanner
    from sglaunch.speculative.sps import SpsTable

    step = layout([1] * 64, seed=7)
    anchors = [kv - 1 for kv in step.kv_lens]
    assert torch.equal(old_context_slots(step.page_tables, anchors, PAGE), context_slots(step.page_tables, anchors, PAGE))
    old = median_us(lambda s: old_context_slots(s.page_tables, anchors, PAGE), step, repeats)
    new = median_us(lambda s: context_slots(s.page_tables, anchors, PAGE), step, repeats)
    print(f"{'draft context slots, 64 req':28s} old {old:9.1f} us   now {new:9.1f} us   {old / new:5.1f}x")
    table = SpsTable.from_points({1: 714.0, 8: 625.0, 32: 588.0, 64: 556.0, 128: 476.0, 256: 417.0}) \
        .with_draft_costs({1: 0.0010, 8: 0.0013, 32: 0.0019, 64: 0.0025}) \
        .with_decode_costs({1: 0.0015, 8: 0.0017, 32: 0.0019, 64: 0.0021})
    planner = DSparkPlanner(7, "compact", table, None, 2, has_confidence_head=True, step_aside=True)
    rids, rng = [f"r{i}" for i in range(64)], random.Random(0)
    for _ in range(3):
        planner.observe(rids, [[rng.random() ** 0.5 for _ in range(7)] for _ in rids])
    print(f"{'step-aside decision, 64 req':28s} now {median_us(lambda s: planner.plan_drafts(rids, 0), step, repeats):9.1f} us")


def old_plan_arrays(step: StepInput, page_size: int):
    """PlanArrays.from_step up to session 8: indptrs through small torch operators."""
    from sglaunch.engine.attention.flashinfer_backend import PlanArrays, flat_int32

    def indptr(lengths):
        out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
        if lengths:
            out[1:] = torch.tensor(lengths, dtype=torch.int32).cumsum(0)
        return out

    return PlanArrays(indptr(step.query_lens), indptr([len(t) for t in step.page_tables]), flat_int32(step.page_tables),
                      torch.tensor([(kv - 1) % page_size + 1 for kv in step.kv_lens], dtype=torch.int32),
                      all(n == 1 for n in step.query_lens))


def old_load_host(step: StepInput, key: GraphKey):
    padded = pad_step(step, key, PAD, PAGE)
    rows = torch.tensor(static_rows(padded, PAGE), dtype=torch.int64).view(3, padded.num_tokens)
    return rows, old_plan_arrays(padded, PAGE)


def whole_layout(repeats: int) -> None:
    """Session 9: a replay's whole host layout, old vs fill_padded (see the module docstring)."""
    from sglaunch.engine.cuda_graph import GraphPlan, HostLayout, fill_padded

    plan = GraphPlan.build(max_bs=256, window=8, context_length=4096, page_size=PAGE)
    out = HostLayout(plan.max_tokens, plan.max_batch, plan.max_pages)
    cases = [("decode bs 1", [1], GraphKey(True, 1, 1)), ("decode bs 8", [1] * 8, GraphKey(True, 8, 8)),
             ("decode 60 in bs 64", [1] * 60, GraphKey(True, 64, 64)),
             ("decode bs 64", [1] * 64, GraphKey(True, 64, 64)),
             ("decode bs 256", [1] * 256, GraphKey(True, 256, 256)),
             ("verify 8 req, 36 rows", [5, 3, 8, 4, 6, 2, 4, 4], GraphKey(False, 9, 40)),
             ("verify 64 req, 4.4 rows", [4, 5, 3, 6] * 16, GraphKey(False, 65, 320))]
    print(f"\n{'whole host layout':24s} {'old us':>9s} {'fill_padded us':>15s} {'ratio':>6s}")
    for i, (name, query_lens, key) in enumerate(cases):
        step = layout(query_lens, seed=100 + i, contexts=(250, 350))
        rows, arrays = old_load_host(step, key)
        pages = fill_padded(step, key, PAD, PAGE, out)
        n, b = key.num_tokens, key.batch_size
        assert out.rows_np[: 3 * n].tolist() == rows.view(-1).tolist(), name
        assert out.qo_indptr_np[: b + 1].tolist() == arrays.qo_indptr.tolist(), name
        assert out.page_indptr_np[: b + 1].tolist() == arrays.page_indptr.tolist(), name
        assert out.page_indices_np[:pages].tolist() == arrays.page_indices.tolist(), name
        assert out.last_page_len_np[:b].tolist() == arrays.last_page_len.tolist(), name
        old = median_us(lambda s: old_load_host(s, key), step, repeats)
        new = median_us(lambda s: fill_padded(s, key, PAD, PAGE, out), step, repeats)
        print(f"{name:24s} {old:9.1f} {new:15.1f} {old / new:5.1f}x")


def median_us(fn, step: StepInput, repeats: int) -> float:
    for _ in range(50):
        fn(step)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(step)
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cases = [("decode bs 1", [1], GraphKey(True, 1, 1)), ("decode bs 8", [1] * 8, GraphKey(True, 8, 8)),
             ("decode bs 64", [1] * 64, GraphKey(True, 64, 64)),
             ("verify 1 x 8 rows", [8], GraphKey(False, 2, 8)),
             ("verify 8 req, 36 rows", [5, 3, 8, 4, 6, 2, 4, 4], GraphKey(False, 9, 40)),
             ("verify 64 req, 4.4 rows", [4, 5, 3, 6] * 16, GraphKey(False, 65, 320))]
    print(f"{'layout':24s} {'rows: torch us':>14s} {'lists us':>9s} {'ratio':>6s}   "
          f"{'page indices: list us':>21s} {'array us':>9s} {'ratio':>6s}")
    for i, (name, query_lens, key) in enumerate(cases):
        step = pad_step(layout(query_lens, seed=i), key, PAD, PAGE)
        assert torch.equal(old_rows(step), new_rows(step)), name
        assert torch.equal(old_page_indices(step), new_page_indices(step)), name
        old, new = median_us(old_rows, step, args.repeats), median_us(new_rows, step, args.repeats)
        old_p, new_p = median_us(old_page_indices, step, args.repeats), median_us(new_page_indices, step, args.repeats)
        print(f"{name:24s} {old:14.1f} {new:9.1f} {old / new:5.1f}x   {old_p:21.1f} {new_p:9.1f} {old_p / new_p:5.1f}x")
    host_extras(max(20, args.repeats // 10))
    whole_layout(args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
