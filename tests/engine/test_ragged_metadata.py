"""RaggedMetadata.from_step (an eager step's attention metadata, laid out by numpy and moved with
one copy) against the definition it replaced: torch.tensor over the step's lists, field by field."""

from __future__ import annotations

import random
from array import array

import pytest
import torch

from sglaunch.engine.attention.base import RaggedMetadata
from sglaunch.engine.step import StepInput

FIELDS = ("query_lens", "kv_lens", "qo_indptr", "page_indptr", "page_indices", "last_page_len", "positions",
          "out_slots")


def reference(step: StepInput, page_size: int) -> dict:
    def indptr(lengths):
        out = torch.zeros(len(lengths) + 1, dtype=torch.int64)
        out[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
        return out

    query_lens = torch.tensor(step.query_lens, dtype=torch.int64)
    kv_lens = torch.tensor(step.kv_lens, dtype=torch.int64)
    page_indptr = indptr([len(t) for t in step.page_tables])
    page_indices = torch.tensor([p for table in step.page_tables for p in table], dtype=torch.int64)
    positions = torch.tensor(step.positions, dtype=torch.int64)
    owner = torch.repeat_interleave(torch.arange(len(step.query_lens)), query_lens)
    out_pages = page_indices[page_indptr[owner] + positions // page_size]
    return {"query_lens": query_lens, "kv_lens": kv_lens, "qo_indptr": indptr(step.query_lens),
            "page_indptr": page_indptr, "page_indices": page_indices,
            "last_page_len": (kv_lens - 1) % page_size + 1, "positions": positions,
            "out_slots": out_pages * page_size + positions % page_size,
            "max_query_len": max(step.query_lens), "max_kv_len": max(step.kv_lens)}


def random_step(rng: random.Random, query_lens: list[int], page_size: int, tables: str) -> StepInput:
    """Requests on distinct scattered pages whose last query_lens[b] positions are new this step;
    tables as int32 arrays (the engine's Req.pages), lists, or both mixed."""
    kvs = [q + rng.randint(0, 300) for q in query_lens]
    free = rng.sample(range(1, 4 * sum(-(-kv // page_size) for kv in kvs) + 2), sum(-(-kv // page_size) for kv in kvs))
    step = StepInput([], [], [], [], [], [])
    for q, kv in zip(query_lens, kvs):
        step.input_ids += [rng.randrange(1000) for _ in range(q)]
        step.positions += list(range(kv - q, kv))
        step.query_lens.append(q)
        step.kv_lens.append(kv)
        table = [free.pop() for _ in range(-(-kv // page_size))]
        as_array = tables == "arrays" or (tables == "mixed" and rng.random() < 0.5)
        step.page_tables.append(array("i", table) if as_array else table)
    return step


@pytest.mark.parametrize("page_size", [1, 3, 16])
@pytest.mark.parametrize("tables", ["arrays", "lists", "mixed"])
def test_from_step_equals_the_reference(page_size, tables):
    rng = random.Random(page_size * 7 + len(tables))
    shapes = [[1], [1] * 9, [57], [1, 1, 40, 1, 7, 1], [64] * 16, [rng.randint(1, 80) for _ in range(33)]]
    for query_lens in shapes:
        step = random_step(rng, query_lens, page_size, tables)
        meta = RaggedMetadata.from_step(step, page_size, torch.device("cpu"))
        want = reference(step, page_size)
        for name in FIELDS:
            got = getattr(meta, name)
            assert got.dtype == torch.int64 and got.device.type == "cpu", name
            assert torch.equal(got, want[name]), (name, query_lens)
        assert (meta.max_query_len, meta.max_kv_len) == (want["max_query_len"], want["max_kv_len"])
        assert isinstance(meta.max_query_len, int) and isinstance(meta.max_kv_len, int)


def test_every_new_token_gets_its_own_slot():
    """The slots the step's K/V go to: one per new token, inside the request's own pages."""
    rng = random.Random(5)
    step = random_step(rng, [1, 30, 1, 12], 4, "arrays")
    meta = RaggedMetadata.from_step(step, 4, torch.device("cpu"))
    slots = meta.out_slots.tolist()
    assert len(set(slots)) == len(slots) == step.num_tokens
    start = 0
    for table, q in zip(step.page_tables, step.query_lens):
        assert {s // 4 for s in slots[start:start + q]} <= set(table)
        start += q
