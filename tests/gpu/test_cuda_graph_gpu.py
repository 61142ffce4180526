"""CUDA graphs of the target forward (FlashInfer, bf16) on a tiny random-weight Qwen3 (head_dim 64):

(b) a replayed graph gives the eager forward's logits: decode at several batch sizes (padded up
    to their bucket) and a DSpark verify tier with padding rows (also the draft context it writes);
(c) end to end: greedy output with graphs on equals graphs off, and DSpark (graphs on) equals
    plain greedy; the torch backend on CUDA runs without graphs.

Tolerances (stated): graph and eager run the same model in bf16 but not bit-identical kernels
(padded GEMM shapes, FlashInfer's CUDA-graph plan always splits KV), so logits may differ by
rounding: max |diff| <= 0.05 * max(1, max |logit|). Greedy outputs are compared token by token;
a divergence is accepted only as a near tie (the two runs' chosen tokens within NEAR_TIE nats of
log-probability at the first differing position), at most one request per comparison.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

REL_LOGITS = 0.05
NEAR_TIE = 0.1
MAX_BS = 16

pytestmark = pytest.mark.usefixtures("flashinfer")


# ---- checkpoints and configs ----------------------------------------------------------------
@pytest.fixture(scope="module")
def files(tmp_path_factory, flashinfer):
    import transformers
    from dspark_helpers import TARGET, oracle_drafter, random_drafter, steep_sps

    root = tmp_path_factory.mktemp("gpu-graphs")
    target = root / "target"
    torch.manual_seed(1234)
    # NOTE: dspark_helpers' target has head_dim 32, which FlashInfer does not run; its drafters
    # only need the target's hidden size and layer count, so they are reused as they are
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**{**TARGET, "head_dim": 64})).float()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("norm.weight", "layernorm.weight")):
                param.add_(torch.randn_like(param) * 0.1)
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                param.mul_(4.0)  # the context matters: wrong KV changes the tokens
    model.save_pretrained(target)
    return {"target": target, "oracle": oracle_drafter(root / "oracle", target),
            "random": random_drafter(root / "random"), "sps": steep_sps(root / "sps.json")}


def cuda_config(files, drafter: str | None = None, graphs: bool = True, backend: str = "flashinfer", **kw):
    from dspark_helpers import engine_config

    config = engine_config(files["target"], files[drafter] if drafter else None, "compact",
                           sps=files["sps"] if drafter else None)
    return dataclasses.replace(config, device="cuda", dtype="bfloat16", kv_cache_dtype="bfloat16",
                               attention_backend=backend, disable_cuda_graph=not graphs,
                               cuda_graph_max_bs=MAX_BS, max_running_requests=MAX_BS,
                               **{"max_total_tokens": 16384, **kw})


class booted:
    """`with booted(config) as engine:` create_engine + clean shutdown."""

    def __init__(self, config):
        from sglaunch.engine.launch import create_engine

        self.engine, self.cluster = create_engine(config)

    def __enter__(self):
        return self.engine

    def __exit__(self, *exc):
        self.cluster.stop(self.engine)


# ---- (b) graph replay == eager forward --------------------------------------------------------
def make_requests(engine, lengths: list[int], spare: int, seed: int):
    """Random tokens and pages for len + spare positions -> [(tokens, pages)]: rows past len are
    what later decode / verify steps feed."""
    rng, page_size = random.Random(seed), engine.config.page_size
    reqs = []
    for n in lengths:
        pages = engine.allocator.alloc(-(-(n + spare) // page_size))
        assert pages is not None, "KV pool too small for the test"
        reqs.append(([rng.randrange(250) for _ in range(n + spare)], pages))
    return reqs


def step_of(reqs, starts: list[int], ends: list[int], page_size: int):
    """Rows start..end-1 of each request (its tokens), sampling every row."""
    from sglaunch.engine.step import StepInput

    step = StepInput([], [], [], [], [], [])
    for (tokens, pages), start, end in zip(reqs, starts, ends):
        step.input_ids += tokens[start:end]
        step.positions += list(range(start, end))
        step.query_lens.append(end - start)
        step.kv_lens.append(end)
        step.page_tables.append(pages[: -(-end // page_size)])
    step.sample_indices = list(range(step.num_tokens))
    return step


def graph_and_eager(runner, step):
    """Logits of `step` through its graph, then eagerly (same KV slots rewritten), plus what the
    draft context holds at the step's slots after each."""
    key = runner.graphs.pick(step)
    assert key is not None, f"no graph fits a step of {step.batch_size} requests / {step.num_tokens} tokens"
    graph_logits = runner.forward(step).clone()
    graph_draft = draft_rows(runner, step)
    graphs, runner.graphs = runner.graphs, None
    try:
        eager_logits = runner.forward(step)
    finally:
        runner.graphs = graphs
    return key, graph_logits, eager_logits, graph_draft, draft_rows(runner, step)


def draft_rows(runner, step):
    if runner.draft is None:
        return None
    from sglaunch.engine.attention.base import RaggedMetadata

    slots = RaggedMetadata.from_step(step, runner.kv_pool.page_size, runner.device).out_slots
    return torch.cat([runner.draft.pool.k[0][slots].float(), runner.draft.pool.v[0][slots].float()], dim=-1)


def assert_close_logits(got, want, what: str):
    assert torch.isfinite(got).all(), f"{what}: non-finite logits from the graph"
    diff = (got - want).abs().max().item()
    bound = REL_LOGITS * max(1.0, want.abs().max().item())
    same_argmax = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    assert diff <= bound, f"{what}: max |graph - eager| {diff:.4f} > {bound:.4f} (argmax agreement {same_argmax:.0%})"


def test_decode_graphs_replay_the_eager_forward(files):
    with booted(cuda_config(files)) as engine:
        runner, page_size = engine.runner, engine.config.page_size
        assert runner.graphs is not None and runner.kv_pool.padding_page is not None
        rng = random.Random(0)
        lengths = [rng.randint(5, 90) for _ in range(13)]
        reqs = make_requests(engine, lengths, spare=1, seed=0)
        runner.forward(step_of(reqs, [0] * 13, lengths, page_size))  # prefill: eager
        for bs in (1, 3, 8, 13):
            step = step_of(reqs[:bs], lengths[:bs], [n + 1 for n in lengths[:bs]], page_size)
            key, graph, eager, _, _ = graph_and_eager(runner, step)
            assert key.decode and key.batch_size >= bs
            assert_close_logits(graph, eager, f"decode bs={bs} (graph {key})")


@pytest.mark.parametrize("in_graph", ["0", "1"])
def test_verify_tier_with_padding_replays_the_eager_forward(files, in_graph, monkeypatch):
    """in_graph=1 (SGLAUNCH_DRAFT_CUDA_GRAPH): the graph writes the draft context itself."""
    from sglaunch.speculative.draft_graphs import ENABLE_ENV

    monkeypatch.setenv(ENABLE_ENV, in_graph)
    with booted(cuda_config(files, drafter="oracle")) as engine:
        runner, page_size = engine.runner, engine.config.page_size
        window = runner.draft.block_size + 1
        lengths = [7, 30, 12, 51, 3]
        windows = [3, 1, window, 2, window]  # ragged, 16 tokens: a tier above with padding rows
        reqs = make_requests(engine, [n + w for n, w in zip(lengths, windows)], spare=0, seed=1)
        runner.forward(step_of(reqs, [0] * 5, lengths, page_size))  # prefill: eager
        step = step_of(reqs, lengths, [n + w for n, w in zip(lengths, windows)], page_size)
        key, graph, eager, graph_draft, eager_draft = graph_and_eager(runner, step)
        assert not key.decode and key.num_tokens > step.num_tokens and key.num_tokens in runner.verify_token_tiers
        assert_close_logits(graph, eager, f"verify {windows} (graph {key})")
        assert_close_logits(graph_draft, eager_draft, "draft context written from the graph's features")


@pytest.mark.parametrize("drafter", [None, "oracle"])
def test_mixed_step_replays_the_eager_forward(files, drafter):
    """A decode batch with a prefill chunk (an arrival under load) replays a ragged graph (the
    verify tiers with DSpark; their own tiers without) and gives the eager forward's logits."""
    with booted(cuda_config(files, drafter=drafter)) as engine:
        runner, page_size = engine.runner, engine.config.page_size
        # the default chunk limit: whatever the largest tier holds
        assert runner.verify_token_tiers and runner.graphs.plan.max_query == max(runner.verify_token_tiers)
        lengths = [9, 33, 17, 50, 4, 26]
        reqs = make_requests(engine, lengths + [45], spare=1, seed=3)
        runner.forward(step_of(reqs[:6], [0] * 6, lengths, page_size))  # prefill: eager
        # six decodes and the seventh request's prefill of 45 tokens (51 rows: a tier above)
        step = step_of(reqs, lengths + [0], [n + 1 for n in lengths] + [45], page_size)
        key, graph, eager, graph_draft, eager_draft = graph_and_eager(runner, step)
        assert not key.decode and key.num_tokens >= step.num_tokens
        assert_close_logits(graph, eager, f"decodes + a prefill chunk (graph {key})")
        if drafter is not None:
            assert_close_logits(graph_draft, eager_draft, "draft context of the mixed step")


@pytest.mark.parametrize("drafter", [None, "oracle"])
def test_long_mixed_chunk_replays_the_eager_forward(files, drafter, monkeypatch):
    """The default chunk limit (the largest ragged tier; 256 before session 18), with graphs up to
    128 requests so that a tier holds the step: six decodes beside a prefill chunk of 400 tokens
    replay a ragged graph and give the eager forward's logits (FlashInfer's graph plan sizes its
    tiles from the tier alone). Padding rows' positions wrap inside the padding page, so tiers
    past the test model's 512 positions are fine."""
    from sglaunch.engine.cuda_graph import MIXED_MAX_QUERY_ENV

    monkeypatch.delenv(MIXED_MAX_QUERY_ENV, raising=False)
    config = dataclasses.replace(cuda_config(files, drafter=drafter), cuda_graph_max_bs=128, max_running_requests=128)
    with booted(config) as engine:
        runner, page_size = engine.runner, engine.config.page_size
        assert runner.graphs.plan.max_query == max(runner.verify_token_tiers) >= 512
        lengths = [9, 33, 17, 50, 4, 26]
        reqs = make_requests(engine, lengths + [400], spare=1, seed=5)
        runner.forward(step_of(reqs[:6], [0] * 6, lengths, page_size))  # prefill: eager
        step = step_of(reqs, lengths + [0], [n + 1 for n in lengths] + [400], page_size)  # 406 rows
        key, graph, eager, graph_draft, eager_draft = graph_and_eager(runner, step)
        assert not key.decode and 406 <= key.num_tokens <= 512
        assert_close_logits(graph, eager, f"decodes + a prefill chunk of 400 tokens (graph {key})")
        if drafter is not None:
            assert_close_logits(graph_draft, eager_draft, "draft context of the long mixed step")


# ---- (c) end to end ---------------------------------------------------------------------------
def greedy_outputs(config, prompts: list[list[int]], max_new_tokens: int | list[int], prepare=None):
    """{rid: (tokens, logprobs)} and how often graphs were replayed. max_new_tokens: one for all,
    or one per prompt (requests that end at different steps let the next ones in one by one).
    prepare(engine): called once the engine is up."""
    from sglaunch.engine.interface import GenerateRequest, SamplingParams

    lengths = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * len(prompts)
    out = {f"r{i}": ([], []) for i in range(len(prompts))}
    with booted(config) as engine:
        draft = engine.runner.draft
        if draft is not None and draft.graphs is not None:  # every key at start-up, none later
            assert draft.graphs.captures == len(draft.graphs.plan.all_keys()) == len(draft.graphs.graphs)
        captured = draft.graphs.captures if draft is not None and draft.graphs is not None else 0
        if prepare is not None:
            prepare(engine)
        for i, p in enumerate(prompts):
            params = SamplingParams(max_new_tokens=lengths[i], temperature=0.0, ignore_eos=True)
            engine.add_request(GenerateRequest(f"r{i}", tuple(p), params))
        while engine.has_work:
            for o in engine.step():
                out[o.rid][0].extend(o.new_token_ids)
                out[o.rid][1].extend(o.logprobs)
        graphs = engine.runner.graphs
        replays = dict(graphs.replays) if graphs is not None else {}
        draft = engine.runner.draft
        if draft is not None and draft.graphs is not None:
            replays["draft"] = draft.graphs.replays
            replays["draft captures while serving"] = draft.graphs.captures - captured
        replays["context skipped"] = engine.context_skipped_steps
        burst = getattr(engine.runner, "burst", None)
        if burst is not None:
            replays["burst"], replays["bursts"] = burst.replays, burst.bursts
            replays["burst graphs"], replays["burst keys"] = burst.captured, len(burst.keys())
    return out, replays


def assert_same_greedy(got, want, label: str, max_diverged: int = 1) -> None:
    diverged = []
    for rid, (want_tokens, want_lps) in want.items():
        tokens, lps = got[rid]
        assert len(tokens) == len(want_tokens), \
            f"{label}: {rid} has {len(tokens)} tokens, expected {len(want_tokens)}"
        i = next((j for j, (a, b) in enumerate(zip(tokens, want_tokens)) if a != b), None)
        if i is None:
            continue
        gap = abs(lps[i] - want_lps[i])
        assert gap <= NEAR_TIE, (f"{label}: {rid} diverges at token {i}: {tokens[i]} (logprob {lps[i]:.4f}) vs "
                                 f"{want_tokens[i]} ({want_lps[i]:.4f}) - not a near tie\n got  {tokens}\n want {want_tokens}")
        diverged.append(f"{rid}@{i} (gap {gap:.3f})")
    assert len(diverged) <= max_diverged, f"{label}: several requests diverge (near ties each?): {diverged}"


def prompts(count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(250) for _ in range(rng.randint(1, 60))] for _ in range(count)]


def test_greedy_with_graphs_equals_without(files):
    batch = prompts(12, seed=2)
    with_graphs, replays = greedy_outputs(cuda_config(files), batch, 24)
    without, _ = greedy_outputs(cuda_config(files, graphs=False), batch, 24)
    assert replays.get("decode", 0) > 0, f"no decode graph was replayed: {replays}"
    assert_same_greedy(with_graphs, without, "graphs on vs off")


def test_greedy_with_mixed_graphs_equals_eager_mixed_steps(files, monkeypatch):
    """Arrivals while others decode (more requests than the batch holds): with ragged graphs for
    mixed steps (the default) the greedy output equals graphs off, and mixed steps replayed."""
    batch = prompts(28, seed=7)
    lengths = [6 + 3 * (i % 7) for i in range(len(batch))]  # they end at different steps
    monkeypatch.setenv("SGLAUNCH_MIXED_GRAPHS", "1")
    mixed, replays = greedy_outputs(cuda_config(files), batch, lengths)
    without, _ = greedy_outputs(cuda_config(files, graphs=False), batch, lengths)
    assert replays.get("verify", 0) > 0, f"no mixed step replayed a ragged graph: {replays}"
    assert_same_greedy(mixed, without, "mixed steps in graphs vs eager", max_diverged=2)  # 28 requests: bf16 rounding
    monkeypatch.setenv("SGLAUNCH_MIXED_GRAPHS", "0")
    _, off = greedy_outputs(cuda_config(files), batch, lengths)
    assert off.get("verify", 0) == 0, f"SGLAUNCH_MIXED_GRAPHS=0 still replayed ragged graphs: {off}"


@pytest.mark.parametrize("graphs", [True, False])
def test_greedy_with_overlap_equals_without(files, graphs, monkeypatch):
    """SGLAUNCH_OVERLAP=1: placeholders filled on the device in graph replays and in eager
    (prefill and mixed) steps, read-back a step late; then every page is back."""
    batch = prompts(20, seed=5)  # more than MAX_BS: admissions while others decode
    monkeypatch.setenv("SGLAUNCH_OVERLAP", "0")
    sync, _ = greedy_outputs(cuda_config(files, graphs=graphs), batch, 24)
    monkeypatch.setenv("SGLAUNCH_OVERLAP", "1")
    overlapped, replays = greedy_outputs(cuda_config(files, graphs=graphs), batch, 24)
    if graphs:
        assert replays.get("decode", 0) > 0, f"no decode graph was replayed: {replays}"
    assert_same_greedy(overlapped, sync, f"overlap on vs off (graphs {graphs})")


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_overlapped_decode_steps_wait_only_on_their_events(files, monkeypatch, temperature):
    """SGLAUNCH_OVERLAP=1, a steady decode batch replaying graphs: the whole engine step (graph
    inputs, FlashInfer plan, placeholder fill, read-back) makes no synchronising CUDA call but
    the two event waits it means to make (the last step's read-back, its plan copies). At T=0.8
    (session 32) the rows are sampled on the device and the step stays in flight the same way."""
    import traceback
    import warnings
    from pathlib import Path

    from sglaunch.engine.interface import GenerateRequest, SamplingParams

    root = Path(__file__).resolve().parents[2]
    allowed = ("self.event.synchronize()", "self._loaded.synchronize()")
    monkeypatch.setenv("SGLAUNCH_OVERLAP", "1")
    params = SamplingParams(max_new_tokens=200, temperature=temperature, seed=11 if temperature else None,
                            ignore_eos=True)
    sites = []

    def show(message, *args, **kwargs):
        if "synchroniz" in str(message) and "prototype feature" not in str(message):  # torch's one-off notice
            frames = [f for f in traceback.extract_stack() if Path(f.filename).resolve().is_relative_to(root / "sglaunch")]
            sites.append(f"{frames[-1].filename}:{frames[-1].lineno} `{frames[-1].line}`" if frames else str(message))

    with booted(cuda_config(files)) as engine:
        for i, p in enumerate(prompts(6, seed=6)):
            engine.add_request(GenerateRequest(f"r{i}", tuple(p), params))
        for _ in range(8):  # prefill, then decode steps
            engine.step()
        before = engine.runner.graphs.replays["decode"]
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = show
            torch.cuda.set_sync_debug_mode("warn")
            try:
                for _ in range(10):
                    engine.step()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        assert engine.runner.graphs.replays["decode"] - before == 10
        assert engine._in_flight is not None
        assert engine.live_stats()["total_graph_replays"] == engine.runner.graphs.replays  # /server_info's count
    unexpected = [site for site in sites if not any(a in site for a in allowed)]
    assert not unexpected, f"synchronising calls in overlapped decode steps: {unexpected}"


@pytest.mark.parametrize("drafter", ["oracle", "random"])
def test_dspark_with_graphs_equals_plain_greedy(files, drafter):
    batch = prompts(10, seed=3)
    plain, _ = greedy_outputs(cuda_config(files), batch, 20)
    spec, replays = greedy_outputs(cuda_config(files, drafter=drafter), batch, 20)
    assert replays.get("verify", 0) > 0, f"no verify graph was replayed: {replays}"
    assert_same_greedy(spec, plain, f"DSpark ({drafter} drafter, graphs on) vs plain greedy")


def test_dspark_drafts_never_push_an_admitting_step_past_the_largest_graph(files, monkeypatch):
    """Session 44 (H100, benchmarks/gpu44/run2): at 8 requests at most, graph-sized steps filled the
    largest ragged tier (64 rows) with a prompt chunk beside the decodes, the decodes drafted on top, and
    28 of 362 admitting steps ran eagerly (`eager (tokens)`, 15-26 ms each). Here 4 requests at most
    (tiers up to 32 rows), prompts longer than that, requests ending at different steps so prompts arrive
    beside decodes, and drafting wherever a draft fits (SGLAUNCH_DSPARK_STEP_ASIDE=0): no target forward
    runs eagerly for its rows, and the outputs stay plain greedy."""
    monkeypatch.setenv("SGLAUNCH_DSPARK_STEP_ASIDE", "0")
    monkeypatch.setenv("SGLAUNCH_DSPARK_BURST", "0")  # every decode step a drafting step
    rng = random.Random(44)
    batch = [[rng.randrange(1, 200) for _ in range(rng.choice((40, 57, 70, 90)))] for _ in range(10)]
    lengths = [rng.randrange(8, 24) for _ in batch]

    def small(config):
        return dataclasses.replace(config, cuda_graph_max_bs=4, max_running_requests=4)

    plain, _ = greedy_outputs(small(cuda_config(files)), batch, lengths)
    spec, replays = greedy_outputs(small(cuda_config(files, drafter="oracle")), batch, lengths)
    assert replays.get("verify", 0) > 0 and not any(k.startswith("eager") for k in replays), replays
    assert_same_greedy(spec, plain, "DSpark with drafts cut to the largest graph vs plain greedy")


def test_dspark_decode_graphs_without_draft_context_equal_plain_greedy(files, monkeypatch):
    """SGLAUNCH_DSPARK_SKIP_CONTEXT=1 (the default): each decode size is also captured without the
    draft context write; once the planner has stepped aside a few steps in a row, plain decode
    steps replay those, and the outputs stay plain greedy."""
    monkeypatch.setenv("SGLAUNCH_DSPARK_BURST", "0")
    monkeypatch.setenv("SGLAUNCH_DSPARK_SKIP_CONTEXT", "1")
    batch = prompts(10, seed=3)
    plain, _ = greedy_outputs(cuda_config(files), batch, 24)

    def every_step_aside(engine):
        assert engine.runner.graphs.plan.contextless
        engine.spec.planner.plan_drafts = lambda rids, extra=0, committed=0, sampled=False, chains=False: None
        engine.context_skip_min_batch, engine.context_skip_streak = 1, 2

    spec, replays = greedy_outputs(cuda_config(files, drafter="oracle"), batch, 24, every_step_aside)
    assert replays["context skipped"] > 0 and replays.get("decode without draft context", 0) > 0, replays
    assert_same_greedy(spec, plain, "DSpark decode steps without the draft context vs plain greedy")


@pytest.mark.parametrize("mode", ["static", "compact"])
def test_dspark_bursts_with_graphs_equal_plain_greedy(files, mode, monkeypatch):
    """Bursts (their default on CUDA): the burst graphs, every key captured at start-up, replayed
    for all-greedy decode batches; static mode bursts at every such step, compact when its
    start-up profile says a burst beats a plain step (the oracle drafter accepts nearly all)."""
    monkeypatch.setenv("SGLAUNCH_DSPARK_BURST", "auto")
    batch = prompts(10, seed=6)
    plain, _ = greedy_outputs(cuda_config(files), batch, 40)
    config = cuda_config(files, drafter="oracle")
    # compact without a table: the start-up profile measures this machine's step and burst costs
    config = dataclasses.replace(config, speculative=dataclasses.replace(config.speculative, ragged_verify_mode=mode,
                                                                         sps_table_path=None))
    spec, replays = greedy_outputs(config, batch, 40)
    assert replays["burst graphs"] == replays["burst keys"] > 0, replays
    assert replays["bursts"] > 0 and replays["burst"] >= replays["bursts"], replays
    # NOTE: a burst's verify attention is its own kernel (not FlashInfer's), so bf16 near ties may
    # resolve the other way: on the H200 (session 10) 2 of 10 requests diverged at 40 tokens, at
    # gaps of 0.000 and 0.002. Every divergence must still be a near tie
    assert_same_greedy(spec, plain, f"DSpark bursts ({mode}, graphs on) vs plain greedy", max_diverged=3)


def test_dspark_bursts_ended_early_equal_plain_greedy(files, monkeypatch):
    """SGLAUNCH_DSPARK_BURST_EARLY_STOP=1: bursts queued two iterations ahead of the device (their
    own events polled), ended when the channel says a command waits (here every other look); the
    same greedy tokens as plain decoding, and some bursts did end early."""
    monkeypatch.setenv("SGLAUNCH_DSPARK_BURST", "auto")
    monkeypatch.setenv("SGLAUNCH_DSPARK_BURST_EARLY_STOP", "1")
    batch = prompts(4, seed=7)
    plain, _ = greedy_outputs(cuda_config(files), batch, 48)
    config = cuda_config(files, drafter="oracle")
    config = dataclasses.replace(config, speculative=dataclasses.replace(config.speculative, ragged_verify_mode="static"))
    looks, stopped, engines = [], [], []

    def prepare(engine):
        assert engine.burst_early_stop
        engine.input_waiting = lambda: bool(looks.append(1) or len(looks) % 2)
        stopped.append(engine.burst)
        engines.append(engine)

    spec, replays = greedy_outputs(config, batch, 48, prepare=prepare)
    policy = stopped[0]
    assert replays["bursts"] > 0 and policy.stopped > 0, (replays, policy.stopped, dict(policy.skipped),
                                                           policy.accept, policy.scale, engines[0]._burst_log(),
                                                           engines[0].spec.stats() if hasattr(engines[0].spec, "stats") else None)
    assert_same_greedy(spec, plain, "DSpark bursts ended early (graphs on) vs plain greedy", max_diverged=2)


def test_dspark_drafts_left_on_the_device_equal_plain_greedy(files, monkeypatch):
    """Static mode (every window full): each drafting step's verify inputs are filled in on the
    device from the drafter graph's block (no planning read-back), inside CUDA graph replays."""
    from sglaunch.engine import model_runner as runner_module

    filled, real = [], runner_module.ModelRunner._fill_drafts

    def fill(self, input_ids, step):
        filled.append(len(step.draft_rows))
        return real(self, input_ids, step)

    monkeypatch.setattr(runner_module.ModelRunner, "_fill_drafts", fill)
    batch = prompts(10, seed=5)
    plain, _ = greedy_outputs(cuda_config(files), batch, 20)
    config = cuda_config(files, drafter="oracle")
    config = dataclasses.replace(config, speculative=dataclasses.replace(config.speculative, ragged_verify_mode="static"))
    filled.clear()
    spec, replays = greedy_outputs(config, batch, 20)
    assert replays.get("verify", 0) > 0 and replays.get("draft", 0) > 0, replays
    assert sum(1 for n in filled if n) >= replays["draft"], (filled, replays)
    assert_same_greedy(spec, plain, "DSpark static (drafts on the device, graphs on) vs plain greedy")


def second_chain_config(files, mode: str, drafter: str = "oracle"):
    """A drafter (the oracle by default) at page size 1 (a second chain needs it), in `mode`, with no SPS table."""
    config = cuda_config(files, drafter=drafter)
    return dataclasses.replace(config, page_size=1, speculative=dataclasses.replace(
        config.speculative, ragged_verify_mode=mode, sps_table_path=None))


@pytest.mark.parametrize("mode", ["static", "compact"])
def test_dspark_second_chain_with_graphs_equals_plain_greedy(files, mode, monkeypatch):
    """SGLAUNCH_DSPARK_SECOND_CHAIN=3 (bursts off: they run one chain): each all-greedy drafting
    step also verifies the runner-up chain in a window of its own, its drafts filled in on the
    device beside the block's, inside graph replays; the winner's pages kept, the output plain greedy."""
    monkeypatch.setenv("SGLAUNCH_DSPARK_BURST", "0")
    monkeypatch.setenv("SGLAUNCH_DSPARK_SECOND_CHAIN", "3")
    batch = prompts(4, seed=5)  # NOTE: steps of up to SECOND_CHAIN_MAX_BATCH requests verify it
    plain, _ = greedy_outputs(cuda_config(files), batch, 24)
    config = second_chain_config(files, mode)
    seen = []
    spec, replays = greedy_outputs(config, batch, 24, prepare=seen.append)
    stats = seen[0].spec.stats.to_dict()
    assert replays.get("verify", 0) > 0, replays
    assert stats["second_chains"] > 0, stats
    assert_same_greedy(spec, plain, f"DSpark second chain ({mode}, graphs on) vs plain greedy")


def test_dspark_bursts_with_a_second_chain_equal_plain_greedy(files, monkeypatch):
    """Bursts with SGLAUNCH_DSPARK_SECOND_CHAIN: every iteration's graph also drafts and verifies
    the runner-up chain (the Triton attention over twice the rows) and swaps the winner's slots
    into the burst's table; the host replays the swaps. Plain greedy output (near ties aside, as
    for bursts), and the chain was verified."""
    monkeypatch.setenv("SGLAUNCH_DSPARK_BURST", "auto")
    monkeypatch.setenv("SGLAUNCH_DSPARK_SECOND_CHAIN", "3")
    batch = prompts(4, seed=6)  # NOTE: bursts of up to SECOND_CHAIN_MAX_BATCH requests verify it
    plain, _ = greedy_outputs(cuda_config(files), batch, 40)
    config = second_chain_config(files, "static")
    seen = []
    spec, replays = greedy_outputs(config, batch, 40, prepare=seen.append)
    assert seen[0].runner.burst.uses_second_chain(4, 128)
    assert replays["bursts"] > 0, replays
    assert seen[0].spec.stats.to_dict()["second_chains"] > 0
    assert_same_greedy(spec, plain, "DSpark bursts with a second chain (graphs on) vs plain greedy", max_diverged=3)


def run_seeded(engine, batch, temperature, max_new_tokens: int, seed: int, out: dict, filters=None) -> None:
    """Request r{i} for each prompt at temperature(i) with seed + i (EOS ignored) and filters(i)'s
    top_k / top_p / min_p, run to the end; out[rid] = (tokens, logprobs) lists, extended."""
    from sglaunch.engine.interface import GenerateRequest, SamplingParams

    for i, p in enumerate(batch):
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature(i), seed=seed + i,
                                ignore_eos=True, **(filters(i) if filters else {}))
        engine.add_request(GenerateRequest(f"r{i}", tuple(p), params))
    while engine.has_work:
        for o in engine.step():
            out[o.rid][0].extend(o.new_token_ids)
            out[o.rid][1].extend(o.logprobs)


def test_dspark_sampled_second_chain_with_graphs(files, monkeypatch):
    """SGLAUNCH_DSPARK_SAMPLED_CHAIN=3 on CUDA, with SGLAUNCH_DSPARK_SECOND_CHAIN unset (3 there at
    page size 1, for the greedy steps): steps mixing sampled and greedy requests draw the sampled chains on the
    device, verify them inside graph replays and accept both chains on the device (the Triton accept
    for the first). The greedy requests stay plain greedy, the sampled ones produce their length,
    the chain wins, and every page comes back."""
    monkeypatch.delenv("SGLAUNCH_DSPARK_SECOND_CHAIN", raising=False)
    monkeypatch.setenv("SGLAUNCH_DSPARK_SAMPLED_CHAIN", "3")
    # NOTE: every decode step a synchronous drafting step, where chains are verified: the planner steps aside
    # from a random drafter, and bursts run one chain (session 46, H100: 3 drafting steps of 64, 12 chains,
    # none won, with neither set)
    monkeypatch.setenv("SGLAUNCH_DSPARK_STEP_ASIDE", "0")
    monkeypatch.setenv("SGLAUNCH_DSPARK_BURST", "0")
    batch = prompts(4, seed=7)
    plain, _ = greedy_outputs(cuda_config(files), batch, 64)
    out = {f"r{i}": ([], []) for i in range(len(batch))}
    # NOTE: the random drafter: its first drafts are rejected nearly always, so the chain gets its chances
    # (64 tokens: at 24, one H100 run in session 35 verified 24 chains and none won)
    with booted(second_chain_config(files, "compact", "random")) as engine:
        assert engine.spec.second_chain == 3 and engine.spec.sampled_chain == 3
        run_seeded(engine, batch, lambda i: 0.0 if i % 2 else 1.0, 64, 40, out)
        stats = engine.spec.stats.to_dict()
        replays = dict(engine.runner.graphs.replays)
        cached = engine.scheduler.radix.cached_pages if engine.scheduler.radix else 0
        assert engine.allocator.num_used == cached
    assert replays.get("verify", 0) > 0, replays
    assert stats["second_chains"] > 0 and stats["second_chain_wins"] > 0, stats
    assert all(len(t) == 64 for t, _ in out.values())
    assert_same_greedy(out, {k: v for k, v in plain.items() if int(k[1:]) % 2},
                       "greedy requests beside sampled ones, second chains on")


def test_torch_backend_on_cuda_runs_eagerly(files):
    batch = prompts(4, seed=4)
    torch_out, replays = greedy_outputs(cuda_config(files, backend="torch"), batch, 8)
    # NOTE: greedy_outputs always reports the engine's context-skip counter; no count may be nonzero
    assert not any(replays.values()), replays
    flashinfer_out, _ = greedy_outputs(cuda_config(files), batch, 8)
    assert_same_greedy(flashinfer_out, torch_out, "flashinfer + graphs vs torch backend")


@pytest.mark.parametrize("drafter,backend", [("random", "flashinfer"), (None, "torch")])
def test_engine_steps_do_not_plan_cudnn_attention(files, drafter, backend):
    """The drafter's context (and the torch backend's padded batch) changes shape every step;
    cuDNN's SDPA would build a new execution plan each time (tens of ms on the host)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        greedy_outputs(cuda_config(files, drafter=drafter, backend=backend), prompts(2, seed=5), 6)
    cudnn = [e.key for e in prof.key_averages() if "cudnn_attention" in e.key]
    assert not cudnn, f"SDPA ran on cuDNN: {cudnn}"


@pytest.mark.parametrize("drafter", ["oracle", "random"])
def test_drafter_graphs_give_the_eager_drafts(files, drafter, monkeypatch):
    """By default (SGLAUNCH_DRAFT_CUDA_GRAPH unset) the block forward replays graphs (padded batch and context),
    and DSpark still equals plain greedy; the oracle drafter's accept lengths need exact drafts."""
    from sglaunch.speculative.draft_graphs import ENABLE_ENV

    batch = prompts(10, seed=6)
    plain, _ = greedy_outputs(cuda_config(files), batch, 20)
    monkeypatch.setenv(ENABLE_ENV, "0")
    eager, eager_replays = greedy_outputs(cuda_config(files, drafter=drafter), batch, 20)
    assert eager_replays.get("draft", 0) == 0, f"SGLAUNCH_DRAFT_CUDA_GRAPH=0 replayed drafter graphs: {eager_replays}"
    monkeypatch.delenv(ENABLE_ENV)  # the default: drafter graphs on
    graphed, replays = greedy_outputs(cuda_config(files, drafter=drafter), batch, 20)
    assert replays.get("draft", 0) > 0, f"no drafter graph was replayed: {replays}"
    assert replays["draft captures while serving"] == 0, f"a serving step captured a drafter graph: {replays}"
    assert_same_greedy(graphed, plain, f"DSpark ({drafter} drafter, drafter graphs) vs plain greedy")
    assert_same_greedy(graphed, eager, f"DSpark ({drafter} drafter) with drafter graphs vs without")


@pytest.mark.parametrize("chain", [0, 3])
def test_sampled_drafter_graphs_give_the_eager_draws(files, monkeypatch, chain):
    """Session 33: by default (SGLAUNCH_DRAFT_SAMPLED_GRAPH unset) a step with a sampled row replays a sampled
    drafter graph (the forward, then the block's draws at the rows' temperatures and host-drawn
    uniforms); seeded sampled requests beside a greedy one produce exactly the tokens of
    SGLAUNCH_DRAFT_SAMPLED_GRAPH=0 (the sampling eager after the forward's graph), drafting at every step (the oracle
    drafter: peaked draft distributions). chain 3: SGLAUNCH_DSPARK_SAMPLED_CHAIN=3 at page size 1
    with the random drafter (so that the chain wins), the second chains drawn in the graphs too:
    the greedy request stays plain greedy and the sampled ones complete. NOTE: not compared token
    for token with the eager run: on the H100 (session 33) two of its three sampled requests
    diverged from it. The eager draws run at the real batch, the graph's at the padded bucket,
    and the random drafter's flat distributions turn a last-bit difference (batch-dependent GEMM
    kernels, once a request has finished) into another draw; the draws themselves are compared
    at one shape in test_sampled_drafter_graph_draws_equal_the_eager_draws_at_its_shape."""
    from sglaunch.speculative.draft_graphs import SAMPLED_ENV

    monkeypatch.setenv("SGLAUNCH_DSPARK_STEP_ASIDE", "0")
    monkeypatch.setenv("SGLAUNCH_DSPARK_SAMPLED_CHAIN", str(chain))
    batch = prompts(4 if chain else 6, seed=12)  # NOTE: a chain needs at most SECOND_CHAIN_MAX_BATCH requests
    config = second_chain_config(files, "compact", "random") if chain else cuda_config(files, drafter="oracle")

    def sampled_run():
        out = {f"r{i}": ([], []) for i in range(len(batch))}
        with booted(config) as engine:
            graphs = engine.runner.draft.graphs
            before = (graphs.captures, graphs.sampled_replays)
            run_seeded(engine, batch, lambda i: 0.0 if i == 0 else 0.8, 20, 60, out)
            seen = dict(sampled_batch=graphs.plan.sampled_batch, sampled_replays=graphs.sampled_replays - before[1],
                        captured_while_serving=graphs.captures - before[0], steps=engine.spec.stats.steps,
                        chain=graphs.chain, chains=engine.spec.stats.to_dict()["second_chains"])
        return out, seen

    monkeypatch.setenv(SAMPLED_ENV, "0")  # the draws eager
    eager, eager_seen = sampled_run()
    assert eager_seen["sampled_batch"] == 0 and eager_seen["sampled_replays"] == 0, eager_seen
    monkeypatch.delenv(SAMPLED_ENV, raising=False)  # the default: the sampled graphs
    graphed, seen = sampled_run()
    assert seen["sampled_batch"] >= MAX_BS and seen["sampled_replays"] > 0, seen
    assert seen["captured_while_serving"] == 0 and seen["steps"] > 0, seen
    assert seen["chain"] == chain and (seen["chains"] > 0) == (chain > 0), seen
    assert all(len(t) == 20 for t, _ in graphed.values())
    if chain:
        plain, _ = greedy_outputs(cuda_config(files), [batch[0]], 20)
        assert_same_greedy({"r0": graphed["r0"]}, plain, "the greedy request beside sampled ones, chains in graphs")
    else:
        assert {k: v[0] for k, v in graphed.items()} == {k: v[0] for k, v in eager.items()}


def test_sampled_drafter_graph_draws_equal_the_eager_draws_at_its_shape(files, monkeypatch):
    """On CUDA a sampled drafter graph's replay draws exactly what sample_block (and, for a key of
    up to SECOND_CHAIN_MAX_BATCH requests, sampled_second_chain) draws eagerly from the same
    forward at the same batch: tokens, draft probabilities and the chain, for greedy and sampled
    rows (session 33: separates the graph's logic from batch-dependent rounding)."""
    from sglaunch.speculative.draft_graphs import SAMPLED_ENV
    from sglaunch.speculative.drafter import BlockOutput

    monkeypatch.setenv(SAMPLED_ENV, "1")
    monkeypatch.setenv("SGLAUNCH_DSPARK_SAMPLED_CHAIN", "3")
    with booted(second_chain_config(files, "compact", "random")) as engine:
        draft = engine.runner.draft
        graphs, drafter, G = draft.graphs, draft.drafter, draft.block_size
        assert graphs.chain == 3
        vocab = drafter.config.vocab_size
        for B in (1, 4, 8):
            key = graphs.pick(B, 1, sampled=True)
            assert key is not None and key.batch == B and graphs.draws_chain(key) == (B <= 4)
            gen = torch.Generator().manual_seed(B)
            temps = [0.9] + [0.0 if i % 3 == 1 else 0.7 for i in range(1, B)]
            u = torch.rand(B, graphs.width, generator=gen)
            anchors = torch.randint(0, vocab, (B,), generator=gen).tolist()
            out = graphs.run_padded(key, anchors, [0] * B, torch.zeros(B, 0, dtype=torch.int64), temps, u)
            got = [out.sampled.tokens.clone(), out.sampled.probs.clone()]
            if graphs.draws_chain(key):
                got += [t.clone() for t in out.sampled_second]
            base = BlockOutput(out.hidden.clone(), out.logits.clone())
            device = out.logits.device
            a, t, d = (torch.tensor(anchors, device=device), torch.tensor(temps, device=device), u.to(device))
            want = drafter.sample_block(base, a, t, uniforms=d[:, :G])
            assert torch.equal(got[0], want.tokens), (B, got[0], want.tokens)
            assert torch.equal(got[1], want.probs), B
            if graphs.draws_chain(key):
                tokens, probs = drafter.sampled_second_chain(base, a, want, t, d[:, G: G + 3], 3)
                assert torch.equal(got[2], tokens) and torch.equal(got[3], probs), (B, got[2], tokens)


def test_wide_heads_capture_every_graph_up_to_256_requests(tmp_path):
    """16 query heads of 128 (the Qwen3-1.7B shape's attention, two layers) with the default graph
    cap of 256: the ragged graph of 2,048 rows and 257 requests needs 288 MiB of split-KV partial
    results, past FlashInfer's 128 MiB example workspace (session 23, H200: the capture failed with
    "Buffer overflow ... batch_prefill_tmp_v"). The workspace is sized for it, every graph is
    captured, and greedy output with graphs equals graphs off."""
    import transformers

    from sglaunch.engine.attention.flashinfer_backend import workspace_bytes

    torch.manual_seed(5)
    shape = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
                 tie_word_embeddings=True, eos_token_id=None)
    transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**shape)).float().save_pretrained(tmp_path / "wide")
    wide = {"target": tmp_path / "wide"}
    config = dataclasses.replace(cuda_config(wide), cuda_graph_max_bs=256, max_running_requests=256,
                                 max_total_tokens=65536)
    batch = prompts(6, seed=11)
    seen = {}

    def inspect(engine):
        runner = engine.runner
        keys = runner.graphs.plan.keys()
        sms = torch.cuda.get_device_properties(runner.device).multi_processor_count
        seen.update(ragged=max(k.num_tokens for k in keys if not k.decode), captured=len(runner.graphs.graphs),
                    keys=len(keys), workspace=runner.attn.workspace.numel(),
                    want=workspace_bytes(16, 8, 128, sms, [(k.num_tokens, k.batch_size) for k in keys]))

    with_graphs, replays = greedy_outputs(config, batch, 12, prepare=inspect)
    assert seen["ragged"] >= 2048, f"no ragged graph as large as the failing one: {seen}"
    assert seen["workspace"] == seen["want"] > 128 << 20, seen
    assert seen["captured"] == seen["keys"], seen
    without, _ = greedy_outputs(dataclasses.replace(config, disable_cuda_graph=True), batch, 12)
    assert replays.get("decode", 0) > 0, f"no decode graph was replayed: {replays}"
    assert_same_greedy(with_graphs, without, "wide heads, graphs on vs off")


def test_dspark_default_budget_keeps_the_drafters_working_memory_free(files, caplog):
    """With the default --mem-fraction-static, a DSpark engine measures its drafter's largest forward
    before sizing the KV pool and leaves 1.5 times it free (session 24: on an H100 the drafter graphs'
    capture ran out of memory at start-up beside a pool sized to 0.88 of the card). The measure is at
    least the gathered context K/V of one layer of the largest graph key, the pool is smaller by the
    reserve than without it, and every drafter graph is captured."""
    import logging

    from sglaunch.speculative.draft_graphs import DraftGraphPlan
    from sglaunch.engine.cuda_graph import capture_batch_sizes

    config = cuda_config(files, drafter="oracle", max_total_tokens=None)
    assert config.mem_fraction_static is None
    with caplog.at_level(logging.INFO, logger="sglaunch"), booted(config) as engine:
        runner = engine.runner
        c = runner.draft.drafter.config
        key = DraftGraphPlan(capture_batch_sizes(config.graph_batch_cap), runner.context_length).keys()[0]
        measured = runner.draft.working_bytes(capture_batch_sizes(config.graph_batch_cap), runner.context_length,
                                              torch.bfloat16)
        graphs = runner.draft.graphs
        assert graphs is not None and graphs.captures == len(graphs.plan.all_keys())
    gathered = 2 * key.batch * key.context * c.num_kv_heads * c.head_dim * 2
    assert measured >= gathered, (measured, gathered, key)
    lines = [r.getMessage() for r in caplog.records if "working memory" in r.getMessage()]
    assert lines and "kept out of the default budget" in lines[0], lines


@pytest.mark.parametrize("filtered", [False, True])
def test_dspark_sampled_bursts_with_graphs(files, monkeypatch, filtered):
    """Sampled bursts on CUDA graphs (SGLAUNCH_DSPARK_SAMPLED_BURST, on by default): the sampled keys
    are captured at start-up beside the greedy ones, and a static-mode batch of seeded rows at T = 0.9
    beside greedy rows bursts through them (the drafter's draws, the verify, softmax at each row's
    temperature, the Triton accept and the next anchors in one graph an iteration). filtered: the
    sampled rows also filter so that one token is left (top-k 1, min-p 1, top-p 1e-6), and the batch
    bursts through the filtered keys (SGLAUNCH_DSPARK_FILTERED_BURST, on by default: the target rows'
    sorted filter in the graph), so their tokens are plain greedy decoding's although their drafts
    are drawn at T = 0.9. NOTE: not a wider filter: these random weights give near-flat rows, where
    the top-k / top-p boundary falls between near-equal tokens and bf16 rounding (the burst's own
    attention against FlashInfer) moves it, and the draw with it (H100, session 39,
    benchmarks/gpu39/gputest.log: top-p 0.9 with and without top-k 20, 2 of 3 rows apart from
    their 3rd / 7th token); tests/dspark/test_burst.py checks wider filters token for token on
    the CPU. Every request
    gets its length; the greedy rows stay plain greedy (near ties aside, as for bursts); the sampled
    rows follow the same seeded draws as the usual drafting steps (every step drafting, no burst):
    equal tokens before their last window but where bf16 rounding (the burst's own attention kernel
    against FlashInfer) moves a draw across a boundary, at most one request in three."""
    from dspark_helpers import GAMMA

    monkeypatch.setenv("SGLAUNCH_DSPARK_STEP_ASIDE", "0")
    batch, new = prompts(6, seed=8), 40
    temperature = (lambda i: 0.0 if i % 2 == 0 else 0.9)
    one_left = {1: {"top_k": 1}, 3: {"min_p": 1.0}, 5: {"top_p": 1e-6}}
    filters = (lambda i: one_left.get(i, {})) if filtered else None
    kind = "filtered" if filtered else "sampled"
    config = cuda_config(files, drafter="oracle")
    config = dataclasses.replace(config, speculative=dataclasses.replace(config.speculative, ragged_verify_mode="static"))
    runs = {}
    for burst in ("0", "auto"):
        monkeypatch.setenv("SGLAUNCH_DSPARK_BURST", burst)
        out = {f"r{i}": ([], []) for i in range(len(batch))}
        with booted(config) as engine:
            run_seeded(engine, batch, temperature, new, 50, out, filters)
            runner = engine.runner.burst
            if burst == "auto":
                sampled_keys = [k for k in runner.keys() if k.sampled and k.filtered == filtered]
                assert sampled_keys and all(k in runner.graphs for k in sampled_keys)
                stats = engine.live_stats()["speculative"]["bursts"]
                assert stats[kind]["bursts"] > 0 and stats[kind]["iterations"] > stats[kind]["bursts"], stats
        runs[burst] = out
    plain, _ = greedy_outputs(cuda_config(files), batch[::2], new)
    bursting = runs["auto"]
    assert all(len(tokens) == new for tokens, _ in bursting.values())
    assert_same_greedy({f"r{i}": bursting[f"r{2 * i}"] for i in range(len(plain))}, plain,
                       "sampled bursts' greedy rows vs plain greedy", max_diverged=2)
    if filtered:  # one token left: the sampled rows are greedy too, with and without bursts
        plain_odd, _ = greedy_outputs(cuda_config(files), batch[1::2], new)
        for out, what in ((bursting, "filtered bursts"), (runs["0"], "filtered drafting steps")):
            assert_same_greedy({f"r{i}": out[f"r{2 * i + 1}"] for i in range(len(plain_odd))}, plain_odd,
                               f"{what}' one-token rows vs plain greedy", max_diverged=2)
        return
    cut = new - (GAMMA + 1)
    differ = [rid for i, rid in enumerate(bursting) if i % 2 and bursting[rid][0][:cut] != runs["0"][rid][0][:cut]]
    assert len(differ) <= 1, (differ, {rid: (bursting[rid][0], runs["0"][rid][0]) for rid in differ})
