"""Rank 0's half of a DSpark step: draft and plan before the target forward, accept after it.

    propose(chunks)  -> every rank runs the drafter's block forward ("draft" broadcast); rank 0
                        samples the block (Markov loop), plans windows and fills each chunk's
                        draft_tokens with the drafts the target verifies
    (the engine runs ONE ragged target forward: prefill chunks + [anchor, drafts] per request)
    accept(...)      -> per request the committed tokens (accepted drafts + correction/bonus),
                        their log-probabilities and the accept length

Three separate units do the work: the drafter (drafter.py), the planner (planner.py) and the
accept rule (accept.py via kernels.py); this module only wires them to the engine's chunks.
Randomness is per request (its torch.Generator): 2 * gamma + 1 uniforms per step, so a seeded
request gives the same tokens in cap-accept and compact mode and whatever else is batched.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Callable

import torch

from sglaunch.config import EngineConfig
from sglaunch.engine.interface import SamplingParams
from sglaunch.engine.sampler import filtered_probs, is_greedy
from sglaunch.engine.scheduler import Chunk
from sglaunch.engine.step import DraftStepInput
from sglaunch.speculative import kernels
from sglaunch.speculative.accept import committed_tokens, mode_lengths
from sglaunch.speculative.drafter import BlockOutput, DraftBlock, DSparkDrafter
from sglaunch.speculative.planner import DEFAULT_LAG_STEPS, DSparkPlanner
from sglaunch.speculative.stats import SpecStats

logger = logging.getLogger(__name__)

LAG_ENV = "SGLANG_DSPARK_CONFIDENCE_RELAY_LAG_STEPS"
RECORD_ENV = "SGLAUNCH_DSPARK_RECORD_PATH"  # JSONL of drafted blocks for `sglaunch fit-sts`
LOG_INTERVAL_S = 10.0


@dataclass
class Proposal:
    """One step's drafts for the speculating chunks (in chunk order)."""

    chunks: list[Chunk]
    block: DraftBlock
    greedy: torch.Tensor  # [R] bool
    accept_uniforms: torch.Tensor  # [R, G]
    sample_uniforms: torch.Tensor  # [R]
    verify_lens: list[int]  # [R] drafts the target computes (rows 1 + v)
    accept_lens: torch.Tensor  # [R] drafts eligible for acceptance (<= verify_lens)
    draft_seconds: float


@dataclass
class Accepted:
    tokens: list[int]  # accepted drafts + correction/bonus token
    logprobs: list[float]
    accept_length: int  # len(tokens): accepted drafts + 1


class DSparkDecoder:
    def __init__(self, config: EngineConfig, drafter: DSparkDrafter, page_size: int, device: torch.device):
        from sglaunch.speculative.sps import load_sps_table
        from sglaunch.speculative.sts import load_sts

        spec = config.speculative
        self.drafter, self.page_size, self.device = drafter, page_size, device
        self.gamma = drafter.config.block_size
        self.mode = spec.ragged_verify_mode
        sps = load_sps_table(spec.sps_table_path) if spec.sps_table_path else None
        temps = load_sts(spec.confidence_sts_path, self.gamma) if spec.confidence_sts_path else None
        self.planner = DSparkPlanner(self.gamma, self.mode, sps, temps, int(os.environ.get(LAG_ENV, DEFAULT_LAG_STEPS)),
                                     has_confidence_head=drafter.confidence_head is not None)
        self.stats = SpecStats(self.gamma)
        self.record_path = os.environ.get(RECORD_ENV) or None
        self._last_log, self._logged_steps = time.monotonic(), 0
        logger.info("DSpark: block size %d, ragged verify mode %s, SPS table %s, STS %s", self.gamma, self.mode,
                    spec.sps_table_path or ("none yet (profiled at start-up)" if self.mode == "compact"
                                            else "none (verify every draft)"), spec.confidence_sts_path or "none")

    # ---- before the target forward ------------------------------------------------------
    def propose(self, chunks: list[Chunk], generators: dict, extra_tokens: int,
                run_draft: Callable[[DraftStepInput], BlockOutput]) -> Proposal:
        """Draft for every speculating chunk and set chunk.draft_tokens to what the target verifies."""
        start = time.perf_counter()
        reqs = [c.req for c in chunks]
        step = DraftStepInput([r.token_ids[-1] for r in reqs], [c.start for c in chunks],
                              [r.pages[: -(-c.start // self.page_size)] for r, c in zip(reqs, chunks)])
        out = run_draft(step)
        greedy = [is_greedy(r.sampling) for r in reqs]
        draw, accept_u, sample_u = self._uniforms(reqs, greedy, generators)
        temps = torch.tensor([0.0 if g else r.sampling.temperature for g, r in zip(greedy, reqs)], device=self.device)
        anchors = torch.tensor(step.anchor_tokens, dtype=torch.int64, device=self.device)
        block = self.drafter.sample_block(out, anchors, temps, uniforms=draw, return_probs=not all(greedy))
        verify, accept = mode_lengths(self.mode, self._windows([r.rid for r in reqs], block, extra_tokens), self.gamma)
        caps = torch.tensor([c.lookahead for c in chunks], dtype=verify.dtype, device=verify.device)
        verify, accept = torch.minimum(verify, caps), torch.minimum(accept, caps)
        verify_lens, drafts = verify.tolist(), block.tokens.tolist()
        for chunk, v, row in zip(chunks, verify_lens, drafts):
            chunk.draft_tokens = row[:v]
        return Proposal(chunks, block, torch.tensor(greedy, device=self.device), accept_u, sample_u, verify_lens,
                        accept.to(self.device), time.perf_counter() - start)

    def _uniforms(self, reqs, greedy: list[bool], generators: dict):
        """Per request 2G + 1 uniforms from its own generator (zeros for greedy rows)."""
        G = self.gamma
        rows = [torch.zeros(2 * G + 1, device=self.device) if g else
                torch.rand(2 * G + 1, generator=generators[r.rid], device=self.device) for r, g in zip(reqs, greedy)]
        u = torch.stack(rows)  # [R, 2G + 1]
        return u[:, :G], u[:, G: 2 * G], u[:, 2 * G]

    def _windows(self, rids: list[str], block: DraftBlock, extra_tokens: int) -> torch.Tensor:
        """Planned drafts to verify per request: lagged budget on the host, top-K on the device."""
        if block.conf_logits is None:  # static mode without a confidence head: the whole block
            return torch.full((len(rids),), self.gamma, dtype=torch.int32, device=self.device)
        budget = self.planner.budget(rids, extra_tokens)
        survival, windows = self.planner.allocate(block.conf_logits, budget)
        self.planner.observe(rids, survival.to("cpu", non_blocking=True))
        return windows

    # ---- after the target forward -------------------------------------------------------
    def accept(self, proposal: Proposal, logits: torch.Tensor, row_starts: list[int],
               verify_seconds: float) -> list[Accepted]:
        """logits [num_samples, V]: request r's anchor row at row_starts[r], then its drafts' rows."""
        params = [c.req.sampling for c in proposal.chunks]
        target = self._target_probs(logits, params, proposal, row_starts)
        starts = torch.tensor(row_starts, dtype=torch.int64, device=logits.device)
        block = proposal.block
        result = kernels.accept(block.tokens, block.probs, target, starts, proposal.accept_lens, proposal.greedy,
                                proposal.accept_uniforms, proposal.sample_uniforms)
        committed = committed_tokens(block.tokens, result)
        logprobs = self._logprobs(logits, row_starts, committed)
        out = [Accepted(tokens, lp, len(tokens)) for tokens, lp in zip(committed, logprobs)]
        self._record(proposal, result.num_accepted.tolist())
        self.stats.record_step([a.accept_length for a in out], sum(1 + v for v in proposal.verify_lens),
                               proposal.draft_seconds, verify_seconds)
        self._maybe_log()
        return out

    def _target_probs(self, logits, params: list[SamplingParams], proposal: Proposal, row_starts: list[int]):
        """P rows: the request's filtered sampling distribution; greedy rows keep logits (argmax only)."""
        rows, row_params = [], []
        for p, start, v in zip(params, row_starts, proposal.verify_lens):
            if not is_greedy(p):
                rows.extend(range(start, start + v + 1))
                row_params.extend([p] * (v + 1))
        if not rows:
            return logits
        target = logits.clone()
        index = torch.tensor(rows, dtype=torch.int64, device=logits.device)
        target[index] = filtered_probs(logits[index], row_params)
        return target

    @staticmethod
    def _logprobs(logits, row_starts: list[int], committed: list[list[int]]) -> list[list[float]]:
        """Log-probability of each committed token under the unmodified target distribution."""
        rows = [start + j for start, toks in zip(row_starts, committed) for j in range(len(toks))]
        flat = [t for toks in committed for t in toks]
        index = torch.tensor(rows, dtype=torch.int64, device=logits.device)
        picked = torch.log_softmax(logits[index], -1).gather(1, torch.tensor(flat, device=logits.device)[:, None])
        values, out = picked[:, 0].tolist(), []
        for toks in committed:
            out.append(values[: len(toks)])
            values = values[len(toks):]
        return out

    def _record(self, proposal: Proposal, accepted: list[int]) -> None:
        """Drafted blocks for STS fitting (`sglaunch fit-sts`), when SGLAUNCH_DSPARK_RECORD_PATH is set."""
        if self.record_path is None or proposal.block.conf_logits is None:
            return
        lines = [json.dumps({"confidence_logits": logits, "accepted": n, "verified": v})
                 for logits, n, v in zip(proposal.block.conf_logits.tolist(), accepted, proposal.accept_lens.tolist())]
        with open(self.record_path, "a", encoding="utf-8") as file:
            file.write("\n".join(lines) + "\n")

    def release(self, rid: str) -> None:
        self.planner.release(rid)

    def _maybe_log(self) -> None:
        now = time.monotonic()
        if now - self._last_log >= LOG_INTERVAL_S and self.stats.steps > self._logged_steps:
            logger.info(self.stats.log_line())
            self._last_log, self._logged_steps = now, self.stats.steps
