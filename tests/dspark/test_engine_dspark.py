"""DSpark in the engine: greedy output token-identical to plain decoding in every ragged verify
mode, batch sizes 1-16, radix cache on and off, page sizes 1 and 4, chunked prefill with
preemption, stop tokens inside accepted drafts; cap-accept == compact; multi-token acceptance;
KV rollback leaves no pages behind; seeded sampling is deterministic."""

from __future__ import annotations

import pytest
import torch

from dspark_helpers import GAMMA, engine_config, prompts
from sglaunch.engine.interface import GenerateRequest, SamplingParams
from sglaunch.engine.launch import create_engine, generate_batch

MODES = ("static", "cap-accept", "compact")


def greedy(max_new_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True, **kw)


def make_requests(batch: list[list[int]], tag: str, params=None) -> list[GenerateRequest]:
    """Varied max_new_tokens (3..33) so length caps cut windows too."""
    return [GenerateRequest(f"{tag}-{i}", tuple(p), params or greedy(3 + (7 * i) % 31)) for i, p in enumerate(batch)]


def run(engine, requests, check=None):
    """Drive the engine to completion -> {rid: (tokens, logprobs, finish_reason)}; `check(engine)`
    after every step."""
    out = {r.rid: ([], [], None) for r in requests}
    for r in requests:
        engine.add_request(r)
    while engine.has_work:
        for o in engine.step():
            toks, lps, _ = out[o.rid]
            toks.extend(o.new_token_ids)
            lps.extend(o.logprobs)
            if o.finished:
                out[o.rid] = (toks, lps, o.finish_reason)
        if check is not None:
            check(engine)
    return out


def run_batches(config, batches, check=None):
    engine, cluster = create_engine(config)
    try:
        results = [run(engine, make_requests(b, f"b{n}"), check) for n, b in enumerate(batches)]
        return results, engine.spec.stats.to_dict() if engine.spec else None, engine
    finally:
        cluster.stop(engine)


# the same prompts come back in later batches: with the radix cache on they are prefix hits
BATCHES = [prompts(1, seed=1), prompts(5, seed=2), prompts(16, seed=3) + prompts(2, seed=1)[:1]]


@pytest.fixture(scope="module")
def baselines(dspark_files):
    out = {}
    for page_size in (1, 4):
        results, _, _ = run_batches(engine_config(dspark_files["target"], page_size=page_size), BATCHES)
        out[page_size] = results
    return out


def tokens_of(results):
    return [{rid: r[0] for rid, r in batch.items()} for batch in results]


# the random drafter (rejections nearly every step) runs on fewer layouts: it is slow (1 token/step)
LAYOUTS = [("oracle", True, 1), ("oracle", False, 4), ("oracle", True, 4), ("random", True, 1), ("random", False, 4)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("drafter,radix,page_size", LAYOUTS)
def test_greedy_is_lossless(dspark_files, baselines, mode, drafter, radix, page_size):
    sps = dspark_files["sps"] if mode != "static" else None
    config = engine_config(dspark_files["target"], dspark_files[drafter], mode, sps=sps,
                           disable_radix_cache=not radix, page_size=page_size)
    results, stats, _ = run_batches(config, BATCHES)
    assert tokens_of(results) == tokens_of(baselines[page_size])
    for spec_batch, base_batch in zip(results, baselines[page_size]):
        for rid, (_, lps, reason) in spec_batch.items():
            assert reason == base_batch[rid][2] == "length"
            torch.testing.assert_close(torch.tensor(lps), torch.tensor(base_batch[rid][1]), atol=1e-4, rtol=0)
    assert stats["steps"] > 0
    if drafter == "oracle":  # several drafts accepted per step: ragged verify + partial rollback ran
        assert stats["mean_accept_length"] > 2.0
        hist = stats["accept_length_histogram"]
        assert hist[str(GAMMA + 1)] > 0 and sum(hist[str(k)] for k in range(2, GAMMA + 1)) > 0


def test_chunked_prefill_and_preemption(dspark_files):
    batch = prompts(12, seed=4, lengths=(9, 30, 17, 45))
    params = greedy(24)
    tight = dict(page_size=2, max_total_tokens=96, chunked_prefill_size=8)
    base = generate_batch(engine_config(dspark_files["target"], **tight), batch, params)
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "compact", **tight)
    engine, cluster = create_engine(config)
    try:
        out = run(engine, make_requests(batch, "p", params))
        assert engine.scheduler.num_preemptions > 0
        assert engine.allocator.num_used == engine.scheduler.radix.cached_pages
    finally:
        cluster.stop(engine)
    assert [out[f"p-{i}"][0] for i in range(len(batch))] == base


def test_stop_token_inside_accepted_drafts(dspark_files):
    batch = prompts(6, seed=5)
    plain = generate_batch(engine_config(dspark_files["target"]), batch, greedy(30))
    stops = tuple({row[len(row) // 2] for row in plain})  # tokens that occur mid-output
    params = greedy(30, stop_token_ids=stops)
    expected = generate_batch(engine_config(dspark_files["target"]), batch, params)
    for row in expected:
        assert row[-1] in stops and len(row) < 30
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "compact")
    engine, cluster = create_engine(config)
    try:
        out = run(engine, make_requests(batch, "s", params))
        assert engine.allocator.num_used == engine.scheduler.radix.cached_pages
    finally:
        cluster.stop(engine)
    assert [out[f"s-{i}"][0] for i in range(len(batch))] == expected
    assert {out[f"s-{i}"][2] for i in range(len(batch))} == {"stop"}


def sampled(seed: int | None) -> SamplingParams:
    return SamplingParams(max_new_tokens=20, temperature=0.7, top_p=0.95, top_k=50, seed=seed, ignore_eos=True)


def test_cap_accept_equals_compact(dspark_files):
    batch = prompts(10, seed=6)
    results = {}
    for mode in ("cap-accept", "compact"):
        config = engine_config(dspark_files["target"], dspark_files["oracle"], mode, sps=dspark_files["sps"])
        engine, cluster = create_engine(config)
        try:
            requests = make_requests(batch, "g") + [GenerateRequest(f"t-{i}", tuple(p), sampled(100 + i))
                                                     for i, p in enumerate(batch)]
            results[mode] = ({rid: r[0] for rid, r in run(engine, requests).items()}, engine.spec.stats.to_dict())
        finally:
            cluster.stop(engine)
    assert results["cap-accept"][0] == results["compact"][0]
    # same commits, but compact packs only the planned windows into the verify batch
    cap, compact = results["cap-accept"][1], results["compact"][1]
    assert cap["accept_length_histogram"] == compact["accept_length_histogram"]
    assert compact["verify_tokens_per_step"] < cap["verify_tokens_per_step"]


def test_seeded_sampling_is_deterministic(dspark_files):
    """For a fixed step-cost table: a profiled one (compact's default) is measured, and the
    step-aside decisions, which set how a request's random stream is used, follow timings."""
    batch = prompts(6, seed=7)
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "compact", sps=dspark_files["sps"])
    outs = []
    for seed in (7, 7, 8):
        engine, cluster = create_engine(config)
        try:
            requests = [GenerateRequest(f"x-{i}", tuple(p), sampled(seed * 100 + i)) for i, p in enumerate(batch)]
            outs.append({rid: r[0] for rid, r in run(engine, requests).items()})
            assert engine.spec.stats.to_dict()["steps"] > 0
        finally:
            cluster.stop(engine)
    assert outs[0] == outs[1]
    assert outs[0] != outs[2]
    assert all(len(t) == 20 and all(0 <= x < 256 for x in t) for t in outs[0].values())


def test_rejected_steps_leak_no_pages(dspark_files):
    """A random drafter is rejected at almost every step: after each step every running request
    holds exactly the pages of its committed KV, and everything is freed at the end."""
    def check(engine):
        running = engine.scheduler.running
        for req in running:
            assert len(req.pages) == -(-req.num_computed // 2), req
        assert engine.allocator.num_used == sum(len(r.pages) for r in running)

    config = engine_config(dspark_files["target"], dspark_files["random"], "static", page_size=2,
                           disable_radix_cache=True)
    results, stats, engine = run_batches(config, [prompts(12, seed=8)] * 3, check)
    assert engine.allocator.num_used == 0
    assert stats["steps"] > 50 and stats["mean_accept_length"] < 1.2  # mostly rejections


def test_static_mode_without_confidence_head_and_refusals(dspark_files, tmp_path):
    from dspark_helpers import drafter_config

    from sglaunch.speculative.checkpoint import init_drafter_state, save_drafter

    cfg = drafter_config(markov_rank=0, enable_confidence_head=False)  # pure DFlash
    plain = save_drafter(tmp_path / "dflash", cfg, init_drafter_state(cfg, with_embed=False, with_lm_head=False))
    batch = prompts(3, seed=9)
    expected = generate_batch(engine_config(dspark_files["target"]), batch, greedy(12))
    assert generate_batch(engine_config(dspark_files["target"], plain, "static"), batch, greedy(12)) == expected
    with pytest.raises(ValueError, match="confidence head"):
        create_engine(engine_config(dspark_files["target"], plain, "compact"))
    import dataclasses

    config = engine_config(dspark_files["target"], dspark_files["oracle"], "compact")
    wrong = dataclasses.replace(config, speculative=dataclasses.replace(config.speculative, block_size=GAMMA + 2))
    with pytest.raises(ValueError, match="block_size"):
        create_engine(wrong)


def test_tp2_compact_matches_plain(dspark_files):
    batch = prompts(6, seed=10)
    expected = generate_batch(engine_config(dspark_files["target"]), batch, greedy(16))
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "compact", sps=dspark_files["sps"],
                           tp_size=2, page_size=2)
    assert generate_batch(config, batch, greedy(16)) == expected


def test_compact_without_a_table_profiles_step_costs_at_start(dspark_files, monkeypatch):
    config = engine_config(dspark_files["target"], dspark_files["oracle"], mode="compact")
    engine, cluster = create_engine(config)
    try:
        table = engine.spec.planner.sps
        assert table is not None  # measured, so compact plans windows instead of verifying all
        assert table.sps(1) > 0 and table.sps(GAMMA + 1) > 0
        # the draft stage is priced too, per number of requests, starting at one request
        assert table.draft_requests and table.draft_requests[0] == 1 and table.draft_seconds(1) > 0
    finally:
        cluster.stop(engine)
    monkeypatch.setenv("SGLAUNCH_DSPARK_PROFILE_SPS", "0")
    engine, cluster = create_engine(config)
    try:
        assert engine.spec.planner.sps is None
    finally:
        cluster.stop(engine)
    static = engine_config(dspark_files["target"], dspark_files["oracle"], mode="static")
    monkeypatch.delenv("SGLAUNCH_DSPARK_PROFILE_SPS")
    engine, cluster = create_engine(static)
    try:
        assert engine.spec.planner.sps is None  # static verifies the whole block: no cost model
    finally:
        cluster.stop(engine)


def test_draft_vocabulary_keeps_greedy_output_and_restricts_the_drafts(dspark_files, baselines, tmp_path):
    """A draft_vocab.json beside the drafter: the engine drafts only its tokens; the output is
    still plain greedy, and drafts outside it (half the vocabulary here) lower the accept length."""
    import shutil

    from sglaunch.speculative.draft_vocab import save_draft_vocab

    folder = tmp_path / "oracle-half-vocab"
    shutil.copytree(dspark_files["oracle"], folder)
    save_draft_vocab(folder / "draft_vocab.json", range(0, 256, 2), "even ids, for the test")
    config = engine_config(dspark_files["target"], folder, "static")
    results, stats, engine = run_batches(config, BATCHES)
    assert engine.runner.draft.drafter.draft_vocab is not None
    assert tokens_of(results) == tokens_of(baselines[1])
    _, full_stats, _ = run_batches(engine_config(dspark_files["target"], dspark_files["oracle"], "static"), BATCHES)
    assert stats["mean_accept_length"] < full_stats["mean_accept_length"]
