"""Commands to the tensor-parallel workers as flat buffers: what rank 0 sends every step, packed
without pickle, and the exact inverse the workers run. Torch-free (numpy and `array`).

A command travels as a code (COMMAND_CODES) and a payload of bytes (TPGroup.send_command). The
per-step ones are packed:

- "step" (StepInput) and "draft" (DraftStepInput, whose one flag is its second_chain length):
  int64 words, then the page ids as int32:

      [flags...] [len of each list field...] [number of page tables] [total page ids]
      [list fields, back to back] [page count of each table]   <- int64
      [page ids of every table, back to back]                  <- int32

  int64 because input_ids hold draft markers (DRAFT_MARK is -(1 << 40)); page ids are int32,
  as Req.pages, so the engine's tables go in with one join of their buffers and come out as the
  same kind of array('i').
- "noop" (the keepalive while idle) and "shutdown": a code and no payload.
- anything else (a DSpark "burst", rare and nested): the pickled (kind, payload) pair.

NOTE: native byte order on both sides; every rank of a group runs the same kind of CPU.
"""

from __future__ import annotations

import itertools
import pickle
from array import array
from typing import Any, Sequence

import numpy as np

from sglaunch.engine.step import DraftStepInput, StepInput

NOOP, STEP, DRAFT, SHUTDOWN, PICKLED = 0, 1, 2, 3, 4
COMMAND_CODES = {"noop": NOOP, "step": STEP, "draft": DRAFT, "shutdown": SHUTDOWN}

# StepInput's list fields in their packed order (page_tables go last, apart); `logits` and
# `draft_context` are flags
STEP_LISTS = ("input_ids", "positions", "query_lens", "kv_lens", "sample_indices",
              "future_rows", "future_sources", "draft_rows", "draft_sources")
DRAFT_LISTS = ("anchor_tokens", "anchor_positions")
# rank 0's alone, never sent: the sampling inputs of a sampled drafter graph (a worker replays the
# greedy graph of the same key: the same forward, the only part with collectives)
DRAFT_RANK0_ONLY = ("temperatures", "draw_uniforms")


def pack_command(kind: str, payload: Any = None) -> tuple[int, bytearray | None]:
    """(code, payload bytes or None) of the command `kind` carrying `payload`."""
    code = COMMAND_CODES.get(kind, PICKLED)
    if code == STEP:
        return code, pack_step(payload)
    if code == DRAFT:
        return code, pack_draft(payload)
    if code == PICKLED:
        return code, bytearray(pickle.dumps((kind, payload)))
    return code, None


def unpack_command(code: int, body) -> tuple[str, Any]:
    """(kind, payload) from pack_command's (code, payload bytes); `body` is any bytes-like
    object (None or empty when the command has no payload). Nothing returned shares its memory."""
    if code == STEP:
        return "step", unpack_step(body)
    if code == DRAFT:
        return "draft", unpack_draft(body)
    if code == NOOP:
        return "noop", None
    if code == SHUTDOWN:
        return "shutdown", None
    if code == PICKLED:
        kind, payload = pickle.loads(body)
        return kind, payload
    raise ValueError(f"unknown tensor-parallel command code {code}")


def pack_step(step: StepInput) -> bytearray:
    return _pack((int(step.logits), int(step.draft_context)), [getattr(step, name) for name in STEP_LISTS],
                 step.page_tables)


def unpack_step(body) -> StepInput:
    (logits, context), lists, tables = _unpack(body, 2, len(STEP_LISTS))
    ids, positions, query_lens, kv_lens, samples, future_rows, future_sources, draft_rows, draft_sources = lists
    return StepInput(ids, positions, query_lens, kv_lens, tables, samples, bool(logits),
                     future_rows, future_sources, draft_rows, draft_sources, bool(context))


def pack_draft(step: DraftStepInput) -> bytearray:
    return _pack((step.second_chain,), [getattr(step, name) for name in DRAFT_LISTS], step.page_tables)


def unpack_draft(body) -> DraftStepInput:
    (second_chain,), (anchor_tokens, anchor_positions), tables = _unpack(body, 1, len(DRAFT_LISTS))
    return DraftStepInput(anchor_tokens, anchor_positions, tables, second_chain)


def _pack(flags: Sequence[int], lists: list[Sequence[int]], tables: Sequence[Sequence[int]]) -> bytearray:
    """The layout in the module docstring. One numpy fromiter over every int64 word (the fastest
    way from Python lists: ~35 us for a 256-request decode, concatenating per-field arrays ~50,
    array('q').extend ~75), then one join of it and the tables' buffers (a memcpy)."""
    counts = list(map(len, tables))
    total = sum(counts)
    lens = list(map(len, lists))
    head = (*flags, *lens, len(tables), total)
    words = np.fromiter(itertools.chain(head, *lists, counts), dtype=np.int64,
                        count=len(head) + sum(lens) + len(tables))
    if not total:
        return bytearray(memoryview(words))
    # NOTE: the engine's tables are array('i') (Req.pages and its slices): their buffers joined
    # as they are. Lists (tests, profiles) fail the join; other buffers (array('q'), int64 numpy)
    # fail the size check (as in fill_padded, cuda_graph.py): both go through fromiter as int32.
    if getattr(tables[0], "typecode", None) == "i":
        try:
            out = bytearray().join((words, *tables))
        except (TypeError, BufferError):  # a list, or a buffer that is not contiguous
            out = None
        if out is not None and len(out) == words.nbytes + 4 * total:
            return out
    pages = np.fromiter(itertools.chain.from_iterable(tables), dtype=np.int32, count=total)
    return bytearray().join((words, pages))


def _unpack(body, num_flags: int, num_lists: int) -> tuple[list[int], list[list[int]], list[array]]:
    """_pack's inverse: (flags, lists as Python lists, page tables as array('i'))."""
    view = memoryview(body).cast("B")
    head_words = num_flags + num_lists + 2
    if len(view) < 8 * head_words:
        raise ValueError(f"a packed step of {len(view)} bytes is shorter than its header")
    head = np.frombuffer(view, dtype=np.int64, count=head_words).tolist()
    flags, lens, (num_tables, total) = head[:num_flags], head[num_flags: -2], head[-2:]
    num_words = head_words + sum(lens) + num_tables
    if min(lens, default=0) < 0 or num_tables < 0 or total < 0 or len(view) != 8 * num_words + 4 * total:
        raise ValueError(f"a packed step of {len(view)} bytes does not match its header {head}")
    words = np.frombuffer(view, dtype=np.int64, count=num_words)
    bounds = list(itertools.accumulate(lens, initial=head_words))
    lists = [words[start:stop].tolist() for start, stop in zip(bounds, bounds[1:])]
    counts = words[num_words - num_tables:]
    ends = (np.cumsum(counts) * 4 + 8 * num_words).tolist()  # each table's end, in bytes of `view`
    if (ends[-1] if ends else 8 * num_words) != len(view) or (ends and counts.min() < 0):
        raise ValueError(f"a packed step's page counts {counts.tolist()} do not add up to its header's {total}")
    # NOTE: each table copied out of `view` into its own array('i') (as on rank 0): the decoded
    # step owns its memory, so the caller may reuse `body` at once. Not one array of every page
    # id sliced per table: that large allocation, freed every step, made glibc's heap shrink and
    # grow again, and a decode of 256 x 1000 pages took 1.3 ms instead of 0.2
    tables = []
    for start, stop in zip([8 * num_words, *ends[:-1]], ends):
        table = array("i")
        table.frombytes(view[start:stop])
        tables.append(table)
    return flags, lists, tables
