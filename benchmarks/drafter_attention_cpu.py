"""The drafter layer's attention on a CPU: SDPA with a mask and enable_gqa (the call before session 25)
against grouped-query heads folded into the query rows (sglaunch/speculative/drafter.py since then),
SmolLM2's drafter shape (9 query heads, 3 K/V heads, head_dim 64, 8 block rows a request). Prints the
largest difference between the two outputs and the mean time of each, per dtype and (requests, context):

    python benchmarks/drafter_attention_cpu.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 8


def timed(fn, repeats: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    rep = HEADS // KV_HEADS
    for dtype in (torch.bfloat16, torch.float32):
        for batch, context in ((1, 128), (8, 512), (64, 1024)):
            q = torch.randn(batch * BLOCK, HEADS, HEAD_DIM, dtype=dtype)
            keys = torch.randn(batch, context + BLOCK, KV_HEADS, HEAD_DIM, dtype=dtype).transpose(1, 2)
            values = torch.randn(batch, context + BLOCK, KV_HEADS, HEAD_DIM, dtype=dtype).transpose(1, 2)
            col = torch.arange(context + BLOCK)[None, :]
            lens = torch.randint(0, context + 1, (batch,))
            mask = ((col < lens[:, None]) | (col >= context))[:, None, None, :]

            def expanded():
                out = F.scaled_dot_product_attention(q.view(batch, BLOCK, HEADS, HEAD_DIM).transpose(1, 2), keys,
                                                     values, attn_mask=mask, enable_gqa=True)
                return out.transpose(1, 2).reshape(batch * BLOCK, HEADS * HEAD_DIM)

            def folded():
                q4 = q.view(batch, BLOCK, KV_HEADS, rep, HEAD_DIM).permute(0, 2, 3, 1, 4)
                out = F.scaled_dot_product_attention(q4.reshape(batch, KV_HEADS, rep * BLOCK, HEAD_DIM), keys, values,
                                                     attn_mask=mask)
                out = out.view(batch, KV_HEADS, rep, BLOCK, HEAD_DIM).permute(0, 3, 1, 2, 4)
                return out.reshape(batch * BLOCK, HEADS * HEAD_DIM)

            diff = (folded().float() - expanded().float()).abs().max().item()
            print(f"{str(dtype):15} {batch:3} requests x {context:5} context: max diff {diff:.3g}; enable_gqa "
                  f"{timed(expanded, args.repeats):7.2f} ms, folded {timed(folded, args.repeats):7.2f} ms")


if __name__ == "__main__":
    main()
