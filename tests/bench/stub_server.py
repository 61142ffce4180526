"""A small OpenAI-compatible streaming endpoint (starlette + uvicorn in a thread) that injects faults.

Faults are chosen per request by its 1-based arrival number: HTTP 500 every `fail_every`-th, an
error event mid-stream every `midstream_every`-th, a stream cut before `[DONE]` every
`truncate_every`-th, a `slow_s` sleep before the first token every `slow_every`-th, and after
`die_after` requests the whole server stops listening (a crashed server). With `flush_cache` it
serves POST/GET /flush_cache (answering 400, busy, to the first `flush_busy` calls) and records
how many requests it had seen at each flush; without it, the route is not there (404), as on a
server that has none.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route


@dataclass
class Faults:
    fail_every: int = 0
    midstream_every: int = 0
    truncate_every: int = 0
    slow_every: int = 0
    slow_s: float = 0.0
    token_delay_s: float = 0.0
    die_after: int = 0
    tokenize: bool = False
    spec_stats: bool = False
    flush_cache: bool = False
    flush_busy: int = 0


@dataclass
class StubState:
    faults: Faults
    requests: int = 0
    bodies: list = field(default_factory=list)
    steps: int = 0
    histogram: dict = field(default_factory=lambda: {"1": 0, "2": 0, "3": 0})
    flush_calls: int = 0
    flushes: list = field(default_factory=list)  # `requests` at each successful /flush_cache
    server: uvicorn.Server | None = None


def hits(every: int, number: int) -> bool:
    return every > 0 and number % every == 0


def build_app(state: StubState) -> Starlette:
    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [{"id": "stub-model", "object": "model"}]})

    async def tokenize(request: Request):
        if not state.faults.tokenize:
            return JSONResponse({"error": {"message": "Not found"}}, status_code=404)
        body = await request.json()
        return JSONResponse({"tokens": [len(w) for w in body["prompt"].split()], "count": 0})

    async def server_info(request: Request):
        internal = {"num_running_requests": 0}
        if state.faults.spec_stats:  # shaped like sglaunch.speculative.stats.SpecStats.to_dict
            total = sum(state.histogram.values())
            internal["speculative_stats"] = {
                "steps": state.steps,
                "mean_accept_length": sum(int(k) * v for k, v in state.histogram.items()) / max(1, total),
                "accept_length_histogram": dict(state.histogram),
                "verify_tokens_per_step": 4.0}
        return JSONResponse({"status": "ready", "internal_states": [internal]})

    async def completions(request: Request):
        state.requests += 1
        number = state.requests
        body = await request.json()
        state.bodies.append(body)
        faults = state.faults
        if faults.die_after and number > faults.die_after:
            crash(state.server)
        if hits(faults.fail_every, number):
            return JSONResponse({"error": {"message": "injected failure", "type": "server_error"}},
                                status_code=500)
        prompt = body.get("prompt") or body.get("messages")
        prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        return StreamingResponse(events(state, number, body["max_tokens"], prompt_tokens),
                                 media_type="text/event-stream")

    async def flush_cache(request: Request):
        state.flush_calls += 1
        if state.flush_calls <= state.faults.flush_busy:
            return JSONResponse({"error": {"message": "Cache not flushed: 1 request(s) in flight",
                                           "type": "invalid_request_error"}}, status_code=400)
        state.flushes.append(state.requests)
        return JSONResponse({"message": "Cache flushed."})

    flush_routes = [Route("/flush_cache", flush_cache, methods=["GET", "POST"])] if state.faults.flush_cache else []
    return Starlette(routes=[
        Route("/v1/models", models), Route("/tokenize", tokenize, methods=["POST"]),
        Route("/server_info", server_info),
        Route("/metrics", lambda r: PlainTextResponse("# nothing\nup 1\n")),
        Route("/health", lambda r: PlainTextResponse("ok")),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", completions, methods=["POST"]),
        *flush_routes,
    ])


async def events(state: StubState, number: int, max_tokens: int, prompt_tokens: int):
    faults = state.faults
    if hits(faults.slow_every, number):
        await asyncio.sleep(faults.slow_s)
    for index in range(max_tokens):
        if faults.token_delay_s:
            await asyncio.sleep(faults.token_delay_s)
        if index == 1 and hits(faults.midstream_every, number):
            yield sse({"error": {"message": "injected mid-stream error"}})
            yield "data: [DONE]\n\n"
            return
        if index == 1 and hits(faults.truncate_every, number):
            return
        yield sse({"choices": [{"index": 0, "text": f" t{index}", "finish_reason": None}]})
    state.steps += max_tokens
    state.histogram["2"] += max_tokens
    yield sse({"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens}})
    yield "data: [DONE]\n\n"


def crash(server: uvicorn.Server) -> None:
    """Stop listening and cut every open connection, as a crashed process would."""
    for listener in server.servers:
        listener.close()
    for connection in list(server.server_state.connections):
        connection.transport.abort()


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class StubServer:
    """Context manager: serves in a daemon thread; `url` is its base URL."""

    def __init__(self, faults: Faults | None = None):
        self.state = StubState(faults or Faults())
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(build_app(self.state), host="127.0.0.1", port=self.port,
                                log_level="error", lifespan="off")
        self.state.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.state.server.run, daemon=True)

    def __enter__(self) -> "StubServer":
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.state.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("stub server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.state.server.should_exit = True
        self.thread.join(timeout=10)


def main(argv: list[str] | None = None) -> int:
    """As a process (a launch line for `sglaunch bench`): serve on --port until SIGINT or SIGTERM,
    after printing `stub pid PID on PORT` (tests tell server processes apart by it)."""
    import argparse
    import os

    parser = argparse.ArgumentParser(description="the bench tests' stub endpoint as a process")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token-delay-s", type=float, default=0.0)
    args = parser.parse_args(argv)
    state = StubState(Faults(token_delay_s=args.token_delay_s))
    print(f"stub pid {os.getpid()} on {args.port}", flush=True)
    state.server = uvicorn.Server(uvicorn.Config(build_app(state), host="127.0.0.1", port=args.port,
                                                 log_level="error", lifespan="off"))
    state.server.run()  # NOTE: uvicorn stops on SIGINT / SIGTERM
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
