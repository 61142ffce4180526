"""Measure the target's forward-step cost over verify-batch sizes -> an SPS table (sps.py).

Each measured step is shaped like a DSpark verify: ceil(B / window) requests, each with up to
`window` (= block size + 1) query rows on top of `context_len` cached tokens, the logits of every
row wanted. It runs through the engine (`LLMEngine._run_on_all_ranks`), so tensor-parallel ranks
take part; the KV content is whatever the pool holds (timing only). Median of `repeats` runs
after `warmup` runs; SPS = 1 / median seconds.

With a drafter (`profile_draft_costs`), the draft stage is timed too, per number of requests R:
the block forward on every rank (`_draft_on_all_ranks`) and rank 0's greedy `sample_block`, for
R requests with `context_len` tokens of context each.
"""

from __future__ import annotations

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
    return step, borrowed


def time_step(engine, step: StepInput, plan: ProfilePlan) -> float:
    return _median_seconds(engine, plan, lambda: engine._run_on_all_ranks(step))


def _median_seconds(engine, plan: ProfilePlan, run) -> float:
    import torch

    cuda = engine.runner.device.type == "cuda"
    times = []
    for _ in range(plan.warmup + plan.repeats):
        if cuda:
            torch.cuda.synchronize(engine.runner.device)
        start = time.perf_counter()
        run()
        if cuda:
            torch.cuda.synchronize(engine.runner.device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[plan.warmup:])


def draft_request_counts(plan: ProfilePlan) -> tuple[int, ...]:
    """The request counts of the profiled verify steps (ceil(B / window) for each size B)."""
    return tuple(sorted({math.ceil(t / plan.window) for t in plan.token_sizes}))


def profile_draft_costs(engine, plan: ProfilePlan, progress=None) -> dict[int, float]:
    """Seconds of the draft stage per step, by number of requests (engine with a drafter)."""
    import torch

    from sglaunch.engine.step import DraftStepInput

    page, vocab = engine.config.page_size, engine.runner.spec.vocab_size
    rng, seconds = random.Random(1), {}
    device = engine.runner.device
    for requests in draft_request_counts(plan):
        borrowed, tables = [], []
        try:
            for _ in range(requests):
                pages = engine.allocator.alloc(math.ceil(plan.context_len / page))
                if pages is None:
                    raise ValueError(f"the KV pool cannot hold a {requests}-request draft step")
                borrowed += pages
                tables.append(pages)
            anchors = [rng.randrange(vocab) for _ in range(requests)]
            step = DraftStepInput(anchors, [plan.context_len] * requests, tables)
            anchor_ids = torch.tensor(anchors, dtype=torch.int64, device=device)
            greedy = torch.zeros(requests, device=device)

            def draft_stage():
                out = engine._draft_on_all_ranks(step)
                engine.spec.drafter.sample_block(out, anchor_ids, greedy, return_probs=False, all_greedy=True)

            seconds[requests] = _median_seconds(engine, plan, draft_stage)
        finally:
            engine.allocator.free(borrowed)
        if progress is not None:
            progress(requests, seconds[requests])
    return seconds


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
