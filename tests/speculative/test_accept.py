"""The accept rule: greedy cases, ragged lengths, the three modes, and statistical losslessness.

Losslessness: a tiny autoregressive "target" with exact next-token tables T[prev] over V = 4
tokens and a per-slot Markov "draft" q_k[prev] (far from T). Drafting x_k ~ q_k(.|x_{k-1}),
verifying with ragged lengths L drawn independently of the draft, and committing the accepted
drafts plus the correction/bonus token, repeated until two tokens exist, must produce the first
two tokens with probability T[a][y1] * T[y1][y2] exactly. Pearson chi-square over the 16 cells,
df = 15, significance 0.001 (p >= 0.001 passes). With N = 40 000 samples a rule that draws the
correction from P instead of the residual (a classic bug) is rejected with p < 1e-6 here.
"""

from __future__ import annotations

import pytest
import torch

from sglaunch.speculative.accept import accept_draft, committed_tokens, mode_lengths

V, G, N = 4, 3, 40_000
ALPHA = 1e-3


def test_greedy_accepts_while_draft_equals_argmax():
    target = torch.eye(V)[[1, 2, 3, 0, 0, 1, 2, 3]] * 5  # logits: argmax row i = [1,2,3,0 | 0,1,2,3]
    draft = torch.tensor([[1, 2, 0], [0, 1, 2]])
    res = accept_draft(draft, None, target, torch.tensor([0, 4]), torch.tensor([3, 3]), torch.ones(2, dtype=torch.bool),
                       torch.rand(2, G), torch.rand(2))
    assert res.num_accepted.tolist() == [2, 3] and res.next_token.tolist() == [3, 3]
    assert committed_tokens(draft, res) == [[1, 2, 3], [0, 1, 2, 3]]
    # ragged: request 1 only verified 1 draft -> bonus from its row 1
    res = accept_draft(draft, None, target, torch.tensor([0, 4]), torch.tensor([3, 1]), torch.ones(2, dtype=torch.bool),
                       torch.rand(2, G), torch.rand(2))
    assert res.num_accepted.tolist() == [2, 1] and res.next_token.tolist() == [3, 1]
    # L = 0: just the target's own next token
    res = accept_draft(draft, None, target, torch.tensor([0, 4]), torch.tensor([0, 0]), torch.ones(2, dtype=torch.bool),
                       torch.rand(2, G), torch.rand(2))
    assert res.num_accepted.tolist() == [0, 0] and res.next_token.tolist() == [1, 0]


def test_mode_lengths():
    w = torch.tensor([0, 2, 5])
    assert [t.tolist() for t in mode_lengths("static", w, 3)] == [[3, 3, 3], [3, 3, 3]]
    assert [t.tolist() for t in mode_lengths("cap-accept", w, 3)] == [[3, 3, 3], [0, 2, 3]]
    assert [t.tolist() for t in mode_lengths("compact", w, 3)] == [[0, 2, 3], [0, 2, 3]]
    with pytest.raises(ValueError, match="ragged verify mode"):
        mode_lengths("ragged", w, 3)


def test_cap_accept_equals_compact():
    """Same drafts and randoms: cap-accept (full block verified, window accepted) == compact."""
    g = torch.Generator().manual_seed(1)
    R = 64
    q = torch.softmax(torch.randn(R, G, V, generator=g), -1)
    draft = torch.multinomial(q.view(-1, V), 1, generator=g).view(R, G)
    full_rows = torch.softmax(torch.randn(R, G + 1, V, generator=g), -1)  # P_0..P_G per request
    windows = torch.randint(0, G + 1, (R,), generator=g)
    u, us = torch.rand(R, G, generator=g), torch.rand(R, generator=g)
    greedy = torch.rand(R, generator=g) < 0.3
    _, cap_lens = mode_lengths("cap-accept", windows, G)
    cap = accept_draft(draft, q, full_rows.view(-1, V), torch.arange(R) * (G + 1), cap_lens, greedy, u, us)
    verify, acc = mode_lengths("compact", windows, G)
    rows = torch.cat([full_rows[r, : int(verify[r]) + 1] for r in range(R)])  # only the packed rows exist
    starts = torch.cumsum(verify + 1, 0) - (verify + 1)
    compact = accept_draft(draft, q, rows, starts, acc, greedy, u, us)
    assert torch.equal(cap.num_accepted, compact.num_accepted) and torch.equal(cap.next_token, compact.next_token)


# ------------------------------------------------------------------ statistical losslessness

def tables(seed: int):
    g = torch.Generator().manual_seed(seed)
    T = torch.softmax(torch.randn(V, V, generator=g) * 1.5, -1)  # target: T[prev] over next
    Q = torch.softmax(torch.randn(G, V, V, generator=g) * 1.5, -1)  # draft slot k: Q[k, prev]
    return T, Q


def draft_then_accept(rule, T, Q, anchors: torch.Tensor, g: torch.Generator) -> list[list[int]]:
    """One speculative step for every anchor; returns committed tokens per sample."""
    n = anchors.shape[0]
    prev, toks, qs = anchors, [], []
    for k in range(G):
        q_k = Q[k, prev]  # [n, V]
        prev = torch.multinomial(q_k, 1, generator=g)[:, 0]
        toks.append(prev)
        qs.append(q_k)
    draft, q = torch.stack(toks, 1), torch.stack(qs, 1)  # [n, G], [n, G, V]
    context = torch.cat([anchors[:, None], draft], 1)  # row i of the target conditions on token i
    target = T[context].reshape(-1, V)  # [n * (G + 1), V]
    lens = torch.randint(0, G + 1, (n,), generator=g)  # ragged, independent of the draft
    res = rule(draft, q, target, torch.arange(n) * (G + 1), lens, torch.zeros(n, dtype=torch.bool),
               torch.rand(n, G, generator=g), torch.rand(n, generator=g))
    return committed_tokens(draft, res)


def first_two_tokens(rule, T, Q, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    anchor = 2
    out = draft_then_accept(rule, T, Q, torch.full((N,), anchor), g)
    short = [i for i, toks in enumerate(out) if len(toks) < 2]
    more = draft_then_accept(rule, T, Q, torch.tensor([out[i][-1] for i in short]), g)
    for i, extra in zip(short, more):
        out[i] = out[i] + extra
    return torch.tensor([toks[0] * V + toks[1] for toks in out])


def chi_square_p(cells: torch.Tensor, expected_probs: torch.Tensor) -> float:
    counts = torch.bincount(cells, minlength=V * V).double()
    expected = expected_probs.double() * cells.numel()
    stat = ((counts - expected) ** 2 / expected).sum()
    df = V * V - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), stat / 2))  # chi2 survival function


def exact_first_two(T: torch.Tensor, anchor: int = 2) -> torch.Tensor:
    return (T[anchor][:, None] * T).reshape(-1)  # P(y1, y2) = T[a][y1] T[y1][y2]


def biased_rule(draft, q, target, starts, lens, greedy, u, us):
    """Bug on purpose: after a rejection, draw the correction from P instead of the residual."""
    res = accept_draft(draft, q, target, starts, lens, greedy, u, us)
    p_n = target[starts + res.num_accepted.long()]
    cdf = p_n.cumsum(-1)
    from_p = (cdf < us[:, None] * cdf[:, -1:]).sum(-1).clamp(max=V - 1)
    rejected = res.num_accepted < lens
    return type(res)(res.num_accepted, torch.where(rejected, from_p, res.next_token))


def test_sampling_is_lossless_chi_square():
    T, Q = tables(seed=4)
    cells = first_two_tokens(accept_draft, T, Q, seed=11)
    assert chi_square_p(cells, exact_first_two(T)) >= ALPHA


def test_chi_square_catches_a_biased_rule():
    T, Q = tables(seed=4)
    cells = first_two_tokens(biased_rule, T, Q, seed=11)
    assert chi_square_p(cells, exact_first_two(T)) < 1e-6


def test_inverse_cdf_takes_the_first_token_past_u_times_the_mass():
    """inverse_cdf (a binary search over the cumulative sum since session 32) against its definition
    read off a Python loop: the first v whose cumulative mass exceeds u x the row's mass, never a
    zero-probability token; where rounding leaves no such v (u a hair below 1, mass absorbed by
    rounding), the last token of positive probability. Zeros, unnormalised rows, float32 and
    float64."""
    import math

    from sglaunch.speculative.accept import inverse_cdf

    gen = torch.Generator().manual_seed(11)
    for V in (1, 2, 7, 300):
        dist = torch.softmax(torch.randn(40, V, generator=gen) * 8.0, -1) * 3.0
        dist = dist * (torch.rand(40, V, generator=gen) > 0.4)
        dist[0, 0] = 1.0
        if V > 1:
            dist[1] = torch.tensor([1.0] + [1e-12] * (V - 1))  # float32 absorbs the tail: the fallback
        u = torch.rand(40, generator=gen)
        u[:3] = torch.tensor([0.0, math.nextafter(1.0, 0.0), 0.5])
        for dtype in (torch.float32, torch.float64):
            d = dist.to(dtype)
            got = inverse_cdf(d, u).tolist()
            for r in range(40):
                row, want = d[r].tolist(), None
                cdf = d[r].cumsum(0)
                threshold = float(u[r].to(dtype) * cdf[-1])
                for v in range(V):
                    if float(cdf[v]) > threshold and row[v] > 0:
                        want = v
                        break
                if want is None:
                    want = max((v for v in range(V) if row[v] > 0), default=-1)
                assert got[r] == want, (V, dtype, r)
