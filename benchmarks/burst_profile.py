"""What one DSpark burst iteration costs on the device, and where it goes.

    python benchmarks/burst_profile.py --model DIR [--random-like] [--drafter DIR|random]
        [--requests 1,8,32] [--context 256] [--attention triton,torch] [--block-n 64,128]
        [--splits auto,1,4,8] [--combine separate,fold] [--json out.json]

For each burst attention (`--attention`, set through `SGLAUNCH_DSPARK_KERNELS`: the Triton kernel
and its SDPA reference) it boots the engine `serve` would boot with a DSpark drafter (static mode, so nothing
is profiled at start-up), then, per request count, runs bursts of synthetic greedy requests at
position `--context` and reports, in the same run:

- `iteration_ms`: the median wall time of a burst divided by its iterations (a burst's replays are
  queued back to back and read back once, so this is the device's time per drafting step);
- `kernel_ms` and `kernels`: the CUDA kernel time and kernel count per iteration (torch.profiler
  over one burst), and the kernels with the most time: what to fuse next;
- `splits`: the Triton attention's key splits at that request count's graph (`--splits`: auto
  chooses them from the batch bucket, slot-table width, KV heads and SM count; a number fixes them,
  at most one split per key block; every `--block-n` x `--splits` x `--combine` triple is one configuration);
- `combine` and `attention_us` / `combine_us`: how the splits are merged (`--combine`, through
  `SGLAUNCH_DSPARK_BURST_COMBINE`: `separate` launches `_burst_combine_kernel` after the split kernel,
  `fold` merges in the split kernel's last program) and the per-iteration time of the split kernel
  and of the combine kernel (0 with fold); with more than one `--combine` value a last table puts
  each mode's iteration and attention time beside the first mode's, per request count;
- beside them, on the same engine: a plain decode step of the same requests, pipelined as an
  overlapped engine runs it (`sps_profile._pipelined_seconds`), the number a burst iteration has
  to beat by its accept length.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def burst_input(engine, requests: int, context: int, borrowed: list[int]):
    from sglaunch.speculative.burst import BurstInput

    runner, rng = engine.runner.burst, random.Random(requests)
    page, vocab = engine.config.page_size, engine.runner.spec.vocab_size
    tables, second = [], []
    for _ in range(requests):
        pages = engine.allocator.alloc(math.ceil((context + runner.max_iterations * runner.Q) / page))
        extra = engine.allocator.alloc(runner.Q) if pages is not None and runner.chains == 2 else []
        if pages is None or extra is None:
            raise ValueError(f"the KV pool cannot hold {requests} requests")
        borrowed += pages + extra
        tables.append(pages)
        second.append(extra)
    # a second chain (SGLAUNCH_DSPARK_SECOND_CHAIN set): its window's pages too
    return BurstInput([rng.randrange(vocab) for _ in range(requests)], [context] * requests, tables,
                      runner.max_iterations, second if runner.chains == 2 else None)


def attention_splits(engine, requests: int, context: int) -> int | None:
    """The key splits of the Triton attention in the graph a burst of `requests` at `context` replays."""
    runner = engine.runner.burst
    if not runner.attn.use_triton:
        return None
    key = runner.pick(requests, runner.context_needed([context] * requests, runner.max_iterations))
    return runner.attention_splits(key) if key is not None else None


ATTENTION_KERNEL, COMBINE_KERNEL = "_burst_attention_kernel", "_burst_combine_kernel"


def kernel_us(by_name: dict[str, list[float]], name: str, iterations: int) -> float:
    """The device time per iteration of the kernels whose name contains `name` (all layers)."""
    return sum(sum(v) for k, v in by_name.items() if name in k) / iterations


def measure(engine, requests: int, context: int, repeats: int, top: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from sglaunch.speculative.sps_profile import ProfilePlan, _pipelined_seconds, decode_step

    device = engine.runner.device
    cuda = device.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    borrowed: list[int] = []
    try:
        burst = burst_input(engine, requests, context, borrowed)
        N = burst.iterations

        def run():
            engine._on_all_ranks("burst", burst, engine.runner.run_burst)

        for _ in range(3):
            run()
        times = []
        for _ in range(repeats):
            sync()
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        by_name: dict[str, list[float]] = {}
        kernels = []
        if cuda:  # the device's kernels of one burst (their count and time per iteration)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                run()
                sync()
            kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
            for e in kernels:
                by_name.setdefault(e.name, []).append(e.time_range.elapsed_us())
        ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
        plan = ProfilePlan((1,), window=burst.iterations, context_len=context, repeats=repeats, warmup=3,
                           greedy=True, pipelined=True)
        tables = [list(t) for t in burst.page_tables]
        step = decode_step(requests, tables, plan, engine.runner.spec.vocab_size, random.Random(0))
        step.logits = False
        plain = _pipelined_seconds(engine, plan, step)
        return {
            "requests": requests, "context": context, "iterations": N,
            "splits": attention_splits(engine, requests, context),
            "combine": engine.runner.burst.attn.combine if engine.runner.burst.attn.use_triton else None,
            "iteration_ms": statistics.median(times) / N * 1e3,
            "kernel_ms": sum(sum(v) for v in by_name.values()) / N / 1e3,
            "kernels": len(kernels) / N,
            "attention_us": kernel_us(by_name, ATTENTION_KERNEL, N),
            "combine_us": kernel_us(by_name, COMBINE_KERNEL, N),
            "plain_pipelined_ms": plain * 1e3,
            "top_kernels": [{"name": name[:90], "per_iteration_us": sum(v) / N, "count": len(v) / N}
                            for name, v in ranked],
        }
    finally:
        engine.allocator.free(borrowed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--drafter", default="random", help="drafter folder, or `random`")
    parser.add_argument("--random-like", action="store_true", help="random weights of the model's config")
    parser.add_argument("--requests", default="1,8,32")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--attention", default="triton,torch")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a smoke test (no kernels)")
    parser.add_argument("--block-n", default="64", help="key slots per loop step of the Triton attention, "
                        "comma-separated: each value is one more configuration (triton only)")
    parser.add_argument("--splits", default="auto", help="key splits of the Triton attention (split-K), "
                        "comma-separated: `auto` (from the shapes and the SM count) or a number; each value is "
                        "one more configuration (triton only)")
    parser.add_argument("--combine", default="separate", help="how the Triton attention merges its splits, "
                        "comma-separated: `separate` (a combine kernel) or `fold` (in the split kernel); each value "
                        "is one more configuration (triton only)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    combines = [c.strip() for c in args.combine.split(",") if c.strip()]
    from sglaunch.kernels.burst_attention import COMBINE_ENV, COMBINES

    if not combines or any(c not in COMBINES for c in combines):
        parser.error(f"--combine {args.combine!r}: comma-separated values of {', '.join(COMBINES)}")
    from profile_step import random_drafter, random_like, release_device_memory

    from dspark_sweep import build_config
    from sglaunch.engine.launch import create_engine

    work = Path(tempfile.mkdtemp(prefix="burst-profile-"))
    results = []
    try:
        model = random_like(args.model, work) if args.random_like else args.model
        drafter = random_drafter(model, None, work) if args.drafter == "random" else Path(args.drafter)
        counts = [int(x) for x in args.requests.split(",")]
        import sglaunch.kernels.burst_attention as burst_kernel

        splits_values = [None if v.strip() == "auto" else int(v) for v in args.splits.split(",")]
        configs = [(a, int(b), s, c) for a in args.attention.split(",")
                   for b in (args.block_n.split(",") if a == "triton" else ["0"])
                   for s in (splits_values if a == "triton" else [None])
                   for c in (combines if a == "triton" else [None])]
        default_block_n = burst_kernel.DEFAULT_BLOCK_N
        for attention, block_n, splits, combine in configs:
            os.environ["SGLAUNCH_DSPARK_KERNELS"] = attention
            # read once by the burst runner when the engine boots (the graphs capture its kernels)
            os.environ[COMBINE_ENV] = combine or "separate"
            # NOTE: before the engine boots: the graphs capture the kernel with them (and the
            # runner sizes the splits' scratch at start-up)
            burst_kernel.DEFAULT_BLOCK_N = block_n or default_block_n
            burst_kernel.DEFAULT_SPLITS = splits
            os.environ.setdefault("SGLAUNCH_DSPARK_BURST", "4")
            tokens = ["--model-path", str(model), "--served-model-name", "burst", "--device", args.device,
                      "--max-running-requests", str(max(counts)), "--random-seed", "0",
                      "--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", str(drafter)]
            environ = {**os.environ, "SGLANG_RAGGED_VERIFY_MODE": "static"}
            engine, cluster = create_engine(build_config(tokens, environ))
            try:
                for requests in counts:
                    row = {"attention": attention, "block_n": block_n or None,
                           "splits_option": ("auto" if splits is None else splits) if attention == "triton" else None,
                           "combine_option": combine,
                           **measure(engine, requests, args.context, args.repeats, args.top)}
                    results.append(row)
                    label = (f"{attention}/{block_n}/s{row['splits_option']}={row['splits']}/{combine}" if block_n
                             else attention)
                    attn = (f"; attention {row['attention_us']:.1f} + combine {row['combine_us']:.1f} us"
                            if attention == "triton" else "")
                    print(f"{label:27s} R={requests:3d} C={args.context}: iteration {row['iteration_ms']:.3f} ms "
                          f"(kernels {row['kernel_ms']:.3f} ms, {row['kernels']:.0f} a step{attn}); plain pipelined "
                          f"{row['plain_pipelined_ms']:.3f} ms", flush=True)
                    for k in row["top_kernels"]:
                        print(f"    {k['per_iteration_us']:8.1f} us  x{k['count']:5.1f}  {k['name']}")
            finally:
                cluster.stop(engine)
                del engine
                release_device_memory()
        if len(combines) > 1:
            print(compare_combines(results, combines))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(results, indent=1))
    return 0


def compare_combines(results: list[dict], combines: list[str]) -> str:
    """Each combine mode's iteration and attention time (split kernel + combine kernel, per
    iteration) beside the first mode's, per (block size, splits option, request count)."""
    base = combines[0]
    rows = {}
    for r in results:
        if r.get("combine_option"):
            rows.setdefault((r["block_n"], r["splits_option"], r["requests"], r["context"]), {})[r["combine_option"]] = r
    lines = [f"combine against {base}: iteration ms, attention (+ combine) us per iteration"]
    for (block_n, splits, requests, context), by in rows.items():
        ref = by.get(base)
        for c in combines:
            r = by.get(c)
            if r is None:
                continue
            total = r["attention_us"] + r["combine_us"]
            ratio = (f"  x{r['iteration_ms'] / ref['iteration_ms']:.3f} iteration, "
                     f"x{total / (ref['attention_us'] + ref['combine_us']):.3f} attention"
                     if ref is not None and c != base and ref["iteration_ms"] and ref["attention_us"] + ref["combine_us"]
                     else "")
            lines.append(f"  block {block_n} splits {splits}={r['splits']} R={requests:3d} C={context} {c:9s}: "
                         f"{r['iteration_ms']:.3f} ms, {r['attention_us']:.1f} + {r['combine_us']:.1f} = "
                         f"{total:.1f} us{ratio}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
