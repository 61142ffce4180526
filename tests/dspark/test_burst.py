"""DSpark bursts (speculative/burst.py) on the CPU: N drafting steps run back to back from device
buffers, read back once. Greedy output token-identical to plain decoding (radix on and off, page
sizes 1 and 4, the oracle and the random drafter), stop tokens and length caps inside a burst,
chunked prefill with preemption, no pages left behind; the policy that decides when to burst."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():  # the burst attention's Triton kernel runs in the interpreter here
    os.environ.setdefault("TRITON_INTERPRET", "1")

from dspark_helpers import GAMMA, engine_config, prompts
from sglaunch.engine.interface import GenerateRequest, SamplingParams
from sglaunch.engine.launch import create_engine, generate_batch
from sglaunch.speculative.burst import (BURST_ENV, BurstInput, BurstPolicy, iterations_from_env,
                                        slot_rows)
from test_engine_dspark import BATCHES, greedy, make_requests, run, tokens_of


@pytest.fixture
def bursts(monkeypatch):
    monkeypatch.setenv(BURST_ENV, "3")


@pytest.fixture(scope="module")
def baselines(dspark_files):
    out = {}
    for page_size in (1, 4):
        engine, cluster = create_engine(engine_config(dspark_files["target"], page_size=page_size))
        try:
            out[page_size] = [run(engine, make_requests(b, f"b{n}")) for n, b in enumerate(BATCHES)]
        finally:
            cluster.stop(engine)
    return out


def run_bursting(config, batches):
    engine, cluster = create_engine(config)
    try:
        assert engine.burst is not None and engine.runner.burst is not None
        results = [run(engine, make_requests(b, f"b{n}")) for n, b in enumerate(batches)]
        radix = engine.scheduler.radix
        assert engine.allocator.num_used == (radix.cached_pages if radix else 0)  # nothing left reserved
        return results, engine.spec.stats.to_dict(), engine.runner.burst.bursts
    finally:
        cluster.stop(engine)


@pytest.mark.parametrize("drafter,radix,page_size", [("oracle", True, 1), ("oracle", False, 4),
                                                     ("random", True, 4)])
def test_bursts_are_lossless(dspark_files, baselines, bursts, drafter, radix, page_size):
    config = engine_config(dspark_files["target"], dspark_files[drafter], "static", disable_radix_cache=not radix,
                           page_size=page_size)
    results, stats, count = run_bursting(config, BATCHES)
    assert count > 0
    assert tokens_of(results) == tokens_of(baselines[page_size])
    for spec_batch, base_batch in zip(results, baselines[page_size]):
        for rid, (_, lps, reason) in spec_batch.items():
            assert reason == base_batch[rid][2] == "length"
            torch.testing.assert_close(torch.tensor(lps), torch.tensor(base_batch[rid][1]), atol=1e-4, rtol=0)
    if drafter == "oracle":  # most drafts accepted: several tokens per iteration
        assert stats["mean_accept_length"] > 2.0


def test_burst_off_by_default_on_cpu(dspark_files, monkeypatch):
    monkeypatch.delenv(BURST_ENV, raising=False)
    engine, cluster = create_engine(engine_config(dspark_files["target"], dspark_files["oracle"], "static"))
    try:
        assert engine.burst is None and engine.runner.burst is None
    finally:
        cluster.stop(engine)


def burst_outputs(config, batch, tag, params):
    """Run `batch` with bursts on -> (per request (tokens, logprobs, finish reason), preemptions);
    bursts must have run and no page may be left reserved."""
    engine, cluster = create_engine(config)
    try:
        out = run(engine, make_requests(batch, tag, params))
        assert engine.runner.burst.bursts > 0
        assert engine.allocator.num_used == engine.scheduler.radix.cached_pages
        return [out[f"{tag}-{i}"] for i in range(len(batch))], engine.scheduler.num_preemptions
    finally:
        cluster.stop(engine)


def test_stop_tokens_inside_a_burst(dspark_files, bursts):
    batch = prompts(6, seed=5)
    plain = generate_batch(engine_config(dspark_files["target"]), batch, greedy(30))
    stops = tuple({row[len(row) // 2] for row in plain})
    params = greedy(30, stop_token_ids=stops)
    expected = generate_batch(engine_config(dspark_files["target"]), batch, params)
    out, _ = burst_outputs(engine_config(dspark_files["target"], dspark_files["oracle"], "static"), batch, "s", params)
    assert [tokens for tokens, _, _ in out] == expected
    assert {reason for _, _, reason in out} == {"stop"}


def test_chunked_prefill_and_preemption_with_bursts(dspark_files, bursts):
    batch = prompts(12, seed=4, lengths=(9, 30, 17, 45))
    params = greedy(24)
    tight = dict(page_size=2, max_total_tokens=112, chunked_prefill_size=8)  # bursts and preemptions both
    base = generate_batch(engine_config(dspark_files["target"], **tight), batch, params)
    out, preemptions = burst_outputs(engine_config(dspark_files["target"], dspark_files["oracle"], "static", **tight),
                                     batch, "p", params)
    assert preemptions > 0
    assert [tokens for tokens, _, _ in out] == base


def test_rows_that_filter_take_the_usual_step_without_filtered_bursts(dspark_files, bursts, monkeypatch):
    """SGLAUNCH_DSPARK_FILTERED_BURST=0: a batch with a request that samples with top-p never bursts
    (sampled bursts take temperature-only rows then); its greedy requests still equal plain."""
    monkeypatch.setenv("SGLAUNCH_DSPARK_FILTERED_BURST", "0")
    batch = prompts(4, seed=9)
    expected = generate_batch(engine_config(dspark_files["target"]), batch, greedy(12))
    engine, cluster = create_engine(engine_config(dspark_files["target"], dspark_files["oracle"], "static"))
    try:
        assert engine.burst_sampled is not None  # sampled bursts are on: top-p is what keeps this batch out
        assert engine.burst_filtered is None and not engine.runner.burst.filtered
        requests = make_requests(batch, "g", greedy(12)) + [
            GenerateRequest("t", tuple(batch[0]), SamplingParams(max_new_tokens=40, temperature=0.8, top_p=0.9,
                                                                 seed=3))]
        out = run(engine, requests)
        before = engine.runner.burst.bursts
        skipped = dict(engine.burst.skipped)
        info = engine.live_stats()["speculative"]["bursts"]
    finally:
        cluster.stop(engine)
    assert [out[f"g-{i}"][0] for i in range(len(batch))] == expected
    assert len(out["t"][0]) == 40
    assert before == 0  # the filtering request is in every batch, from the first step to the last
    assert skipped.get("sampled", 0) > 0 and info["skipped_steps"] == skipped and info["iterations"] == 0
    assert info["sampled"]["bursts"] == 0 and "filtered" not in info


@pytest.mark.parametrize("sampled_bursts,filtered_bursts,top_p,keeps", [
    ("1", "1", 1.0, True), ("0", "1", 1.0, False), ("1", "1", 0.9, True), ("1", "0", 0.9, False)])
def test_a_small_all_sampled_batch_keeps_its_context_for_sampled_bursts(dspark_files, bursts, monkeypatch,
                                                                       sampled_bursts, filtered_bursts, top_p, keeps):
    """After the planner's stepped-aside streak a small batch whose every row samples at T > 0
    keeps writing the draft context where a sampled burst can take it (rows at a temperature
    alone, or with top-p where filtered bursts are on), and skips it where none can (sampled
    bursts off, or a row that filters with top-p and filtered bursts off)."""
    from types import SimpleNamespace

    from sglaunch.engine.request import ReqStatus

    monkeypatch.setenv("SGLAUNCH_DSPARK_SAMPLED_BURST", sampled_bursts)
    monkeypatch.setenv("SGLAUNCH_DSPARK_FILTERED_BURST", filtered_bursts)
    engine, cluster = create_engine(engine_config(dspark_files["target"], dspark_files["oracle"], "static"))
    try:
        params = SamplingParams(max_new_tokens=20, temperature=0.8, top_p=top_p)
        chunks = [SimpleNamespace(req=SimpleNamespace(sampling=params, context_gap=False, status=ReqStatus.RUNNING))
                  for _ in range(3)]
        engine.scheduler.gapless.extend(c.req for c in chunks)  # running requests that may still draft
        engine._aside_streak = engine.context_skip_streak
        assert len(chunks) < engine.context_skip_min_batch and engine.context_skip
        kept = engine._draft_context(chunks, False, SimpleNamespace(num_tokens=3, batch_size=3))
        skipped = engine.context_skipped_steps
    finally:
        cluster.stop(engine)
    assert kept is keeps and skipped == (0 if keeps else 1)
    assert all(c.req.context_gap is not keeps for c in chunks)  # a skip gives every running request its gap


def test_a_step_whose_every_request_has_a_context_gap_writes_no_context(dspark_files):
    """Once no running request can draft again (each has a context gap), a plain step writes no draft
    context and decides nothing more, even for a greedy batch that bursts would otherwise keep it for;
    a step with one request that may still draft decides as before (a greedy batch keeps it)."""
    from types import SimpleNamespace

    from sglaunch.engine.request import ReqStatus

    engine, cluster = create_engine(engine_config(dspark_files["target"], dspark_files["oracle"], "static"))
    try:
        greedy_params = SamplingParams(max_new_tokens=20, temperature=0.0)
        reqs = [SimpleNamespace(sampling=greedy_params, context_gap=True, status=ReqStatus.RUNNING) for _ in range(3)]
        chunks = [SimpleNamespace(req=r) for r in reqs]
        engine.scheduler.gapless.extend(reqs)
        engine._aside_streak = engine.context_skip_streak
        step = SimpleNamespace(num_tokens=3, batch_size=3)
        assert engine._draft_context(chunks, False, step) is False and engine.context_skipped_steps == 1
        reqs[0].context_gap = False  # one may draft again: the usual rule, which keeps a greedy batch's context
        engine.scheduler.gapless.append(reqs[0])
        assert engine._draft_context(chunks, False, step) is True and engine.context_skipped_steps == 1
        assert engine._draft_context(chunks, True, step) is True  # a drafting step always writes it
    finally:
        cluster.stop(engine)


def sampled_run(config, batch, temperatures, max_new_tokens: int, filters=({},)):
    """Seeded requests at `temperatures` (in turn) with `filters` (in turn: top_k / top_p / min_p
    settings) -> (per request (tokens, logprobs), live stats)."""
    engine, cluster = create_engine(config)
    try:
        requests = [GenerateRequest(f"r{i}", tuple(p), SamplingParams(
            max_new_tokens=max_new_tokens, temperature=temperatures[i % len(temperatures)], seed=100 + i,
            ignore_eos=True, **filters[i % len(filters)])) for i, p in enumerate(batch)]
        out = run(engine, requests)
        return [out[f"r{i}"][:2] for i in range(len(batch))], engine.live_stats()["speculative"]
    finally:
        cluster.stop(engine)


@pytest.mark.parametrize("drafter,temperatures", [("oracle", (0.9,)), ("random", (0.0, 1.0))])
def test_sampled_bursts_draw_as_drafting_steps_do(dspark_files, monkeypatch, drafter, temperatures):
    """A sampled burst (rows at a temperature alone, greedy rows beside them) is the static drafting
    step, iteration after iteration: the same uniforms from each request's generator (2 * gamma + 1 an
    iteration, in the same layout), the same draws, tests and correction / bonus draws, so a seeded
    request gives the same tokens and log-probabilities as without bursts (with every step drafting),
    up to its last window, which the usual step caps at the length limit and a burst does not. The
    usual step's output is the target's own sampling distribution (tests/speculative); greedy rows
    equal plain decoding throughout."""
    monkeypatch.setenv("SGLAUNCH_DSPARK_STEP_ASIDE", "0")
    batch, new = prompts(4, seed=7), 30
    config = engine_config(dspark_files["target"], dspark_files[drafter], "static")
    monkeypatch.setenv(BURST_ENV, "0")
    steps, _ = sampled_run(config, batch, temperatures, new)
    monkeypatch.setenv(BURST_ENV, "3")
    bursts, stats = sampled_run(config, batch, temperatures, new)
    assert stats["bursts"]["sampled"]["bursts"] > 0 and stats["bursts"]["sampled"]["iterations"] >= 2
    cut = new - (GAMMA + 1)
    for (tokens, lps), (want, want_lps) in zip(bursts, steps):
        assert len(tokens) == new and tokens[:cut] == want[:cut]
        torch.testing.assert_close(torch.tensor(lps[:cut]), torch.tensor(want_lps[:cut]), atol=1e-4, rtol=0)
    if 0.0 in temperatures:  # the greedy rows of the mixed batches: plain decoding's tokens
        plain = generate_batch(engine_config(dspark_files["target"]), batch[::2], greedy(new))
        assert [tokens for tokens, _ in bursts[::2]] == plain


@pytest.mark.parametrize("drafter,temperatures,filters,kernel", [
    ("oracle", (0.9,), ({"top_p": 0.8}, {"top_k": 5}, {"min_p": 0.05}, {}), False),
    ("random", (0.0, 1.0, 1.2, 0.7), ({"top_p": 0.9, "top_k": 40, "min_p": 0.02},), False),
    ("oracle", (0.9,), ({"top_p": 0.8}, {"top_k": 5}, {"min_p": 0.05}, {}), True)])
def test_filtered_bursts_draw_as_drafting_steps_do(dspark_files, monkeypatch, drafter, temperatures, filters, kernel):
    """A filtered sampled burst (rows with top-k, top-p or min-p, beside temperature-only and greedy
    rows) is the static drafting step, iteration after iteration: the target's distributions
    filtered as the usual step filters them (sampler.sorted_filter), the drafter's draws at the
    temperature alone, the same uniforms, so a seeded request gives the same tokens and
    log-probabilities as without bursts, up to its last window; and every filtered row's tokens
    stay inside what its filter keeps (top-k 5: among the 5 most likely at that temperature).
    kernel: the threshold kernel of SGLAUNCH_FILTER_KERNEL=1 (Triton's interpreter) in both paths."""
    monkeypatch.setenv("SGLAUNCH_DSPARK_STEP_ASIDE", "0")
    batch, new = prompts(4, seed=11), 30
    if kernel:  # NOTE: the filter kernel alone in the interpreter (the other kernels: references), 1 request
        import sglaunch.engine.sampler as sampler
        import sglaunch.kernels.filter_rows as rows

        monkeypatch.setattr(sampler, "filter_kernel", lambda device: True)
        monkeypatch.setattr(rows, "use_triton", lambda device: True)
        calls = []
        original = rows._filter_kernel
        monkeypatch.setattr(rows, "_filter_kernel", _Counted(original, calls))
        batch, new = batch[:1], 14
    config = engine_config(dspark_files["target"], dspark_files[drafter], "static")
    monkeypatch.setenv(BURST_ENV, "0")
    steps, _ = sampled_run(config, batch, temperatures, new, filters)
    monkeypatch.setenv(BURST_ENV, "3")
    bursts, stats = sampled_run(config, batch, temperatures, new, filters)
    assert stats["bursts"]["filtered"]["bursts"] > 0 and stats["bursts"]["filtered"]["iterations"] >= 2
    assert stats["bursts"]["sampled"]["bursts"] == 0  # a filtering row in every batch: the filtered key
    if kernel:
        assert calls  # the kernel filtered (the static steps' rows and the bursts')
    cut = new - (GAMMA + 1)
    for (tokens, lps), (want, want_lps) in zip(bursts, steps):
        assert len(tokens) == new and tokens[:cut] == want[:cut]
        torch.testing.assert_close(torch.tensor(lps[:cut]), torch.tensor(want_lps[:cut]), atol=1e-4, rtol=0)
    if drafter == "oracle" and not kernel:  # request 1 samples with top-k 5: each token among its row's 5 most likely
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(dspark_files["target"], torch_dtype=torch.float32).eval()
        ids = list(batch[1]) + bursts[1][0]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, len(batch[1]) - 1: -1]
        top5 = logits.topk(5, dim=-1).indices
        assert all(t in row for t, row in zip(bursts[1][0], top5.tolist()))


class _Counted:
    """A Triton kernel's launcher (kernel[grid](...)) that counts its launches."""

    def __init__(self, kernel, calls: list):
        self.kernel, self.calls = kernel, calls

    def __getitem__(self, grid):
        self.calls.append(grid)
        return self.kernel[grid]


def test_filtered_bursts_that_leave_one_token_are_greedy(dspark_files, bursts):
    """Rows at T = 0.9 whose filter leaves one token (top-k 1, min-p 1, top-p 1e-6) burst through the
    filtered keys with drafts drawn at T = 0.9, and commit plain greedy decoding's tokens (the GPU
    test's criterion, tests/gpu/test_cuda_graph_gpu.py)."""
    batch, new = prompts(3, seed=12), 20
    one_left = ({"top_k": 1}, {"min_p": 1.0}, {"top_p": 1e-6})
    out, stats = sampled_run(engine_config(dspark_files["target"], dspark_files["random"], "static"), batch, (0.9,),
                             new, one_left)
    assert stats["bursts"]["filtered"]["bursts"] > 0
    assert [tokens for tokens, _ in out] == generate_batch(engine_config(dspark_files["target"]), batch, greedy(new))


@pytest.mark.parametrize("requests,bursts_expected", [(2, True), (3, False)])
def test_sampled_bursts_take_small_batches_only(dspark_files, bursts, monkeypatch, requests, bursts_expected):
    """A batch of more than SAMPLED_MAX_BATCH requests with a sampled row takes the usual steps (here
    the limit is 2); at or under it, it bursts."""
    from sglaunch.speculative import burst as burst_module

    monkeypatch.setattr(burst_module, "SAMPLED_MAX_BATCH", 2)
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "static")
    out, stats = sampled_run(config, prompts(requests, seed=7), (0.9,), 12)
    assert all(len(tokens) == 12 for tokens, _ in out)
    assert (stats["bursts"]["sampled"]["bursts"] > 0) is bursts_expected, stats["bursts"]
    assert (stats["bursts"]["skipped_steps"].get("sampled", 0) > 0) is not bursts_expected


@pytest.mark.parametrize("overlap", ["0", "1"])
def test_sampled_bursts_with_stops_and_preemption_lose_nothing(dspark_files, bursts, monkeypatch, overlap):
    """Seeded sampled requests (and a greedy one) with stop tokens, chunked prefill and a KV pool
    tight enough to preempt, overlap off and on: sampled bursts run, every request ends by its stop
    token or its length with nothing past a stop, no page stays reserved, and a second run gives the
    same tokens."""
    monkeypatch.setenv("SGLAUNCH_OVERLAP", overlap)
    batch = prompts(6, seed=4, lengths=(9, 30, 17, 45))
    stops = (3, 17, 99)
    params = [SamplingParams(max_new_tokens=24, temperature=0.0 if i == 0 else 0.9, seed=40 + i,
                             stop_token_ids=stops) for i in range(len(batch))]
    tight = dict(page_size=2, max_total_tokens=112, chunked_prefill_size=8)
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "static", **tight)
    runs = []
    for _ in range(2):
        engine, cluster = create_engine(config)
        try:
            requests = [GenerateRequest(f"q{i}", tuple(p), q) for i, (p, q) in enumerate(zip(batch, params))]
            out = run(engine, requests)
            stats = engine.live_stats()["speculative"]["bursts"]
            assert engine.allocator.num_used == engine.scheduler.radix.cached_pages
            preemptions = engine.scheduler.num_preemptions
        finally:
            cluster.stop(engine)
        runs.append([out[f"q{i}"] for i in range(len(batch))])
    assert stats["sampled"]["bursts"] > 0 and preemptions > 0
    for tokens, lps, reason in runs[0]:
        assert len(tokens) == len(lps) and 0 < len(tokens) <= 24
        assert (reason == "stop") is (tokens[-1] in stops) and not set(tokens[:-1]) & set(stops)
        assert reason in ("stop", "length") and (reason == "stop" or len(tokens) == 24)
    assert [r[0] for r in runs[0]] == [r[0] for r in runs[1]]


def test_sampled_bursts_can_be_turned_off(dspark_files, bursts, monkeypatch):
    """SGLAUNCH_DSPARK_SAMPLED_BURST=0: no sampled iteration is built, and a batch with a row at
    T > 0 takes the usual steps."""
    monkeypatch.setenv("SGLAUNCH_DSPARK_SAMPLED_BURST", "0")
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "static")
    out, stats = sampled_run(config, prompts(2, seed=7), (0.9,), 12)
    assert all(len(tokens) == 12 for tokens, _ in out)
    assert stats["bursts"]["bursts"] == 0 and stats["bursts"]["skipped_steps"].get("sampled", 0) > 0
    assert "sampled" not in stats["bursts"]


def test_runner_burst_matches_greedy_chain(dspark_files, bursts):
    """One burst straight on the runner: every iteration's committed tokens are the target's greedy
    continuation, n accepted drafts + 1 per iteration, and the next anchor is the last of them."""
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "static", page_size=1)
    prompt = prompts(1, seed=11, lengths=(10,))[0]
    plain = generate_batch(engine_config(dspark_files["target"], page_size=1), [prompt], greedy(40))[0]
    engine, cluster = create_engine(config)
    try:
        engine.add_request(GenerateRequest("x", tuple(prompt), greedy(40)))
        first = engine.step()  # the prefill (no burst: not a decode)
        assert engine.runner.burst.bursts == 0 and len(first[0].new_token_ids) == 1
        req = engine.requests["x"]
        assert engine.scheduler.reserve_burst([_chunk(req)], 3 * (GAMMA + 1) - 1)
        result = engine.runner.run_burst(BurstInput([req.token_ids[-1]], [len(req.token_ids) - 1], [req.pages], 3))
    finally:
        cluster.stop(engine)
    tokens, _ = result.request_tokens(0)
    assert len(tokens) == sum(n[0] + 1 for n in result.accepted) == len(result.logprobs[0])
    assert tokens == plain[1: 1 + len(tokens)]


def test_a_cached_prompts_first_token_takes_no_burst(dspark_files, bursts):
    """A prompt the radix cache holds whole is scheduled as one decode-like row; its first token
    comes from a usual step, not after a whole burst (later steps burst), and the tokens are plain."""
    prompt = prompts(1, seed=11, lengths=(10,))[0]
    plain = generate_batch(engine_config(dspark_files["target"]), [prompt], greedy(20))[0]
    engine, cluster = create_engine(engine_config(dspark_files["target"], dspark_files["oracle"], "static"))
    try:
        first = run(engine, [GenerateRequest("a", tuple(prompt), greedy(20))])
        assert engine.runner.burst.bursts > 0
        before, skipped = engine.runner.burst.bursts, engine.burst.skipped["first token"]
        engine.add_request(GenerateRequest("b", tuple(prompt), greedy(20)))
        out = engine.step()
        assert engine.scheduler.radix.cached_pages > 0
        assert [o.new_token_ids for o in out] == [(plain[0],)] and engine.runner.burst.bursts == before
        assert engine.burst.skipped["first token"] == skipped + 1
        second = list(out[0].new_token_ids)
        while engine.has_work:
            second += [t for o in engine.step() for t in o.new_token_ids]
        assert engine.runner.burst.bursts > before
    finally:
        cluster.stop(engine)
    assert first["a"][0] == plain and second == plain


def test_a_burst_queued_a_few_iterations_at_a_time_runs_the_same(dspark_files, bursts):
    """BurstRunner.launch(queue=1) + extend + close: the same rows as the burst queued at once, and
    close ends a burst where it is (iterations = those queued)."""
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "static", page_size=1)
    prompt = prompts(1, seed=11, lengths=(10,))[0]
    engine, cluster = create_engine(config)
    try:
        engine.add_request(GenerateRequest("x", tuple(prompt), greedy(40)))
        engine.step()
        req = engine.requests["x"]
        assert engine.scheduler.reserve_burst([_chunk(req)], 3 * (GAMMA + 1) - 1)
        runner = engine.runner.burst

        def burst():
            return BurstInput([req.token_ids[-1]], [len(req.token_ids) - 1], [req.pages], 3)

        whole = runner.read(runner.launch(burst()))
        pending = runner.launch(burst(), queue=1)
        assert pending.queued == 1 and not pending.closed and runner.iterations_done(pending) == 1
        runner.extend(pending)
        runner.extend(pending)
        with pytest.raises(ValueError):
            runner.extend(pending)  # all 3 queued
        stepwise = runner.read(pending)
        short = runner.launch(burst(), queue=2)
        runner.close(short)
        cut = runner.read(short)
    finally:
        cluster.stop(engine)
    assert stepwise.accepted == whole.accepted and stepwise.tokens == whole.tokens
    assert short.iterations == 2 and cut.accepted == whole.accepted[:2]
    assert cut.tokens[0] == whole.tokens[0][: len(cut.tokens[0])]


@pytest.mark.parametrize("how", ["channel", "scheduler"])
def test_bursts_end_early_for_an_arrival(dspark_files, baselines, bursts, monkeypatch, how):
    """SGLAUNCH_DSPARK_BURST_EARLY_STOP=1: a burst is queued LEAD iterations ahead and ends as soon
    as a command waits unread (channel) or a request was added since its launch (scheduler), when
    stop_pays (always without a profile); every output stays plain greedy, nothing stays reserved,
    and the request that arrived is served as if alone."""
    from sglaunch.speculative.burst import EARLY_STOP_ENV, LEAD

    monkeypatch.setenv(EARLY_STOP_ENV, "1")
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "static", page_size=4)
    engine, cluster = create_engine(config)
    try:
        assert engine.burst_early_stop and engine.runner.burst.max_iterations > LEAD
        if how == "channel":
            engine.input_waiting = lambda: True
            results = [run(engine, make_requests(b, f"b{n}")) for n, b in enumerate(BATCHES)]
            assert tokens_of(results) == tokens_of(baselines[4])
        else:  # a request added while a (chained) burst is in flight
            batch = BATCHES[-1]
            requests = make_requests(batch, "a", greedy(60))  # NOTE: long enough for full bursts
            for r in requests:
                engine.add_request(r)
            late = make_requests(BATCHES[0][:1], "late", greedy(20))[0]
            got = {r.rid: [] for r in requests + [late]}
            while engine.has_work:
                for o in engine.step():
                    got[o.rid] += o.new_token_ids
                if late.rid not in engine.requests and engine._burst_in_flight is not None \
                        and len(got[late.rid]) == 0:
                    engine.add_request(late)
            alone = generate_batch(engine_config(dspark_files["target"], page_size=4),
                                   [list(late.input_ids)], late.sampling)[0]
            assert got[late.rid] == alone
        stats = engine.live_stats()["speculative"]["bursts"]
        stopped, planned_cut = engine.burst.stopped, engine.burst.stopped_iterations
        assert engine.allocator.num_used == engine.scheduler.radix.cached_pages
    finally:
        cluster.stop(engine)
    assert stopped > 0 and planned_cut > 0 and stats["stopped_early"] == stopped


def test_stop_pays_weighs_the_fixed_cost():
    policy = BurstPolicy(gamma=7, max_iterations=8, costs={1: 1.4e-3, 8: 1.6e-3}, fixed={1: 0.2e-3, 8: 0.8e-3})
    # one request: (1 + 1) x 0.2 / 1.4 = 0.29 iterations: ending it pays for any remaining one
    assert policy.stop_pays(1, 1)
    # eight: 9 x 0.8 / 1.6 = 4.5 iterations: only a burst with more left than that ends
    assert not policy.stop_pays(8, 4) and policy.stop_pays(8, 5)
    assert not policy.stop_pays(1, 0)
    assert BurstPolicy(7, 8).stop_pays(32, 1)  # no profile (CPU, static): always


def _chunk(req):
    from sglaunch.engine.scheduler import Chunk

    return Chunk(req, len(req.token_ids) - 1, len(req.token_ids))


def test_burst_rows_parse_like_the_iteration_loop():
    """BurstResult.from_rows (array work) against a loop over iterations and requests."""
    import numpy as np

    from sglaunch.speculative.burst import BurstResult

    rng = np.random.default_rng(0)
    N, R, Q = 5, 7, GAMMA + 1
    rows = np.zeros((N, R, 2 * Q + 2))
    rows[:, :, :Q] = rng.integers(0, 50_000, size=(N, R, Q))
    rows[:, :, Q: 2 * Q] = -rng.random((N, R, Q))
    rows[:, :, 2 * Q] = rng.integers(0, Q, size=(N, R))
    assert BurstResult.from_rows(rows, GAMMA).second_won is None  # no second chain won (or ran)
    rows[:, :, 2 * Q + 1] = rng.integers(0, 2, size=(N, R))
    result = BurstResult.from_rows(rows, GAMMA)
    assert result.second_won == (rows[:, :, 2 * Q + 1] > 0).tolist()
    for r in range(R):
        tokens, lps = [], []
        for k in range(N):
            n = int(rows[k, r, 2 * Q])
            tokens += [int(t) for t in rows[k, r, : n + 1]]
            lps += list(rows[k, r, Q: Q + n + 1])
        assert result.request_tokens(r) == (tokens, lps)
    assert result.accepted == rows[:, :, 2 * Q].astype(int).tolist()


@pytest.mark.parametrize("chain,early", [("1", "0"), ("0", "0"), ("1", "1")])
def test_chained_bursts_are_lossless(dspark_files, baselines, bursts, monkeypatch, chain, early):
    """SGLAUNCH_DSPARK_BURST_CHAIN=1 (the default): the batch's next burst is launched before the
    host finishes this one (LLMEngine._collect_burst), and step() finishes it; 0: never. Same
    tokens either way, no page left reserved, and a request aborted while its burst is in flight
    gets nothing after its abort; also with SGLAUNCH_DSPARK_BURST_EARLY_STOP=1, where the burst in
    flight is queued a few iterations at a time (nothing arrives here, so none ends early)."""
    from sglaunch.speculative.burst import CHAIN_ENV, EARLY_STOP_ENV

    monkeypatch.setenv(CHAIN_ENV, chain)
    monkeypatch.setenv(EARLY_STOP_ENV, early)
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "static", page_size=4)
    engine, cluster = create_engine(config)
    try:
        assert engine.burst_early_stop is (early == "1")
        results = [run(engine, make_requests(b, f"b{n}")) for n, b in enumerate(BATCHES)]
        chained = engine.burst.chained
        assert engine.live_stats()["speculative"]["bursts"]["chained"] == chained
        assert engine.allocator.num_used == engine.scheduler.radix.cached_pages
        # an abort while a burst is in flight
        batch = BATCHES[-1]
        requests = make_requests(batch, "a")
        for r in requests:
            engine.add_request(r)
        got = {r.rid: [] for r in requests}
        aborted = None
        while engine.has_work:
            for o in engine.step():
                got[o.rid] += o.new_token_ids
            if aborted is None and engine._burst_in_flight is not None:
                aborted = max((c.req for c in engine._burst_in_flight.chunks),
                              key=lambda req: req.sampling.max_new_tokens).rid
                last = engine.abort(aborted)
                assert last.finished and last.finish_reason == "abort"
                size = len(got[aborted])
        assert engine.allocator.num_used == engine.scheduler.radix.cached_pages
    finally:
        cluster.stop(engine)
    assert tokens_of(results) == tokens_of(baselines[4])
    if chain == "1":
        assert chained > 0 and aborted is not None
        assert len(got[aborted]) == size  # nothing after the abort
        for r in requests:
            if r.rid != aborted:
                assert got[r.rid] == results[-1][r.rid.replace("a-", "b%d-" % (len(BATCHES) - 1))][0]
    else:
        assert chained == 0 and aborted is None


def test_no_burst_is_chained_past_an_unread_arrival(dspark_files, baselines, bursts):
    """input_waiting (the engine process's channel has a command unread): the next burst is not
    launched ahead, so an arrival is admitted at the next step, not after one more burst."""
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "static", page_size=4)
    engine, cluster = create_engine(config)
    polls = []
    try:
        engine.input_waiting = lambda: polls.append(1) or True
        results = [run(engine, make_requests(b, f"b{n}")) for n, b in enumerate(BATCHES)]
        assert engine.burst.bursts > 0 and engine.burst.chained == 0 and polls
    finally:
        cluster.stop(engine)
    assert tokens_of(results) == tokens_of(baselines[4])


def test_steps_that_skip_the_draft_context(dspark_files, baselines, monkeypatch):
    """SGLAUNCH_DSPARK_SKIP_CONTEXT: after the planner has stepped aside context_skip_streak times
    in a row, a plain decode step of at least context_skip_min_batch requests writes no draft
    context; its requests never draft again (no chunk of theirs gets a lookahead), requests that
    come later draft as before, and every output stays plain greedy (unset: the default, on). With
    0, no step skips."""
    import itertools

    for value in ("0", ""):
        monkeypatch.setenv("SGLAUNCH_DSPARK_SKIP_CONTEXT", value)
        config = engine_config(dspark_files["target"], dspark_files["oracle"], "compact", sps=dspark_files["sps"],
                               page_size=4)
        engine, cluster = create_engine(config)
        try:
            assert engine.context_skip is (value != "0")
            engine.context_skip_min_batch, engine.context_skip_streak = 2, 2
            planner = engine.spec.planner
            # the first 4 decisions step aside (the second batch gets its gaps), then every step
            # drafts (the planner's own budget)
            turns = itertools.chain([False] * 4, itertools.repeat(True))
            planner.plan_drafts = lambda rids, extra=0, committed=0, sampled=False, chains=False: (
                planner.budget(rids, extra, committed) if next(turns) else None)
            real_decide = engine._decide

            def decide(chunks, candidates):
                assert not any(c.req.context_gap for c in candidates)
                return real_decide(chunks, candidates)

            engine._decide = decide
            results = [run(engine, make_requests(b, f"b{n}")) for n, b in enumerate(BATCHES)]
            skipped, drafted = engine.context_skipped_steps, engine.spec.stats.to_dict()["steps"]
            info = engine.live_stats()["speculative"]
        finally:
            cluster.stop(engine)
        assert tokens_of(results) == tokens_of(baselines[4])
        assert info["context_skipped_steps"] == skipped
        if value != "0":
            assert skipped > 0 and drafted > 0  # gaps in the first batches, drafting in the last
        else:
            assert skipped == 0 and drafted > 0, drafted


def test_iterations_from_env(monkeypatch):
    monkeypatch.delenv(BURST_ENV, raising=False)
    assert iterations_from_env("cpu", False) == 0
    assert iterations_from_env("cuda", True) == 8
    assert iterations_from_env("cuda", False) == 0
    monkeypatch.setenv(BURST_ENV, "6")
    assert iterations_from_env("cpu", False) == 6
    monkeypatch.setenv(BURST_ENV, "0")
    assert iterations_from_env("cuda", True) == 0
    monkeypatch.setenv(BURST_ENV, "many")
    with pytest.raises(ValueError, match="SGLAUNCH_DSPARK_BURST"):
        iterations_from_env("cuda", True)


def test_early_stop_from_env(monkeypatch):
    """On by default on a GPU (session 16: 1.05x at 2 and 4 requests over HTTP), off on a CPU."""
    from sglaunch.speculative.burst import EARLY_STOP_ENV, early_stop_from_env

    monkeypatch.delenv(EARLY_STOP_ENV, raising=False)
    assert early_stop_from_env("cuda") and not early_stop_from_env("cpu")
    monkeypatch.setenv(EARLY_STOP_ENV, "0")
    assert not early_stop_from_env("cuda")
    monkeypatch.setenv(EARLY_STOP_ENV, "1")
    assert early_stop_from_env("cpu")
    monkeypatch.setenv(EARLY_STOP_ENV, "yes")
    with pytest.raises(ValueError, match=EARLY_STOP_ENV):
        early_stop_from_env("cuda")


def test_policy_prices_bursts_against_plain():
    policy = BurstPolicy(gamma=7, max_iterations=4, costs={1: 1.6e-3, 8: 2.0e-3, 32: 4.0e-3})
    assert policy.burst_seconds(4, 1) == pytest.approx(1.6e-3 + (2.0e-3 - 1.6e-3) * 3 / 7)
    assert policy.burst_seconds(64, 1) == pytest.approx(8.0e-3)
    # accept 2.2 in 1.6 ms against one token per 1.0 ms: pays; at 32 requests (4 ms vs 1.3 ms) it does not
    policy.accept = 2.2
    assert policy.worth(1, 1.0e-3, prior=8.0)
    assert not policy.worth(32, 1.3e-3, prior=8.0)
    assert policy.accept > 2.2  # declining drifts the estimate back toward the prior
    assert BurstPolicy(7, 4).worth(64, 1e-3, prior=1.0)  # no profile: no basis to decline
    # a burst's fixed cost is paid once: one iteration does not pay where four do
    fixed = BurstPolicy(gamma=7, max_iterations=4, costs={1: 1.6e-3}, fixed={1: 1.5e-3}, accept=2.2)
    assert fixed.burst_seconds(1, 4) == pytest.approx(1.5e-3 + 4 * 1.6e-3)
    assert not fixed.worth(1, 1.0e-3, prior=8.0, iterations=1)
    assert fixed.worth(1, 1.0e-3, prior=8.0, iterations=4)


def test_a_high_plain_scale_cannot_carry_a_burst_of_rejected_drafts():
    """Session 22 (H100, random target weights): accept 1.00, a plain scale learned at 1.26-1.38
    and never corrected while the batch burst; bursts at 1.35 ms a token against plain's 0.99 made
    DSpark 0.82x of plain at c=1. A plain scale over 1 is not counted; one under 1 still is."""
    policy = BurstPolicy(gamma=7, max_iterations=8, costs={1: 1.44e-3}, fixed={1: 0.19e-3}, accept=1.0)
    plain = 1.2e-3  # the profile's plain decode step at 1 request
    assert policy.worth(1, plain * 1.38, prior=1.0, iterations=8)  # what the scale used to buy
    assert not policy.worth(1, plain, prior=1.0, iterations=8, plain_scale=1.38)
    policy.accept = 2.6  # a drafter that is accepted still bursts at the same costs
    assert policy.worth(1, plain, prior=2.6, iterations=8, plain_scale=1.38)
    assert policy.worth(1, plain, prior=2.6, iterations=8, plain_scale=0.9)
    # a scale under 1 (plain measured cheaper than profiled) still counts once a burst has been timed
    policy.accept, policy.timed = 1.6, 1
    assert not policy.worth(1, plain, prior=1.6, iterations=8, plain_scale=0.5)
    assert policy.worth(1, plain, prior=1.6, iterations=8, plain_scale=1.0)


def test_an_untimed_burst_is_priced_with_plains_measured_skew():
    """Session 44 (H100, T=0.7, c=8, HTTP round 1): the first server on a fresh machine profiled its
    steps slow; the sampled plain steps then measured 0.73 of the profile, no burst had been timed to
    correct its own price, so every burst was declined (347), the declined streak skipped the draft
    context, and the round served 0.943 of plain. Until a burst is timed, plain's scale under 1 is
    its scale too; a burst's own timing then takes over, and a scale over 1 never lends itself."""
    plain = 1.3e-3  # profiled plain step at 8 requests
    policy = BurstPolicy(gamma=7, max_iterations=8, costs={8: 2.2e-3}, fixed={8: 0.5e-3}, accept=2.0)
    assert policy.worth(8, plain, prior=2.0, iterations=8)  # at profile prices: 7.1 tokens a ms against 6.2
    assert policy.worth(8, plain, prior=2.0, iterations=8, plain_scale=0.73)  # the same skew on both sides
    assert policy.declined == 0 and policy.scale == pytest.approx(0.73)
    assert policy.worth(8, plain, prior=2.0, iterations=8, plain_scale=1.4)
    assert policy.scale == 1.0  # a plain scale over 1 is not lent to the burst
    # a burst timed at the profile's price: its own scale (1.0, as timed) now stands against plain's 0.73
    policy.scale = 0.73
    modelled = policy.burst_seconds(8, 8) / policy.scale
    policy.observe([[1] * 8] * 8, seconds=modelled, requests=8)
    assert policy.timed == 1 and policy.scale == pytest.approx(0.9 * 0.73 + 0.1)
    policy.scale, policy.accept = 1.0, 2.0
    assert not policy.worth(8, plain, prior=2.0, iterations=8, plain_scale=0.73)
    assert policy.declined == 1


@pytest.mark.parametrize("streak", [6, 10**9])
def test_declined_bursts_let_a_small_batch_skip_the_draft_context(dspark_files, bursts, tmp_path, streak):
    """Session 22 (H100, random target weights): a drafter priced at 1.3 by its own confidences,
    so not failing by the confidence check, stepped aside on nearly every step at c=1 and c=8 and
    declined every burst, yet each step still wrote its context (0.92x and 0.95x of plain). Here
    drafting never pays by the table and no burst pays by its costs: once bursts have been declined
    burst_declined_streak steps in a row, stepped-aside steps of 3 requests (fewer than a burst
    takes) skip the context; out of reach (10**9), none does. Output is plain greedy either way."""
    from test_engine_dspark import greedy
    from test_step_aside import assert_plain, plain_then_dear

    batch = prompts(3, seed=22)
    requests = [GenerateRequest(f"s-{i}", tuple(p), greedy(60)) for i, p in enumerate(batch)]
    plain, engine, cluster = plain_then_dear(dspark_files, tmp_path, requests)
    try:
        assert engine.burst is not None and len(batch) < engine.context_skip_min_batch
        engine.spec.planner.calibration = None  # the table's costs as they are (see test_step_aside)
        engine.burst.costs, engine.burst.fixed = {1: 1.0, 32: 1.0}, {1: 1.0, 32: 1.0}  # a burst never pays
        engine.context_skip_streak, engine.burst_declined_streak = 2, streak
        out = run(engine, requests)
        failing, skipped = engine.spec.planner.drafter_failing(), engine.context_skipped_steps
        declined, bursts = engine.burst.skipped["not worth"], engine.burst.bursts
    finally:
        cluster.stop(engine)
    assert_plain(out, plain)
    assert not failing and bursts == 0 and declined >= 6  # the oracle drafter: only the bursts decline
    assert (skipped > 0) is (streak == 6), (skipped, declined)


def test_wide_batches_burst_fewer_iterations(monkeypatch):
    from sglaunch.speculative.burst import WIDE_BATCH, wide_cap_from_env

    monkeypatch.delenv(BURST_ENV, raising=False)
    policy = BurstPolicy(gamma=7, max_iterations=8, wide_cap=wide_cap_from_env())
    assert policy.iterations([100] * WIDE_BATCH, [1000] * WIDE_BATCH, prior=3.0) == 8
    assert policy.iterations([100] * (WIDE_BATCH + 1), [1000] * (WIDE_BATCH + 1), prior=3.0) == 4
    monkeypatch.setenv(BURST_ENV, "8")  # a number: that many for every batch
    assert wide_cap_from_env() is None


def test_policy_iterations_and_observation():
    policy = BurstPolicy(gamma=7, max_iterations=4, costs={2: 1e-3})
    assert policy.iterations([100, 100], [1000, 1000], prior=8.0) == 4
    assert policy.iterations([100, 100], [1000, 17], prior=8.0) == 2  # 17 positions: two windows of 8
    assert policy.iterations([100, 3], [1000, 1000], prior=8.0) == 4  # one nearly done stops inside the burst
    assert policy.iterations([9, 3], [1000, 1000], prior=4.0) == 3  # none needs more than 3 iterations
    assert policy.iterations([100], [5], prior=8.0) == 0
    policy.observe([[1, 3], [2, 2]], seconds=4e-3, requests=2)
    assert policy.accept == pytest.approx(3.0)
    assert policy.scale == pytest.approx(0.9 + 0.1 * 2.0)


def test_slot_rows_layout():
    from array import array

    rows = slot_rows([array("i", [5, 2]), [7]], [6, 2], page_size=4, width=8, fill=99)
    assert rows.tolist() == [[20, 21, 22, 23, 8, 9, 99, 99], [28, 29, 99, 99, 99, 99, 99, 99]]


@pytest.mark.parametrize("seed", range(40))
def test_slot_rows_match_a_position_by_position_reference(seed):
    """Random page tables (array('i') and lists, empty and past the width), page sizes 1-16."""
    import random
    from array import array

    rng = random.Random(seed)
    page_size, width, fill = rng.choice([1, 2, 4, 16]), rng.choice([8, 64, 256]), 12345
    tables, lengths = [], []
    for _ in range(rng.randrange(0, 9)):
        n = rng.choice([0, 1, rng.randrange(width + 40)])
        pages = [rng.randrange(10_000) for _ in range(-(-n // page_size) + rng.randrange(3))]
        tables.append(array("i", pages) if rng.random() < 0.5 else pages)
        lengths.append(n)
    expected = [[table[j // page_size] * page_size + j % page_size if j < n else fill for j in range(width)]
                for table, n in zip(tables, lengths)]
    assert slot_rows(tables, lengths, page_size, width, fill).tolist() == (expected or [])


def test_tp2_bursts_match_plain(dspark_files, bursts, monkeypatch):
    """Every rank replays the same burst (the drafter's and the target's collectives inside); a
    burst that could end early is one rank's only (the workers replay a burst as one command)."""
    from sglaunch.speculative.burst import EARLY_STOP_ENV

    monkeypatch.setenv(EARLY_STOP_ENV, "1")
    batch = prompts(6, seed=10)
    expected = generate_batch(engine_config(dspark_files["target"]), batch, greedy(16))
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "static", tp_size=2, page_size=2)
    engine, cluster = create_engine(config)
    try:
        assert not engine.burst_early_stop
        out = run(engine, make_requests(batch, "t", greedy(16)))
        assert engine.runner.burst.bursts > 0
    finally:
        cluster.stop(engine)
    assert [out[f"t-{i}"][0] for i in range(len(batch))] == expected


@pytest.mark.parametrize("temperatures,filters,kind", [
    ((0.9, 0.0), ({},), "sampled"), ((0.9, 0.0, 1.1), ({"top_p": 0.8}, {"top_k": 6}), "filtered")])
def test_tp2_sampled_bursts_draw_as_tp1(dspark_files, monkeypatch, temperatures, filters, kind):
    """TP 2: every rank runs a sampled burst from the same temperatures and uniforms (and, filtered,
    the same top-k / top-p settings: they travel in the burst command), so seeded requests give TP 1's
    tokens (static mode, every step drafting)."""
    monkeypatch.setenv("SGLAUNCH_DSPARK_STEP_ASIDE", "0")
    monkeypatch.setenv(BURST_ENV, "3")
    batch = prompts(4, seed=7)
    one, _ = sampled_run(engine_config(dspark_files["target"], dspark_files["oracle"], "static", page_size=2),
                         batch, temperatures, 20, filters)
    two, stats = sampled_run(engine_config(dspark_files["target"], dspark_files["oracle"], "static", tp_size=2,
                                           page_size=2), batch, temperatures, 20, filters)
    assert stats["bursts"][kind]["bursts"] > 0
    assert [tokens for tokens, _ in two] == [tokens for tokens, _ in one]


def test_compact_profiles_bursts_at_start(dspark_files, bursts):
    """With a step-cost table (compact profiles one at start-up) a burst iteration is timed per
    batch size, so BurstPolicy compares it with the plain step; output stays plain greedy."""
    batch = prompts(3, seed=12)
    expected = generate_batch(engine_config(dspark_files["target"]), batch, greedy(20))
    engine, cluster = create_engine(engine_config(dspark_files["target"], dspark_files["oracle"], "compact"))
    try:
        costs, fixed = engine.burst.costs, engine.burst.fixed
        assert costs and min(costs) == 1 and all(s > 0 for s in costs.values())
        assert set(fixed) == set(costs) and all(s >= 0 for s in fixed.values())
        assert engine.spec.stats.to_dict()["steps"] == 0  # the profile's bursts are not counted
        out = run(engine, make_requests(batch, "c", greedy(20)))
    finally:
        cluster.stop(engine)
    assert [out[f"c-{i}"][0] for i in range(len(batch))] == expected


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2)])
def test_burst_attention_matches_a_reference(heads, kv_heads):
    """Folded query groups, a slot-table gather and the causal-by-position mask against a per-row
    softmax over exactly the keys each query may see (new K/V written first)."""
    from sglaunch.engine.kv_pool import KVPool
    from sglaunch.speculative.burst import BurstAttention

    torch.manual_seed(0)
    B, Q, C, hd, page = 3, 4, 16, 8, 2
    pool = KVPool(1, 40, page, kv_heads, hd, torch.float32, torch.device("cpu"))
    pool.k[0].normal_(), pool.v[0].normal_()
    starts = torch.tensor([0, 5, 9])
    table = torch.stack([torch.randperm(pool.num_slots)[:C] for _ in range(B)])
    positions = (starts[:, None] + torch.arange(Q)[None, :])
    slots = table.gather(1, positions).reshape(-1)
    q = torch.randn(B * Q, heads, hd)
    k, v = torch.randn(B * Q, kv_heads, hd), torch.randn(B * Q, kv_heads, hd)
    attn = BurstAttention(pool, heads, kv_heads, hd)
    attn.bind(table, positions.reshape(-1), slots, Q)
    out = attn.forward(0, q, k, v)
    g = heads // kv_heads
    for b in range(B):
        for i in range(Q):
            row, p = b * Q + i, int(positions[b, i])
            keys, values = pool.k[0][table[b, : p + 1]], pool.v[0][table[b, : p + 1]]  # [p + 1, KV, hd]
            for h in range(heads):
                w = torch.softmax(keys[:, h // g] @ q[row, h] / hd**0.5, dim=0)
                torch.testing.assert_close(out[row, h], w @ values[:, h // g], atol=1e-5, rtol=1e-5)


def test_bursts_with_the_triton_attention_kernel(dspark_files, baselines, bursts, monkeypatch):
    """The burst verify's Triton attention (the GPU default; Triton's interpreter here) in the engine."""
    pytest.importorskip("triton")
    monkeypatch.setenv("SGLAUNCH_DSPARK_KERNELS", "triton")
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "static", page_size=4,
                           disable_radix_cache=True)
    engine, cluster = create_engine(config)
    try:
        assert engine.runner.burst.attn.use_triton
        batch = BATCHES[1]
        out = run(engine, make_requests(batch, "b1"))
        assert engine.runner.burst.bursts > 0
    finally:
        cluster.stop(engine)
    assert {rid: r[0] for rid, r in out.items()} == tokens_of(baselines[4])[1]


def test_bursts_with_overlap_are_lossless(dspark_files, baselines, bursts, monkeypatch):
    """Overlap on (the CUDA default): a plain step in flight is drained and its tokens handed out
    before the burst that follows it; the outputs stay plain greedy and no page is left reserved."""
    import itertools

    monkeypatch.setenv("SGLAUNCH_OVERLAP", "1")
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "compact", sps=dspark_files["sps"],
                           page_size=4)
    engine, cluster = create_engine(config)
    try:
        assert engine.overlap
        # the planner steps aside at every other step (plain, pipelined), and bursts come in
        # between: every third decision says yes
        engine.spec.planner.plan_drafts = lambda rids, extra=0, committed=0, sampled=False, chains=False: None
        turns = itertools.cycle([False, False, True])
        engine.burst.worth = lambda *a, **k: next(turns)
        results = [run(engine, make_requests(b, f"b{n}")) for n, b in enumerate(BATCHES)]
        assert engine.runner.burst.bursts > 0 and engine.overlap_counts["in_flight"] > 0
        assert engine.overlap_counts["drains"] > 0
        assert engine.allocator.num_used == engine.scheduler.radix.cached_pages
    finally:
        cluster.stop(engine)
    assert tokens_of(results) == tokens_of(baselines[4])


def test_the_periodic_log_line_reports_bursts(dspark_files, bursts, caplog, monkeypatch):
    import logging

    from sglaunch.speculative import decoder as decoder_module

    monkeypatch.setattr(decoder_module, "LOG_INTERVAL_S", 0.0)
    engine, cluster = create_engine(engine_config(dspark_files["target"], dspark_files["oracle"], "static"))
    try:
        with caplog.at_level(logging.INFO, logger="sglaunch.speculative.decoder"):
            run(engine, make_requests(prompts(2, seed=13), "l", greedy(20)))
    finally:
        cluster.stop(engine)
    lines = [r.getMessage() for r in caplog.records if "bursts" in r.getMessage()]
    assert lines and "accept estimate" in lines[-1] and "bursts 0 " not in lines[-1]
    assert "steps without one: prefill" in lines[-1]  # the first step of each request is its prefill


def test_fused_greedy_markov_step_gives_the_same_block(dspark_files):
    """The drafter's greedy block with the fused add + argmax kernel (the CUDA default; Triton's
    interpreter here) equals the torch one: same tokens and confidences; a burst's blocks
    (confidence=False, one chain and two) have the same tokens and no confidence logits."""
    pytest.importorskip("triton")
    from sglaunch.speculative.drafter import BlockOutput

    engine, cluster = create_engine(engine_config(dspark_files["target"], dspark_files["random"], "static"))
    try:
        drafter = engine.runner.draft.drafter
        assert drafter.markov_head is not None
        torch.manual_seed(5)
        B, G, c = 3, drafter.config.block_size, drafter.config
        out = BlockOutput(torch.randn(B, G, c.hidden_size, dtype=drafter.dtype),
                          torch.randn(B, G, c.vocab_size) * 3)
        anchors = torch.randint(0, c.vocab_size, (B,))
        blocks = {}
        for fused in (False, True):
            drafter.fused_argmax = fused
            blocks[fused] = drafter.greedy_block(out, anchors)
        bare = drafter.greedy_block(out, anchors, confidence=False)  # a burst's: no confidence logits
        two, second = drafter.greedy_two_chains(out, anchors)
        two_bare, second_bare = drafter.greedy_two_chains(out, anchors, confidence=False)
    finally:
        cluster.stop(engine)
    assert torch.equal(blocks[True].tokens, blocks[False].tokens)
    assert blocks[False].conf_logits is not None and drafter.confidence_head is not None
    torch.testing.assert_close(blocks[True].conf_logits, blocks[False].conf_logits)
    assert torch.equal(bare.tokens, blocks[True].tokens) and bare.conf_logits is None
    assert torch.equal(two_bare.tokens, two.tokens) and torch.equal(second_bare, second)
    assert two.conf_logits is not None and two_bare.conf_logits is None


def test_an_idle_engine_logs_the_steps_since_its_last_line(dspark_files, bursts, caplog):
    """The `spec:` line comes every LOG_INTERVAL_S while steps run, and once more when the engine
    goes idle (keepalive), so a short burst of load is reported; an idle engine adds no line."""
    import logging

    engine, cluster = create_engine(engine_config(dspark_files["target"], dspark_files["oracle"], "static"))
    try:
        with caplog.at_level(logging.INFO, logger="sglaunch.speculative.decoder"):
            run(engine, make_requests(prompts(2, seed=14), "i", greedy(12)))
            before = sum("spec:" in r.getMessage() for r in caplog.records)
            engine.keepalive()
            after = sum("spec:" in r.getMessage() for r in caplog.records)
            engine.keepalive()
            again = sum("spec:" in r.getMessage() for r in caplog.records)
    finally:
        cluster.stop(engine)
    assert after == before + 1 and again == after


def test_bursts_teach_the_planner_its_prior():
    """A burst's accepted counts are the empirical survivals the planner prices new requests at:
    slot j survives in the request-iterations that kept more than j drafts; each
    request-iteration weighs one in the running mean."""
    from sglaunch.speculative.planner import DSparkPlanner

    planner = DSparkPlanner(block_size=4, mode="static")
    assert planner.prior == [1.0] * 4
    planner.observe_accepts([[0, 4], [2, 1]])  # the first observation replaces the 1.0 guess
    assert planner.prior == pytest.approx([0.75, 0.5, 0.25, 0.25])
    planner.observe_accepts([[0, 0]])  # two more request-iterations: 4 of 6 in the mean
    assert planner.prior == pytest.approx([4 / 6 * p for p in (0.75, 0.5, 0.25, 0.25)])
    planner.observe_accepts([])
    assert planner.prior == pytest.approx([4 / 6 * p for p in (0.75, 0.5, 0.25, 0.25)])


def test_a_few_easy_requests_cannot_set_the_price_of_a_wide_batch():
    """Session 11: two warm-up requests that accepted everything left a prior accept of 5.83 and
    the next wave of 64 was drafted at it. Started from the drafter's measured survivals, a
    handful of request-iterations moves the prior a little; a long run of them takes it over."""
    from sglaunch.speculative.planner import PRIOR_START_WEIGHT, PRIOR_WINDOW, DSparkPlanner

    start = [0.6, 0.35, 0.2, 0.1]
    planner = DSparkPlanner(block_size=4, mode="static", start_prior=start)
    assert planner.prior == start
    for _ in range(4):  # two requests, two bursts of 4 iterations each, every draft accepted
        planner.observe_accepts([[4, 4]] * 4)
    moved = 32 / (PRIOR_START_WEIGHT + 32)
    assert planner.prior == pytest.approx([p + moved * (1.0 - p) for p in start])
    assert 1.0 + sum(planner.prior) < 2.6  # 2.25 at the start; 5.0 if the easy requests set it
    for _ in range(8 * PRIOR_WINDOW):
        planner.observe_accepts([[4]])
    assert planner.prior == pytest.approx([1.0] * 4, abs=1e-3)  # older steps fade: it still adapts
    planner.reset_prior()
    assert planner.prior == start
    with pytest.raises(ValueError, match="block size"):
        DSparkPlanner(block_size=4, mode="static", start_prior=[0.5])


def test_the_starting_prior_is_read_from_the_drafters_eval(tmp_path):
    import json

    from sglaunch.speculative.planner import measured_survivals

    assert measured_survivals(str(tmp_path), 3) is None  # no eval.json
    (tmp_path / "eval.json").write_text("{not json")
    assert measured_survivals(str(tmp_path), 3) is None
    rates = [0.58, 0.34, 0.19]
    (tmp_path / "eval.json").write_text(json.dumps(
        {"temperatures": {"0.0": {"per_position": {"reach_rate_per_position": rates}}}}))
    assert measured_survivals(str(tmp_path), 3) == rates
    assert measured_survivals(str(tmp_path), 4) is None  # another block size
    bundled = Path(__file__).resolve().parents[2] / "sglaunch" / "hub" / "drafters" / "smollm2-135m-instruct"
    got = measured_survivals(str(bundled), 7)
    assert got is not None and got == sorted(got, reverse=True) and 1.5 < 1.0 + sum(got) < 4.0


def test_an_engine_that_only_bursts_learns_a_prior(dspark_files, bursts):
    engine, cluster = create_engine(engine_config(dspark_files["target"], dspark_files["random"], "static"))
    try:
        run(engine, make_requests(prompts(2, seed=15), "p", greedy(24)))
        assert engine.runner.burst.bursts > 0
        prior = engine.spec.planner.prior
    finally:
        cluster.stop(engine)
    assert prior != [1.0] * GAMMA and all(0.0 <= p <= 1.0 for p in prior)
    assert prior == sorted(prior, reverse=True)  # survivals never grow along the block


def test_the_sweep_reports_each_levels_bursts(dspark_files, bursts):
    """benchmarks/dspark_sweep.py's closed loop: per level, the bursts, their iterations and why
    the other steps did not burst (deltas, so a second level does not count the first's)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "dspark_sweep.py"
    spec = importlib.util.spec_from_file_location("dspark_sweep_for_bursts", path)
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    engine, cluster = create_engine(engine_config(dspark_files["target"], dspark_files["oracle"], "static"))
    try:
        batch = prompts(3, seed=16, lengths=(9, 17, 30))
        first = sweep.run_level(engine, batch, concurrency=2, count=3, max_tokens=16, ignore_eos=True, tag="a")
        second = sweep.run_level(engine, batch, concurrency=2, count=3, max_tokens=16, ignore_eos=True, tag="b")
        total = engine.burst.bursts
    finally:
        cluster.stop(engine)
    for row in (first, second):
        assert row["bursts"] > 0 and row["burst_iterations"] >= row["bursts"]
    # NOTE: the second level's prompts are in the radix cache: its prefills are one token, decodes
    assert first["steps_without_burst"].get("prefill", 0) > 0
    assert first["bursts"] + second["bursts"] == total
