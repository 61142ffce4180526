"""The sampler's batched draw: one uniform per sampled row from the request's own CPU generator,
every row drawn at once by inverse CDF over its filtered probabilities."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from sglaunch.engine.interface import SamplingParams
from sglaunch.engine.sampler import _sorted_filter, draw, filtered_probs, make_generator, rows_of, sample

SAMPLED = SamplingParams(max_new_tokens=4, temperature=0.9, top_p=0.95, top_k=0, seed=3)


def test_draw_follows_the_probabilities_and_never_draws_a_zero():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0]])
    n = 40_000
    u = torch.rand(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    tokens, invalid = draw(probs.expand(n, -1), u)
    assert not invalid.any()
    counts = torch.bincount(tokens, minlength=6).double()
    assert counts[[0, 2, 5]].sum() == 0  # zero-probability tokens
    expected = probs[0].double() * n
    chi2 = (((counts - expected) ** 2)[expected > 0] / expected[expected > 0]).sum()
    assert chi2 < 20.0  # 2 degrees of freedom: p < 1e-4 of failing by chance


def test_draw_at_the_top_end_takes_the_last_positive_token():
    # rows that do not sum to 1, zeros after the last positive token, a uniform a hair below 1
    probs = torch.tensor([[0.25, 0.25, 0.5, 0.0], [1e-30, 0.0, 0.0, 0.0], [0.1, 0.0, 0.2, 0.0]])
    u = torch.full((3,), math.nextafter(1.0, 0.0), dtype=torch.float64)
    tokens, invalid = draw(probs, u)
    assert tokens.tolist() == [2, 0, 2] and not invalid.any()
    tokens, _ = draw(probs, torch.zeros(3, dtype=torch.float64))
    assert tokens.tolist() == [0, 0, 0]
    # u = 0 with leading zeros: the first token of positive probability, not a zero before it
    tokens, _ = draw(torch.tensor([[0.0, 0.0, 0.4, 0.6]]), torch.zeros(1, dtype=torch.float64))
    assert tokens.tolist() == [2]


@pytest.mark.parametrize("row", [[math.nan, 0.5, 0.5], [-0.1, 0.6, 0.5], [0.0, 0.0, 0.0], [math.inf, 0.0, 0.0]])
def test_draw_flags_rows_that_cannot_be_sampled(row):
    probs = torch.tensor([row, [0.2, 0.3, 0.5]])
    _, invalid = draw(probs, torch.tensor([0.5, 0.5], dtype=torch.float64))
    assert invalid.tolist() == [True, False]


def test_sampled_tokens_follow_the_filtered_distribution():
    """Many seeded requests sampling one row of the same logits: the tokens' frequencies are the
    filtered probabilities (temperature, top-k, top-p), tokens outside them never appear."""
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(4)) * 2.0
    params = dataclasses.replace(SAMPLED, top_k=10, top_p=0.9, temperature=0.7)
    target = filtered_probs(logits, [params])[0].double()
    n = 6_000
    rows = logits.expand(n, -1).contiguous()
    tokens, _ = sample(rows, [params] * n, [make_generator(seed) for seed in range(n)])
    counts = torch.bincount(torch.tensor(tokens), minlength=50).double()
    assert counts[target == 0].sum() == 0
    expected = target * n
    keep = expected > 0
    chi2 = (((counts - expected) ** 2)[keep] / expected[keep]).sum()
    assert chi2 < 3 * int(keep.sum()) + 30  # far above a chi-square's mean (its dof), far below a wrong draw


def test_a_seeded_row_samples_the_same_tokens_whatever_else_is_in_the_batch():
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(5))
    greedy = SamplingParams(max_new_tokens=4, temperature=0.0)

    def run(order: list[int], batch_params: list[SamplingParams]):
        gens = [make_generator(100 + i) if not p.temperature == 0.0 else None for i, p in zip(order, batch_params)]
        return sample(logits[order], batch_params, gens)[0]

    alone = [run([i], [SAMPLED])[0] for i in range(6)]
    together = run(list(range(6)), [SAMPLED] * 6)
    mixed = run([0, 1, 2, 3, 4, 5], [SAMPLED, greedy, SAMPLED, greedy, SAMPLED, SAMPLED])
    assert together == alone
    assert [mixed[i] for i in (0, 2, 4, 5)] == [alone[i] for i in (0, 2, 4, 5)]
    assert mixed[1] == int(logits[1].argmax()) and mixed[3] == int(logits[3].argmax())


def test_a_row_that_cannot_be_sampled_fails_alone_or_raises():
    logits = torch.randn(3, 30, generator=torch.Generator().manual_seed(6))
    bad = dataclasses.replace(SAMPLED, temperature=math.nan)
    params = [SAMPLED, bad, SAMPLED]
    failures: dict[int, Exception] = {}
    tokens, logprobs = sample(logits, params, [make_generator(i) for i in range(3)], failures)
    assert list(failures) == [1] and "probability" in str(failures[1])
    ok, _ = sample(logits[[0, 2]], [SAMPLED, SAMPLED], [make_generator(0), make_generator(2)])
    assert [tokens[0], tokens[2]] == ok
    with pytest.raises(RuntimeError, match="probability"):
        sample(logits, params, [make_generator(i) for i in range(3)])


def test_rows_that_filter_nothing_are_the_softmax_and_mixed_batches_equal_each_row_alone():
    """A temperature alone skips the sort: the row is softmax(logits / T) and keeps every token
    (the sorted path at top_p = 1 could drop a tail whose mass before it rounds to 1). Rows that
    filter, in a batch beside such rows, equal the sorted filter of each row alone."""
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(6, 300, generator=gen) * 6.0
    params = [SamplingParams(temperature=0.7), dataclasses.replace(SAMPLED, top_k=0, top_p=0.8),
              SamplingParams(temperature=1.3, top_k=300), SamplingParams(temperature=0.9, top_k=12),
              SamplingParams(temperature=0.6, min_p=0.05), SamplingParams(temperature=1.0, top_p=1.0)]
    probs = filtered_probs(logits, params)
    for i, p in enumerate(params):
        if i in (0, 2, 5):
            torch.testing.assert_close(probs[i], torch.softmax(logits[i] / p.temperature, -1), atol=0, rtol=0)
            assert (probs[i] > 0).all()
        else:
            torch.testing.assert_close(probs[i], _sorted_filter(logits[[i]], [p])[0], atol=1e-7, rtol=0)
            assert (probs[i] == 0).any()
    torch.testing.assert_close(probs.sum(-1), torch.ones(6), atol=1e-5, rtol=0)
    # all rows filtering: the sorted path itself; none: the softmax
    torch.testing.assert_close(filtered_probs(logits[[1, 3]], [params[1], params[3]]),
                               _sorted_filter(logits[[1, 3]], [params[1], params[3]]), atol=0, rtol=0)
    torch.testing.assert_close(filtered_probs(logits[[0, 5]], [params[0], params[5]]),
                               torch.softmax(logits[[0, 5]] / torch.tensor([[0.7], [1.0]]), -1), atol=0, rtol=0)


def test_rows_of_takes_the_rows_without_a_list_index(monkeypatch):
    """transfer.rows_of (the sampler's and the model runner's row picks): every row in order is the
    tensor itself, an ascending run of rows a view of it (no copy, no index: a verify step's
    logit rows, session 36), and any other selection equals tensor[rows], in the order given,
    repeats included, with its index moved by transfer.to_device (never a list index)."""
    from sglaunch.engine import transfer

    moved = []
    real = transfer.to_device
    monkeypatch.setattr(transfer, "to_device", lambda tensors, device, pack=None: moved.append(len(tensors))
                        or real(tensors, device, pack))
    logits = torch.randn(5, 11)
    assert rows_of(logits, [0, 1, 2, 3, 4]) is logits
    for rows in ([1, 2, 3], [0, 1], [4], [2]):
        view = rows_of(logits, rows)
        assert view.data_ptr() == logits[rows[0]].data_ptr() and view.shape == (len(rows), 11)
        torch.testing.assert_close(view, logits[rows], rtol=0, atol=0)
    assert moved == []
    for rows in ([3, 1], [0, 0, 2], [1, 3, 4], [4, 3, 2]):
        torch.testing.assert_close(rows_of(logits, rows), logits[rows], rtol=0, atol=0)
    assert moved == [1, 1, 1, 1]




def test_uniform_stream_yields_the_generator_sequence_across_blocks():
    """UniformStream: one-at-a-time draws and shaped blocks, across its block boundaries, give
    exactly the values one-element draws from the same seeded generator give, in order."""
    from sglaunch.engine.sampler import UniformStream, draw_uniform, draw_uniforms, make_generator, \
        make_uniform_stream

    reference = make_generator(11)
    expected = [float(torch.rand(1, generator=reference)) for _ in range(500)]
    stream = make_uniform_stream(11)
    got: list[float] = []
    for shape in [(1,), (3,), (5, 7), (1,), (2, 15), (90,), (1,), (4, 4), (1,), (2, 3)]:
        if shape == (1,):
            got += [draw_uniform(stream) for _ in range(UniformStream.BLOCK - 3)]
        else:
            block = draw_uniforms(stream, *shape)
            assert block.shape == shape and block.dtype == torch.float32
            got += block.flatten().tolist()
    assert len(got) < len(expected)
    assert got == expected[:len(got)]
    # a bare generator, and torch's global one (None), still work
    bare = make_generator(11)
    assert draw_uniform(bare) == expected[0] and draw_uniforms(bare, 2).tolist() == expected[1:3]
    assert 0.0 <= draw_uniform(None) < 1.0
