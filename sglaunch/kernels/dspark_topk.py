"""Prefix survival and top-K verify allocation (the device half of the DSpark planner).

survival[r, j] = prod_{i <= j} sigmoid(conf_logit[r, i] / T_i)          (STS temperatures T)
window[r]      = number of (r, j) among the `budget` best candidates of all active requests,
                 ordered by survival descending, then position j ascending, then request r
                 ascending. NOTE: the tie-break never looks at values, so a fixed budget stays
                 non-anticipating; survival is non-increasing in j, so every window is a prefix.
"""

from __future__ import annotations

import torch

from . import HAS_TRITON

# --------------------------------------------------------------------------- torch references


def survival_reference(conf_logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """[R, G] logits, [G] temperatures -> [R, G] float32 survival (sequential product)."""
    c = torch.sigmoid(conf_logits.float() / temperatures.float()[None, :])  # [R, G]
    out = torch.empty_like(c)
    running = torch.ones_like(c[:, 0])
    for j in range(c.shape[1]):  # NOTE: same multiplication order as the kernel
        running = running * c[:, j]
        out[:, j] = running
    return out


def topk_windows_reference(survival: torch.Tensor, active: torch.Tensor, budget: int) -> torch.Tensor:
    """[R, G] survival, [R] bool active -> [R] int32 windows (draft tokens verified per request)."""
    R, G = survival.shape
    # flatten position-major (index j * R + r): a stable sort then breaks ties by (j, r)
    keys = survival.float().t().reshape(-1)  # [G * R]
    owner_active = active.bool().repeat(G)  # [G * R]
    keys = torch.where(owner_active, keys, torch.full_like(keys, -1.0))
    order = torch.sort(keys, descending=True, stable=True).indices
    take = min(int(budget), int(owner_active.sum()))
    chosen = order[:take]
    windows = torch.zeros(R, dtype=torch.int32, device=survival.device)
    windows.index_add_(0, chosen % R, torch.ones_like(chosen, dtype=torch.int32))
    return windows


# --------------------------------------------------------------------------- Triton kernels

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _survival_kernel(logit_ptr, temp_ptr, out_ptr, R, G: tl.constexpr, BLOCK_R: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        mask = rows < R
        running = tl.full([BLOCK_R], 1.0, tl.float32)
        for j in tl.static_range(G):
            x = tl.load(logit_ptr + rows * G + j, mask=mask, other=0.0).to(tl.float32)
            t = tl.load(temp_ptr + j).to(tl.float32)
            running = running * tl.sigmoid(x / t)
            tl.store(out_ptr + rows * G + j, running, mask=mask)

    @triton.jit
    def _topk_kernel(surv_ptr, active_ptr, out_ptr, R, budget, G: tl.constexpr, BLOCK_G: tl.constexpr,
                     BLOCK_N: tl.constexpr):
        # one program per request r: rank each of its G candidates against all candidates
        r = tl.program_id(0)
        j = tl.arange(0, BLOCK_G)
        jmask = j < G
        mine = tl.load(surv_ptr + r * G + j, mask=jmask, other=-1.0)  # [BLOCK_G]
        my_active = tl.load(active_ptr + r) != 0
        rank = tl.zeros([BLOCK_G], tl.int32)
        total = R * G
        for start in range(0, total, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)  # flat candidate index rr * G + jj
            nmask = n < total
            rr = n // G
            jj = n % G
            other = tl.load(surv_ptr + n, mask=nmask, other=-1.0)
            ok = nmask & (tl.load(active_ptr + rr, mask=nmask, other=0) != 0)
            o = other[None, :]
            beats = (o > mine[:, None]) | (
                (o == mine[:, None]) & ((jj[None, :] < j[:, None]) | ((jj[None, :] == j[:, None]) & (rr[None, :] < r)))
            )
            rank += tl.sum((beats & ok[None, :]).to(tl.int32), axis=1)
        chosen = jmask & (rank < budget) & my_active
        tl.store(out_ptr + r, tl.sum(chosen.to(tl.int32), axis=0))

    def survival_triton(conf_logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
        R, G = conf_logits.shape
        out = torch.empty(R, G, dtype=torch.float32, device=conf_logits.device)
        BLOCK_R = 64
        _survival_kernel[(triton.cdiv(R, BLOCK_R),)](
            conf_logits.contiguous(), temperatures.contiguous().float(), out, R, G=G, BLOCK_R=BLOCK_R)
        return out

    def topk_windows_triton(survival: torch.Tensor, active: torch.Tensor, budget: int) -> torch.Tensor:
        R, G = survival.shape
        out = torch.empty(R, dtype=torch.int32, device=survival.device)
        _topk_kernel[(R,)](survival.contiguous().float(), active.to(torch.int32).contiguous(), out, R, int(budget),
                           G=G, BLOCK_G=triton.next_power_of_2(G), BLOCK_N=256)
        return out
