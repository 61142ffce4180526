"""The DSpark drafter's config.json (DeepSpec format) as one frozen dataclass. Torch-free.

DeepSpec writes `config.json` as a deep copy of the target's config plus the DSpark fields
(`architectures: ["Qwen3DSparkModel"]`, block_size, mask_token_id, target_layer_ids,
markov_rank, markov_head_type, enable_confidence_head, confidence_head_with_markov,
num_hidden_layers = draft layers, num_target_layers). Exports that say
`architectures: ["DSparkDraftModel"]` and keep mask_token_id / target_layer_ids under
`dflash_config` are normalised to the same fields. Llama targets use "LlamaDSparkModel".
Every refusal is a ValueError naming the field and what to do.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ARCHITECTURES = {"Qwen3DSparkModel": "qwen3", "LlamaDSparkModel": "llama"}
ALIASES = ("DSparkDraftModel", "DFlashDraftModel")  # normalised by model_type
MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")


@dataclass(frozen=True)
class DrafterConfig:
    family: str  # "qwen3" (q/k norm) | "llama"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int  # draft decoder layers
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_type: str
    rope_scaling: tuple[tuple[str, float], ...]
    max_position_embeddings: int
    attention_bias: bool
    mlp_bias: bool
    block_size: int  # gamma: draft tokens per step
    mask_token_id: int
    target_layer_ids: tuple[int, ...]  # layer L = residual stream after target layer L; -1 = embeddings
    num_target_layers: int | None
    markov_rank: int  # 0: no Markov head (pure DFlash)
    markov_head_type: str
    enable_confidence_head: bool
    confidence_head_with_markov: bool  # as configured; see uses_markov_in_confidence

    @property
    def architecture(self) -> str:
        return "Qwen3DSparkModel" if self.family == "qwen3" else "LlamaDSparkModel"

    @property
    def qk_norm(self) -> bool:
        return self.family == "qwen3"

    @property
    def num_features(self) -> int:
        return len(self.target_layer_ids)

    @property
    def uses_markov_in_confidence(self) -> bool:
        # NOTE: gated on the Markov head existing (DeepSpec asserts otherwise; TRT-LLM #15808)
        return self.confidence_head_with_markov and self.markov_rank > 0

    def to_config_dict(self, target_config: dict[str, Any] | None = None) -> dict[str, Any]:
        """config.json content: the target's config (if given) overlaid with the drafter fields."""
        cfg = json.loads(json.dumps(target_config)) if target_config else {}
        rope = {"rope_theta": self.rope_theta, "rope_type": self.rope_type, **dict(self.rope_scaling)}
        cfg.update(
            architectures=[self.architecture], model_type=self.family, vocab_size=self.vocab_size,
            hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers, num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads, head_dim=self.head_dim, rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta, max_position_embeddings=self.max_position_embeddings,
            attention_bias=self.attention_bias, mlp_bias=self.mlp_bias, hidden_act="silu",
            tie_word_embeddings=False, block_size=self.block_size, mask_token_id=self.mask_token_id,
            target_layer_ids=list(self.target_layer_ids), markov_rank=self.markov_rank,
            markov_head_type=self.markov_head_type, enable_confidence_head=self.enable_confidence_head,
            confidence_head_with_markov=self.confidence_head_with_markov,
            layer_types=["full_attention"] * self.num_layers,
        )
        if self.rope_type != "default" or self.rope_scaling:
            cfg["rope_scaling"] = rope
        if self.num_target_layers is not None:
            cfg["num_target_layers"] = self.num_target_layers
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _field(cfg: dict[str, Any], name: str, where: str, kind=int, default: Any = ...):
    if name not in cfg or cfg[name] is None:
        if default is ...:
            raise ValueError(f"{where}: required field {name!r} is missing; a DSpark drafter config.json "
                             "is the target config plus the DSpark fields (see docs/dspark.md)")
        return default
    value = cfg[name]
    try:
        if kind is bool:
            if not isinstance(value, bool):
                raise TypeError
            return value
        if kind is int and (isinstance(value, bool) or float(value) != int(value)):
            raise TypeError
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: field {name!r} = {value!r} is not a valid {kind.__name__}") from None


def normalise(cfg: dict[str, Any], where: str) -> tuple[dict[str, Any], str]:
    """Lift `dflash_config` fields and map alias architectures -> (flat config, family)."""
    cfg = dict(cfg)
    archs = cfg.get("architectures") or []
    nested = cfg.get("dflash_config") or cfg.get("dspark_config") or {}
    if not isinstance(nested, dict):
        raise ValueError(f"{where}: 'dflash_config' must be an object")
    for key, value in nested.items():
        cfg.setdefault(key, value)
        if key in ("mask_token_id", "target_layer_ids"):
            cfg[key] = value
    for name in archs:
        if name in ARCHITECTURES:
            return cfg, ARCHITECTURES[name]
        if name in ALIASES:
            return cfg, "llama" if cfg.get("model_type") == "llama" else "qwen3"
    hint = " (Gemma4 drafters are not supported yet)" if any("Gemma" in str(a) for a in archs) else ""
    raise ValueError(f"{where}: field 'architectures' = {archs!r} names no DSpark drafter{hint}; expected one of "
                     f"{sorted(ARCHITECTURES) + list(ALIASES)}")


def _rope(cfg: dict[str, Any]) -> tuple[float, str, tuple[tuple[str, float], ...]]:
    merged = {**(cfg.get("rope_scaling") or {}), **(cfg.get("rope_parameters") or {})}
    theta = float(merged.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    rope_type = merged.get("rope_type") or merged.get("type") or "default"
    extra = tuple(sorted((k, float(v)) for k, v in merged.items()
                         if k not in ("rope_theta", "rope_type", "type") and isinstance(v, (int, float))))
    return theta, rope_type, extra


def parse_drafter_config(raw: dict[str, Any], where: str = "config.json") -> DrafterConfig:
    """Validate and normalise a drafter config dict."""
    cfg, family = normalise(raw, where)
    hidden, heads = _field(cfg, "hidden_size", where), _field(cfg, "num_attention_heads", where)
    theta, rope_type, rope_scaling = _rope(cfg)
    out = DrafterConfig(
        family=family, vocab_size=_field(cfg, "vocab_size", where), hidden_size=hidden,
        intermediate_size=_field(cfg, "intermediate_size", where),
        num_layers=_field(cfg, "num_hidden_layers", where), num_heads=heads,
        num_kv_heads=_field(cfg, "num_key_value_heads", where, default=heads),
        head_dim=_field(cfg, "head_dim", where, default=hidden // heads),
        rms_norm_eps=_field(cfg, "rms_norm_eps", where, float, 1e-6), rope_theta=theta, rope_type=rope_type,
        rope_scaling=rope_scaling, max_position_embeddings=_field(cfg, "max_position_embeddings", where, default=4096),
        attention_bias=_field(cfg, "attention_bias", where, bool, False),
        mlp_bias=_field(cfg, "mlp_bias", where, bool, False),
        block_size=_field(cfg, "block_size", where), mask_token_id=_field(cfg, "mask_token_id", where),
        target_layer_ids=_layer_ids(cfg, where), num_target_layers=_field(cfg, "num_target_layers", where, default=None),
        markov_rank=_field(cfg, "markov_rank", where, default=0),
        markov_head_type=str(cfg.get("markov_head_type") or "vanilla"),
        enable_confidence_head=_field(cfg, "enable_confidence_head", where, bool, False),
        confidence_head_with_markov=_field(cfg, "confidence_head_with_markov", where, bool, True),
    )
    _check_values(out, where)
    return out


def _layer_ids(cfg: dict[str, Any], where: str) -> tuple[int, ...]:
    ids = cfg.get("target_layer_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError(f"{where}: field 'target_layer_ids' = {ids!r} must be a non-empty list of integers")
    return tuple(ids)


def _check_values(c: DrafterConfig, where: str) -> None:
    problems = []
    if c.block_size < 1:
        problems.append(f"'block_size' = {c.block_size} must be >= 1")
    if not 0 <= c.mask_token_id < c.vocab_size:
        problems.append(f"'mask_token_id' = {c.mask_token_id} is outside the vocabulary [0, {c.vocab_size})")
    ids = c.target_layer_ids
    if ids[0] < -1 or any(b <= a for a, b in zip(ids, ids[1:])):
        problems.append(f"'target_layer_ids' = {list(ids)} must be strictly increasing and >= -1")
    if c.num_target_layers is not None and ids[-1] >= c.num_target_layers - 1:
        problems.append(f"'target_layer_ids' = {list(ids)} uses the target's final layer "
                        f"({c.num_target_layers - 1}), whose hidden state is post-norm")
    if c.markov_rank < 0:
        problems.append(f"'markov_rank' = {c.markov_rank} must be >= 0 (0 = no Markov head)")
    if c.markov_head_type not in MARKOV_HEAD_TYPES:
        problems.append(f"'markov_head_type' = {c.markov_head_type!r} is not one of {MARKOV_HEAD_TYPES}")
    if c.num_layers < 1 or c.num_heads % c.num_kv_heads:
        problems.append("need num_hidden_layers >= 1 and num_attention_heads divisible by num_key_value_heads")
    if problems:
        raise ValueError(f"{where}: " + "; ".join(problems))


def load_drafter_config(path: str | Path) -> DrafterConfig:
    """Read `<checkpoint>/config.json` (or a config.json path)."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ValueError(f"{file} does not exist; --speculative-draft-model-path must be a DSpark checkpoint folder")
    try:
        raw = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{file} is not valid JSON ({exc})") from None
    return parse_drafter_config(raw, str(file))


def check_target_compat(c: DrafterConfig, target_hidden: int, target_vocab: int, target_layers: int) -> None:
    """The drafter must read this target's features and speak its vocabulary."""
    if c.hidden_size != target_hidden:
        raise ValueError(f"drafter hidden_size {c.hidden_size} != target hidden_size {target_hidden}: "
                         "the drafter was trained for another target")
    if c.vocab_size != target_vocab:
        raise ValueError(f"drafter vocab_size {c.vocab_size} != target vocab_size {target_vocab}")
    if c.target_layer_ids[-1] >= target_layers - 1:
        raise ValueError(f"drafter target_layer_ids {list(c.target_layer_ids)} needs layers the target "
                         f"({target_layers} layers) does not have, or its final layer")


def expected_shapes(c: DrafterConfig, with_embed: bool, with_lm_head: bool) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor name -> full (unsharded) shape, DeepSpec naming (no `model.` prefix)."""
    d, V, r, hd = c.hidden_size, c.vocab_size, c.markov_rank, c.head_dim
    shapes: dict[str, tuple[int, ...]] = {"fc.weight": (d, c.num_features * d), "hidden_norm.weight": (d,),
                                          "norm.weight": (d,)}
    for i in range(c.num_layers):
        p = f"layers.{i}."
        shapes.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                       p + "self_attn.q_proj.weight": (c.num_heads * hd, d),
                       p + "self_attn.k_proj.weight": (c.num_kv_heads * hd, d),
                       p + "self_attn.v_proj.weight": (c.num_kv_heads * hd, d),
                       p + "self_attn.o_proj.weight": (d, c.num_heads * hd),
                       p + "mlp.gate_proj.weight": (c.intermediate_size, d),
                       p + "mlp.up_proj.weight": (c.intermediate_size, d),
                       p + "mlp.down_proj.weight": (d, c.intermediate_size)})
        if c.attention_bias:
            shapes.update({p + "self_attn.q_proj.bias": (c.num_heads * hd,), p + "self_attn.k_proj.bias": (c.num_kv_heads * hd,),
                           p + "self_attn.v_proj.bias": (c.num_kv_heads * hd,), p + "self_attn.o_proj.bias": (d,)})
        if c.mlp_bias:
            shapes.update({p + "mlp.gate_proj.bias": (c.intermediate_size,), p + "mlp.up_proj.bias": (c.intermediate_size,),
                           p + "mlp.down_proj.bias": (d,)})
        if c.qk_norm:
            shapes.update({p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)})
    if r > 0:
        shapes.update({"markov_head.markov_w1.weight": (V, r), "markov_head.markov_w2.weight": (V, r)})
        if c.markov_head_type == "gated":
            shapes.update({"markov_head.gate_proj.weight": (r, d + r), "markov_head.gate_proj.bias": (r,)})
        elif c.markov_head_type == "rnn":
            shapes.update({"markov_head.joint_proj.weight": (3 * r, 2 * r + d), "markov_head.joint_proj.bias": (3 * r,)})
    if c.enable_confidence_head:
        width = d + r if c.uses_markov_in_confidence else d
        shapes.update({"confidence_head.proj.weight": (1, width), "confidence_head.proj.bias": (1,)})
    if with_embed:
        shapes["embed_tokens.weight"] = (V, d)
    if with_lm_head:
        shapes["lm_head.weight"] = (V, d)
    return shapes
