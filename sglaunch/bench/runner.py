"""One level against one endpoint: closed-loop concurrency or open-loop Poisson arrivals."""

from __future__ import annotations

import asyncio
import math
import os
import queue
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import httpx

from sglaunch.bench.client import RequestResult, SamplingSettings, send
from sglaunch.bench.workload import BenchRequest, poisson_offsets

WARMUP_MAX_TOKENS = 16
# One Python client process parses about one server-sent event per 40-120 us (httpx, h11 and
# anyio per socket read: benchmarks/http_frontend_ceiling.py), so one process streaming 64
# requests can be what limits a fast server. Levels with more streams in flight than this are
# spread over client processes, at most one per CLIENT_PROCESS_CORES cores (the server measured
# may share the machine) and MAX_CLIENT_PROCESSES in all.
STREAMS_PER_CLIENT_PROCESS = 16
CLIENT_PROCESS_CORES = 4
MAX_CLIENT_PROCESSES = 8
SHARD_START_TIMEOUT_S = 120.0


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


def in_flight(level: Level, count: int) -> int:
    """The most requests a level has in flight at once."""
    if level.kind == "concurrency":
        return max(1, min(int(level.value), count))
    return max(1, min(level.max_concurrency or count, count))


def client_processes(level: Level, count: int, cores: int | None = None) -> int:
    """How many client processes stream a level (1: this process alone)."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    wanted = math.ceil(in_flight(level, count) / STREAMS_PER_CLIENT_PROCESS)
    return max(1, min(wanted, cores // CLIENT_PROCESS_CORES, MAX_CLIENT_PROCESSES))


async def run_level(client: httpx.AsyncClient, requests: Sequence[BenchRequest], level: Level,
                    settings: SamplingSettings, seed: int, on_result: OnResult,
                    processes: int | None = None) -> tuple[list, float]:
    """Send every request once; returns (results in request order, wall seconds).

    `processes` (default: client_processes()) > 1 spreads the level over that many client
    processes, each with its own connections and event loop: the same requests, the same
    closed loop (workers share one request counter) or the same arrival times, each request
    timed where it is streamed (perf_counter is one clock for every process of the machine)."""
    processes = client_processes(level, len(requests)) if processes is None else processes
    if processes > 1 and in_flight(level, len(requests)) > 1:
        return await _run_sharded(client, requests, level, settings, seed, on_result,
                                  min(processes, in_flight(level, len(requests))))
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


async def open_loop(one, offsets: Sequence[float], max_concurrency: int | None,
                    indices: Sequence[int] | None = None) -> None:
    """Start request i at offsets[i] seconds (later when `max_concurrency` are in flight), for
    every i, or for those of `indices` (one client process's share)."""
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    start = time.perf_counter()

    async def gated(index: int) -> None:
        if gate is None:
            await one(index)
            return
        async with gate:
            await one(index)

    tasks = []
    for index in range(len(offsets)) if indices is None else indices:
        delay = start + offsets[index] - time.perf_counter()
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


# ---------------------------------------------------------------- a level over client processes


@dataclass(frozen=True)
class _Shard:
    """What one client process needs: its share of the level and how to reach the server."""

    index: int
    processes: int
    base_url: str
    headers: dict
    timeout: dict
    requests: tuple
    level: Level
    settings: SamplingSettings
    offsets: tuple | None  # rate levels: every request's arrival offset


def _share(total: int, index: int, processes: int) -> int:
    return len(range(index, total, processes))


async def _run_sharded(client: httpx.AsyncClient, requests: Sequence[BenchRequest], level: Level,
                       settings: SamplingSettings, seed: int, on_result: OnResult,
                       processes: int) -> tuple[list, float]:
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    outbox, go, counter = context.Queue(), context.Event(), context.Value("q", 0)
    offsets = tuple(poisson_offsets(len(requests), level.value, seed)) if level.kind == "rate" else None
    shards = [_Shard(i, processes, str(client.base_url), dict(client.headers), client.timeout.as_dict(),
                     tuple(requests), level, settings, offsets) for i in range(processes)]
    workers = [context.Process(target=_shard_main, args=(shard, counter, outbox, go), daemon=True,
                               name=f"sglaunch-bench-client-{shard.index}") for shard in shards]
    for worker in workers:
        worker.start()
    results: list[RequestResult | None] = [None] * len(requests)
    try:
        ready = 0
        while ready < processes:
            kind, payload = await _next_message(outbox, workers, SHARD_START_TIMEOUT_S)
            if kind == "failed":
                raise RuntimeError(f"a bench client process failed: {payload}")
            ready += kind == "ready"
        start = time.perf_counter()
        go.set()
        done = 0
        while done < len(requests):
            kind, payload = await _next_message(outbox, workers, None)
            if kind == "failed":
                raise RuntimeError(f"a bench client process failed: {payload}")
            if kind == "result":
                index, result = payload
                results[index] = result
                on_result(result)
                done += 1
        duration = time.perf_counter() - start
    finally:
        for worker in workers:
            worker.join(10)
            if worker.is_alive():
                worker.kill()
                worker.join()
    return results, duration


async def _next_message(outbox, workers, timeout_s: float | None):
    """The next message of the client processes; RuntimeError if they all died (or timed out)."""
    loop = asyncio.get_running_loop()
    waited = 0.0
    while True:
        try:
            return await loop.run_in_executor(None, outbox.get, True, 0.5)
        except queue.Empty:
            waited += 0.5
            if not any(worker.is_alive() for worker in workers):
                raise RuntimeError("the bench client processes exited before sending every result") from None
            if timeout_s is not None and waited >= timeout_s:
                raise RuntimeError("the bench client processes did not start in time") from None


def _shard_main(shard: _Shard, counter, outbox, go) -> None:
    """One client process: its share of the streams, results sent back as they finish."""
    try:
        try:
            from uvloop import run  # a lighter event loop for the client, when installed
        except ImportError:
            run = asyncio.run
        run(_shard_level(shard, counter, outbox, go))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the level
        outbox.put(("failed", f"{type(exc).__name__}: {exc}"))


async def _shard_level(shard: _Shard, counter, outbox, go) -> None:
    level, requests = shard.level, shard.requests
    streams = _share(in_flight(level, len(requests)), shard.index, shard.processes)
    limits = httpx.Limits(max_connections=streams + 8, max_keepalive_connections=streams + 8)
    async with httpx.AsyncClient(base_url=shard.base_url, headers=shard.headers,
                                 timeout=httpx.Timeout(**shard.timeout), limits=limits) as client:

        async def one(index: int) -> None:
            outbox.put(("result", (index, await send(client, requests[index], shard.settings))))

        outbox.put(("ready", shard.index))
        await asyncio.get_running_loop().run_in_executor(None, go.wait)
        if level.kind == "concurrency":
            def take() -> int | None:
                with counter.get_lock():
                    index = counter.value
                    counter.value += 1
                return index if index < len(requests) else None

            async def worker() -> None:
                while (index := take()) is not None:
                    await one(index)

            await asyncio.gather(*(worker() for _ in range(max(1, streams))))
        else:
            mine = range(shard.index, len(requests), shard.processes)
            await open_loop(one, shard.offsets, streams if level.max_concurrency else None, indices=mine)
