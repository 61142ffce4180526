"""A request the engine cannot run fails alone: the others in its batch, and every request after
it, are served exactly as without it (the server's validation normally stops such requests
first; these go to the engine directly, as a bug or a new field would)."""

from __future__ import annotations

import asyncio
import dataclasses
import math

import pytest

from sglaunch.config import EngineConfig
from sglaunch.engine.interface import GenerateRequest, SamplingParams

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
SEEDED = SamplingParams(max_new_tokens=12, temperature=0.8, top_k=40, seed=7, ignore_eos=True)
PROMPTS = {"a": (5, 6, 7, 8), "b": (9, 10, 11), "c": (12, 13, 14, 15, 16)}


def config_for(checkpoint) -> EngineConfig:
    return EngineConfig(model_path=str(checkpoint), tokenizer_path=str(checkpoint), served_model_name="t",
                        dtype="float32", kv_cache_dtype="float32", context_length=None,
                        max_total_tokens=4096, device="cpu")


@pytest.fixture(scope="module")
def engine(tiny_llama):
    import torch

    from sglaunch.engine.launch import create_engine

    threads = torch.get_num_threads()
    engine, cluster = create_engine(config_for(tiny_llama))
    yield engine
    cluster.stop(engine)
    # NOTE: a CPU rank flushes denormals in the thread that created it (this one); later tests
    # in this process (hypothesis's float strategies) need IEEE floats back
    torch.set_flush_denormal(False)
    torch.set_num_threads(threads)


def run(engine, requests):
    from sglaunch.engine.launch import run_requests

    return run_requests(engine, requests)


def healthy_requests(tag: str) -> list[GenerateRequest]:
    return [GenerateRequest(f"{tag}-a", PROMPTS["a"], GREEDY),
            GenerateRequest(f"{tag}-c", PROMPTS["c"], SEEDED)]


def test_a_request_that_cannot_be_sampled_fails_alone(engine):
    alone = run(engine, healthy_requests("alone"))
    nan = dataclasses.replace(SEEDED, temperature=math.nan)  # multinomial refuses NaN probabilities
    mixed = run(engine, [*healthy_requests("mixed"), GenerateRequest("bad", PROMPTS["b"], nan)])
    assert mixed["bad"].final.finish_reason == "abort"
    assert "probability" in mixed["bad"].final.error
    for name in ("a", "c"):
        assert mixed[f"mixed-{name}"].token_ids == alone[f"alone-{name}"].token_ids
        assert mixed[f"mixed-{name}"].final.error is None
    after = run(engine, healthy_requests("after"))
    assert [after[r].token_ids for r in ("after-a", "after-c")] == \
        [alone[r].token_ids for r in ("alone-a", "alone-c")]
    assert not engine.scheduler.running and not engine.requests  # nothing left holding pages


def test_a_failed_step_fails_the_requests_it_ran_and_frees_their_pages(engine):
    """What the engine process does when a step fails with no single request to blame (one rank)."""
    alone = run(engine, healthy_requests("clean"))
    free_before = engine.allocator.num_free + (engine.scheduler.radix.evictable_pages
                                               if engine.scheduler.radix else 0)
    for request in healthy_requests("doomed"):
        assert engine.add_request(request) == []
    engine.step()  # both admitted and running
    failed = engine.fail_running(RuntimeError("device lost"))
    assert sorted(out.rid for out in failed) == ["doomed-a", "doomed-c"]
    assert all(out.finished and out.finish_reason == "abort" and "device lost" in out.error for out in failed)
    assert not engine.has_work and not engine.requests
    free_after = engine.allocator.num_free + (engine.scheduler.radix.evictable_pages
                                              if engine.scheduler.radix else 0)
    assert free_after == free_before  # every page is free or an evictable cached prefix again
    again = run(engine, healthy_requests("again"))
    assert [again[r].token_ids for r in ("again-a", "again-c")] == \
        [alone[r].token_ids for r in ("clean-a", "clean-c")]


def test_a_huge_top_k_keeps_every_token(engine):
    off = run(engine, [GenerateRequest("off", PROMPTS["a"], dataclasses.replace(SEEDED, top_k=-1))])["off"]
    huge = run(engine, [GenerateRequest("huge", PROMPTS["a"], dataclasses.replace(SEEDED, top_k=10**20))])["huge"]
    assert huge.token_ids == off.token_ids and huge.final.error is None


def test_the_async_engine_keeps_serving_after_a_request_it_cannot_add_or_run(tiny_llama):
    from sglaunch.engine.launch import start_engine

    async def collect(engine, request):
        tokens = []
        async for out in engine.generate(request):
            tokens.extend(out.new_token_ids)
            if out.finished:
                return tokens, out

    async def scenario():
        engine = await start_engine(config_for(tiny_llama))
        try:
            before = await collect(engine, GenerateRequest("before", PROMPTS["a"], GREEDY))
            bad_seed = dataclasses.replace(SEEDED, seed=2**80)  # the generator cannot take it
            nan = dataclasses.replace(SEEDED, temperature=math.nan)
            results = await asyncio.gather(
                collect(engine, GenerateRequest("seed", PROMPTS["b"], bad_seed)),
                collect(engine, GenerateRequest("nan", PROMPTS["b"], nan)),
                collect(engine, GenerateRequest("during", PROMPTS["a"], GREEDY)),
                return_exceptions=True)
            after = await collect(engine, GenerateRequest("after", PROMPTS["a"], GREEDY))
            return before, results, after
        finally:
            await engine.shutdown()

    before, (seed_failure, nan_result, during), after = asyncio.run(scenario())
    assert isinstance(seed_failure, ValueError)  # refused alone (the server would answer 400)
    assert nan_result[1].error is not None and nan_result[1].finish_reason == "abort"
    assert during[0] == before[0] == after[0]
