"""CUDA graphs of the DSpark drafter's block forward (on by default; SGLAUNCH_DRAFT_CUDA_GRAPH=0 turns
them off, and with them the draft-context write inside the target's graphs).

Eagerly, the block forward dispatches about 200 operators a step (two draft layers); on an H200
host that is several milliseconds, longer than the GPU needs for the work. A graph replays them
in one launch, followed by the Markov block sampling of an all-greedy batch (`graph_body`), which
a step whose requests are all greedy takes as its draft block.

The forward's shapes depend on the batch size B and on the slot table's width C (the longest
context of the step), so a graph is keyed on both, each rounded up:
- B to the target's decode buckets (1, 2, 4, 8, 16, 24, ...), padded with dummy requests:
  anchor token 0 at position 0 with no context, so each attends to its own block only;
- C to a power of two (at least MIN_CONTEXT), the padding columns pointing at slot 0; every
  request's context length masks them, as it masks the table's own padding.
Keys whose gathered context would be too large (B * C above MAX_CELLS) run eagerly.

Graphs are captured lazily, the first time a key is used, by every rank in the same step (the
drafter's collectives, under TP, are inside the graph). They share one memory pool; each keeps
its output tensors, which the step reads before the next replay.

The layout (keys, padded inputs, the DraftBatch over the static buffer) is plain torch and
tested on the CPU; DraftGraphRunner is the part that needs a GPU.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from sglaunch.speculative.drafter import BlockOutput, DraftBatch, DraftBlock, DraftKVPool, DSparkDrafter

logger = logging.getLogger(__name__)

ENABLE_ENV = "SGLAUNCH_DRAFT_CUDA_GRAPH"
MIN_CONTEXT = 128
MAX_CELLS = 1 << 19  # padded batch x padded context: the gathered K/V of one layer stays < 1 GiB


def enabled_from_env() -> bool:
    """On unless SGLAUNCH_DRAFT_CUDA_GRAPH is 0/false/no/off. NOTE: on by default since the H200 run
    of 2026-12-01 (88 of 88 GPU tests; DSpark's work per step 2.5-4.8 ms against 5.6-7.4 eagerly)."""
    return os.environ.get(ENABLE_ENV, "").strip().lower() not in ("0", "false", "no", "off")


@dataclass(frozen=True)
class DraftGraphKey:
    batch: int  # requests in the graph, dummies included
    context: int  # slot-table width, padding columns included

    @property
    def flat_size(self) -> int:
        """int64 entries of the static input: anchors, positions, slot table."""
        return 2 * self.batch + self.batch * self.context


class DraftGraphPlan:
    """Which graph (if any) a draft step of `batch` requests and longest context `context` replays."""

    def __init__(self, batch_sizes: Sequence[int], max_context: int, max_cells: int = MAX_CELLS):
        self.batch_sizes = sorted(batch_sizes)
        self.max_context = _round_up_pow2(max(max_context, MIN_CONTEXT))
        self.max_cells = max_cells

    def pick(self, batch: int, context: int) -> DraftGraphKey | None:
        bucket = next((b for b in self.batch_sizes if b >= batch), None)
        width = _round_up_pow2(max(context, MIN_CONTEXT))
        if bucket is None or width > self.max_context or bucket * width > self.max_cells:
            return None
        return DraftGraphKey(bucket, width)

    @property
    def max_flat_size(self) -> int:
        """The static input buffer's size: the largest flat_size of any key this plan can pick."""
        best = 0
        for b in self.batch_sizes:
            width = min(self.max_context, _round_down_pow2(self.max_cells // b))
            if width >= MIN_CONTEXT:
                best = max(best, DraftGraphKey(b, width).flat_size)
        return best


def padded_inputs(anchors: Sequence[int], positions: Sequence[int], slot_table: torch.Tensor,
                  key: DraftGraphKey) -> torch.Tensor:
    """Host values -> the graph's flat int64 input (CPU): anchors [B'], positions [B'] (also the
    context lengths), slot table [B', C'] row-major. slot_table: [B, C] with C <= key.context."""
    B, C = slot_table.shape
    flat = torch.zeros(key.flat_size, dtype=torch.int64)
    flat[:B] = torch.tensor(list(anchors), dtype=torch.int64)
    flat[key.batch: key.batch + B] = torch.tensor(list(positions), dtype=torch.int64)
    table = flat[2 * key.batch:].view(key.batch, key.context)
    table[:B, :C] = slot_table
    return flat


def batch_from_flat(flat: torch.Tensor, key: DraftGraphKey, feature_width: int, dtype: torch.dtype) -> DraftBatch:
    """The DraftBatch over (a static buffer holding) a flat input of `key`: views, no copies."""
    B = key.batch
    empty = flat.new_empty(0)
    return DraftBatch(
        anchor_tokens=flat[:B], anchor_positions=flat[B: 2 * B],
        ctx_features=torch.empty(0, feature_width, dtype=dtype, device=flat.device), ctx_positions=empty,
        ctx_slots=empty, slot_table=flat[2 * B: key.flat_size].view(B, key.context), ctx_lens=flat[B: 2 * B],
    )


def graph_body(drafter: DSparkDrafter, batch: DraftBatch, pool: DraftKVPool) -> BlockOutput:
    """What a drafter graph captures: the block forward, then the Markov block sampling of an
    all-greedy batch (out.greedy). A step whose requests are all greedy reads that block (so its
    85 or so sampling operators run inside the replay); any other step samples out eagerly."""
    out = drafter.forward_block(batch, pool)
    out.greedy = drafter.greedy_block(out, batch.anchor_tokens)
    return out


def first_rows(block: DraftBlock, batch: int) -> DraftBlock:
    """The real requests' rows of a padded block."""
    conf = block.conf_logits[:batch] if block.conf_logits is not None else None
    return DraftBlock(block.tokens[:batch], None, block.logits[:batch], conf)


class DraftGraphRunner:
    """Captures (lazily) and replays the drafter's block forward per DraftGraphKey."""

    def __init__(self, drafter: DSparkDrafter, pool: DraftKVPool, plan: DraftGraphPlan, device: torch.device):
        self.drafter, self.pool, self.plan, self.device = drafter, pool, plan, device
        c = drafter.config
        self.feature_width, self.dtype = c.num_features * c.hidden_size, drafter.dtype
        self.flat = torch.zeros(max(plan.max_flat_size, 1), dtype=torch.int64, device=device)
        self.mempool = torch.cuda.graph_pool_handle()
        self.graphs: dict[DraftGraphKey, tuple[torch.cuda.CUDAGraph, BlockOutput]] = {}
        self.replays = 0

    def pick(self, batch: int, context: int) -> DraftGraphKey | None:
        return self.plan.pick(batch, context)

    @torch.inference_mode()
    def run(self, key: DraftGraphKey, host_flat: torch.Tensor, batch: int) -> BlockOutput:
        """host_flat: padded_inputs(...) for `key` (on the device already, or on the CPU).
        -> the block output of the first `batch` (real) requests: views of the graph's outputs,
        valid until the next replay."""
        self.flat[: key.flat_size].copy_(host_flat, non_blocking=True)
        if key not in self.graphs:
            self.graphs[key] = self._capture(key)
        graph, out = self.graphs[key]
        graph.replay()
        self.replays += 1
        return BlockOutput(out.hidden[:batch], out.logits[:batch], first_rows(out.greedy, batch))

    def _capture(self, key: DraftGraphKey):
        start = time.perf_counter()
        batch = batch_from_flat(self.flat, key, self.feature_width, self.dtype)
        # NOTE: warm-up outside the capture (kernel selection, workspaces); with no pending
        # context rows the forward writes nothing to the pool, so warm-up and capture are pure
        graph_body(self.drafter, batch, self.pool)
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            out = graph_body(self.drafter, batch, self.pool)
        logger.info("DSpark drafter: CUDA graph for batch %d, context %d captured in %.0f ms", key.batch,
                    key.context, 1e3 * (time.perf_counter() - start))
        return graph, out


def _round_up_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _round_down_pow2(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n > 0 else 0
