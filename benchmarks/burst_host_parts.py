"""Where a DSpark burst's host work goes, on the CPU (session 14; figures in benchmarks/NOTES.md):

    python benchmarks/burst_host_parts.py parts --model benchmarks/gpu6/smolcfg
    python benchmarks/burst_host_parts.py slot-rows

- parts: host_probes.py's `burst` probe (32 requests, random drafter, static mode) with the pieces
  of the host work around each burst timed in total over the run: Scheduler.schedule and commit,
  LLMEngine._candidates, _burst_plan and _outputs, the per-iteration statistics, the planner's
  observe_accepts and the periodic log line (divide by the bursts the probe prints).
- slot-rows: speculative.burst.slot_rows against the per-request way it replaced, 32 requests at
  330 positions, page sizes 1 and 16, best of 5 x 100 calls.
One run on a shared 2-core machine is noisy: take the order of magnitude.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def parts(model: str) -> None:
    import host_probes as hp
    import profile_step as ps

    spent: dict[str, float] = {}
    real_build = ps.build_engine

    def build(*args, **kwargs):
        engine, cluster = real_build(*args, **kwargs)
        if engine.spec is None or engine.spec.mode != "static":  # host_probes' other engines (plain, aside)
            return engine, cluster
        for obj, names in ((engine.scheduler, ("schedule", "commit")),
                           (engine, ("_candidates", "_burst_plan", "_outputs")),
                           (engine.spec.stats, ("record_step",)), (engine.spec.planner, ("observe_accepts",)),
                           (engine.spec, ("_maybe_log",))):
            for name in names:
                hp.time_calls(spent, obj, name)
        return engine, cluster

    ps.build_engine = build
    real_tail = hp.burst_tail

    def burst_tail(spec, drafter, requests):
        real_tail(spec, drafter, requests)
        print("total us over the run (warm-up included):", {k: round(v * 1e6) for k, v in spent.items()})

    hp.burst_tail = burst_tail
    sys.argv = ["host_probes.py", "--model", model]
    hp.main()


def slot_rows_timing() -> None:
    # NOTE: numpy first, as torch imports it in the engine: imported after our modules, every
    # variant below ran about 2x slower on the dev machine (allocation, not the code)
    import numpy as np

    from array import array

    from sglaunch.speculative.burst import slot_rows

    def per_request(page_tables, lengths, page_size, width, fill):
        """The per-request way slot_rows was written before session 14 (the baseline)."""
        out = np.full((len(page_tables), width), fill, dtype=np.int64)
        col = np.arange(width, dtype=np.int64)
        for r, (table, n) in enumerate(zip(page_tables, lengths)):
            n = min(int(n), width)
            if n > 0:
                pages = np.asarray(table, dtype=np.int32)
                out[r, :n] = pages[col[:n] // page_size].astype(np.int64) * page_size + col[:n] % page_size
        return out

    tables = [array("i", range(i * 1000, i * 1000 + 330)) for i in range(32)]
    lengths = [330] * 32
    for page_size in (1, 16):
        for name, fn in (("per request", per_request), ("slot_rows", slot_rows)):
            best = min(_per_call(lambda: fn(tables, lengths, page_size, 512, 0)) for _ in range(5))
            print(f"{name}, 32 requests x 330 positions, page size {page_size}: {best * 1e6:.0f} us")


def _per_call(fn, calls: int = 100) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "slot-rows":
        slot_rows_timing()
    elif len(sys.argv) == 4 and sys.argv[1] == "parts" and sys.argv[2] == "--model":
        parts(sys.argv[3])
    else:
        raise SystemExit(__doc__)
