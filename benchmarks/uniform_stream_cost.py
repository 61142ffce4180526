"""The host cost of a step's per-row uniforms: one `torch.rand(1)` and read-back per sampled row (a
bare generator, before 3384a2a) against sampler.UniformStream's blocks, on this machine's CPU:

    python benchmarks/uniform_stream_cost.py [--rows 16] [--steps 20000]

Each step draws one uniform for each of --rows requests, as the plain sampler does at T > 0; the
median of 5 rounds of --steps steps, in microseconds a step. Both give the same values (tested in
tests/engine/test_sampler.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def per_step_us(sources: list, steps: int, draw) -> float:
    rounds = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(steps):
            [draw(s) for s in sources]
        rounds.append((time.perf_counter() - t) / steps * 1e6)
    return statistics.median(rounds)


def main(argv: list[str] | None = None) -> int:
    from sglaunch.engine.sampler import draw_uniform, make_generator, make_uniform_stream

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20000)
    args = parser.parse_args(argv)
    bare = per_step_us([make_generator(i) for i in range(args.rows)], args.steps, draw_uniform)
    stream = per_step_us([make_uniform_stream(i) for i in range(args.rows)], args.steps, draw_uniform)
    print(f"{args.rows} sampled rows a step: torch.rand(1) per row {bare:.1f} us, UniformStream {stream:.1f} us "
          f"({bare - stream:.1f} us a step less)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
