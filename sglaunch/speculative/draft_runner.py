"""The DSpark drafter on one tensor-parallel rank, as the engine's ModelRunner drives it.

Draft context K/V live in a DraftKVPool whose slots are the target KV pool's slots: position i
of a request has its draft K/V at the same slot (page * page_size + offset) as its target K/V.
Every target forward writes the draft K/V of all its rows (prefill chunks and verify rows,
rejected ones included) from the captured target features. So at any slot the draft K/V belong
to the same token as the target K/V, and whatever the target KV holds validly (a running
request's accepted prefix, a page the radix cache shares, a preempted request's kept pages)
the draft context holds too: rejected rows sit beyond the committed length, invisible, and are
overwritten when their positions are computed again. Radix hits therefore keep a full draft
context and need no recompute.
"""

from __future__ import annotations

import logging

import torch

from sglaunch.config import EngineConfig
from sglaunch.engine.distributed import TPGroup
from sglaunch.engine.kv_pool import kv_bytes_per_token
from sglaunch.engine.step import DraftStepInput
from sglaunch.speculative.drafter import BlockOutput, DraftBatch, DraftKVPool
from sglaunch.engine.transfer import to_device

logger = logging.getLogger(__name__)


class DraftRunner:
    def __init__(self, config: EngineConfig, target, tp: TPGroup, dtype: torch.dtype, device: torch.device,
                 max_positions: int):
        from sglaunch.speculative.checkpoint import load_drafter

        spec = config.speculative
        self.drafter = load_drafter(spec.draft_model_path, target, tp, dtype, device,
                                    max_positions + _block_size(spec.draft_model_path))
        c = self.drafter.config
        if spec.block_size is not None and spec.block_size != c.block_size:
            # NOTE: a runtime gamma other than the checkpoint's gives wrong drafts (spec pitfall 7)
            raise ValueError(f"--speculative-dspark-block-size {spec.block_size} differs from the drafter's "
                             f"block_size {c.block_size}; drop the flag or use the checkpoint's value")
        self.tp, self.device = tp, device
        self._use_draft_vocab(spec.draft_model_path)
        self.layer_ids = tuple(c.target_layer_ids)
        self.block_size = c.block_size
        self.pool: DraftKVPool | None = None
        self.graphs = None  # DraftGraphRunner, when enable_graphs() was called
        self.second: torch.Tensor | None = None  # the last second chain [B, length] (_second_chain)

    def _use_draft_vocab(self, folder: str) -> None:
        """A draft_vocab.json beside the drafter restricts what it drafts (draft_vocab.py)."""
        from pathlib import Path

        from sglaunch.speculative.draft_vocab import FILE_NAME, load_draft_vocab

        path = Path(folder) / FILE_NAME
        if not path.is_file():
            return
        if self.tp.size > 1:
            logger.warning("DSpark: %s ignored: a draft vocabulary needs --tp-size 1; drafting over all tokens", path)
            return
        ids = load_draft_vocab(path, self.drafter.config.vocab_size)
        self.drafter.restrict_vocab(ids)
        logger.info("DSpark: drafting over %d of %d tokens (%s)", len(ids), self.drafter.config.vocab_size, path)

    def bytes_per_token(self, kv_dtype: torch.dtype) -> int:
        c = self.drafter.config
        return kv_bytes_per_token(c.num_layers, c.num_kv_heads // self.tp.size, c.head_dim, kv_dtype)

    def working_bytes(self, batch_sizes: list[int], max_context: int, kv_dtype: torch.dtype) -> int:
        """The memory the largest drafter forward of a step takes while it runs (its gathered context
        K/V, attention, logits), on CUDA: a dry run of the drafter graph plan's largest key (dummy
        requests without context, as a capture runs them) over a temporary one-slot pool, measured
        as the peak allocation above what was allocated before. 0 on other devices (their KV pool
        is sized by --max-total-tokens), where the dry run still runs. ModelRunner keeps it out of
        the KV pool's default budget: on an H100 the default 0.88 left too little beside the
        drafter graphs, and their capture ran out of memory at start-up (session 24, in-process
        `dspark_sweep.py`: 1.13 GiB asked with 0.6 GiB free)."""
        from sglaunch.speculative.draft_graphs import (batch_from_flat, graph_body, sampled_enabled_from_env,
                                                       sampled_graph_body, sampling_from_flat)

        plan = self._graph_plan(batch_sizes, max_context, sampled_enabled_from_env())
        keys = plan.keys()
        if not keys:
            return 0
        # NOTE: largest first (padded batch x context, then batch); the largest sampled key's body
        # too (its sampling's intermediates beside the forward's)
        runs, c = [keys[0]] + plan.keys(sampled=True)[:1], self.drafter.config
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            before = torch.cuda.memory_allocated(self.device)
        pool = self.drafter.make_pool(1, kv_dtype)
        with torch.inference_mode():
            for key in runs:
                flat = torch.zeros(key.flat_size, dtype=torch.int64, device=self.device)
                batch = batch_from_flat(flat, key, c.num_features * c.hidden_size, self.drafter.dtype)
                if key.sampled:  # NOTE: the largest sampled key draws no second chain (at most 4 requests do)
                    sampling = torch.zeros(key.batch * (1 + self.block_size), dtype=torch.float32, device=self.device)
                    sampled_graph_body(self.drafter, batch, pool, *sampling_from_flat(sampling, key, self.block_size))
                else:
                    graph_body(self.drafter, batch, pool)
                del flat, batch
        if not cuda:
            return 0
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - before
        del pool
        torch.cuda.empty_cache()
        logger.info("DSpark: the drafter's largest forward (batch %d, context %d) takes %.1f MiB while it runs",
                    keys[0].batch, keys[0].context, peak / 2**20)
        return peak

    def allocate_pool(self, num_slots: int, kv_dtype: torch.dtype) -> None:
        self.pool = self.drafter.make_pool(num_slots, kv_dtype)

    def enable_graphs(self, batch_sizes: list[int], max_context: int, capture=None, sampled: bool = True,
                      sampled_chain: int = 0) -> None:
        """CUDA graphs of the block forward (draft_graphs.py), every key captured now (start-up),
        none later. capture: draft_graphs.CudaCapture (default) or a CPU test's stand-in; sampled:
        graphs for steps with sampled rows too, for the batch buckets whose probabilities fit;
        sampled_chain: S > 0: the small ones also draw a sampled second chain of S drafts."""
        from sglaunch.speculative.draft_graphs import DraftGraphRunner

        graphs = DraftGraphRunner(self.drafter, self.pool, self._graph_plan(batch_sizes, max_context, sampled),
                                  self.device, capture, sampled_chain)
        graphs.capture_all()
        self.graphs = graphs

    def _graph_plan(self, batch_sizes: list[int], max_context: int, sampled: bool):
        """The drafter graphs' plan; sampled: with sampled keys for the buckets whose draft
        probabilities (over the draft vocabulary) fit in draft_graphs.SAMPLED_PROBS_BYTES."""
        from sglaunch.speculative.draft_graphs import DraftGraphPlan, sampled_batch_cap

        d = self.drafter
        vocab = d.draft_vocab.numel() if d.draft_vocab is not None else d.config.vocab_size
        return DraftGraphPlan(batch_sizes, max_context,
                              sampled_batch=sampled_batch_cap(batch_sizes, self.block_size, vocab) if sampled else 0)

    def block_tokens(self) -> torch.Tensor:
        """The last graph-drafted block's tokens, flat [max batch * gamma] (request r's slot j at
        r * gamma + j), on the device: a verify step's drafts left there are filled from it."""
        if self.graphs is None:
            raise RuntimeError("drafts left on the device need the drafter's graphs")
        return self.graphs.outputs.tokens.view(-1)

    def write_context(self, features: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> None:
        """features [num_tokens, n * hidden] of one target forward -> draft K/V at its KV slots."""
        self.drafter.write_context(features, positions, slots, self.pool)

    @torch.inference_mode()
    def forward(self, step: DraftStepInput, page_size: int) -> BlockOutput:
        """The parallel stage for every request of the step (collectives inside: all ranks run it).
        A step with sampling inputs (rank 0's, with a sampled row) replays a sampled graph where one
        is captured: out.sampled is its block. NOTE: TP workers get no sampling inputs and replay the
        greedy graph of the same key; both bodies run the same forward (the only collectives)."""
        batch, context = len(step.anchor_tokens), max(step.anchor_positions, default=0)
        key = None
        if self.graphs is not None:
            key = self.graphs.pick(batch, context, sampled=True) if step.temperatures is not None else None
            if key is None:  # all greedy, or no sampled graph for it: the forward's graph, the draws after it
                key = self.graphs.pick(batch, context)
        if key is not None:  # one copy down (two with sampling inputs), from the graphs' persistent pinned buffers
            table = context_slots(step.page_tables, step.anchor_positions, page_size)
            out = self.graphs.run_padded(key, step.anchor_tokens, step.anchor_positions, table,
                                         step.temperatures, step.draw_uniforms)
            if step.second_chain:
                (anchors,) = to_device([torch.tensor(step.anchor_tokens, dtype=torch.int64)], self.device)
                self._second_chain(out, anchors, step.second_chain)
            return out
        host = [torch.tensor(step.anchor_tokens, dtype=torch.int64),
                torch.tensor(step.anchor_positions, dtype=torch.int64),
                context_slots(step.page_tables, step.anchor_positions, page_size)]
        anchors, positions, slot_table = to_device(host, self.device)  # one non-blocking copy
        width = self.drafter.config.num_features * self.drafter.config.hidden_size
        empty = torch.empty(0, dtype=torch.int64, device=self.device)
        batch = DraftBatch(
            anchor_tokens=anchors, anchor_positions=positions,
            ctx_features=torch.empty(0, width, device=self.device), ctx_positions=empty, ctx_slots=empty,
            slot_table=slot_table, ctx_lens=positions,
        )
        out = self.drafter.forward_block(batch, self.pool)
        if step.second_chain:
            self._second_chain(out, anchors, step.second_chain)
        return out

    def _second_chain(self, out: BlockOutput, anchors: torch.Tensor, length: int) -> None:
        """The block's runner-up chain (DSparkDrafter.second_chain), eagerly after the block, on
        every rank: out.second [B, length], and second_tokens() for the verify's markers."""
        out.second = self.drafter.second_chain(out, anchors, length)
        self.second = out.second

    def second_tokens(self) -> torch.Tensor:
        """The last second chain's drafts, flat [batch * length] (request r's slot j at r * length + j)."""
        if self.second is None:
            raise RuntimeError("a verify step holds second-chain markers but no second chain was drafted")
        return self.second.view(-1)


def context_slots(page_tables, lengths: list[int], page_size: int) -> torch.Tensor:
    """[batch, max(lengths)] pool slot of each context position (padding: a valid slot, masked).
    Host lists in, a CPU tensor out (no device tensor is read). NOTE: one flat int32 copy of the
    tables and one numpy gather (single-threaded, no torch dispatch); padded nested lists through
    torch.tensor took 2.9 ms at 64 requests of about 275 positions on the dev CPU."""
    import numpy as np

    from sglaunch.engine.attention.base import flat_pages

    batch, width = len(page_tables), max(lengths, default=0)
    flat = flat_pages(page_tables).astype(np.int64)
    if not flat.size:
        return torch.zeros(batch, width, dtype=torch.int64)
    counts = np.fromiter(map(len, page_tables), dtype=np.int64, count=batch)
    starts = np.cumsum(counts) - counts  # [batch] where each table begins in `flat`
    last = np.maximum(np.asarray(lengths, dtype=np.int64) - 1, 0)
    pos = np.minimum(np.arange(width, dtype=np.int64)[None, :], last[:, None])  # [batch, width]
    # NOTE: a position past its table (an empty context) reads some valid page: masked anyway
    page = np.clip(starts[:, None] + pos // page_size, 0, flat.size - 1)
    return torch.from_numpy(flat[page] * page_size + pos % page_size)


def _block_size(path: str) -> int:
    from sglaunch.speculative.drafter_config import load_drafter_config

    return load_drafter_config(path).block_size
