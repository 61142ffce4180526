"""What a verify window's extra rows cost the target's matmuls on a CPU: SmolLM2-135M's 120 layer weights
(distinct tensors, so they stream from memory as the engine's do) plus its 49,152-row LM head, bf16, for
M = 1, 2, 4, 8, 16, 24 rows:

    python benchmarks/cpu_matmul_rows.py [--threads 2]

Prints the mean ms of one pass over every weight per M (15 passes after 3 warm-up ones). On the dev CPU
(session 41, benchmarks/cpu41/cpu_matmul_rows.txt; two runs) one row took 19.6 ms (about 11 GB/s of
weights) and eight rows 22.9 / 23.9: an 8-token verify's matmuls cost 3.3-4.3 ms more than a decode
step's. The same shapes over four reused weights ran from cache in about 11 ms and say nothing.
"""

from __future__ import annotations

import argparse
import time

import torch

HIDDEN, INTERMEDIATE, VOCAB, LAYERS = 576, 1536, 49152, 30
SHAPES = [(HIDDEN, 960), (HIDDEN, HIDDEN), (HIDDEN, 2 * INTERMEDIATE), (INTERMEDIATE, HIDDEN)]  # (in, out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    weights = [torch.randn(o, i, dtype=torch.bfloat16) for _ in range(LAYERS) for i, o in SHAPES]
    weights.append(torch.randn(VOCAB, HIDDEN, dtype=torch.bfloat16))
    for rows in (1, 2, 4, 8, 16, 24):
        x = {i: torch.randn(rows, i, dtype=torch.bfloat16) for i in (HIDDEN, INTERMEDIATE)}
        for _ in range(3):
            for w in weights:
                torch.nn.functional.linear(x[w.shape[1]], w)
        start = time.perf_counter()
        for _ in range(15):
            for w in weights:
                torch.nn.functional.linear(x[w.shape[1]], w)
        print(f"{rows:3d} rows: {(time.perf_counter() - start) / 15 * 1e3:7.2f} ms a pass", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
