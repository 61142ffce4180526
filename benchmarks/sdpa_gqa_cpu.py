"""torch's SDPA on a CPU, as the torch attention backend calls it, with grouped-query heads passed as
`enable_gqa` against folded into the query rows (sglaunch/engine/attention/torch_backend.py):

    python benchmarks/sdpa_gqa_cpu.py [--threads 2] [--json OUT]

SmolLM2-135M's shape (9 query heads over 3 key/value heads, head_dim 64, bf16): one decode row or an
8-row verify window per request, 1 and 8 requests, 200 and 600 keys. Prints the median time of a call
each way (ms) and their ratio; the outputs are checked equal first. On the dev CPU (2 cores, AMD EPYC with
avx512_bf16; benchmarks/cpu40/sdpa_gqa_cpu.json) folding took 3.1-6.3x less time for decode rows and 0.8-1.3x for
8-row windows (0.80-0.96x at 1 request, 1.16-1.28x at 8), so the backend folds decode rows and windows of several
requests.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from sglaunch.kernels.layer_ops import folded_gqa_attention

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64


def gqa(q, k, v, mask):
    """q [B, max_q, H, D], k / v [B, max_kv, KV, D], mask [B, 1, max_q, max_kv] -> [B, max_q, H, D]."""
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                                          enable_gqa=True).transpose(1, 2)


def folded(q, k, v, mask):
    """The backend's layout (sglaunch.kernels.layer_ops.folded_gqa_attention) -> [B, max_q, H, D]."""
    group = q.shape[2] // KV_HEADS
    rows_mask = mask if q.shape[1] == 1 else mask.repeat(1, 1, group, 1)
    return folded_gqa_attention(q, k.transpose(1, 2), v.transpose(1, 2), rows_mask, q.shape[-1] ** -0.5)


def median_ms(fn, repeats: int = 7, calls: int = 100) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = []
    for batch in (1, 8):
        for keys in (200, 600):
            for max_q in (1, 8):
                q = torch.randn(batch, max_q, HEADS, HEAD_DIM, dtype=torch.bfloat16)
                k = torch.randn(batch, keys, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16)
                v = torch.randn_like(k)
                position = keys - max_q + torch.arange(max_q)
                mask = (torch.arange(keys)[None, :] <= position[:, None]).expand(batch, 1, max_q, keys)
                torch.testing.assert_close(folded(q, k, v, mask), gqa(q, k, v, mask), atol=2e-2, rtol=2e-2)
                a = median_ms(lambda: gqa(q, k, v, mask))
                b = median_ms(lambda: folded(q, k, v, mask))
                rows.append({"batch": batch, "keys": keys, "query_rows": max_q, "enable_gqa_ms": round(a, 4),
                             "folded_ms": round(b, 4), "ratio": round(a / b, 2)})
                print(f"batch {batch} keys {keys} query rows {max_q}: enable_gqa {a:.3f} ms, folded {b:.3f} ms "
                      f"({a / b:.2f}x)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"threads": args.threads, "rows": rows}, out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
