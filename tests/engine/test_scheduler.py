"""Scheduler policy without torch: a fake model checks that every chunk sees the right KV.

The fake KV pool stores, per slot, the token whose K/V would be there; before computing a
chunk we assert the request's pages hold exactly its earlier tokens (whether computed by
itself, borrowed from the radix cache, or recomputed after preemption).
"""

from __future__ import annotations

import pytest

from sglaunch.engine.allocator import PageAllocator
from sglaunch.engine.interface import SamplingParams
from sglaunch.engine.radix_cache import RadixCache
from sglaunch.engine.request import Req
from sglaunch.engine.scheduler import Scheduler, SchedulerLimits


def fake_next_token(tokens: list[int]) -> int:
    """Deterministic function of the whole history, like a greedy model."""
    return (sum(t * (i + 1) for i, t in enumerate(tokens)) * 31 + len(tokens)) % 50 + 100


def reference(prompt: list[int], n: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(fake_next_token(tokens))
    return tokens[len(prompt):]


def make_scheduler(num_pages, page_size=1, radix=True, max_running=8, chunk=None, eos=(), context=10_000):
    alloc = PageAllocator(num_pages)
    cache = RadixCache(page_size, alloc.free) if radix else None
    limits = SchedulerLimits(page_size, max_running, chunk, context, tuple(eos))
    return Scheduler(limits, alloc, cache)


def run(sched: Scheduler, reqs: list[Req], max_steps: int = 10_000) -> list[list]:
    ps = sched.limits.page_size
    pool: dict[int, int] = sched.__dict__.setdefault("fake_pool", {})  # survives runs
    steps = []
    for req in reqs:
        sched.add(req)
    while sched.has_work and len(steps) < max_steps:
        chunks = sched.schedule()
        steps.append([(c.req.rid, c.start, c.end) for c in chunks])
        sampled = []
        for c in chunks:
            req = c.req
            for pos in range(c.end):
                slot = req.pages[pos // ps] * ps + pos % ps
                if pos < c.start:
                    assert pool[slot] == req.token_ids[pos], f"{req.rid}: stale KV at position {pos}"
                else:
                    pool[slot] = req.token_ids[pos]
            sampled.append(fake_next_token(req.token_ids) if c.samples else None)
        sched.commit(chunks, sampled)
    assert not sched.has_work
    return steps


def make_reqs(prompts, max_new=12, **sampling):
    return [Req(f"r{i}", p, SamplingParams(max_new_tokens=max_new, **sampling), 0) for i, p in enumerate(prompts)]


PROMPTS = [[1, 2, 3, 4, 5], [1, 2, 3, 9], [7] * 11, [4, 4], [1, 2, 3, 4, 5, 6, 7, 8]]


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("radix", [True, False])
def test_outputs_match_reference_and_pages_come_back(page_size, radix):
    sched = make_scheduler(256, page_size, radix)
    reqs = make_reqs(PROMPTS)
    run(sched, reqs)
    for req, prompt in zip(reqs, PROMPTS):
        assert req.output_ids == reference(prompt, 12) and req.finish_reason == "length"
    held = sched.radix.cached_pages if radix else 0
    assert sched.allocator.num_used == held


@pytest.mark.parametrize("page_size", [1, 2])
def test_preemption_under_a_tiny_pool_changes_nothing(page_size):
    sched = make_scheduler(num_pages=24 // page_size, page_size=page_size)
    reqs = make_reqs(PROMPTS, max_new=10)
    run(sched, reqs)
    assert sched.num_preemptions > 0
    for req, prompt in zip(reqs, PROMPTS):
        assert req.output_ids == reference(prompt, 10)


def test_chunked_prefill_respects_budget():
    sched = make_scheduler(256, chunk=4)
    reqs = make_reqs([list(range(1, 15)), [3, 3, 3, 3, 3, 3]], max_new=3)
    steps = run(sched, reqs)
    for step in steps:
        prefill = sum(end - start for rid, start, end in step if end - start > 1)
        assert prefill <= 4
    assert reqs[0].output_ids == reference(list(range(1, 15)), 3)


def test_steps_with_prompt_tokens_are_counted():
    """num_prefill_steps (/server_info's total_prefill_steps): every step that computed prompt
    tokens, and none of the decode-only steps, whether or not a budget caps the chunks."""
    for chunk in (None, 4):
        sched = make_scheduler(256, radix=False, chunk=chunk)
        reqs = make_reqs([list(range(1, 15)), [3, 3, 3, 3, 3, 3]], max_new=3)
        steps = run(sched, reqs)
        with_prompt = sum(any(end - start > 1 for _, start, end in step) for step in steps)
        assert with_prompt >= 1 and with_prompt < len(steps)
        assert sched.num_prefill_steps == with_prompt, (chunk, steps)


def test_radix_reuses_prefix_of_finished_request():
    sched = make_scheduler(256)
    first = make_reqs([[5, 6, 7, 8, 9, 10]], max_new=2)
    run(sched, first)
    second = [Req("again", [5, 6, 7, 8, 9, 10, 11], SamplingParams(max_new_tokens=2), 0)]
    steps = run(sched, second)
    assert second[0].cached_tokens == 6
    assert steps[0] == [("again", 6, 7)]


def test_max_running_requests_caps_the_batch():
    sched = make_scheduler(256, max_running=2)
    steps = run(sched, make_reqs(PROMPTS, max_new=3))
    assert max(len(s) for s in steps) <= 2


def test_stop_conditions():
    sched = make_scheduler(256, eos=[reference([1, 2], 3)[2]])
    eos_req, stop_req, ignore_req = make_reqs([[1, 2]] * 3, max_new=20)
    stop_req.sampling = SamplingParams(max_new_tokens=20, stop_token_ids=(reference([1, 2], 2)[1],))
    ignore_req.sampling = SamplingParams(max_new_tokens=5, ignore_eos=True)
    run(sched, [eos_req, stop_req, ignore_req])
    assert len(eos_req.output_ids) == 3 and eos_req.finish_reason == "stop"
    assert len(stop_req.output_ids) == 2 and stop_req.finish_reason == "stop"
    assert len(ignore_req.output_ids) == 5 and ignore_req.finish_reason == "length"


def test_context_length_stops_generation_and_rejects_prompts():
    sched = make_scheduler(256, context=8)
    with pytest.raises(ValueError, match="context length"):
        sched.check(8, 1)
    with pytest.raises(ValueError, match="empty"):
        sched.check(0, 1)
    (req,) = make_reqs([[1, 2, 3, 4, 5]], max_new=100)
    run(sched, [req])
    assert len(req.token_ids) == 8 and req.finish_reason == "length"


def test_prompt_larger_than_pool_is_rejected():
    sched = make_scheduler(4)
    with pytest.raises(ValueError, match="KV pool"):
        sched.check(4, 1)


def test_request_that_outgrows_the_pool_alone_finishes_with_length():
    sched = make_scheduler(6, radix=False)
    (req,) = make_reqs([[1, 2, 3]], max_new=100)
    run(sched, [req])
    assert req.finish_reason == "length" and len(req.output_ids) >= 3
    assert sched.allocator.num_used == 0


def test_abort_frees_pages_wherever_the_request_is():
    sched = make_scheduler(256, radix=False, max_running=1)
    a, b = make_reqs([[1, 2, 3], [4, 5, 6]], max_new=50)
    sched.add(a)
    sched.add(b)
    chunks = sched.schedule()
    sched.commit(chunks, [fake_next_token(a.token_ids)])
    assert sched.allocator.num_used > 0
    assert sched.abort("r1").finish_reason == "abort"  # waiting
    assert sched.abort("r0").finish_reason == "abort"  # running
    assert sched.abort("r0") is None
    assert sched.allocator.num_used == 0 and not sched.has_work


# ---- speculative decoding: lookahead pages, multi-token commits, rollback ------------------


def run_speculative(sched: Scheduler, reqs: list[Req], seed: int) -> None:
    """Like run(), but decoding chunks with lookahead verify drafts (right or wrong at random):
    the fake KV pool receives the drafts too, as the real verify writes rejected rows' K/V."""
    import random

    rng, ps = random.Random(seed), sched.limits.page_size
    pool: dict[int, int] = {}
    for req in reqs:
        sched.add(req)
    while sched.has_work:
        chunks = sched.schedule()
        # the engine's inlined candidates rule is the per-chunk one
        assert sched.lookahead_candidates(chunks) == [c for c in chunks if sched._chunk_lookahead(c) > 0]
        sampled = []
        for c in chunks:
            req = c.req
            if c.lookahead:
                truth = reference(req.token_ids, c.lookahead)
                c.draft_tokens = [t if rng.random() < 0.7 else t + 1 for t in truth][: rng.randint(0, c.lookahead)]
            rows = req.token_ids[: c.end] + c.draft_tokens
            for pos, token in enumerate(rows):
                slot = req.pages[pos // ps] * ps + pos % ps
                if pos < c.start:
                    assert pool[slot] == token, f"{req.rid}: stale KV at position {pos}"
                else:
                    pool[slot] = token
            if c.lookahead:
                n = next((i for i, (d, t) in enumerate(zip(c.draft_tokens, truth)) if d != t), len(c.draft_tokens))
                sampled.append(truth[: n + 1])
            else:
                sampled.append(fake_next_token(req.token_ids) if c.samples else None)
        sched.commit(chunks, sampled)
        for req in sched.running:  # rollback: pages hold exactly the committed KV
            assert len(req.pages) == -(-req.num_computed // ps)


def test_lookahead_candidates_near_the_length_and_context_limits():
    """Requests a token or two from max_new_tokens or the context length: the candidates (the
    inlined rule) are the chunks whose per-chunk lookahead cap is positive, step after step."""
    sched = make_scheduler(400, chunk=8, context=40)
    sched.limits = SchedulerLimits(1, 8, 8, 40, (), spec_lookahead=5)
    # r1 and r4 run into the context length before max_new_tokens, the others into max_new_tokens
    prompts = [[1, 2, 3], [9] * 30, [1, 2, 3, 4, 5, 6, 7, 8, 9], [4, 4], [5] * 36]
    reqs = [Req(f"r{i}", p, SamplingParams(max_new_tokens=n, ignore_eos=True), 0)
            for i, (p, n) in enumerate(zip(prompts, (2, 30, 3, 1, 20)))]
    run_speculative(sched, reqs, seed=3)
    assert all(req.finish_reason == "length" for req in reqs)


def test_context_gaps_reach_every_chunk_of_a_decode_only_step_and_no_later_arrival():
    """Engine._draft_context skips the draft context of a decode-only step and marks the running
    requests (mark_context_gaps, which passes over the not-yet-gapped ones only): every chunk of such a
    step is marked, a request admitted later is not and drafts, a finished or gapped one leaves the
    list, and the candidates stay the per-chunk rule's at every step (also when the list is empty)."""
    import random

    rng = random.Random(7)
    sched = make_scheduler(600, chunk=16, max_running=6)
    sched.limits = SchedulerLimits(1, 6, 16, 10_000, (), spec_lookahead=4)
    prompts = [[rng.randrange(1, 90) for _ in range(rng.randint(1, 12))] for _ in range(14)]
    reqs = [Req(f"r{i}", p, SamplingParams(max_new_tokens=rng.randint(2, 14), ignore_eos=True), 0)
            for i, p in enumerate(prompts)]
    for req in reqs[:6]:
        sched.add(req)
    pending, marked_steps, empty_steps = reqs[6:], 0, 0
    while sched.has_work:
        if pending and rng.random() < 0.3:
            sched.add(pending.pop(0))
        chunks = sched.schedule()
        candidates = sched.lookahead_candidates(chunks)
        assert candidates == [c for c in chunks if sched._chunk_lookahead(c) > 0]
        empty_steps += not sched.gapless
        if chunks and all(c.end - c.start == 1 for c in chunks) and rng.random() < 0.5:
            sched.mark_context_gaps()
            marked_steps += 1
            assert all(c.req.context_gap for c in chunks)
            assert sched.lookahead_candidates(chunks) == [] and sched.gapless == []
        sched.commit(chunks, [fake_next_token(c.req.token_ids) if c.samples else None for c in chunks])
    assert marked_steps and empty_steps
    # the requests admitted after the last mark never got a gap
    assert any(not req.context_gap for req in reqs) and any(req.context_gap for req in reqs)
    assert sched.gapless == [] or not sched.any_gapless()  # every request finished
    for req, prompt in zip(reqs, prompts):
        assert req.output_ids == reference(prompt, len(req.output_ids)) and req.finish_reason == "length"


@pytest.mark.parametrize("page_size,num_pages", [(1, 400), (4, 100), (2, 40)])
def test_speculative_commits_match_plain_decoding(page_size, num_pages):
    sched = make_scheduler(num_pages, page_size=page_size, chunk=8)
    sched.limits = SchedulerLimits(page_size, 8, 8, 10_000, (), spec_lookahead=5)
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9], [1, 2, 3, 4, 5, 6, 7, 8, 9], [4, 4]] * 3
    reqs = [Req(f"r{i}", p, SamplingParams(max_new_tokens=11 + i, ignore_eos=True), 0) for i, p in enumerate(prompts)]
    run_speculative(sched, reqs, seed=page_size)
    for req, prompt in zip(reqs, prompts):
        assert req.output_ids == reference(prompt, len(req.output_ids)) and req.finish_reason == "length"
        assert req.num_output_tokens == req.sampling.max_new_tokens  # lookahead never overshoots
    assert sched.allocator.num_used == sched.radix.cached_pages


def test_stop_token_inside_a_multi_token_commit_truncates_there():
    sched = make_scheduler(64, eos=(777,))
    sched.limits = SchedulerLimits(1, 8, None, 10_000, (777,), spec_lookahead=4)
    req = Req("a", [1, 2, 3], SamplingParams(max_new_tokens=20), 0)
    sched.add(req)
    chunks = sched.schedule()
    sched.commit(chunks, [50])
    (chunk,) = sched.schedule()
    assert chunk.lookahead == 4 and len(req.pages) == 4 + 4  # anchor at position 3, drafts at 4..7
    chunk.draft_tokens = [60, 777, 80]
    assert sched.commit([chunk], [[60, 777, 80, 90]]) == [req]
    assert req.output_ids == [50, 60, 777] and chunk.committed == 2 and req.finish_reason == "stop"
    assert sched.allocator.num_used == sched.radix.cached_pages


def test_lookahead_is_capped_and_never_preempts():
    sched = make_scheduler(12, chunk=None)
    sched.limits = SchedulerLimits(1, 8, None, 10_000, (), spec_lookahead=7)
    a = Req("a", [1, 2, 3, 4], SamplingParams(max_new_tokens=3, ignore_eos=True), 0)
    b = Req("b", [5, 6, 7, 8], SamplingParams(max_new_tokens=9, ignore_eos=True), 0)
    for req in (a, b):
        sched.add(req)
    sched.commit(sched.schedule(), [10, 11])
    chunks = sched.schedule()
    # a: 2 more tokens allowed -> at most 1 draft; b: 12 pages minus a's 6 minus b's 5 -> none left
    assert [c.lookahead for c in chunks] == [1, 0] and sched.num_preemptions == 0


# ---- overlap: tokens learnt one step late (LLMEngine._step_overlapped) ---------------------


def run_overlapped(sched: Scheduler, reqs: list[Req], max_steps: int = 10_000) -> int:
    """Like run(), pipelined as the overlapped engine is: step N + 1 is scheduled and computed
    before step N's tokens are resolved; its placeholder inputs take step N's tokens (the
    device's copy). Returns how many steps had a placeholder input."""
    ps, pool, flight, filled, steps = sched.limits.page_size, {}, None, 0, 0
    for req in reqs:
        sched.add(req)
    while sched.has_work and steps < max_steps:
        steps += 1
        chunks = sched.schedule()
        tokens = []  # per chunk (its "logit row"), what the device chooses
        for c in chunks:
            ids = [flight[2][-1 - t] if t < 0 else t for t in c.req.token_ids[: c.end]]  # NOTE: the device fill
            filled += ids != c.req.token_ids[: c.end]
            for pos in range(c.end):
                slot = c.req.pages[pos // ps] * ps + pos % ps
                if pos < c.start:
                    assert pool[slot] == ids[pos], f"{c.req.rid}: stale KV at position {pos}"
                else:
                    pool[slot] = ids[pos]
            tokens.append(fake_next_token(ids) if c.samples else None)
        dropped = {id(r) for r in sched.take_dropped()}
        if flight is not None:  # step N, read back now
            for chunk, index in zip(flight[0], flight[1]):
                if index is not None and (chunk.req.status.value != "finished" or id(chunk.req) in dropped):
                    sched.resolve(chunk.req, index, flight[2][-1 - chunk.req.token_ids[index]])
        live = [i for i, c in enumerate(chunks) if c.req.status.value == "running"]
        marks = [-1 - i if tokens[i] is not None else None for i in live]
        flight = ([chunks[i] for i in live], sched.commit_placeholders([chunks[i] for i in live], marks), tokens)
    assert not sched.has_work
    return filled


@pytest.mark.parametrize("page_size", [1, 2])
@pytest.mark.parametrize("num_pages", [24, 256])
def test_overlapped_steps_match_synchronous_ones(page_size, num_pages):
    """Preemption (tiny pool) and radix reuse while a step is in flight, EOS and stop tokens
    learnt a step late, max_new_tokens known in advance; no stale KV, every page back."""
    eos, stop = reference([1, 2], 3)[2], reference(PROMPTS[2], 4)[3]
    outcomes = []
    for overlapped in (False, True):
        sched = make_scheduler(num_pages // page_size, page_size, eos=[eos])
        reqs = make_reqs(PROMPTS + [[1, 2], [1, 2, 3, 4, 5, 6, 7, 8, 9]], max_new=10, stop_token_ids=(stop,))
        reqs[-1].sampling = SamplingParams(max_new_tokens=1)
        filled = run_overlapped(sched, reqs) if overlapped else (run(sched, reqs), 0)[1]
        assert filled > 0 or not overlapped
        assert sched.allocator.num_used == sched.radix.cached_pages
        assert num_pages > 24 or sched.num_preemptions > 0
        outcomes.append([(r.output_ids, r.finish_reason) for r in reqs])
    assert outcomes[0] == outcomes[1]
    assert {reason for _, reason in outcomes[0]} == {"stop", "length"}


def test_placeholder_of_an_aborted_request_is_never_kept():
    sched = make_scheduler(256, radix=False)
    (a,) = make_reqs([[1, 2, 3]], max_new=5)
    sched.add(a)
    chunks = sched.schedule()
    assert sched.commit_placeholders(chunks, [-1]) == [3] and a.token_ids[-1] == -1
    assert sched.abort("r0").output_ids == [] and sched.allocator.num_used == 0


def test_a_request_whose_last_token_is_in_flight_is_not_scheduled_again():
    sched = make_scheduler(256, radix=False)
    (a,) = make_reqs([[1, 2, 3]], max_new=1)
    sched.add(a)
    sched.commit_placeholders(sched.schedule(), [-1])
    assert a.final_pending and sched.schedule() == []
    assert sched.resolve(a, 3, 77) == "length" and a.output_ids == [77] and sched.allocator.num_used == 0
    with pytest.raises(RuntimeError, match="placeholder"):
        sched.resolve(a, 3, 78)


def test_a_multi_token_commit_stops_where_the_token_by_token_rules_stop():
    """_append_many (a speculative step's or a burst's tokens at once) against _finish_reason
    applied token by token: the same tokens kept and the same reason, over random stop tokens,
    EOS with and without ignore_eos, max_new_tokens and context limits."""
    import random

    from sglaunch.engine.scheduler import Chunk

    rng = random.Random(7)
    for case in range(3000):
        eos = tuple(rng.sample(range(20), rng.randint(0, 2)))
        context = rng.randint(6, 30)
        sched = make_scheduler(64, eos=eos, context=context)
        params = SamplingParams(max_new_tokens=rng.randint(1, 12), ignore_eos=rng.random() < 0.3,
                                stop_token_ids=tuple(rng.sample(range(20), rng.randint(0, 2))))
        prompt = [rng.randrange(20, 40) for _ in range(rng.randint(1, 5))]
        generated = [rng.randrange(20, 40) for _ in range(rng.randint(0, min(params.max_new_tokens - 1,
                                                                              context - len(prompt) - 1)))]
        tokens = [rng.randrange(20) if rng.random() < 0.2 else rng.randrange(20, 40) for _ in range(rng.randint(2, 9))]

        def fresh():
            req = Req("r", prompt, params, 0)
            req.token_ids.extend(generated)
            return req, Chunk(req, len(req.token_ids) - 1, len(req.token_ids))

        ref_req, ref_chunk = fresh()
        expected = None
        for token in tokens:
            ref_req.token_ids.append(token)
            ref_chunk.committed += 1
            expected = sched._finish_reason(ref_req, token)
            if expected is not None:
                break
        req, chunk = fresh()
        assert sched._append_tokens(chunk, tokens) == expected, case
        assert (req.token_ids, chunk.committed) == (ref_req.token_ids, ref_chunk.committed), case


def grouped_scheduler(wait: int, group: int, max_running: int = 8, chunk=None):
    alloc = PageAllocator(512)
    limits = SchedulerLimits(1, max_running, chunk, 10_000, (), admit_wait_steps=wait, admit_group=group)
    return Scheduler(limits, alloc, None)


def drive(sched: Scheduler, arrivals: dict[int, list[Req]], max_steps: int = 500):
    """Step the scheduler, adding arrivals[s] before step s; returns (per request, the step its
    first chunk was scheduled), and every request's generated tokens."""
    admitted, reqs, step = {}, [], 0
    while (sched.has_work or any(s >= step for s in arrivals)) and step < max_steps:
        for req in arrivals.get(step, []):
            sched.add(req)
            reqs.append(req)
        chunks = sched.schedule()
        for c in chunks:
            admitted.setdefault(c.req.rid, step)
        sched.commit(chunks, [fake_next_token(c.req.token_ids) if c.samples else None for c in chunks])
        step += 1
    assert not sched.has_work
    return admitted, {r.rid: r.token_ids[r.num_prompt_tokens:] for r in reqs}


def new_req(rid: str, prompt: list[int], max_new: int = 20) -> Req:
    return Req(rid, prompt, SamplingParams(max_new_tokens=max_new), 0)


def test_admission_grouping_holds_arrivals_while_a_batch_decodes():
    """SGLAUNCH_ADMIT_WAIT_STEPS: an arrival beside a decoding batch waits up to `wait` steps; as
    soon as `group` wait, they are admitted together; with nothing running, at once; the tokens
    are the same as without grouping."""
    prompts = {"a": [1, 2, 3], "b": [4, 5], "c": [6, 7, 8, 9], "d": [2, 2], "e": [9, 8, 7]}

    def arrivals():
        return {0: [new_req("a", prompts["a"], 30)], 3: [new_req("b", prompts["b"])],
                12: [new_req("c", prompts["c"])], 13: [new_req("d", prompts["d"])], 14: [new_req("e", prompts["e"])]}

    sched = grouped_scheduler(wait=4, group=3)
    admitted, tokens = drive(sched, arrivals())
    assert admitted["a"] == 0  # nothing running: at once
    assert admitted["b"] == 3 + 4  # held four steps beside a's decodes
    assert admitted["c"] == admitted["d"] == admitted["e"] == 14  # the third arrival completes the group
    assert sched.held_steps == 4 + 2
    plain = grouped_scheduler(wait=0, group=3)
    plain_admitted, plain_tokens = drive(plain, arrivals())
    assert plain_admitted == {"a": 0, "b": 3, "c": 12, "d": 13, "e": 14} and plain.held_steps == 0
    assert tokens == plain_tokens
    for rid, prompt in prompts.items():
        assert tokens[rid] == reference(prompt, len(tokens[rid]))


def test_admission_grouping_admits_beside_a_prefill_and_when_the_batch_is_nearly_full():
    # a running request still in chunked prefill (20 + 9 tokens): the step computes prompt tokens
    # anyway, and its budget has room for the arrival
    sched = grouped_scheduler(wait=10, group=8, chunk=20)
    admitted, _ = drive(sched, {0: [new_req("long", list(range(1, 30)))], 1: [new_req("x", [5, 6])]})
    assert admitted["x"] == 1
    # room for one more request only: the one waiting fills the batch, no reason to hold it
    sched = grouped_scheduler(wait=10, group=8, max_running=2)
    admitted, _ = drive(sched, {0: [new_req("a", [1, 2])], 1: [new_req("b", [3, 4])]})
    assert admitted["b"] == 1
    # a preempted request resumes without being held
    sched = grouped_scheduler(wait=10, group=8)
    sched.add(new_req("a", [1, 2, 3]))
    sched.commit(chunks := sched.schedule(), [fake_next_token(c.req.token_ids) for c in chunks])
    victim = new_req("v", [7, 7])
    sched.add(victim)
    for _ in range(11):  # held, then admitted
        chunks = sched.schedule()
        sched.commit(chunks, [fake_next_token(c.req.token_ids) if c.samples else None for c in chunks])
    assert victim in sched.running
    sched.preempt(victim)
    chunks = sched.schedule()
    assert victim in [c.req for c in chunks]


def test_admission_from_env(monkeypatch):
    from sglaunch.engine.scheduler import ADMIT_GROUP_ENV, ADMIT_WAIT_ENV, admission_from_env

    monkeypatch.delenv(ADMIT_WAIT_ENV, raising=False)
    monkeypatch.delenv(ADMIT_GROUP_ENV, raising=False)
    assert admission_from_env() == {"admit_wait_steps": 0, "admit_group": 8}
    monkeypatch.setenv(ADMIT_WAIT_ENV, "6")
    monkeypatch.setenv(ADMIT_GROUP_ENV, "4")
    assert admission_from_env() == {"admit_wait_steps": 6, "admit_group": 4}
    monkeypatch.setenv(ADMIT_GROUP_ENV, "0")
    with pytest.raises(ValueError, match=ADMIT_GROUP_ENV):
        admission_from_env()
    monkeypatch.setenv(ADMIT_GROUP_ENV, "4")
    monkeypatch.setenv(ADMIT_WAIT_ENV, "soon")
    with pytest.raises(ValueError, match=ADMIT_WAIT_ENV):
        admission_from_env()


def test_graph_sized_steps_cap_decodes_and_prompt_chunks_together():
    """step_token_cap (SGLAUNCH_GRAPH_SIZED_STEPS): a step's decodes and prompt chunks together stay
    within the cap (prompts chunked to what the decodes leave), every request still gets the
    reference tokens, and with no cap the same arrivals go in one step."""
    prompts = [[5 + i] * 9 for i in range(6)]
    limits = SchedulerLimits(1, 16, None, 10_000, (), step_token_cap=20)
    sched = Scheduler(limits, PageAllocator(512), None)
    first = make_reqs([[1, 2], [3, 4]], max_new=40)
    for req in first:
        sched.add(req)
    sched.commit(chunks := sched.schedule(), [fake_next_token(c.req.token_ids) for c in chunks])  # their prefill
    arrivals = make_reqs(prompts, max_new=5)
    for i, req in enumerate(arrivals):
        req.rid = f"a{i}"
    for req in arrivals:
        sched.add(req)
    seen = []
    while sched.has_work:
        chunks = sched.schedule()
        rows = sum(c.end - c.start for c in chunks)
        assert rows <= 20, [(c.req.rid, c.start, c.end) for c in chunks]
        seen.append(rows)
        sched.commit(chunks, [fake_next_token(c.req.token_ids) if c.samples else None for c in chunks])
    assert max(seen) == 20  # the cap is used, not undershot
    for req, prompt in zip(arrivals, prompts):
        assert req.output_ids == reference(prompt, 5)
    assert [r.output_ids for r in first] == [reference(p, 40) for p in ([1, 2], [3, 4])]
    uncapped = make_scheduler(512, radix=False, max_running=16)
    for req in make_reqs(prompts, max_new=2):
        uncapped.add(req)
    assert sum(c.end - c.start for c in uncapped.schedule()) == 54  # all six prompts at once


def test_graph_sized_steps_always_leave_a_prompt_row():
    """More decodes than the cap still leave one prompt token a step: arrivals are never starved."""
    limits = SchedulerLimits(1, 16, None, 10_000, (), step_token_cap=2)
    sched = Scheduler(limits, PageAllocator(512), None)
    reqs = make_reqs([[1], [2], [3], [4, 5, 6, 7]], max_new=6)
    for req in reqs[:3]:
        sched.add(req)
    while sched.waiting:  # NOTE: the cap admits them over two steps too
        chunks = sched.schedule()
        sched.commit(chunks, [fake_next_token(c.req.token_ids) for c in chunks])
    assert len(sched.running) == 3
    sched.add(reqs[3])
    chunks = sched.schedule()
    assert [(c.req.rid, c.end - c.start) for c in chunks if c.req is reqs[3]] == [("r3", 1)]


def test_graph_step_cap_reads_its_switch_and_the_largest_tier(monkeypatch):
    """SGLAUNCH_GRAPH_SIZED_STEPS: on by default, the largest ragged tier of the runner's graphs, for a
    DSpark engine too (unless SGLAUNCH_DSPARK_GRAPH_SIZED_STEPS=0), nothing for an engine without graphs
    or without ragged tiers; 0 turns it off."""
    from types import SimpleNamespace

    from sglaunch.engine.engine import DSPARK_GRAPH_SIZED_STEPS_ENV, GRAPH_SIZED_STEPS_ENV, graph_step_cap

    def runner(tiers=(64, 128, 2048), draft=None, graphs=True):
        plan = SimpleNamespace(verify_tiers=tuple(tiers))
        return SimpleNamespace(draft=draft, graphs=SimpleNamespace(plan=plan) if graphs else None)

    monkeypatch.delenv(GRAPH_SIZED_STEPS_ENV, raising=False)
    monkeypatch.delenv(DSPARK_GRAPH_SIZED_STEPS_ENV, raising=False)
    assert graph_step_cap(runner()) == 2048
    monkeypatch.setenv(GRAPH_SIZED_STEPS_ENV, "0")
    assert graph_step_cap(runner()) is None
    monkeypatch.setenv(GRAPH_SIZED_STEPS_ENV, "1")
    assert graph_step_cap(runner()) == 2048
    assert graph_step_cap(runner(draft=object())) == 2048  # a DSpark engine: on by default (session 21)
    monkeypatch.setenv(DSPARK_GRAPH_SIZED_STEPS_ENV, "1")
    assert graph_step_cap(runner(draft=object())) == 2048
    monkeypatch.setenv(GRAPH_SIZED_STEPS_ENV, "0")  # the general switch still wins
    assert graph_step_cap(runner(draft=object())) is None
    monkeypatch.setenv(GRAPH_SIZED_STEPS_ENV, "1")
    monkeypatch.setenv(DSPARK_GRAPH_SIZED_STEPS_ENV, "0")
    assert graph_step_cap(runner(draft=object())) is None
    assert graph_step_cap(runner(graphs=False)) is None
    assert graph_step_cap(runner(tiers=())) is None
    monkeypatch.setenv(GRAPH_SIZED_STEPS_ENV, "yes")
    with pytest.raises(ValueError, match=GRAPH_SIZED_STEPS_ENV):
        graph_step_cap(runner())


def test_scheduler_limits_carry_the_graph_step_cap(monkeypatch, caplog):
    """The engine's limits take the cap, and say when SGLAUNCH_MIXED_MAX_QUERY leaves capped
    chunks eager."""
    import logging
    from types import SimpleNamespace

    from sglaunch.engine.engine import GRAPH_SIZED_STEPS_ENV, scheduler_limits

    config = SimpleNamespace(chunked_prefill_size=8192, page_size=1, running_cap=64)

    def runner(max_query):
        plan = SimpleNamespace(verify_tiers=(8, 512, 2048), max_query=max_query)
        return SimpleNamespace(draft=None, graphs=SimpleNamespace(plan=plan), context_length=4096,
                               spec=SimpleNamespace(eos_token_ids=(2,)))

    monkeypatch.setenv(GRAPH_SIZED_STEPS_ENV, "0")
    assert scheduler_limits(config, runner(256)).step_token_cap is None
    monkeypatch.delenv(GRAPH_SIZED_STEPS_ENV, raising=False)
    with caplog.at_level(logging.INFO, logger="sglaunch.engine.engine"):
        limits = scheduler_limits(config, runner(256))
    assert limits.step_token_cap == 2048 and limits.chunked_prefill_size == 8192
    assert "SGLAUNCH_MIXED_MAX_QUERY=2048" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="sglaunch.engine.engine"):
        assert scheduler_limits(config, runner(2048)).step_token_cap == 2048
    assert "at most 2048 rows" in caplog.text and "SGLAUNCH_MIXED_MAX_QUERY" not in caplog.text
