"""Fused small operators of the decoder layer, each beside its plain-torch reference.

In eager PyTorch each of these is a chain of elementwise kernels (RMSNorm alone is seven: cast,
square, mean, add, rsqrt, multiply, cast-and-scale; rotary embedding about fourteen for q and k).
Inside a CUDA graph every kernel is a node the GPU launches one after another, and at batch 1 a
node costs more than its arithmetic: SmolLM2's 30 layers made about 1,100 nodes. One Triton
kernel per operator brings a layer to about ten.

Every kernel rounds where the reference rounds (bf16 products and sums exactly as eager torch
computes them in the model's dtype), so outputs match the references to the last bit except
for the order of a row's float32 sum in RMSNorm.

- `rms_norm`: y = w * (x * rsqrt(mean(x^2) + eps)).to(dtype), over the last dim of a 2-D or
  3-D (per-head) tensor whose last stride is 1.
- `add_rms_norm`: r = x + residual (in the dtype), then rms_norm(r); returns (y, r).
- `silu_and_mul`: x = [gate | up] -> silu(gate) * up.
- `rotary`: rotate-half RoPE of q [n, h, d] and k [n, hk, d] with float32 cos/sin tables indexed
  by position (cast to the dtype first, as the eager path does); writes new contiguous tensors.
- `rotary_store`: the same, but the rotated k and v go straight into the KV pool's rows `slots`
  (the layer's K/V write fused in: two indexed-copy kernels fewer per layer); returns q only.
  Given q/k norm weights it RMS-normalises each head first (Qwen3's q_norm and k_norm: two
  kernels a layer fewer again).
- `add_argmax`: argmax over the last dim of a + b (float32 [rows, V]), the first index of the
  largest sum as torch.argmax gives it: the DSpark drafter's greedy Markov step (its base logits
  plus the Markov bias), whose add and argmax were two kernels a position, the argmax a slow
  one-row reduction (a burst iteration's eight argmaxes took 98 µs on an H200, session 10).
  It runs sglaunch/kernels/vocab_reduce.py's vocabulary-split version ((row, chunk) programs and a
  per-row combine): one program a row walking V was latency-bound at 1-32 rows (12 µs each).
"""

from __future__ import annotations

import torch

from . import HAS_TRITON

# --------------------------------------------------------------------------- references


from .vocab_reduce import add_argmax_reference  # noqa: E402,F401 (the drafter's reference, kept here by name)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def add_rms_norm_reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    summed = x + residual
    return rms_norm_reference(summed, weight, eps), summed


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def rotary_reference(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_table: torch.Tensor,
                     sin_table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    cos = cos_table[positions].unsqueeze(1).to(q.dtype)  # [n, 1, d]
    sin = sin_table[positions].unsqueeze(1).to(q.dtype)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def rotary_store_reference(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           cos_table: torch.Tensor, sin_table: torch.Tensor, k_cache: torch.Tensor,
                           v_cache: torch.Tensor, slots: torch.Tensor, q_weight: torch.Tensor | None = None,
                           k_weight: torch.Tensor | None = None, eps: float = 0.0) -> torch.Tensor:
    if q_weight is not None:  # Qwen3's per-head q/k RMSNorm before the rotation
        q, k = rms_norm_reference(q, q_weight, eps), rms_norm_reference(k, k_weight, eps)
    q, k = rotary_reference(positions, q, k, cos_table, sin_table)
    k_cache[slots] = k.to(k_cache.dtype)
    v_cache[slots] = v.to(v_cache.dtype)
    return q


def folded_gqa_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                         scale: float) -> torch.Tensor:
    """Grouped-query attention with each key/value head's query heads folded into its query rows:
    q [B, Q, H, hd], keys / values [B, KV, C, hd], mask broadcastable to [B, KV, g * Q, C] (g = H // KV;
    row g' * Q + i is query i of the head's g'-th query head) -> [B, Q, H, hd].
    One SDPA call over KV heads without enable_gqa, which with a mask took the math path and expanded K
    and V to every query head (the drafter, sessions 24-25), and on a CPU was 3-6x slower for decode rows
    (`benchmarks/sdpa_gqa_cpu.py`). Head h reads K/V head h // g."""
    import torch.nn.functional as F

    B, Q, H, hd = q.shape
    KV = keys.shape[1]
    g = H // KV
    rows = q.reshape(B, Q, KV, g, hd).permute(0, 2, 3, 1, 4).reshape(B, KV, g * Q, hd)
    out = F.scaled_dot_product_attention(rows, keys, values, attn_mask=mask, scale=scale)
    return out.view(B, KV, g, Q, hd).permute(0, 3, 1, 2, 4).reshape(B, Q, H, hd)


# --------------------------------------------------------------------------- Triton kernels

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, H, stride_n, stride_h, D, eps,
                         HAS_RESIDUAL: tl.constexpr, BLOCK_D: tl.constexpr):
        # one program per row; a row is x[n, h, :] (H = 1 for a 2-D input)
        pid = tl.program_id(0)
        n = pid // H
        h = pid % H
        cols = tl.arange(0, BLOCK_D)
        mask = cols < D
        x = tl.load(x_ptr + n * stride_n + h * stride_h + cols, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + pid * D + cols, mask=mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # rounded as the eager add rounds
            tl.store(res_out_ptr + pid * D + cols, x, mask=mask)
        x32 = x.to(tl.float32)
        var = tl.sum(x32 * x32, axis=0) / D
        y = (x32 * tl.math.rsqrt(var + eps)).to(x.dtype)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        tl.store(out_ptr + pid * D + cols, (w.to(tl.float32) * y.to(tl.float32)).to(x.dtype), mask=mask)

    @triton.jit
    def _silu_and_mul_kernel(x_ptr, out_ptr, I, BLOCK: tl.constexpr):
        n = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < I
        gate = tl.load(x_ptr + n * 2 * I + cols, mask=mask, other=0.0)
        up = tl.load(x_ptr + n * 2 * I + I + cols, mask=mask, other=0.0)
        g32 = gate.to(tl.float32)
        act = (g32 / (1.0 + tl.exp(-g32))).to(gate.dtype)
        tl.store(out_ptr + n * I + cols, (act.to(tl.float32) * up.to(tl.float32)).to(gate.dtype), mask=mask)

    @triton.jit
    def _rotate_head(src, dst, p, cos_ptr, sin_ptr, w_ptr, eps, HALF: tl.constexpr, BLOCK: tl.constexpr,
                     NORM: tl.constexpr):
        """dst = src * cos + rotate_half(src) * sin for one head at position p, each product and
        the sum rounded to the input dtype as eager torch rounds them (stored in dst's dtype).
        With NORM the head is first RMS-normalised and scaled by w (Qwen3's q/k norm), rounded
        as `_rms_norm_kernel` rounds: two kernels a layer fewer than a separate norm."""
        i = tl.arange(0, BLOCK)
        mask = i < HALF
        x1 = tl.load(src + i, mask=mask, other=0.0)
        x2 = tl.load(src + HALF + i, mask=mask, other=0.0)
        dt = x1.dtype
        if NORM:
            n1, n2 = x1.to(tl.float32), x2.to(tl.float32)
            var = (tl.sum(n1 * n1, axis=0) + tl.sum(n2 * n2, axis=0)) / (2 * HALF)
            r = tl.math.rsqrt(var + eps)
            w1 = tl.load(w_ptr + i, mask=mask, other=0.0).to(tl.float32)
            w2 = tl.load(w_ptr + HALF + i, mask=mask, other=0.0).to(tl.float32)
            x1 = (w1 * (n1 * r).to(dt).to(tl.float32)).to(dt)
            x2 = (w2 * (n2 * r).to(dt).to(tl.float32)).to(dt)
        # the tables are [positions, 2 * HALF] with both halves equal (cat([f, f]))
        c = tl.load(cos_ptr + p * 2 * HALF + i, mask=mask, other=0.0).to(dt).to(tl.float32)
        s = tl.load(sin_ptr + p * 2 * HALF + i, mask=mask, other=0.0).to(dt).to(tl.float32)
        a1, a2 = x1.to(tl.float32), x2.to(tl.float32)
        o1 = ((a1 * c).to(dt).to(tl.float32) + (-a2 * s).to(dt).to(tl.float32)).to(dt)
        o2 = ((a2 * c).to(dt).to(tl.float32) + (a1 * s).to(dt).to(tl.float32)).to(dt)
        tl.store(dst + i, o1.to(dst.dtype.element_ty), mask=mask)
        tl.store(dst + HALF + i, o2.to(dst.dtype.element_ty), mask=mask)

    @triton.jit
    def _rotary_kernel(q_ptr, k_ptr, q_out_ptr, k_out_ptr, pos_ptr, cos_ptr, sin_ptr,
                       HQ, HK, stride_qn, stride_qh, stride_kn, stride_kh,
                       HALF: tl.constexpr, BLOCK: tl.constexpr):
        # one program per (token, head) over q's heads then k's
        n = tl.program_id(0)
        h = tl.program_id(1)
        p = tl.load(pos_ptr + n).to(tl.int64)
        if h < HQ:
            _rotate_head(q_ptr + n * stride_qn + h * stride_qh, q_out_ptr + (n * HQ + h) * 2 * HALF,
                         p, cos_ptr, sin_ptr, cos_ptr, 0.0, HALF, BLOCK, False)
        else:
            _rotate_head(k_ptr + n * stride_kn + (h - HQ) * stride_kh, k_out_ptr + (n * HK + (h - HQ)) * 2 * HALF,
                         p, cos_ptr, sin_ptr, cos_ptr, 0.0, HALF, BLOCK, False)

    @triton.jit
    def _rotary_store_kernel(q_ptr, k_ptr, v_ptr, q_out_ptr, kc_ptr, vc_ptr, slot_ptr, pos_ptr, cos_ptr, sin_ptr,
                             qw_ptr, kw_ptr, eps,
                             HQ, HK, stride_qn, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh,
                             HALF: tl.constexpr, BLOCK: tl.constexpr, NORM: tl.constexpr):
        # one program per (token, head) over q's heads, then k's, then v's; the caches are
        # [slots, HK, 2 * HALF] contiguous
        n = tl.program_id(0)
        h = tl.program_id(1)
        slot = tl.load(slot_ptr + n).to(tl.int64)
        if h < HQ + HK:
            p = tl.load(pos_ptr + n).to(tl.int64)
            if h < HQ:
                _rotate_head(q_ptr + n * stride_qn + h * stride_qh, q_out_ptr + (n * HQ + h) * 2 * HALF,
                             p, cos_ptr, sin_ptr, qw_ptr, eps, HALF, BLOCK, NORM)
            else:
                _rotate_head(k_ptr + n * stride_kn + (h - HQ) * stride_kh, kc_ptr + (slot * HK + (h - HQ)) * 2 * HALF,
                             p, cos_ptr, sin_ptr, kw_ptr, eps, HALF, BLOCK, NORM)
        else:
            i = tl.arange(0, BLOCK)
            mask = i < HALF
            hv = h - HQ - HK
            src = v_ptr + n * stride_vn + hv * stride_vh
            dst = vc_ptr + (slot * HK + hv) * 2 * HALF
            tl.store(dst + i, tl.load(src + i, mask=mask, other=0.0).to(dst.dtype.element_ty), mask=mask)
            tl.store(dst + HALF + i, tl.load(src + HALF + i, mask=mask, other=0.0).to(dst.dtype.element_ty),
                     mask=mask)

    def _rows(x: torch.Tensor) -> tuple[int, int, int, int]:
        """(rows n, heads h, stride_n, stride_h) of a 2-D or 3-D tensor with last stride 1."""
        if x.stride(-1) != 1:
            raise ValueError("the last dimension must be contiguous")
        if x.dim() == 2:
            return x.shape[0], 1, x.stride(0), 0
        if x.dim() == 3:
            return x.shape[0], x.shape[1], x.stride(0), x.stride(1)
        raise ValueError(f"expected a 2-D or 3-D tensor, got {x.dim()}-D")

    def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        n, h, sn, sh = _rows(x)
        d = x.shape[-1]
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        if n * h:
            _rms_norm_kernel[(n * h,)](x, x, weight, out, out, h, sn, sh, d, eps,
                                       HAS_RESIDUAL=False, BLOCK_D=triton.next_power_of_2(d))
        return out

    def add_rms_norm_triton(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                            eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        n, h, sn, sh = _rows(x)
        d = x.shape[-1]
        residual = residual.contiguous()
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        summed = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        if n * h:
            _rms_norm_kernel[(n * h,)](x, residual, weight, out, summed, h, sn, sh, d, eps,
                                       HAS_RESIDUAL=True, BLOCK_D=triton.next_power_of_2(d))
        return out, summed

    def add_argmax_triton(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        # split over the vocabulary: (row, chunk) programs and a per-row combine (sglaunch/kernels/vocab_reduce.py)
        from .vocab_reduce import add_argmax_triton as split_add_argmax

        return split_add_argmax(a, b)

    def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        n, width = x.shape
        inter = width // 2
        out = torch.empty(n, inter, dtype=x.dtype, device=x.device)
        block = min(1024, triton.next_power_of_2(inter))
        if n:
            _silu_and_mul_kernel[(n, triton.cdiv(inter, block))](x, out, inter, BLOCK=block)
        return out

    def rotary_triton(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_table: torch.Tensor,
                      sin_table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n, hq, d = q.shape
        hk = k.shape[1]
        if q.stride(-1) != 1 or k.stride(-1) != 1:
            raise ValueError("q and k need a contiguous last dimension")
        q_out = torch.empty(n, hq, d, dtype=q.dtype, device=q.device)
        k_out = torch.empty(n, hk, d, dtype=k.dtype, device=k.device)
        if n:
            half = d // 2
            _rotary_kernel[(n, hq + hk)](q, k, q_out, k_out, positions.contiguous(), cos_table, sin_table,
                                         hq, hk, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                                         HALF=half, BLOCK=triton.next_power_of_2(half))
        return q_out, k_out

    def rotary_store_triton(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            cos_table: torch.Tensor, sin_table: torch.Tensor, k_cache: torch.Tensor,
                            v_cache: torch.Tensor, slots: torch.Tensor, q_weight: torch.Tensor | None = None,
                            k_weight: torch.Tensor | None = None, eps: float = 0.0) -> torch.Tensor:
        n, hq, d = q.shape
        hk = k.shape[1]
        if any(t.stride(-1) != 1 for t in (q, k, v)):
            raise ValueError("q, k and v need a contiguous last dimension")
        if not (k_cache.is_contiguous() and v_cache.is_contiguous()) or tuple(k_cache.shape[1:]) != (hk, d):
            raise ValueError("the K/V caches must be contiguous [slots, kv_heads, head_dim]")
        q_out = torch.empty(n, hq, d, dtype=q.dtype, device=q.device)
        if n:
            half = d // 2
            norm = q_weight is not None
            if norm and (k_weight is None or q_weight.numel() != d or k_weight.numel() != d):
                raise ValueError("the q/k norm needs both weights, each of head_dim elements")
            _rotary_store_kernel[(n, hq + 2 * hk)](
                q, k, v, q_out, k_cache, v_cache, slots.contiguous(), positions.contiguous(), cos_table, sin_table,
                q_weight if norm else cos_table, k_weight if norm else cos_table, float(eps),
                hq, hk, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                HALF=half, BLOCK=triton.next_power_of_2(half), NORM=norm)
        return q_out
