"""`--tokenizer-worker-num 2`: two HTTP worker processes in front of one engine process, against
real servers: the same greedy tokens as one server process, connections spread over both
workers, metrics summed over them, auth and limits on each, aborts free KV, SIGTERM drains, and
a dead engine or a dead worker ends the server non-zero with no process left behind."""

from __future__ import annotations

import asyncio
import collections
import os
import re
import signal
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from .checkpoints import build_llama
from .conftest import MODEL_NAME, RunningServer, engine_config, running_server, spawn_server, stop_server, wait_until_healthy
from .test_shutdown import alive, spawned_children

CONTEXT = 2048
API_KEY = "worker-test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPTS = [[(17 * i + 5 * j) % 200 + 3 for j in range(6 + i % 5)] for i in range(12)]


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("workers-llama")
    build_llama(folder, max_position_embeddings=CONTEXT)
    return folder


def overrides(**more) -> dict:
    return dict(context_length=CONTEXT, max_total_tokens=32768, api_key=API_KEY, **more)


@pytest.fixture(scope="module")
def server(llama, tmp_path_factory):
    """The shared two-worker server (the last test of the module stops it with SIGTERM)."""
    with running_server(llama, tmp_path_factory.mktemp("logs"), enable_metrics=True,
                        **overrides(tokenizer_worker_num=2)) as srv:
        yield srv


def start(checkpoint: Path, tmp_path: Path, **more) -> RunningServer:
    config = engine_config(checkpoint, **overrides(**more))
    log_path = tmp_path / "server.log"
    server = RunningServer(f"http://127.0.0.1:{config['port']}", spawn_server(config, log_path), log_path, config)
    try:
        wait_until_healthy(server)
    except BaseException:
        stop_server(server, signal.SIGKILL)
        raise
    return server


async def completions(base_url: str, prompts: list[list[int]], max_tokens: int = 16) -> list[str]:
    """Greedy completions of token-id prompts, all at once, through the openai client."""
    async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=API_KEY, max_retries=0) as client:
        replies = await asyncio.gather(*[
            client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                      extra_body={"ignore_eos": True}) for prompt in prompts])
    return [reply.choices[0].text for reply in replies]


async def workers_seen(base_url: str, connections: int) -> collections.Counter:
    """Which worker answered /server_info, over `connections` connections opened at once."""
    async def one() -> int:
        async with httpx.AsyncClient(headers=AUTH) as client:
            reply = await client.get(f"{base_url}/server_info")
            return reply.json()["tokenizer_worker"]["index"]

    return collections.Counter(await asyncio.gather(*[one() for _ in range(connections)]))


def worker_pids(server: RunningServer) -> set[int]:
    deadline = time.monotonic() + 30
    seen: set[int] = set()
    while len(seen) < 2 and time.monotonic() < deadline:
        with httpx.Client(headers=AUTH) as client:  # NOTE: a new connection each time
            seen.add(client.get(f"{server.base_url}/server_info").json()["tokenizer_worker"]["pid"])
    assert len(seen) == 2, seen
    return seen


def engine_pid(server: RunningServer) -> int:
    workers = worker_pids(server)
    (engine,) = [pid for pid in spawned_children(server.process.pid) if pid not in workers]
    return engine


def metric(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"^sglang:{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


class Stream:
    """A long streamed completion read on its own thread."""

    def __init__(self, base_url: str, max_tokens: int, stop_after: int | None = None):
        self.base_url, self.max_tokens, self.stop_after = base_url, max_tokens, stop_after
        self.events: list[str] = []
        self.started = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        body = {"model": MODEL_NAME, "prompt": [5, 6, 7, 8], "stream": True, "max_tokens": self.max_tokens,
                "ignore_eos": True}
        try:
            with httpx.stream("POST", f"{self.base_url}/v1/completions", json=body, headers=AUTH,
                              timeout=300) as reply:
                assert reply.status_code == 200, reply.read()
                for line in reply.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line[6:])
                        self.started.set()
                        if self.stop_after is not None and len(self.events) >= self.stop_after:
                            return  # NOTE: leaving the block closes the connection: a disconnect
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            self.started.set()

    def join(self) -> "Stream":
        self.thread.join(300)
        assert not self.thread.is_alive(), "stream never ended"
        return self

    def text(self) -> str:
        return " ".join(self.events)


def live(server: RunningServer) -> dict:
    return httpx.get(f"{server.base_url}/server_info", headers=AUTH).json()["internal_states"][0]


# ---------------------------------------------------------------- the shared two-worker server


def test_same_greedy_tokens_as_one_server_process(server, llama, tmp_path):
    spread = asyncio.run(completions(server.base_url, PROMPTS))
    with running_server(llama, tmp_path, **overrides()) as single:
        reference = asyncio.run(completions(single.base_url, PROMPTS))
    assert spread == reference
    assert all(spread)


def test_connections_are_spread_over_both_workers(server):
    seen = asyncio.run(workers_seen(server.base_url, 32))
    assert set(seen) == {0, 1}, seen
    assert "2 HTTP worker processes" in server.log()


def test_every_worker_serves_the_routes_with_auth_and_limits(server):
    for _ in range(6):  # NOTE: new connections, so both workers answer some
        with httpx.Client(base_url=server.base_url) as client:
            assert client.get("/health").status_code == 200
            assert client.get("/v1/models").status_code == 401
            assert client.get("/v1/models", headers=AUTH).json()["data"][0]["id"] == MODEL_NAME
            too_big = client.post("/v1/completions", headers=AUTH, content=b"x" * (9 * 2**20))
            assert too_big.status_code == 413
            info = client.get("/server_info", headers=AUTH).json()
            assert info["tokenizer_worker_num"] == 2 and "api_key" not in info


def test_metrics_are_totals_over_every_worker(server):
    def scrape() -> str:
        with httpx.Client(headers=AUTH) as client:
            return client.get(f"{server.base_url}/metrics").text

    before = scrape()
    prompts = PROMPTS[:8]
    asyncio.run(completions(server.base_url, prompts, max_tokens=5))
    for _ in range(4):  # NOTE: whichever worker answers, the totals are the same
        after = scrape()
        assert metric(after, "num_requests_total") - metric(before, "num_requests_total") == len(prompts)
        assert metric(after, "generation_tokens_total") - metric(before, "generation_tokens_total") == 5 * len(prompts)
        assert metric(after, "e2e_request_latency_seconds_count") - metric(before, "e2e_request_latency_seconds_count") == len(prompts)
        assert len(re.findall(r"^sglang:num_running_reqs\{", after, re.M)) == 1  # one engine, not summed


def test_a_stream_cut_by_its_client_frees_its_kv(server):
    streams = [Stream(server.base_url, max_tokens=1800, stop_after=3) for _ in range(4)]
    for stream in streams:
        stream.join()
        assert stream.error is None, stream.error
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = live(server)
        if state["num_running_requests"] == 0 and state["kv_used_tokens"] == 0:
            break
        time.sleep(0.1)
    assert state["num_running_requests"] == 0 and state["kv_used_tokens"] == 0, state


def test_flush_cache_through_any_worker_empties_the_one_engine_cache(server):
    """/flush_cache through either worker reaches the one engine and is answered on the asking
    worker's pipe: a stream through one worker refuses a flush asked through any (the engine counts
    every worker's requests); once idle it empties the cache, and every worker's statistics say so."""
    asyncio.run(completions(server.base_url, PROMPTS[:4], max_tokens=4))
    stream = Stream(server.base_url, max_tokens=1800)
    assert stream.started.wait(60)
    refusals = []
    for _ in range(6):  # NOTE: new connections, so both workers are asked
        with httpx.Client(base_url=server.base_url, headers=AUTH) as client:
            refusals.append(client.post("/flush_cache"))
    stream.join()
    assert stream.error is None and stream.events[-1] == "[DONE]", stream.error
    assert all(r.status_code == 400 and "1 request(s) in flight" in r.json()["error"]["message"] for r in refusals)
    assert httpx.post(f"{server.base_url}/flush_cache").status_code == 401
    deadline = time.monotonic() + 30
    while live(server)["num_running_requests"] and time.monotonic() < deadline:
        time.sleep(0.05)
    freed = []
    for _ in range(6):
        with httpx.Client(base_url=server.base_url, headers=AUTH) as client:
            reply = client.post("/flush_cache")
            assert reply.status_code == 200, reply.text
            freed.append(reply.json()["freed_pages"])
    assert freed[0] > 0 and freed[1:] == [0] * 5
    by_worker: dict[int, dict] = {}
    while len(by_worker) < 2 and time.monotonic() < deadline:
        info = httpx.get(f"{server.base_url}/server_info", headers=AUTH).json()
        by_worker[info["tokenizer_worker"]["pid"]] = info["internal_states"][0]
    assert len(by_worker) == 2
    assert all(s["kv_cached_tokens"] == 0 and s["kv_evictable_tokens"] == 0 for s in by_worker.values()), by_worker


def test_sigterm_drains_every_worker_then_stops_the_engine(server):
    """Last: stops the shared server."""
    children = spawned_children(server.process.pid)
    streams = [Stream(server.base_url, max_tokens=48) for _ in range(4)]
    for stream in streams:
        assert stream.started.wait(60)
    assert stop_server(server) == 0, server.log()
    for stream in streams:
        stream.join()
        assert stream.error is None, stream.error
        assert '"finish_reason":"length"' in stream.text() and stream.events[-1] == "[DONE]"
    assert not [pid for pid in children if alive(pid)]


# ---------------------------------------------------------------- a dead engine, a dead worker


def test_a_killed_engine_ends_every_worker_and_the_server_exits_non_zero(llama, tmp_path):
    server = start(llama, tmp_path, tokenizer_worker_num=2)
    try:
        engine = engine_pid(server)
        children = spawned_children(server.process.pid)
        stream = Stream(server.base_url, max_tokens=1800)
        assert stream.started.wait(60)
        os.kill(engine, signal.SIGKILL)
        code = server.process.wait(timeout=60)
        stream.join()
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()
    log = server.log()
    assert code == 1, log
    assert re.search(r"The engine stopped: the engine process \(pid \d+\) exited unexpectedly with signal SIGKILL", log), log
    assert "engine_error" in stream.text() or stream.error is not None
    assert not [pid for pid in children if alive(pid)]


def test_a_killed_worker_ends_the_server_non_zero(llama, tmp_path):
    server = start(llama, tmp_path, tokenizer_worker_num=2)
    try:
        children = spawned_children(server.process.pid)
        victim = min(worker_pids(server))
        os.kill(victim, signal.SIGKILL)
        code = server.process.wait(timeout=60)
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()
    log = server.log()
    assert code == 1, log
    assert re.search(rf"HTTP worker \d \(pid {victim}\) exited unexpectedly with signal SIGKILL", log), log
    assert not [pid for pid in children if alive(pid)]
