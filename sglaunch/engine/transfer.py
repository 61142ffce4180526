"""Host <-> device traffic of a step (DSpark's and the sampler's), in as few copies as the host
scheduler allows.

- `to_device`: the host-built inputs of one phase (anchors, temperatures, caps, row layouts, ...)
  packed byte-wise into ONE pinned CPU buffer and moved with ONE non-blocking copy; a pinned
  non-blocking copy does not make the host wait. On a CPU device the tensors are returned as
  they are (nothing to copy).
- `rows_of`: rows of a device tensor chosen on the host, as a view where they are a run and
  otherwise through `to_device`, never a synchronising list index.
- `pack_for_host` / `unpack_rows`: several device results of one phase in ONE float64 tensor,
  so the single read-back the host needs (`.tolist()` at the call site, which is the sync) moves
  all of them. float64 holds every int32/int64 token id and count below 2**53 and every float32
  value exactly, so nothing changes by going through it.
"""

from __future__ import annotations

from typing import Sequence

import torch

ALIGN = 8  # bytes: every segment starts where any dtype's view of it is aligned


def to_device(tensors: Sequence[torch.Tensor], device: torch.device, pack: bool | None = None) -> list[torch.Tensor]:
    """CPU tensors -> the same tensors on `device` through one copy (pinned when it is CUDA).

    `pack` defaults to "device is not the CPU"; tests pass True to exercise the packing on a CPU.
    """
    device = torch.device(device)
    if pack is None:
        pack = device.type != "cpu"
    if not pack:
        return [t.to(device) if t.device != device else t for t in tensors]
    offsets, total = [], 0
    for t in tensors:
        offsets.append(total)
        total += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    buffer = torch.empty(max(total, ALIGN), dtype=torch.uint8, pin_memory=device.type == "cuda")
    for t, start in zip(tensors, offsets):
        nbytes = t.numel() * t.element_size()
        buffer[start: start + nbytes].view(t.dtype).copy_(t.reshape(-1))
    moved = buffer.to(device, non_blocking=True)  # NOTE: the phase's one host-to-device copy
    return [moved[start: start + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            for t, start in zip(tensors, offsets)]


def rows_of(tensor: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """tensor[rows] without a synchronising copy. Indexing a CUDA tensor with a Python list, or
    with a tensor built by torch.tensor(..., device=cuda), copies from pageable memory and waits
    for the stream (GPU tests of overlapped sampled steps, session 35; the sampled verify step's
    logit rows, session 36). Every row in order is the tensor itself, an ascending run of rows a
    view of it, and any other selection goes through to_device's pinned copy."""
    n = len(rows)
    if n and rows[-1] - rows[0] == n - 1 and rows == list(range(rows[0], rows[0] + n)):
        return tensor if n == tensor.shape[0] else tensor[rows[0]: rows[0] + n]
    (index,) = to_device([torch.tensor(rows, dtype=torch.int64)], tensor.device)
    return tensor.index_select(0, index)


def pack_for_host(columns: Sequence[torch.Tensor]) -> torch.Tensor:
    """Device tensors [R] or [R, k] -> one [R, sum k] float64 tensor, columns side by side."""
    return torch.cat([c.reshape(c.shape[0], -1).double() for c in columns], dim=1)


def pack_flat(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """Device tensors of any shape -> one flat float64 tensor (the caller knows the sizes)."""
    return torch.cat([p.reshape(-1).double() for p in parts])


def split_flat(values: list[float], sizes: Sequence[int]) -> list[list[float]]:
    """The host list of a pack_flat tensor -> its parts (flat)."""
    out, start = [], 0
    for n in sizes:
        out.append(values[start: start + n])
        start += n
    return out
