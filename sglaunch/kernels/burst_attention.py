"""Attention of a DSpark burst's verify rows in one or two kernels per layer, beside its plain-torch reference.

Every request b has Q query rows (its anchor and gamma drafts) at device positions pos[b * Q + i];
its keys are the KV pool rows table[b, 0 .. C - 1] (a slot per position), and query i sees the
columns j <= pos[b * Q + i]. Nothing about the lengths is known on the host, so the kernel reads
them on the device: that is what lets a burst's iterations run back to back in CUDA graphs.

The torch reference (`burst_attention_reference`) gathers every request's C keys and values, folds
the g query heads of a KV head into the query rows and runs SDPA under an additive mask: about six
kernels a layer (two gathers, two transposing copies, the attention, the mask's cast). The Triton
kernel (`burst_attention_triton`) runs programs over (request, KV head, split): the g * Q rows of
the group are one [BLOCK_M, head_dim] tile, the keys of the split's columns are streamed in blocks
of BLOCK_N slots, with an online softmax in float32, and no further than the group's largest
position (read on the device): a split wholly past it loads and stores nothing. With one split the
program writes the output; with more ("flash-decoding") each writes its partial (row max, row sum,
weighted values) to a float32 scratch and `_burst_combine_kernel`, one program per (request, KV
head), merges the splits its length reached. The number of splits is static (`choose_splits`: from
the batch bucket, the slot-table width, the KV heads and the SM count, or DEFAULT_SPLITS), as a
CUDA graph needs: at one request and short contexts a single program per KV head walked the whole
context serially (H200, SmolLM2-135M shape, context 256: 378 us of a 1.72 ms iteration in 30
launches of 3 programs on 132 SMs).

The combine is a launch of its own per layer (H200, 1 request, position 256: 99 us of combine beside
137 us of attention per iteration, 30 layers: mostly launch latency). `combine="fold"` merges inside
the split kernel instead: a split that its request's length reached writes its partial, then takes a
ticket (an atomic add, acq_rel at GPU scope, after a CTA barrier so every thread's partial stores
are ordered before it) on a per-(request, KV head) int32 counter; the program that draws the last
ticket (the number of splits that length reaches, read on the device) merges the partials in split
order (the separate combine's arithmetic, so the result does not depend on which program came last)
and writes the output, then puts the counter back to 0 for the next launch (the next layer, the next
CUDA-graph replay): nothing on the host, no allocation per call. When the length reaches one split,
that split writes the output itself. `combine="separate"` (the default, DEFAULT_COMBINE; the burst
runner reads SGLAUNCH_DSPARK_BURST_COMBINE once at start-up) stays the reference.
"""

from __future__ import annotations

import torch

import os

from . import HAS_TRITON


def burst_attention_reference(q: torch.Tensor, k_rows: torch.Tensor, v_rows: torch.Tensor, table: torch.Tensor,
                              bias: torch.Tensor, queries: int, scale: float) -> torch.Tensor:
    """q [B * Q, H, hd]; k_rows / v_rows: a layer's pool [slots, KV, hd]; table [B, C]; bias
    [B, 1, g * Q, C] (0 where visible, -inf elsewhere; row g' * Q + i for query i of the group's
    head g') -> [B * Q, H, hd]."""
    from .layer_ops import folded_gqa_attention

    B, C = table.shape
    KV, hd = k_rows.shape[1], k_rows.shape[2]
    H = q.shape[1]
    flat = table.reshape(-1)
    keys = k_rows.index_select(0, flat).view(B, C, KV, hd).to(q.dtype).transpose(1, 2)
    values = v_rows.index_select(0, flat).view(B, C, KV, hd).to(q.dtype).transpose(1, 2)
    out = folded_gqa_attention(q.view(B, queries, H, hd), keys, values, bias.to(q.dtype), scale)
    return out.reshape(B * queries, H, hd)


DEFAULT_BLOCK_N = 64  # key slots per step of a program's loop (benchmarks/burst_profile.py --block-n)
# key splits per (request, KV head): None chooses them from the static shapes (choose_splits), a number
# fixes them (benchmarks/burst_profile.py --splits); set before a burst runner is built (its scratch)
DEFAULT_SPLITS: int | None = None
MAX_SPLITS = 64
WAVES = 2  # auto: about this many programs per SM (each is short and latency-bound)
CPU_SMS = 4  # the "SM count" where there is none (Triton's interpreter): a few splits, so tests run them
COMBINES = ("separate", "fold")
# how the splits are merged: "separate" (a combine kernel after the split kernel) or "fold" (the split
# kernel's last program per (request, KV head) merges them); the burst runner's comes from COMBINE_ENV
DEFAULT_COMBINE = "separate"
COMBINE_ENV = "SGLAUNCH_DSPARK_BURST_COMBINE"


def combine_from_env() -> str:
    """SGLAUNCH_DSPARK_BURST_COMBINE, read once at start-up: separate (default) or fold."""
    value = os.environ.get(COMBINE_ENV, DEFAULT_COMBINE).strip().lower() or DEFAULT_COMBINE
    if value not in COMBINES:
        raise ValueError(f"{COMBINE_ENV}={value!r}: expected one of {', '.join(COMBINES)}")
    return value


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def block_m(num_heads: int, num_kv_heads: int, queries: int) -> int:
    """The rows of one program's query tile: the g * Q rows of a KV head's group, padded."""
    return max(16, _next_pow2(num_heads // num_kv_heads * queries))


def device_sm_count(device) -> int:
    """The SM count of a CUDA device (read once by the caller); CPU_SMS elsewhere."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return CPU_SMS


def split_chunk(width: int, splits: int, block_n: int) -> tuple[int, int]:
    """-> (splits, key slots per split): each split a whole number of key blocks, none past the
    slot table (so `splits` may come back smaller)."""
    splits = max(1, min(int(splits), _cdiv(width, block_n)))
    chunk = _cdiv(_cdiv(width, splits), block_n) * block_n
    return _cdiv(width, chunk), chunk


def choose_splits(batch: int, num_kv_heads: int, width: int, sm_count: int, block_n: int | None = None,
                  splits: int | None = None) -> int:
    """The number of key splits of a (batch bucket, slot-table width) key, from static shapes only
    (a CUDA graph captures it): `splits` (default DEFAULT_SPLITS) when given, else enough programs for
    about WAVES per SM, at most one split per key block of the slot table and MAX_SPLITS. The real
    lengths are read on the device: splits past them exit at once."""
    block_n = block_n or DEFAULT_BLOCK_N
    splits = splits if splits is not None else DEFAULT_SPLITS
    if splits is None:
        groups = max(1, batch * num_kv_heads)
        splits = min(MAX_SPLITS, _cdiv(WAVES * max(1, sm_count), groups))
    return split_chunk(width, splits, block_n)[0]


def scratch_numel(batch: int, num_heads: int, num_kv_heads: int, head_dim: int, queries: int, splits: int) -> int:
    """float32 elements of the partial results of `splits` > 1 splits (0 for one split): per (request,
    KV head, split) a [BLOCK_M, head_dim] weighted sum of values, and the rows' max and sum."""
    if splits <= 1:
        return 0
    return batch * num_kv_heads * splits * block_m(num_heads, num_kv_heads, queries) * (head_dim + 2)


def counters_numel(batch: int, num_kv_heads: int) -> int:
    """int32 tickets of combine="fold": one per (request, KV head), zero between launches."""
    return batch * num_kv_heads


if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _group_rows(pos_ptr, b, kvh, QROWS: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr):
        """The query rows of request b's KV head kvh, one per (query head of the group, row):
        their index m, whether real, head, token row and position (read on the device)."""
        m = tl.arange(0, BLOCK_M)
        valid = m < GROUP * QROWS
        h = kvh * GROUP + m // QROWS
        t = b * QROWS + m % QROWS
        pos = tl.load(pos_ptr + t, mask=valid, other=0)
        return m, valid, h, t, pos

    @triton.jit
    def _merge_splits(acc_ptr, ml_ptr, first, used, m, valid, d, HD: tl.constexpr, BLOCK_M: tl.constexpr,
                      CACHE: tl.constexpr):
        """The partials of splits first .. first + used - 1, in that order, into the group's output
        rows (float32): the one arithmetic of both combines."""
        m_all = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_all = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HD], tl.float32)
        for s in range(used):
            part = first + s
            m_s = tl.load(ml_ptr + part * 2 * BLOCK_M + m, mask=valid, other=float("-inf"), cache_modifier=CACHE)
            l_s = tl.load(ml_ptr + part * 2 * BLOCK_M + BLOCK_M + m, mask=valid, other=0.0, cache_modifier=CACHE)
            a_s = tl.load(acc_ptr + part * BLOCK_M * HD + m[:, None] * HD + d[None, :], mask=valid[:, None],
                          other=0.0, cache_modifier=CACHE)
            m_new = tl.maximum(m_all, m_s)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            w_old = tl.exp(m_all - m_safe)
            w_s = tl.exp(m_s - m_safe)  # 0 for a row that saw nothing of split s
            l_all = l_all * w_old + l_s * w_s
            acc = acc * w_old[:, None] + a_s * w_s[:, None]
            m_all = m_new
        return acc / tl.where(valid, l_all, 1.0)[:, None]  # every real row sees column 0: l_all > 0

    @triton.jit
    def _burst_attention_kernel(q_ptr, k_ptr, v_ptr, table_ptr, pos_ptr, out_ptr, acc_ptr, ml_ptr, cnt_ptr, scale,
                                stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                                stride_ot, stride_oh, C, CHUNK,
                                QROWS: tl.constexpr, GROUP: tl.constexpr, HD: tl.constexpr,
                                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
                                PRECISION: tl.constexpr, FOLD: tl.constexpr):
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        split = tl.program_id(2)
        m, valid, h, t, pos = _group_rows(pos_ptr, b, kvh, QROWS, GROUP, BLOCK_M)
        d = tl.arange(0, HD)
        last = tl.max(pos, axis=0)  # the group's last visible column: the loop stops there, not at C
        lo = split * CHUNK
        hi = tl.minimum(tl.minimum(lo + CHUNK, last + 1), C)  # this split's columns lo .. hi - 1
        live = valid & (lo + 0 * m < hi)  # NOTE: a split past the group's length loads and stores nothing
        q = tl.load(q_ptr + t[:, None] * stride_qt + h[:, None] * stride_qh + d[None, :], mask=live[:, None],
                    other=0.0)
        dtype = q.dtype
        q = q.to(tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HD], tl.float32)
        for start in range(lo, hi, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            inside = n < hi  # NOTE: nothing past the group's last column is loaded (an unwritten slot may hold NaN)
            slot = tl.load(table_ptr + b * C + n, mask=inside, other=0)
            k = tl.load(k_ptr + slot[:, None] * stride_kt + kvh * stride_kh + d[None, :], mask=inside[:, None],
                        other=0.0)
            # NOTE: products of bf16 / fp16 values are exact in tf32, so this is the half-precision MMA's result
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision=PRECISION) * scale  # [BLOCK_M, BLOCK_N]
            s = tl.where((n[None, :] <= pos[:, None]) & inside[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            # a row that sees no column of this split yet keeps -inf: exp against 0, not NaN
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            v = tl.load(v_ptr + slot[:, None] * stride_vt + kvh * stride_vh + d[None, :], mask=inside[:, None],
                        other=0.0)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            # p rounded to the query dtype first, as flash attention's P @ V takes it
            acc = acc * alpha[:, None] + tl.dot(p.to(dtype).to(tl.float32), v.to(tl.float32), input_precision=PRECISION)
            m_i = m_new
        out_ptrs = out_ptr + t[:, None] * stride_ot + h[:, None] * stride_oh + d[None, :]
        if SPLITS == 1:
            out = acc / l_i[:, None]
            tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=valid[:, None])
        elif FOLD:
            group = b * tl.num_programs(1) + kvh
            used = (tl.minimum(last + 1, C) + CHUNK - 1) // CHUNK  # the splits this length reaches
            if split < used:  # NOTE: a split past the length takes no ticket
                if used == 1:  # the whole length in split 0: it is the output (as the combine of one split)
                    out = acc / tl.where(valid, l_i, 1.0)[:, None]
                    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=valid[:, None])
                else:
                    part = group * SPLITS + split
                    tl.store(acc_ptr + part * BLOCK_M * HD + m[:, None] * HD + d[None, :], acc, mask=valid[:, None])
                    tl.store(ml_ptr + part * 2 * BLOCK_M + m, m_i, mask=valid)
                    tl.store(ml_ptr + part * 2 * BLOCK_M + BLOCK_M + m, l_i, mask=valid)
                    # NOTE: every thread's partial stores before the ticket: a CTA barrier, then the
                    # atomic's release (GPU scope) publishes them; its acquire, for the last program,
                    # makes the other programs' partials visible to the loads below (.cg: from L2)
                    tl.debug_barrier()
                    ticket = tl.atomic_add(cnt_ptr + group, 1, sem="acq_rel", scope="gpu")
                    if ticket == used - 1:
                        tl.debug_barrier()
                        out = _merge_splits(acc_ptr, ml_ptr, group * SPLITS, used, m, valid, d, HD, BLOCK_M, ".cg")
                        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=valid[:, None])
                        # every other program of the group took its ticket already: clean for the next launch
                        tl.atomic_xchg(cnt_ptr + group, 0, sem="relaxed", scope="gpu")
        else:
            part = (b * tl.num_programs(1) + kvh) * SPLITS + split
            tl.store(acc_ptr + part * BLOCK_M * HD + m[:, None] * HD + d[None, :], acc, mask=live[:, None])
            tl.store(ml_ptr + part * 2 * BLOCK_M + m, m_i, mask=live)
            tl.store(ml_ptr + part * 2 * BLOCK_M + BLOCK_M + m, l_i, mask=live)

    @triton.jit
    def _burst_combine_kernel(pos_ptr, out_ptr, acc_ptr, ml_ptr, stride_ot, stride_oh, C, CHUNK,
                              QROWS: tl.constexpr, GROUP: tl.constexpr, HD: tl.constexpr,
                              BLOCK_M: tl.constexpr, SPLITS: tl.constexpr):
        """The splits of one (request, KV head) into its output rows: only the splits its length
        reached (the others wrote nothing)."""
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        m, valid, h, t, pos = _group_rows(pos_ptr, b, kvh, QROWS, GROUP, BLOCK_M)
        d = tl.arange(0, HD)
        used = (tl.minimum(tl.max(pos, axis=0) + 1, C) + CHUNK - 1) // CHUNK
        out = _merge_splits(acc_ptr, ml_ptr, (b * tl.num_programs(1) + kvh) * SPLITS, used, m, valid, d, HD,
                            BLOCK_M, "")
        tl.store(out_ptr + t[:, None] * stride_ot + h[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=valid[:, None])


def burst_attention_triton(q: torch.Tensor, k_rows: torch.Tensor, v_rows: torch.Tensor, table: torch.Tensor,
                           positions: torch.Tensor, queries: int, scale: float, block_n: int | None = None,
                           splits: int | None = None, scratch: torch.Tensor | None = None,
                           sm_count: int | None = None, combine: str | None = None,
                           counters: torch.Tensor | None = None) -> torch.Tensor:
    """The reference's result from positions [B * Q] instead of a mask: one kernel with one split,
    else the split kernel and the combine. `splits`: a static number (None: choose_splits from the
    shapes and `sm_count`, default the device's); `scratch`: float32 of at least scratch_numel
    elements (None: allocated here; a CUDA graph passes a buffer made before capture). `combine`
    (default DEFAULT_COMBINE): "separate", a combine kernel after the splits, or "fold", merged by
    the split kernel's last program per (request, KV head), which takes `counters`: int32 of at least
    counters_numel elements, all 0 (each launch leaves them 0; None: zeros made here, eager only)."""
    block_n = block_n or DEFAULT_BLOCK_N
    combine = combine or DEFAULT_COMBINE
    if combine not in COMBINES:
        raise ValueError(f"burst attention: combine={combine!r}, expected one of {', '.join(COMBINES)}")
    B, C = table.shape
    T, H, hd = q.shape
    KV = k_rows.shape[1]
    group = H // KV
    if T != B * queries or hd & (hd - 1) or hd < 16:
        raise ValueError(f"burst attention: {T} rows for {B} x {queries} queries, head_dim {hd} (a power of two >= 16)")
    if splits is None:
        splits = choose_splits(B, KV, C, sm_count if sm_count is not None else device_sm_count(q.device), block_n)
    splits, chunk = split_chunk(C, splits, block_n)
    q = q if q.stride(-1) == 1 else q.contiguous()
    out = torch.empty_like(q)
    table = table.contiguous()
    positions = positions.contiguous()
    bm = block_m(H, KV, queries)
    need = scratch_numel(B, H, KV, hd, queries, splits)
    fold = combine == "fold" and splits > 1
    if need:
        if scratch is None:
            scratch = torch.empty(need, dtype=torch.float32, device=q.device)
        elif scratch.numel() < need or scratch.dtype != torch.float32:
            raise ValueError(f"burst attention: a scratch of {scratch.numel()} {scratch.dtype} for {need} float32")
        parts = B * KV * splits
        acc, ml = scratch[: parts * bm * hd], scratch[parts * bm * hd: need]
    else:
        acc = ml = out  # unused with one split
    if fold:
        if counters is None:
            counters = torch.zeros(counters_numel(B, KV), dtype=torch.int32, device=q.device)
        elif counters.numel() < counters_numel(B, KV) or counters.dtype != torch.int32:
            raise ValueError(f"burst attention: counters of {counters.numel()} {counters.dtype} for "
                             f"{counters_numel(B, KV)} int32")
    else:
        counters = out  # unused without the fold
    _burst_attention_kernel[(B, KV, splits)](
        q, k_rows, v_rows, table, positions, out, acc, ml, counters, scale,
        q.stride(0), q.stride(1), k_rows.stride(0), k_rows.stride(1), v_rows.stride(0), v_rows.stride(1),
        out.stride(0), out.stride(1), C, chunk,
        QROWS=queries, GROUP=group, HD=hd, BLOCK_M=bm, BLOCK_N=block_n, SPLITS=splits,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", FOLD=fold)
    if splits > 1 and not fold:
        _burst_combine_kernel[(B, KV)](positions, out, acc, ml, out.stride(0), out.stride(1), C, chunk,
                                       QROWS=queries, GROUP=group, HD=hd, BLOCK_M=bm, SPLITS=splits)
    return out
