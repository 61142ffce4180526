"""A level spread over client processes (issue 15: one Python client process can be what limits
a fast server): the same requests, every result back in request order, failures counted."""

from __future__ import annotations

import asyncio
import math

import httpx
from stub_server import Faults, StubServer

from sglaunch.bench.client import SamplingSettings
from sglaunch.bench.runner import Level, client_processes, run_level
from sglaunch.bench.workload import BenchRequest

SETTINGS = SamplingSettings(model="stub-model")


def requests(count: int) -> list[BenchRequest]:
    return [BenchRequest(list(range(1, 4 + i % 5)), None, 3 + i % 4) for i in range(count)]


def run(url: str, reqs, level: Level, processes: int):
    async def main():
        seen = []
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            results, duration = await run_level(client, reqs, level, SETTINGS, 0, seen.append, processes)
        return results, duration, seen

    return asyncio.run(main())


def test_auto_processes_follow_streams_and_cores():
    assert client_processes(Level("concurrency", 64), 256, cores=2) == 1  # a small machine: one
    assert client_processes(Level("concurrency", 64), 256, cores=16) == 4
    assert client_processes(Level("concurrency", 8), 256, cores=16) == 1
    assert client_processes(Level("concurrency", 256), 256, cores=128) == 8
    assert client_processes(Level("rate", math.inf), 48, cores=16) == 3
    assert client_processes(Level("rate", 10.0, max_concurrency=16), 48, cores=16) == 1


def test_closed_loop_over_processes_matches_one_process():
    reqs = requests(24)
    with StubServer() as stub:
        one, _, _ = run(stub.url, reqs, Level("concurrency", 6), 1)
        sharded, duration, seen = run(stub.url, reqs, Level("concurrency", 6), 3)
        assert stub.state.requests == 48
    assert duration > 0 and len(seen) == 24
    assert all(r.ok for r in sharded), [r.error for r in sharded if not r.ok]
    assert [r.output_tokens for r in sharded] == [r.output_tokens for r in one] == [q.output_len for q in reqs]
    assert all(r.ttft is not None and len(r.itls) == r.output_tokens - 1 for r in sharded)


def test_rate_level_over_processes_and_failures_are_counted():
    reqs = requests(12)
    with StubServer(Faults(fail_every=4)) as stub:
        results, _, seen = run(stub.url, reqs, Level("rate", 200.0, max_concurrency=4), 2)
    assert len(seen) == 12 and all(r is not None for r in results)
    failed = [r for r in results if not r.ok]
    assert len(failed) == 3 and all(r.error_kind == "http" and "500" in r.error for r in failed)
