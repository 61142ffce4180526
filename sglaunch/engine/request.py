"""Per-request state held by the scheduler. Plain Python (no torch)."""

from __future__ import annotations

import enum
from array import array

from sglaunch.engine.interface import FinishReason, SamplingParams
from sglaunch.engine.radix_cache import RadixNode


class ReqStatus(enum.Enum):
    WAITING = "waiting"  # queued, or preempted and waiting to resume; holds no pages
    RUNNING = "running"  # holds KV pages; scheduled every step
    FINISHED = "finished"


class Req:
    """One generation request: its tokens, its KV pages and how far its KV is computed.

    NOTE: `token_ids` is prompt + generated tokens. The KV of `token_ids[:num_computed]` is in
    the pool; every step computes the next chunk of the rest, and a step whose chunk reaches the
    end of `token_ids` samples one new token. Prefill, decode and resuming after preemption are
    all that one rule.
    """

    def __init__(self, rid: str, prompt_ids: list[int], sampling: SamplingParams, arrival: int):
        self.rid = rid
        self.sampling = sampling
        self.arrival = arrival  # admission order; preemption picks the newest
        self.queued_step = 0  # the scheduler's step count when it was queued (admission grouping)
        self.token_ids = list(prompt_ids)
        self.num_prompt_tokens = len(prompt_ids)
        # KV page ids covering token_ids, in order; int32 at C speed: a step copies every running
        # request's table (page_size 1: one id per token), so slices and joins are memcpys
        self.pages: array = array("i")
        self.num_computed = 0
        self.prefix_node: RadixNode | None = None  # locked radix node of the borrowed prefix
        self.num_borrowed_pages = 0  # leading pages owned by the radix tree
        self.cached_tokens = 0  # prompt tokens served from the radix cache at first admission
        self.num_preemptions = 0
        self.status = ReqStatus.WAITING
        self.finish_reason: FinishReason | None = None
        # overlap (engine.py): the last token is a placeholder the device fills in, learnt a step
        # late; True when the length rules end the request there whatever that token is
        self.final_pending = False
        # DSpark: a step wrote no draft context for it (LLMEngine._draft_context): it never drafts
        # again (a drafter over a context with holes would rarely be accepted)
        self.context_gap = False

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_pending(self) -> int:
        """Tokens whose KV still has to be computed before the next sample."""
        return len(self.token_ids) - self.num_computed

    def __repr__(self) -> str:
        return (
            f"Req({self.rid!r}, {self.status.value}, tokens={len(self.token_ids)}, "
            f"computed={self.num_computed}, pages={len(self.pages)})"
        )
