"""Continuous-batching scheduler policy. Plain Python (no torch).

Every step mixes running requests (decode, or the next chunk of a chunked prefill) with newly
admitted ones. Admission reuses radix-cached prefixes. When the page allocator runs dry (after
evicting unlocked radix pages) the newest running request is preempted: its computed pages go
into the radix cache (or back to the allocator), and it re-enters the waiting queue with its
generated tokens intact; on resume it recomputes whatever KV the cache no longer holds.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field

from sglaunch.engine.allocator import PageAllocator
from sglaunch.engine.interface import FinishReason
from sglaunch.engine.radix_cache import RadixCache
from sglaunch.engine.request import Req, ReqStatus


ADMIT_WAIT_ENV = "SGLAUNCH_ADMIT_WAIT_STEPS"  # steps a new arrival may be held while a batch decodes
ADMIT_GROUP_ENV = "SGLAUNCH_ADMIT_GROUP"  # ...unless this many arrivals wait
ADMIT_GROUP = 8  # its default


def admission_from_env() -> dict[str, int]:
    """SchedulerLimits' admit_wait_steps and admit_group from SGLAUNCH_ADMIT_WAIT_STEPS (default 0:
    off) and SGLAUNCH_ADMIT_GROUP (default ADMIT_GROUP), read once at start-up."""
    from sglaunch.config import env_int

    return {"admit_wait_steps": env_int(ADMIT_WAIT_ENV, 0, 0), "admit_group": env_int(ADMIT_GROUP_ENV, ADMIT_GROUP, 1)}


@dataclass(frozen=True)
class SchedulerLimits:
    page_size: int
    max_running_requests: int
    chunked_prefill_size: int | None  # prefill tokens per step; None: whole prompts
    context_length: int
    eos_token_ids: tuple[int, ...]
    spec_lookahead: int = 0  # speculative decoding: draft tokens a decoding request may verify
    # admission grouping (SGLAUNCH_ADMIT_WAIT_STEPS): while a batch decodes, hold new arrivals up
    # to this many steps so that one step admits several (0: admit at once)
    admit_wait_steps: int = 0
    admit_group: int = ADMIT_GROUP  # ...unless this many wait (or as many as the batch has room for)
    # graph-sized steps (SGLAUNCH_GRAPH_SIZED_STEPS): the most rows a step's decodes and prompt chunks
    # take together, so that it fits the largest ragged CUDA graph (None: only chunked_prefill_size)
    step_token_cap: int | None = None


@dataclass
class Chunk:
    """Tokens `req.token_ids[start:end]` are computed this step.

    Speculative decoding: a decoding chunk (its one token is the anchor) with `lookahead` > 0
    has KV pages reserved for `lookahead` more positions; the engine puts the drafts it verifies
    in `draft_tokens` (computed after the anchor) and commits several tokens. A second chain
    (DSpark at T = 0, page size 1) is one more verify window of the same request: the anchor
    again, then `second_tokens`, at the same positions, reading the request's pages before the
    anchor and writing its own K/V to `second_pages` (one page per row); the engine keeps the
    winning chain's pages (Scheduler.settle_second_chain)."""

    req: Req
    start: int
    end: int
    lookahead: int = 0
    draft_tokens: list[int] = field(default_factory=list)
    second_tokens: list[int] = field(default_factory=list)
    second_pages: list[int] = field(default_factory=list)
    committed: int = 0  # tokens commit() kept (stop rules truncate a multi-token commit)

    @property
    def samples(self) -> bool:
        """True when the chunk reaches the end of the request's tokens: a new token follows."""
        return self.end == len(self.req.token_ids)


class Scheduler:
    def __init__(self, limits: SchedulerLimits, allocator: PageAllocator, radix: RadixCache | None):
        self.limits = limits
        self.allocator = allocator
        self.radix = radix
        self.waiting: list[Req] = []  # by arrival; preempted requests go back in arrival order
        self.running: list[Req] = []  # by arrival
        self._arrivals = 0
        self._schedules = 0  # schedule() calls: the clock of admission grouping
        self.held_steps = 0  # steps that held waiting arrivals back (admission grouping)
        self.num_preemptions = 0
        # steps that computed prompt tokens (a prefill chunk, alone or beside decodes)
        self.num_prefill_steps = 0
        self.finished_by_pool: list[Req] = []  # dropped because the pool cannot hold them alone
        # DSpark: the admitted requests that may still draft (no context gap, not finished), so that a
        # batch whose every request has a context gap costs lookahead_candidates and mark_context_gaps
        # no pass over its chunks (any_gapless). NOTE: every request enters RUNNING through
        # _admit_waiting, which appends it here; entries leave once gapped or finished (a preempted
        # request may appear twice: harmless)
        self.gapless: list[Req] = []

    # ---- requests in and out ------------------------------------------------------------
    def check(self, prompt_len: int, max_new_tokens: int) -> None:
        """Raise ValueError for a request the engine can never serve."""
        if prompt_len == 0:
            raise ValueError("the prompt is empty; send at least one token")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if prompt_len >= self.limits.context_length:
            raise ValueError(
                f"the prompt has {prompt_len} tokens, which does not fit the context length of "
                f"{self.limits.context_length} tokens (it must leave room for one generated token)"
            )
        capacity = self.allocator.num_pages * self.limits.page_size
        if prompt_len + 1 > capacity:
            raise ValueError(
                f"the prompt has {prompt_len} tokens but the KV pool holds only {capacity}; "
                "raise --max-total-tokens or --mem-fraction-static"
            )

    def add(self, req: Req) -> None:
        req.arrival = self._arrivals
        req.queued_step = self._schedules
        self._arrivals += 1
        self.waiting.append(req)

    def abort(self, rid: str) -> Req | None:
        """Drop a request wherever it is, freeing its pages; None when unknown or finished."""
        for queue in (self.waiting, self.running):
            for req in queue:
                if req.rid == rid:
                    queue.remove(req)
                    self._release(req)
                    if req.token_ids[-1] < 0:  # overlap: a token still in flight is never emitted
                        req.token_ids.pop()
                    req.status, req.finish_reason = ReqStatus.FINISHED, "abort"
                    return req
        return None

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one step -----------------------------------------------------------------------
    def schedule(self, lookahead: bool = True) -> list[Chunk]:
        """The chunks to compute this step (running requests first, then admissions).
        lookahead=False: reserve no draft pages here (the engine first asks its planner whether
        drafting pays, then calls reserve_lookahead)."""
        budget = [self.limits.chunked_prefill_size or math.inf, 0]  # prompt tokens left, and taken
        cap = self.limits.step_token_cap
        if cap:  # NOTE: every decoding request takes a row of the cap; prompt chunks get the rest
            decoding = sum(1 for req in self.running if req.num_pending == 1)
            budget[0] = min(budget[0], max(1, cap - decoding))
        self._schedules += 1
        chunks = self._schedule_running(budget)
        if self._hold_arrivals(chunks, budget):
            self.held_steps += 1
        else:
            chunks += self._admit_waiting(budget)
        if budget[1]:
            self.num_prefill_steps += 1
        if self.limits.spec_lookahead and lookahead:
            self.reserve_lookahead(chunks)
        if not chunks and not self.running and self.waiting:
            # NOTE: nothing runs and the head request still does not fit: it never will
            self._drop(self.waiting.pop(0))
        return chunks

    def _drop(self, req: Req) -> None:
        req.status, req.finish_reason = ReqStatus.FINISHED, "length"
        self.finished_by_pool.append(req)

    def _chunk_len(self, req: Req, budget: list[float]) -> int:
        if req.num_pending == 1:  # decode: not charged against the prefill budget
            return 1
        return int(min(req.num_pending, budget[0]))

    def _schedule_running(self, budget: list[float]) -> list[Chunk]:
        chunks, i = [], 0
        while i < len(self.running):
            req = self.running[i]
            length = 0 if req.final_pending else self._chunk_len(req, budget)
            if length == 0:
                i += 1
                continue
            if not self._reserve(req, req.num_computed + length):
                self._out_of_pages(req)
                continue  # running[i] is now the next request (or the same one, retried)
            chunks.append(Chunk(req, req.num_computed, req.num_computed + length))
            if req.num_pending > 1:
                budget[0] -= length
                budget[1] += length
            i += 1
        return chunks

    def _out_of_pages(self, req: Req) -> None:
        """Preempt the newest running request; if `req` is alone, the pool cannot hold it."""
        victim = self.running[-1]
        if victim is req and len(self.running) == 1:
            self.running.remove(req)
            self._release(req)
            self._drop(req)
            return
        self.preempt(victim)

    def preempt(self, req: Req) -> None:
        self.running.remove(req)
        self._release(req)
        req.status = ReqStatus.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        at = next((i for i, w in enumerate(self.waiting) if w.arrival > req.arrival), len(self.waiting))
        self.waiting.insert(at, req)

    def _hold_arrivals(self, chunks: list[Chunk], budget: list[float]) -> bool:
        """Admission grouping: whether this step leaves the waiting requests waiting. A step that
        admits prompts beside a decoding batch costs a fixed extra on top of the decode step (about
        a decode step's worth on an H200, mostly independent of the prompt tokens:
        benchmarks/mixed_step_cost.py), so several arrivals admitted together pay it once. Held only
        while every scheduled chunk decodes (a step already computing prompt tokens admits for
        free), fewer than `admit_group` requests wait (or fewer than the batch has room for), none
        of them was preempted, and the oldest has waited fewer than `admit_wait_steps` steps."""
        wait = self.limits.admit_wait_steps
        if wait <= 0 or not self.waiting or not chunks or budget[1]:
            return False
        # NOTE: a full batch (room <= 0) admits nothing either way: not counted as held
        room = self.limits.max_running_requests - len(self.running)
        if len(self.waiting) >= min(self.limits.admit_group, room):
            return False
        oldest = self.waiting[0]
        if oldest.num_preemptions:
            return False
        return self._schedules - oldest.queued_step <= wait

    def _admit_waiting(self, budget: list[float]) -> list[Chunk]:
        chunks: list[Chunk] = []
        while self.waiting and len(self.running) < self.limits.max_running_requests and budget[0] > 0:
            req = self.waiting[0]
            if req.final_pending:  # NOTE: overlap: it ends when its pending token is learnt
                break
            self._borrow_prefix(req)
            length = int(min(req.num_pending, budget[0]))
            if not self._has_headroom(req, req.num_computed + length) or not self._reserve(
                req, req.num_computed + length
            ):
                self._release(req)
                break
            self.waiting.pop(0)
            req.status = ReqStatus.RUNNING
            self.running.append(req)
            if self.limits.spec_lookahead > 0 and not req.context_gap:
                self.gapless.append(req)
            chunks.append(Chunk(req, req.num_computed, req.num_computed + length))
            budget[0] -= length
            budget[1] += length
        return chunks

    def _has_headroom(self, req: Req, end: int) -> bool:
        """Admit only if every running request can still grow by one page afterwards."""
        need = self._pages_for(end) - len(req.pages)
        spare = self.allocator.num_free + (self.radix.evictable_pages if self.radix else 0)
        return spare - need >= len(self.running)

    def lookahead_candidates(self, chunks: list[Chunk]) -> list[Chunk]:
        """The running decodes that could verify drafts this step (before any page is reserved):
        those whose _chunk_lookahead is positive. NOTE: inlined, with the cap's three bounds
        tested directly (it runs before every step of a DSpark engine, on every chunk). A request
        with a context gap never drafts again: tested first, since at load most requests have one
        (a stepped-aside batch of 64 requests: 28.0 -> 11.1 us a step on the dev CPU,
        `python benchmarks/aside_host_cost.py`)."""
        if self.limits.spec_lookahead <= 0 or not self.any_gapless():
            return []
        context, running, out = self.limits.context_length, ReqStatus.RUNNING, []
        for chunk in chunks:
            req = chunk.req
            if req.context_gap:
                continue
            n = len(req.token_ids)
            if (chunk.end - chunk.start == 1 and n - req.num_computed == 1 and req.status is running
                    and req.sampling.max_new_tokens - (n - req.num_prompt_tokens) > 1 and context - n > 1):
                out.append(chunk)
        return out

    def any_gapless(self) -> bool:
        """Whether an admitted request may still draft (no context gap, not finished); drops the
        entries once none can (or once they outnumber the running requests). At load, once every
        request has a context gap, this is what lookahead_candidates costs (a stepped-aside batch
        of 64 requests on the dev CPU, `python benchmarks/aside_host_cost.py` on the tree before
        and after: 16.7 / 12.8 -> 4.7 / 3.5 us a step)."""
        gapless, finished = self.gapless, ReqStatus.FINISHED
        if len(gapless) > 2 * len(self.running) + 8:  # finished or gapped entries piling up: drop them
            gapless[:] = [req for req in gapless if not req.context_gap and req.status is not finished]
        for req in gapless:  # NOTE: while drafting, the first entry usually answers
            if not req.context_gap and req.status is not finished:
                return True
        gapless.clear()
        return False

    def mark_context_gaps(self) -> None:
        """A decode-only step that writes no draft context (Engine._draft_context): every running
        request gets a context gap. On such a step the chunks are every running request (each
        scheduled for one token) but those whose last token is still pending, which end without
        another step; the requests with a gap already are skipped without a pass over the batch."""
        running = ReqStatus.RUNNING
        for req in self.gapless:
            if req.status is running:
                req.context_gap = True
        self.any_gapless()

    def reserve_lookahead(self, chunks: list[Chunk]) -> None:
        """Pages for the drafts each running decode may verify, from what is left after
        admission. NOTE: speculation never preempts: without pages a request verifies no drafts."""
        for chunk in chunks:
            lookahead = self._chunk_lookahead(chunk)
            if lookahead > 0 and self._reserve(chunk.req, chunk.end + lookahead):
                chunk.lookahead = lookahead

    def reserve_burst(self, chunks: list[Chunk], positions: int) -> bool:
        """A DSpark burst: pages for `positions` more positions after each chunk's anchor, for
        every chunk or for none (False: the pool, radix pages evicted, cannot hold them all; then
        nothing is reserved). Sets each chunk's lookahead so commit() trims what the burst's
        committed tokens do not use. NOTE: like speculation, a burst never preempts."""
        need = sum(max(0, self._pages_for(c.end + positions) - len(c.req.pages)) for c in chunks)
        spare = self.allocator.num_free + (self.radix.evictable_pages if self.radix else 0)
        if need > spare:
            return False
        for chunk in chunks:
            if not self._reserve(chunk.req, chunk.end + positions):  # NOTE: cannot fail after the count
                raise RuntimeError("the KV pool lost pages while a burst was reserved")
            chunk.lookahead = positions
        return True

    def _chunk_lookahead(self, chunk: Chunk) -> int:
        req = chunk.req
        if (chunk.end - chunk.start != 1 or req.num_pending != 1 or req.status is not ReqStatus.RUNNING
                or req.context_gap):
            return 0
        return self._lookahead_cap(req)

    def _lookahead_cap(self, req: Req) -> int:
        """Drafts worth verifying: a commit of n + 1 tokens stays within max_new_tokens and the
        context length."""
        left_new = req.sampling.max_new_tokens - req.num_output_tokens
        left_context = self.limits.context_length - len(req.token_ids)
        return max(0, min(self.limits.spec_lookahead, left_new - 1, left_context - 1))

    # ---- after the forward pass ---------------------------------------------------------
    def commit(self, chunks: list[Chunk], sampled: list[int | list[int] | None], trim: bool = True) -> list[Req]:
        """Record computed KV and new tokens (`sampled[i]` for chunks[i]: one token, or the
        accepted drafts plus the correction/bonus token of a speculative chunk); returns requests
        that finished this step, including any the pool could not hold. trim=False: running
        requests keep the pages reserved past what they computed (trim() gives them back; a
        chained burst reserves on top of them instead of freeing and taking them again)."""
        finished, self.finished_by_pool = self.finished_by_pool, []
        for chunk, tokens in zip(chunks, sampled):
            req = chunk.req
            req.num_computed = chunk.end
            if tokens is None:
                continue
            reason = self._append_tokens(chunk, [tokens] if isinstance(tokens, int) else tokens)
            if chunk.lookahead and trim:
                self._trim_pages(req)
            if reason is not None:
                self.running.remove(req)
                self._release(req)
                req.status, req.finish_reason = ReqStatus.FINISHED, reason
                finished.append(req)
        return finished

    # ---- overlap: tokens learnt one step late ------------------------------------------
    def commit_placeholders(self, chunks: list[Chunk], placeholders: list[int | None]) -> list[int | None]:
        """Record the computed KV of a step whose tokens are still on the device: each sampling
        chunk's request gets `placeholders[i]` (a negative id the next step's forward replaces on
        the device) as its last token. Returns, per chunk, the index of that token (or None)."""
        indices: list[int | None] = []
        for chunk, placeholder in zip(chunks, placeholders):
            req = chunk.req
            req.num_computed = chunk.end
            if placeholder is None:
                indices.append(None)
                continue
            indices.append(len(req.token_ids))
            req.token_ids.append(placeholder)
            # NOTE: the length rules do not depend on the token: no step is scheduled after it
            req.final_pending = (req.num_output_tokens >= req.sampling.max_new_tokens
                                 or len(req.token_ids) >= self.limits.context_length)
        return indices

    def take_dropped(self) -> list[Req]:
        """Requests the pool could not hold, dropped since the last commit."""
        dropped, self.finished_by_pool = self.finished_by_pool, []
        return dropped

    def resolve(self, req: Req, index: int, token: int) -> FinishReason | None:
        """The token at `index` (a placeholder) is `token`: apply the stop rules; returns the
        finish reason when the request ends here (its pages freed, wherever it waits or runs)."""
        if index != len(req.token_ids) - 1 or req.token_ids[index] >= 0:
            raise RuntimeError(f"{req!r}: token {index} is not its pending placeholder")
        req.token_ids[index] = token
        req.final_pending = False
        reason = self._finish_reason(req, token)
        if req.status is ReqStatus.FINISHED:  # dropped by the pool meanwhile: already ended
            if reason == "stop":
                req.finish_reason = reason
            return None
        if reason is not None:
            (self.running if req.status is ReqStatus.RUNNING else self.waiting).remove(req)
            self._release(req)
            req.status, req.finish_reason = ReqStatus.FINISHED, reason
        return reason

    def _append_tokens(self, chunk: Chunk, tokens: list[int]) -> FinishReason | None:
        """Append tokens until a stop rule fires (the stopping token is kept, later ones dropped)."""
        req, reason = chunk.req, None
        if len(tokens) > 1:
            reason = self._append_many(chunk, tokens)
        else:
            for token in tokens:
                req.token_ids.append(token)
                chunk.committed += 1
                reason = self._finish_reason(req, token)
        # NOTE: the verify computed KV for the anchor and the drafts after it; of the c committed
        # tokens the first c - 1 are such drafts, the last one is the new pending token
        req.num_computed = chunk.end + chunk.committed - 1
        return reason

    def trim(self, chunks: list[Chunk]) -> None:
        """What commit(trim=False) left: the running requests' pages past what they computed."""
        for chunk in chunks:
            if chunk.lookahead and chunk.req.status is ReqStatus.RUNNING:
                self._trim_pages(chunk.req)

    # ---- DSpark's second chain -----------------------------------------------------------
    def reserve_second_chain(self, chunk: Chunk, drafts: int) -> bool:
        """Pages for a second chain of `drafts` drafts after the chunk's anchor (its anchor row
        again, then its drafts: 1 + drafts slots; page size 1 only). False, nothing taken, when
        the free pages (radix pages are not evicted for it) cannot hold them."""
        if self.limits.page_size != 1:
            raise RuntimeError("a second chain needs page size 1")
        pages = self.allocator.alloc(1 + drafts) if drafts > 0 else None
        if pages is None:
            return False
        chunk.second_pages = pages
        return True

    def settle_second_chain(self, chunk: Chunk, accepted: int | None) -> None:
        """After the accept: when the second chain won with `accepted` drafts (None: it lost),
        the request's pages of the anchor and those drafts become the chain's (whose K/V and
        draft context they hold), and the pages they replace join the loser's; then every
        losing page is freed. Call it once for every chunk given second pages, even when the
        step failed (accepted=None)."""
        pages = chunk.second_pages
        if not pages:
            return
        if accepted is not None:
            own = chunk.req.pages
            for i in range(accepted + 1):
                pos = chunk.start + i
                own[pos], pages[i] = pages[i], own[pos]
        chunk.second_pages, chunk.second_tokens = [], []
        self.allocator.free(pages)

    def _trim_pages(self, req: Req) -> None:
        """Roll back: free whole pages that only held rejected drafts' KV."""
        keep = self._pages_for(req.num_computed)
        if len(req.pages) > keep:
            self.allocator.free(req.pages[keep:])
            del req.pages[keep:]

    def _append_many(self, chunk: Chunk, tokens: list[int]) -> FinishReason | None:
        """_finish_reason's rules over several tokens at once (a speculative step's or a burst's):
        where a stop token or a length limit first fires, found without a check per token, then
        one extend. NOTE: a burst commits hundreds of tokens for 32 requests, and the host does it
        while the device waits for the next burst."""
        req, params, n = chunk.req, chunk.req.sampling, len(tokens)
        stops = set(params.stop_token_ids)
        if not params.ignore_eos:
            stops.update(self.limits.eos_token_ids)
        at_stop = n + 1  # tokens appended when a stop token fires (it is kept)
        if stops and not stops.isdisjoint(tokens):
            at_stop = next(i for i, t in enumerate(tokens) if t in stops) + 1
        # the length rules fire once the output reaches max_new_tokens or the sequence the context
        at_length = max(1, min(params.max_new_tokens - req.num_output_tokens,
                               self.limits.context_length - len(req.token_ids)))
        count, reason = n, None
        if at_stop <= n and at_stop <= at_length:  # NOTE: a token that is both stops as "stop"
            count, reason = at_stop, "stop"
        elif at_length <= n:
            count, reason = at_length, "length"
        req.token_ids.extend(tokens[:count])
        chunk.committed += count
        return reason

    def _finish_reason(self, req: Req, token: int) -> FinishReason | None:
        params = req.sampling
        if not params.ignore_eos and token in self.limits.eos_token_ids:
            return "stop"
        if token in params.stop_token_ids:
            return "stop"
        if req.num_output_tokens >= params.max_new_tokens:
            return "length"
        if len(req.token_ids) >= self.limits.context_length:
            return "length"
        return None

    # ---- pages --------------------------------------------------------------------------
    def _pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.limits.page_size)

    def _reserve(self, req: Req, end: int) -> bool:
        """Make req.pages cover `end` tokens, evicting radix pages if needed."""
        need = self._pages_for(end) - len(req.pages)
        if need <= 0:
            return True
        if self.allocator.num_free < need and self.radix is not None:
            self.radix.evict(need - self.allocator.num_free)
        pages = self.allocator.alloc(need)
        if pages is None:
            return False
        req.pages.extend(pages)
        return True

    def _borrow_prefix(self, req: Req) -> None:
        """Start a (re)admitted request on the longest cached prefix of its tokens."""
        if self.radix is None or req.pages:
            return
        # NOTE: keep at least the last token uncached: its forward pass yields the next logits
        match = self.radix.match_prefix(req.token_ids[:-1])
        self.radix.lock(match.node)
        req.prefix_node = match.node
        req.pages = array("i", match.pages)
        req.num_borrowed_pages = match.num_pages
        req.num_computed = match.num_pages * self.limits.page_size
        if req.num_preemptions == 0:
            req.cached_tokens = min(req.num_computed, req.num_prompt_tokens)

    def _release(self, req: Req) -> None:
        """Give back a request's pages: full computed pages to the radix cache, the rest freed."""
        full = req.num_computed // self.limits.page_size
        if self.radix is None:
            self.allocator.free(req.pages)
        else:
            tokens = req.token_ids[: full * self.limits.page_size]
            already_cached = self.radix.insert(tokens, req.pages[:full]) if full else 0
            # pages the tree already held under the same tokens are duplicates of ours
            self.allocator.free(req.pages[req.num_borrowed_pages : already_cached])
            self.allocator.free(req.pages[full:])
            if req.prefix_node is not None:
                self.radix.unlock(req.prefix_node)
        req.pages, req.prefix_node = array("i"), None
        req.num_borrowed_pages = req.num_computed = 0

    # ---- stats --------------------------------------------------------------------------
    def kv_used_tokens(self) -> int:
        """Pool slots held by requests or by the cache (cached pages count as used)."""
        return self.allocator.num_used * self.limits.page_size
