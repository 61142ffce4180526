"""Shared helpers of the speculative tests: tiny configs, naive reference forward, batches."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sglaunch.speculative.drafter import DraftBatch, DraftContextCache, DSparkDrafter
from sglaunch.speculative.drafter_config import parse_drafter_config

TINY_RAW = dict(
    architectures=["Qwen3DSparkModel"], model_type="qwen3", vocab_size=97, hidden_size=32, intermediate_size=64,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
    rms_norm_eps=1e-6, rope_theta=10000.0, block_size=5, mask_token_id=96, target_layer_ids=[0, 2],
    num_target_layers=4, markov_rank=8, markov_head_type="vanilla", enable_confidence_head=True,
    confidence_head_with_markov=True,
)


def tiny_raw(**overrides) -> dict:
    return {**TINY_RAW, **overrides}


def tiny_config(**overrides):
    return parse_drafter_config(tiny_raw(**overrides))


def feature_rows(n: int, cfg, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, cfg.num_features * cfg.hidden_size, generator=g, dtype=torch.float64).float()


def naive_block(drafter: DSparkDrafter, features: torch.Tensor, anchor: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One request from scratch, no cache and no mask: every block query sees all p context rows
    and all gamma block rows. -> (hidden [gamma, d], logits [gamma, V])."""
    c = drafter.config
    p, G = features.shape[0], c.block_size
    ctx = drafter.hidden_norm(drafter.fc(features))  # [p, d]
    ids = torch.tensor([anchor] + [c.mask_token_id] * (G - 1))
    x = drafter.embed_tokens(ids)
    ctx_pos, blk_pos = torch.arange(p), torch.arange(p, p + G)
    for layer in drafter.layers:
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        H, KV, D = attn.heads, attn.kv_heads, attn.hd
        q, kb, vb = attn.qkv_proj(h).split([H * D, KV * D, KV * D], -1)
        _, kc, vc = attn.qkv_proj(ctx).split([H * D, KV * D, KV * D], -1)
        q, kb, kc = q.view(G, H, D), kb.view(G, KV, D), kc.view(p, KV, D)
        if attn.qk_norm:
            q, kb, kc = attn.q_norm(q), attn.k_norm(kb), attn.k_norm(kc)
        q, kb = attn.rope(blk_pos, q, kb)
        kc = attn.rope(ctx_pos, kc, kc)[1]
        keys = torch.cat([kc, kb]).repeat_interleave(H // KV, dim=1)  # [p + G, H, D]
        vals = torch.cat([vc.view(p, KV, D), vb.view(G, KV, D)]).repeat_interleave(H // KV, dim=1)
        scores = torch.einsum("ghd,khd->hgk", q, keys) * attn.scale
        out = torch.einsum("hgk,khd->ghd", scores.softmax(-1), vals).reshape(G, H * D)
        x = x + attn.o_proj(out)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    hidden = drafter.norm(x)
    return hidden, drafter.lm_head(hidden).float()


def run_batch(drafter, cache: DraftContextCache, rids, anchors):
    positions = torch.tensor([cache.length(r) for r in rids])
    batch: DraftBatch = cache.build_batch(list(rids), torch.tensor(anchors), positions)
    return drafter.forward_block(batch, cache.pool)


def one_hot_like(t: torch.Tensor, V: int) -> torch.Tensor:
    return F.one_hot(t, V).float()
