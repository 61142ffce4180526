"""DSpark bursts: several drafting steps of an all-greedy decode batch run back to back on the
device, with one read-back at the end.

A synchronous drafting step is a serial chain: the host lays out the draft, the device drafts,
the host lays out and plans the verify, the device verifies, the host waits, accepts, commits and
schedules the next one. On an H200 at batch 1 that chain took 3.1 ms for 1.64 ms of device work
(benchmarks/NOTES.md, session 9, run 1 row 3), so drafting could not beat a pipelined plain step
(1.0 ms) at an accept length near 2.2. In a burst nothing in an iteration needs the host:

- the drafter reads its anchors and context lengths from device buffers (its attention is a
  masked SDPA over a slot table, plan-free already);
- the verify's attention is `BurstAttention`: keys through the burst's slot table, each row
  seeing the positions at or before its own (read on the device), so no FlashInfer plan (which
  needs the KV lengths on the host) is made per iteration: one Triton kernel a layer on GPUs
  (sglaunch/kernels/burst_attention.py; on the H200 an iteration took 1.72 ms at 1 request with it,
  2.56 ms with its SDPA reference, which CPUs run);
- the greedy accept runs on the device: request r accepts n_r drafts (the leading ones equal to
  the target's greedy choices), its committed tokens are the target's choices at rows 0 .. n_r,
  and its next anchor and position are written back into the input buffers for the next iteration.

One iteration is one CUDA graph per (batch bucket, slot-table width) key, captured at start-up,
replayed N times; each replay's result row ([tokens, log-probabilities, n]) is copied into a
ring, and the ring is read back once. Every window is full (all gamma drafts verified), as in
static mode. KV for N * (gamma + 1) positions per request is reserved before the burst; the stop
rules are applied when the engine commits, so tokens past a stop are dropped and pages that only
held them are freed (`Scheduler._trim_pages`). On a CPU the same body runs eagerly.

Chained bursts (SGLAUNCH_DSPARK_BURST_CHAIN, on by default): the host's work after a burst's rows
are read (commit with the stop rules, statistics, outputs, and the engine loop's sending and
receiving until the next step) took about 1 ms at 32 requests on the development CPU, with the
device idle. So once a burst is committed, if nothing waits and every running request decodes,
the engine plans and launches the batch's next burst at once (`LLMEngine._chain_plan`: the plan the
next step would make) and builds this burst's outputs while the device runs it; the next step
reads it back. Each burst copies its ring rows into one of two pinned host buffers behind its
iterations and records an event (`launch`), and `read` waits for that event only, not for a burst
queued after it.

The engine bursts only when `BurstPolicy` expects it to commit more tokens per second than a plain
step (a start-up profile of bursts of 1 and of N iterations per batch size, i.e. a fixed cost per
burst plus one per iteration, against the pipelined plain decode, and the measured accept length
of past bursts); otherwise the usual planner decides.
"""

from __future__ import annotations

import bisect
import logging
import os
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Sequence

logger = logging.getLogger(__name__)

BURST_ENV = "SGLAUNCH_DSPARK_BURST"  # 0: off; N: at most N iterations a burst; auto: DEFAULT_ITERATIONS on CUDA
SAMPLED_ENV = "SGLAUNCH_DSPARK_SAMPLED_BURST"  # 1 (default): batches with temperature-only sampled rows burst too
# 1 (default): sampled bursts also take rows that filter with top-k, top-p or min-p (their own keys)
FILTERED_ENV = "SGLAUNCH_DSPARK_FILTERED_BURST"
CHAIN_ENV = "SGLAUNCH_DSPARK_BURST_CHAIN"  # 1 (default): launch the next burst before finishing this one
DEFAULT_ITERATIONS = 8
# NOTE: by default a burst of more than WIDE_BATCH requests runs at most WIDE_ITERATIONS: with more
# requests, more of them finish inside a burst and their slots stay empty until it ends. H200,
# session 10 (bench --compare, held-out prompts): at most 8 iterations against 4: 1.23x at 1
# request, 1.06x at 8, 0.82x at 32. Session 15 (run 1, c=8, 1,024 prompts): at most 4 iterations
# against 8 for 8 requests, 8,942 against 8,416 out tok/s (1.06x), TTFT p50 16.0 against 20.8 ms: an
# arrival waits for the burst in flight, and at 8 requests one arrives about every 6 iterations
WIDE_BATCH = 4
WIDE_ITERATIONS = 4
MAX_BATCH = 32  # the largest batch bucket a burst graph is captured for
# bursts of up to this many requests (their batch bucket) verify the second chain, where one is asked for
# (SGLAUNCH_DSPARK_SECOND_CHAIN): H100, session 30 (bench, compact, bursts, median of 3 rounds) two chains
# against one 1.017 / 1.015 / 1.014 at c=1 / 2 / 4; an iteration +6% at 1 request, +11% at 8 (burst_profile),
# for 7.6% more tokens; c=8 0.946 when slot 0 still took topk (benchmarks/gpu30/)
SECOND_CHAIN_MAX_BATCH = 4
# sampled bursts take batches of up to this many requests (their keys are captured up to it). H100, session 38
# (benchmarks/gpu38/call11, T=0.7, HTTP, 64 held-out prompts): DSpark with sampled bursts against plain 1.94 / 1.61 /
# 1.58 at c=1 / 4 / 8 (three rounds) and 1.14 at c=16 (one round), but 0.61 of DSpark without them at c=32 (48% of
# the steps in bursts, TTFT p50 104 against 29 ms); c=16 was measured on a machine whose plain sampled steps ran
# 0.7x of another H100's, so only batches the three-round rows cover burst
SAMPLED_MAX_BATCH = 8
SAMPLED_HEAD = 5  # per-request float inputs of a sampled burst before its uniforms: T, top_k, top_p, min_p, filters
MIN_GAIN = 1.05  # a burst must be expected to commit this much faster than plain decoding
EARLY_STOP_ENV = "SGLAUNCH_DSPARK_BURST_EARLY_STOP"  # 1: a burst ends early for an arrival when that pays
LEAD = 2  # iterations a burst launched a few at a time keeps queued ahead of the device
POLL_S = 5e-5  # how long the host sleeps between looks at the device and the channel meanwhile
RELAX = 0.02  # per step that does not burst, the accept estimate moves this far back toward the prior
DECAY = 0.8  # weight of the old accept estimate per burst


def sampled_from_env() -> bool:
    """SGLAUNCH_DSPARK_SAMPLED_BURST, read once at start-up: whether a burst runner also captures
    sampled iterations (1, the default), so a decode batch whose sampled rows set a temperature
    alone bursts too, or not (0: such a batch takes the usual steps)."""
    from sglaunch.config import env_switch

    return env_switch(SAMPLED_ENV, True)


def filtered_from_env() -> bool:
    """SGLAUNCH_DSPARK_FILTERED_BURST, read once at start-up: whether a runner with sampled
    iterations also captures filtered ones (1, the default), so a small decode batch whose sampled
    rows set top-k, top-p or min-p bursts too (the target's distributions filtered in the graph, as
    the usual step filters them), or not (0: such a batch takes the usual steps)."""
    from sglaunch.config import env_switch

    return env_switch(FILTERED_ENV, True)


def chain_from_env() -> bool:
    """SGLAUNCH_DSPARK_BURST_CHAIN, read once at start-up: whether the engine launches the next burst
    of a batch while it finishes the one before (1, the default) or only after (0)."""
    from sglaunch.config import env_switch

    return env_switch(CHAIN_ENV, True)


def early_stop_from_env(device_type: str) -> bool:
    """SGLAUNCH_DSPARK_BURST_EARLY_STOP, read once at start-up: on (unset on a CUDA device, or 1),
    rank 0 of a one-rank engine queues a burst a few iterations at a time (LEAD ahead of the
    device) and ends it early when a command arrives and BurstPolicy.stop_pays; off (0, or unset
    on a CPU, whose iterations run as they are queued), every iteration is queued at launch.
    H200, session 16: 1.05x at c=2 and 4 over HTTP, TTFT p50 0.76 / 0.85 of whole bursts."""
    from sglaunch.config import env_switch

    return env_switch(EARLY_STOP_ENV, device_type == "cuda")


def wide_cap_from_env() -> int | None:
    """The iterations of a burst of more than WIDE_BATCH requests: WIDE_ITERATIONS by default
    (SGLAUNCH_DSPARK_BURST=auto), none of its own when the variable names a number."""
    return WIDE_ITERATIONS if (os.environ.get(BURST_ENV, "auto").strip().lower() or "auto") == "auto" else None


def iterations_from_env(device_type: str, graphs: bool) -> int:
    """SGLAUNCH_DSPARK_BURST, read once at start-up: 0 (off), a positive number of iterations, or
    auto (the default): DEFAULT_ITERATIONS on a CUDA device with graphs (WIDE_ITERATIONS above
    WIDE_BATCH requests), off elsewhere."""
    value = os.environ.get(BURST_ENV, "auto").strip().lower() or "auto"
    if value == "auto":
        return DEFAULT_ITERATIONS if device_type == "cuda" and graphs else 0
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"{BURST_ENV}={value!r}: expected 0 (off), a number of iterations such as 4, "
                         "or auto (the default)") from None
    if n < 0:
        raise ValueError(f"{BURST_ENV}={value!r}: the number of iterations must be >= 0")
    return n


def triton_attention(device, head_dim: int) -> bool:
    """Whether the burst verify's attention is the Triton kernel: where DSpark's other device
    kernels are (`speculative.kernels.use_triton`: CUDA with Triton, or SGLAUNCH_DSPARK_KERNELS),
    for a power-of-two head_dim >= 16; else its SDPA reference."""
    from sglaunch.speculative.kernels import use_triton

    return use_triton(device) and head_dim >= 16 and head_dim & (head_dim - 1) == 0


@dataclass
class BurstInput:
    """What every rank needs to run a burst of `iterations` for R requests (host values)."""

    anchors: list[int]  # [R] each request's last committed token (not yet in the KV)
    starts: list[int]  # [R] its position (= tokens in the KV)
    page_tables: list  # [R] its pages, covering starts[r] + iterations * (gamma + 1) positions
    iterations: int
    # a burst runner with a second chain: per request gamma + 1 pages of its own (page size 1) for
    # the runner-up chain's window; an iteration the chain wins swaps its pages into the table
    second_pages: list | None = None
    # a sampled burst (some row samples at T > 0, temperature only): each request's temperature (0.0:
    # greedy) and its uniforms [iterations][R][2 * gamma + 1] from its own generator, an iteration's in
    # DSparkDecoder._uniforms' layout (the block's draws, the acceptance tests, the correction / bonus draw)
    temperatures: list[float] | None = None
    uniforms: object = None  # numpy or torch [iterations, R, 2 * gamma + 1], float32
    # a filtered sampled burst (some sampled row sets top-k, top-p or min-p): per request its
    # sampler.filter_settings (top_k, top_p, min_p), None for a row that filters nothing (greedy too)
    filters: list | None = None

    @property
    def sampled(self) -> bool:
        return self.temperatures is not None

    @property
    def filtered(self) -> bool:
        return self.filters is not None


@dataclass
class BurstResult:
    """accepted[k][r]: the drafts request r accepted at iteration k; tokens[r] / logprobs[r]: its
    committed tokens over the whole burst (n + 1 an iteration) and their log-probabilities;
    second_won[k][r]: whether they were the runner-up chain's (a runner with a second chain)."""

    accepted: list[list[int]]
    tokens: list[list[int]]
    logprobs: list[list[float]]
    second_won: list[list[bool]] | None = None

    def request_tokens(self, r: int) -> tuple[list[int], list[float]]:
        return self.tokens[r], self.logprobs[r]

    @classmethod
    def from_rows(cls, rows, gamma: int) -> "BurstResult":
        """rows: float64 numpy [N, R, 2 * (gamma + 1) + 2], an iteration's result per request
        (choices, their log-probabilities, accepted drafts, whether the second chain won; that
        column is 0 without one). NOTE: array work, no loop over
        iterations: a burst of 32 requests commits about 300 tokens, and with chaining this runs
        while the device waits for the next burst's launch."""
        import numpy as np

        Q = gamma + 1
        n = rows[:, :, 2 * Q].astype(np.int64)  # [N, R]
        keep = (np.arange(Q)[None, None, :] <= n[:, :, None]).transpose(1, 0, 2)  # [R, N, Q]
        tokens = rows[:, :, :Q].transpose(1, 0, 2)[keep].astype(np.int64)  # request-major, then k, then i
        lps = rows[:, :, Q: 2 * Q].transpose(1, 0, 2)[keep]
        cuts = np.cumsum((n + 1).sum(axis=0))[:-1]
        won = rows[:, :, 2 * Q + 1] > 0
        return cls(n.tolist(), [t.tolist() for t in np.split(tokens, cuts)], [x.tolist() for x in np.split(lps, cuts)],
                   won.tolist() if won.any() else None)

    def swap_second_pages(self, r: int, start: int, pages, second: list[int]) -> None:
        """Replay, on request r's page table `pages` (from position `start`) and its second
        chain's pages, the swaps the device made where that chain won: its anchor's and accepted
        drafts' pages become the request's, iteration after iteration."""
        if self.second_won is None:
            return
        pos = start
        for accepted, won in zip(self.accepted, self.second_won):
            n = accepted[r]
            if won[r]:
                for i in range(n + 1):
                    pages[pos + i], second[i] = second[i], pages[pos + i]
            pos += n + 1


@dataclass
class PendingBurst:
    """Rank 0's handle on a launched burst: its ring rows on their way into pinned host memory
    (`ready` records when they are there; None on a CPU, where they are there at once).
    A burst launched with fewer iterations queued than planned (`BurstRunner.launch(queue=k)`)
    grows by `extend` and is closed by `close`, which sets `iterations` to the queued ones."""

    requests: int
    iterations: int
    host: object  # torch [max_iterations, B, 2 * Q + 2] float64, pinned on CUDA
    ready: object = None  # torch.cuda.Event
    key: object = None  # BurstKey
    queued: int = 0  # iterations queued on the device so far
    done_events: list = field(default_factory=list)  # CUDA: one event after each queued iteration
    copy: bool = True  # rank 0: its rows go to the host when it is closed
    closed: bool = False


def slot_rows(page_tables, lengths: Sequence[int], page_size: int, width: int, fill: int):
    """[R, width] int64 numpy: the KV slot of positions 0 .. width - 1 of each request; positions
    at or past lengths[r] take `fill` (a padding slot: never written by a real row, masked).
    NOTE: one pass over all requests' pages (their array('i') buffers read without a copy), not a
    numpy sequence per request: built before every burst launch with the device idle (32
    requests at 330 positions, dev CPU, `python benchmarks/burst_host_parts.py slot-rows`: 178 us
    the per-request way, 64 us this way at page size 1; 175 and 133 at 16)."""
    import numpy as np

    R = len(page_tables)
    out = np.full((R, width), fill, dtype=np.int64)
    counts = np.minimum(np.maximum(np.asarray(lengths, dtype=np.int64), 0), width)  # [R] positions kept
    if R == 0 or not counts.any():
        return out
    needed = -(-counts // page_size)  # [R] pages each request's kept positions lie on
    pages = np.concatenate([_int32_view(table)[:k] for table, k in zip(page_tables, needed.tolist())])
    pages = pages.astype(np.int64)
    if page_size == 1:
        slots = pages
    else:
        # every page repeated page_size times, then each request's block cut to its count
        block = needed * page_size  # [R] positions each request's pages cover
        within = np.arange(int(block.sum())) - np.repeat(np.cumsum(block) - block, block)
        keep = within < np.repeat(counts, block)
        slots = (np.repeat(pages, page_size) * page_size + within % page_size)[keep]
    out[np.arange(width)[None, :] < counts[:, None]] = slots  # row-major: request after request
    return out


def _int32_view(table):
    """A page table as int32 numpy: array('i') without a copy, anything else converted."""
    import numpy as np

    if getattr(table, "typecode", None) == "i":
        return np.frombuffer(table, dtype=np.int32)
    return np.asarray(table, dtype=np.int32)


class BurstAttention:
    """Attention of a burst's verify rows: every request has Q query rows at device positions;
    its keys are gathered from the KV pool through a [B, C] slot table, each query seeing the
    columns at or before its own position. No per-step host metadata, so it is captured in a
    CUDA graph whatever the requests' lengths. bind() sets the step's device tensors. On CUDA
    (with Triton) one kernel a layer (sglaunch/kernels/burst_attention.py), elsewhere its torch reference
    (triton_attention)."""

    supports_cuda_graph = True

    def __init__(self, kv_pool, num_heads: int, num_kv_heads: int, head_dim: int, use_triton: bool | None = None):
        self.kv_pool, self.num_heads, self.num_kv_heads, self.head_dim = kv_pool, num_heads, num_kv_heads, head_dim
        self.scale = head_dim**-0.5
        self.meta = None
        self.splits = self.scratch = None
        self.combine, self.counters = "separate", None  # the Triton kernel's split merge (BurstRunner sets them)
        if use_triton is None:
            use_triton = triton_attention(kv_pool.k[0].device, head_dim)
        self.use_triton = use_triton

    def bind(self, slot_table, positions, out_slots, queries: int, dtype=None, splits: int | None = None,
             scratch=None) -> None:
        """The step's device tensors: slot table [B, C], positions and KV slots [B * Q]; for the
        Triton kernel its static number of key splits and their float32 scratch (made before a CUDA
        graph is captured; None: chosen / allocated per call). The reference's mask is built once
        here for every layer: an additive bias [B, 1, g * Q, C] (g = query heads per KV head) in the
        query dtype, for the query groups folded into the query rows."""
        import torch

        self.table, self.queries, self.positions = slot_table, queries, positions
        self.splits, self.scratch = splits, scratch
        self.meta = SimpleNamespace(out_slots=out_slots)
        if self.use_triton:
            return
        B, C = slot_table.shape
        col = torch.arange(C, device=slot_table.device)
        visible = col[None, None, :] <= positions.view(B, queries, 1)  # [B, Q, C]
        group = self.num_heads // self.num_kv_heads
        bias = torch.zeros(B, queries, C, dtype=dtype or torch.float32, device=slot_table.device)
        bias.masked_fill_(~visible, float("-inf"))
        self.bias = bias.repeat(1, group, 1).unsqueeze(1)  # row g * Q + i: query i of the group's head g

    def kv_destination(self, layer: int):
        return self.kv_pool.k[layer], self.kv_pool.v[layer], self.meta.out_slots

    def forward(self, layer: int, q, k, v):
        from sglaunch.kernels.burst_attention import burst_attention_reference, burst_attention_triton

        if k is not None:
            self.kv_pool.write(layer, self.meta.out_slots, k, v)
        k_rows, v_rows = self.kv_pool.k[layer], self.kv_pool.v[layer]
        if self.use_triton:
            return burst_attention_triton(q, k_rows, v_rows, self.table, self.positions, self.queries, self.scale,
                                          splits=self.splits, scratch=self.scratch, combine=self.combine,
                                          counters=self.counters)
        return burst_attention_reference(q, k_rows, v_rows, self.table, self.bias, self.queries, self.scale)


@dataclass(frozen=True)
class BurstKey:
    batch: int  # requests in the graph, dummies included
    context: int  # slot-table width (positions 0 .. context - 1)
    sampled: bool = False  # the sampled iteration (rows at T > 0; BurstRunner._sampled_accept)
    filtered: bool = False  # a sampled iteration whose target rows are filtered (top-k, top-p, min-p)


class BurstRunner:
    """The burst of one rank: static device buffers, one iteration body per BurstKey (a CUDA graph
    captured at start-up on GPUs, run eagerly on CPUs), the ring of per-iteration results."""

    def __init__(self, runner, max_iterations: int, batch_sizes: Sequence[int], max_context: int, graphs: bool,
                 second_chain: bool = False, sampled: bool = False, filtered: bool = False):
        import torch

        from sglaunch.speculative.draft_graphs import MAX_CELLS, MIN_CONTEXT, _round_up_pow2

        self.runner, self.torch = runner, torch
        self.draft = runner.draft
        self.gamma = self.draft.block_size
        self.Q = self.gamma + 1
        # a second chain (SGLAUNCH_DSPARK_SECOND_CHAIN): every iteration of a key of at most
        # SECOND_CHAIN_MAX_BATCH requests also verifies the block's runner-up chain of gamma drafts
        # (the attention's batch doubles: chains x requests rows); larger keys run one chain
        self.second_chain = second_chain
        # sampled keys (SGLAUNCH_DSPARK_SAMPLED_BURST): an iteration for rows at T > 0 (temperature only),
        # one chain, its draws and tests from uniforms every request drew from its own generator
        self.sampled = sampled
        # filtered keys (SGLAUNCH_DSPARK_FILTERED_BURST): sampled ones whose rows may also set top-k,
        # top-p or min-p; the target's distributions go through sampler.sorted_filter (a vocabulary sort
        # per row), which temperature-only bursts do not pay
        self.filtered = sampled and filtered
        self.max_iterations = max_iterations
        self.page_size = runner.kv_pool.page_size
        self.device = runner.device
        self.batch_sizes = sorted(b for b in batch_sizes if b <= MAX_BATCH) or [min(batch_sizes)]
        self.graphs_on = graphs
        self.min_context, self.max_context = MIN_CONTEXT, _round_up_pow2(max(max_context, MIN_CONTEXT))
        self.max_cells = MAX_CELLS
        Bmax = max(self.batch_sizes) if graphs else MAX_BATCH
        self.max_batch = Bmax
        # anchors, starts, live [3 * B], then the slot table: a key's B * C is at most max_cells;
        # then (a second chain) its window's slots [B, Q]
        self.max_flat = 3 * Bmax + max(self.max_cells, Bmax * MIN_CONTEXT) + (Bmax * self.Q if second_chain else 0)
        self._two = SECOND_CHAIN_MAX_BATCH if second_chain else 0  # NOTE: before keys() and the scratch
        heads, kv_heads = runner.spec.num_heads // runner.tp.size, runner.spec.num_kv_heads // runner.tp.size
        self.attn = BurstAttention(runner.kv_pool, heads, kv_heads, runner.spec.head_dim)
        # padding slot: the KV pool's padding page with graphs (dummy rows write there); slot 0
        # without (a CPU burst has no dummy rows, and padding columns are masked)
        pad_page = runner.kv_pool.padding_page
        self.fill_slot = pad_page * self.page_size if pad_page is not None else 0
        dev = self.device
        with torch.inference_mode():
            # flat int64 input: anchors [B], starts [B], live [B], slot table [B, C] (per key)
            self.flat = torch.zeros(self.max_flat, dtype=torch.int64, device=dev)
            self.host_flat = torch.zeros(self.max_flat, dtype=torch.int64, pin_memory=dev.type == "cuda")
            self.result = torch.zeros(Bmax, 2 * self.Q + 2, dtype=torch.float64, device=dev)
            self.ring = torch.zeros(max(1, max_iterations), Bmax, 2 * self.Q + 2, dtype=torch.float64, device=dev)
            # two host copies of the ring: a burst may be launched before the one before it is read
            # (LLMEngine._collect_burst), and each burst's rows go to the copy the other is not using
            self.host_rings = [torch.zeros(self.ring.shape, dtype=torch.float64, pin_memory=dev.type == "cuda")
                               for _ in range(2)]
            self._next_ring = 0
            self.arange = torch.arange(self.Q, device=dev)
            if sampled:
                # a sampled burst's float inputs, one copy: per request its temperature (0.0: greedy,
                # dummies too), top_k, top_p, min_p and whether it filters [5, B] (read by filtered keys
                # only), then the uniforms [max_iterations, B, 2 * gamma + 1]; the iteration counter
                # picks an iteration's row of them inside the graph (zeroed at launch)
                W = 2 * self.gamma + 1
                self.sampled_size = SAMPLED_HEAD * Bmax + max(1, max_iterations) * Bmax * W
                self.sampled_in = torch.zeros(self.sampled_size, dtype=torch.float32, device=dev)
                self.host_sampled = torch.zeros(self.sampled_size, dtype=torch.float32,
                                                pin_memory=dev.type == "cuda")
                self.temps = self.sampled_in[:Bmax]
                self.row_filters = self.sampled_in[Bmax: SAMPLED_HEAD * Bmax].view(SAMPLED_HEAD - 1, Bmax)
                self.uniforms = self.sampled_in[SAMPLED_HEAD * Bmax:].view(max(1, max_iterations), Bmax, W)
                self.iteration = torch.zeros(1, dtype=torch.int64, device=dev)
                self.row_starts = torch.arange(Bmax, device=dev) * self.Q  # each request's anchor row
                self.full_windows = torch.full((Bmax,), self.gamma, dtype=torch.int64, device=dev)
        # the Triton attention's key splits per key (static: a graph captures them) and one float32
        # scratch for their partials, as large as the largest key needs, made before any capture
        self.splits: dict[BurstKey, int] = {}
        self.attn_scratch = None
        if self.attn.use_triton:
            from sglaunch.kernels.burst_attention import combine_from_env, counters_numel, device_sm_count

            self.sm_count = device_sm_count(dev)
            need = max((self._scratch_numel(self._attention_key(key)) for key in self.keys()), default=0)
            self.attn_scratch = torch.empty(need, dtype=torch.float32, device=dev)
            # SGLAUNCH_DSPARK_BURST_COMBINE (read once): "fold" merges the splits in the split kernel,
            # with tickets every launch leaves at 0 (one buffer for every layer, key and replay)
            self.attn.combine = combine_from_env()
            self.attn.counters = torch.zeros(counters_numel(max(Bmax, 2 * self._two), kv_heads), dtype=torch.int32,
                                             device=dev)
        self.graphs: dict[BurstKey, object] = {}
        self.replays = 0
        self.bursts = 0

    # ---- keys -----------------------------------------------------------------------------
    def pick(self, batch: int, context: int, sampled: bool = False, filtered: bool = False) -> BurstKey | None:
        """The key of a burst of `batch` requests touching positions < context (sampled: its sampled
        iteration; filtered: the sampled iteration that filters); None: none fits."""
        from sglaunch.speculative.draft_graphs import _round_up_pow2

        if sampled and not self.takes_sampled(batch, filtered):
            return None
        filtered = sampled and filtered
        width = _round_up_pow2(max(context, self.min_context))
        if not self.graphs_on:
            if batch > self.max_batch or batch * width > self.max_cells or width > self.max_context:
                return None
            return BurstKey(batch, width, sampled, filtered)
        bucket = next((b for b in self.batch_sizes if b >= batch), None)
        key = BurstKey(bucket, width, sampled, filtered) if bucket is not None else None
        return key if key in self.graphs else None

    def takes(self, batch: int) -> bool:
        """Whether some burst holds `batch` requests at all (before any per-request work)."""
        return batch <= (self.max_batch if not self.graphs_on else max(self.batch_sizes, default=0))

    def takes_sampled(self, batch: int, filtered: bool = False) -> bool:
        """Whether a sampled burst (filtered: one whose rows filter) holds `batch` requests: such
        iterations exist and the batch is at most SAMPLED_MAX_BATCH."""
        return (self.sampled and (self.filtered or not filtered) and batch <= SAMPLED_MAX_BATCH
                and self.takes(batch))

    def keys(self) -> list[BurstKey]:
        keys = []
        for b in self.batch_sizes:
            width = self.min_context
            while width <= self.max_context and b * width <= self.max_cells:
                keys.append(BurstKey(b, width))
                if self.sampled and b <= SAMPLED_MAX_BATCH:
                    keys.append(BurstKey(b, width, True))
                    if self.filtered:
                        keys.append(BurstKey(b, width, True, True))
                width *= 2
        return sorted(keys, key=lambda k: (k.batch * k.context, k.batch, k.sampled, k.filtered), reverse=True)

    # ---- the iteration ----------------------------------------------------------------------
    def attention_splits(self, key: BurstKey) -> int:
        """The Triton attention's key splits for a key: from its static shapes and the SM count."""
        from sglaunch.kernels.burst_attention import choose_splits

        if key not in self.splits:
            self.splits[key] = choose_splits(key.batch, self.attn.num_kv_heads, key.context, self.sm_count)
        return self.splits[key]

    def _scratch_numel(self, key: BurstKey) -> int:
        from sglaunch.kernels.burst_attention import scratch_numel

        a = self.attn
        return scratch_numel(key.batch, a.num_heads, a.num_kv_heads, a.head_dim, self.Q, self.attention_splits(key))

    def _attention_scratch(self, key: BurstKey):
        """The scratch of a key's splits: the buffer made at start-up; an eager key beyond the
        captured ones (CPU) grows it, never while a graph is captured."""
        torch, need = self.torch, self._scratch_numel(key)
        if need > self.attn_scratch.numel():
            if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"burst attention scratch of {self.attn_scratch.numel()} for {need} in a capture")
            self.attn_scratch = torch.empty(need, dtype=torch.float32, device=self.device)
        return self.attn_scratch

    def chains(self, key: BurstKey) -> int:
        """The chains a key's iterations verify: 2 with a second chain up to SECOND_CHAIN_MAX_BATCH
        (greedy keys; a sampled key verifies one)."""
        return 2 if key.batch <= self._two and not key.sampled else 1

    def uses_second_chain(self, requests: int, context: int, sampled: bool = False, filtered: bool = False) -> bool:
        """Whether a burst of `requests` touching positions < context verifies a second chain
        (its requests need gamma + 1 second pages each); False where no key fits."""
        key = self.pick(requests, context, sampled, filtered)
        return key is not None and self.chains(key) == 2

    def _attention_key(self, key: BurstKey) -> BurstKey:
        """The attention's shape of a key: one row block per request and chain."""
        return BurstKey(key.batch * self.chains(key), key.context)

    def _views(self, key: BurstKey):
        B, C = key.batch, key.context
        f = self.flat
        return f[:B], f[B: 2 * B], f[2 * B: 3 * B], f[3 * B: 3 * B + B * C].view(B, C)

    def _second_view(self, key: BurstKey):
        """The second chain's window slots [B, Q], after the key's slot table in the flat input."""
        B, C = key.batch, key.context
        return self.flat[3 * B + B * C: 3 * B + B * C + B * self.Q].view(B, self.Q)

    def flat_size(self, key: BurstKey) -> int:
        return 3 * key.batch + key.batch * key.context + (key.batch * self.Q if self.chains(key) == 2 else 0)

    def _body(self, key: BurstKey) -> None:
        """One drafting step of the burst, from and into the static buffers."""
        torch, runner, G, Q = self.torch, self.runner, self.gamma, self.Q
        from sglaunch.speculative.drafter import DraftBatch

        anchors, starts, live, table = self._views(key)
        B, C = key.batch, key.context
        empty = anchors.new_empty(0)
        drafter = self.draft.drafter
        batch = DraftBatch(anchor_tokens=anchors, anchor_positions=starts,
                           ctx_features=torch.empty(0, drafter.config.num_features * drafter.config.hidden_size,
                                                    dtype=drafter.dtype, device=anchors.device),
                           ctx_positions=empty, ctx_slots=empty, slot_table=table, ctx_lens=starts)
        out = drafter.forward_block(batch, self.draft.pool)
        chains = self.chains(key)
        if key.sampled:  # each row's draws at its temperature (argmax where 0), this iteration's uniforms
            temps = self.temps[:B]
            u = self.uniforms.index_select(0, self.iteration)[0, :B]  # [B, 2G + 1]
            block = drafter.burst_sampled_block(out, anchors, temps, u[:, :G])
            drafts = block.tokens
        elif chains == 2:  # both chains in one Markov loop (no more launches a slot than one)
            block, drafts2 = drafter.greedy_two_chains(out, anchors, confidence=False)
            drafts = block.tokens  # [B, G]
        else:
            drafts = drafter.greedy_block(out, anchors, confidence=False).tokens  # [B, G]
        ids = torch.cat([anchors[:, None], drafts], dim=1).reshape(-1)  # [B * Q]
        grid = (starts[:, None] + self.arange[None, :]).clamp_(max=C - 1)  # [B, Q]
        slots = table.gather(1, grid).reshape(-1)
        positions = grid.reshape(-1)
        tables = table
        if chains == 2:  # the runner-up chain: the same positions, its own slots from the anchor on
            second = self._second_view(key)
            ids = torch.cat([ids, torch.cat([anchors[:, None], drafts2], dim=1).reshape(-1)])
            tables = torch.cat([table, table.scatter(1, grid, second)])  # [2B, C]
            slots = torch.cat([slots, second.reshape(-1)])
            positions = torch.cat([positions, positions])
        akey = self._attention_key(key)
        if self.attn.use_triton:
            self.attn.bind(tables, positions, slots, Q, runner.model_dtype, splits=self.attention_splits(akey),
                           scratch=self._attention_scratch(akey))
        else:
            self.attn.bind(tables, positions, slots, Q, runner.model_dtype)
        hidden, features = runner.model.forward_with_features(ids, positions, self.attn, self.draft.layer_ids)
        self.draft.write_context(features, positions, slots)
        logits = runner.model.compute_logits(hidden)  # [B * Q, V], the model dtype
        if key.sampled:
            choice, lp, n = self._sampled_accept(B, logits, drafts, block, temps, u, key.filtered)
            self.iteration.add_(1)
        else:
            # the argmax and its log-probability in float32: one pass of the fused kernel over the
            # model-dtype logits where the Triton attention runs (sglaunch/kernels/vocab_reduce.py), its reference otherwise
            from sglaunch.kernels.vocab_reduce import greedy_logprob

            choice, lp = greedy_logprob(logits, self.attn.use_triton)
            choice, lp = choice.view(chains * B, Q), lp.view(chains * B, Q)
            n = torch.cumprod(drafts == choice[:B, :G], dim=1).sum(dim=1)  # [B] accepted drafts (bool cumprod: int64)
        if chains == 2:  # the runner-up chain where it commits more (only after a rejected first draft)
            n2 = torch.cumprod(drafts2 == choice[B:, :G], dim=1).sum(dim=1)
            won = n2 > n
            n = torch.where(won, n2, n)
            choice = torch.where(won[:, None], choice[B:], choice[:B])
            lp = torch.where(won[:, None], lp[B:], lp[:B])
            # its anchor's and accepted drafts' slots become the request's (the K/V and draft context
            # there are the winner's), the ones they replace the chain's for the next iteration
            swap = won[:, None] & (self.arange[None, :] <= n[:, None])  # [B, Q]
            mine = table.gather(1, grid)
            table.scatter_(1, grid, torch.where(swap, second, mine))
            second.copy_(torch.where(swap, mine, second))
            self.result[:B, 2 * Q + 1].copy_(won)
        elif self.second_chain:  # NOTE: the result buffer is every key's: a two-chain key's flags stay there
            self.result[:B, 2 * Q + 1].zero_()
        self.result[:B, :Q].copy_(choice)
        self.result[:B, Q: 2 * Q].copy_(lp)
        self.result[:B, 2 * Q].copy_(n)
        # the next iteration's inputs, written in place (no copy): anchor = the choice after the last
        # accepted draft, start + n + 1; dummy rows (live 0) stay at token 0, position 0
        torch.mul(choice.gather(1, n[:, None])[:, 0], live, out=anchors)
        starts.addcmul_(n + 1, live)

    def _sampled_accept(self, B: int, logits, drafts, block, temps, u, filtered: bool = False):
        """A sampled iteration's accept, on the device: the target rows' distributions at each row's
        temperature (softmax(logits / T), what the engine samples from for a temperature-only
        request; greedy rows keep T = 1, their argmax alone is read), the DSpark accept rule over
        the whole window (the Triton kernel on GPUs, with the uniforms' tests and correction / bonus
        draw); a filtered key's rows that filter go through top-k, top-p and min-p as the usual
        step's (sampler.sorted_filter; the drafter's draws stay at the temperature alone, as there),
        so the output is distributed as the target's own sampling (speculative/accept.py).
        -> (committed tokens [B, Q]: the accepted drafts, then the correction or bonus token at slot
        n and repeated after it; their log-probabilities under the unmodified distribution, as the
        usual step reports them; n [B] int64)."""
        torch, G, Q = self.torch, self.gamma, self.Q
        from sglaunch.engine.sampler import GREEDY_TEMPERATURE
        from sglaunch.speculative import kernels
        from sglaunch.speculative.accept import committed_grid

        greedy = temps < GREEDY_TEMPERATURE
        scale = torch.where(greedy, torch.ones_like(temps), temps)[:, None].expand(B, Q).reshape(-1)  # [B * Q]
        flat = logits.float()
        target = torch.softmax(flat / scale[:, None], dim=-1)  # [B * Q, V]
        if filtered:
            from sglaunch.engine.sampler import sorted_filter

            top_k, top_p, min_p, on = (x[:B, None].expand(B, Q).reshape(-1, 1) for x in self.row_filters)
            # NOTE: every row is sorted (a graph has no row count of its own); rows that filter nothing
            # keep their softmax, as the usual step's mixed batch does
            target = torch.where(on > 0, sorted_filter(target, top_k, top_p, min_p), target)
        q = self.draft.drafter.expand_probs(block.probs)  # [B, G, V]: what each draft was drawn from
        result = kernels.accept(drafts, q, target, self.row_starts[:B], self.full_windows[:B], greedy,
                                u[:, G: 2 * G], u[:, 2 * G])
        committed = committed_grid(drafts, result)  # [B, Q]
        lp = flat.gather(1, committed.reshape(-1, 1))[:, 0] - torch.logsumexp(flat, dim=-1)
        return committed, lp.view(B, Q), result.num_accepted.long()

    @property
    def captured(self) -> int:
        return len(self.graphs)

    def capture_all(self) -> None:
        """Every key, largest first, into one graph pool (GPU with graphs only)."""
        torch = self.torch
        if not self.graphs_on:
            return
        start, pool = time.perf_counter(), torch.cuda.graph_pool_handle()
        with torch.inference_mode():
            for key in self.keys():
                anchors, starts, live, table = self._views(key)
                anchors.zero_(), starts.zero_(), live.zero_()
                table.fill_(self.fill_slot)
                if self.chains(key) == 2:
                    self._second_view(key).fill_(self.fill_slot)
                if key.sampled:  # every row greedy, iteration 0
                    self.sampled_in.zero_()
                    self.iteration.zero_()
                self._body(key)  # warm-up (dummy rows only: they write the padding page)
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._body(key)
                self.graphs[key] = graph
        logger.info("DSpark bursts: %d CUDA graphs (batch %s, context %d-%d%s) captured in %.1f s", len(self.graphs),
                    ",".join(map(str, self.batch_sizes)), self.min_context,
                    max((k.context for k in self.graphs), default=0), ", greedy and sampled" if self.sampled else "",
                    time.perf_counter() - start)

    # ---- a burst -------------------------------------------------------------------------
    def context_needed(self, starts: Sequence[int], iterations: int) -> int:
        return max(starts) + iterations * self.Q

    def run(self, burst: BurstInput, read: bool = True) -> BurstResult | None:
        """All iterations of a burst on this rank; rank 0 (read=True) waits for and reads its results."""
        pending = self.launch(burst, copy=read)
        return self.read(pending) if read else None

    def launch(self, burst: BurstInput, copy: bool = True, queue: int | None = None) -> PendingBurst:
        """Queue a burst's iterations on the device and (copy=True, rank 0) the copy of its ring
        rows to pinned host memory; returns at once on CUDA. queue=k (rank 0, one rank): queue
        only the first k iterations; `extend` queues more and `close` ends the burst where it is
        (LLMEngine._drive_burst). NOTE: the host buffers it fills were last read by a burst that
        has been read back (the engine launches at most one burst ahead)."""
        import numpy as np

        torch, Q = self.torch, self.Q
        R, N = len(burst.anchors), burst.iterations
        if not 1 <= N <= self.max_iterations:
            raise ValueError(f"a burst of {N} iterations (at most {self.max_iterations})")
        key = self.pick(R, self.context_needed(burst.starts, N), burst.sampled, burst.filtered)
        if key is None:
            kind = "filtered " if burst.filtered else "sampled " if burst.sampled else ""
            raise ValueError(f"no {kind}burst graph for {R} requests up to position "
                             f"{self.context_needed(burst.starts, N)}")
        B, C = key.batch, key.context
        size = self.flat_size(key)
        host = self.host_flat[:size].numpy()
        host[: 3 * B] = 0
        host[:R] = burst.anchors
        host[B: B + R] = burst.starts
        host[2 * B: 2 * B + R] = 1
        lengths = [s + N * Q for s in burst.starts]
        grid = host[3 * B: 3 * B + B * C].reshape(B, C)
        grid[:R] = slot_rows(burst.page_tables, lengths, self.page_size, C, self.fill_slot)
        grid[R:] = self.fill_slot
        if self.chains(key) == 2:
            if burst.second_pages is None or len(burst.second_pages) != R:
                raise ValueError("a burst runner with a second chain needs gamma + 1 second pages per request")
            second = host[3 * B + B * C: size].reshape(B, Q)
            second[:R] = np.asarray(burst.second_pages, dtype=np.int64).reshape(R, Q) * self.page_size
            second[R:] = self.fill_slot
        pending = PendingBurst(R, N, None, key=key, copy=copy)
        if key.sampled:
            self._load_sampled(burst)
        with torch.inference_mode():
            self.flat[:size].copy_(self.host_flat[:size], non_blocking=True)
            if key.sampled:
                self.sampled_in.copy_(self.host_sampled, non_blocking=True)
                self.iteration.zero_()
        self.bursts += 1
        incremental = queue is not None and queue < N
        for _ in range(min(N, queue) if incremental else N):
            self._queue_iteration(pending, events=incremental)
        if not incremental:
            self.close(pending)
        return pending

    def _load_sampled(self, burst: BurstInput) -> None:
        """A sampled burst's temperatures, filter settings and uniforms into the pinned host buffer
        (rows that filter nothing: top_k = vocabulary, top_p = 1, min_p = 0, off). Greedy rows (T = 0),
        dummy rows and unused iterations: temperature 0 and draws at 0.5 (burst_sampled_block: the
        argmax), their tests and correction draws 0 (never read: greedy rows accept by the argmax)."""
        import numpy as np

        from sglaunch.engine.sampler import GREEDY_TEMPERATURE

        R, N, W, G = len(burst.anchors), burst.iterations, 2 * self.gamma + 1, self.gamma
        host = self.host_sampled.numpy()
        host[:] = 0.0
        temps = np.asarray(burst.temperatures, dtype=np.float32)
        host[:R] = temps
        u = np.asarray(burst.uniforms, dtype=np.float32)
        if u.shape != (N, R, W):
            raise ValueError(f"a sampled burst of {N} iterations for {R} requests takes uniforms [{N}, {R}, {W}], "
                             f"not {list(u.shape)}")
        Bmax = self.max_batch
        head = host[: SAMPLED_HEAD * Bmax].reshape(SAMPLED_HEAD, Bmax)
        head[1], head[2] = float(self.runner.spec.vocab_size), 1.0  # top_k, top_p: keep every token
        if burst.filtered:
            if len(burst.filters) != R:
                raise ValueError(f"a filtered burst of {R} requests takes {R} filter settings, "
                                 f"not {len(burst.filters)}")
            for r, setting in enumerate(burst.filters):
                if setting is not None:
                    head[1:4, r] = setting
                    head[4, r] = 1.0
        rows = host[SAMPLED_HEAD * Bmax:].reshape(-1, Bmax, W)
        rows[:, :, :G] = 0.5
        sampled = temps >= GREEDY_TEMPERATURE
        rows[:N, :R][:, sampled] = u[:, sampled]

    def _queue_iteration(self, pending: PendingBurst, events: bool) -> None:
        """One more iteration of a burst: the key's graph replayed (its body run eagerly without
        one), its result row copied into the ring; events=True: an event recorded after it, for
        `iterations_done`."""
        torch, k, B = self.torch, pending.queued, pending.key.batch
        if k >= pending.iterations:
            raise ValueError(f"a burst of {pending.iterations} iterations has all of them queued")
        with torch.inference_mode():
            graph = self.graphs.get(pending.key)
            if graph is not None:
                graph.replay()
            else:
                self._body(pending.key)
            self.ring[k, :B].copy_(self.result[:B])
        pending.queued += 1
        self.replays += 1
        if events and self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
            pending.done_events.append(event)

    def extend(self, pending: PendingBurst) -> None:
        """Queue the next iteration of a burst launched with fewer queued than planned."""
        self._queue_iteration(pending, events=True)

    def iterations_done(self, pending: PendingBurst) -> int:
        """How many of its queued iterations the device has finished (all of them on a CPU, where
        each ran when it was queued). NOTE: event queries, no wait."""
        if self.device.type != "cuda":
            return pending.queued
        done = 0
        for event in pending.done_events:  # NOTE: in order; at most max_iterations of them
            if not event.query():
                break
            done += 1
        return done

    def close(self, pending: PendingBurst) -> None:
        """End a burst at the iterations queued so far: `iterations` becomes that count and (rank
        0) its ring rows are copied into the free pinned host ring behind them, with `ready`."""
        if pending.closed:
            return
        pending.closed, pending.iterations = True, pending.queued
        if not pending.copy:
            return
        torch = self.torch
        ring = self.host_rings[self._next_ring]
        self._next_ring ^= 1
        pending.host = ring
        with torch.inference_mode():
            ring[: pending.queued].copy_(self.ring[: pending.queued], non_blocking=True)
        if self.device.type == "cuda":
            pending.ready = torch.cuda.Event()
            pending.ready.record()

    def read(self, pending: PendingBurst) -> BurstResult:
        """Wait for a launched burst (its rows only, not what was queued after it) and parse them."""
        self.close(pending)
        if pending.ready is not None:
            pending.ready.synchronize()  # NOTE: the burst's one wait
        rows = pending.host[: pending.iterations, : pending.requests].numpy()
        return BurstResult.from_rows(rows, self.gamma)


@dataclass
class BurstPolicy:
    """When to burst (rank 0, torch-free). A burst of N iterations for R requests is expected to
    take fixed(R) + N * iteration(R) seconds (start-up profile: bursts of 1 and of the most
    iterations, times the measured/profiled scale of past bursts) and to commit R * N * A tokens
    (A: the measured accept length of past bursts, the planner's prior before any); a pipelined
    plain step commits R tokens in plain_seconds. It bursts when that rate beats plain by MIN_GAIN.
    Without a profile (static mode, CPU) it always bursts."""

    gamma: int
    max_iterations: int
    costs: dict[int, float] = field(default_factory=dict)  # requests -> seconds per iteration (profiled)
    fixed: dict[int, float] = field(default_factory=dict)  # requests -> seconds per burst besides its iterations
    accept: float | None = None  # running estimate of committed tokens per request-iteration
    scale: float = 1.0  # measured / profiled seconds of a burst (until one is timed: plain's scale where under 1)
    wide_cap: int | None = None  # most iterations of a burst of more than WIDE_BATCH requests
    bursts: int = 0
    timed: int = 0  # bursts whose wall time taught the scale (observe)
    burst_iterations: int = 0
    chained: int = 0  # bursts launched while the one before was finished (LLMEngine._collect_burst)
    stopped: int = 0  # bursts ended early for an arrival (LLMEngine._drive_burst)
    stopped_iterations: int = 0  # the iterations those bursts did not run
    declined: int = 0
    skipped: Counter = field(default_factory=Counter)  # why a step did not burst -> steps

    def skip(self, why: str, count: bool = True) -> None:
        """Count a step that did not burst, by reason (prefill, sampled, not worth, kv, ...); None,
        which _burst_plan returns."""
        if count:
            self.skipped[why] += 1
        return None

    def burst_seconds(self, requests: int, iterations: int) -> float | None:
        if not self.costs:
            return None
        fixed = _interpolate(self.fixed, requests) if self.fixed else 0.0
        return (fixed + iterations * _interpolate(self.costs, requests)) * self.scale

    def stop_pays(self, requests: int, remaining: int) -> bool:
        """Whether ending a burst of `requests` with `remaining` iterations not yet queued pays for
        a request that waits to be admitted: it starts that many iterations sooner (about one
        request-iteration of tokens each), and the batch pays one more burst's fixed cost, worth
        (requests + 1) x fixed / iteration request-iterations. Without a profile (CPU, static
        mode): always."""
        if remaining < 1:
            return False
        if not self.costs:
            return True
        fixed = _interpolate(self.fixed, requests) if self.fixed else 0.0
        return remaining > (requests + 1) * fixed / _interpolate(self.costs, requests)

    def expected_accept(self, prior: float) -> float:
        return self.accept if self.accept is not None else prior

    def worth(self, requests: int, plain_seconds: float | None, prior: float, iterations: int = 1,
              count: bool = True, plain_scale: float = 1.0) -> bool:
        """Whether a burst of `iterations` for `requests` pays against a plain step of
        plain_seconds (profiled; None: no basis to compare: burst) times plain_scale (measured /
        profiled on stepped-aside steps), a scale counted only where it makes plain cheaper.
        count=False: a look ahead that the next step repeats (no decline counted, no drift).
        NOTE: the plain scale is learned on stepped-aside steps only, so while a batch bursts it
        is never corrected; one learned high at a load change held bursts of a drafter its target
        never accepted (H100, session 22, random target weights: accept 1.00, 57% of c=1's steps
        in bursts at 1.35 ms a token against plain's 0.99 ms; DSpark 0.82x of plain). A burst must
        beat plain as the start-up profile prices it. Until a burst has been timed, its scale is
        plain's where that is under 1: a start-up profile that ran slow (the first server on a fresh
        machine) priced bursts as high as plain steps, and plain's scale alone would have made plain
        the cheaper against a burst nothing had corrected (H100, session 44, T=0.7, c=8: plain scale
        0.73, 347 declines, the declined streak skipped the draft context; DSpark 0.943 of plain that
        round against 1.114 and 1.044 in the next two)."""
        if self.timed == 0:
            self.scale = min(1.0, plain_scale)
        seconds = self.burst_seconds(requests, iterations)
        if seconds is None or plain_seconds is None:
            return True
        plain_seconds *= min(1.0, plain_scale)
        rate = requests * iterations * self.expected_accept(prior) / seconds
        ok = rate >= MIN_GAIN * requests / plain_seconds
        if not ok and count:
            self.declined += 1
            if self.accept is not None:  # NOTE: drift back toward the prior so a bad patch is retried
                self.accept += RELAX * (prior - self.accept)
        return ok

    def iterations(self, left_new: Sequence[int], left_context: Sequence[int], prior: float) -> int:
        """Iterations of the next burst: at most max_iterations, none past any request's context
        (left_context: positions left before the context length, per request), and no more than
        the request furthest from its max_new_tokens is expected to need. NOTE: not fewer for a
        request near its end: it stops inside the burst (its later rows are dropped), and a short
        burst pays its fixed cost for few tokens (H200, session 10: bursts cut to one iteration by
        the nearest request made DSpark 0.6x of plain at 32 requests)."""
        q = self.gamma + 1
        by_context = min(c // q for c in left_context)
        per_iteration = max(1.0, self.expected_accept(prior))
        by_length = max(1, int(-(-max(left_new) // per_iteration)))
        most = self.max_iterations
        if self.wide_cap is not None and len(left_new) > WIDE_BATCH:
            most = min(most, self.wide_cap)
        return max(0, min(most, by_context, by_length))

    def observe(self, accepted: list[list[int]], seconds: float, requests: int) -> None:
        """A burst's accepted drafts [N][R] and wall time: the accept estimate and the cost scale."""
        self.bursts += 1
        self.burst_iterations += len(accepted)
        n = sum(len(row) for row in accepted)
        if n:
            mean = 1.0 + sum(map(sum, accepted)) / n
            self.accept = mean if self.accept is None else DECAY * self.accept + (1 - DECAY) * mean
        modelled = self.burst_seconds(requests, len(accepted))
        if modelled and accepted:
            ratio = seconds / (modelled / self.scale)
            if 1 / 3 <= ratio <= 3:  # NOTE: a GC pause or a first replay is no steady-state cost
                self.scale = 0.9 * self.scale + 0.1 * ratio
                self.timed += 1


def _interpolate(points: dict[int, float], x: int) -> float:
    """Piecewise-linear in the request count; past the largest point, proportional to it."""
    xs = sorted(points)
    i = bisect.bisect_left(xs, x)
    if i < len(xs) and xs[i] == x:
        return points[x]
    if i == 0:
        return points[xs[0]]
    if i == len(xs):
        return points[xs[-1]] * x / xs[-1]
    lo, hi = xs[i - 1], xs[i]
    w = (x - lo) / (hi - lo)
    return (1 - w) * points[lo] + w * points[hi]


def profile_costs(engine, counts: Sequence[int], context_len: int = 128,
                  repeats: int = 5, sampled: bool = False,
                  filtered: bool = False) -> tuple[dict[int, float], dict[int, float]]:
    """-> (seconds per burst iteration, seconds per burst besides its iterations), by number of
    requests: synthetic greedy requests (sampled: at temperature 1, the sampled iteration; filtered:
    with top-p 0.9 too, the filtered one) at
    position context_len, bursts of one iteration and of the runner's most, the median of
    `repeats` each (after two warm-ups), on every rank; up to the largest count the free KV pool
    holds at once."""
    import math
    import random

    import torch

    runner = engine.runner.burst
    rng, per_iteration, fixed, N = random.Random(3), {}, {}, runner.max_iterations
    uniform_rng = torch.Generator().manual_seed(3)
    cuda = engine.runner.device.type == "cuda"
    vocab, page = engine.runner.spec.vocab_size, engine.config.page_size

    def make(anchors, tables, iterations: int, second) -> BurstInput:
        burst = BurstInput(anchors, [context_len] * len(anchors), tables, iterations, second)
        if sampled:
            burst.temperatures = [1.0] * len(anchors)
            burst.uniforms = torch.rand(iterations, len(anchors), 2 * runner.gamma + 1, generator=uniform_rng)
            if filtered:
                burst.filters = [(vocab, 0.9, 0.0)] * len(anchors)
        return burst

    def timed(burst) -> float:
        times = []
        for _ in range(2 + repeats):
            if cuda:
                torch.cuda.synchronize(engine.runner.device)
            start = time.perf_counter()
            engine._on_all_ranks("burst", burst, engine.runner.run_burst)
            times.append(time.perf_counter() - start)
        return statistics.median(times[2:])

    for R in counts:
        if runner.pick(R, context_len + N * runner.Q, sampled, filtered) is None:
            continue
        borrowed: list[int] = []
        try:
            tables, second = [], []
            for _ in range(R):
                pages = engine.allocator.alloc(math.ceil((context_len + N * runner.Q) / page))
                two = runner.uses_second_chain(R, context_len + N * runner.Q, sampled, filtered)
                extra = engine.allocator.alloc(runner.Q) if pages is not None and two else []
                if pages is None or extra is None:
                    borrowed += pages or []
                    break
                borrowed += pages + extra
                tables.append(pages)
                second.append(extra)
            if len(tables) < R:  # NOTE: the free pool holds no more: larger batches are extrapolated
                break
            anchors = [rng.randrange(vocab) for _ in range(R)]
            two = runner.uses_second_chain(R, context_len + N * runner.Q, sampled, filtered)
            second_pages = second if two else None
            one = timed(make(anchors, tables, 1, second_pages))
            most = timed(make(anchors, tables, N, second_pages)) if N > 1 else one
            step = (most - one) / (N - 1) if N > 1 else one
            per_iteration[R] = max(step, most / N / 2)  # NOTE: noise cannot make an iteration nearly free
            fixed[R] = max(0.0, most - N * per_iteration[R])
        finally:
            engine.allocator.free(borrowed)
    return per_iteration, fixed
