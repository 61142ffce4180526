"""Row reductions over a vocabulary, split over the vocabulary so that few rows still fill a GPU.

One program per row walking a 16k-49k vocabulary is latency-bound at 1-32 rows on a 132-SM GPU
(an H200 burst iteration's seven drafter argmaxes took 85 µs, 12 µs each). Here a grid of
(row, chunk) programs each reduces one chunk of its row; when a row has several chunks, a tiny
second kernel (one program per row) combines their partials. The chunk count depends only on
static shapes (rows, V) and the SM count (read once a device), so a CUDA graph captures it; the
partials are small torch.empty buffers (the caching allocator serves them inside a capture).

- `add_argmax`: argmax over the last dim of a + b (float32 [rows, V]): the DSpark drafter's
  greedy Markov step (sglaunch/kernels/layer_ops.py `add_argmax_triton` calls it).
- `greedy_logprob`: per row of logits [rows, V] (bf16, fp16 or fp32) the greedy choice and its
  log-probability, -log(sum_j exp(x_j - max)), in float32 in one pass over the row (an online
  max and sum of exponentials), instead of a float32 copy, an argmax, a log_softmax writing a
  full float32 tensor and a gather.

Both give exactly torch.argmax's index of the float32 values: the first index of the maximum,
and the first NaN where a row holds one (torch treats NaN as the largest value). The
log-probability is NaN for a row with a NaN or with no finite value, as log_softmax's is; it
matches `torch.log_softmax(x.float(), -1)` up to the order of the float32 sum.
"""

from __future__ import annotations

import functools

import torch

from . import HAS_TRITON

BLOCK = 1024  # elements a program reads a step (4 warps, 8 a thread)
WAVES = 4  # aim for about this many programs per SM when rows alone are too few
MAX_CHUNKS = 64
CPU_SMS = 4  # the "SM count" where there is none (Triton's interpreter): a few chunks, so tests run them


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@functools.cache
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device) -> int:
    """The SM count of a CUDA device (read once a device, then cached); CPU_SMS elsewhere."""
    device = torch.device(device)
    if device.type == "cuda":
        return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return CPU_SMS


def vocab_chunks(rows: int, V: int, sms: int, chunks: int | None = None, block: int = BLOCK) -> tuple[int, int]:
    """-> (chunks, elements a chunk) of a [rows, V] reduction, from static shapes only: `chunks`
    when given, else enough (row, chunk) programs for about WAVES a SM; each chunk whole blocks,
    at most MAX_CHUNKS (so the count that comes back may be smaller than asked)."""
    if chunks is None:
        chunks = _cdiv(WAVES * max(1, sms), max(1, rows))
    chunks = max(1, min(int(chunks), MAX_CHUNKS, _cdiv(V, block)))
    size = _cdiv(_cdiv(V, chunks), block) * block
    return _cdiv(V, size), size


# --------------------------------------------------------------------------- references


def add_argmax_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a + b).argmax(dim=-1)


def greedy_logprob_reference(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (int64 [rows] greedy choice, float32 [rows] its log-probability)."""
    x = logits.float()
    choice = x.argmax(dim=-1)
    return choice, torch.log_softmax(x, dim=-1).gather(1, choice[:, None])[:, 0]


# --------------------------------------------------------------------------- Triton kernels

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _vocab_chunk_kernel(x_ptr, b_ptr, part_ptr, part_i_ptr, out_ptr, out_lp_ptr, V, stride_x, stride_b, CHUNK,
                      NCHUNKS, HAS_B: tl.constexpr, LOGPROB: tl.constexpr, SINGLE: tl.constexpr,
                      BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        chunk = tl.program_id(1)
        start = chunk * CHUNK
        end = tl.minimum(start + CHUNK, V)
        lane = tl.arange(0, BLOCK)
        # per lane: the best value seen and its (first) index; lanes walk increasing indices, so a
        # later element wins only when strictly larger, or when it is the lane's first NaN
        best = tl.full([BLOCK], float("-inf"), tl.float32)
        where = start + lane
        # the online max (one a step) and per-lane sums of exp(x - max), non-NaN values only
        m = tl.full((), float("-inf"), tl.float32)
        s = tl.zeros([BLOCK], tl.float32)
        for off in range(start, end, BLOCK):
            col = off + lane
            inside = col < end
            x = tl.load(x_ptr + row * stride_x + col, mask=inside, other=float("-inf")).to(tl.float32)
            if HAS_B:
                x = x + tl.load(b_ptr + row * stride_b + col, mask=inside, other=0.0).to(tl.float32)
            nan = x != x  # noqa: PLR0124 (NaN test)
            better = (x > best) | (nan & (best == best))  # noqa: PLR0124 (NaN test)
            where = tl.where(better, col, where)
            best = tl.where(better, x, best)
            if LOGPROB:
                xs = tl.where(nan, float("-inf"), x)
                m_new = tl.maximum(m, tl.max(xs, axis=0))
                live = m_new > float("-inf")
                scale = tl.where(live, tl.exp(m - m_new), 0.0)
                s = tl.where(live, s * scale + tl.exp(xs - m_new), 0.0)
                m = m_new
        nan = best != best  # noqa: PLR0124 (NaN test)
        nan_at = tl.min(tl.where(nan, where, 2147483647), axis=0)
        top = tl.max(tl.where(nan, float("-inf"), best), axis=0)
        first = tl.min(tl.where(best == top, where, 2147483647), axis=0)
        has_nan = nan_at < 2147483647
        index = tl.where(has_nan, nan_at, first)
        value = tl.where(has_nan, float("nan"), top)
        if SINGLE:
            tl.store(out_ptr + row, index.to(tl.int64))
            if LOGPROB:
                lp = -tl.log(tl.sum(s, axis=0))
                tl.store(out_lp_ptr + row, tl.where(has_nan | (m == float("-inf")), float("nan"), lp))
        else:
            slot = row * NCHUNKS + chunk
            tl.store(part_i_ptr + slot, index)
            tl.store(part_ptr + slot, value)
            if LOGPROB:
                rows = tl.num_programs(0).to(tl.int64)
                tl.store(part_ptr + rows * NCHUNKS + slot, m)
                tl.store(part_ptr + 2 * rows * NCHUNKS + slot, tl.sum(s, axis=0))

    @triton.jit
    def _vocab_combine_kernel(part_ptr, part_i_ptr, out_ptr, out_lp_ptr, NCHUNKS, LOGPROB: tl.constexpr,
                        CBLOCK: tl.constexpr):
        # chunks hold increasing indices: the first index of the overall maximum is the smallest
        # index among the chunks whose maximum it is (the first NaN's likewise)
        row = tl.program_id(0).to(tl.int64)
        rows = tl.num_programs(0).to(tl.int64)
        c = tl.arange(0, CBLOCK)
        inside = c < NCHUNKS
        slot = row * NCHUNKS + c
        value = tl.load(part_ptr + slot, mask=inside, other=float("-inf"))
        index = tl.load(part_i_ptr + slot, mask=inside, other=2147483647)
        nan = value != value  # noqa: PLR0124 (NaN test)
        nan_at = tl.min(tl.where(nan, index, 2147483647), axis=0)
        top = tl.max(tl.where(nan, float("-inf"), value), axis=0)
        first = tl.min(tl.where(value == top, index, 2147483647), axis=0)
        has_nan = nan_at < 2147483647
        tl.store(out_ptr + row, tl.where(has_nan, nan_at, first).to(tl.int64))
        if LOGPROB:
            m = tl.load(part_ptr + rows * NCHUNKS + slot, mask=inside, other=float("-inf"))
            s = tl.load(part_ptr + 2 * rows * NCHUNKS + slot, mask=inside, other=0.0)
            mg = tl.max(m, axis=0)
            live = m > float("-inf")
            total = tl.sum(tl.where(live, s * tl.exp(m - mg), 0.0), axis=0)
            lp = -tl.log(total)
            tl.store(out_lp_ptr + row, tl.where(has_nan | (mg == float("-inf")), float("nan"), lp))

    def _launch(x: torch.Tensor, b: torch.Tensor | None, logprob: bool, chunks: int | None):
        rows, V = x.shape
        out = torch.empty(rows, dtype=torch.int64, device=x.device)
        out_lp = torch.empty(rows if logprob else 0, dtype=torch.float32, device=x.device)
        if not rows:
            return out, out_lp
        n, size = vocab_chunks(rows, V, sm_count(x.device), chunks)
        single = n == 1
        # NOTE: pointers a configuration never reads get `out` (no empty tensors as kernel arguments)
        if single:
            part = part_i = out
        else:
            part = torch.empty((3 if logprob else 1) * rows * n, dtype=torch.float32, device=x.device)
            part_i = torch.empty(rows * n, dtype=torch.int32, device=x.device)
        lp_arg = out_lp if logprob else out
        b_arg = b if b is not None else x
        _vocab_chunk_kernel[(rows, n)](x, b_arg, part, part_i, out, lp_arg, V, x.stride(0), b_arg.stride(0), size, n,
                                 HAS_B=b is not None, LOGPROB=logprob, SINGLE=single, BLOCK=BLOCK, num_warps=4)
        if not single:
            _vocab_combine_kernel[(rows,)](part, part_i, out, lp_arg, n, LOGPROB=logprob,
                                     CBLOCK=max(16, triton.next_power_of_2(n)), num_warps=1)
        return out, out_lp

    def add_argmax_triton(a: torch.Tensor, b: torch.Tensor, chunks: int | None = None) -> torch.Tensor:
        """argmax(a + b, -1) of two float32 [rows, V] tensors of one shape, last dim contiguous."""
        if a.shape != b.shape or a.dim() != 2 or a.dtype != torch.float32 or b.dtype != torch.float32:
            raise ValueError(f"add_argmax: two float32 [rows, V] tensors of one shape, got {tuple(a.shape)} "
                             f"{a.dtype} and {tuple(b.shape)} {b.dtype}")
        if a.stride(-1) != 1 or b.stride(-1) != 1:
            raise ValueError("add_argmax: the last dimension must be contiguous")
        if a.shape[1] >= 2 ** 31 or a.shape[1] == 0:
            raise ValueError(f"add_argmax: V must be in [1, 2**31), got {a.shape[1]}")
        return _launch(a, b, False, chunks)[0]

    def greedy_logprob_triton(logits: torch.Tensor, chunks: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (int64 [rows] argmax, float32 [rows] its log-probability) of bf16/fp16/fp32 logits [rows, V]."""
        if logits.dim() != 2 or logits.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"greedy_logprob: bf16, fp16 or fp32 logits [rows, V], got {tuple(logits.shape)} "
                             f"{logits.dtype}")
        if logits.shape[1] >= 2 ** 31 or logits.shape[1] == 0:
            raise ValueError(f"greedy_logprob: V must be in [1, 2**31), got {logits.shape[1]}")
        if logits.stride(-1) != 1:
            logits = logits.contiguous()
        return _launch(logits, None, True, chunks)


def greedy_logprob(logits: torch.Tensor, fused: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The greedy choice and its float32 log-probability per row: the fused kernel where the caller
    runs Triton kernels (fused), the torch reference otherwise (the kernel needs Triton only then)."""
    return greedy_logprob_triton(logits) if fused else greedy_logprob_reference(logits)
