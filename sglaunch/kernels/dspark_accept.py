"""Acceptance for one verify step: greedy and rejection sampling, given uniform randoms.

Names follow the papers: q = the drafter's (Markov-corrected) distribution, P = the target's.
Per request r with accept length L (draft tokens eligible for acceptance):
  greedy:  accept x_i while x_i == argmax P_i; next token = argmax P_n.
  sampled: accept x_i while u_i * q_i(x_i) < P_i(x_i) (i.e. u_i < P/q); n = leading run.
           n < L: next ~ norm(max(P_n - q_n, 0)) (P_n if that mass <= EPS); n == L: next ~ P_L.
           Draws use inverse CDF at `sample_uniforms[r]` (first v with cumsum > u * mass).
Target rows are flat: request r's rows P_0..P_L start at target_row_start[r] (compact layout;
padded layouts pass r * (G + 1)).
"""

from __future__ import annotations

import torch

from . import HAS_TRITON

RESIDUAL_EPS = 1e-6


def inverse_cdf_reference(dist: torch.Tensor, u: float) -> int:
    """First index whose running sum exceeds u * sum(dist); the last positive entry if rounding
    leaves none."""
    total = dist.sum()
    above = torch.nonzero((dist.cumsum(0) > u * total) & (dist > 0))
    if above.numel():
        return int(above[0, 0])
    return int(torch.nonzero(dist > 0)[-1, 0])


def accept_reference(draft_tokens, draft_probs, target_probs, target_row_start, accept_lens, greedy, uniforms,
                     sample_uniforms) -> tuple[torch.Tensor, torch.Tensor]:
    """Loop form. draft_tokens [R, G], draft_probs [R, G, V] (None if all greedy), target_probs
    [T, V], target_row_start [R], accept_lens [R], greedy [R] bool, uniforms [R, G],
    sample_uniforms [R] -> (num_accepted [R] int32, next_token [R] int64)."""
    R = draft_tokens.shape[0]
    num_accepted = torch.zeros(R, dtype=torch.int32)
    next_token = torch.zeros(R, dtype=torch.int64)
    for r in range(R):
        row0, L, n = int(target_row_start[r]), int(accept_lens[r]), 0
        while n < L:
            x = int(draft_tokens[r, n])
            P = target_probs[row0 + n]
            ok = int(P.argmax()) == x if greedy[r] else float(uniforms[r, n]) * float(draft_probs[r, n, x]) < float(P[x])
            if not ok:
                break
            n += 1
        P = target_probs[row0 + n].float()
        if greedy[r]:
            token = int(P.argmax())
        else:
            dist = P
            if n < L:
                residual = (P - draft_probs[r, n].float()).clamp_min(0.0)
                dist = residual if float(residual.sum()) > RESIDUAL_EPS else P
            token = inverse_cdf_reference(dist, float(sample_uniforms[r]))
        num_accepted[r], next_token[r] = n, token
    return num_accepted.to(draft_tokens.device), next_token.to(draft_tokens.device)


if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _row_argmax(row_ptr, V, BLOCK_V: tl.constexpr):
        best_val = -float("inf")
        best_idx = 0
        for start in range(0, V, BLOCK_V):
            v = start + tl.arange(0, BLOCK_V)
            vals = tl.load(row_ptr + v, mask=v < V, other=-float("inf")).to(tl.float32)
            m = tl.max(vals, axis=0)
            idx = tl.min(tl.where(vals == m, v, V), axis=0)  # first index of the tile's max
            better = m > best_val  # NOTE: strict, so the earliest tile wins ties (torch.argmax)
            best_idx = tl.where(better, idx, best_idx)
            best_val = tl.where(better, m, best_val)
        return best_idx

    @triton.jit
    def _dist_tile(p_ptr, q_ptr, v, V, use_residual):
        # use_residual: int32 scalar (0/1)
        p = tl.load(p_ptr + v, mask=v < V, other=0.0).to(tl.float32)
        q = tl.load(q_ptr + v, mask=v < V, other=0.0).to(tl.float32) * use_residual
        return tl.where(use_residual != 0, tl.maximum(p - q, 0.0), p)

    @triton.jit
    def _sample_row(p_ptr, q_ptr, V, use_residual, u, EPS, BLOCK_V: tl.constexpr):
        mass = 0.0
        for start in range(0, V, BLOCK_V):
            v = start + tl.arange(0, BLOCK_V)
            mass += tl.sum(_dist_tile(p_ptr, q_ptr, v, V, use_residual), axis=0)
        use_residual = use_residual * (mass > EPS).to(tl.int32)  # residual mass ~ 0: fall back to P
        if use_residual == 0:
            mass = 0.0
            for start in range(0, V, BLOCK_V):
                v = start + tl.arange(0, BLOCK_V)
                mass += tl.sum(_dist_tile(p_ptr, q_ptr, v, V, use_residual), axis=0)
        threshold = u * mass
        running = 0.0
        found = V
        last_pos = -1
        for start in range(0, V, BLOCK_V):
            v = start + tl.arange(0, BLOCK_V)
            d = _dist_tile(p_ptr, q_ptr, v, V, use_residual)
            cs = tl.cumsum(d, axis=0) + running
            hit = (cs > threshold) & (d > 0) & (v < V)
            found = tl.minimum(found, tl.min(tl.where(hit, v, V), axis=0))
            last_pos = tl.maximum(last_pos, tl.max(tl.where(d > 0, v, -1), axis=0))
            running += tl.sum(d, axis=0)
        return tl.where(found < V, found, last_pos)

    @triton.jit
    def _accept_kernel(draft_ptr, q_ptr, p_ptr, row_start_ptr, lens_ptr, greedy_ptr, u_ptr, us_ptr, n_out, tok_out,
                       V, EPS, G: tl.constexpr, BLOCK_V: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        row0 = tl.load(row_start_ptr + r).to(tl.int64)
        L = tl.load(lens_ptr + r)
        greedy = tl.load(greedy_ptr + r) != 0
        alive = L > 0
        n = 0
        for i in tl.static_range(G):
            x = tl.load(draft_ptr + r * G + i)
            p_row = p_ptr + (row0 + tl.minimum(i, L)) * V
            if greedy:
                ok = _row_argmax(p_row, V, BLOCK_V) == x
            else:
                q_x = tl.load(q_ptr + (r * G + i) * V + x).to(tl.float32)
                p_x = tl.load(p_row + x).to(tl.float32)
                ok = tl.load(u_ptr + r * G + i) * q_x < p_x
            alive = alive & (i < L) & ok
            n += alive.to(tl.int32)
        p_row = p_ptr + (row0 + n) * V
        if greedy:
            token = _row_argmax(p_row, V, BLOCK_V)
        else:
            q_row = q_ptr + (r * G + tl.minimum(n, G - 1)) * V
            token = _sample_row(p_row, q_row, V, (n < L).to(tl.int32), tl.load(us_ptr + r), EPS, BLOCK_V)
        tl.store(n_out + r, n)
        tl.store(tok_out + r, token.to(tl.int64))

    def accept_triton(draft_tokens, draft_probs, target_probs, target_row_start, accept_lens, greedy, uniforms,
                      sample_uniforms) -> tuple[torch.Tensor, torch.Tensor]:
        """As accept_reference, one program per request."""
        R, G = draft_tokens.shape
        V = target_probs.shape[-1]
        device = draft_tokens.device
        if draft_probs is None:  # all greedy: the kernel never reads q
            draft_probs = target_probs.new_empty(1)
        n_out = torch.empty(R, dtype=torch.int32, device=device)
        tok_out = torch.empty(R, dtype=torch.int64, device=device)
        _accept_kernel[(R,)](draft_tokens.long().contiguous(), draft_probs.contiguous(), target_probs.contiguous(),
                             target_row_start.long().contiguous(), accept_lens.to(torch.int32).contiguous(),
                             greedy.to(torch.int32).contiguous(), uniforms.float().contiguous(),
                             sample_uniforms.float().contiguous(), n_out, tok_out, V, RESIDUAL_EPS, G=G,
                             BLOCK_V=min(1024, triton.next_power_of_2(V)))
        return n_out, tok_out
