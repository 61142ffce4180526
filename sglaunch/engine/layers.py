"""Tensor-parallel building blocks of the decoder: linears, vocab-parallel embedding and LM
head, RMSNorm, rotary embedding, SiLU-and-multiply.

RMSNorm (with the residual add fused in), rotary embedding and SiLU-and-multiply run as one
Triton kernel each (`sglaunch/kernels/layer_ops.py`) on GPUs when no gradient is wanted, and as plain
torch otherwise (CPUs, training): `SGLAUNCH_LAYER_KERNELS=auto|torch|triton`, read when a
module is built.

Every module with weights implements `load_weight(attr, section, tensor_slice)`: `tensor_slice`
is a lazy safetensors slice and each rank reads only the rows or columns it owns.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sglaunch.engine.distributed import TPGroup

from sglaunch.kernels import HAS_TRITON, layer_ops

LAYER_KERNELS_ENV = "SGLAUNCH_LAYER_KERNELS"


def use_layer_kernels(device) -> bool:
    """Whether modules built on `device` run the fused Triton kernels (see the module docstring)."""
    choice = os.environ.get(LAYER_KERNELS_ENV, "auto")
    if choice not in ("auto", "torch", "triton"):
        raise ValueError(f"{LAYER_KERNELS_ENV}={choice!r}: expected auto, torch or triton")
    if choice == "torch":
        return False
    return HAS_TRITON and (choice == "triton" or torch.device(device).type == "cuda")


def _empty_param(*shape: int, dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)


def copy_full(param: torch.Tensor, tensor_slice: Any) -> None:
    full = tensor_slice[:]
    if tuple(full.shape) != tuple(param.shape):
        raise ValueError(f"checkpoint tensor has shape {tuple(full.shape)}, expected {tuple(param.shape)}")
    param.copy_(full)


class ColumnParallelLinear(nn.Module):
    """y = x W^T + b with W's output rows split over ranks; rank r holds rows of every packed
    section (e.g. q, k, v), so W is [sum(section_sizes) / tp, in_features] locally."""

    def __init__(self, in_features: int, section_sizes: list[int], bias: bool, tp: TPGroup, dtype, device):
        super().__init__()
        self.tp = tp
        self.local_sizes = [size // tp.size for size in section_sizes]
        out_local = sum(self.local_sizes)
        self.weight = _empty_param(out_local, in_features, dtype=dtype, device=device)
        self.bias = _empty_param(out_local, dtype=dtype, device=device) if bias else None

    def load_weight(self, attr: str, section: int, tensor_slice: Any) -> None:
        rows = self.local_sizes[section]
        offset = sum(self.local_sizes[:section])
        start = self.tp.rank * rows
        getattr(self, attr)[offset : offset + rows].copy_(tensor_slice[start : start + rows])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = sum over ranks of x_r W_r^T, then + b: W's input columns are split, W_r is
    [out_features, in_features / tp]; x arrives already split (the column-parallel output)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TPGroup, dtype, device):
        super().__init__()
        self.tp = tp
        self.in_local = in_features // tp.size
        self.weight = _empty_param(out_features, self.in_local, dtype=dtype, device=device)
        self.bias = _empty_param(out_features, dtype=dtype, device=device) if bias else None

    def load_weight(self, attr: str, section: int, tensor_slice: Any) -> None:
        if attr == "bias":  # NOTE: the bias is added once, after the reduction
            copy_full(self.bias, tensor_slice)
            return
        start = self.tp.rank * self.in_local
        self.weight.copy_(tensor_slice[:, start : start + self.in_local])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.tp.all_reduce(F.linear(x, self.weight))
        return y + self.bias if self.bias is not None else y


class VocabParallelEmbedding(nn.Module):
    """Embedding whose vocabulary rows are split over ranks: rank r holds ids
    [r * rows, (r + 1) * rows), the last rank zero-padded past vocab_size."""

    def __init__(self, vocab_size: int, hidden: int, tp: TPGroup, dtype, device):
        super().__init__()
        self.tp, self.vocab_size = tp, vocab_size
        self.rows = math.ceil(vocab_size / tp.size)
        self.start = tp.rank * self.rows
        self.weight = _empty_param(self.rows, hidden, dtype=dtype, device=device)

    def load_weight(self, attr: str, section: int, tensor_slice: Any) -> None:
        end = min(self.start + self.rows, self.vocab_size)
        self.weight.zero_()
        self.weight[: end - self.start].copy_(tensor_slice[self.start : end])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)  # [num_tokens, hidden]
        local = ids - self.start
        owned = (local >= 0) & (local < self.rows)
        out = F.embedding(local.clamp(0, self.rows - 1), self.weight) * owned.unsqueeze(-1)
        return self.tp.all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """logits = h W^T with W vocab-parallel like the embedding (and possibly the same tensor)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        local_logits = F.linear(hidden, self.weight)  # [n, rows]
        logits = self.tp.all_gather_last_dim(local_logits)  # [n, rows * tp]
        return logits[:, : self.vocab_size]


class RMSNorm(nn.Module):
    """Matches transformers: normalise in float32, cast back, then scale. Over the last dim of
    [n, dim] or of per-head [n, heads, dim] (Qwen3's q/k norm)."""

    def __init__(self, dim: int, eps: float, dtype, device):
        super().__init__()
        self.eps = eps
        self.weight = _empty_param(dim, dtype=dtype, device=device)
        self.fused = use_layer_kernels(device)

    def load_weight(self, attr: str, section: int, tensor_slice: Any) -> None:
        copy_full(self.weight, tensor_slice)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused and not torch.is_grad_enabled():
            return layer_ops.rms_norm_triton(x, self.weight, self.eps)
        return layer_ops.rms_norm_reference(x, self.weight, self.eps)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (norm(x + residual), x + residual): the residual add fused into the norm."""
        if self.fused and not torch.is_grad_enabled():
            return layer_ops.add_rms_norm_triton(x, residual, self.weight, self.eps)
        return layer_ops.add_rms_norm_reference(x, residual, self.weight, self.eps)


def silu_and_mul(x: torch.Tensor, fused: bool) -> torch.Tensor:
    """[n, 2 * inter] = [gate | up] -> silu(gate) * up."""
    if fused and not torch.is_grad_enabled():
        return layer_ops.silu_and_mul_triton(x)
    return layer_ops.silu_and_mul_reference(x)


def rope_inverse_frequencies(head_dim: int, theta: float, rope_type: str, scaling: dict[str, float]) -> torch.Tensor:
    """[head_dim / 2] float32, as transformers computes them (default, linear, llama3)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type == "llama3":
        return _llama3_frequencies(inv_freq, scaling)
    return inv_freq


def _llama3_frequencies(inv_freq: torch.Tensor, s: dict[str, float]) -> torch.Tensor:
    """Llama 3.1 scaling: long wavelengths divided by `factor`, a smooth blend in between."""
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, blended, scaled)


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE with a cos/sin table precomputed for every position."""

    def __init__(self, head_dim: int, max_positions: int, inv_freq: torch.Tensor, device):
        super().__init__()
        positions = torch.arange(max_positions, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq[None, :]  # [max_positions, head_dim / 2]
        emb = torch.cat([freqs, freqs], dim=-1)  # [max_positions, head_dim]
        self.register_buffer("cos", emb.cos().to(device), persistent=False)
        self.register_buffer("sin", emb.sin().to(device), persistent=False)
        self.fused = use_layer_kernels(device)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # q: [num_tokens, heads, head_dim], k: [num_tokens, kv_heads, head_dim]
        if self.fused and not torch.is_grad_enabled() and positions.dim() == 1:
            return layer_ops.rotary_triton(positions, q, k, self.cos, self.sin)
        return layer_ops.rotary_reference(positions, q, k, self.cos, self.sin)

    def forward_and_store(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                          qk_norm: tuple[RMSNorm, RMSNorm] | None = None) -> torch.Tensor:
        """RoPE on q and k (each head RMS-normalised first by `qk_norm`'s two norms, if given), with
        the rotated k and v written to the cache rows `slots` -> q."""
        w = {} if qk_norm is None else dict(q_weight=qk_norm[0].weight, k_weight=qk_norm[1].weight,
                                             eps=qk_norm[0].eps)
        if qk_norm is not None and qk_norm[0].eps != qk_norm[1].eps:
            raise ValueError("the q and k norms must share one epsilon")
        if self.fused and not torch.is_grad_enabled() and positions.dim() == 1:
            return layer_ops.rotary_store_triton(positions, q, k, v, self.cos, self.sin, k_cache, v_cache, slots, **w)
        return layer_ops.rotary_store_reference(positions, q, k, v, self.cos, self.sin, k_cache, v_cache, slots, **w)
