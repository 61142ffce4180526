"""What a step that admits prompts costs beside a decoding batch (issue 15's HTTP row).

    python benchmarks/mixed_step_cost.py --model DIR [--device cuda] [--attention-backend flashinfer]
        [--batch 64] [--prompt-tokens 16,64,128,256] [--arrivals 1,2,4] [--repeats 9] [--json OUT]

Over HTTP at 64 concurrent requests a quarter of the engine's steps carry a prefill chunk, and
such a step took 2.27 ms against 1.38 for a decode step (H200, session 15, `http_vs_inprocess.py`).
Whether admitting arrivals in groups could save anything depends on how that extra splits into a
part paid once per step and a part paid per prompt token; this measures it. `--batch` requests
decode (random prompts, greedy, EOS ignored); for each prompt length P and number of arrivals A,
`--repeats` times: A requests of P random prompt tokens are added, the next engine.step() (the
batch's decode rows plus the A prefill chunks) is timed, then they are aborted (KV freed, the
radix cache is off) and a few decode steps are timed as the baseline. Steps run synchronously
(SGLAUNCH_OVERLAP=0, set here) and are timed with CUDA events on a GPU.

Per (P, A): the median mixed step, the median decode step, extra = mixed - decode, and extra per
prompt token; last, a least-squares fit extra = fixed + per_token x (P x A) over every point. If
`fixed` is small against the per-token part, grouping arrivals saves nothing and the prefill path's
cost per token is what to cut. Writes --json (default mixed_step_cost.json in the working folder).

`--profile P,A` (e.g. 16,1) then profiles that point against plain decode steps, `--repeats` of
each: the device time per step of each kernel (torch.profiler, CUDA), the graph replayed, and the
host functions with the most cumulative time per step (cProfile), so the extra can be split into
device kernels (the ragged graph's attention, its padded tier) and host work (admission, plan,
read-back). `--extra-tiers` sets SGLANG_DSPARK_RAGGED_CAPTURE_TOKEN_BUCKETS for the run (e.g.
72,80,96,112: ragged tiers just above a 64-request decode batch).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import os
import random
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

DECODE_STEPS = 3  # decode steps timed after each mixed step (the baseline)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="checkpoint folder")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--attention-backend", default=None, help="engine attention backend (default: the engine's)")
    parser.add_argument("--batch", type=int, default=64, help="requests decoding beside the arrivals")
    parser.add_argument("--prompt-tokens", default="16,64,128,256", help="prompt lengths P of the arrivals")
    parser.add_argument("--arrivals", default="1,2,4", help="arrivals A admitted in one step")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--decode-prompt-len", type=int, default=64, help="prompt length of the decoding batch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=Path("mixed_step_cost.json"))
    parser.add_argument("--profile", default=None, metavar="P,A",
                        help="also profile A arrivals of P tokens against decode steps (kernels and host functions)")
    parser.add_argument("--extra-tiers", default=None, help="SGLANG_DSPARK_RAGGED_CAPTURE_TOKEN_BUCKETS for this run")
    parser.add_argument("--top", type=int, default=14, help="kernels and host functions listed per kind of step")
    args = parser.parse_args(argv)
    args.profile_point = None
    if args.profile:
        try:
            p, a = (int(x) for x in args.profile.split(","))
        except ValueError:
            parser.error(f"--profile {args.profile!r}: expected P,A (prompt tokens, arrivals), e.g. 16,1")
        if p < 1 or a < 1:
            parser.error("--profile P,A: both must be positive")
        args.profile_point = (p, a)
    args.prompt_list = [int(x) for x in args.prompt_tokens.split(",") if x]
    args.arrival_list = [int(x) for x in args.arrivals.split(",") if x]
    if args.batch < 1 or args.repeats < 1 or not args.prompt_list or not args.arrival_list:
        parser.error("--batch and --repeats must be positive, --prompt-tokens and --arrivals non-empty")
    return args


def fit(points: list[tuple[int, float]]) -> dict:
    """Least squares extra = fixed + per_token x tokens over (tokens, extra seconds) points."""
    n = len(points)
    if n < 2 or len({t for t, _ in points}) < 2:
        return {"fixed_s": None, "per_token_s": None}
    mx = sum(t for t, _ in points) / n
    my = sum(e for _, e in points) / n
    sxx = sum((t - mx) ** 2 for t, _ in points)
    slope = sum((t - mx) * (e - my) for t, e in points) / sxx
    return {"fixed_s": my - slope * mx, "per_token_s": slope}


def measure(args) -> dict:
    os.environ["SGLAUNCH_OVERLAP"] = "0"  # NOTE: one step per step() call, timed as such
    if args.extra_tiers is not None:
        os.environ["SGLANG_DSPARK_RAGGED_CAPTURE_TOKEN_BUCKETS"] = args.extra_tiers
    import engine_vs_hf as evh
    from engine_vs_hf import Stopwatch

    from sglaunch.engine.interface import GenerateRequest, SamplingParams
    from sglaunch.engine.launch import create_engine

    options = {"attention_backend": args.attention_backend} if args.attention_backend else {}
    rounds = len(args.prompt_list) * len(args.arrival_list) * args.repeats
    new_tokens = rounds * (DECODE_STEPS + 1) + 32  # the batch decodes through every round
    if args.profile_point is not None:  # two kinds x two passes x (the step + the abort step)
        new_tokens += 8 * args.repeats
    longest = max(args.prompt_list)
    max_tokens = (args.batch * (args.decode_prompt_len + new_tokens)
                  + max(args.arrival_list) * (longest + 8) + 4096)
    config = evh.engine_config(args.model, args.dtype, args.device, max_total_tokens=max_tokens, **options)
    engine, cluster = create_engine(config)
    rng = random.Random(args.seed)
    vocab = engine.runner.model.spec.vocab_size if hasattr(engine.runner, "model") else 32000
    device = engine.runner.device
    result = {"what": "step time with A prompts of P tokens admitted beside a decoding batch",
              "batch": args.batch, "device": args.device, "dtype": args.dtype,
              "attention_backend": args.attention_backend, "repeats": args.repeats, "rows": []}
    try:
        decode = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        for i in range(args.batch):
            prompt = tuple(rng.randrange(1, vocab) for _ in range(args.decode_prompt_len))
            engine.add_request(GenerateRequest(f"d{i}", prompt, decode))
        for _ in range(4):  # the batch's prefill, then steady decode
            engine.step()
        arrival = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
        serial = 0
        for tokens in args.prompt_list:
            for count in args.arrival_list:
                mixed, plain = [], []
                for _ in range(args.repeats):
                    rids = []
                    for _ in range(count):
                        serial += 1
                        rids.append(f"a{serial}")
                        prompt = tuple(rng.randrange(1, vocab) for _ in range(tokens))
                        engine.add_request(GenerateRequest(rids[-1], prompt, arrival))
                    with Stopwatch(device) as watch:
                        engine.step()
                    mixed.append(watch.seconds)
                    for rid in rids:
                        engine.abort(rid)
                    for _ in range(DECODE_STEPS):
                        with Stopwatch(device) as watch:
                            engine.step()
                        plain.append(watch.seconds)
                m, d = statistics.median(mixed), statistics.median(plain)
                row = {"prompt_tokens": tokens, "arrivals": count, "mixed_ms": m * 1e3, "decode_ms": d * 1e3,
                       "extra_ms": (m - d) * 1e3, "extra_us_per_prompt_token": (m - d) * 1e6 / (tokens * count)}
                result["rows"].append(row)
                print(f"P={tokens:4d} A={count}: mixed {row['mixed_ms']:.3f} ms, decode {row['decode_ms']:.3f} ms, "
                      f"extra {row['extra_ms']:.3f} ms ({row['extra_us_per_prompt_token']:.2f} us a prompt token)",
                      flush=True)
        if args.profile_point is not None:
            result["profile"] = profile_point(engine, args, rng, vocab, arrival, serial)
        running = len(engine.scheduler.running)
        if running != args.batch:
            raise RuntimeError(f"the decoding batch shrank to {running} of {args.batch} requests during the run")
    finally:
        cluster.stop(engine)
    model = fit([(r["prompt_tokens"] * r["arrivals"], r["extra_ms"] / 1e3) for r in result["rows"]])
    result["fit"] = {"fixed_ms": None if model["fixed_s"] is None else model["fixed_s"] * 1e3,
                     "per_token_us": None if model["per_token_s"] is None else model["per_token_s"] * 1e6}
    return result


def profile_point(engine, args, rng, vocab, arrival, serial: int) -> dict:
    """Kernels (device time per step) and host functions (cumulative time per step) of
    `--repeats` mixed steps (A arrivals of P tokens) and as many decode steps; only the measured
    step itself is profiled (the step that lets the aborts take effect is not)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from sglaunch.engine.interface import GenerateRequest

    tokens, count = args.profile_point
    cuda = engine.runner.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    graphs = getattr(engine.runner, "graphs", None)
    out = {"prompt_tokens": tokens, "arrivals": count}

    def one(kind: str, measure) -> None:
        nonlocal serial
        rids = []
        if kind == "mixed":
            for _ in range(count):
                serial += 1
                rids.append(f"p{serial}")
                prompt = tuple(rng.randrange(1, vocab) for _ in range(tokens))
                engine.add_request(GenerateRequest(rids[-1], prompt, arrival))
        sync()
        measure()
        for rid in rids:
            engine.abort(rid)
        engine.step()  # the aborts take effect (not measured)
        sync()

    for kind in ("mixed", "decode"):
        before = dict(graphs.replays) if graphs is not None else {}
        device: dict[str, list[float]] = {}  # kernel -> [calls, device us]

        def profiled() -> None:
            with profile(activities=activities) as prof:
                engine.step()
                sync()
            for e in prof.key_averages():
                t = getattr(e, "self_device_time_total", 0)
                if t > 0:
                    row = device.setdefault(e.key[:100], [0, 0.0])
                    row[0] += e.count
                    row[1] += t

        for _ in range(args.repeats):
            one(kind, profiled)
        host = cProfile.Profile()

        def host_profiled() -> None:
            host.enable()
            engine.step()
            sync()
            host.disable()

        for _ in range(args.repeats):
            one(kind, host_profiled)
        buf = io.StringIO()
        pstats.Stats(host, stream=buf).sort_stats("cumulative").print_stats(args.top + 10)
        per = 1.0 / args.repeats
        kernels = [{"kernel": k, "calls_per_step": round(c * per, 1), "device_us_per_step": round(t * per, 1)}
                   for k, (c, t) in sorted(device.items(), key=lambda kv: kv[1][1], reverse=True)[:args.top]]
        replays = {k: v - before.get(k, 0) for k, v in graphs.replays.items()} if graphs is not None else {}
        out[kind] = {"device_us_per_step": round(sum(t for _, t in device.values()) * per, 1),
                     "top_kernels": kernels, "graph_replays": replays, "cprofile": buf.getvalue()}
        print(f"--- {kind} step (P={tokens} A={count}): kernels {out[kind]['device_us_per_step']:.1f} us of device "
              f"time a step; graph replays over every pass {replays}", flush=True)
        for k in kernels:
            print(f"  {k['device_us_per_step']:8.1f} us  x{k['calls_per_step']:6.1f}  {k['kernel']}", flush=True)
        print("\n".join(buf.getvalue().splitlines()[:args.top + 18]), flush=True)
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    result = measure(args)
    result["seconds"] = time.perf_counter() - start
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    f = result["fit"]
    if f["fixed_ms"] is not None:
        print(f"fit: extra = {f['fixed_ms']:.3f} ms a step + {f['per_token_us']:.3f} us a prompt token "
              f"(batch {args.batch}); written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
