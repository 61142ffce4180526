"""CUDA graphs of the target model's forward (GPU, FlashInfer attention only).

Two families, captured at start-up largest first into one shared memory pool:

- decode graphs, one per batch-size bucket (1, 2, 4, 8, 16, 24, ... up to --cuda-graph-max-bs):
  every request has one query token; a batch of b requests replays the smallest bucket B >= b,
  padded with B - b dummy requests (one token each, on the KV pool's padding page);
- ragged graphs, one per tier of TOTAL tokens (bucket * (gamma + 1) with DSpark, bucket * 8
  without, plus any tiers in SGLANG_DSPARK_RAGGED_CAPTURE_TOKEN_BUCKETS): a ragged step of t tokens
  over b requests replays the smallest tier T >= t. They serve DSpark's verify steps and, unless
  SGLAUNCH_MIXED_GRAPHS=0, the steps that mix a prefill chunk of at most MIXED_MAX_QUERY tokens
  into a decode batch (every arrival under load: run eagerly, such a step cost about three decode
  steps on an H200, and staggered arrivals put one in most steps). Its batch is fixed at
  min(T, max_bs) + 1 requests so there is always a spare one: the first dummy owns the T - t
  padding rows (its own causal attention over the padding page), the others have no query rows.
  FlashInfer's prefill plan in CUDA-graph mode sizes its tiles for the longest request the fixed
  total and batch allow (T - B + 1 rows), so any split of the T rows among the requests replays.

With a DSpark drafter every graph writes the draft context K/V itself, so no eager draft work
follows a replay; with SGLAUNCH_DRAFT_CUDA_GRAPH=0 (which also turns the drafter's own graphs off)
the target features are copied to a static buffer and the model runner writes the draft context
from them after the replay.

Steps that fit no graph (longer prefill chunks, batches over the largest bucket,
page tables over the fixed index buffer) run eagerly. The torch attention backend builds
shape-dependent metadata per step, so graphs are only used with FlashInfer.

The layout logic (buckets, tiers, choosing a graph, padding a StepInput, writing a padded step's
inputs into host arrays: fill_padded) is plain Python and numpy, unit-tested on the CPU;
CudaGraphRunner is the part that touches the GPU.

A replay's host work: fill_padded writes the padded step's static rows (ids, positions, KV slots)
and FlashInfer's plan arrays straight into one of two persistent pinned HostLayouts (alternating,
each with the event recorded after the copies that read it), one non-blocking copy each moves the
rows and the page indices into the graph's static buffers, and the plan reads the indptrs and
last-page lengths from the pinned arrays (FlashInfer copies them without waiting).
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from array import array
from dataclasses import dataclass

import numpy as np

from sglaunch.config import env_int, env_switch
from sglaunch.engine.progress import step_bar
from sglaunch.engine.step import StepInput

logger = logging.getLogger(__name__)

FIRST_BUCKETS = (1, 2, 4, 8)
BUCKET_STEP = 8
TIERS_ENV = "SGLANG_DSPARK_RAGGED_CAPTURE_TOKEN_BUCKETS"  # extra verify tiers, e.g. "12,20,48"
MIXED_ENV = "SGLAUNCH_MIXED_GRAPHS"  # 0: a step with a prefill chunk runs eagerly (ragged graphs: verify only)
CONTEXT_SKIP_ENV = "SGLAUNCH_DSPARK_SKIP_CONTEXT"  # 1: plain decode steps at load skip the draft context
MIXED_WIDTH = 8  # ragged tiers of an engine without DSpark: each decode bucket times this
MIXED_MAX_QUERY = 0  # longest query (prefill chunk) a ragged graph takes; 0 (default): whatever fits the largest tier
# NOTE: any split of a tier's rows is correct (FlashInfer's graph plan sizes its tiles from the tier's
# total and batch alone), and an eager step costs 11-16 ms of host work on the H200 before its tokens.
# Session 18 (benchmarks/gpu18/run1): beside 64 decodes, a 512- / 1,024-token chunk cost 16.7 / 15.2 ms
# more than the decode step eagerly (the limit of then, 256) and 2.6 / 3.0 ms in a ragged graph; HTTP
# with 1,024-token prompts served 1.05x (c=16) and 1.15x (c=64) of the eager limit
MIXED_MAX_QUERY_ENV = "SGLAUNCH_MIXED_MAX_QUERY"
MAX_GRAPH_PAGES = 1 << 25  # cap of the shared page-index buffer (int32 entries)
HOST_PAGES = 1 << 20  # initial page-index room of a HostLayout (4 MiB); it grows up to max_pages


def capture_batch_sizes(max_bs: int) -> list[int]:
    """Decode buckets: 1, 2, 4, 8, then every 8 up to max_bs (max_bs itself always included)."""
    if max_bs < 1:
        raise ValueError(f"--cuda-graph-max-bs must be at least 1, got {max_bs}")
    sizes = {b for b in FIRST_BUCKETS if b < max_bs} | set(range(2 * BUCKET_STEP, max_bs, BUCKET_STEP))
    return sorted(sizes | {max_bs})


def parse_extra_tiers(value: str | None) -> tuple[int, ...]:
    if not value:
        return ()
    try:
        tiers = tuple(int(v) for v in value.replace(" ", "").split(",") if v)
    except ValueError:
        raise ValueError(f"{TIERS_ENV}={value!r}: expected comma-separated token counts, e.g. 12,20,48") from None
    if any(t < 1 for t in tiers):
        raise ValueError(f"{TIERS_ENV}={value!r}: token counts must be positive")
    return tiers


def verify_token_tiers(batch_sizes: list[int], window: int, extra: tuple[int, ...] = ()) -> list[int]:
    """Total-token tiers of the verify graphs: each bucket times the window (upstream's grid), plus
    the extra tiers that are not larger than the largest one."""
    grid = {b * window for b in batch_sizes}
    return sorted(grid | {t for t in extra if t <= max(grid)})


def verify_batch_size(tier: int, max_bs: int) -> int:
    """Requests in the verify graph of `tier`: as many as can have a token, plus the spare dummy."""
    return min(tier, max_bs) + 1


@dataclass(frozen=True)
class GraphKey:
    decode: bool
    batch_size: int  # requests in the graph, dummies included
    num_tokens: int  # query rows in the graph, padding included
    context: bool = True  # False: a DSpark decode graph that writes no draft context (StepInput.draft_context)

    def __str__(self) -> str:
        if self.decode:
            return f"decode bs={self.batch_size}" + ("" if self.context else " (no draft context)")
        return f"ragged tokens={self.num_tokens} (bs {self.batch_size})"


def _pages(tokens: int, page_size: int) -> int:
    return max(1, -(-tokens // page_size))


@dataclass(frozen=True)
class GraphPlan:
    """Which graphs exist and which one a step replays."""

    decode_sizes: tuple[int, ...]
    verify_tiers: tuple[int, ...]  # the ragged graphs' total tokens (empty: none)
    max_bs: int
    window: int  # gamma + 1 with DSpark, else 0
    page_size: int
    max_pages: int  # capacity of the shared page-index buffer
    max_query: int = 0  # most query rows of one request in a ragged graph (window; MIXED_MAX_QUERY with mixed steps)
    contextless: bool = False  # DSpark: decode graphs without the draft context write too

    @classmethod
    def build(cls, max_bs: int, window: int, context_length: int, page_size: int,
              extra_tiers: tuple[int, ...] = (), mixed: bool = False, contextless: bool = False,
              mixed_max_query: int = MIXED_MAX_QUERY) -> GraphPlan:
        """mixed: ragged graphs also take a prefill chunk of up to mixed_max_query tokens (0: up to
        the largest tier) beside decodes (verify windows beside it with DSpark); without DSpark
        they exist for that alone. contextless: each decode size also without the draft context
        write, for the steps that skip it (DSpark with the write in its graphs)."""
        sizes = capture_batch_sizes(max_bs)
        width = window or (MIXED_WIDTH if mixed else 0)
        tiers = verify_token_tiers(sizes, width, extra_tiers) if width else []
        max_tokens = max([max_bs, *tiers])
        per_request = _pages(context_length + window, page_size)
        max_pages = min(MAX_GRAPH_PAGES, (max_bs + 1) * per_request + _pages(max_tokens, page_size))
        max_query = max(window, mixed_max_query or max(tiers)) if mixed and tiers else window
        return cls(tuple(sizes), tuple(tiers), max_bs, window, page_size, max_pages, max_query, contextless)

    def keys(self) -> list[GraphKey]:
        """Every graph, largest first (capture order: later ones reuse the pool's memory)."""
        keys = [GraphKey(True, b, b) for b in self.decode_sizes]
        if self.contextless:
            keys += [GraphKey(True, b, b, False) for b in self.decode_sizes]
        keys += [GraphKey(False, verify_batch_size(t, self.max_bs), t) for t in self.verify_tiers]
        return sorted(keys, key=lambda k: (k.num_tokens, k.batch_size, k.decode, k.context), reverse=True)

    @property
    def max_tokens(self) -> int:
        return max(k.num_tokens for k in self.keys())

    @property
    def max_batch(self) -> int:
        return max(k.batch_size for k in self.keys())

    def pick(self, step: StepInput) -> GraphKey | None:
        """The graph this step replays, or None to run it eagerly."""
        return self.pick_or_why(step)[0]

    def pick_or_why(self, step: StepInput) -> tuple[GraphKey | None, str | None]:
        """-> (the graph this step replays, None) or (None, why it runs eagerly): "empty", "batch" (more
        requests than the largest graph), "query" (a prefill chunk longer than a ragged graph takes),
        "tokens" (more rows than the largest tier), "pages" (past the page-index buffer)."""
        b, t = step.batch_size, step.num_tokens
        if b == 0:
            return None, "empty"
        if b > self.max_bs:
            return None, "batch"
        pages = sum(len(table) for table in step.page_tables)
        if all(n == 1 for n in step.query_lens):
            size = next((s for s in self.decode_sizes if s >= b), None)
            if size is not None and pages + (size - b) <= self.max_pages:
                return GraphKey(True, size, size, step.draft_context or not self.contextless), None
        if not self.verify_tiers or max(step.query_lens) > self.max_query:
            return None, "query"
        tier = next((s for s in self.verify_tiers if s >= t), None)
        if tier is None:
            return None, "tokens"
        key = GraphKey(False, verify_batch_size(tier, self.max_bs), tier)
        padding = _pages(tier - t, self.page_size) + (key.batch_size - b - 1)
        return (key, None) if pages + padding <= self.max_pages else (None, "pages")


def pad_step(step: StepInput, key: GraphKey, padding_page: int, page_size: int) -> StepInput:
    """`step` followed by dummy requests on the padding page, to exactly key's batch and tokens.

    Decode: one token per dummy. Verify: the first dummy owns every padding row (positions wrap
    inside the padding page, so RoPE and the slots stay in range), the others have none.
    Real rows keep their indices, so sample_indices are unchanged.
    """
    extra_requests, extra_tokens = key.batch_size - step.batch_size, key.num_tokens - step.num_tokens
    if extra_requests < (0 if key.decode else 1) or extra_tokens < 0 or (key.decode and extra_tokens != extra_requests):
        raise ValueError(f"a step of {step.batch_size} requests / {step.num_tokens} tokens does not fit {key}")
    # NOTE: the real requests' page tables are shared, not copied (nothing writes to them)
    out = StepInput(list(step.input_ids), list(step.positions), list(step.query_lens), list(step.kv_lens),
                    list(step.page_tables), list(step.sample_indices))
    rows = [1] * extra_requests if key.decode else [extra_tokens] + [0] * (extra_requests - 1)
    for n in rows:
        out.input_ids.extend([0] * n)
        out.positions.extend(i % page_size for i in range(n))
        out.query_lens.append(n)
        out.kv_lens.append(max(n, 1))
        out.page_tables.append(array("i", [padding_page]) * _pages(n, page_size))
    return out


def static_rows(step: StepInput, page_size: int) -> list[int]:
    """A (padded) step's static graph inputs, flat: input ids, positions, then each row's KV pool
    slot (its page from the request's table, its offset in the page). What RaggedMetadata
    computes with about ten small torch operators, in one pass over plain lists: a replay's
    host work is most of a small step's time."""
    slots, start = [], 0
    for table, q in zip(step.page_tables, step.query_lens):
        slots.extend(table[p // page_size] * page_size + p % page_size for p in step.positions[start: start + q])
        start += q
    return step.input_ids + step.positions + slots


class HostLayout:
    """Host arrays that fill_padded writes a padded step's graph inputs into: int32/int64 CPU
    tensors (pinned for the device copies) and numpy views of the same memory.

    rows: [3 * max_tokens] int64, a step of n rows uses rows[:3n] as ids, positions, KV slots;
    qo_indptr, page_indptr: [max_batch + 1]; last_page_len: [max_batch]; page_indices: room for
    `pages` entries, grown on demand (page_room) up to max_pages. `event` (CUDA only) is recorded
    after the copies that read these arrays were queued."""

    def __init__(self, max_tokens: int, max_batch: int, max_pages: int, pin: bool = False,
                 pages: int = HOST_PAGES):
        import torch

        self.pin, self.max_pages, self.event = pin, max_pages, None
        self.rows, self.rows_np = self._buffer(3 * max_tokens, torch.int64)
        self.qo_indptr, self.qo_indptr_np = self._buffer(max_batch + 1, torch.int32)
        self.page_indptr, self.page_indptr_np = self._buffer(max_batch + 1, torch.int32)
        self.last_page_len, self.last_page_len_np = self._buffer(max_batch, torch.int32)
        self.page_indices, self.page_indices_np = self._buffer(max(1, min(pages, max_pages)), torch.int32)
        self.arange = np.arange(max(max_tokens, max_batch) + 1, dtype=np.int32)  # 0, 1, 2, ... (not copied)

    def _buffer(self, n: int, dtype):
        import torch

        tensor = torch.zeros(n, dtype=dtype, pin_memory=self.pin)
        return tensor, tensor.numpy()  # NOTE: the numpy view shares the (pinned) memory

    def page_room(self, n: int) -> np.ndarray:
        """The page-index array, with room for at least n entries."""
        import torch

        if n > len(self.page_indices_np):
            if n > self.max_pages:
                raise ValueError(f"{n} page indices do not fit the graphs' buffer of {self.max_pages}")
            # NOTE: the old buffer may still feed a queued copy: torch's pinned allocator keeps it
            # until that copy is done
            size = min(self.max_pages, max(n, 2 * len(self.page_indices_np)))
            self.page_indices, self.page_indices_np = self._buffer(size, torch.int32)
        return self.page_indices_np


def fill_padded(step: StepInput, key: GraphKey, padding_page: int, page_size: int, out: HostLayout) -> int:
    """pad_step + static_rows + PlanArrays.from_step in one pass of numpy, written into `out`:
    rows[:3n] (ids, positions, KV slots of the padded step's n = key.num_tokens rows),
    qo_indptr[:B + 1], page_indptr[:B + 1], last_page_len[:B] (B = key.batch_size) and the page
    indices; returns the number of page indices. Exactly the values of the three functions."""
    b, t, batch, n = step.batch_size, step.num_tokens, key.batch_size, key.num_tokens
    extra_requests, extra_tokens = batch - b, n - t
    if extra_requests < (0 if key.decode else 1) or extra_tokens < 0 or (key.decode and extra_tokens != extra_requests):
        raise ValueError(f"a step of {b} requests / {t} tokens does not fit {key}")
    qo, page_ptr, last = out.qo_indptr_np[: batch + 1], out.page_indptr_np[: batch + 1], out.last_page_len_np[:batch]
    tables = step.page_tables
    # one query row per request (every decode step, and verify steps with empty windows): the
    # running sums are 0..b and each row's request is the row's own
    ones = t == b and (b == 0 or max(step.query_lens) == 1)
    # per-request query lengths and page counts, then their running sums in place; dummies: one
    # token and one page each (decode), or the first one all padding rows and the others none
    if ones and key.decode:
        qo[:] = out.arange[: batch + 1]
    else:
        qo[0] = 0
        qo[1: b + 1] = step.query_lens
        if key.decode:
            qo[b + 1:] = 1
        else:
            qo[b + 1], qo[b + 2:] = extra_tokens, 0
        np.add.accumulate(qo, out=qo)
    page_ptr[0] = 0
    page_ptr[1: b + 1] = np.fromiter(map(len, tables), dtype=np.int32, count=b)
    page_ptr[b + 1:] = 1
    if not key.decode:
        page_ptr[b + 1] = _pages(extra_tokens, page_size)
    np.add.accumulate(page_ptr, out=page_ptr)
    # last-page lengths: (kv - 1) % page_size + 1, a dummy's kv being max(its rows, 1)
    last[b:] = 1
    if page_size == 1:
        last[:b] = 1
    else:
        last[:b] = step.kv_lens
        last[:b] -= 1
        np.remainder(last[:b], page_size, out=last[:b])
        last[:b] += 1
        if not key.decode:
            last[b] = (max(extra_tokens, 1) - 1) % page_size + 1
    # page indices: the tables back to back (int32 arrays, as Req.pages: one join of their
    # buffers; lists: one pass), then the dummies'
    total, real = int(page_ptr[batch]), int(page_ptr[b])
    pages = out.page_room(total)
    if real:
        try:
            joined = b"".join(tables)
        except TypeError:  # not buffers (lists)
            joined = None
        if joined is not None and len(joined) == 4 * real and getattr(tables[0], "typecode", None) == "i":
            pages[:real] = np.frombuffer(joined, dtype=np.int32)
        else:
            pages[:real] = np.fromiter(itertools.chain.from_iterable(tables), dtype=np.int32, count=real)
    pages[real:total] = padding_page
    # static rows: ids (dummies 0), positions (the padding rows' wrap inside the padding page),
    # each row's KV slot: its request's page for the position, times page_size, plus the offset
    rows = out.rows_np
    ids, pos, slots = rows[:n], rows[n: 2 * n], rows[2 * n: 3 * n]
    ids[:t] = step.input_ids
    ids[t:] = 0
    pos[:t] = step.positions
    if key.decode:
        pos[t:] = 0
    else:
        pos[t:] = out.arange[:extra_tokens] % page_size
    # each real row's request's first page in the flat page indices
    first = page_ptr[:b] if ones else np.repeat(page_ptr[:b], np.diff(qo[: b + 1]))
    if page_size == 1:
        slots[:t] = pages[first + pos[:t]]
    else:
        slots[:t] = pages[first + pos[:t] // page_size].astype(np.int64) * page_size + pos[:t] % page_size
    slots[t:] = pos[t:] + padding_page * page_size
    return total


def graphs_disabled_reason(device_type: str, disable_cuda_graph: bool, backend_cls) -> str | None:
    """Why this rank runs eagerly only (None: capture graphs). CPUs never use graphs."""
    if device_type != "cuda":
        return "CPU device"
    if disable_cuda_graph:
        return "--disable-cuda-graph"
    if not backend_cls.supports_cuda_graph:
        return ("the torch attention backend builds shape-dependent metadata every step; "
                "use --attention-backend flashinfer for CUDA graphs")
    return None


class CudaGraphRunner:
    """Captures the graphs of a ModelRunner and replays them (all tensors static, one pool)."""

    def __init__(self, runner, plan: GraphPlan, show_progress: bool):
        import torch

        from sglaunch.engine.attention.flashinfer_backend import GraphBuffers
        from sglaunch.engine.layers import use_layer_kernels
        from sglaunch.speculative.draft_graphs import enabled_from_env

        self.runner, self.plan, self.torch = runner, plan, torch
        # the greedy choice + log-probability as one vocabulary-split Triton kernel where the
        # layer kernels run (sglaunch/kernels/vocab_reduce.py); the torch sequence otherwise
        self.fused_greedy = use_layer_kernels(runner.device)
        self.draft_in_graph = runner.draft is not None and enabled_from_env()
        self.attn, pool = runner.attn, runner.kv_pool
        self.padding_page, self.page_size = pool.padding_page, pool.page_size
        device, dtype, n = runner.device, runner.model_dtype, plan.max_tokens
        # the host side of the inputs, two pinned sets used in turn (see _load)
        self.host = [HostLayout(n, plan.max_batch, plan.max_pages, pin=True) for _ in range(2)]
        for layout in self.host:
            layout.event = torch.cuda.Event()
        self._next = 0  # the set the next _load fills
        self._loaded = None  # event after the last _load's input and plan copies were queued
        self._wrappers: dict[GraphKey, object] = {}  # each graph's FlashInfer wrapper
        with torch.inference_mode():
            self.buffers = GraphBuffers.allocate(plan.max_batch, plan.max_pages, device)
            # ids, positions, out slots: a graph of n rows reads inputs[:3n] as [3, n] (_rows)
            self.inputs = torch.zeros(3 * n, dtype=torch.int64, device=device)
            self.hidden = torch.zeros(n, runner.spec.hidden_size, dtype=dtype, device=device)
            # every graph ends with the LM head and the greedy choice of every row, (token id, its
            # log-probability) as float64 (which holds every token id exactly), so a greedy step
            # reads both back in one copy; decode graphs keep the logits [rows, vocab] float32 too
            self.logits = torch.zeros(max(plan.decode_sizes), runner.spec.vocab_size, dtype=torch.float32,
                                      device=device)
            self.greedy = torch.zeros(2, plan.max_tokens, dtype=torch.float64, device=device)
            self.features = None
            if runner.draft is not None and not self.draft_in_graph:
                width = len(runner.draft.layer_ids) * runner.spec.hidden_size
                self.features = torch.zeros(n, width, dtype=dtype, device=device)
        reserve = getattr(self.attn, "reserve_workspace", None)  # FlashInfer: room for every graph's plan
        if reserve is not None:
            reserve([(key.num_tokens, key.batch_size) for key in plan.keys()])
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[GraphKey, tuple] = {}
        self.replays = {"decode": 0, "verify": 0}  # steps served by a graph, for tests and logs
        self._capture_all(show_progress)

    def _capture_all(self, show_progress: bool) -> None:
        keys, start = self.plan.keys(), time.perf_counter()
        with step_bar("Capturing CUDA graphs", show_progress, len(keys)) as advance:
            for key in keys:
                logger.debug("capturing CUDA graph: %s", key)
                self.graphs[key] = self._capture(key)
                advance()
        decode = [k.batch_size for k in keys if k.decode]
        verify = [k.num_tokens for k in keys if not k.decode]
        logger.info("CUDA graphs: %d decode (batch %s) and %d ragged (tokens %s; verify windows%s) captured in %.1f s",
                    len(decode), _span(decode), len(verify), _span(verify),
                    f" and prefill chunks up to {self.plan.max_query} tokens" if self.plan.max_query > self.plan.window else "",
                    time.perf_counter() - start)

    def _capture(self, key: GraphKey):
        torch = self.torch
        wrapper = self.attn.graph_wrapper(key.decode, key.batch_size, self.buffers)
        self._wrappers[key] = wrapper
        with torch.inference_mode():
            self._load(StepInput([], [], [], [], [], []), key)  # the all-dummy layout
            self._body(key)  # warm-up: compiles kernels, sets up cuBLAS outside the capture
            torch.cuda.synchronize(self.runner.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self._body(key)
        return graph, wrapper

    def _rows(self, n: int):
        """The static input rows of a graph of n rows: [3, n] (ids, positions, KV slots), contiguous."""
        return self.inputs[: 3 * n].view(3, n)

    def _load(self, step: StepInput, key: GraphKey) -> None:
        """`step` padded to `key`, into the static input rows; plan the graph's wrapper for it.

        Never waits for the device but for the last _load's event: the previous step may still
        run (overlap), so every host input is copied from pinned memory without waiting."""
        from sglaunch.engine.attention.flashinfer_backend import PlanArrays

        n, batch = key.num_tokens, key.batch_size
        host = self.host[self._next]
        # the copies that read this set were queued two loads ago; the last load waited for its
        # own (later) event, so they are done: query() is true, the wait below never runs
        if not host.event.query():
            host.event.synchronize()
        pages = fill_padded(step, key, self.padding_page, self.page_size, host)
        self.inputs[: 3 * n].copy_(host.rows[: 3 * n], non_blocking=True)
        # NOTE: FlashInfer copies host page indices with a blocking copy in CUDA-graph mode: they
        # go straight into the graphs' index buffer instead, and plan gets that very slice (its
        # copy of the buffer onto itself is a no-op: torch's copy_ returns early on the same view)
        indices = self.buffers.page_indices[:pages]
        indices.copy_(host.page_indices[:pages], non_blocking=True)
        arrays = PlanArrays(host.qo_indptr[: batch + 1], host.page_indptr[: batch + 1], indices,
                            host.last_page_len[:batch], key.decode)
        # the plan rewrites its wrapper's own pinned buffer (FlashInfer's plan info) and copies it
        # without waiting: the last plan's copies (queued before its replay, long done in
        # practice) must have left it
        if self._loaded is not None:
            self._loaded.synchronize()
        # NOTE: the plan reads the indptrs and last-page lengths here, on the host, and copies them
        # without waiting (pinned); nothing rewrites this set until its event has passed
        self.attn.use_graph(self._wrappers[key], arrays, self.inputs[2 * n: 3 * n])
        host.event.record()
        self._loaded, self._next = host.event, 1 - self._next

    def _body(self, key: GraphKey) -> None:
        torch, runner, n = self.torch, self.runner, key.num_tokens
        ids, positions, slots = self._rows(n)
        if key.context:
            hidden, features = runner.model_forward(ids, positions)
        else:  # NOTE: no target features either: nothing reads them
            hidden, features = runner.model(ids, positions, runner.attn), None
        self.hidden[:n].copy_(hidden)
        # the LM head and greedy sampling, as ModelRunner.forward and sampler.sample do them: every
        # row of a decode graph (logits kept too), every verify row's greedy choice (an all-greedy
        # DSpark step accepts from those alone; other steps compute their logits after the replay)
        from sglaunch.kernels.vocab_reduce import greedy_logprob

        logits = runner.model.compute_logits(hidden)  # the model dtype: both read it as float32
        if key.decode:
            self.logits[:n].copy_(logits)  # the float32 conversion in the copy
        # the fused kernel where the layer kernels run (one pass, no float32 copy), its reference otherwise
        tokens, lp = greedy_logprob(logits, self.fused_greedy)
        self.greedy[0, :n].copy_(tokens)
        self.greedy[1, :n].copy_(lp)
        if features is None:
            return
        if self.draft_in_graph:
            # DSpark's draft context K/V of every row, in the graph: eagerly it costs tens of
            # operators per draft layer each step. Padding rows write to the padding page's slots.
            runner.draft.write_context(features, positions, slots)
        elif self.features is not None:
            self.features[:n].copy_(features)

    def pick(self, step: StepInput) -> GraphKey | None:
        """The captured graph this step replays, or None: it runs eagerly, counted by why in `replays`
        ("eager (query)", ...: GraphPlan.pick_or_why; "eager (not captured)": planned, never captured)."""
        key, why = self.plan.pick_or_why(step)
        if key is not None and key not in self.graphs:
            why = "not captured"
        if why is not None:
            name = f"eager ({why})"
            self.replays[name] = self.replays.get(name, 0) + 1
            return None
        return key

    def replay(self, key: GraphKey, step: StepInput, fill=None):
        """-> (hidden, features or None, positions, out_slots) of the step's real rows: views of
        static buffers, valid until the next replay. features is None without a drafter and when
        the graph has written the draft context K/V itself (draft_in_graph). After a decode graph,
        `logits` holds every row's logits; after any graph `greedy` holds every row's greedy choice.
        `fill(input_ids)`, when given, edits the static input ids after they are loaded."""
        graph, _ = self.graphs[key]
        self._load(step, key)
        rows = self._rows(key.num_tokens)
        if fill is not None:  # overlap: placeholder token ids take the previous step's choices
            fill(rows[0])
        graph.replay()
        self.replays["decode" if key.decode else "verify"] += 1
        if not key.context:  # NOTE: the key appears in /server_info only once such a graph ran
            self.replays["decode without draft context"] = self.replays.get("decode without draft context", 0) + 1
        t = step.num_tokens
        features = self.features[:t] if self.features is not None and step.draft_context else None
        return self.hidden[:t], features, rows[1, :t], rows[2, :t]


def _span(values: list[int]) -> str:
    return f"{min(values)}-{max(values)}" if values else "none"


def extra_tiers_from_env() -> tuple[int, ...]:
    return parse_extra_tiers(os.environ.get(TIERS_ENV))


def context_skip_from_env() -> bool:
    """SGLAUNCH_DSPARK_SKIP_CONTEXT, read once at start-up: 1 (the default), a DSpark engine's plain
    decode steps at loads where it has stepped aside for a while write no draft context
    (LLMEngine._draft_context); 0 never. NOTE: on the H200 it served 0.785x of the same server
    without it at c=64 over HTTP in session 14 (the few requests admitted after a skip were priced
    as if alone, so the planner drafted for them at a verify of the whole batch) and 1.127x in
    session 15, once the planner's committed_extra priced that case."""
    return env_switch(CONTEXT_SKIP_ENV, True)


def mixed_from_env() -> bool:
    """SGLAUNCH_MIXED_GRAPHS: 1 (default) ragged graphs take steps with a prefill chunk, 0 not."""
    return env_switch(MIXED_ENV, True)


def mixed_max_query_from_env() -> int:
    """SGLAUNCH_MIXED_MAX_QUERY: the longest prefill chunk a mixed step may hold and still replay a
    ragged graph (unset or 0: no limit but the largest tier, which the chunk and the rest of its
    step always have to fit). Read once at start-up."""
    return env_int(MIXED_MAX_QUERY_ENV, MIXED_MAX_QUERY, 0)
