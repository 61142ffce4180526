"""The frozen target during training: transformers model, features of `target_layer_ids`
(residual stream after those decoder layers, captured with forward hooks so any transformers
version works), the final normed hidden state, and the drafter config that fits the target."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sglaunch.errors import SglaunchError
from sglaunch.speculative.drafter_config import DrafterConfig

FAMILIES = {"llama": "llama", "qwen2": "llama", "qwen3": "qwen3"}  # target model_type -> drafter family


def read_target_config(path: Path) -> dict[str, Any]:
    file = path / "config.json"
    if not file.is_file():
        raise SglaunchError(f"{path} has no config.json", hint="--target must be a Hugging Face checkpoint folder "
                            "(run `sglaunch models pull` for the default model)")
    cfg = json.loads(file.read_text())
    if cfg.get("model_type") not in FAMILIES:
        raise SglaunchError(f"{path}: model_type {cfg.get('model_type')!r} is not supported by train-draft",
                            hint=f"supported targets: {', '.join(sorted(FAMILIES))}")
    return cfg


def default_layer_ids(num_layers: int, count: int = 5) -> list[int]:
    """`count` ids spread over the target, never its final layer (DeepSpec: 1 .. N-3)."""
    lo, hi = (1, num_layers - 3) if num_layers >= 6 else (0, num_layers - 2)
    if hi < lo:
        raise SglaunchError(f"the target has {num_layers} layer(s); DSpark needs at least 2",
                            hint="train against a deeper target")
    steps = max(count - 1, 1)
    return sorted({round(lo + (hi - lo) * i / steps) for i in range(count)})


def default_mask_token(cfg: dict[str, Any], target: Path) -> int:
    """An id the target never produces: the first embedding row past the tokenizer (Qwen3's
    151669 is exactly that), else the last special token that is not EOS/BOS/PAD/UNK or ChatML."""
    vocab = int(cfg["vocab_size"])
    file = target / "tokenizer.json"
    if not file.is_file():
        return vocab - 1
    raw = json.loads(file.read_text())
    added = raw.get("added_tokens") or []
    size = max([len(raw.get("model", {}).get("vocab") or {})] + [int(t["id"]) + 1 for t in added])
    if size < vocab:
        return size
    reserved = {"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<unk>", "<pad>"}
    tok_cfg = target / "tokenizer_config.json"
    if tok_cfg.is_file():
        extra = json.loads(tok_cfg.read_text())
        for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
            value = extra.get(key)
            reserved.add(value.get("content") if isinstance(value, dict) else value)
    candidates = [int(t["id"]) for t in added if t.get("special") and t.get("content") not in reserved]
    return max(candidates) if candidates else vocab - 1


def drafter_config_for(cfg: dict[str, Any], *, num_layers: int, block_size: int, layer_ids: list[int],
                       mask_token_id: int, markov_rank: int, markov_head_type: str) -> DrafterConfig:
    from sglaunch.speculative.drafter_config import _rope, _check_values

    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    theta, rope_type, scaling = _rope(cfg)
    out = DrafterConfig(
        family=FAMILIES[cfg["model_type"]], vocab_size=int(cfg["vocab_size"]), hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]), num_layers=num_layers, num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads), rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta, rope_type=rope_type, rope_scaling=scaling,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)), attention_bias=False,
        mlp_bias=False, block_size=block_size, mask_token_id=mask_token_id, target_layer_ids=tuple(layer_ids),
        num_target_layers=int(cfg["num_hidden_layers"]), markov_rank=markov_rank,
        markov_head_type=markov_head_type, enable_confidence_head=True, confidence_head_with_markov=True,
    )
    try:
        _check_values(out, "drafter config")
    except ValueError as exc:
        raise SglaunchError(str(exc), hint="check --target-layer-ids / --mask-token-id / --block-size") from None
    return out


@dataclass
class TargetOutput:
    features: torch.Tensor  # [B, T, n_features * d] residual stream after each target_layer_ids layer
    final_hidden: torch.Tensor  # [B, T, d] final-normed hidden state (lm_head input)


class Target:
    """A frozen transformers CausalLM with hooks on the feature layers."""

    def __init__(self, path: Path, layer_ids: list[int], dtype: torch.dtype, device: torch.device):
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()

        self.model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device).eval()
        self.model.requires_grad_(False)
        self.layer_ids, self.device = list(layer_ids), device
        self._captured: dict[int, torch.Tensor] = {}
        layers = self.model.model.layers
        for lid in self.layer_ids:
            module = self.model.model.embed_tokens if lid == -1 else layers[lid]
            module.register_forward_hook(self._hook(lid))

    def _hook(self, lid: int):
        def capture(module, args, output):
            self._captured[lid] = output[0] if isinstance(output, tuple) else output
        return capture

    @property
    def embed_tokens(self) -> torch.nn.Module:
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> torch.nn.Module:
        return self.model.get_output_embeddings()

    @torch.no_grad()
    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> TargetOutput:
        """input_ids [B, T] (right-padded) -> features and final hidden states."""
        self._captured.clear()
        out = self.model.model(input_ids=input_ids.to(self.device),
                               attention_mask=None if attention_mask is None else attention_mask.to(self.device),
                               use_cache=False)
        features = torch.cat([self._captured[lid] for lid in self.layer_ids], dim=-1)
        self._captured.clear()
        return TargetOutput(features, out.last_hidden_state)

    def logits(self, final_hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(final_hidden).float()


def num_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def human_count(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e5 else str(n)

