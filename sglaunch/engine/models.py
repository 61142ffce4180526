"""The decoder used for Llama, Qwen2 and Qwen3 (they differ only in ModelSpec flags), tensor
parallel: heads and MLP columns split over ranks, one all-reduce after attention and one
after the MLP.

Parameter names follow the Hugging Face checkpoints except for the packed projections
(q/k/v -> qkv_proj, gate/up -> gate_up_proj); PACKED_MODULES maps them.
"""

from __future__ import annotations

import torch
from torch import nn

from sglaunch.engine.attention.base import AttentionBackend
from sglaunch.engine.distributed import TPGroup
from sglaunch.engine.layers import (
    ColumnParallelLinear,
    ParallelLMHead,
    RMSNorm,
    RotaryEmbedding,
    RowParallelLinear,
    VocabParallelEmbedding,
    rope_inverse_frequencies,
    silu_and_mul,
    use_layer_kernels,
)
from sglaunch.engine.model_spec import ModelSpec

# checkpoint module name -> (our module name, section in the packed weight)
PACKED_MODULES = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, layer: int, rope: RotaryEmbedding, tp: TPGroup, dtype, device):
        super().__init__()
        self.layer = layer
        self.heads = spec.num_heads // tp.size  # local
        self.kv_heads = spec.num_kv_heads // tp.size
        self.head_dim = spec.head_dim
        d = spec.head_dim
        sections = [spec.num_heads * d, spec.num_kv_heads * d, spec.num_kv_heads * d]
        self.qkv_proj = ColumnParallelLinear(spec.hidden_size, sections, spec.qkv_bias, tp, dtype, device)
        self.o_proj = RowParallelLinear(spec.num_heads * d, spec.hidden_size, spec.o_bias, tp, dtype, device)
        if spec.qk_norm:
            self.q_norm = RMSNorm(d, spec.rms_norm_eps, dtype, device)
            self.k_norm = RMSNorm(d, spec.rms_norm_eps, dtype, device)
        self.qk_norm = spec.qk_norm
        self.rope = rope

    def forward(self, positions: torch.Tensor, x: torch.Tensor, attn: AttentionBackend) -> torch.Tensor:
        n, d = x.shape[0], self.head_dim
        q, k, v = self.qkv_proj(x).split([self.heads * d, self.kv_heads * d, self.kv_heads * d], dim=-1)
        q = q.view(n, self.heads, d)  # [num_tokens, local_heads, head_dim]
        k = k.view(n, self.kv_heads, d)  # [num_tokens, local_kv_heads, head_dim]
        v = v.view(n, self.kv_heads, d)
        if self.rope.fused:  # NOTE: one kernel normalises (Qwen3) and rotates q and k and writes k and v
            q = self.rope.forward_and_store(positions, q, k, v, *attn.kv_destination(self.layer),
                                            qk_norm=(self.q_norm, self.k_norm) if self.qk_norm else None)
            out = attn.forward(self.layer, q, None, None)  # [num_tokens, local_heads, head_dim]
        else:
            if self.qk_norm:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = self.rope(positions, q, k)
            out = attn.forward(self.layer, q, k, v)
        return self.o_proj(out.reshape(n, self.heads * d))


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec, tp: TPGroup, dtype, device):
        super().__init__()
        inter = spec.intermediate_size
        self.gate_up_proj = ColumnParallelLinear(spec.hidden_size, [inter, inter], spec.mlp_bias, tp, dtype, device)
        self.down_proj = RowParallelLinear(inter, spec.hidden_size, spec.mlp_bias, tp, dtype, device)
        self.fused = use_layer_kernels(device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x), self.fused))  # [num_tokens, 2 * local_inter] in


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, layer: int, rope: RotaryEmbedding, tp: TPGroup, dtype, device):
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device)
        self.self_attn = Attention(spec, layer, rope, tp, dtype, device)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device)
        self.mlp = MLP(spec, tp, dtype, device)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None,
                attn: AttentionBackend) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's input as hidden + residual, or the embedding with residual None) ->
        (MLP output, residual): the layer's output residual stream is their sum, which the next
        norm adds (fused) before normalising."""
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm.add_forward(hidden, residual)
        hidden = self.self_attn(positions, hidden, attn)
        hidden, residual = self.post_attention_layernorm.add_forward(hidden, residual)
        return self.mlp(hidden), residual


class DecoderModel(nn.Module):
    def __init__(self, spec: ModelSpec, max_positions: int, tp: TPGroup, dtype, device):
        super().__init__()
        inv_freq = rope_inverse_frequencies(spec.head_dim, spec.rope_theta, spec.rope_type, dict(spec.rope_scaling))
        rope = RotaryEmbedding(spec.head_dim, max_positions, inv_freq, device)
        self.embed_tokens = VocabParallelEmbedding(spec.vocab_size, spec.hidden_size, tp, dtype, device)
        self.layers = nn.ModuleList(DecoderLayer(spec, i, rope, tp, dtype, device) for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend,
                capture: tuple[int, ...] = ()) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """-> (final-normed hidden [num_tokens, hidden], residual stream after each layer id in
        `capture`, -1 meaning the embedding output)."""
        hidden = self.embed_tokens(input_ids)  # [num_tokens, hidden]
        residual = None
        captured = {-1: hidden} if -1 in capture else {}
        for i, layer in enumerate(self.layers):
            hidden, residual = layer(positions, hidden, residual, attn)
            if i in capture:  # the residual stream after layer i, HF's output_hidden_states[i + 1]
                captured[i] = hidden + residual
        return self.norm.add_forward(hidden, residual)[0], [captured[i] for i in capture]


class CausalLM(nn.Module):
    """Decoder + vocab-parallel LM head (sharing the embedding's tensor when tied)."""

    def __init__(self, spec: ModelSpec, max_positions: int, tp: TPGroup, dtype, device):
        super().__init__()
        self.spec = spec
        self.model = DecoderModel(spec, max_positions, tp, dtype, device)
        self.lm_head = ParallelLMHead(spec.vocab_size, spec.hidden_size, tp, dtype, device)
        if spec.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend) -> torch.Tensor:
        return self.model(input_ids, positions, attn)[0]  # [num_tokens, hidden]

    def forward_with_features(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend,
                              layer_ids: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (hidden [num_tokens, hidden], features [num_tokens, len(layer_ids) * hidden]): the
        residual stream after each target layer in `layer_ids` (full width on every TP rank: it
        is taken after the all-reduces), concatenated in that order (DSpark's fc input)."""
        hidden, captured = self.model(input_ids, positions, attn, capture=tuple(layer_ids))
        return hidden, torch.cat(captured, dim=-1)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)  # [n, vocab]
