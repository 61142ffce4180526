"""Where one engine step's time goes: plain decoding against DSpark, on the real engine.

    python benchmarks/profile_step.py --model DIR [--drafter DIR] [--device cuda]
        [--concurrency 1] [--steps 30] [--attention-backend flashinfer] [--random-like]
        [--overlap 0|1|both]

For each configuration (`plain`, then `dspark-static` and `dspark-compact` when a drafter is
given) it builds the engine in-process, keeps `--concurrency` greedy requests in flight (EOS
ignored), warms up, then measures `--steps` steps three ways:
- wall time per step (median, with a device sync per step so that queued work is counted);
- `torch.profiler`: host-side operator calls per step (each one is a dispatch and often a kernel
  launch: on a GPU machine with a slow host, this count times the per-launch cost bounds a step
  that runs outside a CUDA graph), kernel launches and graph replays per step, and the
  operators with the most host time;
- `cProfile`: the Python functions with the most cumulative time per step;
- phases: the time (device-synchronised at both ends) and the operators dispatched in each part
  of the step (the drafter's forward, `sample_block`, the rest of `propose`, the target forward,
  `accept`: the device accept, or the host one of an all-greedy batch), and how many target
  forwards replayed a CUDA graph.

`--overlap both` profiles plain decoding twice in one run, `plain` with SGLAUNCH_OVERLAP=0 and
`plain+overlap` with SGLAUNCH_OVERLAP=1 (0 or 1: only that one), and each DSpark mode too
(`dspark-compact` and `dspark-compact+overlap`: with overlap its stepped-aside steps are
pipelined and a drafting step drains the pipeline first); the table ends with their ratio and,
per DSpark configuration with overlap, its stepped-aside steps' pipelined time (each step's own
unsynchronised wall time in the pipelined windows) beside plain+overlap's pipelined step. A device sync after every step
would drain the overlap pipeline, so each configuration also reports the pipelined step time:
`--steps` steps back to back, synchronised at both ends only (median of three windows); compare
overlap on and off by that column. E.g. SmolLM2 at batch 1 and 64:

    python benchmarks/profile_step.py --model SMOL --concurrency 1 --overlap both --steps 200
    python benchmarks/profile_step.py --model SMOL --concurrency 64 --overlap both --steps 200

With a drafter the wall times are also split by kind of step: the median of the steps that
stepped aside (the planner found drafting would not pay: a plain decode step of a DSpark engine,
which should cost what a `plain` step costs) and of those that drafted; and the drafter's CUDA
graphs are counted: captured at start-up, and captured while measuring (0 expected: every
graph is captured at start-up).

`--random-like` replaces the model's weights with random ones of the same config and tokenizer
(written to a temporary folder), and `--drafter random` builds a random drafter for it, so the
profile needs only a config and a tokenizer. Prints a report; `--json FILE` also saves the figures.
"""

from __future__ import annotations

import argparse
import cProfile
import contextlib
import io
import json
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))  # the sibling scripts (dspark_sweep)

MODE_ENV = "SGLANG_RAGGED_VERIFY_MODE"
OVERLAP_ENV = "SGLAUNCH_OVERLAP"  # read once by each ModelRunner at start-up


def random_like(model: Path, work: Path) -> Path:
    """A random-weight copy of the model folder (config, tokenizer files, new weights)."""
    import torch
    import transformers

    out = work / "target"
    out.mkdir(parents=True, exist_ok=True)
    for f in model.iterdir():
        if f.is_file() and ".safetensors" not in f.name and not f.name.endswith(".bin") and f.name != "sglaunch-model.json":
            shutil.copy(f, out / f.name)
    config = transformers.AutoConfig.from_pretrained(str(model))
    torch.manual_seed(0)
    net = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    net.save_pretrained(str(out))
    return out


def random_drafter(target: Path, like: Path | None, work: Path) -> Path:
    """A random drafter: the shape of `like` (a drafter folder) or a 2-layer default."""
    from sglaunch.speculative.checkpoint import init_drafter_state, save_drafter
    from sglaunch.speculative.drafter_config import load_drafter_config
    from sglaunch.training import target as target_mod

    if like is not None:
        cfg = load_drafter_config(like)
    else:
        tcfg = target_mod.read_target_config(target)
        n = int(tcfg["num_hidden_layers"])
        cfg = target_mod.drafter_config_for(tcfg, num_layers=2, block_size=7,
                                            layer_ids=target_mod.default_layer_ids(n, 5),
                                            mask_token_id=target_mod.default_mask_token(tcfg, target),
                                            markov_rank=8, markov_head_type="vanilla")
    return save_drafter(work / "drafter", cfg, init_drafter_state(cfg, with_embed=False, with_lm_head=False))


def build_engine(args, mode: str | None, drafter: Path | None):
    """The engine `sglaunch serve` would boot with these flags (dspark_sweep.build_config), in-process."""
    from dspark_sweep import build_config

    from sglaunch.engine.launch import create_engine

    tokens = ["--model-path", str(args.model), "--served-model-name", "profile", "--device", args.device,
              "--dtype", args.dtype, "--max-running-requests", str(max(args.concurrency, 1)), "--random-seed", "0"]
    if args.attention_backend:
        tokens += ["--attention-backend", args.attention_backend]
    if args.disable_cuda_graph:
        tokens.append("--disable-cuda-graph")
    environ = {k: v for k, v in os.environ.items() if k != MODE_ENV}
    if mode is not None:
        tokens += ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", str(drafter)]
        environ[MODE_ENV] = mode
    return create_engine(build_config(tokens, environ))


class Load:
    """Keeps `concurrency` greedy requests in flight."""

    def __init__(self, engine, concurrency: int, prompt_len: int, max_tokens: int, vocab: int):
        from sglaunch.engine.interface import GenerateRequest, SamplingParams

        self.engine, self.made = engine, 0
        self.make = lambda i: GenerateRequest(
            f"r{i}", tuple((17 * i + 31 * j) % (vocab - 100) + 50 for j in range(prompt_len)),
            SamplingParams(max_new_tokens=max_tokens, temperature=0.0, ignore_eos=True))
        self.concurrency, self.live = concurrency, set()

    def top_up(self):
        while len(self.live) < self.concurrency:
            req = self.make(self.made)
            self.made += 1
            self.live.add(req.rid)
            self.engine.add_request(req)

    def step(self):
        self.top_up()
        for out in self.engine.step():
            if out.finished:
                self.live.discard(out.rid)


class OpCounter:
    """Counts the aten operators dispatched (a TorchDispatchMode); `.total` so far."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                counter.total += 1
                return func(*args, **(kwargs or {}))

        self.total, self.mode = 0, Mode()


def phase_profile(engine, load, steps: int, sync) -> dict:
    """Per phase of a step: milliseconds (one pass) and dispatched operators (a second pass,
    since counting slows every operator) per step; wrapped methods, synchronised at both ends
    so that queued device work is charged to its phase."""
    timed, counted = _phase_pass(engine, load, steps, sync, False), _phase_pass(engine, load, steps, sync, True)
    for name, value in timed.items():
        if "ms" in value and name in counted:
            value["ops"] = counted[name]["ops"]
    return timed


def _phase_pass(engine, load, steps: int, sync, count: bool) -> dict:
    counter, spent, ops = OpCounter(), {}, {}
    runner, decoder = engine.runner, getattr(engine, "spec", None)

    def wrap(obj, attr: str, name: str):
        original = getattr(obj, attr)

        def timed(*a, **k):
            sync()
            t, n = time.perf_counter(), counter.total
            try:
                return original(*a, **k)
            finally:
                sync()
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
                ops[name] = ops.get(name, 0) + counter.total - n

        setattr(obj, attr, timed)
        return lambda: setattr(obj, attr, original)

    undo = [wrap(runner, "forward", "target forward"), wrap(runner, "draft_block", "draft forward")]
    if decoder is not None:
        undo += [wrap(decoder, "plan", "plan (step aside?)"), wrap(decoder, "propose", "propose (all)"), wrap(decoder.drafter, "sample_block", "sample_block"),
                 wrap(decoder, "accept", "accept"), wrap(decoder, "accept_greedy", "accept")]
    graphs = getattr(runner, "graphs", None)
    before = dict(graphs.replays) if graphs is not None else {}
    try:
        sync()
        t, n = time.perf_counter(), counter.total
        with counter.mode if count else contextlib.nullcontext():
            for _ in range(steps):
                load.step()
        sync()
        wall, total = time.perf_counter() - t, counter.total - n
    finally:
        for u in undo:
            u()
    out = {"step": {"ms": 1e3 * wall / steps, "ops": total / steps}}
    for name in spent:
        out[name] = {"ms": 1e3 * spent[name] / steps, "ops": ops[name] / steps}
    if "propose (all)" in out:  # propose contains the draft forward and sample_block
        rest = {k: out["propose (all)"][k] - out.get("draft forward", {}).get(k, 0) - out.get("sample_block", {}).get(k, 0)
                for k in ("ms", "ops")}
        out["propose (rest)"] = rest
    if graphs is not None:
        out["graph replays per step"] = {k: (graphs.replays[k] - before.get(k, 0)) / steps for k in graphs.replays}
    return out


def pipelined_step_ms(load, steps: int, sync, windows: int = 3, by_kind: dict | None = None) -> float:
    """Milliseconds per step over `steps` steps back to back, synchronised at both ends only
    (what a serving loop sees; with overlap the host builds step N + 1 while step N runs).
    by_kind (a DSpark engine): each step's own wall time, unsynchronised, appended by kind
    ("aside" / "drafted"): with overlap a stepped-aside step's is its share of the pipeline."""
    times, spec = [], getattr(load.engine, "spec", None)
    for _ in range(windows):
        sync()
        t = time.perf_counter()
        for _ in range(steps):
            drafted = spec.stats.steps if spec is not None else None
            s = time.perf_counter()
            load.step()
            if by_kind is not None and drafted is not None:
                by_kind["drafted" if spec.stats.steps > drafted else "aside"].append(time.perf_counter() - s)
        sync()
        times.append((time.perf_counter() - t) / steps)
    return 1e3 * statistics.median(times)


def measure(args, name: str, mode: str | None, drafter: Path | None, overlap: str | None = None) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    if overlap is not None:
        os.environ[OVERLAP_ENV] = overlap
    engine, cluster = build_engine(args, mode, drafter)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    try:
        load = Load(engine, args.concurrency, args.prompt_len, args.max_tokens, engine.runner.spec.vocab_size)
        draft_graphs = getattr(engine.runner.draft, "graphs", None) if engine.runner.draft is not None else None
        captured_at_start = draft_graphs.captures if draft_graphs is not None else None
        for _ in range(args.warmup):
            load.step()
        sync()
        times, by_kind = [], {"aside": [], "drafted": []}
        for _ in range(args.steps):
            drafted = engine.spec.stats.steps if engine.spec is not None else None
            t = time.perf_counter()
            load.step()
            sync()
            times.append(time.perf_counter() - t)
            if drafted is not None:
                by_kind["drafted" if engine.spec.stats.steps > drafted else "aside"].append(times[-1])
        pipelined_kinds = {"aside": [], "drafted": []}
        pipelined = pipelined_step_ms(load, args.steps, sync, by_kind=pipelined_kinds)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
        with profile(activities=activities) as prof:
            for _ in range(args.steps):
                load.step()
            sync()
        events = prof.key_averages()
        per = 1.0 / args.steps
        launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC",
                                                            "cuLaunchKernelEx"))
        graph_launches = sum(e.count for e in events if e.key in ("cudaGraphLaunch", "cuGraphLaunch"))
        syncs = sum(e.count for e in events if e.key in ("cudaStreamSynchronize", "cudaDeviceSynchronize",
                                                         "cudaMemcpyAsync", "cudaMemcpy", "cudaEventSynchronize"))
        aten = [e for e in events if e.key.startswith("aten::")]
        aten_calls = sum(e.count for e in aten)
        top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:args.top]
        top_ops = [{"op": e.key, "calls_per_step": round(e.count * per, 1),
                    "self_cpu_ms_per_step": round(e.self_cpu_time_total * per / 1e3, 3)} for e in top]
        # device busy time: the kernels' own time (host operators carry none of their own)
        device = [e for e in events if getattr(e, "self_device_time_total", 0) > 0]
        device_ms = sum(e.self_device_time_total for e in device) * per / 1e3
        top_kernels = [{"kernel": e.key[:90], "calls_per_step": round(e.count * per, 1),
                        "device_ms_per_step": round(e.self_device_time_total * per / 1e3, 3)}
                       for e in sorted(device, key=lambda e: e.self_device_time_total, reverse=True)[:args.top]]
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.steps):
            load.step()
        sync()
        profiler.disable()
        buf = io.StringIO()
        pstats.Stats(profiler, stream=buf).sort_stats("cumulative").print_stats(args.top)
        stats = engine.live_stats() if hasattr(engine, "live_stats") else {}
        phases = phase_profile(engine, load, args.steps, sync)
        graphs_info = None
        if draft_graphs is not None:
            graphs_info = {"captured_at_start_up": captured_at_start, "capture_seconds": round(draft_graphs.capture_seconds, 2),
                           "captured_while_measuring": draft_graphs.captures - captured_at_start,
                           "replays": draft_graphs.replays}
    finally:
        cluster.stop(engine)
    kinds = {f"{kind}_steps": len(v) for kind, v in by_kind.items()} if engine.spec is not None else {}
    kinds.update({f"{kind}_step_ms_median": round(1e3 * statistics.median(v), 3)
                  for kind, v in by_kind.items() if v and engine.spec is not None})
    kinds.update({f"{kind}_pipelined_step_ms_median": round(1e3 * statistics.median(v), 3)
                  for kind, v in pipelined_kinds.items() if v and engine.spec is not None})
    return {"config": name, "overlap": bool(getattr(engine, "overlap", False)),
            "pipelined_step_ms": round(pipelined, 3), "step_ms_median": round(1e3 * statistics.median(times), 3),
            "step_ms_min": round(1e3 * min(times), 3), "aten_calls_per_step": round(aten_calls * per, 1),
            "kernel_launches_per_step": round(launches * per, 1), "graph_launches_per_step": round(graph_launches * per, 2),
            "memcpy_or_sync_calls_per_step": round(syncs * per, 1), "top_ops": top_ops,
            "device_busy_ms_per_step": round(device_ms, 3), "top_kernels": top_kernels,
            "cprofile": buf.getvalue(), "phases": phases, "step_kinds": kinds, "drafter_graphs": graphs_info,
            "spec": {k: v for k, v in stats.items() if "spec" in k or "accept" in k or "draft" in k or "verify" in k}}


def release_device_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="target folder (config + tokenizer at least)")
    parser.add_argument("--drafter", default=None, help="drafter folder, or `random` (with --random-like)")
    parser.add_argument("--random-like", action="store_true", help="random weights of the model's config")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--attention-backend", default=None, help="as `serve` (default: its auto)")
    parser.add_argument("--disable-cuda-graph", action="store_true")
    parser.add_argument("--modes", default="static,compact")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--overlap", choices=["0", "1", "both"], default=None,
                        help="SGLAUNCH_OVERLAP for plain decoding; both: plain and plain+overlap in one run "
                             "(default: the environment's)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="profile-step-"))
    try:
        if args.random_like:
            args.model = random_like(args.model, work)
        drafter = None
        if args.drafter == "random":
            drafter = random_drafter(args.model, None, work)
        elif args.drafter:
            drafter = Path(args.drafter)
            if args.random_like:  # the real drafter's shape with random weights (its aliasing matches any target)
                drafter = random_drafter(args.model, drafter, work)
        plain = {"both": [("plain", "0"), ("plain+overlap", "1")], "0": [("plain", "0")],
                 "1": [("plain+overlap", "1")], None: [("plain", None)]}[args.overlap]
        configs = [(name, None, overlap) for name, overlap in plain]
        # NOTE: DSpark with overlap too (its stepped-aside steps pipelined, drafting steps draining
        # first), beside plain+overlap: a stepped-aside step should cost what a plain+overlap one does
        dspark = {"both": [("", "0"), ("+overlap", "1")], "0": [("", "0")], "1": [("+overlap", "1")],
                  None: [("", None)]}[args.overlap]
        configs += [(f"dspark-{m}{suffix}", m, overlap) for m in args.modes.split(",") if drafter is not None and m
                    for suffix, overlap in dspark]
        results = []
        saved = os.environ.get(OVERLAP_ENV)
        for name, mode, overlap in configs:
            try:
                r = measure(args, name, mode, drafter, overlap)
            finally:
                os.environ.pop(OVERLAP_ENV, None)
                if saved is not None:
                    os.environ[OVERLAP_ENV] = saved
            release_device_memory()  # the next configuration plans its KV cache from the free memory
            results.append(r)
            print(f"\n=== {name}: step {r['step_ms_median']} ms (min {r['step_ms_min']}; pipelined "
                  f"{r['pipelined_step_ms']}); per step: "
                  f"{r['aten_calls_per_step']} aten calls, {r['kernel_launches_per_step']} kernel launches, "
                  f"{r['graph_launches_per_step']} graph launches, {r['memcpy_or_sync_calls_per_step']} memcpy/sync")
            if r["spec"]:
                print(f"spec: {json.dumps(r['spec'])[:600]}")
            if r["step_kinds"]:
                print(f"steps by kind: {json.dumps(r['step_kinds'])}")
            if r["drafter_graphs"]:
                print(f"drafter graphs: {json.dumps(r['drafter_graphs'])}")
            for name, v in r["phases"].items():
                if "ms" in v:
                    print(f"  phase {name:<16} {v['ms']:8.3f} ms  {v['ops']:8.1f} ops/step")
                else:
                    print(f"  {name}: {v}")
            for op in r["top_ops"]:
                print(f"  {op['self_cpu_ms_per_step']:8.3f} ms  {op['calls_per_step']:7.1f}x  {op['op'][:90]}")
            if r["top_kernels"]:
                print(f"  device busy {r['device_busy_ms_per_step']:.3f} ms/step; kernels with the most device time:")
                for k in r["top_kernels"]:
                    print(f"  {k['device_ms_per_step']:8.3f} ms  {k['calls_per_step']:7.1f}x  {k['kernel']}")
            print("\n".join(r["cprofile"].splitlines()[:60]))
        if args.json:
            args.json.write_text(json.dumps({"argv": sys.argv if argv is None else argv, "results": results}, indent=1))
        print("\nconfig           step ms  pipelined ms  device ms   aten/step  launches/step  graphs/step  aside ms (n)  drafted ms (n)")
        for r in results:
            k = r["step_kinds"]
            kind = (f"  {k.get('aside_step_ms_median', float('nan')):8.2f} ({k['aside_steps']:2d})"
                    f"  {k.get('drafted_step_ms_median', float('nan')):9.2f} ({k['drafted_steps']:2d})") if k else ""
            print(f"{r['config']:<15} {r['step_ms_median']:8.2f} {r['pipelined_step_ms']:13.2f} "
                  f"{r['device_busy_ms_per_step']:10.2f} {r['aten_calls_per_step']:11.1f} "
                  f"{r['kernel_launches_per_step']:14.1f} {r['graph_launches_per_step']:12.2f}" + kind)
        by_name = {r["config"]: r for r in results}
        for r in results:  # with overlap, a stepped-aside step against a plain+overlap one
            k, plain_on = r["step_kinds"], by_name.get("plain+overlap")
            if r["overlap"] and k.get("aside_pipelined_step_ms_median") is not None and plain_on is not None:
                print(f"{r['config']}: stepped-aside step {k['aside_pipelined_step_ms_median']:.3f} ms pipelined "
                      f"({k['aside_steps']} synced: {k.get('aside_step_ms_median', float('nan')):.3f} ms) against "
                      f"plain+overlap {plain_on['pipelined_step_ms']:.3f} ms")
        if "plain" in by_name and "plain+overlap" in by_name:
            on, off = by_name["plain+overlap"], by_name["plain"]
            print(f"overlap on / off (same run): pipelined step {on['pipelined_step_ms']:.3f} / "
                  f"{off['pipelined_step_ms']:.3f} ms = {on['pipelined_step_ms'] / off['pipelined_step_ms']:.3f}x "
                  f"(device busy {on['device_busy_ms_per_step']:.3f} ms with overlap)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
