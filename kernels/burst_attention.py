"""Attention of a DSpark burst's verify rows in one kernel per layer, beside its plain-torch reference.

Every request b has Q query rows (its anchor and gamma drafts) at device positions pos[b * Q + i];
its keys are the KV pool rows table[b, 0 .. C - 1] (a slot per position), and query i sees the
columns j <= pos[b * Q + i]. Nothing about the lengths is known on the host, so the kernel reads
them on the device: that is what lets a burst's iterations run back to back in CUDA graphs.

The torch reference (`burst_attention_reference`) gathers every request's C keys and values, folds
the g query heads of a KV head into the query rows and runs SDPA under an additive mask: about six
kernels a layer (two gathers, two transposing copies, the attention, the mask's cast). The Triton
kernel (`burst_attention_triton`) is one program per (request, KV head): the g * Q rows of the
group are one [BLOCK_M, head_dim] tile, the keys are streamed in blocks of BLOCK_N slots up to the
group's largest position (a loop bound read on the device), with an online softmax in float32.
"""

from __future__ import annotations

import torch

from . import HAS_TRITON


def burst_attention_reference(q: torch.Tensor, k_rows: torch.Tensor, v_rows: torch.Tensor, table: torch.Tensor,
                              bias: torch.Tensor, queries: int, scale: float) -> torch.Tensor:
    """q [B * Q, H, hd]; k_rows / v_rows: a layer's pool [slots, KV, hd]; table [B, C]; bias
    [B, 1, g * Q, C] (0 where visible, -inf elsewhere; row g' * Q + i for query i of the group's
    head g') -> [B * Q, H, hd]."""
    import torch.nn.functional as F

    B, C = table.shape
    KV, hd = k_rows.shape[1], k_rows.shape[2]
    H = q.shape[1]
    g = H // KV
    flat = table.reshape(-1)
    keys = k_rows.index_select(0, flat).view(B, C, KV, hd).to(q.dtype).transpose(1, 2)
    values = v_rows.index_select(0, flat).view(B, C, KV, hd).to(q.dtype).transpose(1, 2)
    folded = q.view(B, queries, KV, g, hd).permute(0, 2, 3, 1, 4).reshape(B, KV, g * queries, hd)
    out = F.scaled_dot_product_attention(folded, keys, values, attn_mask=bias.to(q.dtype), scale=scale)
    return out.view(B, KV, g, queries, hd).permute(0, 3, 1, 2, 4).reshape(B * queries, H, hd)


DEFAULT_BLOCK_N = 64  # key slots per step of a program's loop (benchmarks/burst_profile.py --block-n)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _burst_attention_kernel(q_ptr, k_ptr, v_ptr, table_ptr, pos_ptr, out_ptr, scale,
                                stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                                stride_ot, stride_oh, C,
                                QROWS: tl.constexpr, GROUP: tl.constexpr, HD: tl.constexpr,
                                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        m = tl.arange(0, BLOCK_M)
        valid = m < GROUP * QROWS
        i = m % QROWS
        h = kvh * GROUP + m // QROWS
        t = b * QROWS + i
        d = tl.arange(0, HD)
        q = tl.load(q_ptr + t[:, None] * stride_qt + h[:, None] * stride_qh + d[None, :], mask=valid[:, None],
                    other=0.0)
        dtype = q.dtype
        q = q.to(tl.float32)
        pos = tl.load(pos_ptr + t, mask=valid, other=0)
        last = tl.max(pos, axis=0)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HD], tl.float32)
        for start in range(0, last + 1, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            inside = n < C
            slot = tl.load(table_ptr + b * C + n, mask=inside, other=0)
            k = tl.load(k_ptr + slot[:, None] * stride_kt + kvh * stride_kh + d[None, :], mask=inside[:, None],
                        other=0.0)
            # NOTE: products of bf16 / fp16 values are exact in tf32, so this is the half-precision MMA's result
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision=PRECISION) * scale  # [BLOCK_M, BLOCK_N]
            s = tl.where((n[None, :] <= pos[:, None]) & inside[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            v = tl.load(v_ptr + slot[:, None] * stride_vt + kvh * stride_vh + d[None, :], mask=inside[:, None],
                        other=0.0)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            # p rounded to the query dtype first, as flash attention's P @ V takes it
            acc = acc * alpha[:, None] + tl.dot(p.to(dtype).to(tl.float32), v.to(tl.float32), input_precision=PRECISION)
            m_i = m_new
        out = acc / l_i[:, None]
        tl.store(out_ptr + t[:, None] * stride_ot + h[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=valid[:, None])


def burst_attention_triton(q: torch.Tensor, k_rows: torch.Tensor, v_rows: torch.Tensor, table: torch.Tensor,
                           positions: torch.Tensor, queries: int, scale: float, block_n: int | None = None) -> torch.Tensor:
    """The reference's result from positions [B * Q] instead of a mask (one kernel)."""
    block_n = block_n or DEFAULT_BLOCK_N
    B, C = table.shape
    T, H, hd = q.shape
    KV = k_rows.shape[1]
    group = H // KV
    if T != B * queries or hd & (hd - 1) or hd < 16:
        raise ValueError(f"burst attention: {T} rows for {B} x {queries} queries, head_dim {hd} (a power of two >= 16)")
    q = q if q.stride(-1) == 1 else q.contiguous()
    out = torch.empty_like(q)
    table = table.contiguous()
    positions = positions.contiguous()
    _burst_attention_kernel[(B, KV)](
        q, k_rows, v_rows, table, positions, out, scale,
        q.stride(0), q.stride(1), k_rows.stride(0), k_rows.stride(1), v_rows.stride(0), v_rows.stride(1),
        out.stride(0), out.stride(1), C,
        QROWS=queries, GROUP=group, HD=hd, BLOCK_M=max(16, _next_pow2(group * queries)), BLOCK_N=block_n,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32")
    return out
