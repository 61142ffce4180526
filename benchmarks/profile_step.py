"""Where one engine step's time goes: plain decoding against DSpark, on the real engine.

    python benchmarks/profile_step.py --model DIR [--drafter DIR] [--device cuda]
        [--concurrency 1] [--temperature 0] [--top-p 1] [--steps 30] [--attention-backend flashinfer] [--random-like]
        [--overlap 0|1|both] [--force-aside [--no-context-write]] [--trace DIR]

For each configuration (`plain`, then `dspark-static` and `dspark-compact` when a drafter is
given) it builds the engine in-process, keeps `--concurrency` requests in flight (greedy, or sampled at
`--temperature` with a seed each; EOS ignored), warms up, then measures `--steps` steps three ways:
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

Every configuration also gets a host timeline (`host_timeline` in the JSON, one line each in a
second table, then each DSpark configuration less plain's with the same overlap setting): a pass of
`--steps` steps, unsynchronised between steps, with time.perf_counter wrappers on the engine
instance: the per-step means (ms) of the host time blocked on the device (the overlap read-back's
event, the graph inputs' event in `CudaGraphRunner._load`, any `.tolist()` of a device tensor),
inside `torch.cuda.CUDAGraph.replay` (the graph launch), in `_load` less its wait, the rest of
`ModelRunner.forward`, `_decide`, `scheduler.schedule`, `build_step_input`, `_resolve_in_flight`
less its wait, DSpark's propose and accept, and the remainder (see `host_timeline`).

`--force-aside` makes every step of the DSpark configurations step aside (named
`dspark-MODE-aside`, `+overlap` too: the planner still decides, the step-aside is recorded as the
real one is, and the step decodes plainly); `--no-context-write` (with `--force-aside` only) adds
`dspark-MODE-aside-nowrite`, whose target graphs are captured (and eager forwards run) without the
draft-context K/V write. Together they split a stepped-aside step's extra cost over a plain one into
host work, graph launch, the context write on the device, and waits, in one run:

    python benchmarks/profile_step.py --model SMOL --random-like --drafter random --modes compact \
        --concurrency 64 --steps 100 --overlap both --force-aside --no-context-write --json out.json

The profiler pass (unsynchronised between steps, as a serving loop runs) also gives the CUDA runtime
calls that can hold the host (`host_waits`: synchronisations, copies, event queries, with their own host
time) and where the device idled (`device_gaps`: the window less the union of its kernels and copies,
and how much of it came in gaps of 20 us or more: the host making the device wait, where short gaps are
launch latency inside a graph). `--trace DIR` writes that pass of each configuration as a Chrome trace
(`DIR/CONFIG.json.gz`, for Perfetto) to see which host work a long gap sat behind.

Each configuration also reports the CPU time of its synchronised steps (`cpu` in the JSON, a last table):
the process's against the stepping thread's, and the busiest threads by /proc's clock ticks, so that a
thread burning CPU beside the engine (spinning intra-op workers, say) shows up. NOTE: host times compare
badly between the configurations of one run: on an H100 whichever engine a process builds second stepped
10-22% slower on the host, plain or DSpark (session 41, `benchmarks/gpu41/call3`; no other thread burnt
CPU). `--dspark-first` measures the DSpark configurations first; compare each one measured first in its
own run. `--intra-op-threads N` sets torch's thread count after each engine is built.

`--random-like` replaces the model's weights with random ones of the same config and tokenizer
(written to a temporary folder), and `--drafter random` builds a random drafter for it, so the
profile needs only a config and a tokenizer. Prints a report; `--json FILE` also saves the figures.
"""

from __future__ import annotations

import argparse
import cProfile
import contextlib
import gzip
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
              "--dtype", args.dtype, "--random-seed", "0"]
    if not getattr(args, "server_caps", False):  # NOTE: at most the load's requests: graphs and tiers stop there
        tokens += ["--max-running-requests", str(max(args.concurrency, 1))]
    tokens += list(getattr(args, "engine_flags", None) or [])
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
    """Keeps `concurrency` requests in flight: greedy (temperature 0), or sampled at `temperature`
    with a seed per request (temperature only: the sampler's sort-free filter path; with `top_p`
    below 1, the sorted filter, and DSpark's filtered bursts)."""

    def __init__(self, engine, concurrency: int, prompt_len: int, max_tokens: int, vocab: int,
                 temperature: float = 0.0, top_p: float = 1.0):
        from sglaunch.engine.interface import GenerateRequest, SamplingParams

        self.engine, self.made = engine, 0
        self.make = lambda i: GenerateRequest(
            f"r{i}", tuple((17 * i + 31 * j) % (vocab - 100) + 50 for j in range(prompt_len)),
            SamplingParams(max_new_tokens=max_tokens, temperature=temperature, top_p=top_p, ignore_eos=True,
                           seed=i if temperature > 0 else None))
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
                 wrap(decoder, "accept", "accept"), wrap(decoder, "accept_greedy", "accept"),
                 # inside propose and accept (a sampled row's uniforms; its target probabilities)
                 wrap(decoder, "_uniforms", "uniforms (in propose)"),
                 wrap(decoder, "_target_probs", "target probs (in accept)")]
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


SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "cudaMemcpyAsync", "cudaStreamWaitEvent", "cudaEventQuery")


def host_waits(events, per: float) -> dict:
    """The CUDA runtime calls that can block the host (or poll), from key_averages: per step, calls
    and their own host milliseconds (a cudaMemcpyAsync from device memory to pageable memory waits
    for the stream; one to pinned memory does not)."""
    return {e.key: {"calls_per_step": round(e.count * per, 2), "self_cpu_ms_per_step": round(e.self_cpu_time_total * per / 1e3, 4)}
            for e in events if e.key in SYNC_CALLS}


def device_gaps(kernels: list[tuple[float, float]], window: tuple[float, float], steps: int,
                threshold_us: float = 20.0) -> dict:
    """Where the device idled in a pipelined window: kernels [(start, end)] in microseconds (device
    activity: kernels and copies) and the window (start, end) -> per step, the window's length, the
    union of the kernels' time, the idle rest, and the idle time in gaps of at least threshold_us
    (short gaps between kernels of one graph are launch latency; long ones are the host making the
    device wait), with the longest gaps."""
    begin, end = window
    spans = sorted((max(a, begin), min(b, end)) for a, b in kernels if b > begin and a < end)
    busy, gaps, cursor = 0.0, [], begin
    for a, b in spans:
        if a > cursor:
            gaps.append(a - cursor)
        if b > cursor:
            busy += b - max(a, cursor)
            cursor = b
    if end > cursor:
        gaps.append(end - cursor)
    long_gaps = [g for g in gaps if g >= threshold_us]
    per = 1.0 / steps / 1e3  # microseconds in the window -> milliseconds per step
    return {"window_ms_per_step": round((end - begin) * per, 4), "busy_ms_per_step": round(busy * per, 4),
            "idle_ms_per_step": round((end - begin - busy) * per, 4),
            "idle_in_long_gaps_ms_per_step": round(sum(long_gaps) * per, 4),
            "long_gaps_per_step": round(len(long_gaps) / steps, 2), "threshold_us": threshold_us,
            "longest_gaps_us": [round(g, 1) for g in sorted(long_gaps, reverse=True)[:8]]}


def profiled_device_gaps(prof, steps: int) -> dict | None:
    """device_gaps over a torch.profiler run: the device's kernels and copies against the window
    from the first host event to the last event of any kind; None without device activity."""
    from torch.autograd import DeviceType

    device, window = [], [float("inf"), float("-inf")]
    for e in prof.events():
        start, end = e.time_range.start, e.time_range.end
        if e.device_type == DeviceType.CUDA:
            device.append((start, end))
        else:
            window[0] = min(window[0], start)
        window[1] = max(window[1], end)
    if not device:
        return None
    return device_gaps(device, (window[0], window[1]), steps)


def patch(obj, attr: str, new):
    """Set obj.attr = new (an instance, class or module attribute) -> undo: puts back exactly what
    was there (an attribute found only on a class is deleted from the instance again)."""
    had, old = attr in vars(obj), vars(obj).get(attr)
    setattr(obj, attr, new)

    def undo():
        if had:
            setattr(obj, attr, old)
        else:
            delattr(obj, attr)

    return undo


def force_aside(engine):
    """--force-aside: every step of this DSpark engine steps aside. Its plan still runs the
    planner's decision (the host work of a real stepped-aside step's `_decide`), ignores the answer
    and records the step-aside as DSparkDecoder.plan does; -> undo."""
    spec = engine.spec
    planner = spec.planner

    def plan(rids, extra_tokens, committed_extra=0, sampled=False):
        budget = planner.plan_drafts(rids, extra_tokens, committed_extra, sampled)
        if budget is not None and planner.can_step_aside and planner.calibration is not None:
            # the planner expected a drafting step: this one is a plain one (what the real aside expects)
            planner.calibration.expect("plain", planner.sps.plain_step_seconds(len(rids), extra_tokens), sampled)
        spec.stats.record_step_aside(len(rids))
        planner.skip_step()
        spec._maybe_log()
        return None

    return patch(spec, "plan", plan)


@contextlib.contextmanager
def without_context_write(enabled: bool):
    """--no-context-write: DraftRunner.write_context is a no-op while this configuration is built
    (so the target's CUDA graphs are captured without the draft-context K/V write) and measured (so
    eager steps skip it too); restored afterwards. Only with --force-aside: the drafter has no
    context, its drafts would be garbage."""
    if not enabled:
        yield
        return
    from sglaunch.speculative.draft_runner import DraftRunner

    undo = patch(DraftRunner, "write_context", lambda self, features, positions, slots: None)
    try:
        yield
    finally:
        undo()


# host timeline categories (exclusive times: a nested category's time is not its caller's)
WAITS = ("wait_readback", "wait_inputs", "wait_tolist")
TIMELINE = WAITS + ("graph_replay", "graph_inputs", "forward_other", "readback_launch", "greedy_host", "decide",
                    "schedule", "build_step_input", "resolve", "propose", "accept")


class HostTimeline:
    """Exclusive host time per category: a stack of open categories; entering one pauses its caller."""

    def __init__(self):
        self.spent = {k: 0.0 for k in TIMELINE}
        self.stack: list[list] = []  # [category, since]
        self.active = True

    def wrap(self, fn, name: str):
        timeline = self

        def timed(*a, **k):
            if not timeline.active:
                return fn(*a, **k)
            now = time.perf_counter()
            if timeline.stack:
                caller = timeline.stack[-1]
                timeline.spent[caller[0]] += now - caller[1]
            frame = [name, now]
            timeline.stack.append(frame)
            try:
                return fn(*a, **k)
            finally:
                now = time.perf_counter()
                timeline.spent[name] += now - frame[1]
                timeline.stack.pop()
                if timeline.stack:
                    timeline.stack[-1][1] = now

        return timed


class TimedEvent:
    """A CUDA event whose synchronize() is charged to a wait category; the rest is the event's."""

    def __init__(self, event, synchronize):
        self.event, self.synchronize = event, synchronize

    def __getattr__(self, name):
        return getattr(self.event, name)


def host_timeline(engine, load, steps: int, sync) -> dict:
    """A pass of `steps` steps, unsynchronised between steps (synchronised at both ends), with
    time.perf_counter wrappers on the engine instance (and a few module and class attributes, put
    back afterwards): per-step means in ms of each category's exclusive host time.
    - waits for the device: wait_readback (the overlap read-back's event: GreedyReadback.get),
      wait_inputs (CudaGraphRunner._load's wait for the previous replay's input copies), wait_tolist
      (any Tensor.tolist() of a device tensor: ModelRunner.greedy_host, sampling, DSpark's plan
      and accept);
    - graph_replay: inside torch.cuda.CUDAGraph.replay (cudaGraphLaunch; every graph, the drafter's
      too); graph_inputs: CudaGraphRunner._load minus its wait (static rows, pinned copies,
      FlashInfer plan); forward_other: ModelRunner.forward minus those (pick, pad, placeholders,
      eager forwards); readback_launch: ModelRunner.greedy_readback (the pinned copy and its event);
      greedy_host: ModelRunner.greedy_host minus its .tolist() (a synchronous step's greedy rows);
    - decide (LLMEngine._decide, DSpark's plan inside), schedule (scheduler.schedule),
      build_step_input, resolve (_resolve_in_flight minus its wait), propose and accept (DSpark's
      drafting steps);
    - remainder: the step's wall time less all of those (outputs, commits, the loop itself)."""
    import torch

    import sglaunch.engine.engine as engine_mod

    timeline = HostTimeline()
    runner, spec, graphs = engine.runner, engine.spec, getattr(engine.runner, "graphs", None)
    wait_readback = timeline.wrap(lambda event: event.synchronize(), "wait_readback")
    wait_inputs = timeline.wrap(lambda event: event.synchronize(), "wait_inputs")

    def timed_event(event, wait):
        if event is None or isinstance(event, TimedEvent):
            return event
        return TimedEvent(event, lambda: wait(event))

    undo = []

    def wrap(obj, attr: str, name: str):
        undo.append(patch(obj, attr, timeline.wrap(getattr(obj, attr), name)))

    wrap(engine, "_decide", "decide")
    wrap(engine, "_resolve_in_flight", "resolve")
    wrap(engine.scheduler, "schedule", "schedule")
    wrap(engine_mod, "build_step_input", "build_step_input")
    wrap(runner, "forward", "forward_other")
    wrap(runner, "greedy_host", "greedy_host")  # its wait is the .tolist() inside
    readback = runner.greedy_readback

    def greedy_readback():
        out = readback()
        if getattr(out, "event", None) is not None:
            out.event = timed_event(out.event, wait_readback)
        return out

    wrap_readback = timeline.wrap(greedy_readback, "readback_launch")
    undo.append(patch(runner, "greedy_readback", wrap_readback))
    if spec is not None:
        wrap(spec, "propose", "propose")
        wrap(spec, "accept", "accept")
        wrap(spec, "accept_greedy", "accept")
    if graphs is not None:
        load_inputs = graphs._load

        def _load(padded, wrapper):
            out = load_inputs(padded, wrapper)
            graphs._loaded = timed_event(graphs._loaded, wait_inputs)
            return out

        graphs._loaded = timed_event(graphs._loaded, wait_inputs)
        undo.append(patch(graphs, "_load", timeline.wrap(_load, "graph_inputs")))

        def unwrap_loaded():
            if isinstance(graphs._loaded, TimedEvent):
                graphs._loaded = graphs._loaded.event

        undo.append(unwrap_loaded)
    cuda_graph = getattr(torch.cuda, "CUDAGraph", None)
    if cuda_graph is not None:
        wrap(cuda_graph, "replay", "graph_replay")
    tolist, timed_tolist = torch.Tensor.tolist, None

    def device_tolist(self):
        return tolist(self) if self.device.type == "cpu" else timed_tolist(self)

    timed_tolist = timeline.wrap(tolist, "wait_tolist")
    undo.append(patch(torch.Tensor, "tolist", device_tolist))
    walls = []
    try:
        sync()
        begin = time.perf_counter()
        for _ in range(steps):
            t = time.perf_counter()
            load.step()
            walls.append(time.perf_counter() - t)
        sync()
        pipelined = time.perf_counter() - begin
    finally:
        timeline.active = False  # a read-back still in flight keeps its TimedEvent: now inert
        for u in reversed(undo):
            u()
    per = 1e3 / steps
    out = {"steps": steps, "step_ms": round(sum(walls) * per, 4), "pipelined_ms": round(pipelined * per, 4)}
    out.update({f"{k}_ms": round(timeline.spent[k] * per, 4) for k in TIMELINE})
    out["wait_ms"] = round(sum(timeline.spent[k] for k in WAITS) * per, 4)
    out["remainder_ms"] = round(max(0.0, sum(walls) - sum(timeline.spent.values())) * per, 4)
    return out


def thread_ticks() -> dict[int, tuple[str, int]]:
    """This process's threads -> (name, user + system clock ticks so far), from /proc (Linux;
    empty elsewhere). A thread that ends between the listing and its read is left out."""
    out = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            # NOTE: the name in field 2 may hold spaces: split after its closing parenthesis
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(tid)] = (name, int(fields[11]) + int(fields[12]))  # utime, stime (fields 14, 15)
    return out


class ProcessCpu:
    """The CPU time this process spends while some steps run, against the stepping thread's own:
    what other threads (intra-op workers spinning after a parallel region, a watchdog, a
    read-back thread) burn beside it. A host phase that is slower in one engine than in another
    with the same operators points at such threads, or at a slower core."""

    def __init__(self):
        self.wall, self.process, self.thread = time.perf_counter(), time.process_time(), time.thread_time()
        self.ticks = thread_ticks()

    def per_step(self, steps: int) -> dict:
        wall = time.perf_counter() - self.wall
        process, thread = time.process_time() - self.process, time.thread_time() - self.thread
        ticks, hz = thread_ticks(), os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        busy = sorted(((tid, name, n - self.ticks.get(tid, (name, 0))[1]) for tid, (name, n) in ticks.items()),
                      key=lambda t: -t[2])
        per = 1e3 / steps
        return {"wall_ms": round(wall * per, 4), "process_cpu_ms": round(process * per, 4),
                "stepping_thread_cpu_ms": round(thread * per, 4),
                "other_threads_cpu_ms": round((process - thread) * per, 4), "threads": len(ticks),
                "busiest_threads": [{"thread": name, "tid": tid, "cpu_ms": round(n / hz * per, 3)}
                                    for tid, name, n in busy[:6] if n > 0]}


def measure(args, name: str, mode: str | None, drafter: Path | None, overlap: str | None = None,
            aside: bool = False, context_write: bool = True) -> dict:
    """One configuration; aside: --force-aside (a DSpark engine's every step steps aside);
    context_write False: --no-context-write (the target never writes the draft context)."""
    with without_context_write(not context_write):
        r = _measure(args, name, mode, drafter, overlap, aside)
    r.update(force_aside=aside, context_write=context_write if mode is not None else None)
    return r


def _measure(args, name: str, mode: str | None, drafter: Path | None, overlap: str | None, aside: bool) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    if overlap is not None:
        os.environ[OVERLAP_ENV] = overlap
    engine, cluster = build_engine(args, mode, drafter)
    if args.intra_op_threads is not None:
        torch.set_num_threads(args.intra_op_threads)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    unforce = force_aside(engine) if aside and engine.spec is not None else (lambda: None)
    try:
        load = Load(engine, args.concurrency, args.prompt_len, args.max_tokens, engine.runner.spec.vocab_size,
                    args.temperature, args.top_p)
        draft_graphs = getattr(engine.runner.draft, "graphs", None) if engine.runner.draft is not None else None
        captured_at_start = draft_graphs.captures if draft_graphs is not None else None
        for _ in range(args.warmup):
            load.step()
        sync()
        times, by_kind = [], {"aside": [], "drafted": []}
        cpu = ProcessCpu()
        for _ in range(args.steps):
            drafted = engine.spec.stats.steps if engine.spec is not None else None
            t = time.perf_counter()
            load.step()
            sync()
            times.append(time.perf_counter() - t)
            if drafted is not None:
                by_kind["drafted" if engine.spec.stats.steps > drafted else "aside"].append(times[-1])
        cpu_use = cpu.per_step(args.steps)
        pipelined_kinds = {"aside": [], "drafted": []}
        pipelined = pipelined_step_ms(load, args.steps, sync, by_kind=pipelined_kinds)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
        with profile(activities=activities) as prof:
            for _ in range(args.steps):
                load.step()
            sync()
        events = prof.key_averages()
        per = 1.0 / args.steps
        waits, gaps = host_waits(events, per), profiled_device_gaps(prof, args.steps)
        if args.trace is not None:  # the whole timeline, for chrome://tracing or Perfetto
            args.trace.mkdir(parents=True, exist_ok=True)
            trace = args.trace / f"{name}.json"
            prof.export_chrome_trace(str(trace))
            with open(trace, "rb") as raw, gzip.open(f"{trace}.gz", "wb") as packed:
                shutil.copyfileobj(raw, packed)
            trace.unlink()
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
        timeline = host_timeline(engine, load, args.steps, sync)
        graphs_info = None
        if draft_graphs is not None:
            graphs_info = {"captured_at_start_up": captured_at_start, "capture_seconds": round(draft_graphs.capture_seconds, 2),
                           "captured_while_measuring": draft_graphs.captures - captured_at_start,
                           "replays": draft_graphs.replays}
    finally:
        unforce()
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
            "host_waits": waits, "device_gaps": gaps,
            "cpu": cpu_use, "cprofile": buf.getvalue(), "phases": phases, "host_timeline": timeline,
            "step_kinds": kinds, "drafter_graphs": graphs_info,
            "spec": {k: v for k, v in stats.items() if "spec" in k or "accept" in k or "draft" in k or "verify" in k}}


TIMELINE_COLUMNS = (("wait", "wait_ms"), ("wait rb", "wait_readback_ms"), ("wait in", "wait_inputs_ms"),
                    ("wait tl", "wait_tolist_ms"), ("replay", "graph_replay_ms"), ("inputs", "graph_inputs_ms"),
                    ("fwd", "forward_other_ms"), ("rb", "readback_launch_ms"), ("gr host", "greedy_host_ms"),
                    ("decide", "decide_ms"), ("sched", "schedule_ms"), ("build", "build_step_input_ms"),
                    ("resolve", "resolve_ms"), ("propose", "propose_ms"), ("accept", "accept_ms"),
                    ("rest", "remainder_ms"))


def print_timelines(results: list[dict]) -> None:
    """One line per configuration: its host timeline (HostTimeline), ms per step."""
    print("\nhost timeline, ms per step (unsynchronised steps; wait = rb (read-back event) + in (graph inputs' "
          "event) + tl (device .tolist()); see host_timeline)")
    w = max([15] + [len(r["config"]) for r in results])
    print(f"{'config':<{w}} {'step':>7}" + "".join(f" {label:>7}" for label, _ in TIMELINE_COLUMNS))
    for r in results:
        t = r["host_timeline"]
        print(f"{r['config']:<{w}} {t['step_ms']:7.3f}" + "".join(f" {t[key]:7.3f}" for _, key in TIMELINE_COLUMNS))


def timeline_difference(r: dict, base: dict) -> str:
    """A DSpark configuration's host timeline less plain's, largest differences first."""
    t, b = r["host_timeline"], base["host_timeline"]
    diffs = sorted(((label, t[key] - b[key]) for label, key in TIMELINE_COLUMNS if label != "wait"),
                   key=lambda d: -abs(d[1]))
    return (f"{r['config']} - {base['config']}: step {t['step_ms'] - b['step_ms']:+.3f} ms = "
            + ", ".join(f"{label} {d:+.3f}" for label, d in diffs if abs(d) >= 0.0005))


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
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="the requests' temperature (0: greedy; > 0: sampled, seeded per request)")
    parser.add_argument("--top-p", type=float, default=1.0,
                        help="the requests' top-p (1: no filter; with --temperature > 0)")
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--overlap", choices=["0", "1", "both"], default=None,
                        help="SGLAUNCH_OVERLAP for plain decoding; both: plain and plain+overlap in one run "
                             "(default: the environment's)")
    parser.add_argument("--dspark-first", action="store_true",
                        help="measure the DSpark configurations before plain ones (each configuration boots its own "
                             "engine in this process: an order effect shows as the same configuration slower second)")
    parser.add_argument("--intra-op-threads", type=int, default=None,
                        help="torch.set_num_threads(N) after each engine is built (default: torch's own)")
    parser.add_argument("--force-aside", action="store_true",
                        help="every step of the DSpark configurations steps aside (named dspark-MODE-aside)")
    parser.add_argument("--no-context-write", action="store_true",
                        help="with --force-aside: also dspark-MODE-aside-nowrite, whose target graphs (and eager "
                             "forwards) do not write the draft context K/V")
    parser.add_argument("--trace", type=Path, default=None,
                        help="a folder: each configuration's torch.profiler pass as a Chrome trace (NAME.json.gz)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.no_context_write and not args.force_aside:
        parser.error("--no-context-write needs --force-aside (without the context the drafts would be garbage)")
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
        configs = [(name, None, overlap, False, True) for name, overlap in plain]
        # NOTE: DSpark with overlap too (its stepped-aside steps pipelined, drafting steps draining
        # first), beside plain+overlap: a stepped-aside step should cost what a plain+overlap one does
        dspark = {"both": [("", "0"), ("+overlap", "1")], "0": [("", "0")], "1": [("+overlap", "1")],
                  None: [("", None)]}[args.overlap]
        # --force-aside: every DSpark step steps aside; --no-context-write: and again without the
        # draft-context write in the target's graphs (what that write costs a stepped-aside step)
        variants = ([("-aside", True)] + ([("-aside-nowrite", False)] if args.no_context_write else [])
                    if args.force_aside else [("", True)])
        configs += [(f"dspark-{m}{variant}{suffix}", m, overlap, args.force_aside, write)
                    for m in args.modes.split(",") if drafter is not None and m
                    for variant, write in variants for suffix, overlap in dspark]
        if args.dspark_first:
            configs = [c for c in configs if c[1] is not None] + [c for c in configs if c[1] is None]
        results = []
        saved = os.environ.get(OVERLAP_ENV)
        for name, mode, overlap, aside, write in configs:
            try:
                r = measure(args, name, mode, drafter, overlap, aside, write)
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
            print(f"host timeline (ms/step): {json.dumps(r['host_timeline'])}")
            print(f"cpu (ms/step, synchronised steps): {json.dumps(r['cpu'])}")
            for name, v in r["phases"].items():
                if "ms" in v:
                    print(f"  phase {name:<16} {v['ms']:8.3f} ms  {v['ops']:8.1f} ops/step")
                else:
                    print(f"  {name}: {v}")
            for op in r["top_ops"]:
                print(f"  {op['self_cpu_ms_per_step']:8.3f} ms  {op['calls_per_step']:7.1f}x  {op['op'][:90]}")
            if r["host_waits"]:
                print("  host waits (calls, own host ms per step): " + ", ".join(
                    f"{k} {v['calls_per_step']}x {v['self_cpu_ms_per_step']:.3f}" for k, v in r["host_waits"].items()))
            if r["device_gaps"]:
                g = r["device_gaps"]
                print(f"  device idle {g['idle_ms_per_step']:.3f} of {g['window_ms_per_step']:.3f} ms a step (pipelined, "
                      f"profiled), {g['idle_in_long_gaps_ms_per_step']:.3f} ms in {g['long_gaps_per_step']} gaps of "
                      f"{g['threshold_us']:.0f} us or more; longest {g['longest_gaps_us']} us")
            if r["top_kernels"]:
                print(f"  device busy {r['device_busy_ms_per_step']:.3f} ms/step; kernels with the most device time:")
                for k in r["top_kernels"]:
                    print(f"  {k['device_ms_per_step']:8.3f} ms  {k['calls_per_step']:7.1f}x  {k['kernel']}")
            print("\n".join(r["cprofile"].splitlines()[:60]))
        if args.json:
            args.json.write_text(json.dumps({"argv": sys.argv if argv is None else argv, "results": results}, indent=1))
        w = max([15] + [len(r["config"]) for r in results])
        print(f"\n{'config':<{w}}  step ms  pipelined ms  device ms   aten/step  launches/step  graphs/step  aside ms (n)  drafted ms (n)")
        for r in results:
            k = r["step_kinds"]
            kind = (f"  {k.get('aside_step_ms_median', float('nan')):8.2f} ({k['aside_steps']:2d})"
                    f"  {k.get('drafted_step_ms_median', float('nan')):9.2f} ({k['drafted_steps']:2d})") if k else ""
            print(f"{r['config']:<{w}} {r['step_ms_median']:8.2f} {r['pipelined_step_ms']:13.2f} "
                  f"{r['device_busy_ms_per_step']:10.2f} {r['aten_calls_per_step']:11.1f} "
                  f"{r['kernel_launches_per_step']:14.1f} {r['graph_launches_per_step']:12.2f}" + kind)
        print_timelines(results)
        print("\nCPU time while the synchronised steps ran, ms per step (other threads: the process's less the "
              "stepping thread's)")
        for r in results:
            c = r["cpu"]
            print(f"  {r['config']:<{w}} wall {c['wall_ms']:7.3f}  process {c['process_cpu_ms']:7.3f}  stepping thread "
                  f"{c['stepping_thread_cpu_ms']:7.3f}  other threads {c['other_threads_cpu_ms']:7.3f}  "
                  f"({c['threads']} threads; busiest: "
                  + ", ".join(f"{t['thread']} {t['cpu_ms']:.2f}" for t in c["busiest_threads"]) + ")")
        by_name = {r["config"]: r for r in results}
        for r in results:  # with overlap, a stepped-aside step against a plain+overlap one
            k, plain_on = r["step_kinds"], by_name.get("plain+overlap")
            if r["overlap"] and k.get("aside_pipelined_step_ms_median") is not None and plain_on is not None:
                print(f"{r['config']}: stepped-aside step {k['aside_pipelined_step_ms_median']:.3f} ms pipelined "
                      f"({k['aside_steps']} synced: {k.get('aside_step_ms_median', float('nan')):.3f} ms) against "
                      f"plain+overlap {plain_on['pipelined_step_ms']:.3f} ms")
                if r["device_gaps"] and plain_on["device_gaps"]:
                    print(f"{r['config']}: device idle {r['device_gaps']['idle_ms_per_step']:.3f} ms a step "
                          f"({r['device_gaps']['idle_in_long_gaps_ms_per_step']:.3f} in long gaps) against "
                          f"plain+overlap {plain_on['device_gaps']['idle_ms_per_step']:.3f} "
                          f"({plain_on['device_gaps']['idle_in_long_gaps_ms_per_step']:.3f})")
        for r in results:  # each DSpark configuration's host timeline less plain's (same overlap setting)
            base = by_name.get("plain+overlap" if r["overlap"] else "plain")
            if r["config"].startswith("dspark") and base is not None:
                print(timeline_difference(r, base))
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
