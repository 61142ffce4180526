"""Read a Hugging Face checkpoint folder's config into one frozen ModelSpec. Torch-free.

Accepts both spellings transformers has used: `rope_theta` / `rope_scaling` (4.x) and
`rope_parameters: {rope_theta, rope_type, ...}` (5.x). Every refusal is a ValueError that says
what is wrong and what to do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# architecture name in config.json -> family; families differ only in the flags of ModelSpec
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class ModelSpec:
    """The architecture facts the engine needs, whatever transformers version wrote them."""

    family: str  # "llama" | "qwen2" | "qwen3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_type: str  # one of SUPPORTED_ROPE_TYPES
    rope_scaling: tuple[tuple[str, float], ...]  # extra numeric rope parameters (factor, ...)
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    checkpoint_dtype: str
    eos_token_ids: tuple[int, ...]


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); re-download the checkpoint") from exc


def load_model_spec(model_path: str) -> ModelSpec:
    """Parse `model_path/config.json` (and generation_config.json) into a ModelSpec."""
    folder = Path(model_path)
    if not folder.is_dir():
        raise ValueError(
            f"model path {model_path!r} is not a folder; pass a local Hugging Face checkpoint "
            "folder (config.json + *.safetensors)"
        )
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{folder} has no config.json; is this a Hugging Face checkpoint folder?")
    cfg = read_json(config_file)
    family = _check_architecture(cfg)
    _check_not_quantized(cfg)
    _check_no_sliding_window(cfg)
    rope_theta, rope_type, rope_scaling = _rope_settings(cfg)
    num_heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    attention_bias = bool(cfg.get("attention_bias", False))
    return ModelSpec(
        family=family,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
        head_dim=int(cfg.get("head_dim") or hidden // num_heads),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        rope_type=rope_type,
        rope_scaling=rope_scaling,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        # NOTE: Qwen2 always has q/k/v bias and never o bias; Llama and Qwen3 follow attention_bias
        qkv_bias=True if family == "qwen2" else attention_bias,
        o_bias=False if family == "qwen2" else attention_bias,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        qk_norm=family == "qwen3",
        checkpoint_dtype=str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32"),
        eos_token_ids=_eos_token_ids(folder, cfg),
    )


def _check_architecture(cfg: dict[str, Any]) -> str:
    architectures = cfg.get("architectures") or []
    for name in architectures:
        if name in SUPPORTED_ARCHITECTURES:
            act = cfg.get("hidden_act", "silu")
            if act != "silu":
                raise ValueError(f"{name} with hidden_act={act!r} is not supported (only silu)")
            return SUPPORTED_ARCHITECTURES[name]
    raise ValueError(
        f"unsupported architecture {architectures or cfg.get('model_type')!r}; the engine runs "
        f"{', '.join(SUPPORTED_ARCHITECTURES)}"
    )


def _check_not_quantized(cfg: dict[str, Any]) -> None:
    quant = cfg.get("quantization_config")
    if quant:
        method = quant.get("quant_method", "unknown") if isinstance(quant, dict) else quant
        raise ValueError(
            f"quantized checkpoint (quantization_config.quant_method={method!r}) is not supported; "
            "use an unquantized bfloat16/float16/float32 checkpoint"
        )


def _check_no_sliding_window(cfg: dict[str, Any]) -> None:
    if cfg.get("use_sliding_window"):
        raise ValueError(
            "sliding-window attention (use_sliding_window=true) is not supported; "
            "set use_sliding_window to false in config.json if the model allows it"
        )


def _rope_settings(cfg: dict[str, Any]) -> tuple[float, str, tuple[tuple[str, float], ...]]:
    """(theta, rope_type, extra numeric parameters) from either config spelling."""
    params = dict(cfg.get("rope_parameters") or {})
    legacy = cfg.get("rope_scaling") or {}
    merged = {**legacy, **params}
    theta = merged.get("rope_theta", cfg.get("rope_theta", 10000.0))
    rope_type = merged.get("rope_type") or merged.get("type") or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"RoPE type {rope_type!r} is not supported; the engine runs {SUPPORTED_ROPE_TYPES}"
        )
    extra = tuple(
        sorted(
            (key, float(value))
            for key, value in merged.items()
            if key not in ("rope_theta", "rope_type", "type") and isinstance(value, (int, float))
        )
    )
    return float(theta), rope_type, extra


def _as_id_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _eos_token_ids(folder: Path, cfg: dict[str, Any]) -> tuple[int, ...]:
    """EOS ids from generation_config.json (preferred, may list several) and config.json."""
    ids = list(_as_id_tuple(cfg.get("eos_token_id")))
    gen_file = folder / "generation_config.json"
    if gen_file.is_file():
        ids = list(_as_id_tuple(read_json(gen_file).get("eos_token_id"))) + ids
    return tuple(dict.fromkeys(ids))  # de-duplicated, order kept


def find_weight_files(model_path: str) -> list[Path]:
    """The safetensors files of a checkpoint (via model.safetensors.index.json when present)."""
    folder = Path(model_path)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(read_json(index).get("weight_map", {}).values()))
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise ValueError(
                f"{index.name} lists {len(missing)} missing file(s), e.g. {missing[0]}; "
                "finish downloading the checkpoint"
            )
        return [folder / n for n in names]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        found = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.gguf"))
        hint = f" (found {found[0]}: convert it to safetensors)" if found else ""
        raise ValueError(f"no *.safetensors weights in {folder}{hint}")
    return files


def check_tp_divides(spec: ModelSpec, tp_size: int) -> None:
    """Each rank holds whole heads: tp must divide the query and the KV head counts."""
    for what, count in (("attention heads", spec.num_heads), ("KV heads", spec.num_kv_heads)):
        if count % tp_size:
            raise ValueError(
                f"--tp-size {tp_size} does not divide the model's {count} {what}; "
                f"choose a tp size that divides both {spec.num_heads} and {spec.num_kv_heads}"
            )


def resolve_context_length(spec: ModelSpec, requested: int | None) -> int:
    return int(requested) if requested else spec.max_position_embeddings
