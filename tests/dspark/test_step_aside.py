"""DSpark steps aside where drafting does not pay: the planner prices a drafting step (verify +
DSpark's own work) against a plain decode step from the step-cost table and the lagged
survivals; when drafting loses, the step verifies nothing, the drafter does not run, and the
output is plain decoding's. Where drafting pays, the drafts run."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from dspark_helpers import GAMMA, engine_config, prompts
from sglaunch.engine.interface import GenerateRequest, SamplingParams
from sglaunch.engine.launch import create_engine
from sglaunch.speculative.planner import DSparkPlanner, drafting_pays
from sglaunch.speculative.sps import SpsTable, load_sps_table, save_sps_table
from test_engine_dspark import make_requests, run

FLAT = {1: 100.0, 8: 100.0, 16: 100.0, 32: 100.0, 64: 100.0, 128: 100.0}  # extra verify rows are free


def table(draft: dict[int, float], decode: dict[int, float] | None = None) -> SpsTable:
    return SpsTable.from_points(FLAT).with_draft_costs(draft).with_decode_costs(decode or {1: 0.01})


# ---- the decision (torch-free) ------------------------------------------------------------
def test_drafting_pays_only_where_the_table_says_so():
    confident = [0.9, 0.8, 0.7, 0.6] * 4  # 4 requests
    assert drafting_pays(confident, 4, table({1: 1e-4})) == 16  # cheap drafter, free rows: verify all
    assert drafting_pays(confident, 4, table({1: 10.0})) is None  # the drafter costs more than it gives
    # the same drafts, priced by batch size: cheap for up to 2 requests, then expensive
    by_batch = table({1: 1e-4, 2: 1e-4, 3: 0.05})
    assert drafting_pays(confident[:8], 2, by_batch) is not None
    assert drafting_pays(confident[:12], 3, by_batch) is None
    # hopeless drafts never pay, even with a free drafter
    assert drafting_pays([0.001] * 16, 4, table({1: 1e-4})) is None
    # a gain under MIN_DRAFT_GAIN (5%) steps aside: 1.6 tokens a step for 1.55x the plain step's cost
    marginal = table({1: 0.0055})
    assert drafting_pays([0.6, 0.0, 0.0, 0.0], 1, marginal) is None
    assert drafting_pays([0.6, 0.0, 0.0, 0.0], 1, marginal, min_gain=1.0) == 1


def test_the_other_rows_tokens_count_on_both_sides():
    """A candidate beside rows that commit a token either way (decodes that do not speculate): its
    drafts must pay for the whole batch's step. One candidate at survival 0.6 beside 60 such rows,
    with a drafter at a tenth of the step: alone it pays (1.6 tokens for 1.1 steps), with the 60
    rows' tokens counted on both sides it does not (61.6 against 61 tokens for 1.1 steps)."""
    cheap = table({1: 0.001})
    drafts = [0.6, 0.0, 0.0, 0.0]
    assert drafting_pays(drafts, 1, cheap, extra_tokens=60) == 1
    assert drafting_pays(drafts, 1, cheap, extra_tokens=60, committed_extra=60) is None
    # many candidates beside a few such rows: drafting still pays
    assert drafting_pays([0.9] * 32, 32, cheap, extra_tokens=4, committed_extra=4) is not None
    # the planner passes it through, with and without lagged survivals (the memo is keyed by it)
    planner = DSparkPlanner(4, "compact", cheap, lag_steps=1)
    assert planner.plan_drafts(["a"], 60) is not None
    assert planner.plan_drafts(["a"], 60, 60) is None


def test_a_second_chain_is_priced_on_the_drafting_side_only():
    """drafting_pays(chain=(rows, tokens)): a chain's rows make the drafting step dearer and its
    wins commit more, and the plain side sees neither. Rows that cost (SPS falls with tokens) make a
    marginal drafting step stand aside; the chain's measured gain makes one that did not pay, pay."""
    sloped = SpsTable.from_points({1: 100.0, 8: 90.0, 16: 50.0, 32: 25.0}).with_draft_costs(
        {1: 0.001}).with_decode_costs({1: 0.008})
    drafts = [0.7, 0.5, 0.3, 0.1, 0.0, 0.0, 0.0]
    assert drafting_pays(drafts, 1, sloped) is not None
    assert drafting_pays(drafts, 1, sloped, chain=(12, 0.0)) is None  # 12 costly rows, nothing won
    weak = [0.3, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert drafting_pays(weak, 1, sloped) is None
    assert drafting_pays(weak, 1, sloped, chain=(4, 0.6)) is not None  # its wins add 0.6 tokens a step
    # the plain side's price is the same whatever the chain: a chain whose rows cost nothing and win
    # nothing decides as no chain does
    free = table({1: 0.0055})
    assert drafting_pays([0.6, 0.0, 0.0, 0.0], 1, free, chain=(4, 0.0)) == drafting_pays([0.6, 0.0, 0.0, 0.0], 1, free)


def test_the_planner_prices_the_chains_it_measured():
    """DSparkPlanner: before a class has verified a chain, chains=True prices as before; then its
    measured rows and gained tokens per request (running means) price every drafting step of that
    class, on both the decision and the modelled step time the draft scale learns against. The
    greedy class's chain is priced only with price_greedy_chains (SGLAUNCH_DSPARK_PRICE_GREEDY_CHAIN)."""
    from sglaunch.speculative.planner import CHAIN_DECAY

    sloped = SpsTable.from_points({1: 100.0, 8: 90.0, 16: 50.0, 32: 25.0}).with_draft_costs(
        {1: 0.001, 4: 0.002}).with_decode_costs({1: 0.01, 4: 0.012})
    planner = DSparkPlanner(4, "compact", sloped, lag_steps=1)
    planner.observe(["a", "b"], [[0.9, 0.8, 0.7, 0.6], [0.9, 0.8, 0.7, 0.6]])
    k = planner.plan_drafts(["a", "b"], sampled=True, chains=True)
    assert k is not None and planner.chain_terms(2, True) == (0, 0.0)
    assert planner.calibration.pending == ("draft", sloped.step_seconds(2 + k, 2), True)
    planner.observe_chains(True, 2, rows=8, gained=1)  # two chains of 3 drafts (4 rows each), one won 1 token more
    assert planner.chain_measure[True] == (4.0, 0.5) and planner.chain_terms(2, True) == (8, 1.0)
    planner.observe_chains(True, 2, rows=0, gained=0)
    rows, tokens = planner.chain_measure[True]
    assert rows == pytest.approx(CHAIN_DECAY * 4.0) and tokens == pytest.approx(CHAIN_DECAY * 0.5)
    k = planner.plan_drafts(["a", "b"], sampled=True, chains=True)
    chain_rows = round(2 * rows)
    assert k is not None and planner.calibration.pending == ("draft", sloped.step_seconds(chain_rows + 2 + k, 2), True)
    # a step too large for chains (chains=False) is priced without them
    planner.plan_drafts(["a", "b"], sampled=True)
    assert planner.calibration.pending[1] == sloped.step_seconds(2 + planner.plan_drafts(["a", "b"], sampled=True), 2)
    # the greedy class: measured, but priced only when asked to
    planner.observe_chains(False, 2, rows=8, gained=2)
    assert planner.chain_terms(2, False) == (0, 0.0)
    planner.price_greedy_chains = True
    assert planner.chain_terms(2, False) == (8, 2.0)
    # a chain that costs rows and wins nothing turns a marginal drafting step aside
    p = DSparkPlanner(4, "compact", sloped, lag_steps=1)
    p.observe(["a"], [[0.6, 0.2, 0.0, 0.0]])
    assert p.plan_drafts(["a"], sampled=True, chains=True) is not None
    p.observe(["a"], [[0.6, 0.2, 0.0, 0.0]])
    p.observe_chains(True, 1, rows=16, gained=0)
    assert p.plan_drafts(["a"], sampled=True, chains=True) is None
    assert p.plan_drafts(["a"], sampled=True) is not None


def test_plain_steps_are_priced_by_decode_points_else_by_sps():
    t = table({1: 0.001}, {1: 0.004, 8: 0.008})
    assert t.plain_step_seconds(1) == pytest.approx(0.004)
    assert t.plain_step_seconds(4) == pytest.approx(0.004 + 3 / 7 * 0.004)
    assert t.plain_step_seconds(4, extra_tokens=10) == pytest.approx(1 / 100.0)  # a mixed step: SPS(14)
    assert SpsTable.from_points(FLAT).plain_step_seconds(3) == pytest.approx(1 / 100.0)


def test_decode_points_round_trip_and_are_checked(tmp_path):
    t = table({1: 0.001, 4: 0.002}, {1: 0.004, 2: 0.003, 8: 0.008})
    assert t.decode_seconds_at == (0.004, 0.004, 0.008)  # running maximum
    save_sps_table(t, tmp_path / "t.json")
    assert load_sps_table(tmp_path / "t.json") == t
    with pytest.raises(ValueError, match="requests >= 1"):
        t.with_decode_costs({0: 0.1})


def test_unknown_requests_are_priced_at_the_running_mean_survival():
    planner = DSparkPlanner(GAMMA, "compact", table({1: 0.003}), lag_steps=1)
    # nothing observed yet: a new request is assumed to survive everywhere, and drafting pays
    assert planner.plan_drafts(["a"]) is not None
    planner.observe(["a"], [[0.05, 0.01, 0.0, 0.0]])
    # a newcomer is priced at what the engine has seen (not 1.0): drafting would not pay
    assert planner.plan_drafts(["b"]) is None
    assert planner.plan_drafts(["a"]) is None  # a's own lagged survivals
    planner.observe(["a"], [[0.99, 0.98, 0.97, 0.96]])
    assert planner.plan_drafts(["a"]) is not None
    # a request that steps aside is priced at the running mean again `lag` steps later
    planner = DSparkPlanner(GAMMA, "compact", table({1: 0.003}), lag_steps=2)
    for _ in range(2):  # b hits a bad patch; a finishes after these steps
        planner.observe(["a", "b"], [[0.9, 0.8, 0.7, 0.6], [0.01, 0.0, 0.0, 0.0]])
    assert planner.plan_drafts(["b"]) is None
    planner.skip_step()
    assert planner.plan_drafts(["b"]) is None  # lag 2: the bad row is still the one served
    planner.skip_step()
    assert planner.plan_drafts(["b"]) is not None  # nothing fresh: b is priced at the mean survival
    # SGLAUNCH_DSPARK_STEP_ASIDE=0: always draft; static mode: always draft
    for p in (DSparkPlanner(GAMMA, "compact", table({1: 10.0}), step_aside=False),
              DSparkPlanner(GAMMA, "static", table({1: 10.0}))):
        assert p.plan_drafts(["a", "b"]) == 2 * GAMMA


# ---- in the engine (CPU, a real target and the oracle drafter) ----------------------------
def run_counting_drafts(config, batch, monkeypatch=None):
    """-> (outputs, statistics, drafter forwards, pages still held at the end)."""
    engine, cluster = create_engine(config)
    calls = []
    real = engine.runner.draft_block
    engine.runner.draft_block = lambda step: calls.append(len(step.anchor_tokens)) or real(step)
    try:
        out = run(engine, make_requests(batch, "s"))
        return out, engine.spec.stats.to_dict() if engine.spec else None, calls, engine.allocator.num_used
    finally:
        cluster.stop(engine)


@pytest.fixture(scope="module")
def batch_and_plain(dspark_files):
    batch = prompts(6, seed=21)
    out, _, _, _ = run_counting_drafts(engine_config(dspark_files["target"], disable_radix_cache=True), batch)
    return batch, out


def assert_plain(out, plain) -> None:
    """Greedy tokens and finish reasons of plain decoding; log-probabilities within 1e-4."""
    assert out.keys() == plain.keys()
    for rid, (tokens, logprobs, reason) in out.items():
        assert tokens == plain[rid][0] and reason == plain[rid][2], rid
        torch.testing.assert_close(torch.tensor(logprobs), torch.tensor(plain[rid][1]), atol=1e-4, rtol=0)


def write(tmp_path, name: str, t: SpsTable):
    save_sps_table(t, tmp_path / name)
    return tmp_path / name


@pytest.mark.parametrize("mode", ["compact", "cap-accept"])
def test_where_drafting_pays_the_drafts_run(dspark_files, batch_and_plain, tmp_path, mode):
    batch, plain = batch_and_plain
    config = engine_config(dspark_files["target"], dspark_files["oracle"], mode, disable_radix_cache=True,
                           sps=write(tmp_path, "cheap.json", table({1: 1e-4})))
    out, stats, calls, held = run_counting_drafts(config, batch)
    assert_plain(out, plain)
    assert calls and stats["steps"] == len(calls) and stats["mean_accept_length"] > 2.0
    assert stats["step_aside_steps"] == 0 and held == 0


@pytest.mark.parametrize("mode", ["compact", "cap-accept"])
def test_where_drafting_does_not_pay_the_drafter_never_runs(dspark_files, batch_and_plain, tmp_path, mode):
    batch, plain = batch_and_plain
    config = engine_config(dspark_files["target"], dspark_files["oracle"], mode, disable_radix_cache=True,
                           sps=write(tmp_path, "costly.json", table({1: 10.0})))
    out, stats, calls, held = run_counting_drafts(config, batch)
    assert_plain(out, plain)
    assert calls == [] and stats["steps"] == 0
    assert stats["step_aside_steps"] > 0 and stats["step_aside_fraction"] == 1.0 and held == 0


def test_step_asides_are_counted_for_metrics_and_the_log():
    from sglaunch.speculative.stats import SpecStats

    stats = SpecStats(GAMMA)
    stats.record_step([3, 1], verify_tokens=6)
    stats.record_step_aside(5)
    stats.record_step_aside(4)
    d = stats.to_dict()
    assert (d["step_aside_steps"], d["step_aside_request_steps"]) == (2, 9)
    assert d["step_aside_fraction"] == pytest.approx(2 / 3)
    assert "stepped aside 2 of 3 steps (67%)" in stats.log_line()
    rows = {name: value for name, _, _, value, labels in stats.prometheus_samples() if not labels}
    assert rows["sglaunch_spec_step_aside_steps_total"] == 2


def test_the_decision_follows_the_batch_size(dspark_files, batch_and_plain, tmp_path):
    """Drafting is cheap for up to 2 requests and dear from 3: the full batch decodes plainly and
    drafting starts once few requests are left (their max_new_tokens differ)."""
    batch, plain = batch_and_plain
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "compact", disable_radix_cache=True,
                           sps=write(tmp_path, "by_batch.json", table({1: 1e-4, 2: 1e-4, 3: 10.0})))
    out, stats, calls, held = run_counting_drafts(config, batch)
    assert_plain(out, plain)
    assert stats["step_aside_steps"] > 0 and stats["steps"] > 0
    assert calls and max(calls) <= 2  # the drafter only ever ran for one or two requests
    assert held == 0


def test_step_aside_can_be_turned_off(dspark_files, batch_and_plain, tmp_path, monkeypatch):
    monkeypatch.setenv("SGLAUNCH_DSPARK_STEP_ASIDE", "0")
    batch, plain = batch_and_plain
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "compact", disable_radix_cache=True,
                           sps=write(tmp_path, "costly.json", table({1: 10.0})))
    out, stats, calls, _ = run_counting_drafts(config, batch)
    assert_plain(out, plain)
    assert calls and stats["step_aside_steps"] == 0


def test_the_start_up_profile_prices_plain_decode_steps(dspark_files):
    engine, cluster = create_engine(engine_config(dspark_files["target"], dspark_files["oracle"], "compact"))
    try:
        t = engine.spec.planner.sps
        assert t.decode_requests[0] == 1 and t.plain_step_seconds(1) > 0
        # DSpark's work (propose + accept) is priced per request count, up to what the pool holds
        assert t.draft_requests == t.decode_requests and len(t.draft_requests) >= 4
        stats = engine.spec.stats.to_dict()  # the profile's synthetic steps are not counted
        assert stats["steps"] == 0 and stats["step_aside_steps"] == 0 and engine.spec.planner.prior == [1.0] * GAMMA
        assert engine.allocator.num_used == 0
        # /server_info shows the planner's correction of the table (nothing measured yet)
        assert engine.live_stats()["speculative"]["step_cost_scale"] == {
            "draft": 1.0, "plain": 1.0, "draft_sampled": 1.0, "plain_sampled": 1.0}
    finally:
        cluster.stop(engine)


def test_measured_step_times_correct_the_table():
    """The table prices drafting at 1.3x a plain step; once DSpark steps are seen to take twice
    what the table says (host work it does not price), the planner steps aside; once plain
    steps are seen to take twice theirs too, drafting pays again."""
    planner = DSparkPlanner(GAMMA, "compact", table({1: 0.003}, {1: 0.01}), lag_steps=1)
    planner.observe(["a"], [[0.5, 0.3, 0.2, 0.1]])  # tau 2.1 for 13 ms: 1.6x the plain 10 ms
    assert planner.plan_drafts(["a"]) is not None
    for _ in range(30):
        assert planner.calibration.pending[0] == "draft"
        planner.observe_step_seconds(2 * planner.calibration.pending[1])
        if planner.plan_drafts(["a"]) is None:
            break
    assert planner.plan_drafts(["a"]) is None and planner.calibration.scale["draft"] > 1.3
    for _ in range(30):
        assert planner.calibration.pending[0] == "plain"
        planner.observe_step_seconds(2 * planner.calibration.pending[1])
        if planner.plan_drafts(["a"]) is not None:
            break
    assert planner.plan_drafts(["a"]) is not None
    # a stalled step (a lazy drafter-graph capture: 15-230 ms on the H200 against a 6 ms model)
    # teaches nothing about its kind
    kind = planner.calibration.pending[0]
    before = planner.calibration.scale[kind]
    planner.observe_step_seconds(1e6)
    assert planner.calibration.scale[kind] == before


def test_a_cost_that_lasts_is_learnt_though_each_step_looks_like_a_stall():
    """Sampled steps at 5x their model, one after another (session 31: a sampled DSpark step took
    about 7.8 ms on the H100 where the table priced a greedy one near 1.7 ms), are a cost, not
    stalls: after OUTLIER_RUN of them the scale takes the least of them, then follows the steps;
    a single stall between normal steps still teaches nothing, and greedy steps (timed by the
    start-up profile) keep ignoring every step over 3x."""
    from sglaunch.speculative.planner import StepCostCalibration

    cal = StepCostCalibration()
    for ratio in (5.0, 6.0):
        cal.expect("draft", 0.01, sampled=True)
        cal.observe(ratio * 0.01)
        assert cal.scales[("draft", True)] == 1.0
    cal.expect("draft", 0.01, sampled=True)
    cal.observe(5.5 * 0.01)
    assert cal.scales[("draft", True)] == pytest.approx(5.0)
    cal.expect("draft", 0.01, sampled=True)
    cal.observe(6.0 * 0.01)
    assert cal.scales[("draft", True)] == pytest.approx(0.9 * 5.0 + 0.1 * 6.0)
    # the greedy class never saw any of it
    assert cal.scale == {"draft": 1.0, "plain": 1.0}
    # stalls between normal steps: each run is broken before it is long enough
    for _ in range(4):
        for ratio in (50.0, 50.0, 1.2):
            cal.expect("draft", 0.01, sampled=True)
            cal.observe(ratio * 0.01)
    assert 5.0 * 0.9 ** 4 < cal.scales[("draft", True)] < 5.0
    # greedy steps: a run teaches nothing either
    for ratio in (5.0, 5.0, 5.0, 5.0, 1.2):
        cal.expect("draft", 0.01)
        cal.observe(ratio * 0.01)
    assert cal.scale["draft"] == pytest.approx(0.9 + 0.1 * 1.2)
    # a run of another class, or of the other kind, does not break a class's run
    cal = StepCostCalibration()
    for kind, sampled in (("draft", True), ("draft", False), ("plain", True), ("draft", True), ("draft", True)):
        cal.expect(kind, 0.01, sampled)
        cal.observe(0.01 if not sampled or kind == "plain" else 0.04)
    assert cal.scales[("draft", True)] == pytest.approx(4.0)


def test_sampled_steps_are_priced_by_their_own_scales():
    """A planner that drafts for greedy steps steps aside for steps whose rows sample once those
    are seen to cost 4x the table (and 1x for plain sampled steps), while greedy steps, priced
    by the greedy scales, keep drafting."""
    planner = DSparkPlanner(GAMMA, "compact", table({1: 0.003}, {1: 0.01}), lag_steps=1)
    planner.observe(["a"], [[0.5, 0.3, 0.2, 0.1]])  # tau 2.1 for 13 ms: 1.6x the plain 10 ms
    asides = 0
    for _ in range(40):
        budget = planner.plan_drafts(["a"], sampled=True)
        kind, modelled, sampled = planner.calibration.pending
        assert sampled and (kind == "plain") == (budget is None)
        asides += budget is None
        planner.observe_step_seconds((4.0 if kind == "draft" else 1.0) * modelled)
        if budget is not None:
            planner.observe(["a"], [[0.5, 0.3, 0.2, 0.1]])
    assert planner.calibration.scales[("draft", True)] > 1.6
    assert asides > 30 and planner.plan_drafts(["a"], sampled=True) is None
    assert planner.plan_drafts(["a"]) is not None and planner.calibration.scale == {"draft": 1.0, "plain": 1.0}


def test_a_stale_correction_fades_so_drafting_is_tried_again():
    """Drafting seen to cost 2.5x its model steps aside; plain steps at their modelled cost then
    pull the draft scale back toward the table until the planner drafts again (and re-measures)."""
    planner = DSparkPlanner(GAMMA, "compact", table({1: 0.003}, {1: 0.01}), lag_steps=1)
    planner.observe(["a"], [[0.5, 0.3, 0.2, 0.1]])
    for _ in range(60):
        assert planner.plan_drafts(["a"]) is not None or planner.calibration.pending[0] == "plain"
        if planner.calibration.pending[0] == "plain":
            break
        planner.observe_step_seconds(2.5 * planner.calibration.pending[1])
    asides = 0
    while planner.plan_drafts(["a"]) is None:
        planner.observe_step_seconds(planner.calibration.pending[1])
        asides += 1
        assert asides < 200, planner.calibration.scale
    assert asides > 5  # not at once: the correction fades over steps


def test_the_pruned_budget_search_is_exact():
    import random

    from sglaunch.speculative.planner import choose_budget, theta

    rng = random.Random(3)
    for _ in range(300):
        R = rng.randint(1, 6)
        values = sorted((rng.random() ** rng.choice([0.5, 1, 3]) for _ in range(R * GAMMA)), reverse=True)
        points = {t: 100.0 / (1 + rng.random() * t / 8) for t in (1, 2, 4, 8, 16, 32)}
        sps = SpsTable.from_points(points, rng.choice(["step", "linear"])).with_draft_costs({1: rng.random() * 0.02})
        extra = rng.choice([0, 0, 5])
        scores = [theta(R + sum(values[:k]), extra + R + k, sps, R) for k in range(len(values) + 1)]
        assert choose_budget(values, R, sps, extra) == scores.index(max(scores))


def test_the_vectorised_budget_search_equals_the_python_loop():
    """At many requests the budget is searched with numpy (a stepping-aside step at 64 requests
    must not pay a Python loop over 448 candidates): the same K and Theta, to the last bit."""
    import random

    import numpy as np

    from sglaunch.speculative.planner import SMALL, _argmax_theta, best_budget, theta

    rng = random.Random(4)
    for _ in range(200):
        R = rng.randint(1, 64)
        values = sorted((rng.random() ** rng.choice([0.5, 1, 3]) for _ in range(R * GAMMA)), reverse=True)
        points = {t: 100.0 / (1 + rng.random() * t / 8) for t in (1, 2, 4, 8, 16, 32, 64, 256)}
        sps = SpsTable.from_points(points, rng.choice(["step", "linear"])).with_draft_costs(
            {1: rng.random() * 0.02, 64: rng.random() * 0.04})
        extra = rng.choice([0, 0, 5, 300])
        loop = _argmax_theta(values, R, sps, extra)
        assert _argmax_theta(np.asarray(values), R, sps, extra) == loop
        assert best_budget(values, R, sps, extra) == loop  # either path, as the size picks
        scores = [theta(R + sum(values[:k]), extra + R + k, sps, R) for k in range(len(values) + 1)]
        assert loop[0] == scores.index(max(scores))
    assert SMALL < 64 * GAMMA  # the engine's 64-request steps take the numpy path


def test_a_stepped_aside_step_converts_and_copies_where_a_plain_step_does(dspark_files, batch_and_plain, tmp_path,
                                                                          monkeypatch):
    """Where drafting never pays, every step of a DSpark engine (its drafter's graphs captured, as
    on a GPU: draft_graphs.EagerCapture) is a plain step: the drafter never runs (no replay, no
    propose, no accept), and the step reads back and copies down at exactly the sites, and as
    often, as a plain engine's step (the planner works on host lists only)."""
    import functools

    from test_sync_budget import Recorder
    from sglaunch.speculative import draft_graphs

    batch, plain = batch_and_plain

    def census(config):
        engine, cluster = create_engine(config)
        try:
            recorder = Recorder()
            engine.step = recorder.wrap("step", engine.step)
            if engine.spec is not None:
                for name in ("propose", "accept", "accept_greedy"):
                    setattr(engine.spec, name, lambda *a, _n=name, **k: pytest.fail(f"{_n} ran in a stepped-aside step"))
            with monkeypatch.context() as patch:
                recorder.install(patch)
                out = run(engine, make_requests(batch, "s"))
            graphs = engine.runner.draft.graphs if engine.runner.draft is not None else None
            return out, recorder, graphs, engine.spec.stats.to_dict() if engine.spec else None
        finally:
            cluster.stop(engine)

    base = engine_config(dspark_files["target"], disable_radix_cache=True, cuda_graph_max_bs=8)
    plain_out, plain_census, _, _ = census(base)
    monkeypatch.setattr(draft_graphs, "start_up_graphs",
                        functools.partial(draft_graphs.start_up_graphs, capture=draft_graphs.EagerCapture(), force=True))
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "compact", disable_radix_cache=True,
                           cuda_graph_max_bs=8, sps=write(tmp_path, "costly.json", table({1: 10.0})))
    out, aside_census, graphs, stats = census(config)
    assert_plain(out, plain)
    assert stats["steps"] == 0 and stats["step_aside_steps"] > 0
    assert graphs is not None and graphs.replays == 0
    assert aside_census.calls["step"] == plain_census.calls["step"]
    sites = lambda c: Counter({(f, text): n for (f, _, text), n in c.items() if f.startswith("sglaunch/")})  # noqa: E731
    # NOTE: the census sees a plain step's read-backs; since session 36 a plain step on the CPU makes no direct
    # move (its input ids and logit rows go through transfer.to_device, a no-op on the CPU), so only a stepped
    # aside step that moves where a plain one does not would show here
    assert sites(plain_census.read_backs)
    assert sites(aside_census.read_backs) == sites(plain_census.read_backs)
    assert sites(aside_census.moves) == sites(plain_census.moves)


def overconfident_drafter(folder, seed: int = 5):
    """Random drafts (rarely accepted) stated with confidence: every slot's confidence about 0.98."""
    from dspark_helpers import drafter_config
    from sglaunch.speculative.checkpoint import init_drafter_state, save_drafter

    cfg = drafter_config(markov_rank=8)
    state = init_drafter_state(cfg, seed=seed, with_embed=False, with_lm_head=False)
    state["confidence_head.proj.bias"] = torch.tensor([4.0])
    return save_drafter(folder, cfg, state)


def test_a_drafter_whose_confidence_the_target_does_not_bear_out_is_stepped_around(dspark_files, tmp_path):
    """Drafting pays by the table and by the drafter's own word (survival ~0.98 a slot; a draft
    stage at 60% of a plain step), but the target accepts next to nothing: the planner checks the survivals against what was accepted
    (AcceptCalibration) and steps aside for most of the run, with plain decoding's output.
    Without the check it drafted every step (session 18 on the H200: 22% of its steps at 64
    requests, where the table leaves less room, and 0.87x of plain). Once the check finds it
    failing, stepped-aside steps of these 6 requests (fewer than a burst takes, where the context
    otherwise stays) skip the draft context (planner.drafter_failing)."""
    from test_engine_dspark import greedy

    batch = prompts(6, seed=21)
    requests = lambda tag: [GenerateRequest(f"{tag}-{i}", tuple(p), greedy(120)) for i, p in enumerate(batch)]
    plain_engine, cluster = create_engine(engine_config(dspark_files["target"], disable_radix_cache=True))
    try:
        plain = run(plain_engine, requests("s"))
    finally:
        cluster.stop(plain_engine)
    config = engine_config(dspark_files["target"], overconfident_drafter(tmp_path / "overconfident"), "compact",
                           disable_radix_cache=True, sps=write(tmp_path, "dear.json", table({1: 0.006})))
    engine, cluster = create_engine(config)
    # NOTE: the table's step costs as they are: measured step times (StepCostCalibration) vary with
    # the machine's load and would make the decision the machine's, not the check's
    engine.spec.planner.calibration = None
    try:
        assert len(batch) < engine.context_skip_min_batch and engine.context_skip
        out = run(engine, requests("s"))
        stats, factors = engine.spec.stats.to_dict(), engine.spec.planner.accepts.factors()
        failing, skipped = engine.spec.planner.drafter_failing(), engine.context_skipped_steps
        total = engine.counters["steps"]
    finally:
        cluster.stop(engine)
    assert_plain(out, plain)
    assert stats["mean_accept_length"] < 1.5  # the drafts are random
    assert factors is not None and factors[0] < 0.5 and failing
    # plain most of the run: stepped aside, or (once their context was skipped) no candidate at all
    assert 3 * stats["steps"] < total, (total, stats)
    assert skipped > 0 and stats["step_aside_steps"] >= engine.context_skip_streak, stats


@pytest.mark.parametrize("overlap", ["0", "1"])
def test_slow_sampled_steps_step_aside_while_greedy_ones_keep_drafting(dspark_files, tmp_path, monkeypatch,
                                                                      overlap):
    """The accept of a sampled drafting step made to take 150 ms (a step the table prices at
    about 10 ms): after OUTLIER_RUN such steps the sampled requests decode plainly, while greedy
    requests served next by the same engine, priced by the greedy scales, still draft. NOTE: the
    plain steps are observed at their modelled time (a loaded CI host once made them 20x
    slower too, which rightly made drafting pay again); the drafting steps' own wall time is
    observed as measured, and the overlapped engine must observe its sampled plain steps."""
    import time

    from test_engine_dspark import sampled

    monkeypatch.setenv("SGLAUNCH_OVERLAP", overlap)
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "compact", disable_radix_cache=True,
                           sps=write(tmp_path, "cheap.json", table({1: 1e-4})))
    engine, cluster = create_engine(config)
    real = engine.spec.accept
    slow, plain_sampled_seen = [], []
    planner = engine.spec.planner
    observe = planner.observe_step_seconds

    def slow_accept(*args, **kwargs):
        slow.append(1)
        time.sleep(0.15)
        return real(*args, **kwargs)

    def plain_as_modelled(seconds):
        pending = planner.calibration.pending
        if seconds is not None and pending is not None and pending[0] == "plain":
            plain_sampled_seen.append(pending[2])
            seconds = pending[1]
        observe(seconds)

    engine.spec.accept = slow_accept
    planner.observe_step_seconds = plain_as_modelled
    try:
        batch = prompts(4, seed=5)
        run(engine, [GenerateRequest(f"t-{i}", tuple(p), sampled(i)) for i, p in enumerate(batch)])
        stats = engine.spec.stats.to_dict()
        scales = engine.live_stats()["speculative"]["step_cost_scale"]
        assert len(slow) <= 6 and stats["steps"] == len(slow), (stats, scales)
        assert stats["step_aside_steps"] >= 10 and scales["draft_sampled"] > 5.0, (stats, scales)
        assert sum(plain_sampled_seen) >= 5, plain_sampled_seen  # the sampled plain steps are observed
        assert scales["draft"] < 3.0 and scales["plain"] < 3.0
        before = stats["steps"]
        run(engine, make_requests(batch, "g"))
        after = engine.spec.stats.to_dict()
        assert after["steps"] - before >= 5 and len(slow) == before, (after, scales)
    finally:
        cluster.stop(engine)


def plain_then_dear(dspark_files, tmp_path, requests):
    """A plain engine's outputs for `requests`, then a started DSpark engine (compact, the oracle
    drafter) whose table says drafting never pays -> (plain outputs, engine, cluster)."""
    plain_engine, cluster = create_engine(engine_config(dspark_files["target"], disable_radix_cache=True))
    try:
        plain = run(plain_engine, requests)
    finally:
        cluster.stop(plain_engine)
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "compact", disable_radix_cache=True,
                           sps=write(tmp_path, "dear.json", table({1: 10.0})))
    engine, cluster = create_engine(config)
    return plain, engine, cluster


@pytest.mark.parametrize("greedy_rows", [0, 1])
def test_a_small_batch_that_only_samples_skips_the_draft_context(dspark_files, tmp_path, greedy_rows):
    """A batch smaller than a burst keeps the draft context through stepped-aside steps while a
    burst may come; where every row samples at T > 0 none can, so after context_skip_streak
    stepped-aside steps its plain steps skip the context (session 36: H100, T=0.7, DSpark stepped
    aside on 92% of c=8's steps and served 0.90x of plain); with a greedy row among them it stays.
    Either way the output is the plain engine's, seeds included."""
    from test_engine_dspark import greedy, sampled

    batch = prompts(3, seed=22)
    requests = [GenerateRequest(f"s-{i}", tuple(p), greedy(20) if i < greedy_rows else sampled(40 + i))
                for i, p in enumerate(batch)]
    plain, engine, cluster = plain_then_dear(dspark_files, tmp_path, requests)
    try:
        assert len(batch) < engine.context_skip_min_batch
        engine.spec.planner.calibration = None  # the table's costs as they are: drafting never pays
        engine.context_skip_streak = 2
        out = run(engine, requests)
        failing, skipped = engine.spec.planner.drafter_failing(), engine.context_skipped_steps
        stats = engine.spec.stats.to_dict()
    finally:
        cluster.stop(engine)
    assert_plain(out, plain)
    assert not failing and stats["steps"] == 0 and stats["step_aside_steps"] >= engine.context_skip_streak
    assert (skipped > 0) is (greedy_rows == 0), skipped


@pytest.mark.parametrize("gap,limit", [(0.004, 0.5), (0.004, 0.002)])
def test_a_sampled_drafting_step_is_priced_up_to_the_next_step(dspark_files, tmp_path, monkeypatch, gap, limit):
    """Overlap: a sampled drafting step leaves nothing in flight, so the engine loop's work after it
    (publishing its outputs; here a sleep of `gap` between steps) idles the device and is its cost:
    the planner observes it from its start to the next step's start (less its drain's wait for the
    device), where a greedy drafting step is observed to its own end. A gap over LOOP_GAP_LIMIT_S
    is idleness, not cost: then the sampled step is observed to its end too (the limit is set here
    far above or below the gap, so a slow host cannot blur which case a step is)."""
    import time

    from sglaunch.engine import engine as engine_module
    from sglaunch.engine.launch import run_requests
    from test_engine_dspark import greedy

    monkeypatch.setenv("SGLAUNCH_OVERLAP", "1")
    monkeypatch.setattr(engine_module, "LOOP_GAP_LIMIT_S", limit)
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "compact", disable_radix_cache=True,
                           sps=write(tmp_path, "cheap.json", table({1: 1e-4})))
    engine, cluster = create_engine(config)
    planner = engine.spec.planner
    observed, durations = [], []
    observe, step_now, step = planner.observe_step_seconds, engine._step_now, engine.step

    def record(seconds):
        pending = planner.calibration.pending
        if seconds is not None and pending is not None and pending[0] == "draft":
            observed.append((pending[2], seconds, durations[-1]))
        observe(seconds)

    def timed_step_now(chunks, decision):
        t = time.perf_counter()
        try:
            return step_now(chunks, decision)
        finally:
            durations.append(time.perf_counter() - t)

    def slow_loop():
        outputs = step()
        time.sleep(gap)  # NOTE: the engine loop's work between two steps
        return outputs

    planner.observe_step_seconds, engine._step_now, engine.step = record, timed_step_now, slow_loop
    try:
        assert engine.overlap
        batch = prompts(3, seed=5)
        params = [SamplingParams(max_new_tokens=16, temperature=0.8, seed=i, ignore_eos=True) for i in range(3)]
        run_requests(engine, [GenerateRequest(f"t-{i}", tuple(p), params[i]) for i, p in enumerate(batch)])
        run_requests(engine, [GenerateRequest(f"g-{i}", tuple(p), greedy(16)) for i, p in enumerate(batch)])
    finally:
        cluster.stop(engine)
    sampled = [(seconds, own) for is_sampled, seconds, own in observed if is_sampled]
    greedy_steps = [(seconds, own) for is_sampled, seconds, own in observed if not is_sampled]
    assert len(sampled) >= 3 and len(greedy_steps) >= 3, observed
    assert all(seconds < own + gap for seconds, own in greedy_steps), greedy_steps
    if gap <= limit:
        assert all(seconds >= own + gap for seconds, own in sampled), [(s, o, s - o) for s, o in sampled if s < o + gap]
    else:
        assert all(own <= seconds < own + gap for seconds, own in sampled), sampled
