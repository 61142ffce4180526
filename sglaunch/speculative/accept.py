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
    cdf = dist.cumsum(-1)  # [R, V]
    hit = (cdf > (u * cdf[:, -1])[:, None]) & (dist > 0)
    v = torch.arange(dist.shape[-1], device=dist.device)
    first = torch.where(hit, v, dist.shape[-1]).min(-1).values
    last_positive = torch.where(dist > 0, v, -1).max(-1).values  # rounding left no hit
    return torch.where(first < dist.shape[-1], first, last_positive)


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
