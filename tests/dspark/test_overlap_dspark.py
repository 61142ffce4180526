"""SGLAUNCH_OVERLAP=1 with DSpark: the steps that step aside are pipelined (launched before the
step in flight is read back), a drafting step drains the pipeline first. On the tiny CPU target
with the oracle drafter, forcing the planner to alternate between drafting and stepping aside:
greedy output token-identical to plain decoding and to the synchronous DSpark engine, every
stepped-aside step left in flight, every KV page back at the end."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest
import torch

from dspark_helpers import engine_config, prompts
from sglaunch.engine.interface import GenerateRequest, SamplingParams
from sglaunch.engine.launch import create_engine, generate_batch
from sglaunch.engine.model_runner import OVERLAP_ENV
from sglaunch.speculative.sps import SpsTable, save_sps_table

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
# extra verify rows free, a cheap drafter: drafting pays wherever the planner is let draft
CHEAP = SpsTable.from_points({1: 100.0, 8: 100.0, 16: 100.0, 32: 100.0, 64: 100.0, 128: 100.0}) \
    .with_draft_costs({1: 1e-4}).with_decode_costs({1: 0.01})


def request(rid, prompt, **sampling) -> GenerateRequest:
    return GenerateRequest(rid, tuple(prompt), dataclasses.replace(GREEDY, **sampling))


@pytest.fixture(scope="module")
def cheap_sps(tmp_path_factory):
    path = tmp_path_factory.mktemp("sps") / "cheap.json"
    save_sps_table(CHEAP, path)
    return path


def alternate(engine, eos: tuple[int, ...] = (), rule: str = "lengths") -> None:
    """Force the planner's decision; no wall-time calibration (deterministic). rule "lengths":
    draft only when the candidates' token counts sum to a multiple of 3 (a decision from lengths
    alone, as the real one reads: the same in both engines); "turns": draft at every other
    decision (with overlap every stepped-aside step is then drained by the next one, so stops
    learnt a step late are found by drains)."""
    if eos:
        engine.scheduler.limits = dataclasses.replace(engine.scheduler.limits, eos_token_ids=eos)
    if engine.spec is None:
        return
    planner = engine.spec.planner
    planner.calibration = None
    real, turn = planner.plan_drafts, [0]

    def plan(rids, extra=0, committed=0, sampled=False, chains=False):
        turn[0] += 1
        if rule == "turns":
            return real(rids, extra, committed) if turn[0] % 2 == 0 else None
        return real(rids, extra, committed) if sum(len(engine.requests[r].token_ids) for r in rids) % 3 == 0 else None

    planner.plan_drafts = plan
    survivals, observe = [], planner.observe

    def record(rids, rows):  # the drafter's survivals of each drafting step (they read the draft context)
        survivals.append(dict(zip(rids, rows.tolist() if hasattr(rows, "tolist") else rows)))
        observe(rids, rows)

    planner.observe, engine.survivals = record, survivals


def drive(engine, script: dict[int, list]) -> dict:
    """Run `script` ({step: [("add", GenerateRequest) | ("abort", rid)]}) to the end -> tokens,
    accept lengths and last output per rid, and step counts by kind."""
    tokens, accepts, finals, step = defaultdict(list), defaultdict(list), {}, 0
    counts = {"aside": 0, "aside_in_flight": 0, "in_flight": 0}

    def collect(outputs) -> None:
        for out in outputs:
            assert out.rid not in finals, f"{out.rid}: an output after its last one: {out}"
            tokens[out.rid].extend(out.new_token_ids)
            if out.accept_length is not None:
                accepts[out.rid].append(out.accept_length)
            if out.finished:
                finals[out.rid] = out

    while step <= max(script, default=0) or engine.has_work:
        for kind, arg in script.get(step, ()):
            if kind == "add":
                collect(engine.add_request(arg))
            elif (out := engine.abort(arg)) is not None:
                collect([out])
        if engine.has_work:
            asides = engine.spec.stats.step_aside_steps if engine.spec is not None else 0
            collect(engine.step())
            counts["in_flight"] += engine._in_flight is not None
            if engine.spec is not None and engine.spec.stats.step_aside_steps > asides:
                counts["aside"] += 1
                counts["aside_in_flight"] += engine._in_flight is not None
        step += 1
        assert step < 2000
    for rid, out in finals.items():
        assert len(tokens[rid]) == out.completion_tokens, rid
    return {"tokens": dict(tokens), "accepts": dict(accepts), "finals": finals, "counts": counts,
            "drafted": engine.spec.stats.steps if engine.spec is not None else 0,
            "survivals": getattr(engine, "survivals", None),
            "drains": engine.overlap_counts["drains"], "drain_finished": engine.overlap_counts["drain_finished"],
            "preemptions": engine.scheduler.num_preemptions}


def assert_all_pages_free(engine) -> None:
    scheduler, allocator = engine.scheduler, engine.allocator
    assert not scheduler.running and not scheduler.waiting and engine._in_flight is None
    if scheduler.radix is not None:
        scheduler.radix.evict(allocator.num_pages)
    assert allocator.num_free == allocator.num_pages


def run(monkeypatch, config, script, overlap: str, eos: tuple[int, ...] = (), rule: str = "lengths") -> dict:
    monkeypatch.setenv(OVERLAP_ENV, overlap)
    engine, cluster = create_engine(config)
    try:
        assert engine.overlap is (overlap == "1")
        alternate(engine, eos, rule)
        result = drive(engine, script)
        assert_all_pages_free(engine)
        return result
    finally:
        cluster.stop(engine)


def run_three(monkeypatch, dspark_files, sps, script, eos=(), rule="lengths", **overrides) -> tuple[dict, dict, dict]:
    """plain (synchronous), DSpark synchronous, DSpark overlapped; checks the overlapped run
    pipelined every stepped-aside step and drafted (draining) too."""
    plain = run(monkeypatch, engine_config(dspark_files["target"], **overrides), script, "0", eos)
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "compact", sps=sps, **overrides)
    sync = run(monkeypatch, config, script, "0", eos, rule)
    ovl = run(monkeypatch, config, script, "1", eos, rule)
    assert sync["counts"]["in_flight"] == 0 and sync["drains"] == 0
    c = ovl["counts"]
    assert c["aside"] > 0 and c["aside_in_flight"] == c["aside"], c  # every stepped-aside step stayed in flight
    assert ovl["drafted"] > 0 and ovl["drains"] > 0 and sync["drafted"] > 0
    assert max(max(a) for a in ovl["accepts"].values()) >= 2  # drafts accepted, not only corrections
    return plain, sync, ovl


@pytest.mark.parametrize("rule", ["lengths", "turns"])
def test_staggered_arrivals_stops_lengths_and_abort(monkeypatch, dspark_files, cheap_sps, rule):
    """Arrivals mid-stream, max_new_tokens, an EOS and a stop token (learnt a step late with
    overlap, maybe inside accepted drafts), and an abort mid-stream."""
    batch = prompts(6, seed=31)
    probe = generate_batch(engine_config(dspark_files["target"]), batch[:2], dataclasses.replace(GREEDY, max_new_tokens=12))
    eos, stop = probe[0][5], probe[1][7]
    script = {
        0: [("add", request("a", batch[0], ignore_eos=False, max_new_tokens=16)),
            ("add", request("b", batch[1], stop_token_ids=(stop,), max_new_tokens=20))],
        2: [("add", request("c", batch[2], max_new_tokens=3))],
        3: [("add", request("d", batch[3], max_new_tokens=1)), ("add", request("e", batch[4], max_new_tokens=30))],
        5: [("abort", "e")],
        6: [("add", request("f", batch[5], max_new_tokens=17))],
        9: [("add", request("g", batch[0][:4], max_new_tokens=11))],
    }
    plain, sync, ovl = run_three(monkeypatch, dspark_files, cheap_sps, script, eos=(eos,), rule=rule, page_size=2)
    full_e = generate_batch(engine_config(dspark_files["target"]), [batch[4]], dataclasses.replace(GREEDY, max_new_tokens=30))[0]
    for name, result in (("plain", plain), ("sync", sync), ("overlap", ovl)):
        t, f = result["tokens"], result["finals"]
        assert f["a"].finish_reason == "stop" and t["a"][-1] == eos and len(t["a"]) < 16, name
        assert f["b"].finish_reason == "stop" and t["b"][-1] == stop, name
        assert f["e"].finish_reason == "abort" and t.get("e", []) == full_e[: len(t.get("e", []))], name
        assert {r: x for r, x in t.items() if r != "e"} == {r: x for r, x in plain["tokens"].items() if r != "e"}, name
        assert {r: o.finish_reason for r, o in f.items()} == {r: o.finish_reason for r, o in plain["finals"].items()}


def test_stops_learnt_by_a_drain(monkeypatch, dspark_files, cheap_sps):
    """Stop tokens emitted by stepped-aside steps in flight and learnt when the next (drafting)
    step drains: those requests are dropped from the drafting step, their pages freed."""
    batch = prompts(6, seed=36)
    plain = generate_batch(engine_config(dspark_files["target"]), batch, dataclasses.replace(GREEDY, max_new_tokens=16))
    script = {0: [request(f"r{i}", p, stop_token_ids=(plain[i][i + 1],), max_new_tokens=16) for i, p in enumerate(batch)]}
    script = {0: [("add", r) for r in script[0]]}
    ref, sync, ovl = run_three(monkeypatch, dspark_files, cheap_sps, script, rule="turns")
    assert ovl["drain_finished"] > 0
    assert all(f.finish_reason == "stop" for f in ovl["finals"].values())
    assert ovl["tokens"] == sync["tokens"] == ref["tokens"]
    for i in range(6):  # up to the stop token's first occurrence
        assert ref["tokens"][f"r{i}"] == plain[i][: plain[i].index(plain[i][i + 1]) + 1]


@pytest.mark.parametrize("page_size", [1, 4])
def test_tiny_pool_preemption_and_chunked_prefill(monkeypatch, dspark_files, cheap_sps, page_size):
    batch = prompts(8, seed=32)
    script = {0: [("add", request(f"r{i}", p, max_new_tokens=14 + i)) for i, p in enumerate(batch)],
              4: [("add", request("late", batch[2], max_new_tokens=9))]}
    plain, sync, ovl = run_three(monkeypatch, dspark_files, cheap_sps, script, page_size=page_size,
                                 max_total_tokens=56, chunked_prefill_size=8, disable_radix_cache=page_size == 4)
    assert ovl["preemptions"] > 0 and sync["preemptions"] > 0
    assert ovl["tokens"] == sync["tokens"] == plain["tokens"]


def test_draft_context_of_pipelined_steps_gives_the_same_drafts(monkeypatch, dspark_files, cheap_sps):
    """Length finishes only (known in advance: the batches are the same in both engines, so are
    the decisions): the drafting steps accept exactly as many drafts with overlap as without,
    so the draft context written by the pipelined (placeholder) steps is the same context."""
    batch = prompts(5, seed=33)
    script = {0: [("add", request(f"r{i}", p, max_new_tokens=18 + 3 * i)) for i, p in enumerate(batch[:3])],
              3: [("add", request("r3", batch[3], max_new_tokens=20))],
              7: [("add", request("r4", batch[4], max_new_tokens=15))]}
    _, sync, ovl = run_three(monkeypatch, dspark_files, cheap_sps, script)
    assert ovl["tokens"] == sync["tokens"]
    assert ovl["accepts"] == sync["accepts"] and ovl["drafted"] == sync["drafted"]
    assert len(ovl["survivals"]) == len(sync["survivals"]) == ovl["drafted"]
    for a, b in zip(ovl["survivals"], sync["survivals"]):
        assert a.keys() == b.keys()
        torch.testing.assert_close(torch.tensor(list(a.values())), torch.tensor(list(b.values())), atol=1e-5, rtol=0)
    assert ovl["counts"]["aside"] == sync["counts"]["aside"]


def test_sampled_requests_steps_aside_stay_in_flight(monkeypatch, dspark_files, cheap_sps):
    """A seeded sampled request beside greedy ones: since session 32 its stepped-aside steps are
    sampled on the device and stay in flight like greedy ones (before, every step it was in
    finished at once); the tokens are those of the synchronous DSpark engine."""
    batch = prompts(3, seed=34)
    seeded = dict(temperature=0.9, top_p=0.95, seed=7, max_new_tokens=10)
    script = {0: [("add", request("g0", batch[0], max_new_tokens=16))],
              3: [("add", request("s", batch[1], **seeded))],
              5: [("add", request("g1", batch[2], max_new_tokens=8))]}
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "compact", sps=cheap_sps)
    sync, ovl = run(monkeypatch, config, script, "0"), run(monkeypatch, config, script, "1")
    assert ovl["tokens"] == sync["tokens"]
    assert ovl["counts"]["in_flight"] > 0 and ovl["counts"]["aside_in_flight"] == ovl["counts"]["aside"] > 0, ovl


def test_tp2_overlapped_dspark_matches_plain(monkeypatch, dspark_files, cheap_sps):
    """Every rank gets the same step descriptions; each fills the placeholders from its own
    greedy buffer (the workers inherit the environment)."""
    batch = prompts(4, seed=35)
    script = {0: [("add", request(f"r{i}", p, max_new_tokens=10 + 2 * i)) for i, p in enumerate(batch)]}
    plain = run(monkeypatch, engine_config(dspark_files["target"]), script, "0")
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "compact", sps=cheap_sps, tp_size=2,
                           page_size=2)
    ovl = run(monkeypatch, config, script, "1")
    assert ovl["tokens"] == plain["tokens"]
    assert ovl["counts"]["aside_in_flight"] == ovl["counts"]["aside"] > 0 and ovl["drains"] > 0


def test_the_start_up_profile_times_plain_decode_pipelined(monkeypatch, dspark_files):
    """With overlap, compact's start-up profile prices a stepped-aside step as the pipelined
    plain step it will be; the profile's pages all go back."""
    from sglaunch.speculative import sps_profile

    calls = []
    real = sps_profile._pipelined_seconds
    monkeypatch.setattr(sps_profile, "_pipelined_seconds", lambda *a: calls.append(a[2].batch_size) or real(*a))
    for overlap in ("0", "1"):
        monkeypatch.setenv(OVERLAP_ENV, overlap)
        engine, cluster = create_engine(engine_config(dspark_files["target"], dspark_files["oracle"], "compact"))
        try:
            t = engine.spec.planner.sps
            assert t.decode_requests and all(s > 0 for s in t.decode_seconds_at)
            assert engine.allocator.num_used == 0
            assert (calls == list(t.decode_requests)) is (overlap == "1") and bool(calls) is (overlap == "1")
        finally:
            cluster.stop(engine)


def test_calibration_forgets_a_step_it_cannot_price():
    from sglaunch.speculative.planner import DSparkPlanner

    planner = DSparkPlanner(4, "compact", CHEAP, lag_steps=1)
    planner.plan_drafts(["a"])
    assert planner.calibration.pending is not None
    planner.observe_step_seconds(None)
    assert planner.calibration.pending is None and planner.calibration.scale == {"draft": 1.0, "plain": 1.0}
