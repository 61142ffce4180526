"""Plain decoding over HTTP against the same engine's in-process closed loop, in one run.

    python benchmarks/http_vs_inprocess.py [--model CHECKPOINT] [--device cuda|cpu]
        [--concurrency 64] [--requests N] [--prompt-len 64] [--new-tokens 128] [--repeats 1]
        [--client-processes N] [--dtype bfloat16] [--out results.json] [--server-arg FIELD=JSON ...]

On the H200: python benchmarks/http_vs_inprocess.py --device cuda --model SMOLLM2_DIR

Both sides see the same requests: random token-id prompts of --prompt-len tokens, --new-tokens
tokens each, EOS ignored, greedy, no radix cache, --concurrency requests in flight (a closed
loop: a new request starts as soon as one finishes), --requests in all (default 4 x
concurrency).
  http        `run_server` (as `sglaunch serve` calls it) in a subprocess: the HTTP process, and
              the engine process behind it; the clients stream /v1/completions with token-id
              prompts (sglaunch bench's closed loop over httpx, the concurrency shared by
              --client-processes processes so the client is not what limits); output tokens
              counted from each stream's usage chunk
  in-process  create_engine in this process, with the same EngineConfig: add_request / step,
              topping the batch up to --concurrency whenever a request finishes
Each side warms up first (one round of --concurrency short requests), then is timed; with
--repeats > 1 the sides alternate and the median is kept. Prints output tok/s of both and the
ratio http / in-process (issue 15's target: within 10% at concurrency 64). Without --model, a
small random-weight Llama (tests/server/checkpoints.py) is built in a temporary folder.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAUNCH_SNIPPET = (
    "import json, sys\n"
    "from sglaunch.config import EngineConfig\n"
    "from sglaunch.server.launch import run_server\n"
    "sys.exit(run_server(EngineConfig(**json.loads(sys.argv[1]))))\n"
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="checkpoint folder (default: a small random-weight Llama)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=None, help="default: 4 x concurrency")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--client-processes", type=int, default=max(1, min(4, (os.cpu_count() or 1) // 4)),
                        help="HTTP client processes sharing the concurrency (default: cores / 4, 1 to 4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    parser.add_argument("--server-arg", action="append", default=[], metavar="FIELD=VALUE",
                        help="an extra EngineConfig field for both sides (JSON value), e.g. cuda_graph_max_bs=64")
    args = parser.parse_args(argv)
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    args.requests = args.requests or 4 * args.concurrency
    return args


def log(message: str) -> None:
    print(f"[http_vs_inprocess] {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- the workload


def build_tiny_llama(folder: Path) -> None:
    spec = importlib.util.spec_from_file_location("bench_checkpoints", ROOT / "tests/server/checkpoints.py")
    checkpoints = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checkpoints)
    checkpoints.build_llama(folder, max_position_embeddings=1024)


def engine_fields(args, model: Path) -> dict:
    """The EngineConfig both sides run (JSON-able: the server gets it on its command line)."""
    fields = dict(model_path=str(model), tokenizer_path=str(model), served_model_name="bench", context_length=None,
                  dtype=args.dtype, kv_cache_dtype=args.dtype, device=args.device,
                  disable_radix_cache=True, max_running_requests=max(args.concurrency, 1),
                  max_total_tokens=(args.concurrency + 8) * (args.prompt_len + args.new_tokens + 16),
                  host="127.0.0.1", log_level="warning")
    if args.device == "cuda":  # NOTE: as `serve` resolves it; EngineConfig's own default is the
        # torch backend without graphs (session 8's run measured that by mistake: ~40 ms a step)
        fields["attention_backend"] = "flashinfer"
    for item in args.server_arg:
        key, _, value = item.partition("=")
        fields[key] = json.loads(value)
    return fields


def make_prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(count)]


def vocab_size(model: Path) -> int:
    config = json.loads((model / "config.json").read_text())
    return int(config.get("text_config", config)["vocab_size"])


# ----------------------------------------------------------------------------- over HTTP


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """run_server in a subprocess; stopped with SIGTERM."""

    def __init__(self, fields: dict, log_path: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        self.log_path = log_path
        with open(log_path, "wb") as out:
            self.process = subprocess.Popen([sys.executable, "-c", LAUNCH_SNIPPET,
                                             json.dumps({**fields, "port": self.port})],
                                            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)

    def wait_healthy(self, timeout: float = 600) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log_path.read_text()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError("server not healthy in time")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


async def http_closed_loop(url: str, prompts: list[list[int]], new_tokens: int, concurrency: int) -> int:
    """Stream every prompt through /v1/completions, `concurrency` at a time; -> output tokens."""
    import httpx

    from sglaunch.bench.runner import closed_loop

    tokens = [0] * len(prompts)
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        async def one(index: int) -> None:
            body = {"model": "bench", "prompt": prompts[index], "max_tokens": new_tokens, "temperature": 0,
                    "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
            async with client.stream("POST", "/v1/completions", json=body) as reply:
                if reply.status_code != 200:
                    raise RuntimeError(f"HTTP {reply.status_code}: {(await reply.aread())[:300]!r}")
                async for line in reply.aiter_lines():
                    if line.startswith("data: {") and '"usage"' in line:
                        usage = json.loads(line[6:]).get("usage")
                        if usage:
                            tokens[index] = usage["completion_tokens"]

        await closed_loop(one, len(prompts), concurrency)
    return sum(tokens)


def run_http(server: Server, prompts, warm, args) -> dict:
    """Warm up, then the timed closed loop, split over --client-processes processes (one Python
    client can fall behind a fast server) that start together; steps from /server_info."""
    asyncio.run(http_closed_loop(server.url, warm, 8, args.concurrency))
    steps_before = asyncio.run(steps_of(server.url))
    clients = max(1, min(args.client_processes, args.concurrency))
    shares = [(server.url, prompts[i::clients], args.new_tokens, len(range(i, args.concurrency, clients)),
               time.time() + 3.0) for i in range(clients)]
    if clients == 1:
        parts = [client_part(*shares[0])]
    else:
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(clients) as pool:
            parts = pool.starmap(client_part, shares)
    seconds = max(p["end"] for p in parts) - min(p["start"] for p in parts)
    result = {"tokens": sum(p["tokens"] for p in parts), "seconds": seconds, "client_processes": clients,
              "steps": asyncio.run(steps_of(server.url)) - steps_before}
    expected = len(prompts) * args.new_tokens
    if result["tokens"] != expected:
        raise RuntimeError(f"HTTP side produced {result['tokens']} tokens, expected {expected}")
    return result


def client_part(url: str, prompts: list, new_tokens: int, concurrency: int, start_at: float) -> dict:
    """One client process's share of the closed loop, from the shared start time on."""
    time.sleep(max(0.0, start_at - time.time()))
    start = time.time()
    tokens = asyncio.run(http_closed_loop(url, prompts, new_tokens, concurrency))
    return {"tokens": tokens, "start": start, "end": time.time()}


async def steps_of(url: str) -> int:
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        info = (await client.get("/server_info")).json()["internal_states"][0]
    return int(info["total_steps"])


# ----------------------------------------------------------------------------- in-process


def inprocess_closed_loop(engine, prompts: list[list[int]], new_tokens: int, concurrency: int, tag: str) -> dict:
    """add_request / step with `concurrency` requests in flight; -> tokens, seconds."""
    from sglaunch.engine.interface import GenerateRequest, SamplingParams

    sampling = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    pending = iter(range(len(prompts)))
    tokens, in_flight = 0, 0

    def top_up() -> None:
        nonlocal in_flight
        while in_flight < concurrency:
            index = next(pending, None)
            if index is None:
                return
            engine.add_request(GenerateRequest(f"{tag}-{index}", tuple(prompts[index]), sampling))
            in_flight += 1

    start = time.perf_counter()
    steps_before = engine.counters["steps"]
    top_up()
    while engine.has_work:
        for out in engine.step():
            tokens += len(out.new_token_ids)
            in_flight -= out.finished
        top_up()
    _synchronize(engine)
    return {"tokens": tokens, "seconds": time.perf_counter() - start, "steps": engine.counters["steps"] - steps_before}


def release_device_memory(device: str) -> None:
    """Give the in-process engine's device memory back before the next server starts."""
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def _synchronize(engine) -> None:
    import torch

    if engine.runner.device.type == "cuda":
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------- the run


def main(argv=None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            model = Path(tmp) / "tiny-llama"
            build_tiny_llama(model)
        fields = engine_fields(args, model)
        prompts = make_prompts(args.requests, args.prompt_len, vocab_size(model), args.seed)
        warm = make_prompts(args.concurrency, args.prompt_len, vocab_size(model), args.seed + 1)
        runs = {"http": [], "in-process": []}
        for repeat in range(args.repeats):
            runs["http"].append(http_side(fields, prompts, warm, args, Path(tmp) / f"server-{repeat}.log"))
            runs["in-process"].append(inprocess_side(fields, prompts, warm, args, repeat))
    report = summarize(args, runs)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def http_side(fields: dict, prompts, warm, args, log_path: Path) -> dict:
    server = Server(fields, log_path)
    try:
        server.wait_healthy()
        result = run_http(server, prompts, warm, args)
    finally:
        code = server.stop()
    if code != 0:
        raise RuntimeError(f"server exited with {code}:\n{log_path.read_text()}")
    log(f"http: {result['tokens']} tokens in {result['seconds']:.2f} s, {result['steps']} engine steps, "
        f"{result['client_processes']} client process(es)")
    return result


def inprocess_side(fields: dict, prompts, warm, args, repeat: int) -> dict:
    from sglaunch.config import EngineConfig
    from sglaunch.engine.launch import create_engine

    engine, cluster = create_engine(EngineConfig(**fields))
    try:
        inprocess_closed_loop(engine, warm, 8, args.concurrency, f"warm{repeat}")
        result = inprocess_closed_loop(engine, prompts, args.new_tokens, args.concurrency, f"r{repeat}")
    finally:
        cluster.stop(engine)
    del engine, cluster
    release_device_memory(args.device)
    log(f"in-process: {result['tokens']} tokens in {result['seconds']:.2f} s, {result['steps']} engine steps")
    return result


def summarize(args, runs: dict) -> dict:
    rates = {side: statistics.median(r["tokens"] / r["seconds"] for r in results) for side, results in runs.items()}
    ratio = rates["http"] / rates["in-process"]
    report = {"device": args.device, "dtype": args.dtype, "model": str(args.model or "random tiny llama"),
              "concurrency": args.concurrency, "requests": args.requests, "prompt_len": args.prompt_len,
              "new_tokens": args.new_tokens, "repeats": args.repeats, "runs": runs,
              "http_tok_s": rates["http"], "inprocess_tok_s": rates["in-process"], "ratio": ratio}
    print(f"concurrency {args.concurrency}, {args.requests} requests x {args.new_tokens} tokens "
          f"({args.device}, {args.dtype}):")
    print(f"  http        {rates['http']:10.1f} output tok/s")
    print(f"  in-process  {rates['in-process']:10.1f} output tok/s")
    print(f"  ratio http / in-process: {ratio:.3f}")
    return report


if __name__ == "__main__":
    sys.exit(main())
