"""SGLAUNCH_OVERLAP=1 (step N + 1 launched before step N is read back) against the synchronous
engine on tiny random-weight models (CPU, fp32): the same greedy tokens in every mix, nothing
emitted after a finish, and every KV page back in the allocator at the end."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest

from engine_helpers import PROMPTS, engine_config
from sglaunch.engine.interface import GenerateRequest, SamplingParams
from sglaunch.engine.launch import create_engine, generate_batch
from sglaunch.engine.model_runner import OVERLAP_ENV, overlap_from_env

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)


def drive(engine, script: dict[int, list]) -> tuple[dict, dict, int]:
    """Run `script` ({step: [("add", GenerateRequest) | ("abort", rid)]}, applied before that step)
    to the end -> (tokens per rid, last output per rid, steps that left a step in flight)."""
    tokens, finals, in_flight, step = defaultdict(list), {}, 0, 0

    def collect(outputs) -> None:
        for out in outputs:
            assert out.rid not in finals, f"{out.rid}: an output after its last one: {out}"
            tokens[out.rid].extend(out.new_token_ids)
            if out.finished:
                finals[out.rid] = out

    while step <= max(script, default=0) or engine.has_work:
        for kind, arg in script.get(step, ()):
            if kind == "add":
                collect(engine.add_request(arg))
            elif (out := engine.abort(arg)) is not None:
                collect([out])
        if engine.has_work:
            collect(engine.step())
            in_flight += engine._in_flight is not None
        step += 1
        assert step < 2000
    for rid, out in finals.items():
        assert len(tokens[rid]) == out.completion_tokens, rid
    return dict(tokens), finals, in_flight


def assert_all_pages_free(engine) -> None:
    scheduler, allocator = engine.scheduler, engine.allocator
    assert not scheduler.running and not scheduler.waiting and engine._in_flight is None
    if scheduler.radix is not None:
        scheduler.radix.evict(allocator.num_pages)
    assert allocator.num_free == allocator.num_pages


def run_both(monkeypatch, config, script, patch=None):
    """The script on a synchronous engine and on an overlapped one -> ((tokens, finals, engine) x 2)."""
    results = []
    for overlap in ("0", "1"):
        monkeypatch.setenv(OVERLAP_ENV, overlap)
        engine, cluster = create_engine(config)
        try:
            assert engine.overlap is (overlap == "1")
            if patch is not None:
                patch(engine)
            tokens, finals, in_flight = drive(engine, script)
            assert (in_flight > 0) is (overlap == "1")
            assert_all_pages_free(engine)
            results.append((tokens, finals, engine))
        finally:
            cluster.stop(engine)
    return results


def request(rid, prompt, **sampling) -> GenerateRequest:
    return GenerateRequest(rid, tuple(prompt), dataclasses.replace(GREEDY, **sampling))


def test_env_switch(monkeypatch):
    monkeypatch.delenv(OVERLAP_ENV, raising=False)
    assert overlap_from_env() is False
    monkeypatch.setenv(OVERLAP_ENV, "1")
    assert overlap_from_env() is True
    monkeypatch.setenv(OVERLAP_ENV, "yes")
    with pytest.raises(ValueError, match="expected 0 or 1"):
        overlap_from_env()


def test_staggered_arrivals_stops_lengths_and_abort(monkeypatch, checkpoints):
    """Arrivals mid-stream, different lengths, max_new_tokens, an EOS and a stop token learnt a
    step late, and an abort while a step is in flight."""
    config = engine_config(checkpoints["llama"], page_size=2)
    probe = generate_batch(config, PROMPTS[:2], dataclasses.replace(GREEDY, max_new_tokens=8))
    eos, stop = probe[0][3], probe[1][5]  # NOTE: tokens those requests really generate
    script = {
        0: [("add", request("a", PROMPTS[0], ignore_eos=False, max_new_tokens=10)),
            ("add", request("b", PROMPTS[1], stop_token_ids=(stop,), max_new_tokens=20))],
        2: [("add", request("c", PROMPTS[2], max_new_tokens=3))],
        3: [("add", request("d", PROMPTS[3], max_new_tokens=1)), ("add", request("e", PROMPTS[0] + [5], max_new_tokens=30))],
        6: [("abort", "e")],
        7: [("add", request("f", PROMPTS[2][:5], max_new_tokens=9))],
    }

    def with_eos(engine):
        engine.scheduler.limits = dataclasses.replace(engine.scheduler.limits, eos_token_ids=(eos,))

    (sync, sync_final, _), (ovl, ovl_final, _) = run_both(monkeypatch, config, script, with_eos)
    assert sync_final["a"].finish_reason == ovl_final["a"].finish_reason == "stop"
    assert sync["a"][-1] == eos and len(sync["a"]) <= 4
    assert sync_final["b"].finish_reason == ovl_final["b"].finish_reason == "stop" and sync["b"][-1] == stop
    assert [len(sync[r]) for r in "cdf"] == [3, 1, 9]
    assert ovl_final["e"].finish_reason == sync_final["e"].finish_reason == "abort"
    # NOTE: an abort ends a request wherever it is: with a token in flight it has one fewer
    assert ovl["e"] == sync["e"][: len(ovl["e"])] and len(ovl["e"]) >= len(sync["e"]) - 1
    assert {r: t for r, t in ovl.items() if r != "e"} == {r: t for r, t in sync.items() if r != "e"}
    assert all(ovl_final[r].finish_reason == sync_final[r].finish_reason for r in sync_final)


@pytest.mark.parametrize("page_size", [1, 4])
def test_preemption_and_chunked_prefill(monkeypatch, checkpoints, page_size):
    # NOTE: page size 4 without the radix cache (preempted requests recompute everything)
    config = engine_config(checkpoints["qwen2"], page_size=page_size, max_total_tokens=64, chunked_prefill_size=8,
                           disable_radix_cache=page_size == 4)
    sampling = dict(max_new_tokens=20)
    script = {0: [("add", request(f"r{i}", p, **sampling)) for i, p in enumerate(PROMPTS * 2)],
              5: [("add", request("late", PROMPTS[2], max_new_tokens=6))]}
    (sync, _, sync_engine), (ovl, _, ovl_engine) = run_both(monkeypatch, config, script)
    assert sync_engine.scheduler.num_preemptions > 0 and ovl_engine.scheduler.num_preemptions > 0
    assert ovl == sync


def test_radix_cache_reuse(monkeypatch, checkpoints):
    shared = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    script = {0: [("add", request("a0", shared + [1])), ("add", request("a1", shared + [2, 3]))],
              4: [("add", request("b0", shared + [4, 5, 6]))],
              14: [("add", request("b1", shared[:6])), ("add", request("b2", shared + [1, 7]))]}
    (sync, sync_final, _), (ovl, ovl_final, _) = run_both(monkeypatch, engine_config(checkpoints["llama"], page_size=2), script)
    assert ovl == sync
    assert [ovl_final[r].cached_tokens for r in ("b1", "b2")] == [sync_final[r].cached_tokens for r in ("b1", "b2")]
    assert ovl_final["b2"].cached_tokens == 10


def test_sampled_requests_beside_greedy_ones_get_the_synchronous_tokens(monkeypatch, checkpoints):
    """A seeded sampled request beside greedy ones: the steps it is in are sampled on the device
    and stay in flight, with the synchronous engine's tokens."""
    seeded = dict(temperature=0.9, top_p=0.95, seed=7, max_new_tokens=10)
    script = {0: [("add", request("g0", PROMPTS[0], max_new_tokens=16))],
              3: [("add", request("s", PROMPTS[1], **seeded))],
              5: [("add", request("g1", PROMPTS[2], max_new_tokens=8))]}
    (sync, _, _), (ovl, _, _) = run_both(monkeypatch, engine_config(checkpoints["qwen3"]), script)
    assert ovl == sync


def test_sampled_steps_stay_in_flight_and_keep_seeds_stops_and_log_probabilities(monkeypatch, checkpoints):
    """Only sampled requests (seeded, temperature alone or filtered, one with a stop token learnt a
    step late, one aborted with a token in flight): the steps stay in flight (run_both checks it;
    before session 32 every sampled step finished at once), and the tokens, finish reasons and
    log-probabilities equal the synchronous engine's."""
    config = engine_config(checkpoints["llama"], page_size=2)
    first = dict(temperature=0.8, seed=3, max_new_tokens=12)
    probe = generate_batch(config, [PROMPTS[1]], dataclasses.replace(GREEDY, **first))[0]
    stop = probe[4]
    script = {0: [("add", request("a", PROMPTS[0], temperature=1.1, seed=1, max_new_tokens=14)),
                  ("add", request("b", PROMPTS[1], stop_token_ids=(stop,), **first))],
              2: [("add", request("c", PROMPTS[2], temperature=0.7, top_k=5, top_p=0.9, seed=5, max_new_tokens=9))],
              4: [("add", request("d", PROMPTS[3], temperature=0.9, seed=8, max_new_tokens=30))],
              7: [("abort", "d")]}
    logprobs = []

    def keep_logprobs(engine):
        real = engine._outputs

        def outputs(*args):
            out = real(*args)
            logprobs.append({o.rid: o.logprobs for o in out})
            return out

        engine._outputs = outputs

    (sync, sync_final, _), (ovl, ovl_final, _) = run_both(monkeypatch, config, script, keep_logprobs)
    assert sync_final["b"].finish_reason == ovl_final["b"].finish_reason == "stop" and sync["b"][-1] == stop
    assert ovl_final["d"].finish_reason == sync_final["d"].finish_reason == "abort"
    assert ovl["d"] == sync["d"][: len(ovl["d"])] and len(ovl["d"]) >= len(sync["d"]) - 1
    assert {r: t for r, t in ovl.items() if r != "d"} == {r: t for r, t in sync.items() if r != "d"}
    half = len(logprobs) // 2  # NOTE: the engines ran one after the other

    def per_request(parts):
        joined = defaultdict(list)
        for part in parts:
            for rid, values in part.items():
                joined[rid].extend(values)
        return joined

    sync_lp, ovl_lp = per_request(logprobs[:half]), per_request(logprobs[half:])
    for rid in "abc":  # NOTE: a finished request's row stays one step longer in flight: batches differ in float32
        assert ovl_lp[rid] == pytest.approx(sync_lp[rid], abs=1e-5), rid


def test_a_row_that_cannot_be_sampled_fails_its_request_only_in_flight(monkeypatch, checkpoints):
    """A NaN temperature (the server refuses it; the engine must still survive it) makes its row
    unsampleable on the device: with the step in flight, that request fails (abort, the sampler's
    error) when the step is read, and the others get the synchronous engine's tokens."""
    import math

    script = {0: [("add", request("ok", PROMPTS[0], temperature=0.9, seed=2, max_new_tokens=10)),
                  ("add", request("nan", PROMPTS[1], temperature=math.nan, max_new_tokens=10)),
                  ("add", request("g", PROMPTS[2], max_new_tokens=10))]}
    (sync, sync_final, _), (ovl, ovl_final, _) = run_both(monkeypatch, engine_config(checkpoints["llama"]), script)
    for final in (sync_final, ovl_final):
        assert final["nan"].finish_reason == "abort" and "probability" in final["nan"].error
        assert final["ok"].finish_reason == final["g"].finish_reason == "length"
    assert ovl["ok"] == sync["ok"] and ovl["g"] == sync["g"] and ovl["nan"] == sync["nan"] == []


def test_tp2_overlapped_matches_tp1(monkeypatch, checkpoints):
    """Every rank fills the placeholders from its own greedy buffer (workers inherit the env)."""
    single = generate_batch(engine_config(checkpoints["llama"]), PROMPTS, GREEDY)
    monkeypatch.setenv(OVERLAP_ENV, "1")
    config = engine_config(checkpoints["llama"], tp_size=2, page_size=2, max_total_tokens=48)
    assert generate_batch(config, PROMPTS, GREEDY) == single


def test_placeholders_take_the_previous_greedy_choices_by_logit_row():
    """build_step_input lists the placeholder rows; the forward fills them from the previous
    step's greedy buffer, logit row -> its column (a partial prefill chunk samples nothing)."""
    import torch

    from sglaunch.engine.model_runner import GreedyReadback, ModelRunner
    from sglaunch.engine.request import Req
    from sglaunch.engine.scheduler import Chunk
    from sglaunch.engine.step import build_step_input, placeholder

    a, b = Req("a", [5, 6, placeholder(2)], GREEDY, 0), Req("b", [7, placeholder(0)], GREEDY, 1)
    a.pages, b.pages = [0, 1, 2], [3, 4]
    step = build_step_input([Chunk(a, 1, 3), Chunk(b, 1, 2)], page_size=1)
    assert (step.future_rows, step.future_sources) == ([1, 2], [2, 0])
    runner = object.__new__(ModelRunner)
    runner.device = torch.device("cpu")
    greedy = torch.tensor([[11.0, 12.0, 13.0, 14.0], [-0.5, -1.5, -2.5, -3.5]], dtype=torch.float64)
    ids = torch.tensor(step.input_ids)
    runner._fill_placeholders(ids, step, (greedy, [0, 2, 3]))  # logit rows 0, 1, 2 -> columns 0, 2, 3
    assert ids.tolist() == [6, 14, 11]
    decode = dataclasses.replace(step, input_ids=[-1, -2], future_rows=[0, 1], future_sources=[0, 1])
    ids = torch.tensor(decode.input_ids)
    runner._fill_placeholders(ids, decode, (greedy, [0, 1, 2, 3]))  # a decode batch: one copy
    assert ids.tolist() == [11, 12]
    with pytest.raises(RuntimeError, match="greedy choices"):
        runner._fill_placeholders(ids, decode, None)
    assert GreedyReadback(greedy.tolist(), [0, 2, 3], None).get([2, 0]) == ([14, 11], [-3.5, -0.5])


def test_a_failed_step_with_one_in_flight_fails_its_requests_and_frees_pages(monkeypatch, checkpoints):
    """The engine process fails the running requests when a step raises (fail_running): with a
    step in flight, that includes the preempted ones holding a placeholder; then it goes on."""
    config = engine_config(checkpoints["llama"], page_size=2)
    want = generate_batch(config, [PROMPTS[0]], GREEDY)[0]
    monkeypatch.setenv(OVERLAP_ENV, "1")
    engine, cluster = create_engine(config)
    try:
        for i, prompt in enumerate(PROMPTS):
            engine.add_request(request(f"r{i}", prompt))
        for _ in range(3):
            engine.step()
        assert engine._in_flight is not None
        forward = engine.runner.forward

        def broken(step):
            raise RuntimeError("boom")

        engine.runner.forward = broken
        with pytest.raises(RuntimeError, match="boom"):
            engine.step()
        engine.runner.forward = forward
        outs = engine.fail_running(RuntimeError("boom"))
        assert sorted(o.rid for o in outs) == [f"r{i}" for i in range(len(PROMPTS))]
        assert all(o.finished and o.finish_reason == "abort" and "boom" in o.error for o in outs)
        assert not engine.has_work
        assert_all_pages_free(engine)
        tokens, _, in_flight = drive(engine, {0: [("add", request("after", PROMPTS[0]))]})
        assert tokens["after"] == want and in_flight > 0
        assert_all_pages_free(engine)
    finally:
        cluster.stop(engine)


@pytest.mark.parametrize("overlap", ["0", "1"])
def test_admission_grouping_changes_no_token(monkeypatch, checkpoints, overlap):
    """SGLAUNCH_ADMIT_WAIT_STEPS holds arrivals beside a decoding batch (scheduler tests): the
    engine, pipelined or not, still produces every request's greedy tokens, with some steps held."""
    from sglaunch.engine.scheduler import ADMIT_GROUP_ENV, ADMIT_WAIT_ENV

    config = engine_config(checkpoints["llama"], page_size=2)
    script = {
        0: [("add", request("a", PROMPTS[0], max_new_tokens=24))],
        2: [("add", request("b", PROMPTS[1], max_new_tokens=6))],
        5: [("add", request("c", PROMPTS[2], max_new_tokens=5)), ("add", request("d", PROMPTS[3], max_new_tokens=4))],
        6: [("add", request("e", PROMPTS[0] + [5], max_new_tokens=7))],
    }
    monkeypatch.setenv(OVERLAP_ENV, overlap)
    results = []
    for wait in ("0", "3"):
        monkeypatch.setenv(ADMIT_WAIT_ENV, wait)
        monkeypatch.setenv(ADMIT_GROUP_ENV, "3")
        engine, cluster = create_engine(config)
        try:
            assert engine.scheduler.limits.admit_wait_steps == int(wait)
            tokens, finals, _ = drive(engine, script)
            assert_all_pages_free(engine)
            results.append((tokens, engine.scheduler.held_steps, engine.scheduler.num_prefill_steps))
        finally:
            cluster.stop(engine)
    (plain, plain_held, plain_prefills), (grouped, held, prefills) = results
    assert grouped == plain and [len(plain[r]) for r in "abcde"] == [24, 6, 5, 4, 7]
    assert plain_held == 0 and held > 0
    assert prefills < plain_prefills  # b waited for c, d and e: one step admitted them all


def test_a_row_whose_settings_fail_on_the_host_fails_alone_and_the_step_finishes_at_once(monkeypatch, checkpoints):
    """A row the filter raises for (sampler._filtered_rows retries each row alone): that step is
    read at once from the choices already drawn (no second draw), the request fails, and the
    others get the synchronous engine's tokens."""
    from sglaunch.engine import sampler

    real = sampler.filtered_probs

    def picky(logits, params):
        if any(p.min_p == 0.125 for p in params):
            raise ValueError("refused by the test")
        return real(logits, params)

    monkeypatch.setattr(sampler, "filtered_probs", picky)
    script = {0: [("add", request("ok", PROMPTS[0], temperature=0.9, seed=2, max_new_tokens=10)),
                  ("add", request("g", PROMPTS[2], max_new_tokens=10))],
              3: [("add", request("bad", PROMPTS[1], temperature=0.9, min_p=0.125, max_new_tokens=10))]}
    (sync, sync_final, _), (ovl, ovl_final, _) = run_both(monkeypatch, engine_config(checkpoints["llama"]), script)
    for final in (sync_final, ovl_final):
        assert final["bad"].finish_reason == "abort" and "refused by the test" in final["bad"].error
    assert ovl == sync and ovl["bad"] == []
