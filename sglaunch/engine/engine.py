"""Rank 0's engine: scheduler + model runner + sampler, driving the other ranks every step.

Synchronous and single-threaded on purpose; the engine process (engine_process.py) runs it for
the HTTP server, and generate_batch calls it directly.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import time
from typing import Callable, NoReturn

import torch

from sglaunch.config import EngineConfig, env_switch
from sglaunch.engine.allocator import PageAllocator
from sglaunch.engine.distributed import TPGroup
from sglaunch.engine.cuda_graph import context_skip_from_env
from sglaunch.engine.heap import PAUSES
from sglaunch.engine.interface import GenerateRequest, TokenOutput, token_output
from sglaunch.engine.model_runner import ModelRunner
from sglaunch.engine.radix_cache import RadixCache
from sglaunch.engine.request import Req, ReqStatus
from sglaunch.engine.sampler import (BAD_PROBABILITIES, UniformStream, draw_uniforms, filter_settings, filters,
                                     is_greedy, make_uniform_stream, read_choices, rows_of, sample_device)
from sglaunch.engine.scheduler import Chunk, Scheduler, SchedulerLimits, admission_from_env
from sglaunch.engine.step import StepInput, build_step_input, placeholder, sample_rows
from sglaunch.speculative.burst import MAX_BATCH as BURST_MAX_BATCH  # NOTE: torch-free, imports nothing of ours

logger = logging.getLogger(__name__)

CONTEXT_SKIP_STREAK = 16  # stepped-aside steps in a row before a plain step may skip the draft context
# steps in a row whose burst was declined as not worth it (no burst between) before a plain step of a
# batch small enough to burst may skip the draft context too: bursts are what it is kept for there
BURST_DECLINED_STREAK = 256
# a sampled drafting step (overlap) is priced up to the next step's start when the engine loop's work between
# them (publishing outputs, reading commands) took at most this long; a longer gap is idleness, not its cost
LOOP_GAP_LIMIT_S = 0.005


GRAPH_SIZED_STEPS_ENV = "SGLAUNCH_GRAPH_SIZED_STEPS"  # 1: a step's rows capped at the largest ragged graph
DSPARK_GRAPH_SIZED_STEPS_ENV = "SGLAUNCH_DSPARK_GRAPH_SIZED_STEPS"  # 0: no cap for a DSpark engine


def graph_step_cap(runner: ModelRunner) -> int | None:
    """SGLAUNCH_GRAPH_SIZED_STEPS (on unless 0; engines with ragged graphs for mixed steps, a DSpark
    engine unless SGLAUNCH_DSPARK_GRAPH_SIZED_STEPS=0): the largest ragged tier, the most rows the
    scheduler then gives one step, so that a wave of arrivals is admitted over several graph
    replays instead of one eager step (44 ms for 6 ms of kernels on the H200 at 64 prompts of 64
    tokens, session 17). Prompts over the cap are chunked to it; a chunk replays a graph within
    SGLAUNCH_MIXED_MAX_QUERY (unset: the largest tier). Session 18 (H200, random SmolLM2 weights,
    one run): the in-process closed loop at c=64 1.11x (2.53-2.57 s against 2.85-3.44 for 131,072
    tokens), HTTP 1.11x, and `sglaunch bench` with 1,024-token prompts at c=64 1.37x, each against
    the uncapped engine."""
    if not env_switch(GRAPH_SIZED_STEPS_ENV, True) or runner.graphs is None:
        return None
    # NOTE: a DSpark engine too unless SGLAUNCH_DSPARK_GRAPH_SIZED_STEPS=0 (each decode takes one row of the cap,
    # which is exact for its stepped-aside steps; a drafting step's verify rows are priced by its planner as
    # before). Session 21 (one H100, bench --compare, held-out set, 1,024 prompts, T=0): capped DSpark against
    # plain 1.060 and 1.090 at c=256 in two runs (session 20, uncapped, H200: 0.855, its steps 99% aside and
    # slower to admit), capped against uncapped DSpark 1.072 at c=256 and 1.026 at c=32; at c=64 the A/B is
    # split (session 20: 1.100; session 21: 0.745, in a run where the same capped server read 22.2k tok/s
    # against 27.6k and 29.2k in two other runs of the session, each over plain: 1.246 and 1.143)
    if runner.draft is not None and not env_switch(DSPARK_GRAPH_SIZED_STEPS_ENV, True):
        return None
    tiers = runner.graphs.plan.verify_tiers
    return max(tiers) if tiers else None


def scheduler_limits(config: EngineConfig, runner: ModelRunner) -> SchedulerLimits:
    chunk = config.chunked_prefill_size
    # NOTE: admission grouping only without a drafter: DSpark's bursts read a waiting request as
    # "end the burst, admit it" (early stop, chaining), which holding it would contradict
    admission = admission_from_env() if runner.draft is None else {}
    cap = graph_step_cap(runner)
    if cap is not None:
        logger.info("graph-sized steps: at most %d rows a step (decodes and prompt chunks together)", cap)
        if runner.graphs.plan.max_query < cap:
            logger.warning("graph-sized steps: a prompt chunk over %d tokens still runs eagerly; set "
                           "SGLAUNCH_MIXED_MAX_QUERY=%d so that every capped step can replay a graph",
                           runner.graphs.plan.max_query, cap)
    return SchedulerLimits(
        page_size=config.page_size,
        max_running_requests=config.running_cap,
        chunked_prefill_size=chunk if chunk and chunk > 0 else None,
        context_length=runner.context_length,
        eos_token_ids=runner.spec.eos_token_ids,
        spec_lookahead=runner.draft.block_size if runner.draft is not None else 0,
        step_token_cap=cap,
        **admission,
    )


@dataclasses.dataclass
class InFlight:
    """Overlap: a launched plain step whose tokens the host has not read yet (chosen greedily by
    the forward, or sampled on the device at TP 1)."""

    chunks: list[Chunk]
    rows: list[int | None]  # per chunk, its logit row (sample_rows)
    indices: list[int | None]  # per chunk, where its token goes in req.token_ids (a placeholder now)
    readback: object  # model_runner.GreedyReadback


@dataclasses.dataclass
class BurstFlight:
    """A launched DSpark burst that the host has not read yet."""

    chunks: list[Chunk]
    iterations: int  # planned; the ones that ran once it is read (an early stop runs fewer)
    pending: object  # speculative.burst.PendingBurst
    started: float  # perf_counter when its launch began
    chained: bool  # launched while the burst before it was being finished
    waiting: int = 0  # requests in the scheduler's queue at launch (only later ones end it early)
    policy: object = None  # the BurstPolicy that priced it (LLMEngine.burst, or burst_sampled for a sampled burst)


class LLMEngine:
    def __init__(
        self, config: EngineConfig, runner: ModelRunner, tp: TPGroup,
        on_tp_failure: Callable[[BaseException], NoReturn] | None = None,
    ):
        self.config, self.runner, self.tp = config, runner, tp
        # NOTE: a failed collective leaves the ranks out of step; this ends the process (naming
        # the dead rank) instead of letting a caller carry on or hang
        self.on_tp_failure = on_tp_failure
        self.allocator = PageAllocator(runner.num_pages)
        radix = None if config.disable_radix_cache else RadixCache(config.page_size, self.allocator.free)
        self.limits = scheduler_limits(config, runner)
        self.scheduler = Scheduler(self.limits, self.allocator, radix)
        self.requests: dict[str, Req] = {}
        self.generators: dict[str, UniformStream] = {}  # sampled requests' uniforms
        self._seeds = random.Random(config.random_seed)
        self.counters = {"prompt_tokens": 0, "generated_tokens": 0, "cached_tokens": 0, "finished_requests": 0, "steps": 0,
                         "cache_flushes": 0}
        self.spec = None  # DSparkDecoder when speculative decoding is on
        if runner.draft is not None:
            from sglaunch.speculative.decoder import DSparkDecoder

            self.spec = DSparkDecoder(config, runner.draft.drafter, config.page_size, runner.device)
        self.burst = None  # BurstPolicy when the runner can burst (speculative/burst.py)
        self.burst_sampled = None  # the BurstPolicy of sampled bursts, when the runner has sampled iterations
        self.burst_filtered = None  # the BurstPolicy of filtered sampled bursts (top-k, top-p, min-p rows)
        self.burst_chain = False  # launch a batch's next burst while finishing the one before
        self.burst_early_stop = False  # queue a burst a few iterations at a time, end it for an arrival
        self._burst_in_flight: BurstFlight | None = None
        self._burst_read_at = 0.0  # when the last burst's rows were read
        # whether commands wait unread (the engine process's channel): no burst is chained then
        self.input_waiting: Callable[[], bool] | None = None
        # DSpark at load: plain decode steps without the draft context write (_draft_context)
        self.context_skip = self.spec is not None and context_skip_from_env()
        self.context_skip_min_batch = 1 + BURST_MAX_BATCH  # NOTE: tests lower them
        self.context_skip_streak = CONTEXT_SKIP_STREAK
        self.burst_declined_streak = BURST_DECLINED_STREAK
        self.context_skipped_steps = 0
        self._burst_declined = 0  # steps in a row a burst was declined as not worth it (_burst_plan)
        self._aside_streak = 0  # steps in a row the planner stepped aside (_decide)
        self._drain_wait = 0.0  # the last _resolve_in_flight's wait for the device (its read-back)
        # a sampled drafting step's (start less its drain's device wait, end), observed at the next step's start
        self._draft_pending: tuple[float, float] | None = None
        if self.spec is not None and getattr(runner, "burst", None) is not None:
            from sglaunch.speculative.burst import BurstPolicy, chain_from_env, early_stop_from_env, wide_cap_from_env

            self.burst = BurstPolicy(self.spec.gamma, runner.burst.max_iterations, wide_cap=wide_cap_from_env())
            if runner.burst.sampled:  # NOTE: priced on its own: a sampled iteration costs and accepts otherwise
                self.burst_sampled = BurstPolicy(self.spec.gamma, runner.burst.max_iterations,
                                                 wide_cap=wide_cap_from_env())
            if runner.burst.filtered:  # NOTE: its own too: every row of a filtered iteration is sorted
                self.burst_filtered = BurstPolicy(self.spec.gamma, runner.burst.max_iterations,
                                                  wide_cap=wide_cap_from_env())
            self.burst_chain = chain_from_env()
            # NOTE: one rank only: the other ranks replay a burst's iterations as one command
            self.burst_early_stop = early_stop_from_env(runner.device.type) and self.tp.size == 1
            self.spec.log_suffix = self._burst_log
        # SGLAUNCH_OVERLAP=1 (the runner read it): see _step_overlapped. With DSpark, the steps
        # that step aside are pipelined; a drafting step drains the pipeline first
        self.overlap = runner.overlap
        self._in_flight: InFlight | None = None
        # steps left in flight; drafting steps that drained one; requests found finished by a drain
        self.overlap_counts = {"in_flight": 0, "drains": 0, "drain_finished": 0}
        # wall time of step() by what it scheduled: [steps, seconds] for steps with a prefill chunk
        # (alone or beside decodes) and for the others; over HTTP, staggered arrivals put a prefill
        # chunk in many more steps than a closed loop whose requests finish together does
        self.step_seconds = {"decode": [0, 0.0], "prefill": [0, 0.0]}

    def profile_sps_if_missing(self) -> None:
        """compact mode without --speculative-dspark-sps-table-path: profile step costs now.

        A short verify-shaped profile (median of 5 per size; of 3 where a step takes 0.5 s or more,
        a slow CPU's large verify) gives the planner a cost model, so
        compact trims windows instead of verifying every draft. SGLAUNCH_DSPARK_PROFILE_SPS=0
        turns it off (then compact verifies everything, as SGLang does without a table).
        """
        if self.spec is None or self.spec.mode != "compact" or self.spec.planner.sps is not None:
            return
        if os.environ.get("SGLAUNCH_DSPARK_PROFILE_SPS", "1") == "0":
            return
        from sglaunch.speculative.sps_profile import (DEFAULT_TOKENS, ProfilePlan, profile_decode_costs,
                                                      profile_draft_costs, profile_sps)

        window = self.spec.gamma + 1
        biggest = min(256, self.limits.max_running_requests * window)
        context = max(0, min(128, self.limits.context_length - window))
        sizes = tuple(t for t in DEFAULT_TOKENS if t <= biggest)
        # NOTE: median of 5: with 3, two slow runs (a noisy host) set a size, and monotone forcing
        # then lifts every larger size to it (seen on the H200: a 10 ms plateau over 16-256 tokens)
        # NOTE: greedy: timed as an all-greedy serving step runs (verify without an LM head after
        # the graph, the host accept); the drafter's graphs were captured at start-up already
        # NOTE: pipelined: with overlap a stepped-aside step is a pipelined plain step, so drafting
        # is priced against that (the synchronous plain step costs ~1.3-1.5x as much on an H200)
        # NOTE: long_step_s: a size whose steps take 0.5 s or more (a slow CPU's large verify) is timed
        # 3 times after one warm-up instead of 5 after two
        plan = ProfilePlan(sizes, window=window, context_len=context, repeats=5, warmup=2, greedy=True,
                           pipelined=self.overlap, long_step_s=0.5)
        while len(plan.token_sizes) > 1 and plan.kv_tokens(self.config.page_size) > self.allocator.num_free * self.config.page_size:
            plan = dataclasses.replace(plan, token_sizes=plan.token_sizes[:-1])
        plan = dataclasses.replace(plan, request_counts=self._profile_request_counts(plan))
        start = time.perf_counter()
        try:
            table, seconds = profile_sps(self, plan)
            draft = profile_draft_costs(self, plan)
            decode = profile_decode_costs(self, plan)
        except ValueError as exc:  # e.g. a KV pool too small for even one verify-shaped step
            logger.warning("DSpark: no step-cost profile (%s); compact verifies every draft", exc)
            return
        self.spec.planner.sps = table.with_draft_costs(draft).with_decode_costs(decode)
        logger.info("DSpark: profiled step costs at start-up in %.1f s (verify %s; DSpark work %s; plain decode %s)",
                    time.perf_counter() - start,
                    ", ".join(f"{t} tok {s * 1e3:.1f} ms" for t, s in sorted(seconds.items())),
                    ", ".join(f"{r} req {s * 1e3:.1f} ms" for r, s in sorted(draft.items())),
                    ", ".join(f"{r} req {s * 1e3:.1f} ms" for r, s in sorted(decode.items())))

    def profile_bursts(self) -> None:
        """With bursts and a step-cost table to compare them with (the plain decode's cost): time
        a burst iteration per batch size now (BurstPolicy decides with it; without it, every
        all-greedy decode batch that fits bursts)."""
        if self.burst is None or self.spec.planner.sps is None:
            return
        from sglaunch.speculative.burst import profile_costs

        top = min(self.limits.max_running_requests, self.runner.burst.max_batch)
        counts = sorted({1 << i for i in range(12) if 1 << i <= top} | {top})
        start = time.perf_counter()
        try:
            self.burst.costs, self.burst.fixed = profile_costs(self, counts)
            if self.burst_sampled is not None and self.burst.costs:
                self.burst_sampled.costs, self.burst_sampled.fixed = profile_costs(self, counts, sampled=True)
            if self.burst_filtered is not None and self.burst.costs:
                self.burst_filtered.costs, self.burst_filtered.fixed = profile_costs(self, counts, sampled=True,
                                                                                     filtered=True)
        finally:
            self.spec.stats = type(self.spec.stats)(self.spec.gamma)
        if not self.burst.costs:
            logger.warning("DSpark: the KV pool cannot hold even a one-request burst profile; bursts off")
            self.burst = self.burst_sampled = self.burst_filtered = None
            return
        for policy, kind in ((self.burst, "greedy"), (self.burst_sampled, "sampled"),
                             (self.burst_filtered, "filtered")):
            if policy is not None:
                logger.info("DSpark bursts, %s: %d iterations at most; per iteration + per burst: %s", kind,
                            policy.max_iterations,
                            ", ".join(f"{r} req {s * 1e3:.2f} + {policy.fixed.get(r, 0.0) * 1e3:.2f} ms"
                                      for r, s in sorted(policy.costs.items())))
        logger.info("DSpark bursts profiled in %.1f s", time.perf_counter() - start)

    def _profile_request_counts(self, plan) -> tuple[int, ...]:
        """Request counts of the draft and decode profiles: those of the verify sizes plus powers
        of two up to max_running_requests, as many as the free KV pool holds at once."""
        from sglaunch.speculative.sps_profile import draft_request_counts

        page = self.config.page_size
        per_request = -(-(plan.context_len + plan.window) // page) * page
        most = min(self.limits.max_running_requests, self.allocator.num_free * page // per_request)
        counts = set(draft_request_counts(plan)) | {1 << i for i in range(12) if 1 << i <= most}
        return tuple(sorted(c for c in counts if c <= max(1, most)))

    # ---- requests -----------------------------------------------------------------------
    def check(self, request: GenerateRequest) -> None:
        """ValueError for a request this engine can never serve."""
        self.scheduler.check(len(request.input_ids), request.sampling.max_new_tokens)
        if request.rid in self.requests:
            raise ValueError(f"request id {request.rid!r} is already in use")

    def add_request(self, request: GenerateRequest) -> list[TokenOutput]:
        """Queue a request; returns outputs due at once (max_new_tokens=0 finishes here)."""
        self.check(request)
        req = Req(request.rid, list(request.input_ids), request.sampling, arrival=0)
        self.counters["prompt_tokens"] += req.num_prompt_tokens
        if request.sampling.max_new_tokens == 0:
            return [TokenOutput(req.rid, (), True, "length", prompt_tokens=req.num_prompt_tokens)]
        if not is_greedy(request.sampling):
            seed = request.sampling.seed if request.sampling.seed is not None else self._seeds.getrandbits(63)
            self.generators[req.rid] = make_uniform_stream(seed)  # NOTE: on the CPU (sampler.UniformStream)
        self.requests[req.rid] = req
        self.scheduler.add(req)
        return []

    def abort(self, rid: str) -> TokenOutput | None:
        req = self.scheduler.abort(rid)
        if req is None:
            return None
        return self._final_output(req, ())

    def flush_cache(self) -> dict:
        """Empty the radix (prefix) cache, as SGLang's /flush_cache does: every cached page goes
        back to the pool, and with it the DSpark draft context it carries (the drafter's K/V live
        at the same slots as the target's), so later prompts are computed anew. Only while no
        request runs or waits and no step is in flight; otherwise nothing changes and the answer
        says how many requests are in flight. The pages, the tree and the allocator live on rank 0
        alone (the other ranks hold K/V tensors addressed by the slots rank 0 sends each step), so
        no rank is told anything."""
        running, waiting = len(self.scheduler.running), len(self.scheduler.waiting)
        if running or waiting or self.has_work:
            return {"flushed": False, "running": running, "waiting": waiting}
        radix = self.scheduler.radix
        freed = radix.flush() if radix is not None else 0
        self.counters["cache_flushes"] += 1
        logger.info("flushed the prefix cache: %d pages freed", freed)
        return {"flushed": True, "freed_pages": freed, "freed_tokens": freed * self.config.page_size,
                "free_pages": self.allocator.num_free, "num_pages": self.allocator.num_pages}

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work or self._in_flight is not None or self._burst_in_flight is not None

    # ---- one step -----------------------------------------------------------------------
    def step(self) -> list[TokenOutput]:
        """Schedule, (draft,) run the forward pass on every rank, sample or accept, and report
        new tokens."""
        began, prefills = time.perf_counter(), self.scheduler.num_prefill_steps
        if self._draft_pending is not None:
            self._observe_draft_pending(began)
        if self._burst_in_flight is not None:  # a chained burst: finish it (and maybe launch the next)
            outputs = self._collect_burst(self._burst_in_flight)
        else:
            outputs = self._step_overlapped() if self.overlap else self._step_sync()
        spent = self.step_seconds["prefill" if self.scheduler.num_prefill_steps != prefills else "decode"]
        spent[0] += 1
        spent[1] += time.perf_counter() - began
        return outputs

    def _step_sync(self) -> list[TokenOutput]:
        began = time.perf_counter()
        chunks = self.scheduler.schedule(lookahead=False)  # NOTE: _propose reserves draft pages
        candidates = self._candidates(chunks)
        burst = self._burst_plan(chunks, candidates)
        if burst is not None:
            return self._run_burst(chunks, burst)
        outputs = self._step_now(chunks, self._decide(chunks, candidates))
        if self.spec is not None:  # what the planned step really took (calibrates its step costs)
            self.spec.planner.observe_step_seconds(time.perf_counter() - began)
        return outputs

    def _step_now(self, chunks: list[Chunk], decision) -> list[TokenOutput]:
        """A synchronous step of scheduled chunks (no placeholder among their tokens): (draft,)
        forward, sample or accept, commit. decision: _decide's (None: a plain step)."""
        sampled: list = [None] * len(chunks)  # per chunk: a token, a list (speculative) or None
        logprobs: list = [None] * len(chunks)
        failed: dict[int, Exception] = {}  # chunk index -> why its request could not be sampled
        if chunks:
            proposal = self._propose(chunks, decision)
            try:
                self._forward_and_accept(chunks, proposal, sampled, logprobs, failed)
            finally:  # second chains' pages: the winner's kept by the accept, every other one freed
                if proposal is not None and proposal.second_lens:
                    for chunk in proposal.chunks:
                        self.scheduler.settle_second_chain(chunk, None)
        finished = self.scheduler.commit(chunks, sampled)
        outputs = self._outputs(chunks, sampled, logprobs, finished)
        return outputs + [out for i, exc in failed.items()
                          if (out := self.fail_request(chunks[i].req.rid, exc)) is not None]

    def _forward_and_accept(self, chunks: list[Chunk], proposal, sampled: list, logprobs: list,
                            failed: dict[int, Exception]) -> None:
        """_step_now's device part: the forward on every rank, then sampling and the accept."""
        step = build_step_input(chunks, self.config.page_size)
        if self.context_skip:
            step.draft_context = self._draft_context(chunks, proposal is not None, step)
        if step.future_rows:
            raise RuntimeError("a synchronous step with placeholder tokens (the pipeline was not drained)")
        # NOTE: an all-greedy step needs no logits, only each row's greedy choice
        step.logits = not all(is_greedy(c.req.sampling) for c in chunks if c.samples or c.lookahead)
        start = time.perf_counter()
        logits = self._run_on_all_ranks(step)  # [num_samples, vocab]
        rows = sample_rows(chunks)
        # NOTE: an all-greedy step's second chains go with the plain rows' greedy read (one copy)
        chains = proposal.second if proposal is not None and any(proposal.second_lens or ()) and \
            all(is_greedy(c.req.sampling) for c in proposal.chunks) else None
        self._sample(chunks, logits, rows, sampled, logprobs, failed, chains)
        if proposal is not None:
            self._accept(proposal, logits, rows, chunks, sampled, logprobs, time.perf_counter() - start)
        self.counters["steps"] += 1

    # ---- overlap: step N + 1 launched before step N is read back ------------------------
    def _step_overlapped(self) -> list[TokenOutput]:
        """Schedule and launch step N + 1 while step N (in flight) may still run: rows that go on
        from a request of step N hold a placeholder its forward fills in on the device. Then read
        step N back (stop rules, outputs) while N + 1 runs. An all-greedy step N + 1 stays in
        flight; any other is finished at once, as step() does. NOTE: a request that stops at
        step N also ran in step N + 1; that extra token is never emitted, its pages are freed."""
        began = time.perf_counter()
        chunks = self.scheduler.schedule(lookahead=False)
        drained: list[TokenOutput] = []
        candidates = self._candidates(chunks)
        burst = self._burst_plan(chunks, candidates)
        if burst is not None:
            if self.spec is not None:
                self.spec.planner.observe_step_seconds(None)
            if self._in_flight is not None:
                # NOTE: the anchors must be real ids: drain, and hand the drained tokens out now
                # (a new request's first token, say) instead of after the burst; the next step
                # schedules again and bursts then (its pages are reserved already)
                self.overlap_counts["drains"] += 1
                return self._resolve_in_flight()
            return self._run_burst(chunks, burst)
        # NOTE: asked before the step (a chunk's `samples` reads its request, which the step moves on)
        sampled = self.spec is not None and self._samples_at_t(chunks)
        if self.spec is not None and chunks:
            decision = self._decide(chunks, candidates, sampled)
            drain_seconds, drain_wait = 0.0, 0.0
            if decision is not None and self._in_flight is not None:
                # DSpark drafts this step: drain first, so the anchors and the verify input are
                # real ids (the stop rules applied, finished requests' pages freed)
                t = time.perf_counter()
                drained = self._resolve_in_flight()
                drain_seconds, drain_wait = time.perf_counter() - t, self._drain_wait
                self.overlap_counts["drains"] += 1
                live = [c for c in chunks if c.req.status is ReqStatus.RUNNING]
                if len(live) < len(chunks):  # some finished at the step drained: decide again
                    self.overlap_counts["drain_finished"] += len(chunks) - len(live)
                    chunks = live
                    decision = self._decide(chunks, self._candidates(chunks)) if chunks else None
            if decision is not None:
                outputs = drained + self._step_now(chunks, decision)
                if sampled:  # NOTE: priced at the next step's start (_observe_draft_pending)
                    self._draft_pending = (began + drain_wait, time.perf_counter())
                else:
                    # NOTE: calibrated on drafting steps without the drain (the tail of the plain step
                    # before, which the pipelined decode profile prices); see _observe_overlapped
                    self._observe_overlapped(time.perf_counter() - began - drain_seconds)
                return outputs
        pipelined = self._in_flight is not None  # this step's wall time covers one pipelined step
        outputs = drained + self._step_plain_overlapped(chunks)
        if self.spec is not None:
            if pipelined == (self._in_flight is not None) and (pipelined or sampled):
                # NOTE: a step where a row samples at T > 0 stays in flight only at TP 1 (sampled on
                # the device); where it cannot, with nothing in flight before it either, its wall time
                # is what such a step costs in steady state
                self._observe_overlapped(time.perf_counter() - began)
            else:
                self.spec.planner.observe_step_seconds(None)
        return outputs

    def _observe_overlapped(self, seconds: float) -> None:
        """NOTE: with overlap, the start-up profile prices a plain step pipelined (decode steps
        back to back, each launched before the one before it is read back), and a stepped-aside
        step's wall time in steady state (schedule, launch, wait for the step before, resolve) is
        one such pipelined step: observed as it is. A stepped-aside step with nothing in flight
        before it (after a drafting step) or none after it (it finished at once) is no
        pipelined step: it teaches nothing, unless it is a step where some row samples at T > 0
        that could not stay in flight (TP > 1, or a row failed on the host): with nothing in
        flight before it, it is what such steps cost, for the sampled steps' own scale. A drafting
        step is observed without its drain."""
        self.spec.planner.observe_step_seconds(seconds)

    def _observe_draft_pending(self, now: float) -> None:
        """A sampled drafting step (overlap) as the planner prices it: from its start to the next
        step's start, less only its drain's wait for the device (the plain step before it, which
        the pipelined decode profile prices). Nothing was in flight while it, its drain's host work
        (the drained step's outputs) and the engine loop's work after it (publishing its outputs)
        ran, so the device idled through all of them, where a pipelined plain step hides its own
        behind the next step (H100, session 36, T=0.7: the draft scale learnt without them drafted
        on about half of c=1's steps, and DSpark served 0.93x of plain). A gap over
        LOOP_GAP_LIMIT_S is the engine idling, not the step's cost: then to its end."""
        start, end = self._draft_pending
        self._draft_pending = None
        self._observe_overlapped((now if now - end <= LOOP_GAP_LIMIT_S else end) - start)

    def _step_plain_overlapped(self, chunks: list[Chunk]) -> list[TokenOutput]:
        """Launch a plain step (placeholders filled on the device), then resolve the step in
        flight; the step stays in flight when the forward chose every row greedily, or (TP 1)
        when its rows are sampled on the device (sampler.sample_device: the uniforms come from
        the requests' generators now, so the tokens are the synchronous engine's)."""
        logits, readback, rows, choices = None, None, sample_rows(chunks), None
        if chunks:
            step = build_step_input(chunks, self.config.page_size)
            if self.context_skip:
                step.draft_context = self._draft_context(chunks, False, step)
            step.logits = not all(is_greedy(c.req.sampling) for c in chunks if c.samples)
            logits = self._run_on_all_ranks(step)
            self.counters["steps"] += 1
            if not step.logits and step.sample_indices and self.runner.step_greedy is not None:
                readback = self.runner.greedy_readback()  # NOTE: queued before step N + 2 can overwrite it
            elif step.logits and self.tp.size == 1:
                choices = self._sample_on_device(chunks, rows, logits)
                if choices[1] is None:  # NOTE: every row sampled on the host's terms: it stays in flight
                    self.runner.keep_choices(choices[0])
                    readback = self.runner.greedy_readback()
        outputs = self._resolve_in_flight()
        live = [i for i, c in enumerate(chunks) if c.req.status is ReqStatus.RUNNING]
        chunks, rows = [chunks[i] for i in live], [rows[i] for i in live]
        if readback is not None:
            marks = [placeholder(r) if r is not None else None for r in rows]
            indices = self.scheduler.commit_placeholders(chunks, marks)
            self._in_flight = InFlight(chunks, rows, indices, readback)
            self.overlap_counts["in_flight"] += 1
            return outputs
        return outputs + self._finish_now(chunks, rows, logits, choices)

    def _sample_on_device(self, chunks: list[Chunk], rows: list, logits: torch.Tensor):
        """A plain step's sampling without a read-back -> (choices [2 or 3, logit rows] on the
        device, failures): failures is None when no row failed on the host (the choices can stay
        in flight), else {logit row: error}."""
        order = [i for i, r in enumerate(rows) if r is not None]  # NOTE: logit rows 0, 1, ... in chunk order
        failures: dict[int, Exception] = {}
        choices = sample_device(logits, [chunks[i].req.sampling for i in order],
                                [self.generators.get(chunks[i].req.rid) for i in order], failures)
        return choices, failures or None

    def _resolve_in_flight(self) -> list[TokenOutput]:
        """Step N's tokens (waiting for step N only), the stop rules, and its outputs; plus the
        requests the pool dropped while scheduling step N + 1 (with their step N token)."""
        dropped = self.scheduler.take_dropped()
        flight, self._in_flight = self._in_flight, None
        chunks, sampled, logprobs, finished, failed = [], [], [], list(dropped), []
        if flight is not None:
            dropped_ids = {id(req) for req in dropped}
            sampling = [i for i, index in enumerate(flight.indices) if index is not None]
            logit_rows = [flight.rows[i] for i in sampling]
            waited = time.perf_counter()
            tokens, lps = flight.readback.get(logit_rows)
            self._drain_wait = time.perf_counter() - waited
            for i, token, logprob, bad in zip(sampling, tokens, lps, flight.readback.failed(logit_rows)):
                chunk, req = flight.chunks[i], flight.chunks[i].req
                if req.status is ReqStatus.FINISHED and id(req) not in dropped_ids:
                    continue  # aborted meanwhile: its last output has gone already
                if bad:  # a sampled row that could not be sampled: its request fails (sampler.BAD_PROBABILITIES)
                    failed.append(req.rid)
                    continue
                if self.scheduler.resolve(req, flight.indices[i], token) is not None:
                    finished.append(req)
                chunks.append(chunk)
                sampled.append(token)
                logprobs.append(logprob)
        outputs = self._outputs(chunks, sampled, logprobs, finished)
        return outputs + [out for rid in failed
                          if (out := self.fail_request(rid, RuntimeError(BAD_PROBABILITIES))) is not None]

    def _finish_now(self, chunks: list[Chunk], rows: list, logits, choices=None) -> list[TokenOutput]:
        """A launched step that does not stay in flight (it samples at TP > 1 or with a row that
        failed on the host, or samples nothing). choices: _sample_on_device's, when it ran."""
        sampled: list = [None] * len(chunks)
        logprobs: list = [None] * len(chunks)
        failed: dict[int, Exception] = {}
        if chunks and choices is not None:  # NOTE: a choice per logit row: row r is position r
            self._take_choices([(i, r) for i, r in enumerate(rows) if r is not None], choices[0],
                               dict(choices[1] or {}), sampled, logprobs, failed)
        elif chunks:
            self._sample(chunks, logits, rows, sampled, logprobs, failed)
        finished = self.scheduler.commit(chunks, sampled)
        outputs = self._outputs(chunks, sampled, logprobs, finished)
        return outputs + [out for i, exc in failed.items()
                          if (out := self.fail_request(chunks[i].req.rid, exc)) is not None]

    # ---- DSpark bursts ------------------------------------------------------------------------
    def _candidates(self, chunks: list[Chunk]) -> list[Chunk]:
        """The chunks that could speculate this step (Scheduler.lookahead_candidates), found once
        a step for both _burst_plan and _decide; none without DSpark."""
        return self.scheduler.lookahead_candidates(chunks) if self.spec is not None and chunks else []

    def _burst_plan(self, chunks: list[Chunk], candidates: list[Chunk], count: bool = True) -> int | None:
        """The iterations of a DSpark burst for these chunks, or None for the usual step: every
        chunk must be a running decode that could speculate, greedy or (with sampled iterations)
        sampling at a temperature, with top-k, top-p or min-p too where filtered iterations exist,
        the batch must fit a burst graph and the KV pool, and its BurstPolicy (burst_sampled when a
        row samples, burst_filtered when one filters) must expect the burst to beat a plain step. Why a
        step did not burst is counted in BurstPolicy.skipped (count=False: a chain's look ahead,
        which the next step repeats if it declines). Pages are reserved when it says yes.
        NOTE: reads lengths only, so a last token may still be a placeholder (overlap)."""
        policy = self.burst
        if policy is None or not chunks:
            return None
        if not self.runner.burst.takes(len(chunks)):  # NOTE: first: at load no per-request work at all
            return policy.skip("no graph", count)
        which = self._burst_kind(chunks)
        if which is None:
            return policy.skip("sampled", count)
        sampled, filtered = which != "greedy", which == "filtered"
        if len(candidates) != len(chunks):
            why = ("prefill" if any(c.end - c.start > 1 for c in chunks)
                   else "no context" if any(c.req.context_gap for c in chunks) else "request ending")
            return policy.skip(why, count)
        if any(c.req.num_output_tokens == 0 for c in chunks):
            # NOTE: a prompt the radix cache holds whole is one decode-like row: bursting it would hold
            # its first token for the whole burst (H100, T=0, c=1: TTFT p50 4.6 ms on the first round of
            # 64 prompts, 14.2 ms on the second, where every prompt was cached; session 37)
            return policy.skip("first token", count)
        planner, R = self.spec.planner, len(chunks)
        prior = 1.0 + sum(planner.priced_prior)
        context = self.limits.context_length
        kind = self._burst_policy(which)  # NOTE: skips are counted on self.burst alone
        n = kind.iterations([c.req.sampling.max_new_tokens - c.req.num_output_tokens for c in chunks],
                            [context - c.start for c in chunks], prior)
        if n < 1:
            return policy.skip("context", count)
        if self.runner.burst.pick(R, self.runner.burst.context_needed([c.start for c in chunks], n), sampled,
                                  filtered) is None:
            return policy.skip("no graph", count)
        plain, scale = None, 1.0
        if planner.sps is not None:
            scale = planner.calibration.scale_for(sampled)["plain"] if planner.calibration is not None else 1.0
            plain = planner.sps.plain_step_seconds(R)
        if not kind.worth(R, plain, prior, n, count=count, plain_scale=scale):
            self._burst_declined += count
            return policy.skip("not worth" + (f" ({which})" if sampled else ""), count)
        if not self._reserve_burst(chunks, n, sampled, filtered):
            return policy.skip("kv", count)
        self._burst_declined = 0
        return n

    def _burst_kind(self, chunks: list[Chunk]) -> str | None:
        """Which burst takes these chunks: "greedy" (every row greedy); "sampled" (some row samples
        at a temperature alone, and the runner has sampled iterations for a batch this size:
        BurstRunner.takes_sampled); "filtered" (some sampled row also sets top-k, top-p or min-p, and
        the runner has filtered iterations); None, none (sampled or filtered iterations are off, or
        the batch is too large for them)."""
        kind, vocab = "greedy", self.runner.spec.vocab_size
        for chunk in chunks:
            params = chunk.req.sampling
            if is_greedy(params):
                continue
            if filters(params, vocab):
                kind = "filtered"
            elif kind == "greedy":
                kind = "sampled"
        if kind == "greedy":
            return kind
        if self._burst_policy(kind) is None or not self.runner.burst.takes_sampled(len(chunks), kind == "filtered"):
            return None
        return kind

    def _burst_policy(self, kind: str):
        """The BurstPolicy that prices a burst of that kind (_burst_kind)."""
        return {"greedy": self.burst, "sampled": self.burst_sampled, "filtered": self.burst_filtered}[kind]

    def _reserve_burst(self, chunks: list[Chunk], iterations: int, sampled: bool = False,
                       filtered: bool = False) -> bool:
        """Scheduler.reserve_burst for a burst of `iterations`, and first (a burst that verifies a
        second chain) each chunk's gamma + 1 pages for that chain's window; all or nothing."""
        runner, positions = self.runner.burst, iterations * (self.spec.gamma + 1) - 1
        if runner.uses_second_chain(len(chunks), runner.context_needed([c.start for c in chunks], iterations),
                                    sampled, filtered):
            for i, chunk in enumerate(chunks):
                if not self.scheduler.reserve_second_chain(chunk, self.spec.gamma):
                    for taken in chunks[:i]:
                        self.scheduler.settle_second_chain(taken, None)
                    return False
        if self.scheduler.reserve_burst(chunks, positions):
            return True
        for chunk in chunks:
            self.scheduler.settle_second_chain(chunk, None)
        return False

    def _chain_plan(self) -> tuple[list[Chunk], int] | None:
        """The next burst of a batch whose burst has just been committed, planned before that
        burst's outputs are built: when nothing waits and every running request is a plain decode,
        the step after would schedule exactly one decode chunk per running request (their anchor
        pages are within what reserve_burst takes), so the same burst plan is made here and its
        launch overlaps the host's tail of this burst and the loop around it. None: the next step
        schedules as usual; also when a request waits, in the scheduler or unread in the engine
        process's channel (input_waiting), since admitting it needs a step of its own."""
        scheduler = self.scheduler
        if not self.burst_chain or scheduler.waiting or not scheduler.running:
            return None
        if self.input_waiting is not None and self.input_waiting():
            # NOTE: an arrival not read yet would wait for the chained burst as well (H200,
            # session 14: TTFT p50 19 -> 29 ms at c=8 when chaining did not look at the channel)
            return None
        chunks = []
        for req in scheduler.running:
            if req.num_pending != 1 or req.final_pending or req.status is not ReqStatus.RUNNING:
                return None
            chunks.append(Chunk(req, req.num_computed, req.num_computed + 1))
        n = self._burst_plan(chunks, self._candidates(chunks), count=False)
        return None if n is None else (chunks, n)

    def _burst_log(self) -> str:
        policy = self.burst
        if policy is None:
            return ""
        accept = f"{policy.accept:.2f}" if policy.accept is not None else "none yet"
        skipped = ", ".join(f"{why} {n}" for why, n in policy.skipped.most_common()) or "none"
        stopped = f", {policy.stopped} ended early for an arrival" if self.burst_early_stop else ""
        sampled = ""
        for name, kind in (("sampled", self.burst_sampled), ("filtered", self.burst_filtered)):
            if kind is not None and kind.bursts:
                estimate = f"{kind.accept:.2f}" if kind.accept is not None else "none yet"
                sampled += (f"; {name} bursts {kind.bursts} ({kind.burst_iterations} iterations, accept estimate "
                            f"{estimate}, measured/profiled time {kind.scale:.2f})")
        return (f", bursts {policy.bursts} ({policy.burst_iterations} iterations, {policy.chained} chained{stopped}; "
                f"steps without one: {skipped}; "
                f"accept estimate {accept}, measured/profiled burst time {policy.scale:.2f}){sampled}")

    def _run_burst(self, chunks: list[Chunk], iterations: int) -> list[TokenOutput]:
        """A burst (pages reserved by _burst_plan) on every rank, then its tokens committed with
        the stop rules, request by request."""
        return self._collect_burst(self._launch_burst(chunks, iterations))

    def _launch_burst(self, chunks: list[Chunk], iterations: int, chained: bool = False) -> BurstFlight:
        try:
            return self._launch_burst_now(chunks, iterations, chained)
        except BaseException:
            for chunk in chunks:  # a second chain's pages (the burst's own are the requests')
                self.scheduler.settle_second_chain(chunk, None)
            raise

    def _launch_burst_now(self, chunks: list[Chunk], iterations: int, chained: bool) -> BurstFlight:
        from sglaunch.speculative.burst import LEAD, BurstInput

        start = time.perf_counter()
        second = [c.second_pages for c in chunks] if chunks[0].second_pages else None
        burst = BurstInput([c.req.token_ids[-1] for c in chunks], [c.start for c in chunks],
                           [c.req.pages for c in chunks], iterations, second)
        which = self._burst_kind(chunks)
        policy = self._burst_policy(which)
        if which != "greedy":
            self._sampled_burst_inputs(burst, chunks, which == "filtered")
        if self.burst_early_stop and policy.stop_pays(len(chunks), iterations - LEAD):
            # NOTE: one rank (burst_early_stop): no command for the workers
            pending = self.runner.launch_burst(burst, queue=LEAD)
        else:
            pending = self._on_all_ranks("burst", burst, self.runner.launch_burst)
        return BurstFlight(chunks, iterations, pending, start, chained, len(self.scheduler.waiting), policy)

    def _sampled_burst_inputs(self, burst, chunks: list[Chunk], filtered: bool = False) -> None:
        """A sampled burst's temperatures (0.0 for greedy rows) and uniforms: each sampled request
        draws 2 * gamma + 1 per iteration from its own generator, in iteration order, as that many
        drafting steps of the usual path would (DSparkDecoder._uniforms); greedy rows take zeros.
        filtered: each row's top-k, top-p and min-p too (None where it filters nothing).
        NOTE: the iterations an early stop leaves unrun have drawn theirs too (never read)."""
        N, W, vocab = burst.iterations, 2 * self.spec.gamma + 1, self.runner.spec.vocab_size
        uniforms = torch.zeros(len(chunks), N, W)
        temperatures, settings = [], []
        for r, chunk in enumerate(chunks):
            params = chunk.req.sampling
            if is_greedy(params):
                temperatures.append(0.0)
                settings.append(None)
                continue
            temperatures.append(float(params.temperature))
            settings.append(filter_settings(params, vocab) if filters(params, vocab) else None)
            uniforms[r] = draw_uniforms(self.generators.get(chunk.req.rid), N, W)
        burst.temperatures, burst.uniforms = temperatures, uniforms.transpose(0, 1).contiguous().numpy()
        if filtered:
            burst.filters = settings

    def _drive_burst(self, flight: BurstFlight) -> None:
        """Queue the rest of a burst launched a few iterations at a time, LEAD iterations ahead of
        the device, and end it early once a command arrives (unread in the channel, or read into
        the scheduler's queue since the launch) if BurstPolicy.stop_pays: the arrival is admitted
        after at most LEAD more iterations instead of the whole burst. Then close it (its rows'
        copy to the host is queued) and record the iterations it ran."""
        from sglaunch.speculative.burst import LEAD, POLL_S

        runner, pending, policy = self.runner.burst, flight.pending, self.burst
        requests, priced = len(flight.chunks), flight.policy or policy
        while pending.queued < flight.iterations:
            arrived = len(self.scheduler.waiting) > flight.waiting or (
                self.input_waiting is not None and self.input_waiting())
            if arrived and priced.stop_pays(requests, flight.iterations - pending.queued):
                policy.stopped += 1
                policy.stopped_iterations += flight.iterations - pending.queued
                break
            if pending.queued - runner.iterations_done(pending) < LEAD:
                runner.extend(pending)
            else:
                time.sleep(POLL_S)
        runner.close(pending)
        flight.iterations = pending.iterations

    def _collect_burst(self, flight: BurstFlight) -> list[TokenOutput]:
        """Read a launched burst back and commit its tokens; then, before its outputs, stats and
        everything the engine's loop does until the next step, launch the batch's next burst when
        the next step would make it anyway (_chain_plan): that burst stays in flight, and the next
        step() finishes it. A request aborted while its burst ran gets nothing more."""
        self._burst_in_flight = None
        if not flight.pending.closed:
            self._drive_burst(flight)
        result = self.runner.burst.read(flight.pending)
        read_at = time.perf_counter()
        chains = 2 if flight.chunks[0].second_pages else 1  # a burst that verified a second chain
        # NOTE: a chained burst's cost is the time between the rows of the burst before and its
        # own: the commit and launch between them left the device idle, the tail after the launch did not
        seconds = read_at - (self._burst_read_at if flight.chained else flight.started)
        self._burst_read_at = read_at
        chunks, sampled, logprobs = [], [], []
        for r, chunk in enumerate(flight.chunks):
            if chunk.req.status is ReqStatus.RUNNING:
                tokens, lps = result.request_tokens(r)
                chunks.append(chunk)
                sampled.append(tokens)
                logprobs.append(lps)
                if chains == 2:  # NOTE: before the commit: where the second chain won, its pages hold the KV
                    result.swap_second_pages(r, chunk.start, chunk.req.pages, chunk.second_pages)
            self.scheduler.settle_second_chain(chunk, None)  # the chain's pages now hold losers only
        self.counters["steps"] += flight.iterations
        self._aside_streak = 0
        # NOTE: the pages reserved past what was committed stay while the next burst is planned:
        # at page size 1 a burst of 32 requests x 4 iterations reserves about 1,000 pages and
        # gives back about 700, which a chained burst would take again at once
        finished = self.scheduler.commit(chunks, sampled, trim=False)
        chain = self._chain_plan()
        if chain is not None:
            self._burst_in_flight = self._launch_burst(*chain, chained=True)
            self.burst.chained += 1
        else:
            self.scheduler.trim(chunks)
        gamma, R = self.spec.gamma, len(flight.chunks)
        for accepted in result.accepted:
            self.spec.stats.record_step([n + 1 for n in accepted], chains * R * (gamma + 1), 0.0,
                                        seconds / flight.iterations)
        if chains == 2:
            wins = sum(map(sum, result.second_won)) if result.second_won is not None else 0
            self.spec.stats.record_second_chains(R * flight.iterations, wins)
        self.spec.planner.skip_step()
        self.spec.planner.observe_accepts(result.accepted)
        outputs = self._outputs(chunks, sampled, logprobs, finished)
        # NOTE: priced with its commit and outputs when nothing was launched behind it: what a
        # burst step costs the engine then
        end = time.perf_counter() if chain is None else read_at
        (flight.policy or self.burst).observe(result.accepted, seconds + (end - read_at), R)
        self.spec._maybe_log()
        return outputs

    def _samples_at_t(self, chunks: list[Chunk]) -> bool:
        """Whether a row of the step samples at T > 0 (the planner prices such steps by their own
        scales). NOTE: O(1) while no request samples (only those have a generator)."""
        generators = self.generators
        return bool(generators) and any(c.req.rid in generators for c in chunks if c.samples)

    def _decide(self, chunks: list[Chunk], candidates: list[Chunk], sampled: bool | None = None):
        """DSpark's decision before anything is drafted or reserved -> (candidates, extra tokens,
        budget K), or None for a plain step (nothing can speculate, or the planner steps aside:
        counted). NOTE: reads request ids, lengths and lookahead caps only, never a token's value,
        so it may run while the last token of a request is still a placeholder."""
        if not candidates:  # _candidates(chunks)
            return None
        # NOTE: every candidate is a one-token decode chunk (Scheduler._chunk_lookahead)
        extra = sum(c.end - c.start for c in chunks) - len(candidates)
        # the tokens the other rows commit whatever is drafted (each candidate samples one too)
        committed = sum(1 for c in chunks if c.samples) - len(candidates)
        if sampled is None:
            sampled = self._samples_at_t(chunks)
        # a second chain's window (anchor + its drafts) comes on top of the budget, for up to SECOND_CHAIN_MAX_BATCH
        chain = self.spec.chain_rows(sampled, len(candidates)) if self._chains_fit(chunks, len(candidates)) else 0
        room = self._graph_room(chunks, extra + len(candidates), chain, self.spec.gamma * len(candidates))
        if room is not None and room < (1 if self.spec.mode != "static" else self.spec.gamma * len(candidates)):
            # NOTE: no draft fits the largest captured graph beside this step's rows (a prompt chunk the
            # scheduler sized to that graph, graph-sized steps): drafting would run the step eagerly
            self.spec.step_aside(len(candidates))
            self._aside_streak += 1
            return None
        budget = self.spec.plan([c.req.rid for c in candidates], extra, committed, sampled)
        if budget is None:
            self._aside_streak += 1
            return None
        self._aside_streak = 0
        return candidates, extra, budget if room is None else min(budget, room)

    def _graph_room(self, chunks: list[Chunk], fixed: int, chain: int, drafts: int) -> int | None:
        """The draft rows a step of these chunks can verify and still replay a captured graph (negative:
        not even none): `fixed` rows before any draft (prompt chunks, decodes, anchors), `chain` second-chain
        rows on top, at most `drafts` drafts. None where no limit applies: every draft fits, no graphs, or a
        step that runs eagerly anyway. H100, session 44 (benchmarks/gpu44/run2): at 8 requests at most the
        largest ragged tier is 64 rows and graph-sized steps size a prompt chunk to fill it beside the decodes;
        28 of DSpark's 362 admitting steps drafted on top of that and ran eagerly, 15-26 ms each, where the
        graph-replayed ones took 1.4 ms (p50)."""
        tiers = self.runner.verify_token_tiers  # NOTE: sorted; the cheap test first, every drafting decision
        if not tiers or fixed + chain + drafts <= tiers[-1]:
            return None
        tiers = self._verify_tiers(chunks)
        if not tiers or fixed > max(tiers):
            return None
        return max(tiers) - fixed - chain

    def _draft_context(self, chunks: list[Chunk], drafting: bool, step: StepInput) -> bool:
        """Whether a step writes the draft context (StepInput.draft_context). Not for a plain step
        of decodes only after the planner has stepped aside `context_skip_streak` times in a row
        (SGLAUNCH_DSPARK_SKIP_CONTEXT), when it holds more requests than a burst does, or any number
        once the confidence check finds the drafter failing this traffic (planner.drafter_failing:
        at small batches the context stays for bursts, unless the drafts are not accepted anyway).
        At such loads a stepped aside step wrote the drafter's context K/V of every row for drafts
        that never came (H200, session 13: 5-13% over a plain engine's step in-process at 64 and 256
        requests; session 18's drafter on random target weights served 0.961x of plain at c=8, where
        every stepped-aside step still wrote it: the case drafter_failing covers, not measured since).
        At small batches the context also goes once bursts have been declined as not worth it for
        burst_declined_streak steps in a row (H100, session 22: the bundled drafter on random target
        weights, priced at 1.3 by its own confidences, stepped aside on 97% of c=1's steps and 100%
        of c=8's, declined every burst, and still wrote the context: 0.92x and 0.95x of plain). A
        small batch where every row samples at T > 0 cannot burst without sampled bursts (or, with a row
        that filters with top-k, top-p or min-p, without filtered ones), so it skips after the streak
        too (H100, session 36, T=0.7: DSpark stepped aside on 92% of c=8's steps and served 0.90x of plain); with sampled
        bursts its context stays for them (H100, session 38, T=0.7, c=1,4,8, three rounds: with the
        skip, the server counted 7,072 steps that could not burst for a request's lost context beside
        12,372 sampled-burst iterations, benchmarks/gpu38/call5/bench1/bench-server-dspark.log).
        Its requests get a context gap and never draft again; requests admitted later draft as before.
        Once every running request has a gap, a plain step writes no context without deciding anything.
        NOTE: pages such a request leaves in the radix cache hold no draft context either: a later
        request on that prefix drafts over holes (lossless, rarely accepted)."""
        if not drafting and self.context_skip and not self.scheduler.any_gapless():
            # NOTE: every running request has a context gap already (none can draft again): nothing to
            # write the context for, and nothing to decide (on the dev CPU the test below took 15 us a
            # step at 16 requests, `benchmarks/aside_host_cost.py --concurrency 16 --temperature 0.7`)
            self.context_skipped_steps += 1
            return False
        if (drafting or not self.context_skip
                or self._aside_streak < self.context_skip_streak
                or step.num_tokens != step.batch_size  # NOTE: a prefill chunk among them (one row a decode)
                or (len(chunks) < self.context_skip_min_batch and self._burst_declined < self.burst_declined_streak
                    and not self.spec.planner.drafter_failing()
                    # NOTE: a batch where every row samples at T > 0 bursts only through sampled
                    # bursts (temperature-only rows): else nothing to keep the context for
                    and (any(is_greedy(c.req.sampling) for c in chunks) or self._burst_kind(chunks) is not None))):
            return True
        self.scheduler.mark_context_gaps()  # NOTE: this step's chunks are the running requests
        self.context_skipped_steps += 1
        return False

    def _propose(self, chunks: list[Chunk], decision):
        """DSpark: draft for the chunks that speculate (their draft_tokens get filled) after
        _decide said so; None for a plain decode step (no drafter, and no draft pages reserved)."""
        if decision is None:
            return None
        candidates, extra, budget = decision
        self.scheduler.reserve_lookahead(candidates)
        spec_chunks = [c for c in candidates if c.lookahead]
        if not spec_chunks:
            return None
        extra += sum(c.end - c.start for c in candidates if not c.lookahead)
        # a second chain where every row the step samples is greedy (the host accept judges it) or,
        # with SGLAUNCH_DSPARK_SAMPLED_CHAIN, where a drafting request samples (the device accept judges it)
        sampled = not all(is_greedy(c.req.sampling) for c in spec_chunks)
        second = (self.scheduler.reserve_second_chain if (self.spec.sampled_chain if sampled else (
            self.spec.second_chain and all(is_greedy(c.req.sampling) for c in chunks if c.samples)))
            and self._chains_fit(chunks, len(spec_chunks)) else None)
        return self.spec.propose(spec_chunks, self.generators, extra, self._draft_on_all_ranks,
                                 self._verify_tiers(chunks), budget, **({"second_pages": second} if second else {}))

    def _chains_fit(self, chunks: list[Chunk], requests: int) -> bool:
        """Whether second chains for `requests` drafting requests keep the step within the largest captured
        graph's batch: each chain's window is a query segment of its own (step._second_window). A step that
        runs eagerly anyway (no graphs, more chunks than the largest graph takes) keeps them. H100, session
        45 (`test_dspark_drafts_never_push_an_admitting_step_past_the_largest_graph`): at --cuda-graph-max-bs
        4 and 4 running requests, greedy drafting steps with the default second chain made 8 segments, and 6
        target forwards ran eagerly (`eager (batch)`)."""
        most = self.runner.graph_max_batch
        return most is None or len(chunks) > most or len(chunks) + requests <= most

    def _verify_tiers(self, chunks: list[Chunk]) -> tuple[int, ...]:
        """Captured verify-graph tiers a step of these chunks can replay; none when it will run
        eagerly (a batch over the largest bucket, a prefill chunk longer than a ragged graph takes)."""
        graphs = self.runner.graphs
        if graphs is not None and (len(chunks) > graphs.plan.max_bs or
                                   any(c.end - c.start > graphs.plan.max_query for c in chunks if not c.lookahead)):
            return ()
        return tuple(self.runner.verify_token_tiers)

    def _sample(self, chunks: list[Chunk], logits: torch.Tensor, rows: list, sampled: list, logprobs: list,
                failed: dict[int, Exception], extra: torch.Tensor | None = None) -> None:
        """The plain (not drafting) rows' tokens. extra: read back with their greedy choices
        (ModelRunner.greedy_host), for the accept that follows."""
        plain = [i for i, chunk in enumerate(chunks) if chunk.samples and not chunk.lookahead]
        if not plain:
            return
        params = [chunks[i].req.sampling for i in plain]
        if all(is_greedy(p) for p in params):  # a decode graph may have chosen them already
            chosen = self.runner.greedy_host([rows[i] for i in plain], extra)
            if chosen is not None:
                for i, token, logprob in zip(plain, *chosen[:2]):
                    sampled[i], logprobs[i] = token, logprob
                return
        generators = [self.generators.get(chunks[i].req.rid) for i in plain]
        failures: dict[int, Exception] = {}  # NOTE: a row that cannot be sampled fails its request only
        choices = sample_device(rows_of(logits, [rows[i] for i in plain]), params, generators, failures)
        self._take_choices(list(zip(plain, range(len(plain)))), choices, failures, sampled, logprobs, failed)

    @staticmethod
    def _take_choices(pairs: list[tuple[int, int]], choices, failures: dict[int, Exception], sampled: list,
                      logprobs: list, failed: dict[int, Exception]) -> None:
        """Read sampled choices back (one copy) into per-chunk results: pairs (chunk index, its
        position in the choices); a position in `failures` (or flagged on the device) fails its chunk."""
        tokens, values = read_choices(choices, failures)
        for i, position in pairs:
            if position in failures:
                failed[i] = failures[position]
            else:
                sampled[i], logprobs[i] = tokens[position], values[position]

    def fail_request(self, rid: str, error: BaseException) -> TokenOutput | None:
        """End one request because the engine could not run it: its pages are freed and its
        last output carries `error` (finish_reason "abort"); None when it is not running."""
        out = self.abort(rid)
        if out is None:
            return None
        logger.warning("Request %s failed in the engine: %r", rid, error)
        return dataclasses.replace(out, error=f"{type(error).__name__}: {error}")

    def fail_running(self, error: BaseException) -> list[TokenOutput]:
        """A step failed where no single request is to blame: fail the requests it may have run."""
        self._in_flight = None  # NOTE: its placeholders are in running or preempted requests
        if self._burst_in_flight is not None:  # a second chain's pages
            for chunk in self._burst_in_flight.chunks:
                self.scheduler.settle_second_chain(chunk, None)
        self._burst_in_flight = None
        rids = [req.rid for req in self.scheduler.running]
        rids += [req.rid for req in self.scheduler.waiting if req.token_ids[-1] < 0]
        return [out for rid in rids if (out := self.fail_request(rid, error)) is not None]

    def _accept(self, proposal, logits, rows: list, chunks: list[Chunk], sampled: list, logprobs: list,
                verify_seconds: float) -> None:
        index = {id(c): i for i, c in enumerate(chunks)}
        spec_rows = [rows[index[id(c)]] for c in proposal.chunks]
        greedy = logits is None or (self.runner.step_greedy is not None and
                                    all(is_greedy(c.req.sampling) for c in proposal.chunks))
        if greedy:  # the forward chose every row greedily: accept on the host
            results = self.spec.accept_greedy(proposal, spec_rows, self.runner.greedy_host, verify_seconds)
        else:
            results = self.spec.accept(proposal, logits, spec_rows, verify_seconds)
        for chunk, accepted in zip(proposal.chunks, results):
            i = index[id(chunk)]
            sampled[i], logprobs[i] = accepted.tokens, accepted.logprobs
            if chunk.second_pages:
                self.scheduler.settle_second_chain(chunk, accepted.accept_length - 1 if accepted.second_won else None)

    def _outputs(self, chunks: list[Chunk], sampled: list, logprobs: list, finished: list[Req]) -> list[TokenOutput]:
        done = {req.rid for req in finished}
        outputs = []
        for chunk, token, logprob in zip(chunks, sampled, logprobs):
            req = chunk.req
            if token is None:
                continue
            accept_length = len(token) if isinstance(token, list) else None
            tokens = tuple(token[: chunk.committed]) if accept_length else (token,)
            lps = tuple(logprob[: chunk.committed]) if accept_length else (logprob,)
            self.counters["generated_tokens"] += len(tokens)
            if req.rid in done:
                outputs.append(self._final_output(req, tokens, lps, accept_length))
            else:
                outputs.append(self._token_output(req, tokens, lps, accept_length=accept_length))
        sampled_rids = {c.req.rid for c, t in zip(chunks, sampled) if t is not None}
        outputs += [self._final_output(r, ()) for r in finished if r.rid not in sampled_rids]
        return outputs

    def _token_output(self, req: Req, tokens: tuple, logprobs: tuple = (), finished: bool = False,
                      accept_length: int | None = None) -> TokenOutput:
        # NOTE: one per running request per step: token_output, not TokenOutput's slow frozen __init__
        return token_output(req.rid, tokens, finished, req.finish_reason if finished else None,
                            req.num_prompt_tokens, req.num_output_tokens, req.cached_tokens, accept_length, logprobs)

    def _final_output(self, req: Req, tokens: tuple, logprobs: tuple = (),
                      accept_length: int | None = None) -> TokenOutput:
        self.requests.pop(req.rid, None)
        self.generators.pop(req.rid, None)
        if self.spec is not None:
            self.spec.release(req.rid)
        self.counters["finished_requests"] += 1
        self.counters["cached_tokens"] += req.cached_tokens
        return self._token_output(req, tokens, logprobs, finished=True, accept_length=accept_length)

    # ---- driving the workers ------------------------------------------------------------
    def _run_on_all_ranks(self, step) -> torch.Tensor:
        return self._on_all_ranks("step", step, self.runner.forward)

    def _draft_on_all_ranks(self, step):
        return self._on_all_ranks("draft", step, self.runner.draft_block)

    def _on_all_ranks(self, kind: str, payload, run_here: Callable):
        """Broadcast (kind, payload) to the workers, run it on rank 0; a failure ends the cluster."""
        try:
            self.tp.send_command(kind, payload)
            return run_here(payload)
        except Exception as exc:
            if self.tp.size > 1 and self.on_tp_failure is not None:
                self.on_tp_failure(exc)
            raise

    def keepalive(self) -> None:
        """Tell idle workers rank 0 is alive (their step broadcast would time out); DSpark's
        `spec:` line for the steps since its last one."""
        if self.spec is not None:
            self.spec._maybe_log(force=True)
        try:
            self.tp.send_command("noop")
        except Exception as exc:
            if self.on_tp_failure is not None:
                self.on_tp_failure(exc)
            raise

    def stop_workers(self) -> None:
        self.tp.send_command("shutdown")
        self.tp.barrier()

    # ---- facts for /server_info and /metrics --------------------------------------------
    def live_stats(self) -> dict:
        page_size = self.config.page_size
        total_tokens = self.allocator.num_pages * page_size
        radix = self.scheduler.radix
        # as SGLang counts it: cached prefix pages no request holds can be evicted at any time,
        # so they are not "in use" (an idle server with a warm cache reads 0, not 0.999)
        evictable = (radix.evictable_pages * page_size) if radix else 0
        active = self.scheduler.kv_used_tokens() - evictable
        return {
            "num_running_requests": len(self.scheduler.running),
            "num_waiting_requests": len(self.scheduler.waiting),
            "kv_used_tokens": active,
            "kv_cached_tokens": (radix.cached_pages * page_size) if radix else 0,
            "kv_evictable_tokens": evictable,
            "kv_usage": active / total_tokens,
            "num_preemptions": self.scheduler.num_preemptions,
            "total_prefill_steps": self.scheduler.num_prefill_steps,
            "total_admission_held_steps": self.scheduler.held_steps,
            "step_seconds": {kind: list(v) for kind, v in self.step_seconds.items()},
            **{f"total_{k}": v for k, v in self.counters.items()},
            **self._graph_stats(),
            **self._spec_stats(),
            "gc": PAUSES.stats(),  # the collector's passes in this process since start-up (engine/heap.py)
        }

    def _graph_stats(self) -> dict:
        """Target forwards served by a CUDA graph, by kind (rank 0's): the other steps ran eagerly
        (a prefill chunk longer than a ragged graph takes, a batch over the largest bucket)."""
        graphs = self.runner.graphs
        if graphs is None:
            return {}
        return {"total_graph_replays": dict(graphs.replays)}

    def _spec_stats(self) -> dict:
        """DSpark statistics: a `speculative` section plus SGLang's `avg_spec_accept_length`."""
        if self.spec is None:
            return {}
        stats = self.spec.stats.to_dict()
        stats["mode"] = self.spec.mode
        if self.burst is not None:  # DSpark bursts: how many, how many steps declined one, the estimates
            stats["bursts"] = {"bursts": self.burst.bursts, "iterations": self.burst.burst_iterations,
                               "chained": self.burst.chained, "stopped_early": self.burst.stopped,
                               "declined_steps": self.burst.declined, "skipped_steps": dict(self.burst.skipped),
                               "accept_estimate": self.burst.accept, "cost_scale": self.burst.scale}
            # sampled and filtered bursts, each priced on its own (chained and stopped counted above)
            for name, kind in (("sampled", self.burst_sampled), ("filtered", self.burst_filtered)):
                if kind is not None:
                    stats["bursts"][name] = {"bursts": kind.bursts, "iterations": kind.burst_iterations,
                                             "declined_steps": kind.declined, "accept_estimate": kind.accept,
                                             "cost_scale": kind.scale}
        stats["context_skipped_steps"] = self.context_skipped_steps
        if self.spec.planner.calibration is not None and self.spec.planner.can_step_aside:
            stats["step_cost_scale"] = self.spec.planner.calibration.to_dict()  # measured / modelled
        return {"speculative": stats, "avg_spec_accept_length": stats["mean_accept_length"]}

    def static_info(self) -> dict:
        return {
            "max_total_num_tokens": self.allocator.num_pages * self.config.page_size,
            "context_length": self.limits.context_length,
            "eos_token_ids": list(self.limits.eos_token_ids),
            "vocab_size": self.runner.spec.vocab_size,
            "max_running_requests": self.limits.max_running_requests,
            "chunked_prefill_size": self.limits.chunked_prefill_size,
            "page_size": self.config.page_size,
            "radix_cache": not self.config.disable_radix_cache,
            "architecture": self.runner.spec.family,
        }
