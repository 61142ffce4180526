"""The one-copy host <-> device packing of a DSpark step (exact for every dtype it carries), the
graph-tier rounding of the compact budget, and caps-aware top-K allocation."""

from __future__ import annotations

import pytest
import torch

from sglaunch.speculative.planner import DSparkPlanner, align_to_tier
from sglaunch.engine.transfer import pack_flat, pack_for_host, split_flat, to_device

CPU = torch.device("cpu")


def test_to_device_packs_mixed_dtypes_into_one_buffer_exactly():
    gen = torch.Generator().manual_seed(0)
    tensors = [torch.rand(5, generator=gen),  # float32
               torch.randint(0, 2**40, (3,), generator=gen),  # int64 beyond int32
               torch.tensor([True, False, True]),  # bool: 3 bytes, then padding
               torch.randint(-9, 9, (2, 7), generator=gen).int(),  # 2-D int32
               torch.empty(0, dtype=torch.int64),  # an empty part
               torch.randn(4, 3, generator=gen).double()]
    moved = to_device(tensors, CPU, pack=True)
    assert len({t.untyped_storage().data_ptr() for t in moved}) == 1  # views of one copied buffer
    for original, copy in zip(tensors, moved):
        assert copy.dtype == original.dtype and copy.shape == original.shape and torch.equal(copy, original)
    plain = to_device(tensors, CPU)  # a CPU device: nothing to copy, the tensors themselves
    assert all(a is b for a, b in zip(plain, tensors))


def test_read_back_packing_is_exact():
    tokens = torch.tensor([[151935, 0, 2**31 + 5], [7, 8, 9]])
    lens = torch.tensor([3, 1], dtype=torch.int32)
    surv = torch.rand(2, 3)
    rows = pack_for_host([lens, tokens, surv]).tolist()
    assert [[int(v) for v in r[:4]] for r in rows] == torch.cat([lens[:, None].long(), tokens], 1).tolist()
    assert [r[4:] for r in rows] == surv.tolist()  # float32 values survive float64 unchanged
    flat = pack_flat([lens, tokens, surv[0]]).tolist()
    a, b, c = split_flat(flat, [2, 6, 3])
    assert a == [3.0, 1.0] and [int(t) for t in b] == tokens.reshape(-1).tolist() and c == surv[0].tolist()


ALIGN_CASES = [
    # budget, fixed tokens (prefill rows + anchors), drafts that exist, tiers -> aligned budget
    (5, 4, 20, (8, 16, 32), 12),  # 9 tokens -> tier 16: 12 drafts
    (4, 4, 20, (8, 16, 32), 4),  # exactly a tier: unchanged
    (5, 4, 7, (8, 16, 32), 7),  # the tier needs 12 drafts, only 7 exist
    (30, 4, 40, (8, 16, 32), 30),  # 34 tokens: above every tier (eager step), unchanged
    (0, 4, 20, (8, 16, 32), 0),  # no draft planned: a decode-shaped step, unchanged
    (25, 4, 20, (8, 16, 32), 20),  # more planned than exists: capped, then 24 -> tier 32 needs 28
    (5, 4, 20, (), 5),  # no captured tiers (CPU, graphs off): nothing changes
    (5, 4, 20, (32, 8, 16), 12),  # tier order does not matter
]


@pytest.mark.parametrize("budget,fixed,most,tiers,expected", ALIGN_CASES)
def test_align_to_tier(budget, fixed, most, tiers, expected):
    assert align_to_tier(budget, fixed, most, tiers) == expected


def test_allocate_with_caps_spends_the_budget_inside_the_caps():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0], [0.5, 0.4, 0.3, 0.2], [3.5, 3.4, -1.0, -2.0]])
    planner = DSparkPlanner(4, "compact")
    surv, plain = planner.allocate(logits, 6)
    caps = torch.tensor([1, 4, 4], dtype=torch.int32)
    surv_capped, capped = planner.allocate(logits, 6, caps=caps)
    assert torch.equal(surv, surv_capped)  # survivals (the relay's input) are never masked
    assert plain.tolist() == [3, 1, 2]  # without caps, 2 of request 0's drafts would be cut later
    assert capped.tolist() == [1, 2, 3] and int(capped.sum()) == 6
    assert torch.equal(planner.allocate(logits, 6, caps=torch.full((3,), 4, dtype=torch.int32))[1], plain)


def test_sts_temperatures_are_copied_to_the_device_once(monkeypatch):
    planner = DSparkPlanner(3, "compact", sts_temperatures=[1.0, 2.0, 0.5])
    first = planner.device_temperatures(CPU)
    assert planner.device_temperatures(CPU) is first and first.tolist() == [1.0, 2.0, 0.5]
    planner.temperatures = [1.0, 1.0, 1.0]  # replaced: a new copy, never a stale one
    assert planner.device_temperatures(CPU).tolist() == [1.0, 1.0, 1.0]
