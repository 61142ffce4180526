"""Host-side probes of a CPU engine (random SmolLM2-shaped weights, no GPU), for the figures in
sglaunch/engine/heap.py and sglaunch/speculative/planner.py (`_at_prior`):

    python benchmarks/host_probes.py --model SMOL [--concurrency 64]

- heap: tracked objects of a booted plain engine (before its freeze), a full collection's time,
  and gc.get_freeze_count()'s time once frozen (it walks every frozen object);
- aside: at `--concurrency` requests that really step aside (the random drafter's prior set to
  a survival of 0.05 a slot, so drafting never pays) with bursts on (SGLAUNCH_DSPARK_BURST=8),
  the host time of LLMEngine._burst_plan + _decide per step (best of 5 x 300 calls), and of
  _decide alone.
- burst (`--burst-requests`, default 32): bursts of the random drafter in static mode (no
  profile: every decode step bursts; float32, whose CPU forwards are faster), the host work after
  each burst's rows are read (`LLMEngine._collect_burst`: the tokens parsed, `Scheduler.commit`
  with the stop rules, the stats, `_outputs`), in us a burst and a committed token, and the part
  of it before the next burst's launch (the commit and its plan: with chained bursts the rest runs
  while the device works on the next burst; with SGLAUNCH_DSPARK_BURST_CHAIN=0 all of it adds to
  every burst's wall time on a GPU).
One run on a shared 2-core machine is noisy: take the order of magnitude.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def time_calls(spent: dict, obj, name: str, key: str | None = None) -> None:
    """Replace obj.name with a wrapper that adds each call's wall time to spent[key or name]."""
    import functools

    real = getattr(obj, name)

    @functools.wraps(real)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            spent[key or name] = spent.get(key or name, 0.0) + time.perf_counter() - start

    setattr(obj, name, timed)


def best_us(fn, calls: int = 300, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t) / calls)
    return best * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="a SmolLM2 folder (config + tokenizer)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--burst-requests", type=int, default=32)
    args = parser.parse_args()
    os.environ.setdefault("SGLAUNCH_DSPARK_BURST", "8")
    import profile_step as ps

    work = Path(tempfile.mkdtemp())
    model = ps.random_like(args.model, work)
    drafter = ps.random_drafter(model, None, work)
    spec = argparse.Namespace(model=model, device="cpu", dtype="bfloat16", concurrency=args.concurrency,
                              attention_backend=None, disable_cuda_graph=False)

    engine, cluster = ps.build_engine(spec, None, None)
    gc.unfreeze()  # as before create_engine froze it
    gc.collect()
    tracked = len(gc.get_objects())
    t = time.perf_counter()
    gc.collect()
    full_ms = (time.perf_counter() - t) * 1e3
    gc.freeze()
    count_ms = best_us(gc.get_freeze_count, calls=5, repeats=3) / 1e3
    print(f"heap: {tracked} tracked objects, a full collection {full_ms:.1f} ms; frozen, "
          f"gc.get_freeze_count() {count_ms:.2f} ms for {gc.get_freeze_count()} objects")
    cluster.stop(engine)

    engine, cluster = ps.build_engine(spec, "compact", drafter)
    planner = engine.spec.planner
    planner.start_prior = [0.05] * planner.block_size
    planner.reset_prior()
    load = ps.Load(engine, args.concurrency, 32, 400, 49000)
    for _ in range(3):
        load.step()
    chunks = engine.scheduler.schedule(lookahead=False)

    def aside():
        candidates = engine._candidates(chunks)
        engine._burst_plan(chunks, candidates)
        engine._decide(chunks, candidates)

    candidates = engine._candidates(chunks)
    assert engine._decide(chunks, candidates) is None, "the probe's engine drafted: not a stepped-aside step"
    print(f"aside: {len(chunks)} requests, _burst_plan + _decide {best_us(aside):.1f} us a step, "
          f"_decide {best_us(lambda: engine._decide(chunks, candidates)):.1f} us")
    cluster.stop(engine)
    burst_tail(spec, drafter, args.burst_requests)
    return 0


def burst_tail(spec, drafter, requests: int) -> None:
    """The host work of a burst after its forward passes (see the module docstring)."""
    import profile_step as ps

    spec.concurrency, spec.dtype = requests, "float32"
    engine, cluster = ps.build_engine(spec, "static", drafter)  # NOTE: static: no profile, every step bursts
    runner, timed = engine.runner, {"idle": 0.0, "tail": 0.0, "bursts": 0, "tokens": 0}
    real_read, real_launch, real_observe = runner.burst.read, runner.launch_burst, engine.burst.observe

    def read(pending):
        out = real_read(pending)
        timed["mark"] = time.perf_counter()
        return out

    def launch_burst(burst):
        chained = "mark" in timed
        if chained:  # a chained launch: the host work before it left the device idle
            timed["idle"] += time.perf_counter() - timed["mark"]
            timed["launched"] = True
        t = time.perf_counter()
        out = real_launch(burst)
        if chained:  # NOTE: on a CPU the launch runs the whole burst: not host work of the one before
            timed["in_launch"] = time.perf_counter() - t
        return out

    def observe(accepted, seconds, n):
        spent = time.perf_counter() - timed.pop("mark") - timed.pop("in_launch", 0.0)
        timed["tail"] += spent
        if not timed.pop("launched", False):
            timed["idle"] += spent
        timed["bursts"] += 1
        timed["tokens"] += sum(a + 1 for row in accepted for a in row)
        return real_observe(accepted, seconds, n)

    runner.burst.read, runner.launch_burst, engine.burst.observe = read, launch_burst, observe
    load = ps.Load(engine, requests, 32, 10_000, 49000)
    for _ in range(3):  # warm-up, then only what follows counts
        load.step()
    timed.update(idle=0.0, tail=0.0, bursts=0, tokens=0)
    deadline = time.perf_counter() + 240
    while timed["bursts"] < 6 and time.perf_counter() < deadline:
        load.step()
    n = max(1, timed["bursts"])
    print(f"burst: {requests} requests, {timed['bursts']} bursts ({engine.burst.burst_iterations} iterations in all, "
          f"{engine.burst.chained} chained), host work after a burst's rows {1e6 * timed['tail'] / n:.0f} us a burst "
          f"({1e6 * timed['tail'] / max(1, timed['tokens']):.2f} us a committed token, {timed['tokens'] / n:.1f} tokens a "
          f"burst), of it before the next launch {1e6 * timed['idle'] / n:.0f} us")
    cluster.stop(engine)


if __name__ == "__main__":
    raise SystemExit(main())
