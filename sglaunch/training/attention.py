"""The drafter's attention in the grouped training layout (issue 19: a faster training step).

`DSparkAttention._forward_grouped` (speculative/drafter.py) runs, per sequence s, the queries of
its A blocks (A * G rows, block j's G slots together) against the keys [context rows 0..T-1 ;
the A * G block rows]: query slot (j, k) sees context rows t < ctx_lens[s, j] and the G rows of
its own block j, nothing else (no neighbour block, no context past the block's anchor). That
visibility is the same in every implementation below; only how it is computed differs:

- ``sdpa``: the reference (the code before issue 19's attention work): a boolean mask
  [S, 1, A*G, T+A*G] with ``enable_gqa``. On CUDA no fused SDPA kernel takes a mask together
  with GQA (flash takes no mask, memory-efficient no GQA), so this is the math kernel: the
  [S, heads, A*G, T+A*G] scores materialised in fp32 for the forward and again for the backward.
- ``dense``: the K/V heads expanded to the query heads (no ``enable_gqa``) and an additive
  mask in the queries' dtype, so SDPA's memory-efficient (or cuDNN) kernel is eligible: the
  same dense work, no scores in memory, no fp32 matmuls. No compilation.
- ``flex``: ``torch.nn.attention.flex_attention`` (compiled with torch.compile) with a
  BlockMask built from the same visibility: 128 x 128 tiles that see nothing are skipped, tiles
  that see everything skip the mask, the rest apply it. For a round's shapes (A*G = 896
  queries, up to 768 + 896 keys) about half the tiles are skipped (the block part is
  block-diagonal, the padding tail of short sequences is invisible), at the price of a
  compilation (tens of seconds per process, and once more when the shapes first change).
  Its backward needs CUDA (torch 2.13 has no flex backward on CPU).

The choice is made once per Trainer (`resolve`, `set_attention`), never per step: `auto` is
``flex`` on CUDA (H200, session 12, `benchmarks/train_step_bench.py --attention sdpa,dense,flex`:
316 / 282 / 134 ms a step, flex's first step 14 s with its compile) and ``sdpa`` elsewhere. SGLAUNCH_TRAIN_ATTENTION
overrides `auto`. The mask (or BlockMask) is built once per forward and shared by the layers.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

IMPLS = ("sdpa", "dense", "flex")
ENV = "SGLAUNCH_TRAIN_ATTENTION"
FLEX_BLOCK = 128  # flex_attention's tile (queries x keys)
_CACHE_ATTR = "_train_attention_cache"  # per-DraftBatch cache of the masks, shared by the layers
_FLEX: dict[str, object] = {}


def resolve(name: str | None, device) -> str:
    """The implementation a Trainer uses on `device`: explicit name > SGLAUNCH_TRAIN_ATTENTION > auto."""
    device = torch.device(device)
    if name in (None, "", "auto"):
        name = os.environ.get(ENV, "") or "auto"
    if name == "auto":
        # NOTE: H200, session 12 (`train_step_bench.py --attention sdpa,dense,flex`, batch 32 x
        # 768, 128 anchors): 316 / 282 / 134 ms a step; flex's first step 14 s (its compile)
        return "flex" if device.type == "cuda" else "sdpa"
    if name not in IMPLS:
        raise ValueError(f"training attention {name!r}: expected auto, {', '.join(IMPLS)}")
    if name == "flex" and device.type != "cuda":
        raise ValueError("training attention 'flex' needs CUDA (torch has no flex_attention backward on CPU)")
    return name


def set_attention(drafter: torch.nn.Module, impl: str) -> None:
    """Make every DSparkAttention of `drafter` run `impl` in the grouped training layout."""
    if impl not in IMPLS:
        raise ValueError(f"training attention {impl!r}: expected one of {', '.join(IMPLS)}")
    for layer in drafter.layers:
        layer.self_attn.train_attention = impl


def default_impl(device) -> str:
    """What _forward_grouped runs when no Trainer chose (tests, direct block_forward calls)."""
    return resolve(None, device)


# ----------------------------------------------------------------------------- the visibility


def visibility(ctx_lens: torch.Tensor, T: int, G: int) -> torch.Tensor:
    """ctx_lens [S, A] -> bool [S, A*G, T + A*G]: slot (j, k) sees context rows < ctx_lens[s, j]
    and its own block's G rows."""
    S, A = ctx_lens.shape
    dev = ctx_lens.device
    ctx_visible = torch.arange(T, device=dev)[None, None, :] < ctx_lens[:, :, None]  # [S, A, T]
    own_block = torch.eye(A, dtype=torch.bool, device=dev)  # [A, A]
    return torch.cat([ctx_visible.repeat_interleave(G, dim=1),
                      own_block.repeat_interleave(G, 0).repeat_interleave(G, 1).expand(S, -1, -1)], dim=2)


def mask_mod_for(ctx_lens: torch.Tensor, T: int, G: int, block: int = FLEX_BLOCK):
    """flex_attention's mask_mod of `visibility`. It captures tensors only (and the run's fixed
    block size G), so a new step's T and anchor count change input shapes, not constants baked
    into the compiled kernel: no recompilation per step. The per-query context length is padded
    to whole tiles, so the kernel's ragged last tile indexes inside it."""
    S, A = ctx_lens.shape
    ctx_q = ctx_lens.repeat_interleave(G, dim=1)  # [S, A*G] the context length of each query row
    ctx_q = F.pad(ctx_q, (0, -(-A * G // block) * block - A * G))
    t_len = torch.tensor(T, dtype=torch.int64, device=ctx_lens.device)

    def mask_mod(b, h, q_idx, kv_idx):
        in_ctx = kv_idx < t_len
        sees_ctx = kv_idx < ctx_q[b, q_idx]
        own = (kv_idx - t_len) // G == q_idx // G  # never true for kv_idx < T (negative)
        return (in_ctx & sees_ctx) | (~in_ctx & own)

    return mask_mod


def block_mask(ctx_lens: torch.Tensor, T: int, G: int, visible: torch.Tensor | None = None,
               block: int = FLEX_BLOCK):
    """The flex BlockMask of `visibility`, classified from the dense mask itself (what
    create_block_mask does, without evaluating the mask_mod densely): per tile, 'full' where
    every entry is visible, 'partial' where some are, absent where none is."""
    from torch.nn.attention.flex_attention import BlockMask

    if visible is None:
        visible = visibility(ctx_lens, T, G)
    S, Q, KV = visible.shape
    qb, kb = -(-Q // block), -(-KV // block)
    padded = F.pad(visible, (0, kb * block - KV, 0, qb * block - Q))  # False outside
    tiles = padded.view(S, qb, block, kb, block)
    seen = tiles.any(4).any(2)  # [S, qb, kb]
    full = tiles.all(4).all(2)
    partial = seen & ~full

    def sparse(flags: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flags = flags[:, None]  # [S, 1, qb, kb]: one head row, broadcast over heads
        num = flags.sum(-1, dtype=torch.int32)
        idx = torch.argsort(flags.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
        return num, idx

    kv_num, kv_idx = sparse(partial)
    full_num, full_idx = sparse(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block,
                                    mask_mod=mask_mod_for(ctx_lens, T, G, block), seq_lengths=(Q, KV))


# ----------------------------------------------------------------------------- implementations


def attend_sdpa(q, k, v, visible: torch.Tensor, scale: float) -> torch.Tensor:
    """The reference: q [S, H, Q, D], k/v [S, KH, KV, D], visible [S, Q, KV] -> [S, H, Q, D]."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=visible[:, None], scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[S, Q, KV] bool -> [S, 1, Q, KV] 0 / -inf in `dtype` (every row sees its own block)."""
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, float("-inf"))[:, None]


def attend_dense(q, k, v, bias: torch.Tensor, scale: float) -> torch.Tensor:
    """K/V heads expanded (as enable_gqa does: query head h reads KV head h // (H / KH)) and an
    additive mask: the memory-efficient / cuDNN kernels' form."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), scale=scale)


def flex_fn(compiled: bool = True):
    from torch.nn.attention.flex_attention import flex_attention

    if not compiled:
        return flex_attention
    if "fn" not in _FLEX:
        # dynamic: T and the anchor count change every step; one compilation serves them all
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=True)
    return _FLEX["fn"]


def attend_flex(q, k, v, mask, scale: float, compiled: bool = True) -> torch.Tensor:
    """flex_attention with the BlockMask (GQA native: no K/V expansion)."""
    dtype = q.dtype
    with torch.autocast(q.device.type, enabled=False):
        return flex_fn(compiled)(q, k.to(dtype), v.to(dtype), block_mask=mask, scale=scale,
                                 enable_gqa=q.shape[1] != k.shape[1])


def grouped_attention(impl: str, q, k, v, ctx_lens: torch.Tensor, T: int, G: int, scale: float,
                      cache: object | None = None) -> torch.Tensor:
    """q [S, H, A*G, D], k/v [S, KH, T + A*G, D], ctx_lens [S, A] -> [S, H, A*G, D] by `impl`.
    cache: an object (the DraftBatch) on which the mask is kept for the next layer."""
    store = None
    if cache is not None:
        store = cache.__dict__.setdefault(_CACHE_ATTR, {})
    key = (impl, T, G, q.dtype if impl == "dense" else None)
    mask = store.get(key) if store is not None else None
    if mask is None:
        if impl == "sdpa":
            mask = visibility(ctx_lens, T, G)
        elif impl == "dense":
            mask = additive_mask(visibility(ctx_lens, T, G), q.dtype)
        elif impl == "flex":
            mask = block_mask(ctx_lens, T, G)
        else:
            raise ValueError(f"training attention {impl!r}: expected one of {', '.join(IMPLS)}")
        if store is not None:
            store[key] = mask
    if impl == "sdpa":
        return attend_sdpa(q, k, v, mask, scale)
    if impl == "dense":
        return attend_dense(q, k, v, mask, scale)
    return attend_flex(q, k, v, mask, scale)
