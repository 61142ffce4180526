"""DeepSpec-format DSpark checkpoints: load (one TP rank's shard), save, random init.

Format (§2.6): `config.json` = target config + DSpark fields (drafter_config.py);
`*.safetensors` with DeepSpec's tensor names, no `model.` prefix:
  fc.weight [d, n*d], hidden_norm.weight [d], norm.weight [d],
  layers.{i}.{input_layernorm,post_attention_layernorm}.weight [d],
  layers.{i}.self_attn.{q,k,v,o}_proj.weight (+ .bias with attention_bias), q_norm/k_norm [head_dim] (Qwen3),
  layers.{i}.mlp.{gate,up,down}_proj.weight,
  markov_head.markov_w1.weight [V, r], markov_head.markov_w2.weight [V, r]
    (+ markov_head.gate_proj.{weight [r, d+r], bias} | markov_head.joint_proj.{weight [3r, 2r+d], bias}),
  confidence_head.proj.weight [1, d+r or d], confidence_head.proj.bias [1],
  optional embed_tokens.weight / lm_head.weight [V, d] (the target's are aliased when absent).
Each rank reads only its rows/columns through lazy safetensors slices (like the target loader).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from sglaunch.engine.distributed import TPGroup
from sglaunch.engine.models import PACKED_MODULES
from sglaunch.speculative.drafter import DSparkDrafter
from sglaunch.speculative.drafter_config import (
    DrafterConfig,
    check_target_compat,
    expected_shapes,
    load_drafter_config,
)

SKIPPED_SUFFIXES = ("rotary_emb.inv_freq",)
SHARED = ("embed_tokens.weight", "lm_head.weight")


def weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
        return [folder / n for n in names]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors in {folder}; a DSpark checkpoint stores its weights as safetensors")
    return files


def tensor_index(files: list[Path]) -> dict[str, Path]:
    """Tensor name -> file holding it."""
    out: dict[str, Path] = {}
    for file in files:
        if not file.is_file():
            raise ValueError(f"{file} is listed by the index but missing; finish downloading the checkpoint")
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            out.update({name: file for name in handle.keys()})
    return out


def resolve_module(drafter: DSparkDrafter, name: str) -> tuple[torch.nn.Module, str, int]:
    """Checkpoint name -> (module with load_weight, "weight"|"bias", packed section)."""
    module_path, _, attr = name.rpartition(".")
    parent, _, leaf = module_path.rpartition(".")
    section = 0
    if name.startswith("layers.") and leaf in PACKED_MODULES:  # NOTE: markov_head.gate_proj is not packed
        leaf, section = PACKED_MODULES[leaf]
    return drafter.get_submodule(f"{parent}.{leaf}" if parent else leaf), attr, section


def load_drafter(path: str | Path, target: Any = None, tp: TPGroup | None = None, dtype=torch.float32,
                 device: torch.device | str = "cpu", max_positions: int | None = None) -> DSparkDrafter:
    """Build the drafter for this TP rank and fill it from a DeepSpec checkpoint folder.

    `target`: the engine's CausalLM (its `spec`, `model.embed_tokens` and `lm_head` are used to
    check compatibility and to alias embeddings/LM head the checkpoint does not store). Without a
    target the checkpoint must hold both. ValueError names the offending field/tensor."""
    folder = Path(path)
    cfg = load_drafter_config(folder)
    tp = tp or TPGroup(0, 1)
    if target is not None:
        check_target_compat(cfg, target.spec.hidden_size, target.spec.vocab_size, target.spec.num_layers)
    index = tensor_index(weight_files(folder))
    shared = {}
    for name, module_name in (("embed_tokens.weight", "embed_tokens"), ("lm_head.weight", "lm_head")):
        if name in index:
            continue
        if target is None:
            raise ValueError(f"{folder}: the checkpoint has no {name!r} and no target model was given to alias; "
                             "pass the target (the engine does) or save the tensor in the checkpoint")
        shared[module_name] = target.model.embed_tokens if module_name == "embed_tokens" else target.lm_head
    drafter = DSparkDrafter(cfg, tp, dtype, torch.device(device), max_positions, **shared)
    load_weights(drafter, cfg, folder, index)
    return drafter.eval()


def load_weights(drafter: DSparkDrafter, cfg: DrafterConfig, folder: Path, index: dict[str, Path]) -> None:
    shapes = expected_shapes(cfg, "embed_tokens.weight" in index, "lm_head.weight" in index)
    missing = sorted(set(shapes) - set(index))
    if missing:
        raise ValueError(f"{folder}: the checkpoint lacks {len(missing)} tensor(s) its config.json implies, e.g. "
                         f"{missing[:3]}; check markov_rank / markov_head_type / enable_confidence_head / "
                         "num_hidden_layers against the weights")
    handles: dict[Path, Any] = {}
    try:
        for name, file in index.items():
            if name.endswith(SKIPPED_SUFFIXES):
                continue
            if name not in shapes:
                raise ValueError(f"{folder}: unexpected tensor {name!r} (not part of a {cfg.architecture} with this "
                                 "config.json); is the config.json the drafter's own?")
            if file not in handles:
                handles[file] = safe_open(str(file), framework="pt", device="cpu").__enter__()
            _load_one(drafter, name, handles[file].get_slice(name), shapes[name], folder)
    finally:
        for handle in handles.values():
            handle.__exit__(None, None, None)


def _load_one(drafter: DSparkDrafter, name: str, tensor_slice: Any, shape: tuple[int, ...], folder: Path) -> None:
    found = tuple(tensor_slice.get_shape())
    if found != shape:
        raise ValueError(f"{folder}: tensor {name!r} has shape {list(found)}, its config.json implies {list(shape)}")
    module, attr, section = resolve_module(drafter, name)
    with torch.no_grad():
        module.load_weight(attr, section, tensor_slice)


def init_drafter_state(cfg: DrafterConfig, seed: int = 0, with_embed: bool = True, with_lm_head: bool = True,
                       scale: float = 0.05) -> dict[str, torch.Tensor]:
    """Random weights of the right shapes (tests, and a starting point for training). Norm
    weights are near 1 so the random drafter is well-conditioned."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, shape in sorted(expected_shapes(cfg, with_embed, with_lm_head).items()):
        noise = torch.randn(*shape, generator=gen)
        state[name] = 1.0 + 0.1 * noise if "norm" in name else noise * (1.0 if name == "embed_tokens.weight" else scale)
    return state


def save_drafter(folder: str | Path, cfg: DrafterConfig, state: dict[str, torch.Tensor],
                 target_config: dict[str, Any] | None = None, dtype: torch.dtype | None = None) -> Path:
    """Write config.json (target config + DSpark fields) and model.safetensors in DeepSpec's format."""
    folder = Path(folder)
    shapes = expected_shapes(cfg, "embed_tokens.weight" in state, "lm_head.weight" in state)
    missing, extra = sorted(set(shapes) - set(state)), sorted(set(state) - set(shapes))
    if missing or extra:
        raise ValueError(f"state does not match the config: missing {missing[:3]}, unexpected {extra[:3]}")
    for name, tensor in state.items():
        if tuple(tensor.shape) != shapes[name]:
            raise ValueError(f"tensor {name!r} has shape {list(tensor.shape)}, the config implies {list(shapes[name])}")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg.to_config_dict(target_config), indent=2) + "\n")
    tensors = {k: (v.to(dtype) if dtype else v).contiguous() for k, v in state.items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder
