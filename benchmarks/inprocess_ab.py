"""Steady-state throughput of engine configurations in-process, each run in a fresh process, A/B in turn:

    python benchmarks/inprocess_ab.py --model DIR [--drafter DIR] [--random-like] [--device cuda]
        [--concurrency 16] [--temperature 0.7] [--top-p 1] [--requests 600] [--warmup-requests 64]
        [--pairs 3] [--arm plain=plain] [--arm dspark=compact] [--arm LABEL=KIND,ENV=VALUE,...] [--json OUT]

Each arm is an engine as `sglaunch serve` would boot it (profile_step.build_engine): KIND is `plain`
(no drafter) or a DSpark mode (`compact`, `static`), with environment variables of its own after the
kind (`dspark-noctx=compact,SGLAUNCH_DSPARK_SKIP_CONTEXT=0`). A run boots its arm in a new Python
process, keeps --concurrency requests in flight in a closed loop (the held-out prompts through the
model's chat template, --output-len tokens each (or, with --output-jitter J, a length drawn per request in
[(1 - J), (1 + J)] x --output-len, the same for every arm), EOS ignored, seeded per request at T > 0), lets
--warmup-requests of them finish, then times the window in which the next --requests finish: the
batch stays full all through it (no tail of a draining batch, which a DSpark engine bursts through).
Pairs alternate the order (A B, B A, A B, ...); each pair's ratio is taken against the first arm.

Besides tok/s the window's engine statistics are reported as differences over the window (`live_stats`): steps
by kind (prefill: a step that ran a prompt chunk; decode: the rest) with their count and mean wall time,
CUDA-graph replays by kind, DSpark's drafted and stepped-aside steps, the burst counters (bursts, iterations,
chained, ended early, why steps took none), the garbage collector's passes and seconds per generation, and the
process CPU time per output token. So a loss is placed: in the decode steps, the prefill steps, or how many of
each a token needs. NOTE: with one output length for all, requests admitted in the same step end in the same
step for good in a plain engine (a cohort), so it admits several prompts a step, while a DSpark engine's
drafting steps break cohorts up: its steps that admit prompts are more and each admits fewer (session 42 at
c=32: 555-561 against 487 for 900 admissions). --output-jitter takes cohorts out. Each kind's step times are
also timed around every engine.step() (`step_ms`: p50 / p90 / p99 / max and the share of the kind's time in its
slowest 1% of steps), so a kind that is slow step after step is told from one that stalls now and then.
`step_split` splits the steps finer, by what each did (a prompt chunk, a burst read back, drafting outside a
burst, plain decoding), with the tokens each kind reported and its tokens per millisecond: whether bursts
yield more per millisecond than plain's decode steps, and what the other kinds cost. `slow_steps`: the window's
24 slowest steps, each with its kind, tokens and the target graphs it replayed or why it ran eagerly
(`eager (query)`, ...: CudaGraphRunner's counts, CUDA only). NOTE: each engine runs at most --concurrency
requests (`--max-running-requests`), so its CUDA graphs stop at that batch and its ragged tiers at 8 rows a
request (64 at c=8, 2,048 for a server at the default cap): a prompt chunk fills the largest tier sooner than in
a server (session 44: DSpark's drafts on top of such steps ran 28 of 362 admitting steps eagerly, since fixed).
--server-caps boots the engines with the server's default cap instead (graphs and tiers as `sglaunch serve`'s;
session 45 read DSpark at c=8 0.94-0.96 in-process with the cap at 8 against 1.01-1.06 over HTTP), and
--engine-flag passes `sglaunch serve` flags to every arm (`--engine-flag=--max-total-tokens --engine-flag=400000`).

Why: over HTTP a DSpark server served 0.91-0.95x of a plain one at 16 concurrent requests, T=0.7,
stepping aside on 91-99% of its steps (H100, session 41, benchmarks/gpu41), and no in-process measure
had compared the two engines' whole loops, each measured in its own process (profile_step.py's second
engine in a process steps 10-22% slower than its first, whichever it is).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

DATASET = HERE / "prompt_set" / "heldout.jsonl"
KINDS = ("plain", "compact", "static")


def parse_arm(text: str) -> dict:
    """'LABEL=KIND[,ENV=VALUE...]' -> {"label", "kind", "env"}."""
    label, sep, rest = text.partition("=")
    parts = [p for p in rest.split(",") if p] if sep else []
    if not label or not parts or parts[0] not in KINDS:
        raise argparse.ArgumentTypeError(f"--arm {text!r}: expected LABEL=KIND[,ENV=VALUE...], KIND one of "
                                         f"{', '.join(KINDS)}")
    env = {}
    for item in parts[1:]:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise argparse.ArgumentTypeError(f"--arm {text!r}: {item!r} is not ENV=VALUE")
        env[key] = value
    return {"label": label, "kind": parts[0], "env": env}


def numeric_delta(after, before):
    """after - before over the numeric leaves of two nested structures (dicts, lists); others dropped."""
    if isinstance(after, bool):
        return None
    if isinstance(after, (int, float)) and isinstance(before, (int, float)) and not isinstance(before, bool):
        return after - before
    if isinstance(after, dict) and isinstance(before, dict):  # a key new since `before` counts from 0 (or {})
        out = {k: numeric_delta(v, before.get(k, {} if isinstance(v, dict) else 0)) for k, v in after.items()}
        return {k: v for k, v in out.items() if v is not None} or None
    if isinstance(after, list) and isinstance(before, list) and len(after) == len(before):
        out = [numeric_delta(a, b) for a, b in zip(after, before)]
        return out if all(v is not None for v in out) else None
    return None


def prompts(model: Path, dataset: Path, limit: int) -> list[tuple[int, ...]]:
    from sglaunch.server.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(model)
    rows = [json.loads(line) for line in dataset.read_text().splitlines() if line.strip()]
    out = [tuple(tokenizer.encode_chat(row["messages"])) for row in rows[:limit]]
    if not out:
        raise SystemExit(f"{dataset}: no prompts")
    return out


def run_arm(spec: dict) -> dict:
    """One run (in a fresh process): boot the arm's engine, warm up, time the window."""
    import profile_step as ps

    from sglaunch.engine.interface import GenerateRequest, SamplingParams

    os.environ.update(spec["env"])
    began = time.perf_counter()
    ns = argparse.Namespace(model=Path(spec["model"]), device=spec["device"], dtype=spec["dtype"],
                            concurrency=spec["concurrency"], attention_backend=spec["attention_backend"],
                            disable_cuda_graph=False, server_caps=spec.get("server_caps", False),
                            engine_flags=spec.get("engine_flags") or [])
    kind = spec["kind"]
    engine, cluster = ps.build_engine(ns, None if kind == "plain" else kind,
                                      None if kind == "plain" else Path(spec["drafter"]))
    max_running = engine.scheduler.limits.max_running_requests
    boot_s = time.perf_counter() - began
    sync = (lambda: None)
    if spec["device"] == "cuda":
        import torch

        sync = torch.cuda.synchronize
    pool = prompts(Path(spec["model"]), Path(spec["dataset"]), spec["prompt_limit"])
    made, live = 0, set()
    greedy = spec["temperature"] <= 0
    jitter = spec.get("output_jitter", 0.0)

    def output_len(i: int) -> int:
        if not jitter:
            return spec["output_len"]
        draw = random.Random(i).uniform(1 - jitter, 1 + jitter)  # NOTE: per request index: every arm alike
        return max(1, round(spec["output_len"] * draw))

    def top_up():
        nonlocal made
        while len(live) < spec["concurrency"]:
            rid = f"r{made}"
            engine.add_request(GenerateRequest(rid, pool[made % len(pool)], SamplingParams(
                max_new_tokens=output_len(made), temperature=spec["temperature"], top_p=spec["top_p"],
                ignore_eos=True, seed=None if greedy else made)))
            live.add(rid)
            made += 1

    policies = [p for p in (getattr(engine, "burst", None), getattr(engine, "burst_sampled", None),
                            getattr(engine, "burst_filtered", None)) if p is not None]
    stats = engine.spec.stats if getattr(engine, "spec", None) is not None else None
    graphs = getattr(getattr(engine, "runner", None), "graphs", None)
    slow: list = []  # the window's slowest steps (slow_steps), as (ms, kind, tokens, graph replays by kind)

    def run_until(finishes: int, times: dict | None = None, split: dict | None = None) -> int:
        """Step until `finishes` requests finish; times: each step's wall time by kind (the engine's own
        split: a prefill step is one whose scheduler ran a prompt chunk) -> [seconds]; split: finer kinds
        (step_kind) -> [(seconds, tokens the step reported)]."""
        done = tokens = 0
        scheduler = engine.scheduler
        while done < finishes:
            top_up()
            marks = step_marks(scheduler, policies, stats)
            replays = dict(graphs.replays) if graphs is not None and split is not None else None
            began = time.perf_counter()
            outputs = engine.step()
            spent = time.perf_counter() - began
            new = 0
            for out in outputs:
                new += len(out.new_token_ids)
                if out.finished:
                    live.discard(out.rid)
                    done += 1
            tokens += new
            if times is not None:
                times["prefill" if scheduler.num_prefill_steps != marks[0] else "decode"].append(spent)
            if split is not None:
                kind = step_kind(marks, step_marks(scheduler, policies, stats))
                split[kind].append((spent, new))
                keep_slowest(slow, spent, kind, new, replays, graphs)
        return tokens

    try:
        run_until(spec["warmup_requests"])
        sync()
        before = engine.live_stats()
        cpu0, t0 = time.process_time(), time.perf_counter()
        times = {"decode": [], "prefill": []}
        split = {kind: [] for kind in STEP_KINDS}
        tokens = run_until(spec["requests"], times, split)
        sync()
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        after = engine.live_stats()
    finally:
        cluster.stop(engine)
    delta = numeric_delta(after, before) or {}
    steps = {step_kind: {"steps": int(v[0]), "seconds": round(v[1], 4),
                         "mean_ms": round(1e3 * v[1] / v[0], 4) if v[0] else None}
             for step_kind, v in (delta.get("step_seconds") or {}).items()}  # prefill / decode
    spec_delta = delta.get("speculative") or {}
    return {"label": spec["label"], "kind": kind, "env": spec["env"], "boot_s": round(boot_s, 1),
            "max_running_requests": max_running,
            "window_s": round(wall, 4), "output_tokens": tokens, "tok_s": round(tokens / wall, 1),
            "cpu_ms_per_token": round(1e3 * cpu / tokens, 4), "steps": steps,
            "tokens_per_step": round(tokens / max(1, sum(s["steps"] for s in steps.values())), 3),
            "graph_replays": delta.get("total_graph_replays"),
            "spec": {k: spec_delta[k] for k in ("steps", "step_aside_steps", "committed_tokens",
                                                "context_skipped_steps") if k in spec_delta},
            "bursts": spec_delta.get("bursts"),  # the window's burst counters (bursts, iterations, stops, ...)
            # the cyclic collector's passes and seconds per generation in the window (engine/heap.py): a full
            # pass over what was allocated after the start-up freeze lands in whichever step triggers it
            "gc": {k: v for k, v in (delta.get("gc") or {}).items() if k in ("collections", "seconds")} or None,
            "step_ms": {k: spread(v) for k, v in times.items() if v},
            "step_split": {k: split_row(v) for k, v in split.items() if v},
            "slow_steps": [{"ms": round(ms, 4), "kind": kind, "tokens": n, "graph_replays": replayed}
                           for ms, kind, n, replayed in sorted(slow, key=lambda row: row[0], reverse=True)]}


SLOW_STEPS = 24  # the slowest steps of a window kept (slow_steps)


def keep_slowest(slow: list, seconds: float, kind: str, tokens: int, before: dict | None, graphs) -> None:
    """Keep the SLOW_STEPS slowest steps: ms, kind (step_kind), tokens, and which target graphs the step
    replayed or why it ran eagerly (the difference of CudaGraphRunner.replays, "eager (query)", ...)."""
    ms = 1e3 * seconds
    if len(slow) >= SLOW_STEPS and ms <= min(row[0] for row in slow):
        return
    replayed = None
    if before is not None:
        replayed = {k: v - before.get(k, 0) for k, v in graphs.replays.items() if v != before.get(k, 0)}
    slow.append((ms, kind, tokens, replayed))
    if len(slow) > SLOW_STEPS:
        slow.remove(min(slow, key=lambda row: row[0]))


# the finer split of steps (step_split): a step that admitted a prompt chunk; one that read back a DSpark
# burst (and may have launched the next, chained); one whose rows drafted and verified outside a burst;
# any other (a plain step: plain's every decode, DSpark's stepped-aside or declined ones)
STEP_KINDS = ("prefill", "burst", "drafted", "plain")


def step_marks(scheduler, policies: list, stats) -> tuple[int, int, int]:
    """Counters whose change between two reads says what a step did (step_kind)."""
    return (scheduler.num_prefill_steps, sum(p.burst_iterations for p in policies),
            stats.steps if stats is not None else 0)


def step_kind(before: tuple[int, int, int], after: tuple[int, int, int]) -> str:
    if after[0] != before[0]:
        return "prefill"
    if after[1] != before[1]:
        return "burst"
    return "drafted" if after[2] != before[2] else "plain"


def split_row(steps: list[tuple[float, int]]) -> dict:
    """One step kind's steps, seconds and reported tokens, with tokens per millisecond: what that kind of
    step yields for its time, to set beside a plain engine's decode steps."""
    seconds, tokens = sum(s for s, _ in steps), sum(n for _, n in steps)
    return {"steps": len(steps), "seconds": round(seconds, 4), "tokens": tokens,
            "mean_ms": round(1e3 * seconds / len(steps), 4), "p50_ms": spread([s for s, _ in steps])["p50"],
            "tokens_per_ms": round(tokens / (1e3 * seconds), 3) if seconds else None}


def spread(seconds: list[float]) -> dict:
    """Percentiles of one kind's step times (ms), and the share of that kind's time its slowest 1% of steps
    took: whether a kind is slow step after step or through a few stalls (a collection, a capture)."""
    ms = sorted(1e3 * s for s in seconds)

    def at(q: float) -> float:
        return round(ms[min(len(ms) - 1, int(q * len(ms)))], 4)

    tail = ms[len(ms) - max(1, len(ms) // 100):]
    return {"steps": len(ms), "p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": round(ms[-1], 4),
            "slowest_1pct_share": round(sum(tail) / sum(ms), 4) if sum(ms) else 0.0}


def summarise(arms: list[str], runs: list[dict], pairs: int) -> dict:
    """Per pair, each arm's tok/s over the first arm's; medians; each arm's medians of the step figures."""
    base = arms[0]
    by_pair = [{r["label"]: r for r in runs if r["pair"] == p} for p in range(pairs)]
    ratios = {label: [round(p[label]["tok_s"] / p[base]["tok_s"], 4) for p in by_pair if label in p and base in p]
              for label in arms[1:]}
    per_arm = {}
    for label in arms:
        mine = [r for r in runs if r["label"] == label]

        def med(get):
            values = [v for v in (get(r) for r in mine) if v is not None]
            return round(statistics.median(values), 4) if values else None

        per_arm[label] = {"tok_s": med(lambda r: r["tok_s"]), "tokens_per_step": med(lambda r: r["tokens_per_step"]),
                          "cpu_ms_per_token": med(lambda r: r["cpu_ms_per_token"]),
                          **{f"{kind}_mean_ms": med(lambda r, k=kind: (r["steps"].get(k) or {}).get("mean_ms"))
                             for kind in ("decode", "prefill")},
                          **{f"{kind}_steps": med(lambda r, k=kind: (r["steps"].get(k) or {}).get("steps"))
                             for kind in ("decode", "prefill")}}
    return {"ratios_vs_" + base: ratios,
            "median_ratio": {k: round(statistics.median(v), 4) for k, v in ratios.items() if v},
            "per_arm": per_arm}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path)
    parser.add_argument("--drafter", default=None, help="drafter folder, or `random` (with --random-like)")
    parser.add_argument("--random-like", action="store_true", help="random weights of the model's config")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--attention-backend", default=None)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--server-caps", action="store_true",
                        help="boot each engine with `sglaunch serve`'s default --max-running-requests (its CUDA graphs "
                             "and ragged tiers as a server's) instead of --concurrency")
    parser.add_argument("--engine-flag", dest="engine_flags", action="append", default=[], metavar="FLAG",
                        help="a `sglaunch serve` flag for every arm's engine (repeat; `--engine-flag=--max-total-tokens "
                             "--engine-flag=400000`)")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--output-jitter", type=float, default=0.0,
                        help="each request's length drawn in [(1 - J), (1 + J)] x --output-len (0: all alike)")
    parser.add_argument("--dataset", type=Path, default=DATASET)
    parser.add_argument("--prompt-limit", type=int, default=750, help="use the dataset's first N prompts, in turn")
    parser.add_argument("--requests", type=int, default=600, help="requests that finish inside the timed window")
    parser.add_argument("--warmup-requests", type=int, default=64)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--arm", action="append", type=parse_arm, default=None,
                        help="LABEL=KIND[,ENV=VALUE...] (default: plain=plain and dspark=compact)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.child:  # one run: its spec in a file, its result written beside it
        spec = json.loads(Path(args.child).read_text())
        Path(spec["result"]).write_text(json.dumps(run_arm(spec)))
        return 0
    if args.model is None:
        parser.error("--model is required")
    arms = args.arm or [parse_arm("plain=plain"), parse_arm("dspark=compact")]
    labels = [a["label"] for a in arms]
    if len(set(labels)) != len(labels):
        parser.error(f"--arm labels must differ: {labels}")
    needs_drafter = any(a["kind"] != "plain" for a in arms)
    if needs_drafter and not args.drafter:
        parser.error("a DSpark arm needs --drafter (a folder, or `random` with --random-like)")
    if args.requests < 1 or args.pairs < 1 or args.concurrency < 1:
        parser.error("--requests, --pairs and --concurrency must be at least 1")
    if not 0.0 <= args.output_jitter < 1.0:
        parser.error("--output-jitter must be in [0, 1)")
    work = Path(tempfile.mkdtemp(prefix="inprocess-ab-"))
    model, drafter = args.model, args.drafter
    if args.random_like or drafter == "random":
        import profile_step as ps

        if args.random_like:
            model = ps.random_like(args.model, work)
        if drafter == "random":
            drafter = ps.random_drafter(model, None, work)
        elif drafter and args.random_like:
            drafter = ps.random_drafter(model, Path(drafter), work)
    runs = []
    for pair in range(args.pairs):
        for arm in (arms if pair % 2 == 0 else arms[::-1]):
            spec = {**arm, "model": str(model), "drafter": str(drafter) if drafter else None,
                    "device": args.device, "dtype": args.dtype, "attention_backend": args.attention_backend,
                    "concurrency": args.concurrency, "temperature": args.temperature, "top_p": args.top_p,
                    "server_caps": args.server_caps, "engine_flags": args.engine_flags,
                    "output_len": args.output_len, "output_jitter": args.output_jitter,
                    "dataset": str(args.dataset), "prompt_limit": args.prompt_limit,
                    "requests": args.requests, "warmup_requests": args.warmup_requests,
                    "result": str(work / f"run{len(runs)}.json")}
            spec_file = work / f"spec{len(runs)}.json"
            spec_file.write_text(json.dumps(spec))
            proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(spec_file)])
            if proc.returncode != 0:
                print(f"run {len(runs)} ({arm['label']}, pair {pair + 1}) failed with exit code {proc.returncode}",
                      file=sys.stderr)
                return 1
            result = json.loads(Path(spec["result"]).read_text())
            result["pair"], result["run_order"] = pair, len(runs)
            runs.append(result)
            steps = ", ".join(f"{k} {v['steps']} x {v['mean_ms']} ms" for k, v in result["steps"].items())
            print(f"pair {pair + 1} {result['label']:>12}: {result['tok_s']:9.1f} tok/s "
                  f"over {result['window_s']:.2f} s "
                  f"({result['tokens_per_step']} tok/step; {steps}; CPU {result['cpu_ms_per_token']} ms/tok; "
                  f"spec {result['spec']})", flush=True)
    summary = summarise(labels, runs, args.pairs)
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"settings": {k: (str(v) if isinstance(v, Path) else v)
                                                      for k, v in vars(args).items() if k != "child"},
                                         "runs": runs, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
