"""Load a safetensors checkpoint into CausalLM, each rank reading only its own shards.

`safe_open(...).get_slice(name)` is lazy: a rank slicing rows [a:b] reads just those bytes.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from sglaunch.engine.models import PACKED_MODULES, CausalLM
from sglaunch.engine.progress import step_bar

logger = logging.getLogger(__name__)

SKIPPED_SUFFIXES = ("rotary_emb.inv_freq",)


def resolve_target(model: CausalLM, name: str) -> tuple[nn.Module, str, int] | None:
    """Checkpoint tensor name -> (module, "weight"|"bias", packed section); None to skip."""
    if name.endswith(SKIPPED_SUFFIXES):
        return None
    if name == "lm_head.weight" and model.spec.tie_word_embeddings:
        return None  # tied: the embedding tensor serves as the LM head
    module_path, _, attr = name.rpartition(".")
    parent_path, _, leaf = module_path.rpartition(".")
    section = 0
    if leaf in PACKED_MODULES:
        leaf, section = PACKED_MODULES[leaf]
    try:
        module = model.get_submodule(f"{parent_path}.{leaf}" if parent_path else leaf)
    except AttributeError:
        raise ValueError(f"checkpoint tensor {name!r} matches no parameter of {model.spec.family}") from None
    return module, attr, section


def expected_targets(model: CausalLM) -> set[tuple[str, str, int]]:
    """(module path, attr, section) for every weight the checkpoint must provide."""
    expected = set()
    for path, module in model.named_modules():
        if not hasattr(module, "load_weight"):
            continue
        if path == "lm_head" and model.spec.tie_word_embeddings:
            continue
        sections = len(getattr(module, "local_sizes", [None]))
        for attr in ("weight", "bias"):
            if getattr(module, attr, None) is not None:
                expected |= {(path, attr, s) for s in range(sections)}
    return expected


def load_checkpoint(model: CausalLM, files: list[Path], show_progress: bool) -> None:
    """Fill every parameter of `model` from `files`; ValueError when tensors are missing."""
    module_paths = {module: path for path, module in model.named_modules()}
    loaded: set[tuple[str, str, int]] = set()
    total = sum(_count_tensors(f) for f in files)
    with step_bar("Loading weights", show_progress, total) as advance:
        for file in files:
            with safe_open(str(file), framework="pt", device="cpu") as handle:
                for name in handle.keys():
                    _load_one(model, handle, name, module_paths, loaded)
                    advance()
    missing = expected_targets(model) - loaded
    if missing:
        example = sorted(missing)[0]
        raise ValueError(
            f"the checkpoint lacks {len(missing)} tensor(s), e.g. {example[0]}.{example[1]}; "
            "is it complete and of the architecture config.json names?"
        )


def _load_one(model: CausalLM, handle: Any, name: str, module_paths: dict, loaded: set) -> None:
    target = resolve_target(model, name)
    if target is None:
        return
    module, attr, section = target
    if not hasattr(module, "load_weight"):
        raise ValueError(f"checkpoint tensor {name!r} matches no parameter of {model.spec.family}")
    with torch.no_grad():
        module.load_weight(attr, section, handle.get_slice(name))
    loaded.add((module_paths[module], attr, section))


def _count_tensors(file: Path) -> int:
    with safe_open(str(file), framework="pt", device="cpu") as handle:
        return len(list(handle.keys()))
