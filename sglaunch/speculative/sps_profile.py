"""Measure the target's forward-step cost over verify-batch sizes -> an SPS table (sps.py).

Each measured step is shaped like a DSpark verify: ceil(B / window) requests, each with up to
`window` (= block size + 1) query rows on top of `context_len` cached tokens, the logits of every
row wanted. It runs through the engine (`LLMEngine._run_on_all_ranks`), so tensor-parallel ranks
take part; the KV content is whatever the pool holds (timing only). Median of `repeats` runs
after `warmup` runs; SPS = 1 / median seconds.

With a drafter (`profile_draft_costs`), DSpark's own work in a step is timed too, per number of
requests R: rank 0's `propose` (the block forward on every rank, a drafter graph replay where
serving replays one: they are all captured before this profile runs; the Markov block sampling,
the plan and its read-back) and the accept for R greedy requests with `context_len` tokens of
context each. That is everything a DSpark step adds to the target forward. `profile_decode_costs`
times the step DSpark takes when it steps aside: a plain decode step of R requests (forward and
the sampler).

`ProfilePlan.pipelined` (the start-up profile of an engine with overlap on): the plain decode
is timed pipelined, as the engine runs a stepped-aside step then (see `_pipelined_seconds`);
drafting steps run synchronously either way, so the verify and DSpark-work profiles do not change.

`ProfilePlan.greedy` (the engine's start-up profile sets it): every step is timed the way an
all-greedy serving step runs: the verify forward with `logits=False` (a verify graph gives each
row's greedy choice, no LM head after it), the host accept of `DSparkDecoder.accept_greedy` on
one read-back, and the plain decode's choices read back by `ModelRunner.greedy_host`. Without it
(`sglaunch profile-sps`), the logits of every row are computed and sampled from, as for sampled
requests.
"""

from __future__ import annotations

from array import array

import math
import random
import statistics
import time
from dataclasses import dataclass

from sglaunch.engine.step import StepInput
from sglaunch.speculative.sps import SpsTable

DEFAULT_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


@dataclass(frozen=True)
class ProfilePlan:
    token_sizes: tuple[int, ...]
    window: int = 8  # query rows per request (block size + 1)
    context_len: int = 512  # cached tokens per request
    repeats: int = 5
    warmup: int = 2
    request_counts: tuple[int, ...] = ()  # of the draft and decode profiles (default: from token_sizes)
    greedy: bool = False  # time the all-greedy serving path (see the module's docstring)
    # overlap (with greedy): time plain decode pipelined, as a stepped-aside step runs then
    pipelined: bool = False
    # a step whose first timed run (after one warm-up) takes at least this long gets no second warm-up
    # and at most 3 timed runs (None: always warmup + repeats). For the start-up profile on slow CPUs:
    # session 26's host ran a 256-token verify in 9-12 s, and 7 runs of each size took the profile to
    # 195-227 s; steps of milliseconds (any GPU) never reach it
    long_step_s: float | None = None

    def kv_tokens(self, page_size: int) -> int:
        """KV slots the largest step needs."""
        biggest = max(self.token_sizes)
        per_request = math.ceil((self.context_len + self.window) / page_size) * page_size
        return math.ceil(biggest / self.window) * per_request + page_size


def verify_step(engine, num_tokens: int, plan: ProfilePlan, rng: random.Random) -> tuple[StepInput, list[int]]:
    """A verify-shaped StepInput of `num_tokens` rows and the pages it borrowed."""
    page, vocab = engine.config.page_size, engine.runner.spec.vocab_size
    step, borrowed = StepInput([], [], [], [], [], []), []
    for start in range(0, num_tokens, plan.window):
        rows = min(plan.window, num_tokens - start)
        kv_len = plan.context_len + rows
        pages = engine.allocator.alloc(math.ceil(kv_len / page))
        if pages is None:
            raise ValueError(f"the KV pool cannot hold a {num_tokens}-token verify step")
        borrowed += pages
        step.sample_indices.extend(range(len(step.input_ids), len(step.input_ids) + rows))
        step.input_ids.extend(rng.randrange(vocab) for _ in range(rows))
        step.positions.extend(range(plan.context_len, kv_len))
        step.query_lens.append(rows)
        step.kv_lens.append(kv_len)
        step.page_tables.append(pages)
    step.logits = not plan.greedy
    return step, borrowed


def time_step(engine, step: StepInput, plan: ProfilePlan) -> float:
    return _median_seconds(engine, plan, lambda: engine._run_on_all_ranks(step))


def _median_seconds(engine, plan: ProfilePlan, run) -> float:
    import torch

    cuda = engine.runner.device.type == "cuda"
    times, warmup, runs = [], plan.warmup, plan.warmup + plan.repeats
    while len(times) < runs:
        if cuda:
            torch.cuda.synchronize(engine.runner.device)
        start = time.perf_counter()
        run()
        if cuda:
            torch.cuda.synchronize(engine.runner.device)
        times.append(time.perf_counter() - start)
        if (len(times) == 2 and warmup >= 1 and plan.long_step_s is not None and times[1] >= plan.long_step_s):
            # NOTE: judged on the second run, not the first (a first run of a shape may compile or
            # pick kernels); launch and timer jitter, which five runs of a millisecond step smooth
            # out, are lost in a step this long
            warmup, runs = 1, 1 + min(plan.repeats, 3)
    return statistics.median(times[warmup:])


def draft_request_counts(plan: ProfilePlan) -> tuple[int, ...]:
    """The request counts of the draft and decode profiles: plan.request_counts, or those of the
    profiled verify steps (ceil(B / window) for each size B)."""
    if plan.request_counts:
        return tuple(sorted(set(plan.request_counts)))
    return tuple(sorted({math.ceil(t / plan.window) for t in plan.token_sizes}))


def _borrow_pages(engine, requests: int, tokens: int, borrowed: list[int]) -> list[list[int]]:
    """Page tables of `requests` requests of `tokens` KV slots each (pages appended to borrowed)."""
    page, tables = engine.config.page_size, []
    for _ in range(requests):
        pages = engine.allocator.alloc(math.ceil(tokens / page))
        if pages is None:
            raise ValueError(f"the KV pool cannot hold a {requests}-request step")
        borrowed += pages
        tables.append(pages)
    return tables


def _profile_chunks(engine, tables: list[list[int]], plan: ProfilePlan, rng: random.Random):
    """Greedy decoding requests at position context_len, each with gamma pages of lookahead."""
    from sglaunch.engine.interface import SamplingParams
    from sglaunch.engine.request import Req
    from sglaunch.engine.scheduler import Chunk

    vocab, gamma, chunks = engine.runner.spec.vocab_size, engine.spec.gamma, []
    for i, pages in enumerate(tables):
        req = Req(f"__profile-{i}", [rng.randrange(vocab) for _ in range(plan.context_len + 1)],
                  SamplingParams(max_new_tokens=gamma + 2, temperature=0.0, ignore_eos=True), arrival=0)
        req.pages = array("i", pages)
        chunks.append(Chunk(req, plan.context_len, plan.context_len + 1, lookahead=gamma))
    return chunks


def profile_draft_costs(engine, plan: ProfilePlan, progress=None) -> dict[int, float]:
    """Seconds of DSpark's work per step (propose + accept, everything but the target forward), by
    number of requests (engine with a drafter). Leaves the decoder's statistics and lagged
    survivals as they were."""
    import torch

    rng, seconds, spec = random.Random(1), {}, engine.spec
    gamma, vocab = spec.gamma, engine.runner.spec.vocab_size
    for requests in draft_request_counts(plan):
        borrowed: list[int] = []
        try:
            tables = _borrow_pages(engine, requests, plan.context_len + 1 + gamma, borrowed)
            chunks = _profile_chunks(engine, tables, plan, rng)
            logits = torch.randn(requests * (gamma + 1), vocab, device=engine.runner.device)

            # the greedy choices (token, log-probability) a verify graph leaves for the host accept
            choices = torch.stack([logits.argmax(-1).double(), torch.zeros(logits.shape[0], dtype=torch.float64,
                                                                            device=logits.device)])

            def greedy_host(rows: list[int]):
                host = choices.tolist()  # NOTE: one read-back, as ModelRunner.greedy_host does
                return [int(host[0][r]) for r in rows], [host[1][r] for r in rows]

            def dspark_stage():
                for chunk in chunks:
                    chunk.draft_tokens = []
                proposal = spec.propose(chunks, {}, 0, engine._draft_on_all_ranks)
                starts = [0]
                for v in proposal.verify_lens[:-1]:
                    starts.append(starts[-1] + 1 + v)
                if plan.greedy:  # what LLMEngine._accept does for an all-greedy step
                    spec.accept_greedy(proposal, starts, greedy_host, 0.0)
                else:
                    spec.accept(proposal, logits[: starts[-1] + 1 + proposal.verify_lens[-1]], starts, 0.0)

            seconds[requests] = _median_seconds(engine, plan, dspark_stage)
        finally:
            engine.allocator.free(borrowed)
            spec.forget_profile([f"__profile-{i}" for i in range(requests)])
        if progress is not None:
            progress(requests, seconds[requests])
    return seconds


def decode_step(requests: int, tables: list[list[int]], plan: ProfilePlan, vocab: int, rng: random.Random) -> StepInput:
    """A plain decode StepInput: one token per request at position context_len."""
    ctx = plan.context_len
    return StepInput([rng.randrange(vocab) for _ in range(requests)], [ctx] * requests, [1] * requests,
                     [ctx + 1] * requests, tables, list(range(requests)))


def profile_decode_costs(engine, plan: ProfilePlan, progress=None) -> dict[int, float]:
    """Seconds of a plain decode step (target forward + greedy sampling), by number of requests:
    the step DSpark takes when it steps aside."""
    from sglaunch.engine.interface import SamplingParams
    from sglaunch.engine.sampler import sample

    rng, seconds, vocab = random.Random(2), {}, engine.runner.spec.vocab_size
    for requests in draft_request_counts(plan):
        borrowed: list[int] = []
        try:
            step = decode_step(requests, _borrow_pages(engine, requests, plan.context_len + 1, borrowed), plan,
                               vocab, rng)
            params = [SamplingParams(max_new_tokens=1, temperature=0.0)] * requests
            step.logits = not plan.greedy

            def plain_step():
                logits = engine._run_on_all_ranks(step)
                # NOTE: as LLMEngine._sample: an all-greedy step reads the forward's choices if it made them
                if not plan.greedy or engine.runner.greedy_host(list(range(requests))) is None:
                    sample(logits, params, [None] * requests)

            if plan.greedy and plan.pipelined:
                seconds[requests] = _pipelined_seconds(engine, plan, step)
            else:
                seconds[requests] = _median_seconds(engine, plan, plain_step)
        finally:
            engine.allocator.free(borrowed)
        if progress is not None:
            progress(requests, seconds[requests])
    return seconds


PIPELINE_DEPTH = 4  # decode steps per timed run of the pipelined profile


def _pipelined_seconds(engine, plan: ProfilePlan, step: StepInput) -> float:
    """Seconds per plain decode step when steps run as an overlapped engine runs its stepped-
    aside steps: step N + 1 (every token a placeholder its forward fills from step N's greedy
    choices on the device) is launched before step N's choices are read back. Median over runs
    of PIPELINE_DEPTH steps, synchronised at both ends, divided by the depth."""
    import dataclasses

    rows = list(range(step.batch_size))
    chained = dataclasses.replace(step, input_ids=[-1 - r for r in rows], future_rows=rows, future_sources=rows)

    def pipeline():
        engine._run_on_all_ranks(step)  # NOTE: no placeholders: the chain's first step
        readback = engine.runner.greedy_readback()
        for _ in range(PIPELINE_DEPTH - 1):
            engine._run_on_all_ranks(chained)
            following = engine.runner.greedy_readback()
            readback.get(rows)  # step N, read while step N + 1 runs
            readback = following
        readback.get(rows)

    return _median_seconds(engine, plan, pipeline) / PIPELINE_DEPTH


def profile_sps(engine, plan: ProfilePlan, progress=None) -> tuple[SpsTable, dict[int, float]]:
    """-> (SPS table, seconds per step by token count)."""
    rng, seconds = random.Random(0), {}
    for tokens in plan.token_sizes:
        step, borrowed = verify_step(engine, tokens, plan, rng)
        try:
            seconds[tokens] = time_step(engine, step, plan)
        finally:
            engine.allocator.free(borrowed)
        if progress is not None:
            progress(tokens, seconds[tokens])
    return SpsTable.from_points({t: 1.0 / s for t, s in seconds.items()}), seconds
