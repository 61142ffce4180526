"""Facts about a local checkpoint folder, read from config.json and safetensors headers only.

No tensor is loaded: a safetensors file starts with an 8-byte little-endian header length
and a JSON header giving each tensor's dtype, shape and byte range.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from sglaunch.errors import SglaunchError

DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "fp8_e4m3": 1,
               "fp8_e5m2": 1, "fp4_e2m1": 0.5}


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    config: dict
    weight_bytes: int | None  # sum over safetensors headers; None when no safetensors file

    @property
    def architectures(self) -> list[str]:
        return list(self.config.get("architectures") or [])

    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type", ""))

    @property
    def quant_method(self) -> str | None:
        quant = self.config.get("quantization_config") or {}
        method = quant.get("quant_method") or quant.get("quant_algo")
        return str(method).lower() if method else None

    @property
    def is_nvfp4(self) -> bool:
        quant = self.config.get("quantization_config") or {}
        algo = str(quant.get("quant_algo", "")).upper()
        return self.quant_method in ("modelopt_fp4", "nvfp4") or algo == "NVFP4"

    @property
    def num_layers(self) -> int:
        return int(self.config.get("num_hidden_layers", 0))

    @property
    def num_heads(self) -> int:
        return int(self.config.get("num_attention_heads", 0))

    @property
    def num_kv_heads(self) -> int:
        return int(self.config.get("num_key_value_heads") or self.num_heads)

    @property
    def head_dim(self) -> int:
        explicit = self.config.get("head_dim")
        if explicit:
            return int(explicit)
        return int(self.config.get("hidden_size", 0)) // max(self.num_heads, 1)

    @property
    def context_length(self) -> int | None:
        value = self.config.get("max_position_embeddings")
        return int(value) if value else None

    @property
    def dtype(self) -> str | None:
        return self.config.get("torch_dtype") or self.config.get("dtype")

    def kv_bytes_per_token(self, kv_dtype_bytes: float, tp_size: int = 1) -> int:
        """K and V of every layer for one token, on one tensor-parallel rank."""
        kv_heads_per_rank = max(1, -(-self.num_kv_heads // tp_size))
        return int(2 * self.num_layers * kv_heads_per_rank * self.head_dim * kv_dtype_bytes)

    # hybrid caches (0.5.16 made UnifiedRadixTree their default)
    def hybrid_kinds(self) -> list[str]:
        cfg, kinds = self.config, []
        layer_types = [str(t) for t in (cfg.get("layer_types") or cfg.get("layers_block_type") or [])]
        if any("sliding" in t for t in layer_types) or cfg.get("use_sliding_window") or \
                (cfg.get("sliding_window") and "full_attention" not in set(layer_types) and layer_types):
            kinds.append("SWA")
        if "mamba" in self.model_type or any(t in ("mamba", "linear_attention") for t in layer_types):
            kinds.append("Mamba")
        if cfg.get("index_topk") is not None or "deepseek_v32" in self.model_type:
            kinds.append("DSA")
        return kinds

    @property
    def is_gdn_hybrid(self) -> bool:
        layer_types = [str(t) for t in (self.config.get("layer_types") or [])]
        return "linear_attention" in layer_types or self.model_type in ("qwen3_next", "qwen3_5", "qwen3_5_moe")

    @property
    def bundled_dspark_block_size(self) -> int | None:
        """DeepSeek-V4-style checkpoints carry their DSpark drafter (`dspark_block_size`)."""
        value = self.config.get("dspark_block_size")
        return int(value) if value else None


def looks_local(model_path: str) -> bool:
    """A hub id is 'org/name'; anything absolute, relative with ./ or existing is a path."""
    path = Path(model_path).expanduser()
    return path.exists() or model_path.startswith(("/", "./", "../", "~")) or model_path.count("/") > 1


def read_checkpoint(model_path: str) -> CheckpointInfo:
    path = Path(model_path).expanduser()
    if not path.is_dir():
        raise SglaunchError(f"model path {model_path} is not a folder", hint="point --model-path at a "
                            "checkpoint folder with config.json and *.safetensors")
    config_file = path / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SglaunchError(f"{config_file} not found", hint="a Hugging Face checkpoint folder needs config.json") from None
    except (OSError, ValueError) as exc:
        raise SglaunchError(f"cannot read {config_file}: {exc}", hint="fix or replace config.json") from None
    if not isinstance(config, dict):
        raise SglaunchError(f"{config_file} is not a JSON object", hint="fix or replace config.json")
    return CheckpointInfo(path, config, safetensors_bytes(path))


def safetensors_bytes(folder: Path) -> int | None:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    return sum(_tensor_bytes(f) for f in files)


def _tensor_bytes(file: Path) -> int:
    try:
        with open(file, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            if length > 100_000_000:
                raise ValueError("header too large")
            header = json.loads(fh.read(length))
    except (OSError, ValueError, struct.error) as exc:
        raise SglaunchError(f"{file} is not a readable safetensors file ({exc})",
                            hint="re-download or re-export the checkpoint") from None
    return sum(end - start for name, meta in header.items() if name != "__metadata__"
               for start, end in [meta["data_offsets"]])
