"""Top-k, top-p and min-p over a row's probabilities without sorting it: one program a row.

`sglaunch.engine.sampler.sorted_filter` sorts each row (49,152 tokens for SmolLM2), takes the
cumulative mass and scatters the kept probabilities back. On an H100 a burst iteration that does so
for its 8 rows a request cost 0.2 ms more than one without at 1 request, 0.55 ms more at 8
(benchmarks/gpu39, the start-up profiles of the filtered and sampled bursts).

Every rule keeps a token when its probability is at least some threshold: top-k keeps p_x when fewer
than k tokens are more likely, top-p when the mass of the tokens more likely than it is under top_p,
min-p when p_x >= min_p * max p. Each condition only gets easier as p_x grows, so the kept tokens are
{x : p_x >= t} for the least t where all three hold:

    count(p > t) < top_k  and  sum(p > t) < top_p  and  t >= min_p * max(p)

and since non-negative float32 values order as their bit patterns do, a bisection over those bits
(32 steps, each one pass over the row) finds t exactly. One pass more sums what is kept, one writes
the renormalised row. The row stays in L2 between passes (196 KB for 49,152 tokens).

Ties: where tokens of equal probability straddle the boundary, the sorted filter keeps as many of
them as its sort order lets through, this kernel all of them (the rule above reads "more likely
than", which ties are not). Rows without ties at the boundary keep the same tokens, up to float32
sums in another order where the mass before a token is within about 1e-6 of top_p.
"""

from __future__ import annotations

import torch

from . import HAS_TRITON, use_triton

BLOCK = 2048
STEPS = 32  # bisection steps over a float32's bit pattern (31 would do: the sign bit is 0)


def threshold_filter_reference(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                               min_p: torch.Tensor) -> torch.Tensor:
    """The rule above with torch operators: probs [n, V] (each row a distribution), top_k / top_p /
    min_p [n] or [n, 1] -> [n, V] float32, each row's kept probabilities renormalised. The mass more
    likely than each token is read from a descending sort: for a run of equal values, the mass
    before the run's first member."""
    p = probs.float()
    n, V = p.shape
    k, tp, mp = (x.reshape(n, 1).to(p.device) for x in (top_k, top_p, min_p))
    values, _ = p.sort(dim=-1, descending=True)
    before = values.cumsum(-1) - values  # mass before each sorted position
    rank = torch.arange(V, device=p.device).expand(n, V)
    # a run of equal values takes its first member's rank and mass before
    first = torch.ones_like(values, dtype=torch.bool)
    first[:, 1:] = values[:, 1:] != values[:, :-1]
    start = torch.where(first, rank, torch.zeros_like(rank)).cummax(-1).values
    ok = (start < k) & (before.gather(1, start) < tp) & (values >= mp * values[:, :1])
    ok[:, 0] = True  # the most likely token always stays (its run's count and mass before are 0)
    # the least kept value: ok holds on a prefix of the sorted row
    last = ok.sum(-1, keepdim=True) - 1
    t = values.gather(1, last)
    kept = torch.where(p >= t, p, torch.zeros_like(p))
    return kept / kept.sum(-1, keepdim=True)


def threshold_filter(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                     min_p: torch.Tensor) -> torch.Tensor:
    """threshold_filter_reference's result: the kernel where the DSpark kernels run
    (sglaunch.kernels.use_triton), else the reference. No host sync: a CUDA graph can hold it."""
    if not use_triton(probs.device):
        return threshold_filter_reference(probs, top_k, top_p, min_p)
    n, V = probs.shape
    p = probs.float().contiguous()
    out = torch.empty_like(p)
    if n:
        k, tp, mp = (x.reshape(n) for x in (top_k, top_p, min_p))
        _filter_kernel[(n,)](p, out, k.to(torch.int64).contiguous(), tp.float().contiguous(),
                             mp.float().contiguous(), V, BLOCK=min(BLOCK, triton.next_power_of_2(V)), STEPS=STEPS)
    return out


if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _filter_kernel(p_ptr, out_ptr, k_ptr, tp_ptr, mp_ptr, V, BLOCK: tl.constexpr, STEPS: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        row = p_ptr + r * V
        k = tl.load(k_ptr + r)
        top_p = tl.load(tp_ptr + r)
        min_p = tl.load(mp_ptr + r)
        # the row's maximum: the threshold never passes it (nothing is more likely than it)
        top = 0.0
        for start in range(0, V, BLOCK):
            v = start + tl.arange(0, BLOCK)
            top = tl.maximum(top, tl.max(tl.load(row + v, mask=v < V, other=0.0), axis=0))
        floor = min_p * top
        # the least t (as bits) where count(p > t) < k, sum(p > t) < top_p and t >= floor
        hi = top.to(tl.int32, bitcast=True)
        lo = hi * 0
        for _ in range(STEPS):
            mid = lo + (hi - lo) // 2
            t = mid.to(tl.float32, bitcast=True)
            count = 0
            mass = 0.0
            for start in range(0, V, BLOCK):
                v = start + tl.arange(0, BLOCK)
                x = tl.load(row + v, mask=v < V, other=0.0)
                above = x > t
                count += tl.sum(above.to(tl.int32), axis=0)
                mass += tl.sum(tl.where(above, x, 0.0), axis=0)
            ok = (count < k) & (mass < top_p) & (t >= floor)
            hi = tl.where(ok, mid, hi)
            lo = tl.where(ok, lo, mid + 1)
        t = hi.to(tl.float32, bitcast=True)
        kept = 0.0
        for start in range(0, V, BLOCK):
            v = start + tl.arange(0, BLOCK)
            x = tl.load(row + v, mask=v < V, other=0.0)
            kept += tl.sum(tl.where(x >= t, x, 0.0), axis=0)
        for start in range(0, V, BLOCK):
            v = start + tl.arange(0, BLOCK)
            x = tl.load(row + v, mask=v < V, other=0.0)
            tl.store(out_ptr + r * V + v, tl.where(x >= t, x, 0.0) / kept, mask=v < V)
