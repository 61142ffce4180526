"""What the sampler's filtering costs per step, on this machine's device (CPU by default):

    python benchmarks/sampler_cost.py [--vocab 49152] [--rows 1,8,64] [--device cpu] [--threads 1]

For each row count, the median of `--repeats` calls of
- `softmax`: softmax(logits / T) alone (the floor);
- `filtered temperature-only`: `filtered_probs` for rows that set a temperature alone (what most
  requests send; since session 32 such rows skip the sort);
- `sorted filter`: the sort-based top-k / top-p / min-p filter over the same rows (what every
  row took before session 32, and what a row with top_p < 1 still takes);
- `sample temperature-only`: the plain sampler's whole `sample()` for those rows (filter, the
  uniforms from each request's CPU generator, the draw, the log-probabilities, one read-back);
- `draw`: its inverse-CDF draw alone (a float64 cumulative sum over the vocabulary);
and, as the DSpark verify of one request at gamma 7 filters 8 rows, `--rows 8` is that step's share.
Prints one JSON object (milliseconds). Ratios within one run are what to compare.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def median_ms(fn, repeats: int, sync) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    import torch

    from sglaunch.engine.interface import SamplingParams
    from sglaunch.engine.sampler import _sorted_filter, draw, filtered_probs, make_generator, sample

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=49152, help="SmolLM2's vocabulary by default")
    parser.add_argument("--rows", default="1,8,64")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (the dev machine has 2)")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    gen = torch.Generator().manual_seed(0)
    out = {"device": str(device), "vocab": args.vocab, "threads": args.threads, "rows": {}}
    for n in (int(x) for x in args.rows.split(",")):
        logits = (torch.randn(n, args.vocab, generator=gen) * 3.0).to(device)
        params = [SamplingParams(max_new_tokens=1, temperature=0.7)] * n
        generators = [make_generator(i) for i in range(n)]
        probs = filtered_probs(logits, params)
        uniforms = torch.rand(n, generator=gen, dtype=torch.float64).to(device)
        out["rows"][n] = {
            "softmax": median_ms(lambda: torch.softmax(logits / 0.7, -1), args.repeats, sync),
            "filtered temperature-only": median_ms(lambda: filtered_probs(logits, params), args.repeats, sync),
            "sorted filter": median_ms(lambda: _sorted_filter(logits, params), args.repeats, sync),
            "sample temperature-only": median_ms(lambda: sample(logits, params, generators), args.repeats, sync),
            "draw": median_ms(lambda: draw(probs, uniforms), args.repeats, sync),
        }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
