"""benchmarks/anchor_bias.py's served walk is what the engine serves: at T=0 in static mode, the
engine's accept length of every step of every request equals the walk's run + 1 (the last steps of
a request aside, where the token budget cuts the block). Prompts have at least 2 tokens: a 1-token
prompt's first step is itself a speculative block (anchored at the prompt's token, no context),
which the walk, anchored from the first generated token on, does not model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from dspark_helpers import engine_config, prompts

from sglaunch.engine.interface import GenerateRequest, SamplingParams
from sglaunch.engine.launch import create_engine

ROOT = Path(__file__).resolve().parents[2]
NEW_TOKENS = 40


def load_anchor_bias():
    spec = importlib.util.spec_from_file_location("bench_anchor_bias", ROOT / "benchmarks" / "anchor_bias.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def served_accept_lengths(target: Path, drafter: Path, batch: list[list[int]]) -> list[list[int]]:
    engine, cluster = create_engine(engine_config(target, drafter, "static"))
    lengths: dict[str, list[int]] = {str(i): [] for i in range(len(batch))}
    try:
        for i, ids in enumerate(batch):
            engine.add_request(GenerateRequest(str(i), tuple(ids), SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0)))
        while engine.has_work:
            for out in engine.step():
                if out.accept_length is not None:
                    lengths[out.rid].append(out.accept_length)
    finally:
        cluster.stop(engine)
    return [lengths[str(i)] for i in range(len(batch))]


@pytest.mark.parametrize("drafter", ["oracle", "random"])
def test_the_walk_is_what_the_engine_serves(dspark_files, drafter):
    batch = prompts(6, seed=3, lengths=(3, 7, 12, 20, 33))
    result = load_anchor_bias().measure(dspark_files["target"], dspark_files[drafter], [("k", p) for p in batch],
                                        NEW_TOKENS)
    served = served_accept_lengths(dspark_files["target"], dspark_files[drafter], batch)
    assert len(result["walks"]) == len(served)
    for walk, steps in zip(result["walks"], served):
        assert steps, "the engine served no speculative step"
        assert [n + 1 for n in walk[:len(steps) - 1]] == steps[:-1]
        assert len(walk) >= len(steps) and walk[len(steps) - 1] + 1 >= steps[-1]
    every = [n for walk in result["walks"] for n in walk]
    if drafter == "oracle":  # several drafts accepted per block, and rejections too: the walk is not trivial
        assert result["served_mean_accept_length"] > 2.0 and 0 in every
        assert result["slot0_rate_by_previous_block"]["rejection"][1] > 0
    after = result["after_rejection_slot0"]
    assert after["blocks"] == result["slot0_rate_by_previous_block"]["rejection"][1] > 0
    # slot 0's first choice is the target's token exactly where the walk's block accepted slot 0
    assert after["top1"] == pytest.approx(result["slot0_rate_by_previous_block"]["rejection"][0], abs=1e-4)
    assert after["top1"] <= after["top2"] <= after["top3"]


def test_branch_walks_take_the_second_chain_where_its_first_token_is_the_targets():
    """The walk with a second (third) chain at slot 0: where slot 0's second (third) choice is the
    target's token, the block's run is 1 + the teacher-forced leading hits of slots 1.. (if longer
    than the first chain's), and only where the confidence is below the threshold."""
    branch_walks = load_anchor_bias().branch_walks
    # one response of 9 tokens: per anchor 0..7 the first chain's run, 1 + the leading hits from slot 1,
    # the rank of the target's token among slot 0's choices, and slot 0's confidence
    runs = [0, 2, 0, 0, 1, 0, 4, 0]
    lead1 = [3, 1, 1, 2, 1, 1, 1, 1]
    rank0 = [2, 1, 3, 2, 1, 99, 1, 2]
    conf0 = [0.5, 0.9, 0.2, 0.9, 0.6, 0.1, 0.9, 0.1]
    out = branch_walks([("k", list(range(9)), runs, lead1, rank0, conf0)], 4)
    # without a second chain the walk is anchors 0, 1, 4, 6 (the last block cut to the response's end)
    assert out["top2_conf_below_0.4"]["mean_accept_length"] == pytest.approx((1 + 3 + 2 + 3) / 4)
    assert out["top2_conf_below_0.4"]["extra_chain_share"] == 0
    # with it at anchor 0 (rank 2): run 3, then anchors 4 and 6
    assert out["top2_always"]["mean_accept_length"] == pytest.approx((4 + 2 + 3) / 3)
    assert out["top2_always"]["extra_chain_share"] == 1.0
    # a second chain of 1 draft: anchor 0 gets run 1, then anchors 2 (rank 3: nothing), 3 (rank 2: run 1), 5, 6
    assert out["top2_len1_always"]["mean_accept_length"] == pytest.approx((2 + 1 + 2 + 1 + 3) / 5)
    assert out["top2_len4_always"] == out["top2_always"]  # G = 4: the whole block
    assert out["top2_conf_below_0.6"]["mean_accept_length"] == pytest.approx((4 + 2 + 3) / 3)
    assert out["top2_conf_below_0.6"]["extra_chain_share"] == pytest.approx(1 / 3, abs=1e-4)
    # a rank-3 token needs the third chain; anchor 2 is never visited here, so top-3 walks alike
    assert out["top3_always"] == out["top2_always"]
    # a rank-3 token needs the third chain: a 4-token response whose every anchor has it
    out2 = branch_walks([("k", list(range(4)), [0, 0, 0], [2, 2, 2], [3, 3, 3], [0.0] * 3)], 4)
    assert out2["top2_always"]["mean_accept_length"] == 1.0  # three blocks of the bonus token alone
    assert out2["top3_always"]["mean_accept_length"] == 3.0  # one block: 2 drafts + the bonus
