"""The second chain's accept rule at T > 0 (accept.accept_two_chains): recursive rejection sampling
without replacement keeps the output distributed as the target's, token by token. A Monte Carlo
check on a vocabulary of 6: 200,000 independent steps drawn at once, with a first chain of 2 drafts
and a second of 2, each drafted from its own (bigram) draft distribution, and target rows that
depend on the chain's prefix."""

from __future__ import annotations

import torch

from sglaunch.speculative.accept import accept_draft, accept_two_chains, inverse_cdf

V, N = 6, 200_000


def setup(seed: int, greedy_share: float = 0.0):
    g = torch.Generator().manual_seed(seed)
    p0 = torch.softmax(torch.randn(V, generator=g) * 1.5, -1)
    p1 = torch.softmax(torch.randn(V, V, generator=g) * 1.5, -1)  # P_1(. | a): row a
    q0 = torch.softmax(torch.randn(V, generator=g) * 1.5, -1)
    q1 = torch.softmax(torch.randn(V, V, generator=g) * 1.5, -1)
    u = torch.rand(N, 10, generator=g)
    greedy = torch.rand(N, generator=g) < greedy_share
    x0 = inverse_cdf(q0.expand(N, V), u[:, 0])
    x1 = inverse_cdf(q1[x0], u[:, 1])
    q0_rest = q0.expand(N, V).scatter(1, x0[:, None], 0.0)  # q_0 without x_0 (inverse_cdf normalises)
    y0 = inverse_cdf(q0_rest, u[:, 2])
    y1 = inverse_cdf(q1[y0], u[:, 3])
    # greedy rows draft the argmax, then the runner-up: one-hot distributions
    one_hot = torch.nn.functional.one_hot
    x0 = torch.where(greedy, q0.argmax(), x0)
    x1 = torch.where(greedy, q1[x0].argmax(-1), x1)
    y0 = torch.where(greedy, q0.scatter(0, q0.argmax()[None], -1.0).argmax(), y0)
    y1 = torch.where(greedy, q1[y0].argmax(-1), y1)
    draft_probs = torch.stack([q0.expand(N, V), q1[x0]], 1)
    draft_probs = torch.where(greedy[:, None, None], one_hot(torch.stack([x0, x1], 1), V).float(), draft_probs)
    second_probs = torch.stack([q0_rest / q0_rest.sum(-1, keepdim=True), q1[y0]], 1)
    second_probs = torch.where(greedy[:, None, None], one_hot(torch.stack([y0, y1], 1), V).float(), second_probs)
    # per step 6 target rows: the first window (P_0, P_1(.|x_0), P_2) then the second (P_0, P_1(.|y_0), P_2)
    p2 = torch.full((N, V), 1.0 / V)
    rows = torch.stack([p0.expand(N, V), p1[x0], p2, p0.expand(N, V), p1[y0], p2], 1).reshape(6 * N, V)
    start = torch.arange(N) * 6
    return dict(p0=p0, p1=p1, u=u, greedy=greedy, draft_tokens=torch.stack([x0, x1], 1), draft_probs=draft_probs,
                second_tokens=torch.stack([y0, y1], 1), second_probs=second_probs, rows=rows, start=start)


def commit(s, second_lens: torch.Tensor, accept_lens: torch.Tensor | None = None):
    """-> (the committed tokens [N, 3] padded with -1, the second chain's wins [N])."""
    accept_lens = torch.full((N,), 2) if accept_lens is None else accept_lens
    first = accept_draft(s["draft_tokens"], s["draft_probs"], s["rows"], s["start"], accept_lens, s["greedy"],
                         s["u"][:, 4:6], s["u"][:, 7])
    res = accept_two_chains(first, s["draft_probs"], s["rows"], s["start"], accept_lens, s["greedy"],
                            s["second_tokens"], s["second_probs"], s["start"] + 3, second_lens, s["u"][:, 8:10],
                            s["u"][:, 7])
    drafts = torch.where(res.second_won[:, None], s["second_tokens"], s["draft_tokens"])
    padded = torch.cat([drafts, torch.full((N, 1), -1)], 1)
    slot = torch.arange(3)[None, :]
    n = res.num_accepted.long()[:, None]
    out = torch.where(slot < n, padded, torch.where(slot == n, res.next_token[:, None], -1))
    return out, res.second_won


def check_distribution(s, out):
    first = torch.bincount(out[:, 0], minlength=V).float() / N
    assert (first - s["p0"]).abs().max() < 0.006, (first, s["p0"])
    for a in range(V):
        rows = (out[:, 0] == a) & (out[:, 1] >= 0)
        if rows.sum() < 5000:
            continue
        second = torch.bincount(out[rows, 1], minlength=V).float() / rows.sum()
        assert (second - s["p1"][a]).abs().max() < 0.02, (a, second, s["p1"][a])


def test_two_chains_keep_the_target_distribution():
    for seed in (1, 2, 3):
        s = setup(seed)
        out, won = commit(s, torch.full((N,), 2))
        check_distribution(s, out)
        assert won.float().mean() > 0.02  # the second chain did commit tokens


def test_the_second_chain_commits_more_tokens_than_one():
    s = setup(4)
    one, _ = commit(s, torch.zeros(N, dtype=torch.long))
    two, won = commit(s, torch.full((N,), 2))
    assert ((two >= 0).sum(1).float().mean() > (one >= 0).sum(1).float().mean() + 0.02)
    check_distribution(s, one)
    # rows with no second window are the first chain's, exactly
    mixed = torch.arange(N) % 2 == 0
    part, won = commit(s, torch.where(mixed, 2, 0))
    assert torch.equal(part[~mixed], one[~mixed]) and not won[~mixed].any()


def test_no_first_draft_tested_means_no_second_chain():
    """A window of 0 accepted drafts (cap-accept) tests no x_0: the bonus from P_0 stands."""
    s = setup(5)
    out, won = commit(s, torch.full((N,), 2), accept_lens=torch.zeros(N, dtype=torch.long))
    assert not won.any()
    check_distribution(s, out)


def test_greedy_rows_keep_greedy_output():
    s = setup(6, greedy_share=0.5)
    out, won = commit(s, torch.full((N,), 2))
    g = s["greedy"]
    assert (out[g, 0] == s["p0"].argmax()).all()
    second = out[g & (out[:, 1] >= 0)]
    assert (second[:, 1] == s["p1"][second[:, 0]].argmax(-1)).all()
    sampled = setup(6, greedy_share=0.0)
    check_distribution(sampled, commit(sampled, torch.full((N,), 2))[0])
