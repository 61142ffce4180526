"""A bounded soak of a real `sglaunch serve` on 127.0.0.1 (issue 18).

N requests at concurrency C, a fixed seed: completions, chat and /generate, streamed and not,
with a share of clients that disconnect part-way and a share of hostile bodies (each must get a
4xx). At the end the server must be idle again (no running or waiting request, KV back to cached
prefixes only) and a greedy request must answer exactly as before. Reports completed / errors /
hangs, the idle state, the server's RSS growth (after a warm-up) and the wall time.

    python benchmarks/soak.py --requests 10000 --concurrency 64 --disconnect 0.3
    python benchmarks/soak.py --model-path /path/to/checkpoint --json soak.json

Without --model-path it builds the tiny random-weight Llama of the server tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
LAUNCH = ("import json, sys\nfrom sglaunch.config import EngineConfig\nfrom sglaunch.server.launch import "
          "run_server\nsys.exit(run_server(EngineConfig(**json.loads(sys.argv[1]))))\n")
WORDS = ("the quick brown fox jumps over a lazy dog while large language models serve many "
         "clients at once with continuous batching and a paged cache").split()
GREEDY = {"prompt": "The quick brown fox", "max_tokens": 16, "temperature": 0, "ignore_eos": True}
HOSTILE = [  # (route, raw body): each must get a 4xx, never a 5xx or a dead server
    ("/v1/completions", '{"prompt": "hi", "top_k": 100000000000000000000, "temperature": 1}'),
    ("/v1/completions", '{"prompt": "abc\\ud800def"}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x\\udfff"}]}'),
    ("/generate", '{"text": "hi", "sampling_params": {"temperature": NaN}}'),
    ("/v1/completions", '{"prompt": [1, 2, 99999999]}'),
    ("/v1/completions", '{"prompt": "hi", "max_tokens": 1e400}'),
    ("/generate", '{"text": ' + "[" * 5000 + "]" * 5000 + "}"),
]


@dataclass
class Tally:
    completed: int = 0
    disconnected: int = 0
    refused_as_expected: int = 0  # hostile bodies answered with a 4xx
    errors: int = 0
    hangs: int = 0
    error_samples: list = field(default_factory=list)

    def error(self, what: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 10:
            self.error_samples.append(what)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_server(model_path: Path, context_length: int, log_path: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    config = dict(model_path=str(model_path), tokenizer_path=str(model_path), served_model_name="soak",
                  dtype="float32", kv_cache_dtype="float32", context_length=context_length,
                  host="127.0.0.1", port=port, device="cpu", max_total_tokens=16384, log_level="warning")
    env = {**os.environ, "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, json.dumps(config)], cwd=REPO_ROOT, env=env,
                            stdout=open(log_path, "wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}:\n{log_path.read_text()}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("the server did not become healthy")


def request_plan(rng: random.Random, disconnect: float, hostile: float) -> dict:
    roll = rng.random()
    if roll < hostile:
        route, body = rng.choice(HOSTILE)
        return {"kind": "hostile", "route": route, "body": body}
    route = rng.choice(["/v1/completions", "/v1/chat/completions", "/generate"])
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40)))
    tokens = rng.randint(1, 32)
    sampling = {"temperature": rng.choice([0, 0.7, 1.0]), "top_p": rng.choice([1.0, 0.9]),
                "top_k": rng.choice([-1, 20]), "seed": rng.randint(0, 2**31)}
    if route == "/generate":
        body = {"text": text, "sampling_params": {"max_new_tokens": tokens, **sampling}}
    elif route == "/v1/chat/completions":
        body = {"messages": [{"role": "user", "content": text}], "max_tokens": tokens, **sampling}
    else:
        body = {"prompt": text, "max_tokens": tokens, **sampling}
    body["stream"] = rng.random() < 0.5
    cut = rng.random() < disconnect
    return {"kind": "cut" if cut else "full", "route": route, "body": body,
            "cut_after": rng.randint(1, 4), "cut_seconds": rng.uniform(0.0, 0.2)}


async def run_one(client: httpx.AsyncClient, plan: dict, tally: Tally, timeout: float) -> None:
    try:
        await asyncio.wait_for(_send(client, plan, tally), timeout)
    except asyncio.TimeoutError:
        tally.hangs += 1
    except httpx.HTTPError as exc:
        tally.error(f"{plan['route']}: {type(exc).__name__}: {exc}")


async def _send(client: httpx.AsyncClient, plan: dict, tally: Tally) -> None:
    route = plan["route"]
    if plan["kind"] == "hostile":
        reply = await client.post(route, content=plan["body"], headers={"Content-Type": "application/json"})
        if 400 <= reply.status_code < 500:
            tally.refused_as_expected += 1
        else:
            tally.error(f"hostile {route}: {reply.status_code} {reply.text[:120]}")
        return
    body = plan["body"]
    if body["stream"]:
        events = 0
        async with client.stream("POST", route, json=body) as reply:
            if reply.status_code != 200:
                tally.error(f"{route}: {reply.status_code} {(await reply.aread())[:120]!r}")
                return
            async for line in reply.aiter_lines():
                if not line.startswith("data: "):
                    continue
                events += 1
                if plan["kind"] == "cut" and events >= plan["cut_after"]:
                    tally.disconnected += 1
                    return  # leaving the block closes the connection mid-stream
                if line == "data: [DONE]":
                    tally.completed += 1
                    return
                if '"error"' in line[:20]:
                    tally.error(f"{route}: error event {line[:160]}")
                    return
        tally.error(f"{route}: stream ended without [DONE]")
        return
    if plan["kind"] == "cut":
        task = asyncio.ensure_future(client.post(route, json=body))
        await asyncio.sleep(plan["cut_seconds"])
        if not task.done():
            task.cancel()  # closes the connection: the server must abort the engine request
            await asyncio.gather(task, return_exceptions=True)
            tally.disconnected += 1
            return
        reply = task.result()
    else:
        reply = await client.post(route, json=body)
    if reply.status_code == 200:
        tally.completed += 1
    else:
        tally.error(f"{route}: {reply.status_code} {reply.text[:120]}")


async def soak(url: str, requests: int, concurrency: int, disconnect: float, hostile: float, seed: int,
               timeout: float, on_warm) -> Tally:
    rng = random.Random(seed)
    plans = [request_plan(rng, disconnect, hostile) for _ in range(requests)]
    tally = Tally()
    queue: asyncio.Queue = asyncio.Queue()
    for i, plan in enumerate(plans):
        queue.put_nowait((i, plan))
    warm_at = max(1, requests // 10)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:
        async def worker() -> None:
            while not queue.empty():
                i, plan = queue.get_nowait()
                if i == warm_at:
                    on_warm()
                await run_one(client, plan, tally, timeout)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return tally


def engine_state(url: str) -> dict:
    return httpx.get(f"{url}/server_info", timeout=30).json()["internal_states"][0]


def wait_until_idle(url: str, within_s: float = 60) -> dict:
    """The engine with no request left and KV holding only cached prefixes (or None if not)."""
    deadline = time.monotonic() + within_s
    while True:
        state = engine_state(url)
        idle = (state["num_running_requests"] == 0 and state["num_waiting_requests"] == 0
                and state["kv_used_tokens"] == 0)  # held by no request: only evictable cached prefixes
        if idle or time.monotonic() > deadline:
            return {"idle": idle, **{k: state[k] for k in ("num_running_requests", "num_waiting_requests",
                                                           "kv_used_tokens", "kv_cached_tokens")}}
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--disconnect", type=float, default=0.3, help="share of clients that leave early")
    parser.add_argument("--hostile", type=float, default=0.05, help="share of hostile bodies")
    parser.add_argument("--seed", type=int, default=18)
    parser.add_argument("--timeout", type=float, default=300, help="seconds before a request counts as a hang")
    parser.add_argument("--model-path", type=Path, help="default: the tests' tiny random-weight Llama")
    parser.add_argument("--context-length", type=int, default=256)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        model_path = args.model_path
        if model_path is None:
            sys.path.insert(0, str(REPO_ROOT))
            from tests.server.checkpoints import build_llama

            model_path = Path(tmp) / "tiny-llama"
            build_llama(model_path, max_position_embeddings=args.context_length)
        log_path = Path(tmp) / "server.log"
        proc, url = start_server(model_path, args.context_length, log_path)
        try:
            before = httpx.post(f"{url}/v1/completions", json=GREEDY, timeout=120).json()["choices"][0]["text"]
            rss = {"warm": rss_mib(proc.pid)}
            start = time.perf_counter()
            tally = asyncio.run(soak(url, args.requests, args.concurrency, args.disconnect, args.hostile,
                                     args.seed, args.timeout,
                                     on_warm=lambda: rss.__setitem__("warm", rss_mib(proc.pid))))
            wall = time.perf_counter() - start
            idle = wait_until_idle(url)
            after = httpx.post(f"{url}/v1/completions", json=GREEDY, timeout=120).json()["choices"][0]["text"]
            rss["end"] = rss_mib(proc.pid)
            alive = proc.poll() is None
        finally:
            proc.send_signal(signal.SIGTERM)
            exit_code = proc.wait(120)
        result = {
            "requests": args.requests, "concurrency": args.concurrency, "disconnect": args.disconnect,
            "hostile": args.hostile, "seed": args.seed, **asdict(tally), "wall_s": round(wall, 1),
            "requests_per_s": round(args.requests / wall, 1), **idle,
            "rss_warm_mib": round(rss["warm"], 1), "rss_end_mib": round(rss["end"], 1),
            "rss_growth_mib": round(rss["end"] - rss["warm"], 1), "greedy_unchanged": before == after,
            "server_alive_at_end": alive, "exit_code_after_sigterm": exit_code,
        }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    ok = (tally.errors == 0 and tally.hangs == 0 and idle["idle"] and before == after and alive
          and exit_code == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
