"""Top-k, top-p and min-p by a threshold instead of a sort (sglaunch/kernels/filter_rows.py) on the
CPU through Triton's interpreter: the kernel against its torch reference and against the sorted
filter it stands in for, its edge cases, and the engine paths with SGLAUNCH_FILTER_KERNEL=1."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

from sglaunch.engine.interface import SamplingParams  # noqa: E402
from sglaunch.engine.sampler import filter_kernel, filtered_probs, sorted_filter  # noqa: E402
from sglaunch.kernels.filter_rows import threshold_filter, threshold_filter_reference  # noqa: E402


@pytest.fixture
def kernel(monkeypatch):
    monkeypatch.setenv("SGLAUNCH_DSPARK_KERNELS", "triton")


def settings(*rows):
    """(top_k, top_p, min_p) per row -> three [n] tensors."""
    k, p, m = zip(*rows)
    return torch.tensor(k), torch.tensor(p, dtype=torch.float32), torch.tensor(m, dtype=torch.float32)


ROWS = [(5, 1.0, 0.0), (3000, 0.9, 0.0), (3000, 1.0, 0.1), (40, 0.5, 0.05), (1, 1.0, 0.0), (3000, 0.95, 0.02),
        (3000, 1e-6, 0.0), (3000, 1.0, 1.0), (200, 0.99, 0.001)]


def test_the_kernel_keeps_what_the_sorted_filter_keeps(kernel):
    """On rows of distinct probabilities (3,000 tokens: two blocks) the kernel, its reference and
    sampler.sorted_filter keep the same tokens for top-k, top-p and min-p alone and together, and the
    one-token settings (top-k 1, top-p 1e-6, min-p 1) keep the most likely token alone."""
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(len(ROWS), 3000) * 3, dim=-1)
    k, p, m = settings(*ROWS)
    got = threshold_filter(probs, k, p, m)
    ref = threshold_filter_reference(probs, k, p, m)
    want = sorted_filter(probs, k[:, None], p[:, None], m[:, None])
    assert torch.equal(got > 0, want > 0) and torch.equal(ref > 0, want > 0)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got.sum(-1), torch.ones(len(ROWS)), atol=1e-5, rtol=0)
    kept = (got > 0).sum(-1).tolist()
    assert kept[0] == 5 and kept[4] == kept[6] == kept[7] == 1 and 1 < kept[1] < 3000
    for r in (4, 6, 7):
        assert got[r].argmax() == probs[r].argmax() and got[r].max() == 1.0


def test_ties_at_the_boundary_are_all_kept(kernel):
    """Six tokens of equal probability behind a leader: top-k 3 keeps the leader and all six (none of
    them has 3 tokens more likely than it), as does top-p 0.5 (the mass more likely than each is the
    leader's, 0.4); the reference says the same; the sorted filter cuts inside the tie."""
    probs = torch.tensor([[0.05, 0.4, 0.05, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]])
    for k, p in ((3, 1.0), (9, 0.5)):
        args = settings((k, p, 0.0))
        got = threshold_filter(probs, *args)
        assert (got > 0).tolist() == [[False, True, False, True, True, True, True, True, True]]
        assert torch.equal(threshold_filter_reference(probs, *args) > 0, got > 0)
        assert (sorted_filter(probs, *(a[:, None] for a in args)) > 0).sum() < 7


def test_a_row_that_filters_nothing_keeps_every_token(kernel):
    torch.manual_seed(1)
    probs = torch.softmax(torch.randn(2, 700), dim=-1)
    got = threshold_filter(probs, *settings((700, 1.0, 0.0), (0 + 700, 1.0, 0.0)))
    assert bool((got > 0).all())
    torch.testing.assert_close(got, probs, atol=1e-6, rtol=1e-5)


def test_the_switch_routes_sorted_filter_through_the_kernel(kernel, monkeypatch):
    """SGLAUNCH_FILTER_KERNEL=1: sorted_filter (and so filtered_probs, the usual step's and a filtered
    burst's filter) runs the kernel; unset on a CPU, the sort."""
    import sglaunch.kernels.filter_rows as rows

    calls = []
    original = rows.threshold_filter
    monkeypatch.setattr(rows, "threshold_filter", lambda *a: calls.append(1) or original(*a))
    logits = torch.randn(3, 500)
    params = [SamplingParams(temperature=0.8, top_p=0.9), SamplingParams(temperature=1.0, top_k=7),
              SamplingParams(temperature=0.5, min_p=0.1)]
    monkeypatch.delenv("SGLAUNCH_FILTER_KERNEL", raising=False)
    assert not filter_kernel(logits.device)
    usual = filtered_probs(logits, params)
    assert calls == []
    monkeypatch.setenv("SGLAUNCH_FILTER_KERNEL", "1")
    assert filter_kernel(logits.device)
    got = filtered_probs(logits, params)
    assert calls == [1]
    assert torch.equal(got > 0, usual > 0)
    torch.testing.assert_close(got, usual, atol=1e-6, rtol=1e-5)
    monkeypatch.setenv("SGLAUNCH_DSPARK_KERNELS", "torch")  # the kernels do not run here: the sort
    assert not filter_kernel(logits.device)

