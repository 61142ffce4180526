"""Facts about a local checkpoint folder, read from config.json and safetensors headers only.

No tensor is loaded: a safetensors file starts with an 8-byte little-endian header length
and a JSON header giving each tensor's dtype, shape and byte range. Every shard's header is
checked against the file's size (a truncated download), each tensor's byte range against its
dtype and shape (a header that lies), and `model.safetensors.index.json` against the shards
present (a missing shard); any of these raises CorruptCheckpointError.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from sglaunch.errors import SglaunchError

# bytes per element of the dtypes safetensors headers name; others are not size-checked
SAFETENSORS_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
                           "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
                           "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}
MAX_HEADER_BYTES = 100_000_000
INDEX_FILE = "model.safetensors.index.json"
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


class CorruptCheckpointError(SglaunchError):
    """A safetensors shard is truncated, missing or has a header that contradicts itself."""


REDOWNLOAD_HINT = ("re-download or re-copy the checkpoint (compare each file's size with the "
                   "source), or re-export it")


def safetensors_bytes(folder: Path) -> int | None:
    """Total tensor bytes over the folder's shards; None when it has no safetensors file.
    Raises CorruptCheckpointError for a truncated, missing or inconsistent shard."""
    _check_index(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    return sum(_tensor_bytes(f) for f in files)


def _check_index(folder: Path) -> None:
    """Every shard the index's weight_map names must be there."""
    index = folder / INDEX_FILE
    if not index.is_file():
        return
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
        shards = sorted(set(weight_map.values()))
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        raise CorruptCheckpointError(f"{index} is not a readable safetensors index ({exc})",
                                     hint=REDOWNLOAD_HINT) from None
    missing = [name for name in shards if not (folder / name).is_file()]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise CorruptCheckpointError(
            f"{folder} misses {len(missing)} of the {len(shards)} weight shards its {INDEX_FILE} "
            f"lists: {shown}", hint=REDOWNLOAD_HINT)


def _tensor_bytes(file: Path) -> int:
    """The tensor bytes a shard's header declares, checked against the file (no tensor read)."""
    try:
        size = file.stat().st_size
        with open(file, "rb") as fh:
            prefix = fh.read(8)
            if len(prefix) < 8:
                raise ValueError(f"only {len(prefix)} bytes long")
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_BYTES:
                raise ValueError(f"declares a {length}-byte header")
            if 8 + length > size:
                raise ValueError(f"declares a {length}-byte header but the file has {size} bytes")
            header = json.loads(fh.read(length))
        if not isinstance(header, dict):
            raise ValueError("its header is not a JSON object")
    except (OSError, ValueError, struct.error) as exc:
        raise CorruptCheckpointError(f"{file} is not a readable safetensors file ({exc})",
                                     hint=REDOWNLOAD_HINT) from None
    ranges = [_checked_range(file, name, meta) for name, meta in header.items() if name != "__metadata__"]
    data_end = max((end for _, end in ranges), default=0)
    if 8 + length + data_end > size:
        missing = 8 + length + data_end - size
        raise CorruptCheckpointError(
            f"{file} is truncated: its header declares {data_end} bytes of tensor data, but the "
            f"file ends {missing} bytes short of that ({size} of {8 + length + data_end} bytes)",
            hint=REDOWNLOAD_HINT)
    return sum(end - start for start, end in ranges)


def _checked_range(file: Path, name: str, meta) -> tuple[int, int]:
    """(start, end) of one tensor's bytes; they must match its dtype and shape."""
    try:
        start, end = (int(v) for v in meta["data_offsets"])
        shape = [int(d) for d in meta["shape"]]
        dtype = str(meta["dtype"])
    except (KeyError, TypeError, ValueError):
        raise CorruptCheckpointError(f"{file}: tensor {name!r} has no valid dtype, shape and "
                                     "data_offsets in the header", hint=REDOWNLOAD_HINT) from None
    if not 0 <= start <= end or any(d < 0 for d in shape):
        raise CorruptCheckpointError(f"{file}: tensor {name!r} has an invalid byte range "
                                     f"[{start}, {end}) or shape {shape}", hint=REDOWNLOAD_HINT)
    width = SAFETENSORS_DTYPE_BYTES.get(dtype)
    if width is not None:
        expected = width * _product(shape)
        if end - start != expected:
            raise CorruptCheckpointError(
                f"{file}: the header says tensor {name!r} ({dtype}, shape {shape}) takes "
                f"{end - start} bytes, but that dtype and shape need {expected}",
                hint=REDOWNLOAD_HINT)
    return start, end


def _product(shape: list[int]) -> int:
    total = 1
    for dim in shape:
        total *= dim
    return total
