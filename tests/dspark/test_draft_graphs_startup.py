"""Drafter graphs are captured at start-up, all of them, and never while serving: on the CPU with
draft_graphs.EagerCapture standing in for CUDA graphs (the replay re-runs the captured body over
the same static input and output buffers), the engine replays them from its first step (the
start-up step-cost profile included), captures nothing more, and gives plain greedy output and
the eager drafter's sampled output."""

from __future__ import annotations

import functools

import pytest

from dspark_helpers import engine_config, prompts
from sglaunch.engine.interface import GenerateRequest, SamplingParams
from sglaunch.engine.launch import create_engine
from sglaunch.speculative import draft_graphs
from test_engine_dspark import run


def requests(batch, tag):
    out = []
    for i, p in enumerate(batch):
        sampled = i % 3 == 2
        params = SamplingParams(max_new_tokens=10 + i % 4, temperature=0.8 if sampled else 0.0, top_p=0.9,
                                seed=70 + i if sampled else None, ignore_eos=True)
        out.append(GenerateRequest(f"{tag}-{i}", tuple(p), params))
    return out


def with_graphs(monkeypatch):
    monkeypatch.setattr(draft_graphs, "start_up_graphs",
                        functools.partial(draft_graphs.start_up_graphs, capture=draft_graphs.EagerCapture(),
                                          force=True))


def serve(config, batch):
    engine, cluster = create_engine(config)
    try:
        graphs = engine.runner.draft.graphs if engine.runner.draft is not None else None
        at_start = (graphs.captures, graphs.replays) if graphs is not None else None
        out = run(engine, requests(batch, "r"))
        return out, graphs, at_start
    finally:
        cluster.stop(engine)


@pytest.fixture(scope="module")
def batch():
    return prompts(6, seed=41)


def test_every_graph_is_captured_at_start_up_and_none_while_serving(dspark_files, batch, monkeypatch):
    base = dict(disable_radix_cache=True, cuda_graph_max_bs=4)
    plain, _, _ = serve(engine_config(dspark_files["target"], **base), batch)
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "compact", sps=dspark_files["sps"], **base)
    eager, no_graphs, _ = serve(config, batch)
    assert no_graphs is None  # a CPU engine has no drafter graphs of its own
    with_graphs(monkeypatch)
    monkeypatch.setenv("SGLAUNCH_DRAFT_SAMPLED_GRAPH", "1")
    got, graphs, (captured, replayed) = serve(config, batch)
    keys = graphs.plan.all_keys()
    assert graphs.plan.batch_sizes == [1, 2, 4] and captured == len(keys) == len(graphs.graphs) > 3
    assert set(graphs.graphs) == set(keys) and graphs.plan.sampled_batch == 4  # sampled graphs for every bucket
    assert graphs.captures == captured, "a serving step captured a drafter graph"
    assert graphs.replays > replayed and graphs.sampled_replays > 0  # the sampled rows' steps replayed them
    greedy = [r.rid for r in requests(batch, "r") if r.sampling.temperature == 0.0]
    assert {rid: got[rid][0] for rid in greedy} == {rid: plain[rid][0] for rid in greedy}
    assert {rid: v[0] for rid, v in got.items()} == {rid: v[0] for rid, v in eager.items()}  # sampled too
    # the default (SGLAUNCH_DRAFT_SAMPLED_GRAPH unset) is the sampled graphs
    monkeypatch.delenv("SGLAUNCH_DRAFT_SAMPLED_GRAPH")
    default, graphs, _ = serve(config, batch)
    assert graphs.plan.sampled_batch == 4 and graphs.sampled_replays > 0
    assert {rid: v[0] for rid, v in default.items()} == {rid: v[0] for rid, v in eager.items()}
    # with it 0, steps with a sampled row sample eagerly
    monkeypatch.setenv("SGLAUNCH_DRAFT_SAMPLED_GRAPH", "0")
    off, graphs, _ = serve(config, batch)
    assert graphs.plan.sampled_batch == 0 and graphs.sampled_replays == 0 and graphs.replays > 0
    assert not any(k.sampled for k in graphs.graphs)
    assert {rid: v[0] for rid, v in off.items()} == {rid: v[0] for rid, v in eager.items()}


def test_the_start_up_profile_times_the_graph_path(dspark_files, monkeypatch):
    with_graphs(monkeypatch)
    monkeypatch.setenv("SGLAUNCH_DSPARK_PROFILE_SPS", "1")
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "compact", cuda_graph_max_bs=2,
                           max_running_requests=2)
    engine, cluster = create_engine(config)
    try:
        graphs = engine.runner.draft.graphs
        assert engine.spec.planner.sps is not None and engine.spec.planner.sps.prices_drafting
        # every profiled draft stage replayed a graph captured before the profile began
        assert graphs.replays > 0 and graphs.captures == len(graphs.plan.all_keys())
    finally:
        cluster.stop(engine)


@pytest.mark.parametrize("mode", ["static", "cap-accept", "compact"])
def test_all_greedy_steps_draft_with_no_copy_down_and_equal_plain(dspark_files, batch, monkeypatch, mode):
    """An all-greedy step whose block the drafter's graph sampled: no uniforms, no host-to-device
    copy in propose (the mode's lengths and the caps are applied on the host), the host accept."""
    from sglaunch.speculative import decoder as decoder_module

    def greedy_requests(tag):
        return [GenerateRequest(f"{tag}-{i}", tuple(p), SamplingParams(max_new_tokens=6 + 3 * i, temperature=0.0,
                                                                        ignore_eos=True)) for i, p in enumerate(batch)]

    base = dict(disable_radix_cache=True, cuda_graph_max_bs=8)
    engine, cluster = create_engine(engine_config(dspark_files["target"], **base))
    try:
        plain = run(engine, greedy_requests("g"))
    finally:
        cluster.stop(engine)
    with_graphs(monkeypatch)
    sps = dspark_files["sps"] if mode != "static" else None
    engine, cluster = create_engine(engine_config(dspark_files["target"], dspark_files["oracle"], mode, sps=sps, **base))
    try:
        calls = {"propose": 0, "greedy": 0, "copies": 0, "device accept": 0}
        spec = engine.spec
        propose, accept = spec.propose, spec.accept

        def counted_propose(*a, **k):
            proposal = propose(*a, **k)
            calls["propose"] += 1
            calls["greedy"] += proposal.greedy is None  # drafted for the host accept: no device inputs
            return proposal

        def counted_accept(*a, **k):
            calls["device accept"] += 1
            return accept(*a, **k)

        spec.propose, spec.accept = counted_propose, counted_accept
        real_to_device = decoder_module.to_device

        def counted_to_device(*a, **k):
            calls["copies"] += 1
            return real_to_device(*a, **k)

        monkeypatch.setattr(decoder_module, "to_device", counted_to_device)
        got = run(engine, greedy_requests("g"))
        stats = spec.stats.to_dict()
    finally:
        cluster.stop(engine)
    assert {rid: v[0] for rid, v in got.items()} == {rid: v[0] for rid, v in plain.items()}
    assert calls["propose"] > 3 and calls["greedy"] == calls["propose"]
    assert calls["copies"] == 0 and calls["device accept"] == 0
    assert stats["mean_accept_length"] > 1.5


def test_a_device_accept_of_a_host_planned_proposal(dspark_files, monkeypatch):
    """The device accept still takes a proposal drafted for the host accept (what `sglaunch
    profile-sps`'s draft profile does without ProfilePlan.greedy)."""
    from sglaunch.speculative.sps_profile import ProfilePlan, profile_draft_costs

    with_graphs(monkeypatch)
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "compact", sps=dspark_files["sps"],
                           cuda_graph_max_bs=4)
    engine, cluster = create_engine(config)
    try:
        for greedy in (False, True):
            costs = profile_draft_costs(engine, ProfilePlan((5, 10), window=5, context_len=16, repeats=1, warmup=0,
                                                            greedy=greedy))
            assert sorted(costs) == [1, 2] and all(s > 0 for s in costs.values())
    finally:
        cluster.stop(engine)


def test_the_drafters_working_memory_dry_run_and_the_kv_budget_it_leaves(dspark_files, monkeypatch):
    """DraftRunner.working_bytes runs the largest drafter graph key's forward once over a one-slot pool
    (on a CPU it measures nothing and returns 0, but the dry run itself runs); plan_kv_tokens keeps
    such a reserve out of the default GPU budget, not out of an explicit --mem-fraction-static."""
    import dataclasses

    import torch

    from sglaunch.config import GPU_MEM_FRACTION
    from sglaunch.engine import kv_pool

    config = engine_config(dspark_files["target"], dspark_files["oracle"], "compact", cuda_graph_max_bs=4)
    engine, cluster = create_engine(config)
    try:
        draft = engine.runner.draft
        calls = []
        real = draft_graphs.graph_body
        monkeypatch.setattr(draft_graphs, "graph_body", lambda d, b, p: calls.append(
            (tuple(b.slot_table.shape), p.k[0].shape[0])) or real(d, b, p))
        assert draft.working_bytes([1, 2, 4], 512, torch.float32) == 0
        plan = draft_graphs.DraftGraphPlan([1, 2, 4], 512)
        largest = plan.keys()[0]
        assert calls == [((largest.batch, largest.context), 1)] and largest.batch == 4
    finally:
        cluster.stop(engine)
    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (60 * gib, 80 * gib))
    cuda = torch.device("cuda")
    per_token = 1 << 16
    default = dataclasses.replace(config, max_total_tokens=None, mem_fraction_static=None)
    free_budget = 80 * gib * GPU_MEM_FRACTION - 20 * gib
    assert kv_pool.plan_kv_tokens(default, per_token, cuda) == int(free_budget // per_token)
    assert kv_pool.plan_kv_tokens(default, per_token, cuda, reserve_bytes=3 * gib) == \
        int((free_budget - 3 * gib) // per_token)
    explicit = dataclasses.replace(default, mem_fraction_static=0.5)
    assert kv_pool.plan_kv_tokens(explicit, per_token, cuda, reserve_bytes=3 * gib) == \
        int((40 * gib - 20 * gib) // per_token)
    with pytest.raises(ValueError, match="kept for the DSpark drafter's working memory"):
        kv_pool.plan_kv_tokens(default, per_token, cuda, reserve_bytes=int(free_budget) + gib)


@pytest.mark.parametrize("sampled_graphs", ["0", "1"])
def test_every_sampled_drafting_step_replays_a_drafter_graph(dspark_files, batch, monkeypatch, sampled_graphs):
    """Steps whose rows all sample replay a drafter graph at every drafting step: a sampled one
    (by default), or with SGLAUNCH_DRAFT_SAMPLED_GRAPH=0 the forward's greedy graph with the block
    drawn eagerly after it (not an eager forward)."""
    from sglaunch.speculative.drafter import DSparkDrafter

    with_graphs(monkeypatch)
    monkeypatch.setenv("SGLAUNCH_DRAFT_SAMPLED_GRAPH", sampled_graphs)
    monkeypatch.setenv("SGLAUNCH_DSPARK_STEP_ASIDE", "0")
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "compact", sps=dspark_files["sps"],
                           disable_radix_cache=True, cuda_graph_max_bs=8)
    eager_draws = {"n": 0}
    sample_block = DSparkDrafter.sample_block

    def counted(self, out, anchors, temperatures, *a, **k):
        if not k.get("all_greedy") and k.get("full_vocab_probs", True):  # the decoder's eager draw
            eager_draws["n"] += 1
        return sample_block(self, out, anchors, temperatures, *a, **k)

    monkeypatch.setattr(DSparkDrafter, "sample_block", counted)
    engine, cluster = create_engine(config)
    try:
        graphs = engine.runner.draft.graphs
        replayed = graphs.replays
        reqs = [GenerateRequest(f"s-{i}", tuple(p), SamplingParams(max_new_tokens=12, temperature=0.9, seed=5 + i,
                                                                 ignore_eos=True)) for i, p in enumerate(batch)]
        run(engine, reqs)
        steps = engine.spec.stats.steps
        assert steps > 3 and graphs.replays - replayed == steps
        if sampled_graphs == "1":
            assert graphs.sampled_replays == steps and eager_draws["n"] == 0
        else:
            assert graphs.sampled_replays == 0 and eager_draws["n"] == steps
    finally:
        cluster.stop(engine)
