"""Rank 0's half of a DSpark step: draft and plan before the target forward, accept after it.

    propose(chunks)  -> every rank runs the drafter's block forward ("draft" broadcast); rank 0
                        samples the block (Markov loop), plans windows and fills each chunk's
                        draft_tokens with the drafts the target verifies
    (the engine runs ONE ragged target forward: prefill chunks + [anchor, drafts] per request)
    accept(...)      -> per request the committed tokens (accepted drafts + correction/bonus),
                        their log-probabilities and the accept length

Three separate units do the work: the drafter (drafter.py), the planner (planner.py) and the
accept rule (accept.py via kernels.py); this module only wires them to the engine's chunks.
Randomness is per request (its uniform stream, sampler.UniformStream): 2 * gamma + 1 uniforms per step, so a seeded
request gives the same tokens in cap-accept and compact mode and whatever else is batched.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from sglaunch.config import EngineConfig, env_switch
from sglaunch.engine.interface import SamplingParams
from sglaunch.engine.sampler import draw_uniforms, filtered_probs, is_greedy
from sglaunch.engine.scheduler import Chunk
from sglaunch.engine.step import DraftStepInput, draft_marker, second_marker, second_row
from sglaunch.speculative import kernels
from sglaunch.speculative.accept import AcceptResult, accept_two_chains, committed_grid
from sglaunch.speculative.drafter import BlockOutput, DraftBlock, DSparkDrafter
from sglaunch.speculative.burst import SECOND_CHAIN_MAX_BATCH  # NOTE: burst.py imports torch lazily
from sglaunch.speculative.planner import DEFAULT_LAG_STEPS, DSparkPlanner, align_to_tier, measured_survivals
from sglaunch.speculative.stats import SpecStats
from sglaunch.engine.transfer import pack_flat, pack_for_host, split_flat, to_device

logger = logging.getLogger(__name__)

LAG_ENV = "SGLANG_DSPARK_CONFIDENCE_RELAY_LAG_STEPS"
RECORD_ENV = "SGLAUNCH_DSPARK_RECORD_PATH"  # JSONL of drafted blocks for `sglaunch fit-sts`
STEP_ASIDE_ENV = "SGLAUNCH_DSPARK_STEP_ASIDE"  # 0: draft at every step, even where it does not pay
SECOND_CHAIN_ENV = "SGLAUNCH_DSPARK_SECOND_CHAIN"  # N > 0: greedy steps also verify a runner-up chain of N drafts
SAMPLED_CHAIN_ENV = "SGLAUNCH_DSPARK_SAMPLED_CHAIN"  # N > 0: steps with sampled rows verify a second chain too
# 1: the planner prices the greedy class's second chain too (its rows and measured wins; the sampled class's
# always), off by default: the greedy chain's default was measured without it (planner.chain_terms)
PRICE_GREEDY_CHAIN_ENV = "SGLAUNCH_DSPARK_PRICE_GREEDY_CHAIN"
LOG_INTERVAL_S = 10.0


# SGLAUNCH_DSPARK_SECOND_CHAIN unset, on CUDA with page size 1 (H100, session 31, benchmarks/gpu31/run1:
# DSpark compact with a chain of 3 against one chain, T = 0, median of 3 rounds: 1.044 / 1.012 / 1.016 /
# 1.001 / 1.014 / 1.041 at c = 1 / 2 / 4 / 8 / 32 / 64); elsewhere (the CPU path: not measured) off
SECOND_CHAIN_DEFAULT = 3


def second_chain_length(gamma: int, page_size: int, device_type: str = "cpu", sampled: bool = False) -> int:
    """SGLAUNCH_DSPARK_SECOND_CHAIN (all-greedy steps) or, with `sampled`, SGLAUNCH_DSPARK_SAMPLED_CHAIN
    (steps with a sampled row), read once at start-up: the drafts of the second chain a drafting
    step of up to SECOND_CHAIN_MAX_BATCH requests also verifies (0: none). Unset: for greedy steps
    3 on CUDA with page size 1, else 0; for sampled steps 0 (H100, session 31: at T = 0.7 a chain of
    3 served 0.80x of one chain at c=1, the sampled step being eager). At most gamma; needs page
    size 1 (the chain's window shares the request's pages before the anchor and writes its own)."""
    from sglaunch.config import env_int

    name = SAMPLED_CHAIN_ENV if sampled else SECOND_CHAIN_ENV
    default = SECOND_CHAIN_DEFAULT if device_type == "cuda" and page_size == 1 else 0
    n = env_int(SAMPLED_CHAIN_ENV, 0, 0) if sampled else env_int(SECOND_CHAIN_ENV, default, 0)
    if n and page_size != 1:
        logger.warning("%s=%d ignored: a second chain needs --page-size 1 (this engine has %d)", name, n, page_size)
        return 0
    return min(n, gamma)


def host_mode_lengths(mode: str, window: int, gamma: int) -> tuple[int, int]:
    """accept.mode_lengths for one request on the host: (verify, accept) drafts of a window in
    [0, gamma]."""
    if mode == "static":
        return gamma, gamma
    return (gamma, window) if mode == "cap-accept" else (window, window)


@dataclass
class Proposal:
    """One step's drafts for the speculating chunks (in chunk order)."""

    chunks: list[Chunk]
    block: DraftBlock
    # the device accept's inputs; None for an all-greedy step drafted in a graph (host accept)
    greedy: torch.Tensor | None  # [R] bool
    accept_uniforms: torch.Tensor | None  # [R, G]
    sample_uniforms: torch.Tensor | None  # [R]
    verify_lens: list[int]  # [R] drafts the target computes (rows 1 + v)
    draft_seconds: float
    planned_accepts: list[int]  # [R] drafts eligible for acceptance (<= verify_lens)
    # drafts left on the device (every window full, so the host needed none of them to lay out
    # the verify step): chunk.draft_tokens hold markers until accept_greedy reads the block back
    # with the forward's choices; survival [R, G] (None: no confidence head) for the lagged budget
    device_drafts: bool = False
    survival: torch.Tensor | None = None
    # the second chain: the drafter's second chains [R, S] on the device and per request the drafts
    # its window verifies (0: no second window; then the chunk has no pages); at T > 0 also the
    # distributions they were drawn from [R, S, V] and their acceptance uniforms [R, S]
    second: torch.Tensor | None = None
    second_lens: list[int] | None = None
    second_probs: torch.Tensor | None = None
    second_uniforms: torch.Tensor | None = None
    second_host: list[list[float]] | None = None  # at T > 0: the second chains' tokens, read back with the plan
    sampled: bool = False  # a drafting row samples at T > 0 (the planner's sampled class)


@dataclass
class Accepted:
    tokens: list[int]  # accepted drafts + correction/bonus token
    logprobs: list[float]
    accept_length: int  # len(tokens): accepted drafts + 1
    second_won: bool = False  # the tokens are the second chain's (its pages hold their K/V)


class DSparkDecoder:
    """Host syncs per drafting step: ONE device-to-host copy after planning (the windows, drafts,
    survivals for the lagged budget; the mode's verify / accept lengths and the caps are applied
    on the host), none when every window is known to be full before drafting (static mode, or a
    budget covering every draft, with an all-greedy block from a drafter graph: the drafts stay on
    the device, the verify forward fills them in, and they are read back after it with the
    forward's choices), and ONE after accepting (accept lengths, committed tokens, their
    log-probabilities; for an all-greedy step the forward's greedy choices, read by
    accept_greedy). Host-built inputs go down in one pinned non-blocking copy per phase
    (transfer.to_device), none at all before an all-greedy step's drafts whose block a drafter
    graph sampled; the STS temperatures live on the device. A stepped-aside step (plan() returned
    None) does none of this: it is a plain decode step."""

    def __init__(self, config: EngineConfig, drafter: DSparkDrafter, page_size: int, device: torch.device):
        from sglaunch.speculative.sps import load_sps_table
        from sglaunch.speculative.sts import load_sts

        spec = config.speculative
        self.drafter, self.page_size, self.device = drafter, page_size, device
        self.gamma = drafter.config.block_size
        self.mode = spec.ragged_verify_mode
        self.align_to_tier = spec.align_verify_tokens_to_graph_tier
        sps = load_sps_table(spec.sps_table_path) if spec.sps_table_path else None
        temps = load_sts(spec.confidence_sts_path, self.gamma) if spec.confidence_sts_path else None
        self.planner = DSparkPlanner(self.gamma, self.mode, sps, temps, int(os.environ.get(LAG_ENV, DEFAULT_LAG_STEPS)),
                                     has_confidence_head=drafter.confidence_head is not None,
                                     step_aside=os.environ.get(STEP_ASIDE_ENV, "1").strip() != "0",
                                     start_prior=measured_survivals(spec.draft_model_path, self.gamma),
                                     price_greedy_chains=env_switch(PRICE_GREEDY_CHAIN_ENV, False))
        self.stats = SpecStats(self.gamma)
        self.second_chain = second_chain_length(self.gamma, page_size, device.type)
        self.sampled_chain = second_chain_length(self.gamma, page_size, device.type, sampled=True)
        self.record_path = os.environ.get(RECORD_ENV) or None
        self._last_log, self._logged_steps = time.monotonic(), 0
        self.log_suffix: Callable[[], str] | None = None  # more for the periodic log line (the engine's bursts)
        logger.info("DSpark: block size %d, ragged verify mode %s, SPS table %s, STS %s, starting prior accept %s",
                    self.gamma, self.mode,
                    spec.sps_table_path or ("none yet (profiled at start-up)" if self.mode == "compact"
                                            else "none (verify every draft)"), spec.confidence_sts_path or "none",
                    f"{1.0 + sum(self.planner.prior):.2f} (the drafter's eval.json)" if self.planner.start_prior
                    else "none (learnt from the first steps)")

    # ---- before the target forward ------------------------------------------------------
    def plan(self, rids: Sequence[str], extra_tokens: int, committed_extra: int = 0,
             sampled: bool = False) -> int | None:
        """Before anything is drafted or reserved: the step's draft budget K, or None when
        drafting does not pay at this load (the step decodes plainly; counted). committed_extra:
        tokens the step's other rows commit either way; sampled: some row samples at T > 0."""
        # NOTE: the chain propose() would verify at this size and class (the engine passes it the pages)
        budget = self.planner.plan_drafts(rids, extra_tokens, committed_extra, sampled,
                                          self._chain_length(sampled, len(rids)) > 0)
        if budget is None:
            self.step_aside(len(rids))
        return budget

    def step_aside(self, requests: int) -> None:
        """A step whose `requests` decoding requests decode plainly (plan() found drafting would not
        pay, or the engine found no draft would fit the step's graph): counted, and the planner told."""
        self.stats.record_step_aside(requests)
        self.planner.skip_step()
        self._maybe_log()

    def propose(self, chunks: list[Chunk], generators: dict, extra_tokens: int,
                run_draft: Callable[[DraftStepInput], BlockOutput], verify_tiers: Sequence[int] = (),
                budget: int | None = None, second_pages: Callable[[Chunk, int], bool] | None = None) -> Proposal:
        """Draft for every speculating chunk and set chunk.draft_tokens to what the target verifies.
        budget: plan()'s K (None: the planner's budget, no stepping aside).
        verify_tiers: the captured verify-graph tiers this step could replay (empty: eager).
        second_pages: where the step may verify second chains, what reserves a chunk's pages for one
        of n drafts (Scheduler.reserve_second_chain); steps of more than SECOND_CHAIN_MAX_BATCH
        speculating requests verify none. An all-greedy step drafts the runner-up chain on every
        rank (DraftStepInput.second_chain) and is accepted on the host; a step with sampled rows
        draws its second chains here (DSparkDrafter.sampled_second_chain) for the device accept."""
        start = time.perf_counter()
        reqs = [c.req for c in chunks]
        if budget is None:
            budget = self.planner.budget([r.rid for r in reqs], extra_tokens)
        greedy = [is_greedy(r.sampling) for r in reqs]
        # NOTE: as bursts, up to SECOND_CHAIN_MAX_BATCH requests: beyond, the extra rows cost more than they
        # give (H100, session 30), and the planner's step cost does not count them
        chains = self._chain_length(not all(greedy), len(chunks)) if second_pages is not None else 0
        # a step with a sampled row draws its uniforms now: the block's draws (and a sampled second
        # chain's) go with the draft step, for a drafter graph that samples (DraftStepInput.temperatures)
        host_u = None if all(greedy) else self._uniforms(reqs, greedy, generators, chains)
        temps = None if all(greedy) else [0.0 if g else r.sampling.temperature for g, r in zip(greedy, reqs)]
        G = self.gamma
        draws = None if host_u is None else (
            torch.cat([host_u[:, :G], self._chain_draws(host_u, chains)], 1) if chains else host_u[:, :G])
        step = DraftStepInput([r.token_ids[-1] for r in reqs], [c.start for c in chunks],
                              [r.pages[: -(-c.start // self.page_size)] for r, c in zip(reqs, chunks)],
                              chains if all(greedy) else 0, temps, draws)
        out = run_draft(step)
        proposal = self._propose(chunks, out, greedy, temps, host_u, budget, extra_tokens, verify_tiers, start,
                                 0 if all(greedy) else chains)
        proposal.sampled = not all(greedy)
        if chains:
            if all(greedy):  # the runner-up chains the draft runner drafted on every rank
                proposal.second = out.second
            self._second_windows(proposal, second_pages, chains)
        return proposal

    def chain_rows(self, sampled: bool, requests: int) -> int:
        """The most rows the second chains of a drafting step of this class and size add (each request's
        anchor again and its chain's drafts; 0 without chains)."""
        n = self._chain_length(sampled, requests)
        return requests * (1 + n) if n else 0

    def _chain_length(self, sampled: bool, requests: int) -> int:
        """The second chain's drafts a drafting step of this class and size verifies (0: none)."""
        if requests > SECOND_CHAIN_MAX_BATCH:
            return 0
        return self.sampled_chain if sampled else self.second_chain

    def _second_windows(self, proposal: Proposal, second_pages, S: int) -> None:
        """Each request whose first window verifies its first draft also verifies the second
        chain's first min(S, lookahead) drafts, where pages allow: markers the forward fills in
        (all greedy: the runner-up chain drafted on every rank), else the tokens read back with the
        plan (proposal.second_host)."""
        lens, host = [], proposal.second_host
        for r, (chunk, v) in enumerate(zip(proposal.chunks, proposal.verify_lens)):
            n = min(S, chunk.lookahead) if v > 0 else 0
            if n and second_pages(chunk, n):
                chunk.second_tokens = ([second_marker(r * S + j) for j in range(n)] if host is None
                                       else [int(t) for t in host[r][:n]])
            else:
                n = 0
            lens.append(n)
        proposal.second_lens = lens

    def _propose(self, chunks, out: BlockOutput, greedy: list[bool], temps: list[float] | None,
                 host_u: torch.Tensor | None, budget: int, extra_tokens: int, verify_tiers: Sequence[int],
                 start: float, chains: int = 0) -> Proposal:
        """temps: each row's temperature (0.0 for greedy rows) and host_u: _uniforms(...), of a step
        with a sampled row (both None: all greedy); chains: the drafts
        of the sampled second chains to draw (a step with a sampled row). out.sampled: the block a
        sampled drafter graph drew with host_u's first gamma columns (else it is drawn here)."""
        reqs = [c.req for c in chunks]
        if all(greedy) and out.greedy is not None:  # sampled inside the drafter's graph: no copy down
            # NOTE: no uniforms, and caps go down only where tier alignment ranks by them; the
            # accept is the host one (accept_greedy), so the Proposal carries no device inputs
            full = self._full_windows(chunks, budget, extra_tokens, verify_tiers)
            if full is not None:
                return self._device_drafts(chunks, out.greedy, full, time.perf_counter() - start)
            align = self._aligns(verify_tiers) and out.greedy.conf_logits is not None
            caps = to_device([torch.tensor([c.lookahead for c in chunks], dtype=torch.int32)], self.device)[0] \
                if align else None
            verify_lens, accept_lens, _ = self._plan(chunks, out.greedy, budget, extra_tokens, caps, verify_tiers)
            return Proposal(chunks, out.greedy, None, None, None, verify_lens, time.perf_counter() - start,
                            accept_lens)
        temps, anchors, caps, greedy_mask, *moved = to_device([
            torch.tensor(temps if temps is not None else [0.0] * len(reqs), dtype=torch.float32),
            torch.tensor([r.token_ids[-1] for r in reqs], dtype=torch.int64),
            torch.tensor([c.lookahead for c in chunks], dtype=torch.int32),  # NOTE: the windows' dtype
            torch.tensor(greedy, dtype=torch.bool)] + ([host_u] if host_u is not None else []), self.device)
        G = self.gamma
        u = moved[0] if moved else torch.zeros(len(reqs), 2 * G + 1, device=self.device)
        draw, accept_u, sample_u = u[:, :G], u[:, G: 2 * G], u[:, 2 * G]
        block = out.sampled if out.sampled is not None else self.drafter.sample_block(
            out, anchors, temps, uniforms=draw, return_probs=not all(greedy), all_greedy=all(greedy),
            any_greedy=any(greedy))
        second = second_probs = None
        if chains and out.sampled_second is not None and out.sampled_second[0].shape[1] == chains:
            second, second_probs = out.sampled_second  # drawn inside the sampled graph, from the same uniforms
        elif chains:
            second, second_probs = self.drafter.sampled_second_chain(out, anchors, block, temps,
                                                                     self._chain_draws(u, chains), chains)
        verify_lens, accept_lens, second_host = self._plan(chunks, block, budget, extra_tokens, caps, verify_tiers,
                                                           second)
        return Proposal(chunks, block, greedy_mask, accept_u, sample_u, verify_lens, time.perf_counter() - start,
                        accept_lens, second=second, second_probs=second_probs, second_host=second_host,
                        second_uniforms=u[:, 2 * G + 1 + chains:] if chains else None)

    def _full_windows(self, chunks: list[Chunk], budget: int, extra_tokens: int,
                      verify_tiers: Sequence[int]) -> list[int] | None:
        """The verify lengths when every request's window is known to be full (its whole block up
        to its cap) before any draft is read: static mode, or a budget that covers every draft
        the windows could take; None when the windows depend on the drafts' confidences."""
        G = self.gamma
        lengths = [min(G, c.lookahead) for c in chunks]
        if self.mode != "static":
            if self._aligns(verify_tiers):  # ranked with the caps: the drafts past a cap come last
                budget = align_to_tier(budget, extra_tokens + len(chunks), sum(lengths), verify_tiers)
                if budget < sum(lengths):
                    return None
            elif budget < len(chunks) * G:  # ranked without caps: any slot may take the budget
                return None
        return lengths

    def _device_drafts(self, chunks: list[Chunk], block: DraftBlock, lengths: list[int],
                       draft_seconds: float) -> Proposal:
        """Full windows: the verify step's drafts are markers the forward fills in from the
        drafter's block on the device (ModelRunner._fill_drafts); nothing is read back before the
        target forward. The survivals are computed now (device) and read back with the drafts."""
        G = self.gamma
        for r, (chunk, v) in enumerate(zip(chunks, lengths)):
            chunk.draft_tokens = [draft_marker(r * G + j) for j in range(v)]
        survival = None
        if block.conf_logits is not None:
            survival = kernels.survival(block.conf_logits, self.planner.device_temperatures(block.conf_logits.device))
        return Proposal(chunks, block, None, None, None, lengths, draft_seconds, list(lengths),
                        device_drafts=True, survival=survival)

    def _read_device_drafts(self, proposal: Proposal) -> None:
        """After the verify forward: the block's drafts (and survivals) in one read-back; the
        chunks get their real draft tokens, the planner this step's survivals."""
        parts = [proposal.block.tokens] + ([proposal.survival] if proposal.survival is not None else [])
        host = pack_for_host(parts).tolist()  # NOTE: the drafts' read-back, after the forward's: no wait
        G = self.gamma
        for chunk, v, row in zip(proposal.chunks, proposal.verify_lens, host):
            chunk.draft_tokens = [int(t) for t in row[:v]]
        if proposal.survival is not None:
            self.planner.observe([c.req.rid for c in proposal.chunks], [row[G:] for row in host])

    def _aligns(self, verify_tiers: Sequence[int]) -> bool:
        return self.align_to_tier and self.mode == "compact" and len(verify_tiers) > 0

    def _plan(self, chunks: list[Chunk], block: DraftBlock, budget: int, extra_tokens: int,
              caps: torch.Tensor | None, verify_tiers: Sequence[int],
              second: torch.Tensor | None = None) -> tuple[list[int], list[int], list[list[float]] | None]:
        """Windows on the device (top-K of the current survivals under the lagged budget), then
        the step's one read-back [windows, drafts, survivals, second chains]; the mode's verify /
        accept lengths and each request's cap (its lookahead) are applied on the host. Sets
        chunk.draft_tokens, records the survivals for the lagged budget; -> (verify_lens,
        accept_lens, the second chains' rows on the host (None without `second`))."""
        G, caps_host = self.gamma, [c.lookahead for c in chunks]
        if block.conf_logits is None:  # static mode without a confidence head: the whole block
            survival, columns = None, [block.tokens]
        else:
            windows, survival = self._windows(chunks, block, budget, extra_tokens, caps, verify_tiers)
            columns = [windows, block.tokens, survival]
        if second is not None:
            columns.append(second)
        planned = pack_for_host(columns).tolist()  # NOTE: the step's one device-to-host copy after planning
        offset = 0 if survival is None else 1
        verify_lens, accept_lens = [], []
        for chunk, cap, row in zip(chunks, caps_host, planned):
            window = G if survival is None else max(0, min(int(row[0]), G))
            v, a = host_mode_lengths(self.mode, window, G)
            v, a = min(v, cap), min(a, cap)
            verify_lens.append(v)
            accept_lens.append(a)
            chunk.draft_tokens = [int(t) for t in row[offset: offset + v]]
        if survival is not None:
            self.planner.observe([c.req.rid for c in chunks], [row[1 + G: 1 + 2 * G] for row in planned])
        second_host = [row[-second.shape[1]:] for row in planned] if second is not None else None
        return verify_lens, accept_lens, second_host

    def _uniforms(self, reqs, greedy: list[bool], generators: dict, chains: int = 0) -> torch.Tensor | None:
        """Per request 2G + 1 uniforms from its own (CPU) generator (the block's draws, its tests,
        the correction / bonus draw), then 2S for a second chain of S drafts (its draws, its tests),
        zeros for greedy rows: a host tensor [R, 2G + 1 + 2S] that goes down with the step's other
        sampling inputs; None when every row is greedy (NOTE: then one zeros allocation on the
        device, no copy)."""
        if all(greedy):
            return None
        width = 2 * self.gamma + 1 + 2 * chains
        host = torch.zeros(len(reqs), width)
        for row, (r, g) in enumerate(zip(reqs, greedy)):
            if not g:
                host[row] = draw_uniforms(generators.get(r.rid), width)
        return host

    def _chain_draws(self, u: torch.Tensor, chains: int) -> torch.Tensor:
        """The draw uniforms [R, S] of a sampled second chain of S drafts, in _uniforms' layout (after
        the block's 2G + 1; its tests follow them)."""
        start = 2 * self.gamma + 1
        return u[:, start: start + chains]

    def _windows(self, chunks: list[Chunk], block: DraftBlock, budget: int, extra_tokens: int, caps: torch.Tensor,
                 verify_tiers: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Planned drafts to verify per request [R] and the survivals [R, G] (a block with
        confidence logits): the lagged budget (planned on the host before drafting), top-K on the device."""
        align = self._aligns(verify_tiers)
        if align:  # the rows up to the graph's tier run anyway: make them the next-best drafts
            reachable = sum(min(c.lookahead, self.gamma) for c in chunks)
            budget = align_to_tier(budget, extra_tokens + len(chunks), reachable, verify_tiers)
        survival, windows = self.planner.allocate(block.conf_logits, budget, caps=caps if align else None)
        return windows, survival

    # ---- after the target forward -------------------------------------------------------
    def accept(self, proposal: Proposal, logits: torch.Tensor, row_starts: list[int],
               verify_seconds: float) -> list[Accepted]:
        """logits [num_samples, V]: request r's anchor row at row_starts[r], then its drafts' rows."""
        two = proposal.second_lens is not None and any(proposal.second_lens)
        if two and proposal.second_probs is None:
            raise RuntimeError("an all-greedy step with second chains is accepted on the host (accept_greedy)")
        if proposal.device_drafts:  # NOTE: the device accept reads the block itself; the host needs the drafts too
            self._read_device_drafts(proposal)
        params = [c.req.sampling for c in proposal.chunks]
        sampled_rows, row_params = self._sampled_rows(params, row_starts, proposal.verify_lens)
        if two:  # the second windows' rows (each right after its first window)
            for p, start, chunk, n in zip(params, row_starts, proposal.chunks, proposal.second_lens):
                if n and not is_greedy(p):
                    sampled_rows.extend(range(second_row(start, chunk), second_row(start, chunk) + n + 1))
                    row_params.extend([p] * (n + 1))
        # NOTE: the accept lengths (planned on the host) go down with the row layout, one copy
        starts, sampled_index, rows, slots, accept_lens = self._accept_layout(
            row_starts, sampled_rows, proposal.planned_accepts, logits.device)
        target = self._target_probs(logits, sampled_index, row_params)
        block = proposal.block
        if proposal.greedy is None:  # drafted for the host accept (all greedy): constant inputs
            R = len(proposal.chunks)
            greedy = torch.ones(R, dtype=torch.bool, device=logits.device)
            zeros = torch.zeros(R, self.gamma + 1, device=logits.device)
            accept_u, sample_u = zeros[:, :self.gamma], zeros[:, self.gamma]
        else:
            greedy, accept_u, sample_u = proposal.greedy, proposal.accept_uniforms, proposal.sample_uniforms
        result = kernels.accept(block.tokens, block.probs, target, starts, accept_lens, greedy, accept_u, sample_u)
        if two:
            return self._accept_two_chains(proposal, logits, target, row_starts, starts, accept_lens, rows, slots,
                                           result, verify_seconds)
        committed = committed_grid(block.tokens, result)  # [R, G + 1]
        logprobs = self._logprobs(logits, rows, committed.reshape(-1)[slots])  # [C]
        # NOTE: the step's one device-to-host copy after accepting
        host = pack_flat([result.num_accepted, committed, logprobs]).tolist()
        return self._finish(proposal, self._unpack(host, proposal.planned_accepts), verify_seconds)

    def _accept_two_chains(self, proposal: Proposal, logits, target, row_starts: list[int], starts, accept_lens,
                           rows1_t, slots1_t, first, verify_seconds: float) -> list[Accepted]:
        """accept() for a step with second chains at T > 0 (accept.accept_two_chains): both chains'
        committed tokens and log-probabilities go up in the one read-back, the host keeps the winner's.
        rows1_t / slots1_t: the first chain's candidate rows and grid slots (_accept_layout)."""
        S, G, R = proposal.second.shape[1], self.gamma, len(proposal.chunks)
        lens, eligible = proposal.second_lens, proposal.planned_accepts
        second_starts = [second_row(s, c) if n else s for s, c, n in zip(row_starts, proposal.chunks, lens)]
        rows2 = [s + j for s, n in zip(second_starts, lens) for j in range(n + 1) if n]
        slots2 = [r * (S + 1) + j for r, n in enumerate(lens) for j in range(n + 1) if n]
        parts = to_device([torch.tensor(x, dtype=torch.int64) for x in (second_starts, lens, rows2, slots2)],
                          logits.device)
        second_starts_t, lens_t, rows2_t, slots2_t = parts
        greedy = proposal.greedy
        two = accept_two_chains(first, proposal.block.probs, target, starts, accept_lens, greedy, proposal.second,
                                proposal.second_probs, second_starts_t, lens_t, proposal.second_uniforms,
                                proposal.sample_uniforms)
        result = AcceptResult(two.num_accepted, two.next_token)
        committed1 = committed_grid(proposal.block.tokens, result)  # [R, G + 1]: the first chain's rows
        committed2 = committed_grid(proposal.second, result)  # [R, S + 1]: the second's
        logprobs1 = self._logprobs(logits, rows1_t, committed1.reshape(-1)[slots1_t])
        logprobs2 = self._logprobs(logits, rows2_t, committed2.reshape(-1)[slots2_t])
        # NOTE: the step's one device-to-host copy after accepting
        host = pack_flat([two.num_accepted, two.second_won, committed1, committed2, logprobs1, logprobs2]).tolist()
        n, won, tokens1, tokens2, values1, values2 = split_flat(
            host, [R, R, R * (G + 1), R * (S + 1), rows1_t.numel(), len(rows2)])
        out, offset1, offset2 = [], 0, 0
        for r, (a, m) in enumerate(zip(eligible, lens)):
            k = int(n[r])
            if won[r]:
                out.append(Accepted([int(t) for t in tokens2[r * (S + 1): r * (S + 1) + k + 1]],
                                    values2[offset2: offset2 + k + 1], k + 1, True))
            else:
                out.append(Accepted([int(t) for t in tokens1[r * (G + 1): r * (G + 1) + k + 1]],
                                    values1[offset1: offset1 + k + 1], k + 1))
            offset1 += a + 1
            offset2 += m + 1 if m else 0
        return self._finish(proposal, out, verify_seconds)

    def accept_greedy(self, proposal: Proposal, row_starts: list[int], greedy_host: Callable,
                      verify_seconds: float) -> list[Accepted]:
        """accept() for an all-greedy step whose forward gave every row's greedy choice (token,
        log-probability): the same rule on the host, with no device work. Request r accepts its
        drafts while each equals the target's choice at the row before it (at most its planned
        accept length L), then commits the target's choice at the row after the last accepted."""
        eligible = proposal.planned_accepts
        second = proposal.second_lens or [0] * len(eligible)
        logit_rows = [start + j for start, a in zip(row_starts, eligible) for j in range(a + 1)]
        logit_rows += [second_row(start, c) + j for start, c, n in zip(row_starts, proposal.chunks, second)
                       if n for j in range(n + 1)]  # then the second windows' rows (each right after its first window)
        second_drafts = None
        if any(second):  # the runner-up chains in the same copy
            tokens, values, flat = greedy_host(logit_rows, proposal.second)  # NOTE: the step's one device-to-host copy
            S = proposal.second.shape[1]
            second_drafts = [[int(t) for t in flat[r * S: (r + 1) * S]] for r in range(len(second))]
        else:
            tokens, values = greedy_host(logit_rows)  # NOTE: the step's one device-to-host copy
        if proposal.device_drafts:
            self._read_device_drafts(proposal)
        out, offset, second_offset = [], 0, sum(a + 1 for a in eligible)
        for r, (chunk, a) in enumerate(zip(proposal.chunks, eligible)):
            drafts, n = chunk.draft_tokens, 0
            while n < a and drafts[n] == tokens[offset + n]:
                n += 1
            best = Accepted(list(drafts[:n]) + [tokens[offset + n]], values[offset: offset + n + 1], n + 1)
            if second[r]:  # the runner-up chain, judged by its own rows: kept when it commits more
                drafts, m, o = second_drafts[r], 0, second_offset
                while m < second[r] and drafts[m] == tokens[o + m]:
                    m += 1
                if m > n:
                    best = Accepted(list(drafts[:m]) + [tokens[o + m]], values[o: o + m + 1], m + 1, True)
                second_offset += second[r] + 1
            out.append(best)
            offset += a + 1
        return self._finish(proposal, out, verify_seconds)

    def _finish(self, proposal: Proposal, out: list[Accepted], verify_seconds: float) -> list[Accepted]:
        # NOTE: the planner and the STS record learn the first chain's outcome (what its confidences
        # predict); a second chain that won means the first chain's first draft was rejected
        accepted = [0 if a.second_won else a.accept_length - 1 for a in out]
        self.planner.observe_outcome([c.req.rid for c in proposal.chunks], proposal.planned_accepts, accepted)
        self._record(proposal, accepted)
        second = proposal.second_lens or []
        self.stats.record_step([a.accept_length for a in out],
                               sum(1 + v for v in proposal.verify_lens) + sum(1 + n for n in second if n),
                               proposal.draft_seconds, verify_seconds)
        if any(second):
            self.stats.record_second_chains(sum(1 for n in second if n), sum(1 for a in out if a.second_won))
            # NOTE: a chain wins only where its first chain's first draft was rejected (one token committed)
            self.planner.observe_chains(proposal.sampled, len(out), sum(1 + n for n in second if n),
                                        sum(a.accept_length - 1 for a, n in zip(out, second) if n and a.second_won))
        self._maybe_log()
        return out

    def _accept_layout(self, row_starts: list[int], sampled_rows: list[int], eligible: list[int], device):
        """One copy down: anchor rows [R], sampled requests' rows, the candidate rows [C] whose
        token may be committed (anchor .. anchor + accept_len, since n <= accept_len) with their
        slots in the [R, G + 1] committed grid, and the accept lengths [R] themselves."""
        width = self.gamma + 1
        rows = [start + j for start, a in zip(row_starts, eligible) for j in range(a + 1)]
        slots = [r * width + j for r, a in enumerate(eligible) for j in range(a + 1)]
        parts = (row_starts, sampled_rows, rows, slots, eligible)
        return to_device([torch.tensor(x, dtype=torch.int64) for x in parts], device)

    def _unpack(self, host: list[float], eligible: list[int]) -> list[Accepted]:
        """The accept read-back [n (R), committed grid (R x (G + 1)), log-probs (C)] -> per request."""
        width, R = self.gamma + 1, len(eligible)
        accepted, tokens, values = split_flat(host, [R, R * width, sum(a + 1 for a in eligible)])
        out, offset = [], 0
        for r, a in enumerate(eligible):
            n = int(accepted[r])
            out.append(Accepted([int(t) for t in tokens[r * width: r * width + n + 1]], values[offset: offset + n + 1],
                                n + 1))
            offset += a + 1
        return out

    @staticmethod
    def _sampled_rows(params: list[SamplingParams], row_starts: list[int], verify_lens: list[int]):
        """Host: the logits rows of sampled (non-greedy) requests and each row's parameters."""
        rows, row_params = [], []
        for p, start, v in zip(params, row_starts, verify_lens):
            if not is_greedy(p):
                rows.extend(range(start, start + v + 1))
                row_params.extend([p] * (v + 1))
        return rows, row_params

    @staticmethod
    def _target_probs(logits, index: torch.Tensor, row_params: list[SamplingParams]):
        """P rows: the request's filtered sampling distribution; greedy rows keep logits (argmax only)."""
        if not row_params:
            return logits
        target = logits.clone()
        target[index] = filtered_probs(logits[index], row_params)
        return target

    @staticmethod
    def _logprobs(logits, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """[C] log-probability of tokens[i] at logits row rows[i], under the unmodified target
        distribution (each row normalised on its own, as the plain sampler does)."""
        return torch.log_softmax(logits[rows], -1).gather(1, tokens[:, None])[:, 0]

    def _record(self, proposal: Proposal, accepted: list[int]) -> None:
        """Drafted blocks for STS fitting (`sglaunch fit-sts`), when SGLAUNCH_DSPARK_RECORD_PATH is set."""
        if self.record_path is None or proposal.block.conf_logits is None:
            return
        lines = [json.dumps({"confidence_logits": logits, "accepted": n, "verified": v})
                 for logits, n, v in zip(proposal.block.conf_logits.tolist(), accepted, proposal.planned_accepts)]
        with open(self.record_path, "a", encoding="utf-8") as file:
            file.write("\n".join(lines) + "\n")

    def release(self, rid: str) -> None:
        self.planner.release(rid)

    def forget_profile(self, rids: Sequence[str]) -> None:
        """After a step-cost profile's synthetic steps: statistics and survivals as before it."""
        for rid in rids:
            self.planner.release(rid)
        self.planner.reset_prior()
        self.stats = SpecStats(self.gamma)

    def _calibration_note(self) -> str:
        """The confidence calibration, when it moved: the prior as priced and the factor per slot."""
        f = self.planner.accepts.factors()
        if f is None:
            return ""
        return (f" (priced {1.0 + sum(self.planner.priced_prior):.2f}; confidences x "
                + " ".join(f"{x:.2f}" for x in f) + f" from {self.planner.accepts.outcomes} request-steps)")

    def _step_cost_note(self) -> str:
        """The measured/modelled step times; the sampled steps' too once they moved off the table."""
        calibration = self.planner.calibration
        if calibration is None or not self.planner.can_step_aside:
            return ""
        greedy, sampled = calibration.scale_for(False), calibration.scale_for(True)
        note = f", measured/modelled step time: draft {greedy['draft']:.2f}, plain {greedy['plain']:.2f}"
        if any(abs(v - 1.0) > 1e-3 for v in sampled.values()):
            note += f" (sampled steps: draft {sampled['draft']:.2f}, plain {sampled['plain']:.2f})"
        return note

    def _maybe_log(self, force: bool = False) -> None:
        """The periodic `spec:` line (every LOG_INTERVAL_S while steps run; force: now, when any
        step ran since the last line: the engine went idle, so a burst of load gets its line)."""
        now, steps = time.monotonic(), self.stats.steps + self.stats.step_aside_steps
        if (force or now - self._last_log >= LOG_INTERVAL_S) and steps > self._logged_steps:
            logger.info(self.stats.log_line() + self._step_cost_note()
                        + f", prior accept {1.0 + sum(self.planner.prior):.2f}"
                        + self._calibration_note()
                        + (self.log_suffix() if self.log_suffix is not None else ""))
            self._last_log, self._logged_steps = now, steps
