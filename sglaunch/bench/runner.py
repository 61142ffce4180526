"""One level against one endpoint: closed-loop concurrency or open-loop Poisson arrivals."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import httpx

from sglaunch.bench.client import RequestResult, SamplingSettings, send
from sglaunch.bench.workload import BenchRequest, poisson_offsets

WARMUP_MAX_TOKENS = 16


@dataclass(frozen=True)
class Level:
    """kind "concurrency": `value` clients each send the next request when theirs finishes;
    kind "rate": requests arrive as a Poisson process of `value` per second (inf: all at once),
    optionally capped at `max_concurrency` in flight."""

    kind: str
    value: float
    max_concurrency: int | None = None

    @property
    def label(self) -> str:
        if self.kind == "concurrency":
            return f"c={int(self.value)}"
        return "rate=inf" if math.isinf(self.value) else f"rate={self.value:g}/s"

    def json_value(self) -> float | int | str:
        if self.kind == "concurrency":
            return int(self.value)
        return "inf" if math.isinf(self.value) else self.value


OnResult = Callable[[RequestResult], None]


async def run_level(client: httpx.AsyncClient, requests: Sequence[BenchRequest], level: Level,
                    settings: SamplingSettings, seed: int, on_result: OnResult) -> tuple[list, float]:
    """Send every request once; returns (results in request order, wall seconds)."""
    results: list[RequestResult | None] = [None] * len(requests)

    async def one(index: int) -> None:
        result = await send(client, requests[index], settings)
        results[index] = result
        on_result(result)

    start = time.perf_counter()
    if level.kind == "concurrency":
        await closed_loop(one, len(requests), int(level.value))
    else:
        await open_loop(one, poisson_offsets(len(requests), level.value, seed), level.max_concurrency)
    return results, time.perf_counter() - start


async def closed_loop(one, count: int, concurrency: int) -> None:
    """`concurrency` workers take request indices in order."""
    indices = iter(range(count))

    async def worker() -> None:
        for index in indices:
            await one(index)

    await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, count)))))


async def open_loop(one, offsets: Sequence[float], max_concurrency: int | None) -> None:
    """Start request i at offsets[i] seconds (later when `max_concurrency` are in flight)."""
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    start = time.perf_counter()

    async def gated(index: int) -> None:
        if gate is None:
            await one(index)
            return
        async with gate:
            await one(index)

    tasks = []
    for index, offset in enumerate(offsets):
        delay = start + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(gated(index)))
    await asyncio.gather(*tasks)


async def warm_up(client: httpx.AsyncClient, requests: Sequence[BenchRequest], count: int,
                  settings: SamplingSettings) -> list[RequestResult]:
    """`count` short requests (at most 16 output tokens), two at a time; results not reported."""
    results: list[RequestResult] = []
    for start in range(0, count, 2):
        batch = [requests[i % len(requests)] for i in range(start, min(start + 2, count))]
        results += await asyncio.gather(*(
            send(client, r, settings, max_tokens=min(r.output_len, WARMUP_MAX_TOKENS)) for r in batch))
    return results
