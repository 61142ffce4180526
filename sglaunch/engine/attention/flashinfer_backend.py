"""Attention with FlashInfer's paged-KV kernels (CUDA, fp16/bf16), planned once per step.

A step whose requests all have one query token uses BatchDecodeWithPagedKVCacheWrapper; any
other step (prefill chunks, extends, DSpark's ragged verify windows) uses
BatchPrefillWithPagedKVCacheWrapper with per-request query lengths from qo_indptr, causal. The
plan is made once in prepare() and shared by every layer.

Our KVPool rows (p * page_size + i) viewed as [num_pages, page_size, kv_heads, head_dim] are
FlashInfer's "NHD" paged layout as they are: no copy, no layout change.

CUDA graphs (cuda_graph.py) get one wrapper per captured shape in `use_cuda_graph=True` mode,
over fixed-size indptr/indices buffers shared by all of them; re-planning a graph's wrapper
before its replay refreshes those buffers in place (CudaGraphRunner._load copies the page
indices into the shared buffer itself and plans with that slice of it; the indptrs and last-page
lengths come from its pinned host arrays).

FlashInfer compiles its kernels on first use (JIT, minutes); FLASHINFER_WORKSPACE_BASE (read when
flashinfer is imported) moves its cache from ~/.cache/flashinfer to $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer.
"""

from __future__ import annotations

import logging
import os

from dataclasses import dataclass

import torch

from sglaunch.engine.attention.base import AttentionBackend, RaggedMetadata, flat_pages, indptr
from sglaunch.engine.kv_pool import KVPool
from sglaunch.engine.step import StepInput

logger = logging.getLogger(__name__)

WORKSPACE_BYTES = 128 << 20  # FlashInfer's recommended float workspace (split-KV partial results): the least we give
# NOTE: FlashInfer's FA2 prefill plan (scheduler.cuh, PrefillPlan) splits the KV of a step into chunks when the
# step's query tiles fill fewer than CTAS_PER_SM CTAs an SM per KV head, and keeps each chunk's partial output
# in the float workspace: num_qo_heads x padded_batch x cta_tile_q x (head_dim + 1) floats, cta_tile_q at most
# MAX_QUERY_TILE. In a CUDA graph padded_batch is max(2 x SMs / kv_heads, ceil(rows x gqa / tile) + batch - 1)
# for the graph's dummy layout, so it grows with the ragged graphs' tokens and requests
CTAS_PER_SM = 2
MAX_QUERY_TILE = 128
HEAD_DIMS = (64, 128, 256)
DTYPES = (torch.float16, torch.bfloat16)
# NOTE: tensor-core decode (the prefill kernel) wins once several query heads share a KV head
TENSOR_CORE_GQA_GROUP = 4
PREFILL_BACKEND_ENV = "SGLAUNCH_FLASHINFER_PREFILL_BACKEND"  # fa2 (default), fa3 or auto (FlashInfer's choice)
PREFILL_BACKENDS = ("auto", "fa2", "fa3")
# NOTE: FA2, not FlashInfer's own choice (FA3 on Hopper): FA3 takes each decode row of a mixed step as
# a 128-row tile, so a step admitting a prompt beside 64 decodes cost 1.67 ms over a decode step
# against 0.78 with FA2 (H200, session 17, benchmarks/mixed_step_cost.py, same run)
DEFAULT_PREFILL_BACKEND = "fa2"


def prefill_backend_from_env() -> str:
    """SGLAUNCH_FLASHINFER_PREFILL_BACKEND, read once at start-up: the kernel family of every
    prefill-kernel step (prefill chunks, mixed steps, DSpark verify windows), eager or in a
    graph. fa2 by default; auto lets FlashInfer choose (FA3 on Hopper)."""
    value = os.environ.get(PREFILL_BACKEND_ENV, "").strip().lower() or DEFAULT_PREFILL_BACKEND
    if value not in PREFILL_BACKENDS:
        raise ValueError(f"{PREFILL_BACKEND_ENV}={value!r}: expected one of {', '.join(PREFILL_BACKENDS)}")
    return value


def max_query_len(qo_indptr: torch.Tensor) -> int:
    """The longest query of a plan's qo_indptr (int32 on the host), in one numpy pass: FlashInfer's
    plan works it out itself with Python's max() over tensor elements when not told (about 3 us
    an element: 0.4 ms for a ragged graph's 129 requests, every replay)."""
    import numpy as np

    indptr = qo_indptr.numpy()
    return int(np.diff(indptr).max()) if indptr.size > 1 else 0


@dataclass
class PlanArrays:
    """FlashInfer's plan inputs for one step, int32 on the host (plan() reads them there)."""

    qo_indptr: torch.Tensor  # [batch + 1]
    page_indptr: torch.Tensor  # [batch + 1]
    page_indices: torch.Tensor  # [total_pages]
    last_page_len: torch.Tensor  # [batch]
    is_decode: bool  # every request has exactly one query token

    @classmethod
    def from_step(cls, step: StepInput, page_size: int) -> PlanArrays:
        """An eager step's arrays (a graph replay's come from cuda_graph.fill_padded)."""
        import numpy as np

        last = np.array(step.kv_lens, dtype=np.int64).reshape(-1)
        last = (last - 1) % page_size + 1
        return cls(
            qo_indptr=torch.from_numpy(indptr(step.query_lens, np.int32)),
            page_indptr=torch.from_numpy(indptr(list(map(len, step.page_tables)), np.int32)),
            page_indices=flat_int32(step.page_tables),
            last_page_len=torch.from_numpy(last.astype(np.int32)),
            is_decode=all(n == 1 for n in step.query_lens),
        )


def flat_int32(tables) -> torch.Tensor:
    """flat_pages as an int32 CPU tensor."""
    flat = flat_pages(tables)
    return torch.from_numpy(flat) if flat.size else torch.zeros(0, dtype=torch.int32)


def workspace_bytes(num_qo_heads: int, num_kv_heads: int, head_dim: int, num_sms: int,
                    graphs: list[tuple[int, int]] | tuple = ()) -> int:
    """The float workspace FlashInfer's plans on this rank can need: the split-KV partial results
    of an eager step (at most one CTA's tile rows for each split CTA) and of every captured graph,
    given as (query rows, requests) of its dummy layout; at least WORKSPACE_BYTES, in whole MiB.

    128 MiB (FlashInfer's example size) was too small for a ragged graph of 2,048 rows and 257
    requests with 16 query heads of 128 (the Qwen3-1.7B shape, H200, session 23: "Buffer overflow
    when allocating memory for batch_prefill_tmp_v with size 301989888"): 288 tiles of 128 rows."""
    gqa = max(1, num_qo_heads // max(1, num_kv_heads))
    split_batch = max(1, CTAS_PER_SM * num_sms // max(1, num_kv_heads))
    rows = split_batch * MAX_QUERY_TILE
    for tokens, batch in graphs:
        tiles = -(-tokens * gqa // MAX_QUERY_TILE) + max(batch, 1) - 1
        rows = max(rows, max(split_batch, tiles) * MAX_QUERY_TILE)
    need = num_qo_heads * rows * (head_dim + 1) * 4 + (1 << 20)  # tmp_v and tmp_s, plus alignment
    return max(WORKSPACE_BYTES, -(-need // (1 << 20)) << 20)


def check_supported(kv_pool: KVPool, head_dim: int, device: torch.device) -> None:
    """ValueError (with the fix) for what FlashInfer cannot run."""
    if device.type != "cuda":
        raise ValueError("attention backend 'flashinfer' needs a CUDA device; use --attention-backend torch")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"FlashInfer attention supports head_dim {HEAD_DIMS}, the model has {head_dim}; "
                         "use --attention-backend torch")
    if kv_pool.dtype not in DTYPES:
        raise ValueError(f"FlashInfer attention needs a float16/bfloat16 KV cache, got {kv_pool.dtype}; "
                         "use --dtype bfloat16 or --attention-backend torch")


@dataclass
class GraphBuffers:
    """Fixed-size plan buffers shared by every CUDA-graph wrapper (one graph replays at a time)."""

    qo_indptr: torch.Tensor  # [max_batch + 1] int32
    page_indptr: torch.Tensor  # [max_batch + 1] int32
    page_indices: torch.Tensor  # [max_pages] int32
    last_page_len: torch.Tensor  # [max_batch] int32

    @classmethod
    def allocate(cls, max_batch: int, max_pages: int, device: torch.device) -> GraphBuffers:
        def zeros(n: int) -> torch.Tensor:
            return torch.zeros(n, dtype=torch.int32, device=device)

        return cls(zeros(max_batch + 1), zeros(max_batch + 1), zeros(max_pages), zeros(max_batch))


class FlashInferAttentionBackend(AttentionBackend):
    supports_cuda_graph = True

    def __init__(self, kv_pool: KVPool, num_heads: int, num_kv_heads: int, head_dim: int, device: torch.device):
        super().__init__(kv_pool, num_heads, num_kv_heads, head_dim, device)
        check_supported(kv_pool, head_dim, device)
        import flashinfer

        self._fi = flashinfer
        self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count
        # NOTE: sized for an eager step's split-KV plan here (over 128 MiB with one KV head a rank and
        # many query heads); reserve_workspace grows it for the CUDA graphs' plans before their capture
        self.workspace = torch.zeros(workspace_bytes(num_heads, num_kv_heads, head_dim, self.num_sms),
                                     dtype=torch.uint8, device=device)
        self.tensor_cores = num_heads // num_kv_heads >= TENSOR_CORE_GQA_GROUP
        self.prefill_backend = prefill_backend_from_env()
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD", backend=self.prefill_backend)
        self.decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD",
                                                                    use_tensor_cores=self.tensor_cores)
        pages, page_size = kv_pool.total_pages, kv_pool.page_size
        # per layer (K, V) as [num_pages, page_size, kv_heads, head_dim]: views of the pool, no copy
        paged_shape = (pages, page_size, num_kv_heads, head_dim)
        self.paged = [(k.view(paged_shape), v.view(paged_shape)) for k, v in zip(kv_pool.k, kv_pool.v)]
        self.q_dtype = kv_pool.dtype  # overwritten by set_query_dtype when the model's dtype differs
        self.wrapper = None  # the wrapper planned for the current step (eager or a graph's)
        self.out_slots: torch.Tensor | None = None  # [num_tokens] pool rows receiving the new K/V

    def set_query_dtype(self, dtype: torch.dtype) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"FlashInfer attention needs float16/bfloat16 activations, got {dtype}; "
                             "use --dtype bfloat16 or --attention-backend torch")
        self.q_dtype = dtype

    # ---- eager steps --------------------------------------------------------------------
    def prepare(self, step: StepInput) -> RaggedMetadata:
        meta = super().prepare(step)
        arrays = PlanArrays.from_step(step, self.kv_pool.page_size)
        self.plan(self.decode if arrays.is_decode else self.prefill, arrays)
        self.out_slots = meta.out_slots
        return meta

    def plan(self, wrapper, arrays: PlanArrays) -> None:
        """Plan `wrapper` for this step's layout and make it the one forward() runs."""
        common = dict(num_kv_heads=self.num_kv_heads, page_size=self.kv_pool.page_size, sm_scale=self.scale,
                      q_data_type=self.q_dtype, kv_data_type=self.kv_pool.dtype)
        if isinstance(wrapper, self._fi.BatchDecodeWithPagedKVCacheWrapper):
            wrapper.plan(arrays.page_indptr, arrays.page_indices, arrays.last_page_len,
                         num_qo_heads=self.num_heads, head_dim=self.head_dim, **common)
        else:
            wrapper.plan(arrays.qo_indptr, arrays.page_indptr, arrays.page_indices, arrays.last_page_len,
                         num_qo_heads=self.num_heads, head_dim_qk=self.head_dim, causal=True,
                         max_token_per_sequence=max_query_len(arrays.qo_indptr), **common)
        self.wrapper = wrapper

    def kv_destination(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.kv_pool.k[layer], self.kv_pool.v[layer], self.out_slots

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None) -> torch.Tensor:
        if k is not None:
            self.kv_pool.write(layer, self.out_slots, k, v)
        return self.wrapper.run(q.contiguous(), self.paged[layer])  # [num_tokens, heads, head_dim]

    # ---- CUDA graphs (cuda_graph.py) ----------------------------------------------------
    def graph_wrapper(self, decode: bool, batch_size: int, buffers: GraphBuffers):
        """A wrapper whose plan lives in `buffers` (sliced to `batch_size`), for capture and replay."""
        fi = self._fi
        if decode:
            return fi.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_cuda_graph=True, use_tensor_cores=self.tensor_cores,
                paged_kv_indptr_buffer=buffers.page_indptr[: batch_size + 1],
                paged_kv_indices_buffer=buffers.page_indices,
                paged_kv_last_page_len_buffer=buffers.last_page_len[:batch_size])
        return fi.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_cuda_graph=True, backend=self.prefill_backend,
            qo_indptr_buf=buffers.qo_indptr[: batch_size + 1],
            paged_kv_indptr_buf=buffers.page_indptr[: batch_size + 1],
            paged_kv_indices_buf=buffers.page_indices,
            paged_kv_last_page_len_buf=buffers.last_page_len[:batch_size])

    def reserve_workspace(self, graphs: list[tuple[int, int]]) -> None:
        """Before the graphs are captured: grow the float workspace to what their plans (and an
        eager step's) can need (workspace_bytes); the eager wrappers move to the new one."""
        need = workspace_bytes(self.num_heads, self.num_kv_heads, self.head_dim, self.num_sms, graphs)
        if need <= self.workspace.numel():
            return
        logger.info("FlashInfer workspace: %d MiB (the CUDA graphs' split-KV plans need more than %d MiB)",
                    need >> 20, self.workspace.numel() >> 20)
        self.workspace = None  # NOTE: let the old one go before the new one is allocated
        self.workspace = torch.zeros(need, dtype=torch.uint8, device=self.device)
        for wrapper in (self.prefill, self.decode):
            wrapper.reset_workspace_buffer(self.workspace, wrapper._int_workspace_buffer)

    def use_graph(self, wrapper, arrays: PlanArrays, out_slots: torch.Tensor) -> None:
        """Before capturing or replaying a graph: plan its wrapper; K/V go to the static `out_slots`."""
        self.plan(wrapper, arrays)
        self.out_slots = out_slots
