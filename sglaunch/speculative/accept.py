"""The DSpark accept rule: one pure function, plus the ragged-verify modes' semantics.

Notation (gpt-fast style): q = the drafter's distribution at a slot, Markov-corrected, exactly
the distribution the draft token was sampled from; P = the target's distribution at that slot
(after the request's temperature/top-k/top-p, as the engine would sample). Accepting x with
probability min(1, P(x)/q(x)) and otherwise drawing from norm(max(P - q, 0)) leaves the output
distributed exactly as P [Leviathan et al.; DSpark §3.2]; after L accepted drafts the bonus token
comes from P_L. Greedy requests accept while the draft equals argmax P.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

RaggedVerifyMode = Literal["static", "cap-accept", "compact"]
MODES: tuple[str, ...] = ("static", "cap-accept", "compact")
RESIDUAL_EPS = 1e-6  # residual mass at or below this: draw from P instead (float noise only)


@dataclass(frozen=True)
class AcceptResult:
    num_accepted: torch.Tensor  # [R] int32, drafts accepted (the committed count is this + 1)
    next_token: torch.Tensor  # [R] int64, correction token (n < L) or bonus token (n == L)


def mode_lengths(mode: str, windows: torch.Tensor, gamma: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Planned windows [R] -> (verify_lens, accept_lens), both [R] in draft tokens.

    static: verify and accept the whole block (windows ignored). cap-accept: verify the whole
    block, accept at most the window (same output as compact). compact: only the window is
    verified (the target sees 1 + window rows per request).
    """
    if mode not in MODES:
        raise ValueError(f"unknown ragged verify mode {mode!r}; choose one of {', '.join(MODES)}")
    full = torch.full_like(windows, gamma)
    if mode == "static":
        return full, full
    capped = windows.clamp(0, gamma)
    return (full, capped) if mode == "cap-accept" else (capped, capped)


def inverse_cdf(dist: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """dist [R, V] (unnormalised, >= 0), u [R] in [0, 1) -> [R]: first v with cumsum > u * mass,
    never a zero-probability entry."""
    V = dist.shape[-1]
    cdf = dist.cumsum(-1)  # [R, V]: non-decreasing, so a binary search finds the first v over u * mass
    # NOTE: cdf[v] > cdf[v - 1] there, so dist[v] > 0 (a zero adds nothing, even in float)
    first = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None].to(cdf.dtype), right=True)[:, 0]
    v = torch.arange(V, device=dist.device)
    last_positive = torch.where(dist > 0, v, -1).max(-1).values  # rounding left no hit
    return torch.where(first < V, first, last_positive)


def accept_draft(
    draft_tokens: torch.Tensor,  # [R, G] int64: x_0 .. x_{G-1}
    draft_probs: torch.Tensor | None,  # [R, G, V] q_k; None when every request is greedy
    target_probs: torch.Tensor,  # [T, V] P rows; greedy rows may hold logits (only argmax is used)
    target_row_start: torch.Tensor,  # [R] row of P_0 (the anchor's row) for each request
    accept_lens: torch.Tensor,  # [R] L: drafts eligible for acceptance (rows P_0..P_L exist)
    greedy: torch.Tensor,  # [R] bool
    uniforms: torch.Tensor,  # [R, G] in [0, 1): acceptance tests
    sample_uniforms: torch.Tensor,  # [R] in [0, 1): the correction / bonus draw
) -> AcceptResult:
    """Accept a leading run of drafts per request and pick the correction or bonus token."""
    R, G = draft_tokens.shape
    slot = torch.arange(G, device=draft_tokens.device)
    rows = target_row_start.long()[:, None] + torch.minimum(slot[None, :], accept_lens.long()[:, None])  # [R, G]
    ok = target_probs.argmax(-1)[rows] == draft_tokens  # [R, G] greedy test
    if draft_probs is not None:
        q_x = draft_probs.gather(-1, draft_tokens[..., None])[..., 0].float()  # [R, G] q_i(x_i)
        p_x = target_probs[rows, draft_tokens].float()  # [R, G] P_i(x_i)
        ok = torch.where(greedy[:, None], ok, uniforms.float() * q_x < p_x)  # u < P/q
    ok &= slot[None, :] < accept_lens[:, None]
    n = ok.int().cumprod(-1).sum(-1)  # [R] leading run of acceptances
    p_n = target_probs[target_row_start.long() + n].float()  # [R, V]
    next_token = p_n.argmax(-1)
    if draft_probs is not None:
        next_token = torch.where(greedy, next_token, _draw_next(p_n, draft_probs, n, accept_lens, sample_uniforms))
    return AcceptResult(n.int(), next_token.long())


def _draw_next(p_n, draft_probs, n, accept_lens, sample_uniforms) -> torch.Tensor:
    """Correction from norm(max(P_n - q_n, 0)) after a rejection, else the bonus from P_n."""
    R, G, _ = draft_probs.shape
    q_n = draft_probs[torch.arange(R, device=n.device), n.long().clamp(max=G - 1)].float()  # [R, V]
    residual = (p_n - q_n).clamp_min(0.0)
    use_residual = (n < accept_lens) & (residual.sum(-1) > RESIDUAL_EPS)
    dist = torch.where(use_residual[:, None], residual, p_n)
    return inverse_cdf(dist, sample_uniforms.float())


def committed_grid(draft_tokens: torch.Tensor, result: AcceptResult) -> torch.Tensor:
    """Device view [R, G + 1]: row r holds its n accepted drafts, then the correction/bonus token
    at slot n (slots past n repeat it; the host reads n + 1 slots)."""
    G = draft_tokens.shape[1]
    slot = torch.arange(G + 1, device=draft_tokens.device)
    nxt = result.next_token[:, None].to(draft_tokens.dtype)  # [R, 1]
    padded = torch.cat([draft_tokens, nxt], dim=1)  # [R, G + 1]
    return torch.where(slot[None, :] < result.num_accepted[:, None], padded, nxt)


def committed_tokens(draft_tokens: torch.Tensor, result: AcceptResult) -> list[list[int]]:
    """Host view: per request the accepted drafts followed by the correction/bonus token. The
    engine still truncates at EOS / stop strings inside them."""
    drafts, ns, nxt = draft_tokens.tolist(), result.num_accepted.tolist(), result.next_token.tolist()
    return [row[:n] + [tok] for row, n, tok in zip(drafts, ns, nxt)]


@dataclass(frozen=True)
class TwoChainResult:
    num_accepted: torch.Tensor  # [R] int32, drafts accepted of the winning chain
    next_token: torch.Tensor  # [R] int64, its correction / bonus token
    second_won: torch.Tensor  # [R] bool: the committed drafts are the second chain's


def accept_two_chains(
    first: AcceptResult,  # accept_draft's result for the first chain (its own rows and uniforms)
    draft_probs: torch.Tensor,  # [R, G, V] the first chain's q_k (one-hot for greedy rows)
    target_probs: torch.Tensor,  # [T, V] P rows, as for accept_draft
    target_row_start: torch.Tensor,  # [R] the first window's anchor row
    accept_lens: torch.Tensor,  # [R] the first chain's L
    greedy: torch.Tensor,  # [R] bool
    second_tokens: torch.Tensor,  # [R, S] int64: y_0 .. y_{S-1}
    second_probs: torch.Tensor,  # [R, S, V]: y_0's proposal (q_0 without x_0), then q'_k (one-hot: greedy rows)
    second_row_start: torch.Tensor,  # [R] the second window's anchor row (any valid row where it has none)
    second_lens: torch.Tensor,  # [R] drafts of the second chain verified (0: no second window)
    second_uniforms: torch.Tensor,  # [R, S] in [0, 1): its acceptance tests
    sample_uniforms: torch.Tensor,  # [R] the one correction / bonus draw (the same as the first chain's)
) -> TwoChainResult:
    """A second chain under recursive rejection sampling without replacement (docs/dspark.md,
    "A second chain"). Where the first chain's x_0 was tested and rejected, the target's remaining
    distribution at slot 0 is R_0 = norm(max(P_0 - q_0, 0)); y_0 was drawn from q_0 with x_0 removed
    (q'_0, which holds all of R_0's mass since R_0(x_0) = 0) and is accepted with probability
    min(1, R_0(y_0) / q'_0(y_0)), else the correction comes from norm(max(R_0 - q'_0, 0)), so slot 0
    is still distributed as P_0. After an accepted y_0 the chain's later drafts are judged as usual
    against its own window's rows. Greedy rows: y_0 is the runner-up, accepted while it equals the
    target's argmax, and the chain wins when it commits more (the host's accept_greedy rule)."""
    R, S = second_tokens.shape
    slot = torch.arange(S, device=second_tokens.device)
    lens = second_lens.long()
    rows = second_row_start.long()[:, None] + torch.minimum(slot[None, :], lens[:, None])  # [R, S]
    ok = target_probs.argmax(-1)[rows] == second_tokens  # greedy test
    p0 = target_probs[target_row_start.long()].float()  # [R, V]
    residual0 = (p0 - draft_probs[:, 0].float()).clamp_min(0.0)
    mass0 = residual0.sum(-1, keepdim=True)
    r0 = residual0 / mass0.clamp_min(RESIDUAL_EPS)  # R_0
    p_y = target_probs[rows, second_tokens].float()  # [R, S]
    p_y[:, 0] = r0.gather(-1, second_tokens[:, :1])[:, 0]  # slot 0 is judged against R_0
    q_y = second_probs.gather(-1, second_tokens[..., None])[..., 0].float()
    ok = torch.where(greedy[:, None], ok, second_uniforms.float() * q_y < p_y)
    ok &= slot[None, :] < lens[:, None]
    m = ok.int().cumprod(-1).sum(-1)  # [R]
    n = first.num_accepted.long()
    # a sampled row's y_0 stands in for a rejected x_0: there must have been one (and R_0 some mass)
    judged = (lens > 0) & (n == 0) & (greedy | ((accept_lens > 0) & (mass0[:, 0] > RESIDUAL_EPS)))
    won = judged & (m > n)
    p_m = target_probs[second_row_start.long() + m].float()  # [R, V]
    nxt = torch.where(greedy, p_m.argmax(-1), _draw_next(p_m, second_probs, m, second_lens, sample_uniforms))
    # y_0 rejected: the correction from norm(max(R_0 - q'_0, 0)) (R_0 itself where that is empty)
    rest = (r0 - second_probs[:, 0].float()).clamp_min(0.0)
    rest = torch.where((rest.sum(-1) > RESIDUAL_EPS)[:, None], rest, r0)
    corrected = judged & ~won & ~greedy
    after_y0 = inverse_cdf(rest, sample_uniforms.float())
    next_token = torch.where(won, nxt, torch.where(corrected, after_y0, first.next_token))
    return TwoChainResult(torch.where(won, m, n).int(), next_token.long(), won)
