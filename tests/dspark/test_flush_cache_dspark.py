"""LLMEngine.flush_cache (/flush_cache) on a DSpark engine, one rank and two: the radix cache's
pages, which carry the drafter's context K/V at the same slots, all go back to the pool, so it is
as free as after start-up; later prompts are computed anew (no cached tokens) and decode exactly
as plain decoding; while a request waits nothing is flushed. The pages live on rank 0 alone, so
with two ranks nothing is sent to the other one and the next steps still match."""

from __future__ import annotations

import pytest

from dspark_helpers import engine_config, prompts
from sglaunch.engine.interface import GenerateRequest, SamplingParams
from sglaunch.engine.launch import create_engine, generate_batch


def greedy(max_new_tokens: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)


def run(engine, batch: list[list[int]], tag: str) -> tuple[list[list[int]], list[int]]:
    """Every request to the end: each one's tokens and cached prompt tokens, in batch order."""
    rids = [f"{tag}-{i}" for i in range(len(batch))]
    for rid, prompt in zip(rids, batch):
        engine.add_request(GenerateRequest(rid, tuple(prompt), greedy(16)))
    tokens, cached = {rid: [] for rid in rids}, {}
    while engine.has_work:
        for out in engine.step():
            tokens[out.rid].extend(out.new_token_ids)
            if out.finished:
                cached[out.rid] = out.cached_tokens
    return [tokens[rid] for rid in rids], [cached[rid] for rid in rids]


@pytest.mark.parametrize("tp_size", [1, 2])
def test_flush_cache_returns_every_cached_page_and_the_next_run_is_uncached(dspark_files, tp_size):
    batch = [p for p in prompts(6, seed=21) if len(p) > 2]
    expected = generate_batch(engine_config(dspark_files["target"]), batch, greedy(16))
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "compact", sps=dspark_files["sps"],
                           tp_size=tp_size, page_size=1 if tp_size == 1 else 2)
    engine, cluster = create_engine(config)
    try:
        pool = engine.allocator.num_pages
        assert engine.allocator.num_free == pool
        first, cold = run(engine, batch, "a")
        assert first == expected and engine.spec.stats.to_dict()["steps"] > 0  # it drafted
        _, warm = run(engine, batch, "b")
        assert all(w > c for w, c in zip(warm, cold))  # the prompts were cached
        cached_pages = engine.scheduler.radix.cached_pages
        assert cached_pages > 0 and engine.allocator.num_free == pool - cached_pages

        engine.add_request(GenerateRequest("waiting", tuple(batch[0]), greedy(4)))
        assert engine.flush_cache() == {"flushed": False, "running": 0, "waiting": 1}
        assert engine.scheduler.radix.cached_pages >= cached_pages  # nothing flushed
        while engine.has_work:
            engine.step()

        done = engine.flush_cache()
        assert done["flushed"] and done["freed_pages"] >= cached_pages  # the waiting request's pages too
        assert done["free_pages"] == done["num_pages"] == pool
        assert engine.allocator.num_free == pool and engine.scheduler.radix.cached_pages == 0
        assert engine.live_stats()["total_cache_flushes"] == 1
        again, cached = run(engine, batch, "c")
        assert again == expected and cached == cold  # computed anew, drafting over a fresh context
    finally:
        cluster.stop(engine)
