"""Thin dispatch to the DSpark device kernels in `sglaunch/kernels/`.

On CUDA tensors with Triton importable the Triton kernels run; otherwise (CPU, no Triton) the
plain-torch references do. `SGLAUNCH_DSPARK_KERNELS=torch|triton` forces one side (triton on
CPU tensors needs TRITON_INTERPRET=1).
"""

from __future__ import annotations

import torch

from sglaunch.speculative.accept import AcceptResult, accept_draft

from sglaunch.kernels import dspark_accept, dspark_pack, dspark_topk, use_triton  # noqa: F401 (use_triton: re-exported)


def survival(conf_logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """[R, G] raw confidence logits, [G] STS temperatures -> [R, G] prefix survival (float32)."""
    if use_triton(conf_logits.device):
        return dspark_topk.survival_triton(conf_logits, temperatures)
    return dspark_topk.survival_reference(conf_logits, temperatures)


def topk_windows(survival_: torch.Tensor, active: torch.Tensor, budget: int) -> torch.Tensor:
    """[R, G] survival, [R] active, budget K -> [R] int32 windows (top-K, ties by position then request)."""
    if use_triton(survival_.device):
        return dspark_topk.topk_windows_triton(survival_, active, budget)
    return dspark_topk.topk_windows_reference(survival_, active, budget)


def pack_compact(anchors, draft_tokens, anchor_positions, windows, num_tokens: int | None = None):
    """-> (qo_indptr [R+1], input_ids [T], positions [T], token_request [T], token_index [T])."""
    if use_triton(draft_tokens.device):
        return dspark_pack.pack_triton(anchors, draft_tokens, anchor_positions, windows, num_tokens)
    return dspark_pack.pack_reference(anchors, draft_tokens, anchor_positions, windows)


def accept(draft_tokens, draft_probs, target_probs, target_row_start, accept_lens, greedy, uniforms,
           sample_uniforms) -> AcceptResult:
    """The accept rule (see accept.accept_draft) on the fastest available implementation."""
    args = (draft_tokens, draft_probs, target_probs, target_row_start, accept_lens, greedy, uniforms, sample_uniforms)
    if use_triton(draft_tokens.device):
        n, tok = dspark_accept.accept_triton(*args)
        return AcceptResult(n, tok)
    return accept_draft(*args)
