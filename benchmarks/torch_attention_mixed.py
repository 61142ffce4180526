"""The torch attention backend on a step that mixes decodes with a prefill chunk: split into
padded groups by query length (the default, torch_backend.length_groups) against one padded group,
same run, same inputs.

    python benchmarks/torch_attention_mixed.py [--decodes 7] [--window 1] [--context 200] [--prefill 300]
        [--layers 30]

--window N: the decoding requests verify N rows each (DSpark's drafting requests beside an arrival's prompt).

SmolLM2's attention shape (9 query heads, 3 KV heads, head_dim 64), bf16, CPU by default.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from sglaunch.engine.attention.torch_backend import TorchAttentionBackend
from sglaunch.engine.kv_pool import KVPool
from sglaunch.engine.step import StepInput


def mixed_step(decodes: int, context: int, prefill: int, window: int = 1) -> StepInput:
    step, page = StepInput([], [], [], [], [], []), 0
    for q, kv in [(window, context)] * decodes + [(prefill, prefill)]:
        step.input_ids += [0] * q
        step.positions += list(range(kv - q, kv))
        step.query_lens.append(q)
        step.kv_lens.append(kv)
        step.page_tables.append(list(range(page, page + kv)))
        page += kv
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--decodes", type=int, default=7)
    parser.add_argument("--window", type=int, default=1)
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--prefill", type=int, default=300)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    dev, heads, kv_heads, head_dim = torch.device(args.device), 9, 3, 64
    step = mixed_step(args.decodes, args.context, args.prefill, args.window)
    pool = KVPool(1, sum(step.kv_lens), 1, kv_heads, head_dim, torch.bfloat16, dev)
    gen = torch.Generator().manual_seed(0)
    n = step.num_tokens
    q, k, v = (torch.randn(n, h, head_dim, generator=gen).bfloat16().to(dev) for h in (heads, kv_heads, kv_heads))
    times = {}
    for split in (False, True, False, True):
        backend = TorchAttentionBackend(pool, heads, kv_heads, head_dim, dev)
        backend.split_mixed_steps = split
        backend.prepare(step)
        backend.forward(0, q, k, v)  # warm-up
        runs = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            for _ in range(args.layers):
                backend.forward(0, q, k, v)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            runs.append(time.perf_counter() - start)
        times.setdefault(split, []).extend(runs)
    one, two = (statistics.median(times[s]) * 1e3 for s in (False, True))
    print(f"{args.decodes} requests of {args.window} rows at {args.context} tokens "
          f"+ one {args.prefill}-token prefill, "
          f"{args.layers} layers, bf16, {args.device}:")
    print(f"  one padded group  {one:8.1f} ms")
    print(f"  length groups     {two:8.1f} ms   ({one / two:.1f}x faster)")


if __name__ == "__main__":
    main()
