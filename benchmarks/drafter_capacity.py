"""What a larger DSpark drafter would cost per step (issue 19 item 3): random drafters of several
shapes for one target, each booted in an engine the way `serve --speculative-algorithm DSPARK`
boots it (compact mode, the start-up step-cost profile), and their DSpark work per step against
the target's own verify step, with the bundle size each shape would have.

    python benchmarks/drafter_capacity.py --model TARGET [--random-like] [--shapes 2x1024r8,3x768r8,...]
        [--device cuda] [--json out.json]

A shape `LxIrR` is L drafter layers, MLP width I and Markov rank R (the bundled SmolLM2 drafter is
2x1024r8). For each it reports, from the engine's start-up profile (the planner's own cost model:
median of 5 per size, graphs as serving replays them):

- `dspark_work_ms[requests]`: DSpark's work per step beside the target forward (drafter forward,
  block sampling, planning, accept), at the profiled request counts;
- `verify_ms[tokens]`: the target's forward over that many ragged tokens (8 = one request's
  gamma-7 window);
- `work_over_verify8`: DSpark work at 1 request over an 8-token verify, the issue's 20% budget
  (the drafter forward alone is part of the work, so a shape within 20% here is within it);
- `bundle_mb`: the drafter's own weights in bf16 (embeddings and LM head are the target's).

Random weights: step costs depend on shapes only; accept lengths need training (train-draft).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

SHAPE = re.compile(r"^(\d+)x(\d+)r(\d+)$")


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    shapes = []
    for item in text.split(","):
        m = SHAPE.match(item.strip())
        if not m:
            raise SystemExit(f"drafter_capacity: shape {item!r} is not LxIrR (e.g. 3x768r8)")
        shapes.append(tuple(int(g) for g in m.groups()))
    return shapes


def make_drafter(target: Path, shape: tuple[int, int, int], work: Path) -> tuple[Path, int]:
    """A random drafter of this shape for the target -> (folder, its own parameter count)."""
    from sglaunch.speculative.checkpoint import init_drafter_state, save_drafter
    from sglaunch.training import target as target_mod

    layers, width, rank = shape
    tcfg = target_mod.read_target_config(target)
    n = int(tcfg["num_hidden_layers"])
    cfg = target_mod.drafter_config_for(tcfg, num_layers=layers, block_size=7,
                                        layer_ids=target_mod.default_layer_ids(n, 5),
                                        mask_token_id=target_mod.default_mask_token(tcfg, target),
                                        markov_rank=rank, markov_head_type="vanilla")
    cfg = dataclasses.replace(cfg, intermediate_size=width)
    state = init_drafter_state(cfg, with_embed=False, with_lm_head=False)
    params = sum(t.numel() for t in state.values())
    return save_drafter(work / f"drafter_{layers}x{width}r{rank}", cfg, state), params


def measure(args, drafter: Path) -> dict:
    from profile_step import build_engine

    os.environ["SGLAUNCH_DSPARK_PROFILE_SPS"] = "1"
    began = time.perf_counter()
    engine, cluster = build_engine(args, "compact", drafter)
    try:
        sps = engine.spec.planner.sps
        if sps is None:
            raise SystemExit("drafter_capacity: the engine made no step-cost profile (see its log)")
        verify = {t: 1e3 / s for t, s in zip(sps.tokens, sps.steps_per_second)}
        work = {r: s * 1e3 for r, s in zip(sps.draft_requests, sps.draft_seconds_at)}
        decode = {r: s * 1e3 for r, s in zip(sps.decode_requests, sps.decode_seconds_at)}
        v8 = 1e3 / sps.sps(8)
        return {"boot_s": round(time.perf_counter() - began, 1), "verify_ms": verify, "dspark_work_ms": work,
                "plain_decode_ms": decode, "verify8_ms": v8,
                "work_over_verify8": (work[min(work)] / v8) if work else None}
    finally:
        cluster.stop(engine)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="target folder (config + tokenizer at least)")
    parser.add_argument("--random-like", action="store_true", help="random target weights of the model's config")
    parser.add_argument("--shapes", default="2x1024r8,3x768r8,3x1024r8,4x1024r8,2x1024r16,2x1536r8")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--attention-backend", default=None)
    parser.add_argument("--disable-cuda-graph", action="store_true")
    parser.add_argument("--concurrency", type=int, default=16, help="max running requests of each engine")
    parser.add_argument("--time-budget", type=float, default=0, help="stop starting shapes after S seconds (0: none)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from profile_step import random_like, release_device_memory

    shapes = parse_shapes(args.shapes)
    began, results = time.perf_counter(), []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.random_like:
            args.model = random_like(args.model, work)
        for shape in shapes:
            if args.time_budget and time.perf_counter() - began > args.time_budget:
                print(f"time budget spent: {shape} not measured", flush=True)
                break
            folder, params = make_drafter(args.model, shape, work)
            row = {"shape": "%dx%dr%d" % shape, "layers": shape[0], "mlp_width": shape[1], "markov_rank": shape[2],
                   "params_m": round(params / 1e6, 2), "bundle_mb": round(params * 2 / 1e6, 1), **measure(args, folder)}
            # NOTE: the next engine plans its KV cache from the free memory; without this the third
            # engine found none (H200, session 8: "budget -1.87 GiB")
            release_device_memory()
            results.append(row)
            w = row["dspark_work_ms"]
            print(f"{row['shape']}: {row['params_m']}M params, {row['bundle_mb']} MB; DSpark work "
                  + ", ".join(f"{r} req {ms:.2f} ms" for r, ms in sorted(w.items()))
                  + f"; verify 8 tok {row['verify8_ms']:.2f} ms; work/verify8 {row['work_over_verify8']:.2f}", flush=True)
    out = {"model": str(args.model), "device": args.device, "random_like": args.random_like, "shapes": results}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
