"""Compact packing of the ragged verify batch: request r contributes its anchor plus the first
windows[r] draft tokens, front-packed with no padding (SGLang's `compact` layout).

Outputs, for T = sum(1 + windows) tokens:
  qo_indptr     [R + 1] int32  tokens of request r are rows qo_indptr[r] : qo_indptr[r + 1]
  input_ids     [T] int64      anchor, then draft tokens
  positions     [T] int64      anchor_position[r] + i
  token_request [T] int32      owning request of each row
  token_index   [T] int32      i: 0 = anchor, i >= 1 = draft token i - 1
"""

from __future__ import annotations

import torch

from . import HAS_TRITON


def pack_reference(anchors: torch.Tensor, draft_tokens: torch.Tensor, anchor_positions: torch.Tensor,
                   windows: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """anchors [R], draft_tokens [R, G], anchor_positions [R], windows [R] -> the five outputs above."""
    R, G = draft_tokens.shape
    device = draft_tokens.device
    lens = (windows.long() + 1)  # [R]
    qo_indptr = torch.zeros(R + 1, dtype=torch.int64, device=device)
    qo_indptr[1:] = lens.cumsum(0)
    owner = torch.repeat_interleave(torch.arange(R, device=device), lens)  # [T]
    local = torch.arange(owner.numel(), device=device) - qo_indptr[owner]  # [T]
    drafted = draft_tokens[owner, (local - 1).clamp(0, G - 1)]
    input_ids = torch.where(local == 0, anchors[owner], drafted)
    positions = anchor_positions[owner].long() + local
    return qo_indptr.int(), input_ids.long(), positions, owner.int(), local.int()


if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _pack_kernel(anchor_ptr, draft_ptr, apos_ptr, win_ptr, indptr_ptr, ids_ptr, pos_ptr, req_ptr, idx_ptr,
                     R, G: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr):
        r = tl.program_id(0)
        offset = 0  # sum of (1 + window) over requests before r
        for start in range(0, R, BLOCK_R):
            rr = start + tl.arange(0, BLOCK_R)
            w = tl.load(win_ptr + rr, mask=rr < r, other=-1)
            offset += tl.sum(w + 1, axis=0)
        w_r = tl.load(win_ptr + r)
        tl.store(indptr_ptr + r + 1, offset + 1 + w_r)
        if r == 0:
            tl.store(indptr_ptr, 0)
        i = tl.arange(0, BLOCK_T)
        m = i <= w_r
        anchor = tl.load(anchor_ptr + r)
        drafted = tl.load(draft_ptr + r * G + (i - 1), mask=m & (i >= 1), other=0)
        ids = tl.where(i == 0, anchor, drafted)
        tl.store(ids_ptr + offset + i, ids, mask=m)
        tl.store(pos_ptr + offset + i, tl.load(apos_ptr + r) + i, mask=m)
        tl.store(req_ptr + offset + i, tl.zeros_like(i) + r, mask=m)
        tl.store(idx_ptr + offset + i, i, mask=m)

    def pack_triton(anchors: torch.Tensor, draft_tokens: torch.Tensor, anchor_positions: torch.Tensor,
                    windows: torch.Tensor, num_tokens: int | None = None) -> tuple[torch.Tensor, ...]:
        """As pack_reference. `num_tokens` (= R + sum(windows)) avoids a device sync when the host
        already knows it (the planner's budget); None reads it back."""
        R, G = draft_tokens.shape
        device = draft_tokens.device
        T = int(windows.sum().item()) + R if num_tokens is None else int(num_tokens)
        qo_indptr = torch.empty(R + 1, dtype=torch.int32, device=device)
        input_ids = torch.empty(T, dtype=torch.int64, device=device)
        positions = torch.empty(T, dtype=torch.int64, device=device)
        token_request = torch.empty(T, dtype=torch.int32, device=device)
        token_index = torch.empty(T, dtype=torch.int32, device=device)
        _pack_kernel[(R,)](anchors.long().contiguous(), draft_tokens.long().contiguous(),
                           anchor_positions.long().contiguous(), windows.to(torch.int32).contiguous(), qo_indptr,
                           input_ids, positions, token_request, token_index, R, G=G, BLOCK_R=256,
                           BLOCK_T=triton.next_power_of_2(G + 1))
        return qo_indptr, input_ids, positions, token_request, token_index
