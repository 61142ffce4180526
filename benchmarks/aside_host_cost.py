"""The host work a DSpark engine adds to a stepped-aside step, on a CPU (no GPU needed):

    python benchmarks/aside_host_cost.py [--concurrency 64] [--steps 1500] [--whole] [--temperature T]

A tiny random model shaped from benchmarks/gpu6/smolcfg (hidden 64, 6 layers: its forward is
cheap) and a random 2-layer drafter whose prior survival is 0.05 a slot, so drafting never pays
and every step steps aside; --concurrency requests of 128 tokens kept in flight (greedy, or seeded
at --temperature). Prints the mean time a
step of each DSpark-only part of LLMEngine (`_candidates`, `_burst_plan`, `_decide`,
`_draft_context`, the planner's `observe_step_seconds`), each timed around its call over
--steps steps after a warm-up. --whole also times a plain engine against the DSpark engine on the
same load, the host time of a step outside the forward (step wall minus `_run_on_all_ranks`),
best of 5 rounds each, twice in turn: on a shared 2-core machine that difference is noisy (about
40 us), the parts are not. SGLAUNCH_OVERLAP=1 takes the pipelined path the GPU takes.

Why: at c=64 on the H200's host the engine's CPU a step equals the step (about 20 us a token, 64
tokens a 1.2 ms step), so each microsecond of a stepped-aside step's own work is throughput
(session 23: DSpark stepped aside on every step at c=64 and served 0.89x of plain).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from host_probes import time_calls  # noqa: E402

PARTS = ("_candidates", "_burst_plan", "_decide", "_draft_context")


def tiny_model(work: Path) -> tuple[Path, Path]:
    import profile_step as ps

    tiny = work / "tinycfg"
    tiny.mkdir()
    for f in (HERE / "gpu6" / "smolcfg").iterdir():
        if f.is_file():
            shutil.copy(f, tiny / f.name)
    config = json.loads((tiny / "config.json").read_text())
    config.update(hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                  num_key_value_heads=2)
    (tiny / "config.json").write_text(json.dumps(config))
    model = ps.random_like(tiny, work)
    return model, ps.random_drafter(model, None, work)


def boot(args, model: Path, drafter: Path | None):
    import profile_step as ps

    spec = argparse.Namespace(model=model, device="cpu", dtype="float32", concurrency=args.concurrency,
                              attention_backend=None, disable_cuda_graph=False)
    engine, cluster = ps.build_engine(spec, "compact" if drafter else None, drafter)
    if drafter is not None:
        planner = engine.spec.planner
        planner.start_prior = [0.05] * planner.block_size
        planner.reset_prior()
    # NOTE: 128 tokens a request, as the benches: requests end and new ones arrive (their prefill
    # beside the decodes), and the KV pool never runs short (requests that never ended filled it,
    # and the batch fell under the 33 a burst holds)
    load = ps.Load(engine, args.concurrency, 32, 128, 49000, temperature=args.temperature)
    for _ in range(40):  # warm-up: past the context-skip streak
        load.step()
    return engine, cluster, load


def parts(args, model: Path, drafter: Path) -> None:
    engine, cluster, load = boot(args, model, drafter)
    acc: dict[str, float] = {}
    for name in PARTS:
        time_calls(acc, engine, name)
    time_calls(acc, engine.spec.planner, "observe_step_seconds")
    for _ in range(args.steps):
        load.step()
    per_step = {name: 1e6 * seconds / args.steps for name, seconds in acc.items()}
    print(f"{args.concurrency} requests, {args.steps} steps, {engine.context_skipped_steps} without the draft "
          f"context: " + ", ".join(f"{name} {us:.1f} us" for name, us in per_step.items())
          + f"; together {sum(per_step.values()):.1f} us a step")
    cluster.stop(engine)


def outside_forward(args, model: Path, drafter: Path | None) -> float:
    """Best of 5 rounds of 300 steps: a step's host time outside the forward, in us."""
    engine, cluster, load = boot(args, model, drafter)
    inner: dict[str, float] = {}
    time_calls(inner, engine, "_run_on_all_ranks", "forward")
    best = float("inf")
    for _ in range(5):
        inner["forward"] = 0.0
        t = time.perf_counter()
        for _ in range(300):
            load.step()
        best = min(best, (time.perf_counter() - t - inner["forward"]) / 300 * 1e6)
    cluster.stop(engine)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--whole", action="store_true", help="also plain against DSpark outside the forward")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="the requests' temperature (0: greedy; > 0: sampled, seeded per request)")
    args = parser.parse_args()
    model, drafter = tiny_model(Path(tempfile.mkdtemp()))
    parts(args, model, drafter)
    if args.whole:
        plain, dspark = [], []
        for _ in range(2):
            plain.append(outside_forward(args, model, None))
            dspark.append(outside_forward(args, model, drafter))
        print(f"outside the forward, us a step: plain {plain[0]:.1f} / {plain[1]:.1f}, DSpark stepped aside "
              f"{dspark[0]:.1f} / {dspark[1]:.1f}; difference {(sum(dspark) - sum(plain)) / 2:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
