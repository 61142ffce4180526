"""What one forward pass computes, as plain lists: rank 0 builds it and broadcasts it to every
tensor-parallel rank, which turn it into tensors. Torch-free and picklable.

The layout is ragged: each request contributes its own number of query tokens (a prefill
chunk, one decode token, or several tokens to verify), laid out back to back.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglaunch.engine.scheduler import Chunk


@dataclass
class StepInput:
    input_ids: list[int]  # [num_tokens], request after request
    positions: list[int]  # [num_tokens], absolute position of each token in its request
    query_lens: list[int]  # [batch], tokens computed this step per request
    kv_lens: list[int]  # [batch], context per request after this step (cached + new)
    page_tables: list[list[int]]  # [batch][ceil(kv_len / page_size)] KV page ids
    sample_indices: list[int]  # rows of the flat token list whose logits are wanted

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def batch_size(self) -> int:
        return len(self.query_lens)


def build_step_input(chunks: list[Chunk], page_size: int) -> StepInput:
    step = StepInput([], [], [], [], [], [])
    for chunk in chunks:
        req = chunk.req
        step.input_ids.extend(req.token_ids[chunk.start : chunk.end])
        step.positions.extend(range(chunk.start, chunk.end))
        step.query_lens.append(chunk.end - chunk.start)
        step.kv_lens.append(chunk.end)
        step.page_tables.append(req.pages[: -(-chunk.end // page_size)])
        if chunk.samples:
            step.sample_indices.append(len(step.input_ids) - 1)
    return step
