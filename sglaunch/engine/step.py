"""What one forward pass computes, as plain lists: rank 0 builds it and broadcasts it to every
tensor-parallel rank (packed into one flat buffer, engine/packed_step.py), which turn it into
tensors. Torch-free.

The layout is ragged: each request contributes its own number of query tokens (a prefill
chunk, one decode token, or several tokens to verify), laid out back to back.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from sglaunch.engine.scheduler import Chunk


@dataclass
class StepInput:
    input_ids: list[int]  # [num_tokens], request after request
    positions: list[int]  # [num_tokens], absolute position of each token in its request
    query_lens: list[int]  # [batch], tokens computed this step per request
    kv_lens: list[int]  # [batch], context per request after this step (cached + new)
    page_tables: list[list[int]]  # [batch][ceil(kv_len / page_size)] KV page ids
    sample_indices: list[int]  # rows of the flat token list whose logits are wanted
    # False: every sampled row is greedy, so the forward may skip the logits and give only each
    # row's greedy (token, log-probability) (ModelRunner.greedy_host); the same on every rank
    logits: bool = True
    # overlap: rows of input_ids that hold a placeholder (a token the previous step chose on the
    # device and the host has not read yet), and for each the logit row of the previous step
    # whose greedy choice fills it in; every rank fills them from its own greedy buffer
    future_rows: list[int] = field(default_factory=list)
    future_sources: list[int] = field(default_factory=list)
    # DSpark, drafts left on the device: rows of input_ids holding a draft marker, and for each
    # the flat index (request * gamma + slot) of the draft token in the drafter's last block that
    # fills it in on the device; every rank fills them from its own (identical) drafter output
    draft_rows: list[int] = field(default_factory=list)
    draft_sources: list[int] = field(default_factory=list)
    # DSpark: False when this (plain decode) step writes no draft context K/V: its requests never
    # draft again (LLMEngine._skips_context); always True without a drafter
    draft_context: bool = True

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def batch_size(self) -> int:
        return len(self.query_lens)


def build_step_input(chunks: list[Chunk], page_size: int) -> StepInput:
    """Chunks back to back; a speculating chunk contributes [anchor, drafts...] and wants the
    logits of all those rows, a sampling chunk those of its last row.
    NOTE: it runs every step over every running request: locals bound once, and a one-token
    chunk with no drafts (a decode) takes a short path."""
    step = StepInput([], [], [], [], [], [])
    input_ids, positions, query_lens, kv_lens = step.input_ids, step.positions, step.query_lens, step.kv_lens
    tables, samples = step.page_tables, step.sample_indices
    for chunk in chunks:
        req, start, stop = chunk.req, chunk.start, chunk.end
        tokens, drafts = req.token_ids, chunk.draft_tokens
        if stop - start == 1 and not drafts:
            token, row = tokens[start], len(input_ids)
            if token < 0 and stop == len(tokens):
                step.future_rows.append(row)
                step.future_sources.append(placeholder_source(token))
            input_ids.append(token)
            positions.append(start)
            query_lens.append(1)
            kv_lens.append(stop)
            tables.append(req.pages[: -(-stop // page_size)])
            if chunk.lookahead or stop == len(tokens):  # NOTE: Chunk.samples
                samples.append(row)
            continue
        ids = tokens[start:stop] + drafts
        end = start + len(ids)
        if stop == len(tokens) and ids[stop - start - 1] < 0:
            step.future_rows.append(len(input_ids) + stop - start - 1)
            step.future_sources.append(placeholder_source(ids[stop - start - 1]))
        if drafts and drafts[0] <= DRAFT_MARK:
            first = len(input_ids) + stop - start
            step.draft_rows.extend(range(first, first + len(drafts)))
            step.draft_sources.extend(DRAFT_MARK - t for t in drafts)
        input_ids.extend(ids)
        positions.extend(range(start, end))
        query_lens.append(len(ids))
        kv_lens.append(end)
        tables.append(req.pages[: -(-end // page_size)])
        if chunk.lookahead:
            samples.extend(range(len(input_ids) - len(ids), len(input_ids)))
        elif stop == len(tokens):
            samples.append(len(input_ids) - 1)
        if chunk.second_pages:  # DSpark's second chain: one more window (page size 1), after the first
            _second_window(step, chunk)
    return step


def _second_window(step: StepInput, chunk: Chunk) -> None:
    """The second chain's rows: its anchor (the chunk's, again) and drafts at the same positions
    as the first chain's, over the request's pages before the anchor and its own pages after."""
    second, start = chunk.second_tokens, chunk.start
    ids = [chunk.req.token_ids[start]] + second
    first = len(step.input_ids)
    if second and second[0] <= DRAFT_MARK:
        step.draft_rows.extend(range(first + 1, first + len(ids)))
        step.draft_sources.extend(DRAFT_MARK - t for t in second)
    step.input_ids.extend(ids)
    step.positions.extend(range(start, start + len(ids)))
    step.query_lens.append(len(ids))
    step.kv_lens.append(start + len(ids))
    step.page_tables.append(chunk.req.pages[:start] + array("i", chunk.second_pages[: len(ids)]))
    step.sample_indices.extend(range(first, first + len(ids)))


def placeholder(logit_row: int) -> int:
    """The token id standing for the greedy choice at `logit_row` of the step in flight."""
    return -1 - logit_row


def placeholder_source(token: int) -> int:
    return -1 - token


# NOTE: far below every placeholder (-1 - logit row): the two kinds of marker never meet
DRAFT_MARK = -(1 << 40)


# flat indices of second-chain drafts start here (request * its length + slot past it)
SECOND_CHAIN_BASE = 1 << 32


def second_marker(flat_index: int) -> int:
    """The token id standing for draft `flat_index` (request * length + slot) of the drafter's
    last second chain (DraftStepInput.second_chain), still on the device."""
    return draft_marker(SECOND_CHAIN_BASE + flat_index)


def second_row(row: int, chunk: Chunk) -> int:
    """The logits row of a chunk's second-chain anchor, from its first row (sample_rows)."""
    return row + 1 + len(chunk.draft_tokens)


def draft_marker(flat_index: int) -> int:
    """The token id standing for draft `flat_index` (request * gamma + slot) of the drafter's
    last block, still on the device (DSpark's verify inputs filled in there)."""
    return DRAFT_MARK - flat_index


def sample_rows(chunks: list[Chunk]) -> list[int | None]:
    """Per chunk, the row of the logits (ordered like sample_indices) where its samples start
    (a second chain's rows follow its first chain's: second_row)."""
    rows, next_row = [], 0
    for chunk in chunks:
        if chunk.lookahead:
            rows.append(next_row)
            next_row += 1 + len(chunk.draft_tokens) + (1 + len(chunk.second_tokens) if chunk.second_pages else 0)
        elif chunk.samples:
            rows.append(next_row)
            next_row += 1
        else:
            rows.append(None)
    return rows


@dataclass
class DraftStepInput:
    """One DSpark draft forward: per decoding request its anchor (last committed token) at
    position p, attending to its draft context at positions < p, whose K/V sit in the draft pool
    at the same slots as the target's KV (the request's page table)."""

    anchor_tokens: list[int]  # [batch]
    anchor_positions: list[int]  # [batch] p: the block occupies p .. p + gamma - 1
    page_tables: list[list[int]]  # [batch][ceil(p / page_size)] KV page ids of positions < p
    # drafts of the block's runner-up chain (DSparkDrafter.second_chain) every rank computes after
    # the block, for verify rows that a second chain's markers fill in (0: none this step)
    second_chain: int = 0
    # rank 0 only (never sent to TP workers): a step with a sampled row gives every row's temperature
    # (0: greedy) and its draw uniforms [batch, gamma + S] (a CPU tensor: the block's gamma, then a sampled
    # second chain's S, if the step draws one), for a sampled drafter graph
    temperatures: list[float] | None = None
    draw_uniforms: "torch.Tensor | None" = None
