"""POST/GET /flush_cache against a real server and engine: it empties the prefix cache (the same
prompt is computed anew, the pool is whole again, /server_info and /metrics say so), and while
requests are in flight it flushes nothing, answers 400 saying why, and the requests go on."""

from __future__ import annotations

import json
import re
import threading
import time

import httpx
import pytest

from .checkpoints import build_llama
from .conftest import MODEL_NAME, running_server

CONTEXT = 1024  # room for streams long enough to still run while /flush_cache is asked
PROMPT = [(7 * j) % 300 + 3 for j in range(40)]  # token ids: exact prompt lengths


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("flush-llama")
    build_llama(folder, max_position_embeddings=CONTEXT)
    with running_server(folder, tmp_path_factory.mktemp("logs"), enable_metrics=True, context_length=CONTEXT,
                        max_total_tokens=4096) as srv:
        yield srv


def complete(server, prompt=PROMPT, max_tokens=8) -> dict:
    reply = httpx.post(f"{server.base_url}/v1/completions", timeout=60, json={
        "model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})
    assert reply.status_code == 200, reply.text
    return reply.json()


def cached(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


def live(server) -> dict:
    return httpx.get(f"{server.base_url}/server_info").json()["internal_states"][0]


def idle_live(server) -> dict:
    info, deadline = live(server), time.monotonic() + 10
    while (info["num_running_requests"] or info["num_waiting_requests"]) and time.monotonic() < deadline:
        time.sleep(0.05)
        info = live(server)
    return info


def metrics(server) -> dict[str, float]:
    text = httpx.get(f"{server.base_url}/metrics").text
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^sglang:(\w+)\{[^}]*\} (\S+)$", text, re.M)}


def flush(server, method: str = "POST") -> httpx.Response:
    return httpx.request(method, f"{server.base_url}/flush_cache", timeout=30)


def test_flush_makes_a_cached_prompt_uncached_and_frees_the_pool(server):
    first = flush(server)
    assert first.status_code == 200, first.text
    pool = first.json()["num_pages"]
    assert first.json()["free_pages"] == pool  # idle and empty: the whole pool, as after start-up

    cold = complete(server)
    assert cached(cold) == 0
    warm = complete(server)
    assert cached(warm) == len(PROMPT) - 1  # every page but the last token's (its logits are needed)
    held = idle_live(server)
    assert held["kv_cached_tokens"] > 0 and held["kv_evictable_tokens"] == held["kv_cached_tokens"]
    flushes = held["total_cache_flushes"]
    assert metrics(server)["num_evictable_tokens"] == held["kv_cached_tokens"]

    reply = flush(server)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["message"] == "Cache flushed."
    assert body["freed_tokens"] == held["kv_cached_tokens"] and body["freed_pages"] > 0
    assert body["free_pages"] == body["num_pages"] == pool
    after = live(server)  # NOTE: no wait: the answer carried the statistics after the flush
    assert (after["kv_cached_tokens"], after["kv_evictable_tokens"], after["kv_used_tokens"]) == (0, 0, 0)
    assert after["total_cache_flushes"] == flushes + 1
    gauges = metrics(server)
    assert gauges["num_evictable_tokens"] == 0 and gauges["token_usage"] == 0 and gauges["num_used_tokens"] == 0

    again = complete(server)
    assert cached(again) == 0  # computed anew
    assert again["choices"][0]["text"] == cold["choices"][0]["text"]  # and the same greedy tokens
    assert cached(complete(server)) == len(PROMPT) - 1  # and cached again

    assert flush(server, "GET").status_code == 200  # SGLang accepts both methods
    assert cached(complete(server)) == 0
    assert re.search(r"INFO sglaunch\.engine\.engine: flushed the prefix cache: [1-9]\d* pages freed", server.log())


def test_requests_in_flight_refuse_the_flush_and_go_on(server):
    """Two long streams run: /flush_cache answers 400 naming them (nothing flushed: a prompt
    cached before stays cached), the streams finish whole, then the flush goes through."""
    assert flush(server).status_code == 200
    assert cached(complete(server)) == 0  # PROMPT is cached now
    max_tokens = CONTEXT - len(PROMPT) - 8
    started, results = threading.Barrier(3, timeout=60), []

    def stream(offset: int) -> None:
        prompt = [t + offset for t in PROMPT[:12]]
        events, usage, finish = 0, None, None
        with httpx.stream("POST", f"{server.base_url}/v1/completions", timeout=120, json={
                "model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}) as response:
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                events += 1
                if events == 1:
                    started.wait()
                event = json.loads(line[6:])
                usage = event.get("usage") or usage
                for choice in event.get("choices") or ():
                    finish = choice.get("finish_reason") or finish
        results.append((usage, finish))

    threads = [threading.Thread(target=stream, args=(offset,)) for offset in (1, 2)]
    for thread in threads:
        thread.start()
    started.wait()  # both streams have their first token
    refused = flush(server)
    for thread in threads:
        thread.join(timeout=120)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "requests_in_flight"
    assert "2 request(s) in flight" in error["message"] and "Retry once the server is idle" in error["message"]
    assert [(u["completion_tokens"], f) for u, f in results] == [(max_tokens, "length")] * 2

    assert cached(complete(server)) == len(PROMPT) - 1  # the refused flush dropped nothing
    idle_live(server)
    assert flush(server).status_code == 200
    assert cached(complete(server)) == 0


def test_the_route_is_in_the_schema(server):
    paths = httpx.get(f"{server.base_url}/openapi.json").json()["paths"]
    assert set(paths["/flush_cache"]) == {"get", "post"}
    assert "400" in paths["/flush_cache"]["post"]["responses"]
