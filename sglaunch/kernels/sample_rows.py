"""A decode step's sampling in one kernel, for rows that are greedy or sample at a temperature alone.

`sglaunch.engine.sampler.sample_device` makes about thirty small operators of a step whose rows
sample at T > 0 (the temperature's softmax, a float64 running sum, a search, validity checks, the
log-probability of the choice, the stacking of the read-back), each a host call: on an H100 whose
host was slower, plain decoding at T = 0.7 served 0.7x of another H100's while T = 0 matched
(benchmarks/gpu38). Here one program per row reads its logits three times:

1. the maximum and the first index of it (torch.argmax's choice: the first NaN where there is one),
   and whether the row holds a NaN or +inf;
2. sum_j exp(x_j - max) (the log-probability's normaliser) and sum_j exp((x_j - max) / T);
3. for a sampled row, the first j whose running sum of exp((x_j - max) / T) exceeds u times the
   total, never a zero-probability entry: the inverse-CDF draw of `sampler.draw`.

It writes the read-back `sample_device` returns, [3, rows] float64: the token, its log-probability
under the unmodified distribution (log_softmax(x)[token]), and 1.0 where a sampled row cannot be
sampled (a NaN or +inf logit, a temperature that is not a positive number). A greedy row (T below
GREEDY_TEMPERATURE) takes the argmax. The sums are float32 (the reference's running sum is
float64), so a uniform within about 1e-6 of a boundary between two tokens may pick the other one;
the distribution is the same.

`filtered_sample` is the same kernel with top-k, top-p and min-p: between passes 2 and 3 a row that
filters finds its threshold t over the tempered probabilities by bisecting float32 bits, as
sglaunch/kernels/filter_rows.py does over a probability row (here each pass recomputes the
probabilities from the logits), and the draw runs over {p >= t} alone. Ties at the boundary are all
kept, as there. Its reference is that module's reference filter followed by the same draw.
"""

from __future__ import annotations

import torch

from . import HAS_TRITON, use_triton

GREEDY_TEMPERATURE = 1e-5  # sglaunch.engine.sampler's
BLOCK = 1024
FILTER_STEPS = 32  # bisection steps over a float32's bit pattern (filter_rows.STEPS)


def temperature_sample_reference(logits: torch.Tensor, temperatures: torch.Tensor,
                                 uniforms: torch.Tensor) -> torch.Tensor:
    """The same result with torch operators (float64 running sums): logits [n, V] float32,
    temperatures [n] (below GREEDY_TEMPERATURE: greedy), uniforms [n] in [0, 1) -> [3, n] float64."""
    x = logits.float()
    V = x.shape[-1]
    greedy = temperatures < GREEDY_TEMPERATURE
    tokens = x.argmax(-1)
    scale = torch.where(greedy, torch.ones_like(temperatures), temperatures).float()
    probs = torch.softmax(x / scale[:, None], dim=-1)
    cdf = probs.double().cumsum(-1)
    total = cdf[:, -1]
    bad = ~(torch.isfinite(probs).all(-1) & (probs >= 0).all(-1) & (total > 0))
    drawn = torch.searchsorted(cdf, (uniforms.double() * total)[:, None], right=True)[:, 0].clamp_(max=V - 1)
    tokens = torch.where(greedy, tokens, drawn)
    logprobs = torch.log_softmax(x, dim=-1).gather(1, tokens[:, None])[:, 0]
    return torch.stack([tokens.double(), logprobs.double(), (bad & ~greedy).double()])


def temperature_sample(logits: torch.Tensor, temperatures: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """[3, n] float64 (token, log-probability, cannot-sample flag): the kernel where the DSpark
    kernels run (sglaunch.kernels.use_triton), else the reference."""
    if not use_triton(logits.device):
        return temperature_sample_reference(logits, temperatures, uniforms)
    n, V = logits.shape
    x = logits if logits.stride(-1) == 1 else logits.contiguous()
    out = torch.empty(3, n, dtype=torch.float64, device=logits.device)
    if n:
        _sample_kernel[(n,)](x, x.stride(0), temperatures.float().contiguous(), uniforms.float().contiguous(), out,
                             n, V, GREEDY_TEMPERATURE, out, out, out, BLOCK=min(BLOCK, triton.next_power_of_2(V)),
                             FILTER=False, STEPS=FILTER_STEPS)
    return out


def filtered_sample_reference(logits: torch.Tensor, temperatures: torch.Tensor, uniforms: torch.Tensor,
                              top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """filtered_sample's result with torch operators: each sampled row's tempered softmax through
    filter_rows.threshold_filter_reference, then the float64 inverse-CDF draw; greedy rows take the
    argmax. top_k [n] int (the vocabulary size keeps every token), top_p [n], min_p [n]."""
    from .filter_rows import threshold_filter_reference

    x = logits.float()
    V = x.shape[-1]
    greedy = temperatures < GREEDY_TEMPERATURE
    scale = torch.where(greedy, torch.ones_like(temperatures), temperatures).float()
    probs = threshold_filter_reference(torch.softmax(x / scale[:, None], dim=-1), top_k, top_p, min_p)
    cdf = probs.double().cumsum(-1)
    total = cdf[:, -1]
    bad = ~(torch.isfinite(probs).all(-1) & (probs >= 0).all(-1) & (total > 0))
    drawn = torch.searchsorted(cdf, (uniforms.double() * total)[:, None], right=True)[:, 0].clamp_(max=V - 1)
    tokens = torch.where(greedy, x.argmax(-1), drawn)
    logprobs = torch.log_softmax(x, dim=-1).gather(1, tokens[:, None])[:, 0]
    return torch.stack([tokens.double(), logprobs.double(), (bad & ~greedy).double()])


def filtered_sample(logits: torch.Tensor, temperatures: torch.Tensor, uniforms: torch.Tensor,
                    top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """temperature_sample with each row's top-k / top-p / min-p ([n] device tensors; top_k = V,
    top_p = 1, min_p = 0 filter nothing): [3, n] float64, the kernel where the DSpark kernels run,
    else the reference. No host sync."""
    if not use_triton(logits.device):
        return filtered_sample_reference(logits, temperatures, uniforms, top_k, top_p, min_p)
    n, V = logits.shape
    x = logits if logits.stride(-1) == 1 else logits.contiguous()
    out = torch.empty(3, n, dtype=torch.float64, device=logits.device)
    if n:
        _sample_kernel[(n,)](x, x.stride(0), temperatures.float().contiguous(), uniforms.float().contiguous(), out,
                             n, V, GREEDY_TEMPERATURE, top_k.to(torch.int64).contiguous(), top_p.float().contiguous(),
                             min_p.float().contiguous(), BLOCK=min(BLOCK, triton.next_power_of_2(V)), FILTER=True,
                             STEPS=FILTER_STEPS)
    return out


if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _sample_kernel(x_ptr, stride, temp_ptr, u_ptr, out_ptr, n, V, GREEDY, k_ptr, tp_ptr, mp_ptr,
                       BLOCK: tl.constexpr, FILTER: tl.constexpr, STEPS: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        row = x_ptr + r * stride
        T = tl.load(temp_ptr + r)
        greedy = T < GREEDY
        inv = 1.0 / tl.where(greedy, 1.0, T)
        # 1. the maximum over the non-NaN values, its first index, the first NaN, any NaN or +inf
        best = -float("inf")
        best_i = V
        first_nan = V
        hot = 0
        for start in range(0, V, BLOCK):
            v = start + tl.arange(0, BLOCK)
            inside = v < V
            x = tl.load(row + v, mask=inside, other=-float("inf")).to(tl.float32)
            nan = (x != x) & inside
            first_nan = tl.minimum(first_nan, tl.min(tl.where(nan, v, V), axis=0))
            hot = tl.maximum(hot, tl.max((nan | (x == float("inf"))).to(tl.int32), axis=0))
            y = tl.where(nan, -float("inf"), x)
            m = tl.max(y, axis=0)
            i = tl.min(tl.where((y == m) & inside, v, V), axis=0)
            better = m > best
            best_i = tl.where(better, i, best_i)
            best = tl.where(better, m, best)
        argmax = tl.where(first_nan < V, first_nan, tl.where(best_i < V, best_i, 0))
        # 2. the normalisers
        s_raw = 0.0
        s_t = 0.0
        for start in range(0, V, BLOCK):
            v = start + tl.arange(0, BLOCK)
            x = tl.load(row + v, mask=v < V, other=-float("inf")).to(tl.float32)
            s_raw += tl.sum(tl.exp(x - best), axis=0)
            s_t += tl.sum(tl.exp((x - best) * inv), axis=0)
        # 2b. (FILTER) the least t with count(p > t) < k, sum(p > t) < top_p and t >= min_p * max p,
        # p_j = exp((x_j - max) / T) / s_t: bisection over t's float32 bits (filter_rows.py), then the
        # draw's total is the kept mass. A row that filters nothing keeps t = 0.
        cut = 0.0
        total = s_t
        if FILTER:
            k = tl.load(k_ptr + r)
            top_p = tl.load(tp_ptr + r)
            min_p = tl.load(mp_ptr + r)
            inv_s = 1.0 / s_t
            if (greedy == 0) & ((k < V) | (top_p < 1.0) | (min_p > 0.0)) & (s_t > 0):
                top = inv_s  # the most likely token's probability: exp(0) / s_t
                floor = min_p * top
                hi = top.to(tl.int32, bitcast=True)
                lo = hi * 0
                for _ in range(STEPS):
                    mid = lo + (hi - lo) // 2
                    t = mid.to(tl.float32, bitcast=True)
                    count = 0
                    mass = 0.0
                    for start in range(0, V, BLOCK):
                        v = start + tl.arange(0, BLOCK)
                        x = tl.load(row + v, mask=v < V, other=-float("inf")).to(tl.float32)
                        p = tl.exp((x - best) * inv) * inv_s
                        above = p > t
                        count += tl.sum(above.to(tl.int32), axis=0)
                        mass += tl.sum(tl.where(above, p, 0.0), axis=0)
                    ok = (count < k) & (mass < top_p) & (t >= floor)
                    hi = tl.where(ok, mid, hi)
                    lo = tl.where(ok, lo, mid + 1)
                cut = hi.to(tl.float32, bitcast=True)
                total = 0.0
                for start in range(0, V, BLOCK):
                    v = start + tl.arange(0, BLOCK)
                    x = tl.load(row + v, mask=v < V, other=-float("inf")).to(tl.float32)
                    e = tl.exp((x - best) * inv)
                    total += tl.sum(tl.where(e * inv_s >= cut, e, 0.0), axis=0)
        # 3. the draw of a sampled row: first j with a running sum over u * total, p_j > 0 (and, with
        # FILTER, p_j >= the row's threshold)
        threshold = tl.load(u_ptr + r) * total
        running = 0.0
        found = V
        last = -1
        if greedy == 0:
            for start in range(0, V, BLOCK):
                v = start + tl.arange(0, BLOCK)
                x = tl.load(row + v, mask=v < V, other=-float("inf")).to(tl.float32)
                p = tl.exp((x - best) * inv)
                if FILTER:
                    p = tl.where(p * inv_s >= cut, p, 0.0)
                cs = tl.cumsum(p, axis=0) + running
                hit = (cs > threshold) & (p > 0) & (v < V)
                found = tl.minimum(found, tl.min(tl.where(hit, v, V), axis=0))
                last = tl.maximum(last, tl.max(tl.where((p > 0) & (v < V), v, -1), axis=0))
                running += tl.sum(p, axis=0)
        drawn = tl.where(found < V, found, tl.where(last >= 0, last, argmax))
        token = tl.where(greedy, argmax, drawn)
        xt = tl.load(row + token).to(tl.float32)
        logprob = xt - best - tl.log(s_raw)
        # NOTE: a NaN temperature makes s_t NaN, which fails s_t > 0
        bad = tl.where(greedy, 0, tl.where((hot > 0) | (s_t != s_t), 1, tl.where(s_t > 0, 0, 1)))
        tl.store(out_ptr + r, token.to(tl.float64))
        tl.store(out_ptr + n + r, logprob.to(tl.float64))
        tl.store(out_ptr + 2 * n + r, bad.to(tl.float64))
