"""The host-sync budget of a DSpark step, guarded on the CPU; graph-tier alignment of the compact
budget with a fake tier list; `profile-sps --attention-backend / --disable-cuda-graph` plumbing.

Budget (what tests/gpu/test_kernels_gpu.py checks with CUDA's sync debug mode on a GPU): per step
ONE device-to-host read-back after planning and ONE after accepting, nothing else converts a
tensor to host values in `sglaunch/`; host-built inputs go down through `transfer.to_device`, one
packed copy per phase (the draft forward, the sampling inputs, the accept row layout). On the CPU
every tensor is a host tensor, so the test counts *conversion points* instead: Tensor.tolist /
item / cpu / numpy / int() / float() / bool() / index(), `.to(<device>)` and
`torch.tensor(..., device=...)`, each by its innermost repository frame. Frames in `sglaunch/kernels/`
are the torch references the CPU falls back to (the GPU runs the Triton kernels); they are
reported, not counted.
"""

from __future__ import annotations

KERNELS = "sglaunch/kernels/"  # the torch references the CPU falls back to: reported, not counted


def counted(path: str) -> bool:
    """A read-back in one of sglaunch's own frames, the kernels' CPU references left out."""
    return path.startswith("sglaunch/") and not path.startswith(KERNELS)

import dataclasses
import functools
import traceback
from collections import Counter
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from dspark_helpers import GAMMA, engine_config, prompts
from sglaunch.engine.interface import GenerateRequest, SamplingParams
from sglaunch.engine.launch import create_engine, run_requests
from sglaunch.engine import transfer

ROOT = Path(__file__).resolve().parents[2]
CONVERSIONS = ("tolist", "item", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__")
PLANNING_READ_BACK = ("sglaunch/speculative/decoder.py", "pack_for_host(columns).tolist()")
# full windows: the drafts stay on the device and are read back after the verify forward
DEVICE_DRAFTS_READ_BACK = ("sglaunch/speculative/decoder.py", "pack_for_host(parts).tolist()")
ACCEPT_READ_BACK = ("sglaunch/speculative/decoder.py", "pack_flat([result.num_accepted")
ONE_COPY_DOWN = ("sglaunch/engine/transfer.py", "buffer.to(device, non_blocking=True)")


def site() -> tuple[str, int, str]:
    for frame in reversed(traceback.extract_stack()[:-2]):
        path = Path(frame.filename).resolve()
        if path.is_relative_to(ROOT) and not path.is_relative_to(ROOT / "tests"):
            return str(path.relative_to(ROOT)), frame.lineno, (frame.line or "").strip()
    return ("<outside the repository>", 0, "")


class Recorder:
    """Counts conversion points and device moves while `watching` is set (inside propose/accept)."""

    def __init__(self):
        self.read_backs: Counter = Counter()
        self.moves: Counter = Counter()
        self.watching = False
        self.calls: Counter = Counter()

    def record(self, counter: Counter) -> None:
        if self.watching:
            self.watching = False  # NOTE: building the traceback must not record itself
            try:
                counter[site()] += 1
            finally:
                self.watching = True

    def install(self, monkeypatch) -> None:
        for name in CONVERSIONS:
            monkeypatch.setattr(torch.Tensor, name, self._counted(getattr(torch.Tensor, name), self.read_backs))
        original_to = torch.Tensor.to

        def to(tensor, *args, **kwargs):
            if "device" in kwargs or any(isinstance(a, (str, torch.device)) for a in args):
                self.record(self.moves)
            return original_to(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "to", to)
        original_tensor = torch.tensor

        def tensor(*args, **kwargs):
            if kwargs.get("device") is not None:
                self.record(self.moves)
            return original_tensor(*args, **kwargs)

        monkeypatch.setattr(torch, "tensor", tensor)

    def _counted(self, original, counter: Counter):
        @functools.wraps(original)
        def counted(tensor, *args, **kwargs):
            self.record(counter)
            return original(tensor, *args, **kwargs)

        return counted

    def wrap(self, name: str, function):
        def watched(*args, **kwargs):
            self.calls[name] += 1
            self.watching = True
            try:
                return function(*args, **kwargs)
            finally:
                self.watching = False

        return watched


def mixed_requests(batch: list[list[int]], tag: str, new_tokens: int = 14) -> list[GenerateRequest]:
    """Greedy and seeded sampled requests (the sampled ones take the target-probs path)."""
    out = []
    for i, prompt in enumerate(batch):
        params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0 if i % 2 == 0 else 0.8, top_p=0.9,
                                seed=40 + i, ignore_eos=True)
        out.append(GenerateRequest(f"{tag}-{i}", tuple(prompt), params))
    return out


def outputs(engine, requests) -> dict[str, list[int]]:
    return {rid: c.token_ids for rid, c in run_requests(engine, requests).items()}


def described(counter: Counter) -> str:
    return "; ".join(f"{f}:{line} x{n} `{text}`" for (f, line, text), n in counter.items())


def test_one_read_back_after_planning_and_one_after_accept(dspark_files, monkeypatch):
    # NOTE: imported here: importing them imports triton, which tests/speculative/test_kernels.py
    # needs to import itself after setting TRITON_INTERPRET (collection runs every module first)
    from sglaunch.speculative import decoder as decoder_module
    from sglaunch.speculative import draft_runner as draft_runner_module

    # NOTE: no radix cache, so both runs schedule alike (sampled output depends on the batch's plan)
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "compact", sps=dspark_files["sps"],
                           disable_radix_cache=True)
    batch = prompts(6, seed=21)
    engine, cluster = create_engine(config)
    try:
        expected = outputs(engine, mixed_requests(batch, "plain-copies"))
        recorder = Recorder()
        # NOTE: the packed one-copy path of a CUDA device, exercised on the CPU (no pinning there)
        packed = functools.partial(transfer.to_device, pack=True)
        copies = Counter()

        def counted_to_device(tensors, device, **kwargs):
            copies["to_device"] += 1
            return packed(tensors, device)

        monkeypatch.setattr(decoder_module, "to_device", counted_to_device)
        monkeypatch.setattr(draft_runner_module, "to_device", counted_to_device)
        engine.spec.propose = recorder.wrap("propose", engine.spec.propose)
        engine.spec.accept = recorder.wrap("accept", engine.spec.accept)
        recorder.install(monkeypatch)
        # NOTE: the planner's prior and its check of the confidences learnt from the first run; the
        # second starts where the first did, so both plan (and sample) alike
        engine.spec.planner.reset_prior()
        got = outputs(engine, mixed_requests(batch, "packed-copies"))
        monkeypatch.undo()
    finally:
        cluster.stop(engine)
    steps = recorder.calls["propose"]
    assert steps > 3 and recorder.calls["accept"] == steps
    assert list(got.values()) == list(expected.values())  # packing changes nothing, seeded sampling included
    ours = Counter({s: n for s, n in recorder.read_backs.items() if counted(s[0])})
    by_text = {(f, text): n for (f, _, text), n in ours.items()}
    allowed = {key: n for key, n in by_text.items() if any(key[0] == f and t in key[1]
                                                           for f, t in (PLANNING_READ_BACK, ACCEPT_READ_BACK))}
    assert len(allowed) == 2 and len(ours) == 2, f"read-backs in sglaunch/: {described(ours)}"
    assert sorted(allowed.values()) == [steps, steps], f"one of each per step: {described(ours)}"
    moves = Counter({s: n for s, n in recorder.moves.items()
                     if s[0].startswith("sglaunch/speculative/") or s[0] == ONE_COPY_DOWN[0]})
    assert len(moves) == 1 and all(f == ONE_COPY_DOWN[0] and ONE_COPY_DOWN[1] in text for f, _, text in moves), \
        f"device moves: {described(moves)}"
    # draft forward + sampling inputs per proposal, the row layout per accept: one copy each
    assert sum(moves.values()) == copies["to_device"] == 3 * steps


def test_recording_converts_only_when_a_record_path_is_set(dspark_files, monkeypatch, tmp_path):
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "compact", sps=dspark_files["sps"])
    engine, cluster = create_engine(config)
    try:
        outputs(engine, mixed_requests(prompts(2, seed=5), "warm", 6))
        assert engine.spec.record_path is None
        recorder = Recorder()
        engine.spec.accept = recorder.wrap("accept", engine.spec.accept)
        recorder.install(monkeypatch)
        outputs(engine, mixed_requests(prompts(3, seed=6), "off", 8))
        monkeypatch.undo()
        assert not [s for s in recorder.read_backs if "_record" in s[2] or "conf_logits" in s[2]]
        engine.spec.record_path = str(tmp_path / "blocks.jsonl")
        outputs(engine, mixed_requests(prompts(3, seed=6), "on", 8))
        assert (tmp_path / "blocks.jsonl").read_text().count("\n") > 0
    finally:
        cluster.stop(engine)


# ----------------------------------------------------------------------------- graph tiers


TIERS = (10, 14, 18, 22, 27, 36, 50, 70, 90)  # NOTE: none is a point of the steep SPS table


class StepLog:
    """Per DSpark step: fixed tokens (prefill rows + anchors), verified drafts, drafts reachable."""

    def __init__(self, spec):
        self.rows: list[tuple[int, int, int]] = []
        propose = spec.propose

        def logged(chunks, generators, extra_tokens, run_draft, verify_tiers=(), budget=None):
            proposal = propose(chunks, generators, extra_tokens, run_draft, verify_tiers, budget)
            reachable = sum(min(c.lookahead, GAMMA) for c in chunks)
            self.rows.append((extra_tokens + len(chunks), sum(proposal.verify_lens), reachable))
            return proposal

        spec.propose = logged


def run_logged(config, requests):
    engine, cluster = create_engine(config)
    try:
        log = StepLog(engine.spec)
        out = outputs(engine, requests)
        return out, log.rows, engine.spec.stats.to_dict()
    finally:
        cluster.stop(engine)


def aligned(config, on: bool = True):
    return dataclasses.replace(config, speculative=dataclasses.replace(config.speculative,
                                                                       align_verify_tokens_to_graph_tier=on))


def greedy_requests(batch, tag):
    return [GenerateRequest(f"{tag}-{i}", tuple(p), SamplingParams(max_new_tokens=16, temperature=0.0,
                                                                   ignore_eos=True)) for i, p in enumerate(batch)]


def test_align_verify_tokens_to_graph_tier_fills_the_tier(dspark_files, monkeypatch):
    from sglaunch.engine.model_runner import ModelRunner

    base = engine_config(dspark_files["target"], dspark_files["oracle"], "compact", sps=dspark_files["sps"])
    batch = prompts(7, seed=31)
    plain_out, plain_rows, plain_stats = run_logged(base, greedy_requests(batch, "g"))
    # a CPU has no graphs, so no tiers: the option changes nothing
    out, rows, stats = run_logged(aligned(base), greedy_requests(batch, "g"))
    assert (out, rows) == (plain_out, plain_rows)
    monkeypatch.setattr(ModelRunner, "verify_token_tiers", property(lambda self: TIERS))
    off_out, off_rows, _ = run_logged(base, greedy_requests(batch, "g"))
    assert (off_out, off_rows) == (plain_out, plain_rows)  # tiers without the option: nothing changes
    on_out, on_rows, on_stats = run_logged(aligned(base), greedy_requests(batch, "g"))
    assert on_out == plain_out  # lossless: more verified drafts, the same greedy tokens
    for fixed, drafts, reachable in on_rows:
        total = fixed + drafts
        assert total in TIERS or drafts in (0, reachable) or total > max(TIERS), (fixed, drafts, reachable)
    filled = sum(fixed + drafts in TIERS for fixed, drafts, _ in on_rows)
    was = sum(fixed + drafts in TIERS for fixed, drafts, _ in plain_rows)
    assert filled > was, (on_rows, plain_rows)
    assert on_stats["verify_tokens_per_step"] > plain_stats["verify_tokens_per_step"]


@pytest.mark.parametrize("mode", ["compact", "static"])
def test_no_draft_pushes_a_step_past_the_largest_graph(dspark_files, monkeypatch, mode):
    """H100, session 44 (benchmarks/gpu44/run2): at 8 requests graph-sized steps fill the largest ragged
    tier with a prompt chunk beside the decodes; 28 of 362 admitting steps drafted on top of that and ran
    eagerly (`eager (tokens)`, 17-26 ms against 1.2-2.4 ms). With fake tiers on the CPU and drafting at
    every step it can (SGLAUNCH_DSPARK_STEP_ASIDE=0): an arrival whose prompt leaves the largest tier 2
    rows beside 3 decoding requests drafts at most 2 (compact; static verifies whole windows, so it steps
    aside), one that fills the tier steps aside, and the tokens are plain greedy decoding's."""
    from sglaunch.engine.model_runner import ModelRunner

    monkeypatch.setattr(ModelRunner, "verify_token_tiers", property(lambda self: TIERS))
    monkeypatch.setenv("SGLAUNCH_DSPARK_STEP_ASIDE", "0")
    top = max(TIERS)
    short = [GenerateRequest(f"d-{i}", tuple(p), SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True))
             for i, p in enumerate(prompts(3, seed=44, lengths=(5, 9, 13)))]
    # each arrival beside the 3 decodes: its prompt + 3 anchors = the largest tier less 2, then exactly it
    late = [GenerateRequest(f"a-{n}", tuple(p), SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True))
            for n, p in zip((2, 0), prompts(2, seed=45, lengths=(top - 3 - 2, top - 3)))]
    config = engine_config(dspark_files["target"], dspark_files["oracle"], mode, sps=dspark_files["sps"])

    def run(cfg, log: bool):
        engine, cluster = create_engine(cfg)
        try:
            steps = StepLog(engine.spec) if log else None
            tokens = {r.rid: [] for r in short + late}
            arrivals = list(late)
            for r in short:
                engine.add_request(r)
            step = 0
            while engine.has_work or arrivals:
                step += 1
                if arrivals and step % 4 == 0:  # one arrival every few steps, while the three decode
                    engine.add_request(arrivals.pop(0))
                for out in engine.step():
                    tokens[out.rid].extend(out.new_token_ids)
            return tokens, (steps.rows if log else None), (engine.spec.stats.to_dict() if log else None)
        finally:
            cluster.stop(engine)

    out, rows, stats = run(config, True)
    assert out == run(dataclasses.replace(config, speculative=None), False)[0]  # lossless
    beside = [(fixed, drafts) for fixed, drafts, _ in rows if fixed > 3 + GAMMA]  # steps with a prompt chunk
    assert all(fixed + drafts <= top for fixed, drafts, _ in rows if fixed <= top), rows
    assert all(fixed < top for fixed, _ in beside), beside  # the step that fills the tier drafted nothing
    assert stats["step_aside_steps"] >= (1 if mode == "compact" else 2), stats  # ... it stepped aside
    if mode == "compact":
        assert (top - 2, 2) in beside, rows  # the one that leaves 2 rows drafted 2
    else:
        assert not beside, rows


def test_cap_accept_ignores_tiers(dspark_files, monkeypatch):
    from sglaunch.engine.model_runner import ModelRunner

    monkeypatch.setattr(ModelRunner, "verify_token_tiers", property(lambda self: TIERS))
    batch = prompts(4, seed=32)
    base = engine_config(dspark_files["target"], dspark_files["oracle"], "cap-accept", sps=dspark_files["sps"])
    on = run_logged(aligned(base), greedy_requests(batch, "c"))
    assert on[:2] == run_logged(base, greedy_requests(batch, "c"))[:2]  # the option acts in compact mode only


# ----------------------------------------------------------------------------- profile-sps options


class Captured(Exception):
    pass


@pytest.fixture
def captured_configs(monkeypatch):
    import os

    import sglaunch.engine.launch as launch
    from sglaunch.engine.model_runner import VERIFY_WINDOW_ENV

    seen = []

    def fake_create_engine(config):
        seen.append((config, os.environ.get(VERIFY_WINDOW_ENV)))
        raise ValueError("stopped by the test before booting")

    monkeypatch.setattr(launch, "create_engine", fake_create_engine)
    return seen


def profile(target, *args):
    from sglaunch.cli.app import app

    return CliRunner().invoke(app, ["profile-sps", "--model-path", str(target), "--tokens", "1,4", "--window", "5",
                                    *args])


def test_profile_sps_passes_backend_and_graph_options(dspark_files, captured_configs):
    import os

    from sglaunch.engine.model_runner import VERIFY_WINDOW_ENV

    target = dspark_files["target"]
    result = profile(target, "--device", "cpu", "--attention-backend", "torch", "--disable-cuda-graph")
    assert result.exit_code == 2 and "stopped by the test" in result.output
    config, window = captured_configs[-1]
    assert (config.attention_backend, config.disable_cuda_graph, window) == ("torch", True, "5")
    assert VERIFY_WINDOW_ENV not in os.environ  # set for the engine's start-up only
    profile(target, "--device", "cpu")
    assert (captured_configs[-1][0].attention_backend, captured_configs[-1][0].disable_cuda_graph) == ("torch", False)
    # as serve: FlashInfer that cannot run here falls back to torch, saying why
    result = profile(target, "--device", "cpu", "--attention-backend", "flashinfer")
    assert captured_configs[-1][0].attention_backend == "torch" and "CPU device" in result.output
    bad = profile(target, "--device", "cpu", "--attention-backend", "fa3")
    assert bad.exit_code == 2 and len(captured_configs) == 3


def test_profile_sps_resolves_auto_like_serve(dspark_files, captured_configs, monkeypatch):
    import sglaunch.checks.engine as engine_checks
    import sglaunch.checks.resolve as resolve

    for module in (resolve, engine_checks):  # a CUDA machine where FlashInfer can run
        monkeypatch.setattr(module, "flashinfer_unusable", lambda ctx: None)
    profile(dspark_files["target"], "--device", "cuda", "--dtype", "bfloat16")
    assert captured_configs[-1][0].attention_backend == "flashinfer"
    profile(dspark_files["target"], "--device", "cuda", "--dtype", "bfloat16", "--attention-backend", "torch")
    assert captured_configs[-1][0].attention_backend == "torch"


@pytest.mark.parametrize("mode", ["compact", "static"])
def test_graph_path_converts_only_at_its_two_read_backs(dspark_files, monkeypatch, mode):
    """The drafter-graph path (draft_graphs.EagerCapture standing in for CUDA graphs), all greedy:
    inside propose and the host accept the only device-to-host conversions are, per step, the
    planning read-back (windows from the drafts' confidences) or, when every window is known to
    be full before drafting (static mode always), the drafts' read-back after the verify forward
    (they stay on the device until then), and the forward's greedy choices
    (ModelRunner.greedy_host); the padded drafter input is filled through numpy views of host
    buffers (no device tensor); nothing goes down through `to_device` in propose (the graph's
    input is one copy_ into its static buffer)."""
    from sglaunch.speculative import decoder as decoder_module
    from sglaunch.speculative import draft_graphs

    monkeypatch.setattr(draft_graphs, "start_up_graphs",
                        functools.partial(draft_graphs.start_up_graphs, capture=draft_graphs.EagerCapture(), force=True))
    config = engine_config(dspark_files["target"], dspark_files["oracle"], mode, sps=dspark_files["sps"],
                           disable_radix_cache=True, cuda_graph_max_bs=8)
    requests = [GenerateRequest(f"g-{i}", tuple(p), SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True))
                for i, p in enumerate(prompts(6, seed=22))]
    engine, cluster = create_engine(config)
    try:
        recorder, copies = Recorder(), Counter()
        real = decoder_module.to_device
        monkeypatch.setattr(decoder_module, "to_device", lambda *a, **k: copies.update(["to_device"]) or real(*a, **k))
        engine.spec.propose = recorder.wrap("propose", engine.spec.propose)
        engine.spec.accept_greedy = recorder.wrap("accept", engine.spec.accept_greedy)
        recorder.install(monkeypatch)
        run_requests(engine, requests)
        monkeypatch.undo()
        replays = engine.runner.draft.graphs.replays
    finally:
        cluster.stop(engine)
    steps = recorder.calls["propose"]
    assert steps > 3 and recorder.calls["accept"] == steps and replays >= steps
    ours = Counter({s: n for s, n in recorder.read_backs.items() if counted(s[0])})
    planning = {s: n for s, n in ours.items() if s[0] == PLANNING_READ_BACK[0] and PLANNING_READ_BACK[1] in s[2]}
    drafts = {s: n for s, n in ours.items()
              if s[0] == DEVICE_DRAFTS_READ_BACK[0] and DEVICE_DRAFTS_READ_BACK[1] in s[2]}
    greedy = {s: n for s, n in ours.items() if s[0] == "sglaunch/engine/model_runner.py" and "greedy.tolist()" in s[2]}
    host_views = {s: n for s, n in ours.items() if s[0] == "sglaunch/speculative/draft_graphs.py" and ".numpy()" in s[2]}
    rest = {s: n for s, n in ours.items() if s not in planning and s not in drafts and s not in greedy and s not in host_views}
    assert not rest, f"other conversions: {described(Counter(rest))}"
    # one of the two per step, never both
    assert sum(planning.values()) + sum(drafts.values()) == steps, described(ours)
    if mode == "static":
        assert not planning and sum(drafts.values()) == steps, described(ours)
    else:
        assert sum(planning.values()) > 0, described(ours)
    assert 0 < sum(greedy.values()) <= steps  # NOTE: a step that also samples a prefill reads it in _sample first
    assert sum(host_views.values()) >= steps  # the graph path ran (host buffers filled through numpy)
    assert copies["to_device"] == 0


@pytest.mark.parametrize("mode", ["static", "compact"])
def test_drafts_left_on_the_device_give_plain_greedy_output(dspark_files, monkeypatch, mode):
    """Full windows (static mode; compact with a budget that covers every draft, as at low load):
    the verify step's drafts are markers the forward fills in on the device from the drafter's
    block. Greedy output token-identical to plain decoding, with every drafting step taking
    that path and the drafter's graph path running (EagerCapture for CUDA graphs)."""
    from sglaunch.engine import model_runner as runner_module
    from sglaunch.speculative import draft_graphs
    from sglaunch.speculative.planner import DSparkPlanner

    monkeypatch.setattr(draft_graphs, "start_up_graphs",
                        functools.partial(draft_graphs.start_up_graphs, capture=draft_graphs.EagerCapture(), force=True))
    if mode == "compact":  # the budget covers every draft: no window depends on a confidence
        monkeypatch.setattr(DSparkPlanner, "plan_drafts",
                            lambda self, rids, extra=0, committed=0, sampled=False, chains=False: len(rids) * GAMMA)
    filled, real_fill = Counter(), runner_module.ModelRunner._fill_drafts

    def fill(self, input_ids, step):
        filled["rows"] += len(step.draft_rows)
        filled["steps"] += bool(step.draft_rows)
        return real_fill(self, input_ids, step)

    monkeypatch.setattr(runner_module.ModelRunner, "_fill_drafts", fill)
    requests = [GenerateRequest(f"d-{i}", tuple(p), SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True))
                for i, (p, n) in enumerate(zip(prompts(5, seed=31), (3, 9, 12, 5, 16)))]
    engine, cluster = create_engine(engine_config(dspark_files["target"], disable_radix_cache=True))
    try:
        plain = outputs(engine, requests)
    finally:
        cluster.stop(engine)
    config = engine_config(dspark_files["target"], dspark_files["oracle"], mode, sps=dspark_files["sps"],
                           disable_radix_cache=True, cuda_graph_max_bs=8)
    engine, cluster = create_engine(config)
    try:
        drafted = {rid: list(c.token_ids) for rid, c in run_requests(engine, requests).items()}
        steps, accept = engine.spec.stats.steps, engine.spec.stats.to_dict()["mean_accept_length"]
    finally:
        cluster.stop(engine)
    assert drafted == {rid: list(t) for rid, t in plain.items()}
    assert steps > 3 and filled["steps"] == steps and filled["rows"] > steps
    # the oracle drafter's drafts are accepted: a draft filled in wrong would change the output
    assert accept > 2.0
