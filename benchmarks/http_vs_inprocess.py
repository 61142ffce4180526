"""Plain decoding over HTTP against the same engine's in-process closed loop, in one run.

    python benchmarks/http_vs_inprocess.py [--model CHECKPOINT] [--device cuda|cpu]
        [--concurrency 64] [--requests N] [--prompt-len 64] [--new-tokens 128] [--repeats 1]
        [--client-processes N] [--client raw|httpx] [--sides http,engine-process,in-process]
        [--dtype bfloat16] [--out results.json] [--server-arg FIELD=JSON ...]
        [--server-tree DIR] [--py-spy DIR [--py-spy-engine]] [--tokenizer-worker-num N]

On the H200: python benchmarks/http_vs_inprocess.py --device cuda --model SMOLLM2_DIR
    --sides http,engine-process,in-process
On a CPU (the server's cost per token, with real parts: the tiny random Llama's steps are cheap):
    python benchmarks/http_vs_inprocess.py --concurrency 64 --requests 192 --client-processes 1 \
        --sides http,engine-process,in-process

Both sides see the same requests: random token-id prompts of --prompt-len tokens, --new-tokens
tokens each, EOS ignored, greedy, no radix cache, --concurrency requests in flight (a closed
loop: a new request starts as soon as one finishes), --requests in all (default 4 x
concurrency).
  http        `run_server` (as `sglaunch serve` calls it) in a subprocess: the HTTP process, and
              the engine process behind it; the clients stream /v1/completions with token-id
              prompts (sglaunch bench's closed loop over httpx, the concurrency shared by
              --client-processes processes so the client is not what limits); output tokens
              counted from each stream's usage chunk
  engine-process  the server's EngineClient in this process (the engine process and the ZeroMQ
              channel as the server runs them, no HTTP, no detokenization): generate() with
              --concurrency in flight; tells the server's own cost (http against this side) from
              the engine process's and the arrival pattern's (this side against in-process)
  in-process  create_engine in this process, with the same EngineConfig: add_request / step,
              topping the batch up to --concurrency whenever a request finishes
Each side warms up first (one round of --concurrency short requests), then is timed; with
--repeats > 1 the sides alternate and the median is kept. Prints output tok/s of both and the
ratio http / in-process (issue 15's target: within 10% at concurrency 64). Without --model, a
small random-weight Llama (tests/server/checkpoints.py) is built in a temporary folder: on a CPU
its engine steps are cheap, so the HTTP side shows what the server path costs.

--tokenizer-worker-num N serves the HTTP side with N HTTP worker processes in front of the one
engine process (the other sides have no HTTP server to multiply).

The HTTP side also reports where the CPU went, per output token (from /proc and process_time, so
comparable between runs on a shared machine where wall rates are not): the server (every
process of it but the engine's: with N workers, the launcher and all of them), the engine
process (and its children), the client processes, and SSE content chunks per token (below 1
when the server coalesced tokens for a stream that fell behind). --py-spy DIR records the
busiest server process during the timed loop (py-spy's raw collapsed stacks; `py-spy` on PATH).
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
    parser.add_argument("--client", choices=["raw", "httpx"], default="raw",
                        help="raw: sglaunch.bench.rawclient (lean keep-alive SSE client, the default); httpx: "
                             "sglaunch bench's client library, several times the CPU per event")
    parser.add_argument("--sides", default="http,in-process",
                        help="which sides to run, comma-separated (http, engine-process, in-process)")
    parser.add_argument("--server-tree", type=Path, default=ROOT,
                        help="run the HTTP side's server from the sglaunch package in this folder (e.g. a "
                             "`git archive REF sglaunch` extraction, for before/after runs)")
    parser.add_argument("--http-only", action="store_true", help="--sides http (CPU profiling runs)")
    parser.add_argument("--py-spy", type=Path, metavar="DIR", help="record the server process into DIR (raw stacks)")
    parser.add_argument("--py-spy-engine", action="store_true", help="with --py-spy: the engine process too")
    parser.add_argument("--tokenizer-worker-num", type=int, default=1, metavar="N",
                        help="HTTP worker processes of the served side (sglaunch serve --tokenizer-worker-num)")
    args = parser.parse_args(argv)
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    args.requests = args.requests or 4 * args.concurrency
    if args.tokenizer_worker_num < 1:
        parser.error("--tokenizer-worker-num: at least 1")
    args.sides = ["http"] if args.http_only else [side.strip() for side in args.sides.split(",") if side.strip()]
    unknown = set(args.sides) - {"http", "engine-process", "in-process"}
    if unknown or not args.sides:
        parser.error(f"--sides: unknown {sorted(unknown)}" if unknown else "--sides: none given")
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

    def __init__(self, fields: dict, log_path: Path, tree: Path = ROOT):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        self.log_path = log_path
        with open(log_path, "wb") as out:
            self.process = subprocess.Popen([sys.executable, "-c", LAUNCH_SNIPPET,
                                             json.dumps({**fields, "port": self.port})],
                                            stdout=out, stderr=subprocess.STDOUT, cwd=tree, env=env)

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


CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def server_processes(server_pid: int, engine_pid: int | None) -> tuple[list[int], list[int]]:
    """(the server's processes: the one HTTP server, or the launcher and its HTTP workers, with
    multiprocessing's helpers; the engine process and its children). A --server-tree from before
    /server_info named the engine process: everything below the server is the engine's."""
    if engine_pid is None:
        return [server_pid], descendants(server_pid)
    engine = [engine_pid, *descendants(engine_pid)]
    return [server_pid, *(pid for pid in descendants(server_pid) if pid not in engine)], engine


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (the engine process, its ranks, multiprocessing's helpers)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = list(Path(f"/proc/{parent}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                kids = [int(p) for p in (task / "children").read_text().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


def request_body(prompt: list[int], new_tokens: int) -> dict:
    return {"model": "bench", "prompt": prompt, "max_tokens": new_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


async def http_closed_loop(url: str, prompts: list[list[int]], new_tokens: int, concurrency: int,
                           counts: dict | None = None, client: str = "raw") -> int:
    """Stream every prompt through /v1/completions, `concurrency` at a time; -> output tokens.
    `counts` gets the number of content chunks (events with a choice) under "chunks"."""
    if client == "raw":
        return await raw_closed_loop(url, prompts, new_tokens, concurrency, counts)
    import httpx

    from sglaunch.bench.runner import closed_loop

    tokens = [0] * len(prompts)
    chunks = [0] * len(prompts)
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        async def one(index: int) -> None:
            body = request_body(prompts[index], new_tokens)
            async with client.stream("POST", "/v1/completions", json=body) as reply:
                if reply.status_code != 200:
                    raise RuntimeError(f"HTTP {reply.status_code}: {(await reply.aread())[:300]!r}")
                async for line in reply.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    if '"usage"' in line:
                        usage = json.loads(line[6:]).get("usage")
                        if usage:
                            tokens[index] = usage["completion_tokens"]
                            continue
                    chunks[index] += 1

        await closed_loop(one, len(prompts), concurrency)
    if counts is not None:
        counts["chunks"] = sum(chunks)
    return sum(tokens)


async def raw_closed_loop(url: str, prompts: list[list[int]], new_tokens: int, concurrency: int,
                          counts: dict | None) -> int:
    from sglaunch.bench.rawclient import RawStreamClient
    from sglaunch.bench.runner import closed_loop

    client = RawStreamClient(url)
    tokens = [0] * len(prompts)
    chunks = [0] * len(prompts)

    async def one(index: int) -> None:
        events, usage = await client.stream("/v1/completions", request_body(prompts[index], new_tokens))
        if usage is None:
            raise RuntimeError("a stream without its usage event")
        tokens[index] = usage["completion_tokens"]
        chunks[index] = events - 2  # NOTE: not the usage event, nor [DONE]

    try:
        await closed_loop(one, len(prompts), concurrency)
    finally:
        client.close()
    if counts is not None:
        counts["chunks"] = sum(chunks)
    return sum(tokens)


def run_http(server: Server, prompts, warm, args) -> dict:
    """Warm up, then the timed closed loop, split over --client-processes processes (one Python
    client can fall behind a fast server) that start together; steps from /server_info."""
    asyncio.run(http_closed_loop(server.url, warm, 8, args.concurrency, client=args.client))
    info_before = asyncio.run(engine_info_of(server.url))
    steps_before, replays_before = int(info_before["total_steps"]), graph_replays(info_before)
    prefill_before = int(info_before.get("total_prefill_steps", 0))
    clients = max(1, min(args.client_processes, args.concurrency))
    shares = [(server.url, prompts[i::clients], args.new_tokens, len(range(i, args.concurrency, clients)),
               time.time() + (1.0 if clients == 1 else 3.0), args.client) for i in range(clients)]
    server_pids, engine_pids = server_processes(server.process.pid, info_before.get("engine_pid"))
    spies = [start_py_spy(pid, args.py_spy, name) for name, pid in
             (("server", max(server_pids, key=cpu_seconds)), ("engine", max(engine_pids, key=cpu_seconds, default=None)))
             if args.py_spy and pid is not None and (name == "server" or args.py_spy_engine)]
    server_cpu0, engine_cpu0 = sum(map(cpu_seconds, server_pids)), sum(map(cpu_seconds, engine_pids))
    if clients == 1:
        parts = [client_part(*shares[0])]
    else:
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(clients) as pool:
            parts = pool.starmap(client_part, shares)
    server_cpu = sum(map(cpu_seconds, server_pids)) - server_cpu0
    engine_cpu = sum(map(cpu_seconds, engine_pids)) - engine_cpu0
    for spy in spies:
        spy.send_signal(signal.SIGINT)
        spy.wait(60)
    seconds = max(p["end"] for p in parts) - min(p["start"] for p in parts)
    tokens = sum(p["tokens"] for p in parts)
    chunks = sum(p["chunks"] for p in parts)
    client_cpu = sum(p["cpu"] for p in parts)
    info_after = asyncio.run(engine_info_of(server.url))
    steps = int(info_after["total_steps"]) - steps_before
    result = {"tokens": tokens, "seconds": seconds, "client_processes": clients, "steps": steps,
              "tokenizer_worker_num": args.tokenizer_worker_num, "server_processes": len(server_pids),
              "eager_steps": steps - (graph_replays(info_after) - replays_before),
              "prefill_steps": int(info_after.get("total_prefill_steps", 0)) - prefill_before,
              "step_kinds": step_kinds(info_before, info_after),
              "server_cpu_s": server_cpu, "engine_cpu_s": engine_cpu, "client_cpu_s": client_cpu,
              "server_cpu_us_per_token": 1e6 * server_cpu / max(tokens, 1),
              "engine_cpu_us_per_token": 1e6 * engine_cpu / max(tokens, 1),
              "client_cpu_us_per_token": 1e6 * client_cpu / max(tokens, 1),
              "server_cpu_busy": server_cpu / seconds, "client_cpu_busy": client_cpu / seconds,
              "chunks_per_token": chunks / max(tokens, 1), "client": args.client}
    expected = len(prompts) * args.new_tokens
    if result["tokens"] != expected:
        raise RuntimeError(f"HTTP side produced {result['tokens']} tokens, expected {expected}")
    return result


def start_py_spy(pid: int, folder: Path, name: str) -> subprocess.Popen:
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{name}-{int(time.time())}.txt"
    log(f"py-spy recording the {name} process ({pid}) into {out}")
    return subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--rate", "250", "--gil", "--format", "raw",
                             "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def client_part(url: str, prompts: list, new_tokens: int, concurrency: int, start_at: float,
                client: str = "raw") -> dict:
    """One client process's share of the closed loop, from the shared start time on."""
    time.sleep(max(0.0, start_at - time.time()))
    counts: dict = {}
    cpu0, start = time.process_time(), time.time()
    tokens = event_loop_run(http_closed_loop(url, prompts, new_tokens, concurrency, counts, client))
    return {"tokens": tokens, "chunks": counts["chunks"], "start": start, "end": time.time(),
            "cpu": time.process_time() - cpu0}


def event_loop_run(coroutine):
    """uvloop where it is installed (as the server runs), asyncio's loop otherwise."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


async def steps_of(url: str) -> int:
    return int((await engine_info_of(url))["total_steps"])


async def engine_info_of(url: str) -> dict:
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        return (await client.get("/server_info")).json()["internal_states"][0]


def graph_replays(info: dict) -> int:
    """Target forwards a CUDA graph served (decode + verify) in a server_info() dict; 0 without graphs."""
    return sum(int(n) for n in (info.get("total_graph_replays") or {}).values())


def step_kinds(before: dict, after: dict) -> dict:
    """Engine step() wall time by kind between two statistics dicts (`step_seconds`: steps with a
    prefill chunk, and decode-only steps): {kind: {"steps": n, "ms": mean ms a step}}."""
    out = {}
    for kind, (n1, s1) in (after.get("step_seconds") or {}).items():
        n0, s0 = (before.get("step_seconds") or {}).get(kind, (0, 0.0))
        if n1 > n0:
            out[kind] = {"steps": n1 - n0, "ms": 1e3 * (s1 - s0) / (n1 - n0)}
    return out


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

    start, cpu0 = time.perf_counter(), time.process_time()
    steps_before, replays_before = engine.counters["steps"], graph_replays(engine.live_stats())
    prefill_before = engine.scheduler.num_prefill_steps
    kinds_before = {"step_seconds": {k: list(v) for k, v in engine.step_seconds.items()}}
    top_up()
    while engine.has_work:
        for out in engine.step():
            tokens += len(out.new_token_ids)
            in_flight -= out.finished
        top_up()
    _synchronize(engine)
    cpu = time.process_time() - cpu0
    steps = engine.counters["steps"] - steps_before
    return {"tokens": tokens, "seconds": time.perf_counter() - start, "steps": steps,
            "eager_steps": steps - (graph_replays(engine.live_stats()) - replays_before),
            "prefill_steps": engine.scheduler.num_prefill_steps - prefill_before,
            "step_kinds": step_kinds(kinds_before, {"step_seconds": engine.step_seconds}), "engine_cpu_s": cpu, "engine_cpu_us_per_token": 1e6 * cpu / max(tokens, 1)}


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
        runs = {side: [] for side in args.sides}
        for repeat in range(args.repeats):
            if "http" in runs:
                runs["http"].append(http_side(fields, prompts, warm, args, Path(tmp) / f"server-{repeat}.log"))
            if "engine-process" in runs:
                runs["engine-process"].append(engine_process_side(fields, prompts, warm, args, repeat))
            if "in-process" in runs:
                runs["in-process"].append(inprocess_side(fields, prompts, warm, args, repeat))
    report = summarize(args, runs)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def http_side(fields: dict, prompts, warm, args, log_path: Path) -> dict:
    server = Server({**fields, "tokenizer_worker_num": args.tokenizer_worker_num}, log_path, args.server_tree)
    try:
        server.wait_healthy()
        result = run_http(server, prompts, warm, args)
    finally:
        code = server.stop()
    if code != 0:
        raise RuntimeError(f"server exited with {code}:\n{log_path.read_text()}")
    log(f"http: {result['tokens']} tokens in {result['seconds']:.2f} s, {result['steps']} engine steps, "
        f"{result['client_processes']} client process(es), {args.tokenizer_worker_num} HTTP worker process(es); "
        f"CPU us/token: server "
        f"{result['server_cpu_us_per_token']:.1f} (busy {result['server_cpu_busy']:.2f}), engine "
        f"{result['engine_cpu_us_per_token']:.1f}, client {result['client_cpu_us_per_token']:.1f} "
        f"(busy {result['client_cpu_busy']:.2f}); chunks/token {result['chunks_per_token']:.3f}")
    return result


def engine_process_side(fields: dict, prompts, warm, args, repeat: int) -> dict:
    result = event_loop_run(engine_process_run(fields, prompts, warm, args, repeat))
    log(f"engine-process: {result['tokens']} tokens in {result['seconds']:.2f} s, {result['steps']} engine steps; "
        f"CPU us/token: engine {result['engine_cpu_us_per_token']:.1f}, client {result['client_cpu_us_per_token']:.1f}")
    return result


async def engine_process_run(fields: dict, prompts, warm, args, repeat: int) -> dict:
    """The closed loop straight on EngineClient (the server's engine process and channel)."""
    from sglaunch.bench.runner import closed_loop
    from sglaunch.config import EngineConfig
    from sglaunch.engine.engine_client import EngineClient
    from sglaunch.engine.interface import GenerateRequest, SamplingParams

    engine = EngineClient(EngineConfig(**fields))
    await engine.start()
    try:
        async def run(batch, new_tokens: int, tag: str) -> int:
            sampling = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
            tokens = [0] * len(batch)

            async def one(index: int) -> None:
                request = GenerateRequest(f"{tag}-{index}", tuple(batch[index]), sampling)
                async for out in engine.generate(request):
                    tokens[index] += len(out.new_token_ids)

            await closed_loop(one, len(batch), args.concurrency)
            return sum(tokens)

        await run(warm, 8, f"warm{repeat}")
        await asyncio.sleep(0.2)  # NOTE: the live statistics of the warm-up's end have arrived
        info_before = engine.server_info()
        steps_before, replays_before = int(info_before.get("total_steps", 0)), graph_replays(info_before)
        prefill_before = int(info_before.get("total_prefill_steps", 0))
        engine_pids = descendants(os.getpid())
        spy = (start_py_spy(max(engine_pids, key=cpu_seconds), args.py_spy, "engine-process")
               if args.py_spy and args.py_spy_engine and engine_pids else None)
        engine_cpu0, cpu0, start = sum(map(cpu_seconds, engine_pids)), time.process_time(), time.perf_counter()
        tokens = await run(prompts, args.new_tokens, f"r{repeat}")
        seconds = time.perf_counter() - start
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
        client_cpu, engine_cpu = time.process_time() - cpu0, sum(map(cpu_seconds, engine_pids)) - engine_cpu0
        await asyncio.sleep(0.2)
        info_after = engine.server_info()
        steps = int(info_after.get("total_steps", 0)) - steps_before
        eager = steps - (graph_replays(info_after) - replays_before)
        prefill = int(info_after.get("total_prefill_steps", 0)) - prefill_before
        kinds = step_kinds(info_before, info_after)
    finally:
        await engine.shutdown()
    expected = len(prompts) * args.new_tokens
    if tokens != expected:
        raise RuntimeError(f"engine-process side produced {tokens} tokens, expected {expected}")
    return {"tokens": tokens, "seconds": seconds, "steps": steps, "eager_steps": eager, "prefill_steps": prefill,
            "step_kinds": kinds,
            "engine_cpu_s": engine_cpu,
            "engine_cpu_us_per_token": 1e6 * engine_cpu / tokens, "client_cpu_us_per_token": 1e6 * client_cpu / tokens}


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
    log(f"in-process: {result['tokens']} tokens in {result['seconds']:.2f} s, {result['steps']} engine steps; "
        f"CPU us/token: engine {result['engine_cpu_us_per_token']:.1f}")
    return result


CPU_KEYS = ("server_cpu_us_per_token", "engine_cpu_us_per_token", "client_cpu_us_per_token",
            "server_cpu_busy", "client_cpu_busy", "chunks_per_token")


def summarize(args, runs: dict) -> dict:
    rates = {side: statistics.median(r["tokens"] / r["seconds"] for r in results)
             for side, results in runs.items() if results}
    step_ms = {side: statistics.median(1e3 * r["seconds"] / max(r["steps"], 1) for r in results)
               for side, results in runs.items() if results}
    base = rates.get("in-process")
    ratio = rates["http"] / base if base and "http" in rates else None
    report = {"device": args.device, "dtype": args.dtype, "model": str(args.model or "random tiny llama"),
              "concurrency": args.concurrency, "requests": args.requests, "prompt_len": args.prompt_len,
              "new_tokens": args.new_tokens, "repeats": args.repeats, "cpu_count": os.cpu_count(),
              "tokenizer_worker_num": args.tokenizer_worker_num,
              "client": args.client, "runs": runs, "tok_s": rates, "ms_per_step": step_ms,
              "http_tok_s": rates.get("http"), "inprocess_tok_s": base,
              "engine_process_tok_s": rates.get("engine-process"), "ratio": ratio,
              "ratio_engine_process": rates["engine-process"] / base if base and "engine-process" in rates else None}
    print(f"concurrency {args.concurrency}, {args.requests} requests x {args.new_tokens} tokens "
          f"({args.device}, {args.dtype}), --tokenizer-worker-num {args.tokenizer_worker_num}:")
    for side, rate in rates.items():
        share = f"  ({rate / base:.3f} of in-process)" if base and side != "in-process" else ""
        eager = statistics.median(r.get("eager_steps", 0) / max(r["steps"], 1) for r in runs[side])
        prefill = statistics.median(r.get("prefill_steps", 0) / max(r["steps"], 1) for r in runs[side])
        print(f"  {side:15s} {rate:10.1f} output tok/s, {step_ms[side]:.2f} ms per engine step, "
              f"{100 * eager:.0f}% of steps eager (no CUDA graph), {100 * prefill:.0f}% with a prefill chunk{share}")
        kinds = runs[side][-1].get("step_kinds") or {}
        if kinds:
            print("  " + " " * 15 + "  step() wall time: " + ", ".join(
                f"{kind} {v['ms']:.2f} ms x {v['steps']}" for kind, v in kinds.items()))
    if ratio is not None:
        print(f"  ratio http / in-process: {ratio:.3f}")
    if "http" in runs:
        http_cpu = {key: statistics.median(r[key] for r in runs["http"]) for key in CPU_KEYS}
        report["http_cpu"] = http_cpu
        print(f"  http CPU us per output token: server {http_cpu['server_cpu_us_per_token']:.1f} "
              f"(busy {http_cpu['server_cpu_busy']:.2f}), engine {http_cpu['engine_cpu_us_per_token']:.1f}, "
              f"client {http_cpu['client_cpu_us_per_token']:.1f} (busy {http_cpu['client_cpu_busy']:.2f}); "
              f"SSE chunks per token {http_cpu['chunks_per_token']:.3f}")
    return report


if __name__ == "__main__":
    sys.exit(main())
