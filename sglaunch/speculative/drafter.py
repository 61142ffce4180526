"""The DSpark drafter [DSpark §2]: fused target features, a non-causal block forward over
[anchor, MASK x (gamma - 1)] with the context injected as extra keys/values, then a sequential
Markov head sampling the block left to right, and a confidence head.

Reuses the target's tensor-parallel building blocks (engine.layers / engine.models): heads and
MLP columns are split over ranks exactly like the target's; fc, norms, Markov and confidence
heads are small and replicated. embed_tokens / lm_head are the target's modules when the
checkpoint has no copy (aliased, vocab-parallel like the target).

Context K/V: per draft layer, K = k_norm(k_proj(ctx)) roped at the context position, V =
v_proj(ctx), written once into a DraftKVPool slot and reused every later step. Block K/V are
computed per step and never stored, so "cropping" the block is free; the context length of a
request only grows with rows the engine appends (accepted rows' features) or shrinks by crop().
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sglaunch.engine.distributed import TPGroup
from sglaunch.engine.layers import (
    ColumnParallelLinear,
    use_layer_kernels,
    ParallelLMHead,
    RMSNorm,
    RotaryEmbedding,
    RowParallelLinear,
    VocabParallelEmbedding,
    copy_full,
    rope_inverse_frequencies,
)
from sglaunch.engine.model_spec import ModelSpec
from sglaunch.engine.models import MLP
from sglaunch.kernels.layer_ops import folded_gqa_attention
from sglaunch.speculative.accept import inverse_cdf
from sglaunch.speculative.drafter_config import DrafterConfig

GREEDY_TEMPERATURE = 1e-5


# ----------------------------------------------------------------------------- data passed in/out


class DraftKVPool:
    """Context K/V of every draft layer: [num_slots, local_kv_heads, head_dim] per layer. Slot
    ids are the caller's (DraftContextCache, or the engine's own page tables)."""

    def __init__(self, num_layers: int, num_slots: int, kv_heads: int, head_dim: int, dtype, device):
        shape = (num_slots, kv_heads, head_dim)
        self.num_slots = num_slots
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer][slots] = k.to(self.k[layer].dtype)  # slots [N], k/v [N, kv_heads, head_dim]
        self.v[layer][slots] = v.to(self.v[layer].dtype)


@dataclass
class DraftBatch:
    """One draft step for B requests. Pending context rows are written to the pool by the forward."""

    anchor_tokens: torch.Tensor  # [B] int64, last committed token x0
    anchor_positions: torch.Tensor  # [B] int64, p (block occupies p .. p + gamma - 1)
    ctx_features: torch.Tensor  # [N, n_features * d] new context rows (target features), request after request
    ctx_positions: torch.Tensor  # [N] int64 position of each new row
    ctx_slots: torch.Tensor  # [N] int64 pool slot receiving its K/V
    slot_table: torch.Tensor  # [B, C] int64 pool slots of context positions 0 .. ctx_lens[b] - 1 (padding: any slot)
    ctx_lens: torch.Tensor  # [B] int64 context rows visible to request b (normally == anchor_positions)
    # Training layout (0 for serving): the B blocks are S sequences x `groups` blocks each, in
    # sequence order, and ctx_features holds every sequence's T rows (row s * T + t at position t).
    # Blocks of a sequence then share its context K/V: no pool, no per-block gather of it.
    groups: int = 0


@dataclass
class BlockOutput:
    hidden: torch.Tensor  # [B, gamma, d] final-normed block states h_k
    logits: torch.Tensor  # [B, gamma, V] float32 base logits U_k (slot k predicts position p + k + 1)
    greedy: DraftBlock | None = None  # the all-greedy sample_block, when a drafter graph computed it too
    sampled: DraftBlock | None = None  # the block a sampled drafter graph drew (any rows; full-vocabulary probs)
    # (tokens [B, S], their distributions [B, S, vocab]): the sampled second chain such a graph drew too
    sampled_second: tuple[torch.Tensor, torch.Tensor] | None = None
    second: torch.Tensor | None = None  # [B, length] the runner-up chain (second_chain), when asked for


@dataclass
class DraftBlock:
    tokens: torch.Tensor  # [B, gamma] int64 x_0 .. x_{gamma-1}
    probs: torch.Tensor | None  # [B, gamma, V] float32 q_k (one-hot for greedy rows); None if not asked
    logits: torch.Tensor | None  # [B, gamma, V] float32 Markov-corrected l_k = U_k + B_k (before temperature); None: not kept
    conf_logits: torch.Tensor | None  # [B, gamma] float32 raw confidence-head logits (None: no head)


# ----------------------------------------------------------------------------- replicated pieces


class ReplicatedLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool, dtype, device):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype, device=device), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype, device=device), requires_grad=False) if bias else None

    def load_weight(self, attr: str, section: int, tensor_slice: Any) -> None:
        copy_full(getattr(self, attr), tensor_slice)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class ReplicatedEmbedding(nn.Module):
    def __init__(self, num: int, dim: int, dtype, device):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num, dim, dtype=dtype, device=device), requires_grad=False)

    def load_weight(self, attr: str, section: int, tensor_slice: Any) -> None:
        copy_full(self.weight, tensor_slice)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class MarkovHead(nn.Module):
    """Low-rank logit bias keyed on the previous token: vanilla W2 W1[x], gated, or rnn."""

    def __init__(self, c: DrafterConfig, dtype, device):
        super().__init__()
        d, r, V = c.hidden_size, c.markov_rank, c.vocab_size
        self.kind, self.rank = c.markov_head_type, r
        self.markov_w1 = ReplicatedEmbedding(V, r, dtype, device)
        self.markov_w2 = ReplicatedLinear(r, V, False, dtype, device)
        if self.kind == "gated":
            self.gate_proj = ReplicatedLinear(d + r, r, True, dtype, device)
        elif self.kind == "rnn":
            self.joint_proj = ReplicatedLinear(2 * r + d, 3 * r, True, dtype, device)

    def init_state(self, batch: int, like: torch.Tensor) -> torch.Tensor:
        return like.new_zeros(batch, self.rank)  # s_0 = 0 (used by rnn only)

    def bias(self, e: torch.Tensor, h: torch.Tensor, state: torch.Tensor,
             w2_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """e = W1[x_{k-1}] [B, r], h = h_k [B, d] -> (B_k [B, V] float32, next state [B, r]).
        w2_rows: W2's rows of a draft vocabulary [K, r] (then B_k is [B, K])."""
        if self.kind == "gated":
            z = torch.sigmoid(self.gate_proj(torch.cat([h, e], dim=-1))) * e
        elif self.kind == "rnn":
            g, cand, o = self.joint_proj(torch.cat([state, e, h], dim=-1)).chunk(3, dim=-1)
            gate = torch.sigmoid(g)
            state = gate * state + (1 - gate) * torch.tanh(cand)
            z = torch.tanh(o)
        else:
            z = e
        return (F.linear(z, w2_rows) if w2_rows is not None else self.markov_w2(z)).float(), state


class ConfidenceHead(nn.Module):
    """c_k logit = proj([h_k ; W1[x_{k-1}]]) (or proj(h_k) without the Markov embedding)."""

    def __init__(self, c: DrafterConfig, dtype, device):
        super().__init__()
        self.with_markov = c.uses_markov_in_confidence
        width = c.hidden_size + (c.markov_rank if self.with_markov else 0)
        self.proj = ReplicatedLinear(width, 1, True, dtype, device)

    def forward(self, h: torch.Tensor, e: torch.Tensor | None) -> torch.Tensor:
        x = torch.cat([h, e], dim=-1) if self.with_markov else h
        return self.proj(x).float()[:, 0]  # [B]


# ----------------------------------------------------------------------------- backbone


def as_model_spec(c: DrafterConfig) -> ModelSpec:
    """The target-shaped facts the engine's building blocks read."""
    return ModelSpec(
        family=c.family, vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_layers=c.num_layers, num_heads=c.num_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
        rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta, rope_type=c.rope_type, rope_scaling=c.rope_scaling,
        max_position_embeddings=c.max_position_embeddings, tie_word_embeddings=False, qkv_bias=c.attention_bias,
        o_bias=c.attention_bias, mlp_bias=c.mlp_bias, qk_norm=c.qk_norm, checkpoint_dtype="float32", eos_token_ids=(),
    )


class DSparkAttention(nn.Module):
    """Block queries attend (non-causally) to the cached context K/V and to the whole block."""

    def __init__(self, c: DrafterConfig, layer: int, rope: RotaryEmbedding, tp: TPGroup, dtype, device):
        super().__init__()
        self.layer, self.rope, self.hd = layer, rope, c.head_dim
        self.heads, self.kv_heads = c.num_heads // tp.size, c.num_kv_heads // tp.size
        sections = [c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim]
        self.qkv_proj = ColumnParallelLinear(c.hidden_size, sections, c.attention_bias, tp, dtype, device)
        self.o_proj = RowParallelLinear(c.num_heads * c.head_dim, c.hidden_size, c.attention_bias, tp, dtype, device)
        self.qk_norm = c.qk_norm
        if c.qk_norm:
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, dtype, device)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, dtype, device)
        self.scale = c.head_dim**-0.5

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Fused context rows [N, d] -> K, V [N, local_kv_heads, head_dim] (k_norm + RoPE on K)."""
        q_rows = self.heads * self.hd
        w = self.qkv_proj.weight[q_rows:]
        b = self.qkv_proj.bias[q_rows:] if self.qkv_proj.bias is not None else None
        k, v = F.linear(ctx, w, b).view(-1, 2 * self.kv_heads, self.hd).chunk(2, dim=1)
        if self.qk_norm:
            k = self.k_norm(k)
        return self.rope(positions, k, k)[1], v

    def block_qkv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Block rows [N, d] -> q [N, heads, hd], k/v [N, kv_heads, hd] (q/k norm and RoPE applied)."""
        q, k, v = self.qkv_proj(x).split([self.heads * self.hd, self.kv_heads * self.hd, self.kv_heads * self.hd], -1)
        q, k, v = q.view(-1, self.heads, self.hd), k.view(-1, self.kv_heads, self.hd), v.view(-1, self.kv_heads, self.hd)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rope(positions, q, k)
        return q, k, v

    def forward(self, x: torch.Tensor, positions: torch.Tensor, ctx: torch.Tensor, batch: DraftBatch,
                pool: DraftKVPool | None) -> torch.Tensor:
        if batch.groups:
            return self._forward_grouped(x, positions, ctx, batch)
        B, C = batch.slot_table.shape
        G = x.shape[0] // B
        if ctx.shape[0]:
            pool.write(self.layer, batch.ctx_slots, *self.context_kv(ctx, batch.ctx_positions))
        q, k, v = self.block_qkv(x, positions)
        flat = batch.slot_table.reshape(-1)
        keys = torch.cat([pool.k[self.layer].index_select(0, flat).view(B, C, self.kv_heads, self.hd).to(q.dtype),
                          k.view(B, G, self.kv_heads, self.hd)], dim=1)  # [B, C + G, kv_heads, hd]
        values = torch.cat([pool.v[self.layer].index_select(0, flat).view(B, C, self.kv_heads, self.hd).to(q.dtype),
                            v.view(B, G, self.kv_heads, self.hd)], dim=1)
        # NOTE: non-causal: every block query sees context rows < ctx_len and the whole block
        col = torch.arange(C + G, device=x.device)[None, :]
        visible = (col < batch.ctx_lens[:, None]) | (col >= C)  # [B, C + G]
        # NOTE: grouped-query heads folded into the query rows (layer_ops.folded_gqa_attention): each K/V
        # head's query heads x G block rows attend as rows of one head, with one mask for all of them.
        # SDPA's own enable_gqa with a mask took the math path and expanded K and V to every query head
        # first: 1.13 GiB at the largest drafter graph key (256 requests x 2,048 context rows), the
        # allocation that ran out of memory at start-up on an H100 (sessions 24-25)
        out = folded_gqa_attention(q.view(B, G, self.heads, self.hd), keys.transpose(1, 2), values.transpose(1, 2),
                                   visible[:, None, None, :], self.scale)  # [B, G, heads, hd]
        return self.o_proj(out.reshape(B * G, self.heads * self.hd))


    def _forward_grouped(self, x: torch.Tensor, positions: torch.Tensor, ctx: torch.Tensor,
                         batch: DraftBatch) -> torch.Tensor:
        """Training layout: the same visibility as forward() (block j sees its sequence's context
        rows < ctx_lens[j] and its own block), with each sequence's context K/V computed once
        and shared by its blocks as keys of one attention call per sequence."""
        A, N = batch.groups, batch.anchor_tokens.shape[0]
        S, G = N // A, x.shape[0] // N
        T = ctx.shape[0] // S
        ck, cv = self.context_kv(ctx, batch.ctx_positions)  # [S * T, kv_heads, hd]
        q, k, v = self.block_qkv(x, positions)
        keys = torch.cat([ck.view(S, T, self.kv_heads, self.hd).to(q.dtype), k.view(S, A * G, self.kv_heads, self.hd)], 1)
        values = torch.cat([cv.view(S, T, self.kv_heads, self.hd).to(q.dtype), v.view(S, A * G, self.kv_heads, self.hd)], 1)
        # the attention itself: sglaunch/training/attention.py (the reference SDPA call, an
        # expanded-heads SDPA call or flex_attention: the same visibility), chosen once by the Trainer
        from sglaunch.training import attention as grouped

        impl = getattr(self, "train_attention", None) or grouped.default_impl(x.device)
        out = grouped.grouped_attention(
            impl, q.view(S, A * G, self.heads, self.hd).transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
            batch.ctx_lens.view(S, A), T, G, self.scale, cache=batch,
        )  # [S, heads, A * G, hd]
        return self.o_proj(out.transpose(1, 2).reshape(N * G, self.heads * self.hd))


class DSparkLayer(nn.Module):
    def __init__(self, c: DrafterConfig, layer: int, rope: RotaryEmbedding, tp: TPGroup, dtype, device):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype, device)
        self.self_attn = DSparkAttention(c, layer, rope, tp, dtype, device)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype, device)
        self.mlp = MLP(as_model_spec(c), tp, dtype, device)

    def forward(self, x, positions, ctx, batch: DraftBatch, pool: DraftKVPool) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions, ctx, batch, pool)
        return x + self.mlp(self.post_attention_layernorm(x))


class DSparkDrafter(nn.Module):
    """The whole drafter on one TP rank. Module names equal DeepSpec checkpoint names (q/k/v and
    gate/up are packed as in the target; engine.models.PACKED_MODULES maps them)."""

    def __init__(self, c: DrafterConfig, tp: TPGroup, dtype, device, max_positions: int | None = None,
                 embed_tokens: nn.Module | None = None, lm_head: nn.Module | None = None):
        super().__init__()
        self.config, self.tp, self.dtype = c, tp, dtype
        d = c.hidden_size
        inv_freq = rope_inverse_frequencies(c.head_dim, c.rope_theta, c.rope_type, dict(c.rope_scaling))
        rope = RotaryEmbedding(c.head_dim, max_positions or c.max_position_embeddings, inv_freq, device)
        self.aliased = {name for name, mod in (("embed_tokens", embed_tokens), ("lm_head", lm_head)) if mod is not None}
        if embed_tokens is None:
            embed_tokens = VocabParallelEmbedding(c.vocab_size, d, tp, dtype, device)
        if lm_head is None:
            lm_head = ParallelLMHead(c.vocab_size, d, tp, dtype, device)
        self.embed_tokens, self.lm_head = embed_tokens, lm_head
        self.fc = ReplicatedLinear(c.num_features * d, d, False, dtype, device)
        self.hidden_norm = RMSNorm(d, c.rms_norm_eps, dtype, device)
        self.layers = nn.ModuleList(DSparkLayer(c, i, rope, tp, dtype, device) for i in range(c.num_layers))
        self.norm = RMSNorm(d, c.rms_norm_eps, dtype, device)
        self.markov_head = MarkovHead(c, dtype, device) if c.markov_rank > 0 else None
        # the fused add + argmax of the greedy Markov step (sglaunch/kernels/layer_ops.py), where the
        # decoder's fused kernels run (CUDA with Triton; SGLAUNCH_LAYER_KERNELS)
        self.fused_argmax = use_layer_kernels(device)
        self.confidence_head = ConfidenceHead(c, dtype, device) if c.enable_confidence_head else None
        # restrict_vocab(): the draft vocabulary [K] and the LM-head / Markov rows it keeps
        self.draft_vocab: torch.Tensor | None = None
        self.draft_head_weight: torch.Tensor | None = None
        self.draft_markov_w2: torch.Tensor | None = None

    @torch.inference_mode()
    def restrict_vocab(self, token_ids) -> None:
        """Draft only these target token ids (draft_vocab.py): the block's logits, the Markov bias
        and the sampling run over K of the V tokens; drafts are still target ids, and the draft
        probabilities of the other tokens are 0, so verification stays exact. TP 1 only: the LM
        head (the target's) must be whole on this rank."""
        if self.tp.size != 1:
            raise ValueError("a draft vocabulary needs --tp-size 1 (the LM head is split across ranks)")
        ids = torch.tensor(sorted({int(t) for t in token_ids}), dtype=torch.int64, device=self.fc.weight.device)
        if ids.numel() == 0 or int(ids[0]) < 0 or int(ids[-1]) >= self.config.vocab_size:
            raise ValueError(f"draft vocabulary ids must lie in [0, {self.config.vocab_size})")
        self.draft_vocab = ids
        self.draft_head_weight = self.lm_head.weight.index_select(0, ids)  # [K, d]
        if self.markov_head is not None:
            self.draft_markov_w2 = self.markov_head.markov_w2.weight.index_select(0, ids)  # [K, r]

    def make_pool(self, num_slots: int, dtype=None) -> DraftKVPool:
        c = self.config
        return DraftKVPool(c.num_layers, num_slots, c.num_kv_heads // self.tp.size, c.head_dim, dtype or self.dtype,
                           self.fc.weight.device)

    def fuse_context(self, features: torch.Tensor) -> torch.Tensor:
        """[N, n_features * d] target features (layer order of target_layer_ids) -> [N, d]."""
        return self.hidden_norm(self.fc(features.to(self.dtype)))

    @torch.inference_mode()
    def write_context(self, features: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                      pool: DraftKVPool) -> None:
        """Write context K/V of every draft layer for feature rows [N, n_features * d] at their
        positions [N] into pool slots [N] (what forward_block does for pending rows, done eagerly)."""
        ctx = self.fuse_context(features)  # [N, d]
        for layer in self.layers:
            attn = layer.self_attn
            pool.write(attn.layer, slots, *attn.context_kv(ctx, positions))

    @torch.inference_mode()
    def forward_block(self, batch: DraftBatch, pool: DraftKVPool) -> BlockOutput:
        """Parallel stage: write the batch's new context K/V, run the block, return h_k and U_k."""
        c = self.config
        B, G = batch.anchor_tokens.shape[0], c.block_size
        ids = torch.full((B, G), c.mask_token_id, dtype=torch.int64, device=batch.anchor_tokens.device)
        ids[:, 0] = batch.anchor_tokens
        positions = (batch.anchor_positions[:, None] + torch.arange(G, device=ids.device)[None, :]).reshape(-1)
        x = self.embed_tokens(ids.reshape(-1))  # [B * G, d]
        ctx = self.fuse_context(batch.ctx_features) if batch.ctx_features.shape[0] else batch.ctx_features
        for layer in self.layers:
            x = layer(x, positions, ctx, batch, pool)
        hidden = self.norm(x)  # [B * G, d]
        if self.draft_vocab is not None:
            logits = F.linear(hidden, self.draft_head_weight).float()  # [B * G, K]: the draft vocabulary's rows
        else:
            logits = self.lm_head(hidden).float()  # [B * G, V]
        return BlockOutput(hidden.view(B, G, -1), logits.view(B, G, -1))

    @torch.inference_mode()
    def sample_block(self, out: BlockOutput, anchor_tokens: torch.Tensor, temperatures: torch.Tensor,
                     uniforms: torch.Tensor | None = None, generator: torch.Generator | None = None,
                     return_probs: bool = True, all_greedy: bool = False, keep_logits: bool = True,
                     any_greedy: bool = True, full_vocab_probs: bool = True, confidence: bool = True) -> DraftBlock:
        """Sequential stage (§2.3): l_k = U_k + B_k(x_{k-1}); x_k = argmax (T < 1e-5) or a draw from
        softmax(l_k / T) at uniforms[:, k]; q_k is that distribution; c_k from h_k and W1[x_{k-1}].
        all_greedy: the caller knows every row is greedy (from the host, so no device read here):
        the softmax and the draw are skipped, and no probabilities are returned.
        With a draft vocabulary (restrict_vocab), out.logits and the returned logits are over its
        K tokens; tokens are target ids and probs cover the whole vocabulary (0 outside it).
        keep_logits=False: the returned block's logits are None (not stacked: [B, G, V] a step).
        any_greedy=False: the caller knows no row is greedy (from the host): no argmax, no one-hot
        rows (three launches a slot fewer).
        full_vocab_probs=False: with a draft vocabulary, the probabilities stay over its K tokens
        ([B, G, K], what a sampled drafter graph keeps; expand_probs makes them [B, G, vocab]).
        confidence=False: no confidence logits (a burst sizes no window: three launches a slot fewer)."""
        B, G, V = out.logits.shape  # V: the draft vocabulary's size
        if uniforms is None:
            uniforms = torch.rand(B, G, generator=generator, device=out.logits.device)
        greedy = temperatures < GREEDY_TEMPERATURE  # [B]
        temp = temperatures.float().clamp_min(GREEDY_TEMPERATURE)[:, None]
        prev, state = anchor_tokens, None
        tokens, probs, logits, conf = [], [], [], []
        for k in range(G):
            h = out.hidden[:, k]  # [B, d]
            e = self.markov_head.markov_w1(prev) if self.markov_head is not None else None  # [B, r]
            l_k = out.logits[:, k]
            argmax = None
            if self.markov_head is not None:
                state = self.markov_head.init_state(B, e) if state is None else state
                bias, state = self.markov_head.bias(e, h, state, self.draft_markov_w2)
                if all_greedy and not keep_logits and self.fused_argmax:  # NOTE: one kernel, l_k not kept
                    from sglaunch.kernels.layer_ops import add_argmax_triton

                    argmax = add_argmax_triton(l_k, bias)
                else:
                    l_k = l_k + bias
            if self.confidence_head is not None and confidence:
                conf.append(self.confidence_head(h, e))
            if argmax is None and (all_greedy or any_greedy):
                argmax = l_k.argmax(-1)
            if all_greedy:
                x = argmax
            elif not any_greedy:  # NOTE: every row samples: q and its draw as they are
                q = torch.softmax(l_k / temp, dim=-1)  # [B, V]
                x = inverse_cdf(q, uniforms[:, k].float())
                if return_probs:
                    probs.append(q)
            else:
                q = torch.softmax(l_k / temp, dim=-1)  # [B, V]
                x = torch.where(greedy, argmax, inverse_cdf(q, uniforms[:, k].float()))
                if return_probs:
                    probs.append(torch.where(greedy[:, None], F.one_hot(argmax, V).float(), q))
            if self.draft_vocab is not None:
                x = self.draft_vocab[x]  # the draft vocabulary's index -> the target's token id
            tokens.append(x)
            if keep_logits:
                logits.append(l_k)
            prev = x
        q_all = torch.stack(probs, 1) if probs else None
        if q_all is not None and full_vocab_probs:
            q_all = self.expand_probs(q_all)
        return DraftBlock(torch.stack(tokens, 1), q_all, torch.stack(logits, 1) if logits else None,
                          torch.stack(conf, 1) if conf else None)

    def _slot0_pair(self, out: BlockOutput, anchor_tokens: torch.Tensor):
        """Slot 0 of the greedy block: its first and second choices under the Markov-corrected
        logits (draft-vocabulary indices [B] each), the Markov state after it and W1[anchor].
        NOTE: two argmaxes, not topk(2): torch's topk over a vocabulary row took 45 us on the H100
        (benchmarks/gpu30/run3), an argmax a few."""
        B = out.logits.shape[0]
        e = self.markov_head.markov_w1(anchor_tokens) if self.markov_head is not None else None
        l_0, state = out.logits[:, 0], None
        if self.markov_head is not None:
            state = self.markov_head.init_state(B, e)
            bias, state = self.markov_head.bias(e, out.hidden[:, 0], state, self.draft_markov_w2)
            l_0 = l_0 + bias  # NOTE: a fresh tensor, which the second argmax's mask may write over
        else:
            l_0 = l_0.clone()
        first = l_0.argmax(-1)
        second = l_0.scatter_(1, first[:, None], float("-inf")).argmax(-1)
        return first, second, state, e

    def _greedy_slots(self, x: torch.Tensor, hidden: torch.Tensor, logits: torch.Tensor, state, stop: int,
                      conf: list | None = None, conf_rows: int = 0) -> list[torch.Tensor]:
        """Slots 1 .. stop - 1 of greedy chains whose slot-0 drafts (target ids) are x: each slot's
        Markov-corrected argmax from the previous draft. conf: appends the confidence logits of the
        first conf_rows rows a slot."""
        tokens = []
        for k in range(1, stop):
            e = self.markov_head.markov_w1(x) if self.markov_head is not None else None
            h = hidden[:, k]
            if conf is not None and self.confidence_head is not None:
                conf.append(self.confidence_head(h[:conf_rows], e[:conf_rows] if e is not None else None))
            if self.markov_head is not None:
                bias, state = self.markov_head.bias(e, h, state, self.draft_markov_w2)
                if self.fused_argmax:
                    from sglaunch.kernels.layer_ops import add_argmax_triton

                    x = add_argmax_triton(logits[:, k], bias)
                else:
                    x = (logits[:, k] + bias).argmax(-1)
            else:
                x = logits[:, k].argmax(-1)
            if self.draft_vocab is not None:
                x = self.draft_vocab[x]
            tokens.append(x)
        return tokens

    def _target_ids(self, x: torch.Tensor) -> torch.Tensor:
        return self.draft_vocab[x] if self.draft_vocab is not None else x

    @torch.inference_mode()
    def second_chain(self, out: BlockOutput, anchor_tokens: torch.Tensor, length: int) -> torch.Tensor:
        """The greedy block's runner-up chain [B, length] (target ids): slot 0 takes the Markov-
        corrected logits' second choice instead of the first, and slots 1 .. length - 1 go on
        greedily from it. The chains share the block's hidden states and base logits U_k; they
        differ only through the Markov head's previous token. At T = 0 the target accepts this
        chain's first draft exactly where it rejects the block's first draft for that token."""
        G = out.logits.shape[1]
        if not 1 <= length <= G:
            raise ValueError(f"a second chain takes 1 .. {G} drafts, not {length}")
        _, second, state, _ = self._slot0_pair(out, anchor_tokens)
        x = self._target_ids(second)
        return torch.stack([x] + self._greedy_slots(x, out.hidden, out.logits, state, length), 1)

    @torch.inference_mode()
    def sampled_second_chain(self, out: BlockOutput, anchor_tokens: torch.Tensor, block: DraftBlock,
                             temperatures: torch.Tensor, uniforms: torch.Tensor,
                             length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The second chain at T > 0, for a block from sample_block (return_probs): y_0 drawn from
        the block's q_0 with x_0 removed (recursive rejection sampling without replacement: where
        the target rejects x_0, y_0 is tested against the residual), then y_k from the Markov-
        corrected softmax((U_k + B_k(y_{k-1})) / T) at uniforms[:, k]; greedy rows take the runner-up
        chain (second_chain). -> (tokens [B, length] target ids, the distributions they were drawn
        from [B, length, vocab], one-hot for greedy rows). Where q_0 left nothing beside x_0, y_0 is
        the runner-up with a one-hot proposal (any proposal independent of the verify is exact)."""
        G = out.logits.shape[1]
        if not 1 <= length <= G:
            raise ValueError(f"a second chain takes 1 .. {G} drafts, not {length}")
        greedy = (temperatures < GREEDY_TEMPERATURE)[:, None]
        temp = temperatures.float().clamp_min(GREEDY_TEMPERATURE)[:, None]
        _, runner_up, state, _ = self._slot0_pair(out, anchor_tokens)
        vocab = self.config.vocab_size
        runner_up = F.one_hot(self._target_ids(runner_up), vocab).float()
        rest = block.probs[:, 0].float().scatter(1, block.tokens[:, :1], 0.0)
        mass = rest.sum(-1, keepdim=True)
        rest = torch.where(greedy | (mass <= 1e-6), runner_up, rest / mass.clamp_min(1e-12))
        y = inverse_cdf(rest, uniforms[:, 0].float())
        tokens, probs = [y], [rest]
        for k in range(1, length):
            e = self.markov_head.markov_w1(y) if self.markov_head is not None else None
            l_k = out.logits[:, k]
            if self.markov_head is not None:
                bias, state = self.markov_head.bias(e, out.hidden[:, k], state, self.draft_markov_w2)
                l_k = l_k + bias
            argmax = l_k.argmax(-1)
            q = torch.softmax(l_k.float() / temp, dim=-1)
            x = torch.where(greedy[:, 0], argmax, inverse_cdf(q, uniforms[:, k].float()))
            q = torch.where(greedy, F.one_hot(argmax, q.shape[-1]).float(), q)
            if self.draft_vocab is not None:  # [B, K] -> [B, vocab], 0 elsewhere
                q = q.new_zeros(q.shape[0], vocab).index_copy_(1, self.draft_vocab, q)
            y = self._target_ids(x)
            tokens.append(y)
            probs.append(q)
        return torch.stack(tokens, 1), torch.stack(probs, 1)

    def greedy_two_chains(self, out: BlockOutput, anchor_tokens: torch.Tensor,
                          confidence: bool = True) -> tuple[DraftBlock, torch.Tensor]:
        """greedy_block and second_chain(out, anchors, gamma) in one Markov loop: slot 0 (the same
        previous token, the anchor, for both) once, its top two choices starting the chains, then
        slots 1 .. gamma - 1 over both chains' 2B rows at once, so the second chain adds no kernel
        launch a slot (what a burst's graph replays). -> (the greedy block, confidence logits
        included unless confidence=False, with logits not kept; the runner-up chain [B, gamma])."""
        B, G, _ = out.logits.shape
        first, second, state, e = self._slot0_pair(out, anchor_tokens)
        conf = [self.confidence_head(out.hidden[:, 0], e)] if self.confidence_head is not None and confidence else []
        x = self._target_ids(torch.cat([first, second]))  # [2B]: the first choices, then the second
        state = state.repeat(2, 1) if state is not None else None
        hidden, logits = out.hidden.repeat(2, 1, 1), out.logits.repeat(2, 1, 1)  # [2B, G, *]
        both = torch.stack([x] + self._greedy_slots(x, hidden, logits, state, G, conf if confidence else None, B), 1)
        block = DraftBlock(both[:B], None, None, torch.stack(conf, 1) if conf else None)
        return block, both[B:]

    def expand_probs(self, q: torch.Tensor) -> torch.Tensor:
        """Draft probabilities over the draft vocabulary [B, G, K] -> over the whole vocabulary
        [B, G, vocab], 0 outside it (as they are without a draft vocabulary)."""
        if self.draft_vocab is None:
            return q
        B, G, _ = q.shape
        return q.new_zeros(B, G, self.config.vocab_size).index_copy_(2, self.draft_vocab, q)

    def sampled_graph_block(self, out: BlockOutput, anchor_tokens: torch.Tensor, temperatures: torch.Tensor,
                            uniforms: torch.Tensor) -> DraftBlock:
        """sample_block for any mix of greedy (temperature 0) and sampled rows, from device inputs
        alone: what a sampled drafter CUDA graph captures after the forward (the block's logits not
        kept; the probabilities over the draft vocabulary, for expand_probs outside the graph)."""
        return self.sample_block(out, anchor_tokens, temperatures, uniforms=uniforms, return_probs=True,
                                 keep_logits=False, any_greedy=True, full_vocab_probs=False)

    def sampled_graph_chain(self, out: BlockOutput, anchor_tokens: torch.Tensor, block: DraftBlock,
                            temperatures: torch.Tensor, uniforms: torch.Tensor,
                            length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """sampled_second_chain for a block from sampled_graph_block (its probabilities over the
        draft vocabulary: only slot 0's, which the chain's first draft is drawn from, are spread
        over the whole vocabulary)."""
        first = DraftBlock(block.tokens, self.expand_probs(block.probs[:, :1]), None, None)
        return self.sampled_second_chain(out, anchor_tokens, first, temperatures, uniforms, length)

    def greedy_block(self, out: BlockOutput, anchor_tokens: torch.Tensor, confidence: bool = True) -> DraftBlock:
        """sample_block for a batch of greedy rows only, from device inputs alone (no host value):
        what a drafter CUDA graph captures after the forward (the block's logits not kept);
        confidence=False: without confidence logits (a burst's)."""
        B, G = anchor_tokens.shape[0], self.config.block_size
        zeros = torch.zeros(B, device=anchor_tokens.device)
        return self.sample_block(out, anchor_tokens, zeros, uniforms=torch.zeros(B, G, device=anchor_tokens.device),
                                 return_probs=False, all_greedy=True, keep_logits=False, confidence=confidence)

    def burst_sampled_block(self, out: BlockOutput, anchor_tokens: torch.Tensor, temperatures: torch.Tensor,
                            uniforms: torch.Tensor) -> DraftBlock:
        """A sampled burst's drafts: every row drawn from softmax(l_k / T) at its uniform, no argmax
        and no confidence logits, the probabilities over the draft vocabulary (expand_probs). A
        greedy row (T = 0, clamped to GREEDY_TEMPERATURE: softmax then holds all but nothing outside
        its argmax) drawn at 0.5 takes its argmax; its drafts only set how much the target accepts,
        never what it commits (greedy rows are accepted against the target's argmax)."""
        return self.sample_block(out, anchor_tokens, temperatures, uniforms=uniforms, return_probs=True,
                                 keep_logits=False, any_greedy=False, full_vocab_probs=False, confidence=False)

    def propose(self, batch: DraftBatch, pool: DraftKVPool, temperatures: torch.Tensor, **kwargs) -> DraftBlock:
        """forward_block + sample_block."""
        return self.sample_block(self.forward_block(batch, pool), batch.anchor_tokens, temperatures, **kwargs)


# ----------------------------------------------------------------------------- context bookkeeping


class DraftContextCache:
    """Per-request draft context: which pool slots hold positions 0..cached-1, and feature rows
    appended since (written at the next draft forward). A slot free list of single tokens.

    Engine protocol per request: append(prefill features of the prompt) -> each step:
    build_batch(...) -> drafter.forward_block -> verify -> append(features of verify rows
    0..n, i.e. positions p..p+n) -> repeat. crop(length) drops context beyond `length`."""

    def __init__(self, pool: DraftKVPool, device=None):
        self.pool = pool
        self.device = device if device is not None else pool.k[0].device
        self.free_slots = list(range(pool.num_slots - 1, -1, -1))
        self.slots: dict[Any, list[int]] = {}
        self.pending: dict[Any, list[torch.Tensor]] = {}

    def add(self, rid: Any) -> None:
        self.slots[rid], self.pending[rid] = [], []

    def release(self, rid: Any) -> None:
        self.free_slots.extend(reversed(self.slots.pop(rid)))
        self.pending.pop(rid)

    def length(self, rid: Any) -> int:
        """Context rows known for rid (cached + pending) = the next row's position."""
        return len(self.slots[rid]) + sum(f.shape[0] for f in self.pending[rid])

    def append(self, rid: Any, features: torch.Tensor) -> None:
        """features [n, n_features * d] for positions length(rid) .. length(rid) + n - 1."""
        if features.shape[0]:
            self.pending[rid].append(features)

    def crop(self, rid: Any, length: int) -> None:
        """Forget context at positions >= length (e.g. rows that must not have been appended)."""
        pend = torch.cat(self.pending[rid]) if self.pending[rid] else None
        cached = self.slots[rid]
        if length < len(cached):
            self.free_slots.extend(reversed(cached[length:]))
            del cached[length:]
            pend = None
        elif pend is not None:
            pend = pend[: length - len(cached)]
        self.pending[rid] = [pend] if pend is not None and pend.shape[0] else []

    def build_batch(self, rids: list[Any], anchor_tokens: torch.Tensor, anchor_positions: torch.Tensor) -> DraftBatch:
        """Allocate slots for pending rows (they are cached once the forward has run)."""
        feats, positions, new_slots = [], [], []
        for rid in rids:
            rows = torch.cat(self.pending[rid]) if self.pending[rid] else None
            if rows is None:
                continue
            if len(self.free_slots) < rows.shape[0]:
                raise RuntimeError("draft context pool is full; size it like the target KV pool")
            start = len(self.slots[rid])
            slots = [self.free_slots.pop() for _ in range(rows.shape[0])]
            self.slots[rid].extend(slots)
            self.pending[rid] = []
            feats.append(rows)
            positions.extend(range(start, start + rows.shape[0]))
            new_slots.extend(slots)
        lens = [len(self.slots[rid]) for rid in rids]
        width = max(lens, default=0)
        table = [self.slots[rid] + [0] * (width - len(self.slots[rid])) for rid in rids]
        dev, width_feat = self.device, self.pool_feature_width(feats)
        return DraftBatch(
            anchor_tokens=anchor_tokens.to(dev), anchor_positions=anchor_positions.to(dev),
            ctx_features=torch.cat(feats).to(dev) if feats else torch.empty(0, width_feat, device=dev),
            ctx_positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            ctx_slots=torch.tensor(new_slots, dtype=torch.int64, device=dev),
            slot_table=torch.tensor(table, dtype=torch.int64, device=dev).view(len(rids), width),
            ctx_lens=torch.tensor(lens, dtype=torch.int64, device=dev),
        )

    @staticmethod
    def pool_feature_width(feats: list[torch.Tensor]) -> int:
        return feats[0].shape[1] if feats else 0
