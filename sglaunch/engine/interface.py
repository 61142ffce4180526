"""The narrow interface between the HTTP server and the engine.

The server (tokenizer, chat templates, OpenAI routes) talks to the engine only through
these types; the engine (scheduler, KV cache, model runner, tensor-parallel workers) knows
nothing about HTTP. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import AsyncIterator, Literal, Protocol

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0  # 0 (or below 1e-5): greedy
    top_p: float = 1.0
    top_k: int = -1  # -1: off
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()  # in addition to the model's EOS ids
    ignore_eos: bool = False
    min_p: float = 0.0  # 0: off; drops tokens below min_p * the most likely token's probability


@dataclass(frozen=True)
class GenerateRequest:
    rid: str
    input_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)


@dataclass(frozen=True)
class TokenOutput:
    """One increment of a request's output; the last one has `finished=True`."""

    rid: str
    new_token_ids: tuple[int, ...]
    finished: bool = False
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the radix cache
    # speculative decoding: tokens accepted in the step that produced this increment (incl. bonus)
    accept_length: int | None = None
    # log-probability of each of new_token_ids under the model's unmodified distribution
    logprobs: tuple[float, ...] = ()
    # set on the last output of a request the engine failed on (finish_reason "abort"): why
    error: str | None = None


_new = object.__new__
_set = object.__setattr__


def token_output(rid: str, new_token_ids: tuple[int, ...], finished: bool = False,
                 finish_reason: FinishReason | None = None, prompt_tokens: int = 0, completion_tokens: int = 0,
                 cached_tokens: int = 0, accept_length: int | None = None, logprobs: tuple[float, ...] = (),
                 error: str | None = None) -> TokenOutput:
    """TokenOutput(...) at less than half the cost: the frozen dataclass's __init__ sets each field
    through object.__setattr__ (2.9 us for the ten fields on the 2-core machine), this installs the
    instance's __dict__ at once (1.3 us; `python benchmarks/token_output_cost.py`). The engine makes one per running request per
    step, the server one per output it receives. Equal to TokenOutput(...) in every respect
    (equality, hash, repr, frozenness)."""
    out = _new(TokenOutput)
    _set(out, "__dict__", {"rid": rid, "new_token_ids": new_token_ids, "finished": finished,
                           "finish_reason": finish_reason, "prompt_tokens": prompt_tokens,
                           "completion_tokens": completion_tokens, "cached_tokens": cached_tokens,
                           "accept_length": accept_length, "logprobs": logprobs, "error": error})
    return out


def joined(first: TokenOutput, then: TokenOutput) -> TokenOutput:
    """Two consecutive increments of one request as one: token ids and log-probabilities joined,
    the counts, finish and accept length of the later one."""
    return TokenOutput(then.rid, first.new_token_ids + then.new_token_ids, then.finished, then.finish_reason,
                       then.prompt_tokens, then.completion_tokens, then.cached_tokens, then.accept_length,
                       first.logprobs + then.logprobs, then.error)


class AsyncEngine(Protocol):
    """What the HTTP server needs from the engine."""

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenOutput]:
        """Stream outputs of one request; raises ValueError for requests the engine refuses."""
        ...

    async def abort(self, rid: str) -> None:
        """Stop a request (e.g. the client disconnected) and free its KV pages."""
        ...

    async def flush_cache(self) -> dict:
        """Empty the prefix cache if no request runs or waits: {"flushed": True, "freed_pages", ...}
        or {"flushed": False, "running", "waiting"} (nothing flushed) or {"flushed": False, "error"}."""
        ...

    def server_info(self) -> dict:
        """Static and live facts for /server_info and /metrics (KV usage, queue length, ...)."""
        ...

    async def shutdown(self) -> None: ...
