"""Does a process's CUDA state slow the host side of every engine step? One plain engine, one load,
its step time measured, then measured again after the process captured many extra CUDA graphs, and
after it allocated a lot more device memory, then again once both are released:

    python benchmarks/cuda_state_host_cost.py --model benchmarks/gpu6/smolcfg --random-like \
        [--concurrency 16] [--temperature 0.7] [--graphs 500] [--extra-gib 20] [--json OUT]

Why: profile_step.py's second engine in a process stepped 10-22% slower on the host than its first,
whichever kind it was (session 41, H100, benchmarks/gpu41/call3), and a DSpark server (about 550 CUDA
graphs: target, drafter and burst graphs) served about 0.95x of a plain one (70 graphs) at c=16,
T=0.7 while stepping aside on 91-99% of its steps. If the host's CUDA calls (graph launch, copies,
events) cost more with more graphs or more mapped memory in the process, this shows it with one
engine and nothing else changed. Each measure is the median synchronised step of --steps steps
(after --warmup), in rounds: base, +graphs, +graphs+memory, released, base again.

NOTE: the requests must not grow through the rounds. Session 41's run (H100, benchmarks/gpu41/call11)
kept each request for 4,096 tokens, so every round's contexts were 400 tokens longer than the last:
the steps grew 1.57 -> 1.65 -> 1.77 -> 1.79 -> 1.86 ms at c=16, released and "base again" included,
which is the contexts' growth, not the CUDA state. --max-tokens now defaults to 256: requests end
and are replaced, so the mean context stays put (at the price of a prompt's prefill every few steps).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def measure(load, steps: int, sync) -> dict:
    """Median and mean synchronised step (ms) over `steps` steps of `load`."""
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        load.step()
        sync()
        times.append(time.perf_counter() - t)
    return {"median_ms": round(1e3 * statistics.median(times), 4), "mean_ms": round(1e3 * statistics.mean(times), 4)}


def capture_graphs(torch, count: int, ops: int, device) -> list:
    """`count` CUDA graphs of `ops` small element-wise kernels each, each graph on its own buffers
    and memory pool (as separately captured graphs hold their own)."""
    graphs = []
    stream = torch.cuda.Stream(device)
    for _ in range(count):
        x = torch.randn(4096, device=device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            y = x
            for _ in range(ops):
                y = y * 1.0001 + 0.5
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = x
            for _ in range(ops):
                y = y * 1.0001 + 0.5
        graphs.append((graph, x, y))
    torch.cuda.synchronize(device)
    return graphs


def main(argv: list[str] | None = None) -> int:
    import profile_step as ps

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--random-like", action="store_true")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--graphs", type=int, default=500)
    parser.add_argument("--graph-ops", type=int, default=40)
    parser.add_argument("--extra-gib", type=float, default=20.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.attention_backend, args.disable_cuda_graph, args.top_p = None, False, 1.0
    import torch

    work = Path(tempfile.mkdtemp(prefix="cuda-state-"))
    try:
        if args.random_like:
            args.model = ps.random_like(args.model, work)
        engine, cluster = ps.build_engine(args, None, None)
        cuda = args.device == "cuda"
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        device = engine.runner.device
        rounds = []
        try:
            load = ps.Load(engine, args.concurrency, args.prompt_len, args.max_tokens,
                           engine.runner.spec.vocab_size, args.temperature, 1.0)
            for _ in range(args.warmup):
                load.step()
            sync()

            def record(name: str, **extra) -> None:
                r = {"round": name, **measure(load, args.steps, sync), **extra}
                rounds.append(r)
                print(json.dumps(r), flush=True)

            record("base")
            graphs, memory = [], None
            if cuda:
                t = time.perf_counter()
                graphs = capture_graphs(torch, args.graphs, args.graph_ops, device)
                record("graphs", graphs=len(graphs), capture_s=round(time.perf_counter() - t, 2))
                gib = args.extra_gib
                while memory is None and gib >= 0.25:  # NOTE: the engine's KV cache took most of the card
                    try:
                        memory = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=device)
                    except torch.OutOfMemoryError:
                        gib /= 2
                record("graphs+memory", extra_gib=gib if memory is not None else 0.0)
                del graphs, memory
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()
                record("released")
            record("base again")
        finally:
            cluster.stop(engine)
        base = statistics.mean(r["median_ms"] for r in rounds if r["round"].startswith("base"))
        for r in rounds:
            r["over_base"] = round(r["median_ms"] / base, 4)
        print("\n".join(f"{r['round']:<14} {r['median_ms']:8.4f} ms  x{r['over_base']:.3f}" for r in rounds))
        if args.json:
            args.json.write_text(json.dumps({"argv": sys.argv if argv is None else argv, "rounds": rounds}, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
