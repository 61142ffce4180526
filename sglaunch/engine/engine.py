"""Rank 0's engine: scheduler + model runner + sampler, driving the other ranks every step.

Synchronous and single-threaded on purpose; ThreadedEngine runs it on a background thread for
the asyncio server, and generate_batch calls it directly.
"""

from __future__ import annotations

import logging
import random
from typing import Callable, NoReturn

import torch

from sglaunch.config import EngineConfig
from sglaunch.engine.allocator import PageAllocator
from sglaunch.engine.distributed import TPGroup
from sglaunch.engine.interface import GenerateRequest, TokenOutput
from sglaunch.engine.model_runner import ModelRunner
from sglaunch.engine.radix_cache import RadixCache
from sglaunch.engine.request import Req
from sglaunch.engine.sampler import is_greedy, make_generator, sample
from sglaunch.engine.scheduler import Chunk, Scheduler, SchedulerLimits
from sglaunch.engine.step import build_step_input

logger = logging.getLogger(__name__)

DEFAULT_MAX_RUNNING_REQUESTS = 256


def scheduler_limits(config: EngineConfig, runner: ModelRunner) -> SchedulerLimits:
    chunk = config.chunked_prefill_size
    return SchedulerLimits(
        page_size=config.page_size,
        max_running_requests=config.max_running_requests or DEFAULT_MAX_RUNNING_REQUESTS,
        chunked_prefill_size=chunk if chunk and chunk > 0 else None,
        context_length=runner.context_length,
        eos_token_ids=runner.spec.eos_token_ids,
    )


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
        self.generators: dict[str, torch.Generator] = {}
        self._seeds = random.Random(config.random_seed)
        self.counters = {"prompt_tokens": 0, "generated_tokens": 0, "cached_tokens": 0, "finished_requests": 0, "steps": 0}

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
            self.generators[req.rid] = make_generator(seed, self.runner.device)
        self.requests[req.rid] = req
        self.scheduler.add(req)
        return []

    def abort(self, rid: str) -> TokenOutput | None:
        req = self.scheduler.abort(rid)
        if req is None:
            return None
        return self._final_output(req, ())

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    # ---- one step -----------------------------------------------------------------------
    def step(self) -> list[TokenOutput]:
        """Schedule, run the forward pass on every rank, sample, and report new tokens."""
        chunks = self.scheduler.schedule()
        sampled: list[int | None] = [None] * len(chunks)
        logprobs: list[float | None] = [None] * len(chunks)
        if chunks:
            step = build_step_input(chunks, self.config.page_size)
            logits = self._run_on_all_ranks(step)  # [num_samples, vocab]
            self._sample(chunks, logits, sampled, logprobs)
            self.counters["steps"] += 1
        finished = self.scheduler.commit(chunks, sampled)
        return self._outputs(chunks, sampled, logprobs, finished)

    def _sample(self, chunks: list[Chunk], logits: torch.Tensor, sampled: list, logprobs: list) -> None:
        rows = [i for i, chunk in enumerate(chunks) if chunk.samples]
        if not rows:
            return
        params = [chunks[i].req.sampling for i in rows]
        generators = [self.generators.get(chunks[i].req.rid) for i in rows]
        tokens, token_logprobs = sample(logits, params, generators)
        for i, token, logprob in zip(rows, tokens, token_logprobs):
            sampled[i], logprobs[i] = token, logprob

    def _outputs(self, chunks: list[Chunk], sampled: list, logprobs: list, finished: list[Req]) -> list[TokenOutput]:
        done = {req.rid for req in finished}
        outputs = []
        for chunk, token, logprob in zip(chunks, sampled, logprobs):
            req = chunk.req
            if token is None:
                continue
            self.counters["generated_tokens"] += 1
            if req.rid in done:
                outputs.append(self._final_output(req, (token,), (logprob,)))
            else:
                outputs.append(self._token_output(req, (token,), (logprob,)))
        sampled_rids = {c.req.rid for c, t in zip(chunks, sampled) if t is not None}
        outputs += [self._final_output(r, ()) for r in finished if r.rid not in sampled_rids]
        return outputs

    def _token_output(self, req: Req, tokens: tuple, logprobs: tuple = (), finished: bool = False) -> TokenOutput:
        return TokenOutput(
            rid=req.rid,
            new_token_ids=tokens,
            finished=finished,
            finish_reason=req.finish_reason if finished else None,
            prompt_tokens=req.num_prompt_tokens,
            completion_tokens=req.num_output_tokens,
            cached_tokens=req.cached_tokens,
            logprobs=logprobs,
        )

    def _final_output(self, req: Req, tokens: tuple, logprobs: tuple = ()) -> TokenOutput:
        self.requests.pop(req.rid, None)
        self.generators.pop(req.rid, None)
        self.counters["finished_requests"] += 1
        self.counters["cached_tokens"] += req.cached_tokens
        return self._token_output(req, tokens, logprobs, finished=True)

    # ---- driving the workers ------------------------------------------------------------
    def _run_on_all_ranks(self, step) -> torch.Tensor:
        try:
            self.tp.broadcast_object(("step", step))
            return self.runner.forward(step)
        except Exception as exc:
            if self.tp.size > 1 and self.on_tp_failure is not None:
                self.on_tp_failure(exc)
            raise

    def keepalive(self) -> None:
        """Tell idle workers rank 0 is alive (their step broadcast would time out)."""
        try:
            self.tp.broadcast_object(("noop",))
        except Exception as exc:
            if self.on_tp_failure is not None:
                self.on_tp_failure(exc)
            raise

    def stop_workers(self) -> None:
        self.tp.broadcast_object(("shutdown",))
        self.tp.barrier()

    # ---- facts for /server_info and /metrics --------------------------------------------
    def live_stats(self) -> dict:
        page_size = self.config.page_size
        total_tokens = self.allocator.num_pages * page_size
        radix = self.scheduler.radix
        return {
            "num_running_requests": len(self.scheduler.running),
            "num_waiting_requests": len(self.scheduler.waiting),
            "kv_used_tokens": self.scheduler.kv_used_tokens(),
            "kv_cached_tokens": (radix.cached_pages * page_size) if radix else 0,
            "kv_usage": self.scheduler.kv_used_tokens() / total_tokens,
            "num_preemptions": self.scheduler.num_preemptions,
            **{f"total_{k}": v for k, v in self.counters.items()},
        }

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
