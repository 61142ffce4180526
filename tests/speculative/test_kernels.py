"""Each DSpark Triton kernel against its torch reference on random inputs (never zeros).

On CPU the kernels run through Triton's interpreter: TRITON_INTERPRET=1 must be set before
triton is imported, so this module sets it when no GPU is present. Natively on a GPU otherwise.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
try:
    import triton  # noqa: F401
except Exception as exc:  # pragma: no cover
    pytest.skip(f"triton is not importable ({exc}); `pip install triton` to run the kernel tests",
                allow_module_level=True)

from sglaunch.kernels import dspark_accept, dspark_pack, dspark_topk  # noqa: E402
from sglaunch.speculative.accept import accept_draft  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def gen(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


@pytest.mark.parametrize("R,G", [(1, 7), (5, 3), (37, 7), (70, 15)])
def test_survival_matches_reference(R, G):
    g = gen(R * 100 + G)
    logits = (torch.randn(R, G, generator=g) * 3 + 1).to(DEVICE)
    temps = (torch.rand(G, generator=g) * 2 + 0.25).to(DEVICE)
    ref = dspark_topk.survival_reference(logits.cpu(), temps.cpu())
    out = dspark_topk.survival_triton(logits, temps).cpu()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("R,G", [(1, 7), (6, 4), (33, 7), (90, 5)])
def test_topk_windows_match_reference(R, G):
    g = gen(R + G)
    surv = torch.rand(R, G, generator=g).sort(dim=1, descending=True).values
    surv[: R // 3, 1:] = surv[: R // 3, :1]  # exact ties inside and across requests
    active = torch.rand(R, generator=g) > 0.2
    for budget in (0, 1, G, R * G // 2, R * G + 5):
        ref = dspark_topk.topk_windows_reference(surv, active, budget)
        out = dspark_topk.topk_windows_triton(surv.to(DEVICE), active.to(DEVICE), budget).cpu()
        assert torch.equal(out, ref), (budget, out, ref)
        assert int(ref.sum()) == min(budget, int(active.sum()) * G)


@pytest.mark.parametrize("R,G", [(1, 7), (9, 7), (40, 3)])
def test_pack_matches_reference(R, G):
    g = gen(R * G)
    anchors = torch.randint(1, 1000, (R,), generator=g)
    draft = torch.randint(1, 1000, (R, G), generator=g)
    positions = torch.randint(1, 500, (R,), generator=g)
    windows = torch.randint(0, G + 1, (R,), generator=g)
    ref = dspark_pack.pack_reference(anchors, draft, positions, windows)
    out = dspark_pack.pack_triton(*(t.to(DEVICE) for t in (anchors, draft, positions, windows)))
    for a, b in zip(out, ref):
        assert torch.equal(a.cpu().long(), b.long())
    out2 = dspark_pack.pack_triton(*(t.to(DEVICE) for t in (anchors, draft, positions, windows)),
                                   num_tokens=int(windows.sum()) + R)
    assert torch.equal(out2[1].cpu(), ref[1])


def random_accept_case(R: int, G: int, V: int, seed: int):
    """Draft tokens sampled from q, target close to q so that runs of acceptances happen."""
    g = gen(seed)
    q = torch.softmax(torch.randn(R, G, V, generator=g) * 2, -1)
    draft = torch.multinomial(q.view(-1, V), 1, generator=g).view(R, G)
    lens = torch.randint(0, G + 1, (R,), generator=g)
    rows_per = lens + 1
    row_start = torch.zeros(R, dtype=torch.long)
    row_start[1:] = rows_per.cumsum(0)[:-1]
    T = int(rows_per.sum())
    owner = torch.repeat_interleave(torch.arange(R), rows_per)
    local = torch.arange(T) - row_start[owner]
    base = q[owner, local.clamp(max=G - 1)].log()
    target = torch.softmax(base + torch.randn(T, V, generator=g) * 0.7, -1)
    greedy = torch.rand(R, generator=g) < 0.3
    # greedy rows: make the draft agree with the target argmax for a while
    for r in torch.nonzero(greedy).flatten().tolist():
        keep = int(torch.randint(0, G + 1, (1,), generator=g))
        for i in range(min(keep, int(lens[r]))):
            draft[r, i] = target[row_start[r] + i].argmax()
    u = torch.rand(R, G, generator=g) * 0.999 + 0.0005
    us = torch.rand(R, generator=g) * 0.999 + 0.0005
    return draft, q, target, row_start, lens, greedy, u, us


@pytest.mark.parametrize("R,G,V", [(1, 7, 16), (12, 7, 50), (24, 4, 300), (8, 7, 1500)])
def test_accept_kernel_matches_references(R, G, V):
    case = random_accept_case(R, G, V, seed=R * V + G)
    ref_n, ref_tok = dspark_accept.accept_reference(*case)
    vec = accept_draft(*case)
    assert torch.equal(vec.num_accepted, ref_n) and torch.equal(vec.next_token, ref_tok)
    n, tok = dspark_accept.accept_triton(*(t.to(DEVICE) for t in case))
    assert torch.equal(n.cpu(), ref_n) and torch.equal(tok.cpu(), ref_tok)
    assert 0 < int(ref_n.sum()) < int(case[4].sum())  # the case exercises both outcomes


def test_accept_kernel_all_greedy_without_draft_probs():
    draft, q, target, row_start, lens, _, u, us = random_accept_case(10, 7, 40, seed=3)
    greedy = torch.ones(10, dtype=torch.bool)
    ref = accept_draft(draft, None, target, row_start, lens, greedy, u, us)
    n, tok = dspark_accept.accept_triton(draft.to(DEVICE), None, target.to(DEVICE), row_start.to(DEVICE),
                                         lens.to(DEVICE), greedy.to(DEVICE), u.to(DEVICE), us.to(DEVICE))
    assert torch.equal(n.cpu(), ref.num_accepted) and torch.equal(tok.cpu(), ref.next_token)
