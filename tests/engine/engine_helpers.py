"""Helpers shared by the engine tests: tiny random-weight checkpoints, configs, HF reference."""

from __future__ import annotations

import dataclasses
import os
import random
from pathlib import Path

import torch
import transformers

from sglaunch.config import EngineConfig
from sglaunch.engine.step import StepInput

TINY = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    eos_token_id=None,
)

# name -> (config class, extra config, save kwargs)
MODELS = {
    # untied, GQA, split into several safetensors files with an index
    "llama": ("LlamaConfig", dict(tie_word_embeddings=False, rope_theta=50000.0), dict(max_shard_size="60KB")),
    # tied embeddings, q/k/v bias
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True), {}),
    # tied, q/k norms, explicit head_dim != hidden / heads, 3 layers
    "qwen3": ("Qwen3Config", dict(tie_word_embeddings=True, head_dim=32, num_hidden_layers=3), {}),
}


def build_checkpoint(name: str, folder: Path) -> Path:
    cls_name, extra, save_kwargs = MODELS[name]
    config = getattr(transformers, cls_name)(**{**TINY, **extra})
    torch.manual_seed(1234)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # random biases/norm weights so those code paths matter
        for pname, param in model.named_parameters():
            if pname.endswith(("bias", "norm.weight", "layernorm.weight")):
                param.add_(torch.randn_like(param) * 0.1)
    model.save_pretrained(folder, **save_kwargs)
    return folder


def engine_config(model_path: Path, **overrides) -> EngineConfig:
    base = EngineConfig(
        model_path=str(model_path),
        tokenizer_path=str(model_path),
        served_model_name="tiny",
        dtype="float32",
        kv_cache_dtype="float32",
        context_length=None,
        max_total_tokens=4096,
    )
    return dataclasses.replace(base, **overrides)


PROMPTS = [
    [3, 17, 42, 99, 5, 81, 7],
    [200, 11],
    [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 13, 55, 144, 233, 17, 29, 31],
    [64],
]


def hf_greedy(model, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """transformers generate on all prompts in one left-padded batch."""
    width = max(len(p) for p in prompts)
    pad = 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
        do_sample=False, pad_token_id=pad,
    )
    return out[:, width:].tolist()


def random_step(query_lens: list[int], kv_lens: list[int], page_size: int, num_pages: int, seed: int = 0) -> StepInput:
    """A ragged step (request b: query_lens[b] new tokens, kv_lens[b] in all) whose page tables
    are distinct random pages < num_pages, scattered so that they are not contiguous."""
    rng = random.Random(seed)
    free = rng.sample(range(num_pages), num_pages)
    step = StepInput([], [], [], [], [], [])
    for q, kv in zip(query_lens, kv_lens):
        assert 1 <= q <= kv
        step.input_ids += [rng.randrange(256) for _ in range(q)]
        step.positions += list(range(kv - q, kv))
        step.query_lens.append(q)
        step.kv_lens.append(kv)
        step.page_tables.append([free.pop() for _ in range(-(-kv // page_size))])
        step.sample_indices.append(len(step.input_ids) - 1)
    return step


def triton_or_skip() -> None:
    """For a Triton kernel test module, at its top: Triton's interpreter on a machine without CUDA
    (set before the kernels are first compiled), the GPU otherwise; the module is skipped when
    triton does not import."""
    import pytest

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        import triton  # noqa: F401
    except Exception as exc:  # pragma: no cover - depends on the install
        pytest.skip(f"triton is not importable ({exc})", allow_module_level=True)
