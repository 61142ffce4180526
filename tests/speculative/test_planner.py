"""Planner: Algorithm 1, the production budget + top-K, value-independent tie-breaks, no-table
behaviour, SPS table interpolation/monotone forcing, the lag relay, and the paper's App. A
counter-example (a retrospective argmax turns a (0.7, 0.3) target into (0.85, 0.15))."""

from __future__ import annotations

import json

import pytest
import torch

from sglaunch.kernels.dspark_topk import topk_windows_reference
from sglaunch.speculative.accept import accept_draft
from sglaunch.speculative.planner import ConfidenceRelay, DSparkPlanner, choose_budget, greedy_admission
from sglaunch.speculative.sps import SpsTable, load_sps_table

FLAT = SpsTable.from_points({1: 100.0, 64: 100.0})  # every extra token looks free: verify all


def test_sps_step_linear_extrapolation_and_monotone(tmp_path):
    table = SpsTable.from_points({1: 100.0, 8: 80.0, 16: 50.0})
    assert [table.sps(t) for t in (1, 5, 8, 9, 16)] == [100.0, 80.0, 80.0, 50.0, 50.0]
    assert table.sps(32) == pytest.approx(1 / (0.02 + 16 * (0.02 - 0.0125) / 8))
    linear = SpsTable.from_points({1: 100.0, 8: 80.0, 16: 50.0}, "linear")
    assert linear.sps(12) == pytest.approx(1 / (0.0125 + 0.5 * 0.0075))
    assert SpsTable.from_points({1: 50.0, 4: 60.0, 2: 55.0}).steps_per_second == (50.0, 50.0, 50.0)
    (tmp_path / "t.json").write_text(json.dumps({"points": [{"tokens": 8, "steps_per_second": 80},
                                                            {"tokens": 1, "steps_per_second": 100}]}))
    assert load_sps_table(tmp_path / "t.json").tokens == (1, 8)
    (tmp_path / "c.json").write_text(json.dumps({"tokens": [1, 2], "steps_per_second": [3.0, 2.0],
                                                 "interpolation": "linear"}))
    assert load_sps_table(tmp_path / "c.json").interpolation == "linear"
    (tmp_path / "bad.json").write_text(json.dumps({"points": [{"tokens": 0, "steps_per_second": 1}]}))
    with pytest.raises(ValueError, match="tokens >= 1"):
        load_sps_table(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="does not exist"):
        load_sps_table(tmp_path / "none.json")


def test_draft_costs_interpolate_force_monotone_and_round_trip(tmp_path):
    table = SpsTable.from_points({1: 100.0, 8: 80.0}).with_draft_costs({1: 0.004, 4: 0.010, 2: 0.003, 16: 0.012})
    assert table.draft_requests == (1, 2, 4, 16)
    assert table.draft_seconds_at == (0.004, 0.004, 0.010, 0.012)  # running maximum: 2 costs what 1 does
    assert table.draft_seconds(3) == pytest.approx(0.007) and table.draft_seconds(100) == 0.012
    assert table.draft_seconds(1) == table.draft_seconds(0) == 0.004
    assert table.step_seconds(8, 4) == pytest.approx(1 / 80 + 0.010)
    assert SpsTable.from_points({1: 100.0}).step_seconds(1, 50) == pytest.approx(0.01)  # no points: no term
    from sglaunch.speculative.sps import save_sps_table
    save_sps_table(table, tmp_path / "d.json")
    assert load_sps_table(tmp_path / "d.json") == table
    (tmp_path / "bad.json").write_text(json.dumps({"points": [{"tokens": 1, "steps_per_second": 1}],
                                                   "draft_points": [{"requests": 1}]}))
    with pytest.raises(ValueError, match="draft_points"):
        load_sps_table(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="requests >= 1"):
        table.with_draft_costs({0: 0.1})


def test_a_costly_draft_stage_makes_extra_verify_tokens_worth_more():
    """A step pays its draft stage whatever it verifies: with that cost in the step time, the
    relative price of the extra verify tokens falls and the budget grows."""
    verify_only = SpsTable.from_points({1: 1 / 0.020, 4: 1 / 0.022, 8: 1 / 0.030})
    with_draft = verify_only.with_draft_costs({1: 0.015})
    lagged = [0.8, 0.6, 0.45, 0.3, 0.2, 0.12, 0.08]
    k_verify_only = choose_budget(lagged, 1, verify_only)
    k_with_draft = choose_budget(lagged, 1, with_draft)
    # verify-only: 1 + 0.8 + 0.6 + 0.45 = 2.85 tokens in 22 ms beats 3.55 in 30 ms; with the 15 ms
    # draft stage in both, 3.55 / 45 ms beats 2.85 / 37 ms
    assert (k_verify_only, k_with_draft) == (3, 7)
    # Algorithm 1 stops at the first non-improvement: the 4th draft opens the 30 ms tier either way
    assert greedy_admission([lagged], verify_only) == greedy_admission([lagged], with_draft) == [3]


def test_algorithm1_admits_by_survival_and_stops_at_first_non_improvement():
    sps = SpsTable.from_points({1: 100.0, 2: 100.0, 3: 100.0, 4: 60.0, 5: 60.0})
    surv = [[0.9, 0.8, 0.1], [0.95, 0.2, 0.1]]
    # B=2 tau=2 -> +0.95 (B3, 100) -> +0.9 (B4, 60: 3.85*60 < 2.95*100) stop
    assert greedy_admission(surv, sps) == [0, 1]
    assert greedy_admission(surv, None) == [3, 3]  # no table: verify everything
    assert greedy_admission(surv, FLAT) == [3, 3]


def test_tie_breaks_are_position_then_request_and_deterministic():
    surv = torch.full((3, 4), 0.5)
    assert topk_windows_reference(surv, torch.ones(3, dtype=torch.bool), 5).tolist() == [2, 2, 1]
    assert greedy_admission(surv.tolist(), FLAT) == [4, 4, 4]
    steep = SpsTable.from_points({3: 100.0, 4: 90.0, 5: 80.0, 6: 70.0, 7: 30.0})
    # theta: 300, 315, 320, then 4.5 * 70 = 315 stops: ties go to request 0, then 1
    assert greedy_admission([[0.5] * 4] * 3, steep) == [1, 1, 0]
    for _ in range(3):
        assert topk_windows_reference(surv, torch.tensor([True, False, True]), 3).tolist() == [2, 0, 1]


def test_budget_is_a_global_argmax_over_a_staircase():
    # tiers: up to 4 tokens same cost, 5..8 cost 1.6x; first-descent would stop at 2 requests + 2
    sps = SpsTable.from_points({4: 100.0, 8: 62.0})
    lagged = [0.9, 0.9, 0.9, 0.9, 0.8, 0.8]
    k = choose_budget(lagged, num_requests=2, sps=sps)
    values = {kk: (2 + sum(sorted(lagged, reverse=True)[:kk])) * sps.sps(2 + kk) for kk in range(7)}
    assert k == max(values, key=lambda kk: (values[kk], -kk))
    assert choose_budget(lagged, 2, None) == 6
    assert choose_budget(lagged, 2, sps, extra_tokens=100) <= 6


def test_relay_serves_lagged_rows_by_request_identity():
    relay = ConfidenceRelay(block_size=2, lag=2)
    relay.push(["a", "b"], torch.tensor([[0.5, 0.25], [0.9, 0.8]]))
    assert relay.lagged(["a"]) == [[1.0, 1.0]]  # not 2 steps old yet: verify all
    relay.push(["a"], [[0.1, 0.1]])
    assert relay.lagged(["a", "b", "c"]) == [[0.5, 0.25], [pytest.approx(0.9), pytest.approx(0.8)], [1.0, 1.0]]
    relay.forget("a")
    assert relay.lagged(["a"]) == [[1.0, 1.0]]
    with pytest.raises(ValueError):
        ConfidenceRelay(2, lag=0)


def test_planner_modes_and_no_table():
    logits = torch.tensor([[3.0, 1.0, -2.0], [0.0, -1.0, -3.0]])
    static = DSparkPlanner(3, "static")
    assert static.budget(["a", "b"]) == 6
    assert static.allocate(logits, 6)[1].tolist() == [3, 3]
    compact = DSparkPlanner(3, "compact", sps=None, sts_temperatures=[1.0, 2.0, 1.0])
    assert compact.budget(["a", "b"]) == 6  # no table: verify everything
    surv, windows = compact.allocate(logits, 2)
    assert windows.tolist() == [2, 0] and surv[0, 1] == pytest.approx(torch.sigmoid(torch.tensor(3.0)) * torch.sigmoid(torch.tensor(0.5)))
    with pytest.raises(ValueError, match="confidence head"):
        DSparkPlanner(3, "compact", has_confidence_head=False)
    with pytest.raises(ValueError, match="temperatures"):
        DSparkPlanner(3, "cap-accept", sts_temperatures=[1.0])


# --------------------------------------------------------------------- App. A counter-example

A, B = 0, 1
P0 = torch.tensor([0.7, 0.3])  # target distribution of the first new token
Q0 = torch.tensor([0.5, 0.5])  # draft distribution of x_0
SPS_A = SpsTable.from_points({1: 1.0, 2: 0.6, 3: 0.6})


def survivals_given(x0: int) -> list[float]:
    c1 = 1.0 if x0 == A else 0.1  # confidence of slot 1 depends on the drafted x_0
    return [0.5, 0.5 * c1]


def retrospective_argmax(surv: list[float]) -> int:
    """The WRONG planner: pick the best prefix after seeing every survival."""
    scores = [(1 + sum(surv[:L])) * SPS_A.sps(1 + L) for L in range(len(surv) + 1)]
    return max(range(len(scores)), key=lambda L: scores[L])


def first_token_frequency(policy, n: int = 200_000) -> float:
    g = torch.Generator().manual_seed(0)
    x0 = (torch.rand(n, generator=g) >= Q0[A]).long()  # ~ Q0
    lens = torch.tensor([policy(survivals_given(int(x))) for x in (A, B)])[x0]
    draft = torch.stack([x0, torch.zeros_like(x0)], 1)
    q = torch.stack([Q0, torch.tensor([0.5, 0.5])])[None].expand(n, 2, 2)
    target = torch.stack([P0, torch.tensor([0.5, 0.5]), torch.tensor([0.5, 0.5])])  # rows P_0, P_1, P_2
    res = accept_draft(draft, q, target, torch.zeros(n, dtype=torch.long), lens, torch.zeros(n, dtype=torch.bool),
                       torch.rand(n, 2, generator=g), torch.rand(n, generator=g))
    first = torch.where(res.num_accepted > 0, x0, res.next_token)
    return float((first == A).float().mean())


def test_retrospective_argmax_biases_the_output():
    assert retrospective_argmax(survivals_given(A)) == 2 and retrospective_argmax(survivals_given(B)) == 0
    assert first_token_frequency(retrospective_argmax) == pytest.approx(0.85, abs=0.005)


def test_algorithm1_and_production_planner_stay_lossless():
    sigma = (0.7 * 0.3 / 200_000) ** 0.5
    algo1 = lambda surv: greedy_admission([surv], SPS_A)[0]  # noqa: E731
    assert abs(first_token_frequency(algo1) - 0.7) < 5 * sigma
    for lagged in ([1.0, 1.0], [0.5, 0.05], [0.5, 0.5]):  # budget from earlier steps only
        budget = choose_budget(lagged, 1, SPS_A)
        prod = lambda surv: int(topk_windows_reference(torch.tensor([surv]), torch.tensor([True]), budget)[0])  # noqa: E731
        assert abs(first_token_frequency(prod) - 0.7) < 5 * sigma


def test_plan_drafts_budget_is_the_one_budget_gives_known_requests_or_not():
    """plan_drafts reuses its own K when every request has lagged survivals (the same inputs as
    budget()), and asks budget() (unknown requests at 1.0) otherwise: either way the K budget()
    gives, and the memoised step costs are the table's."""
    import random

    from sglaunch.speculative.planner import DSparkPlanner, drafting_pays
    from sglaunch.speculative.sps import SpsTable

    table = SpsTable.from_points({1: 700.0, 8: 620.0, 64: 560.0, 256: 400.0}).with_draft_costs(
        {1: 0.0004, 64: 0.0009}).with_decode_costs({1: 0.0015, 64: 0.0021})
    rng = random.Random(5)
    for trial in range(20):
        planner = DSparkPlanner(7, "compact", table, None, 2, has_confidence_head=True, step_aside=True)
        known = [f"k{i}" for i in range(rng.randint(1, 40))]
        for _ in range(2):
            planner.observe(known, [[rng.random() ** 0.3 for _ in range(7)] for _ in known])
        rids = known + ([f"new{trial}"] if trial % 2 else [])
        got = planner.plan_drafts(rids, 0)
        lagged = [a for row in planner.relay.lagged(rids, planner.prior) for a in row]
        pays = drafting_pays(lagged, len(rids), table, 0)
        assert got == (planner.budget(rids, 0) or None if pays is not None else None)
    assert table.step_seconds(37, 5) == 1.0 / table.sps(37) + table.draft_seconds(5)


def test_a_stepping_aside_streak_asks_the_memo_and_gets_what_drafting_pays_says():
    """With no lagged survivals (every step stepped aside) the decision comes from a memo per
    (requests, extra tokens): the same answer drafting_pays gives for every request at the
    prior, across new priors (observed bursts), other tables and both step-cost scales."""
    import numpy as np

    from sglaunch.speculative.planner import drafting_pays

    cheap = SpsTable.from_points({1: 700.0, 8: 620.0, 64: 560.0, 256: 400.0}).with_draft_costs(
        {1: 0.0002, 64: 0.0003}).with_decode_costs({1: 0.0015, 64: 0.0021})
    dear = cheap.with_draft_costs({1: 0.004, 64: 0.009})
    planner = DSparkPlanner(7, "compact", cheap, None, 2, has_confidence_head=True, step_aside=True,
                            start_prior=[0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3])
    planner.calibration = None  # the scales stay 1.0: the comparison below is drafting_pays's own
    seen = set()
    for step, (R, extra) in enumerate([(1, 0), (64, 0), (64, 0), (8, 3), (64, 0), (40, 0), (64, 0), (1, 0)] * 3):
        if step == 9:
            planner.observe_accepts([[0] * 64] * 8)  # a bad patch: the prior falls, the memo with it
        if step == 17:
            planner.sps = dear
        rids = [f"r{i}" for i in range(R)]
        assert not planner.relay.has_lagged()
        got = planner.plan_drafts(rids, extra)
        want = drafting_pays(np.tile(np.asarray(planner.prior), R), R, planner.sps, extra)
        assert (got is None) == (want is None), (step, R, extra)
        seen.add(got is None)
    assert seen == {True, False}  # both decisions were exercised
    planner.observe([f"r{i}" for i in range(4)], [[0.9] * 7] * 4)
    planner.observe([f"r{i}" for i in range(4)], [[0.9] * 7] * 4)
    assert planner.relay.has_lagged()  # survivals of their own: the memo is not asked


# ---- the confidences checked against outcomes (AcceptCalibration) ----------------------------
STEP_ASIDE_TABLE = SpsTable.from_points({1: 700.0, 8: 620.0, 64: 560.0, 256: 400.0}).with_draft_costs(
    {1: 0.0004, 64: 0.0009}).with_decode_costs({1: 0.0015, 64: 0.0021})


def _drafting_step(planner, rids, rows, accepted):
    """One drafting step as the decoder runs it: survivals observed, then the verified outcome."""
    planner.observe(rids, rows)
    planner.observe_outcome(rids, [7] * len(rids), accepted)


def test_overconfident_drafter_is_priced_at_what_the_target_accepts_and_steps_aside():
    """A drafter that states 0.9 survival everywhere while the target accepts nothing (session 18:
    the bundled drafter on random target weights drafted 22% of its steps at 64 requests, 0.87x of
    plain): drafting pays on its word, and stops paying once its outcomes are in."""
    rids = [f"r{i}" for i in range(64)]
    rows = [[0.9 ** (j + 1) for j in range(7)] for _ in rids]
    planner = DSparkPlanner(7, "compact", STEP_ASIDE_TABLE, None, 2, has_confidence_head=True, step_aside=True,
                            start_prior=[0.9 ** (j + 1) for j in range(7)])
    planner.calibration = None
    planner.observe(rids, rows)
    planner.observe(rids, rows)
    assert planner.plan_drafts(rids, 0) is not None  # its word alone: drafting pays
    assert not planner.drafter_failing()
    for _ in range(10):
        _drafting_step(planner, rids, rows, [0] * 64)
    f = planner.accepts.factors()
    assert f is not None and max(f) < 0.1
    assert planner.drafter_failing()  # the engine may skip its context at any batch size
    assert planner.plan_drafts(rids, 0) is None  # its outcomes: step aside
    priced = planner.priced_prior
    assert 1.0 + sum(priced) < 1.5 < 1.0 + sum(planner.prior)  # the burst's accept estimate follows
    assert all(a >= b for a, b in zip(priced, priced[1:]))  # still a survival: non-increasing
    # new requests too: they are priced at the (calibrated) prior
    assert planner.plan_drafts([f"n{i}" for i in range(64)], 0) is None


def test_a_drafter_that_says_it_fails_is_failing():
    """H100, session 22: the bundled drafter on random target weights stated survivals near 0, so
    its planner stepped aside everywhere and no outcome ever moved a factor off 1. Its observed
    prior, priced under FAILING_ACCEPT, makes it failing too; the starting guess alone never does,
    and a prior back over the line clears it."""
    from sglaunch.speculative.planner import FAILING_ACCEPT

    rids = [f"r{i}" for i in range(8)]
    planner = DSparkPlanner(7, "compact", STEP_ASIDE_TABLE, None, 2, has_confidence_head=True, step_aside=True,
                            start_prior=[0.01] * 7)
    planner.calibration = None
    assert 1.0 + sum(planner.prior) < FAILING_ACCEPT
    assert not planner.drafter_failing()  # a starting guess is no observation
    planner.observe(rids, [[0.01] * 7 for _ in rids])
    assert planner.accepts.factors() is None  # nothing verified: the confidence check sees nothing
    assert planner.drafter_failing()
    assert planner.plan_drafts(rids, 0) is None  # and the planner steps aside for it anyway
    for _ in range(40):  # confident drafts again: the prior climbs back over the line
        planner.observe(rids, [[0.9 ** (j + 1) for j in range(7)] for _ in rids])
    assert 1.0 + sum(planner.priced_prior) > FAILING_ACCEPT and not planner.drafter_failing()
    planner.reset_prior()
    assert not planner.drafter_failing()


def test_a_calibrated_drafter_is_left_as_it_is():
    """Outcomes drawn from the stated survivals keep every factor near 1, and the prices with them."""
    import random

    rng = random.Random(7)
    planner = DSparkPlanner(7, "compact", STEP_ASIDE_TABLE, None, 2, has_confidence_head=True, step_aside=True)
    surv = [0.85 ** (j + 1) for j in range(7)]
    rids = [f"r{i}" for i in range(32)]
    for _ in range(200):
        accepted = []
        for _ in rids:  # slot j survives with probability surv[j] given slot j - 1 did
            n = 0
            while n < 7 and rng.random() < surv[n] / (surv[n - 1] if n else 1.0):
                n += 1
            accepted.append(n)
        _drafting_step(planner, rids, [surv] * len(rids), accepted)
    f = planner.accepts.factors() or [1.0] * 7
    assert all(abs(x - 1.0) < 0.12 for x in f), f
    assert not planner.drafter_failing()
    assert sum(planner.priced_prior) == pytest.approx(sum(planner.prior), rel=0.1)


def test_only_verified_slots_count_and_ids_must_match():
    """A slot past a request's window says nothing of the drafter; an outcome whose requests are
    not the last observed step's is not paired with it."""
    from sglaunch.speculative.planner import AcceptCalibration

    cal = AcceptCalibration(4)
    for _ in range(100):  # windows of 2: slots 0-1 always accepted, slots 2-3 never verified
        cal.observe([[0.25, 0.25, 0.25, 0.25]] * 8, [2] * 8, [2] * 8)
    f = cal.factors()
    assert f[0] == pytest.approx(2.0) and f[1] == pytest.approx(2.0)  # underconfident (4x), capped at 2
    assert f[2] == 1.0 and f[3] == 1.0
    out = cal.apply([0.5, 0.5, 0.5, 0.5, 0.3, 0.2, 0.1, 0.0])
    assert out == [1.0, 1.0, 0.5, 0.5, 0.6, 0.4, 0.1, 0.0]
    planner = DSparkPlanner(4, "compact", STEP_ASIDE_TABLE, None, 2, has_confidence_head=True)
    planner.observe(["a", "b"], [[0.9] * 4] * 2)
    planner.observe_outcome(["b", "a"], [4, 4], [0, 0])  # not the observed step's requests
    assert planner.accepts.outcomes == 0
    planner.observe(["a", "b"], [[0.9] * 4] * 2)
    planner.observe_outcome(["a", "b"], [4, 4], [0, 0])
    planner.observe_outcome(["a", "b"], [4, 4], [0, 0])  # the same step twice: counted once
    assert planner.accepts.outcomes == 2


def test_stepping_aside_drifts_the_calibration_back_so_a_bad_patch_does_not_last():
    """Once aside, nothing is verified; every EXPLORE_EVERY stepped-aside steps the factors move
    back toward 1, until drafting pays again and is checked again. A profile's reset forgets them."""
    from sglaunch.speculative.planner import EXPLORE_EVERY

    rids = [f"r{i}" for i in range(64)]
    rows = [[0.9 ** (j + 1) for j in range(7)] for _ in rids]
    planner = DSparkPlanner(7, "compact", STEP_ASIDE_TABLE, None, 2, has_confidence_head=True, step_aside=True,
                            start_prior=rows[0])
    planner.calibration = None
    for _ in range(6):
        _drafting_step(planner, rids, rows, [0] * 64)
    low = planner.accepts.factors()[0]
    steps = 0
    while planner.plan_drafts(rids, 0) is None:
        planner.skip_step()
        steps += 1
        assert steps < 40 * EXPLORE_EVERY, "stuck aside"
    assert steps >= EXPLORE_EVERY and planner.accepts.factors()[0] > low
    assert planner.drafter_failing()  # drafting pays again before the factor is back over FAILING_FACTOR
    while planner.drafter_failing():  # ...and it gets there: a stepped-aside step writes the context again
        planner.skip_step()
        steps += 1
        assert steps < 40 * EXPLORE_EVERY, "failing for good"
    planner.reset_prior()
    assert planner.accepts.factors() is None and planner.accepts.outcomes == 0


def test_burst_outcomes_enter_the_prior_in_the_drafters_units():
    """observe_accepts folds realised survivals into the prior, which is priced through the
    calibration: so they go in divided by its factors (at most 1), and come out priced as observed."""
    planner = DSparkPlanner(4, "compact", STEP_ASIDE_TABLE, None, 2, has_confidence_head=True)
    planner.start_prior = None
    planner.reset_prior()
    rids = [f"r{i}" for i in range(8)]
    for _ in range(50):  # stated 0.8, accepted a quarter as often
        planner.observe(rids, [[0.8] * 4] * 8)
        planner.observe_outcome(rids, [4] * 8, [4, 0, 0, 0] * 2)
    f = planner.accepts.factors()
    assert f is not None and 0.35 < f[0] < 0.5  # the ratio 0.31 past the tolerance of 0.75
    planner._prior_weight, planner.prior = 0, [1.0] * 4
    planner.observe_accepts([[1, 0, 0, 0] * 4])  # a quarter of the requests kept slot 0, none slot 1
    priced = planner.priced_prior
    assert priced[0] == pytest.approx(0.25) and priced[1] == pytest.approx(0.0)


def test_a_ratio_near_one_is_left_alone():
    """Within the tolerance the drafter's word stands (the selected drafts read a little under 1
    even for a sound drafter); past it the factor moves continuously."""
    from sglaunch.speculative.planner import CALIBRATION_TOLERANCE, AcceptCalibration, _tolerated

    assert _tolerated(0.9) == 1.0 and _tolerated(1.2) == 1.0
    assert _tolerated(CALIBRATION_TOLERANCE) == pytest.approx(1.0)
    assert _tolerated(CALIBRATION_TOLERANCE / 2) == pytest.approx(0.5) and _tolerated(0.0) == 0.0
    assert _tolerated(10.0) == 2.0
    cal = AcceptCalibration(2)
    for _ in range(50):
        cal.observe([[0.8, 0.6]] * 10, [2] * 10, [1] * 7 + [0] * 3)  # slot 0: 0.7 / 0.8; slot 1: 0
    f = cal.factors()
    assert f[0] == 1.0 and f[1] < 0.1  # (the start weight of 16 "as predicted" fades slowly)
