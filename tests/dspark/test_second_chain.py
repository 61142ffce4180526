"""DSpark's second chain (SGLAUNCH_DSPARK_SECOND_CHAIN): at T = 0 a drafting step also verifies
the block's runner-up chain (slot 0's second choice, then greedy) in a window of its own.

The drafter here is the oracle's Markov head with a decoy: for an even previous token u its top
choice is a wrong token h(u) and its second the target's g(u), for an odd u it is g(u) itself. So
the first chain is rejected at its first draft after every even anchor, where the second chain
takes g(anchor) and goes on while the chain stays on odd tokens. The output must still be plain
greedy decoding's, token for token, with every page accounted for after every step."""

from __future__ import annotations

import logging

import pytest
import torch

from dspark_helpers import VOCAB, bigram_successor, drafter_config, engine_config, prompts
from sglaunch.engine.launch import create_engine, generate_batch
from sglaunch.engine.step import DraftStepInput
from sglaunch.speculative.burst import SECOND_CHAIN_MAX_BATCH
from sglaunch.speculative.checkpoint import init_drafter_state, save_drafter
from test_engine_dspark import greedy, make_requests, run

ENV = "SGLAUNCH_DSPARK_SECOND_CHAIN"
SAMPLED = "SGLAUNCH_DSPARK_SAMPLED_CHAIN"


def decoy(u: int, g: torch.Tensor) -> int:
    """A token the target does not choose after u."""
    return int((g[u] + 1) % (VOCAB - 1))


@pytest.fixture(scope="module")
def decoy_drafter(dspark_files, tmp_path_factory):
    cfg = drafter_config(markov_rank=VOCAB)
    state = init_drafter_state(cfg, seed=11, with_embed=False, with_lm_head=False)
    g = bigram_successor(dspark_files["target"])
    w2 = torch.zeros(VOCAB, VOCAB)
    w2[g, torch.arange(VOCAB)] = 50.0
    for u in range(0, VOCAB, 2):
        w2[decoy(u, g), u] = 60.0
    state["markov_head.markov_w1.weight"] = torch.eye(VOCAB)
    state["markov_head.markov_w2.weight"] = w2
    state["confidence_head.proj.bias"] = torch.tensor([2.0])
    return save_drafter(tmp_path_factory.mktemp("decoy"), cfg, state), g


BATCH = prompts(8, seed=21)


def run_checked(config, batch=BATCH, max_new=24):
    """Tokens per request and the spec stats; after every step each running request holds
    exactly the pages of its computed KV (page size 1) and the pool nothing else."""
    def check(engine):
        running = engine.scheduler.running
        for req in running:
            assert len(req.pages) == req.num_computed, req
        cached = engine.scheduler.radix.cached_pages if engine.scheduler.radix else 0
        assert engine.allocator.num_used == sum(len(r.pages) - r.num_borrowed_pages for r in running) + cached

    engine, cluster = create_engine(config)
    try:
        out = run(engine, make_requests(batch, "c", greedy(max_new)), check)
        stats = engine.spec.stats.to_dict()
        cached = engine.scheduler.radix.cached_pages if engine.scheduler.radix else 0
        assert engine.allocator.num_used == cached
    finally:
        cluster.stop(engine)
    return [out[f"c-{i}"][0] for i in range(len(batch))], [out[f"c-{i}"][1] for i in range(len(batch))], stats


@pytest.fixture(scope="module")
def plain(dspark_files):
    return generate_batch(engine_config(dspark_files["target"], page_size=1), BATCH, greedy(24))


@pytest.mark.parametrize("mode,radix", [("static", True), ("compact", False), ("cap-accept", True)])
def test_second_chain_is_lossless_and_wins_after_the_decoy(dspark_files, decoy_drafter, plain, monkeypatch,
                                                          mode, radix):
    drafter, _ = decoy_drafter
    config = engine_config(dspark_files["target"], drafter, mode, sps=dspark_files["sps"] if mode != "static" else None,
                           page_size=1, disable_radix_cache=not radix)
    small = BATCH[:SECOND_CHAIN_MAX_BATCH]  # NOTE: larger steps verify one chain
    monkeypatch.delenv(ENV, raising=False)
    one, one_lps, one_stats = run_checked(config, small)
    monkeypatch.setenv(ENV, "3")
    two, two_lps, two_stats = run_checked(config, small)
    assert one == plain[: len(small)] and two == plain[: len(small)]
    torch.testing.assert_close(torch.tensor(two_lps), torch.tensor(one_lps), atol=1e-4, rtol=0)
    assert one_stats["second_chains"] == 0
    assert two_stats["second_chains"] > 0 and two_stats["second_chain_wins"] > 0
    # a win commits at least 2 tokens where the first chain's rejected first draft committed 1
    assert two_stats["mean_accept_length"] > one_stats["mean_accept_length"] + 0.2
    hist = two_stats["accept_length_histogram"]
    assert sum(hist[str(k)] for k in range(3, 5)) > 0  # the second chain also ran past its first draft


def test_second_chains_stay_within_the_largest_graphs_batch(dspark_files, decoy_drafter, plain, monkeypatch):
    """H100, session 45: at --cuda-graph-max-bs 4 with 4 running requests, the default second chain gave
    drafting steps 8 query segments (each chain's window is one) and 6 target forwards ran eagerly
    (`eager (batch)`). With a fake largest graph on the CPU: where the chains would push a step past its
    batch they are left out (and the tokens stay plain greedy decoding's); where they fit they run."""
    from sglaunch.engine.model_runner import ModelRunner

    drafter, _ = decoy_drafter
    config = engine_config(dspark_files["target"], drafter, "compact", sps=dspark_files["sps"], page_size=1)
    small = BATCH[:SECOND_CHAIN_MAX_BATCH]
    monkeypatch.setenv(ENV, "3")
    segments = []
    forward = ModelRunner.forward

    def counted(self, step):
        segments.append(step.batch_size)
        return forward(self, step)

    monkeypatch.setattr(ModelRunner, "forward", counted)
    chains, widest = {}, {}
    for most in (len(small), 2 * len(small)):
        monkeypatch.setattr(ModelRunner, "graph_max_batch", property(lambda self, most=most: most))
        segments.clear()
        out, _, stats = run_checked(config, small)
        assert out == plain[: len(small)]
        chains[most], widest[most] = stats["second_chains"], max(segments)
    assert widest[len(small)] <= len(small) < widest[2 * len(small)], widest  # 4 requests: 4 segments at most
    # the chains that still fit run (a step of fewer requests), the rest were left out
    assert chains[2 * len(small)] > chains[len(small)], chains


def test_second_chain_drafts_the_runner_up(dspark_files, decoy_drafter):
    """DSparkDrafter.second_chain: slot 0's second choice, then the Markov chain from it."""
    drafter_path, g = decoy_drafter
    monkey_config = engine_config(dspark_files["target"], drafter_path, "static", page_size=1)
    engine, cluster = create_engine(monkey_config)
    try:
        runner = engine.runner.draft
        anchors = [4, 6, 9]  # even anchors: the first chain drafts the decoy, the second g(u)
        step = DraftStepInput(anchors, [0, 0, 0], [[], [], []], second_chain=3)
        out = runner.forward(step, 1)
        second = out.second.tolist()
        for u, row in zip(anchors, second):
            first = decoy(u, g) if u % 2 == 0 else int(g[u])
            assert row[0] != first
            if u % 2 == 0:
                assert row[0] == int(g[u])
            prev = row[0]
            for x in row[1:]:  # greedy after slot 0: the Markov head's top choice from the previous draft
                assert x == (decoy(prev, g) if prev % 2 == 0 else int(g[prev]))
                prev = x
        assert runner.second_tokens().tolist() == [x for row in second for x in row]
    finally:
        cluster.stop(engine)


def test_second_chain_needs_page_size_one(dspark_files, decoy_drafter, monkeypatch, caplog):
    monkeypatch.setenv(ENV, "2")
    config = engine_config(dspark_files["target"], decoy_drafter[0], "static", page_size=4)
    with caplog.at_level(logging.WARNING):
        engine, cluster = create_engine(config)
    try:
        assert engine.spec.second_chain == 0
        assert any(ENV in r.getMessage() and "page-size 1" in r.getMessage() for r in caplog.records)
    finally:
        cluster.stop(engine)
    monkeypatch.setenv(ENV, "-1")
    with pytest.raises(ValueError, match=ENV):
        create_engine(engine_config(dspark_files["target"], decoy_drafter[0], "static", page_size=1))


def sampled_run(config, batch, tag: str, seed: int):
    """Seeded T = 0.8 requests (every other one greedy, so steps mix both); -> (tokens per request,
    the spec stats), with every page accounted for after every step and nothing left at the end."""
    from sglaunch.engine.interface import GenerateRequest, SamplingParams

    def check(engine):
        for req in engine.scheduler.running:
            assert len(req.pages) == req.num_computed, req
        cached = engine.scheduler.radix.cached_pages if engine.scheduler.radix else 0
        assert engine.allocator.num_used == sum(len(r.pages) - r.num_borrowed_pages
                                                for r in engine.scheduler.running) + cached

    requests = [GenerateRequest(f"{tag}-{i}", tuple(p),
                                SamplingParams(max_new_tokens=16, temperature=0.0 if i % 2 else 0.8, seed=seed + i,
                                               ignore_eos=True)) for i, p in enumerate(batch)]
    engine, cluster = create_engine(config)
    try:
        out = run(engine, requests, check)
        cached = engine.scheduler.radix.cached_pages if engine.scheduler.radix else 0
        assert engine.allocator.num_used == cached
        stats = engine.spec.stats.to_dict()
    finally:
        cluster.stop(engine)
    return [out[f"{tag}-{i}"][0] for i in range(len(batch))], stats


def test_sampled_second_chain_under_tensor_parallelism(dspark_files, decoy_drafter, plain, monkeypatch):
    """TP=2: the sampled chains are drawn on rank 0 and reach rank 1 as ordinary tokens of the step."""
    monkeypatch.setenv(ENV, "3")
    monkeypatch.setenv(SAMPLED, "3")
    config = engine_config(dspark_files["target"], decoy_drafter[0], "static", page_size=1, tp_size=2)
    small = BATCH[:SECOND_CHAIN_MAX_BATCH]
    out, stats = sampled_run(config, small, "t", 50)
    assert stats["second_chains"] > 0 and stats["second_chain_wins"] > 0
    for i in range(1, len(small), 2):
        assert out[i] == plain[i][:16]


@pytest.mark.parametrize("mode", ["static", "compact"])
def test_sampled_steps_verify_a_second_chain(dspark_files, decoy_drafter, plain, monkeypatch, mode):
    """SGLAUNCH_DSPARK_SAMPLED_CHAIN at T > 0 (recursive rejection sampling without replacement,
    accept.accept_two_chains): a step with sampled rows draws the second chain on the device and accepts it there. The chain
    wins after the decoy's rejected first drafts; the greedy rows of the same steps stay plain
    greedy; the same seeds give the same tokens; pages are accounted for after every step."""
    config = engine_config(dspark_files["target"], decoy_drafter[0], mode,
                           sps=dspark_files["sps"] if mode != "static" else None, page_size=1)
    small = BATCH[:SECOND_CHAIN_MAX_BATCH]
    monkeypatch.setenv(ENV, "0")
    monkeypatch.setenv(SAMPLED, "0")
    one, one_stats = sampled_run(config, small, "s", 30)
    monkeypatch.setenv(ENV, "3")
    monkeypatch.setenv(SAMPLED, "3")
    two, two_stats = sampled_run(config, small, "s", 30)
    again, _ = sampled_run(config, small, "s", 30)
    assert two == again
    assert one_stats["second_chains"] == 0
    assert two_stats["second_chains"] > 0 and two_stats["second_chain_wins"] > 0
    assert two_stats["mean_accept_length"] > one_stats["mean_accept_length"] + 0.1
    for i in range(1, len(small), 2):  # the greedy requests
        assert one[i] == plain[i][:16] and two[i] == plain[i][:16]
    assert all(len(t) == 16 and all(0 <= x < VOCAB for x in t) for t in two)


def test_the_planner_learns_each_class_of_chain_from_its_steps(dspark_files, decoy_drafter, monkeypatch):
    """What the second chains cost and won reaches the planner for the class that verified them
    (planner.chain_terms prices it): every chained step reports its requests, the rows its chains
    took (1 + n each, as the step's verify tokens count them) and what their wins committed beyond
    the first chains (accept length - 1: the first chain's first draft was rejected). A run with
    sampled rows measures the sampled class; an all-greedy run only the greedy class."""
    from sglaunch.speculative.decoder import DSparkDecoder
    from sglaunch.speculative.planner import DSparkPlanner

    config = engine_config(dspark_files["target"], decoy_drafter[0], "compact", sps=dspark_files["sps"], page_size=1)
    small = BATCH[:SECOND_CHAIN_MAX_BATCH]
    seen = []
    real = DSparkPlanner.observe_chains
    monkeypatch.setattr(DSparkPlanner, "observe_chains", lambda self, *a: seen.append(a) or real(self, *a))
    finish = []
    real_finish = DSparkDecoder._finish
    monkeypatch.setattr(DSparkDecoder, "_finish",
                        lambda self, proposal, out, t: finish.append((proposal.sampled, list(proposal.second_lens or []),
                                                                      [(a.accept_length, a.second_won) for a in out]))
                        or real_finish(self, proposal, out, t))
    monkeypatch.setenv(ENV, "3")
    monkeypatch.setenv(SAMPLED, "3")
    _, stats = sampled_run(config, small, "s", 30)
    assert stats["second_chains"] > 0 and stats["second_chain_wins"] > 0
    expected = [(sampled, len(accepts), sum(1 + n for n in lens if n),
                 sum(a - 1 for (a, won), n in zip(accepts, lens) if n and won))
                for sampled, lens, accepts in finish if any(lens)]
    assert seen == expected and any(sampled for sampled, *_ in seen)
    assert sum(g for *_, g in seen) > 0
    seen.clear()
    finish.clear()
    *_, greedy_stats = run_checked(config, small)
    assert greedy_stats["second_chain_wins"] > 0 and seen and not any(sampled for sampled, *_ in seen)


def test_sampled_graphs_draw_the_second_chain_the_eager_drafter_draws(dspark_files, decoy_drafter, monkeypatch):
    """Session 33: with the drafter's graphs (the CPU stand-in for capture) and
    the sampled graphs (SGLAUNCH_DRAFT_SAMPLED_GRAPH's default) of up to SECOND_CHAIN_MAX_BATCH requests
    draw the block and its sampled second chain from the step's uniforms: the same tokens as the eager
    draws (SGLAUNCH_DRAFT_SAMPLED_GRAPH=0), the chain verified and winning, and the chain taken from the
    graph, not drawn again."""
    import functools

    from sglaunch.speculative import draft_graphs
    from sglaunch.speculative.drafter import DSparkDrafter

    monkeypatch.setattr(draft_graphs, "start_up_graphs",
                        functools.partial(draft_graphs.start_up_graphs, capture=draft_graphs.EagerCapture(),
                                          force=True))
    monkeypatch.setenv(ENV, "3")
    monkeypatch.setenv(SAMPLED, "3")
    monkeypatch.setenv("SGLAUNCH_DRAFT_SAMPLED_GRAPH", "0")
    config = engine_config(dspark_files["target"], decoy_drafter[0], "compact", sps=dspark_files["sps"], page_size=1)
    small = BATCH[:SECOND_CHAIN_MAX_BATCH]
    eager, eager_stats = sampled_run(config, small, "g", 70)
    calls = {"chain": 0, "in graph": 0}
    drawn, in_graph = DSparkDrafter.sampled_second_chain, DSparkDrafter.sampled_graph_chain

    def counted(self, *a, **k):
        calls["chain"] += 1
        return drawn(self, *a, **k)

    def counted_in_graph(self, *a, **k):
        calls["in graph"] += 1
        return in_graph(self, *a, **k)

    monkeypatch.setattr(DSparkDrafter, "sampled_second_chain", counted)
    monkeypatch.setattr(DSparkDrafter, "sampled_graph_chain", counted_in_graph)
    monkeypatch.setenv("SGLAUNCH_DRAFT_SAMPLED_GRAPH", "1")
    graphs = {}
    real_enable = draft_graphs.DraftGraphRunner.capture_all

    def keep(self):
        graphs["runner"] = self
        return real_enable(self)

    monkeypatch.setattr(draft_graphs.DraftGraphRunner, "capture_all", keep)
    got, stats = sampled_run(config, small, "g", 70)
    runner = graphs["runner"]
    assert runner.chain == 3 and runner.chain_batch == SECOND_CHAIN_MAX_BATCH and runner.sampled_replays > 0
    assert got == eager
    assert stats["second_chains"] == eager_stats["second_chains"] > 0 and stats["second_chain_wins"] > 0
    # the graphs' chains were taken: every chain was drawn inside a graph body (its capture, or a
    # replay, which the CPU stand-in re-runs), none by the decoder after the replay
    chain_keys = sum(runner.draws_chain(k) for k in runner.graphs)
    assert chain_keys > 0 and calls["chain"] == calls["in graph"] > chain_keys


def test_sampled_second_chain_draws_without_the_first_draft(dspark_files, decoy_drafter):
    """DSparkDrafter.sampled_second_chain: y_0 never repeats x_0 and its proposal row is q_0
    without x_0, renormalised; later slots are drawn from the Markov-corrected distribution of
    the chain's own previous draft; greedy rows take the runner-up chain."""
    engine, cluster = create_engine(engine_config(dspark_files["target"], dspark_files["random"], "static",
                                                  page_size=1))
    try:
        drafter = engine.runner.draft.drafter
        anchors = torch.tensor([4, 6, 9, 200])
        out = engine.runner.draft.forward(DraftStepInput(anchors.tolist(), [0] * 4, [[]] * 4), 1)
        temps = torch.tensor([1.0, 1.0, 0.0, 1.5])
        gen = torch.Generator().manual_seed(0)
        for trial in range(5):
            block = drafter.sample_block(out, anchors, temps, uniforms=torch.rand(4, out.logits.shape[1], generator=gen))
            tokens, probs = drafter.sampled_second_chain(out, anchors, block, temps, torch.rand(4, 3, generator=gen), 3)
            assert tokens.shape == (4, 3) and probs.shape[:2] == (4, 3)
            assert (tokens[:, 0] != block.tokens[:, 0]).all()
            rest = block.probs[:, 0].scatter(1, block.tokens[:, :1], 0.0)
            sampled = temps > 0
            torch.testing.assert_close(probs[sampled, 0], rest[sampled] / rest[sampled].sum(-1, keepdim=True))
            torch.testing.assert_close(probs.sum(-1), torch.ones(4, 3))
            assert (probs.gather(-1, tokens[..., None]) > 0).all()  # each draft from its own row
        greedy_chain = drafter.second_chain(out, anchors, 3)
        assert tokens[2].tolist() == greedy_chain[2].tolist()
    finally:
        cluster.stop(engine)


@pytest.mark.parametrize("burst", ["0", "3"])
def test_second_chain_under_tensor_parallelism(dspark_files, decoy_drafter, plain, monkeypatch, burst):
    monkeypatch.setenv("SGLAUNCH_DSPARK_BURST", burst)
    monkeypatch.setenv(ENV, "2")
    config = engine_config(dspark_files["target"], decoy_drafter[0], "static", page_size=1, tp_size=2)
    assert generate_batch(config, BATCH, greedy(24)) == plain


@pytest.mark.parametrize("radix", [True, False])
def test_bursts_verify_the_second_chain(dspark_files, decoy_drafter, plain, monkeypatch, radix):
    """Bursts (SGLAUNCH_DSPARK_BURST=3) with a second chain: each iteration also verifies the
    runner-up chain of gamma drafts; where it wins, the device swaps its slots into the burst's
    table and the host replays the swaps on the request's pages before committing. Plain greedy
    output; the chain wins; nothing left reserved."""
    monkeypatch.setenv("SGLAUNCH_DSPARK_BURST", "3")
    config = engine_config(dspark_files["target"], decoy_drafter[0], "static", page_size=1,
                           disable_radix_cache=not radix)
    figures = {}
    for chain in ("0", "3"):
        monkeypatch.setenv(ENV, chain)
        engine, cluster = create_engine(config)
        try:
            assert engine.runner.burst.uses_second_chain(1, 64) == (chain != "0")
            # bursts of more than SECOND_CHAIN_MAX_BATCH requests run one chain (measured slower with two)
            assert not engine.runner.burst.uses_second_chain(SECOND_CHAIN_MAX_BATCH + 1, 64)
            out = run(engine, make_requests(BATCH[:SECOND_CHAIN_MAX_BATCH], "b", greedy(24)))
            assert engine.runner.burst.bursts > 0
            assert engine.allocator.num_used == (engine.scheduler.radix.cached_pages if radix else 0)
            figures[chain] = engine.spec.stats.to_dict()
        finally:
            cluster.stop(engine)
        assert [out[f"b-{i}"][0] for i in range(SECOND_CHAIN_MAX_BATCH)] == plain[:SECOND_CHAIN_MAX_BATCH]
    assert figures["0"]["second_chains"] == 0
    assert figures["3"]["second_chains"] > 0 and figures["3"]["second_chain_wins"] > 0
    assert figures["3"]["mean_accept_length"] > figures["0"]["mean_accept_length"] + 0.2


def test_burst_result_replays_the_swaps():
    """BurstResult.swap_second_pages: per iteration, where the chain won, the anchor's and the
    accepted drafts' pages trade places with the chain's, from the position the iteration began."""
    from array import array

    from sglaunch.speculative.burst import BurstResult

    result = BurstResult(accepted=[[1], [0], [2]], tokens=[[]], logprobs=[[]], second_won=[[True], [False], [True]])
    pages, second = array("i", range(100, 112)), [1, 2, 3, 4]
    result.swap_second_pages(0, 3, pages, second)
    # iteration 0 at position 3 (anchor + 1 draft): 3, 4 take 1, 2; iteration 1 at 5 (lost);
    # iteration 2 at 6 (anchor + 2 drafts): 6, 7, 8 take what the chain holds then (103, 104, 3)
    assert list(pages) == [100, 101, 102, 1, 2, 105, 103, 104, 3, 109, 110, 111]
    assert second == [106, 107, 108, 4]


@pytest.mark.parametrize("drafter_kind", ["decoy", "random"])
def test_two_chains_in_one_loop_equal_the_separate_samplers(dspark_files, decoy_drafter, drafter_kind):
    """DSparkDrafter.greedy_two_chains (what a burst runs) == greedy_block + second_chain(gamma)."""
    path = decoy_drafter[0] if drafter_kind == "decoy" else dspark_files["random"]
    engine, cluster = create_engine(engine_config(dspark_files["target"], path, "static", page_size=1))
    try:
        runner = engine.runner.draft
        anchors = [4, 6, 9, 200]
        out = runner.forward(DraftStepInput(anchors, [0] * 4, [[]] * 4), 1)
        anchor_tensor = torch.tensor(anchors)
        block, second = runner.drafter.greedy_two_chains(out, anchor_tensor)
        single = runner.drafter.greedy_block(out, anchor_tensor)
        assert block.tokens.tolist() == single.tokens.tolist()
        torch.testing.assert_close(block.conf_logits, single.conf_logits)
        assert second.tolist() == runner.drafter.second_chain(out, anchor_tensor, second.shape[1]).tolist()
    finally:
        cluster.stop(engine)


def test_bursts_with_and_without_the_chain_on_one_engine(dspark_files, decoy_drafter, plain, monkeypatch):
    """A burst of more requests than SECOND_CHAIN_MAX_BATCH (one chain) after bursts that verified
    the chain: the one-chain burst must not read the earlier bursts' win flags (its result rows
    share their buffer), and both batches stay plain greedy."""
    monkeypatch.setenv("SGLAUNCH_DSPARK_BURST", "3")
    monkeypatch.setenv(ENV, "3")
    config = engine_config(dspark_files["target"], decoy_drafter[0], "static", page_size=1, disable_radix_cache=True)
    engine, cluster = create_engine(config)
    try:
        small = run(engine, make_requests(BATCH[:2], "s", greedy(24)))
        wins = engine.spec.stats.to_dict()["second_chain_wins"]
        assert wins > 0
        full = run(engine, make_requests(BATCH, "f", greedy(24)))
        assert engine.allocator.num_used == 0
    finally:
        cluster.stop(engine)
    assert [small[f"s-{i}"][0] for i in range(2)] == plain[:2]
    assert [full[f"f-{i}"][0] for i in range(len(BATCH))] == plain


def test_a_failed_burst_launch_gives_the_chains_pages_back(dspark_files, decoy_drafter, monkeypatch):
    """A burst whose launch raises: the second chain's pages go back with the failure, and once
    its requests are failed the pool is empty."""
    monkeypatch.setenv("SGLAUNCH_DSPARK_BURST", "3")
    monkeypatch.setenv(ENV, "3")
    config = engine_config(dspark_files["target"], decoy_drafter[0], "static", page_size=1, disable_radix_cache=True)
    engine, cluster = create_engine(config)
    try:
        for r in make_requests(BATCH[:2], "x", greedy(24)):
            engine.add_request(r)
        engine.step()  # the prefill

        def broken(*args, **kwargs):
            raise RuntimeError("launch failed")

        monkeypatch.setattr(engine.runner, "launch_burst", broken)
        with pytest.raises(RuntimeError, match="launch failed"):
            engine.step()
        outs = engine.fail_running(RuntimeError("launch failed"))
        assert {o.rid for o in outs} == {"x-0", "x-1"} and all(o.error for o in outs)
        assert engine.allocator.num_used == 0
    finally:
        cluster.stop(engine)


def test_synchronous_steps_of_many_requests_verify_one_chain(dspark_files, decoy_drafter, plain, monkeypatch):
    """Steps with more than SECOND_CHAIN_MAX_BATCH speculating requests verify no second chain;
    the smaller steps of the same run (requests finishing at different lengths) still do."""
    monkeypatch.setenv(ENV, "3")
    config = engine_config(dspark_files["target"], decoy_drafter[0], "static", page_size=1)
    engine, cluster = create_engine(config)
    windows = []
    propose = engine.spec.propose

    def logged(chunks, *args, **kwargs):
        proposal = propose(chunks, *args, **kwargs)
        windows.append((len(chunks), sum(1 for n in (proposal.second_lens or []) if n)))
        return proposal

    engine.spec.propose = logged
    try:
        # max_new_tokens 3 .. 33 by request (make_requests): the batch shrinks as requests end
        out = run(engine, make_requests(BATCH, "m"))
    finally:
        cluster.stop(engine)
    assert all(n == 0 for size, n in windows if size > SECOND_CHAIN_MAX_BATCH)
    assert any(size > SECOND_CHAIN_MAX_BATCH for size, _ in windows)
    assert any(n > 0 for size, n in windows if size <= SECOND_CHAIN_MAX_BATCH)
    for i in range(len(BATCH)):  # plain greedy: a prefix of the 24-token plain output
        tokens = out[f"m-{i}"][0]
        assert len(tokens) == 3 + (7 * i) % 31
        assert tokens[:24] == plain[i][: len(tokens)]


def test_sampled_step_reads_each_uniform_once(dspark_files, decoy_drafter, monkeypatch):
    """The decoder's layout of a sampled step's uniforms (DSparkDecoder._uniforms: the block's G
    draws, its G tests, the correction draw, then a sampled chain's S draws and its S tests): every
    sampled row's block draws, chain draws, tests, correction draw and chain tests are distinct
    columns of that row, and together they are all of its columns. A slice off by one (a chain
    drawn from the block's first test uniform) passes the lossless and equal-tokens tests above,
    because the graph and the eager drafter read the same slice."""
    from sglaunch.speculative.decoder import DSparkDecoder
    from sglaunch.speculative.drafter import DSparkDrafter

    monkeypatch.setenv(ENV, "3")
    monkeypatch.setenv(SAMPLED, "3")
    seen = {}
    checked = []
    real_block, real_chain, real_propose = (DSparkDrafter.sample_block, DSparkDrafter.sampled_second_chain,
                                            DSparkDecoder._propose)

    def block(self, *a, **k):
        seen["draw"] = k["uniforms"]
        return real_block(self, *a, **k)

    def chain(self, out, anchors, blk, temps, uniforms, length):
        seen["chain draw"] = uniforms
        return real_chain(self, out, anchors, blk, temps, uniforms, length)

    def propose(self, chunks, out, greedy, temps, host_u, *a, **k):
        seen.clear()
        proposal = real_propose(self, chunks, out, greedy, temps, host_u, *a, **k)
        if host_u is None or proposal.second_uniforms is None:
            return proposal
        S = proposal.second_uniforms.shape[1]
        assert host_u.shape[1] == 2 * self.gamma + 1 + 2 * S and seen["chain draw"].shape[1] == S
        parts = {"draw": seen["draw"], "test": proposal.accept_uniforms, "correction": proposal.sample_uniforms[:, None],
                 "chain draw": seen["chain draw"], "chain test": proposal.second_uniforms}
        for r, g in enumerate(greedy):
            if g:
                continue
            row, columns = host_u[r], {}
            for name, u in parts.items():
                hits = (u[r].cpu()[:, None] == row[None, :]).nonzero()
                assert len(hits) == u.shape[1], (name, u[r], row)  # each value is one column of the row
                columns[name] = set(hits[:, 1].tolist())
            taken = [c for cols in columns.values() for c in cols]
            assert len(taken) == len(set(taken)) == row.numel(), columns
            checked.append(r)
        return proposal

    monkeypatch.setattr(DSparkDrafter, "sample_block", block)
    monkeypatch.setattr(DSparkDrafter, "sampled_second_chain", chain)
    monkeypatch.setattr(DSparkDecoder, "_propose", propose)
    config = engine_config(dspark_files["target"], decoy_drafter[0], "compact", sps=dspark_files["sps"], page_size=1)
    _, stats = sampled_run(config, BATCH[:SECOND_CHAIN_MAX_BATCH], "u", 90)
    assert stats["second_chains"] > 0 and len(checked) > 0


def test_plain_rows_read_the_second_chains_with_the_greedy_choices(dspark_files, decoy_drafter, plain, monkeypatch):
    """An all-greedy step whose plain rows (a request at its length cap, a prefill) are sampled
    before the accept reads the verified second chains in the same copy as the greedy choices
    (engine._sample passes them to ModelRunner.greedy_host, which keeps the copy for the accept):
    no step reads them again (on CUDA that second copy is a synchronising read, session 35's GPU
    sync tests), and the output is still plain greedy decoding's."""
    from sglaunch.engine.model_runner import ModelRunner

    monkeypatch.setenv(ENV, "3")
    config = engine_config(dspark_files["target"], decoy_drafter[0], "compact", sps=dspark_files["sps"], page_size=1)
    seen = {"merged": 0, "reused": 0, "second copy": 0}
    real = ModelRunner.greedy_host

    def watched(self, logit_rows, extra=None):
        if extra is not None and self.step_greedy is not None:
            if self._greedy_read is None:
                seen["merged"] += 1
            elif self._extra_read is not None and self._extra_read[0] is extra:
                seen["reused"] += 1
            else:
                seen["second copy"] += 1
        return real(self, logit_rows, extra)

    monkeypatch.setattr(ModelRunner, "greedy_host", watched)
    small = BATCH[:SECOND_CHAIN_MAX_BATCH]
    tokens, _, stats = run_checked(config, small)
    assert tokens == plain[: len(small)]
    assert stats["second_chains"] > 0
    assert seen["reused"] > 0 and seen["second copy"] == 0, seen
