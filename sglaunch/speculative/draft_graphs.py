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

Unless SGLAUNCH_DRAFT_SAMPLED_GRAPH=0 (on by default since session 35's GPU run) a step with
sampled rows (T > 0) replays a second set of graphs; with it 0 such steps sample eagerly after the
forward's graph. Their body is the forward and then the Markov block sampling of any mix of greedy
and sampled rows (`sampled_graph_body`): each row's temperature (0: greedy) and its G draw uniforms,
drawn on the host from the request's generator, go down in a second static input (float32) with the
step's one copy of the int64 input. The block's draft probabilities (over the draft vocabulary) stay in a static output
of [batch, G, K] floats, so these graphs cover only the batch buckets whose probabilities fit in
SAMPLED_PROBS_BYTES (`sampled_batch_cap`); larger sampled steps sample eagerly. With a sampled
second chain of S drafts (SGLAUNCH_DSPARK_SAMPLED_CHAIN), the sampled graphs of up to
SECOND_CHAIN_MAX_BATCH requests also draw it (`DSparkDrafter.sampled_graph_chain`, its S draw
uniforms beside the block's), into static outputs of their own. Eagerly, the sampling
dispatched about 200 operators a step at G=7 (benchmarks/sampled_draft_ops.py).

Every key the plan can pick is captured at start-up (`DraftGraphRunner.capture_all`, from
ModelRunner, before the step-cost profile), largest first, by every rank alike (the drafter's
collectives, under TP, are inside the graph); a serving step never captures (`pick` only returns
captured keys). The graphs share one memory pool for their intermediates and write their
results into ONE set of static output buffers sized for the largest batch (`DraftOutputs`,
outside the pool), so their memory does not grow with the number of keys: each replay's output
rows are valid until the next replay.

The layout (keys, padded inputs, the DraftBatch over the static buffer, the static outputs) is
plain torch and tested on the CPU, the runner included: `capture` is pluggable, and the CPU tests
"capture" by keeping the body to re-run it (`EagerCapture`); `CudaCapture` is the real one.
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
SAMPLED_ENV = "SGLAUNCH_DRAFT_SAMPLED_GRAPH"
MIN_CONTEXT = 128
MAX_CELLS = 1 << 19  # padded batch x padded context: the gathered K/V of one layer stays < 1 GiB
SAMPLED_PROBS_BYTES = 64 << 20  # the sampled graphs' static draft probabilities [batch, G, K] float32


def enabled_from_env() -> bool:
    """On unless SGLAUNCH_DRAFT_CUDA_GRAPH is 0/false/no/off. NOTE: on by default since the H200 run
    of 2026-12-01 (88 of 88 GPU tests; DSpark's work per step 2.5-4.8 ms against 5.6-7.4 eagerly)."""
    return os.environ.get(ENABLE_ENV, "").strip().lower() not in ("0", "false", "no", "off")


def sampled_enabled_from_env() -> bool:
    """Graphs for steps with sampled rows: on unless SGLAUNCH_DRAFT_SAMPLED_GRAPH is 0/false/no/off
    (on by default since session 35's GPU run: benchmarks/NOTES.md)."""
    return os.environ.get(SAMPLED_ENV, "").strip().lower() not in ("0", "false", "no", "off")


def sampled_batch_cap(batch_sizes: Sequence[int], gamma: int, vocab: int, budget: int = SAMPLED_PROBS_BYTES) -> int:
    """The largest batch bucket whose sampled graph's draft probabilities [bucket, gamma, vocab]
    (float32) fit in `budget` bytes; 0 when none does."""
    fits = [b for b in batch_sizes if b * gamma * vocab * 4 <= budget]
    return max(fits, default=0)


def start_up_graphs(runner, capture=None, force: bool = False) -> None:
    """ModelRunner's start-up, after the target's graphs: capture every drafter graph when the
    target has CUDA graphs and SGLAUNCH_DRAFT_CUDA_GRAPH is not 0. Batch buckets: the target's
    decode buckets; contexts: up to the context length. force / capture: CPU tests (no target
    graphs there; EagerCapture stands in for CUDA)."""
    if not force and (runner.graphs is None or not enabled_from_env()):
        return
    from sglaunch.engine.cuda_graph import capture_batch_sizes

    sizes = (list(runner.graphs.plan.decode_sizes) if runner.graphs is not None
             else capture_batch_sizes(runner.config.graph_batch_cap))
    cuda = runner.device.type == "cuda"
    before = torch.cuda.memory_reserved(runner.device) if cuda else 0
    from sglaunch.speculative.decoder import second_chain_length

    sampled = sampled_enabled_from_env()
    chain = (second_chain_length(runner.draft.block_size, runner.kv_pool.page_size, runner.device.type, sampled=True)
             if sampled else 0)
    runner.draft.enable_graphs(sizes, runner.context_length, capture, sampled=sampled, sampled_chain=chain)
    if cuda:  # NOTE: outside --mem-fraction-static's budget, like the target's graphs: say how much
        reserved = torch.cuda.memory_reserved(runner.device)
        logger.info("DSpark drafter graphs: %.1f MiB more reserved (static buffers and graph pool); %.2f GiB "
                    "reserved by this process", (reserved - before) / 2**20, reserved / 2**30)


@dataclass(frozen=True)
class DraftGraphKey:
    batch: int  # requests in the graph, dummies included
    context: int  # slot-table width, padding columns included
    sampled: bool = False  # the body samples any mix of rows (sampled_graph_body), not greedy rows only

    @property
    def flat_size(self) -> int:
        """int64 entries of the static input: anchors, positions, slot table."""
        return 2 * self.batch + self.batch * self.context


class DraftGraphPlan:
    """Which graph (if any) a draft step of `batch` requests and longest context `context` replays;
    sampled_batch: the largest batch bucket with sampled graphs (0: none)."""

    def __init__(self, batch_sizes: Sequence[int], max_context: int, max_cells: int = MAX_CELLS,
                 sampled_batch: int = 0):
        self.batch_sizes = sorted(batch_sizes)
        self.max_context = _round_up_pow2(max(max_context, MIN_CONTEXT))
        self.max_cells = max_cells
        self.sampled_batch = max((b for b in self.batch_sizes if b <= sampled_batch), default=0)

    def pick(self, batch: int, context: int, sampled: bool = False) -> DraftGraphKey | None:
        """sampled: a step with a row at T > 0 (None above sampled_batch: it samples eagerly)."""
        bucket = next((b for b in self.batch_sizes if b >= batch), None)
        width = _round_up_pow2(max(context, MIN_CONTEXT))
        if bucket is None or width > self.max_context or bucket * width > self.max_cells:
            return None
        if sampled and bucket > self.sampled_batch:
            return None
        return DraftGraphKey(bucket, width, sampled)

    def keys(self, sampled: bool = False) -> list[DraftGraphKey]:
        """Every key pick(..., sampled) can return, largest first (the capture order)."""
        keys = []
        for b in self.batch_sizes:
            if sampled and b > self.sampled_batch:
                continue
            width = MIN_CONTEXT
            while width <= self.max_context and b * width <= self.max_cells:
                keys.append(DraftGraphKey(b, width, sampled))
                width *= 2
        return sorted(keys, key=lambda k: (k.batch * k.context, k.batch), reverse=True)

    def all_keys(self) -> list[DraftGraphKey]:
        """What start-up captures: the greedy keys, then the sampled ones, each largest first."""
        return self.keys() + self.keys(sampled=True)

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
                  key: DraftGraphKey, out: torch.Tensor | None = None) -> torch.Tensor:
    """Host values -> the graph's flat int64 input (CPU): anchors [B'], positions [B'] (also the
    context lengths), slot table [B', C'] row-major. slot_table: [B, C] with C <= key.context.
    out: a CPU int64 buffer of at least key.flat_size to fill (e.g. a persistent pinned one; every
    entry of the key's span is written, padding with 0) -> its first key.flat_size entries.
    NOTE: numpy fills, no torch operator (each is a dispatch on the host of every drafting step)."""
    import numpy as np

    B, C = slot_table.shape
    Bk, Ck = key.batch, key.context
    flat = out[: key.flat_size] if out is not None else torch.empty(key.flat_size, dtype=torch.int64)
    view = flat.numpy()
    view[: 2 * Bk] = 0
    view[:B] = anchors
    view[Bk: Bk + B] = positions
    grid = view[2 * Bk:].reshape(Bk, Ck)
    grid[:B, :C] = slot_table.numpy() if isinstance(slot_table, torch.Tensor) else slot_table
    grid[:B, C:] = 0
    grid[B:] = 0
    return flat


def padded_sampling(temperatures: Sequence[float], uniforms, key: DraftGraphKey, width: int,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """Host values -> a sampled graph's flat float32 input (CPU): temperatures [B'] (0: greedy, the
    padding's too), then the uniforms [B', width] row-major (the block's gamma draws, then a second
    chain's draws where the key draws one; padding 0). uniforms: [B, w <= width] (a tensor or nested
    lists; columns past w are 0). out: a CPU float32 buffer of at least key.batch * (1 + width)."""
    import numpy as np

    B, Bk = len(temperatures), key.batch
    size = Bk * (1 + width)
    flat = out[:size] if out is not None else torch.empty(size, dtype=torch.float32)
    view = flat.numpy()
    view[:] = 0
    view[:B] = temperatures
    grid = view[Bk:].reshape(Bk, width)
    values = uniforms.numpy() if isinstance(uniforms, torch.Tensor) else np.asarray(uniforms, dtype=np.float32)
    grid[:B, : values.shape[1]] = values
    return flat


def sampling_from_flat(flat: torch.Tensor, key: DraftGraphKey, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(temperatures [B'], uniforms [B', width]) views over (a static buffer holding) padded_sampling's layout."""
    B = key.batch
    return flat[:B], flat[B: B * (1 + width)].view(B, width)


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
    all-greedy batch (out.greedy, its logits not kept). A step whose requests are all greedy
    reads that block (so its 85 or so sampling operators run inside the replay); any other step
    samples out eagerly."""
    out = drafter.forward_block(batch, pool)
    out.greedy = drafter.greedy_block(out, batch.anchor_tokens)
    return out


def sampled_graph_body(drafter: DSparkDrafter, batch: DraftBatch, pool: DraftKVPool, temperatures: torch.Tensor,
                       uniforms: torch.Tensor, chain: int = 0) -> BlockOutput:
    """What a sampled drafter graph captures: the block forward, then the Markov block sampling of
    rows at their temperatures (0: greedy) and draw uniforms (uniforms[:, :G]; out.sampled, its
    probabilities over the draft vocabulary); chain > 0: then a second chain of `chain` drafts
    from uniforms[:, G:] (out.sampled_second)."""
    G = drafter.config.block_size
    out = drafter.forward_block(batch, pool)
    out.sampled = drafter.sampled_graph_block(out, batch.anchor_tokens, temperatures, uniforms[:, :G])
    if chain:
        out.sampled_second = drafter.sampled_graph_chain(out, batch.anchor_tokens, out.sampled, temperatures,
                                                         uniforms[:, G: G + chain], chain)
    return out


class DraftOutputs:
    """The static outputs every drafter graph writes its rows into (rows [:key.batch]): the block
    forward's hidden states and logits (a sampled step samples from them), the greedy block's
    tokens and confidence logits (a sampled graph's block writes its tokens and confidence logits
    there too, and its draft probabilities to `probs`, sized for the largest sampled batch).
    Allocated once, for the largest batch, outside the graph pool."""

    def __init__(self, drafter: DSparkDrafter, batch: int, device: torch.device, sampled_batch: int = 0,
                 chain: int = 0, chain_batch: int = 0):
        c, G = drafter.config, drafter.config.block_size
        vocab = drafter.draft_vocab.numel() if drafter.draft_vocab is not None else c.vocab_size
        self.drafter = drafter
        self.hidden = torch.zeros(batch, G, c.hidden_size, dtype=drafter.dtype, device=device)
        self.logits = torch.zeros(batch, G, vocab, dtype=torch.float32, device=device)
        self.tokens = torch.zeros(batch, G, dtype=torch.int64, device=device)
        self.conf = (torch.zeros(batch, G, dtype=torch.float32, device=device)
                     if drafter.confidence_head is not None else None)
        self.probs = (torch.zeros(sampled_batch, G, vocab, dtype=torch.float32, device=device)
                      if sampled_batch else None)
        # a sampled second chain's drafts (target ids) and their distributions over the whole vocabulary
        self.second = torch.zeros(chain_batch, chain, dtype=torch.int64, device=device) if chain else None
        self.second_probs = (torch.zeros(chain_batch, chain, c.vocab_size, dtype=torch.float32, device=device)
                             if chain else None)

    @property
    def nbytes(self) -> int:
        parts = [self.hidden, self.logits, self.tokens] + [t for t in (self.conf, self.probs, self.second,
                                                                       self.second_probs) if t is not None]
        return sum(t.numel() * t.element_size() for t in parts)

    def store(self, out: BlockOutput) -> None:
        """Inside the graph: the body's results -> rows [:B] of the static buffers."""
        B = out.hidden.shape[0]
        self.hidden[:B].copy_(out.hidden)
        self.logits[:B].copy_(out.logits)
        block = out.sampled if out.sampled is not None else out.greedy
        self.tokens[:B].copy_(block.tokens)
        if self.conf is not None:
            self.conf[:B].copy_(block.conf_logits)
        if out.sampled is not None:
            self.probs[:B].copy_(block.probs)
        if out.sampled_second is not None:
            self.second[:B].copy_(out.sampled_second[0])
            self.second_probs[:B].copy_(out.sampled_second[1])

    def rows(self, batch: int, sampled: bool = False, chain: bool = False) -> BlockOutput:
        """The first `batch` (real) requests' rows: views, valid until the next replay. sampled: a
        sampled graph's replay (out.sampled, its probabilities over the whole vocabulary: a new
        tensor when the drafter has a draft vocabulary; chain: with out.sampled_second), else the
        greedy block (out.greedy)."""
        conf = self.conf[:batch] if self.conf is not None else None
        if sampled:
            block = DraftBlock(self.tokens[:batch], self.drafter.expand_probs(self.probs[:batch]), None, conf)
            second = (self.second[:batch], self.second_probs[:batch]) if chain else None
            return BlockOutput(self.hidden[:batch], self.logits[:batch], sampled=block, sampled_second=second)
        greedy = DraftBlock(self.tokens[:batch], None, None, conf)
        return BlockOutput(self.hidden[:batch], self.logits[:batch], greedy)


class CudaCapture:
    """Captures a body into a CUDA graph in one shared memory pool; `.replay()` runs it."""

    def __init__(self, device: torch.device):
        self.device, self.mempool = device, torch.cuda.graph_pool_handle()

    def __call__(self, body):
        # NOTE: warm-up outside the capture (kernel selection, workspaces); with no pending
        # context rows the forward writes nothing to the pool, so warm-up and capture are pure
        body()
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            body()
        return graph


class EagerCapture:
    """A stand-in for CudaCapture (CPU tests): `replay()` re-runs the body, which reads the same
    static input buffer and writes the same static outputs as a CUDA graph would."""

    class Replayable:
        def __init__(self, body):
            self.body = body

        def replay(self) -> None:
            self.body()

    def __call__(self, body):
        body()  # the warm-up, as CudaCapture does
        return self.Replayable(body)


class DraftGraphRunner:
    """Captures (all at start-up: capture_all) and replays the drafter's block forward per
    DraftGraphKey."""

    def __init__(self, drafter: DSparkDrafter, pool: DraftKVPool, plan: DraftGraphPlan, device: torch.device,
                 capture=None, sampled_chain: int = 0):
        """sampled_chain: S > 0 (SGLAUNCH_DSPARK_SAMPLED_CHAIN): the sampled graphs of up to
        SECOND_CHAIN_MAX_BATCH requests also draw a second chain of S drafts."""
        from sglaunch.speculative.burst import SECOND_CHAIN_MAX_BATCH

        self.drafter, self.pool, self.plan, self.device = drafter, pool, plan, device
        limit = min(SECOND_CHAIN_MAX_BATCH, plan.sampled_batch)
        self.chain_batch = max((b for b in plan.batch_sizes if b <= limit), default=0) if sampled_chain else 0
        self.chain = sampled_chain if self.chain_batch else 0
        c = drafter.config
        self.feature_width, self.dtype = c.num_features * c.hidden_size, drafter.dtype
        self.flat = torch.zeros(max(plan.max_flat_size, 1), dtype=torch.int64, device=device)
        # NOTE: the host side of `flat`, pinned and reused: one non-blocking copy a step, no new
        # pinned buffer. A step's copy is done before the next step refills it: on rank 0 the
        # planning read-back after the replay waits for the stream; a TP worker gets the next
        # draft step only after rank 0's read-backs, which wait for the collectives that follow
        # the worker's copy in its stream
        self.host_flat = torch.zeros(self.flat.numel(), dtype=torch.int64, pin_memory=device.type == "cuda")
        # the sampled graphs' float input (temperatures, the block's and a chain's draw uniforms), device
        # and pinned host alike
        self.gamma = c.block_size
        self.width = self.gamma + self.chain
        self.sampling = torch.zeros(max(plan.sampled_batch * (1 + self.width), 1), dtype=torch.float32, device=device)
        self.host_sampling = torch.zeros(self.sampling.numel(), dtype=torch.float32, pin_memory=device.type == "cuda")
        self.outputs = DraftOutputs(drafter, max(plan.batch_sizes), device, plan.sampled_batch, self.chain,
                                    self.chain_batch)
        self.capture = capture if capture is not None else CudaCapture(device)
        self.graphs: dict[DraftGraphKey, object] = {}
        self.replays = 0
        self.sampled_replays = 0  # of them, sampled graphs'
        self.captures = 0  # NOTE: all at start-up; a test checks serving adds none
        self.capture_seconds = 0.0

    def draws_chain(self, key: DraftGraphKey) -> bool:
        """Whether a key's graph draws the sampled second chain too."""
        return key.sampled and self.chain > 0 and key.batch <= self.chain_batch

    def pick(self, batch: int, context: int, sampled: bool = False) -> DraftGraphKey | None:
        """The captured graph a draft step replays (sampled: one that samples any rows), or None
        (eager). Never a key to capture."""
        key = self.plan.pick(batch, context, sampled)
        return key if key in self.graphs else None

    @torch.inference_mode()
    def capture_all(self) -> None:
        """Capture every key the plan can pick, largest first (later ones reuse the pool's memory)."""
        start = time.perf_counter()
        for key in self.plan.all_keys():
            if key not in self.graphs:
                self.graphs[key] = self._capture(key)
        self.capture_seconds += time.perf_counter() - start
        batches = sorted({k.batch for k in self.graphs})
        contexts = sorted({k.context for k in self.graphs})
        sampled = sum(k.sampled for k in self.graphs)
        logger.info("DSpark drafter: %d CUDA graphs (batch %s, context %s; %s) captured in %.1f s; static "
                    "outputs %.1f MiB", len(self.graphs), _span(batches), _span(contexts),
                    f"{sampled} of them for sampled rows, batch 1-{self.plan.sampled_batch}" if sampled
                    else "none for sampled rows", self.capture_seconds, self.outputs.nbytes / 2**20)

    def run_padded(self, key: DraftGraphKey, anchors: Sequence[int], positions: Sequence[int],
                   slot_table: torch.Tensor, temperatures: Sequence[float] | None = None,
                   uniforms=None) -> BlockOutput:
        """padded_inputs (and, for a sampled key, padded_sampling of the rows' temperatures and
        [B, gamma (+ S)] draw uniforms: the block's, then a second chain's) into the persistent host
        buffers, then run()."""
        sampling = (padded_sampling(temperatures, uniforms, key, self.width, self.host_sampling)
                    if key.sampled else None)
        return self.run(key, padded_inputs(anchors, positions, slot_table, key, self.host_flat), len(anchors),
                        sampling)

    @torch.inference_mode()
    def run(self, key: DraftGraphKey, host_flat: torch.Tensor, batch: int,
            host_sampling: torch.Tensor | None = None) -> BlockOutput:
        """host_flat: padded_inputs(...) for `key` (on the device already, or on the CPU); key: a
        captured one (pick()); host_sampling: padded_sampling(...) for a sampled key. -> the block
        output of the first `batch` (real) requests: views of the static outputs, valid until the
        next replay (a sampled key's: out.sampled, else out.greedy)."""
        self.flat[: key.flat_size].copy_(host_flat, non_blocking=True)
        if key.sampled:
            if host_sampling is None:
                raise ValueError("a sampled drafter graph needs its rows' temperatures and uniforms")
            self.sampling[: host_sampling.numel()].copy_(host_sampling, non_blocking=True)
        self.graphs[key].replay()
        self.replays += 1
        self.sampled_replays += key.sampled
        return self.outputs.rows(batch, key.sampled, self.draws_chain(key))

    def _capture(self, key: DraftGraphKey):
        batch = batch_from_flat(self.flat, key, self.feature_width, self.dtype)
        self.flat[: key.flat_size].zero_()  # dummy requests: anchor 0 at position 0, no context
        if key.sampled:
            self.sampling.zero_()  # dummy rows: greedy
            temperatures, uniforms = sampling_from_flat(self.sampling, key, self.width)
            chain = self.chain if self.draws_chain(key) else 0

            def body():
                self.outputs.store(sampled_graph_body(self.drafter, batch, self.pool, temperatures, uniforms, chain))
        else:
            def body():
                self.outputs.store(graph_body(self.drafter, batch, self.pool))

        graph = self.capture(body)
        self.captures += 1
        logger.debug("DSpark drafter: graph for batch %d, context %d%s captured", key.batch, key.context,
                     " (sampled rows)" if key.sampled else "")
        return graph


def _span(values: list[int]) -> str:
    return f"{min(values)}-{max(values)}" if values else "none"


def _round_up_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _round_down_pow2(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n > 0 else 0
