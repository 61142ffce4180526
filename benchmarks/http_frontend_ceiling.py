"""The HTTP front end's ceiling: the real server, fed by a synthetic token source. Issue 15.

    python benchmarks/http_frontend_ceiling.py [--before GIT_REF] [--concurrency 64]
        [--requests 256] [--new-tokens 128] [--step-ms 2.75] [--repeats 2] [--client-processes 1]
        [--endpoint chat|completions] [--out results.json]

A FRONT-END CEILING MEASUREMENT, not an engine benchmark: the server process is the real one
(`run_server`: uvicorn, the OpenAI routes, detokenization, SSE, the EngineClient), and so are the
engine process's loop and the ZeroMQ channel (`engine_process._EngineLoop` / `_EngineChannel`),
but the engine behind them is `benchmarks/http_synthetic_engine.py`: every step sleeps --step-ms
(the device step; 2.75 ms is SmolLM2 plain at c=64 on the H200, session 7's 23,264 tok/s) and
gives every running request one real token id (SmolLM2's tokenizer, ids of the held-out code
prompts), so the engine side can deliver at most concurrency / step tokens per second and uses
almost no CPU. Clients are `sglaunch bench`'s own request function (`sglaunch.bench.client.send`,
httpx, streaming chat with the held-out code prompts, like session 7's `sglaunch bench`) in
--client-processes processes.

Reported per side: output tok/s (against the synthetic engine's own rate), and the CPU time per
output token of the server process, of the engine process and of the clients (from /proc and
process_time: on a shared 2-core machine these ratios are what to compare, not wall rates), SSE
content chunks per token. --before REF runs the tree at REF (git archive of sglaunch/) beside the
working tree, alternating, in the same run; modules listed in --hide-before (default none) are
made unimportable for it: `--hide-before httptools,uvloop,orjson` for a REF from before they were
dependencies (session 12). NOTE: that was the default until session 15, where it made a same-tree
A/B read 22% less server CPU for the working tree.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH_DIR))
from http_vs_inprocess import Server as InProcessComparisonServer  # noqa: E402
TOKENIZER_DIR = BENCH_DIR / "gpu6" / "smolcfg"
PROMPTS = BENCH_DIR / "gpu6" / "heldout_code.jsonl"
CLK_TCK = os.sysconf("SC_CLK_TCK")

LAUNCH_SNIPPET = (
    "import json, sys\n"
    "tree, bench, hide, fields = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])\n"
    "for name in hide: sys.modules[name] = None\n"
    "sys.path[:0] = [tree, bench]\n"
    "import sglaunch.engine.engine_process as ep\n"
    "from http_synthetic_engine import synthetic_engine_main\n"
    "ep.engine_main = synthetic_engine_main\n"
    "from sglaunch.config import EngineConfig\n"
    "from sglaunch.server.launch import run_server\n"
    "sys.exit(run_server(EngineConfig(**fields)))\n"
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="git ref of the tree to compare against (e.g. HEAD)")
    parser.add_argument("--hide-before", default="")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--step-ms", type=float, default=2.75)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--client-processes", type=int, default=1)
    parser.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    parser.add_argument("--server-arg", action="append", default=[], metavar="FIELD=JSON")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--py-spy", type=Path, metavar="DIR", help="record the server process (collapsed stacks)")
    parser.add_argument("--py-spy-target", choices=["server", "client"], default="server",
                        help="client: record this process instead (with --client-processes 1, the client)")
    return parser.parse_args(argv)


def log(message: str) -> None:
    print(f"[http_frontend_ceiling] {message}", file=sys.stderr, flush=True)


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """utime + stime of process `pid` (all its threads), or of its thread `thread` alone."""
    path = f"/proc/{pid}/task/{thread}/stat" if thread is not None else f"/proc/{pid}/stat"
    try:
        fields = Path(path).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def token_corpus(path: Path) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))
    ids: list[int] = []
    for line in PROMPTS.read_text().splitlines():
        for message in json.loads(line)["messages"]:
            ids += tok.encode(message["content"], add_special_tokens=False).ids
    path.write_text(json.dumps(ids))


class Server(InProcessComparisonServer):
    """The real server on a synthetic token source; health wait and SIGTERM stop as in
    http_vs_inprocess.py."""

    def __init__(self, tree: Path, hide: list[str], args, env_extra: dict, log_path: Path):  # noqa: D107
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        fields = dict(model_path=str(TOKENIZER_DIR), tokenizer_path=str(TOKENIZER_DIR), served_model_name="bench",
                      dtype="float32", context_length=2048, device="cpu", disable_radix_cache=True,
                      max_running_requests=args.concurrency, host="127.0.0.1", port=self.port,
                      log_level="warning")
        for item in args.server_arg:
            key, _, value = item.partition("=")
            fields[key] = json.loads(value)
        env = {**os.environ, **env_extra}
        env.pop("PYTHONPATH", None)
        self.log_path = log_path
        with open(log_path, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-c", LAUNCH_SNIPPET, str(tree), str(BENCH_DIR), json.dumps(hide),
                 json.dumps(fields)], stdout=out, stderr=subprocess.STDOUT, cwd=tempfile.gettempdir(), env=env)


def load_requests(count: int, new_tokens: int, endpoint: str):
    from sglaunch.bench.workload import BenchRequest

    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines()]
    requests = []
    for i in range(count):
        messages = rows[i % len(rows)]["messages"]
        if endpoint == "chat":
            requests.append(BenchRequest(None, messages, new_tokens))
        else:
            requests.append(BenchRequest(messages[-1]["content"], None, new_tokens))
    return requests


async def client_loop(url: str, requests, concurrency: int) -> dict:
    import httpx

    from sglaunch.bench.client import SamplingSettings, send
    from sglaunch.bench.runner import closed_loop

    settings = SamplingSettings(model="bench", temperature=0.0, ignore_eos=True)
    results = [None] * len(requests)
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        async def one(index: int) -> None:
            results[index] = await send(client, requests[index], settings)

        await closed_loop(one, len(requests), concurrency)
    failed = [r.error for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed, e.g. {failed[0]}")
    return {"tokens": sum(r.output_tokens for r in results),
            "chunks": sum((len(r.itls) + 1) if r.ttft is not None else 0 for r in results)}


def client_part(url: str, requests, concurrency: int, start_at: float) -> dict:
    time.sleep(max(0.0, start_at - time.time()))
    cpu0, start = time.process_time(), time.time()
    part = asyncio.run(client_loop(url, requests, concurrency))
    return {**part, "start": start, "end": time.time(), "cpu": time.process_time() - cpu0}


def run_side(label: str, tree: Path, hide: list[str], args, corpus: Path, tmp: Path, repeat: int) -> dict:
    env = {"SGLAUNCH_SYNTH_STEP_MS": str(args.step_ms), "SGLAUNCH_SYNTH_TOKENS": str(corpus),
           "SGLAUNCH_SYNTH_MAX_RUNNING": str(args.concurrency)}
    server = Server(tree, hide, args, env, tmp / f"{label}-{repeat}.log")
    try:
        server.wait_healthy()
        engine_pids = children(server.process.pid)
        warm = load_requests(args.concurrency, 8, args.endpoint)
        asyncio.run(client_loop(server.url, warm, args.concurrency))
        requests = load_requests(args.requests, args.new_tokens, args.endpoint)
        clients = max(1, min(args.client_processes, args.concurrency))
        start_at = time.time() + 1.0
        shares = [(server.url, requests[i::clients], len(range(i, args.concurrency, clients)), start_at)
                  for i in range(clients)]
        spy = None
        if args.py_spy:
            args.py_spy.mkdir(parents=True, exist_ok=True)
            target = server.process.pid if args.py_spy_target == "server" else os.getpid()
            spy = subprocess.Popen(["py-spy", "record", "--pid", str(target), "--rate", "250", "--gil", "--format",
                                    "raw", "-o", str(args.py_spy / f"{args.py_spy_target}-{label}-{repeat}.txt")],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        server_cpu0 = cpu_seconds(server.process.pid)
        # NOTE: the event loop's thread (the process's main thread): a saturated server is held by it
        loop_cpu0 = cpu_seconds(server.process.pid, server.process.pid)
        engine_cpu0 = sum(cpu_seconds(p) for p in engine_pids)
        if clients == 1:
            parts = [client_part(*shares[0])]
        else:
            import multiprocessing

            with multiprocessing.get_context("spawn").Pool(clients) as pool:
                parts = pool.starmap(client_part, shares)
        server_cpu = cpu_seconds(server.process.pid) - server_cpu0
        loop_cpu = cpu_seconds(server.process.pid, server.process.pid) - loop_cpu0
        engine_cpu = sum(cpu_seconds(p) for p in engine_pids) - engine_cpu0
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
    finally:
        code = server.stop()
    if code != 0:
        raise RuntimeError(f"{label} server exited with {code}:\n{server.log_path.read_text()[-3000:]}")
    tokens = sum(p["tokens"] for p in parts)
    if tokens != args.requests * args.new_tokens:
        raise RuntimeError(f"{label}: {tokens} tokens, expected {args.requests * args.new_tokens}")
    seconds = max(p["end"] for p in parts) - min(p["start"] for p in parts)
    result = {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds,
              "server_cpu_us_per_token": 1e6 * server_cpu / tokens,
              "server_loop_cpu_us_per_token": 1e6 * loop_cpu / tokens,
              "engine_cpu_us_per_token": 1e6 * engine_cpu / tokens,
              "client_cpu_us_per_token": 1e6 * sum(p["cpu"] for p in parts) / tokens,
              "chunks_per_token": sum(p["chunks"] for p in parts) / tokens,
              "server_cpu_us_per_chunk": 1e6 * server_cpu / sum(p["chunks"] for p in parts),
              "client_cpu_us_per_chunk": 1e6 * sum(p["cpu"] for p in parts) / sum(p["chunks"] for p in parts),
              "server_cpu_busy": server_cpu / seconds}
    log(f"{label} #{repeat}: {result['tok_s']:.0f} tok/s; CPU us/token server {result['server_cpu_us_per_token']:.1f}"
        f" (its event loop's thread {result['server_loop_cpu_us_per_token']:.1f})"
        f" engine {result['engine_cpu_us_per_token']:.1f} client {result['client_cpu_us_per_token']:.1f};"
        f" chunks/token {result['chunks_per_token']:.3f}; server busy {result['server_cpu_busy']:.2f}")
    return result


def main(argv=None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        corpus = tmp / "tokens.json"
        token_corpus(corpus)
        sides = {"after": (ROOT, [])}
        if args.before:
            before = tmp / "before"
            before.mkdir()
            archive = subprocess.run(["git", "archive", args.before, "sglaunch"], cwd=ROOT, check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
            sides = {"before": (before, [m for m in args.hide_before.split(",") if m]), **sides}
        runs = {label: [] for label in sides}
        for repeat in range(args.repeats):
            order = list(sides) if repeat % 2 == 0 else list(sides)[::-1]
            for label in order:
                runs[label].append(run_side(label, *sides[label], args, corpus, tmp, repeat))
    engine_rate = args.concurrency / (args.step_ms / 1000)
    report = {"what": "front-end ceiling: real server + real engine-process loop/IPC, synthetic token source",
              "concurrency": args.concurrency, "requests": args.requests, "new_tokens": args.new_tokens,
              "step_ms": args.step_ms, "synthetic_engine_tok_s": engine_rate, "endpoint": args.endpoint,
              "client_processes": args.client_processes, "before": args.before, "cpu_count": os.cpu_count(),
              "runs": runs, "median": {}}
    for label, results in runs.items():
        med = {key: statistics.median(r[key] for r in results) for key in results[0]}
        report["median"][label] = med
        print(f"{label:7s} {med['tok_s']:9.0f} tok/s ({med['tok_s'] / engine_rate:.2f} of the synthetic engine's "
              f"{engine_rate:.0f}); CPU us/token: server {med['server_cpu_us_per_token']:.1f}, engine "
              f"{med['engine_cpu_us_per_token']:.1f}, client {med['client_cpu_us_per_token']:.1f}; "
              f"chunks/token {med['chunks_per_token']:.3f}; CPU us/chunk: server "
              f"{med['server_cpu_us_per_chunk']:.1f}, client {med['client_cpu_us_per_chunk']:.1f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
