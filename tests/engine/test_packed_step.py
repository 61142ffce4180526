"""Packed commands to the tensor-parallel workers (engine/packed_step.py, TPGroup.send_command /
receive_command): exact round trips of random steps, and a 2-rank gloo group that sends packed
steps and checks them on rank 1."""

from __future__ import annotations

import random
import subprocess
import sys
from array import array
from pathlib import Path

import numpy as np
import pytest

from sglaunch.engine.distributed import INBOX_BYTES
from sglaunch.engine.interface import SamplingParams
from sglaunch.engine.packed_step import (
    COMMAND_CODES, DRAFT, PICKLED, STEP, pack_command, pack_draft, pack_step, unpack_command, unpack_draft,
    unpack_step,
)
from sglaunch.engine.request import Req
from sglaunch.engine.scheduler import Chunk
from sglaunch.engine.step import (
    DRAFT_MARK, DraftStepInput, StepInput, build_step_input, draft_marker, placeholder,
)

REPO = Path(__file__).resolve().parents[2]


def random_table(rng: random.Random, n: int, kind: str):
    pages = [rng.randrange(1 << 31) if rng.random() < 0.1 else rng.randrange(4096) for _ in range(n)]
    return array("i", pages) if kind == "array" else pages


def random_tables(rng: random.Random, batch: int):
    """Page tables as the engine has them (array('i')), as tests build them (lists), or mixed."""
    mode = rng.choice(["array", "list", "mixed"])
    kinds = [rng.choice(["array", "list"]) if mode == "mixed" else mode for _ in range(batch)]
    return [random_table(rng, rng.choice([0, 1, rng.randrange(40)]), kind) for kind in kinds]


def random_token(rng: random.Random) -> int:
    """A token id, a placeholder (< 0) or a draft marker (far below 0)."""
    kind = rng.random()
    if kind < 0.2:
        return placeholder(rng.randrange(512))
    if kind < 0.3:
        return draft_marker(rng.randrange(1 << 20))
    if kind < 0.35:
        return rng.choice([0, (1 << 62) - 1, -(1 << 62), DRAFT_MARK])
    return rng.randrange(200_000)


def random_list(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(-(1 << 40), 1 << 40) for _ in range(n)]


def random_step(rng: random.Random) -> StepInput:
    """Any field any length (empty included): the encoding may not assume the lengths agree."""
    batch = rng.choice([0, 1, rng.randrange(1, 70)])
    tokens = rng.choice([0, batch, rng.randrange(200)])
    return StepInput(
        input_ids=[random_token(rng) for _ in range(tokens)],
        positions=[rng.randrange(100_000) for _ in range(tokens)],
        query_lens=[rng.randrange(1, 20) for _ in range(batch)],
        kv_lens=[rng.randrange(1, 100_000) for _ in range(batch)],
        page_tables=random_tables(rng, batch),
        sample_indices=random_list(rng, rng.choice([0, batch, rng.randrange(30)])),
        logits=rng.random() < 0.5,
        future_rows=random_list(rng, rng.choice([0, rng.randrange(30)])),
        future_sources=random_list(rng, rng.choice([0, rng.randrange(30)])),
        draft_rows=random_list(rng, rng.choice([0, rng.randrange(30)])),
        draft_sources=random_list(rng, rng.choice([0, rng.randrange(30)])),
        draft_context=rng.random() < 0.5,
    )


def random_draft(rng: random.Random) -> DraftStepInput:
    batch = rng.choice([0, 1, rng.randrange(1, 70)])
    return DraftStepInput([random_token(rng) for _ in range(batch)], [rng.randrange(100_000) for _ in range(batch)],
                          random_tables(rng, batch), rng.choice([0, 0, rng.randrange(1, 16)]))


def plain(step) -> dict:
    """A step's fields, page tables as lists (a worker always gets array('i') tables)."""
    fields = dict(vars(step))
    fields["page_tables"] = [list(t) for t in step.page_tables]
    return fields


def assert_same(decoded, step) -> None:
    assert type(decoded) is type(step)
    assert plain(decoded) == plain(step)
    for name, value in vars(decoded).items():
        if name == "page_tables":
            assert all(isinstance(t, array) and t.typecode == "i" for t in value)
        elif isinstance(value, list):
            assert all(type(v) is int for v in value), name  # Python ints, as rank 0's
    if isinstance(step, StepInput):
        assert type(decoded.logits) is bool and type(decoded.draft_context) is bool
    else:
        assert type(decoded.second_chain) is int


@pytest.mark.parametrize("seed", range(400))
def test_random_steps_round_trip(seed):
    rng = random.Random(seed)
    step = random_step(rng)
    assert_same(unpack_step(pack_step(step)), step)
    draft = random_draft(rng)
    assert_same(unpack_draft(pack_draft(draft)), draft)


def test_empty_steps_round_trip():
    for step in (StepInput([], [], [], [], [], []), StepInput([], [], [], [], [], [], logits=False),
                 StepInput([], [], [1], [1], [[]], []), StepInput([], [], [1, 1], [1, 1], [array("i"), []], [])):
        assert_same(unpack_step(pack_step(step)), step)
    assert_same(unpack_draft(pack_draft(DraftStepInput([], [], []))), DraftStepInput([], [], []))


def test_other_page_buffers_round_trip():
    """Tables that are not all int32 arrays (array('q'), numpy int64, int32 and strided) go in
    as int32 too, also behind an array('i') (the join refuses them, or its size check does)."""
    others = [array("q", [1, 2, 3]), np.arange(5, dtype=np.int64), np.arange(4, dtype=np.int32),
              np.arange(10, dtype=np.int32)[::2]]
    for tables in (others, [array("i", [9]), *others], [array("i", [9]), others[0]], [array("i", [9]), others[3]]):
        n = len(tables)
        step = StepInput([1] * n, [0] * n, [1] * n, [len(t) for t in tables], tables, list(range(n)))
        assert unpack_step(pack_step(step)).page_tables == [array("i", [int(p) for p in t]) for t in tables]


def engine_steps() -> list[StepInput]:
    """Steps build_step_input makes: decodes with placeholders, prefill chunks, verify windows
    with device drafts (markers), lookahead chunks."""
    page_size = 4
    reqs = []
    for i in range(6):
        req = Req(f"r{i}", list(range(100 + i, 130 + 7 * i)), SamplingParams(), i)
        req.pages = array("i", range(50 * i, 50 * i + 20))
        reqs.append(req)
    reqs[0].token_ids.append(placeholder(3))
    reqs[1].token_ids.append(placeholder(0))
    decode = [Chunk(r, len(r.token_ids) - 1, len(r.token_ids)) for r in reqs]
    prefill = [Chunk(reqs[2], 0, 12), Chunk(reqs[3], 5, len(reqs[3].token_ids))]
    verify = [Chunk(r, len(r.token_ids) - 1, len(r.token_ids), lookahead=3,
                    draft_tokens=[draft_marker(3 * k + j) for j in range(3)]) for k, r in enumerate(reqs[:4])]
    host_drafts = [Chunk(reqs[4], len(reqs[4].token_ids) - 1, len(reqs[4].token_ids), lookahead=2, draft_tokens=[7, 8])]
    steps = [build_step_input(chunks, page_size) for chunks in (decode, prefill, verify, host_drafts, decode + prefill)]
    assert steps[0].future_rows and steps[2].draft_rows  # the markers are there to carry
    return steps


def test_engine_steps_round_trip():
    for step in engine_steps():
        assert_same(unpack_step(pack_step(step)), step)


def test_commands_round_trip():
    step, draft = engine_steps()[0], DraftStepInput([1, 2], [10, 20], [array("i", [1, 2, 3]), array("i", [4])])
    code, body = pack_command("step", step)
    assert code == STEP and unpack_command(code, body)[0] == "step"
    assert_same(unpack_command(code, np.frombuffer(body, dtype=np.uint8))[1], step)
    code, body = pack_command("draft", draft)
    assert code == DRAFT
    assert_same(unpack_command(code, memoryview(body))[1], draft)
    for kind in ("noop", "shutdown"):
        assert pack_command(kind) == (COMMAND_CODES[kind], None)
        assert unpack_command(COMMAND_CODES[kind], None) == (kind, None)
    code, body = pack_command("burst", {"anchors": [1, 2], "iterations": 3})
    assert code == PICKLED
    assert unpack_command(code, body) == ("burst", {"anchors": [1, 2], "iterations": 3})
    with pytest.raises(ValueError, match="unknown"):
        unpack_command(99, None)


def test_decoded_step_owns_its_memory():
    """A worker receives every command into the same buffer: decoding must copy out of it."""
    step = engine_steps()[2]
    body = pack_step(step)
    decoded = unpack_step(body)
    body[:] = bytes(len(body))
    assert_same(decoded, step)


def test_malformed_buffers_are_refused():
    body = pack_step(engine_steps()[0])
    for bad in (body[:-4], body + bytes(8), body[:16]):
        with pytest.raises(ValueError):
            unpack_step(bad)
    with pytest.raises(ValueError):
        unpack_draft(body)  # a step read as a draft: its header does not match


def test_the_encoder_does_not_import_torch():
    code = "import sys, sglaunch.engine.packed_step; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


# ---- over a real 2-rank gloo group ----------------------------------------------------------

def commands(seed: int) -> list[tuple[str, object]]:
    """What rank 0 sends and rank 1 must get, rebuilt from the seed on both ranks."""
    rng = random.Random(seed)
    out: list[tuple[str, object]] = [("noop", None)]
    out += [("step", s) for s in engine_steps()]
    for _ in range(30):
        out.append(rng.choice([("step", random_step(rng)), ("draft", random_draft(rng)), ("noop", None)]))
    # one step far over the first receive buffer (grown on demand), then small ones again
    big = StepInput([5] * 500, list(range(500)), [1] * 500, [300] * 500,
                    [array("i", range(k, k + 300)) for k in range(500)], list(range(500)))
    assert len(pack_step(big)) > 4 * INBOX_BYTES
    out += [("step", big), ("step", random_step(rng)), ("burst", {"anchors": [1, 2], "iterations": 4})]
    out.append(("shutdown", None))
    return out


def _rank(rank: int, port: int, seed: int) -> None:
    import torch.distributed as dist

    from sglaunch.engine.distributed import TPGroup

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        tp = TPGroup(rank, 2, dist.group.WORLD, dist.group.WORLD)
        for number, (kind, payload) in enumerate(commands(seed)):
            if rank == 0:
                tp.send_command(kind, payload)
                continue
            got_kind, got = tp.receive_command()
            assert got_kind == kind, (number, got_kind, kind)
            if isinstance(payload, (StepInput, DraftStepInput)):
                assert_same(got, payload)
            else:
                assert got == payload, (number, got, payload)
        tp.barrier()
    finally:
        dist.destroy_process_group()


def test_two_ranks_receive_the_packed_steps():
    import torch.multiprocessing as mp

    from sglaunch.engine.distributed import free_port

    mp.spawn(_rank, args=(free_port(), 7), nprocs=2, join=True)


def test_size_one_sends_nothing():
    from sglaunch.engine.distributed import TPGroup

    TPGroup(0, 1).send_command("step", engine_steps()[0])  # no group to send over: a no-op


def test_every_field_is_packed():
    """A field added to StepInput or DraftStepInput must be added to the packing too (or, for a
    draft step, named as rank 0's alone); unpacking drops the rank-0 fields."""
    from dataclasses import fields

    import torch

    from sglaunch.engine.packed_step import DRAFT_LISTS, DRAFT_RANK0_ONLY, STEP_LISTS, pack_draft, unpack_draft

    assert {f.name for f in fields(StepInput)} == {*STEP_LISTS, "page_tables", "logits", "draft_context"}
    assert {f.name for f in fields(DraftStepInput)} == {*DRAFT_LISTS, *DRAFT_RANK0_ONLY, "page_tables", "second_chain"}
    step = DraftStepInput([5, 6], [3, 4], [[1], [2]], 0, [0.0, 0.7], torch.rand(2, 7))
    back = unpack_draft(pack_draft(step))
    assert back.anchor_tokens == [5, 6] and back.temperatures is None and back.draw_uniforms is None
