"""start_engine's AsyncEngine: streaming, concurrency, abort, refusals, server_info, shutdown."""

from __future__ import annotations

import asyncio

import pytest

from engine_helpers import PROMPTS, engine_config
from sglaunch.engine.interface import GenerateRequest, SamplingParams
from sglaunch.engine.launch import generate_batch, start_engine

GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)


async def collect(engine, request):
    tokens, last = [], None
    async for out in engine.generate(request):
        tokens.extend(out.new_token_ids)
        last = out
    return tokens, last


def test_streams_concurrent_requests_like_generate_batch(checkpoints):
    config = engine_config(checkpoints["qwen3"], max_running_requests=3, api_key="secret")
    expected = generate_batch(config, PROMPTS, GREEDY)

    async def main():
        engine = await start_engine(config)
        try:
            requests = [GenerateRequest(f"r{i}", tuple(p), GREEDY) for i, p in enumerate(PROMPTS * 4)]
            results = await asyncio.gather(*(collect(engine, r) for r in requests))
            info = engine.server_info()
        finally:
            await engine.shutdown()
        return results, info

    results, info = asyncio.run(main())
    assert [tokens for tokens, _ in results] == expected * 4
    last = results[0][1]
    assert last.finished and last.finish_reason == "length"
    assert last.prompt_tokens == len(PROMPTS[0]) and last.completion_tokens == 8
    assert results[4][1].cached_tokens > 0  # same prompt again: served from the radix cache
    assert info["context_length"] == 256 and info["eos_token_ids"] == []
    assert info["max_total_num_tokens"] == 4096 and info["total_generated_tokens"] == 8 * 16
    assert info["num_running_requests"] == 0 and "kv_usage" in info
    assert "secret" not in str(info)


def test_refusals_and_abort(checkpoints):
    config = engine_config(checkpoints["llama"], context_length=32)

    async def main():
        engine = await start_engine(config)
        try:
            with pytest.raises(ValueError, match="context length"):
                await collect(engine, GenerateRequest("long", tuple(range(40)), GREEDY))
            endless = SamplingParams(max_new_tokens=10_000, temperature=0.0, ignore_eos=True)
            stream = engine.generate(GenerateRequest("gone", (1, 2, 3), endless))
            await stream.__anext__()
            await stream.aclose()  # a client that disconnects
            for _ in range(100):
                if engine.server_info()["num_running_requests"] == 0:
                    break
                await asyncio.sleep(0.02)
            info = engine.server_info()
            aborted = engine.generate(GenerateRequest("later", (4, 5), endless))
            first = await aborted.__anext__()
            await engine.abort("later")
            rest = [out async for out in aborted]
        finally:
            await engine.shutdown()
        return info, first, rest

    info, first, rest = asyncio.run(main())
    assert info["num_running_requests"] == 0 and info["num_waiting_requests"] == 0
    assert len(first.new_token_ids) == 1
    assert rest[-1].finished and rest[-1].finish_reason == "abort"


def test_startup_errors_surface_as_value_error(tmp_path):
    config = engine_config(tmp_path / "missing")
    with pytest.raises(ValueError, match="not a folder"):
        asyncio.run(start_engine(config))


def test_tp2_engine_survives_idle_time_and_shuts_down(checkpoints):
    config = engine_config(checkpoints["llama"], tp_size=2)

    async def main():
        engine = await start_engine(config)
        try:
            await asyncio.sleep(3)  # longer than the keepalive interval
            return await collect(engine, GenerateRequest("r", tuple(PROMPTS[0]), GREEDY))
        finally:
            await engine.shutdown()

    tokens, last = asyncio.run(main())
    assert tokens == generate_batch(engine_config(checkpoints["llama"]), [PROMPTS[0]], GREEDY)[0]
